/*
 * client.c - the public C client (include/moonlet/client.h): MasterClient for
 * metadata, the xfer transport for bytes, an optional local segment.
 *
 * Every object operation is "ask the master, move the bytes, tell the
 * master": put = PutStart, one transport batch writing every replica,
 * PutEnd (PutRevoke when a write failed); get = GetReplicaList, a read of one
 * replica (falling over to the next when a node is gone), then the lease
 * check.
 *
 * Put retry (client_put_retry).  A replica whose write failed because its
 * node is gone or not answering (never a refused capability) is replaced:
 * PutReplaceReplica gives a new replica on another segment (none holding a
 * replica, none seen failing for this put) and the bytes are written there,
 * before the put's deadline, at most 4 times per put.  The caller sees
 * every replica written and sealed, or the same clean failure as without it
 * (PutRevoke: nothing readable).  A master without the method: PutRevoke.
 *
 * Stale-writer fencing and integrity (docs/reliability.md).  Each write
 * carries the capability PutStart granted for its replica and a deadline on
 * this host's clock: the time PutStart was sent plus the put's TTL, never
 * later than the master's put deadline; the transport refuses to start, or
 * aborts with a reset, a write past it.  A put records the XXH3-64 of its
 * bytes at PutEnd; a get verifies it and treats a mismatch like an
 * unreachable replica (the next one is tried; INVALID_READ when none is
 * left), so wrong bytes never come back as success.  The batch calls keep the same shape but put every transfer of
 * every key into one transport batch, so n objects cost n master round trips
 * and one parallel transfer rather than n sequential ones.
 *
 * Copying calls hand the caller's memory straight to the transport on TCP,
 * which accepts any memory.  On RDMA the NIC can only touch registered
 * memory, so the copying calls stage through a private bounce buffer (unless
 * the caller's memory already lies in a buffer registered with the client).
 * Bounce buffers are registered once and kept in a small cache (power-of-two
 * sizes from 64 KiB, at most CLIENT_STAGE_CACHE_BYTES idle, and no more than
 * a quarter of a finite RLIMIT_MEMLOCK): registering memory with a NIC costs
 * tens of microseconds to milliseconds per call, pinning included.  A private buffer, rather than
 * registering the caller's memory for the call, keeps registrations from
 * different threads from ever covering the same addresses, so unregistering
 * one can never pull the memory region out from under another.
 *
 * Mixed clusters (docs/deployment.md).  Each replica names its node's
 * protocol and endpoint, and a node serving both (moonlet-store --protocol
 * both) a second endpoint of the same bytes.  Per replica the client uses
 * its own protocol when the replica offers it, else TCP: an RDMA client adds
 * a TCP transport on first need.  A replica it cannot speak to (an RDMA-only
 * node for a TCP client) fails with UNAVAILABLE_IN_CURRENT_STATUS and one
 * WARN line, and a get moves on to the next replica.  A batch mixing both
 * transports runs as one submit per transport, one after the other.
 *
 * The local segment, when configured, is a store node (store_node.c) run on
 * a thread of the client; reads prefer the replica it serves.
 *
 * This file is the direct backend of moonlet_client's backend table
 * (client_backend.h; moonlet_client_direct_ops at the end): client_api.c
 * checks each call's arguments and calls the operation here; the other
 * backend, the DummyClient, is client_dummy.c.  Operations add only their
 * own checks (memory inside a registered buffer).
 *
 * Locks: buf_mu guards the list of registered buffers and is never held
 * across a transport call; stage_mu guards the idle bounce buffers and the
 * staging counters, and is never held across a registration; tcp_mu guards
 * creating the TCP transport (published through an atomic pointer) and is
 * never held across a transfer; the MasterClient serialises master calls with its
 * own mutex; xfer is thread safe.  No lock is held while another is taken.
 */
#include "moonlet/client.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
/* inline: XXH3_state_t on the stack for the ranged checksums, no ABI tie */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "client_internal.h"
#include "client_backend.h"
#include "cuda_driver.h"
#include "disk_tier.h"
#include "log.h"
#include "master_client.h"
#include "store_node.h"
#include "xfer.h"
#include "monotime.h"
#include "span.h"
#include "thread.h"
#include "tls.h"

#define MOD "client"

typedef struct moonlet_client_be client_direct;
#define CLIENT_STAGE_ALIGN 4096u

typedef struct client_buf {
    void *base;
    size_t len;
    bool ready;  /* false while its transport registration is being made */
    bool shared; /* memory of moonlet_client_alloc_shared(), freed with it */
    struct client_buf *next;
} client_buf;

/* An idle registered bounce buffer. */
typedef struct client_bounce {
    void *base;
    size_t cap;
    struct client_bounce *next;
} client_bounce;

#define CLIENT_STAGE_MIN (64u << 10)
#define CLIENT_STAGE_CACHE_BYTES ((size_t)256 << 20)

/* The direct backend's state (client_backend.h: the handle's `be`). */
struct moonlet_client_be {
    moonlet_master_client *mc;
    moonlet_xfer *xfer;
    /* RDMA clients: a TCP instance for replicas on nodes without RDMA,
     * created on first need (tcp_mu); the options it is made with. */
    pthread_mutex_t tcp_mu;
    moonlet_xfer *_Atomic xfer_tcp;
    bool tcp_failed;           /* tcp_mu: its creation failed once (logged once) */
    moonlet_xfer_opts tcp_opts; /* strings point into tcp_token */
    char *tcp_token;
    moonlet_tls_ctx *tls;  /* TLS to the master (config tls_*); NULL: plaintext */
    char *tenant;          /* default tenant; NULL: the master's "default" */
    uint32_t replica_num;
    atomic_bool stage;     /* copying calls use a registered bounce buffer */
    bool checksum;         /* compute checksums at put and verify them at get */
    pthread_mutex_t buf_mu;
    client_buf *bufs;
    pthread_mutex_t stage_mu;
    client_bounce *idle;      /* registered bounce buffers not in use */
    size_t idle_bytes, stage_limit;
    uint64_t stage_regs;      /* registrations made for staging, ever */
    moonlet_store_node *node; /* the local segment, or NULL */
    pthread_t node_thread;
    char own_endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1]; /* "" without a local segment */
};

/* ---- pure decisions (client_internal.h) ----------------------------------------- */

bool moonlet_client_lease_expired(uint64_t asked_ns, uint64_t lease_ttl_ms, uint64_t done_ns)
{
    if (done_ns < asked_ns)
        return false;
    uint64_t ttl_ns = lease_ttl_ms > UINT64_MAX / 1000000u ? UINT64_MAX : lease_ttl_ms * 1000000u;
    return done_ns - asked_ns >= ttl_ns;
}

uint32_t moonlet_client_replica_order(const moonlet_replica_desc *r, uint32_t n,
                                      const char *own_endpoint, uint32_t *order)
{
    bool have_own = own_endpoint && *own_endpoint;
    uint32_t k = 0;
    for (int pass = have_own ? 0 : 1; pass < 2; pass++)
        for (uint32_t i = 0; i < n; i++) {
            bool own = have_own && r[i].endpoint && strcmp(r[i].endpoint, own_endpoint) == 0;
            if (own == (pass == 0))
                order[k++] = i;
        }
    return k;
}

bool moonlet_client_try_next_replica(int rc)
{
    return rc == MOONLET_ERR_TRANSFER_FAIL || rc == MOONLET_ERR_SEGMENT_NOT_FOUND ||
           rc == MOONLET_ERR_INVALID_READ || /* checksum mismatch: another replica may be good */
           rc == MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS; /* a protocol we cannot speak */
}

int moonlet_client_pick_endpoint(const moonlet_replica_desc *r, const char *mine, bool can_tcp,
                                 const char **endpoint, const char **segment_id,
                                 const char **protocol)
{
    bool alt = r->alt_protocol && r->alt_endpoint && r->alt_segment_id;
    for (int pass = 0; pass < 2; pass++) {
        const char *want = pass == 0 ? mine : can_tcp ? "tcp" : NULL;
        if (!want)
            break;
        if (r->protocol && strcmp(r->protocol, want) == 0) {
            *endpoint = r->endpoint;
            *segment_id = r->segment_id;
            *protocol = r->protocol;
            return MOONLET_OK;
        }
        if (alt && strcmp(r->alt_protocol, want) == 0) {
            *endpoint = r->alt_endpoint;
            *segment_id = r->alt_segment_id;
            *protocol = r->alt_protocol;
            return MOONLET_OK;
        }
    }
    return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
}

/* The direct state of a handle, or NULL for another backend. */
static client_direct *client_direct_of(moonlet_client *h)
{
    return h && h->ops == &moonlet_client_direct_ops ? h->be : NULL;
}

void moonlet_client_force_staging(moonlet_client *h, bool on)
{
    client_direct *c = client_direct_of(h);
    if (!c)
        return;
    atomic_store(&c->stage, on);
}

void *moonlet_client_local_segment_base(moonlet_client *h)
{
    client_direct *c = client_direct_of(h);
    return c && c->node ? moonlet_store_node_segment_base(c->node) : NULL;
}

/* ---- small helpers -------------------------------------------------------------- */

static const char *client_tenant(const client_direct *c, const char *tenant)
{
    return tenant ? tenant : c->tenant;
}

/* ---- registered buffers --------------------------------------------------------- */

/* Whether [p, p + len) lies inside one registered buffer; len 0 always does. */
static bool client_buf_covers(client_direct *c, const void *p, size_t len)
{
    if (len == 0)
        return true;
    bool found = false;
    pthread_mutex_lock(&c->buf_mu);
    for (client_buf *b = c->bufs; b && !found; b = b->next)
        found = b->ready && moonlet_span_within(p, len, b->base, b->len);
    pthread_mutex_unlock(&c->buf_mu);
    return found;
}

/* Unlinks the entry at `base` (ready or not, only if ready; shared or not,
 * only if of the kind `shared`); NULL when there is none. */
static client_buf *client_buf_unlink(client_direct *c, void *base, bool ready_only, bool shared)
{
    client_buf *b = NULL;
    pthread_mutex_lock(&c->buf_mu);
    for (client_buf **pp = &c->bufs; *pp; pp = &(*pp)->next) {
        if ((*pp)->base == base && (!ready_only || (*pp)->ready) && (*pp)->shared == shared) {
            b = *pp;
            *pp = b->next;
            break;
        }
    }
    pthread_mutex_unlock(&c->buf_mu);
    return b;
}

/* Registers [base, base + len) with the transport: host memory, or with
 * `device` device memory in place (dmabuf_fd / dmabuf_off: as
 * moonlet_xfer_register_device; *how). */
static int client_buf_add(client_direct *c, void *base, size_t len, bool device, int dmabuf_fd,
                          uint64_t dmabuf_off, const char **how)
{
    client_buf *b = calloc(1, sizeof(*b));
    if (!b)
        return MOONLET_ERR_INTERNAL_ERROR;
    b->base = base;
    b->len = len;
    /* Claim the base first (not ready), so a slow NIC registration holds no lock. */
    pthread_mutex_lock(&c->buf_mu);
    for (client_buf *o = c->bufs; o; o = o->next) {
        if (o->base == base) {
            pthread_mutex_unlock(&c->buf_mu);
            free(b);
            return MOONLET_ERR_INVALID_PARAMS;
        }
    }
    b->next = c->bufs;
    c->bufs = b;
    pthread_mutex_unlock(&c->buf_mu);
    int rc = device ? moonlet_xfer_register_device(c->xfer, base, len, dmabuf_fd, dmabuf_off, how)
                    : moonlet_xfer_register_buffer(c->xfer, base, len);
    if (rc) {
        free(client_buf_unlink(c, base, false, false));
        return rc;
    }
    pthread_mutex_lock(&c->buf_mu);
    b->ready = true;
    pthread_mutex_unlock(&c->buf_mu);
    return MOONLET_OK;
}

