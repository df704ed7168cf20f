/*
 * Integration test of moonlet-store (store/node/store_node.c, tools/moonlet-store.c):
 * a master with a 2 s liveness TTL and two store processes on loopback,
 * driven through the public client and inspected through MasterClient.
 *
 * Replicated puts land on both segments and read back byte for byte; a
 * store killed with SIGKILL is read around at once and unmounted after the
 * TTL, after which two-replica puts fail and one-replica puts work until a
 * store is started again; SIGTERM unmounts and exits 0 within a second; a
 * store the master declared dead (SIGSTOP past the TTL) and a store whose
 * master restarted register a fresh segment id and mount again; bad flags
 * exit 2.  The node library is also run in-process, also with an advertised
 * address, which the master then hands to writers instead of the listen one.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <sys/socket.h>

#include "../common/cluster.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "net.h"
#include "store_node.h"
#include "xfer.h"
#include "../common/test_main.h"

static test_proc g_master, g_a, g_b;
static moonlet_master_client *g_mc;
static moonlet_client *g_cli;
static const char *const g_master_flags[] = {"--client_live_ttl_sec", "2", NULL};

#define NSIZES 5
static const size_t g_sizes[NSIZES] = {0, 1, 4096, 1u << 20, 16u << 20};
static unsigned char *g_data[NSIZES];

static void key_of(char *buf, size_t cap, const char *prefix, size_t i)
{
    snprintf(buf, cap, "%s/%zu", prefix, g_sizes[i]);
}

static int connect_clients(void)
{
    if (moonlet_mc_create(g_master.addr, NULL, &g_mc))
        return -1;
    return cl_client_create(g_master.addr, 3000, &g_cli);
}

static int setup(void **state)
{
    (void)state;
    if (cl_start_master(&g_master, g_master_flags) ||
        cl_start_store(&g_a, g_master.addr, "64MiB", NULL) ||
        cl_start_store(&g_b, g_master.addr, "64MiB", NULL))
        return -1;
    for (size_t i = 0; i < NSIZES; i++) {
        g_data[i] = malloc(g_sizes[i] ? g_sizes[i] : 1);
        cl_fill(g_data[i], g_sizes[i], 1000 + i);
    }
    return connect_clients();
}

static int teardown(void **state)
{
    (void)state;
    moonlet_client_destroy(g_cli);
    moonlet_mc_destroy(g_mc);
    proc_stop(&g_a);
    proc_stop(&g_b);
    proc_stop(&g_master);
    for (size_t i = 0; i < NSIZES; i++)
        free(g_data[i]);
    return 0;
}

static void assert_reads_back(const char *key, const unsigned char *want, size_t size)
{
    unsigned char *got = malloc(size ? size : 1);
    size_t len = 12345;
    int rc = moonlet_client_get(g_cli, key, got, size, NULL, &len);
    if (rc)
        fail_msg("get %s: %s", key, moonlet_strerror(rc));
    assert_int_equal(len, size);
    assert_memory_equal(got, want, size ? size : 0);
    free(got);
}

/* ---- pure pieces and the library in-process ------------------------------------- */

static void test_backoff(void **state)
{
    (void)state;
    assert_int_equal(moonlet_store_node_backoff_ms(0), 100);
    assert_int_equal(moonlet_store_node_backoff_ms(1), 100);
    assert_int_equal(moonlet_store_node_backoff_ms(2), 200);
    assert_int_equal(moonlet_store_node_backoff_ms(3), 400);
    assert_int_equal(moonlet_store_node_backoff_ms(5), 1600);
    assert_int_equal(moonlet_store_node_backoff_ms(6), 2000);
    assert_int_equal(moonlet_store_node_backoff_ms(1000), 2000);
}

/* An in-process node's configuration: the test's master, a 4 MiB TCP segment. */
static moonlet_store_node_config node_config(void)
{
    moonlet_store_node_config cfg;
    cl_node_config(&cfg, g_master.addr, 4u << 20);
    return cfg;
}

static void *node_main(void *arg)
{
    return (void *)(intptr_t)moonlet_store_node_run(arg);
}

