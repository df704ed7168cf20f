/*
 * fakecuda.c - libfakecuda.so, a fake CUDA driver for machines without a GPU.
 *
 * It exports exactly the driver calls of common/cuda_api.h (both lists, under
 * the symbol names libcuda.so.1 uses, e.g. cuMemcpyDtoHAsync_v2) plus the
 * counters of tests/gpu/fakecuda.h.  Tests point moonlet at it with
 * MOONLET_CUDA_DRIVER=<path of build/tests/gpu/libfakecuda.so>.
 *
 * What it models, where moonlet could notice the difference:
 *  - Device memory the host cannot touch.  cuMemAlloc_v2 makes a memfd of the
 *    size rounded up to the page size and maps it twice: a PROT_NONE mapping,
 *    whose address is the CUdeviceptr (host code that dereferences it gets
 *    SIGSEGV), and a read-write "shadow" mapping through which the copy calls
 *    move the bytes.  Any address inside an allocation is translated.
 *  - Devices (FAKECUDA_DEVICES, default 2, at most 16; 0 makes cuInit fail
 *    with CUDA_ERROR_NO_DEVICE), one refcounted primary context per device,
 *    a per-thread context stack (at most 64 deep).  Every call but cuInit,
 *    cuDriverGetVersion and cuGetErrorString is CUDA_ERROR_NOT_INITIALIZED
 *    before cuInit.  Calls that create something (memory, streams, events,
 *    pinned host memory), cuMemsetD32_v2 and the copies want a current
 *    context (CUDA_ERROR_INVALID_CONTEXT without one), as the real driver
 *    does; the calls that free or destroy do not (the real driver wants one
 *    there too).
 *  - cuPointerGetAttributes: device memory reports its type, device, base,
 *    size and context; cuMemHostAlloc'd or registered memory reports
 *    CU_MEMORYTYPE_HOST (base and size of its range, the context current when
 *    it was made); any other address succeeds with zeros.
 *  - Pinned host memory: cuMemHostAlloc / cuMemFreeHost and
 *    cuMemHostRegister_v2 / cuMemHostUnregister are tracked ranges
 *    (overlapping registration: 712, unregistering an unknown one: 713).
 *  - Streams are real asynchronous queues: one worker thread per stream runs
 *    its copies and event markers in FIFO order; cuEventSynchronize waits for
 *    the event's most recently recorded marker.  An async copy needs the
 *    stream's context current and device memory of that context's device
 *    (else CUDA_ERROR_INVALID_CONTEXT, counted).  An async copy whose host
 *    side is not pinned memory is still asynchronous here but counted
 *    (fakecuda_pageable_async_copies): the real driver would quietly make it
 *    synchronous.  cuStreamDestroy_v2 drains the queue and joins the worker.
 *    cuMemFree_v2 waits for the queued copies that touch the allocation.
 *  - The synchronous copies and cuMemsetD32_v2 work from any context (as with
 *    unified addressing) and are done when they return.
 *  - cuMemGetHandleForAddressRange: CUDA_ERROR_NOT_SUPPORTED unless
 *    FAKECUDA_DMABUF=1 and /dev/udmabuf exists; then a dma-buf fd made by
 *    udmabuf from the allocation's memfd (page-aligned ranges only).
 *
 * What it does not model: kernels, peer access between devices, IPC handles,
 * managed memory, the legacy default stream's synchronisation with other
 * streams (a NULL stream here runs its copies and records its events at once,
 * in the calling thread), stream callbacks, event timing, memory limits other
 * than what the host can map, and contexts other than the primary ones.
 */
#include "cuda_api.h"
#include "fakecuda.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/udmabuf.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

/* Not in cuda_api.h (moonlet does not test for them); the driver's values. */
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713

#define FAKE_MAX_DEVICES 16
#define FAKE_DEFAULT_DEVICES 2
#define FAKE_CTX_STACK_MAX 64
#define FAKE_DRIVER_VERSION 12040

