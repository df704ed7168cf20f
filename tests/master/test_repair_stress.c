/* Stress of re-replication against lookups and unmounts (master/store/repair.c),
 * for ThreadSanitizer and lock order: readers look keys up while a thread
 * unmounts and remounts segments and another runs the background tick and
 * plays the target nodes (RepairFetch, RepairDone).  Readers only ever see
 * COMPLETE replicas on distinct segments; once the churn stops and repairs
 * settle, every object left has both its replicas again. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "../common/master_fixture.h"

#define NSEG 6
#define NOBJ 2000
#define ROUNDS 20

static moonlet_master *g_m;
static atomic_bool g_stop;
static atomic_int g_bad;

static void seg_name(char *buf, size_t cap, int i, int gen)
{
    snprintf(buf, cap, "s%d-%d", i, gen);
}

static void mount_seg(int i, int gen)
{
    char client[16], seg[16], ep[32];
    snprintf(client, sizeof(client), "c%d", i);
    seg_name(seg, sizeof(seg), i, gen);
    snprintf(ep, sizeof(ep), "10.1.0.%d:7000", i + 1);
    moonlet_segment_desc d = {.client_id = client, .segment_id = seg, .name = seg, .base = 0,
                              .size = 16 << 20, .endpoint = ep, .protocol = "tcp"};
    assert_int_equal(moonlet_master_mount_segment(g_m, &d), MOONLET_OK);
}

struct seen {
    uint32_t n;
    char seg[8][32];
};

static void reader_visit(void *arg, const moonlet_replica_view *v)
{
    struct seen *s = arg;
    if (v->status != MOONLET_REPLICA_COMPLETE || s->n >= 8)
        atomic_fetch_add(&g_bad, 1);
    for (uint32_t i = 0; i < s->n && i < 8; i++)
        if (strcmp(s->seg[i], v->segment_id) == 0)
            atomic_fetch_add(&g_bad, 1);
    if (s->n < 8)
        snprintf(s->seg[s->n], sizeof(s->seg[0]), "%s", v->segment_id);
    s->n++;
}

static void *reader(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    char key[16];
    while (!atomic_load(&g_stop)) {
        snprintf(key, sizeof(key), "k%d", rand_r(&seed) % NOBJ);
        struct seen s = {0};
        int rc = moonlet_master_get_replica_list(g_m, MOONLET_STR(""), MOONLET_STR(key), NULL,
                                                 NULL, reader_visit, &s);
        if ((rc != MOONLET_OK && rc != MOONLET_ERR_OBJECT_NOT_FOUND) || s.n > 2)
            atomic_fetch_add(&g_bad, 1);
    }
    return NULL;
}

struct fetched {
    uint64_t id[64];
    uint32_t n;
};

static void fetch_visit(void *arg, const moonlet_repair_job_view *j)
{
    struct fetched *f = arg;
    if (j->target->status != MOONLET_REPLICA_INITIALIZED || j->nsources == 0)
        atomic_fetch_add(&g_bad, 1);
    f->id[f->n++] = j->job_id;
}

/* One round of every node's work: fetch its jobs and report them done. */
static void nodes_work(void)
{
    char client[16];
    for (int i = 0; i < NSEG; i++) {
        snprintf(client, sizeof(client), "c%d", i);
        struct fetched f = {.n = 0};
        if (moonlet_master_repair_fetch(g_m, MOONLET_STR(client), 0, 64, fetch_visit, &f))
            continue;
        for (uint32_t k = 0; k < f.n; k++)
            moonlet_master_repair_done(g_m, MOONLET_STR(client), 0, f.id[k], 0, 0);
    }
}

static void *worker(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stop)) {
        moonlet_master_tick(g_m);
        nodes_work();
    }
    return NULL;
}

static void test_repair_under_churn(void **state)
{
    (void)state;
    moonlet_master_config cfg;
    moonlet_master_config_default(&cfg);
    cfg.shards = 64;
    cfg.background = false;
    cfg.client_live_ttl_ms = 3600 * 1000;
    cfg.repair_concurrency = 64;
    assert_int_equal(moonlet_master_create(&cfg, &g_m), MOONLET_OK);
    for (int i = 0; i < NSEG; i++)
        mount_seg(i, 0);
    char key[16];
    for (int i = 0; i < NOBJ; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        assert_int_equal(fix_put_t(g_m, "", key, 512 + (uint64_t)i, 2), MOONLET_OK);
    }
    pthread_t r[2], w;
    for (uintptr_t i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&r[i], NULL, reader, (void *)(i + 1)), 0);
    assert_int_equal(pthread_create(&w, NULL, worker, NULL), 0);
    int gen[NSEG] = {0};
    for (int round = 0; round < ROUNDS; round++) {
        int i = round % NSEG;
        char client[16], seg[16];
        snprintf(client, sizeof(client), "c%d", i);
        seg_name(seg, sizeof(seg), i, gen[i]);
        assert_int_equal(moonlet_master_unmount_segment(g_m, MOONLET_STR(client),
                                                        MOONLET_STR(seg)),
                         MOONLET_OK);
        if (round % 3 == 0) { /* a drain and an undrain in between */
            snprintf(client, sizeof(client), "c%d", (i + 1) % NSEG);
            moonlet_master_drain(g_m, MOONLET_STR(client), true, NULL);
            moonlet_master_drain(g_m, MOONLET_STR(client), false, NULL);
        }
        mount_seg(i, ++gen[i]);
        /* let most repairs land before the next loss (bounded: 2 s) */
        for (int k = 0; k < 2000; k++) {
            moonlet_master_stats now;
            moonlet_master_get_stats(g_m, &now);
            if (now.under_replicated == 0)
                break;
            usleep(1000);
        }
    }
    atomic_store(&g_stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(r[i], NULL);
    pthread_join(w, NULL);
    /* settle (bounded): everything queued gets its replica back */
    moonlet_master_stats st;
    for (int i = 0; i < 1000; i++) {
        moonlet_master_tick(g_m);
        nodes_work();
        moonlet_master_get_stats(g_m, &st);
        if (st.under_replicated == 0 && st.repairs_running == 0)
            break;
    }
    assert_int_equal(st.under_replicated, 0);
    assert_int_equal(atomic_load(&g_bad), 0);
    uint32_t objects = 0;
    for (int i = 0; i < NOBJ; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        moonlet_key_view v;
        if (moonlet_master_inspect_key(g_m, MOONLET_STR(""), MOONLET_STR(key), &v, NULL, NULL))
            continue;
        objects++;
        assert_int_equal(v.readable_replicas, 2);
    }
    assert_true(objects > NOBJ / 2);
    moonlet_master_destroy(g_m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_repair_under_churn)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