static int direct_register_buffer(client_direct *c, void *base, size_t len)
{
    return client_buf_add(c, base, len, false, -1, 0, NULL);
}

/* GPUDirect RDMA (client_backend.h, register_device): device memory the NIC
 * moves in place.  Only without checksums: a checksum is computed and
 * verified on the host, which must not touch device memory, so with them
 * on (the default) device memory is staged (client_gpu.c) and every get is
 * verified on its host copy. */
static int direct_register_device(client_direct *c, void *base, size_t len, uintptr_t alloc,
                                  size_t alloc_len, const char **how)
{
    if (strcmp(moonlet_xfer_protocol_name(c->xfer), "rdma") != 0) {
        *how = "the client's transport is TCP, which moves host memory only";
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    }
    if (c->checksum) {
        *how = "end-to-end checksums are on, and they are computed and verified on host "
               "memory (skip_checksum lets the NIC move device memory in place)";
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    }
    const moonlet_cuda *cu = moonlet_cuda_loaded();
    int fd = -1;
    if (cu && cu->cuMemGetHandleForAddressRange &&
        cu->cuMemGetHandleForAddressRange(&fd, (CUdeviceptr)alloc, alloc_len,
                                          CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0) != CUDA_SUCCESS)
        fd = -1;
    int rc = client_buf_add(c, base, len, true, fd, (uintptr_t)base - alloc, how);
    if (fd >= 0)
        close(fd); /* the transport keeps its own */
    return rc;
}

/* Unregisters the ready buffer at base of the kind `shared` and forgets it;
 * a shared one's memory (the client's own) is freed too, whatever the
 * transport said.  INVALID_PARAMS when there is no such buffer. */
static int client_buf_release(client_direct *c, void *base, bool shared)
{
    client_buf *b = client_buf_unlink(c, base, true, shared);
    if (!b)
        return MOONLET_ERR_INVALID_PARAMS;
    int rc = moonlet_xfer_unregister_buffer(c->xfer, base);
    free(b);
    if (!shared)
        return rc;
    free(base);
    return MOONLET_OK;
}

static int direct_unregister_buffer(client_direct *c, void *base)
{
    return client_buf_release(c, base, false);
}

static int direct_alloc_shared(client_direct *c, size_t len, void **out)
{
    if (len > SIZE_MAX - CLIENT_STAGE_ALIGN)
        return MOONLET_ERR_INVALID_PARAMS;
    size_t rounded = (len + CLIENT_STAGE_ALIGN - 1) / CLIENT_STAGE_ALIGN * CLIENT_STAGE_ALIGN;
    void *p = aligned_alloc(CLIENT_STAGE_ALIGN, rounded);
    if (!p)
        return MOONLET_ERR_INTERNAL_ERROR;
    memset(p, 0, rounded);
    int rc = direct_register_buffer(c, p, len);
    if (rc) {
        free(p);
        return rc;
    }
    pthread_mutex_lock(&c->buf_mu);
    for (client_buf *b = c->bufs; b; b = b->next)
        if (b->base == p)
            b->shared = true;
    pthread_mutex_unlock(&c->buf_mu);
    *out = p;
    return MOONLET_OK;
}

static int direct_free_shared(client_direct *c, void *p)
{
    return client_buf_release(c, p, true);
}

/* ---- staging for the copying calls ----------------------------------------------- */

typedef struct client_stage {
    void *ptr;    /* what the transport moves bytes from / to */
    void *bounce; /* private registered copy, or NULL when ptr is the caller's memory */
    size_t cap;   /* its size */
} client_stage;

/* The bounce cache of a new client: at most CLIENT_STAGE_CACHE_BYTES idle,
 * and a quarter of a finite memlock limit (pinned pages count against it). */
static void client_stage_init(client_direct *c)
{
    pthread_mutex_init(&c->stage_mu, NULL);
    c->stage_limit = CLIENT_STAGE_CACHE_BYTES;
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur / 4 < c->stage_limit)
        c->stage_limit = (size_t)(rl.rlim_cur / 4);
}

static void client_bounce_free(client_direct *c, void *base)
{
    moonlet_xfer_unregister_buffer(c->xfer, base);
    free(base);
}

/* Takes the smallest idle buffer of at least len bytes, or registers a new
 * one (a power of two from 64 KiB) - outside stage_mu. */
static int client_stage_begin(client_direct *c, void *user, size_t len, client_stage *st)
{
    st->ptr = user;
    st->bounce = NULL;
    if (len == 0 || !atomic_load(&c->stage) || client_buf_covers(c, user, len))
        return MOONLET_OK;
    if (len > SIZE_MAX / 2 - CLIENT_STAGE_ALIGN)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_mutex_lock(&c->stage_mu);
    client_bounce **best = NULL;
    for (client_bounce **pp = &c->idle; *pp; pp = &(*pp)->next)
        if ((*pp)->cap >= len && (!best || (*pp)->cap < (*best)->cap))
            best = pp;
    if (best) {
        client_bounce *b = *best;
        *best = b->next;
        c->idle_bytes -= b->cap;
        pthread_mutex_unlock(&c->stage_mu);
        st->ptr = st->bounce = b->base;
        st->cap = b->cap;
        free(b);
        return MOONLET_OK;
    }
    pthread_mutex_unlock(&c->stage_mu);
    size_t cap = CLIENT_STAGE_MIN;
    while (cap < len)
        cap *= 2;
    void *p = aligned_alloc(CLIENT_STAGE_ALIGN, cap);
    if (!p)
        return MOONLET_ERR_INTERNAL_ERROR;
    int rc = moonlet_xfer_register_buffer(c->xfer, p, cap);
    if (rc) {
        free(p);
        return rc;
    }
    pthread_mutex_lock(&c->stage_mu);
    c->stage_regs++;
    pthread_mutex_unlock(&c->stage_mu);
    st->ptr = st->bounce = p;
    st->cap = cap;
    return MOONLET_OK;
}

/* Gives the bounce buffer back to the cache; beyond the cache's limit the
 * largest idle buffers are deregistered and freed (outside stage_mu). */
static void client_stage_end(client_direct *c, client_stage *st)
{
    if (!st->bounce)
        return;
    client_bounce *b = malloc(sizeof(*b));
    if (!b) {
        client_bounce_free(c, st->bounce);
        st->bounce = NULL;
        return;
    }
    *b = (client_bounce){.base = st->bounce, .cap = st->cap};
    st->bounce = NULL;
    client_bounce *evict = NULL;
    pthread_mutex_lock(&c->stage_mu);
    b->next = c->idle;
    c->idle = b;
    c->idle_bytes += b->cap;
    while (c->idle_bytes > c->stage_limit && c->idle) {
        client_bounce **big = &c->idle;
        for (client_bounce **pp = &c->idle; *pp; pp = &(*pp)->next)
            if ((*pp)->cap > (*big)->cap)
                big = pp;
        client_bounce *e = *big;
        *big = e->next;
        c->idle_bytes -= e->cap;
        e->next = evict;
        evict = e;
    }
    pthread_mutex_unlock(&c->stage_mu);
    while (evict) {
        client_bounce *next = evict->next;
        client_bounce_free(c, evict->base);
        free(evict);
        evict = next;
    }
}

void moonlet_client_stage_stats(moonlet_client *h, uint64_t *registrations, size_t *idle_bytes)
{
    client_direct *c = client_direct_of(h);
    *registrations = 0;
    *idle_bytes = 0;
    if (!c)
        return;
    pthread_mutex_lock(&c->stage_mu);
    *registrations = c->stage_regs;
    *idle_bytes = c->idle_bytes;
    pthread_mutex_unlock(&c->stage_mu);
}

/* ---- put ------------------------------------------------------------------------ */

typedef struct client_put_args {
    const char *tenant;
    uint32_t replica_num;
    bool soft_pin;
    bool checksum;
    moonlet_mc_put_extra extra; /* preferred segments, hard pin, soft-pin TTL */
} client_put_args;

static client_put_args client_put_resolve(const client_direct *c, const moonlet_put_options *o)
{
    client_put_args a = {.tenant = client_tenant(c, o ? o->tenant : NULL),
                         .replica_num = o && o->replica_num ? o->replica_num : c->replica_num,
                         .soft_pin = o && o->soft_pin,
                         .checksum = c->checksum && !(o && o->skip_checksum)};
    if (o)
        a.extra = (moonlet_mc_put_extra){.preferred = o->preferred_segments,
                                         .npreferred = o->preferred_segments_count,
                                         .hard_pin = o->hard_pin,
                                         .soft_pin_ttl_ms = o->soft_pin_ttl_ms};
    return a;
}

uint64_t moonlet_client_checksum(const void *buf, size_t len)
{
    return XXH3_64bits(buf, len);
}

/* Seals a put whose writes ended with `rc` (recording `checksum` when not
 * NULL), or revokes it so nothing half-written becomes readable.  Returns
 * the put's outcome. */
static int client_put_finish(client_direct *c, const char *tenant, const char *key, int rc,
                             const uint64_t *checksum)
{
    if (rc == MOONLET_OK) {
        rc = moonlet_mc_put_end_checksum(c->mc, tenant, key, checksum);
        if (rc == MOONLET_OK)
            return MOONLET_OK;
        ML_WARN(MOD, "PutEnd of '%s' failed: %s", key, moonlet_strerror(rc));
    }
    int rv = moonlet_mc_put_revoke(c->mc, tenant, key);
    /* NOT_FOUND: the master already dropped it; INVALID_WRITE: a PutEnd whose
     * reply was lost did land. */
    if (rv && rv != MOONLET_ERR_OBJECT_NOT_FOUND && rv != MOONLET_ERR_INVALID_WRITE)
        ML_WARN(MOD, "PutRevoke of '%s' failed (%s); the master reaps it after its put timeout",
                key, moonlet_strerror(rv));
    return rc;
}

/* ---- per-replica transport (mixed clusters) ------------------------------------------ */

/* The transport, endpoint and segment id to reach replica r with; see
 * moonlet_client_pick_endpoint().  An RDMA client creates its TCP instance
 * here the first time a replica offers only TCP (tcp_mu, never held across
 * a transfer).  UNAVAILABLE_IN_CURRENT_STATUS when no protocol fits. */
typedef struct client_route {
    moonlet_xfer *xfer;
    const char *endpoint, *segment_id;
} client_route;

