/*
 * master_internal.h - the master's data structures, shared by the master/ sources.
 *
 * Lock order (never take them in another order):
 *   0. evict_mu            - serialises eviction passes (held around a pass)
 *   -  unmount_mu          - serialises unmount drains (unmount.c); taken
 *                            before the guard, never under another lock
 *   1. guard (rwlock)      - shared for every ordinary operation; exclusive
 *                            only for an O(1) barrier that retires unmounted
 *                            slots (no work is done under it)
 *   2. shard locks         - several at once only in ascending shard index
 *   3. registry.mu         - segment registry, allocators and client table
 *   -  tenants.lock        - leaf lock; never held while taking another
 *   -  repair_mu           - repair.c's queue; a leaf like tenants.lock
 *                            (taken under a shard lock, never the reverse)
 *
 * Invariant that lets readers skip the registry lock: a replica only ever
 * names a slot that is MOUNTED or UNMOUNTING, never a FREE one.  Unmount
 * marks the slot UNMOUNTING (placement skips it from then on), strips its
 * replicas object by object (through the segment's index of object hashes,
 * one shard lock at a time, the guard shared), and only then retires the
 * slot behind the exclusive-guard barrier.  So while a thread holds the
 * guard shared, the segment slots its objects reference keep their identity
 * strings (id, name, endpoint, protocol, base) unchanged.  Only the mutable
 * accounting (allocator, used, objects, index) needs registry.mu.
 *
 * Functions named *_locked expect the caller to hold the lock they name;
 * never call a helper that takes a shard lock while holding that shard lock.
 */
#ifndef MOONLET_MASTER_INTERNAL_H
#define MOONLET_MASTER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "alloc.h"
#include "disk_layout.h"
#include "hmap.h"
#include "objslab.h"
#include "master.h"

/* Segment slots live in chunks of SEG_CHUNK pointers reached through a fixed
 * directory: a chunk never moves once allocated, so readers index slots
 * without the registry lock while mounts add chunks.  SEG_DIR chunks bound
 * the slots at 4M (memory runs out long before). */
#define SEG_CHUNK 1024u
#define POOL_DEPTH 8u
#define SEG_DIR 4096u
#define MOONLET_MAX_REPLICAS 8u
#define MOONLET_MAX_TENANTS 65536u
#define MOONLET_NO_TENANT UINT32_MAX

enum { OBJ_PENDING = 1, OBJ_COMPLETE = 2 };

/* One replica: 16 bytes. */
struct mrep {
    uint64_t offset;
    uint32_t seg;      /* segment slot */
    uint8_t status;    /* moonlet_replica_status */
    uint8_t disk_hdr;  /* 0: a DRAM replica; else a replica on a disk segment,
                        * its header's 4 KiB blocks (common/disk_layout.h) */
    uint8_t pad[2];
};

/* The bytes a replica's range takes: the object's size rounded to the
 * allocator's alignment in DRAM; on disk its header blocks and its bytes in
 * whole disk blocks (common/disk_layout.h), the extent the node writes. */
static inline uint64_t mrep_len(const struct mrep *rp, uint64_t size)
{
    if (rp->disk_hdr)
        return (uint64_t)rp->disk_hdr * MOONLET_DISK_BLOCK +
               ((size + MOONLET_DISK_BLOCK - 1) & ~(uint64_t)(MOONLET_DISK_BLOCK - 1));
    return moonlet_alloc_rounded(size ? size : 1);
}

/*
 * One object, allocated as a single block: a 48-byte header, the key bytes
 * (not NUL-terminated), then `nrep` replicas at the next 8-byte boundary.
 * (56 bytes since the end-to-end checksum.)
 * The key follows the header directly so a lookup touches the fewest cache
 * lines: the hash, length and the key's first bytes share the first line.
 */
