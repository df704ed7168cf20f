/*
 * ha.c - `moonlet-bench ha`: the cost of high availability.  Starts one
 * etcd (/usr/bin/etcd, temporary data dir, ephemeral loopback ports) and two
 * clusters on it, each of two moonlet-masters (--etcd-lease-ttl 2) and one
 * moonlet-store with a TCP segment mounted on "a,b":
 *   repl   - the masters with their hot standby (semi-synchronous replication)
 *   norepl - the masters with --no-replication
 * and measures
 *   put_p50   - 4 KiB puts of fresh keys through a C client on "a,b", the
 *               two clusters interleaved call by call (ABBA) in --rounds
 *               rounds; ratio repl/norepl;
 *   repl lag  - during the puts, the repl leader's Hello "replication" sampled
 *               every 20 ms: lag_ms and next - acked (records not yet acked);
 *   semi_sync - the repl leader's Hello counters over the put rounds: its
 *               semi-sync waits, how many found the standby's ack already
 *               in, and their mean length;
 *   failover  - --failovers times on repl: the leader SIGKILLed, then the
 *               time to the first successful put AND get of a fresh key
 *               through the new leader; the killed master is restarted on its
 *               port and the bench waits until it is an in-sync standby again.
 * Every child is stopped by its PID.
 * Threads: the main thread, plus one Hello sampler during repl's puts (it
 * only reads the leader address written before it starts, and the atomic
 * `stop`); no locks.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "bench.h"
#include "master_client.h"
#include "moonlet/client.h"
#include "moonlet/error.h"

#define ETCD_PATH "/usr/bin/etcd"
#define VALUE_BYTES 4096
#define LEASE_TTL_S 2
#define WAIT_S 60

typedef struct ha_cluster {
    const char *name;
    bool norepl;
    char etcd_url[64], cluster_id[32], addrs[64];
    uint16_t port[2];
    bench_master m[2];
    bench_master store;
    moonlet_client *cli;
    unsigned long seq;
} ha_cluster;

/* etcd: its log goes to a file in its directory; ready once /health says so
 * (etcd announces readiness on no channel that can be waited on: bounded poll). */
