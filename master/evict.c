/*
 * evict.c - eviction under memory pressure, and the reaper of stale puts.
 *
 * A pass evicts about `ratio` of the objects, choosing those whose lease
 * deadline is earliest.  PutEnd dates a new object's (already expired)
 * deadline at its seal time and every read pushes it to now + TTL, so the
 * order is least recently written or read first.  It never evicts an
 * object with an unexpired lease or a put in progress.  Soft-pinned objects
 * are spared by the first round and considered only by a second round when
 * the first could not reach the target.
 *
 * A round works in two steps so that no lock is held across shards:
 *   1. collect the deadlines of every eligible object (one shard at a time)
 *      and find the target-th smallest: the threshold;
 *   2. per shard, evict eligible objects with a deadline below the threshold,
 *      and at the threshold while the quota lasts.  Eligibility is checked
 *      again under the shard lock, so a lease granted in between wins.
 *
 * Locks: evict_mu (order 0) for the whole pass, the guard shared, then one
 * shard lock at a time (object_destroy_locked adds registry.mu).
 */
#include <inttypes.h>
#include <stdlib.h>

#include "lease.h"
#include "log.h"
#include "master_internal.h"

static bool evictable(const struct mobj *o, uint64_t now, bool include_pinned)
{
    if (o->state != OBJ_COMPLETE || moonlet_lease_active(o->lease_deadline, now))
        return false;
    return include_pinned || !moonlet_lease_active(o->soft_pin_deadline, now);
}

struct deadlines {
    uint64_t *v;
    size_t n, cap;
};

static void deadlines_push(struct deadlines *d, uint64_t x)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 1024;
        uint64_t *v = realloc(d->v, cap * sizeof(*v));
        if (!v)
            return; /* a smaller sample only makes the threshold coarser */
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = x;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The deadline at or below which `target` eligible objects lie; UINT64_MAX
 * when fewer than target are eligible. */
static uint64_t threshold(moonlet_master *m, uint64_t target, uint64_t now, bool include_pinned)
{
    struct deadlines d = {0};
    for (uint32_t i = 0; i < m->nshards; i++) {
        struct shard *s = &m->shards[i];
        pthread_mutex_lock(&s->mu);
        for (uint32_t b = 0; b <= s->mask; b++)
            for (struct mobj *o = s->buckets[b]; o; o = o->next)
                if (evictable(o, now, include_pinned))
                    deadlines_push(&d, o->lease_deadline);
        pthread_mutex_unlock(&s->mu);
    }
    uint64_t t = UINT64_MAX;
    if (d.n > 0) {
        qsort(d.v, d.n, sizeof(*d.v), cmp_u64);
        t = d.v[(target < d.n ? target : d.n) - 1];
    }
    free(d.v);
    return t;
}

static uint64_t evict_round(moonlet_master *m, uint64_t target, bool include_pinned)
{
    uint64_t now = moonlet_clock_now_ns();
    uint64_t t = threshold(m, target, now, include_pinned), evicted = 0;
    if (t == UINT64_MAX && target > 0)
        t = UINT64_MAX - 1; /* fewer eligible than the target: take them all */
    for (uint32_t i = 0; i < m->nshards && evicted < target; i++) {
        struct shard *s = &m->shards[i];
        pthread_mutex_lock(&s->mu);
        for (uint32_t b = 0; b <= s->mask && evicted < target; b++) {
            struct mobj *o = s->buckets[b], *next;
            for (; o && evicted < target; o = next) {
                next = o->next;
                if (!evictable(o, now, include_pinned) || o->lease_deadline > t)
                    continue;
                object_destroy_locked(m, s, o);
                evicted++;
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
    return evicted;
}

uint64_t evict_pass(moonlet_master *m, double ratio)
{
    pthread_mutex_lock(&m->evict_mu);
    pthread_rwlock_rdlock(&m->guard);
    uint64_t objects = atomic_load(&m->st.objects);
    uint64_t target = (uint64_t)((double)objects * ratio + 0.999999);
    if (target == 0 && objects > 0)
        target = 1;
    uint64_t evicted = evict_round(m, target, false);
    if (evicted < target)
        evicted += evict_round(m, target - evicted, true);
    pthread_rwlock_unlock(&m->guard);
    pthread_mutex_unlock(&m->evict_mu);

    atomic_fetch_add(&m->st.eviction_passes, 1);
    atomic_fetch_add(&m->st.evictions, evicted);
    if (evicted)
        ML_DEBUG("master", "eviction pass: %" PRIu64 " of %" PRIu64 " objects evicted (target %" PRIu64 ")",
                 evicted, objects, target);
    return evicted;
}

uint64_t moonlet_master_evict_now(moonlet_master *m, double ratio)
{
    return evict_pass(m, ratio);
}

struct reap_args {
    uint64_t now, reaped;
};

static bool reap_visit(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    struct reap_args *r = arg;
    if (o->state == OBJ_PENDING && o->lease_deadline <= r->now) {
        object_destroy_locked(m, s, o);
        r->reaped++;
    }
    return true;
}

void reap_stale_puts(moonlet_master *m)
{
    struct reap_args r = {.now = moonlet_clock_now_ns()};
    pthread_rwlock_rdlock(&m->guard);
    shards_foreach(m, reap_visit, &r);
    pthread_rwlock_unlock(&m->guard);
    if (r.reaped) {
        atomic_fetch_add(&m->st.put_timeouts, r.reaped);
        ML_WARN("master", "revoked %" PRIu64 " puts that did not end within %" PRIu64 " ms", r.reaped,
                m->cfg.put_timeout_ms);
    }
}
