/*
 * scale.c - `moonlet-bench scale`: the master at cluster scale.
 *
 * Every node count of --nodes (default 100,1000,10000) gets a moonlet-master
 * of its own, all running side by side in one run; the phases below run for
 * all of them at once, and the side client's rounds alternate between the
 * masters, so a noisy neighbour on this shared machine slows every count
 * alike and the ratios between counts hold.  For each count:
 *   1. simulated store nodes mount one segment each over the real protocol
 *      (MountSegment from SIMS pipelined connections, a few threads; a
 *      node's pings come over the connection that mounted it, as a real
 *      node's do) and then ping at 1 Hz, in bursts every 100 ms;
 *   2. --objects objects (4 KiB, one replica) are put with the node that
 *      holds each one named as the preferred segment, so the bench knows
 *      which keys a node's death takes away;
 *   3. idle window: master CPU (utime+stime from /proc/PID/stat, % of one
 *      core) and RSS with only the ping load;
 *   4. steady window: a client on the side measures Ping, PutStart, PutEnd
 *      and BatchExistKey(640) of keys on nodes that stay (paced: one round
 *      every 2 ms);
 *   5. silent window: a tenth of the nodes stop pinging at once; the same
 *      client measurements run from then until the master has unmounted
 *      them all (liveness TTL --ttl-sec) plus one second.
 * Every figure comes from this one run; the ratio of each p99 to its value
 * at the first node count, and of the silent window's BatchExistKey p99
 * to the steady one's, are printed beside the targets of issue 19.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "master_client.h"
#include "methods.h"
#include "moonlet/error.h"
#include "rpc_client.h"
#include "wire.h"

#define SIMS 4            /* simulator connections (one thread each) */
#define WINDOW 256        /* requests in flight per connection */
#define NODE_SEG_BYTES (1ull << 30) /* bookkeeping only: no memory behind it */
#define OBJ_BYTES 4096
#define BATCH 640
#define MAX_COUNTS 8

static void node_id(uint32_t i, char *out, size_t cap) { snprintf(out, cap, "node-%06u", i); }
static void obj_key(uint64_t i, char *out, size_t cap) { snprintf(out, cap, "obj-%010" PRIu64, i); }

/* ---- simulated nodes ----------------------------------------------------------- */

struct sim {
    moonlet_rpc_client *c;
    uint32_t first, n;          /* nodes [first, first + n) */
    const _Atomic bool *silent; /* by node */
    _Atomic bool *stop;
    _Atomic uint64_t pings, ping_errors;
    pthread_t th;
};

/* Receives `n` replies; counts the ones that failed. */
static int recv_n(moonlet_rpc_client *c, uint32_t n, uint64_t *failed)
{
    for (uint32_t k = 0; k < n; k++) {
        moonlet_reply rep;
        int rc = moonlet_rpc_client_recv(c, &rep);
        if (rc)
            return rc;
        if (rep.code)
            (*failed)++;
        moonlet_reply_destroy(&rep);
    }
    return 0;
}

/* Mounts the sim's nodes, pipelined; returns the number refused (or -1). */
static int64_t sim_mount(struct sim *s)
{
    uint64_t refused = 0;
    char id[32], ep[32];
    for (uint32_t base = 0; base < s->n; base += WINDOW) {
        uint32_t end = base + WINDOW < s->n ? base + WINDOW : s->n;
        for (uint32_t i = base; i < end; i++) {
            uint32_t node = s->first + i;
            node_id(node, id, sizeof(id));
            snprintf(ep, sizeof(ep), "10.%u.%u.%u:7000", node >> 16, (node >> 8) & 255, node & 255);
            msgpack_packer *pk = moonlet_rpc_client_begin(s->c, MOONLET_M_MOUNT_SEGMENT, 7);
            moonlet_pack_cstr(pk, id);       /* client id */
            moonlet_pack_cstr(pk, id);       /* segment id */
            moonlet_pack_cstr(pk, id);       /* name: what preferred_segments names */
            msgpack_pack_uint64(pk, 0);
            msgpack_pack_uint64(pk, NODE_SEG_BYTES);
            moonlet_pack_cstr(pk, ep);
            moonlet_pack_cstr(pk, "tcp");
            uint64_t rid;
            if (moonlet_rpc_client_send(s->c, &rid))
                return -1;
        }
        if (recv_n(s->c, end - base, &refused))
            return -1;
    }
    return (int64_t)refused;
}

