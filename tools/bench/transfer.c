/*
 * transfer.c - the data-plane transfer benchmark (`moonlet-bench transfer`).
 *
 * It starts a TCP serving instance in-process on 127.0.0.1:0 with its own
 * worker pool and a 1 GiB segment (as a store node would), and a client
 * instance; it measures single-operation read and write bandwidth for 4 KiB,
 * 64 KiB, 1 MiB and 16 MiB transfers, and in the same run a plain loopback
 * socket stream (one sender thread, one receiver, kernel-default socket
 * options) moving chunks of the same sizes.  Each figure is the median of
 * several rounds; each round moves a fixed number of bytes and is cut short
 * after two seconds, so the whole run stays well under a minute.  The ratio
 * transfer/plain at 16 MiB is the number the transport is judged by (target
 * >= 0.70).  The same rounds also run with the client's end-to-end checksum
 * (an XXH3-64 pass over the bytes before a write, after a read, as
 * store/client/client.c does by default), side by side, so its cost is read off
 * one run.  With --tls the rounds also stream the same chunks through a
 * TLS session (transport/tls.c over a loopback socket, mutual TLS with
 * certificates made at start in a temp dir), beside the plain stream: the
 * cost TLS would add to a TCP byte stream (the data plane itself has no TLS;
 * docs/deployment.md says when that matters).
 *
 * --protocol rdma serves on --listen-addr (an RDMA interface's address) and
 * binds the client to --source-addr; there is no plain-socket stream then
 * (the baseline is perftest's ib_read_bw / ib_write_bw / ib_read_lat on the
 * same devices, run beside it: tests/rdma/guest.sh), and the JSON adds the
 * median latency of single 4 KiB reads.  The logic lives here, not in a main(), so tests and the
 * moonlet-bench dispatcher reach it.  Takes no locks of its own.
 */
#include "transfer.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "moonlet/error.h"
#include "segment_mem.h"
#include "writecap.h"
#include "xfer.h"
#include "monotime.h"
#include "tls.h"
#include "tls_certs.h"

#include <xxhash.h>

#define BENCH_NSIZES 4
#define BENCH_MAX_ROUNDS 15
#define BENCH_ROUND_CAP_S 2.0
#define BENCH_TARGET_RATIO 0.70

static const uint64_t bench_sizes[BENCH_NSIZES] = {4u << 10, 64u << 10, 1u << 20, 16u << 20};
/* bytes moved per round, per size: enough to reach steady state */
static const uint64_t bench_round_bytes[BENCH_NSIZES] = {32u << 20, 256u << 20, 512u << 20,
                                                         1024u << 20};

typedef struct bench_cfg {
    bool json;
    moonlet_xfer_protocol protocol;
    const char *listen_host; /* rdma: the serving address */
    const char *source_addr; /* rdma: the client's bound address */
    int rounds;
    uint64_t segment_bytes;
    int server_threads;
    bool tls;                /* --tls: a TLS stream beside the plain one */
} bench_cfg;

typedef struct bench_ctx {
    bench_cfg cfg;
    moonlet_xfer *server;
    moonlet_xfer *client;
    moonlet_segment_mem seg;
    moonlet_segment_mem local;
    moonlet_xfer_segment_info info;
    moonlet_xfer_cap cap; /* every write carries it: the node checks it, as a store node does */
    moonlet_tls_ctx *tls_server, *tls_client; /* --tls */
} bench_ctx;

/* Defeats dead-code elimination of the checksum passes. */
static volatile uint64_t bench_ck_sink;

typedef struct bench_point {
    double read_gbps, write_gbps, plain_gbps;
    double read_ck_gbps, write_ck_gbps; /* with the end-to-end checksum pass */
    double tls_gbps;                    /* --tls: the TLS stream */
} bench_point;

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- flags -------------------------------------------------------------- */

