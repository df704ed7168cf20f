#!/bin/bash
# One-time (idempotent) host setup of the Soft-RoCE test bed that the `rdma`
# test suite (tests/rdma) boots: Debian packages, a Debian kernel unpacked
# into $SOFTROCE_DIR/kern (NOT installed on the host), depmod there, and the
# initramfs $SOFTROCE_DIR/initramfs-moonlet.gz (make-initramfs.sh + init).
# Run as root (scripts/setup.sh calls it).  Env: SOFTROCE_DIR (default
# /var/tmp/softroce; about 410 MB), KPKG (kernel package; default what
# linux-image-amd64 depends on).  Retries apt while another install holds its lock.
# Adapted from the reference test bed (../shared/softroce/setup.sh).
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
RXE=${SOFTROCE_DIR:-/var/tmp/softroce}
mkdir -p "$RXE"
cd "$RXE"
export DEBIAN_FRONTEND=noninteractive
PKGS="qemu-system-x86 busybox-static cpio kmod iproute2 xz-utils
      ibverbs-providers ibverbs-utils rdmacm-utils perftest"
apt_retry() { # apt-get may be locked briefly by another install: retry, bounded
    local i
    for i in $(seq 30); do
        apt-get -o DPkg::Lock::Timeout=60 "$@" && return 0
        echo "softroce-setup: apt-get $1 failed (attempt $i), retrying in 10 s" >&2
        sleep 10
    done
    return 1
}
missing=
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
need_kernel=0
[ -d kern/lib/modules ] || need_kernel=1
if [ -n "$missing" ] || { [ $need_kernel = 1 ] && ! apt-cache show linux-image-amd64 >/dev/null 2>&1; }; then
    apt_retry update -q
fi
[ -z "$missing" ] || apt_retry install -y -q --no-install-recommends $missing

if [ $need_kernel = 1 ]; then
    KPKG=${KPKG:-$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')}
    echo "softroce-setup: unpacking $KPKG into $RXE/kern"
    rm -rf kern dl && mkdir -p dl
    (cd dl && apt_retry download "$KPKG")
    dpkg-deb -x dl/"$KPKG"_*.deb kern
    rm -rf dl
fi
KVER=$(ls kern/lib/modules | head -1)
[ -f kern/lib/modules/$KVER/modules.dep ] || depmod -b "$RXE/kern" "$KVER"
find kern -name 'rdma_rxe.ko*' | grep -q . || { echo "softroce-setup: no rdma_rxe module in $KVER" >&2; exit 1; }
if [ ! -f initramfs-moonlet.gz ] || [ "$HERE/init" -nt initramfs-moonlet.gz ] ||
   [ "$HERE/make-initramfs.sh" -nt initramfs-moonlet.gz ]; then
    SOFTROCE_DIR="$RXE" bash "$HERE/make-initramfs.sh"
fi
echo "softroce-setup: ready (kernel $KVER in $RXE)"
