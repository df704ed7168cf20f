/*
 * Tests of PutReplaceReplica (master/store/object.c, segment.c) on a frozen clock:
 * the replacement avoids every segment holding a replica and every excluded
 * one, the failed replica's range waits in quarantine until the put deadline
 * + the grace, at most MOONLET_MAX_PUT_REPLACEMENTS per put, a replica an
 * unmount already stripped is re-added, and every refusal leaves the put
 * unchanged with a clear code.
 */
#include "../common/master_fixture.h"
#include "alloc.h"
#include "writecap.h"
#include "../common/test_main.h"

#define MS MOONLET_NS_PER_MS

static bool has_seg(const struct fix_reps *c, const char *seg)
{
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->segs[i], seg) == 0)
            return true;
    return false;
}

static moonlet_master *master_with(uint64_t put_timeout_ms, uint64_t grace_ms)
{
    moonlet_master_config cfg;
    moonlet_master_config_default(&cfg);
    cfg.shards = 16;
    cfg.background = false;
    cfg.put_timeout_ms = put_timeout_ms;
    cfg.put_quarantine_grace_ms = grace_ms;
    cfg.lease_ttl_ms = 10000; /* a read lease keeps a sealed object from eviction */
    moonlet_clock_set_fake(FIX_T0);
    moonlet_master *m = NULL;
    assert_int_equal(moonlet_master_create(&cfg, &m), MOONLET_OK);
    return m;
}

/* cmocka setups: master_with() a short put deadline (1 s, grace 0.5 s) or a
 * long one (60 s, grace 2 s) as the test's state; fix_teardown destroys it. */
static int setup(void **state)
{
    *state = master_with(1000, 500);
    return 0;
}

static int setup_long(void **state)
{
    *state = master_with(60000, 2000);
    return 0;
}

static void mount_n(moonlet_master *m, int n, uint64_t size)
{
    for (int i = 0; i < n; i++) {
        char c[16], s[16];
        snprintf(c, sizeof(c), "c%d", i);
        snprintf(s, sizeof(s), "s%d", i);
        fix_mount(m, c, s, size);
    }
}

/* PutStart of key in the default tenant, not soft-pinned; the replicas it
 * hands out go to out unless it is NULL. */
static int put_start(moonlet_master *m, const char *key, uint64_t size, uint32_t replicas,
                     struct fix_reps *out)
{
    return moonlet_master_put_start(m, MOONLET_STR(""), MOONLET_STR(key), size, replicas, false,
                                    out ? fix_reps_visit : NULL, out);
}

/* The replicas the master holds for the key (all statuses). */
static struct fix_reps replicas_of(moonlet_master *m, const char *key)
{
    struct fix_reps c = {0};
    moonlet_key_view v;
    assert_int_equal(moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR(key), &v,
                                                fix_reps_visit, &c),
                     MOONLET_OK);
    return c;
}

static int replace(moonlet_master *m, const char *key, const char *failed,
                   const char *const *excl, uint32_t nexcl, struct fix_reps *out)
{
    moonlet_str ex[MOONLET_MAX_EXCLUDED + 1];
    for (uint32_t i = 0; i < nexcl; i++)
        ex[i] = MOONLET_STR(excl[i]);
    return moonlet_master_put_replace_replica(m, MOONLET_STR(""), MOONLET_STR(key),
                                              MOONLET_STR(failed), ex, nexcl, fix_reps_visit, out);
}

/* The replacement lands on the one segment that holds no replica and is not
 * excluded; the object then seals with two readable replicas. */
