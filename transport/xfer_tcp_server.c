/*
 * xfer_tcp_server.c - the serving side of the TCP data plane (xfer.h):
 * registered segments, the acceptor and worker threads, each connection's
 * request state machine, connection caps and deadlines.
 *
 * An acceptor thread hands each accepted connection to one epoll set shared
 * by a pool of worker threads (EPOLLONESHOT: a connection is served by one
 * worker at a time, so its replies leave in request order).  Sockets are
 * non-blocking and a connection's request is a small state machine (header,
 * token or payload, reply): a worker advances it as far as the socket
 * allows, then parks the connection in epoll for the direction it waits on
 * and serves others, so a slow or stalled peer never holds a worker.
 * Payloads move without staging copies: a READ reply is sent from segment
 * memory, a WRITE payload is received straight into the segment.  Every
 * request is checked against its segment's bounds before memory is touched,
 * and a write to a keyed segment against its capability
 * (tcp_write_cap_check), whose expiry is checked again before each chunk
 * lands in the segment.
 *
 * Authentication (issue 33): with a token, a connection first asks for a
 * CHALLENGE (a nonce drawn for it), then proves a key by AUTH with an
 * HMAC of that nonce (xfer_tcp.h, common/cred.h).  A nonce serves one AUTH;
 * the token itself never crosses the wire, and a captured exchange replayed
 * on another connection meets another nonce.
 *
 * Limits.  Each request has an overall deadline from its first header byte
 * (timeout_ms, plus time for its payload at 16 MB/s - only once the header
 * has been checked against its segment, so a declared length alone buys no
 * time); with a token, a connection not authenticated within timeout_ms of
 * its accept is closed whatever the idle timeout (moonlet_xfer_tcp_auth_closed);
 * connections idle between requests for server_idle_timeout_ms are closed
 * (and counted: moonlet_xfer_tcp_idle_closed); the acceptor refuses
 * connections beyond server_max_conns in all or server_max_conns_per_peer
 * from one peer - an IPv4 address, or an IPv6 /64 (accepted and closed at
 * once).  The acceptor thread also reaps: every
 * 200 ms it shuts down connections past a deadline, and the worker that gets
 * the connection next closes it.  At the descriptor limit the acceptor sheds
 * the oldest waiting connection with a reserved descriptor and backs off,
 * logging at most one line per 5 s.
 *
 * Locks: seg_lock (+ seg_cond) guards the segment list and each segment's
 * in-flight count and write key; conn_lock guards the server's connection
 * list, its count and the per-peer counts.  Neither is held during socket
 * I/O (shutdown(2), which never blocks, is called under conn_lock by the
 * reaper and by segment removal); they are never nested.  A connection's
 * request state belongs to the worker that holds it; the reaper reads only
 * its atomics.
 */
#include "xfer_tcp_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "cred.h"
#include "fdlimit.h"
#include "log.h"
#include "moonlet/error.h"
#include "net.h"
#include "writecap.h"
#include "thread.h"

#define MOD "xfer-tcp"

#define TCP_SERVE_BURST 16 /* requests served before re-arming */
#define TCP_DRAIN_CHUNK 16384

/* ---- socket helpers ----------------------------------------------------- */

