/*
 * evict.h - eviction (evict.c): passes under memory pressure, eviction for
 * one put's space, the disk tier's own eviction, copies ahead of eviction,
 * and the reaper of stale puts.  Eviction sits above repair.c: it hands
 * its victims to repair's demotion jobs.
 *
 * Locks: evict_mu (order 0) around a pass, then the guard shared, then one
 * shard lock at a time (object destruction adds registry.mu).
 */
#ifndef MOONLET_MASTER_EVICT_H
#define MOONLET_MASTER_EVICT_H

#include "master_internal.h"

/* One eviction pass (takes evict_mu, then the guard shared). */
uint64_t evict_pass(moonlet_master *m, double ratio);
/* Evicts what a put of `size` bytes with `nrep` replicas needs: on nrep
 * distinct segments, the cheapest run of adjacent free and evictable ranges
 * that is at least the rounded size.  Evicts nothing when no such runs
 * exist.  Returns objects evicted (takes evict_mu, then the guard shared). */
uint64_t evict_for_space(moonlet_master *m, uint64_t size, uint32_t nrep);
/* The disk tier's own eviction: the cheapest run of free and evictable
 * disk extents spanning len on one disk segment, its owners destroyed
 * (their extents quarantined while a reader's lease holds).  Returns
 * objects evicted.  Takes no lock the caller may hold (evict_mu first). */
uint64_t evict_disk_for_space(moonlet_master *m, uint64_t len);
/* A demotion that found no disk room: its object (hash, tenant) is
 * evicted from DRAM as without a disk tier, if still evictable.  Takes the
 * guard shared and its shard lock. */
void evict_without_copy(moonlet_master *m, uint64_t hash, uint32_t tenant);
/* With a disk tier: queues copies ahead of eviction (repair_demote_ahead_locked)
 * for the coldest DRAM objects, until cfg.demote_ahead_ratio of them have
 * one (staged or queued).  Returns how many it queued.  Takes evict_mu,
 * the guard shared, then one shard lock at a time. */
uint64_t demote_ahead_pass(moonlet_master *m);
/* Revokes puts whose PutEnd did not come within the put timeout. */
void reap_stale_puts(moonlet_master *m);

/* Lock-hold histogram bucket of a duration. */

#endif
