/*
 * client_copy.c - the copying batch calls (moonlet_client_batch_put /
 * moonlet_client_batch_get, include/moonlet/client.h): any caller memory,
 * in scattered ranges, staged through one region per call around the
 * zero-copy batches (batch_put_from / batch_get_into).  When every range
 * lies in registered memory and the backend moves ranges in place (the
 * direct client's batch_put_ranges / batch_get_ranges: one transfer per
 * range, nothing staged), the call goes there instead.
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
 * A call with a range in device (GPU) memory goes to client_gpu.c's staged
 * path instead (moonlet_client_device_put / _get): no memcpy here ever
 * touches device memory.
 *
 * Locks: none of its own; the region is private to the call.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "client_backend.h"
#include "client_gpu.h"

#define COPY_ALIGN 64u /* each key's slot in a region starts on a cache line */
#define COPY_UNSET 1   /* a result the batch call did not set (never a moonlet code) */

/* The source of an empty value (a batch wants a non-NULL pointer). */
static const unsigned char copy_empty[1];

typedef struct {
    void *base; /* NULL: no region (nothing to stage) */
    size_t len;
    bool shared;
    bool kept; /* the client's kept region (moonlet_client_staging) */
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

static int copy_region_alloc(moonlet_client *c, size_t len, copy_region *r)
{
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

static void copy_region_free(moonlet_client *c, void *base, bool shared)
{
    if (shared) {
        moonlet_client_free_shared(c, base);
    } else {
        moonlet_client_unregister_buffer(c, base);
        free(base);
    }
}

/* A region of at least len bytes: the kept one when it is free and large
 * enough, else a new one. */
static int copy_region_begin(moonlet_client *c, size_t len, copy_region *r)
{
    *r = (copy_region){.shared = c->ops->shared_staging};
    if (len == 0)
        return MOONLET_OK;
    moonlet_client_staging *k = &c->staging;
    pthread_mutex_lock(&k->mu);
    if (k->base && !k->busy && k->len >= len) {
        k->busy = true;
        *r = (copy_region){.base = k->base, .len = k->len, .shared = r->shared, .kept = true};
    }
    pthread_mutex_unlock(&k->mu);
    if (r->kept)
        return MOONLET_OK;
    r->len = len;
    return copy_region_alloc(c, len, r);
}

/* Gives the region back: the kept one becomes free again; a new one is kept
 * instead of a smaller free kept one when it is not over the limit, else
 * released. */
static void copy_region_end(moonlet_client *c, copy_region *r)
{
    if (!r->base)
        return;
    moonlet_client_staging *k = &c->staging;
    void *drop = r->base;
    pthread_mutex_lock(&k->mu);
    if (r->kept) {
        k->busy = false;
        drop = NULL;
    } else if (r->len <= MOONLET_CLIENT_KEEP_STAGING && !k->busy && (!k->base || k->len < r->len)) {
        drop = k->base; /* the smaller one goes */
        k->base = r->base;
        k->len = r->len;
    }
    pthread_mutex_unlock(&k->mu);
    if (drop)
        copy_region_free(c, drop, r->shared);
    r->base = NULL;
}

void moonlet_client_staging_release(moonlet_client *c)
{
    moonlet_client_staging *k = &c->staging;
    pthread_mutex_lock(&k->mu);
    void *base = k->busy ? NULL : k->base; /* a call still using it: a bug of the caller's */
    k->base = NULL;
    k->len = 0;
    pthread_mutex_unlock(&k->mu);
    if (base)
        copy_region_free(c, base, c->ops->shared_staging);
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
 * takes its region, unless `in_place` (the backend's ranged batch) did the
 * whole call: then *done and its return.  Every results[i] (when results is
 * not NULL) becomes COPY_UNSET, or the code of a call that fails here as a
 * whole. */
typedef int (*copy_in_place)(moonlet_client *c, const size_t *lens, void *arg);

static int copy_begin(moonlet_client *c, const char *const *keys, size_t n,
                      const struct iovec *iov, const size_t *iovcnt, int32_t *results,
                      size_t *lens, copy_region *r, copy_in_place in_place, void *arg,
                      bool *done)
{
    size_t total = 0;
    r->base = NULL;
    *done = false;
    int rc = lens ? copy_plan(keys, n, iov, iovcnt, results, lens, &total)
                  : MOONLET_ERR_INTERNAL_ERROR;
    if (rc == MOONLET_OK && in_place) {
        rc = in_place(c, lens, arg);
        if (rc != MOONLET_CLIENT_STAGE) {
            *done = true;
            return rc;
        }
        rc = MOONLET_OK;
    }
    if (rc == MOONLET_OK)
        rc = copy_region_begin(c, total, r);
    for (size_t i = 0; results && i < n; i++)
        results[i] = rc ? rc : COPY_UNSET;
    return rc;
}

/* The call's arguments, for the backend's ranged batches. */
typedef struct copy_call {
    const char *const *keys;
    size_t n;
    const struct iovec *iov;
    const size_t *iovcnt;
    const moonlet_put_options *opt;
    const char *tenant;
    size_t *sizes;
    int32_t *results;
} copy_call;

static int put_in_place(moonlet_client *c, const size_t *lens, void *arg)
{
    const copy_call *k = arg;
    return moonlet_client_put_ranges(c, k->keys, k->n, k->iov, k->iovcnt, lens, k->opt,
                                     k->results);
}

static int get_in_place(moonlet_client *c, const size_t *caps, void *arg)
{
    const copy_call *k = arg;
    return moonlet_client_get_ranges(c, k->keys, k->n, k->iov, k->iovcnt, caps, k->tenant,
                                     k->sizes, k->results);
}

/* Whether a range of the call is device memory to stage (client_gpu.c);
 * false at once for a client that never registered device memory. */
static bool copy_on_device(moonlet_client *c, size_t n, const struct iovec *iov,
                           const size_t *iovcnt)
{
    if (!atomic_load_explicit(&c->gpu, memory_order_relaxed) || !iov || !iovcnt)
        return false;
    size_t niov = 0;
    for (size_t i = 0; i < n; i++) {
        if (iovcnt[i] > SIZE_MAX - niov)
            return false; /* copy_plan refuses it */
        niov += iovcnt[i];
    }
    return moonlet_client_gpu_ranges(c, iov, niov);
}

int moonlet_client_batch_put(moonlet_client *c, const char *const *keys, size_t n,
                             const struct iovec *iov, const size_t *iovcnt,
                             const moonlet_put_options *opt, int32_t *results)
{
    if (!c)
        return MOONLET_ERR_INVALID_PARAMS;
    if (copy_on_device(c, n, iov, iovcnt))
        return moonlet_client_device_put(c, keys, n, iov, iovcnt, opt, results);
    size_t *lens = calloc(n ? n : 1, sizeof(*lens));
    const void **bufs = calloc(n ? n : 1, sizeof(*bufs));
    copy_region r;
    copy_call call = {.keys = keys, .n = n, .iov = iov, .iovcnt = iovcnt, .opt = opt,
                      .results = results};
    bool in_place;
    int rc = copy_begin(c, keys, n, iov, iovcnt, results, bufs ? lens : NULL, &r, put_in_place,
                        &call, &in_place);
    if (rc == MOONLET_OK && !in_place) {
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
    if (copy_on_device(c, n, iov, iovcnt))
        return moonlet_client_device_get(c, keys, n, iov, iovcnt, tenant, sizes, results);
    size_t *caps = calloc(n ? n : 1, sizeof(*caps));
    void **bufs = calloc(n ? n : 1, sizeof(*bufs));
    copy_region r;
    copy_call call = {.keys = keys, .n = n, .iov = iov, .iovcnt = iovcnt, .tenant = tenant,
                      .sizes = sizes, .results = results};
    bool in_place;
    int rc = copy_begin(c, keys, n, iov, iovcnt, results, bufs ? caps : NULL, &r, get_in_place,
                        &call, &in_place);
    if (rc == MOONLET_OK && !in_place) {
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
