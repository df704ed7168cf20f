/*
 * test_xfer_contract.c - the data-plane transport contract (transport/xfer.h),
 * run unchanged against every backend: TCP always, verbs when an RDMA device
 * exists (otherwise every verbs case is skipped with "no RDMA device").
 *
 * Addresses: TCP serves on 127.0.0.1.  RDMA does not exist on loopback, so
 * the verbs group serves on MOONLET_XFER_RDMA_ADDR (an address of an RDMA
 * interface) and its clients bind MOONLET_XFER_RDMA_SRC (another device's
 * address, so the bytes cross a wire); the `rdma` suite sets both inside its
 * Soft-RoCE guest (tests/rdma/guest.sh), with MOONLET_XFER_REQUIRE_RDMA=1:
 * then nothing may be skipped, a missing device fails the group.
 * MOONLET_XFER_CASES=rdma runs only the verbs group (and the backend choice).
 *
 * Each group starts a serving instance on <address>:0 with a 64 MiB segment
 * framed by guard canaries, and a client instance with a registered 64 MiB
 * local buffer, also framed.  Cases check the bytes on both sides and that
 * no refused request touched anything outside its range.  Every loop is
 * bounded; threads are joined; the only sockets are on loopback.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "moonlet/error.h"
#include "monotime.h"
#include "xfer.h"
#include "../common/capture.h"
#include "../common/threads.h"

#define SEG_SIZE (64u << 20)
#define GUARD 4096u
#define CANARY 0xA5
#define TIMEOUT_MS 2000u

typedef struct fixture {
    moonlet_xfer_protocol proto;
    const char *host;   /* the address servers listen on */
    char listen[128];   /* host:0 */
    const char *skip_reason;
    moonlet_xfer *server;
    moonlet_xfer *client;
    uint8_t *seg_map;   /* GUARD | segment | GUARD */
    uint8_t *seg;
    uint8_t *loc_map;   /* GUARD | local buffer | GUARD */
    uint8_t *loc;
    moonlet_xfer_segment_info info;
} fixture;

static uint8_t *map_framed(size_t len)
{
    uint8_t *p = mmap(NULL, len + 2 * GUARD, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    assert_true(p != MAP_FAILED);
    memset(p, CANARY, GUARD);
    memset(p + GUARD + len, CANARY, GUARD);
    return p;
}

static void assert_canaries(const uint8_t *map, size_t len)
{
    for (size_t i = 0; i < GUARD; i++) {
        assert_int_equal(map[i], CANARY);
        assert_int_equal(map[GUARD + len + i], CANARY);
    }
}

static void check_all_canaries(const fixture *f)
{
    assert_canaries(f->seg_map, SEG_SIZE);
    assert_canaries(f->loc_map, SEG_SIZE);
}

/* Deterministic bytes that differ by seed and position. */
static void fill(uint8_t *p, uint64_t len, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1;
    for (uint64_t i = 0; i < len; i++) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        p[i] = (uint8_t)s;
    }
}

static void assert_pattern(const uint8_t *p, uint64_t len, uint32_t seed)
{
    uint8_t *want = malloc(len ? len : 1);
    assert_non_null(want);
    fill(want, len, seed);
    assert_memory_equal(p, want, len);
    free(want);
}

static int make_instance(moonlet_xfer_protocol proto, const char *listen, const char *token,
                         uint32_t timeout_ms, moonlet_xfer **out)
{
    /* verbs clients bind the source address the harness gives (NULL: any) */
    const char *src = proto == MOONLET_XFER_RDMA && !listen ? getenv("MOONLET_XFER_RDMA_SRC")
                                                            : NULL;
    moonlet_xfer_opts o = {.protocol = proto, .listen_addr = listen, .auth_token = token,
                           .conns_per_peer = 4, .server_threads = 4, .timeout_ms = timeout_ms,
                           .source_addr = src};
    return moonlet_xfer_create(&o, out);
}