static void test_in_process_node(void **state)
{
    (void)state;
    int before = cl_segments(g_mc);
    moonlet_store_node_config cfg = node_config();
    cfg.client_id = "in-process-node";
    cfg.ping_interval_ms = 50;
    moonlet_store_node *n;
    assert_int_equal(moonlet_store_node_create(&cfg, &n), MOONLET_OK);
    assert_int_equal(cl_segments(g_mc), before + 1);
    char id[MOONLET_MAX_ID_BYTES + 1], listed[MOONLET_MAX_ID_BYTES + 1];
    assert_int_equal(moonlet_store_node_segment_id(n, id, sizeof(id)), MOONLET_OK);
    cl_segment_at(g_mc, moonlet_store_node_endpoint(n), listed, sizeof(listed));
    assert_string_equal(id, listed);
    assert_string_equal(moonlet_store_node_protocol(n), "tcp");
    assert_string_equal(moonlet_store_node_client_id(n), "in-process-node");
    assert_int_equal(moonlet_store_node_segment_id(n, id, 4), MOONLET_ERR_BUFFER_OVERFLOW);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, node_main, n), 0);
    /* the master hears its heartbeats, and they keep the one mount */
    assert_int_equal(cl_wait_pings(g_mc, moonlet_store_node_endpoint(n), 3, 5000), 3);
    assert_int_equal(moonlet_store_node_mounts(n), 1);
    long long t0 = proc_now_ms();
    moonlet_store_node_stop(n);
    void *ret;
    pthread_join(th, &ret);
    assert_int_equal((intptr_t)ret, MOONLET_OK);
    assert_true(proc_now_ms() - t0 < 1000);
    assert_int_equal(cl_segments(g_mc), before); /* run() unmounted */
    moonlet_store_node_destroy(n);

    /* A node restarted under the same id takes over what its last run left. */
    assert_int_equal(moonlet_store_node_create(&cfg, &n), MOONLET_OK);
    moonlet_store_node *again;
    assert_int_equal(moonlet_store_node_create(&cfg, &again), MOONLET_OK);
    assert_int_equal(cl_segments(g_mc), before + 1);
    moonlet_store_node_destroy(again);
    moonlet_store_node_destroy(n); /* its segment is gone already: no error */
    assert_int_equal(cl_segments(g_mc), before);

    /* bad configurations */
    cfg.segment_size = 1000;
    assert_int_equal(moonlet_store_node_create(&cfg, &n), MOONLET_ERR_INVALID_PARAMS);
    cfg.segment_size = 4u << 20;
    cfg.master_addr = NULL;
    assert_int_equal(moonlet_store_node_create(&cfg, &n), MOONLET_ERR_INVALID_PARAMS);
    cfg.master_addr = "127.0.0.1:1"; /* nothing listens there */
    assert_int_equal(moonlet_store_node_create(&cfg, &n), MOONLET_ERR_RPC_FAIL);
}

/* An advertised address is what the master hands out; the node serves elsewhere. */
static void test_advertise_in_process(void **state)
{
    (void)state;
    int before = cl_segments(g_mc);
    moonlet_store_node_config cfg = node_config();
    cfg.advertise_addr = "nocolon";
    moonlet_store_node *n;
    assert_int_equal(moonlet_store_node_create(&cfg, &n), MOONLET_ERR_INVALID_PARAMS);
    cfg.advertise_addr = "127.0.0.1:9"; /* discard: nothing of ours listens there */
    assert_int_equal(moonlet_store_node_create(&cfg, &n), MOONLET_OK);
    assert_string_equal(moonlet_store_node_endpoint(n), "127.0.0.1:9");
    const char *listen = moonlet_store_node_listen_endpoint(n);
    assert_true(strncmp(listen, "127.0.0.1:", 10) == 0 && strcmp(listen, "127.0.0.1:9") != 0);
    char id[MOONLET_MAX_ID_BYTES + 1], listed[MOONLET_MAX_ID_BYTES + 1];
    assert_int_equal(moonlet_store_node_segment_id(n, id, sizeof(id)), MOONLET_OK);
    cl_segment_at(g_mc, "127.0.0.1:9", listed, sizeof(listed));
    assert_string_equal(id, listed);
    cl_segment_at(g_mc, listen, listed, sizeof(listed));
    assert_string_equal(listed, "");
    /* Writers go where the master points: a put needing all three nodes fails
     * on the advertised address, cleanly (revoked, nothing readable). */
    moonlet_put_options three = {.replica_num = (uint32_t)before + 1};
    assert_int_equal(moonlet_client_put(g_cli, "via-advertised", g_data[2], g_sizes[2], &three),
                     MOONLET_ERR_TRANSFER_FAIL);
    bool ex = true;
    assert_int_equal(moonlet_client_probe_key(g_cli, "via-advertised", NULL, &ex), MOONLET_OK);
    assert_false(ex);
    moonlet_store_node_destroy(n);
    assert_int_equal(cl_segments(g_mc), before);
}

