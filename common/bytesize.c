/*
 * bytesize.c - parsing and printing byte counts with binary suffixes; see
 * bytesize.h.  Written by hand because strtoull alone accepts signs, spaces
 * and silent wrap-around, all of which a size flag must refuse.  No locks.
 */
#include "bytesize.h"

#include <stdio.h>
#include <strings.h>

#include "moonlet/error.h"

static const struct {
    const char *suffix;
    unsigned shift;
} bytesize_units[] = {{"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}};

#define BYTESIZE_NUNITS (sizeof(bytesize_units) / sizeof(bytesize_units[0]))

int moonlet_bytesize_parse(const char *s, uint64_t *out)
{
    if (!s || !out || *s < '0' || *s > '9')
        return MOONLET_ERR_INVALID_PARAMS;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return MOONLET_ERR_INVALID_PARAMS;
        v = v * 10 + d;
    }
    if (*s == '\0') {
        *out = v;
        return MOONLET_OK;
    }
    for (size_t i = 0; i < BYTESIZE_NUNITS; i++) {
        if (strcasecmp(s, bytesize_units[i].suffix) != 0)
            continue;
        unsigned shift = bytesize_units[i].shift;
        if (v > (UINT64_MAX >> shift))
            return MOONLET_ERR_INVALID_PARAMS;
        *out = v << shift;
        return MOONLET_OK;
    }
    return MOONLET_ERR_INVALID_PARAMS;
}

const char *moonlet_bytesize_format(uint64_t v, char *buf, size_t cap)
{
    for (size_t i = BYTESIZE_NUNITS; i-- > 0;) {
        unsigned shift = bytesize_units[i].shift;
        if (v && (v & ((UINT64_C(1) << shift) - 1)) == 0) {
            snprintf(buf, cap, "%llu %s", (unsigned long long)(v >> shift),
                     bytesize_units[i].suffix);
            return buf;
        }
    }
    snprintf(buf, cap, "%llu B", (unsigned long long)v);
    return buf;
}
