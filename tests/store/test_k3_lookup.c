/*
 * Integration test of moonlet_k3_lookup() (store/client/k3.c) against a real
 * moonlet-master and moonlet-store on loopback, with the public client.
 *
 * Every case puts its objects under its own tenant, runs the lookup, and
 * checks three things: the decision (resume position, selected checkpoint,
 * the exact keys to load, round trips), the leases the master holds
 * afterwards (through the inspection RPC: leased keys have time left, the
 * others none), and the master's lease counters (leases_exist,
 * leases_probe), so a helper that leased one key too many fails.
 * Cases: the K3 worked example, the KV boundary cutting candidates, the
 * Eagle-style bound, no KDA candidate, key order for groups x ranks x
 * components, the lease-all mode, and errors from the key builder; each
 * selective scenario runs twice, from one function: on the two-call path
 * (MOONLET_K3_SELECTIVE_TWO_CALLS) and on the one-call path (ProbeResume,
 * the default), with the checks that differ between them; and the default against a
 * master that answers ProbeResume as unknown (--disable-method): the
 * two-call path.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../common/cluster.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "moonlet/k3.h"
#include "../common/test_main.h"

static cl_cluster g_cl;

static const uint64_t CKPTS[] = {128, 256, 384};
/* A NULL-terminated list of keys. */
#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})

static const moonlet_k3_layout L2 = {.block_tokens = 128, .groups = 1, .ranks = 2, .components = 1};

static int setup(void **state)
{
    (void)state;
    return cl_cluster_start(&g_cl, NULL, "16MiB", 0);
}

static int teardown(void **state)
{
    (void)state;
    cl_cluster_stop(&g_cl);
    return 0;
}

/* Keys in the shape of the worked example: "kv/0", "kda/128/r0" (group and
 * component only when the layout has more than one). */
static int key_fn(void *ctx, const moonlet_k3_key_id *id, char *buf, size_t cap)
{
    const moonlet_k3_layout *l = ctx;
    if (id->kind == MOONLET_K3_KEY_KV)
        return snprintf(buf, cap, "kv/%llu", (unsigned long long)id->block);
    if (l->groups == 1 && l->components == 1)
        return snprintf(buf, cap, "kda/%llu/r%u", (unsigned long long)id->position, id->rank);
    return snprintf(buf, cap, "kda/%llu/g%u/r%u/c%u", (unsigned long long)id->position, id->group,
                    id->rank, id->component);
}

static void put(const char *tenant, const char *key)
{
    static const char payload[256] = "k3";
    moonlet_put_options o = {.tenant = tenant};
    int rc = moonlet_client_put(g_cl.cli, key, payload, sizeof(payload), &o);
    if (rc)
        fail_msg("put %s/%s: %s", tenant, key, moonlet_strerror(rc));
}

/* Each key of the NULL-terminated list. */
static void put_all(const char *tenant, const char *const *keys)
{
    for (; *keys; keys++)
        put(tenant, *keys);
}

static void put_kv(const char *tenant, int blocks)
{
    char k[32];
    for (int b = 0; b < blocks; b++) {
        snprintf(k, sizeof(k), "kv/%d", b);
        put(tenant, k);
    }
}

static uint64_t lease_ms(const char *tenant, const char *key)
{
    double ms = cl_lease_ms(g_cl.mc, tenant, key);
    if (ms < 0)
        fail_msg("inspect %s/%s", tenant, key);
    return (uint64_t)ms;
}

typedef struct counters {
    double exist, probe, probe_calls, resume_kda, resume_kv, resume_calls;
} counters;

static counters stats(void)
{
    cJSON *j = NULL;
    if (moonlet_mc_stats(g_cl.mc, &j))
        fail_msg("stats");
    counters c = {cJSON_GetObjectItem(j, "leases_exist")->valuedouble,
                  cJSON_GetObjectItem(j, "leases_probe")->valuedouble,
                  cJSON_GetObjectItem(j, "probe_calls_last_hit_only")->valuedouble,
                  cJSON_GetObjectItem(j, "leases_resume_kda")->valuedouble,
                  cJSON_GetObjectItem(j, "leases_resume_kv")->valuedouble,
                  cJSON_GetObjectItem(j, "resume_calls")->valuedouble};
    cJSON_Delete(j);
    return c;
}

