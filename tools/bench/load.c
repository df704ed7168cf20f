/*
 * load.c - `moonlet-bench load`: the master under many clients, against
 * Redis measured in the same run.
 *
 * Starts a moonlet-master, a moonlet-store (a TCP segment) and Debian's
 * redis-server (/usr/bin/redis-server, on an ephemeral loopback port, no
 * persistence), all on loopback, and fills both with the same 10,000 small
 * keys.  Then, for each client count N (--clients, default 1,2,4,8,16), N
 * threads each with its own connection run four phases, interleaved in
 * rounds (--rounds, the first phase rotating), each for --phase-ms:
 *   moonlet_exist - BatchExistKey of 640 keys (a MasterClient per thread);
 *   redis_exists  - EXISTS of the same 640 keys (one command);
 *   moonlet_putget - a 4 KiB put of a fresh key through the store node, then
 *                   a get of it (a moonlet_client per thread);
 *   redis_setget  - SET then GET of a 4 KiB value.
 * Reported per N and system: keys/s (exist) or operations/s (put+get: every
 * put and every get is one operation), the p50/p90/p99/p99.9 of each call, and the
 * CPU time per call of the bench's callers and of the servers (the master,
 * plus the store node for put+get, or redis-server; /proc/PID/stat, read
 * around each phase); per N also the host's 1-minute load average, since
 * other work on the host sets both systems' tails.
 * --plot runs tools/bench/plot_load.py with /usr/bin/python3.
 *
 * Redis speaks RESP; the few commands here need no client library, so a
 * minimal blocking RESP client lives below.  redis-server is stopped by its
 * PID (SIGTERM, then SIGKILL after 3 s), like every child this bench starts.
 *
 * Threads: N workers per phase, started together behind a barrier; no locks
 * shared between them beyond the result merge after they are joined.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench.h"
#include "master_client.h"
#include "moonlet/client.h"
#include "moonlet/error.h"

#define NKEYS 10000
#define BATCH 640
#define VALUE_BYTES 4096
#define MAX_CLIENTS 64
#define MAX_COUNTS 16 /* client counts one --clients may list */
#define REDIS_PATH "/usr/bin/redis-server"

static char g_keys[NKEYS][32];

enum { PH_MOON_EXIST, PH_REDIS_EXISTS, PH_MOON_PUTGET, PH_REDIS_SETGET, NPHASES };
static const char *const PHASE_NAMES[NPHASES] = {"moonlet_exist", "redis_exists",
                                                 "moonlet_putget", "redis_setget"};

/* ---- a minimal RESP client ------------------------------------------------------ */

typedef struct resp {
    int fd;
    char *in;
    size_t in_len, in_off, in_cap;
    char *out;
    size_t out_len, out_cap;
} resp;

