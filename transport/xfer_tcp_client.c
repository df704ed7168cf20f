/*
 * xfer_tcp_client.c - the client side of the TCP data plane (xfer.h):
 * opening (and authenticating) connections, and running a batch of
 * transfers over them.
 *
 * A connection is a non-blocking socket (opened by transport/net.c with a
 * deadline).  run() drives all the lanes of a batch from the calling thread
 * with poll(): requests are pipelined (many headers and write payloads
 * gathered into one sendmsg), replies are read in order, read payloads land
 * directly in the caller's buffer.  A lane with no progress for timeout_ms
 * (counted from when its batch began waiting for the connection: a transfer
 * that queued behind another on a stuck node gets no second timeout;
 * progress is reply bytes received and write payload sent, never requests
 * alone),
 * a closed socket or a reply that does not match fails its remaining
 * operations with TRANSFER_FAIL (a closed or reset socket also marks them
 * conn_failed, for xfer.c's one reissue on a fresh connection).  A lane
 * holding a write past its writer's deadline (moonlet_xfer_cap) is aborted
 * with a reset (SO_LINGER 0), so bytes still queued are dropped.
 *
 * Locks: none.  Client connections are owned by one batch at a time
 * (xfer.c's pool); a batch runs on the calling thread.
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
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "cred.h"
#include "log.h"
#include "moonlet/error.h"
#include "net.h"
#include "writecap.h"

#define MOD "xfer-tcp"

#define TCP_PIPELINE_WINDOW 64 /* requests in flight per connection */
#define TCP_GATHER_IOVS 64     /* iovecs per client sendmsg */
#define TCP_REQ_BYTES (MOONLET_XFER_TCP_HDR_BYTES + MOONLET_XFER_TCP_CAP_BYTES)

/* ---- client side: connections ------------------------------------------- */

typedef struct tcp_cconn {
    int fd;
    uint64_t next_req;
    char endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1];
} tcp_cconn;


/* Sends a request header (and its payload) and reads the reply header for
 * it: 0, or TRANSFER_FAIL when the exchange fails or the reply is not for it. */
static int tcp_exchange(tcp_cconn *c, const moonlet_xfer_tcp_hdr *h, const void *payload,
                        uint64_t deadline_ms, moonlet_xfer_tcp_hdr *r)
{
    uint8_t buf[MOONLET_XFER_TCP_HDR_BYTES];
    moonlet_xfer_tcp_hdr_encode(h, buf);
    if (moonlet_net_io_by(c->fd, true, buf, sizeof(buf), deadline_ms) ||
        (h->length && moonlet_net_io_by(c->fd, true, (void *)payload, (size_t)h->length,
                                        deadline_ms)) ||
        moonlet_net_io_by(c->fd, false, buf, sizeof(buf), deadline_ms))
        return MOONLET_ERR_TRANSFER_FAIL;
    if (moonlet_xfer_tcp_hdr_decode(buf, r) || r->op != (h->op | MOONLET_XFER_TCP_REPLY) ||
        r->req_id != h->req_id)
        return MOONLET_ERR_TRANSFER_FAIL;
    return MOONLET_OK;
}

/* Authenticates by challenge-response (xfer_tcp.h): CHALLENGE for the
 * server's nonce, then AUTH with a nonce of ours and the MAC of both under
 * our token's key.  The token itself is never sent. */
static int tcp_authenticate(moonlet_xfer *x, tcp_cconn *c, uint64_t deadline_ms)
{
    moonlet_xfer_tcp_hdr h = {.op = MOONLET_XFER_TCP_CHALLENGE, .req_id = c->next_req++}, r;
    uint8_t snonce[MOONLET_XFER_TCP_NONCE_BYTES];
    int rc = tcp_exchange(c, &h, NULL, deadline_ms, &r);
    if (rc)
        return rc;
    if (r.status)
        return r.status == MOONLET_ERR_ILLEGAL_CLIENT ? r.status : MOONLET_ERR_TRANSFER_FAIL;
    if (r.length != sizeof(snonce) ||
        moonlet_net_io_by(c->fd, false, snonce, sizeof(snonce), deadline_ms))
        return MOONLET_ERR_TRANSFER_FAIL;
    uint8_t proof[MOONLET_XFER_TCP_MAC_AUTH_BYTES]; /* our nonce, then the MAC */
    moonlet_cred_nonce(proof);
    moonlet_cred_mac(x->auth_key, "tcp", snonce, proof, proof + MOONLET_XFER_TCP_NONCE_BYTES);
    h = (moonlet_xfer_tcp_hdr){.op = MOONLET_XFER_TCP_AUTH, .flags = MOONLET_XFER_TCP_F_MAC,
                               .req_id = c->next_req++, .length = sizeof(proof)};
    rc = tcp_exchange(c, &h, proof, deadline_ms, &r);
    explicit_bzero(proof, sizeof(proof));
    if (rc)
        return rc;
    return r.status == MOONLET_OK ? MOONLET_OK : MOONLET_ERR_ILLEGAL_CLIENT;
}

