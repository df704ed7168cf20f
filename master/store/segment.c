/*
 * segment.c - the segment registry (registry.h): mounted segments, their
 * allocators, the client table and the order of their pings.  A pure
 * registry: it never touches an object (unmount.c strips replicas, destroy.c
 * destroys objects).
 *
 * No request scans all segments or clients: ids, names and endpoints map to
 * slots and client entries through hash maps (hmap.c); slots live in chunks
 * that never move (registry.h), so there is no cap but memory.
 *
 * A store node mounts a segment (its capacity and transport endpoint); the
 * master then places replicas in it (placement.c, over the ring of segments
 * with room, `avail`, that this file keeps: a segment that cannot hold a
 * request leaves the ring, a release or a quarantine expiry on it brings it
 * back).
 *
 * Each segment indexes the hashes of the objects with a replica on it
 * (added at placement, dropped at release, both under registry.mu), so an
 * unmount visits only its own objects: registry_unmount_begin hands the
 * index over, unmount.c strips, registry_retire frees the slot after the
 * reader barrier (master_internal.h states the invariant).
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
 * Disk segments (a store node's disk tier, one per path) are mounted like
 * the others, with `disk` set: they are never in `avail` (puts and repairs
 * do not place there), their capacity and use count apart (disk_capacity,
 * disk_used; the eviction watermark reads DRAM's), their ranges are
 * extents of whole disk blocks (mrep_len), placed by demotions
 * (registry_place_disk_locked) and by a restarted node's announce.  A disk
 * extent that is released does not go back to the allocator: it waits in
 * the segment's trims (after a reader's lease) until its node says it has
 * invalidated the object's header (moonlet_master_disk_trim), so nothing
 * is placed over an object the node still holds and a removed object does
 * not come back with the node's restart.
 *
 * Locks: registry.mu (order 3) around every registry change and lookup; it
 * is never held while calling out (registry_collect_expired's callback only
 * queues).  ListSegments copies a chunk of segments under it and visits
 * them after releasing it.  Nothing here takes the guard or a shard lock.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "lease.h"
#include "log.h"
#include "master_internal.h"
#include "pool.h"
#include "registry.h"
#include "moonlet/error.h"
#include "sync.h"
#include "writecap.h"

int registry_init(struct registry *r)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    r->lhead = r->ltail = UINT32_MAX;
    return MOONLET_OK;
}

void registry_destroy(struct registry *r)
{
    for (uint32_t i = 0; i < r->nslots; i++) {
        struct mseg *s = reg_seg(r, i);
        if (s) {
            moonlet_alloc_destroy(s->alloc);
            hmap_free(&s->ix);
            free(s->quar);
            free(s->trims);
            free(s);
        }
    }
    for (uint32_t c = 0; c < SEG_DIR; c++)
        free(r->dir[c]);
    hmap_free(&r->seg_by_id);
    hmap_free(&r->seg_by_name);
    hmap_free(&r->seg_by_endpoint);
    hmap_free(&r->client_by_id);
    hmap_free(&r->by_session);
    free(r->free_slots);
    free(r->avail);
    free(r->free_clients);
    free(r->clients);
    pthread_mutex_destroy(&r->mu);
}

static bool str_eq(const char *c, moonlet_str s)
{
    return strlen(c) == s.len && memcmp(c, s.ptr, s.len) == 0;
}

/* Appends v to a growable uint32 array; false when out of memory. */
static bool u32_push(uint32_t **a, uint32_t *n, uint32_t *cap, uint32_t v)
{
    uint32_t *na = moonlet_grow(*a, *n, cap, 64, sizeof(*na));
    if (!na)
        return false;
    *a = na;
    (*a)[(*n)++] = v;
    return true;
}

/* ---- lookups by id ----------------------------------------------------------- */

/* The strings behind a value of the registry's maps (hmap_find_str). */
static moonlet_str client_id_of(const void *r, uint32_t v)
{
    return MOONLET_STR(((const struct registry *)r)->clients[v].id);
}

static moonlet_str seg_id_of(const void *r, uint32_t v)
{
    return MOONLET_STR(reg_seg(r, v)->id);
}

static moonlet_str seg_name_of(const void *r, uint32_t v)
{
    return MOONLET_STR(reg_seg(r, v)->name);
}

static moonlet_str seg_endpoint_of(const void *r, uint32_t v)
{
    return MOONLET_STR(reg_seg(r, v)->endpoint);
}

/* ---- the ping-order list of clients (registry.mu) -------------------------------- */

static void lru_unlink(struct registry *r, uint32_t i)
{
    struct mclient *c = &r->clients[i];
    if (c->lprev != UINT32_MAX)
        r->clients[c->lprev].lnext = c->lnext;
    else
        r->lhead = c->lnext;
    if (c->lnext != UINT32_MAX)
        r->clients[c->lnext].lprev = c->lprev;
    else
        r->ltail = c->lprev;
    c->lnext = c->lprev = UINT32_MAX;
}

static void lru_append(struct registry *r, uint32_t i)
{
    struct mclient *c = &r->clients[i];
    c->lnext = UINT32_MAX;
    c->lprev = r->ltail;
    if (r->ltail != UINT32_MAX)
        r->clients[r->ltail].lnext = i;
    else
        r->lhead = i;
    r->ltail = i;
}

/* Records a ping (or anything that proves the client alive) now. */
static void client_touch_locked(struct registry *r, uint32_t i)
{
    r->clients[i].last_ping_ns = moonlet_clock_now_ns();
    if (r->ltail != i) {
        lru_unlink(r, i);
        lru_append(r, i);
    }
}

/* Binds client i to `session` (0: unbound), keeping registry.by_session,
 * which finds a closed connection's clients without a scan.  registry.mu held. */
