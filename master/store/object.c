/*
 * object.c - object lifecycle: PutStart / PutEnd / PutRevoke, replica lists,
 * existence (with leases), Remove and RemoveAll.
 *
 * Every operation here touches one key at a time: it takes the snapshot
 * guard shared, then that key's shard lock, and - only to allocate or free
 * space - the registry lock.  A batch takes the guard once and the shard
 * locks one after another, never two at once.
 *
 * PutStart may find no space.  A put larger than every segment but fewer
 * than replica_num is refused at once (INVALID_PARAMS: it can never fit).
 * Otherwise it drops every lock, evicts for its own contiguous space
 * (evict_for_space, which takes evict_mu, the guard and shard locks itself)
 * and tries again, at most 3 times, so eviction never runs under a shard
 * lock and stops as soon as nothing can be evicted usefully.
 *
 * PutStart reports, per replica, a write capability whose expiry is the put
 * deadline on the store node's clock (segment.c); an unfinished put's ranges
 * go to quarantine when it is revoked or reaped (object_destroy_locked).
 * PutEnd may record the writer's checksum of the bytes; GetReplicaList
 * returns it to readers.
 *
 * PutReplaceReplica swaps one replica of a put in progress whose write
 * failed for one on another segment (never one holding a replica of the
 * object, nor one the writer excluded), under the key's shard lock: the old
 * range is quarantined like a revoked put's, the new one gets a capability
 * expiring at the same put deadline, and at most MOONLET_MAX_PUT_REPLACEMENTS
 * are granted per put (counted in the header's checksum field while the put
 * is pending), so a writer can never loop over placements.
 *
 * PutStart's options (moonlet_master_put_opts): preferred segments go to
 * placement (placement.c); a soft pin's TTL (the object's own or the master's)
 * waits in soft_pin_deadline until PutEnd turns it into a deadline; a hard
 * pin is the deadline MOBJ_HARD_PIN, which eviction never takes.  Its bytes
 * (size x replicas) are reserved in st.hard_pinned_bytes against
 * cfg.hard_pin_max_ratio of the capacity before placement (an atomic add,
 * undone on failure; no lock) and released when the object is destroyed.
 *
 * object_destroy_locked (destroy.c, below this file, evict.c and unmount.c,
 * which all take objects away) gives an object's space back, unlinks and
 * frees it.
 *
 * Locks: guard (shared) -> one shard lock -> registry.mu, then tenants.lock
 * (a leaf) when an object's destruction drops its tenant reference.
 */
#include <stdlib.h>
#include <string.h>

#include "destroy.h"
#include "evict.h"
#include "lease.h"
#include "master_internal.h"
#include "moonlet/error.h"
#include "object.h"
#include "placement.h"
#include "record.h"
#include "repair.h"
#include "tenant.h"

/* A key located in its shard: what every single-key operation starts from. */
struct keyref {
    moonlet_str tname; /* the tenant's name, as the call gave it */
    uint32_t tenant;
    uint64_t hash;
    struct shard *shard;
};

/* Validates key and tenant and finds the shard.  Tenant not found is not an
 * error: ref->tenant is then MOONLET_NO_TENANT and every lookup misses.
 * With `create`, the tenant is created if needed and the caller holds a
 * reference on it (tenant_release) when this returns 0. */
static int keyref_init(moonlet_master *m, moonlet_str tenant, moonlet_str key, bool create,
                       struct keyref *ref)
{
    int rc = key_check(key);
    if (rc)
        return rc;
    ref->tname = tenant;
    rc = create ? tenant_acquire(m, tenant, &ref->tenant) : tenant_lookup(m, tenant, &ref->tenant);
    if (rc)
        return rc;
    ref->hash = key_hash(ref->tenant, key.ptr, key.len);
    ref->shard = &m->shards[shard_of(m, ref->hash)];
    return MOONLET_OK;
}

static struct mobj *keyref_find_locked(const struct keyref *ref, moonlet_str key)
{
    if (ref->tenant == MOONLET_NO_TENANT)
        return NULL;
    return shard_find_locked(ref->shard, ref->hash, ref->tenant, key.ptr, key.len);
}

