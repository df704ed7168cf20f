/*
 * test_fakecuda.c - the fake CUDA driver (tests/gpu/fakecuda.c) behaves as
 * moonlet's GPU tests need it to.  Links nothing of moonlet: dlopen()s
 * $FAKECUDA_LIB and resolves every call of common/cuda_api.h by its symbol
 * name, as common/cuda_driver.c does with the real libcuda.so.1.
 *
 * test_not_initialized must run first (the library is loaded once per
 * process); every other test calls cuInit itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cuda_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define FAKE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FAKE_TEST_ASAN 1
#endif
#endif

#define HOST_MEMORY_ALREADY_REGISTERED 712
#define HOST_MEMORY_NOT_REGISTERED 713

#define FIELD(name, sym, params) CUresult (*name) params;
static struct {
    MOONLET_CUDA_CALLS(FIELD)
    MOONLET_CUDA_OPTIONAL_CALLS(FIELD)
    uint64_t (*async_copies)(void);
    uint64_t (*pageable_async_copies)(void);
    uint64_t (*wrong_context)(void);
    size_t (*pinned_bytes)(void);
    size_t (*pinned_peak)(void);
    void (*reset_counters)(void);
} cu;
#undef FIELD

static void *g_lib;

static void *must_sym(const char *name)
{
    void *p = dlsym(g_lib, name);
    if (!p)
        fprintf(stderr, "libfakecuda: no symbol %s\n", name);
    return p;
}

static int group_setup(void **state)
{
    const char *path = getenv("FAKECUDA_LIB");
    if (!path || !*path) {
        fprintf(stderr, "FAKECUDA_LIB is not set\n");
        return -1;
    }
    g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g_lib) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return -1;
    }
    int missing = 0;
#define RESOLVE(name, sym, params)                                                               \
    missing += !(*(void **)&cu.name = must_sym(sym));
    MOONLET_CUDA_CALLS(RESOLVE)
    MOONLET_CUDA_OPTIONAL_CALLS(RESOLVE)
#undef RESOLVE
    missing += !(*(void **)&cu.async_copies = must_sym("fakecuda_async_copies"));
    missing += !(*(void **)&cu.pageable_async_copies = must_sym("fakecuda_pageable_async_copies"));
    missing += !(*(void **)&cu.wrong_context = must_sym("fakecuda_wrong_context"));
    missing += !(*(void **)&cu.pinned_bytes = must_sym("fakecuda_pinned_bytes"));
    missing += !(*(void **)&cu.pinned_peak = must_sym("fakecuda_pinned_peak"));
    missing += !(*(void **)&cu.reset_counters = must_sym("fakecuda_reset_counters"));
    /* Only the driver's symbol names: the plain names are cuda.h macros. */
    if (dlsym(g_lib, "cuMemAlloc") || dlsym(g_lib, "cuMemcpyDtoHAsync")) {
        fprintf(stderr, "libfakecuda exports a plain name cuda.h would map to _v2\n");
        missing++;
    }
    return missing ? -1 : 0;
}

static int group_teardown(void **state)
{
    /* Not dlclose()d: stream worker threads may outlive a failed test. */
    return 0;
}

/* cuInit, device 0's primary context pushed. */
static CUcontext g_ctx0, g_ctx1;

static int setup_ctx0(void **state)
{
    if (cu.cuInit(0) != CUDA_SUCCESS)
        return -1;
    if (cu.cuDevicePrimaryCtxRetain(&g_ctx0, 0) != CUDA_SUCCESS ||
        cu.cuDevicePrimaryCtxRetain(&g_ctx1, 1) != CUDA_SUCCESS)
        return -1;
    return cu.cuCtxPushCurrent(g_ctx0) == CUDA_SUCCESS ? 0 : -1;
}

static int teardown_ctx0(void **state)
{
    CUcontext c = NULL;
    int bad = cu.cuCtxPopCurrent(&c) != CUDA_SUCCESS || c != g_ctx0;
    bad |= cu.cuDevicePrimaryCtxRelease(0) != CUDA_SUCCESS;
    bad |= cu.cuDevicePrimaryCtxRelease(1) != CUDA_SUCCESS;
    return bad ? -1 : 0;
}

