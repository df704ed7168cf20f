/*
 * Tests of the master's object lifecycle, leases, tenant isolation, segment
 * unmount and client liveness (master/store/object.c, segment.c), on a frozen clock.
 */
#include "../common/master_fixture.h"
#include "alloc.h"
#include "writecap.h"

#include <stdlib.h>
#include "../common/test_main.h"

#define MS MOONLET_NS_PER_MS

/* cmocka setup: a master of 16 shards and 5 s leases with segment s1 (1 MiB) of c1 as the
 * test's state; fix_teardown destroys it. */
static int setup(void **state)
{
    *state = fix_master_mounted(16, 5000, "c1", "s1", 1 << 20);
    return 0;
}

static void test_lifecycle(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c2", "s2", 1 << 20);
    moonlet_str t = MOONLET_STR(""), k = MOONLET_STR("obj");
    struct fix_reps c = {0};
    assert_int_equal(moonlet_master_put_start(m, t, k, 1000, 2, false, fix_reps_visit, &c), MOONLET_OK);
    assert_int_equal(c.n, 2);
    assert_string_not_equal(c.segs[0], c.segs[1]); /* distinct segments */
    assert_int_equal(c.status[0], MOONLET_REPLICA_INITIALIZED);

    bool ex = true;
    assert_int_equal(moonlet_master_exist_key(m, t, k, &ex), MOONLET_OK);
    assert_false(ex); /* not readable before PutEnd */
    assert_int_equal(moonlet_master_get_replica_list(m, t, k, NULL, NULL, NULL, NULL),
                     MOONLET_ERR_REPLICA_IS_NOT_READY);
    assert_int_equal(moonlet_master_put_start(m, t, k, 10, 1, false, NULL, NULL),
                     MOONLET_ERR_OBJECT_ALREADY_EXISTS);
    assert_int_equal(moonlet_master_remove(m, t, k), MOONLET_ERR_REPLICA_IS_NOT_READY);

    assert_int_equal(moonlet_master_put_end(m, t, k, NULL), MOONLET_OK);
    assert_int_equal(moonlet_master_put_end(m, t, k, NULL), MOONLET_ERR_INVALID_WRITE);
    assert_int_equal(moonlet_master_put_revoke(m, t, k), MOONLET_ERR_INVALID_WRITE);
    assert_int_equal(moonlet_master_put_start(m, t, k, 10, 1, false, NULL, NULL),
                     MOONLET_ERR_OBJECT_ALREADY_EXISTS);

    struct fix_reps g = {0};
    uint64_t size = 0, ttl = 0;
    assert_int_equal(moonlet_master_get_replica_list(m, t, k, &size, &ttl, fix_reps_visit, &g), MOONLET_OK);
    assert_int_equal(size, 1000);
    assert_int_equal(ttl, 5000);
    assert_int_equal(g.n, 2);
    assert_int_equal(g.status[0], MOONLET_REPLICA_COMPLETE);

    /* leased by the get: remove refused until the lease expires */
    assert_int_equal(moonlet_master_remove(m, t, k), MOONLET_ERR_OBJECT_HAS_LEASE);
    moonlet_clock_advance(5001 * MS);
    assert_int_equal(moonlet_master_remove(m, t, k), MOONLET_OK);
    assert_int_equal(moonlet_master_remove(m, t, k), MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(moonlet_master_get_replica_list(m, t, k, NULL, NULL, NULL, NULL),
                     MOONLET_ERR_OBJECT_NOT_FOUND);

    /* revoke frees the space, after the quarantine (test_quarantine) */
    assert_int_equal(moonlet_master_put_start(m, t, k, 4096, 1, false, NULL, NULL), MOONLET_OK);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.used, 4096);
    assert_int_equal(moonlet_master_put_revoke(m, t, k), MOONLET_OK);
    st = fix_stats(m);
    assert_int_equal(st.objects, 0);
    assert_int_equal(st.quarantined, 4096);
    moonlet_clock_advance((60000 + 2000) * MS);
    moonlet_master_tick(m);
    st = fix_stats(m);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.quarantined, 0);
}

