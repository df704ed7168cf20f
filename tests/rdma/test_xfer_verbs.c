/*
 * test_xfer_verbs.c - verbs-only properties of the data-plane transport
 * (transport/xfer_verbs.c) that the backend-neutral contract
 * (tests/transport/test_xfer_contract.c) cannot state.  Runs in the `rdma`
 * suite inside the Soft-RoCE guest (tests/rdma/guest.sh): the server listens
 * on MOONLET_XFER_RDMA_ADDR (rxe0), clients bind MOONLET_XFER_RDMA_SRC (rxe1).
 * Without an RDMA device (or those variables) every case fails: this binary
 * is only run where one exists.
 *
 *   qp_attrs            after connect, ibv_query_qp on both QPs: the passive
 *                       side's max_dest_rd_atomic > 0 and the active side's
 *                       max_rd_atomic > 0 (a READ needs both); a READ works.
 *   non_rdma_address    "rdma" on 127.0.0.1 is refused with one ERROR line
 *                       naming the address; "auto" there serves TCP.
 *   accept_while_stalled  raw rdma_cm peers that send a connect request and
 *                       then stall (never complete the handshake) do not
 *                       delay anyone: 8 clients connecting at once, then a
 *                       reconnect, each connect well under a second.
 *   reconnect_after_close  a put, then a get needing a second connection,
 *                       then a new client: each connection is up at once.
 *   cold_neighbour      connecting while the server's address has no valid
 *                       neighbour (ARP) entry takes well under a second: the
 *                       kernel's address resolution can miss the ARP reply
 *                       and sleep until its timeout (the "second
 *                       connection accepted ~10 s later").
 *   stall_sleeps        a peer that stops answering: TRANSFER_FAIL after the
 *                       timeout, and the caller sleeps on the completion
 *                       channel meanwhile (CPU time < 1/4 of the wait).
 *   tos                 --rdma-tos reaches the QP's traffic class (ibv_query_qp).
 *   chained_small       512 small writes (inline) and reads to one peer over
 *                       one connection: all correct, posted as chains, with
 *                       at most 1/8 as many completions as WRs (selective
 *                       signalling; counters from qp_info).
 *   chained_error       a bad rkey in the middle of a chained batch of 96
 *                       reads: the ops before it succeed (data checked), it
 *                       and every later op fail; the next read works.
 *   vanished_client     a client whose packets are all dropped (no
 *                       disconnect ever sent): the server's keepalive probe
 *                       fails and its served QP is reaped within about
 *                       2 x keepalive_ms; the client works again after.
 *   concurrent_open     a batch over a good peer and two that never answer
 *                       the connect: one timeout in all, and the good peer's
 *                       write (deadline shorter than the timeout) succeeds;
 *                       concurrent_open_tcp: the same over TCP (xfer.c's pool).
 *   two_devices         one client, a server on each rxe device: each
 *                       connection's QP is on the device its address resolved
 *                       to, with a PD of that device; reads and writes work.
 *   memlock             an unprivileged process whose RLIMIT_MEMLOCK is below
 *                       a buffer's size gets an error naming RLIMIT_MEMLOCK.
 *
 * Every wait is bounded; threads are joined; stalled peers are released.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "log.h"
#include "moonlet/error.h"
#include "xfer_internal.h"
#include "../common/capture.h"

#define SEG (4u << 20)
#define TMO 5000u

static const char *srv_addr, *src_addr;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

typedef struct server {
    moonlet_xfer *x;
    uint8_t *mem;
    moonlet_xfer_segment_info si;
} server;

static void server_start(server *s)
{
    char listen[128];
    snprintf(listen, sizeof(listen), "%s:0", srv_addr);
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_RDMA, .listen_addr = listen,
                           .timeout_ms = TMO};
    assert_int_equal(moonlet_xfer_create(&o, &s->x), MOONLET_OK);
    s->mem = malloc(SEG);
    assert_non_null(s->mem);
    for (uint32_t i = 0; i < SEG; i++)
        s->mem[i] = (uint8_t)(i * 7 + 1);
    assert_int_equal(moonlet_xfer_register_segment(s->x, s->mem, SEG, &s->si), MOONLET_OK);
}

static void server_stop(server *s)
{
    moonlet_xfer_destroy(s->x);
    free(s->mem);
}

static moonlet_xfer *client_new(int conns)
{
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_RDMA, .source_addr = src_addr,
                           .timeout_ms = TMO, .conns_per_peer = conns};
    moonlet_xfer *c = NULL;
    assert_int_equal(moonlet_xfer_create(&o, &c), MOONLET_OK);
    return c;
}

/* Reads 64 KiB at `off` through c and checks the bytes. */
static void read_check(moonlet_xfer *c, server *s, uint8_t *buf, uint32_t off)
{
    memset(buf, 0, 65536);
    assert_int_equal(moonlet_xfer_read(c, s->si.endpoint, s->si.segment_id, off, buf, 65536),
                     MOONLET_OK);
    assert_memory_equal(buf, s->mem + off, 65536);
}

