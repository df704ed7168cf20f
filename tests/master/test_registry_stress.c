/*
 * Concurrency stress of the registry (master/store/segment.c, unmount.c): node
 * threads mount, ping and unmount segments over many client ids and let
 * some go silent; I/O threads put, read and remove keys with two replicas;
 * a tick thread runs the liveness check (unmounts of silent nodes, spread
 * over ticks) and pages through ListSegments - all at once, on the real
 * clock with a short liveness TTL.
 *
 * Checks: every replica a reader is given names a segment id of the form
 * the node threads mount ("n<i>s<j>": its strings are never a retired or
 * reused slot's), and once all is quiet and every remaining segment is
 * unmounted, the master holds no segment, capacity, used byte or object.
 * Bounded: a fixed number of rounds per thread and a wall-clock cap.
 * Meant to run under ThreadSanitizer (suite "stress").
 */
#include "../common/master_fixture.h"

#include <pthread.h>
#include <stdatomic.h>

#define NODES_PER_THREAD 400
#define NODE_THREADS 2
#define IO_THREADS 2
#define ROUNDS 3000
#define DEADLINE_NS (20ull * 1000000000ull)
#define SEG_BYTES (1u << 20)

static moonlet_master *g_m;
static _Atomic int g_stop;
static _Atomic uint64_t g_bad_views, g_reads, g_mounts;

static void *node_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    unsigned seed = 17u + (unsigned)t;
    uint32_t gen[NODES_PER_THREAD] = {0};
    bool silent[NODES_PER_THREAD] = {0};
    uint64_t start = moonlet_clock_real_ns();
    char c[32], s[48];
    for (int r = 0; r < ROUNDS && moonlet_clock_real_ns() - start < DEADLINE_NS &&
         !atomic_load(&g_stop); r++) {
        int i = (int)(rand_r(&seed) % NODES_PER_THREAD);
        snprintf(c, sizeof(c), "n%d-%d", t, i);
        snprintf(s, sizeof(s), "n%ds%d-%u", t * NODES_PER_THREAD + i, t, gen[i]);
        switch (rand_r(&seed) % 4) {
        case 0: { /* mount (again) */
            moonlet_segment_desc d = {.client_id = c, .segment_id = s, .name = s, .size = SEG_BYTES,
                                      .endpoint = "127.0.0.1:1", .protocol = "tcp"};
            if (moonlet_master_mount_segment(g_m, &d) == MOONLET_OK)
                atomic_fetch_add(&g_mounts, 1);
            silent[i] = false;
            break;
        }
        case 1: /* unmount: then the next mount uses a new id */
            if (moonlet_master_unmount_segment(g_m, MOONLET_STR(c), MOONLET_STR(s)) == MOONLET_OK)
                gen[i]++;
            break;
        case 2: /* go silent: no more pings until mounted again */
            silent[i] = true;
            break;
        default: /* ping every live node of this thread */
            for (int k = 0; k < NODES_PER_THREAD; k++) {
                if (silent[k])
                    continue;
                snprintf(c, sizeof(c), "n%d-%d", t, k);
                uint32_t segs;
                moonlet_master_ping(g_m, MOONLET_STR(c), &segs);
            }
        }
    }
    return NULL;
}

static void check_view(void *arg, const moonlet_replica_view *v)
{
    unsigned a, b, g;
    if (!v->segment_id || sscanf(v->segment_id, "n%us%u-%u", &a, &b, &g) != 3 ||
        strcmp(v->endpoint, "127.0.0.1:1") != 0)
        atomic_fetch_add(&g_bad_views, 1);
    atomic_fetch_add(&g_reads, 1);
}

