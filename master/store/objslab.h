/*
 * objslab.h - memory for object metadata.
 *
 * Objects are small (48 bytes + key + replicas) and numerous (millions), and
 * lookups touch them at random.  The slab carves them from 2 MiB chunks
 * advised for transparent huge pages, so a random lookup costs far fewer TLB
 * misses than with malloc'd blocks scattered over 4 KiB pages (measured with
 * moonlet-bench rpc: see docs/benchmarks.md), and carries no per-block
 * header.  Sizes are rounded to 16 bytes; each size class keeps its chunks
 * and their free blocks.  Freed memory is reused by later objects of the
 * same class; a chunk whose every block was freed is returned to the system
 * (one empty chunk per class is kept as a spare), so a mass removal gives
 * its memory back.  A chunk with even one live block stays.
 *
 * Thread safe: one mutex per size class, a leaf lock (taken under shard
 * locks, never held while taking another lock).
 */
#ifndef MOONLET_OBJSLAB_H
#define MOONLET_OBJSLAB_H

#include <stddef.h>

typedef struct moonlet_objslab moonlet_objslab;

/* Blocks up to max_size bytes; larger requests fall back to malloc. */
moonlet_objslab *moonlet_objslab_create(size_t max_size);
void moonlet_objslab_destroy(moonlet_objslab *s);
/* Zeroed block of `size` bytes, 16-byte aligned; NULL when out of memory. */
void *moonlet_objslab_alloc(moonlet_objslab *s, size_t size);
/* Returns a block; `size` must be the size it was allocated with. */
void moonlet_objslab_free(moonlet_objslab *s, void *p, size_t size);
/* Bytes reserved from the system (chunks), for statistics. */
size_t moonlet_objslab_reserved(moonlet_objslab *s);

#endif