/* Ranges freed from unfinished puts (revoke, reaper) are not handed out again
 * before put deadline + grace; sealed objects' ranges are at once. */
static void test_quarantine(void **state)
{
    (void)state;
    moonlet_master_config cfg = fix_config(16);
    cfg.put_timeout_ms = 1000;
    cfg.put_quarantine_grace_ms = 500;
    moonlet_master *m = fix_master_of(&cfg, FIX_T0);
    fix_mount(m, "c1", "s1", 4096); /* room for exactly one 4096-byte object */
    moonlet_str t = MOONLET_STR("");
    moonlet_master_stats st;

    /* revoked at once: the range waits until the put deadline (1000) + grace (500) */
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("a"), 4096, 1, false, NULL, NULL),
                     MOONLET_OK);
    assert_int_equal(moonlet_master_put_revoke(m, t, MOONLET_STR("a")), MOONLET_OK);
    st = fix_stats(m);
    assert_int_equal(st.used, 4096); /* quarantined bytes are not allocatable */
    assert_int_equal(st.quarantined, 4096);
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("b"), 64, 1, false, NULL, NULL),
                     MOONLET_ERR_NO_AVAILABLE_HANDLE);
    assert_int_equal(moonlet_master_evict_now(m, 1.0), 0); /* eviction cannot take it either */
    moonlet_clock_advance(1499 * MS);
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("b"), 64, 1, false, NULL, NULL),
                     MOONLET_ERR_NO_AVAILABLE_HANDLE);
    moonlet_clock_advance(1 * MS); /* deadline + grace: released lazily by placement */
    struct fix_reps o = {0};
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("b"), 4096, 1, false,
                                              fix_reps_visit, &o), MOONLET_OK);
    assert_int_equal(o.off[0], 0);
    st = fix_stats(m);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.used, 4096);

    /* reaped: the same, counted from the put's own deadline */
    moonlet_master_tick(m); /* not yet due */
    st = fix_stats(m);
    assert_int_equal(st.put_timeouts, 0);
    moonlet_clock_advance(1001 * MS);
    moonlet_master_tick(m); /* reaps "b": deadline was 1000 ms after its PutStart */
    st = fix_stats(m);
    assert_int_equal(st.put_timeouts, 1);
    assert_int_equal(st.quarantined, 4096);
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("c"), 64, 1, false, NULL, NULL),
                     MOONLET_ERR_NO_AVAILABLE_HANDLE);
    moonlet_clock_advance(499 * MS); /* 1000 + 500 after b's PutStart */
    moonlet_master_tick(m);          /* the background sweep releases it */
    st = fix_stats(m);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.used, 0);

    /* a sealed object's range is reusable at once */
    assert_int_equal(fix_put(m, "d", 4096), MOONLET_OK);
    assert_int_equal(moonlet_master_remove(m, t, MOONLET_STR("d")), MOONLET_OK);
    st = fix_stats(m);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(fix_put(m, "e", 4096), MOONLET_OK);

    /* unmount drops the quarantine with the segment */
    assert_int_equal(moonlet_master_remove(m, t, MOONLET_STR("e")), MOONLET_OK);
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("f"), 64, 1, false, NULL, NULL),
                     MOONLET_OK);
    assert_int_equal(moonlet_master_put_revoke(m, t, MOONLET_STR("f")), MOONLET_OK);
    assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR("c1"), MOONLET_STR("s1")),
                     MOONLET_OK);
    st = fix_stats(m);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.capacity, 0);
    moonlet_master_destroy(m);
}

/* PutStart's capabilities: expiry = put deadline on the node's clock (via the
 * offset bound the mount measured), tag under the segment's key; none for a
 * segment mounted without a key. */
