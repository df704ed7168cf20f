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
#include "../common/master_fixture.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define PROBERS 3
#define CHURNERS 2
#define CKPTS 24
#define RANKS 4
#define NKEYS (CKPTS * RANKS)
#define CALLS 400
#define TTL_MS 200
#define DEADLINE_NS (20ull * 1000000000ull)

static moonlet_master *g_m;
static char g_keys[PROBERS][NKEYS][32];
static _Atomic int g_stop;
static _Atomic uint64_t g_selected, g_none, g_violations;

static moonlet_str tenant_of(int t)
{
    static const char *names[PROBERS] = {"t0", "t1", "t2"};
    return MOONLET_STR(names[t]);
}

/* Lease deadline in ns remaining via inspect (-1 missing). */
static int64_t lease_ms(int t, const char *key)
{
    moonlet_key_view v;
    if (moonlet_master_inspect_key(g_m, tenant_of(t), MOONLET_STR(key), &v, NULL, NULL))
        return -1;
    return (int64_t)v.lease_remaining_ms;
}

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
    for (int call = 0; call < CALLS && moonlet_clock_real_ns() - start < DEADLINE_NS; call++) {
        for (int i = 0; i < NKEYS; i++)
            before[i] = lease_ms(t, g_keys[t][i]);
        uint64_t t0 = moonlet_clock_now_ns();
        assert_int_equal(moonlet_master_batch_probe_key(g_m, tenant_of(t), &p, keys, NKEYS, r), MOONLET_OK);
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
            int64_t after = lease_ms(t, g_keys[t][i]);
            uint64_t elapsed_ms = (moonlet_clock_now_ns() - t0) / MOONLET_NS_PER_MS;
            if (r[i] == 1) {
                /* Leased by this call at some time in [t0, now]: at least
                 * TTL - elapsed must remain, unless the TTL has run out. */
                if (elapsed_ms + 1 < TTL_MS && (after <= 0 || after + (int64_t)elapsed_ms + 1 < TTL_MS))
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
    while (!atomic_load(&g_stop) && moonlet_clock_real_ns() - start < DEADLINE_NS) {
        int t = rand_r(&seed) % PROBERS, i = rand_r(&seed) % NKEYS;
        moonlet_str key = MOONLET_STR(g_keys[t][i]);
        switch (rand_r(&seed) % 16) {
        case 0:
            moonlet_master_evict_now(g_m, 0.01);
            break;
        case 1: case 2: case 3:
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
    moonlet_clock_set_fake(0); /* real clock: leases expire by themselves */
    moonlet_master_config cfg;
    moonlet_master_config_default(&cfg);
    cfg.background = false;
    cfg.lease_ttl_ms = TTL_MS;
    cfg.shards = 1024;
    cfg.probe_hook = yield_hook;
    assert_int_equal(moonlet_master_create(&cfg, &g_m), MOONLET_OK);
    fix_mount(g_m, "c", "s", 64 << 20);
    for (int t = 0; t < PROBERS; t++)
        for (int i = 0; i < NKEYS; i++) {
            snprintf(g_keys[t][i], 32, "ck%d/r%d", i / RANKS, i % RANKS);
            assert_int_equal(fix_put_t(g_m, tenant_of(t).ptr, g_keys[t][i], 64, 1), MOONLET_OK);
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
    print_message("probe stress: %llu selected, %llu none, %llu fallbacks, %llu evictions\n",
                  (unsigned long long)g_selected, (unsigned long long)g_none,
                  (unsigned long long)st.probe_recheck_fallbacks,
                  (unsigned long long)st.evictions);
    assert_int_equal(atomic_load(&g_violations), 0);
    assert_true(g_selected > 0);
    assert_true(st.evictions > 0);
    moonlet_master_destroy(g_m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_under_churn),
    };
    return cmocka_run_group_tests_name("master_probe_stress", tests, NULL, NULL);
}
