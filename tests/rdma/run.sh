#!/bin/bash
# tests/rdma/run.sh BUILD_ROOT SOURCE_ROOT - the `rdma` meson suite (TAP).
# Boots ONE Soft-RoCE qemu guest (scripts/softroce/runvm.sh; ~30 s under TCG)
# and runs every RDMA test inside it (tests/rdma/guest.sh), against two real
# rxe devices joined by a veth wire.  Each guest test is one TAP line; the
# guest's console goes to stderr (meson keeps it in the test log) and its
# per-test logs to BUILD_ROOT/tests/rdma/out/.
# Reports "1..0 # SKIP <reason>" (TAP skip) when it cannot run here: not root,
# no qemu, no kernel unpacked (scripts/setup.sh installs both), no busybox.
# The guest sees the host's root read-only but mounts its own tmpfs over /tmp,
# /var/tmp, /root and /run; so the source and build trees (wherever they are:
# a clone under /tmp works as one under /srv) are shared by their real paths
# as their own read-only 9p shares (runvm.sh RO_DIRS), with MOONLET_RDMA_RO_DIRS
# (colon-separated) for anything else a test needs; only $OUT is writable.
# Env: SOFTROCE_DIR (default /var/tmp/softroce), MOONLET_RDMA_TESTS (space-
# separated subset of the guest's test names), MOONLET_VERBS_CASE (a cmocka
# filter for test_xfer_verbs), RDMA_TIMEOUT (s, default 1500).
set -u
B=$(readlink -f "$1") S=$(readlink -f "$2")
RXE=$(readlink -f "${SOFTROCE_DIR:-/var/tmp/softroce}")
skip() { echo "1..0 # SKIP $*"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "not root: the guest needs the host's root over 9p (run as root)"
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 missing (run scripts/setup.sh)"
ls "$RXE"/kern/boot/vmlinuz-* >/dev/null 2>&1 ||
    skip "no kernel unpacked in $RXE/kern (run scripts/setup.sh)"
ls "$RXE"/kern/lib/modules/*/modules.dep >/dev/null 2>&1 ||
    skip "no modules.dep in $RXE/kern (run scripts/setup.sh)"
[ -x /bin/busybox ] || skip "busybox-static missing (run scripts/setup.sh)"
command -v cpio >/dev/null || command -v busybox >/dev/null || skip "cpio missing"

# The shares' paths travel on the guest's kernel command line.
for d in "$B" "$S"; do
    case "$d" in *[[:space:]:]*) echo "Bail out! path with a blank or colon cannot be shared with the guest: $d"; exit 1 ;; esac
done
# Read-only shares at their real paths: the source tree, the build tree (unless
# it lies inside the source tree, whose share shows it), extra ones; a parent
# share comes before what lies inside it.
RO=$S
case "$B/" in "$S"/*) ;; *) RO=$RO:$B ;; esac
for d in $(echo "${MOONLET_RDMA_RO_DIRS:-}" | tr ':' ' '); do
    d=$(readlink -f "$d") && [ -d "$d" ] || { echo "Bail out! MOONLET_RDMA_RO_DIRS: no directory $d"; exit 1; }
    RO=$RO:$d
done
OUT=$B/tests/rdma/out
rm -rf "$OUT" && mkdir -p "$OUT" || { echo "Bail out! cannot create $OUT"; exit 1; }
# The initramfs lives in the build tree: rebuilt when init or the script change.
INITRD=$B/tests/rdma/initramfs-moonlet.gz
if [ ! -f "$INITRD" ] || [ "$S/scripts/softroce/init" -nt "$INITRD" ] ||
   [ "$S/scripts/softroce/make-initramfs.sh" -nt "$INITRD" ]; then
    SOFTROCE_DIR="$RXE" OUT="$INITRD" bash "$S/scripts/softroce/make-initramfs.sh" >&2 ||
        { echo "Bail out! make-initramfs.sh failed"; exit 1; }
fi
{
    printf 'B=%q\nS=%q\nOUT=%q\n' "$B" "$S" "$OUT"
    printf 'MOONLET_RDMA_TESTS=%q\n' "${MOONLET_RDMA_TESTS:-}"
    # a cmocka filter for test_xfer_verbs (debugging one case)
    [ -z "${MOONLET_VERBS_CASE:-}" ] || printf 'export MOONLET_VERBS_CASE=%q\n' "$MOONLET_VERBS_CASE"
} > "$OUT/env.sh"

t0=$(date +%s)
set -o pipefail
INITRD="$INITRD" RO_DIRS="$RO" RW_DIRS="$OUT" GUEST_APPEND="moonlet_out=$OUT" SOFTROCE_DIR="$RXE" \
TIMEOUT=${RDMA_TIMEOUT:-1500} LOG=/dev/stdout \
    bash "$S/scripts/softroce/runvm.sh" "$S/tests/rdma/guest.sh" |
    tr -d '\r' | while IFS= read -r line; do
        case "$line" in
        TAP:*) echo "${line#TAP:}" ;;
        esac
        printf '%s\n' "$line" >&2
    done
rc=${PIPESTATUS[0]}
echo "rdma suite: guest exited $rc after $(( $(date +%s) - t0 )) s" >&2
if [ "$rc" -ge 124 ]; then
    echo "Bail out! guest ended with status $rc (124 = timeout, 125 = died)"
fi
exit "$rc"
