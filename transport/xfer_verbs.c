/*
 * xfer_verbs.c - the RDMA verbs backend of the data-plane transport (xfer.h),
 * written for clusters of ConnectX-class NICs (RC queue pairs, rdma_cm).
 *
 * It follows the order of rdma-core's rping.c / rc_pingpong.c and names the
 * steps the same way:
 *   discovery   the device the listen address (else the source address) is
 *               on, found by binding a throw-away cm_id to it; without an
 *               address, the named device or the first with an ACTIVE port
 *               (`auto`: InfiniBand-transport devices only).  None, or an
 *               address on no RDMA device (127.0.0.1) ->
 *               UNAVAILABLE_IN_CURRENT_STATUS with one ERROR line, which
 *               lets `auto` fall back to TCP.  ibv_fork_init once.
 *   PD          one protection domain per device, allocated on the verbs
 *               context rdma_cm uses for it (rdma_get_devices): the
 *               instance's own device (segments, serving), and for client
 *               connections the device each one's address resolved to (a
 *               table of up to VERBS_MAX_DEVS; multi-NIC hosts).
 *   MR          segments: LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE; client
 *               buffers: LOCAL_WRITE, one MR per device (the instance's at
 *               registration, another device's at first use there).
 *   server      rdma_create_event_channel / rdma_create_id / rdma_bind_addr /
 *               rdma_listen; a CM thread accepts each CONNECT_REQUEST whose
 *               private data carries a valid proof of a token (challenge-
 *               response, see VERBS_AUTH_* below), creating an RC
 *               QP (and a 2-entry CQ) for it, with responder_resources =
 *               the peer's initiator depth (as rdma_cm reports it on the
 *               passive side), capped by the device.
 *               Peers use one-sided operations, so the only WRs a served
 *               QP posts are keepalive probes (verbs_keepalive, counting
 *               misses by keepalive.c): a client that vanished without a
 *               disconnect is reaped.
 *   client      per connection: event channel, rdma_resolve_addr (bound to
 *               source_addr; 200 ms attempts) -> TOS -> rdma_resolve_route ->
 *               completion channel, CQ, QP -> rdma_connect -> ESTABLISHED,
 *               all within timeout_ms.  After connect the CM channel is
 *               watched: DISCONNECTED fails a running lane (its failed
 *               operations marked conn_failed, so xfer.c reissues them once
 *               on a fresh connection) and makes xfer.c reopen the
 *               connection before its next use (conn_stale).
 *   transfer    IBV_WR_RDMA_READ / IBV_WR_RDMA_WRITE, split at 1 MiB (or
 *               the port's smaller max_msg_sz), posted as one chain per pass
 *               (sq_sig_all = 0; every 16th WR and the last of a chain
 *               signalled; a completion retires the earlier unsignalled WRs
 *               in order), writes of at most the granted max_inline_data
 *               (256 asked) sent IBV_SEND_INLINE, at most max_send_wr WRs
 *               (unsignalled ones included) and 2 MiB in flight per QP.  The CQ is
 *               polled; after 50 us without progress the thread sleeps on
 *               the CQs' completion channels and the CM channels instead of
 *               spinning a core through a stall.  A lane with no
 *               completion for timeout_ms is timed out: its QP is moved to ERR
 *               and its flushed completions drained before the QP is destroyed.
 *   errors      every error work completion becomes TRANSFER_FAIL with a log
 *               line naming ibv_wc_status_str() and what it usually means.
 *
 * The rkey and remote VA travel inside the segment id
 * ("<id>.<rkey>.<base>.<size>", hex), so the first operation needs no extra
 * round trip, and a client checks bounds before posting.
 *
 * Resource lifetimes (explicit, as in SPDK's nvmf/rdma.c): the instance owns
 * the device list, PD, listen id and event channel; a served
 * connection owns its cm_id, CQ and QP; a client connection owns its event
 * channel, cm_id, completion channel, CQ and QP; each MR belongs to its
 * segment or buffer.
 * Everything is released in the reverse order of creation.
 *
 * Threads (serving side): the CM thread accepts, handles CM events and
 * probes served connections (keepalive; it never blocks);
 * the reaper thread disconnects and destroys served connections (either can
 * block in the kernel for seconds when a peer is unreachable, and accepting
 * must never wait for that).
 *
 * Locks: `lock` guards the segment list, the served- and client-connection
 * lists and the reaper's queue (with reap_cond); it is never held while
 * waiting for a CM event or destroying an id (the keepalive pass polls the
 * served QPs' own CQs under it, without waiting).  `dev_lock` guards adding
 * a device to the table and registering a buffer on a further device; the
 * two are never held together.  Client connections are owned by one batch
 * at a time (xfer.c) and take no lock.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <xxhash.h>

#include "cred.h"
#include "log.h"
#include "monotime.h"
#include "moonlet/error.h"
#include "xfer_internal.h"
#include "keepalive.h"
#include "thread.h"

#define MOD "xfer-rdma"

#define VERBS_CONN_MAGIC 0x4d4c5856u /* 'MLXV' */
#define VERBS_RC_CHALLENGE 1 /* verbs_expect: the node answered with a challenge */
#define VERBS_CONN_VERSION 2u /* 2: challenge-response (1 sent a digest of the token) */
#define VERBS_SEND_DEPTH 128u        /* max_send_wr per client QP */
#define VERBS_POLL_BATCH 32
#define VERBS_SIGNAL_EVERY 16u       /* signal every Nth WR (and the last of a chain) */
#define VERBS_INLINE_WANT 256u       /* max_inline_data asked for at QP creation */
#define VERBS_DRAIN_MS 1000u         /* bound on draining flushed WRs */
/* Largest work request: a stall is noticed per chunk, and a lossy or slow
 * fabric (or Soft-RoCE) completes something at least every chunk. */
#define VERBS_CHUNK_BYTES (1u << 20)
/* Bytes in flight per connection.  Enough for any real fabric's
 * bandwidth-delay product; more only overruns a receiver (Soft-RoCE over a
 * veth drops packets and then crawls through go-back-N retransmissions). */
#define VERBS_LANE_INFLIGHT_BYTES (2u << 20)

/*
 * Authentication (issue 33): a challenge-response in two connect requests.
 * The first asks (auth VERBS_AUTH_ASK); a node with a token rejects it with
 * a challenge: a nonce it drew, kept in a slot of its table (VERBS_CHAL_SLOTS,
 * the CM thread's alone) for one use within the transfer timeout.  The
 * client connects again with a proof (VERBS_AUTH_PROOF): the slot, its
 * generation, a client nonce and the HMAC-SHA-256 under the SHA-256 of its
 * token of the label, "rdma" and both nonces (common/cred.h).  The node
 * frees the slot whatever the proof, so a captured connect request replayed
 * finds its slot used (or reused under another generation) and is rejected
 * ILLEGAL_CLIENT.  The token never travels.
 */
#define VERBS_AUTH_NONE 0u  /* no token: a node without one accepts it */
#define VERBS_AUTH_ASK 1u   /* send me a challenge */
#define VERBS_AUTH_PROOF 2u /* the proof for a challenge */
#define VERBS_CHAL_SLOTS 256u
#define VERBS_CNONCE_BYTES 12u
#define VERBS_REJ_CHALLENGE 1 /* verbs_conn_rej.status of a challenge (not an error code) */

/* Private data of a connect request (exactly the 56 bytes RC allows). */
typedef struct verbs_conn_req {
    uint32_t magic;
    uint8_t version;
    uint8_t auth;   /* VERBS_AUTH_* */
    uint16_t slot;  /* PROOF: the challenge's slot */
    uint32_t gen;   /* PROOF: its generation */
    uint8_t cnonce[VERBS_CNONCE_BYTES];
    uint8_t mac[MOONLET_CRED_MAC_BYTES];
} verbs_conn_req;
_Static_assert(sizeof(verbs_conn_req) == 56, "RC connect private data is 56 bytes");

/* Private data of a reject; a challenge adds its slot, generation and nonce. */
typedef struct verbs_conn_rej {
    uint32_t magic;
    int32_t status; /* a moonlet error code, or VERBS_REJ_CHALLENGE */
} verbs_conn_rej;

typedef struct verbs_conn_chal {
    verbs_conn_rej rej;
    uint16_t slot;
    uint16_t reserved;
    uint32_t gen;
    uint8_t nonce[MOONLET_CRED_NONCE_BYTES];
} verbs_conn_chal;

/* A challenge a node issued (the CM thread's table). */
typedef struct verbs_chal {
    uint8_t nonce[MOONLET_CRED_NONCE_BYTES];
    uint32_t gen;
    uint64_t expiry_ms; /* 0: free or used */
} verbs_chal;

typedef struct verbs_seg {
    uint64_t id;
    struct ibv_mr *mr;
    struct verbs_seg *next;
} verbs_seg;

/* One RDMA device client connections were resolved to: its rdma_cm verbs
 * context, one PD, and the limits its QPs use.  devs[0] is the instance's
 * own device (v->ctx, v->pd: segments and serving); others are added when a
 * connection's address resolves to them (multi-NIC hosts). */
#define VERBS_MAX_DEVS 8

typedef struct verbs_dev {
    struct ibv_context *ctx; /* owned by rdma_cm (cm_devs / the cm_id) */
    struct ibv_pd *pd;
    char name[64];
    uint32_t max_msg;
    uint8_t max_init_rd_atom;
} verbs_dev;

/* A local buffer's registrations: one MR per device, registered on the
 * instance's device at once and on another device at its first use there. */
typedef struct verbs_buf {
    void *base;
    size_t len;
    int dmabuf_fd; /* device memory registered through a dma-buf (ours); -1: none */
    uint64_t dmabuf_off;
    struct ibv_mr *_Atomic mr[VERBS_MAX_DEVS];
} verbs_buf;

/* The buffer's memory region on protection domain pd. */
static struct ibv_mr *verbs_buf_reg(struct ibv_pd *pd, const verbs_buf *b)
{
    if (b->dmabuf_fd >= 0)
        return ibv_reg_dmabuf_mr(pd, b->dmabuf_off, b->len, (uint64_t)(uintptr_t)b->base,
                                 b->dmabuf_fd, IBV_ACCESS_LOCAL_WRITE);
    return ibv_reg_mr(pd, b->base, b->len, IBV_ACCESS_LOCAL_WRITE);
}

/* An id (with its QP, if any) waiting for the reaper. */
typedef struct verbs_reap {
    struct rdma_cm_id *id;
    struct ibv_cq *cq; /* its served connection's CQ (destroyed after the QP), or NULL */
    struct verbs_reap *next;
} verbs_reap;

/* A connection this instance accepted. */
typedef struct verbs_sconn {
    struct rdma_cm_id *id;
    struct ibv_cq *cq;        /* its own CQ: only keepalive probes complete */
    moonlet_keepalive ka;     /* probes outstanding, misses, next deadline (keepalive.c) */
    struct verbs_sconn *next;
} verbs_sconn;

