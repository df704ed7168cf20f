/*
 * client_api.c - the entry points of include/moonlet/client.h: each checks
 * its arguments once, against the header's conventions (NULL client, keys,
 * outputs and arrays; buffers of nonzero length; the shape of a ProbeResume
 * request), then calls the client's backend through its table
 * (client_backend.h): the direct client (client.c) or the DummyClient
 * (client_dummy.c).  No backend repeats these checks, and every backend
 * answers a malformed call with the same INVALID_PARAMS, before any request
 * leaves the process.  With the client's HTTP endpoint on (config
 * http_server), every put, get, existence check and removal is also counted
 * here (client_metrics.c: keys, bytes, hits, misses, latency, errors).
 * A call with a buffer in device (GPU) memory that the NIC cannot reach in
 * place takes client_gpu.c's staged path instead of the backend's call.
 *
 * Locks: none; a backend takes its own, the metrics their own.
 */
#include <stdint.h>
#include <stdlib.h>

#include "client_backend.h"
#include "client_gpu.h"
#include "client_metrics.h"

#define BAD MOONLET_ERR_INVALID_PARAMS

int moonlet_client_wrap(const moonlet_client_ops *ops, moonlet_client_be *be,
                        moonlet_client **out)
{
    moonlet_client *c = malloc(sizeof(*c));
    if (!c)
        return MOONLET_ERR_INTERNAL_ERROR;
    c->ops = ops;
    c->be = be;
    c->staging = (moonlet_client_staging){.base = NULL};
    pthread_mutex_init(&c->staging.mu, NULL);
    c->metrics = NULL;
    atomic_init(&c->gpu, NULL);
    c->gpu_staging = 0;
    *out = c;
    return MOONLET_OK;
}

void moonlet_client_set_gpu_staging(moonlet_client *c, uint64_t bytes)
{
    c->gpu_staging = bytes;
}

int moonlet_client_start_metrics(moonlet_client *c, const moonlet_client_config *cfg)
{
    return moonlet_client_metrics_start(cfg, &c->metrics);
}

void moonlet_client_destroy(moonlet_client *c)
{
    if (!c)
        return;
    moonlet_client_staging_release(c);
    moonlet_client_gpu_destroy(c);
    pthread_mutex_destroy(&c->staging.mu);
    moonlet_client_metrics_stop(c->metrics);
    c->ops->destroy(c->be);
    free(c);
}

int moonlet_client_http_port(const moonlet_client *c)
{
    return c ? moonlet_client_metrics_port(c->metrics) : 0;
}

/* A single-key call's outcome and latency (nothing without metrics). */
static int counted(moonlet_client *c, moonlet_cm_op op, const char *tenant, uint64_t t0, int rc,
                   uint64_t bytes, int found)
{
    if (c->metrics) {
        moonlet_cm_key(c->metrics, op, tenant, rc, bytes, found);
        moonlet_cm_call(c->metrics, op, t0);
    }
    return rc;
}

/* A batch's: each key's result (bytes: lens[i], or sizes[i] of a put). */
static int counted_batch(moonlet_client *c, moonlet_cm_op op, const char *tenant, uint64_t t0,
                         int rc, size_t n, const int32_t *results, const size_t *bytes)
{
    if (c->metrics) {
        for (size_t i = 0; i < n; i++)
            moonlet_cm_key(c->metrics, op, tenant, results[i], results[i] ? 0 : bytes[i], 1);
        moonlet_cm_call(c->metrics, op, t0);
    }
    return rc;
}

void moonlet_free(void *p)
{
    free(p);
}

/* Every key of a batch is a string (its length is the master's to check). */
static bool keys_ok(const char *const *keys, size_t n)
{
    if (n && !keys)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!keys[i])
            return false;
    return true;
}

/* ---- device memory (client_gpu.c) ------------------------------------------------- */

/* Whether one buffer is device memory to stage (false at once for a client
 * that never registered device memory). */
