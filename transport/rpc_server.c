/*
 * rpc_server.c - the control-plane RPC server: one acceptor thread plus N
 * epoll event-loop threads serving length-prefixed msgpack requests.
 *
 * Why it is built this way:
 *  - The acceptor only accepts; it hands each socket round-robin to a loop
 *    through a small mutex-protected queue and an eventfd wake-up.  From then
 *    on the connection belongs to that loop alone, so connection state needs
 *    no locking and replies leave in request order.
 *  - Loops use level-triggered epoll on non-blocking sockets.  One read per
 *    readiness event fills the connection's input buffer; every complete
 *    frame in it is handled inline (pipelining), the replies are appended to
 *    the connection's output builder and written with one send().  What the
 *    socket does not take waits for EPOLLOUT.
 *  - Zero copies and no per-request malloc on the hot path: requests are
 *    decoded in place (moonlet_request_decode_ref) into a per-loop zone that
 *    is cleared after each request, and the handler packs its result straight
 *    into the output buffer behind a reserved reply header whose fixed-width
 *    code is patched afterwards (moonlet_reply_patch_code).  Input and output
 *    buffers are reused per connection and shrunk when a huge frame is gone.
 *  - Back-pressure: a connection whose unsent replies exceed OUT_HIGH_WATER
 *    stops being read until they drain, so a client that pipelines without
 *    reading cannot grow server memory without bound.
 *  - Bad input closes only its own connection, after an INVALID_PARAMS reply
 *    where one is possible.  Such a "closing" connection flushes the reply,
 *    shuts down its write side and discards input for up to LINGER_MS, so the
 *    peer reads the reply instead of a reset.
 *  - stop() sets a flag and writes every eventfd; loops also wake every
 *    LOOP_TICK_MS, so it returns promptly (plus any running handler).
 *  - Optional busy polling (opts.busy_poll_us): after handling events a
 *    loop polls epoll without sleeping for that long before it blocks, so a
 *    request that follows soon does not pay the wake-up of a sleeping
 *    thread.  Each idle round yields the CPU.  A loop with no traffic
 *    sleeps as usual; one kept busy costs up to a core.
 *  - Optional yielding (opts.yield_after_us): a loop that has held its core
 *    that long without a break (no sleep, no preemption) calls
 *    sched_yield() once after its events.  The callers it answered were
 *    woken onto its core and would otherwise wait for the end of its time
 *    slice, a scheduler tick away (4 ms at HZ 250): with 8 callers of
 *    BatchExistKey(640) on 2 cores that wait was the p99 (docs/benchmarks.md,
 *    "The master under many clients").
 *  - A handler may take its connection over (moonlet_rpc_ctx_detach: the
 *    replication stream): the loop flushes the reply, forgets the
 *    connection and hands the open socket to the handler's taker.
 *  - Unix-socket connections read with recvmsg() so that descriptors a peer
 *    passes (SCM_RIGHTS; the DummyClient's shared memory) are kept on the
 *    connection for a handler to take, and closed with it if nobody does.
 *  - What a peer can hold is bounded: before it authenticates a connection
 *    may announce frames of MOONLET_RPC_PRE_AUTH_MAX_FRAME bytes only, so an
 *    unauthenticated peer never makes the server buffer more than that; each
 *    loop sweeps its connections every SWEEP_MS and closes those past their
 *    deadline (authentication, a frame begun but not complete, replies not
 *    taken, idle).  Replies are under a deadline, not a progress timer:
 *    what was queued must have left within frame_timeout_ms (the deadline
 *    moves on only when all it covered has gone), so a reader taking a byte
 *    now and then cannot pin a reply and its buffers.  The acceptor enforces the connection cap and, at the
 *    descriptor limit, sheds the waiting connection with a reserved
 *    descriptor instead of spinning, with a rate-limited log line.
 *  - TLS (opts.tls) is a layer under the same loop: a connection's reads
 *    and writes go through its session (transport/tls.h), the handshake is
 *    driven by the events it asks for, and bytes the session already
 *    decrypted (invisible to epoll) are served before the loop waits again.
 *    The first byte tells a plaintext peer, which is answered in plaintext.
 *
 * Locks: each loop's `lock` guards only its queue of newly accepted sockets
 * (taken by the acceptor and by that loop, never while calling a handler or
 * doing I/O).  Everything else is owned by one thread or atomic.
 */
#include "rpc_server.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/queue.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cred.h"
#include "fdlimit.h"
#include "frame.h"
#include "log.h"
#include "moonlet/error.h"
#include "wire.h"
#include "token.h"
#include "monotime.h"
#include "thread.h"
#include "net.h"
#include "spare_core.h"

#define MOD "rpc"

#define LOOP_TICK_MS 100               /* bounded epoll_wait: linger expiry and safety */
#define MAX_EVENTS 64
#define ACCEPT_BATCH 64
#define ACCEPT_BACKOFF_MS 100          /* after EMFILE and friends */
#define SWEEP_MS 200                   /* deadline sweep period of a loop */
#define LOG_EVERY_MS 5000              /* repeated acceptor warnings */
#define IN_BUF_INITIAL (16u << 10)
#define IN_BUF_KEEP (1u << 20)         /* idle input buffers above this are shrunk */
#define OUT_HIGH_WATER (1u << 20)      /* stop reading while this much is unsent */
#define LINGER_MS 1000
#define LINGER_DISCARD_MAX (1u << 20)
#define ZONE_CHUNK (64u << 10)         /* fits a 640-key batch without growing */
#define MIN_MAX_FRAME 512u             /* room for every error reply */
#define MAX_METHOD_ID 4096u
#define MAX_THREADS 256
#define ERR_MSG_MAX 256
#define TLS_PENDING_ROUNDS 64          /* reads of decrypted bytes per event */
#define TLS_READ_ROUNDS 8              /* TLS records read per readiness event */

enum conn_state {
    ST_OPEN,      /* reading and serving requests */
    ST_DRAIN_OUT, /* no more requests: flush the replies, then close */
    ST_LINGER,    /* replies sent, write side shut: discard input until EOF */
    ST_DETACH,    /* a handler took the socket: flush the replies, then hand it over */
};

struct loop;

typedef struct conn {
    int fd;
    enum conn_state state;
    bool authed;
    const moonlet_cred *cred; /* what it authenticated with (&moonlet_cred_everything: all) */
    bool paused;   /* output above high water: input not read nor parsed */
    bool peer_eof; /* read returned 0 */
    bool dead;     /* close at the end of this event */
    bool tls_sniffed;  /* the first byte was looked at (TLS servers) */
    bool tls_refused;  /* a plaintext peer of a TLS server: answered and closed */
    moonlet_tls *tls;  /* the session (TLS servers), NULL otherwise */
    uint32_t events;
    struct loop *loop;
    void *conn_data;
    int fds[MOONLET_RPC_MAX_CONN_FDS]; /* passed descriptors not yet taken (unix only) */
    unsigned nfds;
    char *in;
    size_t in_len, in_cap;
    moonlet_frame_builder out;
    size_t out_off; /* bytes of out.buf already sent */
    int64_t linger_deadline_ms;
    size_t linger_discarded;
    int64_t accepted_ms;    /* authentication deadline base */
    int64_t frame_start_ms; /* when the partial frame in `in` began */
    int64_t sent_ms;        /* reply deadline base: when the replies up to
                             * reply_mark were queued (or, once those have
                             * left, when the last of them did) */
    size_t reply_mark;      /* out.buf offset the sent_ms deadline covers */
    int64_t active_ms;      /* last request served (idle deadline base) */
    void (*detach_fn)(void *arg, uint64_t tag, int fd, moonlet_tls *tls); /* ST_DETACH: taker */
    void *detach_arg;
    uint64_t detach_tag;
    LIST_ENTRY(conn) link; /* in loop.conns */
} conn;

