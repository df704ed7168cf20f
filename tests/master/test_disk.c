/* Tests of the disk tier's metadata in the master (repair.c's demotions,
 * segment.c's disk segments and trims, object.c's announce), on a frozen
 * clock: puts never land on a disk segment; eviction demotes instead of
 * destroying, and the DRAM ranges are freed only when the node reports the
 * copy durable; a failed copy keeps the object in DRAM; a full demotion
 * queue drops instead of waiting; a full disk evicts its own coldest
 * objects; a freed disk extent is reused only after the node trimmed it,
 * and not while a reader's lease holds; a restarted node's announce brings
 * its objects back, refusing keys put again and taken extents. */
#include "../common/master_fixture.h"
#include "../common/test_main.h"
#include "alloc.h"
#include "disk_layout.h"
#include "moonlet/types.h"
#include "replicate.h"

#define MS MOONLET_NS_PER_MS
#define MIB (1ull << 20)
#define OBJ 1000ull /* bytes of every object here */

/* standby: the state a hot standby follows this master's records into
 * (NULL: none). */
static moonlet_master *disk_master(uint32_t demote_queue, moonlet_repl_state *standby)
{
    moonlet_master_config cfg = fix_config(16);
    cfg.lease_ttl_ms = 1000;
    cfg.client_live_ttl_ms = 1000ull * 1000 * 1000; /* no liveness expiry here */
    cfg.repair_timeout_ms = 5000;
    if (demote_queue)
        cfg.demote_queue = demote_queue;
    if (standby) {
        cfg.repl_emit = fix_repl_apply;
        cfg.repl_arg = standby;
    }
    return fix_master_of(&cfg, FIX_T0);
}

static const uint8_t wkey[16] = {1, 2, 3};

/* Client "n" mounts DRAM segment "a" (1 MiB) and, when disk_bytes, disk
 * segment "d" of that size. */
static void mount_node(moonlet_master *m, uint64_t disk_bytes)
{
    moonlet_segment_desc a = {.client_id = "n", .segment_id = "a", .size = MIB,
                              .endpoint = "10.0.0.1:1", .protocol = "tcp"};
    assert_int_equal(moonlet_master_mount_segment(m, &a), MOONLET_OK);
    if (!disk_bytes)
        return;
    moonlet_segment_desc d = {.client_id = "n", .segment_id = "d", .size = disk_bytes,
                              .endpoint = "10.0.0.1:2", .protocol = "tcp", .disk = true,
                              .write_key = wkey, .node_clock_ms = 1};
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_OK);
}

static void put(moonlet_master *m, const char *key)
{
    moonlet_master_put_opts po = {.replica_num = 1};
    assert_int_equal(moonlet_master_put_start_opts(m, MOONLET_STR(""), MOONLET_STR(key), OBJ, &po,
                                                   NULL, NULL),
                     MOONLET_OK);
    uint64_t ck = 0x1234;
    assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR(key), &ck), MOONLET_OK);
}

/* The extent a disk copy of `key` (default tenant) takes. */
static uint64_t footprint(const char *key)
{
    return moonlet_disk_footprint(
        moonlet_disk_key_bytes((uint32_t)strlen(MOONLET_DEFAULT_TENANT), (uint32_t)strlen(key)),
        OBJ);
}

/* The replicas GetReplicaList hands a reader (rc OBJECT_NOT_FOUND: none). */
static int replicas(moonlet_master *m, const char *key, struct fix_reps *rs)
{
    memset(rs, 0, sizeof(*rs));
    return moonlet_master_get_replica_list(m, MOONLET_STR(""), MOONLET_STR(key), NULL, NULL,
                                           fix_reps_visit, rs);
}

/* key's only replica is its disk copy, on segment d at offset. */
static void expect_on_disk(moonlet_master *m, const char *key, uint64_t offset)
{
    struct fix_reps rs;
    assert_int_equal(replicas(m, key, &rs), MOONLET_OK);
    assert_int_equal(rs.n, 1);
    assert_true(rs.disk[0]);
    assert_string_equal(rs.segs[0], "d");
    assert_int_equal(rs.off[0], offset);
}

