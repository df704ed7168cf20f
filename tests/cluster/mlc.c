/*
 * mlc - the cluster tests' load client (built, not installed).
 *
 * The multi-host harness (tests/cluster/) runs this inside the client
 * network namespaces to drive a real cluster through the public C client
 * (include/moonlet/client.h) only, and reads its one JSON document on
 * stdout.  It exists because a fault test needs three things no other tool
 * gives it: bytes that any host can check without having written them,
 * every outcome counted by error code rather than stopping at the first,
 * and a bounded running time whatever the cluster does.
 *
 *   mlc --master HOST:PORT [options] put|get|remove|probe|mixed [KEY...]
 *
 * Content.  An object's bytes are a function of its key, the --seed and its
 * length: a splitmix64 stream in counter mode, seeded from
 * XXH3(key, seed) and the length.  Its size is also a function of key and
 * seed (log-uniform between --min-size and --max-size, the shape of a KV
 * cache where small blocks outnumber large ones).  So `get --verify` on
 * another host checks every byte of what `put` wrote, and an object read
 * with the wrong length or from the wrong place cannot pass.
 *
 * Keys are the KEY operands, or --prefix P with --count N (and --start I):
 * P000000, P000001, ...  put/get/remove spread them over --threads threads;
 * with --rate N the i-th key starts no earlier than i/N s after the start
 * (a paced stream across a fault), and --per-key reports each key's start
 * as at_ms after t0_mono_ms (CLOCK_MONOTONIC, comparable with the daemons'
 * logs on the same host).
 * `mixed --seconds T` runs puts, gets (own keys and, with --peer-prefix,
 * the other host's, reported apart as peer_get), probes and removes from
 * every thread until T passes or SIGTERM/SIGINT arrives, and reports each
 * operation's outcomes by code, wrong-byte reads, wrong probe answers and a
 * per-second timeline.
 *
 * Nothing here retries: every outcome is reported as it happened.  Each call
 * is bounded by the client's --rpc-timeout-ms and --transfer-timeout-ms, so
 * every command ends.  Exit 0 when the command ran (whatever the operations
 * returned), 1 when the master could not be reached, 2 on bad usage.
 */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "bytesize.h"
#include "log.h"
#include "moonlet/client.h"
#include "monotime.h"

#define PROG "mlc"
#define MAX_THREADS 64
#define MAX_KEY 512
#define NCODES 2001 /* counts indexed by -code; the lowest moonlet code is -2000 (NOT_LEADER) */
#define WRONG_BYTES_NAME "WRONG_BYTES"

/* ---- options ------------------------------------------------------------------ */

typedef struct mlc_opts {
    const char *master, *tenant, *prefix, *peer_prefix, *command, *mode, *source_addr;
    const char *tls_ca, *tls_cert, *tls_key; /* --tls-*: TLS to the master */
    moonlet_protocol protocol;
    uint32_t rpc_timeout_ms, transfer_timeout_ms, replicas, threads, candidate_size;
    uint64_t seed, min_size, max_size, count, start, live_max, lease_ms;
    double seconds, rate;
    bool verify, per_key, size_given;
    char **keys; /* KEY operands */
    size_t nkeys;
} mlc_opts;

static mlc_opts g_o;
static moonlet_client *g_cli;
static atomic_bool g_stop;

/* ---- deterministic content ---------------------------------------------------------- */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t key_hash(const char *key, uint64_t seed)
{
    return XXH3_64bits_withSeed(key, strlen(key), seed);
}

/* Log-uniform in [min, max], from the key and seed. */
static uint64_t object_size(const char *key)
{
    if (g_o.min_size >= g_o.max_size)
        return g_o.min_size;
    double u = (double)(mix64(key_hash(key, g_o.seed) ^ 0x5151) >> 11) * 0x1.0p-53;
    double lo = log((double)g_o.min_size), hi = log((double)g_o.max_size);
    uint64_t s = (uint64_t)llround(exp(lo + u * (hi - lo)));
    return s < g_o.min_size ? g_o.min_size : s > g_o.max_size ? g_o.max_size : s;
}

static uint64_t stream_seed(const char *key, uint64_t len)
{
    return mix64(key_hash(key, g_o.seed) + len * 0x9E3779B97F4A7C15ull);
}

/* Word i of the stream is mix64(seed + i * golden): random access, no state. */
static void content_block(uint64_t s, uint64_t first_word, unsigned char *out, size_t len)
{
    for (size_t i = 0; i < len; i += 8) {
        uint64_t w = mix64(s + (first_word + i / 8) * 0x9E3779B97F4A7C15ull);
        memcpy(out + i, &w, len - i < 8 ? len - i : 8);
    }
}

static void content_fill(const char *key, unsigned char *buf, uint64_t len)
{
    content_block(stream_seed(key, len), 0, buf, len);
}

/* True when buf holds exactly the bytes `key` of that length must have. */
static bool content_check(const char *key, const unsigned char *buf, uint64_t len)
{
    unsigned char want[4096];
    uint64_t s = stream_seed(key, len);
    for (uint64_t off = 0; off < len; off += sizeof(want)) {
        size_t n = len - off < sizeof(want) ? (size_t)(len - off) : sizeof(want);
        content_block(s, off / 8, want, n);
        if (memcmp(want, buf + off, n) != 0)
            return false;
    }
    return true;
}