static int etcd_start(bench_master *e, const char *dir, char *url, size_t cap)
{
    uint16_t cp = bench_free_port(), pp = bench_free_port();
    char curl[64], purl[64], data[PATH_MAX], logp[PATH_MAX], initial[96];
    snprintf(curl, sizeof(curl), "http://127.0.0.1:%u", cp);
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%u", pp);
    snprintf(initial, sizeof(initial), "ha=%s", purl);
    snprintf(data, sizeof(data), "%s/data", dir);
    snprintf(logp, sizeof(logp), "%s/etcd.log", dir);
    snprintf(url, cap, "%s", curl);
    e->pid = bench_fork();
    if (e->pid < 0)
        return -1;
    if (e->pid == 0) {
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(ETCD_PATH, ETCD_PATH, "--name", "ha", "--data-dir", data, "--listen-client-urls",
              curl, "--advertise-client-urls", curl, "--listen-peer-urls", purl,
              "--initial-advertise-peer-urls", purl, "--initial-cluster", initial, (char *)NULL);
        _exit(127);
    }
    e->out_fd = -1;
    uint64_t deadline = bench_now_ns() + 20000000000ull;
    while (bench_now_ns() < deadline) {
        if (waitpid(e->pid, NULL, WNOHANG) == e->pid) {
            e->pid = 0;
            return -1;
        }
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(cp),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        char buf[1024] = "";
        if (fd >= 0 && !connect(fd, (struct sockaddr *)&a, sizeof(a))) {
            const char *req = "GET /health HTTP/1.0\r\n\r\n";
            if (write(fd, req, strlen(req)) == (ssize_t)strlen(req)) {
                size_t n = 0;
                ssize_t r;
                while (n < sizeof(buf) - 1 && (r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0)
                    n += (size_t)r;
                buf[n] = 0;
            }
        }
        if (fd >= 0)
            close(fd);
        if (strstr(buf, "\"health\":\"true\""))
            return 0;
        usleep(50000);
    }
    bench_master_stop(e);
    return -1;
}

static int master_start(ha_cluster *c, int i)
{
    char port[16], adv[32], ttl[8];
    snprintf(port, sizeof(port), "%u", c->port[i]);
    snprintf(adv, sizeof(adv), "127.0.0.1:%u", c->port[i]);
    snprintf(ttl, sizeof(ttl), "%d", LEASE_TTL_S);
    const char *args[] = {"--rpc-port", port, "--etcd-endpoints", c->etcd_url, "--cluster-id",
                          c->cluster_id, "--advertise", adv, "--etcd-lease-ttl", ttl,
                          c->norepl ? "--no-replication" : NULL, NULL};
    return bench_master_start(&c->m[i], args);
}

/* Hello of master i: role/serving, and the leader's replication view. */
typedef struct hello_view {
    bool leader, serving, has_repl, in_sync;
    char standby[64];
    uint64_t lag_ms, acked, next;
    uint64_t sync_waits, sync_acked_on_entry, sync_wait_us, writer_pushes, pusher_pushes;
    uint64_t put_starts_reserved;
} hello_view;

static int hello(ha_cluster *c, int i, hello_view *v)
{
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", c->port[i]);
    memset(v, 0, sizeof(*v));
    moonlet_master_client_opts mo = {.timeout_ms = 1000};
    cJSON *h = NULL;
    if (moonlet_mc_hello_at(addr, &mo, &h) != MOONLET_OK)
        return -1;
    const cJSON *role = cJSON_GetObjectItem(h, "role");
    v->leader = cJSON_IsString(role) && !strcmp(role->valuestring, "leader");
    v->serving = cJSON_IsTrue(cJSON_GetObjectItem(h, "serving"));
    const cJSON *r = cJSON_GetObjectItem(h, "replication");
    if (cJSON_IsObject(r)) {
        v->has_repl = true;
        v->in_sync = cJSON_IsTrue(cJSON_GetObjectItem(r, "in_sync"));
        const cJSON *sb = cJSON_GetObjectItem(r, "standby");
        if (cJSON_IsString(sb))
            snprintf(v->standby, sizeof(v->standby), "%s", sb->valuestring);
        v->lag_ms = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "lag_ms"));
        v->acked = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "acked"));
        v->next = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "next"));
        v->sync_waits = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "sync_waits"));
        v->sync_acked_on_entry =
            (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "sync_acked_on_entry"));
        v->sync_wait_us = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "sync_wait_us"));
        v->writer_pushes = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "writer_pushes"));
        v->pusher_pushes = (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "pusher_pushes"));
        v->put_starts_reserved =
            (uint64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(r, "put_starts_reserved"));
    }
    cJSON_Delete(h);
    return 0;
}

/* Waits (bounded) for a serving leader; with replication also for the other
 * master to be its in-sync standby.  Returns the leader's index or -1. */
static int wait_ready(ha_cluster *c)
{
    uint64_t deadline = bench_now_ns() + WAIT_S * 1000000000ull;
    while (bench_now_ns() < deadline) {
        for (int i = 0; i < 2; i++) {
            hello_view v;
            if (c->m[i].pid <= 0 || hello(c, i, &v) || !v.leader || !v.serving)
                continue;
            if (c->norepl)
                return i;
            char want[32];
            snprintf(want, sizeof(want), "127.0.0.1:%u", c->port[1 - i]);
            if (v.in_sync && !strcmp(v.standby, want))
                return i;
        }
        usleep(20000);
    }
    return -1;
}

static int cluster_start(ha_cluster *c, const char *etcd_url)
{
    snprintf(c->etcd_url, sizeof(c->etcd_url), "%s", etcd_url);
    snprintf(c->cluster_id, sizeof(c->cluster_id), "bench-%s-%d", c->name, (int)getpid());
    c->port[0] = bench_free_port();
    c->port[1] = bench_free_port();
    snprintf(c->addrs, sizeof(c->addrs), "127.0.0.1:%u,127.0.0.1:%u", c->port[0], c->port[1]);
    if (master_start(c, 0) || master_start(c, 1) || wait_ready(c) < 0 ||
        bench_store_start(&c->store, c->addrs, 256ull << 20))
        return -1;
    moonlet_client_config cfg = bench_client_config(c->addrs);
    return moonlet_client_create(&cfg, &c->cli) == MOONLET_OK ? 0 : -1;
}

