/*
 * pool.c - reservation pools: space a leader sets aside, and tells its hot
 * standby about, before the PutStarts that will take it (issue 14).
 *
 * A semi-synchronous PutStart may not answer before the standby holds its
 * allocation: otherwise a failover could hand the same range to a new put
 * while the old writer's bytes are still on their way.  Waiting for the
 * standby's ack of each PutStart's PLACE costs one standby round trip per
 * put on top of PutEnd's.  A reservation moves that wait off the put's
 * path: each mounted segment keeps a pool of up to POOL_DEPTH ranges of one
 * size (the size its recent puts asked for), each allocated and sent to the
 * standby as a RESV record.  Once the standby acknowledged a range's RESV,
 * a PutStart may be placed there and answered at once: a standby promoted
 * before it heard of the put still holds the range as reserved, and keeps it
 * out of use for a put timeout + the quarantine grace (replicate.c), past
 * the old writer's capability.  The PLACE record follows as usual, and the
 * put's PutEnd waits for it (and for the pool's new RESVs) as every write
 * does.
 *
 * A pool refills when it falls to half, on the PutStart that drained it: its
 * RESVs ride on that put's PutEnd exchange.  A put of another size misses
 * the pool and is placed (and waits) as before; POOL_SWITCH_MISSES misses in
 * a row of one new size give its ranges back (UNRESV, then free) and refill
 * at the new size.  A pool holds at most 1/32 of its segment, and only sizes
 * up to POOL_MAX_LEN.  Pooled bytes count as used (they are allocated).
 *
 * Records keep the stream's rule (master.h): a RESV follows its allocation,
 * an UNRESV precedes the free, both under registry.mu.
 *
 * Locks: every function runs under registry.mu (the caller's); cfg.repl_pos
 * takes only the log's leaf lock.
 */
#include <string.h>

#include "master_internal.h"
#include "moonlet/error.h"
#include "pool.h"
#include "registry.h"

#define POOL_MAX_LEN (1u << 20)  /* larger objects always wait */
#define POOL_SWITCH_MISSES 4u    /* misses of one new size before the pool takes it */

bool pool_enabled(const moonlet_master *m)
{
    return m->cfg.repl_emit && m->cfg.repl_pos;
}

static bool pool_fits(const struct mseg *s, uint64_t len)
{
    return len <= POOL_MAX_LEN && len * POOL_DEPTH <= s->size / 32;
}

/* A RESV or UNRESV of one pooled range. */
static moonlet_repl_rec pool_rec(const struct mseg *s, uint8_t type, uint64_t off)
{
    moonlet_repl_rec rec = {.type = type, .key = {"", 0}, .size = s->pool_len, .nrep = 1};
    rec.rep_seg[0] = MOONLET_STR(s->id);
    rec.rep_off[0] = off;
    return rec;
}

static void pool_emit(moonlet_master *m, const struct mseg *s, uint8_t type, uint64_t off)
{
    moonlet_repl_rec rec = pool_rec(s, type, off);
    repl_emit(m, &rec);
}

/* Tops the pool up: each new range goes out as RESV and becomes usable once
 * the standby acknowledged every record up to the position after it. */
static void pool_refill(moonlet_master *m, struct mseg *s)
{
    uint32_t from = s->npool;
    while (s->npool < POOL_DEPTH) {
        uint64_t off;
        if (moonlet_alloc_reserve(s->alloc, s->pool_len, &off) != MOONLET_OK)
            break; /* full: the pool waits for space like any put */
        atomic_fetch_add(&m->reg.used, s->pool_len);
        pool_emit(m, s, MOONLET_REPL_RESV, off);
        s->pool_off[s->npool++] = off;
    }
    if (s->npool == from)
        return;
    uint64_t next, acked;
    m->cfg.repl_pos(m->cfg.repl_arg, &next, &acked);
    for (uint32_t i = from; i < s->npool; i++)
        s->pool_ready[i] = next;
}