static void client_set_session_locked(struct registry *r, uint32_t i, uint64_t session)
{
    struct mclient *c = &r->clients[i];
    if (c->session == session)
        return;
    if (c->session)
        hmap_remove_hv(&r->by_session, c->session, i);
    c->session = session;
    if (session && !hmap_insert(&r->by_session, session, i))
        ML_WARN("master", "out of memory: client %s stays bound to its connection after it "
                "closes, until it expires", c->id);
}

/* Forgets a client entry (its segments are gone).  registry.mu held. */
/* Sets client i's disk tier figures (NULL: none), keeping the sums. */
static void client_set_disk_locked(struct registry *r, uint32_t i, const uint64_t *v)
{
    struct mclient *c = &r->clients[i];
    for (uint32_t k = 0; k < MOONLET_NODE_DISK_NFIELDS; k++) {
        uint64_t nv = v ? v[k] : 0;
        atomic_fetch_add(&r->node_disk[k], nv - c->disk[k]); /* modulo 2^64: the difference */
        c->disk[k] = nv;
    }
    c->has_disk = v != NULL;
}

static void client_forget_locked(struct registry *r, uint32_t i)
{
    struct mclient *c = &r->clients[i];
    client_set_disk_locked(r, i, NULL);
    client_set_session_locked(r, i, 0);
    lru_unlink(r, i);
    hmap_remove_hv(&r->client_by_id, hmap_str_hash(c->id, strlen(c->id)), i);
    c->used = false;
    r->nused--;
    if (!u32_push(&r->free_clients, &r->nfree_clients, &r->free_clients_cap, i))
        ML_WARN("master", "out of memory: client entry %u is not reused", i);
}

/* Client entry by id; creates it when `create`.  registry.mu held. */
static struct mclient *client_get_locked(struct registry *r, moonlet_str id, bool create,
                                         uint32_t *idx)
{
    uint64_t h = hmap_str_hash(id.ptr, id.len);
    struct hent *e = hmap_find_str(&r->client_by_id, h, id, client_id_of, r);
    if (e) {
        *idx = e->v;
        return &r->clients[e->v];
    }
    if (!create)
        return NULL;
    uint32_t i;
    if (r->nfree_clients) {
        i = r->free_clients[--r->nfree_clients];
    } else {
        struct mclient *nc = moonlet_grow(r->clients, r->nclients, &r->clients_cap, 16,
                                          sizeof(*nc));
        if (!nc)
            return NULL;
        r->clients = nc;
        i = r->nclients++;
    }
    if (!hmap_insert(&r->client_by_id, h, i)) {
        if (!u32_push(&r->free_clients, &r->nfree_clients, &r->free_clients_cap, i))
            ML_WARN("master", "out of memory: client entry %u is not reused", i);
        return NULL;
    }
    struct mclient *c = &r->clients[i];
    memset(c, 0, sizeof(*c));
    memcpy(c->id, id.ptr, id.len);
    c->first_seg = SLOT_NONE;
    c->used = true;
    r->nused++;
    c->last_ping_ns = moonlet_clock_now_ns();
    lru_append(r, i);
    *idx = i;
    return c;
}

static int id_check(moonlet_str s)
{
    return (s.len == 0 || s.len > MOONLET_MAX_ID_BYTES) ? MOONLET_ERR_INVALID_PARAMS : MOONLET_OK;
}

/* May `session` act for client i?  Claims an unbound id without a secret.
 * registry.mu held. */
static int client_authorize_locked(struct registry *r, uint32_t i, uint64_t session)
{
    struct mclient *c = &r->clients[i];
    if (session == 0 || c->session == session)
        return MOONLET_OK;
    if (c->session == 0 && c->secret_len == 0) {
        client_set_session_locked(r, i, session);
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
        client_set_session_locked(r, *idx, session);
        c->last_ping_ns = moonlet_clock_now_ns();
    }
    if ((*rc = client_authorize_locked(r, *idx, session))) {
        ML_WARN("master", "refused a call for client %s from another connection than the one "
                "that holds it (a second node with the same --client-id, or an impostor)", c->id);
        return NULL;
    }
    return c;
}