/* The jobs node n fetches. */
static uint32_t fetch(moonlet_master *m, struct fix_jobs *js)
{
    return fix_repair_fetch(m, "n", js);
}

static int done(moonlet_master *m, uint64_t id, int32_t code)
{
    return moonlet_master_repair_done(m, MOONLET_STR("n"), 0, id, code, OBJ);
}

struct trims {
    uint64_t off[64], len[64];
    uint32_t n;
};

static void collect_trim(void *arg, uint64_t off, uint64_t len)
{
    struct trims *t = arg;
    t->off[t->n] = off;
    t->len[t->n++] = len;
}

/* DiskTrim of segment d: done[0..ndone) reported, the extents to trim next. */
static uint32_t trim(moonlet_master *m, uint64_t *done_offs, uint32_t ndone, struct trims *t)
{
    t->n = 0;
    assert_int_equal(moonlet_master_disk_trim(m, MOONLET_STR("n"), 0, MOONLET_STR("d"), done_offs,
                                              ndone, 64, collect_trim, t),
                     MOONLET_OK);
    return t->n;
}

/* Most tests run on disk_master(0, NULL) with node n's 8 MiB disk, their state;
 * the others make their own master and leave it there for teardown(). */
static int setup(void **state)
{
    moonlet_master *m = disk_master(0, NULL);
    mount_node(m, 8 * MIB);
    *state = m;
    return 0;
}

/* The test's master destroyed (also after a failure), the clock real again. */
static int teardown(void **state)
{
    moonlet_master_destroy(*state);
    moonlet_clock_set_fake(0);
    return 0;
}

/* Demotes every object eviction picks and completes the copies: returns
 * how many were demoted. */
static uint32_t demote_all(moonlet_master *m)
{
    moonlet_master_evict_now(m, 1.0);
    struct fix_jobs js;
    uint32_t n = fetch(m, &js);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(done(m, js.j[i].id, MOONLET_OK), MOONLET_OK);
    return n;
}

/* A disk segment counts apart and takes no put; a disk segment must be
 * whole blocks. */
static void test_disk_segment_takes_no_put(void **state)
{
    moonlet_master *m = *state;
    moonlet_segment_desc odd = {.client_id = "n", .segment_id = "d2", .size = 8 * MIB + 100,
                                .endpoint = "10.0.0.1:3", .protocol = "tcp", .disk = true,
                                .write_key = wkey, .node_clock_ms = 1};
    assert_int_equal(moonlet_master_mount_segment(m, &odd), MOONLET_ERR_INVALID_PARAMS);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.capacity, MIB);
    assert_int_equal(st.disk_capacity, 8 * MIB);
    assert_int_equal(st.disk_segments, 1);
    char k[16];
    for (int i = 0; i < 200; i++) { /* more than fit in DRAM: evicts, never places on d */
        snprintf(k, sizeof(k), "k%d", i);
        put(m, k);
        struct fix_reps rs;
        assert_int_equal(replicas(m, k, &rs), MOONLET_OK);
        assert_string_equal(rs.segs[0], "a");
        assert_false(rs.disk[0]);
    }
    assert_int_equal(fix_stats(m).disk_used, 0);
}

/* Eviction queues a demotion; the object stays readable from DRAM until
 * the copy is durable, then only its disk replica is listed and its DRAM
 * range is free. */
