/*
 * repair.c - re-replication: objects left with fewer readable replicas than
 * they were put with get a new replica on another host; and demotion to the
 * disk tier, on the same jobs.
 *
 * Owns the repair queue and the jobs in flight (struct repair_state).  The
 * master stays a pure server doing no I/O: it only decides and records.
 *
 *   1. A segment leaves (unmount.c strips its replicas; a drain marks its
 *      replicas as leaving): repair_note_locked queues each sealed object
 *      whose live replicas (COMPLETE, not on a draining segment) are fewer
 *      than nrep_cap, the count it was put with.  Objects under a read lease
 *      go to the urgent queue, served first.
 *   2. repair_pump (the background tick, and each RepairFetch) starts queued
 *      entries within --repair-concurrency (jobs in flight) and
 *      --repair-bandwidth (a token bucket of bytes per second, one second of
 *      burst): it reserves a range on a segment of another host
 *      (registry_place_extra_locked: placement's rules, not draining).  The
 *      range belongs to the job, not the object: no reader sees it.  The
 *      job holds no lease: a Remove or an eviction takes the object as if
 *      no repair ran, and cancels its job (repair_object_gone_locked, under
 *      the object's shard lock), so the copy is attached to no other object
 *      put later under the same key.  The source is only read, never
 *      written: reading a range reused meanwhile harms nobody.
 *   3. The target node fetches its jobs (moonlet_master_repair_fetch): the
 *      readable source replicas, the checksum PutEnd recorded and a write
 *      capability for the target range, valid until the job's deadline.
 *   4. RepairDone: on success, and while the object, the target segment
 *      (same generation: not retired and reused) and the deadline still hold,
 *      the range joins the object as a COMPLETE replica - appended, or in
 *      place of a replica on a draining segment, whose range is released
 *      (quarantined while a lease holds).  Otherwise, or on failure, the
 *      range goes to the segment's quarantine until the deadline + the grace
 *      (the node's capability expired by then) and a failed job is retried
 *      with exponential backoff, at most repair_max_attempts times.
 *   A job not reported by its deadline is failed by the tick the same way.
 *
 * Work per call is bounded (REPAIR_PUMP_BUDGET entries looked at per pump),
 * and each object is handled under its one shard lock, briefly: lookups of
 * other keys never wait on repair.
 *
 * Demotion (a disk tier mounted: disk segments, segment.c).  Eviction
 * (evict.c) hands a victim to repair_demote_locked instead of destroying
 * it: a job whose target is an extent on a disk segment (its own node's
 * disk when that has room), queued apart (`demote`, at most
 * cfg.demote_queue queued or running, cfg.demote_concurrency running; no
 * repair bandwidth), fetched by the disk's node like a repair job
 * (RepairFetch, with the tenant and key the disk header carries).  On a
 * good RepairDone the object's DRAM replicas are swapped for the disk one
 * (demote_swap_locked: ranges freed, quarantined while a lease holds); a
 * failed or late copy ends the job and the object stays in DRAM; a disk
 * without room evicts its own coldest objects (evict_disk_for_space), and
 * when that cannot make room either the object is evicted as without a
 * disk.  Eviction sits above this file (it queues the demotions), so those
 * two come as the hooks master.c passes to repair_init (repair.h), not as
 * calls up.  Copies *ahead* of eviction (demote_ahead_pass) are the same jobs
 * whose copy, on RepairDone, is staged (`stg`, indexed by hash) instead of
 * joined; eviction of such an object (repair_swap_staged_locked, also from
 * evict_for_space) swaps it in at once.  A staged copy of an object that
 * goes is given back (its extent to the node's trim).
 *
 * Locks: repair_mu is a leaf (taken under a shard lock by
 * repair_note_locked and when a job starts; nothing is taken under it).
 * The pump, fetch and done paths take the guard shared, then one shard lock,
 * then registry.mu (segment.c) or repair_mu, never two shard locks.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "lease.h"
#include "log.h"
#include "master_internal.h"
#include "moonlet/error.h"
#include "placement.h"
#include "record.h"
#include "repair.h"
#include "tenant.h"

#define REPAIR_PUMP_BUDGET 256u   /* queue entries looked at per pump */
#define REPAIR_BACKOFF_FIRST_NS (1000ull * MOONLET_NS_PER_MS)
#define REPAIR_BACKOFF_CAP_NS (30000ull * MOONLET_NS_PER_MS)
#define REPAIR_FETCH_MAX 64u
#define REPAIR_MAX_CONCURRENCY 4096u

struct rq_entry {
    uint64_t hash;
    uint32_t tenant;
    uint32_t attempts;   /* failed attempts so far */
    uint64_t not_before; /* backoff: not started before this (ns) */
    bool demote;         /* a demotion to the disk tier, not a repair */
    bool ahead;          /* a demotion ahead of eviction: the copy is staged */
};

/* A FIFO: entries [head, n) of e. */
struct rq {
    struct rq_entry *e;
    uint32_t head, n, cap;
};

struct rjob {
    uint64_t id, hash, size, deadline_ns, gen;
    uint32_t tenant, attempts;
    struct mrep target;  /* the reserved range (job-owned until attached) */
    bool fetched;
    bool cancelled;      /* its object was destroyed (repair_object_gone_locked) */
    bool demote;         /* target on a disk segment: swaps for the DRAM replicas */
    bool ahead;          /* ahead of eviction: the copy is staged, the DRAM kept */
};

/* A disk copy made ahead of eviction: durable on its node, joined to its
 * object (in place of the DRAM replicas) when eviction picks the object. */
struct staged {
    uint64_t hash, size, gen;
    uint32_t tenant;
    struct mrep target;
};

struct repair_state {
    pthread_mutex_t mu;
    struct rq urgent, normal; /* leased objects first */
    struct rq demote;         /* demotions (eviction to the disk tier), FIFO */
    uint32_t ndemote;         /* demotions queued or running (<= cfg.demote_queue) */
    _Atomic uint32_t ndemote_run; /* of which running (each holds a disk extent) */
    struct staged *stg;       /* copies made ahead, waiting for their object's eviction */
    uint32_t nstg, stg_cap;
    struct hmap stg_ix;       /* hash -> index in stg */
    uint64_t stg_bytes;       /* their extents' bytes */
    _Atomic uint32_t nstg_pub; /* nstg, read without repair_mu (repair_staged) */
    struct hmap known;        /* (hash -> tenant) of every queued or running object */
    struct rjob *run;
    uint32_t nrun, run_cap;
    _Atomic uint32_t running; /* nrun, for repair_object_gone_locked's fast path */
    uint64_t next_id;
    double tokens;            /* bandwidth bucket (bytes); may go negative (debt) */
    uint64_t tokens_ns;
    _Atomic uint64_t done, failed, retried, dropped, bytes;
    _Atomic uint64_t demoted, demote_bytes, demote_dropped, demote_failed, staged_done;
    struct repair_evict evict; /* eviction a demotion falls back on (repair_init) */
};

