"""Integration test of `moonlet-bench batch` (tools/bench/batch.c): one
round of every workload on the masters, store nodes and RealClient it starts
itself.  Checks the document's shape, that every path moved bytes (the bench
fails when a get returns other bytes than the put), that its ratios are
those of its own figures, and that no child is left behind.  A bad flag
exits 2.
"""

import json

import pytest

import daemons

WORKLOADS = {"4KiB": (4096, 1024, 1), "4KiB_scattered": (4096, 1024, 1),
             "64KiB": (65536, 1024, 1), "1MiB": (1 << 20, 128, 1),
             "multi_8x8KiB": (65536, 1024, 8)}
PATHS = ("batch", "per_key", "dummy")


def test_short_run():
    # a long lease: one round's reads may take seconds in a sanitizer build
    p, out, err = daemons.run_bench("batch", "--rounds", "1", "--lease-ms", "60000", "--json",
                                    timeout=200)
    assert p.returncode == 0, err.decode()
    assert not daemons.child_pids(p.pid)
    d = json.loads(out)
    assert d["bench"] == "batch" and d["rounds"] == 1
    assert [w["workload"] for w in d["workloads"]] == list(WORKLOADS)
    for w in d["workloads"]:
        size, keys, ranges = WORKLOADS[w["workload"]]
        assert (w["object_bytes"], w["keys"], w["ranges_per_key"]) == (size, keys, ranges)
        assert w["plain_socket_gbps"] > 0
        for path in PATHS:
            f = w[path]
            assert f["put_gbps"] > 0 and f["get_gbps"] > 0
            assert f["get_over_plain"] == pytest.approx(f["get_gbps"] / w["plain_socket_gbps"])
            assert f["put_over_plain"] == pytest.approx(f["put_gbps"] / w["plain_socket_gbps"])
        r = w["ratios"]
        assert r["dummy_over_batch_get"] == pytest.approx(w["dummy"]["get_gbps"] /
                                                          w["batch"]["get_gbps"])
        assert r["batch_over_per_key_put"] == pytest.approx(w["batch"]["put_gbps"] /
                                                            w["per_key"]["put_gbps"])


def test_one_workload_and_bad_flags():
    p, out, err = daemons.run_bench("batch", "--rounds", "1", "--only", "4KiB", "--lease-ms",
                                    "60000", "--json", timeout=120)
    assert p.returncode == 0, err.decode()
    assert [w["workload"] for w in json.loads(out)["workloads"]] == ["4KiB"]
    for bad in (["--only", "8KiB"], ["--rounds", "0"], ["--lease-ms", "5"], ["--scale", "3"],
                ["--protocol", "ib"], ["--frobnicate"]):
        p, _, err = daemons.run_bench("batch", *bad, timeout=30)
        assert p.returncode == 2 and b"usage: moonlet-bench batch" in err
