/*
 * batch.c - `moonlet-bench batch`: the client's batch calls against the wire.
 *
 * Zero-copy batch put and get (moonlet_client_batch_put_from /
 * moonlet_client_batch_get_into from registered buffers) of 1,024 x 4 KiB,
 * 1,024 x 64 KiB and 128 x 1 MiB, the 4 KiB objects again read into
 * scattered destinations (4KiB_scattered: key i lands at slot 7i mod 1,024,
 * so no two reads are adjacent on both sides and none merge), and the
 * multi-buffer form (the copying
 * moonlet_client_batch_put / batch_get with 8 ranges of 8 KiB per key, laid
 * out layer by layer as an engine's per-layer KV tensors are), each beside a
 * plain loopback socket streaming the same bytes in chunks of the same
 * object size (tools/bench/transfer.c's stream), in the same run.
 *
 * Three paths, in rotating order within each round so machine noise hits
 * them alike:
 *   batch     the direct client on a master with the batch methods: one
 *             master call per window of keys (BatchPutStart, BatchPutEnd,
 *             BatchGetReplicaList), the transfers in one transport batch;
 *   per_key   the same client code on a master started with the batch
 *             methods disabled (--disable-method): the client falls back to
 *             one master round trip per key, which is what every batch call
 *             did before the batch methods existed;
 *   dummy     a DummyClient (moonlet_client_create_dummy) through a
 *             RealClient (moonlet-store --serve-dummy) on the batch master,
 *             its buffers from moonlet_client_alloc_shared (zero-copy).
 * Every object goes to one store node per master (preferred segment), with
 * one replica, over TCP on 127.0.0.1; a round's keys are removed after it
 * (untimed), and every get is compared with what was put (a mismatch fails
 * the bench).  Figures are medians over the rounds, in GB/s of object
 * bytes; ratios are of medians.
 *
 * Takes no locks of its own; everything runs on the calling thread.
 */
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "bench.h"
#include "monotime.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "transfer.h"

#define B_MAX_ROUNDS 50
#define B_RANGES 8 /* the multi-buffer workload's ranges per key */

typedef struct b_work {
    const char *name;
    uint64_t size; /* bytes per object */
    size_t keys;
    int ranges;    /* 1: zero-copy batch_put_from / batch_get_into; else batch_put / batch_get */
    bool scatter;  /* gets land out of order (key i at slot i * 7 mod keys): no two reads merge */
} b_work;

static const b_work g_work[] = {
    {"4KiB", 4u << 10, 1024, 1, false},
    {"4KiB_scattered", 4u << 10, 1024, 1, true},
    {"64KiB", 64u << 10, 1024, 1, false},
    {"1MiB", 1u << 20, 128, 1, false},
    {"multi_8x8KiB", 64u << 10, 1024, B_RANGES, false},
};
#define B_NWORK (sizeof(g_work) / sizeof(g_work[0]))

enum { P_BATCH, P_PER_KEY, P_DUMMY, B_NPATHS };
static const char *const g_path[B_NPATHS] = {"batch", "per_key", "dummy"};
static const char *const g_node[B_NPATHS] = {"bench-batch-a", "bench-batch-b", "bench-batch-a"};
enum { OP_PUT, OP_GET, B_NOPS };

typedef struct b_path {
    moonlet_client *c;
    unsigned char *src, *dst; /* max_bytes each: registered, or shared with the RealClient */
    bool shared;
} b_path;

typedef struct b_bench {
    int rounds;
    bool json;
    const char *only; /* one workload's name; NULL: all */
    char lease_ms[16]; /* the masters' read lease (--default_kv_lease_ttl) */
    bool rdma;          /* --protocol rdma: the store nodes and clients over verbs */
    const char *listen_host, *source_addr; /* rdma: the nodes' address, the clients' */
    unsigned scale;     /* --scale: every workload's keys divided by it */
    b_work work[B_NWORK]; /* the workloads, scaled */
    size_t max_bytes;   /* the largest workload's bytes: each path's buffers */
    b_path p[B_NPATHS];
    char **names;
    const char **keys;
    const void **pb;
    void **gb;
    size_t *lens, *got, *iovcnt;
    struct iovec *iov;
    int32_t *res;
    bench_samples s[B_NWORK][B_NPATHS][B_NOPS];
    bench_samples plain[B_NWORK];
} b_bench;

