/*
 * Concurrency stress of BatchProbeKey(LAST_HIT_ONLY): probe threads run while
 * churn threads evict, remove and re-put keys spread over many shards.
 *
 * Each probe thread owns a tenant, so only its own calls can lease its keys.
 * After every call it checks: every key of the selected candidate exists and
 * holds a lease granted by this call (deadline at least call start + TTL),
 * and no unselected key's lease deadline moved forward during the call.
 * Bounded: a fixed number of calls per thread and a wall-clock cap.
 * Meant to run under ThreadSanitizer too (suite "stress").
 */
#include "../common/stress_fixture.h"

#include <time.h>
#include "../common/test_main.h"

#define PROBERS 3
#define CHURNERS 2
#define CKPTS 24
#define RANKS 4
#define NKEYS (CKPTS * RANKS)
#define CALLS 400
#define TTL_MS 200

static moonlet_master *g_m;
static char g_keys[PROBERS][NKEYS][32];
static _Atomic int g_stop;
static _Atomic uint64_t g_selected, g_none, g_violations;

static void *prober(void *arg)
{
    int t = (int)(intptr_t)arg;
    moonlet_str keys[NKEYS];
    for (int i = 0; i < NKEYS; i++)
        keys[i] = MOONLET_STR(g_keys[t][i]);
    moonlet_grant_lease_policy p = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, RANKS};
    int32_t r[NKEYS];
    int64_t before[NKEYS];
    uint64_t start = moonlet_clock_real_ns();
    for (int call = 0; call < CALLS && stress_in_time(start); call++) {
        for (int i = 0; i < NKEYS; i++)
            before[i] = fix_lease_t(g_m, stress_tenant(t).ptr, g_keys[t][i]);
        uint64_t t0 = moonlet_clock_now_ns();
        assert_int_equal(moonlet_master_batch_probe_key(g_m, stress_tenant(t), &p, keys, NKEYS, r), MOONLET_OK);
        int selected = -1;
        for (int i = 0; i < NKEYS; i++) {
            if (r[i] == 1) {
                if (selected < 0)
                    selected = i / RANKS;
                if (i / RANKS != selected)
                    atomic_fetch_add(&g_violations, 1); /* two candidates marked */
            }
        }
        if (selected < 0) {
            atomic_fetch_add(&g_none, 1);
        } else {
            atomic_fetch_add(&g_selected, 1);
            for (int k = 0; k < RANKS; k++)
                if (r[selected * RANKS + k] != 1)
                    atomic_fetch_add(&g_violations, 1); /* partial candidate */
        }
        for (int i = 0; i < NKEYS; i++) {
            int64_t after = fix_lease_t(g_m, stress_tenant(t).ptr, g_keys[t][i]);
            if (r[i] == 1) {
                if (stress_lease_violated(after, t0, TTL_MS)) /* leased by this call */
                    atomic_fetch_add(&g_violations, 1);
            } else if (before[i] >= 0 && after > before[i]) {
                /* an unselected key's lease moved forward: only this thread
                 * leases this tenant's keys, so this call did it */
                atomic_fetch_add(&g_violations, 1);
            }
        }
    }
    return NULL;
}

static void *churner(void *arg)
{
    unsigned seed = (unsigned)(intptr_t)arg * 7919u + 1;
    uint64_t start = moonlet_clock_real_ns();
    while (!atomic_load(&g_stop) && stress_in_time(start)) {
        int t = rand_r(&seed) % PROBERS, i = rand_r(&seed) % NKEYS;
        stress_churn_step(g_m, stress_tenant(t), MOONLET_STR(g_keys[t][i]), rand_r(&seed) % 16, 3);
    }
    return NULL;
}

/* Widens the window between scan and validation so churn lands inside it. */
static void yield_hook(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

static void test_probe_under_churn(void **state)
{
    (void)state;
    g_m = stress_master(TTL_MS, yield_hook);
    for (int t = 0; t < PROBERS; t++)
        for (int i = 0; i < NKEYS; i++) {
            snprintf(g_keys[t][i], 32, "ck%d/r%d", i / RANKS, i % RANKS);
            assert_int_equal(fix_put_t(g_m, stress_tenant(t).ptr, g_keys[t][i], 64, 1), MOONLET_OK);
        }
    stress_run(prober, PROBERS, churner, CHURNERS, &g_stop);

    moonlet_master_stats st;
    moonlet_master_get_stats(g_m, &st);
    print_message("probe stress: %llu selected, %llu none, %llu fallbacks, %llu evictions\n",
                  (unsigned long long)g_selected, (unsigned long long)g_none,
                  (unsigned long long)st.probe_recheck_fallbacks,
                  (unsigned long long)st.evictions);
    assert_int_equal(atomic_load(&g_violations), 0);
    assert_true(g_selected > 0);
    assert_true(st.evictions > 0);
    moonlet_master_destroy(g_m);
}

MOONLET_TEST_MAIN("master_probe_stress", NULL, NULL,
                  cmocka_unit_test(test_probe_under_churn))
