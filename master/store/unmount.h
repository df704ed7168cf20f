/*
 * unmount.h - taking segments out of service (unmount.c): the liveness
 * check's unmounts of dead nodes and the unmounts still in progress.
 *
 * Locks: unmount_mu (taken first, never under another lock), then the
 * guard shared per batch of objects (shard locks, registry.mu beneath);
 * the reader barrier takes the guard exclusive with nothing else held.
 */
#ifndef MOONLET_MASTER_UNMOUNT_H
#define MOONLET_MASTER_UNMOUNT_H

#include "master_internal.h"

/* Unmounts every segment of clients not heard from within the liveness TTL,
 * and goes on with unmounts begun earlier: at most a bounded number of
 * objects per call (the rest on the next tick).  Takes unmount_mu, then the
 * guard shared per batch of objects (shard locks, registry.mu beneath). */
void liveness_check(moonlet_master *m);
/* Unmounts still in progress (takes unmount_mu). */
uint32_t unmounts_pending(moonlet_master *m);
void unmounts_destroy(moonlet_master *m);

#endif