static int group_setup(void **state, moonlet_xfer_protocol proto)
{
    fixture *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->proto = proto;
    f->host = "127.0.0.1";
    if (proto == MOONLET_XFER_RDMA && getenv("MOONLET_XFER_RDMA_ADDR"))
        f->host = getenv("MOONLET_XFER_RDMA_ADDR");
    snprintf(f->listen, sizeof(f->listen), "%s:0", f->host);
    *state = f;
    int rc = make_instance(proto, f->listen, NULL, TIMEOUT_MS, &f->server);
    bool required = getenv("MOONLET_XFER_REQUIRE_RDMA") &&
                    strcmp(getenv("MOONLET_XFER_REQUIRE_RDMA"), "1") == 0;
    if (proto == MOONLET_XFER_RDMA && rc == MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS &&
        !required) {
        f->skip_reason = "no RDMA device";
        return 0;
    }
    assert_int_equal(rc, MOONLET_OK);
    assert_int_equal(make_instance(proto, NULL, NULL, TIMEOUT_MS, &f->client), MOONLET_OK);
    f->seg_map = map_framed(SEG_SIZE);
    f->seg = f->seg_map + GUARD;
    f->loc_map = map_framed(SEG_SIZE);
    f->loc = f->loc_map + GUARD;
    assert_int_equal(moonlet_xfer_register_segment(f->server, f->seg, SEG_SIZE, &f->info), 0);
    assert_int_equal(moonlet_xfer_register_buffer(f->client, f->loc, SEG_SIZE), 0);
    return 0;
}

static int setup_tcp(void **state) { return group_setup(state, MOONLET_XFER_TCP); }
static int setup_rdma(void **state) { return group_setup(state, MOONLET_XFER_RDMA); }

static int group_teardown(void **state)
{
    fixture *f = *state;
    moonlet_xfer_destroy(f->client);
    moonlet_xfer_destroy(f->server);
    if (f->seg_map)
        munmap(f->seg_map, SEG_SIZE + 2 * GUARD);
    if (f->loc_map)
        munmap(f->loc_map, SEG_SIZE + 2 * GUARD);
    free(f);
    return 0;
}

/* Every case starts here: skips when the backend is unavailable. */
static fixture *begin(void **state)
{
    fixture *f = *state;
    if (f->skip_reason) {
        print_message("skipped: %s\n", f->skip_reason);
        skip();
    }
    return f;
}

static int do_read(fixture *f, uint64_t off, void *dst, uint64_t len)
{
    return moonlet_xfer_read(f->client, f->info.endpoint, f->info.segment_id, off, dst, len);
}

static int do_write(fixture *f, uint64_t off, const void *src, uint64_t len)
{
    return moonlet_xfer_write(f->client, f->info.endpoint, f->info.segment_id, off, src, len);
}

/* Writes a pattern, checks it landed in the segment, reads it back. */
static void roundtrip(fixture *f, uint64_t off, uint64_t len, uint32_t seed)
{
    fill(f->loc, len, seed);
    assert_int_equal(do_write(f, off, f->loc, len), MOONLET_OK);
    assert_pattern(f->seg + off, len, seed);
    memset(f->loc, 0, len);
    fill(f->seg + off, len, seed + 1); /* make the read observable */
    assert_int_equal(do_read(f, off, f->loc, len), MOONLET_OK);
    assert_pattern(f->loc, len, seed + 1);
    check_all_canaries(f);
}