int moonlet_xfer_tcp_conn_open(moonlet_xfer *x, const char *endpoint, uint64_t deadline_ms,
                               void **out)
{
    char host[256];
    uint16_t port;
    if (moonlet_net_split_hostport(endpoint, host, sizeof(host), &port))
        return MOONLET_ERR_INVALID_PARAMS;
    uint64_t deadline = moonlet_xfer_now_ms() + x->timeout_ms;
    if (deadline_ms && deadline_ms < deadline)
        deadline = deadline_ms; /* the batch's: its wait for the connection counts */
    int fd = moonlet_net_connect_tcp(host, port, deadline, TCP_SOCKBUF_BYTES);
    if (fd < 0) {
        if (fd != MOONLET_NET_EADDR)
            ML_WARN(MOD, "cannot connect to %s: %s", endpoint,
                    fd == MOONLET_NET_ETIMEDOUT ? "timed out" : strerror(errno));
        return MOONLET_ERR_TRANSFER_FAIL;
    }
    tcp_cconn *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    c->fd = fd;
    c->next_req = 1;
    snprintf(c->endpoint, sizeof(c->endpoint), "%s", endpoint);
    int rc = x->token ? tcp_authenticate(x, c, deadline) : MOONLET_OK;
    if (rc) {
        ML_WARN(MOD, "authentication to %s failed: %s", endpoint, moonlet_strerror(rc));
        close(fd);
        free(c);
        return rc;
    }
    *out = c;
    return MOONLET_OK;
}

/* An idle pooled connection never has anything to read: readable means the
 * server closed it (its idle timeout, a restart), so it must not be reused. */
bool moonlet_xfer_tcp_conn_stale(moonlet_xfer *x, void *conn)
{
    tcp_cconn *c = conn;
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
    return poll(&p, 1, 0) != 0;
}

void moonlet_xfer_tcp_conn_close(moonlet_xfer *x, void *conn)
{
    tcp_cconn *c = conn;
    close(c->fd);
    free(c);
}

/* ---- client side: running a batch --------------------------------------- */

/* Progress of one lane: requests are sent ahead of replies (up to the
 * pipeline window); replies are parsed in order. */
typedef struct tcp_lane_run {
    xfer_lane *lane;
    tcp_cconn *c;
    uint8_t (*hdrs)[TCP_REQ_BYTES]; /* encoded request (+ capability) per item */
    uint64_t *req_ids;
    size_t send_i;     /* first item not fully sent */
    uint64_t send_off; /* bytes of item send_i already sent (header + payload) */
    size_t recv_i;     /* item whose reply is next */
    uint8_t rhdr[MOONLET_XFER_TCP_HDR_BYTES];
    size_t rhdr_got;
    bool in_payload;
    uint64_t rpay_got;
    uint64_t last_progress;
    bool done;
} tcp_lane_run;

static void tcp_lane_fail(tcp_lane_run *r, int status, const char *why)
{
    if (status == MOONLET_ERR_TRANSFER_FAIL)
        ML_WARN(MOD, "transfer to %s failed: %s", r->c->endpoint, why);
    for (size_t i = r->recv_i; i < r->lane->nitems; i++)
        r->lane->items[i]->op->status = status;
    r->lane->broken = true;
    r->done = true;
}

/* The connection itself failed (EOF, reset, send error): the unanswered
 * operations are marked for one reissue on a fresh connection (xfer.c). */
static void tcp_lane_conn_lost(tcp_lane_run *r, const char *why)
{
    size_t first = r->recv_i;
    tcp_lane_fail(r, MOONLET_ERR_TRANSFER_FAIL, why);
    for (size_t i = first; i < r->lane->nitems; i++)
        r->lane->items[i]->conn_failed = true;
}

