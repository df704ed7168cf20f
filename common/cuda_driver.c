/*
 * cuda_driver.c - loads the CUDA driver at run time (cuda_driver.h) and
 * answers "is this device memory?" from its pointer attributes.
 *
 * Locks: none; pthread_once guards the one load, and the table is never
 * written after it.
 */
#include "cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "moonlet/error.h"

#define MOD "cuda"

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static moonlet_cuda cuda_table;
static const moonlet_cuda *cuda_ready; /* written once, under cuda_once */

static void cuda_load(void)
{
    const char *lib = getenv("MOONLET_CUDA_DRIVER");
    if (lib && strcmp(lib, "none") == 0) {
        ML_INFO(MOD, "no CUDA driver (MOONLET_CUDA_DRIVER=none): host memory only");
        return;
    }
    if (!lib || !*lib)
        lib = "libcuda.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        ML_INFO(MOD, "no CUDA driver (%s): host memory only", dlerror());
        return;
    }
    moonlet_cuda *cu = &cuda_table;
    const char *missing = NULL;
#define MOONLET_CUDA_REQUIRED(name, sym, params)                                                 \
    if (!(*(void **)&cu->name = dlsym(h, sym)) && !missing)                                      \
        missing = sym;
#define MOONLET_CUDA_OPTIONAL(name, sym, params) *(void **)&cu->name = dlsym(h, sym);
    MOONLET_CUDA_CALLS(MOONLET_CUDA_REQUIRED)
    MOONLET_CUDA_OPTIONAL_CALLS(MOONLET_CUDA_OPTIONAL)
#undef MOONLET_CUDA_REQUIRED
#undef MOONLET_CUDA_OPTIONAL
    if (missing) {
        ML_WARN(MOD, "the CUDA driver %s lacks %s: host memory only", lib, missing);
        dlclose(h);
        return;
    }
    CUresult r = cu->cuInit(0);
    if (r != CUDA_SUCCESS) {
        /* no device, or a driver that does not match the kernel module */
        ML_INFO(MOD, "the CUDA driver %s did not start (cuInit: %s): host memory only", lib,
                moonlet_cuda_strerror(cu, r));
        dlclose(h);
        return;
    }
    cu->cuDriverGetVersion(&cu->version);
    if (cu->cuDeviceGetCount(&cu->devices) != CUDA_SUCCESS)
        cu->devices = 0;
    cu->lib = lib;
    ML_INFO(MOD, "CUDA driver %s, version %d.%d, %d device(s)", lib, cu->version / 1000,
            cu->version % 1000 / 10, cu->devices);
    __atomic_store_n(&cuda_ready, cu, __ATOMIC_RELEASE); /* loaded for the life of the process */
}

const moonlet_cuda *moonlet_cuda_get(void)
{
    pthread_once(&cuda_once, cuda_load);
    return cuda_ready;
}

const moonlet_cuda *moonlet_cuda_loaded(void)
{
    /* cuda_ready is written before pthread_once returns to anyone; a reader
     * that races the first load sees NULL, which is "not loaded yet". */
    return __atomic_load_n(&cuda_ready, __ATOMIC_ACQUIRE);
}

const char *moonlet_cuda_strerror(const moonlet_cuda *cu, CUresult r)
{
    const char *s = NULL;
    if (cu && cu->cuGetErrorString && cu->cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "CUDA error";
}

int moonlet_cuda_classify(const void *p, size_t len, moonlet_cuda_range *out)
{
    const moonlet_cuda *cu = moonlet_cuda_get();
    if (!cu || !p)
        return 0;
    unsigned int type = 0;
    int ordinal = -1, managed = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    int attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                   CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                   CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    void *data[] = {&type, &ordinal, &managed, &start, &size};
    if (cu->cuPointerGetAttributes(5, attrs, data, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return 0; /* not an address the driver knows */
    if (type != CU_MEMORYTYPE_DEVICE || managed)
        return 0; /* host, or memory the host can touch too */
    uintptr_t a = (uintptr_t)p;
    if (a < start || a - start > size || len > size - (a - start))
        return MOONLET_ERR_INVALID_PARAMS;
    if (out)
        *out = (moonlet_cuda_range){.device = ordinal, .base = (uintptr_t)start, .size = size};
    return 1;
}

int moonlet_cuda_copy_to(void *dst, const void *src, size_t n)
{
    moonlet_cuda_range r;
    int kind = n && moonlet_cuda_loaded() ? moonlet_cuda_classify(dst, n, &r) : 0;
    if (kind <= 0) {
        if (kind == 0 && n)
            memcpy(dst, src, n);
        return kind;
    }
    const moonlet_cuda *cu = moonlet_cuda_loaded();
    CUdevice dev;
    CUcontext ctx, popped;
    CUresult e = cu->cuDeviceGet(&dev, r.device);
    if (e == CUDA_SUCCESS && (e = cu->cuDevicePrimaryCtxRetain(&ctx, dev)) == CUDA_SUCCESS) {
        if ((e = cu->cuCtxPushCurrent(ctx)) == CUDA_SUCCESS) {
            e = cu->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, n);
            cu->cuCtxPopCurrent(&popped);
        }
        cu->cuDevicePrimaryCtxRelease(dev);
    }
    if (e == CUDA_SUCCESS)
        return MOONLET_OK;
    ML_ERR(MOD, "copy of %zu bytes to device %d at %p: %s", n, r.device, dst,
           moonlet_cuda_strerror(cu, e));
    return MOONLET_ERR_INTERNAL_ERROR;
}
