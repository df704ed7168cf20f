/*
 * Bounded fall-over (transport/xfer.c pool, xfer_tcp_client.c): a transfer
 * to a node that accepts connections but never answers (a stalled process:
 * the kernel still completes handshakes) fails within one transfer timeout
 * of its submit, even when it first queued for a pooled connection that
 * another transfer held on that node.  Before, the queued transfer got the
 * connection back just before its own deadline and then waited a full
 * timeout more on it (or on opening and authenticating a fresh one): up to
 * two timeouts before a get could try the next replica.
 *
 * The stalled node is a listener of this test that accepts, reads and never
 * replies.  Ordering is observed, not slept for: the second transfer starts
 * once the first one's request (or AUTH) has reached the node.  Every wait
 * and loop is bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../common/fake_listener.h"
#include "log.h"
#include "moonlet/error.h"
#include "monotime.h"
#include "xfer.h"
#include "xfer_tcp.h"
#include "../common/test_main.h"
#include "../common/threads.h"

#define TIMEOUT_MS 600u
#define MAX_CONNS 16

/* A node that accepts and reads but never answers. */
typedef struct stalled {
    fake_listener l;
    int fds[MAX_CONNS];
    uint64_t got[MAX_CONNS];
    int nfds;
    int requests_seen; /* connections that sent at least a header (atomic) */
} stalled;

static void *stalled_main(void *arg)
{
    stalled *s = arg;
    static uint8_t sink[65536];
    uint64_t end = moonlet_mono_ms() + 30000;
    while (moonlet_mono_ms() < end) {
        struct pollfd p[MAX_CONNS + 2] = {{.fd = s->l.stop_pipe[0], .events = POLLIN},
                                          {.fd = s->l.listen_fd, .events = POLLIN}};
        for (int i = 0; i < s->nfds; i++)
            p[2 + i] = (struct pollfd){.fd = s->fds[i], .events = POLLIN};
        if (poll(p, (nfds_t)(2 + s->nfds), 100) <= 0)
            continue;
        if (p[0].revents)
            break;
        if (p[1].revents && s->nfds < MAX_CONNS) {
            int fd = accept(s->l.listen_fd, NULL, NULL);
            if (fd >= 0) {
                s->got[s->nfds] = 0;
                s->fds[s->nfds++] = fd;
            }
        }
        for (int i = 0; i < s->nfds; i++) {
            if (!p[2 + i].revents || s->fds[i] < 0)
                continue;
            ssize_t n = recv(s->fds[i], sink, sizeof(sink), 0);
            if (n <= 0) {
                close(s->fds[i]);
                s->fds[i] = -1;
                continue;
            }
            bool first = s->got[i] < MOONLET_XFER_TCP_HDR_BYTES;
            s->got[i] += (uint64_t)n;
            if (first && s->got[i] >= MOONLET_XFER_TCP_HDR_BYTES)
                __atomic_add_fetch(&s->requests_seen, 1, __ATOMIC_SEQ_CST);
        }
    }
    for (int i = 0; i < s->nfds; i++)
        if (s->fds[i] >= 0)
            close(s->fds[i]);
    return NULL;
}

static void stalled_start(stalled *s)
{
    memset(s, 0, sizeof(*s));
    fake_listener_start(&s->l, stalled_main, s);
}

static void stalled_stop(stalled *s)
{
    fake_listener_stop(&s->l);
}

typedef struct reader {
    moonlet_xfer *x;
    const char *ep;
    int rc;
    uint64_t took_ms;
} reader;

static void *read_main(void *arg)
{
    reader *r = arg;
    uint8_t b[4096];
    uint64_t t0 = moonlet_mono_ms();
    r->rc = moonlet_xfer_read(r->x, r->ep, "00000000000000aa", 0, b, sizeof(b));
    r->took_ms = moonlet_mono_ms() - t0;
    return NULL;
}

/* Reader A holds the only pooled connection to the stalled node; reader B
 * starts once A's request (or AUTH) reached the node, queues for that
 * connection, and must still give up within one timeout of its own start.
 * *state: the token (NULL: none).  With a token the queued reader's fresh
 * connection authenticates first: the AUTH the node never answers is bounded
 * by the same deadline. */
static void test_queued_reader_bounded(void **state)
{
    const char *token = *state;
    stalled s;
    stalled_start(&s);
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_TCP, .conns_per_peer = 1,
                           .timeout_ms = TIMEOUT_MS, .auth_token = token};
    moonlet_xfer *x;
    assert_int_equal(moonlet_xfer_create(&o, &x), 0);
    char ep[32];
    snprintf(ep, sizeof(ep), "127.0.0.1:%u", s.l.port);
    reader a = {.x = x, .ep = ep}, b = {.x = x, .ep = ep};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, read_main, &a), 0);
    uint64_t end = moonlet_mono_ms() + 5000;
    while (__atomic_load_n(&s.requests_seen, __ATOMIC_SEQ_CST) < 1 && moonlet_mono_ms() < end)
        usleep(1000); /* bounded: A's first bytes reached the node */
    assert_int_equal(__atomic_load_n(&s.requests_seen, __ATOMIC_SEQ_CST), 1);
    /* B arrives while A is a sixth into its wait: not a wait for an event,
     * the scenario itself (A then frees the connection well before B's
     * deadline) */
    usleep(TIMEOUT_MS / 6 * 1000);
    read_main(&b);
    pthread_join(th, NULL);
    assert_int_equal(a.rc, MOONLET_ERR_TRANSFER_FAIL);
    assert_int_equal(b.rc, MOONLET_ERR_TRANSFER_FAIL);
    assert_true(a.took_ms >= TIMEOUT_MS - 50);
    assert_true(a.took_ms < TIMEOUT_MS + 300);
    /* B: one timeout from its submit, not A's remainder plus a timeout of its own */
    if (b.took_ms >= TIMEOUT_MS + 300)
        fail_msg("queued reader gave up after %llu ms (timeout %u ms)",
                 (unsigned long long)b.took_ms, TIMEOUT_MS);
    moonlet_xfer_destroy(x);
    stalled_stop(&s);
}

/* Several readers at once, more than the pooled connections: every one gives
 * up within one timeout (plus scheduling slack) of its start. */
static void test_many_readers_bounded(void **state)
{
    (void)state;
    stalled s;
    stalled_start(&s);
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_TCP, .conns_per_peer = 2,
                           .timeout_ms = TIMEOUT_MS};
    moonlet_xfer *x;
    assert_int_equal(moonlet_xfer_create(&o, &x), 0);
    char ep[32];
    snprintf(ep, sizeof(ep), "127.0.0.1:%u", s.l.port);
    reader r[6];
    for (int i = 0; i < 6; i++)
        r[i] = (reader){.x = x, .ep = ep};
    test_threads_run(read_main, r, sizeof(r[0]), 6);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(r[i].rc, MOONLET_ERR_TRANSFER_FAIL);
        if (r[i].took_ms >= TIMEOUT_MS + 300)
            fail_msg("reader %d gave up after %llu ms (timeout %u ms)", i,
                     (unsigned long long)r[i].took_ms, TIMEOUT_MS);
    }
    moonlet_xfer_destroy(x);
    stalled_stop(&s);
}

int main(void)
{
    moonlet_log_set_level(MOONLET_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        MOONLET_TEST_CASE(test_queued_read_on_pooled_connection, test_queued_reader_bounded, NULL),
        MOONLET_TEST_CASE(test_queued_read_opening_connection, test_queued_reader_bounded,
                          "fallover-token"),
        cmocka_unit_test(test_many_readers_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
