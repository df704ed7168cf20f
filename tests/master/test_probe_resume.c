/*
 * Tests of ProbeResume (master/store/probe_resume.c): the K3 lookup in one call,
 * against the master library on a frozen clock, so every key's lease can be
 * compared exactly before and after each call.  The rule checked throughout:
 * the keys that gained a lease are exactly the selected candidate's KDA keys
 * and the KV keys below its boundary, and the mask names that candidate.
 */
#include "../common/master_fixture.h"
#include "../common/test_main.h"

#define MS MOONLET_NS_PER_MS

/* 4 KV blocks of 128 tokens; checkpoints at 128, 256, 384 (boundaries 1,
 * 2, 3 KV keys), two rank keys each. */
static const char *const KV[] = {"kv/0", "kv/1", "kv/2", "kv/3"};
static const char *const KDA[] = {"kda/128/r0", "kda/128/r1", "kda/256/r0",
                                  "kda/256/r1", "kda/384/r0", "kda/384/r1"};
static const uint64_t BOUNDS[] = {1, 2, 3};

/* cmocka setup: a master of 1024 shards and 5 s leases with one 64 MiB
 * segment as the test's state; fix_teardown destroys it. */
static int setup(void **state)
{
    *state = fix_master_mounted(1024, 5000, "c", "s", 64 << 20);
    return 0;
}

static int resume_t(moonlet_master *m, const char *tenant, const char *const *kv, size_t n_kv,
                    const char *const *kda, size_t n_kda, uint64_t cs, const uint64_t *b,
                    size_t nb, moonlet_probe_resume_out *out, int32_t *mask)
{
    moonlet_str *k = fix_strs(kv, n_kv), *d = fix_strs(kda, n_kda);
    int rc = moonlet_master_probe_resume(m, MOONLET_STR(tenant), k, n_kv, d, n_kda, cs, b, nb, out,
                                         mask);
    free(k);
    free(d);
    return rc;
}

static int resume(moonlet_master *m, moonlet_probe_resume_out *out, int32_t *mask)
{
    return resume_t(m, "", KV, 4, KDA, 6, 2, BOUNDS, 3, out, mask);
}

/* Every KV and KDA key's lease: -1 missing, else ms remaining. */
static void leases_t(moonlet_master *m, const char *tenant, int64_t kv[4], int64_t kda[6])
{
    for (int i = 0; i < 4; i++)
        kv[i] = fix_lease_t(m, tenant, KV[i]);
    for (int i = 0; i < 6; i++)
        kda[i] = fix_lease_t(m, tenant, KDA[i]);
}

/* Leases after a call: exactly kv[0..b) and candidate `sel`'s KDA keys hold
 * a fresh 5000 ms lease; every other key is as before. */
static void assert_leased_exactly(moonlet_master *m, const char *tenant, const int64_t kv0[4],
                                  const int64_t kda0[6], int64_t sel, uint64_t b)
{
    int64_t kv[4], kda[6];
    leases_t(m, tenant, kv, kda);
    for (int i = 0; i < 4; i++) {
        int64_t want = sel >= 0 && (uint64_t)i < b ? 5000 : kv0[i];
        if (kv[i] != want)
            fail_msg("KV %d: lease %lld, want %lld", i, (long long)kv[i], (long long)want);
    }
    for (int i = 0; i < 6; i++) {
        int64_t want = sel >= 0 && i / 2 == sel ? 5000 : kda0[i];
        if (kda[i] != want)
            fail_msg("KDA %d: lease %lld, want %lld", i, (long long)kda[i], (long long)want);
    }
}

static void assert_mask_sel(const int32_t *mask, size_t n, size_t cs, int64_t sel)
{
    for (size_t i = 0; i < n; i++)
        if (mask[i] != (sel >= 0 && (int64_t)(i / cs) == sel))
            fail_msg("mask %zu: %d (selected %lld)", i, mask[i], (long long)sel);
}