static void tcp_tune(int fd)
{
    int one = 1, buf = TCP_SOCKBUF_BYTES;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

/* ---- serving side: segments --------------------------------------------- */

typedef struct tcp_segment {
    uint64_t id;
    uint8_t *base;     /* NULL for a reader segment */
    uint64_t size;
    moonlet_xfer_reader reader; /* set: reads are answered by it (never written) */
    void *reader_arg;
    bool keyed;        /* seg_lock: writes need a capability under key */
    uint8_t key[MOONLET_WRITECAP_KEY_BYTES];
    unsigned inflight; /* requests using the memory now */
    bool removed;      /* unregister waits for inflight == 0 */
    LIST_ENTRY(tcp_segment) link; /* in tcp_server.segs (seg_lock) */
} tcp_segment;

/* Where a connection is in serving its current request. */
enum tcp_phase {
    PH_HEADER,  /* receiving a request header (hgot of 48 bytes) */
    PH_AUTH,    /* receiving the token of an AUTH */
    PH_CAP,     /* receiving the write capability that follows a WRITE's header */
    PH_PAYLOAD, /* receiving a WRITE payload into segment memory */
    PH_DRAIN,   /* receiving and discarding the payload of a refused WRITE */
    PH_REPLY,   /* sending a reply header (and a READ's payload) */
};

/* A served connection.  Workers hand it to each other through epoll
 * (EPOLLONESHOT): whoever epoll_wait returns it to owns it until re-arming.
 * Every field but the atomics and the list links belongs to that owner; the
 * reaper (the acceptor thread) reads the atomics only, under conn_lock. */
typedef struct tcp_sconn {
    int fd;
    atomic_bool authed;       /* the reaper reads it */
    uint64_t auth_deadline_ms; /* with a token: closed unless authed by then (set
                                * before the connection is listed, then read only) */
    bool close_after_reply; /* refused AUTH or request before AUTH */
    struct tcp_peer *peer;  /* per-peer count (conn_lock) */
    LIST_ENTRY(tcp_sconn) link; /* in tcp_server.conns (conn_lock) */

    enum tcp_phase phase;
    uint8_t hbuf[MOONLET_XFER_TCP_HDR_BYTES];
    size_t hgot;
    moonlet_xfer_tcp_hdr h;      /* the request being served */
    _Atomic(tcp_segment *) seg;  /* segment memory held by it, or NULL */
    uint64_t done;               /* payload bytes moved so far */
    int status;                  /* a refused WRITE's reply status */
    uint8_t capbuf[MOONLET_XFER_TCP_CAP_BYTES]; /* a WRITE's capability (F_CAP) */
    size_t capgot;
    uint64_t cap_expiry_ms;      /* no payload byte lands at or after it; UINT64_MAX: none */
    uint8_t tok[MOONLET_XFER_MAX_TOKEN_BYTES];
    uint8_t nonce[MOONLET_XFER_TCP_NONCE_BYTES]; /* the CHALLENGE's, for one AUTH */
    bool nonce_out;                              /* a CHALLENGE drew it; no AUTH used it yet */
    uint8_t rbuf[MOONLET_XFER_TCP_HDR_BYTES]; /* the encoded reply header */
    const uint8_t *rpayload;
    void *rowned;                /* a reader segment's reply payload: freed once sent */
    uint64_t rlen, rsent;        /* reply bytes (header + payload) and sent */
    atomic_uint_fast64_t deadline_ms; /* the request's; 0 while waiting for one */
    atomic_uint_fast64_t idle_since_ms;
} tcp_sconn;

/* Open connections from one peer address. */
typedef struct tcp_peer {
    uint8_t addr[16];
    uint8_t len;
    unsigned conns;
    struct tcp_peer *next;
} tcp_peer;

#define TCP_PEER_BUCKETS 256

typedef struct tcp_server {
    moonlet_xfer *x; /* its instance: the newest leader epoch seen (x->epoch) */
    int listen_fd;
    int epfd;
    int stop_fd; /* eventfd, level-triggered in epfd: wakes every worker */
    int reserve_fd; /* spare descriptor: freed to shed a connection at EMFILE */
    pthread_t acceptor;
    pthread_t *workers;
    int nworkers;
    atomic_bool stopping;
    uint32_t timeout_ms;
    uint32_t idle_timeout_ms; /* 0: never */
    unsigned max_conns, max_conns_per_peer;
    const char *token; /* the instance's copy; NULL: no authentication */
    size_t token_len;
    const uint8_t *key; /* SHA-256 of token: the challenge-response key (x->auth_key) */
    const uint8_t (*keys)[32]; /* more keys a client may prove (x->auth_keys) */
    size_t nkeys;
    moonlet_ratelimit accept_log;

    pthread_mutex_t seg_lock;
    pthread_cond_t seg_cond;
    LIST_HEAD(, tcp_segment) segs;

    pthread_mutex_t conn_lock;
    LIST_HEAD(, tcp_sconn) conns;
    unsigned nconns;
    tcp_peer *peers[TCP_PEER_BUCKETS];
    atomic_uint_fast64_t idle_closed; /* connections the reaper shut for idling */
    atomic_uint_fast64_t auth_closed; /* ... for not authenticating in time */
} tcp_server;

/* The segment `id` not being removed, or NULL.  seg_lock held. */
static tcp_segment *tcp_seg_find_locked(tcp_server *s, uint64_t id)
{
    tcp_segment *g;
    LIST_FOREACH(g, &s->segs, link)
        if (g->id == id && !g->removed)
            return g;
    return NULL;
}

/* The segment named segment_id (its id in hex) not being removed, or NULL.
 * seg_lock held. */
static tcp_segment *tcp_seg_named_locked(tcp_server *s, const char *segment_id)
{
    uint64_t id;
    return moonlet_xfer_tcp_parse_seg_id(segment_id, &id) ? NULL : tcp_seg_find_locked(s, id);
}

static tcp_segment *tcp_seg_acquire(tcp_server *s, uint64_t id)
{
    pthread_mutex_lock(&s->seg_lock);
    tcp_segment *g = tcp_seg_find_locked(s, id);
    if (g)
        g->inflight++;
    pthread_mutex_unlock(&s->seg_lock);
    return g;
}

static void tcp_seg_release(tcp_server *s, tcp_segment *g)
{
    pthread_mutex_lock(&s->seg_lock);
    if (--g->inflight == 0 && g->removed)
        pthread_cond_broadcast(&s->seg_cond);
    pthread_mutex_unlock(&s->seg_lock);
}

int moonlet_xfer_tcp_parse_seg_id(const char *s, uint64_t *id)
{
    if (strlen(s) != 16)
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else
            return MOONLET_ERR_SEGMENT_NOT_FOUND;
        v = v << 4 | d;
    }
    *id = v;
    return MOONLET_OK;
}

/* Serves a segment of len bytes: memory at base, or (base NULL) what
 * read returns; fills *info. */
static int tcp_seg_serve(moonlet_xfer *x, uint8_t *base, uint64_t len, moonlet_xfer_reader read,
                         void *arg, moonlet_xfer_segment_info *info)
{
    tcp_server *s = x->be_state;
    tcp_segment *g = calloc(1, sizeof(*g));
    if (!g)
        return MOONLET_ERR_INTERNAL_ERROR;
    g->id = moonlet_xfer_random_id();
    g->base = base;
    g->size = len;
    g->reader = read;
    g->reader_arg = arg;
    pthread_mutex_lock(&s->seg_lock);
    LIST_INSERT_HEAD(&s->segs, g, link);
    pthread_mutex_unlock(&s->seg_lock);
    snprintf(info->segment_id, sizeof(info->segment_id), "%016" PRIx64, g->id);
    snprintf(info->endpoint, sizeof(info->endpoint), "%s", x->endpoint);
    snprintf(info->protocol, sizeof(info->protocol), "tcp");
    info->base = (uint64_t)(uintptr_t)base;
    info->size = len;
    ML_INFO(MOD, "%ssegment %s registered: %" PRIu64 " bytes at %s", read ? "reader " : "",
            info->segment_id, len, x->endpoint);
    return MOONLET_OK;
}

int moonlet_xfer_tcp_seg_add(moonlet_xfer *x, void *base, uint64_t len, moonlet_xfer_segment_info *info)
{
    return tcp_seg_serve(x, base, len, NULL, NULL, info);
}

int moonlet_xfer_tcp_seg_add_reader(moonlet_xfer *x, uint64_t len, moonlet_xfer_reader read,
                                    void *arg, moonlet_xfer_segment_info *info)
{
    return tcp_seg_serve(x, NULL, len, read, arg, info);
}

/* Shuts down the connections whose request holds segment g, so a removal
 * does not wait for a stalled peer's deadline (conn_lock). */
static void tcp_kick_segment_users(tcp_server *s, tcp_segment *g)
{
    pthread_mutex_lock(&s->conn_lock);
    tcp_sconn *c;
    LIST_FOREACH(c, &s->conns, link)
        if (atomic_load(&c->seg) == g)
            shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->conn_lock);
}

