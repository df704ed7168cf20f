/*
 * test_rpc.c - RPC server + client over loopback: calls, pipelining,
 * concurrency, malformed input on raw sockets, authentication, timeouts,
 * unix sockets, back-pressure and shutdown.  Every server binds 127.0.0.1
 * on an ephemeral port; every wait is bounded in count and time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "log.h"
#include "methods.h"
#include "moonlet/error.h"
#include "rpc_client.h"
#include "rpc_server.h"
#include "wire.h"
#include "../common/capture.h"
#include "../common/wire_assert.h"
#include "../common/threads.h"
#include "monotime.h"

#define M_ADD 100
#define M_SET_DATA 101
#define M_GET_DATA 102
#define M_SLEEP 103
#define M_BIG 104
#define M_BAD 105
#define M_BURN 106
#define M_DETACH 107
#define M_REWIND 108
#define M_UNKNOWN 999
#define TOKEN "s3cret-token-xyz"
#define RAW_TIMEOUT_MS 3000

typedef struct test_ctx {
    atomic_int closes;
    atomic_int closes_with_data;
} test_ctx;

static test_ctx g_ctx;

static int64_t now_ms(void)
{
    return (int64_t)moonlet_mono_ms();
}

/* ------------------------------------------------------------------ */
/* Test methods                                                         */
/* ------------------------------------------------------------------ */

static int h_echo(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    msgpack_pack_object(out, *args);
    return 0;
}

static int h_add(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int64_t a, b;
    if (ctx->server_ctx != &g_ctx || ctx->method != M_ADD || ctx->id == 0)
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "bad ctx");
    if (moonlet_wire_len(args) != 2 || moonlet_wire_i64(args, 0, &a) != 0 ||
        moonlet_wire_i64(args, 1, &b) != 0)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "add wants %d ints", 2);
    msgpack_pack_int64(out, a + b);
    return 0;
}

/* conn_data: a heap counter per connection, freed by on_close. */
static int h_set_data(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    if (*ctx->conn_data == NULL)
        *ctx->conn_data = calloc(1, sizeof(int));
    msgpack_pack_nil(out);
    return 0;
}

static int h_get_data(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int *n = *ctx->conn_data;
    msgpack_pack_int(out, n ? ++*n : -1);
    return 0;
}

static void on_close(void *ctx, void *conn_data)
{
    test_ctx *t = ctx;
    if (conn_data != NULL)
        atomic_fetch_add(&t->closes_with_data, 1);
    atomic_fetch_add(&t->closes, 1);
    free(conn_data);
}

static int h_sleep(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    uint64_t ms;
    if (moonlet_wire_u64(args, 0, &ms) != 0 || ms > 5000)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "sleep wants ms <= 5000");
    poll(NULL, 0, (int)ms);
    msgpack_pack_nil(out);
    return 0;
}

static int h_big(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    uint64_t n;
    if (moonlet_wire_u64(args, 0, &n) != 0 || n > (16u << 20))
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "big wants n <= 16 MiB");
    char *buf = malloc(n ? n : 1);
    if (buf == NULL)
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "oom");
    memset(buf, 'b', n);
    msgpack_pack_bin(out, n);
    msgpack_pack_bin_body(out, buf, n);
    free(buf);
    return 0;
}

static int h_bad(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    msgpack_pack_nil(out); /* breaks the contract: two objects */
    msgpack_pack_nil(out);
    return 0;
}

/* [us, v]: burns `us` microseconds of this thread's CPU time, returns v. */
static int h_burn(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    uint64_t us;
    int64_t v;
    if (moonlet_wire_u64(args, 0, &us) != 0 || us > 10000 || moonlet_wire_i64(args, 1, &v) != 0)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "burn wants us <= 10000, v");
    struct timespec t0, t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000ll + (t.tv_nsec - t0.tv_nsec) < (int64_t)us * 1000);
    msgpack_pack_int64(out, v);
    return 0;
}

/* The sockets M_DETACH's taker got, and their tags. */
static atomic_int g_taken_fd = -1, g_takes;
static atomic_ullong g_taken_tag;

static void taker(void *arg, uint64_t tag, int fd, moonlet_tls *tls)
{
    assert_ptr_equal(arg, &g_ctx);
    assert_null(tls); /* a plaintext server */
    atomic_store(&g_taken_tag, tag);
    atomic_store(&g_taken_fd, fd);
    atomic_fetch_add(&g_takes, 1);
}

/* [tag]: nil, then the connection is the taker's. */
static int h_detach(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    uint64_t tag;
    if (moonlet_wire_u64(args, 0, &tag) != 0)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "detach wants a tag");
    assert_int_equal(moonlet_rpc_ctx_detach(ctx, taker, &g_ctx, tag), 0);
    /* twice: refused, the first one stands */
    assert_int_equal(moonlet_rpc_ctx_detach(ctx, taker, &g_ctx, tag + 1),
                     MOONLET_ERR_INVALID_PARAMS);
    msgpack_pack_nil(out);
    return 0;
}

/* rewind [n, give_up]: packs n integers, then, with give_up, rewinds them
 * and answers an error instead. */
static int h_rewind(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    uint64_t n = 0;
    bool give_up = false;
    if (moonlet_wire_u64(args, 0, &n) || moonlet_wire_bool(args, 1, &give_up) || n > 100000)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "rewind wants [n, give_up]");
    size_t mark = moonlet_rpc_result_mark(ctx);
    msgpack_pack_array(out, (uint32_t)n);
    for (uint64_t i = 0; i < n; i++)
        msgpack_pack_uint64(out, i);
    if (!give_up)
        return 0;
    moonlet_rpc_result_rewind(ctx, mark);
    return moonlet_rpc_error(out, MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS, "gave up after %llu",
                             (unsigned long long)n);
}

static const moonlet_rpc_method g_methods[] = {
    {MOONLET_M_ECHO, "echo", h_echo, NULL, 0},     {M_ADD, "add", h_add, NULL, 0},
    {M_SET_DATA, "set_data", h_set_data, NULL, 0}, {M_GET_DATA, "get_data", h_get_data, NULL, 0},
    {M_SLEEP, "sleep", h_sleep, NULL, 0},          {M_BIG, "big", h_big, NULL, 0},
    {M_BAD, "bad", h_bad, NULL, 0},                {M_BURN, "burn", h_burn, NULL, 0},
    {M_DETACH, "detach", h_detach, NULL, 0},       {M_REWIND, "rewind", h_rewind, NULL, 0},
};

/* ------------------------------------------------------------------ */
/* Fixtures                                                             */
/* ------------------------------------------------------------------ */

static moonlet_rpc_server_opts base_opts(void)
{
    moonlet_rpc_server_opts o = {0};
    o.address = "127.0.0.1";
    o.threads = 2;
    o.methods = g_methods;
    o.nmethods = sizeof(g_methods) / sizeof(g_methods[0]);
    o.ctx = &g_ctx;
    o.on_close = on_close;
    return o;
}

static moonlet_rpc_server *start_opts(const moonlet_rpc_server_opts *o)
{
    moonlet_rpc_server *s = NULL;
    assert_int_equal(moonlet_rpc_server_create(o, &s), 0);
    assert_int_equal(moonlet_rpc_server_start(s), 0);
    return s;
}

static moonlet_rpc_server *start_server(void)
{
    moonlet_rpc_server_opts o = base_opts();
    moonlet_rpc_server *s = start_opts(&o);
    assert_true(moonlet_rpc_server_port(s) != 0);
    return s;
}

