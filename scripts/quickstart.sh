#!/usr/bin/env bash
# The Quick start's main job: installs what is missing, builds, starts a
# master on loopback, runs the walk-through against it, and stops the master.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh

log=$(mktemp)
./build/tools/moonlet-master --rpc-port 0 >"$log.out" 2>"$log" &
master=$!
trap 'kill -TERM $master 2>/dev/null || true; wait $master 2>/dev/null || true; rm -f "$log" "$log.out"' EXIT
for _ in $(seq 1 100); do
  addr=$(sed -n 's/^listening on //p' "$log.out" 2>/dev/null || true)
  [ -n "$addr" ] && break
  sleep 0.05
done
if [ -z "${addr:-}" ]; then
  echo "quickstart: the master did not start:" >&2
  cat "$log" >&2
  exit 1
fi
echo "moonlet-master listening on $addr (pid $master)"
./build/tools/moonlet-demo "$addr"