/* ---- flags ------------------------------------------------------------------------ */

static int run_store(const char *const *args)
{
    char *argv[CL_MAX_ARGS] = {"tools/moonlet-store"};
    int n = 1;
    cl_append(argv, &n, args);
    return cl_run_exit_code(argv, 5000);
}

static void test_bad_flags(void **state)
{
    (void)state;
    const char *m = g_master.addr;
#define BAD(...) ((const char *const[]){__VA_ARGS__, NULL})
    const char *const *bad[] = {
        BAD("--segment-size", "64MiB"), /* no --master */
        BAD("--master", "127.0.0.1"),
        BAD("--master", ":5000"),
        BAD("--master", "127.0.0.1:0"),
        BAD("--master", "127.0.0.1:70000"),
        BAD("--master", m, "--segment-size", "12XB"),
        BAD("--master", m, "--segment-size", "1.5GiB"),
        BAD("--master", m, "--segment-size", "-1"),
        BAD("--master", m, "--segment-size", "100"),
        BAD("--master", m, "--protocol", "udp"),
        BAD("--master", m, "--listen", "nohostport"),
        BAD("--master", m, "--numa-node", "-1"),
        BAD("--master", m, "--numa-node", "x"),
        BAD("--master", m, "--ping-interval-ms", "0"),
        BAD("--master", m, "--ping-interval-ms", "abc"),
        BAD("--master", m, "--log-level", "loud"),
        BAD("--master", m, "--client-id", ""),
        BAD("--master", m, "--advertise", "nohostport"),
        BAD("--master", m, "--advertise", "127.0.0.1:0"),
        BAD("--master", m, "--rpc-timeout-ms", "0"),
        BAD("--master", m, "--rpc-timeout-ms", "x"),
        BAD("--master", m, "--transfer-timeout-ms", "0"),
        BAD("--master", m, "--transfer-timeout-ms", "-5"),
        BAD("--master", m, "--busy-poll-us", "100"), /* no --serve-dummy */
        BAD("--master", m, "--serve-dummy", "/tmp/moonlet-bad-flags.sock", "--busy-poll-us", "-1"),
        BAD("--master", m, "--serve-dummy", "/tmp/moonlet-bad-flags.sock", "--busy-poll-us",
            "100001"),
        BAD("--master", m, "--serve-dummy", "/tmp/moonlet-bad-flags.sock", "--busy-poll-us", "x"),
        BAD("--master", m, "--bogus"),
        BAD("--master", m, "stray"),
        BAD("--master", m, "--auth-token-file", "/nonexistent/moonlet-token"),
        BAD("--master"),
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = run_store(bad[i]);
        if (rc != 2)
            fail_msg("case %zu (%s %s ...): exit %d, want 2", i, bad[i][0],
                     bad[i][1] ? bad[i][1] : "", rc);
    }
    assert_int_equal(run_store(BAD("--help")), 0);
    assert_int_equal(run_store(BAD("--version")), 0);
    /* good flags, unreachable master: a runtime failure, not a usage error */
    assert_int_equal(run_store(BAD("--master", "127.0.0.1:1", "--segment-size", "4MiB",
                                   "--protocol", "tcp")), 1);
#undef BAD
}

/* ---- replication and failure ---------------------------------------------------------- */

