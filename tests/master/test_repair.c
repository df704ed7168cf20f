/* Tests of re-replication and drain (master/store/repair.c), on a frozen clock:
 * a segment drop queues the objects that lost a replica, the target is on
 * another host than the surviving replicas, the new replica is readable only
 * after RepairDone, a removal mid-repair sends the target range to
 * quarantine, failed and timed-out jobs are retried with backoff and given
 * up after repair_max_attempts, and a drained segment's objects move. */
#include "../common/master_fixture.h"
#include "../common/test_main.h"

#define MS MOONLET_NS_PER_MS

/* repl_emit: a hot standby's record sink (NULL: none). */
static moonlet_master *repair_master_with(uint32_t concurrency, uint64_t bandwidth,
                                          void (*repl_emit)(void *, const moonlet_repl_rec *),
                                          void *repl_arg)
{
    moonlet_master_config cfg;
    moonlet_master_config_default(&cfg);
    cfg.shards = 16;
    cfg.lease_ttl_ms = 1000;
    cfg.background = false;
    cfg.client_live_ttl_ms = 1000ull * 1000 * 1000; /* no liveness expiry here */
    cfg.repair_concurrency = concurrency;
    cfg.repair_timeout_ms = 5000;
    cfg.repair_max_attempts = 3;
    if (bandwidth)
        cfg.repair_bandwidth = bandwidth;
    cfg.repl_emit = repl_emit;
    cfg.repl_arg = repl_arg;
    moonlet_clock_set_fake(FIX_T0);
    moonlet_master *m = NULL;
    assert_int_equal(moonlet_master_create(&cfg, &m), MOONLET_OK);
    return m;
}

static moonlet_master *repair_master_bw(uint32_t concurrency, uint64_t bandwidth)
{
    return repair_master_with(concurrency, bandwidth, NULL, NULL);
}

static moonlet_master *repair_master(uint32_t concurrency)
{
    return repair_master_bw(concurrency, 0);
}

/* Client "c-<seg>" mounts segment <seg> at endpoint ep. */
static void mount_at(moonlet_master *m, const char *seg, const char *ep)
{
    char client[32];
    snprintf(client, sizeof(client), "c-%s", seg);
    moonlet_segment_desc d = {.client_id = client, .segment_id = seg, .name = seg, .base = 0,
                              .size = 1 << 20, .endpoint = ep, .protocol = "tcp"};
    assert_int_equal(moonlet_master_mount_segment(m, &d), MOONLET_OK);
}

/* Segments a and b, each on its own host, and a third, seg at ep. */
static void mount_ab_and(moonlet_master *m, const char *seg, const char *ep)
{
    mount_at(m, "a", "10.0.0.1:1");
    mount_at(m, "b", "10.0.0.2:1");
    mount_at(m, seg, ep);
}

static void put_on(moonlet_master *m, const char *key, const char *s1, const char *s2)
{
    moonlet_str pref[] = {MOONLET_STR(s1), MOONLET_STR(s2)};
    moonlet_master_put_opts po = {.replica_num = 2, .preferred = pref, .npreferred = 2};
    uint64_t ck = 0x1234;
    fix_put_opts(m, key, 1000, &po, &ck, NULL);
}

/* k removed (forced or not) and put again on b and c, same key and size;
 * "other" put first keeps the tenant (and so k's hash) as it is. */
static void reput_k(moonlet_master *m, bool force)
{
    put_on(m, "other", "b", "c");
    assert_int_equal(moonlet_master_remove_ex(m, MOONLET_STR(""), MOONLET_STR("k"), force),
                     MOONLET_OK);
    put_on(m, "k", "b", "c");
}

/* The jobs client "c-<seg>" fetches; each one's target is a fresh replica
 * (INITIALIZED) until RepairDone. */
