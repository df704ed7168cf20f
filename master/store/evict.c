/*
 * evict.c - eviction under memory pressure (demoting to the disk tier when one
 * is mounted), and the reaper of stale puts.
 *
 * A pass evicts about `ratio` of the objects, choosing those whose lease
 * deadline is earliest.  PutEnd dates a new object's (already expired)
 * deadline at its seal time and every read pushes it to now + TTL, so the
 * order is least recently written or read first.  It never evicts an
 * object with an unexpired lease or a put in progress.  Soft-pinned objects
 * are spared by the first round and considered only by a second round when
 * the first could not reach the target.  Hard-pinned objects (a pin whose
 * deadline is MOBJ_HARD_PIN) are never eligible, in either round or in
 * evict_for_space, where their ranges break a run like a leased object's;
 * only Remove takes them.  Their bytes are capped at PutStart
 * (cfg.hard_pin_max_ratio of the capacity) so the rest stays evictable.
 *
 * A round works in two steps so that no lock is held across shards:
 *   1. collect the deadlines of every eligible object (one shard at a time)
 *      and find the target-th smallest: the threshold;
 *   2. per shard, evict eligible objects with a deadline below the threshold,
 *      and at the threshold while the quota lasts.  Eligibility is checked
 *      again under the shard lock, so a lease granted in between wins.
 *
 * PutStart that finds no space does not run such a pass: evict_for_space
 * evicts for that request's space only.  Objects count for nothing there;
 * contiguity does.  It snapshots every replica's range (owner, evictable or
 * not) and every free extent, and on each segment large enough finds the
 * cheapest run of adjacent free and evictable ranges spanning the rounded
 * size (cost: bytes evicted; ranges of leased objects or puts in progress
 * break a run, pinned ones too unless unpinned runs cannot be found on
 * enough segments).  It then evicts exactly the owners in the nrep cheapest
 * runs, each re-checked under its shard lock.  With no such runs it evicts
 * nothing: the put fails without destroying the cache.
 *
 * With a disk tier (disk segments mounted), eviction from DRAM demotes:
 * a pass hands each victim to repair_demote_locked (repair.c), which swaps
 * in a copy made ahead or queues a copy (the victim counts as evicted;
 * its DRAM goes when the copy is durable), or declines (a full queue, no
 * room) and the victim is destroyed as before.  evict_for_space swaps in
 * copies made ahead and destroys the rest: a put's space never waits for
 * a disk.  Objects held by the disk tier are not DRAM's to evict; the disk
 * has its own eviction for a demotion's room (evict_disk_for_space: the
 * same run search over disk extents).  demote_ahead_pass queues copies of
 * the coldest DRAM objects ahead of eviction.
 *
 * Locks: evict_mu (order 0) for the whole pass, the guard shared, then one
 * shard lock at a time (object_destroy_locked adds registry.mu);
 * evict_for_space also takes registry.mu alone to list free extents.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "grow.h"
#include "lease.h"
#include "destroy.h"
#include "evict.h"
#include "log.h"
#include "master_internal.h"
#include "repair.h"

static bool evictable(const struct mobj *o, uint64_t now, bool include_pinned)
{
    if (o->state != OBJ_COMPLETE || moonlet_lease_active(o->lease_deadline, now) ||
        mobj_hard_pinned(o))
        return false;
    return include_pinned || !moonlet_lease_active(o->soft_pin_deadline, now);
}

/* Eligible for eviction from DRAM: evictable, and in DRAM. */
static bool dram_evictable(const struct mobj *o, uint64_t now, bool include_pinned)
{
    return evictable(o, now, include_pinned) && !mobj_on_disk(o);
}

/* The objects in DRAM: those the disk tier holds are not eviction's. */
static uint64_t dram_objects(moonlet_master *m)
{
    uint64_t objects = atomic_load(&m->st.objects), on_disk = repair_disk_objects(m);
    return objects > on_disk ? objects - on_disk : 0;
}

