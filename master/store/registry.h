/*
 * registry.h - the segment registry (segment.c): mounted segments and their
 * allocators, quarantines and object indexes, the client table and the
 * order of its pings.  A pure registry: it never touches an object.
 * Placement over it is placement.c's (placement.h), its reservation pools
 * pool.c's (pool.h).
 *
 * Locks: registry.mu (order 3 in master_internal.h) guards every field
 * marked so; functions named *_locked expect it held, the others take it.
 * The invariant that lets readers skip it (a replica names only a MOUNTED
 * or UNMOUNTING slot, whose identity strings do not change) is stated in
 * master_internal.h.
 */
#ifndef MOONLET_MASTER_REGISTRY_H
#define MOONLET_MASTER_REGISTRY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "alloc.h"
#include "hmap.h"
#include "objects.h"

/* Segment slots live in chunks of SEG_CHUNK pointers reached through a fixed
 * directory: a chunk never moves once allocated, so readers index slots
 * without the registry lock while mounts add chunks.  SEG_DIR chunks bound
 * the slots at 4M (memory runs out long before). */
#define SEG_CHUNK 1024u
#define POOL_DEPTH 8u
#define SEG_DIR 4096u

enum { SEG_FREE = 0, SEG_MOUNTED = 1, SEG_UNMOUNTING = 2 };

#define SLOT_NONE UINT32_MAX

struct mseg {
    _Atomic int state;
    uint32_t client;             /* index into registry.clients */
    uint32_t cnext, cprev;       /* registry.mu: the client's segments (SLOT_NONE ends) */
    uint32_t avail_pos;          /* registry.mu: index in registry.avail, or SLOT_NONE */
    uint64_t id_hash;            /* hmap_str_hash(id): its key in registry.seg_by_id */
    uint64_t name_hash, endpoint_hash; /* its keys in seg_by_name, seg_by_endpoint */
    /* registry.mu: the hashes of the objects with a replica here (hash ->
     * count), so an unmount visits only this segment's objects. */
    struct hmap ix;
    char id[MOONLET_MAX_ID_BYTES + 1];
    char name[MOONLET_MAX_ID_BYTES + 1];
    char endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1];
    char protocol[16];
    /* A second endpoint of the same memory (a node serving TCP and RDMA);
     * alt_id[0] == 0: none.  Set at mount, unchanged while mounted. */
    char alt_id[MOONLET_MAX_ID_BYTES + 1];
    char alt_endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1];
    char alt_protocol[16];
    uint64_t base;
    uint64_t size;
    moonlet_alloc *alloc;        /* registry.mu */
    uint64_t objects;            /* registry.mu: replicas on this segment */
    /* Write fencing (docs/reliability.md).  The key is set at mount (identity:
     * unchanged while mounted); the clock offset bound is refreshed by Pings. */
    bool has_key;
    uint8_t write_key[16];
    _Atomic int64_t clock_offset_ms; /* lower bound of node clock - master clock */
    /* registry.mu: ranges freed from unfinished puts, each reusable only
     * after its put deadline + the grace (unsorted). */
    struct quarantined *quar;
    uint32_t nquar, quar_cap;
    /* repair.c: set at mount from registry.next_gen, so a repair job that
     * holds a range here knows the slot was not retired and reused since. */
    uint64_t gen;
    /* Draining (moonlet_master_drain): placement skips it, and its replicas
     * count as leaving, so repair copies its objects elsewhere. */
    _Atomic bool draining;
    /* A disk segment (a store node's disk tier, one per path): set at
     * mount.  Never in `avail`: puts and repairs do not place there, only
     * demotions (demote.c) and a node's announce of what its disk holds.
     * Its capacity and use count in registry.disk_*, not in the DRAM ones
     * the eviction watermark reads. */
    bool disk;
    /* registry.mu, disk segments: extents freed here that the node has not
     * yet invalidated on its disk (DiskTrim).  They stay allocated (and in
     * disk_used) until the node says it did, so no demotion is placed over
     * an object the node still holds, and a restart does not bring back
     * what was removed; each is handed out only once its until_ns (a
     * reader's lease) has passed. */
    struct quarantined *trims;
    uint32_t ntrim, trim_cap;
    /* registry.mu: the reservation pool (with cfg.repl_pos, pool.c): up
     * to POOL_DEPTH ranges of pool_len bytes, allocated and announced to the
     * standby (RESV) ahead of the PutStarts that take them; pool_ready[i]:
     * the stream position the standby must have acknowledged first.  The
     * last len that missed the pool and how often in a row (a new size). */
    uint64_t pool_len;
    uint64_t pool_off[POOL_DEPTH], pool_ready[POOL_DEPTH];
    uint32_t npool;
    uint32_t pool_misses;
    uint64_t pool_miss_len;
};

/* A range held back from the allocator until `until_ns`. */
struct quarantined {
    uint64_t offset, len, until_ns;
};

/*
 * A client (store node) id.  Its identity is bound to the connection
 * (session) that claimed it: only that session may ping, mount or unmount
 * for it.  A node proves who it is after reconnecting with the secret it
 * sent when it first bound the id (BindClient).  session 0: unbound (the
 * owning connection closed); calls of the library itself pass session 0 and
 * are trusted.  The entry, and with it the secret, goes away when liveness
 * expires the client.
 */
