/*
 * device.c - `moonlet-bench transfer --device-buffers`: puts and gets from
 * and into CUDA device memory (client_gpu.c's staged path) beside the same
 * calls from and into registered host memory, in one run.
 *
 * A master and a store node (moonlet-master, moonlet-store --protocol tcp on
 * 127.0.0.1) are started as children; one direct client makes every call.
 * Per object size (default 1 MiB and 16 MiB) and round, each path puts a
 * round's bytes (default 128 MiB: 128 x 1 MiB, 8 x 16 MiB) with one
 * moonlet_client_batch_put_from and gets them back with one
 * moonlet_client_batch_get_into, the two paths in alternating order so
 * machine noise hits them alike; the round's keys are then removed
 * (untimed; puts are soft-pinned, so that eviction never takes a round's
 * objects: a store too small fails the bench instead).  Every get is compared with what was put (device bytes by a
 * driver copy back to the host, untimed): a mismatch fails the bench.
 * Figures are medians over the rounds, in GB/s of object bytes; the ratio
 * device/host is of medians (target >= 0.8 at 1 MiB and 16 MiB).  The same
 * run measures the driver's own device-to-host copy bandwidth into pinned
 * memory (cuMemcpyDtoH of the round's bytes), the ceiling of the staged
 * path, and reports the client's pinned staging against its bound.
 *
 * The device memory is that of the CUDA driver the client loads (libcuda.so.1,
 * or MOONLET_CUDA_DRIVER: in CI the fake driver, tests/gpu/fakecuda.c).
 * Takes no locks of its own; everything runs on the calling thread.
 */
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bytesize.h"
#include "client_gpu.h"
#include "cuda_driver.h"
#include "monotime.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "transfer.h"

#define D_MAX_SIZES 8
#define D_MAX_ROUNDS 50
enum { D_HOST, D_DEVICE, D_NPATHS };
enum { D_PUT, D_GET, D_NOPS };
static const char *const d_path[D_NPATHS] = {"host", "device"};
static const char *const d_op[D_NOPS] = {"put", "get"};

typedef struct d_bench {
    bool json;
    int rounds;
    uint64_t sizes[D_MAX_SIZES];
    int nsizes;
    uint64_t round_bytes;
    uint64_t staging;  /* the client's gpu_staging_size; 0: default */
    const char *lease_ms;
    int device;        /* CUDA device ordinal */
    const moonlet_cuda *cu;
    CUcontext ctx;
    moonlet_client *c;
    /* per path: source and destination of a round */
    void *src[D_NPATHS], *dst[D_NPATHS];
    unsigned char *check; /* host copy of a device destination, for the comparison */
    size_t max_keys;
    char **keys;
    const void **pb;
    void **gb;
    size_t *lens, *got;
    int32_t *res;
    bench_samples s[D_MAX_SIZES][D_NPATHS][D_NOPS];
    bench_samples d2h;
} d_bench;

static void d_usage(void)
{
    fprintf(stderr,
            "usage: moonlet-bench transfer --device-buffers [--json] [--rounds N] [--sizes S,S...]\n"
            "           [--round-bytes N] [--gpu-staging N] [--device N] [--lease-ms N]\n"
            "  puts and gets from/into CUDA device memory (staged through pinned host\n"
            "  memory) beside the same calls on registered host memory, one run;\n"
            "  defaults: 7 rounds, sizes 1MiB,16MiB, 128MiB per round, device 0\n");
}