typedef struct loop {
    moonlet_rpc_server *s;
    pthread_t thread;
    bool thread_started;
    int epfd;
    int wake_fd;
    pthread_mutex_t lock; /* guards pending[] */
    int *pending;
    size_t npending, pending_cap;
    LIST_HEAD(, conn) conns;
    size_t nlinger;
    msgpack_zone zone;
    bool zone_ready;
    int64_t next_sweep_ms;
    /* yielding: since when the loop has held its core, and its involuntary
     * context switches then (a change means it was preempted since) */
    int64_t held_since_ns;
    long preempted;
} loop;

struct moonlet_rpc_server {
    char *unix_path;
    dev_t unix_dev;
    ino_t unix_ino;
    int listen_fd;
    int stop_fd;
    int reserve_fd; /* spare descriptor: freed to shed a connection at EMFILE */
    uint16_t port;
    size_t max_frame;
    uint32_t max_conns; /* 0: no cap */
    uint64_t max_elements; /* per request; UINT64_MAX: no cap */
    uint64_t max_batch;    /* BATCH arrays of declared arguments; 0: no cap */
    int64_t auth_timeout_ms, frame_timeout_ms, idle_timeout_ms; /* idle 0: never */
    moonlet_ratelimit accept_log;
    moonlet_ratelimit tls_log; /* failed handshakes, plaintext peers */
    moonlet_tls_ctx *tls;      /* NULL: plaintext */
    char *token;
    size_t token_len;
    const moonlet_cred_set *creds; /* roles (cred.h); NULL: token (or nothing) opens all */
    int (*authorize)(void *ctx, const moonlet_cred *cred, uint32_t method, const void *argv,
                     char *msg, size_t cap);
    _Atomic uint64_t refused;  /* calls refused for their roles or tenants */
    moonlet_ratelimit refuse_log;
    const moonlet_rpc_method **table; /* indexed by method id */
    _Atomic uint64_t *calls;          /* requests served per method id (table_len) */
    uint32_t table_len;
    moonlet_rpc_method *methods;
    void *ctx;
    void (*on_close)(void *ctx, void *conn_data);
    uint64_t (*reply_epoch)(void *ctx, void *conn_data);
    int64_t busy_poll_ns;
    int64_t yield_after_ns; /* 0: never */
    _Atomic uint64_t yields;
    _Atomic uint64_t reply_deadline_closes; /* replies not taken in time */
    char name[8]; /* opts.name, cut to fit its threads' names */
    loop *loops;
    int nloops;
    unsigned next_loop;
    pthread_t acceptor;
    bool acceptor_started;
    bool started;
    bool stopped;
    atomic_bool stopping;       /* acceptor: exit */
    atomic_bool loops_stopping; /* loops: close all and exit (set once the acceptor is joined) */
    atomic_size_t nconns;
};

/* ------------------------------------------------------------------ */
/* Small helpers                                                        */
/* ------------------------------------------------------------------ */

/* Signed views of common/monotime.h, for deadline arithmetic. */
static int64_t now_ms(void)
{
    return (int64_t)moonlet_mono_ms();
}

static int64_t now_ns(void)
{
    return (int64_t)moonlet_mono_ns();
}

static void wake(int efd)
{
    uint64_t one = 1;
    ssize_t w = write(efd, &one, sizeof(one));
    (void)w; /* EAGAIN means a wake-up is already pending */
}

static void drain_wake(int efd)
{
    uint64_t v;
    ssize_t r = read(efd, &v, sizeof(v));
    (void)r;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void pack_vfmt(msgpack_packer *out, const char *fmt, va_list ap)
{
    char msg[ERR_MSG_MAX];
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof(msg))
        n = (int)sizeof(msg) - 1;
    moonlet_pack_str(out, msg, (size_t)n);
}

int moonlet_rpc_error(msgpack_packer *out, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pack_vfmt(out, fmt, ap);
    va_end(ap);
    return code;
}

/* ------------------------------------------------------------------ */
/* Replies                                                              */
/* ------------------------------------------------------------------ */

static size_t out_pending(const conn *c) { return c->out.buf.size - c->out_off; }

/* Whether connections must authenticate first. */
static bool needs_auth(const moonlet_rpc_server *s)
{
    return s->token_len != 0 || s->creds != NULL;
}

/* Counts a refused call and logs it at most once every LOG_EVERY_MS: the
 * credential's line in its file, never its token. */
static void note_refusal(conn *c, const moonlet_rpc_method *m, uint32_t method, const char *why)
{
    moonlet_rpc_server *s = c->loop->s;
    atomic_fetch_add_explicit(&s->refused, 1, memory_order_relaxed);
    uint64_t held = 0;
    if (moonlet_ratelimit_allow(&s->refuse_log, LOG_EVERY_MS, &held)) {
        char roles[64];
        ML_WARN(MOD, "refused %s (%u) on fd %d: %s (credential of line %u, roles %s); %llu "
                "more refusals not logged", m && m->name ? m->name : "?", method, c->fd, why,
                c->cred ? c->cred->line : 0,
                moonlet_cred_roles_str(c->cred ? c->cred->roles : 0, roles, sizeof(roles)),
                (unsigned long long)held);
    }
}

/* The largest frame this connection may send now. */
static size_t frame_limit(const conn *c)
{
    const moonlet_rpc_server *s = c->loop->s;
    return (needs_auth(s) && !c->authed) || c->tls_refused ? MOONLET_RPC_PRE_AUTH_MAX_FRAME
                                                            : s->max_frame;
}

__attribute__((format(printf, 4, 5)))
static void reply_error(conn *c, uint64_t id, int code, const char *fmt, ...)
{
    msgpack_packer *pk = moonlet_reply_begin(&c->out, id, code);
    va_list ap;
    va_start(ap, fmt);
    pack_vfmt(pk, fmt, ap);
    va_end(ap);
    moonlet_frame_finish(&c->out, c->loop->s->max_frame);
}

static void reply_nil(conn *c, uint64_t id)
{
    msgpack_pack_nil(moonlet_reply_begin(&c->out, id, 0));
    moonlet_frame_finish(&c->out, c->loop->s->max_frame);
}

/* Answers with an error and stops serving the connection. */
static void fail_conn(conn *c, uint64_t id, int code, const char *what)
{
    reply_error(c, id, code, "%s", what);
    c->state = ST_DRAIN_OUT;
}