static bool on_device(moonlet_client *c, const void *buf, size_t len)
{
    return moonlet_client_gpu_bufs(c, &buf, &len, 1);
}

static int device_put1(moonlet_client *c, const char *key, const void *buf, size_t len,
                       const moonlet_put_options *opt)
{
    struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
    size_t one = 1;
    int32_t res;
    return moonlet_client_gpu_put(c, &key, 1, &v, &one, opt, &res);
}

static int device_get1(moonlet_client *c, const char *key, void *buf, size_t cap,
                       const char *tenant, size_t *len)
{
    struct iovec v = {.iov_base = buf, .iov_len = cap};
    size_t one = 1;
    int32_t res;
    return moonlet_client_gpu_get(c, &key, 1, &v, &one, tenant, len, &res);
}

/* Each key's bytes in its ranges (for the metrics); NULL when out of memory. */
static size_t *range_lens(size_t n, const struct iovec *iov, const size_t *iovcnt)
{
    size_t *lens = calloc(n ? n : 1, sizeof(*lens));
    for (size_t i = 0, at = 0; lens && iov && i < n; i++)
        for (size_t p = 0; p < iovcnt[i]; p++)
            lens[i] += iov[at++].iov_len;
    return lens;
}

int moonlet_client_device_put(moonlet_client *c, const char *const *keys, size_t n,
                              const struct iovec *iov, const size_t *iovcnt,
                              const moonlet_put_options *opt, int32_t *results)
{
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = moonlet_client_gpu_put(c, keys, n, iov, iovcnt, opt, results);
    size_t *lens = c->metrics && results ? range_lens(n, iov, iovcnt) : NULL;
    if (lens)
        counted_batch(c, MOONLET_CM_PUT, opt ? opt->tenant : NULL, t0, rc, n, results, lens);
    free(lens);
    return rc;
}

int moonlet_client_device_get(moonlet_client *c, const char *const *keys, size_t n,
                              const struct iovec *iov, const size_t *iovcnt, const char *tenant,
                              size_t *sizes, int32_t *results)
{
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = moonlet_client_gpu_get(c, keys, n, iov, iovcnt, tenant, sizes, results);
    if (results && sizes)
        counted_batch(c, MOONLET_CM_GET, tenant, t0, rc, n, results, sizes);
    return rc;
}

/* A zero-copy batch as ranges, one per key, for the staged path. */
static int device_batch(moonlet_client *c, const char *const *keys, size_t n,
                        const void *const *bufs, const size_t *lens,
                        const moonlet_put_options *opt, const char *tenant, size_t *sizes,
                        int32_t *results)
{
    struct iovec *iov = calloc(n ? n : 1, sizeof(*iov));
    size_t *ones = calloc(n ? n : 1, sizeof(*ones));
    int rc = MOONLET_ERR_INTERNAL_ERROR;
    if (iov && ones) {
        for (size_t i = 0; i < n; i++) {
            iov[i] = (struct iovec){.iov_base = (void *)bufs[i], .iov_len = lens[i]};
            ones[i] = 1;
        }
        rc = sizes ? moonlet_client_device_get(c, keys, n, iov, ones, tenant, sizes, results)
                   : moonlet_client_device_put(c, keys, n, iov, ones, opt, results);
    } else {
        for (size_t i = 0; i < n; i++)
            results[i] = rc;
    }
    free(iov);
    free(ones);
    return rc;
}

/* ---- objects ---------------------------------------------------------------------- */

/* put, put_from and upsert: checked and counted; a buffer in device memory
 * to stage goes to `staged` (client_gpu.c), any other to the backend's `op`. */
static int put_one(moonlet_client *c, const char *key, const void *buf, size_t len,
                   const moonlet_put_options *opt,
                   int (*staged)(moonlet_client *, const char *, const void *, size_t,
                                 const moonlet_put_options *),
                   int (*op)(moonlet_client_be *, const char *, const void *, size_t,
                             const moonlet_put_options *))
{
    if (!key || (!buf && len))
        return BAD;
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = on_device(c, buf, len) ? staged(c, key, buf, len, opt) : op(c->be, key, buf, len, opt);
    return counted(c, MOONLET_CM_PUT, opt ? opt->tenant : NULL, t0, rc, rc ? 0 : len, 1);
}