/* Registers buf (len bytes) with c; c's first read (checked) connects it to s. */
static void register_and_connect(moonlet_xfer *c, server *s, uint8_t *buf, size_t len)
{
    assert_int_equal(moonlet_xfer_register_buffer(c, buf, len), MOONLET_OK);
    read_check(c, s, buf, 0);
}

/* s started, and a client of one connection to it: buf registered, connected. */
static moonlet_xfer *connected_client(server *s, uint8_t *buf, size_t len)
{
    server_start(s);
    moonlet_xfer *c = client_new(1);
    register_and_connect(c, s, buf, len);
    return c;
}

static void test_qp_attrs(void **state)
{
    (void)state;
    server s;
    server_start(&s);
    moonlet_xfer *c = client_new(1);
    static uint8_t buf[65536];
    assert_int_equal(moonlet_xfer_register_buffer(c, buf, sizeof(buf)), MOONLET_OK);
    assert_int_equal(moonlet_xfer_connect(c, s.si.endpoint), MOONLET_OK);

    moonlet_xfer_qp_info qi[4];
    assert_int_equal(moonlet_xfer_verbs_qp_info(c, qi, 4), 1);
    print_message("active side (%s): state %d max_rd_atomic %u max_dest_rd_atomic %u\n",
                  qi[0].device, qi[0].state, qi[0].max_rd_atomic, qi[0].max_dest_rd_atomic);
    assert_false(qi[0].served);
    assert_int_equal(qi[0].state, IBV_QPS_RTS);
    assert_true(qi[0].max_rd_atomic > 0);
    assert_string_equal(qi[0].device, "rxe1"); /* the bound source address picked the NIC */

    /* the passive side sees the connection once the handshake ended there */
    size_t n = 0;
    uint64_t end = now_ms() + TMO;
    while ((n = moonlet_xfer_verbs_qp_info(s.x, qi, 4)) < 1 && now_ms() < end)
        usleep(10000);
    assert_int_equal(n, 1);
    print_message("passive side (%s): state %d max_rd_atomic %u max_dest_rd_atomic %u\n",
                  qi[0].device, qi[0].state, qi[0].max_rd_atomic, qi[0].max_dest_rd_atomic);
    assert_true(qi[0].served);
    assert_string_equal(qi[0].device, "rxe0");
    assert_true(qi[0].max_dest_rd_atomic > 0);

    read_check(c, &s, buf, 12345);
    moonlet_xfer_destroy(c);
    server_stop(&s);
}

static int count_lines(const char *t)
{
    int n = 0;
    for (; *t; t++)
        n += *t == '\n';
    return n;
}

static void create_rdma_loopback(void *arg)
{
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_RDMA, .listen_addr = "127.0.0.1:0"};
    *(int *)arg = moonlet_xfer_create(&o, &(moonlet_xfer *){NULL});
}

static void create_auto_loopback(void *arg)
{
    moonlet_log_set_level(MOONLET_LOG_INFO);
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_AUTO, .listen_addr = "127.0.0.1:0"};
    assert_int_equal(moonlet_xfer_create(&o, (moonlet_xfer **)arg), MOONLET_OK);
    moonlet_log_set_level(MOONLET_LOG_WARN);
}