/* Every default-tenant key's lease before a call. */
typedef struct snapshot {
    int64_t kv[4], kda[6];
} snapshot;

static snapshot snap(moonlet_master *m)
{
    snapshot s;
    leases_t(m, "", s.kv, s.kda);
    return s;
}

/* resume() on the default lists after snapshot s: it reports KV prefix
 * `prefix` and selects `sel` (-1: none), its mask names that candidate, and
 * exactly kv[0..b) and sel's KDA keys gained a lease; `gone` (NULL: none),
 * removed during the call, no longer exists. */
static void expect_resume(moonlet_master *m, snapshot s, const char *gone, uint64_t prefix,
                          int64_t sel, uint64_t b)
{
    moonlet_probe_resume_out out;
    int32_t mask[6];
    assert_int_equal(resume(m, &out, mask), MOONLET_OK);
    assert_int_equal(out.kv_prefix, prefix);
    assert_int_equal(out.selected, sel);
    assert_mask_sel(mask, 6, 2, sel);
    for (int i = 0; gone && i < 4; i++)
        if (strcmp(KV[i], gone) == 0)
            s.kv[i] = -1;
    for (int i = 0; gone && i < 6; i++)
        if (strcmp(KDA[i], gone) == 0)
            s.kda[i] = -1;
    assert_leased_exactly(m, "", s.kv, s.kda, sel, b);
}

/* docs/probe-policy.md: 128 complete, 256 lacks rank 0, 384 lacks rank 1.
 * All four KV blocks present: 128 is selected, and only kv/0 (its boundary)
 * and its two keys gain leases. */
static void test_worked_example(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", KV, 4);
    const char *present[] = {KDA[0], KDA[1], KDA[3], KDA[4]};
    fix_put_keys(m, "", present, 4);
    expect_resume(m, snap(m), NULL, 4, 0, 1);
    assert_int_equal(fix_lease(m, KV[1]), 0); /* present, past the checkpoint: not leased */
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.resume_calls, 1);
    assert_int_equal(st.leases_resume_kda, 2);
    assert_int_equal(st.leases_resume_kv, 1);
    /* 384 (tried first) and 256 are incomplete in their scans: only 128 is
     * validated */
    assert_int_equal(st.resume_candidates_examined, 1);
    assert_int_equal(st.resume_recheck_fallbacks, 0);
    assert_int_equal(st.leases_probe + st.leases_exist, 0);
}

/* The README's walk-through: 384 lacks a rank, so 256 with kv/0, kv/1. */
static void test_quickstart_example(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", KV, 4);
    fix_put_keys(m, "", KDA, 5); /* kda/384/r1 missing */
    expect_resume(m, snap(m), NULL, 4, 1, 2);
}

/* The KV prefix bounds the candidates: with kv/2 missing, 384 (complete)
 * needs 3 KV keys and is not eligible; 256 is selected.  kv/3 exists but
 * lies past the prefix and is never leased. */
static void test_kv_boundary_restricts(void **state)
{
    moonlet_master *m = *state;
    const char *kv[] = {KV[0], KV[1], KV[3]};
    fix_put_keys(m, "", kv, 3);
    fix_put_keys(m, "", KDA, 6);
    expect_resume(m, snap(m), NULL, 2, 1, 2);
    moonlet_master_stats st = fix_stats(m);
    /* 384 only in the first try, which finds kv/2 missing; then 256 */
    assert_int_equal(st.resume_candidates_examined, 2);
}

/* No complete candidate within the prefix: nothing is leased, not even the
 * KV prefix (the engine resumes from 0 and loads nothing); the prefix is
 * still reported.  Existing leases are left as they were. */
