/*
 * destroy.c - an object's end (destroy.h), the one path every removal
 * takes: Remove and PutRevoke (object.c), eviction and the stale put
 * reaper (evict.c), an unmount that strips an object's last replica
 * (unmount.c).  Below all of them, so none calls up into another.
 *
 * Locks: the caller holds the guard shared and the object's shard lock;
 * this takes repair_mu (a leaf, only while repair jobs run or copies are
 * staged), registry.mu, then tenants.lock (a leaf).
 */
#include "destroy.h"
#include "lease.h"
#include "master_internal.h"
#include "record.h"
#include "repair.h"

void object_destroy_locked(moonlet_master *m, struct shard *s, struct mobj *o)
{
    shard_unlink_locked(s, o);
    repair_object_gone_locked(m, o);
    /* An unfinished put's writer may still be sending: its ranges wait in
     * quarantine until its put deadline (after which no store node accepts
     * its writes) plus the grace.  A sealed object had every write
     * acknowledged before its PutEnd; its ranges go back at once, unless a
     * reader still holds a lease on it (only a forced Remove takes such an
     * object): then they wait until the lease ends, after which a reader's
     * own lease check refuses whatever it read (LEASE_EXPIRED), so no reader
     * gets bytes of an object placed there later. */
    uint64_t until = 0;
    if (o->state == OBJ_PENDING)
        until = o->lease_deadline + m->quarantine_grace_ns;
    else if (moonlet_lease_active(o->lease_deadline, moonlet_clock_now_ns()))
        until = o->lease_deadline;
    if (repl_on(m)) { /* before the space is freed: a record reusing it follows */
        moonlet_repl_rec rec;
        repl_object_rec(m, o, MOONLET_REPL_DROP, &rec);
        uint64_t now = moonlet_clock_now_ns();
        rec.free_ms = until > now ? (until - now + MOONLET_NS_PER_MS - 1) / MOONLET_NS_PER_MS : 0;
        repl_emit(m, &rec);
    }
    if (o->nrep)
        registry_release(m, o->hash, o->size, mobj_reps(o), o->nrep, until);
    if (o->state == OBJ_PENDING)
        atomic_fetch_sub(&m->st.pending, 1);
    atomic_fetch_sub(&m->st.objects, 1);
    atomic_fetch_sub(&m->st.bytes, o->size);
    if (mobj_hard_pinned(o)) {
        atomic_fetch_sub(&m->st.hard_pinned, 1);
        atomic_fetch_sub(&m->st.hard_pinned_bytes, mobj_pinned_bytes(o));
    }
    uint32_t tenant = o->tenant;
    mobj_free(m, o);
    tenant_release(m, tenant); /* tenants.lock is a leaf */
}