static void test_eviction_demotes(void **state)
{
    moonlet_master *m = *state;
    put(m, "k");
    uint64_t dram_used = fix_stats(m).used;
    assert_true(dram_used > 0);
    assert_int_equal(moonlet_master_evict_now(m, 1.0), 1);
    assert_int_equal(fix_stats(m).demotions_queued, 1);
    struct fix_reps rs;
    assert_int_equal(replicas(m, "k", &rs), MOONLET_OK);
    assert_int_equal(rs.n, 1);
    assert_false(rs.disk[0]);

    struct fix_jobs js;
    assert_int_equal(fetch(m, &js), 1);
    assert_true(js.j[0].demote);
    assert_true(js.j[0].target_disk);
    assert_string_equal(js.j[0].target_seg, "d");
    assert_string_equal(js.j[0].source_seg[0], "a");
    assert_string_equal(js.j[0].key, "k");
    assert_string_equal(js.j[0].tenant, MOONLET_DEFAULT_TENANT);
    assert_int_equal(js.j[0].target_offset % MOONLET_DISK_BLOCK, 0);
    assert_int_equal(fix_stats(m).disk_used, footprint("k"));
    assert_int_equal(replicas(m, "k", &rs), MOONLET_OK); /* still DRAM while copying */
    assert_false(rs.disk[0]);

    assert_int_equal(done(m, js.j[0].id, MOONLET_OK), MOONLET_OK);
    /* The reader above still holds its lease: the DRAM range waits for it. */
    assert_int_equal(fix_stats(m).used, dram_used);
    moonlet_clock_set_fake(FIX_T0 + 1001 * MS);
    moonlet_master_tick(m);
    expect_on_disk(m, "k", js.j[0].target_offset);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.used, dram_used - moonlet_alloc_rounded(OBJ));
    assert_int_equal(st.demotions, 1);
    assert_int_equal(st.demotion_bytes, OBJ);
    assert_int_equal(st.demotions_queued, 0);
    assert_int_equal(st.disk_objects, 1);
    assert_int_equal(st.objects, 1);
    /* A disk object is not DRAM's to evict: a pass finds nothing. */
    assert_int_equal(moonlet_master_evict_now(m, 1.0), 0);
    assert_int_equal(fetch(m, &js), 0);
}

/* A copy the node reports failed (or lets time out) keeps the object in
 * DRAM, and its disk extent goes back. */
static void test_failed_demotion_keeps_dram(void **state)
{
    moonlet_master *m = *state;
    put(m, "k");
    put(m, "j");
    moonlet_master_evict_now(m, 1.0);
    struct fix_jobs js;
    assert_int_equal(fetch(m, &js), 2);
    assert_int_equal(done(m, js.j[0].id, MOONLET_ERR_INTERNAL_ERROR), MOONLET_OK);
    moonlet_clock_set_fake(FIX_T0 + 6000 * MS); /* past the other's deadline */
    moonlet_master_tick(m);
    struct fix_reps rs;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(replicas(m, js.j[i].key, &rs), MOONLET_OK);
        assert_false(rs.disk[0]);
    }
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.demotions_failed, 2);
    assert_int_equal(st.demotions_queued, 0);
    assert_int_equal(st.demotions, 0);
    /* The extents wait out the jobs' deadlines and the grace (the node may
     * still be writing), then the node's trim, then are free. */
    struct trims t;
    assert_int_equal(trim(m, NULL, 0, &t), 0);
    moonlet_clock_set_fake(FIX_T0 + 120000 * MS);
    assert_int_equal(trim(m, NULL, 0, &t), 2);
    assert_int_equal(trim(m, t.off, t.n, &t), 0);
    assert_int_equal(fix_stats(m).disk_used, 0);
}

/* Eviction never waits for the disk: past demote_queue, objects are
 * destroyed (counted), the queued ones demoted. */
static void test_full_queue_drops(void **state)
{
    moonlet_master *m = disk_master(2, NULL);
    *state = m;
    mount_node(m, 8 * MIB);
    put(m, "k0");
    put(m, "k1");
    put(m, "k2");
    put(m, "k3");
    assert_int_equal(moonlet_master_evict_now(m, 1.0), 4);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.demotions_queued, 2);
    assert_int_equal(st.demotions_dropped, 2);
    assert_int_equal(st.objects, 2);
    struct fix_jobs js;
    assert_int_equal(fetch(m, &js), 2);
}

/* A full disk evicts its coldest objects for a demotion's room; the
 * victim's extent is reused only after the node trimmed it. */
