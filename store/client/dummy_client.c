/*
 * dummy_client.c - the DummyClient backend of moonlet_client: every call is
 * forwarded to the RealClient of the host over its unix-domain socket
 * (protocol: store/client/dummy_proto.h), object bytes go through shared memory.
 *
 * Connections.  The RealClient serves the requests of one connection in
 * order, so a DummyClient keeps a small pool of CHANNELS (up to
 * max_connections), each one connection plus its own staging region; a
 * call takes an idle channel (opening a new one if the pool is not full,
 * else waiting), so calls of different threads run in parallel.  A channel
 * whose connection broke (RealClient gone, timeout, malformed reply) drops
 * it; the next call on it connects again and re-attaches its staging.
 *
 * Regions.  Shared memory is memfd, sealed against shrinking (the
 * RealClient refuses anything else, so a truncation can never fault it),
 * passed over the socket with ATTACH.  Three kinds:
 *  - a channel's staging region (staging_bytes, attached at connect): the
 *    copying calls copy the caller's bytes into it before a put and out of
 *    it after a get;
 *  - a one-off region of exactly the size a larger call needs, attached,
 *    used and detached within that call;
 *  - alloc_shared() memory, attached lazily on each channel the first time
 *    a call uses it, zero-copy: the RealClient reads and writes it directly.
 *    free_shared() detaches it from idle channels at once and from busy
 *    ones when they are next taken.
 * Unused staging costs nothing: memfd pages exist only once written.
 *
 * Trust.  Before a connection carries anything, the server's credentials
 * (SO_PEERCRED) must show root, the expected uid (this process's, or
 * peer_uid) or the expected group (peer_gid): a socket path bound first by
 * another local user gets nothing.  Sizes the RealClient reports are checked
 * against the room the call gave it: a success claiming more is RPC_FAIL and
 * the connection is dropped, so nothing is copied or reported past the room.
 *
 * Results.  A refused request (reply code) and the RealClient's call result
 * (first element of the result) are both returned unchanged.
 *
 * Locks: `mu` guards the channel pool (busy flags, the list), the
 * alloc_shared list and the registered-buffer list; it is never held across
 * a request or a copy.  A channel's connection and attachment list belong to
 * the thread that marked it busy.
 */
#include "dummy_client.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "dummy_proto.h"
#include "log.h"
#include "rpc_client.h"
#include "span.h"
#include "wire.h"

#define MOD "dummy"
#define ITEM_ALIGN 64u   /* batch items copied into one region start on a cache line */
#define GET_TRIES 3      /* a get retried into a larger region when the object grew */

/* Shared memory passed to the RealClient. */
typedef struct dregion {
    uint64_t id;
    int fd; /* -1: none */
    unsigned char *base;
    size_t len;
} dregion;

/* alloc_shared() memory. */
typedef struct dshared {
    dregion r;
    struct dshared *next;
} dshared;

/* register_buffer() memory: copied through staging. */
typedef struct dbuf {
    void *base;
    size_t len;
    struct dbuf *next;
} dbuf;

typedef struct dchan {
    moonlet_rpc_client *rpc; /* NULL: connect at the next use */
    dregion stage;
    uint64_t *att; /* alloc_shared regions attached on this connection */
    size_t natt, catt;
    bool busy;
    struct dchan *next;
} dchan;

struct moonlet_dummy {
    char *path;
    char *tenant; /* NULL: the RealClient's default */
    int timeout_ms;
    size_t stage_len;
    uint32_t max_chans;
    bool creating;     /* inside create (one thread): the first ATTACH sets protocol */
    uid_t peer_uid;    /* who may serve us (besides root): see chan_peer_check */
    bool peer_gid_set;
    gid_t peer_gid;
    char protocol[16]; /* the RealClient's transport; fixed after create */
    atomic_uint_fast64_t next_id;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dchan *chans;
    uint32_t nchans;
    dshared *shared;
    dbuf *bufs;
};

/* ---- regions ------------------------------------------------------------------------ */