/* An operation on one existing object, run under its shard lock. */
typedef int (*object_op)(moonlet_master *m, struct shard *s, struct mobj *o, void *arg);

/* Locks the key's shard (guard shared first), finds the object and runs op
 * on it; OBJECT_NOT_FOUND when there is none. */
static int with_object(moonlet_master *m, moonlet_str tenant, moonlet_str key, object_op op,
                       void *arg)
{
    struct keyref ref;
    int rc = keyref_init(m, tenant, key, false, &ref);
    if (rc)
        return rc;
    pthread_rwlock_rdlock(&m->guard);
    pthread_mutex_lock(&ref.shard->mu);
    struct mobj *o = keyref_find_locked(&ref, key);
    rc = o ? op(m, ref.shard, o, arg) : MOONLET_ERR_OBJECT_NOT_FOUND;
    pthread_mutex_unlock(&ref.shard->mu);
    pthread_rwlock_unlock(&m->guard);
    return rc;
}

static void visit_replicas(moonlet_master *m, const struct mobj *o, bool readable_only,
                           moonlet_replica_visitor visit, void *arg)
{
    if (!visit)
        return;
    for (uint32_t k = 0; k < o->nrep; k++) {
        if (readable_only && mobj_creps(o)[k].status != MOONLET_REPLICA_COMPLETE)
            continue;
        moonlet_replica_view v;
        replica_view_fill(m, o, &mobj_creps(o)[k], &v);
        visit(arg, &v);
    }
}

/* One PutStart attempt; NO_AVAILABLE_HANDLE lets the caller evict and retry. */
static int put_start_once(moonlet_master *m, const struct keyref *ref, moonlet_str key,
                          uint64_t size, const moonlet_master_put_opts *po,
                          moonlet_replica_visitor visit, void *arg)
{
    uint32_t nrep = po->replica_num;
    int rc = MOONLET_OK;
    pthread_rwlock_rdlock(&m->guard);
    pthread_mutex_lock(&ref->shard->mu);
    if (keyref_find_locked(ref, key)) {
        rc = MOONLET_ERR_OBJECT_ALREADY_EXISTS;
        goto out;
    }
    struct mobj *o = mobj_new(m, ref->tenant, ref->hash, key.ptr, key.len, nrep);
    if (!o) {
        rc = MOONLET_ERR_INTERNAL_ERROR;
        goto out;
    }
    /* A hard pin reserves its bytes against the cap first, so concurrent
     * puts cannot together pin more than cfg.hard_pin_max_ratio. */
    uint64_t pin_bytes = size * nrep;
    if (po->hard_pin) {
        uint64_t cap = (uint64_t)(m->cfg.hard_pin_max_ratio * (double)atomic_load(&m->reg.capacity));
        uint64_t before = atomic_fetch_add(&m->st.hard_pinned_bytes, pin_bytes);
        if (before + pin_bytes > cap) {
            atomic_fetch_sub(&m->st.hard_pinned_bytes, pin_bytes);
            mobj_free(m, o);
            rc = MOONLET_ERR_NO_AVAILABLE_HANDLE;
            goto out;
        }
    }
    rc = registry_place_preferred_locked(m, ref->hash, size, nrep, po->preferred, po->npreferred,
                                         mobj_reps(o), po->covered);
    if (rc) {
        if (po->hard_pin)
            atomic_fetch_sub(&m->st.hard_pinned_bytes, pin_bytes);
        mobj_free(m, o);
        goto out;
    }
    uint64_t now = moonlet_clock_now_ns();
    o->size = size;
    o->state = OBJ_PENDING;
    o->soft_pin = po->soft_pin || po->hard_pin;
    /* Until PutEnd: the pin's TTL, or the hard-pin mark (master_internal.h). */
    if (po->hard_pin) {
        o->soft_pin_deadline = MOBJ_HARD_PIN;
        atomic_fetch_add(&m->st.hard_pinned, 1);
    } else if (po->soft_pin) {
        o->soft_pin_deadline = po->soft_pin_ttl_ms ? po->soft_pin_ttl_ms * MOONLET_NS_PER_MS
                                                   : m->soft_pin_ttl_ns;
    } else {
        o->soft_pin_deadline = 0;
    }
    o->has_checksum = 0;
    uint64_t put_id;
    do /* never 0 (bounded: 0 comes once in 2^56 ids) */
        put_id = atomic_fetch_add_explicit(&m->next_put_id, 1, memory_order_relaxed) &
                 MOBJ_PUT_ID_MASK; /* unique is all an id needs: no ordering */
    while (put_id == 0);
    o->checksum = put_id << 8; /* and no replacement yet */
    if (po->put_id)
        *po->put_id = put_id;
    o->lease_deadline = now + m->put_timeout_ns; /* put deadline */
    shard_insert_locked(ref->shard, o);
    tenant_ref(m, ref->tenant); /* the object's own reference */
    atomic_fetch_add(&m->st.objects, 1);
    atomic_fetch_add(&m->st.pending, 1);
    atomic_fetch_add(&m->st.bytes, size);
    atomic_fetch_add(&m->st.put_starts, 1);
    if (po->covered && *po->covered)
        atomic_fetch_add(&m->st.put_starts_reserved, 1);
    if (repl_on(m)) {
        moonlet_repl_rec rec;
        repl_object_rec(m, o, MOONLET_REPL_PLACE, &rec);
        rec.tenant = ref->tname;
        repl_emit(m, &rec);
    }
    for (uint32_t k = 0; visit && k < o->nrep; k++) {
        moonlet_replica_view v;
        replica_view_fill(m, o, &mobj_reps(o)[k], &v);
        replica_cap_fill(m, &mobj_reps(o)[k], size, o->lease_deadline, now, &v);
        visit(arg, &v);
    }
out:
    pthread_mutex_unlock(&ref->shard->mu);
    pthread_rwlock_unlock(&m->guard);
    return rc;
}