/* Runs the handler with its reply header reserved in the output buffer. */
static void call_handler(conn *c, const moonlet_rpc_method *m, const moonlet_request *req)
{
    moonlet_rpc_server *s = c->loop->s;
    moonlet_rpc_ctx ctx = {s->ctx, &c->conn_data, req->id, req->method, c, &c->loop->zone, NULL,
                           c->cred ? c->cred : &moonlet_cred_everything};
    /* the service's epoch for this connection's replies (0: none, 3 elements) */
    uint64_t epoch = s->reply_epoch ? s->reply_epoch(s->ctx, c->conn_data) : 0;
    if (m->spec) { /* the declared arguments, decoded before the handler runs */
        char err[768];
        void *argv = msgpack_zone_malloc(ctx.zone, m->spec->size);
        int rc = argv ? moonlet_rpc_args_decode(m->name ? m->name : "?", m->spec, req->args,
                                                ctx.zone, s->max_batch, argv, err, sizeof(err))
                      : MOONLET_ERR_INTERNAL_ERROR;
        if (rc) {
            if (m->spec->takes_fd) { /* the descriptor sent with the refused request */
                int fd = moonlet_rpc_ctx_take_fd(&ctx);
                if (fd >= 0)
                    close(fd);
            }
            msgpack_packer *epk = moonlet_reply_begin_ex(&c->out, req->id, rc, epoch != 0);
            moonlet_pack_cstr(epk, argv ? err : "out of memory");
            if (epoch)
                msgpack_pack_uint64(epk, epoch);
            moonlet_frame_finish(&c->out, s->max_frame);
            return;
        }
        ctx.argv = argv;
    }
    if (s->authorize && s->creds) { /* what the arguments name: a tenant, force */
        char why[ERR_MSG_MAX];
        why[0] = '\0';
        int rc = s->authorize(s->ctx, ctx.cred, req->method, ctx.argv, why, sizeof(why));
        if (rc) {
            if (m->spec && m->spec->takes_fd) {
                int fd = moonlet_rpc_ctx_take_fd(&ctx);
                if (fd >= 0)
                    close(fd);
            }
            note_refusal(c, m, req->method, why);
            msgpack_packer *epk = moonlet_reply_begin_ex(&c->out, req->id, rc, epoch != 0);
            moonlet_pack_cstr(epk, why);
            if (epoch)
                msgpack_pack_uint64(epk, epoch);
            moonlet_frame_finish(&c->out, s->max_frame);
            return;
        }
    }
    moonlet_frame_builder *b = &c->out;
    msgpack_packer *pk = moonlet_reply_begin_ex(b, req->id, 0, epoch != 0);
    int code = m->fn(&ctx, req->args, pk);
    if (epoch)
        msgpack_pack_uint64(pk, epoch);
    moonlet_reply_patch_code(b, code);
    size_t start = b->frame_start + MOONLET_FRAME_HEADER_BYTES;
    size_t body = b->buf.size - start;
    if (body > s->max_frame) {
        moonlet_frame_abort(b);
        reply_error(c, req->id, MOONLET_ERR_BUFFER_OVERFLOW,
                    "reply of %zu bytes exceeds the %zu-byte frame limit", body, s->max_frame);
        return;
    }
    if (moonlet_frame_body_check(b->buf.data + start, body) != 0) {
        ML_ERR(MOD, "method %s (%u) packed a malformed result; replying INTERNAL_ERROR",
               m->name ? m->name : "?", req->method);
        moonlet_frame_abort(b);
        reply_error(c, req->id, MOONLET_ERR_INTERNAL_ERROR, "method %u packed a bad result",
                    req->method);
        return;
    }
    moonlet_frame_finish(b, s->max_frame);
}

/* Handles MOONLET_RPC_AUTH; with no token configured any AUTH is accepted.
 * With credentials, the token's credential is the connection's from then on
 * (a second AUTH may change it, never to one it does not hold the token of);
 * an empty token over TLS takes the credential of the client certificate
 * the handshake verified ("cn:NAME" lines), if there is one. */
static void serve_auth(conn *c, const moonlet_request *req)
{
    moonlet_rpc_server *s = c->loop->s;
    const char *tok;
    uint32_t len;
    if (!needs_auth(s)) {
        reply_nil(c, req->id);
        return;
    }
    bool one = moonlet_wire_len(req->args) == 1 && moonlet_wire_str(req->args, 0, &tok, &len) == 0;
    if (one && s->creds) {
        const moonlet_cred *cr = moonlet_cred_find(s->creds, tok, len);
        /* no token: the credential of the client certificate TLS verified */
        if (!cr && len == 0 && c->tls)
            cr = moonlet_cred_find_cn(s->creds, moonlet_tls_peer_name(c->tls));
        if (cr) {
            c->authed = true;
            c->cred = cr;
            reply_nil(c, req->id);
            return;
        }
    } else if (one && moonlet_token_equal(tok, len, s->token, s->token_len)) {
        c->authed = true;
        reply_nil(c, req->id);
        return;
    }
    ML_WARN(MOD, "authentication failed on connection fd %d", c->fd);
    fail_conn(c, req->id, MOONLET_ERR_ILLEGAL_CLIENT, "authentication failed");
}

static void serve_request(conn *c, const moonlet_request *req)
{
    moonlet_rpc_server *s = c->loop->s;
    if (c->tls_refused) {
        fail_conn(c, req->id, MOONLET_ERR_ILLEGAL_CLIENT,
                  "this server requires TLS: connect with TLS (a CA file, and a client "
                  "certificate where the server asks for one)");
        return;
    }
    if (req->method == MOONLET_RPC_AUTH) {
        serve_auth(c, req);
        return;
    }
    if (needs_auth(s) && !c->authed) {
        ML_WARN(MOD, "connection fd %d sent method %u before authenticating", c->fd, req->method);
        fail_conn(c, req->id, MOONLET_ERR_ILLEGAL_CLIENT, "authentication required");
        return;
    }
    const moonlet_rpc_method *m = req->method < s->table_len ? s->table[req->method] : NULL;
    if (m == NULL) {
        reply_error(c, req->id, MOONLET_ERR_INVALID_PARAMS, "unknown method %u", req->method);
        return;
    }
    const moonlet_cred *cr = c->cred ? c->cred : &moonlet_cred_everything;
    if (m->roles && !(m->roles & cr->roles)) {
        char want[64], why[160];
        snprintf(why, sizeof(why), "%s needs the role %s", m->name ? m->name : "this method",
                 moonlet_cred_roles_str(m->roles, want, sizeof(want)));
        note_refusal(c, m, req->method, why);
        if (m->spec && m->spec->takes_fd) {
            moonlet_rpc_ctx fctx = {.conn = c};
            int fd = moonlet_rpc_ctx_take_fd(&fctx);
            if (fd >= 0)
                close(fd);
        }
        uint64_t epoch = s->reply_epoch ? s->reply_epoch(s->ctx, c->conn_data) : 0;
        msgpack_packer *epk = moonlet_reply_begin_ex(&c->out, req->id,
                                                     MOONLET_ERR_PERMISSION_DENIED, epoch != 0);
        moonlet_pack_cstr(epk, why);
        if (epoch)
            msgpack_pack_uint64(epk, epoch);
        moonlet_frame_finish(&c->out, s->max_frame);
        return;
    }
    atomic_fetch_add_explicit(&s->calls[req->method], 1, memory_order_relaxed);
    call_handler(c, m, req);
}

static void serve_frame(conn *c, const char *body, uint32_t len)
{
    loop *l = c->loop;
    moonlet_request req;
    uint64_t id;
    int rc = moonlet_request_decode_ref_max(body, len, &l->zone, l->s->max_elements, &req, &id);
    if (rc == MOONLET_ERR_BUFFER_OVERFLOW) { /* well-delimited: the connection stays usable */
        reply_error(c, id, MOONLET_ERR_INVALID_PARAMS,
                    "request refused: more than %llu elements in its argument lists",
                    (unsigned long long)l->s->max_elements);
    } else if (rc != 0) {
        ML_DEBUG(MOD, "malformed request on fd %d (id %llu)", c->fd, (unsigned long long)id);
        fail_conn(c, id, MOONLET_ERR_INVALID_PARAMS, "malformed request");
    } else {
        serve_request(c, &req);
    }
    msgpack_zone_clear(&l->zone);
}

/* ------------------------------------------------------------------ */
/* Connection I/O                                                       */
/* ------------------------------------------------------------------ */