/* ---- small helpers -------------------------------------------------------------------- */

static int code_index(int rc)
{
    return rc <= 0 && -rc < NCODES ? -rc : NCODES - 1;
}

static const char *result_name(int rc, bool wrong)
{
    return wrong ? WRONG_BYTES_NAME : rc == 0 ? "OK" : moonlet_strerror(rc);
}

static void key_at(char *buf, size_t cap, const char *prefix, uint64_t i, int width)
{
    snprintf(buf, cap, "%s%0*" PRIu64, prefix, width, i);
}

/* The i-th key of a put/get/remove command. */
static void cmd_key(char *buf, size_t cap, uint64_t i)
{
    if (g_o.nkeys)
        snprintf(buf, cap, "%s", g_o.keys[i]);
    else
        key_at(buf, cap, g_o.prefix, g_o.start + i, 6);
}

static uint64_t cmd_nkeys(void)
{
    return g_o.nkeys ? g_o.nkeys : g_o.count;
}

/* Adds {"NAME": count} for every non-zero code count (0 excluded). */
static cJSON *codes_json(const uint64_t *counts, uint64_t wrong)
{
    cJSON *o = cJSON_CreateObject();
    for (int i = 1; i < NCODES; i++)
        if (counts[i])
            cJSON_AddNumberToObject(o, moonlet_strerror(-i), (double)counts[i]);
    if (wrong)
        cJSON_AddNumberToObject(o, WRONG_BYTES_NAME, (double)wrong);
    return o;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static cJSON *latency_json(double *ms, size_t n)
{
    cJSON *o = cJSON_CreateObject();
    if (!n)
        return o;
    qsort(ms, n, sizeof(*ms), cmp_double);
    cJSON_AddNumberToObject(o, "p50", ms[n / 2]);
    cJSON_AddNumberToObject(o, "p90", ms[(size_t)((double)n * 0.9)]);
    cJSON_AddNumberToObject(o, "p99", ms[(size_t)((double)n * 0.99)]);
    cJSON_AddNumberToObject(o, "max", ms[n - 1]);
    return o;
}

static void print_json(cJSON *doc)
{
    char *s = cJSON_PrintUnformatted(doc);
    if (s) {
        puts(s);
        free(s);
    }
    fflush(stdout);
    cJSON_Delete(doc);
}

/* ---- one operation of each kind ---------------------------------------------------------- */

static int op_put(const char *key, unsigned char *buf, uint64_t *len)
{
    *len = object_size(key);
    content_fill(key, buf, *len);
    moonlet_put_options po = {.replica_num = g_o.replicas};
    return moonlet_client_put(g_cli, key, buf, (size_t)*len, &po);
}

/* A get; *wrong is set when bytes arrived but are not the key's. */
static int op_get(const char *key, bool verify, uint64_t *len, bool *wrong)
{
    void *buf = NULL;
    size_t n = 0;
    int rc = moonlet_client_get_alloc(g_cli, key, NULL, &buf, &n);
    *len = n;
    *wrong = false;
    if (rc == 0 && verify)
        *wrong = !content_check(key, buf, n) || (g_o.size_given && n != object_size(key));
    moonlet_free(buf);
    return rc;
}

/* ---- put / get / remove over a key list ------------------------------------------------------ */

typedef struct batch_state {
    atomic_uint_fast64_t next;
    uint64_t n;
    double t0;        /* moonlet_mono_s() at the start */
    double *at;       /* per key: its start, seconds after t0 */
    int *rc;          /* per key */
    bool *wrong;      /* per key */
    double *ms;       /* per key */
    uint64_t *len;    /* per key */
} batch_state;

static void *batch_worker(void *arg)
{
    batch_state *b = arg;
    unsigned char *buf = NULL;
    if (strcmp(g_o.command, "put") == 0 && !(buf = malloc(g_o.max_size ? g_o.max_size : 1)))
        return NULL;
    for (;;) {
        uint64_t i = atomic_fetch_add(&b->next, 1);
        if (i >= b->n || atomic_load(&g_stop))
            break;
        char key[MAX_KEY];
        cmd_key(key, sizeof(key), i);
        double t0 = moonlet_mono_s();
        if (g_o.rate > 0 && b->t0 + (double)i / g_o.rate > t0) { /* paced: key i at i/rate */
            usleep((useconds_t)((b->t0 + (double)i / g_o.rate - t0) * 1e6));
            t0 = moonlet_mono_s();
        }
        b->at[i] = t0 - b->t0;
        if (buf)
            b->rc[i] = op_put(key, buf, &b->len[i]);
        else if (strcmp(g_o.command, "get") == 0)
            b->rc[i] = op_get(key, g_o.verify, &b->len[i], &b->wrong[i]);
        else
            b->rc[i] = moonlet_client_remove(g_cli, key, NULL);
        b->ms[i] = (moonlet_mono_s() - t0) * 1e3;
    }
    free(buf);
    return NULL;
}

static int run_batch(void)
{
    uint64_t n = cmd_nkeys();
    batch_state b = {.n = n};
    atomic_init(&b.next, 0);
    b.rc = calloc(n ? n : 1, sizeof(*b.rc));
    b.wrong = calloc(n ? n : 1, sizeof(*b.wrong));
    b.ms = calloc(n ? n : 1, sizeof(*b.ms));
    b.len = calloc(n ? n : 1, sizeof(*b.len));
    b.at = calloc(n ? n : 1, sizeof(*b.at));
    double *sorted = calloc(n ? n : 1, sizeof(*sorted));
    if (!b.rc || !b.wrong || !b.ms || !b.len || !b.at || !sorted) {
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    for (uint64_t i = 0; i < n; i++)
        b.rc[i] = MOONLET_ERR_INTERNAL_ERROR; /* not run (interrupted) unless overwritten */
    pthread_t th[MAX_THREADS];
    uint32_t nth = g_o.threads;
    double t0 = moonlet_mono_s();
    b.t0 = t0;
    for (uint32_t t = 0; t < nth; t++)
        if (pthread_create(&th[t], NULL, batch_worker, &b) != 0)
            nth = t;
    for (uint32_t t = 0; t < nth; t++)
        pthread_join(th[t], NULL);
    double secs = moonlet_mono_s() - t0;

    static uint64_t counts[NCODES];
    uint64_t ok = 0, wrong = 0, bytes = 0;
    cJSON *doc = cJSON_CreateObject(), *per = NULL;
    cJSON_AddStringToObject(doc, "cmd", g_o.command);
    cJSON_AddNumberToObject(doc, "keys", (double)n);
    cJSON_AddNumberToObject(doc, "t0_mono_ms", round(t0 * 1e5) / 100);
    if (g_o.per_key)
        per = cJSON_CreateArray();
    for (uint64_t i = 0; i < n; i++) {
        if (b.wrong[i])
            wrong++;
        else if (b.rc[i] == 0)
            ok++;
        else
            counts[code_index(b.rc[i])]++;
        if (b.rc[i] == 0)
            bytes += b.len[i];
        sorted[i] = b.ms[i];
        if (per) {
            char key[MAX_KEY];
            cmd_key(key, sizeof(key), i);
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "key", key);
            cJSON_AddStringToObject(e, "result", result_name(b.rc[i], b.wrong[i]));
            cJSON_AddNumberToObject(e, "ms", round(b.ms[i] * 100) / 100);
            cJSON_AddNumberToObject(e, "at_ms", round(b.at[i] * 1e5) / 100);
            cJSON_AddNumberToObject(e, "size", (double)b.len[i]);
            cJSON_AddItemToArray(per, e);
        }
    }
    cJSON_AddNumberToObject(doc, "ok", (double)ok);
    cJSON_AddItemToObject(doc, "errors", codes_json(counts, wrong));
    cJSON_AddNumberToObject(doc, "wrong_bytes", (double)wrong);
    cJSON_AddNumberToObject(doc, "bytes", (double)bytes);
    cJSON_AddNumberToObject(doc, "seconds", round(secs * 1000) / 1000);
    cJSON_AddItemToObject(doc, "latency_ms", latency_json(sorted, n));
    if (per)
        cJSON_AddItemToObject(doc, "per_key", per);
    print_json(doc);
    free(b.rc);
    free(b.wrong);
    free(b.ms);
    free(b.len);
    free(b.at);
    free(sorted);
    return 0;
}

/* ---- probe -------------------------------------------------------------------------- */

static int run_probe(void)
{
    if (!g_o.nkeys) {
        fprintf(stderr, PROG ": probe needs KEY operands\n");
        return 2;
    }
    moonlet_grant_lease_policy pol = {.lease_mode = MOONLET_PROBE_LEASE_NONE,
                                      .candidate_size = g_o.candidate_size};
    if (strcmp(g_o.mode, "last-hit-only") == 0)
        pol.lease_mode = MOONLET_PROBE_LEASE_LAST_HIT_ONLY;
    else if (strcmp(g_o.mode, "none") != 0) {
        fprintf(stderr, PROG ": --mode: expected none or last-hit-only: '%s'\n", g_o.mode);
        return 2;
    }
    int32_t *res = calloc(g_o.nkeys, sizeof(*res));
    if (!res)
        return 1;
    double t0 = moonlet_mono_s();
    int rc = moonlet_client_batch_probe_key(g_cli, (const char *const *)g_o.keys, g_o.nkeys, pol,
                                            NULL, res);
    double ms = (moonlet_mono_s() - t0) * 1e3;
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "cmd", "probe");
    cJSON_AddStringToObject(doc, "mode", g_o.mode);
    cJSON_AddNumberToObject(doc, "candidate_size", g_o.candidate_size);
    cJSON_AddStringToObject(doc, "result", result_name(rc, false));
    cJSON_AddNumberToObject(doc, "ms", round(ms * 100) / 100);
    cJSON *arr = cJSON_AddArrayToObject(doc, "results");
    for (size_t i = 0; rc == 0 && i < g_o.nkeys; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(res[i]));
    print_json(doc);
    free(res);
    return 0;
}