static void test_write_capabilities(void **state)
{
    (void)state;
    moonlet_master *m = fix_master(16, 5000); /* put timeout 60000 */
    fix_mount(m, "c0", "plain", 1 << 20);
    uint8_t key[16];
    for (int i = 0; i < 16; i++)
        key[i] = (uint8_t)(i * 7 + 1);
    /* The node's clock reads 5000 ms more than the master's frozen one when it
     * mounts (1000 s): offset bound +5000 ms. */
    uint64_t master_ms = FIX_T0 / MS;
    moonlet_segment_desc d = {.client_id = "c1", .segment_id = "0123456789abcdef", .name = "k",
                              .size = 1 << 20, .endpoint = "127.0.0.1:2", .protocol = "tcp",
                              .write_key = key, .node_clock_ms = master_ms + 5000};
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_OK);
    d.segment_id = "k2";
    d.node_clock_ms = 0; /* a key without the node's clock */
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_ERR_INVALID_PARAMS);

    moonlet_clock_advance(10 * MS);
    struct fix_reps o = {0};
    assert_int_equal(moonlet_master_put_start(m, MOONLET_STR(""), MOONLET_STR("x"), 100, 2, false,
                                              fix_reps_visit, &o), MOONLET_OK);
    assert_int_equal(o.n, 2);
    int keyed = o.has_cap[0] ? 0 : 1;
    assert_true(o.has_cap[keyed]);
    assert_false(o.has_cap[1 - keyed]);
    assert_int_equal(o.ttl[0], 60000);
    assert_int_equal(o.cap_len[keyed], 128); /* the allocated (rounded) range */
    assert_int_equal(o.cap_expiry[keyed], master_ms + 10 + 60000 + 5000);
    moonlet_writecap cap = {.offset = o.off[keyed], .len = o.cap_len[keyed],
                            .expiry_ms = o.cap_expiry[keyed], .tag = o.cap_tag[keyed]};
    assert_true(moonlet_writecap_valid(key, "0123456789abcdef", &cap, o.off[keyed], 100,
                                       master_ms + 5000));

    /* A Ping showing a node clock that lags (the message took 2 s, or the
     * clock moved) lowers the bound: capabilities expire earlier. */
    moonlet_master_note_node_clock(m, MOONLET_STR("c1"), master_ms + 10 + 3000);
    o = (struct fix_reps){0};
    assert_int_equal(moonlet_master_put_start(m, MOONLET_STR(""), MOONLET_STR("y"), 100, 2, false,
                                              fix_reps_visit, &o), MOONLET_OK);
    keyed = o.has_cap[0] ? 0 : 1;
    assert_int_equal(o.cap_expiry[keyed], master_ms + 10 + 60000 + 3000);
    moonlet_master_destroy(m);
}

/* Mooncake's force: a leased object goes, a put in progress does not. */
static void test_force_remove(void **state)
{
    moonlet_master *m = *state;
    moonlet_str t = MOONLET_STR("");
    assert_int_equal(fix_put(m, "leased", 100), MOONLET_OK);
    assert_int_equal(fix_put(m, "leased2", 100), MOONLET_OK);
    assert_int_equal(fix_put(m, "free", 100), MOONLET_OK);
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("pending"), 100, 1, false, NULL,
                                              NULL), MOONLET_OK);
    bool ex = false;
    assert_int_equal(moonlet_master_exist_key(m, t, MOONLET_STR("leased"), &ex), MOONLET_OK);
    assert_int_equal(moonlet_master_exist_key(m, t, MOONLET_STR("leased2"), &ex), MOONLET_OK);
    assert_true(ex);
    assert_int_equal(moonlet_master_remove_ex(m, t, MOONLET_STR("leased"), false),
                     MOONLET_ERR_OBJECT_HAS_LEASE);
    assert_int_equal(moonlet_master_remove_ex(m, t, MOONLET_STR("leased"), true), MOONLET_OK);
    assert_int_equal(moonlet_master_remove_ex(m, t, MOONLET_STR("leased"), true),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(moonlet_master_remove_ex(m, t, MOONLET_STR("pending"), true),
                     MOONLET_ERR_REPLICA_IS_NOT_READY);
    uint64_t n = 0;
    assert_int_equal(moonlet_master_remove_all_ex(m, t, false, &n), MOONLET_OK);
    assert_int_equal(n, 1); /* free */
    assert_int_equal(moonlet_master_remove_all_ex(m, t, true, &n), MOONLET_OK);
    assert_int_equal(n, 1); /* leased2; pending stays */
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.objects, 1);
    /* the two leased objects' ranges wait until their leases end (a reader
     * may still be reading them); the pending put's space stays allocated */
    assert_int_equal(st.quarantined, 2 * moonlet_alloc_rounded(100));
    assert_int_equal(st.used, 3 * moonlet_alloc_rounded(100));
    moonlet_clock_advance(5000 * MS); /* the lease TTL: both leases have ended */
    moonlet_master_tick(m);
    st = fix_stats(m);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.used, moonlet_alloc_rounded(100)); /* the pending put's space */
}