static moonlet_rpc_client *connect_ok(const moonlet_rpc_server *s, const char *token, int timeout_ms)
{
    moonlet_rpc_client_opts o = {.timeout_ms = timeout_ms, .auth_token = token};
    moonlet_rpc_client *c = NULL;
    assert_int_equal(moonlet_rpc_client_connect("127.0.0.1", moonlet_rpc_server_port(s), &o, &c), 0);
    assert_non_null(c);
    return c;
}

static bool wait_conns(const moonlet_rpc_server *s, size_t n)
{
    for (int i = 0; i < 400; i++) { /* 2 s */
        if (moonlet_rpc_server_connections(s) == n)
            return true;
        poll(NULL, 0, 5);
    }
    return false;
}

/* The test has closed every connection it opened: the server sees them all
 * gone (bounded wait), then is destroyed. */
static void stop_when_idle(moonlet_rpc_server *s)
{
    assert_true(wait_conns(s, 0));
    moonlet_rpc_server_destroy(s);
}

static bool wait_int(atomic_int *v, int want)
{
    for (int i = 0; i < 400; i++) {
        if (atomic_load(v) == want)
            return true;
        poll(NULL, 0, 5);
    }
    return false;
}

/* add(a, b) on c; asserts a successful reply and returns the sum. */
static int64_t call_add(moonlet_rpc_client *c, int64_t a, int64_t b)
{
    msgpack_packer *pk = moonlet_rpc_client_begin(c, M_ADD, 2);
    msgpack_pack_int64(pk, a);
    msgpack_pack_int64(pk, b);
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    assert_int_equal(rep.code, 0);
    int64_t sum = rep.result->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? rep.result->via.i64
                                                                      : (int64_t)rep.result->via.u64;
    moonlet_reply_destroy(&rep);
    return sum;
}

/* An AUTH of token on c is answered OK (nil). */
static void auth_answered_ok(moonlet_rpc_client *c, const char *token)
{
    msgpack_packer *pk = moonlet_rpc_client_begin(c, MOONLET_M_AUTH, 1);
    moonlet_pack_cstr(pk, token);
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    assert_int_equal(rep.code, 0);
    assert_int_equal(rep.result->type, MSGPACK_OBJECT_NIL);
    moonlet_reply_destroy(&rep);
}

/* Calls a one-u64-argument method and returns the reply code. */
static int call_u64(moonlet_rpc_client *c, uint32_t method, uint64_t arg, int *transport_rc)
{
    msgpack_pack_uint64(moonlet_rpc_client_begin(c, method, 1), arg);
    moonlet_reply rep;
    *transport_rc = moonlet_rpc_client_call(c, &rep);
    if (*transport_rc != 0)
        return 1;
    int code = rep.code;
    moonlet_reply_destroy(&rep);
    return code;
}

/* A fresh connection still gets served. */
static void assert_serving(const moonlet_rpc_server *s)
{
    moonlet_rpc_client *c = connect_ok(s, NULL, 2000);
    assert_int_equal(call_add(c, 40, 2), 42);
    moonlet_rpc_client_close(c);
}

/* ------------------------------------------------------------------ */
/* Raw sockets                                                          */
/* ------------------------------------------------------------------ */

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static void raw_send(int fd, const void *p, size_t n)
{
    assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Sends the msgpack body built by hex-free packer calls: header + body. */
static void raw_send_frame(int fd, const char *body, uint32_t len)
{
    uint8_t h[4];
    moonlet_frame_header_encode(h, len);
    raw_send(fd, h, 4);
    raw_send(fd, body, len);
}

/* Reads exactly n bytes: n on success, fewer on EOF, -1 on timeout/error. */
static ssize_t raw_read(int fd, void *buf, size_t n)
{
    size_t got = 0;
    int64_t deadline = now_ms() + RAW_TIMEOUT_MS;
    while (got < n) {
        int64_t left = deadline - now_ms();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            return -1;
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r == 0)
            break;
        if (r < 0)
            return errno == ECONNRESET ? (ssize_t)got : -1;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Reads one reply frame; asserts it is there. */
static void raw_expect_reply(int fd, uint64_t id, int code)
{
    uint8_t h[4];
    assert_int_equal(raw_read(fd, h, 4), 4);
    uint32_t len;
    assert_int_equal(moonlet_frame_header_decode(h, 1 << 20, &len), 0);
    char *body = malloc(len);
    assert_non_null(body);
    assert_int_equal(raw_read(fd, body, len), (ssize_t)len);
    moonlet_reply rep;
    assert_int_equal(moonlet_reply_decode(body, len, &rep), 0);
    free(body);
    assert_int_equal(rep.id, id);
    assert_int_equal(rep.code, code);
    if (code != 0)
        assert_int_equal(rep.result->type, MSGPACK_OBJECT_STR);
    moonlet_reply_destroy(&rep);
}

static void raw_expect_eof(int fd)
{
    char b;
    assert_int_equal(raw_read(fd, &b, 1), 0);
}

/* The server closes fd (a deadline ran out), not sooner than min_ms from
 * now; fd is closed on this side too. */
static void raw_expect_closed_after(int fd, int64_t min_ms)
{
    int64_t t0 = now_ms();
    raw_expect_eof(fd);
    assert_true(now_ms() - t0 >= min_ms);
    close(fd);
}

/* Packs a body with a throwaway builder and sends it as one frame. */
typedef void (*body_fn)(msgpack_packer *pk);

static void raw_send_packed(int fd, body_fn fn)
{
    moonlet_frame_builder b;
    moonlet_frame_builder_init(&b);
    fn(moonlet_frame_begin(&b));
    assert_int_equal(moonlet_frame_finish(&b, 1 << 20), 0);
    raw_send(fd, b.buf.data, b.buf.size);
    moonlet_frame_builder_destroy(&b);
}

static void body_wrong_method_type(msgpack_packer *pk) /* [7, "x", []] */
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint64(pk, 7);
    moonlet_pack_cstr(pk, "x");
    msgpack_pack_array(pk, 0);
}

static void body_args_not_array(msgpack_packer *pk) /* [9, 2, 5] */
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint64(pk, 9);
    msgpack_pack_uint32(pk, MOONLET_M_ECHO);
    msgpack_pack_int(pk, 5);
}

static void body_echo_id1(msgpack_packer *pk) /* [1, ECHO, []] */
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_uint32(pk, MOONLET_M_ECHO);
    msgpack_pack_array(pk, 0);
}

/* ------------------------------------------------------------------ */
/* Tests                                                                */
/* ------------------------------------------------------------------ */

static void test_calls(void **state)
{
    moonlet_rpc_server *s = start_server();
    moonlet_rpc_client *c = connect_ok(s, NULL, 2000);

    msgpack_packer *pk = moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 2);
    moonlet_pack_cstr(pk, "hello");
    msgpack_pack_int(pk, -42);
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    assert_int_equal(rep.code, 0);
    assert_int_equal(moonlet_wire_len(rep.result), 2);
    int64_t v;
    assert_wire_bytes(rep.result, 0, "hello", 5);
    assert_int_equal(moonlet_wire_i64(rep.result, 1, &v), 0);
    assert_int_equal(v, -42);
    moonlet_reply_destroy(&rep);

    assert_int_equal(call_add(c, 2, 3), 5);
    assert_int_equal(call_add(c, -10, 3), -7);

    pk = moonlet_rpc_client_begin(c, M_ADD, 2); /* wrong types: an error reply */
    moonlet_pack_cstr(pk, "x");
    msgpack_pack_int(pk, 1);
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    assert_int_equal(rep.code, MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(rep.result->type, MSGPACK_OBJECT_STR);
    assert_int_equal(rep.result->via.str.size, strlen("add wants 2 ints"));
    assert_memory_equal(rep.result->via.str.ptr, "add wants 2 ints", rep.result->via.str.size);
    moonlet_reply_destroy(&rep);

    /* a 640-key BatchExistKey-shaped request */
    pk = moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 2);
    moonlet_pack_cstr(pk, "tenant");
    msgpack_pack_array(pk, 640);
    for (int i = 0; i < 640; i++) {
        char key[48];
        int n = snprintf(key, sizeof(key), "model/layer-%03d/block-%06d", i % 80, i);
        moonlet_pack_str(pk, key, (size_t)n);
    }
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    const msgpack_object *keys;
    assert_int_equal(moonlet_wire_array(rep.result, 1, &keys), 0);
    assert_int_equal(moonlet_wire_len(keys), 640);
    assert_wire_bytes(keys, 639, "model/layer-079/block-000639", 28);
    moonlet_reply_destroy(&rep);

    assert_false(moonlet_rpc_client_broken(c));
    assert_true(moonlet_rpc_client_fd(c) >= 0);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

