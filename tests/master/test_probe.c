/*
 * Tests of BatchProbeKey with a GrantLeasePolicy against the master library
 * (master/store/probe.c with lease/probe_policy.c), on a frozen clock so lease
 * deadlines can be compared exactly before and after each call.
 */
#include "../common/master_fixture.h"
#include "../common/test_main.h"

#define MS MOONLET_NS_PER_MS

static moonlet_grant_lease_policy last_hit(uint64_t cs)
{
    return (moonlet_grant_lease_policy){MOONLET_PROBE_LEASE_LAST_HIT_ONLY, cs};
}

static moonlet_grant_lease_policy none(void)
{
    return (moonlet_grant_lease_policy){MOONLET_PROBE_LEASE_NONE, 1};
}

/* Probes and returns the code; results in r. */
static int probe(moonlet_master *m, const char *tenant, moonlet_grant_lease_policy p,
                 const char *const *keys, size_t n, int32_t *r)
{
    moonlet_str *s = fix_strs(keys, n);
    int rc = moonlet_master_batch_probe_key(m, MOONLET_STR(tenant), &p, s, n, r);
    free(s);
    return rc;
}

/* Lease remaining of every key (-1 = missing). */
static void leases(moonlet_master *m, const char *tenant, const char *const *keys, size_t n,
                   int64_t *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = fix_lease_t(m, tenant, keys[i]);
}

static void assert_mask(const int32_t *r, const int *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (r[i] != want[i])
            fail_msg("position %zu: got %d, want %d", i, r[i], want[i]);
    }
}

/* The K3 worked example: checkpoints 128, 256, 384 with two rank keys each;
 * 128 has both, 256 lacks rank 0, 384 lacks rank 1. */
static const char *const K3[] = {"kda/128/r0", "kda/128/r1", "kda/256/r0",
                                 "kda/256/r1", "kda/384/r0", "kda/384/r1"};

/* cmocka setup: a master of 1024 shards and 5 s leases with one 64 MiB
 * segment as the test's state; fix_teardown destroys it. */
static int setup(void **state)
{
    *state = fix_master_mounted(1024, 5000, "c", "s", 64 << 20);
    return 0;
}

static void test_worked_example(void **state)
{
    moonlet_master *m = *state;
    const char *present[] = {K3[0], K3[1], K3[3], K3[4]};
    fix_put_keys(m, "", present, 4);
    int64_t before[6], after[6];
    leases(m, "", K3, 6, before);
    int32_t r[6];
    assert_int_equal(probe(m, "", last_hit(2), K3, 6, r), MOONLET_OK);
    int want[] = {1, 1, 0, 0, 0, 0};
    assert_mask(r, want, 6);
    leases(m, "", K3, 6, after);
    assert_int_equal(after[0], 5000);
    assert_int_equal(after[1], 5000);
    assert_int_equal(after[2], -1);
    assert_int_equal(after[3], before[3]); /* 0: unselected, unchanged */
    assert_int_equal(after[4], before[4]);
    assert_int_equal(after[3], 0);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.leases_probe, 2);
    assert_int_equal(st.probe_calls_last_hit, 1);
    assert_int_equal(st.probe_candidates_examined, 1);
}

static void test_none_leaves_leases(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", K3, 6);
    /* someone else leases two keys */
    bool ex;
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(""), MOONLET_STR(K3[2]), &ex), MOONLET_OK);
    moonlet_clock_advance(1000 * MS);
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(""), MOONLET_STR(K3[5]), &ex), MOONLET_OK);
    moonlet_clock_advance(500 * MS);
    int64_t before[6], after[6];
    leases(m, "", K3, 6, before);
    int32_t r[7];
    const char *keys[] = {K3[0], K3[1], K3[2], K3[3], K3[4], K3[5], "missing"};
    /* candidate_size is ignored by NONE, even 0 or non-dividing */
    moonlet_grant_lease_policy p = {MOONLET_PROBE_LEASE_NONE, 0};
    assert_int_equal(probe(m, "", p, keys, 7, r), MOONLET_OK);
    int want[] = {1, 1, 1, 1, 1, 1, 0};
    assert_mask(r, want, 7);
    leases(m, "", K3, 6, after);
    assert_memory_equal(before, after, sizeof(before));
    assert_int_equal(after[2], 3500);
    assert_int_equal(after[5], 4500);
}

static void test_selected_only_and_all_false(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", K3, 6); /* all three complete: the last is selected */
    int32_t r[6];
    assert_int_equal(probe(m, "", last_hit(2), K3, 6, r), MOONLET_OK);
    int want_last[] = {0, 0, 0, 0, 1, 1};
    assert_mask(r, want_last, 6);
    assert_int_equal(fix_lease(m, K3[0]), 0);
    assert_int_equal(fix_lease(m, K3[2]), 0);
    assert_int_equal(fix_lease(m, K3[4]), 5000);

    const char *none_complete[] = {"x/0", K3[0], "x/1", K3[2]};
    assert_int_equal(probe(m, "", last_hit(2), none_complete, 4, r), MOONLET_OK);
    int want_none[] = {0, 0, 0, 0};
    assert_mask(r, want_none, 4);
    assert_int_equal(fix_lease(m, K3[0]), 0); /* no lease at all */
    assert_int_equal(fix_lease(m, K3[2]), 0);
}

