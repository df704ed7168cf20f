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
#include "../common/master_fixture.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define PROBERS 3
#define CHURNERS 2
#define NKV 48
#define CKPTS 12
#define RANKS 4
#define NKDA (CKPTS * RANKS)
#define CALLS 300
#define TTL_MS 200
#define DEADLINE_NS (20ull * 1000000000ull)

static moonlet_master *g_m;
static char g_kv[PROBERS][NKV][24], g_kda[PROBERS][NKDA][24];
static uint64_t g_bounds[CKPTS];
static _Atomic int g_stop;
static _Atomic uint64_t g_selected, g_none, g_violations;

static moonlet_str tenant_of(int t)
{
    static const char *names[PROBERS] = {"t0", "t1", "t2"};
    return MOONLET_STR(names[t]);
}

static int64_t lease_ms(int t, const char *key)
{
    moonlet_key_view v;
    if (moonlet_master_inspect_key(g_m, tenant_of(t), MOONLET_STR(key), &v, NULL, NULL))
        return -1;
    return (int64_t)v.lease_remaining_ms;
}

/* A key leased by this call at some time in [t0, now] has at least
 * TTL - elapsed left, unless the TTL has run out meanwhile.  `after` must be
 * read before `elapsed_ms` is measured. */
static void check_leased(int64_t after, uint64_t t0)
{
    uint64_t elapsed_ms = (moonlet_clock_now_ns() - t0) / MOONLET_NS_PER_MS;
    if (elapsed_ms + 1 < TTL_MS && (after <= 0 || after + (int64_t)elapsed_ms + 1 < TTL_MS))
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
    for (int call = 0; call < CALLS && moonlet_clock_real_ns() - start < DEADLINE_NS; call++) {
        for (int i = 0; i < NKV; i++)
            kv0[i] = lease_ms(t, g_kv[t][i]);
        for (int i = 0; i < NKDA; i++)
            kda0[i] = lease_ms(t, g_kda[t][i]);
        uint64_t t0 = moonlet_clock_now_ns();
        moonlet_probe_resume_out out;
        assert_int_equal(moonlet_master_probe_resume(g_m, tenant_of(t), kv, NKV, kda, NKDA, RANKS,
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
    while (!atomic_load(&g_stop) && moonlet_clock_real_ns() - start < DEADLINE_NS) {
        int t = rand_r(&seed) % PROBERS;
        /* KV keys are churned less often than KDA keys, but both are */
        bool is_kv = rand_r(&seed) % 3 == 0;
        const char *k = is_kv ? g_kv[t][rand_r(&seed) % NKV] : g_kda[t][rand_r(&seed) % NKDA];
        moonlet_str key = MOONLET_STR(k);
        /* eviction takes the least recently written first: the KV prefix
         * (written first) would be gone at once if passes came often */
        switch (rand_r(&seed) % 128) {
        case 0:
            moonlet_master_evict_now(g_m, 0.01);
            break;
        case 1: case 2: case 3: case 4: case 5: case 6: case 7: case 8: case 9: case 10:
            moonlet_master_remove(g_m, tenant_of(t), key); /* refused while leased */
            break;
        default:
            if (moonlet_master_put_start(g_m, tenant_of(t), key, 64, 1, false, NULL, NULL) == 0)
                moonlet_master_put_end(g_m, tenant_of(t), key, NULL);
            break;
        }
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
    moonlet_clock_set_fake(0); /* real clock: leases expire by themselves */
    moonlet_master_config cfg;
    moonlet_master_config_default(&cfg);
    cfg.background = false;
    cfg.lease_ttl_ms = TTL_MS;
    cfg.shards = 1024;
    cfg.probe_hook = yield_hook;
    assert_int_equal(moonlet_master_create(&cfg, &g_m), MOONLET_OK);
    fix_mount(g_m, "c", "s", 64 << 20);
    for (int c = 0; c < CKPTS; c++)
        g_bounds[c] = (uint64_t)(c + 1) * (NKV / CKPTS);
    for (int t = 0; t < PROBERS; t++) {
        for (int i = 0; i < NKV; i++) {
            snprintf(g_kv[t][i], sizeof(g_kv[t][i]), "kv/%d", i);
            assert_int_equal(fix_put_t(g_m, tenant_of(t).ptr, g_kv[t][i], 64, 1), MOONLET_OK);
        }
        for (int i = 0; i < NKDA; i++) {
            snprintf(g_kda[t][i], sizeof(g_kda[t][i]), "ck%d/r%d", i / RANKS, i % RANKS);
            assert_int_equal(fix_put_t(g_m, tenant_of(t).ptr, g_kda[t][i], 64, 1), MOONLET_OK);
        }
    }
    pthread_t p[PROBERS], c[CHURNERS];
    for (int i = 0; i < CHURNERS; i++)
        pthread_create(&c[i], NULL, churner, (void *)(intptr_t)i);
    for (int i = 0; i < PROBERS; i++)
        pthread_create(&p[i], NULL, prober, (void *)(intptr_t)i);
    for (int i = 0; i < PROBERS; i++)
        pthread_join(p[i], NULL);
    atomic_store(&g_stop, 1);
    for (int i = 0; i < CHURNERS; i++)
        pthread_join(c[i], NULL);

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_resume_under_churn),
    };
    return cmocka_run_group_tests_name("master_probe_resume_stress", tests, NULL, NULL);
}