struct mobj {
    struct mobj *next;          /* hash chain */
    uint64_t hash;              /* XXH3 of key, seeded with the tenant id */
    uint64_t size;              /* object bytes */
    uint64_t lease_deadline;    /* read lease (ns); while PENDING: put deadline;
                                 * sealed and never read: the seal time */
    uint64_t soft_pin_deadline; /* ns; 0 = not pinned; MOBJ_HARD_PIN: never evicted.
                                 * While PENDING: the soft-pin TTL (ns) PutEnd
                                 * turns into a deadline, or MOBJ_HARD_PIN */
    uint32_t tenant;
    uint16_t key_len;
    uint8_t nrep;
    uint8_t state : 2;          /* OBJ_PENDING / OBJ_COMPLETE */
    uint8_t soft_pin : 1;       /* PutStart asked for a soft pin */
    uint8_t nrep_cap : 4;       /* replicas allocated (nrep shrinks on unmount) */
    uint8_t has_checksum : 1;   /* PutEnd recorded `checksum` */
    uint64_t checksum;          /* the writer's XXH3-64 of the bytes (end-to-end check);
                                 * while PENDING: (put id << 8) | the
                                 * replacements granted (PutReplaceReplica,
                                 * bounded per put): see mobj_put_id */
    char key[];
};

/* 56 bytes: the end-to-end checksum added 8.  The hash, size, length and the
 * key's first bytes still share the first cache line. */
_Static_assert(sizeof(struct mobj) == 56, "object header grew: lookups touch more cache lines");

/* A hard pin is a pin whose deadline never comes: the eviction's check of
 * soft_pin_deadline (already on the header's first line) sees it, so the
 * 56-byte header needs no new field or bit. */
#define MOBJ_HARD_PIN UINT64_MAX
static inline bool mobj_hard_pinned(const struct mobj *o)
{
    return o->soft_pin_deadline == MOBJ_HARD_PIN;
}
/* The bytes a hard pin holds (object size x replicas allocated). */
static inline uint64_t mobj_pinned_bytes(const struct mobj *o)
{
    return o->size * o->nrep_cap;
}

/* A pending put's id (PutStart's, moonlet_master_put_opts.put_id) and the
 * replacements it was granted, both in the header's checksum field until
 * PutEnd (issue 31, finding 5: PutEnd / PutRevoke name the put, not only
 * its key).  56 bits of id. */
#define MOBJ_PUT_ID_MASK ((UINT64_C(1) << 56) - 1)
static inline uint64_t mobj_put_id(const struct mobj *o) { return o->checksum >> 8; }
static inline uint32_t mobj_replacements(const struct mobj *o)
{
    return (uint32_t)(o->checksum & 0xFFu);
}

static inline char *mobj_key(struct mobj *o) { return o->key; }
static inline size_t mobj_key_span(uint32_t key_len) { return (key_len + 7u) & ~(size_t)7u; }
static inline struct mrep *mobj_reps(struct mobj *o)
{
    return (struct mrep *)(o->key + mobj_key_span(o->key_len));
}
static inline const struct mrep *mobj_creps(const struct mobj *o)
{
    return (const struct mrep *)(o->key + mobj_key_span(o->key_len));
}
/* Held by the disk tier: a demoted or announced object has its one
 * replica on a disk segment (demotion swaps all DRAM replicas for it). */
static inline bool mobj_on_disk(const struct mobj *o)
{
    return o->nrep > 0 && mobj_creps(o)[0].disk_hdr != 0;
}
static inline bool mobj_readable(const struct mobj *o)
{
    return o->state == OBJ_COMPLETE && o->nrep > 0;
}