/* Every driver call gets a prototype from cuda_api.h's lists; the asm label
 * gives the definition the driver's symbol name (cuMemFree -> cuMemFree_v2). */
#define FAKE_PROTOTYPE(name, sym, params) CUresult name params __asm__(sym);
MOONLET_CUDA_CALLS(FAKE_PROTOTYPE)
MOONLET_CUDA_OPTIONAL_CALLS(FAKE_PROTOTYPE)
#undef FAKE_PROTOTYPE

struct CUctx_st {
    int device;
    int refcount; /* primary context retains; under g_mu */
};

/* A device allocation: [base, base + size) is PROT_NONE, shadow is the same
 * memfd mapped read-write. */
struct dev_alloc {
    uintptr_t base;
    size_t size;   /* as asked */
    size_t maplen; /* rounded up to the page size */
    int fd;
    unsigned char *shadow;
    int device;
    unsigned pending; /* copies queued or running on it; under g_mu */
    bool freeing;
    struct dev_alloc *next;
};

enum host_kind { HOST_ALLOC, HOST_REGISTERED };

struct host_range {
    uintptr_t base;
    size_t len;
    size_t maplen; /* HOST_ALLOC: what to munmap */
    enum host_kind kind;
    CUcontext ctx;
    struct host_range *next;
};

struct CUevent_st {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded; /* markers recorded (numbered 1, 2, ...) */
    uint64_t done;     /* highest marker number executed */
    atomic_uint refs;  /* the handle, plus one per queued marker or waiter */
    struct CUevent_st *next; /* live events; under g_mu */
};

enum op_kind { OP_COPY, OP_MARKER };

struct stream_op {
    enum op_kind kind;
    void *dst;
    const void *src;
    size_t len;
    struct dev_alloc *alloc; /* OP_COPY: pending released when done */
    struct CUevent_st *event; /* OP_MARKER */
    uint64_t seq;
    struct stream_op *next;
};

struct CUstream_st {
    CUcontext ctx;
    pthread_t worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct stream_op *head, *tail; /* under mu */
    bool stop;                      /* under mu */
    struct CUstream_st *next;       /* live streams; under g_mu */
};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
static atomic_bool g_initialized;
static int g_ndevices;
static struct CUctx_st g_ctx[FAKE_MAX_DEVICES];
static bool g_dmabuf;
static size_t g_page;

/* g_mu guards the allocation and host-range tables, the live stream and
 * event lists, the contexts' refcounts and the pinned byte counts.  Lock
 * order: g_mu, then a stream's or an event's mu. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_free_cv = PTHREAD_COND_INITIALIZER; /* pending dropped */
static struct dev_alloc *g_allocs;
static struct host_range *g_hosts;
static struct CUstream_st *g_streams;
static struct CUevent_st *g_events;
static size_t g_pinned_bytes, g_pinned_peak;

static atomic_uint_fast64_t g_async_copies, g_pageable_copies, g_wrong_context;

static __thread CUcontext t_stack[FAKE_CTX_STACK_MAX];
static __thread int t_depth;

/* ------------------------------------------------------------------ */
/* Helpers                                                             */

static void fake_init_once(void)
{
    long page = sysconf(_SC_PAGESIZE);
    g_page = page > 0 ? (size_t)page : 4096;
    int n = FAKE_DEFAULT_DEVICES;
    const char *s = getenv("FAKECUDA_DEVICES");
    if (s && *s) {
        char *end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno == 0 && end && *end == '\0' && v >= 0 && v <= FAKE_MAX_DEVICES)
            n = (int)v;
    }
    const char *d = getenv("FAKECUDA_DMABUF");
    g_dmabuf = d && strcmp(d, "1") == 0;
    for (int i = 0; i < FAKE_MAX_DEVICES; i++)
        g_ctx[i] = (struct CUctx_st){.device = i, .refcount = 0};
    g_ndevices = n;
    if (n == 0) {
        g_init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    g_init_result = CUDA_SUCCESS;
    atomic_store(&g_initialized, true);
}