static bool b_selected(const b_bench *b, size_t w)
{
    return !b->only || strcmp(b->only, g_work[w].name) == 0;
}

/* Whether path p runs: over RDMA, the DummyClient path does not (its
 * RealClient would read its own segment through its own device). */
static bool b_path_on(const b_bench *b, int p)
{
    return !(b->rdma && p == P_DUMMY);
}

static int b_parse(int argc, char **argv, b_bench *b)
{
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'}, {"rounds", required_argument, 0, 'r'},
        {"only", required_argument, 0, 'o'}, {"lease-ms", required_argument, 0, 'l'},
        {"protocol", required_argument, 0, 'p'}, {"listen-addr", required_argument, 0, 'L'},
        {"source-addr", required_argument, 0, 'S'}, {"scale", required_argument, 0, 's'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    b->rounds = 7;
    b->scale = 1;
    b->listen_host = "127.0.0.1";
    snprintf(b->lease_ms, sizeof(b->lease_ms), "1000");
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (o == 'j') {
            b->json = true;
        } else if (o == 'o') {
            b->only = optarg;
        } else if (o == 'p') {
            if (strcmp(optarg, "rdma") != 0 && strcmp(optarg, "tcp") != 0)
                goto usage;
            b->rdma = strcmp(optarg, "rdma") == 0;
        } else if (o == 'L') {
            b->listen_host = optarg;
        } else if (o == 'S') {
            b->source_addr = optarg;
        } else if (o == 's') {
            long v;
            if (bench_parse_long(optarg, 1, 64, &v) || (v & (v - 1)))
                goto usage;
            b->scale = (unsigned)v;
        } else if (o == 'l') {
            long v;
            if (bench_parse_long(optarg, 100, 600000, &v))
                goto usage;
            snprintf(b->lease_ms, sizeof(b->lease_ms), "%ld", v);
        } else if (o == 'r') {
            long v;
            if (bench_parse_long(optarg, 1, B_MAX_ROUNDS, &v))
                goto usage;
            b->rounds = (int)v;
        } else {
            goto usage;
        }
    }
    b->max_bytes = 0;
    for (size_t w = 0; w < B_NWORK; w++) {
        b->work[w] = g_work[w];
        b->work[w].keys /= b->scale;
        uint64_t bytes = b->work[w].size * b->work[w].keys;
        b->max_bytes = bytes > b->max_bytes ? (size_t)bytes : b->max_bytes;
    }
    for (size_t w = 0; optind == argc && w < B_NWORK; w++)
        if (b_selected(b, w))
            return 0;
usage:
    fprintf(o == 'h' ? stdout : stderr,
            "usage: moonlet-bench batch [--json] [--rounds N (1..%d, default 7)] [--only WORKLOAD]\n"
            "                           [--lease-ms MS (100..600000, default 1000)]\n"
            "                           [--protocol tcp|rdma] [--listen-addr IP] [--source-addr IP]\n"
            "                           [--scale N (1, 2, 4 .. 64: keys divided by N)]\n"
            "  workloads: 4KiB, 4KiB_scattered, 64KiB, 1MiB, multi_8x8KiB (default: all)\n", B_MAX_ROUNDS);
    return o == 'h' ? 1 : -1;
}

static int b_alloc(b_bench *b)
{
    size_t n = 0;
    for (size_t w = 0; w < B_NWORK; w++)
        n = g_work[w].keys > n ? g_work[w].keys : n;
    b->names = calloc(n, sizeof(*b->names));
    b->keys = calloc(n, sizeof(*b->keys));
    b->pb = calloc(n, sizeof(*b->pb));
    b->gb = calloc(n, sizeof(*b->gb));
    b->lens = calloc(n, sizeof(*b->lens));
    b->got = calloc(n, sizeof(*b->got));
    b->iovcnt = calloc(n, sizeof(*b->iovcnt));
    b->iov = calloc(n * B_RANGES, sizeof(*b->iov));
    b->res = calloc(n, sizeof(*b->res));
    if (!b->names || !b->keys || !b->pb || !b->gb || !b->lens || !b->got || !b->iovcnt ||
        !b->iov || !b->res)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!(b->names[i] = malloc(64)))
            return -1;
    return 0;
}

