/*
 * disk_tier.c - a store node's disk tier (disk_tier.h).
 *
 * On disk, an object at offset O of a path is:
 *   [O, O + H)          its header: struct disk_hdr, then the key's bytes,
 *                       zero padding to a whole number of blocks (H);
 *   [O + H, O + H + S') its bytes, zero padding to whole blocks (S').
 * The header's hash covers the header (but the hash) and the key; the
 * checksum is the bytes' XXH3-64, the one a put records end to end.
 *
 * Every I/O goes through the ring with O_DIRECT, from or into one of the
 * staging buffers (aligned, registered once: WRITE_FIXED / READ_FIXED), up
 * to queue_depth in flight.  A write puts the bytes, then the header, then
 * a data sync (an object that fits one buffer, header and bytes in one
 * I/O: a torn one fails its checksum at the rescan); a remove zeroes the header and syncs before it frees the
 * space, so a rescan never finds a header whose space was given to another
 * object (and if it did, the bytes would not match its checksum).
 *
 * Locks: ring_mu (the ring, the staging buffers, the allocators, the table,
 * the counters): every entry point takes it for its whole call.
 */
#include "disk_tier.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <liburing.h>
#include <pthread.h>
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
#define DISK_VERSION 1u
#define DISK_MIB ((uint64_t)1 << 20)
/* The allocator works in 64-byte units (alloc.h); one unit here is a 64th
 * of a block, so that its alignment is a block's. */
#define DISK_UNIT (MOONLET_DISK_BLOCK / MOONLET_ALLOC_ALIGN)

struct disk_hdr {
    char magic[8];
    uint32_t version;
    uint32_t key_len;
    uint64_t size;
    uint64_t checksum;
    uint64_t seq;
    uint64_t hash; /* XXH3-64 of the fields above and the key */
};

typedef struct disk_obj {
    moonlet_disk_loc loc;
    uint64_t checksum;
    char *key;
    struct disk_obj *next; /* the table's chain */
} disk_obj;

typedef struct disk_path {
    int fd;
    uint64_t cap; /* bytes of the tier on it */
    moonlet_alloc *alloc;
} disk_path;

struct moonlet_disk {
    pthread_mutex_t ring_mu;
    struct io_uring ring;
    bool ring_up;
    unsigned qd;
    size_t io_bytes;
    unsigned char **stage; /* qd buffers of io_bytes */
    disk_path paths[MOONLET_DISK_MAX_PATHS];
    uint32_t npaths, next_path;
    disk_obj **table;
    size_t nbuckets;
    uint64_t seq;
    moonlet_disk_stats st;
};

static uint64_t round_up(uint64_t n, uint64_t a)
{
    return (n + a - 1) / a * a;
}

static uint64_t hdr_len(uint32_t key_len)
{
    return round_up(sizeof(struct disk_hdr) + key_len, MOONLET_DISK_BLOCK);
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

static disk_obj *obj_add(moonlet_disk *d, const moonlet_disk_loc *loc, const char *key,
                         uint32_t key_len, uint64_t checksum)
{
    disk_obj *o = calloc(1, sizeof(*o));
    if (!o || !(o->key = malloc(key_len + 1))) {
        free(o);
        return NULL;
    }
    memcpy(o->key, key, key_len);
    o->key[key_len] = 0;
    o->loc = *loc;
    o->checksum = checksum;
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

/* ---- the ring --------------------------------------------------------------------------- */

/* Submits the prepared SQEs and waits for `n` completions; each must have
 * moved the bytes its user data says.  INTERNAL_ERROR (counted, logged)
 * when one did not; all n are reaped either way. */
static int io_wave(moonlet_disk *d, unsigned n)
{
    int rc = io_uring_submit(&d->ring) == (int)n ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
    for (unsigned i = 0; i < n; i++) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&d->ring, &cqe))
            return MOONLET_ERR_INTERNAL_ERROR;
        int res = cqe->res;
        uint64_t want = io_uring_cqe_get_data64(cqe);
        io_uring_cqe_seen(&d->ring, cqe);
        if (res < 0 || (uint64_t)res != want) {
            d->st.io_errors++;
            ML_ERR(MOD, "I/O of %llu bytes: %s", (unsigned long long)want,
                   res < 0 ? strerror(-res) : "short");
            rc = MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    return rc;
}

/* Prepares one I/O of buffer b (len bytes, a multiple of a block). */
static bool io_prep(moonlet_disk *d, bool write, uint32_t p, uint64_t off, unsigned b, size_t len)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
    if (!sqe)
        return false;
    if (write)
        io_uring_prep_write_fixed(sqe, d->paths[p].fd, d->stage[b], (unsigned)len, off, (int)b);
    else
        io_uring_prep_read_fixed(sqe, d->paths[p].fd, d->stage[b], (unsigned)len, off, (int)b);
    io_uring_sqe_set_data64(sqe, len);
    return true;
}

