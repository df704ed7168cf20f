/* Tests of master/store/evict.c: leased objects survive, earliest deadline first,
 * soft pins only in the second round, watermark and allocation-driven passes. */
#include "../common/master_fixture.h"
#include "../common/test_main.h"

#define MS MOONLET_NS_PER_MS

static bool exists(moonlet_master *m, const char *k)
{
    bool ex = false;
    assert_int_equal(moonlet_master_probe_key(m, MOONLET_STR(""), MOONLET_STR(k), &ex), MOONLET_OK);
    return ex;
}

static void lease(moonlet_master *m, const char *k)
{
    bool ex;
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(""), MOONLET_STR(k), &ex), MOONLET_OK);
    assert_true(ex);
}

/* Key <prefix><i>, written into k (16 bytes), which it returns. */
static const char *nth(char k[16], const char *prefix, int i)
{
    snprintf(k, 16, "%s%d", prefix, i);
    return k;
}

/* cmocka setup: a master of 16 shards and 1 s leases with a 1 MiB segment
 * as the test's state; fix_teardown destroys it. */
static int setup(void **state)
{
    *state = fix_master_mounted(16, 1000, "c", "s", 1 << 20);
    return 0;
}

static void test_leased_survive(void **state)
{
    (void)state;
    moonlet_master *m = fix_master_mounted(16, 5000, "c", "s", 1 << 20);
    char k[16];
    for (int i = 0; i < 40; i++) {
        assert_int_equal(fix_put(m, nth(k, "k", i), 64), MOONLET_OK);
        if (i % 2 == 0)
            lease(m, k);
    }
    /* ask for all of them: only the 20 unleased may go */
    assert_int_equal(moonlet_master_evict_now(m, 1.0), 20);
    for (int i = 0; i < 40; i++)
        assert_int_equal(exists(m, nth(k, "k", i)), i % 2 == 0);
    /* once the leases expire they can be evicted too */
    moonlet_clock_advance(5001 * MS);
    assert_int_equal(moonlet_master_evict_now(m, 1.0), 20);
    moonlet_master_destroy(m);
}

static void test_earliest_deadline_first(void **state)
{
    moonlet_master *m = *state;
    char k[16];
    /* k0 leased first ... k9 last; all expired by the end */
    for (int i = 0; i < 10; i++) {
        assert_int_equal(fix_put(m, nth(k, "k", i), 64), MOONLET_OK);
        lease(m, k);
        moonlet_clock_advance(100 * MS);
    }
    moonlet_clock_advance(2000 * MS);
    assert_int_equal(moonlet_master_evict_now(m, 0.3), 3);
    for (int i = 0; i < 10; i++)
        assert_int_equal(exists(m, nth(k, "k", i)), i >= 3);
    /* a fresh put ranks by its seal time: after every object whose lease
     * expired before it was written (least recently used goes first) */
    assert_int_equal(fix_put(m, "fresh", 64), MOONLET_OK);
    moonlet_clock_advance(10 * MS);
    assert_int_equal(moonlet_master_evict_now(m, 0.01), 1);
    assert_true(exists(m, "fresh"));
    assert_false(exists(m, "k3"));
    /* and before an object read after it was written */
    moonlet_clock_advance(10 * MS);
    assert_int_equal(fix_put(m, "fresh2", 64), MOONLET_OK);
    lease(m, "k9");
    moonlet_clock_advance(5000 * MS);
    for (int i = 4; i < 9; i++)
        assert_int_equal(moonlet_master_remove(m, MOONLET_STR(""), MOONLET_STR(nth(k, "k", i))),
                         MOONLET_OK);
    /* left: fresh (sealed first), fresh2, k9 (read last) */
    assert_int_equal(moonlet_master_evict_now(m, 0.3), 1);
    assert_false(exists(m, "fresh"));
    assert_int_equal(moonlet_master_evict_now(m, 0.5), 1);
    assert_false(exists(m, "fresh2"));
    assert_true(exists(m, "k9"));
}

static void test_soft_pin_second_round(void **state)
{
    moonlet_master *m = *state;
    char k[16];
    for (int i = 0; i < 10; i++) {
        nth(k, "p", i);
        assert_int_equal(moonlet_master_put_start(m, MOONLET_STR(""), MOONLET_STR(k), 64, 1, true, NULL, NULL), MOONLET_OK);
        assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR(k), NULL), MOONLET_OK);
        assert_int_equal(fix_put(m, nth(k, "u", i), 64), MOONLET_OK);
    }
    moonlet_key_view v;
    assert_int_equal(moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR("p0"), &v, NULL, NULL), MOONLET_OK);
    assert_true(v.soft_pin_remaining_ms > 0);
    /* 10 of 20: the unpinned ones go first */
    assert_int_equal(moonlet_master_evict_now(m, 0.5), 10);
    for (int i = 0; i < 10; i++) {
        assert_true(exists(m, nth(k, "p", i)));
        assert_false(exists(m, nth(k, "u", i)));
    }
    /* only pinned objects left: the second round takes them */
    assert_int_equal(moonlet_master_evict_now(m, 0.5), 5);
}

/* Asking for more replicas than there are segments must not evict anything. */
static void test_no_eviction_for_missing_segments(void **state)
{
    (void)state;
    moonlet_master *m = fix_master(16, 1000);
    fix_mount(m, "c", "s", 64 * 10);
    fix_put_range(m, "k", 0, 10, 64, 1);
    assert_int_equal(fix_put_t(m, "", "two", 64, 2), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.objects, 10);
    /* a full segment with enough segments does evict to make room */
    assert_int_equal(fix_put(m, "more", 64), MOONLET_OK);
    st = fix_stats(m);
    assert_true(st.evictions >= 1);
    moonlet_master_destroy(m);
}

static void test_watermark_and_put_pressure(void **state)
{
    (void)state;
    moonlet_master *m = fix_master(16, 1000);
    fix_mount(m, "c", "s", 64 * 100);
    fix_put_range(m, "k", 0, 89, 64, 1);
    moonlet_master_tick(m); /* 89% < 90%: nothing happens */
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(fix_put(m, "k89", 64), MOONLET_OK);
    moonlet_master_tick(m); /* 90%: evict 5% of 90 objects */
    st = fix_stats(m);
    assert_int_equal(st.evictions, 5);
    assert_int_equal(st.objects, 85);
    /* fill up completely, then one more put makes room by evicting */
    fix_put_range(m, "k", 90, 105, 64, 1);
    st = fix_stats(m);
    assert_int_equal(st.used, st.capacity);
    /* lease everything: nothing can be evicted, the put fails cleanly */
    const char *ks[200];
    char names[200][16];
    size_t n = 0;
    for (int i = 0; i < 200; i++)
        ks[n++] = nth(names[i], "k", i);
    moonlet_str *s = fix_strs(ks, n);
    int32_t r[200];
    assert_int_equal(moonlet_master_batch_exist_key(m, MOONLET_STR(""), s, n, r), MOONLET_OK);
    free(s);
    assert_int_equal(fix_put(m, "more", 64), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    moonlet_clock_advance(1001 * MS);
    assert_int_equal(fix_put(m, "more", 64), MOONLET_OK);
    moonlet_master_destroy(m);
}

MOONLET_TEST_MAIN("master_evict", NULL, NULL,
                  cmocka_unit_test(test_leased_survive),
                  FIX_TEST(test_earliest_deadline_first),
                  FIX_TEST(test_soft_pin_second_round),
                  cmocka_unit_test(test_watermark_and_put_pressure),
                  cmocka_unit_test(test_no_eviction_for_missing_segments))
