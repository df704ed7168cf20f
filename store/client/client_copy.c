/*
 * client_copy.c - the copying batch calls (moonlet_client_batch_put /
 * moonlet_client_batch_get, include/moonlet/client.h): any caller memory,
 * in scattered ranges, staged through one region per call around the
 * zero-copy batches (batch_put_from / batch_get_into).
 *
 * The region comes from the client's backend (client_backend.h,
 * shared_staging): on a DummyClient, memory of alloc_shared, which the
 * RealClient reads and writes in place, so the bytes are copied once on this
 * side, as put and get copy them; on a direct client, malloc'd memory
 * registered for the call (as put stages through a bounce buffer on RDMA),
 * without alloc_shared's zeroing pass.  Each key's slot starts on a cache
 * line; every key's transfer goes in one transport batch (one request to a
 * RealClient).  The Python binding's batch_put, put_parts, batch_get and
 * Mooncake's multi-buffer batches are these two calls.
 *
 * Locks: none of its own; the region is private to the call.
 */
#include <stdlib.h>
#include <string.h>

#include "client_backend.h"

#define COPY_ALIGN 64u /* each key's slot in a region starts on a cache line */
#define COPY_UNSET 1   /* a result the batch call did not set (never a moonlet code) */

/* The source of an empty value (a batch wants a non-NULL pointer). */
static const unsigned char copy_empty[1];

typedef struct {
    void *base; /* NULL: no region (nothing to stage) */
    bool shared;
} copy_region;

/* Adds a slot of len bytes (rounded up to COPY_ALIGN) to *total; -1 on overflow. */
static int copy_add_slot(size_t *total, size_t len)
{
    size_t slot = len;
    if (slot % COPY_ALIGN) {
        if (slot > SIZE_MAX - COPY_ALIGN)
            return -1;
        slot += COPY_ALIGN - slot % COPY_ALIGN;
    }
    if (slot > SIZE_MAX - *total)
        return -1;
    *total += slot;
    return 0;
}

static int copy_region_begin(moonlet_client *c, size_t len, copy_region *r)
{
    r->base = NULL;
    r->shared = c->ops->shared_staging;
    if (len == 0)
        return MOONLET_OK;
    if (r->shared)
        return moonlet_client_alloc_shared(c, len, &r->base);
    void *p = malloc(len);
    if (!p)
        return MOONLET_ERR_INTERNAL_ERROR;
    int rc = moonlet_client_register_buffer(c, p, len);
    if (rc) {
        free(p);
        return rc;
    }
    r->base = p;
    return MOONLET_OK;
}

static void copy_region_end(moonlet_client *c, copy_region *r)
{
    if (!r->base)
        return;
    if (r->shared) {
        moonlet_client_free_shared(c, r->base);
    } else {
        moonlet_client_unregister_buffer(c, r->base);
        free(r->base);
    }
    r->base = NULL;
}

/* Each key's total length (lens[i]) and the region's size (*total), after
 * checking the arrays; INVALID_PARAMS for NULL arrays, a NULL base of a
 * nonzero range or sizes that overflow. */
static int copy_plan(const char *const *keys, size_t n, const struct iovec *iov,
                     const size_t *iovcnt, const void *out, size_t *lens, size_t *total)
{
    if (n && (!keys || !iovcnt || !out))
        return MOONLET_ERR_INVALID_PARAMS;
    *total = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (!keys[i] || (iovcnt[i] && !iov) || iovcnt[i] > SIZE_MAX - at)
            return MOONLET_ERR_INVALID_PARAMS;
        size_t len = 0;
        for (size_t p = at; p < at + iovcnt[i]; p++) {
            if ((!iov[p].iov_base && iov[p].iov_len) || iov[p].iov_len > SIZE_MAX - len)
                return MOONLET_ERR_INVALID_PARAMS;
            len += iov[p].iov_len;
        }
        at += iovcnt[i];
        lens[i] = len;
        if (copy_add_slot(total, len))
            return MOONLET_ERR_INVALID_PARAMS;
    }
    return MOONLET_OK;
}