static void test_info(void **state)
{
    fixture *f = begin(state);
    const char *want = f->proto == MOONLET_XFER_TCP ? "tcp" : "rdma";
    assert_string_equal(moonlet_xfer_protocol_name(f->server), want);
    assert_string_equal(f->info.protocol, want);
    assert_int_equal(f->info.size, SEG_SIZE);
    assert_int_equal(f->info.base, (uint64_t)(uintptr_t)f->seg);
    size_t hl = strlen(f->host);
    assert_int_equal(strncmp(f->info.endpoint, f->host, hl), 0);
    assert_int_equal(f->info.endpoint[hl], ':');
    assert_true(atoi(f->info.endpoint + hl + 1) > 0);
    char ep[64];
    assert_int_equal(moonlet_xfer_local_endpoint(f->server, ep, sizeof(ep)), 0);
    assert_string_equal(ep, f->info.endpoint);
    assert_int_equal(moonlet_xfer_local_endpoint(f->client, ep, sizeof(ep)),
                     MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    assert_int_equal(moonlet_xfer_connect(f->client, f->info.endpoint), MOONLET_OK);
}

static void test_sizes(void **state)
{
    fixture *f = begin(state);
    static const uint64_t sizes[] = {1, 3, 4096, 65536 + 7, 1u << 20, 16u << 20, 64u << 20};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint64_t off = sizes[i] < SEG_SIZE ? (SEG_SIZE - sizes[i]) / 3 : 0;
        roundtrip(f, off, sizes[i], (uint32_t)i + 10);
    }
}

static void test_edges(void **state)
{
    fixture *f = begin(state);
    roundtrip(f, 0, 1, 21);                       /* first byte */
    roundtrip(f, SEG_SIZE - 1, 1, 22);            /* last byte */
    roundtrip(f, SEG_SIZE - 4096, 4096, 23);      /* the last page exactly */
    roundtrip(f, 0, SEG_SIZE, 24);                /* the whole segment */
    assert_int_equal(do_read(f, SEG_SIZE, f->loc, 0), MOONLET_OK); /* empty, at the end */
}

static void test_batch(void **state)
{
    fixture *f = begin(state);
    enum { N = 12, CHUNK = 256 * 1024 };
    moonlet_xfer_op ops[N + 3];
    for (int i = 0; i < N; i++) {
        fill(f->loc + (size_t)i * CHUNK, CHUNK - (uint64_t)i, 100u + (uint32_t)i);
        ops[i] = (moonlet_xfer_op){.opcode = MOONLET_XFER_WRITE, .endpoint = f->info.endpoint,
                                   .segment_id = f->info.segment_id,
                                   .offset = (uint64_t)i * CHUNK + 5, .local = f->loc + (size_t)i * CHUNK,
                                   .len = CHUNK - (uint64_t)i, .status = 12345};
    }
    assert_int_equal(moonlet_xfer_submit(f->client, ops, N), MOONLET_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(ops[i].status, MOONLET_OK);
        assert_pattern(f->seg + (size_t)i * CHUNK + 5, CHUNK - (uint64_t)i, 100u + (uint32_t)i);
    }
    /* reads, with a refused one, an unknown segment and an empty op mixed in */
    memset(f->loc, 0, (size_t)N * CHUNK);
    for (int i = 0; i < N; i++) {
        ops[i].opcode = MOONLET_XFER_READ;
        ops[i].status = 12345;
    }
    ops[N] = (moonlet_xfer_op){.opcode = MOONLET_XFER_READ, .endpoint = f->info.endpoint,
                               .segment_id = f->info.segment_id, .offset = SEG_SIZE - 8,
                               .local = f->loc + (size_t)N * CHUNK, .len = 9, .status = 12345};
    ops[N + 1] = ops[N];
    ops[N + 1].segment_id = "not-a-segment";
    ops[N + 1].offset = 0;
    ops[N + 2] = ops[N];
    ops[N + 2].len = 0;
    /* one refused op in the middle must not disturb the others */
    moonlet_xfer_op tmp = ops[N];
    ops[N] = ops[3];
    ops[3] = tmp;
    int rc = moonlet_xfer_submit(f->client, ops, N + 3);
    assert_int_equal(rc, MOONLET_ERR_INVALID_PARAMS); /* the first failed op, in array order */
    for (int i = 0; i < N + 3; i++) {
        int want = i == 3 ? MOONLET_ERR_INVALID_PARAMS
                 : i == N + 1 ? MOONLET_ERR_SEGMENT_NOT_FOUND : MOONLET_OK;
        assert_int_equal(ops[i].status, want);
    }
    for (int i = 0; i < N; i++) {
        int slot = i == 3 ? N : i;
        assert_pattern(ops[slot].local, ops[slot].len, 100u + (uint32_t)i);
    }
    check_all_canaries(f);
}

