/*
 * probe.c - BatchProbeKey with a GrantLeasePolicy, executed under the
 * master's locks.
 *
 * NONE is a lease-free scan.  LAST_HIT_ONLY runs in two phases:
 *
 *   1. scan: every key's readability, without leasing (guard shared, one
 *      shard lock at a time).  Any per-key error ends the request here:
 *      errors are returned as errors, nothing is leased.
 *   2. validate: the candidates complete in the scan, from the last to the
 *      first (lease/probe_policy.c gives the order).  For each: take the guard
 *      shared, then the distinct shard locks of its members in ascending shard
 *      index; recheck every member; if all are still readable, lease each
 *      distinct object once and write the mask before releasing; otherwise
 *      release and try the previous candidate.
 *
 * So a candidate that loses a member to eviction or unmount between the
 * phases is never partially leased: no member is leased before the whole
 * candidate has passed the recheck, and the recheck and the leases happen
 * under the same locks.
 *
 * Locks: guard (shared) -> shard locks, ascending.  Never the registry lock.
 */
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "master_internal.h"
#include "tenant.h"
#include "moonlet/error.h"
#include "probe_policy.h"

/* Runs under the key's shard lock: readability only, no lease. */
static void scan_visit(void *arg, size_t i, struct mobj *o)
{
    ((int32_t *)arg)[i] = o && mobj_readable(o);
}

/* Phase 1: scan[i] = 1/0/error, hashes[i] for phase 2. Guard taken here. */
static void probe_scan(moonlet_master *m, uint32_t tenant, const moonlet_str *keys, size_t n,
                       int32_t *scan, uint64_t *hashes)
{
    if (tenant == MOONLET_NO_TENANT) {
        for (size_t i = 0; i < n; i++)
            scan[i] = key_check(keys[i]) ? MOONLET_ERR_INVALID_KEY : 0;
        return;
    }
    pthread_rwlock_rdlock(&m->guard);
    shard_batch_lookup(m, tenant, keys, n, scan, hashes, scan_visit, scan);
    pthread_rwlock_unlock(&m->guard);
}

/* Sorted distinct shard indices of a candidate's members; returns how many. */
static size_t candidate_shards(const moonlet_master *m, const uint64_t *hashes, size_t cs,
                               uint32_t *out)
{
    size_t n = 0;
    for (size_t k = 0; k < cs; k++) {
        uint32_t sh = shard_of(m, hashes[k]);
        size_t pos = n;
        while (pos > 0 && out[pos - 1] > sh) /* insertion sort: cs is small */
            pos--;
        if (pos > 0 && out[pos - 1] == sh)
            continue;
        memmove(out + pos + 1, out + pos, (n - pos) * sizeof(*out));
        out[pos] = sh;
        n++;
    }
    return n;
}

static void record_hold(moonlet_master *m, uint64_t ns)
{
    lock_hold_record(m->st.probe_lock_hold_hist, &m->st.probe_lock_hold_max_ns, ns);
}

/*
 * Phase 2 for one candidate: recheck and lease under its shard locks.
 * `objs` is scratch for cs object pointers, `shards` for cs shard indices.
 * Returns true when the candidate was selected (mask written).
 */
