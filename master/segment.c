/*
 * segment.c - the segment registry: mounted segments, their allocators,
 * replica placement, the client table and liveness.
 *
 * A store node mounts a segment (its capacity and transport endpoint); the
 * master then places replicas in it.  Placement walks the mounted segments
 * round-robin from a rotating start and takes, for each replica, the next
 * segment whose allocator can hold the object, so the replicas of one object
 * always land on distinct segments and load spreads across nodes.  A put
 * may name preferred segments (by the name given at mount, as ListSegments
 * and moonlet-inspect show it, or by endpoint "host:port", Mooncake's
 * segment name): those are tried first, in the given order,
 * and a name that is not mounted or has no room is skipped; the replicas
 * still unplaced then go round-robin as above.
 *
 * Unmount is a whole-table operation: it takes the snapshot guard exclusive,
 * strips the segment's replicas from every object (removing objects left with
 * none) and only then frees the slot.  That keeps the invariant stated in
 * master_internal.h: a replica only names a mounted segment.
 *
 * Client ids are bound to the connection (session) that claimed them and,
 * optionally, to a secret that lets the same node reclaim its id after a
 * reconnect (see moonlet_master_bind_client in master.h): a second node
 * started with the same --client-id, or any client naming another node's
 * published id, is refused (ILLEGAL_CLIENT) instead of taking it over.
 * Write fencing (docs/reliability.md).  A segment mounted with a write key
 * gets, for each replica placed in it, a capability whose expiry is the put's
 * deadline translated into the node's clock with the offset bound the node's
 * Mount and Pings measured (node_ms_sent - master_ms_received: message delay
 * only makes it smaller, so it never overstates the node's clock).  A range
 * freed from an unfinished put waits in the segment's quarantine until its
 * put deadline plus a grace, so no stale writer's byte can land in an object
 * placed there later; sweeps return due ranges lazily (placement) and from
 * the background thread.  Quarantined bytes stay counted as used.
 *
 * Locks: registry.mu (order 3) around every registry change; unmount takes the
 * guard exclusive (order 1), then each shard lock in turn (order 2), then
 * registry.mu.  liveness_check takes nothing itself and calls unmount.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "log.h"
#include "master_internal.h"
#include "moonlet/error.h"
#include "writecap.h"

int registry_init(struct registry *r)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    return MOONLET_OK;
}

void registry_destroy(struct registry *r)
{
    for (uint32_t i = 0; i < r->nslots; i++) {
        if (r->segs[i]) {
            moonlet_alloc_destroy(r->segs[i]->alloc);
            free(r->segs[i]->quar);
            free(r->segs[i]);
        }
    }
    free(r->clients);
    pthread_mutex_destroy(&r->mu);
}

static bool str_eq(const char *c, moonlet_str s)
{
    return strlen(c) == s.len && memcmp(c, s.ptr, s.len) == 0;
}

/* Client entry by id; creates it when `create`.  registry.mu held. */
static struct mclient *client_get_locked(struct registry *r, moonlet_str id, bool create,
                                         uint32_t *idx)
{
    uint32_t free_idx = UINT32_MAX;
    for (uint32_t i = 0; i < r->nclients; i++) {
        if (r->clients[i].used && str_eq(r->clients[i].id, id)) {
            *idx = i;
            return &r->clients[i];
        }
        if (!r->clients[i].used && free_idx == UINT32_MAX)
            free_idx = i;
    }
    if (!create)
        return NULL;
    if (free_idx == UINT32_MAX) {
        if (r->nclients == r->clients_cap) {
            uint32_t cap = r->clients_cap ? r->clients_cap * 2 : 16;
            struct mclient *nc = realloc(r->clients, cap * sizeof(*nc));
            if (!nc)
                return NULL;
            r->clients = nc;
            r->clients_cap = cap;
        }
        free_idx = r->nclients++;
    }
    struct mclient *c = &r->clients[free_idx];
    memset(c, 0, sizeof(*c));
    memcpy(c->id, id.ptr, id.len);
    c->used = true;
    *idx = free_idx;
    return c;
}