static bool tenant_eq(const void *ctx, uint32_t v) { return *(const uint32_t *)ctx == v; }

static size_t rq_len(const struct rq *q) { return q->n - q->head; }

static bool rq_push(struct rq *q, struct rq_entry e)
{
    if (q->head > 0 && q->head * 2 >= q->n) { /* compact */
        memmove(q->e, q->e + q->head, rq_len(q) * sizeof(*q->e));
        q->n -= q->head;
        q->head = 0;
    }
    struct rq_entry *ne = moonlet_grow(q->e, q->n, &q->cap, 64, sizeof(*ne));
    if (!ne)
        return false;
    q->e = ne;
    q->e[q->n++] = e;
    return true;
}

int repair_init(moonlet_master *m, const struct repair_evict *ev)
{
    struct repair_state *r = calloc(1, sizeof(*r));
    if (!r)
        return MOONLET_ERR_INTERNAL_ERROR;
    pthread_mutex_init(&r->mu, NULL);
    r->next_id = 1;
    r->evict = *ev;
    r->tokens = (double)m->cfg.repair_bandwidth;
    r->tokens_ns = moonlet_clock_now_ns();
    m->repair = r;
    return MOONLET_OK;
}

void repair_destroy(moonlet_master *m)
{
    struct repair_state *r = m->repair;
    if (!r)
        return;
    free(r->urgent.e);
    free(r->normal.e);
    free(r->demote.e);
    free(r->stg);
    hmap_free(&r->stg_ix);
    free(r->run);
    hmap_free(&r->known);
    pthread_mutex_destroy(&r->mu);
    free(r);
    m->repair = NULL;
}

uint32_t repair_live_replicas(const moonlet_master *m, const struct mobj *o)
{
    uint32_t live = 0;
    for (uint32_t k = 0; k < o->nrep; k++)
        live += mobj_creps(o)[k].status == MOONLET_REPLICA_COMPLETE &&
                !seg_draining(m, mobj_creps(o)[k].seg);
    return live;
}

/* A disk object has its one replica by design: not under-replicated. */
static bool needs_repair(const moonlet_master *m, const struct mobj *o)
{
    return o->state == OBJ_COMPLETE && o->nrep > 0 && !mobj_on_disk(o) &&
           repair_live_replicas(m, o) < o->nrep_cap;
}

/* Queues (hash, tenant) unless known.  repair_mu held. */
static void enqueue_locked(struct repair_state *r, uint64_t hash, uint32_t tenant, bool urgent,
                           uint32_t attempts, uint64_t not_before, bool is_known)
{
    if (!is_known) {
        if (hmap_find(&r->known, hash, tenant_eq, &tenant))
            return;
        if (!hmap_insert(&r->known, hash, tenant))
            goto oom;
    }
    struct rq_entry e = {.hash = hash, .tenant = tenant, .attempts = attempts,
                         .not_before = not_before};
    if (rq_push(urgent ? &r->urgent : &r->normal, e))
        return;
    hmap_remove_hv(&r->known, hash, tenant);
oom:
    ML_ERR("master", "out of memory queueing a repair: an object stays under-replicated");
}

static void forget_locked(struct repair_state *r, uint64_t hash, uint32_t tenant)
{
    hmap_remove_hv(&r->known, hash, tenant);
}

/* A demotion ends (its copy joined the object, failed, timed out, or its
 * object or target went): forgotten, and its room in the queue given back.
 * A failed one is not retried: the object stays in DRAM, and the next
 * eviction pass that picks it queues it again.  repair_mu held. */
static void demote_end_locked(struct repair_state *r, uint64_t hash, uint32_t tenant,
                              bool was_running)
{
    forget_locked(r, hash, tenant);
    r->ndemote--;
    if (was_running)
        r->ndemote_run--;
}

static void repl_swap(moonlet_master *m, const struct mobj *o, uint64_t until, uint64_t now);

/* A durable disk copy `t` takes the place of every DRAM replica of sealed
 * o, whose ranges are freed now (quarantined while a reader's lease holds:
 * that reader still reads them).  The block keeps its size (nrep_cap);
 * repair leaves disk objects alone.  Under o's shard lock. */
static void demote_swap_locked(moonlet_master *m, struct mobj *o, const struct mrep *t,
                               uint64_t now)
{
    struct mrep old[MOONLET_MAX_REPLICAS];
    uint32_t nold = o->nrep;
    memcpy(old, mobj_reps(o), nold * sizeof(*old));
    mobj_reps(o)[0] = *t;
    mobj_reps(o)[0].status = MOONLET_REPLICA_COMPLETE;
    o->nrep = 1;
    uint64_t until = moonlet_lease_active(o->lease_deadline, now) ? o->lease_deadline : 0;
    repl_swap(m, o, until, now);
    registry_release(m, o->hash, o->size, old, nold, until);
}

struct stg_ctx {
    const struct staged *v;
    uint32_t tenant;
};

static bool stg_eq(const void *ctx, uint32_t i)
{
    const struct stg_ctx *c = ctx;
    return c->v[i].tenant == c->tenant;
}

/* Takes (hash, tenant)'s staged copy out of the table into *out.  repair_mu
 * held. */
static bool staged_take_locked(struct repair_state *r, uint64_t hash, uint32_t tenant,
                               struct staged *out)
{
    struct stg_ctx c = {r->stg, tenant};
    struct hent *e = r->nstg ? hmap_find(&r->stg_ix, hash, stg_eq, &c) : NULL;
    if (!e)
        return false;
    uint32_t i = e->v;
    hmap_remove(&r->stg_ix, e);
    *out = r->stg[i];
    r->stg_bytes -= mrep_len(&out->target, out->size);
    uint32_t last = --r->nstg;
    atomic_store(&r->nstg_pub, r->nstg);
    if (i != last) { /* the last entry moves into i */
        hmap_remove_hv(&r->stg_ix, r->stg[last].hash, last);
        r->stg[i] = r->stg[last];
        if (!hmap_insert(&r->stg_ix, r->stg[i].hash, i))
            ML_ERR("master", "out of memory re-indexing a staged disk copy");
    }
    return true;
}