static void test_pipelining(void **state)
{
    enum { N = 100 };
    moonlet_rpc_server *s = start_server();
    moonlet_rpc_client *c = connect_ok(s, NULL, 5000);
    uint64_t ids[N];
    for (int i = 0; i < N; i++) {
        msgpack_pack_int(moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 1), i);
        assert_int_equal(moonlet_rpc_client_send(c, &ids[i]), 0);
        if (i > 0)
            assert_true(ids[i] == ids[i - 1] + 1);
    }
    assert_int_equal(ids[0], 1); /* ids count from 1 */
    for (int i = 0; i < N; i++) {
        moonlet_reply rep;
        int64_t v;
        assert_int_equal(moonlet_rpc_client_recv(c, &rep), 0);
        assert_int_equal(rep.id, ids[i]);
        assert_int_equal(rep.code, 0);
        assert_int_equal(moonlet_wire_i64(rep.result, 0, &v), 0);
        assert_int_equal(v, i);
        moonlet_reply_destroy(&rep);
    }
    assert_int_equal(call_add(c, 1, 1), 2); /* still in step */
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

/* One caller thread on its own connection: `calls` calls, each answer
 * checked (index * 1000 + i); M_ADD, or with `burn` M_BURN (100 us of CPU a
 * call).  ok counts the right answers. */
typedef struct caller {
    uint16_t port;
    int index;
    bool burn;
    int calls;
    int ok;
    uint64_t contended;
} caller;

static void *caller_main(void *arg)
{
    caller *w = arg;
    moonlet_rpc_client_opts o = {.timeout_ms = w->burn ? 20000 : 5000};
    moonlet_rpc_client *c = NULL;
    if (moonlet_rpc_client_connect("127.0.0.1", w->port, &o, &c) != 0)
        return NULL;
    for (int i = 0; i < w->calls; i++) {
        int64_t want = w->index * 1000 + i;
        msgpack_packer *pk = moonlet_rpc_client_begin(c, w->burn ? M_BURN : M_ADD, 2);
        if (w->burn) {
            msgpack_pack_uint64(pk, 100);
            msgpack_pack_int64(pk, want);
        } else {
            msgpack_pack_int(pk, w->index * 1000);
            msgpack_pack_int(pk, i);
        }
        moonlet_reply rep;
        if (moonlet_rpc_client_call(c, &rep) != 0)
            break;
        if (rep.code == 0 && rep.result->via.i64 == want)
            w->ok++;
        moonlet_reply_destroy(&rep);
    }
    w->contended = moonlet_rpc_client_contended_waits(c);
    moonlet_rpc_client_close(c);
    return NULL;
}

/* n (at most 8) callers on s at once, `calls` calls each; every caller must
 * get every answer right.  Returns their contended waits, summed. */
static uint64_t run_callers(moonlet_rpc_server *s, int n, int calls, bool burn)
{
    caller w[8];
    assert_true(n <= 8);
    for (int i = 0; i < n; i++)
        w[i] = (caller){.port = moonlet_rpc_server_port(s), .index = i + 1, .burn = burn,
                        .calls = calls};
    test_threads_run(caller_main, w, sizeof(w[0]), n);
    uint64_t contended = 0;
    for (int i = 0; i < n; i++) {
        assert_int_equal(w[i].ok, calls);
        contended += w[i].contended;
    }
    return contended;
}

static void test_concurrent_clients(void **state)
{
    moonlet_rpc_server *s = start_server();
    run_callers(s, 8, 200, false);
    moonlet_rpc_server_destroy(s);
}

/* More callers than cores (the process pinned to one core, with a server
 * whose every call takes 100 us of CPU): a caller's spin for its reply sees
 * its yields run other threads and sleeps instead (rpc_client.c, "Waiting
 * for a reply"), and every caller still gets every reply, in step. */
static void test_callers_outnumber_cores(void **state)
{
    cpu_set_t saved, one;
    assert_int_equal(sched_getaffinity(0, sizeof(saved), &saved), 0);
    int cpu = sched_getcpu();
    CPU_ZERO(&one);
    CPU_SET(cpu >= 0 ? cpu : 0, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0)
        skip(); /* the threads started below inherit the mask */
    moonlet_rpc_server *s = start_server();
    uint64_t contended = run_callers(s, 6, 100, true);
    moonlet_rpc_server_destroy(s);
    assert_int_equal(sched_setaffinity(0, sizeof(saved), &saved), 0);
    assert_true(contended > 0);
}

/* A host with no core to spare, seen from a caller whose own core is free:
 * one more CPU-bound thread than cores, and the server, run on another core
 * than the caller's.  The caller's yields never run another thread there,
 * so only the host's runnable count tells it to sleep: every wait whose
 * reply had not come yet sleeps (rpc_client.c, "Waiting for a reply"), and
 * every reply is still right. */
static void test_spin_leaves_a_busy_host(void **state)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t saved, mine, other;
    assert_int_equal(sched_getaffinity(0, sizeof(saved), &saved), 0);
    int a = -1, b = -1;
    for (int i = 0; i < CPU_SETSIZE && b < 0; i++)
        if (CPU_ISSET(i, &saved))
            *(a < 0 ? &a : &b) = i;
    if (b < 0 || cores + 1 > TEST_MAX_THREADS || access("/proc/loadavg", R_OK) != 0)
        skip(); /* one core only, or no runnable count to read */
    CPU_ZERO(&mine);
    CPU_SET(a, &mine);
    CPU_ZERO(&other);
    CPU_SET(b, &other);
    /* the server's threads and the hogs inherit core b */
    assert_int_equal(sched_setaffinity(0, sizeof(other), &other), 0);
    moonlet_rpc_server *s = start_server();
    test_hogs h;
    test_hogs_start(&h, (int)cores + 1);
    assert_int_equal(sched_setaffinity(0, sizeof(mine), &mine), 0);
    moonlet_rpc_client *c = connect_ok(s, NULL, 20000);
    const int calls = 20;
    uint64_t before = moonlet_rpc_client_contended_waits(c);
    for (int i = 0; i < calls; i++)
        assert_int_equal(call_add(c, i, 1000), i + 1000);
    uint64_t contended = moonlet_rpc_client_contended_waits(c) - before;
    moonlet_rpc_client_close(c);
    test_hogs_stop(&h);
    moonlet_rpc_server_destroy(s);
    assert_int_equal(sched_setaffinity(0, sizeof(saved), &saved), 0);
    /* a reply that was there at the first look needs no wait at all */
    assert_true(contended >= calls / 2);
}