static void cluster_stop(ha_cluster *c)
{
    if (c->cli)
        moonlet_client_destroy(c->cli);
    c->cli = NULL;
    bench_master_stop(&c->store);
    bench_master_stop(&c->m[0]);
    bench_master_stop(&c->m[1]);
}

static int put_one(ha_cluster *c, const char *tag, const char *value, uint64_t *ns)
{
    char key[96];
    snprintf(key, sizeof(key), "ha/%s/%s/%lu", c->name, tag, c->seq++);
    uint64_t t0 = bench_now_ns();
    int rc = moonlet_client_put(c->cli, key, value, VALUE_BYTES, NULL);
    if (ns)
        *ns = bench_now_ns() - t0;
    return rc;
}

/* ---- replication lag sampler ------------------------------------------------ */
typedef struct sampler {
    ha_cluster *c;
    int leader;
    atomic_int stop; /* the main thread ends the sampling */
    uint64_t max_lag_ms, max_pending, samples;
    bench_samples lag;
} sampler;

static void *sampler_main(void *arg)
{
    sampler *s = arg;
    while (!atomic_load(&s->stop)) {
        hello_view v;
        if (!hello(s->c, s->leader, &v) && v.has_repl) {
            s->samples++;
            bench_samples_add(&s->lag, (double)v.lag_ms);
            if (v.lag_ms > s->max_lag_ms)
                s->max_lag_ms = v.lag_ms;
            uint64_t pend = v.next > v.acked ? v.next - v.acked : 0;
            if (pend > s->max_pending)
                s->max_pending = pend;
        }
        usleep(20000);
    }
    return NULL;
}

/* ---- failover ------------------------------------------------------------------- */
/* Kills the leader, times the first put + get through the new one, restarts
 * the killed master and waits until it is an in-sync standby.  -1 on failure. */
static double failover_once(ha_cluster *c, int n, const char *value, char *buf)
{
    int l = wait_ready(c);
    if (l < 0)
        return -1;
    uint64_t t0 = bench_now_ns();
    kill(c->m[l].pid, SIGKILL);
    waitpid(c->m[l].pid, NULL, 0);
    c->m[l].pid = 0;
    close(c->m[l].out_fd);
    double ms = -1;
    uint64_t deadline = t0 + WAIT_S * 1000000000ull;
    for (unsigned tries = 0; tries < 100000 && bench_now_ns() < deadline; tries++) {
        char key[96];
        snprintf(key, sizeof(key), "ha/%s/fo%d/%lu", c->name, n, c->seq++);
        size_t len = 0;
        if (moonlet_client_put(c->cli, key, value, VALUE_BYTES, NULL) == MOONLET_OK &&
            moonlet_client_get(c->cli, key, buf, VALUE_BYTES, NULL, &len) == MOONLET_OK &&
            len == VALUE_BYTES && !memcmp(buf, value, VALUE_BYTES)) {
            ms = (double)(bench_now_ns() - t0) / 1e6;
            break;
        }
        usleep(10000);
    }
    if (ms < 0 || master_start(c, l) || wait_ready(c) < 0)
        return -1;
    return ms;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: moonlet-bench ha [--rounds N] [--puts N] [--failovers N] [--json]\n"
               "HA cost on one etcd (" ETCD_PATH "): 4 KiB put p50 with a semi-synchronous hot\n"
               "standby vs --no-replication (interleaved in --rounds rounds of --puts puts, default\n"
               "5 x 500), the standby's lag under that load, and --failovers (default 5) times the\n"
               "leader SIGKILLed -> first put+get through the new leader (lease TTL %d s).\n",
            LEASE_TTL_S);
}

