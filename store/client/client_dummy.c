/*
 * client_dummy.c - the DummyClient backend of moonlet_client: the backend
 * table (client_backend.h) over store/client/dummy_client.c, which forwards each
 * call to the RealClient of the host, and moonlet_client_create_dummy().
 * Arguments arrive checked by client_api.c.
 *
 * Locks: none here; dummy_client.c takes its own.
 */
#include <stddef.h>
#include <string.h>

#include "client_backend.h"
#include "dummy_client.h"

static moonlet_dummy *D(moonlet_client_be *b)
{
    return (moonlet_dummy *)(void *)b;
}

static void dm_destroy(moonlet_client_be *b)
{
    moonlet_dummy_destroy(D(b));
}

static int dm_put(moonlet_client_be *b, const char *key, const void *buf, size_t len,
                  const moonlet_put_options *opt)
{
    return moonlet_dummy_put(D(b), key, buf, len, opt);
}

static int dm_put_from(moonlet_client_be *b, const char *key, const void *buf, size_t len,
                       const moonlet_put_options *opt)
{
    return moonlet_dummy_put_from(D(b), key, buf, len, opt);
}

static int dm_upsert(moonlet_client_be *b, const char *key, const void *buf, size_t len,
                     const moonlet_put_options *opt)
{
    return moonlet_dummy_upsert(D(b), key, buf, len, opt);
}

static int dm_get(moonlet_client_be *b, const char *key, void *buf, size_t cap, size_t *len,
                  const char *tenant)
{
    return moonlet_dummy_get(D(b), key, buf, cap, len, tenant);
}

static int dm_get_into(moonlet_client_be *b, const char *key, void *buf, size_t cap,
                       size_t *len, const char *tenant)
{
    return moonlet_dummy_get_into(D(b), key, buf, cap, len, tenant);
}

static int dm_get_alloc(moonlet_client_be *b, const char *key, void **buf, size_t *len,
                        const char *tenant)
{
    return moonlet_dummy_get_alloc(D(b), key, buf, len, tenant);
}

static int dm_get_size(moonlet_client_be *b, const char *key, uint64_t *size,
                       const char *tenant)
{
    return moonlet_dummy_get_size(D(b), key, size, tenant);
}

static int dm_batch_put_from(moonlet_client_be *b, const char *const *keys,
                             const void *const *bufs, const size_t *lens, size_t n,
                             const moonlet_put_options *opt, int32_t *results)
{
    return moonlet_dummy_batch_put_from(D(b), keys, bufs, lens, n, opt, results);
}

static int dm_batch_get_into(moonlet_client_be *b, const char *const *keys, void *const *bufs,
                             const size_t *caps, size_t n, size_t *lens, int32_t *results,
                             const char *tenant)
{
    return moonlet_dummy_batch_get_into(D(b), keys, bufs, caps, n, lens, results, tenant);
}

static int dm_remove(moonlet_client_be *b, const char *key, const char *tenant, bool force)
{
    /* Without force the request keeps its old shape (an older RealClient
     * reads it). */
    return force ? moonlet_dummy_remove_ex(D(b), key, tenant, true)
                 : moonlet_dummy_remove(D(b), key, tenant);
}

static int dm_remove_all(moonlet_client_be *b, uint64_t *removed, const char *tenant,
                         bool force)
{
    return force ? moonlet_dummy_remove_all_ex(D(b), removed, tenant, true)
                 : moonlet_dummy_remove_all(D(b), removed, tenant);
}

static int dm_inspect_key(moonlet_client_be *b, const char *key, const char *tenant,
                          char **json_out)
{
    return moonlet_dummy_inspect_key(D(b), key, tenant, json_out);
}

static int dm_batch_replicas(moonlet_client_be *b, const char *const *keys, size_t n,
                             const char *tenant, char **json_out)
{
    return moonlet_dummy_batch_replicas(D(b), keys, n, tenant, json_out);
}

static int dm_exist_key(moonlet_client_be *b, const char *key, bool *exists,
                        const char *tenant)
{
    return moonlet_dummy_exist_key(D(b), key, exists, tenant);
}

static int dm_probe_key(moonlet_client_be *b, const char *key, bool *exists,
                        const char *tenant)
{
    return moonlet_dummy_probe_key(D(b), key, exists, tenant);
}

static int dm_batch_exist_key(moonlet_client_be *b, const char *const *keys, size_t n,
                              int32_t *results, const char *tenant)
{
    return moonlet_dummy_batch_exist_key(D(b), keys, n, results, tenant);
}