struct shard {
    pthread_mutex_t mu;
    struct mobj **buckets;
    uint32_t mask;  /* buckets - 1 (power of two) */
    uint32_t count;
} __attribute__((aligned(64)));

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
    /* registry.mu: the reservation pool (with cfg.repl_pos, segment.c): up
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

/*
 * A tenant slot.  A tenant exists only while something holds a reference:
 * each of its objects holds one, and a PutStart holds one for the duration of
 * the call.  The last release frees the slot, so a failed call under a new
 * name leaves nothing behind and unused tenants expire by themselves.
 * A tenant's id is (generation << 16) | slot; the generation changes each
 * time a slot is reused, so a reader that looked a name up before its tenant
 * expired can never match the objects of the slot's next tenant.
 */
struct tenant_slot {
    char *name;                  /* NULL: free slot */
    uint32_t len;
    uint32_t id;                 /* current id; the generation survives reuse */
    _Atomic uint64_t refs;       /* objects + PutStarts in flight */
};

struct tenants {
    pthread_rwlock_t lock;
    struct hmap by_name;         /* live tenant name -> slot */
    uint32_t *free, nfree, free_cap; /* free slots to reuse */
    struct tenant_slot *slots;
    uint32_t n, cap;             /* slots ever used, allocated */
    uint32_t live;               /* slots holding a tenant */
    uint32_t max;                /* cfg.max_tenants */
    uint64_t full_warned_ns;     /* last "table full" warning (lock held for writing) */
};

struct mstats {
    _Atomic uint64_t objects, bytes;
    _Atomic uint64_t pending;
    _Atomic uint64_t put_starts, put_ends, put_revokes, put_timeouts, removes;
    _Atomic uint64_t put_starts_reserved;
    _Atomic uint64_t put_replacements; /* PutReplaceReplica grants */
    _Atomic uint64_t evictions, eviction_passes;
    _Atomic uint64_t leases_get, leases_exist, leases_probe;
    _Atomic uint64_t probe_calls_none, probe_calls_last_hit;
    _Atomic uint64_t probe_candidates_examined, probe_recheck_fallbacks;
    _Atomic uint64_t probe_lock_hold_hist[MOONLET_LOCK_HIST_BUCKETS];
    _Atomic uint64_t probe_lock_hold_max_ns;
    _Atomic uint64_t unmounts_by_liveness;
    _Atomic uint64_t resume_calls, resume_candidates_examined, resume_recheck_fallbacks;
    _Atomic uint64_t leases_resume_kda, leases_resume_kv;
    _Atomic uint64_t resume_lock_hold_hist[MOONLET_LOCK_HIST_BUCKETS];
    _Atomic uint64_t resume_lock_hold_max_ns;
    _Atomic uint64_t hard_pinned, hard_pinned_bytes; /* reserved at PutStart, freed at destroy */
    _Atomic uint64_t disk_evictions;   /* disk-only objects evicted by the disk tier */
    _Atomic uint64_t disk_announced;   /* objects a restarted node's disk brought back */
};

struct moonlet_master {
    moonlet_master_config cfg;
    uint64_t lease_ttl_ns, soft_pin_ttl_ns, client_ttl_ns, put_timeout_ns, quarantine_grace_ns;
    _Atomic uint64_t liveness_hold_ns; /* no liveness expiry before (moonlet_master_hold_liveness) */
    /* The next put id (object.c): from a random start, so that two masters
     * (a promoted standby, a restarted leader) hand out ids that do not
     * meet; a restored pending put keeps its id (replicated in PLACE). */
    _Atomic uint64_t next_put_id;
    /* The leader epoch its write capabilities carry (common/writecap.h);
     * 0 without HA.  Raised by moonlet_master_set_epoch. */
    _Atomic uint64_t epoch;

    pthread_mutex_t evict_mu;
    pthread_mutex_t unmount_mu;     /* unmount.c: one drain at a time */
    struct unmount_job *unmounts;     /* unmount_mu: slots being stripped */
    uint32_t nunmounts, unmounts_cap;
    pthread_rwlock_t guard;
    struct shard *shards;
    uint32_t nshards;
    struct tenants tenants;
    struct registry reg;
    struct mstats st;
    moonlet_objslab *slab;          /* object metadata memory (leaf lock) */