static uint32_t fetch(moonlet_master *m, const char *seg, struct fix_jobs *js)
{
    char client[32];
    snprintf(client, sizeof(client), "c-%s", seg);
    fix_repair_fetch(m, client, js);
    for (uint32_t i = 0; i < js->n; i++)
        assert_int_equal(js->j[i].target_status, MOONLET_REPLICA_INITIALIZED);
    return js->n;
}

static int done(moonlet_master *m, const char *seg, uint64_t id, int32_t code)
{
    char client[32];
    snprintf(client, sizeof(client), "c-%s", seg);
    return moonlet_master_repair_done(m, MOONLET_STR(client), 0, id, code, 1000);
}

static uint32_t readable(moonlet_master *m, const char *key)
{
    moonlet_key_view v;
    assert_int_equal(moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR(key), &v, NULL,
                                                NULL),
                     MOONLET_OK);
    return v.readable_replicas;
}

static void count(void *arg, const moonlet_replica_view *r)
{
    (void)r;
    (*(uint32_t *)arg)++;
}

/* Replicas GetReplicaList hands a reader. */
static uint32_t listed(moonlet_master *m, const char *key)
{
    uint32_t n = 0;
    assert_int_equal(moonlet_master_get_replica_list(m, MOONLET_STR(""), MOONLET_STR(key), NULL,
                                                     NULL, count, &n),
                     MOONLET_OK);
    return n;
}

static moonlet_master_stats stats(moonlet_master *m)
{
    moonlet_master_stats st;
    moonlet_master_get_stats(m, &st);
    return st;
}

static size_t host_len(const char *ep) { return (size_t)(strrchr(ep, ':') - ep); }

/* A master with segments a, b and c, each on its own host. */
static moonlet_master *three_hosts_bw(uint32_t concurrency, uint64_t bandwidth)
{
    moonlet_master *m = repair_master_bw(concurrency, bandwidth);
    mount_ab_and(m, "c", "10.0.0.3:1");
    return m;
}

static moonlet_master *three_hosts(uint32_t concurrency)
{
    return three_hosts_bw(concurrency, 0);
}

static void end_test(moonlet_master *m)
{
    moonlet_master_destroy(m);
    moonlet_clock_set_fake(0);
}

/* Client "c-<seg>" unmounts segment <seg>. */
static void unmount(moonlet_master *m, const char *seg)
{
    char client[32];
    snprintf(client, sizeof(client), "c-%s", seg);
    assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR(client), MOONLET_STR(seg)),
                     MOONLET_OK);
}

/* Keys k0 .. k<n-1>, each put on s1 and s2. */
static void put_keys(moonlet_master *m, int n, const char *s1, const char *s2)
{
    char k[16];
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        put_on(m, k, s1, s2);
    }
}

/* Each of k0 .. k<n-1> has `want` readable replicas. */
static void expect_readable(moonlet_master *m, int n, uint32_t want)
{
    char k[16];
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        assert_int_equal(readable(m, k), want);
    }
}

/* GetReplicaList hands a reader `want` replicas of each of k0 .. k<n-1>. */
static void expect_listed(moonlet_master *m, int n, uint32_t want)
{
    char k[16];
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        assert_int_equal(listed(m, k), want);
    }
}

/* A drop queues the objects that lost a replica; the new replica is on
 * another host than the survivor (not on the survivor's host's other
 * segment), and readable only after RepairDone. */
