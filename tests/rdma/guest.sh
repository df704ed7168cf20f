# tests/rdma/guest.sh - runs INSIDE the Soft-RoCE guest (booted by run.sh
# through scripts/softroce/runvm.sh; chrooted into the host's root, read-only
# except /tmp and $OUT).  Sets up rxe0 (vethA 10.77.0.1) and rxe1 (vethB
# 10.77.0.2), then runs every RDMA test, each reported as one TAP line on the
# console prefixed "TAP:" (run.sh strips the prefix), its output in
# $OUT/<name>.log (printed on the console when it fails).
# Servers listen on rxe0's address, clients bind rxe1's address, so the
# traffic crosses the veth wire (the rxe hardware counters prove it).
# Exit status: the number of failed tests (handed to qemu, see runvm.sh).
OUT=$(sed -n 's/.*[[:space:]]moonlet_out=\([^[:space:]]*\).*/\1/p' /proc/cmdline)
. "$OUT/env.sh"
. "$S/scripts/softroce/rxe-setup.sh"
export MOONLET_BUILD_ROOT=$B MOONLET_SOURCE_ROOT=$S PYTHONDONTWRITEBYTECODE=1
up() { cut -d' ' -f1 /proc/uptime; }
counter() { cat "/sys/class/infiniband/$1/ports/1/hw_counters/$2"; }

# ---- the tests: each a function t_<name>; 0 = pass -------------------------
t_rxe_setup() {
    rxe_setup && rdma link && ibv_devices
}

# The transport contract (tests/transport/test_xfer_contract.c), verbs group,
# against rxe0 (server) and rxe1 (client): nothing may be skipped here.
t_xfer_contract_rdma() {
    MOONLET_XFER_CASES=rdma MOONLET_XFER_REQUIRE_RDMA=1 \
    MOONLET_XFER_RDMA_ADDR=$IP_A MOONLET_XFER_RDMA_SRC=$IP_B \
        timeout 900 "$B/tests/transport/test_xfer_contract"
}

# rxe1 (the clients' device) sent and rxe0 (the servers') received packets:
# the contract's traffic crossed the veth wire instead of looping inside rxe0.
t_traffic_crossed_wire() {
    local s1 r0
    s1=$(counter $RXE_B sent_pkts) r0=$(counter $RXE_A rcvd_pkts)
    echo "rxe1 sent_pkts=$s1 rxe0 rcvd_pkts=$r0 (since boot)"
    ip -s link show vethB | sed -n 3,6p
    [ "$s1" -gt 10000 ] && [ "$r0" -gt 10000 ]
}

# Verbs-only checks: QP attributes after connect, accept while other peers
# connect / stall, refusal of an address without an RDMA device.
t_xfer_verbs() {
    MOONLET_RDMA_STALL_ON="modprobe -q -d $RXE_KDIR sch_netem; tc qdisc add dev vethB root netem loss 100%" \
    MOONLET_RDMA_STALL_OFF="tc qdisc del dev vethB root" \
    MOONLET_XFER_RDMA_ADDR=$IP_A MOONLET_XFER_RDMA_SRC=$IP_B \
        timeout 300 "$B/tests/rdma/test_xfer_verbs"
}

# A cluster over RDMA: master, two stores on rxe0, mlc clients bound to rxe1;
# puts/gets 1 KiB-16 MiB, a store killed mid-read and restarted, a link flap.
t_rdma_cluster() {
    MOONLET_RDMA_SERVER_ADDR=$IP_A MOONLET_RDMA_CLIENT_ADDR=$IP_B \
    MOONLET_RDMA_SERVER_DEV=$RXE_A MOONLET_RDMA_CLIENT_DEV=$RXE_B MOONLET_RDMA_CLIENT_NETDEV=vethB \
    MOONLET_RDMA_RESULTS=$OUT/results.jsonl \
        timeout 600 python3 -m pytest -q -s -p no:cacheprovider "$S/tests/rdma/test_rdma_cluster.py"
}