int moonlet_master_put_start_opts(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                  uint64_t size, const moonlet_master_put_opts *po,
                                  moonlet_replica_visitor visit, void *arg)
{
    uint32_t replica_num = po ? po->replica_num : 0;
    if (!po || replica_num == 0 || replica_num > MOONLET_MAX_REPLICAS || size > (1ull << 50) ||
        po->npreferred > MOONLET_MAX_PREFERRED || (po->npreferred && !po->preferred) ||
        po->soft_pin_ttl_ms > (1ull << 40))
        return MOONLET_ERR_INVALID_PARAMS;
    struct keyref ref;
    int rc = keyref_init(m, tenant, key, true, &ref);
    if (rc)
        return rc;
    rc = put_start_once(m, &ref, key, size, po, visit, arg);
    /* Eviction frees space, not segments: a put larger than all but fewer
     * than replica_num segments can never fit, and evicting would only lose
     * objects.  Otherwise evict for this request's contiguous space (a run
     * on each of replica_num segments); a few rounds, as other puts may take
     * the space in between.  A hard pin refused by its cap gains nothing
     * from evicting (hard-pinned bytes are never evicted). */
    bool can_fit = true;
    if (rc == MOONLET_ERR_NO_AVAILABLE_HANDLE && po->hard_pin &&
        atomic_load(&m->st.hard_pinned_bytes) + size * replica_num >
            (uint64_t)(m->cfg.hard_pin_max_ratio * (double)atomic_load(&m->reg.capacity)))
        can_fit = false;
    if (rc == MOONLET_ERR_NO_AVAILABLE_HANDLE && can_fit &&
        registry_segments_fitting(m, moonlet_alloc_rounded(size ? size : 1)) < replica_num) {
        can_fit = false;
        if (registry_mounted(m) >= replica_num)
            rc = MOONLET_ERR_INVALID_PARAMS;
    }
    for (int i = 0; i < 3 && can_fit && rc == MOONLET_ERR_NO_AVAILABLE_HANDLE; i++) {
        /* Nothing evicted: the space may still have been freed meanwhile
         * (a demotion's copy swapped in, a removal), so one more try. */
        bool none = evict_for_space(m, size, replica_num) == 0;
        rc = put_start_once(m, &ref, key, size, po, visit, arg);
        if (none)
            break;
    }
    /* The call's reference; a failed call under a new name frees the tenant here. */
    tenant_release(m, ref.tenant);
    return rc;
}

