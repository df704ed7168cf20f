/*
 * rpc_client.c - a blocking control-plane RPC connection (TCP or unix).
 *
 * Why it is built this way: the socket is non-blocking and every wait goes
 * through poll() with the time left until one deadline, so connect, send and
 * receive are all bounded by opts.timeout_ms.  Requests are packed straight
 * into a reused frame builder (no per-call buffer), and replies are read
 * into a reused input buffer that may hold several pipelined replies.  Each
 * decoded reply owns a private copy of its body (moonlet_reply_decode), so a
 * caller may keep several pipelined replies while reading more.  After a
 * timeout or an I/O or framing error the stream position is unknown (a late
 * reply would be taken for the next one), so the connection is marked broken
 * and refuses every later call; the owner reconnects.
 *
 * Not thread safe; takes no locks (MasterClient serialises access).
 */
#include "rpc_client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "frame.h"
#include "moonlet/error.h"
#include "wire.h"
#include "monotime.h"
#include "net.h"
#include "spare_core.h"
#include "tls.h"

#define MOD "rpc-client"
#define DEFAULT_TIMEOUT_MS 10000
#define IN_BUF_INITIAL (16u << 10)
#define IN_BUF_KEEP (1u << 20)
#define UNIX_RETRY_MS 2

struct moonlet_rpc_client {
    int fd;
    moonlet_tls *tls; /* NULL: plaintext */
    int timeout_ms;
    size_t max_frame;
    bool broken;
    bool begun;
    uint64_t next_id;
    moonlet_frame_builder out;
    char *in;
    size_t in_off, in_len, in_cap;
    int64_t wait_ewma_ns; /* how long replies took to start arriving */
    uint64_t contended_waits; /* waits that slept because the core was wanted */
};

/* Signed view of common/monotime.h, for deadline arithmetic. */
static int64_t now_ms(void)
{
    return (int64_t)moonlet_mono_ms();
}

/* Waits for `ev` on fd until the deadline: 0, RPC_TIMEOUT or RPC_FAIL. */
static int wait_fd(int fd, short ev, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return MOONLET_ERR_RPC_TIMEOUT;
        struct pollfd p = {.fd = fd, .events = ev};
        int n = poll(&p, 1, (int)(left > 1000000 ? 1000000 : left));
        if (n > 0)
            return 0; /* readiness or an error condition: the next syscall tells */
        if (n < 0 && errno != EINTR)
            return MOONLET_ERR_RPC_FAIL;
    }
}

/*
 * Waiting for a reply.  On loopback or a LAN a reply comes within tens to
 * hundreds of microseconds, and the wake-up of a thread that slept in
 * poll() is a large share of that (tens of microseconds on a VM, where an
 * idle vCPU is woken by an inter-processor interrupt).  So a wait first
 * polls the socket without sleeping, for about twice as long as this
 * connection's recent waits took (an EWMA), at least SPIN_MIN_NS and at
 * most SPIN_MAX_NS; a connection whose replies take longer than
 * SPIN_MAX_NS (large transfers, a slow peer) spins SPIN_MIN_NS only.  Each
 * round yields the CPU.
 *
 * Spinning only pays while the host has a core to spare.  When it has
 * not (more runnable threads than cores: many callers, or other jobs), a
 * spinning caller takes a share of the cores, and yielding does not hand
 * that share to the server: sched_yield() only lets the threads queued on
 * the caller's own core run, which may be other spinning callers, while the
 * server's thread waits for a core on the other run queue (measured with
 * `perf sched timehist`: docs/benchmarks.md, "The master under many
 * clients").  So the spin watches for it in two ways, and a caller that
 * sees either stops spinning and sleeps in poll(); a sleeping caller
 * leaves its core idle, and an idle core pulls waiting threads over:
 *  - the host has no core to spare (more runnable threads than cores,
 *    common/spare_core.h), asked before the spin and every SPIN_RECHECK
 *    rounds.  This catches a server thread waiting on another core's run
 *    queue, which the caller's own yields never see: with 8 callers of one
 *    process on 2 cores it took the master's BatchExistKey p99 from about 4
 *    ms to under 1.  A lone caller (no other thread of its process
 *    waiting for a reply) is allowed one runnable thread more than cores:
 *    that one is most likely the server or relay it waits for, which its
 *    yields let run (the DummyClient's caller -> RealClient -> master keeps
 *    three threads runnable on two cores, and lost 33-50 us a call without
 *    the slack);
 *  - a yield did switch to another thread (the thread's involuntary
 *    context switches went up, getrusage(RUSAGE_THREAD)): the caller's own
 *    core is wanted.
 * The next wait asks again (remembering the contention for a while, 5 ms of
 * waits, was tried: short calls such as a put's PutStart then paid a
 * wake-up each and put+get under load got slower).  A lone caller on an
 * idle host keeps its spin.  Figures: docs/benchmarks.md, "Client layers"
 * and "The master under many clients".
 */
