/*
 * destroy.h - an object's end (destroy.c), shared by every path that takes
 * an object away: Remove and PutRevoke (object.c), eviction and the stale
 * put reaper (evict.c), an unmount that strips its last replica
 * (unmount.c).
 *
 * Locks: the caller holds the guard shared and the object's shard lock;
 * takes repair_mu (a leaf, only while repair jobs run), registry.mu, then
 * tenants.lock (a leaf).
 */
#ifndef MOONLET_MASTER_DESTROY_H
#define MOONLET_MASTER_DESTROY_H

#include "master_internal.h"

/* Releases the object's space (to quarantine while a writer or a reader
 * may still use it), tells the standby (DROP), cancels its repair, unlinks
 * and frees it, and drops its tenant reference. */
void object_destroy_locked(moonlet_master *m, struct shard *s, struct mobj *o);

#endif