/* opts.yield_after_us: a loop that serves for longer than that without a
 * break yields its core once; one that rests between requests never does.
 * A burst is 8 pipelined M_BURN requests of 100 us each (800 us of CPU,
 * served without a wait between them). */
static void test_loop_yields_after_a_long_hold(void **state)
{
    moonlet_rpc_server_opts o = base_opts();
    o.threads = 1;
    o.yield_after_us = 300;
    moonlet_rpc_server *s = start_opts(&o);
    moonlet_rpc_client *c = connect_ok(s, NULL, 5000);
    /* short calls with a rest between them: no hold reaches 300 us */
    for (int i = 0; i < 20; i++) {
        assert_int_equal(call_add(c, i, 1), i + 1);
        poll(NULL, 0, 1);
    }
    assert_int_equal(moonlet_rpc_server_yields(s), 0);
    /* bursts: the hold passes 300 us (a burst the loop was preempted in
     * does not count, so a few are tried) */
    for (int burst = 0; burst < 10 && moonlet_rpc_server_yields(s) == 0; burst++) {
        for (int i = 0; i < 8; i++) {
            msgpack_packer *pk = moonlet_rpc_client_begin(c, M_BURN, 2);
            msgpack_pack_uint64(pk, 100);
            msgpack_pack_int64(pk, i);
            uint64_t id;
            assert_int_equal(moonlet_rpc_client_send(c, &id), 0);
        }
        for (int i = 0; i < 8; i++) {
            moonlet_reply rep;
            assert_int_equal(moonlet_rpc_client_recv(c, &rep), 0);
            assert_int_equal(rep.code, 0);
            assert_int_equal(rep.result->via.i64, i);
            moonlet_reply_destroy(&rep);
        }
    }
    assert_true(moonlet_rpc_server_yields(s) >= 1);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

/* A handler that packed a result and rewinds it answers only what it packs
 * after the rewind (the replicated write a standby did not acknowledge);
 * the connection goes on, in order. */
static void test_result_rewind(void **state)
{
    moonlet_rpc_server *s = start_server();
    moonlet_rpc_client *c = connect_ok(s, NULL, 2000);
    static const uint64_t sizes[] = {0, 3, 5000};
    for (size_t i = 0; i < 3; i++)
        for (int give_up = 0; give_up < 2; give_up++) {
            msgpack_packer *pk = moonlet_rpc_client_begin(c, M_REWIND, 2);
            msgpack_pack_uint64(pk, sizes[i]);
            give_up ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
            moonlet_reply rep;
            assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
            if (give_up) {
                char want[64];
                snprintf(want, sizeof(want), "gave up after %llu", (unsigned long long)sizes[i]);
                assert_int_equal(rep.code, MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
                assert_int_equal(rep.result->type, MSGPACK_OBJECT_STR);
                assert_int_equal(rep.result->via.str.size, strlen(want));
                assert_memory_equal(rep.result->via.str.ptr, want, strlen(want));
            } else {
                assert_int_equal(rep.code, 0);
                assert_int_equal(moonlet_wire_len(rep.result), sizes[i]);
            }
            moonlet_reply_destroy(&rep);
        }
    assert_int_equal(call_add(c, 40, 2), 42);
    moonlet_rpc_client_close(c);
    stop_when_idle(s);
}

static void test_unknown_method_keeps_connection(void **state)
{
    moonlet_rpc_server *s = start_server();
    moonlet_rpc_client *c = connect_ok(s, NULL, 2000);
    moonlet_rpc_client_begin(c, M_UNKNOWN, 0);
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    assert_int_equal(rep.code, MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(rep.result->via.str.size, strlen("unknown method 999"));
    assert_memory_equal(rep.result->via.str.ptr, "unknown method 999", rep.result->via.str.size);
    moonlet_reply_destroy(&rep);
    assert_false(moonlet_rpc_client_broken(c));
    assert_int_equal(call_add(c, 20, 22), 42);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

/* The server answered the request sent on fd with INVALID_PARAMS for
 * request id `id` (0: none could be read), closed the connection, and still
 * serves others. */
static void assert_refused_and_closed(const moonlet_rpc_server *s, int fd, uint64_t id)
{
    raw_expect_reply(fd, id, MOONLET_ERR_INVALID_PARAMS);
    raw_expect_eof(fd);
    close(fd);
    assert_serving(s);
}

static void test_malformed_input(void **state)
{
    moonlet_rpc_server *s = start_server();
    uint16_t port = moonlet_rpc_server_port(s);

    /* Each refused, its connection closed (assert_refused_and_closed). */
    static const struct {
        const char *bytes; /* sent as they are, or as one frame's body */
        size_t len;
        bool framed;
        uint64_t id;
    } bad[] = {
        {"\x7f\xff\xff\xff", 4, false, 0},               /* oversized length header */
        {"\0\0\0\0", 4, false, 0},                       /* zero length */
        {"\xc1\xc1\xc1\xc1", 4, true, 0},                /* garbage body */
        {"\x93\x05\x02\xdd\xff\xff\xff\xff", 8, true, 5}, /* huge declared array, tiny body */
    };
    static const struct {
        body_fn body;
        uint64_t id;
    } bad_packed[] = {{body_wrong_method_type, 7}, {body_args_not_array, 9}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int fd = raw_connect(port);
        if (bad[i].framed)
            raw_send_frame(fd, bad[i].bytes, (uint32_t)bad[i].len);
        else
            raw_send(fd, bad[i].bytes, bad[i].len);
        assert_refused_and_closed(s, fd, bad[i].id);
    }
    for (size_t i = 0; i < sizeof(bad_packed) / sizeof(bad_packed[0]); i++) {
        int fd = raw_connect(port);
        raw_send_packed(fd, bad_packed[i].body);
        assert_refused_and_closed(s, fd, bad_packed[i].id);
    }

    int fd = raw_connect(port); /* a good request, then a bad header, in one write */
    moonlet_frame_builder b;
    moonlet_frame_builder_init(&b);
    body_echo_id1(moonlet_frame_begin(&b));
    assert_int_equal(moonlet_frame_finish(&b, 1024), 0);
    msgpack_sbuffer_write(&b.buf, "\0\0\0\0", 4);
    raw_send(fd, b.buf.data, b.buf.size);
    moonlet_frame_builder_destroy(&b);
    raw_expect_reply(fd, 1, 0);
    assert_refused_and_closed(s, fd, 0);

    fd = raw_connect(port); /* truncated frame, then the peer stops sending */
    raw_send(fd, "\0\0\0\x64\x93\x05", 6);
    shutdown(fd, SHUT_WR);
    raw_expect_eof(fd); /* closed without a reply */
    close(fd);

    fd = raw_connect(port); /* truncated header, then close */
    raw_send(fd, "\0\0", 2);
    close(fd);

    assert_serving(s);
    stop_when_idle(s);
}

static void test_conn_data_and_on_close(void **state)
{
    moonlet_rpc_server *s = start_server();
    int closes = atomic_load(&g_ctx.closes);
    int with_data = atomic_load(&g_ctx.closes_with_data);
    moonlet_rpc_client *a = connect_ok(s, NULL, 2000);
    moonlet_rpc_client *b = connect_ok(s, NULL, 2000);
    assert_true(wait_conns(s, 2));
    int rc;
    assert_int_equal(call_u64(a, M_SET_DATA, 0, &rc), 0);
    assert_int_equal(rc, 0);

    int vals[3];
    for (int i = 0; i < 3; i++) {
        moonlet_rpc_client_begin(i < 2 ? a : b, M_GET_DATA, 0);
        moonlet_reply rep;
        assert_int_equal(moonlet_rpc_client_call(i < 2 ? a : b, &rep), 0);
        vals[i] = rep.result->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? (int)rep.result->via.i64
                                                                       : (int)rep.result->via.u64;
        moonlet_reply_destroy(&rep);
    }
    assert_int_equal(vals[0], 1); /* a's counter persists across calls */
    assert_int_equal(vals[1], 2);
    assert_int_equal(vals[2], -1); /* b has none */

    moonlet_rpc_client_close(a);
    assert_true(wait_int(&g_ctx.closes_with_data, with_data + 1));
    assert_true(wait_conns(s, 1));
    moonlet_rpc_client_close(b);
    assert_true(wait_conns(s, 0));
    assert_int_equal(atomic_load(&g_ctx.closes), closes + 2);
    assert_int_equal(atomic_load(&g_ctx.closes_with_data), with_data + 1);
    moonlet_rpc_server_destroy(s);
}

/* auth_failures() runs with stderr redirected, so it must not fail through
 * cmocka (whose report would vanish): it records the first failed check. */
static int g_auth_failed_line;
#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond)) {                                                        \
            g_auth_failed_line = __LINE__;                                    \
            return;                                                           \
        }                                                                     \
    } while (0)

static bool raw_reply_is(int fd, uint64_t id, int code)
{
    uint8_t h[4];
    char body[256];
    uint32_t len;
    if (raw_read(fd, h, 4) != 4 || moonlet_frame_header_decode(h, sizeof(body), &len) != 0 ||
        raw_read(fd, body, len) != (ssize_t)len)
        return false;
    moonlet_reply rep;
    if (moonlet_reply_decode(body, len, &rep) != 0)
        return false;
    bool ok = rep.id == id && rep.code == code;
    moonlet_reply_destroy(&rep);
    return ok;
}

static void auth_failures(const moonlet_rpc_server *s)
{
    /* first frame is not AUTH */
    int fd = raw_connect(moonlet_rpc_server_port(s));
    raw_send_packed(fd, body_echo_id1);
    bool refused = raw_reply_is(fd, 1, MOONLET_ERR_ILLEGAL_CLIENT);
    char b;
    bool eof = raw_read(fd, &b, 1) == 0;
    close(fd);
    CHECK(refused && eof);

    /* a client without a token: its first call is refused, then the link is dead */
    moonlet_rpc_client_opts o = {.timeout_ms = 2000};
    moonlet_rpc_client *c = NULL;
    CHECK(moonlet_rpc_client_connect("127.0.0.1", moonlet_rpc_server_port(s), &o, &c) == 0);
    moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 0);
    moonlet_reply rep;
    int rc = moonlet_rpc_client_call(c, &rep);
    int code = rc == 0 ? rep.code : 0;
    if (rc == 0)
        moonlet_reply_destroy(&rep);
    moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 0);
    int rc2 = moonlet_rpc_client_call(c, &rep);
    bool broken = moonlet_rpc_client_broken(c);
    if (rc2 == 0)
        moonlet_reply_destroy(&rep);
    moonlet_rpc_client_close(c);
    CHECK(rc == 0 && code == MOONLET_ERR_ILLEGAL_CLIENT);
    CHECK(rc2 == MOONLET_ERR_RPC_FAIL && broken);

    /* wrong tokens, including a prefix and an extension of the right one */
    const char *wrong[] = {"wrong", "s3cret-token-xy", "s3cret-token-xyz!", "S3CRET-TOKEN-XYZ"};
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        moonlet_rpc_client_opts wo = {.timeout_ms = 2000, .auth_token = wrong[i]};
        c = (moonlet_rpc_client *)&wo; /* any non-NULL value: connect must reset it */
        rc = moonlet_rpc_client_connect("127.0.0.1", moonlet_rpc_server_port(s), &wo, &c);
        CHECK(rc == MOONLET_ERR_ILLEGAL_CLIENT && c == NULL);
    }
}

