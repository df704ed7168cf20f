/*
 * Tests of the registry at cluster scale (master/store/segment.c, unmount.c,
 * hmap.c, the tenant map in master.c), on a frozen clock: more segments
 * than the old fixed table held, mount/ping/unmount churn over many ids,
 * liveness that unmounts only the dead nodes and their objects, placement
 * when most segments are full, many tenants, and ListSegments pages
 * (including a page boundary while other threads mount and unmount).
 */
#include "../common/master_fixture.h"

#include <pthread.h>
#include <stdatomic.h>
#include "../common/test_main.h"

#define MS MOONLET_NS_PER_MS
#define SEG_BYTES (1u << 20)

/* cmocka setup: a master of 16 shards and 5 s leases as the test's state; fix_teardown destroys
 * it. */
static int setup(void **state)
{
    *state = fix_master(16, 5000);
    return 0;
}

static void mountf(moonlet_master *m, const char *client, const char *seg, uint64_t size)
{
    fix_mount(m, client, seg, size);
}

static uint64_t stat_segments(moonlet_master *m)
{
    moonlet_master_stats st = fix_stats(m);
    return st.segments;
}

static void count_visit(void *arg, const moonlet_segment_view *s)
{
    (void)s;
    (*(uint32_t *)arg)++;
}

/* The old table stopped at 4,096 segments (NO_AVAILABLE_HANDLE beyond). */
static void test_more_than_4096_segments(void **state)
{
    moonlet_master *m = *state;
    char c[32], s[32];
    for (int i = 0; i < 5000; i++) {
        snprintf(c, sizeof(c), "node%d", i);
        snprintf(s, sizeof(s), "seg%d", i);
        mountf(m, c, s, SEG_BYTES);
    }
    assert_int_equal(stat_segments(m), 5000);
    uint32_t n = 0;
    assert_int_equal(moonlet_master_list_segments(m, count_visit, &n), MOONLET_OK);
    assert_int_equal(n, 5000);
    /* a segment id already mounted is still refused */
    moonlet_segment_desc d = {.client_id = "node1", .segment_id = "seg4999", .size = SEG_BYTES,
                              .endpoint = "127.0.0.1:1", .protocol = "tcp"};
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_ERR_SEGMENT_ALREADY_EXISTS);
    /* puts land on segments past the old cap too */
    fix_put_range(m, "k", 0, 200, 1000, 3);
}

/* Mount, ping and unmount over many ids, reusing freed slots and entries. */
static void test_churn_many_ids(void **state)
{
    moonlet_master *m = *state;
    enum { N = 3000 };
    char c[32], s[32];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            snprintf(c, sizeof(c), "node%d", i);
            snprintf(s, sizeof(s), "seg%d-%d", i, round);
            mountf(m, c, s, SEG_BYTES);
            if (i % 2) { /* a second segment on odd nodes */
                snprintf(s, sizeof(s), "segb%d-%d", i, round);
                mountf(m, c, s, SEG_BYTES);
            }
        }
        assert_int_equal(stat_segments(m), N + N / 2);
        for (int i = 0; i < N; i++) {
            snprintf(c, sizeof(c), "node%d", i);
            uint32_t segs = 99;
            assert_int_equal(moonlet_master_ping(m, MOONLET_STR(c), &segs), MOONLET_OK);
            assert_int_equal(segs, i % 2 ? 2 : 1);
        }
        for (int i = 0; i < N; i++) {
            snprintf(c, sizeof(c), "node%d", i);
            snprintf(s, sizeof(s), "seg%d-%d", i, round);
            /* another client cannot unmount it */
            assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR("other"), MOONLET_STR(s)),
                             MOONLET_ERR_ILLEGAL_CLIENT);
            assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR(c), MOONLET_STR(s)),
                             MOONLET_OK);
            assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR(c), MOONLET_STR(s)),
                             MOONLET_ERR_SEGMENT_NOT_FOUND);
            if (i % 2) {
                snprintf(s, sizeof(s), "segb%d-%d", i, round);
                assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR(c), MOONLET_STR(s)),
                                 MOONLET_OK);
            }
            uint32_t segs = 99;
            assert_int_equal(moonlet_master_ping(m, MOONLET_STR(c), &segs), MOONLET_OK);
            assert_int_equal(segs, 0);
        }
        assert_int_equal(stat_segments(m), 0);
        moonlet_master_stats st = fix_stats(m);
        assert_int_equal(st.capacity, 0);
    }
}

