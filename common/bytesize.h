/*
 * bytesize.h - byte counts as operators write them on command lines:
 * "1GiB", "64MiB", "4KiB", "1TiB" or plain bytes ("1048576").
 *
 * Binary suffixes only (KiB = 1024): a segment size is memory, and memory
 * comes in powers of two.  Pure functions; no locks.
 */
#ifndef MOONLET_BYTESIZE_H
#define MOONLET_BYTESIZE_H

#include <stddef.h>
#include <stdint.h>

/* Parses decimal digits followed by an optional suffix KiB, MiB, GiB or TiB
 * (case-insensitive).  Returns 0 and sets *out, or MOONLET_ERR_INVALID_PARAMS
 * for an empty string, a sign, spaces, a fraction, an unknown suffix or a
 * value that does not fit in 64 bits. */
int moonlet_bytesize_parse(const char *s, uint64_t *out);

/* Writes the largest exact binary unit ("64 MiB", "1536 KiB", "7 B") into
 * buf; returns buf. */
const char *moonlet_bytesize_format(uint64_t v, char *buf, size_t cap);

#endif