static void test_non_rdma_address(void **state)
{
    (void)state;
    int rc = 0;
    char *log = capture_stderr(create_rdma_loopback, &rc);
    print_message("rdma on 127.0.0.1: %s", log);
    assert_int_equal(rc, MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    assert_int_equal(count_lines(log), 1);
    assert_non_null(strstr(log, "ERROR"));
    assert_non_null(strstr(log, "127.0.0.1"));
    free(log);

    moonlet_xfer *a = NULL;
    log = capture_stderr(create_auto_loopback, &a);
    print_message("auto on 127.0.0.1: %s", log);
    assert_string_equal(moonlet_xfer_protocol_name(a), "tcp");
    assert_non_null(strstr(log, "127.0.0.1"));
    assert_non_null(strstr(log, "using TCP"));
    free(log);
    moonlet_xfer_destroy(a);
}

/* A raw rdma_cm peer that sends a connect request and then does nothing:
 * it never reads its event channel, so librdmacm never completes the
 * handshake (no RTU) until it is released. */
typedef struct stalled_peer {
    struct rdma_event_channel *ec;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
} stalled_peer;

static int wait_cm(struct rdma_event_channel *ec, enum rdma_cm_event_type want)
{
    struct pollfd p = {.fd = ec->fd, .events = POLLIN};
    if (poll(&p, 1, (int)TMO) != 1)
        return -1;
    struct rdma_cm_event *ev;
    if (rdma_get_cm_event(ec, &ev))
        return -1;
    int ok = ev->event == want ? 0 : -1;
    rdma_ack_cm_event(ev);
    return ok;
}

static void stalled_connect(stalled_peer *p, const char *endpoint)
{
    char host[128];
    uint16_t port;
    assert_int_equal(moonlet_net_split_hostport(endpoint, host, sizeof(host), &port), 0);
    struct addrinfo *dst, *src;
    char port_s[8];
    snprintf(port_s, sizeof(port_s), "%u", port);
    assert_int_equal(getaddrinfo(host, port_s, NULL, &dst), 0);
    assert_int_equal(getaddrinfo(src_addr, NULL, NULL, &src), 0);
    p->ec = rdma_create_event_channel();
    assert_non_null(p->ec);
    assert_int_equal(rdma_create_id(p->ec, &p->id, NULL, RDMA_PS_TCP), 0);
    assert_int_equal(rdma_resolve_addr(p->id, src->ai_addr, dst->ai_addr, (int)TMO), 0);
    assert_int_equal(wait_cm(p->ec, RDMA_CM_EVENT_ADDR_RESOLVED), 0);
    assert_int_equal(rdma_resolve_route(p->id, (int)TMO), 0);
    assert_int_equal(wait_cm(p->ec, RDMA_CM_EVENT_ROUTE_RESOLVED), 0);
    freeaddrinfo(dst);
    freeaddrinfo(src);
    p->pd = ibv_alloc_pd(p->id->verbs);
    p->cq = ibv_create_cq(p->id->verbs, 4, NULL, NULL, 0);
    assert_non_null(p->pd);
    assert_non_null(p->cq);
    struct ibv_qp_init_attr qa = {.send_cq = p->cq, .recv_cq = p->cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 1, .max_recv_wr = 1,
                                          .max_send_sge = 1, .max_recv_sge = 1}};
    assert_int_equal(rdma_create_qp(p->id, p->pd, &qa), 0);
    struct rdma_conn_param cp = {.initiator_depth = 1, .responder_resources = 0,
                                 .retry_count = 7, .rnr_retry_count = 7};
    assert_int_equal(rdma_connect(p->id, &cp), 0);
    /* ... and now it stalls: nobody reads p->ec */
}

static void stalled_release(stalled_peer *p)
{
    rdma_destroy_qp(p->id);
    rdma_destroy_id(p->id);
    ibv_destroy_cq(p->cq);
    ibv_dealloc_pd(p->pd);
    rdma_destroy_event_channel(p->ec);
}

typedef struct connector {
    pthread_t th;
    const char *endpoint;
    moonlet_xfer *c;
    int rc;
    uint64_t ms;
} connector;

static void *connector_main(void *arg)
{
    connector *k = arg;
    uint64_t t0 = now_ms();
    k->rc = moonlet_xfer_connect(k->c, k->endpoint);
    k->ms = now_ms() - t0;
    return NULL;
}

#define NSTALL 2
#define NCONN 8
#define CONNECT_MS 1500u /* generous for TCG; the bug took ~the transfer timeout */

static void test_accept_while_stalled(void **state)
{
    (void)state;
    server s;
    server_start(&s);
    stalled_peer stalled[NSTALL];
    for (int i = 0; i < NSTALL; i++)
        stalled_connect(&stalled[i], s.si.endpoint);
    connector k[NCONN];
    for (int i = 0; i < NCONN; i++) {
        k[i] = (connector){.endpoint = s.si.endpoint, .c = client_new(2)};
        assert_int_equal(pthread_create(&k[i].th, NULL, connector_main, &k[i]), 0);
    }
    uint64_t worst = 0;
    for (int i = 0; i < NCONN; i++) {
        pthread_join(k[i].th, NULL);
        print_message("client %d: connect rc %d in %llu ms\n", i, k[i].rc,
                      (unsigned long long)k[i].ms);
        assert_int_equal(k[i].rc, MOONLET_OK);
        worst = k[i].ms > worst ? k[i].ms : worst;
    }
    /* every client reads, and one closes and reconnects while peers stall */
    static uint8_t buf[65536];
    for (int i = 0; i < NCONN; i++) {
        assert_int_equal(moonlet_xfer_register_buffer(k[i].c, buf, sizeof(buf)), MOONLET_OK);
        read_check(k[i].c, &s, buf, (uint32_t)i * 4096u);
    }
    moonlet_xfer_destroy(k[0].c);
    k[0].c = client_new(2);
    uint64_t t0 = now_ms();
    assert_int_equal(moonlet_xfer_connect(k[0].c, s.si.endpoint), MOONLET_OK);
    uint64_t again = now_ms() - t0;
    print_message("reconnect with %d stalled peers: %llu ms; worst concurrent connect %llu ms\n",
                  NSTALL, (unsigned long long)again, (unsigned long long)worst);
    assert_true(worst < CONNECT_MS * 2);
    assert_true(again < CONNECT_MS);
    for (int i = 0; i < NCONN; i++)
        moonlet_xfer_destroy(k[i].c);
    for (int i = 0; i < NSTALL; i++)
        stalled_release(&stalled[i]);
    server_stop(&s);
}

