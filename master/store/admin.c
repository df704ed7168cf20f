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
 * The tenant listing (ListTenants) counts every shard's objects by tenant,
 * then names the tenants that hold any, in name order.
 *
 * Locks: guard shared -> one shard lock at a time.  Visitors of keys run
 * under the shard lock.  The tenant listing takes tenants.lock (read) alone,
 * before and after the shard walk, and visits under no lock.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "master_internal.h"
#include "tenant.h"
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

/* ---- tenants ----------------------------------------------------------------- */

struct tenant_count {
    uint32_t id; /* the tenant id counted in this slot (while keys > 0) */
    uint64_t keys, bytes;
    char *name;
    uint32_t name_len;
};

static int cmp_tenant_name(const void *a, const void *b)
{
    const struct tenant_count *x = a, *y = b;
    uint32_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n);
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

int moonlet_master_list_tenants(moonlet_master *m, uint32_t limit,
                                void (*visit)(void *arg, const moonlet_tenant_view *t), void *arg,
                                uint32_t *total)
{
    *total = 0;
    if (limit == 0 || limit > MOONLET_LIST_TENANTS_MAX_LIMIT)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_rwlock_rdlock(&m->tenants.lock);
    uint32_t nslots = m->tenants.n;
    pthread_rwlock_unlock(&m->tenants.lock);
    if (nslots == 0)
        return MOONLET_OK;
    struct tenant_count *c = calloc(nslots, sizeof(*c));
    if (!c)
        return MOONLET_ERR_INTERNAL_ERROR;
    /* Count by slot.  A tenant made after nslots was read is not listed; a
     * slot's tenant cannot change while it holds objects (each holds a
     * reference), so one slot counts one id. */
    pthread_rwlock_rdlock(&m->guard);
    for (uint32_t sh = 0; sh < m->nshards; sh++) {
        struct shard *s = &m->shards[sh];
        pthread_mutex_lock(&s->mu);
        for (uint32_t b = 0; b <= s->mask; b++)
            for (const struct mobj *o = s->buckets[b]; o; o = o->next) {
                uint32_t slot = o->tenant & 0xffffu;
                if (slot >= nslots || (c[slot].keys && c[slot].id != o->tenant))
                    continue;
                c[slot].id = o->tenant;
                c[slot].keys++;
                c[slot].bytes += o->size;
            }
        pthread_mutex_unlock(&s->mu);
    }
    pthread_rwlock_unlock(&m->guard);
    /* Names, copied under the lock (a slot freed since the walk is skipped). */
    uint32_t n = 0;
    int rc = MOONLET_OK;
    pthread_rwlock_rdlock(&m->tenants.lock);
    for (uint32_t i = 0; i < nslots && !rc; i++) {
        const struct tenant_slot *t = &m->tenants.slots[i];
        if (!c[i].keys || !t->name || t->id != c[i].id)
            continue;
        char *name = malloc(t->len ? t->len : 1);
        if (!name) {
            rc = MOONLET_ERR_INTERNAL_ERROR;
            break;
        }
        memcpy(name, t->name, t->len);
        c[n] = c[i];
        c[n].name = name;
        c[n].name_len = t->len;
        n++;
    }
    pthread_rwlock_unlock(&m->tenants.lock);
    if (!rc) {
        qsort(c, n, sizeof(*c), cmp_tenant_name);
        *total = n;
        for (uint32_t i = 0; i < n && i < limit; i++) {
            moonlet_tenant_view v = {.name = c[i].name, .name_len = c[i].name_len,
                                     .keys = c[i].keys, .bytes = c[i].bytes};
            visit(arg, &v);
        }
    }
    for (uint32_t i = 0; i < n; i++)
        free(c[i].name);
    free(c);
    return rc;
}
