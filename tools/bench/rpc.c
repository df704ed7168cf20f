/*
 * rpc.c - `moonlet-bench rpc`: control-plane latency and master memory.
 *
 * Starts its own moonlet-master, mounts one (bookkeeping-only) segment and
 * measures, in one run:
 *   - p50/p99 of an empty request (Echo);
 *   - p50/p99 of BatchExistKey on 640 existing keys against a master holding
 *     --small objects and one holding --objects objects, and the ratio of the
 *     two p50s.  Two masters run side by side and the calls alternate between
 *     them, so a noisy neighbour slows both alike;
 *   - the master's RSS growth per stored object (64-byte keys), and that
 *     figure minus the key itself.
 * The table is filled with pipelined PutStart/PutEnd requests.
 *
 * --tls measures instead what TLS costs the control plane: two masters of
 * --small objects side by side, one plaintext and one with mutual TLS
 * (--tls-cert/--tls-key/--tls-ca; throwaway certificates made in a temp
 * dir), the calls alternating between them: Echo, BatchExistKey(640), and
 * a new connection (connect, handshake and one Echo: what a client pays
 * per connection).  p50/p99 of each and the TLS/plain ratio of the p50s.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "pipeline.h"
#include "master_client.h"
#include "methods.h"
#include "moonlet/error.h"
#include "rpc_client.h"
#include "tls.h"
#include "tls_certs.h"
#include "wire.h"
#include <unistd.h>

#define KEY_BYTES 64

static void key_of(uint64_t i, char out[KEY_BYTES + 1])
{
    snprintf(out, KEY_BYTES + 1, "bench-key-%054" PRIu64, i);
}

static void bench_key(void *ctx, uint64_t i, char *buf, size_t cap)
{
    (void)ctx;
    (void)cap;
    key_of(i, buf);
}

/* PutStart + PutEnd of keys [from, to), 1 byte each. */
static int fill(moonlet_rpc_client *c, uint64_t from, uint64_t to)
{
    int rc = bench_fill_range(c, "", 1, from, to, bench_key, NULL);
    if (rc)
        fprintf(stderr, "moonlet-bench: fill failed: %s\n", moonlet_strerror(rc));
    return rc;
}

/* One BatchExistKey of 640 random existing keys; adds its latency to s. */
static int exist_once(moonlet_master_client *mc, uint64_t nobjects, unsigned *seed,
                      bench_samples *s)
{
    static char names[640][KEY_BYTES + 1];
    const char *keys[640];
    int32_t r[640];
    for (int i = 0; i < 640; i++) {
        key_of((uint64_t)rand_r(seed) % nobjects, names[i]);
        keys[i] = names[i];
    }
    uint64_t t0 = bench_now_ns();
    int rc = moonlet_mc_batch_exist_key(mc, "", keys, 640, r);
    bench_samples_add(s, (double)(bench_now_ns() - t0) / 1000.0);
    if (rc)
        return rc;
    for (int i = 0; i < 640; i++)
        if (r[i] != 1)
            return MOONLET_ERR_OBJECT_NOT_FOUND;
    return MOONLET_OK;
}

/* One of the two masters a run compares side by side: the master, its
 * connections, and the latencies measured against it (us). */
typedef struct side {
    bench_master m;
    moonlet_master_client *mc;
    moonlet_rpc_client *c;
    bench_samples echo, exist, connect;
} side;

/* A master of its own for s, with a segment mounted and s's connections. */
static int side_start(side *s, const char *const *args, moonlet_tls_ctx *tls, uint64_t objects)
{
    if (bench_master_start(&s->m, args)) {
        fprintf(stderr, "moonlet-bench: cannot start moonlet-master\n");
        return -1;
    }
    moonlet_segment_desc seg = {.client_id = "bench", .segment_id = "bench-seg", .name = "bench",
                                .size = (objects * 64) * 2 + (1u << 20),
                                .endpoint = "127.0.0.1:1", .protocol = "tcp"};
    moonlet_master_client_opts mo = {.tls = tls};
    moonlet_rpc_client_opts ro = {.tls = tls};
    if (moonlet_mc_create(s->m.addr, &mo, &s->mc) ||
        moonlet_rpc_client_connect("127.0.0.1", s->m.port, &ro, &s->c) ||
        moonlet_mc_mount_segment(s->mc, &seg))
        return -1;
    return 0;
}

/* Closes s's connections, stops its master (if started) and frees its samples. */
static void side_stop(side *s)
{
    moonlet_rpc_client_close(s->c);
    moonlet_mc_destroy(s->mc);
    bench_master_stop(&s->m);
    bench_samples_free(&s->echo);
    bench_samples_free(&s->exist);
    bench_samples_free(&s->connect);
}

