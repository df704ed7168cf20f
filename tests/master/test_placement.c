/* Tests of PutStart's placement and pinning options (master/store/segment.c,
 * object.c, evict.c): preferred segments (present, absent, full), hard pins
 * that neither eviction path takes, per-object soft-pin TTLs, and the old
 * PutStart without options. */
#include "../common/master_fixture.h"
#include "../common/test_main.h"

#define MS MOONLET_NS_PER_MS

struct segs {
    char names[8][32];
    uint32_t n;
};

/* cmocka setup: a master of 16 shards and 1 s leases as the test's state; fix_teardown destroys
 * it. */
static int setup(void **state)
{
    *state = fix_master(16, 1000);
    return 0;
}

static void collect(void *arg, const moonlet_replica_view *v)
{
    struct segs *s = arg;
    snprintf(s->names[s->n++], sizeof(s->names[0]), "%s", v->segment_name);
}

static bool has(const struct segs *s, const char *name)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0)
            return true;
    return false;
}

static int put_opts(moonlet_master *m, const char *key, uint64_t size,
                    const moonlet_master_put_opts *po, struct segs *out)
{
    struct segs tmp;
    if (!out)
        out = &tmp;
    out->n = 0;
    int rc = moonlet_master_put_start_opts(m, MOONLET_STR(""), MOONLET_STR(key), size, po,
                                           collect, out);
    if (rc)
        return rc;
    return moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR(key), NULL);
}

static bool exists(moonlet_master *m, const char *k)
{
    bool ex = false;
    assert_int_equal(moonlet_master_probe_key(m, MOONLET_STR(""), MOONLET_STR(k), &ex), MOONLET_OK);
    return ex;
}

static void test_preferred_present(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c1", "a", 1 << 20);
    fix_mount(m, "c2", "b", 1 << 20);
    fix_mount(m, "c3", "c", 1 << 20);
    /* round-robin would spread these; the preference keeps them all on "c" */
    moonlet_str pref[] = {MOONLET_STR("c")};
    moonlet_master_put_opts po = {.replica_num = 1, .preferred = pref, .npreferred = 1};
    char k[16];
    for (int i = 0; i < 6; i++) {
        struct segs s;
        snprintf(k, sizeof(k), "k%d", i);
        assert_int_equal(put_opts(m, k, 64, &po, &s), MOONLET_OK);
        assert_int_equal(s.n, 1);
        assert_string_equal(s.names[0], "c");
    }
    /* two replicas, preferences in order: "b" then "a"; duplicates ignored */
    moonlet_str pref2[] = {MOONLET_STR("b"), MOONLET_STR("b"), MOONLET_STR("a")};
    po = (moonlet_master_put_opts){.replica_num = 2, .preferred = pref2, .npreferred = 3};
    for (int i = 0; i < 4; i++) {
        struct segs s;
        snprintf(k, sizeof(k), "two%d", i);
        assert_int_equal(put_opts(m, k, 64, &po, &s), MOONLET_OK);
        assert_int_equal(s.n, 2);
        assert_true(has(&s, "a") && has(&s, "b"));
    }
    /* one preferred, three replicas: the rest go round-robin, all distinct */
    po = (moonlet_master_put_opts){.replica_num = 3, .preferred = pref, .npreferred = 1};
    struct segs s;
    assert_int_equal(put_opts(m, "three", 64, &po, &s), MOONLET_OK);
    assert_int_equal(s.n, 3);
    assert_string_equal(s.names[0], "c");
    assert_true(has(&s, "a") && has(&s, "b"));
}

