/*
 * client_backend.h - the backend table behind moonlet_client.
 *
 * A moonlet_client is a handle: a table of operations and the backend's
 * state.  Two backends fill the table: the direct client (store/client/client.c:
 * master connection, transport, optional local segment) and the DummyClient
 * (store/client/client_dummy.c over store/client/dummy_client.c: every call forwarded to
 * the RealClient of the host).  store/client/client_api.c is the only caller: it
 * checks the arguments every backend needs (NULL pointers, arrays, the
 * ProbeResume shape) once, then calls the backend; an operation therefore
 * receives arguments already checked against include/moonlet/client.h's
 * conventions and adds only its own checks (the direct backend's
 * registered-memory rule).  transport/xfer.c's backend table is the model.
 * Not installed.
 */
#ifndef MOONLET_CLIENT_BACKEND_H
#define MOONLET_CLIENT_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moonlet/client.h"

/* A backend's state; each backend completes it privately (the direct
 * client's in store/client/client.c; the DummyClient's is a moonlet_dummy). */
typedef struct moonlet_client_be moonlet_client_be;

/* batch_put_ranges / batch_get_ranges: not every range is registered, stage
 * instead (never a moonlet code). */
#define MOONLET_CLIENT_STAGE 1

typedef struct moonlet_client_ops {
    const char *name; /* "direct" or "dummy" */
    /* How the copying batches (client_copy.c) stage bytes: true, memory of
     * alloc_shared (the DummyClient's is shared with its RealClient, so the
     * bytes are copied once); false, malloc'd memory registered for the
     * call (no zeroing pass). */
    bool shared_staging;
    void (*destroy)(moonlet_client_be *b);
    int (*put)(moonlet_client_be *b, const char *key, const void *buf, size_t len,
               const moonlet_put_options *opt);
    int (*put_from)(moonlet_client_be *b, const char *key, const void *buf, size_t len,
                    const moonlet_put_options *opt);
    int (*upsert)(moonlet_client_be *b, const char *key, const void *buf, size_t len,
                  const moonlet_put_options *opt);
    int (*get)(moonlet_client_be *b, const char *key, void *buf, size_t cap, size_t *len,
               const char *tenant);
    int (*get_into)(moonlet_client_be *b, const char *key, void *buf, size_t cap, size_t *len,
                    const char *tenant);
    int (*get_alloc)(moonlet_client_be *b, const char *key, void **buf, size_t *len,
                     const char *tenant);
    int (*get_size)(moonlet_client_be *b, const char *key, uint64_t *size, const char *tenant);
    int (*batch_put_from)(moonlet_client_be *b, const char *const *keys, const void *const *bufs,
                          const size_t *lens, size_t n, const moonlet_put_options *opt,
                          int32_t *results);
    int (*batch_get_into)(moonlet_client_be *b, const char *const *keys, void *const *bufs,
                          const size_t *caps, size_t n, size_t *lens, int32_t *results,
                          const char *tenant);
    /* Optional (NULL: the copying batches always stage): moonlet_client_batch_put
     * / batch_get (client_copy.c) from and into the caller's scattered ranges
     * in place, when every range lies in registered memory; otherwise
     * MOONLET_CLIENT_STAGE and nothing done.  lens[i] (put) / caps[i] (get):
     * key i's ranges' total, as client_copy.c computed it. */
    int (*batch_put_ranges)(moonlet_client_be *b, const char *const *keys, size_t n,
                            const struct iovec *iov, const size_t *iovcnt, const size_t *lens,
                            const moonlet_put_options *opt, int32_t *results);
    int (*batch_get_ranges)(moonlet_client_be *b, const char *const *keys, size_t n,
                            const struct iovec *iov, const size_t *iovcnt, const size_t *caps,
                            const char *tenant, size_t *sizes, int32_t *results);
    int (*remove)(moonlet_client_be *b, const char *key, const char *tenant, bool force);
    int (*remove_all)(moonlet_client_be *b, uint64_t *removed, const char *tenant, bool force);
    int (*inspect_key)(moonlet_client_be *b, const char *key, const char *tenant,
                       char **json_out);
    int (*batch_replicas)(moonlet_client_be *b, const char *const *keys, size_t n,
                          const char *tenant, char **json_out);
    int (*exist_key)(moonlet_client_be *b, const char *key, bool *exists, const char *tenant);
    int (*probe_key)(moonlet_client_be *b, const char *key, bool *exists, const char *tenant);
    int (*batch_exist_key)(moonlet_client_be *b, const char *const *keys, size_t n,
                           int32_t *results, const char *tenant);
    int (*batch_probe_key)(moonlet_client_be *b, moonlet_grant_lease_policy policy,
                           const char *const *keys, size_t n, int32_t *results,
                           const char *tenant);
    /* n_boundaries = n_kda / candidate_size (0 without KDA keys). */
    int (*probe_resume)(moonlet_client_be *b, const char *const *kv_keys, size_t n_kv,
                        const char *const *kda_keys, size_t n_kda, uint64_t candidate_size,
                        const uint64_t *boundaries, size_t n_boundaries,
                        moonlet_probe_resume_result *out, int32_t *mask, const char *tenant);
    int (*register_buffer)(moonlet_client_be *b, void *base, size_t len);
    /* Optional (NULL: device memory is always staged, client_gpu.c):
     * registers device memory [base, base + len), inside the device
     * allocation [alloc, alloc + alloc_len), with the NIC, so that
     * transfers move it in place (GPUDirect RDMA); unregister_buffer
     * releases it.  0 and *how ("dma-buf", "peer memory"), or a code and
     * *how saying why not. */
    int (*register_device)(moonlet_client_be *b, void *base, size_t len, uintptr_t alloc,
                           size_t alloc_len, const char **how);
    int (*unregister_buffer)(moonlet_client_be *b, void *base);
    int (*alloc_shared)(moonlet_client_be *b, size_t len, void **out);
    int (*free_shared)(moonlet_client_be *b, void *p);
    const char *(*protocol)(const moonlet_client_be *b);
    int (*local_endpoint)(const moonlet_client_be *b, char *buf, size_t cap);
} moonlet_client_ops;