#define SPIN_MIN_NS 50000
#define SPIN_MAX_NS 500000
#define WAIT_EWMA_SHIFT 3 /* new = old + (sample - old) / 8 */
#define SPIN_RECHECK 8    /* rounds between two looks at the host's cores */

static int64_t now_ns(void)
{
    return (int64_t)moonlet_mono_ns();
}

static int64_t spin_budget_ns(const moonlet_rpc_client *c)
{
    int64_t w = c->wait_ewma_ns;
    if (w > SPIN_MAX_NS)
        return SPIN_MIN_NS;
    w *= 2;
    return w < SPIN_MIN_NS ? SPIN_MIN_NS : w > SPIN_MAX_NS ? SPIN_MAX_NS : w;
}

enum { SPIN_INPUT, SPIN_BUDGET_OUT, SPIN_CONTENDED };

/* Threads of this process waiting for a reply (spinning or asleep), on any
 * connection. */
static atomic_int g_waiting;

/* Polls fd without sleeping until input (or EOF/error) is there, the
 * budget has run out, or the core is wanted: the host has none to spare, or
 * a yield ran another thread. */
static int spin_for_input(int fd, int64_t t0, int64_t budget_ns)
{
    long switches = moonlet_thread_preemptions();
    for (unsigned round = 0;; round++) {
        char b;
        ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return SPIN_INPUT;
        if (now_ns() - t0 > budget_ns)
            return SPIN_BUDGET_OUT;
        if (round % SPIN_RECHECK == 0 && !moonlet_core_to_spare(atomic_load(&g_waiting) == 1))
            return SPIN_CONTENDED;
        sched_yield();
        long now_switches = moonlet_thread_preemptions();
        if (now_switches != switches)
            return SPIN_CONTENDED;
    }
}

/* Waits for input until the deadline, spinning first: 0, RPC_TIMEOUT or
 * RPC_FAIL.  Learns how long waits take on this connection. */
static int wait_input(moonlet_rpc_client *c, int64_t deadline)
{
    int64_t t0 = now_ns();
    atomic_fetch_add_explicit(&g_waiting, 1, memory_order_relaxed);
    if (c->tls && moonlet_tls_pending(c->tls) > 0)
        return 0; /* decrypted already: poll would not see it */
    int spun = spin_for_input(c->fd, t0, spin_budget_ns(c));
    if (spun == SPIN_CONTENDED)
        c->contended_waits++;
    int rc = spun == SPIN_INPUT ? 0 : wait_fd(c->fd, POLLIN, deadline);
    atomic_fetch_sub_explicit(&g_waiting, 1, memory_order_relaxed);
    if (rc == 0)
        c->wait_ewma_ns += (now_ns() - t0 - c->wait_ewma_ns) / (1 << WAIT_EWMA_SHIFT);
    return rc;
}

static int fail(moonlet_rpc_client *c, int rc)
{
    c->broken = true;
    return rc;
}

/* The code for an I/O failure (errno set by the failed call): a TLS peer
 * that refused this client's certificate is ILLEGAL_CLIENT, said once. */
static int tls_failure(moonlet_rpc_client *c)
{
    if (c->tls == NULL || (errno != EACCES && errno != EPROTO))
        return MOONLET_ERR_RPC_FAIL;
    bool refused = errno == EACCES;
    ML_WARN(MOD, "TLS: %s", moonlet_tls_error(c->tls));
    return refused ? MOONLET_ERR_ILLEGAL_CLIENT : MOONLET_ERR_RPC_FAIL;
}

/* ------------------------------------------------------------------ */
/* Connecting                                                           */
/* ------------------------------------------------------------------ */

static int connect_tcp(const char *host, uint16_t port, int64_t deadline)
{
    int fd = moonlet_net_connect_tcp(host, port, deadline > 0 ? (uint64_t)deadline : 0, 0);
    if (fd >= 0)
        return fd;
    return fd == MOONLET_NET_ETIMEDOUT ? MOONLET_ERR_RPC_TIMEOUT : MOONLET_ERR_RPC_FAIL;
}

