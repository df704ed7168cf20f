/* Tests of issue 13's master-side bounds: segment sizes, tenants that failed
 * calls leave behind, puts that can never fit, and eviction for contiguous
 * space instead of a share of the objects. */
#include "../common/master_fixture.h"
#include "../common/test_main.h"

#define MS MOONLET_NS_PER_MS
#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

/* cmocka setup: a master of 16 shards and 1 s leases as the test's state; fix_teardown destroys
 * it. */
static int setup(void **state)
{
    *state = fix_master(16, 1000);
    return 0;
}

static moonlet_master_stats stats(moonlet_master *m)
{
    moonlet_master_stats st = fix_stats(m);
    return st;
}

static bool exists_t(moonlet_master *m, const char *t, const char *k)
{
    bool ex = false;
    assert_int_equal(moonlet_master_probe_key(m, MOONLET_STR(t), MOONLET_STR(k), &ex), MOONLET_OK);
    return ex;
}

/* A size near 2^64 used to wrap the capacity total. */
static void test_segment_size_bound(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c", "s0", MiB);
    moonlet_segment_desc d = {.client_id = "c", .segment_id = "huge", .size = UINT64_MAX - 63,
                              .endpoint = "127.0.0.1:2", .protocol = "tcp"};
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_ERR_INVALID_PARAMS);
    d.size = MOONLET_MAX_SEGMENT_BYTES + 64;
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_ERR_INVALID_PARAMS);
    d.size = MiB;
    d.base = UINT64_MAX - 4096; /* base + size wraps */
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_ERR_INVALID_PARAMS);
    moonlet_master_stats st = stats(m);
    assert_int_equal(st.capacity, MiB);
    assert_int_equal(st.segments, 1);
    /* the limit itself is accepted */
    d.base = 0;
    d.size = MOONLET_MAX_SEGMENT_BYTES;
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_OK);
    assert_int_equal(stats(m).capacity, MiB + MOONLET_MAX_SEGMENT_BYTES);
}

/* 65,536 failed PutStarts under new names used to fill the table for good. */
static void test_failed_puts_create_no_tenant(void **state)
{
    moonlet_master *m = *state;
    char t[32];
    for (int i = 0; i < 65536; i++) {
        snprintf(t, sizeof(t), "t%d", i);
        assert_int_equal(fix_put_t(m, t, "k", 64, 1), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    }
    assert_int_equal(stats(m).tenants, 0);
    fix_mount(m, "c", "s", MiB);
    assert_int_equal(fix_put_t(m, "fresh", "k", 64, 1), MOONLET_OK);
    assert_int_equal(stats(m).tenants, 1);
}

/* A full table gives NO_AVAILABLE_HANDLE; tenants expire with their last
 * object, and a reused slot never shows the old tenant's objects. */
static void test_tenant_bound_and_expiry(void **state)
{
    (void)state;
    moonlet_master_config cfg = fix_config(16);
    cfg.max_tenants = 4;
    moonlet_master *m = fix_master_of(&cfg, FIX_T0);
    fix_mount(m, "c", "s", MiB);
    const char *names[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(fix_put_t(m, names[i], "k", 64, 1), MOONLET_OK);
    assert_int_equal(fix_put_t(m, "e", "k", 64, 1), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    /* existing tenants still work */
    assert_int_equal(fix_put_t(m, "a", "k2", 64, 1), MOONLET_OK);
    assert_int_equal(moonlet_master_remove(m, MOONLET_STR("b"), MOONLET_STR("k")), MOONLET_OK);
    assert_int_equal(stats(m).tenants, 3); /* b expired with its last object */
    assert_int_equal(fix_put_t(m, "e", "k", 64, 1), MOONLET_OK);
    assert_false(exists_t(m, "b", "k"));
    assert_true(exists_t(m, "e", "k"));
    /* b comes back as a new tenant with nothing in it */
    assert_int_equal(moonlet_master_remove(m, MOONLET_STR("c"), MOONLET_STR("k")), MOONLET_OK);
    assert_false(exists_t(m, "b", "k"));
    assert_int_equal(fix_put_t(m, "b", "x", 64, 1), MOONLET_OK);
    assert_false(exists_t(m, "b", "k"));
    assert_false(exists_t(m, "c", "x"));
    assert_int_equal(stats(m).tenants, 4);
    moonlet_master_destroy(m);
}

static void fill(moonlet_master *m, int n, uint64_t size)
{
    char k[16];
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        assert_int_equal(fix_put(m, k, size), MOONLET_OK);
        moonlet_clock_advance(1 * MS); /* ascending seal times: placement order is age order */
    }
}

static void lease_key(moonlet_master *m, int i)
{
    char k[16];
    bool ex;
    snprintf(k, sizeof(k), "k%d", i);
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(""), MOONLET_STR(k), &ex), MOONLET_OK);
    assert_true(ex);
}

