/*
 * tenant.h - the tenant table (tenant.c): tenant names interned to small
 * ids, each alive while something holds a reference on it.
 *
 * Tenants are interned so an object stores 4 bytes instead of a string,
 * and the tenant id seeds the key hash (tenant isolation is then
 * structural: a lookup in tenant A cannot match an object of tenant B).
 *
 * Locks: tenants.lock (a rwlock) is a leaf: never held while taking
 * another lock; taken under a shard lock when an object's destruction
 * drops its reference.
 */
#ifndef MOONLET_MASTER_TENANT_H
#define MOONLET_MASTER_TENANT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "hmap.h"
#include "master.h"

#define MOONLET_MAX_TENANTS 65536u
#define MOONLET_NO_TENANT UINT32_MAX

/*
 * A tenant slot.  A tenant exists only while something holds a reference:
 * each of its objects holds one, and a PutStart holds one for the duration of
 * the call.  The last release frees the slot, so a failed call under a new
 * name leaves nothing behind and unused tenants expire by themselves.
 * A tenant's id is (generation << 16) | slot; the generation changes each
 * time a slot is reused, so a reader that looked a name up before its tenant
 * expired can never match the objects of the slot's next tenant.
 */
struct tenant_slot {
    char *name;                  /* NULL: free slot */
    uint32_t len;
    uint32_t id;                 /* current id; the generation survives reuse */
    _Atomic uint64_t refs;       /* objects + PutStarts in flight */
};

struct tenants {
    pthread_rwlock_t lock;
    struct hmap by_name;         /* live tenant name -> slot */
    uint32_t *free, nfree, free_cap; /* free slots to reuse */
    struct tenant_slot *slots;
    uint32_t n, cap;             /* slots ever used, allocated */
    uint32_t live;               /* slots holding a tenant */
    uint32_t max;                /* cfg.max_tenants */
    uint64_t full_warned_ns;     /* last "table full" warning (lock held for writing) */
};

/* tenants_init: an empty table (zeroed memory) of at most max live
 * tenants; tenants_destroy frees it. */
void tenants_init(struct tenants *t, uint32_t max);
void tenants_destroy(struct tenants *t);
/* Looks a tenant up (a hash map); MOONLET_NO_TENANT when unknown.  Returns
 * INVALID_PARAMS for bad names. */
int tenant_lookup(moonlet_master *m, moonlet_str name, uint32_t *id);
/* The name a tenant is known by (an empty one: the default tenant's). */
moonlet_str tenant_canonical(moonlet_str t);
/* Live tenant id's name into name (NUL-terminated), its length; 0 when the
 * id names no live tenant.  Takes tenants.lock shared. */
uint32_t tenant_name_of(moonlet_master *m, uint32_t id, char name[MOONLET_MAX_ID_BYTES + 1]);
/* Looks up or creates the tenant and takes a reference on it (the caller
 * releases it with tenant_release).  NO_AVAILABLE_HANDLE when the table
 * already holds cfg.max_tenants live tenants. */
int tenant_acquire(moonlet_master *m, moonlet_str name, uint32_t *id);
/* One more reference on a tenant the caller already holds one on. */
void tenant_ref(moonlet_master *m, uint32_t id);
/* Drops a reference; the last one frees the tenant's slot.  Takes tenants.lock. */
void tenant_release(moonlet_master *m, uint32_t id);
/* Live tenants (takes tenants.lock). */
uint32_t tenant_count(moonlet_master *m);


#endif