int moonlet_master_put_start(moonlet_master *m, moonlet_str tenant, moonlet_str key, uint64_t size,
                             uint32_t replica_num, bool soft_pin, moonlet_replica_visitor visit,
                             void *arg)
{
    moonlet_master_put_opts po = {.replica_num = replica_num, .soft_pin = soft_pin};
    return moonlet_master_put_start_opts(m, tenant, key, size, &po, visit, arg);
}

struct end_args {
    const uint64_t *checksum;
    const uint64_t *put_id; /* NULL: whichever put holds the key */
};

/* The put named by PutEnd / PutRevoke is o's: no id named, or o's id.  A
 * put reaped, revoked or unmounted and then started again under the same
 * key by another client is another put: its id differs (issue 31, finding
 * 5: a late PutEnd sealed the new put's half-written object with the old
 * writer's checksum, a late PutRevoke killed it). */
static bool put_is(const struct mobj *o, const uint64_t *put_id)
{
    return !put_id || mobj_put_id(o) == (*put_id & MOBJ_PUT_ID_MASK);
}

static int put_end_op(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    const struct end_args *ea = arg;
    const uint64_t *checksum = ea->checksum;
    if (o->state != OBJ_PENDING)
        return MOONLET_ERR_INVALID_WRITE;
    if (!put_is(o, ea->put_id))
        return MOONLET_ERR_OBJECT_NOT_FOUND;
    /* While PENDING, checksum held the put's id and replacements. */
    o->checksum = checksum ? *checksum : 0;
    o->has_checksum = checksum != NULL;
    for (uint32_t k = 0; k < o->nrep; k++)
        mobj_reps(o)[k].status = MOONLET_REPLICA_COMPLETE;
    o->state = OBJ_COMPLETE;
    /* An expired lease dated now: no protection, but eviction (earliest
     * deadline first) then ranks a fresh object after those last read long
     * ago instead of before them - least recently used goes first. */
    o->lease_deadline = moonlet_clock_now_ns();
    /* The TTL PutStart kept in soft_pin_deadline becomes the pin's deadline;
     * a hard pin keeps its mark. */
    if (o->soft_pin && !mobj_hard_pinned(o))
        o->soft_pin_deadline = moonlet_lease_grant(0, moonlet_clock_now_ns(), o->soft_pin_deadline);
    atomic_fetch_sub(&m->st.pending, 1);
    atomic_fetch_add(&m->st.put_ends, 1);
    if (repl_on(m)) {
        moonlet_repl_rec rec;
        repl_object_rec(m, o, MOONLET_REPL_SEAL, &rec);
        repl_emit(m, &rec);
    }
    /* A put whose every replica was lost in flight leaves nothing readable. */
    if (o->nrep == 0)
        object_destroy_locked(m, s, o);
    else /* one lost in flight, or on a segment draining meanwhile: repair.c */
        repair_note_locked(m, o);
    return MOONLET_OK;
}

int moonlet_master_put_end_ex(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                              const uint64_t *checksum, const uint64_t *put_id)
{
    struct end_args ea = {checksum, put_id};
    return with_object(m, tenant, key, put_end_op, &ea);
}

int moonlet_master_put_end(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                           const uint64_t *checksum)
{
    return moonlet_master_put_end_ex(m, tenant, key, checksum, NULL);
}

static int put_revoke_op(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    if (o->state != OBJ_PENDING)
        return MOONLET_ERR_INVALID_WRITE;
    if (!put_is(o, arg))
        return MOONLET_ERR_OBJECT_NOT_FOUND;
    object_destroy_locked(m, s, o);
    atomic_fetch_add(&m->st.put_revokes, 1);
    return MOONLET_OK;
}

int moonlet_master_put_revoke_ex(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                 const uint64_t *put_id)
{
    return with_object(m, tenant, key, put_revoke_op, (void *)put_id);
}