/* Whether a write sends a capability: only a real one (tag 0 is "none", as
 * the master reports for a segment without a key), so a node that predates
 * capabilities is never sent the F_CAP flag it would not decode. */
static bool tcp_op_has_cap(const moonlet_xfer_op *op)
{
    return op->opcode == MOONLET_XFER_WRITE && op->cap && op->cap->tag;
}

static uint64_t tcp_op_deadline(const moonlet_xfer_op *op)
{
    return op->opcode == MOONLET_XFER_WRITE && op->cap ? op->cap->deadline_ms : 0;
}

/* Bytes of an item's request before its payload: the header (+ capability). */
static uint64_t tcp_req_len(const moonlet_xfer_op *op)
{
    return MOONLET_XFER_TCP_HDR_BYTES + (tcp_op_has_cap(op) ? MOONLET_XFER_TCP_CAP_BYTES : 0);
}

static uint64_t tcp_item_stream_len(const xfer_item *it)
{
    return tcp_req_len(it->op) + (it->op->opcode == MOONLET_XFER_WRITE ? it->op->len : 0);
}

static void tcp_encode_requests(tcp_lane_run *r)
{
    for (size_t i = 0; i < r->lane->nitems; i++) {
        const xfer_item *it = r->lane->items[i];
        moonlet_xfer_tcp_hdr h = {
            .op = it->op->opcode == MOONLET_XFER_READ ? MOONLET_XFER_TCP_READ
                                                      : MOONLET_XFER_TCP_WRITE,
            .req_id = r->c->next_req++, .segment = it->seg, .offset = it->op->offset,
            .length = it->op->len};
        r->req_ids[i] = h.req_id;
        if (tcp_op_has_cap(it->op)) {
            const moonlet_xfer_cap *cap = it->op->cap;
            h.flags = MOONLET_XFER_TCP_F_CAP;
            moonlet_xfer_tcp_cap_encode(&(moonlet_xfer_tcp_cap){.offset = cap->offset,
                                                                .len = cap->len,
                                                                .expiry_ms = cap->expiry_ms,
                                                                .tag = cap->tag},
                                        r->hdrs[i] + MOONLET_XFER_TCP_HDR_BYTES);
        }
        moonlet_xfer_tcp_hdr_encode(&h, r->hdrs[i]);
    }
}

/* Gathers the unsent bytes of items send_i.. (within the window) into iov. */
static int tcp_gather(tcp_lane_run *r, struct iovec *iov)
{
    int n = 0;
    uint64_t skip = r->send_off;
    for (size_t i = r->send_i; i < r->lane->nitems && i < r->recv_i + TCP_PIPELINE_WINDOW &&
                               n + 2 <= TCP_GATHER_IOVS;
         i++) {
        const moonlet_xfer_op *op = r->lane->items[i]->op;
        uint64_t hlen = tcp_req_len(op);
        uint64_t hskip = skip < hlen ? skip : hlen;
        if (hskip < hlen)
            iov[n++] = (struct iovec){r->hdrs[i] + hskip, (size_t)(hlen - hskip)};
        if (op->opcode == MOONLET_XFER_WRITE) {
            uint64_t pskip = skip - hskip;
            iov[n++] = (struct iovec){(uint8_t *)op->local + pskip, (size_t)(op->len - pskip)};
        }
        skip = 0;
    }
    return n;
}

/* Marks `sent` bytes as sent, advancing send_i / send_off.  Returns whether
 * any of them were write payload: requests alone are no progress (a stalled
 * peer's kernel takes them as readily as a live peer's). */
static bool tcp_advance_send(tcp_lane_run *r, uint64_t sent)
{
    bool payload = false;
    while (sent) {
        uint64_t hlen = tcp_req_len(r->lane->items[r->send_i]->op);
        uint64_t left = tcp_item_stream_len(r->lane->items[r->send_i]) - r->send_off;
        uint64_t take = sent < left ? sent : left;
        payload |= r->send_off + take > hlen;
        if (sent < left) {
            r->send_off += sent;
            return payload;
        }
        sent -= left;
        r->send_i++;
        r->send_off = 0;
    }
    return payload;
}

static int tcp_recv_step(tcp_lane_run *r, bool *progress);

