/*
 * Tests of a promotion's steps on the master (master/ha/ha.c, without etcd) on
 * a frozen clock: a standby's state, fed the leader's records, is restored
 * only when etcd named it in sync and its follower was consistent; a
 * master promoted with state holds liveness long enough for a restored
 * node that pings once the new leader serves (one etcd lease TTL after the
 * promotion) and after its longest retry backoff, so its objects stay
 * readable (the bug of 71a2958: a hold of TTL + liveness TTL unmounted that
 * node as dead); a node that never pings is unmounted once the hold ends.
 */
#include "../common/test_main.h"
#include "../common/master_fixture.h"
#include "election.h"
#include "ha.h"
#include "monotime.h"
#include "node_timing.h"
#include "replicate.h"
#include "store_node.h"

#define MS MOONLET_NS_PER_MS
#define TTL_S 2u       /* the etcd lease TTL: serving begins this long after the promotion */
#define LIVE_MS 3000u  /* the masters' liveness TTL */
#define TICK_MS 100u   /* the background thread's period, as the test plays it */
#define NKEYS 16

static moonlet_master *master_of(moonlet_repl_state *st)
{
    moonlet_master_config cfg = fix_config(16);
    cfg.lease_ttl_ms = 5000;
    cfg.client_live_ttl_ms = LIVE_MS;
    cfg.repl_emit = st ? fix_repl_apply : NULL; /* the leader's stream, to a standby's state */
    cfg.repl_arg = st;
    moonlet_master *m = NULL;
    assert_int_equal(moonlet_master_create(&cfg, &m), MOONLET_OK);
    return m;
}

/* A leader with node n0's segment and NKEYS sealed objects, streamed to a
 * standby's state (returned); the leader is gone (destroyed). */
static moonlet_repl_state *standby_state(void)
{
    moonlet_clock_set_fake(FIX_T0);
    moonlet_repl_state *st = NULL;
    assert_int_equal(moonlet_repl_state_create(&st), MOONLET_OK);
    moonlet_master *a = master_of(st);
    fix_mount(a, "n0", "s0", 1 << 20);
    char key[32];
    for (int i = 0; i < NKEYS; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        assert_int_equal(fix_put(a, key, 4096), MOONLET_OK);
    }
    moonlet_master_destroy(a);
    moonlet_clock_advance(500 * MS); /* the leader died; the standby wins later */
    return st;
}

/* The promoted master: the state restored at the current (frozen) time. */
static moonlet_master *promoted(const moonlet_repl_state *st)
{
    moonlet_master *b = master_of(NULL);
    moonlet_ha_promotion p = {.epoch = 7, .followed = 6, .named = true, .consistent = true,
                              .liveness_hold_ms = moonlet_ha_liveness_hold_ms(TTL_S, LIVE_MS)};
    uint64_t restored = 0;
    assert_true(moonlet_ha_promote(b, st, &p, &restored));
    assert_int_equal(restored, NKEYS);
    return b;
}

static int readable(moonlet_master *m)
{
    char key[32];
    int n = 0;
    for (int i = 0; i < NKEYS; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        n += moonlet_master_get_replica_list(m, MOONLET_STR(""), MOONLET_STR(key), NULL, NULL,
                                             NULL, NULL) == MOONLET_OK;
    }
    return n;
}

/* Ticks the master every TICK_MS of frozen time from `from_ms` (after the
 * promotion) up to and including `to_ms`; returns the time reached. */
static uint64_t tick_until(moonlet_master *m, uint64_t from_ms, uint64_t to_ms)
{
    uint64_t t = from_ms;
    for (int i = 0; i < 100000 && t + TICK_MS <= to_ms; i++) {
        moonlet_clock_advance(TICK_MS * MS);
        t += TICK_MS;
        moonlet_master_tick(m);
    }
    return t;
}

/* The longest a store node sleeps between two retries, as its code does it. */
static uint64_t node_longest_backoff_ms(void)
{
    uint32_t longest = 0;
    for (unsigned f = 1; f <= 64; f++) {
        uint32_t ms = moonlet_store_node_backoff_ms(f);
        longest = ms > longest ? ms : longest;
    }
    return longest;
}

/* The hold covers the grace, the node's longest backoff (its code's, not
 * only the constant), then one liveness TTL; 0 is the default TTL. */
static void test_hold_covers_node_backoff(void **state)
{
    (void)state;
    uint64_t hold = moonlet_ha_liveness_hold_ms(TTL_S, LIVE_MS);
    assert_true(hold >= TTL_S * 1000ull + node_longest_backoff_ms() + LIVE_MS);
    assert_int_equal(node_longest_backoff_ms(), MOONLET_NODE_BACKOFF_CAP_MS);
    assert_int_equal(moonlet_ha_liveness_hold_ms(0, LIVE_MS),
                     moonlet_ha_liveness_hold_ms(MOONLET_ELECTION_DEFAULT_TTL_S, LIVE_MS));
}

