/*
 * Unit test of transport/net.c: "host:port" parsing, listening on an
 * ephemeral loopback port, connecting with a deadline (to a listener that
 * accepts, to a closed port, to one whose accept queue is full and so never
 * answers), IPv6 loopback when the host has it.  Also common/token.c's
 * constant-time comparison, which every AUTH path uses.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moonlet/error.h"
#include "monotime.h"
#include "net.h"
#include "token.h"
#include "../common/test_main.h"

static void test_split_accepts(void **state)
{
    (void)state;
    static const struct {
        const char *in, *host;
        uint16_t port;
    } ok[] = {
        {"127.0.0.1:5000", "127.0.0.1", 5000}, {"localhost:0", "localhost", 0},
        {"[::1]:65535", "::1", 65535},         {"[fe80::1%lo]:7", "fe80::1%lo", 7},
        {"a:00080", "a", 80},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char host[64];
        uint16_t port = 1;
        assert_int_equal(moonlet_net_split_hostport(ok[i].in, host, sizeof(host), &port),
                         MOONLET_OK);
        assert_string_equal(host, ok[i].host);
        assert_int_equal(port, ok[i].port);
    }
}

static void test_split_refuses(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",        "host",       ":5000",  "host:",      "host:x",    "host:65536",
        "h:-1",    "h:+1",       "h: 1",   "h:1 ",       "h:123456",  "::1:5000",
        "[::1]",   "[::1]5000",  "[]:5",   "[::1:5000",  "a:b:5",     "h:99999",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char host[64] = "untouched";
        uint16_t port = 7;
        assert_int_equal(moonlet_net_split_hostport(bad[i], host, sizeof(host), &port),
                         MOONLET_ERR_INVALID_PARAMS);
        assert_int_equal(port, 7);
    }
    char small[4];
    uint16_t port;
    assert_int_equal(moonlet_net_split_hostport("abcd:1", small, sizeof(small), &port),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_net_split_hostport("abc:1", small, sizeof(small), &port), MOONLET_OK);
    assert_int_equal(moonlet_net_split_hostport(NULL, small, sizeof(small), &port),
                     MOONLET_ERR_INVALID_PARAMS);
}

static void test_listen_connect_loopback(void **state)
{
    (void)state;
    uint16_t port = 0;
    int l = moonlet_net_listen_tcp("127.0.0.1", 0, 16, &port);
    assert_true(l >= 0);
    assert_true(port != 0);
    assert_int_equal(moonlet_net_local_port(l), port);
    int c = moonlet_net_connect_tcp("127.0.0.1", port, moonlet_mono_ms() + 5000, 1 << 20);
    assert_true(c >= 0);
    assert_int_equal(moonlet_net_wait(l, POLLIN, moonlet_mono_ms() + 5000), 0);
    int a = accept(l, NULL, NULL);
    assert_true(a >= 0);
    assert_int_equal(send(c, "x", 1, MSG_NOSIGNAL), 1);
    assert_int_equal(moonlet_net_wait(a, POLLIN, moonlet_mono_ms() + 5000), 0);
    char b = 0;
    assert_int_equal(recv(a, &b, 1, 0), 1);
    assert_int_equal(b, 'x');
    close(a);
    close(c);
    close(l);
}

static void test_bad_addresses(void **state)
{
    (void)state;
    uint64_t deadline = moonlet_mono_ms() + 5000;
    assert_int_equal(moonlet_net_connect_tcp("", 80, deadline, 0), MOONLET_NET_EADDR);
    assert_int_equal(moonlet_net_connect_tcp(NULL, 80, deadline, 0), MOONLET_NET_EADDR);
    /* a numeric address this host does not have: bind fails */
    assert_int_equal(moonlet_net_listen_tcp("192.0.2.1", 0, 16, NULL), MOONLET_NET_ESYS);
    assert_int_equal(errno, EADDRNOTAVAIL);
    /* a numeric address resolves without a resolver */
    struct sockaddr_storage ss;
    socklen_t sl;
    assert_int_equal(moonlet_net_resolve("127.0.0.1", 9, false, &ss, &sl), 0);
    assert_int_equal(ss.ss_family, AF_INET);
}

static void test_connect_refused(void **state)
{
    (void)state;
    uint16_t port = 0;
    int l = moonlet_net_listen_tcp("127.0.0.1", 0, 16, &port);
    assert_true(l >= 0);
    close(l); /* nothing listens on port now (ephemeral ports are not reused at once) */
    int c = moonlet_net_connect_tcp("127.0.0.1", port, moonlet_mono_ms() + 5000, 0);
    assert_int_equal(c, MOONLET_NET_ESYS);
    assert_int_equal(errno, ECONNREFUSED);
}

/* A listener that never accepts and has a full accept queue drops further
 * SYNs, so a connect to it gets no answer: the deadline must end it. */