int moonlet_master_put_revoke(moonlet_master *m, moonlet_str tenant, moonlet_str key)
{
    return moonlet_master_put_revoke_ex(m, tenant, key, NULL);
}

struct replace_args {
    moonlet_str tenant;
    moonlet_str failed;
    const moonlet_str *excluded;
    uint32_t nexcluded;
    moonlet_replica_visitor visit;
    void *arg;
};

/* PutReplaceReplica under the object's shard lock: the put stays as it was
 * unless a replacement was placed (o->checksum counts the grants while the
 * put is PENDING; PutEnd resets it). */
static int put_replace_op(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    (void)s;
    const struct replace_args *ra = arg;
    uint64_t now = moonlet_clock_now_ns();
    if (o->state != OBJ_PENDING || now >= o->lease_deadline)
        return MOONLET_ERR_INVALID_WRITE;
    struct mrep *reps = mobj_reps(o);
    uint32_t k = 0;
    while (k < o->nrep && !registry_slot_named(m, reps[k].seg, ra->failed))
        k++;
    if (k == o->nrep && o->nrep >= o->nrep_cap)
        return MOONLET_ERR_INVALID_PARAMS; /* no such replica, and none is missing */
    if (mobj_replacements(o) >= MOONLET_MAX_PUT_REPLACEMENTS)
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    /* The failed segment is avoided even when its replica is gone already. */
    moonlet_str avoid[MOONLET_MAX_EXCLUDED + 1];
    if (ra->nexcluded) /* excluded may be NULL when there are none */
        memcpy(avoid, ra->excluded, ra->nexcluded * sizeof(*avoid));
    avoid[ra->nexcluded] = ra->failed;
    struct mrep fresh;
    int rc = registry_place_replacement_locked(m, o->hash, o->size, reps, o->nrep, avoid,
                                               ra->nexcluded + 1, &fresh);
    if (rc)
        return rc;
    if (k < o->nrep) /* its writer may still be sending: quarantine, as a revoked put's */
        registry_release(m, o->hash, o->size, &reps[k], 1,
                         o->lease_deadline + m->quarantine_grace_ns);
    else
        o->nrep++;
    reps[k] = fresh;
    o->checksum++; /* one more replacement (the low byte) */
    atomic_fetch_add(&m->st.put_replacements, 1);
    if (repl_on(m)) { /* the replaced range waits as long as the leader's quarantine */
        moonlet_repl_rec rec;
        repl_object_rec(m, o, MOONLET_REPL_PLACE, &rec);
        rec.tenant = ra->tenant;
        rec.free_ms = rec.ttl_ms + m->cfg.put_quarantine_grace_ms;
        repl_emit(m, &rec);
    }
    if (ra->visit) {
        moonlet_replica_view v;
        replica_view_fill(m, o, &reps[k], &v);
        replica_cap_fill(m, &reps[k], o->size, o->lease_deadline, now, &v);
        ra->visit(ra->arg, &v);
    }
    return MOONLET_OK;
}

int moonlet_master_put_replace_replica(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                       moonlet_str failed, const moonlet_str *excluded,
                                       uint32_t nexcluded, moonlet_replica_visitor visit,
                                       void *arg)
{
    if (nexcluded > MOONLET_MAX_EXCLUDED || (nexcluded && !excluded) || !failed.len)
        return MOONLET_ERR_INVALID_PARAMS;
    struct replace_args ra = {tenant, failed, excluded, nexcluded, visit, arg};
    return with_object(m, tenant, key, put_replace_op, &ra);
}

struct get_args {
    uint64_t *size, *lease_ttl_ms;
    bool *has_checksum;
    uint64_t *checksum;
    moonlet_replica_visitor visit;
    void *arg;
};

static int get_replicas_op(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    struct get_args *g = arg;
    if (!mobj_readable(o))
        return MOONLET_ERR_REPLICA_IS_NOT_READY;
    o->lease_deadline = moonlet_lease_grant(o->lease_deadline, moonlet_clock_now_ns(),
                                            m->lease_ttl_ns);
    atomic_fetch_add(&m->st.leases_get, 1);
    if (g->size)
        *g->size = o->size;
    if (g->lease_ttl_ms)
        *g->lease_ttl_ms = m->cfg.lease_ttl_ms;
    if (g->has_checksum)
        *g->has_checksum = o->has_checksum;
    if (g->checksum)
        *g->checksum = o->checksum;
    visit_replicas(m, o, true, g->visit, g->arg);
    return MOONLET_OK;
}