static void test_bad_input(void **state)
{
    moonlet_master *m = *state;
    moonlet_str t = MOONLET_STR("");
    char big[MOONLET_MAX_KEY_BYTES + 2];
    memset(big, 'k', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR(""), 1, 1, false, NULL, NULL),
                     MOONLET_ERR_INVALID_KEY);
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR(big), 1, 1, false, NULL, NULL),
                     MOONLET_ERR_INVALID_KEY);
    big[MOONLET_MAX_KEY_BYTES] = 0; /* exactly the limit is fine */
    assert_int_equal(fix_put(m, big, 1), MOONLET_OK);
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("a"), 1, 0, false, NULL, NULL),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("a"), 1, 2, false, NULL, NULL),
                     MOONLET_ERR_NO_AVAILABLE_HANDLE); /* one segment cannot hold 2 replicas */
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("a"), 2 << 20, 1, false, NULL, NULL),
                     MOONLET_ERR_INVALID_PARAMS); /* larger than every segment: can never fit */
    moonlet_segment_desc d = {.client_id = "c1", .segment_id = "s1", .size = 1 << 20,
                              .endpoint = "e", .protocol = "tcp"};
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_ERR_SEGMENT_ALREADY_EXISTS);
    d.segment_id = "";
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_ERR_INVALID_PARAMS);
    d.segment_id = "s9";
    d.size = 0;
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR("c1"), MOONLET_STR("nope")),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);
    assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR("c2"), MOONLET_STR("s1")),
                     MOONLET_ERR_ILLEGAL_CLIENT);
    /* size 0 objects are valid */
    assert_int_equal(fix_put(m, "empty", 0), MOONLET_OK);
}

static void test_lease_deadlines(void **state)
{
    (void)state;
    moonlet_master *m = fix_master(16, 5000);
    fix_mount(m, "c1", "s1", 1 << 20);
    assert_int_equal(fix_put(m, "a", 10), MOONLET_OK);
    assert_int_equal(fix_lease(m, "a"), 0); /* no lease after put */
    bool ex;
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(""), MOONLET_STR("a"), &ex), MOONLET_OK);
    assert_true(ex);
    assert_int_equal(fix_lease(m, "a"), 5000); /* granted */
    moonlet_clock_advance(2000 * MS);
    assert_int_equal(fix_lease(m, "a"), 3000);
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(""), MOONLET_STR("a"), &ex), MOONLET_OK);
    assert_int_equal(fix_lease(m, "a"), 5000); /* extended to now + ttl */
    /* probe never touches the lease */
    moonlet_clock_advance(1000 * MS);
    assert_int_equal(moonlet_master_probe_key(m, MOONLET_STR(""), MOONLET_STR("a"), &ex), MOONLET_OK);
    assert_true(ex);
    assert_int_equal(fix_lease(m, "a"), 4000);
    moonlet_master_destroy(m);

}