/* A unix connect fails with EAGAIN while the listen backlog is full: retry. */
static int connect_unix(const char *path, int64_t deadline)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return MOONLET_ERR_INVALID_PARAMS;
    strcpy(sa.sun_path, path);
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return MOONLET_ERR_RPC_FAIL;
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
            return fd;
        int err = errno;
        close(fd);
        if (err != EAGAIN)
            return MOONLET_ERR_RPC_FAIL;
        if (now_ms() + UNIX_RETRY_MS >= deadline)
            return MOONLET_ERR_RPC_TIMEOUT;
        poll(NULL, 0, UNIX_RETRY_MS);
    }
}

/* The reply's code after a call or recv that returned rc. */
static int reply_code(int rc, moonlet_reply *rep)
{
    if (rc != 0)
        return rc;
    rc = rep->code;
    moonlet_reply_destroy(rep);
    return rc;
}

int moonlet_rpc_client_call_code(moonlet_rpc_client *c)
{
    moonlet_reply rep;
    return reply_code(moonlet_rpc_client_call(c, &rep), &rep);
}

int moonlet_rpc_client_recv_code(moonlet_rpc_client *c)
{
    moonlet_reply rep;
    return reply_code(moonlet_rpc_client_recv(c, &rep), &rep);
}

static int authenticate(moonlet_rpc_client *c, const char *token, size_t len)
{
    msgpack_packer *pk = moonlet_rpc_client_begin(c, MOONLET_RPC_AUTH, 1);
    moonlet_pack_str(pk, token, len);
    return moonlet_rpc_client_call_code(c);
}

/* The TLS handshake on a new connection to host: 0 or the error to return. */
static int start_tls(moonlet_rpc_client *c, const moonlet_rpc_client_opts *opts,
                     const char *host, int64_t deadline)
{
    const char *name = opts->tls_name ? opts->tls_name : host;
    if (moonlet_tls_new(opts->tls, c->fd, name, &c->tls) != 0)
        return MOONLET_ERR_INTERNAL_ERROR;
    if (moonlet_tls_handshake_by(c->tls, deadline > 0 ? (uint64_t)deadline : 0) == 0)
        return 0;
    int err = errno;
    ML_WARN(MOD, "TLS with %s failed: %s%s", host, moonlet_tls_error(c->tls),
            err == EPROTO ? " (does the server speak TLS?)" : "");
    return err == ETIMEDOUT ? MOONLET_ERR_RPC_TIMEOUT
           : err == EACCES  ? MOONLET_ERR_ILLEGAL_CLIENT
                            : MOONLET_ERR_RPC_FAIL;
}

static int client_open(int fd, const moonlet_rpc_client_opts *opts, const char *tls_host,
                       int64_t deadline, moonlet_rpc_client **out)
{
    moonlet_rpc_client *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    c->fd = fd;
    c->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
    c->max_frame = opts && opts->max_frame ? opts->max_frame : MOONLET_DEFAULT_MAX_FRAME;
    if (c->max_frame > UINT32_MAX)
        c->max_frame = UINT32_MAX;
    c->next_id = 1;
    moonlet_frame_builder_init(&c->out);
    const char *tok = opts ? opts->auth_token : NULL;
    size_t tok_len = tok ? (opts->auth_token_len ? opts->auth_token_len : strlen(tok)) : 0;
    bool tls = opts && opts->tls && tls_host;
    if (tls) {
        int rc = start_tls(c, opts, tls_host, deadline);
        if (rc != 0) {
            moonlet_rpc_client_close(c);
            return rc;
        }
    }
    if (tok_len > 0 || tls) {
        int rc = authenticate(c, tok ? tok : "", tok_len);
        if (rc != 0) {
            moonlet_rpc_client_close(c);
            return rc;
        }
    }
    *out = c;
    return 0;
}

static int64_t connect_deadline(const moonlet_rpc_client_opts *opts)
{
    return now_ms() + (opts && opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS);
}

int moonlet_rpc_client_connect(const char *host, uint16_t port, const moonlet_rpc_client_opts *opts,
                               moonlet_rpc_client **out)
{
    if (host == NULL || out == NULL)
        return MOONLET_ERR_INVALID_PARAMS;
    *out = NULL;
    int64_t deadline = connect_deadline(opts);
    int fd = connect_tcp(host, port, deadline);
    return fd < 0 ? fd : client_open(fd, opts, host, deadline, out);
}

