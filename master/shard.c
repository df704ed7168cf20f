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
