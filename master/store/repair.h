/*
 * repair.h - re-replication and demotion jobs (repair.c): the queue of
 * under-replicated objects, the demotions eviction queues, the copies made
 * ahead of eviction (staged), and the jobs store nodes fetch and report.
 *
 * Locks: repair_mu is a leaf (taken under a shard lock; nothing is taken
 * under it).  The pump, fetch and done paths take the guard shared, then
 * one shard lock, then registry.mu or repair_mu, never two shard locks.
 */
#ifndef MOONLET_MASTER_REPAIR_H
#define MOONLET_MASTER_REPAIR_H

#include "master_internal.h"

/* What a demotion falls back on when no disk segment has room for its
 * copy: eviction's (evict.c).  Eviction sits above repair (it hands its
 * victims to repair's demotion jobs), so master.c passes these two to
 * repair_init rather than repair.c calling up. */
struct repair_evict {
    /* Evicts disk objects for an extent of len bytes; returns how many
     * (evict_disk_for_space). */
    uint64_t (*disk_for_space)(moonlet_master *m, uint64_t len);
    /* Evicts (hash, tenant) from DRAM as without a disk tier, if still
     * evictable (evict_without_copy). */
    void (*without_copy)(moonlet_master *m, uint64_t hash, uint32_t tenant);
};
int repair_init(moonlet_master *m, const struct repair_evict *ev);
void repair_destroy(moonlet_master *m);
/* Notes that the object (its shard lock held) may have fewer readable
 * replicas than it was put with: queues its repair.  Takes repair_mu. */
void repair_note_locked(moonlet_master *m, const struct mobj *o);
/* Snapshot (snapshot.c): a QUAR record for each running job's target range,
 * as repair.c's repl_hold_target emitted it.  Takes repair_mu, then
 * registry.mu (not nested). */
void repair_snapshot_targets(moonlet_master *m,
                             void (*emit)(void *arg, const moonlet_repl_rec *rec), void *arg);
/* Background work: times out jobs, starts queued ones within the limits.
 * Takes repair_mu, then (without it) the guard shared and one shard lock at
 * a time. */
void repair_tick(moonlet_master *m);
/* Object o (its shard lock held) is being destroyed: its running repair job,
 * if any, is cancelled, so its copy is attached to no later object of the
 * same key.  Takes repair_mu (a leaf) only while a job runs. */
void repair_object_gone_locked(moonlet_master *m, const struct mobj *o);
/* Readable replicas of o not on a draining segment. */
uint32_t repair_live_replicas(const moonlet_master *m, const struct mobj *o);
/* The repair counters of moonlet_master_get_stats (takes repair_mu). */
void repair_stats(moonlet_master *m, moonlet_master_stats *st);
/* Eviction's demotion (repair.c owns the jobs): queues sealed o, in DRAM,
 * for a copy to a disk segment; o keeps its DRAM replicas until the copy is
 * durable and RepairDone swaps them for it.  DEMOTE_QUEUED (now or before),
 * DEMOTE_BUSY (a repair of o is queued or runs), DEMOTE_NONE (no disk tier
 * mounted, or the queue is full: counted as dropped; the caller evicts as
 * without a disk tier).  Under o's shard lock; takes repair_mu. */
enum { DEMOTE_NONE, DEMOTE_QUEUED, DEMOTE_BUSY, DEMOTE_SWAPPED };
int repair_demote_locked(moonlet_master *m, struct mobj *o);
/* A copy ahead of eviction (the disk tier's room allowing: its staged
 * copies take at most half of it): queues sealed o, in DRAM, for a disk
 * copy that is staged, not joined; o keeps its DRAM replicas and stays
 * DRAM's.  When eviction later picks o, repair_demote_locked (or
 * repair_swap_staged_locked) swaps its DRAM replicas for the copy at once,
 * with no copy to wait for: eviction under a flood of puts loses nothing
 * that was copied ahead.  Returns as repair_demote_locked (never
 * SWAPPED).  Under o's shard lock; takes repair_mu. */
int repair_demote_ahead_locked(moonlet_master *m, const struct mobj *o);
/* Objects on disk segments (each has its one replica there): the extents
 * placed there, less those that are no object's yet (the extents of
 * running demotions and of staged copies).  No lock: atomics only
 * (evict_pass asks each tick). */
uint64_t repair_disk_objects(moonlet_master *m);
/* When o has a staged copy (still valid), swaps its DRAM replicas for it:
 * true.  Under o's shard lock; takes repair_mu, then registry.mu. */
bool repair_swap_staged_locked(moonlet_master *m, struct mobj *o);

#endif