static void sleep_until(uint64_t t_ns)
{
    struct timespec ts = {(time_t)(t_ns / 1000000000ull), (long)(t_ns % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* 1 Hz per node: every 100 ms, a tenth of the sim's live nodes, pipelined. */
static void *sim_ping_main(void *arg)
{
    struct sim *s = arg;
    char id[32];
    uint64_t next = bench_now_ns();
    for (uint32_t tick = 0; !atomic_load(s->stop); tick++) {
        next += 100 * 1000000ull;
        uint32_t from = (uint32_t)((uint64_t)s->n * (tick % 10) / 10);
        uint32_t to = (uint32_t)((uint64_t)s->n * (tick % 10 + 1) / 10);
        uint32_t inflight = 0;
        uint64_t failed = 0;
        for (uint32_t i = from; i < to; i++) {
            uint32_t node = s->first + i;
            if (atomic_load(&s->silent[node]))
                continue;
            node_id(node, id, sizeof(id));
            msgpack_packer *pk = moonlet_rpc_client_begin(s->c, MOONLET_M_PING, 1);
            moonlet_pack_cstr(pk, id);
            uint64_t rid;
            if (moonlet_rpc_client_send(s->c, &rid))
                return NULL;
            if (++inflight == WINDOW) {
                if (recv_n(s->c, inflight, &failed))
                    return NULL;
                atomic_fetch_add(&s->pings, inflight);
                inflight = 0;
            }
        }
        if (inflight && recv_n(s->c, inflight, &failed))
            return NULL;
        atomic_fetch_add(&s->pings, inflight);
        atomic_fetch_add(&s->ping_errors, failed);
        sleep_until(next);
    }
    return NULL;
}

/* ---- the fill ------------------------------------------------------------------ */

/* PutStart+PutEnd of objects [0, n), object i preferring node i % nodes. */
static int fill(moonlet_rpc_client *c, uint64_t n, uint32_t nodes)
{
    char key[32], pref[32];
    for (int phase = 0; phase < 2; phase++) {
        for (uint64_t base = 0; base < n; base += WINDOW) {
            uint64_t end = base + WINDOW < n ? base + WINDOW : n;
            for (uint64_t i = base; i < end; i++) {
                obj_key(i, key, sizeof(key));
                msgpack_packer *pk;
                if (phase == 0) {
                    pk = moonlet_rpc_client_begin(c, MOONLET_M_PUT_START, 6);
                    moonlet_pack_cstr(pk, "");
                    moonlet_pack_cstr(pk, key);
                    msgpack_pack_uint64(pk, OBJ_BYTES);
                    msgpack_pack_uint64(pk, 1);
                    msgpack_pack_false(pk);
                    node_id((uint32_t)(i % nodes), pref, sizeof(pref));
                    msgpack_pack_array(pk, 1);
                    moonlet_pack_cstr(pk, pref);
                } else {
                    pk = moonlet_rpc_client_begin(c, MOONLET_M_PUT_END, 2);
                    moonlet_pack_cstr(pk, "");
                    moonlet_pack_cstr(pk, key);
                }
                uint64_t rid;
                if (moonlet_rpc_client_send(c, &rid))
                    return -1;
            }
            uint64_t failed = 0;
            if (recv_n(c, (uint32_t)(end - base), &failed))
                return -1;
            if (failed) {
                fprintf(stderr, "moonlet-bench scale: %" PRIu64 " puts failed in the fill\n", failed);
                return -1;
            }
        }
    }
    return 0;
}

/* ---- master CPU -------------------------------------------------------------- */

/* utime + stime of a process in clock ticks (0 when unknown). */
static uint64_t cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = 0;
    const char *p = strrchr(buf, ')'); /* the command may hold spaces */
    if (!p)
        return 0;
    unsigned long ut = 0, st = 0;
    /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return 0;
    return ut + st;
}

struct cpu_mark {
    uint64_t ticks, ns;
};

static struct cpu_mark cpu_mark(pid_t pid) { return (struct cpu_mark){cpu_ticks(pid), bench_now_ns()}; }

/* % of one core used since the mark. */
static double cpu_pct_since(pid_t pid, struct cpu_mark m)
{
    struct cpu_mark now = cpu_mark(pid);
    double secs = (double)(now.ns - m.ns) / 1e9;
    double cpu = (double)(now.ticks - m.ticks) / (double)sysconf(_SC_CLK_TCK);
    return secs > 0 ? 100.0 * cpu / secs : 0;
}

/* ---- the client on the side ------------------------------------------------------ */

struct side {
    moonlet_master_client *mc;
    uint64_t objects, put_seq;
    uint32_t nodes, live_nodes; /* keys on nodes [0, live_nodes) are unaffected */
    unsigned seed;
    bench_samples ping, put_start, put_end, exist;
    uint64_t exist_misses;
};

static double us_since(uint64_t t0) { return (double)(bench_now_ns() - t0) / 1000.0; }

/* A random key on a node that stays (object i lives on node i % nodes). */
static uint64_t unaffected_key(struct side *s)
{
    for (;;) {
        uint64_t i = (uint64_t)rand_r(&s->seed) * 65536u + (uint64_t)rand_r(&s->seed);
        i %= s->objects;
        if (i % s->nodes < s->live_nodes)
            return i;
    }
}

static int side_round(struct side *s, const char *tenant)
{
    static char names[BATCH][32];
    const char *keys[BATCH];
    int32_t r[BATCH];
    uint64_t t0 = bench_now_ns();
    int rc = moonlet_mc_ping(s->mc, "side-node", NULL);
    bench_samples_add(&s->ping, us_since(t0));
    if (rc)
        return rc;
    char key[48];
    snprintf(key, sizeof(key), "side-%" PRIu64, s->put_seq++);
    moonlet_replica_list rl;
    t0 = bench_now_ns();
    rc = moonlet_mc_put_start(s->mc, tenant, key, OBJ_BYTES, 1, false, &rl);
    bench_samples_add(&s->put_start, us_since(t0));
    if (rc)
        return rc;
    moonlet_replica_list_free(&rl);
    t0 = bench_now_ns();
    rc = moonlet_mc_put_end(s->mc, tenant, key);
    bench_samples_add(&s->put_end, us_since(t0));
    if (rc)
        return rc;
    if (!s->objects)
        return 0;
    for (int i = 0; i < BATCH; i++) {
        obj_key(unaffected_key(s), names[i], sizeof(names[i]));
        keys[i] = names[i];
    }
    t0 = bench_now_ns();
    rc = moonlet_mc_batch_exist_key(s->mc, "", keys, BATCH, r);
    bench_samples_add(&s->exist, us_since(t0));
    for (int i = 0; i < BATCH; i++)
        s->exist_misses += r[i] != 1;
    return rc;
}

static void side_reset(struct side *s)
{
    bench_samples_free(&s->ping);
    bench_samples_free(&s->put_start);
    bench_samples_free(&s->put_end);
    bench_samples_free(&s->exist);
    s->exist_misses = 0;
}

static void side_json(cJSON *o, struct side *s)
{
    bench_json_latency(o, "ping", &s->ping);
    bench_json_latency(o, "put_start", &s->put_start);
    bench_json_latency(o, "put_end", &s->put_end);
    bench_json_latency(o, "batch_exist_640", &s->exist);
    cJSON_AddNumberToObject(o, "batch_exist_misses", (double)s->exist_misses);
}

static uint64_t stats_u64(moonlet_master_client *mc, const char *field)
{
    cJSON *st = NULL;
    if (moonlet_mc_stats(mc, &st))
        return UINT64_MAX;
    const cJSON *v = cJSON_GetObjectItem(st, field);
    uint64_t x = cJSON_IsNumber(v) ? (uint64_t)cJSON_GetNumberValue(v) : UINT64_MAX;
    cJSON_Delete(st);
    return x;
}

/* ---- one node count --------------------------------------------------------------- */

struct opts {
    uint64_t objects;
    uint32_t ttl_sec, window_ms;
    double silent_fraction;
};

/* One node count: its master, simulated nodes, filler and side client. */
struct run {
    uint32_t nodes, dead;
    bench_master bm;
    _Atomic bool stop;
    _Atomic bool *silent;
    struct sim sims[SIMS];
    int started;
    moonlet_rpc_client *filler;
    struct side side;
    moonlet_master_client *stats;
    int64_t refused;
    double mount_s, fill_s;
    struct cpu_mark cm;
    uint64_t segs0, t_first, t_done;
    cJSON *o; /* its result object (owned by the output array) */
};

/* Starts the master, mounts the nodes, starts their pings, fills. */
static int run_setup(struct run *r, const struct opts *o)
{
    char ttl[16];
    snprintf(ttl, sizeof(ttl), "%u", o->ttl_sec);
    const char *extra[] = {"--client_live_ttl_sec", ttl, "--log-level", "error", NULL};
    if (bench_master_start(&r->bm, extra)) {
        fprintf(stderr, "moonlet-bench scale: cannot start moonlet-master\n");
        return -1;
    }
    r->side = (struct side){.objects = o->objects, .nodes = r->nodes, .live_nodes = r->nodes,
                            .seed = r->nodes};
    r->silent = calloc(r->nodes, sizeof(*r->silent));
    if (!r->silent || moonlet_mc_create(r->bm.addr, NULL, &r->side.mc) ||
        moonlet_mc_create(r->bm.addr, NULL, &r->stats) ||
        moonlet_rpc_client_connect("127.0.0.1", r->bm.port, NULL, &r->filler))
        return -1;
    moonlet_segment_desc sd = {.client_id = "side-node", .segment_id = "side-node",
                               .name = "side-node", .size = NODE_SEG_BYTES,
                               .endpoint = "127.0.0.1:1", .protocol = "tcp"};
    if (moonlet_mc_mount_segment(r->side.mc, &sd))
        return -1;
    uint64_t t0 = bench_now_ns();
    for (int k = 0; k < SIMS; k++) {
        struct sim *sm = &r->sims[k];
        sm->first = (uint32_t)((uint64_t)r->nodes * k / SIMS);
        sm->n = (uint32_t)((uint64_t)r->nodes * (k + 1) / SIMS) - sm->first;
        sm->silent = r->silent;
        sm->stop = &r->stop;
        if (moonlet_rpc_client_connect("127.0.0.1", r->bm.port, NULL, &sm->c))
            return -1;
        int64_t x = sim_mount(sm);
        if (x < 0)
            return -1;
        r->refused += x;
    }
    r->mount_s = (double)(bench_now_ns() - t0) / 1e9;
    for (; r->started < SIMS; r->started++)
        if (pthread_create(&r->sims[r->started].th, NULL, sim_ping_main, &r->sims[r->started]))
            return -1;
    t0 = bench_now_ns();
    if (o->objects && fill(r->filler, o->objects, r->nodes))
        return -1;
    r->fill_s = (double)(bench_now_ns() - t0) / 1e9;
    r->dead = (uint32_t)((double)r->nodes * o->silent_fraction);
    r->side.live_nodes = r->nodes - r->dead; /* the same keys before and during */
    return 0;
}

static void run_teardown(struct run *r)
{
    atomic_store(&r->stop, true);
    for (int k = 0; k < r->started; k++)
        pthread_join(r->sims[k].th, NULL);
    for (int k = 0; k < SIMS; k++)
        moonlet_rpc_client_close(r->sims[k].c);
    moonlet_rpc_client_close(r->filler);
    moonlet_mc_destroy(r->side.mc);
    moonlet_mc_destroy(r->stats);
    side_reset(&r->side);
    free(r->silent);
    if (r->bm.pid > 0)
        bench_master_stop(&r->bm);
}

static uint64_t pings_of(const struct run *r, uint64_t *errors)
{
    uint64_t n = 0;
    for (int k = 0; k < SIMS; k++) {
        n += atomic_load(&r->sims[k].pings);
        if (errors)
            *errors += atomic_load(&r->sims[k].ping_errors);
    }
    return n;
}

/* All node counts at once, each against its own master: the side client's
 * rounds alternate between the masters, so a noisy neighbour slows every
 * count alike and the ratios between counts hold. */
static int run_all(struct run *runs, int n, const struct opts *o, cJSON *out)
{
    for (int i = 0; i < n; i++)
        if (run_setup(&runs[i], o)) {
            fprintf(stderr, "moonlet-bench scale: setting up %u nodes failed\n", runs[i].nodes);
            return -1;
        }
    /* pings only */
    uint64_t p0[MAX_COUNTS];
    for (int i = 0; i < n; i++) {
        runs[i].cm = cpu_mark(runs[i].bm.pid);
        p0[i] = pings_of(&runs[i], NULL);
    }
    sleep_until(bench_now_ns() + (uint64_t)o->window_ms * 1000000ull);
    for (int i = 0; i < n; i++) {
        struct run *r = &runs[i];
        double cpu = cpu_pct_since(r->bm.pid, r->cm);
        uint64_t errors = 0, p1 = pings_of(r, &errors);
        r->o = cJSON_CreateObject();
        cJSON_AddItemToArray(out, r->o);
        cJSON_AddNumberToObject(r->o, "nodes", r->nodes);
        cJSON_AddNumberToObject(r->o, "mounts_refused", (double)r->refused);
        cJSON_AddNumberToObject(r->o, "mount_seconds", r->mount_s);
        cJSON_AddNumberToObject(r->o, "objects", (double)o->objects);
        cJSON_AddNumberToObject(r->o, "fill_seconds", r->fill_s);
        cJSON_AddNumberToObject(r->o, "pings_per_second",
                                (double)(p1 - p0[i]) / ((double)o->window_ms / 1000.0));
        cJSON_AddNumberToObject(r->o, "ping_errors", (double)errors);
        cJSON_AddNumberToObject(r->o, "master_cpu_pct_pings_only", cpu);
        cJSON_AddNumberToObject(r->o, "master_rss_bytes", (double)bench_rss_bytes(r->bm.pid));
    }
    /* steady: one round against each master in turn, every 2 ms */
    for (int i = 0; i < n; i++)
        runs[i].cm = cpu_mark(runs[i].bm.pid);
    uint64_t end = bench_now_ns() + (uint64_t)o->window_ms * 1000000ull, next = bench_now_ns();
    while (bench_now_ns() < end) {
        for (int i = 0; i < n; i++)
            if (side_round(&runs[i].side, ""))
                return -1;
        next += 2000000ull;
        sleep_until(next);
    }
    for (int i = 0; i < n; i++) {
        struct run *r = &runs[i];
        cJSON_AddNumberToObject(r->o, "master_cpu_pct_with_client", cpu_pct_since(r->bm.pid, r->cm));
        side_json(cJSON_AddObjectToObject(r->o, "steady"), &r->side);
        side_reset(&r->side);
    }
    /* silent: a tenth of every count's nodes at once */
    for (int i = 0; i < n; i++) {
        struct run *r = &runs[i];
        r->segs0 = stats_u64(r->stats, "segments");
        for (uint32_t k = r->nodes - r->dead; k < r->nodes; k++)
            atomic_store(&r->silent[k], true);
        r->cm = cpu_mark(r->bm.pid);
    }
    uint64_t t_silent = bench_now_ns();
    uint64_t cap = t_silent + (o->ttl_sec + 120ull) * 1000000000ull, t_all = 0;
    next = bench_now_ns();
    for (uint32_t round = 0; bench_now_ns() < cap; round++) {
        for (int i = 0; i < n; i++) {
            struct run *r = &runs[i];
            if (side_round(&r->side, ""))
                return -1;
            if (round % 25 == 0 && !r->t_done) {
                uint64_t segs = stats_u64(r->stats, "segments");
                if (segs < r->segs0 && !r->t_first)
                    r->t_first = bench_now_ns();
                if (segs <= r->segs0 - r->dead)
                    r->t_done = bench_now_ns();
            }
        }
        bool all = true;
        for (int i = 0; i < n; i++)
            all &= runs[i].t_done != 0;
        if (all && !t_all)
            t_all = bench_now_ns();
        if (t_all && bench_now_ns() > t_all + 1000000000ull)
            break;
        next += 2000000ull;
        sleep_until(next);
    }
    for (int i = 0; i < n; i++) {
        struct run *r = &runs[i];
        cJSON *sil = cJSON_AddObjectToObject(r->o, "silent");
        cJSON_AddNumberToObject(sil, "nodes_silent", r->dead);
        cJSON_AddBoolToObject(sil, "all_unmounted", r->t_done != 0);
        cJSON_AddNumberToObject(sil, "unmount_span_seconds", r->t_done && r->t_first ?
                                (double)(r->t_done - r->t_first) / 1e9 : -1);
        cJSON_AddNumberToObject(sil, "window_seconds", (double)(bench_now_ns() - t_silent) / 1e9);
        cJSON_AddNumberToObject(sil, "master_cpu_pct", cpu_pct_since(r->bm.pid, r->cm));
        cJSON_AddNumberToObject(sil, "objects_left", (double)stats_u64(r->stats, "objects"));
        side_json(sil, &r->side);
        side_reset(&r->side);
    }
    return 0;
}

static double p99_of(const cJSON *run, const char *phase, const char *what)
{
    const cJSON *p = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(run, phase), what),
                                         "p99_us");
    return cJSON_IsNumber(p) ? cJSON_GetNumberValue(p) : 0;
}

