/*
 * client_gpu.c - device (GPU) memory in a moonlet_client's calls
 * (client_gpu.h): it owns the client's list of registered device buffers,
 * one stream and two events per device used, and the pinned staging region.
 *
 * Recognising device memory.  register_buffer asks the CUDA driver (loaded
 * at run time, common/cuda_driver.c) for the range's pointer attributes:
 * memory type, device ordinal, and the allocation it lies in.  Host memory
 * (and managed memory, which the host can touch) goes on to the backend as
 * before.  Device memory is registered here: in place when the backend can
 * hand it to the NIC (GPUDirect RDMA: dma-buf, else the peer-memory
 * module; the direct backend on RDMA, register_device), otherwise for the
 * staged path, with one WARN line per client saying why GPUDirect was not
 * used.  A client that never registered device memory has no state here
 * and its calls pay one atomic load.
 *
 * The staged path.  The store's segments are host memory, and TCP (or a NIC
 * without GPUDirect) can only move host memory, so device bytes go through
 * a pinned host region of the client's: memory of cuMemHostAlloc registered
 * with the direct backend, or on a DummyClient memory of alloc_shared (the
 * RealClient reads it in place) pinned with cuMemHostRegister.  Its size is
 * the bound (config gpu_staging_size, default 64 MiB); one staged call uses
 * it at a time.  A call's keys are cut into chunks of at most half the
 * region, and the halves alternate:
 *   put: the device-to-host copies of chunk k+1 (asynchronous, on each
 *        device's stream) run while chunk k goes out through the backend's
 *        zero-copy batch (batch_put_from);
 *   get: chunk k comes in through batch_get_into, which verifies each
 *        object's checksum on the host copy, and only then are its bytes
 *        copied to the device, asynchronously, while chunk k+1 comes in.
 * A key larger than half the region goes alone, through host memory of its
 * own size (not pinned: the bound holds), with synchronous copies.  Host
 * memory never touches device memory: every device byte moves by a driver
 * copy, issued in the context of the device that holds it.
 *
 * Locks: mu guards the buffer list, the devices' setup and the warning
 * flag, and is never held across a driver copy or a backend call;
 * stage_mu/stage_cv hand the staging region to one call at a time (the
 * owner uses it without a lock).  mu and stage_mu are never held together.
 */
#include "client_gpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "client_backend.h"
#include "cuda_driver.h"
#include "log.h"

#define MOD "client-gpu"
#define GPU_MAX_DEVICES 64
#define GPU_ALIGN 64u           /* each key's slot in a half starts on a cache line */
#define GPU_PAGE ((size_t)4096) /* the region's size is a multiple of it */
#define GPU_UNSET 1             /* a result not set yet (never a moonlet code) */

typedef struct gpu_buf {
    uintptr_t base;
    size_t len;
    int device;
    bool in_place; /* registered with the NIC (GPUDirect RDMA): no staging */
    struct gpu_buf *next;
} gpu_buf;

typedef struct gpu_dev {
    bool ready;
    CUdevice dev;
    CUcontext ctx; /* the device's primary context, retained */
    CUstream stream;
    CUevent ev[2]; /* the last copies of each half of the region */
} gpu_dev;

struct moonlet_client_gpu {
    const moonlet_cuda *cu;
    size_t bound;
    pthread_mutex_t mu;
    gpu_buf *bufs;
    uint32_t nbufs, nin_place;
    gpu_dev devs[GPU_MAX_DEVICES];
    bool warned; /* the GPUDirect WARN was logged */
    pthread_mutex_t stage_mu;
    pthread_cond_t stage_cv;
    bool stage_busy;
    unsigned char *stage; /* NULL until the first staged call */
    size_t stage_len;
    bool stage_pinned; /* false: the driver refused to pin it; copies are synchronous */
    atomic_uint_fast64_t staged_calls, staged_bytes;
};

/* ---- the client's state ----------------------------------------------------------------- */

static moonlet_client_gpu *gpu_of(moonlet_client *c)
{
    return atomic_load_explicit(&c->gpu, memory_order_acquire);
}

static moonlet_client_gpu *gpu_create(moonlet_client *c, const moonlet_cuda *cu)
{
    moonlet_client_gpu *g = gpu_of(c);
    if (g)
        return g;
    g = calloc(1, sizeof(*g));
    if (!g)
        return NULL;
    g->cu = cu;
    uint64_t bound = c->gpu_staging ? c->gpu_staging : MOONLET_GPU_STAGING_DEFAULT;
    if (bound < MOONLET_GPU_STAGING_MIN)
        bound = MOONLET_GPU_STAGING_MIN;
    if (bound > SIZE_MAX / 2)
        bound = SIZE_MAX / 2;
    g->bound = (size_t)bound / GPU_PAGE * GPU_PAGE;
    pthread_mutex_init(&g->mu, NULL);
    pthread_mutex_init(&g->stage_mu, NULL);
    pthread_cond_init(&g->stage_cv, NULL);
    moonlet_client_gpu *none = NULL;
    if (!atomic_compare_exchange_strong(&c->gpu, &none, g)) {
        pthread_mutex_destroy(&g->mu);
        pthread_mutex_destroy(&g->stage_mu);
        pthread_cond_destroy(&g->stage_cv);
        free(g);
        return none; /* another thread made it first */
    }
    return g;
}