static bool initialized(void)
{
    return atomic_load_explicit(&g_initialized, memory_order_acquire);
}

static CUcontext current_ctx(void)
{
    return t_depth > 0 ? t_stack[t_depth - 1] : NULL;
}

static bool valid_ctx(CUcontext c)
{
    return c && c >= &g_ctx[0] && c < &g_ctx[g_ndevices] && c == &g_ctx[c->device];
}

static size_t round_page(size_t n)
{
    if (n > SIZE_MAX - (g_page - 1))
        return 0;
    return (n + g_page - 1) & ~(g_page - 1);
}

/* The allocation holding [addr, addr + len) start; under g_mu. */
static struct dev_alloc *find_alloc_locked(uintptr_t addr)
{
    for (struct dev_alloc *a = g_allocs; a; a = a->next)
        if (!a->freeing && addr >= a->base && addr - a->base < a->size)
            return a;
    return NULL;
}

static bool range_fits(const struct dev_alloc *a, uintptr_t addr, size_t len)
{
    return len <= a->size - (addr - a->base);
}

static struct host_range *find_host_locked(uintptr_t addr)
{
    for (struct host_range *h = g_hosts; h; h = h->next)
        if (addr >= h->base && addr - h->base < h->len)
            return h;
    return NULL;
}

static bool host_pinned_locked(const void *p, size_t len)
{
    struct host_range *h = find_host_locked((uintptr_t)p);
    return h && len <= h->len - ((uintptr_t)p - h->base);
}

static void pinned_add_locked(size_t n)
{
    g_pinned_bytes += n;
    if (g_pinned_bytes > g_pinned_peak)
        g_pinned_peak = g_pinned_bytes;
}

/* Takes a device range for a copy: the shadow address of addr, with the
 * allocation's pending count raised (release_alloc() drops it). */
