/*
 * stats.c - the master's statistics (moonlet_master_get_stats): the
 * counters of struct mstats (stats.h), the lock-hold histograms the probes
 * record, and the counts other files own (repair's, the registry's, the
 * tenant table's).
 *
 * Locks: none of its own; the counts owned elsewhere are read under their
 * owners' locks, one at a time (repair_mu, tenants.lock, registry.mu).
 */
#include <string.h>

#include "master_internal.h"
#include "repair.h"
#include "stats.h"
#include "tenant.h"

unsigned lock_hist_bucket(uint64_t ns)
{
    uint64_t us = ns / 1000;
    unsigned b = 0;
    while (us && b < MOONLET_LOCK_HIST_BUCKETS - 1) {
        us >>= 1;
        b++;
    }
    return b; /* 0: <1us, 1: <2us, 2: <4us, ... last: >= 1024us */
}

/* A snapshot of what lock_hold_record counted: the histogram and the maximum. */
static void lock_hold_load(uint64_t *hist, uint64_t *max_ns, const _Atomic uint64_t *src_hist,
                           const _Atomic uint64_t *src_max_ns)
{
    for (unsigned i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++)
        hist[i] = atomic_load(&src_hist[i]);
    *max_ns = atomic_load(src_max_ns);
}

void moonlet_master_get_stats(moonlet_master *m, moonlet_master_stats *st)
{
    memset(st, 0, sizeof(*st));
    struct mstats *s = &m->st;
    st->objects = atomic_load(&s->objects);
    st->bytes = atomic_load(&s->bytes);
    st->put_starts = atomic_load(&s->put_starts);
    st->put_starts_reserved = atomic_load(&s->put_starts_reserved);
    st->put_ends = atomic_load(&s->put_ends);
    st->put_revokes = atomic_load(&s->put_revokes);
    st->put_timeouts = atomic_load(&s->put_timeouts);
    st->put_replacements = atomic_load(&s->put_replacements);
    st->removes = atomic_load(&s->removes);
    st->evictions = atomic_load(&s->evictions);
    st->eviction_passes = atomic_load(&s->eviction_passes);
    st->leases_get = atomic_load(&s->leases_get);
    st->leases_exist = atomic_load(&s->leases_exist);
    st->leases_probe = atomic_load(&s->leases_probe);
    st->probe_calls_none = atomic_load(&s->probe_calls_none);
    st->probe_calls_last_hit = atomic_load(&s->probe_calls_last_hit);
    st->probe_candidates_examined = atomic_load(&s->probe_candidates_examined);
    st->probe_recheck_fallbacks = atomic_load(&s->probe_recheck_fallbacks);
    lock_hold_load(st->probe_lock_hold_hist, &st->probe_lock_hold_max_ns, s->probe_lock_hold_hist,
                   &s->probe_lock_hold_max_ns);
    st->unmounts_by_liveness = atomic_load(&s->unmounts_by_liveness);
    st->resume_calls = atomic_load(&s->resume_calls);
    st->resume_candidates_examined = atomic_load(&s->resume_candidates_examined);
    st->resume_recheck_fallbacks = atomic_load(&s->resume_recheck_fallbacks);
    st->leases_resume_kda = atomic_load(&s->leases_resume_kda);
    st->leases_resume_kv = atomic_load(&s->leases_resume_kv);
    lock_hold_load(st->resume_lock_hold_hist, &st->resume_lock_hold_max_ns,
                   s->resume_lock_hold_hist, &s->resume_lock_hold_max_ns);
    st->tenants = tenant_count(m);
    st->quarantined = atomic_load(&m->reg.quarantined);
    st->hard_pinned = atomic_load(&s->hard_pinned);
    st->hard_pinned_bytes = atomic_load(&s->hard_pinned_bytes);
    repair_stats(m, st);
    st->capacity = atomic_load(&m->reg.capacity);
    st->disk_capacity = atomic_load(&m->reg.disk_capacity);
    st->disk_used = atomic_load(&m->reg.disk_used);
    st->disk_segments = atomic_load(&m->reg.ndisk);
    st->disk_objects = repair_disk_objects(m);
    st->disk_evictions = atomic_load(&m->st.disk_evictions);
    st->disk_announced = atomic_load(&m->st.disk_announced);
    for (uint32_t k = 0; k < MOONLET_NODE_DISK_NFIELDS; k++)
        st->node_disk[k] = atomic_load(&m->reg.node_disk[k]);
    st->used = atomic_load(&m->reg.used);
    pthread_mutex_lock(&m->reg.mu);
    st->segments = m->reg.nmounted;
    st->clients = m->reg.nused;
    pthread_mutex_unlock(&m->reg.mu);
}