/* Path p's buffers: shared memory of the RealClient, or registered memory. */
static int b_buffers(b_path *p, bool shared, size_t max_bytes)
{
    p->shared = shared;
    if (shared) {
        void *s, *d;
        if (moonlet_client_alloc_shared(p->c, max_bytes, &s) ||
            moonlet_client_alloc_shared(p->c, max_bytes, &d))
            return -1;
        p->src = s;
        p->dst = d;
    } else {
        p->src = malloc(max_bytes);
        p->dst = malloc(max_bytes);
        if (!p->src || !p->dst || moonlet_client_register_buffer(p->c, p->src, max_bytes) ||
            moonlet_client_register_buffer(p->c, p->dst, max_bytes))
            return -1;
    }
    for (size_t i = 0; i < max_bytes; i++)
        p->src[i] = (unsigned char)(i * 2654435761u >> 13);
    return 0;
}

/* Range r of key i of a multi-buffer workload: layer-major, as per-layer
 * KV tensors hold each block's layer r at layer r's region. */
static size_t b_range_off(const b_work *w, size_t i, int r)
{
    uint64_t chunk = w->size / (uint64_t)w->ranges;
    return (size_t)(((uint64_t)r * w->keys + i) * chunk);
}

/* The call's arrays for workload w on path p, keys named by round. */
static void b_prepare(b_bench *b, const b_work *w, int p, int round, bool get)
{
    uint64_t chunk = w->size / (uint64_t)w->ranges;
    for (size_t i = 0; i < w->keys; i++) {
        snprintf(b->names[i], 64, "bench/%s/%s/%d/%zu", w->name, g_path[p], round, i);
        b->keys[i] = b->names[i];
        b->pb[i] = b->p[p].src + i * w->size;
        b->gb[i] = b->p[p].dst + (w->scatter ? i * 7 % w->keys : i) * w->size;
        b->lens[i] = w->size;
        b->iovcnt[i] = (size_t)w->ranges;
        for (int r = 0; r < w->ranges; r++)
            b->iov[i * w->ranges + r] =
                (struct iovec){(get ? b->p[p].dst : b->p[p].src) + b_range_off(w, i, r), chunk};
    }
}

/* One put and one get of workload w on path p; GB/s of each into out[]. */
static int b_measure(b_bench *b, const b_work *w, int p, int round, double out[B_NOPS])
{
    moonlet_client *c = b->p[p].c;
    const char *pref[] = {g_node[p]};
    moonlet_put_options opt = {.replica_num = 1, .preferred_segments = pref,
                               .preferred_segments_count = 1};
    double bytes = (double)w->size * (double)w->keys;
    b_prepare(b, w, p, round, false);
    memset(b->p[p].dst, 0, (size_t)(w->size * w->keys));
    double t0 = moonlet_mono_s();
    int rc = w->ranges == 1
                 ? moonlet_client_batch_put_from(c, b->keys, w->keys, b->pb, b->lens, &opt, b->res)
                 : moonlet_client_batch_put(c, b->keys, w->keys, b->iov, b->iovcnt, &opt, b->res);
    double t1 = moonlet_mono_s();
    if (rc) {
        fprintf(stderr, "batch bench: %s put on %s: %s\n", w->name, g_path[p], moonlet_strerror(rc));
        return -1;
    }
    b_prepare(b, w, p, round, true);
    double t2 = moonlet_mono_s();
    rc = w->ranges == 1
             ? moonlet_client_batch_get_into(c, b->keys, w->keys, b->gb, b->lens, NULL, b->got,
                                             b->res)
             : moonlet_client_batch_get(c, b->keys, w->keys, b->iov, b->iovcnt, NULL, b->got,
                                        b->res);
    double t3 = moonlet_mono_s();
    if (rc) {
        fprintf(stderr, "batch bench: %s get on %s: %s\n", w->name, g_path[p], moonlet_strerror(rc));
        return -1;
    }
    for (size_t i = 0; i < w->keys; i++) {
        if (memcmp(b->pb[i], b->gb[i], (size_t)w->size) != 0) {
            fprintf(stderr, "batch bench: %s on %s: the bytes read differ from those put\n",
                    w->name, g_path[p]);
            return -1;
        }
    }
    uint64_t removed; /* untimed: room for the next round */
    if (moonlet_client_remove_all_force(c, NULL, &removed) || removed != w->keys) {
        fprintf(stderr, "batch bench: %s on %s: the round's keys were not all removed\n", w->name,
                g_path[p]);
        return -1;
    }
    out[OP_PUT] = bytes / (t1 - t0) / 1e9;
    out[OP_GET] = bytes / (t3 - t2) / 1e9;
    return 0;
}