static int id_check(moonlet_str s)
{
    return (s.len == 0 || s.len > MOONLET_MAX_ID_BYTES) ? MOONLET_ERR_INVALID_PARAMS : MOONLET_OK;
}

/* May `session` act for client c?  Claims an unbound id without a secret.
 * registry.mu held. */
static int client_authorize_locked(struct mclient *c, uint64_t session)
{
    if (session == 0 || c->session == session)
        return MOONLET_OK;
    if (c->session == 0 && c->secret_len == 0) {
        c->session = session;
        return MOONLET_OK;
    }
    return MOONLET_ERR_ILLEGAL_CLIENT;
}

/* The entry of client_id for a call of `session`, created (and bound to the
 * session) when absent; NULL with *rc set when refused.  registry.mu held. */
static struct mclient *client_for_call_locked(struct registry *r, moonlet_str id,
                                              uint64_t session, uint32_t *idx, int *rc)
{
    bool existed = client_get_locked(r, id, false, idx) != NULL;
    struct mclient *c = client_get_locked(r, id, true, idx);
    if (!c) {
        *rc = MOONLET_ERR_INTERNAL_ERROR;
        return NULL;
    }
    if (!existed) {
        c->session = session;
        c->last_ping_ns = moonlet_clock_now_ns();
    }
    if ((*rc = client_authorize_locked(c, session))) {
        ML_WARN("master", "refused a call for client %s from another connection than the one "
                "that holds it (a second node with the same --client-id, or an impostor)", c->id);
        return NULL;
    }
    return c;
}