static void test_full_disk_evicts_its_own(void **state)
{
    moonlet_master *m = disk_master(0, NULL);
    *state = m;
    mount_node(m, 2 * footprint("k0")); /* two extents */
    put(m, "k0");
    put(m, "k1");
    assert_int_equal(demote_all(m), 2);
    assert_int_equal(fix_stats(m).disk_objects, 2);
    moonlet_clock_set_fake(FIX_T0 + 10 * MS);
    put(m, "k2");
    moonlet_master_evict_now(m, 1.0);
    struct fix_jobs js;
    /* No room: the disk evicted one, but its extent waits for the trim. */
    assert_int_equal(fetch(m, &js), 0);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.disk_evictions, 1);
    assert_int_equal(st.demotions_dropped, 1); /* k2 evicted without a copy */
    struct fix_reps rs;
    assert_int_equal(replicas(m, "k2", &rs), MOONLET_ERR_OBJECT_NOT_FOUND);
    struct trims t;
    assert_int_equal(trim(m, NULL, 0, &t), 1);
    assert_int_equal(t.len[0], footprint("k0"));
    assert_int_equal(trim(m, t.off, t.n, &t), 0);
    /* Trimmed: the next demotion takes the extent. */
    put(m, "k3");
    moonlet_master_evict_now(m, 1.0);
    assert_int_equal(fetch(m, &js), 1);
    assert_string_equal(js.j[0].key, "k3");
    assert_int_equal(done(m, js.j[0].id, MOONLET_OK), MOONLET_OK);
    assert_int_equal(fix_stats(m).disk_objects, 2);
}

/* A disk object removed while a reader holds its lease: its extent is not
 * handed out for trimming (nor reused) before the lease ends. */
static void test_trim_waits_for_readers(void **state)
{
    moonlet_master *m = *state;
    put(m, "k");
    assert_int_equal(demote_all(m), 1);
    struct fix_reps rs;
    assert_int_equal(replicas(m, "k", &rs), MOONLET_OK); /* leases it for 1000 ms */
    assert_int_equal(moonlet_master_remove_ex(m, MOONLET_STR(""), MOONLET_STR("k"), true),
                     MOONLET_OK);
    struct trims t;
    uint64_t early = rs.off[0];
    assert_int_equal(trim(m, &early, 1, &t), 0); /* naming it early frees nothing */
    assert_int_equal(fix_stats(m).disk_used, footprint("k"));
    moonlet_clock_set_fake(FIX_T0 + 1001 * MS);
    assert_int_equal(trim(m, NULL, 0, &t), 1);
    assert_int_equal(t.off[0], rs.off[0]);
    assert_int_equal(trim(m, t.off, 1, &t), 0);
    assert_int_equal(fix_stats(m).disk_used, 0);
}

/* A restarted node's announce: objects back on their extents, readable
 * from disk; a key put again meanwhile, an extent taken or outside, and
 * another node's segment are refused. */
static void test_announce(void **state)
{
    moonlet_master *m = *state;
    put(m, "again");
    moonlet_disk_entry e[4] = {
        {MOONLET_STR(""), MOONLET_STR("x"), OBJ, 0x77, 0},
        {MOONLET_STR("t2"), MOONLET_STR("y"), OBJ, 0x78, 64 * 1024},
        {MOONLET_STR(""), MOONLET_STR("again"), OBJ, 0x79, 128 * 1024},
        {MOONLET_STR(""), MOONLET_STR("z"), OBJ, 0x7a, 4096}, /* overlaps x's extent */
    };
    int32_t codes[4];
    assert_int_equal(moonlet_master_disk_announce(m, MOONLET_STR("n"), 0, MOONLET_STR("d"), e, 4,
                                                  codes),
                     MOONLET_OK);
    assert_int_equal(codes[0], MOONLET_OK);
    assert_int_equal(codes[1], MOONLET_OK);
    assert_int_equal(codes[2], MOONLET_ERR_OBJECT_ALREADY_EXISTS);
    assert_int_equal(codes[3], MOONLET_ERR_NO_AVAILABLE_HANDLE);
    struct fix_reps rs;
    assert_int_equal(replicas(m, "x", &rs), MOONLET_OK);
    assert_true(rs.disk[0]);
    assert_int_equal(rs.off[0], 0);
    memset(&rs, 0, sizeof(rs));
    assert_int_equal(moonlet_master_get_replica_list(m, MOONLET_STR("t2"), MOONLET_STR("y"), NULL,
                                                     NULL, fix_reps_visit, &rs),
                     MOONLET_OK);
    assert_true(rs.disk[0]);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.disk_announced, 2);
    assert_int_equal(st.disk_objects, 2);
    /* DRAM segment "a" is not a disk; "d" is not another client's. */
    assert_int_equal(moonlet_master_disk_announce(m, MOONLET_STR("n"), 0, MOONLET_STR("a"), e, 1,
                                                  codes),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);
    moonlet_segment_desc o = {.client_id = "o", .segment_id = "oa", .size = MIB,
                              .endpoint = "10.0.0.2:1", .protocol = "tcp"};
    assert_int_equal(moonlet_master_mount_segment(m, &o), MOONLET_OK);
    assert_int_equal(moonlet_master_disk_announce(m, MOONLET_STR("o"), 0, MOONLET_STR("d"), e, 1,
                                                  codes),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);
}

