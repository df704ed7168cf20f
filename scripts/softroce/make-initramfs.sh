#!/bin/bash
# Build $SOFTROCE_DIR/initramfs-moonlet.gz (or $OUT): static busybox + the modules that mount the
# host's root over virtio-9p, + /init (next to this script).
# Needs: the Debian kernel unpacked in $KDIR (see setup.sh), busybox-static, kmod (depmod).
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
RXE=${SOFTROCE_DIR:-/var/tmp/softroce}
KDIR=${KDIR:-$RXE/kern}
KVER=${KVER:-$(ls "$KDIR/lib/modules" | head -1)}
MDIR=$KDIR/lib/modules/$KVER
OUT=${OUT:-$RXE/initramfs-moonlet.gz}
[ -f "$MDIR/modules.dep" ] || depmod -b "$KDIR" "$KVER"

WANT="virtio_pci 9pnet_virtio 9p"
work=$(mktemp -d "${TMPDIR:-/tmp}/moonlet-initrd.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work"/{bin,mod,proc,sys,dev,host}
cp /bin/busybox "$work/bin/busybox"
cp "$HERE/init" "$work/init"
chmod 755 "$work/init" "$work/bin/busybox"

# Resolve dependencies (modules.dep lists deps deepest-last), emit load order
declare -A seen=()
order=()
add() { # $1 = path relative to $MDIR
    local p=$1 deps d
    [ -n "${seen[$p]:-}" ] && return
    seen[$p]=1
    deps=$(awk -v m="$p:" '$1==m {for(i=2;i<=NF;i++) print $i}' "$MDIR/modules.dep")
    # deepest dependencies come last in modules.dep: load them first
    for d in $(echo "$deps" | tac); do add "$d"; done
    order+=("$p")
}
for m in $WANT; do
    p=$(awk -v n="$m" -F: '{f=$1; sub(".*/","",f); sub(/\.ko(\.xz|\.zst|\.gz)?$/,"",f); gsub("-","_",f); if (f==n) {print $1; exit}}' "$MDIR/modules.dep")
    [ -n "$p" ] || { echo "module $m not found (built in?)" >&2; continue; }
    add "$p"
done
: > "$work/modules.order"
for p in "${order[@]}"; do
    name=$(basename "$p"); name=${name%%.ko*}
    case "$p" in
        *.ko.xz)  xz -dc "$MDIR/$p"  > "$work/mod/$name.ko" ;;
        *.ko.zst) zstd -dc "$MDIR/$p" > "$work/mod/$name.ko" ;;
        *.ko.gz)  gzip -dc "$MDIR/$p" > "$work/mod/$name.ko" ;;
        *)        cp "$MDIR/$p" "$work/mod/$name.ko" ;;
    esac
    echo "$name" >> "$work/modules.order"
done
echo "initramfs modules: $(tr '\n' ' ' < "$work/modules.order")"
if command -v cpio >/dev/null; then CPIO="cpio --quiet"; else CPIO="busybox cpio"; fi
(cd "$work" && find . | $CPIO -o -H newc | gzip -1) > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
ls -l "$OUT"