static CUresult acquire_range(CUdeviceptr addr, size_t len, int want_device,
                              struct dev_alloc **out, unsigned char **shadow)
{
    pthread_mutex_lock(&g_mu);
    struct dev_alloc *a = find_alloc_locked((uintptr_t)addr);
    CUresult r = CUDA_SUCCESS;
    if (!a || !range_fits(a, (uintptr_t)addr, len))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (want_device >= 0 && a->device != want_device)
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS) {
        a->pending++;
        *out = a;
        *shadow = a->shadow + ((uintptr_t)addr - a->base);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

static void release_alloc(struct dev_alloc *a)
{
    pthread_mutex_lock(&g_mu);
    a->pending--;
    if (a->pending == 0 && a->freeing)
        pthread_cond_broadcast(&g_free_cv);
    pthread_mutex_unlock(&g_mu);
}

static bool stream_live_locked(const struct CUstream_st *s)
{
    for (struct CUstream_st *x = g_streams; x; x = x->next)
        if (x == s)
            return true;
    return false;
}

static bool event_live_locked(const struct CUevent_st *e)
{
    for (struct CUevent_st *x = g_events; x; x = x->next)
        if (x == e)
            return true;
    return false;
}

static void event_unref(struct CUevent_st *e)
{
    if (atomic_fetch_sub(&e->refs, 1) == 1) {
        pthread_cond_destroy(&e->cv);
        pthread_mutex_destroy(&e->mu);
        free(e);
    }
}

/* Marks marker seq of e executed. */
static void event_complete(struct CUevent_st *e, uint64_t seq)
{
    pthread_mutex_lock(&e->mu);
    if (seq > e->done)
        e->done = seq;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void run_op(struct stream_op *op)
{
    if (op->kind == OP_COPY) {
        memcpy(op->dst, op->src, op->len);
        release_alloc(op->alloc);
    } else {
        event_complete(op->event, op->seq);
        event_unref(op->event);
    }
}

static void *stream_worker(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    /* Ends when destroyed and drained; each pass runs one operation or
     * waits for one. */
    while (s->head || !s->stop) {
        if (!s->head) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        struct stream_op *op = s->head;
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        run_op(op);
        free(op);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Appends op to s (checked live under g_mu, which the caller holds). */
static void stream_enqueue_locked(struct CUstream_st *s, struct stream_op *op)
{
    op->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------ */
/* Initialisation, errors, devices, contexts                          */

CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&g_once, fake_init_once);
    return g_init_result;
}

CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = FAKE_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    switch (e) {
    case CUDA_SUCCESS: *s = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *s = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: *s = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_DEVICE: *s = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "invalid device context"; break;
    case CUDA_ERROR_INVALID_HANDLE: *s = "invalid resource handle"; break;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
        *s = "part or all of the requested memory range is already mapped";
        break;
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
        *s = "pointer does not correspond to a registered memory region";
        break;
    case CUDA_ERROR_NOT_SUPPORTED: *s = "operation not supported"; break;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_ndevices;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    g_ctx[dev].refcount++;
    pthread_mutex_unlock(&g_mu);
    *ctx = &g_ctx[dev];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= g_ndevices)
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    if (g_ctx[dev].refcount > 0)
        g_ctx[dev].refcount--;
    else
        r = CUDA_ERROR_INVALID_CONTEXT; /* released more often than retained */
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuCtxPushCurrent(CUcontext ctx)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!valid_ctx(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth >= FAKE_CTX_STACK_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *ctx)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = t_stack[--t_depth];
    t_stack[t_depth] = NULL;
    if (ctx)
        *ctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx) { /* pops the top, if any */
        if (t_depth > 0)
            t_stack[--t_depth] = NULL;
        return CUDA_SUCCESS;
    }
    if (!valid_ctx(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0)
        t_depth = 1;
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Pointer attributes                                                  */

CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr ptr)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (n == 0 || !attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned int i = 0; i < n; i++) {
        if (!data[i])
            return CUDA_ERROR_INVALID_VALUE;
        switch (attrs[i]) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: break;
        default: return CUDA_ERROR_INVALID_VALUE;
        }
    }
    unsigned int type = 0;
    int ordinal = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    CUcontext ctx = NULL;
    pthread_mutex_lock(&g_mu);
    struct dev_alloc *a = find_alloc_locked((uintptr_t)ptr);
    if (a) {
        type = CU_MEMORYTYPE_DEVICE;
        ordinal = a->device;
        start = a->base;
        size = a->size;
        ctx = &g_ctx[a->device];
    } else {
        struct host_range *h = find_host_locked((uintptr_t)ptr);
        if (h) {
            type = CU_MEMORYTYPE_HOST;
            ctx = h->ctx;
            ordinal = ctx ? ctx->device : 0;
            start = h->base;
            size = h->len;
        }
    }
    pthread_mutex_unlock(&g_mu);
    for (unsigned int i = 0; i < n; i++) {
        switch (attrs[i]) {
        case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data[i] = ctx; break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data[i] = type; break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data[i] = 0; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data[i] = ordinal; break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data[i] = start; break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data[i] = size; break;
        default: break; /* checked above */
        }
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Pinned host memory                                                  */

CUresult cuMemHostAlloc(void **pp, size_t len, unsigned int flags)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pp || len == 0 || (flags & ~0x7u))
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = current_ctx();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    size_t maplen = round_page(len);
    if (maplen == 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct host_range *h = calloc(1, sizeof(*h));
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *h = (struct host_range){.base = (uintptr_t)p, .len = len, .maplen = maplen,
                             .kind = HOST_ALLOC, .ctx = ctx};
    pthread_mutex_lock(&g_mu);
    h->next = g_hosts;
    g_hosts = h;
    pinned_add_locked(len);
    pthread_mutex_unlock(&g_mu);
    *pp = p;
    return CUDA_SUCCESS;
}

/* Unlinks and returns the range of kind that starts at p. */
static struct host_range *host_take(void *p, enum host_kind kind)
{
    pthread_mutex_lock(&g_mu);
    struct host_range **pp = &g_hosts;
    while (*pp && !((*pp)->base == (uintptr_t)p && (*pp)->kind == kind))
        pp = &(*pp)->next;
    struct host_range *h = *pp;
    if (h) {
        *pp = h->next;
        g_pinned_bytes -= h->len;
    }
    pthread_mutex_unlock(&g_mu);
    return h;
}

CUresult cuMemFreeHost(void *p)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct host_range *h = p ? host_take(p, HOST_ALLOC) : NULL;
    if (!h)
        return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)h->base, h->maplen);
    free(h);
    return CUDA_SUCCESS;
}

