/*
 * shard.c - the sharded object table.
 *
 * Objects live in `nshards` independent chained hash tables, each with its
 * own mutex, so operations on different keys rarely contend.  A key's hash is
 * XXH3-64 of its bytes seeded with the tenant id: the same key in two tenants
 * is two unrelated objects.  The high bits of the hash pick the shard, the
 * low bits the bucket, so the two choices are independent.  A shard's bucket
 * array doubles when it holds more objects than buckets (load factor <= 1).
 *
 * Locks: functions named *_locked run under the shard's mutex, which the
 * caller holds; object_destroy_locked also takes registry.mu (order 3) and,
 * to drop the object's tenant reference, tenants.lock (a leaf).
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "lease.h"
#include "master_internal.h"
#include "moonlet/error.h"

#define SHARD_INITIAL_BUCKETS 16u

uint64_t key_hash(uint32_t tenant, const char *key, uint32_t len)
{
    return XXH3_64bits_withSeed(key, len, 0x9e3779b97f4a7c15ull * ((uint64_t)tenant + 1));
}

int key_check(moonlet_str key)
{
    if (key.len == 0 || key.len > MOONLET_MAX_KEY_BYTES)
        return MOONLET_ERR_INVALID_KEY;
    return MOONLET_OK;
}

static size_t mobj_bytes(uint32_t key_len, uint32_t nrep)
{
    return sizeof(struct mobj) + mobj_key_span(key_len) + nrep * sizeof(struct mrep);
}

/* nrep may have shrunk since allocation (unmount strips replicas): the block
 * size comes from the replica capacity. */
void mobj_free(moonlet_master *m, struct mobj *o)
{
    moonlet_objslab_free(m->slab, o, mobj_bytes(o->key_len, o->nrep_cap));
}

int shards_init(moonlet_master *m)
{
    m->shards = aligned_alloc(64, sizeof(struct shard) * m->nshards);
    if (!m->shards)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (uint32_t i = 0; i < m->nshards; i++) {
        struct shard *s = &m->shards[i];
        memset(s, 0, sizeof(*s));
        pthread_mutex_init(&s->mu, NULL);
        s->buckets = calloc(SHARD_INITIAL_BUCKETS, sizeof(*s->buckets));
        if (!s->buckets) {
            m->nshards = i + 1; /* destroy what exists */
            return MOONLET_ERR_INTERNAL_ERROR;
        }
        s->mask = SHARD_INITIAL_BUCKETS - 1;
    }
    return MOONLET_OK;
}

void shards_destroy(moonlet_master *m)
{
    if (!m->shards)
        return;
    for (uint32_t i = 0; i < m->nshards; i++) {
        struct shard *s = &m->shards[i];
        for (uint32_t b = 0; s->buckets && b <= s->mask; b++) {
            struct mobj *o = s->buckets[b];
            while (o) {
                struct mobj *next = o->next;
                mobj_free(m, o);
                o = next;
            }
        }
        free(s->buckets);
        pthread_mutex_destroy(&s->mu);
    }
    free(m->shards);
    m->shards = NULL;
}

struct mobj *mobj_new(moonlet_master *m, uint32_t tenant, uint64_t hash, const char *key,
                      uint32_t len, uint32_t nrep)
{
    struct mobj *o = moonlet_objslab_alloc(m->slab, mobj_bytes(len, nrep));
    if (!o)
        return NULL;
    o->nrep_cap = (uint8_t)nrep; /* the block size: mobj_free uses it */
    o->hash = hash;
    o->tenant = tenant;
    o->key_len = (uint16_t)len;
    o->nrep = (uint8_t)nrep;
    memcpy(mobj_key(o), key, len);
    return o;
}

struct mobj *shard_find_locked(struct shard *s, uint64_t hash, uint32_t tenant, const char *key,
                               uint32_t len)
{
    for (struct mobj *o = s->buckets[hash & s->mask]; o; o = o->next)
        if (o->hash == hash && o->tenant == tenant && o->key_len == len &&
            memcmp(mobj_key(o), key, len) == 0)
            return o;
    return NULL;
}

static void shard_grow_locked(struct shard *s)
{
    uint32_t nb = (s->mask + 1) * 2;
    struct mobj **nbk = calloc(nb, sizeof(*nbk));
    if (!nbk)
        return; /* keep the longer chains; still correct */
    for (uint32_t b = 0; b <= s->mask; b++) {
        struct mobj *o = s->buckets[b];
        while (o) {
            struct mobj *next = o->next;
            struct mobj **head = &nbk[o->hash & (nb - 1)];
            o->next = *head;
            *head = o;
            o = next;
        }
    }
    free(s->buckets);
    s->buckets = nbk;
    s->mask = nb - 1;
}

int shard_insert_locked(struct shard *s, struct mobj *o)
{
    if (s->count >= s->mask + 1 && s->mask < (1u << 30))
        shard_grow_locked(s);
    struct mobj **head = &s->buckets[o->hash & s->mask];
    o->next = *head;
    *head = o;
    s->count++;
    return MOONLET_OK;
}