static bool staged_add_locked(struct repair_state *r, const struct staged *s)
{
    struct staged *v = moonlet_grow(r->stg, r->nstg, &r->stg_cap, 64, sizeof(*v));
    if (!v)
        return false;
    r->stg = v;
    if (!hmap_insert(&r->stg_ix, s->hash, r->nstg))
        return false;
    r->stg[r->nstg++] = *s;
    atomic_store(&r->nstg_pub, r->nstg);
    r->stg_bytes += mrep_len(&s->target, s->size);
    return true;
}

static uint32_t repair_running_demotions(const moonlet_master *m)
{
    return m->repair ? atomic_load(&m->repair->ndemote_run) : 0;
}

static uint32_t repair_staged(const moonlet_master *m)
{
    return m->repair ? atomic_load(&m->repair->nstg_pub) : 0;
}

uint64_t repair_disk_objects(moonlet_master *m)
{
    uint64_t n = atomic_load(&m->reg.disk_extents); /* no scan: evict_pass asks each tick */
    if (n == 0)
        return 0;
    /* extents placed for copies not (yet) joined to their objects */
    uint64_t other = repair_running_demotions(m) + repair_staged(m);
    return n > other ? n - other : 0;
}

bool repair_swap_staged_locked(moonlet_master *m, struct mobj *o)
{
    struct repair_state *r = m->repair;
    if (!r || o->state != OBJ_COMPLETE || mobj_on_disk(o))
        return false;
    pthread_mutex_lock(&r->mu);
    struct staged s;
    bool had = r->nstg && staged_take_locked(r, o->hash, o->tenant, &s);
    pthread_mutex_unlock(&r->mu);
    if (!had)
        return false;
    if (s.size != o->size || !registry_slot_live(m, s.target.seg, s.gen)) {
        registry_release_gen(m, s.hash, s.size, &s.target, s.gen, 0);
        return false;
    }
    demote_swap_locked(m, o, &s.target, moonlet_clock_now_ns());
    atomic_fetch_add(&r->demoted, 1);
    atomic_fetch_add(&r->demote_bytes, s.size);
    return true;
}

/* Queues o's demotion (ahead: a copy to stage) as known: DEMOTE_QUEUED,
 * or DEMOTE_NONE when out of memory.  repair_mu held. */
static int demote_enqueue_locked(struct repair_state *r, const struct mobj *o, bool ahead)
{
    if (!hmap_insert(&r->known, o->hash, o->tenant))
        return DEMOTE_NONE;
    struct rq_entry e = {.hash = o->hash, .tenant = o->tenant, .demote = true, .ahead = ahead};
    if (!rq_push(&r->demote, e)) {
        hmap_remove_hv(&r->known, o->hash, o->tenant);
        return DEMOTE_NONE;
    }
    r->ndemote++;
    return DEMOTE_QUEUED;
}

/* Whether o can be demoted at all: a disk tier mounted, o sealed, in DRAM. */
static bool demotable(moonlet_master *m, const struct mobj *o)
{
    return atomic_load(&m->reg.ndisk) > 0 && o->state == OBJ_COMPLETE && !mobj_on_disk(o);
}

int repair_demote_ahead_locked(moonlet_master *m, const struct mobj *o)
{
    struct repair_state *r = m->repair;
    if (!demotable(m, o))
        return DEMOTE_NONE;
    int res = DEMOTE_NONE;
    pthread_mutex_lock(&r->mu);
    struct stg_ctx c = {r->stg, o->tenant};
    if (hmap_find(&r->known, o->hash, tenant_eq, &o->tenant) ||
        (r->nstg && hmap_find(&r->stg_ix, o->hash, stg_eq, &c)))
        res = DEMOTE_BUSY;
    else if (r->ndemote < m->cfg.demote_queue &&
             r->stg_bytes < atomic_load(&m->reg.disk_capacity) / 2)
        res = demote_enqueue_locked(r, o, true);
    pthread_mutex_unlock(&r->mu);
    return res;
}

int repair_demote_locked(moonlet_master *m, struct mobj *o)
{
    struct repair_state *r = m->repair;
    if (!demotable(m, o))
        return DEMOTE_NONE;
    if (repair_swap_staged_locked(m, o)) /* copied ahead: the DRAM goes at once */
        return DEMOTE_SWAPPED;
    int res = DEMOTE_NONE;
    pthread_mutex_lock(&r->mu);
    if (hmap_find(&r->known, o->hash, tenant_eq, &o->tenant))
        res = DEMOTE_BUSY;
    else if (r->ndemote >= m->cfg.demote_queue) /* eviction never waits for a slow disk */
        atomic_fetch_add(&r->demote_dropped, 1);
    else
        res = demote_enqueue_locked(r, o, false);
    pthread_mutex_unlock(&r->mu);
    return res;
}

void repair_note_locked(moonlet_master *m, const struct mobj *o)
{
    if (!needs_repair(m, o))
        return;
    struct repair_state *r = m->repair;
    bool leased = moonlet_lease_active(o->lease_deadline, moonlet_clock_now_ns());
    pthread_mutex_lock(&r->mu);
    enqueue_locked(r, o->hash, o->tenant, leased, 0, 0, false);
    pthread_mutex_unlock(&r->mu);
}

struct find_args {
    uint32_t tenant;
    struct mobj *o;
};

static bool find_visit(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    (void)m;
    (void)s;
    struct find_args *f = arg;
    if (o->tenant != f->tenant)
        return true;
    f->o = o;
    return false;
}

/* The object (hash, tenant) in its shard (lock held), or NULL. */
static struct mobj *find_locked(moonlet_master *m, struct shard *s, uint64_t hash, uint32_t tenant)
{
    struct find_args f = {tenant, NULL};
    shard_foreach_hash_locked(m, s, hash, find_visit, &f);
    return f.o;
}

static uint64_t backoff_ns(uint32_t attempts)
{
    uint64_t ns = REPAIR_BACKOFF_FIRST_NS;
    for (uint32_t i = 1; i < attempts && ns < REPAIR_BACKOFF_CAP_NS; i++)
        ns *= 2;
    return ns < REPAIR_BACKOFF_CAP_NS ? ns : REPAIR_BACKOFF_CAP_NS;
}

