/*
 * object.h - object.c's one call for the store's other files: the standby
 * learns an object as it is.  (Its public operations, PutStart to
 * RemoveAll, are master.h's.)
 *
 * Locks: takes the guard shared and the key's shard lock.
 */
#ifndef MOONLET_MASTER_OBJECT_H
#define MOONLET_MASTER_OBJECT_H

#include "master_internal.h"

/* The standby learns object (tenant, key) as it is (a PLACE naming its
 * replicas), when replication is on.  Takes the guard shared and its
 * shard lock. */
void object_replicate(moonlet_master *m, moonlet_str tenant, moonlet_str key);

#endif
