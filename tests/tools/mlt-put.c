/*
 * mlt-put - a test helper (built, not installed) that drives a running
 * moonlet-master through MasterClient from its command line, so Python tests
 * can set up exactly the state they then inspect.
 *
 *   mlt-put HOST:PORT OP ARGS... [OP ARGS...]
 *
 *   mount CLIENT SEGMENT SIZE ENDPOINT   mount a segment (protocol tcp; bookkeeping only)
 *   put TENANT KEY SIZE REPLICAS         PutStart + PutEnd
 *   pending TENANT KEY SIZE              PutStart only: a put in progress
 *   hput TENANT KEY SIZE REPLICAS        put, hard-pinned
 *   get TENANT KEY                       GetReplicaList, which grants a read lease
 *   exist TENANT KEY                     BatchExistKey on one key (leases a hit)
 *   fill TENANT PREFIX N SIZE            N one-replica keys PREFIX0000000.., pipelined
 *   cput TENANT KEY SIZE REPLICAS        a real put through the public client: the
 *                                        bytes go to the store nodes over the transport
 *   cget TENANT KEY                      a real get through the public client (checks
 *                                        the bytes cput wrote)
 *
 * Operations run in order; the first failure prints one line and exits 1.
 * Each operation prints one line saying what it did.  `fill` keeps a window
 * of requests in flight on a raw RPC connection (tools/bench/pipeline.c, as
 * moonlet-bench rpc does), which puts a million keys in a few seconds.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "master_client.h"
#include "moonlet/client.h"
#include "methods.h"
#include "net.h"
#include "pipeline.h"
#include "moonlet/error.h"
#include "rpc_client.h"
#include "wire.h"

static const char *g_addr;

static int fail(const char *what, int rc)
{
    fprintf(stderr, "mlt-put: %s: %s (%d)\n", what, moonlet_strerror(rc), rc);
    return 1;
}

static uint64_t num(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end) {
        fprintf(stderr, "mlt-put: not a number: '%s'\n", s);
        exit(2);
    }
    return v;
}

/* Key i of a fill: the prefix (ctx), then i in 7 digits. */
static void fill_key(void *ctx, uint64_t i, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%07" PRIu64, (const char *)ctx, i);
}

static int fill(const char *tenant, const char *prefix, uint64_t n, uint64_t size)
{
    char host[256];
    uint16_t port;
    if (moonlet_net_split_hostport(g_addr, host, sizeof(host), &port))
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_rpc_client *c;
    moonlet_rpc_client_opts o = {.timeout_ms = 60000};
    int rc = moonlet_rpc_client_connect(host, port, &o, &c);
    if (rc)
        return rc;
    /* PutStart then PutEnd per chunk, so a chunk's puts are never left pending long */
    const uint64_t chunk = 65536;
    for (uint64_t from = 0; !rc && from < n; from += chunk) {
        uint64_t to = from + chunk < n ? from + chunk : n;
        rc = bench_fill_range(c, tenant, size, from, to, fill_key, (void *)prefix);
    }
    moonlet_rpc_client_close(c);
    return rc;
}

/* The bytes cput writes for a key of a given size: a function of both. */
static void fill_pattern(unsigned char *buf, size_t len, const char *key)
{
    uint32_t h = 2166136261u;
    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    for (size_t i = 0; i < len; i++)
        buf[i] = (unsigned char)(h + i * 131u);
}

