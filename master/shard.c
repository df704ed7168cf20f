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
 * caller holds; object_destroy_locked also takes registry.mu (order 3).
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
                free(o);
                o = next;
            }
        }
        free(s->buckets);
        pthread_mutex_destroy(&s->mu);
    }
    free(m->shards);
    m->shards = NULL;
}

struct mobj *mobj_new(uint32_t tenant, uint64_t hash, const char *key, uint32_t len, uint32_t nrep)
{
    struct mobj *o = calloc(1, sizeof(*o) + nrep * sizeof(struct mrep) + len);
    if (!o)
        return NULL;
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

void object_destroy_locked(moonlet_master *m, struct shard *s, struct mobj *o)
{
    shard_unlink_locked(s, o);
    if (o->nrep)
        registry_release(m, o->size, o->rep, o->nrep);
    if (o->state == OBJ_PENDING)
        atomic_fetch_sub(&m->st.pending, 1);
    atomic_fetch_sub(&m->st.objects, 1);
    atomic_fetch_sub(&m->st.bytes, o->size);
    free(o);
}
