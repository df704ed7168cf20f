/*
 * stats.h - the master's counters (struct mstats, read by
 * moonlet_master_get_stats in stats.c) and the lock-hold histograms the
 * probes record.
 *
 * Locks: none.  Every counter is an atomic updated with relaxed or
 * sequentially consistent adds where the event happens; a reader sums
 * them without a lock (moonlet_master_get_stats takes only the locks of
 * the counts that live elsewhere: repair_mu, tenants.lock, registry.mu).
 */
#ifndef MOONLET_MASTER_STATS_H
#define MOONLET_MASTER_STATS_H

#include <stdatomic.h>
#include <stdint.h>

#include "master.h"

struct mstats {
    _Atomic uint64_t objects, bytes;
    _Atomic uint64_t pending;
    _Atomic uint64_t put_starts, put_ends, put_revokes, put_timeouts, removes;
    _Atomic uint64_t put_starts_reserved;
    _Atomic uint64_t put_replacements; /* PutReplaceReplica grants */
    _Atomic uint64_t evictions, eviction_passes;
    _Atomic uint64_t leases_get, leases_exist, leases_probe;
    _Atomic uint64_t probe_calls_none, probe_calls_last_hit;
    _Atomic uint64_t probe_candidates_examined, probe_recheck_fallbacks;
    _Atomic uint64_t probe_lock_hold_hist[MOONLET_LOCK_HIST_BUCKETS];
    _Atomic uint64_t probe_lock_hold_max_ns;
    _Atomic uint64_t unmounts_by_liveness;
    _Atomic uint64_t resume_calls, resume_candidates_examined, resume_recheck_fallbacks;
    _Atomic uint64_t leases_resume_kda, leases_resume_kv;
    _Atomic uint64_t resume_lock_hold_hist[MOONLET_LOCK_HIST_BUCKETS];
    _Atomic uint64_t resume_lock_hold_max_ns;
    _Atomic uint64_t hard_pinned, hard_pinned_bytes; /* reserved at PutStart, freed at destroy */
    _Atomic uint64_t disk_evictions;   /* disk-only objects evicted by the disk tier */
    _Atomic uint64_t disk_announced;   /* objects a restarted node's disk brought back */
};

/* Lock-hold histogram bucket of a duration (stats.c). */
unsigned lock_hist_bucket(uint64_t ns);
/* Records one shard-lock hold of ns: its histogram bucket and the maximum
 * (lock-free: relaxed counters, a CAS loop for the maximum). */
static inline void lock_hold_record(_Atomic uint64_t *hist, _Atomic uint64_t *max_ns, uint64_t ns)
{
    atomic_fetch_add_explicit(&hist[lock_hist_bucket(ns)], 1, memory_order_relaxed);
    uint64_t cur = atomic_load_explicit(max_ns, memory_order_relaxed);
    while (ns > cur && !atomic_compare_exchange_weak(max_ns, &cur, ns))
        ;
}

#endif