static void test_sparse_and_sizes(void **state)
{
    moonlet_master *m = *state;
    const char *keys[] = {"a0", "a1", "a2", "b0", "b1", "b2", "c0", "c1", "c2", "d0", "d1", "d2"};
    const char *present[] = {"a0", "a1", "a2", "b1", "c0", "c1", "c2", "d0", "d2"};
    fix_put_keys(m, "", present, 9);
    int32_t r[12];
    /* size 3: a and c complete, b and d not -> c selected (gaps allowed) */
    assert_int_equal(probe(m, "", last_hit(3), keys, 12, r), MOONLET_OK);
    int want3[] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0};
    assert_mask(r, want3, 12);
    /* a different size on the next request: size 1 selects the last present key */
    assert_int_equal(probe(m, "", last_hit(1), keys, 12, r), MOONLET_OK);
    int want1[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    assert_mask(r, want1, 12);
    assert_int_equal(fix_lease(m, "d2"), 5000);
    assert_int_equal(fix_lease(m, "d0"), 0);
    /* size 6: {a,b} incomplete (b0 missing), {c,d} incomplete (d1 missing) */
    assert_int_equal(probe(m, "", last_hit(6), keys, 12, r), MOONLET_OK);
    int want6[12] = {0};
    assert_mask(r, want6, 12);
    /* size 12: one candidate, incomplete */
    assert_int_equal(probe(m, "", last_hit(12), keys, 12, r), MOONLET_OK);
    assert_mask(r, want6, 12);
}

static void test_invalid_policies(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", K3, 6);
    int32_t r[6];
    assert_int_equal(probe(m, "", last_hit(0), K3, 6, r), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(probe(m, "", last_hit(4), K3, 6, r), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(probe(m, "", last_hit(7), K3, 6, r), MOONLET_ERR_INVALID_PARAMS);
    moonlet_grant_lease_policy bad = {7, 2};
    assert_int_equal(probe(m, "", bad, K3, 6, r), MOONLET_ERR_INVALID_PARAMS);
    for (int i = 0; i < 6; i++)
        assert_int_equal(fix_lease(m, K3[i]), 0); /* nothing leased */
    /* empty requests: empty result, for both modes, even with size 0 */
    assert_int_equal(probe(m, "", last_hit(0), K3, 0, r), MOONLET_OK);
    assert_int_equal(probe(m, "", none(), K3, 0, r), MOONLET_OK);
    assert_int_equal(probe(m, "", bad, K3, 0, r), MOONLET_ERR_INVALID_PARAMS);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.leases_probe, 0);
}

static void test_duplicates(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", K3, 2);
    /* the same key twice in one candidate, and across candidates */
    const char *keys[] = {K3[0], K3[0], K3[0], K3[1], "gone", K3[1]};
    int32_t r[6];
    assert_int_equal(probe(m, "", last_hit(2), keys, 6, r), MOONLET_OK);
    int want[] = {0, 0, 1, 1, 0, 0};
    assert_mask(r, want, 6);
    assert_int_equal(probe(m, "", last_hit(2), keys, 4, r), MOONLET_OK);
    int want4[] = {0, 0, 1, 1};
    assert_mask(r, want4, 4);
    const char *same[] = {K3[0], K3[0]};
    assert_int_equal(probe(m, "", last_hit(2), same, 2, r), MOONLET_OK);
    assert_int_equal(r[0], 1);
    assert_int_equal(r[1], 1);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.leases_probe, 2 + 2 + 1); /* each physical object once per call */
}

static void test_errors_stay_errors(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", K3, 6);
    const char *keys[] = {K3[0], K3[1], "", K3[3]};
    int32_t r[4];
    assert_int_equal(probe(m, "", last_hit(2), keys, 4, r), MOONLET_OK);
    assert_int_equal(r[0], 0);
    assert_int_equal(r[1], 0);
    assert_int_equal(r[2], MOONLET_ERR_INVALID_KEY);
    assert_int_equal(r[3], 0);
    assert_int_equal(fix_lease(m, K3[0]), 0); /* leases nothing */
    assert_int_equal(probe(m, "", none(), keys, 4, r), MOONLET_OK);
    assert_int_equal(r[2], MOONLET_ERR_INVALID_KEY);
    assert_int_equal(r[0], 1);
}