int bench_scale_main(int argc, char **argv)
{
    uint32_t counts[MAX_COUNTS] = {100, 1000, 10000};
    int ncounts = 3, json = 0;
    struct opts o = {.objects = 200000, .ttl_sec = 3, .window_ms = 5000, .silent_fraction = 0.1};
    static const struct option lopts[] = {
        {"nodes", required_argument, 0, 'n'},   {"objects", required_argument, 0, 'o'},
        {"ttl-sec", required_argument, 0, 't'}, {"window-ms", required_argument, 0, 'w'},
        {"json", no_argument, 0, 'j'},          {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", lopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            if (bench_parse_counts(optarg, 1000000, counts, MAX_COUNTS, &ncounts)) {
                fprintf(stderr, "moonlet-bench scale: --nodes wants counts like 100,1000,10000\n");
                return 2;
            }
            break;
        case 'o': o.objects = strtoull(optarg, NULL, 10); break;
        case 't': o.ttl_sec = (uint32_t)atoi(optarg); break;
        case 'w': o.window_ms = (uint32_t)atoi(optarg); break;
        case 'j': json = 1; break;
        case 'h':
            printf("usage: moonlet-bench scale [--nodes 100,1000,10000] [--objects N] "
                   "[--ttl-sec S] [--window-ms MS] [--json]\n");
            return 0;
        default: return 2;
        }
    }
    if (o.ttl_sec == 0 || o.window_ms < 500 || (o.objects && o.objects < BATCH)) {
        fprintf(stderr, "moonlet-bench scale: need --ttl-sec >= 1, --window-ms >= 500, "
                "--objects 0 or >= %d\n", BATCH);
        return 2;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON *runs = cJSON_AddArrayToObject(root, "runs");
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double load[3] = {0};
    if (getloadavg(load, 3) < 0)
        load[0] = -1;
    cJSON_AddNumberToObject(root, "cpus", (double)ncpu);
    cJSON_AddNumberToObject(root, "loadavg_1min_at_start", load[0]);
    cJSON_AddNumberToObject(root, "ttl_sec", o.ttl_sec);
    cJSON_AddNumberToObject(root, "window_ms", o.window_ms);
    struct run *rs = calloc((size_t)ncounts, sizeof(*rs));
    if (!rs)
        return 1;
    for (int i = 0; i < ncounts; i++)
        rs[i].nodes = counts[i];
    int rc = run_all(rs, ncounts, &o, runs);
    for (int i = 0; i < ncounts; i++)
        run_teardown(&rs[i]);
    free(rs);
    if (getloadavg(load, 3) >= 0)
        cJSON_AddNumberToObject(root, "loadavg_1min_at_end", load[0]);
    /* ratios against the smallest count, and silent vs steady */
    const cJSON *base = cJSON_GetArrayItem(runs, 0), *run;
    static const char *const what[] = {"ping", "put_start", "put_end", "batch_exist_640"};
    cJSON_ArrayForEach(run, runs) {
        cJSON *r = cJSON_AddObjectToObject((cJSON *)run, "p99_ratio_vs_first");
        for (int k = 0; k < 4; k++) {
            double b = p99_of(base, "steady", what[k]);
            cJSON_AddNumberToObject(r, what[k], b > 0 ? p99_of(run, "steady", what[k]) / b : 0);
        }
        double st = p99_of(run, "steady", "batch_exist_640");
        if (cJSON_GetObjectItem(run, "silent"))
            cJSON_AddNumberToObject((cJSON *)run, "silent_vs_steady_batch_exist_p99",
                                    st > 0 ? p99_of(run, "silent", "batch_exist_640") / st : 0);
    }
    cJSON_AddNumberToObject(root, "target_p99_ratio_max", 2.0);
    cJSON_AddNumberToObject(root, "target_master_cpu_pct_pings_max", 5.0);
    if (json) {
        bench_print_json(root);
    } else {
        printf("%7s %8s %7s %9s %8s %9s %9s %9s %9s %10s\n", "nodes", "refused", "cpu%", "rss MiB",
               "ping99", "pstart99", "pend99", "exist99", "silent99", "unmount s");
        cJSON_ArrayForEach(run, runs) {
            const cJSON *sil = cJSON_GetObjectItem(run, "silent");
            printf("%7.0f %8.0f %7.2f %9.1f %8.0f %9.0f %9.0f %9.0f %9.0f %10.2f\n",
                   cJSON_GetNumberValue(cJSON_GetObjectItem(run, "nodes")),
                   cJSON_GetNumberValue(cJSON_GetObjectItem(run, "mounts_refused")),
                   cJSON_GetNumberValue(cJSON_GetObjectItem(run, "master_cpu_pct_pings_only")),
                   cJSON_GetNumberValue(cJSON_GetObjectItem(run, "master_rss_bytes")) / 1048576.0,
                   p99_of(run, "steady", "ping"), p99_of(run, "steady", "put_start"),
                   p99_of(run, "steady", "put_end"), p99_of(run, "steady", "batch_exist_640"),
                   sil ? p99_of(run, "silent", "batch_exist_640") : 0,
                   sil ? cJSON_GetNumberValue(cJSON_GetObjectItem(sil, "unmount_span_seconds")) : 0);
        }
        cJSON_Delete(root);
    }
    return rc ? 1 : 0;
}
