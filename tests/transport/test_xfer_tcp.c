/*
 * test_xfer_tcp.c - the TCP backend's wire protocol (transport/xfer_tcp.h)
 * seen from raw sockets, and the client against misbehaving fake servers.
 *
 * Server side: the header codec; every request checked against bounds and
 * segment id on the server itself (not only by the client library); refused
 * writes drained so the connection stays in step; malformed headers close
 * only their own connection; authentication before any request; the
 * data-plane bounds of issue 31 finding 6 (a header buys payload time only
 * for a range the server serves, a pre-authentication deadline, the
 * per-peer cap by IPv4 address or IPv6 /64).
 * Client side: a peer that closes after reading the request, one that
 * stalls, and one that answers nonsense are reported as TRANSFER_FAIL within
 * a bounded time.  Loopback only; every wait and loop is bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../common/fake_listener.h"
#include "cred.h"
#include "log.h"
#include "../common/tsan_loopback.h"
#include "moonlet/error.h"
#include "writecap.h"
#include "xfer.h"
#include "xfer_internal.h"
#include "xfer_tcp.h"
#include "xfer_tcp_internal.h"
#include "monotime.h"

#define SEG (1u << 20)
#define GUARD 4096u
#define HDR MOONLET_XFER_TCP_HDR_BYTES

/* ---- codec -------------------------------------------------------------- */

static void test_codec(void **state)
{
    (void)state;
    moonlet_xfer_tcp_hdr h = {.op = MOONLET_XFER_TCP_WRITE, .status = -600, .req_id = 77,
                              .segment = 0x0123456789abcdefull, .offset = UINT64_MAX - 1,
                              .length = 4096},
                         d;
    uint8_t b[HDR];
    moonlet_xfer_tcp_hdr_encode(&h, b);
    assert_int_equal(b[0], 'M');
    assert_int_equal(b[3], 'F');
    assert_int_equal(moonlet_xfer_tcp_hdr_decode(b, &d), 0);
    assert_int_equal(d.op, h.op);
    assert_int_equal(d.status, -600);
    assert_int_equal(d.req_id, 77);
    assert_int_equal(d.segment, h.segment);
    assert_int_equal(d.offset, h.offset);
    assert_int_equal(d.length, 4096);

    static const int bad_bytes[] = {0, 4, 6, 7, 12, 15}; /* magic, version, reserved */
    for (size_t i = 0; i < sizeof(bad_bytes) / sizeof(bad_bytes[0]); i++) {
        uint8_t c[HDR];
        memcpy(c, b, HDR);
        c[bad_bytes[i]] ^= 0x40;
        assert_int_equal(moonlet_xfer_tcp_hdr_decode(c, &d), MOONLET_ERR_INVALID_PARAMS);
    }
    static const uint8_t bad_ops[] = {0, 5, 0x80, 0x85, 0xff};
    for (size_t i = 0; i < sizeof(bad_ops); i++) {
        h.op = bad_ops[i];
        moonlet_xfer_tcp_hdr_encode(&h, b);
        assert_int_equal(moonlet_xfer_tcp_hdr_decode(b, &d), MOONLET_ERR_INVALID_PARAMS);
    }
    h.op = MOONLET_XFER_TCP_READ;
    h.length = MOONLET_XFER_MAX_OP_BYTES + 1;
    moonlet_xfer_tcp_hdr_encode(&h, b);
    assert_int_equal(moonlet_xfer_tcp_hdr_decode(b, &d), MOONLET_ERR_INVALID_PARAMS);
    h.op = MOONLET_XFER_TCP_AUTH;
    h.length = MOONLET_XFER_MAX_TOKEN_BYTES + 1;
    moonlet_xfer_tcp_hdr_encode(&h, b);
    assert_int_equal(moonlet_xfer_tcp_hdr_decode(b, &d), MOONLET_ERR_INVALID_PARAMS);
    h.op = MOONLET_XFER_TCP_READ | MOONLET_XFER_TCP_REPLY;
    h.length = 1;
    moonlet_xfer_tcp_hdr_encode(&h, b);
    assert_int_equal(moonlet_xfer_tcp_hdr_decode(b, &d), 0);
    assert_int_equal(d.op, 0x82);
    /* CHALLENGE decodes; F_MAC belongs to AUTH requests only, F_CAP to WRITE */
    h = (moonlet_xfer_tcp_hdr){.op = MOONLET_XFER_TCP_CHALLENGE, .req_id = 3};
    moonlet_xfer_tcp_hdr_encode(&h, b);
    assert_int_equal(moonlet_xfer_tcp_hdr_decode(b, &d), 0);
    assert_int_equal(d.op, MOONLET_XFER_TCP_CHALLENGE);
    h = (moonlet_xfer_tcp_hdr){.op = MOONLET_XFER_TCP_AUTH, .flags = MOONLET_XFER_TCP_F_MAC,
                               .length = MOONLET_XFER_TCP_MAC_AUTH_BYTES};
    moonlet_xfer_tcp_hdr_encode(&h, b);
    assert_int_equal(moonlet_xfer_tcp_hdr_decode(b, &d), 0);
    assert_int_equal(d.flags, MOONLET_XFER_TCP_F_MAC);
    static const uint8_t bad_flagged[] = {MOONLET_XFER_TCP_READ, MOONLET_XFER_TCP_WRITE,
                                          MOONLET_XFER_TCP_CHALLENGE,
                                          MOONLET_XFER_TCP_AUTH | MOONLET_XFER_TCP_REPLY};
    for (size_t i = 0; i < sizeof(bad_flagged); i++) {
        h.op = bad_flagged[i];
        moonlet_xfer_tcp_hdr_encode(&h, b);
        assert_int_equal(moonlet_xfer_tcp_hdr_decode(b, &d), MOONLET_ERR_INVALID_PARAMS);
    }
}

/* ---- a real server seen through raw sockets ----------------------------- */

typedef struct server_fx {
    moonlet_xfer *x;
    uint8_t *map;
    uint8_t *seg;
    moonlet_xfer_segment_info info;
    uint64_t seg_id;
    uint16_t port;
} server_fx;

/* A server with the given token and timeout_ms (and no idle timeout). */
static void server_up_timeout(server_fx *s, const char *token, uint32_t timeout_ms)
{
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_TCP, .listen_addr = "127.0.0.1:0",
                           .auth_token = token, .server_threads = 2, .timeout_ms = timeout_ms};
    assert_int_equal(moonlet_xfer_create(&o, &s->x), 0);
    s->map = mmap(NULL, SEG + 2 * GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                  -1, 0);
    assert_true(s->map != MAP_FAILED);
    memset(s->map, 0xA5, SEG + 2 * GUARD);
    s->seg = s->map + GUARD;
    for (uint32_t i = 0; i < SEG; i++)
        s->seg[i] = (uint8_t)(i * 7);
    assert_int_equal(moonlet_xfer_register_segment(s->x, s->seg, SEG, &s->info), 0);
    s->seg_id = strtoull(s->info.segment_id, NULL, 16);
    s->port = (uint16_t)atoi(strrchr(s->info.endpoint, ':') + 1);
}

static void server_up(server_fx *s, const char *token)
{
    server_up_timeout(s, token, 2000);
}

static void server_down(server_fx *s)
{
    for (uint32_t i = 0; i < GUARD; i++) {
        assert_int_equal(s->map[i], 0xA5);
        assert_int_equal(s->map[GUARD + SEG + i], 0xA5);
    }
    moonlet_xfer_destroy(s->x);
    munmap(s->map, SEG + 2 * GUARD);
}

/* A server without a token as a test's fixture (its state); the teardown
 * checks the guard bytes and stops it even when the test failed. */
static int server_setup(void **state)
{
    server_fx *s = calloc(1, sizeof(*s));
    if (!s)
        return -1;
    server_up(s, NULL);
    *state = s;
    return 0;
}

static int server_teardown(void **state)
{
    server_down(*state);
    free(*state);
    return 0;
}

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
    assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void raw_request(int fd, uint8_t op, uint64_t req, uint64_t seg, uint64_t off, uint64_t len)
{
    moonlet_xfer_tcp_hdr h = {.op = op, .req_id = req, .segment = seg, .offset = off,
                              .length = len};
    uint8_t b[HDR];
    moonlet_xfer_tcp_hdr_encode(&h, b);
    raw_send(fd, b, HDR);
}

static void raw_recv(int fd, void *p, size_t n)
{
    assert_int_equal(recv(fd, p, n, MSG_WAITALL), (ssize_t)n);
}

static moonlet_xfer_tcp_hdr raw_reply(int fd)
{
    uint8_t b[HDR];
    moonlet_xfer_tcp_hdr h;
    raw_recv(fd, b, HDR);
    assert_int_equal(moonlet_xfer_tcp_hdr_decode(b, &h), 0);
    return h;
}

