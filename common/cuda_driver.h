/*
 * cuda_driver.h - the CUDA driver, loaded at run time: moonlet builds and
 * runs where no CUDA exists, and uses the driver of the machine it runs on
 * when there is one.
 *
 * The library is $MOONLET_CUDA_DRIVER when set ("none": never load one;
 * tests name the fake driver, tests/gpu/fakecuda.c), else libcuda.so.1.  It
 * is loaded, and cuInit(0) called, the first time anything asks
 * (moonlet_cuda_get): a process that never hands moonlet a buffer never
 * loads it.  Without a driver every range is host memory, and nothing else
 * changes.
 *
 * Locks: none after the first call (pthread_once); the table is read-only.
 */
#ifndef MOONLET_CUDA_DRIVER_H
#define MOONLET_CUDA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_api.h"

#define MOONLET_CUDA_FN(name, sym, params) CUresult(*name) params;
typedef struct moonlet_cuda {
    MOONLET_CUDA_CALLS(MOONLET_CUDA_FN)
    MOONLET_CUDA_OPTIONAL_CALLS(MOONLET_CUDA_FN) /* NULL when the driver lacks one */
    int version;     /* cuDriverGetVersion: 12040 is 12.4 */
    int devices;     /* cuDeviceGetCount */
    const char *lib; /* the library loaded */
} moonlet_cuda;
#undef MOONLET_CUDA_FN

/* The process's driver, loading it on the first call (one INFO line saying
 * which, or why none); NULL when there is none, it lacks a required call,
 * cuInit fails, or MOONLET_CUDA_DRIVER=none.  Thread safe. */
const moonlet_cuda *moonlet_cuda_get(void);

/* The driver when it is already loaded, else NULL; never loads it. */
const moonlet_cuda *moonlet_cuda_loaded(void);

/* The driver's name for a result ("CUDA_ERROR_INVALID_VALUE"), or "CUDA error". */
const char *moonlet_cuda_strerror(const moonlet_cuda *cu, CUresult r);

/* Where a range of memory lives. */
typedef struct moonlet_cuda_range {
    int device;     /* ordinal of the device that holds it */
    uintptr_t base; /* its allocation: [base, base + size) */
    size_t size;
} moonlet_cuda_range;

/* Whether [p, p + len) is device memory, by the driver's pointer attributes:
 * 1 and *out filled when it lies inside one device allocation; 0 when it is
 * not device memory (host memory, managed memory the host can touch, an
 * address the driver does not know, or no driver); MOONLET_ERR_INVALID_PARAMS
 * when it starts in a device allocation and runs past its end.  Loads the
 * driver (moonlet_cuda_get).  Thread safe. */
int moonlet_cuda_classify(const void *p, size_t len, moonlet_cuda_range *out);

/* Copies n bytes from host memory src to dst, which may be device memory
 * (a synchronous copy in the primary context of its device) or host memory
 * (memcpy).  Never loads the driver: with none loaded dst is host memory.
 * 0, INVALID_PARAMS (dst runs past its device allocation) or
 * INTERNAL_ERROR (the driver failed; logged).  For the Python binding's
 * ranged reads; the client's own paths use their streams (client_gpu.c). */
int moonlet_cuda_copy_to(void *dst, const void *src, size_t n);

#endif
