/*
 * grow.h - the one copy of "the array is full: double its capacity", for the
 * growable arrays that count their elements and capacity in uint32_t.
 *
 * Owns nothing; takes no locks (the caller holds whatever guards the array).
 */
#ifndef MOONLET_GROW_H
#define MOONLET_GROW_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Room for one more element in the array a of elem_size-byte elements that
 * holds n of *cap: a itself while n < *cap; else a reallocated to twice *cap
 * elements (first when *cap is 0), with *cap set to that.  NULL when out of
 * memory or when twice *cap would not fit a uint32_t: a and *cap are
 * unchanged, and a is still the caller's to free.  The new slots are not
 * initialised. */
static inline void *moonlet_grow(void *a, uint32_t n, uint32_t *cap, uint32_t first,
                                 size_t elem_size)
{
    if (n < *cap)
        return a;
    if (*cap > UINT32_MAX / 2)
        return NULL;
    uint32_t nc = *cap ? *cap * 2 : first;
    void *na = realloc(a, (size_t)nc * elem_size);
    if (na)
        *cap = nc;
    return na;
}

#endif