/* fd (authenticated) reads request `id`: the segment's byte at off, as
 * server_up_timeout wrote it (off * 7). */
static void assert_reads_byte(int fd, const server_fx *s, uint32_t id, uint64_t off)
{
    raw_request(fd, MOONLET_XFER_TCP_READ, id, s->seg_id, off, 1);
    assert_int_equal(raw_reply(fd).status, 0);
    uint8_t byte;
    raw_recv(fd, &byte, 1);
    assert_int_equal(byte, (uint8_t)(off * 7));
}

/* CHALLENGE, then AUTH with the proof of `token` for the nonce it got
 * (xfer_tcp.h): the AUTH reply's status. */
static int raw_challenge_auth(int fd, const char *token)
{
    raw_request(fd, MOONLET_XFER_TCP_CHALLENGE, 1, 0, 0, 0);
    moonlet_xfer_tcp_hdr r = raw_reply(fd);
    assert_int_equal(r.op, MOONLET_XFER_TCP_CHALLENGE | MOONLET_XFER_TCP_REPLY);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.length, MOONLET_XFER_TCP_NONCE_BYTES);
    uint8_t nonce[MOONLET_XFER_TCP_NONCE_BYTES], key[MOONLET_CRED_HASH_BYTES];
    raw_recv(fd, nonce, sizeof(nonce));
    moonlet_cred_key(token, strlen(token), key);
    uint8_t proof[MOONLET_XFER_TCP_MAC_AUTH_BYTES];
    memset(proof, 0x5a, MOONLET_XFER_TCP_NONCE_BYTES);
    moonlet_cred_mac(key, "tcp", nonce, proof, proof + MOONLET_XFER_TCP_NONCE_BYTES);
    moonlet_xfer_tcp_hdr h = {.op = MOONLET_XFER_TCP_AUTH, .flags = MOONLET_XFER_TCP_F_MAC,
                              .req_id = 2, .length = sizeof(proof)};
    uint8_t b[HDR];
    moonlet_xfer_tcp_hdr_encode(&h, b);
    raw_send(fd, b, HDR);
    raw_send(fd, proof, sizeof(proof));
    return raw_reply(fd).status;
}

/* The peer closed: recv sees EOF (or a reset) within the bound. */
static void assert_closed(int fd)
{
    uint8_t b[HDR];
    ssize_t r = recv(fd, b, sizeof(b), 0);
    assert_true(r <= 0);
}