/* The sequence: a put on one connection, then a get that needs a
 * second connection to the same server, right after; and a client that
 * closes and comes back at once.  Each connection must be up at once. */
static void test_reconnect_after_close(void **state)
{
    (void)state;
    server s;
    server_start(&s);
    static uint8_t buf[65536];
    for (int round = 0; round < 3; round++) {
        moonlet_xfer *c = client_new(4);
        assert_int_equal(moonlet_xfer_register_buffer(c, buf, sizeof(buf)), MOONLET_OK);
        memset(buf, 0x5a, sizeof(buf));
        uint64_t t0 = now_ms();
        assert_int_equal(moonlet_xfer_write(c, s.si.endpoint, s.si.segment_id, 0, buf, 4096),
                         MOONLET_OK);
        uint64_t t_put = now_ms() - t0;
        /* a batch of two reads leases two connections: the second is new */
        moonlet_xfer_op ops[2] = {
            {.opcode = MOONLET_XFER_READ, .endpoint = s.si.endpoint,
             .segment_id = s.si.segment_id, .offset = 0, .local = buf + 8192, .len = 4096},
            {.opcode = MOONLET_XFER_READ, .endpoint = s.si.endpoint,
             .segment_id = s.si.segment_id, .offset = 4096, .local = buf + 16384, .len = 4096}};
        t0 = now_ms();
        assert_int_equal(moonlet_xfer_submit(c, ops, 2), MOONLET_OK);
        uint64_t t_get = now_ms() - t0;
        assert_memory_equal(buf + 8192, buf, 4096);
        assert_memory_equal(buf + 16384, s.mem + 4096, 4096);
        print_message("round %d: put %llu ms, get on a new connection %llu ms\n", round,
                      (unsigned long long)t_put, (unsigned long long)t_get);
        assert_true(t_put < CONNECT_MS);
        assert_true(t_get < CONNECT_MS);
        moonlet_xfer_destroy(c);
    }
    server_stop(&s);
}

/* Flushes the neighbour (ARP) table, then opens 4 connections with a new
 * client, several times. */
static void test_cold_neighbour(void **state)
{
    (void)state;
    server s;
    server_start(&s);
    uint64_t worst = 0;
    for (int round = 0; round < 8; round++) {
        assert_int_equal(system("ip neigh flush all >/dev/null 2>&1"), 0);
        moonlet_xfer *c = client_new(4);
        uint64_t t0 = now_ms();
        assert_int_equal(moonlet_xfer_connect(c, s.si.endpoint), MOONLET_OK);
        uint64_t ms = now_ms() - t0;
        assert_int_equal(moonlet_xfer_verbs_qp_info(c, NULL, 0), 4); /* all four are up */
        print_message("round %d: 4 connections with a cold neighbour table in %llu ms\n", round,
                      (unsigned long long)ms);
        worst = ms > worst ? ms : worst;
        moonlet_xfer_destroy(c);
    }
    assert_true(worst < CONNECT_MS);
    server_stop(&s);
}

