/*
 * probe.c - `moonlet-bench probe`: the K3 lookup shape, lease-all versus
 * selective, against a master this command starts.
 *
 * Workload: 128 KV keys and 128 KDA checkpoints of 4 recurrent keys, all
 * present; checkpoint c resumes after the first c KV blocks (the last, 127,
 * leaves the final block to be recomputed).  Four paths, interleaved call by
 * call (the first path rotating) so machine noise hits all of them alike:
 *   echo             - Echo carrying the same 640 keys: the cost of the RPC alone;
 *   exist_all        - one BatchExistKey over all 640 keys (leases every hit);
 *   kv_then_last_hit - BatchExistKey over the 128 KV keys, then
 *                      BatchProbeKey(LastHitOnly, candidate_size 4) over the
 *                      512 KDA keys (leases one checkpoint and every KV hit);
 *   k3_one_rtt       - one ProbeResume over the 128 KV keys and the 512 KDA keys
 *                      with each checkpoint's boundary (leases one checkpoint
 *                      and the KV blocks below it).
 * Keys leased per call come from the master's lease counters; the lock hold
 * p99s from its validation histograms (BatchProbeKey's and ProbeResume's).
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
static uint64_t g_bounds[CKPT]; /* checkpoint c needs the first c KV keys */

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

/* The master's lease counters, read through `st` (kept for the caller). */
typedef struct lease_counts {
    double exist, probe, resume_kda, resume_kv;
} lease_counts;

static int read_counts(moonlet_master_client *mc, cJSON **st, lease_counts *c)
{
    if (stats(mc, st))
        return -1;
    *c = (lease_counts){stat_num(*st, "leases_exist"), stat_num(*st, "leases_probe"),
                        stat_num(*st, "leases_resume_kda"), stat_num(*st, "leases_resume_kv")};
    return 0;
}