static void test_server_checks(void **state)
{
    server_fx *s = *state;
    int fd = raw_connect(s->port);
    /* the server itself refuses ranges a client library would never send */
    raw_request(fd, MOONLET_XFER_TCP_READ, 1, s->seg_id, UINT64_MAX - 5, 10);
    moonlet_xfer_tcp_hdr r = raw_reply(fd);
    assert_int_equal(r.op, MOONLET_XFER_TCP_READ | MOONLET_XFER_TCP_REPLY);
    assert_int_equal(r.req_id, 1);
    assert_int_equal(r.status, MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(r.length, 0);
    raw_request(fd, MOONLET_XFER_TCP_READ, 2, s->seg_id, SEG - 3, 4);
    assert_int_equal(raw_reply(fd).status, MOONLET_ERR_INVALID_PARAMS);
    raw_request(fd, MOONLET_XFER_TCP_READ, 3, s->seg_id ^ 1, 0, 4);
    assert_int_equal(raw_reply(fd).status, MOONLET_ERR_SEGMENT_NOT_FOUND);
    /* a refused write: its payload is drained, the connection stays in step */
    uint8_t junk[3000];
    memset(junk, 0xEE, sizeof(junk));
    raw_request(fd, MOONLET_XFER_TCP_WRITE, 4, s->seg_id, SEG - 1000, sizeof(junk));
    raw_send(fd, junk, sizeof(junk));
    r = raw_reply(fd);
    assert_int_equal(r.req_id, 4);
    assert_int_equal(r.status, MOONLET_ERR_INVALID_PARAMS);
    raw_request(fd, MOONLET_XFER_TCP_WRITE, 5, 12345, 0, sizeof(junk));
    raw_send(fd, junk, sizeof(junk));
    assert_int_equal(raw_reply(fd).status, MOONLET_ERR_SEGMENT_NOT_FOUND);
    for (uint32_t i = SEG - 1000; i < SEG; i++)
        assert_int_equal(s->seg[i], (uint8_t)(i * 7));
    /* a good read on the same connection afterwards */
    raw_request(fd, MOONLET_XFER_TCP_READ, 6, s->seg_id, SEG - 16, 16);
    r = raw_reply(fd);
    assert_int_equal(r.status, 0);
    assert_int_equal(r.length, 16);
    uint8_t data[16];
    raw_recv(fd, data, 16);
    for (uint32_t i = 0; i < 16; i++)
        assert_int_equal(data[i], (uint8_t)((SEG - 16 + i) * 7));
    /* a good write, pipelined behind a read */
    raw_request(fd, MOONLET_XFER_TCP_READ, 7, s->seg_id, 0, 1);
    raw_request(fd, MOONLET_XFER_TCP_WRITE, 8, s->seg_id, 10, 2);
    raw_send(fd, "\x01\x02", 2);
    r = raw_reply(fd);
    assert_int_equal(r.req_id, 7);
    raw_recv(fd, data, 1);
    assert_int_equal(raw_reply(fd).req_id, 8);
    assert_int_equal(s->seg[10], 1);
    assert_int_equal(s->seg[11], 2);
    close(fd);
}

static void test_malformed_closes_only_its_connection(void **state)
{
    server_fx *s = *state;
    int good = raw_connect(s->port);
    static const int corrupt[] = {0, 4, 5, 6, 12};
    for (size_t i = 0; i < sizeof(corrupt) / sizeof(corrupt[0]); i++) {
        int bad = raw_connect(s->port);
        moonlet_xfer_tcp_hdr h = {.op = MOONLET_XFER_TCP_READ, .req_id = 1, .segment = s->seg_id,
                                  .length = 8};
        uint8_t b[HDR];
        moonlet_xfer_tcp_hdr_encode(&h, b);
        b[corrupt[i]] ^= 0x21;
        raw_send(bad, b, HDR);
        assert_closed(bad);
        close(bad);
    }
    int rep = raw_connect(s->port); /* a reply sent as a request */
    raw_request(rep, MOONLET_XFER_TCP_READ | MOONLET_XFER_TCP_REPLY, 1, s->seg_id, 0, 8);
    assert_closed(rep);
    close(rep);
    int huge = raw_connect(s->port); /* a length beyond the protocol limit */
    raw_request(huge, MOONLET_XFER_TCP_WRITE, 1, s->seg_id, 0, MOONLET_XFER_MAX_OP_BYTES + 1);
    assert_closed(huge);
    close(huge);
    assert_reads_byte(good, s, 9, 1);
    close(good);
}

static void test_raw_auth(void **state)
{
    (void)state;
    const char *tok = "t0ken";
    server_fx s;
    server_up(&s, tok);
    int fd = raw_connect(s.port); /* request before AUTH */
    raw_request(fd, MOONLET_XFER_TCP_READ, 1, s.seg_id, 0, 8);
    assert_int_equal(raw_reply(fd).status, MOONLET_ERR_ILLEGAL_CLIENT);
    assert_closed(fd);
    close(fd);
    fd = raw_connect(s.port); /* wrong token: same length, one byte off */
    raw_request(fd, MOONLET_XFER_TCP_AUTH, 1, 0, 0, 5);
    raw_send(fd, "t0keN", 5);
    assert_int_equal(raw_reply(fd).status, MOONLET_ERR_ILLEGAL_CLIENT);
    assert_closed(fd);
    close(fd);
    fd = raw_connect(s.port); /* a prefix of the token */
    raw_request(fd, MOONLET_XFER_TCP_AUTH, 1, 0, 0, 4);
    raw_send(fd, "t0ke", 4);
    assert_int_equal(raw_reply(fd).status, MOONLET_ERR_ILLEGAL_CLIENT);
    close(fd);
    fd = raw_connect(s.port); /* the right token, in clear: replayable, refused (issue 33) */
    raw_request(fd, MOONLET_XFER_TCP_AUTH, 1, 0, 0, 5);
    raw_send(fd, tok, 5);
    assert_int_equal(raw_reply(fd).status, MOONLET_ERR_ILLEGAL_CLIENT);
    assert_closed(fd);
    close(fd);
    fd = raw_connect(s.port); /* a proof without a CHALLENGE first */
    moonlet_xfer_tcp_hdr h = {.op = MOONLET_XFER_TCP_AUTH, .flags = MOONLET_XFER_TCP_F_MAC,
                              .req_id = 1, .length = MOONLET_XFER_TCP_MAC_AUTH_BYTES};
    uint8_t hb[HDR], zeros[MOONLET_XFER_TCP_MAC_AUTH_BYTES] = {0};
    moonlet_xfer_tcp_hdr_encode(&h, hb);
    raw_send(fd, hb, HDR);
    raw_send(fd, zeros, sizeof(zeros));
    assert_int_equal(raw_reply(fd).status, MOONLET_ERR_ILLEGAL_CLIENT);
    assert_closed(fd);
    close(fd);
    fd = raw_connect(s.port); /* a CHALLENGE with a payload: malformed, closed */
    raw_request(fd, MOONLET_XFER_TCP_CHALLENGE, 1, 0, 0, 5);
    raw_send(fd, "xxxxx", 5);
    assert_closed(fd);
    close(fd);
    fd = raw_connect(s.port); /* a proof of the wrong length after a CHALLENGE */
    raw_request(fd, MOONLET_XFER_TCP_CHALLENGE, 1, 0, 0, 0);
    moonlet_xfer_tcp_hdr cr = raw_reply(fd);
    assert_int_equal(cr.length, MOONLET_XFER_TCP_NONCE_BYTES);
    uint8_t skip[MOONLET_XFER_TCP_NONCE_BYTES];
    raw_recv(fd, skip, sizeof(skip));
    h.length = 10;
    moonlet_xfer_tcp_hdr_encode(&h, hb);
    raw_send(fd, hb, HDR);
    raw_send(fd, zeros, 10);
    assert_int_equal(raw_reply(fd).status, MOONLET_ERR_ILLEGAL_CLIENT);
    assert_closed(fd);
    close(fd);
    fd = raw_connect(s.port); /* the proof of another token */
    assert_int_equal(raw_challenge_auth(fd, "t0keN"), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_closed(fd);
    close(fd);
    fd = raw_connect(s.port); /* challenge-response with the right token */
    assert_int_equal(raw_challenge_auth(fd, tok), 0);
    assert_reads_byte(fd, &s, 2, 2);
    close(fd);
    server_down(&s);
}

/* ---- a captured authentication replayed (issue 33) ---------------------- */

#define RELAY_CAP 8192

/* A man in the middle on loopback: accepts one connection, forwards it to
 * the server both ways and records what the client sent (up to RELAY_CAP
 * bytes).  Ends when either side closes, or after 10 s. */
typedef struct relay {
    int lfd;
    uint16_t port, target;
    uint8_t cap[RELAY_CAP];
    size_t ncap;
    pthread_t th;
} relay;

static bool relay_pump(int from, int to, relay *r, bool record)
{
    uint8_t b[4096];
    ssize_t n = recv(from, b, sizeof(b), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
        return false;
    if (n < 0)
        return true;
    if (record) {
        size_t k = (size_t)n < RELAY_CAP - r->ncap ? (size_t)n : RELAY_CAP - r->ncap;
        memcpy(r->cap + r->ncap, b, k);
        r->ncap += k;
    }
    return send(to, b, (size_t)n, MSG_NOSIGNAL) == n;
}

static void *relay_run(void *arg)
{
    relay *r = arg;
    uint64_t until = moonlet_mono_ms() + 10000;
    struct pollfd lp = {.fd = r->lfd, .events = POLLIN};
    if (poll(&lp, 1, 5000) != 1)
        return NULL;
    int cfd = accept(r->lfd, NULL, NULL);
    int sfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(r->target)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (cfd >= 0 && sfd >= 0 && connect(sfd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        for (int i = 0; i < 100000 && moonlet_mono_ms() < until; i++) {
            struct pollfd p[2] = {{.fd = cfd, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
            if (poll(p, 2, 50) < 0)
                break;
            if ((p[0].revents && !relay_pump(cfd, sfd, r, true)) ||
                (p[1].revents && !relay_pump(sfd, cfd, r, false)))
                break;
        }
    }
    if (cfd >= 0)
        close(cfd);
    if (sfd >= 0)
        close(sfd);
    return NULL;
}

static void relay_start(relay *r, uint16_t target)
{
    memset(r, 0, sizeof(*r));
    r->target = target;
    r->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    assert_int_equal(bind(r->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(r->lfd, 4), 0);
    assert_int_equal(getsockname(r->lfd, (struct sockaddr *)&a, &len), 0);
    r->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&r->th, NULL, relay_run, r), 0);
}

/* A client library authenticates through the relay and reads; the bytes it
 * sent (its whole authentication, then its READ) are then replayed on a new
 * connection to the server: the replay must not read anything, and the
 * token must not have crossed the wire.  (With the token sent in clear, the
 * replay authenticates and reads the segment.) */
static void test_replayed_auth_refused(void **state)
{
    (void)state;
    const char *tok = "replay-me-token";
    server_fx s;
    server_up(&s, tok);
    relay r;
    relay_start(&r, s.port);
    moonlet_xfer_opts co = {.protocol = MOONLET_XFER_TCP, .conns_per_peer = 1,
                            .timeout_ms = 3000, .auth_token = tok};
    moonlet_xfer *c;
    assert_int_equal(moonlet_xfer_create(&co, &c), 0);
    char ep[64];
    snprintf(ep, sizeof(ep), "127.0.0.1:%u", r.port);
    uint8_t buf[16];
    assert_int_equal(moonlet_xfer_read(c, ep, s.info.segment_id, 32, buf, sizeof(buf)), 0);
    for (uint32_t i = 0; i < sizeof(buf); i++)
        assert_int_equal(buf[i], (uint8_t)((32 + i) * 7));
    moonlet_xfer_destroy(c); /* closes the relayed connection: the relay ends */
    pthread_join(r.th, NULL);
    close(r.lfd);
    assert_true(r.ncap > HDR);
    assert_null(memmem(r.cap, r.ncap, tok, strlen(tok))); /* the token never travelled */

    /* the replay, on connections of its own (twice: a nonce is not reused) */
    for (int round = 0; round < 2; round++) {
        int fd = raw_connect(s.port);
        raw_send(fd, r.cap, r.ncap);
        bool auth_refused = false, read_served = false;
        for (int i = 0; i < 8; i++) { /* every reply until the server closes */
            uint8_t b[HDR];
            if (recv(fd, b, HDR, MSG_WAITALL) != (ssize_t)HDR)
                break;
            moonlet_xfer_tcp_hdr h;
            assert_int_equal(moonlet_xfer_tcp_hdr_decode(b, &h), 0);
            if (h.op == (MOONLET_XFER_TCP_AUTH | MOONLET_XFER_TCP_REPLY))
                auth_refused = h.status == MOONLET_ERR_ILLEGAL_CLIENT;
            if (h.op == (MOONLET_XFER_TCP_READ | MOONLET_XFER_TCP_REPLY) && h.status == 0)
                read_served = true;
            for (uint64_t left = h.length; left;) { /* skip a payload */
                uint8_t sink[256];
                size_t k = left < sizeof(sink) ? (size_t)left : sizeof(sink);
                if (recv(fd, sink, k, MSG_WAITALL) != (ssize_t)k)
                    break;
                left -= k;
            }
        }
        assert_true(auth_refused);
        assert_false(read_served);
        close(fd);
    }
    server_down(&s);
}

/* A serving side with more keys (a store node's --credentials): a client
 * proving any of them is served, its own token's included; others are not. */
static void test_extra_auth_keys(void **state)
{
    (void)state;
    uint8_t keys[2][32];
    moonlet_cred_key("client-one", 10, keys[0]);
    moonlet_cred_key("client-two", 10, keys[1]);
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_TCP, .listen_addr = "127.0.0.1:0",
                           .auth_token = "node-own", .server_threads = 2, .timeout_ms = 2000,
                           .auth_keys = (const uint8_t(*)[32])keys, .nauth_keys = 2};
    server_fx s;
    assert_int_equal(moonlet_xfer_create(&o, &s.x), 0);
    uint8_t *seg = calloc(1, 4096);
    assert_non_null(seg);
    seg[5] = 0x42;
    assert_int_equal(moonlet_xfer_register_segment(s.x, seg, 4096, &s.info), 0);
    s.port = (uint16_t)atoi(strrchr(s.info.endpoint, ':') + 1);
    const char *good[] = {"client-one", "client-two", "node-own"};
    for (int i = 0; i < 3; i++) {
        int fd = raw_connect(s.port);
        assert_int_equal(raw_challenge_auth(fd, good[i]), 0);
        close(fd);
    }
    int fd = raw_connect(s.port);
    assert_int_equal(raw_challenge_auth(fd, "client-three"), MOONLET_ERR_ILLEGAL_CLIENT);
    close(fd);
    /* the client library with one of them */
    moonlet_xfer_opts co = {.protocol = MOONLET_XFER_TCP, .timeout_ms = 2000,
                            .auth_token = "client-two"};
    moonlet_xfer *c;
    assert_int_equal(moonlet_xfer_create(&co, &c), 0);
    uint8_t b = 0;
    assert_int_equal(moonlet_xfer_read(c, s.info.endpoint, s.info.segment_id, 5, &b, 1), 0);
    assert_int_equal(b, 0x42);
    moonlet_xfer_destroy(c);
    co.auth_token = "client-three";
    assert_int_equal(moonlet_xfer_create(&co, &c), 0);
    assert_int_not_equal(moonlet_xfer_read(c, s.info.endpoint, s.info.segment_id, 5, &b, 1), 0);
    moonlet_xfer_destroy(c);
    moonlet_xfer_destroy(s.x);
    free(seg);
}

/* ---- data-plane bounds (issue 31 finding 6) ----------------------------- */

/* True when the server closes fd (EOF or reset) within ms; data that
 * arrives first is read and skipped.  Bounded by ms and by 64 reads. */
static bool closed_within(int fd, int ms)
{
    uint64_t until = moonlet_mono_ms() + (uint64_t)ms;
    for (int i = 0; i < 64; i++) {
        uint64_t now = moonlet_mono_ms();
        if (now >= until)
            return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)(until - now)) <= 0)
            return false;
        uint8_t b[256];
        ssize_t r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            return true;
    }
    return false;
}

/* A header declaring a huge length for a range the server does not serve is
 * checked before its deadline is computed: the deadline is timeout_ms, not
 * hours of payload at 16 MB/s, so the connection is closed within it. */
static void test_bogus_header_gets_no_payload_time(void **state)
{
    (void)state;
    server_fx s;
    server_up_timeout(&s, NULL, 300);
    uint64_t huge = MOONLET_XFER_MAX_OP_BYTES; /* the protocol's limit: 18 h at 16 MB/s */
    int bogus_seg = raw_connect(s.port);
    raw_request(bogus_seg, MOONLET_XFER_TCP_WRITE, 1, s.seg_id ^ 1, 0, huge);
    int past_end = raw_connect(s.port);
    raw_request(past_end, MOONLET_XFER_TCP_WRITE, 1, s.seg_id, 0, huge);
    int bad_read = raw_connect(s.port); /* a read has no payload to wait for: refused now */
    raw_request(bad_read, MOONLET_XFER_TCP_READ, 1, s.seg_id, 16, huge);
    assert_int_equal(raw_reply(bad_read).status, MOONLET_ERR_INVALID_PARAMS);
    uint64_t t0 = moonlet_mono_ms();
    assert_true(closed_within(bogus_seg, 3000));
    assert_true(closed_within(past_end, 3000));
    assert_true(moonlet_mono_ms() - t0 < 3000);
    close(bogus_seg);
    close(past_end);
    close(bad_read);
    server_down(&s);
}

/* With a token, a connection that has not authenticated within timeout_ms
 * is closed, although the idle timeout is 0 (never): silent ones, and ones
 * that trickle a partial AUTH. */
static void test_preauth_deadline(void **state)
{
    (void)state;
    server_fx s;
    server_up_timeout(&s, "t0ken", 300);
    int silent = raw_connect(s.port);
    int trickle = raw_connect(s.port);
    moonlet_xfer_tcp_hdr h = {.op = MOONLET_XFER_TCP_AUTH, .req_id = 1, .length = 5};
    uint8_t b[HDR];
    moonlet_xfer_tcp_hdr_encode(&h, b);
    raw_send(trickle, b, HDR);
    raw_send(trickle, "t0", 2); /* the rest of the token never comes */
    int authed = raw_connect(s.port);
    assert_int_equal(raw_challenge_auth(authed, "t0ken"), 0);
    assert_true(closed_within(silent, 3000));
    assert_true(closed_within(trickle, 3000));
    assert_int_equal(moonlet_xfer_tcp_auth_closed(s.x), 2);
    /* the authenticated one is not subject to it (no idle timeout either) */
    assert_reads_byte(authed, &s, 2, 2);
    close(silent);
    close(trickle);
    close(authed);
    server_down(&s);
}

/* The address a as a peer's: IPv6 when it holds a ':', else IPv4. */
static struct sockaddr_storage ss_of(const char *a)
{
    struct sockaddr_storage ss = {0};
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
    struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
    bool v6 = strchr(a, ':') != NULL;
    ss.ss_family = v6 ? AF_INET6 : AF_INET;
    assert_int_equal(inet_pton(ss.ss_family, a, v6 ? (void *)&s6->sin6_addr : &s4->sin_addr), 1);
    return ss;
}

static bool same_peer(struct sockaddr_storage a, struct sockaddr_storage b)
{
    uint8_t ka[16], kb[16];
    uint8_t la = moonlet_xfer_tcp_peer_key(&a, ka), lb = moonlet_xfer_tcp_peer_key(&b, kb);
    assert_true(la > 0 && lb > 0);
    return la == lb && memcmp(ka, kb, la) == 0;
}

/* The per-peer connection cap counts an IPv6 peer by its /64 (one host
 * picks any address of its /64 at will), an IPv4 peer by its address. */
static void test_peer_key_ipv6_64(void **state)
{
    (void)state;
    assert_true(same_peer(ss_of("2001:db8:1:2::1"), ss_of("2001:db8:1:2:ffff:1:2:3")));
    assert_false(same_peer(ss_of("2001:db8:1:2::1"), ss_of("2001:db8:1:3::1")));
    assert_true(same_peer(ss_of("10.0.0.1"), ss_of("10.0.0.1")));
    assert_false(same_peer(ss_of("10.0.0.1"), ss_of("10.0.0.2")));
    /* an IPv4-mapped IPv6 address is its IPv4 address, not a /64 */
    assert_true(same_peer(ss_of("::ffff:10.0.0.1"), ss_of("10.0.0.1")));
    assert_false(same_peer(ss_of("::ffff:10.0.0.1"), ss_of("::ffff:10.0.0.2")));
}

/* The cap itself, over loopback: 127.0.0.1 at its cap does not keep
 * 127.0.0.2 out (IPv4 peers are whole addresses). */
static void test_peer_cap_ipv4(void **state)
{
    (void)state;
    moonlet_xfer *x;
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_TCP, .listen_addr = "127.0.0.1:0",
                           .server_threads = 1, .timeout_ms = 2000,
                           .server_max_conns_per_peer = 2};
    assert_int_equal(moonlet_xfer_create(&o, &x), 0);
    uint8_t seg[64] = {0};
    moonlet_xfer_segment_info info;
    assert_int_equal(moonlet_xfer_register_segment(x, seg, sizeof(seg), &info), 0);
    uint16_t port = (uint16_t)atoi(strrchr(info.endpoint, ':') + 1);
    uint64_t id = strtoull(info.segment_id, NULL, 16);
    int fds[3];
    for (int i = 0; i < 3; i++)
        fds[i] = raw_connect(port);
    assert_true(closed_within(fds[2], 3000)); /* the third from 127.0.0.1: closed */
    int other = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in src = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
    assert_int_equal(bind(other, (struct sockaddr *)&src, sizeof(src)), 0);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(port)};
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(other, (struct sockaddr *)&dst, sizeof(dst)), 0);
    struct timeval tv = {.tv_sec = 3};
    setsockopt(other, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    raw_request(other, MOONLET_XFER_TCP_READ, 1, id, 0, 8);
    assert_int_equal(raw_reply(other).status, 0);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    close(other);
    moonlet_xfer_destroy(x);
}