static int d_parse(int argc, char **argv, d_bench *b)
{
    enum { O_JSON = 1, O_ROUNDS, O_SIZES, O_ROUND_BYTES, O_STAGING, O_DEVICE, O_LEASE, O_DEV };
    static const struct option opts[] = {
        {"json", no_argument, 0, O_JSON},          {"rounds", required_argument, 0, O_ROUNDS},
        {"sizes", required_argument, 0, O_SIZES},  {"round-bytes", required_argument, 0, O_ROUND_BYTES},
        {"gpu-staging", required_argument, 0, O_STAGING},
        {"device", required_argument, 0, O_DEVICE}, {"lease-ms", required_argument, 0, O_LEASE},
        {"device-buffers", no_argument, 0, O_DEV},  {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    b->rounds = 7;
    b->sizes[0] = 1u << 20;
    b->sizes[1] = 16u << 20;
    b->nsizes = 2;
    b->round_bytes = 128u << 20;
    b->lease_ms = "500";
    optind = 1;
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        long n;
        switch (o) {
        case O_JSON:
            b->json = true;
            break;
        case O_DEV:
            break;
        case O_ROUNDS:
            if (bench_flag_long("rounds", 1, D_MAX_ROUNDS, &n))
                return -1;
            b->rounds = (int)n;
            break;
        case O_SIZES:
            if (bench_parse_sizes(optarg, 1, 1u << 30, 1, b->sizes, D_MAX_SIZES, &b->nsizes)) {
                fprintf(stderr, "--sizes: up to %d sizes of 1 B..1 GiB\n", D_MAX_SIZES);
                return -1;
            }
            break;
        case O_ROUND_BYTES:
        case O_STAGING: {
            uint64_t v;
            if (moonlet_bytesize_parse(optarg, &v) || !v || v > (8ull << 30)) {
                fprintf(stderr, "%s: a size of 1 B..8 GiB\n",
                        o == O_STAGING ? "--gpu-staging" : "--round-bytes");
                return -1;
            }
            *(o == O_STAGING ? &b->staging : &b->round_bytes) = v;
            break;
        }
        case O_DEVICE:
            if (bench_flag_long("device", 0, 63, &n))
                return -1;
            b->device = (int)n;
            break;
        case O_LEASE:
            b->lease_ms = optarg;
            break;
        case 'h':
            d_usage();
            return 1;
        default:
            return -1;
        }
    }
    return 0;
}

static size_t d_keys(const d_bench *b, int k)
{
    uint64_t n = b->round_bytes / b->sizes[k];
    return n ? (size_t)n : 1;
}

/* The round's buffers and arrays, sized for the largest round. */
static int d_alloc(d_bench *b)
{
    const moonlet_cuda *cu = b->cu;
    size_t bytes = 0;
    for (int k = 0; k < b->nsizes; k++) {
        size_t n = d_keys(b, k) * (size_t)b->sizes[k];
        bytes = n > bytes ? n : bytes;
        b->max_keys = d_keys(b, k) > b->max_keys ? d_keys(b, k) : b->max_keys;
    }
    for (int p = 0; p < D_NPATHS; p++) {
        for (int w = 0; w < 2; w++) {
            void **at = w ? &b->dst[p] : &b->src[p];
            if (p == D_HOST) {
                if (!(*at = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)))
                    return -1;
                memset(*at, 0, bytes);
            } else {
                CUdeviceptr d;
                if (cu->cuMemAlloc(&d, bytes) != CUDA_SUCCESS)
                    return -1;
                *at = (void *)(uintptr_t)d;
            }
            if (moonlet_client_register_buffer(b->c, *at, bytes))
                return -1;
        }
    }
    /* the same pattern in both sources */
    unsigned char *pat = malloc(bytes);
    if (!pat || !(b->check = malloc(bytes)))
        return -1;
    for (size_t i = 0; i < bytes; i++)
        pat[i] = (unsigned char)((i * 2654435761u) >> 11);
    memcpy(b->src[D_HOST], pat, bytes);
    CUresult r = cu->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)b->src[D_DEVICE], pat, bytes);
    free(pat);
    if (r != CUDA_SUCCESS)
        return -1;
    size_t n = b->max_keys;
    b->keys = calloc(n, sizeof(*b->keys));
    b->pb = calloc(n, sizeof(*b->pb));
    b->gb = calloc(n, sizeof(*b->gb));
    b->lens = calloc(n, sizeof(*b->lens));
    b->got = calloc(n, sizeof(*b->got));
    b->res = calloc(n, sizeof(*b->res));
    if (!b->keys || !b->pb || !b->gb || !b->lens || !b->got || !b->res)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!(b->keys[i] = malloc(48)))
            return -1;
    return 0;
}