CUresult cuMemHostRegister(void *p, size_t len, unsigned int flags)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!p || len == 0 || (flags & ~0xFu) || len > UINTPTR_MAX - (uintptr_t)p)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = current_ctx();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct host_range *h = calloc(1, sizeof(*h));
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *h = (struct host_range){.base = (uintptr_t)p, .len = len, .kind = HOST_REGISTERED,
                             .ctx = ctx};
    uintptr_t lo = (uintptr_t)p, hi = lo + len;
    pthread_mutex_lock(&g_mu);
    for (struct host_range *x = g_hosts; x; x = x->next) {
        if (lo < x->base + x->len && x->base < hi) {
            pthread_mutex_unlock(&g_mu);
            free(h);
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        }
    }
    h->next = g_hosts;
    g_hosts = h;
    pinned_add_locked(len);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void *p)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct host_range *h = p ? host_take(p, HOST_REGISTERED) : NULL;
    if (!h)
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    free(h);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Device memory                                                       */

CUresult cuMemAlloc(CUdeviceptr *p, size_t len)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!p || len == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = current_ctx();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    size_t maplen = round_page(len);
    if (maplen == 0 || maplen > (size_t)INT64_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct dev_alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->fd = memfd_create("fakecuda", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (a->fd < 0)
        goto fail;
    if (ftruncate(a->fd, (off_t)maplen) != 0)
        goto fail_fd;
    (void)fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK); /* udmabuf wants it */
    void *dev = mmap(NULL, maplen, PROT_NONE, MAP_SHARED, a->fd, 0);
    if (dev == MAP_FAILED)
        goto fail_fd;
    void *shadow = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
    if (shadow == MAP_FAILED) {
        munmap(dev, maplen);
        goto fail_fd;
    }
    a->base = (uintptr_t)dev;
    a->size = len;
    a->maplen = maplen;
    a->shadow = shadow;
    a->device = ctx->device;
    pthread_mutex_lock(&g_mu);
    a->next = g_allocs;
    g_allocs = a;
    pthread_mutex_unlock(&g_mu);
    *p = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
fail_fd:
    close(a->fd);
fail:
    free(a);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemFree(CUdeviceptr p)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_mu);
    struct dev_alloc **pp = &g_allocs;
    while (*pp && !((*pp)->base == (uintptr_t)p && !(*pp)->freeing))
        pp = &(*pp)->next;
    struct dev_alloc *a = *pp;
    if (!a) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    a->freeing = true; /* no new copies; wait for the queued ones */
    while (a->pending > 0)
        pthread_cond_wait(&g_free_cv, &g_mu);
    /* Unlink: the list may have changed while waiting. */
    pp = &g_allocs;
    while (*pp != a)
        pp = &(*pp)->next;
    *pp = a->next;
    pthread_mutex_unlock(&g_mu);
    munmap((void *)a->base, a->maplen);
    munmap(a->shadow, a->maplen);
    close(a->fd);
    free(a);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32(CUdeviceptr p, unsigned int v, size_t n)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!current_ctx())
        return CUDA_ERROR_INVALID_CONTEXT;
    if ((p & 3) != 0 || n > SIZE_MAX / 4)
        return CUDA_ERROR_INVALID_VALUE;
    if (n == 0)
        return CUDA_SUCCESS;
    struct dev_alloc *a;
    unsigned char *sh;
    CUresult r = acquire_range(p, n * 4, -1, &a, &sh);
    if (r != CUDA_SUCCESS)
        return r;
    for (size_t i = 0; i < n; i++)
        memcpy(sh + i * 4, &v, 4);
    release_alloc(a);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Copies                                                              */

