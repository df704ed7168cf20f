#!/usr/bin/env bash
# rdma-check.sh - an operator's self-test of one host's RDMA NIC for moonlet.
#
#   scripts/rdma-check.sh IP [BUILD_DIR]
#
# IP is the address the store will serve on (--listen IP:PORT).  Reports the
# RDMA device that address is on, its port state, link layer, active MTU, the
# GID table entries of IP with their type (RoCE v2 is what rdma_cm uses), the
# NUMA node of the NIC, RLIMIT_MEMLOCK and free huge pages; then moves data
# through moonlet's own transport on that address (moonlet-bench transfer
# --protocol rdma: RDMA WRITEs and READs of 4 KiB to 16 MiB, served and read
# back in one process on the NIC).  Prints one "check: PASS" or "check: FAIL
# <reason>" line last; exit status 0 / 1.  Needs iproute2's `rdma` and
# ibverbs-utils; changes nothing on the host.
set -uo pipefail
IP=${1:?usage: rdma-check.sh IP [BUILD_DIR]}
B=${2:-$(dirname "$(readlink -f "$0")")/../build}
fail() { echo "check: FAIL $*"; exit 1; }

netdev=$(ip -o addr show | awk -v ip="$IP" '{split($4, a, "/"); if (a[1] == ip) {print $2; exit}}')
[ -n "$netdev" ] || fail "$IP is not an address of this host"
dev=$(rdma link show 2>/dev/null | awk -v nd="$netdev" '$0 ~ "netdev " nd "( |$)" {split($2, a, "/"); print a[1]; exit}')
[ -n "$dev" ] || fail "$IP is on $netdev, which has no RDMA device (rdma link show)"
port=$(rdma link show 2>/dev/null | awk -v nd="$netdev" '$0 ~ "netdev " nd "( |$)" {split($2, a, "/"); print a[2]; exit}')
P=/sys/class/infiniband/$dev/ports/$port
echo "address:     $IP on $netdev"
echo "device:      $dev port $port"
state=$(cat "$P/state" 2>/dev/null)
echo "port state:  $state"
echo "link layer:  $(cat "$P/link_layer" 2>/dev/null)"
echo "active MTU:  $(ibv_devinfo -d "$dev" -i "$port" 2>/dev/null | awk '/active_mtu/ {print $2, $3; exit}') (netdev MTU $(cat /sys/class/net/"$netdev"/mtu))"
hex=$(printf '%02x%02x:%02x%02x' $(echo "$IP" | tr . ' ') 2>/dev/null)
for g in "$P"/gids/*; do
    i=${g##*/}
    gid=$(cat "$g" 2>/dev/null) || continue
    case "$gid" in *"$hex") echo "GID index:   $i $gid ($(cat "$P/gid_attrs/types/$i" 2>/dev/null))" ;; esac
done
echo "NUMA node:   $(cat /sys/class/infiniband/"$dev"/device/numa_node 2>/dev/null || echo unknown)"
echo "memlock:     $(ulimit -l) (KiB; a store pins its whole segment: needs unlimited or more)"
echo "huge pages:  $(awk '/HugePages_Free/ {f=$2} /HugePages_Total/ {t=$2} END {print f " free of " t}' /proc/meminfo) (2 MiB)"
case "$state" in *ACTIVE*) ;; *) fail "port $dev/$port is not ACTIVE ($state)" ;; esac
bench=$B/tools/moonlet-bench
[ -x "$bench" ] || fail "no $bench (build first, or pass BUILD_DIR)"
out=$(timeout 300 "$bench" transfer --protocol rdma --listen-addr "$IP" --source-addr "$IP" \
          --rounds 1 --segment-mib 64 --json 2>&1) || fail "moonlet's RDMA transfer failed: $out"
echo "transfer:    $(echo "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read().strip().splitlines()[-1])
print(", ".join("%d KiB r %.2f w %.2f GB/s" % (r["size_bytes"] >> 10, r["read_gbps"], r["write_gbps"])
                for r in d["results"]) + "; 4 KiB read %.0f us" % d["read_4KiB_latency_us_median"])')"
echo "check: PASS ($dev port $port serves RDMA WRITE and READ through moonlet on $IP)"