    struct repair_state *repair;    /* repair.c: re-replication queue (repair_mu inside) */

    pthread_t bg;
    bool bg_started;
    pthread_mutex_t bg_mu;
    pthread_cond_t bg_cv;
    bool bg_stop;
    uint64_t last_reap_ns;
    uint64_t last_ahead_ns;         /* the background thread's last demote_ahead_pass */
    uint64_t trim_peak;             /* objects at the last malloc_trim or since (bg thread) */
};

/* The segment of a slot below nslots (NULL if never allocated).  Without
 * registry.mu only for a slot a replica names, under the guard shared. */
static inline struct mseg *reg_seg(const struct registry *r, uint32_t slot)
{
    struct mseg **chunk = r->dir[slot / SEG_CHUNK];
    return chunk ? chunk[slot % SEG_CHUNK] : NULL;
}

/* ---- shard.c: object table (pure table: takes no lock but what it is given) ---- */
int shards_init(moonlet_master *m);
void shards_destroy(moonlet_master *m);
uint64_t key_hash(uint32_t tenant, const char *key, uint32_t len);
static inline uint32_t shard_of(const moonlet_master *m, uint64_t hash)
{
    return (uint32_t)((hash >> 40) % m->nshards);
}
struct mobj *shard_find_locked(struct shard *s, uint64_t hash, uint32_t tenant, const char *key,
                               uint32_t len);
/* Lookups in two passes, so the cache misses of many keys overlap: the
 * bucket slot prefetched without any lock (a prefetch of a stale address is
 * harmless; shard_grow_locked stores the array and mask atomically for it),
 * then under the lock the chain's head with its header and key lines
 * prefetched, then the walk from that head. */
void shard_prefetch_slot(const moonlet_master *m, uint64_t hash);
struct mobj *shard_head_locked(const struct shard *s, uint64_t hash, uint32_t key_len);
struct mobj *shard_chain_find(struct mobj *o, uint64_t hash, uint32_t tenant, const char *key,
                              uint32_t len);
int shard_insert_locked(struct shard *s, struct mobj *o);
void shard_unlink_locked(struct shard *s, struct mobj *o);
struct mobj *mobj_new(moonlet_master *m, uint32_t tenant, uint64_t hash, const char *key,
                      uint32_t len, uint32_t nrep);
void mobj_free(moonlet_master *m, struct mobj *o);

/*
 * Visits every object of every shard, one shard lock at a time (ascending).
 * The visitor may destroy the object it is given (object_destroy_locked);
 * returning false stops the walk.  The caller holds the guard shared.
 */
typedef bool (*shard_visit_fn)(moonlet_master *m, struct shard *s, struct mobj *o, void *arg);
void shards_foreach(moonlet_master *m, shard_visit_fn fn, void *arg);
/* The same over shards [from, to) only. */
void shards_foreach_range(moonlet_master *m, uint32_t from, uint32_t to, shard_visit_fn fn,
                         void *arg);
/* Visits the objects whose hash is `hash` in shard s (its lock held); the
 * visitor may destroy the object it is given. */
void shard_foreach_hash_locked(moonlet_master *m, struct shard *s, uint64_t hash,
                               shard_visit_fn fn, void *arg);

/*
 * Looks up a batch of keys of one tenant.  For each key, fn(arg, i, obj) runs
 * under the key's shard lock with the object or NULL; keys that fail
 * key_check get results[i] = INVALID_KEY and no call.  hashes (optional)
 * receives each key's hash.  The caller holds the guard shared.
 *
 * Keys go in windows of BATCH_WINDOW (32, shard.c), whose bucket slots are
 * prefetched before any lock is taken, then in groups of LOCK_GROUP (16):
 * the group's distinct shard locks are taken together in ascending order
 * (the lock order allows it) and its objects are prefetched before any is
 * compared, so the cache misses overlap instead of queueing.
 */
