/*
 * Test of the client layers: the DummyClient backend of moonlet_client
 * (store/dummy_client.c) against a RealClient run as a process
 * (moonlet-store --serve-dummy, store/real_client.c), with a master.
 *
 * Round trips of every call from 0 B to 64 MiB of random bytes (through
 * the staging area and through one-off areas), the probe-with-policy path
 * on the K3 worked example checked through moonlet_client_inspect_key (the
 * policy reaches the master unchanged; NONE leases nothing), invalid
 * policies passed up as -600, tenant isolation, zero-copy shared memory and
 * registered caller memory, parallel calls, the socket's mode, malformed
 * and hostile requests on the socket, a DummyClient that dies (the
 * RealClient unmaps its memory) and a RealClient that stops or dies during
 * a call (bounded errors, never a hang).  Every process is stopped by its
 * own PID.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "../common/cluster.h"
#include "dummy_proto.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "rpc_client.h"
#include "wire.h"

#define MiB (1024u * 1024u)

static test_proc g_master, g_real;
static char g_sock[108];
static moonlet_client *g_dc; /* a DummyClient with a 1 MiB staging area */

/* ---- fixture ------------------------------------------------------------------ */

/* Reads lines from p's stdout until one starts with `prefix` (bounded). */
static bool wait_line(test_proc *p, const char *prefix, int timeout_ms)
{
    char line[512];
    size_t len = 0;
    long long deadline = proc_now_ms() + timeout_ms;
    while (proc_now_ms() < deadline && len < sizeof(line) - 1) {
        struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        if (read(p->out_fd, line + len, 1) != 1)
            return false;
        if (line[len] == '\n') {
            line[len] = 0;
            if (strncmp(line, prefix, strlen(prefix)) == 0)
                return true;
            len = 0;
            continue;
        }
        len++;
    }
    return false;
}

/* moonlet-store --serve-dummy path over TCP, plus `extra` flags; 0 once it
 * serves. */
static int start_real(test_proc *p, const char *path, const char *size, const char *const *extra)
{
    char *argv[CL_MAX_ARGS] = {"tools/moonlet-store", "--master", g_master.addr,
                               "--segment-size", (char *)size, "--protocol", "tcp",
                               "--listen", "127.0.0.1:0", "--ping-interval-ms", "100",
                               "--log-level", "error", "--serve-dummy", (char *)path};
    int n = 15;
    cl_append(argv, &n, extra);
    if (proc_start(p, argv, 10000))
        return -1;
    char want[160];
    snprintf(want, sizeof(want), "serving dummy clients on %s", path);
    if (!wait_line(p, want, 5000)) {
        proc_stop(p);
        return -1;
    }
    return 0;
}

static moonlet_client *new_dummy(const char *path, uint64_t staging, uint32_t timeout_ms,
                                 const char *tenant)
{
    moonlet_dummy_config cfg;
    moonlet_dummy_config_init(&cfg);
    cfg.staging_bytes = staging;
    cfg.rpc_timeout_ms = timeout_ms;
    cfg.default_tenant = tenant;
    moonlet_client *c = NULL;
    int rc = moonlet_client_create_dummy(path, &cfg, &c);
    if (rc)
        fail_msg("create_dummy %s: %s", path, moonlet_strerror(rc));
    return c;
}

static int setup(void **state)
{
    (void)state;
    static const char *const flags[] = {"--client_live_ttl_sec", "2", NULL};
    snprintf(g_sock, sizeof(g_sock), "/tmp/moonlet-test-dummy-%ld.sock", (long)getpid());
    if (cl_start_master(&g_master, flags) || start_real(&g_real, g_sock, "320MiB", NULL))
        return -1;
    g_dc = new_dummy(g_sock, 1 * MiB, 20000, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    moonlet_client_destroy(g_dc);
    int rc = proc_stop(&g_real);
    proc_stop(&g_master);
    if (rc != 0)
        fprintf(stderr, "moonlet-store --serve-dummy exited %d on SIGTERM\n", rc);
    return rc == 0 && access(g_sock, F_OK) != 0 ? 0 : -1; /* exit 0, socket removed */
}

static unsigned char *random_bytes(size_t len, uint64_t seed)
{
    unsigned char *p = malloc(len ? len : 1);
    cl_fill(p, len, seed);
    return p;
}

static void assert_get_equals(moonlet_client *c, const char *key, const char *tenant,
                              const void *want, size_t size)
{
    unsigned char *got = malloc(size ? size : 1);
    size_t len = 999;
    int rc = moonlet_client_get(c, key, got, size, &len, tenant);
    if (rc)
        fail_msg("get %s: %s", key, moonlet_strerror(rc));
    assert_int_equal(len, size);
    assert_memory_equal(got, want, size);
    free(got);
}

/* lease_remaining_ms of a key through moonlet_client_inspect_key; -1 when absent. */
static long long lease_ms(moonlet_client *c, const char *key, const char *tenant)
{
    char *json = NULL;
    if (moonlet_client_inspect_key(c, key, tenant, &json) != MOONLET_OK)
        return -1;
    cJSON *j = cJSON_Parse(json);
    free(json);
    assert_non_null(j);
    long long v = (long long)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "lease_remaining_ms"));
    cJSON_Delete(j);
    return v;
}

