/*
 * Tests of the reservation pools (master/store/pool.c) on a frozen clock: a
 * leader with a hot standby sets ranges aside ahead of PutStarts and tells
 * the standby (RESV); a PutStart placed in a range the standby acknowledged
 * is "covered" (its reply need not wait for the standby); a standby promoted
 * before it heard of such a put's PLACE holds the range back for a put
 * timeout + grace, so the new leader never hands it to another put while
 * the old writer may still write; a PLACE ends the reservation it took, a
 * new size drains the pool (UNRESV), a snapshot carries the pool, bad RESV
 * records are refused.
 */
#include "../common/test_main.h"
#include "../common/master_fixture.h"
#include "alloc.h"
#include "replicate.h"

#define MS MOONLET_NS_PER_MS
#define SEG_BYTES (2u << 20) /* pools of 8 x 8 KiB fit its 1/32 */
#define OBJ 4096u
#define PUT_TIMEOUT_MS 10000u
#define GRACE_MS 2000u
#define MAX_RECS 4096

/* The leader's stream as the test sees it: every record, decoded and kept,
 * numbered from 1 like the log; `acked` plays the standby's ack. */
struct stream {
    moonlet_repl_decoded recs[MAX_RECS];
    uint8_t bytes[MAX_RECS][256];
    uint64_t n, acked;
};

static void emit(void *arg, const moonlet_repl_rec *rec)
{
    struct stream *s = arg;
    assert_true(s->n < MAX_RECS);
    size_t len = moonlet_repl_encode(rec, s->bytes[s->n], sizeof(s->bytes[0]));
    assert_true(len > 0);
    assert_int_equal(moonlet_repl_decode(s->bytes[s->n], len, &s->recs[s->n]), MOONLET_OK);
    s->n++;
}

static void pos(void *arg, uint64_t *next, uint64_t *acked)
{
    const struct stream *s = arg;
    *next = s->n + 1;
    *acked = s->acked;
}

static moonlet_master_config config(struct stream *s)
{
    moonlet_master_config cfg = fix_config(16);
    cfg.put_timeout_ms = PUT_TIMEOUT_MS;
    cfg.put_quarantine_grace_ms = GRACE_MS;
    if (s) {
        cfg.repl_emit = emit;
        cfg.repl_pos = pos;
        cfg.repl_arg = s;
    }
    return cfg;
}

static moonlet_master *leader(struct stream *s)
{
    moonlet_master_config cfg = config(s);
    moonlet_master *m = fix_master_of(&cfg, FIX_T0);
    fix_mount(m, "n0", "s0", SEG_BYTES);
    return m;
}

/* PutStart of key (one replica of size bytes): its offset, and whether it
 * was covered. */
static int put_start(moonlet_master *m, const char *key, uint64_t size, uint64_t *off,
                     bool *covered)
{
    struct fix_reps r = {0};
    moonlet_master_put_opts po = {.replica_num = 1, .covered = covered};
    int rc = moonlet_master_put_start_opts(m, MOONLET_STR(""), MOONLET_STR(key), size, &po,
                                           fix_reps_visit, &r);
    if (rc == MOONLET_OK) {
        assert_int_equal(r.n, 1);
        *off = r.off[0];
    }
    return rc;
}

/* A leader whose pool is filled and acknowledged: one uncovered PutStart
 * ("a", OBJ) filled it, then the standby acknowledged everything. */
static moonlet_master *warm_leader(struct stream *s)
{
    memset(s, 0, sizeof(*s));
    moonlet_master *m = leader(s);
    uint64_t off;
    bool covered = true;
    assert_int_equal(put_start(m, "a", OBJ, &off, &covered), MOONLET_OK);
    assert_false(covered);
    s->acked = s->n + 1;
    return m;
}

/* A test on a warm leader: the leader (NULL once the test destroyed it)
 * and its stream. */
struct warm {
    moonlet_master *a;
    struct stream s;
};

static int setup_warm(void **state)
{
    static struct warm w;
    w.a = warm_leader(&w.s);
    *state = &w;
    return 0;
}

static int teardown_warm(void **state)
{
    struct warm *w = *state;
    moonlet_master_destroy(w->a);
    return 0;
}