static void test_no_candidate_leases_nothing(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", KV, 4);
    const char *present[] = {KDA[1], KDA[2], KDA[5]}; /* every checkpoint lacks a rank */
    fix_put_keys(m, "", present, 3);
    bool ex;
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(""), MOONLET_STR(KV[2]), &ex), 0);
    moonlet_clock_advance(1500 * MS);
    snapshot s0 = snap(m);
    assert_int_equal(s0.kv[2], 3500);
    expect_resume(m, s0, NULL, 4, -1, 0);
    /* a KV prefix of 0 admits only boundary-0 candidates */
    moonlet_probe_resume_out out;
    int32_t mask[6];
    const char *only_kda[] = {KDA[0]};
    fix_put_keys(m, "", only_kda, 1);
    const uint64_t zero_b[] = {0, 0, 0};
    const char *kv_missing[] = {"nope/0", "nope/1"};
    assert_int_equal(resume_t(m, "", kv_missing, 2, KDA, 6, 2, zero_b, 3, &out, mask), 0);
    assert_int_equal(out.kv_prefix, 0);
    assert_int_equal(out.selected, 0); /* 128's keys now complete; needs no KV */
    assert_int_equal(fix_lease(m, KDA[0]), 5000);
}

/* Candidate sizes 1 and 3 and gaps: the last complete eligible candidate. */
static void test_sizes_and_gaps(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", KV, 4);
    const char *kda1[] = {"a", "b", "c", "d"};
    const char *present1[] = {"a", "c"};
    fix_put_keys(m, "", present1, 2);
    const uint64_t b1[] = {0, 1, 3, 4};
    moonlet_probe_resume_out out;
    int32_t mask[9];
    assert_int_equal(resume_t(m, "", KV, 4, kda1, 4, 1, b1, 4, &out, mask), 0);
    assert_int_equal(out.selected, 2); /* "d" missing */
    assert_mask_sel(mask, 4, 1, 2);
    assert_int_equal(fix_lease(m, KV[2]), 5000);
    assert_int_equal(fix_lease(m, KV[3]), 0);

    const char *kda3[] = {"x0", "x1", "x2", "y0", "y1", "y2", "z0", "z1", "z2"};
    const char *present3[] = {"x0", "x1", "x2", "y0", "y2", "z0", "z1", "z2"};
    fix_put_keys(m, "", present3, 8);
    const uint64_t b3[] = {1, 2, 4};
    assert_int_equal(resume_t(m, "", KV, 4, kda3, 9, 3, b3, 3, &out, mask), 0);
    assert_int_equal(out.selected, 2);
    assert_mask_sel(mask, 9, 3, 2);
    assert_int_equal(fix_lease(m, KV[3]), 5000); /* boundary 4: every KV key */
}

/* Bad requests fail whole, lease nothing, select nothing. */
static void test_invalid_requests(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", KV, 4);
    fix_put_keys(m, "", KDA, 6);
    int64_t kv0[4], kda0[6];
    leases_t(m, "", kv0, kda0);
    moonlet_probe_resume_out out;
    int32_t mask[6];
    const uint64_t over[] = {1, 2, 5};
    const uint64_t two[] = {1, 2};
    struct {
        uint64_t cs;
        const uint64_t *b;
        size_t nb;
        int rc;
    } cases[] = {
        {0, BOUNDS, 3, MOONLET_ERR_INVALID_PARAMS},  /* candidate_size 0 */
        {4, BOUNDS, 3, MOONLET_ERR_INVALID_PARAMS},  /* does not divide 6 */
        {2, two, 2, MOONLET_ERR_INVALID_PARAMS},     /* boundary count */
        {2, over, 3, MOONLET_ERR_INVALID_PARAMS},    /* boundary above n_kv */
        {6, BOUNDS, 3, MOONLET_ERR_INVALID_PARAMS},  /* 1 candidate, 3 boundaries */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        mask[0] = 7;
        out.selected = 9;
        assert_int_equal(resume_t(m, "", KV, 4, KDA, 6, cases[i].cs, cases[i].b, cases[i].nb,
                                  &out, mask), cases[i].rc);
        assert_int_equal(out.selected, -1);
        assert_int_equal(mask[0], 0);
    }
    /* an empty or over-long key anywhere: INVALID_KEY for the request */
    static char longkey[5000];
    memset(longkey, 'k', sizeof(longkey) - 1);
    const char *bad_kv[] = {KV[0], "", KV[2], KV[3]};
    assert_int_equal(resume_t(m, "", bad_kv, 4, KDA, 6, 2, BOUNDS, 3, &out, mask),
                     MOONLET_ERR_INVALID_KEY);
    const char *bad_kda[] = {KDA[0], KDA[1], KDA[2], KDA[3], KDA[4], longkey};
    assert_int_equal(resume_t(m, "", KV, 4, bad_kda, 6, 2, BOUNDS, 3, &out, mask),
                     MOONLET_ERR_INVALID_KEY);
    assert_leased_exactly(m, "", kv0, kda0, -1, 0);
    /* empty lists are valid: no candidates; candidate_size is then ignored */
    assert_int_equal(resume_t(m, "", KV, 4, NULL, 0, 0, NULL, 0, &out, mask), MOONLET_OK);
    assert_int_equal(out.kv_prefix, 4);
    assert_int_equal(out.selected, -1);
    assert_int_equal(resume_t(m, "", NULL, 0, NULL, 0, 3, NULL, 0, &out, mask), MOONLET_OK);
    assert_int_equal(out.kv_prefix, 0);
    assert_leased_exactly(m, "", kv0, kda0, -1, 0);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.leases_resume_kda + st.leases_resume_kv, 0);
}