/* ---- mixed ----------------------------------------------------------------------------- */

/* peer_get: a get of the other host's keys (--peer-prefix) at a guessed
 * index, so OBJECT_NOT_FOUND is an expected answer there and kept apart. */
enum { K_PUT, K_GET, K_PEER_GET, K_PROBE, K_REMOVE, K_N };
static const char *const g_kind[K_N] = {"put", "get", "peer_get", "probe", "remove"};

/* Keys this process put and has not removed, oldest first (a ring).  Reads
 * grant 5 s leases and a leased object cannot be removed, so the oldest
 * half is retired: gets and probes pick only among the younger half, and
 * a remove takes the oldest key once its last read is older than a lease. */
typedef struct live_key {
    uint64_t idx;
    double touched; /* last get or probe of it (moonlet_mono_s) */
} live_key;

typedef struct live_set {
    pthread_mutex_t mu;
    live_key *a;
    size_t cap, head, n;
} live_set;

typedef struct mixed_stats {
    uint64_t counts[K_N][NCODES]; /* [kind][-code]; [kind][0] = ok */
    double max_ms[K_N];
    uint64_t wrong_bytes, probe_wrong;
    uint64_t *tl_ok, *tl_err;    /* per second */
} mixed_stats;

typedef struct mixed_thread {
    pthread_t th;
    uint64_t rng;
    unsigned char *buf;
    mixed_stats st;
} mixed_thread;