static int region_new(moonlet_dummy *d, size_t len, dregion *r)
{
    r->id = atomic_fetch_add(&d->next_id, 1);
    r->len = len ? len : 1;
    r->base = NULL;
    char name[64];
    snprintf(name, sizeof(name), MOONLET_DUMMY_REGION_PREFIX "%ld-%llu", (long)getpid(),
             (unsigned long long)r->id);
    r->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (r->fd < 0 || ftruncate(r->fd, (off_t)r->len) != 0 ||
        fcntl(r->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
        ML_ERR(MOD, "cannot create %zu bytes of shared memory: %s", r->len, strerror(errno));
        goto fail;
    }
    void *p = mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (p == MAP_FAILED) {
        ML_ERR(MOD, "cannot map %zu bytes of shared memory: %s", r->len, strerror(errno));
        goto fail;
    }
    r->base = p;
    return MOONLET_OK;
fail:
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    return MOONLET_ERR_INTERNAL_ERROR;
}

static void region_free(dregion *r)
{
    if (r->fd < 0)
        return;
    munmap(r->base, r->len);
    close(r->fd);
    r->fd = -1;
    r->base = NULL;
}

/* ---- one request on a channel ------------------------------------------------------- */

typedef struct dcall {
    moonlet_reply rep;
    bool have;                  /* rep needs moonlet_reply_destroy */
    const msgpack_object *res;  /* the result array, when the call was made */
} dcall;

static void dcall_end(dcall *k)
{
    if (k->have)
        moonlet_reply_destroy(&k->rep);
    k->have = false;
    k->res = NULL;
}

/* Forgets the channel's connection (the RealClient unmaps its regions). */
static void chan_drop(dchan *ch)
{
    moonlet_rpc_client_close(ch->rpc);
    ch->rpc = NULL;
    ch->natt = 0;
}

/*
 * Sends the request begun on ch->rpc (passing fd when >= 0) and waits.
 * Returns the call's code: a transport error (the connection is dropped),
 * the code of a refused request, or the RealClient's result code.  k->res is
 * the result array whenever the call was made (also with a non-zero code);
 * release with dcall_end() in every case.
 */
static int chan_finish(dchan *ch, int fd, dcall *k)
{
    k->have = false;
    k->res = NULL;
    int rc = fd >= 0 ? moonlet_rpc_client_call_fd(ch->rpc, fd, &k->rep)
                     : moonlet_rpc_client_call(ch->rpc, &k->rep);
    if (rc) {
        chan_drop(ch);
        return rc;
    }
    k->have = true;
    if (k->rep.code)
        return k->rep.code;
    int64_t v;
    if (moonlet_wire_i64(k->rep.result, 0, &v) || v > 0 || v < INT32_MIN) {
        ML_WARN(MOD, "malformed reply from the RealClient; reconnecting");
        dcall_end(k);
        chan_drop(ch);
        return MOONLET_ERR_RPC_FAIL;
    }
    k->res = k->rep.result;
    return (int)v;
}

static msgpack_packer *chan_begin(dchan *ch, uint32_t method, uint32_t nargs)
{
    return moonlet_rpc_client_begin(ch->rpc, method, nargs);
}

/* The tenant argument: the call's, else the DummyClient's; NULL (nil): the
 * RealClient's default. */
static const char *tenant_of(const moonlet_dummy *d, const char *tenant)
{
    return tenant ? tenant : d->tenant;
}

/* Begins a request of `method` with the arguments of `st` (its args struct
 * in dummy_proto.h), packed from the method table: the required arguments
 * and the optional ones up to the last that is set. */
static msgpack_packer *chan_begin_args_(dchan *ch, uint32_t method, const void *st,
                                        size_t st_size)
{
    const moonlet_rpc_args_spec *spec = moonlet_dummy_method(method)->spec;
    if (st_size != spec->size) /* the wrong args struct for the method: a bug here */
        abort();
    uint32_t n = moonlet_rpc_args_count(spec, st);
    msgpack_packer *pk = chan_begin(ch, method, n);
    moonlet_rpc_args_pack(spec, st, n, pk);
    return pk;
}
#define chan_begin_args(ch, method, st) chan_begin_args_(ch, method, st, sizeof(*(st)))

/* ATTACH: maps r on the RealClient's side of this connection.  The one made
 * by create learns the RealClient's protocol. */
static int chan_attach(moonlet_dummy *d, dchan *ch, const dregion *r)
{
    moonlet_dm_attach_args a = {.version = MOONLET_DUMMY_PROTO_VERSION, .region = r->id,
                                .size = r->len};
    chan_begin_args(ch, MOONLET_DM_ATTACH, &a);
    dcall k;
    int rc = chan_finish(ch, r->fd, &k);
    const char *p;
    uint32_t n;
    if (rc == MOONLET_OK && d->creating && moonlet_wire_str(k.res, 1, &p, &n) == 0 && n &&
        n < sizeof(d->protocol)) {
        memcpy(d->protocol, p, n);
        d->protocol[n] = 0;
    }
    dcall_end(&k);
    return rc;
}

static void chan_detach(dchan *ch, uint64_t id)
{
    if (!ch->rpc)
        return;
    moonlet_dm_detach_args a = {.region = id};
    chan_begin_args(ch, MOONLET_DM_DETACH, &a);
    dcall k;
    int rc = chan_finish(ch, -1, &k);
    dcall_end(&k);
    if (rc)
        ML_DEBUG(MOD, "detach of region %llu: %s", (unsigned long long)id, moonlet_strerror(rc));
}

/* The process at the other end must be root, the expected uid or (when set)
 * in the expected group; checked before anything is sent on the connection,
 * so a socket path bound first by another local user receives nothing. */
static int chan_peer_check(const moonlet_dummy *d, int fd)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || len != sizeof(cr)) {
        ML_ERR(MOD, "%s: cannot read the server's credentials: %s", d->path, strerror(errno));
        return MOONLET_ERR_ILLEGAL_CLIENT;
    }
    if (cr.uid == 0 || cr.uid == d->peer_uid || (d->peer_gid_set && cr.gid == d->peer_gid))
        return MOONLET_OK;
    ML_ERR(MOD, "%s is served by pid %d as uid %u gid %u, not the expected owner (uid %u%s): "
           "refusing to send it anything; put the socket in a directory only the service user "
           "can write, or set peer_uid / peer_gid", d->path, (int)cr.pid, (unsigned)cr.uid,
           (unsigned)cr.gid, (unsigned)d->peer_uid, d->peer_gid_set ? " or its gid" : "");
    return MOONLET_ERR_ILLEGAL_CLIENT;
}

static int chan_connect(moonlet_dummy *d, dchan *ch)
{
    moonlet_rpc_client_opts o = {.timeout_ms = d->timeout_ms};
    int rc = moonlet_rpc_client_connect_unix(d->path, &o, &ch->rpc);
    if (rc) {
        ch->rpc = NULL;
        return rc;
    }
    if ((rc = chan_peer_check(d, moonlet_rpc_client_fd(ch->rpc)))) {
        moonlet_rpc_client_close(ch->rpc);
        ch->rpc = NULL;
        return rc;
    }
    ch->natt = 0;
    rc = chan_attach(d, ch, &ch->stage);
    if (rc && ch->rpc)
        chan_drop(ch); /* refused: a connection without staging is of no use */
    return rc;
}

/* Detaches the alloc_shared regions freed since this channel last ran. */
static void chan_prune(moonlet_dummy *d, dchan *ch)
{
    uint64_t stale[16];
    size_t nstale = 0;
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i < ch->natt && nstale < 16;) {
        bool live = false;
        for (dshared *s = d->shared; s && !live; s = s->next)
            live = s->r.id == ch->att[i];
        if (live) {
            i++;
            continue;
        }
        stale[nstale++] = ch->att[i];
        ch->att[i] = ch->att[--ch->natt];
    }
    pthread_mutex_unlock(&d->mu);
    for (size_t i = 0; i < nstale; i++)
        chan_detach(ch, stale[i]);
}

static void chan_free(dchan *ch)
{
    if (ch->rpc)
        moonlet_rpc_client_close(ch->rpc);
    region_free(&ch->stage);
    free(ch->att);
    free(ch);
}