static void test_drop_queues_and_repairs(void **state)
{
    (void)state;
    moonlet_master *m = repair_master(16);
    mount_ab_and(m, "b2", "10.0.0.2:2"); /* the survivor's host: never a target */
    mount_at(m, "d", "10.0.0.4:1");
    put_keys(m, 10, "a", "b");
    put_on(m, "other", "b2", "d"); /* loses nothing */
    assert_int_equal(stats(m).under_replicated, 0);
    unmount(m, "a");
    moonlet_master_stats st = stats(m);
    assert_int_equal(st.under_replicated, 10);
    assert_int_equal(st.repairs_queued, 10);
    assert_int_equal(readable(m, "k0"), 1);

    moonlet_master_tick(m);
    st = stats(m);
    assert_int_equal(st.repairs_running, 10);
    struct fix_jobs js;
    assert_int_equal(fetch(m, "b", &js), 0);
    assert_int_equal(fetch(m, "b2", &js), 0);
    assert_int_equal(fetch(m, "d", &js), 10);
    for (uint32_t i = 0; i < js.n; i++) {
        struct fix_job *j = &js.j[i];
        assert_string_equal(j->target_seg, "d");
        assert_int_equal(j->nsources, 1);
        assert_true(j->has_checksum);
        assert_int_equal(j->checksum, 0x1234);
        assert_int_equal(j->size, 1000);
        assert_false(host_len(j->source_ep[0]) == host_len(j->target_ep) &&
                     memcmp(j->source_ep[0], j->target_ep, host_len(j->target_ep)) == 0);
    }
    /* fetched once: a second fetch gets nothing */
    struct fix_jobs again;
    assert_int_equal(fetch(m, "d", &again), 0);
    /* not readable before RepairDone */
    expect_readable(m, 10, 1);
    expect_listed(m, 10, 1);
    /* RepairDone from another node than the target: refused */
    assert_int_equal(done(m, "b", js.j[0].id, 0), MOONLET_ERR_OBJECT_NOT_FOUND);
    for (uint32_t i = 0; i < js.n; i++)
        assert_int_equal(done(m, "d", js.j[i].id, 0), MOONLET_OK);
    expect_readable(m, 10, 2);
    expect_listed(m, 10, 2);
    /* the job's lease on the source ended with it: one lease TTL at most */
    assert_true(fix_lease(m, "k0") <= 1000);
    st = stats(m);
    assert_int_equal(st.under_replicated, 0);
    assert_int_equal(st.repairs_done, 10);
    assert_int_equal(st.repair_bytes, 10 * 1000);
    assert_int_equal(st.repairs_running, 0);
    /* a done job cannot be reported twice */
    assert_int_equal(done(m, "d", js.j[0].id, 0), MOONLET_ERR_OBJECT_NOT_FOUND);
    end_test(m);
}

/* The concurrency limit holds jobs back; the rest start as jobs finish. */
static void test_concurrency_limit(void **state)
{
    (void)state;
    moonlet_master *m = three_hosts(3);
    put_keys(m, 7, "a", "b");
    unmount(m, "a");
    moonlet_master_tick(m);
    assert_int_equal(stats(m).repairs_running, 3);
    assert_int_equal(stats(m).repairs_queued, 4);
    uint32_t total = 0;
    for (int round = 0; round < 5 && total < 7; round++) {
        struct fix_jobs js;
        fetch(m, "c", &js);
        assert_true(js.n <= 3);
        for (uint32_t i = 0; i < js.n; i++)
            assert_int_equal(done(m, "c", js.j[i].id, 0), MOONLET_OK);
        total += js.n;
    }
    assert_int_equal(total, 7);
    assert_int_equal(stats(m).under_replicated, 0);
    end_test(m);
}

/* Three hosts, key k on a and b, a unmounted: the one repair job (target
 * on c) is started. */
static moonlet_master *started_repair_job(void)
{
    moonlet_master *m = three_hosts(16);
    put_on(m, "k", "a", "b");
    unmount(m, "a");
    moonlet_master_tick(m);
    return m;
}

/* started_repair_job(), the job fetched into js. */
static moonlet_master *one_repair_job(struct fix_jobs *js)
{
    moonlet_master *m = started_repair_job();
    assert_int_equal(fetch(m, "c", js), 1);
    return m;
}

/* A removal mid-repair: a plain Remove is not refused (the job holds no
 * lease: to its user the object is like any other), RepairDone finds no
 * object, the target range goes to quarantine and comes back after the
 * job's deadline + the grace, the source's at once. */
