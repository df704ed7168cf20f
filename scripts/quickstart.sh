#!/usr/bin/env bash
# The Quick start's main job: installs what is missing, builds, starts a
# master and one store node (TCP, 64 MiB) on loopback, runs the walk-through
# against them, and stops both (by PID; the store first, so it unmounts).
set -euo pipefail
cd "$(dirname "$0")/.."
# The walk-through runs on loopback TCP: the Soft-RoCE test bed of the rdma
# suite (a qemu guest and a Debian kernel, ~410 MB) is left to scripts/test.sh.
MOONLET_NO_SOFTROCE=${MOONLET_NO_SOFTROCE:-1} bash scripts/setup.sh
bash scripts/build.sh

tmp=$(mktemp -d)
pids=()
cleanup() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

# wait_listening NAME PID: prints the HOST:PORT of the daemon's "listening on" line.
wait_listening() {
  for _ in $(seq 1 200); do
    local addr
    addr=$(sed -n 's/^listening on //p' "$tmp/$1.out")
    if [ -n "$addr" ]; then echo "$addr"; return 0; fi
    kill -0 "$2" 2>/dev/null || break
    sleep 0.05
  done
  echo "quickstart: $1 did not start:" >&2
  cat "$tmp/$1.err" >&2
  return 1
}

./build/tools/moonlet-master --rpc-port 0 >"$tmp/master.out" 2>"$tmp/master.err" &
pids+=($!)
master_addr=$(wait_listening master "${pids[0]}")
echo "moonlet-master listening on $master_addr (pid ${pids[0]})"

./build/tools/moonlet-store --master "$master_addr" --protocol tcp --segment-size 64MiB \
  --listen 127.0.0.1:0 --log-level warn >"$tmp/store.out" 2>"$tmp/store.err" &
pids+=($!)
store_addr=$(wait_listening store "${pids[1]}")
echo "moonlet-store  serving 64 MiB on $store_addr (pid ${pids[1]})"
echo
./build/tools/moonlet-demo "$master_addr"