typedef void (*batch_lookup_fn)(void *arg, size_t i, struct mobj *o);
void shard_batch_lookup(moonlet_master *m, uint32_t tenant, const moonlet_str *keys, size_t n,
                        int32_t *results, uint64_t *hashes, batch_lookup_fn fn, void *arg);

/* Validates a key: INVALID_KEY for empty or longer than MOONLET_MAX_KEY_BYTES. */
int key_check(moonlet_str key);

/* ---- replication records (master.h: moonlet_repl_rec) ---------------------- */
static inline bool repl_on(const moonlet_master *m) { return m->cfg.repl_emit != NULL; }
static inline void repl_emit(const moonlet_master *m, const moonlet_repl_rec *r)
{
    if (m->cfg.repl_emit)
        m->cfg.repl_emit(m->cfg.repl_arg, r);
}
/* Fills a PLACE / SEAL / DROP record of object o (its replicas' segment ids
 * and offsets, flags, ms left of its put deadline).  Caller holds the guard
 * shared and o's shard lock; rec points into o and the segments meanwhile. */
void repl_object_rec(const moonlet_master *m, const struct mobj *o, uint8_t type,
                     moonlet_repl_rec *rec);

/* ---- object.c ------------------------------------------------------------- */
/* Releases the object's space, unlinks and frees it.  Caller holds the guard
 * (shared) and the shard lock; takes registry.mu, then tenants.lock. */
/* The standby learns object (tenant, key) as it is (a PLACE naming its
 * replicas), when replication is on.  Takes the guard shared and its
 * shard lock. */
void object_replicate(moonlet_master *m, moonlet_str tenant, moonlet_str key);
void object_destroy_locked(moonlet_master *m, struct shard *s, struct mobj *o);

/* ---- tenant ids (master.c) ----------------------------------------------- */
/* Looks a tenant up (a hash map); MOONLET_NO_TENANT when unknown.  Returns
 * INVALID_PARAMS for bad names. */
int tenant_lookup(moonlet_master *m, moonlet_str name, uint32_t *id);
/* The name a tenant is known by (an empty one: the default tenant's). */
moonlet_str tenant_canonical(moonlet_str t);
/* Live tenant id's name into name (NUL-terminated), its length; 0 when the
 * id names no live tenant.  Takes tenants.lock shared. */
uint32_t tenant_name_of(moonlet_master *m, uint32_t id, char name[MOONLET_MAX_ID_BYTES + 1]);
/* Looks up or creates the tenant and takes a reference on it (the caller
 * releases it with tenant_release).  NO_AVAILABLE_HANDLE when the table
 * already holds cfg.max_tenants live tenants. */
int tenant_acquire(moonlet_master *m, moonlet_str name, uint32_t *id);
/* One more reference on a tenant the caller already holds one on. */
void tenant_ref(moonlet_master *m, uint32_t id);
/* Drops a reference; the last one frees the tenant's slot.  Takes tenants.lock. */
void tenant_release(moonlet_master *m, uint32_t id);
/* Live tenants (takes tenants.lock). */
uint32_t tenant_count(moonlet_master *m);

/* ---- segment.c: the registry (pure registry: never touches an object) ------ */
int registry_init(struct registry *r);
void registry_destroy(struct registry *r);
/* Reserves `nrep` ranges of `size` on distinct mounted segments into reps[]
 * and records `hash` (the object's) in each segment's index.  Caller holds
 * the guard shared (and a shard lock); takes registry.mu. */
int registry_place_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t nrep,
                          struct mrep *reps);
/* The same, trying the segments named in preferred[] first (in order; names
 * not mounted or without room are skipped), then round-robin. */
int registry_place_preferred_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t nrep,
                                    const moonlet_str *preferred, uint32_t npreferred,
                                    struct mrep *reps, bool *covered);