/* A key listed twice, and a KDA key that is also a KV key: one physical
 * object, one lease, counted once. */
static void test_duplicates(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "", KV, 4);
    fix_put_keys(m, "", KDA, 2);
    const char *kv[] = {KV[0], KV[0], KV[1]};
    const char *kda[] = {KDA[0], KDA[0], KV[1], KDA[1]};
    const uint64_t b[] = {3, 3};
    moonlet_probe_resume_out out;
    int32_t mask[4];
    assert_int_equal(resume_t(m, "", kv, 3, kda, 4, 2, b, 2, &out, mask), MOONLET_OK);
    assert_int_equal(out.kv_prefix, 3);
    assert_int_equal(out.selected, 1);
    assert_mask_sel(mask, 4, 2, 1);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.leases_resume_kda, 2); /* kv/1 and kda/128/r1 */
    assert_int_equal(st.leases_resume_kv, 1);  /* kv/0 (kv/1 counted as KDA) */
    assert_int_equal(fix_lease(m, KV[0]), 5000);
    assert_int_equal(fix_lease(m, KDA[0]), 0);
    /* a selected candidate that lists one key twice: one lease, counted once */
    const char *twice[] = {KDA[0], KDA[0]};
    const uint64_t b1[] = {1};
    assert_int_equal(resume_t(m, "", kv, 3, twice, 2, 2, b1, 1, &out, mask), MOONLET_OK);
    assert_int_equal(out.selected, 0);
    assert_int_equal(fix_lease(m, KDA[0]), 5000);
    st = fix_stats(m);
    assert_int_equal(st.leases_resume_kda, 2 + 1);
    assert_int_equal(st.leases_resume_kv, 1 + 1);
}

/* The same keys in two tenants are two sets of objects: a lookup in one
 * leases only its own; an unknown tenant has nothing. */
