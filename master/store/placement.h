/*
 * placement.h - where replicas go (placement.c): a put's ranges (the
 * reservation pools first when a hot standby is on, then the segments
 * preferred, then round-robin), a replacement for a failed write, a
 * repair's extra replica on another host, a demotion's disk extent, and the
 * exact ranges a standby or a node's announce names.
 *
 * Locks: each call takes registry.mu (order 3) for the whole placement; the
 * caller holds the guard shared and the object's shard lock.
 */
#ifndef MOONLET_MASTER_PLACEMENT_H
#define MOONLET_MASTER_PLACEMENT_H

#include "master_internal.h"

/* Reserves `nrep` ranges of `size` on distinct mounted segments into reps[]
 * and records `hash` (the object's) in each segment's index.  Caller holds
 * the guard shared (and a shard lock); takes registry.mu. */
int registry_place_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t nrep,
                          struct mrep *reps);
/* The same, trying the segments named in preferred[] first (in order; names
 * not mounted or without room are skipped), then round-robin. */
int registry_place_preferred_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t nrep,
                                    const moonlet_str *preferred, uint32_t npreferred,
                                    struct mrep *reps, bool *covered);
/* PutReplaceReplica's placement: reserves one range of `size` on a mounted
 * segment that holds none of reps[0..nrep) and is none of the segments
 * named in excluded[] (ids; unknown ones are skipped), into *out, and
 * records `hash` in its index.  NO_AVAILABLE_HANDLE when no segment fits.
 * Caller holds the guard shared and the object's shard lock; takes registry.mu. */
int registry_place_replacement_locked(moonlet_master *m, uint64_t hash, uint64_t size,
                                      const struct mrep *reps, uint32_t nrep,
                                      const moonlet_str *excluded, uint32_t nexcluded,
                                      struct mrep *out);
/* Promotion with state, and a node's announce of its disk: reserves exactly
 * the ranges seg_ids[k]/offs[k] of `size` (mounted segments; on a disk
 * segment the extent of a key of key_len bytes) into reps[], as
 * registry_place_locked does.  SEGMENT_NOT_FOUND, NO_AVAILABLE_HANDLE (a
 * range not free: nothing kept), INVALID_PARAMS (a range outside, or not
 * aligned).  Caller holds the guard shared and a shard lock; takes
 * registry.mu. */
int registry_place_at_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t key_len,
                             const moonlet_str *seg_ids, const uint64_t *offs, uint32_t nrep,
                             struct mrep *reps);
/* Reserves a range of `size` for one more replica of an object whose
 * replicas are reps[0..nrep): on a mounted, not draining segment other than
 * theirs, on a host (the endpoint without its port) other than those of its
 * replicas on segments that are not draining - or, when no such segment has
 * room, on any other segment (PutStart's rule: a single-host cluster).  Records `hash` in the
 * segment's index; *gen gets the segment's generation.  Caller holds the
 * guard shared (and the shard lock); takes registry.mu.
 * NO_AVAILABLE_HANDLE when no segment qualifies. */
int registry_place_extra_locked(moonlet_master *m, uint64_t hash, uint64_t size,
                                const struct mrep *reps, uint32_t nrep, struct mrep *out,
                                uint64_t *gen);
/* A demotion's target: reserves footprint bytes (a disk extent) on a mounted
 * disk segment, one of the node that holds a replica in reps[0..nrep) when
 * it has room (the copy stays on that host), else any with room.
 * NO_AVAILABLE_HANDLE when none has; SEGMENT_NOT_FOUND when no disk segment
 * is mounted.  Caller holds a shard lock; takes registry.mu. */
int registry_place_disk_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t disk_key,
                               const struct mrep *reps, uint32_t nrep, struct mrep *out,
                               uint64_t *gen);
#endif
