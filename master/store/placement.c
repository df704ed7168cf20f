/*
 * placement.c - where replicas go (placement.h), over the registry of
 * segment.c.
 *
 * Placement walks the ring of segments with room (`avail`) round-robin from
 * a rotating start and takes, for each replica, the next segment whose
 * allocator can hold the object, so the replicas of one object always land
 * on distinct segments and load spreads across nodes.  A segment that
 * cannot hold a request leaves the ring; a release (or quarantine expiry)
 * on it brings it back, and a put the ring cannot hold tries every segment
 * once before it fails (and evicts).  A put may name preferred segments (by
 * the name given at mount, as ListSegments and moonlet-inspect show it, or
 * by endpoint "host:port", Mooncake's segment name): those are tried first,
 * in the given order, and a name that is not mounted or has no room is
 * skipped; the replicas still unplaced then go round-robin as above.  With
 * a hot standby, a put's ranges come from the reservation pools (pool.c)
 * when they can serve it.
 *
 * A repair's extra replica goes on another host when one has room
 * (registry_place_extra_locked); a demotion's disk extent on the disk of a
 * node that holds a replica when it has room (registry_place_disk_locked).
 * Each placed range is committed to its segment's accounting and object
 * index (registry_placed_commit_locked, segment.c).
 *
 * Locks: registry.mu (order 3) for the whole of each placement; the caller
 * holds the guard shared and the object's shard lock.  Nothing here takes
 * another lock.
 */
#include <string.h>

#include "clock.h"
#include "master_internal.h"
#include "moonlet/error.h"
#include "placement.h"
#include "pool.h"
#include "registry.h"

enum { PLACE_OK, PLACE_SKIP, PLACE_NO_ROOM };

/* Reserves len on mounted segment `slot` unless a replica of this object is
 * already there.  Caller holds registry.mu. */
static int place_on_locked(struct registry *r, uint32_t slot, uint64_t len, uint64_t now,
                           struct mrep *reps, uint32_t placed)
{
    struct mseg *s = reg_seg(r, slot);
    if (!s || atomic_load(&s->state) != SEG_MOUNTED || atomic_load(&s->draining) || s->disk)
        return PLACE_SKIP;
    for (uint32_t k = 0; k < placed; k++)
        if (reps[k].seg == slot)
            return PLACE_SKIP;
    if (s->nquar)
        registry_quarantine_due_locked(r, slot, now);
    uint64_t off;
    if (moonlet_alloc_reserve(s->alloc, len, &off) != MOONLET_OK)
        return PLACE_NO_ROOM;
    reps[placed] = (struct mrep){.offset = off, .seg = slot, .status = MOONLET_REPLICA_INITIALIZED};
    return PLACE_OK;
}

/* Places reps[placed..want) round-robin over the ring of segments with room;
 * a segment that has no room for this size leaves the ring (it comes back
 * when space is freed on it, or when the scan below finds room on it).  What
 * the ring could not hold goes on any mounted segment, as before the ring
 * (only a put that is about to fail, or evict, gets that far).  Returns the
 * new count of placed replicas.  Caller holds registry.mu. */
static uint32_t place_walk_locked(struct registry *r, uint64_t len, uint64_t now,
                                  struct mrep *reps, uint32_t placed, uint32_t want)
{
    uint32_t i = r->navail ? r->rr++ % r->navail : 0;
    for (uint32_t tries = r->navail; tries && placed < want && r->navail; tries--) {
        if (i >= r->navail)
            i = 0;
        uint32_t slot = r->avail[i];
        int prc = place_on_locked(r, slot, len, now, reps, placed);
        if (prc == PLACE_OK)
            placed++;
        if (prc == PLACE_NO_ROOM)
            registry_avail_remove_locked(r, slot); /* the last one moved into i */
        else
            i++;
    }
    uint32_t start = r->rr;
    for (uint32_t k = 0; k < r->nslots && placed < want; k++) {
        uint32_t slot = (start + k) % r->nslots;
        if (place_on_locked(r, slot, len, now, reps, placed) == PLACE_OK) {
            placed++;
            registry_avail_add_locked(r, slot);
        }
    }
    return placed;
}