/* A failed attempt: again after a backoff, or given up.  repair_mu held. */
static void retry_locked(moonlet_master *m, uint64_t hash, uint32_t tenant, uint32_t attempts,
                         uint64_t now)
{
    struct repair_state *r = m->repair;
    attempts++;
    if (attempts >= m->cfg.repair_max_attempts) {
        forget_locked(r, hash, tenant);
        atomic_fetch_add(&r->failed, 1);
        ML_WARN("master", "repair of object %016" PRIx64 " given up after %u attempts", hash,
                attempts);
        return;
    }
    atomic_fetch_add(&r->retried, 1);
    enqueue_locked(r, hash, tenant, false, attempts, now + backoff_ns(attempts), true);
}

/* A running job failed (its node said so, or it timed out): a repair is
 * tried again after a backoff, a demotion ends.  repair_mu held. */
static void job_failed_locked(moonlet_master *m, const struct rjob *j, uint64_t now)
{
    struct repair_state *r = m->repair;
    if (j->demote) {
        atomic_fetch_add(&r->demote_failed, 1);
        demote_end_locked(r, j->hash, j->tenant, true);
    } else if (j->cancelled) {
        forget_locked(r, j->hash, j->tenant);
    } else {
        retry_locked(m, j->hash, j->tenant, j->attempts, now);
    }
}

/* Gives a job's target range back: into quarantine until the job's deadline
 * plus the grace, when no write of the node can land any more. */
static void release_target(moonlet_master *m, const struct rjob *j)
{
    registry_release_gen(m, j->hash, j->size, &j->target, j->gen,
                         j->deadline_ns + m->quarantine_grace_ns);
}

/* What a QUAR record of a job's target says: the object's size (the
 * standby rounds it as the allocator does), or a disk target's extent. */
static uint64_t job_range_bytes(const struct rjob *j)
{
    return j->target.disk_hdr ? mrep_len(&j->target, j->size) : j->size;
}

/* A hot standby learns that the job's target range is taken: a QUAR
 * record holding it until the job's deadline plus the quarantine grace (the
 * longest the leader keeps it for a job that fails), so the new leader
 * cannot place a put where a copy of the old leader's may still be
 * writing.  A copy that joins its object is replicated (repl_swap: the
 * object's PLACE, which ends that QUAR on the standby).
 * RepairFetch waits for the standby's ack (service.c, is_write), so no node
 * writes before the standby holds the range.  Under the shard lock, after
 * the allocator took the range (master.h: the records' order). */
static void repl_hold_target(moonlet_master *m, const struct rjob *j, uint64_t now)
{
    if (!repl_on(m))
        return;
    /* A disk target's range is its extent (header and whole blocks). */
    moonlet_repl_rec rec = {.type = MOONLET_REPL_QUAR, .size = job_range_bytes(j), .nrep = 1};
    rec.rep_seg[0] = MOONLET_STR(reg_seg(&m->reg, j->target.seg)->id);
    rec.rep_off[0] = j->target.offset;
    uint64_t until = j->deadline_ns + m->quarantine_grace_ns;
    rec.free_ms = until > now ? (until - now + MOONLET_NS_PER_MS - 1) / MOONLET_NS_PER_MS : 0;
    repl_emit(m, &rec);
}

/* A repair's copy `nr` joined sealed o (already in o), appended or in
 * place of a replica on a draining segment: the standby, which knows o
 * without `nr` and holds `nr` as QUAR, is told in one record naming o's
 * replicas, `nr` among them (its bytes were verified: it is o's), and a
 * swapped-out range held while a reader may still read it (until; 0:
 * freed at once), before that range is freed (master.h: the records'
 * order).  So it never keeps a replica on a range the leader may reuse,
 * and keeps the object while the leader does: before, `nr` was left out,
 * and an object whose one replica was drained (or whose one surviving
 * replica's node left after the copy) vanished from the standby at the
 * node's unmount (issue 31, finding 1).  Its PLACE ends the QUAR of `nr`
 * (replicate.c).  Under o's shard lock. */
static void repl_swap(moonlet_master *m, const struct mobj *o, uint64_t until, uint64_t now)
{
    if (!repl_on(m))
        return;
    uint64_t free_ms = until > now ? (until - now + MOONLET_NS_PER_MS - 1) / MOONLET_NS_PER_MS : 0;
    repl_object_send(m, o, free_ms, m->cfg.repl_emit, m->cfg.repl_arg);
}

enum { START_OK, START_DROP, START_RETRY, START_NO_ROOM };

/* Records job j (its target reserved) as running: START_OK, or START_RETRY
 * (out of memory: the target given back).  Under the object's shard lock;
 * takes repair_mu. */
static int job_add(moonlet_master *m, struct rjob *j, uint64_t now)
{
    struct repair_state *r = m->repair;
    int res = START_RETRY;
    pthread_mutex_lock(&r->mu);
    struct rjob *nr = moonlet_grow(r->run, r->nrun, &r->run_cap, 16, sizeof(*nr));
    if (nr)
        r->run = nr;
    if (r->nrun < r->run_cap) {
        j->id = r->next_id++;
        r->run[r->nrun++] = *j;
        atomic_store(&r->running, r->nrun);
        if (j->demote)
            r->ndemote_run++;
        else
            r->tokens -= (double)j->size;
        res = START_OK;
    }
    pthread_mutex_unlock(&r->mu);
    if (res != START_OK)
        registry_release_gen(m, j->hash, j->size, &j->target, j->gen, 0);
    else
        repl_hold_target(m, j, now);
    return res;
}

/* Starts the demotion of one queued object: a disk extent reserved for its
 * copy, on its node's disk when that has room.  START_NO_ROOM (*footprint:
 * the extent's bytes) when no disk segment has room.  Takes the guard
 * shared, its shard lock, registry.mu and repair_mu. */
static int start_demote(moonlet_master *m, const struct rq_entry *e, uint64_t now,
                        uint64_t *footprint)
{
    int res = START_DROP;
    pthread_rwlock_rdlock(&m->guard);
    struct shard *s = &m->shards[shard_of(m, e->hash)];
    pthread_mutex_lock(&s->mu);
    struct mobj *o = find_locked(m, s, e->hash, e->tenant);
    if (o && o->state == OBJ_COMPLETE && !mobj_on_disk(o) && o->nrep > 0) {
        char tn[MOONLET_MAX_ID_BYTES + 1];
        uint32_t dk = moonlet_disk_key_bytes(tenant_name_of(m, o->tenant, tn), o->key_len);
        struct rjob j = {.hash = e->hash, .tenant = e->tenant, .size = o->size, .demote = true,
                         .ahead = e->ahead, .deadline_ns = now + m->cfg.repair_timeout_ms * MOONLET_NS_PER_MS};
        int rc = registry_place_disk_locked(m, e->hash, o->size, dk, mobj_creps(o), o->nrep,
                                            &j.target, &j.gen);
        if (rc == MOONLET_ERR_NO_AVAILABLE_HANDLE) {
            res = START_NO_ROOM;
            *footprint = moonlet_disk_footprint(dk, o->size);
        } else if (rc == MOONLET_OK) {
            res = job_add(m, &j, now) == START_OK ? START_OK : START_DROP;
        }
    }
    pthread_mutex_unlock(&s->mu);
    pthread_rwlock_unlock(&m->guard);
    return res;
}

