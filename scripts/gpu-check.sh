#!/usr/bin/env bash
# The real-GPU check of moonlet's device-memory paths (docs/benchmarks.md,
# "Device memory"): for a machine with an NVIDIA GPU and its driver, but no
# package installs and no network.
#
#   scripts/gpu-check.sh --bundle DIR   (here, after scripts/build.sh) copies
#       the daemons, moonlet-bench, the device-memory test and every shared
#       library they link (but the C library's own) into DIR, with this
#       script: DIR is all the GPU machine needs (about 10 MB).
#   DIR/gpu-check.sh [--out FILE]       (on the GPU machine) runs, with the
#       machine's libcuda.so.1:
#         1. tests/gpu/test_client_gpu, direct and through a RealClient: every
#            call path with device buffers, bytes compared, and a corrupted
#            replica refused before its bytes reach the device;
#         2. moonlet-bench transfer --device-buffers: 256 MiB of device
#            memory (filled with a pattern) put in KV-block-sized objects
#            (256 KiB, 1 MiB, 16 MiB) over TCP on 127.0.0.1, read back into
#            another device buffer and compared (on the host, after a driver
#            copy), in GB/s beside the same calls on host memory and beside
#            the driver's own device-to-host copy bandwidth, same run.
#       The JSON goes to FILE (default gpu-check.json in the current
#       directory); the exit status is 0 only when every step passed.
#   MOONLET_CUDA_DRIVER=PATH names another driver (the fake one, for a
#       self-test of the bundle on a machine without a GPU).
# Every daemon it starts is stopped by its own PID (the tests and the bench
# start and stop theirs).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

bundle() {
  local dir=$1 root
  root=$(cd "$here/.." && pwd)
  local b="$root/build"
  [ -x "$b/tools/moonlet-bench" ] || { echo "gpu-check: build first (scripts/build.sh)" >&2; exit 2; }
  mkdir -p "$dir/tools" "$dir/tests/gpu" "$dir/lib"
  cp "$b/tools/moonlet-master" "$b/tools/moonlet-store" "$b/tools/moonlet-bench" "$dir/tools/"
  cp "$b/tests/gpu/test_client_gpu" "$dir/tests/gpu/"
  cp "$b/tests/gpu/libfakecuda.so" "$dir/lib/" # for a self-test without a GPU
  cp "$here/gpu-check.sh" "$dir/"
  # every shared library the programs link, but glibc's own (the GPU
  # machine's C library is the one its driver works with)
  for f in "$dir"/tools/* "$dir/tests/gpu/test_client_gpu"; do
    ldd "$f" | awk '$3 ~ /^\// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;
      *) cp -L "$lib" "$dir/lib/" ;;
    esac
  done
  du -sh "$dir" | awk '{print "gpu-check: bundle of " $1 " in " $2}'
}

check() {
  local out=$1
  [ -x "$here/tools/moonlet-bench" ] || {
    echo "gpu-check: run it from a bundle: $0 --bundle DIR, then DIR/gpu-check.sh" >&2; exit 2; }
  export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export MOONLET_BUILD_ROOT="$here"
  export MOONLET_SOURCE_ROOT="$here"
  local driver=${MOONLET_CUDA_DRIVER:-libcuda.so.1}
  echo "gpu-check: $(date -u +%FT%TZ) on $(hostname), driver $driver"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  fi
  local rc=0
  for how in direct dummy; do
    local args=()
    [ "$how" = dummy ] && args=(dummy)
    if (cd "$here" && timeout 300 ./tests/gpu/test_client_gpu "${args[@]}") >"$here/test-$how.log" 2>&1; then
      echo "gpu-check: test_client_gpu ($how): passed"
    else
      echo "gpu-check: test_client_gpu ($how): FAILED (log: $here/test-$how.log)"
      tail -20 "$here/test-$how.log"
      rc=1
    fi
  done
  if (cd "$here" && timeout 400 ./tools/moonlet-bench transfer --device-buffers --json \
        --sizes 256KiB,1MiB,16MiB --round-bytes 256MiB --rounds 5) >"$out" 2>"$here/bench.log"; then
    echo "gpu-check: moonlet-bench transfer --device-buffers: passed (JSON in $out)"
    /usr/bin/env python3 - "$out" <<'EOF' || true
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{'SIZE':>10} {'OP':>4} {'HOST GB/s':>10} {'DEVICE GB/s':>12} {'RATIO':>6}")
for s in d["sizes"]:
    for op in ("put", "get"):
        print(f"{s['size']:>10} {op:>4} {s[f'host_{op}_gbps']:>10.2f} "
              f"{s[f'device_{op}_gbps']:>12.2f} {s[f'{op}_ratio']:>6.2f}")
print(f"driver device-to-host copy into pinned memory: {d['driver_d2h_gbps']:.2f} GB/s")
print(f"pinned staging: {d['pinned_bytes']} of {d['pinned_bound']} bytes")
EOF
  else
    echo "gpu-check: moonlet-bench transfer --device-buffers: FAILED"
    tail -20 "$here/bench.log"
    rc=1
  fi
  return $rc
}

case "${1:-}" in
  --bundle)
    [ $# -eq 2 ] || { echo "usage: $0 --bundle DIR" >&2; exit 2; }
    bundle "$2"
    ;;
  --out)
    [ $# -eq 2 ] || { echo "usage: $0 [--out FILE]" >&2; exit 2; }
    check "$2"
    ;;
  "")
    check "$PWD/gpu-check.json"
    ;;
  *)
    echo "usage: $0 --bundle DIR | $0 [--out FILE]" >&2
    exit 2
    ;;
esac