/* The node's death takes its disk objects with its segments (they come back
 * with its announce); the DRAM watermark ignores the disk. */
static void test_unmount_takes_disk_objects(void **state)
{
    moonlet_master *m = *state;
    put(m, "k");
    assert_int_equal(demote_all(m), 1);
    assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR("n"), MOONLET_STR("d")),
                     MOONLET_OK);
    struct fix_reps rs;
    assert_int_equal(replicas(m, "k", &rs), MOONLET_ERR_OBJECT_NOT_FOUND);
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.disk_capacity, 0);
    assert_int_equal(st.disk_used, 0);
    assert_int_equal(st.objects, 0);
}

/* A node's disk tier figures from its Pings: shown with its disk segment
 * (not its DRAM one), summed over the nodes in Stats, replaced by its next
 * Ping (a short array's missing figures are 0), and out of the sums once
 * the master forgets the node. */
struct node_disk_seen {
    uint64_t disk_reads; /* UINT64_MAX: the disk segment had none */
    bool dram_has;
};

static void see_node_disk(void *arg, const moonlet_segment_view *v)
{
    struct node_disk_seen *s = arg;
    if (strcmp(v->segment_id, "d") == 0)
        s->disk_reads = v->node_disk ? v->node_disk[MOONLET_NODE_DISK_READS] : UINT64_MAX;
    else
        s->dram_has = s->dram_has || v->node_disk != NULL;
}

static void test_node_disk_figures(void **state)
{
    moonlet_master *m = *state;
    struct node_disk_seen seen = {0};
    assert_int_equal(moonlet_master_list_segments(m, see_node_disk, &seen), MOONLET_OK);
    assert_int_equal(seen.disk_reads, UINT64_MAX); /* no Ping with figures yet */
    uint64_t n1[MOONLET_NODE_DISK_NFIELDS] = {[MOONLET_NODE_DISK_READS] = 5,
                                              [MOONLET_NODE_DISK_IO_ERRORS] = 1,
                                              [MOONLET_NODE_DISK_QUEUE_DEPTH] = 64};
    moonlet_master_note_node_disk(m, MOONLET_STR("n"), n1, MOONLET_NODE_DISK_NFIELDS);
    /* a second node, bound to a connection, with no segment */
    assert_int_equal(moonlet_master_bind_client(m, MOONLET_STR("n2"), MOONLET_STR("s"), 9),
                     MOONLET_OK);
    uint64_t n2[] = {7, 0, 0, 2}; /* reads, read_errors, io_errors, checksum_errors */
    moonlet_master_note_node_disk(m, MOONLET_STR("n2"), n2, 4);
    moonlet_master_note_node_disk(m, MOONLET_STR("nobody"), n2, 4); /* unknown: nothing */
    moonlet_master_stats st = fix_stats(m);
    assert_int_equal(st.node_disk[MOONLET_NODE_DISK_READS], 12);
    assert_int_equal(st.node_disk[MOONLET_NODE_DISK_IO_ERRORS], 1);
    assert_int_equal(st.node_disk[MOONLET_NODE_DISK_CHECKSUM_ERRORS], 2);
    assert_int_equal(st.node_disk[MOONLET_NODE_DISK_QUEUE_DEPTH], 64);
    seen = (struct node_disk_seen){0};
    assert_int_equal(moonlet_master_list_segments(m, see_node_disk, &seen), MOONLET_OK);
    assert_int_equal(seen.disk_reads, 5);
    assert_false(seen.dram_has);
    /* the next Ping replaces the figures: a lower count too (a restarted node) */
    uint64_t again[] = {1};
    moonlet_master_note_node_disk(m, MOONLET_STR("n"), again, 1);
    st = fix_stats(m);
    assert_int_equal(st.node_disk[MOONLET_NODE_DISK_READS], 8);
    assert_int_equal(st.node_disk[MOONLET_NODE_DISK_IO_ERRORS], 0);
    assert_int_equal(st.node_disk[MOONLET_NODE_DISK_QUEUE_DEPTH], 0);
    /* n2's connection closes: the master forgets it and its figures */
    moonlet_master_session_closed(m, 9);
    st = fix_stats(m);
    assert_int_equal(st.node_disk[MOONLET_NODE_DISK_READS], 1);
    assert_int_equal(st.node_disk[MOONLET_NODE_DISK_CHECKSUM_ERRORS], 0);
}