typedef struct verbs_state {
    struct ibv_context **cm_devs; /* rdma_get_devices() */
    struct ibv_context *ctx;      /* the chosen device, owned by cm_devs */
    char dev_name[64];
    uint8_t port;
    uint32_t max_msg;             /* port max_msg_sz */
    uint8_t max_rd_atom;          /* device max_qp_rd_atom */
    uint8_t max_init_rd_atom;     /* device max_qp_init_rd_atom */
    struct ibv_pd *pd;
    verbs_chal chal[VERBS_CHAL_SLOTS]; /* serving: challenges issued (CM thread only) */
    uint32_t chal_next, chal_gen;      /* CM thread only */

    struct rdma_event_channel *ec; /* server */
    struct rdma_cm_id *listen_id;
    uint64_t next_keepalive_ms;   /* CM thread: next keepalive pass */
    pthread_t cm_thread;
    bool cm_started;
    atomic_bool stopping;
    atomic_bool device_gone;      /* DEVICE_REMOVAL or a fatal async event */

    /* Teardown of served connections runs on the reaper thread, never on the
     * CM thread: rdma_destroy_id (and rdma_disconnect) can block in the
     * kernel for seconds - until the CM's DREQ/DREP exchange with a peer that
     * is unreachable (link down, host gone) times out - and every connect
     * request waited behind it.  Queue under `lock`, signalled by reap_cond. */
    struct verbs_reap *reap;
    pthread_cond_t reap_cond;
    pthread_t reap_thread;
    bool reap_started;

    pthread_mutex_t lock;
    verbs_seg *segs;
    verbs_sconn *sconns;
    struct verbs_cconn *cconns;   /* open client connections (for qp_info) */

    /* Devices of client connections (devs[0]: this instance's own).  An
     * entry is written under dev_lock before ndevs counts it and never
     * changes afterwards; dev_lock also serialises the lazy registration of
     * a buffer on another device.  Never held with `lock`. */
    pthread_mutex_t dev_lock;
    verbs_dev devs[VERBS_MAX_DEVS];
    _Atomic size_t ndevs;
} verbs_state;

typedef struct verbs_cconn {
    struct rdma_event_channel *ec;
    struct rdma_cm_id *id;
    struct ibv_cq *cq;
    struct ibv_comp_channel *cc; /* the CQ's completion channel (waits after a spin) */
    char endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1];
    size_t dev;               /* index in verbs_state.devs: the resolved device */
    uint32_t max_msg;         /* its device's largest WR */
    bool dead;                /* its CM channel reported the peer gone */
    uint64_t next_watch_ms;   /* next look at the CM channel during a transfer */
    uint32_t max_send;        /* WRs outstanding on its SQ, signalled or not */
    uint32_t max_inline;      /* max_inline_data the device granted */
    uint64_t next_seq;        /* wr_id of its next WR */
    uint64_t established_ms;  /* when the peer's process accepted it (moonlet_xfer_now_ms) */
    bool chal_got;            /* the node rejected us with a challenge: */
    verbs_conn_chal chal;     /* that challenge */
    /* counters for qp_info (written by the batch that owns it, read under lock) */
    _Atomic uint64_t wrs, post_calls, cqes;
    struct verbs_cconn *next; /* in verbs_state.cconns, under lock */
} verbs_cconn;

/* ---- discovery ---------------------------------------------------------- */

/* First ACTIVE port of an open device, or 0. */
static uint8_t verbs_active_port(struct ibv_context *ctx)
{
    struct ibv_device_attr da;
    if (ibv_query_device(ctx, &da))
        return 0;
    for (uint8_t p = 1; p <= da.phys_port_cnt; p++) {
        struct ibv_port_attr pa;
        if (ibv_query_port(ctx, p, &pa) == 0 && pa.state == IBV_PORT_ACTIVE)
            return p;
    }
    return 0;
}

/* Finds the device to use; fills name and port.  why gets the reason.
 * ib_only (auto): only InfiniBand-transport devices (IB and RoCE NICs, rxe),
 * not iWARP or EFA, whose semantics this backend was not written for. */
static int verbs_discover(const char *want, bool ib_only, char *name, size_t name_cap,
                          uint8_t *port, char *why, size_t why_cap)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        snprintf(why, why_cap, "no RDMA device found");
        if (list)
            ibv_free_device_list(list);
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    }
    int rc = MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    snprintf(why, why_cap, want ? "no RDMA device named %s" : "no RDMA device with an ACTIVE port",
             want ? want : "");
    for (int i = 0; i < n && rc; i++) {
        const char *dn = ibv_get_device_name(list[i]);
        if (want && strcmp(dn, want) != 0)
            continue;
        if (ib_only && list[i]->transport_type != IBV_TRANSPORT_IB) {
            snprintf(why, why_cap, "RDMA device %s is not an InfiniBand-transport device "
                     "(iWARP/EFA are not used by auto)", dn);
            continue;
        }
        struct ibv_context *ctx = ibv_open_device(list[i]);
        uint8_t p = ctx ? verbs_active_port(ctx) : 0;
        if (ctx)
            ibv_close_device(ctx);
        if (p) {
            snprintf(name, name_cap, "%s", dn);
            *port = p;
            rc = MOONLET_OK;
        } else if (want) {
            snprintf(why, why_cap, "RDMA device %s has no ACTIVE port", want);
        }
    }
    ibv_free_device_list(list);
    return rc;
}

/* Parses an IP ("host" or "host:port") into a sockaddr with port 0 or the
 * given port; *wildcard says whether it is INADDR_ANY / in6addr_any. */
static int verbs_parse_addr(const char *addr, bool with_port, struct sockaddr_storage *ss,
                            bool *wildcard)
{
    char host[256], port_s[8] = "0";
    uint16_t port = 0;
    if (with_port) {
        if (moonlet_net_split_hostport(addr, host, sizeof(host), &port))
            return MOONLET_ERR_INVALID_PARAMS;
        snprintf(port_s, sizeof(port_s), "%u", port);
    } else {
        if (!addr || strlen(addr) >= sizeof(host))
            return MOONLET_ERR_INVALID_PARAMS;
        snprintf(host, sizeof(host), "%s", addr);
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
    struct addrinfo *res;
    if (getaddrinfo(host, port_s, &hints, &res))
        return MOONLET_ERR_INVALID_PARAMS;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    if (ss->ss_family == AF_INET)
        *wildcard = ((struct sockaddr_in *)ss)->sin_addr.s_addr == htonl(INADDR_ANY);
    else
        *wildcard = IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)ss)->sin6_addr);
    return MOONLET_OK;
}

/* The RDMA device and port an IP address belongs to, found the way rdma_cm
 * finds it: a throw-away cm_id bound to the address (port 0).  An address of
 * no RDMA interface (127.0.0.1, a plain NIC) binds with no device. */
static int verbs_addr_device(const char *addr, bool with_port, char *name, size_t name_cap,
                             uint8_t *port, char *why, size_t why_cap)
{
    struct sockaddr_storage ss;
    bool wildcard;
    if (verbs_parse_addr(addr, with_port, &ss, &wildcard)) {
        snprintf(why, why_cap, "cannot parse address %s", addr);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
    struct rdma_cm_id *id;
    if (rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP)) {
        snprintf(why, why_cap, "rdma_create_id: %s", strerror(errno));
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    }
    int rc = MOONLET_OK;
    if (rdma_bind_addr(id, (struct sockaddr *)&ss)) {
        snprintf(why, why_cap, "cannot bind RDMA to %s: %s", addr, strerror(errno));
        rc = MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    } else if (!id->verbs) {
        snprintf(why, why_cap, "address %s is on no RDMA device (RDMA exists only on the "
                 "addresses of RDMA interfaces, never on loopback)", addr);
        rc = MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    } else {
        snprintf(name, name_cap, "%s", ibv_get_device_name(id->verbs->device));
        *port = id->port_num ? id->port_num : verbs_active_port(id->verbs);
    }
    rdma_destroy_id(id);
    return rc;
}

/* Is addr ("host:port" or "host") a wildcard address? */
static bool verbs_is_wildcard(const char *addr, bool with_port)
{
    struct sockaddr_storage ss;
    bool wildcard = false;
    return verbs_parse_addr(addr, with_port, &ss, &wildcard) == MOONLET_OK && wildcard;
}

/* Picks the device: the one the listen address, else the source address, is
 * on; else the named one, or the first ACTIVE one.  A named device must be
 * the address's. */