/* Sends as much as the socket takes.  0, or -1 when the lane failed. */
static int tcp_send_step(tcp_lane_run *r, bool *progress)
{
    while (r->send_i < r->lane->nitems && r->send_i < r->recv_i + TCP_PIPELINE_WINDOW) {
        struct iovec iov[TCP_GATHER_IOVS];
        int n = tcp_gather(r, iov);
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(r->c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return 0;
            int err = errno;
            bool ignored;
            /* The peer may have refused us (ILLEGAL_CLIENT) before closing. */
            if (tcp_recv_step(r, &ignored) == 0)
                tcp_lane_conn_lost(r, strerror(err));
            return -1;
        }
        if (tcp_advance_send(r, (uint64_t)w))
            *progress = true;
    }
    return 0;
}

/* Checks a complete reply header against the request it answers. */
static int tcp_check_reply(tcp_lane_run *r, const moonlet_xfer_tcp_hdr *h)
{
    const moonlet_xfer_op *op = r->lane->items[r->recv_i]->op;
    uint8_t want = (uint8_t)((op->opcode == MOONLET_XFER_READ ? MOONLET_XFER_TCP_READ
                                                               : MOONLET_XFER_TCP_WRITE) |
                             MOONLET_XFER_TCP_REPLY);
    if (h->op != want || h->req_id != r->req_ids[r->recv_i] || h->status > 0)
        return -1;
    uint64_t want_len = h->status == 0 && op->opcode == MOONLET_XFER_READ ? op->len : 0;
    return h->length == want_len ? 0 : -1;
}

static void tcp_complete_item(tcp_lane_run *r, int status)
{
    r->lane->items[r->recv_i]->op->status = status;
    r->recv_i++;
    r->rhdr_got = 0;
    r->in_payload = false;
    r->rpay_got = 0;
    if (r->recv_i == r->lane->nitems)
        r->done = true;
}

/* Handles a complete reply header.  0, or -1 when the lane failed. */
static int tcp_on_reply_header(tcp_lane_run *r)
{
    moonlet_xfer_tcp_hdr h;
    if (moonlet_xfer_tcp_hdr_decode(r->rhdr, &h) || tcp_check_reply(r, &h)) {
        tcp_lane_fail(r, MOONLET_ERR_TRANSFER_FAIL, "reply does not match its request");
        return -1;
    }
    if (h.status == MOONLET_ERR_ILLEGAL_CLIENT) {
        tcp_lane_fail(r, MOONLET_ERR_ILLEGAL_CLIENT, "not authenticated");
        return -1;
    }
    if (h.status || h.length == 0)
        tcp_complete_item(r, h.status);
    else
        r->in_payload = true;
    return 0;
}

/* Reads whatever replies have arrived.  0, or -1 when the lane failed. */
static int tcp_recv_step(tcp_lane_run *r, bool *progress)
{
    while (!r->done && (r->recv_i < r->send_i || (r->recv_i == r->send_i && r->send_off))) {
        ssize_t got;
        if (!r->in_payload) {
            got = recv(r->c->fd, r->rhdr + r->rhdr_got, sizeof(r->rhdr) - r->rhdr_got,
                       MSG_DONTWAIT);
        } else {
            moonlet_xfer_op *op = r->lane->items[r->recv_i]->op;
            uint64_t left = op->len - r->rpay_got;
            got = recv(r->c->fd, (uint8_t *)op->local + r->rpay_got,
                       left > (1u << 30) ? (1u << 30) : (size_t)left, MSG_DONTWAIT);
        }
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
            tcp_lane_conn_lost(r, got == 0 ? "connection closed by peer" : strerror(errno));
            return -1;
        }
        if (got < 0)
            return 0;
        *progress = true;
        if (!r->in_payload) {
            r->rhdr_got += (size_t)got;
            if (r->rhdr_got == sizeof(r->rhdr) && tcp_on_reply_header(r))
                return -1;
        } else {
            r->rpay_got += (uint64_t)got;
            if (r->rpay_got == r->lane->items[r->recv_i]->op->len)
                tcp_complete_item(r, MOONLET_OK);
        }
    }
    return 0;
}

/* The earliest writer deadline among the lane's unfinished writes; 0: none. */
static uint64_t tcp_lane_deadline(const tcp_lane_run *r)
{
    uint64_t best = 0;
    for (size_t i = r->recv_i; i < r->lane->nitems; i++) {
        uint64_t dl = tcp_op_deadline(r->lane->items[i]->op);
        if (dl && (!best || dl < best))
            best = dl;
    }
    return best;
}

/* A write passed its writer's deadline: the master may give its range away
 * from then on.  The connection is closed with a reset (SO_LINGER 0), so the
 * bytes still in our socket buffer are dropped rather than sent late. */