int moonlet_rpc_client_connect_unix(const char *path, const moonlet_rpc_client_opts *opts,
                                    moonlet_rpc_client **out)
{
    if (path == NULL || out == NULL)
        return MOONLET_ERR_INVALID_PARAMS;
    *out = NULL;
    int fd = connect_unix(path, connect_deadline(opts));
    return fd < 0 ? fd : client_open(fd, opts, NULL, 0, out);
}

void moonlet_rpc_client_close(moonlet_rpc_client *c)
{
    if (c == NULL)
        return;
    if (c->tls && !c->broken)
        moonlet_tls_shutdown(c->tls);
    moonlet_tls_free(c->tls);
    close(c->fd);
    moonlet_frame_builder_destroy(&c->out);
    free(c->in);
    free(c);
}

/* ------------------------------------------------------------------ */
/* Sending                                                              */
/* ------------------------------------------------------------------ */

msgpack_packer *moonlet_rpc_client_begin(moonlet_rpc_client *c, uint32_t method, uint32_t nargs)
{
    moonlet_frame_builder_reset(&c->out);
    c->begun = true;
    return moonlet_request_begin(&c->out, c->next_id, method, nargs);
}

/* send() of one chunk; with pass_fd >= 0 the chunk carries that descriptor. */
static ssize_t send_chunk(int sock, const char *p, size_t len, int pass_fd)
{
    if (pass_fd < 0)
        return send(sock, p, len, MSG_NOSIGNAL);
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cbuf;
    memset(&cbuf, 0, sizeof(cbuf));
    struct iovec iov = {.iov_base = (void *)p, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.b,
                        .msg_controllen = sizeof(cbuf.b)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    return sendmsg(sock, &mh, MSG_NOSIGNAL);
}

/* Sends len bytes; the first chunk that leaves carries pass_fd (when >= 0). */
static int send_all(moonlet_rpc_client *c, const char *p, size_t len, int pass_fd,
                    int64_t deadline)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = c->tls ? moonlet_tls_write(c->tls, p + off, len - off)
                           : send_chunk(c->fd, p + off, len - off, pass_fd);
        if (n > 0) {
            off += (size_t)n;
            pass_fd = -1; /* the kernel delivers it with the first byte */
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return fail(c, tls_failure(c));
        int rc = wait_fd(c->fd, c->tls ? moonlet_tls_want(c->tls) : POLLOUT, deadline);
        if (rc != 0)
            return fail(c, rc);
    }
    return 0;
}

/* Finishes and sends the begun request.  A request that is too large or not
 * well formed is dropped without touching the connection. */
static int send_begun(moonlet_rpc_client *c, uint64_t *id_out, int pass_fd, int64_t deadline)
{
    if (!c->begun)
        return MOONLET_ERR_INVALID_PARAMS;
    c->begun = false;
    if (c->broken) {
        moonlet_frame_builder_reset(&c->out);
        return MOONLET_ERR_RPC_FAIL;
    }
    int rc = moonlet_frame_finish(&c->out, c->max_frame);
    if (rc == 0 && moonlet_frame_body_check(c->out.buf.data + MOONLET_FRAME_HEADER_BYTES,
                                            c->out.buf.size - MOONLET_FRAME_HEADER_BYTES) != 0) {
        ML_ERR(MOD, "request packed with the wrong number of arguments; not sent");
        rc = MOONLET_ERR_INVALID_PARAMS;
    }
    if (rc == 0)
        rc = send_all(c, c->out.buf.data, c->out.buf.size, pass_fd, deadline);
    moonlet_frame_builder_reset(&c->out);
    if (rc != 0)
        return rc;
    *id_out = c->next_id++;
    return 0;
}

int moonlet_rpc_client_send(moonlet_rpc_client *c, uint64_t *id_out)
{
    uint64_t id;
    int rc = send_begun(c, &id, -1, now_ms() + c->timeout_ms);
    if (rc == 0 && id_out)
        *id_out = id;
    return rc;
}

/* ------------------------------------------------------------------ */
/* Receiving                                                            */
/* ------------------------------------------------------------------ */

/* Makes room for `need` contiguous bytes from in_off. */
static bool reserve_input(moonlet_rpc_client *c, size_t need)
{
    if (c->in_cap - c->in_off >= need)
        return true;
    if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
    if (c->in_cap >= need)
        return true;
    size_t cap = c->in_cap ? c->in_cap * 2 : IN_BUF_INITIAL;
    if (cap < need)
        cap = need;
    char *p = realloc(c->in, cap);
    if (p == NULL)
        return false;
    c->in = p;
    c->in_cap = cap;
    return true;
}