void shard_unlink_locked(struct shard *s, struct mobj *o)
{
    struct mobj **pp = &s->buckets[o->hash & s->mask];
    while (*pp && *pp != o)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = o->next;
        s->count--;
    }
}

void shards_foreach(moonlet_master *m, shard_visit_fn fn, void *arg)
{
    bool go = true;
    for (uint32_t i = 0; i < m->nshards && go; i++) {
        struct shard *s = &m->shards[i];
        pthread_mutex_lock(&s->mu);
        for (uint32_t b = 0; b <= s->mask && go; b++) {
            struct mobj *o = s->buckets[b], *next;
            for (; o && go; o = next) {
                next = o->next; /* the visitor may free o */
                go = fn(m, s, o, arg);
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
}

void object_destroy_locked(moonlet_master *m, struct shard *s, struct mobj *o)
{
    shard_unlink_locked(s, o);
    /* An unfinished put's writer may still be sending: its ranges wait in
     * quarantine until its put deadline (after which no store node accepts
     * its writes) plus the grace.  A sealed object had every write
     * acknowledged before its PutEnd; its ranges go back at once, unless a
     * reader still holds a lease on it (only a forced Remove takes such an
     * object): then they wait until the lease ends, after which a reader's
     * own lease check refuses whatever it read (LEASE_EXPIRED), so no reader
     * gets bytes of an object placed there later. */
    uint64_t until = 0;
    if (o->state == OBJ_PENDING)
        until = o->lease_deadline + m->quarantine_grace_ns;
    else if (moonlet_lease_active(o->lease_deadline, moonlet_clock_now_ns()))
        until = o->lease_deadline;
    if (o->nrep)
        registry_release(m, o->size, mobj_reps(o), o->nrep, until);
    if (o->state == OBJ_PENDING)
        atomic_fetch_sub(&m->st.pending, 1);
    atomic_fetch_sub(&m->st.objects, 1);
    atomic_fetch_sub(&m->st.bytes, o->size);
    if (mobj_hard_pinned(o)) {
        atomic_fetch_sub(&m->st.hard_pinned, 1);
        atomic_fetch_sub(&m->st.hard_pinned_bytes, mobj_pinned_bytes(o));
    }
    uint32_t tenant = o->tenant;
    mobj_free(m, o);
    tenant_release(m, tenant); /* tenants.lock is a leaf */
}

#define BATCH_GROUP 32

struct batch_slot {
    uint64_t hash;
    uint32_t shard;
    uint32_t index; /* position in the request */
};

void shard_batch_lookup(moonlet_master *m, uint32_t tenant, const moonlet_str *keys, size_t n,
                        int32_t *results, uint64_t *hashes, batch_lookup_fn fn, void *arg)
{
    struct batch_slot g[BATCH_GROUP];
    struct mobj *heads[BATCH_GROUP];
    for (size_t base = 0; base < n; base += BATCH_GROUP) {
        size_t end = base + BATCH_GROUP < n ? base + BATCH_GROUP : n, cnt = 0;
        /* hash, and keep the group sorted by shard (insertion sort of <= 16) */
        for (size_t i = base; i < end; i++) {
            if (key_check(keys[i])) {
                results[i] = MOONLET_ERR_INVALID_KEY;
                continue;
            }
            uint64_t h = key_hash(tenant, keys[i].ptr, keys[i].len);
            if (hashes)
                hashes[i] = h;
            struct batch_slot sl = {.hash = h, .shard = shard_of(m, h), .index = (uint32_t)i};
            size_t pos = cnt++;
            while (pos > 0 && g[pos - 1].shard > sl.shard) {
                g[pos] = g[pos - 1];
                pos--;
            }
            g[pos] = sl;
        }
        for (size_t k = 0; k < cnt; k++)
            if (k == 0 || g[k].shard != g[k - 1].shard)
                pthread_mutex_lock(&m->shards[g[k].shard].mu);
        for (size_t k = 0; k < cnt; k++) {
            struct shard *s = &m->shards[g[k].shard];
            __builtin_prefetch(&s->buckets[g[k].hash & s->mask]);
        }
        for (size_t k = 0; k < cnt; k++) {
            struct shard *s = &m->shards[g[k].shard];
            heads[k] = s->buckets[g[k].hash & s->mask];
            if (heads[k]) {
                /* the header and the key: every line the compare will read */
                const char *p = (const char *)heads[k];
                const char *last = p + sizeof(struct mobj) + keys[g[k].index].len - 1;
                for (; p <= last; p += 64)
                    __builtin_prefetch(p);
                __builtin_prefetch(last);
            }
        }
        for (size_t k = 0; k < cnt; k++) {
            const moonlet_str *key = &keys[g[k].index];
            struct mobj *o = heads[k];
            while (o && !(o->hash == g[k].hash && o->tenant == tenant && o->key_len == key->len &&
                          memcmp(mobj_key(o), key->ptr, key->len) == 0))
                o = o->next;
            fn(arg, g[k].index, o);
        }
        for (size_t k = cnt; k-- > 0;)
            if (k == 0 || g[k].shard != g[k - 1].shard)
                pthread_mutex_unlock(&m->shards[g[k].shard].mu);
    }
}
