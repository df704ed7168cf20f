/*
 * alloc.h - the per-segment space allocator.
 *
 * The master hands out byte ranges of a store node's segment; the segment's
 * memory is never touched here.  Free space is kept as extents in two
 * red-black trees (libbsd's <sys/tree.h>): one ordered by offset, used to
 * coalesce a freed range with its neighbours, one ordered by (length,
 * offset), used for best-fit allocation.  Both operations are O(log extents).
 * Allocated ranges carry no bookkeeping here: the object that owns a range
 * remembers its offset and length and gives both back on free.
 *
 * Not thread safe: the caller holds the segment registry lock.
 */
#ifndef MOONLET_ALLOC_H
#define MOONLET_ALLOC_H

#include <stdint.h>

typedef struct moonlet_alloc moonlet_alloc;

#define MOONLET_ALLOC_ALIGN 64u /* every range starts and ends on a 64-byte boundary */

/* An allocator over [0, capacity). Returns NULL when out of memory. */
moonlet_alloc *moonlet_alloc_create(uint64_t capacity);
void moonlet_alloc_destroy(moonlet_alloc *a);

/* The length actually reserved for a request of `len` bytes. */
uint64_t moonlet_alloc_rounded(uint64_t len);

/* Reserves `len` bytes (len > 0): returns 0 and the offset, or
 * MOONLET_ERR_NO_AVAILABLE_HANDLE when no free extent is large enough. */
int moonlet_alloc_reserve(moonlet_alloc *a, uint64_t len, uint64_t *offset);

/* Reserves exactly [offset, offset + rounded len) (a replica restored from
 * the replication stream, master/ha/replicate.c): INVALID_PARAMS for a range
 * outside the segment or not aligned, NO_AVAILABLE_HANDLE when any of it is
 * not free. */
int moonlet_alloc_reserve_at(moonlet_alloc *a, uint64_t offset, uint64_t len);

/* Returns a range obtained from moonlet_alloc_reserve (same len).  Returns
 * MOONLET_ERR_INVALID_PARAMS when the range is outside the segment or overlaps
 * free space (a double free); the allocator is then unchanged. */
int moonlet_alloc_release(moonlet_alloc *a, uint64_t offset, uint64_t len);

uint64_t moonlet_alloc_capacity(const moonlet_alloc *a);
uint64_t moonlet_alloc_used(const moonlet_alloc *a);
uint64_t moonlet_alloc_largest_free(const moonlet_alloc *a);
uint64_t moonlet_alloc_free_extents(const moonlet_alloc *a);
/* Calls fn for every free extent in ascending offset order. */
void moonlet_alloc_foreach_free(const moonlet_alloc *a,
                                void (*fn)(void *arg, uint64_t offset, uint64_t len), void *arg);

#endif