static int bench_parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int bench_parse(int argc, char **argv, bench_cfg *c)
{
    *c = (bench_cfg){.rounds = 5, .segment_bytes = 1024ull << 20, .server_threads = 4,
                     .protocol = MOONLET_XFER_TCP, .listen_host = "127.0.0.1"};
    for (int i = 1; i < argc; i++) {
        int v;
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--json") == 0) {
            c->json = true;
        } else if (strcmp(argv[i], "--rounds") == 0 &&
                   bench_parse_int(next, 1, BENCH_MAX_ROUNDS, &v) == 0) {
            c->rounds = v;
            i++;
        } else if (strcmp(argv[i], "--segment-mib") == 0 &&
                   bench_parse_int(next, 32, 1 << 20, &v) == 0) {
            c->segment_bytes = (uint64_t)v << 20;
            i++;
        } else if (strcmp(argv[i], "--protocol") == 0 && next &&
                   moonlet_xfer_parse_protocol(next, &c->protocol) == 0 &&
                   c->protocol != MOONLET_XFER_AUTO) {
            i++;
        } else if (strcmp(argv[i], "--listen-addr") == 0 && next) {
            c->listen_host = next;
            i++;
        } else if (strcmp(argv[i], "--source-addr") == 0 && next) {
            c->source_addr = next;
            i++;
        } else if (strcmp(argv[i], "--tls") == 0) {
            c->tls = true;
        } else if (strcmp(argv[i], "--server-threads") == 0 &&
                   bench_parse_int(next, 1, 256, &v) == 0) {
            c->server_threads = v;
            i++;
        } else {
            fprintf(stderr, "usage: %s [--json] [--rounds N<=%d] [--segment-mib N>=32] "
                    "[--server-threads N] [--protocol tcp|rdma] [--listen-addr IP] "
                    "[--source-addr IP] [--tls]\n", argv[0], BENCH_MAX_ROUNDS);
            return -1;
        }
    }
    return 0;
}

/* ---- setup -------------------------------------------------------------- */

static int bench_setup(bench_ctx *b)
{
    moonlet_segment_mem_opts so = {.size = b->cfg.segment_bytes,
                                   .numa_node = MOONLET_SEGMENT_MEM_NODE_AUTO, .prefault = true};
    moonlet_segment_mem_opts lo = {.size = bench_sizes[BENCH_NSIZES - 1],
                                   .numa_node = MOONLET_SEGMENT_MEM_NODE_AUTO, .prefault = true};
    char listen[128];
    snprintf(listen, sizeof(listen), "%s:0", b->cfg.listen_host);
    moonlet_xfer_opts srv = {.protocol = b->cfg.protocol, .listen_addr = listen,
                             .server_threads = b->cfg.server_threads};
    moonlet_xfer_opts cli = {.protocol = b->cfg.protocol, .source_addr = b->cfg.source_addr};
    int rc = moonlet_segment_mem_alloc(&so, &b->seg);
    if (!rc)
        rc = moonlet_segment_mem_alloc(&lo, &b->local);
    if (!rc)
        rc = moonlet_xfer_create(&srv, &b->server);
    if (!rc)
        rc = moonlet_xfer_create(&cli, &b->client);
    if (!rc)
        rc = moonlet_xfer_register_segment(b->server, b->seg.base, b->seg.size, &b->info);
    uint8_t key[MOONLET_WRITECAP_KEY_BYTES];
    if (!rc)
        rc = moonlet_writecap_new_key(key);
    if (!rc)
        rc = moonlet_xfer_set_segment_key(b->server, b->info.segment_id, key);
    if (!rc) {
        b->cap = (moonlet_xfer_cap){.offset = 0, .len = b->seg.size,
                                    .expiry_ms = moonlet_xfer_now_ms() + 3600u * 1000u};
        b->cap.tag = moonlet_writecap_tag(key, b->info.segment_id, 0, b->seg.size,
                                          b->cap.expiry_ms);
    }
    if (!rc)
        rc = moonlet_xfer_register_buffer(b->client, b->local.base, b->local.size);
    if (!rc)
        rc = moonlet_xfer_connect(b->client, b->info.endpoint);
    if (rc)
        fprintf(stderr, "transfer bench: setup failed: %s\n", moonlet_strerror(rc));
    return rc;
}

static void bench_teardown(bench_ctx *b)
{
    moonlet_xfer_destroy(b->client);
    moonlet_xfer_destroy(b->server);
    moonlet_segment_mem_free(&b->local);
    moonlet_segment_mem_free(&b->seg);
}

/* ---- transport rounds --------------------------------------------------- */

