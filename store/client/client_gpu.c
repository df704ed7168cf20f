/*
 * client_gpu.c - device (GPU) memory in a moonlet_client's calls
 * (client_gpu.h): it owns the client's list of registered device buffers,
 * two streams and two events per device used, and the pinned staging region.
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
 * the bound (config gpu_staging_size, default 128 MiB); one staged call
 * uses it at a time.  A call's keys are cut into chunks (a quarter of the
 * call, at least 8 MiB, at most half the region) and each half has a lane:
 * the calling thread runs chunks 0, 2, ... through the first half, a second
 * thread chunks 1, 3, ... through the second, each with its own stream per
 * device, so that one lane's copies and master round trips overlap the
 * other's transfers:
 *   put: a chunk's device-to-host copies are waited for, then the chunk
 *        goes out through the backend's zero-copy batch (batch_put_from);
 *   get: a chunk comes in through batch_get_into, which verifies each
 *        object's checksum on the host copy, and only then are its bytes
 *        copied to the device.  A lane alternates between the two slots of
 *        its half (a get's chunks are cut to fit one), so a chunk's copies
 *        run while the lane's next chunk comes in; a slot is reused once
 *        its copies are done.  The last two chunks are an eighth of the
 *        others: their copies are the only ones nothing overlaps.
 * Ranges that follow each other both on a device and in the region (a
 * call's keys often lie back to back in both) go as one driver copy.
 * A key larger than half the region goes alone, through host memory of its
 * own size (not pinned: the bound holds), with synchronous copies.  Host
 * memory never touches device memory: every device byte moves by a driver
 * copy, issued in the context of the device that holds it.
 *
 * Locks: mu guards the buffer list, the devices' setup and the warning
 * flag, and is never held across a driver copy or a backend call;
 * stage_mu/stage_cv hand the staging region to one call at a time (the
 * owner's two lanes use it without a lock: each its own half, its own
 * streams and events, its own keys' results).  mu and stage_mu are never
 * held together.
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
    CUcontext ctx;     /* the device's primary context, retained */
    CUstream stream[2]; /* one per half of the region (each half's lane) */
    CUevent ev[2][2];   /* the last copies into each slot of each half */
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
    /* per half: a stream and two events (made[h] & 1: stream, & 2, & 4: events) */
    int made[2] = {0, 0};
    r = cu->cuCtxPushCurrent(d->ctx);
    bool pushed = r == CUDA_SUCCESS;
    for (int h = 0; h < 2 && r == CUDA_SUCCESS; h++) {
        if ((r = cu->cuStreamCreate(&d->stream[h], CU_STREAM_NON_BLOCKING)) == CUDA_SUCCESS)
            made[h] |= 1;
        for (int e = 0; e < 2 && r == CUDA_SUCCESS; e++)
            if ((r = cu->cuEventCreate(&d->ev[h][e], CU_EVENT_DISABLE_TIMING)) == CUDA_SUCCESS)
                made[h] |= 2 << e;
    }
    if (r != CUDA_SUCCESS)
        ML_ERR(MOD, "device %d: no stream (%s)", ordinal, moonlet_cuda_strerror(cu, r));
    for (int h = 0; h < 2 && r != CUDA_SUCCESS; h++) {
        for (int e = 0; e < 2; e++)
            if (made[h] & (2 << e))
                cu->cuEventDestroy(d->ev[h][e]);
        if (made[h] & 1)
            cu->cuStreamDestroy(d->stream[h]);
    }
    if (pushed) {
        CUcontext popped;
        cu->cuCtxPopCurrent(&popped);
    }
    if (r != CUDA_SUCCESS) {
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

/* Gives the region back to the next call. */
static void gpu_stage_give(moonlet_client_gpu *g)
{
    pthread_mutex_lock(&g->stage_mu);
    g->stage_busy = false;
    pthread_cond_signal(&g->stage_cv);
    pthread_mutex_unlock(&g->stage_mu);
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
    if (rc)
        gpu_stage_give(g);
    return rc;
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
    int32_t *res;  /* per key; each key belongs to one lane */
    size_t *sizes; /* get: per key */
    const moonlet_put_options *opt;
    const char *tenant;
    size_t half;   /* bytes of each half of the region */
    size_t chunk;  /* bytes per chunk: at most half */
    size_t *cuts;  /* chunk j is keys [cuts[j], cuts[j + 1]) */
    size_t nchunks;
    bool get;
    bool two_slots; /* get: each lane alternates between the slots of its half */
} gpu_call;

/* One half of the region and the thread that uses it: chunks h, h + 2, ...
 * A get lane whose chunks fit half its half alternates between the two
 * slots (halves of its half), so that a chunk's copies to the devices run
 * while the next chunk comes in; otherwise it uses slot 0 alone. */
typedef struct gpu_lane {
    gpu_call *k;
    int h;                         /* its half; -1: synchronous copies, no half */
    int slot;                      /* the slot the copies being queued belong to */
    int cur;                       /* the device whose context this thread pushed; -1 none */
    bool used[2][GPU_MAX_DEVICES]; /* per slot, devices with copies pending */
    /* The chunks' backend batches: a get chunk j's keys [cuts[j],
     * cuts[j + 1]) use entries from cuts[j] on (disjoint chunks, disjoint
     * entries: two may be pending); a put chunk, done before the next, from 0. */
    const char **ck;
    void **cb;
    size_t *cl, *csz;
    int32_t *cr;
    size_t *cidx;
    /* The copy being gathered: ranges that follow each other both on one
     * device and in the region go as one driver copy (gpu_copy). */
    struct {
        int dev;
        bool to_host;
        CUdeviceptr d;
        unsigned char *host;
        size_t len; /* 0: none */
    } run;
    bool copy_failed; /* a queued copy failed since the last gpu_mark */
    size_t pend_at[2], pend_m[2]; /* get: per slot, the chunk whose copies are pending */
    bool pend_failed[2];          /* and whether recording their end failed */
} gpu_lane;

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

/* Makes device d's context current on the lane's thread for the copies
 * that follow (one push for a run of copies on the same device). */
static gpu_dev *gpu_use(gpu_lane *l, int d)
{
    moonlet_client_gpu *g = l->k->g;
    gpu_dev *gd = &g->devs[d];
    if (l->cur == d)
        return gd;
    CUcontext popped;
    if (l->cur >= 0)
        g->cu->cuCtxPopCurrent(&popped);
    l->cur = -1;
    pthread_mutex_lock(&g->mu);
    bool ok = gpu_dev_ready(g, d) != NULL;
    pthread_mutex_unlock(&g->mu);
    if (!ok || g->cu->cuCtxPushCurrent(gd->ctx) != CUDA_SUCCESS)
        return NULL;
    l->cur = d;
    return gd;
}

static void gpu_unuse(gpu_lane *l)
{
    CUcontext popped;
    if (l->cur >= 0)
        l->k->g->cu->cuCtxPopCurrent(&popped);
    l->cur = -1;
}

/* Queues the gathered copy on its device's stream for the lane's half, in
 * the slot being filled; a failure is logged and fails the lane's next
 * gpu_mark (its keys are all the chunk's, which fails as a whole). */
static void gpu_flush(gpu_lane *l)
{
    if (!l->run.len)
        return;
    const moonlet_cuda *cu = l->k->g->cu;
    int dv = l->run.dev;
    size_t len = l->run.len;
    l->run.len = 0;
    gpu_dev *gd = gpu_use(l, dv);
    CUresult r = CUDA_ERROR_INVALID_CONTEXT;
    if (gd)
        r = l->run.to_host ? cu->cuMemcpyDtoHAsync(l->run.host, l->run.d, len, gd->stream[l->h])
                           : cu->cuMemcpyHtoDAsync(l->run.d, l->run.host, len, gd->stream[l->h]);
    if (r == CUDA_SUCCESS) {
        l->used[l->slot][dv] = true;
        return;
    }
    ML_ERR(MOD, "copy of %zu bytes %s device %d at %#llx: %s", len,
           l->run.to_host ? "from" : "to", dv, (unsigned long long)l->run.d,
           moonlet_cuda_strerror(cu, r));
    l->copy_failed = true;
}

/* The first len bytes of range p's copy between host memory `host` and the
 * range: to_host (put) or to the range (get).  On a lane with a half, the
 * copy joins the one being gathered when it continues it on the device and
 * in the region (a call's keys often lie back to back in both: one driver
 * call instead of one per key), else that one is queued and this one
 * starts the next; 0 (failures show at gpu_mark).  Without a half, it is
 * synchronous: 0 or INTERNAL_ERROR (logged). */
static int gpu_copy(gpu_lane *l, size_t p, unsigned char *host, size_t len, bool to_host)
{
    gpu_call *k = l->k;
    void *at = k->iov[p].iov_base;
    if (k->dev[p] < 0) {
        if (to_host)
            memcpy(host, at, len);
        else
            memcpy(at, host, len);
        return MOONLET_OK;
    }
    const moonlet_cuda *cu = k->g->cu;
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)at;
    if (l->h >= 0 && k->g->stage_pinned) {
        if (l->run.len && l->run.dev == k->dev[p] && l->run.to_host == to_host &&
            l->run.d + l->run.len == d && l->run.host + l->run.len == host) {
            l->run.len += len;
            return MOONLET_OK;
        }
        gpu_flush(l);
        l->run.dev = k->dev[p];
        l->run.to_host = to_host;
        l->run.d = d;
        l->run.host = host;
        l->run.len = len;
        return MOONLET_OK;
    }
    gpu_dev *gd = gpu_use(l, k->dev[p]);
    CUresult r = CUDA_ERROR_INVALID_CONTEXT;
    if (gd)
        r = to_host ? cu->cuMemcpyDtoH(host, d, len) : cu->cuMemcpyHtoD(d, host, len);
    if (r == CUDA_SUCCESS)
        return MOONLET_OK;
    ML_ERR(MOD, "copy of %zu bytes %s device %d at %p: %s", len, to_host ? "from" : "to",
           k->dev[p], at, moonlet_cuda_strerror(cu, r));
    return MOONLET_ERR_INTERNAL_ERROR;
}

