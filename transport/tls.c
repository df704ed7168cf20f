/*
 * tls.c - TLS sessions over moonlet's non-blocking sockets (OpenSSL); see
 * tls.h for the contract.
 *
 * Why OpenSSL: libcurl's OpenSSL flavour (the master's etcd client) already
 * brings libssl into the master, so one TLS library serves both; its
 * contexts are reference counted, which makes a SIGHUP reload a pointer
 * swap (sessions hold the context they were made with), and SSL_pending()
 * exposes decrypted bytes the event loops must not wait for.
 *
 * The socket is reached through a small BIO of our own (send with
 * MSG_NOSIGNAL, recv), not OpenSSL's socket BIO, which writes with write(2)
 * and would raise SIGPIPE in a process that did not ignore it (a Python
 * program, a test).
 *
 * Locks: moonlet_tls_ctx.mu around the current SSL_CTX pointer;
 * moonlet_tls.mu around every SSL_* call on the session (never across a
 * wait).  Neither is held while the other is taken, except ctx.mu inside
 * moonlet_tls_new before the session exists.
 */
#include "tls.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <arpa/inet.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "log.h"
#include "moonlet/error.h"
#include "net.h"

#define MOD "tls"
#define ERR_TEXT_MAX 256
#define PEER_NAME_MAX 256

struct moonlet_tls_ctx {
    pthread_mutex_t mu;
    SSL_CTX *cur;
    bool server;
    char *cert, *key, *ca;
    atomic_uint refs;
    _Atomic uint64_t generation;
};

struct moonlet_tls {
    pthread_mutex_t mu;
    SSL *ssl;
    int fd;
    bool server;
    bool done;
    short want;
    char err[ERR_TEXT_MAX];
    char peer[PEER_NAME_MAX];
};

/* ------------------------------------------------------------------ */
/* The socket BIO                                                       */
/* ------------------------------------------------------------------ */

static BIO_METHOD *g_bio;
static pthread_once_t g_bio_once = PTHREAD_ONCE_INIT;

static int bio_fd(BIO *b) { return (int)(intptr_t)BIO_get_data(b); }

static int bio_write(BIO *b, const char *in, int n)
{
    BIO_clear_retry_flags(b);
    ssize_t r = send(bio_fd(b), in, (size_t)n, MSG_NOSIGNAL);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)r;
}

static int bio_read(BIO *b, char *out, int n)
{
    BIO_clear_retry_flags(b);
    ssize_t r = recv(bio_fd(b), out, (size_t)n, 0);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_read(b);
    return (int)r;
}

static int bio_puts(BIO *b, const char *s) { return bio_write(b, s, (int)strlen(s)); }

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static void bio_method_init(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "moonlet-socket");
    if (m && BIO_meth_set_write(m, bio_write) && BIO_meth_set_read(m, bio_read) &&
        BIO_meth_set_puts(m, bio_puts) && BIO_meth_set_ctrl(m, bio_ctrl) &&
        BIO_meth_set_create(m, bio_create))
        g_bio = m;
    else if (m)
        BIO_meth_free(m);
}

/* ------------------------------------------------------------------ */
/* Contexts                                                             */
/* ------------------------------------------------------------------ */

/* The OpenSSL error queue in words (and cleared). */
static void err_text(char *buf, size_t cap, const char *what)
{
    unsigned long e = ERR_get_error();
    unsigned long last = e;
    while (e) {
        last = e;
        e = ERR_get_error();
    }
    if (last) {
        char r[200];
        ERR_error_string_n(last, r, sizeof(r));
        snprintf(buf, cap, "%s: %s", what, r);
    } else {
        snprintf(buf, cap, "%s", what);
    }
}