/* Handles every complete frame in the input buffer, in order. */
static void process_input(conn *c)
{
    size_t off = 0;
    while (c->state == ST_OPEN && c->in_len - off >= MOONLET_FRAME_HEADER_BYTES) {
        if (out_pending(c) > OUT_HIGH_WATER) {
            c->paused = true;
            break;
        }
        uint32_t len;
        size_t max_frame = frame_limit(c);
        if (moonlet_frame_header_decode((const uint8_t *)c->in + off, max_frame, &len) != 0) {
            if (c->tls_refused) {
                fail_conn(c, 0, MOONLET_ERR_ILLEGAL_CLIENT, "this server requires TLS");
            } else if (max_frame < c->loop->s->max_frame) {
                ML_WARN(MOD, "fd %d announced a frame above %zu bytes before authenticating",
                        c->fd, max_frame);
                fail_conn(c, 0, MOONLET_ERR_ILLEGAL_CLIENT,
                          "authentication required: the first frame must be AUTH");
            } else {
                fail_conn(c, 0, MOONLET_ERR_INVALID_PARAMS, "invalid frame length");
            }
            break;
        }
        if (c->in_len - off - MOONLET_FRAME_HEADER_BYTES < len)
            break;
        serve_frame(c, c->in + off + MOONLET_FRAME_HEADER_BYTES, len);
        off += MOONLET_FRAME_HEADER_BYTES + (size_t)len;
    }
    if (c->state == ST_DETACH && off < c->in_len) {
        /* the peer sent more behind the request that detached: it is not
         * following the protocol that takes the socket over */
        ML_WARN(MOD, "fd %d sent data behind a request that takes the connection over", c->fd);
        c->state = ST_DRAIN_OUT; /* the reply, then closed: nobody takes it */
    }
    if (c->state != ST_OPEN)
        off = c->in_len; /* nothing more will be served */
    if (off > 0) {
        memmove(c->in, c->in + off, c->in_len - off); /* only a partial frame moves */
        c->in_len -= off;
        c->frame_start_ms = c->active_ms = now_ms(); /* what is left is a new frame */
    }
    if (c->in_len == 0 && c->in_cap > IN_BUF_KEEP) {
        char *small = realloc(c->in, IN_BUF_INITIAL);
        if (small != NULL) {
            c->in = small;
            c->in_cap = IN_BUF_INITIAL;
        }
    }
}

/* Makes room for the next read: grows up to the current frame's size. */
static bool ensure_input_room(conn *c)
{
    if (c->in_len < c->in_cap)
        return true;
    size_t limit = frame_limit(c) + MOONLET_FRAME_HEADER_BYTES;
    size_t need = c->in_cap * 2;
    if (c->in_len >= MOONLET_FRAME_HEADER_BYTES) {
        size_t frame = MOONLET_FRAME_HEADER_BYTES + (size_t)((uint32_t)(uint8_t)c->in[0] << 24 |
                                                             (uint32_t)(uint8_t)c->in[1] << 16 |
                                                             (uint32_t)(uint8_t)c->in[2] << 8 |
                                                             (uint32_t)(uint8_t)c->in[3]);
        if (frame > need)
            need = frame;
    }
    if (need > limit)
        need = limit;
    if (need <= c->in_cap)
        return false; /* cannot happen: a full buffer always holds a frame that fits */
    char *bigger = realloc(c->in, need);
    if (bigger == NULL) {
        ML_ERR(MOD, "out of memory growing the input buffer of fd %d to %zu bytes", c->fd, need);
        return false;
    }
    c->in = bigger;
    c->in_cap = need;
    return true;
}

int moonlet_rpc_ctx_take_fd(moonlet_rpc_ctx *ctx)
{
    conn *c = ctx ? ctx->conn : NULL;
    if (c == NULL || c->nfds == 0)
        return -1;
    int fd = c->fds[0];
    c->nfds--;
    memmove(c->fds, c->fds + 1, c->nfds * sizeof(c->fds[0]));
    return fd;
}

size_t moonlet_rpc_result_mark(const moonlet_rpc_ctx *ctx)
{
    const conn *c = ctx->conn;
    return c->out.buf.size;
}

void moonlet_rpc_result_rewind(moonlet_rpc_ctx *ctx, size_t mark)
{
    conn *c = ctx->conn;
    /* the reply's header, reserved before the handler ran, stays */
    if (mark >= c->out.frame_start + MOONLET_FRAME_HEADER_BYTES && mark <= c->out.buf.size)
        c->out.buf.size = mark;
}

const char *moonlet_rpc_ctx_peer_name(const moonlet_rpc_ctx *ctx)
{
    const conn *c = ctx ? ctx->conn : NULL;
    return c && c->tls ? moonlet_tls_peer_name(c->tls) : NULL;
}

int moonlet_rpc_ctx_detach(moonlet_rpc_ctx *ctx,
                           void (*fn)(void *arg, uint64_t tag, int fd, moonlet_tls *tls),
                           void *arg, uint64_t tag)
{
    conn *c = ctx ? ctx->conn : NULL;
    if (c == NULL || fn == NULL || c->state != ST_OPEN)
        return MOONLET_ERR_INVALID_PARAMS;
    c->state = ST_DETACH;
    c->detach_fn = fn;
    c->detach_arg = arg;
    c->detach_tag = tag;
    return MOONLET_OK;
}

/* recv() that also keeps the descriptors a unix peer passed (SCM_RIGHTS). */
static ssize_t recv_keep_fds(conn *c, char *buf, size_t len)
{
    union {
        char b[CMSG_SPACE(sizeof(int) * MOONLET_RPC_MAX_CONN_FDS)];
        struct cmsghdr align;
    } cbuf;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.b,
                        .msg_controllen = sizeof(cbuf.b)};
    ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0)
        return n;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(fd));
            if (c->nfds < MOONLET_RPC_MAX_CONN_FDS) {
                c->fds[c->nfds++] = fd;
            } else {
                ML_WARN(MOD, "fd %d passed more than %d descriptors; dropping one", c->fd,
                        MOONLET_RPC_MAX_CONN_FDS);
                close(fd);
            }
        }
    }
    if (mh.msg_flags & MSG_CTRUNC)
        ML_WARN(MOD, "fd %d passed more descriptors than fit one message; the kernel dropped them",
                c->fd);
    return n;
}

static void start_linger(conn *c);

/* A TLS server's connection before its handshake is done: looks at the
 * first byte (a plaintext peer is served in plaintext, only to be told),
 * then advances the handshake. */
static void tls_advance(conn *c)
{
    moonlet_rpc_server *s = c->loop->s;
    uint64_t held;
    if (!c->tls_sniffed) {
        uint8_t b;
        ssize_t n = recv(c->fd, &b, 1, MSG_PEEK);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            c->dead = true;
        if (n <= 0)
            return;
        c->tls_sniffed = true;
        if (!moonlet_tls_is_hello(b)) {
            if (moonlet_ratelimit_allow(&s->tls_log, LOG_EVERY_MS, &held))
                ML_WARN(MOD, "fd %d speaks plaintext to this TLS server: refused (%llu more "
                        "TLS refusals not logged)", c->fd, (unsigned long long)held);
            moonlet_tls_free(c->tls);
            c->tls = NULL;
            c->tls_refused = true; /* its bytes are read as frames from now on */
            return;
        }
    }
    if (moonlet_tls_handshake(c->tls) == 0 || errno == EAGAIN)
        return;
    if (moonlet_ratelimit_allow(&s->tls_log, LOG_EVERY_MS, &held))
        ML_WARN(MOD, "fd %d: %s; closed (%llu more TLS refusals not logged)", c->fd,
                moonlet_tls_error(c->tls), (unsigned long long)held);
    /* The alert OpenSSL sent must reach the peer before the connection
     * ends: a close with the peer's bytes unread would reset it and the
     * peer could lose the alert (a refused client certificate would read
     * as a mere reset).  Linger, discarding its input, as after an error
     * reply. */
    moonlet_tls_free(c->tls);
    c->tls = NULL;
    start_linger(c);
}

static bool tls_handshaking(const conn *c)
{
    return c->tls != NULL && !moonlet_tls_handshake_done(c->tls);
}