static void test_replacement_excludes(void **state)
{
    moonlet_master *m = *state;
    mount_n(m, 4, 1 << 20);
    struct fix_reps start = {0};
    assert_int_equal(put_start(m, "k", 4096, 2, &start), MOONLET_OK);
    assert_int_equal(start.n, 2);
    /* the two segments without a replica: exclude one, the other must be chosen */
    const char *free_segs[2];
    int nf = 0;
    for (int i = 0; i < 4; i++) {
        char s[16];
        snprintf(s, sizeof(s), "s%d", i);
        if (!has_seg(&start, s))
            free_segs[nf++] = strdup(s);
    }
    assert_int_equal(nf, 2);
    const char *excl[] = {free_segs[0], "no-such-segment"};
    struct fix_reps got = {0};
    assert_int_equal(replace(m, "k", start.segs[0], excl, 2, &got), MOONLET_OK);
    assert_int_equal(got.n, 1);
    assert_string_equal(got.segs[0], free_segs[1]);
    assert_true(got.ttl[0] > 0 && got.ttl[0] <= 1000); /* the put's unchanged deadline */

    struct fix_reps now = replicas_of(m, "k");
    assert_int_equal(now.n, 2);
    assert_true(has_seg(&now, start.segs[1]));
    assert_true(has_seg(&now, free_segs[1]));
    assert_false(has_seg(&now, start.segs[0]));

    /* the replacement replaced: sealing makes both readable, no checksum recorded */
    assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR("k"), NULL), MOONLET_OK);
    struct fix_reps rd = {0};
    bool has_ck = true;
    uint64_t ck = 1;
    assert_int_equal(moonlet_master_get_replica_list_ck(m, MOONLET_STR(""), MOONLET_STR("k"), NULL,
                                                        NULL, &has_ck, &ck, fix_reps_visit, &rd),
                     MOONLET_OK);
    assert_int_equal(rd.n, 2);
    assert_false(has_ck);
    moonlet_master_stats st;
    moonlet_master_get_stats(m, &st);
    assert_int_equal(st.put_replacements, 1);
    free((void *)free_segs[0]);
    free((void *)free_segs[1]);
}

/* The failed replica's range is not reusable before the put deadline + the
 * grace (a stale writer may still send there), and is afterwards. */