# A mixed cluster: a store serving RDMA and TCP (--protocol both), a TCP-only
# store, an RDMA client on rxe1 and a TCP-only reader (test_rdma_mixed.py).
t_rdma_mixed() {
    MOONLET_RDMA_SERVER_ADDR=$IP_A MOONLET_RDMA_CLIENT_ADDR=$IP_B \
    MOONLET_RDMA_SERVER_DEV=$RXE_A MOONLET_RDMA_CLIENT_DEV=$RXE_B \
    MOONLET_RDMA_RESULTS=$OUT/results.jsonl \
        timeout 300 python3 -m pytest -q -s -p no:cacheprovider "$S/tests/rdma/test_rdma_mixed.py"
}

# The operator's self-test (moonlet-store --check, transport/verbs_check.c) on
# rxe0's address: finds the device, the RoCE v2 GID, and moves data through
# moonlet; exits 0.  On 127.0.0.1 (through the scripts/rdma-check.sh wrapper)
# it refuses: no RDMA device, exit 1.
t_rdma_check() {
    local out rc
    out=$(timeout 120 "$B/tools/moonlet-store" --check --listen "$IP_A:0")
    rc=$?
    echo "$out"
    [ $rc -eq 0 ] &&
    echo "$out" | grep -q "^device:      $RXE_A port 1" &&
    echo "$out" | grep -q "^GID index:   $GID_IDX .*RoCE v2" &&
    echo "$out" | grep -q "^transfer:    RDMA WRITE 1 MiB" &&
    echo "$out" | tail -1 | grep -q "^check: PASS" || return 1
    out=$(timeout 60 bash "$S/scripts/rdma-check.sh" 127.0.0.1 "$B")
    rc=$?
    echo "$out"
    [ $rc -eq 1 ] && echo "$out" | tail -1 | grep -q "^check: FAIL .*no RDMA device"
}

# Device (GPU) memory over RDMA under the fake CUDA driver
# (tests/gpu/test_client_gpu.c, `rdma` mode): the staged path with the
# staging region registered with rxe, and GPUDirect refused by rxe for the
# fake's device memory (a client without checksums), then staged.
t_gpu_rdma() {
    MOONLET_CUDA_DRIVER=$B/tests/gpu/libfakecuda.so FAKECUDA_DEVICES=2 \
    MOONLET_GPU_RDMA_ADDR=$IP_A MOONLET_GPU_RDMA_SRC=$IP_B \
        timeout 300 "$B/tests/gpu/test_client_gpu" rdma
}

# moonlet-bench transfer --protocol rdma beside perftest (tests/rdma/bench.sh)
. "$S/tests/rdma/bench.sh"

ALL="rxe_setup xfer_contract_rdma traffic_crossed_wire xfer_verbs rdma_check bench batch_bench gpu_rdma rdma_mixed rdma_cluster"
# ----------------------------------------------------------------------------

main() {
    local sel=${MOONLET_RDMA_TESTS:-}
    local list="rxe_setup"
    for t in $ALL; do
        [ "$t" = rxe_setup ] && continue
        if [ -z "$sel" ] || [[ " $sel " == *" $t "* ]]; then list="$list $t"; fi
    done
    local n=0 fail=0 t t0 rc
    for t in $list; do n=$((n + 1)); done
    echo "guest: kernel $(uname -r), $(nproc) cpus, uptime $(up)s; tests: $list"
    echo "TAP:1..$n"
    n=0
    for t in $list; do
        n=$((n + 1))
        t0=$(up)
        "t_$t" > "$OUT/$t.log" 2>&1
        rc=$?
        local secs=$(awk -v a="$t0" -v b="$(up)" 'BEGIN{printf "%.1f", b-a}')
        if [ $rc -eq 0 ]; then
            echo "TAP:ok $n - $t (${secs}s)"
        else
            fail=$((fail + 1))
            echo "----- $t failed (rc=$rc), its log:"
            cat "$OUT/$t.log"
            echo "----- end of $t"
            echo "TAP:not ok $n - $t (rc=$rc, ${secs}s)"
            if [ "$t" = rxe_setup ]; then
                dmesg | tail -20
                echo "TAP:Bail out! Soft-RoCE setup failed"
                return 99
            fi
        fi
    done
    echo "guest: done at uptime $(up)s, $fail failed"
    return $fail
}
main