/* ---- round trips ---------------------------------------------------------------- */

static void test_create_errors(void **state)
{
    (void)state;
    moonlet_client *c = (moonlet_client *)0x1;
    assert_int_equal(moonlet_client_create_dummy(NULL, NULL, &c), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_create_dummy(g_sock, NULL, NULL), MOONLET_ERR_INVALID_PARAMS);
    char longp[200];
    memset(longp, 'a', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = 0;
    assert_int_equal(moonlet_client_create_dummy(longp, NULL, &c), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_create_dummy("/tmp/moonlet-no-such.sock", NULL, &c),
                     MOONLET_ERR_RPC_FAIL);
    /* the master's port is not a unix socket: nothing to connect to */
    assert_int_equal(moonlet_client_create_dummy("/", NULL, &c), MOONLET_ERR_RPC_FAIL);

    moonlet_client *d = new_dummy(g_sock, 0, 0, NULL);
    assert_string_equal(moonlet_client_protocol(d), "tcp");
    char ep[64];
    assert_int_equal(moonlet_client_local_endpoint(d, ep, sizeof(ep)),
                     MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    moonlet_client_destroy(d);
}

static void test_roundtrip_sizes(void **state)
{
    (void)state;
    /* staging 1 MiB: sizes above it take the one-off path; 64 MiB both ways */
    moonlet_client *big = new_dummy(g_sock, 0, 20000, NULL); /* default 64 MiB staging */
    const size_t sizes[] = {0, 1, 4095, 4096, 1 * MiB, 1 * MiB + 7, 5 * MiB + 3, 64 * MiB};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        for (int which = 0; which < 2; which++) {
            moonlet_client *c = which ? big : g_dc;
            if (sizes[i] == 64 * MiB && which == 0)
                continue; /* one 64 MiB object per path is enough: see below */
            char key[64];
            snprintf(key, sizeof(key), "rt/%zu/%d", sizes[i], which);
            unsigned char *data = random_bytes(sizes[i], i * 2 + (size_t)which + 1);
            int rc = moonlet_client_put(c, key, data, sizes[i], NULL);
            if (rc)
                fail_msg("put %s: %s", key, moonlet_strerror(rc));
            assert_get_equals(c, key, NULL, data, sizes[i]);
            /* the other DummyClient reads it too: the bytes are in the store */
            assert_get_equals(which ? g_dc : big, key, NULL, data, sizes[i]);
            void *a = NULL;
            size_t alen = 1;
            assert_int_equal(moonlet_client_get_alloc(c, key, &a, &alen, NULL), MOONLET_OK);
            assert_non_null(a);
            assert_int_equal(alen, sizes[i]);
            assert_memory_equal(a, data, sizes[i]);
            free(a);
            uint64_t sz = 1;
            assert_int_equal(moonlet_client_get_size(c, key, &sz, NULL), MOONLET_OK);
            assert_int_equal(sz, sizes[i]);
            if (sizes[i] > 0) {
                unsigned char small[1];
                size_t len = 0;
                size_t cap = sizes[i] - 1 < sizeof(small) ? sizes[i] - 1 : sizeof(small);
                assert_int_equal(moonlet_client_get(c, key, small, cap, &len, NULL),
                                 MOONLET_ERR_BUFFER_OVERFLOW);
                assert_int_equal(len, sizes[i]);
            }
            assert_int_equal(moonlet_client_put(c, key, data, sizes[i], NULL),
                             MOONLET_ERR_OBJECT_ALREADY_EXISTS);
            /* the gets leased it */
            assert_int_equal(moonlet_client_remove(c, key, NULL), MOONLET_ERR_OBJECT_HAS_LEASE);
            free(data);
        }
    }
    /* 64 MiB through the 1 MiB-staging client, into a buffer far larger than
     * staging: the one-off path, both directions */
    unsigned char *data = random_bytes(64 * MiB, 77);
    assert_int_equal(moonlet_client_put(g_dc, "rt/64m", data, 64 * MiB, NULL), MOONLET_OK);
    assert_get_equals(g_dc, "rt/64m", NULL, data, 64 * MiB);
    free(data);
    moonlet_client_destroy(big);
}

/* The same call on the DummyClient and on a real client of the same master
 * gives the same code: the layers pass errors up unchanged. */
static void test_errors_pass_through(void **state)
{
    (void)state;
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg);
    cfg.master_addr = g_master.addr;
    cfg.protocol = MOONLET_PROTOCOL_TCP;
    moonlet_client *real = NULL;
    assert_int_equal(moonlet_client_create(&cfg, &real), MOONLET_OK);
    moonlet_client *both[2] = {g_dc, real};
    int got[2][12];
    char longkey[MOONLET_MAX_KEY_BYTES + 2];
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = 0;
    for (int b = 0; b < 2; b++) {
        moonlet_client *c = both[b];
        size_t len = 12345;
        char buf[8];
        uint64_t sz;
        bool yes = true;
        char *json = buf;
        moonlet_put_options nine = {.replica_num = 9};
        char key[32];
        snprintf(key, sizeof(key), "ups/%d", b);
        int k = 0;
        got[b][k++] = moonlet_client_get(c, "nope", buf, sizeof(buf), &len, NULL);
        assert_int_equal(len, 12345); /* untouched when the lookup failed */
        got[b][k++] = moonlet_client_get_size(c, "nope", &sz, NULL);
        got[b][k++] = moonlet_client_remove(c, "nope", NULL);
        got[b][k++] = moonlet_client_inspect_key(c, "nope", NULL, &json);
        assert_null(json);
        got[b][k++] = moonlet_client_put(c, "", "x", 1, NULL);
        got[b][k++] = moonlet_client_put(c, longkey, "x", 1, NULL);
        got[b][k++] = moonlet_client_put(c, "nine", "x", 1, &nine);
        got[b][k++] = moonlet_client_exist_key(c, longkey, &yes, NULL);
        /* upsert replaces; an object under a lease cannot be replaced */
        assert_int_equal(moonlet_client_upsert(c, key, "one", 3, NULL), MOONLET_OK);
        assert_int_equal(moonlet_client_remove(c, key, NULL), MOONLET_OK);
        assert_int_equal(moonlet_client_upsert(c, key, "two!", 4, NULL), MOONLET_OK);
        assert_get_equals(c, key, NULL, "two!", 4); /* the get leased it */
        got[b][k++] = moonlet_client_upsert(c, key, "three", 5, NULL);
        got[b][k++] = moonlet_client_remove(c, key, NULL);
        /* NULL arguments are refused (the DummyClient sends nothing) */
        got[b][k++] = moonlet_client_put(c, NULL, "x", 1, NULL);
        got[b][k++] = moonlet_client_get(c, "k", NULL, 4, &len, NULL);
    }
    const int want[12] = {MOONLET_ERR_OBJECT_NOT_FOUND, MOONLET_ERR_OBJECT_NOT_FOUND,
                          MOONLET_ERR_OBJECT_NOT_FOUND, MOONLET_ERR_OBJECT_NOT_FOUND,
                          got[1][4], got[1][5], got[1][6], got[1][7],
                          MOONLET_ERR_OBJECT_HAS_LEASE, MOONLET_ERR_OBJECT_HAS_LEASE,
                          MOONLET_ERR_INVALID_PARAMS, MOONLET_ERR_INVALID_PARAMS};
    for (int k = 0; k < 12; k++) {
        if (got[0][k] != got[1][k] || got[1][k] != want[k])
            fail_msg("case %d: dummy %d, real %d, want %d", k, got[0][k], got[1][k], want[k]);
        assert_true(got[0][k] < 0);
    }
    moonlet_client_destroy(real);
}