static int resp_connect(resp *r, uint16_t port)
{
    memset(r, 0, sizeof(*r));
    r->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (r->fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    r->in_cap = 1 << 16;
    r->in = malloc(r->in_cap);
    if (!r->in || connect(r->fd, (struct sockaddr *)&a, sizeof(a))) {
        close(r->fd);
        free(r->in);
        r->fd = -1;
        return -1;
    }
    return 0;
}

static void resp_close(resp *r)
{
    if (r->fd >= 0)
        close(r->fd);
    free(r->in);
    free(r->out);
    memset(r, 0, sizeof(*r));
    r->fd = -1;
}

static int out_put(resp *r, const void *p, size_t n)
{
    if (r->out_len + n > r->out_cap) {
        size_t cap = r->out_cap ? r->out_cap : 4096;
        while (cap < r->out_len + n)
            cap *= 2;
        char *o = realloc(r->out, cap);
        if (!o)
            return -1;
        r->out = o;
        r->out_cap = cap;
    }
    memcpy(r->out + r->out_len, p, n);
    r->out_len += n;
    return 0;
}

/* prefix, n in decimal, CRLF: written by hand, as hiredis does, because
 * snprintf() for each of EXISTS's 641 arguments cost the bench's callers
 * more CPU than the command cost Redis, on the cores Redis runs on. */
static int out_fmt(resp *r, char prefix, size_t n)
{
    char b[24];
    size_t i = sizeof(b);
    b[--i] = '\n';
    b[--i] = '\r';
    do {
        b[--i] = (char)('0' + n % 10);
        n /= 10;
    } while (n);
    b[--i] = prefix;
    return out_put(r, b + i, sizeof(b) - i);
}

/* Sends one command of n arguments (argv[i], lens[i]). */
static int resp_send(resp *r, size_t n, const char *const *argv, const size_t *lens)
{
    r->out_len = 0;
    int rc = out_fmt(r, '*', n);
    for (size_t i = 0; i < n && !rc; i++)
        rc = out_fmt(r, '$', lens[i]) || out_put(r, argv[i], lens[i]) || out_put(r, "\r\n", 2);
    for (size_t off = 0; !rc && off < r->out_len;) {
        ssize_t w = send(r->fd, r->out + off, r->out_len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    return rc;
}

/* Makes at least `need` unread bytes available. */
static int in_fill(resp *r, size_t need)
{
    if (r->in_off && r->in_len - r->in_off < need) {
        memmove(r->in, r->in + r->in_off, r->in_len - r->in_off);
        r->in_len -= r->in_off;
        r->in_off = 0;
    }
    while (r->in_len - r->in_off < need) {
        if (r->in_len == r->in_cap) {
            char *p = realloc(r->in, r->in_cap * 2);
            if (!p)
                return -1;
            r->in = p;
            r->in_cap *= 2;
        }
        ssize_t n = recv(r->fd, r->in + r->in_len, r->in_cap - r->in_len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        r->in_len += (size_t)n;
    }
    return 0;
}

/* Reads one reply line (type byte + text up to CRLF) into *type and *num. */
static int resp_line(resp *r, char *type, long long *num)
{
    for (size_t scan = 0;; scan++) {
        if (in_fill(r, scan + 2))
            return -1;
        char *p = r->in + r->in_off;
        if (p[scan] == '\r' && p[scan + 1] == '\n') {
            *type = p[0];
            p[scan] = 0;
            *num = strtoll(p + 1, NULL, 10);
            r->in_off += scan + 2;
            return 0;
        }
    }
}

/* Reads one reply: an integer (EXISTS), a status (SET) or a bulk string
 * (GET, whose bytes are consumed).  *num: the integer or the bulk length. */
static int resp_reply(resp *r, long long *num)
{
    char type;
    if (resp_line(r, &type, num))
        return -1;
    if (type == '-')
        return -1;
    if (type == '$' && *num > 0) {
        if (in_fill(r, (size_t)*num + 2))
            return -1;
        r->in_off += (size_t)*num + 2;
    }
    return 0;
}

/* ---- redis-server ---------------------------------------------------------------- */

/* Starts redis-server on 127.0.0.1:port, no persistence; waits (up to BENCH_READY_S)
 * for its "Ready to accept connections" line. */
static int redis_start(bench_master *rs, uint16_t port)
{
    char p[16];
    snprintf(p, sizeof(p), "%u", port);
    const char *args[] = {"--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--protected-mode", "no", "--daemonize", "no", "--loglevel", "notice",
                          NULL};
    return bench_exec_start(rs, REDIS_PATH, args, "Ready to accept connections");
}

/* redis-server on a free port, *port: a port is picked before redis binds
 * it, and another process may take it meanwhile, so a few are tried. */
static int redis_start_free(bench_master *rs, uint16_t *port)
{
    for (int i = 0; i < 5; i++) {
        *port = bench_free_port();
        if (*port && redis_start(rs, *port) == 0)
            return 0;
    }
    return -1;
}

/* ---- the phases -------------------------------------------------------------------- */

typedef struct load_cfg {
    const char *master_addr;
    uint16_t redis_port;
    uint64_t phase_ns;
    pid_t master_pid, store_pid, redis_pid; /* the servers, for their CPU time */
} load_cfg;

typedef struct worker {
    const load_cfg *cfg;
    int phase, id, nclients, round;
    pthread_barrier_t *start;
    /* results */
    uint64_t units;        /* keys (exist) or operations (put+get) */
    uint64_t errors;
    bench_samples lat_us;
    uint64_t t0, t1;
    /* connections, made before the barrier */
    moonlet_master_client *mc;
    moonlet_client *cli;
    resp rd;
    char *value;
} worker;

static int worker_connect(worker *w)
{
    w->rd.fd = -1;
    switch (w->phase) {
    case PH_MOON_EXIST:
        return moonlet_mc_create(w->cfg->master_addr, NULL, &w->mc);
    case PH_MOON_PUTGET: {
        moonlet_client_config cfg = bench_client_config(w->cfg->master_addr);
        return moonlet_client_create(&cfg, &w->cli);
    }
    default:
        return resp_connect(&w->rd, w->cfg->redis_port);
    }
}

static void worker_close(worker *w)
{
    moonlet_mc_destroy(w->mc);
    moonlet_client_destroy(w->cli);
    if (w->rd.fd >= 0 || w->rd.in)
        resp_close(&w->rd);
    w->mc = NULL;
    w->cli = NULL;
}

static int one_exist(worker *w, const char **keys, int32_t *res)
{
    return moonlet_mc_batch_exist_key(w->mc, "", keys, BATCH, res);
}

static int one_exists_redis(worker *w, const char **argv, size_t *lens)
{
    long long n;
    if (resp_send(&w->rd, BATCH + 1, argv, lens) || resp_reply(&w->rd, &n))
        return -1;
    return n == BATCH ? 0 : -1;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    const char *keys[BATCH + 1];
    size_t lens[BATCH + 1];
    int32_t res[BATCH];
    char key[64], *buf = malloc(VALUE_BYTES);
    unsigned seed = (unsigned)(w->id * 7919 + w->round * 104729 + w->nclients);
    uint64_t seq = 0;
    pthread_barrier_wait(w->start);
    w->t0 = bench_now_ns();
    uint64_t end = w->t0 + w->cfg->phase_ns;
    while (buf) {
        uint64_t t = bench_now_ns();
        if (t >= end)
            break;
        int rc = 0;
        if (w->phase == PH_MOON_EXIST || w->phase == PH_REDIS_EXISTS) {
            size_t base = (size_t)rand_r(&seed) % NKEYS;
            size_t off = w->phase == PH_REDIS_EXISTS;
            keys[0] = "EXISTS";
            lens[0] = 6;
            for (size_t i = 0; i < BATCH; i++) {
                keys[off + i] = g_keys[(base + i * 13) % NKEYS];
                lens[off + i] = strlen(keys[off + i]);
            }
            rc = w->phase == PH_MOON_EXIST ? one_exist(w, keys, res)
                                           : one_exists_redis(w, keys, lens);
            for (size_t i = 0; !rc && w->phase == PH_MOON_EXIST && i < BATCH; i++)
                rc = res[i] != 1;
            bench_samples_add(&w->lat_us, (double)(bench_now_ns() - t) / 1e3);
            if (!rc)
                w->units += BATCH;
        } else {
            snprintf(key, sizeof(key), "pg/%d/%d/%d/%llu", w->nclients, w->round, w->id,
                     (unsigned long long)seq++);
            size_t len = 0;
            if (w->phase == PH_MOON_PUTGET) {
                rc = moonlet_client_put(w->cli, key, w->value, VALUE_BYTES, NULL);
                uint64_t t2 = bench_now_ns();
                bench_samples_add(&w->lat_us, (double)(t2 - t) / 1e3);
                if (!rc) {
                    rc = moonlet_client_get(w->cli, key, buf, VALUE_BYTES, NULL, &len);
                    bench_samples_add(&w->lat_us, (double)(bench_now_ns() - t2) / 1e3);
                    rc = rc || len != VALUE_BYTES;
                }
            } else {
                const char *sv[3] = {"SET", key, w->value};
                size_t sl[3] = {3, strlen(key), VALUE_BYTES};
                long long n;
                rc = resp_send(&w->rd, 3, sv, sl) || resp_reply(&w->rd, &n);
                uint64_t t2 = bench_now_ns();
                bench_samples_add(&w->lat_us, (double)(t2 - t) / 1e3);
                const char *gv[2] = {"GET", key};
                size_t gl[2] = {3, strlen(key)};
                if (!rc) {
                    rc = resp_send(&w->rd, 2, gv, gl) || resp_reply(&w->rd, &n) ||
                         n != VALUE_BYTES;
                    bench_samples_add(&w->lat_us, (double)(bench_now_ns() - t2) / 1e3);
                }
            }
            if (!rc)
                w->units += 2;
        }
        if (rc && ++w->errors > 1000)
            break; /* something is broken: stop rather than spin on errors */
    }
    w->t1 = bench_now_ns();
    free(buf);
    return NULL;
}

typedef struct phase_result {
    double units, seconds, errors;
    double client_cpu_s, server_cpu_s; /* CPU time of the bench and of the servers */
    bench_samples lat_us;
} phase_result;

/* CPU seconds used so far by the servers a phase calls: the master (and for
 * put+get the store node), or redis-server. */
static double servers_cpu(const load_cfg *cfg, int phase)
{
    if (phase == PH_REDIS_EXISTS || phase == PH_REDIS_SETGET)
        return bench_cpu_seconds(cfg->redis_pid);
    double c = bench_cpu_seconds(cfg->master_pid);
    if (phase == PH_MOON_PUTGET)
        c += bench_cpu_seconds(cfg->store_pid);
    return c;
}

/* Runs one phase with n workers; appends their samples and totals to pr. */
static int run_phase(const load_cfg *cfg, int phase, int n, int round, phase_result *pr,
                     char *value)
{
    worker w[MAX_CLIENTS];
    pthread_t th[MAX_CLIENTS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n);
    memset(w, 0, sizeof(w));
    int rc = 0, started = 0;
    for (int i = 0; i < n && !rc; i++) {
        w[i] = (worker){.cfg = cfg, .phase = phase, .id = i, .nclients = n, .round = round,
                        .start = &start, .value = value};
        rc = worker_connect(&w[i]);
        if (rc)
            fprintf(stderr, "moonlet-bench load: %s: cannot connect\n", PHASE_NAMES[phase]);
    }
    for (int i = 0; i < n && !rc; i++, started++)
        if (pthread_create(&th[i], NULL, worker_main, &w[i]))
            rc = -1;
    if (rc && started) {
        /* cannot happen in practice; the barrier would hold the others */
        fprintf(stderr, "moonlet-bench load: cannot start thread %d\n", started);
        abort();
    }
    /* CPU is read around the whole phase: the workers wait at the barrier
     * until the last one is created, and the main thread sleeps in join */
    double cpu0 = bench_cpu_seconds(getpid()), srv0 = servers_cpu(cfg, phase);
    uint64_t t0 = UINT64_MAX, t1 = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        pr->units += (double)w[i].units;
        pr->errors += (double)w[i].errors;
        t0 = w[i].t0 < t0 ? w[i].t0 : t0;
        t1 = w[i].t1 > t1 ? w[i].t1 : t1;
        for (size_t k = 0; k < w[i].lat_us.n; k++)
            bench_samples_add(&pr->lat_us, w[i].lat_us.v[k]);
    }
    if (started) {
        pr->seconds += (double)(t1 - t0) / 1e9;
        pr->client_cpu_s += bench_cpu_seconds(getpid()) - cpu0;
        pr->server_cpu_s += servers_cpu(cfg, phase) - srv0;
    }
    for (int i = 0; i < n; i++) {
        bench_samples_free(&w[i].lat_us);
        worker_close(&w[i]);
    }
    pthread_barrier_destroy(&start);
    return rc;
}

/* ---- setup -------------------------------------------------------------------------- */

/* The 1-minute load average (/proc/loadavg), or -1: the host's other work
 * sets the tail latencies of both systems, so the report carries it. */
static double load_average(void)
{
    FILE *f = fopen("/proc/loadavg", "r");
    double v = -1;
    if (f) {
        if (fscanf(f, "%lf", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static int fill_moonlet(const char *addr)
{
    moonlet_master_client *mc;
    if (moonlet_mc_create(addr, NULL, &mc))
        return -1;
    int rc = 0;
    for (int i = 0; i < NKEYS && !rc; i++) {
        moonlet_replica_list l;
        rc = moonlet_mc_put_start(mc, "", g_keys[i], 64, 1, false, &l);
        if (!rc) {
            moonlet_replica_list_free(&l);
            rc = moonlet_mc_put_end(mc, "", g_keys[i]);
        }
    }
    moonlet_mc_destroy(mc);
    return rc;
}

static int fill_redis(uint16_t port)
{
    resp r;
    if (resp_connect(&r, port))
        return -1;
    int rc = 0;
    for (int i = 0; i < NKEYS && !rc; i++) {
        const char *v[3] = {"SET", g_keys[i], "0123456789abcdef0123456789abcdef0123456789abcdef"
                                              "0123456789abcdef"};
        size_t l[3] = {3, strlen(g_keys[i]), 64};
        long long n;
        rc = resp_send(&r, 3, v, l) || resp_reply(&r, &n);
    }
    resp_close(&r);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: moonlet-bench load [--clients 1,2,4,8,16] [--phase-ms MS] [--rounds N]\n"
               "                          [--json] [--plot OUT.png]\n"
               "BatchExistKey(640) keys/s and 4 KiB put+get operations/s against one master and\n"
               "store node, and EXISTS(640) / SET+GET 4 KiB against redis-server, per client count,\n"
               "interleaved in rounds (default: 3 rounds of 600 ms per phase).\n");
}

int bench_load_main(int argc, char **argv)
{
    uint32_t clients[MAX_COUNTS] = {1, 2, 4, 8, 16};
    int nclients = 5, rounds = 3, phase_ms = 600, json = 0;
    const char *plot = NULL;
    static const struct option opts[] = {
        {"clients", required_argument, 0, 'c'}, {"phase-ms", required_argument, 0, 'p'},
        {"rounds", required_argument, 0, 'r'},  {"json", no_argument, 0, 'j'},
        {"plot", required_argument, 0, 'o'},    {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'c':
            if (bench_parse_counts(optarg, MAX_CLIENTS, clients, MAX_COUNTS, &nclients)) {
                fprintf(stderr, "moonlet-bench load: --clients: counts 1..%d, comma-separated\n",
                        MAX_CLIENTS);
                return 2;
            }
            break;
        case 'p': phase_ms = atoi(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        case 'j': json = 1; break;
        case 'o': plot = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (phase_ms < 50 || phase_ms > 60000 || rounds < 1 || rounds > 100) {
        fprintf(stderr, "moonlet-bench load: --phase-ms 50..60000, --rounds 1..100\n");
        return 2;
    }
    if (access(REDIS_PATH, X_OK)) {
        fprintf(stderr, "moonlet-bench load: %s not found (apt-get install redis-server)\n",
                REDIS_PATH);
        return 2;
    }
    for (int i = 0; i < NKEYS; i++)
        snprintf(g_keys[i], sizeof(g_keys[i]), "load/key-%06d", i);

    bench_master bm = {0}, bs = {0}, rs = {0};
    char *value = malloc(VALUE_BYTES);
    cJSON *root = NULL;
    int rc = 1;
    uint16_t rport = 0;
    if (!value)
        goto out;
    memset(value, 'v', VALUE_BYTES);
    /* 1 GiB: every put of a run fits without eviction (a lease protects each
     * object its get read for 5 s, so eviction could not keep up anyway) */
    if (bench_master_start(&bm, NULL) || bench_store_start(&bs, bm.addr, 1ull << 30) ||
        redis_start_free(&rs, &rport)) {
        fprintf(stderr, "moonlet-bench load: cannot start moonlet-master, moonlet-store or "
                        "redis-server\n");
        goto out;
    }
    if (fill_moonlet(bm.addr) || fill_redis(rport)) {
        fprintf(stderr, "moonlet-bench load: cannot fill the stores\n");
        goto out;
    }
    load_cfg cfg = {.master_addr = bm.addr, .redis_port = rport,
                    .phase_ns = (uint64_t)phase_ms * 1000000ull, .master_pid = bm.pid,
                    .store_pid = bs.pid, .redis_pid = rs.pid};
    root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "workload", "BatchExistKey / EXISTS of 640 of 10,000 keys; "
                                              "4 KiB put+get / SET+GET of fresh keys");
    cJSON_AddNumberToObject(root, "phase_ms", phase_ms);
    cJSON_AddNumberToObject(root, "rounds", rounds);
    cJSON *rows = cJSON_AddArrayToObject(root, "by_clients");
    for (int ci = 0; ci < nclients; ci++) {
        int n = (int)clients[ci];
        phase_result pr[NPHASES];
        memset(pr, 0, sizeof(pr));
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < NPHASES; k++) {
                int ph = (r + k) % NPHASES;
                if (run_phase(&cfg, ph, n, r, &pr[ph], value))
                    goto out;
            }
        cJSON *row = cJSON_CreateObject();
        cJSON_AddNumberToObject(row, "clients", n);
        cJSON_AddNumberToObject(row, "load_average", load_average());
        for (int ph = 0; ph < NPHASES; ph++) {
            cJSON *p = cJSON_AddObjectToObject(row, PHASE_NAMES[ph]);
            bool exist = ph == PH_MOON_EXIST || ph == PH_REDIS_EXISTS;
            cJSON_AddNumberToObject(p, exist ? "keys_per_s" : "ops_per_s",
                                    pr[ph].seconds > 0 ? pr[ph].units / pr[ph].seconds : 0);
            cJSON_AddNumberToObject(p, "p50_us", bench_percentile(&pr[ph].lat_us, 50));
            cJSON_AddNumberToObject(p, "p90_us", bench_percentile(&pr[ph].lat_us, 90));
            cJSON_AddNumberToObject(p, "p99_us", bench_percentile(&pr[ph].lat_us, 99));
            cJSON_AddNumberToObject(p, "p999_us", bench_percentile(&pr[ph].lat_us, 99.9));
            cJSON_AddNumberToObject(p, "calls", (double)pr[ph].lat_us.n);
            cJSON_AddNumberToObject(p, "errors", pr[ph].errors);
            double calls = pr[ph].lat_us.n ? (double)pr[ph].lat_us.n : 1;
            cJSON_AddNumberToObject(p, "client_cpu_us_per_call", pr[ph].client_cpu_s * 1e6 / calls);
            cJSON_AddNumberToObject(p, "server_cpu_us_per_call", pr[ph].server_cpu_s * 1e6 / calls);
            bench_samples_free(&pr[ph].lat_us);
        }
        cJSON_AddItemToArray(rows, row);
        if (!json) {
            cJSON *me = cJSON_GetObjectItem(row, "moonlet_exist"),
                  *re = cJSON_GetObjectItem(row, "redis_exists"),
                  *mp = cJSON_GetObjectItem(row, "moonlet_putget"),
                  *rp = cJSON_GetObjectItem(row, "redis_setget");
#define F(o, k) cJSON_GetObjectItem(o, k)->valuedouble
            printf("%2d clients: exist keys/s moonlet %.0f (p50 %.0f p99 %.0f us) redis %.0f (p50 "
                   "%.0f p99 %.0f us); put+get ops/s moonlet %.0f (p99 %.0f us) redis %.0f (p99 "
                   "%.0f us)\n", n, F(me, "keys_per_s"), F(me, "p50_us"), F(me, "p99_us"),
                   F(re, "keys_per_s"), F(re, "p50_us"), F(re, "p99_us"), F(mp, "ops_per_s"),
                   F(mp, "p99_us"), F(rp, "ops_per_s"), F(rp, "p99_us"));
#undef F
            fflush(stdout);
        }
    }
    rc = 0;
    if (plot) {
        char tmp[] = "/tmp/moonlet-load-XXXXXX";
        int fd = mkstemp(tmp);
        char *s = fd >= 0 ? cJSON_PrintUnformatted(root) : NULL;
        FILE *f = s ? fdopen(fd, "w") : NULL;
        if (!f || fputs(s, f) < 0 || fclose(f) || bench_run_plot("load", "plot_load.py", tmp, plot))
            rc = 1;
        if (fd >= 0)
            unlink(tmp);
        free(s);
    }
    if (json) {
        bench_print_json(root);
        root = NULL;
    }
out:
    cJSON_Delete(root);
    bench_master_stop(&rs);
    bench_master_stop(&bs);
    bench_master_stop(&bm);
    free(value);
    if (rc)
        fprintf(stderr, "moonlet-bench load: failed\n");
    return rc;
}