static bool validate_candidate(moonlet_master *m, uint32_t tenant, const moonlet_str *keys,
                               const uint64_t *hashes, size_t cs, uint32_t cand, size_t n,
                               int32_t *results, struct mobj **objs, uint32_t *shards)
{
    const moonlet_str *mk = keys + (size_t)cand * cs;
    const uint64_t *mh = hashes + (size_t)cand * cs;
    size_t nsh = candidate_shards(m, mh, cs, shards);

    pthread_rwlock_rdlock(&m->guard);
    for (size_t i = 0; i < nsh; i++)
        pthread_mutex_lock(&m->shards[shards[i]].mu);
    uint64_t t0 = moonlet_clock_real_ns();

    bool all = true;
    for (size_t k = 0; k < cs && all; k++) {
        struct shard *s = &m->shards[shard_of(m, mh[k])];
        objs[k] = shard_find_locked(s, mh[k], tenant, mk[k].ptr, mk[k].len);
        all = objs[k] && mobj_readable(objs[k]);
    }
    if (all) {
        uint64_t now = moonlet_clock_now_ns(), leased = 0;
        for (size_t k = 0; k < cs; k++) {
            bool dup = false; /* duplicate keys: lease each physical object once */
            for (size_t j = 0; j < k && !dup; j++)
                dup = objs[j] == objs[k];
            if (dup)
                continue;
            objs[k]->lease_deadline =
                moonlet_lease_grant(objs[k]->lease_deadline, now, m->lease_ttl_ns);
            leased++;
        }
        moonlet_policy_fill_mask(results, n, cs, (long)cand);
        atomic_fetch_add_explicit(&m->st.leases_probe, leased, memory_order_relaxed);
    }

    uint64_t held = moonlet_clock_real_ns() - t0;
    for (size_t i = nsh; i-- > 0;)
        pthread_mutex_unlock(&m->shards[shards[i]].mu);
    pthread_rwlock_unlock(&m->guard);
    record_hold(m, held);
    return all;
}

static int probe_last_hit(moonlet_master *m, uint32_t tenant,
                          const moonlet_grant_lease_policy *policy, const moonlet_str *keys,
                          size_t n, int32_t *results)
{
    size_t cs = policy->candidate_size, ncand = n / cs;
    uint64_t *hashes = malloc(n * sizeof(*hashes));
    uint32_t *order = malloc(ncand * sizeof(*order));
    struct mobj **objs = malloc(cs * sizeof(*objs));
    uint32_t *shards = malloc(cs * sizeof(*shards));
    if (!hashes || !order || !objs || !shards) {
        free(hashes), free(order), free(objs), free(shards);
        return MOONLET_ERR_INTERNAL_ERROR;
    }

    probe_scan(m, tenant, keys, n, results, hashes);
    if (moonlet_policy_scan_error(results, n) || tenant == MOONLET_NO_TENANT) {
        for (size_t i = 0; i < n; i++) /* errors stay errors; nothing selected */
            if (results[i] > 0)
                results[i] = 0;
        goto out;
    }
    size_t ncomplete = moonlet_policy_walk_order(results, n, cs, order);
    moonlet_policy_fill_mask(results, n, cs, -1);

    if (m->cfg.probe_hook)
        m->cfg.probe_hook(m->cfg.probe_hook_arg);

    for (size_t i = 0; i < ncomplete; i++) {
        atomic_fetch_add_explicit(&m->st.probe_candidates_examined, 1, memory_order_relaxed);
        if (validate_candidate(m, tenant, keys, hashes, cs, order[i], n, results, objs, shards))
            break;
        atomic_fetch_add_explicit(&m->st.probe_recheck_fallbacks, 1, memory_order_relaxed);
    }
out:
    free(hashes), free(order), free(objs), free(shards);
    return MOONLET_OK;
}

int moonlet_master_batch_probe_key(moonlet_master *m, moonlet_str tenant,
                                   const moonlet_grant_lease_policy *policy,
                                   const moonlet_str *keys, size_t n, int32_t *results)
{
    int rc = moonlet_policy_validate(policy, n);
    if (rc)
        return rc;
    uint32_t tid;
    rc = tenant_lookup(m, tenant, &tid);
    if (rc)
        return rc;
    if (policy->lease_mode == MOONLET_PROBE_LEASE_NONE) {
        atomic_fetch_add_explicit(&m->st.probe_calls_none, 1, memory_order_relaxed);
        probe_scan(m, tid, keys, n, results, NULL);
        return MOONLET_OK;
    }
    atomic_fetch_add_explicit(&m->st.probe_calls_last_hit, 1, memory_order_relaxed);
    if (n == 0)
        return MOONLET_OK;
    return probe_last_hit(m, tid, policy, keys, n, results);
}