static void test_old_range_quarantined(void **state)
{
    moonlet_master *m = *state;
    mount_n(m, 2, 4096); /* room for exactly one 4096-byte replica each */
    fix_mount(m, "c9", "s9", 4096);
    struct fix_reps start = {0};
    assert_int_equal(put_start(m, "k", 4096, 2, &start), MOONLET_OK);
    struct fix_reps got = {0};
    assert_int_equal(replace(m, "k", start.segs[0], NULL, 0, &got), MOONLET_OK);
    moonlet_master_stats st;
    moonlet_master_get_stats(m, &st);
    assert_int_equal(st.quarantined, 4096);
    assert_int_equal(st.used, 3 * 4096); /* two live replicas + the quarantined range */
    assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR("k"), NULL), MOONLET_OK);
    assert_int_equal(moonlet_master_get_replica_list(m, MOONLET_STR(""), MOONLET_STR("k"), NULL,
                                                     NULL, NULL, NULL),
                     MOONLET_OK); /* leased: not evicted for the puts below */

    /* the failed segment is the only one with room, but not before deadline + grace */
    assert_int_equal(put_start(m, "x", 64, 1, NULL), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    moonlet_clock_advance(1499 * MS);
    assert_int_equal(put_start(m, "x", 64, 1, NULL), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    moonlet_clock_advance(1 * MS);
    struct fix_reps x = {0};
    assert_int_equal(put_start(m, "x", 64, 1, &x), MOONLET_OK);
    assert_string_equal(x.segs[0], start.segs[0]);
    assert_int_equal(x.off[0], start.off[0]);
    moonlet_master_get_stats(m, &st);
    assert_int_equal(st.quarantined, 0);
}

/* At most MOONLET_MAX_PUT_REPLACEMENTS per put: then a clear refusal, the
 * put unchanged; a new put starts with its own allowance. */
static void test_replacement_bound(void **state)
{
    moonlet_master *m = *state;
    mount_n(m, 8, 1 << 20);
    assert_int_equal(put_start(m, "k", 100, 2, NULL), MOONLET_OK);
    char seen[8][64];
    int nseen = 0;
    for (unsigned i = 0; i < MOONLET_MAX_PUT_REPLACEMENTS; i++) {
        struct fix_reps cur = replicas_of(m, "k");
        snprintf(seen[nseen++], sizeof(seen[0]), "%s", cur.segs[0]);
        const char *excl[8];
        for (int e = 0; e < nseen; e++)
            excl[e] = seen[e];
        struct fix_reps got = {0};
        assert_int_equal(replace(m, "k", cur.segs[0], excl, (uint32_t)nseen, &got), MOONLET_OK);
        for (int e = 0; e < nseen; e++) /* never back to a segment that failed */
            assert_string_not_equal(got.segs[0], seen[e]);
    }
    struct fix_reps before = replicas_of(m, "k");
    struct fix_reps got = {0};
    assert_int_equal(replace(m, "k", before.segs[0], NULL, 0, &got),
                     MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    assert_int_equal(got.n, 0);
    struct fix_reps after = replicas_of(m, "k");
    assert_int_equal(after.n, 2);
    assert_string_equal(after.segs[0], before.segs[0]);
    assert_string_equal(after.segs[1], before.segs[1]);
    assert_int_equal(moonlet_master_put_revoke(m, MOONLET_STR(""), MOONLET_STR("k")), MOONLET_OK);
    moonlet_master_stats st;
    moonlet_master_get_stats(m, &st);
    assert_int_equal(st.put_replacements, MOONLET_MAX_PUT_REPLACEMENTS);
    assert_int_equal(st.objects, 0);

    /* the same key put again has its own allowance */
    assert_int_equal(put_start(m, "k", 100, 2, NULL), MOONLET_OK);
    struct fix_reps cur = replicas_of(m, "k");
    assert_int_equal(replace(m, "k", cur.segs[1], NULL, 0, &got), MOONLET_OK);
}

/* Every refusal is a clear code and changes nothing. */
static void test_refusals(void **state)
{
    moonlet_master *m = *state;
    mount_n(m, 2, 1 << 20);
    struct fix_reps got = {0};
    assert_int_equal(replace(m, "nope", "s0", NULL, 0, &got), MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(moonlet_master_put_replace_replica(m, MOONLET_STR(""), MOONLET_STR(""),
                                                        MOONLET_STR("s0"), NULL, 0, NULL, NULL),
                     MOONLET_ERR_INVALID_KEY);
    assert_int_equal(moonlet_master_put_replace_replica(m, MOONLET_STR(""), MOONLET_STR("k"),
                                                        MOONLET_STR(""), NULL, 0, NULL, NULL),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_master_put_replace_replica(m, MOONLET_STR(""), MOONLET_STR("k"),
                                                        MOONLET_STR("s0"), NULL,
                                                        MOONLET_MAX_EXCLUDED + 1, NULL, NULL),
                     MOONLET_ERR_INVALID_PARAMS);

    assert_int_equal(put_start(m, "k", 100, 2, NULL), MOONLET_OK);
    /* no excluded list at all (an older writer's request) is fine */
    assert_int_equal(moonlet_master_put_replace_replica(m, MOONLET_STR(""), MOONLET_STR("k"),
                                                        MOONLET_STR("s0"), NULL, 0, NULL, NULL),
                     MOONLET_ERR_NO_AVAILABLE_HANDLE);
    /* a segment that holds no replica of it (and none is missing) */
    assert_int_equal(replace(m, "k", "s7", NULL, 0, &got), MOONLET_ERR_INVALID_PARAMS);
    /* both segments hold a replica: no room for a replacement; nothing changed */
    assert_int_equal(replace(m, "k", "s0", NULL, 0, &got), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    struct fix_reps cur = replicas_of(m, "k");
    assert_int_equal(cur.n, 2);
    assert_true(has_seg(&cur, "s0") && has_seg(&cur, "s1"));
    moonlet_master_stats st;
    moonlet_master_get_stats(m, &st);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.put_replacements, 0);

    /* sealed: not in progress */
    assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR("k"), NULL), MOONLET_OK);
    fix_mount(m, "c5", "s5", 1 << 20);
    assert_int_equal(replace(m, "k", "s0", NULL, 0, &got), MOONLET_ERR_INVALID_WRITE);

    /* past its deadline (not yet reaped): no fresh capability */
    assert_int_equal(put_start(m, "late", 100, 2, NULL), MOONLET_OK);
    cur = replicas_of(m, "late");
    moonlet_clock_advance(1000 * MS);
    assert_int_equal(replace(m, "late", cur.segs[0], NULL, 0, &got), MOONLET_ERR_INVALID_WRITE);
    assert_int_equal(got.n, 0);
}

/* A dead node's segment unmounted before the writer asked: its replica is
 * gone already, the replacement fills the missing place (never on the
 * failed segment, never twice). */
static void test_stripped_replica_refilled(void **state)
{
    moonlet_master *m = *state;
    mount_n(m, 3, 1 << 20);
    struct fix_reps start = {0};
    assert_int_equal(put_start(m, "k", 100, 2, &start), MOONLET_OK);
    char dead[64], dead_client[64];
    snprintf(dead, sizeof(dead), "%s", start.segs[0]);
    snprintf(dead_client, sizeof(dead_client), "c%s", dead + 1);
    assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR(dead_client), MOONLET_STR(dead)),
                     MOONLET_OK);
    assert_int_equal(replicas_of(m, "k").n, 1);
    struct fix_reps got = {0};
    assert_int_equal(replace(m, "k", dead, NULL, 0, &got), MOONLET_OK);
    assert_string_not_equal(got.segs[0], dead);
    assert_string_not_equal(got.segs[0], start.segs[1]);
    assert_int_equal(replicas_of(m, "k").n, 2);
    /* a second call for the same failure finds no missing place */
    assert_int_equal(replace(m, "k", dead, NULL, 0, &got), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR("k"), NULL), MOONLET_OK);
    struct fix_reps rd = {0};
    assert_int_equal(moonlet_master_get_replica_list(m, MOONLET_STR(""), MOONLET_STR("k"), NULL,
                                                     NULL, fix_reps_visit, &rd),
                     MOONLET_OK);
    assert_int_equal(rd.n, 2);
}