/* A hot standby follows the disk tier through the record stream (each
 * record through the codec): after a promotion, the disk segment is a disk
 * segment again and the demoted object is read from its extent, which the
 * new leader does not place another demotion over. */
static void test_standby_follows_the_disk(void **state)
{
    moonlet_repl_state *st;
    assert_int_equal(moonlet_repl_state_create(&st), MOONLET_OK);
    moonlet_master *m = disk_master(0, st);
    *state = m;
    mount_node(m, 8 * MIB);
    put(m, "k");
    assert_int_equal(demote_all(m), 1);
    struct fix_reps was;
    assert_int_equal(replicas(m, "k", &was), MOONLET_OK);
    assert_true(was.disk[0]);
    moonlet_master_destroy(m);

    moonlet_master *p = disk_master(0, NULL);
    *state = p;
    uint64_t restored = 0;
    assert_int_equal(moonlet_repl_state_restore(st, p, &restored, NULL), MOONLET_OK);
    assert_int_equal(restored, 1);
    expect_on_disk(p, "k", was.off[0]);
    moonlet_master_stats sts = fix_stats(p);
    assert_int_equal(sts.disk_segments, 1);
    assert_int_equal(sts.disk_objects, 1);
    assert_int_equal(sts.disk_used, footprint("k"));
    assert_int_equal(sts.capacity, MIB); /* the disk is not DRAM */
    /* the next demotion lands elsewhere on the disk */
    put(p, "j");
    moonlet_master_evict_now(p, 1.0);
    struct fix_jobs js;
    assert_int_equal(fetch(p, &js), 1);
    assert_true(js.j[0].target_offset >= was.off[0] + footprint("k") ||
                js.j[0].target_offset + footprint("j") <= was.off[0]);
    moonlet_repl_state_destroy(st);
}

MOONLET_TEST_MAIN("disk", NULL, NULL,
                  cmocka_unit_test_setup_teardown(test_disk_segment_takes_no_put, setup, teardown),
                  cmocka_unit_test_setup_teardown(test_eviction_demotes, setup, teardown),
                  cmocka_unit_test_setup_teardown(test_failed_demotion_keeps_dram, setup, teardown),
                  cmocka_unit_test_teardown(test_full_queue_drops, teardown),
                  cmocka_unit_test_teardown(test_full_disk_evicts_its_own, teardown),
                  cmocka_unit_test_setup_teardown(test_trim_waits_for_readers, setup, teardown),
                  cmocka_unit_test_setup_teardown(test_announce, setup, teardown),
                  cmocka_unit_test_setup_teardown(test_unmount_takes_disk_objects, setup, teardown),
                  cmocka_unit_test_setup_teardown(test_node_disk_figures, setup, teardown),
                  cmocka_unit_test_teardown(test_standby_follows_the_disk, teardown))