/* One write carrying the segment's capability. */
static int bench_write(bench_ctx *b, uint64_t off, uint64_t size)
{
    moonlet_xfer_op op = {.opcode = MOONLET_XFER_WRITE, .endpoint = b->info.endpoint,
                          .segment_id = b->info.segment_id, .offset = off,
                          .local = b->local.base, .len = size, .cap = &b->cap};
    return moonlet_xfer_submit(b->client, &op, 1);
}

/* One round of single operations of `size` bytes walking the segment;
 * returns GB/s, or a negative value on a failed transfer. */
static double bench_xfer_round(bench_ctx *b, moonlet_xfer_opcode opc, uint64_t size,
                               uint64_t bytes, bool checksum)
{
    uint64_t slots = b->seg.size / size, moved = 0, i = 0;
    double t0 = moonlet_mono_s(), t = t0;
    while (moved < bytes && t - t0 < BENCH_ROUND_CAP_S) {
        uint64_t off = (i++ % slots) * size;
        if (checksum && opc == MOONLET_XFER_WRITE) /* the writer's pass, before PutEnd */
            bench_ck_sink = XXH3_64bits(b->local.base, size);
        int rc = opc == MOONLET_XFER_READ
                     ? moonlet_xfer_read(b->client, b->info.endpoint, b->info.segment_id, off,
                                         b->local.base, size)
                     : bench_write(b, off, size);
        if (rc) {
            fprintf(stderr, "transfer bench: %s of %llu bytes failed: %s\n",
                    opc == MOONLET_XFER_READ ? "read" : "write", (unsigned long long)size,
                    moonlet_strerror(rc));
            return -1;
        }
        if (checksum && opc == MOONLET_XFER_READ) /* the reader's verification */
            bench_ck_sink = XXH3_64bits(b->local.base, size);
        moved += size;
        t = moonlet_mono_s();
    }
    return (double)moved / (t - t0) / 1e9;
}

/* ---- plain socket stream ------------------------------------------------ */

typedef struct plain_sender {
    int fd;
    const uint8_t *buf;
    uint64_t size;
    uint64_t chunks;
} plain_sender;

static void *plain_sender_main(void *arg)
{
    plain_sender *s = arg;
    for (uint64_t c = 0; c < s->chunks; c++) {
        uint64_t off = 0;
        while (off < s->size) {
            ssize_t w = send(s->fd, s->buf + off, (size_t)(s->size - off), MSG_NOSIGNAL);
            if (w <= 0)
                return NULL;
            off += (uint64_t)w;
        }
    }
    return NULL;
}

/* A connected loopback pair (kernel defaults, TCP_NODELAY not needed for a
 * one-way stream). */
static int plain_pair(int *tx, int *rx)
{
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof(a);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &al)) {
        if (l >= 0)
            close(l);
        return -1;
    }
    *tx = socket(AF_INET, SOCK_STREAM, 0);
    if (*tx < 0 || connect(*tx, (struct sockaddr *)&a, sizeof(a))) {
        close(l);
        return -1;
    }
    *rx = accept(l, NULL, NULL);
    close(l);
    return *rx < 0 ? -1 : 0;
}

/* One round: the sender streams `bytes` in chunks of `size` from its own
 * buffer, the receiver reads each chunk into another; GB/s at the receiver. */
double moonlet_bench_plain_gbps(uint8_t *src, uint8_t *dst, uint64_t size, uint64_t bytes)
{
    int tx, rx;
    if (plain_pair(&tx, &rx))
        return -1;
    plain_sender s = {.fd = tx, .buf = src, .size = size, .chunks = bytes / size};
    double t0 = moonlet_mono_s(), t = t0;
    pthread_t th;
    if (pthread_create(&th, NULL, plain_sender_main, &s)) {
        close(tx);
        close(rx);
        return -1;
    }
    uint64_t moved = 0;
    while (moved < bytes && t - t0 < BENCH_ROUND_CAP_S) {
        ssize_t r = recv(rx, dst, (size_t)size, MSG_WAITALL);
        if (r <= 0)
            break;
        moved += (uint64_t)r;
        t = moonlet_mono_s();
    }
    shutdown(rx, SHUT_RDWR); /* stops a sender cut short by the time cap */
    pthread_join(th, NULL);
    close(tx);
    close(rx);
    return (double)moved / (t - t0) / 1e9;
}

/* ---- TLS socket stream -------------------------------------------------- */

typedef struct tls_sender {
    plain_sender p;
    moonlet_tls_ctx *ctx;
} tls_sender;