static void test_tenants(void **state)
{
    moonlet_master *m = *state;
    fix_put_keys(m, "A", KV, 4);
    fix_put_keys(m, "A", KDA, 6);
    fix_put_keys(m, "B", KV, 2);
    fix_put_keys(m, "B", KDA, 4);
    int64_t a_kv[4], a_kda[6], b_kv[4], b_kda[6];
    leases_t(m, "A", a_kv, a_kda);
    leases_t(m, "B", b_kv, b_kda);
    moonlet_probe_resume_out out;
    int32_t mask[6];
    assert_int_equal(resume_t(m, "B", KV, 4, KDA, 6, 2, BOUNDS, 3, &out, mask), MOONLET_OK);
    assert_int_equal(out.kv_prefix, 2);
    assert_int_equal(out.selected, 1);
    assert_leased_exactly(m, "B", b_kv, b_kda, 1, 2);
    assert_leased_exactly(m, "A", a_kv, a_kda, -1, 0); /* A untouched */
    assert_int_equal(resume_t(m, "A", KV, 4, KDA, 6, 2, BOUNDS, 3, &out, mask), MOONLET_OK);
    assert_int_equal(out.selected, 2);
    assert_leased_exactly(m, "A", a_kv, a_kda, 2, 3);
    assert_int_equal(resume_t(m, "nobody", KV, 4, KDA, 6, 2, BOUNDS, 3, &out, mask), 0);
    assert_int_equal(out.kv_prefix, 0);
    assert_int_equal(out.selected, -1);
    assert_int_equal(resume_t(m, "", KV, 4, KDA, 6, 2, BOUNDS, 3, &out, mask), 0);
    assert_int_equal(out.selected, -1); /* the default tenant holds nothing */
}

/* Between the scan and the validation the hook removes a key: the candidate
 * fails its recheck and an earlier one is selected; the mask and the leases
 * agree, and the failed candidate's surviving keys gained nothing. */
struct hook_ctx {
    moonlet_master *m;
    const char *victim;
    int calls;
    int at; /* the call (0: the first) before which the victim is removed */
};

static void remove_once_hook(void *arg)
{
    struct hook_ctx *h = arg;
    if (h->calls++ == h->at && h->victim)
        assert_int_equal(moonlet_master_remove(h->m, MOONLET_STR(""), MOONLET_STR(h->victim)),
                         MOONLET_OK);
}

static moonlet_master *hook_master(struct hook_ctx *h)
{
    moonlet_master_config cfg = fix_config(0);
    cfg.probe_hook = remove_once_hook;
    cfg.probe_hook_arg = h;
    h->m = fix_master_of(&cfg, FIX_T0);
    fix_mount(h->m, "c", "s", 1 << 20);
    fix_put_keys(h->m, "", KV, 4);
    fix_put_keys(h->m, "", KDA, 6);
    return h->m;
}

/* The counters after one lookup that fell back: `examined` candidates
 * validated, all but the last failing their recheck; the selected one
 * leased its 2 KDA keys and `kv` KV keys. */
static void assert_fallback_stats(moonlet_master *m, uint64_t examined, uint64_t kv)
{
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.resume_candidates_examined, examined);
    assert_int_equal(st.resume_recheck_fallbacks, examined - 1);
    assert_int_equal(st.leases_resume_kda, 2);
    assert_int_equal(st.leases_resume_kv, kv);
}

static void check_fallback(const char *victim, int64_t want_sel, uint64_t want_b,
                           uint64_t want_examined, uint64_t want_prefix)
{
    struct hook_ctx h = {.victim = victim};
    moonlet_master *m = hook_master(&h);
    /* the prefix as scanned; the victim is gone */
    expect_resume(m, snap(m), victim, want_prefix, want_sel, want_b);
    assert_fallback_stats(m, want_examined, want_b);
    moonlet_master_stats st = fix_stats(m);
    uint64_t hist = 0;
    for (int i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++)
        hist += st.resume_lock_hold_hist[i];
    assert_int_equal(hist, st.resume_candidates_examined); /* one hold per validation */
    moonlet_master_destroy(m);
}

static void test_kda_member_evicted_between_phases(void **state)
{
    (void)state;
    check_fallback("kda/384/r1", 1, 2, 2, 4); /* 384 loses a rank: 256 */
}

static void test_kv_key_evicted_between_phases(void **state)
{
    (void)state;
    /* removed before the first try (the last candidate, without a scan): */
    check_fallback("kv/2", 1, 2, 2, 2); /* 384 needs kv/2: 256, which does not */
    /* 384 and 256 need kv/1: 128; the scan after the failed first try sees
     * the prefix at 1, so 256 is not validated at all */
    check_fallback("kv/1", 0, 1, 2, 1);
}