static int dm_batch_probe_key(moonlet_client_be *b, moonlet_grant_lease_policy policy,
                              const char *const *keys, size_t n, int32_t *results,
                              const char *tenant)
{
    return moonlet_dummy_batch_probe_key(D(b), policy, keys, n, results, tenant);
}

static int dm_probe_resume(moonlet_client_be *b, const char *const *kv_keys, size_t n_kv,
                           const char *const *kda_keys, size_t n_kda, uint64_t candidate_size,
                           const uint64_t *boundaries, size_t n_boundaries,
                           moonlet_probe_resume_result *out, int32_t *mask, const char *tenant)
{
    return moonlet_dummy_probe_resume(D(b), kv_keys, n_kv, kda_keys, n_kda, candidate_size,
                                      boundaries, n_boundaries, out, mask, tenant);
}

static int dm_register_buffer(moonlet_client_be *b, void *base, size_t len)
{
    return moonlet_dummy_register_buffer(D(b), base, len);
}

static int dm_unregister_buffer(moonlet_client_be *b, void *base)
{
    return moonlet_dummy_unregister_buffer(D(b), base);
}

static int dm_alloc_shared(moonlet_client_be *b, size_t len, void **out)
{
    return moonlet_dummy_alloc_shared(D(b), len, out);
}

static int dm_free_shared(moonlet_client_be *b, void *p)
{
    return moonlet_dummy_free_shared(D(b), p);
}

static const char *dm_protocol(const moonlet_client_be *b)
{
    return moonlet_dummy_protocol((const moonlet_dummy *)(const void *)b);
}

/* A DummyClient serves no segment of its own. */
static int dm_local_endpoint(const moonlet_client_be *b, char *buf, size_t cap)
{
    return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
}

const moonlet_client_ops moonlet_client_dummy_ops = {
    .name = "dummy",
    .shared_staging = true,
    .destroy = dm_destroy,
    .put = dm_put,
    .put_from = dm_put_from,
    .upsert = dm_upsert,
    .get = dm_get,
    .get_into = dm_get_into,
    .get_alloc = dm_get_alloc,
    .get_size = dm_get_size,
    .batch_put_from = dm_batch_put_from,
    .batch_get_into = dm_batch_get_into,
    .remove = dm_remove,
    .remove_all = dm_remove_all,
    .inspect_key = dm_inspect_key,
    .batch_replicas = dm_batch_replicas,
    .exist_key = dm_exist_key,
    .probe_key = dm_probe_key,
    .batch_exist_key = dm_batch_exist_key,
    .batch_probe_key = dm_batch_probe_key,
    .probe_resume = dm_probe_resume,
    .register_buffer = dm_register_buffer,
    .unregister_buffer = dm_unregister_buffer,
    .alloc_shared = dm_alloc_shared,
    .free_shared = dm_free_shared,
    .protocol = dm_protocol,
    .local_endpoint = dm_local_endpoint,
};

void moonlet_dummy_config_init(moonlet_dummy_config *cfg, size_t cfg_size)
{
    if (!cfg || cfg_size < offsetof(moonlet_dummy_config, opts_size) + sizeof(cfg->opts_size))
        return;
    memset(cfg, 0, cfg_size < sizeof(*cfg) ? cfg_size : sizeof(*cfg));
    cfg->opts_size = cfg_size;
}

int moonlet_client_create_dummy(const char *socket_path, const moonlet_dummy_config *user_cfg,
                                moonlet_client **out)
{
    /* The caller's opts_size bytes; fields past them keep their defaults. */
    moonlet_dummy_config full;
    const moonlet_dummy_config *cfg = NULL;
    if (user_cfg) {
        if (user_cfg->opts_size < offsetof(moonlet_dummy_config, opts_size) + sizeof(size_t))
            return MOONLET_ERR_INVALID_PARAMS;
        memset(&full, 0, sizeof(full));
        memcpy(&full, user_cfg, user_cfg->opts_size < sizeof(full) ? user_cfg->opts_size
                                                                   : sizeof(full));
        full.opts_size = sizeof(full);
        cfg = &full;
    }
    if (!socket_path || !out)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_dummy *d = NULL;
    int rc = moonlet_dummy_create(socket_path, cfg, &d);
    if (rc)
        return rc;
    rc = moonlet_client_wrap(&moonlet_client_dummy_ops, (moonlet_client_be *)(void *)d, out);
    if (rc)
        moonlet_dummy_destroy(d);
    else if (cfg)
        moonlet_client_set_gpu_staging(*out, cfg->gpu_staging_size);
    return rc;
}