/* Gives every pooled range back (UNRESV first). */
static void pool_drain(moonlet_master *m, uint32_t slot)
{
    struct mseg *s = reg_seg(&m->reg, slot);
    for (uint32_t i = 0; i < s->npool; i++) {
        pool_emit(m, s, MOONLET_REPL_UNRESV, s->pool_off[i]);
        if (moonlet_alloc_release(s->alloc, s->pool_off[i], s->pool_len) == MOONLET_OK)
            atomic_fetch_sub(&m->reg.used, s->pool_len);
    }
    if (s->npool)
        registry_avail_add_locked(&m->reg, slot);
    s->npool = 0;
}

static bool pool_usable(const struct mseg *s, uint64_t len, uint64_t acked)
{
    return s && atomic_load(&s->state) == SEG_MOUNTED && !atomic_load(&s->draining) &&
           s->pool_len == len && s->npool && s->pool_ready[0] <= acked;
}

static bool taken(const uint32_t *slots, uint32_t n, uint32_t slot)
{
    for (uint32_t k = 0; k < n; k++)
        if (slots[k] == slot)
            return true;
    return false;
}

bool pool_place(moonlet_master *m, uint64_t len, const moonlet_str *preferred,
                uint32_t npreferred, uint32_t nrep, struct mrep *reps)
{
    struct registry *r = &m->reg;
    uint64_t next, acked;
    m->cfg.repl_pos(m->cfg.repl_arg, &next, &acked);
    if (!acked || nrep > MOONLET_MAX_REPLICAS)
        return false;
    uint32_t slots[MOONLET_MAX_REPLICAS], n = 0;
    /* A preferred segment the pool cannot serve sends the put the usual way,
     * which would place it there. */
    for (uint32_t p = 0; p < npreferred && n < nrep; p++) {
        uint32_t slot = registry_slot_by_name_locked(r, preferred[p]);
        if (slot == SLOT_NONE || taken(slots, n, slot))
            continue;
        if (!pool_usable(reg_seg(r, slot), len, acked))
            return false;
        slots[n++] = slot;
    }
    uint32_t start = r->navail ? r->rr % r->navail : 0;
    for (uint32_t k = 0; k < r->navail && n < nrep; k++) {
        uint32_t slot = r->avail[(start + k) % r->navail];
        if (!taken(slots, n, slot) && pool_usable(reg_seg(r, slot), len, acked))
            slots[n++] = slot;
    }
    if (n < nrep)
        return false;
    r->rr++;
    for (uint32_t k = 0; k < n; k++) {
        struct mseg *s = reg_seg(r, slots[k]);
        reps[k] = (struct mrep){.offset = s->pool_off[0], .seg = slots[k],
                                .status = MOONLET_REPLICA_INITIALIZED};
        s->npool--;
        memmove(s->pool_off, s->pool_off + 1, s->npool * sizeof(s->pool_off[0]));
        memmove(s->pool_ready, s->pool_ready + 1, s->npool * sizeof(s->pool_ready[0]));
        if (s->npool <= POOL_DEPTH / 2)
            pool_refill(m, s);
    }
    return true;
}

void pool_note(moonlet_master *m, uint32_t slot, uint64_t len)
{
    struct mseg *s = reg_seg(&m->reg, slot);
    if (!pool_fits(s, len))
        return;
    if (s->pool_len != len) {
        if (s->pool_miss_len != len) {
            s->pool_miss_len = len;
            s->pool_misses = 0;
        }
        if (s->pool_len && ++s->pool_misses < POOL_SWITCH_MISSES)
            return;
        pool_drain(m, slot);
        s->pool_len = len;
        s->pool_misses = 0;
    }
    if (s->npool <= POOL_DEPTH / 2)
        pool_refill(m, s);
}

void pool_snapshot(const struct mseg *s, void (*emit)(void *arg, const moonlet_repl_rec *rec),
                   void *arg)
{
    for (uint32_t i = 0; i < s->npool; i++) {
        moonlet_repl_rec rec = pool_rec(s, MOONLET_REPL_RESV, s->pool_off[i]);
        emit(arg, &rec);
    }
}
