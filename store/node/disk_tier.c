/*
 * disk_tier.c - a store node's disk tier (disk_tier.h).
 *
 * On disk, an object at offset O of a path is (common/disk_layout.h):
 *   [O, O + H)          its header: struct disk_hdr, then the key's bytes,
 *                       zero padding to a whole number of blocks (H);
 *   [O + H, O + H + S') its bytes, zero padding to whole blocks (S').
 * The header's hash covers the header (but the hash) and the key; the
 * checksum is the bytes' XXH3-64, the one a put records end to end.
 *
 * Every I/O goes through a lane's ring with O_DIRECT, from or into one of
 * the lane's staging buffers (aligned, registered once: WRITE_FIXED /
 * READ_FIXED), up to queue_depth in flight.  A batch write stages its
 * objects in order into whichever buffers are free, keeping the ring full
 * across objects: an object that fits one buffer goes as one I/O (header
 * and bytes: a torn one fails its checksum at the rescan); a larger one as
 * its bytes, hashed as they are staged, then its header, staged only once
 * the bytes matched the checksum (a mismatch leaves bytes without a
 * header: free space).  A larger one whose bytes are one block-aligned
 * range of the caller's memory goes from that memory: hashed whole first
 * (a mismatch writes nothing), then its bytes in I/Os of up to 16 MiB,
 * then its header.  (A header and the first bytes in one writev measured
 * half the rate of the bytes alone on an ext4 virtual disk:
 * docs/benchmarks.md.)  Once every I/O of the batch completed, one data
 * sync per path with an object that went well; only then are the objects
 * in the table (readable, listed).  Before that, sync-behind: each time
 * DISK_SYNC_BEHIND bytes of a path's writes have completed, a data sync of
 * it goes while the batch's other I/Os are in flight (one at a time per
 * path), so that the device flushes the batch as it goes and the last
 * sync has less to do; these make nothing durable on their own (the last
 * sync is still waited for after every I/O), and one that fails fails the
 * path's objects of the batch.  A batch read issues each object's
 * header and bytes at once (a small object: one I/O; into a block-aligned
 * buffer, the header and the first bytes in one readv, so that each object
 * takes one slot of the depth, as a block of fio's does), copies staged
 * bytes to the caller's buffer as they come, then checks the header and
 * the whole checksum.  A remove zeroes the header and syncs before it frees the
 * space, so a rescan never finds a header whose space was given to another
 * object (and if it did, the bytes would not match its checksum).
 *
 * Locks (disk_tier.h): meta_mu (the allocators, the table, pins, the seq,
 * the counters but io_errors, an atomic), each lane's mu (its ring, its
 * buffers).  No call holds both: bookkeeping under meta_mu, then I/O under
 * a lane, then bookkeeping again.  The table's objects are immutable once
 * in it but for pins and removing (meta_mu); a pinned object is not freed.
 */
#include "disk_tier.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
/* inline: XXH3_state_t on the stack for the streamed checksums */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "alloc.h"
#include "log.h"
#include "moonlet/error.h"

#define MOD "disk"
#define DISK_MAGIC "MLTDISK1"
#define DISK_VERSION 2u /* 2: the tenant */
#define DISK_MIB ((uint64_t)1 << 20)
/* The allocator works in 64-byte units (alloc.h); one unit here is a 64th
 * of a block, so that its alignment is a block's. */
#define DISK_UNIT (MOONLET_DISK_BLOCK / MOONLET_ALLOC_ALIGN)
#define DISK_LANES_MAX 8u
/* a sync's user data: this bit and the path */
#define DISK_SYNC_TAG ((uint64_t)1 << 63)
/* the most bytes of one I/O from or into the caller's memory: a 16 MiB
 * object's bytes go as one I/O, as fio's 16 MiB block */
#define DISK_DIRECT_MAX ((size_t)16 << 20)
/* a batch's bytes written to a path, completed, after which a data sync of
 * it goes while the rest of the batch is in flight (write_io) */
#define DISK_SYNC_BEHIND ((uint64_t)8 << 20)

struct disk_hdr {
    char magic[8];
    uint32_t version;
    uint32_t key_len;
    uint64_t size;
    uint64_t checksum;
    uint64_t seq;
    uint32_t tenant;
    uint32_t reserved; /* zero */
    uint64_t hash;     /* XXH3-64 of the fields above and the key */
};
_Static_assert(sizeof(struct disk_hdr) == MOONLET_DISK_HEADER_FIXED,
               "common/disk_layout.h's MOONLET_DISK_HEADER_FIXED is the header's size");

typedef struct disk_obj {
    moonlet_disk_loc loc;
    uint64_t checksum, seq;
    uint32_t tenant, key_len;
    char *key;
    unsigned pins; /* reads in flight (meta_mu) */
    bool removing; /* a remove waits for the pins, then zeroes the header (meta_mu) */
    struct disk_obj *next; /* the table's chain */
} disk_obj;

typedef struct disk_path {
    int fd;
    uint64_t cap; /* bytes of the tier on it */
    moonlet_alloc *alloc;
} disk_path;

/* What a staging buffer carries while its I/O is in flight. */
typedef struct lane_io {
    size_t req;   /* the batch's request */
    int kind;     /* IO_ONE, IO_HDR, IO_CHUNK, IO_DIRECT */
    uint64_t at;  /* a chunk: its offset in the object's bytes */
    size_t len;   /* a chunk: the object's bytes in it */
    uint64_t want; /* the I/O's bytes */
    struct iovec iov[2]; /* a read's header and its object's first bytes: their ranges */
} lane_io;
enum { IO_ONE, IO_HDR, IO_CHUNK, IO_DIRECT };

typedef struct disk_lane {
    pthread_mutex_t mu;
    struct io_uring ring;
    bool ring_up;
    unsigned char **stage; /* qd buffers of io_bytes */
    unsigned *free_buf, nfree;
    lane_io *io; /* per buffer */
    atomic_uint inflight; /* I/Os prepared and not yet completed (a gauge, for stats) */
} disk_lane;

struct moonlet_disk {
    pthread_mutex_t meta_mu;
    pthread_cond_t unpinned;
    disk_lane lanes[DISK_LANES_MAX];
    unsigned nlanes;
    atomic_uint next_lane;
    unsigned qd;
    size_t io_bytes;
    disk_path paths[MOONLET_DISK_MAX_PATHS];
    uint32_t npaths, next_path;
    disk_obj **table;
    size_t nbuckets;
    uint64_t seq;
    moonlet_disk_stats st;
    atomic_uint_fast64_t io_errors, syncs_behind;
};

static uint64_t round_up(uint64_t n, uint64_t a)
{
    return (n + a - 1) / a * a;
}

static uint64_t hdr_len(uint32_t key_len)
{
    return moonlet_disk_header_bytes(key_len);
}

static uint64_t obj_total(uint32_t key_len, uint64_t size)
{
    return moonlet_disk_footprint(key_len, size);
}

static uint64_t hdr_hash(const struct disk_hdr *h, const char *key)
{
    XXH3_state_t s;
    XXH3_64bits_reset(&s);
    XXH3_64bits_update(&s, h, offsetof(struct disk_hdr, hash));
    XXH3_64bits_update(&s, key, h->key_len);
    return XXH3_64bits_digest(&s);
}

/* ---- the table of objects ---------------------------------------------------------------- */

static size_t bucket_of(const moonlet_disk *d, uint32_t path, uint64_t offset)
{
    uint64_t x = ((uint64_t)path << 56) ^ (offset / MOONLET_DISK_BLOCK);
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 32) % d->nbuckets;
}

static disk_obj **obj_slot(moonlet_disk *d, uint32_t path, uint64_t offset)
{
    disk_obj **p = &d->table[bucket_of(d, path, offset)];
    while (*p && ((*p)->loc.path != path || (*p)->loc.offset != offset))
        p = &(*p)->next;
    return p;
}