static void test_connect_deadline_no_answer(void **state)
{
    (void)state;
    uint16_t port = 0;
    int l = moonlet_net_listen_tcp("127.0.0.1", 0, 0, &port);
    assert_true(l >= 0);
    int fds[16];
    int n = 0, rc = 0;
    uint64_t t0 = 0, t1 = 0;
    for (; n < 16; n++) { /* fill the queue; bounded: backlog 0 holds one or two */
        t0 = moonlet_mono_ms();
        rc = moonlet_net_connect_tcp("127.0.0.1", port, t0 + 300, 0);
        t1 = moonlet_mono_ms();
        if (rc < 0)
            break;
        fds[n] = rc;
    }
    assert_int_equal(rc, MOONLET_NET_ETIMEDOUT);
    assert_true(n < 16);
    assert_true(t1 - t0 >= 300); /* it waited the deadline out; no upper bound under load */
    for (int i = 0; i < n; i++)
        close(fds[i]);
    close(l);
    /* a deadline already past: no wait at all */
    assert_int_equal(moonlet_net_wait(0, POLLIN, moonlet_mono_ms() - 1), MOONLET_NET_ETIMEDOUT);
}

static void test_ipv6_loopback(void **state)
{
    (void)state;
    uint16_t port = 0;
    int l = moonlet_net_listen_tcp("::1", 0, 16, &port);
    if (l < 0)
        skip(); /* no IPv6 on this host */
    char host[64];
    uint16_t p2;
    char ep[64];
    snprintf(ep, sizeof(ep), "[::1]:%u", (unsigned)port);
    assert_int_equal(moonlet_net_split_hostport(ep, host, sizeof(host), &p2), MOONLET_OK);
    assert_int_equal(p2, port);
    int c = moonlet_net_connect_tcp(host, p2, moonlet_mono_ms() + 5000, 0);
    assert_true(c >= 0);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    assert_int_equal(getpeername(c, (struct sockaddr *)&ss, &sl), 0);
    assert_int_equal(ss.ss_family, AF_INET6);
    close(c);
    close(l);
}

static void test_token_equal(void **state)
{
    (void)state;
    assert_true(moonlet_token_equal("secret", 6, "secret", 6));
    assert_false(moonlet_token_equal("secreT", 6, "secret", 6));
    assert_false(moonlet_token_equal("secre", 5, "secret", 6));   /* prefix */
    assert_false(moonlet_token_equal("secrets", 7, "secret", 6)); /* longer */
    assert_false(moonlet_token_equal("", 0, "secret", 6));
    assert_true(moonlet_token_equal("", 0, "", 0));
    const unsigned char a[4] = {0, 1, 0, 2}, b[4] = {0, 1, 0, 3};
    assert_true(moonlet_token_equal(a, 4, a, 4)); /* binary, with NULs */
    assert_false(moonlet_token_equal(a, 4, b, 4));
}

/* moonlet_net_io_by moves exactly n bytes across a socket whose buffer
 * takes less at a time (a 1 MiB message through a socketpair), and gives up
 * with -1 at the deadline (nobody reads, or nothing comes) and at EOF. */
static void test_io_by(void **state)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    enum { N = 1 << 20 };
    static char out[N], in[N];
    for (size_t i = 0; i < N; i++)
        out[i] = (char)(i * 7);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the reader, while the parent is still sending */
        int ok = moonlet_net_io_by(sv[1], false, in, N, moonlet_mono_ms() + 10000) == 0 &&
                 memcmp(in, out, N) == 0;
        _exit(ok ? 0 : 1);
    }
    assert_int_equal(moonlet_net_io_by(sv[0], true, out, N, moonlet_mono_ms() + 10000), 0);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* nothing to read: the deadline ends the wait */
    uint64_t t0 = moonlet_mono_ms();
    assert_int_equal(moonlet_net_io_by(sv[1], false, in, 1, t0 + 50), -1);
    assert_true(moonlet_mono_ms() - t0 >= 50);
    /* nobody reads: the send fills the buffer, then the deadline ends it */
    assert_int_equal(moonlet_net_io_by(sv[0], true, out, N, moonlet_mono_ms() + 50), -1);
    /* the peer is gone: what the send above left is read, then EOF ends the
     * read of N bytes at once, long before its deadline */
    close(sv[0]);
    t0 = moonlet_mono_ms();
    assert_int_equal(moonlet_net_io_by(sv[1], false, in, N, t0 + 5000), -1);
    assert_true(moonlet_mono_ms() - t0 < 4000);
    close(sv[1]);
}

MOONLET_TEST_MAIN("net", NULL, NULL,
                  cmocka_unit_test(test_split_accepts),
                  cmocka_unit_test(test_io_by),
                  cmocka_unit_test(test_split_refuses),
                  cmocka_unit_test(test_listen_connect_loopback),
                  cmocka_unit_test(test_bad_addresses),
                  cmocka_unit_test(test_connect_refused),
                  cmocka_unit_test(test_connect_deadline_no_answer),
                  cmocka_unit_test(test_ipv6_loopback),
                  cmocka_unit_test(test_token_equal))
