/*
 * tls.h - TLS as a layer over a connected, non-blocking socket (OpenSSL).
 *
 * Two objects:
 *  - moonlet_tls_ctx: what one side of every connection proves and trusts,
 *    built from PEM files (certificate chain, private key, CA bundle).  A
 *    server context with a CA requires every client to present a
 *    certificate signed by it (mutual TLS); a client context always
 *    verifies the server's chain against its CA and, when given a peer
 *    name, that the certificate names it (subjectAltName: an IP literal or
 *    a DNS name).  moonlet_tls_ctx_reload() reads the files again (the
 *    daemons call it on SIGHUP): sessions made afterwards use the new
 *    certificate; sessions already open keep the one they were made with
 *    (OpenSSL counts the references of the context each session holds).
 *    A reload that fails (a missing or mismatched file) keeps the old one.
 *  - moonlet_tls: one session over one socket the caller owns (freeing the
 *    session never closes the socket).  The calls never block: a call that
 *    cannot progress fails with errno EAGAIN and moonlet_tls_want() says
 *    whether to wait for POLLIN or POLLOUT (a read may need to write and
 *    the reverse).  Bytes the session already decrypted are not visible to
 *    poll(): check moonlet_tls_pending() before waiting for input.
 *    The _by() helpers wait with a deadline (moonlet_mono_ms).
 *
 * With TLS the protocol on the socket is plain TLS 1.2 or 1.3 carrying the
 * same frames as without (docs/protocol.md).  A moonlet frame never begins
 * with a TLS record's first byte (0x16 would announce a frame of about 369
 * MB, above any frame limit), so a server can tell a plaintext peer from a
 * TLS one by the first byte (moonlet_tls_is_hello) and answer it clearly.
 *
 * The socket is written with send(MSG_NOSIGNAL): a peer gone never raises
 * SIGPIPE.
 *
 * Locks: a context's mutex guards its current OpenSSL context (held only to
 * swap it or take a reference).  A session's mutex serialises the OpenSSL
 * calls on it, so two threads may use one session at once (one reading and
 * one writing, as the replication stream does); it is never held while
 * waiting.  No other locks are taken.
 */
#ifndef MOONLET_TLS_H
#define MOONLET_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct moonlet_tls_ctx moonlet_tls_ctx;
typedef struct moonlet_tls moonlet_tls;

typedef struct moonlet_tls_files {
    const char *cert; /* PEM certificate chain: required for a server; a client's
                       * is optional (presented when the server asks: mutual TLS) */
    const char *key;  /* PEM private key of cert (required with cert) */
    const char *ca;   /* PEM CA bundle: a client's is required (the server's
                       * certificate must chain to it); a server's makes
                       * client certificates required (mutual TLS) */
} moonlet_tls_files;

/* Builds a context from the files (copied paths; the files are read now).
 * Returns 0, INVALID_PARAMS (a file missing for the side, a file that does
 * not load, a key that does not match the certificate; the reason is
 * logged) or INTERNAL_ERROR.  The caller holds one reference. */
int moonlet_tls_ctx_create(bool server, const moonlet_tls_files *files, moonlet_tls_ctx **out);
/* Reads the files again; new sessions use them.  0, or the error of
 * create, in which case the context keeps what it had. */
int moonlet_tls_ctx_reload(moonlet_tls_ctx *c);
/* How many successful reloads the context has seen. */
uint64_t moonlet_tls_ctx_generation(const moonlet_tls_ctx *c);
bool moonlet_tls_ctx_is_server(const moonlet_tls_ctx *c);
void moonlet_tls_ctx_ref(moonlet_tls_ctx *c);
/* Drops a reference; the last frees it.  NULL is a no-op. */
void moonlet_tls_ctx_unref(moonlet_tls_ctx *c);

/* A session on the connected socket fd.  peer_name (client side only):
 * the name or IP the server's certificate must carry; NULL: the chain
 * alone is checked.  Returns 0 or INTERNAL_ERROR / INVALID_PARAMS. */
int moonlet_tls_new(moonlet_tls_ctx *c, int fd, const char *peer_name, moonlet_tls **out);
/* Does not close the socket.  NULL is a no-op. */
void moonlet_tls_free(moonlet_tls *t);

/* Advances the handshake: 0 when done, -1 with errno EAGAIN (wait for
 * moonlet_tls_want()), or -1 with errno EACCES (a certificate was refused,
 * by this side or by the peer) or EPROTO (anything else, a plaintext peer
 * included); moonlet_tls_error() says why. */
int moonlet_tls_handshake(moonlet_tls *t);
bool moonlet_tls_handshake_done(const moonlet_tls *t);
/* As read(2) / send(2): > 0 bytes, 0 at the end of the stream (close_notify
 * or EOF), -1 with errno EAGAIN, EACCES (the peer refused this side's
 * certificate: it sent a certificate alert) or EPROTO / EPIPE. */
ssize_t moonlet_tls_read(moonlet_tls *t, void *buf, size_t n);
ssize_t moonlet_tls_write(moonlet_tls *t, const void *buf, size_t n);
/* Decrypted bytes waiting to be read. */
size_t moonlet_tls_pending(moonlet_tls *t);
/* After EAGAIN: POLLIN or POLLOUT. */
short moonlet_tls_want(const moonlet_tls *t);
/* Sends close_notify, without waiting for the peer's (best effort). */
void moonlet_tls_shutdown(moonlet_tls *t);
/* The last failure in words ("" when none). */
const char *moonlet_tls_error(const moonlet_tls *t);
/* The verified peer certificate's subject common name ("" when the peer
 * presented none).  The hook for mapping a client certificate to a role. */
const char *moonlet_tls_peer_name(const moonlet_tls *t);

/* The handshake, waiting until deadline_ms: 0, or -1 with errno as
 * moonlet_tls_handshake (ETIMEDOUT for the deadline). */
int moonlet_tls_handshake_by(moonlet_tls *t, uint64_t deadline_ms);
/* Sends (out) or receives exactly n bytes by deadline_ms: 0, or -1 (the
 * peer closed, the session failed or the deadline passed). */
int moonlet_tls_io_by(moonlet_tls *t, bool out, void *buf, size_t n, uint64_t deadline_ms);

/* Whether a connection's first byte opens a TLS handshake record. */
static inline bool moonlet_tls_is_hello(uint8_t first_byte) { return first_byte == 0x16; }

#endif