static CUdeviceptr alloc_on(CUcontext ctx, size_t len)
{
    CUdeviceptr d = 0;
    assert_int_equal(cu.cuCtxPushCurrent(ctx), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemAlloc(&d, len), CUDA_SUCCESS);
    assert_int_equal(cu.cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    return d;
}

/* ------------------------------------------------------------------ */

static void test_not_initialized(void **state)
{
    int v = 0, n = 0;
    const char *s = NULL;
    CUdeviceptr d = 0;
    CUcontext c = NULL;
    CUstream st = NULL;
    void *p = NULL;
    assert_int_equal(cu.cuDriverGetVersion(&v), CUDA_SUCCESS);
    assert_true(v >= 12000);
    assert_int_equal(cu.cuGetErrorString(CUDA_ERROR_NOT_INITIALIZED, &s), CUDA_SUCCESS);
    assert_non_null(s);
    assert_int_equal(cu.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cu.cuDevicePrimaryCtxRetain(&c, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cu.cuCtxPopCurrent(&c), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cu.cuMemAlloc(&d, 4096), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cu.cuMemHostAlloc(&p, 4096, 0), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cu.cuStreamCreate(&st, 0), CUDA_ERROR_NOT_INITIALIZED);
    int attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    unsigned int type = 9;
    void *data[] = {&type};
    assert_int_equal(cu.cuPointerGetAttributes(1, &attr, data, (CUdeviceptr)(uintptr_t)&n),
                     CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cu.cuMemcpyDtoH(&n, 0, 4), CUDA_ERROR_NOT_INITIALIZED);

    assert_int_equal(cu.cuInit(1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuInit(0), CUDA_SUCCESS);
    assert_int_equal(cu.cuInit(0), CUDA_SUCCESS);
    assert_int_equal(cu.cuDeviceGetCount(&n), CUDA_SUCCESS);
    assert_int_equal(n, 2);
}

static void test_devices_and_contexts(void **state)
{
    assert_int_equal(cu.cuInit(0), CUDA_SUCCESS);
    CUdevice dev = -1;
    assert_int_equal(cu.cuDeviceGet(&dev, 1), CUDA_SUCCESS);
    assert_int_equal(dev, 1);
    assert_int_equal(cu.cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
    CUcontext a = NULL, b = NULL, a2 = NULL, c = NULL;
    assert_int_equal(cu.cuDevicePrimaryCtxRetain(&a, 0), CUDA_SUCCESS);
    assert_int_equal(cu.cuDevicePrimaryCtxRetain(&b, 1), CUDA_SUCCESS);
    assert_int_equal(cu.cuDevicePrimaryCtxRetain(&a2, 0), CUDA_SUCCESS);
    assert_non_null(a);
    assert_ptr_equal(a, a2);
    assert_ptr_not_equal(a, b);
    assert_int_equal(cu.cuDevicePrimaryCtxRetain(&c, 2), CUDA_ERROR_INVALID_DEVICE);

    /* No context: nothing is made. */
    CUdeviceptr d = 0;
    CUstream s = NULL;
    assert_int_equal(cu.cuCtxPopCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.cuMemAlloc(&d, 4096), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.cuStreamCreate(&s, 0), CUDA_ERROR_INVALID_CONTEXT);

    /* The stack: push a, push b, pop b; set replaces the top; set NULL pops. */
    assert_int_equal(cu.cuCtxPushCurrent(a), CUDA_SUCCESS);
    assert_int_equal(cu.cuCtxPushCurrent(b), CUDA_SUCCESS);
    assert_int_equal(cu.cuCtxPopCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, b);
    assert_int_equal(cu.cuCtxSetCurrent(b), CUDA_SUCCESS);
    assert_int_equal(cu.cuCtxPopCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, b);
    assert_int_equal(cu.cuCtxPopCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.cuCtxSetCurrent(a), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemAlloc(&d, 4096), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree(d), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree(d), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuCtxSetCurrent(NULL), CUDA_SUCCESS);
    assert_int_equal(cu.cuCtxPopCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.cuCtxPushCurrent((CUcontext)(uintptr_t)&dev), CUDA_ERROR_INVALID_CONTEXT);

    assert_int_equal(cu.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    assert_int_equal(cu.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
    assert_int_equal(cu.cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);

    const char *str = NULL;
    assert_int_equal(cu.cuGetErrorString(CUDA_ERROR_INVALID_CONTEXT, &str), CUDA_SUCCESS);
    assert_non_null(str);
    assert_int_equal(cu.cuGetErrorString(HOST_MEMORY_NOT_REGISTERED, &str), CUDA_SUCCESS);
    assert_non_null(str);
    assert_int_equal(cu.cuGetErrorString(-7, &str), CUDA_ERROR_INVALID_VALUE);
}

static void test_round_trip(void **state)
{
    enum { LEN = 10000 }; /* not a page multiple */
    static unsigned char in[LEN], out[LEN];
    for (size_t i = 0; i < LEN; i++)
        in[i] = (unsigned char)(i * 7 + 3);
    CUdeviceptr d = 0;
    assert_int_equal(cu.cuMemAlloc(&d, LEN), CUDA_SUCCESS);
    assert_true(d != 0);
    assert_int_equal(cu.cuMemcpyHtoD(d, in, LEN), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemcpyDtoH(out, d, LEN), CUDA_SUCCESS);
    assert_memory_equal(in, out, LEN);
    /* An interior address, and a range past the end. */
    assert_int_equal(cu.cuMemcpyDtoH(out, d + 100, 50), CUDA_SUCCESS);
    assert_memory_equal(in + 100, out, 50);
    assert_int_equal(cu.cuMemcpyDtoH(out, d + LEN - 10, 11), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuMemcpyHtoD(d + LEN, in, 1), CUDA_ERROR_INVALID_VALUE);
    /* memset, 32-bit words */
    assert_int_equal(cu.cuMemsetD32(d + 8, 0xA1B2C3D4u, 4), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemcpyDtoH(out, d, 32), CUDA_SUCCESS);
    uint32_t w[4];
    memcpy(w, out + 8, sizeof(w));
    for (int i = 0; i < 4; i++)
        assert_int_equal(w[i], 0xA1B2C3D4u);
    assert_memory_equal(out, in, 8);
    assert_memory_equal(out + 24, in + 24, 8);
    assert_int_equal(cu.cuMemsetD32(d + 2, 0, 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuMemsetD32(d, 0, LEN), CUDA_ERROR_INVALID_VALUE);
    /* Device-1 memory copied synchronously from device 0's context. */
    CUdeviceptr d1 = alloc_on(g_ctx1, 64);
    assert_int_equal(cu.cuMemcpyHtoD(d1, in, 64), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemcpyDtoH(out, d1, 64), CUDA_SUCCESS);
    assert_memory_equal(in, out, 64);
    assert_int_equal(cu.cuMemFree(d1), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree(d + 1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuMemFree(d), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemcpyDtoH(out, d, 1), CUDA_ERROR_INVALID_VALUE);
}

static void test_host_touch_segfaults(void **state)
{
    CUdeviceptr d = 0;
    assert_int_equal(cu.cuMemAlloc(&d, 4096), CUDA_SUCCESS);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* No core file; and the default action, not a sanitizer's handler. */
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = SIG_DFL;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        volatile unsigned char *p = (volatile unsigned char *)(uintptr_t)(d + 100);
        unsigned char c = *p;
        _exit(c == 0 ? 3 : 4); /* should not get here */
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
#ifdef FAKE_TEST_ASAN
    /* Should ASan keep its own handler (allow_user_segv_handler=0), it
     * reports the SEGV and exits 1, or aborts (abort_on_error=1, which
     * meson test sets). */
    if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV)) {
        print_message("ASan kept its SEGV handler (status 0x%x)\n", (unsigned)st);
        assert_true((WIFEXITED(st) && WEXITSTATUS(st) == 1) ||
                    (WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT));
    } else
#endif
    {
        assert_true(WIFSIGNALED(st));
        assert_int_equal(WTERMSIG(st), SIGSEGV);
    }
    assert_int_equal(cu.cuMemFree(d), CUDA_SUCCESS);
}

static void test_async_ordered(void **state)
{
    enum { N = 2000, CHUNK = 256 };
    unsigned char *in = NULL, *out = NULL;
    assert_int_equal(cu.cuMemHostAlloc((void **)&in, (size_t)N * CHUNK, 0), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemHostAlloc((void **)&out, (size_t)N * CHUNK, 0), CUDA_SUCCESS);
    for (size_t i = 0; i < (size_t)N * CHUNK; i++)
        in[i] = (unsigned char)(i / CHUNK * 13 + i % CHUNK);
    memset(out, 0, (size_t)N * CHUNK);
    CUdeviceptr d = 0;
    assert_int_equal(cu.cuMemAlloc(&d, CHUNK), CUDA_SUCCESS);
    CUstream s = NULL;
    CUevent e = NULL;
    assert_int_equal(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    /* Never recorded: done at once. */
    assert_int_equal(cu.cuEventSynchronize(e), CUDA_SUCCESS);
    cu.reset_counters();
    /* Every chunk goes through the same device bytes: only FIFO order gives
     * each output chunk its own input chunk. */
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(cu.cuMemcpyHtoDAsync(d, in + i * CHUNK, CHUNK, s), CUDA_SUCCESS);
        assert_int_equal(cu.cuMemcpyDtoHAsync(out + i * CHUNK, d, CHUNK, s), CUDA_SUCCESS);
        if (i == N / 2)
            assert_int_equal(cu.cuEventRecord(e, s), CUDA_SUCCESS);
    }
    assert_int_equal(cu.cuEventRecord(e, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventSynchronize(e), CUDA_SUCCESS);
    assert_memory_equal(in, out, (size_t)N * CHUNK);
    assert_int_equal(cu.async_copies(), 2 * N);
    assert_int_equal(cu.pageable_async_copies(), 0);

    /* Events recorded on two streams: the sync waits for the later record. */
    CUstream s2 = NULL;
    assert_int_equal(cu.cuStreamCreate(&s2, 0), CUDA_SUCCESS);
    memset(out, 0, CHUNK);
    assert_int_equal(cu.cuMemcpyHtoDAsync(d, in, CHUNK, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventRecord(e, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventSynchronize(e), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemcpyDtoHAsync(out, d, CHUNK, s2), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventRecord(e, s2), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventSynchronize(e), CUDA_SUCCESS);
    assert_memory_equal(in, out, CHUNK);

    /* Destroying a stream drains it; the event outlives its markers. */
    memset(out, 0, CHUNK);
    assert_int_equal(cu.cuMemcpyDtoHAsync(out, d, CHUNK, s2), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventRecord(e, s2), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventDestroy(e), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamDestroy(s2), CUDA_SUCCESS);
    assert_memory_equal(in, out, CHUNK);
    assert_int_equal(cu.cuStreamDestroy(s2), CUDA_ERROR_INVALID_HANDLE);

    /* cuMemFree waits for the copies queued on the allocation. */
    for (size_t i = 0; i < 64; i++)
        assert_int_equal(cu.cuMemcpyDtoHAsync(out + i * CHUNK, d, CHUNK, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree(d), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamDestroy(s), CUDA_SUCCESS);
    for (size_t i = 0; i < 64; i++)
        assert_memory_equal(in, out + i * CHUNK, CHUNK);
    assert_int_equal(cu.cuMemFreeHost(in), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFreeHost(out), CUDA_SUCCESS);
}

static void test_wrong_context(void **state)
{
    unsigned char *h = NULL;
    assert_int_equal(cu.cuMemHostAlloc((void **)&h, 4096, 0), CUDA_SUCCESS);
    CUdeviceptr d0 = 0;
    assert_int_equal(cu.cuMemAlloc(&d0, 4096), CUDA_SUCCESS);
    CUdeviceptr d1 = alloc_on(g_ctx1, 4096);
    CUstream s0 = NULL, s1 = NULL;
    assert_int_equal(cu.cuStreamCreate(&s0, 0), CUDA_SUCCESS);
    assert_int_equal(cu.cuCtxPushCurrent(g_ctx1), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamCreate(&s1, 0), CUDA_SUCCESS);
    assert_int_equal(cu.cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    cu.reset_counters();

    /* Device 0 current, device 0's stream, device 1's memory. */
    assert_int_equal(cu.cuMemcpyDtoHAsync(h, d1, 64, s0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.cuMemcpyHtoDAsync(d1, h, 64, s0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.wrong_context(), 2);
    /* Device 1's stream while device 0's context is current. */
    assert_int_equal(cu.cuMemcpyDtoHAsync(h, d0, 64, s1), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.cuMemcpyDtoHAsync(h, d1, 64, s1), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.wrong_context(), 4);
    assert_int_equal(cu.async_copies(), 0);
    /* Right: each device's memory on its stream with its context. */
    CUevent e = NULL;
    assert_int_equal(cu.cuEventCreate(&e, 0), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemcpyDtoHAsync(h, d0, 64, s0), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventRecord(e, s0), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventSynchronize(e), CUDA_SUCCESS);
    assert_int_equal(cu.cuCtxPushCurrent(g_ctx1), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemcpyDtoHAsync(h, d1, 64, s1), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventRecord(e, s1), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventSynchronize(e), CUDA_SUCCESS);
    /* Past the end of the allocation. */
    assert_int_equal(cu.cuMemcpyDtoHAsync(h, d1 + 4000, 97, s1), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    assert_int_equal(cu.wrong_context(), 4);
    assert_int_equal(cu.async_copies(), 2);

    /* No context at all. */
    assert_int_equal(cu.cuCtxPopCurrent(NULL), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemcpyDtoHAsync(h, d0, 64, s0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.cuCtxPushCurrent(g_ctx0), CUDA_SUCCESS);
    assert_int_equal(cu.wrong_context(), 5);

    assert_int_equal(cu.cuEventDestroy(e), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamDestroy(s0), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamDestroy(s1), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree(d0), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree(d1), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFreeHost(h), CUDA_SUCCESS);
}

struct attrs {
    unsigned int type;
    int ordinal, managed;
    CUdeviceptr start;
    size_t size;
    CUcontext ctx;
};

static CUresult get_attrs(const void *p, struct attrs *a)
{
    memset(a, 0x5A, sizeof(*a)); /* zeros must be written, not left */
    int ids[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                 CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                 CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_CONTEXT};
    void *data[] = {&a->type, &a->ordinal, &a->managed, &a->start, &a->size, &a->ctx};
    return cu.cuPointerGetAttributes(6, ids, data, (CUdeviceptr)(uintptr_t)p);
}

static void test_pointer_attributes(void **state)
{
    struct attrs a;
    CUdeviceptr d0 = 0;
    assert_int_equal(cu.cuMemAlloc(&d0, 5000), CUDA_SUCCESS);
    CUdeviceptr d1 = alloc_on(g_ctx1, 3 * 4096);

    assert_int_equal(get_attrs((void *)(uintptr_t)d0, &a), CUDA_SUCCESS);
    assert_int_equal(a.type, CU_MEMORYTYPE_DEVICE);
    assert_int_equal(a.ordinal, 0);
    assert_int_equal(a.managed, 0);
    assert_true(a.start == d0);
    assert_int_equal(a.size, 5000);
    assert_ptr_equal(a.ctx, g_ctx0);

    /* An interior pointer reports the allocation's base and size. */
    assert_int_equal(get_attrs((void *)(uintptr_t)(d1 + 4096 + 17), &a), CUDA_SUCCESS);
    assert_int_equal(a.type, CU_MEMORYTYPE_DEVICE);
    assert_int_equal(a.ordinal, 1);
    assert_true(a.start == d1);
    assert_int_equal(a.size, 3 * 4096);
    assert_ptr_equal(a.ctx, g_ctx1);

    /* Host memory the driver does not know: success, zeros. */
    char *m = malloc(100);
    assert_non_null(m);
    assert_int_equal(get_attrs(m + 3, &a), CUDA_SUCCESS);
    assert_int_equal(a.type, 0);
    assert_int_equal(a.ordinal, 0);
    assert_true(a.start == 0);
    assert_int_equal(a.size, 0);
    assert_null(a.ctx);
    /* Past the end of a device allocation is not in it. */
    assert_int_equal(get_attrs((void *)(uintptr_t)(d0 + 5000), &a), CUDA_SUCCESS);
    assert_int_equal(a.type, 0);

    /* Pinned host memory: both kinds. */
    void *ph = NULL;
    assert_int_equal(cu.cuMemHostAlloc(&ph, 1000, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
    assert_int_equal((uintptr_t)ph % 4096, 0);
    assert_int_equal(get_attrs((char *)ph + 10, &a), CUDA_SUCCESS);
    assert_int_equal(a.type, CU_MEMORYTYPE_HOST);
    assert_int_equal(cu.cuMemHostRegister(m, 100, 0), CUDA_SUCCESS);
    assert_int_equal(get_attrs(m + 99, &a), CUDA_SUCCESS);
    assert_int_equal(a.type, CU_MEMORYTYPE_HOST);
    assert_int_equal(a.managed, 0);
    assert_int_equal(cu.cuMemHostUnregister(m), CUDA_SUCCESS);
    assert_int_equal(get_attrs(m + 99, &a), CUDA_SUCCESS);
    assert_int_equal(a.type, 0);

    /* An attribute it does not know. */
    int bad = 99;
    unsigned int x = 0;
    void *data[] = {&x};
    assert_int_equal(cu.cuPointerGetAttributes(1, &bad, data, d0), CUDA_ERROR_INVALID_VALUE);

    /* No dma-buf unless FAKECUDA_DMABUF=1 and /dev/udmabuf exists (the
     * fakecuda_dmabuf test runs this with FAKECUDA_DMABUF=1). */
    const char *dmabuf = getenv("FAKECUDA_DMABUF");
    bool want = dmabuf && strcmp(dmabuf, "1") == 0 && access("/dev/udmabuf", R_OK | W_OK) == 0;
    int fd = -1;
    CUresult r = cu.cuMemGetHandleForAddressRange(&fd, d1 + 4096, 4096,
                                                  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (!want) {
        assert_int_equal(r, CUDA_ERROR_NOT_SUPPORTED);
    } else if (r == CUDA_ERROR_NOT_SUPPORTED) {
        print_message("/dev/udmabuf refused the memfd: dma-buf not checked\n");
    } else {
        /* The dma-buf maps the same bytes as the device range. */
        assert_int_equal(r, CUDA_SUCCESS);
        assert_true(fd >= 0);
        unsigned char pat[64];
        for (size_t i = 0; i < sizeof(pat); i++)
            pat[i] = (unsigned char)(i ^ 0x5C);
        assert_int_equal(cu.cuMemcpyHtoD(d1 + 4096, pat, sizeof(pat)), CUDA_SUCCESS);
        void *m2 = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
        assert_true(m2 != MAP_FAILED);
        assert_memory_equal(m2, pat, sizeof(pat));
        munmap(m2, 4096);
        close(fd);
    }
    if (dmabuf && strcmp(dmabuf, "1") == 0) /* not page-aligned */
        assert_int_equal(cu.cuMemGetHandleForAddressRange(&fd, d1 + 1, 4096,
                                                          CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
                         CUDA_ERROR_INVALID_VALUE);

    assert_int_equal(cu.cuMemFreeHost(ph), CUDA_SUCCESS);
    free(m);
    assert_int_equal(cu.cuMemFree(d0), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFree(d1), CUDA_SUCCESS);
}

static void test_pageable_vs_pinned(void **state)
{
    enum { LEN = 8192 };
    CUdeviceptr d = 0;
    assert_int_equal(cu.cuMemAlloc(&d, LEN), CUDA_SUCCESS);
    CUstream s = NULL;
    CUevent e = NULL;
    assert_int_equal(cu.cuStreamCreate(&s, 0), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventCreate(&e, 0), CUDA_SUCCESS);
    unsigned char *pageable = malloc(LEN), *reg = malloc(LEN), *pinned = NULL;
    assert_non_null(pageable);
    assert_non_null(reg);
    assert_int_equal(cu.cuMemHostAlloc((void **)&pinned, LEN, 0), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemHostRegister(reg, LEN / 2, 0), CUDA_SUCCESS);
    cu.reset_counters();

    assert_int_equal(cu.cuMemcpyDtoHAsync(pageable, d, LEN, s), CUDA_SUCCESS);
    assert_int_equal(cu.pageable_async_copies(), 1);
    assert_int_equal(cu.cuMemcpyHtoDAsync(d, pinned + 100, LEN - 100, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemcpyDtoHAsync(reg, d, LEN / 2, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemcpyHtoDAsync(d, reg + 8, LEN / 2 - 8, s), CUDA_SUCCESS);
    assert_int_equal(cu.pageable_async_copies(), 1);
    /* Runs past the registered range: pageable. */
    assert_int_equal(cu.cuMemcpyDtoHAsync(reg, d, LEN / 2 + 1, s), CUDA_SUCCESS);
    assert_int_equal(cu.pageable_async_copies(), 2);
    assert_int_equal(cu.async_copies(), 5);
    assert_int_equal(cu.cuEventRecord(e, s), CUDA_SUCCESS);
    assert_int_equal(cu.cuEventSynchronize(e), CUDA_SUCCESS);
    /* Synchronous copies are not counted.  (Not before the sync: the fake
     * does not order them after other streams' work as the legacy default
     * stream would.) */
    assert_int_equal(cu.cuMemcpyDtoH(pageable, d, LEN), CUDA_SUCCESS);
    assert_int_equal(cu.async_copies(), 5);
    cu.reset_counters();
    assert_int_equal(cu.async_copies(), 0);
    assert_int_equal(cu.pageable_async_copies(), 0);

    assert_int_equal(cu.cuEventDestroy(e), CUDA_SUCCESS);
    assert_int_equal(cu.cuStreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemHostUnregister(reg), CUDA_SUCCESS);
    assert_int_equal(cu.cuMemFreeHost(pinned), CUDA_SUCCESS);
    free(pageable);
    free(reg);
    assert_int_equal(cu.cuMemFree(d), CUDA_SUCCESS);
}

static void test_pinned_bytes(void **state)
{
    size_t base = cu.pinned_bytes();
    cu.reset_counters();
    assert_int_equal(cu.pinned_peak(), base);
    void *a = NULL;
    assert_int_equal(cu.cuMemHostAlloc(&a, 1 << 20, 0), CUDA_SUCCESS);
    assert_int_equal(cu.pinned_bytes(), base + (1 << 20));
    unsigned char *b = malloc(2 << 20);
    assert_non_null(b);
    assert_int_equal(cu.cuMemHostRegister(b, 2 << 20, 0), CUDA_SUCCESS);
    assert_int_equal(cu.pinned_bytes(), base + (3 << 20));
    /* Overlapping registrations, unknown unregistrations. */
    assert_int_equal(cu.cuMemHostRegister(b + 4096, 100, 0), HOST_MEMORY_ALREADY_REGISTERED);
    assert_int_equal(cu.cuMemHostRegister((unsigned char *)a + 8, 100, 0),
                     HOST_MEMORY_ALREADY_REGISTERED);
    assert_int_equal(cu.cuMemHostUnregister(b + 1), HOST_MEMORY_NOT_REGISTERED);
    assert_int_equal(cu.cuMemHostUnregister(a), HOST_MEMORY_NOT_REGISTERED);
    assert_int_equal(cu.cuMemFreeHost(b), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.cuMemFreeHost(a), CUDA_SUCCESS);
    assert_int_equal(cu.pinned_bytes(), base + (2 << 20));
    assert_int_equal(cu.pinned_peak(), base + (3 << 20));
    assert_int_equal(cu.cuMemHostUnregister(b), CUDA_SUCCESS);
    assert_int_equal(cu.pinned_bytes(), base);
    assert_int_equal(cu.pinned_peak(), base + (3 << 20));
    cu.reset_counters();
    assert_int_equal(cu.pinned_peak(), base);
    free(b);
}

/* Several threads, each with its context, stream and device memory. */
struct worker_arg {
    CUcontext ctx;
    int id;
    int ok;
};

static void *copy_worker(void *p)
{
    struct worker_arg *w = p;
    enum { LEN = 4096, ROUNDS = 200 };
    w->ok = 0;
    if (cu.cuCtxPushCurrent(w->ctx) != CUDA_SUCCESS)
        return NULL;
    unsigned char *h = NULL;
    CUdeviceptr d = 0;
    CUstream s = NULL;
    CUevent e = NULL;
    if (cu.cuMemHostAlloc((void **)&h, 2 * LEN, 0) != CUDA_SUCCESS ||
        cu.cuMemAlloc(&d, LEN) != CUDA_SUCCESS || cu.cuStreamCreate(&s, 0) != CUDA_SUCCESS ||
        cu.cuEventCreate(&e, 0) != CUDA_SUCCESS)
        return NULL;
    int ok = 1;
    for (int r = 0; r < ROUNDS && ok; r++) {
        memset(h, (w->id * 31 + r) & 0xFF, LEN);
        ok &= cu.cuMemcpyHtoDAsync(d, h, LEN, s) == CUDA_SUCCESS;
        ok &= cu.cuMemcpyDtoHAsync(h + LEN, d, LEN, s) == CUDA_SUCCESS;
        ok &= cu.cuEventRecord(e, s) == CUDA_SUCCESS;
        ok &= cu.cuEventSynchronize(e) == CUDA_SUCCESS;
        ok &= memcmp(h, h + LEN, LEN) == 0;
    }
    ok &= cu.cuEventDestroy(e) == CUDA_SUCCESS;
    ok &= cu.cuStreamDestroy(s) == CUDA_SUCCESS;
    ok &= cu.cuMemFree(d) == CUDA_SUCCESS;
    ok &= cu.cuMemFreeHost(h) == CUDA_SUCCESS;
    ok &= cu.cuCtxPopCurrent(NULL) == CUDA_SUCCESS;
    w->ok = ok;
    return NULL;
}

static void test_threads(void **state)
{
    enum { T = 4 };
    pthread_t th[T];
    struct worker_arg w[T];
    for (int i = 0; i < T; i++) {
        w[i] = (struct worker_arg){.ctx = i % 2 ? g_ctx1 : g_ctx0, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, copy_worker, &w[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_true(w[i].ok);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_initialized), /* first: before any cuInit */
        cmocka_unit_test(test_devices_and_contexts),
        cmocka_unit_test_setup_teardown(test_round_trip, setup_ctx0, teardown_ctx0),
        cmocka_unit_test_setup_teardown(test_host_touch_segfaults, setup_ctx0, teardown_ctx0),
        cmocka_unit_test_setup_teardown(test_async_ordered, setup_ctx0, teardown_ctx0),
        cmocka_unit_test_setup_teardown(test_wrong_context, setup_ctx0, teardown_ctx0),
        cmocka_unit_test_setup_teardown(test_pointer_attributes, setup_ctx0, teardown_ctx0),
        cmocka_unit_test_setup_teardown(test_pageable_vs_pinned, setup_ctx0, teardown_ctx0),
        cmocka_unit_test_setup_teardown(test_pinned_bytes, setup_ctx0, teardown_ctx0),
        cmocka_unit_test_setup_teardown(test_threads, setup_ctx0, teardown_ctx0),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