static void test_replicated_put_get(void **state)
{
    (void)state;
    char seg_a[MOONLET_MAX_ID_BYTES + 1], seg_b[MOONLET_MAX_ID_BYTES + 1];
    cl_segment_at(g_mc, g_a.addr, seg_a, sizeof(seg_a));
    cl_segment_at(g_mc, g_b.addr, seg_b, sizeof(seg_b));
    assert_true(seg_a[0] && seg_b[0]);
    moonlet_put_options two = {.replica_num = 2};
    for (size_t i = 0; i < NSIZES; i++) {
        char key[64];
        key_of(key, sizeof(key), "rep", i);
        assert_int_equal(moonlet_client_put(g_cli, key, g_data[i], g_sizes[i], &two), MOONLET_OK);
        /* two replicas, on the two distinct segments, both sealed */
        cJSON *j = NULL;
        assert_int_equal(moonlet_mc_inspect_key(g_mc, NULL, key, &j), MOONLET_OK);
        assert_int_equal((int)cJSON_GetObjectItem(j, "replica_count")->valuedouble, 2);
        cJSON *reps = cJSON_GetObjectItem(j, "replicas");
        assert_int_equal(cJSON_GetArraySize(reps), 2);
        const char *s0 = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(reps, 0), "segment_id"));
        const char *s1 = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(reps, 1), "segment_id"));
        assert_string_not_equal(s0, s1);
        assert_true(strcmp(s0, seg_a) == 0 || strcmp(s0, seg_b) == 0);
        assert_true(strcmp(s1, seg_a) == 0 || strcmp(s1, seg_b) == 0);
        assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(reps, 1), "status")), "COMPLETE");
        cJSON_Delete(j);
        moonlet_replica_list l;
        assert_int_equal(moonlet_mc_get_replica_list(g_mc, NULL, key, &l), MOONLET_OK);
        assert_int_equal(l.count, 2);
        assert_string_not_equal(l.replicas[0].segment_id, l.replicas[1].segment_id);
        assert_int_equal(l.size, g_sizes[i]);
        moonlet_replica_list_free(&l);
        assert_reads_back(key, g_data[i], g_sizes[i]);
    }
    /* the malloc'ing variant agrees */
    void *p = NULL;
    size_t len = 0;
    assert_int_equal(moonlet_client_get_alloc(g_cli, "rep/1048576", NULL, &p, &len), MOONLET_OK);
    assert_int_equal(len, 1u << 20);
    assert_memory_equal(p, g_data[3], len);
    free(p);
}

static bool b_first(const char *key)
{
    moonlet_replica_list l;
    bool first = moonlet_mc_get_replica_list(g_mc, NULL, key, &l) == 0 && l.count > 0 &&
                 strcmp(l.replicas[0].endpoint, g_b.addr) == 0;
    moonlet_replica_list_free(&l);
    return first;
}

static bool all_single_replica(void *arg)
{
    (void)arg;
    for (size_t i = 0; i < NSIZES; i++) {
        char key[64];
        key_of(key, sizeof(key), "rep", i);
        if (cl_replicas(g_mc, NULL, key) != 1)
            return false;
    }
    return cl_segments(g_mc) == 1;
}

static bool two_segments(void *arg)
{
    (void)arg;
    return cl_segments(g_mc) == 2;
}

static void test_store_killed(void **state)
{
    (void)state;
    bool b_listed_first[NSIZES];
    for (size_t i = 0; i < NSIZES; i++) {
        char key[64];
        key_of(key, sizeof(key), "rep", i);
        b_listed_first[i] = b_first(key);
    }
    assert_int_equal(proc_stop_sig(&g_b, SIGKILL, 3000), 128 + SIGKILL);

    /* At once, while the master still lists B's replicas: reads go around it. */
    bool fell_over = false;
    for (size_t i = 0; i < NSIZES; i++) {
        char key[64];
        key_of(key, sizeof(key), "rep", i);
        assert_reads_back(key, g_data[i], g_sizes[i]);
        if (b_listed_first[i] && g_sizes[i] > 0 && cl_replicas(g_mc, NULL, key) == 2)
            fell_over = true;
    }
    assert_true(fell_over);

    /* After the liveness TTL its replicas are gone, the bytes are not. */
    assert_true(cl_wait(all_single_replica, NULL, 5000));
    for (size_t i = 0; i < NSIZES; i++) {
        char key[64];
        key_of(key, sizeof(key), "rep", i);
        assert_reads_back(key, g_data[i], g_sizes[i]);
    }
    moonlet_put_options two = {.replica_num = 2}, one = {.replica_num = 1};
    assert_int_equal(moonlet_client_put(g_cli, "after-kill/2", g_data[2], 4096, &two),
                     MOONLET_ERR_NO_AVAILABLE_HANDLE);
    assert_int_equal(moonlet_client_put(g_cli, "after-kill/1", g_data[2], 4096, &one), MOONLET_OK);
    assert_reads_back("after-kill/1", g_data[2], 4096);

    /* A store started again brings two-replica puts back. */
    assert_int_equal(cl_start_store(&g_b, g_master.addr, "64MiB", NULL), 0);
    assert_true(cl_wait(two_segments, NULL, 5000));
    assert_int_equal(moonlet_client_put(g_cli, "after-restart/2", g_data[3], g_sizes[3], &two),
                     MOONLET_OK);
    assert_int_equal(cl_replicas(g_mc, NULL, "after-restart/2"), 2);
    assert_reads_back("after-restart/2", g_data[3], g_sizes[3]);
}