/* In a child: drop to nobody with a 1 MiB memlock limit, register 8 MiB. */
static void test_memlock(void **state)
{
    (void)state;
    char path[] = "/tmp/moonlet-memlock-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd, STDERR_FILENO);
        struct rlimit rl = {.rlim_cur = 1u << 20, .rlim_max = 1u << 20};
        if (setrlimit(RLIMIT_MEMLOCK, &rl) || setresgid(65534, 65534, 65534) ||
            setresuid(65534, 65534, 65534))
            _exit(3);
        moonlet_xfer_opts o = {.protocol = MOONLET_XFER_RDMA, .source_addr = src_addr};
        moonlet_xfer *c = NULL;
        if (moonlet_xfer_create(&o, &c))
            _exit(4);
        size_t len = 8u << 20;
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        int rc = moonlet_xfer_register_buffer(c, p, len);
        moonlet_xfer_destroy(c);
        _exit(rc == MOONLET_OK ? 5 : 0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    char text[4096] = "";
    ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    close(fd);
    text[n > 0 ? n : 0] = '\0';
    print_message("child exit %d: %s", WEXITSTATUS(st), text);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_non_null(strstr(text, "RLIMIT_MEMLOCK"));
    assert_non_null(strstr(text, "ibv_reg_mr of a buffer"));
}

/* --rdma-tos: the client's QP carries the TOS as its GRH traffic class (the
 * RoCE v2 packets' IP TOS); without the option, the kernel's default (0). */
static void test_tos(void **state)
{
    (void)state;
    server s;
    server_start(&s);
    for (int want = 0; want <= 106; want += 106) {
        moonlet_xfer_opts o = {.protocol = MOONLET_XFER_RDMA, .source_addr = src_addr,
                               .timeout_ms = TMO, .conns_per_peer = 1, .rdma_tos = want};
        moonlet_xfer *c = NULL;
        assert_int_equal(moonlet_xfer_create(&o, &c), MOONLET_OK);
        static uint8_t buf[65536];
        register_and_connect(c, &s, buf, sizeof(buf));
        moonlet_xfer_qp_info qi[2];
        assert_int_equal(moonlet_xfer_verbs_qp_info(c, qi, 2), 1);
        print_message("rdma_tos %d: traffic class %u\n", want, qi[0].traffic_class);
        assert_int_equal(qi[0].traffic_class, want);
        moonlet_xfer_destroy(c);
    }
    moonlet_xfer_opts bad = {.protocol = MOONLET_XFER_RDMA, .rdma_tos = 256};
    moonlet_xfer *x = NULL;
    assert_int_equal(moonlet_xfer_create(&bad, &x), MOONLET_ERR_INVALID_PARAMS);
    server_stop(&s);
}

/* A peer that stops answering mid-transfer (RoCE packets dropped): the
 * caller gets TRANSFER_FAIL after the timeout and, meanwhile, sleeps on the
 * completion channel instead of spinning a core.  MOONLET_RDMA_STALL_ON /
 * _OFF are shell commands from the harness (netem dropping every packet the
 * client's link sends: an nftables drop fails the send itself, and rxe then
 * retries its CM messages forever, which is no network's behaviour). */
static void test_stall_sleeps(void **state)
{
    (void)state;
    const char *on = getenv("MOONLET_RDMA_STALL_ON"), *off = getenv("MOONLET_RDMA_STALL_OFF");
    assert_non_null(on);
    assert_non_null(off);
    server s;
    server_start(&s);
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_RDMA, .source_addr = src_addr,
                           .timeout_ms = 2000, .conns_per_peer = 1};
    moonlet_xfer *c = NULL;
    assert_int_equal(moonlet_xfer_create(&o, &c), MOONLET_OK);
    static uint8_t buf[1u << 20];
    register_and_connect(c, &s, buf, sizeof(buf));
    assert_int_equal(system(on), 0);
    struct timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    uint64_t t0 = now_ms();
    int rc = moonlet_xfer_read(c, s.si.endpoint, s.si.segment_id, 0, buf, sizeof(buf));
    uint64_t wall = now_ms() - t0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    assert_int_equal(system(off), 0);
    double cpu_ms = (double)(c1.tv_sec - c0.tv_sec) * 1e3 + (double)(c1.tv_nsec - c0.tv_nsec) / 1e6;
    print_message("stalled read: rc %d after %llu ms, %.0f ms of CPU\n", rc,
                  (unsigned long long)wall, cpu_ms);
    assert_int_equal(rc, MOONLET_ERR_TRANSFER_FAIL);
    assert_true(wall >= 1900 && wall < 4000);
    assert_true(cpu_ms < 0.25 * (double)wall);
    read_check(c, &s, buf, 8192); /* a new connection, once packets flow again */
    moonlet_xfer_destroy(c);
    server_stop(&s);
}

/* Served connections in x (qp_info's served entries). */
static size_t served_count(moonlet_xfer *x)
{
    moonlet_xfer_qp_info qi[8];
    size_t n = moonlet_xfer_verbs_qp_info(x, qi, 8), served = 0;
    for (size_t i = 0; i < n && i < 8; i++)
        served += qi[i].served;
    return served;
}

/* A client that vanishes without a disconnect (every packet its link sends
 * dropped, as after a power loss or a pulled cable; its QP and cm_id stay,
 * so no DREQ is ever sent): the server's keepalive probe goes unanswered and
 * the served QP is torn down within about 2 x keepalive_ms.  Without the
 * keepalive the served count stays 1 forever (one-sided traffic gives the
 * server nothing to notice).  After the link heals the client reconnects. */
#define KEEPALIVE_MS 500u