/* ---- the client against fake servers ------------------------------------ */

typedef enum fake_mode {
    FAKE_CLOSE_AFTER_HEADER, /* reads one request header, then closes */
    FAKE_STALL,              /* reads one request header, then says nothing */
    FAKE_BAD_REPLY,          /* answers with a reply for another request id */
    FAKE_DROP_FIRST,         /* closes its first connection after one header, then
                              * serves reads (byte i of a segment = i * 7) */
    FAKE_NOT_FOUND,          /* answers SEGMENT_NOT_FOUND, then closes */
} fake_mode;

typedef struct fake_server {
    fake_listener l;
    fake_mode mode;
    int headers_seen;
    int accepted;
} fake_server;

/* FAKE_DROP_FIRST after its first connection: answers every read request
 * (header only: no capability, no token) with the pattern, until the client
 * closes or 50 requests were served. */
static void fake_serve_reads(fake_server *f, int fd, uint8_t *b)
{
    static uint8_t pay[1u << 16];
    for (int n = 0; n < 50; n++) {
        moonlet_xfer_tcp_hdr h;
        if (moonlet_xfer_tcp_hdr_decode(b, &h) || h.op != MOONLET_XFER_TCP_READ ||
            h.length > sizeof(pay))
            return;
        for (uint64_t i = 0; i < h.length; i++)
            pay[i] = (uint8_t)((h.offset + i) * 7);
        h.op |= MOONLET_XFER_TCP_REPLY;
        uint8_t r[HDR];
        moonlet_xfer_tcp_hdr_encode(&h, r);
        if (send(fd, r, HDR, MSG_NOSIGNAL) != (ssize_t)HDR ||
            send(fd, pay, h.length, MSG_NOSIGNAL) != (ssize_t)h.length)
            return;
        struct pollfd p[2] = {{.fd = f->l.stop_pipe[0], .events = POLLIN},
                              {.fd = fd, .events = POLLIN}};
        if (poll(p, 2, 5000) <= 0 || p[0].revents)
            return;
        if (recv(fd, b, HDR, MSG_WAITALL) != (ssize_t)HDR)
            return;
        __atomic_add_fetch(&f->headers_seen, 1, __ATOMIC_SEQ_CST);
    }
}