/* Key i's ranges to (to_host) or from `host`, contiguous there; at most
 * `room` bytes (a get of an object shorter than its ranges fills a prefix). */
static int gpu_copy_key(gpu_lane *l, size_t i, unsigned char *host, size_t room, bool to_host)
{
    const gpu_call *k = l->k;
    int rc = MOONLET_OK;
    for (size_t p = k->first[i]; p < k->first[i] + k->iovcnt[i] && room && !rc; p++) {
        size_t len = k->iov[p].iov_len < room ? k->iov[p].iov_len : room;
        rc = gpu_copy(l, p, host, len, to_host);
        host += len;
        room -= len;
    }
    return rc;
}

/* Queues the gathered copy, then records the end of the copies queued for
 * slot s on every device it used; INTERNAL_ERROR when a copy could not be
 * queued since the last mark, or an end not recorded. */
static int gpu_mark(gpu_lane *l, int s)
{
    gpu_flush(l);
    int rc = l->copy_failed ? MOONLET_ERR_INTERNAL_ERROR : MOONLET_OK;
    l->copy_failed = false;
    for (int d = 0; d < GPU_MAX_DEVICES; d++) {
        if (!l->used[s][d])
            continue;
        gpu_dev *gd = gpu_use(l, d);
        if (!gd || l->k->g->cu->cuEventRecord(gd->ev[l->h][s], gd->stream[l->h]) != CUDA_SUCCESS)
            rc = MOONLET_ERR_INTERNAL_ERROR;
    }
    gpu_unuse(l);
    return rc;
}

