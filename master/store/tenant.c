/*
 * tenant.c - the tenant table: tenant names interned to small ids
 * (tenant.h), created by the first PutStart under a name and freed by the
 * release of the last reference (an object's, or a PutStart's in flight).
 *
 * A tenant's id is (generation << 16) | slot; the generation changes each
 * time a slot is reused, so a reader that looked a name up before its
 * tenant expired never matches the objects of the slot's next tenant.
 *
 * Locks: tenants.lock only, a leaf: a reference is taken under it shared,
 * a slot is created or freed under it exclusive.
 */
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "grow.h"
#include "log.h"
#include "master_internal.h"
#include "moonlet/error.h"
#include "tenant.h"

void tenants_init(struct tenants *t, uint32_t max)
{
    pthread_rwlock_init(&t->lock, NULL);
    t->max = max;
}

void tenants_destroy(struct tenants *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        free(t->slots[i].name);
    free(t->slots);
    free(t->free);
    hmap_free(&t->by_name);
    pthread_rwlock_destroy(&t->lock);
}

static inline uint32_t tenant_slot_of(uint32_t id) { return id & 0xffffu; }

static moonlet_str tenant_name(moonlet_str t)
{
    return t.len ? t : MOONLET_STR(MOONLET_DEFAULT_TENANT);
}

moonlet_str tenant_canonical(moonlet_str t)
{
    return tenant_name(t);
}

uint32_t tenant_name_of(moonlet_master *m, uint32_t id, char name[MOONLET_MAX_ID_BYTES + 1])
{
    uint32_t len = 0;
    pthread_rwlock_rdlock(&m->tenants.lock);
    uint32_t slot = tenant_slot_of(id);
    if (slot < m->tenants.n && m->tenants.slots[slot].name && m->tenants.slots[slot].id == id) {
        len = m->tenants.slots[slot].len;
        memcpy(name, m->tenants.slots[slot].name, len);
    }
    pthread_rwlock_unlock(&m->tenants.lock);
    name[len] = 0;
    return len;
}

/* The name behind a value of tenants.by_name (hmap_find_str); none: a free slot. */
static moonlet_str slot_name_of(const void *t, uint32_t v)
{
    const struct tenant_slot *ts = &((const struct tenants *)t)->slots[v];
    return (moonlet_str){ts->name, ts->len};
}

/* The slot of a live tenant by name (a hash map), or UINT32_MAX. */
static uint32_t tenant_find_locked(struct tenants *t, moonlet_str name)
{
    struct hent *e =
        hmap_find_str(&t->by_name, hmap_str_hash(name.ptr, name.len), name, slot_name_of, t);
    return e ? e->v : UINT32_MAX;
}


