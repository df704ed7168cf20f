/*
 * dummy_client.h - the DummyClient backend of moonlet_client
 * (store/client/dummy_client.c).  Its entry in the client's backend table
 * (store/client/client_dummy.c) forwards every public call of a client made by
 * moonlet_client_create_dummy() to the function of the same name here;
 * arguments and return values are those of include/moonlet/client.h,
 * already checked by store/client/client_api.c.  Not installed.
 *
 * Thread safety: every function may be called from any number of threads,
 * except create and destroy.  Locks: the DummyClient's one mutex (its
 * connection pool and buffer lists), never held across a request.
 */
#ifndef MOONLET_DUMMY_CLIENT_H
#define MOONLET_DUMMY_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moonlet/client.h"

typedef struct moonlet_dummy moonlet_dummy;

int moonlet_dummy_create(const char *socket_path, const moonlet_dummy_config *cfg,
                         moonlet_dummy **out);
void moonlet_dummy_destroy(moonlet_dummy *d);

int moonlet_dummy_put(moonlet_dummy *d, const char *key, const void *buf, size_t len,
                      const moonlet_put_options *opt);
int moonlet_dummy_upsert(moonlet_dummy *d, const char *key, const void *buf, size_t len,
                         const moonlet_put_options *opt);
int moonlet_dummy_put_from(moonlet_dummy *d, const char *key, const void *buf, size_t len,
                           const moonlet_put_options *opt);
int moonlet_dummy_get(moonlet_dummy *d, const char *key, void *buf, size_t cap, size_t *len,
                      const char *tenant);
int moonlet_dummy_get_into(moonlet_dummy *d, const char *key, void *buf, size_t cap,
                           size_t *len, const char *tenant);
int moonlet_dummy_get_alloc(moonlet_dummy *d, const char *key, void **buf, size_t *len,
                            const char *tenant);
int moonlet_dummy_get_size(moonlet_dummy *d, const char *key, uint64_t *size,
                           const char *tenant);
int moonlet_dummy_remove(moonlet_dummy *d, const char *key, const char *tenant);
int moonlet_dummy_remove_all(moonlet_dummy *d, uint64_t *removed, const char *tenant);
/* With force (sent as a trailing argument only when true). */
int moonlet_dummy_remove_ex(moonlet_dummy *d, const char *key, const char *tenant, bool force);
int moonlet_dummy_remove_all_ex(moonlet_dummy *d, uint64_t *removed, const char *tenant,
                                bool force);
int moonlet_dummy_inspect_key(moonlet_dummy *d, const char *key, const char *tenant,
                              char **json_out);
/* moonlet_client_batch_replicas through the RealClient (MOONLET_DM_BATCH_REPLICAS). */
int moonlet_dummy_batch_replicas(moonlet_dummy *d, const char *const *keys, size_t n,
                                 const char *tenant, char **json_out);
int moonlet_dummy_exist_key(moonlet_dummy *d, const char *key, bool *exists,
                            const char *tenant);
int moonlet_dummy_probe_key(moonlet_dummy *d, const char *key, bool *exists,
                            const char *tenant);
int moonlet_dummy_batch_exist_key(moonlet_dummy *d, const char *const *keys, size_t n,
                                  int32_t *results, const char *tenant);
/* ProbeResume through the RealClient (MOONLET_DM_PROBE_RESUME); n_boundaries
 * = n_kda / candidate_size.  INVALID_VERSION from a RealClient without it. */
int moonlet_dummy_probe_resume(moonlet_dummy *d, const char *const *kv, size_t n_kv,
                               const char *const *kda, size_t n_kda, uint64_t candidate_size,
                               const uint64_t *boundaries, size_t n_boundaries,
                               moonlet_probe_resume_result *out, int32_t *mask,
                               const char *tenant);
int moonlet_dummy_batch_probe_key(moonlet_dummy *d, moonlet_grant_lease_policy policy,
                                  const char *const *keys, size_t n, int32_t *results,
                                  const char *tenant);
int moonlet_dummy_batch_put_from(moonlet_dummy *d, const char *const *keys,
                                 const void *const *bufs, const size_t *lens, size_t n,
                                 const moonlet_put_options *opt, int32_t *results);
int moonlet_dummy_batch_get_into(moonlet_dummy *d, const char *const *keys, void *const *bufs,
                                 const size_t *caps, size_t n, size_t *lens, int32_t *results,
                                 const char *tenant);

int moonlet_dummy_register_buffer(moonlet_dummy *d, void *base, size_t len);
int moonlet_dummy_unregister_buffer(moonlet_dummy *d, void *base);
int moonlet_dummy_alloc_shared(moonlet_dummy *d, size_t len, void **out);
int moonlet_dummy_free_shared(moonlet_dummy *d, void *p);

/* The RealClient's transport ("tcp" / "rdma"), learnt at create. */
const char *moonlet_dummy_protocol(const moonlet_dummy *d);

#endif