static live_set g_live;
static atomic_uint_fast64_t g_next_index;
static double g_t0;
static size_t g_tl_len;

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9E3779B97F4A7C15ull;
    return mix64(*s);
}

static void live_add(uint64_t i)
{
    pthread_mutex_lock(&g_live.mu);
    if (g_live.n == g_live.cap) {
        size_t cap = g_live.cap ? g_live.cap * 2 : 1024;
        live_key *p = malloc(cap * sizeof(*p));
        if (p) {
            for (size_t k = 0; k < g_live.n; k++)
                p[k] = g_live.a[(g_live.head + k) % g_live.cap];
            free(g_live.a);
            g_live.a = p;
            g_live.cap = cap;
            g_live.head = 0;
        }
    }
    if (g_live.n < g_live.cap)
        g_live.a[(g_live.head + g_live.n++) % g_live.cap] = (live_key){.idx = i};
    pthread_mutex_unlock(&g_live.mu);
}

/* A random key among the younger half, marked as just read. */
static bool live_pick(uint64_t *rng, uint64_t *out)
{
    pthread_mutex_lock(&g_live.mu);
    bool have = g_live.n > 0;
    if (have) {
        size_t old = g_live.n / 2;
        size_t k = (g_live.head + old + (size_t)(rng_next(rng) % (g_live.n - old))) % g_live.cap;
        g_live.a[k].touched = moonlet_mono_s();
        *out = g_live.a[k].idx;
    }
    pthread_mutex_unlock(&g_live.mu);
    return have;
}

/* Takes the oldest key when no lease of a read can still hold it. */
static bool live_take_oldest(uint64_t *out)
{
    pthread_mutex_lock(&g_live.mu);
    bool ok = g_live.n > 0 &&
              moonlet_mono_s() - g_live.a[g_live.head].touched > (double)g_o.lease_ms / 1e3 + 0.5;
    if (ok) {
        *out = g_live.a[g_live.head].idx;
        g_live.head = (g_live.head + 1) % g_live.cap;
        g_live.n--;
    }
    pthread_mutex_unlock(&g_live.mu);
    return ok;
}

static size_t live_count(void)
{
    pthread_mutex_lock(&g_live.mu);
    size_t n = g_live.n;
    pthread_mutex_unlock(&g_live.mu);
    return n;
}

static void mixed_note(mixed_thread *m, int kind, int rc, bool bad, double t0)
{
    double t = moonlet_mono_s();
    double ms = (t - t0) * 1e3;
    if (ms > m->st.max_ms[kind])
        m->st.max_ms[kind] = ms;
    m->st.counts[kind][code_index(rc)]++;
    size_t sec = (size_t)(t - g_t0);
    if (sec >= g_tl_len)
        sec = g_tl_len - 1;
    if (rc == 0 && !bad) {
        m->st.tl_ok[sec]++;
    } else {
        m->st.tl_err[sec]++;
        /* one line per failure, so a test can tell which operations of which
         * second failed and how (stderr; the summary has only counts) */
        fprintf(stderr, PROG ": at %.3f s: %s failed: %s\n", t - g_t0, g_kind[kind],
                rc ? moonlet_strerror(rc) : "wrong answer");
    }
}

/* Probe a few live keys and one that never existed, and check the answers
 * that cannot depend on timing: a never-put key is never present, and a
 * LAST_HIT_ONLY mask marks exactly one whole candidate or nothing. */
static void mixed_probe(mixed_thread *m, double t0)
{
    enum { NK = 6 };
    char keys[NK][MAX_KEY];
    const char *kp[NK];
    size_t n = 0;
    for (; n < NK - 1; n++) {
        uint64_t i;
        if (!live_pick(&m->rng, &i))
            break;
        key_at(keys[n], MAX_KEY, g_o.prefix, i, 8);
    }
    snprintf(keys[n], MAX_KEY, "%snever-%" PRIu64, g_o.prefix, rng_next(&m->rng) % 1000000);
    size_t absent = n++;
    if (n % 2)
        n--, absent = SIZE_MAX; /* keep an even count for candidates of 2 */
    if (n == 0)
        return;
    for (size_t i = 0; i < n; i++)
        kp[i] = keys[i];
    bool lho = rng_next(&m->rng) % 4 == 0;
    moonlet_grant_lease_policy pol = {.lease_mode = lho ? MOONLET_PROBE_LEASE_LAST_HIT_ONLY
                                                        : MOONLET_PROBE_LEASE_NONE,
                                      .candidate_size = lho ? 2 : 1};
    int32_t res[NK];
    int rc = moonlet_client_batch_probe_key(g_cli, kp, n, pol, NULL, res);
    bool bad = false;
    if (rc == 0) {
        size_t ones = 0, first = SIZE_MAX;
        for (size_t i = 0; i < n; i++) {
            if (res[i] != 0 && res[i] != 1)
                bad = true;
            if (res[i] == 1) {
                ones++;
                first = first == SIZE_MAX ? i : first;
            }
        }
        if (absent != SIZE_MAX && res[absent] == 1)
            bad = true;
        if (lho && ones && (ones != 2 || first % 2 || res[first + 1] != 1))
            bad = true;
    }
    if (bad)
        m->st.probe_wrong++;
    mixed_note(m, K_PROBE, rc, bad, t0);
}