typedef struct auth_run {
    const moonlet_rpc_server *s;
    bool closed;
} auth_run;

/* auth_failures(), then a wait until the server has closed every
 * connection: the refusals were logged before their replies, so its last
 * lines have landed once it has. */
static void run_auth_failures(void *arg)
{
    auth_run *r = arg;
    g_auth_failed_line = 0;
    auth_failures(r->s);
    r->closed = wait_conns(r->s, 0);
}

static void test_auth(void **state)
{
    moonlet_rpc_server_opts o = base_opts();
    o.auth_token = TOKEN;
    o.auth_token_len = strlen(TOKEN);
    moonlet_rpc_server *s = start_opts(&o);
    int level = moonlet_log_get_level();
    moonlet_log_set_level(MOONLET_LOG_DEBUG);
    auth_run run = {.s = s};
    char *log = capture_stderr(run_auth_failures, &run);
    moonlet_log_set_level(level);
    if (g_auth_failed_line != 0)
        fail_msg("auth check at line %d failed", g_auth_failed_line);
    assert_true(run.closed);
    assert_non_null(strstr(log, "authentication failed"));
    assert_null(strstr(log, "s3cret")); /* neither the token nor the guesses */
    free(log);

    moonlet_rpc_client *c = connect_ok(s, TOKEN, 2000);
    assert_int_equal(call_add(c, 1, 2), 3);
    auth_answered_ok(c, TOKEN); /* re-AUTH is fine */
    assert_int_equal(call_add(c, 3, 4), 7);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);

    /* without a configured token, AUTH is simply answered OK */
    s = start_server();
    c = connect_ok(s, "anything", 2000);
    assert_int_equal(call_add(c, 5, 5), 10);
    auth_answered_ok(c, "anything");
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

static void test_client_timeout(void **state)
{
    moonlet_rpc_server *s = start_server();
    moonlet_rpc_client *c = connect_ok(s, NULL, 100);
    int rc;
    int64_t t0 = now_ms();
    call_u64(c, M_SLEEP, 2000, &rc);
    int64_t took = now_ms() - t0;
    /* the 100 ms timeout ended it, not the 2 s reply (wide: a loaded host
     * wakes the client late) */
    assert_int_equal(rc, MOONLET_ERR_RPC_TIMEOUT);
    assert_true(took >= 90 && took < 1900);
    assert_true(moonlet_rpc_client_broken(c));
    /* broken: refused without a request, so RPC_FAIL and not the
     * RPC_TIMEOUT a sent 2 s sleep would end in (no clock needed) */
    call_u64(c, M_SLEEP, 2000, &rc);
    assert_int_equal(rc, MOONLET_ERR_RPC_FAIL);
    uint64_t id;
    moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 0);
    assert_int_equal(moonlet_rpc_client_send(c, &id), MOONLET_ERR_RPC_FAIL);
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_recv(c, &rep), MOONLET_ERR_RPC_FAIL);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

static void test_unix_socket(void **state)
{
    char dir[] = "/tmp/moonlet-rpc-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/ctl.sock", dir);

    /* a stale socket file left by a dead server */
    int stale = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, path);
    assert_int_equal(bind(stale, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(stale);

    moonlet_rpc_server_opts o = base_opts();
    o.unix_path = path;
    moonlet_rpc_server *s = start_opts(&o);
    assert_int_equal(moonlet_rpc_server_port(s), 0);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);

    moonlet_rpc_client_opts co = {.timeout_ms = 2000};
    moonlet_rpc_client *c = NULL;
    assert_int_equal(moonlet_rpc_client_connect_unix(path, &co, &c), 0);
    assert_int_equal(call_add(c, 6, 7), 13);

    moonlet_rpc_server *other = NULL; /* a live server's path is not stolen */
    assert_int_equal(moonlet_rpc_server_create(&o, &other), MOONLET_ERR_RPC_FAIL);
    assert_null(other);
    assert_int_equal(call_add(c, 1, 1), 2);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
    assert_int_equal(lstat(path, &st), -1); /* unlinked on destroy */
    assert_int_equal(moonlet_rpc_client_connect_unix(path, &co, &c), MOONLET_ERR_RPC_FAIL);

    int f = open(path, O_CREAT | O_WRONLY, 0600); /* not a socket: left alone */
    assert_true(f >= 0);
    close(f);
    assert_int_equal(moonlet_rpc_server_create(&o, &other), MOONLET_ERR_RPC_FAIL);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    unlink(path);
    rmdir(dir);
}