static void test_tenants(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "A", K3, 6);
    int32_t r[6];
    int zero[6] = {0};
    assert_int_equal(probe(m, "B", last_hit(2), K3, 6, r), MOONLET_OK);
    assert_mask(r, zero, 6);
    assert_int_equal(probe(m, "", last_hit(2), K3, 6, r), MOONLET_OK);
    assert_mask(r, zero, 6);
    assert_int_equal(fix_lease_t(m, "A", K3[4]), 0);
    assert_int_equal(probe(m, "A", last_hit(2), K3, 6, r), MOONLET_OK);
    int want[] = {0, 0, 0, 0, 1, 1};
    assert_mask(r, want, 6);
}

/* Between the scan and the validation, the hook removes a member of the last
 * candidate: the probe falls back to the previous complete one. */
struct hook_ctx {
    moonlet_master *m;
    const char *victim;
    int calls;
};

static void remove_hook(void *arg)
{
    struct hook_ctx *h = arg;
    h->calls++;
    assert_int_equal(moonlet_master_remove(h->m, MOONLET_STR(""), MOONLET_STR(h->victim)), MOONLET_OK);
}

static void test_eviction_between_phases(void **state)
{
    (void)state;
    moonlet_master_config cfg = fix_config(0);
    struct hook_ctx h = {.victim = K3[5]};
    cfg.probe_hook = remove_hook;
    cfg.probe_hook_arg = &h;
    h.m = fix_master_of(&cfg, FIX_T0);
    fix_mount(h.m, "c", "s", 1 << 20);
    fix_put_keys(h.m, "", K3, 6);
    int32_t r[6];
    assert_int_equal(probe(h.m, "", last_hit(2), K3, 6, r), MOONLET_OK);
    assert_int_equal(h.calls, 1);
    int want[] = {0, 0, 1, 1, 0, 0};
    assert_mask(r, want, 6);
    /* the mask matches exactly the keys that gained leases */
    for (int i = 0; i < 6; i++)
        assert_int_equal(fix_lease(h.m, K3[i]), i == 5 ? -1 : (r[i] ? 5000 : 0));
    moonlet_master_stats st;
    moonlet_master_get_stats(h.m, &st);
    assert_int_equal(st.probe_recheck_fallbacks, 1);
    assert_int_equal(st.probe_candidates_examined, 2);
    assert_int_equal(st.leases_probe, 2);
    uint64_t hist = 0;
    for (int i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++)
        hist += st.probe_lock_hold_hist[i];
    assert_int_equal(hist, 2); /* one lock hold per candidate validated */

    /* the only complete candidate loses a member: nothing is leased */
    moonlet_clock_advance(6000 * MS);
    h.victim = K3[2];
    assert_int_equal(probe(h.m, "", last_hit(2), K3, 6, r), MOONLET_OK);
    int zero[6] = {0};
    /* candidate 128 is still complete: it is selected after 256 fails */
    int want2[] = {1, 1, 0, 0, 0, 0};
    assert_mask(r, want2, 6);
    (void)zero;
    assert_int_equal(fix_lease(h.m, K3[3]), 0);
    moonlet_master_destroy(h.m);
}

/* Keys spread over many shards: members of one candidate sit in different
 * shards, and validation takes their locks in ascending order. */
static void test_many_shards_large_candidates(void **state)
{
    moonlet_master *m = *state;
    enum { CK = 32, RANKS = 16, N = CK * RANKS };
    static char names[N][32];
    const char *keys[N];
    for (int c = 0; c < CK; c++)
        for (int k = 0; k < RANKS; k++) {
            snprintf(names[c * RANKS + k], 32, "ck%d/r%d", c, k);
            keys[c * RANKS + k] = names[c * RANKS + k];
            if (!(c % 5 == 4 && k == 7)) /* every 5th checkpoint lacks rank 7 */
                assert_int_equal(fix_put(m, names[c * RANKS + k], 64), MOONLET_OK);
        }
    int32_t r[N];
    assert_int_equal(probe(m, "", last_hit(RANKS), keys, N, r), MOONLET_OK);
    /* checkpoints 4, 9, ..., 29 are incomplete: the last is 31 */
    for (int i = 0; i < N; i++)
        assert_int_equal(r[i], i / RANKS == 31);
    assert_int_equal(fix_stats(m).leases_probe, RANKS);
}

MOONLET_TEST_MAIN("master_probe", NULL, NULL,
                  FIX_TEST(test_worked_example),
                  FIX_TEST(test_none_leaves_leases),
                  FIX_TEST(test_selected_only_and_all_false),
                  FIX_TEST(test_sparse_and_sizes),
                  FIX_TEST(test_invalid_policies),
                  FIX_TEST(test_duplicates),
                  FIX_TEST(test_errors_stay_errors),
                  FIX_TEST(test_tenants),
                  cmocka_unit_test(test_eviction_between_phases),
                  FIX_TEST(test_many_shards_large_candidates))