int bench_ha_main(int argc, char **argv)
{
    int rounds = 5, puts = 500, failovers = 5, json = 0;
    static const struct option opts[] = {
        {"rounds", required_argument, 0, 'r'}, {"puts", required_argument, 0, 'p'},
        {"failovers", required_argument, 0, 'f'}, {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'r': rounds = atoi(optarg); break;
        case 'p': puts = atoi(optarg); break;
        case 'f': failovers = atoi(optarg); break;
        case 'j': json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (rounds < 1 || rounds > 1000 || puts < 1 || puts > 1000000 || failovers < 0 ||
        failovers > 100) {
        usage(stderr);
        return 2;
    }
    if (access(ETCD_PATH, X_OK)) {
        fprintf(stderr, "moonlet-bench ha: %s not found (apt-get install etcd-server)\n", ETCD_PATH);
        return 1;
    }
    char dir[] = "/tmp/moonlet-bench-ha-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "moonlet-bench ha: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    bench_master etcd = {0};
    char url[64];
    ha_cluster cl[2] = {{.name = "repl"}, {.name = "norepl", .norepl = true}};
    char *value = malloc(VALUE_BYTES), *buf = malloc(VALUE_BYTES);
    int ret = 1;
    bench_samples put[2] = {{0}};
    sampler smp = {.c = &cl[0]};
    uint64_t sync_waits = 0, sync_on_entry = 0, sync_us = 0, writer_pushes = 0, pusher_pushes = 0;
    uint64_t reserved = 0;
    double fo[100];
    int nfo = 0;
    if (!value || !buf)
        goto out;
    memset(value, 'h', VALUE_BYTES);
    if (etcd_start(&etcd, dir, url, sizeof(url))) {
        fprintf(stderr, "moonlet-bench ha: etcd did not come up (log in %s)\n", dir);
        goto out;
    }
    for (int i = 0; i < 2; i++)
        if (cluster_start(&cl[i], url)) {
            fprintf(stderr, "moonlet-bench ha: cluster %s did not come up\n", cl[i].name);
            goto out;
        }
    /* warm-up: connections and the first allocation on each */
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 20; k++)
            if (put_one(&cl[i], "warm", value, NULL)) {
                fprintf(stderr, "moonlet-bench ha: warm-up put on %s failed\n", cl[i].name);
                goto out;
            }
    for (int r = 0; r < rounds; r++) {
        /* call by call: repl, norepl, then norepl, repl, ... (drift on this
         * shared host hits both alike); the sampler runs through the round */
        pthread_t th;
        smp.leader = wait_ready(&cl[0]);
        atomic_store(&smp.stop, 0);
        hello_view h0 = {0}, h1 = {0};
        bool counted = smp.leader >= 0 && !hello(&cl[0], smp.leader, &h0);
        bool sampling = smp.leader >= 0 && !pthread_create(&th, NULL, sampler_main, &smp);
        int failed = 0;
        for (int k = 0; k < 2 * puts; k++) {
            int i = (k + k / 2) % 2;
            uint64_t ns;
            if (put_one(&cl[i], "put", value, &ns))
                failed++;
            else
                bench_samples_add(&put[i], (double)ns / 1000.0);
        }
        if (sampling) {
            atomic_store(&smp.stop, 1);
            pthread_join(th, NULL);
        }
        /* the leader's semi-sync counters over the round (same leader) */
        if (counted && !hello(&cl[0], smp.leader, &h1) && h1.leader &&
            h1.sync_waits >= h0.sync_waits) {
            sync_waits += h1.sync_waits - h0.sync_waits;
            sync_on_entry += h1.sync_acked_on_entry - h0.sync_acked_on_entry;
            sync_us += h1.sync_wait_us - h0.sync_wait_us;
            writer_pushes += h1.writer_pushes - h0.writer_pushes;
            pusher_pushes += h1.pusher_pushes - h0.pusher_pushes;
            reserved += h1.put_starts_reserved - h0.put_starts_reserved;
        }
        if (failed) {
            fprintf(stderr, "moonlet-bench ha: %d puts failed\n", failed);
            goto out;
        }
    }
    for (int n = 0; n < failovers; n++) {
        double ms = failover_once(&cl[0], n, value, buf);
        if (ms < 0) {
            fprintf(stderr, "moonlet-bench ha: failover %d did not complete\n", n + 1);
            goto out;
        }
        fo[nfo++] = ms;
    }
    double p_repl = bench_percentile(&put[0], 50), p_norepl = bench_percentile(&put[1], 50);
    double ratio = p_norepl > 0 ? p_repl / p_norepl : 0;
    double sorted[100], fo_median = 0;
    memcpy(sorted, fo, sizeof(double) * (size_t)nfo);
    qsort(sorted, (size_t)nfo, sizeof(double), cmp_double);
    if (nfo)
        fo_median = nfo % 2 ? sorted[nfo / 2] : (sorted[nfo / 2 - 1] + sorted[nfo / 2]) / 2;
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "ha");
    cJSON_AddNumberToObject(root, "lease_ttl_s", LEASE_TTL_S);
    cJSON_AddNumberToObject(root, "rounds", rounds);
    cJSON_AddNumberToObject(root, "puts_per_round", puts);
    cJSON_AddNumberToObject(root, "value_bytes", VALUE_BYTES);
    bench_json_latency(root, "put_repl", &put[0]);
    bench_json_latency(root, "put_norepl", &put[1]);
    cJSON_AddNumberToObject(root, "put_p50_ratio", ratio);
    cJSON *lag = cJSON_AddObjectToObject(root, "repl_lag");
    cJSON_AddNumberToObject(lag, "samples", (double)smp.samples);
    cJSON_AddNumberToObject(lag, "lag_ms_p50", smp.samples ? bench_percentile(&smp.lag, 50) : 0);
    cJSON_AddNumberToObject(lag, "lag_ms_max", (double)smp.max_lag_ms);
    cJSON_AddNumberToObject(lag, "pending_records_max", (double)smp.max_pending);
    cJSON *ss = cJSON_AddObjectToObject(root, "semi_sync");
    cJSON_AddNumberToObject(ss, "waits", (double)sync_waits);
    cJSON_AddNumberToObject(ss, "acked_on_entry", (double)sync_on_entry);
    cJSON_AddNumberToObject(ss, "mean_wait_us", sync_waits ? (double)sync_us / (double)sync_waits : 0);
    cJSON_AddNumberToObject(ss, "writer_pushes", (double)writer_pushes);
    cJSON_AddNumberToObject(ss, "pusher_pushes", (double)pusher_pushes);
    cJSON_AddNumberToObject(ss, "put_starts_reserved", (double)reserved);
    cJSON *f = cJSON_AddObjectToObject(root, "failover");
    cJSON *all = cJSON_AddArrayToObject(f, "failover_ms");
    for (int n = 0; n < nfo; n++)
        cJSON_AddItemToArray(all, cJSON_CreateNumber(fo[n]));
    cJSON_AddNumberToObject(f, "median_ms", fo_median);
    cJSON_AddNumberToObject(f, "ratio_to_2x_ttl", fo_median / (2000.0 * LEASE_TTL_S));
    if (json) {
        bench_print_json(root);
    } else {
        printf("4 KiB put p50: repl %.0f us, no-repl %.0f us, ratio %.2f (%d x %d puts each)\n",
               p_repl, p_norepl, ratio, rounds, puts);
        printf("standby lag under puts: p50 %.0f ms, max %llu ms, max pending records %llu "
               "(%llu samples)\n",
               smp.samples ? bench_percentile(&smp.lag, 50) : 0,
               (unsigned long long)smp.max_lag_ms, (unsigned long long)smp.max_pending,
               (unsigned long long)smp.samples);
        printf("semi-sync waits on the leader: %llu, the ack already in at %llu (%.0f%%), "
               "mean wait %.1f us\n",
               (unsigned long long)sync_waits, (unsigned long long)sync_on_entry,
               sync_waits ? 100.0 * (double)sync_on_entry / (double)sync_waits : 0,
               sync_waits ? (double)sync_us / (double)sync_waits : 0);
        printf("failover (leader SIGKILL -> put+get): median %.0f ms = %.2f x 2 x TTL; all:",
               fo_median, fo_median / (2000.0 * LEASE_TTL_S));
        for (int n = 0; n < nfo; n++)
            printf(" %.0f", fo[n]);
        printf("\n");
        cJSON_Delete(root);
    }
    ret = 0;
out:
    cluster_stop(&cl[0]);
    cluster_stop(&cl[1]);
    bench_master_stop(&etcd);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "moonlet-bench ha: could not remove %s\n", dir);
    bench_samples_free(&put[0]);
    bench_samples_free(&put[1]);
    bench_samples_free(&smp.lag);
    free(value);
    free(buf);
    return ret;
}