int moonlet_xfer_tcp_seg_remove(moonlet_xfer *x, const char *segment_id)
{
    tcp_server *s = x->be_state;
    if (!s)
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    pthread_mutex_lock(&s->seg_lock);
    tcp_segment *g = tcp_seg_named_locked(s, segment_id);
    if (!g) {
        pthread_mutex_unlock(&s->seg_lock);
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    }
    g->removed = true;
    bool busy = g->inflight > 0;
    pthread_mutex_unlock(&s->seg_lock);
    if (busy)
        tcp_kick_segment_users(s, g); /* never with seg_lock held: the locks do not nest */
    pthread_mutex_lock(&s->seg_lock);
    while (g->inflight)
        pthread_cond_wait(&s->seg_cond, &s->seg_lock);
    LIST_REMOVE(g, link);
    pthread_mutex_unlock(&s->seg_lock);
    free(g);
    return MOONLET_OK;
}

int moonlet_xfer_tcp_seg_set_key(moonlet_xfer *x, const char *segment_id, const uint8_t *key)
{
    tcp_server *s = x->be_state;
    if (!s)
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    pthread_mutex_lock(&s->seg_lock);
    tcp_segment *g = tcp_seg_named_locked(s, segment_id);
    if (g) {
        memcpy(g->key, key, sizeof(g->key));
        g->keyed = true;
    }
    pthread_mutex_unlock(&s->seg_lock);
    return g ? MOONLET_OK : MOONLET_ERR_SEGMENT_NOT_FOUND;
}

/* ---- serving side: requests --------------------------------------------- *
 *
 * A connection serves one request at a time through the phases of
 * enum tcp_phase.  Every socket call is non-blocking: when the peer has
 * nothing more to give (or cannot take more), the worker parks the
 * connection in epoll and serves others, so a slow or stalled peer never
 * holds a worker.  A request's deadline starts with its first header byte:
 * the header must be complete, the payload received and the reply taken
 * within timeout_ms plus one millisecond per TCP_MIN_RATE_BYTES_PER_MS of
 * payload; the reaper (tcp_reap) shuts down connections past it, and
 * connections idle between requests for idle_timeout_ms.
 */

#define TCP_MIN_RATE_BYTES_PER_MS (16u << 10) /* 16 MB/s: slower payloads fail */

typedef enum { STEP_AGAIN_IN, STEP_AGAIN_OUT, STEP_NEXT, STEP_CLOSE } tcp_step_rc;

/* Non-blocking receive: >0 bytes, 0 when nothing is there yet, -1 on EOF or
 * error. */
static ssize_t tcp_recv_some(int fd, void *buf, size_t n)
{
    for (;;) {
        ssize_t r = recv(fd, buf, n, MSG_DONTWAIT);
        if (r > 0)
            return r;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        return -1;
    }
}

/* Receives what has arrived of buf[*got..n), advancing *got: STEP_CLOSE on
 * EOF or error, STEP_AGAIN_IN when nothing is there yet, else STEP_NEXT. */
static tcp_step_rc tcp_recv_fill(int fd, uint8_t *buf, size_t n, size_t *got)
{
    ssize_t r = tcp_recv_some(fd, buf + *got, n - *got);
    if (r < 0)
        return STEP_CLOSE;
    if (r == 0)
        return STEP_AGAIN_IN;
    *got += (size_t)r;
    return STEP_NEXT;
}

/* The request's deadline: timeout_ms from now, plus time for `payload` bytes
 * at TCP_MIN_RATE_BYTES_PER_MS.  Callers pass a payload length only once the
 * request has been checked against its segment (tcp_request_in_bounds), so
 * a declared length never buys time by itself. */
static void tcp_set_deadline(tcp_server *s, tcp_sconn *c, uint64_t payload)
{
    uint64_t start = moonlet_xfer_now_ms();
    atomic_store(&c->deadline_ms, start + s->timeout_ms + payload / TCP_MIN_RATE_BYTES_PER_MS);
}

/* Queues a reply (header, and for a READ its payload) and enters PH_REPLY. */
static void tcp_queue_reply(tcp_sconn *c, int status, const uint8_t *payload, uint64_t len)
{
    moonlet_xfer_tcp_hdr h = c->h;
    h.op = (uint8_t)(c->h.op | MOONLET_XFER_TCP_REPLY);
    h.flags = 0; /* F_CAP belongs to requests only */
    h.status = status;
    h.length = status ? 0 : len;
    moonlet_xfer_tcp_hdr_encode(&h, c->rbuf);
    c->rpayload = status ? NULL : payload;
    c->rlen = MOONLET_XFER_TCP_HDR_BYTES + h.length;
    c->rsent = 0;
    c->phase = PH_REPLY;
}

/* The segment the request names, with its range checked; NULL and *status. */
static tcp_segment *tcp_check_request(tcp_server *s, const moonlet_xfer_tcp_hdr *h, int *status)
{
    tcp_segment *g = tcp_seg_acquire(s, h->segment);
    if (!g) {
        *status = MOONLET_ERR_SEGMENT_NOT_FOUND;
        return NULL;
    }
    if (h->offset > g->size || h->length > g->size - h->offset) {
        tcp_seg_release(s, g);
        *status = MOONLET_ERR_INVALID_PARAMS;
        return NULL;
    }
    *status = MOONLET_OK;
    return g;
}

/* Whether a READ or WRITE header names a served segment and a range inside
 * it (checked again when the request is served: the segment may go). */
static bool tcp_request_in_bounds(tcp_server *s, const moonlet_xfer_tcp_hdr *h)
{
    pthread_mutex_lock(&s->seg_lock);
    tcp_segment *g = tcp_seg_find_locked(s, h->segment);
    bool ok = g && h->offset <= g->size && h->length <= g->size - h->offset;
    pthread_mutex_unlock(&s->seg_lock);
    return ok;
}

static void tcp_drop_segment(tcp_server *s, tcp_sconn *c)
{
    free(c->rowned);
    c->rowned = NULL;
    tcp_segment *g = atomic_exchange(&c->seg, NULL);
    if (g)
        tcp_seg_release(s, g);
}

/*
 * The write-capability check, before any payload byte is received: a segment
 * with a key accepts a write only with a genuine capability that covers the
 * written range and has not expired; *expiry_ms gets the instant after which
 * no more bytes may land (UINT64_MAX for a segment without a key).  Returns 0
 * or MOONLET_ERR_INVALID_WRITE.
 */