/* Per-key results the batch left unset (it failed as a whole) get its code. */
static void copy_fill_unset(int32_t *results, size_t n, int rc)
{
    for (size_t i = 0; i < n; i++)
        if (results[i] == COPY_UNSET)
            results[i] = rc ? rc : MOONLET_ERR_INTERNAL_ERROR;
}

/* Plans the call (lens[i]: key i's bytes; NULL lens: out of memory) and
 * takes its region.  Every results[i] (when results is not NULL) becomes
 * COPY_UNSET, or the code of a call that fails here as a whole. */
static int copy_begin(moonlet_client *c, const char *const *keys, size_t n,
                      const struct iovec *iov, const size_t *iovcnt, int32_t *results,
                      size_t *lens, copy_region *r)
{
    size_t total = 0;
    r->base = NULL;
    int rc = lens ? copy_plan(keys, n, iov, iovcnt, results, lens, &total)
                  : MOONLET_ERR_INTERNAL_ERROR;
    if (rc == MOONLET_OK)
        rc = copy_region_begin(c, total, r);
    for (size_t i = 0; results && i < n; i++)
        results[i] = rc ? rc : COPY_UNSET;
    return rc;
}

int moonlet_client_batch_put(moonlet_client *c, const char *const *keys, size_t n,
                             const struct iovec *iov, const size_t *iovcnt,
                             const moonlet_put_options *opt, int32_t *results)
{
    if (!c)
        return MOONLET_ERR_INVALID_PARAMS;
    size_t *lens = calloc(n ? n : 1, sizeof(*lens));
    const void **bufs = calloc(n ? n : 1, sizeof(*bufs));
    copy_region r;
    int rc = copy_begin(c, keys, n, iov, iovcnt, results, bufs ? lens : NULL, &r);
    if (rc == MOONLET_OK) {
        size_t off = 0, at = 0;
        for (size_t i = 0; i < n; i++) {
            /* no arithmetic on a NULL region (every value empty) */
            bufs[i] = lens[i] ? (const void *)((unsigned char *)r.base + off) : copy_empty;
            for (size_t p = at, done = 0; p < at + iovcnt[i]; p++) {
                if (!iov[p].iov_len)
                    continue;
                memcpy((unsigned char *)r.base + off + done, iov[p].iov_base, iov[p].iov_len);
                done += iov[p].iov_len;
            }
            at += iovcnt[i];
            copy_add_slot(&off, lens[i]); /* cannot overflow: copy_plan summed the same */
        }
        rc = moonlet_client_batch_put_from(c, keys, n, bufs, lens, opt, results);
        copy_fill_unset(results, n, rc);
        copy_region_end(c, &r);
    }
    free(lens);
    free(bufs);
    return rc;
}

int moonlet_client_batch_get(moonlet_client *c, const char *const *keys, size_t n,
                             const struct iovec *iov, const size_t *iovcnt, const char *tenant,
                             size_t *sizes, int32_t *results)
{
    if (!c || (n && !sizes))
        return MOONLET_ERR_INVALID_PARAMS;
    size_t *caps = calloc(n ? n : 1, sizeof(*caps));
    void **bufs = calloc(n ? n : 1, sizeof(*bufs));
    copy_region r;
    int rc = copy_begin(c, keys, n, iov, iovcnt, results, bufs ? caps : NULL, &r);
    if (rc == MOONLET_OK) {
        size_t off = 0;
        for (size_t i = 0; i < n; i++) {
            sizes[i] = 0;
            bufs[i] = caps[i] ? (unsigned char *)r.base + off : NULL;
            copy_add_slot(&off, caps[i]);
        }
        rc = moonlet_client_batch_get_into(c, keys, n, bufs, caps, tenant, sizes, results);
        copy_fill_unset(results, n, rc);
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            size_t left = results[i] == MOONLET_OK && sizes[i] <= caps[i] ? sizes[i] : 0;
            const unsigned char *src = bufs[i];
            for (size_t p = at; p < at + iovcnt[i] && left; p++) {
                size_t take = iov[p].iov_len < left ? iov[p].iov_len : left;
                memcpy(iov[p].iov_base, src, take);
                src += take;
                left -= take;
            }
            at += iovcnt[i];
        }
        copy_region_end(c, &r);
    }
    free(caps);
    free(bufs);
    return rc;
}
