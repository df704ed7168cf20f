"""Integration test of `moonlet-bench trace` (tools/bench/trace.c).

Writes a four-turn conversation in the trace's format, replays it with the
build tree's moonlet-bench (which starts its own master and store node), and
checks the JSON figures against numbers worked out by hand from the model in
trace.c: a KV object per 512-token block, a checkpoint every 4 blocks of
`ranks` keys, the checkpoint at the new end put after each request, resume
strictly below the prompt.  The capacity holds the whole working set, so
no eviction touches a figure and every figure is exact.  Then --plot must produce a
PNG and --series the per-request rows.

Turns (ids = hash_ids, input = prompt tokens):
  1: ids 0..7,  input 4096  - nothing cached; puts 8 KV and checkpoint@8 blocks
  2: ids 0..11, input 6000  - KV 8 blocks; checkpoints @4 (absent), @8: resume 8
  3: ids 0..15, input 8192  - KV 12; @4, @8, @12 probed (@16 = prompt: excluded):
                              resume 8; puts checkpoint@16
  3 again                   - KV 16; @16 exists but is the prompt's end: final-token
                              recompute keeps the resume at 8; @16 is put again
                              (already present)
  4: ids 0..19, input 10000 - KV 16; complete @8 and @16: resume 16
Lease-all leases every existing checkpoint it probes (4 + 4 + 4 + 8 keys),
the selective lookup only the one it resumes from (4 + 4 + 4 + 4); in two
calls it leases every KV hit (8 + 12 + 16 + 16), in one call (ProbeResume,
k3_one_rtt) only the KV blocks below the resume position (8 + 8 + 8 + 16).  Use
stays at or below 24 of the 28 objects (86%, under the 90% watermark) until
turn 4's puts, which follow its lookup, so no eviction can change a figure.
"""

import json
import os
import shutil
import subprocess

import pytest

import daemons

BUILD = os.environ.get("MOONLET_BUILD_ROOT")
BENCH = os.path.join(BUILD or ".", "tools", "moonlet-bench")
RANKS = 4

TURNS = [(0, 8, 4096), (1000, 12, 6000), (2000, 16, 8192), (3000, 16, 8192), (4000, 20, 10000)]


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("trace") / "conv.jsonl"
    with open(p, "w") as f:
        for ts, blocks, inp in TURNS:
            f.write(json.dumps({"timestamp": ts, "input_length": inp, "output_length": 10,
                                "hash_ids": list(range(blocks))}) + "\n")
    return p


def run_bench(*args, timeout=120):
    p, out, err = daemons.run_bench("trace", *args, timeout=timeout)
    assert p.returncode == 0, err.decode()
    return out.decode()


def common_args(trace_file):
    # 64 KiB objects: the 20 KV + 8 KDA objects are 1.75 MiB, above the
    # store's 1 MiB minimum at capacity fraction 1.
    return ["--trace", str(trace_file), "--kv-bytes", "64KiB", "--kda-bytes", "64KiB",
            "--ranks", str(RANKS), "--kda-every", "4", "--capacity-fraction", "1",
            "--time-scale", "0.001"]