static void test_preferred_absent_or_full(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c1", "small", 64 * 2);
    fix_mount(m, "c2", "big", 1 << 20);
    /* a segment is also found by its endpoint (Mooncake's "host:port" name) */
    moonlet_segment_desc d = {.client_id = "c3", .segment_id = "ep", .name = "ep", .size = 1 << 20,
                              .endpoint = "10.0.0.3:7000", .protocol = "tcp"};
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_OK);
    moonlet_str byep[] = {MOONLET_STR("10.0.0.3:7000")};
    moonlet_master_put_opts pe = {.replica_num = 1, .preferred = byep, .npreferred = 1};
    struct segs s;
    for (int i = 0; i < 3; i++) {
        char kk[16];
        snprintf(kk, sizeof(kk), "ep%d", i);
        assert_int_equal(put_opts(m, kk, 64, &pe, &s), MOONLET_OK);
        assert_string_equal(s.names[0], "ep");
    }
    assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR("c3"), MOONLET_STR("ep")), MOONLET_OK);
    /* an unknown name is skipped */
    moonlet_str nope[] = {MOONLET_STR("nowhere")};
    moonlet_master_put_opts po = {.replica_num = 1, .preferred = nope, .npreferred = 1};
    assert_int_equal(put_opts(m, "absent", 64, &po, &s), MOONLET_OK);
    assert_int_equal(s.n, 1);
    /* fill "small" through the preference, then it falls back to "big" */
    moonlet_str small[] = {MOONLET_STR("small")};
    po = (moonlet_master_put_opts){.replica_num = 1, .preferred = small, .npreferred = 1};
    int on_small = 0;
    char k[16];
    for (int i = 0; i < 4; i++) {
        snprintf(k, sizeof(k), "f%d", i);
        assert_int_equal(put_opts(m, k, 64, &po, &s), MOONLET_OK);
        on_small += strcmp(s.names[0], "small") == 0;
    }
    /* "absent" may have taken one slot of small */
    assert_true(on_small >= 1);
    assert_int_equal(put_opts(m, "full", 64, &po, &s), MOONLET_OK);
    assert_string_equal(s.names[0], "big");
    /* the fallback did not evict anything from the preferred segment */
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.evictions, 0);
    /* too many names is refused */
    moonlet_str many[MOONLET_MAX_PREFERRED + 1];
    for (uint32_t i = 0; i <= MOONLET_MAX_PREFERRED; i++)
        many[i] = MOONLET_STR("big");
    po = (moonlet_master_put_opts){.replica_num = 1, .preferred = many,
                                   .npreferred = MOONLET_MAX_PREFERRED + 1};
    assert_int_equal(put_opts(m, "many", 64, &po, NULL), MOONLET_ERR_INVALID_PARAMS);
}

static void test_hard_pin_never_evicted(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c", "s", 64 * 10);
    moonlet_master_put_opts hard = {.replica_num = 1, .hard_pin = true};
    assert_int_equal(put_opts(m, "h0", 64, &hard, NULL), MOONLET_OK);
    assert_int_equal(put_opts(m, "h1", 64, &hard, NULL), MOONLET_OK);
    fix_put_range(m, "u", 0, 8, 64, 1);
    moonlet_key_view v;
    assert_int_equal(moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR("h0"), &v, NULL, NULL), MOONLET_OK);
    assert_true(v.hard_pinned);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.hard_pinned, 2);
    assert_int_equal(st.hard_pinned_bytes, 128);
    /* the watermark pass, both rounds, at any age: only the 8 others go */
    moonlet_clock_advance(3600ull * 1000 * MS);
    assert_int_equal(moonlet_master_evict_now(m, 1.0), 8);
    assert_int_equal(moonlet_master_evict_now(m, 1.0), 0);
    assert_true(exists(m, "h0") && exists(m, "h1"));
    /* evict_for_space: fill the rest, then a put needing space */
    fix_put_range(m, "v", 0, 8, 64, 1);
    assert_int_equal(fix_put(m, "more", 64 * 8), MOONLET_OK);
    assert_true(exists(m, "h0") && exists(m, "h1"));
    /* a put that only the pinned space could make room for fails and evicts nothing */
    st = fix_stats(m);
    uint64_t ev = st.evictions;
    assert_int_equal(fix_put(m, "huge", 64 * 10), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    st = fix_stats(m);
    assert_int_equal(st.evictions, ev);
    assert_true(exists(m, "h0") && exists(m, "h1"));
    /* Remove takes it, and the counters follow */
    assert_int_equal(moonlet_master_remove(m, MOONLET_STR(""), MOONLET_STR("h0")), MOONLET_OK);
    assert_false(exists(m, "h0"));
    st = fix_stats(m);
    assert_int_equal(st.hard_pinned, 1);
    assert_int_equal(st.hard_pinned_bytes, 64);
}