/* A put larger than any segment used to evict 5% of the cache per attempt. */
static void test_never_fits_refused(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c", "s", MiB);
    fill(m, 1000, 1 * KiB);
    for (int i = 0; i < 30; i++)
        assert_int_equal(fix_put(m, "big", 2 * MiB), MOONLET_ERR_INVALID_PARAMS);
    moonlet_master_stats st = stats(m);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.objects, 1000);
    /* two replicas of 768 KiB need two segments of that size: one is not enough */
    fix_mount(m, "c", "small", 512 * KiB);
    assert_int_equal(fix_put_t(m, "", "two", 768 * KiB, 2), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(stats(m).evictions, 0);
}

/* Fragmented by age: every other object was read recently, so evicting the
 * oldest 5% used to leave only 64 KiB holes and a 1 MiB put failed again and
 * again.  It must evict one run of 16 adjacent objects and succeed at once. */
static void test_evicts_for_contiguous_space(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c", "s", 16 * MiB);
    fill(m, 256, 64 * KiB);
    assert_int_equal(stats(m).used, 16 * MiB);
    for (int i = 0; i < 256; i += 2)
        lease_key(m, i);
    moonlet_clock_advance(1001 * MS); /* leases expired: every object may go, odd ones are oldest */
    assert_int_equal(fix_put(m, "big", 1 * MiB), MOONLET_OK);
    moonlet_master_stats st = stats(m);
    assert_int_equal(st.evictions, 16);
    assert_int_equal(st.objects, 256 - 16 + 1);
}

/* When no run of the needed size avoids leased objects, nothing is evicted. */
static void test_no_eviction_when_no_run_can_fit(void **state)
{
    (void)state;
    moonlet_master *m = fix_master(16, 5000);
    fix_mount(m, "c", "s", 16 * MiB);
    fill(m, 256, 64 * KiB);
    /* leased: all but k0..k7 (512 KiB) and every third object after them */
    for (int i = 8; i < 256; i++)
        if (i % 3)
            lease_key(m, i);
    for (int a = 0; a < 10; a++)
        assert_int_equal(fix_put(m, "big", 1 * MiB), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    moonlet_master_stats st = stats(m);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.objects, 256);
    /* a 512 KiB put fits in the unleased run and takes exactly that run */
    assert_int_equal(fix_put(m, "half", 512 * KiB), MOONLET_OK);
    assert_int_equal(stats(m).evictions, 8);
    for (int i = 8; i < 256; i++) {
        char k[16];
        snprintf(k, sizeof(k), "k%d", i);
        assert_true(exists_t(m, "", k));
    }
    moonlet_master_destroy(m);
}

/* Soft-pinned objects are taken only when unpinned ones cannot make room. */
static void test_pinned_only_when_needed(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c", "s", 64 * KiB * 8);
    char k[16];
    for (int i = 0; i < 8; i++) {
        snprintf(k, sizeof(k), "p%d", i);
        bool pin = i < 4;
        assert_int_equal(moonlet_master_put_start(m, MOONLET_STR(""), MOONLET_STR(k), 64 * KiB, 1,
                                                  pin, NULL, NULL), MOONLET_OK);
        assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR(k), NULL), MOONLET_OK);
    }
    /* 128 KiB: two adjacent unpinned objects (p4..p7) suffice */
    assert_int_equal(fix_put(m, "x", 128 * KiB), MOONLET_OK);
    for (int i = 0; i < 4; i++) {
        snprintf(k, sizeof(k), "p%d", i);
        assert_true(exists_t(m, "", k));
    }
    assert_int_equal(stats(m).evictions, 2);
    /* 320 KiB: no unpinned run is long enough, so pinned objects go too */
    assert_int_equal(fix_put(m, "y", 320 * KiB), MOONLET_OK);
}