static int verbs_pick_device(const char *want, const char *listen_addr, const char *source_addr,
                             bool ib_only, char *name, size_t name_cap, uint8_t *port,
                             char *why, size_t why_cap)
{
    const char *addr = NULL;
    bool with_port = false;
    if (listen_addr && !verbs_is_wildcard(listen_addr, true)) {
        addr = listen_addr;
        with_port = true;
    } else if (source_addr && !verbs_is_wildcard(source_addr, false)) {
        addr = source_addr;
    }
    int rc = verbs_discover(addr ? NULL : want, ib_only, name, name_cap, port, why, why_cap);
    if (rc || !addr)
        return rc; /* no usable device at all, or the device is not tied to an address */
    rc = verbs_addr_device(addr, with_port, name, name_cap, port, why, why_cap);
    if (rc)
        return rc;
    if (want && strcmp(want, name) != 0) {
        snprintf(why, why_cap, "address %s is on RDMA device %s, not on %s", addr, name, want);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    return MOONLET_OK;
}

int moonlet_xfer_verbs_probe(const char *device, const char *listen_addr, char *why,
                             size_t why_cap)
{
    char name[64];
    uint8_t port;
    return verbs_pick_device(device, listen_addr, NULL, true, name, sizeof(name), &port, why,
                             why_cap);
}

/* ---- PD and device context ---------------------------------------------- */

/* Picks rdma_cm's context for the chosen device, queries limits, allocates
 * the PD. */
static int verbs_open_pd(verbs_state *v)
{
    int n = 0;
    v->cm_devs = rdma_get_devices(&n);
    for (int i = 0; v->cm_devs && i < n; i++)
        if (strcmp(ibv_get_device_name(v->cm_devs[i]->device), v->dev_name) == 0)
            v->ctx = v->cm_devs[i];
    if (!v->ctx) {
        ML_ERR(MOD, "rdma_cm does not see device %s", v->dev_name);
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    }
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    if (ibv_query_device(v->ctx, &da) || ibv_query_port(v->ctx, v->port, &pa)) {
        ML_ERR(MOD, "cannot query %s: %s", v->dev_name, strerror(errno));
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    }
    v->max_msg = pa.max_msg_sz && pa.max_msg_sz < VERBS_CHUNK_BYTES ? pa.max_msg_sz
                                                                    : VERBS_CHUNK_BYTES;
    v->max_rd_atom = (uint8_t)(da.max_qp_rd_atom > 255 ? 255 : da.max_qp_rd_atom);
    v->max_init_rd_atom = (uint8_t)(da.max_qp_init_rd_atom > 255 ? 255 : da.max_qp_init_rd_atom);
    v->pd = ibv_alloc_pd(v->ctx);
    if (!v->pd) {
        ML_ERR(MOD, "ibv_alloc_pd on %s: %s", v->dev_name, strerror(errno));
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    v->devs[0] = (verbs_dev){.ctx = v->ctx, .pd = v->pd, .max_msg = v->max_msg,
                             .max_init_rd_atom = v->max_init_rd_atom};
    snprintf(v->devs[0].name, sizeof(v->devs[0].name), "%s", v->dev_name);
    atomic_store(&v->ndevs, 1);
    return MOONLET_OK;
}

/* The device table index of a client connection's resolved verbs context,
 * adding it (its PD allocated) on first sight; -1 when the table is full or
 * the device cannot be used. */
static int verbs_dev_get(verbs_state *v, struct ibv_context *ctx, uint8_t port)
{
    int idx = -1;
    pthread_mutex_lock(&v->dev_lock);
    size_t n = atomic_load(&v->ndevs);
    for (size_t i = 0; i < n && idx < 0; i++)
        if (v->devs[i].ctx == ctx)
            idx = (int)i;
    if (idx < 0 && n < VERBS_MAX_DEVS) {
        verbs_dev *d = &v->devs[n];
        struct ibv_device_attr da;
        struct ibv_port_attr pa;
        snprintf(d->name, sizeof(d->name), "%s", ibv_get_device_name(ctx->device));
        if (ibv_query_device(ctx, &da) || ibv_query_port(ctx, port ? port : 1, &pa)) {
            ML_WARN(MOD, "cannot query %s: %s", d->name, strerror(errno));
        } else if (!(d->pd = ibv_alloc_pd(ctx))) {
            ML_WARN(MOD, "ibv_alloc_pd on %s: %s", d->name, strerror(errno));
        } else {
            d->ctx = ctx;
            d->max_msg = pa.max_msg_sz && pa.max_msg_sz < VERBS_CHUNK_BYTES ? pa.max_msg_sz
                                                                            : VERBS_CHUNK_BYTES;
            d->max_init_rd_atom =
                (uint8_t)(da.max_qp_init_rd_atom > 255 ? 255 : da.max_qp_init_rd_atom);
            ML_INFO(MOD, "client connections also use device %s (its own PD)", d->name);
            idx = (int)n;
            atomic_store(&v->ndevs, n + 1);
        }
    } else if (idx < 0) {
        ML_WARN(MOD, "more than %d RDMA devices in use: %s not used", VERBS_MAX_DEVS,
                ibv_get_device_name(ctx->device));
    }
    pthread_mutex_unlock(&v->dev_lock);
    return idx;
}

/* ---- serving side ------------------------------------------------------- */

enum verbs_auth_verdict { AUTH_OK, AUTH_REFUSED, AUTH_CHALLENGE };

/* Whether a connect request may be accepted (CM thread; see VERBS_AUTH_*):
 * a PROOF uses its challenge up, whatever it proves. */
static enum verbs_auth_verdict verbs_auth(moonlet_xfer *x, verbs_state *v, const void *pdata,
                                          uint8_t len)
{
    if (!x->token)
        return AUTH_OK;
    verbs_conn_req req;
    if (!pdata || len < sizeof(req))
        return AUTH_REFUSED;
    memcpy(&req, pdata, sizeof(req));
    if (req.magic != VERBS_CONN_MAGIC || req.version != VERBS_CONN_VERSION)
        return AUTH_REFUSED;
    if (req.auth == VERBS_AUTH_ASK)
        return AUTH_CHALLENGE;
    if (req.auth != VERBS_AUTH_PROOF || req.slot >= VERBS_CHAL_SLOTS)
        return AUTH_REFUSED;
    verbs_chal *ch = &v->chal[req.slot];
    bool live = ch->expiry_ms && ch->gen == req.gen && moonlet_xfer_now_ms() < ch->expiry_ms;
    uint8_t cn[MOONLET_CRED_NONCE_BYTES] = {0};
    memcpy(cn, req.cnonce, sizeof(req.cnonce));
    bool ok = live && moonlet_cred_mac_check((const uint8_t(*)[32])x->auth_keys, x->nauth_keys,
                                             x->auth_key, "rdma", ch->nonce, cn, req.mac);
    if (ch->gen == req.gen) { /* one use */
        ch->expiry_ms = 0;
        explicit_bzero(ch->nonce, sizeof(ch->nonce));
    }
    return ok ? AUTH_OK : AUTH_REFUSED;
}

static void verbs_reject(struct rdma_cm_id *id, int status)
{
    verbs_conn_rej rej = {.magic = VERBS_CONN_MAGIC, .status = status};
    rdma_reject(id, &rej, (uint8_t)sizeof(rej));
}

/* Rejects a request that asked for a challenge with a fresh one (CM thread). */
static void verbs_challenge(moonlet_xfer *x, verbs_state *v, struct rdma_cm_id *id)
{
    uint32_t slot = v->chal_next++ % VERBS_CHAL_SLOTS; /* the oldest: reused */
    verbs_chal *ch = &v->chal[slot];
    moonlet_cred_nonce(ch->nonce);
    ch->gen = ++v->chal_gen;
    ch->expiry_ms = moonlet_xfer_now_ms() + x->timeout_ms;
    verbs_conn_chal c = {.rej = {.magic = VERBS_CONN_MAGIC, .status = VERBS_REJ_CHALLENGE},
                         .slot = (uint16_t)slot, .gen = ch->gen};
    memcpy(c.nonce, ch->nonce, sizeof(c.nonce));
    rdma_reject(id, &c, (uint8_t)sizeof(c));
}

/* CONNECT_REQUEST: checks the proof (or sends a challenge), creates the QP, accepts. */
static void verbs_on_connect_request(moonlet_xfer *x, verbs_state *v, struct rdma_cm_event *ev)
{
    struct rdma_cm_id *id = ev->id;
    enum verbs_auth_verdict a =
        verbs_auth(x, v, ev->param.conn.private_data, ev->param.conn.private_data_len);
    if (a == AUTH_CHALLENGE) {
        verbs_challenge(x, v, id);
        id->context = NULL; /* destroyed after the event is acked */
        return;
    }
    if (a != AUTH_OK) {
        ML_WARN(MOD, "connection refused: no valid auth proof (a wrong token, an older "
                "client, or a replayed connect request)");
        verbs_reject(id, MOONLET_ERR_ILLEGAL_CLIENT);
        id->context = NULL; /* destroyed after the event is acked */
        return;
    }
    verbs_sconn *sc = calloc(1, sizeof(*sc));
    /* Its own CQ: the only WRs this QP ever posts are keepalive probes, at
     * most MOONLET_KEEPALIVE_MISSES at a time (max_send_wr), and it never
     * posts a receive, so MISSES + 1 entries can never overrun, whatever
     * happens to other connections. */
    struct ibv_cq *cq = sc && id->verbs == v->ctx
                            ? ibv_create_cq(v->ctx, MOONLET_KEEPALIVE_MISSES + 1, NULL, NULL, 0)
                            : NULL;
    struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq,
                                  .cap = {.max_send_wr = MOONLET_KEEPALIVE_MISSES, .max_recv_wr = 1,
                                          .max_send_sge = 1, .max_recv_sge = 1},
                                  .qp_type = IBV_QPT_RC, .sq_sig_all = 1};
    if (!sc || id->verbs != v->ctx || !cq || rdma_create_qp(id, v->pd, &qa)) {
        ML_WARN(MOD, "cannot accept connection: %s",
                !sc ? "out of memory" : id->verbs != v->ctx ? "arrived on another device"
                                                            : strerror(errno));
        if (cq)
            ibv_destroy_cq(cq);
        free(sc);
        verbs_reject(id, MOONLET_ERR_INTERNAL_ERROR);
        id->context = NULL;
        return;
    }
    /* On the passive side the request's values are already seen from this
     * side (rdma_cm swaps them, as rping's server relies on):
     * param.conn.responder_resources is the READs the peer wants to have in
     * flight towards us (its initiator_depth) and initiator_depth what it can
     * serve.  So our responder_resources, which becomes this QP's
     * max_dest_rd_atomic, is the peer's wish capped by our device, and at
     * least 1: with 0 every RDMA READ of the peer fails. */
    uint8_t want_resp = ev->param.conn.responder_resources;
    uint8_t want_init = ev->param.conn.initiator_depth;
    struct rdma_conn_param cp = {
        .responder_resources = want_resp < v->max_rd_atom ? want_resp : v->max_rd_atom,
        .initiator_depth = want_init < v->max_init_rd_atom ? want_init : v->max_init_rd_atom,
        .retry_count = 7, .rnr_retry_count = 7};
    if (cp.responder_resources == 0)
        cp.responder_resources = v->max_rd_atom ? 1 : 0;
    sc->id = id;
    sc->cq = cq;
    moonlet_keepalive_init(&sc->ka, moonlet_xfer_now_ms(), x->keepalive_ms);
    id->context = sc;
    if (rdma_accept(id, &cp)) {
        ML_WARN(MOD, "rdma_accept: %s", strerror(errno));
        rdma_destroy_qp(id);
        ibv_destroy_cq(cq);
        id->context = NULL;
        free(sc);
        return;
    }
    pthread_mutex_lock(&v->lock);
    sc->next = v->sconns;
    v->sconns = sc;
    pthread_mutex_unlock(&v->lock);
}

/* Unlinks a served connection; its id is destroyed by the caller. */
static void verbs_sconn_unlink(verbs_state *v, verbs_sconn *sc)
{
    pthread_mutex_lock(&v->lock);
    verbs_sconn **pp = &v->sconns;
    while (*pp && *pp != sc)
        pp = &(*pp)->next;
    if (*pp)
        *pp = sc->next;
    pthread_mutex_unlock(&v->lock);
}

/* Hands an id (and its served connection's CQ, if any) to the reaper
 * (after its event was acked). */
static void verbs_reap_push(verbs_state *v, struct rdma_cm_id *id, struct ibv_cq *cq)
{
    verbs_reap *r = malloc(sizeof(*r));
    if (!r) { /* out of memory: destroy here rather than leak */
        if (id->qp)
            rdma_destroy_qp(id);
        if (cq)
            ibv_destroy_cq(cq);
        rdma_destroy_id(id);
        return;
    }
    r->id = id;
    r->cq = cq;
    pthread_mutex_lock(&v->lock);
    r->next = v->reap;
    v->reap = r;
    pthread_cond_signal(&v->reap_cond);
    pthread_mutex_unlock(&v->lock);
}

/* The reaper: disconnects and destroys what the CM thread queued, until
 * stopping and the queue is empty. */
static void *verbs_reap_main(void *arg)
{
    verbs_state *v = arg;
    pthread_mutex_lock(&v->lock);
    for (;;) {
        verbs_reap *r = v->reap;
        if (!r) {
            if (atomic_load(&v->stopping))
                break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&v->reap_cond, &v->lock, &ts);
            continue;
        }
        v->reap = r->next;
        pthread_mutex_unlock(&v->lock);
        if (r->id->qp) {
            rdma_disconnect(r->id);
            rdma_destroy_qp(r->id);
        }
        if (r->cq)
            ibv_destroy_cq(r->cq);
        uint64_t t0 = moonlet_xfer_now_ms();
        rdma_destroy_id(r->id);
        uint64_t ms = moonlet_xfer_now_ms() - t0;
        if (ms > 500)
            ML_DEBUG(MOD, "tearing a served connection down took %" PRIu64 " ms", ms);
        free(r);
        pthread_mutex_lock(&v->lock);
    }
    pthread_mutex_unlock(&v->lock);
    return NULL;
}

/* Handles one CM event; the id to destroy after the ack goes to *dead (its
 * CQ to *dead_cq). */
static void verbs_on_cm_event(moonlet_xfer *x, verbs_state *v, struct rdma_cm_event *ev,
                              struct rdma_cm_id **dead, struct ibv_cq **dead_cq)
{
    switch (ev->event) {
    case RDMA_CM_EVENT_CONNECT_REQUEST:
        verbs_on_connect_request(x, v, ev);
        if (!ev->id->context)
            *dead = ev->id;
        break;
    case RDMA_CM_EVENT_ESTABLISHED:
        ML_DEBUG(MOD, "peer connected");
        break;
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_REJECTED:
        /* ids born from the listen id inherit its NULL context until accepted */
        if (ev->id != v->listen_id && ev->id->context) {
            verbs_sconn *sc = ev->id->context;
            verbs_sconn_unlink(v, sc); /* QP, CQ and id: the reaper's */
            *dead_cq = sc->cq;
            free(sc);
            ev->id->context = NULL;
            *dead = ev->id;
        }
        break;
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
        if (!atomic_exchange(&v->device_gone, true))
            ML_ERR(MOD, "RDMA device %s removed: this instance can no longer serve",
                   v->dev_name);
        break;
    default:
        ML_DEBUG(MOD, "cm event %s", rdma_event_str(ev->event));
        break;
    }
}

/* The device's asynchronous events (non-blocking, bounded): a fatal device
 * error marks the instance unhealthy; port changes are logged. */
static void verbs_async_events(verbs_state *v)
{
    for (int i = 0; i < 16; i++) {
        struct ibv_async_event ae;
        if (ibv_get_async_event(v->ctx, &ae))
            break;
        enum ibv_event_type t = ae.event_type;
        ibv_ack_async_event(&ae);
        if (t == IBV_EVENT_DEVICE_FATAL) {
            if (!atomic_exchange(&v->device_gone, true))
                ML_ERR(MOD, "RDMA device %s: fatal error, this instance can no longer serve",
                       v->dev_name);
        } else if (t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_PORT_ACTIVE) {
            ML_WARN(MOD, "RDMA device %s: %s", v->dev_name, ibv_event_type_str(t));
        } else {
            ML_DEBUG(MOD, "RDMA device %s: %s", v->dev_name, ibv_event_type_str(t));
        }
    }
}