/* Eviction from DRAM: a sealed object in DRAM (not one the disk tier
 * holds) is demoted when a disk tier is mounted and the demotion queue has
 * room (repair_demote_locked: its DRAM ranges are freed once the disk copy
 * is durable), else destroyed.  Returns whether it counts as evicted.
 * Under its shard lock. */
static bool evict_locked(moonlet_master *m, struct shard *s, struct mobj *o)
{
    int d = repair_demote_locked(m, o);
    if (d == DEMOTE_QUEUED || d == DEMOTE_SWAPPED)
        return true;
    if (d == DEMOTE_BUSY) /* a repair or its demotion is queued or runs: not now */
        return false;
    object_destroy_locked(m, s, o);
    return true;
}

struct deadlines {
    uint64_t *v;
    uint32_t n, cap;
};

static void deadlines_push(struct deadlines *d, uint64_t x)
{
    uint64_t *v = moonlet_grow(d->v, d->n, &d->cap, 1024, sizeof(*v));
    if (!v)
        return; /* a smaller sample only makes the threshold coarser */
    d->v = v;
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
                if (dram_evictable(o, now, include_pinned))
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
                if (!dram_evictable(o, now, include_pinned) || o->lease_deadline > t)
                    continue;
                evicted += evict_locked(m, s, o);
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
    uint64_t objects = dram_objects(m);
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

uint64_t demote_ahead_pass(moonlet_master *m)
{
    moonlet_master_stats st;
    repair_stats(m, &st);
    uint64_t want = (uint64_t)((double)dram_objects(m) * m->cfg.demote_ahead_ratio);
    uint64_t have = st.demotions_staged + st.demotions_queued;
    if (want <= have)
        return 0;
    uint64_t queued = 0, now = moonlet_clock_now_ns();
    pthread_mutex_lock(&m->evict_mu);
    pthread_rwlock_rdlock(&m->guard);
    /* The coldest `want` (those with a copy or one queued among them). */
    uint64_t t = threshold(m, want, now, false);
    bool full = false; /* the queue or the disk's share for copies ahead */
    for (uint32_t i = 0; i < m->nshards && !full && have + queued < want; i++) {
        struct shard *s = &m->shards[i];
        pthread_mutex_lock(&s->mu);
        for (uint32_t b = 0; b <= s->mask && !full && have + queued < want; b++)
            for (struct mobj *o = s->buckets[b]; o && !full && have + queued < want;
                 o = o->next) {
                if (!dram_evictable(o, now, false) || o->lease_deadline > t)
                    continue;
                int d = repair_demote_ahead_locked(m, o);
                full = d == DEMOTE_NONE;
                queued += d == DEMOTE_QUEUED;
            }
        pthread_mutex_unlock(&s->mu);
    }
    pthread_rwlock_unlock(&m->guard);
    pthread_mutex_unlock(&m->evict_mu);
    return queued;
}

uint64_t moonlet_master_evict_now(moonlet_master *m, double ratio)
{
    return evict_pass(m, ratio);
}

/* ---- eviction for one request's space ------------------------------------------ */

enum { RUN_FREE = 0, RUN_EVICT = 1, RUN_PINNED = 2, RUN_BLOCKED = 3 };

/* A range of a segment as the run search sees it. */
struct run_item {
    uint64_t off, len;
    struct mobj *obj;   /* RUN_EVICT / RUN_PINNED: the owner (re-checked before eviction) */
    uint64_t hash;
    uint32_t slot;
    uint8_t kind;
};

struct run_items {
    struct run_item *v;
    uint32_t n, cap;
    bool oom;
    bool disk;          /* the disk tier's segments, else DRAM's */
    uint64_t min_seg;   /* only segments of at least this size matter */
    uint64_t now;
};

static void run_push(struct run_items *it, struct run_item x)
{
    struct run_item *v = moonlet_grow(it->v, it->n, &it->cap, 1024, sizeof(*v));
    if (!v) {
        it->oom = true;
        return;
    }
    it->v = v;
    it->v[it->n++] = x;
}

static bool run_collect_visit(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    struct run_items *it = arg;
    (void)s;
    uint8_t kind = RUN_BLOCKED;
    if (evictable(o, it->now, false))
        kind = RUN_EVICT;
    else if (evictable(o, it->now, true))
        kind = RUN_PINNED;
    for (uint32_t k = 0; k < o->nrep; k++) {
        const struct mrep *rp = &mobj_reps(o)[k];
        if ((rp->disk_hdr != 0) != it->disk)
            continue;
        run_push(it, (struct run_item){.off = rp->offset, .len = mrep_len(rp, o->size), .obj = o,
                                       .hash = o->hash, .slot = rp->seg, .kind = kind});
    }
    return !it->oom;
}

static void run_collect_free(void *arg, uint32_t slot, uint64_t off, uint64_t len)
{
    run_push(arg, (struct run_item){.off = off, .len = len, .slot = slot, .kind = RUN_FREE});
}

static int cmp_run_item(const void *a, const void *b)
{
    const struct run_item *x = a, *y = b;
    if (x->slot != y->slot)
        return x->slot < y->slot ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* The cheapest run of one segment: items [lo, hi) of that slot.  A run is a
 * sequence of adjacent items, none blocked (nor pinned unless allowed), whose
 * span is at least len; its cost is the bytes it evicts.  Returns false when
 * the segment has none. */
static bool best_run(const struct run_item *v, size_t lo, size_t hi, uint64_t len,
                     bool allow_pinned, size_t *first, size_t *last, uint64_t *cost)
{
    bool found = false;
    size_t l = lo;
    uint64_t sum = 0;
    for (size_t r = lo; r < hi; r++) {
        bool usable = v[r].kind == RUN_FREE || v[r].kind == RUN_EVICT ||
                      (allow_pinned && v[r].kind == RUN_PINNED);
        /* Overlaps mean the two snapshots disagree: do not bridge them. */
        bool adjacent = r > l && v[r].off == v[r - 1].off + v[r - 1].len;
        if (!usable) {
            l = r + 1;
            sum = 0;
            continue;
        }
        if (r > l && !adjacent) {
            l = r;
            sum = 0;
        }
        sum += v[r].kind == RUN_FREE ? 0 : v[r].len;
        /* Drop items from the left while the rest still spans len. */
        while (l < r && v[r].off + v[r].len - v[l + 1].off >= len) {
            sum -= v[l].kind == RUN_FREE ? 0 : v[l].len;
            l++;
        }
        if (v[r].off + v[r].len - v[l].off >= len && (!found || sum < *cost)) {
            found = true;
            *first = l;
            *last = r;
            *cost = sum;
        }
    }
    return found;
}

struct seg_run {
    size_t first, last;
    uint64_t cost;
};

static int cmp_seg_run(const void *a, const void *b)
{
    const struct seg_run *x = a, *y = b;
    return x->cost < y->cost ? -1 : x->cost > y->cost;
}

/* Evicts the owner of item x if it is still there and still evictable. */
static bool evict_item(moonlet_master *m, const struct run_item *x, uint64_t now, bool allow_pinned)
{
    struct shard *s = &m->shards[shard_of(m, x->hash)];
    bool done = false;
    pthread_mutex_lock(&s->mu);
    for (struct mobj *o = s->buckets[x->hash & s->mask]; o; o = o->next) {
        if (o != x->obj)
            continue;
        bool here = false;
        for (uint32_t k = 0; k < o->nrep; k++)
            here |= mobj_reps(o)[k].seg == x->slot && mobj_reps(o)[k].offset == x->off;
        if (here && o->hash == x->hash && evictable(o, now, allow_pinned)) {
            /* copied to disk ahead: its DRAM goes, the object stays */
            if (!repair_swap_staged_locked(m, o))
                object_destroy_locked(m, s, o);
            done = true;
        }
        break;
    }
    pthread_mutex_unlock(&s->mu);
    return done;
}

/* The cheapest runs of nrep segments of one kind (disk or DRAM) spanning
 * len bytes each, their owners evicted. */
static uint64_t evict_runs(moonlet_master *m, uint64_t len, uint32_t nrep, bool disk)
{
    uint64_t evicted = 0;
    pthread_mutex_lock(&m->evict_mu);
    pthread_rwlock_rdlock(&m->guard);
    struct run_items it = {.min_seg = len, .now = moonlet_clock_now_ns(), .disk = disk};
    shards_foreach(m, run_collect_visit, &it);
    if (!it.oom)
        registry_foreach_free(m, len, disk, run_collect_free, &it);
    struct seg_run *runs = NULL;
    if (it.oom || !(runs = calloc(it.n ? it.n : 1, sizeof(*runs))))
        goto out;
    if (it.n) /* it.v is NULL when nothing was collected */
        qsort(it.v, it.n, sizeof(*it.v), cmp_run_item);
    /* Pinned objects only when unpinned ones cannot make room (as evict_pass). */
    for (int round = 0; round < 2; round++) {
        bool allow_pinned = round == 1;
        size_t nruns = 0;
        for (size_t lo = 0, hi; lo < it.n; lo = hi) {
            for (hi = lo; hi < it.n && it.v[hi].slot == it.v[lo].slot; hi++)
                ;
            struct seg_run sr;
            if (best_run(it.v, lo, hi, len, allow_pinned, &sr.first, &sr.last, &sr.cost) &&
                nruns < it.n) /* at most one run per segment: it.n bounds them */
                runs[nruns++] = sr;
        }
        if (nruns < nrep)
            continue;
        qsort(runs, nruns, sizeof(*runs), cmp_seg_run);
        for (uint32_t k = 0; k < nrep; k++)
            for (size_t i = runs[k].first; i <= runs[k].last; i++)
                if (it.v[i].kind != RUN_FREE && evict_item(m, &it.v[i], it.now, allow_pinned))
                    evicted++;
        break;
    }
out:
    pthread_rwlock_unlock(&m->guard);
    pthread_mutex_unlock(&m->evict_mu);
    free(runs);
    free(it.v);
    return evicted;
}

void evict_without_copy(moonlet_master *m, uint64_t hash, uint32_t tenant)
{
    uint64_t now = moonlet_clock_now_ns();
    bool done = false;
    pthread_rwlock_rdlock(&m->guard);
    struct shard *s = &m->shards[shard_of(m, hash)];
    pthread_mutex_lock(&s->mu);
    for (struct mobj *o = s->buckets[hash & s->mask]; o; o = o->next)
        if (o->hash == hash && o->tenant == tenant) {
            if (dram_evictable(o, now, true)) {
                object_destroy_locked(m, s, o);
                done = true;
            }
            break;
        }
    pthread_mutex_unlock(&s->mu);
    pthread_rwlock_unlock(&m->guard);
    if (done)
        atomic_fetch_add(&m->st.evictions, 1);
}

uint64_t evict_disk_for_space(moonlet_master *m, uint64_t len)
{
    uint64_t evicted = evict_runs(m, len, 1, true);
    atomic_fetch_add(&m->st.disk_evictions, evicted);
    if (evicted)
        ML_DEBUG("master", "disk tier: %" PRIu64 " objects evicted for %" PRIu64 " bytes",
                 evicted, len);
    return evicted;
}

uint64_t evict_for_space(moonlet_master *m, uint64_t size, uint32_t nrep)
{
    uint64_t len = moonlet_alloc_rounded(size ? size : 1);
    uint64_t evicted = evict_runs(m, len, nrep, false);
    atomic_fetch_add(&m->st.eviction_passes, 1);
    atomic_fetch_add(&m->st.evictions, evicted);
    if (evicted)
        ML_DEBUG("master", "eviction for %" PRIu64 " bytes x %u: %" PRIu64 " objects evicted",
                 len, nrep, evicted);
    return evicted;
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