static void test_removal_mid_repair(void **state)
{
    (void)state;
    struct fix_jobs js;
    moonlet_master *m = one_repair_job(&js);
    uint64_t used = stats(m).used; /* the source on b and the target on c */
    assert_int_equal(moonlet_master_remove(m, MOONLET_STR(""), MOONLET_STR("k")), MOONLET_OK);
    assert_int_equal(done(m, "c", js.j[0].id, 0), MOONLET_ERR_OBJECT_NOT_FOUND);
    moonlet_master_stats st = stats(m);
    assert_int_equal(st.repairs_dropped, 1);
    assert_int_equal(st.under_replicated, 0);
    assert_true(st.used < used);                /* the source's range is back */
    assert_int_equal(st.quarantined, st.used); /* the target's is not yet */
    assert_true(st.quarantined > 0);
    moonlet_clock_advance(5000 * MS + 2000 * MS + 1);
    moonlet_master_tick(m);
    st = stats(m);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.used, 0);
    end_test(m);
}

/* The key removed and put again mid-repair: the job's copy holds the old
 * object's bytes, so RepairDone must not attach it to the new object, even
 * where the new one lacks a replica (here: one of its two segments went). */
static void test_reput_mid_repair(void **state)
{
    (void)state;
    struct fix_jobs js;
    moonlet_master *m = one_repair_job(&js); /* k on a and b, a gone, target on c */
    reput_k(m, true);
    unmount(m, "b");          /* the new object: one replica of two, on c */
    assert_int_equal(readable(m, "k"), 1);
    assert_int_equal(done(m, "c", js.j[0].id, 0), MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(readable(m, "k"), 1);
    assert_int_equal(listed(m, "k"), 1);
    assert_int_equal(stats(m).repairs_dropped, 1);
    end_test(m);
}

/* A job whose object was removed is not handed out by RepairFetch. */
static void test_removed_before_fetch(void **state)
{
    (void)state;
    moonlet_master *m = started_repair_job();
    reput_k(m, false);
    struct fix_jobs js;
    assert_int_equal(fetch(m, "c", &js), 0);
    assert_int_equal(stats(m).repairs_dropped, 1);
    end_test(m);
}

/* Failures retry with backoff, and at most repair_max_attempts times. */
static void test_failures_bounded(void **state)
{
    (void)state;
    struct fix_jobs js;
    moonlet_master *m = one_repair_job(&js);
    assert_int_equal(done(m, "c", js.j[0].id, MOONLET_ERR_INVALID_READ), MOONLET_OK);
    assert_int_equal(stats(m).repairs_retried, 1);
    /* in backoff: nothing starts */
    moonlet_master_tick(m);
    assert_int_equal(fetch(m, "c", &js), 0);
    moonlet_clock_advance(1000 * MS);
    moonlet_master_tick(m);
    assert_int_equal(fetch(m, "c", &js), 1);
    /* the second attempt times out (not reported by its deadline) */
    moonlet_clock_advance(5000 * MS);
    moonlet_master_tick(m);
    assert_int_equal(stats(m).repairs_retried, 2);
    assert_int_equal(stats(m).repairs_running, 0);
    assert_int_equal(done(m, "c", js.j[0].id, 0), MOONLET_ERR_OBJECT_NOT_FOUND);
    moonlet_clock_advance(2000 * MS);
    moonlet_master_tick(m);
    assert_int_equal(fetch(m, "c", &js), 1);
    assert_int_equal(done(m, "c", js.j[0].id, MOONLET_ERR_TRANSFER_FAIL), MOONLET_OK);
    moonlet_master_stats st = stats(m);
    assert_int_equal(st.repairs_failed, 1); /* third attempt: given up */
    assert_int_equal(st.under_replicated, 0);
    assert_int_equal(st.repairs_queued, 0);
    for (int i = 0; i < 5; i++) {
        moonlet_clock_advance(30000 * MS);
        moonlet_master_tick(m);
        assert_int_equal(fetch(m, "c", &js), 0);
    }
    assert_int_equal(readable(m, "k"), 1);
    /* every target range came back */
    assert_int_equal(stats(m).quarantined, 0);
    end_test(m);
}

/* No segment on another host: another segment of the survivor's host
 * (PutStart's rule); none at all: retried, then given up (bounded). */
static void test_no_other_host(void **state)
{
    (void)state;
    moonlet_master *m = repair_master(16);
    mount_ab_and(m, "b2", "10.0.0.2:2");
    put_on(m, "k", "a", "b");
    put_on(m, "k2", "a", "b");
    unmount(m, "a");
    moonlet_master_tick(m);
    struct fix_jobs js;
    assert_int_equal(fetch(m, "b2", &js), 2);
    assert_int_equal(done(m, "b2", js.j[0].id, 0), MOONLET_OK);
    assert_int_equal(done(m, "b2", js.j[1].id, 0), MOONLET_OK);
    assert_int_equal(readable(m, "k"), 2);
    /* now b2 goes too: b holds the only replica and no segment is left */
    unmount(m, "b2");
    assert_int_equal(stats(m).under_replicated, 2);
    for (int i = 0; i < 4; i++) {
        moonlet_master_tick(m);
        assert_int_equal(fetch(m, "b", &js), 0);
        moonlet_clock_advance(30000 * MS);
    }
    moonlet_master_stats st = stats(m);
    assert_int_equal(st.repairs_failed, 2);
    assert_int_equal(st.under_replicated, 0);
    assert_int_equal(readable(m, "k"), 1);
    end_test(m);
}

/* The target segment goes away mid-copy: the job is dropped. */
static void test_target_unmounted(void **state)
{
    (void)state;
    struct fix_jobs js;
    moonlet_master *m = one_repair_job(&js);
    unmount(m, "c");
    /* no longer its target's: refused; the next tick ends the job (before
     * its deadline) and the object waits for another target */
    assert_int_equal(done(m, "c", js.j[0].id, 0), MOONLET_ERR_OBJECT_NOT_FOUND);
    moonlet_master_tick(m);
    moonlet_master_stats st = stats(m);
    assert_int_equal(st.repairs_running, 0);
    assert_int_equal(st.repairs_dropped, 1);
    assert_int_equal(st.under_replicated, 1);
    assert_int_equal(readable(m, "k"), 1);
    assert_int_equal(listed(m, "k"), 1);
    /* a new node: after the backoff the object gets a target there */
    mount_at(m, "d", "10.0.0.4:1");
    moonlet_master_tick(m);
    assert_int_equal(fetch(m, "d", &js), 0); /* still in backoff */
    moonlet_clock_advance(1000 * MS);
    moonlet_master_tick(m);
    assert_int_equal(fetch(m, "d", &js), 1);
    assert_int_equal(done(m, "d", js.j[0].id, 0), MOONLET_OK);
    assert_int_equal(readable(m, "k"), 2);
    end_test(m);
}

static void put_sized(moonlet_master *m, const char *key, uint64_t size)
{
    moonlet_str pref[] = {MOONLET_STR("a"), MOONLET_STR("b")};
    moonlet_master_put_opts po = {.replica_num = 2, .preferred = pref, .npreferred = 2};
    fix_put_opts(m, key, size, &po, NULL, NULL);
}

/* Objects under a read lease are repaired first. */
static void test_leased_first(void **state)
{
    (void)state;
    moonlet_master *m = three_hosts(1);
    put_sized(m, "cold1", 1000); /* queued first ... */
    put_sized(m, "cold2", 1000);
    put_sized(m, "hot", 3000);
    assert_int_equal(moonlet_master_get_replica_list(m, MOONLET_STR(""), MOONLET_STR("hot"), NULL,
                                                     NULL, NULL, NULL),
                     MOONLET_OK); /* ... but this one is being read */
    unmount(m, "a");
    moonlet_master_tick(m);
    struct fix_jobs js;
    assert_int_equal(fetch(m, "c", &js), 1);
    assert_int_equal(js.j[0].size, 3000);
    end_test(m);
}

/* --repair-bandwidth: jobs start only while the byte budget (one second of
 * burst) is positive; it refills with the clock. */
static void test_bandwidth_limit(void **state)
{
    (void)state;
    moonlet_master *m = three_hosts_bw(16, 1000);
    char k[16];
    for (int i = 0; i < 4; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        put_sized(m, k, 1000);
    }
    unmount(m, "a");
    moonlet_master_tick(m);
    assert_int_equal(stats(m).repairs_running, 1); /* 1000 bytes: the burst */
    moonlet_master_tick(m);
    assert_int_equal(stats(m).repairs_running, 1);
    moonlet_clock_advance(500 * MS); /* +500: positive again */
    moonlet_master_tick(m);
    assert_int_equal(stats(m).repairs_running, 2);
    moonlet_clock_advance(100 * MS); /* -400: not yet */
    moonlet_master_tick(m);
    assert_int_equal(stats(m).repairs_running, 2);
    moonlet_clock_advance(1000 * MS);
    moonlet_master_tick(m);
    assert_int_equal(stats(m).repairs_running, 3);
    assert_int_equal(stats(m).repairs_queued, 1);
    end_test(m);
}

struct placed {
    char seg[8][32];
    uint32_t n;
};

static void place_collect(void *arg, const moonlet_replica_view *v)
{
    struct placed *p = arg;
    snprintf(p->seg[p->n++], sizeof(p->seg[0]), "%s", v->segment_name);
}

struct seg_objs {
    uint64_t a_objects;
    bool a_draining;
};

static void seg_visit(void *arg, const moonlet_segment_view *s)
{
    struct seg_objs *so = arg;
    if (strcmp(s->name, "a") == 0) {
        so->a_objects = s->objects;
        so->a_draining = s->draining;
    }
}

/* Drain: no new put lands there, its objects get a replica elsewhere that
 * replaces theirs, and the segment empties. */
static void test_drain(void **state)
{
    (void)state;
    moonlet_master *m = three_hosts(16);
    put_keys(m, 5, "a", "b");
    uint32_t n = 0;
    assert_int_equal(moonlet_master_drain(m, MOONLET_STR("nope"), true, &n),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);
    assert_int_equal(moonlet_master_drain(m, MOONLET_STR("c-a"), true, &n), MOONLET_OK);
    assert_int_equal(n, 1);
    assert_int_equal(stats(m).under_replicated, 5);
    /* a new put avoids the draining segment even when asked for it */
    moonlet_str pref[] = {MOONLET_STR("a")};
    moonlet_master_put_opts po = {.replica_num = 2, .preferred = pref, .npreferred = 1};
    struct placed placed = {.n = 0};
    assert_int_equal(moonlet_master_put_start_opts(m, MOONLET_STR(""), MOONLET_STR("new"), 100,
                                                   &po, place_collect, &placed),
                     MOONLET_OK);
    for (uint32_t i = 0; i < placed.n; i++)
        assert_string_not_equal(placed.seg[i], "a");
    assert_int_equal(moonlet_master_put_end(m, MOONLET_STR(""), MOONLET_STR("new"), NULL),
                     MOONLET_OK);
    /* still readable from the draining segment meanwhile */
    assert_int_equal(listed(m, "k0"), 2);
    moonlet_master_tick(m);
    struct fix_jobs js;
    assert_int_equal(fetch(m, "c", &js), 5);
    for (uint32_t i = 0; i < js.n; i++) {
        assert_int_equal(js.j[i].nsources, 2);
        assert_int_equal(done(m, "c", js.j[i].id, 0), MOONLET_OK);
    }
    expect_readable(m, 5, 2);
    struct seg_objs so = {99, false};
    assert_int_equal(moonlet_master_list_segments(m, seg_visit, &so), MOONLET_OK);
    assert_int_equal(so.a_objects, 0);
    assert_true(so.a_draining);
    assert_int_equal(stats(m).under_replicated, 0);
    /* unmounting the drained segment loses nothing and queues nothing */
    unmount(m, "a");
    expect_readable(m, 5, 2);
    assert_int_equal(stats(m).under_replicated, 0);
    end_test(m);
}

/* Undrain: placement uses the segment again and queued repairs drop. */
static void test_undrain(void **state)
{
    (void)state;
    moonlet_master *m = three_hosts(16);
    put_on(m, "k", "a", "b");
    assert_int_equal(moonlet_master_drain(m, MOONLET_STR("a"), true, NULL), MOONLET_OK);
    assert_int_equal(moonlet_master_drain(m, MOONLET_STR("a"), false, NULL), MOONLET_OK);
    moonlet_master_tick(m);
    struct fix_jobs js;
    assert_int_equal(fetch(m, "c", &js), 0);
    assert_int_equal(stats(m).under_replicated, 0);
    assert_int_equal(readable(m, "k"), 2);
    end_test(m);
}

/* With a hot standby (cfg.repl_emit), a job's target range goes out as a
 * QUAR record held until the job's deadline plus the quarantine grace, and
 * a snapshot taken while the job runs holds it too: a standby promoted
 * meanwhile never places a put where the old leader's copy may still be
 * writing.  The snapshot after RepairDone no longer names it. */
struct quars {
    uint32_t n;
    char seg[8][32];
    uint64_t size[8], free_ms[8];
};

static void quar_capture(void *arg, const moonlet_repl_rec *rec)
{
    struct quars *q = arg;
    if (rec->type != MOONLET_REPL_QUAR || q->n == 8)
        return;
    snprintf(q->seg[q->n], sizeof(q->seg[0]), "%.*s", (int)rec->rep_seg[0].len,
             rec->rep_seg[0].ptr);
    q->size[q->n] = rec->size;
    q->free_ms[q->n++] = rec->free_ms;
}

/* A master whose replication records go to repl_emit, with segments a, b
 * and `seg` (at endpoint ep) and key k put on a and b. */
static moonlet_master *k_streamed(void (*repl_emit)(void *, const moonlet_repl_rec *), void *arg,
                                  const char *seg, const char *ep)
{
    moonlet_master *m = repair_master_with(16, 0, repl_emit, arg);
    mount_ab_and(m, seg, ep);
    put_on(m, "k", "a", "b");
    return m;
}

static void test_standby_holds_target(void **state)
{
    (void)state;
    struct quars stream = {0};
    moonlet_master *m = k_streamed(quar_capture, &stream, "d", "10.0.0.4:1");
    assert_int_equal(moonlet_master_unmount_segment(m, MOONLET_STR("c-a"), MOONLET_STR("a")),
                     MOONLET_OK);
    assert_int_equal(stream.n, 0);
    moonlet_master_tick(m);
    assert_int_equal(stream.n, 1);
    assert_string_equal(stream.seg[0], "d");
    assert_int_equal(stream.size[0], 1000);
    assert_int_equal(stream.free_ms[0], 5000 + 2000);

    struct quars snap = {0};
    moonlet_master_snapshot(m, quar_capture, &snap);
    assert_int_equal(snap.n, 1);
    assert_string_equal(snap.seg[0], "d");
    assert_int_equal(snap.free_ms[0], 5000 + 2000);

    struct fix_jobs js;
    assert_int_equal(fetch(m, "d", &js), 1);
    assert_int_equal(done(m, "d", js.j[0].id, 0), MOONLET_OK);
    memset(&snap, 0, sizeof(snap));
    moonlet_master_snapshot(m, quar_capture, &snap);
    assert_int_equal(snap.n, 0);
    end_test(m);
}

/* A drain swaps a replica: the standby is told, before the old range is
 * freed and in ONE record (a failover between two records would find the
 * object missing or unsealed on the standby, and an acknowledged object
 * lost): the object sealed, with its checksum, on the surviving replica and
 * the swapped-in one (issue 31, finding 1: without it, an object whose one
 * replica was drained got no record), the old range held while a reader
 * may read it.  So it never keeps a replica on a range the leader may
 * reuse. */
struct recs {
    uint32_t n;
    uint8_t type[32], flags[32];
    uint32_t nrep[32];
    uint64_t free_ms[32];
    char seg0[32][32], seg1[32][32];
};

static void rec_capture(void *arg, const moonlet_repl_rec *rec)
{
    struct recs *r = arg;
    if (r->n == 32)
        return;
    r->type[r->n] = rec->type;
    r->flags[r->n] = rec->flags;
    r->nrep[r->n] = rec->nrep;
    r->free_ms[r->n] = rec->free_ms;
    snprintf(r->seg0[r->n], sizeof(r->seg0[0]), "%.*s",
             rec->nrep ? (int)rec->rep_seg[0].len : 0, rec->nrep ? rec->rep_seg[0].ptr : "");
    snprintf(r->seg1[r->n], sizeof(r->seg1[0]), "%.*s",
             rec->nrep > 1 ? (int)rec->rep_seg[1].len : 0, rec->nrep > 1 ? rec->rep_seg[1].ptr : "");
    r->n++;
}

static void test_standby_told_of_drain_swap(void **state)
{
    (void)state;
    struct recs rs = {0};
    moonlet_master *m = k_streamed(rec_capture, &rs, "c", "10.0.0.3:1");
    assert_int_equal(moonlet_master_drain(m, MOONLET_STR("a"), true, NULL), MOONLET_OK);
    moonlet_master_tick(m);
    struct fix_jobs js;
    assert_int_equal(fetch(m, "c", &js), 1);
    assert_int_equal(listed(m, "k"), 2); /* a reader leases k (on a and b) */
    rs.n = 0;
    assert_int_equal(done(m, "c", js.j[0].id, 0), MOONLET_OK);
    assert_int_equal(listed(m, "k"), 2); /* on b and c now */
    assert_int_equal(rs.n, 1);
    assert_int_equal(rs.type[0], MOONLET_REPL_PLACE);
    assert_true(rs.flags[0] & MOONLET_REPL_FLAG_SEALED);
    assert_true(rs.flags[0] & MOONLET_REPL_FLAG_CHECKSUM);
    assert_int_equal(rs.nrep[0], 2);
    assert_true((!strcmp(rs.seg0[0], "b") && !strcmp(rs.seg1[0], "c")) ||
                (!strcmp(rs.seg0[0], "c") && !strcmp(rs.seg1[0], "b")));
    /* the reader's lease on k holds: a's range is held that long */
    assert_true(rs.free_ms[0] > 0);
    end_test(m);
}

MOONLET_TEST_MAIN("repair", NULL, NULL,
                  cmocka_unit_test(test_drop_queues_and_repairs),
                  cmocka_unit_test(test_concurrency_limit),
                  cmocka_unit_test(test_leased_first),
                  cmocka_unit_test(test_bandwidth_limit),
                  cmocka_unit_test(test_removal_mid_repair),
                  cmocka_unit_test(test_reput_mid_repair),
                  cmocka_unit_test(test_removed_before_fetch),
                  cmocka_unit_test(test_failures_bounded),
                  cmocka_unit_test(test_no_other_host),
                  cmocka_unit_test(test_target_unmounted),
                  cmocka_unit_test(test_drain),
                  cmocka_unit_test(test_undrain),
                  cmocka_unit_test(test_standby_holds_target),
                  cmocka_unit_test(test_standby_told_of_drain_swap))