static int tcp_write_cap_check(tcp_server *s, tcp_segment *g, const moonlet_xfer_tcp_hdr *h,
                               const moonlet_writecap *cap, uint64_t *expiry_ms)
{
    uint8_t key[MOONLET_WRITECAP_KEY_BYTES];
    pthread_mutex_lock(&s->seg_lock);
    bool keyed = g->keyed;
    memcpy(key, g->key, sizeof(key));
    pthread_mutex_unlock(&s->seg_lock);
    *expiry_ms = UINT64_MAX;
    if (!keyed)
        return MOONLET_OK;
    char id[17];
    snprintf(id, sizeof(id), "%016" PRIx64, g->id);
    bool ok = cap && moonlet_writecap_valid(key, id, cap, h->offset, h->length,
                                            moonlet_xfer_now_ms());
    explicit_bzero(key, sizeof(key));
    if (!ok) {
        ML_WARN(MOD, "write of [%" PRIu64 ", +%" PRIu64 ") to segment %s refused: %s", h->offset,
                h->length, id, cap ? "capability forged, out of range or expired"
                                   : "no capability");
        return MOONLET_ERR_INVALID_WRITE;
    }
    /* Fencing at the resource: a capability of a leader older than the
     * newest this node has seen is stale (that leader may be frozen past its
     * term); a genuine one of a newer epoch tells the node of it. */
    uint64_t epoch = moonlet_writecap_epoch(cap), seen = moonlet_xfer_epoch(s->x);
    if (epoch < seen) {
        ML_WARN(MOD, "write of [%" PRIu64 ", +%" PRIu64 ") to segment %s refused: capability of "
                "leader epoch %" PRIu64 ", older than epoch %" PRIu64 " seen", h->offset, h->length,
                id, epoch, seen);
        return MOONLET_ERR_INVALID_WRITE;
    }
    moonlet_xfer_note_epoch(s->x, epoch);
    *expiry_ms = moonlet_writecap_expiry(cap);
    return MOONLET_OK;
}

/* A WRITE's header (and capability, with F_CAP) is in: take the segment
 * when the range and the capability allow the write, else prepare to discard
 * its payload and refuse it. */
static void tcp_begin_write(tcp_server *s, tcp_sconn *c)
{
    int status;
    tcp_segment *g = tcp_check_request(s, &c->h, &status);
    c->done = 0;
    c->cap_expiry_ms = UINT64_MAX;
    if (g && g->reader) { /* a reader segment is never written */
        tcp_seg_release(s, g);
        g = NULL;
        status = MOONLET_ERR_INVALID_WRITE;
    }
    if (g) {
        moonlet_writecap cap;
        bool has_cap = c->h.flags & MOONLET_XFER_TCP_F_CAP;
        if (has_cap) {
            moonlet_xfer_tcp_cap w;
            moonlet_xfer_tcp_cap_decode(c->capbuf, &w);
            cap = (moonlet_writecap){.offset = w.offset, .len = w.len,
                                     .expiry_ms = w.expiry_ms, .tag = w.tag};
        }
        status = tcp_write_cap_check(s, g, &c->h, has_cap ? &cap : NULL, &c->cap_expiry_ms);
        if (status) {
            tcp_seg_release(s, g);
            g = NULL;
        }
    }
    if (!g) {
        c->status = status;
        c->phase = PH_DRAIN;
        return;
    }
    atomic_store(&c->seg, g);
    c->phase = PH_PAYLOAD;
}

/* Receives the 32-byte capability that follows a WRITE header with F_CAP. */
static tcp_step_rc tcp_cap_step(tcp_server *s, tcp_sconn *c)
{
    tcp_step_rc rc = tcp_recv_fill(c->fd, c->capbuf, sizeof(c->capbuf), &c->capgot);
    if (rc != STEP_NEXT)
        return rc;
    if (c->capgot == sizeof(c->capbuf))
        tcp_begin_write(s, c);
    return STEP_NEXT;
}

/* A READ's header is in: reply with the segment's bytes (held until sent). */
static void tcp_begin_read(tcp_server *s, tcp_sconn *c)
{
    int status;
    tcp_segment *g = tcp_check_request(s, &c->h, &status);
    if (!g) {
        tcp_queue_reply(c, status, NULL, 0);
        return;
    }
    atomic_store(&c->seg, g);
    if (g->reader) { /* its bytes come from the function, on this thread */
        void *buf = NULL;
        status = c->h.length ? g->reader(g->reader_arg, c->h.offset, c->h.length, &buf)
                             : MOONLET_OK;
        if (status == MOONLET_OK && c->h.length && !buf)
            status = MOONLET_ERR_INTERNAL_ERROR;
        if (status) {
            free(buf);
            tcp_drop_segment(s, c);
            tcp_queue_reply(c, status, NULL, 0);
            return;
        }
        c->rowned = buf;
        tcp_queue_reply(c, MOONLET_OK, buf, c->h.length);
        return;
    }
    tcp_queue_reply(c, MOONLET_OK, g->base + c->h.offset, c->h.length);
}

/* Parses a complete request header and starts serving it. */
static tcp_step_rc tcp_parse_request_header(tcp_server *s, tcp_sconn *c)
{
    if (moonlet_xfer_tcp_hdr_decode(c->hbuf, &c->h) || (c->h.op & MOONLET_XFER_TCP_REPLY)) {
        ML_WARN(MOD, "malformed request header, closing connection");
        return STEP_CLOSE;
    }
    /* Payload time only for a range the server serves: a refused WRITE's
     * payload is drained within timeout_ms, or its connection closed. */
    bool data_op = c->h.op == MOONLET_XFER_TCP_READ || c->h.op == MOONLET_XFER_TCP_WRITE;
    bool served = data_op && (!s->token || atomic_load(&c->authed)) &&
                  tcp_request_in_bounds(s, &c->h);
    tcp_set_deadline(s, c, served ? c->h.length : 0);
    c->done = 0;
    if (c->h.op == MOONLET_XFER_TCP_CHALLENGE) {
        if (c->h.length != 0) {
            ML_WARN(MOD, "CHALLENGE with a payload, closing connection");
            return STEP_CLOSE;
        }
        moonlet_cred_nonce(c->nonce); /* a fresh one: an earlier, unused one is gone */
        c->nonce_out = true;
        tcp_queue_reply(c, MOONLET_OK, c->nonce, sizeof(c->nonce));
    } else if (c->h.op == MOONLET_XFER_TCP_AUTH) {
        c->phase = PH_AUTH;
    } else if (s->token && !atomic_load(&c->authed)) {
        ML_WARN(MOD, "request before authentication, closing connection");
        c->close_after_reply = true;
        tcp_queue_reply(c, MOONLET_ERR_ILLEGAL_CLIENT, NULL, 0);
    } else if (c->h.op == MOONLET_XFER_TCP_READ) {
        tcp_begin_read(s, c);
    } else if (c->h.flags & MOONLET_XFER_TCP_F_CAP) {
        c->capgot = 0;
        c->phase = PH_CAP;
    } else {
        tcp_begin_write(s, c);
    }
    return STEP_NEXT;
}