static void *tls_sender_main(void *arg)
{
    tls_sender *s = arg;
    moonlet_tls *t = NULL;
    uint64_t by = moonlet_mono_ms() + 10000;
    if (moonlet_tls_new(s->ctx, s->p.fd, NULL, &t) == 0 && moonlet_tls_handshake_by(t, by) == 0)
        for (uint64_t c = 0; c < s->p.chunks; c++)
            if (moonlet_tls_io_by(t, true, (void *)s->p.buf, s->p.size,
                                  moonlet_mono_ms() + 10000))
                break;
    moonlet_tls_free(t);
    return NULL;
}

/* As moonlet_bench_plain_gbps, through a TLS session (server side sending). */
static double bench_tls_gbps(bench_ctx *b, uint8_t *src, uint8_t *dst, uint64_t size,
                             uint64_t bytes)
{
    int tx, rx;
    if (plain_pair(&tx, &rx))
        return -1;
    tls_sender s = {.p = {.fd = tx, .buf = src, .size = size, .chunks = bytes / size},
                    .ctx = b->tls_server};
    pthread_t th;
    if (pthread_create(&th, NULL, tls_sender_main, &s)) {
        close(tx);
        close(rx);
        return -1;
    }
    moonlet_tls *t = NULL;
    double rate = -1;
    if (moonlet_tls_new(b->tls_client, rx, "127.0.0.1", &t) == 0 &&
        moonlet_tls_handshake_by(t, moonlet_mono_ms() + 10000) == 0) {
        double t0 = moonlet_mono_s(), now = t0;
        uint64_t moved = 0;
        while (moved < bytes && now - t0 < BENCH_ROUND_CAP_S &&
               moonlet_tls_io_by(t, false, dst, (size_t)size, moonlet_mono_ms() + 10000) == 0) {
            moved += size;
            now = moonlet_mono_s();
        }
        rate = (double)moved / (now - t0) / 1e9;
    }
    shutdown(rx, SHUT_RDWR);
    shutdown(tx, SHUT_RDWR); /* a sender blocked in send() (a round cut short) */
    pthread_join(th, NULL);
    moonlet_tls_free(t);
    close(tx);
    close(rx);
    return rate;
}

/* Throwaway certificates in a temp dir (removed once loaded). */
static int bench_tls_setup(bench_ctx *b)
{
    char dir[] = "/tmp/moonlet-bench-tls-XXXXXX";
    if (!mkdtemp(dir))
        return -1;
    char p[8][96];
    static const char *const f[] = {"ca.pem", "ca.key", "server.pem", "server.key", "client.pem",
                                    "client.key"};
    for (int i = 0; i < 6; i++)
        snprintf(p[i], sizeof(p[i]), "%s/%s", dir, f[i]);
    int rc = tls_certs_ca(dir, "ca", "moonlet bench CA") ||
             tls_certs_issue(dir, "ca", "server", "bench-server", "IP:127.0.0.1") ||
             tls_certs_issue(dir, "ca", "client", "bench-client", NULL);
    moonlet_tls_files sf = {.cert = p[2], .key = p[3], .ca = p[0]};
    moonlet_tls_files cf = {.cert = p[4], .key = p[5], .ca = p[0]};
    if (!rc)
        rc = moonlet_tls_ctx_create(true, &sf, &b->tls_server) ||
             moonlet_tls_ctx_create(false, &cf, &b->tls_client);
    for (int i = 0; i < 6; i++)
        unlink(p[i]);
    rmdir(dir);
    return rc ? -1 : 0;
}

/* ---- measuring ---------------------------------------------------------- */