/* Takes one complete reply off the buffer: 1 done, 0 need more, <0 error. */
static int take_reply(moonlet_rpc_client *c, moonlet_reply *rep, size_t *need)
{
    size_t avail = c->in_len - c->in_off;
    *need = MOONLET_FRAME_HEADER_BYTES;
    if (avail < MOONLET_FRAME_HEADER_BYTES)
        return 0;
    uint32_t len;
    const char *p = c->in + c->in_off;
    if (moonlet_frame_header_decode((const uint8_t *)p, c->max_frame, &len) != 0) {
        ML_WARN(MOD, "reply frame length out of range");
        return MOONLET_ERR_RPC_FAIL;
    }
    *need = MOONLET_FRAME_HEADER_BYTES + (size_t)len;
    if (avail < *need)
        return 0;
    int rc = moonlet_reply_decode(p + MOONLET_FRAME_HEADER_BYTES, len, rep);
    if (rc != 0) {
        ML_WARN(MOD, "malformed reply frame");
        return MOONLET_ERR_RPC_FAIL;
    }
    c->in_off += *need;
    if (c->in_off == c->in_len) {
        c->in_off = c->in_len = 0;
        if (c->in_cap > IN_BUF_KEEP) {
            free(c->in);
            c->in = NULL;
            c->in_cap = 0;
        }
    }
    return 1;
}

static int recv_reply(moonlet_rpc_client *c, moonlet_reply *rep, int64_t deadline)
{
    if (c->broken)
        return MOONLET_ERR_RPC_FAIL;
    for (;;) {
        size_t need;
        int got = take_reply(c, rep, &need);
        if (got < 0)
            return fail(c, got);
        if (got > 0)
            return 0;
        if (!reserve_input(c, need))
            return fail(c, MOONLET_ERR_RPC_FAIL);
        int rc = c->tls && moonlet_tls_want(c->tls) == POLLOUT
                     ? wait_fd(c->fd, POLLOUT, deadline)
                     : wait_input(c, deadline);
        if (rc != 0)
            return fail(c, rc);
        ssize_t n = c->tls ? moonlet_tls_read(c->tls, c->in + c->in_len, c->in_cap - c->in_len)
                           : recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
        if (n > 0)
            c->in_len += (size_t)n;
        else if (n == 0)
            return fail(c, MOONLET_ERR_RPC_FAIL);
        else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return fail(c, tls_failure(c));
    }
}

int moonlet_rpc_client_recv(moonlet_rpc_client *c, moonlet_reply *rep)
{
    return recv_reply(c, rep, now_ms() + c->timeout_ms);
}

static int call_passing(moonlet_rpc_client *c, int pass_fd, moonlet_reply *rep)
{
    int64_t deadline = now_ms() + c->timeout_ms;
    uint64_t id;
    int rc = send_begun(c, &id, pass_fd, deadline);
    if (rc == 0)
        rc = recv_reply(c, rep, deadline);
    if (rc != 0)
        return rc;
    if (rep->id != id) {
        ML_WARN(MOD, "reply id %llu does not match request id %llu",
                (unsigned long long)rep->id, (unsigned long long)id);
        moonlet_reply_destroy(rep);
        return fail(c, MOONLET_ERR_RPC_FAIL);
    }
    return 0;
}

int moonlet_rpc_client_call(moonlet_rpc_client *c, moonlet_reply *rep)
{
    return call_passing(c, -1, rep);
}

int moonlet_rpc_client_call_fd(moonlet_rpc_client *c, int fd, moonlet_reply *rep)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (fd < 0 || getsockname(c->fd, (struct sockaddr *)&ss, &sl) != 0 ||
        ss.ss_family != AF_UNIX) {
        c->begun = false;
        moonlet_frame_builder_reset(&c->out);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    return call_passing(c, fd, rep);
}

bool moonlet_rpc_client_broken(const moonlet_rpc_client *c) { return c->broken; }

uint64_t moonlet_rpc_client_contended_waits(const moonlet_rpc_client *c)
{
    return c->contended_waits;
}

int moonlet_rpc_client_fd(const moonlet_rpc_client *c) { return c->fd; }

const char *moonlet_rpc_client_tls_peer(const moonlet_rpc_client *c)
{
    return c->tls ? moonlet_tls_peer_name(c->tls) : NULL;
}

void moonlet_rpc_client_set_timeout(moonlet_rpc_client *c, int timeout_ms)
{
    c->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
}