/* get and get_into, likewise (the staged path: device_get1). */
static int get_one(moonlet_client *c, const char *key, void *buf, size_t cap, const char *tenant,
                   size_t *len,
                   int (*op)(moonlet_client_be *, const char *, void *, size_t, size_t *,
                             const char *))
{
    if (!key || !len || (!buf && cap))
        return BAD;
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = on_device(c, buf, cap) ? device_get1(c, key, buf, cap, tenant, len)
                                    : op(c->be, key, buf, cap, len, tenant);
    return counted(c, MOONLET_CM_GET, tenant, t0, rc, rc ? 0 : *len, 1);
}

int moonlet_client_put(moonlet_client *c, const char *key, const void *buf, size_t len,
                       const moonlet_put_options *opt)
{
    return c ? put_one(c, key, buf, len, opt, device_put1, c->ops->put) : BAD;
}

int moonlet_client_put_from(moonlet_client *c, const char *key, const void *buf, size_t len,
                            const moonlet_put_options *opt)
{
    return c ? put_one(c, key, buf, len, opt, device_put1, c->ops->put_from) : BAD;
}

int moonlet_client_upsert(moonlet_client *c, const char *key, const void *buf, size_t len,
                          const moonlet_put_options *opt)
{
    return c ? put_one(c, key, buf, len, opt, moonlet_client_gpu_upsert, c->ops->upsert) : BAD;
}

int moonlet_client_get(moonlet_client *c, const char *key, void *buf, size_t cap, const char *tenant,
                       size_t *len)
{
    return c ? get_one(c, key, buf, cap, tenant, len, c->ops->get) : BAD;
}

int moonlet_client_get_into(moonlet_client *c, const char *key, void *buf, size_t cap,
                            const char *tenant, size_t *len)
{
    return c ? get_one(c, key, buf, cap, tenant, len, c->ops->get_into) : BAD;
}

int moonlet_client_get_alloc(moonlet_client *c, const char *key, const char *tenant, void **buf,
                             size_t *len)
{
    if (buf)
        *buf = NULL;
    if (!c || !key || !buf || !len)
        return BAD;
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = c->ops->get_alloc(c->be, key, buf, len, tenant);
    return counted(c, MOONLET_CM_GET, tenant, t0, rc, rc ? 0 : *len, 1);
}

int moonlet_client_get_size(moonlet_client *c, const char *key, const char *tenant,
                            uint64_t *size)
{
    if (!c || !key || !size)
        return BAD;
    return c->ops->get_size(c->be, key, size, tenant);
}

/* remove and remove_force: checked and counted. */
static int remove_one(moonlet_client *c, const char *key, const char *tenant, bool force)
{
    if (!c || !key)
        return BAD;
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = c->ops->remove(c->be, key, tenant, force);
    return counted(c, MOONLET_CM_REMOVE, tenant, t0, rc, 0, 1);
}

int moonlet_client_remove(moonlet_client *c, const char *key, const char *tenant)
{
    return remove_one(c, key, tenant, false);
}

int moonlet_client_remove_force(moonlet_client *c, const char *key, const char *tenant)
{
    return remove_one(c, key, tenant, true);
}

int moonlet_client_remove_all(moonlet_client *c, const char *tenant, uint64_t *removed)
{
    if (!c)
        return BAD;
    return c->ops->remove_all(c->be, removed, tenant, false);
}

int moonlet_client_remove_all_force(moonlet_client *c, const char *tenant, uint64_t *removed)
{
    if (!c)
        return BAD;
    return c->ops->remove_all(c->be, removed, tenant, true);
}