static moonlet_xfer *client_tcp_xfer(client_direct *c)
{
    moonlet_xfer *x = atomic_load(&c->xfer_tcp);
    if (x)
        return x;
    pthread_mutex_lock(&c->tcp_mu);
    x = atomic_load(&c->xfer_tcp);
    if (!x && !c->tcp_failed) {
        int rc = moonlet_xfer_create(&c->tcp_opts, &x);
        if (rc) {
            ML_ERR(MOD, "cannot create the TCP transport for replicas on nodes without RDMA: %s",
                   moonlet_strerror(rc));
            c->tcp_failed = true;
            x = NULL;
        } else {
            ML_INFO(MOD, "a replica is reachable over TCP only: TCP transport added next to RDMA");
            atomic_store(&c->xfer_tcp, x);
        }
    }
    pthread_mutex_unlock(&c->tcp_mu);
    return x;
}

static int client_route_of(client_direct *c, const moonlet_replica_desc *r, client_route *out)
{
    const char *mine = moonlet_xfer_protocol_name(c->xfer), *proto;
    bool can_tcp = strcmp(mine, "tcp") != 0;
    int rc = moonlet_client_pick_endpoint(r, mine, can_tcp, &out->endpoint, &out->segment_id,
                                          &proto);
    if (rc) {
        ML_WARN(MOD, "replica at %s (segment %s) is served over %s%s%s only; this client speaks "
                "%s (a node serves both with moonlet-store --protocol both)", r->endpoint,
                r->segment_id, r->protocol, r->alt_protocol ? " and " : "",
                r->alt_protocol ? r->alt_protocol : "", mine);
        return rc;
    }
    out->xfer = strcmp(proto, mine) == 0 ? c->xfer : client_tcp_xfer(c);
    return out->xfer ? MOONLET_OK : MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
}

/* Points op at replica r (endpoint, segment id) and records its transport
 * in *xf; a replica no transport fits gets its status now and *xf NULL. */
static void client_op_route(client_direct *c, const moonlet_replica_desc *r, moonlet_xfer_op *op,
                            moonlet_xfer **xf)
{
    client_route rt;
    int rc = client_route_of(c, r, &rt);
    *xf = rc ? NULL : rt.xfer;
    op->status = rc;
    if (!rc) {
        op->endpoint = rt.endpoint;
        op->segment_id = rt.segment_id;
    }
}

/* Runs a batch whose operations may go through different transports (xf[i];
 * NULL: already failed, status set).  One transport: one submit; two: one
 * submit each, one after the other.  Returns the status of the first failed
 * operation, as moonlet_xfer_submit(). */
static int client_submit(client_direct *c, moonlet_xfer_op *ops, moonlet_xfer **xf, size_t n)
{
    moonlet_xfer *tcp = atomic_load(&c->xfer_tcp);
    moonlet_xfer *inst[2] = {c->xfer, tcp};
    for (int k = 0; k < 2; k++) {
        if (!inst[k])
            continue;
        size_t m = 0, *idx = malloc((n ? n : 1) * sizeof(*idx));
        moonlet_xfer_op *sub = malloc((n ? n : 1) * sizeof(*sub));
        if (!idx || !sub) {
            free(idx);
            free(sub);
            for (size_t i = 0; i < n; i++)
                if (xf[i] == inst[k])
                    ops[i].status = MOONLET_ERR_INTERNAL_ERROR;
            continue;
        }
        for (size_t i = 0; i < n; i++)
            if (xf[i] == inst[k]) {
                idx[m] = i;
                sub[m++] = ops[i];
            }
        if (m)
            moonlet_xfer_submit(inst[k], sub, m);
        for (size_t j = 0; j < m; j++)
            ops[idx[j]].status = sub[j].status;
        free(idx);
        free(sub);
    }
    for (size_t i = 0; i < n; i++)
        if (ops[i].status)
            return ops[i].status;
    return MOONLET_OK;
}

/* The bytes of one key: one range (put_from, get_into) or several (the
 * ranged batches), all in registered memory; len is their total.  A key's
 * transfers are one operation per range for each replica, at consecutive
 * offsets of the replica, so cnt >= 1 (an empty value is one empty range). */
typedef struct client_src {
    const struct iovec *iov;
    size_t cnt;
    uint64_t len;
} client_src;

/* XXH3-64 of a key's bytes, range after range (the same as of them
 * concatenated); at most `len` bytes. */
static uint64_t client_src_checksum(const client_src *s, uint64_t len)
{
    if (s->cnt == 1)
        return moonlet_client_checksum(s->iov[0].iov_base, len < s->iov[0].iov_len ? len
                                                                                  : s->iov[0].iov_len);
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (size_t k = 0; k < s->cnt && len; k++) {
        size_t take = s->iov[k].iov_len < len ? s->iov[k].iov_len : (size_t)len;
        XXH3_64bits_update(&st, s->iov[k].iov_base, take);
        len -= take;
    }
    return XXH3_64bits_digest(&st);
}

/* Fills the writes of replica r from src (src->cnt operations, one per
 * range, at consecutive offsets) with its capability and the put's deadline
 * on our clock: sent_ms (when the master call that granted it was sent)
 * plus the put's TTL then, never later than the master's put deadline. */
static void client_put_op(client_direct *c, const moonlet_replica_desc *r, uint64_t put_ttl_ms,
                          const client_src *src, uint64_t sent_ms, moonlet_xfer_op *ops,
                          moonlet_xfer_cap *cap, moonlet_xfer **xf)
{
    *cap = (moonlet_xfer_cap){.offset = r->offset, .len = r->cap_len, .expiry_ms = r->cap_expiry_ms,
                              .tag = r->cap_tag, .deadline_ms = put_ttl_ms ? sent_ms + put_ttl_ms : 0};
    bool any = r->cap_tag || put_ttl_ms;
    uint64_t at = r->offset;
    for (size_t k = 0; k < src->cnt; k++) {
        ops[k] = (moonlet_xfer_op){.opcode = MOONLET_XFER_WRITE, .endpoint = r->endpoint,
                                   .segment_id = r->segment_id, .offset = at,
                                   .local = src->iov[k].iov_base, .len = src->iov[k].iov_len,
                                   .cap = any ? cap : NULL};
        at += src->iov[k].iov_len;
        client_op_route(c, r, &ops[k], &xf[k]);
    }
}

/* The writes of every replica of `l` (PutStart's list, sent at sent_ms):
 * replica k's are ops[k * src->cnt ...], its capability caps[k]. */
static void client_put_ops(client_direct *c, const moonlet_replica_list *l, const client_src *src,
                           uint64_t sent_ms, moonlet_xfer_op *ops, moonlet_xfer_cap *caps,
                           moonlet_xfer **xf)
{
    for (uint32_t k = 0; k < l->count; k++)
        client_put_op(c, &l->replicas[k], l->put_ttl_ms, src, sent_ms, &ops[k * src->cnt],
                      &caps[k], &xf[k * src->cnt]);
}

/* The status of replica k's writes: its first failure, else 0. */
static int client_replica_status(const moonlet_xfer_op *ops, uint32_t k, size_t nr)
{
    for (size_t r = 0; r < nr; r++)
        if (ops[k * nr + r].status)
            return ops[k * nr + r].status;
    return MOONLET_OK;
}

/* Whether a failed write may go to a replacement replica: the node could not
 * be reached or did not answer (TRANSFER_FAIL), no longer serves the segment
 * (SEGMENT_NOT_FOUND), or speaks no protocol of ours.  Never INVALID_WRITE:
 * the node refused the capability (expired: the put's deadline passed, no
 * replacement can be granted; or a key that changed): the put fails. */
bool moonlet_client_put_replaceable(int rc)
{
    return rc == MOONLET_ERR_TRANSFER_FAIL || rc == MOONLET_ERR_SEGMENT_NOT_FOUND ||
           rc == MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
}

#define CLIENT_PUT_MAX_ROUNDS 4 /* the master grants at most 4 replacements per put */
#define CLIENT_PUT_MAX_EXCLUDED 16

/* After a put's writes (ops[0..l->count), statuses set): each replica whose
 * write failed in a replaceable way is replaced through PutReplaceReplica
 * (excluding every segment seen failing for this put) and written again,
 * round after round, while the master grants replacements and the put's
 * deadline has not passed.  l's descriptors are swapped for the
 * replacements.  Returns the put's outcome: 0 when every replica is written,
 * else the first failure (the caller then revokes the put). */
static int client_put_retry(client_direct *c, const char *tenant, const char *key,
                            moonlet_replica_list *l, const client_src *src,
                            uint64_t put_deadline_ms, moonlet_xfer_op *ops,
                            moonlet_xfer_cap *caps, moonlet_xfer **xf)
{
    const char *excluded[CLIENT_PUT_MAX_EXCLUDED];
    char *owned[CLIENT_PUT_MAX_EXCLUDED];
    size_t nexcl = 0, nr = src->cnt;
    int rc = MOONLET_OK;
    for (uint32_t k = 0; k < l->count && !rc; k++)
        rc = client_replica_status(ops, k, nr);
    for (int round = 0; rc && round < CLIENT_PUT_MAX_ROUNDS; round++) {
        size_t *redo = malloc(l->count * nr * sizeof(*redo)), nredo = 0;
        if (!redo)
            break;
        int why = MOONLET_OK;
        for (uint32_t k = 0; k < l->count && !why; k++) {
            int st = client_replica_status(ops, k, nr);
            if (!st)
                continue;
            if (!moonlet_client_put_replaceable(st) ||
                (put_deadline_ms && moonlet_xfer_now_ms() >= put_deadline_ms)) {
                why = st;
                break;
            }
            moonlet_replica_desc *r = &l->replicas[k];
            bool seen = false;
            for (size_t e = 0; e < nexcl; e++)
                seen |= strcmp(excluded[e], r->segment_id) == 0;
            if (!seen && nexcl < CLIENT_PUT_MAX_EXCLUDED) {
                owned[nexcl] = strdup(r->segment_id);
                if (owned[nexcl]) {
                    excluded[nexcl] = owned[nexcl];
                    nexcl++;
                }
            }
            moonlet_replica_list nl;
            uint64_t sent = moonlet_xfer_now_ms();
            int rr = moonlet_mc_put_replace_replica(c->mc, tenant, key, r->segment_id, excluded,
                                                    nexcl, &nl);
            if (rr) {
                if (rr != MOONLET_ERR_INVALID_VERSION)
                    ML_WARN(MOD, "put of '%s': no replacement for the replica on %s (%s)", key,
                            r->segment_id, moonlet_strerror(rr));
                why = st;
                break;
            }
            ML_INFO(MOD, "put of '%s': replica on %s failed (%s), replaced by one on %s", key,
                    r->segment_id, moonlet_strerror(st), nl.replicas[0].segment_id);
            moonlet_replica_desc old = *r; /* swapped, so each list frees what it holds */
            *r = nl.replicas[0];
            nl.replicas[0] = old;
            client_put_op(c, r, nl.put_ttl_ms, src, sent, &ops[k * nr], &caps[k], &xf[k * nr]);
            moonlet_replica_list_free(&nl);
            for (size_t q = 0; q < nr; q++)
                redo[nredo++] = k * nr + q;
        }
        if (why) {
            free(redo);
            rc = why;
            break;
        }
        /* the replacements' writes, one batch */
        moonlet_xfer_op *sub = malloc(nredo * sizeof(*sub));
        moonlet_xfer **sxf = malloc(nredo * sizeof(*sxf));
        if (sub && sxf) {
            for (size_t j = 0; j < nredo; j++) {
                sub[j] = ops[redo[j]];
                sxf[j] = xf[redo[j]];
            }
            client_submit(c, sub, sxf, nredo);
            for (size_t j = 0; j < nredo; j++)
                ops[redo[j]].status = sub[j].status;
        } else {
            for (size_t j = 0; j < nredo; j++)
                ops[redo[j]].status = MOONLET_ERR_INTERNAL_ERROR;
        }
        free(sub);
        free(sxf);
        free(redo);
        rc = MOONLET_OK;
        for (uint32_t k = 0; k < l->count && !rc; k++)
            rc = client_replica_status(ops, k, nr);
    }
    for (size_t e = 0; e < nexcl; e++)
        free(owned[e]);
    return rc;
}

