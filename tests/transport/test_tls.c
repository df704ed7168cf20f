/*
 * test_tls.c - TLS under the control-plane RPC (transport/tls.c beneath
 * rpc_server.c and rpc_client.c): a call over mutual TLS, the client
 * certificate's name reaching the handler; a client without a certificate,
 * or with one of another CA, refused with ILLEGAL_CLIENT while the server
 * goes on serving; a plaintext client told "requires TLS"; a TLS client of
 * a plaintext server failing at once (no hang); a server certificate that
 * does not name the address; a reload (new connections get the new
 * certificate, connections already open keep working, a reload of a broken
 * file keeps the old one); a stalled or garbage handshake cut at the
 * deadline; large pipelined frames (partial TLS writes, decrypted bytes
 * that epoll does not see).  Certificates are made at run time in a temp
 * dir; servers bind 127.0.0.1 on ephemeral ports; every wait is bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "moonlet/error.h"
#include "monotime.h"
#include "net.h"
#include "rpc_client.h"
#include "rpc_server.h"
#include "tls.h"
#include "tls_certs.h"
#include "wire.h"

#define M_ECHO 100
#define M_WHO 101
#define CALL_TIMEOUT_MS 5000

static char g_dir[64];

static char *path_of(const char *name)
{
    static char bufs[8][128];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof(bufs[0]), "%s/%s", g_dir, name);
    return b;
}

static int h_echo(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    (void)ctx;
    msgpack_pack_object(out, *args);
    return 0;
}

/* The client certificate's common name, or nil without TLS. */
static int h_who(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    (void)args;
    const char *cn = moonlet_rpc_ctx_peer_name(ctx);
    if (cn)
        moonlet_pack_cstr(out, cn);
    else
        msgpack_pack_nil(out);
    return 0;
}