static void test_sigterm_unmounts(void **state)
{
    (void)state;
    test_proc c;
    assert_int_equal(cl_start_store(&c, g_master.addr, "8MiB", NULL), 0);
    assert_int_equal(cl_segments(g_mc), 3);
    long long t0 = proc_now_ms();
    assert_int_equal(proc_stop_sig(&c, SIGTERM, 3000), 0);
    long long took = proc_now_ms() - t0;
    if (took >= 1000)
        fail_msg("SIGTERM to exit took %lld ms", took);
    assert_int_equal(cl_segments(g_mc), 2); /* unmounted before it exited, not by the TTL */
}

/* ---- the master forgets a node ------------------------------------------------------ */

struct seg_change {
    const char *endpoint;
    const char *old_id;
};

static bool segment_renewed(void *arg)
{
    struct seg_change *sc = arg;
    char now[MOONLET_MAX_ID_BYTES + 1];
    cl_segment_at(g_mc, sc->endpoint, now, sizeof(now));
    return now[0] && strcmp(now, sc->old_id) != 0;
}

static bool one_segment(void *arg)
{
    (void)arg;
    return cl_segments(g_mc) == 1;
}

static void test_remount_after_declared_dead(void **state)
{
    (void)state;
    moonlet_put_options two = {.replica_num = 2};
    assert_int_equal(moonlet_client_put(g_cli, "stale", g_data[2], 4096, &two), MOONLET_OK);
    moonlet_replica_list l;
    assert_int_equal(moonlet_mc_get_replica_list(g_mc, NULL, "stale", &l), MOONLET_OK);
    const moonlet_replica_desc *on_a = strcmp(l.replicas[0].endpoint, g_a.addr) == 0
                                           ? &l.replicas[0] : &l.replicas[1];
    assert_string_equal(on_a->endpoint, g_a.addr);
    char old_id[MOONLET_MAX_ID_BYTES + 1];
    snprintf(old_id, sizeof(old_id), "%s", on_a->segment_id);

    /* Frozen past the TTL: the master declares A dead and unmounts it. */
    assert_int_equal(kill(g_a.pid, SIGSTOP), 0);
    bool dropped = cl_wait(one_segment, NULL, 5000);
    assert_int_equal(kill(g_a.pid, SIGCONT), 0);
    assert_true(dropped);
    /* Thawed, A sees "0 segments" in its next Ping and mounts a fresh id. */
    struct seg_change sc = {.endpoint = g_a.addr, .old_id = old_id};
    assert_true(cl_wait(segment_renewed, &sc, 5000));
    assert_int_equal(cl_segments(g_mc), 2);

    /* Whoever still holds the old id is refused, not served. */
    moonlet_xfer_opts xo = {.protocol = MOONLET_XFER_TCP, .timeout_ms = 3000};
    moonlet_xfer *x;
    assert_int_equal(moonlet_xfer_create(&xo, &x), MOONLET_OK);
    unsigned char buf[4096];
    assert_int_equal(moonlet_xfer_read(x, on_a->endpoint, old_id, on_a->offset, buf, sizeof(buf)),
                     MOONLET_ERR_SEGMENT_NOT_FOUND);
    moonlet_xfer_destroy(x);
    moonlet_replica_list_free(&l);

    /* and the node is fully back */
    assert_int_equal(moonlet_client_put(g_cli, "after-thaw", g_data[3], g_sizes[3], &two),
                     MOONLET_OK);
    assert_reads_back("after-thaw", g_data[3], g_sizes[3]);
}

