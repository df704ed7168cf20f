/*
 * disk.c - `moonlet-bench disk`: a store node's disk tier
 * (store/node/disk_tier.c) against fio on the same file system, in one run.
 *
 * Each round, for each object size: moonlet writes a round's bytes as
 * objects of that size into a fresh tier, in batches of B objects
 * (moonlet_disk_write_batch, each object at a placement the bench chooses
 * as the master would: one after the other from offset 0; up to the queue
 * depth of I/Os in flight across a batch's objects, then one data sync: a
 * batch is durable when the call returns), reads them all back in batches
 * of B (moonlet_disk_read_batch, each object verified: header and
 * checksum), and closes the tier (untimed).  --streams threads (default 2)
 * take the batches, as a store node writes its demotions: two batches in
 * flight, each on its own lane, so that one's data sync overlaps the
 * other's writes.  fio then writes and reads a file of the same bytes with
 * the same block size and queue depth (io_uring engine, O_DIRECT, and on
 * writes --fdatasync=B: a data sync issued after every B blocks, and
 * --end_fsync=1: a sync once every write completed, inside fio's timed
 * run, so that fio's time, as the tier's, ends with every byte durable).
 * Both write into fallocated space: the tier preallocates its file
 * (posix_fallocate), and fio's write job lays out a new file with
 * fallocate(2) too (strace: fallocate(fd, 0, 0, size)); the reads read
 * what the writes wrote.  Not quite the batch's contract: fio issues each
 * --fdatasync sync without waiting for it and goes on writing while it
 * runs; a tier batch returns only once its sync completed, and it is the
 * other stream's batch that overlaps it.  B is --batch-bytes / size, and
 * at least the queue depth: fio keeps that many blocks in flight, and a
 * batch's objects are what the tier has in flight (default 32 MiB and 32:
 * 512 objects of 64 KiB, 32 of 1 MiB, 32 of 16 MiB).  The two alternate which goes first.  GB/s are medians of the
 * rounds; the ratio is moonlet / fio (the target: 0.8 at 1 MiB and above).
 * fio is Debian's (scripts/setup.sh installs it); without it the bench says
 * so and exits 1.
 *
 * The files go in --dir (default: the working directory; not a tmpfs:
 * O_DIRECT) and are removed at the end.
 */
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "bytesize.h"
#include "disk_tier.h"
#include "monotime.h"
#include "thread.h"
#include "moonlet/error.h"

#define K_MAX_SIZES 4
#define K_MAX_ROUNDS 51
#define K_MAX_STREAMS 8
enum { K_WRITE, K_READ, K_NOPS };
enum { K_MOONLET, K_FIO, K_NPATHS };
static const char *const k_op[K_NOPS] = {"write", "read"};

typedef struct k_bench {
    bool json;
    int rounds;
    uint64_t sizes[K_MAX_SIZES];
    int nsizes;
    uint64_t round_bytes;
    unsigned qd;
    uint64_t batch_bytes;
    unsigned streams;
    const char *dir;
    char tier_path[512], fio_path[512];
    bench_samples s[K_MAX_SIZES][K_NPATHS][K_NOPS];
} k_bench;

static void k_usage(void)
{
    fprintf(stderr,
            "usage: moonlet-bench disk [--json] [--rounds N] [--sizes S,S...] [--round-bytes N]\n"
            "           [--queue-depth N] [--batch-bytes N] [--streams N] [--dir DIR]\n"
            "  the disk tier's durable batch writes and verified batch reads against fio\n"
            "  (io_uring, O_DIRECT, an fdatasync per batch of writes) on the same file\n"
            "  system, one run; defaults: 5 rounds, sizes 64KiB,1MiB,16MiB, 512MiB per\n"
            "  round, depth 32, batches of 32MiB (at least depth objects), 2 streams\n");
}