/* The two selective paths every scenario runs on; the tenant prefix keeps
 * their objects apart. */
typedef struct path {
    moonlet_k3_mode mode;
    const char *prefix;
} path;
static const path TWO_CALLS = {MOONLET_K3_SELECTIVE_TWO_CALLS, "k3-"};
static const path ONE_CALL = {MOONLET_K3_SELECTIVE, "k3-1-"}; /* the default: one ProbeResume */

static bool two_calls(const path *p)
{
    return p->mode == MOONLET_K3_SELECTIVE_TWO_CALLS;
}

/* The path a scenario runs on (its cmocka state); its tenant, from `name`,
 * into t. */
static const path *scenario(void **state, const char *name, char *t, size_t cap)
{
    const path *p = *state;
    snprintf(t, cap, "%s%s", p->prefix, name);
    return p;
}

static moonlet_k3_request request(const path *p, uint64_t prompt, uint64_t blocks)
{
    return (moonlet_k3_request){.prompt_tokens = prompt, .kv_blocks = blocks,
                                .checkpoints = CKPTS, .n_checkpoints = 3, .mode = p->mode};
}

static void lookup(const moonlet_k3_layout *l, const moonlet_k3_request *r, const char *tenant,
                   moonlet_k3_result *res)
{
    int rc = moonlet_k3_lookup(g_cl.cli, l, r, key_fn, (void *)l, tenant, res);
    if (rc)
        fail_msg("lookup: %s", moonlet_strerror(rc));
}

/* The lookup, and what the master's lease counters gained during it. */
static counters run(const moonlet_k3_layout *l, const moonlet_k3_request *r, const char *tenant,
                    moonlet_k3_result *res)
{
    counters c0 = stats();
    lookup(l, r, tenant, res);
    counters c1 = stats();
    return (counters){c1.exist - c0.exist, c1.probe - c0.probe, c1.probe_calls - c0.probe_calls,
                      c1.resume_kda - c0.resume_kda, c1.resume_kv - c0.resume_kv,
                      c1.resume_calls - c0.resume_calls};
}

/* The one-call path leases through ProbeResume only. */
static void assert_no_exist_or_probe_leases(counters d)
{
    assert_int_equal(d.exist, 0);
    assert_int_equal(d.probe, 0);
    assert_int_equal(d.probe_calls, 0);
}

static void assert_keys(const moonlet_k3_result *r, const char *const *want, size_t n)
{
    assert_int_equal(r->kv_keys + r->kda_keys, n);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(r->keys[i], want[i]);
}

/* The decision: where the request resumes, from which checkpoint (index or
 * MOONLET_K3_NONE), over how many leading KV blocks, the tokens they cover,
 * and how many checkpoints were candidates. */
static void assert_decision(const moonlet_k3_result *r, uint64_t resume, size_t checkpoint,
                            uint64_t kv_prefix, uint64_t kv_boundary, size_t candidates)
{
    assert_int_equal(r->resume_position, resume);
    assert_int_equal(r->checkpoint, checkpoint);
    assert_int_equal(r->kv_prefix_blocks, kv_prefix);
    assert_int_equal(r->kv_boundary, kv_boundary);
    assert_int_equal(r->candidates, candidates);
}

/* Each key of the NULL-terminated `leased` has lease time left on the
 * master; each of `not_leased` has none. */
static void assert_leases(const char *t, const char *const *leased, const char *const *not_leased)
{
    for (; leased && *leased; leased++)
        if (lease_ms(t, *leased) == 0)
            fail_msg("%s/%s: not leased", t, *leased);
    for (; not_leased && *not_leased; not_leased++)
        if (lease_ms(t, *not_leased) != 0)
            fail_msg("%s/%s: leased", t, *not_leased);
}

/* 128 complete; 256 lacks rank 0; 384 lacks rank 1.  KV for 4 blocks. */
static void put_worked_example(const char *t)
{
    put_kv(t, 4);
    put_all(t, KEYS("kda/128/r0", "kda/128/r1", "kda/256/r1", "kda/384/r0"));
}

/* Checkpoints 128, 256 and 384 complete (both ranks). */
static void put_checkpoints(const char *t)
{
    char k[32];
    for (int i = 0; i < 3; i++)
        for (int rk = 0; rk < 2; rk++) {
            snprintf(k, sizeof(k), "kda/%d/r%d", (i + 1) * 128, rk);
            put(t, k);
        }
}

