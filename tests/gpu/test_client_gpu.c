/*
 * test_client_gpu.c - device (GPU) memory through moonlet_client, under the
 * fake CUDA driver (tests/gpu/fakecuda.c, named by MOONLET_CUDA_DRIVER in
 * the test's environment).  The fake's device memory is a PROT_NONE mapping:
 * any host access to it kills this test with SIGSEGV, so every pass proves
 * that no path touched device memory from the host.
 *
 * Under a real driver (scripts/gpu-check.sh runs this test on a GPU
 * machine) the fake's counters are absent and their checks are skipped, and
 * with one device both "devices" are device 0.
 *
 * `test_client_gpu` runs against a direct client; `test_client_gpu dummy`
 * against a DummyClient served by a RealClient in this process (device
 * memory staged in the engine's process, the RealClient never sees it).
 * A master and a store node (64 MiB) are processes on loopback.
 *
 * `test_client_gpu rdma` (the rdma suite's guest step gpu_rdma) runs the
 * same group over RDMA: the store node serves on $MOONLET_GPU_RDMA_ADDR
 * (rxe0), the clients bind $MOONLET_GPU_RDMA_SRC (rxe1); the staging region
 * is then registered with the NIC, and a client without checksums tries
 * GPUDirect first, which rxe refuses for the fake's device memory (no
 * dma-buf, and pinning a PROT_NONE range fails): staged, with the reason.
 */
#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_gpu.h"
#include "client_internal.h"
#include "../common/capture.h"
#include "../common/cluster.h"
#include "cuda_driver.h"
#include "moonlet/client.h"
#include "moonlet/real_client.h"

#define STAGING ((uint64_t)2 << 20) /* the smallest bound: halves of 1 MiB */

static test_proc g_master, g_store;
static moonlet_client *g_cli;
static bool g_dummy;
static const char *g_rdma_addr, *g_rdma_src; /* `rdma` mode */
static moonlet_real_client *g_real;
static char g_sock[108];
static const moonlet_cuda *g_cu;
static CUcontext g_ctx[2];
static int g_ndev; /* 1 or 2: device d of the tests is d % g_ndev */

/* The fake driver's counters (tests/gpu/fakecuda.h). */
static uint64_t (*fake_pageable)(void);
static uint64_t (*fake_wrong_ctx)(void);
static size_t (*fake_pinned_peak)(void);
static void (*fake_reset)(void);
static uint64_t (*fake_async)(void);

static moonlet_client *new_client(uint64_t staging, bool local_segment)
{
    moonlet_client *c = NULL;
    if (g_dummy) {
        moonlet_dummy_config cfg;
        moonlet_dummy_config_init(&cfg, sizeof cfg);
        cfg.gpu_staging_size = staging;
        assert_int_equal(moonlet_client_create_dummy(g_sock, &cfg, &c), MOONLET_OK);
        return c;
    }
    moonlet_client_config cfg = cl_client_config(g_master.addr);
    cfg.gpu_staging_size = staging;
    cfg.transfer_timeout_ms = 3000;
    if (g_rdma_addr) {
        cfg.protocol = MOONLET_PROTOCOL_RDMA;
        cfg.source_addr = g_rdma_src;
    }
    if (local_segment)
        cfg.local_segment_size = 16u << 20;
    return cl_client_of(&cfg);
}