static void mixed_one(mixed_thread *m)
{
    size_t live = live_count();
    uint64_t r = rng_next(&m->rng) % 100, i, len;
    int kind = r < 30 ? K_PUT : r < 70 ? K_GET : r < 85 ? K_PROBE : K_REMOVE;
    if (live < 8)
        kind = K_PUT;
    else if (kind == K_PUT && live >= g_o.live_max)
        kind = K_REMOVE;
    char key[MAX_KEY];
    if (kind == K_REMOVE && !live_take_oldest(&i))
        kind = live < g_o.live_max ? K_PUT : K_GET; /* nothing removable yet */
    double t0 = moonlet_mono_s();
    if (kind == K_PUT) {
        i = atomic_fetch_add(&g_next_index, 1);
        key_at(key, sizeof(key), g_o.prefix, i, 8);
        int rc = op_put(key, m->buf, &len);
        if (rc == 0)
            live_add(i);
        mixed_note(m, K_PUT, rc, false, t0);
    } else if (kind == K_GET) {
        bool peer = g_o.peer_prefix && rng_next(&m->rng) % 5 == 0;
        if (peer) {
            /* the other host's keys, an index it has likely reached: absent is fine */
            uint64_t hi = atomic_load(&g_next_index) + 16;
            key_at(key, sizeof(key), g_o.peer_prefix, rng_next(&m->rng) % hi, 8);
        } else if (live_pick(&m->rng, &i)) {
            key_at(key, sizeof(key), g_o.prefix, i, 8);
        } else {
            return;
        }
        bool wrong;
        int rc = op_get(key, true, &len, &wrong);
        if (wrong) {
            m->st.wrong_bytes++;
            fprintf(stderr, PROG ": WRONG BYTES reading %s (%" PRIu64 " bytes)\n", key, len);
        }
        mixed_note(m, peer ? K_PEER_GET : K_GET, rc, wrong, t0);
    } else if (kind == K_PROBE) {
        mixed_probe(m, t0);
    } else {
        key_at(key, sizeof(key), g_o.prefix, i, 8);
        int rc = moonlet_client_remove(g_cli, key, NULL);
        if (rc == MOONLET_ERR_OBJECT_HAS_LEASE || rc == MOONLET_ERR_RPC_FAIL ||
            rc == MOONLET_ERR_RPC_TIMEOUT)
            live_add(i); /* still there (or unknown): may be removed later */
        mixed_note(m, K_REMOVE, rc, false, t0);
    }
}

static void *mixed_worker(void *arg)
{
    mixed_thread *m = arg;
    double end = g_t0 + g_o.seconds, next = moonlet_mono_s();
    double gap = g_o.rate > 0 ? (double)g_o.threads / g_o.rate : 0; /* per thread */
    while (!atomic_load(&g_stop) && moonlet_mono_s() < end) {
        mixed_one(m);
        if (gap > 0) {
            next += gap;
            double now = moonlet_mono_s();
            if (next < now - 1.0)
                next = now; /* after a stall, do not burst to catch up */
            else if (next > now)
                usleep((useconds_t)((next - now) * 1e6));
        }
    }
    return NULL;
}