/* The device's stream and events, made on first use (mu held).  NULL when
 * the driver refuses (logged). */
static gpu_dev *gpu_dev_ready(moonlet_client_gpu *g, int ordinal)
{
    if (ordinal < 0 || ordinal >= GPU_MAX_DEVICES)
        return NULL;
    gpu_dev *d = &g->devs[ordinal];
    if (d->ready)
        return d;
    const moonlet_cuda *cu = g->cu;
    CUresult r = cu->cuDeviceGet(&d->dev, ordinal);
    if (r == CUDA_SUCCESS)
        r = cu->cuDevicePrimaryCtxRetain(&d->ctx, d->dev);
    if (r != CUDA_SUCCESS) {
        ML_ERR(MOD, "device %d: no context (%s)", ordinal, moonlet_cuda_strerror(cu, r));
        return NULL;
    }
    int made = 0;
    r = cu->cuCtxPushCurrent(d->ctx);
    if (r == CUDA_SUCCESS) {
        if ((r = cu->cuStreamCreate(&d->stream, CU_STREAM_NON_BLOCKING)) == CUDA_SUCCESS)
            made = 1;
        for (int h = 0; h < 2 && r == CUDA_SUCCESS; h++)
            if ((r = cu->cuEventCreate(&d->ev[h], CU_EVENT_DISABLE_TIMING)) == CUDA_SUCCESS)
                made++;
        CUcontext popped;
        cu->cuCtxPopCurrent(&popped);
    }
    if (r != CUDA_SUCCESS) {
        ML_ERR(MOD, "device %d: no stream (%s)", ordinal, moonlet_cuda_strerror(cu, r));
        if (made > 2)
            cu->cuEventDestroy(d->ev[1]);
        if (made > 1)
            cu->cuEventDestroy(d->ev[0]);
        if (made > 0)
            cu->cuStreamDestroy(d->stream);
        cu->cuDevicePrimaryCtxRelease(d->dev);
        memset(d, 0, sizeof(*d));
        return NULL;
    }
    d->ready = true;
    return d;
}

/* ---- registration ------------------------------------------------------------------------ */

/* Registers the device buffer with the NIC when the backend can (GPUDirect
 * RDMA); false when it cannot, with the reason logged once per client. */
static bool gpu_in_place(moonlet_client *c, moonlet_client_gpu *g, void *base, size_t len,
                         const moonlet_cuda_range *r)
{
    if (!c->ops->register_device)
        return false;
    const char *why = NULL;
    int rc = c->ops->register_device(c->be, base, len, r->base, r->size, &why);
    if (rc == MOONLET_OK) {
        ML_INFO(MOD, "device %d buffer %p (%zu bytes): GPUDirect RDMA (%s), no staging", r->device,
                base, len, why ? why : "registered");
        return true;
    }
    pthread_mutex_lock(&g->mu);
    bool first = !g->warned;
    g->warned = true;
    pthread_mutex_unlock(&g->mu);
    if (first && why)
        ML_WARN(MOD, "GPUDirect RDMA is not available (%s): device memory is staged through %zu "
                     "bytes of pinned host memory", why, g->bound);
    return false;
}

int moonlet_client_gpu_register(moonlet_client *c, void *base, size_t len)
{
    moonlet_cuda_range r;
    int kind = moonlet_cuda_classify(base, len, &r);
    if (kind <= 0)
        return kind < 0 ? kind : MOONLET_CLIENT_GPU_HOST;
    moonlet_client_gpu *g = gpu_create(c, moonlet_cuda_get());
    if (!g)
        return MOONLET_ERR_INTERNAL_ERROR;
    gpu_buf *b = calloc(1, sizeof(*b));
    if (!b)
        return MOONLET_ERR_INTERNAL_ERROR;
    *b = (gpu_buf){.base = (uintptr_t)base, .len = len, .device = r.device};
    int rc = MOONLET_OK;
    pthread_mutex_lock(&g->mu);
    for (gpu_buf *o = g->bufs; o && !rc; o = o->next)
        if (o->base == b->base)
            rc = MOONLET_ERR_INVALID_PARAMS;
    if (!rc && !gpu_dev_ready(g, r.device))
        rc = MOONLET_ERR_INTERNAL_ERROR;
    pthread_mutex_unlock(&g->mu);
    if (rc) {
        free(b);
        return rc;
    }
    b->in_place = gpu_in_place(c, g, base, len, &r);
    pthread_mutex_lock(&g->mu);
    for (gpu_buf *o = g->bufs; o && !rc; o = o->next)
        if (o->base == b->base)
            rc = MOONLET_ERR_INVALID_PARAMS; /* another thread registered it meanwhile */
    if (!rc) {
        b->next = g->bufs;
        g->bufs = b;
        g->nbufs++;
        g->nin_place += b->in_place;
    }
    pthread_mutex_unlock(&g->mu);
    if (rc) {
        if (b->in_place)
            c->ops->unregister_buffer(c->be, base);
        free(b);
    }
    return rc;
}