static int setup(void **state)
{
    (void)state;
    if (cl_start_master(&g_master, NULL))
        return -1;
    if (g_rdma_addr) {
        char listen[96];
        snprintf(listen, sizeof listen, "%s:0", g_rdma_addr);
        char *argv[] = {"tools/moonlet-store", "--master", g_master.addr, "--segment-size",
                        "64MiB", "--protocol", "rdma", "--listen", listen, "--ping-interval-ms",
                        "100", "--log-level", "warn", NULL};
        if (proc_start(&g_store, argv, 20000))
            return -1;
    } else if (cl_start_store(&g_store, g_master.addr, "64MiB", NULL)) {
        return -1;
    }
    g_cu = moonlet_cuda_get();
    if (!g_cu || !g_cu->cuMemAlloc || !g_cu->cuCtxSetCurrent) {
        fprintf(stderr, "no (fake) CUDA driver: MOONLET_CUDA_DRIVER=%s\n",
                getenv("MOONLET_CUDA_DRIVER") ? getenv("MOONLET_CUDA_DRIVER") : "");
        return -1;
    }
    /* the fake driver's counters; absent under a real driver */
    const char *lib = getenv("MOONLET_CUDA_DRIVER");
    void *h = lib && *lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (h) {
        *(void **)&fake_pageable = dlsym(h, "fakecuda_pageable_async_copies");
        *(void **)&fake_wrong_ctx = dlsym(h, "fakecuda_wrong_context");
        *(void **)&fake_pinned_peak = dlsym(h, "fakecuda_pinned_peak");
        *(void **)&fake_reset = dlsym(h, "fakecuda_reset_counters");
        *(void **)&fake_async = dlsym(h, "fakecuda_async_copies");
    }
    if (!fake_pageable || !fake_wrong_ctx || !fake_pinned_peak || !fake_reset || !fake_async) {
        if (lib && strstr(lib, "fakecuda"))
            return -1; /* the fake must be checked in full */
        fake_pageable = fake_wrong_ctx = NULL;
        fake_pinned_peak = NULL;
        fake_reset = NULL;
        fake_async = NULL;
    }
    g_ndev = g_cu->devices >= 2 ? 2 : 1;
    for (int d = 0; d < g_ndev; d++) {
        CUdevice dev;
        if (g_cu->cuDeviceGet(&dev, d) || g_cu->cuDevicePrimaryCtxRetain(&g_ctx[d], dev))
            return -1;
    }
    if (g_dummy) {
        moonlet_client_config cfg;
        moonlet_client_config_init(&cfg, sizeof cfg);
        cfg.master_addr = g_master.addr;
        cfg.protocol = MOONLET_PROTOCOL_TCP;
        cfg.transfer_timeout_ms = 3000;
        cfg.local_segment_size = 32u << 20;
        snprintf(g_sock, sizeof(g_sock), "/tmp/moonlet-test-gpu-%ld.sock", (long)getpid());
        int rc = moonlet_real_client_create(&cfg, g_sock, NULL, &g_real);
        if (rc) {
            fprintf(stderr, "real_client_create: %s\n", moonlet_strerror(rc));
            return -1;
        }
    }
    g_cli = new_client(STAGING, false);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    moonlet_client_destroy(g_cli);
    moonlet_real_client_destroy(g_real);
    proc_stop(&g_store);
    proc_stop(&g_master);
    return 0;
}

/* len bytes of device memory on device d. */
static CUdeviceptr dev_alloc(int d, size_t len)
{
    CUdeviceptr p = 0;
    d %= g_ndev;
    assert_int_equal(g_cu->cuCtxSetCurrent(g_ctx[d]), CUDA_SUCCESS);
    assert_int_equal(g_cu->cuMemAlloc(&p, len), CUDA_SUCCESS);
    return p;
}

static void dev_free(int d, CUdeviceptr p)
{
    d %= g_ndev;
    assert_int_equal(g_cu->cuCtxSetCurrent(g_ctx[d]), CUDA_SUCCESS);
    assert_int_equal(g_cu->cuMemFree(p), CUDA_SUCCESS);
}

/* Byte i of the pattern `seed`. */
static unsigned char pat(uint32_t seed, size_t i)
{
    uint32_t x = seed * 2654435761u + (uint32_t)i * 40503u;
    return (unsigned char)(x >> 13);
}

static void dev_fill(CUdeviceptr p, size_t len, uint32_t seed)
{
    unsigned char *h = malloc(len);
    for (size_t i = 0; i < len; i++)
        h[i] = pat(seed, i);
    assert_int_equal(g_cu->cuMemcpyHtoD(p, h, len), CUDA_SUCCESS);
    free(h);
}

/* Whether device bytes [p, p + len) are the pattern `seed` from offset `from`. */
static bool dev_is(CUdeviceptr p, size_t len, uint32_t seed, size_t from)
{
    unsigned char *h = malloc(len);
    assert_int_equal(g_cu->cuMemcpyDtoH(h, p, len), CUDA_SUCCESS);
    bool same = true;
    for (size_t i = 0; i < len && same; i++)
        same = h[i] == pat(seed, from + i);
    free(h);
    return same;
}