static int k_parse(int argc, char **argv, k_bench *b)
{
    enum { O_JSON = 1, O_ROUNDS, O_SIZES, O_ROUND_BYTES, O_QD, O_DIR, O_BATCH, O_STREAMS };
    static const struct option opts[] = {
        {"json", no_argument, 0, O_JSON},         {"rounds", required_argument, 0, O_ROUNDS},
        {"sizes", required_argument, 0, O_SIZES}, {"round-bytes", required_argument, 0, O_ROUND_BYTES},
        {"queue-depth", required_argument, 0, O_QD}, {"dir", required_argument, 0, O_DIR},
        {"batch-bytes", required_argument, 0, O_BATCH}, {"streams", required_argument, 0, O_STREAMS},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
    b->rounds = 5;
    b->sizes[0] = 64u << 10;
    b->sizes[1] = 1u << 20;
    b->sizes[2] = 16u << 20;
    b->nsizes = 3;
    b->round_bytes = 512u << 20;
    b->qd = 32;
    b->batch_bytes = 32u << 20;
    b->streams = 2;
    b->dir = ".";
    optind = 1;
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        uint64_t v = 0;
        long n = 0;
        switch (o) {
        case O_JSON:
            b->json = true;
            break;
        case O_ROUNDS:
            if (bench_flag_long("rounds", 1, K_MAX_ROUNDS, &n))
                return -1;
            b->rounds = (int)n;
            break;
        case O_SIZES:
            if (bench_parse_sizes(optarg, 4096, 256u << 20, 4096, b->sizes, K_MAX_SIZES,
                                  &b->nsizes)) {
                fprintf(stderr, "--sizes: up to %d sizes of 4 KiB..256 MiB, whole 4 KiB\n",
                        K_MAX_SIZES);
                return -1;
            }
            break;
        case O_ROUND_BYTES:
            if (moonlet_bytesize_parse(optarg, &v) || v < (1u << 20) || v > (64ull << 30)) {
                fprintf(stderr, "--round-bytes: 1 MiB..64 GiB\n");
                return -1;
            }
            b->round_bytes = v;
            break;
        case O_QD:
            if (bench_flag_long("queue-depth", 1, 1024, &n))
                return -1;
            b->qd = (unsigned)n;
            break;
        case O_STREAMS:
            if (bench_flag_long("streams", 1, K_MAX_STREAMS, &n))
                return -1;
            b->streams = (unsigned)n;
            break;
        case O_DIR:
            b->dir = optarg;
            break;
        case O_BATCH:
            if (moonlet_bytesize_parse(optarg, &v) || v < 4096 || v > (1ull << 30)) {
                fprintf(stderr, "--batch-bytes: 4 KiB..1 GiB\n");
                return -1;
            }
            b->batch_bytes = v;
            break;
        default:
            k_usage();
            return -1;
        }
    }
    for (int k = 0; k < b->nsizes; k++)
        if (b->sizes[k] > b->round_bytes) {
            fprintf(stderr, "a size is larger than --round-bytes\n");
            return -1;
        }
    return 0;
}

/* Objects per batch at object size `size`: --batch-bytes of them, and at
 * least the queue depth's (fio keeps that many blocks in flight; a batch's
 * objects are what the tier has in flight), at most a round's. */
static size_t k_batch(const k_bench *b, uint64_t size)
{
    size_t per = (size_t)(b->batch_bytes / size), n = (size_t)(b->round_bytes / size);
    per = per < b->qd ? b->qd : per;
    return per > n ? n : per;
}

/* 0 when every one of a batch's m results (objects first.. of n) is 0;
 * else -1, the first failure said. */
static int batch_failed(const int *res, size_t m, size_t first, size_t n, const char *what)
{
    for (size_t k = 0; k < m; k++)
        if (res[k]) {
            fprintf(stderr, "disk bench: %s %zu of %zu failed\n", what, first + k, n);
            return -1;
        }
    return 0;
}

/* One round of moonlet at one size, shared by its streams: each stream
 * takes the next batch (writes, then, once every stream wrote, reads) and
 * has its own requests and read buffer. */
typedef struct k_run {
    moonlet_disk *d;
    const moonlet_disk_loc *loc;
    char (*key)[32];
    const unsigned char *data;
    uint64_t size, sum;
    size_t n, per;
    bool write;
    _Atomic size_t next; /* the next batch's first object */
    _Atomic int rc;
} k_run;

