/*
 * alloc.c - best-fit, coalescing range allocator for one segment.
 *
 * Why two trees: best fit needs "smallest free extent >= len" (the by-size
 * tree) and coalescing needs "the free extents just before and after this
 * range" (the by-offset tree).  An extent lives in both.  Splitting an extent
 * on reserve keeps its position in the by-offset order (nothing free lies in
 * the reserved head), so only its by-size entry is re-inserted.
 *
 * Locks: none; the segment registry lock protects every call.
 */
#include "alloc.h"

#ifndef __unused /* RB_GENERATE_STATIC marks its functions with it */
#define __unused __attribute__((__unused__))
#endif
#include <bsd/sys/tree.h>
#include <stdlib.h>

#include "moonlet/error.h"

struct extent {
    RB_ENTRY(extent) by_off;
    RB_ENTRY(extent) by_size;
    uint64_t off;
    uint64_t len;
};

static int cmp_off(const struct extent *a, const struct extent *b)
{
    return a->off < b->off ? -1 : a->off > b->off;
}

static int cmp_size(const struct extent *a, const struct extent *b)
{
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return cmp_off(a, b);
}

RB_HEAD(off_tree, extent);
RB_HEAD(size_tree, extent);
RB_GENERATE_STATIC(off_tree, extent, by_off, cmp_off)
RB_GENERATE_STATIC(size_tree, extent, by_size, cmp_size)

struct moonlet_alloc {
    struct off_tree offs;
    struct size_tree sizes;
    uint64_t capacity;
    uint64_t used;
    uint64_t nextents;
};

uint64_t moonlet_alloc_rounded(uint64_t len)
{
    return (len + MOONLET_ALLOC_ALIGN - 1) & ~(uint64_t)(MOONLET_ALLOC_ALIGN - 1);
}

static void extent_insert(moonlet_alloc *a, struct extent *e)
{
    RB_INSERT(off_tree, &a->offs, e);
    RB_INSERT(size_tree, &a->sizes, e);
    a->nextents++;
}

static void extent_remove(moonlet_alloc *a, struct extent *e)
{
    RB_REMOVE(off_tree, &a->offs, e);
    RB_REMOVE(size_tree, &a->sizes, e);
    a->nextents--;
}

moonlet_alloc *moonlet_alloc_create(uint64_t capacity)
{
    moonlet_alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    RB_INIT(&a->offs);
    RB_INIT(&a->sizes);
    a->capacity = capacity & ~(uint64_t)(MOONLET_ALLOC_ALIGN - 1);
    if (a->capacity > 0) {
        struct extent *e = calloc(1, sizeof(*e));
        if (!e) {
            free(a);
            return NULL;
        }
        e->off = 0;
        e->len = a->capacity;
        extent_insert(a, e);
    }
    return a;
}

void moonlet_alloc_destroy(moonlet_alloc *a)
{
    if (!a)
        return;
    struct extent *e, *next;
    RB_FOREACH_SAFE(e, off_tree, &a->offs, next)
    {
        RB_REMOVE(off_tree, &a->offs, e);
        free(e);
    }
    free(a);
}

int moonlet_alloc_reserve(moonlet_alloc *a, uint64_t len, uint64_t *offset)
{
    if (len == 0 || len > a->capacity)
        return len == 0 ? MOONLET_ERR_INVALID_PARAMS : MOONLET_ERR_NO_AVAILABLE_HANDLE;
    len = moonlet_alloc_rounded(len);
    struct extent key = {.off = 0, .len = len};
    struct extent *e = RB_NFIND(size_tree, &a->sizes, &key);
    if (!e)
        return MOONLET_ERR_NO_AVAILABLE_HANDLE;
    *offset = e->off;
    a->used += len;
    if (e->len == len) {
        extent_remove(a, e);
        free(e);
        return MOONLET_OK;
    }
    RB_REMOVE(size_tree, &a->sizes, e);
    e->off += len; /* still between the same neighbours: by_off order holds */
    e->len -= len;
    RB_INSERT(size_tree, &a->sizes, e);
    return MOONLET_OK;
}

/* For a caller-given range [offset, offset + *len) (*len rounded here):
 * INVALID_PARAMS unless it is non-empty, aligned and inside the capacity;
 * else the free extents around it, *next the first starting at or after
 * offset, *prev the last starting before it (either NULL when none). */