/* cput / cget through the public client; returns 0 or an error code. */
static int client_op(const char *op, char **a)
{
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg, sizeof cfg);
    cfg.master_addr = g_addr;
    cfg.protocol = MOONLET_PROTOCOL_TCP;
    moonlet_client *c;
    int rc = moonlet_client_create(&cfg, &c);
    if (rc)
        return rc;
    if (!strcmp(op, "cput")) {
        size_t len = num(a[2]);
        unsigned char *buf = malloc(len ? len : 1);
        fill_pattern(buf, len, a[1]);
        moonlet_put_options o = {.replica_num = (uint32_t)num(a[3]), .tenant = a[0]};
        rc = moonlet_client_put(c, a[1], buf, len, &o);
        free(buf);
        if (!rc)
            printf("cput %s: %zu bytes\n", a[1], len);
    } else {
        void *buf = NULL;
        size_t len = 0;
        rc = moonlet_client_get_alloc(c, a[1], a[0], &buf, &len);
        if (!rc) {
            unsigned char *want = malloc(len ? len : 1);
            fill_pattern(want, len, a[1]);
            rc = memcmp(want, buf, len) ? MOONLET_ERR_INVALID_READ : MOONLET_OK;
            free(want);
            if (!rc)
                printf("cget %s: %zu bytes, content verified\n", a[1], len);
        }
        moonlet_free(buf);
    }
    moonlet_client_destroy(c);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: mlt-put HOST:PORT OP ARGS... (see the comment in mlt-put.c)\n");
        return 2;
    }
    g_addr = argv[1];
    moonlet_master_client *mc;
    int rc = moonlet_mc_create(g_addr, NULL, &mc);
    if (rc)
        return fail("connect", rc);
    int i = 2, ex = 0;
    while (i < argc && !ex) {
        const char *op = argv[i];
        int need = !strcmp(op, "mount") || !strcmp(op, "put") || !strcmp(op, "fill") ||
                           !strcmp(op, "cput") || !strcmp(op, "hput")
                       ? 4
                   : !strcmp(op, "pending") ? 3
                   : !strcmp(op, "get") || !strcmp(op, "exist") || !strcmp(op, "cget") ? 2
                                                                                       : -1;
        if (need < 0 || i + need >= argc) {
            fprintf(stderr, "mlt-put: bad operation or missing arguments at '%s'\n", op);
            ex = 2;
            break;
        }
        char **a = &argv[i + 1];
        moonlet_replica_list l;
        if (!strcmp(op, "mount")) {
            moonlet_segment_desc d = {.client_id = a[0], .segment_id = a[1], .name = a[1],
                                      .size = num(a[2]), .endpoint = a[3], .protocol = "tcp"};
            rc = moonlet_mc_mount_segment(mc, &d);
            ex = rc ? fail("MountSegment", rc) : (printf("mounted %s\n", a[1]), 0);
        } else if (!strcmp(op, "put") || !strcmp(op, "pending") || !strcmp(op, "hput")) {
            bool whole = strcmp(op, "pending") != 0;
            uint32_t nrep = whole ? (uint32_t)num(a[3]) : 1;
            moonlet_mc_put_extra x = {.hard_pin = !strcmp(op, "hput")};
            rc = moonlet_mc_put_start_ex(mc, a[0], a[1], num(a[2]), nrep, false, &x, &l);
            if (!rc) {
                moonlet_replica_list_free(&l);
                if (whole)
                    rc = moonlet_mc_put_end(mc, a[0], a[1]);
            }
            ex = rc ? fail(op, rc) : (printf("%s %s\n", op, a[1]), 0);
        } else if (!strcmp(op, "get")) {
            rc = moonlet_mc_get_replica_list(mc, a[0], a[1], &l);
            if (!rc) {
                printf("got %s: %u replicas, lease %" PRIu64 " ms\n", a[1], l.count,
                       l.lease_ttl_ms);
                moonlet_replica_list_free(&l);
            }
            ex = rc ? fail("GetReplicaList", rc) : 0;
        } else if (!strcmp(op, "exist")) {
            int32_t r = 0;
            const char *keys[] = {a[1]};
            rc = moonlet_mc_batch_exist_key(mc, a[0], keys, 1, &r);
            ex = rc ? fail("BatchExistKey", rc) : (printf("exist %s: %d\n", a[1], r), 0);
        } else if (!strcmp(op, "cput") || !strcmp(op, "cget")) {
            rc = client_op(op, a);
            ex = rc ? fail(op, rc) : 0;
        } else {
            rc = fill(a[0], a[1], num(a[2]), num(a[3]));
            ex = rc ? fail("fill", rc) : (printf("filled %s keys\n", a[2]), 0);
        }
        i += need + 1;
    }
    fflush(stdout);
    moonlet_mc_destroy(mc);
    return ex;
}
