/*
 * trace.c - `moonlet-bench trace`: replays Mooncake's conversation trace
 * against a master and store nodes this command starts, three times: with the
 * lease-all K3 lookup, with the selective one in two calls (BatchExistKey,
 * then BatchProbeKey(LAST_HIT_ONLY)) and with the selective one in one call
 * (ProbeResume, "k3_one_rtt"), and compares what each leases, what each hits
 * and how much each evicts.
 *
 * Why a replay: the selective lookup's claim is about memory under pressure.
 * Leasing every probed checkpoint protects checkpoints nobody will load, and
 * the master's eviction (earliest lease deadline first, never-leased objects
 * first) then takes other objects instead.  Only a workload with real prefix
 * reuse and a cache smaller than its working set shows whether that costs
 * hits; the trace's hash_ids (512-token prefix blocks) are that workload.
 *
 * Model (a hybrid attention + KDA model, as an engine would drive it):
 *  - one KV object ("kv/<hash>") of --kv-bytes per 512-token block;
 *  - a KDA checkpoint may exist every --kda-every blocks; one checkpoint is
 *    --ranks objects ("kda/<hash of its last block>/r<rank>") of --kda-bytes;
 *  - per request: the K3 lookup (moonlet_k3_lookup, include/moonlet/k3.h)
 *    over its blocks and its checkpoint positions, with final-token
 *    recompute (resume strictly below the prompt); then, as after prefill,
 *    a put of the KV blocks past the KV boundary and of the checkpoint at the
 *    new end (the last checkpoint position within the prompt's full blocks);
 *  - KV hit blocks = the KV boundary in blocks (what attention alone could
 *    reuse); KDA hit blocks = the resume position in blocks (what the hybrid
 *    model does reuse: KV and a checkpoint); prefill tokens saved = the resume
 *    position.
 * Segment capacity is --capacity-fraction of the replayed working set (every
 * distinct KV object and checkpoint object), split over --stores nodes, so
 * the master evicts (at 90% use, and on an allocation failure).
 *
 * Time is compressed by --time-scale (replay seconds per trace second); the
 * lease TTL (--lease-ttl-ms, trace time) is scaled with it and passed as the
 * master's --default_kv_lease_ttl.  Requests start on their scaled schedule;
 * when the replay falls behind, they start at once and the lag is reported.
 *
 * Leases: the master's counters (leases_exist, leases_probe, leases_resume_kda,
 * leases_resume_kv) before and after each run, cross-checked against the
 * helper's own counts (kda_leased, kv_leased, kv_hits).  For scale, the output also gives the hit ratios of a cache that
 * never evicts (same model, computed without a cluster), and, for requests
 * whose candidates include a checkpoint written earlier in the run, whether
 * they resumed from the newest one, from an older one (the newest had been
 * evicted) or from none.  With --plot, tools/bench/plot_trace.py (next to this binary) is
 * run with /usr/bin/python3 on a per-request time series.
 *
 * Files: loading the trace is trace_load.c, the model's layout, keys,
 * working set and never-evicting reference are trace_model.c (both unit
 * tested in tests/tools/test_trace_model.c); this file runs the cluster,
 * the replays and the output.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "bytesize.h"
#include "disk_layout.h"
#include "master_client.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "moonlet/k3.h"
#include "trace_load.h"
#include "trace_model.h"

#define MAX_STORES 16u

typedef struct trace_opts {
    const char *path, *plot, *series;
    size_t limit;             /* 0: every request */
    double time_scale;        /* replay seconds per trace second */
    uint64_t lease_ttl_ms;    /* in trace time */
    uint32_t kda_every, ranks, stores;
    uint64_t kv_bytes, kda_bytes;
    double capacity_fraction;
    double disk_fraction;     /* the disk tiers / the working set's disk extents; 0: no disk run */
    const char *disk_dir;     /* where the disk tiers' files go (not tmpfs) */
    bool json;
} trace_opts;


/* Runs, in order: lease-all, selective in two calls, selective in one (ProbeResume). */
#define NMODES 4 /* lease_all, selective, k3_one_rtt, and k3_one_rtt with a disk tier */

/* Cumulative figures after one request, for the plot. */
typedef struct series_row {
    double t_s; /* trace time */
    uint64_t blocks, kv_hit, kda_hit, kda_keys;
} series_row;

typedef struct run_result {
    const char *mode;
    uint64_t lookups, rpcs, blocks, kv_hit_blocks, kda_hit_blocks, prompt_tokens, saved_tokens;
    uint64_t kv_hits, kda_leased_own, kv_leased_own, puts, puts_existing, put_failures;
    /* Requests with a checkpoint ever written among their candidates, by what
     * they resumed from: the newest such checkpoint, an older one (the newest
     * was evicted), or none (all were evicted). */
    uint64_t resume_newest, resume_older, resume_none;
    double leases_exist, leases_probe, evictions, eviction_passes, resume_kda, resume_kv;
    double resume_examined, resume_fallbacks, demotions, demotions_dropped;
    bench_samples lookup_us, lag_ms;
    double wall_s;
    series_row *rows;
} run_result;

/* ---- one replay ----------------------------------------------------------------------- */