/* The placement failed: give the n reserved ranges back.  Caller holds
 * registry.mu. */
static void placed_release_locked(struct registry *r, const struct mrep *reps, uint32_t n,
                                  uint64_t len)
{
    for (uint32_t k = 0; k < n; k++)
        moonlet_alloc_release(reg_seg(r, reps[k].seg)->alloc, reps[k].offset,
                              mrep_len(&reps[k], len));
}

int registry_place_preferred_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t nrep,
                                    const moonlet_str *preferred, uint32_t npreferred,
                                    struct mrep *reps, bool *covered)
{
    struct registry *r = &m->reg;
    uint64_t len = moonlet_alloc_rounded(size ? size : 1);
    uint64_t now = moonlet_clock_now_ns();
    bool pools = pool_enabled(m);
    if (covered)
        *covered = false;
    pthread_mutex_lock(&r->mu);
    if (r->nmounted < nrep) {
        pthread_mutex_unlock(&r->mu);
        return MOONLET_ERR_NO_AVAILABLE_HANDLE;
    }
    if (pools && pool_place(m, len, preferred, npreferred, nrep, reps)) {
        registry_placed_commit_locked(r, hash, reps, nrep, len, true);
        pthread_mutex_unlock(&r->mu);
        if (covered)
            *covered = true;
        return MOONLET_OK;
    }
    uint32_t placed = 0;
    /* Preferred names first; duplicates fall out of place_on_locked. */
    for (uint32_t p = 0; p < npreferred && placed < nrep; p++) {
        uint32_t slot = registry_slot_by_name_locked(r, preferred[p]);
        if (slot != SLOT_NONE && place_on_locked(r, slot, len, now, reps, placed) == PLACE_OK)
            placed++;
    }
    placed = place_walk_locked(r, len, now, reps, placed, nrep);
    if (placed == nrep) {
        registry_placed_commit_locked(r, hash, reps, nrep, len, false);
        for (uint32_t k = 0; pools && k < nrep; k++)
            pool_note(m, reps[k].seg, len);
    } else
        placed_release_locked(r, reps, placed, len);
    pthread_mutex_unlock(&r->mu);
    return placed == nrep ? MOONLET_OK : MOONLET_ERR_NO_AVAILABLE_HANDLE;
}

/* Up to MOONLET_MAX_REPLICAS current replicas, the failed segment and the
 * caller's excluded ones: the segments a replacement must avoid. */
#define PLACE_AVOID_MAX (MOONLET_MAX_REPLICAS + 1 + MOONLET_MAX_EXCLUDED)

int registry_place_replacement_locked(moonlet_master *m, uint64_t hash, uint64_t size,
                                      const struct mrep *reps, uint32_t nrep,
                                      const moonlet_str *excluded, uint32_t nexcluded,
                                      struct mrep *out)
{
    struct registry *r = &m->reg;
    if (nrep > MOONLET_MAX_REPLICAS || nexcluded > MOONLET_MAX_EXCLUDED + 1)
        return MOONLET_ERR_INVALID_PARAMS;
    uint64_t len = moonlet_alloc_rounded(size ? size : 1);
    uint64_t now = moonlet_clock_now_ns();
    /* place_on_locked skips a slot named by any of avoid[0..n) and writes avoid[n] */
    struct mrep avoid[PLACE_AVOID_MAX + 1];
    uint32_t n = 0;
    for (uint32_t k = 0; k < nrep; k++)
        avoid[n++] = reps[k];
    pthread_mutex_lock(&r->mu);
    for (uint32_t e = 0; e < nexcluded; e++) {
        uint32_t slot;
        if (registry_seg_find_locked(r, excluded[e], &slot)) /* unknown or unmounting: never placed on */
            avoid[n++] = (struct mrep){.seg = slot};
    }
    bool placed = place_walk_locked(r, len, now, avoid, n, n + 1) == n + 1;
    if (placed) {
        registry_placed_commit_locked(r, hash, &avoid[n], 1, len, false);
        *out = avoid[n];
    }
    pthread_mutex_unlock(&r->mu);
    return placed ? MOONLET_OK : MOONLET_ERR_NO_AVAILABLE_HANDLE;
}