struct seen {
    uint32_t n;
    uint8_t *hits; /* by segment number */
    uint32_t max;
    char client_only[32];
    bool wrong_client;
};

static void seen_visit(void *arg, const moonlet_segment_view *s)
{
    struct seen *v = arg;
    v->n++;
    unsigned idx;
    if (sscanf(s->segment_id, "seg%u", &idx) == 1 && idx < v->max)
        v->hits[idx]++;
    if (v->client_only[0] && strcmp(v->client_only, s->client_id) != 0)
        v->wrong_client = true;
}

/* Counts replicas on a segment "segN" with N < 100 (the dead ones). */
static void dead_visit(void *arg, const moonlet_replica_view *r)
{
    unsigned idx;
    if (sscanf(r->segment_id, "seg%u", &idx) == 1 && idx < 100)
        (*(int *)arg)++;
}

/* Closing a connection releases exactly its clients, however many
 * connections and clients there are (found by session, not by a scan). */
static void test_session_closed_many(void **state)
{
    moonlet_master *m = *state;
    enum { N = 2000 };
    char c[32], s[32];
    for (int i = 0; i < N; i++) { /* even ids on connection 1, odd on 2 */
        snprintf(c, sizeof(c), "node%d", i);
        uint64_t session = 1 + (uint64_t)(i % 2);
        assert_int_equal(moonlet_master_ping_as(m, MOONLET_STR(c), session, NULL), MOONLET_OK);
        if (i % 4 == 0) { /* a segment on every other even one */
            snprintf(s, sizeof(s), "seg%d", i);
            moonlet_segment_desc d = {.client_id = c, .segment_id = s, .size = SEG_BYTES,
                                      .endpoint = "127.0.0.1:1", .protocol = "tcp"};
            assert_int_equal(moonlet_master_mount_segment_as(m, &d, session), MOONLET_OK);
        }
    }
    moonlet_master_session_closed(m, 1);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.clients, N / 2 + N / 4); /* even ones without a segment forgotten */
    for (int i = 0; i < N; i++) {
        snprintf(c, sizeof(c), "node%d", i);
        /* connection 1's clients are free to claim; connection 2's are not */
        assert_int_equal(moonlet_master_ping_as(m, MOONLET_STR(c), 3, NULL),
                         i % 2 ? MOONLET_ERR_ILLEGAL_CLIENT : MOONLET_OK);
    }
    moonlet_master_session_closed(m, 2);
    moonlet_master_session_closed(m, 3);
    st = fix_stats(m);
    assert_int_equal(st.clients, N / 4); /* only those holding a segment */
}

/* Only the dead nodes' segments go, with their objects; the liveness check
 * finds them without restarting from the first client for each. */