/* One Echo on c; its latency (us) into s. */
static int echo_once(moonlet_rpc_client *c, bench_samples *s)
{
    uint64_t t0 = bench_now_ns();
    moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 0);
    int rc = moonlet_rpc_client_call_code(c);
    bench_samples_add(s, (double)(bench_now_ns() - t0) / 1000.0);
    return rc;
}

/* A new connection and one Echo on it, then closed; latency (us) into s. */
static int connect_once(uint16_t port, moonlet_tls_ctx *tls, bench_samples *s)
{
    uint64_t t0 = bench_now_ns();
    moonlet_rpc_client_opts ro = {.tls = tls};
    moonlet_rpc_client *c = NULL;
    int rc = moonlet_rpc_client_connect("127.0.0.1", port, &ro, &c);
    if (!rc) {
        moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 0);
        rc = moonlet_rpc_client_call_code(c);
    }
    moonlet_rpc_client_close(c);
    bench_samples_add(s, (double)(bench_now_ns() - t0) / 1000.0);
    return rc;
}

static void add_pair(cJSON *root, const char *name, bench_samples *plain, bench_samples *tls)
{
    char n[96];
    snprintf(n, sizeof(n), "%s_plain", name);
    bench_json_latency(root, n, plain);
    snprintf(n, sizeof(n), "%s_tls", name);
    bench_json_latency(root, n, tls);
    snprintf(n, sizeof(n), "%s_p50_ratio_tls_over_plain", name);
    cJSON_AddNumberToObject(root, n, bench_percentile(tls, 50) / bench_percentile(plain, 50));
}

/* --tls: plaintext and mutual-TLS masters side by side. */
static int rpc_tls_main(uint64_t small, int calls, int json)
{
    char dir[] = "/tmp/moonlet-bench-tls-XXXXXX";
    char ca[96], cert[96], key[96], ccert[96], ckey[96], cakey[96];
    if (!mkdtemp(dir))
        return 1;
    snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
    snprintf(cakey, sizeof(cakey), "%s/ca.key", dir);
    snprintf(cert, sizeof(cert), "%s/server.pem", dir);
    snprintf(key, sizeof(key), "%s/server.key", dir);
    snprintf(ccert, sizeof(ccert), "%s/client.pem", dir);
    snprintf(ckey, sizeof(ckey), "%s/client.key", dir);
    side p = {0}, t = {0}; /* plaintext, TLS */
    moonlet_tls_ctx *cx = NULL;
    int rc = 1;
    const char *tls_args[] = {"--rpc-address", "127.0.0.1", "--tls-cert", cert, "--tls-key", key,
                              "--tls-ca", ca, NULL};
    moonlet_tls_files cf = {.cert = ccert, .key = ckey, .ca = ca};
    if (tls_certs_ca(dir, "ca", "moonlet bench CA") ||
        tls_certs_issue(dir, "ca", "server", "bench-master", "IP:127.0.0.1") ||
        tls_certs_issue(dir, "ca", "client", "bench-client", NULL) ||
        moonlet_tls_ctx_create(false, &cf, &cx)) {
        fprintf(stderr, "moonlet-bench rpc: cannot make the TLS certificates\n");
        goto out;
    }
    if (side_start(&p, NULL, NULL, small) || side_start(&t, tls_args, cx, small) ||
        fill(p.c, 0, small) || fill(t.c, 0, small))
        goto out;
    unsigned seed_p = 1, seed_t = 1;
    for (int i = 0; i < calls * 2; i++) /* alternating, so drift hits both alike */
        if (echo_once(p.c, &p.echo) || echo_once(t.c, &t.echo))
            goto out;
    for (int i = 0; i < calls; i++)
        if (exist_once(p.mc, small, &seed_p, &p.exist) ||
            exist_once(t.mc, small, &seed_t, &t.exist))
            goto out;
    for (int i = 0; i < calls / 4 + 10; i++)
        if (connect_once(p.m.port, NULL, &p.connect) || connect_once(t.m.port, cx, &t.connect))
            goto out;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "tls", "TLS 1.3, mutual, EC P-256 certificates (OpenSSL)");
    cJSON_AddNumberToObject(root, "objects", (double)small);
    add_pair(root, "echo", &p.echo, &t.echo);
    add_pair(root, "batch_exist_640", &p.exist, &t.exist);
    add_pair(root, "connect_and_echo", &p.connect, &t.connect);
    if (json) {
        bench_print_json(root);
    } else {
        printf("p50 plain / TLS: echo %.1f / %.1f us; BatchExistKey(640) %.1f / %.1f us; "
               "connect+echo %.1f / %.1f us\n",
               bench_percentile(&p.echo, 50), bench_percentile(&t.echo, 50),
               bench_percentile(&p.exist, 50), bench_percentile(&t.exist, 50),
               bench_percentile(&p.connect, 50), bench_percentile(&t.connect, 50));
        cJSON_Delete(root);
    }
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "moonlet-bench rpc --tls: failed\n");
    side_stop(&p);
    side_stop(&t);
    moonlet_tls_ctx_unref(cx);
    const char *const files[] = {ca, cakey, cert, key, ccert, ckey};
    for (int i = 0; i < 6; i++)
        unlink(files[i]);
    rmdir(dir);
    return rc;
}