static cJSON *mixed_report(mixed_thread *th, uint32_t nth, double secs)
{
    static mixed_stats sum;
    sum.tl_ok = calloc(g_tl_len, sizeof(uint64_t));
    sum.tl_err = calloc(g_tl_len, sizeof(uint64_t));
    for (uint32_t t = 0; t < nth; t++) {
        for (int k = 0; k < K_N; k++) {
            for (int c = 0; c < NCODES; c++)
                sum.counts[k][c] += th[t].st.counts[k][c];
            if (th[t].st.max_ms[k] > sum.max_ms[k])
                sum.max_ms[k] = th[t].st.max_ms[k];
        }
        sum.wrong_bytes += th[t].st.wrong_bytes;
        sum.probe_wrong += th[t].st.probe_wrong;
        for (size_t s = 0; sum.tl_ok && sum.tl_err && s < g_tl_len; s++) {
            sum.tl_ok[s] += th[t].st.tl_ok[s];
            sum.tl_err[s] += th[t].st.tl_err[s];
        }
    }
    cJSON *doc = cJSON_CreateObject(), *ops = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "cmd", "mixed");
    cJSON_AddNumberToObject(doc, "seconds", round(secs * 1000) / 1000);
    cJSON_AddNumberToObject(doc, "threads", nth);
    cJSON_AddNumberToObject(doc, "t0_mono_ms", round(g_t0 * 1e5) / 100);
    uint64_t total = 0, all_codes[NCODES] = {0};
    for (int k = 0; k < K_N; k++) {
        uint64_t n = 0;
        for (int c = 0; c < NCODES; c++) {
            n += sum.counts[k][c];
            if (c)
                all_codes[c] += sum.counts[k][c];
        }
        total += n;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "ops", (double)n);
        cJSON_AddNumberToObject(o, "ok", (double)sum.counts[k][0]);
        cJSON_AddItemToObject(o, "errors", codes_json(sum.counts[k], 0));
        cJSON_AddNumberToObject(o, "max_ms", round(sum.max_ms[k] * 100) / 100);
        cJSON_AddItemToObject(ops, g_kind[k], o);
    }
    cJSON_AddItemToObject(doc, "ops", ops);
    cJSON_AddNumberToObject(doc, "total_ops", (double)total);
    cJSON_AddItemToObject(doc, "errors", codes_json(all_codes, 0));
    cJSON_AddNumberToObject(doc, "wrong_bytes", (double)sum.wrong_bytes);
    cJSON_AddNumberToObject(doc, "probe_wrong", (double)sum.probe_wrong);
    cJSON_AddNumberToObject(doc, "keys_put", (double)atomic_load(&g_next_index));
    cJSON_AddNumberToObject(doc, "live_keys", (double)live_count());
    cJSON *tl = cJSON_AddArrayToObject(doc, "timeline");
    size_t used = (size_t)ceil(secs);
    for (size_t s = 0; sum.tl_ok && sum.tl_err && s < g_tl_len && s < used; s++) {
        cJSON *pt = cJSON_CreateArray();
        cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)sum.tl_ok[s]));
        cJSON_AddItemToArray(pt, cJSON_CreateNumber((double)sum.tl_err[s]));
        cJSON_AddItemToArray(tl, pt);
    }
    free(sum.tl_ok);
    free(sum.tl_err);
    return doc;
}

static int run_mixed(void)
{
    if (!g_o.prefix || g_o.seconds <= 0) {
        fprintf(stderr, PROG ": mixed needs --prefix and --seconds\n");
        return 2;
    }
    pthread_mutex_init(&g_live.mu, NULL);
    g_tl_len = (size_t)ceil(g_o.seconds) + 2;
    mixed_thread *th = calloc(g_o.threads, sizeof(*th));
    if (!th)
        return 1;
    uint32_t nth = 0;
    g_t0 = moonlet_mono_s();
    for (uint32_t t = 0; t < g_o.threads; t++) {
        th[t].rng = g_o.seed * 1000003u + t;
        th[t].buf = malloc(g_o.max_size ? g_o.max_size : 1);
        th[t].st.tl_ok = calloc(g_tl_len, sizeof(uint64_t));
        th[t].st.tl_err = calloc(g_tl_len, sizeof(uint64_t));
        if (!th[t].buf || !th[t].st.tl_ok || !th[t].st.tl_err ||
            pthread_create(&th[t].th, NULL, mixed_worker, &th[t]) != 0)
            break;
        nth++;
    }
    for (uint32_t t = 0; t < nth; t++)
        pthread_join(th[t].th, NULL);
    print_json(mixed_report(th, nth, moonlet_mono_s() - g_t0));
    for (uint32_t t = 0; t < g_o.threads; t++) {
        free(th[t].buf);
        free(th[t].st.tl_ok);
        free(th[t].st.tl_err);
    }
    free(th);
    free(g_live.a);
    pthread_mutex_destroy(&g_live.mu);
    return nth == g_o.threads ? 0 : 1;
}