static void test_batch_exist(void **state)
{
    (void)state;
    moonlet_master *m = fix_master(64, 5000);
    fix_mount(m, "c1", "s1", 1 << 20);
    assert_int_equal(fix_put(m, "a", 10), MOONLET_OK);
    assert_int_equal(fix_put(m, "c", 10), MOONLET_OK);
    assert_int_equal(moonlet_master_put_start(m, MOONLET_STR(""), MOONLET_STR("pending"), 1, 1, false, NULL, NULL), MOONLET_OK);
    const char *keys[] = {"a", "b", "c", "", "pending"};
    moonlet_str *ks = fix_strs(keys, 5);
    int32_t r[5];
    assert_int_equal(moonlet_master_batch_exist_key(m, MOONLET_STR(""), ks, 5, r), MOONLET_OK);
    assert_int_equal(r[0], 1);
    assert_int_equal(r[1], 0);
    assert_int_equal(r[2], 1);
    assert_int_equal(r[3], MOONLET_ERR_INVALID_KEY);
    assert_int_equal(r[4], 0);
    assert_int_equal(fix_lease(m, "a"), 5000);
    assert_int_equal(fix_lease(m, "c"), 5000);
    free(ks);
    moonlet_master_destroy(m);
}

static void test_tenant_isolation(void **state)
{
    moonlet_master *m = *state;
    assert_int_equal(fix_put_t(m, "A", "k", 10, 1), MOONLET_OK);
    bool ex = true;
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR("B"), MOONLET_STR("k"), &ex), MOONLET_OK);
    assert_false(ex);
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(""), MOONLET_STR("k"), &ex), MOONLET_OK);
    assert_false(ex);
    assert_int_equal(moonlet_master_remove(m, MOONLET_STR("B"), MOONLET_STR("k")), MOONLET_ERR_OBJECT_NOT_FOUND);
    /* the same key in another tenant is another object */
    assert_int_equal(fix_put_t(m, "B", "k", 20, 1), MOONLET_OK);
    moonlet_key_view v;
    assert_int_equal(moonlet_master_inspect_key(m, MOONLET_STR("A"), MOONLET_STR("k"), &v, NULL, NULL), MOONLET_OK);
    assert_int_equal(v.size, 10);
    assert_int_equal(moonlet_master_inspect_key(m, MOONLET_STR("B"), MOONLET_STR("k"), &v, NULL, NULL), MOONLET_OK);
    assert_int_equal(v.size, 20);
    /* "" and "default" are the same tenant */
    assert_int_equal(fix_put_t(m, "default", "d", 5, 1), MOONLET_OK);
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(""), MOONLET_STR("d"), &ex), MOONLET_OK);
    assert_true(ex);
    uint64_t removed;
    assert_int_equal(moonlet_master_remove_all(m, MOONLET_STR("A"), &removed), MOONLET_OK);
    assert_int_equal(removed, 1);
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR("B"), MOONLET_STR("k"), &ex), MOONLET_OK);
    assert_true(ex);
}

static void test_unmount_removes_objects(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c2", "s2", 1 << 20);
    assert_int_equal(fix_put_t(m, "", "two", 100, 2), MOONLET_OK);
    char key[32];
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof(key), "one-%d", i);
        assert_int_equal(fix_put(m, key, 100), MOONLET_OK);
    }
    assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR("c1"), MOONLET_STR("s1")), MOONLET_OK);
    bool ex;
    assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(""), MOONLET_STR("two"), &ex), MOONLET_OK);
    assert_true(ex); /* survives on s2 */
    struct fix_reps c = {0};
    assert_int_equal(moonlet_master_get_replica_list(m, MOONLET_STR(""), MOONLET_STR("two"), NULL, NULL, fix_reps_visit, &c), MOONLET_OK);
    assert_int_equal(c.n, 1);
    assert_string_equal(c.segs[0], "s2");
    moonlet_master_stats st = fix_stats(m);
    /* single-replica objects on s1 are gone, those on s2 remain */
    int alive = 0;
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof(key), "one-%d", i);
        assert_int_equal(moonlet_master_probe_key(m, MOONLET_STR(""), MOONLET_STR(key), &ex), MOONLET_OK);
        alive += ex;
    }
    assert_int_equal(st.objects, (uint64_t)alive + 1);
    assert_true(alive < 20);
    assert_int_equal(st.segments, 1);
    assert_int_equal(st.capacity, 1 << 20);
}

