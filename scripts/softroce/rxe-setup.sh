# (adapted from ../shared/softroce/rxe-setup.sh) Source this INSIDE the guest (bash): loads Soft-RoCE and builds a two-port
# RoCE "fabric" that exists only inside the guest:
#   rxe0 on vethA 10.77.0.1/24  <== veth wire ==>  rxe1 on vethB 10.77.0.2/24
# Both veth ends stay in the initial network namespace: the Debian 6.1 (and
# 6.12) rdma_rxe opens its UDP/4791 socket and looks up routes in init_net
# only, so an rxe device on a netdev inside another netns is ACTIVE but never
# receives anything (rping: RDMA_CM_EVENT_UNREACHABLE). To make traffic between
# the two local addresses really cross the veth wire instead of short-cutting
# through lo, policy rules route by output interface (rxe and rdma_cm always
# set the oif) ahead of the local table, and accept_local lets a packet whose
# source is a local address in.
# Afterwards: RXE_A=rxe0 RXE_B=rxe1 IP_A=10.77.0.1 IP_B=10.77.0.2 GID_IDX=1
# A client that must use rxe1 has to bind its source address 10.77.0.2
# (rping -I 10.77.0.2, rdma_resolve_addr(src=10.77.0.2), or -d rxe1 -g 1 for
# the raw verbs tools); without that, rdma_cm picks rxe0 and rxe0 loops the
# traffic back internally (also works, but not over the wire).
RXE_KDIR=${RXE_KDIR:-$(sed -n 's/.*[[:space:]]kdir=\([^[:space:]]*\).*/\1/p' /proc/cmdline)}
RXE_KDIR=${RXE_KDIR:-/var/tmp/softroce/kern}
RXE_A=rxe0 RXE_B=rxe1 IP_A=10.77.0.1 IP_B=10.77.0.2 GID_IDX=1

rxe_setup() {
    modprobe -d "$RXE_KDIR" -a rdma_rxe ib_uverbs rdma_ucm veth || return 1
    ip link set lo up
    ip link add vethA type veth peer name vethB || return 1
    ip addr add $IP_A/24 dev vethA
    ip addr add $IP_B/24 dev vethB
    ip link set vethA up
    ip link set vethB up
    # A veth hands each packet to the peer's per-CPU backlog (1000 packets by
    # default); rxe bursts more than that, and every drop costs a go-back-N
    # retransmission after the ~0.5 s ACK timeout (4x less bandwidth, transfers
    # stalling for seconds).  Real RoCE runs on a lossless class (PFC) instead.
    sysctl -qw net.core.netdev_max_backlog=50000
    local k
    for k in all default vethA vethB; do
        sysctl -qw net.ipv4.conf.$k.rp_filter=0 net.ipv4.conf.$k.accept_local=1
    done
    ip route add $IP_B dev vethA table 101
    ip route add $IP_A dev vethB table 102
    ip rule add pref 10 oif vethA lookup 101
    ip rule add pref 11 oif vethB lookup 102
    ip rule add pref 100 lookup local
    ip rule del pref 0
    rdma link add $RXE_A type rxe netdev vethA || return 1
    rdma link add $RXE_B type rxe netdev vethB || return 1
    # wait until both ports are ACTIVE and carry the IPv4-mapped GID
    local i
    for i in $(seq 50); do
        if grep -q ACTIVE /sys/class/infiniband/$RXE_A/ports/1/state 2>/dev/null &&
           grep -q ACTIVE /sys/class/infiniband/$RXE_B/ports/1/state 2>/dev/null &&
           grep -q 0a4d /sys/class/infiniband/$RXE_B/ports/1/gids/$GID_IDX 2>/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    echo "rxe_setup: ports did not become ACTIVE" >&2
    return 1
}