static void client_bput_window(client_direct *c, const client_put_args *a,
                               const char *const *keys, const client_src *srcs, size_t n,
                               int32_t *results);

/* A put is a batch of one (BatchPutStart, the writes, BatchPutEnd): the
 * same round trips as PutStart and PutEnd, and its PutEnd or PutRevoke
 * names its put (a late one never seals or revokes another writer's put of
 * the key); the single calls against an older master. */
static int client_put_core(client_direct *c, const char *key, const void *src, size_t len,
                           const moonlet_put_options *opt)
{
    client_put_args a = client_put_resolve(c, opt);
    struct iovec one = {(void *)src, len};
    client_src cs = {&one, 1, len};
    int32_t rc = MOONLET_OK;
    client_bput_window(c, &a, &key, &cs, 1, &rc);
    return rc;
}

static int direct_put(client_direct *c, const char *key, const void *buf, size_t len,
                      const moonlet_put_options *opt)
{
    client_stage st;
    int rc = client_stage_begin(c, (void *)buf, len, &st);
    if (rc)
        return rc;
    if (st.bounce)
        memcpy(st.bounce, buf, len);
    rc = client_put_core(c, key, st.ptr, len, opt);
    client_stage_end(c, &st);
    return rc;
}

static int direct_put_from(client_direct *c, const char *key, const void *buf, size_t len,
                           const moonlet_put_options *opt)
{
    if (!client_buf_covers(c, buf, len))
        return MOONLET_ERR_INVALID_PARAMS;
    return client_put_core(c, key, buf, len, opt);
}

static int direct_upsert(client_direct *c, const char *key, const void *buf, size_t len,
                         const moonlet_put_options *opt)
{
    int rc = direct_put(c, key, buf, len, opt);
    if (rc != MOONLET_ERR_OBJECT_ALREADY_EXISTS)
        return rc;
    rc = moonlet_mc_remove(c->mc, client_tenant(c, opt ? opt->tenant : NULL), key);
    if (rc && rc != MOONLET_ERR_OBJECT_NOT_FOUND)
        return rc;
    return direct_put(c, key, buf, len, opt);
}

/* ---- get ------------------------------------------------------------------------ */

/* GetReplicaList, remembering when it was asked (for the lease check). */
static int client_lookup(client_direct *c, const char *key, const char *tenant,
                         moonlet_replica_list *l, uint64_t *asked_ns)
{
    *asked_ns = moonlet_mono_ns();
    return moonlet_mc_get_replica_list(c->mc, client_tenant(c, tenant), key, l);
}

/* The end-to-end check of bytes read from replica r: 0, or INVALID_READ when
 * they are not the bytes the writer recorded (never returned as success). */
static int client_verify_src(client_direct *c, const moonlet_replica_list *l,
                             const client_src *dst, const moonlet_replica_desc *r)
{
    if (!c->checksum || !l->has_checksum || client_src_checksum(dst, l->size) == l->checksum)
        return MOONLET_OK;
    ML_WARN(MOD, "replica at %s segment %s offset %llu: checksum mismatch", r->endpoint,
            r->segment_id, (unsigned long long)r->offset);
    return MOONLET_ERR_INVALID_READ;
}

static int client_verify(client_direct *c, const moonlet_replica_list *l, const void *dst,
                         const moonlet_replica_desc *r)
{
    struct iovec one = {(void *)dst, l->size};
    client_src s = {&one, 1, l->size};
    return client_verify_src(c, l, &s, r);
}

/* Reads the object of `l` into dst (room for l->size bytes): the preferred
 * replica first, the next ones when a node is gone; then the lease check. */
static int client_read_object(client_direct *c, const moonlet_replica_list *l, void *dst,
                              uint64_t asked_ns)
{
    if (l->size == 0)
        return MOONLET_OK; /* no bytes a reclaimed lease could have changed */
    if (l->count == 0)
        return MOONLET_ERR_TRANSFER_FAIL;
    uint32_t *order = malloc(l->count * sizeof(*order));
    if (!order)
        return MOONLET_ERR_INTERNAL_ERROR;
    uint32_t n = moonlet_client_replica_order(l->replicas, l->count, c->own_endpoint, order);
    int rc = MOONLET_ERR_TRANSFER_FAIL;
    for (uint32_t k = 0; k < n; k++) {
        const moonlet_replica_desc *r = &l->replicas[order[k]];
        client_route rt;
        rc = client_route_of(c, r, &rt);
        if (rc == MOONLET_OK)
            rc = moonlet_xfer_read(rt.xfer, rt.endpoint, rt.segment_id, r->offset, dst, l->size);
        if (rc == MOONLET_OK)
            rc = client_verify(c, l, dst, r);
        if (!moonlet_client_try_next_replica(rc))
            break;
        ML_DEBUG(MOD, "replica at %s unreadable (%s), trying the next", r->endpoint,
                 moonlet_strerror(rc));
    }
    free(order);
    if (rc == MOONLET_OK && moonlet_client_lease_expired(asked_ns, l->lease_ttl_ms, moonlet_mono_ns()))
        rc = MOONLET_ERR_LEASE_EXPIRED;
    return rc;
}

/* Reads into caller memory, staging through a bounce buffer when needed. */
static int client_read_staged(client_direct *c, const moonlet_replica_list *l, void *dst,
                              uint64_t asked_ns)
{
    client_stage st;
    int rc = client_stage_begin(c, dst, l->size, &st);
    if (rc)
        return rc;
    rc = client_read_object(c, l, st.ptr, asked_ns);
    if (rc == MOONLET_OK && st.bounce)
        memcpy(dst, st.bounce, l->size);
    client_stage_end(c, &st);
    return rc;
}

/* get and get_into: lookup, size check, read. */
static int client_get_core(client_direct *c, const char *key, void *buf, size_t cap,
                           size_t *len, const char *tenant, bool staged)
{
    moonlet_replica_list l;
    uint64_t asked;
    int rc = client_lookup(c, key, tenant, &l, &asked);
    if (rc)
        return rc;
    *len = l.size > SIZE_MAX ? SIZE_MAX : (size_t)l.size;
    if (l.size > cap)
        rc = MOONLET_ERR_BUFFER_OVERFLOW;
    else
        rc = staged ? client_read_staged(c, &l, buf, asked) : client_read_object(c, &l, buf, asked);
    moonlet_replica_list_free(&l);
    return rc;
}

static int direct_get(client_direct *c, const char *key, void *buf, size_t cap, size_t *len,
                      const char *tenant)
{
    return client_get_core(c, key, buf, cap, len, tenant, true);
}

static int direct_get_into(client_direct *c, const char *key, void *buf, size_t cap,
                           size_t *len, const char *tenant)
{
    if (!client_buf_covers(c, buf, cap))
        return MOONLET_ERR_INVALID_PARAMS;
    return client_get_core(c, key, buf, cap, len, tenant, false);
}

static int direct_get_alloc(client_direct *c, const char *key, void **buf, size_t *len,
                            const char *tenant)
{
    moonlet_replica_list l;
    uint64_t asked;
    int rc = client_lookup(c, key, tenant, &l, &asked);
    if (rc)
        return rc;
    void *p = l.size < SIZE_MAX ? malloc(l.size ? (size_t)l.size : 1) : NULL;
    rc = p ? client_read_staged(c, &l, p, asked) : MOONLET_ERR_INTERNAL_ERROR;
    if (rc == MOONLET_OK) {
        *buf = p;
        *len = (size_t)l.size;
    } else {
        free(p);
    }
    moonlet_replica_list_free(&l);
    return rc;
}

static int direct_get_size(client_direct *c, const char *key, uint64_t *size,
                           const char *tenant)
{
    moonlet_replica_list l;
    uint64_t asked;
    int rc = client_lookup(c, key, tenant, &l, &asked);
    if (rc == MOONLET_OK)
        *size = l.size;
    moonlet_replica_list_free(&l);
    return rc;
}

/* ---- batches ---------------------------------------------------------------------- */

/*
 * A batch runs in windows of at most CLIENT_BATCH_WINDOW keys, one after the
 * other, so its descriptors stay bounded however many keys it has.  A
 * window makes one master call for its metadata (BatchPutStart, or
 * BatchGetReplicaList), then every transfer of the window goes in one
 * transport batch (pipelined on each node's connections), then a put window
 * makes one BatchPutEnd for the keys written and at most one BatchPutRevoke
 * for the rest.  A master that predates the batch methods, or refuses a
 * window as a whole with INVALID_PARAMS (a --max-batch-keys below the
 * window), gets the single calls instead, key by key, with the same
 * per-key results.
 */
#define CLIENT_BATCH_WINDOW 4096u

/* Whether a window's batch call should be made as single calls instead. */
static bool client_batch_fallback(int rc)
{
    return rc == MOONLET_ERR_INVALID_VERSION || rc == MOONLET_ERR_INVALID_PARAMS;
}

/* One window of a batch put, on its way. */
typedef struct client_bput {
    const client_put_args *a;
    size_t n, m;            /* keys in the window; of them, those sent to PutStart */
    size_t *idx;            /* idx[j]: the window's key of PutStart's j-th key */
    const char **keys;      /* the m keys, in PutStart order */
    uint64_t *sizes, *cks;  /* their sizes and checksums */
    uint64_t *put_ids;      /* BatchPutStart's id of each put (0: none, an older master) */
    moonlet_replica_list *lists;
    bool *started;          /* PutStart succeeded: the put must be sealed or revoked */
    int32_t *res;           /* PutStart's, then the writes', then PutEnd's per-key results */
} client_bput;

static void client_bput_free(client_bput *b)
{
    for (size_t j = 0; b->lists && j < b->m; j++)
        moonlet_replica_list_free(&b->lists[j]);
    free(b->idx);
    free(b->keys);
    free(b->sizes);
    free(b->cks);
    free(b->put_ids);
    free(b->lists);
    free(b->started);
    free(b->res);
}

/* PutStart of every key whose results[i] is 0 (its bytes are in registered
 * memory), one call (single calls against an older master). */
