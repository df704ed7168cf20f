/*
 * Concurrency stress of ProbeResume: probe threads run while churn threads
 * evict, remove and re-put KV and KDA keys spread over many shards.
 *
 * Each probe thread owns a tenant, so only its own calls lease its keys.
 * After every call it checks the contract: at most one candidate is marked,
 * and only as a whole; its boundary lies within the reported KV prefix; every
 * key of the selection (its KDA keys and the KV keys below its boundary)
 * exists and holds a lease granted by this call; no other key's lease moved
 * forward during the call (so KV keys past the boundary and unselected
 * checkpoints are never leased).  Bounded: a fixed number of calls per thread
 * and a wall-clock cap.  Meant to run under ThreadSanitizer too (suite
 * "stress").
 */
#include "../common/stress_fixture.h"

#include <sched.h>
#include "../common/test_main.h"

#define PROBERS 3
#define CHURNERS 2
#define NKV 48
#define CKPTS 12
#define RANKS 4
#define NKDA (CKPTS * RANKS)
#define CALLS 300
#define TTL_MS 200

static moonlet_master *g_m;
static char g_kv[PROBERS][NKV][24], g_kda[PROBERS][NKDA][24];
static uint64_t g_bounds[CKPTS];
static _Atomic int g_stop;
static _Atomic uint64_t g_selected, g_none, g_violations;

static int64_t lease_ms(int t, const char *key)
{
    return fix_lease_t(g_m, stress_tenant(t).ptr, key);
}

static void check_leased(int64_t after, uint64_t t0)
{
    if (stress_lease_violated(after, t0, TTL_MS))
        atomic_fetch_add(&g_violations, 1);
}

static void *prober(void *arg)
{
    int t = (int)(intptr_t)arg;
    moonlet_str kv[NKV], kda[NKDA];
    for (int i = 0; i < NKV; i++)
        kv[i] = MOONLET_STR(g_kv[t][i]);
    for (int i = 0; i < NKDA; i++)
        kda[i] = MOONLET_STR(g_kda[t][i]);
    int32_t mask[NKDA];
    int64_t kv0[NKV], kda0[NKDA];
    uint64_t start = moonlet_clock_real_ns();
    for (int call = 0; call < CALLS && stress_in_time(start); call++) {
        for (int i = 0; i < NKV; i++)
            kv0[i] = lease_ms(t, g_kv[t][i]);
        for (int i = 0; i < NKDA; i++)
            kda0[i] = lease_ms(t, g_kda[t][i]);
        uint64_t t0 = moonlet_clock_now_ns();
        moonlet_probe_resume_out out;
        assert_int_equal(moonlet_master_probe_resume(g_m, stress_tenant(t), kv, NKV, kda, NKDA, RANKS,
                                                     g_bounds, CKPTS, &out, mask),
                         MOONLET_OK);
        int64_t sel = out.selected;
        for (int i = 0; i < NKDA; i++)
            if (mask[i] != (sel >= 0 && i / RANKS == sel))
                atomic_fetch_add(&g_violations, 1); /* mask and selection disagree */
        uint64_t b = sel >= 0 ? g_bounds[sel] : 0;
        if (sel >= 0 && b > out.kv_prefix)
            atomic_fetch_add(&g_violations, 1); /* selected past the KV prefix */
        atomic_fetch_add(sel >= 0 ? &g_selected : &g_none, 1);
        for (int i = 0; i < NKV; i++) {
            int64_t after = lease_ms(t, g_kv[t][i]);
            if ((uint64_t)i < b)
                check_leased(after, t0);
            else if (kv0[i] >= 0 && after > kv0[i])
                atomic_fetch_add(&g_violations, 1); /* a KV key past the boundary leased */
        }
        for (int i = 0; i < NKDA; i++) {
            int64_t after = lease_ms(t, g_kda[t][i]);
            if (mask[i] == 1)
                check_leased(after, t0);
            else if (kda0[i] >= 0 && after > kda0[i])
                atomic_fetch_add(&g_violations, 1); /* an unselected checkpoint leased */
        }
    }
    return NULL;
}

static void *churner(void *arg)
{
    unsigned seed = (unsigned)(intptr_t)arg * 7919u + 1;
    uint64_t start = moonlet_clock_real_ns();
    while (!atomic_load(&g_stop) && stress_in_time(start)) {
        int t = rand_r(&seed) % PROBERS;
        /* KV keys are churned less often than KDA keys, but both are */
        bool is_kv = rand_r(&seed) % 3 == 0;
        const char *k = is_kv ? g_kv[t][rand_r(&seed) % NKV] : g_kda[t][rand_r(&seed) % NKDA];
        /* eviction takes the least recently written first: the KV prefix
         * (written first) would be gone at once if passes came often */
        stress_churn_step(g_m, stress_tenant(t), MOONLET_STR(k), rand_r(&seed) % 128, 10);
    }
    return NULL;
}

/* Widens the window between scan and validation so churn lands inside it;
 * a yield, not a sleep: the point is only to let another thread run. */
static void yield_hook(void *arg)
{
    (void)arg;
    sched_yield();
}

static void test_probe_resume_under_churn(void **state)
{
    (void)state;
    g_m = stress_master(TTL_MS, yield_hook);
    for (int c = 0; c < CKPTS; c++)
        g_bounds[c] = (uint64_t)(c + 1) * (NKV / CKPTS);
    for (int t = 0; t < PROBERS; t++) {
        for (int i = 0; i < NKV; i++) {
            snprintf(g_kv[t][i], sizeof(g_kv[t][i]), "kv/%d", i);
            assert_int_equal(fix_put_t(g_m, stress_tenant(t).ptr, g_kv[t][i], 64, 1), MOONLET_OK);
        }
        for (int i = 0; i < NKDA; i++) {
            snprintf(g_kda[t][i], sizeof(g_kda[t][i]), "ck%d/r%d", i / RANKS, i % RANKS);
            assert_int_equal(fix_put_t(g_m, stress_tenant(t).ptr, g_kda[t][i], 64, 1), MOONLET_OK);
        }
    }
    stress_run(prober, PROBERS, churner, CHURNERS, &g_stop);

    moonlet_master_stats st;
    moonlet_master_get_stats(g_m, &st);
    print_message("probe_resume stress: %llu selected, %llu none, %llu examined, %llu fallbacks, "
                  "%llu evictions\n",
                  (unsigned long long)g_selected, (unsigned long long)g_none,
                  (unsigned long long)st.resume_candidates_examined,
                  (unsigned long long)st.resume_recheck_fallbacks,
                  (unsigned long long)st.evictions);
    assert_int_equal(atomic_load(&g_violations), 0);
    assert_true(g_selected > 0);
    assert_true(st.evictions + st.removes > 0);
    moonlet_master_destroy(g_m);
}

MOONLET_TEST_MAIN("master_probe_resume_stress", NULL, NULL,
                  cmocka_unit_test(test_probe_resume_under_churn))