static void test_vanished_client(void **state)
{
    (void)state;
    const char *on = getenv("MOONLET_RDMA_STALL_ON"), *off = getenv("MOONLET_RDMA_STALL_OFF");
    assert_non_null(on);
    assert_non_null(off);
    char listen[128];
    snprintf(listen, sizeof(listen), "%s:0", srv_addr);
    moonlet_xfer_opts so = {.protocol = MOONLET_XFER_RDMA, .listen_addr = listen,
                            .timeout_ms = TMO, .keepalive_ms = KEEPALIVE_MS};
    server s;
    assert_int_equal(moonlet_xfer_create(&so, &s.x), MOONLET_OK);
    s.mem = malloc(SEG);
    assert_non_null(s.mem);
    for (uint32_t i = 0; i < SEG; i++)
        s.mem[i] = (uint8_t)(i * 7 + 1);
    assert_int_equal(moonlet_xfer_register_segment(s.x, s.mem, SEG, &s.si), MOONLET_OK);
    moonlet_xfer *c = client_new(1);
    static uint8_t buf[65536];
    register_and_connect(c, &s, buf, sizeof(buf));
    /* probes of a live client succeed: still served after several periods */
    uint64_t t0 = now_ms();
    for (int i = 0; i < 100 && now_ms() - t0 < 3 * KEEPALIVE_MS; i++) {
        assert_int_equal(served_count(s.x), 1);
        usleep(50 * 1000); /* sampling a state that must NOT change */
    }
    read_check(c, &s, buf, 4096);
    assert_int_equal(system(on), 0);
    t0 = now_ms();
    uint64_t gone = 0;
    for (int i = 0; i < 400 && now_ms() - t0 < 10000; i++) {
        if (served_count(s.x) == 0) {
            gone = now_ms() - t0;
            break;
        }
        usleep(25 * 1000);
    }
    assert_int_equal(system(off), 0);
    print_message("vanished client: served QP reaped after %llu ms (keepalive_ms %u)\n",
                  (unsigned long long)gone, KEEPALIVE_MS);
    assert_true(gone > 0);
    assert_true(gone <= 2 * KEEPALIVE_MS + 1000);
    /* the client notices (the reaper's DREQ, once packets flow) or fails
     * once and reissues: either way a read works again */
    uint64_t t1 = now_ms();
    int rc = MOONLET_ERR_TRANSFER_FAIL;
    for (int i = 0; i < 3 && rc != MOONLET_OK && now_ms() - t1 < 20000; i++)
        rc = moonlet_xfer_read(c, s.si.endpoint, s.si.segment_id, 8192, buf, sizeof(buf));
    assert_int_equal(rc, MOONLET_OK);
    assert_memory_equal(buf, s.mem + 8192, sizeof(buf));
    moonlet_xfer_destroy(c);
    server_stop(&s);
}

/* An address on the server's subnet that no host answers (ARP unanswered):
 * its last IPv4 byte replaced by `last`. */
static void blackhole_endpoint(char *out, size_t cap, unsigned last)
{
    unsigned a, b, c, d;
    assert_int_equal(sscanf(srv_addr, "%u.%u.%u.%u", &a, &b, &c, &d), 4);
    snprintf(out, cap, "%u.%u.%u.%u:4791", a, b, c, last);
}

/* A batch over one good peer and two peers that never answer the connect:
 * the opens run at once, so the batch costs one timeout (not two), and the
 * good peer's write - whose writer deadline is shorter than the timeout -
 * runs as soon as its own connection is up instead of after the dead peers'
 * timeouts (opened one after another, it failed its deadline).  The pool is
 * xfer.c's, so TCP behaves the same (same addresses, in the guest). */
static void concurrent_open(moonlet_xfer_protocol proto)
{
    server s;
    char listen[128];
    snprintf(listen, sizeof(listen), "%s:0", srv_addr);
    moonlet_xfer_opts so = {.protocol = proto, .listen_addr = listen, .timeout_ms = TMO};
    assert_int_equal(moonlet_xfer_create(&so, &s.x), MOONLET_OK);
    s.mem = calloc(1, SEG);
    assert_non_null(s.mem);
    assert_int_equal(moonlet_xfer_register_segment(s.x, s.mem, SEG, &s.si), MOONLET_OK);
    moonlet_xfer_opts o = {.protocol = proto, .source_addr = src_addr, .timeout_ms = 2000,
                           .conns_per_peer = 1};
    moonlet_xfer *c = NULL;
    assert_int_equal(moonlet_xfer_create(&o, &c), MOONLET_OK);
    static uint8_t buf[3][65536];
    assert_int_equal(moonlet_xfer_register_buffer(c, buf, sizeof(buf)), MOONLET_OK);
    memset(buf[0], 0x5a, sizeof(buf[0]));
    char bad1[64], bad2[64];
    blackhole_endpoint(bad1, sizeof(bad1), 251);
    blackhole_endpoint(bad2, sizeof(bad2), 252);
    uint64_t t0 = now_ms();
    moonlet_xfer_cap cap = {.deadline_ms = t0 + 1200};
    moonlet_xfer_op ops[3] = {
        {.opcode = MOONLET_XFER_WRITE, .endpoint = s.si.endpoint, .segment_id = s.si.segment_id,
         .offset = 0, .local = buf[0], .len = sizeof(buf[0]), .cap = &cap},
        {.opcode = MOONLET_XFER_READ, .endpoint = bad1, .segment_id = s.si.segment_id,
         .offset = 0, .local = buf[1], .len = sizeof(buf[1])},
        {.opcode = MOONLET_XFER_READ, .endpoint = bad2, .segment_id = s.si.segment_id,
         .offset = 0, .local = buf[2], .len = sizeof(buf[2])},
    };
    moonlet_xfer_submit(c, ops, 3);
    uint64_t wall = now_ms() - t0;
    print_message("%s: batch with 2 unreachable peers: %llu ms (timeout 2000 ms); good write "
                  "%d, unreachable %d %d\n", proto == MOONLET_XFER_TCP ? "tcp" : "rdma",
                  (unsigned long long)wall, ops[0].status, ops[1].status, ops[2].status);
    assert_int_equal(ops[0].status, MOONLET_OK);
    assert_memory_equal(s.mem, buf[0], sizeof(buf[0]));
    assert_int_not_equal(ops[1].status, MOONLET_OK);
    assert_int_not_equal(ops[2].status, MOONLET_OK);
    assert_true(wall >= 1900 && wall < 3500); /* one timeout, not two */
    moonlet_xfer_destroy(c);
    server_stop(&s);
}

