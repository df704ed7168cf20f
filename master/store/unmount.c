/*
 * unmount.c - taking segments out of service: explicit unmounts and the
 * liveness check's unmounts of dead nodes.
 *
 * An unmount costs in proportion to the segment's own objects, not to the
 * whole table, and never stops the world:
 *   1. registry_unmount_begin (segment.c) marks the slot UNMOUNTING - no new
 *      replica lands on it, lookups by id miss it - and hands over the
 *      segment's index of object hashes;
 *   2. each indexed hash is looked up in its shard (the guard shared, that
 *      one shard lock), the objects with that hash lose their replica on the
 *      slot, and one left with none is destroyed;
 *   3. an empty exclusive section of the guard is the barrier: once it is
 *      passed no reader can still hold a replica naming the slot (all were
 *      stripped under shard locks, and readers use replicas only under the
 *      guard shared), so registry_retire frees the allocator and the slot.
 * Lookups of unaffected keys contend only for a shard lock, briefly.
 *
 * The liveness check (background thread) finds dead clients in ping order
 * (registry_collect_expired: no scan of live ones) and queues their
 * segments as jobs; each call strips at most UNMOUNT_TICK_BUDGET index
 * entries, UNMOUNT_BATCH per hold of the guard, so a mass failure is spread
 * over ticks instead of holding the thread, or anything else, for seconds.
 * An explicit unmount (UnmountSegment) runs the three steps at once.
 *
 * An object that keeps a replica is queued for re-replication (repair.c).
 *
 * Locks: unmount_mu (one drain at a time; taken first, never under another
 * lock) -> guard shared -> one shard lock -> registry.mu and tenants.lock
 * (object_destroy_locked); the barrier takes the guard exclusive with
 * nothing else held.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "lease.h"
#include "log.h"
#include "destroy.h"
#include "master_internal.h"
#include "moonlet/error.h"
#include "repair.h"
#include "sync.h"
#include "unmount.h"

#define UNMOUNT_BATCH 256u         /* index entries per hold of the guard */
#define UNMOUNT_TICK_BUDGET 65536u /* index entries per liveness check (cfg 0) */

struct unmount_job {
    uint32_t slot;
    struct hmap ix;   /* the segment's object hashes (owned) */
    uint32_t pos;     /* next entry of ix.e to visit */
    uint64_t removed; /* objects that lost their last replica */
    char client[MOONLET_MAX_ID_BYTES + 1];
    char segment[MOONLET_MAX_ID_BYTES + 1];
};

struct strip_args {
    uint32_t slot;
    uint64_t removed;
};

/* Drops the object's replicas on the slot; destroys it when none is left. */
static bool strip_visit(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    struct strip_args *st = arg;
    struct mrep *reps = mobj_reps(o);
    uint32_t keep = 0;
    for (uint32_t k = 0; k < o->nrep; k++)
        if (reps[k].seg != st->slot)
            reps[keep++] = reps[k];
    if (keep == o->nrep)
        return true;
    o->nrep = (uint8_t)keep;
    if (keep == 0) {
        object_destroy_locked(m, s, o);
        st->removed++;
    } else {
        repair_note_locked(m, o); /* fewer replicas than it was put with */
    }
    return true;
}

/* Strips the objects of up to `budget` index entries; returns the entries
 * visited.  The job is done when pos reaches ix.cap. */
static uint32_t strip_some(moonlet_master *m, struct unmount_job *j, uint32_t budget)
{
    uint32_t visited = 0;
    struct strip_args st = {.slot = j->slot};
    while (j->pos < j->ix.cap && visited < budget) {
        pthread_rwlock_rdlock(&m->guard);
        for (uint32_t k = 0; k < UNMOUNT_BATCH && j->pos < j->ix.cap && visited < budget; j->pos++) {
            const struct hent *e = &j->ix.e[j->pos];
            if (!e->used)
                continue;
            struct shard *s = &m->shards[shard_of(m, e->h)];
            pthread_mutex_lock(&s->mu);
            shard_foreach_hash_locked(m, s, e->h, strip_visit, &st);
            pthread_mutex_unlock(&s->mu);
            k++;
            visited++;
        }
        pthread_rwlock_unlock(&m->guard);
    }
    j->removed += st.removed;
    return visited;
}

static bool job_done(const struct unmount_job *j) { return j->pos >= j->ix.cap; }

/* Waits until every reader that might hold a replica of a stripped slot is
 * gone: an empty exclusive section of the guard. */
static void reader_barrier(moonlet_master *m)
{
    pthread_rwlock_wrlock(&m->guard);
    pthread_rwlock_unlock(&m->guard);
}