static disk_obj *obj_add(moonlet_disk *d, const moonlet_disk_loc *loc, uint32_t tenant,
                         const char *key, uint32_t key_len, uint64_t checksum, uint64_t seq)
{
    disk_obj *o = calloc(1, sizeof(*o));
    if (!o || !(o->key = malloc(key_len + 1))) {
        free(o);
        return NULL;
    }
    memcpy(o->key, key, key_len);
    o->key[key_len] = 0;
    o->key_len = key_len;
    o->tenant = tenant;
    o->loc = *loc;
    o->checksum = checksum;
    o->seq = seq;
    disk_obj **slot = obj_slot(d, loc->path, loc->offset);
    o->next = *slot;
    *slot = o;
    d->st.objects++;
    return o;
}

static void obj_free(disk_obj *o)
{
    if (o) {
        free(o->key);
        free(o);
    }
}

/* ---- space -------------------------------------------------------------------------------- */

/* Reserves `total` bytes on some path (round robin from the last one). */
static int space_take(moonlet_disk *d, uint64_t total, moonlet_disk_loc *loc)
{
    for (uint32_t k = 0; k < d->npaths; k++) {
        uint32_t p = (d->next_path + k) % d->npaths;
        uint64_t unit = 0;
        if (moonlet_alloc_reserve(d->paths[p].alloc, total / DISK_UNIT, &unit) == MOONLET_OK) {
            d->next_path = (p + 1) % d->npaths;
            loc->path = p;
            loc->offset = unit * DISK_UNIT;
            d->st.used += total;
            return MOONLET_OK;
        }
    }
    return MOONLET_ERR_NO_AVAILABLE_HANDLE;
}

/* Reserves exactly [loc->offset, + total) of loc->path: INVALID_PARAMS when
 * it is out of range, unaligned or not all free. */
static int space_take_at(moonlet_disk *d, const moonlet_disk_loc *loc, uint64_t total)
{
    if (loc->path >= d->npaths || loc->offset % MOONLET_DISK_BLOCK ||
        loc->offset > d->paths[loc->path].cap || total > d->paths[loc->path].cap - loc->offset)
        return MOONLET_ERR_INVALID_PARAMS;
    if (moonlet_alloc_reserve_at(d->paths[loc->path].alloc, loc->offset / DISK_UNIT,
                                 total / DISK_UNIT) != MOONLET_OK)
        return MOONLET_ERR_INVALID_PARAMS; /* overlaps an object held or being written */
    d->st.used += total;
    return MOONLET_OK;
}

static void space_give(moonlet_disk *d, uint32_t p, uint64_t offset, uint64_t total)
{
    if (moonlet_alloc_release(d->paths[p].alloc, offset / DISK_UNIT, total / DISK_UNIT) ==
        MOONLET_OK)
        d->st.used -= total;
}

/* ---- lanes: a ring and its buffers --------------------------------------------------------- */

/* A free lane, or (none free) one waited for. */
static disk_lane *lane_take(moonlet_disk *d)
{
    unsigned start = atomic_fetch_add_explicit(&d->next_lane, 1, memory_order_relaxed);
    for (unsigned k = 0; k < d->nlanes; k++) {
        disk_lane *l = &d->lanes[(start + k) % d->nlanes];
        if (pthread_mutex_trylock(&l->mu) == 0)
            return l;
    }
    disk_lane *l = &d->lanes[start % d->nlanes];
    pthread_mutex_lock(&l->mu);
    return l;
}

static void lane_put(disk_lane *l)
{
    pthread_mutex_unlock(&l->mu);
}

static void io_error(moonlet_disk *d, const char *what, uint64_t bytes, int res)
{
    atomic_fetch_add_explicit(&d->io_errors, 1, memory_order_relaxed);
    ML_ERR(MOD, "%s of %llu bytes: %s", what, (unsigned long long)bytes,
           res < 0 ? strerror(-res) : "short");
}

static struct io_uring_sqe *lane_sqe(disk_lane *l)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
    if (!sqe && io_uring_submit(&l->ring) >= 0)
        sqe = io_uring_get_sqe(&l->ring);
    if (sqe)
        atomic_fetch_add_explicit(&l->inflight, 1, memory_order_relaxed);
    return sqe;
}

/* Prepares one I/O of buffer b (len bytes, a multiple of a block) with
 * user data b. */
static bool lane_prep(moonlet_disk *d, disk_lane *l, bool write, uint32_t p, uint64_t off,
                      unsigned b, size_t len)
{
    struct io_uring_sqe *sqe = lane_sqe(l);
    if (!sqe)
        return false;
    if (write)
        io_uring_prep_write_fixed(sqe, d->paths[p].fd, l->stage[b], (unsigned)len, off, (int)b);
    else
        io_uring_prep_read_fixed(sqe, d->paths[p].fd, l->stage[b], (unsigned)len, off, (int)b);
    io_uring_sqe_set_data64(sqe, b);
    l->io[b].want = len;
    return true;
}

/* Prepares one I/O of len bytes (a multiple of a block) straight from or
 * into the caller's memory at addr (block aligned), in slot b (the
 * buffer's index: it counts against the depth, its memory unused). */
static bool lane_prep_direct(moonlet_disk *d, disk_lane *l, bool write, uint32_t p,
                             uint64_t off, unsigned b, void *addr, size_t len)
{
    struct io_uring_sqe *sqe = lane_sqe(l);
    if (!sqe)
        return false;
    if (write)
        io_uring_prep_write(sqe, d->paths[p].fd, addr, (unsigned)len, off);
    else
        io_uring_prep_read(sqe, d->paths[p].fd, addr, (unsigned)len, off);
    io_uring_sqe_set_data64(sqe, b);
    l->io[b].want = len;
    return true;
}

/* Prepares, in slot b, one read at off into buffer b's first hdr bytes (a
 * header) and then len bytes into the caller's memory at addr (both block
 * aligned and whole blocks). */
static bool lane_prep_read_hdr_direct(moonlet_disk *d, disk_lane *l, uint32_t p, uint64_t off,
                                      unsigned b, size_t hdr, void *addr, size_t len)
{
    struct io_uring_sqe *sqe = lane_sqe(l);
    if (!sqe)
        return false;
    l->io[b].iov[0] = (struct iovec){l->stage[b], hdr};
    l->io[b].iov[1] = (struct iovec){addr, len};
    io_uring_prep_readv(sqe, d->paths[p].fd, l->io[b].iov, 2, off);
    io_uring_sqe_set_data64(sqe, b);
    l->io[b].want = hdr + len;
    return true;
}

/* Submits what is prepared and waits for a completion: 0 and its user data
 * and result, or INTERNAL_ERROR when the ring fails (logged). */