static int bench_point_measure(bench_ctx *b, int k, uint8_t *plain_dst, bench_point *p)
{
    double rd[BENCH_MAX_ROUNDS], wr[BENCH_MAX_ROUNDS], pl[BENCH_MAX_ROUNDS];
    double rdc[BENCH_MAX_ROUNDS], wrc[BENCH_MAX_ROUNDS], tl[BENCH_MAX_ROUNDS];
    uint64_t size = bench_sizes[k], bytes = bench_round_bytes[k];
    for (int r = 0; r < b->cfg.rounds; r++) { /* interleaved so drift hits all of them */
        rd[r] = bench_xfer_round(b, MOONLET_XFER_READ, size, bytes, false);
        rdc[r] = bench_xfer_round(b, MOONLET_XFER_READ, size, bytes, true);
        wr[r] = bench_xfer_round(b, MOONLET_XFER_WRITE, size, bytes, false);
        wrc[r] = bench_xfer_round(b, MOONLET_XFER_WRITE, size, bytes, true);
        pl[r] = b->cfg.protocol == MOONLET_XFER_RDMA
                    ? 0 /* the baseline is perftest's, measured beside */
                    : moonlet_bench_plain_gbps(b->local.base, plain_dst, size, bytes);
        tl[r] = b->cfg.tls ? bench_tls_gbps(b, b->local.base, plain_dst, size, bytes) : 0;
        if (rd[r] < 0 || wr[r] < 0 || pl[r] < 0 || rdc[r] < 0 || wrc[r] < 0 || tl[r] < 0)
            return -1;
    }
    p->read_gbps = bench_median(rd, b->cfg.rounds);
    p->write_gbps = bench_median(wr, b->cfg.rounds);
    p->read_ck_gbps = bench_median(rdc, b->cfg.rounds);
    p->write_ck_gbps = bench_median(wrc, b->cfg.rounds);
    p->plain_gbps = bench_median(pl, b->cfg.rounds);
    p->tls_gbps = bench_median(tl, b->cfg.rounds);
    return 0;
}

/* Median latency of single 4 KiB reads, in microseconds (rdma). */
static double bench_read_lat_us(bench_ctx *b)
{
    enum { N = 301 };
    double us[N];
    for (int i = 0; i < N; i++) {
        double t0 = moonlet_mono_s();
        if (moonlet_xfer_read(b->client, b->info.endpoint, b->info.segment_id,
                              (uint64_t)(i % 64) * 4096u, b->local.base, 4096))
            return -1;
        us[i] = (moonlet_mono_s() - t0) * 1e6;
    }
    return bench_median(us, N);
}

/* The checksum alone: XXH3-64 over the 16 MiB local buffer, GB/s (median). */
static double bench_xxh3_gbps(bench_ctx *b, int rounds)
{
    double v[BENCH_MAX_ROUNDS];
    uint64_t size = bench_sizes[BENCH_NSIZES - 1];
    for (int r = 0; r < rounds; r++) {
        double t0 = moonlet_mono_s();
        for (int i = 0; i < 16; i++)
            bench_ck_sink = XXH3_64bits(b->local.base, size);
        v[r] = 16.0 * (double)size / (moonlet_mono_s() - t0) / 1e9;
    }
    return bench_median(v, rounds);
}

static void bench_print_table(const bench_point *pts, double secs, bool tls)
{
    if (tls) {
        printf("%10s %12s %12s %8s\n", "size", "plain GB/s", "tls GB/s", "tls/pl");
        for (int k = 0; k < BENCH_NSIZES; k++)
            printf("%10llu %12.3f %12.3f %8.2f\n", (unsigned long long)bench_sizes[k],
                   pts[k].plain_gbps, pts[k].tls_gbps, pts[k].tls_gbps / pts[k].plain_gbps);
    }
    printf("%10s %12s %12s %12s %8s %8s %12s %12s\n", "size", "read GB/s", "write GB/s",
           "plain GB/s", "rd/pl", "wr/pl", "read+ck", "write+ck");
    for (int k = 0; k < BENCH_NSIZES; k++)
        printf("%10llu %12.3f %12.3f %12.3f %8.2f %8.2f %12.3f %12.3f\n",
               (unsigned long long)bench_sizes[k], pts[k].read_gbps, pts[k].write_gbps,
               pts[k].plain_gbps, pts[k].read_gbps / pts[k].plain_gbps,
               pts[k].write_gbps / pts[k].plain_gbps, pts[k].read_ck_gbps, pts[k].write_ck_gbps);
    printf("duration %.1f s\n", secs);
}