int tenant_lookup(moonlet_master *m, moonlet_str name, uint32_t *id)
{
    name = tenant_name(name);
    if (name.len > MOONLET_MAX_ID_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_rwlock_rdlock(&m->tenants.lock);
    uint32_t i = tenant_find_locked(&m->tenants, name);
    *id = i == UINT32_MAX ? MOONLET_NO_TENANT : m->tenants.slots[i].id;
    pthread_rwlock_unlock(&m->tenants.lock);
    return MOONLET_OK;
}

/* Creates a tenant in a free slot; tenants.lock held for writing. */
static int tenant_create_locked(moonlet_master *m, moonlet_str name, uint32_t *slot)
{
    struct tenants *t = &m->tenants;
    if (t->live >= t->max) {
        uint64_t now = moonlet_clock_real_ns();
        if (now - t->full_warned_ns >= 10000 * MOONLET_NS_PER_MS || !t->full_warned_ns) {
            t->full_warned_ns = now;
            ML_WARN("master", "tenant table full (%u tenants with live objects): PutStart under "
                    "a new tenant name fails with NO_AVAILABLE_HANDLE", t->live);
        }
        return MOONLET_ERR_NO_AVAILABLE_HANDLE;
    }
    uint32_t i = t->nfree ? t->free[t->nfree - 1] : t->n;
    if (i == t->n) {
        uint32_t old_cap = t->cap;
        struct tenant_slot *ns = moonlet_grow(t->slots, t->n, &t->cap, 8, sizeof(*ns));
        if (!ns)
            return MOONLET_ERR_INTERNAL_ERROR;
        memset(ns + old_cap, 0, (t->cap - old_cap) * sizeof(*ns));
        for (uint32_t k = old_cap; k < t->cap; k++)
            ns[k].id = k; /* generation 0 */
        t->slots = ns;
        t->n++;
    }
    struct tenant_slot *ts = &t->slots[i];
    if (!(ts->name = malloc(name.len ? name.len : 1)))
        return MOONLET_ERR_INTERNAL_ERROR;
    if (!hmap_insert(&t->by_name, hmap_str_hash(name.ptr, name.len), i)) {
        free(ts->name);
        ts->name = NULL;
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    if (t->nfree && t->free[t->nfree - 1] == i)
        t->nfree--;
    memcpy(ts->name, name.ptr, name.len);
    ts->len = name.len;
    atomic_store(&ts->refs, 0);
    t->live++;
    *slot = i;
    return MOONLET_OK;
}

int tenant_acquire(moonlet_master *m, moonlet_str name, uint32_t *id)
{
    name = tenant_name(name);
    if (name.len > MOONLET_MAX_ID_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    struct tenants *t = &m->tenants;
    /* A reference taken under the read lock keeps the slot: freeing needs the write lock. */
    pthread_rwlock_rdlock(&t->lock);
    uint32_t i = tenant_find_locked(t, name);
    if (i != UINT32_MAX) {
        atomic_fetch_add(&t->slots[i].refs, 1);
        *id = t->slots[i].id;
    }
    pthread_rwlock_unlock(&t->lock);
    if (i != UINT32_MAX)
        return MOONLET_OK;
    int rc = MOONLET_OK;
    pthread_rwlock_wrlock(&t->lock);
    i = tenant_find_locked(t, name);
    if (i == UINT32_MAX)
        rc = tenant_create_locked(m, name, &i);
    if (rc == MOONLET_OK) {
        atomic_fetch_add(&t->slots[i].refs, 1);
        *id = t->slots[i].id;
    }
    pthread_rwlock_unlock(&t->lock);
    return rc;
}

void tenant_ref(moonlet_master *m, uint32_t id)
{
    /* The caller holds a reference, so the slot cannot be freed or moved
     * (realloc happens only under the write lock, which creation takes). */
    pthread_rwlock_rdlock(&m->tenants.lock);
    atomic_fetch_add(&m->tenants.slots[tenant_slot_of(id)].refs, 1);
    pthread_rwlock_unlock(&m->tenants.lock);
}

void tenant_release(moonlet_master *m, uint32_t id)
{
    struct tenants *t = &m->tenants;
    uint32_t i = tenant_slot_of(id);
    pthread_rwlock_rdlock(&t->lock);
    bool last = i < t->n && t->slots[i].id == id && atomic_fetch_sub(&t->slots[i].refs, 1) == 1;
    pthread_rwlock_unlock(&t->lock);
    if (!last)
        return;
    /* Free the slot unless a PutStart took a new reference in between. */
    pthread_rwlock_wrlock(&t->lock);
    struct tenant_slot *ts = &t->slots[i];
    if (ts->name && ts->id == id && atomic_load(&ts->refs) == 0) {
        hmap_remove_hv(&t->by_name, hmap_str_hash(ts->name, ts->len), i);
        uint32_t *nf = moonlet_grow(t->free, t->nfree, &t->free_cap, 16, sizeof(*nf));
        if (nf)
            t->free = nf;
        if (t->nfree < t->free_cap) /* else the slot is not reused (out of memory) */
            t->free[t->nfree++] = i;
        free(ts->name);
        ts->name = NULL;
        ts->len = 0;
        uint32_t gen = (id >> 16) + 1;
        ts->id = ((gen & 0xffffu) << 16) | i;
        if (ts->id == MOONLET_NO_TENANT)
            ts->id = i; /* skip the reserved value: generation 0 again */
        t->live--;
    }
    pthread_rwlock_unlock(&t->lock);
}

uint32_t tenant_count(moonlet_master *m)
{
    pthread_rwlock_rdlock(&m->tenants.lock);
    uint32_t n = m->tenants.live;
    pthread_rwlock_unlock(&m->tenants.lock);
    return n;
}