static void test_worked_example(void **state)
{
    char t[32];
    const path *p = scenario(state, "worked", t, sizeof t);
    put_worked_example(t);
    moonlet_k3_request r = request(p, 512, 4);
    moonlet_k3_result res;
    counters d = run(&L2, &r, t, &res);

    assert_decision(&res, 128, 0, 4, 512, 3);
    assert_int_equal(res.kda_keys, 2); /* load its 2 keys ... */
    assert_int_equal(res.kv_keys, 1);  /* ... and the KV block below 128 */
    static const char *const want[] = {"kv/0", "kda/128/r0", "kda/128/r1"};
    assert_keys(&res, want, 3);
    assert_int_equal(res.kda_leased, 2);
    /* Exactly checkpoint 128's two keys gained a lease; the other members
     * exist but were not leased. */
    assert_leases(t, KEYS("kda/128/r0", "kda/128/r1"), KEYS("kda/256/r1", "kda/384/r0"));
    if (two_calls(p)) {
        assert_int_equal(res.rpcs, 2);
        assert_int_equal(res.kv_hits, 4);
        assert_int_equal(d.probe, 2);
        assert_int_equal(d.exist, 4); /* the 4 KV hits */
        assert_int_equal(d.probe_calls, 1);
    } else {
        assert_int_equal(res.rpcs, 1);
        assert_int_equal(res.kv_leased, 1);
        /* exactly what is loaded gained a lease: kv/0, not the blocks above */
        assert_leases(t, KEYS("kv/0"), KEYS("kv/1", "kv/2", "kv/3"));
        assert_int_equal(d.resume_kda, 2);
        assert_int_equal(d.resume_kv, 1);
        assert_int_equal(d.resume_calls, 1);
        assert_no_exist_or_probe_leases(d);
    }
    moonlet_k3_result_free(&res);
    assert_null(res.keys);
}

static void test_lease_all_mode(void **state)
{
    (void)state;
    const char *t = "k3-lease-all";
    put_worked_example(t);
    moonlet_k3_request r = request(&TWO_CALLS, 512, 4);
    r.mode = MOONLET_K3_LEASE_ALL;
    moonlet_k3_result res;
    counters d = run(&L2, &r, t, &res);

    /* Same decision, one round trip, but every existing KDA key is leased. */
    assert_decision(&res, 128, 0, 4, 512, 3);
    assert_int_equal(res.rpcs, 1);
    static const char *const want[] = {"kv/0", "kda/128/r0", "kda/128/r1"};
    assert_keys(&res, want, 3);
    assert_int_equal(res.kda_leased, 4);
    assert_leases(t, KEYS("kda/256/r1", "kda/384/r0"), NULL);
    assert_int_equal(d.exist, 4 + 4);
    assert_int_equal(d.probe, 0);
    assert_int_equal(d.probe_calls, 0);
    moonlet_k3_result_free(&res);
}

static void test_kv_boundary_cuts_candidates(void **state)
{
    char t[32];
    const path *p = scenario(state, "boundary", t, sizeof t);
    /* Every checkpoint complete, but KV block 2 is missing: the boundary is
     * 256, so 384 is neither a candidate nor leased. */
    put_all(t, KEYS("kv/0", "kv/1", "kv/3"));
    put_checkpoints(t);
    moonlet_k3_request r = request(p, 512, 4);
    moonlet_k3_result res;
    counters d = run(&L2, &r, t, &res);
    assert_decision(&res, 256, 1, 2, 256, 2);
    static const char *const want[] = {"kv/0", "kv/1", "kda/256/r0", "kda/256/r1"};
    assert_keys(&res, want, 4);
    assert_leases(t, KEYS("kda/256/r0", "kda/256/r1"), KEYS("kda/384/r0", "kda/384/r1", "kda/128/r0"));
    if (two_calls(p)) {
        assert_int_equal(res.kv_hits, 3); /* kv/3 is a hit (leased) beyond the boundary */
        assert_int_equal(d.probe, 2);
    } else {
        assert_int_equal(res.rpcs, 1);
        assert_int_equal(res.kv_hits, 2); /* the prefix: kv/3 is not looked at */
        assert_leases(t, NULL, KEYS("kv/3"));
        assert_int_equal(d.resume_kda, 2);
        assert_int_equal(d.resume_kv, 2);
        assert_no_exist_or_probe_leases(d);
    }
    moonlet_k3_result_free(&res);
}