typedef struct cluster {
    bench_master master;
    bench_master stores[MAX_STORES];
    uint32_t nstores;
    moonlet_master_client *mc;
    moonlet_client *cli;
    void *buf;
} cluster;

static void cluster_stop(cluster *cl)
{
    if (cl->cli && cl->buf)
        moonlet_client_unregister_buffer(cl->cli, cl->buf);
    moonlet_client_destroy(cl->cli);
    moonlet_mc_destroy(cl->mc);
    free(cl->buf);
    for (uint32_t i = cl->nstores; i-- > 0;)
        bench_master_stop(&cl->stores[i]);
    bench_master_stop(&cl->master);
    memset(cl, 0, sizeof(*cl));
}

/* A disk run's tier file of store i. */
static void disk_file(const trace_opts *o, uint32_t i, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/moonlet-trace-disk-%d-%u.tier", o->disk_dir, (int)getpid(), i);
}

/* per_disk 0: no disk tier. */
static int cluster_start(cluster *cl, const trace_opts *o, uint64_t per_store, uint64_t per_disk)
{
    memset(cl, 0, sizeof(*cl));
    char ttl[32];
    double scaled = (double)o->lease_ttl_ms * o->time_scale;
    snprintf(ttl, sizeof(ttl), "%llu", (unsigned long long)(scaled < 1 ? 1 : scaled + 0.5));
    const char *flags[] = {"--default_kv_lease_ttl", ttl, NULL};
    if (bench_master_start(&cl->master, flags)) {
        fprintf(stderr, "moonlet-bench trace: cannot start moonlet-master\n");
        return -1;
    }
    for (; cl->nstores < o->stores; cl->nstores++) {
        char file[1024], dsize[32];
        disk_file(o, cl->nstores, file, sizeof(file));
        unlink(file); /* a fresh tier: no objects of an earlier run */
        snprintf(dsize, sizeof(dsize), "%llu", (unsigned long long)per_disk);
        const char *disk[] = {"--disk", file, "--disk-size", dsize, NULL};
        if (bench_store_start_with(&cl->stores[cl->nstores], cl->master.addr, per_store,
                                   per_disk ? disk : NULL)) {
            fprintf(stderr, "moonlet-bench trace: cannot start moonlet-store\n");
            return -1;
        }
    }
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg, sizeof cfg);
    cfg.master_addr = cl->master.addr;
    cfg.protocol = MOONLET_PROTOCOL_TCP;
    size_t len = o->kv_bytes > o->kda_bytes ? o->kv_bytes : o->kda_bytes;
    if (moonlet_mc_create(cl->master.addr, NULL, &cl->mc) ||
        moonlet_client_create(&cfg, &cl->cli) || !(cl->buf = malloc(len ? len : 1))) {
        fprintf(stderr, "moonlet-bench trace: cannot connect to the master\n");
        return -1;
    }
    memset(cl->buf, 0x4b, len ? len : 1);
    return moonlet_client_register_buffer(cl->cli, cl->buf, len ? len : 1) ? -1 : 0;
}