/* Serves one accepted connection per the mode; returns when done or stopped. */
static void fake_serve(fake_server *f, int fd)
{
    uint8_t b[HDR];
    if (recv(fd, b, HDR, MSG_WAITALL) != (ssize_t)HDR)
        return;
    __atomic_add_fetch(&f->headers_seen, 1, __ATOMIC_SEQ_CST);
    if (f->mode == FAKE_DROP_FIRST) {
        if (__atomic_load_n(&f->accepted, __ATOMIC_SEQ_CST) > 1)
            fake_serve_reads(f, fd, b);
        return;
    }
    if (f->mode == FAKE_NOT_FOUND) {
        moonlet_xfer_tcp_hdr h;
        if (moonlet_xfer_tcp_hdr_decode(b, &h) == 0) {
            h.op |= MOONLET_XFER_TCP_REPLY;
            h.status = MOONLET_ERR_SEGMENT_NOT_FOUND;
            h.length = 0;
            moonlet_xfer_tcp_hdr_encode(&h, b);
            send(fd, b, HDR, MSG_NOSIGNAL);
        }
        return;
    }
    if (f->mode == FAKE_BAD_REPLY) {
        moonlet_xfer_tcp_hdr h;
        if (moonlet_xfer_tcp_hdr_decode(b, &h) == 0) {
            h.op |= MOONLET_XFER_TCP_REPLY;
            h.req_id += 1000;
            h.length = 0;
            moonlet_xfer_tcp_hdr_encode(&h, b);
            send(fd, b, HDR, MSG_NOSIGNAL);
        }
    }
    if (f->mode == FAKE_CLOSE_AFTER_HEADER)
        return;
    /* Say nothing more; swallow what arrives until the client gives up and
     * closes (or the test stops us), so the next connection gets served. */
    uint64_t end = moonlet_mono_ms() + 10000;
    static uint8_t sink[65536];
    while (moonlet_mono_ms() < end) {
        struct pollfd p[2] = {{.fd = f->l.stop_pipe[0], .events = POLLIN},
                              {.fd = fd, .events = POLLIN}};
        if (poll(p, 2, 100) <= 0)
            continue;
        if (p[0].revents || (p[1].revents && recv(fd, sink, sizeof(sink), 0) <= 0))
            return;
    }
}

static void *fake_main(void *arg)
{
    fake_server *f = arg;
    uint64_t end = moonlet_mono_ms() + 20000;
    while (moonlet_mono_ms() < end) {
        struct pollfd p[2] = {{.fd = f->l.listen_fd, .events = POLLIN},
                              {.fd = f->l.stop_pipe[0], .events = POLLIN}};
        if (poll(p, 2, 100) <= 0)
            continue;
        if (p[1].revents)
            break;
        int fd = accept(f->l.listen_fd, NULL, NULL);
        if (fd < 0)
            continue;
        __atomic_add_fetch(&f->accepted, 1, __ATOMIC_SEQ_CST);
        fake_serve(f, fd);
        close(fd);
    }
    return NULL;
}

static void fake_start(fake_server *f, fake_mode mode)
{
    memset(f, 0, sizeof(*f));
    f->mode = mode;
    fake_listener_start(&f->l, fake_main, f);
}

static void fake_stop(fake_server *f)
{
    fake_listener_stop(&f->l);
}

/* A TCP client: at most conns_per_peer connections a peer (0: the default),
 * transfers timing out after timeout_ms. */
static moonlet_xfer *tcp_client(uint32_t conns_per_peer, uint32_t timeout_ms)
{
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_TCP, .conns_per_peer = conns_per_peer,
                           .timeout_ms = timeout_ms};
    moonlet_xfer *c;
    assert_int_equal(moonlet_xfer_create(&o, &c), 0);
    return c;
}

/* The fake, started in `mode`; a client of it with one connection (transfer
 * timeout timeout_ms); the fake's endpoint. */
typedef struct fake_fx {
    fake_server f;
    moonlet_xfer *c;
    char ep[32];
} fake_fx;

static void fake_up(fake_fx *x, fake_mode mode, uint32_t timeout_ms)
{
    fake_start(&x->f, mode);
    x->c = tcp_client(1, timeout_ms);
    snprintf(x->ep, sizeof(x->ep), "127.0.0.1:%u", x->f.l.port);
}

static void fake_down(fake_fx *x)
{
    moonlet_xfer_destroy(x->c);
    fake_stop(&x->f);
}

/* The fake and its client as a test's fixture: the test entry (FAKE_TEST)
 * names the fake's mode and the client's transfer timeout, and the test gets
 * the fake_fx as its state.  The teardown stops both even when the test
 * failed. */
typedef struct fake_case {
    fake_mode mode;
    uint32_t timeout_ms;
} fake_case;

static int fake_setup(void **state)
{
    const fake_case *fc = *state;
    fake_fx *x = calloc(1, sizeof(*x));
    if (!x)
        return -1;
    fake_up(x, fc->mode, fc->timeout_ms);
    *state = x;
    return 0;
}

static int fake_teardown(void **state)
{
    fake_down(*state);
    free(*state);
    return 0;
}

#define FAKE_TEST(fn, mode, timeout_ms)                                                          \
    {#fn, fn, fake_setup, fake_teardown, &(fake_case){mode, timeout_ms}}

/* A client read and write against the fake; both must fail with
 * TRANSFER_FAIL within max_ms (and, when min_ms > 0, not before it). */
static void client_vs_fake(fake_mode mode, uint32_t timeout_ms, uint64_t min_ms, uint64_t max_ms)
{
    fake_fx x;
    fake_up(&x, mode, timeout_ms);
    size_t len = 8u << 20;
    uint8_t *buf = calloc(1, len);
    assert_non_null(buf);
    for (int opc = 0; opc < 2; opc++) {
        uint64_t t0 = moonlet_mono_ms();
        int rc = opc == 0 ? moonlet_xfer_read(x.c, x.ep, "00000000000000aa", 0, buf, len)
                          : moonlet_xfer_write(x.c, x.ep, "00000000000000aa", 0, buf, len);
        uint64_t took = moonlet_mono_ms() - t0;
        assert_int_equal(rc, MOONLET_ERR_TRANSFER_FAIL);
        assert_true(took >= min_ms);
        assert_true(took <= max_ms);
    }
    assert_true(__atomic_load_n(&x.f.headers_seen, __ATOMIC_SEQ_CST) >= 1);
    free(buf);
    fake_down(&x);
}

static void test_peer_closes_mid_transfer(void **state)
{
    (void)state;
    client_vs_fake(FAKE_CLOSE_AFTER_HEADER, 2000, 0, 1500);
}

static void test_peer_stalls(void **state)
{
    (void)state;
    client_vs_fake(FAKE_STALL, 300, 250, 2000);
}

static void test_peer_answers_nonsense(void **state)
{
    (void)state;
    client_vs_fake(FAKE_BAD_REPLY, 2000, 0, 1500);
}

/* ---- one reissue after a connection failure (issue 12 section 4) -------- */

/* The peer drops the connection in the middle of a batch (after reading its
 * first request): the batch's operations are reissued once on a fresh
 * connection and succeed. */
static void test_reissue_after_peer_drops(void **state)
{
    fake_fx *x = *state;
    static uint8_t buf[3][8192];
    moonlet_xfer_op ops[3];
    for (int k = 0; k < 3; k++)
        ops[k] = (moonlet_xfer_op){.opcode = MOONLET_XFER_READ, .endpoint = x->ep,
                                   .segment_id = "00000000000000aa",
                                   .offset = (uint64_t)k * 8192, .local = buf[k],
                                   .len = sizeof(buf[k])};
    assert_int_equal(moonlet_xfer_submit(x->c, ops, 3), 0);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(ops[k].status, 0);
        for (uint32_t i = 0; i < sizeof(buf[k]); i++)
            assert_int_equal(buf[k][i], (uint8_t)(((uint64_t)k * 8192 + i) * 7));
    }
    assert_int_equal(__atomic_load_n(&x->f.accepted, __ATOMIC_SEQ_CST), 2);
}