typedef struct worker_arg {
    fixture *f;
    int index;
    int errors;
    int ops_done;
} worker_arg;

static void *worker_main(void *p)
{
    worker_arg *a = p;
    fixture *f = a->f;
    const uint64_t region = 4u << 20;
    uint8_t *mine = f->loc + (size_t)a->index * 2 * region; /* src and dst halves */
    uint64_t seg_off = (uint64_t)a->index * region;
    uint32_t rnd = (uint32_t)a->index * 7919u + 1;
    for (int it = 0; it < 40; it++) {
        rnd = rnd * 1103515245u + 12345u;
        uint64_t len = 1 + (rnd >> 8) % (512u * 1024);
        uint32_t seed = (uint32_t)(a->index * 1000 + it);
        fill(mine, len, seed);
        int rc = do_write(f, seg_off, mine, len);
        rc |= do_read(f, seg_off, mine + region, len);
        if (rc || memcmp(mine, mine + region, len) != 0)
            a->errors++;
        a->ops_done += 2;
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    fixture *f = begin(state);
    worker_arg args[4];
    for (int i = 0; i < 4; i++)
        args[i] = (worker_arg){.f = f, .index = i};
    test_threads_run(worker_main, args, sizeof(args[0]), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(args[i].errors, 0);
        assert_int_equal(args[i].ops_done, 80);
    }
    check_all_canaries(f);
}

static void test_out_of_bounds(void **state)
{
    fixture *f = begin(state);
    uint8_t tail[64];
    memset(f->seg + SEG_SIZE - sizeof(tail), 0x3c, sizeof(tail));
    memcpy(tail, f->seg + SEG_SIZE - sizeof(tail), sizeof(tail));
    memset(f->loc, 0x77, 4096);
    /* offset + len > size */
    assert_int_equal(do_write(f, SEG_SIZE - 10, f->loc, 11), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(do_read(f, SEG_SIZE - 10, f->loc, 11), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(do_write(f, SEG_SIZE, f->loc, 1), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(do_write(f, SEG_SIZE + 4096, f->loc, 16), MOONLET_ERR_INVALID_PARAMS);
    /* offset + len overflowing uint64 */
    assert_int_equal(do_write(f, UINT64_MAX - 5, f->loc, 10), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(do_read(f, UINT64_MAX - 5, f->loc, 10), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(do_read(f, 16, f->loc, UINT64_MAX - 8), MOONLET_ERR_INVALID_PARAMS);
    assert_memory_equal(f->seg + SEG_SIZE - sizeof(tail), tail, sizeof(tail));
    for (int i = 0; i < 4096; i++)
        assert_int_equal(f->loc[i], 0x77);
    check_all_canaries(f);
    /* the connection still works afterwards */
    roundtrip(f, SEG_SIZE - 10, 10, 31);
}

static void test_unknown_segment(void **state)
{
    fixture *f = begin(state);
    memset(f->loc, 0x55, 64);
    assert_int_equal(moonlet_xfer_read(f->client, f->info.endpoint, "zz", 0, f->loc, 8),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);
    assert_int_equal(moonlet_xfer_write(f->client, f->info.endpoint, "", 0, f->loc, 8),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);
    /* a well-formed id that names nothing: a second, then unregistered segment */
    uint8_t *other = map_framed(1u << 20);
    moonlet_xfer_segment_info gone;
    assert_int_equal(moonlet_xfer_register_segment(f->server, other + GUARD, 1u << 20, &gone), 0);
    assert_string_not_equal(gone.segment_id, f->info.segment_id);
    assert_int_equal(moonlet_xfer_write(f->client, gone.endpoint, gone.segment_id, 0, f->loc, 64),
                     MOONLET_OK);
    assert_int_equal(other[GUARD], 0x55);
    assert_int_equal(moonlet_xfer_unregister_segment(f->server, gone.segment_id), MOONLET_OK);
    assert_int_equal(moonlet_xfer_unregister_segment(f->server, gone.segment_id),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);
    memset(other + GUARD, 0, 64);
    int rc = moonlet_xfer_write(f->client, gone.endpoint, gone.segment_id, 0, f->loc, 64);
    if (f->proto == MOONLET_XFER_TCP)
        assert_int_equal(rc, MOONLET_ERR_SEGMENT_NOT_FOUND);
    else
        assert_int_not_equal(rc, MOONLET_OK); /* verbs: the NIC refuses the stale rkey */
    assert_int_equal(other[GUARD], 0);
    assert_canaries(other, 1u << 20);
    munmap(other, (1u << 20) + 2 * GUARD);
    check_all_canaries(f);
    roundtrip(f, 0, 100, 41); /* still serving */
}

static void test_bad_arguments(void **state)
{
    fixture *f = begin(state);
    assert_int_equal(moonlet_xfer_read(f->client, "no-port", f->info.segment_id, 0, f->loc, 1),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_xfer_read(f->client, f->info.endpoint, f->info.segment_id, 0, NULL, 1),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_xfer_unregister_buffer(f->client, f->loc + 1),
                     MOONLET_ERR_INVALID_PARAMS);
    moonlet_xfer_segment_info si;
    assert_int_equal(moonlet_xfer_register_segment(f->client, f->loc, 4096, &si),
                     MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    moonlet_xfer_protocol p;
    assert_int_equal(moonlet_xfer_parse_protocol("auto", &p), 0);
    assert_int_equal(p, MOONLET_XFER_AUTO);
    assert_int_equal(moonlet_xfer_parse_protocol("ib", &p), MOONLET_ERR_INVALID_PARAMS);
    moonlet_xfer *x = NULL;
    assert_int_equal(make_instance(f->proto, "127.0.0.1:99999", NULL, 100, &x),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_null(x);
}

/* Runs fn with stderr captured into a file; returns the captured text. */
static void auth_cases(fixture *f, const char *token)
{
    moonlet_xfer *srv, *good, *bad, *none;
    assert_int_equal(make_instance(f->proto, f->listen, token, TIMEOUT_MS, &srv), 0);
    moonlet_xfer_segment_info si;
    uint8_t *mem = map_framed(1u << 20);
    memset(mem + GUARD, 0x11, 1u << 20);
    assert_int_equal(moonlet_xfer_register_segment(srv, mem + GUARD, 1u << 20, &si), 0);
    assert_int_equal(make_instance(f->proto, NULL, token, TIMEOUT_MS, &good), 0);
    assert_int_equal(make_instance(f->proto, NULL, "wrong-token", TIMEOUT_MS, &bad), 0);
    assert_int_equal(make_instance(f->proto, NULL, NULL, TIMEOUT_MS, &none), 0);
    uint8_t buf[256];
    assert_int_equal(moonlet_xfer_register_buffer(good, buf, sizeof(buf)), 0);
    assert_int_equal(moonlet_xfer_register_buffer(bad, buf, sizeof(buf)), 0);
    assert_int_equal(moonlet_xfer_register_buffer(none, buf, sizeof(buf)), 0);

    memset(buf, 0x22, sizeof(buf));
    assert_int_equal(moonlet_xfer_connect(bad, si.endpoint), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(moonlet_xfer_write(bad, si.endpoint, si.segment_id, 0, buf, 16),
                     MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(moonlet_xfer_read(none, si.endpoint, si.segment_id, 0, buf, 16),
                     MOONLET_ERR_ILLEGAL_CLIENT);
    for (int i = 0; i < 16; i++)
        assert_int_equal(buf[i], 0x22); /* nothing was read */
    assert_int_not_equal(moonlet_xfer_write(none, si.endpoint, si.segment_id, 0, buf, 16),
                         MOONLET_OK);
    assert_int_equal(mem[GUARD], 0x11); /* nothing was written */

    assert_int_equal(moonlet_xfer_connect(good, si.endpoint), MOONLET_OK);
    assert_int_equal(moonlet_xfer_write(good, si.endpoint, si.segment_id, 8, buf, 16), MOONLET_OK);
    assert_int_equal(mem[GUARD + 8], 0x22);
    assert_int_equal(moonlet_xfer_read(good, si.endpoint, si.segment_id, 0, buf + 100, 8),
                     MOONLET_OK);
    assert_int_equal(buf[100], 0x11);
    assert_canaries(mem, 1u << 20);
    moonlet_xfer_destroy(none);
    moonlet_xfer_destroy(bad);
    moonlet_xfer_destroy(good);
    moonlet_xfer_destroy(srv);
    munmap(mem, (1u << 20) + 2 * GUARD);
}

typedef struct auth_run {
    fixture *f;
    const char *token;
} auth_run;

static void run_auth_cases(void *arg)
{
    auth_run *r = arg;
    auth_cases(r->f, r->token);
}

static void test_auth(void **state)
{
    fixture *f = begin(state);
    const char *token = "cluster-Secret-7f3a9c";
    char *log = capture_stderr(run_auth_cases, &(auth_run){f, token});
    assert_non_null(strstr(log, "auth")); /* the refusals were logged ... */
    assert_null(strstr(log, token));      /* ... without the token */
    assert_null(strstr(log, "wrong-token"));
    free(log);
}

typedef struct reader_arg {
    fixture *f;
    const moonlet_xfer_segment_info *si;
    uint8_t *dst;
    volatile int reads_done; /* published for the test thread */
    int rc;
    uint64_t fail_call_ms; /* duration of the call that failed */
    int calls;
} reader_arg;

static void *reader_main(void *p)
{
    reader_arg *a = p;
    uint64_t end = moonlet_mono_ms() + 60000; /* the server goes within 15 s */
    a->rc = MOONLET_OK;
    while (a->rc == MOONLET_OK && moonlet_mono_ms() < end && a->calls < 100000) {
        uint64_t t0 = moonlet_mono_ms();
        a->rc = moonlet_xfer_read(a->f->client, a->si->endpoint, a->si->segment_id, 0, a->dst,
                                  a->si->size);
        a->fail_call_ms = moonlet_mono_ms() - t0;
        a->calls++;
        __atomic_store_n(&a->reads_done, a->calls, __ATOMIC_RELEASE);
    }
    return NULL;
}

/* The serving instance goes away while large reads stream from it. */
static void test_peer_gone(void **state)
{
    fixture *f = begin(state);
    moonlet_xfer *srv;
    assert_int_equal(make_instance(f->proto, f->listen, NULL, TIMEOUT_MS, &srv), 0);
    uint8_t *mem = map_framed(SEG_SIZE);
    moonlet_xfer_segment_info si;
    assert_int_equal(moonlet_xfer_register_segment(srv, mem + GUARD, SEG_SIZE, &si), 0);
    reader_arg a = {.f = f, .si = &si, .dst = f->loc};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, reader_main, &a), 0);
    /* two reads done: the reader streams one read after another now (a
     * 64 MiB read takes seconds over Soft-RoCE under software emulation) */
    for (int i = 0; i < 3000 && __atomic_load_n(&a.reads_done, __ATOMIC_ACQUIRE) < 2; i++)
        usleep(5000);
    if (__atomic_load_n(&a.reads_done, __ATOMIC_ACQUIRE) < 2) {
        pthread_join(th, NULL); /* before the fixture goes: it reads into it */
        fail_msg("the reader did not stream: %d calls in 15 s, the last %s after %" PRIu64 " ms",
                 a.calls, moonlet_strerror(a.rc), a.fail_call_ms);
    }
    moonlet_xfer_destroy(srv); /* closes every connection, mid-transfer or not */
    pthread_join(th, NULL);
    assert_int_equal(a.rc, MOONLET_ERR_TRANSFER_FAIL);
    assert_true(a.fail_call_ms < TIMEOUT_MS + 1000);
    /* nothing listens there any more: refused quickly, no hang */
    uint64_t t0 = moonlet_mono_ms();
    assert_int_equal(moonlet_xfer_read(f->client, si.endpoint, si.segment_id, 0, f->loc, 16),
                     MOONLET_ERR_TRANSFER_FAIL);
    assert_true(moonlet_mono_ms() - t0 < TIMEOUT_MS + 1000);
    munmap(mem, SEG_SIZE + 2 * GUARD);
    check_all_canaries(f);
}

static void create_auto(void *arg)
{
    moonlet_log_set_level(MOONLET_LOG_INFO);
    moonlet_xfer **out = arg;
    assert_int_equal(make_instance(MOONLET_XFER_AUTO, NULL, NULL, TIMEOUT_MS, out), 0);
    moonlet_log_set_level(MOONLET_LOG_WARN);
}

/* `auto` picks verbs exactly when an RDMA device is usable, and says which
 * in exactly one INFO line. */
static void test_auto_choice(void **state)
{
    (void)state;
    moonlet_xfer *r = NULL, *a = NULL;
    int rc = make_instance(MOONLET_XFER_RDMA, NULL, NULL, TIMEOUT_MS, &r);
    char *log = capture_stderr(create_auto, &a);
    const char *line = strstr(log, "INFO");
    assert_non_null(line);
    assert_non_null(strstr(line, "transport: "));
    assert_null(strstr(line + 4, "INFO"));
    if (rc == MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS)
        assert_non_null(strstr(line, "transport: no RDMA device found, using TCP"));
    free(log);
    if (rc == MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS) {
        assert_null(r);
        assert_string_equal(moonlet_xfer_protocol_name(a), "tcp");
    } else {
        assert_int_equal(rc, MOONLET_OK);
        assert_string_equal(moonlet_xfer_protocol_name(a), "rdma");
    }
    moonlet_xfer_destroy(a);
    moonlet_xfer_destroy(r);
}

#include "../common/tsan_loopback.h" /* the loopback round trip TSan cannot see */

#define CONTRACT_CASES                                                                      \
    cmocka_unit_test(test_info), cmocka_unit_test(test_sizes), cmocka_unit_test(test_edges),  \
        cmocka_unit_test(test_batch), cmocka_unit_test(test_concurrent),                    \
        cmocka_unit_test(test_out_of_bounds), cmocka_unit_test(test_unknown_segment),       \
        cmocka_unit_test(test_bad_arguments), cmocka_unit_test(test_auth),                  \
        cmocka_unit_test(test_peer_gone)

int main(void)
{
    moonlet_log_set_level(MOONLET_LOG_WARN);
    const char *only = getenv("MOONLET_XFER_CASES"); /* "concurrent": the TSan run */
    if (only && strcmp(only, "concurrent") == 0) {
        const struct CMUnitTest c[] = {cmocka_unit_test(test_concurrent)};
        return cmocka_run_group_tests_name("xfer contract tcp (concurrent)", c, setup_tcp,
                                           group_teardown);
    }
    const struct CMUnitTest tcp[] = {CONTRACT_CASES};
    const struct CMUnitTest rdma[] = {CONTRACT_CASES};
 const struct CMUnitTest misc[] = {cmocka_unit_test(test_auto_choice)};
    int fails = 0;
    if (!only || strcmp(only, "rdma") != 0)
        fails += cmocka_run_group_tests_name("xfer contract tcp", tcp, setup_tcp, group_teardown);
    fails += cmocka_run_group_tests_name("xfer contract rdma", rdma, setup_rdma, group_teardown);
    fails += cmocka_run_group_tests_name("xfer backend choice", misc, NULL, NULL);
    return fails;
}