int moonlet_client_inspect_key(moonlet_client *c, const char *key, const char *tenant,
                               char **json_out)
{
    if (json_out)
        *json_out = NULL;
    if (!c || !key || !json_out)
        return BAD;
    return c->ops->inspect_key(c->be, key, tenant, json_out);
}

int moonlet_client_batch_replicas(moonlet_client *c, const char *const *keys, size_t n,
                                  const char *tenant, char **json_out)
{
    if (json_out)
        *json_out = NULL;
    if (!c || !json_out || (n && !keys_ok(keys, n)))
        return BAD;
    return c->ops->batch_replicas(c->be, keys, n, tenant, json_out);
}

/* ---- existence and probes ---------------------------------------------------------- */

int moonlet_client_exist_key(moonlet_client *c, const char *key, const char *tenant,
                             bool *exists)
{
    if (!c || !key || !exists)
        return BAD;
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = c->ops->exist_key(c->be, key, exists, tenant);
    return counted(c, MOONLET_CM_EXIST, tenant, t0, rc, 0, !rc && *exists);
}

int moonlet_client_probe_key(moonlet_client *c, const char *key, const char *tenant,
                             bool *exists)
{
    if (!c || !key || !exists)
        return BAD;
    return c->ops->probe_key(c->be, key, exists, tenant);
}

int moonlet_client_batch_exist_key(moonlet_client *c, const char *const *keys, size_t n,
                                   const char *tenant, int32_t *results)
{
    if (!c || (n && (!results || !keys_ok(keys, n))))
        return BAD;
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = c->ops->batch_exist_key(c->be, keys, n, results, tenant);
    if (c->metrics) { /* results: 1 there, 0 not, or the key's error */
        for (size_t i = 0; i < n; i++)
            moonlet_cm_key(c->metrics, MOONLET_CM_EXIST, tenant,
                           rc ? rc : results[i] < 0 ? results[i] : 0, 0, !rc && results[i] > 0);
        moonlet_cm_call(c->metrics, MOONLET_CM_EXIST, t0);
    }
    return rc;
}

int moonlet_client_batch_probe_key(moonlet_client *c, const char *const *keys, size_t n,
                                   moonlet_grant_lease_policy policy, const char *tenant,
                                   int32_t *results)
{
    if (!c || (n && (!results || !keys_ok(keys, n))))
        return BAD;
    return c->ops->batch_probe_key(c->be, policy, keys, n, results, tenant);
}

int moonlet_client_probe_resume(moonlet_client *c, const char *const *kv_keys, size_t n_kv,
                                const char *const *kda_keys, size_t n_kda,
                                uint64_t candidate_size, const uint64_t *boundaries,
                                const char *tenant, moonlet_probe_resume_result *out,
                                int32_t *mask)
{
    if (out)
        *out = (moonlet_probe_resume_result){0, -1};
    if (!c || !out || !keys_ok(kv_keys, n_kv) ||
        (n_kda && (!mask || !boundaries || !candidate_size || n_kda % candidate_size ||
                   !keys_ok(kda_keys, n_kda))))
        return BAD;
    size_t nb = n_kda ? n_kda / (size_t)candidate_size : 0;
    return c->ops->probe_resume(c->be, kv_keys, n_kv, kda_keys, n_kda, candidate_size,
                                boundaries, nb, out, mask, tenant);
}

/* ---- zero-copy buffers and batches -------------------------------------------------- */

int moonlet_client_register_buffer(moonlet_client *c, void *base, size_t len)
{
    if (!c || !base || !len || (uintptr_t)base > UINTPTR_MAX - len)
        return BAD;
    int rc = moonlet_client_gpu_register(c, base, len);
    return rc == MOONLET_CLIENT_GPU_HOST ? c->ops->register_buffer(c->be, base, len) : rc;
}

int moonlet_client_unregister_buffer(moonlet_client *c, void *base)
{
    if (!c || !base)
        return BAD;
    int rc = moonlet_client_gpu_unregister(c, base);
    return rc == MOONLET_CLIENT_GPU_HOST ? c->ops->unregister_buffer(c->be, base) : rc;
}