static CUresult copy_sync(void *host, CUdeviceptr dev, size_t len, bool to_host)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!current_ctx())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (len == 0)
        return CUDA_SUCCESS;
    if (!host)
        return CUDA_ERROR_INVALID_VALUE;
    struct dev_alloc *a;
    unsigned char *sh;
    CUresult r = acquire_range(dev, len, -1, &a, &sh);
    if (r != CUDA_SUCCESS)
        return r;
    if (to_host)
        memcpy(host, sh, len);
    else
        memcpy(sh, host, len);
    release_alloc(a);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t len)
{
    return copy_sync(dst, src, len, true);
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t len)
{
    return copy_sync((void *)(uintptr_t)src, dst, len, false);
}

static CUresult copy_async(void *host, CUdeviceptr dev, size_t len, bool to_host,
                           CUstream s)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext cur = current_ctx();
    if (!cur) {
        atomic_fetch_add(&g_wrong_context, 1);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (!host && len > 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct stream_op *op = calloc(1, sizeof(*op));
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    if (s && !stream_live_locked(s)) {
        r = CUDA_ERROR_INVALID_HANDLE;
        goto out;
    }
    if (s && s->ctx != cur) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        atomic_fetch_add(&g_wrong_context, 1);
        goto out;
    }
    if (len == 0)
        goto out;
    struct dev_alloc *a = find_alloc_locked((uintptr_t)dev);
    if (!a || !range_fits(a, (uintptr_t)dev, len)) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    if (a->device != cur->device) {
        r = CUDA_ERROR_INVALID_CONTEXT;
        atomic_fetch_add(&g_wrong_context, 1);
        goto out;
    }
    atomic_fetch_add(&g_async_copies, 1);
    if (!host_pinned_locked(host, len))
        atomic_fetch_add(&g_pageable_copies, 1);
    unsigned char *sh = a->shadow + ((uintptr_t)dev - a->base);
    a->pending++;
    *op = (struct stream_op){.kind = OP_COPY, .dst = to_host ? host : (void *)sh,
                             .src = to_host ? (const void *)sh : host, .len = len,
                             .alloc = a};
    if (s) {
        stream_enqueue_locked(s, op);
        op = NULL;
    }
out:
    pthread_mutex_unlock(&g_mu);
    if (op && r == CUDA_SUCCESS && len > 0) /* the NULL stream: at once */
        run_op(op);
    free(op);
    return r;
}

CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t len, CUstream s)
{
    return copy_async(dst, src, len, true, s);
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t len, CUstream s)
{
    return copy_async((void *)(uintptr_t)src, dst, len, false, s);
}

/* ------------------------------------------------------------------ */
/* Streams and events                                                  */

