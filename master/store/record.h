/*
 * record.h - an object as a replication record (record.c): the PLACE,
 * SEAL and DROP records the store emits through cfg.repl_emit, the hook a
 * hot standby's log registers (master.h: moonlet_repl_rec and the records'
 * order).  The store never calls the replication code itself: it fills
 * records and hands them to that hook, or to a snapshot's emit.
 *
 * Locks: under the object's shard lock (the caller's); repl_object_send
 * takes tenants.lock (read, a leaf) for the tenant's name.
 */
#ifndef MOONLET_MASTER_RECORD_H
#define MOONLET_MASTER_RECORD_H

#include "master_internal.h"

/* Fills a PLACE / SEAL / DROP record of object o (its replicas' segment ids
 * and offsets, flags, ms left of its put deadline).  Caller holds the guard
 * shared and o's shard lock; rec points into o and the segments meanwhile. */
void repl_object_rec(const moonlet_master *m, const struct mobj *o, uint8_t type,
                     moonlet_repl_rec *rec);

/* An object as one PLACE record (FLAG_SEALED when sealed), its tenant's
 * name included (no replica: no record); free_ms: how long a range the
 * standby held for the object and this record no longer names stays
 * unusable.  What a snapshot sends per object, and what repair.c sends
 * when a drain swapped a replica.  Under the object's shard lock; takes
 * tenants.lock (read). */
void repl_object_send(moonlet_master *m, const struct mobj *o, uint64_t free_ms,
                      void (*emit)(void *arg, const moonlet_repl_rec *rec), void *arg);

#endif