static tcp_step_rc tcp_header_step(tcp_server *s, tcp_sconn *c)
{
    size_t had = c->hgot;
    tcp_step_rc rc = tcp_recv_fill(c->fd, c->hbuf, sizeof(c->hbuf), &c->hgot);
    if (rc != STEP_NEXT)
        return rc;
    if (had == 0)
        tcp_set_deadline(s, c, 0); /* the header itself is due within timeout_ms */
    if (c->hgot < sizeof(c->hbuf))
        return STEP_NEXT;
    c->hgot = 0;
    return tcp_parse_request_header(s, c);
}

static tcp_step_rc tcp_auth_step(tcp_server *s, tcp_sconn *c)
{
    if (c->done < c->h.length) {
        size_t got = (size_t)c->done;
        tcp_step_rc rc = tcp_recv_fill(c->fd, c->tok, (size_t)c->h.length, &got);
        c->done = got;
        if (rc != STEP_NEXT)
            return rc;
        if (c->done < c->h.length)
            return STEP_NEXT;
    }
    /* Challenge-response only (xfer_tcp.h): the token in clear would open
     * any connection to whoever captured it once. */
    bool mac = (c->h.flags & MOONLET_XFER_TCP_F_MAC) &&
               c->h.length == MOONLET_XFER_TCP_MAC_AUTH_BYTES;
    bool ok = !s->token ||
              (mac && c->nonce_out &&
               moonlet_cred_mac_check(s->keys, s->nkeys, s->key, "tcp", c->nonce, c->tok,
                                      c->tok + MOONLET_XFER_TCP_NONCE_BYTES));
    bool had_nonce = c->nonce_out;
    explicit_bzero(c->tok, sizeof(c->tok));
    explicit_bzero(c->nonce, sizeof(c->nonce)); /* one AUTH per CHALLENGE */
    c->nonce_out = false;
    if (!ok) {
        ML_WARN(MOD, "connection refused: %s",
                !mac ? "AUTH without challenge-response (a token in clear, or an older client)"
                : !had_nonce ? "AUTH without a CHALLENGE before it (a replay?)"
                             : "wrong auth proof (wrong token, or a replayed exchange)");
        c->close_after_reply = true;
        tcp_queue_reply(c, MOONLET_ERR_ILLEGAL_CLIENT, NULL, 0);
    } else {
        atomic_store(&c->authed, true);
        tcp_queue_reply(c, MOONLET_OK, NULL, 0);
    }
    return STEP_NEXT;
}

/*
 * The two places segment memory meets a socket.  They are separate,
 * never-inlined functions so a ThreadSanitizer run whose clients share the
 * process can name them: the ordering between these copies and a client's
 * next request travels through the loopback socket, which TSan cannot see.
 * Both are non-blocking and move what the socket has (or takes) now.
 */
__attribute__((noinline)) static ssize_t tcp_segment_send(int fd, struct iovec *iov, int cnt)
{
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
    for (;;) {
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w >= 0)
            return w;
        if (errno == EINTR)
            continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
}


/* Receives what has arrived of a WRITE payload straight into the segment:
 * >0 bytes, 0 when nothing is there yet, -1 on EOF or error. */
__attribute__((noinline)) static ssize_t tcp_segment_recv(int fd, uint8_t *dst, uint64_t len)
{
    size_t k = len > (1u << 30) ? (1u << 30) : (size_t)len; /* recv() takes a size_t */
    return tcp_recv_some(fd, dst, k);
}

/* Counts a payload receive (r: a tcp_recv_some result) into c->done: true
 * once the whole payload is in; else false with *rc what the step returns
 * (STEP_CLOSE, STEP_AGAIN_IN, or STEP_NEXT while bytes are still due). */
static bool tcp_payload_in(tcp_sconn *c, ssize_t r, tcp_step_rc *rc)
{
    if (r <= 0) {
        *rc = r < 0 ? STEP_CLOSE : STEP_AGAIN_IN;
        return false;
    }
    c->done += (uint64_t)r;
    *rc = STEP_NEXT;
    return c->done >= c->h.length;
}

/* Receives the WRITE payload; the reply follows the last byte. */
static tcp_step_rc tcp_payload_step(tcp_server *s, tcp_sconn *c)
{
    tcp_segment *g = atomic_load(&c->seg);
    if (c->done < c->h.length) {
        /* no byte lands once the write's capability expired: the check runs
         * right before each non-blocking receive into the segment */
        if (moonlet_xfer_now_ms() >= c->cap_expiry_ms) {
            ML_WARN(MOD, "write of [%" PRIu64 ", +%" PRIu64 ") refused: its capability expired "
                    "with %" PRIu64 " bytes still to come", c->h.offset, c->h.length,
                    c->h.length - c->done);
            tcp_drop_segment(s, c);
            c->status = MOONLET_ERR_INVALID_WRITE;
            c->phase = PH_DRAIN;
            return STEP_NEXT;
        }
        ssize_t r = tcp_segment_recv(c->fd, g->base + c->h.offset + c->done,
                                     c->h.length - c->done);
        tcp_step_rc rc;
        if (!tcp_payload_in(c, r, &rc))
            return rc;
    }
    tcp_drop_segment(s, c);
    tcp_queue_reply(c, MOONLET_OK, NULL, 0);
    return STEP_NEXT;
}

