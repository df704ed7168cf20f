/*
 * fakecuda.h - the counters libfakecuda.so exports besides the CUDA driver
 * calls of common/cuda_api.h (see tests/gpu/fakecuda.c for what the fake
 * driver models).  Tests resolve them with dlsym(); the names are fixed.
 */
#ifndef MOONLET_TESTS_FAKECUDA_H
#define MOONLET_TESTS_FAKECUDA_H

#include <stddef.h>
#include <stdint.h>

/* Async copies (cuMemcpyDtoHAsync_v2 / cuMemcpyHtoDAsync_v2) accepted and
 * queued on a stream, since load or the last fakecuda_reset_counters(). */
uint64_t fakecuda_async_copies(void);

/* Of those, the ones whose host side is not wholly inside one range from
 * cuMemHostAlloc or cuMemHostRegister_v2: the real driver quietly runs such
 * "pageable" copies synchronously, so moonlet's staging must not make them. */
uint64_t fakecuda_pageable_async_copies(void);

/* Async copies refused with CUDA_ERROR_INVALID_CONTEXT: no current context,
 * a current context other than the stream's, or device memory of another
 * device than the stream's. */
uint64_t fakecuda_wrong_context(void);

/* Bytes of host memory from cuMemHostAlloc plus cuMemHostRegister_v2 now,
 * and the most there has been since load or the last reset. */
size_t fakecuda_pinned_bytes(void);
size_t fakecuda_pinned_peak(void);

/* Zeroes the three copy counters and sets the pinned peak to the pinned
 * bytes now. */
void fakecuda_reset_counters(void);

#endif