int moonlet_client_gpu_unregister(moonlet_client *c, void *base)
{
    moonlet_client_gpu *g = gpu_of(c);
    if (!g)
        return MOONLET_CLIENT_GPU_HOST;
    gpu_buf *b = NULL;
    pthread_mutex_lock(&g->mu);
    for (gpu_buf **pp = &g->bufs; *pp; pp = &(*pp)->next) {
        if ((*pp)->base == (uintptr_t)base) {
            b = *pp;
            *pp = b->next;
            g->nbufs--;
            g->nin_place -= b->in_place;
            break;
        }
    }
    pthread_mutex_unlock(&g->mu);
    if (!b)
        return MOONLET_CLIENT_GPU_HOST;
    int rc = b->in_place ? c->ops->unregister_buffer(c->be, base) : MOONLET_OK;
    free(b);
    return rc;
}

/* Where [p, p + len) lives: -1 host memory (or device memory the NIC reaches
 * in place); the ordinal of device memory to stage; INVALID_PARAMS for a
 * range that starts in device memory and runs past it. */
static int gpu_locate(moonlet_client_gpu *g, const void *p, size_t len)
{
    if (!len)
        return -1;
    uintptr_t a = (uintptr_t)p;
    int where = -2;
    pthread_mutex_lock(&g->mu);
    for (gpu_buf *b = g->bufs; b && where == -2; b = b->next) {
        if (a < b->base || a - b->base >= b->len)
            continue;
        if (len > b->len - (a - b->base))
            where = MOONLET_ERR_INVALID_PARAMS;
        else
            where = b->in_place ? -1 : b->device;
    }
    pthread_mutex_unlock(&g->mu);
    if (where != -2)
        return where;
    /* not registered: still device memory when the driver says so */
    moonlet_cuda_range r;
    int kind = moonlet_cuda_classify(p, len, &r);
    return kind < 0 ? kind : kind ? r.device : -1;
}

bool moonlet_client_gpu_ranges(moonlet_client *c, const struct iovec *iov, size_t niov)
{
    moonlet_client_gpu *g = gpu_of(c);
    for (size_t i = 0; g && iov && i < niov; i++)
        if (gpu_locate(g, iov[i].iov_base, iov[i].iov_len) != -1)
            return true;
    return false;
}

bool moonlet_client_gpu_bufs(moonlet_client *c, const void *const *bufs, const size_t *lens,
                             size_t n)
{
    moonlet_client_gpu *g = gpu_of(c);
    for (size_t i = 0; g && bufs && lens && i < n; i++)
        if (gpu_locate(g, bufs[i], lens[i]) != -1)
            return true;
    return false;
}

/* ---- the staging region ------------------------------------------------------------------- */

static void gpu_stage_free(moonlet_client *c, moonlet_client_gpu *g)
{
    if (!g->stage)
        return;
    const moonlet_cuda *cu = g->cu;
    if (c->ops->shared_staging) {
        if (g->stage_pinned)
            cu->cuMemHostUnregister(g->stage);
        c->ops->free_shared(c->be, g->stage);
    } else {
        c->ops->unregister_buffer(c->be, g->stage);
        cu->cuMemFreeHost(g->stage);
    }
    g->stage = NULL;
    g->stage_len = 0;
}

/* Pinned host memory the backend moves in place (the caller owns the region). */
static int gpu_stage_alloc(moonlet_client *c, moonlet_client_gpu *g)
{
    if (g->stage)
        return MOONLET_OK;
    const moonlet_cuda *cu = g->cu;
    void *p = NULL;
    int rc;
    CUresult r;
    if (c->ops->shared_staging) {
        /* the RealClient's shared memory, pinned where it lies */
        if ((rc = c->ops->alloc_shared(c->be, g->bound, &p)) != MOONLET_OK)
            return rc;
        r = cu->cuMemHostRegister(p, g->bound, CU_MEMHOSTREGISTER_PORTABLE);
        g->stage_pinned = r == CUDA_SUCCESS;
        if (!g->stage_pinned)
            ML_WARN(MOD, "cannot pin the shared staging region (%s): device copies are "
                         "synchronous", moonlet_cuda_strerror(cu, r));
    } else {
        r = cu->cuMemHostAlloc(&p, g->bound, CU_MEMHOSTALLOC_PORTABLE);
        if (r != CUDA_SUCCESS) {
            ML_ERR(MOD, "cannot allocate %zu bytes of pinned memory (%s)", g->bound,
                   moonlet_cuda_strerror(cu, r));
            return MOONLET_ERR_INTERNAL_ERROR;
        }
        if ((rc = c->ops->register_buffer(c->be, p, g->bound)) != MOONLET_OK) {
            cu->cuMemFreeHost(p);
            return rc;
        }
        g->stage_pinned = true;
    }
    pthread_mutex_lock(&g->stage_mu); /* for moonlet_client_gpu_get_stats */
    g->stage = p;
    g->stage_len = g->bound;
    pthread_mutex_unlock(&g->stage_mu);
    return MOONLET_OK;
}