/* Waits for slot s's copies; INTERNAL_ERROR when one failed. */
static int gpu_wait(gpu_lane *l, int s)
{
    moonlet_client_gpu *g = l->k->g;
    int rc = MOONLET_OK;
    for (int d = 0; d < GPU_MAX_DEVICES; d++) {
        if (!l->used[s][d])
            continue;
        l->used[s][d] = false;
        CUresult r = g->cu->cuEventSynchronize(g->devs[d].ev[l->h][s]);
        if (r != CUDA_SUCCESS) {
            ML_ERR(MOD, "device %d: copies failed (%s)", d, moonlet_cuda_strerror(g->cu, r));
            rc = MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    return rc;
}

static bool gpu_big(const gpu_call *k, size_t i)
{
    return gpu_slot(k->lens[i]) > k->half;
}

/* Chunks of a quarter of the call (at least GPU_CHUNK_MIN, at most half
 * the region): the first chunk's copy (put) and the last one's (get) are
 * the only ones nothing overlaps, so chunks are kept small, but each chunk
 * is a batch of its own (a master round trip, and the transport's lanes
 * filled and drained), which costs about a millisecond; the two lanes
 * hide most of that behind each other's transfers.  Measured with
 * moonlet-bench transfer --device-buffers. */
#define GPU_CHUNK_MIN ((size_t)8 << 20)
static size_t gpu_chunk_size(const gpu_call *k)
{
    size_t total = 0;
    for (size_t i = 0; i < k->n; i++)
        if (!gpu_big(k, i))
            total += gpu_slot(k->lens[i]);
    size_t c = total / 4;
    c = c < GPU_CHUNK_MIN ? GPU_CHUNK_MIN : c;
    return c > k->half ? k->half : c;
}

/* The bytes a chunk that starts with `left` bytes of the call to go may
 * take.  A get's last copies to the devices are the only ones no transfer
 * overlaps, so its last two chunks (one per lane) are an eighth of a chunk
 * each (in one series of runs of 21 rounds, the 1 MiB get measured 0.82-0.85
 * of host with a quarter, 0.85-0.89 with an eighth,
 * 0.76-0.85 with a sixteenth), and the chunk before them stops where they
 * begin. */
static size_t gpu_chunk_room(const gpu_call *k, size_t left)
{
    size_t tail = k->get ? 2 * (k->chunk / 8) : 0;
    if (left <= tail)
        return k->chunk / 8;
    return left - tail < k->chunk ? left - tail : k->chunk;
}

/* Cuts the keys, in order, into chunks of at most gpu_chunk_room bytes
 * (big keys, done alone later, take no room; a chunk has one key at
 * least).  INTERNAL_ERROR when out of memory. */
static int gpu_cut(gpu_call *k)
{
    if (!(k->cuts = calloc(k->n + 2, sizeof(*k->cuts))))
        return MOONLET_ERR_INTERNAL_ERROR;
    size_t left = 0;
    for (size_t i = 0; i < k->n; i++)
        left += gpu_big(k, i) ? 0 : gpu_slot(k->lens[i]);
    size_t sum = 0, room = 0;
    k->nchunks = 0;
    for (size_t i = 0; i < k->n; i++) {
        size_t s = gpu_big(k, i) ? 0 : gpu_slot(k->lens[i]);
        if (i == 0 || (sum + s > room && sum)) {
            k->cuts[k->nchunks++] = i;
            left -= sum;
            room = gpu_chunk_room(k, left);
            sum = 0;
        }
        sum += s;
    }
    k->cuts[k->nchunks] = k->n;
    return MOONLET_OK;
}

/* Results the backend left unset (its call failed as a whole) get its code. */
static void gpu_fill(int32_t *r, size_t m, int rc)
{
    for (size_t j = 0; j < m; j++)
        if (r[j] == GPU_UNSET)
            r[j] = rc ? rc : MOONLET_ERR_INTERNAL_ERROR;
}

/* put, chunk j on lane l: its bytes copied into the lane's half (device
 * copies queued and waited for), then the backend's zero-copy batch. */
static void gpu_put_chunk(gpu_lane *l, size_t j)
{
    gpu_call *k = l->k;
    size_t lo = k->cuts[j], hi = k->cuts[j + 1];
    unsigned char *base = k->g->stage + (size_t)l->h * k->half;
    size_t off = 0;
    for (size_t i = lo; i < hi; i++) {
        if (gpu_big(k, i))
            continue;
        if (gpu_copy_key(l, i, base + off, k->lens[i], true))
            k->res[i] = MOONLET_ERR_INTERNAL_ERROR;
        off += gpu_slot(k->lens[i]);
    }
    int rc = gpu_mark(l, 0);
    if (gpu_wait(l, 0) || rc)
        for (size_t i = lo; i < hi; i++)
            if (!gpu_big(k, i) && k->res[i] == GPU_UNSET)
                k->res[i] = MOONLET_ERR_INTERNAL_ERROR;
    size_t m = 0;
    off = 0;
    for (size_t i = lo; i < hi; i++) {
        if (gpu_big(k, i))
            continue;
        if (k->res[i] == GPU_UNSET) {
            l->ck[m] = k->keys[i];
            l->cb[m] = base + off;
            l->cl[m] = k->lens[i];
            l->cr[m] = GPU_UNSET;
            l->cidx[m++] = i;
        }
        off += gpu_slot(k->lens[i]);
    }
    if (!m)
        return;
    rc = k->c->ops->batch_put_from(k->c->be, l->ck, (const void *const *)l->cb, l->cl, m, k->opt,
                                   l->cr);
    gpu_fill(l->cr, m, rc);
    for (size_t x = 0; x < m; x++) {
        k->res[l->cidx[x]] = l->cr[x];
        if (!l->cr[x])
            atomic_fetch_add(&k->g->staged_bytes, l->cl[x]);
    }
}

/* get: the end of the chunk whose copies into the devices were queued from
 * slot s: waited for, then its keys' results; nothing when none pending. */
static void gpu_get_finish(gpu_lane *l, int s)
{
    gpu_call *k = l->k;
    size_t at = l->pend_at[s], m = l->pend_m[s];
    if (!m)
        return;
    l->pend_m[s] = 0;
    bool failed = (gpu_wait(l, s) != MOONLET_OK) | l->pend_failed[s];
    for (size_t x = at; x < at + m; x++) {
        size_t i = l->cidx[x];
        if (k->res[i] != MOONLET_OK)
            continue;
        if (failed)
            k->res[i] = MOONLET_ERR_INTERNAL_ERROR;
        else
            atomic_fetch_add(&k->g->staged_bytes, l->csz[x]);
    }
}

/* get, chunk j on lane l: the backend's batch into a slot of the lane's
 * half (it verifies each object's checksum there), then each object's
 * bytes queued for its ranges.  The slot's previous copies are waited for
 * before it is reused, and this chunk's when the slot next comes round, or
 * at the lane's end (gpu_get_finish). */
static void gpu_get_chunk(gpu_lane *l, size_t j)
{
    gpu_call *k = l->k;
    size_t lo = k->cuts[j], hi = k->cuts[j + 1];
    int s = k->two_slots ? (int)(j / 2 % 2) : 0;
    unsigned char *base = k->g->stage + (size_t)l->h * k->half +
                          (size_t)s * (k->half / 2 / GPU_ALIGN * GPU_ALIGN);
    gpu_get_finish(l, s);
    size_t m = 0, off = 0;
    for (size_t i = lo; i < hi; i++) {
        if (gpu_big(k, i))
            continue;
        l->ck[lo + m] = k->keys[i];
        l->cb[lo + m] = base + off;
        l->cl[lo + m] = k->lens[i];
        l->csz[lo + m] = 0;
        l->cr[lo + m] = GPU_UNSET;
        l->cidx[lo + m++] = i;
        off += gpu_slot(k->lens[i]);
    }
    if (!m)
        return;
    int rc = k->c->ops->batch_get_into(k->c->be, l->ck + lo, l->cb + lo, l->cl + lo, m,
                                       l->csz + lo, l->cr + lo, k->tenant);
    gpu_fill(l->cr + lo, m, rc);
    l->slot = s;
    for (size_t x = lo; x < lo + m; x++) {
        size_t i = l->cidx[x];
        k->res[i] = l->cr[x];
        k->sizes[i] = l->cr[x] == MOONLET_OK || l->cr[x] == MOONLET_ERR_BUFFER_OVERFLOW ? l->csz[x]
                                                                                      : 0;
        if (l->cr[x] || l->csz[x] > l->cl[x])
            continue;
        /* verified on the host by the backend: now to the ranges */
        if (gpu_copy_key(l, i, l->cb[x], l->csz[x], false))
            k->res[i] = MOONLET_ERR_INTERNAL_ERROR;
    }
    l->pend_failed[s] = gpu_mark(l, s) != MOONLET_OK;
    l->slot = 0;
    l->pend_at[s] = lo;
    l->pend_m[s] = m;
}

/* A big key: through host memory of its own, synchronous copies. */
static void gpu_put_big(gpu_lane *l, size_t i)
{
    gpu_call *k = l->k;
    unsigned char *tmp = malloc(k->lens[i]);
    int rc = tmp ? gpu_copy_key(l, i, tmp, k->lens[i], true) : MOONLET_ERR_INTERNAL_ERROR;
    gpu_unuse(l);
    if (!rc)
        rc = k->c->ops->put(k->c->be, k->keys[i], tmp, k->lens[i], k->opt);
    if (!rc)
        atomic_fetch_add(&k->g->staged_bytes, k->lens[i]);
    k->res[i] = rc;
    free(tmp);
}

static void gpu_get_big(gpu_lane *l, size_t i)
{
    gpu_call *k = l->k;
    unsigned char *tmp = malloc(k->lens[i]);
    size_t got = 0;
    int rc = tmp ? k->c->ops->get(k->c->be, k->keys[i], tmp, k->lens[i], &got, k->tenant)
                 : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc && got <= k->lens[i]) {
        rc = gpu_copy_key(l, i, tmp, got, false);
        gpu_unuse(l);
    }
    if (!rc)
        atomic_fetch_add(&k->g->staged_bytes, got);
    k->res[i] = rc;
    k->sizes[i] = rc == MOONLET_OK || rc == MOONLET_ERR_BUFFER_OVERFLOW ? got : 0;
    free(tmp);
}

static void gpu_lane_free(gpu_lane *l)
{
    free(l->ck);
    free(l->cb);
    free(l->cl);
    free(l->csz);
    free(l->cr);
    free(l->cidx);
}

static int gpu_lane_init(gpu_lane *l, gpu_call *k, int h)
{
    size_t m = k->n ? k->n : 1;
    *l = (gpu_lane){.k = k, .h = h, .cur = -1};
    if (!(l->ck = calloc(m, sizeof(*l->ck))) || !(l->cb = calloc(m, sizeof(*l->cb))) ||
        !(l->cl = calloc(m, sizeof(size_t))) || !(l->csz = calloc(m, sizeof(size_t))) ||
        !(l->cr = calloc(m, sizeof(int32_t))) || !(l->cidx = calloc(m, sizeof(size_t)))) {
        gpu_lane_free(l);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    return MOONLET_OK;
}

/* A lane's chunks: h, h + 2, ... (put or get), then its context popped. */
typedef struct gpu_lane_job {
    gpu_lane *l;
    bool put;
} gpu_lane_job;

static void *gpu_lane_run(void *arg)
{
    gpu_lane_job *job = arg;
    gpu_lane *l = job->l;
    for (size_t j = (size_t)l->h; j < l->k->nchunks; j += 2) {
        if (job->put)
            gpu_put_chunk(l, j);
        else
            gpu_get_chunk(l, j);
    }
    gpu_get_finish(l, 0);
    gpu_get_finish(l, 1);
    gpu_unuse(l);
    return NULL;
}

static void gpu_call_free(gpu_call *k)
{
    free(k->first);
    free(k->lens);
    free(k->dev);
    free(k->cuts);
}

/* Sets up the call: plan, chunks, the region.  On failure every result is
 * the code. */
static int gpu_call_begin(gpu_call *k, moonlet_client *c, const char *const *keys, size_t n,
                          const struct iovec *iov, const size_t *iovcnt, int32_t *results)
{
    k->c = c;
    k->g = gpu_of(c);
    k->keys = keys;
    k->n = n;
    k->iov = iov;
    k->iovcnt = iovcnt;
    k->res = results;
    size_t m = n ? n : 1;
    int rc = MOONLET_OK;
    if (!k->g || (n && (!keys || !iovcnt || !results)))
        rc = MOONLET_ERR_INVALID_PARAMS;
    else if (!(k->first = calloc(m, sizeof(size_t))) || !(k->lens = calloc(m, sizeof(size_t))))
        rc = MOONLET_ERR_INTERNAL_ERROR;
    if (!rc)
        rc = gpu_plan(k);
    if (!rc && !(rc = gpu_stage_take(c, k->g))) {
        k->half = k->g->stage_len / 2 / GPU_ALIGN * GPU_ALIGN;
        k->chunk = gpu_chunk_size(k);
        /* A get's chunks are cut to fit a slot, so that its lanes alternate
         * slots (gpu_lane), unless slots are smaller than chunks may be, or
         * than one of its keys (a chunk holds one key at least) */
        size_t slot = k->half / 2 / GPU_ALIGN * GPU_ALIGN, widest = 0;
        for (size_t i = 0; i < n; i++)
            if (!gpu_big(k, i) && gpu_slot(k->lens[i]) > widest)
                widest = gpu_slot(k->lens[i]);
        if (k->get && widest <= slot && k->chunk > slot && slot >= GPU_CHUNK_MIN)
            k->chunk = slot;
        k->two_slots = k->get && widest <= slot && k->chunk <= slot;
        if ((rc = gpu_cut(k)))
            gpu_stage_give(k->g);
    }
    for (size_t i = 0; results && i < n; i++)
        results[i] = rc ? rc : GPU_UNSET;
    if (rc)
        gpu_call_free(k);
    else
        atomic_fetch_add(&k->g->staged_calls, 1);
    return rc;
}

/* Runs the call's chunks on two lanes, the second on a thread of its own
 * when there are two chunks or more (on this thread after the first when
 * the thread cannot start), then its big keys; gives the region back.
 * Returns 0 when every key succeeded, else the first key's error. */
static int gpu_call_run(gpu_call *k, bool put)
{
    gpu_lane lane[2];
    int rc = gpu_lane_init(&lane[0], k, 0);
    if (!rc && (rc = gpu_lane_init(&lane[1], k, 1)))
        gpu_lane_free(&lane[0]);
    if (!rc) {
        gpu_lane_job job[2] = {{&lane[0], put}, {&lane[1], put}};
        pthread_t t;
        bool threaded = k->nchunks > 1 && pthread_create(&t, NULL, gpu_lane_run, &job[1]) == 0;
        gpu_lane_run(&job[0]);
        if (threaded)
            pthread_join(t, NULL);
        else
            gpu_lane_run(&job[1]);
        lane[0].h = -1; /* big keys: synchronous copies */
        for (size_t i = 0; i < k->n; i++) {
            if (!gpu_big(k, i))
                continue;
            if (put)
                gpu_put_big(&lane[0], i);
            else
                gpu_get_big(&lane[0], i);
        }
        gpu_unuse(&lane[0]);
        gpu_lane_free(&lane[0]);
        gpu_lane_free(&lane[1]);
    }
    gpu_stage_give(k->g);
    for (size_t i = 0; i < k->n; i++)
        if (k->res[i] == GPU_UNSET)
            k->res[i] = rc ? rc : MOONLET_ERR_INTERNAL_ERROR;
    rc = MOONLET_OK;
    for (size_t i = 0; i < k->n && !rc; i++)
        rc = k->res[i];
    gpu_call_free(k);
    return rc;
}

int moonlet_client_gpu_put(moonlet_client *c, const char *const *keys, size_t n,
                           const struct iovec *iov, const size_t *iovcnt,
                           const moonlet_put_options *opt, int32_t *results)
{
    gpu_call k = {.opt = opt};
    int rc = gpu_call_begin(&k, c, keys, n, iov, iovcnt, results);
    return rc ? rc : gpu_call_run(&k, true);
}

int moonlet_client_gpu_get(moonlet_client *c, const char *const *keys, size_t n,
                           const struct iovec *iov, const size_t *iovcnt, const char *tenant,
                           size_t *sizes, int32_t *results)
{
    if (n && !sizes)
        return MOONLET_ERR_INVALID_PARAMS;
    for (size_t i = 0; i < n; i++)
        sizes[i] = 0;
    gpu_call k = {.tenant = tenant, .sizes = sizes, .get = true};
    int rc = gpu_call_begin(&k, c, keys, n, iov, iovcnt, results);
    return rc ? rc : gpu_call_run(&k, false);
}

int moonlet_client_gpu_upsert(moonlet_client *c, const char *key, const void *buf, size_t len,
                              const moonlet_put_options *opt)
{
    moonlet_client_gpu *g = gpu_of(c);
    struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
    size_t one = 1, first = 0, lens = 0;
    int32_t res;
    gpu_call k = {.c = c, .g = g, .keys = &key, .n = 1, .iov = &v, .iovcnt = &one, .res = &res,
                  .first = &first, .lens = &lens};
    gpu_lane l = {.k = &k, .h = -1, .cur = -1};
    int rc = g ? gpu_plan(&k) : MOONLET_ERR_INVALID_PARAMS;
    unsigned char *tmp = rc ? NULL : malloc(len ? len : 1);
    if (!rc && !tmp)
        rc = MOONLET_ERR_INTERNAL_ERROR;
    if (!rc)
        rc = gpu_copy_key(&l, 0, tmp, len, true);
    gpu_unuse(&l);
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
            for (int h = 0; h < 2; h++) {
                cu->cuEventDestroy(gd->ev[h][0]);
                cu->cuEventDestroy(gd->ev[h][1]);
                cu->cuStreamDestroy(gd->stream[h]);
            }
            cu->cuCtxPopCurrent(&popped);
        }
        cu->cuDevicePrimaryCtxRelease(gd->dev);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_mutex_destroy(&g->stage_mu);
    pthread_cond_destroy(&g->stage_cv);
    free(g);
}