/* Identity: the session that holds an id, a reconnect proving the secret,
 * expiry freeing the id, an id without secret claimable once unbound. */
static void test_client_identity(void **state)
{
    moonlet_master *m = *state;
    moonlet_str id = MOONLET_STR("n1"), a = MOONLET_STR("secret-a"), b = MOONLET_STR("secret-b");
    uint32_t segs;
    assert_int_equal(moonlet_master_bind_client(m, id, a, 1), MOONLET_OK);
    moonlet_segment_desc d = {.client_id = "n1", .segment_id = "s1", .size = MiB,
                              .endpoint = "127.0.0.1:1", .protocol = "tcp"};
    assert_int_equal(moonlet_master_mount_segment_as(m, &d, 1), MOONLET_OK);
    assert_int_equal(moonlet_master_ping_as(m, id, 2, &segs), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(moonlet_master_unmount_segment_as(m, id, MOONLET_STR("s1"), 2),
                     MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(moonlet_master_bind_client(m, id, b, 2), MOONLET_ERR_ILLEGAL_CLIENT);
    /* the node reconnects (session 3) and proves its secret */
    moonlet_master_session_closed(m, 1);
    assert_int_equal(moonlet_master_ping_as(m, id, 3, &segs), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(moonlet_master_bind_client(m, id, a, 3), MOONLET_OK);
    assert_int_equal(moonlet_master_ping_as(m, id, 3, &segs), MOONLET_OK);
    assert_int_equal(segs, 1);
    assert_int_equal(moonlet_master_ping_as(m, id, 1, &segs), MOONLET_ERR_ILLEGAL_CLIENT);
    /* it dies: pings from others do not keep it alive, expiry frees the id */
    moonlet_master_session_closed(m, 3);
    moonlet_clock_advance(5000 * MS);
    assert_int_equal(moonlet_master_ping_as(m, id, 4, &segs), MOONLET_ERR_ILLEGAL_CLIENT);
    moonlet_clock_advance(6000 * MS);
    moonlet_master_tick(m);
    assert_int_equal(stats(m).segments, 0);
    assert_int_equal(moonlet_master_bind_client(m, id, b, 4), MOONLET_OK);
    /* no secret: the id is claimable only once its session closed */
    d.client_id = "legacy";
    d.segment_id = "s2";
    assert_int_equal(moonlet_master_mount_segment_as(m, &d, 5), MOONLET_OK);
    assert_int_equal(moonlet_master_ping_as(m, MOONLET_STR("legacy"), 6, &segs),
                     MOONLET_ERR_ILLEGAL_CLIENT);
    moonlet_master_session_closed(m, 5);
    assert_int_equal(moonlet_master_ping_as(m, MOONLET_STR("legacy"), 6, &segs), MOONLET_OK);
    /* the library's own calls (session 0) are trusted */
    assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR("legacy"), MOONLET_STR("s2")),
                     MOONLET_OK);
}

MOONLET_TEST_MAIN("master_trust", NULL, NULL,
                  FIX_TEST(test_segment_size_bound),
                  FIX_TEST(test_failed_puts_create_no_tenant),
                  cmocka_unit_test(test_tenant_bound_and_expiry),
                  FIX_TEST(test_never_fits_refused),
                  FIX_TEST(test_evicts_for_contiguous_space),
                  cmocka_unit_test(test_no_eviction_when_no_run_can_fit),
                  FIX_TEST(test_pinned_only_when_needed),
                  FIX_TEST(test_client_identity))