static void bench_print_json(bench_ctx *b, const bench_point *pts, double secs, double lat_us)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "benchmark", "transfer");
    cJSON_AddStringToObject(o, "transport", moonlet_xfer_protocol_name(b->client));
    cJSON_AddNumberToObject(o, "segment_bytes", (double)b->seg.size);
    cJSON_AddNumberToObject(o, "server_threads", b->cfg.server_threads);
    cJSON_AddNumberToObject(o, "rounds", b->cfg.rounds);
    cJSON_AddStringToObject(o, "statistic", "median");
    cJSON *arr = cJSON_AddArrayToObject(o, "results");
    for (int k = 0; k < BENCH_NSIZES; k++) {
        cJSON *r = cJSON_CreateObject();
        cJSON_AddNumberToObject(r, "size_bytes", (double)bench_sizes[k]);
        cJSON_AddNumberToObject(r, "read_gbps", pts[k].read_gbps);
        cJSON_AddNumberToObject(r, "write_gbps", pts[k].write_gbps);
        cJSON_AddNumberToObject(r, "plain_socket_gbps", pts[k].plain_gbps);
        cJSON_AddNumberToObject(r, "read_checksum_gbps", pts[k].read_ck_gbps);
        cJSON_AddNumberToObject(r, "write_checksum_gbps", pts[k].write_ck_gbps);
        if (b->cfg.tls)
            cJSON_AddNumberToObject(r, "tls_socket_gbps", pts[k].tls_gbps);
        cJSON_AddItemToArray(arr, r);
    }
    const bench_point *big = &pts[BENCH_NSIZES - 1];
    cJSON_AddNumberToObject(o, "checksum_xxh3_gbps", bench_xxh3_gbps(b, b->cfg.rounds));
    if (b->cfg.protocol == MOONLET_XFER_RDMA) { /* ratios: against perftest, outside */
        cJSON_AddNumberToObject(o, "read_4KiB_latency_us_median", lat_us);
    } else {
        double rr = big->read_gbps / big->plain_gbps, wr = big->write_gbps / big->plain_gbps;
        cJSON *ratio = cJSON_AddObjectToObject(o, "ratio_16MiB");
        cJSON_AddNumberToObject(ratio, "read_over_plain", rr);
        cJSON_AddNumberToObject(ratio, "write_over_plain", wr);
        cJSON_AddNumberToObject(o, "target_ratio", BENCH_TARGET_RATIO);
        cJSON_AddBoolToObject(o, "meets_target",
                              rr >= BENCH_TARGET_RATIO && wr >= BENCH_TARGET_RATIO);
    }
    cJSON_AddNumberToObject(o, "duration_s", secs);
    char *text = cJSON_PrintUnformatted(o);
    if (text)
        printf("%s\n", text);
    free(text);
    cJSON_Delete(o);
}

int moonlet_bench_transfer(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--device-buffers") == 0)
            return bench_device_main(argc, argv); /* tools/bench/device.c */
    bench_ctx b;
    memset(&b, 0, sizeof(b));
    if (bench_parse(argc, argv, &b.cfg))
        return 2;
    if (b.cfg.json)
        moonlet_log_set_level(MOONLET_LOG_WARN);
    double t0 = moonlet_mono_s();
    int rc = bench_setup(&b);
    if (rc == 0 && b.cfg.tls && bench_tls_setup(&b)) {
        fprintf(stderr, "moonlet-bench transfer: cannot set up TLS\n");
        rc = MOONLET_ERR_INTERNAL_ERROR;
    }
    uint8_t *plain_dst = malloc(bench_sizes[BENCH_NSIZES - 1]);
    bench_point pts[BENCH_NSIZES];
    if (!plain_dst)
        rc = MOONLET_ERR_INTERNAL_ERROR;
    else
        memset(plain_dst, 0, bench_sizes[BENCH_NSIZES - 1]);
    for (int k = 0; rc == 0 && k < BENCH_NSIZES; k++)
        rc = bench_point_measure(&b, k, plain_dst, &pts[k]);
    double lat_us = 0;
    if (rc == 0 && b.cfg.protocol == MOONLET_XFER_RDMA && (lat_us = bench_read_lat_us(&b)) < 0)
        rc = MOONLET_ERR_TRANSFER_FAIL;
    if (rc == 0) {
        if (b.cfg.json)
            bench_print_json(&b, pts, moonlet_mono_s() - t0, lat_us);
        else
            bench_print_table(pts, moonlet_mono_s() - t0, b.cfg.tls);
    }
    free(plain_dst);
    moonlet_tls_ctx_unref(b.tls_server);
    moonlet_tls_ctx_unref(b.tls_client);
    bench_teardown(&b);
    return rc ? 1 : 0;
}