int moonlet_master_get_replica_list(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                    uint64_t *size, uint64_t *lease_ttl_ms,
                                    moonlet_replica_visitor visit, void *arg)
{
    struct get_args g = {size, lease_ttl_ms, NULL, NULL, visit, arg};
    return with_object(m, tenant, key, get_replicas_op, &g);
}

int moonlet_master_get_replica_list_ck(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                       uint64_t *size, uint64_t *lease_ttl_ms,
                                       bool *has_checksum, uint64_t *checksum,
                                       moonlet_replica_visitor visit, void *arg)
{
    struct get_args g = {size, lease_ttl_ms, has_checksum, checksum, visit, arg};
    return with_object(m, tenant, key, get_replicas_op, &g);
}

struct exist_ctx {
    moonlet_master *m;
    int32_t *results;
    uint64_t now;
    bool lease;
    uint64_t leased;
};

/* Runs under the key's shard lock (shard_batch_lookup). */
static void exist_visit(void *arg, size_t i, struct mobj *o)
{
    struct exist_ctx *c = arg;
    int32_t hit = o && mobj_readable(o);
    if (hit && c->lease) {
        o->lease_deadline = moonlet_lease_grant(o->lease_deadline, c->now, c->m->lease_ttl_ns);
        c->leased++;
    }
    c->results[i] = hit;
}

static int master_exist_batch(moonlet_master *m, moonlet_str tenant, const moonlet_str *keys,
                              size_t n, bool lease, int32_t *results)
{
    uint32_t tid;
    int rc = tenant_lookup(m, tenant, &tid);
    if (rc)
        return rc;
    if (tid == MOONLET_NO_TENANT) { /* nothing stored for it: misses, or bad keys */
        for (size_t i = 0; i < n; i++)
            results[i] = key_check(keys[i]) ? MOONLET_ERR_INVALID_KEY : 0;
        return MOONLET_OK;
    }
    struct exist_ctx c = {.m = m, .results = results, .now = moonlet_clock_now_ns(), .lease = lease};
    pthread_rwlock_rdlock(&m->guard);
    shard_batch_lookup(m, tid, keys, n, results, NULL, exist_visit, &c);
    pthread_rwlock_unlock(&m->guard);
    if (c.leased)
        atomic_fetch_add_explicit(&m->st.leases_exist, c.leased, memory_order_relaxed);
    return MOONLET_OK;
}

static int exist_single(moonlet_master *m, moonlet_str tenant, moonlet_str key, bool lease,
                        bool *exists)
{
    int32_t r;
    int rc = master_exist_batch(m, tenant, &key, 1, lease, &r);
    if (rc)
        return rc;
    if (r < 0)
        return r;
    *exists = r == 1;
    return MOONLET_OK;
}

int moonlet_master_exist_key(moonlet_master *m, moonlet_str tenant, moonlet_str key, bool *exists)
{
    return exist_single(m, tenant, key, true, exists);
}

int moonlet_master_batch_exist_key(moonlet_master *m, moonlet_str tenant, const moonlet_str *keys,
                                   size_t n, int32_t *results)
{
    return master_exist_batch(m, tenant, keys, n, true, results);
}

int moonlet_master_probe_key(moonlet_master *m, moonlet_str tenant, moonlet_str key, bool *exists)
{
    return exist_single(m, tenant, key, false, exists);
}

static int remove_op(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    bool force = *(const bool *)arg;
    if (o->state == OBJ_PENDING)
        return MOONLET_ERR_REPLICA_IS_NOT_READY;
    if (!force && moonlet_lease_active(o->lease_deadline, moonlet_clock_now_ns()))
        return MOONLET_ERR_OBJECT_HAS_LEASE;
    object_destroy_locked(m, s, o);
    atomic_fetch_add(&m->st.removes, 1);
    return MOONLET_OK;
}