static void read_requests(conn *c)
{
    /* One read per readiness event; with TLS, up to TLS_READ_ROUNDS: each
     * read returns one record (16 KiB at most), and a request larger than
     * that would otherwise take one loop round trip per record. */
    int rounds = c->tls ? TLS_READ_ROUNDS : 1;
    for (int round = 0; round < rounds; round++) {
        if (round > 0 && c->in_len == c->in_cap)
            return; /* full: served first (the buffer grows only for a frame) */
        if (!ensure_input_room(c)) {
            c->dead = true;
            return;
        }
        ssize_t n = c->tls ? moonlet_tls_read(c->tls, c->in + c->in_len, c->in_cap - c->in_len)
                    : c->loop->s->unix_path
                        ? recv_keep_fds(c, c->in + c->in_len, c->in_cap - c->in_len)
                        : recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (n > 0) {
            if (c->in_len == 0)
                c->frame_start_ms = now_ms();
            c->in_len += (size_t)n;
        } else if (n == 0) {
            c->peer_eof = true;
            c->state = ST_DRAIN_OUT; /* a partial frame left in the buffer is dropped */
            return;
        } else {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                c->dead = true;
            return;
        }
    }
}

static void discard_input(conn *c)
{
    char scratch[4096];
    ssize_t n = c->tls ? moonlet_tls_read(c->tls, scratch, sizeof(scratch))
                       : recv(c->fd, scratch, sizeof(scratch), 0);
    if (n > 0) {
        c->linger_discarded += (size_t)n;
        if (c->linger_discarded > LINGER_DISCARD_MAX)
            c->dead = true;
    } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c->dead = true;
    }
}

static void flush_output(conn *c)
{
    while (out_pending(c) > 0) {
        ssize_t n = c->tls ? moonlet_tls_write(c->tls, c->out.buf.data + c->out_off,
                                               out_pending(c))
                           : send(c->fd, c->out.buf.data + c->out_off, out_pending(c),
                                  MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            /* Not a progress timer (issue 31 finding 7): the deadline moves
             * only once every reply it covered has left, so a reader taking
             * a few bytes at a time is still cut at frame_timeout_ms. */
            if (c->out_off >= c->reply_mark && out_pending(c) > 0) {
                c->sent_ms = now_ms();
                c->reply_mark = c->out.buf.size;
            }
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
                c->dead = true;
            return;
        }
    }
    moonlet_frame_builder_reset(&c->out);
    c->out_off = 0;
}

static void set_events(conn *c, uint32_t ev)
{
    if (ev == c->events)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    if (epoll_ctl(c->loop->epfd, EPOLL_CTL_MOD, c->fd, &e) != 0) {
        ML_ERR(MOD, "epoll_ctl(MOD) on fd %d failed: %s", c->fd, strerror(errno));
        c->dead = true;
        return;
    }
    c->events = ev;
}

static void start_linger(conn *c)
{
    if (c->tls)
        moonlet_tls_shutdown(c->tls);
    shutdown(c->fd, SHUT_WR);
    c->state = ST_LINGER;
    c->linger_deadline_ms = now_ms() + LINGER_MS;
    c->loop->nlinger++;
}

/* Decides what the connection waits for next (or that it must close). */
static void settle(conn *c)
{
    if (c->dead)
        return;
    if (c->state == ST_OPEN && tls_handshaking(c)) {
        set_events(c, moonlet_tls_want(c->tls) == POLLOUT ? EPOLLOUT : EPOLLIN);
        return;
    }
    if (c->state == ST_DRAIN_OUT && out_pending(c) == 0) {
        if (c->peer_eof) {
            c->dead = true;
            return;
        }
        start_linger(c);
    }
    uint32_t ev = 0;
    if (c->state == ST_LINGER || (c->state == ST_OPEN && !c->paused))
        ev |= EPOLLIN;
    /* A paused connection also waits for EPOLLOUT when its output is already
     * empty: the next wake-up resumes parsing the frames it still holds. */
    if (out_pending(c) > 0 || (c->state == ST_OPEN && c->paused))
        ev |= EPOLLOUT;
    set_events(c, ev);
}

/* ST_DETACH with its replies sent: the socket leaves the server, open, for
 * the handler's taker; the connection is gone as far as the server knows. */
static void conn_detach(loop *l, conn *c)
{
    moonlet_rpc_server *s = l->s;
    int fd = c->fd;
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
    for (unsigned i = 0; i < c->nfds; i++)
        close(c->fds[i]);
    if (s->on_close)
        s->on_close(s->ctx, c->conn_data);
    void (*fn)(void *, uint64_t, int, moonlet_tls *) = c->detach_fn;
    void *arg = c->detach_arg;
    uint64_t tag = c->detach_tag;
    moonlet_tls *tls = c->tls; /* the taker's now */
    LIST_REMOVE(c, link);
    moonlet_frame_builder_destroy(&c->out);
    free(c->in);
    free(c);
    atomic_fetch_sub(&s->nconns, 1);
    fn(arg, tag, fd, tls);
}

static void conn_close(loop *l, conn *c)
{
    moonlet_rpc_server *s = l->s;
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    moonlet_tls_free(c->tls);
    for (unsigned i = 0; i < c->nfds; i++)
        close(c->fds[i]);
    if (s->on_close)
        s->on_close(s->ctx, c->conn_data);
    if (c->state == ST_LINGER)
        l->nlinger--;
    LIST_REMOVE(c, link);
    moonlet_frame_builder_destroy(&c->out);
    free(c->in);
    free(c);
    /* last, so that "0 connections" implies every on_close has returned */
    atomic_fetch_sub(&s->nconns, 1);
}

static void conn_on_event(loop *l, conn *c, uint32_t ev)
{
    size_t queued = out_pending(c);
    if (c->state == ST_OPEN && tls_handshaking(c)) {
        tls_advance(c);
        if (c->dead || tls_handshaking(c)) {
            settle(c);
            if (c->dead)
                conn_close(l, c);
            return;
        }
        /* done (or a plaintext peer): what is waiting is read below */
        ev |= EPOLLIN;
    }
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        if (c->state == ST_LINGER)
            discard_input(c);
        else if (c->state == ST_OPEN && !c->paused)
            read_requests(c);
    }
    if (!c->dead && c->paused && out_pending(c) == 0)
        c->paused = false;
    if (!c->dead && c->state == ST_OPEN && !c->paused)
        process_input(c);
    if (queued == 0 && out_pending(c) > 0) {
        c->sent_ms = now_ms(); /* the reply deadline counts from when replies were queued */
        c->reply_mark = c->out.buf.size;
    }
    if (!c->dead)
        flush_output(c);
    /* bytes the session decrypted already: epoll will not report them */
    for (int round = 0; round < TLS_PENDING_ROUNDS && c->tls && !c->dead &&
                        c->state == ST_OPEN && !c->paused && moonlet_tls_pending(c->tls) > 0;
         round++) {
        size_t before = out_pending(c);
        read_requests(c);
        if (!c->dead && c->state == ST_OPEN)
            process_input(c);
        if (before == 0 && out_pending(c) > 0) {
            c->sent_ms = now_ms();
            c->reply_mark = c->out.buf.size;
        }
        if (!c->dead)
            flush_output(c);
    }
    if ((ev & (EPOLLHUP | EPOLLERR)) && (c->state == ST_DRAIN_OUT || c->state == ST_DETACH) &&
        out_pending(c) > 0)
        c->dead = true; /* the peer is gone: nobody will read the rest */
    settle(c);
    if (c->dead)
        conn_close(l, c);
    else if (c->state == ST_DETACH && out_pending(c) == 0)
        conn_detach(l, c);
}

/* ------------------------------------------------------------------ */
/* Event loops                                                          */
/* ------------------------------------------------------------------ */

