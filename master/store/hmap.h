/*
 * hmap.h - an open-addressing hash table of (64-bit hash, 32-bit value)
 * pairs, linear probing with backward-shift deletion (no tombstones), grown
 * at 3/4 load.  It stores no keys: a caller that maps strings keeps them
 * elsewhere and passes an equality callback that compares the string behind
 * a value, or looks it up with hmap_find_str, which compares the string its
 * key callback returns.  Duplicate hashes are allowed (two keys with one
 * hash).
 *
 * Used by the registry (client id -> client, segment id -> slot, the per-
 * segment index of object hashes) and by the tenant table (name -> slot).
 * No locks: the owner's lock protects it.  Entries move on insert (growth)
 * and delete, so a pointer from hmap_find is valid until the next change.
 */
#ifndef MOONLET_MASTER_HMAP_H
#define MOONLET_MASTER_HMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moonlet_str.h"

struct hent {
    uint64_t h;
    uint32_t v;
    uint32_t used; /* 0: empty */
};

struct hmap {
    struct hent *e;
    uint32_t cap; /* 0 or a power of two */
    uint32_t n;
};

/* eq(ctx, v): does value v stand for the key being looked up?  NULL: any. */
typedef bool (*hmap_eq_fn)(const void *ctx, uint32_t v);

/* key(owner, v): the string behind value v in a map of strings; ptr NULL:
 * none (v matches no string). */
typedef moonlet_str (*hmap_key_fn)(const void *owner, uint32_t v);

void hmap_free(struct hmap *m);
/* The entry with hash h for which eq holds, or NULL. */
struct hent *hmap_find(const struct hmap *m, uint64_t h, hmap_eq_fn eq, const void *ctx);
/* The entry with hash h (hmap_str_hash of s) whose value's string is s, or
 * NULL. */
struct hent *hmap_find_str(const struct hmap *m, uint64_t h, moonlet_str s, hmap_key_fn key,
                           const void *owner);
/* Adds (h, v); false when out of memory. */
bool hmap_insert(struct hmap *m, uint64_t h, uint32_t v);
/* Removes the entry (from hmap_find, no change in between). */
void hmap_remove(struct hmap *m, struct hent *e);
/* Removes the entry (h, v) if present; true when one was removed. */
bool hmap_remove_hv(struct hmap *m, uint64_t h, uint32_t v);
/* Bytes the table holds. */
static inline size_t hmap_bytes(const struct hmap *m) { return (size_t)m->cap * sizeof(struct hent); }

/* XXH3 of a string, the hash the registry and the tenant table use. */
uint64_t hmap_str_hash(const char *p, size_t len);

#endif