static int io_sync(moonlet_disk *d, uint32_t p)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&d->ring);
    if (!sqe)
        return MOONLET_ERR_INTERNAL_ERROR;
    io_uring_prep_fsync(sqe, d->paths[p].fd, IORING_FSYNC_DATASYNC);
    if (io_uring_submit(&d->ring) != 1)
        return MOONLET_ERR_INTERNAL_ERROR;
    struct io_uring_cqe *cqe;
    if (io_uring_wait_cqe(&d->ring, &cqe))
        return MOONLET_ERR_INTERNAL_ERROR;
    int res = cqe->res;
    io_uring_cqe_seen(&d->ring, cqe);
    if (res < 0) {
        d->st.io_errors++;
        ML_ERR(MOD, "data sync of path %u: %s", p, strerror(-res));
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    return MOONLET_OK;
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

/* One I/O of buffer b, waited for. */
static int io_one(moonlet_disk *d, bool write, uint32_t p, uint64_t off, unsigned b, size_t len)
{
    return io_prep(d, write, p, off, b, len) ? io_wave(d, 1) : MOONLET_ERR_INTERNAL_ERROR;
}

/* The object's bytes from the cursor's ranges to [base, base + size) of
 * path p, in waves of up to queue_depth I/Os (one staging buffer each). */
static int write_bytes(moonlet_disk *d, uint32_t p, uint64_t base, iov_cursor *c, uint64_t size)
{
    int rc = MOONLET_OK;
    for (uint64_t done = 0; done < size && !rc;) {
        unsigned n = 0;
        for (; n < d->qd && done < size; n++) {
            size_t len = size - done < d->io_bytes ? (size_t)(size - done) : d->io_bytes;
            size_t padded = (size_t)round_up(len, MOONLET_DISK_BLOCK);
            iov_take(c, d->stage[n], len);
            memset(d->stage[n] + len, 0, padded - len);
            if (!io_prep(d, true, p, base + done, n, padded)) {
                rc = MOONLET_ERR_INTERNAL_ERROR;
                break;
            }
            done += len;
        }
        int w = io_wave(d, n);
        rc = rc ? rc : w;
    }
    return rc;
}

/* The object's bytes from [base, base + size) of path p into dst (NULL:
 * hashed only), in waves; *hash gets their XXH3-64. */
static int read_bytes(moonlet_disk *d, uint32_t p, uint64_t base, uint64_t size,
                      unsigned char *dst, uint64_t *hash)
{
    XXH3_state_t s;
    XXH3_64bits_reset(&s);
    int rc = MOONLET_OK;
    for (uint64_t done = 0; done < size && !rc;) {
        unsigned n = 0;
        uint64_t at = done;
        for (; n < d->qd && at < size; n++) {
            size_t len = size - at < d->io_bytes ? (size_t)(size - at) : d->io_bytes;
            if (!io_prep(d, false, p, base + at, n, (size_t)round_up(len, MOONLET_DISK_BLOCK))) {
                rc = MOONLET_ERR_INTERNAL_ERROR;
                break;
            }
            at += len;
        }
        int w = io_wave(d, n);
        if ((rc = rc ? rc : w))
            break;
        for (unsigned b = 0; b < n; b++) {
            size_t len = size - done < d->io_bytes ? (size_t)(size - done) : d->io_bytes;
            XXH3_64bits_update(&s, d->stage[b], len);
            if (dst)
                memcpy(dst + done, d->stage[b], len);
            done += len;
        }
    }
    *hash = XXH3_64bits_digest(&s);
    return rc;
}

/* ---- headers ---------------------------------------------------------------------------- */

/* Fills staging buffer 0 with the header of (key, size, checksum, seq);
 * returns its length. */
static uint64_t hdr_fill(moonlet_disk *d, const char *key, uint32_t key_len, uint64_t size,
                         uint64_t checksum, uint64_t seq)
{
    uint64_t len = hdr_len(key_len);
    memset(d->stage[0], 0, len);
    struct disk_hdr h = {.version = DISK_VERSION, .key_len = key_len, .size = size,
                         .checksum = checksum, .seq = seq};
    memcpy(h.magic, DISK_MAGIC, sizeof(h.magic));
    h.hash = hdr_hash(&h, key);
    memcpy(d->stage[0], &h, sizeof(h));
    memcpy(d->stage[0] + sizeof(h), key, key_len);
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

/* ---- the calls ---------------------------------------------------------------------------- */

static uint64_t iov_size(const struct iovec *iov, int iovcnt)
{
    uint64_t size = 0;
    for (int i = 0; i < iovcnt; i++)
        size += iov[i].iov_len;
    return size;
}

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

static void space_give(moonlet_disk *d, uint32_t p, uint64_t offset, uint64_t total)
{
    if (moonlet_alloc_release(d->paths[p].alloc, offset / DISK_UNIT, total / DISK_UNIT) ==
        MOONLET_OK)
        d->st.used -= total;
}

static uint64_t obj_total(uint32_t key_len, uint64_t size)
{
    return hdr_len(key_len) + round_up(size, MOONLET_DISK_BLOCK);
}

int moonlet_disk_write(moonlet_disk *d, const char *key, const struct iovec *iov, int iovcnt,
                       uint64_t checksum, moonlet_disk_loc *loc)
{
    size_t key_len = key ? strlen(key) : 0;
    if (!d || !loc || !key_len || key_len > MOONLET_DISK_MAX_KEY || iovcnt < 0 ||
        (iovcnt && !iov))
        return MOONLET_ERR_INVALID_PARAMS;
    uint64_t size = iov_size(iov, iovcnt);
    uint64_t total = obj_total((uint32_t)key_len, size);
    pthread_mutex_lock(&d->ring_mu);
    int rc = space_take(d, total, loc);
    if (!rc) {
        loc->size = size;
        uint64_t h = hdr_len((uint32_t)key_len);
        /* the bytes are hashed as they are staged: a checksum that does not
         * match them is refused before any header names them */
        iov_cursor c = {.iov = iov, .left = iovcnt};
        XXH3_64bits_reset(&c.hash);
        if (total <= d->io_bytes) { /* header and bytes in one I/O */
            hdr_fill(d, key, (uint32_t)key_len, size, checksum, ++d->seq);
            iov_take(&c, d->stage[0] + h, (size_t)size);
            memset(d->stage[0] + h + size, 0, (size_t)(total - h - size));
            rc = XXH3_64bits_digest(&c.hash) != checksum
                     ? MOONLET_ERR_INVALID_PARAMS
                     : io_one(d, true, loc->path, loc->offset, 0, (size_t)total);
        } else {
            rc = write_bytes(d, loc->path, loc->offset + h, &c, size);
            if (!rc && XXH3_64bits_digest(&c.hash) != checksum)
                rc = MOONLET_ERR_INVALID_PARAMS; /* bytes without a header: free space */
            if (!rc) {
                hdr_fill(d, key, (uint32_t)key_len, size, checksum, ++d->seq);
                rc = io_one(d, true, loc->path, loc->offset, 0, (size_t)h);
            }
        }
        if (!rc)
            rc = io_sync(d, loc->path);
        if (!rc && !obj_add(d, loc, key, (uint32_t)key_len, checksum))
            rc = MOONLET_ERR_INTERNAL_ERROR;
        if (rc) {
            space_give(d, loc->path, loc->offset, total);
        } else {
            d->st.writes++;
            d->st.write_bytes += size;
        }
    }
    pthread_mutex_unlock(&d->ring_mu);
    return rc;
}

int moonlet_disk_read(moonlet_disk *d, const moonlet_disk_loc *loc, const char *key, void *buf,
                      size_t cap, size_t *len)
{
    if (!d || !loc || (!buf && loc->size) || !len)
        return MOONLET_ERR_INVALID_PARAMS;
    *len = 0;
    pthread_mutex_lock(&d->ring_mu);
    disk_obj *o = loc->path < d->npaths ? *obj_slot(d, loc->path, loc->offset) : NULL;
    int rc = MOONLET_OK;
    if (!o || o->loc.size != loc->size || (key && strcmp(key, o->key) != 0))
        rc = MOONLET_ERR_INVALID_PARAMS;
    else if (cap < loc->size)
        rc = MOONLET_ERR_BUFFER_OVERFLOW;
    uint32_t key_len = o ? (uint32_t)strlen(o->key) : 0;
    uint64_t h = hdr_len(key_len), total = obj_total(key_len, loc->size);
    bool one = total <= d->io_bytes; /* header and bytes in one I/O */
    if (!rc)
        rc = io_one(d, false, loc->path, loc->offset, 0, (size_t)(one ? total : h));
    struct disk_hdr hd;
    if (!rc && (!hdr_parse(d->stage[0], (size_t)h, &hd) || hd.key_len != key_len ||
                memcmp(d->stage[0] + sizeof(hd), o->key, key_len) != 0 ||
                hd.size != loc->size || hd.checksum != o->checksum))
        rc = MOONLET_ERR_INVALID_READ;
    uint64_t got = 0;
    if (!rc && one) {
        got = XXH3_64bits(d->stage[0] + h, (size_t)loc->size);
        if (got == o->checksum)
            memcpy(buf, d->stage[0] + h, (size_t)loc->size);
    } else if (!rc) {
        rc = read_bytes(d, loc->path, loc->offset + h, loc->size, buf, &got);
    }
    if (!rc && got != o->checksum)
        rc = MOONLET_ERR_INVALID_READ;
    if (rc == MOONLET_ERR_INVALID_READ) {
        d->st.checksum_errors++;
        ML_WARN(MOD, "object at %llu on path %u does not verify: not returned",
                (unsigned long long)loc->offset, loc->path);
    }
    if (!rc) {
        *len = (size_t)loc->size;
        d->st.reads++;
        d->st.read_bytes += loc->size;
    }
    pthread_mutex_unlock(&d->ring_mu);
    return rc;
}

int moonlet_disk_remove(moonlet_disk *d, const moonlet_disk_loc *loc)
{
    if (!d || !loc)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_mutex_lock(&d->ring_mu);
    disk_obj **slot = loc->path < d->npaths ? obj_slot(d, loc->path, loc->offset) : NULL;
    disk_obj *o = slot ? *slot : NULL;
    int rc = o && o->loc.size == loc->size ? MOONLET_OK : MOONLET_ERR_INVALID_PARAMS;
    if (!rc) {
        uint32_t key_len = (uint32_t)strlen(o->key);
        uint64_t h = hdr_len(key_len);
        memset(d->stage[0], 0, h);
        rc = io_one(d, true, loc->path, loc->offset, 0, (size_t)h);
        if (!rc)
            rc = io_sync(d, loc->path);
        if (!rc) { /* the header is gone for good: the space may go to another */
            *slot = o->next;
            space_give(d, loc->path, loc->offset, obj_total(key_len, loc->size));
            obj_free(o);
            d->st.objects--;
            d->st.removes++;
        }
    }
    pthread_mutex_unlock(&d->ring_mu);
    return rc;
}

void moonlet_disk_scan(moonlet_disk *d,
                       void (*fn)(void *arg, const char *key, const moonlet_disk_loc *loc,
                                  uint64_t checksum),
                       void *arg)
{
    if (!d || !fn)
        return;
    pthread_mutex_lock(&d->ring_mu);
    for (size_t b = 0; b < d->nbuckets; b++)
        for (disk_obj *o = d->table[b]; o; o = o->next)
            fn(arg, o->key, &o->loc, o->checksum);
    pthread_mutex_unlock(&d->ring_mu);
}

void moonlet_disk_get_stats(moonlet_disk *d, moonlet_disk_stats *out)
{
    pthread_mutex_lock(&d->ring_mu);
    *out = d->st;
    pthread_mutex_unlock(&d->ring_mu);
}

/* ---- open: the files, the ring, the rescan -------------------------------------------------- */

/* The object whose header starts at `pos` of path p, if its header and
 * bytes verify: kept (its space reserved) and *total set; else false. */
static bool rescan_object(moonlet_disk *d, uint32_t p, uint64_t pos, uint64_t *total)
{
    disk_path *dp = &d->paths[p];
    /* the header and the key: at most hdr_len(MAX_KEY) bytes */
    uint64_t hmax = hdr_len(MOONLET_DISK_MAX_KEY);
    size_t want = (size_t)(dp->cap - pos < hmax ? dp->cap - pos : hmax);
    if (io_one(d, false, p, pos, 0, want))
        return false;
    struct disk_hdr h;
    if (!hdr_parse(d->stage[0], want, &h))
        return false;
    uint64_t t = obj_total(h.key_len, h.size);
    if (h.size > dp->cap || t > dp->cap - pos)
        return false;
    char *key = malloc(h.key_len + 1);
    if (!key)
        return false;
    memcpy(key, d->stage[0] + sizeof(h), h.key_len);
    key[h.key_len] = 0;
    uint64_t got = 0;
    bool ok = read_bytes(d, p, pos + hdr_len(h.key_len), h.size, NULL, &got) == MOONLET_OK &&
              got == h.checksum &&
              moonlet_alloc_reserve_at(dp->alloc, pos / DISK_UNIT, t / DISK_UNIT) == MOONLET_OK;
    if (ok) {
        moonlet_disk_loc loc = {.path = p, .offset = pos, .size = h.size};
        ok = obj_add(d, &loc, key, h.key_len, h.checksum) != NULL;
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

/* Walks path p window by window; a block that starts with the magic is a
 * candidate header (rescan_object).  A header whose bytes do not verify is
 * dropped and the walk goes on from the next block. */
static int rescan(moonlet_disk *d, uint32_t p)
{
    disk_path *dp = &d->paths[p];
    for (uint64_t pos = 0; pos < dp->cap;) {
        size_t n = (size_t)(dp->cap - pos < d->io_bytes ? dp->cap - pos : d->io_bytes);
        if (io_one(d, false, p, pos, 1, n))
            return MOONLET_ERR_INTERNAL_ERROR;
        uint64_t next = pos + n;
        for (size_t off = 0; off < n; off += MOONLET_DISK_BLOCK) {
            if (memcmp(d->stage[1] + off, DISK_MAGIC, 8) != 0)
                continue;
            uint64_t total = 0;
            if (rescan_object(d, p, pos + off, &total)) {
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

int moonlet_disk_open(const moonlet_disk_opts *o, moonlet_disk **out)
{
    if (!o || !out || !o->paths || !o->npaths || o->npaths > MOONLET_DISK_MAX_PATHS ||
        o->size / o->npaths < DISK_MIB)
        return MOONLET_ERR_INVALID_PARAMS;
    for (size_t i = 0; i < o->npaths; i++)
        if (!o->paths[i] || !o->paths[i][0])
            return MOONLET_ERR_INVALID_PARAMS;
    *out = NULL;
    moonlet_disk *d = calloc(1, sizeof(*d));
    if (!d)
        return MOONLET_ERR_INTERNAL_ERROR;
    pthread_mutex_init(&d->ring_mu, NULL);
    d->qd = o->queue_depth ? o->queue_depth : 32;
    if (d->qd < 2)
        d->qd = 2; /* the rescan keeps a window in buffer 1 */
    d->io_bytes = o->io_bytes ? (size_t)round_up(o->io_bytes, MOONLET_DISK_BLOCK) : DISK_MIB;
    if (d->io_bytes < hdr_len(MOONLET_DISK_MAX_KEY))
        d->io_bytes = (size_t)hdr_len(MOONLET_DISK_MAX_KEY);
    d->nbuckets = 4096;
    int rc = MOONLET_OK;
    if (!(d->table = calloc(d->nbuckets, sizeof(*d->table))) ||
        !(d->stage = calloc(d->qd, sizeof(*d->stage))))
        rc = MOONLET_ERR_INTERNAL_ERROR;
    struct iovec *bufs = rc ? NULL : calloc(d->qd, sizeof(*bufs));
    for (unsigned b = 0; !rc && b < d->qd; b++) {
        void *p = NULL;
        if (!bufs || posix_memalign(&p, MOONLET_DISK_BLOCK, d->io_bytes)) {
            rc = MOONLET_ERR_INTERNAL_ERROR;
            break;
        }
        d->stage[b] = p;
        bufs[b] = (struct iovec){p, d->io_bytes};
    }
    if (!rc && io_uring_queue_init(d->qd, &d->ring, 0) != 0) {
        ML_ERR(MOD, "io_uring cannot start");
        rc = MOONLET_ERR_INTERNAL_ERROR;
    } else if (!rc) {
        d->ring_up = true;
        int e = io_uring_register_buffers(&d->ring, bufs, d->qd);
        if (e) {
            ML_ERR(MOD, "io_uring: cannot register %u staging buffers: %s", d->qd, strerror(-e));
            rc = MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    free(bufs);
    uint64_t share = o->size / o->npaths / DISK_MIB * DISK_MIB;
    for (size_t i = 0; !rc && i < o->npaths; i++) {
        if ((rc = path_open(d, (uint32_t)i, o->paths[i], share)))
            break;
        d->npaths++;
    }
    for (uint32_t i = 0; !rc && i < d->npaths; i++)
        rc = rescan(d, i);
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
    if (d->ring_up)
        io_uring_queue_exit(&d->ring);
    for (unsigned b = 0; d->stage && b < d->qd; b++)
        free(d->stage[b]);
    free(d->stage);
    for (uint32_t i = 0; i < d->npaths; i++) {
        close(d->paths[i].fd);
        moonlet_alloc_destroy(d->paths[i].alloc);
    }
    pthread_mutex_destroy(&d->ring_mu);
    free(d);
}
