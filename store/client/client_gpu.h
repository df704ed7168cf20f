/*
 * client_gpu.h - device (GPU) memory in a moonlet_client's calls
 * (client_gpu.c): which registered buffers are device memory, and the
 * staged path that moves their bytes through pinned host memory.
 *
 * client_api.c asks here before it calls the backend: a call none of whose
 * buffers is staged device memory goes on exactly as before (one atomic
 * load when this client never registered device memory).  Not installed.
 */
#ifndef MOONLET_CLIENT_GPU_H
#define MOONLET_CLIENT_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "moonlet/client.h"

/* Default bound on a client's pinned staging memory (config gpu_staging_size). */
#define MOONLET_GPU_STAGING_DEFAULT ((uint64_t)128 << 20)
#define MOONLET_GPU_STAGING_MIN ((uint64_t)2 << 20)

typedef struct moonlet_client_gpu moonlet_client_gpu;

/* register_buffer of [base, base + len): 0 when it is device memory and now
 * registered (in place through GPUDirect RDMA, or for the staged path);
 * MOONLET_CLIENT_GPU_HOST when it is not device memory (the caller
 * registers it as host memory); INVALID_PARAMS for a range that runs past
 * its device allocation or is registered already; the driver's failures as
 * INTERNAL_ERROR. */
#define MOONLET_CLIENT_GPU_HOST 1
int moonlet_client_gpu_register(moonlet_client *c, void *base, size_t len);

/* unregister_buffer: 0 when base was registered device memory (now
 * forgotten), MOONLET_CLIENT_GPU_HOST when it was not. */
int moonlet_client_gpu_unregister(moonlet_client *c, void *base);

/* Whether the call must take the staged path: some nonempty range of it
 * lies in device memory that is not registered in place.  Cheap (false at
 * once) for a client that never registered device memory. */
bool moonlet_client_gpu_ranges(moonlet_client *c, const struct iovec *iov, size_t niov);
bool moonlet_client_gpu_bufs(moonlet_client *c, const void *const *bufs, const size_t *lens,
                             size_t n);

/* The staged batches: as moonlet_client_batch_put / moonlet_client_batch_get
 * (the same arguments and results, checked by the caller), with any range
 * in host or device memory.  Device bytes move by asynchronous copies on
 * each device's stream into pinned host memory, chunk by chunk, copy and
 * network overlapped; a get's bytes reach device memory only after the
 * backend verified them on the host. */
int moonlet_client_gpu_put(moonlet_client *c, const char *const *keys, size_t n,
                           const struct iovec *iov, const size_t *iovcnt,
                           const moonlet_put_options *opt, int32_t *results);
int moonlet_client_gpu_get(moonlet_client *c, const char *const *keys, size_t n,
                           const struct iovec *iov, const size_t *iovcnt, const char *tenant,
                           size_t *sizes, int32_t *results);

/* upsert from device memory: the bytes copied to host memory first. */
int moonlet_client_gpu_upsert(moonlet_client *c, const char *key, const void *buf, size_t len,
                              const moonlet_put_options *opt);

/* How the client's device memory is served, for tests and logs. */
typedef struct moonlet_client_gpu_stats {
    uint32_t buffers;       /* device buffers registered */
    uint32_t in_place;      /* of which through GPUDirect RDMA */
    uint64_t staged_calls;  /* calls that took the staged path */
    uint64_t staged_bytes;  /* bytes they moved through pinned memory */
    size_t pinned_bytes;    /* pinned staging memory held now (<= the bound) */
    size_t pinned_bound;
} moonlet_client_gpu_stats;
void moonlet_client_gpu_get_stats(moonlet_client *c, moonlet_client_gpu_stats *out);

/* Releases every device resource of the client (before the backend goes). */
void moonlet_client_gpu_destroy(moonlet_client *c);

#endif
