/*
 * rpc_server.h - the control-plane RPC server (epoll, worker threads).
 *
 * One acceptor thread hands accepted connections round-robin to `threads`
 * event-loop threads; each loop owns its connections, reads frames, runs the
 * method's handler inline and queues the reply.  A connection is served by
 * one thread only, so its replies leave in request order; a client may
 * pipeline any number of requests.  Handlers therefore run concurrently on
 * different connections and must be thread safe.
 *
 * Bad input never takes the server down: an oversized or zero length, or a
 * body that is not a well-formed request, gets an INVALID_PARAMS reply, then
 * the connection is closed; a connection that closes mid-frame is simply
 * closed.  Every other connection keeps being served.  An unknown method id is
 * a well-formed request: it gets an INVALID_PARAMS reply and the connection
 * stays open.  So does a request whose arguments do not match its method's
 * declared list (moonlet_rpc_method.spec, rpc_args.h): they are decoded and
 * checked into the request's arena before the handler runs, and a mismatch
 * never reaches the handler.
 *
 * Authentication: when a token is configured, the first frame of every
 * connection must be MOONLET_RPC_AUTH [token]; anything else (or a wrong token)
 * gets ILLEGAL_CLIENT and the connection is closed.  The token is compared in
 * constant time and never logged.  Until it has authenticated, a connection
 * may send frames of at most MOONLET_RPC_PRE_AUTH_MAX_FRAME bytes (a longer
 * length gets ILLEGAL_CLIENT before any of the body is buffered) and must
 * authenticate within auth_timeout_ms of being accepted.
 *
 * Roles (issue 33, common/cred.h): with a credential set (opts.creds) instead
 * of one token, AUTH looks the presented token up in the set and the
 * connection acts under that credential from then on.  Every method declares
 * the roles that may call it (moonlet_rpc_method.roles; 0: any caller); a
 * call whose credential holds none of them is answered PERMISSION_DENIED
 * before its arguments are decoded, and then opts.authorize (when set) may
 * refuse a call by its decoded arguments (a tenant the credential does not
 * cover) before the handler runs.  Refusals keep the connection open, are
 * counted (moonlet_rpc_server_refused) and logged at most once a few seconds
 * (the credential's line in its file and the method, never the token).
 * With one token, or none, every connection holds every role: behaviour as
 * before roles existed.
 *
 * Limits on what a peer can hold (each closes only the offending
 * connection): at most max_connections open connections (more are accepted
 * and closed at once, so the listen queue never backs up); a frame whose
 * first byte arrived must be complete within frame_timeout_ms, and replies
 * must be taken within it of being queued (a deadline, not a progress timer:
 * a peer reading a few bytes at a time is cut there too); a connection without a
 * request for idle_timeout_ms is closed.  At the process's descriptor limit
 * (EMFILE/ENFILE) the acceptor closes the oldest waiting connection with a
 * reserved descriptor, backs off, and logs at most one line every few
 * seconds.
 *
 * TLS (opts.tls, transport/tls.h): every TCP connection is a TLS session;
 * the handshake runs on the connection's loop like any other I/O and must
 * finish within auth_timeout_ms of the accept (a deadline whatever the
 * token).  A peer whose first byte does not open a TLS handshake is a
 * plaintext client: its first request is answered, in plaintext,
 * ILLEGAL_CLIENT "this server requires TLS" and the connection closed.  A
 * handshake that fails (a client certificate missing or not signed by the
 * CA) closes the connection, with a rate-limited log line.  The token, when
 * set, is still required inside TLS.  moonlet_rpc_ctx_peer_name() gives a
 * handler the client certificate's common name.
 *
 * Locks: the server takes only its own internal locks and never holds one
 * while calling a handler.
 */
#ifndef MOONLET_RPC_SERVER_H
#define MOONLET_RPC_SERVER_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc_args.h"
#include "tls.h"

typedef struct moonlet_rpc_server moonlet_rpc_server;

/* What a handler learns about the call it serves. */
typedef struct moonlet_rpc_ctx {
    void *server_ctx;  /* opts.ctx */
    void **conn_data;  /* per-connection slot, NULL at accept; the handler may set it */
    uint64_t id;       /* request id */
    uint32_t method;   /* method id */
    void *conn;        /* the server's connection (moonlet_rpc_ctx_take_fd, _result_mark) */
    /* The request's arena: memory from it lives until the reply is queued
     * (moonlet_rpc_alloc), so handlers free nothing they take from it. */
    msgpack_zone *zone;
    /* The method's decoded arguments (its spec's args struct), or NULL for a
     * method without a spec. */
    const void *argv;
    /* The credential the connection authenticated with (cred.h);
     * &moonlet_cred_everything without a credential set. */
    const struct moonlet_cred *cred;
} moonlet_rpc_ctx;

/* Request-lifetime memory (NULL when out of memory). */
static inline void *moonlet_rpc_alloc(moonlet_rpc_ctx *ctx, size_t size)
{
    return msgpack_zone_malloc(ctx->zone, size ? size : 1);
}

