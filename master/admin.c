/*
 * admin.c - inspection of keys for operators: paged key listing and the
 * detail of one key.
 *
 * Listing millions of keys must neither build one huge reply nor hold a lock
 * for long.  Pages therefore walk the shards in order and, inside a shard,
 * the tenant's objects in increasing hash order; the cursor is
 * "<shard>:<last hash>" and the next page resumes strictly after it.  The
 * order does not depend on bucket layout, so a page boundary survives table
 * growth, inserts and removals (keys added behind the cursor are simply not
 * seen by this listing).
 *
 * Locks: guard shared -> one shard lock at a time.  Visitors run under the
 * shard lock.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "master_internal.h"
#include "moonlet/error.h"

static void key_view_fill(const struct mobj *o, uint64_t now, moonlet_key_view *v)
{
    v->key = o->key;
    v->key_len = o->key_len;
    v->size = o->size;
    v->complete = o->state == OBJ_COMPLETE;
    v->replicas = o->nrep;
    v->readable_replicas = 0;
    for (uint32_t k = 0; k < o->nrep; k++)
        v->readable_replicas += v->complete && mobj_creps(o)[k].status == MOONLET_REPLICA_COMPLETE;
    v->lease_remaining_ms = v->complete ? moonlet_lease_remaining_ms(o->lease_deadline, now) : 0;
    v->hard_pinned = mobj_hard_pinned(o);
    v->soft_pin_remaining_ms = v->complete && !v->hard_pinned
                                   ? moonlet_lease_remaining_ms(o->soft_pin_deadline, now) : 0;
}

/* Cursor "<shard>:<hex hash>" resumes after that hash; "<shard>:" at the shard's start. */
static int parse_cursor(moonlet_str c, uint32_t nshards, uint32_t *shard, uint64_t *after,
                        bool *has_after)
{
    *shard = 0;
    *has_after = false;
    if (c.len == 0)
        return MOONLET_OK;
    char buf[MOONLET_CURSOR_BYTES];
    if (c.len >= sizeof(buf))
        return MOONLET_ERR_INVALID_PARAMS;
    memcpy(buf, c.ptr, c.len);
    buf[c.len] = 0;
    char *end;
    unsigned long sh = strtoul(buf, &end, 10);
    if (end == buf || *end != ':' || sh >= nshards)
        return MOONLET_ERR_INVALID_PARAMS;
    *shard = (uint32_t)sh;
    const char *h = end + 1;
    if (*h == 0)
        return MOONLET_OK;
    *after = strtoull(h, &end, 16);
    if (*end != 0)
        return MOONLET_ERR_INVALID_PARAMS;
    *has_after = true;
    return MOONLET_OK;
}

static int cmp_obj_hash(const void *a, const void *b)
{
    const struct mobj *x = *(struct mobj *const *)a, *y = *(struct mobj *const *)b;
    return x->hash < y->hash ? -1 : x->hash > y->hash;
}

int moonlet_master_list_keys(moonlet_master *m, moonlet_str tenant, moonlet_str prefix,
                             moonlet_str cursor, uint32_t limit,
                             void (*visit)(void *arg, const moonlet_key_view *k), void *arg,
                             char next_cursor[MOONLET_CURSOR_BYTES])
{
    next_cursor[0] = 0;
    if (limit == 0 || limit > 10000 || prefix.len > MOONLET_MAX_KEY_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    uint32_t tid, shard;
    uint64_t after = 0;
    bool has_after;
    int rc = tenant_lookup(m, tenant, &tid);
    if (!rc)
        rc = parse_cursor(cursor, m->nshards, &shard, &after, &has_after);
    if (rc || tid == MOONLET_NO_TENANT)
        return rc;

    struct mobj **scratch = NULL;
    size_t cap = 0;
    uint32_t emitted = 0;
    uint64_t now = moonlet_clock_now_ns();
    pthread_rwlock_rdlock(&m->guard);
    for (; shard < m->nshards && emitted < limit; shard++, has_after = false) {
        struct shard *s = &m->shards[shard];
        pthread_mutex_lock(&s->mu);
        if (cap < s->count) {
            free(scratch);
            cap = s->count;
            scratch = malloc(cap * sizeof(*scratch));
            if (!scratch) {
                pthread_mutex_unlock(&s->mu);
                rc = MOONLET_ERR_INTERNAL_ERROR;
                break;
            }
        }
        size_t n = 0;
        for (uint32_t b = 0; b <= s->mask; b++)
            for (struct mobj *o = s->buckets[b]; o; o = o->next)
                if (o->tenant == tid && (!has_after || o->hash > after) &&
                    o->key_len >= prefix.len &&
                    (prefix.len == 0 || memcmp(o->key, prefix.ptr, prefix.len) == 0))
                    scratch[n++] = o;
        if (n > 1)
            qsort(scratch, n, sizeof(*scratch), cmp_obj_hash);
        size_t i = 0;
        for (; i < n && emitted < limit; i++, emitted++) {
            moonlet_key_view v;
            key_view_fill(scratch[i], now, &v);
            visit(arg, &v);
        }
        if (emitted == limit && i < n)
            snprintf(next_cursor, MOONLET_CURSOR_BYTES, "%u:%" PRIx64, shard,
                     scratch[i - 1]->hash);
        else if (emitted == limit && shard + 1 < m->nshards)
            snprintf(next_cursor, MOONLET_CURSOR_BYTES, "%u:", shard + 1);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_rwlock_unlock(&m->guard);
    free(scratch);
    return rc;
}

int moonlet_master_inspect_key(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                               moonlet_key_view *summary, moonlet_replica_visitor visit, void *arg)
{
    int rc = key_check(key);
    uint32_t tid;
    if (!rc)
        rc = tenant_lookup(m, tenant, &tid);
    if (rc)
        return rc;
    if (tid == MOONLET_NO_TENANT)
        return MOONLET_ERR_OBJECT_NOT_FOUND;
    uint64_t h = key_hash(tid, key.ptr, key.len);
    struct shard *s = &m->shards[shard_of(m, h)];
    pthread_rwlock_rdlock(&m->guard);
    pthread_mutex_lock(&s->mu);
    struct mobj *o = shard_find_locked(s, h, tid, key.ptr, key.len);
    if (!o) {
        rc = MOONLET_ERR_OBJECT_NOT_FOUND;
    } else {
        key_view_fill(o, moonlet_clock_now_ns(), summary);
        for (uint32_t k = 0; visit && k < o->nrep; k++) {
            moonlet_replica_view v;
            replica_view_fill(m, o, &mobj_reps(o)[k], &v);
            visit(arg, &v);
        }
    }
    pthread_mutex_unlock(&s->mu);
    pthread_rwlock_unlock(&m->guard);
    return rc;
}