static void *io_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    unsigned seed = 101u + (unsigned)t;
    uint64_t start = moonlet_clock_real_ns();
    char k[32];
    for (int r = 0; r < ROUNDS * 4 && moonlet_clock_real_ns() - start < DEADLINE_NS &&
         !atomic_load(&g_stop); r++) {
        snprintf(k, sizeof(k), "k%d-%u", t, rand_r(&seed) % 2000);
        moonlet_str key = MOONLET_STR(k), tn = MOONLET_STR("");
        switch (rand_r(&seed) % 3) {
        case 0:
            if (moonlet_master_put_start(g_m, tn, key, 4096, 2, false, check_view, NULL) ==
                MOONLET_OK)
                moonlet_master_put_end(g_m, tn, key, NULL);
            break;
        case 1:
            moonlet_master_get_replica_list(g_m, tn, key, NULL, NULL, check_view, NULL);
            break;
        default:
            moonlet_master_remove(g_m, tn, key);
        }
    }
    return NULL;
}

static void count_seg(void *arg, const moonlet_segment_view *s)
{
    (*(uint64_t *)arg)++;
}

static void *tick_thread(void *arg)
{
    uint64_t start = moonlet_clock_real_ns();
    while (!atomic_load(&g_stop) && moonlet_clock_real_ns() - start < DEADLINE_NS) {
        moonlet_master_tick(g_m);
        uint64_t cursor = 0, n = 0;
        int pages = 0;
        do {
            if (moonlet_master_list_segments_page(g_m, NULL, cursor, 50, count_seg, &n, &cursor))
                break;
        } while (cursor && ++pages < 1000);
    }
    return NULL;
}

struct seg_list {
    char client[64][64], seg[64][64];
    int n;
};

static void collect_seg(void *arg, const moonlet_segment_view *s)
{
    struct seg_list *l = arg;
    if (l->n < 64) {
        snprintf(l->client[l->n], sizeof(l->client[0]), "%s", s->client_id);
        snprintf(l->seg[l->n], sizeof(l->seg[0]), "%s", s->segment_id);
        l->n++;
    }
}

static void test_registry_stress(void **state)
{
    (void)state;
    moonlet_master_config cfg = fix_config(64);
    cfg.client_live_ttl_ms = 30;
    cfg.lease_ttl_ms = 5;
    cfg.put_quarantine_grace_ms = 1;
    g_m = fix_master_of(&cfg, 0); /* the real clock */
    pthread_t th[NODE_THREADS + IO_THREADS + 1];
    int n = 0;
    for (int i = 0; i < NODE_THREADS; i++)
        assert_int_equal(pthread_create(&th[n++], NULL, node_thread, (void *)(intptr_t)i), 0);
    for (int i = 0; i < IO_THREADS; i++)
        assert_int_equal(pthread_create(&th[n++], NULL, io_thread, (void *)(intptr_t)i), 0);
    pthread_t ticker;
    assert_int_equal(pthread_create(&ticker, NULL, tick_thread, NULL), 0);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    atomic_store(&g_stop, 1);
    pthread_join(ticker, NULL);

    assert_int_equal(atomic_load(&g_bad_views), 0);
    assert_true(atomic_load(&g_mounts) > 0);
    moonlet_master_stats st;
    moonlet_master_get_stats(g_m, &st);
    print_message("mounts %llu, replica views %llu, unmounts by liveness %llu\n",
                  (unsigned long long)atomic_load(&g_mounts),
                  (unsigned long long)atomic_load(&g_reads),
                  (unsigned long long)st.unmounts_by_liveness);
    /* quiet now: unmount what is left, 64 at a time (bounded) */
    for (int round = 0; round < 1000; round++) {
        struct seg_list l = {.n = 0};
        moonlet_master_list_segments(g_m, collect_seg, &l);
        if (l.n == 0)
            break;
        for (int i = 0; i < l.n; i++)
            assert_int_equal(moonlet_master_unmount_segment(g_m, MOONLET_STR(l.client[i]),
                                                            MOONLET_STR(l.seg[i])), MOONLET_OK);
    }
    moonlet_master_get_stats(g_m, &st);
    assert_int_equal(st.segments, 0);
    assert_int_equal(st.capacity, 0);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.quarantined, 0);
    assert_int_equal(st.objects, 0);
    moonlet_master_destroy(g_m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_registry_stress)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