#define MOONLET_MAX_SECRET_BYTES 64u
struct mclient {
    char id[MOONLET_MAX_ID_BYTES + 1];
    uint64_t last_ping_ns;
    uint64_t session;
    uint32_t nsegs;
    uint32_t first_seg;                      /* SLOT_NONE: none */
    uint32_t lnext, lprev;                   /* the ping-order list (UINT32_MAX ends) */
    uint8_t secret_len;                      /* 0: none */
    uint8_t secret[MOONLET_MAX_SECRET_BYTES];
    bool used;
    bool has_disk;                           /* disk[] came with a Ping */
    uint64_t disk[MOONLET_NODE_DISK_NFIELDS]; /* its disk tier's figures (node_disk_fields.h) */
};

/*
 * Every operation finds what it needs through a map or a list, never by a
 * scan of all segments or clients: segment id -> slot and client id ->
 * entry (hash maps), free slots and free client entries (stacks), the
 * segments with room (`avail`, the round-robin ring placement walks), each
 * client's segments (a list through mseg.cnext), and the clients in the
 * order of their last ping (`lhead` oldest .. `ltail` newest), so the
 * liveness check looks only at the expired ones.
 */
struct registry {
    pthread_mutex_t mu;
    struct mseg **dir[SEG_DIR];              /* chunks of slots, allocated on first use */
    uint32_t nslots;                         /* slots ever used */
    uint32_t nmounted;
    uint32_t *free_slots, nfree, free_cap;   /* FREE slots to reuse */
    struct hmap seg_by_id;                   /* MOUNTED segment id -> slot */
    struct hmap seg_by_name, seg_by_endpoint; /* MOUNTED name / endpoint -> slots (several) */
    uint32_t *avail, navail, avail_cap;      /* MOUNTED slots placement tries first */
    struct mclient *clients;
    uint32_t nclients;                       /* entries in use or free (used=false) */
    uint32_t nused;                          /* entries in use */
    uint32_t clients_cap;
    uint32_t *free_clients, nfree_clients, free_clients_cap;
    uint32_t lhead, ltail;                   /* ping order (UINT32_MAX: empty) */
    struct hmap client_by_id;                /* used client id -> index */
    struct hmap by_session;                  /* bound session -> client indexes (several) */
    uint32_t rr;                             /* round-robin start for placement */
    uint64_t next_gen;                       /* mseg.gen of the next mount */
    _Atomic uint64_t capacity;               /* written under mu, read lock-free */
    _Atomic uint64_t used;                   /* allocated + quarantined bytes */
    _Atomic uint64_t quarantined;            /* bytes in quarantine (part of used) */
    /* The same for disk segments (mseg.disk), apart: DRAM pressure is what
     * evicts, disk pressure what the disk tier's own eviction answers. */
    _Atomic uint64_t disk_capacity, disk_used;
    _Atomic uint32_t ndisk;                  /* disk segments mounted */
    _Atomic uint64_t disk_extents;           /* extents placed on them (mseg.objects summed) */
    /* mclient.disk summed over the clients (changed under mu, read lock-free) */
    _Atomic uint64_t node_disk[MOONLET_NODE_DISK_NFIELDS];
};

/* The counter of allocated + quarantined bytes a segment's ranges count in. */
static inline _Atomic uint64_t *reg_used_of(struct registry *r, const struct mseg *s)
{
    return s->disk ? &r->disk_used : &r->used;
}

/* The segment of a slot below nslots (NULL if never allocated).  Without
 * registry.mu only for a slot a replica names, under the guard shared. */
static inline struct mseg *reg_seg(const struct registry *r, uint32_t slot)
{
    struct mseg **chunk = r->dir[slot / SEG_CHUNK];
    return chunk ? chunk[slot % SEG_CHUNK] : NULL;
}

/* ---- segment.c ------------------------------------------------------------- */
int registry_init(struct registry *r);
void registry_destroy(struct registry *r);
/* The mounted slot named `name` (mount name, else endpoint), or SLOT_NONE.
 * registry.mu held. */
uint32_t registry_slot_by_name_locked(const struct registry *r, moonlet_str name);
/* Puts a slot back on the placement ring (space was freed).  registry.mu held. */
void registry_avail_add_locked(struct registry *r, uint32_t slot);

/* Reserves [offset, +len) of a mounted segment into its quarantine until until_ns. */
int registry_quarantine_at(moonlet_master *m, moonlet_str seg_id, uint64_t offset, uint64_t len,
                           uint64_t until_ns);
/* Whether the segment in `slot` (MOUNTED or UNMOUNTING: the caller holds
 * the guard shared) has the id `id` (or it as its second endpoint's id). */
bool registry_slot_named(const moonlet_master *m, uint32_t slot, moonlet_str id);
/* Whether the segment in `slot` is a disk segment (same calling rule). */
bool registry_slot_disk(const moonlet_master *m, uint32_t slot);
/* Gives the ranges back and drops `hash` from the segments' indexes.  Takes
 * registry.mu.  until_ns 0: to the allocator at once (a sealed object: every
 * write to it was acknowledged before its PutEnd, so no stale byte can
 * follow); otherwise into the segment's quarantine until then (an
 * unfinished put: its writer may still be sending). */