typedef struct k_stream {
    k_run *run;
    moonlet_disk_wreq *w;
    moonlet_disk_rreq *r;
    int *res;
    unsigned char *back; /* per objects, block aligned, as a node's segments are */
    size_t last; /* objects of its last read batch, in back */
    pthread_t th;
    bool started;
} k_stream;

/* A stream's batches until none is left or one failed. */
static void *k_stream_main(void *arg)
{
    k_stream *s = arg;
    k_run *u = s->run;
    struct iovec iov = {(void *)u->data, u->size};
    for (;;) {
        size_t i = atomic_fetch_add(&u->next, u->per);
        if (i >= u->n || atomic_load(&u->rc))
            break;
        size_t m = u->n - i < u->per ? u->n - i : u->per;
        int rc;
        if (u->write) {
            for (size_t k = 0; k < m; k++)
                s->w[k] = (moonlet_disk_wreq){.loc = (moonlet_disk_loc *)&u->loc[i + k],
                                              .placed = true, .key = u->key[i + k],
                                              .key_len = (uint32_t)strlen(u->key[i + k]),
                                              .iov = &iov, .iovcnt = 1, .checksum = u->sum};
            rc = moonlet_disk_write_batch(u->d, s->w, m, s->res) ? -1
                                                               : batch_failed(s->res, m, i, u->n,
                                                                              "write");
        } else {
            for (size_t k = 0; k < m; k++)
                s->r[k] = (moonlet_disk_rreq){.loc = u->loc[i + k], .key = u->key[i + k],
                                              .key_len = (uint32_t)strlen(u->key[i + k]),
                                              .buf = s->back + k * u->size, .cap = u->size};
            rc = moonlet_disk_read_batch(u->d, s->r, m, s->res) ? -1
                                                              : batch_failed(s->res, m, i, u->n,
                                                                             "read");
            s->last = m; /* compared once the phase is timed */
        }
        if (rc)
            atomic_store(&u->rc, rc);
    }
    return NULL;
}

/* Runs every stream over the round's objects (writes or reads): its
 * seconds, or -1 when one failed. */
static double k_phase(k_run *u, k_stream *st, unsigned nst, bool write)
{
    u->write = write;
    atomic_store(&u->next, 0);
    double t0 = moonlet_mono_s();
    for (unsigned k = 0; k < nst; k++)
        st[k].started = k == 0 || moonlet_thread_create(&st[k].th, k_stream_main, &st[k],
                                                        "bench-disk%u", k) == 0;
    k_stream_main(&st[0]);
    for (unsigned k = 1; k < nst; k++)
        if (st[k].started)
            pthread_join(st[k].th, NULL);
    double t = moonlet_mono_s() - t0;
    return atomic_load(&u->rc) ? -1 : t;
}

