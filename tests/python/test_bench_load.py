"""Integration test of `moonlet-bench load` (tools/bench/load.c): a short run
with 1 and 2 clients against the master, store node and redis-server it
starts itself.  Checks the document's shape, that every phase made calls and
none failed (the exist phases also check every key of the batch was found:
an error there counts), that throughput and latencies are positive and
ordered (p50 <= p99), that --plot writes a PNG, and that redis-server is
gone afterwards (stopped by its PID).  Skips when Debian's redis-server is
not installed.
"""

import json
import os
import subprocess

import pytest

import daemons

REDIS = "/usr/bin/redis-server"

pytestmark = pytest.mark.skipif(not os.access(REDIS, os.X_OK),
                                reason="redis-server not installed (apt-get install redis-server)")


def test_short_run(tmp_path):
    png = tmp_path / "load.png"
    p, out, err = daemons.run_bench("load", "--clients", "1,2", "--phase-ms", "150", "--rounds",
                                    "1", "--json", "--plot", str(png), timeout=120)
    assert p.returncode == 0, err.decode()
    assert not daemons.child_pids(p.pid, "-f", "redis-server")
    d = json.loads(out)
    assert [r["clients"] for r in d["by_clients"]] == [1, 2]
    for r in d["by_clients"]:
        for phase, unit in (("moonlet_exist", "keys_per_s"), ("redis_exists", "keys_per_s"),
                            ("moonlet_putget", "ops_per_s"), ("redis_setget", "ops_per_s")):
            m = r[phase]
            assert m["errors"] == 0, (r["clients"], phase)
            assert m["calls"] > 0 and m[unit] > 0
            assert 0 < m["p50_us"] <= m["p90_us"] <= m["p99_us"] <= m["p999_us"]
            # CPU per call, at the kernel's tick resolution (a short phase may read 0)
            assert m["client_cpu_us_per_call"] >= 0 and m["server_cpu_us_per_call"] >= 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rejects_bad_flags():
    for args in (["--clients", "0"], ["--clients", "1,x"], ["--phase-ms", "1"], ["--rounds", "0"]):
        p = subprocess.run([daemons.tool("moonlet-bench"), "load", *args], capture_output=True,
                           timeout=30)
        assert p.returncode == 2, args