static void test_stop_with_idle_clients(void **state)
{
    enum { N = 4 };
    moonlet_rpc_server *s = start_server();
    int closes = atomic_load(&g_ctx.closes);
    moonlet_rpc_client *c[N];
    for (int i = 0; i < N; i++)
        c[i] = connect_ok(s, NULL, 2000);
    assert_int_equal(call_add(c[0], 1, 1), 2);
    assert_true(wait_conns(s, N));
    int64_t t0 = now_ms();
    moonlet_rpc_server_stop(s);
    assert_true(now_ms() - t0 < 1000);
    assert_int_equal(moonlet_rpc_server_connections(s), 0);
    assert_int_equal(atomic_load(&g_ctx.closes), closes + N);
    moonlet_rpc_server_stop(s); /* idempotent */
    assert_int_equal(moonlet_rpc_server_start(s), MOONLET_ERR_INVALID_PARAMS);
    for (int i = 0; i < N; i++) {
        int rc;
        call_u64(c[i], M_SLEEP, 0, &rc);
        assert_int_equal(rc, MOONLET_ERR_RPC_FAIL);
        moonlet_rpc_client_close(c[i]);
    }
    moonlet_rpc_server_destroy(s);
}

static void test_oversized_and_bad_replies(void **state)
{
    moonlet_rpc_server_opts o = base_opts();
    o.max_frame = 64u << 10;
    moonlet_rpc_server *s = start_opts(&o);
    moonlet_rpc_client *c = connect_ok(s, NULL, 2000);
    int rc;
    assert_int_equal(call_u64(c, M_BIG, 100000, &rc), MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(rc, 0);
    assert_int_equal(call_u64(c, M_BIG, 60000, &rc), 0);
    assert_int_equal(call_u64(c, M_BAD, 0, &rc), MOONLET_ERR_INTERNAL_ERROR);
    assert_int_equal(rc, 0);
    assert_int_equal(call_add(c, 2, 2), 4); /* the connection is intact */
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

static void test_client_rejects_bad_requests(void **state)
{
    moonlet_rpc_server *s = start_server();
    moonlet_rpc_client_opts o = {.timeout_ms = 2000, .max_frame = 1024};
    moonlet_rpc_client *c = NULL;
    assert_int_equal(moonlet_rpc_client_connect("127.0.0.1", moonlet_rpc_server_port(s), &o, &c), 0);
    char big[2000];
    memset(big, 'k', sizeof(big));
    moonlet_pack_str(moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 1), big, sizeof(big));
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), MOONLET_ERR_BUFFER_OVERFLOW);
    assert_false(moonlet_rpc_client_broken(c));

    msgpack_pack_int(moonlet_rpc_client_begin(c, M_ADD, 2), 1); /* one arg short */
    assert_int_equal(moonlet_rpc_client_call(c, &rep), MOONLET_ERR_INVALID_PARAMS);
    assert_false(moonlet_rpc_client_broken(c));

    uint64_t id;
    assert_int_equal(moonlet_rpc_client_send(c, &id), MOONLET_ERR_INVALID_PARAMS); /* nothing begun */
    assert_int_equal(call_add(c, 8, 8), 16);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

static void test_large_frames(void **state)
{
    enum { SIZE = 4u << 20 };
    moonlet_rpc_server *s = start_server();
    moonlet_rpc_client *c = connect_ok(s, NULL, 10000);
    char *blob = malloc(SIZE);
    assert_non_null(blob);
    for (size_t i = 0; i < SIZE; i++)
        blob[i] = (char)(i * 31);
    msgpack_packer *pk = moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 1);
    msgpack_pack_bin(pk, SIZE);
    msgpack_pack_bin_body(pk, blob, SIZE);
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    assert_wire_bytes(rep.result, 0, blob, SIZE);
    moonlet_reply_destroy(&rep);
    free(blob);
    assert_int_equal(call_add(c, 1, 2), 3);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

/* Many large replies requested without reading: the server must pause that
 * connection (not buffer without bound, not deadlock) and deliver all. */