static double stat_num(cJSON *st, const char *name)
{
    cJSON *v = cJSON_GetObjectItem(st, name);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

#define NSTATS 10
static int stats_now(moonlet_master_client *mc, double out[NSTATS])
{
    cJSON *st = NULL;
    int rc = moonlet_mc_stats(mc, &st);
    if (rc)
        return rc;
    out[0] = stat_num(st, "leases_exist");
    out[1] = stat_num(st, "leases_probe");
    out[2] = stat_num(st, "evictions");
    out[3] = stat_num(st, "eviction_passes");
    out[4] = stat_num(st, "leases_resume_kda");
    out[5] = stat_num(st, "leases_resume_kv");
    out[6] = stat_num(st, "resume_candidates_examined");
    out[7] = stat_num(st, "resume_recheck_fallbacks");
    out[8] = stat_num(st, "demotions");
    out[9] = stat_num(st, "demotions_dropped");
    cJSON_Delete(st);
    return MOONLET_OK;
}

/* Per-request scratch: checkpoint positions and the keys of the puts. */
typedef struct scratch {
    uint64_t *ckpts;
    char (*names)[48];
    const char **keys;
    const void **bufs;
    size_t *lens;
    int32_t *results;
} scratch;

static void scratch_free(scratch *s)
{
    free(s->ckpts);
    free(s->names);
    free(s->keys);
    free(s->bufs);
    free(s->lens);
    free(s->results);
}

static int scratch_alloc(scratch *s, uint32_t max_blocks, uint32_t ranks)
{
    size_t n = (size_t)max_blocks + ranks;
    s->ckpts = calloc(max_blocks + 1u, sizeof(*s->ckpts));
    s->names = calloc(n, sizeof(*s->names));
    s->keys = calloc(n, sizeof(*s->keys));
    s->bufs = calloc(n, sizeof(*s->bufs));
    s->lens = calloc(n, sizeof(*s->lens));
    s->results = calloc(n, sizeof(*s->results));
    return s->ckpts && s->names && s->keys && s->bufs && s->lens && s->results ? 0 : -1;
}

static void sleep_until(uint64_t t_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(t_ns / 1000000000u), .tv_nsec = (long)(t_ns % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* After prefill: the KV blocks past the boundary and the checkpoint at the
 * new end (unless it is the one the request resumed from). */
static void put_after_prefill(cluster *cl, const trace_opts *o, const treq *q,
                              const uint64_t *ids, const moonlet_k3_result *res, scratch *s,
                              idset *written, run_result *rr)
{
    size_t np = 0;
    moonlet_k3_key_id id = {.kind = MOONLET_K3_KEY_KV};
    for (id.block = res->kv_prefix_blocks; id.block < q->n; id.block++, np++) {
        trace_key((void *)ids, &id, s->names[np], sizeof(s->names[np]));
        s->lens[np] = o->kv_bytes;
    }
    size_t kv_puts = np;
    uint32_t e = end_checkpoint_blocks(q, o->kda_every);
    if (e && (uint64_t)e * BLOCK_TOKENS != res->resume_position) {
        id = (moonlet_k3_key_id){.kind = MOONLET_K3_KEY_KDA, .position = (uint64_t)e * BLOCK_TOKENS};
        for (id.rank = 0; id.rank < o->ranks; id.rank++, np++) {
            trace_key((void *)ids, &id, s->names[np], sizeof(s->names[np]));
            s->lens[np] = o->kda_bytes;
        }
    }
    if (!np)
        return;
    for (size_t i = 0; i < np; i++) {
        s->keys[i] = s->names[i];
        s->bufs[i] = cl->buf;
    }
    moonlet_client_batch_put_from(cl->cli, s->keys, np, s->bufs, s->lens, NULL, s->results);
    bool ckpt_stored = np > kv_puts;
    for (size_t i = 0; i < np; i++) {
        if (s->results[i] == MOONLET_OK) {
            rr->puts++;
        } else if (s->results[i] == MOONLET_ERR_OBJECT_ALREADY_EXISTS) {
            rr->puts_existing++;
        } else {
            rr->put_failures++;
            ckpt_stored = ckpt_stored && i < kv_puts;
        }
    }
    if (ckpt_stored)
        idset_add(written, ids[e - 1]);
}

/* Which checkpoint a request resumed from, against the newest candidate
 * ever written (see run_result). */
static void count_resume(const moonlet_k3_request *req, const moonlet_k3_result *res,
                         const uint64_t *ids, const idset *written, run_result *rr)
{
    uint64_t newest = 0;
    size_t cands = moonlet_k3_candidates(req, res->kv_boundary);
    for (size_t i = 0; i < cands; i++)
        if (idset_has(written, ids[req->checkpoints[i] / BLOCK_TOKENS - 1]))
            newest = req->checkpoints[i];
    if (!newest)
        return;
    if (res->resume_position == newest)
        rr->resume_newest++;
    else if (res->resume_position)
        rr->resume_older++;
    else
        rr->resume_none++;
}

static int replay(const trace *t, const trace_opts *o, moonlet_k3_mode mode, uint64_t per_store,
                  uint64_t per_disk, run_result *rr)
{
    memset(rr, 0, sizeof(*rr));
    rr->mode = mode == MOONLET_K3_LEASE_ALL ? "lease_all"
               : mode == MOONLET_K3_SELECTIVE_TWO_CALLS ? "selective"
               : per_disk                               ? "k3_one_rtt_disk"
                                                        : "k3_one_rtt";
    rr->rows = calloc(t->n, sizeof(*rr->rows));
    scratch s = {0};
    cluster cl = {0};
    idset written = {0};
    double st0[NSTATS], st1[NSTATS];
    int rc = -1;
    if (!rr->rows || scratch_alloc(&s, t->max_blocks, o->ranks) || idset_init(&written, t->n) ||
        cluster_start(&cl, o, per_store, per_disk) || stats_now(cl.mc, st0))
        goto out;
    const moonlet_k3_layout layout = {.block_tokens = BLOCK_TOKENS, .groups = 1,
                                      .ranks = o->ranks, .components = 1};
    const uint64_t step = (uint64_t)o->kda_every * BLOCK_TOKENS;
    uint64_t start = bench_now_ns();
    for (size_t i = 0; i < t->n; i++) {
        const treq *q = &t->r[i];
        const uint64_t *ids = t->ids + q->off;
        uint64_t sched = start + (uint64_t)((double)(q->ts_ms - t->r[0].ts_ms) * 1e6 * o->time_scale);
        uint64_t now = bench_now_ns();
        if (now < sched)
            sleep_until(sched);
        bench_samples_add(&rr->lag_ms, now > sched ? (double)(now - sched) / 1e6 : 0);

        size_t ncp = 0;
        for (uint64_t p = step; p <= (uint64_t)q->n * BLOCK_TOKENS; p += step)
            s.ckpts[ncp++] = p;
        moonlet_k3_request req = {.prompt_tokens = q->input, .kv_blocks = q->n,
                                  .checkpoints = s.ckpts, .n_checkpoints = ncp,
                                  .recompute_last_token = true, .mode = mode};
        moonlet_k3_result res;
        uint64_t t0 = bench_now_ns();
        int lrc = moonlet_k3_lookup(cl.cli, &layout, &req, trace_key, (void *)ids, NULL, &res);
        bench_samples_add(&rr->lookup_us, (double)(bench_now_ns() - t0) / 1e3);
        if (lrc) {
            fprintf(stderr, "moonlet-bench trace: lookup of request %zu: %s\n", i,
                    moonlet_strerror(lrc));
            goto out;
        }
        rr->lookups++;
        rr->rpcs += res.rpcs;
        rr->blocks += q->n;
        rr->kv_hit_blocks += res.kv_prefix_blocks;
        rr->kda_hit_blocks += res.resume_position / BLOCK_TOKENS;
        rr->prompt_tokens += q->input;
        rr->saved_tokens += res.resume_position;
        rr->kv_hits += res.kv_hits;
        rr->kda_leased_own += res.kda_leased;
        rr->kv_leased_own += res.kv_leased;
        count_resume(&req, &res, ids, &written, rr);
        put_after_prefill(&cl, o, q, ids, &res, &s, &written, rr);
        moonlet_k3_result_free(&res);
        rr->rows[i] = (series_row){.t_s = (double)(q->ts_ms - t->r[0].ts_ms) / 1e3,
                                   .blocks = rr->blocks, .kv_hit = rr->kv_hit_blocks,
                                   .kda_hit = rr->kda_hit_blocks, .kda_keys = rr->kda_leased_own};
    }
    rr->wall_s = (double)(bench_now_ns() - start) / 1e9;
    if (stats_now(cl.mc, st1))
        goto out;
    rr->leases_exist = st1[0] - st0[0];
    rr->leases_probe = st1[1] - st0[1];
    rr->evictions = st1[2] - st0[2];
    rr->eviction_passes = st1[3] - st0[3];
    rr->resume_kda = st1[4] - st0[4];
    rr->resume_kv = st1[5] - st0[5];
    rr->resume_examined = st1[6] - st0[6];
    rr->resume_fallbacks = st1[7] - st0[7];
    rr->demotions = st1[8] - st0[8];
    rr->demotions_dropped = st1[9] - st0[9];
    rc = 0;
out:
    cluster_stop(&cl);
    for (uint32_t i = 0; per_disk && i < o->stores; i++) {
        char file[1024];
        disk_file(o, i, file, sizeof(file));
        unlink(file);
    }
    scratch_free(&s);
    free(written.slot);
    return rc;
}

static void run_free(run_result *rr)
{
    bench_samples_free(&rr->lookup_us);
    bench_samples_free(&rr->lag_ms);
    free(rr->rows);
    rr->rows = NULL;
}

/* ---- output ---------------------------------------------------------------------------- */

static double ratio(double a, double b)
{
    return b > 0 ? a / b : 0;
}

/* KDA keys leased according to the master: every probe lease is a KDA key;
 * exist leases are KV hits plus, in lease-all, the KDA hits; ProbeResume
 * counts its KDA and KV leases apart. */
static double kda_leased_master(const run_result *rr)
{
    if (rr->resume_kda + rr->resume_kv > 0)
        return rr->resume_kda + rr->leases_probe;
    return rr->leases_probe + rr->leases_exist - (double)rr->kv_hits;
}

/* KV keys leased according to the master. */
static double kv_leased_master(const run_result *rr)
{
    if (rr->resume_kda + rr->resume_kv > 0)
        return rr->resume_kv + rr->leases_exist;
    return (double)rr->kv_hits;
}

static cJSON *run_json(run_result *rr, const trace_opts *o)
{
    cJSON *j = cJSON_CreateObject();
    double kda_master = kda_leased_master(rr);
    cJSON_AddNumberToObject(j, "lookups", (double)rr->lookups);
    cJSON_AddNumberToObject(j, "lookup_rpcs", (double)rr->rpcs);
    cJSON_AddNumberToObject(j, "rpcs_per_lookup", ratio((double)rr->rpcs, (double)rr->lookups));
    bench_json_latency(j, "lookup_us", &rr->lookup_us);
    cJSON_AddNumberToObject(j, "kda_keys_leased", kda_master);
    cJSON_AddNumberToObject(j, "kda_keys_leased_own_count", (double)rr->kda_leased_own);
    cJSON_AddNumberToObject(j, "kda_bytes_leased", kda_master * (double)o->kda_bytes);
    cJSON_AddNumberToObject(j, "kv_keys_leased", kv_leased_master(rr));
    cJSON_AddNumberToObject(j, "kv_keys_leased_own_count", (double)rr->kv_leased_own);
    cJSON_AddNumberToObject(j, "kv_bytes_leased", kv_leased_master(rr) * (double)o->kv_bytes);
    cJSON_AddNumberToObject(j, "master_leases_resume_kda", rr->resume_kda);
    cJSON_AddNumberToObject(j, "master_leases_resume_kv", rr->resume_kv);
    cJSON_AddNumberToObject(j, "master_resume_candidates_examined", rr->resume_examined);
    cJSON_AddNumberToObject(j, "master_resume_recheck_fallbacks", rr->resume_fallbacks);
    cJSON_AddNumberToObject(j, "master_leases_exist", rr->leases_exist);
    cJSON_AddNumberToObject(j, "master_leases_probe", rr->leases_probe);
    cJSON_AddNumberToObject(j, "blocks_requested", (double)rr->blocks);
    cJSON_AddNumberToObject(j, "kv_hit_blocks", (double)rr->kv_hit_blocks);
    cJSON_AddNumberToObject(j, "kda_hit_blocks", (double)rr->kda_hit_blocks);
    cJSON_AddNumberToObject(j, "kv_hit_ratio", ratio((double)rr->kv_hit_blocks, (double)rr->blocks));
    cJSON_AddNumberToObject(j, "kda_hit_ratio", ratio((double)rr->kda_hit_blocks, (double)rr->blocks));
    cJSON *rs = cJSON_AddObjectToObject(j, "resumes_with_a_written_checkpoint");
    cJSON_AddNumberToObject(rs, "from_newest", (double)rr->resume_newest);
    cJSON_AddNumberToObject(rs, "from_older_newest_evicted", (double)rr->resume_older);
    cJSON_AddNumberToObject(rs, "none_all_evicted", (double)rr->resume_none);
    cJSON_AddNumberToObject(j, "prefill_tokens", (double)rr->prompt_tokens);
    cJSON_AddNumberToObject(j, "prefill_tokens_saved", (double)rr->saved_tokens);
    cJSON_AddNumberToObject(j, "prefill_tokens_saved_ratio",
                            ratio((double)rr->saved_tokens, (double)rr->prompt_tokens));
    cJSON_AddNumberToObject(j, "evictions", rr->evictions);
    cJSON_AddNumberToObject(j, "eviction_passes", rr->eviction_passes);
    cJSON_AddNumberToObject(j, "puts", (double)rr->puts);
    cJSON_AddNumberToObject(j, "puts_already_present", (double)rr->puts_existing);
    cJSON_AddNumberToObject(j, "put_failures", (double)rr->put_failures);
    cJSON *lag = cJSON_AddObjectToObject(j, "schedule_lag_ms");
    cJSON_AddNumberToObject(lag, "p50", bench_percentile(&rr->lag_ms, 50));
    cJSON_AddNumberToObject(lag, "p99", bench_percentile(&rr->lag_ms, 99));
    cJSON_AddNumberToObject(lag, "max", bench_percentile(&rr->lag_ms, 100));
    cJSON_AddNumberToObject(j, "wall_s", rr->wall_s);
    return j;
}

static void print_text(run_result *r, const trace_opts *o)
{
    printf("%-10s %7s %9s %9s %12s %12s %10s %7s %7s %8s %10s\n", "lookup", "rpcs", "p50 us",
           "p99 us", "KDA leased", "KDA MiB", "KV leased", "KV hit", "KDA hit", "saved",
           "evictions");
    for (int i = 0; i < NMODES; i++) {
        run_result *rr = &r[i];
        if (!rr->mode)
            continue; /* no disk run */
        double kda = kda_leased_master(rr);
        printf("%-10s %7llu %9.1f %9.1f %12.0f %12.1f %10.0f %6.1f%% %6.1f%% %7.1f%% %10.0f\n",
               rr->mode, (unsigned long long)rr->rpcs, bench_percentile(&rr->lookup_us, 50),
               bench_percentile(&rr->lookup_us, 99), kda,
               kda * (double)o->kda_bytes / 1048576.0, kv_leased_master(rr),
               100 * ratio((double)rr->kv_hit_blocks, (double)rr->blocks),
               100 * ratio((double)rr->kda_hit_blocks, (double)rr->blocks),
               100 * ratio((double)rr->saved_tokens, (double)rr->prompt_tokens), rr->evictions);
    }
    printf("KDA keys leased, lease-all / selective: %.1fx; lease-all / k3_one_rtt: %.1fx\n",
           ratio(kda_leased_master(&r[0]), kda_leased_master(&r[1])),
           ratio(kda_leased_master(&r[0]), kda_leased_master(&r[2])));
    printf("KV keys leased, selective / k3_one_rtt: %.2fx\n",
           ratio(kv_leased_master(&r[1]), kv_leased_master(&r[2])));
}

static int write_series(const char *path, const run_result *r, size_t n, const trace_opts *o)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "moonlet-bench trace: %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "mode,t_s,requests,blocks,kv_hit_blocks,kda_hit_blocks,kda_keys_leased,"
               "kda_bytes_leased\n");
    for (int m = 0; m < NMODES; m++)
        for (size_t i = 0; r[m].rows && i < n; i++) {
            const series_row *w = &r[m].rows[i];
            fprintf(f, "%s,%.3f,%zu,%llu,%llu,%llu,%llu,%llu\n", r[m].mode, w->t_s, i + 1,
                    (unsigned long long)w->blocks, (unsigned long long)w->kv_hit,
                    (unsigned long long)w->kda_hit, (unsigned long long)w->kda_keys,
                    (unsigned long long)(w->kda_keys * o->kda_bytes));
        }
    return fclose(f) ? -1 : 0;
}

/* ---- flags ----------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moonlet-bench trace --trace PATH [options] [--json] [--plot OUT.png]\n"
            "\n"
            "Replays a Mooncake trace (JSONL: timestamp, input_length, hash_ids) three times against\n"
            "a master and store nodes it starts: K3 lookup leasing every hit, the selective lookup\n"
            "in two calls (KV BatchExistKey + BatchProbeKey LastHitOnly), and in one (ProbeResume).\n"
            "\n"
            "  --trace PATH              the trace (e.g. ../shared/data/conversation_trace.jsonl)\n"
            "  --limit N                 replay the first N requests only (default: all)\n"
            "  --time-scale S            replay seconds per trace second (default 0.02)\n"
            "  --lease-ttl-ms MS         lease TTL in trace time (default 5000; the master gets MS*S)\n"
            "  --kda-every N             a checkpoint every N blocks of 512 tokens (default 4)\n"
            "  --ranks N                 keys per checkpoint (default 4)\n"
            "  --kv-bytes SIZE           bytes per KV block object (default 2KiB, at most 1GiB)\n"
            "  --kda-bytes SIZE          bytes per checkpoint key (default 4KiB, at most 1GiB)\n"
            "  --capacity-fraction F     segment capacity / working set (default 0.3)\n"
            "  --stores N                store nodes sharing the capacity (default 1, at most 16)\n"
            "  --disk-fraction F         also replay the one-call lookup with a disk tier on every\n"
            "                            node, F x the working set's disk extents in all (0: no)\n"
            "  --disk-dir DIR            where the disk tiers' files go (default .; not tmpfs)\n"
            "  --series PATH             write the per-request time series (CSV) there\n"
            "  --plot OUT.png            draw it (tools/bench/plot_trace.py, /usr/bin/python3)\n"
            "  --json                    print the result as JSON\n");
}

/* A decimal integer in [1, max]. */
static bool parse_count(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long u = strtoull(s, &end, 10);
    if (!*s || *end || s[0] == '-' || errno || u == 0 || u > max)
        return false;
    *out = u;
    return true;
}

/* A decimal fraction in (0, max]. */
static bool parse_positive(const char *s, double max, double *out)
{
    char *end = NULL;
    double d = strtod(s, &end);
    if (!*s || *end || !(d > 0) || d > max)
        return false;
    *out = d;
    return true;
}

static bool parse_size(const char *s, uint64_t *out)
{
    return moonlet_bytesize_parse(s, out) == 0 && *out > 0 && *out <= (1u << 30);
}

/* 0: run; 1: --help printed; 2: bad flags. */
static int parse_opts(int argc, char **argv, trace_opts *o)
{
    *o = (trace_opts){.time_scale = 0.02, .lease_ttl_ms = 5000, .kda_every = 4, .ranks = 4,
                      .stores = 1, .kv_bytes = 2048, .kda_bytes = 4096, .capacity_fraction = 0.3,
                      .disk_dir = "."};
    enum { O_TRACE = 256, O_LIMIT, O_SCALE, O_TTL, O_EVERY, O_RANKS, O_KV, O_KDA, O_CAP,
           O_STORES, O_SERIES, O_PLOT, O_JSON, O_HELP, O_DISK, O_DISK_DIR };
    static const struct option opts[] = {
        {"trace", required_argument, 0, O_TRACE}, {"limit", required_argument, 0, O_LIMIT},
        {"time-scale", required_argument, 0, O_SCALE}, {"lease-ttl-ms", required_argument, 0, O_TTL},
        {"kda-every", required_argument, 0, O_EVERY}, {"ranks", required_argument, 0, O_RANKS},
        {"kv-bytes", required_argument, 0, O_KV}, {"kda-bytes", required_argument, 0, O_KDA},
        {"capacity-fraction", required_argument, 0, O_CAP}, {"stores", required_argument, 0, O_STORES},
        {"series", required_argument, 0, O_SERIES}, {"plot", required_argument, 0, O_PLOT},
        {"json", no_argument, 0, O_JSON}, {"help", no_argument, 0, O_HELP},
        {"disk-fraction", required_argument, 0, O_DISK}, {"disk-dir", required_argument, 0, O_DISK_DIR},
        {0, 0, 0, 0},
    };
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        unsigned long long u = 0;
        bool ok = true;
        switch (c) {
        case O_TRACE: o->path = optarg; break;
        case O_SERIES: o->series = optarg; break;
        case O_PLOT: o->plot = optarg; break;
        case O_JSON: o->json = true; break;
        case O_HELP: usage(stdout); return 1;
        case O_SCALE: ok = parse_positive(optarg, 1000, &o->time_scale); break;
        case O_CAP: ok = parse_positive(optarg, 1, &o->capacity_fraction); break;
        case O_DISK: ok = parse_positive(optarg, 100, &o->disk_fraction); break;
        case O_DISK_DIR: o->disk_dir = optarg; break;
        case O_KV: ok = parse_size(optarg, &o->kv_bytes); break;
        case O_KDA: ok = parse_size(optarg, &o->kda_bytes); break;
        case O_LIMIT: ok = parse_count(optarg, SIZE_MAX, &u); o->limit = (size_t)u; break;
        case O_TTL: ok = parse_count(optarg, 86400000, &u); o->lease_ttl_ms = u; break;
        case O_EVERY: ok = parse_count(optarg, 1024, &u); o->kda_every = (uint32_t)u; break;
        case O_RANKS: ok = parse_count(optarg, 1024, &u); o->ranks = (uint32_t)u; break;
        case O_STORES: ok = parse_count(optarg, MAX_STORES, &u); o->stores = (uint32_t)u; break;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "moonlet-bench trace: bad value '%s' for --%s\n", optarg, opts[li].name);
            return 2;
        }
    }
    if (!o->path || optind < argc) {
        usage(stderr);
        return 2;
    }
    struct stat st;
    if (o->disk_fraction > 0 && (stat(o->disk_dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
        /* said before any run starts, not by the disk run's store after the others */
        fprintf(stderr, "moonlet-bench trace: --disk-dir %s: not a directory (create it)\n",
                o->disk_dir);
        return 2;
    }
    return 0;
}

static trace_model model_of(const trace_opts *o)
{
    return (trace_model){.kda_every = o->kda_every, .ranks = o->ranks, .kv_bytes = o->kv_bytes,
                         .kda_bytes = o->kda_bytes};
}

/* ---- main ------------------------------------------------------------------------------ */

static int emit(const trace *t, const trace_opts *o, const working_set *ws, uint64_t capacity,
                uint64_t disk_bytes, run_result r[NMODES])
{
    trace_model model = model_of(o);
    double kda_all = kda_leased_master(&r[0]), kda_sel = kda_leased_master(&r[1]);
    double ref_kv = 0, ref_kda = 0;
    if (reference_hits(t, &model, ws, &ref_kv, &ref_kda))
        return -1;
    if (!o->json) {
        printf("%zu requests (%.0f s of trace at time scale %g), working set %.1f MiB, capacity "
               "%.1f MiB\n", t->n, (double)(t->r[t->n - 1].ts_ms - t->r[0].ts_ms) / 1e3,
               o->time_scale, (double)ws->bytes / 1048576.0, (double)capacity / 1048576.0);
        print_text(r, o);
        if (r[3].mode)
            printf("k3_one_rtt_disk: disk tiers of %.1f MiB in all, %.0f demotions, %.0f dropped\n",
                   (double)disk_bytes / 1048576.0, r[3].demotions, r[3].demotions_dropped);
        printf("a cache that never evicts: KV hit %.1f%%, KDA hit %.1f%%\n", 100 * ref_kv,
               100 * ref_kda);
        return 0;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "trace", o->path);
    cJSON_AddNumberToObject(root, "requests", (double)t->n);
    cJSON_AddNumberToObject(root, "trace_span_s", (double)(t->r[t->n - 1].ts_ms - t->r[0].ts_ms) / 1e3);
    cJSON *cfg = cJSON_AddObjectToObject(root, "config");
    cJSON_AddNumberToObject(cfg, "block_tokens", BLOCK_TOKENS);
    cJSON_AddNumberToObject(cfg, "kda_every_blocks", o->kda_every);
    cJSON_AddNumberToObject(cfg, "ranks", o->ranks);
    cJSON_AddNumberToObject(cfg, "kv_bytes", (double)o->kv_bytes);
    cJSON_AddNumberToObject(cfg, "kda_bytes", (double)o->kda_bytes);
    cJSON_AddNumberToObject(cfg, "capacity_fraction", o->capacity_fraction);
    cJSON_AddNumberToObject(cfg, "stores", o->stores);
    cJSON_AddNumberToObject(cfg, "time_scale", o->time_scale);
    cJSON_AddNumberToObject(cfg, "lease_ttl_ms_trace", (double)o->lease_ttl_ms);
    cJSON_AddNumberToObject(cfg, "lease_ttl_ms_master", (double)o->lease_ttl_ms * o->time_scale);
    cJSON_AddBoolToObject(cfg, "recompute_last_token", 1);
    cJSON *w = cJSON_AddObjectToObject(root, "working_set");
    cJSON_AddNumberToObject(w, "kv_objects", (double)ws->kv_objects);
    cJSON_AddNumberToObject(w, "checkpoints", (double)ws->checkpoints);
    cJSON_AddNumberToObject(w, "kda_objects", (double)ws->checkpoints * o->ranks);
    cJSON_AddNumberToObject(w, "bytes", (double)ws->bytes);
    cJSON_AddNumberToObject(root, "capacity_bytes", (double)capacity);
    cJSON *ref = cJSON_AddObjectToObject(root, "never_evicting_cache");
    cJSON_AddNumberToObject(ref, "kv_hit_ratio", ref_kv);
    cJSON_AddNumberToObject(ref, "kda_hit_ratio", ref_kda);
    cJSON_AddItemToObject(root, "lease_all", run_json(&r[0], o));
    cJSON_AddItemToObject(root, "selective", run_json(&r[1], o));
    cJSON_AddItemToObject(root, "k3_one_rtt", run_json(&r[2], o));
    if (r[3].mode) { /* the disk run: hit ratios beside the one without, and the reference */
        cJSON *d = run_json(&r[3], o);
        cJSON_AddNumberToObject(d, "demotions", r[3].demotions);
        cJSON_AddNumberToObject(d, "demotions_dropped", r[3].demotions_dropped);
        cJSON_AddNumberToObject(d, "disk_bytes", (double)disk_bytes);
        cJSON_AddItemToObject(root, "k3_one_rtt_disk", d);
        double kv_d = ratio((double)r[3].kv_hit_blocks, (double)r[3].blocks);
        double kda_d = ratio((double)r[3].kda_hit_blocks, (double)r[3].blocks);
        cJSON_AddNumberToObject(root, "kv_hit_ratio_disk_minus_no_disk",
                                kv_d - ratio((double)r[2].kv_hit_blocks, (double)r[2].blocks));
        cJSON_AddNumberToObject(root, "kda_hit_ratio_disk_minus_no_disk",
                                kda_d - ratio((double)r[2].kda_hit_blocks, (double)r[2].blocks));
        cJSON_AddNumberToObject(root, "kv_hit_ratio_reference_minus_disk", ref_kv - kv_d);
        cJSON_AddNumberToObject(root, "kda_hit_ratio_reference_minus_disk", ref_kda - kda_d);
    }
    cJSON_AddNumberToObject(root, "kda_keys_leased_ratio_lease_all_over_k3_one_rtt",
                            ratio(kda_all, kda_leased_master(&r[2])));
    cJSON_AddNumberToObject(root, "kv_keys_leased_ratio_selective_over_k3_one_rtt",
                            ratio(kv_leased_master(&r[1]), kv_leased_master(&r[2])));
    cJSON_AddNumberToObject(root, "kda_hit_ratio_k3_one_rtt_minus_lease_all",
                            ratio((double)r[2].kda_hit_blocks, (double)r[2].blocks) -
                                ratio((double)r[0].kda_hit_blocks, (double)r[0].blocks));
    cJSON_AddNumberToObject(root, "kda_keys_leased_ratio_lease_all_over_selective", ratio(kda_all, kda_sel));
    cJSON_AddNumberToObject(root, "kda_hit_ratio_selective_minus_lease_all",
                            ratio((double)r[1].kda_hit_blocks, (double)r[1].blocks) -
                                ratio((double)r[0].kda_hit_blocks, (double)r[0].blocks));
    bench_print_json(root);
    return 0;
}

static int plot_and_series(const trace_opts *o, const run_result r[NMODES], size_t n)
{
    char tmp[] = "/tmp/moonlet-trace-XXXXXX";
    const char *series = o->series;
    if (!series && o->plot) {
        int fd = mkstemp(tmp);
        if (fd < 0)
            return -1;
        close(fd);
        series = tmp;
    }
    int rc = series ? write_series(series, r, n, o) : 0;
    if (!rc && o->plot)
        rc = bench_run_plot("trace", "plot_trace.py", series, o->plot);
    if (series == tmp)
        unlink(tmp);
    return rc;
}

int bench_trace_main(int argc, char **argv)
{
    trace_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    trace t = {0};
    working_set ws;
    trace_model model = model_of(&o);
    if (trace_load(o.path, o.limit, &t) || working_set_of(&t, &model, &ws)) {
        trace_free(&t);
        return 1;
    }
    uint64_t capacity = (uint64_t)((double)ws.bytes * o.capacity_fraction + 0.5);
    uint64_t per_store = (capacity / o.stores + 4095) / 4096 * 4096;
    if (per_store < (1u << 20)) {
        fprintf(stderr, "moonlet-bench trace: %llu bytes per store node is below the 1 MiB minimum; "
                        "raise --kv-bytes/--kda-bytes or --limit, or lower --stores\n",
                (unsigned long long)per_store);
        trace_free(&t);
        return 2;
    }
    run_result r[NMODES];
    memset(r, 0, sizeof(r));
    /* The disk run: each node's tier a share of the working set's disk extents
     * (a header block per object, bytes in whole blocks) times --disk-fraction. */
    uint64_t disk_ws = ws.kv_objects * moonlet_disk_footprint(64, o.kv_bytes) +
                       ws.checkpoints * o.ranks * moonlet_disk_footprint(64, o.kda_bytes);
    uint64_t per_disk = 0;
    if (o.disk_fraction > 0) {
        per_disk = (uint64_t)((double)disk_ws * o.disk_fraction / o.stores);
        per_disk = (per_disk + (1u << 20) - 1) / (1u << 20) * (1u << 20); /* whole MiB */
    }
    rc = replay(&t, &o, MOONLET_K3_LEASE_ALL, per_store, 0, &r[0]) ||
         replay(&t, &o, MOONLET_K3_SELECTIVE_TWO_CALLS, per_store, 0, &r[1]) ||
         replay(&t, &o, MOONLET_K3_SELECTIVE, per_store, 0, &r[2]) ||
         (per_disk && replay(&t, &o, MOONLET_K3_SELECTIVE, per_store, per_disk, &r[3]));
    if (!rc)
        rc = emit(&t, &o, &ws, per_store * o.stores, per_disk * o.stores, r) ||
             plot_and_series(&o, r, t.n);
    for (int m = 0; m < NMODES; m++)
        run_free(&r[m]);
    trace_free(&t);
    if (rc)
        fprintf(stderr, "moonlet-bench trace: failed\n");
    return rc ? 1 : 0;
}
