/*
 * record.c - an object as a replication record (record.h): the PLACE,
 * SEAL and DROP records of one object, and an object as the PLACE a
 * snapshot or a repair sends.  What the store hands the replication hook
 * (cfg.repl_emit) or a snapshot's emit; it calls no replication code.
 *
 * Locks: the caller holds the guard shared and the object's shard lock;
 * repl_object_send takes tenants.lock (read, a leaf).
 */
#include <string.h>

#include "clock.h"
#include "master_internal.h"
#include "record.h"
#include "tenant.h"

void repl_object_rec(const moonlet_master *m, const struct mobj *o, uint8_t type,
                     moonlet_repl_rec *rec)
{
    memset(rec, 0, sizeof(*rec));
    rec->type = type;
    rec->tenant_id = o->tenant;
    rec->key = (moonlet_str){o->key, o->key_len};
    rec->size = o->size;
    rec->flags = (uint8_t)((o->soft_pin && !mobj_hard_pinned(o) ? MOONLET_REPL_FLAG_SOFT_PIN : 0) |
                           (mobj_hard_pinned(o) ? MOONLET_REPL_FLAG_HARD_PIN : 0));
    uint64_t now = moonlet_clock_now_ns();
    if (o->state == OBJ_PENDING) {
        rec->checksum = o->checksum; /* the put's id and replacements (mobj_put_id) */
        rec->ttl_ms = o->lease_deadline > now ? (o->lease_deadline - now) / MOONLET_NS_PER_MS : 0;
        if (rec->flags & MOONLET_REPL_FLAG_SOFT_PIN)
            rec->pin_ttl_ms = o->soft_pin_deadline / MOONLET_NS_PER_MS;
    } else {
        if (o->has_checksum)
            rec->flags |= MOONLET_REPL_FLAG_CHECKSUM;
        rec->checksum = o->checksum;
        if ((rec->flags & MOONLET_REPL_FLAG_SOFT_PIN) && o->soft_pin_deadline > now)
            rec->pin_ttl_ms = (o->soft_pin_deadline - now) / MOONLET_NS_PER_MS;
    }
    rec->nrep = o->nrep;
    for (uint32_t k = 0; k < o->nrep && k < MOONLET_REPL_MAX_REPS; k++) {
        const struct mrep *r = &mobj_creps(o)[k];
        rec->rep_seg[k] = MOONLET_STR(reg_seg(&m->reg, r->seg)->id);
        rec->rep_off[k] = r->offset;
    }
}

void repl_object_send(moonlet_master *m, const struct mobj *o, uint64_t free_ms,
                      void (*emit)(void *arg, const moonlet_repl_rec *rec),
                      void *arg)
{
    moonlet_repl_rec rec;
    repl_object_rec(m, o, MOONLET_REPL_PLACE, &rec);
    rec.free_ms = free_ms;
    if (o->state == OBJ_COMPLETE)
        rec.flags |= MOONLET_REPL_FLAG_SEALED;
    /* Only replicas on MOUNTED segments: a segment being unmounted was
     * announced (UNMOUNT) before its replicas are stripped, and a snapshot
     * lists only mounted ones, so the standby does not know it: a record
     * naming it failed to apply, and in a snapshot part after the first
     * that failure is skipped with the whole object, which is never sent
     * again (issue 31, finding 8). */
    uint32_t n = 0;
    for (uint32_t k = 0; k < rec.nrep; k++) {
        if (atomic_load(&reg_seg(&m->reg, mobj_creps(o)[k].seg)->state) != SEG_MOUNTED)
            continue;
        rec.rep_seg[n] = rec.rep_seg[k];
        rec.rep_off[n++] = rec.rep_off[k];
    }
    rec.nrep = n;
    if (rec.nrep == 0)
        return;
    char name[MOONLET_MAX_ID_BYTES + 1];
    uint32_t len = tenant_name_of(m, o->tenant, name);
    rec.tenant = (moonlet_str){name, len};
    emit(arg, &rec);
}
