/*
 * pool.h - reservation pools for a hot standby (pool.c): ranges each
 * segment allocates and announces (RESV) ahead of the PutStarts that take
 * them.  The pool's fields live in struct mseg (registry.h).
 *
 * Locks: every function runs under registry.mu, the caller's; cfg.repl_pos
 * takes only the replication log's leaf lock.
 */
#ifndef MOONLET_MASTER_POOL_H
#define MOONLET_MASTER_POOL_H

#include "master_internal.h"

/* cfg.repl_emit and cfg.repl_pos are both set. */
bool pool_enabled(const moonlet_master *m);
/* Places nrep replicas of rounded length len in pooled ranges the standby
 * acknowledged, on distinct segments (usable preferred names first, then
 * round-robin); false (nothing taken) when the pools cannot serve it. */
bool pool_place(moonlet_master *m, uint64_t len, const moonlet_str *preferred,
                uint32_t npreferred, uint32_t nrep, struct mrep *reps);
/* A put of rounded length len was placed on `slot` without the pool: the
 * pool may switch to that size, and refills. */
void pool_note(moonlet_master *m, uint32_t slot, uint64_t len);
/* A slot (re)mounted or retired: an empty pool (its ranges go with the
 * allocator).  Inline: segment.c resets it with the slot. */
static inline void pool_reset(struct mseg *s)
{
    s->npool = 0;
    s->pool_len = 0;
    s->pool_misses = 0;
    s->pool_miss_len = 0;
}
/* RESV records of the pool's ranges (snapshot.c). */
void pool_snapshot(const struct mseg *s, void (*emit)(void *arg, const moonlet_repl_rec *rec),
                   void *arg);

#endif
