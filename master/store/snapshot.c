/*
 * snapshot.c - the master's metadata as replication records
 * (moonlet_master_snapshot, master.h): what a standby starts from before it
 * follows the stream (master/ha/repl_stream.c).
 *
 * The snapshot is fuzzy: it is taken while the master keeps serving, one
 * lock at a time (registry.mu for the segments and quarantined ranges, then
 * each shard lock for its objects, with tenants.lock as a leaf for tenant
 * names).  The caller notes the stream's position before the walk; replaying
 * the stream from there over the snapshot converges on the leader's state
 * because every record sets state (replicate.h); the result is consistent
 * once the replay passed the stream's position at the end of the walk.
 *
 * A snapshot may also be taken in parts (moonlet_master_snapshot_part): the
 * segments and the first shards, then whole shards from a cursor, each part
 * about as large as the caller's budget, so that no reply of the replication
 * stream has to hold the whole metadata.  The parts are walks at different
 * times; the same replay from the first part's position makes them converge.
 *
 * Locks: guard (shared) -> shard lock -> tenants.lock; registry.mu alone.
 * `emit` runs under them: it must only copy.
 */
#include <string.h>

#include "clock.h"
#include "master_internal.h"
#include "moonlet/error.h"
#include "pool.h"
#include "record.h"
#include "repair.h"

struct snap_args {
    void (*emit)(void *arg, const moonlet_repl_rec *rec);
    void *arg;
};

static bool snap_visit(moonlet_master *m, struct shard *s, struct mobj *o, void *varg)
{
    (void)s;
    struct snap_args *a = varg;
    if (o->nrep) /* else nothing readable nor writable is left of it */
        repl_object_send(m, o, 0, a->emit, a->arg);
    return true;
}

int moonlet_master_snapshot_part(moonlet_master *m, uint64_t cursor,
                                 bool (*full)(void *arg),
                                 void (*emit)(void *arg, const moonlet_repl_rec *rec), void *arg,
                                 uint64_t *next)
{
    *next = 0;
    if (cursor > m->nshards)
        return MOONLET_ERR_INVALID_PARAMS;
    if (cursor == 0) { /* the first part: the segments, then shards from 0 */
        struct registry *r = &m->reg;
        uint64_t now = moonlet_clock_now_ns();
        pthread_mutex_lock(&r->mu);
        for (uint32_t i = 0; i < r->nslots; i++) {
            struct mseg *s = reg_seg(r, i);
            if (!s || atomic_load(&s->state) != SEG_MOUNTED)
                continue;
            moonlet_segment_desc d = {
                .client_id = r->clients[s->client].id, .segment_id = s->id, .name = s->name,
                .base = s->base, .size = s->size, .endpoint = s->endpoint, .protocol = s->protocol,
                .write_key = s->has_key ? s->write_key : NULL, .node_clock_ms = s->has_key ? 1 : 0,
                .alt_endpoint = s->alt_id[0] ? s->alt_endpoint : NULL,
                .alt_segment_id = s->alt_id[0] ? s->alt_id : NULL,
                .alt_protocol = s->alt_id[0] ? s->alt_protocol : NULL, .disk = s->disk};
            const struct mclient *c = &r->clients[s->client];
            moonlet_repl_rec rec = {.type = MOONLET_REPL_MOUNT, .seg = &d,
                                    .secret = {(const char *)c->secret, c->secret_len},
                                    .clock_offset_ms = atomic_load(&s->clock_offset_ms)};
            emit(arg, &rec);
            for (uint32_t q = 0; q < s->nquar; q++) {
                if (s->quar[q].until_ns <= now)
                    continue;
                moonlet_repl_rec qr = {.type = MOONLET_REPL_QUAR, .key = {"", 0},
                                       .size = s->quar[q].len, .nrep = 1,
                                       .free_ms = (s->quar[q].until_ns - now + MOONLET_NS_PER_MS - 1) /
                                                  MOONLET_NS_PER_MS};
                qr.rep_seg[0] = MOONLET_STR(s->id);
                qr.rep_off[0] = s->quar[q].offset;
                emit(arg, &qr);
            }
            pool_snapshot(s, emit, arg);
        }
        pthread_mutex_unlock(&r->mu);
        repair_snapshot_targets(m, emit, arg);
    }
    /* Whole shards, one lock at a time, until the part is full. */
    struct snap_args a = {emit, arg};
    pthread_rwlock_rdlock(&m->guard);
    for (uint32_t i = cursor ? (uint32_t)(cursor - 1) : 0; i < m->nshards; i++) {
        shards_foreach_range(m, i, i + 1, snap_visit, &a);
        if (i + 1 < m->nshards && full && full(arg)) {
            *next = (uint64_t)i + 2; /* shard i + 1, as a cursor */
            break;
        }
    }
    pthread_rwlock_unlock(&m->guard);
    return MOONLET_OK;
}

void moonlet_master_snapshot(moonlet_master *m,
                             void (*emit)(void *arg, const moonlet_repl_rec *rec), void *arg)
{
    uint64_t next;
    (void)moonlet_master_snapshot_part(m, 0, NULL, emit, arg, &next); /* cursor 0 is valid */
}
