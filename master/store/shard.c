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
 * A pure table: it stores, finds and unlinks objects, and knows nothing of
 * segments or tenants (object.c destroys objects, unmount.c strips replicas).
 *
 * Locks: functions named *_locked run under the shard's mutex, which the
 * caller holds; shards_foreach takes each shard's mutex in turn.  Nothing
 * here takes another lock (visitors may, as their callers allow).
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

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
    /* Adaptive: a shard lock is mostly held for a batch group's lookups, a
     * microsecond or less, so a thread that finds it taken spins briefly
     * instead of sleeping on the futex (a sleep and its wake-up cost tens of
     * microseconds on a VM); glibc bounds the spin, so a long hold (a scan
     * of the shard) still puts the waiter to sleep. */
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    for (uint32_t i = 0; i < m->nshards; i++) {
        struct shard *s = &m->shards[i];
        memset(s, 0, sizeof(*s));
        pthread_mutex_init(&s->mu, &attr);
        s->buckets = calloc(SHARD_INITIAL_BUCKETS, sizeof(*s->buckets));
        if (!s->buckets) {
            m->nshards = i + 1; /* destroy what exists */
            pthread_mutexattr_destroy(&attr);
            return MOONLET_ERR_INTERNAL_ERROR;
        }
        s->mask = SHARD_INITIAL_BUCKETS - 1;
    }
    pthread_mutexattr_destroy(&attr);
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

struct mobj *shard_chain_find(struct mobj *o, uint64_t hash, uint32_t tenant, const char *key,
                              uint32_t len)
{
    for (; o; o = o->next)
        if (o->hash == hash && o->tenant == tenant && o->key_len == len &&
            memcmp(mobj_key(o), key, len) == 0)
            return o;
    return NULL;
}

struct mobj *shard_find_locked(struct shard *s, uint64_t hash, uint32_t tenant, const char *key,
                               uint32_t len)
{
    return shard_chain_find(s->buckets[hash & s->mask], hash, tenant, key, len);
}

struct mobj *shard_head_locked(const struct shard *s, uint64_t hash, uint32_t key_len)
{
    struct mobj *o = s->buckets[hash & s->mask];
    if (o) { /* the header and the key: every line a compare will read */
        const char *p = (const char *)o;
        const char *last = p + sizeof(struct mobj) + key_len - 1;
        for (; p <= last; p += 64)
            __builtin_prefetch(p);
        __builtin_prefetch(last);
    }
    return o;
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
    /* atomic for prefetch_slot_unlocked, the one reader without the lock */
    __atomic_store_n(&s->buckets, nbk, __ATOMIC_RELAXED);
    __atomic_store_n(&s->mask, nb - 1, __ATOMIC_RELAXED);
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

void shards_foreach_range(moonlet_master *m, uint32_t from, uint32_t to, shard_visit_fn fn,
                         void *arg)
{
    bool go = true;
    for (uint32_t i = from; i < to && i < m->nshards && go; i++) {
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

void shards_foreach(moonlet_master *m, shard_visit_fn fn, void *arg)
{
    shards_foreach_range(m, 0, m->nshards, fn, arg);
}

void shard_foreach_hash_locked(moonlet_master *m, struct shard *s, uint64_t hash,
                               shard_visit_fn fn, void *arg)
{
    struct mobj *o = s->buckets[hash & s->mask], *next;
    for (; o; o = next) {
        next = o->next; /* the visitor may free o */
        if (o->hash == hash && !fn(m, s, o, arg))
            return;
    }
}

/* shard_batch_lookup takes keys a window at a time: hashed, sorted by
 * shard, their bucket slots prefetched without any lock.  It then looks the
 * window up in groups of LOCK_GROUP, each holding its distinct shard locks
 * together while the objects are prefetched and compared, so the cache
 * misses of a group overlap.  The window keeps many slot misses in flight;
 * the group keeps few locks held: with groups of 32 a loop held about 31 of
 * the 1,024 locks at a time, and two loops serving BatchExistKey(640)
 * collided in most groups; the loser slept on the futex and the winner paid
 * its wake-up (about a third of the master's CPU under 8 callers,
 * docs/benchmarks.md).  Groups of 16 collide in about a fifth of the
 * groups, and the adaptive locks (shards_init) make that a short spin; they
 * keep enough object misses in flight that a lookup at 1,000,000 objects
 * costs what it did with 32 (moonlet-bench rpc). */
#define BATCH_WINDOW 32
#define LOCK_GROUP 16

struct batch_slot {
    uint64_t hash;
    uint32_t shard;
    uint32_t index; /* position in the request */
};

/* The bucket slot of a hash, read without the shard lock, for a prefetch
 * only: a concurrent grow may pair a new array with an old mask or the
 * reverse, and a prefetch of a wrong address does no harm (it never
 * faults).  shard_grow_locked stores both atomically for this reader. */
void shard_prefetch_slot(const moonlet_master *m, uint64_t hash)
{
    const struct shard *s = &m->shards[shard_of(m, hash)];
    struct mobj **b = __atomic_load_n(&s->buckets, __ATOMIC_RELAXED);
    uint32_t mask = __atomic_load_n(&s->mask, __ATOMIC_RELAXED);
    __builtin_prefetch(&b[hash & mask]);
}

/* Looks up g[0..cnt) (sorted by shard) under their shard locks. */
static void lookup_group(moonlet_master *m, uint32_t tenant, const moonlet_str *keys,
                         const struct batch_slot *g, size_t cnt, batch_lookup_fn fn, void *arg)
{
    struct mobj *heads[LOCK_GROUP];
    for (size_t k = 0; k < cnt; k++)
        if (k == 0 || g[k].shard != g[k - 1].shard)
            pthread_mutex_lock(&m->shards[g[k].shard].mu);
    for (size_t k = 0; k < cnt; k++)
        heads[k] = shard_head_locked(&m->shards[g[k].shard], g[k].hash, keys[g[k].index].len);
    for (size_t k = 0; k < cnt; k++) {
        const moonlet_str *key = &keys[g[k].index];
        fn(arg, g[k].index, shard_chain_find(heads[k], g[k].hash, tenant, key->ptr, key->len));
    }
    for (size_t k = cnt; k-- > 0;)
        if (k == 0 || g[k].shard != g[k - 1].shard)
            pthread_mutex_unlock(&m->shards[g[k].shard].mu);
}

void shard_batch_lookup(moonlet_master *m, uint32_t tenant, const moonlet_str *keys, size_t n,
                        int32_t *results, uint64_t *hashes, batch_lookup_fn fn, void *arg)
{
    struct batch_slot g[BATCH_WINDOW];
    for (size_t base = 0; base < n; base += BATCH_WINDOW) {
        size_t end = base + BATCH_WINDOW < n ? base + BATCH_WINDOW : n, cnt = 0;
        /* hash, and keep the window sorted by shard (insertion sort) */
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
            shard_prefetch_slot(m, g[k].hash);
        for (size_t k = 0; k < cnt; k += LOCK_GROUP)
            lookup_group(m, tenant, keys, g + k, cnt - k < LOCK_GROUP ? cnt - k : LOCK_GROUP, fn,
                         arg);
    }
}