static void test_backpressure(void **state)
{
    enum { N = 40, SIZE = 256u << 10 };
    moonlet_rpc_server *s = start_server();
    moonlet_rpc_client *c = connect_ok(s, NULL, 10000);
    for (int i = 0; i < N; i++) {
        msgpack_pack_uint64(moonlet_rpc_client_begin(c, M_BIG, 1), SIZE);
        uint64_t id;
        assert_int_equal(moonlet_rpc_client_send(c, &id), 0);
    }
    for (int i = 0; i < N; i++) {
        moonlet_reply rep;
        assert_int_equal(moonlet_rpc_client_recv(c, &rep), 0);
        assert_int_equal(rep.code, 0);
        assert_int_equal(rep.result->type, MSGPACK_OBJECT_BIN);
        assert_int_equal(rep.result->via.bin.size, SIZE);
        moonlet_reply_destroy(&rep);
    }
    assert_int_equal(call_add(c, 1, 2), 3);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

static void test_bad_options(void **state)
{
    moonlet_rpc_server *s = NULL;
    moonlet_rpc_server_opts o = base_opts();
    moonlet_rpc_method dup[] = {{M_ADD, "a", h_add, NULL, 0}, {M_ADD, "b", h_echo, NULL, 0}};
    moonlet_rpc_method auth[] = {{MOONLET_M_AUTH, "auth", h_echo, NULL, 0}};
    moonlet_rpc_method nofn[] = {{M_ADD, "add", NULL, NULL, 0}};

    assert_int_equal(moonlet_rpc_server_create(NULL, &s), MOONLET_ERR_INVALID_PARAMS);
    o.methods = dup;
    o.nmethods = 2;
    assert_int_equal(moonlet_rpc_server_create(&o, &s), MOONLET_ERR_INVALID_PARAMS);
    o.methods = auth;
    o.nmethods = 1;
    assert_int_equal(moonlet_rpc_server_create(&o, &s), MOONLET_ERR_INVALID_PARAMS);
    o.methods = nofn;
    assert_int_equal(moonlet_rpc_server_create(&o, &s), MOONLET_ERR_INVALID_PARAMS);
    o = base_opts();
    o.max_frame = 100;
    assert_int_equal(moonlet_rpc_server_create(&o, &s), MOONLET_ERR_INVALID_PARAMS);
    o = base_opts();
    o.address = "256.1.1.1";
    assert_int_equal(moonlet_rpc_server_create(&o, &s), MOONLET_ERR_RPC_FAIL);
    o = base_opts();
    o.unix_path = "/tmp/a-socket-path-that-is-far-too-long-for-sockaddr_un-sun_path-"
                  "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";
    assert_int_equal(moonlet_rpc_server_create(&o, &s), MOONLET_ERR_INVALID_PARAMS);
    assert_null(s);

    moonlet_rpc_server *live = start_server(); /* its port is taken */
    o = base_opts();
    o.port = moonlet_rpc_server_port(live);
    assert_int_equal(moonlet_rpc_server_create(&o, &s), MOONLET_ERR_RPC_FAIL);
    moonlet_rpc_server_destroy(live);

    o = base_opts(); /* created but never started: destroy still cleans up */
    assert_int_equal(moonlet_rpc_server_create(&o, &s), 0);
    moonlet_rpc_server_destroy(s);
}

static int64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CPU time this process uses while the calling thread sleeps ms. */
static int64_t cpu_ns_while_sleeping(int ms)
{
    int64_t c0 = cpu_ns();
    usleep((useconds_t)ms * 1000);
    return cpu_ns() - c0;
}

/* busy_poll_us: requests are served as usual; a loop polls for about the
 * window after a request, and sleeps once the window has passed. */
static void test_busy_poll(void **state)
{
    moonlet_rpc_server_opts o = base_opts();
    moonlet_rpc_server *s = NULL;
    o.busy_poll_us = MOONLET_RPC_MAX_BUSY_POLL_US + 1;
    assert_int_equal(moonlet_rpc_server_create(&o, &s), MOONLET_ERR_INVALID_PARAMS);
    assert_null(s);

    o.busy_poll_us = 60000; /* 60 ms: long enough to see from the outside */
    s = start_opts(&o);
    moonlet_rpc_client *c = connect_ok(s, NULL, 2000);
    for (int i = 0; i < 200; i++)
        assert_int_equal(call_add(c, i, 1), i + 1);

    /* Inside the window the loop is polling: it uses CPU while we sleep.
     * Each round yields, so on a loaded host one window may get little CPU:
     * each try re-arms the window with a request, and one try of up to 20
     * must see the loop spin (without busy polling none ever does). */
    int64_t busy = 0;
    for (int i = 0; i < 20 && busy < 2000000; i++) {
        assert_int_equal(call_add(c, i, 1), i + 1);
        busy = cpu_ns_while_sleeping(40);
    }
    assert_true(busy >= 2000000);
    /* Past it the loop sleeps in epoll_wait again: next to no CPU. */
    usleep(100000);
    int64_t idle = cpu_ns_while_sleeping(300);
    assert_true(idle < 30000000);
    /* ... and still serves. */
    assert_int_equal(call_add(c, 40, 2), 42);

    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

static void test_connect_failures(void **state)
{
    moonlet_rpc_server *s = start_server();
    uint16_t port = moonlet_rpc_server_port(s);
    moonlet_rpc_server_destroy(s); /* nothing listens there any more */
    moonlet_rpc_client_opts o = {.timeout_ms = 1000};
    moonlet_rpc_client *c = NULL;
    assert_int_equal(moonlet_rpc_client_connect("127.0.0.1", port, &o, &c), MOONLET_ERR_RPC_FAIL);
    assert_null(c);
    assert_int_equal(moonlet_rpc_client_connect(NULL, port, &o, &c), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_rpc_client_connect_unix("/nonexistent/moonlet.sock", NULL, &c),
                     MOONLET_ERR_RPC_FAIL);
}

static void test_rpc_error_helper(void **state)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(moonlet_rpc_error(&pk, MOONLET_ERR_OBJECT_NOT_FOUND, "key %s of %d", "k1", 7),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(sb.size, 1 + strlen("key k1 of 7"));
    assert_memory_equal(sb.data + 1, "key k1 of 7", sb.size - 1);
    msgpack_sbuffer_destroy(&sb);
}

/* Before it authenticates, a peer may not make the server buffer a big frame:
 * a length above MOONLET_RPC_PRE_AUTH_MAX_FRAME is refused at once, without
 * waiting for (or buffering) the body. */
static void test_pre_auth_frame_limit(void **state)
{
    moonlet_rpc_server_opts o = base_opts();
    o.auth_token = TOKEN;
    o.auth_token_len = strlen(TOKEN);
    moonlet_rpc_server *s = start_opts(&o);
    uint16_t port = moonlet_rpc_server_port(s);

    int fd = raw_connect(port); /* announces 1 MiB, sends none of it */
    raw_send(fd, "\x00\x10\x00\x00", 4);
    raw_expect_reply(fd, 0, MOONLET_ERR_ILLEGAL_CLIENT);
    raw_expect_eof(fd);
    close(fd);

    fd = raw_connect(port); /* just above the limit */
    uint8_t h[4];
    moonlet_frame_header_encode(h, MOONLET_RPC_PRE_AUTH_MAX_FRAME + 1);
    raw_send(fd, h, 4);
    raw_expect_reply(fd, 0, MOONLET_ERR_ILLEGAL_CLIENT);
    raw_expect_eof(fd);
    close(fd);

    /* after AUTH the full limit applies again */
    moonlet_rpc_client *c = connect_ok(s, TOKEN, 2000);
    msgpack_packer *pk = moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 1);
    char *big = calloc(1, 100000);
    assert_non_null(big);
    msgpack_pack_bin(pk, 100000);
    msgpack_pack_bin_body(pk, big, 100000);
    free(big);
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    assert_int_equal(rep.code, 0);
    moonlet_reply_destroy(&rep);
    moonlet_rpc_client_close(c);
    stop_when_idle(s);
}

/* Deadlines: authentication, a frame begun, an idle connection.  Each test
 * waits for the server to close (raw_read is bounded by RAW_TIMEOUT_MS). */
static void test_deadlines(void **state)
{
    moonlet_rpc_server_opts o = base_opts();
    o.auth_token = TOKEN;
    o.auth_token_len = strlen(TOKEN);
    o.auth_timeout_ms = 300;
    moonlet_rpc_server *s = start_opts(&o);
    int fd = raw_connect(moonlet_rpc_server_port(s)); /* never authenticates */
    raw_expect_closed_after(fd, 250);
    moonlet_rpc_client *c = connect_ok(s, TOKEN, 2000); /* an authenticated one stays */
    poll(NULL, 0, 600);
    assert_int_equal(call_add(c, 1, 2), 3);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);

    o = base_opts();
    o.frame_timeout_ms = 300;
    s = start_opts(&o);
    fd = raw_connect(moonlet_rpc_server_port(s)); /* a frame that never completes */
    raw_send(fd, "\0\0\0\x64\x93\x05", 6);
    raw_expect_closed_after(fd, 250);
    fd = raw_connect(moonlet_rpc_server_port(s)); /* idle, no idle timeout: kept */
    raw_send_packed(fd, body_echo_id1);
    raw_expect_reply(fd, 1, 0);
    poll(NULL, 0, 600);
    raw_send_packed(fd, body_echo_id1);
    raw_expect_reply(fd, 1, 0);
    close(fd);
    moonlet_rpc_server_destroy(s);

    o = base_opts();
    o.idle_timeout_ms = 300;
    s = start_opts(&o);
    fd = raw_connect(moonlet_rpc_server_port(s));
    raw_send_packed(fd, body_echo_id1);
    raw_expect_reply(fd, 1, 0);
    raw_expect_closed_after(fd, 250); /* closed once idle for 300 ms */
    stop_when_idle(s);
}

static void body_big_8m(msgpack_packer *pk) /* [1, BIG, [8 MiB]] */
{
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_uint32(pk, M_BIG);
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, 8u << 20);
}

/* Issue 31 finding 7: replies must be taken within frame_timeout_ms of being
 * queued - a deadline, not a progress timer.  A reader that keeps taking a
 * few bytes of an 8 MiB reply (progress every 20 ms) far slower than the
 * deadline allows is disconnected there, and the server frees the reply
 * (counted; the connection's on_close ran). */
