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
#include "wire.h"

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

/* A master of its own, with a segment mounted; connections in *mc and *c. */
static int side_start(bench_master *bm, uint64_t objects, moonlet_master_client **mc,
                      moonlet_rpc_client **c)
{
    if (bench_master_start(bm, NULL)) {
        fprintf(stderr, "moonlet-bench: cannot start moonlet-master\n");
        return -1;
    }
    moonlet_segment_desc seg = {.client_id = "bench", .segment_id = "bench-seg", .name = "bench",
                                .size = (objects * 64) * 2 + (1u << 20),
                                .endpoint = "127.0.0.1:1", .protocol = "tcp"};
    if (moonlet_mc_create(bm->addr, NULL, mc) ||
        moonlet_rpc_client_connect("127.0.0.1", bm->port, NULL, c) ||
        moonlet_mc_mount_segment(*mc, &seg))
        return -1;
    return 0;
}

int bench_rpc_main(int argc, char **argv)
{
    uint64_t objects = 1000000, small = 10000;
    int calls = 1000, json = 0;
    static const struct option opts[] = {
        {"objects", required_argument, 0, 'n'}, {"small", required_argument, 0, 's'},
        {"calls", required_argument, 0, 'c'},   {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'n': objects = strtoull(optarg, NULL, 10); break;
        case 's': small = strtoull(optarg, NULL, 10); break;
        case 'c': calls = atoi(optarg); break;
        case 'j': json = 1; break;
        case 'h':
            printf("usage: moonlet-bench rpc [--objects N] [--small N] [--calls N] [--json]\n");
            return 0;
        default: return 2;
        }
    }
    if (small < 640 || objects < small || calls < 10) {
        fprintf(stderr, "moonlet-bench rpc: need 640 <= --small <= --objects and --calls >= 10\n");
        return 2;
    }

    bench_master small_m = {0}, large_m = {0};
    int rc = 1;
    moonlet_master_client *mc_s = NULL, *mc_l = NULL;
    moonlet_rpc_client *c_s = NULL, *c_l = NULL;
    bench_samples echo = {0}, ex_small = {0}, ex_large = {0};
    if (side_start(&small_m, small, &mc_s, &c_s) || side_start(&large_m, objects, &mc_l, &c_l))
        goto out;

    for (int i = 0; i < calls * 2; i++) {
        uint64_t t0 = bench_now_ns();
        moonlet_rpc_client_begin(c_l, MOONLET_M_ECHO, 0);
        moonlet_reply rep;
        if (moonlet_rpc_client_call(c_l, &rep))
            goto out;
        moonlet_reply_destroy(&rep);
        bench_samples_add(&echo, (double)(bench_now_ns() - t0) / 1000.0);
    }
    uint64_t rss0 = bench_rss_bytes(large_m.pid);
    if (fill(c_s, 0, small) || fill(c_l, 0, objects))
        goto out;
    uint64_t rss1 = bench_rss_bytes(large_m.pid);
    unsigned seed_s = 1, seed_l = 2;
    for (int i = 0; i < calls; i++)
        if (exist_once(mc_s, small, &seed_s, &ex_small) ||
            exist_once(mc_l, objects, &seed_l, &ex_large))
            goto out;

    double per_obj = (double)(rss1 - rss0) / (double)objects;
    double p50s = bench_percentile(&ex_small, 50), p50l = bench_percentile(&ex_large, 50);
    cJSON *root = cJSON_CreateObject();
    bench_json_latency(root, "echo", &echo);
    char name[64];
    snprintf(name, sizeof(name), "batch_exist_640_at_%" PRIu64, small);
    bench_json_latency(root, name, &ex_small);
    snprintf(name, sizeof(name), "batch_exist_640_at_%" PRIu64, objects);
    bench_json_latency(root, name, &ex_large);
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
               bench_percentile(&echo, 50), p50s, small, p50l, objects, p50l / p50s, per_obj,
               per_obj - KEY_BYTES);
        cJSON_Delete(root);
    }
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "moonlet-bench rpc: failed\n");
    bench_samples_free(&echo);
    bench_samples_free(&ex_small);
    bench_samples_free(&ex_large);
    moonlet_rpc_client_close(c_s);
    moonlet_rpc_client_close(c_l);
    moonlet_mc_destroy(mc_s);
    moonlet_mc_destroy(mc_l);
    bench_master_stop(&small_m);
    bench_master_stop(&large_m);
    return rc;
}