int moonlet_master_remove_ex(moonlet_master *m, moonlet_str tenant, moonlet_str key, bool force)
{
    return with_object(m, tenant, key, remove_op, &force);
}

int moonlet_master_remove(moonlet_master *m, moonlet_str tenant, moonlet_str key)
{
    return moonlet_master_remove_ex(m, tenant, key, false);
}

struct remove_all_args {
    uint32_t tenant;
    uint64_t now, removed;
    bool force;
};

static bool remove_all_visit(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    struct remove_all_args *r = arg;
    if (o->tenant != r->tenant || o->state != OBJ_COMPLETE ||
        (!r->force && moonlet_lease_active(o->lease_deadline, r->now)))
        return true;
    object_destroy_locked(m, s, o);
    r->removed++;
    return true;
}

int moonlet_master_remove_all(moonlet_master *m, moonlet_str tenant, uint64_t *removed)
{
    return moonlet_master_remove_all_ex(m, tenant, false, removed);
}

int moonlet_master_remove_all_ex(moonlet_master *m, moonlet_str tenant, bool force,
                                 uint64_t *removed)
{
    struct remove_all_args r = {.now = moonlet_clock_now_ns(), .force = force};
    int rc = tenant_lookup(m, tenant, &r.tenant);
    *removed = 0;
    if (rc || r.tenant == MOONLET_NO_TENANT)
        return rc;
    pthread_rwlock_rdlock(&m->guard);
    shards_foreach(m, remove_all_visit, &r);
    pthread_rwlock_unlock(&m->guard);
    *removed = r.removed;
    atomic_fetch_add(&m->st.removes, r.removed);
    return MOONLET_OK;
}

int moonlet_master_restore_object(moonlet_master *m, const moonlet_repl_rec *rec, bool sealed,
                                  bool has_checksum, uint64_t checksum)
{
    if (!rec || rec->nrep == 0 || rec->nrep > MOONLET_MAX_REPLICAS || rec->size > (1ull << 50) ||
        rec->ttl_ms > (1ull << 40) || rec->pin_ttl_ms > (1ull << 40))
        return MOONLET_ERR_INVALID_PARAMS;
    struct keyref ref;
    int rc = keyref_init(m, rec->tenant, rec->key, true, &ref);
    if (rc)
        return rc;
    pthread_rwlock_rdlock(&m->guard);
    pthread_mutex_lock(&ref.shard->mu);
    struct mobj *o = NULL;
    if (keyref_find_locked(&ref, rec->key)) {
        rc = MOONLET_ERR_OBJECT_ALREADY_EXISTS;
        goto out;
    }
    if (!(o = mobj_new(m, ref.tenant, ref.hash, rec->key.ptr, rec->key.len, rec->nrep))) {
        rc = MOONLET_ERR_INTERNAL_ERROR;
        goto out;
    }
    uint32_t disk_key = moonlet_disk_key_bytes((uint32_t)tenant_canonical(rec->tenant).len,
                                               (uint32_t)rec->key.len);
    rc = registry_place_at_locked(m, ref.hash, rec->size, disk_key, rec->rep_seg,
                                  rec->rep_off, rec->nrep,
                                  mobj_reps(o));
    if (rc) {
        mobj_free(m, o);
        goto out;
    }
    uint64_t now = moonlet_clock_now_ns();
    bool hard = rec->flags & MOONLET_REPL_FLAG_HARD_PIN;
    bool soft = (rec->flags & MOONLET_REPL_FLAG_SOFT_PIN) && !hard;
    o->size = rec->size;
    o->soft_pin = hard || soft;
    o->soft_pin_deadline = 0;
    if (hard) {
        o->soft_pin_deadline = MOBJ_HARD_PIN;
        atomic_fetch_add(&m->st.hard_pinned, 1);
        atomic_fetch_add(&m->st.hard_pinned_bytes, mobj_pinned_bytes(o));
    }
    if (sealed) {
        o->state = OBJ_COMPLETE;
        for (uint32_t k = 0; k < o->nrep; k++)
            mobj_reps(o)[k].status = MOONLET_REPLICA_COMPLETE;
        o->has_checksum = has_checksum;
        o->checksum = has_checksum ? checksum : 0;
        /* A fresh read lease: nothing is evicted before the engines resume. */
        o->lease_deadline = now + m->lease_ttl_ns;
        if (soft)
            o->soft_pin_deadline = now + rec->pin_ttl_ms * MOONLET_NS_PER_MS;
    } else {
        o->state = OBJ_PENDING;
        o->has_checksum = 0;
        o->checksum = checksum; /* the put's id and replacements, as the leader had them */
        o->lease_deadline = now + rec->ttl_ms * MOONLET_NS_PER_MS; /* the put deadline */
        if (soft)
            o->soft_pin_deadline = rec->pin_ttl_ms * MOONLET_NS_PER_MS;
        atomic_fetch_add(&m->st.pending, 1);
    }
    shard_insert_locked(ref.shard, o);
    tenant_ref(m, ref.tenant);
    atomic_fetch_add(&m->st.objects, 1);
    atomic_fetch_add(&m->st.bytes, rec->size);
out:
    pthread_mutex_unlock(&ref.shard->mu);
    pthread_rwlock_unlock(&m->guard);
    tenant_release(m, ref.tenant);
    return rc;
}

