/*
 * disk_tier.h - a store node's disk tier: objects on files or block
 * devices, behind the node's DRAM segment (issue 32).
 *
 * What it owns: the tier's files (one or more paths, each preallocated to
 * its share of the tier's size, opened O_DIRECT), their space (an extent
 * allocator per path, in 4 KiB blocks), its I/O lanes (each an io_uring
 * with queue_depth aligned staging buffers registered with it once), the
 * table of the objects it holds, and the on-disk format: each object is a
 * header block (magic, version, key, size, the end-to-end checksum, a
 * write sequence, the tenant, the header's own hash) followed by its
 * bytes, both 4 KiB aligned (common/disk_layout.h: the extent sizes, for
 * the master).  It does not know the master: the caller (the node) decides
 * what to write and, with moonlet_disk_write_at, where; and announces what
 * a rescan finds.
 *
 * Placement: either the tier picks (moonlet_disk_write: round robin over the
 * paths, best fit in each) or the caller does (moonlet_disk_write_at: the
 * master tracks each path as a segment of moonlet_disk_path_capacity bytes,
 * offsets from 0, with its own allocator).  Either way the tier reserves
 * the exact extent in its own allocator and refuses one that overlaps
 * anything it holds or is writing.
 *
 * Copies: an object of several I/Os whose bytes are one 4 KiB aligned
 * range (a write's single iovec, a read's buf) goes straight from or into
 * that memory (its last part block through a staging buffer); any other
 * goes through the staging buffers.
 *
 * Durability: a write returns 0 (a batch: results[i] == 0) once the
 * object's header and bytes are on the device (written O_DIRECT, then a
 * data sync of its path through the ring; a batch makes one sync per path
 * it touched, after all its objects' I/Os; a batch of more than 8 MiB to a
 * path also syncs it early as its writes complete, so that the last sync
 * has less left to flush: only that last one makes anything durable);
 * moonlet_disk_remove invalidates
 * the header durably before the space can be reused.  A read verifies the
 * header (key, tenant, size, checksum, sequence) and the bytes' checksum:
 * it returns the bytes written for that location or an error, never other
 * bytes (on an error, buf may hold unverified bytes; *len is 0).
 *
 * Restart: moonlet_disk_open finds the objects already in existing files
 * (moonlet_disk_scan lists them): every header whose bytes still match its
 * checksum is kept and its space reserved; a header whose bytes do not (a
 * torn write, a range reused) or of another format version is dropped and
 * counted.
 *
 * Locks: meta_mu guards the allocators, the table and the counters; it is
 * held only for bookkeeping, never across I/O.  Each lane has its own mutex,
 * held by one call for its I/O (the ring and the staging buffers are the
 * lane's); a call takes a free lane (moonlet_disk_opts.lanes of them, 2 by
 * default), so a read does not wait behind a long write batch on another
 * lane.  The order is lane, then meta_mu.  An object being read is pinned
 * (under meta_mu): a remove of it marks it (new reads are refused) and
 * waits for the pins to go before it touches its header, so a read never
 * sees its space reused.  Thread safe; no call holds a lock across another
 * module's, and scan's callback runs under meta_mu (it must not call the
 * tier).
 */
#ifndef MOONLET_DISK_TIER_H
#define MOONLET_DISK_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "disk_layout.h" /* MOONLET_DISK_BLOCK, the extent sizes */

#define MOONLET_DISK_MAX_PATHS 16u
#define MOONLET_DISK_MAX_KEY (4096u + 256u) /* a tenant (255 bytes), a NUL, a key (4096) */

typedef struct moonlet_disk moonlet_disk;

typedef struct moonlet_disk_opts {
    const char *const *paths; /* regular files (created and preallocated) or block devices */
    size_t npaths;            /* 1 .. MOONLET_DISK_MAX_PATHS */
    uint64_t size;            /* the tier's bytes, shared out evenly (a block device: its size
                               * at most); rounded down to whole MiB per path */
    unsigned queue_depth;     /* I/Os in flight; 0: 32 */
    size_t io_bytes;          /* each I/O's bytes (a staging buffer); 0: 1 MiB */
    unsigned lanes;           /* rings that do I/O at once, each with queue_depth buffers of
                               * io_bytes; 0: 2 */
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
    uint64_t syncs_behind; /* a batch's early data syncs (disk_tier.c: sync-behind) */
    uint64_t queue_depth;  /* the most I/Os in flight: the depth times the lanes */
    uint64_t inflight;     /* I/Os in flight now */
} moonlet_disk_stats;

/* Opens (creating what is missing) and rescans.  INVALID_PARAMS for bad
 * options (no path, too many, a size under a MiB per path, a path that is
 * neither a regular file nor a block device), INTERNAL_ERROR (logged) when a
 * file cannot be opened, sized or read, or io_uring cannot start. */
int moonlet_disk_open(const moonlet_disk_opts *opts, moonlet_disk **out);
void moonlet_disk_close(moonlet_disk *d);

/* Writes (tenant, key)'s object from iov (iovcnt ranges, their total the
 * size) with its end-to-end checksum (XXH3-64 of the bytes, as a put
 * records it), durably, where the tier picks.  0 and *loc;
 * NO_AVAILABLE_HANDLE when no extent is large enough; INVALID_PARAMS for a
 * key of 0 or more than MOONLET_DISK_MAX_KEY bytes, or a checksum that does
 * not match the bytes; INTERNAL_ERROR on an I/O error (the space is given
 * back). */