CUresult cuStreamCreate(CUstream *out, unsigned int flags)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!out || (flags & ~(unsigned int)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = current_ctx();
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->ctx = ctx;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->worker, NULL, stream_worker, s) != 0) {
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&g_mu);
    s->next = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&g_mu);
    *out = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream s)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_mu);
    struct CUstream_st **pp = &g_streams;
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (!s || !*pp) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *pp = s->next;
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->worker, NULL); /* the worker drains the queue first */
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *out, unsigned int flags)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!out || (flags & ~0x7u))
        return CUDA_ERROR_INVALID_VALUE;
    if (!current_ctx())
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUevent_st *e = calloc(1, sizeof(*e));
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    atomic_init(&e->refs, 1);
    pthread_mutex_lock(&g_mu);
    e->next = g_events;
    g_events = e;
    pthread_mutex_unlock(&g_mu);
    *out = e;
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    struct stream_op *op = calloc(1, sizeof(*op));
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mu);
    if (!e || !event_live_locked(e) || (s && !stream_live_locked(s))) {
        pthread_mutex_unlock(&g_mu);
        free(op);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    pthread_mutex_lock(&e->mu);
    uint64_t seq = ++e->recorded;
    pthread_mutex_unlock(&e->mu);
    if (s) {
        atomic_fetch_add(&e->refs, 1);
        *op = (struct stream_op){.kind = OP_MARKER, .event = e, .seq = seq};
        stream_enqueue_locked(s, op);
        op = NULL;
    } else {
        event_complete(e, seq); /* the NULL stream runs everything at once */
    }
    pthread_mutex_unlock(&g_mu);
    free(op);
    return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent e)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_mu);
    if (!e || !event_live_locked(e)) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    atomic_fetch_add(&e->refs, 1);
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_lock(&e->mu);
    uint64_t target = e->recorded;
    while (e->done < target)
        pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    event_unref(e);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent e)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_mu);
    struct CUevent_st **pp = &g_events;
    while (*pp && *pp != e)
        pp = &(*pp)->next;
    if (!e || !*pp) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *pp = e->next;
    pthread_mutex_unlock(&g_mu);
    event_unref(e); /* queued markers and waiters hold their own references */
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* dma-buf                                                             */

CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr ptr, size_t len, int type,
                                       unsigned long long flags)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!g_dmabuf)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!handle || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags != 0 || len == 0 ||
        (ptr % g_page) != 0 || (len % g_page) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int memfd = -1;
    uint64_t offset = 0;
    pthread_mutex_lock(&g_mu);
    struct dev_alloc *a = find_alloc_locked((uintptr_t)ptr);
    if (a && len <= a->maplen - ((uintptr_t)ptr - a->base)) {
        memfd = a->fd;
        offset = (uintptr_t)ptr - a->base;
    }
    pthread_mutex_unlock(&g_mu);
    if (memfd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
    if (dev < 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    struct udmabuf_create c = {.memfd = (uint32_t)memfd, .flags = UDMABUF_FLAGS_CLOEXEC,
                               .offset = offset, .size = len};
    int fd = ioctl(dev, UDMABUF_CREATE, &c);
    close(dev);
    if (fd < 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Counters (tests/gpu/fakecuda.h)                                     */

uint64_t fakecuda_async_copies(void)
{
    return atomic_load(&g_async_copies);
}

uint64_t fakecuda_pageable_async_copies(void)
{
    return atomic_load(&g_pageable_copies);
}

uint64_t fakecuda_wrong_context(void)
{
    return atomic_load(&g_wrong_context);
}

size_t fakecuda_pinned_bytes(void)
{
    pthread_mutex_lock(&g_mu);
    size_t n = g_pinned_bytes;
    pthread_mutex_unlock(&g_mu);
    return n;
}

size_t fakecuda_pinned_peak(void)
{
    pthread_mutex_lock(&g_mu);
    size_t n = g_pinned_peak;
    pthread_mutex_unlock(&g_mu);
    return n;
}

void fakecuda_reset_counters(void)
{
    atomic_store(&g_async_copies, 0);
    atomic_store(&g_pageable_copies, 0);
    atomic_store(&g_wrong_context, 0);
    pthread_mutex_lock(&g_mu);
    g_pinned_peak = g_pinned_bytes;
    pthread_mutex_unlock(&g_mu);
}