static void test_concurrent_open(void **state)
{
    (void)state;
    concurrent_open(MOONLET_XFER_RDMA);
}

static void test_concurrent_open_tcp(void **state)
{
    (void)state;
    concurrent_open(MOONLET_XFER_TCP);
}

/* A client reaching peers through two devices: a server on each device's
 * address (rxe0, rxe1), one client with no source address, one registered
 * buffer.  Each connection uses the device its address resolved to, with
 * that device's PD (before, the client had one device and refused the
 * other: "reached through another device"). */
static void test_two_devices(void **state)
{
    (void)state;
    server s[2];
    const char *addrs[2] = {srv_addr, src_addr};
    for (int i = 0; i < 2; i++) {
        char listen[128];
        snprintf(listen, sizeof(listen), "%s:0", addrs[i]);
        moonlet_xfer_opts so = {.protocol = MOONLET_XFER_RDMA, .listen_addr = listen,
                                .timeout_ms = TMO};
        assert_int_equal(moonlet_xfer_create(&so, &s[i].x), MOONLET_OK);
        s[i].mem = malloc(SEG);
        assert_non_null(s[i].mem);
        for (uint32_t k = 0; k < SEG; k++)
            s[i].mem[k] = (uint8_t)(k * 7 + 1 + i);
        assert_int_equal(moonlet_xfer_register_segment(s[i].x, s[i].mem, SEG, &s[i].si),
                         MOONLET_OK);
    }
    moonlet_xfer_opts o = {.protocol = MOONLET_XFER_RDMA, .timeout_ms = TMO,
                           .conns_per_peer = 1};
    moonlet_xfer *c = NULL;
    assert_int_equal(moonlet_xfer_create(&o, &c), MOONLET_OK);
    static uint8_t buf[2][65536];
    assert_int_equal(moonlet_xfer_register_buffer(c, buf, sizeof(buf)), MOONLET_OK);
    for (int i = 0; i < 2; i++) {
        read_check(c, &s[i], buf[i], 4096);
        memset(buf[i], 0xa0 + i, sizeof(buf[i]));
        assert_int_equal(moonlet_xfer_write(c, s[i].si.endpoint, s[i].si.segment_id, 0, buf[i],
                                            sizeof(buf[i])),
                         MOONLET_OK);
        assert_memory_equal(s[i].mem, buf[i], sizeof(buf[i]));
    }
    moonlet_xfer_qp_info qi[4];
    assert_int_equal(moonlet_xfer_verbs_qp_info(c, qi, 4), 2);
    print_message("client QPs on %s and %s\n", qi[0].device, qi[1].device);
    assert_string_not_equal(qi[0].device, qi[1].device);
    for (int i = 0; i < 2; i++) {
        assert_false(qi[i].served);
        assert_true(qi[i].pd_on_id_device);
        assert_int_equal(qi[i].state, IBV_QPS_RTS);
    }
    moonlet_xfer_destroy(c);
    for (int i = 0; i < 2; i++)
        server_stop(&s[i]);
}

/* The client connection's counters (its only QP in c's pool). */
static moonlet_xfer_qp_info client_qp(moonlet_xfer *c)
{
    moonlet_xfer_qp_info qi[2];
    assert_int_equal(moonlet_xfer_verbs_qp_info(c, qi, 2), 1);
    assert_false(qi[0].served);
    return qi[0];
}

