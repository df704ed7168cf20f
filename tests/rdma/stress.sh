#!/bin/bash
# tests/rdma/stress.sh [RUNS] [BUILD] - the rdma suite RUNS times in a row
# (default 10) with the host loaded by two CPU-bound processes, as a busy
# machine would load it: the guest's keepalive and timeouts must not end a
# healthy connection.  Stops at the first failing run (its log stays in
# BUILD/meson-logs/); prints one line per run and a summary, and exits 0
# only when every run passed.  The load is two `sha256sum /dev/zero`
# processes started here and stopped by PID at the end (also on Ctrl-C).
# Run from the repository root, as root, after ./scripts/build.sh (BUILD
# defaults to ./build).
set -u
runs=${1:-10}
build=${2:-build}
case "$runs" in ''|*[!0-9]*) echo "usage: $0 [RUNS] [BUILD]" >&2; exit 2 ;; esac
[ -f "$build/build.ninja" ] || { echo "$0: no build in $build (run ./scripts/build.sh)" >&2; exit 2; }
hogs=()
stop_hogs() {
    local p
    for p in "${hogs[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${hogs[@]}"; do wait "$p" 2>/dev/null; done
    hogs=()
}
trap 'stop_hogs; exit 130' INT TERM
for _ in 1 2; do
    sha256sum /dev/zero > /dev/null &
    hogs+=("$!")
done
passed=0
for i in $(seq 1 "$runs"); do
    t0=$(date +%s)
    if meson test -C "$build" --suite rdma --print-errorlogs > "$build/rdma-stress-$i.log" 2>&1; then
        passed=$((passed + 1))
        echo "run $i of $runs: passed ($(( $(date +%s) - t0 )) s) $(grep -o '[0-9]* subtests passed' "$build/rdma-stress-$i.log" | head -1)"
    else
        echo "run $i of $runs: FAILED ($(( $(date +%s) - t0 )) s), log: $build/rdma-stress-$i.log"
        grep -E '^not ok|Bail out' "$build/rdma-stress-$i.log" | head -5
        break
    fi
done
stop_hogs
echo "$passed of $runs runs passed under two CPU-bound processes"
[ "$passed" -eq "$runs" ]