static int verbs_health(moonlet_xfer *x)
{
    verbs_state *v = x->be_state;
    return v && atomic_load(&v->device_gone) ? MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS
                                             : MOONLET_OK;
}

/*
 * Keepalive of served connections (CM thread).  Peers use one-sided
 * operations only, so a client that vanishes without a disconnect (power
 * loss, a pulled cable, a kernel panic) leaves nothing for this side to
 * notice: its QP, CQ and cm_id would stay forever.  Every keepalive_ms each
 * served QP posts one signalled zero-length RDMA WRITE (no SGE; the IB spec,
 * C9-88, has the responder skip the R_Key and VA checks of a zero-length
 * operation - rxe and mlx5 do - and the client's QP allows remote writes,
 * as rdma_cm sets up every RC QP).  It costs one packet and its ACK and
 * consumes nothing at the client.  While a probe is unacknowledged, every
 * keepalive_ms / MOONLET_KEEPALIVE_MISSES without an acknowledgement is a
 * miss and another probe follows (its packet makes the client's side NAK a
 * lost earlier one, so a lost probe or ACK costs one interval, not the QP's
 * ~1 s ack timeout); MOONLET_KEEPALIVE_MISSES consecutive misses
 * (keepalive_ms after the first unacknowledged probe), or a probe that
 * completes with an error (retries exhausted, the QP in error), tear the
 * connection down (the reaper frees it).  One late or lost probe no longer
 * ends a healthy connection (keepalive.c has the counting); a vanished
 * client is still reaped within about 2 x keepalive_ms.  The bound is this
 * deadline, not the QP's retry_count x ack timeout (rdma_cm's default for
 * RoCE is ~1 s x 7 retries), so it holds on any fabric.  The pass runs every
 * VERBS_KEEPALIVE_TICK_MS, or every miss interval when that is shorter.
 */
#define VERBS_KEEPALIVE_TICK_MS 50u

static uint64_t verbs_keepalive_tick_ms(const moonlet_xfer *x)
{
    uint64_t iv = moonlet_keepalive_interval(x->keepalive_ms);
    return iv < VERBS_KEEPALIVE_TICK_MS ? iv : VERBS_KEEPALIVE_TICK_MS;
}

/* One served QP's pass: drains its probes' completions, then asks
 * keepalive.c what is due.  Returns NULL, or why the connection is gone. */
