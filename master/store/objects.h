/*
 * objects.h - the object table's records: an object (struct mobj) with its
 * replicas (struct mrep), the shards that hold them, and shard.c's table
 * operations.
 *
 * Owns no lock of its own: each struct shard carries its mutex (the shard
 * lock, order 2 in master_internal.h); shard.c takes no lock but what it is
 * given.  An object's fields are read and written under its shard lock.
 */
#ifndef MOONLET_MASTER_OBJECTS_H
#define MOONLET_MASTER_OBJECTS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc.h"
#include "disk_layout.h"
#include "master.h"

#define MOONLET_MAX_REPLICAS 8u

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

/* ---- shard.c: the table (pure table: takes no lock but what it is given) ---- */
int shards_init(moonlet_master *m);
void shards_destroy(moonlet_master *m);
uint64_t key_hash(uint32_t tenant, const char *key, uint32_t len);
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

#endif
