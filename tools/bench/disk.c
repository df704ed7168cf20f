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
 * checksum), and closes the tier (untimed); fio then writes and reads a
 * file of the same bytes with the same block size and queue depth
 * (io_uring engine, O_DIRECT, and on writes --fdatasync=B: a data sync
 * issued after every B blocks, and --end_fsync=1: a sync once every write
 * completed, inside fio's timed run, so that fio's time, as the tier's,
 * ends with every byte durable).  Both write into fallocated space: the
 * tier preallocates its file (posix_fallocate), and fio's write job lays
 * out a new file with fallocate(2) too (strace: fallocate(fd, 0, 0, size));
 * the reads read what the writes wrote.  Not quite the batch's contract:
 * fio issues each --fdatasync sync without waiting for the writes in
 * flight, and goes on writing while it runs, so its syncs overlap its
 * writes; the tier returns from a batch only once its sync (after every
 * I/O of the batch) completed, so one batch's flush does not overlap the
 * next batch's writes (within a batch, sync-behind overlaps them).  A
 * larger --batch-bytes brings the two closer (docs/benchmarks.md).  B is --batch-bytes / size (at
 * least 1; default 32 MiB: 512 objects of 64 KiB, 32 of 1 MiB, 2 of 16
 * MiB).  The two alternate which goes first.  GB/s are medians of the
 * rounds; the ratio is moonlet / fio (issue 32's target: 0.8 at 1 MiB and
 * above).  fio is Debian's (scripts/setup.sh installs it); without it the
 * bench says so and exits 1.
 *
 * The files go in --dir (default: the working directory; not a tmpfs:
 * O_DIRECT) and are removed at the end.
 */
#include <getopt.h>
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
#include "moonlet/error.h"

#define K_MAX_SIZES 4
#define K_MAX_ROUNDS 51
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
    const char *dir;
    char tier_path[512], fio_path[512];
    bench_samples s[K_MAX_SIZES][K_NPATHS][K_NOPS];
} k_bench;

static void k_usage(void)
{
    fprintf(stderr,
            "usage: moonlet-bench disk [--json] [--rounds N] [--sizes S,S...] [--round-bytes N]\n"
            "           [--queue-depth N] [--batch-bytes N] [--dir DIR]\n"
            "  the disk tier's durable batch writes and verified batch reads against fio\n"
            "  (io_uring, O_DIRECT, an fdatasync per batch of writes) on the same file\n"
            "  system, one run; defaults: 3 rounds, sizes 64KiB,1MiB,16MiB, 512MiB per\n"
            "  round, depth 32, batches of 32MiB (at least one object)\n");
}