int moonlet_client_alloc_shared(moonlet_client *c, size_t len, void **out)
{
    if (!c || !len || !out)
        return BAD;
    return c->ops->alloc_shared(c->be, len, out);
}

int moonlet_client_free_shared(moonlet_client *c, void *p)
{
    if (!c || !p)
        return BAD;
    return c->ops->free_shared(c->be, p);
}

int moonlet_client_batch_put_from(moonlet_client *c, const char *const *keys,
                                  size_t n, const void *const *bufs, const size_t *lens,
                                  const moonlet_put_options *opt, int32_t *results)
{
    if (!c || (n && (!bufs || !lens || !results || !keys_ok(keys, n))))
        return BAD;
    if (moonlet_client_gpu_bufs(c, bufs, lens, n))
        return device_batch(c, keys, n, bufs, lens, opt, NULL, NULL, results);
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = c->ops->batch_put_from(c->be, keys, bufs, lens, n, opt, results);
    return counted_batch(c, MOONLET_CM_PUT, opt ? opt->tenant : NULL, t0, rc, n, results, lens);
}

int moonlet_client_batch_get_into(moonlet_client *c, const char *const *keys,
                                  size_t n, void *const *bufs, const size_t *caps,
                                  const char *tenant, size_t *lens, int32_t *results)
{
    if (!c || (n && (!bufs || !caps || !lens || !results || !keys_ok(keys, n))))
        return BAD;
    if (moonlet_client_gpu_bufs(c, (const void *const *)bufs, caps, n))
        return device_batch(c, keys, n, (const void *const *)bufs, caps, NULL, tenant, lens,
                            results);
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = c->ops->batch_get_into(c->be, keys, bufs, caps, n, lens, results, tenant);
    return counted_batch(c, MOONLET_CM_GET, tenant, t0, rc, n, results, lens);
}

/* The ranged batches in place (client_copy.c), counted as the batches they
 * stand for; MOONLET_CLIENT_STAGE (nothing done, nothing counted) when the
 * backend cannot. */
int moonlet_client_put_ranges(moonlet_client *c, const char *const *keys, size_t n,
                              const struct iovec *iov, const size_t *iovcnt, const size_t *lens,
                              const moonlet_put_options *opt, int32_t *results)
{
    if (!c->ops->batch_put_ranges)
        return MOONLET_CLIENT_STAGE;
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = c->ops->batch_put_ranges(c->be, keys, n, iov, iovcnt, lens, opt, results);
    if (rc == MOONLET_CLIENT_STAGE)
        return rc;
    return counted_batch(c, MOONLET_CM_PUT, opt ? opt->tenant : NULL, t0, rc, n, results, lens);
}

int moonlet_client_get_ranges(moonlet_client *c, const char *const *keys, size_t n,
                              const struct iovec *iov, const size_t *iovcnt, const size_t *caps,
                              const char *tenant, size_t *sizes, int32_t *results)
{
    if (!c->ops->batch_get_ranges)
        return MOONLET_CLIENT_STAGE;
    uint64_t t0 = moonlet_cm_begin(c->metrics);
    int rc = c->ops->batch_get_ranges(c->be, keys, n, iov, iovcnt, caps, tenant, sizes, results);
    if (rc == MOONLET_CLIENT_STAGE)
        return rc;
    return counted_batch(c, MOONLET_CM_GET, tenant, t0, rc, n, results, sizes);
}

/* ---- accessors ------------------------------------------------------------------------ */

const char *moonlet_client_protocol(const moonlet_client *c)
{
    return c ? c->ops->protocol(c->be) : "none";
}

int moonlet_client_local_endpoint(const moonlet_client *c, char *buf, size_t cap)
{
    if (!c || !buf)
        return BAD;
    return c->ops->local_endpoint(c->be, buf, cap);
}
