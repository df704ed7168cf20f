/*
 * disk_tier.h - a store node's disk tier: objects on files or block
 * devices, behind the node's DRAM segment (issue 32).
 *
 * What it owns: the tier's files (one or more paths, each preallocated to
 * its share of the tier's size, opened O_DIRECT), their space (an extent
 * allocator per path, in 4 KiB blocks), one io_uring with aligned staging
 * buffers registered with it once, and the on-disk format: each object is
 * a header block (magic, key, size, the end-to-end checksum, a write
 * sequence, the header's own hash) followed by its bytes, both 4 KiB
 * aligned.  It does not know the master: the caller (the node) decides
 * what to write, and announces what a rescan finds.
 *
 * Durability: moonlet_disk_write returns once the header and the bytes are
 * on the device (written O_DIRECT, then a data sync through the ring);
 * moonlet_disk_remove invalidates the header durably before the space can
 * be reused.  A read verifies the header and the bytes' checksum: it
 * returns the bytes written for that location or an error, never other
 * bytes.
 *
 * Restart: moonlet_disk_open finds the objects already in existing files
 * (moonlet_disk_scan lists them): every header whose bytes still match its
 * checksum is kept and its space reserved; a header whose bytes do not (a
 * torn write, a range reused) is dropped and counted.
 *
 * Locks: one mutex (ring_mu) serialises the ring and the staging buffers;
 * the allocators and the counters are under it too.  Thread safe; no call
 * holds it across another module's.
 */
#ifndef MOONLET_DISK_TIER_H
#define MOONLET_DISK_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define MOONLET_DISK_BLOCK 4096u
#define MOONLET_DISK_MAX_PATHS 16u
#define MOONLET_DISK_MAX_KEY 4096u

typedef struct moonlet_disk moonlet_disk;

typedef struct moonlet_disk_opts {
    const char *const *paths; /* regular files (created and preallocated) or block devices */
    size_t npaths;            /* 1 .. MOONLET_DISK_MAX_PATHS */
    uint64_t size;            /* the tier's bytes, shared out evenly (a block device: its size
                               * at most); rounded down to whole MiB per path */
    unsigned queue_depth;     /* I/Os in flight; 0: 32 */
    size_t io_bytes;          /* each I/O's bytes (a staging buffer); 0: 1 MiB */
} moonlet_disk_opts;

/* Where an object lies: the path's index, the header's offset, the
 * object's bytes.  What the node tells the master, and gives back to read
 * or remove it. */
typedef struct moonlet_disk_loc {
    uint32_t path;
    uint64_t offset;
    uint64_t size;
} moonlet_disk_loc;

typedef struct moonlet_disk_stats {
    uint64_t capacity, used, objects;
    uint64_t writes, write_bytes, reads, read_bytes, removes;
    uint64_t checksum_errors; /* reads whose bytes or header did not verify */
    uint64_t io_errors;       /* failed or short I/Os */
    uint64_t scan_kept, scan_dropped;
} moonlet_disk_stats;

/* Opens (creating what is missing) and rescans.  INVALID_PARAMS for bad
 * options (no path, too many, a size under a MiB per path, a path that is
 * neither a regular file nor a block device), INTERNAL_ERROR (logged) when a
 * file cannot be opened, sized or read, or io_uring cannot start. */
int moonlet_disk_open(const moonlet_disk_opts *opts, moonlet_disk **out);
void moonlet_disk_close(moonlet_disk *d);

/* Writes key's object from iov (iovcnt ranges, their total the size) with
 * its end-to-end checksum (XXH3-64 of the bytes, as a put records it),
 * durably.  0 and *loc; NO_AVAILABLE_HANDLE when no extent is large enough;
 * INVALID_PARAMS for a key of 0 or more than MOONLET_DISK_MAX_KEY bytes, or
 * a checksum that does not match the bytes; INTERNAL_ERROR on an I/O error
 * (the space is given back). */
int moonlet_disk_write(moonlet_disk *d, const char *key, const struct iovec *iov, int iovcnt,
                       uint64_t checksum, moonlet_disk_loc *loc);

/* Reads the object at loc into buf (cap bytes at least loc->size): 0 and
 * *len; INVALID_PARAMS for a location no write or scan gave (or a key that
 * is not key, when key is not NULL); BUFFER_OVERFLOW when cap is too small;
 * INVALID_READ when the header or the bytes do not verify (counted);
 * INTERNAL_ERROR on an I/O error. */
int moonlet_disk_read(moonlet_disk *d, const moonlet_disk_loc *loc, const char *key, void *buf,
                      size_t cap, size_t *len);

/* Invalidates the object's header durably, then frees its space.
 * INVALID_PARAMS for a location no write or scan gave. */
int moonlet_disk_remove(moonlet_disk *d, const moonlet_disk_loc *loc);

/* Calls fn for every object the tier holds (those found at open and those
 * written since), in no particular order. */
void moonlet_disk_scan(moonlet_disk *d,
                       void (*fn)(void *arg, const char *key, const moonlet_disk_loc *loc,
                                  uint64_t checksum),
                       void *arg);

void moonlet_disk_get_stats(moonlet_disk *d, moonlet_disk_stats *out);

#endif