static void test_eagle_final_token(void **state)
{
    char t[32];
    const path *p = scenario(state, "eagle", t, sizeof t);
    put_kv(t, 3);
    put_checkpoints(t);
    /* A 384-token prompt, all cached.  With final-token recompute the resume
     * must stay strictly below 384: 256. */
    moonlet_k3_request r = request(p, 384, 3);
    r.recompute_last_token = true;
    moonlet_k3_result res;
    lookup(&L2, &r, t, &res);
    assert_decision(&res, 256, 1, 3, 384, 2);
    assert_true(res.resume_position < r.prompt_tokens);
    static const char *const want[] = {"kv/0", "kv/1", "kda/256/r0", "kda/256/r1"};
    assert_keys(&res, want, 4);
    assert_leases(t, NULL, KEYS("kda/384/r0"));
    if (!two_calls(p)) {
        assert_int_equal(res.rpcs, 1);
        assert_leases(t, NULL, KEYS("kv/2"));
    }
    moonlet_k3_result_free(&res);
    /* Without it, the whole prompt is reusable. */
    r.recompute_last_token = false;
    lookup(&L2, &r, t, &res);
    assert_int_equal(res.resume_position, 384);
    assert_int_equal(res.kv_keys, 3);
    if (!two_calls(p)) {
        assert_int_equal(res.kv_leased, 3);
        assert_leases(t, KEYS("kv/2"), NULL);
    }
    moonlet_k3_result_free(&res);
}

/* Checkpoints complete, but KV block 0 is missing: no candidate, one round
 * trip, no probe, nothing to load. */
static void test_no_kv_prefix(void **state)
{
    char t[32];
    const path *p = scenario(state, "none", t, sizeof t);
    put_all(t, KEYS("kv/1", "kda/128/r0", "kda/128/r1"));
    moonlet_k3_request r = request(p, 512, 4);
    moonlet_k3_result res;
    counters d = run(&L2, &r, t, &res);
    assert_decision(&res, 0, MOONLET_K3_NONE, 0, 0, 0);
    assert_int_equal(res.kv_keys + res.kda_keys, 0);
    assert_null(res.keys);
    assert_int_equal(res.rpcs, 1);
    assert_int_equal(d.probe_calls, 0);
    assert_leases(t, NULL, KEYS("kda/128/r0"));
    moonlet_k3_result_free(&res);
}

/* KV present but no checkpoint complete: nothing is selected, and on the
 * one-call path nothing is leased, not even the KV prefix. */
static void test_no_kda_candidate(void **state)
{
    char t[32];
    const path *p = scenario(state, "none-2", t, sizeof t);
    put_kv(t, 2);
    put(t, "kda/128/r1");
    moonlet_k3_request r = request(p, 256, 2);
    moonlet_k3_result res;
    counters d = run(&L2, &r, t, &res);
    assert_decision(&res, 0, MOONLET_K3_NONE, 2, 256, 2);
    assert_int_equal(res.kv_keys + res.kda_keys, 0);
    assert_leases(t, NULL, KEYS("kda/128/r1"));
    if (two_calls(p)) {
        assert_int_equal(res.rpcs, 2); /* probed */
        assert_int_equal(d.probe, 0);
    } else {
        assert_int_equal(res.rpcs, 1);
        assert_int_equal(res.kv_leased + res.kda_leased, 0);
        assert_leases(t, NULL, KEYS("kv/0"));
        assert_int_equal(d.resume_kda + d.resume_kv, 0);
        assert_no_exist_or_probe_leases(d);
    }
    moonlet_k3_result_free(&res);
}