static void test_liveness_unmounts_only_dead(void **state)
{
    (void)state;
    moonlet_master *m = fix_master(64, 5000);
    enum { N = 1000, DEAD = 100, KEYS = 4000 };
    char c[32], s[32], k[32];
    for (int i = 0; i < N; i++) {
        snprintf(c, sizeof(c), "node%d", i);
        snprintf(s, sizeof(s), "seg%d", i);
        mountf(m, c, s, SEG_BYTES);
    }
    for (int i = 0; i < KEYS; i++) {
        snprintf(k, sizeof(k), "key%d", i);
        assert_int_equal(fix_put_t(m, "", k, 100, i % 2 ? 2 : 1), MOONLET_OK);
    }
    /* 10 s pass; all but the first DEAD nodes pinged 1 s ago */
    moonlet_clock_advance(9000 * MS);
    for (int i = DEAD; i < N; i++) {
        snprintf(c, sizeof(c), "node%d", i);
        assert_int_equal(moonlet_master_ping(m, MOONLET_STR(c), NULL), MOONLET_OK);
    }
    moonlet_clock_advance(1001 * MS);
    moonlet_master_tick(m);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.segments, N - DEAD);
    assert_int_equal(st.clients, N - DEAD);
    struct seen v = {.hits = calloc(N, 1), .max = N};
    assert_int_equal(moonlet_master_list_segments(m, seen_visit, &v), MOONLET_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(v.hits[i], i < DEAD ? 0 : 1);
    free(v.hits);
    /* every key whose every replica was on a dead node is gone; every other
     * key is still readable and names no dead segment */
    uint64_t left = 0;
    for (int i = 0; i < KEYS; i++) {
        snprintf(k, sizeof(k), "key%d", i);
        moonlet_key_view kv;
        int dead_named = 0;
        int rc = moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR(k), &kv, dead_visit,
                                            &dead_named);
        if (rc == MOONLET_ERR_OBJECT_NOT_FOUND)
            continue;
        assert_int_equal(rc, MOONLET_OK);
        assert_true(kv.replicas >= 1);
        assert_int_equal(dead_named, 0);
        left++;
    }
    st = fix_stats(m);
    assert_int_equal(st.objects, left);
    assert_true(left < KEYS && left > KEYS / 2);
    moonlet_master_destroy(m);
}

/* A master promoted with state holds liveness (moonlet_master_hold_liveness):
 * nodes that could not ping it before it served are not unmounted then; a
 * node that does not ping within the hold is, once it ends. */
static void test_liveness_held_after_promotion(void **state)
{
    moonlet_master *m = *state;
    mountf(m, "quiet", "s1", SEG_BYTES);
    mountf(m, "pinger", "s2", SEG_BYTES);
    moonlet_master_hold_liveness(m, 15000);
    moonlet_clock_advance(12000 * MS); /* both past the 10 s liveness TTL */
    moonlet_master_tick(m);
    assert_int_equal(fix_stats(m).segments, 2);
    assert_int_equal(moonlet_master_ping(m, MOONLET_STR("pinger"), NULL), MOONLET_OK);
    moonlet_clock_advance(3001 * MS); /* the hold has ended */
    moonlet_master_tick(m);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.segments, 1);
    assert_int_equal(st.clients, 1);
}

/* A dead node with many objects is unmounted over several ticks (a bounded
 * number of objects per tick), not in one long step. */
static void test_liveness_unmount_spread_over_ticks(void **state)
{
    (void)state;
    moonlet_master *m = fix_master(64, 5000);
    enum { KEYS = 70000 }; /* more than one tick's budget (65,536) */
    mountf(m, "dead", "segdead", 64u << 20);
    fix_put_range(m, "key", 0, KEYS, 64, 1);
    mountf(m, "live", "seglive", 64u << 20);
    moonlet_clock_advance(9000 * MS);
    assert_int_equal(moonlet_master_ping(m, MOONLET_STR("live"), NULL), MOONLET_OK);
    moonlet_clock_advance(1001 * MS);
    moonlet_master_tick(m);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.segments, 1); /* out of service at once */
    assert_true(st.objects > 0 && st.objects < KEYS); /* stripped in part */
    assert_int_equal(st.unmounts_by_liveness, 0);
    assert_int_equal(fix_put(m, "new", 64), MOONLET_OK); /* lands on the live one */
    moonlet_master_tick(m);
    st = fix_stats(m);
    assert_int_equal(st.objects, 1);
    assert_int_equal(st.unmounts_by_liveness, 1);
    assert_int_equal(st.capacity, 64u << 20);
    moonlet_master_destroy(m);
}

