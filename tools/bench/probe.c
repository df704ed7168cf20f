/*
 * probe.c - `moonlet-bench probe`: the K3 lookup shape, lease-all versus
 * selective, against a master this command starts.
 *
 * Workload: 128 KV keys and 128 KDA checkpoints of 4 recurrent keys, all
 * present.  Three paths, interleaved call by call so machine noise hits all
 * of them alike:
 *   echo             - Echo carrying the same 640 keys: the cost of the RPC alone;
 *   exist_all        - one BatchExistKey over all 640 keys (leases every hit);
 *   kv_then_last_hit - BatchExistKey over the 128 KV keys, then
 *                      BatchProbeKey(LastHitOnly, candidate_size 4) over the
 *                      512 KDA keys (leases one checkpoint).
 * KDA keys leased per call come from the master's lease counters; the lock
 * hold p99 from its validation histogram.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "master_client.h"
#include "methods.h"
#include "moonlet/error.h"
#include "rpc_client.h"
#include "wire.h"

#define KV 128
#define CKPT 128
#define RANKS 4
#define KDA (CKPT * RANKS)
#define ALL (KV + KDA)

static char g_names[ALL][32];
static const char *g_all[ALL]; /* KV keys first, then KDA keys */

static double stat_num(cJSON *st, const char *name)
{
    cJSON *v = cJSON_GetObjectItem(st, name);
    return v ? v->valuedouble : 0;
}

static int stats(moonlet_master_client *mc, cJSON **st)
{
    cJSON_Delete(*st);
    *st = NULL;
    return moonlet_mc_stats(mc, st);
}

static int put_all(moonlet_master_client *mc)
{
    for (int i = 0; i < ALL; i++) {
        moonlet_replica_list l;
        int rc = moonlet_mc_put_start(mc, "", g_all[i], 4096, 1, false, &l);
        if (rc)
            return rc;
        moonlet_replica_list_free(&l);
        if ((rc = moonlet_mc_put_end(mc, "", g_all[i])))
            return rc;
    }
    return MOONLET_OK;
}

static int do_echo(moonlet_rpc_client *c)
{
    msgpack_packer *pk = moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 1);
    msgpack_pack_array(pk, ALL);
    for (int i = 0; i < ALL; i++)
        moonlet_pack_cstr(pk, g_all[i]);
    moonlet_reply rep;
    int rc = moonlet_rpc_client_call(c, &rep);
    if (rc)
        return rc;
    rc = rep.code;
    moonlet_reply_destroy(&rep);
    return rc;
}

static int do_exist_all(moonlet_master_client *mc, int32_t *r)
{
    return moonlet_mc_batch_exist_key(mc, "", g_all, ALL, r);
}

static int do_selective(moonlet_master_client *mc, int32_t *r)
{
    moonlet_grant_lease_policy p = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, RANKS};
    int rc = moonlet_mc_batch_exist_key(mc, "", g_all, KV, r);
    return rc ? rc : moonlet_mc_batch_probe_key(mc, "", p, g_all + KV, KDA, r + KV);
}

/* Upper bound (us) of the histogram bucket holding the p99 sample. */
static double hist_p99_us(cJSON *st)
{
    cJSON *h = cJSON_GetObjectItem(st, "probe_lock_hold_us_hist");
    int n = cJSON_GetArraySize(h);
    double total = 0, seen = 0;
    for (int i = 0; i < n; i++)
        total += cJSON_GetArrayItem(h, i)->valuedouble;
    for (int i = 0; i < n; i++) {
        seen += cJSON_GetArrayItem(h, i)->valuedouble;
        if (seen >= 0.99 * total)
            return (double)(1u << i);
    }
    return 0;
}

