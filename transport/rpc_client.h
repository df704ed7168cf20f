/*
 * rpc_client.h - a blocking control-plane RPC connection.
 *
 * One moonlet_rpc_client is one TCP (or unix-domain) connection.  It is NOT
 * thread safe: use one per thread, or guard it (MasterClient does).  Every
 * wait is bounded by opts.timeout_ms; after a timeout or an I/O error the
 * connection is broken (a late reply would desynchronise it) and every later
 * call fails with MOONLET_ERR_RPC_FAIL until the owner reconnects.
 *
 * Call pattern (method ids belong to the service, not to this module: the
 * master's are in master/service/methods.h - ExistKey, MOONLET_M_EXIST_KEY, takes
 * (tenant, key) - the DummyClient protocol's in store/client/dummy_proto.h):
 *     msgpack_packer *pk = moonlet_rpc_client_begin(c, MOONLET_M_EXIST_KEY, 2);
 *     moonlet_pack_cstr(pk, tenant); moonlet_pack_str(pk, key, len);
 *     moonlet_reply rep;
 *     int rc = moonlet_rpc_client_call(c, &rep);   // transport status
 *     if (rc == 0) { use rep.code / rep.result; moonlet_reply_destroy(&rep); }
 * The real callers (store/master_client.c, store/client/dummy_client.c) pack
 * a typed args struct from their method table with moonlet_rpc_args_pack()
 * (rpc_args.h) rather than argument by argument.
 *
 * Pipelining: begin()+send() several times, then recv() the replies, which
 * arrive in request order and carry the request ids.
 */
#ifndef MOONLET_RPC_CLIENT_H
#define MOONLET_RPC_CLIENT_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frame.h"

typedef struct moonlet_rpc_client moonlet_rpc_client;

typedef struct moonlet_rpc_client_opts {
    int timeout_ms;          /* per call (connect, send and wait); <= 0 means 10000 */
    size_t max_frame;        /* 0 means MOONLET_DEFAULT_MAX_FRAME */
    const char *auth_token;  /* sent as the first frame when non-empty */
    size_t auth_token_len;
    /* A client TLS context (tls.h): the TCP connection speaks TLS, the
     * server's certificate checked against its CA and against tls_name.
     * NULL: plaintext, as always.  Not used on unix sockets. */
    struct moonlet_tls_ctx *tls;
    /* The name (or IP) the server's certificate must carry; NULL: the host
     * connected to. */
    const char *tls_name;
} moonlet_rpc_client_opts;

/* Connects (TCP_NODELAY) and authenticates when a token is given.  Returns 0,
 * MOONLET_ERR_RPC_FAIL (cannot connect), MOONLET_ERR_RPC_TIMEOUT, or the
 * server's code for a refused token (MOONLET_ERR_ILLEGAL_CLIENT). opts may be NULL.
 * With opts->tls: the TLS handshake, then one AUTH round trip even without
 * a token (under TLS 1.3 a server refuses a client certificate only after
 * the client's handshake is over), so a refusal shows here: ILLEGAL_CLIENT
 * (this client's certificate missing or refused, or the server's
 * certificate not signed by the CA or not naming tls_name), RPC_FAIL (the
 * server does not speak TLS); each logged with the reason.  A plaintext
 * client of a TLS server gets ILLEGAL_CLIENT "this server requires TLS". */
int moonlet_rpc_client_connect(const char *host, uint16_t port, const moonlet_rpc_client_opts *opts,
                               moonlet_rpc_client **out);
int moonlet_rpc_client_connect_unix(const char *path, const moonlet_rpc_client_opts *opts,
                                    moonlet_rpc_client **out);
void moonlet_rpc_client_close(moonlet_rpc_client *c);

/* Starts a request; the caller packs exactly `nargs` arguments through the
 * returned packer.  Discards any request begun but not sent. */
msgpack_packer *moonlet_rpc_client_begin(moonlet_rpc_client *c, uint32_t method, uint32_t nargs);

/* Sends the begun request and waits for its reply.  Returns 0 when a reply
 * arrived (the server's code is rep->code; release rep with
 * moonlet_reply_destroy), or MOONLET_ERR_RPC_FAIL / MOONLET_ERR_RPC_TIMEOUT /
 * MOONLET_ERR_BUFFER_OVERFLOW (request larger than max_frame), in which case
 * rep needs no release. */
int moonlet_rpc_client_call(moonlet_rpc_client *c, moonlet_reply *rep);

/* As moonlet_rpc_client_call(), and passes the descriptor fd to the server
 * with the request (SCM_RIGHTS; unix-domain connections only, else
 * INVALID_PARAMS before anything is sent).  The caller keeps its own fd
 * open either way; the server gets a duplicate (rpc_server.h:
 * moonlet_rpc_ctx_take_fd). */
int moonlet_rpc_client_call_fd(moonlet_rpc_client *c, int fd, moonlet_reply *rep);

/* Pipelining: sends the begun request without waiting; *id_out gets its id. */
int moonlet_rpc_client_send(moonlet_rpc_client *c, uint64_t *id_out);
/* Waits for the next reply, whatever its id. Same return convention as call. */
int moonlet_rpc_client_recv(moonlet_rpc_client *c, moonlet_reply *rep);

/* call() and recv() for a request whose result is not wanted: they return
 * the transport error, or the reply's code once a reply arrived (the reply
 * is released). */
int moonlet_rpc_client_call_code(moonlet_rpc_client *c);
int moonlet_rpc_client_recv_code(moonlet_rpc_client *c);

bool moonlet_rpc_client_broken(const moonlet_rpc_client *c);
/* Changes the per-call timeout of later calls (<= 0: the default). */
void moonlet_rpc_client_set_timeout(moonlet_rpc_client *c, int timeout_ms);
/* How many of this connection's waits for a reply stopped spinning, or did
 * not start, because the core was wanted (the host had no core to spare, or
 * a yield ran another thread) and slept instead. */
uint64_t moonlet_rpc_client_contended_waits(const moonlet_rpc_client *c);
int moonlet_rpc_client_fd(const moonlet_rpc_client *c);
/* With TLS: the server certificate's subject common name; NULL without TLS. */
const char *moonlet_rpc_client_tls_peer(const moonlet_rpc_client *c);

#endif