/* The mounted slot named `name` (mount name, else endpoint), or SLOT_NONE.
 * registry.mu held. */
uint32_t registry_slot_by_name_locked(const struct registry *r, moonlet_str name);
/* Puts a slot back on the placement ring (space was freed).  registry.mu held. */
void registry_avail_add_locked(struct registry *r, uint32_t slot);

/* ---- pool.c: reservation pools for a hot standby (all under registry.mu) --- */
/* cfg.repl_emit and cfg.repl_pos are both set. */
bool pool_enabled(const moonlet_master *m);
/* Places nrep replicas of rounded length len in pooled ranges the standby
 * acknowledged, on distinct segments (usable preferred names first, then
 * round-robin); false (nothing taken) when the pools cannot serve it. */
bool pool_place(moonlet_master *m, uint64_t len, const moonlet_str *preferred,
                uint32_t npreferred, uint32_t nrep, struct mrep *reps);
/* A put of rounded length len was placed on `slot` without the pool: the
 * pool may switch to that size, and refills. */
void pool_note(moonlet_master *m, uint32_t slot, uint64_t len);
/* A slot (re)mounted or retired: an empty pool (its ranges go with the
 * allocator). */
void pool_reset(struct mseg *s);
/* RESV records of the pool's ranges (snapshot.c). */
void pool_snapshot(const struct mseg *s, void (*emit)(void *arg, const moonlet_repl_rec *rec),
                   void *arg);

/* PutReplaceReplica's placement: reserves one range of `size` on a mounted
 * segment that holds none of reps[0..nrep) and is none of the segments
 * named in excluded[] (ids; unknown ones are skipped), into *out, and
 * records `hash` in its index.  NO_AVAILABLE_HANDLE when no segment fits.
 * Caller holds the guard shared and the object's shard lock; takes registry.mu. */
int registry_place_replacement_locked(moonlet_master *m, uint64_t hash, uint64_t size,
                                      const struct mrep *reps, uint32_t nrep,
                                      const moonlet_str *excluded, uint32_t nexcluded,
                                      struct mrep *out);
/* Promotion with state, and a node's announce of its disk: reserves exactly
 * the ranges seg_ids[k]/offs[k] of `size` (mounted segments; on a disk
 * segment the extent of a key of key_len bytes) into reps[], as
 * registry_place_locked does.  SEGMENT_NOT_FOUND, NO_AVAILABLE_HANDLE (a
 * range not free: nothing kept), INVALID_PARAMS (a range outside, or not
 * aligned).  Caller holds the guard shared and a shard lock; takes
 * registry.mu. */
int registry_place_at_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t key_len,
                             const moonlet_str *seg_ids, const uint64_t *offs, uint32_t nrep,
                             struct mrep *reps);
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
/* Objects on disk segments (each has its one replica there); takes
 * registry.mu. */
uint64_t registry_disk_objects(moonlet_master *m);
/* A demotion's target: reserves footprint bytes (a disk extent) on a mounted
 * disk segment, one of the node that holds a replica in reps[0..nrep) when
 * it has room (the copy stays on that host), else any with room.
 * NO_AVAILABLE_HANDLE when none has; SEGMENT_NOT_FOUND when no disk segment
 * is mounted.  Caller holds a shard lock; takes registry.mu. */
int registry_place_disk_locked(moonlet_master *m, uint64_t hash, uint64_t size, uint32_t disk_key,
                               const struct mrep *reps, uint32_t nrep, struct mrep *out,
                               uint64_t *gen);
/* Calls fn(arg, slot, offset, len) for every free extent of every mounted
 * segment of at least min_size bytes, disk segments or DRAM ones, under
 * registry.mu: fn must not lock. */
void registry_foreach_free(moonlet_master *m, uint64_t min_size, bool disk,
                           void (*fn)(void *arg, uint32_t slot, uint64_t offset, uint64_t len),
                           void *arg);