static void test_key_order(void **state)
{
    char t[32];
    const path *p = scenario(state, "order", t, sizeof t);
    /* 2 groups x 2 ranks x 2 components: 8 keys per checkpoint, contiguous,
     * group -> rank -> component. */
    const moonlet_k3_layout l = {.block_tokens = 128, .groups = 2, .ranks = 2, .components = 2};
    put_kv(t, 2);
    char want[8][48];
    const char *wp[9] = {"kv/0"};
    int n = 0;
    for (unsigned g = 0; g < 2; g++)
        for (unsigned rk = 0; rk < 2; rk++)
            for (unsigned c = 0; c < 2; c++) {
                snprintf(want[n], sizeof(want[n]), "kda/128/g%u/r%u/c%u", g, rk, c);
                put(t, want[n]);
                wp[1 + n] = want[n];
                n++;
            }
    moonlet_k3_request r = request(p, 300, 2);
    moonlet_k3_result res;
    counters d = run(&l, &r, t, &res);
    assert_decision(&res, 128, 0, 2, 256, 2);
    assert_keys(&res, wp, 9);
    if (two_calls(p)) {
        assert_int_equal(d.probe, 8);
    } else {
        assert_int_equal(d.resume_kda, 8);
        assert_int_equal(d.resume_kv, 1);
    }
    moonlet_k3_result_free(&res);
}

static int failing_key_fn(void *ctx, const moonlet_k3_key_id *id, char *buf, size_t cap)
{
    (void)buf;
    (void)cap;
    int mode = *(const int *)ctx;
    if (id->kind == MOONLET_K3_KEY_KDA)
        return mode == 0 ? MOONLET_ERR_INVALID_PARAMS : mode == 1 ? 0 : (int)cap;
    return snprintf(buf, cap, "kv/%llu", (unsigned long long)id->block);
}