/* An error about the request itself (the peer answers SEGMENT_NOT_FOUND and
 * then closes) is final: one request, one connection, no reissue. */
static void test_access_error_not_reissued(void **state)
{
    fake_fx *x = *state;
    uint8_t b[64];
    uint64_t t0 = moonlet_mono_ms();
    assert_int_equal(moonlet_xfer_read(x->c, x->ep, "00000000000000aa", 0, b, sizeof(b)),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);
    assert_true(moonlet_mono_ms() - t0 < 1000);
    assert_int_equal(__atomic_load_n(&x->f.headers_seen, __ATOMIC_SEQ_CST), 1);
    assert_int_equal(__atomic_load_n(&x->f.accepted, __ATOMIC_SEQ_CST), 1);
}

/* A write whose writer's deadline passes while its peer stalls is aborted
 * and not reissued: no fresh connection is opened for it. */
static void test_write_past_deadline_not_reissued(void **state)
{
    fake_fx *x = *state;
    uint8_t b[64] = {0};
    uint64_t t0 = moonlet_mono_ms();
    moonlet_xfer_cap cap = {.deadline_ms = moonlet_xfer_now_ms() + 200};
    moonlet_xfer_op op = {.opcode = MOONLET_XFER_WRITE, .endpoint = x->ep,
                          .segment_id = "00000000000000aa", .local = b, .len = sizeof(b),
                          .cap = &cap};
    assert_int_equal(moonlet_xfer_submit(x->c, &op, 1), MOONLET_ERR_TRANSFER_FAIL);
    assert_true(moonlet_mono_ms() - t0 < 1500);
    assert_int_equal(moonlet_xfer_pool_stats(x->c, x->ep, NULL), 0);
}

static void test_unreachable(void **state)
{
    (void)state;
    fake_server f; /* bind a port, then close it: nothing listens there */
    fake_start(&f, FAKE_STALL);
    uint16_t port = f.l.port;
    fake_stop(&f);
    moonlet_xfer *c = tcp_client(0, 1000);
    char ep[32];
    snprintf(ep, sizeof(ep), "127.0.0.1:%u", port);
    uint8_t b[8];
    uint64_t t0 = moonlet_mono_ms();
    assert_int_equal(moonlet_xfer_connect(c, ep), MOONLET_ERR_TRANSFER_FAIL);
    assert_int_equal(moonlet_xfer_read(c, ep, "00000000000000aa", 0, b, 8),
                     MOONLET_ERR_TRANSFER_FAIL);
    assert_true(moonlet_mono_ms() - t0 < 2000);
    moonlet_xfer_destroy(c);
}

/* The server closes a connection idle past server_idle_timeout_ms; the
 * client notices before reusing it from its pool and opens a fresh one, so
 * the next transfer succeeds instead of failing with TRANSFER_FAIL. */
static void test_idle_close_is_invisible_to_clients(void **state)
{
    server_fx s;
    moonlet_xfer_opts so = {.protocol = MOONLET_XFER_TCP, .listen_addr = "127.0.0.1:0",
                            .server_threads = 2, .timeout_ms = 2000,
                            .server_idle_timeout_ms = 200};
    assert_int_equal(moonlet_xfer_create(&so, &s.x), 0);
    uint8_t *seg = calloc(1, 4096);
    assert_non_null(seg);
    for (int i = 0; i < 4096; i++)
        seg[i] = (uint8_t)(i * 3);
    assert_int_equal(moonlet_xfer_register_segment(s.x, seg, 4096, &s.info), 0);
    moonlet_xfer *c = tcp_client(1, 2000);
    uint8_t buf[4096];
    for (int round = 0; round < 3; round++) {
        memset(buf, 0, sizeof(buf));
        assert_int_equal(moonlet_xfer_read(c, s.info.endpoint, s.info.segment_id, 0, buf,
                                           sizeof(buf)), 0);
        assert_memory_equal(buf, seg, sizeof(buf));
        /* the server's reaper closes the pooled connection (bounded wait) */
        uint64_t until = moonlet_mono_ms() + 5000;
        while (moonlet_xfer_tcp_idle_closed(s.x) < (uint64_t)round + 1 &&
               moonlet_mono_ms() < until)
            poll(NULL, 0, 10);
        assert_int_equal(moonlet_xfer_tcp_idle_closed(s.x), round + 1);
    }
    moonlet_xfer_destroy(c);
    moonlet_xfer_destroy(s.x);
    free(seg);
}

/* ---- reader segments (a store node's disk tier) ------------------------ */

/* A reader that serves [0, 4096) as bytes i * 5 and refuses anything else
 * with INVALID_READ, counting its calls. */
static int reader_calls;
static int test_reader(void *arg, uint64_t offset, uint64_t len, void **buf)
{
    (void)arg;
    reader_calls++;
    if (offset != 0 || len != 4096)
        return MOONLET_ERR_INVALID_READ;
    uint8_t *b = malloc(len);
    if (!b)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (uint64_t i = 0; i < len; i++)
        b[i] = (uint8_t)(i * 5);
    *buf = b;
    return MOONLET_OK;
}

/* A read of a reader segment gets the function's bytes, or its error as
 * the read's status; a range outside the segment never reaches it; a write
 * is refused; the connection stays usable after each refusal. */
static void test_reader_segment(void **state)
{
    (void)state;
    moonlet_xfer_opts so = {.protocol = MOONLET_XFER_TCP, .listen_addr = "127.0.0.1:0",
                            .server_threads = 2, .timeout_ms = 2000};
    moonlet_xfer *x;
    assert_int_equal(moonlet_xfer_create(&so, &x), 0);
    moonlet_xfer_segment_info info;
    assert_int_equal(moonlet_xfer_register_reader(x, 1u << 20, test_reader, NULL, &info), 0);
    moonlet_xfer *c = tcp_client(1, 2000);
    uint8_t buf[4096], want[4096];
    for (int i = 0; i < 4096; i++)
        want[i] = (uint8_t)(i * 5);
    reader_calls = 0;
    assert_int_equal(moonlet_xfer_read(c, info.endpoint, info.segment_id, 0, buf, 4096), 0);
    assert_memory_equal(buf, want, sizeof(buf));
    assert_int_equal(moonlet_xfer_read(c, info.endpoint, info.segment_id, 4096, buf, 4096),
                     MOONLET_ERR_INVALID_READ);
    assert_int_equal(reader_calls, 2);
    /* past the segment's size: refused before the function is called */
    assert_int_equal(moonlet_xfer_read(c, info.endpoint, info.segment_id, 1u << 20, buf, 4096),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(reader_calls, 2);
    assert_int_equal(moonlet_xfer_write(c, info.endpoint, info.segment_id, 0, want, 4096),
                     MOONLET_ERR_INVALID_WRITE);
    memset(buf, 0, sizeof(buf));
    assert_int_equal(moonlet_xfer_read(c, info.endpoint, info.segment_id, 0, buf, 4096), 0);
    assert_memory_equal(buf, want, sizeof(buf));
    assert_int_equal(moonlet_xfer_unregister_segment(x, info.segment_id), 0);
    assert_int_equal(moonlet_xfer_read(c, info.endpoint, info.segment_id, 0, buf, 4096),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);
    moonlet_xfer_destroy(c);
    moonlet_xfer_destroy(x);
}

/* ---- the client's connection pool cap (issue 12 section 4) ------------- */

#define POOL_SERVERS 6

/* A client talking to more serving instances than max_pooled_conns allows
 * keeps at most the cap open (the least recently used idle connections are
 * closed, peers left empty are freed) and every transfer still succeeds. */
static void test_pool_cap_evicts_lru(void **state)
{
    (void)state;
    server_fx s[POOL_SERVERS];
    for (int i = 0; i < POOL_SERVERS; i++)
        server_up(&s[i], NULL);
    moonlet_xfer_opts co = {.protocol = MOONLET_XFER_TCP, .conns_per_peer = 2,
                            .timeout_ms = 2000, .max_pooled_conns = 3};
    moonlet_xfer *c;
    assert_int_equal(moonlet_xfer_create(&co, &c), 0);
    uint8_t buf[4096];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < POOL_SERVERS; i++) {
            /* Two ops: both of the peer's connections are leased at once. */
            moonlet_xfer_op ops[2];
            uint8_t b2[2][512];
            for (int k = 0; k < 2; k++)
                ops[k] = (moonlet_xfer_op){.opcode = MOONLET_XFER_READ,
                                           .endpoint = s[i].info.endpoint,
                                           .segment_id = s[i].info.segment_id,
                                           .offset = (uint64_t)k * 512, .local = b2[k],
                                           .len = 512};
            assert_int_equal(moonlet_xfer_submit(c, ops, 2), 0);
            assert_memory_equal(b2[0], s[i].seg, 512);
            assert_memory_equal(b2[1], s[i].seg + 512, 512);
            size_t npeers = 0;
            assert_true(moonlet_xfer_pool_stats(c, NULL, &npeers) <= 3);
            assert_true(npeers <= 3);
        }
    }
    /* LRU, not FIFO: with a cap of 2 and one connection per peer, touching
     * A again before C is opened makes B the victim. */
    moonlet_xfer_destroy(c);
    co.conns_per_peer = 1;
    co.max_pooled_conns = 2;
    assert_int_equal(moonlet_xfer_create(&co, &c), 0);
    const int order[] = {0, 1, 0, 2};
    for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
        server_fx *t = &s[order[k]];
        assert_int_equal(moonlet_xfer_read(c, t->info.endpoint, t->info.segment_id, 0, buf,
                                           sizeof(buf)), 0);
        assert_memory_equal(buf, t->seg, sizeof(buf));
    }
    size_t npeers = 0;
    assert_int_equal(moonlet_xfer_pool_stats(c, NULL, &npeers), 2);
    assert_int_equal(npeers, 2);
    assert_int_equal(moonlet_xfer_pool_stats(c, s[0].info.endpoint, NULL), 1);
    assert_int_equal(moonlet_xfer_pool_stats(c, s[1].info.endpoint, NULL), 0);
    assert_int_equal(moonlet_xfer_pool_stats(c, s[2].info.endpoint, NULL), 1);
    moonlet_xfer_destroy(c);
    for (int i = 0; i < POOL_SERVERS; i++)
        server_down(&s[i]);
}