/* With all segments but one full, puts go to the one with room, without
 * evicting anything; freed space brings a full segment back. */
static void test_placement_most_full(void **state)
{
    moonlet_master *m = *state;
    enum { N = 300 };
    const uint64_t seg = 64 * 1024;
    char c[32], s[32], k[32];
    for (int i = 0; i < N; i++) {
        snprintf(c, sizeof(c), "node%d", i);
        snprintf(s, sizeof(s), "seg%d", i);
        mountf(m, c, s, seg);
    }
    for (int i = 0; i < N - 1; i++) { /* one whole-segment object on each of N-1 */
        snprintf(k, sizeof(k), "big%d", i);
        assert_int_equal(fix_put(m, k, seg), MOONLET_OK);
    }
    for (int i = 0; i < 16; i++) { /* the last segment takes 16 quarters of... sixteenths */
        snprintf(k, sizeof(k), "small%d", i);
        assert_int_equal(fix_put(m, k, seg / 16), MOONLET_OK);
    }
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.used, st.capacity);
    /* a removal makes room on a full segment: the next put lands there */
    moonlet_clock_advance(5001 * MS); /* past the puts' leases (none: no get) */
    assert_int_equal(moonlet_master_remove(m, MOONLET_STR(""), MOONLET_STR("big7")), MOONLET_OK);
    assert_int_equal(fix_put(m, "again", seg), MOONLET_OK);
    st = fix_stats(m);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.used, st.capacity);
}

/* Many tenants: each sees only its own key; slots are reused after expiry. */
static void test_many_tenants(void **state)
{
    moonlet_master *m = *state;
    mountf(m, "c", "s", 64u << 20);
    enum { T = 3000 };
    char t[32];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < T; i++) {
            snprintf(t, sizeof(t), "tenant%d", i);
            assert_int_equal(fix_put_t(m, t, "k", 64, 1), MOONLET_OK);
        }
        for (int i = 0; i < T; i += 7) {
            snprintf(t, sizeof(t), "tenant%d", i);
            bool ex = false;
            assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(t), MOONLET_STR("k"), &ex),
                             MOONLET_OK);
            assert_true(ex);
            snprintf(t, sizeof(t), "tenant%d", i + T); /* never created */
            assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(t), MOONLET_STR("k"), &ex),
                             MOONLET_OK);
            assert_false(ex);
        }
        moonlet_clock_advance(5001 * MS);
        for (int i = 0; i < T; i++) {
            snprintf(t, sizeof(t), "tenant%d", i);
            assert_int_equal(moonlet_master_remove(m, MOONLET_STR(t), MOONLET_STR("k")), MOONLET_OK);
            bool ex = true;
            assert_int_equal(moonlet_master_exist_key(m, MOONLET_STR(t), MOONLET_STR("k"), &ex),
                             MOONLET_OK);
            assert_false(ex);
        }
    }
}

/* Pages: limits, cursors, the client filter, bad arguments. */
static void test_list_segments_pages(void **state)
{
    moonlet_master *m = *state;
    enum { N = 2500 };
    char c[32], s[32];
    for (int i = 0; i < N; i++) {
        snprintf(c, sizeof(c), "node%d", i % 500);
        snprintf(s, sizeof(s), "seg%d", i);
        mountf(m, c, s, SEG_BYTES);
    }
    struct seen v = {.hits = calloc(N, 1), .max = N};
    uint64_t cursor = 0;
    int pages = 0;
    do {
        uint32_t before = v.n;
        assert_int_equal(moonlet_master_list_segments_page(m, NULL, cursor, 1000, seen_visit, &v,
                                                           &cursor), MOONLET_OK);
        assert_true(v.n - before <= 1000);
        pages++;
    } while (cursor && pages < 10);
    assert_int_equal(pages, 3);
    for (int i = 0; i < N; i++)
        assert_int_equal(v.hits[i], 1);
    /* one client's segments only */
    struct seen w = {.hits = calloc(N, 1), .max = N};
    snprintf(w.client_only, sizeof(w.client_only), "node7");
    assert_int_equal(moonlet_master_list_segments_page(m, "node7", 0, 1000, seen_visit, &w,
                                                       &cursor), MOONLET_OK);
    assert_int_equal(w.n, 5);
    assert_false(w.wrong_client);
    assert_int_equal(cursor, 0);
    assert_int_equal(moonlet_master_list_segments_page(m, NULL, 0, 0, seen_visit, &w, &cursor),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_master_list_segments_page(m, NULL, 0, 10001, seen_visit, &w, &cursor),
                     MOONLET_ERR_INVALID_PARAMS);
    free(v.hits);
    free(w.hits);
}