static int k_moonlet(k_bench *b, uint64_t size, const unsigned char *data, double out[K_NOPS])
{
    size_t n = (size_t)(b->round_bytes / size), per = k_batch(b, size);
    unlink(b->tier_path);
    const char *paths[] = {b->tier_path};
    /* room for the objects and their header blocks */
    uint64_t cap = (n * moonlet_disk_footprint(32, size) + (2u << 20)) / (1u << 20) * (1u << 20);
    moonlet_disk_opts o = {.paths = paths, .npaths = 1, .size = cap, .queue_depth = b->qd,
                           .lanes = b->streams};
    moonlet_disk *d = NULL;
    if (moonlet_disk_open(&o, &d)) {
        fprintf(stderr, "disk bench: cannot open a tier in %s\n", b->dir);
        return -1;
    }
    moonlet_disk_loc *loc = calloc(n, sizeof(*loc));
    char (*key)[32] = calloc(n, sizeof(*key));
    k_stream st[K_MAX_STREAMS] = {0};
    k_run u = {.d = d, .loc = loc, .key = key, .data = data, .size = size, .n = n, .per = per,
               .sum = XXH3_64bits(data, size)};
    int rc = loc && key ? 0 : -1;
    for (unsigned k = 0; k < b->streams && !rc; k++) {
        st[k] = (k_stream){.run = &u, .w = calloc(per, sizeof(*st[k].w)),
                           .r = calloc(per, sizeof(*st[k].r)),
                           .res = calloc(per, sizeof(*st[k].res))};
        if (posix_memalign((void **)&st[k].back, MOONLET_DISK_BLOCK, per * size))
            st[k].back = NULL;
        else
            memset(st[k].back, 0, per * size); /* resident, as a node's segments are (untimed) */
        rc = st[k].w && st[k].r && st[k].res && st[k].back ? 0 : -1;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < n && !rc; i++) { /* placed one after the other, as a master would */
        snprintf(key[i], sizeof key[i], "disk-bench-%zu", i);
        loc[i] = (moonlet_disk_loc){.path = 0, .offset = off, .size = size};
        off += moonlet_disk_footprint((uint32_t)strlen(key[i]), size);
    }
    double tw = rc ? -1 : k_phase(&u, st, b->streams, true);
    double tr = tw < 0 ? -1 : k_phase(&u, st, b->streams, false);
    rc = tw < 0 || tr < 0 ? -1 : 0;
    /* the bytes the tier returned (verified by it) are the bytes written:
     * each stream's last batch, outside the timed phase */
    for (unsigned k = 0; k < b->streams && !rc; k++)
        for (size_t i = 0; i < st[k].last && !rc; i++)
            if (memcmp(st[k].back + i * size, data, size) != 0) {
                fprintf(stderr, "disk bench: the bytes read differ from those written\n");
                rc = -1;
            }
    moonlet_disk_close(d);
    unlink(b->tier_path);
    free(loc);
    free(key);
    for (unsigned k = 0; k < b->streams; k++) {
        free(st[k].w);
        free(st[k].r);
        free(st[k].res);
        free(st[k].back);
    }
    out[K_WRITE] = (double)n * (double)size / tw / 1e9;
    out[K_READ] = (double)n * (double)size / tr / 1e9;
    return rc;
}

/* fio's bandwidth in GB/s for one job (rw "write" or "read"), or -1. */
static double k_fio_job(k_bench *b, uint64_t size, const char *rw)
{
    char cmd[2048], sync[64] = "";
    size_t per = k_batch(b, size), n = (size_t)(b->round_bytes / size);
    if (strcmp(rw, "write") == 0) /* a sync per batch, and one once every write completed */
        snprintf(sync, sizeof sync, "--fdatasync=%zu --end_fsync=1", per);
    snprintf(cmd, sizeof cmd,
             "fio --name=moonlet-bench --filename='%s' --size=%llu --bs=%llu --iodepth=%u "
             "--ioengine=io_uring --direct=1 --rw=%s %s --output-format=json 2>/dev/null",
             b->fio_path, (unsigned long long)n * size, (unsigned long long)size, b->qd, rw, sync);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf && !feof(f)) {
        if (len + 4096 > cap && !(buf = realloc(buf, cap *= 2)))
            break;
        len += fread(buf + len, 1, cap - len - 1, f);
    }
    int st = pclose(f);
    double gbps = -1;
    if (buf && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        buf[len] = 0;
        cJSON *root = cJSON_Parse(buf);
        cJSON *jobs = cJSON_GetObjectItem(root, "jobs");
        cJSON *job = cJSON_GetArrayItem(jobs, 0);
        cJSON *part = cJSON_GetObjectItem(job, strcmp(rw, "write") == 0 ? "write" : "read");
        cJSON *bw = cJSON_GetObjectItem(part, "bw_bytes");
        if (cJSON_IsNumber(bw) && bw->valuedouble > 0)
            gbps = bw->valuedouble / 1e9;
        cJSON_Delete(root);
    }
    free(buf);
    return gbps;
}

static int k_fio(k_bench *b, uint64_t size, double out[K_NOPS])
{
    unlink(b->fio_path);
    out[K_WRITE] = k_fio_job(b, size, "write");
    out[K_READ] = out[K_WRITE] > 0 ? k_fio_job(b, size, "read") : -1;
    unlink(b->fio_path);
    if (out[K_WRITE] <= 0 || out[K_READ] <= 0) {
        fprintf(stderr, "disk bench: fio failed (is it installed? scripts/setup.sh)\n");
        return -1;
    }
    return 0;
}