static void adopt(loop *l, int fd)
{
    conn *c = calloc(1, sizeof(*c));
    char *in = malloc(IN_BUF_INITIAL);
    struct epoll_event e = {.events = EPOLLIN};
    if (c == NULL || in == NULL) {
        ML_ERR(MOD, "out of memory accepting a connection");
        goto fail;
    }
    c->fd = fd;
    c->loop = l;
    c->accepted_ms = c->active_ms = c->sent_ms = c->frame_start_ms = now_ms();
    c->in = in;
    c->in_cap = IN_BUF_INITIAL;
    c->events = EPOLLIN;
    moonlet_frame_builder_init(&c->out);
    if (l->s->tls && moonlet_tls_new(l->s->tls, fd, NULL, &c->tls) != 0) {
        ML_ERR(MOD, "cannot start a TLS session");
        moonlet_frame_builder_destroy(&c->out);
        goto fail;
    }
    e.data.ptr = c;
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
        ML_ERR(MOD, "epoll_ctl(ADD) failed: %s", strerror(errno));
        goto fail;
    }
    LIST_INSERT_HEAD(&l->conns, c, link);
    return;
fail:
    free(in);
    free(c);
    close(fd);
    if (l->s->on_close)
        l->s->on_close(l->s->ctx, NULL);
    atomic_fetch_sub(&l->s->nconns, 1);
}

static void adopt_pending(loop *l)
{
    int batch[64];
    for (;;) {
        size_t n = 0;
        pthread_mutex_lock(&l->lock);
        while (n < 64 && l->npending > 0)
            batch[n++] = l->pending[--l->npending];
        pthread_mutex_unlock(&l->lock);
        if (n == 0)
            return;
        for (size_t i = 0; i < n; i++)
            adopt(l, batch[i]);
    }
}

static void expire_lingering(loop *l)
{
    int64_t now = now_ms();
    conn *c = LIST_FIRST(&l->conns);
    while (c != NULL && l->nlinger > 0) {
        conn *next = LIST_NEXT(c, link);
        if (c->state == ST_LINGER && now >= c->linger_deadline_ms)
            conn_close(l, c);
        c = next;
    }
}

/* When the connection must have made progress by, or INT64_MAX. */
static int64_t conn_deadline(const moonlet_rpc_server *s, const conn *c)
{
    int64_t d = INT64_MAX;
    if (c->state == ST_LINGER)
        return d; /* expire_lingering() */
    if ((needs_auth(s) && !c->authed) || tls_handshaking(c) || c->tls_refused)
        d = c->accepted_ms + s->auth_timeout_ms;
    if (c->in_len > 0 && c->frame_start_ms + s->frame_timeout_ms < d)
        d = c->frame_start_ms + s->frame_timeout_ms;
    if (out_pending(c) > 0 && c->sent_ms + s->frame_timeout_ms < d)
        d = c->sent_ms + s->frame_timeout_ms;
    if (s->idle_timeout_ms > 0 && c->in_len == 0 && out_pending(c) == 0 &&
        c->active_ms + s->idle_timeout_ms < d)
        d = c->active_ms + s->idle_timeout_ms;
    return d;
}

/* Closes the loop's connections that are past their deadline. */
static void expire_deadlines(loop *l, int64_t now)
{
    conn *c = LIST_FIRST(&l->conns);
    size_t closed = 0;
    while (c != NULL) {
        conn *next = LIST_NEXT(c, link);
        if (now >= conn_deadline(l->s, c)) {
            ML_DEBUG(MOD, "fd %d: deadline passed (%s), closing", c->fd,
                     needs_auth(l->s) && !c->authed ? "authentication"
                     : c->in_len ? "frame incomplete"
                     : out_pending(c) ? "replies not taken" : "idle");
            if (out_pending(c) > 0) {
                /* Reset, not a graceful close: what the kernel already holds
                 * of the replies is discarded too, not fed to the slow reader
                 * for as long as it likes. */
                struct linger lg = {.l_onoff = 1, .l_linger = 0};
                setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
                if (now >= c->sent_ms + l->s->frame_timeout_ms)
                    atomic_fetch_add(&l->s->reply_deadline_closes, 1);
            }
            conn_close(l, c);
            closed++;
        }
        c = next;
    }
    if (closed > 0)
        ML_DEBUG(MOD, "closed %zu connections past their deadline", closed);
}

/* Next events: polled without sleeping until busy_until (0: not busy), then
 * waited for. */
static int loop_wait(loop *l, struct epoll_event *evs, int64_t busy_until)
{
    while (busy_until > 0 && now_ns() < busy_until) {
        int n = epoll_wait(l->epfd, evs, MAX_EVENTS, 0);
        if (n != 0)
            return n;
        sched_yield();
    }
    return epoll_wait(l->epfd, evs, MAX_EVENTS, LOOP_TICK_MS);
}

/* Yielding (opts.yield_after_us).  A wait for events that took more than
 * HELD_BREAK_NS slept (or was preempted): the loop's hold of its core
 * starts again after it.  After a round of events, a loop that has held its
 * core for yield_after_ns, and was not preempted meanwhile, yields once. */
#define HELD_BREAK_NS 5000

static void held_restart(loop *l, int64_t now)
{
    l->held_since_ns = now;
    l->preempted = moonlet_thread_preemptions();
}

static void maybe_yield(loop *l)
{
    int64_t now = now_ns();
    if (now - l->held_since_ns < l->s->yield_after_ns)
        return;
    if (moonlet_thread_preemptions() == l->preempted) {
        sched_yield();
        atomic_fetch_add_explicit(&l->s->yields, 1, memory_order_relaxed);
        now = now_ns();
    }
    held_restart(l, now);
}

static void *loop_main(void *arg)
{
    loop *l = arg;
    struct epoll_event evs[MAX_EVENTS];
    int64_t busy_until = 0;
    if (l->s->yield_after_ns > 0)
        held_restart(l, now_ns()); /* the hold starts now, not at time 0 */
    while (!atomic_load(&l->s->loops_stopping)) {
        int64_t waited = now_ns();
        int n = loop_wait(l, evs, busy_until);
        if (l->s->yield_after_ns > 0) {
            int64_t now = now_ns();
            if (now - waited > HELD_BREAK_NS)
                held_restart(l, now);
        }
        if (n < 0 && errno != EINTR) {
            ML_ERR(MOD, "epoll_wait failed: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == NULL) {
                drain_wake(l->wake_fd);
                adopt_pending(l);
            } else {
                conn_on_event(l, evs[i].data.ptr, evs[i].events);
            }
        }
        if (n > 0 && l->s->yield_after_ns > 0)
            maybe_yield(l);
        if (l->nlinger > 0)
            expire_lingering(l);
        int64_t now = now_ms();
        if (now >= l->next_sweep_ms) {
            expire_deadlines(l, now);
            l->next_sweep_ms = now + SWEEP_MS;
        }
        if (n > 0 && l->s->busy_poll_ns > 0)
            busy_until = now_ns() + l->s->busy_poll_ns;
    }
    adopt_pending(l); /* the acceptor is gone: every accepted connection gets its on_close */
    while (!LIST_EMPTY(&l->conns))
        conn_close(l, LIST_FIRST(&l->conns));
    return NULL;
}

static int loop_init(moonlet_rpc_server *s, loop *l)
{
    l->s = s;
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&l->lock, NULL);
    l->zone_ready = msgpack_zone_init(&l->zone, ZONE_CHUNK);
    if (l->epfd < 0 || l->wake_fd < 0 || !l->zone_ready)
        return MOONLET_ERR_INTERNAL_ERROR;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wake_fd, &e) != 0)
        return MOONLET_ERR_INTERNAL_ERROR;
    return 0;
}

static void loop_destroy(loop *l)
{
    for (size_t i = 0; i < l->npending; i++) /* only when the loop never ran */
        close(l->pending[i]);
    free(l->pending);
    close_fd(&l->epfd);
    close_fd(&l->wake_fd);
    pthread_mutex_destroy(&l->lock);
    if (l->zone_ready)
        msgpack_zone_destroy(&l->zone);
}