int registry_place_at_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t key_len,
                             const moonlet_str *seg_ids, const uint64_t *offs, uint32_t nrep,
                             struct mrep *reps)
{
    struct registry *r = &m->reg;
    uint64_t len = moonlet_alloc_rounded(size ? size : 1);
    uint8_t hdr = (uint8_t)(moonlet_disk_header_bytes(key_len) / MOONLET_DISK_BLOCK);
    int rc = MOONLET_OK;
    uint32_t placed = 0;
    pthread_mutex_lock(&r->mu);
    for (; placed < nrep; placed++) {
        uint32_t slot;
        struct mseg *s = registry_seg_find_locked(r, seg_ids[placed], &slot);
        if (!s) {
            rc = MOONLET_ERR_SEGMENT_NOT_FOUND;
            break;
        }
        bool dup = false;
        for (uint32_t k = 0; k < placed; k++)
            dup |= reps[k].seg == slot;
        struct mrep rp = {.offset = offs[placed], .seg = slot,
                          .status = MOONLET_REPLICA_INITIALIZED, .disk_hdr = s->disk ? hdr : 0};
        if (dup || (s->disk && offs[placed] % MOONLET_DISK_BLOCK) ||
            (rc = moonlet_alloc_reserve_at(s->alloc, offs[placed], mrep_len(&rp, size))) !=
                MOONLET_OK) {
            rc = dup || rc == MOONLET_ERR_NO_AVAILABLE_HANDLE ? MOONLET_ERR_NO_AVAILABLE_HANDLE
                                                             : MOONLET_ERR_INVALID_PARAMS;
            break;
        }
        reps[placed] = rp;
    }
    if (rc == MOONLET_OK)
        registry_placed_commit_locked(r, hash, reps, nrep, len, false);
    else
        placed_release_locked(r, reps, placed, len);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int registry_place_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t nrep,
                          struct mrep *reps)
{
    return registry_place_preferred_locked(m, hash, size, nrep, NULL, 0, reps, NULL);
}

/* The host part of an endpoint "host:port" / "[v6]:port" (its length). */
static size_t endpoint_host_len(const char *ep)
{
    const char *c = strrchr(ep, ':');
    return c ? (size_t)(c - ep) : strlen(ep);
}

static bool same_host(const char *a, const char *b)
{
    size_t la = endpoint_host_len(a), lb = endpoint_host_len(b);
    return la == lb && memcmp(a, b, la) == 0;
}

/* Whether slot may take one more replica of the object (see
 * registry_place_extra_locked).  registry.mu held. */
static bool extra_ok_locked(const struct registry *r, uint32_t slot, const struct mrep *reps,
                            uint32_t nrep, bool other_host)
{
    const struct mseg *s = reg_seg(r, slot);
    if (!s || atomic_load(&s->state) != SEG_MOUNTED || atomic_load(&s->draining) || s->disk)
        return false;
    for (uint32_t k = 0; k < nrep; k++) {
        const struct mseg *o = reg_seg(r, reps[k].seg);
        if (reps[k].seg == slot)
            return false;
        if (other_host && !atomic_load(&o->draining) && same_host(o->endpoint, s->endpoint))
            return false;
    }
    return true;
}

/* Reserves len on slot for one more replica (extra_ok_locked), *off its
 * offset.  registry.mu held. */
static bool extra_reserve_locked(struct registry *r, uint32_t slot, const struct mrep *reps,
                                 uint32_t nrep, bool other_host, uint64_t len, uint64_t now,
                                 uint64_t *off)
{
    if (!extra_ok_locked(r, slot, reps, nrep, other_host))
        return false;
    struct mseg *s = reg_seg(r, slot);
    if (s->nquar)
        registry_quarantine_due_locked(r, slot, now);
    return moonlet_alloc_reserve(s->alloc, len, off) == MOONLET_OK;
}