/* Starts the repair of one queued object: reserves the target and records
 * the job.  Takes the guard shared, its shard lock, registry.mu and repair_mu. */
static int start_one(moonlet_master *m, const struct rq_entry *e, uint64_t now)
{
    int res = START_DROP;
    pthread_rwlock_rdlock(&m->guard);
    struct shard *s = &m->shards[shard_of(m, e->hash)];
    pthread_mutex_lock(&s->mu);
    struct mobj *o = find_locked(m, s, e->hash, e->tenant);
    uint32_t readable = 0;
    bool draining_rep = false;
    for (uint32_t k = 0; o && k < o->nrep; k++) {
        readable += mobj_creps(o)[k].status == MOONLET_REPLICA_COMPLETE;
        draining_rep |= seg_draining(m, mobj_creps(o)[k].seg);
    }
    if (o && needs_repair(m, o) && readable > 0 && (o->nrep < o->nrep_cap || draining_rep)) {
        struct rjob j = {.hash = e->hash, .tenant = e->tenant, .size = o->size,
                         .attempts = e->attempts,
                         .deadline_ns = now + m->cfg.repair_timeout_ms * MOONLET_NS_PER_MS};
        if (registry_place_extra_locked(m, e->hash, o->size, mobj_creps(o), o->nrep, &j.target,
                                        &j.gen) != MOONLET_OK)
            res = START_RETRY;
        else
            res = job_add(m, &j, now);
    }
    pthread_mutex_unlock(&s->mu);
    pthread_rwlock_unlock(&m->guard);
    return res;
}

/* Pops up to `max` entries that are due (the urgent queue first); entries
 * still in backoff go to the back.  repair_mu held. */
static uint32_t pop_due_locked(struct repair_state *r, uint64_t now, struct rq_entry *out,
                               uint32_t max)
{
    uint32_t n = 0, looked = 0;
    struct rq *qs[2] = {&r->urgent, &r->normal};
    for (int qi = 0; qi < 2; qi++) {
        struct rq *q = qs[qi];
        size_t look = rq_len(q);
        /* bounded: entries in backoff are looked at, at most a few budgets' worth */
        for (size_t i = 0; i < look && n < max && looked < 4 * REPAIR_PUMP_BUDGET; i++, looked++) {
            struct rq_entry e = q->e[q->head++];
            if (e.not_before > now) {
                if (!rq_push(q, e))
                    hmap_remove_hv(&r->known, e.hash, e.tenant);
                continue;
            }
            out[n++] = e;
        }
    }
    return n;
}

/* Starts the demotions cfg.demote_concurrency allows (at most
 * REPAIR_PUMP_BUDGET).  A disk without room evicts its own coldest objects
 * first (evict_disk_for_space); when that cannot make room either, the
 * object is evicted from DRAM without a copy (counted dropped): DRAM
 * pressure never waits for the disk.  Takes no lock the caller holds. */
static void demote_pump(moonlet_master *m, uint64_t now)
{
    struct repair_state *r = m->repair;
    struct rq_entry batch[REPAIR_PUMP_BUDGET];
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    uint32_t room = m->cfg.demote_concurrency > r->ndemote_run
                        ? m->cfg.demote_concurrency - r->ndemote_run : 0;
    while (n < room && n < REPAIR_PUMP_BUDGET && rq_len(&r->demote) > 0)
        batch[n++] = r->demote.e[r->demote.head++];
    pthread_mutex_unlock(&r->mu);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t footprint = 0;
        int res = start_demote(m, &batch[i], now, &footprint);
        /* A copy ahead of eviction takes only free room: nothing is evicted for it. */
        if (res == START_NO_ROOM && !batch[i].ahead && r->evict.disk_for_space(m, footprint) > 0)
            res = start_demote(m, &batch[i], now, &footprint);
        if (res == START_OK)
            continue;
        if (res == START_NO_ROOM && !batch[i].ahead) {
            r->evict.without_copy(m, batch[i].hash, batch[i].tenant);
            atomic_fetch_add(&r->demote_dropped, 1);
        }
        pthread_mutex_lock(&r->mu);
        demote_end_locked(r, batch[i].hash, batch[i].tenant, false);
        pthread_mutex_unlock(&r->mu);
    }
}

/* Starts what the limits allow, looking at no more than REPAIR_PUMP_BUDGET
 * entries. */
static void repair_pump(moonlet_master *m, uint64_t now)
{
    struct repair_state *r = m->repair;
    struct rq_entry batch[REPAIR_PUMP_BUDGET];
    demote_pump(m, now);
    pthread_mutex_lock(&r->mu);
    double bw = (double)m->cfg.repair_bandwidth;
    if (now > r->tokens_ns) {
        r->tokens += bw * (double)(now - r->tokens_ns) / 1e9;
        if (r->tokens > bw)
            r->tokens = bw; /* one second of burst */
    }
    r->tokens_ns = now;
    uint32_t room = m->cfg.repair_concurrency > r->nrun ? m->cfg.repair_concurrency - r->nrun : 0;
    if (room > REPAIR_PUMP_BUDGET)
        room = REPAIR_PUMP_BUDGET;
    uint32_t n = r->tokens > 0 ? pop_due_locked(r, now, batch, room) : 0;
    pthread_mutex_unlock(&r->mu);
    for (uint32_t i = 0; i < n; i++) {
        pthread_mutex_lock(&r->mu);
        bool out_of_tokens = r->tokens <= 0;
        pthread_mutex_unlock(&r->mu);
        int res = out_of_tokens ? START_RETRY : start_one(m, &batch[i], now);
        pthread_mutex_lock(&r->mu);
        if (res == START_DROP) {
            forget_locked(r, batch[i].hash, batch[i].tenant);
        } else if (res == START_RETRY && out_of_tokens) {
            /* not an attempt: back in the queue as it was */
            enqueue_locked(r, batch[i].hash, batch[i].tenant, false, batch[i].attempts, 0, true);
        } else if (res == START_RETRY) {
            retry_locked(m, batch[i].hash, batch[i].tenant, batch[i].attempts, now);
        }
        pthread_mutex_unlock(&r->mu);
    }
}