static double b_median(bench_samples *s)
{
    return bench_percentile(s, 50);
}

static void b_report(b_bench *b)
{
    double med[B_NWORK][B_NPATHS][B_NOPS], plain[B_NWORK];
    for (size_t w = 0; w < B_NWORK; w++) {
        if (!b_selected(b, w))
            continue;
        plain[w] = b->rdma ? 0 : b_median(&b->plain[w]);
        for (int p = 0; p < B_NPATHS; p++)
            for (int o = 0; o < B_NOPS; o++)
                med[w][p][o] = b_path_on(b, p) ? b_median(&b->s[w][p][o]) : 0;
    }
    if (!b->json && b->rdma) { /* no socket beside it: perftest is the baseline (bench.sh) */
        printf("%-15s | %-21s | %-21s\n", "workload", "batch put/get", "per_key put/get");
        for (size_t w = 0; w < B_NWORK; w++)
            if (b_selected(b, w))
                printf("%-15s | %9.3f %9.3f   | %9.3f %9.3f\n", g_work[w].name,
                       med[w][P_BATCH][OP_PUT], med[w][P_BATCH][OP_GET],
                       med[w][P_PER_KEY][OP_PUT], med[w][P_PER_KEY][OP_GET]);
        printf("GB/s of object bytes over RDMA, medians of %d rounds\n", b->rounds);
        return;
    }
    if (!b->json) {
        printf("%-15s %8s | %-21s | %-21s | %-21s | %s\n", "workload", "plain", "batch put/get",
               "per_key put/get", "dummy put/get", "get/plain put/plain dummy/batch(get,put)");
        for (size_t w = 0; w < B_NWORK; w++)
            if (b_selected(b, w))
                printf("%-15s %8.2f | %9.2f %9.2f   | %9.2f %9.2f   | %9.2f %9.2f   | %.2f %.2f "
                       "%.2f %.2f\n", g_work[w].name, plain[w], med[w][P_BATCH][OP_PUT],
                       med[w][P_BATCH][OP_GET], med[w][P_PER_KEY][OP_PUT],
                       med[w][P_PER_KEY][OP_GET], med[w][P_DUMMY][OP_PUT],
                       med[w][P_DUMMY][OP_GET], med[w][P_BATCH][OP_GET] / plain[w],
                       med[w][P_BATCH][OP_PUT] / plain[w],
                       med[w][P_DUMMY][OP_GET] / med[w][P_BATCH][OP_GET],
                       med[w][P_DUMMY][OP_PUT] / med[w][P_BATCH][OP_PUT]);
        printf("GB/s of object bytes, medians of %d rounds\n", b->rounds);
        return;
    }
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "workloads");
    cJSON_AddStringToObject(root, "bench", "batch");
    cJSON_AddStringToObject(root, "protocol", b->rdma ? "rdma" : "tcp");
    cJSON_AddNumberToObject(root, "rounds", b->rounds);
    cJSON_AddNumberToObject(root, "scale", b->scale);
    for (size_t w = 0; w < B_NWORK; w++) {
        if (!b_selected(b, w))
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "workload", g_work[w].name);
        cJSON_AddNumberToObject(o, "object_bytes", (double)b->work[w].size);
        cJSON_AddNumberToObject(o, "keys", (double)b->work[w].keys);
        cJSON_AddNumberToObject(o, "ranges_per_key", b->work[w].ranges);
        if (!b->rdma)
            cJSON_AddNumberToObject(o, "plain_socket_gbps", plain[w]);
        for (int p = 0; p < B_NPATHS; p++) {
            if (!b_path_on(b, p))
                continue;
            cJSON *po = cJSON_AddObjectToObject(o, g_path[p]);
            cJSON_AddNumberToObject(po, "put_gbps", med[w][p][OP_PUT]);
            cJSON_AddNumberToObject(po, "get_gbps", med[w][p][OP_GET]);
            if (!b->rdma) {
                cJSON_AddNumberToObject(po, "put_over_plain", med[w][p][OP_PUT] / plain[w]);
                cJSON_AddNumberToObject(po, "get_over_plain", med[w][p][OP_GET] / plain[w]);
            }
            cJSON_AddNumberToObject(po, "get_us_per_key",
                                    (double)b->work[w].size / med[w][p][OP_GET] / 1e3);
        }
        cJSON *r = cJSON_AddObjectToObject(o, "ratios");
        if (b_path_on(b, P_DUMMY)) {
            cJSON_AddNumberToObject(r, "dummy_over_batch_get", med[w][P_DUMMY][OP_GET] /
                                                                    med[w][P_BATCH][OP_GET]);
            cJSON_AddNumberToObject(r, "dummy_over_batch_put", med[w][P_DUMMY][OP_PUT] /
                                                                    med[w][P_BATCH][OP_PUT]);
        }
        cJSON_AddNumberToObject(r, "batch_over_per_key_get", med[w][P_BATCH][OP_GET] /
                                                                  med[w][P_PER_KEY][OP_GET]);
        cJSON_AddNumberToObject(r, "batch_over_per_key_put", med[w][P_BATCH][OP_PUT] /
                                                                  med[w][P_PER_KEY][OP_PUT]);
        cJSON_AddItemToArray(arr, o);
    }
    bench_print_json(root); /* and frees it */
}