def test_figures_are_exact(trace_file):
    r = json.loads(run_bench(*common_args(trace_file), "--json"))
    assert r["requests"] == 5
    assert r["working_set"] == {"kv_objects": 20, "checkpoints": 2, "kda_objects": 8,
                                "bytes": 28 * 65536}
    for mode in ("lease_all", "selective", "k3_one_rtt"):
        m = r[mode]
        assert m["lookups"] == 5
        assert m["blocks_requested"] == 8 + 12 + 16 + 16 + 20
        assert m["kv_hit_blocks"] == 0 + 8 + 12 + 16 + 16
        assert m["kda_hit_blocks"] == 0 + 8 + 8 + 8 + 16
        assert m["prefill_tokens_saved"] == 512 * (8 + 8 + 8 + 16)
        assert m["kv_keys_leased"] == m["kv_keys_leased_own_count"]
        assert m["puts"] == (8 + 4) + 4 + (4 + 4) + 0 + 4  # per turn, KV + KDA
        assert m["puts_already_present"] == 4
        # Nothing evicted before a lookup: every resume is from the newest
        # checkpoint written (turns 2 to 5; turn 1 has no candidate).
        assert m["resumes_with_a_written_checkpoint"] == {
            "from_newest": 4, "from_older_newest_evicted": 0, "none_all_evicted": 0}
        # (an eviction may run after the last put, so evictions is not asserted)
        assert m["put_failures"] == 0
        # The master's counters agree with the helper's own count.
        assert m["kda_keys_leased"] == m["kda_keys_leased_own_count"]
        assert m["kda_bytes_leased"] == m["kda_keys_leased"] * 65536
    assert r["lease_all"]["kda_keys_leased"] == 4 + 4 + 4 + 8
    assert r["selective"]["kda_keys_leased"] == 4 + 4 + 4 + 4
    assert r["selective"]["master_leases_probe"] == 16
    assert r["lease_all"]["master_leases_probe"] == 0
    assert r["lease_all"]["lookup_rpcs"] == 5
    assert r["selective"]["lookup_rpcs"] == 1 + 2 + 2 + 2 + 2  # turn 1 has no KV: no probe
    assert r["kda_keys_leased_ratio_lease_all_over_selective"] == pytest.approx(20 / 16)
    assert r["lease_all"]["kv_keys_leased"] == 8 + 12 + 16 + 16
    assert r["selective"]["kv_keys_leased"] == 8 + 12 + 16 + 16
    one = r["k3_one_rtt"]
    assert one["kv_keys_leased"] == 8 + 8 + 8 + 16  # below the resume position only
    assert one["kda_keys_leased"] == 4 + 4 + 4 + 4
    assert one["master_leases_resume_kda"] == 16 and one["master_leases_resume_kv"] == 40
    assert one["master_leases_exist"] == 0 and one["master_leases_probe"] == 0
    assert one["lookup_rpcs"] == 5  # one per request
    assert r["kda_keys_leased_ratio_lease_all_over_k3_one_rtt"] == pytest.approx(20 / 16)
    assert r["kv_keys_leased_ratio_selective_over_k3_one_rtt"] == pytest.approx(52 / 40)
    assert r["never_evicting_cache"]["kv_hit_ratio"] == pytest.approx(52 / 72)
    assert r["never_evicting_cache"]["kda_hit_ratio"] == pytest.approx(40 / 72)


def test_plot_and_series(trace_file, tmp_path):
    png, csv = tmp_path / "t.png", tmp_path / "t.csv"
    out = run_bench(*common_args(trace_file), "--limit", "3", "--plot", str(png),
                    "--series", str(csv))
    assert "lease_all" in out and "selective" in out and "k3_one_rtt" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = csv.read_text().splitlines()
    assert rows[0].startswith("mode,t_s,requests,blocks,")
    assert len(rows) == 1 + 3 * 3
    last = dict(zip(rows[0].split(","), rows[-1].split(",")))
    assert last["mode"] == "k3_one_rtt" and last["requests"] == "3"
    assert last["blocks"] == str(8 + 12 + 16) and last["kda_keys_leased"] == "8"


def test_disk_run(trace_file):
    """--disk-fraction adds a fourth run, the one-call lookup with a disk tier
    on the node (the whole working set fits in DRAM here, so its figures are
    the one-call run's, exactly), reports it beside the others and removes
    the tiers' files."""
    d = daemons.direct_io_dir("test-bench-trace-disk-")
    try:
        r = json.loads(run_bench(*common_args(trace_file), "--disk-fraction", "2", "--disk-dir",
                                 d, "--json"))
        left = [f for f in os.listdir(d) if f.startswith("moonlet-trace-disk-")]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    disk, one, ref = r["k3_one_rtt_disk"], r["k3_one_rtt"], r["never_evicting_cache"]
    # each of the 28 objects: a header block and its 64 KiB, twice, in whole MiB
    assert disk["disk_bytes"] == 4 << 20
    for k in ("lookups", "blocks_requested", "kv_hit_blocks", "kda_hit_blocks",
              "kv_keys_leased", "kda_keys_leased", "puts"):
        assert disk[k] == one[k], k
    assert disk["demotions"] == 0 and disk["demotions_dropped"] == 0
    assert r["kv_hit_ratio_disk_minus_no_disk"] == 0
    assert r["kv_hit_ratio_reference_minus_disk"] == pytest.approx(
        ref["kv_hit_ratio"] - disk["kv_hit_ratio"])
    assert not left


def test_rejects_bad_flags(trace_file):
    p = subprocess.run([BENCH, "trace", "--trace", str(trace_file), "--kda-every", "0"],
                       capture_output=True, timeout=30)
    assert p.returncode == 2 and b"--kda-every" in p.stderr
    # Too small for a store node: refused before anything starts.
    p = subprocess.run([BENCH, "trace", "--trace", str(trace_file)], capture_output=True,
                       timeout=30)
    assert p.returncode == 2 and b"1 MiB minimum" in p.stderr
    # A disk run's directory that is not there: refused before any run starts.
    p = subprocess.run([BENCH, "trace", "--trace", str(trace_file), "--disk-fraction", "1",
                        "--disk-dir", "/nonexistent/moonlet-trace-disk"], capture_output=True,
                       timeout=30)
    assert p.returncode == 2 and b"--disk-dir" in p.stderr