int bench_disk_main(int argc, char **argv)
{
    k_bench b = {0};
    if (k_parse(argc, argv, &b))
        return 2;
    if (system("fio --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "moonlet-bench disk: no fio (Debian's fio: scripts/setup.sh)\n");
        return 1;
    }
    snprintf(b.tier_path, sizeof b.tier_path, "%s/moonlet-bench-disk.%d", b.dir, (int)getpid());
    snprintf(b.fio_path, sizeof b.fio_path, "%s/moonlet-bench-fio.%d", b.dir, (int)getpid());
    uint64_t largest = 0;
    for (int k = 0; k < b.nsizes; k++)
        largest = b.sizes[k] > largest ? b.sizes[k] : largest;
    unsigned char *data = NULL;
    if (posix_memalign((void **)&data, MOONLET_DISK_BLOCK, largest))
        return 1;
    for (uint64_t i = 0; i < largest; i++)
        data[i] = (unsigned char)(i * 2654435761u >> 13);
    int rc = 0;
    for (int r = 0; r < b.rounds && !rc; r++)
        for (int k = 0; k < b.nsizes && !rc; k++)
            for (int x = 0; x < K_NPATHS && !rc; x++) {
                int p = (x + r + k) % K_NPATHS; /* alternating which goes first */
                double out[K_NOPS];
                rc = p == K_MOONLET ? k_moonlet(&b, b.sizes[k], data, out)
                                    : k_fio(&b, b.sizes[k], out);
                for (int o = 0; !rc && o < K_NOPS; o++)
                    bench_samples_add(&b.s[k][p][o], out[o]);
            }
    free(data);
    unlink(b.tier_path);
    unlink(b.fio_path);
    if (rc) {
        fprintf(stderr, "moonlet-bench disk: cannot measure\n");
        return 1;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "disk");
    cJSON_AddNumberToObject(root, "rounds", b.rounds);
    cJSON_AddNumberToObject(root, "round_bytes", (double)b.round_bytes);
    cJSON_AddNumberToObject(root, "queue_depth", b.qd);
    cJSON_AddNumberToObject(root, "batch_bytes", (double)b.batch_bytes);
    cJSON_AddNumberToObject(root, "streams", b.streams);
    cJSON *arr = cJSON_AddArrayToObject(root, "sizes");
    for (int k = 0; k < b.nsizes; k++) {
        cJSON *z = cJSON_CreateObject();
        cJSON_AddNumberToObject(z, "size", (double)b.sizes[k]);
        cJSON_AddNumberToObject(z, "batch", (double)k_batch(&b, b.sizes[k])); /* fio's fdatasync= */
        for (int o = 0; o < K_NOPS; o++)
            bench_json_ratio(z, k_op[o], "moonlet", bench_percentile(&b.s[k][K_MOONLET][o], 50),
                             "fio", bench_percentile(&b.s[k][K_FIO][o], 50));
        cJSON_AddItemToArray(arr, z);
    }
    cJSON_AddNumberToObject(root, "target_ratio", 0.8);
    if (b.json) {
        bench_print_json(root); /* frees it */
        root = NULL;
    } else {
        printf("disk tier vs fio (%d rounds of %llu bytes, depth %u, %u streams, a sync per "
               "batch of %llu bytes and at least %u objects; GB/s, medians)\n",
               b.rounds, (unsigned long long)b.round_bytes, b.qd, b.streams,
               (unsigned long long)b.batch_bytes, b.qd);
        for (int k = 0; k < b.nsizes; k++) {
            char sz[32];
            for (int o = 0; o < K_NOPS; o++) {
                double m = bench_percentile(&b.s[k][K_MOONLET][o], 50);
                double f = bench_percentile(&b.s[k][K_FIO][o], 50);
                printf("  %8s %-5s moonlet %6.2f  fio %6.2f  ratio %.2f\n",
                       moonlet_bytesize_format(b.sizes[k], sz, sizeof sz), k_op[o], m, f,
                       f > 0 ? m / f : 0);
            }
        }
    }
    cJSON_Delete(root);
    for (int k = 0; k < b.nsizes; k++)
        for (int p = 0; p < K_NPATHS; p++)
            for (int o = 0; o < K_NOPS; o++)
                bench_samples_free(&b.s[k][p][o]);
    return 0;
}
