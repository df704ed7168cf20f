/*
 * hmap.c - open-addressing (hash, value) table; see hmap.h.  No locks.
 */
#include "hmap.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

uint64_t hmap_str_hash(const char *p, size_t len)
{
    return XXH3_64bits(p, len);
}

void hmap_free(struct hmap *m)
{
    free(m->e);
    m->e = NULL;
    m->cap = m->n = 0;
}

static inline uint32_t home(const struct hmap *m, uint64_t h)
{
    /* the low bits pick shards and buckets elsewhere: mix before masking */
    return (uint32_t)((h * 0x9e3779b97f4a7c15ull) >> 32) & (m->cap - 1);
}

struct hent *hmap_find(const struct hmap *m, uint64_t h, hmap_eq_fn eq, const void *ctx)
{
    if (!m->cap)
        return NULL;
    for (uint32_t i = home(m, h);; i = (i + 1) & (m->cap - 1)) {
        struct hent *e = &m->e[i];
        if (!e->used)
            return NULL;
        if (e->h == h && (!eq || eq(ctx, e->v)))
            return e;
    }
}

struct str_ctx {
    moonlet_str s;
    hmap_key_fn key;
    const void *owner;
};

static bool str_eq(const void *ctx, uint32_t v)
{
    const struct str_ctx *c = ctx;
    moonlet_str k = c->key(c->owner, v);
    return k.ptr && k.len == c->s.len && memcmp(k.ptr, c->s.ptr, k.len) == 0;
}

struct hent *hmap_find_str(const struct hmap *m, uint64_t h, moonlet_str s, hmap_key_fn key,
                           const void *owner)
{
    struct str_ctx c = {s, key, owner};
    return hmap_find(m, h, str_eq, &c);
}

static void put(struct hmap *m, uint64_t h, uint32_t v)
{
    uint32_t i = home(m, h);
    while (m->e[i].used)
        i = (i + 1) & (m->cap - 1);
    m->e[i] = (struct hent){.h = h, .v = v, .used = 1};
    m->n++;
}

bool hmap_insert(struct hmap *m, uint64_t h, uint32_t v)
{
    if ((uint64_t)(m->n + 1) * 4 > (uint64_t)m->cap * 3) {
        uint32_t cap = m->cap ? m->cap * 2 : 16;
        if (cap < m->cap)
            return false;
        struct hent *ne = calloc(cap, sizeof(*ne));
        if (!ne)
            return false;
        struct hmap old = *m;
        m->e = ne;
        m->cap = cap;
        m->n = 0;
        for (uint32_t i = 0; i < old.cap; i++)
            if (old.e[i].used)
                put(m, old.e[i].h, old.e[i].v);
        free(old.e);
    }
    put(m, h, v);
    return true;
}

void hmap_remove(struct hmap *m, struct hent *e)
{
    uint32_t mask = m->cap - 1;
    uint32_t i = (uint32_t)(e - m->e);
    /* backward shift: move later entries of the run into the hole when
     * their home position does not lie cyclically in (hole, their slot] */
    for (uint32_t j = (i + 1) & mask;; j = (j + 1) & mask) {
        if (!m->e[j].used)
            break;
        uint32_t k = home(m, m->e[j].h);
        bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (stays)
            continue;
        m->e[i] = m->e[j];
        i = j;
    }
    m->e[i].used = 0;
    m->n--;
    if (m->n == 0) /* an emptied table gives its memory back */
        hmap_free(m);
}

struct hv {
    uint32_t v;
};
static bool eq_v(const void *ctx, uint32_t v) { return ((const struct hv *)ctx)->v == v; }

bool hmap_remove_hv(struct hmap *m, uint64_t h, uint32_t v)
{
    struct hv c = {v};
    struct hent *e = hmap_find(m, h, eq_v, &c);
    if (!e)
        return false;
    hmap_remove(m, e);
    return true;
}