/*
 * A method handler.  It reads its positional arguments from `args` (an array;
 * use wire.h) and packs EXACTLY ONE object into `out`: the result on success,
 * or an error message (moonlet_rpc_error()) on failure.  It returns the reply
 * code (0 or a negative moonlet error code).
 */
typedef int (*moonlet_rpc_handler)(moonlet_rpc_ctx *ctx, const msgpack_object *args,
                                   msgpack_packer *out);

/*
 * Defines handler `fn` of a method whose spec decodes into struct T: the body
 * that follows gets `ctx`, `a` (const T *, the decoded arguments) and `out`.
 *   MOONLET_RPC_HANDLER(h_put, put_args) { ... a->key ... }
 */
#define MOONLET_RPC_HANDLER(fn, T)                                                              \
    static int fn##_typed(moonlet_rpc_ctx *ctx, const T *a, msgpack_packer *out);               \
    static int fn(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)        \
    {                                                                                           \
        (void)args;                                                                             \
        return fn##_typed(ctx, (const T *)ctx->argv, out);                                      \
    }                                                                                           \
    static int fn##_typed(moonlet_rpc_ctx *ctx, const T *a, msgpack_packer *out)

typedef struct moonlet_rpc_method {
    uint32_t id;
    const char *name;
    moonlet_rpc_handler fn;
    /* The method's declared arguments (rpc_args.h), or NULL.  With a spec the
     * server decodes and checks `args` before calling fn (a mismatch is
     * answered INVALID_PARAMS with a message from the table, and fn is not
     * called); fn finds the decoded struct in ctx->argv. */
    const moonlet_rpc_args_spec *spec;
    /* MOONLET_ROLE_* bits (cred.h) of the callers it serves; 0: any. */
    uint32_t roles;
} moonlet_rpc_method;

#define MOONLET_RPC_MAX_BUSY_POLL_US 100000

typedef struct moonlet_rpc_server_opts {
    const char *address;      /* IPv4/IPv6 literal or host name; default "127.0.0.1" */
    uint16_t port;            /* 0 picks a free port (see moonlet_rpc_server_port) */
    const char *unix_path;    /* when set: listen on this AF_UNIX path instead (mode 0600) */
    int threads;              /* event-loop threads; <= 0 means the number of cores */
    const char *name;         /* its threads' names: NAME-accept, NAME-loopN; default "rpc" */
    size_t max_frame;         /* 0 means MOONLET_DEFAULT_MAX_FRAME */
    const char *auth_token;   /* NULL or "" disables authentication */
    size_t auth_token_len;
    /* Credentials with roles (cred.h); when set, auth_token is ignored and
     * AUTH takes any token of the set.  Must outlive the server. */
    const struct moonlet_cred_set *creds;
    /* Optional, with creds: called after the arguments are decoded and
     * before the handler; 0 lets the call through, a nonzero code refuses
     * it with msg (written into msg[cap]) as the error message. */
    int (*authorize)(void *ctx, const struct moonlet_cred *cred, uint32_t method,
                     const void *argv, char *msg, size_t cap);
    const moonlet_rpc_method *methods;
    size_t nmethods;
    void *ctx;                /* handed to handlers as server_ctx */
    /* After handling events a loop keeps polling, without sleeping, for this
     * long before it blocks (0: never); at most MOONLET_RPC_MAX_BUSY_POLL_US. */
    uint32_t busy_poll_us;
    /* A loop that has held its core this long without a break (no sleep, no
     * preemption) yields it once after its events, so the callers it woke on
     * that core run before the end of its time slice (0: never). */
    uint32_t yield_after_us;
    /* Called on the connection's loop thread when it closes, with its conn_data. */
    void (*on_close)(void *ctx, void *conn_data);
    /* Optional: called before each method's reply (not AUTH's) with the
     * connection's conn_data; a nonzero result is sent as the reply's 4th
     * element [id, code, result, epoch] (frame.h).  NULL or 0: 3 elements. */
    uint64_t (*reply_epoch)(void *ctx, void *conn_data);
    /* Limits (see above).  0 picks the default named beside each. */
    uint32_t max_connections;  /* 0: no cap below the descriptor limit */
    uint32_t auth_timeout_ms;  /* 0: MOONLET_RPC_DEFAULT_AUTH_TIMEOUT_MS (token only) */
    uint32_t frame_timeout_ms; /* 0: MOONLET_RPC_DEFAULT_FRAME_TIMEOUT_MS */
    uint32_t idle_timeout_ms;  /* 0: idle connections are kept */
    /* Elements (array items, map entries twice) one request may hold; a larger
     * request is answered INVALID_PARAMS before it is decoded, and the
     * connection stays open.  Bounds the work and memory of one request on
     * its loop thread.  0: no cap. */
    uint64_t max_request_elements;
    /* Elements a BATCH argument (rpc_args.h) may hold; 0: no cap. */
    uint64_t max_batch;
    /* A server TLS context (tls.h; the server takes a reference): every TCP
     * connection speaks TLS.  NULL: plaintext, as always.  Ignored with
     * unix_path. */
    moonlet_tls_ctx *tls;
} moonlet_rpc_server_opts;

