/*
 * span.h - whether one byte range lies inside another, written once with
 * the overflow-safe comparisons (no `p + len` that could wrap).
 *
 * Owns nothing; takes no locks; pure.
 */
#ifndef MOONLET_SPAN_H
#define MOONLET_SPAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether [p, p + len) lies inside [base, base + cap). */
static inline bool moonlet_span_within(const void *p, size_t len, const void *base, size_t cap)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
    return a >= b && len <= cap && a - b <= cap - len;
}

#endif