/* Stands in for a dead master on its port: takes each connection, reads what
 * it sends, and closes it without an answer.  Returns once a Ping from each
 * of the two client ids has come (and failed), or false after timeout_ms. */
static bool wait_failed_pings(uint16_t port, const char *id_a, const char *id_b, int timeout_ms)
{
    int l = moonlet_net_listen_tcp("127.0.0.1", port, 16, NULL);
    if (l < 0)
        return false;
    bool a = false, b = false;
    uint64_t deadline = moonlet_mono_ms() + (uint64_t)timeout_ms;
    while (!(a && b) && moonlet_mono_ms() < deadline) {
        if (moonlet_net_wait(l, POLLIN, deadline))
            break;
        int fd = accept(l, NULL, NULL);
        if (fd < 0)
            continue;
        char buf[1024];
        size_t len = 0;
        uint64_t conn_deadline = moonlet_mono_ms() + 1000;
        while (len < sizeof(buf) && moonlet_net_wait(fd, POLLIN, conn_deadline) == 0) {
            ssize_t r = read(fd, buf + len, sizeof(buf) - len);
            if (r <= 0)
                break;
            len += (size_t)r;
            bool got_a = memmem(buf, len, id_a, strlen(id_a)) != NULL;
            bool got_b = memmem(buf, len, id_b, strlen(id_b)) != NULL;
            a |= got_a;
            b |= got_b;
            if (got_a || got_b)
                break;
        }
        close(fd);
    }
    close(l);
    return a && b;
}

static void test_master_restart(void **state)
{
    (void)state;
    char port[16];
    snprintf(port, sizeof(port), "%u", g_master.port);
    char seg_a[MOONLET_MAX_ID_BYTES + 1];
    cl_segment_at(g_mc, g_a.addr, seg_a, sizeof(seg_a));
    char id_a[MOONLET_MAX_ID_BYTES + 1], id_b[MOONLET_MAX_ID_BYTES + 1];
    cl_segment_field(g_mc, g_a.addr, "client_id", id_a, sizeof(id_a));
    cl_segment_field(g_mc, g_b.addr, "client_id", id_b, sizeof(id_b));
    assert_true(id_a[0] && id_b[0]);
    uint16_t master_port = (uint16_t)g_master.port;
    assert_int_equal(proc_stop_sig(&g_master, SIGKILL, 3000), 128 + SIGKILL);
    /* Both stores' pings fail (no master answers them) before it returns. */
    assert_true(wait_failed_pings(master_port, id_a, id_b, 5000));
    assert_int_equal(cl_start_master_on(&g_master, port, g_master_flags), 0);
    /* The first call on each old connection notices it broke; the next reconnects. */
    cl_segments(g_mc);
    assert_true(cl_wait(two_segments, NULL, 6000));
    struct seg_change sc = {.endpoint = g_a.addr, .old_id = seg_a};
    assert_true(segment_renewed(&sc));
    bool ex;
    moonlet_client_probe_key(g_cli, "x", NULL, &ex);
    moonlet_put_options two = {.replica_num = 2};
    assert_int_equal(moonlet_client_put(g_cli, "after-master-restart", g_data[3], g_sizes[3], &two),
                     MOONLET_OK);
    assert_reads_back("after-master-restart", g_data[3], g_sizes[3]);
}

MOONLET_TEST_MAIN("store_node", setup, teardown,
                  cmocka_unit_test(test_backoff),
                  cmocka_unit_test(test_bad_flags),
                  cmocka_unit_test(test_in_process_node),
                  cmocka_unit_test(test_advertise_in_process),
                  cmocka_unit_test(test_replicated_put_get),
                  cmocka_unit_test(test_store_killed),
                  cmocka_unit_test(test_sigterm_unmounts),
                  cmocka_unit_test(test_remount_after_declared_dead),
                  cmocka_unit_test(test_master_restart))