/* Each path's buffers, while its client is still there. */
static void b_release_buffers(b_bench *b)
{
    for (int p = 0; p < B_NPATHS; p++) {
        b_path *bp = &b->p[p];
        unsigned char *buf[2] = {bp->src, bp->dst};
        for (int k = 0; k < 2; k++) {
            if (!buf[k])
                continue;
            if (bp->shared) {
                moonlet_client_free_shared(bp->c, buf[k]);
            } else {
                moonlet_client_unregister_buffer(bp->c, buf[k]); /* refused if never registered */
                free(buf[k]);
            }
        }
        bp->src = bp->dst = NULL;
    }
}

static void b_free(b_bench *b)
{
    for (size_t w = 0; w < B_NWORK; w++) {
        bench_samples_free(&b->plain[w]);
        for (int p = 0; p < B_NPATHS; p++)
            for (int o = 0; o < B_NOPS; o++)
                bench_samples_free(&b->s[w][p][o]);
    }
    size_t n = 0;
    for (size_t w = 0; w < B_NWORK; w++)
        n = g_work[w].keys > n ? g_work[w].keys : n;
    for (size_t i = 0; b->names && i < n; i++)
        free(b->names[i]);
    free(b->names);
    free(b->keys);
    free(b->pb);
    free(b->gb);
    free(b->lens);
    free(b->got);
    free(b->iovcnt);
    free(b->iov);
    free(b->res);
}

static moonlet_client *b_client(const b_bench *b, const char *master)
{
    moonlet_client_config cfg = bench_client_config(master);
    if (b->rdma)
        cfg.protocol = MOONLET_PROTOCOL_RDMA;
    cfg.source_addr = b->rdma ? b->source_addr : NULL;
    moonlet_client *c = NULL;
    return moonlet_client_create(&cfg, &c) ? NULL : c;
}