/* ---- unmount.c ------------------------------------------------------------ */
/* Unmounts every segment of clients not heard from within the liveness TTL,
 * and goes on with unmounts begun earlier: at most a bounded number of
 * objects per call (the rest on the next tick).  Takes unmount_mu, then the
 * guard shared per batch of objects (shard locks, registry.mu beneath). */
void liveness_check(moonlet_master *m);
/* Unmounts still in progress (takes unmount_mu). */
uint32_t unmounts_pending(moonlet_master *m);
void unmounts_destroy(moonlet_master *m);

/* ---- segment.c, for repair.c ---------------------------------------------- */
/* Reserves a range of `size` for one more replica of an object whose
 * replicas are reps[0..nrep): on a mounted, not draining segment other than
 * theirs, on a host (the endpoint without its port) other than those of its
 * replicas on segments that are not draining - or, when no such segment has
 * room, on any other segment (PutStart's rule: a single-host cluster).  Records `hash` in the
 * segment's index; *gen gets the segment's generation.  Caller holds the
 * guard shared (and the shard lock); takes registry.mu.
 * NO_AVAILABLE_HANDLE when no segment qualifies. */
int registry_place_extra_locked(moonlet_master *m, uint64_t hash, uint64_t size,
                                const struct mrep *reps, uint32_t nrep, struct mrep *out,
                                uint64_t *gen);
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
static inline bool seg_draining(const moonlet_master *m, uint32_t slot)
{
    return atomic_load(&reg_seg(&m->reg, slot)->draining);
}

/* ---- repair.c ------------------------------------------------------------- */
int repair_init(moonlet_master *m);
void repair_destroy(moonlet_master *m);
/* Notes that the object (its shard lock held) may have fewer readable
 * replicas than it was put with: queues its repair.  Takes repair_mu. */
void repair_note_locked(moonlet_master *m, const struct mobj *o);
/* Background work: times out jobs, starts queued ones within the limits.
 * Takes repair_mu, then (without it) the guard shared and one shard lock at
 * a time. */
/* An object as one PLACE record (FLAG_SEALED when sealed), its tenant's
 * name included (no replica: no record); free_ms: how long a range the
 * standby held for the object and this record no longer names stays
 * unusable.  What a snapshot sends per object, and what repair.c sends
 * when a drain swapped a replica.  Under the object's shard lock; takes
 * tenants.lock (read). */
void repl_object_send(moonlet_master *m, const struct mobj *o, uint64_t free_ms,
                      void (*emit)(void *arg, const moonlet_repl_rec *rec), void *arg);
/* Snapshot (snapshot.c): a QUAR record for each running job's target range,
 * as repair.c's repl_hold_target emitted it.  Takes repair_mu, then
 * registry.mu (not nested). */
void repair_snapshot_targets(moonlet_master *m,
                             void (*emit)(void *arg, const moonlet_repl_rec *rec), void *arg);
void repair_tick(moonlet_master *m);
/* Object o (its shard lock held) is being destroyed: its running repair job,
 * if any, is cancelled, so its copy is attached to no later object of the
 * same key.  Takes repair_mu (a leaf) only while a job runs. */
void repair_object_gone_locked(moonlet_master *m, const struct mobj *o);
/* Readable replicas of o not on a draining segment. */
uint32_t repair_live_replicas(const moonlet_master *m, const struct mobj *o);
/* The repair counters of moonlet_master_get_stats (takes repair_mu). */
void repair_stats(moonlet_master *m, moonlet_master_stats *st);
/* Eviction's demotion (repair.c owns the jobs): queues sealed o, in DRAM,
 * for a copy to a disk segment; o keeps its DRAM replicas until the copy is
 * durable and RepairDone swaps them for it.  DEMOTE_QUEUED (now or before),
 * DEMOTE_BUSY (a repair of o is queued or runs), DEMOTE_NONE (no disk tier
 * mounted, or the queue is full: counted as dropped; the caller evicts as
 * without a disk tier).  Under o's shard lock; takes repair_mu. */