static void test_chained_small(void **state)
{
    (void)state;
    enum { NSMALL = 512 };
    server s;
    static uint8_t buf[NSMALL * 256];
    moonlet_xfer *c = connected_client(&s, buf, sizeof(buf));
    moonlet_xfer_qp_info q0 = client_qp(c);
    assert_true(q0.max_send_wr > 0);
    /* half 200-byte writes (inline when the device grants 200), half 256-byte
     * reads, to disjoint ranges of one peer over one connection */
    static moonlet_xfer_op ops[NSMALL];
    for (uint32_t i = 0; i < NSMALL; i++) {
        bool w = i % 2 == 0;
        uint8_t *p = buf + (size_t)i * 256;
        if (w)
            for (uint32_t k = 0; k < 200; k++)
                p[k] = (uint8_t)(i ^ (k * 13));
        else
            memset(p, 0, 256);
        ops[i] = (moonlet_xfer_op){.opcode = w ? MOONLET_XFER_WRITE : MOONLET_XFER_READ,
                                   .endpoint = s.si.endpoint, .segment_id = s.si.segment_id,
                                   .offset = (uint64_t)i * 4096, .local = p,
                                   .len = w ? 200 : 256, .status = -1};
    }
    assert_int_equal(moonlet_xfer_submit(c, ops, NSMALL), MOONLET_OK);
    for (uint32_t i = 0; i < NSMALL; i++) {
        assert_int_equal(ops[i].status, MOONLET_OK);
        if (i % 2 == 0)
            assert_memory_equal(s.mem + (size_t)i * 4096, buf + (size_t)i * 256, 200);
        else
            assert_memory_equal(buf + (size_t)i * 256, s.mem + (size_t)i * 4096, 256);
    }
    moonlet_xfer_qp_info q1 = client_qp(c);
    uint64_t wrs = q1.wrs - q0.wrs, cqes = q1.cqes - q0.cqes, posts = q1.post_calls - q0.post_calls;
    print_message("%u ops: %llu WRs in %llu chains, %llu completions (max_send_wr %u, "
                  "max_inline_data %u)\n", NSMALL, (unsigned long long)wrs,
                  (unsigned long long)posts, (unsigned long long)cqes, q1.max_send_wr,
                  q1.max_inline_data);
    assert_int_equal(wrs, NSMALL);
    assert_true(cqes * 8 <= wrs);   /* every 16th and each chain's last */
    assert_true(posts * 4 <= wrs);  /* chains, not one post per WR */
    assert_true(q1.max_inline_data >= 200); /* rxe grants the 256 asked for */
    moonlet_xfer_destroy(c);
    server_stop(&s);
}

/* One op with a bad rkey in the middle of a chained batch to one peer: it
 * fails, every op posted after it on that QP fails (flushed), and none of the
 * earlier ones (signalled or not) is counted failed. */
static void test_chained_error(void **state)
{
    (void)state;
    enum { NCHAIN = 96, BAD_AT = 41 };
    server s;
    static uint8_t buf[NCHAIN * 1024];
    moonlet_xfer *c = connected_client(&s, buf, sizeof(buf));
    /* "<id>.<rkey 8 hex>.<base>.<size>": flip the rkey */
    char bad[sizeof(s.si.segment_id)];
    snprintf(bad, sizeof(bad), "%s", s.si.segment_id);
    char *dot = strchr(bad, '.');
    assert_non_null(dot);
    for (int k = 1; k <= 8; k++)
        dot[k] = dot[k] == 'f' ? '0' : 'f';
    memset(buf, 0, sizeof(buf));
    static moonlet_xfer_op ops[NCHAIN];
    for (uint32_t i = 0; i < NCHAIN; i++)
        ops[i] = (moonlet_xfer_op){.opcode = MOONLET_XFER_READ, .endpoint = s.si.endpoint,
                                   .segment_id = i == BAD_AT ? bad : s.si.segment_id,
                                   .offset = (uint64_t)i * 1024, .local = buf + i * 1024,
                                   .len = 1024, .status = -1};
    assert_int_equal(moonlet_xfer_submit(c, ops, NCHAIN), MOONLET_ERR_TRANSFER_FAIL);
    for (uint32_t i = 0; i < NCHAIN; i++) {
        if (i < BAD_AT) {
            assert_int_equal(ops[i].status, MOONLET_OK);
            assert_memory_equal(buf + i * 1024, s.mem + i * 1024, 1024);
        } else {
            assert_int_equal(ops[i].status, MOONLET_ERR_TRANSFER_FAIL);
        }
    }
    read_check(c, &s, buf, 65536); /* the broken connection is replaced */
    moonlet_xfer_destroy(c);
    server_stop(&s);
}

int main(void)
{
    moonlet_log_set_level(MOONLET_LOG_WARN);
    srv_addr = getenv("MOONLET_XFER_RDMA_ADDR");
    src_addr = getenv("MOONLET_XFER_RDMA_SRC");
    if (!srv_addr || !src_addr) {
        fprintf(stderr, "test_xfer_verbs: set MOONLET_XFER_RDMA_ADDR and MOONLET_XFER_RDMA_SRC "
                        "(run it through the rdma suite: tests/rdma/run.sh)\n");
        return 1;
    }
    const char *only = getenv("MOONLET_VERBS_CASE");
    const struct CMUnitTest all[] = {
        cmocka_unit_test(test_qp_attrs), cmocka_unit_test(test_non_rdma_address),
        cmocka_unit_test(test_reconnect_after_close), cmocka_unit_test(test_accept_while_stalled),
        cmocka_unit_test(test_cold_neighbour), cmocka_unit_test(test_memlock),
        cmocka_unit_test(test_tos), cmocka_unit_test(test_stall_sleeps),
        cmocka_unit_test(test_chained_small), cmocka_unit_test(test_chained_error),
        cmocka_unit_test(test_vanished_client), cmocka_unit_test(test_concurrent_open),
        cmocka_unit_test(test_concurrent_open_tcp),
        cmocka_unit_test(test_two_devices),
    };
    if (only)
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests_name("xfer verbs", all, NULL, NULL);
}