/* Reads and discards the payload of a refused write, then replies. */
static tcp_step_rc tcp_drain_step(tcp_server *s, tcp_sconn *c)
{
    if (c->done < c->h.length) {
        uint8_t sink[TCP_DRAIN_CHUNK];
        uint64_t left = c->h.length - c->done;
        ssize_t r = tcp_recv_some(c->fd, sink, left < sizeof(sink) ? (size_t)left : sizeof(sink));
        tcp_step_rc rc;
        if (!tcp_payload_in(c, r, &rc))
            return rc;
    }
    tcp_queue_reply(c, c->status, NULL, 0);
    return STEP_NEXT;
}

/* Sends what the socket takes of the reply; back to PH_HEADER when done. */
static tcp_step_rc tcp_reply_step(tcp_server *s, tcp_sconn *c)
{
    while (c->rsent < c->rlen) {
        struct iovec iov[2];
        int n = 0;
        if (c->rsent < MOONLET_XFER_TCP_HDR_BYTES)
            iov[n++] = (struct iovec){c->rbuf + c->rsent, MOONLET_XFER_TCP_HDR_BYTES - c->rsent};
        uint64_t poff = c->rsent > MOONLET_XFER_TCP_HDR_BYTES ? c->rsent - MOONLET_XFER_TCP_HDR_BYTES
                                                              : 0;
        uint64_t pleft = c->rlen - MOONLET_XFER_TCP_HDR_BYTES - poff;
        if (pleft)
            iov[n++] = (struct iovec){(void *)(c->rpayload + poff),
                                      pleft > (1u << 30) ? (1u << 30) : (size_t)pleft};
        ssize_t w = tcp_segment_send(c->fd, iov, n);
        if (w < 0)
            return STEP_CLOSE;
        if (w == 0)
            return STEP_AGAIN_OUT;
        c->rsent += (uint64_t)w;
    }
    tcp_drop_segment(s, c);
    if (c->close_after_reply)
        return STEP_CLOSE;
    c->phase = PH_HEADER;
    atomic_store(&c->idle_since_ms, moonlet_xfer_now_ms()); /* first: the reaper reads */
    atomic_store(&c->deadline_ms, 0);                       /* deadline, then idle_since */
    return STEP_NEXT;
}

/* Advances the connection's request by one step. */
static tcp_step_rc tcp_step(tcp_server *s, tcp_sconn *c)
{
    switch (c->phase) {
    case PH_HEADER: return tcp_header_step(s, c);
    case PH_AUTH: return tcp_auth_step(s, c);
    case PH_CAP: return tcp_cap_step(s, c);
    case PH_PAYLOAD: return tcp_payload_step(s, c);
    case PH_DRAIN: return tcp_drain_step(s, c);
    case PH_REPLY: return tcp_reply_step(s, c);
    }
    return STEP_CLOSE;
}

static void tcp_peer_put_locked(tcp_server *s, tcp_peer *p);

static void tcp_sconn_close(tcp_server *s, tcp_sconn *c)
{
    tcp_drop_segment(s, c);
    pthread_mutex_lock(&s->conn_lock);
    LIST_REMOVE(c, link);
    s->nconns--;
    tcp_peer_put_locked(s, c->peer);
    pthread_mutex_unlock(&s->conn_lock);
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c);
}

/*
 * Hands a connection (back) to the pool: the next worker epoll_wait returns
 * it to owns it.  Re-arming is DEL + ADD rather than MOD: ADD is the hand-off
 * ThreadSanitizer understands (and one extra syscall per burst is noise next
 * to the transfer), so a sanitizer run shows real races only.
 */
static int tcp_arm(tcp_server *s, tcp_sconn *c, bool rearm, uint32_t dir)
{
    struct epoll_event ev = {.events = dir | EPOLLRDHUP | EPOLLONESHOT, .data.ptr = c};
    if (rearm)
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    return epoll_ctl(s->epfd, EPOLL_CTL_ADD, c->fd, &ev);
}

/* A worker was handed a ready connection: serves until the peer has nothing
 * more for now (or a burst of requests is done, for fairness), then parks it
 * in epoll waiting for the direction its request needs. */
static void tcp_serve_conn(tcp_server *s, tcp_sconn *c)
{
    int served = 0;
    uint32_t dir = EPOLLIN;
    for (;;) {
        if (atomic_load(&s->stopping)) {
            tcp_sconn_close(s, c);
            return;
        }
        enum tcp_phase before = c->phase;
        tcp_step_rc rc = tcp_step(s, c);
        if (rc == STEP_CLOSE) {
            tcp_sconn_close(s, c);
            return;
        }
        if (rc == STEP_AGAIN_IN || rc == STEP_AGAIN_OUT) {
            dir = rc == STEP_AGAIN_IN ? EPOLLIN : EPOLLOUT;
            break;
        }
        if (before == PH_REPLY && c->phase == PH_HEADER && ++served >= TCP_SERVE_BURST)
            break; /* re-armed for EPOLLIN: level-triggered, it comes back if more is queued */
    }
    if (tcp_arm(s, c, true, dir))
        tcp_sconn_close(s, c);
}

static void *tcp_worker_main(void *arg)
{
    tcp_server *s = arg;
    for (;;) {
        struct epoll_event ev;
        int n = epoll_wait(s->epfd, &ev, 1, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || ev.data.ptr == NULL || atomic_load(&s->stopping))
            break;
        tcp_serve_conn(s, ev.data.ptr);
    }
    return NULL;
}

/* ---- serving side: connection limits and deadlines ---------------------- */

#define TCP_REAP_MS 200         /* reaper period */
#define TCP_ACCEPT_BACKOFF_MS 100
#define TCP_LOG_EVERY_MS 5000

static unsigned tcp_peer_hash(const uint8_t *a, uint8_t len)
{
    unsigned h = 2166136261u;
    for (uint8_t i = 0; i < len; i++)
        h = (h ^ a[i]) * 16777619u;
    return h % TCP_PEER_BUCKETS;
}

/* The peer's entry with one more connection, or NULL when the peer is at
 * its cap (or out of memory).  conn_lock held. */