/* ---- probes: the K3 worked example ------------------------------------------------- */

static const char *const k3_keys[6] = {"kda/128/r0", "kda/128/r1", "kda/256/r0",
                                       "kda/256/r1", "kda/384/r0", "kda/384/r1"};

static void test_k3_probe_policy(void **state)
{
    (void)state;
    const char *t = "k3";
    /* 256 lacks r0, 384 lacks r1 */
    for (int i = 0; i < 6; i++)
        if (i != 2 && i != 5)
            assert_int_equal(moonlet_client_put(g_dc, k3_keys[i], "kv", 2,
                                                &(moonlet_put_options){.tenant = t}),
                             MOONLET_OK);
    for (int i = 0; i < 6; i++)
        assert_int_equal(lease_ms(g_dc, k3_keys[i], t), i == 2 || i == 5 ? -1 : 0);

    int32_t r[6];
    /* invalid policies: -600 passed up unchanged, nothing leased */
    moonlet_grant_lease_policy bad[] = {{7, 2}, {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 0},
                                        {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 4}};
    for (size_t b = 0; b < 3; b++)
        assert_int_equal(moonlet_client_batch_probe_key(g_dc, bad[b], k3_keys, 6, r, t),
                         MOONLET_ERR_INVALID_PARAMS);

    /* NONE: point-in-time existence, leases unchanged */
    assert_int_equal(moonlet_client_batch_probe_key(g_dc, MOONLET_GRANT_LEASE_POLICY_DEFAULT,
                                                    k3_keys, 6, r, t),
                     MOONLET_OK);
    const int32_t none_want[6] = {1, 1, 0, 1, 1, 0};
    assert_memory_equal(r, none_want, sizeof(r));
    bool yes = false;
    assert_int_equal(moonlet_client_probe_key(g_dc, "kda/256/r1", &yes, t), MOONLET_OK);
    assert_true(yes);
    for (int i = 0; i < 6; i++)
        assert_int_equal(lease_ms(g_dc, k3_keys[i], t), i == 2 || i == 5 ? -1 : 0);

    /* LAST_HIT_ONLY, candidates of 2: only checkpoint 128 is complete */
    moonlet_grant_lease_policy lho = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 2};
    assert_int_equal(moonlet_client_batch_probe_key(g_dc, lho, k3_keys, 6, r, t), MOONLET_OK);
    const int32_t lho_want[6] = {1, 1, 0, 0, 0, 0};
    assert_memory_equal(r, lho_want, sizeof(r));
    for (int i = 0; i < 6; i++) {
        long long ms = lease_ms(g_dc, k3_keys[i], t);
        if (i < 2)
            assert_true(ms > 0);
        else
            assert_int_equal(ms, i == 2 || i == 5 ? -1 : 0);
    }

    /* BatchExistKey leases every hit */
    assert_int_equal(moonlet_client_batch_exist_key(g_dc, k3_keys, 6, r, t), MOONLET_OK);
    assert_memory_equal(r, none_want, sizeof(r));
    assert_true(lease_ms(g_dc, "kda/384/r0", t) > 0);
    assert_int_equal(moonlet_client_exist_key(g_dc, "kda/256/r0", &yes, t), MOONLET_OK);
    assert_false(yes);
    const char *nullkey[2] = {"a", NULL};
    assert_int_equal(moonlet_client_batch_exist_key(g_dc, nullkey, 2, r, t),
                     MOONLET_ERR_INVALID_PARAMS);
    /* an empty batch is a valid call */
    assert_int_equal(moonlet_client_batch_probe_key(g_dc, lho, k3_keys, 0, r, t), MOONLET_OK);
}