static void test_liveness(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c2", "s2", 1 << 20);
    assert_int_equal(fix_put_t(m, "", "x", 100, 2), MOONLET_OK);
    for (int i = 0; i < 8; i++) { /* 8 s: both ping within the 10 s TTL */
        moonlet_clock_advance(1000 * MS);
        assert_int_equal(moonlet_master_ping(m, MOONLET_STR("c1"), NULL), MOONLET_OK);
        assert_int_equal(moonlet_master_ping(m, MOONLET_STR("c2"), NULL), MOONLET_OK);
        moonlet_master_tick(m);
    }
    for (int i = 0; i < 11; i++) { /* c2 goes silent */
        moonlet_clock_advance(1000 * MS);
        assert_int_equal(moonlet_master_ping(m, MOONLET_STR("c1"), NULL), MOONLET_OK);
        moonlet_master_tick(m);
    }
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.segments, 1);
    assert_int_equal(st.unmounts_by_liveness, 1);
    struct fix_reps c = {0};
    assert_int_equal(moonlet_master_get_replica_list(m, MOONLET_STR(""), MOONLET_STR("x"), NULL, NULL, fix_reps_visit, &c), MOONLET_OK);
    assert_int_equal(c.n, 1);
    assert_string_equal(c.segs[0], "s1");
    /* the silent client learns it has no segment left when it pings again */
    uint32_t segs = 9;
    assert_int_equal(moonlet_master_ping(m, MOONLET_STR("c2"), &segs), MOONLET_OK);
    assert_int_equal(segs, 0);
    assert_int_equal(moonlet_master_ping(m, MOONLET_STR("c1"), &segs), MOONLET_OK);
    assert_int_equal(segs, 1);
}

static void test_put_timeout(void **state)
{
    moonlet_master *m = *state;
    assert_int_equal(moonlet_master_put_start(m, MOONLET_STR(""), MOONLET_STR("p"), 100, 1, false, NULL, NULL), MOONLET_OK);
    for (int i = 0; i < 70; i++) {
        moonlet_clock_advance(1000 * MS);
        moonlet_master_ping(m, MOONLET_STR("c1"), NULL);
        moonlet_master_tick(m);
    }
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.put_timeouts, 1);
    assert_int_equal(st.objects, 0);
    assert_int_equal(st.used, 0);
    assert_int_equal(fix_lease(m, "p"), -1);
}

struct pagectx {
    int *seen;
    int count;
};

static void visit(void *arg, const moonlet_key_view *k)
{
    struct pagectx *pc = arg;
    int i = atoi(k->key + (k->key[0] == 'e' ? 5 : 4));
    pc->seen[i]++;
    pc->count++;
}

static void test_list_keys_paging(void **state)
{
    (void)state;
    moonlet_master *m = fix_master(8, 5000);
    fix_mount(m, "c1", "s1", 16 << 20);
    char key[32];
    for (int i = 0; i < 500; i++) {
        snprintf(key, sizeof(key), "%s-%03d", i % 2 ? "odd" : "even", i);
        assert_int_equal(fix_put(m, key, 1), MOONLET_OK);
    }
    int seen[500] = {0}, pages = 0, total = 0;
    char cursor[MOONLET_CURSOR_BYTES] = "", next[MOONLET_CURSOR_BYTES];
    struct pagectx pc = {seen, 0};
    do {
        pc.count = 0;
        assert_int_equal(moonlet_master_list_keys(m, MOONLET_STR(""), MOONLET_STR("even"),
                                                  MOONLET_STR(cursor), 37, visit, &pc, next), MOONLET_OK);
        assert_true(pc.count <= 37);
        total += pc.count;
        snprintf(cursor, sizeof(cursor), "%s", next);
        pages++;
    } while (cursor[0] && pages < 100);
    assert_int_equal(total, 250);
    for (int i = 0; i < 500; i++)
        assert_int_equal(seen[i], i % 2 ? 0 : 1);
    assert_int_equal(moonlet_master_list_keys(m, MOONLET_STR(""), MOONLET_STR(""), MOONLET_STR("bogus"), 10, visit, &pc, next), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_master_list_keys(m, MOONLET_STR(""), MOONLET_STR(""), MOONLET_STR(""), 0, visit, &pc, next), MOONLET_ERR_INVALID_PARAMS);
    moonlet_master_destroy(m);
}

