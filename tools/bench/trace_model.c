/* trace_model.c - the trace replay's cache model without a cluster; see
 * trace_model.h. */
#include "trace_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Blocks covered by the checkpoint an engine stores after prefilling q: the
 * last multiple of kda_every within the prompt's full blocks (0: none). */
uint32_t end_checkpoint_blocks(const treq *q, uint32_t every)
{
    uint64_t full = q->input / BLOCK_TOKENS;
    if (full > q->n)
        full = q->n;
    return (uint32_t)(full / every * every);
}

/* Keys are named by content: a block by its prefix hash, a checkpoint by the
 * prefix hash of its last block. */
int trace_key(void *ctx, const moonlet_k3_key_id *id, char *buf, size_t cap)
{
    const uint64_t *ids = ctx;
    if (id->kind == MOONLET_K3_KEY_KV)
        return snprintf(buf, cap, "kv/%llu", (unsigned long long)ids[id->block]);
    return snprintf(buf, cap, "kda/%llu/r%u",
                    (unsigned long long)ids[id->position / BLOCK_TOKENS - 1], id->rank);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

size_t count_unique(uint64_t *v, size_t n)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof(*v), cmp_u64);
    size_t u = 1;
    for (size_t i = 1; i < n; i++)
        u += v[i] != v[i - 1];
    return u;
}


static uint64_t round64(uint64_t x)
{
    return (x + 63) & ~(uint64_t)63; /* the master's allocation granule */
}

/* Every distinct object the replay can ever put. */
int working_set_of(const trace *t, const trace_model *o, working_set *ws)
{
    uint64_t *v = malloc((t->nids > t->n ? t->nids : t->n) * sizeof(*v) + 1);
    if (!v)
        return -1;
    memcpy(v, t->ids, t->nids * sizeof(*v));
    ws->kv_objects = count_unique(v, t->nids);
    size_t k = 0;
    for (size_t i = 0; i < t->n; i++) {
        uint32_t e = end_checkpoint_blocks(&t->r[i], o->kda_every);
        if (e)
            v[k++] = t->ids[t->r[i].off + e - 1];
    }
    ws->checkpoints = count_unique(v, k);
    free(v);
    ws->bytes = ws->kv_objects * round64(o->kv_bytes) +
                ws->checkpoints * (uint64_t)o->ranks * round64(o->kda_bytes);
    return 0;
}

/* ---- the infinite-cache reference ------------------------------------------------- */


int idset_init(idset *s, size_t expected)
{
    size_t cap = 1024;
    while (cap < expected * 2)
        cap *= 2;
    s->slot = calloc(cap, sizeof(*s->slot));
    s->mask = cap - 1;
    return s->slot ? 0 : -1;
}

static size_t idset_pos(const idset *s, uint64_t id)
{
    size_t i = (size_t)((id + 1) * 0x9E3779B97F4A7C15ull) & s->mask;
    while (s->slot[i] && s->slot[i] != id + 1)
        i = (i + 1) & s->mask;
    return i;
}

bool idset_has(const idset *s, uint64_t id)
{
    return s->slot[idset_pos(s, id)] != 0;
}

void idset_add(idset *s, uint64_t id)
{
    s->slot[idset_pos(s, id)] = id + 1;
}

/* The hit ratios of a cache that never evicts, same model as the replay:
 * the bound any eviction policy is measured against. */
int reference_hits(const trace *t, const trace_model *o, const working_set *ws,
                   double *kv_ratio, double *kda_ratio)
{
    idset kv, ck;
    if (idset_init(&kv, ws->kv_objects) || idset_init(&ck, ws->checkpoints + 1)) {
        free(kv.slot);
        return -1;
    }
    uint64_t blocks = 0, kv_hit = 0, kda_hit = 0;
    for (size_t i = 0; i < t->n; i++) {
        const treq *q = &t->r[i];
        const uint64_t *ids = t->ids + q->off;
        uint32_t k = 0, res = 0;
        while (k < q->n && idset_has(&kv, ids[k]))
            k++;
        for (uint32_t p = o->kda_every; p <= k; p += o->kda_every)
            if ((uint64_t)p * BLOCK_TOKENS < q->input && idset_has(&ck, ids[p - 1]))
                res = p;
        blocks += q->n;
        kv_hit += k;
        kda_hit += res;
        for (uint32_t b = 0; b < q->n; b++)
            idset_add(&kv, ids[b]);
        uint32_t e = end_checkpoint_blocks(q, o->kda_every);
        if (e)
            idset_add(&ck, ids[e - 1]);
    }
    free(kv.slot);
    free(ck.slot);
    *kv_ratio = blocks ? (double)kv_hit / (double)blocks : 0;
    *kda_ratio = blocks ? (double)kda_hit / (double)blocks : 0;
    return 0;
}
