#!/bin/bash
# Usage: runvm.sh GUEST_SCRIPT [extra qemu args]
# env: ACCEL=tcg|kvm MEM=1024 SMP=2 TIMEOUT=600 LOG=file RW_DIRS=/a:/b RO_DIRS=/c:/d
#      INITRD (default $SOFTROCE_DIR/initramfs-moonlet.gz, built by make-initramfs.sh)
#      GUEST_APPEND (extra words for the kernel command line; the guest script
#      reads them from /proc/cmdline, e.g. moonlet_out=/path)
# Boots the Debian kernel with the 9p-root initramfs, runs GUEST_SCRIPT (a path on
# the host, seen at the same path in the guest) and exits with its exit status
# (124 = timeout, 125 = the guest died without reporting one).
# Adapted from the reference test bed (../shared/softroce/runvm.sh).
set -u
RXE=$(realpath "${SOFTROCE_DIR:-/var/tmp/softroce}")
script=$(realpath "$1"); shift
KVER=$(ls "$RXE/kern/lib/modules" | head -1)
ACCEL=${ACCEL:-tcg}
if [ "$ACCEL" = tcg ]; then accel="-accel tcg,thread=multi"; else accel="-accel kvm"; fi
LOG=${LOG:-/dev/stdout}
# RW_DIRS=/a:/b : host directories that are writable in the guest (same path);
# everything else of the host's / is read-only there, and the guest mounts its
# own tmpfs over /tmp, /var/tmp, /root and /run, hiding what the host has there.
# RO_DIRS=/c:/d : host directories shared read-only at their own paths, mounted
# after those tmpfs (so a source or build tree under /tmp is seen) and before
# RW_DIRS (which may lie inside one of them).  Paths must not contain blanks
# or colons (they travel on the kernel command line).
rw=() i=0
for d in $(echo "${RW_DIRS:-}" | tr ':' ' '); do
  rw+=(-virtfs "local,path=$d,mount_tag=rw$i,security_model=none"); i=$((i+1))
done
i=0
for d in $(echo "${RO_DIRS:-}" | tr ':' ' '); do
  rw+=(-virtfs "local,path=$d,mount_tag=ro$i,security_model=none,readonly=on,multidevs=remap")
  i=$((i+1))
done
timeout --foreground -k 5 "${TIMEOUT:-600}" qemu-system-x86_64 $accel -smp "${SMP:-2}" -m "${MEM:-1024}" \
  -nographic -no-reboot -nic none -monitor none -serial stdio \
  -kernel "$RXE/kern/boot/vmlinuz-$KVER" -initrd "${INITRD:-$RXE/initramfs-moonlet.gz}" \
  -append "console=ttyS0 panic=-1 quiet loglevel=4 rxedir=$RXE kdir=$RXE/kern guestscript=$script rwdirs=${RW_DIRS:-} rodirs=${RO_DIRS:-} ${GUEST_APPEND:-}" \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$RXE",mount_tag=rxe,security_model=none \
  -device isa-debug-exit,iobase=0xf4,iosize=0x01 "${rw[@]}" "$@" > "$LOG" 2>&1 < /dev/null
rc=$?
# isa-debug-exit gives (status << 1) | 1; 0 means the guest powered off / panicked without reporting
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "runvm: timeout" >&2; exit 124; fi
if [ $((rc & 1)) -eq 1 ]; then exit $((rc >> 1)); fi
echo "runvm: guest ended without a status (qemu rc=$rc)" >&2; exit 125
