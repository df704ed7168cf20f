/*
 * cuda_api.h - the few CUDA driver API declarations moonlet uses, written
 * out here so that moonlet builds where no CUDA exists (Debian ships no CUDA
 * headers).  The values and signatures are the driver API's (cuda.h of CUDA
 * 11.x-13.x); the symbol names are the ones libcuda.so.1 exports (the _v2
 * entry points where cuda.h #defines the plain name to them).
 *
 * Only common/cuda_driver.c (which loads the driver with dlopen) and the
 * tests' fake driver (tests/gpu/fakecuda.c) include it.  Not installed.
 */
#ifndef MOONLET_CUDA_API_H
#define MOONLET_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_SUPPORTED 801

/* CUpointer_attribute */
#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12

/* CUmemorytype */
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEMORYTYPE_ARRAY 3
#define CU_MEMORYTYPE_UNIFIED 4

#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 0x1

/* The driver calls moonlet makes, as the table cuda_driver.c fills:
 * X(return-less name, symbol, parameter list). */
#define MOONLET_CUDA_CALLS(X)                                                                    \
    X(cuInit, "cuInit", (unsigned int flags))                                                    \
    X(cuDriverGetVersion, "cuDriverGetVersion", (int *version))                                  \
    X(cuGetErrorString, "cuGetErrorString", (CUresult e, const char **s))                        \
    X(cuDeviceGetCount, "cuDeviceGetCount", (int *count))                                        \
    X(cuDeviceGet, "cuDeviceGet", (CUdevice * dev, int ordinal))                                 \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext * ctx, CUdevice dev))     \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice dev))                 \
    X(cuCtxPushCurrent, "cuCtxPushCurrent_v2", (CUcontext ctx))                                  \
    X(cuCtxPopCurrent, "cuCtxPopCurrent_v2", (CUcontext * ctx))                                  \
    X(cuPointerGetAttributes, "cuPointerGetAttributes",                                          \
      (unsigned int n, int *attrs, void **data, CUdeviceptr ptr))                                \
    X(cuMemHostAlloc, "cuMemHostAlloc", (void **pp, size_t len, unsigned int flags))             \
    X(cuMemFreeHost, "cuMemFreeHost", (void *p))                                                 \
    X(cuMemHostRegister, "cuMemHostRegister_v2", (void *p, size_t len, unsigned int flags))      \
    X(cuMemHostUnregister, "cuMemHostUnregister", (void *p))                                     \
    X(cuStreamCreate, "cuStreamCreate", (CUstream * s, unsigned int flags))                      \
    X(cuStreamDestroy, "cuStreamDestroy_v2", (CUstream s))                                       \
    X(cuEventCreate, "cuEventCreate", (CUevent * e, unsigned int flags))                         \
    X(cuEventRecord, "cuEventRecord", (CUevent e, CUstream s))                                   \
    X(cuEventSynchronize, "cuEventSynchronize", (CUevent e))                                     \
    X(cuEventDestroy, "cuEventDestroy_v2", (CUevent e))                                          \
    X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2",                                                 \
      (void *dst, CUdeviceptr src, size_t len, CUstream s))                                      \
    X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2",                                                 \
      (CUdeviceptr dst, const void *src, size_t len, CUstream s))                                \
    X(cuMemcpyDtoH, "cuMemcpyDtoH_v2", (void *dst, CUdeviceptr src, size_t len))                 \
    X(cuMemcpyHtoD, "cuMemcpyHtoD_v2", (CUdeviceptr dst, const void *src, size_t len))

/* Optional calls: the client works without them (dma-buf needs CUDA 11.7+);
 * the allocation calls are for moonlet-bench and the GPU check, which make
 * device memory of their own. */
#define MOONLET_CUDA_OPTIONAL_CALLS(X)                                                           \
    X(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange",                            \
      (void *handle, CUdeviceptr ptr, size_t len, int type, unsigned long long flags))           \
    X(cuMemAlloc, "cuMemAlloc_v2", (CUdeviceptr * p, size_t len))                                \
    X(cuMemFree, "cuMemFree_v2", (CUdeviceptr p))                                                \
    X(cuMemsetD32, "cuMemsetD32_v2", (CUdeviceptr p, unsigned int v, size_t n))                  \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", (CUcontext ctx))

#endif