/* ------------------------------------------------------------------ */
/* Acceptor                                                             */
/* ------------------------------------------------------------------ */

static bool hand_off(moonlet_rpc_server *s, int fd)
{
    loop *l = &s->loops[s->next_loop++ % (unsigned)s->nloops];
    bool ok = true;
    pthread_mutex_lock(&l->lock);
    if (l->npending == l->pending_cap) {
        size_t cap = l->pending_cap ? l->pending_cap * 2 : 16;
        int *p = realloc(l->pending, cap * sizeof(*p));
        if (p != NULL) {
            l->pending = p;
            l->pending_cap = cap;
        }
    }
    if (l->npending < l->pending_cap)
        l->pending[l->npending++] = fd;
    else
        ok = false;
    pthread_mutex_unlock(&l->lock);
    if (ok)
        wake(l->wake_fd);
    return ok;
}

/* Out of descriptors: frees the reserved one to take the oldest waiting
 * connection off the queue and close it (its client sees the connection
 * closed instead of hanging), then reserves again.  Logs rate-limited. */
static void shed_at_fd_limit(moonlet_rpc_server *s, int err)
{
    if (s->reserve_fd >= 0) {
        close_fd(&s->reserve_fd);
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0)
            close(fd);
        s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    uint64_t held;
    if (moonlet_ratelimit_allow(&s->accept_log, LOG_EVERY_MS, &held))
        ML_WARN(MOD, "accept failed: %s (%zu connections open; %llu more such failures not "
                "logged); backing off", strerror(err), atomic_load(&s->nconns),
                (unsigned long long)held);
}

/* Accepts what is ready; returns false after a resource error (back off). */
static bool accept_batch(moonlet_rpc_server *s)
{
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return true;
            int err = errno;
            if (err == EMFILE || err == ENFILE)
                shed_at_fd_limit(s, err);
            else
                ML_WARN(MOD, "accept failed: %s", strerror(err));
            return false;
        }
        if (s->max_conns != 0 && atomic_load(&s->nconns) >= s->max_conns) {
            uint64_t held;
            if (moonlet_ratelimit_allow(&s->accept_log, LOG_EVERY_MS, &held))
                ML_WARN(MOD, "connection cap of %u reached: closing new connections (%llu "
                        "more not logged)", s->max_conns, (unsigned long long)held);
            close(fd);
            continue;
        }
        if (s->unix_path == NULL) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        atomic_fetch_add(&s->nconns, 1);
        if (!hand_off(s, fd)) {
            ML_ERR(MOD, "out of memory queueing a connection");
            close(fd);
            atomic_fetch_sub(&s->nconns, 1);
        }
    }
    return true;
}

static void *acceptor_main(void *arg)
{
    moonlet_rpc_server *s = arg;
    struct pollfd p[2] = {{.fd = s->listen_fd, .events = POLLIN},
                          {.fd = s->stop_fd, .events = POLLIN}};
    while (!atomic_load(&s->stopping)) {
        int n = poll(p, 2, LOOP_TICK_MS);
        if (n < 0 && errno != EINTR) {
            ML_ERR(MOD, "poll on the listening socket failed: %s", strerror(errno));
            break;
        }
        if (n <= 0 || p[1].revents)
            continue;
        if (p[0].revents && !accept_batch(s))
            poll(&p[1], 1, ACCEPT_BACKOFF_MS);
    }
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Listening sockets                                                    */
/* ------------------------------------------------------------------ */

static int listen_tcp(moonlet_rpc_server *s, const char *address, uint16_t port)
{
    int fd = moonlet_net_listen_tcp(address, port, SOMAXCONN, &s->port);
    if (fd < 0) {
        if (fd == MOONLET_NET_ESYS)
            ML_ERR(MOD, "cannot listen on %s:%u: %s", address, (unsigned)port, strerror(errno));
        return MOONLET_ERR_RPC_FAIL;
    }
    s->listen_fd = fd;
    return 0;
}

/* Removes a leftover socket file, but never a live server's nor a non-socket. */
static int remove_stale_socket(const struct sockaddr_un *sa)
{
    struct stat st;
    if (lstat(sa->sun_path, &st) != 0)
        return errno == ENOENT ? 0 : MOONLET_ERR_RPC_FAIL;
    if (!S_ISSOCK(st.st_mode)) {
        ML_ERR(MOD, "%s exists and is not a socket", sa->sun_path);
        return MOONLET_ERR_RPC_FAIL;
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (probe >= 0 && connect(probe, (const struct sockaddr *)sa, sizeof(*sa)) == 0) {
        close(probe);
        ML_ERR(MOD, "%s is in use by a running server", sa->sun_path);
        return MOONLET_ERR_RPC_FAIL;
    }
    if (probe >= 0)
        close(probe);
    return unlink(sa->sun_path) == 0 || errno == ENOENT ? 0 : MOONLET_ERR_RPC_FAIL;
}

static int listen_unix(moonlet_rpc_server *s)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(s->unix_path) >= sizeof(sa.sun_path))
        return MOONLET_ERR_INVALID_PARAMS;
    strcpy(sa.sun_path, s->unix_path);
    if (remove_stale_socket(&sa) != 0)
        return MOONLET_ERR_RPC_FAIL;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return MOONLET_ERR_RPC_FAIL;
    fchmod(fd, 0600); /* Linux applies the socket inode's mode at bind */
    struct stat st;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || chmod(sa.sun_path, 0600) != 0 ||
        lstat(sa.sun_path, &st) != 0 || listen(fd, SOMAXCONN) != 0) {
        ML_ERR(MOD, "cannot listen on %s: %s", s->unix_path, strerror(errno));
        close(fd);
        return MOONLET_ERR_RPC_FAIL;
    }
    s->unix_dev = st.st_dev;
    s->unix_ino = st.st_ino;
    s->listen_fd = fd;
    return 0;
}

/* Unlinks the socket path only while it is still the one this server bound. */
static void unlink_own_socket(moonlet_rpc_server *s)
{
    struct stat st;
    if (s->unix_ino != 0 && lstat(s->unix_path, &st) == 0 && st.st_dev == s->unix_dev &&
        st.st_ino == s->unix_ino)
        unlink(s->unix_path);
}

/* ------------------------------------------------------------------ */
/* Lifecycle                                                            */
/* ------------------------------------------------------------------ */

static int build_method_table(moonlet_rpc_server *s, const moonlet_rpc_server_opts *o)
{
    uint32_t max_id = 0;
    if (o->nmethods > 0 && o->methods == NULL)
        return MOONLET_ERR_INVALID_PARAMS;
    for (size_t i = 0; i < o->nmethods; i++) {
        const moonlet_rpc_method *m = &o->methods[i];
        if (m->fn == NULL || m->id == MOONLET_RPC_AUTH || m->id > MAX_METHOD_ID) {
            ML_ERR(MOD, "method %u (%s): no handler, reserved id or id above %u", m->id,
                   m->name ? m->name : "?", MAX_METHOD_ID);
            return MOONLET_ERR_INVALID_PARAMS;
        }
        if (m->id > max_id)
            max_id = m->id;
    }
    s->table_len = max_id + 1;
    s->table = calloc(s->table_len, sizeof(*s->table));
    s->calls = calloc(s->table_len, sizeof(*s->calls));
    s->methods = calloc(o->nmethods ? o->nmethods : 1, sizeof(*s->methods));
    if (s->table == NULL || s->calls == NULL || s->methods == NULL)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (size_t i = 0; i < o->nmethods; i++) {
        s->methods[i] = o->methods[i];
        if (s->table[o->methods[i].id] != NULL) {
            ML_ERR(MOD, "method id %u registered twice", o->methods[i].id);
            return MOONLET_ERR_INVALID_PARAMS;
        }
        s->table[o->methods[i].id] = &s->methods[i];
    }
    return 0;
}