void registry_release(moonlet_master *m, uint64_t hash, uint64_t size, const struct mrep *reps,
                      uint32_t nrep, uint64_t until_ns);
/* Unmount, registry side (unmount.c drives it).  begin: the segment becomes
 * UNMOUNTING (no new replica lands on it, lookups by id miss it) and its
 * object index moves to *ix; the caller then strips those objects' replicas
 * of the slot and, behind the exclusive-guard barrier, retires the slot
 * (allocator, accounting, slot reuse).  Both take registry.mu. */
int registry_unmount_begin(moonlet_master *m, moonlet_str client_id, moonlet_str segment_id,
                           bool check_owner, uint64_t session, uint32_t *slot, struct hmap *ix);
void registry_retire(moonlet_master *m, uint32_t slot);
/* Begins the unmount of every segment of the clients whose liveness TTL ran
 * out at `now` (oldest ping first, stopping at the first live client: no
 * scan of live ones), handing each to take(); forgets those clients.  take
 * returning false stops (the rest waits for the next call).  Returns the
 * segments handed over.  Takes registry.mu; take runs under it (must not lock). */
uint32_t registry_collect_expired(moonlet_master *m, uint64_t now,
                                  bool (*take)(void *arg, uint32_t slot, struct hmap *ix,
                                               const char *client, const char *segment),
                                  void *arg);
/* Returns every quarantined range whose time has come to its allocator
 * (the background thread; placement does the same per segment).  Takes registry.mu. */
void registry_quarantine_sweep(moonlet_master *m);
/* The write capability of a replica of a put whose deadline is deadline_ns
 * (the master's clock), into v (has_cap false when the segment has no key).
 * Caller holds the guard shared, so the segment stays mounted. */
void replica_cap_fill(const moonlet_master *m, const struct mrep *r, uint64_t size,
                      uint64_t deadline_ns, uint64_t now_ns, moonlet_replica_view *v);
void replica_view_fill(const moonlet_master *m, const struct mobj *o, const struct mrep *r,
                       moonlet_replica_view *v);
double registry_usage(moonlet_master *m);
/* Number of mounted segments (takes registry.mu). */
uint32_t registry_mounted(moonlet_master *m);
/* Number of mounted segments of at least `len` bytes (takes registry.mu). */
uint32_t registry_segments_fitting(moonlet_master *m, uint64_t len);
/* Calls fn(arg, slot, offset, len) for every free extent of every mounted
 * segment of at least min_size bytes, disk segments or DRAM ones, under
 * registry.mu: fn must not lock. */
void registry_foreach_free(moonlet_master *m, uint64_t min_size, bool disk,
                           void (*fn)(void *arg, uint32_t slot, uint64_t offset, uint64_t len),
                           void *arg);
/* registry_release of one range, only when its segment still is the
 * generation `gen` (not retired, maybe reused, since).  Takes registry.mu. */
void registry_release_gen(moonlet_master *m, uint64_t hash, uint64_t size, const struct mrep *rep,
                          uint64_t gen, uint64_t until_ns);
/* Whether slot is MOUNTED with generation gen (takes registry.mu). */
bool registry_slot_live(moonlet_master *m, uint32_t slot, uint64_t gen);
/* The client's mounted slots (up to max), authorizing the call as Ping does
 * (session 0: trusted).  Takes registry.mu. */
int registry_client_slots(moonlet_master *m, moonlet_str client_id, uint64_t session,
                          uint32_t *slots, uint32_t max, uint32_t *n);
/* Sets or clears the drain mark of every mounted segment whose id, name,
 * endpoint or client id is target; appends the object hashes of those it starts
 * draining to *hashes (malloc'd, the caller frees).  SEGMENT_NOT_FOUND when
 * none matches.  Takes registry.mu. */
int registry_drain(moonlet_master *m, moonlet_str target, bool on, uint64_t **hashes,
                   uint32_t *nhashes, uint32_t *nsegs);

/* ---- segment.c, for placement.c (registry.mu held) ------------------------ */
/* The MOUNTED segment with this id (its slot into *slot), or NULL. */
struct mseg *registry_seg_find_locked(struct registry *r, moonlet_str id, uint32_t *slot);
/* Takes a slot off the placement ring (no room for a request). */
void registry_avail_remove_locked(struct registry *r, uint32_t slot);
/* Returns the segment's due quarantined ranges to its allocator. */
void registry_quarantine_due_locked(struct registry *r, uint32_t slot, uint64_t now);
/* The n replicas reserved for object `hash` are its now: counted (unless
 * `counted`: pooled ranges were counted when the pool took them) and
 * indexed.  len: the object's size (or that rounded: mrep_len gives each
 * range's length from either). */
void registry_placed_commit_locked(struct registry *r, uint64_t hash, const struct mrep *reps,
                                   uint32_t n, uint64_t len, bool counted);

#endif