/* Gives a channel back to the next caller. */
static void chan_release(moonlet_dummy *d, dchan *ch)
{
    pthread_mutex_lock(&d->mu);
    ch->busy = false;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* Takes an idle channel (connected first), opens one, or waits. */
static int chan_acquire(moonlet_dummy *d, dchan **out)
{
    int rc = MOONLET_OK;
    dchan *ch = NULL;
    pthread_mutex_lock(&d->mu);
    while (!ch) {
        for (dchan *c = d->chans; c; c = c->next)
            if (!c->busy && (!ch || (c->rpc && !ch->rpc)))
                ch = c;
        if (ch || d->nchans < d->max_chans)
            break;
        pthread_cond_wait(&d->cv, &d->mu);
    }
    if (!ch) {
        ch = calloc(1, sizeof(*ch));
        if (ch)
            rc = region_new(d, d->stage_len, &ch->stage);
        else
            rc = MOONLET_ERR_INTERNAL_ERROR;
        if (rc) {
            free(ch);
            pthread_mutex_unlock(&d->mu);
            return rc;
        }
        ch->next = d->chans;
        d->chans = ch;
        d->nchans++;
    }
    ch->busy = true;
    pthread_mutex_unlock(&d->mu);
    if (!ch->rpc)
        rc = chan_connect(d, ch);
    else
        chan_prune(d, ch);
    if (rc) {
        chan_release(d, ch);
        return rc;
    }
    *out = ch;
    return MOONLET_OK;
}

/* Makes sure alloc_shared region s is attached on this channel. */
static int chan_ensure(moonlet_dummy *d, dchan *ch, const dshared *s)
{
    for (size_t i = 0; i < ch->natt; i++)
        if (ch->att[i] == s->r.id)
            return MOONLET_OK;
    if (ch->natt == ch->catt) {
        size_t cap = ch->catt ? ch->catt * 2 : 8;
        uint64_t *a = realloc(ch->att, cap * sizeof(*a));
        if (!a)
            return MOONLET_ERR_INTERNAL_ERROR;
        ch->att = a;
        ch->catt = cap;
    }
    int rc = chan_attach(d, ch, &s->r);
    if (rc == MOONLET_OK)
        ch->att[ch->natt++] = s->r.id;
    return rc;
}

/* A copy area of `len` bytes for this call: the staging region when it is
 * large enough, else a one-off region (*one) attached for the call. */
static int chan_area(moonlet_dummy *d, dchan *ch, size_t len, dregion *one, const dregion **area)
{
    one->fd = -1;
    if (len <= ch->stage.len) {
        *area = &ch->stage;
        return MOONLET_OK;
    }
    int rc = region_new(d, len, one);
    if (rc)
        return rc;
    rc = chan_attach(d, ch, one);
    if (rc) {
        region_free(one);
        return rc;
    }
    *area = one;
    return MOONLET_OK;
}

/* Ends a one-off region of chan_area(). */
static void chan_area_end(dchan *ch, dregion *one)
{
    if (one->fd < 0)
        return;
    chan_detach(ch, one->id);
    region_free(one);
}

/* ---- where the caller's memory is ------------------------------------------------------- */

/* The alloc_shared region holding [p, p + len), or NULL. */
static dshared *shared_find(moonlet_dummy *d, const void *p, size_t len)
{
    pthread_mutex_lock(&d->mu);
    dshared *s = d->shared;
    while (s && !moonlet_span_within(p, len, s->r.base, s->r.len))
        s = s->next;
    pthread_mutex_unlock(&d->mu);
    return s;
}

/* Whether [p, p + len) lies in one registered buffer or alloc_shared region;
 * len 0 always does (as in the real backend). */
static bool covered(moonlet_dummy *d, const void *p, size_t len)
{
    if (len == 0 || shared_find(d, p, len))
        return true;
    pthread_mutex_lock(&d->mu);
    dbuf *b = d->bufs;
    while (b && !moonlet_span_within(p, len, b->base, b->len))
        b = b->next;
    pthread_mutex_unlock(&d->mu);
    return b != NULL;
}

/* ---- put --------------------------------------------------------------------------------- */

/* A put's options as arguments (Put and BatchPut declare the same ones).
 * The optional ones are packed only when set, so a RealClient from before
 * them serves every other put unchanged: skip_checksum alone, or with the
 * placement options (preferred segment names, hard pin, soft-pin TTL). */
#define PUT_ARGS(a, d, opt)                                                                     \
    do {                                                                                        \
        (a)->tenant = tenant_of(d, (opt) ? (opt)->tenant : NULL);                               \
        if (opt) {                                                                              \
            (a)->replica_num = (opt)->replica_num;                                              \
            (a)->soft_pin = (opt)->soft_pin;                                                    \
            (a)->skip_checksum = (opt)->skip_checksum;                                          \
            if ((opt)->preferred_segments)                                                      \
                (a)->preferred_segments = (moonlet_cstrv){                                      \
                    (opt)->preferred_segments, (uint32_t)(opt)->preferred_segments_count};      \
            (a)->hard_pin = (opt)->hard_pin;                                                    \
            (a)->soft_pin_ttl_ms = (opt)->soft_pin_ttl_ms;                                      \
        }                                                                                       \
    } while (0)

/* PUT or UPSERT of [buf, buf + len): zero-copy from an alloc_shared region
 * when the bytes lie in one, else copied through a copy area. */
static int dummy_put_common(moonlet_dummy *d, uint32_t method, const char *key, const void *buf,
                            size_t len, const moonlet_put_options *opt)
{
    dshared *s = len ? shared_find(d, buf, len) : NULL;
    dchan *ch;
    int rc = chan_acquire(d, &ch);
    if (rc)
        return rc;
    dregion one = {.fd = -1};
    uint64_t region = 0, off = 0;
    if (s) {
        rc = chan_ensure(d, ch, s);
        region = s->r.id;
        off = (uint64_t)((const unsigned char *)buf - s->r.base);
    } else {
        const dregion *area;
        rc = chan_area(d, ch, len, &one, &area);
        if (!rc) {
            if (len)
                memcpy(area->base, buf, len);
            region = area->id;
        }
    }
    if (!rc) {
        moonlet_dm_put_args a = {.key = key, .region = region, .offset = off, .len = len};
        PUT_ARGS(&a, d, opt);
        chan_begin_args(ch, method, &a);
        dcall k;
        rc = chan_finish(ch, -1, &k);
        dcall_end(&k);
    }
    chan_area_end(ch, &one);
    chan_release(d, ch);
    return rc;
}

int moonlet_dummy_put(moonlet_dummy *d, const char *key, const void *buf, size_t len,
                      const moonlet_put_options *opt)
{
    if (!key || (!buf && len))
        return MOONLET_ERR_INVALID_PARAMS;
    return dummy_put_common(d, MOONLET_DM_PUT, key, buf, len, opt);
}

int moonlet_dummy_upsert(moonlet_dummy *d, const char *key, const void *buf, size_t len,
                         const moonlet_put_options *opt)
{
    if (!key || (!buf && len))
        return MOONLET_ERR_INVALID_PARAMS;
    return dummy_put_common(d, MOONLET_DM_UPSERT, key, buf, len, opt);
}

int moonlet_dummy_put_from(moonlet_dummy *d, const char *key, const void *buf, size_t len,
                           const moonlet_put_options *opt)
{
    if (!key || (!buf && len) || !covered(d, buf, len))
        return MOONLET_ERR_INVALID_PARAMS;
    return dummy_put_common(d, MOONLET_DM_PUT, key, buf, len, opt);
}

/* ---- get ---------------------------------------------------------------------------------- */

/* A reply claiming a success larger than the room it was given: the
 * RealClient is broken or hostile.  Nothing is read past the room; the
 * connection is dropped. */
static int bad_size(dchan *ch, const char *call, uint64_t size, uint64_t room)
{
    ML_WARN(MOD, "%s: the RealClient claims %llu bytes in a room of %llu; dropping the connection",
            call, (unsigned long long)size, (unsigned long long)room);
    chan_drop(ch);
    return MOONLET_ERR_RPC_FAIL;
}

/* GET into [region+off, +cap): the call's code; *size gets the object's size
 * when the RealClient learnt it (*have_size). */
static int get_once(moonlet_dummy *d, dchan *ch, const char *key, const char *tenant,
                    uint64_t region, uint64_t off, size_t cap, uint64_t *size, bool *have_size)
{
    moonlet_dm_get_args a = {.tenant = tenant_of(d, tenant), .key = key, .region = region,
                             .offset = off, .cap = cap};
    chan_begin_args(ch, MOONLET_DM_GET, &a);
    dcall k;
    int rc = chan_finish(ch, -1, &k);
    *have_size = k.res && moonlet_wire_u64(k.res, 1, size) == 0;
    dcall_end(&k);
    return rc;
}

/*
 * A get whose bytes land in the caller's memory: zero-copy into an
 * alloc_shared region (`s`), else into the staging region and copied out;
 * an object larger than staging (but within cap) is fetched again into a
 * one-off region of its size.  With alloc_out, the bytes go to malloc'd
 * memory of the object's size instead of buf.
 */
static int dummy_get_common(moonlet_dummy *d, const char *key, void *buf, size_t cap,
                            void **alloc_out, size_t *len, const char *tenant)
{
    dshared *s = !alloc_out && cap ? shared_find(d, buf, cap) : NULL;
    dchan *ch;
    int rc = chan_acquire(d, &ch);
    if (rc)
        return rc;
    uint64_t size = 0;
    bool have = false;
    if (s) {
        rc = chan_ensure(d, ch, s);
        if (!rc)
            rc = get_once(d, ch, key, tenant, s->r.id,
                          (uint64_t)((unsigned char *)buf - s->r.base), cap, &size, &have);
        if (rc == MOONLET_OK && (!have || size > cap))
            rc = bad_size(ch, "get", size, cap);
        if (have && rc != MOONLET_ERR_RPC_FAIL)
            *len = size > SIZE_MAX ? SIZE_MAX : (size_t)size;
        chan_release(d, ch);
        return rc;
    }
    dregion one = {.fd = -1};
    const dregion *area = &ch->stage;
    size_t want = cap < ch->stage.len ? cap : ch->stage.len;
    for (int tries = 0;; tries++) {
        rc = get_once(d, ch, key, tenant, area->id, 0, want, &size, &have);
        /* Success must fit what the RealClient was allowed to write. */
        if (rc == MOONLET_OK && (!have || size > want))
            rc = bad_size(ch, "get", size, want);
        if (rc != MOONLET_ERR_BUFFER_OVERFLOW || !have || size > cap || size <= want ||
            size > MOONLET_DUMMY_MAX_REGION_BYTES || tries + 1 == GET_TRIES)
            break;
        /* larger than the area but within the caller's room: a one-off area */
        chan_area_end(ch, &one);
        want = (size_t)size;
        if ((rc = chan_area(d, ch, want, &one, &area)))
            break;
    }
    if (have && rc != MOONLET_OK && rc != MOONLET_ERR_RPC_FAIL && !alloc_out)
        *len = size > SIZE_MAX ? SIZE_MAX : (size_t)size;
    if (rc == MOONLET_OK) {
        void *dst = buf;
        if (alloc_out && !(dst = *alloc_out = malloc(size ? (size_t)size : 1)))
            rc = MOONLET_ERR_INTERNAL_ERROR;
        if (dst && size)
            memcpy(dst, area->base, (size_t)size);
        if (dst)
            *len = (size_t)size;
    }
    chan_area_end(ch, &one);
    chan_release(d, ch);
    return rc;
}

int moonlet_dummy_get(moonlet_dummy *d, const char *key, void *buf, size_t cap, size_t *len,
                      const char *tenant)
{
    if (!key || !len || (!buf && cap))
        return MOONLET_ERR_INVALID_PARAMS;
    return dummy_get_common(d, key, buf, cap, NULL, len, tenant);
}

int moonlet_dummy_get_into(moonlet_dummy *d, const char *key, void *buf, size_t cap,
                           size_t *len, const char *tenant)
{
    if (!key || !len || (!buf && cap) || !covered(d, buf, cap))
        return MOONLET_ERR_INVALID_PARAMS;
    return dummy_get_common(d, key, buf, cap, NULL, len, tenant);
}

int moonlet_dummy_get_alloc(moonlet_dummy *d, const char *key, void **buf, size_t *len,
                            const char *tenant)
{
    if (!key || !buf || !len)
        return MOONLET_ERR_INVALID_PARAMS;
    *buf = NULL;
    return dummy_get_common(d, key, NULL, SIZE_MAX, buf, len, tenant);
}

/* ---- metadata-only calls -------------------------------------------------------------------- */

/* Reads the second result element of a call into arg; 0 or RPC_FAIL. */
typedef int (*take_fn)(const msgpack_object *res, void *arg);

/* One request of `method` with the arguments of st (its args struct) on a
 * pooled connection; `take` (may be NULL) reads the output on success. */
static int pooled_call_(moonlet_dummy *d, uint32_t method, const void *st, size_t st_size,
                        take_fn take, void *arg)
{
    dchan *ch;
    int rc = chan_acquire(d, &ch);
    if (rc)
        return rc;
    chan_begin_args_(ch, method, st, st_size);
    dcall k;
    rc = chan_finish(ch, -1, &k);
    if (rc == MOONLET_OK && take)
        rc = take(k.res, arg);
    dcall_end(&k);
    chan_release(d, ch);
    return rc;
}
#define pooled_call(d, method, st, take, arg) pooled_call_(d, method, st, sizeof(*(st)), take, arg)

/* A [tenant, key] call (Remove: force too). */
static int key_call(moonlet_dummy *d, uint32_t method, const char *key, const char *tenant,
                    bool force, take_fn take, void *arg)
{
    moonlet_dm_key_args a = {.tenant = tenant_of(d, tenant), .key = key, .force = force};
    return pooled_call(d, method, &a, take, arg);
}

static int take_u64(const msgpack_object *res, void *arg)
{
    return moonlet_wire_u64(res, 1, arg) ? MOONLET_ERR_RPC_FAIL : MOONLET_OK;
}

static int take_bool(const msgpack_object *res, void *arg)
{
    return moonlet_wire_bool(res, 1, arg) ? MOONLET_ERR_RPC_FAIL : MOONLET_OK;
}

/* A malloc'd NUL-terminated copy of a string result. */
static int take_str(const msgpack_object *res, void *arg)
{
    const char *p;
    uint32_t n;
    if (moonlet_wire_str(res, 1, &p, &n) || (n && memchr(p, 0, n)))
        return MOONLET_ERR_RPC_FAIL;
    char *s = strndup(n ? p : "", n); /* no NUL inside: all n bytes */
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    *(char **)arg = s;
    return MOONLET_OK;
}

int moonlet_dummy_get_size(moonlet_dummy *d, const char *key, uint64_t *size, const char *tenant)
{
    if (!key || !size)
        return MOONLET_ERR_INVALID_PARAMS;
    uint64_t v = 0;
    int rc = key_call(d, MOONLET_DM_GET_SIZE, key, tenant, false, take_u64, &v);
    if (rc == MOONLET_OK)
        *size = v;
    return rc;
}

int moonlet_dummy_remove(moonlet_dummy *d, const char *key, const char *tenant)
{
    if (!key)
        return MOONLET_ERR_INVALID_PARAMS;
    return moonlet_dummy_remove_ex(d, key, tenant, false);
}

static int dummy_bool_call(moonlet_dummy *d, uint32_t method, const char *key, bool *yes,
                           const char *tenant)
{
    if (!key || !yes)
        return MOONLET_ERR_INVALID_PARAMS;
    bool v = false;
    int rc = key_call(d, method, key, tenant, false, take_bool, &v);
    if (rc == MOONLET_OK)
        *yes = v;
    return rc;
}

int moonlet_dummy_exist_key(moonlet_dummy *d, const char *key, bool *exists, const char *tenant)
{
    return dummy_bool_call(d, MOONLET_DM_EXIST_KEY, key, exists, tenant);
}

int moonlet_dummy_probe_key(moonlet_dummy *d, const char *key, bool *exists, const char *tenant)
{
    return dummy_bool_call(d, MOONLET_DM_PROBE_KEY, key, exists, tenant);
}

int moonlet_dummy_inspect_key(moonlet_dummy *d, const char *key, const char *tenant,
                              char **json_out)
{
    if (!key || !json_out)
        return MOONLET_ERR_INVALID_PARAMS;
    *json_out = NULL;
    return key_call(d, MOONLET_DM_INSPECT_KEY, key, tenant, false, take_str, json_out);
}

int moonlet_dummy_remove_ex(moonlet_dummy *d, const char *key, const char *tenant, bool force)
{
    if (!key)
        return MOONLET_ERR_INVALID_PARAMS;
    return key_call(d, MOONLET_DM_REMOVE, key, tenant, force, NULL, NULL);
}

int moonlet_dummy_remove_all(moonlet_dummy *d, uint64_t *removed, const char *tenant)
{
    return moonlet_dummy_remove_all_ex(d, removed, tenant, false);
}

/* RemoveAll's count, when the caller wants it and the reply has one (a
 * reply without it is still a success). */
static int take_removed(const msgpack_object *res, void *arg)
{
    uint64_t v;
    if (arg && moonlet_wire_u64(res, 1, &v) == 0)
        *(uint64_t *)arg = v;
    return MOONLET_OK;
}

int moonlet_dummy_remove_all_ex(moonlet_dummy *d, uint64_t *removed, const char *tenant,
                                bool force)
{
    moonlet_dm_remove_all_args a = {.tenant = tenant_of(d, tenant), .force = force};
    return pooled_call(d, MOONLET_DM_REMOVE_ALL, &a, take_removed, removed);
}

/* ---- key batches ------------------------------------------------------------------- */

/* Copies a per-key result array of n ints; false when it is not one. */
static bool unpack_results(const msgpack_object *arr, uint32_t i, size_t n, int32_t *out)
{
    const msgpack_object *a;
    if (moonlet_wire_array(arr, i, &a) || moonlet_wire_len(a) != n)
        return false;
    for (size_t j = 0; j < n; j++) {
        int64_t v;
        if (moonlet_wire_i64(a, (uint32_t)j, &v) || v > 1 || v < INT32_MIN)
            return false;
        out[j] = (int32_t)v;
    }
    return true;
}

/* The per-key results of a key batch. */
struct key_results {
    size_t n;
    int32_t *out;
};

static int take_results(const msgpack_object *res, void *arg)
{
    struct key_results *r = arg;
    return unpack_results(res, 1, r->n, r->out) ? MOONLET_OK : MOONLET_ERR_RPC_FAIL;
}

static int dummy_batch_keys(moonlet_dummy *d, const moonlet_grant_lease_policy *policy,
                            const char *const *keys, size_t n, int32_t *results,
                            const char *tenant)
{
    if (n > UINT32_MAX) /* the rest was checked by client_api.c (keys_ok) */
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_dm_batch_keys_args a = {.tenant = tenant_of(d, tenant),
                                    .keys = {keys, (uint32_t)n}};
    if (policy) {
        a.lease_mode = policy->lease_mode;
        a.candidate_size = policy->candidate_size;
    }
    struct key_results r = {n, results};
    return pooled_call(d, policy ? MOONLET_DM_BATCH_PROBE_KEY : MOONLET_DM_BATCH_EXIST_KEY, &a,
                       take_results, &r);
}

int moonlet_dummy_batch_replicas(moonlet_dummy *d, const char *const *keys, size_t n,
                                 const char *tenant, char **json_out)
{
    if (n > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_dm_batch_keys_args a = {.tenant = tenant_of(d, tenant), .keys = {keys, (uint32_t)n}};
    return pooled_call(d, MOONLET_DM_BATCH_REPLICAS, &a, take_str, json_out);
}

int moonlet_dummy_batch_exist_key(moonlet_dummy *d, const char *const *keys, size_t n,
                                  int32_t *results, const char *tenant)
{
    return dummy_batch_keys(d, NULL, keys, n, results, tenant);
}

int moonlet_dummy_batch_probe_key(moonlet_dummy *d, moonlet_grant_lease_policy policy,
                                  const char *const *keys, size_t n, int32_t *results,
                                  const char *tenant)
{
    return dummy_batch_keys(d, &policy, keys, n, results, tenant);
}

int moonlet_dummy_probe_resume(moonlet_dummy *d, const char *const *kv, size_t n_kv,
                               const char *const *kda, size_t n_kda, uint64_t candidate_size,
                               const uint64_t *boundaries, size_t n_boundaries,
                               moonlet_probe_resume_result *out, int32_t *mask,
                               const char *tenant)
{
    if (!out || (n_kv && !kv) || (n_kda && (!kda || !mask)) || (n_boundaries && !boundaries) ||
        n_kv > UINT32_MAX || n_kda > UINT32_MAX || n_boundaries > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    *out = (moonlet_probe_resume_result){0, -1};
    /* no NULL key: client_api.c checked (keys_ok) */
    dchan *ch;
    int rc = chan_acquire(d, &ch);
    if (rc)
        return rc;
    moonlet_dm_probe_resume_args a = {.tenant = tenant_of(d, tenant),
                                      .kv_keys = {kv, (uint32_t)n_kv},
                                      .candidate_size = candidate_size,
                                      .kda_keys = {kda, (uint32_t)n_kda},
                                      .boundaries = {boundaries, (uint32_t)n_boundaries}};
    chan_begin_args(ch, MOONLET_DM_PROBE_RESUME, &a);
    dcall k;
    rc = chan_finish(ch, -1, &k);
    if (rc == MOONLET_OK) {
        uint64_t prefix;
        int64_t sel;
        if (moonlet_wire_u64(k.res, 1, &prefix) || moonlet_wire_i64(k.res, 2, &sel) ||
            sel < -1 || !unpack_results(k.res, 3, n_kda, mask)) {
            rc = MOONLET_ERR_RPC_FAIL;
        } else {
            out->kv_prefix = prefix;
            out->selected = sel;
        }
    } else if (rc == MOONLET_ERR_INVALID_PARAMS && k.have && k.rep.result &&
               k.rep.result->type == MSGPACK_OBJECT_STR && k.rep.result->via.str.size >= 14 &&
               memcmp(k.rep.result->via.str.ptr, "unknown method", 14) == 0) {
        rc = MOONLET_ERR_INVALID_VERSION; /* a RealClient that predates ProbeResume */
    }
    dcall_end(&k);
    chan_release(d, ch);
    return rc;
}

/* ---- transfer batches -------------------------------------------------------------- */

/* Where one item of a batch put / get lives for the RealClient. */
typedef struct ditem {
    dshared *s;   /* alloc_shared region, or NULL: copied through the area */
    size_t off;   /* in s, or in the copy area */
    bool send;    /* false: refused locally (results[i] already set) */
} ditem;

/*
 * Sorts the items of a batch: alloc_shared memory is used in place, other
 * registered memory gets a slot in one copy area of *area_len bytes;
 * memory outside both is INVALID_PARAMS in results[i].  Returns the number
 * of items to send.
 */
static size_t batch_plan(moonlet_dummy *d, const void *const *bufs, const size_t *lens, size_t n,
                         int32_t *results, ditem *it, size_t *area_len)
{
    size_t area = 0, nsend = 0;
    for (size_t i = 0; i < n; i++) {
        it[i] = (ditem){.s = NULL, .off = 0, .send = false};
        if ((!bufs[i] && lens[i]) || !covered(d, bufs[i], lens[i])) {
            results[i] = MOONLET_ERR_INVALID_PARAMS;
            continue;
        }
        it[i].send = true;
        nsend++;
        if (lens[i] && (it[i].s = shared_find(d, bufs[i], lens[i]))) {
            it[i].off = (size_t)((const unsigned char *)bufs[i] - it[i].s->r.base);
            continue;
        }
        it[i].off = area;
        area += (lens[i] + ITEM_ALIGN - 1) / ITEM_ALIGN * ITEM_ALIGN;
    }
    *area_len = area;
    return nsend;
}

/* Attaches every alloc_shared region the batch uses. */
static int batch_attach(moonlet_dummy *d, dchan *ch, const ditem *it, size_t n)
{
    int rc = MOONLET_OK;
    for (size_t i = 0; i < n && !rc; i++)
        if (it[i].send && it[i].s)
            rc = chan_ensure(d, ch, it[i].s);
    return rc;
}

/* A batch that failed as a whole (no per-item results came back): every
 * item that was to be sent gets the failure.  rc 0: nothing to do. */
static void batch_fail(const ditem *it, size_t n, int32_t *results, int rc)
{
    for (size_t i = 0; rc && i < n; i++)
        if (it[i].send)
            results[i] = rc;
}

/* The first non-zero result in array order (the batch calls' return value). */
static int first_error(const int32_t *results, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (results[i])
            return results[i];
    return MOONLET_OK;
}

/* Copies the per-item results of the sent items back to their positions. */
static bool scatter_results(const msgpack_object *res, uint32_t idx, const ditem *it, size_t n,
                            size_t nsend, int32_t *results, uint64_t *vals)
{
    const msgpack_object *a;
    if (moonlet_wire_array(res, idx, &a) || moonlet_wire_len(a) != nsend)
        return false;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (!it[i].send)
            continue;
        if (results) {
            int64_t v;
            if (moonlet_wire_i64(a, (uint32_t)j, &v) || v > 0 || v < INT32_MIN)
                return false;
            results[i] = (int32_t)v;
        } else if (moonlet_wire_u64(a, (uint32_t)j, &vals[i])) {
            return false;
        }
        j++;
    }
    return true;
}

/* The caller's arrays of a batch: INVALID_PARAMS when one is missing or n
 * does not fit the protocol (client_api.c checked that no key is NULL). */
static int batch_check(const char *const *keys, const void *bufs, const size_t *lens, size_t n,
                       const int32_t *results)
{
    if (n && (!keys || !bufs || !lens || !results))
        return MOONLET_ERR_INVALID_PARAMS;
    return n > UINT32_MAX ? MOONLET_ERR_INVALID_PARAMS : MOONLET_OK;
}

/* A batch put or get on its way. */
typedef struct dbatch {
    size_t n, nsend;
    ditem *it;              /* where each item lives for the RealClient */
    dchan *ch;              /* NULL: none acquired */
    dregion one;            /* a one-off copy area, when staging is too small */
    const dregion *area;    /* the copy area */
    moonlet_dm_item *items; /* the items argument */
} dbatch;

/* Sorts the items, takes a channel, attaches the shared regions they use and
 * a copy area for the rest.  0, or the error; dbatch_end() in every case. */
static int dbatch_begin(moonlet_dummy *d, dbatch *b, const void *const *bufs, const size_t *lens,
                        size_t n, int32_t *results)
{
    *b = (dbatch){.n = n, .one = {.fd = -1}};
    if (!(b->it = calloc(n ? n : 1, sizeof(*b->it))))
        return MOONLET_ERR_INTERNAL_ERROR;
    size_t area_len;
    b->nsend = batch_plan(d, bufs, lens, n, results, b->it, &area_len);
    int rc = chan_acquire(d, &b->ch);
    if (rc) {
        b->ch = NULL;
        return rc;
    }
    b->area = &b->ch->stage;
    rc = batch_attach(d, b->ch, b->it, n);
    if (!rc && area_len)
        rc = chan_area(d, b->ch, area_len, &b->one, &b->area);
    return rc;
}

/* The items to send, as the call's argument: [key, region, offset, len]. */
static int dbatch_items(dbatch *b, const char *const *keys, const size_t *lens)
{
    if (!(b->items = malloc((b->nsend ? b->nsend : 1) * sizeof(*b->items))))
        return MOONLET_ERR_INTERNAL_ERROR;
    for (size_t i = 0, j = 0; i < b->n; i++)
        if (b->it[i].send)
            b->items[j++] = (moonlet_dm_item){
                .key = keys[i], .region = b->it[i].s ? b->it[i].s->r.id : b->area->id,
                .offset = b->it[i].off, .len = lens[i]};
    return MOONLET_OK;
}

/* Releases the batch; returns its result: rc when the per-item results came
 * back (filled), else the first item error (each sent item failed with rc). */
static int dbatch_end(moonlet_dummy *d, dbatch *b, int32_t *results, int rc, bool filled)
{
    if (!b->it)
        return rc;
    free(b->items);
    if (b->ch) {
        chan_area_end(b->ch, &b->one);
        chan_release(d, b->ch);
    }
    batch_fail(b->it, b->n, results, filled ? MOONLET_OK : rc);
    free(b->it);
    return filled ? rc : first_error(results, b->n);
}

int moonlet_dummy_batch_put_from(moonlet_dummy *d, const char *const *keys,
                                 const void *const *bufs, const size_t *lens, size_t n,
                                 const moonlet_put_options *opt, int32_t *results)
{
    int rc = batch_check(keys, bufs, lens, n, results);
    if (rc)
        return rc;
    dbatch b;
    bool filled = false;
    rc = dbatch_begin(d, &b, bufs, lens, n, results);
    for (size_t i = 0; !rc && i < n; i++)
        if (b.it[i].send && !b.it[i].s && lens[i])
            memcpy(b.area->base + b.it[i].off, bufs[i], lens[i]);
    if (!rc && !(rc = dbatch_items(&b, keys, lens))) {
        moonlet_dm_batch_put_args a = {.items = {b.items, (uint32_t)b.nsend}};
        PUT_ARGS(&a, d, opt);
        chan_begin_args(b.ch, MOONLET_DM_BATCH_PUT, &a);
        dcall k;
        rc = chan_finish(b.ch, -1, &k);
        if (k.res && !scatter_results(k.res, 1, b.it, n, b.nsend, results, NULL)) {
            rc = MOONLET_ERR_RPC_FAIL;
        } else if (k.res) {
            rc = first_error(results, n);
            filled = true;
        }
        dcall_end(&k);
    }
    return dbatch_end(d, &b, results, rc, filled);
}

/* Copies the sizes a batch get returned into lens, and the bytes of the
 * items that came through the copy area to their buffers. */
static void batch_get_out(const dbatch *b, void *const *bufs, const size_t *caps,
                          const uint64_t *sizes, size_t *lens, int32_t *results)
{
    for (size_t i = 0; i < b->n; i++) {
        if (!b->it[i].send)
            continue;
        lens[i] = sizes[i] > SIZE_MAX ? SIZE_MAX : (size_t)sizes[i];
        if (results[i] == MOONLET_OK && lens[i] > caps[i]) {
            /* a success larger than the item's room: never trust it */
            ML_WARN(MOD, "batch get: the RealClient claims %llu bytes in a room of %zu",
                    (unsigned long long)sizes[i], caps[i]);
            results[i] = MOONLET_ERR_RPC_FAIL;
            lens[i] = 0;
        }
        if (results[i] == MOONLET_OK && !b->it[i].s && lens[i])
            memcpy(bufs[i], b->area->base + b->it[i].off, lens[i]);
    }
}

int moonlet_dummy_batch_get_into(moonlet_dummy *d, const char *const *keys, void *const *bufs,
                                 const size_t *caps, size_t n, size_t *lens, int32_t *results,
                                 const char *tenant)
{
    int rc = batch_check(keys, bufs, caps, n, results);
    if (rc || (n && !lens))
        return rc ? rc : MOONLET_ERR_INVALID_PARAMS;
    uint64_t *sizes = calloc(n ? n : 1, sizeof(*sizes));
    if (!sizes)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (size_t i = 0; i < n; i++)
        lens[i] = 0;
    dbatch b;
    bool filled = false;
    rc = dbatch_begin(d, &b, (const void *const *)bufs, caps, n, results);
    if (!rc && !(rc = dbatch_items(&b, keys, caps))) {
        moonlet_dm_batch_get_args a = {.tenant = tenant_of(d, tenant),
                                       .items = {b.items, (uint32_t)b.nsend}};
        chan_begin_args(b.ch, MOONLET_DM_BATCH_GET, &a);
        dcall k;
        rc = chan_finish(b.ch, -1, &k);
        if (k.res && (!scatter_results(k.res, 1, b.it, n, b.nsend, results, NULL) ||
                      !scatter_results(k.res, 2, b.it, n, b.nsend, NULL, sizes))) {
            rc = MOONLET_ERR_RPC_FAIL;
        } else if (k.res) {
            batch_get_out(&b, bufs, caps, sizes, lens, results);
            rc = first_error(results, n);
            filled = true;
        }
        dcall_end(&k);
    }
    free(sizes);
    return dbatch_end(d, &b, results, rc, filled);
}

/* ---- buffers ----------------------------------------------------------------------- */

int moonlet_dummy_register_buffer(moonlet_dummy *d, void *base, size_t len)
{
    if (!base || !len || (uintptr_t)base > UINTPTR_MAX - len)
        return MOONLET_ERR_INVALID_PARAMS;
    dbuf *b = calloc(1, sizeof(*b));
    if (!b)
        return MOONLET_ERR_INTERNAL_ERROR;
    b->base = base;
    b->len = len;
    int rc = MOONLET_OK;
    pthread_mutex_lock(&d->mu);
    for (dbuf *o = d->bufs; o && !rc; o = o->next)
        if (o->base == base)
            rc = MOONLET_ERR_INVALID_PARAMS;
    for (dshared *s = d->shared; s && !rc; s = s->next)
        if (s->r.base == base)
            rc = MOONLET_ERR_INVALID_PARAMS; /* alloc_shared memory is registered already */
    if (!rc) {
        b->next = d->bufs;
        d->bufs = b;
    }
    pthread_mutex_unlock(&d->mu);
    if (rc)
        free(b);
    return rc;
}

int moonlet_dummy_unregister_buffer(moonlet_dummy *d, void *base)
{
    if (!base)
        return MOONLET_ERR_INVALID_PARAMS;
    dbuf *b = NULL;
    pthread_mutex_lock(&d->mu);
    for (dbuf **pp = &d->bufs; *pp; pp = &(*pp)->next) {
        if ((*pp)->base == base) {
            b = *pp;
            *pp = b->next;
            break;
        }
    }
    pthread_mutex_unlock(&d->mu);
    free(b);
    return b ? MOONLET_OK : MOONLET_ERR_INVALID_PARAMS;
}

int moonlet_dummy_alloc_shared(moonlet_dummy *d, size_t len, void **out)
{
    if (!len || !out || len > MOONLET_DUMMY_MAX_REGION_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    dshared *s = calloc(1, sizeof(*s));
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    int rc = region_new(d, len, &s->r);
    if (rc) {
        free(s);
        return rc;
    }
    pthread_mutex_lock(&d->mu);
    s->next = d->shared;
    d->shared = s;
    pthread_mutex_unlock(&d->mu);
    *out = s->r.base;
    return MOONLET_OK;
}

int moonlet_dummy_free_shared(moonlet_dummy *d, void *p)
{
    if (!p)
        return MOONLET_ERR_INVALID_PARAMS;
    dshared *s = NULL;
    dchan *idle[64];
    size_t nidle = 0;
    pthread_mutex_lock(&d->mu);
    for (dshared **pp = &d->shared; *pp; pp = &(*pp)->next) {
        if ((*pp)->r.base == p) {
            s = *pp;
            *pp = s->next;
            break;
        }
    }
    /* idle connected channels detach it now; busy ones when next taken */
    for (dchan *c = d->chans; s && c && nidle < 64; c = c->next) {
        if (!c->busy && c->rpc) {
            c->busy = true;
            idle[nidle++] = c;
        }
    }
    pthread_mutex_unlock(&d->mu);
    if (!s)
        return MOONLET_ERR_INVALID_PARAMS;
    for (size_t i = 0; i < nidle; i++) {
        chan_prune(d, idle[i]);
        chan_release(d, idle[i]);
    }
    region_free(&s->r);
    free(s);
    return MOONLET_OK;
}

/* ---- create / destroy -------------------------------------------------------------- */

const char *moonlet_dummy_protocol(const moonlet_dummy *d)
{
    return d->protocol;
}

int moonlet_dummy_create(const char *socket_path, const moonlet_dummy_config *cfg,
                         moonlet_dummy **out)
{
    struct sockaddr_un sa;
    if (!socket_path || !*socket_path || !out || strlen(socket_path) >= sizeof(sa.sun_path))
        return MOONLET_ERR_INVALID_PARAMS;
    if (cfg && cfg->default_tenant && strlen(cfg->default_tenant) > MOONLET_MAX_ID_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    if (cfg && cfg->staging_bytes > MOONLET_DUMMY_MAX_REGION_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_dummy *d = calloc(1, sizeof(*d));
    if (!d)
        return MOONLET_ERR_INTERNAL_ERROR;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    atomic_init(&d->next_id, 1);
    d->timeout_ms = (int)(cfg && cfg->rpc_timeout_ms && cfg->rpc_timeout_ms <= INT32_MAX
                              ? cfg->rpc_timeout_ms : MOONLET_DUMMY_DEFAULT_TIMEOUT_MS);
    d->stage_len = cfg && cfg->staging_bytes ? (size_t)cfg->staging_bytes
                                             : MOONLET_DUMMY_DEFAULT_STAGING;
    d->max_chans = cfg && cfg->max_connections ? cfg->max_connections
                                               : MOONLET_DUMMY_DEFAULT_CONNECTIONS;
    d->peer_uid = cfg && cfg->peer_uid_set ? (uid_t)cfg->peer_uid : getuid();
    d->peer_gid_set = cfg && cfg->peer_gid_set;
    d->peer_gid = cfg && cfg->peer_gid_set ? (gid_t)cfg->peer_gid : 0;
    d->path = strdup(socket_path);
    int rc = d->path ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc && cfg && cfg->default_tenant && !(d->tenant = strdup(cfg->default_tenant)))
        rc = MOONLET_ERR_INTERNAL_ERROR;
    dchan *ch;
    d->creating = true;
    if (!rc && !(rc = chan_acquire(d, &ch))) /* the first connection: is anyone there? */
        chan_release(d, ch);
    d->creating = false;
    if (!d->protocol[0])
        snprintf(d->protocol, sizeof(d->protocol), "unknown");
    if (rc) {
        moonlet_dummy_destroy(d);
        return rc;
    }
    *out = d;
    return MOONLET_OK;
}

void moonlet_dummy_destroy(moonlet_dummy *d)
{
    if (!d)
        return;
    while (d->chans) {
        dchan *c = d->chans;
        d->chans = c->next;
        chan_free(c);
    }
    while (d->shared) {
        dshared *s = d->shared;
        d->shared = s->next;
        region_free(&s->r);
        free(s);
    }
    while (d->bufs) {
        dbuf *b = d->bufs;
        d->bufs = b->next;
        free(b);
    }
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d->path);
    free(d->tenant);
    free(d);
}