static void test_hard_pin_cap(void **state)
{
    moonlet_master *m = *state; /* hard_pin_max_ratio 0.5 by default */
    fix_mount(m, "c1", "a", 64 * 10);
    fix_mount(m, "c2", "b", 64 * 10);
    moonlet_master_put_opts hard = {.replica_num = 2, .hard_pin = true};
    char k[16];
    for (int i = 0; i < 5; i++) { /* 5 x 64 x 2 = half of 1280 */
        snprintf(k, sizeof(k), "h%d", i);
        assert_int_equal(put_opts(m, k, 64, &hard, NULL), MOONLET_OK);
    }
    assert_int_equal(put_opts(m, "over", 64, &hard, NULL), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    /* a put in progress counts too, and a revoked one gives its share back */
    assert_int_equal(moonlet_master_remove(m, MOONLET_STR(""), MOONLET_STR("h4")), MOONLET_OK);
    assert_int_equal(moonlet_master_put_start_opts(m, MOONLET_STR(""), MOONLET_STR("p"), 64, &hard,
                                                   NULL, NULL), MOONLET_OK);
    assert_int_equal(put_opts(m, "over", 64, &hard, NULL), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    assert_int_equal(moonlet_master_put_revoke(m, MOONLET_STR(""), MOONLET_STR("p")), MOONLET_OK);
    assert_int_equal(put_opts(m, "over", 64, &hard, NULL), MOONLET_OK);
    /* the unpinned half stays usable: ordinary puts still fit and evict */
    fix_put_range(m, "u", 0, 12, 64, 2);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.hard_pinned, 5);
    assert_true(st.evictions >= 7);
}

static void test_soft_pin_ttl(void **state)
{
    moonlet_master *m = *state; /* default soft-pin TTL: 30 min */
    fix_mount(m, "c", "s", 1 << 20);
    moonlet_master_put_opts shortpin = {.replica_num = 1, .soft_pin = true, .soft_pin_ttl_ms = 2000};
    moonlet_master_put_opts defpin = {.replica_num = 1, .soft_pin = true};
    assert_int_equal(moonlet_master_put_start_opts(m, MOONLET_STR(""), MOONLET_STR("short"), 64,
                                                   &shortpin, NULL, NULL), MOONLET_OK);
    /* the TTL runs from PutEnd */
    moonlet_clock_advance(500 * MS);
    assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR("short"), NULL), MOONLET_OK);
    assert_int_equal(put_opts(m, "default", 64, &defpin, NULL), MOONLET_OK);
    moonlet_key_view v;
    assert_int_equal(moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR("short"), &v, NULL, NULL), MOONLET_OK);
    assert_int_equal(v.soft_pin_remaining_ms, 2000);
    assert_false(v.hard_pinned);
    assert_int_equal(moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR("default"), &v, NULL, NULL), MOONLET_OK);
    assert_int_equal(v.soft_pin_remaining_ms, 30 * 60 * 1000);
    /* after 2 s only "short" is unpinned: the first round takes it alone */
    moonlet_clock_advance(2001 * MS);
    assert_int_equal(moonlet_master_evict_now(m, 0.5), 1);
    assert_false(exists(m, "short"));
    assert_true(exists(m, "default"));
    /* a TTL without soft_pin pins nothing */
    moonlet_master_put_opts ttl_only = {.replica_num = 1, .soft_pin_ttl_ms = 5000};
    assert_int_equal(put_opts(m, "nopin", 64, &ttl_only, NULL), MOONLET_OK);
    assert_int_equal(moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR("nopin"), &v, NULL, NULL), MOONLET_OK);
    assert_int_equal(v.soft_pin_remaining_ms, 0);
}

/* The PutStart without options places round-robin and pins as before. */
static void test_old_put_start(void **state)
{
    moonlet_master *m = *state;
    fix_mount(m, "c1", "a", 1 << 20);
    fix_mount(m, "c2", "b", 1 << 20);
    int on_a = 0;
    char k[16];
    for (int i = 0; i < 4; i++) {
        struct segs s = {0};
        snprintf(k, sizeof(k), "k%d", i);
        assert_int_equal(moonlet_master_put_start(m, MOONLET_STR(""), MOONLET_STR(k), 64, 1, true,
                                                  collect, &s), MOONLET_OK);
        assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR(k), NULL), MOONLET_OK);
        on_a += strcmp(s.names[0], "a") == 0;
    }
    assert_int_equal(on_a, 2);
    moonlet_key_view v;
    assert_int_equal(moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR("k0"), &v, NULL, NULL), MOONLET_OK);
    assert_int_equal(v.soft_pin_remaining_ms, 30 * 60 * 1000);
    assert_false(v.hard_pinned);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.hard_pinned, 0);
}

MOONLET_TEST_MAIN("placement", NULL, NULL,
                  FIX_TEST(test_preferred_present),
                  FIX_TEST(test_preferred_absent_or_full),
                  FIX_TEST(test_hard_pin_never_evicted),
                  FIX_TEST(test_hard_pin_cap),
                  FIX_TEST(test_soft_pin_ttl),
                  FIX_TEST(test_old_put_start))