/* A key removed between the scan and a validation: 384 lacks a rank (its
 * own scan fails: no first try), the scan sees all four KV blocks and 256 complete, then
 * kv/1 (or a member of 256) goes before 256 is validated: 256 fails its
 * recheck, 128 is selected, and only kv/0 and 128's keys gained leases. */
static void after_the_scan(const char *victim)
{
    struct hook_ctx h = {.victim = victim, .at = 0};
    moonlet_master *m = hook_master(&h);
    assert_int_equal(moonlet_master_remove(m, MOONLET_STR(""), MOONLET_STR(KDA[5])), MOONLET_OK);
    /* the prefix as scanned before the victim went; 256 failed: nothing of
     * it leased */
    expect_resume(m, snap(m), victim, 4, 0, 1);
    assert_int_equal(h.calls, 2); /* before 256 and 128 (384's own scan failed: not tried) */
    assert_fallback_stats(m, 2, 1);
    moonlet_master_destroy(m);
}

static void test_evicted_after_the_scan(void **state)
{
    (void)state;
    after_the_scan("kv/1");       /* a KV key 256 needs */
    after_the_scan("kda/256/r0"); /* a member of 256 */
}

/* Keys over many shards: a candidate with a long KV boundary takes many
 * shard locks (ascending) and still leases exactly its keys. */
static void test_many_shards(void **state)
{
    moonlet_master *m = *state;
    enum { NKV = 128, CK = 32, RANKS = 4 };
    static char kvn[NKV][16], kdan[CK * RANKS][24];
    const char *kv[NKV], *kda[CK * RANKS];
    uint64_t b[CK];
    for (int i = 0; i < NKV; i++) {
        snprintf(kvn[i], sizeof(kvn[i]), "b%d", i);
        kv[i] = kvn[i];
        if (i != 100)
            assert_int_equal(fix_put(m, kv[i], 64), 0);
    }
    for (int c = 0; c < CK; c++) {
        b[c] = (uint64_t)(c + 1) * 4;
        for (int r = 0; r < RANKS; r++) {
            snprintf(kdan[c * RANKS + r], sizeof(kdan[0]), "ck%d/r%d", c, r);
            kda[c * RANKS + r] = kdan[c * RANKS + r];
            if (!(c == 23 && r == 2))
                assert_int_equal(fix_put(m, kda[c * RANKS + r], 64), 0);
        }
    }
    moonlet_probe_resume_out out;
    int32_t mask[CK * RANKS];
    assert_int_equal(resume_t(m, "", kv, NKV, kda, CK * RANKS, RANKS, b, CK, &out, mask), 0);
    assert_int_equal(out.kv_prefix, 100);
    /* eligible: boundary <= 100, so candidates 0..24; 23 is incomplete */
    assert_int_equal(out.selected, 24);
    assert_mask_sel(mask, CK * RANKS, RANKS, 24);
    for (int i = 0; i < NKV; i++)
        assert_int_equal(fix_lease(m, kv[i]), i == 100 ? -1 : (i < 100 ? 5000 : 0));
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.leases_resume_kv, 100);
    assert_int_equal(st.leases_resume_kda, RANKS);
}

MOONLET_TEST_MAIN("master_probe_resume", NULL, NULL,
                  FIX_TEST(test_worked_example),
                  FIX_TEST(test_quickstart_example),
                  FIX_TEST(test_kv_boundary_restricts),
                  FIX_TEST(test_no_candidate_leases_nothing),
                  FIX_TEST(test_sizes_and_gaps),
                  FIX_TEST(test_invalid_requests),
                  FIX_TEST(test_duplicates),
                  FIX_TEST(test_tenants),
                  cmocka_unit_test(test_kda_member_evicted_between_phases),
                  cmocka_unit_test(test_kv_key_evicted_between_phases),
                  cmocka_unit_test(test_evicted_after_the_scan),
                  FIX_TEST(test_many_shards))