static int copy_options(moonlet_rpc_server *s, const moonlet_rpc_server_opts *o)
{
    s->max_frame = o->max_frame ? o->max_frame : MOONLET_DEFAULT_MAX_FRAME;
    if (s->max_frame < MIN_MAX_FRAME || s->max_frame > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    s->max_conns = o->max_connections;
    s->max_elements = o->max_request_elements ? o->max_request_elements : UINT64_MAX;
    s->max_batch = o->max_batch;
    s->auth_timeout_ms = o->auth_timeout_ms ? o->auth_timeout_ms
                                            : MOONLET_RPC_DEFAULT_AUTH_TIMEOUT_MS;
    s->frame_timeout_ms = o->frame_timeout_ms ? o->frame_timeout_ms
                                              : MOONLET_RPC_DEFAULT_FRAME_TIMEOUT_MS;
    s->idle_timeout_ms = o->idle_timeout_ms;
    if (o->busy_poll_us > MOONLET_RPC_MAX_BUSY_POLL_US)
        return MOONLET_ERR_INVALID_PARAMS;
    s->busy_poll_ns = (int64_t)o->busy_poll_us * 1000;
    s->yield_after_ns = (int64_t)o->yield_after_us * 1000;
    snprintf(s->name, sizeof(s->name), "%s", o->name ? o->name : "rpc");
    s->ctx = o->ctx;
    s->on_close = o->on_close;
    s->reply_epoch = o->reply_epoch;
    s->creds = o->creds;
    s->authorize = o->authorize;
    if (o->tls != NULL && o->unix_path == NULL) {
        if (!moonlet_tls_ctx_is_server(o->tls))
            return MOONLET_ERR_INVALID_PARAMS;
        moonlet_tls_ctx_ref(o->tls);
        s->tls = o->tls;
    }
    if (o->auth_token != NULL && o->creds == NULL) {
        s->token_len = o->auth_token_len ? o->auth_token_len : strlen(o->auth_token);
        s->token = malloc(s->token_len + 1);
        if (s->token == NULL)
            return MOONLET_ERR_INTERNAL_ERROR;
        memcpy(s->token, o->auth_token, s->token_len);
        s->token[s->token_len] = '\0';
    }
    if (o->unix_path != NULL && (s->unix_path = strdup(o->unix_path)) == NULL)
        return MOONLET_ERR_INTERNAL_ERROR;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->nloops = o->threads > 0 ? o->threads : (cores > 0 ? (int)cores : 1);
    if (s->nloops > MAX_THREADS)
        s->nloops = MAX_THREADS;
    return build_method_table(s, o);
}

static int create_loops(moonlet_rpc_server *s)
{
    s->loops = calloc((size_t)s->nloops, sizeof(*s->loops));
    if (s->loops == NULL)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (int i = 0; i < s->nloops; i++) {
        s->loops[i].epfd = s->loops[i].wake_fd = -1;
        if (loop_init(s, &s->loops[i]) != 0) {
            s->nloops = i + 1; /* destroy what was initialised */
            return MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    return 0;
}

int moonlet_rpc_server_create(const moonlet_rpc_server_opts *opts, moonlet_rpc_server **out)
{
    if (opts == NULL || out == NULL)
        return MOONLET_ERR_INVALID_PARAMS;
    *out = NULL;
    moonlet_rpc_server *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return MOONLET_ERR_INTERNAL_ERROR;
    s->listen_fd = -1;
    s->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    atomic_init(&s->stopping, false);
    atomic_init(&s->loops_stopping, false);
    atomic_init(&s->nconns, 0);
    int rc = s->stop_fd < 0 ? MOONLET_ERR_INTERNAL_ERROR : copy_options(s, opts);
    if (rc == 0)
        rc = create_loops(s);
    if (rc == 0)
        rc = s->unix_path ? listen_unix(s)
                          : listen_tcp(s, opts->address ? opts->address : "127.0.0.1", opts->port);
    if (rc != 0) {
        moonlet_rpc_server_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

uint16_t moonlet_rpc_server_port(const moonlet_rpc_server *s) { return s->unix_path ? 0 : s->port; }

size_t moonlet_rpc_server_connections(const moonlet_rpc_server *s)
{
    return atomic_load(&((moonlet_rpc_server *)s)->nconns);
}

uint64_t moonlet_rpc_server_calls(const moonlet_rpc_server *s, uint32_t method)
{
    if (method >= s->table_len)
        return 0;
    return atomic_load_explicit(&((moonlet_rpc_server *)s)->calls[method], memory_order_relaxed);
}

uint64_t moonlet_rpc_server_reply_deadline_closes(const moonlet_rpc_server *s)
{
    return atomic_load(&((moonlet_rpc_server *)s)->reply_deadline_closes);
}

uint64_t moonlet_rpc_server_refused(const moonlet_rpc_server *s)
{
    return atomic_load(&((moonlet_rpc_server *)s)->refused);
}

uint64_t moonlet_rpc_server_yields(const moonlet_rpc_server *s)
{
    return atomic_load(&((moonlet_rpc_server *)s)->yields);
}

int moonlet_rpc_server_start(moonlet_rpc_server *s)
{
    if (s == NULL || s->started || s->stopped)
        return MOONLET_ERR_INVALID_PARAMS;
    s->started = true;
    for (int i = 0; i < s->nloops; i++) {
        if (moonlet_thread_create(&s->loops[i].thread, loop_main, &s->loops[i], "%s-loop%d",
                                  s->name, i) != 0)
            goto fail;
        s->loops[i].thread_started = true;
    }
    if (moonlet_thread_create(&s->acceptor, acceptor_main, s, "%s-accept", s->name) != 0)
        goto fail;
    s->acceptor_started = true;
    if (s->unix_path)
        ML_INFO(MOD, "serving on %s with %d loop threads", s->unix_path, s->nloops);
    else
        ML_INFO(MOD, "serving on port %u with %d loop threads", (unsigned)s->port, s->nloops);
    return 0;
fail:
    ML_ERR(MOD, "cannot start server threads");
    moonlet_rpc_server_stop(s);
    return MOONLET_ERR_INTERNAL_ERROR;
}

void moonlet_rpc_server_stop(moonlet_rpc_server *s)
{
    if (s == NULL || s->stopped)
        return;
    s->stopped = true;
    atomic_store(&s->stopping, true);
    if (s->stop_fd >= 0)
        wake(s->stop_fd);
    if (s->acceptor_started)
        pthread_join(s->acceptor, NULL);
    atomic_store(&s->loops_stopping, true);
    for (int i = 0; s->loops != NULL && i < s->nloops; i++)
        if (s->loops[i].thread_started)
            wake(s->loops[i].wake_fd);
    for (int i = 0; s->loops != NULL && i < s->nloops; i++)
        if (s->loops[i].thread_started)
            pthread_join(s->loops[i].thread, NULL);
    close_fd(&s->listen_fd);
}

void moonlet_rpc_server_destroy(moonlet_rpc_server *s)
{
    if (s == NULL)
        return;
    moonlet_rpc_server_stop(s);
    for (int i = 0; s->loops != NULL && i < s->nloops; i++)
        loop_destroy(&s->loops[i]);
    if (s->unix_path)
        unlink_own_socket(s);
    close_fd(&s->stop_fd);
    close_fd(&s->reserve_fd);
    free(s->loops);
    free(s->table);
    free(s->calls);
    free(s->methods);
    moonlet_tls_ctx_unref(s->tls);
    if (s->token)
        memset(s->token, 0, s->token_len);
    free(s->token);
    free(s->unix_path);
    free(s);
}
