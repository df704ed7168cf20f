/*
 * verbs_check.h - the operator's self-test of one host's RDMA NIC
 * (`moonlet-store --check`; docs/deployment.md).  Owns nothing after it
 * returns; takes no lock of its own (the transport instances it creates take
 * theirs).
 */
#ifndef MOONLET_VERBS_CHECK_H
#define MOONLET_VERBS_CHECK_H

#include <stdio.h>

/*
 * Reports, one "name: value" line each on `out`, what RDMA on address `ip`
 * (the address the store serves on, without a port) depends on: the device
 * and port the address is on, port state, link layer, active MTU (and the
 * netdev's), the GID table entries of the address with their type (RoCE v2
 * is what rdma_cm uses) and every other valid entry, the NIC's NUMA node,
 * RLIMIT_MEMLOCK and huge pages.  Then moves data through moonlet's own
 * transport on that address: a server and a client instance on the NIC, an
 * RDMA WRITE of 1 MiB, an RDMA READ of it back (bytes compared) and a 4 KiB
 * READ.  `device` (may be NULL) must then be the address's device.  The last
 * line is "check: PASS (...)" or "check: FAIL <reason>".  Returns 0 (pass)
 * or 1.
 */
int moonlet_verbs_check(const char *ip, const char *device, FILE *out);

#endif