#define MOONLET_RPC_PRE_AUTH_MAX_FRAME 8192u /* fits AUTH with the longest token file */
#define MOONLET_RPC_DEFAULT_AUTH_TIMEOUT_MS 5000u
#define MOONLET_RPC_DEFAULT_FRAME_TIMEOUT_MS 30000u

/* Binds and listens (does not start threads yet).  Returns 0 or
 * MOONLET_ERR_INVALID_PARAMS (bad options) / MOONLET_ERR_RPC_FAIL (bind failed). */
int moonlet_rpc_server_create(const moonlet_rpc_server_opts *opts, moonlet_rpc_server **out);
/* The bound TCP port (useful with port 0); 0 for unix sockets. */
uint16_t moonlet_rpc_server_port(const moonlet_rpc_server *s);
/* Starts the acceptor and loop threads. */
int moonlet_rpc_server_start(moonlet_rpc_server *s);
/* Stops accepting, closes every connection, joins all threads.  Returns within
 * about 100 ms plus the longest running handler.  Idempotent. */
void moonlet_rpc_server_stop(moonlet_rpc_server *s);
/* Stops if needed and frees everything (unlinks the unix socket path). */
void moonlet_rpc_server_destroy(moonlet_rpc_server *s);
/* Number of currently open connections. */
size_t moonlet_rpc_server_connections(const moonlet_rpc_server *s);
/* Requests of `method` handed to its handler so far (decoded, authenticated,
 * known method; whatever the handler answered).  0 for an unknown id. */
uint64_t moonlet_rpc_server_calls(const moonlet_rpc_server *s, uint32_t method);
/* Calls refused for their credential's roles or tenants (see Roles above). */
uint64_t moonlet_rpc_server_refused(const moonlet_rpc_server *s);
/* How many times the loops yielded their core (opts.yield_after_us). */
uint64_t moonlet_rpc_server_yields(const moonlet_rpc_server *s);
/* Connections closed because replies queued on them were not all taken
 * within frame_timeout_ms of being queued (their buffers freed with them). */
uint64_t moonlet_rpc_server_reply_deadline_closes(const moonlet_rpc_server *s);

/*
 * File descriptors passed over a unix-socket connection (SCM_RIGHTS).  The
 * server of a unix_path keeps the descriptors a peer sends, in arrival order,
 * up to MOONLET_RPC_MAX_CONN_FDS per connection (more are closed and
 * dropped); they belong to the connection, not to a frame.  A handler takes
 * the oldest one with moonlet_rpc_ctx_take_fd() and then owns it; -1 when
 * none is waiting.  Descriptors nobody took are closed with the connection.
 * A protocol that passes descriptors sends one with the request that uses
 * it and waits for that reply before sending another (as rpc_client's
 * moonlet_rpc_client_call_fd() does).  Loop thread only; no locks.
 */
#define MOONLET_RPC_MAX_CONN_FDS 8
int moonlet_rpc_ctx_take_fd(moonlet_rpc_ctx *ctx);

/*
 * Takes the connection over: once this request's reply is sent, the server
 * stops serving the connection and calls fn(arg, tag, fd, tls) on the loop
 * thread with its socket (non-blocking, open; fn owns it from then on) and,
 * on a TLS server, its session (fn owns it too; NULL without TLS).  on_close runs
 * first, as for a close.  The peer must send nothing behind this request
 * until it has read the reply: data already received behind it closes the
 * connection instead, and a connection whose reply is not taken within
 * frame_timeout_ms or that the server stops meanwhile is closed; fn is not
 * called then.  Loop thread only.  0, or INVALID_PARAMS (twice, or on a
 * connection that is closing).
 */
int moonlet_rpc_ctx_detach(moonlet_rpc_ctx *ctx,
                           void (*fn)(void *arg, uint64_t tag, int fd, moonlet_tls *tls),
                           void *arg, uint64_t tag);

/* The connection's TLS peer: the client certificate's subject common name
 * ("" when it presented none), or NULL on a connection without TLS.  Valid
 * during the handler call.  The hook by which a certificate will map to a
 * role. */
const char *moonlet_rpc_ctx_peer_name(const moonlet_rpc_ctx *ctx);

/*
 * A handler that packed its result and then has to answer something else
 * (a write the standby did not acknowledge, service.c) rewinds it:
 * moonlet_rpc_result_mark() before packing, moonlet_rpc_result_rewind() to
 * drop what was packed since, then packs the other result.  Within one
 * handler call only; loop thread only.
 */
size_t moonlet_rpc_result_mark(const moonlet_rpc_ctx *ctx);
void moonlet_rpc_result_rewind(moonlet_rpc_ctx *ctx, size_t mark);

/* Packs a formatted error message as the result and returns `code`. */
int moonlet_rpc_error(msgpack_packer *out, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