int bench_rpc_main(int argc, char **argv)
{
    uint64_t objects = 1000000, small = 10000;
    int calls = 1000, json = 0, tls = 0;
    static const struct option opts[] = {
        {"objects", required_argument, 0, 'n'}, {"small", required_argument, 0, 's'},
        {"calls", required_argument, 0, 'c'},   {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},          {"tls", no_argument, 0, 't'},
        {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'n': objects = strtoull(optarg, NULL, 10); break;
        case 's': small = strtoull(optarg, NULL, 10); break;
        case 'c': calls = atoi(optarg); break;
        case 'j': json = 1; break;
        case 't': tls = 1; break;
        case 'h':
            printf("usage: moonlet-bench rpc [--objects N] [--small N] [--calls N] [--json] "
                   "[--tls]\n");
            return 0;
        default: return 2;
        }
    }
    if (small < 640 || objects < small || calls < 10) {
        fprintf(stderr, "moonlet-bench rpc: need 640 <= --small <= --objects and --calls >= 10\n");
        return 2;
    }
    if (tls)
        return rpc_tls_main(small, calls, json);

    side sm = {0}, lg = {0}; /* --small objects, --objects objects */
    int rc = 1;
    if (side_start(&sm, NULL, NULL, small) || side_start(&lg, NULL, NULL, objects))
        goto out;

    for (int i = 0; i < calls * 2; i++)
        if (echo_once(lg.c, &lg.echo))
            goto out;
    uint64_t rss0 = bench_rss_bytes(lg.m.pid);
    if (fill(sm.c, 0, small) || fill(lg.c, 0, objects))
        goto out;
    uint64_t rss1 = bench_rss_bytes(lg.m.pid);
    unsigned seed_s = 1, seed_l = 2;
    for (int i = 0; i < calls; i++)
        if (exist_once(sm.mc, small, &seed_s, &sm.exist) ||
            exist_once(lg.mc, objects, &seed_l, &lg.exist))
            goto out;

    double per_obj = (double)(rss1 - rss0) / (double)objects;
    double p50s = bench_percentile(&sm.exist, 50), p50l = bench_percentile(&lg.exist, 50);
    cJSON *root = cJSON_CreateObject();
    bench_json_latency(root, "echo", &lg.echo);
    char name[64];
    snprintf(name, sizeof(name), "batch_exist_640_at_%" PRIu64, small);
    bench_json_latency(root, name, &sm.exist);
    snprintf(name, sizeof(name), "batch_exist_640_at_%" PRIu64, objects);
    bench_json_latency(root, name, &lg.exist);
    cJSON_AddNumberToObject(root, "batch_exist_p50_ratio", p50l / p50s);
    cJSON_AddNumberToObject(root, "batch_exist_p50_ratio_target_max", 1.5);
    cJSON_AddNumberToObject(root, "objects", (double)objects);
    cJSON_AddNumberToObject(root, "key_bytes", KEY_BYTES);
    cJSON_AddNumberToObject(root, "master_rss_growth_bytes", (double)(rss1 - rss0));
    cJSON_AddNumberToObject(root, "master_bytes_per_object", per_obj);
    cJSON_AddNumberToObject(root, "master_bytes_per_object_beyond_key", per_obj - KEY_BYTES);
    cJSON_AddNumberToObject(root, "bytes_beyond_key_target_max", 256);
    if (json) {
        bench_print_json(root);
    } else {
        printf("echo p50 %.1f us; BatchExistKey(640) p50 %.1f us at %" PRIu64 " objects, %.1f us at %" PRIu64
               " (ratio %.2f); master %.0f bytes/object (%.0f beyond the key)\n",
               bench_percentile(&lg.echo, 50), p50s, small, p50l, objects, p50l / p50s, per_obj,
               per_obj - KEY_BYTES);
        cJSON_Delete(root);
    }
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "moonlet-bench rpc: failed\n");
    side_stop(&sm);
    side_stop(&lg);
    return rc;
}