/* Takes the region for this call (waiting for another call to finish). */
static int gpu_stage_take(moonlet_client *c, moonlet_client_gpu *g)
{
    pthread_mutex_lock(&g->stage_mu);
    while (g->stage_busy)
        pthread_cond_wait(&g->stage_cv, &g->stage_mu);
    g->stage_busy = true;
    pthread_mutex_unlock(&g->stage_mu);
    int rc = gpu_stage_alloc(c, g);
    if (rc) {
        pthread_mutex_lock(&g->stage_mu);
        g->stage_busy = false;
        pthread_cond_signal(&g->stage_cv);
        pthread_mutex_unlock(&g->stage_mu);
    }
    return rc;
}

static void gpu_stage_give(moonlet_client_gpu *g)
{
    pthread_mutex_lock(&g->stage_mu);
    g->stage_busy = false;
    pthread_cond_signal(&g->stage_cv);
    pthread_mutex_unlock(&g->stage_mu);
}

/* ---- one staged call ---------------------------------------------------------------------- */

typedef struct gpu_call {
    moonlet_client *c;
    moonlet_client_gpu *g;
    const char *const *keys;
    size_t n;
    const struct iovec *iov;
    const size_t *iovcnt;
    size_t *first; /* key i's ranges: iov[first[i] .. first[i] + iovcnt[i]) */
    size_t *lens;  /* key i's bytes (put) or room (get) */
    int *dev;      /* per range: -1 host, else the device to copy with */
    int32_t *res;
    size_t half;           /* bytes of each half of the region */
    size_t chunk;          /* bytes per chunk: at most half */
    int cur;               /* the device whose context is pushed; -1 none */
    bool used[2][GPU_MAX_DEVICES]; /* devices with copies pending per half */
    /* one chunk's backend batch */
    const char **ck;
    void **cb;
    size_t *cl, *csz;
    int32_t *cr;
    size_t *cidx;
} gpu_call;

static size_t gpu_slot(size_t len)
{
    return len % GPU_ALIGN ? len + (GPU_ALIGN - len % GPU_ALIGN) : len;
}

/* Plans the call: each key's ranges and total, each range's device.  The
 * arrays were checked by the caller except for sums and device bounds. */
static int gpu_plan(gpu_call *k)
{
    size_t at = 0;
    for (size_t i = 0; i < k->n; i++) {
        if (!k->keys[i] || (k->iovcnt[i] && !k->iov) || k->iovcnt[i] > SIZE_MAX - at)
            return MOONLET_ERR_INVALID_PARAMS;
        k->first[i] = at;
        size_t len = 0;
        for (size_t p = at; p < at + k->iovcnt[i]; p++) {
            const struct iovec *v = &k->iov[p];
            if ((!v->iov_base && v->iov_len) || v->iov_len > SIZE_MAX - GPU_ALIGN - len)
                return MOONLET_ERR_INVALID_PARAMS;
            len += v->iov_len;
        }
        at += k->iovcnt[i];
        k->lens[i] = len;
    }
    if (!(k->dev = calloc(at ? at : 1, sizeof(*k->dev))))
        return MOONLET_ERR_INTERNAL_ERROR;
    for (size_t p = 0; p < at; p++) {
        k->dev[p] = gpu_locate(k->g, k->iov[p].iov_base, k->iov[p].iov_len);
        if (k->dev[p] < -1)
            return k->dev[p];
    }
    return MOONLET_OK;
}

/* Makes device d's context current for the copies that follow (one push
 * for a run of copies on the same device). */
static gpu_dev *gpu_use(gpu_call *k, int d)
{
    const moonlet_cuda *cu = k->g->cu;
    gpu_dev *gd = &k->g->devs[d];
    if (k->cur == d)
        return gd;
    CUcontext popped;
    if (k->cur >= 0)
        cu->cuCtxPopCurrent(&popped);
    k->cur = -1;
    pthread_mutex_lock(&k->g->mu);
    bool ok = gpu_dev_ready(k->g, d) != NULL;
    pthread_mutex_unlock(&k->g->mu);
    if (!ok || cu->cuCtxPushCurrent(gd->ctx) != CUDA_SUCCESS)
        return NULL;
    k->cur = d;
    return gd;
}

static void gpu_unuse(gpu_call *k)
{
    CUcontext popped;
    if (k->cur >= 0)
        k->g->cu->cuCtxPopCurrent(&popped);
    k->cur = -1;
}