static struct rjob *job_locked(struct repair_state *r, uint64_t id);
static bool take_job_locked(struct repair_state *r, uint64_t id, struct rjob *j);
static void drop_job(moonlet_master *m, const struct rjob *j, bool object_gone);

void repair_tick(moonlet_master *m)
{
    struct repair_state *r = m->repair;
    uint64_t now = moonlet_clock_now_ns();
    /* Jobs past their deadline fail (bounded: at most the jobs in flight). */
    pthread_mutex_lock(&r->mu);
    uint32_t nexp = 0;
    for (uint32_t i = 0; i < r->nrun; i++)
        nexp += r->run[i].deadline_ns <= now;
    struct rjob *exp = nexp ? malloc(nexp * sizeof(*exp)) : NULL;
    uint32_t keep = 0, k = 0;
    for (uint32_t i = 0; i < r->nrun; i++) {
        if (exp && r->run[i].deadline_ns <= now)
            exp[k++] = r->run[i];
        else
            r->run[keep++] = r->run[i];
    }
    r->nrun = keep;
    atomic_store(&r->running, r->nrun);
    pthread_mutex_unlock(&r->mu);
    for (uint32_t i = 0; i < k; i++) {
        ML_WARN("master", "%s job %" PRIu64 " timed out", exp[i].demote ? "demotion" : "repair",
                exp[i].id);
        release_target(m, &exp[i]);
        pthread_mutex_lock(&r->mu);
        job_failed_locked(m, &exp[i], now);
        pthread_mutex_unlock(&r->mu);
    }
    free(exp);
    /* Jobs whose target segment went (its node died or unmounted) end now,
     * not at their deadline: the object gets another target. */
    struct {
        uint64_t id, gen;
        uint32_t slot;
    } chk[64];
    uint32_t nchk = 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->nrun && nchk < 64; i++)
        chk[nchk++] = (typeof(chk[0])){r->run[i].id, r->run[i].gen, r->run[i].target.seg};
    pthread_mutex_unlock(&r->mu);
    for (uint32_t i = 0; i < nchk; i++) {
        if (registry_slot_live(m, chk[i].slot, chk[i].gen))
            continue;
        struct rjob j;
        pthread_mutex_lock(&r->mu);
        bool had = take_job_locked(r, chk[i].id, &j);
        pthread_mutex_unlock(&r->mu);
        if (had)
            drop_job(m, &j, j.cancelled);
    }
    repair_pump(m, now);
}

/* Running job `id`, or NULL.  repair_mu held. */
static struct rjob *job_locked(struct repair_state *r, uint64_t id)
{
    for (uint32_t i = 0; i < r->nrun; i++)
        if (r->run[i].id == id)
            return &r->run[i];
    return NULL;
}

/* Takes job `id` out of the running set into *j.  repair_mu held. */
static bool take_job_locked(struct repair_state *r, uint64_t id, struct rjob *j)
{
    struct rjob *p = job_locked(r, id);
    if (!p)
        return false;
    *j = *p;
    *p = r->run[--r->nrun];
    atomic_store(&r->running, r->nrun);
    return true;
}

void repair_object_gone_locked(moonlet_master *m, const struct mobj *o)
{
    struct repair_state *r = m->repair;
    /* A job starts, and a copy is staged, under the object's shard lock,
     * which the caller holds: 0 and 0 here mean no job of this object runs
     * and it has no staged copy. */
    if (!r || (atomic_load(&r->running) == 0 && atomic_load(&r->nstg_pub) == 0))
        return;
    struct staged s;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->nrun; i++)
        if (r->run[i].hash == o->hash && r->run[i].tenant == o->tenant)
            r->run[i].cancelled = true;
    bool had = r->nstg && staged_take_locked(r, o->hash, o->tenant, &s);
    pthread_mutex_unlock(&r->mu);
    if (had) /* its copy is nobody's: the node trims it */
        registry_release_gen(m, s.hash, s.size, &s.target, s.gen, 0);
}

/* A job that cannot go on: its range back.  The object went: forgotten.
 * The target went (its node died or unmounted): the object waits a backoff
 * and gets another target (not an attempt of its own: no copy failed). */
static void drop_job(moonlet_master *m, const struct rjob *j, bool object_gone)
{
    struct repair_state *r = m->repair;
    release_target(m, j);
    pthread_mutex_lock(&r->mu);
    if (j->demote)
        demote_end_locked(r, j->hash, j->tenant, true);
    else if (object_gone)
        forget_locked(r, j->hash, j->tenant);
    else
        enqueue_locked(r, j->hash, j->tenant, false, j->attempts,
                       moonlet_clock_now_ns() + REPAIR_BACKOFF_FIRST_NS, true);
    pthread_mutex_unlock(&r->mu);
    atomic_fetch_add(&r->dropped, 1);
}

/* A RepairFetch / RepairDone call: the segments of the calling node (those of
 * its client id, bound to the calling connection's session) and the time of
 * the call. */
struct repair_call {
    uint32_t slot[16], n;
    uint64_t now;
};

static int repair_call_of(moonlet_master *m, moonlet_str client_id, uint64_t session,
                          struct repair_call *c)
{
    int rc = registry_client_slots(m, client_id, session, c->slot, 16, &c->n);
    c->now = moonlet_clock_now_ns();
    return rc;
}

static bool caller_holds(const struct repair_call *c, uint32_t seg)
{
    for (uint32_t i = 0; i < c->n; i++)
        if (c->slot[i] == seg)
            return true;
    return false;
}

