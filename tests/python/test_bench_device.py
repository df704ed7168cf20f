"""Integration test of `moonlet-bench transfer --device-buffers`
(tools/bench/device.c) under the fake CUDA driver (MOONLET_CUDA_DRIVER, set
by meson): one round per size on the master and store node it starts
itself.  Checks the document's shape, that both paths moved bytes (the bench
fails when a get returns other bytes than the put), that the ratios are
those of its own figures, that the pinned staging stayed within its bound,
and that no child is left behind.  Bad flags exit 2; without a driver the
bench says so and exits 1.
"""
import json
import os
import subprocess

import pytest

import daemons


def test_short_run():
    p, out, err = daemons.run_bench("transfer", "--device-buffers", "--json", "--rounds", "1",
                                    "--sizes", "1MiB,16MiB", "--round-bytes", "64MiB",
                                    "--gpu-staging", "32MiB", "--lease-ms", "60000",
                                    timeout=200)
    assert p.returncode == 0, err.decode()
    assert not daemons.child_pids(p.pid)
    d = json.loads(out)
    assert d["bench"] == "transfer_device" and d["rounds"] == 1
    assert d["driver"] == os.environ["MOONLET_CUDA_DRIVER"]
    assert [s["size"] for s in d["sizes"]] == [1 << 20, 16 << 20]
    assert [s["keys"] for s in d["sizes"]] == [64, 4]
    for s in d["sizes"]:
        for op in ("put", "get"):
            host, dev = s[f"host_{op}_gbps"], s[f"device_{op}_gbps"]
            assert host > 0 and dev > 0
            assert s[f"{op}_ratio"] == pytest.approx(dev / host)
    assert d["driver_d2h_gbps"] > 0
    assert d["pinned_bound"] == 32 << 20
    assert 0 < d["pinned_bytes"] <= d["pinned_bound"]
    assert d["staged_calls"] >= 4  # a put and a get per size, and the warm-up round


def test_bad_flags_and_no_driver():
    for bad in (["--rounds", "0"], ["--sizes", "0"], ["--round-bytes", "9GiB"],
                ["--frobnicate"]):
        p, _, err = daemons.run_bench("transfer", "--device-buffers", *bad, timeout=30)
        assert p.returncode == 2 and b"usage: moonlet-bench transfer --device-buffers" in err
    env = dict(os.environ, MOONLET_CUDA_DRIVER="none")
    p = subprocess.run([daemons.tool("moonlet-bench"), "transfer", "--device-buffers"], env=env,
                       capture_output=True, timeout=30)
    assert p.returncode == 1 and b"cannot load the CUDA driver" in p.stderr