/* One path's put and get of a round of objects of size k: GB/s of each. */
static int d_measure(d_bench *b, int k, int p, int round, double out[D_NOPS])
{
    size_t n = d_keys(b, k), size = (size_t)b->sizes[k];
    for (size_t i = 0; i < n; i++) {
        snprintf(b->keys[i], 48, "dev-%s-%d-%d-%zu", d_path[p], k, round, i);
        b->pb[i] = (const unsigned char *)b->src[p] + i * size;
        b->gb[i] = (unsigned char *)b->dst[p] + i * size;
        b->lens[i] = size;
    }
    double bytes = (double)n * (double)size;
    double t0 = moonlet_mono_s();
    /* soft-pinned: under pressure a put fails (NO_AVAILABLE_HANDLE) rather
     * than evict what the round just put */
    moonlet_put_options opt = {.soft_pin = true};
    int rc = moonlet_client_batch_put_from(b->c, (const char *const *)b->keys, n, b->pb, b->lens,
                                           &opt, b->res);
    double t1 = moonlet_mono_s();
    if (rc) {
        fprintf(stderr, "device bench: put on %s: %s\n", d_path[p], moonlet_strerror(rc));
        return -1;
    }
    double t2 = moonlet_mono_s();
    rc = moonlet_client_batch_get_into(b->c, (const char *const *)b->keys, n, b->gb, b->lens, NULL,
                                       b->got, b->res);
    double t3 = moonlet_mono_s();
    if (rc) {
        for (size_t i = 0; i < n; i++)
            if (b->res[i]) {
                fprintf(stderr, "device bench: get of %s: %s\n", b->keys[i],
                        moonlet_strerror(b->res[i]));
                break;
            }
        fprintf(stderr, "device bench: get on %s: %s\n", d_path[p], moonlet_strerror(rc));
        return -1;
    }
    /* untimed: the bytes read are the bytes put */
    const unsigned char *want = b->src[D_HOST], *got = b->dst[D_HOST];
    if (p == D_DEVICE) {
        if (b->cu->cuMemcpyDtoH(b->check, (CUdeviceptr)(uintptr_t)b->dst[p], n * size))
            return -1;
        got = b->check;
    }
    if (memcmp(want, got, n * size) != 0) {
        fprintf(stderr, "device bench: %s, %zu B objects: the bytes read differ from those put\n",
                d_path[p], size);
        return -1;
    }
    uint64_t removed;
    if (moonlet_client_remove_all_force(b->c, NULL, &removed) || removed != n) {
        fprintf(stderr, "device bench: the round's keys were not all removed\n");
        return -1;
    }
    out[D_PUT] = bytes / (t1 - t0) / 1e9;
    out[D_GET] = bytes / (t3 - t2) / 1e9;
    return 0;
}

/* The driver's device-to-host copy bandwidth into pinned memory: the
 * ceiling of the staged path, in the same run. */
static int d_driver_d2h(d_bench *b, size_t bytes)
{
    const moonlet_cuda *cu = b->cu;
    void *pinned = NULL;
    if (cu->cuMemHostAlloc(&pinned, bytes, 0) != CUDA_SUCCESS)
        return -1;
    for (int r = 0; r < b->rounds + 1; r++) {
        double t0 = moonlet_mono_s();
        CUresult e = cu->cuMemcpyDtoH(pinned, (CUdeviceptr)(uintptr_t)b->src[D_DEVICE], bytes);
        double t1 = moonlet_mono_s();
        if (e != CUDA_SUCCESS) {
            cu->cuMemFreeHost(pinned);
            return -1;
        }
        if (r) /* the first warms up */
            bench_samples_add(&b->d2h, (double)bytes / (t1 - t0) / 1e9);
    }
    cu->cuMemFreeHost(pinned);
    return 0;
}

static double d_median(bench_samples *s)
{
    return s->n ? bench_percentile(s, 50) : 0;
}

static void d_report(d_bench *b)
{
    moonlet_client_gpu_stats st;
    moonlet_client_gpu_get_stats(b->c, &st);
    double d2h = d_median(&b->d2h);
    char sz[32];
    if (!b->json) {
        printf("moonlet-bench transfer --device-buffers: %s, %d rounds, driver %s\n",
               "tcp on 127.0.0.1", b->rounds, b->cu->lib);
        printf("%-8s %-4s %12s %12s %8s\n", "SIZE", "OP", "HOST GB/s", "DEVICE GB/s", "RATIO");
        for (int k = 0; k < b->nsizes; k++) {
            for (int o = 0; o < D_NOPS; o++) {
                double h = d_median(&b->s[k][D_HOST][o]), d = d_median(&b->s[k][D_DEVICE][o]);
                printf("%-8s %-4s %12.2f %12.2f %8.2f\n",
                       moonlet_bytesize_format(b->sizes[k], sz, sizeof sz), d_op[o], h, d,
                       h > 0 ? d / h : 0);
            }
        }
        printf("driver device-to-host copy into pinned memory: %.2f GB/s\n", d2h);
        printf("pinned staging: %zu bytes held, bound %zu (staged calls %llu)\n", st.pinned_bytes,
               st.pinned_bound, (unsigned long long)st.staged_calls);
        return;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "transfer_device");
    cJSON_AddStringToObject(root, "driver", b->cu->lib);
    cJSON_AddNumberToObject(root, "rounds", b->rounds);
    cJSON_AddNumberToObject(root, "round_bytes", (double)b->round_bytes);
    cJSON *sizes = cJSON_AddArrayToObject(root, "sizes");
    for (int k = 0; k < b->nsizes; k++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "size", (double)b->sizes[k]);
        cJSON_AddNumberToObject(e, "keys", (double)d_keys(b, k));
        for (int o = 0; o < D_NOPS; o++)
            bench_json_ratio(e, d_op[o], "device", d_median(&b->s[k][D_DEVICE][o]), "host",
                             d_median(&b->s[k][D_HOST][o]));
        cJSON_AddItemToArray(sizes, e);
    }
    cJSON_AddNumberToObject(root, "driver_d2h_gbps", d2h);
    cJSON_AddNumberToObject(root, "pinned_bytes", (double)st.pinned_bytes);
    cJSON_AddNumberToObject(root, "pinned_bound", (double)st.pinned_bound);
    cJSON_AddNumberToObject(root, "staged_calls", (double)st.staged_calls);
    cJSON_AddNumberToObject(root, "target_ratio", 0.8);
    bench_print_json(root);
}