static int range_lookup(moonlet_alloc *a, uint64_t offset, uint64_t *len, struct extent **prev,
                        struct extent **next)
{
    *len = moonlet_alloc_rounded(*len);
    if (*len == 0 || offset % MOONLET_ALLOC_ALIGN || offset > a->capacity ||
        *len > a->capacity - offset)
        return MOONLET_ERR_INVALID_PARAMS;
    struct extent key = {.off = offset};
    *next = RB_NFIND(off_tree, &a->offs, &key);
    *prev = *next ? RB_PREV(off_tree, &a->offs, *next) : RB_MAX(off_tree, &a->offs);
    return MOONLET_OK;
}

int moonlet_alloc_reserve_at(moonlet_alloc *a, uint64_t offset, uint64_t len)
{
    struct extent *prev, *next;
    if (range_lookup(a, offset, &len, &prev, &next) != MOONLET_OK)
        return MOONLET_ERR_INVALID_PARAMS;
    /* The free extent starting at or before offset must cover the range. */
    struct extent *e = next && next->off == offset ? next : prev;
    if (!e || e->off > offset || e->off + e->len < offset + len)
        return MOONLET_ERR_NO_AVAILABLE_HANDLE;
    uint64_t head = offset - e->off, tail = e->off + e->len - (offset + len);
    struct extent *t = NULL;
    if (head && tail && !(t = calloc(1, sizeof(*t))))
        return MOONLET_ERR_INTERNAL_ERROR;
    extent_remove(a, e);
    if (head) {
        e->len = head;
        extent_insert(a, e);
        if (tail) {
            t->off = offset + len;
            t->len = tail;
            extent_insert(a, t);
        }
    } else if (tail) {
        e->off = offset + len;
        e->len = tail;
        extent_insert(a, e);
    } else {
        free(e);
    }
    a->used += len;
    return MOONLET_OK;
}

int moonlet_alloc_release(moonlet_alloc *a, uint64_t offset, uint64_t len)
{
    struct extent *prev, *next;
    if (range_lookup(a, offset, &len, &prev, &next) != MOONLET_OK)
        return MOONLET_ERR_INVALID_PARAMS;
    if ((next && next->off < offset + len) || (prev && prev->off + prev->len > offset))
        return MOONLET_ERR_INVALID_PARAMS; /* overlaps free space: double free */

    a->used -= len;
    int merge_prev = prev && prev->off + prev->len == offset;
    int merge_next = next && offset + len == next->off;
    if (merge_prev && merge_next) {
        RB_REMOVE(size_tree, &a->sizes, prev);
        prev->len += len + next->len;
        extent_remove(a, next);
        free(next);
        RB_INSERT(size_tree, &a->sizes, prev);
    } else if (merge_prev) {
        RB_REMOVE(size_tree, &a->sizes, prev);
        prev->len += len;
        RB_INSERT(size_tree, &a->sizes, prev);
    } else if (merge_next) {
        RB_REMOVE(size_tree, &a->sizes, next);
        next->off = offset; /* grows downwards, still after prev */
        next->len += len;
        RB_INSERT(size_tree, &a->sizes, next);
    } else {
        struct extent *e = calloc(1, sizeof(*e));
        if (!e) {
            a->used += len;
            return MOONLET_ERR_INTERNAL_ERROR;
        }
        e->off = offset;
        e->len = len;
        extent_insert(a, e);
    }
    return MOONLET_OK;
}

uint64_t moonlet_alloc_capacity(const moonlet_alloc *a) { return a->capacity; }
uint64_t moonlet_alloc_used(const moonlet_alloc *a) { return a->used; }
uint64_t moonlet_alloc_free_extents(const moonlet_alloc *a) { return a->nextents; }

uint64_t moonlet_alloc_largest_free(const moonlet_alloc *a)
{
    struct extent *e = RB_MAX(size_tree, (struct size_tree *)&a->sizes);
    return e ? e->len : 0;
}

void moonlet_alloc_foreach_free(const moonlet_alloc *a,
                                void (*fn)(void *arg, uint64_t offset, uint64_t len), void *arg)
{
    struct extent *e;
    RB_FOREACH(e, off_tree, (struct off_tree *)&a->offs)
        fn(arg, e->off, e->len);
}