/* ---- flags and main ------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --master HOST:PORT [options] COMMAND [KEY...]\n"
            "\n"
            "commands:\n"
            "  put      put the keys (bytes and size derived from key and --seed)\n"
            "  get      read the keys back (--verify: check every byte)\n"
            "  remove   remove the keys\n"
            "  probe    BatchProbeKey over the KEY operands (--mode, --candidate-size)\n"
            "  mixed    puts, gets, probes and removes for --seconds from --threads threads\n"
            "\n"
            "options:\n"
            "  --master HOST:PORT         the master (required)\n"
            "  --tenant T                 tenant (default: the client's default)\n"
            "  --rpc-timeout-ms N         deadline of each master call (default 2000)\n"
            "  --transfer-timeout-ms N    longest transfer wait without progress (default 2000)\n"
            "  --prefix P --count N       keys P000000.. (mixed: P00000000..)  [--start I]\n"
            "  --seed S                   content seed (default 1)\n"
            "  --min-size SIZE            smallest object (default 1KiB)\n"
            "  --max-size SIZE            largest object (default 64KiB); log-uniform between\n"
            "  --replicas R               replicas per put (default 1)\n"
            "  --threads T                parallel workers (default 4, at most 64)\n"
            "  --verify                   get: check the bytes (and, with a size flag, the size)\n"
            "  --per-key                  put/get/remove: list every key's result, time and\n"
            "                             start (at_ms, after t0_mono_ms: CLOCK_MONOTONIC)\n"
            "  --mode none|last-hit-only  probe policy (default none)\n"
            "  --candidate-size K         probe: keys per candidate (default 1)\n"
            "  --seconds T                mixed: how long to run\n"
            "  --peer-prefix P            mixed: also read another client's keys under P\n"
            "  --rate N                   at most N operations a second (default: no limit);\n"
            "                             put/get/remove: the i-th key starts at i/N s\n"
            "  --protocol P               data plane: tcp (default), rdma or auto\n"
            "  --source-addr IP           rdma: the local address to bind (picks the NIC)\n"
            "  --live-max N               mixed: remove rather than put above N live keys (default 400)\n"
            "  --lease-ms N               mixed: the master's read lease; older reads allow a remove\n"
            "                             (default 5000)\n"
            "  --log-level LEVEL          library log level on stderr (default error)\n");
}

enum {
    O_MASTER = 1000, O_TENANT, O_RPC, O_XFER, O_PREFIX, O_COUNT, O_START, O_SEED, O_MIN, O_MAX,
    O_REPL, O_THREADS, O_VERIFY, O_PERKEY, O_MODE, O_CAND, O_SECONDS, O_PEER, O_LIVEMAX, O_LEASE, O_RATE, O_LOG,
    O_PROTO, O_SRC, O_HELP, O_TLS_CA, O_TLS_CERT, O_TLS_KEY
};

static int parse_num(const char *flag, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || s[0] == '-' || v < min || v > max) {
        fprintf(stderr, PROG ": %s: expected an integer in [%" PRIu64 ", %" PRIu64 "]: '%s'\n",
                flag, min, max, s);
        return 1;
    }
    *out = v;
    return 0;
}

static int parse_bytes(const char *flag, const char *s, uint64_t *out)
{
    if (moonlet_bytesize_parse(s, out) || *out == 0 || *out > (UINT64_C(1) << 30)) {
        fprintf(stderr, PROG ": %s: expected a size from 1 to 1GiB: '%s'\n", flag, s);
        return 1;
    }
    return 0;
}

static int parse_flags(int argc, char **argv)
{
    static const struct option opts[] = {
        {"master", required_argument, 0, O_MASTER},
        {"tenant", required_argument, 0, O_TENANT},
        {"rpc-timeout-ms", required_argument, 0, O_RPC},
        {"transfer-timeout-ms", required_argument, 0, O_XFER},
        {"prefix", required_argument, 0, O_PREFIX},
        {"count", required_argument, 0, O_COUNT},
        {"start", required_argument, 0, O_START},
        {"seed", required_argument, 0, O_SEED},
        {"min-size", required_argument, 0, O_MIN},
        {"max-size", required_argument, 0, O_MAX},
        {"replicas", required_argument, 0, O_REPL},
        {"threads", required_argument, 0, O_THREADS},
        {"verify", no_argument, 0, O_VERIFY},
        {"per-key", no_argument, 0, O_PERKEY},
        {"mode", required_argument, 0, O_MODE},
        {"candidate-size", required_argument, 0, O_CAND},
        {"seconds", required_argument, 0, O_SECONDS},
        {"peer-prefix", required_argument, 0, O_PEER},
        {"live-max", required_argument, 0, O_LIVEMAX},
        {"lease-ms", required_argument, 0, O_LEASE},
        {"rate", required_argument, 0, O_RATE},
        {"log-level", required_argument, 0, O_LOG},
        {"help", no_argument, 0, O_HELP},
        {"protocol", required_argument, 0, O_PROTO},
        {"source-addr", required_argument, 0, O_SRC},
        {"tls-ca", required_argument, 0, O_TLS_CA},
        {"tls-cert", required_argument, 0, O_TLS_CERT},
        {"tls-key", required_argument, 0, O_TLS_KEY},
        {0, 0, 0, 0},
    };
    g_o = (mlc_opts){.rpc_timeout_ms = 2000, .transfer_timeout_ms = 2000, .replicas = 1,
                     .threads = 4, .candidate_size = 1, .seed = 1, .min_size = 1024,
                     .max_size = 64 * 1024, .live_max = 400, .lease_ms = 5000, .mode = "none",
                     .protocol = MOONLET_PROTOCOL_TCP};
    moonlet_log_set_level(MOONLET_LOG_ERROR);
    uint64_t v;
    int c, bad = 0;
    opterr = 0;
    while (!bad && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_MASTER: g_o.master = optarg; break;
        case O_SRC: g_o.source_addr = optarg; break;
        case O_TLS_CA: g_o.tls_ca = optarg; break;
        case O_TLS_CERT: g_o.tls_cert = optarg; break;
        case O_TLS_KEY: g_o.tls_key = optarg; break;
        case O_PROTO:
            if (strcmp(optarg, "tcp") == 0)
                g_o.protocol = MOONLET_PROTOCOL_TCP;
            else if (strcmp(optarg, "rdma") == 0)
                g_o.protocol = MOONLET_PROTOCOL_RDMA;
            else if (strcmp(optarg, "auto") == 0)
                g_o.protocol = MOONLET_PROTOCOL_AUTO;
            else {
                fprintf(stderr, PROG ": --protocol: tcp, rdma or auto: '%s'\n", optarg);
                bad = 1;
            }
            break;
        case O_TENANT: g_o.tenant = optarg; break;
        case O_RPC: bad = parse_num("--rpc-timeout-ms", optarg, 1, 600000, &v); g_o.rpc_timeout_ms = (uint32_t)v; break;
        case O_XFER: bad = parse_num("--transfer-timeout-ms", optarg, 1, 600000, &v); g_o.transfer_timeout_ms = (uint32_t)v; break;
        case O_PREFIX: g_o.prefix = optarg; break;
        case O_COUNT: bad = parse_num("--count", optarg, 0, 100000000, &g_o.count); break;
        case O_START: bad = parse_num("--start", optarg, 0, 100000000, &g_o.start); break;
        case O_SEED: bad = parse_num("--seed", optarg, 0, UINT64_MAX, &g_o.seed); break;
        case O_MIN: bad = parse_bytes("--min-size", optarg, &g_o.min_size); g_o.size_given = true; break;
        case O_MAX: bad = parse_bytes("--max-size", optarg, &g_o.max_size); g_o.size_given = true; break;
        case O_REPL: bad = parse_num("--replicas", optarg, 1, 16, &v); g_o.replicas = (uint32_t)v; break;
        case O_THREADS: bad = parse_num("--threads", optarg, 1, MAX_THREADS, &v); g_o.threads = (uint32_t)v; break;
        case O_VERIFY: g_o.verify = true; break;
        case O_PERKEY: g_o.per_key = true; break;
        case O_MODE: g_o.mode = optarg; break;
        case O_CAND: bad = parse_num("--candidate-size", optarg, 1, 1u << 20, &v); g_o.candidate_size = (uint32_t)v; break;
        case O_SECONDS: bad = parse_num("--seconds", optarg, 1, 7 * 86400, &v); g_o.seconds = (double)v; break;
        case O_PEER: g_o.peer_prefix = optarg; break;
        case O_LIVEMAX: bad = parse_num("--live-max", optarg, 16, 10000000, &g_o.live_max); break;
        case O_RATE: bad = parse_num("--rate", optarg, 1, 10000000, &v); g_o.rate = (double)v; break;
        case O_LEASE: bad = parse_num("--lease-ms", optarg, 0, 3600000, &g_o.lease_ms); break;
        case O_LOG: {
            int lvl = moonlet_log_parse_level(optarg);
            bad = lvl < 0;
            if (bad)
                fprintf(stderr, PROG ": --log-level: unknown level '%s'\n", optarg);
            else
                moonlet_log_set_level(lvl);
            break;
        }
        case O_HELP: usage(stdout); exit(0);
        default:
            fprintf(stderr, PROG ": unknown or incomplete option '%s'\n", argv[optind - 1]);
            bad = 1;
        }
    }
    if (!bad && optind < argc) {
        g_o.command = argv[optind++];
        g_o.keys = argv + optind;
        g_o.nkeys = (size_t)(argc - optind);
    }
    if (!bad && (!g_o.master || !g_o.command)) {
        fprintf(stderr, PROG ": --master and a command are required\n");
        bad = 1;
    }
    if (!bad && g_o.min_size > g_o.max_size) {
        fprintf(stderr, PROG ": --min-size is larger than --max-size\n");
        bad = 1;
    }
    bool batch = !bad && (strcmp(g_o.command, "put") == 0 || strcmp(g_o.command, "get") == 0 ||
                          strcmp(g_o.command, "remove") == 0);
    if (batch && !g_o.nkeys && !g_o.prefix) {
        fprintf(stderr, PROG ": %s needs KEY operands or --prefix and --count\n", g_o.command);
        bad = 1;
    }
    if (bad) {
        usage(stderr);
        return 2;
    }
    return 0;
}

static void *signal_thread(void *arg)
{
    sigset_t *set = arg;
    int sig;
    if (sigwait(set, &sig) == 0)
        atomic_store(&g_stop, true); /* workers finish their operation, then report */
    return NULL;
}