/* ---- write capabilities (issue 13: stale writers) ----------------------- */

static const uint8_t CAP_KEY[16] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12, 13, 14, 15, 16};

static moonlet_xfer_cap cap_for(const server_fx *s, uint64_t off, uint64_t len, uint64_t expiry)
{
    return (moonlet_xfer_cap){.offset = off, .len = len, .expiry_ms = expiry,
                              .tag = moonlet_writecap_tag(CAP_KEY, s->info.segment_id, off, len,
                                                          expiry)};
}

static int cap_write(moonlet_xfer *c, const server_fx *s, uint64_t off, const void *src,
                     uint64_t len, const moonlet_xfer_cap *cap)
{
    moonlet_xfer_op op = {.opcode = MOONLET_XFER_WRITE, .endpoint = s->info.endpoint,
                          .segment_id = s->info.segment_id, .offset = off, .local = (void *)src,
                          .len = len, .cap = cap};
    return moonlet_xfer_submit(c, &op, 1);
}

static void assert_seg_original(const server_fx *s, uint64_t off, uint64_t len)
{
    for (uint64_t i = off; i < off + len; i++)
        assert_int_equal(s->seg[i], (uint8_t)(i * 7));
}

/* A capability of epoch e for [off, off + len) until expiry. */
static moonlet_xfer_cap cap_epoch(const server_fx *s, uint64_t off, uint64_t len, uint64_t expiry,
                                  uint64_t e)
{
    moonlet_writecap w = {.offset = off, .len = len, .expiry_ms = expiry};
    moonlet_writecap_set_epoch(&w, e);
    return (moonlet_xfer_cap){.offset = off, .len = w.len, .expiry_ms = w.expiry_ms,
                              .tag = moonlet_writecap_tag(CAP_KEY, s->info.segment_id, off, w.len,
                                                          w.expiry_ms)};
}

/* Issue 31 section 3: the leader's epoch rides in the capability (under the
 * tag); a node that has seen epoch E refuses genuine capabilities of older
 * epochs with INVALID_WRITE, and learns newer ones from genuine
 * capabilities.  Epoch 0 (no HA) is the capability as it always was. */
static void test_capability_epochs(void **state)
{
    server_fx *s = *state;
    moonlet_xfer *c = tcp_client(1, 3000);
    uint8_t data[64];
    memset(data, 0x3C, sizeof(data));
    assert_int_equal(moonlet_xfer_set_segment_key(s->x, s->info.segment_id, CAP_KEY), MOONLET_OK);
    uint64_t later = moonlet_mono_ms() + 60000;
    /* the packing: epoch 0 changes nothing; the fields come back */
    moonlet_writecap w = {.offset = 1, .len = 4096, .expiry_ms = later};
    moonlet_writecap_set_epoch(&w, 0);
    assert_int_equal(w.len, 4096);
    assert_int_equal(w.expiry_ms, later);
    moonlet_writecap_set_epoch(&w, MOONLET_WRITECAP_EPOCH_MAX - 5);
    assert_int_equal(moonlet_writecap_epoch(&w), MOONLET_WRITECAP_EPOCH_MAX - 5);
    assert_int_equal(moonlet_writecap_len(&w), 4096);
    assert_int_equal(moonlet_writecap_expiry(&w), later);
    /* a tag covers the epoch: another epoch claimed under it is forged */
    moonlet_xfer_cap e7 = cap_epoch(s, 0, 64, later, 7), claimed = e7;
    moonlet_writecap cw = {.offset = 0, .len = 64, .expiry_ms = later};
    moonlet_writecap_set_epoch(&cw, 9);
    claimed.len = cw.len;
    claimed.expiry_ms = cw.expiry_ms;
    assert_int_equal(cap_write(c, s, 0, data, 64, &claimed), MOONLET_ERR_INVALID_WRITE);

    assert_int_equal(moonlet_xfer_epoch(s->x), 0);
    moonlet_xfer_note_epoch(s->x, 5); /* what Mount / Ping told the node */
    moonlet_xfer_note_epoch(s->x, 3); /* never lowered */
    assert_int_equal(moonlet_xfer_epoch(s->x), 5);
    moonlet_xfer_cap e4 = cap_epoch(s, 0, 64, later, 4), e5 = cap_epoch(s, 0, 64, later, 5);
    moonlet_xfer_cap e0 = cap_for(s, 0, 64, later);
    assert_int_equal(cap_write(c, s, 0, data, 64, &e4), MOONLET_ERR_INVALID_WRITE);
    assert_int_equal(cap_write(c, s, 0, data, 64, &e0), MOONLET_ERR_INVALID_WRITE);
    assert_seg_original(s, 0, 64);
    assert_int_equal(cap_write(c, s, 0, data, 64, &e5), MOONLET_OK);
    /* a genuine capability of a newer epoch: taken, and the node knows it now */
    assert_int_equal(cap_write(c, s, 0, data, 64, &e7), MOONLET_OK);
    assert_int_equal(moonlet_xfer_epoch(s->x), 7);
    assert_int_equal(cap_write(c, s, 0, data, 64, &e5), MOONLET_ERR_INVALID_WRITE);
    moonlet_xfer_destroy(c);
}

/* A keyed segment takes a write only with a genuine, covering, unexpired
 * capability; everything else is INVALID_WRITE and leaves memory alone, and
 * the connection stays usable. */
