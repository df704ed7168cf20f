"""Integration test of `moonlet-bench disk` (tools/bench/disk.c): one short
round per size in a fresh directory (a real file system: O_DIRECT).  Checks
the document's shape, that both paths moved bytes (the bench fails when a
read returns other bytes than were written), that the ratios are those of
its own figures, that the streams asked for are those it ran, and that it
leaves no file behind.  Bad flags exit 2.
"""
import json
import os
import shutil

import pytest

import daemons


def test_short_run():
    if not shutil.which("fio"):
        pytest.skip("no fio (Debian's fio: scripts/setup.sh)")
    d = daemons.direct_io_dir("bench-disk-")
    try:
        p, out, err = daemons.run_bench("disk", "--json", "--rounds", "1", "--sizes", "64KiB,1MiB",
                                        "--round-bytes", "8MiB", "--queue-depth", "4", "--streams", "3",
                                        "--dir", d,
                                        timeout=120)
        assert p.returncode == 0, err.decode()
        r = json.loads(out)
        assert r["bench"] == "disk" and r["rounds"] == 1 and r["queue_depth"] == 4
        assert r["streams"] == 3
        assert [s["size"] for s in r["sizes"]] == [64 << 10, 1 << 20]
        for s in r["sizes"]:
            for op in ("write", "read"):
                m, f = s[f"moonlet_{op}_gbps"], s[f"fio_{op}_gbps"]
                assert m > 0 and f > 0
                assert s[f"{op}_ratio"] == pytest.approx(m / f)
        assert os.listdir(d) == []
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_bad_flags():
    for args in (["--sizes", "1000"], ["--rounds", "0"], ["--queue-depth", "x"],
                 ["--round-bytes", "1KiB"], ["--streams", "0"], ["--streams", "9"],
                 ["--nonsense"]):
        p, _, _ = daemons.run_bench("disk", *args, timeout=30)
        assert p.returncode == 2, args