static const moonlet_rpc_method g_methods[] = {
    {M_ECHO, "Echo", h_echo, NULL, 0},
    {M_WHO, "Who", h_who, NULL, 0},
};

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/moonlet-tls-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    if (tls_certs_ca(g_dir, "ca", "moonlet test CA") ||
        tls_certs_issue(g_dir, "ca", "server", "server-1", "IP:127.0.0.1,DNS:localhost") ||
        tls_certs_issue(g_dir, "ca", "server2", "server-2", "IP:127.0.0.1,DNS:localhost") ||
        tls_certs_issue(g_dir, "ca", "client", "client-1", NULL) ||
        tls_certs_ca(g_dir, "rogue-ca", "another CA") ||
        tls_certs_issue(g_dir, "rogue-ca", "rogue", "rogue-client", NULL))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    static const char *const names[] = {"ca", "server", "server2", "client", "rogue-ca", "rogue",
                                        "live"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char p[160];
        snprintf(p, sizeof(p), "%s/%s.pem", g_dir, names[i]);
        unlink(p);
        snprintf(p, sizeof(p), "%s/%s.key", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
    return 0;
}

static moonlet_tls_ctx *ctx_of(bool server, const char *cert, const char *ca)
{
    char c[160] = "", k[160] = "";
    if (cert) {
        snprintf(c, sizeof(c), "%s/%s.pem", g_dir, cert);
        snprintf(k, sizeof(k), "%s/%s.key", g_dir, cert);
    }
    moonlet_tls_files f = {.cert = cert ? c : NULL, .key = cert ? k : NULL,
                           .ca = ca ? path_of(ca) : NULL};
    moonlet_tls_ctx *x = NULL;
    assert_int_equal(moonlet_tls_ctx_create(server, &f, &x), 0);
    return x;
}

static moonlet_rpc_server *start(moonlet_tls_ctx *tls, uint32_t auth_timeout_ms)
{
    moonlet_rpc_server_opts o = {.port = 0, .threads = 2, .name = "tls-test",
                                 .methods = g_methods, .nmethods = 2, .tls = tls,
                                 .auth_timeout_ms = auth_timeout_ms};
    moonlet_rpc_server *s = NULL;
    assert_int_equal(moonlet_rpc_server_create(&o, &s), 0);
    assert_int_equal(moonlet_rpc_server_start(s), 0);
    return s;
}

/* A TLS server (certificate `cert`, the authentication deadline given)
 * and a client context with client.pem, both trusting ca.pem. */
typedef struct tls_pair {
    moonlet_tls_ctx *sx, *cx;
    moonlet_rpc_server *s;
} tls_pair;

static tls_pair pair_start(const char *cert, uint32_t auth_timeout_ms)
{
    tls_pair p;
    p.sx = ctx_of(true, cert, "ca.pem");
    p.cx = ctx_of(false, "client", "ca.pem");
    p.s = start(p.sx, auth_timeout_ms);
    return p;
}

static void pair_stop(tls_pair *p)
{
    moonlet_rpc_server_destroy(p->s);
    moonlet_tls_ctx_unref(p->sx);
    moonlet_tls_ctx_unref(p->cx);
}

static int dial(moonlet_rpc_server *s, moonlet_tls_ctx *tls, const char *name,
                moonlet_rpc_client **c)
{
    moonlet_rpc_client_opts o = {.timeout_ms = CALL_TIMEOUT_MS, .tls = tls, .tls_name = name};
    return moonlet_rpc_client_connect("127.0.0.1", moonlet_rpc_server_port(s), &o, c);
}

/* Who: the name the server saw ("" none, "(nil)" without TLS). */
static void assert_who(moonlet_rpc_client *c, const char *want)
{
    moonlet_rpc_client_begin(c, M_WHO, 0);
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    assert_int_equal(rep.code, 0);
    if (rep.result->type == MSGPACK_OBJECT_NIL) {
        assert_string_equal("(nil)", want);
    } else {
        assert_int_equal(rep.result->type, MSGPACK_OBJECT_STR);
        assert_int_equal(rep.result->via.str.size, strlen(want));
        assert_memory_equal(rep.result->via.str.ptr, want, strlen(want));
    }
    moonlet_reply_destroy(&rep);
}

static void assert_echo(moonlet_rpc_client *c, int64_t v)
{
    msgpack_pack_int64(moonlet_rpc_client_begin(c, M_ECHO, 1), v);
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    assert_int_equal(rep.code, 0);
    assert_int_equal(rep.result->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(rep.result->via.array.size, 1);
    assert_int_equal(rep.result->via.array.ptr[0].via.i64, v);
    moonlet_reply_destroy(&rep);
}

/* A call over mutual TLS; each side learns the other's name. */
static void test_mutual_tls_call(void **state)
{
    (void)state;
    tls_pair p = pair_start("server", 0);
    moonlet_rpc_client *c = NULL;
    assert_int_equal(dial(p.s, p.cx, NULL, &c), 0);
    assert_string_equal(moonlet_rpc_client_tls_peer(c), "server-1");
    assert_who(c, "client-1");
    for (int i = 0; i < 100; i++)
        assert_echo(c, i * 7919);
    moonlet_rpc_client_close(c);
    /* by name too: the certificate carries DNS:localhost */
    moonlet_rpc_client_opts o = {.timeout_ms = CALL_TIMEOUT_MS, .tls = p.cx};
    assert_int_equal(moonlet_rpc_client_connect("localhost", moonlet_rpc_server_port(p.s), &o, &c),
                     0);
    assert_who(c, "client-1");
    moonlet_rpc_client_close(c);
    pair_stop(&p);
}

/* Mutual TLS: no client certificate, or one the CA did not sign, is
 * refused at connect with ILLEGAL_CLIENT; a good client goes on working. */
static void test_refuses_client_without_ca_signed_cert(void **state)
{
    (void)state;
    moonlet_tls_ctx *sx = ctx_of(true, "server", "ca.pem");
    moonlet_tls_ctx *good = ctx_of(false, "client", "ca.pem");
    moonlet_tls_ctx *none = ctx_of(false, NULL, "ca.pem");
    moonlet_tls_ctx *rogue = ctx_of(false, "rogue", "ca.pem");
    moonlet_rpc_server *s = start(sx, 0);
    moonlet_rpc_client *ok = NULL, *c = NULL;
    assert_int_equal(dial(s, good, NULL, &ok), 0);
    for (int i = 0; i < 5; i++) {
        uint64_t t0 = moonlet_mono_ms();
        assert_int_equal(dial(s, none, NULL, &c), MOONLET_ERR_ILLEGAL_CLIENT);
        assert_null(c);
        assert_int_equal(dial(s, rogue, NULL, &c), MOONLET_ERR_ILLEGAL_CLIENT);
        assert_null(c);
        assert_true(moonlet_mono_ms() - t0 < CALL_TIMEOUT_MS); /* refused, not timed out */
        assert_echo(ok, i);
    }
    /* a server without a CA asks for no certificate */
    moonlet_tls_ctx *open_sx = ctx_of(true, "server", NULL);
    moonlet_rpc_server *s2 = start(open_sx, 0);
    assert_int_equal(dial(s2, none, NULL, &c), 0);
    assert_who(c, "");
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s2);
    moonlet_rpc_client_close(ok);
    moonlet_rpc_server_destroy(s);
    moonlet_tls_ctx_unref(sx);
    moonlet_tls_ctx_unref(open_sx);
    moonlet_tls_ctx_unref(good);
    moonlet_tls_ctx_unref(none);
    moonlet_tls_ctx_unref(rogue);
}

/* A plaintext client of a TLS server gets ILLEGAL_CLIENT "this server
 * requires TLS" (a clear answer in its own protocol), and one with a token
 * gets it at connect. */
static void test_plaintext_client_refused(void **state)
{
    (void)state;
    moonlet_tls_ctx *sx = ctx_of(true, "server", "ca.pem");
    moonlet_rpc_server *s = start(sx, 0);
    moonlet_rpc_client *c = NULL;
    assert_int_equal(dial(s, NULL, NULL, &c), 0); /* no token: nothing sent yet */
    moonlet_rpc_client_begin(c, M_ECHO, 0);
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    assert_int_equal(rep.code, MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(rep.result->type, MSGPACK_OBJECT_STR);
    assert_non_null(memmem(rep.result->via.str.ptr, rep.result->via.str.size, "requires TLS", 12));
    moonlet_reply_destroy(&rep);
    moonlet_rpc_client_close(c);
    moonlet_rpc_client_opts o = {.timeout_ms = CALL_TIMEOUT_MS, .auth_token = "some-token"};
    assert_int_equal(moonlet_rpc_client_connect("127.0.0.1", moonlet_rpc_server_port(s), &o, &c),
                     MOONLET_ERR_ILLEGAL_CLIENT);
    /* the server goes on serving TLS */
    moonlet_tls_ctx *cx = ctx_of(false, "client", "ca.pem");
    assert_int_equal(dial(s, cx, NULL, &c), 0);
    assert_echo(c, 42);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
    moonlet_tls_ctx_unref(sx);
    moonlet_tls_ctx_unref(cx);
}

/* A TLS client of a plaintext server fails at connect, at once. */
static void test_tls_client_of_plaintext_server(void **state)
{
    (void)state;
    moonlet_rpc_server *s = start(NULL, 0);
    moonlet_tls_ctx *cx = ctx_of(false, "client", "ca.pem");
    moonlet_rpc_client *c = NULL;
    uint64_t t0 = moonlet_mono_ms();
    assert_int_equal(dial(s, cx, NULL, &c), MOONLET_ERR_RPC_FAIL);
    assert_null(c);
    assert_true(moonlet_mono_ms() - t0 < CALL_TIMEOUT_MS / 2);
    assert_int_equal(dial(s, NULL, NULL, &c), 0); /* plaintext still served */
    assert_who(c, "(nil)");
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
    moonlet_tls_ctx_unref(cx);
}

/* The server's certificate must name the address (or tls_name) dialled. */
static void test_server_name_checked(void **state)
{
    (void)state;
    tls_pair p = pair_start("server", 0);
    moonlet_tls_ctx *other_ca = ctx_of(false, "client", "rogue-ca.pem");
    moonlet_rpc_client *c = NULL;
    assert_int_equal(dial(p.s, p.cx, "master.example", &c), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(dial(p.s, p.cx, "10.9.9.9", &c), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(dial(p.s, other_ca, NULL, &c), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(dial(p.s, p.cx, "localhost", &c), 0);
    moonlet_rpc_client_close(c);
    pair_stop(&p);
    moonlet_tls_ctx_unref(other_ca);
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(path_of(from), "r"), *out = fopen(path_of(to), "w");
    assert_non_null(in);
    assert_non_null(out);
    char buf[8192];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

/* Reload: new connections see the new certificate, an open one keeps
 * working; a reload of a broken file fails and keeps what was loaded. */
static void test_reload(void **state)
{
    (void)state;
    copy_file("server.pem", "live.pem");
    copy_file("server.key", "live.key");
    tls_pair p = pair_start("live", 0);
    moonlet_rpc_client *before = NULL, *after = NULL, *later = NULL;
    assert_int_equal(dial(p.s, p.cx, NULL, &before), 0);
    assert_string_equal(moonlet_rpc_client_tls_peer(before), "server-1");
    copy_file("server2.pem", "live.pem");
    copy_file("server2.key", "live.key");
    assert_int_equal(moonlet_tls_ctx_generation(p.sx), 0);
    assert_int_equal(moonlet_tls_ctx_reload(p.sx), 0);
    assert_int_equal(moonlet_tls_ctx_generation(p.sx), 1);
    assert_int_equal(dial(p.s, p.cx, NULL, &after), 0);
    assert_string_equal(moonlet_rpc_client_tls_peer(after), "server-2");
    assert_echo(before, 1); /* the open connection is untouched */
    assert_echo(after, 2);
    FILE *f = fopen(path_of("live.key"), "w");
    assert_non_null(f);
    fputs("not a key\n", f);
    fclose(f);
    assert_int_not_equal(moonlet_tls_ctx_reload(p.sx), 0);
    assert_int_equal(moonlet_tls_ctx_generation(p.sx), 1);
    assert_int_equal(dial(p.s, p.cx, NULL, &later), 0);
    assert_string_equal(moonlet_rpc_client_tls_peer(later), "server-2");
    moonlet_rpc_client_close(before);
    moonlet_rpc_client_close(after);
    moonlet_rpc_client_close(later);
    pair_stop(&p);
}

/* Waits until the peer closes fd (EOF or reset), reading what comes; the
 * time it took, or -1 after limit_ms. */
static int64_t wait_closed(int fd, int64_t limit_ms)
{
    int64_t t0 = (int64_t)moonlet_mono_ms();
    for (;;) {
        int64_t left = t0 + limit_ms - (int64_t)moonlet_mono_ms();
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return (int64_t)moonlet_mono_ms() - t0;
    }
}

static int raw_connect(moonlet_rpc_server *s)
{
    int fd = moonlet_net_connect_tcp("127.0.0.1", moonlet_rpc_server_port(s),
                                     moonlet_mono_ms() + CALL_TIMEOUT_MS, 0);
    assert_true(fd >= 0);
    return fd;
}

/* A handshake that stalls (silence, half a hello) is cut at the
 * authentication deadline; garbage after a hello byte at once; the
 * server's connections drain to none and it goes on serving. */
static void test_handshake_deadline_and_garbage(void **state)
{
    (void)state;
    tls_pair p = pair_start("server", 300);
    int silent = raw_connect(p.s), half = raw_connect(p.s), junk = raw_connect(p.s);
    assert_int_equal(send(half, "\x16\x03\x01", 3, MSG_NOSIGNAL), 3);
    char garbage[600];
    garbage[0] = 0x16;
    for (size_t i = 1; i < sizeof(garbage); i++)
        garbage[i] = (char)(i * 131);
    assert_int_equal(send(junk, garbage, sizeof(garbage), MSG_NOSIGNAL), (ssize_t)sizeof(garbage));
    int64_t tj = wait_closed(junk, 3000);
    assert_true(tj >= 0 && tj < 250); /* refused at once */
    int64_t ts = wait_closed(silent, 3000), th = wait_closed(half, 3000);
    assert_true(ts >= 0);
    assert_true(th >= 0);
    close(silent);
    close(half);
    close(junk);
    for (int i = 0; i < 300 && moonlet_rpc_server_connections(p.s) != 0; i++)
        poll(NULL, 0, 10);
    assert_int_equal(moonlet_rpc_server_connections(p.s), 0);
    moonlet_rpc_client *c = NULL;
    assert_int_equal(dial(p.s, p.cx, NULL, &c), 0);
    assert_echo(c, 7);
    moonlet_rpc_client_close(c);
    pair_stop(&p);
}

/* Large frames pipelined both ways: TLS records split across reads and
 * writes, replies the server decrypted ahead of epoll. */
static void test_large_pipelined(void **state)
{
    (void)state;
    enum { N = 16, SIZE = 64 * 1024 + 333 }; /* about 1 MiB in flight each way */
    tls_pair p = pair_start("server", 0);
    moonlet_rpc_client *c = NULL;
    assert_int_equal(dial(p.s, p.cx, NULL, &c), 0);
    char *payload = malloc(SIZE);
    assert_non_null(payload);
    for (int round = 0; round < 2; round++) {
        uint64_t ids[N];
        for (int i = 0; i < N; i++) {
            memset(payload, 'a' + i, SIZE);
            msgpack_packer *pk = moonlet_rpc_client_begin(c, M_ECHO, 1);
            msgpack_pack_bin(pk, SIZE - i);
            msgpack_pack_bin_body(pk, payload, SIZE - i);
            assert_int_equal(moonlet_rpc_client_send(c, &ids[i]), 0);
        }
        for (int i = 0; i < N; i++) {
            moonlet_reply rep;
            assert_int_equal(moonlet_rpc_client_recv(c, &rep), 0);
            assert_int_equal(rep.id, ids[i]);
            assert_int_equal(rep.code, 0);
            const msgpack_object *b = &rep.result->via.array.ptr[0];
            assert_int_equal(b->type, MSGPACK_OBJECT_BIN);
            assert_int_equal(b->via.bin.size, SIZE - i);
            assert_int_equal(b->via.bin.ptr[0], 'a' + i);
            assert_int_equal(b->via.bin.ptr[SIZE - i - 1], 'a' + i);
            moonlet_reply_destroy(&rep);
        }
        for (int i = 0; i < 200; i++) /* many small ones, back to back */
            assert_echo(c, i);
    }
    free(payload);
    moonlet_rpc_client_close(c);
    pair_stop(&p);
}

/* Contexts refuse what a side cannot work with. */
static void test_ctx_needs_files(void **state)
{
    (void)state;
    moonlet_tls_ctx *x = NULL;
    moonlet_tls_files no_ca = {.cert = path_of("client.pem"), .key = path_of("client.key")};
    assert_int_equal(moonlet_tls_ctx_create(false, &no_ca, &x), MOONLET_ERR_INVALID_PARAMS);
    moonlet_tls_files no_cert = {.ca = path_of("ca.pem")};
    assert_int_equal(moonlet_tls_ctx_create(true, &no_cert, &x), MOONLET_ERR_INVALID_PARAMS);
    moonlet_tls_files mismatch = {.cert = path_of("server.pem"), .key = path_of("client.key")};
    assert_int_equal(moonlet_tls_ctx_create(true, &mismatch, &x), MOONLET_ERR_INVALID_PARAMS);
    moonlet_tls_files missing = {.cert = path_of("nope.pem"), .key = path_of("nope.key")};
    assert_int_equal(moonlet_tls_ctx_create(true, &missing, &x), MOONLET_ERR_INVALID_PARAMS);
    assert_null(x);
    /* a client context is no server's */
    moonlet_tls_ctx *cx = ctx_of(false, "client", "ca.pem");
    moonlet_rpc_server_opts o = {.port = 0, .threads = 1, .methods = g_methods, .nmethods = 2,
                                 .tls = cx};
    moonlet_rpc_server *s = NULL;
    assert_int_equal(moonlet_rpc_server_create(&o, &s), MOONLET_ERR_INVALID_PARAMS);
    moonlet_tls_ctx_unref(cx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutual_tls_call),
        cmocka_unit_test(test_refuses_client_without_ca_signed_cert),
        cmocka_unit_test(test_plaintext_client_refused),
        cmocka_unit_test(test_tls_client_of_plaintext_server),
        cmocka_unit_test(test_server_name_checked),
        cmocka_unit_test(test_reload),
        cmocka_unit_test(test_handshake_deadline_and_garbage),
        cmocka_unit_test(test_large_pipelined),
        cmocka_unit_test(test_ctx_needs_files),
    };
    return cmocka_run_group_tests_name("tls", tests, setup, teardown);
}