static int count_type(const struct stream *s, uint64_t from, uint8_t type)
{
    int n = 0;
    for (uint64_t i = from; i < s->n; i++)
        n += s->recs[i].rec.type == type;
    return n;
}

static bool resv_at(const struct stream *s, uint64_t from, uint8_t type, uint64_t off)
{
    for (uint64_t i = from; i < s->n; i++)
        if (s->recs[i].rec.type == type && s->recs[i].rec.rep_off[0] == off)
            return true;
    return false;
}

/* Applies records [from, to) of the stream to a standby's state. */
static void apply(moonlet_repl_state *st, const struct stream *s, uint64_t from, uint64_t to)
{
    for (uint64_t i = from; i < to; i++)
        assert_int_equal(moonlet_repl_state_apply(st, &s->recs[i].rec), MOONLET_OK);
}

/* The first PutStart waits (its pool is not acknowledged) and fills the
 * pool; once the standby acknowledged the RESVs, PutStarts are covered and
 * land in the reserved ranges; a pool at half refills. */
static void test_covered_once_acknowledged(void **state)
{
    (void)state;
    static struct stream s;
    memset(&s, 0, sizeof(s));
    moonlet_master *m = leader(&s);
    uint64_t off;
    bool covered = true;
    assert_int_equal(put_start(m, "a", OBJ, &off, &covered), MOONLET_OK);
    assert_false(covered);
    assert_int_equal(count_type(&s, 0, MOONLET_REPL_RESV), 8);
    assert_false(resv_at(&s, 0, MOONLET_REPL_RESV, off)); /* its own range is not pooled */

    /* RESVs sent but not acknowledged: still waits */
    uint64_t before = s.n;
    assert_int_equal(put_start(m, "b", OBJ, &off, &covered), MOONLET_OK);
    assert_false(covered);

    s.acked = s.n + 1;
    for (int i = 0; i < 4; i++) {
        char key[8];
        snprintf(key, sizeof(key), "c%d", i);
        uint64_t mark = s.n;
        assert_int_equal(put_start(m, key, OBJ, &off, &covered), MOONLET_OK);
        assert_true(covered);
        assert_true(resv_at(&s, 0, MOONLET_REPL_RESV, off));
        assert_int_equal(s.recs[s.n - 1].rec.type, MOONLET_REPL_PLACE);
        assert_int_equal(s.recs[s.n - 1].rec.rep_off[0], off);
        assert_int_equal(count_type(&s, mark, MOONLET_REPL_RESV), i == 3 ? 4 : 0);
    }
    assert_int_equal(count_type(&s, before, MOONLET_REPL_UNRESV), 0);
    assert_int_equal(fix_stats(m).put_starts_reserved, 4);
    /* pooled bytes are counted as used: 6 objects + 8 pooled ranges */
    assert_int_equal(fix_stats(m).used, (6 + 8) * moonlet_alloc_rounded(OBJ));
    moonlet_master_destroy(m);
}

/* Without cfg.repl_pos (a lone master, or no standby wiring) nothing is
 * reserved and nothing is covered. */
static void test_no_pool_without_positions(void **state)
{
    (void)state;
    static struct stream s;
    memset(&s, 0, sizeof(s));
    moonlet_master_config cfg = config(&s);
    cfg.repl_pos = NULL;
    moonlet_master *m = fix_master_of(&cfg, FIX_T0);
    fix_mount(m, "n0", "s0", SEG_BYTES);
    s.acked = 1000;
    uint64_t off;
    bool covered = true;
    for (int i = 0; i < 3; i++) {
        char key[8];
        snprintf(key, sizeof(key), "k%d", i);
        assert_int_equal(put_start(m, key, OBJ, &off, &covered), MOONLET_OK);
        assert_false(covered);
    }
    assert_int_equal(count_type(&s, 0, MOONLET_REPL_RESV), 0);
    assert_int_equal(fix_stats(m).used, 3 * moonlet_alloc_rounded(OBJ));
    moonlet_master_destroy(m);
}

