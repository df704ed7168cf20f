/*
 * Re-replication end to end on loopback (master/store/repair.c, the repair thread
 * of store/node/store_node.c): a moonlet-master process and three in-process
 * store nodes P, Q, R.  Objects on P and Q lose Q (a clean stop: the unmount
 * queues them at once); R, the only other segment, fetches the jobs, reads
 * each object from P, and the new replica is readable with the right bytes.
 * One object's bytes on P are corrupted first: R's copy fails the checksum,
 * the job is reported failed and retried with backoff, and that object never
 * gets a replica on R (never wrong bytes).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "../common/cluster.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "store_node.h"
#include "../common/test_main.h"

static cl_cluster g_cl;
static const char *const g_master_flags[] = {"--client_live_ttl_sec", "2", NULL};

struct node {
    moonlet_store_node *n;
    pthread_t th;
    bool running;
};

static void *node_main(void *arg)
{
    return (void *)(intptr_t)moonlet_store_node_run(arg);
}

static void node_start(struct node *nd, const char *id)
{
    moonlet_store_node_config cfg;
    cl_node_config(&cfg, g_cl.master.addr, 8u << 20);
    cfg.client_id = id;
    cfg.ping_interval_ms = 50;
    assert_int_equal(moonlet_store_node_create(&cfg, &nd->n), MOONLET_OK);
    assert_int_equal(pthread_create(&nd->th, NULL, node_main, nd->n), 0);
    nd->running = true;
}

static void node_stop(struct node *nd)
{
    if (!nd->n)
        return;
    if (nd->running) {
        moonlet_store_node_stop(nd->n);
        pthread_join(nd->th, NULL);
        nd->running = false;
    }
    moonlet_store_node_destroy(nd->n);
    nd->n = NULL;
}

static int setup(void **state)
{
    (void)state;
    return cl_cluster_start(&g_cl, g_master_flags, NULL, 3000);
}

static int teardown(void **state)
{
    (void)state;
    cl_cluster_stop(&g_cl);
    return 0;
}

static void put_on(const char *key, const unsigned char *buf, size_t len, const char *a,
                   const char *b)
{
    const char *pref[] = {a, b};
    moonlet_put_options po = {.replica_num = 2, .preferred_segments = pref,
                              .preferred_segments_count = 2};
    assert_int_equal(moonlet_client_put(g_cl.cli, key, buf, len, &po), MOONLET_OK);
}

/* The offset of key's COMPLETE replica at endpoint ep, or -1; *readable the
 * key's readable replica count. */
static long long replica_at(const char *key, const char *ep, int *readable)
{
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_inspect_key(g_cl.mc, "", key, &j), MOONLET_OK);
    *readable = (int)cJSON_GetObjectItem(j, "readable_replicas")->valuedouble;
    long long off = -1;
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "replicas")) {
        const char *e = cJSON_GetStringValue(cJSON_GetObjectItem(r, "endpoint"));
        const char *st = cJSON_GetStringValue(cJSON_GetObjectItem(r, "status"));
        if (e && st && strcmp(e, ep) == 0 && strcmp(st, "COMPLETE") == 0)
            off = (long long)cJSON_GetObjectItem(r, "offset")->valuedouble;
    }
    cJSON_Delete(j);
    return off;
}

#define NGOOD 4
static const size_t g_good_sizes[NGOOD] = {1, 4096, 100000, 1u << 20};

struct wait_ctx {
    struct node *r;
};

static bool goods_repaired(void *arg)
{
    struct wait_ctx *w = arg;
    char key[32];
    for (int i = 0; i < NGOOD; i++) {
        int readable;
        snprintf(key, sizeof(key), "good/%d", i);
        if (replica_at(key, moonlet_store_node_endpoint(w->r->n), &readable) < 0 || readable != 2)
            return false;
    }
    return true;
}

static bool bad_retried(void *arg)
{
    struct wait_ctx *w = arg;
    uint64_t done, failed, bytes;
    moonlet_store_node_repairs(w->r->n, &done, &failed, &bytes);
    return failed >= 2;
}

static void test_repair_copies_and_refuses_bad_bytes(void **state)
{
    (void)state;
    struct node p = {0}, q = {0}, r = {0};
    node_start(&p, "rp-p");
    node_start(&q, "rp-q");
    unsigned char *good[NGOOD];
    char key[32];
    for (int i = 0; i < NGOOD; i++) {
        good[i] = cl_random_bytes(g_good_sizes[i], 500 + i);
        snprintf(key, sizeof(key), "good/%d", i);
        put_on(key, good[i], g_good_sizes[i], "rp-q", "rp-p");
    }
    unsigned char *bad = cl_random_bytes(200000, 99);
    put_on("bad", bad, 200000, "rp-p", "rp-q");
    node_start(&r, "rp-r"); /* after the puts: no replica of them there */

    /* corrupt "bad" on P: the only source once Q is gone */
    int readable;
    long long off = replica_at("bad", moonlet_store_node_endpoint(p.n), &readable);
    assert_true(off >= 0);
    assert_int_equal(readable, 2);
    ((unsigned char *)moonlet_store_node_segment_base(p.n))[off + 12345] ^= 0x5a;

    node_stop(&q); /* a clean stop unmounts: the master queues the five at once */

    struct wait_ctx w = {&r};
    assert_true(cl_wait(goods_repaired, &w, 15000));
    /* the new replicas on R hold the right bytes */
    const unsigned char *rbase = moonlet_store_node_segment_base(r.n);
    for (int i = 0; i < NGOOD; i++) {
        snprintf(key, sizeof(key), "good/%d", i);
        long long roff = replica_at(key, moonlet_store_node_endpoint(r.n), &readable);
        assert_true(roff >= 0);
        assert_memory_equal(rbase + roff, good[i], g_good_sizes[i]);
        cl_assert_get_equals(g_cl.cli, key, NULL, good[i], g_good_sizes[i]);
    }
    /* "bad": R refused the copy (checksum), twice by now (a retry after
     * the backoff); no replica of it on R, and no reader gets its bytes */
    assert_true(cl_wait(bad_retried, &w, 10000));
    assert_true(replica_at("bad", moonlet_store_node_endpoint(r.n), &readable) < 0);
    assert_int_equal(readable, 1);
    unsigned char *got = malloc(200000);
    size_t len = 0;
    assert_int_equal(moonlet_client_get(g_cl.cli, "bad", got, 200000, NULL, &len),
                     MOONLET_ERR_INVALID_READ);
    free(got);

    cJSON *st = NULL;
    assert_int_equal(moonlet_mc_stats(g_cl.mc, &st), MOONLET_OK);
    assert_true(cJSON_GetObjectItem(st, "repairs_done")->valuedouble >= NGOOD);
    assert_true(cJSON_GetObjectItem(st, "repairs_retried")->valuedouble >= 1);
    assert_true(cJSON_GetObjectItem(st, "repair_bytes")->valuedouble >= 1 + 4096 + 100000 +
                                                                          (1u << 20));
    cJSON_Delete(st);
    uint64_t done, failed, bytes;
    moonlet_store_node_repairs(r.n, &done, &failed, &bytes);
    assert_int_equal(done, NGOOD);

    node_stop(&r);
    node_stop(&p);
    for (int i = 0; i < NGOOD; i++)
        free(good[i]);
    free(bad);
}

MOONLET_TEST_MAIN("repair_node", setup, teardown,
                  cmocka_unit_test(test_repair_copies_and_refuses_bad_bytes))