/* Issue 31, finding 5: PutEnd and PutRevoke name their put.  Put A is
 * reaped at its deadline and the key is put again (B, another client):
 * A's late PutEnd sealed B's half-written object with A's checksum, and
 * A's late PutRevoke killed B.  Named by A's id, both are refused
 * (OBJECT_NOT_FOUND) and B goes on; a call without an id keeps the old
 * meaning (whichever put holds the key). */
static void test_put_end_names_its_put(void **state)
{
    (void)state;
    moonlet_master_config cfg = fix_config(16);
    cfg.put_timeout_ms = 1000;
    moonlet_master *m = fix_master_of(&cfg, FIX_T0);
    fix_mount(m, "n0", "s0", 1 << 20);
    moonlet_str t = MOONLET_STR(""), k = MOONLET_STR("k");
    uint64_t a = 0, b = 0;
    moonlet_master_put_opts po = {.replica_num = 1, .put_id = &a};
    assert_int_equal(moonlet_master_put_start_opts(m, t, k, 100, &po, NULL, NULL), MOONLET_OK);
    assert_true(a != 0);
    moonlet_clock_advance(1001 * MOONLET_NS_PER_MS);
    moonlet_master_tick(m); /* A is reaped */
    po.put_id = &b;
    assert_int_equal(moonlet_master_put_start_opts(m, t, k, 100, &po, NULL, NULL), MOONLET_OK);
    assert_true(b != 0 && b != a);
    uint64_t ck = 42;
    assert_int_equal(moonlet_master_put_end_ex(m, t, k, &ck, &a), MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(moonlet_master_put_revoke_ex(m, t, k, &a), MOONLET_ERR_OBJECT_NOT_FOUND);
    moonlet_key_view v;
    assert_int_equal(moonlet_master_inspect_key(m, t, k, &v, NULL, NULL), MOONLET_OK);
    assert_false(v.complete); /* B still in progress, not sealed by A */
    assert_int_equal(moonlet_master_put_end_ex(m, t, k, NULL, &b), MOONLET_OK);
    assert_int_equal(moonlet_master_put_end_ex(m, t, k, NULL, &b), MOONLET_ERR_INVALID_WRITE);
    /* A revoke by id, and the calls without one. */
    po.put_id = &a;
    assert_int_equal(moonlet_master_put_start_opts(m, t, MOONLET_STR("k2"), 100, &po, NULL, NULL),
                     MOONLET_OK);
    assert_int_equal(moonlet_master_put_revoke_ex(m, t, MOONLET_STR("k2"), &b),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(moonlet_master_put_revoke_ex(m, t, MOONLET_STR("k2"), &a), MOONLET_OK);
    assert_int_equal(moonlet_master_put_start(m, t, MOONLET_STR("k3"), 100, 1, false, NULL, NULL),
                     MOONLET_OK);
    assert_int_equal(moonlet_master_put_end(m, t, MOONLET_STR("k3"), NULL), MOONLET_OK);
    moonlet_master_destroy(m);
}

MOONLET_TEST_MAIN("master_object", NULL, NULL,
                  FIX_TEST(test_lifecycle),
                  FIX_TEST(test_force_remove),
                  cmocka_unit_test(test_quarantine),
                  cmocka_unit_test(test_write_capabilities),
                  FIX_TEST(test_bad_input),
                  cmocka_unit_test(test_lease_deadlines),
                  cmocka_unit_test(test_batch_exist),
                  FIX_TEST(test_tenant_isolation),
                  FIX_TEST(test_unmount_removes_objects),
                  FIX_TEST(test_liveness),
                  FIX_TEST(test_put_timeout),
                  cmocka_unit_test(test_list_keys_paging),
                  cmocka_unit_test(test_put_end_names_its_put))