static void job_finish(moonlet_master *m, struct unmount_job *j)
{
    registry_retire(m, j->slot);
    ML_INFO("master", "unmounted segment %s of client %s; %" PRIu64 " objects lost their last replica",
            j->segment, j->client, j->removed);
    hmap_free(&j->ix);
}

int moonlet_master_unmount_segment_as(moonlet_master *m, moonlet_str client_id,
                                      moonlet_str segment_id, uint64_t session)
{
    if (client_id.len == 0 || client_id.len > MOONLET_MAX_ID_BYTES || segment_id.len == 0 ||
        segment_id.len > MOONLET_MAX_ID_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    struct unmount_job j = {0};
    pthread_mutex_lock(&m->unmount_mu);
    int rc = registry_unmount_begin(m, client_id, segment_id, true, session, &j.slot, &j.ix);
    if (rc == MOONLET_OK) {
        snprintf(j.client, sizeof(j.client), "%.*s", (int)client_id.len, client_id.ptr);
        snprintf(j.segment, sizeof(j.segment), "%.*s", (int)segment_id.len, segment_id.ptr);
        while (!job_done(&j))
            strip_some(m, &j, UINT32_MAX);
        reader_barrier(m);
        job_finish(m, &j);
    }
    pthread_mutex_unlock(&m->unmount_mu);
    return rc;
}

int moonlet_master_unmount_segment(moonlet_master *m, moonlet_str client_id, moonlet_str segment_id)
{
    return moonlet_master_unmount_segment_as(m, client_id, segment_id, 0);
}

/* Queues a segment registry_collect_expired began to unmount (unmount_mu
 * held by our caller; runs under registry.mu: allocates, never locks). */
static bool take_job(void *arg, uint32_t slot, struct hmap *ix, const char *client,
                     const char *segment)
{
    moonlet_master *m = arg;
    struct unmount_job *nj = moonlet_grow(m->unmounts, m->nunmounts, &m->unmounts_cap, 16,
                                          sizeof(*nj));
    if (!nj) {
        /* Out of service already; never retired: its slot and its
         * objects' replicas on it stay until the master restarts. */
        ML_ERR("master", "out of memory queueing the unmount of segment %s: it stays "
               "UNMOUNTING (its objects keep that replica, unreadable)", segment);
        hmap_free(ix);
        return false;
    }
    m->unmounts = nj;
    struct unmount_job *j = &m->unmounts[m->nunmounts++];
    memset(j, 0, sizeof(*j));
    j->slot = slot;
    j->ix = *ix;
    snprintf(j->client, sizeof(j->client), "%s", client);
    snprintf(j->segment, sizeof(j->segment), "%s", segment);
    return true;
}

void moonlet_master_hold_liveness(moonlet_master *m, uint64_t ms)
{
    atomic_store(&m->liveness_hold_ns, moonlet_clock_now_ns() + ms * MOONLET_NS_PER_MS);
}

void liveness_check(moonlet_master *m)
{
    pthread_mutex_lock(&m->unmount_mu);
    uint64_t now = moonlet_clock_now_ns();
    if (now >= atomic_load(&m->liveness_hold_ns))
        registry_collect_expired(m, now, take_job, m);
    uint32_t budget = m->cfg.unmount_tick_budget ? m->cfg.unmount_tick_budget : UNMOUNT_TICK_BUDGET;
    for (uint32_t i = 0; i < m->nunmounts && budget; i++)
        budget -= strip_some(m, &m->unmounts[i], budget);
    uint32_t keep = 0, done = 0;
    for (uint32_t i = 0; i < m->nunmounts; i++)
        done += job_done(&m->unmounts[i]);
    if (done) {
        reader_barrier(m); /* one barrier for every job finished in this call */
        for (uint32_t i = 0; i < m->nunmounts; i++) {
            struct unmount_job *j = &m->unmounts[i];
            if (!job_done(j)) {
                m->unmounts[keep++] = *j;
                continue;
            }
            job_finish(m, j);
            atomic_fetch_add(&m->st.unmounts_by_liveness, 1);
        }
        m->nunmounts = keep;
    }
    pthread_mutex_unlock(&m->unmount_mu);
}

uint32_t unmounts_pending(moonlet_master *m)
{
    return moonlet_locked_u32(&m->unmount_mu, &m->nunmounts);
}

void unmounts_destroy(moonlet_master *m)
{
    for (uint32_t i = 0; i < m->nunmounts; i++)
        hmap_free(&m->unmounts[i].ix);
    free(m->unmounts);
    m->unmounts = NULL;
    m->nunmounts = m->unmounts_cap = 0;
}