int bench_probe_main(int argc, char **argv)
{
    int iters = 2000, json = 0;
    static const struct option opts[] = {
        {"iterations", required_argument, 0, 'i'}, {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'i': iters = atoi(optarg); break;
        case 'j': json = 1; break;
        case 'h': printf("usage: moonlet-bench probe [--iterations N] [--json]\n"); return 0;
        default: return 2;
        }
    }
    if (iters < 10) {
        fprintf(stderr, "moonlet-bench probe: --iterations must be >= 10\n");
        return 2;
    }
    for (int i = 0; i < KV; i++)
        snprintf(g_names[i], sizeof(g_names[i]), "kv/block-%04d", i);
    for (int i = 0; i < KDA; i++)
        snprintf(g_names[KV + i], sizeof(g_names[0]), "kda/ckpt-%04d/rank-%d", (i / RANKS + 1) * 4, i % RANKS);
    for (int i = 0; i < ALL; i++)
        g_all[i] = g_names[i];

    bench_master bm;
    if (bench_master_start(&bm, NULL)) {
        fprintf(stderr, "moonlet-bench: cannot start moonlet-master\n");
        return 1;
    }
    int rc = 1;
    moonlet_master_client *mc = NULL;
    moonlet_rpc_client *c = NULL;
    cJSON *st = NULL;
    bench_samples echo = {0}, all = {0}, sel = {0};
    static int32_t r[ALL];
    if (moonlet_mc_create(bm.addr, NULL, &mc) ||
        moonlet_rpc_client_connect("127.0.0.1", bm.port, NULL, &c))
        goto out;
    moonlet_segment_desc seg = {.client_id = "bench", .segment_id = "bench-seg", .name = "bench",
                                .size = 64 << 20, .endpoint = "127.0.0.1:1", .protocol = "tcp"};
    if (moonlet_mc_mount_segment(mc, &seg) || put_all(mc))
        goto out;

    /* Leases granted by one call of each path. */
    if (stats(mc, &st))
        goto out;
    double ex0 = stat_num(st, "leases_exist");
    if (do_exist_all(mc, r) || stats(mc, &st))
        goto out;
    double kda_all = stat_num(st, "leases_exist") - ex0 - KV;
    double ex1 = stat_num(st, "leases_exist"), pr1 = stat_num(st, "leases_probe");
    if (do_selective(mc, r) || stats(mc, &st))
        goto out;
    double kda_sel = stat_num(st, "leases_probe") - pr1;
    double kv_sel = stat_num(st, "leases_exist") - ex1;
    int selected = 0;
    for (int i = KV; i < ALL; i++)
        selected += r[i] == 1;

    for (int i = 0; i < iters; i++) {
        uint64_t t0 = bench_now_ns();
        if (do_echo(c))
            goto out;
        uint64_t t1 = bench_now_ns();
        if (do_exist_all(mc, r))
            goto out;
        uint64_t t2 = bench_now_ns();
        if (do_selective(mc, r))
            goto out;
        uint64_t t3 = bench_now_ns();
        bench_samples_add(&echo, (double)(t1 - t0) / 1000.0);
        bench_samples_add(&all, (double)(t2 - t1) / 1000.0);
        bench_samples_add(&sel, (double)(t3 - t2) / 1000.0);
    }
    if (stats(mc, &st))
        goto out;

    double p50e = bench_percentile(&echo, 50), p50s = bench_percentile(&sel, 50);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "workload", "128 KV keys + 128 checkpoints x 4 KDA keys, all present");
    bench_json_latency(root, "echo", &echo);
    bench_json_latency(root, "exist_all", &all);
    cJSON_AddNumberToObject(cJSON_GetObjectItem(root, "exist_all"), "kda_keys_leased", kda_all);
    bench_json_latency(root, "kv_then_last_hit", &sel);
    cJSON *s = cJSON_GetObjectItem(root, "kv_then_last_hit");
    cJSON_AddNumberToObject(s, "kda_keys_leased", kda_sel);
    cJSON_AddNumberToObject(s, "kv_keys_leased", kv_sel);
    cJSON_AddNumberToObject(s, "kda_keys_selected", selected);
    cJSON_AddNumberToObject(root, "kv_then_last_hit_p50_over_echo_p50", p50s / p50e);
    cJSON_AddNumberToObject(root, "ratio_target_max", 2.5);
    cJSON_AddNumberToObject(root, "lock_hold_p99_us", hist_p99_us(st));
    cJSON_AddNumberToObject(root, "lock_hold_max_us", stat_num(st, "probe_lock_hold_max_ns") / 1000.0);
    cJSON_AddNumberToObject(root, "lock_hold_p99_target_max_us", 10);
    if (json) {
        bench_print_json(root);
    } else {
        printf("echo p50 %.1f us; exist_all p50 %.1f us (%.0f KDA keys leased); kv_then_last_hit p50 "
               "%.1f us (%.0f KDA keys leased), %.2fx echo; lock hold p99 <= %.0f us\n",
               p50e, bench_percentile(&all, 50), kda_all, p50s, kda_sel, p50s / p50e,
               hist_p99_us(st));
        cJSON_Delete(root);
    }
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "moonlet-bench probe: failed\n");
    cJSON_Delete(st);
    bench_samples_free(&echo);
    bench_samples_free(&all);
    bench_samples_free(&sel);
    moonlet_rpc_client_close(c);
    moonlet_mc_destroy(mc);
    bench_master_stop(&bm);
    return rc;
}