int moonlet_master_repair_fetch(moonlet_master *m, moonlet_str client_id, uint64_t session,
                                uint32_t max,
                                void (*visit)(void *arg, const moonlet_repair_job_view *j),
                                void *arg)
{
    struct repair_state *r = m->repair;
    struct repair_call me;
    int rc = repair_call_of(m, client_id, session, &me);
    if (rc)
        return rc;
    repair_pump(m, me.now);
    if (max > REPAIR_FETCH_MAX)
        max = REPAIR_FETCH_MAX;
    struct rjob jobs[REPAIR_FETCH_MAX];
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->nrun && n < max; i++) {
        struct rjob *j = &r->run[i];
        if (!j->fetched && caller_holds(&me, j->target.seg)) {
            j->fetched = true;
            jobs[n++] = *j;
        }
    }
    pthread_mutex_unlock(&r->mu);
    for (uint32_t i = 0; i < n; i++) {
        struct rjob *j = &jobs[i];
        bool ok = false, object_gone = false;
        pthread_rwlock_rdlock(&m->guard);
        struct shard *s = &m->shards[shard_of(m, j->hash)];
        pthread_mutex_lock(&s->mu);
        struct mobj *o = find_locked(m, s, j->hash, j->tenant);
        /* Ended or cancelled since the copy above (its object was
         * destroyed: o, if any, is another object put later under the same
         * key): nothing to hand out. */
        pthread_mutex_lock(&r->mu);
        const struct rjob *live = job_locked(r, j->id);
        if (!live || live->cancelled)
            o = NULL;
        pthread_mutex_unlock(&r->mu);
        /* Seen MOUNTED under the guard: the slot cannot be retired before
         * we let the guard go (unmount.c's barrier), so its strings hold. */
        if (o && o->state == OBJ_COMPLETE && registry_slot_live(m, j->target.seg, j->gen)) {
            moonlet_replica_view src[MOONLET_MAX_REPLICAS], tv;
            uint32_t ns = 0;
            for (uint32_t k = 0; k < o->nrep; k++)
                if (mobj_creps(o)[k].status == MOONLET_REPLICA_COMPLETE)
                    replica_view_fill(m, o, &mobj_creps(o)[k], &src[ns++]);
            replica_view_fill(m, o, &j->target, &tv);
            replica_cap_fill(m, &j->target, j->size, j->deadline_ns, me.now, &tv);
            if (ns > 0 && visit) {
                moonlet_repair_job_view v = {.job_id = j->id, .size = j->size,
                                             .has_checksum = o->has_checksum,
                                             .checksum = o->checksum, .target = &tv,
                                             .sources = src, .nsources = ns,
                                             .demote = j->demote};
                char tn[MOONLET_MAX_ID_BYTES + 1];
                if (j->demote) {
                    v.tenant = (moonlet_str){tn, tenant_name_of(m, o->tenant, tn)};
                    v.key = (moonlet_str){mobj_key(o), o->key_len};
                }
                visit(arg, &v);
            }
            ok = ns > 0;
            object_gone = ns == 0;
        } else {
            object_gone = !o || o->state != OBJ_COMPLETE;
        }
        pthread_mutex_unlock(&s->mu);
        pthread_rwlock_unlock(&m->guard);
        if (!ok) {
            struct rjob gone;
            pthread_mutex_lock(&r->mu);
            bool had = take_job_locked(r, j->id, &gone);
            pthread_mutex_unlock(&r->mu);
            if (had)
                drop_job(m, &gone, object_gone);
        }
    }
    return MOONLET_OK;
}

int moonlet_master_repair_done(moonlet_master *m, moonlet_str client_id, uint64_t session,
                               uint64_t job_id, int32_t code, uint64_t bytes)
{
    (void)bytes;
    struct repair_state *r = m->repair;
    struct repair_call me;
    int rc = repair_call_of(m, client_id, session, &me);
    if (rc)
        return rc;
    struct rjob j;
    /* A look first: only the target's node ends a job it fetched. */
    pthread_mutex_lock(&r->mu);
    const struct rjob *p = job_locked(r, job_id);
    bool had = p != NULL;
    if (had)
        j = *p;
    bool mine = had && caller_holds(&me, j.target.seg);
    pthread_mutex_unlock(&r->mu);
    if (!had || !mine || !j.fetched)
        return MOONLET_ERR_OBJECT_NOT_FOUND;
    if (code != MOONLET_OK || me.now >= j.deadline_ns) {
        pthread_mutex_lock(&r->mu);
        had = take_job_locked(r, job_id, &j);
        pthread_mutex_unlock(&r->mu);
        if (!had)
            return MOONLET_ERR_OBJECT_NOT_FOUND;
        ML_WARN("master", "%s job %" PRIu64 " failed on its target: %s",
                j.demote ? "demotion" : "repair", j.id,
                code ? moonlet_strerror(code) : "reported after its deadline");
        release_target(m, &j);
        pthread_mutex_lock(&r->mu);
        job_failed_locked(m, &j, me.now);
        pthread_mutex_unlock(&r->mu);
        return MOONLET_OK;
    }
    enum { ATTACHED, GONE, TARGET_GONE, NO_ROOM } res = GONE;
    bool again = false;
    pthread_rwlock_rdlock(&m->guard);
    struct shard *s = &m->shards[shard_of(m, j.hash)];
    pthread_mutex_lock(&s->mu);
    /* The job ends under the object's shard lock: a destruction of its
     * object either cancelled it before, or comes after the attach. */
    pthread_mutex_lock(&r->mu);
    had = take_job_locked(r, job_id, &j);
    pthread_mutex_unlock(&r->mu);
    if (!had) {
        pthread_mutex_unlock(&s->mu);
        pthread_rwlock_unlock(&m->guard);
        return MOONLET_ERR_OBJECT_NOT_FOUND;
    }
    struct mobj *o = j.cancelled ? NULL : find_locked(m, s, j.hash, j.tenant);
    /* MOUNTED now, under the shard lock: an unmount beginning later strips
     * the new replica like any other (its hash is in the target's index). */
    if (o && o->state == OBJ_COMPLETE && o->size == j.size &&
        !registry_slot_live(m, j.target.seg, j.gen)) {
        res = TARGET_GONE;
    } else if (j.demote && j.ahead && o && o->state == OBJ_COMPLETE && o->size == j.size &&
               !mobj_on_disk(o)) {
        /* Copied ahead of eviction: staged until eviction picks o (its
         * extent stays the copy's; the node keeps it). */
        struct staged sg = {.hash = j.hash, .size = j.size, .gen = j.gen, .tenant = j.tenant,
                            .target = j.target};
        sg.target.status = MOONLET_REPLICA_COMPLETE;
        pthread_mutex_lock(&r->mu);
        res = staged_add_locked(r, &sg) ? ATTACHED : GONE;
        pthread_mutex_unlock(&r->mu);
        if (res == ATTACHED)
            atomic_fetch_add(&r->staged_done, 1);
    } else if (j.demote && o && o->state == OBJ_COMPLETE && o->size == j.size &&
               !mobj_on_disk(o)) {
        /* The copy is durable on the node's disk: it takes the place of
         * every DRAM replica now. */
        demote_swap_locked(m, o, &j.target, me.now);
        res = ATTACHED;
    } else if (!j.demote && o && o->state == OBJ_COMPLETE && o->size == j.size) {
        struct mrep nr = j.target;
        nr.status = MOONLET_REPLICA_COMPLETE;
        struct mrep *reps = mobj_reps(o);
        res = NO_ROOM;
        if (o->nrep < o->nrep_cap) {
            reps[o->nrep++] = nr;
            repl_swap(m, o, 0, me.now); /* the standby learns the copy */
            res = ATTACHED;
        } else {
            for (uint32_t k = 0; k < o->nrep; k++) {
                if (!seg_draining(m, reps[k].seg))
                    continue;
                struct mrep old = reps[k];
                reps[k] = nr;
                /* A reader may still hold the old replica: quarantined while
                 * its lease holds, as a forced Remove does. */
                uint64_t until =
                    moonlet_lease_active(o->lease_deadline, me.now) ? o->lease_deadline : 0;
                repl_swap(m, o, until, me.now);
                registry_release(m, o->hash, o->size, &old, 1, until);
                res = ATTACHED;
                break;
            }
        }
        again = res == ATTACHED && needs_repair(m, o);
    }
    pthread_mutex_unlock(&s->mu);
    pthread_rwlock_unlock(&m->guard);
    if (res == ATTACHED && j.demote) {
        if (!j.ahead) {
            atomic_fetch_add(&r->demoted, 1);
            atomic_fetch_add(&r->demote_bytes, j.size);
        }
        pthread_mutex_lock(&r->mu);
        demote_end_locked(r, j.hash, j.tenant, true);
        pthread_mutex_unlock(&r->mu);
        return MOONLET_OK;
    }
    if (res == ATTACHED) {
        atomic_fetch_add(&r->done, 1);
        atomic_fetch_add(&r->bytes, j.size);
        pthread_mutex_lock(&r->mu);
        if (again) /* still short (two replicas lost): one more */
            enqueue_locked(r, j.hash, j.tenant, false, 0, 0, true);
        else
            forget_locked(r, j.hash, j.tenant);
        pthread_mutex_unlock(&r->mu);
        return MOONLET_OK;
    }
    drop_job(m, &j, res != TARGET_GONE);
    return res == ATTACHED || res == NO_ROOM ? MOONLET_OK : MOONLET_ERR_OBJECT_NOT_FOUND;
}