enum { DEMOTE_NONE, DEMOTE_QUEUED, DEMOTE_BUSY, DEMOTE_SWAPPED };
int repair_demote_locked(moonlet_master *m, struct mobj *o);
/* A copy ahead of eviction (the disk tier's room allowing: its staged
 * copies take at most half of it): queues sealed o, in DRAM, for a disk
 * copy that is staged, not joined; o keeps its DRAM replicas and stays
 * DRAM's.  When eviction later picks o, repair_demote_locked (or
 * repair_swap_staged_locked) swaps its DRAM replicas for the copy at once,
 * with no copy to wait for: eviction under a flood of puts loses nothing
 * that was copied ahead.  Returns as repair_demote_locked (never
 * SWAPPED).  Under o's shard lock; takes repair_mu. */
int repair_demote_ahead_locked(moonlet_master *m, const struct mobj *o);
/* Copies made ahead and staged, and demotions running (each holds a disk
 * extent that is no object's replica yet). */
uint32_t repair_staged(const moonlet_master *m);
uint32_t repair_running_demotions(const moonlet_master *m);
/* When o has a staged copy (still valid), swaps its DRAM replicas for it:
 * true.  Under o's shard lock; takes repair_mu, then registry.mu. */
bool repair_swap_staged_locked(moonlet_master *m, struct mobj *o);

/* ---- evict.c -------------------------------------------------------------- */
/* One eviction pass (takes evict_mu, then the guard shared). */
uint64_t evict_pass(moonlet_master *m, double ratio);
/* Evicts what a put of `size` bytes with `nrep` replicas needs: on nrep
 * distinct segments, the cheapest run of adjacent free and evictable ranges
 * that is at least the rounded size.  Evicts nothing when no such runs
 * exist.  Returns objects evicted (takes evict_mu, then the guard shared). */
uint64_t evict_for_space(moonlet_master *m, uint64_t size, uint32_t nrep);
/* The disk tier's own eviction: the cheapest run of free and evictable
 * disk extents spanning len on one disk segment, its owners destroyed
 * (their extents quarantined while a reader's lease holds).  Returns
 * objects evicted.  Takes no lock the caller may hold (evict_mu first). */
uint64_t evict_disk_for_space(moonlet_master *m, uint64_t len);
/* A demotion that found no disk room: its object (hash, tenant) is
 * evicted from DRAM as without a disk tier, if still evictable.  Takes the
 * guard shared and its shard lock. */
void evict_without_copy(moonlet_master *m, uint64_t hash, uint32_t tenant);
/* With a disk tier: queues copies ahead of eviction (repair_demote_ahead_locked)
 * for the coldest DRAM objects, until cfg.demote_ahead_ratio of them have
 * one (staged or queued).  Returns how many it queued.  Takes evict_mu,
 * the guard shared, then one shard lock at a time. */
uint64_t demote_ahead_pass(moonlet_master *m);
/* Revokes puts whose PutEnd did not come within the put timeout. */
void reap_stale_puts(moonlet_master *m);

/* Lock-hold histogram bucket of a duration. */
unsigned lock_hist_bucket(uint64_t ns);
/* Records one shard-lock hold of ns: its histogram bucket and the maximum
 * (lock-free: relaxed counters, a CAS loop for the maximum). */
static inline void lock_hold_record(_Atomic uint64_t *hist, _Atomic uint64_t *max_ns, uint64_t ns)
{
    atomic_fetch_add_explicit(&hist[lock_hist_bucket(ns)], 1, memory_order_relaxed);
    uint64_t cur = atomic_load_explicit(max_ns, memory_order_relaxed);
    while (ns > cur && !atomic_compare_exchange_weak(max_ns, &cur, ns))
        ;
}

#endif