int registry_place_extra_locked(moonlet_master *m, uint64_t hash, uint64_t size,
                                const struct mrep *reps, uint32_t nrep, struct mrep *out,
                                uint64_t *gen)
{
    struct registry *r = &m->reg;
    uint64_t len = moonlet_alloc_rounded(size ? size : 1);
    uint64_t now = moonlet_clock_now_ns();
    pthread_mutex_lock(&r->mu);
    /* Another host if any has room, else (one host, or the others full)
     * another segment, as PutStart places: the ring first (segments with
     * room, round-robin), then every slot. */
    uint32_t found = SLOT_NONE;
    uint64_t off = 0;
    uint32_t start = r->navail ? r->rr++ % r->navail : 0;
    for (int pass = 0; pass < 2 && found == SLOT_NONE; pass++) {
        bool other_host = pass == 0;
        for (uint32_t k = 0; k < r->navail && found == SLOT_NONE; k++) {
            uint32_t slot = r->avail[(start + k) % r->navail];
            if (extra_reserve_locked(r, slot, reps, nrep, other_host, len, now, &off))
                found = slot;
        }
        for (uint32_t slot = 0; slot < r->nslots && found == SLOT_NONE; slot++)
            if (extra_reserve_locked(r, slot, reps, nrep, other_host, len, now, &off))
                found = slot;
    }
    if (found == SLOT_NONE) {
        pthread_mutex_unlock(&r->mu);
        return MOONLET_ERR_NO_AVAILABLE_HANDLE;
    }
    *out = (struct mrep){.offset = off, .seg = found, .status = MOONLET_REPLICA_INITIALIZED};
    registry_placed_commit_locked(r, hash, out, 1, len, false);
    *gen = reg_seg(r, found)->gen;
    pthread_mutex_unlock(&r->mu);
    return MOONLET_OK;
}

/* Reserves footprint on disk segment slot when it is mounted and has
 * room.  registry.mu held. */
static bool disk_reserve_locked(struct registry *r, uint32_t slot, uint64_t footprint,
                                uint64_t now, uint64_t *off)
{
    struct mseg *s = reg_seg(r, slot);
    if (!s || !s->disk || atomic_load(&s->state) != SEG_MOUNTED || atomic_load(&s->draining))
        return false;
    if (s->nquar)
        registry_quarantine_due_locked(r, slot, now);
    return moonlet_alloc_reserve(s->alloc, footprint, off) == MOONLET_OK;
}

int registry_place_disk_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t disk_key,
                               const struct mrep *reps, uint32_t nrep, struct mrep *out,
                               uint64_t *gen)
{
    struct registry *r = &m->reg;
    if (atomic_load(&r->ndisk) == 0)
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    struct mrep t = {.status = MOONLET_REPLICA_INITIALIZED,
                     .disk_hdr = (uint8_t)(moonlet_disk_header_bytes(disk_key) / MOONLET_DISK_BLOCK)};
    uint64_t footprint = mrep_len(&t, size), now = moonlet_clock_now_ns(), off = 0;
    uint32_t found = SLOT_NONE;
    pthread_mutex_lock(&r->mu);
    /* The disk of a node that holds a replica: the copy needs no network. */
    for (uint32_t k = 0; k < nrep && found == SLOT_NONE; k++) {
        const struct mseg *src = reg_seg(r, reps[k].seg);
        if (!src || reps[k].disk_hdr)
            continue;
        for (uint32_t slot = r->clients[src->client].first_seg; slot != SLOT_NONE;
             slot = reg_seg(r, slot)->cnext)
            if (disk_reserve_locked(r, slot, footprint, now, &off)) {
                found = slot;
                break;
            }
    }
    /* Else any disk with room, from a rotating start. */
    for (uint32_t k = 0; k < r->nslots && found == SLOT_NONE; k++) {
        uint32_t slot = (r->rr + k) % r->nslots;
        if (disk_reserve_locked(r, slot, footprint, now, &off))
            found = slot;
    }
    if (found == SLOT_NONE) {
        pthread_mutex_unlock(&r->mu);
        return MOONLET_ERR_NO_AVAILABLE_HANDLE;
    }
    t.offset = off;
    t.seg = found;
    *out = t;
    registry_placed_commit_locked(r, hash, out, 1, size, false);
    *gen = reg_seg(r, found)->gen;
    pthread_mutex_unlock(&r->mu);
    return MOONLET_OK;
}