static const char *verbs_keepalive_one(moonlet_xfer *x, verbs_sconn *sc, uint64_t now)
{
    struct ibv_wc wc[MOONLET_KEEPALIVE_MISSES + 1];
    int n = ibv_poll_cq(sc->cq, (int)(MOONLET_KEEPALIVE_MISSES + 1), wc);
    if (n < 0)
        return "ibv_poll_cq failed";
    for (int i = 0; i < n; i++) {
        if (wc[i].status != IBV_WC_SUCCESS)
            return ibv_wc_status_str(wc[i].status);
        moonlet_keepalive_acked(&sc->ka, now, x->keepalive_ms);
    }
    switch (moonlet_keepalive_tick(&sc->ka, now, x->keepalive_ms)) {
    case MOONLET_KEEPALIVE_WAIT:
        return NULL;
    case MOONLET_KEEPALIVE_GONE:
        return "no acknowledgement of its probes within keepalive_ms";
    case MOONLET_KEEPALIVE_PROBE:
        break;
    }
    if (sc->ka.misses)
        ML_DEBUG(MOD, "keepalive: %u consecutive misses, probing again", sc->ka.misses);
    struct ibv_send_wr wr = {.wr_id = 1, .sg_list = NULL, .num_sge = 0,
                             .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
    struct ibv_send_wr *bad = NULL;
    int err = ibv_post_send(sc->id->qp, &wr, &bad);
    if (err)
        return strerror(err);
    moonlet_keepalive_posted(&sc->ka, now, x->keepalive_ms);
    return NULL;
}

static void verbs_keepalive(moonlet_xfer *x, verbs_state *v, uint64_t now)
{
    verbs_sconn *dead = NULL;
    pthread_mutex_lock(&v->lock);
    verbs_sconn **pp = &v->sconns;
    while (*pp) {
        verbs_sconn *sc = *pp;
        const char *why = verbs_keepalive_one(x, sc, now);
        if (!why) {
            pp = &sc->next;
            continue;
        }
        char peer[MOONLET_MAX_ENDPOINT_BYTES + 1] = "?";
        moonlet_xfer_format_endpoint(rdma_get_peer_addr(sc->id), peer, sizeof(peer));
        ML_WARN(MOD, "served connection from %s: keepalive probe failed (%s): tearing it down",
                peer, why);
        *pp = sc->next;
        sc->next = dead;
        dead = sc;
    }
    pthread_mutex_unlock(&v->lock);
    while (dead) {
        verbs_sconn *sc = dead;
        dead = sc->next;
        /* later CM events of this id (DISCONNECTED, TIMEWAIT_EXIT) find no
         * context and are ignored: this thread is the one that reads them */
        sc->id->context = NULL;
        verbs_reap_push(v, sc->id, sc->cq);
        free(sc);
    }
}

static void *verbs_cm_main(void *arg)
{
    moonlet_xfer *x = arg;
    verbs_state *v = x->be_state;
    while (!atomic_load(&v->stopping)) {
        struct pollfd p[2] = {{.fd = v->ec->fd, .events = POLLIN},
                              {.fd = v->ctx->async_fd, .events = POLLIN}};
        /* wake for the next keepalive pass at the latest (and every 100 ms
         * at the latest, to notice `stopping`) */
        uint64_t due = v->next_keepalive_ms, t = moonlet_xfer_now_ms();
        int wait_ms = due <= t ? 0 : due - t < 100 ? (int)(due - t) : 100;
        int np = poll(p, 2, wait_ms);
        uint64_t now = moonlet_xfer_now_ms();
        if (now >= v->next_keepalive_ms) {
            v->next_keepalive_ms = now + verbs_keepalive_tick_ms(x);
            verbs_keepalive(x, v, now);
        }
        if (np <= 0)
            continue;
        if (p[1].revents & POLLIN)
            verbs_async_events(v);
        if (!(p[0].revents & POLLIN))
            continue;
        struct rdma_cm_event *ev;
        if (rdma_get_cm_event(v->ec, &ev))
            continue;
        struct rdma_cm_id *dead = NULL;
        struct ibv_cq *dead_cq = NULL;
        verbs_on_cm_event(x, v, ev, &dead, &dead_cq);
        rdma_ack_cm_event(ev);
        if (dead)
            verbs_reap_push(v, dead, dead_cq);
    }
    return NULL;
}

static int verbs_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Resolves "host:port" to a sockaddr for rdma_cm. */
static int verbs_resolve(const char *endpoint, bool passive, struct sockaddr_storage *ss)
{
    char host[256], port_s[8];
    uint16_t port;
    if (moonlet_net_split_hostport(endpoint, host, sizeof(host), &port))
        return MOONLET_ERR_INVALID_PARAMS;
    snprintf(port_s, sizeof(port_s), "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    struct addrinfo *res;
    if (getaddrinfo(host, port_s, &hints, &res))
        return MOONLET_ERR_INVALID_PARAMS;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return MOONLET_OK;
}

/* rdma_create_event_channel / rdma_create_id / rdma_bind_addr / rdma_listen. */
static int verbs_listen(moonlet_xfer *x, verbs_state *v)
{
    struct sockaddr_storage ss;
    if (verbs_resolve(x->listen_addr, true, &ss))
        return MOONLET_ERR_INVALID_PARAMS;
    v->ec = rdma_create_event_channel();
    if (!v->ec || verbs_set_nonblock(v->ec->fd) ||
        rdma_create_id(v->ec, &v->listen_id, NULL, RDMA_PS_TCP)) {
        ML_ERR(MOD, "rdma_create_id: %s", strerror(errno));
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    uint8_t tos = (uint8_t)x->rdma_tos; /* accepted connections inherit it */
    if (x->rdma_tos && rdma_set_option(v->listen_id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos,
                                       sizeof(tos))) {
        ML_ERR(MOD, "cannot set TOS %d: %s", x->rdma_tos, strerror(errno));
        return MOONLET_ERR_INVALID_PARAMS;
    }
    if (rdma_bind_addr(v->listen_id, (struct sockaddr *)&ss) || rdma_listen(v->listen_id, 128)) {
        ML_ERR(MOD, "cannot listen on %s: %s", x->listen_addr, strerror(errno));
        return MOONLET_ERR_TRANSFER_FAIL;
    }
    if (v->listen_id->verbs && v->listen_id->verbs != v->ctx) {
        ML_ERR(MOD, "listen address %s is not on device %s", x->listen_addr, v->dev_name);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    return moonlet_xfer_format_endpoint(rdma_get_local_addr(v->listen_id), x->endpoint,
                                        sizeof(x->endpoint));
}

/* ---- lifetime ----------------------------------------------------------- */

static void verbs_free(verbs_state *v)
{
    verbs_sconn *sc = v->sconns;
    while (sc) { /* reverse order of creation: QP, then id */
        verbs_sconn *next = sc->next;
        rdma_disconnect(sc->id);
        rdma_destroy_qp(sc->id);
        ibv_destroy_cq(sc->cq);
        rdma_destroy_id(sc->id);
        free(sc);
        sc = next;
    }
    verbs_seg *g = v->segs;
    while (g) {
        verbs_seg *next = g->next;
        ibv_dereg_mr(g->mr);
        free(g);
        g = next;
    }
    if (v->listen_id)
        rdma_destroy_id(v->listen_id);
    if (v->ec)
        rdma_destroy_event_channel(v->ec);
    for (size_t i = 1; i < atomic_load(&v->ndevs); i++)
        ibv_dealloc_pd(v->devs[i].pd);
    if (v->pd)
        ibv_dealloc_pd(v->pd);
    pthread_mutex_destroy(&v->dev_lock);
    if (v->cm_devs)
        rdma_free_devices(v->cm_devs);
    pthread_mutex_destroy(&v->lock);
    pthread_cond_destroy(&v->reap_cond);
    free(v);
}

/* RLIMIT_MEMLOCK as text ("unlimited" or bytes). */
static const char *verbs_memlock_str(char *buf, size_t cap)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl))
        snprintf(buf, cap, "unknown");
    else if (rl.rlim_cur == RLIM_INFINITY)
        snprintf(buf, cap, "unlimited");
    else
        snprintf(buf, cap, "%llu bytes", (unsigned long long)rl.rlim_cur);
    return buf;
}

/* A failed ibv_reg_mr: names RLIMIT_MEMLOCK when that is the likely cause. */
static void verbs_reg_failed(const char *what, uint64_t len, int err)
{
    char lim[32];
    if (err == ENOMEM || err == EPERM || err == EAGAIN)
        ML_ERR(MOD, "ibv_reg_mr of %s of %" PRIu64 " bytes: %s; RLIMIT_MEMLOCK is %s "
               "(pinned memory: raise it, e.g. LimitMEMLOCK=infinity or ulimit -l unlimited)",
               what, len, strerror(err), verbs_memlock_str(lim, sizeof(lim)));
    else
        ML_ERR(MOD, "ibv_reg_mr of %s of %" PRIu64 " bytes: %s", what, len, strerror(err));
}

/* Once per process, before this backend's first verbs call: fork safety for
 * registered memory (a no-op where the kernel provides it, >= 5.13). */
static void verbs_fork_init(void)
{
    int rc = ibv_fork_init();
    ML_DEBUG(MOD, "ibv_fork_init: %s (%s)", rc ? strerror(rc) : "ok",
             ibv_is_fork_initialized() == IBV_FORK_UNNEEDED ? "the kernel is fork safe"
                                                            : "userspace fork protection");
}

static int verbs_start(moonlet_xfer *x)
{
    static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
    pthread_once(&fork_once, verbs_fork_init);
    verbs_state *v = calloc(1, sizeof(*v));
    if (!v)
        return MOONLET_ERR_INTERNAL_ERROR;
    pthread_mutex_init(&v->lock, NULL);
    pthread_mutex_init(&v->dev_lock, NULL);
    pthread_cond_init(&v->reap_cond, NULL);
    char why[256];
    int rc = verbs_pick_device(x->device, x->listen_addr, x->source_addr, false, v->dev_name,
                               sizeof(v->dev_name), &v->port, why, sizeof(why));
    if (rc) {
        ML_ERR(MOD, "rdma unavailable: %s", why);
        verbs_free(v);
        return rc;
    }
    x->be_state = v;
    rc = verbs_open_pd(v);
    if (rc == MOONLET_OK && x->listen_addr)
        rc = verbs_listen(x, v);
    if (rc == MOONLET_OK && x->listen_addr) {
        rc = moonlet_thread_create(&v->reap_thread, verbs_reap_main, v, "verbs-reap")
                 ? MOONLET_ERR_INTERNAL_ERROR : MOONLET_OK;
        v->reap_started = rc == MOONLET_OK;
    }
    if (rc == MOONLET_OK && x->listen_addr) {
        rc = moonlet_thread_create(&v->cm_thread, verbs_cm_main, x, "verbs-cm")
                 ? MOONLET_ERR_INTERNAL_ERROR : MOONLET_OK;
        v->cm_started = rc == MOONLET_OK;
    }
    if (rc) {
        x->be_state = NULL;
        x->endpoint[0] = '\0';
        verbs_free(v);
        return rc;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < (64u << 20) && geteuid() != 0) {
        char lim[32];
        ML_WARN(MOD, "RLIMIT_MEMLOCK is %s: RDMA registrations beyond it will fail "
                "(raise it: LimitMEMLOCK=infinity, ulimit -l unlimited)",
                verbs_memlock_str(lim, sizeof(lim)));
    }
    if (x->endpoint[0]) /* a client says nothing more than xfer.c's one line */
        ML_INFO(MOD, "using %s port %u, serving on %s", v->dev_name, v->port, x->endpoint);
    else
        ML_DEBUG(MOD, "using %s port %u", v->dev_name, v->port);
    return MOONLET_OK;
}

static void verbs_stop(moonlet_xfer *x)
{
    verbs_state *v = x->be_state;
    if (!v)
        return;
    atomic_store(&v->stopping, true);
    if (v->cm_started)
        pthread_join(v->cm_thread, NULL);
    if (v->reap_started) { /* after the CM thread: nothing is queued any more */
        pthread_mutex_lock(&v->lock);
        pthread_cond_signal(&v->reap_cond);
        pthread_mutex_unlock(&v->lock);
        pthread_join(v->reap_thread, NULL);
    }
    verbs_free(v);
    x->be_state = NULL;
}

/* ---- segments and buffers ---------------------------------------------- */

static int verbs_seg_add(moonlet_xfer *x, void *base, uint64_t len, moonlet_xfer_segment_info *info)
{
    verbs_state *v = x->be_state;
    verbs_seg *g = calloc(1, sizeof(*g));
    if (!g)
        return MOONLET_ERR_INTERNAL_ERROR;
    g->mr = ibv_reg_mr(v->pd, base, (size_t)len,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
    if (!g->mr) {
        verbs_reg_failed("a segment", len, errno);
        free(g);
        return MOONLET_ERR_TRANSFER_FAIL;
    }
    g->id = moonlet_xfer_random_id();
    pthread_mutex_lock(&v->lock);
    g->next = v->segs;
    v->segs = g;
    pthread_mutex_unlock(&v->lock);
    snprintf(info->segment_id, sizeof(info->segment_id), "%016" PRIx64 ".%08" PRIx32
             ".%016" PRIx64 ".%016" PRIx64, g->id, g->mr->rkey, (uint64_t)(uintptr_t)base, len);
    snprintf(info->endpoint, sizeof(info->endpoint), "%s", x->endpoint);
    snprintf(info->protocol, sizeof(info->protocol), "rdma");
    info->base = (uint64_t)(uintptr_t)base;
    info->size = len;
    ML_INFO(MOD, "segment %016" PRIx64 " registered: %" PRIu64 " bytes at %s", g->id, len,
            x->endpoint);
    return MOONLET_OK;
}

/* Parses "<id>.<rkey>.<base>.<size>". */
static int verbs_parse_seg_id(const char *s, uint64_t *id, uint32_t *rkey, uint64_t *base,
                              uint64_t *size)
{
    char tail;
    if (strlen(s) != 16 + 1 + 8 + 1 + 16 + 1 + 16 ||
        sscanf(s, "%16" SCNx64 ".%8" SCNx32 ".%16" SCNx64 ".%16" SCNx64 "%c", id, rkey, base,
               size, &tail) != 4)
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    return MOONLET_OK;
}

static int verbs_seg_remove(moonlet_xfer *x, const char *segment_id)
{
    verbs_state *v = x->be_state;
    uint64_t id, base, size;
    uint32_t rkey;
    if (verbs_parse_seg_id(segment_id, &id, &rkey, &base, &size))
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    pthread_mutex_lock(&v->lock);
    verbs_seg **pp = &v->segs;
    while (*pp && (*pp)->id != id)
        pp = &(*pp)->next;
    verbs_seg *g = *pp;
    if (g)
        *pp = g->next;
    pthread_mutex_unlock(&v->lock);
    if (!g)
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    ibv_dereg_mr(g->mr);
    free(g);
    return MOONLET_OK;
}

static int verbs_buf_add(moonlet_xfer *x, void *base, size_t len, void **handle, uint32_t *lkey)
{
    verbs_state *v = x->be_state;
    verbs_buf *b = calloc(1, sizeof(*b));
    if (!b)
        return MOONLET_ERR_INTERNAL_ERROR;
    b->base = base;
    b->len = len;
    b->dmabuf_fd = -1;
    struct ibv_mr *mr = verbs_buf_reg(v->pd, b);
    if (!mr) {
        verbs_reg_failed("a buffer", len, errno);
        free(b);
        return MOONLET_ERR_TRANSFER_FAIL;
    }
    atomic_store(&b->mr[0], mr);
    *handle = b;
    *lkey = mr->lkey;
    return MOONLET_OK;
}

/* Device memory: the dma-buf first, then the device address as peer memory
 * (each failure's errno kept for the reason). */
static int verbs_buf_add_device(moonlet_xfer *x, void *base, size_t len, int dmabuf_fd,
                                uint64_t dmabuf_off, void **handle, uint32_t *lkey,
                                const char **how)
{
    verbs_state *v = x->be_state;
    verbs_buf *b = calloc(1, sizeof(*b));
    if (!b)
        return MOONLET_ERR_INTERNAL_ERROR;
    b->base = base;
    b->len = len;
    b->dmabuf_off = dmabuf_off;
    b->dmabuf_fd = dmabuf_fd >= 0 ? fcntl(dmabuf_fd, F_DUPFD_CLOEXEC, 0) : -1;
    struct ibv_mr *mr = b->dmabuf_fd >= 0 ? verbs_buf_reg(v->pd, b) : NULL;
    int dmabuf_err = dmabuf_fd < 0 ? 0 : b->dmabuf_fd < 0 ? errno : mr ? 0 : errno;
    if (mr) {
        *how = "dma-buf";
    } else {
        if (b->dmabuf_fd >= 0)
            close(b->dmabuf_fd);
        b->dmabuf_fd = -1;
        mr = verbs_buf_reg(v->pd, b); /* nvidia-peermem resolves the device address */
        if (mr)
            *how = "peer memory";
        else if (dmabuf_fd < 0)
            *how = "the driver gives no dma-buf and the NIC refuses the device address "
                   "(no nvidia-peermem)";
        else
            *how = dmabuf_err == EOPNOTSUPP || dmabuf_err == ENOSYS
                       ? "the NIC does not take dma-buf memory and refuses the device address"
                       : "the NIC refused the dma-buf and the device address";
    }
    if (!mr) {
        free(b);
        return MOONLET_ERR_TRANSFER_FAIL;
    }
    atomic_store(&b->mr[0], mr);
    *handle = b;
    *lkey = mr->lkey;
    return MOONLET_OK;
}

static void verbs_buf_remove(moonlet_xfer *x, void *handle)
{
    verbs_buf *b = handle;
    for (size_t i = 0; i < VERBS_MAX_DEVS; i++) {
        struct ibv_mr *mr = atomic_load(&b->mr[i]);
        if (mr)
            ibv_dereg_mr(mr);
    }
    if (b->dmabuf_fd >= 0)
        close(b->dmabuf_fd);
    free(b);
}

/* The buffer's lkey on device `dev`, registering it there on first use.
 * 0 and *lkey, or TRANSFER_FAIL (registration failed; logged). */
static int verbs_buf_lkey(verbs_state *v, verbs_buf *b, size_t dev, uint32_t *lkey)
{
    struct ibv_mr *mr = atomic_load(&b->mr[dev]);
    if (!mr) {
        pthread_mutex_lock(&v->dev_lock);
        mr = atomic_load(&b->mr[dev]);
        if (!mr) {
            mr = verbs_buf_reg(v->devs[dev].pd, b);
            if (mr)
                atomic_store(&b->mr[dev], mr);
            else
                verbs_reg_failed("a buffer", b->len, errno);
        }
        pthread_mutex_unlock(&v->dev_lock);
    }
    if (!mr)
        return MOONLET_ERR_TRANSFER_FAIL;
    *lkey = mr->lkey;
    return MOONLET_OK;
}

static int verbs_prepare(moonlet_xfer *x, xfer_item *it)
{
    uint64_t base, size;
    const moonlet_xfer_op *op = it->op;
    if (verbs_parse_seg_id(op->segment_id, &it->seg, &it->rkey, &base, &size))
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    if (op->offset > size || op->len > size - op->offset || base > UINT64_MAX - size)
        return MOONLET_ERR_INVALID_PARAMS;
    if (moonlet_xfer_buffer_lookup(x, op->local, op->len, &it->lkey, &it->buf)) {
        ML_WARN(MOD, "local buffer %p (+%" PRIu64 ") is not registered", op->local, op->len);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    it->remote_addr = base + op->offset;
    return MOONLET_OK;
}

/* ---- client connections ------------------------------------------------- */

/* Waits for the next CM event on a client channel; copies what the caller
 * needs and acks it.  Returns the event type, or -1 on timeout. */
static int verbs_wait_event(verbs_cconn *c, uint64_t deadline_ms, int *status, int *reject)
{
    for (;;) {
        struct rdma_cm_event *ev;
        if (rdma_get_cm_event(c->ec, &ev) == 0) {
            int type = (int)ev->event;
            *status = ev->status;
            *reject = 0;
            if (type == RDMA_CM_EVENT_REJECTED && ev->param.conn.private_data &&
                ev->param.conn.private_data_len >= sizeof(verbs_conn_rej)) {
                verbs_conn_rej rej;
                memcpy(&rej, ev->param.conn.private_data, sizeof(rej));
                if (rej.magic == VERBS_CONN_MAGIC)
                    *reject = rej.status;
                if (rej.magic == VERBS_CONN_MAGIC && rej.status == VERBS_REJ_CHALLENGE &&
                    ev->param.conn.private_data_len >= sizeof(verbs_conn_chal)) {
                    memcpy(&c->chal, ev->param.conn.private_data, sizeof(c->chal));
                    c->chal_got = true;
                }
            }
            rdma_ack_cm_event(ev);
            return type;
        }
        if (errno != EAGAIN)
            return -1;
        uint64_t now = moonlet_xfer_now_ms();
        if (now >= deadline_ms)
            return -1;
        struct pollfd p = {.fd = c->ec->fd, .events = POLLIN};
        poll(&p, 1, (int)(deadline_ms - now));
    }
}

/* Waits for one expected event; maps anything else to an error. */
static int verbs_expect(verbs_cconn *c, int want, uint64_t deadline_ms, const char *step)
{
    int status = 0, reject = 0;
    int got = verbs_wait_event(c, deadline_ms, &status, &reject);
    if (got == want)
        return MOONLET_OK;
    if (got == RDMA_CM_EVENT_REJECTED && reject == VERBS_REJ_CHALLENGE && c->chal_got)
        return VERBS_RC_CHALLENGE;
    if (got == RDMA_CM_EVENT_REJECTED && reject == MOONLET_ERR_ILLEGAL_CLIENT) {
        ML_WARN(MOD, "%s refused our auth token", c->endpoint);
        return MOONLET_ERR_ILLEGAL_CLIENT;
    }
    ML_WARN(MOD, "%s to %s failed: %s (status %d)", step, c->endpoint,
            got < 0 ? "timed out" : rdma_event_str((enum rdma_cm_event_type)got), status);
    return MOONLET_ERR_TRANSFER_FAIL;
}

static void verbs_conn_close(moonlet_xfer *x, void *conn)
{
    verbs_cconn *c = conn;
    verbs_state *v = x->be_state;
    pthread_mutex_lock(&v->lock);
    verbs_cconn **pp = &v->cconns;
    while (*pp && *pp != c)
        pp = &(*pp)->next;
    if (*pp)
        *pp = c->next;
    pthread_mutex_unlock(&v->lock);
    if (c->id && c->id->qp) {
        rdma_disconnect(c->id);
        rdma_destroy_qp(c->id);
    }
    if (c->cq)
        ibv_destroy_cq(c->cq); /* every event taken from cc was acked at once */
    if (c->cc)
        ibv_destroy_comp_channel(c->cc);
    if (c->id)
        rdma_destroy_id(c->id);
    if (c->ec)
        rdma_destroy_event_channel(c->ec);
    free(c);
}

/* CQ and QP on the resolved id (rping: after route resolution). */
static int verbs_create_qp(verbs_state *v, verbs_cconn *c)
{
    /* the device the address resolved to (rdma_resolve_addr set id->verbs):
     * its own PD, so a multi-NIC host reaches each peer through the right NIC */
    int dev = c->id->verbs ? verbs_dev_get(v, c->id->verbs, c->id->port_num) : -1;
    if (dev < 0) {
        ML_WARN(MOD, "%s is reached through a device this instance cannot use", c->endpoint);
        return MOONLET_ERR_TRANSFER_FAIL;
    }
    verbs_dev *d = &v->devs[dev];
    c->dev = (size_t)dev;
    c->max_msg = d->max_msg;
    c->cc = ibv_create_comp_channel(d->ctx);
    if (!c->cc || verbs_set_nonblock(c->cc->fd)) {
        ML_WARN(MOD, "cannot create a completion channel for %s: %s", c->endpoint,
                strerror(errno));
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    c->cq = ibv_create_cq(d->ctx, (int)VERBS_SEND_DEPTH + 1, NULL, c->cc, 0);
    /* sq_sig_all = 0: only the WRs posted with IBV_SEND_SIGNALED (every
     * VERBS_SIGNAL_EVERY-th and the last of each chain) complete on success. */
    struct ibv_qp_init_attr qa = {.send_cq = c->cq, .recv_cq = c->cq,
                                  .cap = {.max_send_wr = VERBS_SEND_DEPTH, .max_recv_wr = 1,
                                          .max_send_sge = 1, .max_recv_sge = 1,
                                          .max_inline_data = VERBS_INLINE_WANT},
                                  .qp_type = IBV_QPT_RC, .sq_sig_all = 0};
    if (!c->cq) {
        ML_WARN(MOD, "cannot create a CQ for %s: %s", c->endpoint, strerror(errno));
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    if (rdma_create_qp(c->id, d->pd, &qa)) {
        qa.cap.max_inline_data = 0; /* a device without inline sends */
        if (rdma_create_qp(c->id, d->pd, &qa)) {
            ML_WARN(MOD, "cannot create a QP for %s: %s", c->endpoint, strerror(errno));
            return MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    /* ibv_create_qp wrote back what the device granted */
    c->max_send = qa.cap.max_send_wr < VERBS_SEND_DEPTH ? qa.cap.max_send_wr : VERBS_SEND_DEPTH;
    if (c->max_send == 0)
        c->max_send = 1;
    c->max_inline = qa.cap.max_inline_data;
    return MOONLET_OK;
}

/*
 * rdma_resolve_addr in short attempts.  The kernel's address resolution
 * (drivers/infiniband/core/addr.c) parks a request whose neighbour entry is
 * not yet valid and re-examines it when a neighbour-update netevent arrives
 * - or at its timeout.  When the ARP reply lands between the first look and
 * the parking (a local wire, or a second connect racing a first one's ARP),
 * the update is missed and the request sleeps until the timeout, and then
 * succeeds: with the whole transfer timeout as the resolve timeout, the
 * connection came up exactly when the caller gave up (issue 12's "second
 * connection accepted ~10 s later").  Short attempts bound that delay to one
 * step; an attempt that times out is simply repeated until the deadline.
 */
#define VERBS_RESOLVE_STEP_MS 200

static int verbs_resolve_addr(verbs_cconn *c, struct sockaddr *src, struct sockaddr *dst,
                              uint64_t deadline)
{
    int last_status = 0, attempts = 0;
    for (;;) {
        uint64_t now = moonlet_xfer_now_ms();
        if (now >= deadline || attempts >= 10000)
            break;
        uint64_t left = deadline - now;
        int step = (int)(left < VERBS_RESOLVE_STEP_MS ? left : VERBS_RESOLVE_STEP_MS);
        attempts++;
        if (rdma_resolve_addr(c->id, src, dst, step ? step : 1)) {
            ML_WARN(MOD, "rdma_resolve_addr to %s: %s", c->endpoint, strerror(errno));
            return MOONLET_ERR_TRANSFER_FAIL;
        }
        /* the kernel answers at its own timeout at the latest: wait a bit more */
        uint64_t wait_until = now + (uint64_t)step + 1000u;
        int status = 0, reject = 0;
        int got = verbs_wait_event(c, wait_until < deadline ? wait_until : deadline, &status,
                                   &reject);
        if (got == RDMA_CM_EVENT_ADDR_RESOLVED) {
            if (attempts > 1)
                ML_DEBUG(MOD, "address of %s resolved at attempt %d", c->endpoint, attempts);
            return MOONLET_OK;
        }
        if (got != RDMA_CM_EVENT_ADDR_ERROR || (status != -ETIMEDOUT && status != -ENODATA)) {
            ML_WARN(MOD, "rdma_resolve_addr to %s failed: %s (status %d)", c->endpoint,
                    got < 0 ? "timed out" : rdma_event_str((enum rdma_cm_event_type)got), status);
            return MOONLET_ERR_TRANSFER_FAIL;
        }
        last_status = status;
    }
    ML_WARN(MOD, "rdma_resolve_addr to %s failed: no answer in %d attempts (status %d)",
            c->endpoint, attempts, last_status);
    return MOONLET_ERR_TRANSFER_FAIL;
}

/* Connects c; with `chal` (a challenge an earlier attempt got) the request
 * carries the proof for it, else (with a token) it asks for one:
 * VERBS_RC_CHALLENGE then, with the challenge in c->chal. */
static int verbs_connect_steps(moonlet_xfer *x, verbs_state *v, verbs_cconn *c,
                               uint64_t deadline_ms, const verbs_conn_chal *chal)
{
    struct sockaddr_storage dst;
    uint64_t deadline = moonlet_xfer_now_ms() + x->timeout_ms;
    if (deadline_ms && deadline_ms < deadline)
        deadline = deadline_ms; /* the batch's: its wait for the connection counts */
    int tmo = (int)(x->timeout_ms > 60000 ? 60000 : x->timeout_ms);
    if (verbs_resolve(c->endpoint, false, &dst))
        return MOONLET_ERR_INVALID_PARAMS;
    c->ec = rdma_create_event_channel();
    if (!c->ec || verbs_set_nonblock(c->ec->fd) || rdma_create_id(c->ec, &c->id, c, RDMA_PS_TCP))
        return MOONLET_ERR_INTERNAL_ERROR;
    struct sockaddr_storage src;
    bool src_any = true;
    if (x->source_addr && verbs_parse_addr(x->source_addr, false, &src, &src_any))
        return MOONLET_ERR_INVALID_PARAMS;
    /* binding the source address picks the NIC and port (as rping -I) */
    int rc = verbs_resolve_addr(c, src_any ? NULL : (struct sockaddr *)&src,
                                (struct sockaddr *)&dst, deadline);
    uint8_t tos = (uint8_t)x->rdma_tos; /* before route resolution, which uses it */
    if (rc == MOONLET_OK && x->rdma_tos &&
        rdma_set_option(c->id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos))) {
        ML_WARN(MOD, "cannot set TOS %d on the connection to %s: %s", x->rdma_tos, c->endpoint,
                strerror(errno));
        rc = MOONLET_ERR_TRANSFER_FAIL;
    }
    if (rc == MOONLET_OK)
        rc = rdma_resolve_route(c->id, tmo)
                 ? MOONLET_ERR_TRANSFER_FAIL
                 : verbs_expect(c, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, "rdma_resolve_route");
    if (rc == MOONLET_OK)
        rc = verbs_create_qp(v, c);
    if (rc)
        return rc;
    verbs_conn_req req = {.magic = VERBS_CONN_MAGIC, .version = VERBS_CONN_VERSION,
                          .auth = !x->token ? VERBS_AUTH_NONE
                                  : chal    ? VERBS_AUTH_PROOF
                                            : VERBS_AUTH_ASK};
    if (x->token && chal) {
        uint8_t cn[MOONLET_CRED_NONCE_BYTES] = {0};
        moonlet_cred_nonce(cn);
        memset(cn + VERBS_CNONCE_BYTES, 0, sizeof(cn) - VERBS_CNONCE_BYTES);
        memcpy(req.cnonce, cn, VERBS_CNONCE_BYTES);
        req.slot = chal->slot;
        req.gen = chal->gen;
        moonlet_cred_mac(x->auth_key, "rdma", chal->nonce, cn, req.mac);
    }
    struct rdma_conn_param cp = {.private_data = &req, .private_data_len = sizeof(req),
                                 .initiator_depth = v->devs[c->dev].max_init_rd_atom < 16
                                                        ? v->devs[c->dev].max_init_rd_atom
                                                        : 16,
                                 .responder_resources = 0, .retry_count = 7,
                                 .rnr_retry_count = 7};
    if (rdma_connect(c->id, &cp))
        return MOONLET_ERR_TRANSFER_FAIL;
    return verbs_expect(c, RDMA_CM_EVENT_ESTABLISHED, deadline, "rdma_connect");
}

static int verbs_conn_open(moonlet_xfer *x, const char *endpoint, uint64_t deadline_ms,
                           void **out)
{
    verbs_state *v = x->be_state;
    verbs_cconn *c = calloc(1, sizeof(*c));
    if (!c)
        return MOONLET_ERR_INTERNAL_ERROR;
    snprintf(c->endpoint, sizeof(c->endpoint), "%s", endpoint);
    uint64_t deadline = moonlet_xfer_now_ms() + x->timeout_ms; /* both attempts within it */
    if (deadline_ms && deadline_ms < deadline)
        deadline = deadline_ms;
    int rc = verbs_connect_steps(x, v, c, deadline, NULL);
    if (rc == VERBS_RC_CHALLENGE) { /* a node with a token: connect again with the proof */
        verbs_conn_chal chal = c->chal;
        verbs_conn_close(x, c);
        c = calloc(1, sizeof(*c));
        if (!c)
            return MOONLET_ERR_INTERNAL_ERROR;
        snprintf(c->endpoint, sizeof(c->endpoint), "%s", endpoint);
        rc = verbs_connect_steps(x, v, c, deadline, &chal);
        explicit_bzero(&chal, sizeof(chal));
        if (rc == VERBS_RC_CHALLENGE) /* challenged again: our proof was not taken */
            rc = MOONLET_ERR_ILLEGAL_CLIENT;
    }
    if (rc) {
        verbs_conn_close(x, c);
        return rc;
    }
    c->established_ms = moonlet_xfer_now_ms();
    pthread_mutex_lock(&v->lock);
    c->next = v->cconns;
    v->cconns = c;
    pthread_mutex_unlock(&v->lock);
    *out = c;
    return MOONLET_OK;
}

/* Reads what the connection's CM channel has (non-blocking, bounded): the
 * peer's DISCONNECTED (it closed, or its process died and its kernel said
 * so), a device removal or an error event mark the connection dead.
 * Returns !dead. */
static bool verbs_watch(verbs_cconn *c)
{
    for (int i = 0; i < 16 && !c->dead; i++) {
        struct rdma_cm_event *ev;
        if (rdma_get_cm_event(c->ec, &ev))
            break; /* EAGAIN: nothing new */
        enum rdma_cm_event_type t = ev->event;
        rdma_ack_cm_event(ev);
        if (t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_DEVICE_REMOVAL ||
            t == RDMA_CM_EVENT_CONNECT_ERROR || t == RDMA_CM_EVENT_UNREACHABLE ||
            t == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
            ML_INFO(MOD, "connection to %s: %s", c->endpoint, rdma_event_str(t));
            c->dead = true;
        }
    }
    return !c->dead;
}

static bool verbs_conn_stale(moonlet_xfer *x, void *conn)
{
    return !verbs_watch(conn);
}

static void verbs_fill_qp_info(struct rdma_cm_id *id, bool served, moonlet_xfer_qp_info *o,
                               verbs_cconn *c)
{
    struct ibv_qp *qp = id->qp;
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    memset(o, 0, sizeof(*o));
    if (c) {
        o->wrs = atomic_load_explicit(&c->wrs, memory_order_relaxed);
        o->post_calls = atomic_load_explicit(&c->post_calls, memory_order_relaxed);
        o->cqes = atomic_load_explicit(&c->cqes, memory_order_relaxed);
        o->max_send_wr = c->max_send;
        o->max_inline_data = c->max_inline;
    }
    o->served = served;
    /* the QP's own device, and whether its PD is on the device the cm_id
     * resolved to (one PD per device) */
    snprintf(o->device, sizeof(o->device), "%s", ibv_get_device_name(qp->context->device));
    o->pd_on_id_device = qp->pd && qp->pd->context == id->verbs && qp->context == id->verbs;
    if (ibv_query_qp(qp, &a, IBV_QP_STATE | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC |
                     IBV_QP_AV, &ia) == 0) {
        o->state = (int)a.qp_state;
        o->traffic_class = a.ah_attr.grh.traffic_class;
        o->max_rd_atomic = a.max_rd_atomic;
        o->max_dest_rd_atomic = a.max_dest_rd_atomic;
    } else {
        o->state = -1;
    }
}

size_t moonlet_xfer_verbs_qp_info(moonlet_xfer *x, moonlet_xfer_qp_info *out, size_t cap)
{
    if (!x || x->be != &moonlet_xfer_verbs_backend || !x->be_state)
        return 0;
    verbs_state *v = x->be_state;
    size_t n = 0;
    pthread_mutex_lock(&v->lock);
    for (verbs_cconn *c = v->cconns; c; c = c->next, n++)
        if (n < cap && c->id->qp)
            verbs_fill_qp_info(c->id, false, &out[n], c);
    for (verbs_sconn *sc = v->sconns; sc; sc = sc->next, n++)
        if (n < cap && sc->id->qp)
            verbs_fill_qp_info(sc->id, true, &out[n], NULL);
    pthread_mutex_unlock(&v->lock);
    return n;
}

/* ---- transfers ---------------------------------------------------------- */

/* What an error completion usually means on a ConnectX cluster. */
static const char *verbs_wc_hint(enum ibv_wc_status s)
{
    switch (s) {
    case IBV_WC_REM_ACCESS_ERR: return "segment unregistered, stale rkey or range outside it";
    case IBV_WC_LOC_PROT_ERR: return "local buffer not registered or range outside its MR";
    case IBV_WC_RETRY_EXC_ERR: return "peer unreachable or gone (transport retries exhausted)";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "peer not ready (RNR retries exhausted)";
    case IBV_WC_WR_FLUSH_ERR: return "flushed after an earlier error on this connection";
    case IBV_WC_REM_INV_REQ_ERR: return "peer rejected the request as invalid";
    case IBV_WC_REM_OP_ERR: return "peer failed the operation";
    case IBV_WC_LOC_LEN_ERR: return "length exceeds what the QP allows";
    default: return "transport error";
    }
}

/* One posted WR, by sequence number: its item (index in the lane) and its
 * length. */
typedef struct verbs_wr_slot {
    uint32_t item;
    uint32_t bytes;
} verbs_wr_slot;

/*
 * Progress of one lane.  Each item is split into chunks of at most max_msg
 * bytes, one WR each.  The WRs are posted as chains (one ibv_post_send per
 * pass), and only every VERBS_SIGNAL_EVERY-th WR and the last of each chain
 * is signalled; wr_id is the WR's sequence number on its connection, and
 * `ring` remembers each outstanding WR (head .. tail - 1).  A completion for
 * sequence s retires every WR up to s in order (an RC send queue completes
 * in order): the ones before s succeeded, unless the QP already reported an
 * error (qp_err), and s itself succeeded when its status says so.  An error
 * always completes, signalled or not, so the first error completion names
 * the first WR that failed: the WRs before it completed, it and everything
 * after it (flushed) fail.  The last WR of every chain is signalled, so the
 * ring always drains.  At most the QP's max_send_wr WRs are outstanding,
 * unsignalled ones included: they hold their send-queue slot until a later
 * completion retires them.
 */
typedef struct verbs_lane_run {
    xfer_lane *lane;
    verbs_cconn *c;
    uint32_t *pending;   /* posted, not retired chunks per item */
    verbs_wr_slot *ring; /* VERBS_SEND_DEPTH slots, indexed by seq % depth */
    uint64_t head, tail; /* oldest outstanding WR's seq; the next WR's seq */
    size_t post_i;       /* next item to post */
    uint64_t post_off;   /* bytes of item post_i already posted */
    uint32_t inflight;   /* tail - head */
    uint64_t inflight_bytes;
    uint64_t last_progress;
    uint64_t write_deadline; /* earliest writer deadline of its writes (ms); 0: none */
    bool progressed;     /* this pass posted or completed something */
    bool failed;         /* stop posting; drain what is in flight */
    bool qp_err;         /* the QP is in error: every WR retired from now on failed */
} verbs_lane_run;

static void verbs_lane_break(verbs_lane_run *r, const char *why)
{
    if (!r->failed)
        ML_WARN(MOD, "connection to %s failed: %s", r->c->endpoint, why);
    r->failed = true;
    r->lane->broken = true;
    for (size_t i = r->post_i; i < r->lane->nitems; i++)
        r->lane->items[i]->op->status = MOONLET_ERR_TRANSFER_FAIL;
    r->post_i = r->lane->nitems;
}

static void verbs_lane_abort(verbs_lane_run *r, const char *why);

/* Posts as many of the lane's next chunks as the send queue and the
 * in-flight byte budget allow, as one chain. */
static void verbs_post(verbs_state *v, verbs_lane_run *r)
{
    struct ibv_send_wr wrs[VERBS_SEND_DEPTH];
    struct ibv_sge sges[VERBS_SEND_DEPTH];
    uint32_t k = 0;
    uint64_t bytes = r->inflight_bytes;
    const char *why = NULL;
    while (!r->failed && r->post_i < r->lane->nitems && r->inflight + k < r->c->max_send &&
           (r->inflight + k == 0 || bytes < VERBS_LANE_INFLIGHT_BYTES)) {
        xfer_item *it = r->lane->items[r->post_i];
        const moonlet_xfer_cap *cap = it->op->cap;
        if (it->op->opcode == MOONLET_XFER_WRITE && cap && cap->deadline_ms &&
            moonlet_xfer_now_ms() >= cap->deadline_ms) {
            /* The master may free the range soon after the writer's deadline:
             * no chunk is posted past it (what is already posted lands within
             * the master's quarantine grace; docs/reliability.md, "Stale
             * writers"). */
            it->op->status = MOONLET_ERR_TRANSFER_FAIL;
            why = "a write passed its writer's deadline";
            break;
        }
        if (r->post_off == 0 && verbs_buf_lkey(v, it->buf, r->c->dev, &it->lkey)) {
            it->op->status = MOONLET_ERR_TRANSFER_FAIL;
            why = "cannot register the local buffer on the connection's device";
            break;
        }
        uint64_t left = it->op->len - r->post_off;
        uint32_t n = left > r->c->max_msg ? r->c->max_msg : (uint32_t)left;
        uint64_t seq = r->tail + k;
        bool write = it->op->opcode == MOONLET_XFER_WRITE;
        sges[k] = (struct ibv_sge){.addr = (uint64_t)(uintptr_t)it->op->local + r->post_off,
                                   .length = n, .lkey = it->lkey};
        wrs[k] = (struct ibv_send_wr){
            .wr_id = seq, .sg_list = &sges[k], .num_sge = 1,
            .opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
            .send_flags = ((seq + 1) % VERBS_SIGNAL_EVERY == 0 ? IBV_SEND_SIGNALED : 0) |
                          (write && n <= r->c->max_inline ? IBV_SEND_INLINE : 0),
            .wr.rdma = {.remote_addr = it->remote_addr + r->post_off, .rkey = it->rkey}};
        if (k)
            wrs[k - 1].next = &wrs[k];
        r->ring[seq % VERBS_SEND_DEPTH] = (verbs_wr_slot){.item = (uint32_t)r->post_i, .bytes = n};
        r->pending[r->post_i]++;
        bytes += n;
        k++;
        r->post_off += n;
        if (r->post_off == it->op->len) {
            r->post_i++;
            r->post_off = 0;
        }
    }
    if (k) {
        wrs[k - 1].send_flags |= IBV_SEND_SIGNALED;
        struct ibv_send_wr *bad = NULL;
        int err = ibv_post_send(r->c->id->qp, wrs, &bad);
        atomic_fetch_add_explicit(&r->c->post_calls, 1, memory_order_relaxed);
        uint32_t posted = k;
        if (err)
            posted = bad && bad >= wrs && bad < wrs + k ? (uint32_t)(bad - wrs) : 0;
        atomic_fetch_add_explicit(&r->c->wrs, posted, memory_order_relaxed);
        for (uint32_t j = 0; j < k; j++) {
            verbs_wr_slot *s = &r->ring[(r->tail + j) % VERBS_SEND_DEPTH];
            if (j < posted) {
                r->inflight_bytes += s->bytes;
                continue;
            }
            r->pending[s->item]--;
            r->lane->items[s->item]->op->status = MOONLET_ERR_TRANSFER_FAIL;
        }
        r->tail += posted;
        r->inflight += posted;
        if (err) {
            /* what was posted may end unsignalled: the QP goes to ERR, which
             * completes (flushes) every outstanding WR */
            verbs_lane_abort(r, strerror(err));
            return;
        }
    }
    if (why)
        verbs_lane_break(r, why);
}

/* Retires the outstanding WRs up to seq, which completed with status st. */
static void verbs_retire(verbs_lane_run *r, uint64_t seq, enum ibv_wc_status st)
{
    while (r->head <= seq && r->head < r->tail) {
        verbs_wr_slot *s = &r->ring[r->head % VERBS_SEND_DEPTH];
        if (r->qp_err || (r->head == seq && st != IBV_WC_SUCCESS))
            r->lane->items[s->item]->op->status = MOONLET_ERR_TRANSFER_FAIL;
        r->pending[s->item]--;
        r->inflight--;
        r->inflight_bytes -= s->bytes;
        r->head++;
    }
}

/* Polls a lane's CQ once.  Returns how many completions it consumed. */
static int verbs_poll(verbs_lane_run *r)
{
    struct ibv_wc wc[VERBS_POLL_BATCH];
    int n = ibv_poll_cq(r->c->cq, VERBS_POLL_BATCH, wc);
    if (n < 0) {
        verbs_lane_break(r, "ibv_poll_cq failed");
        return 0;
    }
    atomic_fetch_add_explicit(&r->c->cqes, (uint64_t)n, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        uint64_t seq = wc[i].wr_id;
        if (seq < r->head || seq >= r->tail)
            continue; /* not outstanding in this run (cannot happen on RC) */
        if (wc[i].status != IBV_WC_SUCCESS && (wc[i].status != IBV_WC_WR_FLUSH_ERR || !r->failed)) {
            const moonlet_xfer_op *op =
                r->lane->items[r->ring[seq % VERBS_SEND_DEPTH].item]->op;
            ML_WARN(MOD, "RDMA %s at %s offset %" PRIu64 ": %s (vendor_err 0x%x): %s",
                    op->opcode == MOONLET_XFER_READ ? "READ" : "WRITE", r->c->endpoint,
                    op->offset, ibv_wc_status_str(wc[i].status), wc[i].vendor_err,
                    verbs_wc_hint(wc[i].status));
        }
        verbs_retire(r, seq, wc[i].status);
        if (wc[i].status != IBV_WC_SUCCESS) {
            r->qp_err = true;
            verbs_lane_break(r, ibv_wc_status_str(wc[i].status));
        }
    }
    return n;
}

/* No completion for timeout_ms, or the peer is gone: move the QP to ERR so
 * the NIC flushes what is in flight, and drain those completions (bounded)
 * before the QP dies. */
static void verbs_lane_abort(verbs_lane_run *r, const char *why)
{
    verbs_lane_break(r, why);
    for (size_t i = 0; i < r->lane->nitems; i++)
        if (r->pending[i])
            r->lane->items[i]->op->status = MOONLET_ERR_TRANSFER_FAIL;
    r->qp_err = true;
    struct ibv_qp_attr qa = {.qp_state = IBV_QPS_ERR};
    ibv_modify_qp(r->c->id->qp, &qa, IBV_QP_STATE);
    uint64_t end = moonlet_xfer_now_ms() + VERBS_DRAIN_MS;
    while (r->inflight && moonlet_xfer_now_ms() < end)
        if (verbs_poll(r) == 0)
            sched_yield();
    r->inflight = 0;
    r->inflight_bytes = 0;
    r->head = r->tail;
}

/* The CM reported the peer gone while the lane was healthy: every
 * operation it fails failed only with its connection (conn_failed), and
 * xfer.c may reissue it once on a fresh connection. */
static void verbs_lane_disconnected(verbs_lane_run *r)
{
    bool healthy = !r->failed;
    verbs_lane_abort(r, "peer disconnected");
    for (size_t i = 0; healthy && i < r->lane->nitems; i++)
        if (r->lane->items[i]->op->status == MOONLET_ERR_TRANSFER_FAIL)
            r->lane->items[i]->conn_failed = true;
}

static bool verbs_lane_step(moonlet_xfer *x, verbs_state *v, verbs_lane_run *r, uint64_t now)
{
    uint32_t before = r->inflight;
    verbs_post(v, r);
    r->progressed = r->inflight != before;
    if (r->inflight == 0)
        return r->post_i < r->lane->nitems;
    if (verbs_poll(r) > 0) {
        r->progressed = true;
        r->last_progress = now;
    } else if (now - r->last_progress >= x->timeout_ms) {
        verbs_lane_abort(r, "timed out");
    } else if (r->write_deadline && now >= r->write_deadline) {
        /* the QP goes to ERR: the NIC stops retransmitting what is posted */
        verbs_lane_abort(r, "a write passed its writer's deadline");
    } else if (now >= r->c->next_watch_ms) {
        /* a peer that died mid-transfer (its kernel sent a disconnect) fails
         * the lane now rather than after the transport's retries or the
         * timeout, so the caller can go to another replica at once */
        r->c->next_watch_ms = now + 5;
        if (!verbs_watch(r->c))
            verbs_lane_disconnected(r);
    }
    return r->inflight > 0 || r->post_i < r->lane->nitems;
}

/*
 * Nothing moved for VERBS_SPIN_US: rather than spin a core through a slow
 * peer or a stall, arm every waiting lane's CQ, look once more (a completion
 * may have landed before the arming), then sleep in poll() on the lanes'
 * completion channels and CM channels until a completion, a disconnect, or
 * the nearest lane timeout (at most 100 ms, so timeouts stay exact).
 */
#define VERBS_SPIN_US 50u

static uint64_t min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

#define VERBS_WAIT_MAX_MS 100u

static void verbs_wait(moonlet_xfer *x, verbs_lane_run *runs, size_t nlanes, struct pollfd *fds,
                       uint64_t now)
{
    uint64_t wait_ms = VERBS_WAIT_MAX_MS;
    size_t n = 0;
    for (size_t i = 0; i < nlanes; i++) {
        verbs_lane_run *r = &runs[i];
        if (r->inflight == 0 || r->failed)
            continue;
        if (ibv_req_notify_cq(r->c->cq, 0))
            return; /* cannot arm: keep polling */
        if (verbs_poll(r) > 0) {
            r->last_progress = now;
            return;
        }
        uint64_t idle = now - r->last_progress;
        uint64_t left = idle >= x->timeout_ms ? 0 : x->timeout_ms - idle;
        if (r->write_deadline)
            left = now >= r->write_deadline ? 0 : min_u64(left, r->write_deadline - now);
        wait_ms = left < wait_ms ? left : wait_ms;
        fds[n++] = (struct pollfd){.fd = r->c->cc->fd, .events = POLLIN};
        fds[n++] = (struct pollfd){.fd = r->c->ec->fd, .events = POLLIN};
    }
    if (n == 0 || wait_ms == 0)
        return;
    poll(fds, (nfds_t)n, (int)wait_ms);
    for (size_t i = 0, k = 0; i < nlanes && k < n; i++) {
        verbs_lane_run *r = &runs[i];
        if (r->inflight == 0 || r->failed || fds[k].fd != r->c->cc->fd)
            continue;
        struct ibv_cq *cq;
        void *cq_ctx;
        for (int j = 0; j < 64 && ibv_get_cq_event(r->c->cc, &cq, &cq_ctx) == 0; j++)
            ibv_ack_cq_events(cq, 1);
        if ((fds[k + 1].revents & POLLIN) && !verbs_watch(r->c))
            verbs_lane_disconnected(r);
        k += 2;
    }
}

/* The earliest writer deadline among a lane's writes; 0 when none has one. */
static uint64_t verbs_lane_write_deadline(const xfer_lane *l)
{
    uint64_t d = 0;
    for (size_t k = 0; k < l->nitems; k++) {
        const moonlet_xfer_op *op = l->items[k]->op;
        if (op->opcode == MOONLET_XFER_WRITE && op->cap && op->cap->deadline_ms &&
            (d == 0 || op->cap->deadline_ms < d))
            d = op->cap->deadline_ms;
    }
    return d;
}

/* Where a lane's silence starts: when its batch began waiting for the
 * connection (waiting for a pooled connection and opening one count against
 * the timeout), or, when later, when the peer's process accepted the
 * connection: unlike a TCP handshake, which the peer's kernel completes for
 * a stopped process too, an RDMA CM connection is established only by the
 * peer's rdma_accept(), so it is proof of life and the transfer's silence
 * counts from there (a slow connect does not eat the first transfer's
 * timeout). */
static uint64_t verbs_lane_alive_since(const xfer_lane *l, uint64_t now)
{
    uint64_t t = l->since_ms && l->since_ms < now ? l->since_ms : now;
    uint64_t est = ((const verbs_cconn *)l->conn)->established_ms;
    return est > t && est <= now ? est : t;
}

static void verbs_run(moonlet_xfer *x, xfer_lane *lanes, size_t nlanes)
{
    verbs_state *v = x->be_state;
    size_t total = 0;
    for (size_t i = 0; i < nlanes; i++)
        total += lanes[i].nitems;
    verbs_lane_run *runs = calloc(nlanes, sizeof(*runs));
    uint32_t *pending = calloc(total, sizeof(*pending));
    struct pollfd *fds = calloc(2 * nlanes, sizeof(*fds));
    verbs_wr_slot *ring = calloc(nlanes * VERBS_SEND_DEPTH, sizeof(*ring));
    if (!runs || !pending || !fds || !ring) {
        free(ring);
        free(fds);
        for (size_t i = 0; i < nlanes; i++)
            for (size_t k = 0; k < lanes[i].nitems; k++)
                lanes[i].items[k]->op->status = MOONLET_ERR_INTERNAL_ERROR;
        free(runs);
        free(pending);
        return;
    }
    uint64_t now = moonlet_xfer_now_ms();
    for (size_t i = 0, pos = 0; i < nlanes; pos += lanes[i].nitems, i++)
        runs[i] = (verbs_lane_run){.lane = &lanes[i], .c = lanes[i].conn,
                                   .pending = &pending[pos],
                                   .last_progress = verbs_lane_alive_since(&lanes[i], now),
                                   .ring = &ring[i * VERBS_SEND_DEPTH],
                                   .head = ((verbs_cconn *)lanes[i].conn)->next_seq,
                                   .tail = ((verbs_cconn *)lanes[i].conn)->next_seq,
                                   .write_deadline = verbs_lane_write_deadline(&lanes[i])};
    bool busy = true;
    uint64_t idle_since = 0; /* us; 0: something moved in the last pass */
    while (busy) {
        busy = false;
        bool moved = false;
        now = moonlet_xfer_now_ms();
        for (size_t i = 0; i < nlanes; i++) {
            busy |= verbs_lane_step(x, v, &runs[i], now);
            moved |= runs[i].progressed;
        }
        if (!busy || moved) {
            idle_since = 0;
            continue;
        }
        uint64_t us = moonlet_mono_us();
        if (!idle_since)
            idle_since = us;
        else if (us - idle_since >= VERBS_SPIN_US) {
            verbs_wait(x, runs, nlanes, fds, now);
            idle_since = 0;
        }
    }
    for (size_t i = 0; i < nlanes; i++)
        runs[i].c->next_seq = runs[i].tail;
    free(ring);
    free(fds);
    free(runs);
    free(pending);
}

const xfer_backend moonlet_xfer_verbs_backend = {
    .name = "rdma",
    .start = verbs_start,
    .stop = verbs_stop,
    .seg_add = verbs_seg_add,
    .seg_remove = verbs_seg_remove,
    .buf_add = verbs_buf_add,
    .buf_add_device = verbs_buf_add_device,
    .buf_remove = verbs_buf_remove,
    .prepare = verbs_prepare,
    .conn_open = verbs_conn_open,
    .conn_close = verbs_conn_close,
    .conn_stale = verbs_conn_stale,
    .health = verbs_health,
    .run = verbs_run,
};