/* A restored node asleep in its longest backoff when the new leader begins
 * serving pings after lease TTL + liveness TTL, within the backoff cap: it
 * is not unmounted, and every acknowledged object stays readable. */
static void test_late_ping_in_backoff_kept(void **state)
{
    (void)state;
    moonlet_repl_state *st = standby_state();
    moonlet_master *b = promoted(st);
    /* Its calls failed through the grace; it slept its longest backoff,
     * and pings halfway through the cap past TTL + liveness TTL. */
    uint64_t ping_at = TTL_S * 1000ull + LIVE_MS + node_longest_backoff_ms() / 2;
    uint64_t t = tick_until(b, 0, ping_at);
    assert_int_equal(t, ping_at);
    assert_int_equal(fix_stats(b).segments, 1);
    uint32_t segs = 0;
    assert_int_equal(moonlet_master_ping(b, MOONLET_STR("n0"), &segs), MOONLET_OK);
    assert_int_equal(segs, 1); /* still mounted: the node need not mount again */
    /* Pinging on, it stays: one liveness TTL after the ping, less a tick. */
    tick_until(b, t, t + LIVE_MS - TICK_MS);
    moonlet_master_stats s = fix_stats(b);
    assert_int_equal(s.segments, 1);
    assert_int_equal(s.objects, NKEYS);
    assert_int_equal(s.unmounts_by_liveness, 0);
    assert_int_equal(readable(b), NKEYS);
    moonlet_master_destroy(b);
    moonlet_repl_state_destroy(st);
}

/* A restored node that never pings is held until the hold ends, then
 * unmounted as dead with its objects. */
static void test_silent_node_unmounted_after_hold(void **state)
{
    (void)state;
    moonlet_repl_state *st = standby_state();
    moonlet_master *b = promoted(st);
    uint64_t hold = moonlet_ha_liveness_hold_ms(TTL_S, LIVE_MS);
    uint64_t t = tick_until(b, 0, hold - TICK_MS);
    assert_int_equal(fix_stats(b).segments, 1);
    assert_int_equal(readable(b), NKEYS);
    /* Past the hold: gone within a few ticks (the unmount strips in steps). */
    for (int i = 0; i < 50 && fix_stats(b).segments; i++)
        t = tick_until(b, t, t + TICK_MS);
    moonlet_master_stats s = fix_stats(b);
    assert_int_equal(s.segments, 0);
    assert_int_equal(s.objects, 0);
    assert_int_equal(s.unmounts_by_liveness, 1);
    assert_int_equal(readable(b), 0);
    assert_int_equal(moonlet_master_get_replica_list(b, MOONLET_STR(""), MOONLET_STR("k0"), NULL,
                                                     NULL, NULL, NULL),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    moonlet_master_destroy(b);
    moonlet_repl_state_destroy(st);
}

/* Without etcd naming this standby in sync, or with a follower that was not
 * consistent, or with no state, the new leader starts empty. */
static void test_promoted_empty_unless_named_and_consistent(void **state)
{
    (void)state;
    moonlet_repl_state *st = standby_state();
    const struct {
        bool named, consistent, with_state;
    } cases[] = {{false, true, true}, {true, false, true}, {false, false, true}, {true, true, false}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        moonlet_master *b = master_of(NULL);
        moonlet_ha_promotion p = {.epoch = 7, .followed = 6, .named = cases[i].named,
                                  .consistent = cases[i].consistent,
                                  .liveness_hold_ms = moonlet_ha_liveness_hold_ms(TTL_S, LIVE_MS)};
        uint64_t restored = 99;
        assert_false(moonlet_ha_promote(b, cases[i].with_state ? st : NULL, &p, &restored));
        assert_int_equal(restored, 0);
        moonlet_master_stats s = fix_stats(b);
        assert_int_equal(s.segments, 0);
        assert_int_equal(s.objects, 0);
        assert_int_equal(readable(b), 0);
        moonlet_master_destroy(b);
    }
    moonlet_repl_state_destroy(st);
}

MOONLET_TEST_MAIN("master_ha_promote", NULL, NULL,
                  cmocka_unit_test(test_hold_covers_node_backoff),
                  cmocka_unit_test(test_late_ping_in_backoff_kept),
                  cmocka_unit_test(test_silent_node_unmounted_after_hold),
                  cmocka_unit_test(test_promoted_empty_unless_named_and_consistent))