static void test_key_builder_errors(void **state)
{
    (void)state;
    moonlet_k3_request r = request(&TWO_CALLS, 512, 4);
    moonlet_k3_result res;
    int mode = 0;
    assert_int_equal(moonlet_k3_lookup(g_cl.cli, &L2, &r, failing_key_fn, &mode, "k3-err", &res),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_null(res.keys);
    mode = 1; /* an empty key */
    assert_int_equal(moonlet_k3_lookup(g_cl.cli, &L2, &r, failing_key_fn, &mode, "k3-err", &res),
                     MOONLET_ERR_INVALID_KEY);
    mode = 2; /* a key that did not fit */
    assert_int_equal(moonlet_k3_lookup(g_cl.cli, &L2, &r, failing_key_fn, &mode, "k3-err", &res),
                     MOONLET_ERR_INVALID_KEY);
    assert_int_equal(res.rpcs, 0);
    assert_int_equal(moonlet_k3_lookup(NULL, &L2, &r, key_fn, (void *)&L2, NULL, &res),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_k3_lookup(g_cl.cli, &L2, &r, NULL, NULL, NULL, &res),
                     MOONLET_ERR_INVALID_PARAMS);
}

/* A master that answers ProbeResume as an unknown method (as one from before
 * it does): the default mode takes the two-call path, with the two-call
 * result, on every lookup. */
static void test_older_master_two_calls(void **state)
{
    (void)state;
    static const char *const extra[] = {"--disable-method", "ProbeResume", NULL};
    test_proc om, os;
    assert_int_equal(cl_start_master(&om, extra), 0);
    assert_int_equal(cl_start_store(&os, om.addr, "8MiB", NULL), 0);
    moonlet_client *cli;
    assert_int_equal(cl_client_create(om.addr, 0, &cli), 0);
    static const char payload[64] = "old";
    moonlet_put_options o = {.tenant = "old"};
    const char *keys[] = {"kv/0", "kv/1", "kv/2", "kv/3", "kda/128/r0", "kda/128/r1",
                          "kda/256/r1", "kda/384/r0"};
    for (int i = 0; i < 8; i++)
        assert_int_equal(moonlet_client_put(cli, keys[i], payload, sizeof(payload), &o), 0);
    const char *kv1[] = {"kv/0"}, *kda1[] = {"kda/128/r0", "kda/128/r1"};
    const uint64_t b1[] = {1};
    moonlet_probe_resume_result pr;
    int32_t mask[2];
    assert_int_equal(moonlet_client_probe_resume(cli, kv1, 1, kda1, 2, 2, b1, "old", &pr, mask),
                     MOONLET_ERR_INVALID_VERSION);
    for (int round = 0; round < 2; round++) {
        moonlet_k3_request r = request(&ONE_CALL, 512, 4);
        moonlet_k3_result res;
        assert_int_equal(moonlet_k3_lookup(cli, &L2, &r, key_fn, (void *)&L2, "old", &res), 0);
        assert_int_equal(res.resume_position, 128);
        assert_int_equal(res.rpcs, 2);
        assert_int_equal(res.kv_hits, 4);
        assert_int_equal(res.kv_leased, 4); /* BatchExistKey leases every KV hit */
        assert_int_equal(res.kda_leased, 2);
        static const char *const want[] = {"kv/0", "kda/128/r0", "kda/128/r1"};
        assert_keys(&res, want, 3);
        moonlet_k3_result_free(&res);
    }
    moonlet_client_destroy(cli);
    proc_stop(&os);
    proc_stop(&om);
}

/* ProbeResume's request errors through the public client. */
static void test_probe_resume_errors(void **state)
{
    (void)state;
    const char *kv[] = {"kv/0", "kv/1"}, *kda[] = {"a", "b", "c", "d"};
    const uint64_t b[] = {1, 2}, over[] = {1, 3};
    moonlet_probe_resume_result pr;
    int32_t mask[4];
    assert_int_equal(moonlet_client_probe_resume(g_cl.cli, kv, 2, kda, 4, 0, b, "e", &pr, mask),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_probe_resume(g_cl.cli, kv, 2, kda, 4, 3, b, "e", &pr, mask),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_probe_resume(g_cl.cli, kv, 2, kda, 4, 2, over, "e", &pr, mask),
                     MOONLET_ERR_INVALID_PARAMS);
    const char *bad[] = {"kv/0", ""};
    assert_int_equal(moonlet_client_probe_resume(g_cl.cli, bad, 2, kda, 4, 2, b, "e", &pr, mask),
                     MOONLET_ERR_INVALID_KEY);
    assert_int_equal(moonlet_client_probe_resume(g_cl.cli, kv, 2, kda, 4, 2, b, "e", &pr, mask), 0);
    assert_int_equal(pr.kv_prefix, 0);
    assert_int_equal(pr.selected, -1);
    /* boundary count mismatch: only reachable through the MasterClient */
    moonlet_mc_resume_out mo;
    assert_int_equal(moonlet_mc_probe_resume(g_cl.mc, "e", kv, 2, kda, 4, 2, b, 1, &mo, mask),
                     MOONLET_ERR_INVALID_PARAMS);
}

/* The master's --max-batch-keys counts KV and KDA keys together. */
static void test_probe_resume_batch_cap(void **state)
{
    (void)state;
    static const char *const extra[] = {"--max-batch-keys", "8", NULL};
    test_proc cm;
    assert_int_equal(cl_start_master(&cm, extra), 0);
    moonlet_master_client *mc;
    assert_int_equal(moonlet_mc_create(cm.addr, NULL, &mc), 0);
    const char *kv[] = {"k0", "k1", "k2", "k3", "k4"}, *kda[] = {"a", "b", "c", "d"};
    const uint64_t b[] = {1, 2};
    moonlet_mc_resume_out mo;
    int32_t mask[4];
    assert_int_equal(moonlet_mc_probe_resume(mc, "", kv, 4, kda, 4, 2, b, 2, &mo, mask), 0);
    assert_int_equal(moonlet_mc_probe_resume(mc, "", kv, 5, kda, 4, 2, b, 2, &mo, mask),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_mc_probe_resume(mc, "", kv, 4, kda, 4, 2, b, 2, &mo, mask), 0);
    moonlet_mc_destroy(mc);
    proc_stop(&cm);
}

/* A scenario on the two-call path and on the one-call path. */
#define ON_BOTH_PATHS(f)                                                                        \
    {#f " (two calls)", f, NULL, NULL, (void *)&TWO_CALLS},                                     \
        {#f " (one call)", f, NULL, NULL, (void *)&ONE_CALL}

MOONLET_TEST_MAIN("k3_lookup", setup, teardown,
                  ON_BOTH_PATHS(test_worked_example),
                  cmocka_unit_test(test_lease_all_mode),
                  ON_BOTH_PATHS(test_kv_boundary_cuts_candidates),
                  ON_BOTH_PATHS(test_eagle_final_token),
                  ON_BOTH_PATHS(test_no_kv_prefix),
                  ON_BOTH_PATHS(test_no_kda_candidate),
                  ON_BOTH_PATHS(test_key_order),
                  cmocka_unit_test(test_key_builder_errors),
                  cmocka_unit_test(test_older_master_two_calls),
                  cmocka_unit_test(test_probe_resume_errors),
                  cmocka_unit_test(test_probe_resume_batch_cap))