int moonlet_master_restore_client_secret(moonlet_master *m, moonlet_str client_id,
                                         moonlet_str secret)
{
    if (id_check(client_id) || secret.len > MOONLET_MAX_SECRET_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    if (secret.len == 0)
        return MOONLET_OK;
    struct registry *r = &m->reg;
    uint32_t idx;
    int rc = MOONLET_OK;
    pthread_mutex_lock(&r->mu);
    struct mclient *c = client_get_locked(r, client_id, false, &idx);
    if (!c)
        rc = MOONLET_ERR_INVALID_PARAMS;
    else if (c->secret_len && (c->secret_len != secret.len ||
                               memcmp(c->secret, secret.ptr, secret.len) != 0))
        rc = MOONLET_ERR_ILLEGAL_CLIENT;
    else {
        memcpy(c->secret, secret.ptr, secret.len);
        c->secret_len = (uint8_t)secret.len;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
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
        client_set_session_locked(r, idx, session);
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
            client_set_session_locked(r, idx, session); /* the same node, reconnected */
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
    /* the connection's clients through by_session (each pass drops one entry) */
    for (struct hent *e; (e = hmap_find(&r->by_session, session, NULL, NULL));) {
        uint32_t i = e->v;
        hmap_remove(&r->by_session, e);
        if (r->clients[i].session == session)
            r->clients[i].session = 0;
        /* Nothing mounted (a clean shutdown unmounted first): forget the
         * id now, so a restart with the same id need not wait for expiry. */
        if (r->clients[i].nsegs == 0)
            client_forget_locked(r, i);
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
        client_touch_locked(r, idx);
        if (segments_out)
            *segments_out = c->nsegs;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void moonlet_master_note_node_disk(moonlet_master *m, moonlet_str client_id, const uint64_t *v,
                                   uint32_t n)
{
    uint64_t d[MOONLET_NODE_DISK_NFIELDS] = {0};
    if (id_check(client_id) || (n && !v))
        return;
    memcpy(d, v, (n < MOONLET_NODE_DISK_NFIELDS ? n : MOONLET_NODE_DISK_NFIELDS) * sizeof(*d));
    struct registry *r = &m->reg;
    uint32_t idx;
    pthread_mutex_lock(&r->mu);
    if (client_get_locked(r, client_id, false, &idx))
        client_set_disk_locked(r, idx, d);
    pthread_mutex_unlock(&r->mu);
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

void moonlet_master_set_epoch(moonlet_master *m, uint64_t epoch)
{
    uint64_t cur = atomic_load_explicit(&m->epoch, memory_order_relaxed);
    while (cur < epoch && !atomic_compare_exchange_weak(&m->epoch, &cur, epoch))
        ;
}

void moonlet_master_note_node_clock(moonlet_master *m, moonlet_str client_id, uint64_t node_ms)
{
    if (id_check(client_id) || node_ms == 0 || node_ms > INT64_MAX)
        return;
    int64_t off = clock_offset_bound(node_ms);
    struct registry *r = &m->reg;
    uint32_t idx;
    pthread_mutex_lock(&r->mu);
    struct mclient *c = client_get_locked(r, client_id, false, &idx);
    for (uint32_t i = c ? c->first_seg : SLOT_NONE; i != SLOT_NONE; i = reg_seg(r, i)->cnext)
        atomic_store(&reg_seg(r, i)->clock_offset_ms, off);
    pthread_mutex_unlock(&r->mu);
}

/* The MOUNTED segment with this id.  registry.mu held. */
struct mseg *registry_seg_find_locked(struct registry *r, moonlet_str id, uint32_t *slot)
{
    struct hent *e = hmap_find_str(&r->seg_by_id, hmap_str_hash(id.ptr, id.len), id, seg_id_of, r);
    if (!e)
        return NULL;
    *slot = e->v;
    return reg_seg(r, e->v);
}

/* A FREE slot: a reused one, else a new one (its chunk allocated on first
 * use).  SLOT_NONE when out of memory.  registry.mu held. */
static uint32_t slot_alloc_locked(struct registry *r)
{
    if (r->nfree)
        return r->free_slots[--r->nfree];
    uint32_t i = r->nslots;
    if (i / SEG_CHUNK >= SEG_DIR)
        return SLOT_NONE;
    struct mseg **chunk = r->dir[i / SEG_CHUNK];
    if (!chunk) {
        if (!(chunk = calloc(SEG_CHUNK, sizeof(*chunk))))
            return SLOT_NONE;
        r->dir[i / SEG_CHUNK] = chunk;
    }
    if (!(chunk[i % SEG_CHUNK] = calloc(1, sizeof(struct mseg))))
        return SLOT_NONE;
    r->nslots++;
    return i;
}

/* ---- the ring of segments placement tries (registry.mu) ---------------------------- */

void registry_avail_add_locked(struct registry *r, uint32_t slot)
{
    struct mseg *s = reg_seg(r, slot);
    if (s->avail_pos != SLOT_NONE || atomic_load(&s->state) != SEG_MOUNTED ||
        atomic_load(&s->draining) || s->disk)
        return;
    if (u32_push(&r->avail, &r->navail, &r->avail_cap, slot))
        s->avail_pos = r->navail - 1;
}

void registry_avail_remove_locked(struct registry *r, uint32_t slot)
{
    struct mseg *s = reg_seg(r, slot);
    uint32_t pos = s->avail_pos;
    if (pos == SLOT_NONE)
        return;
    uint32_t last = r->avail[--r->navail];
    if (last != slot) {
        r->avail[pos] = last;
        reg_seg(r, last)->avail_pos = pos;
    }
    s->avail_pos = SLOT_NONE;
}

/* ---- the per-segment index of object hashes (registry.mu) --------------------------- */

static void ix_add_locked(struct mseg *s, uint64_t hash)
{
    struct hent *e = hmap_find(&s->ix, hash, NULL, NULL);
    if (e)
        e->v++;
    else if (!hmap_insert(&s->ix, hash, 1))
        /* the unmount would miss this object: it keeps a replica naming a
         * retired slot.  Never silently: say so. */
        ML_ERR("master", "segment %s: out of memory for its object index", s->id);
}

static void ix_del_locked(struct mseg *s, uint64_t hash)
{
    struct hent *e = hmap_find(&s->ix, hash, NULL, NULL);
    if (e && --e->v == 0)
        hmap_remove(&s->ix, e);
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
    /* A disk segment: whole disk blocks, one endpoint, nothing to write to
     * through the transport (the node writes its own disk). */
    if (d->disk && (d->size % MOONLET_DISK_BLOCK || d->alt_endpoint || d->alt_segment_id ||
                    d->alt_protocol))
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
    if (registry_seg_find_locked(r, MOONLET_STR(d->segment_id), &slot)) {
        rc = MOONLET_ERR_SEGMENT_ALREADY_EXISTS;
        goto out;
    }
    struct mclient *c = client_for_call_locked(r, MOONLET_STR(d->client_id), session, &cidx, &rc);
    if (!c)
        goto out;
    if ((slot = slot_alloc_locked(r)) == SLOT_NONE) {
        ML_ERR("master", "out of memory for segment %s: mount refused", d->segment_id);
        rc = MOONLET_ERR_NO_AVAILABLE_HANDLE;
        goto out;
    }
    struct mseg *s = reg_seg(r, slot);
    s->id_hash = hmap_str_hash(d->segment_id, strlen(d->segment_id));
    const char *name = d->name ? d->name : d->segment_id;
    s->name_hash = hmap_str_hash(name, strlen(name));
    s->endpoint_hash = hmap_str_hash(d->endpoint, strlen(d->endpoint));
    if (!hmap_insert(&r->seg_by_id, s->id_hash, slot) ||
        !hmap_insert(&r->seg_by_name, s->name_hash, slot) ||
        !hmap_insert(&r->seg_by_endpoint, s->endpoint_hash, slot)) {
        hmap_remove_hv(&r->seg_by_id, s->id_hash, slot);
        hmap_remove_hv(&r->seg_by_name, s->name_hash, slot);
        u32_push(&r->free_slots, &r->nfree, &r->free_cap, slot); /* room: it was popped */
        rc = MOONLET_ERR_NO_AVAILABLE_HANDLE;
        goto out;
    }
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
    pool_reset(s);
    s->gen = ++r->next_gen;
    atomic_store(&s->draining, false);
    s->disk = d->disk;
    s->client = cidx;
    s->cprev = SLOT_NONE;
    s->cnext = c->first_seg;
    if (c->first_seg != SLOT_NONE)
        reg_seg(r, c->first_seg)->cprev = slot;
    c->first_seg = slot;
    c->nsegs++;
    client_touch_locked(r, cidx);
    r->nmounted++;
    s->avail_pos = SLOT_NONE;
    atomic_store(&s->state, SEG_MOUNTED);
    if (s->disk) {
        atomic_fetch_add(&r->disk_capacity, s->size);
        atomic_fetch_add(&r->ndisk, 1);
    } else {
        atomic_fetch_add(&r->capacity, s->size);
        registry_avail_add_locked(r, slot);
    }
    if (repl_on(m)) { /* under registry.mu: ordered with the UNMOUNT of the same id */
        moonlet_repl_rec rec = {.type = MOONLET_REPL_MOUNT, .seg = d,
                                .secret = {(const char *)c->secret, c->secret_len},
                                .clock_offset_ms = atomic_load(&s->clock_offset_ms)};
        repl_emit(m, &rec);
    }
    ML_INFO("master", "mounted %ssegment %s (%" PRIu64 " bytes) of client %s at %s://%s%s%s%s%s",
            s->disk ? "disk " : "", s->id, s->size, c->id, s->protocol, s->endpoint, s->alt_id[0] ? " and " : "",
            s->alt_protocol, s->alt_id[0] ? "://" : "", s->alt_endpoint);
out:
    pthread_mutex_unlock(&r->mu);
    moonlet_alloc_destroy(alloc);
    return rc;
}

/* Takes a MOUNTED segment out of service: UNMOUNTING (placement skips it,
 * lookups by id no longer find it), off its client's list and the placement
 * ring; its object index moves to *ix (the caller strips those objects and
 * then retires the slot).  registry.mu held. */
static void unmount_begin_locked(moonlet_master *m, uint32_t slot, struct hmap *ix)
{
    struct registry *r = &m->reg;
    struct mseg *s = reg_seg(r, slot);
    if (repl_on(m)) { /* before any of its replicas is stripped */
        moonlet_repl_rec rec = {.type = MOONLET_REPL_UNMOUNT,
                                .client_id = MOONLET_STR(r->clients[s->client].id),
                                .segment_id = MOONLET_STR(s->id)};
        repl_emit(m, &rec);
    }
    atomic_store(&s->state, SEG_UNMOUNTING);
    hmap_remove_hv(&r->seg_by_id, s->id_hash, slot);
    hmap_remove_hv(&r->seg_by_name, s->name_hash, slot);
    hmap_remove_hv(&r->seg_by_endpoint, s->endpoint_hash, slot);
    registry_avail_remove_locked(r, slot);
    struct mclient *c = &r->clients[s->client];
    if (s->cprev != SLOT_NONE)
        reg_seg(r, s->cprev)->cnext = s->cnext;
    else
        c->first_seg = s->cnext;
    if (s->cnext != SLOT_NONE)
        reg_seg(r, s->cnext)->cprev = s->cprev;
    s->cnext = s->cprev = SLOT_NONE;
    if (c->nsegs)
        c->nsegs--;
    r->nmounted--;
    *ix = s->ix;
    memset(&s->ix, 0, sizeof(s->ix));
}

int registry_unmount_begin(moonlet_master *m, moonlet_str client_id, moonlet_str segment_id,
                           bool check_owner, uint64_t session, uint32_t *slot, struct hmap *ix)
{
    struct registry *r = &m->reg;
    pthread_mutex_lock(&r->mu);
    struct mseg *s = registry_seg_find_locked(r, segment_id, slot);
    int rc = MOONLET_OK;
    if (!s)
        rc = MOONLET_ERR_SEGMENT_NOT_FOUND;
    else if (check_owner && (!str_eq(r->clients[s->client].id, client_id) ||
                             client_authorize_locked(r, s->client, session)))
        rc = MOONLET_ERR_ILLEGAL_CLIENT;
    else
        unmount_begin_locked(m, *slot, ix);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

uint32_t registry_collect_expired(moonlet_master *m, uint64_t now,
                                  bool (*take)(void *arg, uint32_t slot, struct hmap *ix,
                                               const char *client, const char *segment),
                                  void *arg)
{
    struct registry *r = &m->reg;
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    /* oldest ping first: stop at the first client still alive */
    while (r->lhead != UINT32_MAX) {
        uint32_t i = r->lhead;
        struct mclient *c = &r->clients[i];
        if (c->last_ping_ns > now || now - c->last_ping_ns < m->client_ttl_ns)
            break;
        bool ok = true;
        while (c->first_seg != SLOT_NONE && ok) {
            uint32_t slot = c->first_seg;
            struct mseg *s = reg_seg(r, slot);
            ML_WARN("master", "client %s missed its liveness deadline: unmounting segment %s",
                    c->id, s->id);
            struct hmap ix;
            char seg[MOONLET_MAX_ID_BYTES + 1];
            snprintf(seg, sizeof(seg), "%s", s->id);
            unmount_begin_locked(m, slot, &ix);
            ok = take(arg, slot, &ix, c->id, seg);
            n++;
        }
        if (!ok) /* the caller could not queue more: the rest next time */
            break;
        ML_INFO("master", "client %s expired (no ping for %" PRIu64 " ms)", c->id,
                (now - c->last_ping_ns) / MOONLET_NS_PER_MS);
        client_forget_locked(r, i);
    }
    pthread_mutex_unlock(&r->mu);
    return n;
}

void registry_retire(moonlet_master *m, uint32_t slot)
{
    struct registry *r = &m->reg;
    pthread_mutex_lock(&r->mu);
    struct mseg *s = reg_seg(r, slot);
    if (s->disk) {
        atomic_fetch_sub(&r->disk_capacity, s->size);
        atomic_fetch_sub(&r->ndisk, 1);
    } else {
        atomic_fetch_sub(&r->capacity, s->size);
    }
    atomic_fetch_sub(reg_used_of(r, s), moonlet_alloc_used(s->alloc));
    if (s->disk)
        atomic_fetch_sub(&r->disk_extents, s->objects);
    for (uint32_t q = 0; q < s->nquar; q++) /* gone with the segment's id and key */
        atomic_fetch_sub(&r->quarantined, s->quar[q].len);
    s->nquar = 0;
    s->ntrim = 0; /* the node rescans its disk when it comes back */
    pool_reset(s); /* its ranges go with the allocator, counted in its used */
    moonlet_alloc_destroy(s->alloc);
    s->alloc = NULL;
    s->objects = 0;
    hmap_free(&s->ix); /* releases during the strip may have left entries */
    atomic_store(&s->state, SEG_FREE);
    if (!u32_push(&r->free_slots, &r->nfree, &r->free_cap, slot))
        ML_WARN("master", "out of memory: segment slot %u is not reused", slot);
    pthread_mutex_unlock(&r->mu);
}

/* Returns the segment's due quarantined ranges to its allocator.  registry.mu held. */
void registry_quarantine_due_locked(struct registry *r, uint32_t slot, uint64_t now)
{
    struct mseg *s = reg_seg(r, slot);
    uint32_t keep = 0, before = s->nquar;
    for (uint32_t q = 0; q < s->nquar; q++) {
        struct quarantined *e = &s->quar[q];
        if (e->until_ns > now) {
            s->quar[keep++] = *e;
            continue;
        }
        if (moonlet_alloc_release(s->alloc, e->offset, e->len) == MOONLET_OK)
            atomic_fetch_sub(reg_used_of(r, s), e->len);
        else
            ML_ERR("master", "segment %s: release of quarantined [%" PRIu64 ", +%" PRIu64
                   ") refused", s->id, e->offset, e->len);
        atomic_fetch_sub(&r->quarantined, e->len);
    }
    s->nquar = keep;
    if (keep < before)
        registry_avail_add_locked(r, slot);
}

/* Holds [offset, +len) back until until_ns; false when out of memory. */
static bool quarantine_add_locked(struct registry *r, struct mseg *s, uint64_t offset,
                                  uint64_t len, uint64_t until_ns)
{
    struct quarantined *q = moonlet_grow(s->quar, s->nquar, &s->quar_cap, 16, sizeof(*q));
    if (!q)
        return false;
    s->quar = q;
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
        struct mseg *s = reg_seg(r, i);
        if (s && atomic_load(&s->state) == SEG_MOUNTED && s->nquar)
            registry_quarantine_due_locked(r, i, now);
    }
    pthread_mutex_unlock(&r->mu);
}

/* The n replicas reserved for object `hash` are its now: count and index
 * them.  len: the object's size (or that rounded: mrep_len gives each
 * range's length from either).  Caller holds registry.mu. */
void registry_placed_commit_locked(struct registry *r, uint64_t hash, const struct mrep *reps,
                                 uint32_t n, uint64_t len, bool counted)
{
    for (uint32_t k = 0; k < n; k++) {
        struct mseg *s = reg_seg(r, reps[k].seg);
        s->objects++;
        if (s->disk)
            atomic_fetch_add(&r->disk_extents, 1);
        ix_add_locked(s, hash);
        if (!counted) /* pooled ranges were counted when the pool took them */
            atomic_fetch_add(reg_used_of(r, s), mrep_len(&reps[k], len));
    }
}

/* A mounted slot whose name is `name`, else one whose endpoint ("host:port",
 * what Mooncake calls a segment name) is (hash maps; among several with the
 * same name, any); SLOT_NONE when none.  Caller holds registry.mu. */
uint32_t registry_slot_by_name_locked(const struct registry *r, moonlet_str name)
{
    uint64_t h = hmap_str_hash(name.ptr, name.len);
    const struct hent *e = hmap_find_str(&r->seg_by_name, h, name, seg_name_of, r);
    if (!e)
        e = hmap_find_str(&r->seg_by_endpoint, h, name, seg_endpoint_of, r);
    return e ? e->v : SLOT_NONE;
}

int registry_quarantine_at(moonlet_master *m, moonlet_str seg_id, uint64_t offset, uint64_t len,
                           uint64_t until_ns)
{
    struct registry *r = &m->reg;
    len = moonlet_alloc_rounded(len);
    uint32_t slot;
    int rc;
    pthread_mutex_lock(&r->mu);
    struct mseg *s = registry_seg_find_locked(r, seg_id, &slot);
    if (!s)
        rc = MOONLET_ERR_SEGMENT_NOT_FOUND;
    else if ((rc = moonlet_alloc_reserve_at(s->alloc, offset, len)) == MOONLET_OK) {
        atomic_fetch_add(reg_used_of(r, s), len);
        if (!quarantine_add_locked(r, s, offset, len, until_ns))
            ML_ERR("master", "segment %s: cannot quarantine [%" PRIu64 ", +%" PRIu64
                   "); it stays allocated", s->id, offset, len);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

bool registry_slot_named(const moonlet_master *m, uint32_t slot, moonlet_str id)
{
    const struct mseg *s = reg_seg(&m->reg, slot);
    return s && (str_eq(s->id, id) || (s->alt_id[0] && str_eq(s->alt_id, id)));
}

/* A disk extent freed: held until its node trims it (mseg.trims).
 * registry.mu held. */
static void trim_add_locked(struct mseg *s, uint64_t offset, uint64_t len, uint64_t until_ns)
{
    struct quarantined *t = moonlet_grow(s->trims, s->ntrim, &s->trim_cap, 64, sizeof(*t));
    if (!t) {
        ML_ERR("master", "disk segment %s: out of memory for a trim: [%" PRIu64 ", +%" PRIu64
               ") stays allocated", s->id, offset, len);
        return;
    }
    s->trims = t;
    s->trims[s->ntrim++] = (struct quarantined){offset, len, until_ns};
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int moonlet_master_disk_trim(moonlet_master *m, moonlet_str client_id, uint64_t session,
                             moonlet_str segment_id, uint64_t *done, uint32_t ndone, uint32_t max,
                             void (*visit)(void *arg, uint64_t offset, uint64_t len), void *arg)
{
    struct registry *r = &m->reg;
    uint32_t slots[16], ns = 0;
    int rc = registry_client_slots(m, client_id, session, slots, 16, &ns);
    if (rc)
        return rc;
    if (ndone && !done)
        return MOONLET_ERR_INVALID_PARAMS;
    uint64_t now = moonlet_clock_now_ns();
    rc = MOONLET_ERR_SEGMENT_NOT_FOUND;
    if (ndone)
        qsort(done, ndone, sizeof(*done), cmp_u64);
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < ns; i++) {
        struct mseg *s = reg_seg(r, slots[i]);
        if (!s || !s->disk || atomic_load(&s->state) != SEG_MOUNTED || !str_eq(s->id, segment_id))
            continue;
        rc = MOONLET_OK;
        /* The node invalidated these: free now.  Only due entries (a node
         * cannot end a reader's hold by naming an offset early).  Handed out
         * from the front, they are found there: the walk ends once every
         * offset named is matched, not at the end of a long list. */
        for (uint32_t k = 0, matched = 0; matched < ndone && k < s->ntrim;) {
            struct quarantined *t = &s->trims[k];
            if (t->until_ns > now ||
                !bsearch(&t->offset, done, ndone, sizeof(*done), cmp_u64)) {
                k++;
                continue;
            }
            if (moonlet_alloc_release(s->alloc, t->offset, t->len) == MOONLET_OK)
                atomic_fetch_sub(&r->disk_used, t->len);
            s->trims[k] = s->trims[--s->ntrim];
            matched++;
        }
        for (uint32_t k = 0, n = 0; k < s->ntrim && n < max; k++)
            if (s->trims[k].until_ns <= now) {
                if (visit)
                    visit(arg, s->trims[k].offset, s->trims[k].len);
                n++;
            }
        break;
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* One range of an object of `size` bytes back (or into quarantine until
 * until_ns).  registry.mu held. */
static void release_one_locked(struct registry *r, uint64_t hash, uint64_t size,
                               const struct mrep *rp, uint64_t until_ns)
{
    uint32_t slot = rp->seg;
    struct mseg *s = reg_seg(r, slot);
    if (!s || !s->alloc)
        return;
    uint64_t len = mrep_len(rp, size);
    s->objects--;
    if (s->disk)
        atomic_fetch_sub(&r->disk_extents, 1);
    ix_del_locked(s, hash);
    if (s->disk) { /* until the node has invalidated it (DiskTrim) */
        trim_add_locked(s, rp->offset, len, until_ns);
        return;
    }
    /* Quarantined bytes stay in `used`: they are not allocatable. */
    if (until_ns && quarantine_add_locked(r, s, rp->offset, len, until_ns))
        return;
    if (until_ns) /* out of memory for the list: keep the range for good */
        ML_ERR("master", "segment %s: cannot quarantine [%" PRIu64 ", +%" PRIu64
               "); it stays allocated", s->id, rp->offset, len);
    else if (moonlet_alloc_release(s->alloc, rp->offset, len) == MOONLET_OK) {
        atomic_fetch_sub(reg_used_of(r, s), len);
        if (!s->disk)
            registry_avail_add_locked(r, slot);
    } else
        ML_ERR("master", "segment %s: release of [%" PRIu64 ", +%" PRIu64 ") refused",
               s->id, rp->offset, len);
}

void registry_release(moonlet_master *m, uint64_t hash, uint64_t size, const struct mrep *reps,
                      uint32_t nrep, uint64_t until_ns)
{
    struct registry *r = &m->reg;
    pthread_mutex_lock(&r->mu);
    for (uint32_t k = 0; k < nrep; k++)
        release_one_locked(r, hash, size, &reps[k], until_ns);
    pthread_mutex_unlock(&r->mu);
}

void registry_release_gen(moonlet_master *m, uint64_t hash, uint64_t size, const struct mrep *rep,
                          uint64_t gen, uint64_t until_ns)
{
    struct registry *r = &m->reg;
    pthread_mutex_lock(&r->mu);
    struct mseg *s = reg_seg(r, rep->seg);
    if (s && atomic_load(&s->state) != SEG_FREE && s->gen == gen)
        release_one_locked(r, hash, size, rep, until_ns);
    pthread_mutex_unlock(&r->mu);
}

bool registry_slot_disk(const moonlet_master *m, uint32_t slot)
{
    const struct mseg *s = reg_seg(&m->reg, slot);
    return s && s->disk;
}

bool registry_slot_live(moonlet_master *m, uint32_t slot, uint64_t gen)
{
    struct registry *r = &m->reg;
    pthread_mutex_lock(&r->mu);
    struct mseg *s = slot < r->nslots ? reg_seg(r, slot) : NULL;
    bool live = s && atomic_load(&s->state) == SEG_MOUNTED && s->gen == gen;
    pthread_mutex_unlock(&r->mu);
    return live;
}

int registry_client_slots(moonlet_master *m, moonlet_str client_id, uint64_t session,
                          uint32_t *slots, uint32_t max, uint32_t *n)
{
    struct registry *r = &m->reg;
    *n = 0;
    if (id_check(client_id))
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_mutex_lock(&r->mu);
    uint32_t idx;
    int rc = MOONLET_OK;
    struct mclient *c = client_get_locked(r, client_id, false, &idx);
    if (!c)
        rc = MOONLET_ERR_ILLEGAL_CLIENT;
    else if ((rc = client_authorize_locked(r, idx, session)) == MOONLET_OK)
        for (uint32_t slot = c->first_seg; slot != SLOT_NONE && *n < max;
             slot = reg_seg(r, slot)->cnext)
            slots[(*n)++] = slot;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* Drain: every mounted segment whose id, name, endpoint or client id is `target`
 * (an admin call, rare: it looks at every slot).  Appends the hashes of the
 * objects of each segment it starts draining to *hashes. */
int registry_drain(moonlet_master *m, moonlet_str target, bool on, uint64_t **hashes,
                   uint32_t *nhashes, uint32_t *nsegs)
{
    struct registry *r = &m->reg;
    int rc = MOONLET_ERR_SEGMENT_NOT_FOUND;
    *nsegs = 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t slot = 0; slot < r->nslots; slot++) {
        struct mseg *s = reg_seg(r, slot);
        if (!s || atomic_load(&s->state) != SEG_MOUNTED ||
            !(str_eq(s->id, target) || str_eq(s->name, target) || str_eq(s->endpoint, target) ||
              str_eq(r->clients[s->client].id, target)))
            continue;
        rc = MOONLET_OK;
        if (atomic_load(&s->draining) == on)
            continue;
        atomic_store(&s->draining, on);
        (*nsegs)++;
        ML_INFO("master", "segment %s of client %s: %s (%" PRIu64 " objects)", s->id,
                r->clients[s->client].id, on ? "draining" : "drain cancelled", s->objects);
        if (on) {
            registry_avail_remove_locked(r, slot);
            uint32_t add = s->ix.n, have = *nhashes;
            uint64_t *h = realloc(*hashes, ((size_t)have + add + 1) * sizeof(*h));
            if (!h) {
                rc = MOONLET_ERR_INTERNAL_ERROR;
                break;
            }
            *hashes = h;
            for (uint32_t i = 0; i < s->ix.cap; i++)
                if (s->ix.e[i].used)
                    h[(*nhashes)++] = s->ix.e[i].h;
        } else {
            registry_avail_add_locked(r, slot);
        }
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void replica_cap_fill(const moonlet_master *m, const struct mrep *rp, uint64_t size,
                      uint64_t deadline_ns, uint64_t now_ns, moonlet_replica_view *v)
{
    const struct mseg *s = reg_seg(&m->reg, rp->seg);
    v->put_ttl_ms = deadline_ns > now_ns ? (deadline_ns - now_ns) / MOONLET_NS_PER_MS : 0;
    v->has_cap = s->has_key;
    if (!s->has_key)
        return;
    /* The put deadline on the node's clock, rounded down: any write the node
     * accepts happens before the deadline in real time. */
    int64_t e = (int64_t)(deadline_ns / MOONLET_NS_PER_MS) + atomic_load(&s->clock_offset_ms);
    moonlet_writecap cap = {.offset = rp->offset, .len = moonlet_alloc_rounded(size ? size : 1),
                            .expiry_ms = e > 0 ? (uint64_t)e : 1};
    /* the leader's epoch in the capability: a node that saw a newer one refuses it */
    moonlet_writecap_set_epoch(&cap, atomic_load_explicit(&m->epoch, memory_order_relaxed));
    v->cap_len = cap.len;
    v->cap_expiry_ms = cap.expiry_ms;
    /* Only TCP checks capabilities: the tag names the TCP registration. */
    const char *cap_id = s->alt_id[0] && strcmp(s->alt_protocol, "tcp") == 0 ? s->alt_id : s->id;
    v->cap_tag = moonlet_writecap_tag(s->write_key, cap_id, rp->offset, v->cap_len,
                                      v->cap_expiry_ms);
}

void replica_view_fill(const moonlet_master *m, const struct mobj *o, const struct mrep *rp,
                       moonlet_replica_view *v)
{
    const struct mseg *s = reg_seg(&m->reg, rp->seg);
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
    v->disk = rp->disk_hdr != 0;
    v->has_cap = false;
    v->cap_len = v->cap_expiry_ms = v->cap_tag = v->put_ttl_ms = 0;
}

uint32_t registry_segments_fitting(moonlet_master *m, uint64_t len)
{
    uint32_t n = 0;
    pthread_mutex_lock(&m->reg.mu);
    for (uint32_t i = 0; i < m->reg.nslots; i++) {
        struct mseg *s = reg_seg(&m->reg, i);
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

void registry_foreach_free(moonlet_master *m, uint64_t min_size, bool disk,
                           void (*fn)(void *arg, uint32_t slot, uint64_t offset, uint64_t len),
                           void *arg)
{
    struct free_visit v = {.fn = fn, .arg = arg};
    pthread_mutex_lock(&m->reg.mu);
    for (uint32_t i = 0; i < m->reg.nslots; i++) {
        struct mseg *s = reg_seg(&m->reg, i);
        if (!s || atomic_load(&s->state) != SEG_MOUNTED || s->size < min_size || s->disk != disk)
            continue;
        v.slot = i;
        moonlet_alloc_foreach_free(s->alloc, free_visit_one, &v);
    }
    pthread_mutex_unlock(&m->reg.mu);
}

uint32_t registry_mounted(moonlet_master *m)
{
    return moonlet_locked_u32(&m->reg.mu, &m->reg.nmounted);
}

double registry_usage(moonlet_master *m)
{
    uint64_t cap = atomic_load(&m->reg.capacity);
    return cap ? (double)atomic_load(&m->reg.used) / (double)cap : 0.0;
}

/* One segment's view, copied under registry.mu so it can be visited after. */
struct seg_copy {
    char id[MOONLET_MAX_ID_BYTES + 1], name[MOONLET_MAX_ID_BYTES + 1];
    char client[MOONLET_MAX_ID_BYTES + 1];
    char endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1], protocol[16];
    char alt_id[MOONLET_MAX_ID_BYTES + 1], alt_endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1];
    char alt_protocol[16];
    uint64_t base, capacity, used, objects, ping_age_ms;
    bool draining, disk, has_node_disk;
    uint64_t node_disk[MOONLET_NODE_DISK_NFIELDS];
};

static void seg_copy_locked(const struct registry *r, const struct mseg *s, uint64_t now,
                            struct seg_copy *c)
{
    const struct mclient *cl = &r->clients[s->client];
    memcpy(c->id, s->id, sizeof(c->id));
    memcpy(c->name, s->name, sizeof(c->name));
    memcpy(c->client, cl->id, sizeof(c->client));
    memcpy(c->endpoint, s->endpoint, sizeof(c->endpoint));
    memcpy(c->protocol, s->protocol, sizeof(c->protocol));
    memcpy(c->alt_id, s->alt_id, sizeof(c->alt_id));
    memcpy(c->alt_endpoint, s->alt_endpoint, sizeof(c->alt_endpoint));
    memcpy(c->alt_protocol, s->alt_protocol, sizeof(c->alt_protocol));
    c->base = s->base;
    c->capacity = s->size;
    c->used = moonlet_alloc_used(s->alloc);
    c->objects = s->objects;
    c->draining = atomic_load(&s->draining);
    c->disk = s->disk;
    c->has_node_disk = s->disk && cl->has_disk;
    if (c->has_node_disk)
        memcpy(c->node_disk, cl->disk, sizeof(c->node_disk));
    c->ping_age_ms = now > cl->last_ping_ns ? (now - cl->last_ping_ns) / MOONLET_NS_PER_MS : 0;
}

static void seg_copy_visit(const struct seg_copy *c,
                           void (*visit)(void *arg, const moonlet_segment_view *s), void *arg)
{
    bool alt = c->alt_id[0] != 0;
    moonlet_segment_view v = {
        .segment_id = c->id, .name = c->name, .client_id = c->client,
        .endpoint = c->endpoint, .protocol = c->protocol, .base = c->base,
        .alt_segment_id = alt ? c->alt_id : NULL,
        .alt_endpoint = alt ? c->alt_endpoint : NULL,
        .alt_protocol = alt ? c->alt_protocol : NULL,
        .capacity = c->capacity, .used = c->used, .objects = c->objects,
        .last_ping_age_ms = c->ping_age_ms, .draining = c->draining, .disk = c->disk,
        .node_disk = c->has_node_disk ? c->node_disk : NULL,
    };
    visit(arg, &v);
}

/* Copies of the registry lock's worth of segments at a time: the lock is
 * held for one chunk's copy, never for the visits. */
#define LIST_CHUNK 64u

int moonlet_master_list_segments_page(moonlet_master *m, const char *client_id, uint64_t cursor,
                                      uint32_t limit,
                                      void (*visit)(void *arg, const moonlet_segment_view *s),
                                      void *arg, uint64_t *next_cursor)
{
    if (limit == 0 || limit > MOONLET_LIST_SEGMENTS_MAX_LIMIT || cursor > UINT32_MAX ||
        (client_id && id_check(MOONLET_STR(client_id))))
        return MOONLET_ERR_INVALID_PARAMS;
    struct seg_copy *buf = malloc(LIST_CHUNK * sizeof(*buf));
    if (!buf)
        return MOONLET_ERR_INTERNAL_ERROR;
    struct registry *r = &m->reg;
    uint64_t now = moonlet_clock_now_ns();
    uint32_t done = 0, pos = (uint32_t)cursor;
    *next_cursor = 0;
    if (client_id) {
        /* A client's segments: few, in one chunk (its list, not a scan). */
        pthread_mutex_lock(&r->mu);
        uint32_t idx, n = 0;
        struct mclient *c = client_get_locked(r, MOONLET_STR(client_id), false, &idx);
        for (uint32_t i = c ? c->first_seg : SLOT_NONE; i != SLOT_NONE && n < LIST_CHUNK &&
             n < limit; i = reg_seg(r, i)->cnext)
            seg_copy_locked(r, reg_seg(r, i), now, &buf[n++]);
        pthread_mutex_unlock(&r->mu);
        for (uint32_t k = 0; k < n; k++)
            seg_copy_visit(&buf[k], visit, arg);
        free(buf);
        return MOONLET_OK;
    }
    /* Slot order: a page ends at a slot index, the next starts after it, so
     * no segment comes twice; one mounted during the listing may be missed
     * (it took a slot behind the cursor), one unmounted may be missing. */
    for (;;) {
        uint32_t n = 0;
        pthread_mutex_lock(&r->mu);
        uint32_t nslots = r->nslots;
        while (pos < nslots && n < LIST_CHUNK && done + n < limit) {
            const struct mseg *s = reg_seg(r, pos++);
            if (atomic_load(&s->state) == SEG_MOUNTED)
                seg_copy_locked(r, s, now, &buf[n++]);
        }
        pthread_mutex_unlock(&r->mu);
        for (uint32_t k = 0; k < n; k++)
            seg_copy_visit(&buf[k], visit, arg);
        done += n;
        if (pos >= nslots)
            break;
        if (done == limit) {
            *next_cursor = pos;
            break;
        }
    }
    free(buf);
    return MOONLET_OK;
}

int moonlet_master_list_segments(moonlet_master *m,
                                 void (*visit)(void *arg, const moonlet_segment_view *s),
                                 void *arg)
{
    uint64_t next = 0;
    do {
        int rc = moonlet_master_list_segments_page(m, NULL, next, MOONLET_LIST_SEGMENTS_MAX_LIMIT,
                                                   visit, arg, &next);
        if (rc)
            return rc;
    } while (next);
    return MOONLET_OK;
}