static void d_free(d_bench *b)
{
    for (int p = 0; p < D_NPATHS; p++) {
        for (int w = 0; w < 2; w++) {
            void *at = w ? b->dst[p] : b->src[p];
            if (!at)
                continue;
            if (b->c)
                moonlet_client_unregister_buffer(b->c, at);
            if (p == D_HOST)
                free(at);
            else
                b->cu->cuMemFree((CUdeviceptr)(uintptr_t)at);
        }
    }
    for (size_t i = 0; b->keys && i < b->max_keys; i++)
        free(b->keys[i]);
    free(b->keys);
    free(b->pb);
    free(b->gb);
    free(b->lens);
    free(b->got);
    free(b->res);
    free(b->check);
    for (int k = 0; k < D_MAX_SIZES; k++)
        for (int p = 0; p < D_NPATHS; p++)
            for (int o = 0; o < D_NOPS; o++)
                bench_samples_free(&b->s[k][p][o]);
    bench_samples_free(&b->d2h);
}

int bench_device_main(int argc, char **argv)
{
    d_bench b = {0};
    int prc = d_parse(argc, argv, &b);
    if (prc < 0)
        d_usage();
    if (prc)
        return prc < 0 ? 2 : 0;
    signal(SIGPIPE, SIG_IGN);
    int rc = 1;
    const char *step = "load the CUDA driver (libcuda.so.1, or MOONLET_CUDA_DRIVER)";
    bench_master m = {0}, s = {0};
    b.cu = moonlet_cuda_get();
    CUdevice dev;
    if (!b.cu || !b.cu->cuMemAlloc || !b.cu->cuCtxSetCurrent ||
        b.cu->cuDeviceGet(&dev, b.device) != CUDA_SUCCESS ||
        b.cu->cuDevicePrimaryCtxRetain(&b.ctx, dev) != CUDA_SUCCESS ||
        b.cu->cuCtxSetCurrent(b.ctx) != CUDA_SUCCESS)
        goto out;
    step = "start the master and the store node";
    uint64_t seg = 0;
    for (int k = 0; k < b.nsizes; k++) {
        uint64_t n = d_keys(&b, k) * b.sizes[k];
        seg = n > seg ? n : seg;
    }
    char seg_s[32];
    snprintf(seg_s, sizeof seg_s, "%llu", (unsigned long long)(16 * seg)); /* a round, and rounds quarantined by leases */
    const char *const margs[] = {"--default_kv_lease_ttl", b.lease_ms, NULL};
    const char *const sargs[] = {"--segment-size", seg_s, "--protocol", "tcp", "--listen",
                                 "127.0.0.1:0", "--log-level", "warn", NULL};
    if (bench_master_start(&m, margs))
        goto out;
    const char *store_args[16] = {"--master", m.addr};
    memcpy(store_args + 2, sargs, sizeof sargs);
    if (bench_child_start(&s, "moonlet-store", store_args, "listening on "))
        goto out;
    step = "connect the client";
    moonlet_client_config cfg = bench_client_config(m.addr);
    cfg.gpu_staging_size = b.staging;
    if (moonlet_client_create(&cfg, &b.c))
        goto out;
    step = "allocate and register the buffers";
    if (d_alloc(&b))
        goto out;
    step = "measure";
    for (int round = -1; round < b.rounds; round++) { /* round -1 warms up */
        for (int k = 0; k < b.nsizes; k++) {
            for (int j = 0; j < D_NPATHS; j++) {
                int p = (round + 1 + j + k) % D_NPATHS;
                double g[D_NOPS];
                if (d_measure(&b, k, p, round, g))
                    goto out;
                for (int o = 0; round >= 0 && o < D_NOPS; o++)
                    bench_samples_add(&b.s[k][p][o], g[o]);
            }
        }
    }
    step = "measure the driver's copy";
    if (d_driver_d2h(&b, d_keys(&b, b.nsizes - 1) * (size_t)b.sizes[b.nsizes - 1]))
        goto out;
    d_report(&b);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "moonlet-bench transfer --device-buffers: cannot %s\n", step);
    d_free(&b);
    moonlet_client_destroy(b.c);
    bench_master_stop(&s);
    bench_master_stop(&m);
    return rc;
}
