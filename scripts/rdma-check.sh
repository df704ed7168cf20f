#!/usr/bin/env bash
# rdma-check.sh - an operator's self-test of one host's RDMA NIC for moonlet:
# a thin wrapper around `moonlet-store --check` (transport/verbs_check.c;
# docs/deployment.md).
#
#   scripts/rdma-check.sh IP [BUILD_DIR]
#
# IP is the address the store will serve on (--listen IP:PORT).  Reports the
# RDMA device that address is on, port state, link layer, active MTU, the GID
# table (RoCE v2 is what rdma_cm uses), NUMA node, RLIMIT_MEMLOCK and huge
# pages, then one RDMA WRITE and READ through moonlet's own transport on that
# address.  The last line is "check: PASS ..." or "check: FAIL <reason>";
# exit status 0 / 1.  Changes nothing on the host.
set -u
IP=${1:?usage: rdma-check.sh IP [BUILD_DIR]}
B=${2:-$(dirname "$(readlink -f "$0")")/../build}
store=$B/tools/moonlet-store
command -v moonlet-store >/dev/null 2>&1 && [ ! -x "$store" ] && store=moonlet-store
case "$IP" in *:*) listen="[$IP]:0" ;; *) listen="$IP:0" ;; esac
exec "$store" --check --listen "$listen"