static int client_bput_start(client_direct *c, client_bput *b, const char *const *keys,
                             const client_src *srcs, const int32_t *results)
{
    size_t n = b->n ? b->n : 1;
    b->idx = malloc(n * sizeof(*b->idx));
    b->keys = malloc(n * sizeof(*b->keys));
    b->sizes = malloc(n * sizeof(*b->sizes));
    b->cks = calloc(n, sizeof(*b->cks));
    b->put_ids = calloc(n, sizeof(*b->put_ids));
    b->lists = calloc(n, sizeof(*b->lists));
    b->started = calloc(n, sizeof(*b->started));
    b->res = calloc(n, sizeof(*b->res));
    if (!b->idx || !b->keys || !b->sizes || !b->cks || !b->put_ids || !b->lists || !b->started ||
        !b->res)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (size_t i = 0; i < b->n; i++) {
        if (results[i])
            continue;
        b->idx[b->m] = i;
        b->keys[b->m] = keys[i];
        b->sizes[b->m++] = srcs[i].len;
    }
    const client_put_args *a = b->a;
    int rc = b->m ? moonlet_mc_batch_put_start(c->mc, a->tenant, b->keys, b->sizes, b->m,
                                               a->replica_num, a->soft_pin, &a->extra, b->lists,
                                               b->put_ids, b->res)
                  : MOONLET_OK; /* no key to start: no round trip */
    if (client_batch_fallback(rc)) {
        for (size_t j = 0; j < b->m; j++)
            b->res[j] = moonlet_mc_put_start_ex(c->mc, a->tenant, b->keys[j], b->sizes[j],
                                                a->replica_num, a->soft_pin, &a->extra,
                                                &b->lists[j]);
        rc = MOONLET_OK;
    }
    for (size_t j = 0; j < b->m; j++) {
        if (rc)
            b->res[j] = rc;
        b->started[j] = b->res[j] == MOONLET_OK;
    }
    return MOONLET_OK;
}

/* The writes of every started put, one transport batch; each key whose
 * replicas failed is then replaced key by key (client_put_retry).
 * b->res[j] becomes the outcome of key j's writes. */
static void client_bput_write(client_direct *c, client_bput *b, const client_src *srcs,
                              uint64_t sent_ms)
{
    size_t nops = 0, ncaps = 0;
    size_t *first = malloc((b->m ? b->m : 1) * sizeof(*first)); /* each key's first op */
    size_t *fcap = malloc((b->m ? b->m : 1) * sizeof(*fcap));    /* and capability */
    for (size_t j = 0; first && fcap && j < b->m; j++) {
        first[j] = nops;
        fcap[j] = ncaps;
        if (b->res[j] == MOONLET_OK) {
            nops += b->lists[j].count * srcs[b->idx[j]].cnt;
            ncaps += b->lists[j].count;
        }
    }
    moonlet_xfer_op *ops = calloc(nops ? nops : 1, sizeof(*ops));
    moonlet_xfer_cap *caps = calloc(ncaps ? ncaps : 1, sizeof(*caps));
    moonlet_xfer **xf = calloc(nops ? nops : 1, sizeof(*xf));
    if (!first || !fcap || !ops || !caps || !xf) {
        for (size_t j = 0; j < b->m; j++)
            if (b->res[j] == MOONLET_OK)
                b->res[j] = MOONLET_ERR_INTERNAL_ERROR;
        goto out;
    }
    for (size_t j = 0; j < b->m; j++) {
        if (b->res[j] != MOONLET_OK)
            continue;
        const client_src *src = &srcs[b->idx[j]];
        client_put_ops(c, &b->lists[j], src, sent_ms, &ops[first[j]], &caps[fcap[j]],
                       &xf[first[j]]);
        if (b->a->checksum)
            b->cks[j] = client_src_checksum(src, src->len);
    }
    client_submit(c, ops, xf, nops);
    for (size_t j = 0; j < b->m; j++) {
        if (b->res[j] != MOONLET_OK)
            continue;
        moonlet_replica_list *l = &b->lists[j];
        const client_src *src = &srcs[b->idx[j]];
        int rc = MOONLET_OK;
        for (uint32_t k = 0; k < l->count && !rc; k++)
            rc = client_replica_status(&ops[first[j]], k, src->cnt);
        if (rc) /* this key's failed replicas: replaced one key at a time */
            rc = client_put_retry(c, b->a->tenant, b->keys[j], l, src,
                                  l->put_ttl_ms ? sent_ms + l->put_ttl_ms : 0, &ops[first[j]],
                                  &caps[fcap[j]], &xf[first[j]]);
        b->res[j] = rc;
    }
out:
    free(first);
    free(fcap);
    free(ops);
    free(caps);
    free(xf);
}

/* Seals every put written (one BatchPutEnd) and revokes the others (one
 * BatchPutRevoke), as client_put_finish does for one put. */
static void client_bput_finish(client_direct *c, client_bput *b)
{
    const client_put_args *a = b->a;
    size_t nend = 0, nrev = 0, n = b->m ? b->m : 1;
    size_t *end = malloc(n * sizeof(*end));
    const char **ekeys = malloc(n * sizeof(*ekeys)), **rkeys = malloc(n * sizeof(*rkeys));
    uint64_t *eck = malloc(n * sizeof(*eck));
    uint64_t *eid = malloc(n * sizeof(*eid)), *rid = malloc(n * sizeof(*rid));
    int32_t *er = malloc(n * sizeof(*er));
    if (!end || !ekeys || !rkeys || !eck || !eid || !rid || !er) { /* one key at a time */
        for (size_t j = 0; j < b->m; j++)
            if (b->started[j])
                b->res[j] = client_put_finish(c, a->tenant, b->keys[j], b->res[j],
                                              a->checksum ? &b->cks[j] : NULL);
        goto out;
    }
    for (size_t j = 0; j < b->m; j++) {
        if (b->res[j] == MOONLET_OK) {
            end[nend] = j;
            eck[nend] = b->cks[j];
            eid[nend] = b->put_ids[j];
            ekeys[nend++] = b->keys[j];
        } else if (b->started[j]) {
            rid[nrev] = b->put_ids[j];
            rkeys[nrev++] = b->keys[j]; /* started, not written */
        }
    }
    /* each put named by its id: a late one never seals or revokes another's */
    int rc = nend ? moonlet_mc_batch_put_end(c->mc, a->tenant, ekeys, a->checksum ? eck : NULL,
                                             eid, nend, er)
                  : MOONLET_OK; /* nothing written: no round trip */
    if (client_batch_fallback(rc)) {
        for (size_t e = 0; e < nend; e++)
            er[e] = moonlet_mc_put_end_checksum(c->mc, a->tenant, ekeys[e],
                                                a->checksum ? &eck[e] : NULL);
        rc = MOONLET_OK;
    }
    for (size_t e = 0; e < nend; e++) {
        int r = rc ? rc : er[e];
        if (r) {
            ML_WARN(MOD, "PutEnd of '%s' failed: %s", ekeys[e], moonlet_strerror(r));
            rid[nrev] = eid[e];
            rkeys[nrev++] = ekeys[e];
        }
        b->res[end[e]] = r;
    }
    if (nrev) {
        rc = moonlet_mc_batch_put_revoke(c->mc, a->tenant, rkeys, rid, nrev, er);
        if (client_batch_fallback(rc)) {
            for (size_t r = 0; r < nrev; r++)
                er[r] = moonlet_mc_put_revoke(c->mc, a->tenant, rkeys[r]);
            rc = MOONLET_OK;
        }
        /* NOT_FOUND: the master already dropped it; INVALID_WRITE: a PutEnd
         * whose reply was lost did land. */
        for (size_t r = 0; r < nrev; r++) {
            int rv = rc ? rc : er[r];
            if (rv && rv != MOONLET_ERR_OBJECT_NOT_FOUND && rv != MOONLET_ERR_INVALID_WRITE)
                ML_WARN(MOD, "PutRevoke of '%s' failed (%s); the master reaps it after its put "
                        "timeout", rkeys[r], moonlet_strerror(rv));
        }
    }
out:
    free(end);
    free(ekeys);
    free(rkeys);
    free(eck);
    free(eid);
    free(rid);
    free(er);
}

/* One window of a batch put: results[0..n) set (those not 0 on entry are
 * keys refused already, left as they are). */
static void client_bput_window(client_direct *c, const client_put_args *a,
                               const char *const *keys, const client_src *srcs, size_t n,
                               int32_t *results)
{
    client_bput b = {.a = a, .n = n};
    uint64_t sent_ms = moonlet_xfer_now_ms();
    int rc = client_bput_start(c, &b, keys, srcs, results);
    if (rc == MOONLET_OK) {
        client_bput_write(c, &b, srcs, sent_ms);
        client_bput_finish(c, &b);
        for (size_t j = 0; j < b.m; j++)
            results[b.idx[j]] = b.res[j];
    } else {
        for (size_t i = 0; i < n; i++)
            if (!results[i])
                results[i] = rc;
    }
    client_bput_free(&b);
}

/* The first nonzero result in order (a batch call's return). */
static int client_first_error(const int32_t *results, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (results[i])
            return results[i];
    return MOONLET_OK;
}

/* A batch put of n keys whose sources srcs[] are built by `fill` window by
 * window (it sets results[i] to 0, or to the key's refusal). */
typedef void (*client_src_fill)(client_direct *c, const void *arg, size_t at, size_t w,
                                client_src *srcs, struct iovec *one, int32_t *results);