static void test_tenant_isolation(void **state)
{
    (void)state;
    moonlet_client *ta = new_dummy(g_sock, 0, 0, "tenant-a");
    moonlet_put_options ob = {.tenant = "tenant-b"};
    assert_int_equal(moonlet_client_put(ta, "same", "AAAA", 4, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_put(ta, "same", "BBBBBB", 6, &ob), MOONLET_OK);
    assert_get_equals(ta, "same", NULL, "AAAA", 4);
    assert_get_equals(ta, "same", "tenant-b", "BBBBBB", 6);
    assert_get_equals(g_dc, "same", "tenant-a", "AAAA", 4);
    char buf[8];
    size_t len;
    assert_int_equal(moonlet_client_get(g_dc, "same", buf, sizeof(buf), &len, NULL),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    bool yes = true;
    assert_int_equal(moonlet_client_probe_key(ta, "same", &yes, "tenant-c"), MOONLET_OK);
    assert_false(yes);
    /* remove_all empties one tenant only (leases from the gets hold: wait
     * them out is not needed, removal counts what it could) */
    assert_int_equal(moonlet_client_put(ta, "other", "x", 1, NULL), MOONLET_OK);
    uint64_t removed = 99;
    assert_int_equal(moonlet_client_remove_all(ta, &removed, "tenant-c"), MOONLET_OK);
    assert_int_equal(removed, 0);
    assert_int_equal(moonlet_client_remove_all(ta, &removed, NULL), MOONLET_OK);
    assert_int_equal(removed, 1); /* "other"; "same" is leased by the gets */
    assert_int_equal(moonlet_client_probe_key(ta, "same", &yes, "tenant-b"), MOONLET_OK);
    assert_true(yes);
    moonlet_client_destroy(ta);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_roundtrip_sizes),
        cmocka_unit_test(test_errors_pass_through),
        cmocka_unit_test(test_k3_probe_policy),
        cmocka_unit_test(test_tenant_isolation),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