/* A source and a destination of n bytes on device 0, filled with the
 * patterns `a` and `b`, registered with c (a client of its own). */
typedef struct dev_pair {
    moonlet_client *c;
    size_t n;
    CUdeviceptr src, dst;
} dev_pair;

static dev_pair dev_pair_new(moonlet_client *c, size_t n, uint32_t a, uint32_t b)
{
    dev_pair d = {.c = c, .n = n, .src = dev_alloc(0, n), .dst = dev_alloc(0, n)};
    dev_fill(d.src, n, a);
    dev_fill(d.dst, n, b);
    assert_int_equal(moonlet_client_register_buffer(c, (void *)(uintptr_t)d.src, n), MOONLET_OK);
    assert_int_equal(moonlet_client_register_buffer(c, (void *)(uintptr_t)d.dst, n), MOONLET_OK);
    return d;
}

/* The arrays of a zero-copy batch (batch_put_from / batch_get_into) of up
 * to ZB_MAX keys. */
enum { ZB_MAX = 96 };
typedef struct zbatch {
    char names[ZB_MAX][64];   /* the keys' text */
    const char *keys[ZB_MAX];
    const void *bufs[ZB_MAX]; /* the sources (put) */
    void *out[ZB_MAX];        /* the destinations (get) */
    size_t lens[ZB_MAX];      /* each key's bytes */
    size_t got[ZB_MAX];       /* the bytes a get read */
    int32_t res[ZB_MAX];      /* each key's outcome */
} zbatch;

static void key_of(char *buf, size_t cap, const char *what, size_t i)
{
    snprintf(buf, cap, "gpu-%s-%s-%zu", g_dummy ? "dummy" : "direct", what, i);
}

/* n keys of `block` bytes each, back to back in the pair's source (put)
 * and destination (get). */
static void back_to_back(const char *what, size_t n, size_t block, const dev_pair *d, zbatch *b)
{
    assert_true(n <= ZB_MAX);
    for (size_t i = 0; i < n; i++) {
        key_of(b->names[i], sizeof(b->names[i]), what, i);
        b->keys[i] = b->names[i];
        b->bufs[i] = (const void *)(uintptr_t)(d->src + i * block);
        b->out[i] = (void *)(uintptr_t)(d->dst + i * block);
        b->lens[i] = block;
    }
}

/* Unregisters both, destroys the client, frees both. */
static void dev_pair_free(dev_pair *d)
{
    moonlet_client_unregister_buffer(d->c, (void *)(uintptr_t)d->src);
    moonlet_client_unregister_buffer(d->c, (void *)(uintptr_t)d->dst);
    moonlet_client_destroy(d->c);
    dev_free(0, d->src);
    dev_free(0, d->dst);
}