/* The first len bytes of range p's copy between host memory `host` and the
 * range: to_host (put) or to the range (get); h, the half of the region
 * the copy belongs to (queued on the device's stream), or -1 for a
 * synchronous copy.  0 or INTERNAL_ERROR (logged). */
static int gpu_copy(gpu_call *k, size_t p, unsigned char *host, size_t len, bool to_host, int h)
{
    void *at = k->iov[p].iov_base;
    if (k->dev[p] < 0) {
        if (to_host)
            memcpy(host, at, len);
        else
            memcpy(at, host, len);
        return MOONLET_OK;
    }
    const moonlet_cuda *cu = k->g->cu;
    gpu_dev *gd = gpu_use(k, k->dev[p]);
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)at;
    CUresult r;
    if (!gd) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else if (h >= 0 && k->g->stage_pinned) {
        r = to_host ? cu->cuMemcpyDtoHAsync(host, d, len, gd->stream)
                    : cu->cuMemcpyHtoDAsync(d, host, len, gd->stream);
        k->used[h][k->dev[p]] |= r == CUDA_SUCCESS;
    } else {
        r = to_host ? cu->cuMemcpyDtoH(host, d, len) : cu->cuMemcpyHtoD(d, host, len);
    }
    if (r == CUDA_SUCCESS)
        return MOONLET_OK;
    ML_ERR(MOD, "copy of %zu bytes %s device %d at %p: %s", len, to_host ? "from" : "to",
           k->dev[p], at, moonlet_cuda_strerror(cu, r));
    return MOONLET_ERR_INTERNAL_ERROR;
}

/* Key i's ranges to (to_host) or from `host`, contiguous there; at most
 * `room` bytes (a get of an object shorter than its ranges fills a prefix). */
static int gpu_copy_key(gpu_call *k, size_t i, unsigned char *host, size_t room, bool to_host,
                        int h)
{
    int rc = MOONLET_OK;
    for (size_t p = k->first[i]; p < k->first[i] + k->iovcnt[i] && room && !rc; p++) {
        size_t len = k->iov[p].iov_len < room ? k->iov[p].iov_len : room;
        rc = gpu_copy(k, p, host, len, to_host, h);
        host += len;
        room -= len;
    }
    return rc;
}

/* Records the end of half h's copies on every device that has some. */
static int gpu_mark(gpu_call *k, int h)
{
    int rc = MOONLET_OK;
    for (int d = 0; d < GPU_MAX_DEVICES; d++) {
        if (!k->used[h][d])
            continue;
        gpu_dev *gd = gpu_use(k, d);
        if (!gd || k->g->cu->cuEventRecord(gd->ev[h], gd->stream) != CUDA_SUCCESS)
            rc = MOONLET_ERR_INTERNAL_ERROR;
    }
    gpu_unuse(k);
    return rc;
}