struct churn {
    moonlet_master *m;
    atomic_bool stop;
    atomic_int rounds;
};

static void *churn_main(void *arg)
{
    struct churn *ch = arg;
    char s[32];
    for (int i = 0; i < 100000 && !atomic_load(&ch->stop); i++) {
        snprintf(s, sizeof(s), "tmp%d", i % 300);
        moonlet_segment_desc d = {.client_id = "churner", .segment_id = s, .size = SEG_BYTES,
                                  .endpoint = "127.0.0.1:2", .protocol = "tcp"};
        if (moonlet_master_mount_segment(ch->m, &d) == MOONLET_OK && i % 3)
            moonlet_master_unmount_segment(ch->m, MOONLET_STR("churner"), MOONLET_STR(s));
        atomic_fetch_add(&ch->rounds, 1);
    }
    return NULL;
}

/* A listing paged while another thread mounts and unmounts other segments
 * sees each segment mounted throughout exactly once, pages crossing the
 * slots the churn reuses. */
static void test_list_segments_pages_under_churn(void **state)
{
    moonlet_master *m = *state;
    enum { N = 1200 };
    char c[32], s[32];
    for (int i = 0; i < N; i++) {
        snprintf(c, sizeof(c), "node%d", i);
        snprintf(s, sizeof(s), "seg%d", i);
        mountf(m, c, s, SEG_BYTES);
        if (i % 4 == 0) { /* holes the churn fills between the stable ones */
            snprintf(s, sizeof(s), "hole%d", i);
            mountf(m, c, s, SEG_BYTES);
            assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR(c), MOONLET_STR(s)),
                             MOONLET_OK);
        }
    }
    struct churn ch = {.m = m};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, churn_main, &ch), 0);
    for (int listing = 0; listing < 20; listing++) {
        struct seen v = {.hits = calloc(N, 1), .max = N};
        uint64_t cursor = 0;
        int pages = 0;
        do {
            assert_int_equal(moonlet_master_list_segments_page(m, NULL, cursor, 97, seen_visit,
                                                               &v, &cursor), MOONLET_OK);
            pages++;
        } while (cursor && pages < 1000);
        assert_true(pages > N / 97);
        for (int i = 0; i < N; i++)
            assert_int_equal(v.hits[i], 1);
        free(v.hits);
    }
    atomic_store(&ch.stop, true);
    pthread_join(th, NULL);
    assert_true(atomic_load(&ch.rounds) > 0);
}

MOONLET_TEST_MAIN("registry", NULL, NULL,
                  FIX_TEST(test_more_than_4096_segments),
                  FIX_TEST(test_churn_many_ids),
                  FIX_TEST(test_session_closed_many),
                  cmocka_unit_test(test_liveness_unmounts_only_dead),
                  cmocka_unit_test(test_liveness_unmount_spread_over_ticks),
                  FIX_TEST(test_liveness_held_after_promotion),
                  FIX_TEST(test_placement_most_full),
                  FIX_TEST(test_many_tenants),
                  FIX_TEST(test_list_segments_pages),
                  FIX_TEST(test_list_segments_pages_under_churn))