/* batch_get_into of b's first n keys, each of which reads `block` bytes. */
static void get_into_all(moonlet_client *c, zbatch *b, size_t n, size_t block)
{
    assert_int_equal(moonlet_client_batch_get_into(c, b->keys, n, b->out, b->lens, NULL, b->got,
                                                   b->res), MOONLET_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(b->res[i], MOONLET_OK);
        assert_int_equal(b->got[i], block);
    }
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_register_device_memory(void **state)
{
    (void)state;
    CUdeviceptr d = dev_alloc(0, 1u << 20);
    void *p = (void *)(uintptr_t)d;
    assert_int_equal(moonlet_client_register_buffer(g_cli, p, 1u << 20), MOONLET_OK);
    assert_int_equal(moonlet_client_register_buffer(g_cli, p, 1u << 20),
                     MOONLET_ERR_INVALID_PARAMS); /* registered already */
    /* an interior range that runs past the allocation */
    assert_int_equal(moonlet_client_register_buffer(g_cli, (char *)p + 4096, 1u << 20),
                     MOONLET_ERR_INVALID_PARAMS);
    moonlet_client_gpu_stats st;
    moonlet_client_gpu_get_stats(g_cli, &st);
    assert_int_equal(st.buffers, 1);
    assert_int_equal(st.in_place, 0); /* TCP, or RDMA with checksums on: staged */
    assert_int_equal(moonlet_client_unregister_buffer(g_cli, p), MOONLET_OK);
    assert_int_equal(moonlet_client_unregister_buffer(g_cli, p), MOONLET_ERR_INVALID_PARAMS);
    /* host memory still registers as host memory */
    void *host = malloc(4096);
    assert_int_equal(moonlet_client_register_buffer(g_cli, host, 4096), MOONLET_OK);
    moonlet_client_gpu_get_stats(g_cli, &st);
    assert_int_equal(st.buffers, 0);
    assert_int_equal(moonlet_client_unregister_buffer(g_cli, host), MOONLET_OK);
    free(host);
    dev_free(0, d);
}

/* The engines' pattern: a KV cache per device, blocks put from it with the
 * zero-copy batch and read back into another device buffer. */
static void test_batch_round_trip_two_devices(void **state)
{
    (void)state;
    enum { N = 96, BLOCK = 48 << 10 }; /* 4.5 MiB: several 1 MiB chunks per call */
    CUdeviceptr src[2], dst[2];
    for (int d = 0; d < 2; d++) {
        src[d] = dev_alloc(d, (size_t)N / 2 * BLOCK);
        dst[d] = dev_alloc(d, (size_t)N / 2 * BLOCK);
        dev_fill(src[d], (size_t)N / 2 * BLOCK, 7 + d);
        assert_int_equal(moonlet_client_register_buffer(g_cli, (void *)(uintptr_t)src[d],
                                                        (size_t)N / 2 * BLOCK), MOONLET_OK);
        assert_int_equal(moonlet_client_register_buffer(g_cli, (void *)(uintptr_t)dst[d],
                                                        (size_t)N / 2 * BLOCK), MOONLET_OK);
    }
    if (fake_reset)
        fake_reset();
    zbatch b;
    _Static_assert((int)N <= (int)ZB_MAX, "the batch fits a zbatch");
    for (size_t i = 0; i < N; i++) {
        key_of(b.names[i], sizeof(b.names[i]), "kv", i);
        b.keys[i] = b.names[i];
        int d = (int)(i % 2); /* alternate devices inside one batch */
        size_t at = i / 2 * BLOCK;
        b.bufs[i] = (const void *)(uintptr_t)(src[d] + at);
        b.out[i] = (void *)(uintptr_t)(dst[d] + at);
        b.lens[i] = BLOCK;
    }
    assert_int_equal(moonlet_client_batch_put_from(g_cli, b.keys, N, b.bufs, b.lens, NULL, b.res),
                     MOONLET_OK);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(b.res[i], MOONLET_OK);
    get_into_all(g_cli, &b, N, BLOCK);
    for (int d = 0; d < 2; d++)
        assert_true(dev_is(dst[d], (size_t)N / 2 * BLOCK, 7 + d, 0));
    /* async copies only from pinned memory, each on its own device's stream */
    if (fake_pageable) {
        assert_int_equal(fake_pageable(), 0);
        assert_int_equal(fake_wrong_ctx(), 0);
        assert_true(fake_pinned_peak() <= STAGING);
    }
    moonlet_client_gpu_stats st;
    moonlet_client_gpu_get_stats(g_cli, &st);
    assert_true(st.staged_calls >= 2);
    assert_true(st.staged_bytes >= 2ull * N * BLOCK);
    assert_true(st.pinned_bytes <= st.pinned_bound);
    for (int d = 0; d < 2; d++) {
        moonlet_client_unregister_buffer(g_cli, (void *)(uintptr_t)src[d]);
        moonlet_client_unregister_buffer(g_cli, (void *)(uintptr_t)dst[d]);
        dev_free(d, src[d]);
        dev_free(d, dst[d]);
    }
}

/* Single calls and the copying calls: put / get / put_from / get_into /
 * upsert with a device pointer, and a key larger than half the staging. */
static void test_single_calls_and_big_keys(void **state)
{
    (void)state;
    const size_t big = 3u << 20, small = 100000;
    CUdeviceptr a = dev_alloc(1, big), b = dev_alloc(1, big);
    dev_fill(a, big, 21);
    void *pa = (void *)(uintptr_t)a, *pb = (void *)(uintptr_t)b;
    assert_int_equal(moonlet_client_register_buffer(g_cli, pa, big), MOONLET_OK);
    assert_int_equal(moonlet_client_register_buffer(g_cli, pb, big), MOONLET_OK);
    char k1[64], k2[64], k3[64];
    key_of(k1, sizeof k1, "one", 0);
    key_of(k2, sizeof k2, "big", 0);
    key_of(k3, sizeof k3, "up", 0);
    assert_int_equal(moonlet_client_put_from(g_cli, k1, pa, small, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_put(g_cli, k2, pa, big, NULL), MOONLET_OK); /* big: alone */
    size_t len = 0;
    assert_int_equal(moonlet_client_get_into(g_cli, k1, pb, big, NULL, &len), MOONLET_OK);
    assert_int_equal(len, small);
    assert_true(dev_is(b, small, 21, 0));
    assert_int_equal(moonlet_client_get(g_cli, k2, pb, big, NULL, &len), MOONLET_OK);
    assert_int_equal(len, big);
    assert_true(dev_is(b, big, 21, 0));
    /* upsert replaces from device memory (offset 1000: another pattern window) */
    assert_int_equal(moonlet_client_upsert(g_cli, k3, pa + 1000, small, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_upsert(g_cli, k3, (char *)pa + 2000, small, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_get_into(g_cli, k3, pb, small, NULL, &len), MOONLET_OK);
    assert_true(dev_is(b, small, 21, 2000));
    /* a room too small: BUFFER_OVERFLOW, and nothing written past it */
    assert_int_equal(moonlet_client_get_into(g_cli, k2, pb, 4096, NULL, &len),
                     MOONLET_ERR_BUFFER_OVERFLOW);
    /* a range past the allocation is refused before anything moves */
    assert_int_equal(moonlet_client_put_from(g_cli, "gpu-past", (char *)pa + big - 10, 20, NULL),
                     MOONLET_ERR_INVALID_PARAMS);
    if (fake_pageable)
        assert_int_equal(fake_pageable(), 0);
    moonlet_client_unregister_buffer(g_cli, pa);
    moonlet_client_unregister_buffer(g_cli, pb);
    dev_free(1, a);
    dev_free(1, b);
}

/* vLLM's multi-buffer batches: each key is ranges in several layers' KV
 * caches (device memory, some on each device), gathered and scattered. */
static void test_ranged_batches(void **state)
{
    (void)state;
    enum { N = 40, LAYERS = 4, PART = 8192 };
    CUdeviceptr layer[LAYERS], back[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        layer[l] = dev_alloc(l % 2, (size_t)N * PART);
        back[l] = dev_alloc(l % 2, (size_t)N * PART);
        dev_fill(layer[l], (size_t)N * PART, 100 + l);
        assert_int_equal(moonlet_client_register_buffer(g_cli, (void *)(uintptr_t)layer[l],
                                                        (size_t)N * PART), MOONLET_OK);
    }
    char names[N][64];
    const char *keys[N];
    struct iovec iov[N * LAYERS], out[N * LAYERS];
    size_t cnt[N], sizes[N];
    int32_t res[N];
    for (size_t i = 0; i < N; i++) {
        key_of(names[i], sizeof(names[i]), "multi", i);
        keys[i] = names[i];
        cnt[i] = LAYERS;
        for (int l = 0; l < LAYERS; l++) {
            iov[i * LAYERS + l] = (struct iovec){(void *)(uintptr_t)(layer[l] + i * PART), PART};
            /* the destination need not be registered: the driver knows it */
            out[i * LAYERS + l] = (struct iovec){(void *)(uintptr_t)(back[l] + i * PART), PART};
        }
    }
    assert_int_equal(moonlet_client_batch_put(g_cli, keys, N, iov, cnt, NULL, res), MOONLET_OK);
    assert_int_equal(moonlet_client_batch_get(g_cli, keys, N, out, cnt, NULL, sizes, res),
                     MOONLET_OK);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(res[i], MOONLET_OK);
        assert_int_equal(sizes[i], (size_t)LAYERS * PART);
    }
    for (int l = 0; l < LAYERS; l++)
        assert_true(dev_is(back[l], (size_t)N * PART, 100 + l, 0));
    if (fake_wrong_ctx)
        assert_int_equal(fake_wrong_ctx(), 0);
    for (int l = 0; l < LAYERS; l++) {
        moonlet_client_unregister_buffer(g_cli, (void *)(uintptr_t)layer[l]);
        dev_free(l % 2, layer[l]);
        dev_free(l % 2, back[l]);
    }
}

/* A get into device memory verifies the checksum on the host copy: a
 * corrupted replica is INVALID_READ and the device buffer keeps its bytes.
 * (Direct client: its local segment holds the only replica.) */
static void test_get_verified_before_device(void **state)
{
    (void)state;
    moonlet_client *c = new_client(STAGING, true);
    const size_t n = 64 << 10;
    dev_pair dp = dev_pair_new(c, n, 33, 44);
    CUdeviceptr src = dp.src, dst = dp.dst;
    void *ps = (void *)(uintptr_t)src, *pd = (void *)(uintptr_t)dst;
    /* the replica on our own segment (preferred segment: its endpoint) */
    char own[128];
    assert_int_equal(moonlet_client_local_endpoint(c, own, sizeof own), MOONLET_OK);
    const char *pref[] = {own};
    moonlet_put_options opt = {.preferred_segments = pref, .preferred_segments_count = 1};
    const char *key = "gpu-direct-corrupt";
    assert_int_equal(moonlet_client_put_from(c, key, ps, n, &opt), MOONLET_OK);
    unsigned char *seg = moonlet_client_local_segment_base(c);
    assert_non_null(seg);
    unsigned char head[64];
    for (size_t i = 0; i < sizeof head; i++)
        head[i] = pat(33, i);
    unsigned char *hit = memmem(seg, 16u << 20, head, sizeof head);
    assert_non_null(hit);
    hit[100] ^= 0xff;
    size_t len = 0;
    assert_int_equal(moonlet_client_get_into(c, key, pd, n, NULL, &len), MOONLET_ERR_INVALID_READ);
    assert_true(dev_is(dst, n, 44, 0)); /* untouched */
    dev_pair_free(&dp);
}

/* Keys wider than a slot of a lane's half but within the half (9 MiB keys,
 * a 32 MiB staging: halves of 16 MiB, slots of 8; two chunks per lane):
 * each lane keeps to one slot, and every key comes back exact. */
static void test_keys_wider_than_a_slot(void **state)
{
    (void)state;
    moonlet_client *c = new_client(32u << 20, false);
    enum { N = 4 };
    const size_t block = 9u << 20, n = N * block;
    dev_pair dp = dev_pair_new(c, n, 71, 72);
    CUdeviceptr dst = dp.dst;
    zbatch b;
    back_to_back("wide", N, block, &dp, &b);
    assert_int_equal(moonlet_client_batch_put_from(c, b.keys, N, b.bufs, b.lens, NULL, b.res),
                     MOONLET_OK);
    get_into_all(c, &b, N, block);
    assert_true(dev_is(dst, n, 71, 0));
    moonlet_client_gpu_stats st;
    moonlet_client_gpu_get_stats(c, &st);
    assert_true(st.pinned_bytes <= st.pinned_bound);
    for (size_t i = 0; i < N; i++) /* room in the store for the next tests (leased) */
        assert_int_equal(moonlet_client_remove_force(c, b.keys[i], NULL), MOONLET_OK);
    dev_pair_free(&dp);
}

/* A get that fills both slots of each lane's half (a 32 MiB staging: 8 MiB
 * chunks, then the two small last ones) from keys laid back to back on one
 * device: the copies to the device are gathered (far fewer driver copies
 * than keys), and a key whose replica is corrupt in the middle of a
 * gathered run fails alone - its range untouched, its neighbours exact. */
static void test_get_two_slots_gathered(void **state)
{
    (void)state;
    moonlet_client *c = new_client(32u << 20, true);
    enum { N = 48, BLOCK = 256 << 10, BAD = 5 }; /* 12 MiB */
    const size_t n = (size_t)N * BLOCK;
    dev_pair dp = dev_pair_new(c, n, 61, 62);
    CUdeviceptr dst = dp.dst;
    char own[128];
    assert_int_equal(moonlet_client_local_endpoint(c, own, sizeof own), MOONLET_OK);
    const char *pref[] = {own};
    moonlet_put_options opt = {.preferred_segments = pref, .preferred_segments_count = 1};
    zbatch b;
    back_to_back("slots", N, BLOCK, &dp, &b);
    assert_int_equal(moonlet_client_batch_put_from(c, b.keys, N, b.bufs, b.lens, &opt, b.res),
                     MOONLET_OK);
    unsigned char *seg = moonlet_client_local_segment_base(c);
    assert_non_null(seg);
    /* the whole object as the needle: short windows of the pattern recur */
    unsigned char *whole = malloc(BLOCK);
    assert_non_null(whole);
    for (size_t i = 0; i < BLOCK; i++)
        whole[i] = pat(61, (size_t)BAD * BLOCK + i);
    unsigned char *hit = memmem(seg, 16u << 20, whole, BLOCK);
    free(whole);
    assert_non_null(hit);
    hit[100] ^= 0xff;
    if (fake_reset)
        fake_reset();
    assert_int_equal(moonlet_client_batch_get_into(c, b.keys, N, b.out, b.lens, NULL, b.got,
                                                   b.res), MOONLET_ERR_INVALID_READ);
    /* the pattern repeats every 2 MiB: the object hit is one of the keys
     * BAD + 8j (the same bytes), whichever the segment holds first */
    size_t failed = 0;
    for (size_t i = 0; i < N; i++) {
        if (b.res[i] != MOONLET_OK) {
            failed++;
            assert_int_equal(b.res[i], MOONLET_ERR_INVALID_READ);
            assert_int_equal(i % 8, BAD);
            assert_true(dev_is(dst + i * BLOCK, BLOCK, 62, i * BLOCK)); /* untouched */
            continue;
        }
        assert_int_equal(b.got[i], BLOCK);
        assert_true(dev_is(dst + i * BLOCK, BLOCK, 61, i * BLOCK));
    }
    assert_int_equal(failed, 1);
    if (fake_async) {
        assert_true(fake_async() <= 8); /* a run per chunk, one more around the bad key */
        assert_int_equal(fake_pageable(), 0);
        assert_int_equal(fake_wrong_ctx(), 0);
    }
    dev_pair_free(&dp);
}

/* GPUDirect is refused with a reason, once per client: two device buffers
 * registered on a fresh (TCP) client log one WARN line naming why. */
typedef struct reg_two {
    moonlet_client *c;
    void *a, *b;
    size_t len; /* of each */
    int rc_a, rc_b;
} reg_two;

static void register_two(void *arg)
{
    reg_two *r = arg;
    r->rc_a = moonlet_client_register_buffer(r->c, r->a, r->len);
    r->rc_b = moonlet_client_register_buffer(r->c, r->b, r->len);
}

static void test_gpudirect_refused_once(void **state)
{
    (void)state;
    CUdeviceptr a = dev_alloc(0, 4096), b = dev_alloc(1, 4096);
    reg_two r = {.c = new_client(STAGING, false), .a = (void *)(uintptr_t)a,
                 .b = (void *)(uintptr_t)b, .len = 4096};
    char *log = capture_stderr(register_two, &r);
    assert_int_equal(r.rc_a, MOONLET_OK);
    assert_int_equal(r.rc_b, MOONLET_OK);
    const char *first = strstr(log, "GPUDirect RDMA is not available (");
    if (g_dummy) {
        assert_null(first); /* a DummyClient stages in this process: nothing to refuse */
    } else {
        assert_non_null(first);
        /* RDMA with checksums on: refused for the checksum, before any NIC call */
        assert_non_null(strstr(first, g_rdma_addr ? "checksums are on"
                                                  : "TCP, which moves host memory only"));
        assert_null(strstr(first + 1, "GPUDirect RDMA is not available"));
    }
    free(log);
    moonlet_client_destroy(r.c); /* releases the registrations */
    dev_free(0, a);
    dev_free(1, b);
}

/* RDMA without checksums: GPUDirect is tried and rxe refuses the fake's
 * device memory (no dma-buf; a PROT_NONE range cannot be pinned), so the
 * buffer is staged, with the NIC's refusal as the reason; a round trip
 * still moves the right bytes. */
static void test_gpudirect_refused_by_nic(void **state)
{
    (void)state;
    moonlet_client_config cfg = cl_client_config(g_master.addr);
    cfg.protocol = MOONLET_PROTOCOL_RDMA;
    cfg.source_addr = g_rdma_src;
    cfg.skip_checksum = true;
    cfg.gpu_staging_size = STAGING;
    const size_t n = 256 << 10;
    CUdeviceptr a = dev_alloc(0, n), b = dev_alloc(0, n);
    dev_fill(a, n, 55);
    reg_two r = {.c = cl_client_of(&cfg), .a = (void *)(uintptr_t)a, .b = (void *)(uintptr_t)b,
                 .len = n};
    char *log = capture_stderr(register_two, &r);
    assert_int_equal(r.rc_a, MOONLET_OK);
    assert_int_equal(r.rc_b, MOONLET_OK);
    const char *why = strstr(log, "GPUDirect RDMA is not available (");
    assert_non_null(why);
    assert_non_null(strstr(why, "NIC"));
    free(log);
    moonlet_client_gpu_stats st;
    moonlet_client_gpu_get_stats(r.c, &st);
    assert_int_equal(st.buffers, 2);
    assert_int_equal(st.in_place, 0);
    size_t len = 0;
    assert_int_equal(moonlet_client_put_from(r.c, "gpu-rdma-nic", r.a, n, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_get_into(r.c, "gpu-rdma-nic", r.b, n, NULL, &len), MOONLET_OK);
    assert_int_equal(len, n);
    assert_true(dev_is(b, n, 55, 0));
    moonlet_client_destroy(r.c);
    dev_free(0, a);
    dev_free(0, b);
}

int main(int argc, char **argv)
{
    g_dummy = argc > 1 && strcmp(argv[1], "dummy") == 0;
    if (argc > 1 && strcmp(argv[1], "rdma") == 0) {
        const struct CMUnitTest rdma[] = {
            cmocka_unit_test(test_register_device_memory),
            cmocka_unit_test(test_batch_round_trip_two_devices),
            cmocka_unit_test(test_single_calls_and_big_keys),
            cmocka_unit_test(test_ranged_batches),
            cmocka_unit_test(test_gpudirect_refused_once),
            cmocka_unit_test(test_gpudirect_refused_by_nic),
        };
        g_rdma_addr = getenv("MOONLET_GPU_RDMA_ADDR");
        g_rdma_src = getenv("MOONLET_GPU_RDMA_SRC");
        if (!g_rdma_addr || !g_rdma_src) {
            fprintf(stderr, "rdma: set MOONLET_GPU_RDMA_ADDR and MOONLET_GPU_RDMA_SRC\n");
            return 1;
        }
        return cmocka_run_group_tests_name("client_gpu_rdma", rdma, setup, teardown);
    }
    const struct CMUnitTest neutral[] = {
        cmocka_unit_test(test_register_device_memory),
        cmocka_unit_test(test_batch_round_trip_two_devices),
        cmocka_unit_test(test_single_calls_and_big_keys),
        cmocka_unit_test(test_ranged_batches),
        cmocka_unit_test(test_keys_wider_than_a_slot),
        cmocka_unit_test(test_gpudirect_refused_once),
    };
    const struct CMUnitTest direct[] = {
        cmocka_unit_test(test_get_verified_before_device),
        cmocka_unit_test(test_get_two_slots_gathered),
    };
    int failed = cmocka_run_group_tests_name(g_dummy ? "client_gpu_dummy" : "client_gpu",
                                             neutral, setup, teardown);
    if (!g_dummy)
        failed += cmocka_run_group_tests_name("client_gpu_direct", direct, setup, teardown);
    return failed;
}
