/*
 * Test of the client layers: the DummyClient backend of moonlet_client
 * (store/client/dummy_client.c) against a RealClient run as a process
 * (moonlet-store --serve-dummy, store/client/real_client.c), with a master.
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
#include "log.h"
#include "master_client.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "moonlet/real_client.h"
#include "rpc_client.h"
#include "wire.h"
#include "../common/test_main.h"
#include "../common/threads.h"

#define MiB (1024u * 1024u)

static test_proc g_master, g_real;
static char g_sock[108];
static moonlet_client *g_dc; /* a DummyClient with a 1 MiB staging area */

/* ---- fixture ------------------------------------------------------------------ */

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
    if (!proc_wait_line(p, want, 5000)) {
        proc_stop(p);
        return -1;
    }
    return 0;
}

static moonlet_client *new_dummy(const char *path, uint64_t staging, uint32_t timeout_ms,
                                 const char *tenant)
{
    moonlet_dummy_config cfg;
    moonlet_dummy_config_init(&cfg, sizeof cfg);
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
    moonlet_log_set_level(MOONLET_LOG_ERROR); /* the refusals tested below log at WARN */
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
            unsigned char *data = cl_random_bytes(sizes[i], i * 2 + (size_t)which + 1);
            int rc = moonlet_client_put(c, key, data, sizes[i], NULL);
            if (rc)
                fail_msg("put %s: %s", key, moonlet_strerror(rc));
            cl_assert_get_equals(c, key, NULL, data, sizes[i]);
            /* the other DummyClient reads it too: the bytes are in the store */
            cl_assert_get_equals(which ? g_dc : big, key, NULL, data, sizes[i]);
            cl_assert_alloc_and_size(c, key, NULL, data, sizes[i]);
            if (sizes[i] > 0) {
                unsigned char small[1];
                size_t len = 0;
                size_t cap = sizes[i] - 1 < sizeof(small) ? sizes[i] - 1 : sizeof(small);
                assert_int_equal(moonlet_client_get(c, key, small, cap, NULL, &len),
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
    unsigned char *data = cl_random_bytes(64 * MiB, 77);
    assert_int_equal(moonlet_client_put(g_dc, "rt/64m", data, 64 * MiB, NULL), MOONLET_OK);
    cl_assert_get_equals(g_dc, "rt/64m", NULL, data, 64 * MiB);
    free(data);
    moonlet_client_destroy(big);
}

/* Whether the master recorded a checksum for key (GetReplicaList, asked
 * directly so the answer does not depend on the client layers under test). */
static bool master_has_checksum(const char *key)
{
    moonlet_master_client *mc = NULL;
    assert_int_equal(moonlet_mc_create(g_master.addr, NULL, &mc), MOONLET_OK);
    moonlet_replica_list l;
    assert_int_equal(moonlet_mc_get_replica_list(mc, "", key, &l), MOONLET_OK);
    bool has = l.has_checksum;
    moonlet_replica_list_free(&l);
    moonlet_mc_destroy(mc);
    return has;
}

/* A DummyClient's put_options.skip_checksum reaches its RealClient (single
 * and batch puts): the object is sealed without a checksum; without the
 * option it gets one. */
static void test_skip_checksum_forwarded(void **state)
{
    (void)state;
    static const char data[] = "checksum or not";
    moonlet_put_options skip = {.skip_checksum = true};
    assert_int_equal(moonlet_client_put(g_dc, "ck/default", data, sizeof(data), NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_put(g_dc, "ck/skip", data, sizeof(data), &skip), MOONLET_OK);
    const char *keys[] = {"ck/batch-skip"};
    const void *bufs[] = {data};
    size_t lens[] = {sizeof(data)};
    int32_t res[1] = {1};
    void *shared = NULL;
    assert_int_equal(moonlet_client_alloc_shared(g_dc, sizeof(data), &shared), MOONLET_OK);
    memcpy(shared, data, sizeof(data));
    bufs[0] = shared;
    assert_int_equal(moonlet_client_batch_put_from(g_dc, keys, 1, bufs, lens, &skip, res),
                     MOONLET_OK);
    assert_int_equal(res[0], MOONLET_OK);
    assert_int_equal(moonlet_client_free_shared(g_dc, shared), MOONLET_OK);
    assert_true(master_has_checksum("ck/default"));
    assert_false(master_has_checksum("ck/skip"));
    assert_false(master_has_checksum("ck/batch-skip"));
    cl_assert_get_equals(g_dc, "ck/skip", NULL, data, sizeof(data));
}

/* The same call on the DummyClient and on a real client of the same master
 * gives the same code: the layers pass errors up unchanged. */
static void test_errors_pass_through(void **state)
{
    (void)state;
    moonlet_client *real = NULL;
    assert_int_equal(cl_client_create(g_master.addr, 0, &real), 0);
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
        got[b][k++] = moonlet_client_get(c, "nope", buf, sizeof(buf), NULL, &len);
        assert_int_equal(len, 12345); /* untouched when the lookup failed */
        got[b][k++] = moonlet_client_get_size(c, "nope", NULL, &sz);
        got[b][k++] = moonlet_client_remove(c, "nope", NULL);
        got[b][k++] = moonlet_client_inspect_key(c, "nope", NULL, &json);
        assert_null(json);
        got[b][k++] = moonlet_client_put(c, "", "x", 1, NULL);
        got[b][k++] = moonlet_client_put(c, longkey, "x", 1, NULL);
        got[b][k++] = moonlet_client_put(c, "nine", "x", 1, &nine);
        got[b][k++] = moonlet_client_exist_key(c, longkey, NULL, &yes);
        /* upsert replaces; an object under a lease cannot be replaced */
        assert_int_equal(moonlet_client_upsert(c, key, "one", 3, NULL), MOONLET_OK);
        assert_int_equal(moonlet_client_remove(c, key, NULL), MOONLET_OK);
        assert_int_equal(moonlet_client_upsert(c, key, "two!", 4, NULL), MOONLET_OK);
        cl_assert_get_equals(c, key, NULL, "two!", 4); /* the get leased it */
        got[b][k++] = moonlet_client_upsert(c, key, "three", 5, NULL);
        got[b][k++] = moonlet_client_remove(c, key, NULL);
        /* NULL arguments are refused (the DummyClient sends nothing) */
        got[b][k++] = moonlet_client_put(c, NULL, "x", 1, NULL);
        got[b][k++] = moonlet_client_get(c, "k", NULL, 4, NULL, &len);
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

/* The K3 keys' leases in tenant t: the first `leased` hold one, the others
 * none; kda/256/r0 and kda/384/r1 were never stored. */
static void assert_k3_leases(moonlet_client *c, const char *t, int leased)
{
    for (int i = 0; i < 6; i++) {
        long long ms = lease_ms(c, k3_keys[i], t);
        if (i < leased)
            assert_true(ms > 0);
        else
            assert_int_equal(ms, i == 2 || i == 5 ? -1 : 0);
    }
}

/* Stores the K3 keys but kda/256/r0 and kda/384/r1 in tenant t. */
static void put_k3(moonlet_client *c, const char *t)
{
    for (int i = 0; i < 6; i++)
        if (i != 2 && i != 5)
            assert_int_equal(moonlet_client_put(c, k3_keys[i], "kda", 3,
                                                &(moonlet_put_options){.tenant = t}),
                             MOONLET_OK);
}

static void test_k3_probe_policy(void **state)
{
    (void)state;
    const char *t = "k3";
    put_k3(g_dc, t); /* 256 lacks r0, 384 lacks r1 */
    assert_k3_leases(g_dc, t, 0);

    int32_t r[6];
    /* invalid policies: -600 passed up unchanged, nothing leased */
    moonlet_grant_lease_policy bad[] = {{7, 2}, {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 0},
                                        {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 4}};
    for (size_t b = 0; b < 3; b++)
        assert_int_equal(moonlet_client_batch_probe_key(g_dc, k3_keys, 6, bad[b], t, r),
                         MOONLET_ERR_INVALID_PARAMS);

    /* NONE: point-in-time existence, leases unchanged */
    assert_int_equal(moonlet_client_batch_probe_key(g_dc, k3_keys,
                                                    6, MOONLET_GRANT_LEASE_POLICY_DEFAULT, t, r),
                     MOONLET_OK);
    const int32_t none_want[6] = {1, 1, 0, 1, 1, 0};
    assert_memory_equal(r, none_want, sizeof(r));
    bool yes = false;
    assert_int_equal(moonlet_client_probe_key(g_dc, "kda/256/r1", t, &yes), MOONLET_OK);
    assert_true(yes);
    assert_k3_leases(g_dc, t, 0);

    /* LAST_HIT_ONLY, candidates of 2: only checkpoint 128 is complete */
    moonlet_grant_lease_policy lho = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 2};
    assert_int_equal(moonlet_client_batch_probe_key(g_dc, k3_keys, 6, lho, t, r), MOONLET_OK);
    const int32_t lho_want[6] = {1, 1, 0, 0, 0, 0};
    assert_memory_equal(r, lho_want, sizeof(r));
    assert_k3_leases(g_dc, t, 2);

    /* BatchExistKey leases every hit */
    assert_int_equal(moonlet_client_batch_exist_key(g_dc, k3_keys, 6, t, r), MOONLET_OK);
    assert_memory_equal(r, none_want, sizeof(r));
    assert_true(lease_ms(g_dc, "kda/384/r0", t) > 0);
    assert_int_equal(moonlet_client_exist_key(g_dc, "kda/256/r0", t, &yes), MOONLET_OK);
    assert_false(yes);
    const char *nullkey[2] = {"a", NULL};
    assert_int_equal(moonlet_client_batch_exist_key(g_dc, nullkey, 2, t, r),
                     MOONLET_ERR_INVALID_PARAMS);
    /* an empty batch is a valid call */
    assert_int_equal(moonlet_client_batch_probe_key(g_dc, k3_keys, 0, lho, t, r), MOONLET_OK);
}

/* ProbeResume through the DummyClient and directly: the same answer and the
 * same leases (exactly the selected checkpoint and the KV keys below it);
 * request errors pass up unchanged; the K3 helper takes one round trip. */
/* ProbeResume of kv[0, n_kv) and the K3 keys (candidates of 2, boundaries
 * b) in tenant t succeeds with KV prefix `prefix` and selection `sel`; the
 * mask goes to mask. */
static void assert_resumes(moonlet_client *c, const char *const *kv, size_t n_kv,
                           const uint64_t b[3], const char *t, uint64_t prefix, int64_t sel,
                           int32_t mask[6])
{
    moonlet_probe_resume_result pr;
    assert_int_equal(moonlet_client_probe_resume(c, kv, n_kv, k3_keys, 6, 2, b, t, &pr, mask),
                     MOONLET_OK);
    assert_int_equal(pr.kv_prefix, prefix);
    assert_int_equal(pr.selected, sel);
}

static void probe_resume_case(moonlet_client *c, const char *t)
{
    static const char *const kv[4] = {"kv/0", "kv/1", "kv/2", "kv/3"};
    const uint64_t b[3] = {1, 2, 3};
    for (int i = 0; i < 4; i++)
        assert_int_equal(moonlet_client_put(c, kv[i], "kv", 2,
                                            &(moonlet_put_options){.tenant = t}), MOONLET_OK);
    put_k3(c, t);
    int32_t mask[6];
    assert_resumes(c, kv, 4, b, t, 4, 0, mask);
    const int32_t want[6] = {1, 1, 0, 0, 0, 0};
    assert_memory_equal(mask, want, sizeof(mask));
    assert_true(lease_ms(c, kv[0], t) > 0); /* the KV key below 128, nothing above */
    for (int i = 1; i < 4; i++)
        assert_int_equal(lease_ms(c, kv[i], t), 0);
    assert_k3_leases(c, t, 2);
    moonlet_probe_resume_result pr;
    const uint64_t over[3] = {1, 2, 5};
    assert_int_equal(moonlet_client_probe_resume(c, kv, 4, k3_keys, 6, 2, over, t, &pr, mask),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(pr.selected, -1);
    assert_int_equal(moonlet_client_probe_resume(c, kv, 4, k3_keys, 6, 4, b, t, &pr, mask),
                     MOONLET_ERR_INVALID_PARAMS);
    const char *badkv[4] = {"kv/0", "", "kv/2", "kv/3"};
    assert_int_equal(moonlet_client_probe_resume(c, badkv, 4, k3_keys, 6, 2, b, t, &pr, mask),
                     MOONLET_ERR_INVALID_KEY);
    const char *nullkv[4] = {"kv/0", NULL, "kv/2", "kv/3"};
    assert_int_equal(moonlet_client_probe_resume(c, nullkv, 4, k3_keys, 6, 2, b, t, &pr, mask),
                     MOONLET_ERR_INVALID_PARAMS);
    /* empty lists: a valid call, nothing selected */
    assert_int_equal(moonlet_client_probe_resume(c, kv, 0, k3_keys, 0, 0, NULL, t, &pr, mask),
                     MOONLET_OK);
    assert_int_equal(pr.selected, -1);
}

static void test_probe_resume_both_paths(void **state)
{
    (void)state;
    probe_resume_case(g_dc, "resume-dummy");
    moonlet_client *direct = NULL;
    assert_int_equal(cl_client_create(g_master.addr, 0, &direct), 0);
    probe_resume_case(direct, "resume-direct");
    moonlet_client_destroy(direct);
    /* the DummyClient's default tenant reaches the master */
    moonlet_client *ta = new_dummy(g_sock, 0, 0, "resume-dummy");
    static const char *const kv[1] = {"kv/0"};
    const uint64_t b[3] = {1, 1, 1};
    int32_t mask[6];
    assert_resumes(ta, kv, 1, b, NULL, 1, 0, mask);
    moonlet_client_destroy(ta);
}

static void test_tenant_isolation(void **state)
{
    (void)state;
    moonlet_client *ta = new_dummy(g_sock, 0, 0, "tenant-a");
    moonlet_put_options ob = {.tenant = "tenant-b"};
    assert_int_equal(moonlet_client_put(ta, "same", "AAAA", 4, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_put(ta, "same", "BBBBBB", 6, &ob), MOONLET_OK);
    cl_assert_get_equals(ta, "same", NULL, "AAAA", 4);
    cl_assert_get_equals(ta, "same", "tenant-b", "BBBBBB", 6);
    cl_assert_get_equals(g_dc, "same", "tenant-a", "AAAA", 4);
    char buf[8];
    size_t len;
    assert_int_equal(moonlet_client_get(g_dc, "same", buf, sizeof(buf), NULL, &len),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    bool yes = true;
    assert_int_equal(moonlet_client_probe_key(ta, "same", "tenant-c", &yes), MOONLET_OK);
    assert_false(yes);
    /* remove_all empties one tenant only (leases from the gets hold: wait
     * them out is not needed, removal counts what it could) */
    assert_int_equal(moonlet_client_put(ta, "other", "x", 1, NULL), MOONLET_OK);
    uint64_t removed = 99;
    assert_int_equal(moonlet_client_remove_all(ta, "tenant-c", &removed), MOONLET_OK);
    assert_int_equal(removed, 0);
    assert_int_equal(moonlet_client_remove_all(ta, NULL, &removed), MOONLET_OK);
    assert_int_equal(removed, 1); /* "other"; "same" is leased by the gets */
    assert_int_equal(moonlet_client_probe_key(ta, "same", "tenant-b", &yes), MOONLET_OK);
    assert_true(yes);
    moonlet_client_destroy(ta);
}

/* ---- shared memory and registered memory ------------------------------------------- */

/* Mappings of this process's DummyClient regions in process `pid`
 * ("moonlet-dummy-<who>-" memfds). */
static int regions_mapped_by(pid_t pid, pid_t who)
{
    char path[64], needle[64], line[512];
    snprintf(path, sizeof(path), "/proc/%ld/maps", (long)pid);
    snprintf(needle, sizeof(needle), MOONLET_DUMMY_REGION_PREFIX "%ld-", (long)who);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int n = 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

typedef struct maps_wait {
    pid_t pid, who;
    int want;
} maps_wait;

static bool maps_reached(void *arg)
{
    maps_wait *w = arg;
    return regions_mapped_by(w->pid, w->who) == w->want;
}

static void test_shared_and_registered(void **state)
{
    (void)state;
    moonlet_client *c = new_dummy(g_sock, 256 * 1024, 20000, NULL);
    pid_t me = getpid();
    /* the staging regions of g_dc (used by one thread so far: one
     * connection) and of c; connections closed by earlier tests are unmapped
     * as the RealClient sees them close, so wait for that */
    const int before = 2;
    maps_wait w = {g_real.pid, me, before};
    assert_true(cl_wait(maps_reached, &w, 3000));

    unsigned char *sh = NULL;
    assert_int_equal(moonlet_client_alloc_shared(c, 0, (void **)&sh), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_alloc_shared(c, 4 * MiB, (void **)&sh), MOONLET_OK);
    assert_non_null(sh);
    assert_int_equal(sh[4 * MiB - 1], 0);
    cl_fill(sh, 4 * MiB, 5);
    /* zero-copy both ways: the RealClient maps the region on first use */
    assert_int_equal(moonlet_client_put_from(c, "sh/a", sh + 100, 3 * MiB, NULL), MOONLET_OK);
    assert_int_equal(regions_mapped_by(g_real.pid, me), before + 1);
    size_t len = 0;
    memset(sh + 3 * MiB + 200, 0, MiB - 200);
    assert_int_equal(moonlet_client_get_into(c, "sh/a", sh + 3 * MiB + 200, MiB - 200, NULL, &len),
                     MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(len, 3 * MiB);
    unsigned char *want = cl_random_bytes(4 * MiB, 5);
    assert_memory_equal(sh + 100, want + 100, 3 * MiB);
    cl_assert_get_equals(g_dc, "sh/a", NULL, want + 100, 3 * MiB);
    assert_int_equal(moonlet_client_put(g_dc, "sh/b", want, 700 * 1024, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_get_into(c, "sh/b", sh + 1, 4 * MiB - 1, NULL, &len),
                     MOONLET_OK);
    assert_int_equal(len, 700 * 1024);
    assert_memory_equal(sh + 1, want, 700 * 1024);
    /* the copying calls accept shared memory as any memory */
    cl_assert_get_equals(c, "sh/b", NULL, want, 700 * 1024);

    /* registered caller memory: accepted, copied through staging (also in
     * one-off areas: 2 MiB > the 256 KiB staging) */
    unsigned char *mine = malloc(2 * MiB);
    cl_fill(mine, 2 * MiB, 6);
    assert_int_equal(moonlet_client_put_from(c, "reg/a", mine, MiB, NULL),
                     MOONLET_ERR_INVALID_PARAMS); /* not registered yet */
    assert_int_equal(moonlet_client_register_buffer(c, mine, 2 * MiB), MOONLET_OK);
    assert_int_equal(moonlet_client_register_buffer(c, mine, 16), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_register_buffer(c, sh, 16), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_put_from(c, "reg/a", mine, 2 * MiB, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_put_from(c, "reg/b", mine + 1, 2 * MiB, NULL),
                     MOONLET_ERR_INVALID_PARAMS); /* one byte past the buffer */
    unsigned char *back = malloc(2 * MiB);
    assert_int_equal(moonlet_client_get_into(c, "reg/a", back, 2 * MiB, NULL, &len),
                     MOONLET_ERR_INVALID_PARAMS); /* back is not registered */
    assert_int_equal(moonlet_client_register_buffer(c, back, 2 * MiB), MOONLET_OK);
    memset(back, 0, 2 * MiB);
    assert_int_equal(moonlet_client_get_into(c, "reg/a", back, 2 * MiB, NULL, &len), MOONLET_OK);
    assert_int_equal(len, 2 * MiB);
    assert_memory_equal(back, mine, 2 * MiB);

    /* batches mixing shared, registered and unregistered memory */
    char stack[8] = "stack";
    const char *pk[4] = {"bat/shared", "bat/reg", "bat/none", "bat/empty"};
    const void *pb[4] = {sh, mine + 5, stack, sh + 10};
    const size_t pl[4] = {MiB, 300 * 1024, 5, 0};
    int32_t res[5] = {9, 9, 9, 9, 9};
    assert_int_equal(moonlet_client_batch_put_from(c, pk, 4, pb, pl, NULL, res),
                     MOONLET_ERR_INVALID_PARAMS);
    const int32_t put_want[4] = {0, 0, MOONLET_ERR_INVALID_PARAMS, 0};
    assert_memory_equal(res, put_want, sizeof(put_want));
    const char *gk[5] = {"bat/shared", "bat/reg", "bat/empty", "bat/shared", "bat/nope"};
    void *gb[5] = {sh + 2 * MiB, back, back + MiB, back + MiB, sh + 3 * MiB};
    const size_t gc[5] = {MiB, 300 * 1024, 0, 10, 64};
    size_t gl[5] = {1, 1, 1, 1, 1};
    memset(back, 0, 2 * MiB);
    assert_int_equal(moonlet_client_batch_get_into(c, gk, 5, gb, gc, NULL, gl, res),
                     MOONLET_ERR_BUFFER_OVERFLOW);
    const int32_t get_want[5] = {0, 0, 0, MOONLET_ERR_BUFFER_OVERFLOW,
                                 MOONLET_ERR_OBJECT_NOT_FOUND};
    const size_t len_want[5] = {MiB, 300 * 1024, 0, MiB, 0};
    assert_memory_equal(res, get_want, sizeof(get_want));
    assert_memory_equal(gl, len_want, sizeof(len_want));
    assert_memory_equal(sh + 2 * MiB, sh, MiB);
    assert_memory_equal(back, mine + 5, 300 * 1024);

    /* freeing shared memory detaches it from the RealClient's connections */
    assert_int_equal(moonlet_client_free_shared(c, sh), MOONLET_OK);
    assert_int_equal(moonlet_client_free_shared(c, sh), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_free_shared(c, mine), MOONLET_ERR_INVALID_PARAMS);
    w.want = before;
    assert_true(cl_wait(maps_reached, &w, 3000));
    assert_int_equal(moonlet_client_unregister_buffer(c, mine), MOONLET_OK);
    assert_int_equal(moonlet_client_unregister_buffer(c, mine), MOONLET_ERR_INVALID_PARAMS);
    moonlet_client_destroy(c);
    /* its connections are gone: the RealClient unmapped their staging */
    w.want = before - 1;
    assert_true(cl_wait(maps_reached, &w, 3000));
    free(back);
    free(mine);
    free(want);
}

/* alloc_shared on the real backend: registered memory, zero-copy too. */
static void test_shared_real_backend(void **state)
{
    (void)state;
    moonlet_client *real = NULL;
    assert_int_equal(cl_client_create(g_master.addr, 0, &real), 0);
    void *p = NULL;
    assert_int_equal(moonlet_client_alloc_shared(real, 100000, &p), MOONLET_OK);
    cl_fill(p, 100000, 8);
    assert_int_equal(moonlet_client_put_from(real, "realsh", p, 100000, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_unregister_buffer(real, p), MOONLET_ERR_INVALID_PARAMS);
    /* inspect_key on the real backend: no lease until the get below */
    char *json = NULL;
    assert_int_equal(moonlet_client_inspect_key(real, "realsh", NULL, &json), MOONLET_OK);
    cJSON *j = cJSON_Parse(json);
    free(json);
    assert_non_null(j);
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "size")), 100000);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "replicas")), 1);
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "lease_remaining_ms")), 0);
    cJSON_Delete(j);
    unsigned char *want = cl_random_bytes(100000, 8);
    cl_assert_get_equals(g_dc, "realsh", NULL, want, 100000);
    assert_true(lease_ms(real, "realsh", NULL) > 0);
    assert_int_equal(moonlet_client_free_shared(real, p), MOONLET_OK);
    assert_int_equal(moonlet_client_free_shared(real, p), MOONLET_ERR_INVALID_PARAMS);
    void *q = NULL;
    /* left to destroy, which frees it */
    assert_int_equal(moonlet_client_alloc_shared(real, 4096, &q), MOONLET_OK);
    moonlet_client_destroy(real);
    free(want);
}

/* ---- parallel calls ------------------------------------------------------------------ */

typedef struct par_arg {
    int id;
    int failures;
} par_arg;

static void *par_main(void *arg)
{
    par_arg *a = arg;
    size_t sz = 200 * 1024 + (size_t)a->id;
    unsigned char *data = malloc(sz), *got = malloc(sz);
    for (int i = 0; i < 15; i++) {
        char key[64];
        snprintf(key, sizeof(key), "par/%d/%d", a->id, i);
        cl_fill(data, sz, (uint64_t)(a->id * 100 + i));
        size_t len = 0;
        bool yes = false;
        if (moonlet_client_put(g_dc, key, data, sz, NULL) ||
            moonlet_client_get(g_dc, key, got, sz, NULL, &len) || len != sz ||
            memcmp(got, data, sz) || moonlet_client_probe_key(g_dc, key, NULL, &yes) || !yes)
            a->failures++;
    }
    free(data);
    free(got);
    return NULL;
}

static void test_parallel_calls(void **state)
{
    (void)state;
    par_arg a[6];
    for (int i = 0; i < 6; i++)
        a[i] = (par_arg){.id = i, .failures = 0};
    test_threads_run(par_main, a, sizeof(a[0]), 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(a[i].failures, 0);
    /* 6 threads over at most 4 connections (+ the staging of each) */
    int n = regions_mapped_by(g_real.pid, getpid());
    assert_true(n >= 1 && n <= 4);
}

/* ---- the socket ---------------------------------------------------------------------------- */

static void test_socket_mode(void **state)
{
    (void)state;
    struct stat st;
    assert_int_equal(lstat(g_sock, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 07777, 0600);

    /* --socket-group: group-accessible (served without busy polling) */
    char path[108];
    snprintf(path, sizeof(path), "/tmp/moonlet-test-dummy-%ld-grp.sock", (long)getpid());
    struct group *gr = getgrgid(getgid());
    assert_non_null(gr);
    char gname[64];
    snprintf(gname, sizeof(gname), "%s", gr->gr_name);
    test_proc p;
    const char *const grp[] = {"--socket-group", gname, "--busy-poll-us", "0", NULL};
    assert_int_equal(start_real(&p, path, "16MiB", grp), 0);
    assert_int_equal(lstat(path, &st), 0);
    assert_int_equal(st.st_mode & 07777, 0660);
    assert_int_equal(st.st_gid, getgid());
    moonlet_client *c = new_dummy(path, 0, 0, NULL);
    assert_int_equal(moonlet_client_put(c, "grp/a", "g", 1, NULL), MOONLET_OK);
    char got[4];
    uint64_t len = 0;
    assert_int_equal(moonlet_client_get(c, "grp/a", got, sizeof(got), NULL, &len), MOONLET_OK);
    assert_int_equal(len, 1);
    assert_int_equal(got[0], 'g');
    moonlet_client_destroy(c);
    assert_int_equal(proc_stop(&p), 0);
    assert_int_not_equal(access(path, F_OK), 0); /* SIGTERM removed the socket */
    /* the live RealClient's data must outlive the refused starts below (grp/a
     * may have gone with p's segment: placement decides) */
    assert_int_equal(moonlet_client_put(g_dc, "grp/live", "l", 1, NULL), MOONLET_OK);

    /* refused: an unknown group, a path a live RealClient serves, a group
     * without --serve-dummy */
    char *nogroup[] = {"tools/moonlet-store", "--master", g_master.addr, "--segment-size",
                       "16MiB", "--protocol", "tcp", "--serve-dummy", path, "--socket-group",
                       "moonlet-no-such-group", NULL};
    assert_int_equal(cl_run_exit_code(nogroup, 10000), 1);
    assert_int_not_equal(access(path, F_OK), 0);
    char *inuse[] = {"tools/moonlet-store", "--master", g_master.addr, "--segment-size", "16MiB",
                     "--protocol", "tcp", "--serve-dummy", g_sock, NULL};
    assert_int_equal(cl_run_exit_code(inuse, 10000), 1);
    assert_int_equal(lstat(g_sock, &st), 0); /* the live one's socket stays */
    char *orphan[] = {"tools/moonlet-store", "--master", g_master.addr, "--socket-group",
                      gname, NULL};
    assert_int_equal(cl_run_exit_code(orphan, 10000), 2);
    bool yes = false;
    assert_int_equal(moonlet_client_probe_key(g_dc, "grp/live", NULL, &yes), MOONLET_OK);
    assert_true(yes);
}

/* ---- the RealClient library API ------------------------------------------------------ */

typedef struct rc_wait {
    moonlet_real_client *rc;
    size_t conns, regions;
} rc_wait;

static bool rc_reached(void *arg)
{
    rc_wait *w = arg;
    return moonlet_real_client_connections(w->rc) == w->conns &&
           moonlet_real_client_regions(w->rc) == w->regions;
}

static void test_real_client_api(void **state)
{
    (void)state;
    moonlet_client_config cfg = cl_client_config(g_master.addr);
    char path[108];
    snprintf(path, sizeof(path), "/tmp/moonlet-test-dummy-%ld-lib.sock", (long)getpid());
    moonlet_real_client *rc = NULL;
    /* refused: no segment, no path, an unknown group, a live server's path */
    assert_int_equal(moonlet_real_client_create(&cfg, path, NULL, &rc), MOONLET_ERR_INVALID_PARAMS);
    cfg.local_segment_size = 16 * MiB;
    assert_int_equal(moonlet_real_client_create(&cfg, NULL, NULL, &rc), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_real_client_create(NULL, path, NULL, &rc), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_real_client_create(&cfg, path, "moonlet-no-such-group", &rc),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(moonlet_real_client_create(&cfg, g_sock, NULL, &rc), MOONLET_ERR_RPC_FAIL);
    assert_null(rc);

    assert_int_equal(moonlet_real_client_create(&cfg, path, NULL, &rc), MOONLET_OK);
    rc_wait w = {rc, 0, 0};
    assert_true(rc_reached(&w));
    moonlet_client *own = moonlet_real_client_client(rc);
    char ep[64];
    assert_int_equal(moonlet_client_local_endpoint(own, ep, sizeof(ep)), MOONLET_OK);
    assert_int_equal(moonlet_client_put(own, "lib/own", "owner", 5, NULL), MOONLET_OK);

    moonlet_client *d = new_dummy(path, 0, 0, NULL);
    w.conns = 1;
    w.regions = 1;
    assert_true(cl_wait(rc_reached, &w, 2000));
    cl_assert_get_equals(d, "lib/own", NULL, "owner", 5);
    void *sh = NULL;
    assert_int_equal(moonlet_client_alloc_shared(d, 8192, &sh), MOONLET_OK);
    memcpy(sh, "shared", 6);
    assert_int_equal(moonlet_client_put_from(d, "lib/sh", sh, 6, NULL), MOONLET_OK);
    assert_int_equal(moonlet_real_client_regions(rc), 2);
    cl_assert_get_equals(own, "lib/sh", NULL, "shared", 6);
    moonlet_client_destroy(d); /* without free_shared: the connection's close unmaps all */
    w.conns = 0;
    w.regions = 0;
    assert_true(cl_wait(rc_reached, &w, 2000));

    d = new_dummy(path, 0, 0, NULL);
    moonlet_real_client_destroy(rc);
    assert_int_not_equal(access(path, F_OK), 0);
    bool yes;
    assert_int_equal(moonlet_client_exist_key(d, "lib/own", NULL, &yes), MOONLET_ERR_RPC_FAIL);
    assert_int_equal(moonlet_client_exist_key(d, "lib/own", NULL, &yes), MOONLET_ERR_RPC_FAIL);
    /* a RealClient serving the path again: the same DummyClient reconnects */
    assert_int_equal(moonlet_real_client_create(&cfg, path, NULL, &rc), MOONLET_OK);
    assert_int_equal(moonlet_client_put(d, "lib/again", "again", 5, NULL), MOONLET_OK);
    cl_assert_get_equals(d, "lib/again", NULL, "again", 5);
    moonlet_client_destroy(d);
    moonlet_real_client_destroy(rc);
    moonlet_real_client_destroy(NULL);
}

/* ---- hostile and malformed requests ---------------------------------------------------- */

/* A memfd of `len` bytes, sealed against shrinking when `seal`. */
static int test_memfd(size_t len, bool seal)
{
    int fd = memfd_create("moonlet-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)len), 0);
    if (seal)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    return fd;
}

/* Sends the begun request (with fd when >= 0); returns the reply code, or
 * the transport error.  *first gets result[0] when the call was made. */
static int raw_call(moonlet_rpc_client *r, int fd, int64_t *first)
{
    moonlet_reply rep;
    int rc = fd >= 0 ? moonlet_rpc_client_call_fd(r, fd, &rep) : moonlet_rpc_client_call(r, &rep);
    if (rc)
        return rc;
    rc = rep.code;
    if (first && rc == 0)
        assert_int_equal(moonlet_wire_i64(rep.result, 0, first), 0);
    moonlet_reply_destroy(&rep);
    return rc;
}

static int raw_attach(moonlet_rpc_client *r, uint64_t version, uint64_t region, uint64_t size,
                      int fd)
{
    msgpack_packer *pk = moonlet_rpc_client_begin(r, MOONLET_DM_ATTACH, 3);
    msgpack_pack_uint64(pk, version);
    msgpack_pack_uint64(pk, region);
    msgpack_pack_uint64(pk, size);
    return raw_call(r, fd, NULL);
}

/* PUT [nil, key, region, off, len, 0, false]: the reply code, result[0] in *first. */
static int raw_put(moonlet_rpc_client *r, const char *key, uint64_t region, uint64_t off,
                   uint64_t len, int64_t *first)
{
    msgpack_packer *pk = moonlet_rpc_client_begin(r, MOONLET_DM_PUT, 7);
    msgpack_pack_nil(pk);
    moonlet_pack_cstr(pk, key);
    msgpack_pack_uint64(pk, region);
    msgpack_pack_uint64(pk, off);
    msgpack_pack_uint64(pk, len);
    msgpack_pack_uint32(pk, 0);
    msgpack_pack_false(pk);
    return raw_call(r, -1, first);
}

static void test_bad_input(void **state)
{
    (void)state;
    moonlet_rpc_client_opts o = {.timeout_ms = 5000};
    moonlet_rpc_client *r = NULL;
    assert_int_equal(moonlet_rpc_client_connect_unix(g_sock, &o, &r), MOONLET_OK);
    const size_t R = 64 * 1024;
    int64_t first = 1;

    /* nothing before ATTACH; unknown methods, also the master's */
    assert_int_equal(raw_put(r, "bad/0", 1, 0, 1, NULL), MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    moonlet_rpc_client_begin(r, 9999, 0);
    assert_int_equal(raw_call(r, -1, NULL), MOONLET_ERR_INVALID_PARAMS);
    moonlet_pack_cstr(moonlet_rpc_client_begin(r, 12 /* the master's ProbeKey */, 1), "k");
    assert_int_equal(raw_call(r, -1, NULL), MOONLET_ERR_INVALID_PARAMS);

    /* ATTACH: no descriptor, wrong types, newer version, not a memfd, not
     * sealed, smaller than announced, size 0, over the limit */
    assert_int_equal(raw_attach(r, MOONLET_DUMMY_PROTO_VERSION, 5, R, -1),
                     MOONLET_ERR_INVALID_PARAMS);
    int good = test_memfd(R, true);
    msgpack_packer *pk = moonlet_rpc_client_begin(r, MOONLET_DM_ATTACH, 3);
    moonlet_pack_cstr(pk, "1");
    msgpack_pack_uint64(pk, 5);
    msgpack_pack_uint64(pk, R);
    assert_int_equal(raw_call(r, good, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(raw_attach(r, 99, 5, R, good), MOONLET_ERR_INVALID_VERSION);
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    assert_int_equal(raw_attach(r, MOONLET_DUMMY_PROTO_VERSION, 5, R, pipefd[0]),
                     MOONLET_ERR_INVALID_PARAMS);
    close(pipefd[0]);
    close(pipefd[1]);
    int unsealed = test_memfd(R, false);
    assert_int_equal(raw_attach(r, MOONLET_DUMMY_PROTO_VERSION, 5, R, unsealed),
                     MOONLET_ERR_INVALID_PARAMS);
    close(unsealed);
    assert_int_equal(raw_attach(r, MOONLET_DUMMY_PROTO_VERSION, 5, R + 1, good),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(raw_attach(r, MOONLET_DUMMY_PROTO_VERSION, 5, 0, good),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(raw_attach(r, MOONLET_DUMMY_PROTO_VERSION, 5, UINT64_MAX, good),
                     MOONLET_ERR_INVALID_PARAMS);
    /* a sealed memfd cannot shrink under the RealClient's mapping */
    assert_int_not_equal(ftruncate(good, 4096), 0);

    /* a good ATTACH; the same region id again is refused */
    assert_int_equal(raw_attach(r, MOONLET_DUMMY_PROTO_VERSION, 5, R, good), MOONLET_OK);
    assert_int_equal(raw_attach(r, MOONLET_DUMMY_PROTO_VERSION, 5, R, good),
                     MOONLET_ERR_INVALID_PARAMS);
    unsigned char *mem = mmap(NULL, R, PROT_READ | PROT_WRITE, MAP_SHARED, good, 0);
    assert_true(mem != MAP_FAILED);
    cl_fill(mem, R, 42);

    /* ranges: exactly to the end is fine, one byte past is not, nor any
     * offset or length that overflows, nor an unknown region */
    assert_int_equal(raw_put(r, "bad/end", 5, R - 10, 11, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(raw_put(r, "bad/end", 5, R + 1, 0, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(raw_put(r, "bad/end", 5, UINT64_MAX, 2, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(raw_put(r, "bad/end", 5, 1, UINT64_MAX, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(raw_put(r, "bad/end", 6, 0, 1, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(raw_put(r, "bad/end", 5, R - 10, 10, &first), MOONLET_OK);
    assert_int_equal(first, MOONLET_OK);
    cl_assert_get_equals(g_dc, "bad/end", NULL, mem + R - 10, 10);
    bool yes = true;

    /* wrong types and shapes, keys with NUL bytes */
    pk = moonlet_rpc_client_begin(r, MOONLET_DM_PUT, 7);
    msgpack_pack_nil(pk);
    msgpack_pack_uint32(pk, 7); /* key as an int */
    for (int i = 0; i < 3; i++)
        msgpack_pack_uint32(pk, i == 0 ? 5 : 0);
    msgpack_pack_uint32(pk, 0);
    msgpack_pack_false(pk);
    assert_int_equal(raw_call(r, -1, NULL), MOONLET_ERR_INVALID_PARAMS);
    pk = moonlet_rpc_client_begin(r, MOONLET_DM_PUT, 2);
    msgpack_pack_nil(pk);
    moonlet_pack_cstr(pk, "short");
    assert_int_equal(raw_call(r, -1, NULL), MOONLET_ERR_INVALID_PARAMS);
    pk = moonlet_rpc_client_begin(r, MOONLET_DM_EXIST_KEY, 2);
    msgpack_pack_nil(pk);
    moonlet_pack_str(pk, "a\0b", 3);
    assert_int_equal(raw_call(r, -1, NULL), MOONLET_ERR_INVALID_PARAMS);
    pk = moonlet_rpc_client_begin(r, MOONLET_DM_GET, 5);
    msgpack_pack_int32(pk, -3); /* tenant as an int */
    moonlet_pack_cstr(pk, "bad/end");
    msgpack_pack_uint64(pk, 5);
    msgpack_pack_uint64(pk, 0);
    msgpack_pack_uint64(pk, 10);
    assert_int_equal(raw_call(r, -1, NULL), MOONLET_ERR_INVALID_PARAMS);

    /* a batch with one item out of range is refused whole: nothing stored */
    pk = moonlet_rpc_client_begin(r, MOONLET_DM_BATCH_PUT, 4);
    msgpack_pack_nil(pk);
    msgpack_pack_uint32(pk, 0);
    msgpack_pack_false(pk);
    msgpack_pack_array(pk, 2);
    msgpack_pack_array(pk, 4);
    moonlet_pack_cstr(pk, "bad/b1");
    msgpack_pack_uint64(pk, 5);
    msgpack_pack_uint64(pk, 0);
    msgpack_pack_uint64(pk, 10);
    msgpack_pack_array(pk, 4);
    moonlet_pack_cstr(pk, "bad/b2");
    msgpack_pack_uint64(pk, 5);
    msgpack_pack_uint64(pk, R);
    msgpack_pack_uint64(pk, 1);
    assert_int_equal(raw_call(r, -1, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_probe_key(g_dc, "bad/b1", NULL, &yes), MOONLET_OK);
    assert_false(yes);

    /* a lease mode that does not fit the policy's u8 is a refused request;
     * one that fits but is unknown reaches the master, which says -600 */
    for (int m = 0; m < 2; m++) {
        pk = moonlet_rpc_client_begin(r, MOONLET_DM_BATCH_PROBE_KEY, 4);
        msgpack_pack_nil(pk);
        msgpack_pack_uint32(pk, m ? 7 : 300);
        msgpack_pack_uint64(pk, 1);
        msgpack_pack_array(pk, 1);
        moonlet_pack_cstr(pk, "bad/end");
        first = 1;
        assert_int_equal(raw_call(r, -1, &first), m ? MOONLET_OK : MOONLET_ERR_INVALID_PARAMS);
        if (m)
            assert_int_equal(first, MOONLET_ERR_INVALID_PARAMS);
    }

    /* DETACH, then the region is gone */
    msgpack_pack_uint64(moonlet_rpc_client_begin(r, MOONLET_DM_DETACH, 1), 5);
    assert_int_equal(raw_call(r, -1, &first), MOONLET_OK);
    msgpack_pack_uint64(moonlet_rpc_client_begin(r, MOONLET_DM_DETACH, 1), 5);
    assert_int_equal(raw_call(r, -1, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(raw_put(r, "bad/gone", 5, 0, 1, NULL), MOONLET_ERR_INVALID_PARAMS);

    /* a frame that is not msgpack, then one claiming 4 GiB: the connection
     * is closed, the RealClient lives on */
    const unsigned char junk[] = {0, 0, 0, 3, 0xc1, 0xc1, 0xc1};
    assert_int_equal(write(moonlet_rpc_client_fd(r), junk, sizeof(junk)), (ssize_t)sizeof(junk));
    moonlet_reply rep;
    if (moonlet_rpc_client_recv(r, &rep) == MOONLET_OK) {
        assert_int_equal(rep.code, MOONLET_ERR_INVALID_PARAMS);
        moonlet_reply_destroy(&rep);
    }
    assert_int_not_equal(raw_put(r, "bad/after", 5, 0, 1, NULL), MOONLET_OK);
    moonlet_rpc_client_close(r);
    assert_int_equal(moonlet_rpc_client_connect_unix(g_sock, &o, &r), MOONLET_OK);
    const unsigned char huge[] = {0xff, 0xff, 0xff, 0xff, 1, 2, 3};
    assert_int_equal(write(moonlet_rpc_client_fd(r), huge, sizeof(huge)), (ssize_t)sizeof(huge));
    assert_int_not_equal(raw_put(r, "bad/after", 5, 0, 1, NULL), MOONLET_OK);
    moonlet_rpc_client_close(r);

    munmap(mem, R);
    close(good);
    assert_int_equal(waitpid(g_real.pid, NULL, WNOHANG), 0); /* still running */
    unsigned char *data = cl_random_bytes(3000, 9);
    assert_int_equal(moonlet_client_put(g_dc, "bad/alive", data, 3000, NULL), MOONLET_OK);
    cl_assert_get_equals(g_dc, "bad/alive", NULL, data, 3000);
    free(data);
}

/* ---- a DummyClient that dies ------------------------------------------------------------- */

static void test_dummy_dies(void **state)
{
    (void)state;
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        /* attach staging and a shared region, then hang until killed */
        moonlet_client *c = NULL;
        void *sh = NULL;
        int ok = moonlet_client_create_dummy(g_sock, NULL, &c) == MOONLET_OK &&
                 moonlet_client_alloc_shared(c, MiB, &sh) == MOONLET_OK &&
                 moonlet_client_put_from(c, "dies/a", sh, MiB, NULL) == MOONLET_OK;
        char b = ok ? 'y' : 'n';
        if (write(ready[1], &b, 1) != 1)
            _exit(3);
        pause();
        _exit(0);
    }
    close(ready[1]);
    char b = 0;
    struct pollfd pfd = {.fd = ready[0], .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 10000), 1);
    assert_int_equal(read(ready[0], &b, 1), 1);
    close(ready[0]);
    int mapped = regions_mapped_by(g_real.pid, child);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    assert_int_equal(b, 'y');
    assert_int_equal(mapped, 2); /* its staging and its shared region */
    maps_wait w = {g_real.pid, child, 0};
    assert_true(cl_wait(maps_reached, &w, 3000));
    bool yes = false;
    assert_int_equal(moonlet_client_exist_key(g_dc, "dies/a", NULL, &yes), MOONLET_OK);
    assert_true(yes);
}

/* ---- a RealClient that stops or dies during a call --------------------------------- */

typedef struct slow_call {
    moonlet_client *c;
    void *buf;
    int rc;
    long long ms;
} slow_call;

static void *slow_get_main(void *arg)
{
    slow_call *s = arg;
    long long t0 = proc_now_ms();
    size_t len = 0;
    s->rc = moonlet_client_get(s->c, "kill/64m", s->buf, 64 * MiB, NULL, &len);
    s->ms = proc_now_ms() - t0;
    return NULL;
}

static void test_real_client_killed(void **state)
{
    (void)state;
    unsigned char *data = cl_random_bytes(64 * MiB, 11);
    assert_int_equal(moonlet_client_put(g_dc, "kill/64m", data, 64 * MiB, NULL), MOONLET_OK);
    char path[108];
    snprintf(path, sizeof(path), "/tmp/moonlet-test-dummy-%ld-kill.sock", (long)getpid());
    test_proc b;
    assert_int_equal(start_real(&b, path, "16MiB", NULL), 0);
    moonlet_client *quick = new_dummy(path, 0, 1000, NULL);
    slow_call s = {.c = new_dummy(path, 0, 8000, NULL), .buf = malloc(64 * MiB)};
    cl_assert_get_equals(s.c, "kill/64m", NULL, data, 64 * MiB); /* it serves */

    /* stopped: no answer within the DummyClient's timeout.  kill() only
     * starts the group stop; waitpid(WUNTRACED) returns once every thread of
     * the RealClient has stopped. */
    kill(b.pid, SIGSTOP);
    int st = 0;
    assert_int_equal(waitpid(b.pid, &st, WUNTRACED), b.pid);
    assert_true(WIFSTOPPED(st));
    bool yes;
    long long t0 = proc_now_ms();
    assert_int_equal(moonlet_client_exist_key(quick, "kill/64m", NULL, &yes),
                     MOONLET_ERR_RPC_TIMEOUT);
    long long took = proc_now_ms() - t0;
    assert_true(took >= 900 && took < 3000);

    /* killed while a 64 MiB get waits on it: RPC_FAIL long before the 8 s
     * timeout.  The RealClient is still stopped, so the get is waiting once
     * its request sits unread in the socket: wait for that, then kill. */
    long long unread = proc_unix_unread_bytes();
    assert_true(unread >= 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, slow_get_main, &s), 0);
    long long until = proc_now_ms() + 5000;
    while (proc_unix_unread_bytes() <= unread && proc_now_ms() < until)
        poll(NULL, 0, 1);
    assert_true(proc_unix_unread_bytes() > unread);
    kill(b.pid, SIGKILL);
    pthread_join(th, NULL);
    waitpid(b.pid, NULL, 0);
    close(b.out_fd);
    b.pid = 0;
    assert_int_equal(s.rc, MOONLET_ERR_RPC_FAIL);
    assert_true(s.ms < 3000);
    /* and the next calls fail at once (nothing listens), batch results too */
    t0 = proc_now_ms();
    assert_int_equal(moonlet_client_probe_key(s.c, "kill/64m", NULL, &yes), MOONLET_ERR_RPC_FAIL);
    const char *keys[2] = {"a", "b"};
    int32_t r[2] = {5, 5};
    assert_int_equal(moonlet_client_batch_exist_key(quick, keys, 2, NULL, r), MOONLET_ERR_RPC_FAIL);
    void *bufs[2] = {s.buf, s.buf};
    size_t caps[2] = {0, 0}, lens[2];
    assert_int_equal(moonlet_client_batch_get_into(quick, keys, 2, bufs, caps, NULL, lens, r),
                     MOONLET_ERR_RPC_FAIL);
    assert_int_equal(r[0], MOONLET_ERR_RPC_FAIL);
    assert_int_equal(r[1], MOONLET_ERR_RPC_FAIL);
    assert_true(proc_now_ms() - t0 < 1000);
    unlink(path); /* left behind by the killed process */
    moonlet_client_destroy(quick);
    moonlet_client_destroy(s.c);
    free(s.buf);
    free(data);
}

MOONLET_TEST_MAIN("dummy_client", setup, teardown,
                  cmocka_unit_test(test_create_errors),
                  cmocka_unit_test(test_roundtrip_sizes),
                  cmocka_unit_test(test_errors_pass_through),
                  cmocka_unit_test(test_skip_checksum_forwarded),
                  cmocka_unit_test(test_k3_probe_policy),
                  cmocka_unit_test(test_tenant_isolation),
                  cmocka_unit_test(test_shared_and_registered),
                  cmocka_unit_test(test_shared_real_backend),
                  cmocka_unit_test(test_parallel_calls),
                  cmocka_unit_test(test_socket_mode),
                  cmocka_unit_test(test_real_client_api),
                  cmocka_unit_test(test_probe_resume_both_paths),
                  cmocka_unit_test(test_bad_input),
                  cmocka_unit_test(test_dummy_dies),
                  cmocka_unit_test(test_real_client_killed)) /* last: leaves a dead segment mounted */