static void test_slow_reader_deadline(void **state)
{
    moonlet_rpc_server_opts o = base_opts();
    o.frame_timeout_ms = 400;
    moonlet_rpc_server *s = start_opts(&o);
    int closes0 = atomic_load(&g_ctx.closes);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(moonlet_rpc_server_port(s)),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    raw_send_packed(fd, body_big_8m);
    int64_t t0 = now_ms();
    size_t got = 0;
    bool closed = false;
    /* the slow reader: 1 KiB every 20 ms (50 KiB/s; 8 MiB would take 160 s);
     * bounded by 4 s and 400 reads */
    for (int i = 0; i < 400 && now_ms() - t0 < 4000 && !closed; i++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 20) < 0)
            break;
        char b[1024];
        ssize_t r = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (r > 0)
            got += (size_t)r;
        else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            closed = true;
        if (r > 0)
            poll(NULL, 0, 20); /* the pace of the slow reader itself */
    }
    int64_t took = now_ms() - t0;
    close(fd);
    assert_true(got > 0);           /* it did make progress */
    assert_true(got < (8u << 20));  /* and never got the whole reply */
    assert_true(closed);            /* yet it was disconnected */
    assert_true(took < 2500);       /* near the 400 ms deadline (+ the 200 ms sweep) */
    assert_int_equal(moonlet_rpc_server_reply_deadline_closes(s), 1);
    assert_true(wait_int(&g_ctx.closes, closes0 + 1)); /* the connection and its reply freed */
    assert_true(wait_conns(s, 0));
    assert_serving(s);
    moonlet_rpc_server_destroy(s);
}

/* The connection cap: a connection beyond it is closed at once; the others
 * are served, and a slot freed is usable again. */
static void test_connection_cap(void **state)
{
    moonlet_rpc_server_opts o = base_opts();
    o.max_connections = 2;
    moonlet_rpc_server *s = start_opts(&o);
    uint16_t port = moonlet_rpc_server_port(s);
    int a = raw_connect(port), b = raw_connect(port);
    assert_true(wait_conns(s, 2));
    int x = raw_connect(port);
    raw_expect_eof(x);
    close(x);
    raw_send_packed(a, body_echo_id1);
    raw_expect_reply(a, 1, 0);
    close(b);
    assert_true(wait_conns(s, 1));
    moonlet_rpc_client *c = connect_ok(s, NULL, 2000);
    assert_int_equal(call_add(c, 2, 2), 4);
    moonlet_rpc_client_close(c);
    close(a);
    stop_when_idle(s);
}

/* A request with more elements than max_request_elements is answered
 * INVALID_PARAMS before it is decoded; the connection stays usable. */
static void pack_detach(moonlet_frame_builder *b, uint64_t id, uint64_t tag)
{
    msgpack_pack_uint64(moonlet_request_begin(b, id, M_DETACH, 1), tag);
    assert_int_equal(moonlet_frame_finish(b, 1 << 20), 0);
}

/* A handler takes its connection over (moonlet_rpc_ctx_detach, the
 * replication stream's way in): the reply goes out first, then the server
 * forgets the connection (on_close runs, the count drops) and the taker gets
 * the open socket with the handler's tag; from then on bytes pass between
 * the peer and the taker untouched.  A peer that sent more behind the
 * request is not following the protocol: the connection is closed after the
 * reply and the taker gets nothing. */
static void test_detach(void **state)
{
    moonlet_rpc_server *s = start_server();
    int closes = atomic_load(&g_ctx.closes);
    int fd = raw_connect(moonlet_rpc_server_port(s));
    moonlet_frame_builder b;
    moonlet_frame_builder_init(&b);
    pack_detach(&b, 5, 77);
    raw_send(fd, b.buf.data, b.buf.size);
    raw_expect_reply(fd, 5, 0);
    assert_true(wait_int(&g_takes, 1));
    assert_int_equal(atomic_load(&g_taken_tag), 77);
    assert_true(wait_conns(s, 0));
    assert_int_equal(atomic_load(&g_ctx.closes), closes + 1);
    int taken = atomic_load(&g_taken_fd);
    /* a request now reaches the taker as bytes; nobody answers it */
    raw_send_packed(fd, body_echo_id1);
    uint8_t h[4];
    assert_int_equal(raw_read(taken, h, 4), 4);
    assert_int_equal(send(taken, "pong", 4, MSG_NOSIGNAL), 4);
    char pong[4];
    assert_int_equal(raw_read(fd, pong, 4), 4);
    assert_memory_equal(pong, "pong", 4);
    close(taken);
    raw_expect_eof(fd);
    close(fd);
    /* data behind the request: the reply, then the connection closes */
    fd = raw_connect(moonlet_rpc_server_port(s));
    moonlet_frame_builder_reset(&b);
    pack_detach(&b, 6, 78);
    msgpack_pack_array(moonlet_request_begin(&b, 7, MOONLET_M_ECHO, 0), 0);
    assert_int_equal(moonlet_frame_finish(&b, 1 << 20), 0);
    raw_send(fd, b.buf.data, b.buf.size);
    raw_expect_reply(fd, 6, 0);
    raw_expect_eof(fd);
    close(fd);
    assert_true(wait_conns(s, 0));
    assert_int_equal(atomic_load(&g_takes), 1);
    moonlet_frame_builder_destroy(&b);
    stop_when_idle(s);
}

static void test_request_element_cap(void **state)
{
    moonlet_rpc_server_opts o = base_opts();
    o.max_request_elements = 100;
    moonlet_rpc_server *s = start_opts(&o);
    moonlet_rpc_client *c = connect_ok(s, NULL, 2000);
    for (int n = 90; n <= 1000; n += 910) {
        msgpack_packer *pk = moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 1);
        msgpack_pack_array(pk, (size_t)n);
        for (int i = 0; i < n; i++)
            msgpack_pack_nil(pk);
        moonlet_reply rep;
        assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
        assert_int_equal(rep.code, n <= 100 ? 0 : MOONLET_ERR_INVALID_PARAMS);
        moonlet_reply_destroy(&rep);
    }
    assert_int_equal(call_add(c, 1, 1), 2);
    moonlet_rpc_client_close(c);
    moonlet_rpc_server_destroy(s);
}

int main(void)
{
    moonlet_log_set_level(MOONLET_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calls),
        cmocka_unit_test(test_detach),
        cmocka_unit_test(test_pipelining),
        cmocka_unit_test(test_concurrent_clients),
        cmocka_unit_test(test_result_rewind),
        cmocka_unit_test(test_unknown_method_keeps_connection),
        cmocka_unit_test(test_malformed_input),
        cmocka_unit_test(test_conn_data_and_on_close),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_client_timeout),
        cmocka_unit_test(test_unix_socket),
        cmocka_unit_test(test_stop_with_idle_clients),
        cmocka_unit_test(test_oversized_and_bad_replies),
        cmocka_unit_test(test_client_rejects_bad_requests),
        cmocka_unit_test(test_large_frames),
        cmocka_unit_test(test_backpressure),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_busy_poll),
        cmocka_unit_test(test_callers_outnumber_cores),
        cmocka_unit_test(test_spin_leaves_a_busy_host),
        cmocka_unit_test(test_loop_yields_after_a_long_hold),
        cmocka_unit_test(test_connect_failures),
        cmocka_unit_test(test_rpc_error_helper),
        cmocka_unit_test(test_pre_auth_frame_limit),
        cmocka_unit_test(test_deadlines),
        cmocka_unit_test(test_slow_reader_deadline),
        cmocka_unit_test(test_connection_cap),
        cmocka_unit_test(test_request_element_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
