#!/usr/bin/env bash
# Installs every Debian package moonlet needs to build, test and benchmark,
# and the Soft-RoCE test bed of the `rdma` suite (scripts/softroce/setup.sh:
# qemu, busybox, rdma-core tools, perftest and a Debian kernel unpacked - never
# installed - into $SOFTROCE_DIR, default /var/tmp/softroce, ~410 MB;
# MOONLET_NO_SOFTROCE=1 leaves it out).
# Idempotent: packages already present are skipped; safe to re-run.  Retries
# while another apt/dpkg run holds the lock.
set -euo pipefail

PKGS=(
  build-essential pkg-config meson ninja-build clang libclang-rt-dev
  libibverbs-dev librdmacm-dev libmsgpack-dev libcmocka-dev libnuma-dev
  libxxhash-dev libcjson-dev libbsd-dev libmicrohttpd-dev libsodium-dev liburing-dev fio
  python3 python3-dev python3-pytest python3-matplotlib
  python3-mesonpy python3-venv patchelf
  debhelper dh-python lintian
  iproute2 nftables procps
  etcd-server libcurl4-openssl-dev libssl-dev openssl
  qemu-system-x86 busybox-static cpio kmod xz-utils
  ibverbs-providers ibverbs-utils rdmacm-utils perftest
  redis-server
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
apt_retry() { # bounded: another install may hold the dpkg lock for a while
  local i
  for i in $(seq 30); do
    $SUDO apt-get -o DPkg::Lock::Timeout=60 "$@" && return 0
    echo "setup: apt-get $1 failed (attempt $i), retrying in 10 s" >&2
    sleep 10
  done
  return 1
}
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PKGS[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  apt_retry update -qq
  apt_retry install -y -qq --no-install-recommends "${missing[@]}"
fi

# redis-server is moonlet-bench load's baseline; the bench starts its own on
# an ephemeral port.  The package also enables a system service on port 6379,
# which nothing here uses: when this run installed it, that service is
# stopped and disabled (a Redis that was already installed is left alone).
if [[ " ${missing[*]:-} " == *" redis-server "* ]] && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
fi

if [ "${MOONLET_NO_SOFTROCE:-0}" != 1 ]; then
  $SUDO bash "$(dirname "$0")/softroce/setup.sh"
fi