static int lane_wait(disk_lane *l, uint64_t *data, int *res)
{
    struct io_uring_cqe *cqe = NULL;
    for (;;) {
        int e = io_uring_submit_and_wait(&l->ring, 1);
        if (e >= 0 || e == -EINTR || e == -EAGAIN || e == -EBUSY) {
            if (io_uring_peek_cqe(&l->ring, &cqe) == 0 && cqe)
                break;
            if (e >= 0 || e == -EINTR)
                continue;
        }
        if (e < 0 && e != -EINTR) {
            ML_ERR(MOD, "io_uring: %s", strerror(-e));
            return MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    *data = io_uring_cqe_get_data64(cqe);
    *res = cqe->res;
    io_uring_cqe_seen(&l->ring, cqe);
    atomic_fetch_sub_explicit(&l->inflight, 1, memory_order_relaxed);
    return MOONLET_OK;
}

/* One I/O of buffer b, waited for. */
static int lane_io1(moonlet_disk *d, disk_lane *l, bool write, uint32_t p, uint64_t off,
                    unsigned b, size_t len)
{
    uint64_t data;
    int res;
    if (!lane_prep(d, l, write, p, off, b, len) || lane_wait(l, &data, &res))
        return MOONLET_ERR_INTERNAL_ERROR;
    if (res < 0 || (size_t)res != len) {
        io_error(d, write ? "write" : "read", len, res);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    return MOONLET_OK;
}

/* A data sync of every path whose flag is set in want[], all in flight at
 * once; failed[p] set for those that failed (all wanted ones when the ring
 * fails). */
static void lane_sync(moonlet_disk *d, disk_lane *l, const bool *want, bool *failed)
{
    unsigned n = 0;
    for (uint32_t p = 0; p < d->npaths; p++) {
        failed[p] = false;
        if (!want[p])
            continue;
        struct io_uring_sqe *sqe = lane_sqe(l);
        if (!sqe) {
            failed[p] = true;
            continue;
        }
        io_uring_prep_fsync(sqe, d->paths[p].fd, IORING_FSYNC_DATASYNC);
        io_uring_sqe_set_data64(sqe, DISK_SYNC_TAG | p);
        n++;
    }
    for (; n; n--) {
        uint64_t data;
        int res;
        if (lane_wait(l, &data, &res)) {
            for (uint32_t p = 0; p < d->npaths; p++)
                failed[p] = failed[p] || want[p];
            return;
        }
        uint32_t p = (uint32_t)(data & ~DISK_SYNC_TAG);
        if (res < 0 && p < d->npaths) {
            failed[p] = true;
            atomic_fetch_add_explicit(&d->io_errors, 1, memory_order_relaxed);
            ML_ERR(MOD, "data sync of path %u: %s", p, strerror(-res));
        }
    }
}

/* Copies `len` bytes of the ranges from *at (ranges consumed as they go)
 * to dst, hashing them on the way (the write's check of its checksum, in
 * the same pass as the copy into the staging buffers). */
typedef struct iov_cursor {
    const struct iovec *iov;
    int left;
    size_t off;
    XXH3_state_t hash;
} iov_cursor;

static void iov_take(iov_cursor *c, unsigned char *dst, size_t len)
{
    while (len && c->left) {
        size_t n = c->iov->iov_len - c->off;
        if (n > len)
            n = len;
        memcpy(dst, (const unsigned char *)c->iov->iov_base + c->off, n);
        XXH3_64bits_update(&c->hash, dst, n);
        dst += n;
        len -= n;
        c->off += n;
        if (c->off == c->iov->iov_len) {
            c->iov++;
            c->left--;
            c->off = 0;
        }
    }
}

/* ---- headers ---------------------------------------------------------------------------- */

/* Fills buf with the header of an object; returns its length. */
static uint64_t hdr_fill(unsigned char *buf, uint32_t tenant, const char *key, uint32_t key_len,
                         uint64_t size, uint64_t checksum, uint64_t seq)
{
    uint64_t len = hdr_len(key_len);
    memset(buf, 0, len);
    struct disk_hdr h = {.version = DISK_VERSION, .key_len = key_len, .size = size,
                         .checksum = checksum, .seq = seq, .tenant = tenant};
    memcpy(h.magic, DISK_MAGIC, sizeof(h.magic));
    h.hash = hdr_hash(&h, key);
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), key, key_len);
    return len;
}

/* Whether buffer `b` starts with a well-formed header (its key in the
 * buffer: at most `have` bytes were read); *h gets it. */
static bool hdr_parse(const unsigned char *b, size_t have, struct disk_hdr *h)
{
    if (have < sizeof(*h))
        return false;
    memcpy(h, b, sizeof(*h));
    if (memcmp(h->magic, DISK_MAGIC, sizeof(h->magic)) != 0 || h->version != DISK_VERSION ||
        !h->key_len || h->key_len > MOONLET_DISK_MAX_KEY || sizeof(*h) + h->key_len > have)
        return false;
    return hdr_hash(h, (const char *)b + sizeof(*h)) == h->hash;
}

/* Whether buffer `b` holds exactly o's header. */
static bool hdr_is(const unsigned char *b, const disk_obj *o)
{
    struct disk_hdr h;
    return hdr_parse(b, (size_t)hdr_len(o->key_len), &h) && h.key_len == o->key_len &&
           memcmp(b + sizeof(h), o->key, o->key_len) == 0 && h.size == o->loc.size &&
           h.checksum == o->checksum && h.seq == o->seq && h.tenant == o->tenant;
}

/* ---- writes ----------------------------------------------------------------------------- */

static uint64_t iov_size(const struct iovec *iov, int iovcnt)
{
    uint64_t size = 0;
    for (int i = 0; i < iovcnt; i++)
        size += iov[i].iov_len;
    return size;
}

/* One object of a batch write. */
typedef struct wjob {
    moonlet_disk_loc loc;
    uint64_t size, h, total, seq;
    uint64_t staged; /* its bytes staged (or, direct, asked for) so far */
    uint64_t body;   /* direct: the whole blocks written from the caller's memory */
    bool direct, reserved;
    int rc;
} wjob;

static bool aligned(const void *p)
{
    return ((uintptr_t)p & (MOONLET_DISK_BLOCK - 1)) == 0;
}

/* Stages the next I/O of job j (request r, the batch's i-th) into buffer
 * b and prepares it; *done when j has no more to stage.  Nothing prepared
 * when j fails (j->rc: a checksum that does not match, no SQE).  `c` is the
 * cursor of j's ranges, reset at j's first I/O. */
static void write_stage(moonlet_disk *d, disk_lane *l, const moonlet_disk_wreq *r, size_t i,
                        wjob *j, iov_cursor *c, unsigned b, bool *done)
{
    unsigned char *buf = l->stage[b];
    uint64_t off;
    size_t len;
    *done = false;
    if (j->direct) {
        const unsigned char *src = (const unsigned char *)r->iov[0].iov_base + j->staged;
        if (j->staged == 0 && XXH3_64bits(src, j->size) != r->checksum) {
            /* the bytes match the checksum before any I/O goes: no header
             * ever names other bytes (a mismatch writes nothing) */
            j->rc = MOONLET_ERR_INVALID_PARAMS;
            *done = true;
            return;
        }
        if (j->staged == j->size) { /* its header, once its bytes are on their way */
            hdr_fill(buf, r->tenant, r->key, r->key_len, j->size, r->checksum, j->seq);
            l->io[b] = (lane_io){.req = i, .kind = IO_HDR};
            *done = true;
            if (!lane_prep(d, l, true, j->loc.path, j->loc.offset, b, (size_t)j->h))
                j->rc = MOONLET_ERR_INTERNAL_ERROR;
            return;
        }
        bool tail = j->staged >= j->body;
        if (tail) { /* the last part block, staged */
            len = (size_t)(j->size - j->staged);
            memcpy(buf, src, len);
            memset(buf + len, 0, MOONLET_DISK_BLOCK - len);
            l->io[b] = (lane_io){.req = i, .kind = IO_CHUNK, .at = j->staged, .len = len};
        } else { /* whole blocks, no copy */
            uint64_t left = j->body - j->staged;
            len = left < DISK_DIRECT_MAX ? (size_t)left : DISK_DIRECT_MAX;
            l->io[b] = (lane_io){.req = i, .kind = IO_DIRECT, .at = j->staged, .len = len};
        }
        off = j->loc.offset + j->h + j->staged;
        j->staged += len;
        if (!(tail ? lane_prep(d, l, true, j->loc.path, off, b, MOONLET_DISK_BLOCK)
                   : lane_prep_direct(d, l, true, j->loc.path, off, b, (void *)src, len)))
            j->rc = MOONLET_ERR_INTERNAL_ERROR;
        return;
    }
    if (j->staged == 0 && !j->direct) { /* its first I/O (a header alone comes after bytes) */
        *c = (iov_cursor){.iov = r->iov, .left = r->iovcnt};
        XXH3_64bits_reset(&c->hash);
    }
    if (j->total <= d->io_bytes) { /* header and bytes in one I/O */
        hdr_fill(buf, r->tenant, r->key, r->key_len, j->size, r->checksum, j->seq);
        iov_take(c, buf + j->h, (size_t)j->size);
        memset(buf + j->h + j->size, 0, (size_t)(j->total - j->h - j->size));
        *done = true;
        if (XXH3_64bits_digest(&c->hash) != r->checksum) {
            j->rc = MOONLET_ERR_INVALID_PARAMS;
            return;
        }
        l->io[b] = (lane_io){.req = i, .kind = IO_ONE};
        off = j->loc.offset;
        len = (size_t)j->total;
    } else if (j->staged < j->size) {
        size_t n = j->size - j->staged < d->io_bytes ? (size_t)(j->size - j->staged) : d->io_bytes;
        len = (size_t)round_up(n, MOONLET_DISK_BLOCK);
        iov_take(c, buf, n);
        memset(buf + n, 0, len - n);
        off = j->loc.offset + j->h + j->staged;
        l->io[b] = (lane_io){.req = i, .kind = IO_CHUNK, .at = j->staged, .len = n};
        j->staged += n;
        /* the bytes are hashed as they are staged: a checksum that does not
         * match them is refused before any header names them */
        if (j->staged == j->size && XXH3_64bits_digest(&c->hash) != r->checksum) {
            j->rc = MOONLET_ERR_INVALID_PARAMS; /* bytes without a header: free space */
            *done = true;
            return;
        }
    } else {
        hdr_fill(buf, r->tenant, r->key, r->key_len, j->size, r->checksum, j->seq);
        l->io[b] = (lane_io){.req = i, .kind = IO_HDR};
        off = j->loc.offset;
        len = (size_t)j->h;
        *done = true;
    }
    if (!lane_prep(d, l, true, j->loc.path, off, b, len))
        j->rc = MOONLET_ERR_INTERNAL_ERROR;
}

/* Prepares a data sync of path p, not waited for by itself (its
 * completion comes to write_io's loop with DISK_SYNC_TAG). */
static bool lane_prep_sync(moonlet_disk *d, disk_lane *l, uint32_t p)
{
    struct io_uring_sqe *sqe = lane_sqe(l);
    if (!sqe)
        return false;
    io_uring_prep_fsync(sqe, d->paths[p].fd, IORING_FSYNC_DATASYNC);
    io_uring_sqe_set_data64(sqe, DISK_SYNC_TAG | p);
    return true;
}

/* The I/O part of a batch write, on lane l: every job's I/Os with up to
 * queue_depth in flight, then the syncs.  Sync-behind: once
 * DISK_SYNC_BEHIND bytes of a path's writes completed since its last
 * sync went, a data sync of it goes while the batch's other writes are
 * still in flight (one at a time per path), so that the device flushes
 * the batch's bytes as they come rather than all at the end; it makes
 * nothing durable by itself (the batch's last sync, after every I/O
 * completed, does), but leaves that last sync less to flush.  One that
 * fails fails the path's objects. */
static void write_io(moonlet_disk *d, disk_lane *l, const moonlet_disk_wreq *reqs, size_t n,
                     wjob *jobs)
{
    iov_cursor c;
    size_t next = 0;
    unsigned inflight = 0;
    uint64_t dirty[MOONLET_DISK_MAX_PATHS] = {0};
    bool behind[MOONLET_DISK_MAX_PATHS] = {false}, behind_failed[MOONLET_DISK_MAX_PATHS] = {false};
    for (;;) {
        while (l->nfree && next < n) {
            wjob *j = &jobs[next];
            if (j->rc) {
                next++;
                continue;
            }
            unsigned b = l->free_buf[--l->nfree];
            bool done;
            write_stage(d, l, &reqs[next], next, j, &c, b, &done);
            if (j->rc) {
                l->free_buf[l->nfree++] = b;
                next++;
                continue;
            }
            inflight++;
            if (done)
                next++;
        }
        if (!inflight)
            break;
        uint64_t data;
        int res;
        if (lane_wait(l, &data, &res)) {
            /* the ring is broken: fail the rest (its buffers stay out) */
            for (size_t i = 0; i < n; i++)
                jobs[i].rc = jobs[i].rc ? jobs[i].rc : MOONLET_ERR_INTERNAL_ERROR;
            return;
        }
        inflight--;
        if (data & DISK_SYNC_TAG) { /* a sync-behind */
            uint32_t p = (uint32_t)(data & ~DISK_SYNC_TAG);
            if (p < d->npaths) {
                behind[p] = false;
                if (res < 0) {
                    behind_failed[p] = true;
                    atomic_fetch_add_explicit(&d->io_errors, 1, memory_order_relaxed);
                    ML_ERR(MOD, "data sync of path %u: %s", p, strerror(-res));
                }
            }
            continue;
        }
        unsigned b = (unsigned)data;
        lane_io *io = &l->io[b];
        uint32_t p = jobs[io->req].loc.path;
        if (res < 0 || (uint64_t)res != io->want) {
            io_error(d, "write", io->want, res);
            if (!jobs[io->req].rc)
                jobs[io->req].rc = MOONLET_ERR_INTERNAL_ERROR;
        } else {
            dirty[p] += io->want;
        }
        l->free_buf[l->nfree++] = b;
        /* only while the batch has more to write: the last sync covers the rest */
        if (dirty[p] >= DISK_SYNC_BEHIND && !behind[p] && (inflight || next < n)) {
            if (lane_prep_sync(d, l, p)) {
                behind[p] = true;
                dirty[p] = 0;
                inflight++;
                atomic_fetch_add_explicit(&d->syncs_behind, 1, memory_order_relaxed);
            }
        }
    }
    bool want[MOONLET_DISK_MAX_PATHS] = {false}, failed[MOONLET_DISK_MAX_PATHS];
    bool any = false;
    for (size_t i = 0; i < n; i++)
        if (!jobs[i].rc)
            any = want[jobs[i].loc.path] = true;
    if (!any)
        return;
    lane_sync(d, l, want, failed);
    for (size_t i = 0; i < n; i++)
        if (!jobs[i].rc && (failed[jobs[i].loc.path] || behind_failed[jobs[i].loc.path]))
            jobs[i].rc = MOONLET_ERR_INTERNAL_ERROR;
}

int moonlet_disk_write_batch(moonlet_disk *d, const moonlet_disk_wreq *reqs, size_t n,
                             int *results)
{
    if (!d || (n && (!reqs || !results)))
        return MOONLET_ERR_INVALID_PARAMS;
    for (size_t i = 0; i < n; i++)
        if (!reqs[i].loc)
            return MOONLET_ERR_INVALID_PARAMS;
    if (!n)
        return MOONLET_OK;
    wjob one, *jobs = n == 1 ? &one : calloc(n, sizeof(*jobs));
    if (!jobs)
        return MOONLET_ERR_INTERNAL_ERROR;
    memset(jobs, 0, n * sizeof(*jobs));
    /* the arguments, then the space of each */
    for (size_t i = 0; i < n; i++) {
        const moonlet_disk_wreq *r = &reqs[i];
        wjob *j = &jobs[i];
        if (!r->key || !r->key_len || r->key_len > MOONLET_DISK_MAX_KEY || r->iovcnt < 0 ||
            (r->iovcnt && !r->iov)) {
            j->rc = MOONLET_ERR_INVALID_PARAMS;
            continue;
        }
        j->size = iov_size(r->iov, r->iovcnt);
        j->h = hdr_len(r->key_len);
        j->total = obj_total(r->key_len, j->size);
        if (r->placed && r->loc->size != j->size)
            j->rc = MOONLET_ERR_INVALID_PARAMS;
        /* an object of several I/Os in one block-aligned range goes from the
         * caller's memory (write_stage) */
        if (!j->rc && j->total > d->io_bytes && r->iovcnt == 1 && aligned(r->iov[0].iov_base)) {
            j->direct = true;
            j->body = j->size / MOONLET_DISK_BLOCK * MOONLET_DISK_BLOCK;
        }
    }
    pthread_mutex_lock(&d->meta_mu);
    for (size_t i = 0; i < n; i++) {
        wjob *j = &jobs[i];
        if (j->rc)
            continue;
        if (reqs[i].placed) {
            j->loc = *reqs[i].loc;
            j->rc = space_take_at(d, &j->loc, j->total);
        } else {
            j->rc = space_take(d, j->total, &j->loc);
        }
        j->loc.size = j->size;
        j->reserved = !j->rc;
        j->seq = ++d->seq;
    }
    pthread_mutex_unlock(&d->meta_mu);

    disk_lane *l = lane_take(d);
    write_io(d, l, reqs, n, jobs);
    lane_put(l);

    pthread_mutex_lock(&d->meta_mu);
    for (size_t i = 0; i < n; i++) {
        wjob *j = &jobs[i];
        const moonlet_disk_wreq *r = &reqs[i];
        if (!j->rc && !obj_add(d, &j->loc, r->tenant, r->key, r->key_len, r->checksum, j->seq))
            j->rc = MOONLET_ERR_INTERNAL_ERROR;
        if (j->rc && j->reserved) {
            space_give(d, j->loc.path, j->loc.offset, j->total);
        } else if (!j->rc) {
            d->st.writes++;
            d->st.write_bytes += j->size;
        }
    }
    pthread_mutex_unlock(&d->meta_mu);
    for (size_t i = 0; i < n; i++) {
        results[i] = jobs[i].rc;
        if (!jobs[i].rc && !reqs[i].placed)
            *reqs[i].loc = jobs[i].loc;
    }
    if (jobs != &one)
        free(jobs);
    return MOONLET_OK;
}

int moonlet_disk_write(moonlet_disk *d, uint32_t tenant, const char *key, uint32_t key_len,
                       const struct iovec *iov, int iovcnt, uint64_t checksum,
                       moonlet_disk_loc *loc)
{
    if (!d || !loc)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_disk_wreq r = {.loc = loc, .tenant = tenant, .key = key, .key_len = key_len,
                           .iov = iov, .iovcnt = iovcnt, .checksum = checksum};
    int res, rc = moonlet_disk_write_batch(d, &r, 1, &res);
    return rc ? rc : res;
}

int moonlet_disk_write_at(moonlet_disk *d, const moonlet_disk_loc *loc, uint32_t tenant,
                          const char *key, uint32_t key_len, const struct iovec *iov,
                          int iovcnt, uint64_t checksum)
{
    if (!d || !loc)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_disk_loc at = *loc;
    moonlet_disk_wreq r = {.loc = &at, .placed = true, .tenant = tenant, .key = key,
                           .key_len = key_len, .iov = iov, .iovcnt = iovcnt,
                           .checksum = checksum};
    int res, rc = moonlet_disk_write_batch(d, &r, 1, &res);
    return rc ? rc : res;
}

/* ---- reads ------------------------------------------------------------------------------ */

/* One object of a batch read. */
typedef struct rjob {
    disk_obj *o; /* pinned */
    uint64_t h, total;
    uint64_t issued; /* its bytes asked for so far */
    uint64_t body;   /* direct: the whole blocks read into the caller's memory */
    bool one, hdr_issued, direct;
    unsigned inflight;
    int rc;
} rjob;

/* Prepares the next I/O of job j into buffer b; *done when j has no more. */
static void read_stage(moonlet_disk *d, disk_lane *l, size_t i, rjob *j, unsigned char *dst,
                       unsigned b, bool *done)
{
    const disk_obj *o = j->o;
    uint64_t off;
    size_t len;
    *done = false;
    if (j->one) {
        l->io[b] = (lane_io){.req = i, .kind = IO_ONE};
        off = o->loc.offset;
        len = (size_t)j->total;
        *done = true;
    } else if (!j->hdr_issued && j->direct) { /* the header and the first whole blocks */
        len = j->body < DISK_DIRECT_MAX ? (size_t)j->body : DISK_DIRECT_MAX;
        l->io[b] = (lane_io){.req = i, .kind = IO_HDR, .at = 0, .len = len};
        j->hdr_issued = true;
        j->issued = len;
        *done = j->issued == o->loc.size;
        if (lane_prep_read_hdr_direct(d, l, o->loc.path, o->loc.offset, b, (size_t)j->h, dst,
                                      len))
            j->inflight++;
        else
            j->rc = MOONLET_ERR_INTERNAL_ERROR;
        return;
    } else if (!j->hdr_issued) {
        l->io[b] = (lane_io){.req = i, .kind = IO_HDR};
        off = o->loc.offset;
        len = (size_t)j->h;
        j->hdr_issued = true;
    } else if (j->direct && j->issued < j->body) { /* whole blocks, no copy */
        uint64_t left = j->body - j->issued;
        len = left < DISK_DIRECT_MAX ? (size_t)left : DISK_DIRECT_MAX;
        l->io[b] = (lane_io){.req = i, .kind = IO_DIRECT, .at = j->issued, .len = len};
        off = o->loc.offset + j->h + j->issued;
        j->issued += len;
        *done = j->issued == o->loc.size;
        if (lane_prep_direct(d, l, false, o->loc.path, off, b, dst + l->io[b].at, len))
            j->inflight++;
        else
            j->rc = MOONLET_ERR_INTERNAL_ERROR;
        return;
    } else {
        uint64_t left = o->loc.size - j->issued;
        size_t n = left < d->io_bytes ? (size_t)left : d->io_bytes;
        l->io[b] = (lane_io){.req = i, .kind = IO_CHUNK, .at = j->issued, .len = n};
        off = o->loc.offset + j->h + j->issued;
        len = (size_t)round_up(n, MOONLET_DISK_BLOCK);
        j->issued += n;
        *done = j->issued == o->loc.size;
    }
    if (lane_prep(d, l, false, o->loc.path, off, b, len))
        j->inflight++;
    else
        j->rc = MOONLET_ERR_INTERNAL_ERROR;
}

/* A completed read of buffer b: checked, its bytes copied to the caller's
 * buffer; the whole object checked once its last I/O is in. */
static void read_done(moonlet_disk *d, disk_lane *l, const moonlet_disk_rreq *reqs, rjob *jobs,
                      unsigned b, int res)
{
    lane_io *io = &l->io[b];
    rjob *j = &jobs[io->req];
    const disk_obj *o = j->o;
    unsigned char *buf = l->stage[b];
    j->inflight--;
    if (res < 0 || (uint64_t)res != io->want) {
        io_error(d, "read", io->want, res);
        j->rc = j->rc ? j->rc : MOONLET_ERR_INTERNAL_ERROR;
    }
    if (j->rc)
        return;
    unsigned char *dst = reqs[io->req].buf;
    if (io->kind == IO_ONE) {
        if (!hdr_is(buf, o) || XXH3_64bits(buf + j->h, (size_t)o->loc.size) != o->checksum)
            j->rc = MOONLET_ERR_INVALID_READ;
        else
            memcpy(dst, buf + j->h, (size_t)o->loc.size);
        return;
    }
    if (io->kind == IO_HDR && !hdr_is(buf, o))
        j->rc = MOONLET_ERR_INVALID_READ;
    else if (io->kind == IO_CHUNK)
        memcpy(dst + io->at, buf, io->len);
    /* the last I/O in: the bytes, whole, against the checksum */
    if (!j->rc && !j->inflight && j->hdr_issued && j->issued == o->loc.size &&
        XXH3_64bits(dst, (size_t)o->loc.size) != o->checksum)
        j->rc = MOONLET_ERR_INVALID_READ;
}

static void read_io(moonlet_disk *d, disk_lane *l, const moonlet_disk_rreq *reqs, size_t n,
                    rjob *jobs)
{
    size_t next = 0;
    unsigned inflight = 0;
    for (;;) {
        while (l->nfree && next < n) {
            rjob *j = &jobs[next];
            if (j->rc) {
                next++;
                continue;
            }
            unsigned b = l->free_buf[--l->nfree];
            bool done;
            read_stage(d, l, next, j, reqs[next].buf, b, &done);
            if (j->rc) {
                l->free_buf[l->nfree++] = b;
                next++;
                continue;
            }
            inflight++;
            if (done)
                next++;
        }
        if (!inflight)
            break;
        uint64_t data;
        int res;
        if (lane_wait(l, &data, &res)) {
            for (size_t i = 0; i < n; i++)
                jobs[i].rc = jobs[i].rc ? jobs[i].rc : MOONLET_ERR_INTERNAL_ERROR;
            return;
        }
        read_done(d, l, reqs, jobs, (unsigned)data, res);
        l->free_buf[l->nfree++] = (unsigned)data;
        inflight--;
    }
}

int moonlet_disk_read_batch(moonlet_disk *d, const moonlet_disk_rreq *reqs, size_t n,
                            int *results)
{
    if (!d || (n && (!reqs || !results)))
        return MOONLET_ERR_INVALID_PARAMS;
    if (!n)
        return MOONLET_OK;
    rjob one, *jobs = n == 1 ? &one : calloc(n, sizeof(*jobs));
    if (!jobs)
        return MOONLET_ERR_INTERNAL_ERROR;
    memset(jobs, 0, n * sizeof(*jobs));
    pthread_mutex_lock(&d->meta_mu);
    for (size_t i = 0; i < n; i++) {
        const moonlet_disk_rreq *r = &reqs[i];
        rjob *j = &jobs[i];
        disk_obj *o = r->loc.path < d->npaths ? *obj_slot(d, r->loc.path, r->loc.offset) : NULL;
        if (!o || o->removing || o->loc.size != r->loc.size || (!r->buf && r->loc.size) ||
            (r->key && (r->tenant != o->tenant || r->key_len != o->key_len ||
                        memcmp(r->key, o->key, o->key_len) != 0)))
            j->rc = MOONLET_ERR_INVALID_PARAMS;
        else if (r->cap < r->loc.size)
            j->rc = MOONLET_ERR_BUFFER_OVERFLOW;
        if (j->rc)
            continue;
        o->pins++;
        j->o = o;
        j->h = hdr_len(o->key_len);
        j->total = obj_total(o->key_len, o->loc.size);
        j->one = j->total <= d->io_bytes; /* header and bytes in one I/O */
        /* several I/Os into a block-aligned buffer: its whole blocks go
         * straight there, the tail block through a staging buffer */
        j->direct = !j->one && aligned(r->buf);
        j->body = j->direct ? o->loc.size / MOONLET_DISK_BLOCK * MOONLET_DISK_BLOCK : 0;
    }
    pthread_mutex_unlock(&d->meta_mu);

    disk_lane *l = lane_take(d);
    read_io(d, l, reqs, n, jobs);
    lane_put(l);

    uint64_t bad = 0;
    pthread_mutex_lock(&d->meta_mu);
    for (size_t i = 0; i < n; i++) {
        rjob *j = &jobs[i];
        if (!j->o)
            continue;
        if (--j->o->pins == 0 && j->o->removing)
            pthread_cond_broadcast(&d->unpinned);
        if (j->rc == MOONLET_ERR_INVALID_READ) {
            d->st.checksum_errors++;
            bad++;
        } else if (!j->rc) {
            d->st.reads++;
            d->st.read_bytes += reqs[i].loc.size;
        }
    }
    pthread_mutex_unlock(&d->meta_mu);
    for (size_t i = 0; i < n; i++) {
        results[i] = jobs[i].rc;
        if (jobs[i].rc == MOONLET_ERR_INVALID_READ)
            ML_WARN(MOD, "object at %llu on path %u does not verify: not returned",
                    (unsigned long long)reqs[i].loc.offset, reqs[i].loc.path);
    }
    (void)bad;
    if (jobs != &one)
        free(jobs);
    return MOONLET_OK;
}

int moonlet_disk_read(moonlet_disk *d, const moonlet_disk_loc *loc, uint32_t tenant,
                      const char *key, uint32_t key_len, void *buf, size_t cap, size_t *len)
{
    if (!d || !loc || (!buf && loc->size) || !len)
        return MOONLET_ERR_INVALID_PARAMS;
    *len = 0;
    moonlet_disk_rreq r = {.loc = *loc, .tenant = tenant, .key = key, .key_len = key_len,
                           .buf = buf, .cap = cap};
    int res, rc = moonlet_disk_read_batch(d, &r, 1, &res);
    if (!rc && !res)
        *len = (size_t)loc->size;
    return rc ? rc : res;
}

/* ---- remove, scan, stats ----------------------------------------------------------------- */

int moonlet_disk_remove(moonlet_disk *d, const moonlet_disk_loc *loc)
{
    if (!d || !loc)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_mutex_lock(&d->meta_mu);
    disk_obj *o = loc->path < d->npaths ? *obj_slot(d, loc->path, loc->offset) : NULL;
    if (!o || o->removing || o->loc.size != loc->size) {
        pthread_mutex_unlock(&d->meta_mu);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    o->removing = true; /* no new reads; those in flight finish first */
    while (o->pins)
        pthread_cond_wait(&d->unpinned, &d->meta_mu);
    pthread_mutex_unlock(&d->meta_mu);

    uint64_t h = hdr_len(o->key_len);
    disk_lane *l = lane_take(d);
    int rc = l->nfree ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR; /* none: its ring failed */
    unsigned b = l->nfree ? l->free_buf[l->nfree - 1] : 0;
    if (!rc) {
        memset(l->stage[b], 0, (size_t)h);
        rc = lane_io1(d, l, true, o->loc.path, o->loc.offset, b, (size_t)h);
    }
    if (!rc) {
        bool want[MOONLET_DISK_MAX_PATHS] = {false}, failed[MOONLET_DISK_MAX_PATHS];
        want[o->loc.path] = true;
        lane_sync(d, l, want, failed);
        rc = failed[o->loc.path] ? MOONLET_ERR_INTERNAL_ERROR : MOONLET_OK;
    }
    lane_put(l);

    pthread_mutex_lock(&d->meta_mu);
    if (!rc) { /* the header is gone for good: the space may go to another */
        disk_obj **slot = obj_slot(d, o->loc.path, o->loc.offset);
        *slot = o->next;
        space_give(d, o->loc.path, o->loc.offset, obj_total(o->key_len, o->loc.size));
        d->st.objects--;
        d->st.removes++;
        obj_free(o);
    } else {
        o->removing = false;
    }
    pthread_mutex_unlock(&d->meta_mu);
    return rc;
}

int moonlet_disk_object_size(moonlet_disk *d, uint32_t path, uint64_t offset, uint64_t *size)
{
    if (!d || !size || path >= d->npaths)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_mutex_lock(&d->meta_mu);
    disk_obj *o = *obj_slot(d, path, offset);
    int rc = o && !o->removing ? MOONLET_OK : MOONLET_ERR_OBJECT_NOT_FOUND;
    if (!rc)
        *size = o->loc.size;
    pthread_mutex_unlock(&d->meta_mu);
    return rc;
}

int moonlet_disk_remove_range(moonlet_disk *d, uint32_t path, uint64_t offset, uint64_t len,
                              bool scan, uint32_t *removed)
{
    if (removed)
        *removed = 0;
    if (!d || path >= d->npaths || len == 0 || offset > UINT64_MAX - len)
        return MOONLET_ERR_INVALID_PARAMS;
    /* The objects to remove: the one that starts at offset (a lookup), or
     * with scan every one whose extent meets the range (all of the table). */
    moonlet_disk_loc found[64];
    uint32_t n = 0;
    int rc = MOONLET_OK;
    pthread_mutex_lock(&d->meta_mu);
    disk_obj *o = *obj_slot(d, path, offset);
    if (o && !o->removing)
        found[n++] = o->loc;
    for (size_t b = 0; scan && b < d->nbuckets; b++)
        for (o = d->table[b]; o && n < 64; o = o->next) {
            uint64_t end = o->loc.offset + obj_total(o->key_len, o->loc.size);
            if (o->loc.path == path && o->loc.offset != offset && !o->removing &&
                o->loc.offset < offset + len && end > offset)
                found[n++] = o->loc;
        }
    pthread_mutex_unlock(&d->meta_mu);
    for (uint32_t i = 0; i < n; i++) {
        int r = moonlet_disk_remove(d, &found[i]);
        if (r == MOONLET_OK && removed)
            (*removed)++;
        else if (r != MOONLET_OK && r != MOONLET_ERR_INVALID_PARAMS) /* gone meanwhile: fine */
            rc = r;
    }
    return rc;
}

void moonlet_disk_scan(moonlet_disk *d,
                       void (*fn)(void *arg, uint32_t tenant, const char *key, uint32_t key_len,
                                  const moonlet_disk_loc *loc, uint64_t checksum),
                       void *arg)
{
    if (!d || !fn)
        return;
    pthread_mutex_lock(&d->meta_mu);
    for (size_t b = 0; b < d->nbuckets; b++)
        for (disk_obj *o = d->table[b]; o; o = o->next)
            fn(arg, o->tenant, o->key, o->key_len, &o->loc, o->checksum);
    pthread_mutex_unlock(&d->meta_mu);
}

void moonlet_disk_get_stats(moonlet_disk *d, moonlet_disk_stats *out)
{
    pthread_mutex_lock(&d->meta_mu);
    *out = d->st;
    pthread_mutex_unlock(&d->meta_mu);
    out->io_errors = atomic_load_explicit(&d->io_errors, memory_order_relaxed);
    out->syncs_behind = atomic_load_explicit(&d->syncs_behind, memory_order_relaxed);
    out->queue_depth = (uint64_t)d->qd * d->nlanes;
    out->inflight = 0;
    for (unsigned k = 0; k < d->nlanes; k++)
        out->inflight += atomic_load_explicit(&d->lanes[k].inflight, memory_order_relaxed);
}

uint32_t moonlet_disk_npaths(moonlet_disk *d)
{
    return d ? d->npaths : 0;
}

uint64_t moonlet_disk_path_capacity(moonlet_disk *d, uint32_t path)
{
    return d && path < d->npaths ? d->paths[path].cap : 0;
}

/* ---- open: the files, the lanes, the rescan ------------------------------------------------ */

/* The bytes [base, base + size) of path p hashed (XXH3-64 in *hash), read
 * in waves of the lane's buffers (all of them: the caller's window too). */
static int rescan_hash(moonlet_disk *d, disk_lane *l, uint32_t p, uint64_t base, uint64_t size,
                       uint64_t *hash)
{
    XXH3_state_t s;
    XXH3_64bits_reset(&s);
    int rc = MOONLET_OK;
    for (uint64_t done = 0; done < size && !rc;) {
        unsigned n = 0;
        uint64_t at = done;
        for (; n < d->qd && at < size; n++) {
            size_t len = size - at < d->io_bytes ? (size_t)(size - at) : d->io_bytes;
            if (!lane_prep(d, l, false, p, base + at, n, (size_t)round_up(len, MOONLET_DISK_BLOCK)))
                return MOONLET_ERR_INTERNAL_ERROR;
            at += len;
        }
        for (unsigned k = 0; k < n; k++) {
            uint64_t data;
            int res;
            if (lane_wait(l, &data, &res))
                return MOONLET_ERR_INTERNAL_ERROR;
            if (res < 0 || (uint64_t)res != l->io[data].want) {
                io_error(d, "read", l->io[data].want, res);
                rc = MOONLET_ERR_INTERNAL_ERROR;
            }
        }
        for (unsigned b = 0; b < n && !rc; b++) {
            size_t len = size - done < d->io_bytes ? (size_t)(size - done) : d->io_bytes;
            XXH3_64bits_update(&s, l->stage[b], len);
            done += len;
        }
    }
    *hash = XXH3_64bits_digest(&s);
    return rc;
}

/* The object whose header starts at `pos` of path p, if its header and
 * bytes verify: kept (its space reserved) and *total set; else false. */
static bool rescan_object(moonlet_disk *d, disk_lane *l, uint32_t p, uint64_t pos,
                          uint64_t *total)
{
    disk_path *dp = &d->paths[p];
    /* the header and the key: at most hdr_len(MAX_KEY) bytes */
    uint64_t hmax = hdr_len(MOONLET_DISK_MAX_KEY);
    size_t want = (size_t)(dp->cap - pos < hmax ? dp->cap - pos : hmax);
    if (lane_io1(d, l, false, p, pos, 0, want))
        return false;
    struct disk_hdr h;
    if (!hdr_parse(l->stage[0], want, &h))
        return false;
    uint64_t t = obj_total(h.key_len, h.size);
    if (h.size > dp->cap || t > dp->cap - pos)
        return false;
    char *key = malloc(h.key_len + 1);
    if (!key)
        return false;
    memcpy(key, l->stage[0] + sizeof(h), h.key_len);
    uint64_t got = 0;
    bool ok = rescan_hash(d, l, p, pos + hdr_len(h.key_len), h.size, &got) == MOONLET_OK &&
              got == h.checksum &&
              moonlet_alloc_reserve_at(dp->alloc, pos / DISK_UNIT, t / DISK_UNIT) == MOONLET_OK;
    if (ok) {
        moonlet_disk_loc loc = {.path = p, .offset = pos, .size = h.size};
        ok = obj_add(d, &loc, h.tenant, key, h.key_len, h.checksum, h.seq) != NULL;
        if (ok) {
            d->st.used += t;
            if (h.seq > d->seq)
                d->seq = h.seq;
        } else {
            moonlet_alloc_release(dp->alloc, pos / DISK_UNIT, t / DISK_UNIT);
        }
    }
    free(key);
    *total = t;
    return ok;
}

/* Walks path p window by window (buffer 1 of lane l); a block that starts
 * with the magic is a candidate header (rescan_object).  A header whose
 * bytes do not verify is dropped and the walk goes on from the next block.
 * Only open calls it: no other call runs yet (meta_mu not needed). */
static int rescan(moonlet_disk *d, disk_lane *l, uint32_t p)
{
    disk_path *dp = &d->paths[p];
    for (uint64_t pos = 0; pos < dp->cap;) {
        size_t n = (size_t)(dp->cap - pos < d->io_bytes ? dp->cap - pos : d->io_bytes);
        if (lane_io1(d, l, false, p, pos, 1, n))
            return MOONLET_ERR_INTERNAL_ERROR;
        uint64_t next = pos + n;
        for (size_t off = 0; off < n; off += MOONLET_DISK_BLOCK) {
            if (memcmp(l->stage[1] + off, DISK_MAGIC, 8) != 0)
                continue;
            uint64_t total = 0;
            if (rescan_object(d, l, p, pos + off, &total)) {
                d->st.scan_kept++;
                next = pos + off + total;
                break;
            }
            d->st.scan_dropped++;
            ML_WARN(MOD, "path %u: the object at %llu does not verify: dropped", p,
                    (unsigned long long)(pos + off));
            next = pos + off + MOONLET_DISK_BLOCK; /* its reads took the window's buffer */
            break;
        }
        pos = next;
    }
    return MOONLET_OK;
}

/* Opens path i: a block device as it is (its size at most `share`), a
 * regular file created or grown to `share` (preallocated). */
static int path_open(moonlet_disk *d, uint32_t i, const char *path, uint64_t share)
{
    int fd = open(path, O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) {
        ML_ERR(MOD, "%s: %s", path, strerror(errno));
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    struct stat sb;
    uint64_t cap = share;
    int rc = MOONLET_OK;
    if (fstat(fd, &sb) != 0) {
        rc = MOONLET_ERR_INTERNAL_ERROR;
    } else if (S_ISBLK(sb.st_mode)) {
        uint64_t dev = 0;
        if (ioctl(fd, BLKGETSIZE64, &dev) != 0)
            rc = MOONLET_ERR_INTERNAL_ERROR;
        else if (dev < cap)
            cap = dev / DISK_MIB * DISK_MIB;
    } else if (!S_ISREG(sb.st_mode)) {
        rc = MOONLET_ERR_INVALID_PARAMS;
    } else if ((uint64_t)sb.st_size < cap) {
        int e = posix_fallocate(fd, 0, (off_t)cap);
        if (e) {
            ML_ERR(MOD, "%s: cannot preallocate %llu bytes: %s", path, (unsigned long long)cap,
                   strerror(e));
            rc = MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    if (!rc && cap < DISK_MIB)
        rc = MOONLET_ERR_INVALID_PARAMS;
    if (!rc && !(d->paths[i].alloc = moonlet_alloc_create(cap / DISK_UNIT)))
        rc = MOONLET_ERR_INTERNAL_ERROR;
    if (rc) {
        if (rc == MOONLET_ERR_INVALID_PARAMS)
            ML_ERR(MOD, "%s: not a regular file or block device of a MiB or more", path);
        close(fd);
        return rc;
    }
    d->paths[i].fd = fd;
    d->paths[i].cap = cap;
    d->st.capacity += cap;
    return MOONLET_OK;
}

/* Lane i: its ring (room for its buffers' I/Os and a sync per path) and
 * its buffers, registered. */
static int lane_init(moonlet_disk *d, disk_lane *l)
{
    pthread_mutex_init(&l->mu, NULL);
    if (!(l->stage = calloc(d->qd, sizeof(*l->stage))) ||
        !(l->free_buf = calloc(d->qd, sizeof(*l->free_buf))) ||
        !(l->io = calloc(d->qd, sizeof(*l->io))))
        return MOONLET_ERR_INTERNAL_ERROR;
    struct iovec *bufs = calloc(d->qd, sizeof(*bufs));
    int rc = bufs ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
    for (unsigned b = 0; !rc && b < d->qd; b++) {
        void *p = NULL;
        if (posix_memalign(&p, MOONLET_DISK_BLOCK, d->io_bytes)) {
            rc = MOONLET_ERR_INTERNAL_ERROR;
            break;
        }
        l->stage[b] = p;
        bufs[b] = (struct iovec){p, d->io_bytes};
        l->free_buf[l->nfree++] = d->qd - 1 - b; /* taken from the top: 0 first */
    }
    if (!rc && io_uring_queue_init(d->qd + MOONLET_DISK_MAX_PATHS, &l->ring, 0) != 0) {
        ML_ERR(MOD, "io_uring cannot start");
        rc = MOONLET_ERR_INTERNAL_ERROR;
    } else if (!rc) {
        l->ring_up = true;
        int e = io_uring_register_buffers(&l->ring, bufs, d->qd);
        if (e) {
            ML_ERR(MOD, "io_uring: cannot register %u staging buffers: %s", d->qd, strerror(-e));
            rc = MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    free(bufs);
    return rc;
}

static void lane_fini(moonlet_disk *d, disk_lane *l)
{
    if (l->ring_up)
        io_uring_queue_exit(&l->ring);
    for (unsigned b = 0; l->stage && b < d->qd; b++)
        free(l->stage[b]);
    free(l->stage);
    free(l->free_buf);
    free(l->io);
    pthread_mutex_destroy(&l->mu);
}

int moonlet_disk_open(const moonlet_disk_opts *o, moonlet_disk **out)
{
    if (!o || !out || !o->paths || !o->npaths || o->npaths > MOONLET_DISK_MAX_PATHS ||
        o->size / o->npaths < DISK_MIB || o->lanes > DISK_LANES_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    for (size_t i = 0; i < o->npaths; i++)
        if (!o->paths[i] || !o->paths[i][0])
            return MOONLET_ERR_INVALID_PARAMS;
    *out = NULL;
    moonlet_disk *d = calloc(1, sizeof(*d));
    if (!d)
        return MOONLET_ERR_INTERNAL_ERROR;
    pthread_mutex_init(&d->meta_mu, NULL);
    pthread_cond_init(&d->unpinned, NULL);
    atomic_init(&d->next_lane, 0);
    atomic_init(&d->io_errors, 0);
    atomic_init(&d->syncs_behind, 0);
    d->qd = o->queue_depth ? o->queue_depth : 32;
    if (d->qd < 2)
        d->qd = 2; /* the rescan keeps a window in buffer 1 */
    d->io_bytes = o->io_bytes ? (size_t)round_up(o->io_bytes, MOONLET_DISK_BLOCK) : DISK_MIB;
    if (d->io_bytes < hdr_len(MOONLET_DISK_MAX_KEY))
        d->io_bytes = (size_t)hdr_len(MOONLET_DISK_MAX_KEY);
    d->nbuckets = 4096;
    int rc = MOONLET_OK;
    if (!(d->table = calloc(d->nbuckets, sizeof(*d->table))))
        rc = MOONLET_ERR_INTERNAL_ERROR;
    unsigned lanes = o->lanes ? o->lanes : 2;
    for (; !rc && d->nlanes < lanes; d->nlanes++)
        if ((rc = lane_init(d, &d->lanes[d->nlanes]))) {
            d->nlanes++; /* lane_fini on what it made */
            break;
        }
    uint64_t share = o->size / o->npaths / DISK_MIB * DISK_MIB;
    for (size_t i = 0; !rc && i < o->npaths; i++) {
        if ((rc = path_open(d, (uint32_t)i, o->paths[i], share)))
            break;
        d->npaths++;
    }
    for (uint32_t i = 0; !rc && i < d->npaths; i++)
        rc = rescan(d, &d->lanes[0], i);
    if (rc) {
        moonlet_disk_close(d);
        return rc;
    }
    if (d->st.scan_kept || d->st.scan_dropped)
        ML_INFO(MOD, "rescanned %u path(s): %llu objects kept, %llu dropped", d->npaths,
                (unsigned long long)d->st.scan_kept, (unsigned long long)d->st.scan_dropped);
    *out = d;
    return MOONLET_OK;
}

void moonlet_disk_close(moonlet_disk *d)
{
    if (!d)
        return;
    for (size_t b = 0; d->table && b < d->nbuckets; b++)
        while (d->table[b]) {
            disk_obj *o = d->table[b];
            d->table[b] = o->next;
            obj_free(o);
        }
    free(d->table);
    for (unsigned i = 0; i < d->nlanes; i++)
        lane_fini(d, &d->lanes[i]);
    for (uint32_t i = 0; i < d->npaths; i++) {
        close(d->paths[i].fd);
        moonlet_alloc_destroy(d->paths[i].alloc);
    }
    pthread_cond_destroy(&d->unpinned);
    pthread_mutex_destroy(&d->meta_mu);
    free(d);
}
