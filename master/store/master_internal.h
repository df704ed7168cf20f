/*
 * master_internal.h - the master's state (struct moonlet_master), the lock
 * order every file of the object store follows, and the replication hook.
 * The records it holds are declared by concern: objects.h (objects,
 * shards), registry.h (segments, clients), tenant.h (tenants), stats.h
 * (counters); each file's calls are in its own header.
 *
 * Lock order (never take them in another order):
 *   0. evict_mu            - serialises eviction passes (held around a pass)
 *   -  unmount_mu          - serialises unmount drains (unmount.c); taken
 *                            before the guard, never under another lock
 *   1. guard (rwlock)      - shared for every ordinary operation; exclusive
 *                            only for an O(1) barrier that retires unmounted
 *                            slots (no work is done under it)
 *   2. shard locks         - several at once only in ascending shard index
 *   3. registry.mu         - segment registry, allocators and client table
 *   -  tenants.lock        - leaf lock; never held while taking another
 *   -  repair_mu           - repair.c's queue; a leaf like tenants.lock
 *                            (taken under a shard lock, never the reverse)
 *
 * Invariant that lets readers skip the registry lock: a replica only ever
 * names a slot that is MOUNTED or UNMOUNTING, never a FREE one.  Unmount
 * marks the slot UNMOUNTING (placement skips it from then on), strips its
 * replicas object by object (through the segment's index of object hashes,
 * one shard lock at a time, the guard shared), and only then retires the
 * slot behind the exclusive-guard barrier.  So while a thread holds the
 * guard shared, the segment slots its objects reference keep their identity
 * strings (id, name, endpoint, protocol, base) unchanged.  Only the mutable
 * accounting (allocator, used, objects, index) needs registry.mu.
 *
 * Functions named *_locked expect the caller to hold the lock they name;
 * never call a helper that takes a shard lock while holding that shard lock.
 */
#ifndef MOONLET_MASTER_INTERNAL_H
#define MOONLET_MASTER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "master.h"
#include "objects.h"
#include "objslab.h"
#include "registry.h"
#include "stats.h"
#include "tenant.h"

struct moonlet_master {
    moonlet_master_config cfg;
    uint64_t lease_ttl_ns, soft_pin_ttl_ns, client_ttl_ns, put_timeout_ns, quarantine_grace_ns;
    _Atomic uint64_t liveness_hold_ns; /* no liveness expiry before (moonlet_master_hold_liveness) */
    /* The next put id (object.c): from a random start, so that two masters
     * (a promoted standby, a restarted leader) hand out ids that do not
     * meet; a restored pending put keeps its id (replicated in PLACE). */
    _Atomic uint64_t next_put_id;
    /* The leader epoch its write capabilities carry (common/writecap.h);
     * 0 without HA.  Raised by moonlet_master_set_epoch. */
    _Atomic uint64_t epoch;

    pthread_mutex_t evict_mu;
    pthread_mutex_t unmount_mu;     /* unmount.c: one drain at a time */
    struct unmount_job *unmounts;     /* unmount_mu: slots being stripped */
    uint32_t nunmounts, unmounts_cap;
    pthread_rwlock_t guard;
    struct shard *shards;
    uint32_t nshards;
    struct tenants tenants;
    struct registry reg;
    struct mstats st;
    moonlet_objslab *slab;          /* object metadata memory (leaf lock) */

    struct repair_state *repair;    /* repair.c: re-replication queue (repair_mu inside) */

    pthread_t bg;
    bool bg_started;
    pthread_mutex_t bg_mu;
    pthread_cond_t bg_cv;
    bool bg_stop;
    uint64_t last_reap_ns;
    uint64_t last_ahead_ns;         /* the background thread's last demote_ahead_pass */
    uint64_t trim_peak;             /* objects at the last malloc_trim or since (bg thread) */
};

static inline uint32_t shard_of(const moonlet_master *m, uint64_t hash)
{
    return (uint32_t)((hash >> 40) % m->nshards);
}

static inline bool seg_draining(const moonlet_master *m, uint32_t slot)
{
    return atomic_load(&reg_seg(&m->reg, slot)->draining);
}

/* ---- the replication hook (master.h: moonlet_repl_rec) ------------------------
 * The store emits its records through cfg.repl_emit, which a hot standby's
 * log registers; without one nothing is built (record.h fills them). */
static inline bool repl_on(const moonlet_master *m) { return m->cfg.repl_emit != NULL; }
static inline void repl_emit(const moonlet_master *m, const moonlet_repl_rec *r)
{
    if (m->cfg.repl_emit)
        m->cfg.repl_emit(m->cfg.repl_arg, r);
}

#endif