/* The staging region client_copy.c keeps for the next call: the largest
 * one a call used, up to MOONLET_CLIENT_KEEP_STAGING bytes, so a steady
 * stream of staged batches neither maps nor faults in fresh memory each
 * time.  One call at a time uses it (busy); a call that finds it busy or too
 * small takes a region of its own. */
#define MOONLET_CLIENT_KEEP_STAGING (128u << 20)
typedef struct moonlet_client_staging {
    pthread_mutex_t mu;
    void *base; /* NULL: none kept */
    size_t len;
    bool busy;
} moonlet_client_staging;

struct moonlet_client {
    const moonlet_client_ops *ops;
    moonlet_client_be *be;
    moonlet_client_staging staging;
    /* Device memory (client_gpu.c): NULL until the first device buffer;
     * gpu_staging, the bound on its pinned staging (0: the default). */
    struct moonlet_client_gpu *_Atomic gpu;
    uint64_t gpu_staging;
    struct moonlet_client_metrics *metrics; /* NULL unless config http_server (client_metrics.c) */
};

/* Gives back the kept staging region (before the backend goes). */
void moonlet_client_staging_release(moonlet_client *c);

/* The backend's ranged batches (batch_put_ranges / batch_get_ranges), with
 * the client's metrics; MOONLET_CLIENT_STAGE when it has none or cannot. */
int moonlet_client_put_ranges(moonlet_client *c, const char *const *keys, size_t n,
                              const struct iovec *iov, const size_t *iovcnt, const size_t *lens,
                              const moonlet_put_options *opt, int32_t *results);
int moonlet_client_get_ranges(moonlet_client *c, const char *const *keys, size_t n,
                              const struct iovec *iov, const size_t *iovcnt, const size_t *caps,
                              const char *tenant, size_t *sizes, int32_t *results);

/* The copying batches (client_copy.c) when a range is device memory to
 * stage: client_gpu.c's staged path, with the client's metrics. */
int moonlet_client_device_put(moonlet_client *c, const char *const *keys, size_t n,
                              const struct iovec *iov, const size_t *iovcnt,
                              const moonlet_put_options *opt, int32_t *results);
int moonlet_client_device_get(moonlet_client *c, const char *const *keys, size_t n,
                              const struct iovec *iov, const size_t *iovcnt, const char *tenant,
                              size_t *sizes, int32_t *results);

extern const moonlet_client_ops moonlet_client_direct_ops;
extern const moonlet_client_ops moonlet_client_dummy_ops;

/* A handle for backend state `be` (owned by the handle from then on; on
 * failure, INTERNAL_ERROR, the caller still owns it). */
int moonlet_client_wrap(const moonlet_client_ops *ops, moonlet_client_be *be,
                        moonlet_client **out);
/* The bound on the handle's pinned memory for device buffers (config
 * gpu_staging_size; 0: the default). */
void moonlet_client_set_gpu_staging(moonlet_client *c, uint64_t bytes);
/* Starts the HTTP endpoint cfg asks for (http_server; client_metrics.h), if
 * any; the handle owns it from then on.  0 or the endpoint's error. */
int moonlet_client_start_metrics(moonlet_client *c, const moonlet_client_config *cfg);

#endif