static tcp_peer *tcp_peer_get_locked(tcp_server *s, const uint8_t *a, uint8_t len)
{
    tcp_peer **b = &s->peers[tcp_peer_hash(a, len)], *p = *b;
    while (p && (p->len != len || memcmp(p->addr, a, len)))
        p = p->next;
    if (!p) {
        if (!(p = calloc(1, sizeof(*p))))
            return NULL;
        memcpy(p->addr, a, len);
        p->len = len;
        p->next = *b;
        *b = p;
    }
    if (s->max_conns_per_peer && p->conns >= s->max_conns_per_peer)
        return NULL;
    p->conns++;
    return p;
}

static void tcp_peer_put_locked(tcp_server *s, tcp_peer *p)
{
    if (!p || --p->conns)
        return;
    tcp_peer **pp = &s->peers[tcp_peer_hash(p->addr, p->len)];
    while (*pp != p)
        pp = &(*pp)->next;
    *pp = p->next;
    free(p);
}

/* The address bytes that identify a peer for the per-peer cap: an IPv4
 * address (IPv4-mapped IPv6 as IPv4), an IPv6 address's /64. */
uint8_t moonlet_xfer_tcp_peer_key(const struct sockaddr_storage *ss, uint8_t out[16])
{
    if (ss->ss_family == AF_INET) {
        memcpy(out, &((const struct sockaddr_in *)ss)->sin_addr, 4);
        return 4;
    }
    if (ss->ss_family == AF_INET6) {
        const uint8_t *a = ((const struct sockaddr_in6 *)ss)->sin6_addr.s6_addr;
        static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(a, mapped, 12) == 0) {
            memcpy(out, a + 12, 4);
            return 4;
        }
        memcpy(out, a, 8); /* the /64: one host may use any address of it */
        return 8;
    }
    return 0;
}

__attribute__((format(printf, 2, 3)))
static void tcp_log_limited(tcp_server *s, const char *fmt, ...)
{
    uint64_t held;
    if (!moonlet_ratelimit_allow(&s->accept_log, TCP_LOG_EVERY_MS, &held))
        return;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ML_WARN(MOD, "%s (%llu more such events not logged)", msg, (unsigned long long)held);
}

/* Out of descriptors: frees the reserved one to take the oldest waiting
 * connection off the listen queue and close it, then reserves again. */
static void tcp_shed_at_fd_limit(tcp_server *s, int err)
{
    if (s->reserve_fd >= 0) {
        close(s->reserve_fd);
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0)
            close(fd);
        s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    tcp_log_limited(s, "accept failed: %s; backing off", strerror(err));
}

/* Accepts one connection; false after a resource error (back off). */
static bool tcp_accept_one(tcp_server *s)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            tcp_shed_at_fd_limit(s, errno);
            return false;
        }
        return true;
    }
    uint8_t key[16];
    uint8_t klen = moonlet_xfer_tcp_peer_key(&ss, key);
    tcp_sconn *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return false;
    }
    pthread_mutex_lock(&s->conn_lock);
    bool full = s->max_conns && s->nconns >= s->max_conns;
    tcp_peer *p = full ? NULL : tcp_peer_get_locked(s, key, klen);
    if (p) {
        c->fd = fd;
        c->peer = p;
        c->auth_deadline_ms = s->token ? moonlet_xfer_now_ms() + s->timeout_ms : 0;
        atomic_store(&c->idle_since_ms, moonlet_xfer_now_ms());
        LIST_INSERT_HEAD(&s->conns, c, link);
        s->nconns++;
    }
    pthread_mutex_unlock(&s->conn_lock);
    if (!p) {
        tcp_log_limited(s, full ? "connection cap of %u reached: closing new connections"
                                : "a peer reached its cap of %u connections: closing its new ones",
                        full ? s->max_conns : s->max_conns_per_peer);
        close(fd);
        free(c);
        return true;
    }
    tcp_tune(fd);
    if (tcp_arm(s, c, false, EPOLLIN))
        tcp_sconn_close(s, c);
    return true;
}

/* Shuts down connections past their request deadline or idle too long; the
 * worker that then gets the connection sees the error and closes it. */
static void tcp_reap(tcp_server *s)
{
    uint64_t now = moonlet_xfer_now_ms();
    unsigned late = 0, idle = 0, unauthed = 0;
    pthread_mutex_lock(&s->conn_lock);
    tcp_sconn *c;
    LIST_FOREACH(c, &s->conns, link) {
        uint64_t d = atomic_load(&c->deadline_ms);
        if (c->auth_deadline_ms && now > c->auth_deadline_ms && !atomic_load(&c->authed)) {
            atomic_fetch_add(&s->auth_closed, 1); /* counted first: tests wait on the close */
            shutdown(c->fd, SHUT_RDWR); /* even with no idle timeout (issue 31 finding 6) */
            unauthed++;
        } else if (d) {
            if (now > d) {
                shutdown(c->fd, SHUT_RDWR);
                late++;
            }
        } else if (s->idle_timeout_ms &&
                   now - atomic_load(&c->idle_since_ms) > s->idle_timeout_ms) {
            shutdown(c->fd, SHUT_RDWR);
            idle++;
        }
    }
    pthread_mutex_unlock(&s->conn_lock);
    if (late)
        ML_DEBUG(MOD, "%u connections past their request deadline closed", late);
    if (unauthed)
        ML_DEBUG(MOD, "%u connections not authenticated in time closed", unauthed);
    if (idle) {
        atomic_fetch_add(&s->idle_closed, idle);
        ML_DEBUG(MOD, "%u idle connections closed", idle);
    }
}

static void *tcp_acceptor_main(void *arg)
{
    tcp_server *s = arg;
    uint64_t next_reap = moonlet_xfer_now_ms() + TCP_REAP_MS;
    while (!atomic_load(&s->stopping)) {
        struct pollfd p[2] = {{.fd = s->listen_fd, .events = POLLIN},
                              {.fd = s->stop_fd, .events = POLLIN}};
        uint64_t now = moonlet_xfer_now_ms();
        int n = poll(p, 2, next_reap > now ? (int)(next_reap - now) : 0);
        if (n < 0 && errno != EINTR)
            break;
        if (n > 0 && p[1].revents)
            break;
        if (n > 0 && (p[0].revents & POLLIN) && !tcp_accept_one(s))
            poll(&p[1], 1, TCP_ACCEPT_BACKOFF_MS);
        if (moonlet_xfer_now_ms() >= next_reap) {
            tcp_reap(s);
            next_reap = moonlet_xfer_now_ms() + TCP_REAP_MS;
        }
    }
    return NULL;
}