/* Waits for half h's copies; INTERNAL_ERROR when one failed. */
static int gpu_wait(gpu_call *k, int h)
{
    int rc = MOONLET_OK;
    for (int d = 0; d < GPU_MAX_DEVICES; d++) {
        if (!k->used[h][d])
            continue;
        k->used[h][d] = false;
        CUresult r = k->g->cu->cuEventSynchronize(k->g->devs[d].ev[h]);
        if (r != CUDA_SUCCESS) {
            ML_ERR(MOD, "device %d: copies failed (%s)", d, moonlet_cuda_strerror(k->g->cu, r));
            rc = MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    return rc;
}

/* The keys of the call, in order, cut into chunks of at most `half` bytes;
 * a key larger than half is left out (big) and done alone.  Returns the
 * end of the chunk starting at key `from` (skipping big keys: their
 * results are already set or handled later). */
static size_t gpu_chunk_end(const gpu_call *k, size_t from)
{
    size_t sum = 0, i = from;
    for (; i < k->n; i++) {
        size_t s = gpu_slot(k->lens[i]);
        if (s > k->half)
            continue; /* big: done alone */
        if (sum + s > k->chunk && sum)
            break;
        sum += s;
    }
    return i;
}

/* Chunks of a quarter of the call (at least GPU_CHUNK_MIN, at most half
 * the region): the first chunk's copy (put) and the last one's (get) are
 * the only ones nothing overlaps, so chunks are kept small, but each chunk
 * is a batch of its own (a master round trip, and the transport's lanes
 * filled and drained), which costs about a millisecond: measured with
 * moonlet-bench transfer --device-buffers, quarters beat eighths and halves. */
#define GPU_CHUNK_MIN ((size_t)8 << 20)
static size_t gpu_chunk_size(const gpu_call *k)
{
    size_t total = 0;
    for (size_t i = 0; i < k->n; i++) {
        size_t s = gpu_slot(k->lens[i]);
        if (s <= k->half)
            total += s;
    }
    size_t c = total / 4;
    c = c < GPU_CHUNK_MIN ? GPU_CHUNK_MIN : c;
    return c > k->half ? k->half : c;
}

static bool gpu_big(const gpu_call *k, size_t i)
{
    return gpu_slot(k->lens[i]) > k->half;
}

/* Results the backend left unset (its call failed as a whole) get its code. */
static void gpu_fill(int32_t *r, size_t m, int rc)
{
    for (size_t j = 0; j < m; j++)
        if (r[j] == GPU_UNSET)
            r[j] = rc ? rc : MOONLET_ERR_INTERNAL_ERROR;
}

/* put: chunk [lo, hi) into half h: its bytes copied (device copies queued). */
static void gpu_put_fill(gpu_call *k, size_t lo, size_t hi, int h)
{
    unsigned char *base = (unsigned char *)k->g->stage + (size_t)h * k->half;
    size_t off = 0;
    for (size_t i = lo; i < hi; i++) {
        if (gpu_big(k, i))
            continue;
        if (gpu_copy_key(k, i, base + off, k->lens[i], true, h))
            k->res[i] = MOONLET_ERR_INTERNAL_ERROR;
        off += gpu_slot(k->lens[i]);
    }
    if (gpu_mark(k, h))
        for (size_t i = lo; i < hi; i++)
            if (!gpu_big(k, i) && k->res[i] == GPU_UNSET)
                k->res[i] = MOONLET_ERR_INTERNAL_ERROR;
}

/* put: the backend's batch of chunk [lo, hi) from half h. */
static void gpu_put_send(gpu_call *k, size_t lo, size_t hi, int h,
                         const moonlet_put_options *opt)
{
    unsigned char *base = (unsigned char *)k->g->stage + (size_t)h * k->half;
    size_t m = 0, off = 0;
    for (size_t i = lo; i < hi; i++) {
        if (gpu_big(k, i))
            continue;
        if (k->res[i] == GPU_UNSET) {
            k->ck[m] = k->keys[i];
            k->cb[m] = base + off;
            k->cl[m] = k->lens[i];
            k->cr[m] = GPU_UNSET;
            k->cidx[m++] = i;
        }
        off += gpu_slot(k->lens[i]);
    }
    if (!m)
        return;
    int rc = k->c->ops->batch_put_from(k->c->be, k->ck, (const void *const *)k->cb, k->cl, m,
                                       opt, k->cr);
    gpu_fill(k->cr, m, rc);
    for (size_t j = 0; j < m; j++) {
        k->res[k->cidx[j]] = k->cr[j];
        if (!k->cr[j])
            atomic_fetch_add(&k->g->staged_bytes, k->cl[j]);
    }
}

/* A big key: through host memory of its own, synchronous copies. */
static void gpu_put_big(gpu_call *k, size_t i, const moonlet_put_options *opt)
{
    unsigned char *tmp = malloc(k->lens[i]);
    if (!tmp) {
        k->res[i] = MOONLET_ERR_INTERNAL_ERROR;
        return;
    }
    int rc = gpu_copy_key(k, i, tmp, k->lens[i], true, -1);
    gpu_unuse(k);
    if (!rc)
        rc = k->c->ops->put(k->c->be, k->keys[i], tmp, k->lens[i], opt);
    if (!rc)
        atomic_fetch_add(&k->g->staged_bytes, k->lens[i]);
    k->res[i] = rc;
    free(tmp);
}

static void gpu_get_big(gpu_call *k, size_t i, const char *tenant, size_t *sizes)
{
    unsigned char *tmp = malloc(k->lens[i]);
    size_t got = 0;
    int rc = tmp ? k->c->ops->get(k->c->be, k->keys[i], tmp, k->lens[i], &got, tenant)
                 : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc && got <= k->lens[i]) {
        rc = gpu_copy_key(k, i, tmp, got, false, -1);
        gpu_unuse(k);
    }
    if (!rc)
        atomic_fetch_add(&k->g->staged_bytes, got);
    k->res[i] = rc;
    sizes[i] = rc == MOONLET_OK || rc == MOONLET_ERR_BUFFER_OVERFLOW ? got : 0;
    free(tmp);
}

/* get: the backend's batch of chunk [lo, hi) into half h, then each read
 * object's bytes to its ranges (device copies queued). */
static void gpu_get_chunk(gpu_call *k, size_t lo, size_t hi, int h, const char *tenant,
                          size_t *sizes)
{
    unsigned char *base = (unsigned char *)k->g->stage + (size_t)h * k->half;
    size_t m = 0, off = 0;
    for (size_t i = lo; i < hi; i++) {
        if (gpu_big(k, i))
            continue;
        k->ck[m] = k->keys[i];
        k->cb[m] = base + off;
        k->cl[m] = k->lens[i];
        k->csz[m] = 0;
        k->cr[m] = GPU_UNSET;
        k->cidx[m++] = i;
        off += gpu_slot(k->lens[i]);
    }
    if (!m)
        return;
    int rc = k->c->ops->batch_get_into(k->c->be, k->ck, k->cb, k->cl, m, k->csz, k->cr, tenant);
    gpu_fill(k->cr, m, rc);
    for (size_t j = 0; j < m; j++) {
        size_t i = k->cidx[j];
        k->res[i] = k->cr[j];
        sizes[i] = k->cr[j] == MOONLET_OK || k->cr[j] == MOONLET_ERR_BUFFER_OVERFLOW ? k->csz[j]
                                                                                    : 0;
        if (k->cr[j] || k->csz[j] > k->cl[j])
            continue;
        /* verified on the host by the backend: now to the ranges */
        if (gpu_copy_key(k, i, k->cb[j], k->csz[j], false, h))
            k->res[i] = MOONLET_ERR_INTERNAL_ERROR;
        else
            atomic_fetch_add(&k->g->staged_bytes, k->csz[j]);
    }
    if (gpu_mark(k, h))
        for (size_t j = 0; j < m; j++)
            if (k->res[k->cidx[j]] == MOONLET_OK)
                k->res[k->cidx[j]] = MOONLET_ERR_INTERNAL_ERROR;
}

static void gpu_call_free(gpu_call *k)
{
    free(k->first);
    free(k->lens);
    free(k->dev);
    free(k->ck);
    free(k->cb);
    free(k->cl);
    free(k->csz);
    free(k->cr);
    free(k->cidx);
}

/* Sets up the call: plan, arrays, the region.  On failure every result is
 * the code. */
static int gpu_call_begin(gpu_call *k, moonlet_client *c, const char *const *keys, size_t n,
                          const struct iovec *iov, const size_t *iovcnt, int32_t *results)
{
    *k = (gpu_call){.c = c, .g = gpu_of(c), .keys = keys, .n = n, .iov = iov, .iovcnt = iovcnt,
                    .res = results, .cur = -1};
    size_t m = n ? n : 1;
    int rc = MOONLET_OK;
    if (!k->g || (n && (!keys || !iovcnt || !results)))
        rc = MOONLET_ERR_INVALID_PARAMS;
    else if (!(k->first = calloc(m, sizeof(size_t))) || !(k->lens = calloc(m, sizeof(size_t))) ||
             !(k->ck = calloc(m, sizeof(*k->ck))) || !(k->cb = calloc(m, sizeof(*k->cb))) ||
             !(k->cl = calloc(m, sizeof(size_t))) || !(k->csz = calloc(m, sizeof(size_t))) ||
             !(k->cr = calloc(m, sizeof(int32_t))) || !(k->cidx = calloc(m, sizeof(size_t))))
        rc = MOONLET_ERR_INTERNAL_ERROR;
    if (!rc)
        rc = gpu_plan(k);
    if (!rc && !(rc = gpu_stage_take(c, k->g))) {
        k->half = k->g->stage_len / 2 / GPU_ALIGN * GPU_ALIGN;
        k->chunk = gpu_chunk_size(k);
    }
    for (size_t i = 0; results && i < n; i++)
        results[i] = rc ? rc : GPU_UNSET;
    if (rc)
        gpu_call_free(k);
    else
        atomic_fetch_add(&k->g->staged_calls, 1);
    return rc;
}

/* The call's result: 0 when every key succeeded, else the first key's error. */
static int gpu_call_end(gpu_call *k)
{
    gpu_unuse(k);
    gpu_stage_give(k->g);
    int rc = MOONLET_OK;
    for (size_t i = 0; i < k->n && !rc; i++)
        rc = k->res[i];
    gpu_call_free(k);
    return rc;
}

int moonlet_client_gpu_put(moonlet_client *c, const char *const *keys, size_t n,
                           const struct iovec *iov, const size_t *iovcnt,
                           const moonlet_put_options *opt, int32_t *results)
{
    gpu_call k;
    int rc = gpu_call_begin(&k, c, keys, n, iov, iovcnt, results);
    if (rc)
        return rc;
    /* chunk k+1's copies run while chunk k is on the wire */
    size_t lo = 0, hi = gpu_chunk_end(&k, 0);
    int h = 0;
    gpu_put_fill(&k, lo, hi, h);
    while (lo < n) {
        size_t nhi = hi < n ? gpu_chunk_end(&k, hi) : n;
        if (hi < n)
            gpu_put_fill(&k, hi, nhi, h ^ 1);
        if (gpu_wait(&k, h))
            for (size_t i = lo; i < hi; i++)
                if (!gpu_big(&k, i) && k.res[i] == GPU_UNSET)
                    k.res[i] = MOONLET_ERR_INTERNAL_ERROR;
        gpu_put_send(&k, lo, hi, h, opt);
        lo = hi;
        hi = nhi;
        h ^= 1;
    }
    for (size_t i = 0; i < n; i++)
        if (gpu_big(&k, i))
            gpu_put_big(&k, i, opt);
    return gpu_call_end(&k);
}

int moonlet_client_gpu_get(moonlet_client *c, const char *const *keys, size_t n,
                           const struct iovec *iov, const size_t *iovcnt, const char *tenant,
                           size_t *sizes, int32_t *results)
{
    if (n && !sizes)
        return MOONLET_ERR_INVALID_PARAMS;
    gpu_call k;
    int rc = gpu_call_begin(&k, c, keys, n, iov, iovcnt, results);
    for (size_t i = 0; i < n; i++)
        sizes[i] = 0;
    if (rc)
        return rc;
    /* chunk k's copies to the device run while chunk k+1 is on the wire */
    size_t lo = 0;
    size_t chunk_of[2][2] = {{0, 0}, {0, 0}}; /* each half's last chunk, for its failure */
    for (int h = 0; lo < n; h ^= 1) {
        if (gpu_wait(&k, h))
            for (size_t i = chunk_of[h][0]; i < chunk_of[h][1]; i++)
                if (!gpu_big(&k, i) && k.res[i] == MOONLET_OK)
                    k.res[i] = MOONLET_ERR_INTERNAL_ERROR;
        size_t hi = gpu_chunk_end(&k, lo);
        gpu_get_chunk(&k, lo, hi, h, tenant, sizes);
        chunk_of[h][0] = lo;
        chunk_of[h][1] = hi;
        lo = hi;
    }
    for (int h = 0; h < 2; h++)
        if (gpu_wait(&k, h))
            for (size_t i = chunk_of[h][0]; i < chunk_of[h][1]; i++)
                if (!gpu_big(&k, i) && k.res[i] == MOONLET_OK)
                    k.res[i] = MOONLET_ERR_INTERNAL_ERROR;
    for (size_t i = 0; i < n; i++)
        if (gpu_big(&k, i))
            gpu_get_big(&k, i, tenant, sizes);
    return gpu_call_end(&k);
}

int moonlet_client_gpu_upsert(moonlet_client *c, const char *key, const void *buf, size_t len,
                              const moonlet_put_options *opt)
{
    moonlet_client_gpu *g = gpu_of(c);
    struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
    size_t one = 1;
    int32_t res;
    gpu_call k = {.c = c, .g = g, .keys = &key, .n = 1, .iov = &v, .iovcnt = &one, .res = &res,
                  .cur = -1};
    size_t first = 0, lens = 0;
    k.first = &first;
    k.lens = &lens;
    int rc = g ? gpu_plan(&k) : MOONLET_ERR_INVALID_PARAMS;
    unsigned char *tmp = rc ? NULL : malloc(len ? len : 1);
    if (!rc && !tmp)
        rc = MOONLET_ERR_INTERNAL_ERROR;
    if (!rc)
        rc = gpu_copy_key(&k, 0, tmp, len, true, -1);
    gpu_unuse(&k);
    if (!rc)
        rc = c->ops->upsert(c->be, key, tmp, len, opt);
    free(tmp);
    free(k.dev);
    return rc;
}

/* ---- accounting and teardown ---------------------------------------------------------------- */

void moonlet_client_gpu_get_stats(moonlet_client *c, moonlet_client_gpu_stats *out)
{
    *out = (moonlet_client_gpu_stats){0};
    moonlet_client_gpu *g = gpu_of(c);
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    out->buffers = g->nbufs;
    out->in_place = g->nin_place;
    pthread_mutex_unlock(&g->mu);
    pthread_mutex_lock(&g->stage_mu);
    out->pinned_bytes = g->stage && g->stage_pinned ? g->stage_len : 0;
    pthread_mutex_unlock(&g->stage_mu);
    out->pinned_bound = g->bound;
    out->staged_calls = atomic_load(&g->staged_calls);
    out->staged_bytes = atomic_load(&g->staged_bytes);
}

void moonlet_client_gpu_destroy(moonlet_client *c)
{
    moonlet_client_gpu *g = gpu_of(c);
    if (!g)
        return;
    atomic_store(&c->gpu, NULL);
    gpu_stage_free(c, g);
    while (g->bufs) {
        gpu_buf *b = g->bufs;
        g->bufs = b->next;
        if (b->in_place)
            c->ops->unregister_buffer(c->be, (void *)b->base);
        free(b);
    }
    const moonlet_cuda *cu = g->cu;
    for (int d = 0; d < GPU_MAX_DEVICES; d++) {
        gpu_dev *gd = &g->devs[d];
        if (!gd->ready)
            continue;
        CUcontext popped;
        if (cu->cuCtxPushCurrent(gd->ctx) == CUDA_SUCCESS) {
            cu->cuEventDestroy(gd->ev[0]);
            cu->cuEventDestroy(gd->ev[1]);
            cu->cuStreamDestroy(gd->stream);
            cu->cuCtxPopCurrent(&popped);
        }
        cu->cuDevicePrimaryCtxRelease(gd->dev);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_mutex_destroy(&g->stage_mu);
    pthread_cond_destroy(&g->stage_cv);
    free(g);
}