/* KDA keys an answer marks. */
static int kda_marked(const int32_t *r)
{
    int n = 0;
    for (int i = KV; i < ALL; i++)
        n += r[i] == 1;
    return n;
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
    return moonlet_rpc_client_call_code(c);
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

static int do_one_rtt(moonlet_master_client *mc, int32_t *r, moonlet_mc_resume_out *out)
{
    return moonlet_mc_probe_resume(mc, "", g_all, KV, g_all + KV, KDA, RANKS, g_bounds, CKPT, out,
                                   r + KV);
}

/* Upper bound (us) of the histogram bucket holding the p99 sample. */
static double hist_p99_us(cJSON *st, const char *name)
{
    cJSON *h = cJSON_GetObjectItem(st, name);
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
    for (int c = 0; c < CKPT; c++)
        g_bounds[c] = (uint64_t)c;

    bench_master bm;
    if (bench_master_start(&bm, NULL)) {
        fprintf(stderr, "moonlet-bench: cannot start moonlet-master\n");
        return 1;
    }
    int rc = 1;
    moonlet_master_client *mc = NULL;
    moonlet_rpc_client *c = NULL;
    cJSON *st = NULL;
    bench_samples echo = {0}, all = {0}, sel = {0}, one = {0};
    moonlet_mc_resume_out ro;
    static int32_t r[ALL];
    if (moonlet_mc_create(bm.addr, NULL, &mc) ||
        moonlet_rpc_client_connect("127.0.0.1", bm.port, NULL, &c))
        goto out;
    moonlet_segment_desc seg = {.client_id = "bench", .segment_id = "bench-seg", .name = "bench",
                                .size = 64 << 20, .endpoint = "127.0.0.1:1", .protocol = "tcp"};
    if (moonlet_mc_mount_segment(mc, &seg) || put_all(mc))
        goto out;

    /* Leases granted by one call of each path. */
    lease_counts c0, c1, c2, c3;
    if (read_counts(mc, &st, &c0) || do_exist_all(mc, r) || read_counts(mc, &st, &c1))
        goto out;
    double kda_all = c1.exist - c0.exist - KV;
    if (do_selective(mc, r) || read_counts(mc, &st, &c2))
        goto out;
    double kda_sel = c2.probe - c1.probe;
    double kv_sel = c2.exist - c1.exist;
    int selected = kda_marked(r);
    if (do_one_rtt(mc, r, &ro) || read_counts(mc, &st, &c3))
        goto out;
    double kda_one = c3.resume_kda - c2.resume_kda;
    double kv_one = c3.resume_kv - c2.resume_kv;
    int selected_one = kda_marked(r);
    int64_t sel_ckpt = ro.selected;
    uint64_t sel_boundary = ro.selected >= 0 ? g_bounds[ro.selected] : 0;

    for (int i = 0; i < iters; i++) {
        for (int k = 0; k < 4; k++) {
            int path = (i + k) % 4;
            uint64_t t0 = bench_now_ns();
            int e = path == 0   ? do_echo(c)
                    : path == 1 ? do_exist_all(mc, r)
                    : path == 2 ? do_selective(mc, r)
                                : do_one_rtt(mc, r, &ro);
            if (e)
                goto out;
            double us = (double)(bench_now_ns() - t0) / 1000.0;
            bench_samples_add(path == 0 ? &echo : path == 1 ? &all : path == 2 ? &sel : &one, us);
        }
    }
    if (stats(mc, &st))
        goto out;

    double p50e = bench_percentile(&echo, 50), p50s = bench_percentile(&sel, 50);
    double p50a = bench_percentile(&all, 50), p50o = bench_percentile(&one, 50);
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
    bench_json_latency(root, "k3_one_rtt", &one);
    cJSON *k1 = cJSON_GetObjectItem(root, "k3_one_rtt");
    cJSON_AddNumberToObject(k1, "kda_keys_leased", kda_one);
    cJSON_AddNumberToObject(k1, "kv_keys_leased", kv_one);
    cJSON_AddNumberToObject(k1, "kda_keys_selected", selected_one);
    cJSON_AddNumberToObject(k1, "selected_checkpoint", (double)sel_ckpt);
    cJSON_AddNumberToObject(k1, "selected_boundary_kv_keys", (double)sel_boundary);
    cJSON_AddNumberToObject(k1, "lock_hold_p99_us", hist_p99_us(st, "resume_lock_hold_us_hist"));
    cJSON_AddNumberToObject(k1, "lock_hold_max_us", stat_num(st, "resume_lock_hold_max_ns") / 1000.0);
    cJSON_AddNumberToObject(root, "k3_one_rtt_p50_over_exist_all_p50", p50o / p50a);
    cJSON_AddNumberToObject(root, "k3_one_rtt_p50_over_echo_p50", p50o / p50e);
    cJSON_AddNumberToObject(root, "k3_one_rtt_over_exist_all_target_max", 1.0);
    cJSON_AddNumberToObject(root, "k3_one_rtt_over_echo_target_max", 1.5);
    cJSON_AddNumberToObject(root, "lock_hold_p99_us", hist_p99_us(st, "probe_lock_hold_us_hist"));
    cJSON_AddNumberToObject(root, "lock_hold_max_us", stat_num(st, "probe_lock_hold_max_ns") / 1000.0);
    cJSON_AddNumberToObject(root, "lock_hold_p99_target_max_us", 10);
    if (json) {
        bench_print_json(root);
    } else {
        printf("echo p50 %.1f us; exist_all p50 %.1f us (%.0f KDA keys leased); kv_then_last_hit p50 "
               "%.1f us (%.0f KDA keys leased), %.2fx echo; lock hold p99 <= %.0f us\n",
               p50e, p50a, kda_all, p50s, kda_sel, p50s / p50e,
               hist_p99_us(st, "probe_lock_hold_us_hist"));
        printf("k3_one_rtt p50 %.1f us (%.2fx exist_all, %.2fx echo; %.0f KDA + %.0f KV keys leased); "
               "lock hold p99 <= %.0f us\n", p50o, p50o / p50a, p50o / p50e, kda_one, kv_one,
               hist_p99_us(st, "resume_lock_hold_us_hist"));
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
    bench_samples_free(&one);
    moonlet_rpc_client_close(c);
    moonlet_mc_destroy(mc);
    bench_master_stop(&bm);
    return rc;
}