int moonlet_master_bind_client(moonlet_master *m, moonlet_str client_id, moonlet_str secret,
                               uint64_t session)
{
    if (id_check(client_id) || secret.len == 0 || secret.len > MOONLET_MAX_SECRET_BYTES ||
        session == 0)
        return MOONLET_ERR_INVALID_PARAMS;
    struct registry *r = &m->reg;
    uint32_t idx;
    int rc = MOONLET_OK;
    pthread_mutex_lock(&r->mu);
    bool existed = client_get_locked(r, client_id, false, &idx) != NULL;
    struct mclient *c = client_get_locked(r, client_id, true, &idx);
    if (!c) {
        rc = MOONLET_ERR_INTERNAL_ERROR;
    } else if (!existed || (c->secret_len == 0 && (c->session == 0 || c->session == session))) {
        memcpy(c->secret, secret.ptr, secret.len);
        c->secret_len = (uint8_t)secret.len;
        c->session = session;
        if (!existed)
            c->last_ping_ns = moonlet_clock_now_ns();
    } else {
        /* constant time over the stored length: the secret is never leaked by timing */
        unsigned diff = c->secret_len != secret.len;
        for (uint32_t i = 0; i < c->secret_len; i++)
            diff |= (unsigned)(c->secret[i] ^ (uint8_t)secret.ptr[i < secret.len ? i : 0]);
        if (c->secret_len == 0 || diff) {
            rc = MOONLET_ERR_ILLEGAL_CLIENT;
            ML_WARN("master", "client id %s is held by another live node: refused (it is free "
                    "once that node has not pinged for %" PRIu64 " ms)", c->id,
                    m->client_ttl_ns / MOONLET_NS_PER_MS);
        } else {
            c->session = session; /* the same node, reconnected */
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void moonlet_master_session_closed(moonlet_master *m, uint64_t session)
{
    if (session == 0)
        return;
    struct registry *r = &m->reg;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->nclients; i++) {
        struct mclient *c = &r->clients[i];
        if (!c->used || c->session != session)
            continue;
        c->session = 0;
        /* Nothing mounted (a clean shutdown unmounted first): forget the
         * id now, so a restart with the same id need not wait for expiry. */
        if (c->nsegs == 0)
            c->used = false;
    }
    pthread_mutex_unlock(&r->mu);
}

int moonlet_master_ping_as(moonlet_master *m, moonlet_str client_id, uint64_t session,
                           uint32_t *segments_out)
{
    if (id_check(client_id))
        return MOONLET_ERR_INVALID_PARAMS;
    struct registry *r = &m->reg;
    uint32_t idx;
    int rc;
    pthread_mutex_lock(&r->mu);
    struct mclient *c = client_for_call_locked(r, client_id, session, &idx, &rc);
    if (c) {
        c->last_ping_ns = moonlet_clock_now_ns();
        if (segments_out)
            *segments_out = c->nsegs;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int moonlet_master_ping(moonlet_master *m, moonlet_str client_id, uint32_t *segments_out)
{
    return moonlet_master_ping_as(m, client_id, 0, segments_out);
}

/* node_ms sent, master's now received: a lower bound of node - master (ms). */
static int64_t clock_offset_bound(uint64_t node_ms)
{
    uint64_t master_ms = (moonlet_clock_now_ns() + MOONLET_NS_PER_MS - 1) / MOONLET_NS_PER_MS;
    return (int64_t)node_ms - (int64_t)master_ms;
}

void moonlet_master_note_node_clock(moonlet_master *m, moonlet_str client_id, uint64_t node_ms)
{
    if (id_check(client_id) || node_ms == 0 || node_ms > INT64_MAX)
        return;
    int64_t off = clock_offset_bound(node_ms);
    struct registry *r = &m->reg;
    uint32_t idx;
    pthread_mutex_lock(&r->mu);
    if (client_get_locked(r, client_id, false, &idx)) {
        for (uint32_t i = 0; i < r->nslots; i++) {
            struct mseg *s = r->segs[i];
            if (s && s->client == idx && atomic_load(&s->state) == SEG_MOUNTED)
                atomic_store(&s->clock_offset_ms, off);
        }
    }
    pthread_mutex_unlock(&r->mu);
}

static struct mseg *seg_find_locked(struct registry *r, moonlet_str id, uint32_t *slot)
{
    for (uint32_t i = 0; i < r->nslots; i++) {
        struct mseg *s = r->segs[i];
        if (s && atomic_load(&s->state) == SEG_MOUNTED && str_eq(s->id, id)) {
            *slot = i;
            return s;
        }
    }
    return NULL;
}

static int seg_desc_check(const moonlet_segment_desc *d)
{
    if (!d->client_id || !d->segment_id || !d->endpoint || !d->protocol)
        return MOONLET_ERR_INVALID_PARAMS;
    if (id_check(MOONLET_STR(d->client_id)) || id_check(MOONLET_STR(d->segment_id)))
        return MOONLET_ERR_INVALID_PARAMS;
    if (d->name && strlen(d->name) > MOONLET_MAX_ID_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    if (strlen(d->endpoint) > MOONLET_MAX_ENDPOINT_BYTES || strlen(d->protocol) >= 16)
        return MOONLET_ERR_INVALID_PARAMS;
    if (d->size < MOONLET_ALLOC_ALIGN || d->size > MOONLET_MAX_SEGMENT_BYTES ||
        d->base > UINT64_MAX - d->size)
        return MOONLET_ERR_INVALID_PARAMS;
    /* A key without the node's clock would give capabilities no expiry. */
    if (d->write_key && (d->node_clock_ms == 0 || d->node_clock_ms > INT64_MAX))
        return MOONLET_ERR_INVALID_PARAMS;
    /* A second endpoint: all of it, with a key, and another protocol. */
    bool alt = d->alt_endpoint || d->alt_segment_id || d->alt_protocol;
    if (alt && (!d->alt_endpoint || !d->alt_segment_id || !d->alt_protocol || !d->write_key ||
                id_check(MOONLET_STR(d->alt_segment_id)) ||
                strlen(d->alt_endpoint) > MOONLET_MAX_ENDPOINT_BYTES ||
                strlen(d->alt_protocol) >= 16 || strcmp(d->alt_protocol, d->protocol) == 0))
        return MOONLET_ERR_INVALID_PARAMS;
    return MOONLET_OK;
}

int moonlet_master_mount_segment(moonlet_master *m, const moonlet_segment_desc *d)
{
    return moonlet_master_mount_segment_as(m, d, 0);
}

int moonlet_master_mount_segment_as(moonlet_master *m, const moonlet_segment_desc *d,
                                    uint64_t session)
{
    int rc = seg_desc_check(d);
    if (rc)
        return rc;
    struct registry *r = &m->reg;
    moonlet_alloc *alloc = moonlet_alloc_create(d->size);
    if (!alloc)
        return MOONLET_ERR_INTERNAL_ERROR;

    pthread_mutex_lock(&r->mu);
    uint32_t slot, cidx;
    if (seg_find_locked(r, MOONLET_STR(d->segment_id), &slot)) {
        rc = MOONLET_ERR_SEGMENT_ALREADY_EXISTS;
        goto out;
    }
    for (slot = 0; slot < r->nslots; slot++)
        if (r->segs[slot] && atomic_load(&r->segs[slot]->state) == SEG_FREE)
            break;
    if (slot == r->nslots) {
        if (r->nslots == MOONLET_MAX_SEGMENTS || !(r->segs[slot] = calloc(1, sizeof(struct mseg)))) {
            rc = MOONLET_ERR_NO_AVAILABLE_HANDLE;
            goto out;
        }
        r->nslots++;
    }
    struct mclient *c = client_for_call_locked(r, MOONLET_STR(d->client_id), session, &cidx, &rc);
    if (!c)
        goto out;
    struct mseg *s = r->segs[slot];
    snprintf(s->id, sizeof(s->id), "%s", d->segment_id);
    snprintf(s->name, sizeof(s->name), "%s", d->name ? d->name : d->segment_id);
    snprintf(s->endpoint, sizeof(s->endpoint), "%s", d->endpoint);
    snprintf(s->protocol, sizeof(s->protocol), "%s", d->protocol);
    snprintf(s->alt_id, sizeof(s->alt_id), "%s", d->alt_segment_id ? d->alt_segment_id : "");
    snprintf(s->alt_endpoint, sizeof(s->alt_endpoint), "%s", d->alt_endpoint ? d->alt_endpoint : "");
    snprintf(s->alt_protocol, sizeof(s->alt_protocol), "%s", d->alt_protocol ? d->alt_protocol : "");
    s->base = d->base;
    s->size = moonlet_alloc_capacity(alloc);
    s->alloc = alloc;
    alloc = NULL;
    s->objects = 0;
    s->has_key = d->write_key != NULL;
    if (s->has_key)
        memcpy(s->write_key, d->write_key, sizeof(s->write_key));
    atomic_store(&s->clock_offset_ms, s->has_key ? clock_offset_bound(d->node_clock_ms) : 0);
    s->nquar = 0;
    s->client = cidx;
    c->nsegs++;
    c->last_ping_ns = moonlet_clock_now_ns();
    r->nmounted++;
    atomic_fetch_add(&r->capacity, s->size);
    atomic_store(&s->state, SEG_MOUNTED);
    ML_INFO("master", "mounted segment %s (%" PRIu64 " bytes) of client %s at %s://%s%s%s%s%s",
            s->id, s->size, c->id, s->protocol, s->endpoint, s->alt_id[0] ? " and " : "",
            s->alt_protocol, s->alt_id[0] ? "://" : "", s->alt_endpoint);
out:
    pthread_mutex_unlock(&r->mu);
    moonlet_alloc_destroy(alloc);
    return rc;
}

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
    }
    return true;
}

/* Removes every replica on `slot` from every object; guard held exclusive. */
static uint64_t strip_segment(moonlet_master *m, uint32_t slot)
{
    struct strip_args st = {.slot = slot};
    shards_foreach(m, strip_visit, &st);
    return st.removed;
}

static int unmount_slot(moonlet_master *m, moonlet_str client_id, moonlet_str segment_id,
                        bool check_owner, uint64_t session)
{
    struct registry *r = &m->reg;
    pthread_rwlock_wrlock(&m->guard);
    pthread_mutex_lock(&r->mu);
    uint32_t slot;
    struct mseg *s = seg_find_locked(r, segment_id, &slot);
    int rc = MOONLET_OK;
    if (!s)
        rc = MOONLET_ERR_SEGMENT_NOT_FOUND;
    else if (check_owner && (!str_eq(r->clients[s->client].id, client_id) ||
                             client_authorize_locked(&r->clients[s->client], session)))
        rc = MOONLET_ERR_ILLEGAL_CLIENT;
    else
        atomic_store(&s->state, SEG_UNMOUNTING);
    pthread_mutex_unlock(&r->mu);
    if (rc) {
        pthread_rwlock_unlock(&m->guard);
        return rc;
    }

    uint64_t removed = strip_segment(m, slot);

    pthread_mutex_lock(&r->mu);
    atomic_fetch_sub(&r->capacity, s->size);
    atomic_fetch_sub(&r->used, moonlet_alloc_used(s->alloc));
    for (uint32_t q = 0; q < s->nquar; q++) /* gone with the segment's id and key */
        atomic_fetch_sub(&r->quarantined, s->quar[q].len);
    s->nquar = 0;
    moonlet_alloc_destroy(s->alloc);
    s->alloc = NULL;
    r->nmounted--;
    struct mclient *c = &r->clients[s->client];
    if (c->nsegs)
        c->nsegs--;
    ML_INFO("master", "unmounted segment %s of client %s; %" PRIu64 " objects lost their last replica",
            s->id, c->id, removed);
    atomic_store(&s->state, SEG_FREE);
    pthread_mutex_unlock(&r->mu);
    pthread_rwlock_unlock(&m->guard);
    return MOONLET_OK;
}

int moonlet_master_unmount_segment_as(moonlet_master *m, moonlet_str client_id,
                                      moonlet_str segment_id, uint64_t session)
{
    if (id_check(client_id) || id_check(segment_id))
        return MOONLET_ERR_INVALID_PARAMS;
    return unmount_slot(m, client_id, segment_id, true, session);
}

int moonlet_master_unmount_segment(moonlet_master *m, moonlet_str client_id, moonlet_str segment_id)
{
    return moonlet_master_unmount_segment_as(m, client_id, segment_id, 0);
}

/* Returns the segment's due quarantined ranges to its allocator.  registry.mu held. */
static void quarantine_release_due_locked(struct registry *r, struct mseg *s, uint64_t now)
{
    uint32_t keep = 0;
    for (uint32_t q = 0; q < s->nquar; q++) {
        struct quarantined *e = &s->quar[q];
        if (e->until_ns > now) {
            s->quar[keep++] = *e;
            continue;
        }
        if (moonlet_alloc_release(s->alloc, e->offset, e->len) == MOONLET_OK)
            atomic_fetch_sub(&r->used, e->len);
        else
            ML_ERR("master", "segment %s: release of quarantined [%" PRIu64 ", +%" PRIu64
                   ") refused", s->id, e->offset, e->len);
        atomic_fetch_sub(&r->quarantined, e->len);
    }
    s->nquar = keep;
}

/* Holds [offset, +len) back until until_ns; false when out of memory. */
static bool quarantine_add_locked(struct registry *r, struct mseg *s, uint64_t offset,
                                  uint64_t len, uint64_t until_ns)
{
    if (s->nquar == s->quar_cap) {
        uint32_t cap = s->quar_cap ? s->quar_cap * 2 : 16;
        struct quarantined *q = realloc(s->quar, cap * sizeof(*q));
        if (!q)
            return false;
        s->quar = q;
        s->quar_cap = cap;
    }
    s->quar[s->nquar++] = (struct quarantined){offset, len, until_ns};
    atomic_fetch_add(&r->quarantined, len);
    return true;
}

void registry_quarantine_sweep(moonlet_master *m)
{
    struct registry *r = &m->reg;
    uint64_t now = moonlet_clock_now_ns();
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->nslots; i++) {
        struct mseg *s = r->segs[i];
        if (s && atomic_load(&s->state) == SEG_MOUNTED && s->nquar)
            quarantine_release_due_locked(r, s, now);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Reserves len on mounted segment `slot` unless a replica of this object is
 * already there.  Caller holds registry.mu. */
static bool place_on_locked(struct registry *r, uint32_t slot, uint64_t len, uint64_t now,
                            struct mrep *reps, uint32_t placed)
{
    struct mseg *s = r->segs[slot];
    if (!s || atomic_load(&s->state) != SEG_MOUNTED)
        return false;
    for (uint32_t k = 0; k < placed; k++)
        if (reps[k].seg == slot)
            return false;
    if (s->nquar)
        quarantine_release_due_locked(r, s, now);
    uint64_t off;
    if (moonlet_alloc_reserve(s->alloc, len, &off) != MOONLET_OK)
        return false;
    s->objects++;
    reps[placed] = (struct mrep){.offset = off, .seg = slot, .status = MOONLET_REPLICA_INITIALIZED};
    return true;
}

/* The mounted slot whose name is `name`, else the first whose endpoint
 * ("host:port", what Mooncake calls a segment name) is; UINT32_MAX when
 * none.  Caller holds registry.mu. */
static uint32_t slot_by_name_locked(const struct registry *r, moonlet_str name)
{
    uint32_t by_endpoint = UINT32_MAX;
    for (uint32_t i = 0; i < r->nslots; i++) {
        const struct mseg *s = r->segs[i];
        if (!s || atomic_load(&s->state) != SEG_MOUNTED)
            continue;
        if (strlen(s->name) == name.len && memcmp(s->name, name.ptr, name.len) == 0)
            return i;
        if (by_endpoint == UINT32_MAX && strlen(s->endpoint) == name.len &&
            memcmp(s->endpoint, name.ptr, name.len) == 0)
            by_endpoint = i;
    }
    return by_endpoint;
}

int registry_place_preferred_locked(moonlet_master *m, uint64_t size, uint32_t nrep,
                                    const moonlet_str *preferred, uint32_t npreferred,
                                    struct mrep *reps)
{
    struct registry *r = &m->reg;
    uint64_t len = moonlet_alloc_rounded(size ? size : 1);
    uint64_t now = moonlet_clock_now_ns();
    pthread_mutex_lock(&r->mu);
    if (r->nmounted < nrep) {
        pthread_mutex_unlock(&r->mu);
        return MOONLET_ERR_NO_AVAILABLE_HANDLE;
    }
    uint32_t placed = 0;
    /* Preferred names first (a linear scan each: segments are few and a
     * preference list is short); duplicates fall out of place_on_locked. */
    for (uint32_t p = 0; p < npreferred && placed < nrep; p++) {
        uint32_t slot = slot_by_name_locked(r, preferred[p]);
        if (slot != UINT32_MAX && place_on_locked(r, slot, len, now, reps, placed))
            placed++;
    }
    uint32_t start = r->rr++;
    for (uint32_t k = 0; k < r->nslots && placed < nrep; k++)
        if (place_on_locked(r, (start + k) % r->nslots, len, now, reps, placed))
            placed++;
    if (placed == nrep) {
        atomic_fetch_add(&r->used, len * nrep);
        pthread_mutex_unlock(&r->mu);
        return MOONLET_OK;
    }
    for (uint32_t k = 0; k < placed; k++) {
        struct mseg *s = r->segs[reps[k].seg];
        moonlet_alloc_release(s->alloc, reps[k].offset, len);
        s->objects--;
    }
    pthread_mutex_unlock(&r->mu);
    return MOONLET_ERR_NO_AVAILABLE_HANDLE;
}

int registry_place_locked(moonlet_master *m, uint64_t size, uint32_t nrep, struct mrep *reps)
{
    return registry_place_preferred_locked(m, size, nrep, NULL, 0, reps);
}

void registry_release(moonlet_master *m, uint64_t size, const struct mrep *reps, uint32_t nrep,
                      uint64_t until_ns)
{
    struct registry *r = &m->reg;
    uint64_t len = moonlet_alloc_rounded(size ? size : 1);
    pthread_mutex_lock(&r->mu);
    for (uint32_t k = 0; k < nrep; k++) {
        struct mseg *s = r->segs[reps[k].seg];
        if (!s || !s->alloc)
            continue;
        s->objects--;
        /* Quarantined bytes stay in `used`: they are not allocatable. */
        if (until_ns && quarantine_add_locked(r, s, reps[k].offset, len, until_ns))
            continue;
        if (until_ns) /* out of memory for the list: keep the range for good */
            ML_ERR("master", "segment %s: cannot quarantine [%" PRIu64 ", +%" PRIu64
                   "); it stays allocated", s->id, reps[k].offset, len);
        else if (moonlet_alloc_release(s->alloc, reps[k].offset, len) == MOONLET_OK)
            atomic_fetch_sub(&r->used, len);
        else
            ML_ERR("master", "segment %s: release of [%" PRIu64 ", +%" PRIu64 ") refused",
                   s->id, reps[k].offset, len);
    }
    pthread_mutex_unlock(&r->mu);
}

void replica_cap_fill(const moonlet_master *m, const struct mrep *rp, uint64_t size,
                      uint64_t deadline_ns, uint64_t now_ns, moonlet_replica_view *v)
{
    const struct mseg *s = m->reg.segs[rp->seg];
    v->put_ttl_ms = deadline_ns > now_ns ? (deadline_ns - now_ns) / MOONLET_NS_PER_MS : 0;
    v->has_cap = s->has_key;
    if (!s->has_key)
        return;
    /* The put deadline on the node's clock, rounded down: any write the node
     * accepts happens before the deadline in real time. */
    int64_t e = (int64_t)(deadline_ns / MOONLET_NS_PER_MS) + atomic_load(&s->clock_offset_ms);
    v->cap_len = moonlet_alloc_rounded(size ? size : 1);
    v->cap_expiry_ms = e > 0 ? (uint64_t)e : 1;
    /* Only TCP checks capabilities: the tag names the TCP registration. */
    const char *cap_id = s->alt_id[0] && strcmp(s->alt_protocol, "tcp") == 0 ? s->alt_id : s->id;
    v->cap_tag = moonlet_writecap_tag(s->write_key, cap_id, rp->offset, v->cap_len,
                                      v->cap_expiry_ms);
}

void replica_view_fill(const moonlet_master *m, const struct mobj *o, const struct mrep *rp,
                       moonlet_replica_view *v)
{
    const struct mseg *s = m->reg.segs[rp->seg];
    v->segment_id = s->id;
    v->segment_name = s->name;
    v->endpoint = s->endpoint;
    v->protocol = s->protocol;
    v->alt_segment_id = s->alt_id[0] ? s->alt_id : NULL;
    v->alt_endpoint = s->alt_id[0] ? s->alt_endpoint : NULL;
    v->alt_protocol = s->alt_id[0] ? s->alt_protocol : NULL;
    v->base = s->base;
    v->offset = rp->offset;
    v->size = o->size;
    v->status = rp->status;
    v->has_cap = false;
    v->cap_len = v->cap_expiry_ms = v->cap_tag = v->put_ttl_ms = 0;
}

uint32_t registry_segments_fitting(moonlet_master *m, uint64_t len)
{
    uint32_t n = 0;
    pthread_mutex_lock(&m->reg.mu);
    for (uint32_t i = 0; i < m->reg.nslots; i++) {
        struct mseg *s = m->reg.segs[i];
        n += s && atomic_load(&s->state) == SEG_MOUNTED && s->size >= len;
    }
    pthread_mutex_unlock(&m->reg.mu);
    return n;
}

struct free_visit {
    void (*fn)(void *arg, uint32_t slot, uint64_t offset, uint64_t len);
    void *arg;
    uint32_t slot;
};

static void free_visit_one(void *arg, uint64_t offset, uint64_t len)
{
    struct free_visit *v = arg;
    v->fn(v->arg, v->slot, offset, len);
}

void registry_foreach_free(moonlet_master *m, uint64_t min_size,
                           void (*fn)(void *arg, uint32_t slot, uint64_t offset, uint64_t len),
                           void *arg)
{
    struct free_visit v = {.fn = fn, .arg = arg};
    pthread_mutex_lock(&m->reg.mu);
    for (uint32_t i = 0; i < m->reg.nslots; i++) {
        struct mseg *s = m->reg.segs[i];
        if (!s || atomic_load(&s->state) != SEG_MOUNTED || s->size < min_size)
            continue;
        v.slot = i;
        moonlet_alloc_foreach_free(s->alloc, free_visit_one, &v);
    }
    pthread_mutex_unlock(&m->reg.mu);
}

uint32_t registry_mounted(moonlet_master *m)
{
    pthread_mutex_lock(&m->reg.mu);
    uint32_t n = m->reg.nmounted;
    pthread_mutex_unlock(&m->reg.mu);
    return n;
}

double registry_usage(moonlet_master *m)
{
    uint64_t cap = atomic_load(&m->reg.capacity);
    return cap ? (double)atomic_load(&m->reg.used) / (double)cap : 0.0;
}

void liveness_check(moonlet_master *m)
{
    struct registry *r = &m->reg;
    uint64_t now = moonlet_clock_now_ns();
    for (;;) {
        char client[MOONLET_MAX_ID_BYTES + 1], seg[MOONLET_MAX_ID_BYTES + 1];
        bool found = false;
        pthread_mutex_lock(&r->mu);
        for (uint32_t i = 0; i < r->nclients && !found; i++) {
            struct mclient *c = &r->clients[i];
            if (!c->used || now - c->last_ping_ns < m->client_ttl_ns || c->last_ping_ns > now)
                continue;
            for (uint32_t k = 0; k < r->nslots; k++) {
                struct mseg *s = r->segs[k];
                if (s && s->client == i && atomic_load(&s->state) == SEG_MOUNTED) {
                    snprintf(client, sizeof(client), "%s", c->id);
                    snprintf(seg, sizeof(seg), "%s", s->id);
                    found = true;
                    break;
                }
            }
            if (!found) {
                ML_INFO("master", "client %s expired (no ping for %" PRIu64 " ms)", c->id,
                        (now - c->last_ping_ns) / MOONLET_NS_PER_MS);
                c->used = false;
            }
        }
        pthread_mutex_unlock(&r->mu);
        if (!found)
            return;
        ML_WARN("master", "client %s missed its liveness deadline: unmounting segment %s",
                client, seg);
        if (unmount_slot(m, MOONLET_STR(client), MOONLET_STR(seg), false, 0) == MOONLET_OK)
            atomic_fetch_add(&m->st.unmounts_by_liveness, 1);
    }
}

int moonlet_master_list_segments(moonlet_master *m,
                                 void (*visit)(void *arg, const moonlet_segment_view *s),
                                 void *arg)
{
    struct registry *r = &m->reg;
    uint64_t now = moonlet_clock_now_ns();
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < r->nslots; i++) {
        struct mseg *s = r->segs[i];
        if (!s || atomic_load(&s->state) != SEG_MOUNTED)
            continue;
        struct mclient *c = &r->clients[s->client];
        moonlet_segment_view v = {
            .segment_id = s->id, .name = s->name, .client_id = c->id,
            .endpoint = s->endpoint, .protocol = s->protocol, .base = s->base,
            .alt_segment_id = s->alt_id[0] ? s->alt_id : NULL,
            .alt_endpoint = s->alt_id[0] ? s->alt_endpoint : NULL,
            .alt_protocol = s->alt_id[0] ? s->alt_protocol : NULL,
            .capacity = s->size, .used = moonlet_alloc_used(s->alloc), .objects = s->objects,
            .last_ping_age_ms = now > c->last_ping_ns ? (now - c->last_ping_ns) / MOONLET_NS_PER_MS : 0,
        };
        visit(arg, &v);
    }
    pthread_mutex_unlock(&r->mu);
    return MOONLET_OK;
}