struct drain_note {
    uint32_t queued;
};

static bool drain_visit(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    (void)s;
    ((struct drain_note *)arg)->queued++;
    repair_note_locked(m, o);
    return true;
}

int moonlet_master_drain(moonlet_master *m, moonlet_str target, bool drain, uint32_t *segments)
{
    if (target.len == 0 || target.len > MOONLET_MAX_ENDPOINT_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    uint64_t *hashes = NULL;
    uint32_t nh = 0, nsegs = 0;
    int rc = registry_drain(m, target, drain, &hashes, &nh, &nsegs);
    if (segments)
        *segments = nsegs;
    /* Queue the draining segments' objects, a batch of shard locks per
     * hold of the guard (like an unmount's strip). */
    struct drain_note dn = {0};
    for (uint32_t i = 0; i < nh;) {
        pthread_rwlock_rdlock(&m->guard);
        for (uint32_t k = 0; k < 256 && i < nh; k++, i++) {
            struct shard *s = &m->shards[shard_of(m, hashes[i])];
            pthread_mutex_lock(&s->mu);
            shard_foreach_hash_locked(m, s, hashes[i], drain_visit, &dn);
            pthread_mutex_unlock(&s->mu);
        }
        pthread_rwlock_unlock(&m->guard);
    }
    free(hashes);
    return rc;
}

void repair_stats(moonlet_master *m, moonlet_master_stats *st)
{
    struct repair_state *r = m->repair;
    pthread_mutex_lock(&r->mu);
    st->under_replicated = r->known.n - r->ndemote;
    st->repairs_queued = rq_len(&r->urgent) + rq_len(&r->normal);
    st->repairs_running = r->nrun;
    st->demotions_queued = r->ndemote;
    st->demotions_staged = r->nstg;
    pthread_mutex_unlock(&r->mu);
    st->repairs_done = atomic_load(&r->done);
    st->repairs_failed = atomic_load(&r->failed);
    st->repairs_retried = atomic_load(&r->retried);
    st->repairs_dropped = atomic_load(&r->dropped);
    st->repair_bytes = atomic_load(&r->bytes);
    st->demotions = atomic_load(&r->demoted);
    st->demotion_bytes = atomic_load(&r->demote_bytes);
    st->demotions_dropped = atomic_load(&r->demote_dropped);
    st->demotions_failed = atomic_load(&r->demote_failed);
}

void repair_snapshot_targets(moonlet_master *m,
                             void (*emit)(void *arg, const moonlet_repl_rec *rec), void *arg)
{
    struct repair_state *r = m->repair;
    if (!r)
        return;
    /* repair_mu is a leaf: copy the running jobs, then emit under registry.mu */
    pthread_mutex_lock(&r->mu);
    uint32_t n = r->nrun;
    struct rjob *jobs = n ? malloc(n * sizeof(*jobs)) : NULL;
    if (jobs)
        memcpy(jobs, r->run, n * sizeof(*jobs));
    pthread_mutex_unlock(&r->mu);
    if (n && !jobs) {
        ML_ERR("master", "out of memory: a snapshot misses %u repair targets", n);
        return;
    }
    uint64_t now = moonlet_clock_now_ns();
    pthread_mutex_lock(&m->reg.mu);
    for (uint32_t i = 0; i < n; i++) {
        const struct mseg *sg = reg_seg(&m->reg, jobs[i].target.seg);
        uint64_t until = jobs[i].deadline_ns + m->quarantine_grace_ns;
        if (!sg || atomic_load(&sg->state) != SEG_MOUNTED || until <= now)
            continue;
        moonlet_repl_rec rec = {.type = MOONLET_REPL_QUAR,
                                .size = job_range_bytes(&jobs[i]), .nrep = 1,
                                .free_ms = (until - now + MOONLET_NS_PER_MS - 1) /
                                           MOONLET_NS_PER_MS};
        rec.rep_seg[0] = MOONLET_STR(sg->id);
        rec.rep_off[0] = jobs[i].target.offset;
        emit(arg, &rec);
    }
    pthread_mutex_unlock(&m->reg.mu);
    free(jobs);
}
