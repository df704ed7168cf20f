# tests/rdma/bench.sh - sourced by guest.sh INSIDE the Soft-RoCE guest:
# moonlet-bench transfer --protocol rdma beside perftest on the same rxe
# devices in the same boot (server rxe0 / 10.77.0.1, client rxe1 /
# 10.77.0.2), and the ratios.  Software emulation makes absolute figures
# meaningless; the ratios are the figures (target >= 0.7 of perftest's
# bandwidth at 1 MiB and 16 MiB).  Writes $OUT/bench.json; fails when a tool
# fails (every size must move through moonlet's RDMA path) or a bandwidth
# ratio falls below BENCH_FLOOR (default 0.1).  The target is reported, not
# enforced: on a 2-core host shared with other builds, the same guest gives
# ratios from 0.2 to 2 from run to run (perftest and moonlet-bench run one
# after the other, so host load hits them differently).
perf_pair() { # perf_once, again (at most 3 tries) when perftest could not time itself
    local out try
    for try in 1 2 3; do
        out=$(perf_once "$@") && { echo "$out"; return 0; }
        # perftest samples the CPU clock first and gives up when the samples
        # do not fit a line ("Correlation coefficient r^2 ... < 0.9", "Can't
        # produce a report"): the guest's vCPUs lost the host's cores meanwhile
        { echo "$out"; cat "$OUT/perftest-server.log"; } | grep -q "Can't produce a report" ||
            { echo "$out"; return 1; }
        echo "perftest $1: the CPU clock sampling failed (a busy host), try $try of 3" >&2
    done
    echo "$out"
    return 1
}
perf_once() { # tool args... : server on rxe0, client on rxe1; prints the client's output
    local tool=$1; shift
    timeout 120 "$tool" -d "$RXE_A" -x "$GID_IDX" "$@" > "$OUT/perftest-server.log" 2>&1 &
    local spid=$! i
    for i in $(seq 200); do # its TCP rendezvous port (18515) is open: it is listening
        ss -ltn 2>/dev/null | grep -q ':18515 ' && break
        sleep 0.05
    done
    timeout 110 "$tool" -d "$RXE_B" -x "$GID_IDX" "$@" "$IP_A" 2>&1
    local crc=$?
    wait $spid
    return $(( crc | $? ))
}
bw_of() { awk -v s="$1" '$1 == s && NF >= 4 {print $4}'; }      # BW average [MB/s]
lat_of() { awk -v s="$1" '$1 == s && NF >= 5 {print $5}'; }     # t_typical [usec]

t_bench() {
    local r1 r16 w1 w16 lat out
    # 40 x 1 MiB and 5 x 16 MiB (perftest's minimum) per run: under emulation
    # (~5-10 MB/s) that is 5-15 s each; more iterations only cost CI time
    # (100 and 12 took ~200 s for the four runs), the figure is a rate either way
    out=$(perf_pair ib_read_bw -s 1048576 -n 40) || return 1; r1=$(echo "$out" | bw_of 1048576)
    out=$(perf_pair ib_read_bw -s 16777216 -n 5) || return 1; r16=$(echo "$out" | bw_of 16777216)
    out=$(perf_pair ib_write_bw -s 1048576 -n 40) || return 1; w1=$(echo "$out" | bw_of 1048576)
    out=$(perf_pair ib_write_bw -s 16777216 -n 5) || return 1; w16=$(echo "$out" | bw_of 16777216)
    out=$(perf_pair ib_read_lat -s 4096 -n 300) || return 1; lat=$(echo "$out" | lat_of 4096)
    echo "perftest: read 1M $r1 MB/s, 16M $r16 MB/s; write 1M $w1, 16M $w16; read_lat 4K $lat us"
    timeout 300 "$B/tools/moonlet-bench" transfer --protocol rdma --listen-addr "$IP_A" \
        --source-addr "$IP_B" --rounds 3 --segment-mib 256 --json > "$OUT/bench-moonlet.json" ||
        return 1
    cat "$OUT/bench-moonlet.json"
    PERF="$r1 $r16 $w1 $w16 $lat" python3 - "$OUT/bench-moonlet.json" "$OUT/bench.json" \
        "${BENCH_FLOOR:-0.1}" <<'PY'
import json, os, sys
m = json.load(open(sys.argv[1]))
r1, r16, w1, w16, lat = map(float, os.environ["PERF"].split())
by = {r["size_bytes"]: r for r in m["results"]}
def mbs(gbps): return gbps * 1000.0
rows = {
    "read_1MiB": (mbs(by[1 << 20]["read_gbps"]), r1),
    "read_16MiB": (mbs(by[16 << 20]["read_gbps"]), r16),
    "write_1MiB": (mbs(by[1 << 20]["write_gbps"]), w1),
    "write_16MiB": (mbs(by[16 << 20]["write_gbps"]), w16),
}
out = {"unit": "MB/s (1e6 bytes/s)", "target_ratio": 0.7, "floor": float(sys.argv[3])}
for k, (mo, pf) in rows.items():
    out[k] = {"moonlet": round(mo, 1), "perftest": pf, "ratio": round(mo / pf, 3)}
out["read_4KiB_latency_us"] = {"moonlet_median": round(m["read_4KiB_latency_us_median"], 1),
                               "ib_read_lat_typical": lat}
out["moonlet_bench"] = m
json.dump(out, open(sys.argv[2], "w"), indent=1)
for k in rows:
    print(f"{k}: moonlet {out[k]['moonlet']} MB/s, perftest {out[k]['perftest']} MB/s, "
          f"ratio {out[k]['ratio']}")
print(f"4 KiB read latency: moonlet {out['read_4KiB_latency_us']['moonlet_median']} us, "
      f"ib_read_lat {lat} us")
bad = [k for k in rows if out[k]["ratio"] < out["floor"]]
sys.exit(1 if bad else 0)
PY
}