int bench_batch_main(int argc, char **argv)
{
    b_bench b = {0};
    int prc = b_parse(argc, argv, &b);
    if (prc)
        return prc < 0 ? 2 : 0;
    signal(SIGPIPE, SIG_IGN);
    int rc = 1;
    const char *step = "allocate";
    bench_master ma = {0}, mb = {0}, sb = {0}, real = {0};
    char dir[] = "/tmp/moonlet-bench-XXXXXX", sock[sizeof(dir) + 16];
    bool have_dir = mkdtemp(dir) != NULL;
    snprintf(sock, sizeof(sock), "%s/real.sock", dir);
    unsigned char *plain_dst = malloc(1u << 20);
    if (!have_dir || !plain_dst || b_alloc(&b))
        goto out;
    step = "start the masters";
    /* A round's keys are removed (forced) right after its reads, whose
     * leases keep their ranges quarantined until they expire: a short lease
     * (1 s by default, ten times the slowest read of a release build) gives
     * the space back between rounds; a slower build (sanitizers) needs a
     * longer one, and fewer rounds. */
    const char *const new_master[] = {"--default_kv_lease_ttl", b.lease_ms, NULL};
    const char *const old_master[] = {
        "--default_kv_lease_ttl", b.lease_ms, "--disable-method",
        "BatchPutStart,BatchPutEnd,BatchPutRevoke,BatchGetReplicaList", NULL};
    if (bench_master_start(&ma, new_master) || bench_master_start(&mb, old_master))
        goto out;
    step = "start the store nodes";
    /* the batch master's node is also the RealClient the DummyClient uses
     * (over TCP); its segment holds a round of two paths and what the
     * round before left quarantined under its leases */
    char listen[300], seg_a[32], seg_b[32];
    snprintf(listen, sizeof(listen), "%s:0", b.listen_host);
    snprintf(seg_a, sizeof(seg_a), "%zu", 16 * b.max_bytes);
    snprintf(seg_b, sizeof(seg_b), "%zu", (b.rdma ? 16 : 8) * b.max_bytes);
    const char *proto = b.rdma ? "rdma" : "tcp";
    const char *real_args[] = {"--master", ma.addr, "--segment-size", seg_a, "--protocol", proto,
                               "--listen", listen, "--client-id", g_node[P_BATCH],
                               "--log-level", "warn", b.rdma ? NULL : "--serve-dummy", sock, NULL};
    const char *b_args[] = {"--master", mb.addr, "--segment-size", seg_b, "--protocol", proto,
                            "--listen", listen, "--client-id", g_node[P_PER_KEY],
                            "--log-level", "warn", NULL};
    if (bench_child_start(&real, "moonlet-store", real_args,
                          b.rdma ? "listening on " : "serving dummy clients on ") ||
        bench_child_start(&sb, "moonlet-store", b_args, "listening on "))
        goto out;
    step = "connect the clients";
    b.p[P_BATCH].c = b_client(&b, ma.addr);
    b.p[P_PER_KEY].c = b_client(&b, mb.addr);
    if (!b.p[P_BATCH].c || !b.p[P_PER_KEY].c ||
        (b_path_on(&b, P_DUMMY) && moonlet_client_create_dummy(sock, NULL, &b.p[P_DUMMY].c)))
        goto out;
    step = "buffers";
    for (int p = 0; p < B_NPATHS; p++)
        if (b_path_on(&b, p) && b_buffers(&b.p[p], p == P_DUMMY, b.max_bytes))
            goto out;
    step = "measure";
    for (int round = -1; round < b.rounds; round++) { /* round -1 warms up */
        for (size_t w = 0; w < B_NWORK; w++) {
            if (!b_selected(&b, w))
                continue;
            for (int k = 0; k < B_NPATHS; k++) {
                int p = (int)((round + 1 + k + (int)w) % B_NPATHS);
                double g[B_NOPS];
                if (!b_path_on(&b, p))
                    continue;
                if (b_measure(&b, &b.work[w], p, round, g))
                    goto out;
                for (int o = 0; round >= 0 && o < B_NOPS; o++)
                    bench_samples_add(&b.s[w][p][o], g[o]);
            }
            if (b.rdma)
                continue; /* perftest is the baseline there */
            double pg = moonlet_bench_plain_gbps(b.p[P_BATCH].src, plain_dst, b.work[w].size,
                                                 b.work[w].size * b.work[w].keys);
            if (pg <= 0)
                goto out;
            if (round >= 0)
                bench_samples_add(&b.plain[w], pg);
        }
    }
    b_report(&b);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "moonlet-bench batch: failed at: %s\n", step);
    b_release_buffers(&b);
    for (int p = 0; p < B_NPATHS; p++)
        if (b.p[p].c)
            moonlet_client_destroy(b.p[p].c);
    b_free(&b);
    free(plain_dst);
    bench_master_stop(&real);
    bench_master_stop(&sb);
    bench_master_stop(&mb);
    bench_master_stop(&ma);
    if (have_dir) {
        unlink(sock);
        rmdir(dir);
    }
    return rc;
}
