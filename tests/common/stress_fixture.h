/*
 * stress_fixture.h - the frame the master's probe stress tests share: a
 * master on the real clock (leases expire by themselves) with many shards
 * and a probe hook, one tenant per probe thread, the churn step (evict,
 * remove or re-put a key), the lease check a probe thread makes after each
 * call, and running probe threads to completion beside churn threads.
 * Every loop a test builds on it is bounded by STRESS_DEADLINE_NS.
 */
#ifndef MOONLET_TEST_STRESS_FIXTURE_H
#define MOONLET_TEST_STRESS_FIXTURE_H

#include "master_fixture.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define STRESS_DEADLINE_NS (20ull * 1000000000ull)
#define STRESS_MAX_THREADS 8

/* The tenant probe thread t owns (t < 3): only its calls lease its keys. */
static inline moonlet_str stress_tenant(int t)
{
    static const char *names[] = {"t0", "t1", "t2"};
    return MOONLET_STR(names[t]);
}

/* Whether a thread that started at `start` (moonlet_clock_real_ns) may go on. */
static inline bool stress_in_time(uint64_t start)
{
    return moonlet_clock_real_ns() - start < STRESS_DEADLINE_NS;
}

/* A master on the real clock with lease TTL ttl_ms, 1024 shards, `hook` as
 * its probe hook, no background thread, and one 64 MiB segment mounted. */
static inline moonlet_master *stress_master(uint64_t ttl_ms, void (*hook)(void *))
{
    moonlet_master_config cfg = fix_config(1024);
    cfg.lease_ttl_ms = ttl_ms;
    cfg.probe_hook = hook;
    moonlet_master *m = fix_master_of(&cfg, 0);
    fix_mount(m, "c", "s", 64 << 20);
    return m;
}

/* A key leased by a call that started at t0 (moonlet_clock_now_ns) has at
 * least TTL - elapsed left, unless the TTL has run out meanwhile.  `after`
 * (its lease in ms) must be read before this is called.  True: violated. */
static inline bool stress_lease_violated(int64_t after, uint64_t t0, uint64_t ttl_ms)
{
    uint64_t elapsed_ms = (moonlet_clock_now_ns() - t0) / MOONLET_NS_PER_MS;
    return elapsed_ms + 1 < ttl_ms && (after <= 0 || after + (int64_t)elapsed_ms + 1 < (int64_t)ttl_ms);
}

/* One churn step on tenant's key: roll 0 runs an eviction pass, rolls 1 to
 * `removes` remove the key (refused while leased), any other re-puts it. */
static inline void stress_churn_step(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                     unsigned roll, unsigned removes)
{
    if (roll == 0)
        moonlet_master_evict_now(m, 0.01);
    else if (roll <= removes)
        moonlet_master_remove(m, tenant, key);
    else if (moonlet_master_put_start(m, tenant, key, 64, 1, false, NULL, NULL) == 0)
        moonlet_master_put_end(m, tenant, key, NULL);
}

/* Runs `probers` prober threads to completion with `churners` churner
 * threads beside them (each gets its index as argument), then sets *stop
 * and joins the churners. */
static inline void stress_run(void *(*prober)(void *), int probers, void *(*churner)(void *),
                              int churners, _Atomic int *stop)
{
    pthread_t p[STRESS_MAX_THREADS], c[STRESS_MAX_THREADS];
    assert_true(probers <= STRESS_MAX_THREADS && churners <= STRESS_MAX_THREADS);
    for (int i = 0; i < churners; i++)
        assert_int_equal(pthread_create(&c[i], NULL, churner, (void *)(intptr_t)i), 0);
    for (int i = 0; i < probers; i++)
        assert_int_equal(pthread_create(&p[i], NULL, prober, (void *)(intptr_t)i), 0);
    for (int i = 0; i < probers; i++)
        pthread_join(p[i], NULL);
    atomic_store(stop, 1);
    for (int i = 0; i < churners; i++)
        pthread_join(c[i], NULL);
}

#endif