int moonlet_disk_write(moonlet_disk *d, uint32_t tenant, const char *key, uint32_t key_len,
                       const struct iovec *iov, int iovcnt, uint64_t checksum,
                       moonlet_disk_loc *loc);

/* The same at the caller's placement: loc->path, loc->offset (the start of
 * the object's extent, where its header goes: 4 KiB aligned) and loc->size
 * (the iov's total).  The tier reserves exactly [offset, offset +
 * moonlet_disk_footprint(key_len, size)); INVALID_PARAMS (nothing written)
 * for a path out of range, an unaligned offset, an extent past the path's
 * capacity or overlapping an object the tier holds or is writing, or a size
 * that is not the iov's; otherwise as moonlet_disk_write. */
int moonlet_disk_write_at(moonlet_disk *d, const moonlet_disk_loc *loc, uint32_t tenant,
                          const char *key, uint32_t key_len, const struct iovec *iov,
                          int iovcnt, uint64_t checksum);

/* One object of a batch write. */
typedef struct moonlet_disk_wreq {
    moonlet_disk_loc *loc; /* placed: in, the caller's placement (as moonlet_disk_write_at);
                            * else out, where the tier put it */
    bool placed;
    uint32_t tenant;
    const char *key;
    uint32_t key_len;
    const struct iovec *iov;
    int iovcnt;
    uint64_t checksum;
} moonlet_disk_wreq;

/* Writes n objects with up to queue_depth I/Os in flight across them, then
 * one data sync per path touched.  results[i] is 0 (object i is durable) or
 * its own error, as moonlet_disk_write(_at) would return it (a failed
 * object's space is given back; the others are not affected).  Returns 0
 * when the batch ran, INVALID_PARAMS (nothing written) for NULL arguments
 * or a request without loc. */
int moonlet_disk_write_batch(moonlet_disk *d, const moonlet_disk_wreq *reqs, size_t n,
                             int *results);

/* Reads the object at loc into buf (cap bytes at least loc->size): 0 and
 * *len; INVALID_PARAMS for a location no write or scan gave (or, when key is
 * not NULL, one whose tenant or key are not these); BUFFER_OVERFLOW when cap
 * is too small; INVALID_READ when the header or the bytes do not verify
 * (counted); INTERNAL_ERROR on an I/O error. */
int moonlet_disk_read(moonlet_disk *d, const moonlet_disk_loc *loc, uint32_t tenant,
                      const char *key, uint32_t key_len, void *buf, size_t cap, size_t *len);

/* One object of a batch read: as moonlet_disk_read's arguments; on success
 * buf holds loc.size bytes. */
typedef struct moonlet_disk_rreq {
    moonlet_disk_loc loc;
    uint32_t tenant;
    const char *key; /* NULL: tenant and key not checked */
    uint32_t key_len;
    void *buf;
    size_t cap;
} moonlet_disk_rreq;

/* Reads n objects with up to queue_depth I/Os in flight across them; each
 * verified as moonlet_disk_read verifies it.  results[i] is 0 or object i's
 * error (moonlet_disk_read's).  Returns 0 when the batch ran,
 * INVALID_PARAMS for NULL arguments. */
int moonlet_disk_read_batch(moonlet_disk *d, const moonlet_disk_rreq *reqs, size_t n,
                            int *results);

/* Invalidates the object's header durably, then frees its space.
 * INVALID_PARAMS for a location no write or scan gave (or one being
 * removed). */
int moonlet_disk_remove(moonlet_disk *d, const moonlet_disk_loc *loc);

/* The size of the object whose extent starts at offset of path:
 * OBJECT_NOT_FOUND when none (or it is being removed). */
int moonlet_disk_object_size(moonlet_disk *d, uint32_t path, uint64_t offset, uint64_t *size);

/* Removes (as moonlet_disk_remove) the object whose extent starts at
 * offset of path, and with scan every object whose extent meets [offset,
 * +len) (a walk of every object: for the rare case where whoever places
 * objects forgot some, e.g. a master that took over).  *removed: how many.
 * 0 when nothing was there; INVALID_PARAMS for a bad path or range;
 * INTERNAL_ERROR when a header could not be invalidated. */
int moonlet_disk_remove_range(moonlet_disk *d, uint32_t path, uint64_t offset, uint64_t len,
                              bool scan, uint32_t *removed);

/* Calls fn for every object the tier holds (those found at open and those
 * written since), in no particular order, under the tier's lock (fn must not
 * call the tier).  key is key_len bytes, not terminated. */
void moonlet_disk_scan(moonlet_disk *d,
                       void (*fn)(void *arg, uint32_t tenant, const char *key, uint32_t key_len,
                                  const moonlet_disk_loc *loc, uint64_t checksum),
                       void *arg);

/* The paths (moonlet_disk_opts.npaths once open) and each one's capacity in
 * bytes (whole MiB; offsets from 0): what a caller that places objects
 * (moonlet_disk_write_at) allocates from.  0 for a path out of range. */
uint32_t moonlet_disk_npaths(moonlet_disk *d);
uint64_t moonlet_disk_path_capacity(moonlet_disk *d, uint32_t path);

void moonlet_disk_get_stats(moonlet_disk *d, moonlet_disk_stats *out);

#endif