static void tcp_lane_abort(tcp_lane_run *r)
{
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(r->c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    tcp_lane_fail(r, MOONLET_ERR_TRANSFER_FAIL, "write deadline passed (aborted with a reset)");
}

/* One non-blocking pass over a lane; checks its inactivity deadline. */
static void tcp_lane_step(moonlet_xfer *x, tcp_lane_run *r, uint64_t now)
{
    uint64_t dl = tcp_lane_deadline(r);
    if (dl && now >= dl) {
        tcp_lane_abort(r);
        return;
    }
    bool progress = false;
    if (tcp_send_step(r, &progress) == 0 && tcp_recv_step(r, &progress) == 0 && !r->done) {
        if (progress)
            r->last_progress = now;
        else if (now - r->last_progress >= x->timeout_ms)
            tcp_lane_fail(r, MOONLET_ERR_TRANSFER_FAIL, "timed out");
    }
}

/* Milliseconds poll() may sleep before some lane's deadline. */
static int tcp_poll_timeout(moonlet_xfer *x, tcp_lane_run *runs, size_t n, uint64_t now)
{
    uint64_t best = x->timeout_ms;
    for (size_t i = 0; i < n; i++) {
        if (runs[i].done)
            continue;
        uint64_t end = runs[i].last_progress + x->timeout_ms;
        uint64_t dl = tcp_lane_deadline(&runs[i]);
        if (dl && dl < end)
            end = dl;
        uint64_t left = end > now ? end - now : 0;
        if (left < best)
            best = left;
    }
    return (int)best;
}

static void tcp_run_loop(moonlet_xfer *x, tcp_lane_run *runs, struct pollfd *pfds, size_t n)
{
    for (;;) {
        uint64_t now = moonlet_xfer_now_ms();
        size_t active = 0;
        for (size_t i = 0; i < n; i++) {
            if (!runs[i].done)
                tcp_lane_step(x, &runs[i], now);
            pfds[i].fd = runs[i].done ? -1 : runs[i].c->fd;
            pfds[i].events = POLLIN;
            if (!runs[i].done && runs[i].send_i < runs[i].lane->nitems &&
                runs[i].send_i < runs[i].recv_i + TCP_PIPELINE_WINDOW)
                pfds[i].events |= POLLOUT;
            active += !runs[i].done;
        }
        if (!active)
            return;
        int rc = poll(pfds, n, tcp_poll_timeout(x, runs, n, now));
        if (rc < 0 && errno != EINTR) {
            for (size_t i = 0; i < n; i++)
                if (!runs[i].done)
                    tcp_lane_fail(&runs[i], MOONLET_ERR_TRANSFER_FAIL, strerror(errno));
            return;
        }
    }
}

void moonlet_xfer_tcp_run(moonlet_xfer *x, xfer_lane *lanes, size_t nlanes)
{
    size_t total = 0;
    for (size_t i = 0; i < nlanes; i++)
        total += lanes[i].nitems;
    tcp_lane_run *runs = calloc(nlanes, sizeof(*runs));
    struct pollfd *pfds = calloc(nlanes, sizeof(*pfds));
    uint8_t (*hdrs)[TCP_REQ_BYTES] = calloc(total, sizeof(*hdrs));
    uint64_t *ids = calloc(total, sizeof(*ids));
    if (!runs || !pfds || !hdrs || !ids) {
        for (size_t i = 0; i < nlanes; i++)
            for (size_t k = 0; k < lanes[i].nitems; k++)
                lanes[i].items[k]->op->status = MOONLET_ERR_INTERNAL_ERROR;
    } else {
        uint64_t now = moonlet_xfer_now_ms();
        size_t pos = 0;
        for (size_t i = 0; i < nlanes; i++) {
            /* silence counts from when the batch began waiting for the connection */
            uint64_t since = lanes[i].since_ms && lanes[i].since_ms < now ? lanes[i].since_ms : now;
            runs[i] = (tcp_lane_run){.lane = &lanes[i], .c = lanes[i].conn, .hdrs = &hdrs[pos],
                                     .req_ids = &ids[pos], .last_progress = since};
            pos += lanes[i].nitems;
            tcp_encode_requests(&runs[i]);
        }
        tcp_run_loop(x, runs, pfds, nlanes);
    }
    free(runs);
    free(pfds);
    free(hdrs);
    free(ids);
}
