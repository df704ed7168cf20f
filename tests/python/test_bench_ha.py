"""Integration test of `moonlet-bench ha` (tools/bench/ha.c): a tiny run
(--rounds 1, --failovers 1) on the etcd, masters and store nodes it starts
itself.  Checks the document's shape, that every put was sampled, that the
failover was measured (failover_ms > 0, its median and ratio to 2 x TTL
consistent), and that no child is left behind (all stopped by PID).  Skips
only when Debian's etcd is not installed.
"""

import json
import os
import signal
import subprocess
import time

import pytest

import daemons

ETCD = "/usr/bin/etcd"
SHORT_RUN = ["ha", "--rounds", "1", "--puts", "50", "--failovers", "1", "--json"]

pytestmark = pytest.mark.skipif(not os.access(ETCD, os.X_OK),
                                reason="etcd not installed (apt-get install etcd-server)")


def test_short_run():
    p, out, err = daemons.run_bench(*SHORT_RUN, timeout=150)
    assert p.returncode == 0, err.decode()
    assert not daemons.child_pids(p.pid)
    d = json.loads(out)
    assert d["bench"] == "ha" and d["lease_ttl_s"] == 2 and d["value_bytes"] == 4096
    for name in ("put_repl", "put_norepl"):
        assert d[name]["samples"] == 50
        assert 0 < d[name]["p50_us"] <= d[name]["p99_us"]
    assert d["put_p50_ratio"] == pytest.approx(d["put_repl"]["p50_us"] / d["put_norepl"]["p50_us"])
    lag = d["repl_lag"]
    for k in ("samples", "lag_ms_p50", "lag_ms_max", "pending_records_max"):
        assert lag[k] >= 0
    # the repl leader's semi-sync waits over the rounds: a put is two
    # (PutStart, PutEnd), but a PutStart placed in a range the standby holds
    # reserved (master/store/pool.c) does not wait, and most of them are
    ss = d["semi_sync"]
    assert ss["waits"] >= 50 and 0 <= ss["acked_on_entry"] <= ss["waits"]
    assert ss["waits"] + ss["put_starts_reserved"] >= 2 * 50
    assert ss["put_starts_reserved"] >= 25
    assert ss["mean_wait_us"] >= 0
    fo = d["failover"]
    assert len(fo["failover_ms"]) == 1 and fo["failover_ms"][0] > 0
    assert fo["median_ms"] == fo["failover_ms"][0]
    assert fo["ratio_to_2x_ttl"] == pytest.approx(fo["median_ms"] / 4000.0)


def test_rejects_bad_flags():
    for args in (["--rounds", "0"], ["--puts", "0"], ["--failovers", "-1"], ["--bogus"]):
        p = subprocess.run([daemons.tool("moonlet-bench"), "ha", *args], capture_output=True,
                           timeout=30)
        assert p.returncode == 2, args


def dead(pid):
    """Gone, or a zombie nobody has reaped yet (it runs no more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_children_die_with_the_bench():
    """A bench killed outright (a crash, SIGKILL) takes its etcd, masters and
    stores with it: each child has PR_SET_PDEATHSIG.  Before, they lived on,
    holding their ports and the caller's pipe."""
    p = subprocess.Popen([daemons.tool("moonlet-bench"), *SHORT_RUN], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    kids = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(kids) < 3 and p.poll() is None:
            kids = [int(k) for k in daemons.child_pids(p.pid)]  # etcd, then the masters
            time.sleep(0.05)
        assert len(kids) >= 3, kids
        p.kill()
        p.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(dead(k) for k in kids):
            time.sleep(0.05)
        assert all(dead(k) for k in kids), [k for k in kids if not dead(k)]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for k in kids:  # ours: stopped by PID if the check above failed
            if not dead(k):
                os.kill(k, signal.SIGKILL)