static int k_parse(int argc, char **argv, k_bench *b)
{
    enum { O_JSON = 1, O_ROUNDS, O_SIZES, O_ROUND_BYTES, O_QD, O_DIR, O_BATCH };
    static const struct option opts[] = {
        {"json", no_argument, 0, O_JSON},         {"rounds", required_argument, 0, O_ROUNDS},
        {"sizes", required_argument, 0, O_SIZES}, {"round-bytes", required_argument, 0, O_ROUND_BYTES},
        {"queue-depth", required_argument, 0, O_QD}, {"dir", required_argument, 0, O_DIR},
        {"batch-bytes", required_argument, 0, O_BATCH},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
    b->rounds = 3;
    b->sizes[0] = 64u << 10;
    b->sizes[1] = 1u << 20;
    b->sizes[2] = 16u << 20;
    b->nsizes = 3;
    b->round_bytes = 512u << 20;
    b->qd = 32;
    b->batch_bytes = 32u << 20;
    b->dir = ".";
    optind = 1;
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        char *end = NULL;
        uint64_t v = 0;
        switch (o) {
        case O_JSON:
            b->json = true;
            break;
        case O_ROUNDS:
            b->rounds = (int)strtol(optarg, &end, 10);
            if (*end || b->rounds < 1 || b->rounds > K_MAX_ROUNDS) {
                fprintf(stderr, "--rounds: 1..%d\n", K_MAX_ROUNDS);
                return -1;
            }
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
            b->qd = (unsigned)strtoul(optarg, &end, 10);
            if (*end || b->qd < 1 || b->qd > 1024) {
                fprintf(stderr, "--queue-depth: 1..1024\n");
                return -1;
            }
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

/* Objects per batch at object size `size` (1 .. a round's objects). */
static size_t k_batch(const k_bench *b, uint64_t size)
{
    size_t per = (size_t)(b->batch_bytes / size), n = (size_t)(b->round_bytes / size);
    return per < 1 ? 1 : per > n ? n : per;
}

/* One round of moonlet at object size `size`: out[] in GB/s, or -1. */
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

static int k_moonlet(k_bench *b, uint64_t size, const unsigned char *data, double out[K_NOPS])
{
    size_t n = (size_t)(b->round_bytes / size), per = k_batch(b, size);
    unlink(b->tier_path);
    const char *paths[] = {b->tier_path};
    /* room for the objects and their header blocks */
    uint64_t cap = (n * moonlet_disk_footprint(32, size) + (2u << 20)) / (1u << 20) * (1u << 20);
    moonlet_disk_opts o = {.paths = paths, .npaths = 1, .size = cap, .queue_depth = b->qd};
    moonlet_disk *d = NULL;
    if (moonlet_disk_open(&o, &d)) {
        fprintf(stderr, "disk bench: cannot open a tier in %s\n", b->dir);
        return -1;
    }
    moonlet_disk_loc *loc = calloc(n, sizeof(*loc));
    char (*key)[32] = calloc(n, sizeof(*key));
    moonlet_disk_wreq *w = calloc(per, sizeof(*w));
    moonlet_disk_rreq *r = calloc(per, sizeof(*r));
    int *res = calloc(per, sizeof(*res));
    /* block aligned, as a node's segments are: whole blocks go without a copy */
    unsigned char *back = NULL;
    if (posix_memalign((void **)&back, MOONLET_DISK_BLOCK, per * size))
        back = NULL;
    else
        memset(back, 0, per * size); /* resident, as a node's segments are (untimed) */
    uint64_t sum = XXH3_64bits(data, size);
    struct iovec iov = {(void *)data, size};
    int rc = loc && key && w && r && res && back ? 0 : -1;
    uint64_t off = 0;
    for (size_t i = 0; i < n && !rc; i++) { /* placed one after the other, as a master would */
        snprintf(key[i], sizeof key[i], "disk-bench-%zu", i);
        loc[i] = (moonlet_disk_loc){.path = 0, .offset = off, .size = size};
        off += moonlet_disk_footprint((uint32_t)strlen(key[i]), size);
    }
    double t0 = moonlet_mono_s();
    for (size_t i = 0; i < n && !rc; i += per) {
        size_t m = n - i < per ? n - i : per;
        for (size_t k = 0; k < m; k++)
            w[k] = (moonlet_disk_wreq){.loc = &loc[i + k], .placed = true, .key = key[i + k],
                                       .key_len = (uint32_t)strlen(key[i + k]), .iov = &iov,
                                       .iovcnt = 1, .checksum = sum};
        rc = moonlet_disk_write_batch(d, w, m, res) ? -1 : batch_failed(res, m, i, n, "write");
    }
    double t1 = moonlet_mono_s();
    for (size_t i = 0; i < n && !rc; i += per) {
        size_t m = n - i < per ? n - i : per;
        for (size_t k = 0; k < m; k++)
            r[k] = (moonlet_disk_rreq){.loc = loc[i + k], .key = key[i + k],
                                       .key_len = (uint32_t)strlen(key[i + k]),
                                       .buf = back + k * size, .cap = size};
        rc = moonlet_disk_read_batch(d, r, m, res) ? -1 : batch_failed(res, m, i, n, "read");
    }
    double t2 = moonlet_mono_s();
    for (size_t k = 0; k < per && !rc; k++)
        if (memcmp(back + k * size, data, size) != 0) {
            fprintf(stderr, "disk bench: the bytes read differ from those written\n");
            rc = -1;
        }
    moonlet_disk_close(d);
    unlink(b->tier_path);
    free(loc);
    free(key);
    free(w);
    free(r);
    free(res);
    free(back);
    out[K_WRITE] = (double)n * (double)size / (t1 - t0) / 1e9;
    out[K_READ] = (double)n * (double)size / (t2 - t1) / 1e9;
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
    cJSON *arr = cJSON_AddArrayToObject(root, "sizes");
    for (int k = 0; k < b.nsizes; k++) {
        cJSON *z = cJSON_CreateObject();
        cJSON_AddNumberToObject(z, "size", (double)b.sizes[k]);
        cJSON_AddNumberToObject(z, "batch", (double)k_batch(&b, b.sizes[k])); /* fio's fdatasync= */
        for (int o = 0; o < K_NOPS; o++) {
            char name[48];
            double m = bench_percentile(&b.s[k][K_MOONLET][o], 50);
            double f = bench_percentile(&b.s[k][K_FIO][o], 50);
            snprintf(name, sizeof name, "moonlet_%s_gbps", k_op[o]);
            cJSON_AddNumberToObject(z, name, m);
            snprintf(name, sizeof name, "fio_%s_gbps", k_op[o]);
            cJSON_AddNumberToObject(z, name, f);
            snprintf(name, sizeof name, "%s_ratio", k_op[o]);
            cJSON_AddNumberToObject(z, name, f > 0 ? m / f : 0);
        }
        cJSON_AddItemToArray(arr, z);
    }
    cJSON_AddNumberToObject(root, "target_ratio", 0.8);
    if (b.json) {
        bench_print_json(root); /* frees it */
        root = NULL;
    } else {
        printf("disk tier vs fio (%d rounds of %llu bytes, depth %u, a sync per %llu bytes of "
               "writes; GB/s, medians)\n",
               b.rounds, (unsigned long long)b.round_bytes, b.qd,
               (unsigned long long)b.batch_bytes);
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