int main(int argc, char **argv)
{
    if (parse_flags(argc, argv))
        return 2;
    const char *cmd = g_o.command;
    if (strcmp(cmd, "put") && strcmp(cmd, "get") && strcmp(cmd, "remove") &&
        strcmp(cmd, "probe") && strcmp(cmd, "mixed")) {
        fprintf(stderr, PROG ": unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    static sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    pthread_t sig_th;
    if (pthread_create(&sig_th, NULL, signal_thread, &set) != 0)
        return 1;
    pthread_detach(sig_th);

    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg, sizeof cfg);
    cfg.master_addr = g_o.master;
    cfg.protocol = g_o.protocol;
    cfg.source_addr = g_o.source_addr;
    cfg.tls_ca = g_o.tls_ca;
    cfg.tls_cert = g_o.tls_cert;
    cfg.tls_key = g_o.tls_key;
    cfg.default_tenant = g_o.tenant;
    cfg.rpc_timeout_ms = g_o.rpc_timeout_ms;
    cfg.transfer_timeout_ms = g_o.transfer_timeout_ms;
    cfg.replica_num = g_o.replicas;
    int rc = moonlet_client_create(&cfg, &g_cli);
    if (rc) {
        fprintf(stderr, PROG ": cannot connect to the master at %s: %s\n", g_o.master,
                moonlet_strerror(rc));
        return 1;
    }
    if (strcmp(cmd, "probe") == 0)
        rc = run_probe();
    else if (strcmp(cmd, "mixed") == 0)
        rc = run_mixed();
    else
        rc = run_batch();
    moonlet_client_destroy(g_cli);
    return rc;
}