static int client_batch_put_srcs(client_direct *c, const char *const *keys, size_t n,
                                 const moonlet_put_options *opt, client_src_fill fill,
                                 const void *arg, int32_t *results)
{
    client_put_args a = client_put_resolve(c, opt);
    size_t cap = n < CLIENT_BATCH_WINDOW ? n : CLIENT_BATCH_WINDOW;
    client_src *srcs = malloc((cap ? cap : 1) * sizeof(*srcs));
    struct iovec *one = malloc((cap ? cap : 1) * sizeof(*one));
    if (!srcs || !one) {
        free(srcs);
        free(one);
        for (size_t i = 0; i < n; i++)
            results[i] = MOONLET_ERR_INTERNAL_ERROR;
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    for (size_t at = 0; at < n; at += CLIENT_BATCH_WINDOW) {
        size_t w = n - at < CLIENT_BATCH_WINDOW ? n - at : CLIENT_BATCH_WINDOW;
        fill(c, arg, at, w, srcs, one, results + at);
        client_bput_window(c, &a, keys + at, srcs, w, results + at);
    }
    free(srcs);
    free(one);
    return client_first_error(results, n);
}

/* batch_put_from's sources: one registered buffer per key. */
typedef struct client_bufs_arg {
    const void *const *bufs;
    const size_t *lens;
} client_bufs_arg;

static void client_fill_bufs(client_direct *c, const void *arg, size_t at, size_t w,
                             client_src *srcs, struct iovec *one, int32_t *results)
{
    const client_bufs_arg *b = arg;
    for (size_t i = 0; i < w; i++) {
        const void *p = b->bufs[at + i];
        size_t len = b->lens[at + i];
        one[i] = (struct iovec){(void *)p, len};
        srcs[i] = (client_src){&one[i], 1, len};
        results[i] = (!p && len) || !client_buf_covers(c, p, len) ? MOONLET_ERR_INVALID_PARAMS
                                                                   : MOONLET_OK;
    }
}

static int direct_batch_put_from(client_direct *c, const char *const *keys,
                                 const void *const *bufs, const size_t *lens, size_t n,
                                 const moonlet_put_options *opt, int32_t *results)
{
    client_bufs_arg arg = {bufs, lens};
    return client_batch_put_srcs(c, keys, n, opt, client_fill_bufs, &arg, results);
}

/* One key of a batch get while it runs. */
typedef struct client_bget {
    moonlet_replica_list l;
    uint64_t asked_ns;
    uint32_t *order;
    uint32_t norder, next; /* replicas to try, and the one being tried */
    bool pending;
    /* A disk replica into several ranges: its node serves only whole
     * objects, so it comes in here in one read and is scattered after. */
    void *whole;
} client_bget;

/* GetReplicaList of every key whose results[i] is 0 (its memory is
 * registered), one call (single calls against an older master). */
static void client_bget_meta(client_direct *c, const char *const *keys, size_t n,
                             int32_t *results, const char *tenant, client_bget *g)
{
    size_t m = 0, *idx = malloc((n ? n : 1) * sizeof(*idx));
    const char **mkeys = malloc((n ? n : 1) * sizeof(*mkeys));
    moonlet_replica_list *lists = calloc(n ? n : 1, sizeof(*lists));
    int32_t *res = calloc(n ? n : 1, sizeof(*res));
    if (!idx || !mkeys || !lists || !res) {
        for (size_t i = 0; i < n; i++)
            results[i] = MOONLET_ERR_INTERNAL_ERROR;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (results[i])
            continue;
        idx[m] = i;
        mkeys[m++] = keys[i];
    }
    tenant = client_tenant(c, tenant);
    uint64_t asked = moonlet_mono_ns();
    int rc = m ? moonlet_mc_batch_get_replica_list(c->mc, tenant, mkeys, m, lists, res)
               : MOONLET_OK; /* no key to look up: no round trip */
    bool single = client_batch_fallback(rc);
    for (size_t j = 0; j < m; j++) {
        client_bget *e = &g[idx[j]];
        if (single) {
            results[idx[j]] = client_lookup(c, mkeys[j], tenant, &e->l, &e->asked_ns);
        } else {
            results[idx[j]] = rc ? rc : res[j];
            e->l = lists[j]; /* taken: freed with the key */
            e->asked_ns = asked;
        }
    }
out:
    free(idx);
    free(mkeys);
    free(lists);
    free(res);
}

/* Lookups and size checks; leaves the keys that need a read pending. */
static void client_bget_lookup(client_direct *c, const char *const *keys, const client_src *dst,
                               size_t n, size_t *lens, int32_t *results, const char *tenant,
                               client_bget *g)
{
    for (size_t i = 0; i < n; i++)
        lens[i] = 0;
    client_bget_meta(c, keys, n, results, tenant, g);
    for (size_t i = 0; i < n; i++) {
        if (results[i])
            continue;
        lens[i] = g[i].l.size > SIZE_MAX ? SIZE_MAX : (size_t)g[i].l.size;
        if (g[i].l.size > dst[i].len) {
            results[i] = MOONLET_ERR_BUFFER_OVERFLOW;
        } else if (g[i].l.size && !g[i].l.count) {
            results[i] = MOONLET_ERR_TRANSFER_FAIL;
        } else if (g[i].l.size) {
            g[i].order = malloc(g[i].l.count * sizeof(*g[i].order));
            if (!g[i].order) {
                results[i] = MOONLET_ERR_INTERNAL_ERROR;
                continue;
            }
            g[i].norder = moonlet_client_replica_order(g[i].l.replicas, g[i].l.count,
                                                       c->own_endpoint, g[i].order);
            g[i].pending = true;
        }
    }
}

/* Copies len bytes of buf into the ranges of dst, in order. */
static void client_scatter(const client_src *dst, const void *buf, uint64_t len)
{
    uint64_t at = 0;
    for (size_t k = 0; k < dst->cnt && at < len; k++) {
        uint64_t take = len - at < dst->iov[k].iov_len ? len - at : dst->iov[k].iov_len;
        memcpy(dst->iov[k].iov_base, (const char *)buf + at, take);
        at += take;
    }
}

/* Reads of adjacent bytes into adjacent memory are merged up to this size:
 * small objects a batch put side by side come back in a few large reads. */
#define CLIENT_COALESCE_MAX (1u << 20)

/* Whether read b continues read a: the same transport, node and segment,
 * the next bytes there, the next bytes here, inside one registered buffer,
 * and the merged read no longer than CLIENT_COALESCE_MAX. */
static bool client_read_continues(client_direct *c, const moonlet_xfer_op *a, moonlet_xfer *xa,
                                  const moonlet_xfer_op *b, moonlet_xfer *xb)
{
    return xa && xa == xb && !a->status && !b->status && a->len + b->len <= CLIENT_COALESCE_MAX &&
           a->offset + a->len == b->offset && (char *)a->local + a->len == (char *)b->local &&
           strcmp(a->segment_id, b->segment_id) == 0 && strcmp(a->endpoint, b->endpoint) == 0 &&
           client_buf_covers(c, a->local, a->len + b->len);
}

/* client_submit of n reads, each run of reads that continue one another
 * (client_read_continues) sent as one; each read gets its run's status. */
static void client_submit_reads(client_direct *c, moonlet_xfer_op *ops, moonlet_xfer **xf,
                                size_t n)
{
    moonlet_xfer_op *m = malloc((n ? n : 1) * sizeof(*m));
    moonlet_xfer **mxf = malloc((n ? n : 1) * sizeof(*mxf));
    size_t *first = malloc((n + 1) * sizeof(*first)); /* run j: ops[first[j] .. first[j+1]) */
    if (!m || !mxf || !first) {
        client_submit(c, ops, xf, n);
        goto out;
    }
    size_t runs = 0;
    for (size_t k = 0; k < n; k++) {
        if (runs && client_read_continues(c, &m[runs - 1], mxf[runs - 1], &ops[k], xf[k])) {
            m[runs - 1].len += ops[k].len;
            continue;
        }
        first[runs] = k;
        m[runs] = ops[k];
        mxf[runs++] = xf[k];
    }
    first[runs] = n;
    client_submit(c, m, mxf, runs);
    for (size_t j = 0; j < runs; j++)
        for (size_t k = first[j]; k < first[j + 1]; k++)
            ops[k].status = m[j].status;
out:
    free(m);
    free(mxf);
    free(first);
}

/* One round: every pending key reads its current replica, all in one batch
 * (one read per destination range, the object's bytes in order).  ops,
 * xf and owner have room for every range of the window.  Returns how many
 * keys are still pending (to retry on their next replica). */
static size_t client_bget_round(client_direct *c, const client_src *dst, size_t n,
                                int32_t *results, client_bget *g, moonlet_xfer_op *ops,
                                moonlet_xfer **xf, size_t *owner)
{
    size_t nops = 0, left = 0;
    for (size_t i = 0; i < n; i++) {
        if (!g[i].pending)
            continue;
        const moonlet_replica_desc *r = &g[i].l.replicas[g[i].order[g[i].next]];
        uint64_t at = 0;
        if (r->disk && dst[i].cnt > 1 && g[i].l.size > dst[i].iov[0].iov_len) {
            free(g[i].whole);
            g[i].whole = malloc(g[i].l.size);
            ops[nops] = (moonlet_xfer_op){.opcode = MOONLET_XFER_READ, .endpoint = r->endpoint,
                                          .segment_id = r->segment_id, .offset = r->offset,
                                          .local = g[i].whole, .len = g[i].l.size};
            client_op_route(c, r, &ops[nops], &xf[nops]);
            if (!g[i].whole) {
                ops[nops].status = MOONLET_ERR_INTERNAL_ERROR;
                xf[nops] = NULL; /* not sent */
            }
            owner[nops++] = i;
            continue;
        }
        for (size_t k = 0; k < dst[i].cnt && at < g[i].l.size; k++) {
            uint64_t take = g[i].l.size - at < dst[i].iov[k].iov_len ? g[i].l.size - at
                                                                      : dst[i].iov[k].iov_len;
            if (!take)
                continue;
            ops[nops] = (moonlet_xfer_op){.opcode = MOONLET_XFER_READ, .endpoint = r->endpoint,
                                          .segment_id = r->segment_id, .offset = r->offset + at,
                                          .local = dst[i].iov[k].iov_base, .len = take};
            client_op_route(c, r, &ops[nops], &xf[nops]);
            owner[nops++] = i;
            at += take;
        }
    }
    client_submit_reads(c, ops, xf, nops);
    uint64_t done = moonlet_mono_ns();
    for (size_t k = 0; k < nops;) {
        size_t i = owner[k];
        client_bget *e = &g[i];
        int rc = MOONLET_OK;
        for (; k < nops && owner[k] == i; k++) /* the key's reads: its first failure */
            if (!rc)
                rc = ops[k].status;
        if (e->whole) { /* read whole from disk: into the caller's ranges */
            if (rc == MOONLET_OK)
                client_scatter(&dst[i], e->whole, e->l.size);
            free(e->whole);
            e->whole = NULL;
        }
        if (rc == MOONLET_OK)
            rc = client_verify_src(c, &e->l, &dst[i], &e->l.replicas[e->order[e->next]]);
        if (moonlet_client_try_next_replica(rc) && e->next + 1 < e->norder) {
            e->next++;
            left++;
            continue;
        }
        if (rc == MOONLET_OK && moonlet_client_lease_expired(e->asked_ns, e->l.lease_ttl_ms, done))
            rc = MOONLET_ERR_LEASE_EXPIRED;
        results[i] = rc;
        e->pending = false;
    }
    return left;
}

/* One window of a batch get: lookups in one call, then reads in rounds
 * (each pending key's next replica after a failure).  results[i] not 0 on
 * entry: a key refused already, left as it is. */
static void client_bget_window(client_direct *c, const char *const *keys, const client_src *dst,
                               size_t n, size_t *lens, int32_t *results, const char *tenant)
{
    size_t nr = 0;
    for (size_t i = 0; i < n; i++)
        nr += dst[i].cnt;
    client_bget *g = calloc(n ? n : 1, sizeof(*g));
    moonlet_xfer_op *ops = calloc(nr ? nr : 1, sizeof(*ops));
    size_t *owner = calloc(nr ? nr : 1, sizeof(*owner));
    moonlet_xfer **xf = calloc(nr ? nr : 1, sizeof(*xf));
    if (!g || !ops || !owner || !xf) {
        for (size_t i = 0; i < n; i++) {
            lens[i] = 0;
            results[i] = MOONLET_ERR_INTERNAL_ERROR;
        }
    } else {
        client_bget_lookup(c, keys, dst, n, lens, results, tenant, g);
        while (client_bget_round(c, dst, n, results, g, ops, xf, owner) > 0)
            ;
    }
    for (size_t i = 0; g && i < n; i++) {
        moonlet_replica_list_free(&g[i].l);
        free(g[i].order);
    }
    free(owner);
    free(ops);
    free(xf);
    free(g);
}

/* A batch get of n keys into destinations dst[] built by `fill` window by
 * window (as client_batch_put_srcs). */
static int client_batch_get_srcs(client_direct *c, const char *const *keys, size_t n,
                                 const char *tenant, client_src_fill fill, const void *arg,
                                 size_t *lens, int32_t *results)
{
    size_t cap = n < CLIENT_BATCH_WINDOW ? n : CLIENT_BATCH_WINDOW;
    client_src *dst = malloc((cap ? cap : 1) * sizeof(*dst));
    struct iovec *one = malloc((cap ? cap : 1) * sizeof(*one));
    if (!dst || !one) {
        free(dst);
        free(one);
        for (size_t i = 0; i < n; i++) {
            lens[i] = 0;
            results[i] = MOONLET_ERR_INTERNAL_ERROR;
        }
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    for (size_t at = 0; at < n; at += CLIENT_BATCH_WINDOW) {
        size_t w = n - at < CLIENT_BATCH_WINDOW ? n - at : CLIENT_BATCH_WINDOW;
        fill(c, arg, at, w, dst, one, results + at);
        client_bget_window(c, keys + at, dst, w, lens + at, results + at, tenant);
    }
    free(dst);
    free(one);
    return client_first_error(results, n);
}

static int direct_batch_get_into(client_direct *c, const char *const *keys,
                                 void *const *bufs, const size_t *caps, size_t n,
                                 size_t *lens, int32_t *results, const char *tenant)
{
    client_bufs_arg arg = {(const void *const *)bufs, caps};
    return client_batch_get_srcs(c, keys, n, tenant, client_fill_bufs, &arg, lens, results);
}

/* ---- batches from and into scattered ranges, in place ------------------------------ */

/* The ranged batches' sources: key i's iovcnt[i] ranges from iov + first[i]
 * (every nonempty one registered: checked before), one empty range for a
 * key without any. */
typedef struct client_ranges_arg {
    const struct iovec *iov;
    const size_t *iovcnt, *first, *lens;
} client_ranges_arg;

static const unsigned char client_empty[1];

static void client_fill_ranges(client_direct *c, const void *arg, size_t at, size_t w,
                               client_src *srcs, struct iovec *one, int32_t *results)
{
    const client_ranges_arg *r = arg;
    for (size_t i = 0; i < w; i++) {
        size_t k = at + i;
        results[i] = MOONLET_OK;
        if (r->iovcnt[k]) {
            srcs[i] = (client_src){r->iov + r->first[k], r->iovcnt[k], r->lens[k]};
        } else {
            one[i] = (struct iovec){(void *)client_empty, 0};
            srcs[i] = (client_src){&one[i], 1, 0};
        }
    }
}

/* Over TCP a transfer costs about as much as copying 100 KiB (a request
 * and its reply through both kernels), so ranges smaller than this on
 * average go faster copied into one staging region and sent as one
 * transfer per key (moonlet-bench batch, multi_8x8KiB: 8 KiB ranges moved
 * in place ran at 0.4-0.5 GB/s, staged at 1.0-1.5); over RDMA a work request
 * costs the host nothing and ranges always move in place. */
#define CLIENT_IN_PLACE_MIN_RANGE (128u << 10)

/* Each key's first range (first[], n entries), when every nonempty range
 * lies in registered memory and the ranges are worth moving in place (see
 * above); MOONLET_CLIENT_STAGE otherwise. */
static int client_ranges_plan(client_direct *c, const struct iovec *iov, const size_t *iovcnt,
                              size_t n, size_t **first)
{
    *first = malloc((n ? n : 1) * sizeof(**first));
    if (!*first)
        return MOONLET_ERR_INTERNAL_ERROR;
    size_t at = 0, nonempty = 0;
    uint64_t bytes = 0;
    int rc = MOONLET_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        (*first)[i] = at;
        for (size_t p = at; p < at + iovcnt[i] && !rc; p++) {
            if (!iov[p].iov_len)
                continue;
            if (!client_buf_covers(c, iov[p].iov_base, iov[p].iov_len))
                rc = MOONLET_CLIENT_STAGE;
            nonempty++;
            bytes += iov[p].iov_len;
        }
        at += iovcnt[i];
    }
    if (!rc && nonempty && strcmp(moonlet_xfer_protocol_name(c->xfer), "rdma") != 0 &&
        bytes / nonempty < CLIENT_IN_PLACE_MIN_RANGE)
        rc = MOONLET_CLIENT_STAGE;
    if (rc) {
        free(*first);
        *first = NULL;
    }
    return rc;
}

static int direct_batch_put_ranges(client_direct *c, const char *const *keys, size_t n,
                                   const struct iovec *iov, const size_t *iovcnt,
                                   const size_t *lens, const moonlet_put_options *opt,
                                   int32_t *results)
{
    size_t *first;
    int rc = client_ranges_plan(c, iov, iovcnt, n, &first);
    if (rc)
        return rc;
    client_ranges_arg arg = {iov, iovcnt, first, lens};
    rc = client_batch_put_srcs(c, keys, n, opt, client_fill_ranges, &arg, results);
    free(first);
    return rc;
}

static int direct_batch_get_ranges(client_direct *c, const char *const *keys, size_t n,
                                   const struct iovec *iov, const size_t *iovcnt,
                                   const size_t *caps, const char *tenant, size_t *sizes,
                                   int32_t *results)
{
    size_t *first;
    int rc = client_ranges_plan(c, iov, iovcnt, n, &first);
    if (rc)
        return rc;
    client_ranges_arg arg = {iov, iovcnt, first, caps};
    rc = client_batch_get_srcs(c, keys, n, tenant, client_fill_ranges, &arg, sizes, results);
    free(first);
    return rc;
}

/* ---- metadata-only calls ------------------------------------------------------------ */

static int direct_remove(client_direct *c, const char *key, const char *tenant, bool force)
{
    return moonlet_mc_remove_ex(c->mc, client_tenant(c, tenant), key, force);
}

static int direct_remove_all(client_direct *c, uint64_t *removed, const char *tenant, bool force)
{
    uint64_t n = 0;
    int rc = moonlet_mc_remove_all_ex(c->mc, client_tenant(c, tenant), force, &n);
    if (rc == MOONLET_OK && removed)
        *removed = n;
    return rc;
}

static int direct_exist_key(client_direct *c, const char *key, bool *exists,
                            const char *tenant)
{
    return moonlet_mc_exist_key(c->mc, client_tenant(c, tenant), key, exists);
}

static int direct_probe_key(client_direct *c, const char *key, bool *exists,
                            const char *tenant)
{
    return moonlet_mc_probe_key(c->mc, client_tenant(c, tenant), key, exists);
}

static int direct_batch_exist_key(client_direct *c, const char *const *keys, size_t n,
                                  int32_t *results, const char *tenant)
{
    return moonlet_mc_batch_exist_key(c->mc, client_tenant(c, tenant), keys, n, results);
}

static int direct_batch_probe_key(client_direct *c, moonlet_grant_lease_policy policy,
                                  const char *const *keys, size_t n, int32_t *results,
                                  const char *tenant)
{
    return moonlet_mc_batch_probe_key(c->mc, client_tenant(c, tenant), policy, keys, n, results);
}

static int direct_probe_resume(client_direct *c, const char *const *kv_keys, size_t n_kv,
                               const char *const *kda_keys, size_t n_kda,
                               uint64_t candidate_size, const uint64_t *boundaries, size_t nb,
                               moonlet_probe_resume_result *out, int32_t *mask,
                               const char *tenant)
{
    moonlet_mc_resume_out r;
    int rc = moonlet_mc_probe_resume(c->mc, client_tenant(c, tenant), kv_keys, n_kv, kda_keys,
                                     n_kda, candidate_size, boundaries, nb, &r, mask);
    if (rc == MOONLET_OK) {
        out->kv_prefix = r.kv_prefix;
        out->selected = r.selected;
    }
    return rc;
}

static int direct_inspect_key(client_direct *c, const char *key, const char *tenant,
                              char **json_out)
{
    cJSON *j = NULL;
    int rc = moonlet_mc_inspect_key(c->mc, client_tenant(c, tenant), key, &j);
    if (rc)
        return rc;
    *json_out = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return *json_out ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
}

/* One key's entry of moonlet_client_batch_replicas' array. */
static cJSON *client_replicas_json(const moonlet_replica_list *l, int rc)
{
    cJSON *e = cJSON_CreateObject();
    if (!e || rc) {
        if (e && !cJSON_AddNumberToObject(e, "error", rc)) {
            cJSON_Delete(e);
            e = NULL;
        }
        return e;
    }
    cJSON *reps = cJSON_CreateArray();
    bool ok = reps && cJSON_AddNumberToObject(e, "size", (double)l->size) &&
              cJSON_AddItemToObject(e, "replicas", reps);
    if (!ok)
        cJSON_Delete(reps);
    for (uint32_t k = 0; ok && k < l->count; k++) {
        const moonlet_replica_desc *r = &l->replicas[k];
        cJSON *o = cJSON_CreateObject();
        ok = o && cJSON_AddItemToArray(reps, o) &&
             cJSON_AddStringToObject(o, "segment_id", r->segment_id) &&
             cJSON_AddStringToObject(o, "endpoint", r->endpoint) &&
             cJSON_AddStringToObject(o, "protocol", r->protocol) &&
             cJSON_AddNumberToObject(o, "offset", (double)r->offset) &&
             cJSON_AddNumberToObject(o, "length", (double)r->size) &&
             cJSON_AddStringToObject(o, "status", r->status == MOONLET_REPLICA_COMPLETE
                                                      ? "COMPLETE" : "INITIALIZED") &&
             cJSON_AddStringToObject(o, "tier", r->disk ? "disk" : "dram");
    }
    if (!ok) {
        cJSON_Delete(e);
        return NULL;
    }
    return e;
}

static int direct_batch_replicas(client_direct *c, const char *const *keys, size_t n,
                                 const char *tenant, char **json_out)
{
    moonlet_replica_list *lists = calloc(n ? n : 1, sizeof(*lists));
    int32_t *res = calloc(n ? n : 1, sizeof(*res));
    cJSON *arr = cJSON_CreateArray();
    int rc = lists && res && arr ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
    tenant = client_tenant(c, tenant);
    if (!rc)
        rc = moonlet_mc_batch_get_replica_list(c->mc, tenant, keys, n, lists, res);
    if (client_batch_fallback(rc)) { /* an older master: one lookup per key */
        for (size_t i = 0; i < n; i++)
            res[i] = moonlet_mc_get_replica_list(c->mc, tenant, keys[i], &lists[i]);
        rc = MOONLET_OK;
    }
    for (size_t i = 0; i < n && !rc; i++) {
        cJSON *e = client_replicas_json(&lists[i], res[i]);
        if (!e || !cJSON_AddItemToArray(arr, e)) {
            cJSON_Delete(e);
            rc = MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    if (!rc) {
        *json_out = cJSON_PrintUnformatted(arr);
        rc = *json_out ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
    }
    for (size_t i = 0; lists && i < n; i++)
        moonlet_replica_list_free(&lists[i]);
    free(lists);
    free(res);
    cJSON_Delete(arr);
    return rc;
}

/* ---- create / destroy ------------------------------------------------------------------ */

/* The opts_size pattern (client.h): init writes only the caller's bytes;
 * every reader first copies the caller's struct into a full-size one whose
 * missing tail keeps the defaults (zero). */
void moonlet_client_config_init(moonlet_client_config *cfg, size_t cfg_size)
{
    if (!cfg || cfg_size < offsetof(moonlet_client_config, opts_size) + sizeof(cfg->opts_size))
        return;
    memset(cfg, 0, cfg_size < sizeof(*cfg) ? cfg_size : sizeof(*cfg));
    cfg->opts_size = cfg_size;
}

int moonlet_client_config_copy(moonlet_client_config *dst, const moonlet_client_config *src)
{
    memset(dst, 0, sizeof(*dst));
    if (!src || src->opts_size < offsetof(moonlet_client_config, opts_size) + sizeof(src->opts_size))
        return MOONLET_ERR_INVALID_PARAMS;
    memcpy(dst, src, src->opts_size < sizeof(*dst) ? src->opts_size : sizeof(*dst));
    dst->opts_size = sizeof(*dst);
    return MOONLET_OK;
}

static int client_xfer_protocol(moonlet_protocol p, moonlet_xfer_protocol *out)
{
    switch (p) {
    case MOONLET_PROTOCOL_AUTO: *out = MOONLET_XFER_AUTO; return MOONLET_OK;
    case MOONLET_PROTOCOL_TCP: *out = MOONLET_XFER_TCP; return MOONLET_OK;
    case MOONLET_PROTOCOL_RDMA: *out = MOONLET_XFER_RDMA; return MOONLET_OK;
    default: return MOONLET_ERR_INVALID_PARAMS;
    }
}

static void *client_node_main(void *arg)
{
    moonlet_store_node_run(arg);
    return NULL;
}

/* The local segment's disk tier (config local_disk_path): its paths, a
 * directory standing for the file moonlet-disk.tier in it, one after the
 * other in `files` (each NUL-terminated). */
#define CLIENT_DISK_FILE "/moonlet-disk.tier"
typedef struct client_disk_paths {
    char buf[4096];
    char files[4096 + MOONLET_DISK_MAX_PATHS * sizeof(CLIENT_DISK_FILE)];
    const char *paths[MOONLET_DISK_MAX_PATHS];
} client_disk_paths;

static int client_disk_config(const moonlet_client_config *cfg, client_disk_paths *d,
                              moonlet_store_node_config *nc)
{
    if (!*cfg->local_disk_path || strlen(cfg->local_disk_path) >= sizeof(d->buf))
        return MOONLET_ERR_INVALID_PARAMS;
    snprintf(d->buf, sizeof(d->buf), "%s", cfg->local_disk_path);
    uint32_t n = 0;
    size_t at = 0;
    char *save = NULL;
    for (char *t = strtok_r(d->buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == MOONLET_DISK_MAX_PATHS)
            return MOONLET_ERR_INVALID_PARAMS;
        struct stat st;
        bool dir = stat(t, &st) == 0 && S_ISDIR(st.st_mode);
        d->paths[n++] = d->files + at; /* the paths and 16 suffixes fit: no truncation */
        at += (size_t)snprintf(d->files + at, sizeof(d->files) - at, "%s%s", t,
                               dir ? CLIENT_DISK_FILE : "") + 1;
    }
    if (!n)
        return MOONLET_ERR_INVALID_PARAMS;
    uint64_t size = cfg->local_disk_size ? cfg->local_disk_size : 4 * cfg->local_segment_size;
    nc->disk_paths = d->paths;
    nc->ndisk_paths = n;
    nc->disk_size = size < (64u << 20) ? (64u << 20) : size;
    return MOONLET_OK;
}

/* The local segment: a store node on a thread of the client, configured by
 * `node` or, when NULL, from cfg. */
static int client_start_node(client_direct *c, const moonlet_client_config *cfg,
                             moonlet_xfer_protocol proto, const moonlet_store_node_config *node)
{
    moonlet_store_node_config nc;
    moonlet_store_node_config_default(&nc);
    nc.master_addr = cfg->master_addr;
    nc.segment_size = cfg->local_segment_size;
    nc.protocol = proto;
    nc.device = cfg->device;
    nc.rdma_tos = cfg->rdma_tos;
    nc.auth_token = cfg->auth_token;
    nc.tls = c->tls;
    if (cfg->local_listen_addr)
        nc.listen_addr = cfg->local_listen_addr;
    client_disk_paths disk;
    if (!node && cfg->local_disk_path) {
        int drc = client_disk_config(cfg, &disk, &nc);
        if (drc)
            return drc;
    }
    if (node)
        nc = *node;
    int rc = moonlet_store_node_create(&nc, &c->node);
    if (rc)
        return rc;
    if (moonlet_thread_create(&c->node_thread, client_node_main, c->node, "client-node") != 0) {
        moonlet_store_node_destroy(c->node);
        c->node = NULL;
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    snprintf(c->own_endpoint, sizeof(c->own_endpoint), "%s", moonlet_store_node_endpoint(c->node));
    return MOONLET_OK;
}

static int client_connect(client_direct *c, const moonlet_client_config *cfg,
                          moonlet_xfer_protocol proto, const moonlet_store_node_config *node)
{
    if (node && node->tls) {
        moonlet_tls_ctx_ref(node->tls);
        c->tls = node->tls;
    } else if (cfg->tls_ca || cfg->tls_cert || cfg->tls_key) {
        moonlet_tls_files tf = {.cert = cfg->tls_cert, .key = cfg->tls_key, .ca = cfg->tls_ca};
        int trc = moonlet_tls_ctx_create(false, &tf, &c->tls);
        if (trc)
            return trc;
    }
    moonlet_master_client_opts mo = {.timeout_ms = (int)(cfg->rpc_timeout_ms ? cfg->rpc_timeout_ms
                                                         : MOONLET_CLIENT_DEFAULT_TIMEOUT_MS),
                                     .auth_token = cfg->auth_token, .tls = c->tls};
    int rc = moonlet_mc_create(cfg->master_addr, &mo, &c->mc);
    if (rc)
        return rc;
    moonlet_xfer_opts xo = {.protocol = proto, .device = cfg->device,
                            .auth_token = cfg->auth_token,
                            .timeout_ms = cfg->transfer_timeout_ms,
                            .source_addr = cfg->source_addr, .rdma_tos = cfg->rdma_tos};
    rc = moonlet_xfer_create(&xo, &c->xfer);
    if (rc)
        return rc;
    /* Kept for a TCP instance made on first need (client_route). */
    c->tcp_opts = (moonlet_xfer_opts){.protocol = MOONLET_XFER_TCP,
                                      .timeout_ms = cfg->transfer_timeout_ms};
    if (cfg->auth_token && !(c->tcp_token = strdup(cfg->auth_token)))
        return MOONLET_ERR_INTERNAL_ERROR;
    c->tcp_opts.auth_token = c->tcp_token;
    atomic_store(&c->stage, strcmp(moonlet_xfer_protocol_name(c->xfer), "rdma") == 0);
    return node || cfg->local_segment_size ? client_start_node(c, cfg, proto, node) : MOONLET_OK;
}

static void direct_destroy(client_direct *c);

int moonlet_client_create_with_node(const moonlet_client_config *user_cfg,
                                    const moonlet_store_node_config *node, moonlet_client **out)
{
    moonlet_xfer_protocol proto;
    moonlet_client_config full;
    if (moonlet_client_config_copy(&full, user_cfg))
        return MOONLET_ERR_INVALID_PARAMS;
    const moonlet_client_config *cfg = &full;
    if (!out || !cfg->master_addr || !*cfg->master_addr ||
        client_xfer_protocol(cfg->protocol, &proto) ||
        (cfg->default_tenant && strlen(cfg->default_tenant) > MOONLET_MAX_ID_BYTES))
        return MOONLET_ERR_INVALID_PARAMS;
    client_direct *c = calloc(1, sizeof(*c));
    if (!c)
        return MOONLET_ERR_INTERNAL_ERROR;
    pthread_mutex_init(&c->buf_mu, NULL);
    pthread_mutex_init(&c->tcp_mu, NULL);
    client_stage_init(c);
    c->replica_num = cfg->replica_num ? cfg->replica_num : 1;
    c->checksum = !cfg->skip_checksum;
    int rc = MOONLET_OK;
    if (cfg->default_tenant && !(c->tenant = strdup(cfg->default_tenant)))
        rc = MOONLET_ERR_INTERNAL_ERROR;
    if (!rc)
        rc = client_connect(c, cfg, proto, node);
    if (!rc)
        rc = moonlet_client_wrap(&moonlet_client_direct_ops, c, out);
    if (!rc)
        moonlet_client_set_gpu_staging(*out, cfg->gpu_staging_size);
    if (rc) {
        direct_destroy(c);
    } else if ((rc = moonlet_client_start_metrics(*out, cfg)) != MOONLET_OK) {
        moonlet_client_destroy(*out); /* the handle owns c now */
        *out = NULL;
    }
    return rc;
}

int moonlet_client_create(const moonlet_client_config *cfg, moonlet_client **out)
{
    return moonlet_client_create_with_node(cfg, NULL, out);
}

static void direct_destroy(client_direct *c)
{
    if (!c)
        return;
    if (c->node) {
        moonlet_store_node_stop(c->node);
        pthread_join(c->node_thread, NULL);
        moonlet_store_node_destroy(c->node);
    }
    moonlet_xfer_destroy(c->xfer); /* also drops every buffer registration */
    moonlet_xfer_destroy(atomic_load(&c->xfer_tcp));
    pthread_mutex_destroy(&c->tcp_mu);
    free(c->tcp_token);
    moonlet_mc_destroy(c->mc);
    moonlet_tls_ctx_unref(c->tls);
    while (c->idle) {
        client_bounce *b = c->idle;
        c->idle = b->next;
        free(b->base);
        free(b);
    }
    pthread_mutex_destroy(&c->stage_mu);
    while (c->bufs) {
        client_buf *b = c->bufs;
        c->bufs = b->next;
        if (b->shared)
            free(b->base);
        free(b);
    }
    pthread_mutex_destroy(&c->buf_mu);
    free(c->tenant);
    free(c);
}

/* ---- accessors ---------------------------------------------------------------------------- */

static const char *direct_protocol(const client_direct *c)
{
    return moonlet_xfer_protocol_name(c->xfer);
}

static int direct_local_endpoint(const client_direct *c, char *buf, size_t cap)
{
    if (!c->own_endpoint[0])
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    size_t len = strlen(c->own_endpoint);
    if (len >= cap)
        return MOONLET_ERR_BUFFER_OVERFLOW;
    memcpy(buf, c->own_endpoint, len + 1);
    return MOONLET_OK;
}

const moonlet_client_ops moonlet_client_direct_ops = {
    .name = "direct",
    .shared_staging = false,
    .destroy = direct_destroy,
    .put = direct_put,
    .put_from = direct_put_from,
    .upsert = direct_upsert,
    .get = direct_get,
    .get_into = direct_get_into,
    .get_alloc = direct_get_alloc,
    .get_size = direct_get_size,
    .batch_put_from = direct_batch_put_from,
    .batch_get_into = direct_batch_get_into,
    .batch_put_ranges = direct_batch_put_ranges,
    .batch_get_ranges = direct_batch_get_ranges,
    .remove = direct_remove,
    .remove_all = direct_remove_all,
    .inspect_key = direct_inspect_key,
    .batch_replicas = direct_batch_replicas,
    .exist_key = direct_exist_key,
    .probe_key = direct_probe_key,
    .batch_exist_key = direct_batch_exist_key,
    .batch_probe_key = direct_batch_probe_key,
    .probe_resume = direct_probe_resume,
    .register_buffer = direct_register_buffer,
    .register_device = direct_register_device,
    .unregister_buffer = direct_unregister_buffer,
    .alloc_shared = direct_alloc_shared,
    .free_shared = direct_free_shared,
    .protocol = direct_protocol,
    .local_endpoint = direct_local_endpoint,
};