/* ---- serving side: lifetime --------------------------------------------- */

static int tcp_listen(moonlet_xfer *x, tcp_server *s)
{
    char host[256];
    uint16_t port;
    if (moonlet_net_split_hostport(x->listen_addr, host, sizeof(host), &port))
        return MOONLET_ERR_INVALID_PARAMS;
    int fd = moonlet_net_listen_tcp(host, port, 1024, NULL);
    if (fd == MOONLET_NET_EADDR)
        return MOONLET_ERR_INVALID_PARAMS;
    if (fd < 0) {
        ML_ERR(MOD, "cannot listen on %s: %s", x->listen_addr, strerror(errno));
        return MOONLET_ERR_TRANSFER_FAIL;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    s->listen_fd = fd;
    return moonlet_xfer_format_endpoint(&ss, x->endpoint, sizeof(x->endpoint));
}

/* Walks a singly linked list through ->next; the body may free var. */
#define LIST_FOR_EACH_SAFE(type, var, head)                                                    \
    for (type *var = (head), *var##_next; var != NULL && (var##_next = var->next, true);       \
         var = var##_next)

static void tcp_server_free(tcp_server *s)
{
    while (!LIST_EMPTY(&s->conns)) {
        tcp_sconn *c = LIST_FIRST(&s->conns);
        LIST_REMOVE(c, link);
        close(c->fd);
        free(c);
    }
    for (int i = 0; i < TCP_PEER_BUCKETS; i++)
        LIST_FOR_EACH_SAFE(tcp_peer, p, s->peers[i])
            free(p);
    if (s->reserve_fd >= 0)
        close(s->reserve_fd);
    while (!LIST_EMPTY(&s->segs)) {
        tcp_segment *g = LIST_FIRST(&s->segs);
        LIST_REMOVE(g, link);
        free(g);
    }
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->epfd >= 0)
        close(s->epfd);
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    pthread_mutex_destroy(&s->seg_lock);
    pthread_cond_destroy(&s->seg_cond);
    pthread_mutex_destroy(&s->conn_lock);
    free(s->workers);
    free(s);
}

/* Wakes and joins every thread; closes connections blocked in I/O. */
static void tcp_server_stop_threads(tcp_server *s, bool acceptor_started)
{
    atomic_store(&s->stopping, true);
    uint64_t one = 1;
    ssize_t w = write(s->stop_fd, &one, sizeof(one));
    (void)w;
    if (acceptor_started)
        pthread_join(s->acceptor, NULL);
    pthread_mutex_lock(&s->conn_lock);
    tcp_sconn *c;
    LIST_FOREACH(c, &s->conns, link)
        shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->conn_lock);
    for (int i = 0; i < s->nworkers; i++)
        pthread_join(s->workers[i], NULL);
    s->nworkers = 0;
}

static int tcp_server_threads(moonlet_xfer *x, tcp_server *s)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->stop_fd, &ev))
        return MOONLET_ERR_INTERNAL_ERROR;
    s->workers = calloc((size_t)x->server_threads, sizeof(pthread_t));
    if (!s->workers)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (int i = 0; i < x->server_threads; i++) {
        if (moonlet_thread_create(&s->workers[i], tcp_worker_main, s, "tcp-data")) {
            tcp_server_stop_threads(s, false);
            return MOONLET_ERR_INTERNAL_ERROR;
        }
        s->nworkers++;
    }
    if (moonlet_thread_create(&s->acceptor, tcp_acceptor_main, s, "tcp-accept")) {
        tcp_server_stop_threads(s, false);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    return MOONLET_OK;
}

int moonlet_xfer_tcp_server_start(moonlet_xfer *x)
{
    if (!x->listen_addr)
        return MOONLET_OK; /* client only */
    tcp_server *s = calloc(1, sizeof(*s));
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    s->listen_fd = -1;
    s->x = x;
    s->timeout_ms = x->timeout_ms;
    s->idle_timeout_ms = x->server_idle_timeout_ms;
    s->max_conns = x->server_max_conns;
    s->max_conns_per_peer = x->server_max_conns_per_peer;
    s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s->token = x->token;
    s->token_len = x->token_len;
    s->key = x->auth_key;
    s->keys = (const uint8_t(*)[32])x->auth_keys;
    s->nkeys = x->nauth_keys;
    pthread_mutex_init(&s->seg_lock, NULL);
    pthread_cond_init(&s->seg_cond, NULL);
    pthread_mutex_init(&s->conn_lock, NULL);
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    s->stop_fd = eventfd(0, EFD_CLOEXEC);
    int rc = s->epfd < 0 || s->stop_fd < 0 ? MOONLET_ERR_INTERNAL_ERROR : tcp_listen(x, s);
    if (rc == MOONLET_OK)
        rc = tcp_server_threads(x, s);
    if (rc) {
        tcp_server_free(s);
        x->endpoint[0] = '\0';
        return rc;
    }
    x->be_state = s;
    ML_INFO(MOD, "serving on %s with %d threads, at most %u connections (%u per peer)",
            x->endpoint, x->server_threads, s->max_conns, s->max_conns_per_peer);
    return MOONLET_OK;
}

void moonlet_xfer_tcp_server_stop(moonlet_xfer *x)
{
    tcp_server *s = x->be_state;
    if (!s)
        return;
    tcp_server_stop_threads(s, true);
    tcp_server_free(s);
    x->be_state = NULL;
}

uint64_t moonlet_xfer_tcp_idle_closed(moonlet_xfer *x)
{
    tcp_server *s = x->be_state;
    return s ? atomic_load(&s->idle_closed) : 0;
}

uint64_t moonlet_xfer_tcp_auth_closed(moonlet_xfer *x)
{
    tcp_server *s = x->be_state;
    return s ? atomic_load(&s->auth_closed) : 0;
}