int moonlet_master_disk_announce(moonlet_master *m, moonlet_str client_id, uint64_t session,
                                 moonlet_str segment_id, const moonlet_disk_entry *e, uint32_t n,
                                 int32_t *codes)
{
    if (n && (!e || !codes))
        return MOONLET_ERR_INVALID_PARAMS;
    uint32_t slots[16], ns = 0;
    int rc = registry_client_slots(m, client_id, session, slots, 16, &ns);
    if (rc)
        return rc;
    bool mine = false;
    pthread_rwlock_rdlock(&m->guard);
    for (uint32_t i = 0; i < ns && !mine; i++)
        mine = registry_slot_named(m, slots[i], segment_id) && registry_slot_disk(m, slots[i]);
    pthread_rwlock_unlock(&m->guard);
    if (!mine)
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    for (uint32_t i = 0; i < n; i++) {
        moonlet_repl_rec rec = {.type = MOONLET_REPL_PLACE, .tenant = e[i].tenant,
                                .key = e[i].key, .size = e[i].size, .nrep = 1};
        rec.rep_seg[0] = segment_id;
        rec.rep_off[0] = e[i].offset;
        codes[i] = moonlet_master_restore_object(m, &rec, true, true, e[i].checksum);
        if (codes[i] == MOONLET_OK) {
            atomic_fetch_add(&m->st.disk_announced, 1);
            object_replicate(m, e[i].tenant, e[i].key);
        }
    }
    return MOONLET_OK;
}

static int replicate_op(moonlet_master *m, struct shard *s, struct mobj *o, void *arg)
{
    (void)s;
    (void)arg;
    repl_object_send(m, o, 0, m->cfg.repl_emit, m->cfg.repl_arg);
    return MOONLET_OK;
}

void object_replicate(moonlet_master *m, moonlet_str tenant, moonlet_str key)
{
    if (repl_on(m))
        with_object(m, tenant, key, replicate_op, NULL);
}

int moonlet_master_restore_reserved(moonlet_master *m, moonlet_str segment_id, uint64_t offset,
                                    uint64_t len)
{
    if (!segment_id.len || len == 0)
        return MOONLET_ERR_INVALID_PARAMS;
    return registry_quarantine_at(m, segment_id, offset, len,
                                  moonlet_clock_now_ns() + m->put_timeout_ns +
                                      m->quarantine_grace_ns);
}

int moonlet_master_restore_quarantine(moonlet_master *m, moonlet_str segment_id, uint64_t offset,
                                      uint64_t len, uint64_t ttl_ms)
{
    if (!segment_id.len || len == 0 || ttl_ms > (1ull << 40))
        return MOONLET_ERR_INVALID_PARAMS;
    return registry_quarantine_at(m, segment_id, offset, len,
                                  moonlet_clock_now_ns() + ttl_ms * MOONLET_NS_PER_MS);
}