static SSL_CTX *build(bool server, const char *cert, const char *key, const char *ca)
{
    char why[ERR_TEXT_MAX];
    ERR_clear_error();
    SSL_CTX *x = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (x == NULL) {
        err_text(why, sizeof(why), "SSL_CTX_new");
        ML_ERR(MOD, "%s", why);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(x, TLS1_2_VERSION);
    SSL_CTX_set_mode(x, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* a TCP EOF ends the stream like close_notify: frames carry their length */
    SSL_CTX_set_options(x, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
    if (server) {
        SSL_CTX_set_session_cache_mode(x, SSL_SESS_CACHE_OFF);
        SSL_CTX_set_num_tickets(x, 0);
    }
    const char *what = NULL;
    if (cert && SSL_CTX_use_certificate_chain_file(x, cert) != 1)
        what = cert;
    else if (cert && SSL_CTX_use_PrivateKey_file(x, key, SSL_FILETYPE_PEM) != 1)
        what = key;
    else if (cert && SSL_CTX_check_private_key(x) != 1)
        what = "the key does not match the certificate";
    else if (ca && SSL_CTX_load_verify_locations(x, ca, NULL) != 1)
        what = ca;
    if (what) {
        err_text(why, sizeof(why), what);
        ML_ERR(MOD, "cannot load %s", why);
        SSL_CTX_free(x);
        return NULL;
    }
    if (ca)
        SSL_CTX_set_verify(x, server ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
                                     : SSL_VERIFY_PEER,
                           NULL);
    return x;
}

static char *dup_or_null(const char *s) { return s && *s ? strdup(s) : NULL; }

int moonlet_tls_ctx_create(bool server, const moonlet_tls_files *f, moonlet_tls_ctx **out)
{
    if (f == NULL || out == NULL)
        return MOONLET_ERR_INVALID_PARAMS;
    *out = NULL;
    bool has_cert = f->cert && *f->cert, has_key = f->key && *f->key, has_ca = f->ca && *f->ca;
    if (has_cert != has_key || (server && !has_cert) || (!server && !has_ca)) {
        ML_ERR(MOD, "%s TLS needs %s", server ? "a server's" : "a client's",
               server ? "a certificate and its key (and a CA to require client certificates)"
                      : "a CA (and a certificate with its key for mutual TLS)");
        return MOONLET_ERR_INVALID_PARAMS;
    }
    pthread_once(&g_bio_once, bio_method_init);
    if (g_bio == NULL)
        return MOONLET_ERR_INTERNAL_ERROR;
    moonlet_tls_ctx *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return MOONLET_ERR_INTERNAL_ERROR;
    c->server = server;
    c->cert = dup_or_null(f->cert);
    c->key = dup_or_null(f->key);
    c->ca = dup_or_null(f->ca);
    pthread_mutex_init(&c->mu, NULL);
    atomic_init(&c->refs, 1);
    atomic_init(&c->generation, 0);
    c->cur = build(server, c->cert, c->key, c->ca);
    if (c->cur == NULL) {
        moonlet_tls_ctx_unref(c);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    *out = c;
    return 0;
}

int moonlet_tls_ctx_reload(moonlet_tls_ctx *c)
{
    if (c == NULL)
        return MOONLET_ERR_INVALID_PARAMS;
    SSL_CTX *x = build(c->server, c->cert, c->key, c->ca);
    if (x == NULL) {
        ML_WARN(MOD, "reload failed: keeping the certificates loaded before");
        return MOONLET_ERR_INVALID_PARAMS;
    }
    pthread_mutex_lock(&c->mu);
    SSL_CTX *old = c->cur;
    c->cur = x;
    pthread_mutex_unlock(&c->mu);
    SSL_CTX_free(old); /* sessions made with it keep their reference */
    atomic_fetch_add(&c->generation, 1);
    ML_INFO(MOD, "reloaded %s", c->cert ? c->cert : c->ca);
    return 0;
}

uint64_t moonlet_tls_ctx_generation(const moonlet_tls_ctx *c)
{
    return atomic_load(&((moonlet_tls_ctx *)c)->generation);
}

bool moonlet_tls_ctx_is_server(const moonlet_tls_ctx *c) { return c->server; }

void moonlet_tls_ctx_ref(moonlet_tls_ctx *c) { atomic_fetch_add(&c->refs, 1); }

void moonlet_tls_ctx_unref(moonlet_tls_ctx *c)
{
    if (c == NULL || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    SSL_CTX_free(c->cur);
    pthread_mutex_destroy(&c->mu);
    free(c->cert);
    free(c->key);
    free(c->ca);
    free(c);
}

/* ------------------------------------------------------------------ */
/* Sessions                                                             */
/* ------------------------------------------------------------------ */

int moonlet_tls_new(moonlet_tls_ctx *c, int fd, const char *peer_name, moonlet_tls **out)
{
    if (c == NULL || fd < 0 || out == NULL)
        return MOONLET_ERR_INVALID_PARAMS;
    *out = NULL;
    moonlet_tls *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return MOONLET_ERR_INTERNAL_ERROR;
    t->fd = fd;
    t->server = c->server;
    t->want = POLLIN;
    pthread_mutex_lock(&c->mu);
    t->ssl = SSL_new(c->cur); /* takes its own reference on the context */
    pthread_mutex_unlock(&c->mu);
    BIO *b = t->ssl ? BIO_new(g_bio) : NULL;
    if (b == NULL) {
        SSL_free(t->ssl);
        free(t);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    BIO_set_data(b, (void *)(intptr_t)fd);
    SSL_set_bio(t->ssl, b, b);
    if (c->server) {
        SSL_set_accept_state(t->ssl);
    } else {
        SSL_set_connect_state(t->ssl);
        if (peer_name && *peer_name) {
            unsigned char ip[16];
            bool is_ip = inet_pton(AF_INET, peer_name, ip) == 1 ||
                         inet_pton(AF_INET6, peer_name, ip) == 1;
            int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), peer_name)
                           : SSL_set1_host(t->ssl, peer_name) &&
                                 SSL_set_tlsext_host_name(t->ssl, peer_name);
            if (ok != 1) {
                ML_ERR(MOD, "cannot check the server certificate against '%s'", peer_name);
                SSL_free(t->ssl);
                free(t);
                return MOONLET_ERR_INVALID_PARAMS;
            }
        }
    }
    pthread_mutex_init(&t->mu, NULL);
    *out = t;
    return 0;
}

void moonlet_tls_free(moonlet_tls *t)
{
    if (t == NULL)
        return;
    SSL_free(t->ssl);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* Reasons of an alert the peer sent about this side's certificate. */
static bool cert_alert(unsigned long e)
{
    if (ERR_GET_LIB(e) != ERR_LIB_SSL)
        return false;
    switch (ERR_GET_REASON(e)) {
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_CERTIFICATE_VERIFY_FAILED:
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
        return true;
    default:
        return false;
    }
}

/* Maps the result r of an SSL call to errno and -1 / 0.  t->mu held. */
static int fail_from(moonlet_tls *t, int r, const char *what)
{
    int e = SSL_get_error(t->ssl, r);
    switch (e) {
    case SSL_ERROR_WANT_READ:
        t->want = POLLIN;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_WANT_WRITE:
        t->want = POLLOUT;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    case SSL_ERROR_SYSCALL: {
        int err = errno;
        if (ERR_peek_error() == 0 && r == 0)
            return 0; /* EOF */
        snprintf(t->err, sizeof(t->err), "%s: %s", what, err ? strerror(err) : "EOF");
        ERR_clear_error();
        errno = err == EPIPE || err == ECONNRESET ? EPIPE : EPROTO;
        return -1;
    }
    default: {
        bool refused = cert_alert(ERR_peek_last_error());
        long vr = SSL_get_verify_result(t->ssl);
        if (vr != X509_V_OK) {
            snprintf(t->err, sizeof(t->err), "%s: certificate verify failed: %s", what,
                     X509_verify_cert_error_string(vr));
            ERR_clear_error();
            refused = true;
        } else {
            err_text(t->err, sizeof(t->err), what);
        }
        errno = refused ? EACCES : EPROTO;
        return -1;
    }
    }
}

static void take_peer_name(moonlet_tls *t)
{
    X509 *peer = SSL_get0_peer_certificate(t->ssl);
    t->peer[0] = '\0';
    if (peer)
        X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, t->peer,
                                  sizeof(t->peer));
}

int moonlet_tls_handshake(moonlet_tls *t)
{
    pthread_mutex_lock(&t->mu);
    if (t->done) {
        pthread_mutex_unlock(&t->mu);
        return 0;
    }
    ERR_clear_error();
    int r = SSL_do_handshake(t->ssl);
    int rc = 0;
    if (r == 1) {
        t->done = true;
        take_peer_name(t);
    } else {
        rc = fail_from(t, r, "TLS handshake");
        if (rc == 0) { /* the peer closed during the handshake */
            snprintf(t->err, sizeof(t->err), "TLS handshake: the peer closed the connection");
            errno = EPROTO;
        }
        rc = -1;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

bool moonlet_tls_handshake_done(const moonlet_tls *t) { return t->done; }

ssize_t moonlet_tls_read(moonlet_tls *t, void *buf, size_t n)
{
    if (n > INT32_MAX)
        n = INT32_MAX;
    pthread_mutex_lock(&t->mu);
    ERR_clear_error();
    int r = SSL_read(t->ssl, buf, (int)n);
    ssize_t rc = r > 0 ? r : fail_from(t, r, "TLS read");
    if (r > 0)
        t->want = POLLIN;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

ssize_t moonlet_tls_write(moonlet_tls *t, const void *buf, size_t n)
{
    if (n > INT32_MAX)
        n = INT32_MAX;
    pthread_mutex_lock(&t->mu);
    ERR_clear_error();
    int r = SSL_write(t->ssl, buf, (int)n);
    ssize_t rc = r > 0 ? r : fail_from(t, r, "TLS write");
    if (rc == 0) { /* no write returns 0 bytes: the stream is over */
        errno = EPIPE;
        rc = -1;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

size_t moonlet_tls_pending(moonlet_tls *t)
{
    pthread_mutex_lock(&t->mu);
    int p = SSL_pending(t->ssl);
    pthread_mutex_unlock(&t->mu);
    return p > 0 ? (size_t)p : 0;
}

short moonlet_tls_want(const moonlet_tls *t) { return t->want; }

void moonlet_tls_shutdown(moonlet_tls *t)
{
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->mu);
    if (t->done) {
        ERR_clear_error();
        SSL_shutdown(t->ssl);
        ERR_clear_error();
    }
    pthread_mutex_unlock(&t->mu);
}

const char *moonlet_tls_error(const moonlet_tls *t) { return t->err; }

const char *moonlet_tls_peer_name(const moonlet_tls *t) { return t->peer; }

int moonlet_tls_handshake_by(moonlet_tls *t, uint64_t deadline_ms)
{
    for (;;) {
        if (moonlet_tls_handshake(t) == 0)
            return 0;
        if (errno != EAGAIN)
            return -1;
        int w = moonlet_net_wait(t->fd, moonlet_tls_want(t), deadline_ms);
        if (w != 0) {
            snprintf(t->err, sizeof(t->err), "TLS handshake: %s",
                     w == MOONLET_NET_ETIMEDOUT ? "no answer before the deadline" : "poll failed");
            errno = ETIMEDOUT;
            return -1;
        }
    }
}

int moonlet_tls_io_by(moonlet_tls *t, bool out, void *buf, size_t n, uint64_t deadline_ms)
{
    char *p = buf;
    while (n) {
        ssize_t r = out ? moonlet_tls_write(t, p, n) : moonlet_tls_read(t, p, n);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0 || errno != EAGAIN)
            return -1;
        if (moonlet_net_wait(t->fd, moonlet_tls_want(t), deadline_ms) != 0)
            return -1;
    }
    return 0;
}