static void test_write_capabilities(void **state)
{
    server_fx *s = *state;
    moonlet_xfer *c = tcp_client(1, 3000);
    uint8_t data[1024];
    memset(data, 0x5A, sizeof(data));

    /* no key yet: writes without a capability work (bare segments, contract tests) */
    assert_int_equal(cap_write(c, s, 0, data, 16, NULL), MOONLET_OK);
    assert_int_equal(s->seg[0], 0x5A);
    assert_int_equal(moonlet_xfer_set_segment_key(s->x, s->info.segment_id, CAP_KEY), MOONLET_OK);
    assert_int_equal(moonlet_xfer_set_segment_key(s->x, "00000000000000aa", CAP_KEY),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);

    uint64_t later = moonlet_mono_ms() + 60000;
    moonlet_xfer_cap good = cap_for(s, 4096, 1024, later);
    assert_int_equal(cap_write(c, s, 4096, data, 1024, NULL), MOONLET_ERR_INVALID_WRITE);
    moonlet_xfer_cap forged = good;
    forged.tag ^= 1;
    assert_int_equal(cap_write(c, s, 4096, data, 1024, &forged), MOONLET_ERR_INVALID_WRITE);
    moonlet_xfer_cap stretched = good; /* a genuine tag, another range claimed */
    stretched.len = 2048;
    assert_int_equal(cap_write(c, s, 4096, data, 1024, &stretched), MOONLET_ERR_INVALID_WRITE);
    moonlet_xfer_cap longer = good; /* a genuine tag, a later expiry claimed */
    longer.expiry_ms += 1000;
    assert_int_equal(cap_write(c, s, 4096, data, 1024, &longer), MOONLET_ERR_INVALID_WRITE);
    /* outside the covered range: before, after, overlapping the end */
    assert_int_equal(cap_write(c, s, 4095, data, 16, &good), MOONLET_ERR_INVALID_WRITE);
    assert_int_equal(cap_write(c, s, 5120, data, 16, &good), MOONLET_ERR_INVALID_WRITE);
    assert_int_equal(cap_write(c, s, 4096 + 512, data, 1024, &good), MOONLET_ERR_INVALID_WRITE);
    /* under another segment's key */
    moonlet_xfer_cap other = good;
    other.tag = moonlet_writecap_tag(CAP_KEY, "00000000000000aa", 4096, 1024, later);
    assert_int_equal(cap_write(c, s, 4096, data, 1024, &other), MOONLET_ERR_INVALID_WRITE);
    /* expired on the node's clock */
    moonlet_xfer_cap old = cap_for(s, 4096, 1024, moonlet_mono_ms() - 1);
    assert_int_equal(cap_write(c, s, 4096, data, 1024, &old), MOONLET_ERR_INVALID_WRITE);
    assert_seg_original(s, 4095, 1026);

    /* the genuine one, and a part of its range */
    assert_int_equal(cap_write(c, s, 4096, data, 1024, &good), MOONLET_OK);
    assert_int_equal(cap_write(c, s, 4096 + 1000, data, 24, &good), MOONLET_OK);
    for (uint32_t i = 4096; i < 4096 + 1024; i++)
        assert_int_equal(s->seg[i], 0x5A);
    assert_seg_original(s, 4096 + 1024, 16);

    /* the writer's own deadline passed: not even sent */
    moonlet_xfer_cap late = cap_for(s, 8192, 1024, later);
    late.deadline_ms = moonlet_mono_ms() - 1;
    assert_int_equal(cap_write(c, s, 8192, data, 1024, &late), MOONLET_ERR_TRANSFER_FAIL);
    assert_seg_original(s, 8192, 1024);
    moonlet_xfer_destroy(c);
}

/* The capability expires while the payload arrives: what arrives after the
 * expiry never reaches segment memory, and the write is refused. */
static void test_write_capability_expires_mid_payload(void **state)
{
    server_fx *s = *state;
    assert_int_equal(moonlet_xfer_set_segment_key(s->x, s->info.segment_id, CAP_KEY), MOONLET_OK);
    int fd = raw_connect(s->port);
    uint64_t expiry = moonlet_mono_ms() + 300;
    moonlet_xfer_cap cap = cap_for(s, 0, 4096, expiry);
    moonlet_xfer_tcp_hdr h = {.op = MOONLET_XFER_TCP_WRITE, .flags = MOONLET_XFER_TCP_F_CAP,
                              .req_id = 1, .segment = s->seg_id, .offset = 0, .length = 4096};
    uint8_t b[HDR + MOONLET_XFER_TCP_CAP_BYTES];
    moonlet_xfer_tcp_hdr_encode(&h, b);
    uint64_t f[4] = {cap.offset, cap.len, cap.expiry_ms, cap.tag};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 8; k++)
            b[HDR + 8 * i + k] = (uint8_t)(f[i] >> (56 - 8 * k));
    raw_send(fd, b, sizeof(b));
    uint8_t half[2048];
    memset(half, 0x11, sizeof(half));
    raw_send(fd, half, sizeof(half)); /* lands: the capability holds */
    uint64_t end = expiry + 2000;
    while (moonlet_mono_ms() < end && s->seg[2047] != 0x11) /* bounded: wait for it to land */
        usleep(1000);
    assert_int_equal(s->seg[2047], 0x11);
    while (moonlet_mono_ms() <= expiry) /* bounded by the expiry */
        usleep(1000);
    memset(half, 0x22, sizeof(half));
    raw_send(fd, half, sizeof(half)); /* after the expiry: discarded */
    moonlet_xfer_tcp_hdr r = raw_reply(fd);
    assert_int_equal(r.req_id, 1);
    assert_int_equal(r.status, MOONLET_ERR_INVALID_WRITE);
    assert_seg_original(s, 2048, 2048);
    /* the connection stays in step */
    raw_request(fd, MOONLET_XFER_TCP_READ, 2, s->seg_id, 2048, 1);
    r = raw_reply(fd);
    assert_int_equal(r.status, 0);
    uint8_t one;
    raw_recv(fd, &one, 1);
    assert_int_equal(one, (uint8_t)(2048 * 7));
    close(fd);
}

typedef struct busy_read_args {
    moonlet_xfer *c;
    const char *ep;
    int rc;
} busy_read_args;

static void *busy_read(void *arg)
{
    busy_read_args *a = arg;
    uint8_t b[16];
    a->rc = moonlet_xfer_read(a->c, a->ep, "00000000000000aa", 0, b, sizeof(b));
    return NULL;
}

/* A client whose write passes its deadline gives up then, not after the
 * transfer timeout, and resets the connection. */
static void test_client_write_deadline(void **state)
{
    fake_fx *x = *state;
    uint8_t buf[4096] = {0};
    uint64_t t0 = moonlet_mono_ms();
    moonlet_xfer_cap cap = {.offset = 0, .len = sizeof(buf), .expiry_ms = 1, .tag = 1,
                            .deadline_ms = t0 + 300};
    moonlet_xfer_op op = {.opcode = MOONLET_XFER_WRITE, .endpoint = x->ep,
                          .segment_id = "00000000000000aa", .offset = 0, .local = buf,
                          .len = sizeof(buf), .cap = &cap};
    assert_int_equal(moonlet_xfer_submit(x->c, &op, 1), MOONLET_ERR_TRANSFER_FAIL);
    uint64_t took = moonlet_mono_ms() - t0;
    assert_true(took >= 250);
    assert_true(took < 2000);

    /* The only pooled connection is busy (a read stalled on the fake): the
     * write waits for it no longer than its deadline. */
    pthread_t th;
    busy_read_args ra = {.c = x->c, .ep = x->ep};
    assert_int_equal(pthread_create(&th, NULL, busy_read, &ra), 0);
    while (__atomic_load_n(&x->f.headers_seen, __ATOMIC_SEQ_CST) < 2 && moonlet_mono_ms() < t0 + 5000)
        usleep(1000); /* bounded: the read's header reached the fake */
    t0 = moonlet_mono_ms();
    cap.deadline_ms = t0 + 300;
    assert_int_equal(moonlet_xfer_submit(x->c, &op, 1), MOONLET_ERR_TRANSFER_FAIL);
    took = moonlet_mono_ms() - t0;
    assert_true(took >= 250);
    assert_true(took < 1500); /* not the 3 s the read holds the connection */
    pthread_join(th, NULL);
    assert_int_equal(ra.rc, MOONLET_ERR_TRANSFER_FAIL);
}

int main(void)
{
    moonlet_log_set_level(MOONLET_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec),
        cmocka_unit_test(test_reader_segment),
        cmocka_unit_test_setup_teardown(test_server_checks, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_malformed_closes_only_its_connection, server_setup, server_teardown),
        cmocka_unit_test(test_raw_auth),
        cmocka_unit_test(test_replayed_auth_refused),
        cmocka_unit_test(test_extra_auth_keys),
        cmocka_unit_test(test_bogus_header_gets_no_payload_time),
        cmocka_unit_test(test_preauth_deadline),
        cmocka_unit_test(test_peer_key_ipv6_64),
        cmocka_unit_test(test_peer_cap_ipv4),
        cmocka_unit_test(test_peer_closes_mid_transfer),
        cmocka_unit_test(test_peer_stalls),
        cmocka_unit_test(test_peer_answers_nonsense),
        cmocka_unit_test(test_unreachable),
        FAKE_TEST(test_reissue_after_peer_drops, FAKE_DROP_FIRST, 2000),
        FAKE_TEST(test_access_error_not_reissued, FAKE_NOT_FOUND, 2000),
        FAKE_TEST(test_write_past_deadline_not_reissued, FAKE_STALL, 2000),
        cmocka_unit_test(test_idle_close_is_invisible_to_clients),
        cmocka_unit_test(test_pool_cap_evicts_lru),
        cmocka_unit_test_setup_teardown(test_write_capabilities, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_capability_epochs, server_setup, server_teardown),
        cmocka_unit_test_setup_teardown(test_write_capability_expires_mid_payload, server_setup, server_teardown),
        FAKE_TEST(test_client_write_deadline, FAKE_STALL, 3000),
    };
    return cmocka_run_group_tests_name("xfer tcp wire", tests, NULL, NULL);
}