/* The failover the reservation exists for: the leader answers a covered
 * PutStart and dies before its PLACE reaches the standby.  The promoted
 * standby holds the range back until a put timeout + grace from the
 * promotion: no put of the new leader lands there meanwhile (every free
 * range of the segment is tried), and the range is free again after. */
static void test_failover_holds_unannounced_put(void **state)
{
    struct warm *w = *state;
    uint64_t off;
    bool covered = false;
    uint64_t known = w->s.n; /* what the standby got */
    uint64_t lost_off;
    assert_int_equal(put_start(w->a, "lost", OBJ, &lost_off, &covered), MOONLET_OK);
    assert_true(covered);
    moonlet_master_destroy(w->a);
    w->a = NULL; /* dead: nothing for teardown_warm */

    moonlet_repl_state *st = NULL;
    assert_int_equal(moonlet_repl_state_create(&st), MOONLET_OK);
    apply(st, &w->s, 0, known);
    moonlet_repl_counts c;
    moonlet_repl_state_counts(st, &c);
    assert_int_equal(c.reserved, 8);
    assert_int_equal(c.objects, 1);

    moonlet_master_config cfg = config(NULL);
    moonlet_master *b = fix_master_of(&cfg, FIX_T0 + 100 * MS);
    uint64_t restored = 0;
    assert_int_equal(moonlet_repl_state_restore(st, b, &restored, NULL), MOONLET_OK);
    assert_int_equal(restored, 1);
    /* fill the segment: no put may get the lost put's range */
    int puts = 0;
    for (int i = 0; i < 1000; i++) {
        char key[16];
        snprintf(key, sizeof(key), "n%d", i);
        if (put_start(b, key, OBJ, &off, &covered) != MOONLET_OK)
            break;
        assert_true(off != lost_off);
        puts++;
    }
    /* of its 4 KiB ranges, the restored object and 8 reserved are out of reach */
    assert_int_equal(puts, SEG_BYTES / moonlet_alloc_rounded(OBJ) - 1 - 8);
    /* after the hold, the new leader may use the range again: its unfinished
     * puts time out and go to quarantine, so revoke them first */
    for (int i = 0; i < puts; i++) {
        char key[16];
        snprintf(key, sizeof(key), "n%d", i);
        assert_int_equal(moonlet_master_put_revoke(b, MOONLET_STR(""), MOONLET_STR(key)),
                         MOONLET_OK);
    }
    moonlet_clock_advance((PUT_TIMEOUT_MS + GRACE_MS - 1) * MS);
    assert_int_equal(put_start(b, "early", OBJ, &off, &covered), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    moonlet_clock_advance(2 * MS);
    bool got = false;
    for (int i = 0; i < 1000 && !got; i++) {
        char key[16];
        snprintf(key, sizeof(key), "m%d", i);
        if (put_start(b, key, OBJ, &off, &covered) != MOONLET_OK)
            break;
        got = off == lost_off;
    }
    assert_true(got);
    moonlet_master_destroy(b);
    moonlet_repl_state_destroy(st);
}

/* The standby's side: a PLACE in a reserved range ends its reservation (a
 * promotion restores the object there); UNRESV ends one; UNMOUNT ends all of
 * the segment's; a replayed RESV is no second reservation. */
static void test_standby_reservations(void **state)
{
    struct warm *w = *state;
    uint64_t off;
    bool covered;
    assert_int_equal(put_start(w->a, "b", OBJ, &off, &covered), MOONLET_OK);
    assert_true(covered);
    assert_int_equal(moonlet_master_put_end(w->a, MOONLET_STR(""), MOONLET_STR("b"), NULL),
                     MOONLET_OK);

    moonlet_repl_state *st = NULL;
    assert_int_equal(moonlet_repl_state_create(&st), MOONLET_OK);
    apply(st, &w->s, 0, w->s.n);
    apply(st, &w->s, 2, 3); /* a RESV again (of a range still pooled) */
    assert_int_equal(w->s.recs[2].rec.type, MOONLET_REPL_RESV);
    moonlet_repl_counts c;
    moonlet_repl_state_counts(st, &c);
    assert_int_equal(c.reserved, 7);
    assert_int_equal(c.sealed, 1);

    moonlet_master_config cfg = config(NULL);
    moonlet_master *b = fix_master_of(&cfg, FIX_T0);
    uint64_t restored = 0, skipped = 0;
    assert_int_equal(moonlet_repl_state_restore(st, b, &restored, &skipped), MOONLET_OK);
    assert_int_equal(restored, 2);
    assert_int_equal(skipped, 0);
    assert_int_equal(moonlet_master_get_replica_list(b, MOONLET_STR(""), MOONLET_STR("b"), NULL,
                                                     NULL, NULL, NULL),
                     MOONLET_OK);
    moonlet_master_destroy(b);

    moonlet_repl_rec un = {.type = MOONLET_REPL_UNRESV, .key = {"", 0},
                           .size = moonlet_alloc_rounded(OBJ), .nrep = 1};
    un.rep_seg[0] = MOONLET_STR("s0");
    un.rep_off[0] = w->s.recs[2].rec.rep_off[0];
    assert_int_equal(moonlet_repl_state_apply(st, &un), MOONLET_OK);
    assert_int_equal(moonlet_repl_state_apply(st, &un), MOONLET_OK); /* gone: a no-op */
    moonlet_repl_state_counts(st, &c);
    assert_int_equal(c.reserved, 6);

    moonlet_repl_rec um = {.type = MOONLET_REPL_UNMOUNT, .client_id = MOONLET_STR("n0"),
                           .segment_id = MOONLET_STR("s0")};
    assert_int_equal(moonlet_repl_state_apply(st, &um), MOONLET_OK);
    moonlet_repl_state_counts(st, &c);
    assert_int_equal(c.reserved, 0);
    moonlet_repl_state_destroy(st);
}

/* Puts of a new size miss the pool; the fourth in a row drains it (UNRESV
 * of every pooled range, then their space is free) and refills at the new
 * size. */
static void test_new_size_drains_pool(void **state)
{
    struct warm *w = *state;
    uint64_t off;
    bool covered;
    for (int i = 0; i < 3; i++) {
        char key[8];
        snprintf(key, sizeof(key), "b%d", i);
        uint64_t mark = w->s.n;
        assert_int_equal(put_start(w->a, key, 2 * OBJ, &off, &covered), MOONLET_OK);
        assert_false(covered);
        assert_int_equal(count_type(&w->s, mark, MOONLET_REPL_UNRESV), 0);
    }
    uint64_t mark = w->s.n;
    assert_int_equal(put_start(w->a, "b3", 2 * OBJ, &off, &covered), MOONLET_OK);
    assert_int_equal(count_type(&w->s, mark, MOONLET_REPL_UNRESV), 8);
    assert_int_equal(count_type(&w->s, mark, MOONLET_REPL_RESV), 8);
    for (uint64_t i = mark; i < w->s.n; i++)
        if (w->s.recs[i].rec.type == MOONLET_REPL_RESV)
            assert_int_equal(w->s.recs[i].rec.size, moonlet_alloc_rounded(2 * OBJ));
    /* the old size's UNRESVs all come before the new size's RESVs */
    uint64_t last_un = 0, first_resv = w->s.n;
    for (uint64_t i = mark; i < w->s.n; i++) {
        if (w->s.recs[i].rec.type == MOONLET_REPL_UNRESV)
            last_un = i;
        if (w->s.recs[i].rec.type == MOONLET_REPL_RESV && i < first_resv)
            first_resv = i;
    }
    assert_true(last_un < first_resv);
    /* 1 + 4 objects and the 8 new pooled ranges */
    assert_int_equal(fix_stats(w->a).used,
                     moonlet_alloc_rounded(OBJ) + 12 * moonlet_alloc_rounded(2 * OBJ));
}

/* A snapshot carries the pool (RESV after its segment's MOUNT), so a
 * standby that starts from one knows every range a covered put may use. */
static void test_snapshot_carries_pool(void **state)
{
    (void)state;
    static struct stream s, snap;
    memset(&s, 0, sizeof(s));
    memset(&snap, 0, sizeof(snap));
    moonlet_master *a = leader(&s);
    uint64_t off;
    bool covered;
    assert_int_equal(put_start(a, "a", OBJ, &off, &covered), MOONLET_OK);
    moonlet_master_snapshot(a, emit, &snap);
    assert_int_equal(snap.recs[0].rec.type, MOONLET_REPL_MOUNT);
    assert_int_equal(count_type(&snap, 0, MOONLET_REPL_RESV), 8);
    for (uint64_t i = 0; i < s.n; i++)
        if (s.recs[i].rec.type == MOONLET_REPL_RESV)
            assert_true(resv_at(&snap, 0, MOONLET_REPL_RESV, s.recs[i].rec.rep_off[0]));
    moonlet_repl_state *st = NULL;
    assert_int_equal(moonlet_repl_state_create(&st), MOONLET_OK);
    apply(st, &snap, 0, snap.n);
    moonlet_repl_counts c;
    moonlet_repl_state_counts(st, &c);
    assert_int_equal(c.reserved, 8);
    assert_int_equal(c.pending, 1);
    moonlet_repl_state_destroy(st);
    moonlet_master_destroy(a);
}

/* Bad RESV / UNRESV records: a key, several replicas, no size, a range past
 * the segment, an unknown segment. */
static void test_bad_reservations_refused(void **state)
{
    (void)state;
    moonlet_repl_rec r = {.type = MOONLET_REPL_RESV, .key = {"k", 1}, .size = 64, .nrep = 1};
    r.rep_seg[0] = MOONLET_STR("s0");
    uint8_t buf[256];
    moonlet_repl_decoded d;
    size_t len = moonlet_repl_encode(&r, buf, sizeof(buf));
    assert_true(len > 0);
    assert_int_equal(moonlet_repl_decode(buf, len, &d), MOONLET_ERR_INVALID_PARAMS);
    r.key = (moonlet_str){"", 0};
    r.nrep = 2;
    r.rep_seg[1] = MOONLET_STR("s1");
    len = moonlet_repl_encode(&r, buf, sizeof(buf));
    assert_int_equal(moonlet_repl_decode(buf, len, &d), MOONLET_ERR_INVALID_PARAMS);
    r.nrep = 1;
    len = moonlet_repl_encode(&r, buf, sizeof(buf));
    assert_int_equal(moonlet_repl_decode(buf, len, &d), MOONLET_OK);
    assert_int_equal(d.rec.type, MOONLET_REPL_RESV);
    assert_int_equal(d.rec.size, 64);

    static struct stream s;
    memset(&s, 0, sizeof(s));
    moonlet_master *a = leader(&s);
    moonlet_repl_state *st = NULL;
    assert_int_equal(moonlet_repl_state_create(&st), MOONLET_OK);
    apply(st, &s, 0, s.n); /* the MOUNT */
    r.size = 0;
    assert_int_equal(moonlet_repl_state_apply(st, &r), MOONLET_ERR_INVALID_PARAMS);
    r.size = 64;
    r.rep_off[0] = SEG_BYTES - 32;
    assert_int_equal(moonlet_repl_state_apply(st, &r), MOONLET_ERR_INVALID_PARAMS);
    r.rep_off[0] = 0;
    r.rep_seg[0] = MOONLET_STR("nope");
    assert_int_equal(moonlet_repl_state_apply(st, &r), MOONLET_ERR_SEGMENT_NOT_FOUND);
    moonlet_repl_counts c;
    moonlet_repl_state_counts(st, &c);
    assert_int_equal(c.reserved, 0);
    moonlet_repl_state_destroy(st);
    moonlet_master_destroy(a);
}

MOONLET_TEST_MAIN("master_pool", NULL, NULL,
                  cmocka_unit_test(test_covered_once_acknowledged),
                  cmocka_unit_test(test_no_pool_without_positions),
                  cmocka_unit_test_setup_teardown(test_failover_holds_unannounced_put, setup_warm,
                                                  teardown_warm),
                  cmocka_unit_test_setup_teardown(test_standby_reservations, setup_warm,
                                                  teardown_warm),
                  cmocka_unit_test_setup_teardown(test_new_size_drains_pool, setup_warm,
                                                  teardown_warm),
                  cmocka_unit_test(test_snapshot_carries_pool),
                  cmocka_unit_test(test_bad_reservations_refused))