/* On a segment with a write key the replacement carries a capability that
 * expires with the put (the same expiry as the original replicas'). */
static void test_replacement_capability(void **state)
{
    moonlet_master *m = *state;
    static const uint8_t key[16] = {1, 2, 3};
    for (int i = 0; i < 3; i++) {
        char c[16], s[16];
        snprintf(c, sizeof(c), "c%d", i);
        snprintf(s, sizeof(s), "s%d", i);
        moonlet_segment_desc d = {.client_id = c, .segment_id = s, .name = s, .size = 1 << 20,
                                  .endpoint = "127.0.0.1:1", .protocol = "tcp", .write_key = key,
                                  .node_clock_ms = 5};
        assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_OK);
    }
    struct fix_reps start = {0};
    assert_int_equal(put_start(m, "k", 100, 2, &start), MOONLET_OK);
    moonlet_clock_advance(200 * MS);
    struct fix_reps got = {0};
    assert_int_equal(replace(m, "k", start.segs[1], NULL, 0, &got), MOONLET_OK);
    assert_true(got.has_cap[0]);
    assert_int_equal(got.cap_expiry[0], start.cap_expiry[0]);
    assert_int_equal(got.ttl[0], 800);
}

MOONLET_TEST_MAIN("put_replace", NULL, NULL,
                  FIX_TEST(test_replacement_excludes),
                  FIX_TEST(test_old_range_quarantined),
                  cmocka_unit_test_setup_teardown(test_replacement_bound, setup_long, fix_teardown),
                  FIX_TEST(test_refusals),
                  cmocka_unit_test_setup_teardown(test_stripped_replica_refilled, setup_long,
                  fix_teardown),
                  FIX_TEST(test_replacement_capability))