# moonlet-bench batch --protocol rdma (the client's batch calls: one master
# call per window, every transfer of it in one transport batch) beside
# perftest's bandwidth at the same object sizes, in the same boot.  The
# workloads are scaled down 16 times for emulation (64 keys of 4 KiB and of
# 64 KiB, 8 of 1 MiB, 64 of 8 x 8 KiB); the ratios get / ib_read_bw and put
# / ib_write_bw at 4 KiB, 64 KiB and 1 MiB are the figures, written to
# $OUT/bench-batch.json.  Fails when a tool fails (every key must move and
# read back its own bytes); the ratios are reported, not enforced (see above).
t_batch_bench() {
    local out sz n rd wr perf=""
    for sz in 4096 65536 1048576; do
        n=$(( sz == 1048576 ? 40 : sz == 65536 ? 100 : 300 ))
        out=$(perf_pair ib_read_bw -s "$sz" -n "$n") || return 1; rd=$(echo "$out" | bw_of "$sz")
        out=$(perf_pair ib_write_bw -s "$sz" -n "$n") || return 1; wr=$(echo "$out" | bw_of "$sz")
        echo "perftest $sz B: read $rd MB/s, write $wr MB/s"
        perf="$perf $sz:$rd:$wr"
    done
    timeout 600 "$B/tools/moonlet-bench" batch --protocol rdma --listen-addr "$IP_A" \
        --source-addr "$IP_B" --scale 16 --rounds 3 --lease-ms 60000 --json \
        > "$OUT/bench-batch-moonlet.json" || return 1
    PERF="$perf" python3 - "$OUT/bench-batch-moonlet.json" "$OUT/bench-batch.json" <<'PY'
import json, os, sys
m = json.load(open(sys.argv[1]))
perf = {int(s): (float(r), float(w)) for s, r, w in
        (x.split(":") for x in os.environ["PERF"].split())}
out = {"unit": "MB/s (1e6 bytes/s)", "scale": m["scale"], "rows": {}}
for wl in m["workloads"]:
    size = wl["object_bytes"]
    if wl["ranges_per_key"] != 1 or size not in perf:
        continue
    rd, wr = perf[size]
    row = {"keys": wl["keys"], "ib_read_bw": rd, "ib_write_bw": wr}
    for path in ("batch", "per_key"):
        get, put = wl[path]["get_gbps"] * 1000.0, wl[path]["put_gbps"] * 1000.0
        row[path] = {"get": round(get, 1), "put": round(put, 1),
                     "get_over_ib_read_bw": round(get / rd, 3),
                     "put_over_ib_write_bw": round(put / wr, 3)}
    out["rows"][wl["workload"]] = row
    print(f"{wl['workload']}: batch get {row['batch']['get']} MB/s "
          f"({row['batch']['get_over_ib_read_bw']} of ib_read_bw), put {row['batch']['put']} MB/s "
          f"({row['batch']['put_over_ib_write_bw']} of ib_write_bw); per key get "
          f"{row['per_key']['get_over_ib_read_bw']}, put {row['per_key']['put_over_ib_write_bw']}")
out["moonlet_bench"] = m
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
}
