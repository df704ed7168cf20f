/*
 * Integration test: starts `moonlet-master` on an ephemeral port and drives
 * it through MasterClient - object lifecycle, leases seen through the
 * inspection RPC, BatchProbeKey policies through the wire, several concurrent
 * connections, the auth token, bad input from the network, clean shutdown,
 * and reconnecting: a master restarted under an idle connection is noticed
 * before the next call, and a master that is down is retried on the capped
 * exponential backoff schedule, never faster, never past a call's timeout.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <sys/socket.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "../common/cluster.h"
#include "master_client.h"
#include "methods.h"
#include "moonlet/error.h"
#include "rpc_client.h"
#include "wire.h"
#include "../common/test_main.h"

static test_proc g_master;
static moonlet_master_client *g_mc;

static int start_master(void **state)
{
    (void)state;
    char *argv[] = {"tools/moonlet-master", "--rpc-port", "0", "--shards", "64",
                    "--client_live_ttl_sec", "60", "--log-level", "warn", NULL};
    if (proc_start(&g_master, argv, 5000))
        return -1;
    if (moonlet_mc_create(g_master.addr, NULL, &g_mc))
        return -1;
    moonlet_segment_desc d1 = {.client_id = "node-1", .segment_id = "seg-1", .name = "seg-1",
                               .size = 64 << 20, .endpoint = "127.0.0.1:7001", .protocol = "tcp"};
    moonlet_segment_desc d2 = d1;
    d2.client_id = "node-2";
    d2.segment_id = d2.name = "seg-2";
    d2.endpoint = "127.0.0.1:7002";
    return moonlet_mc_mount_segment(g_mc, &d1) || moonlet_mc_mount_segment(g_mc, &d2);
}

static int stop_master(void **state)
{
    (void)state;
    moonlet_mc_destroy(g_mc);
    /* SIGTERM: clean exit within a second */
    long long t0 = proc_now_ms();
    int rc = proc_stop_sig(&g_master, SIGTERM, 3000);
    long long took = proc_now_ms() - t0;
    if (rc != 0 || took > 1000) {
        fprintf(stderr, "master exit %d after %lld ms\n", rc, took);
        return -1;
    }
    return 0;
}

static int put(const char *tenant, const char *key, uint64_t size, uint32_t nrep)
{
    moonlet_replica_list l;
    int rc = moonlet_mc_put_start(g_mc, tenant, key, size, nrep, false, &l);
    if (rc)
        return rc;
    moonlet_replica_list_free(&l);
    return moonlet_mc_put_end(g_mc, tenant, key);
}

static double lease_ms(const char *tenant, const char *key)
{
    return cl_lease_ms(g_mc, tenant, key);
}

static void test_lifecycle(void **state)
{
    (void)state;
    moonlet_replica_list l;
    assert_int_equal(moonlet_mc_put_start(g_mc, NULL, "life", 1000, 2, false, &l), MOONLET_OK);
    assert_int_equal(l.count, 2);
    assert_string_not_equal(l.replicas[0].segment_id, l.replicas[1].segment_id);
    assert_string_equal(l.replicas[0].protocol, "tcp");
    assert_int_equal(l.replicas[0].size, 1000);
    assert_int_equal(l.replicas[0].status, MOONLET_REPLICA_INITIALIZED);
    moonlet_replica_list_free(&l);
    assert_int_equal(moonlet_mc_get_replica_list(g_mc, NULL, "life", &l), MOONLET_ERR_REPLICA_IS_NOT_READY);
    assert_int_equal(moonlet_mc_put_end(g_mc, NULL, "life"), MOONLET_OK);
    assert_int_equal(moonlet_mc_get_replica_list(g_mc, NULL, "life", &l), MOONLET_OK);
    assert_int_equal(l.count, 2);
    assert_int_equal(l.size, 1000);
    assert_int_equal(l.lease_ttl_ms, 5000);
    assert_int_equal(l.replicas[1].status, MOONLET_REPLICA_COMPLETE);
    moonlet_replica_list_free(&l);
    assert_true(lease_ms(NULL, "life") > 4000);
    assert_int_equal(moonlet_mc_remove(g_mc, NULL, "life"), MOONLET_ERR_OBJECT_HAS_LEASE);
    assert_int_equal(moonlet_mc_put_start(g_mc, NULL, "life", 10, 1, false, &l), MOONLET_ERR_OBJECT_ALREADY_EXISTS);
    assert_int_equal(moonlet_mc_get_replica_list(g_mc, NULL, "nope", &l), MOONLET_ERR_OBJECT_NOT_FOUND);

    bool ex = false;
    assert_int_equal(moonlet_mc_exist_key(g_mc, NULL, "life", &ex), MOONLET_OK);
    assert_true(ex);
    assert_int_equal(moonlet_mc_probe_key(g_mc, NULL, "nope", &ex), MOONLET_OK);
    assert_false(ex);
    assert_int_equal(put("other", "k", 10, 1), MOONLET_OK);
    uint64_t removed = 0;
    assert_int_equal(moonlet_mc_remove_all(g_mc, "other", &removed), MOONLET_OK);
    assert_int_equal(removed, 1);
    assert_int_equal(moonlet_mc_echo(g_mc, "x", 1), MOONLET_OK);
    uint32_t segs = 99;
    assert_int_equal(moonlet_mc_ping(g_mc, "node-1", &segs), MOONLET_OK);
    assert_int_equal(segs, 1);
    assert_int_equal(moonlet_mc_ping(g_mc, "node-never-mounted", &segs), MOONLET_OK);
    assert_int_equal(segs, 0);
    assert_int_equal(moonlet_mc_ping(g_mc, "node-2", NULL), MOONLET_OK);

    cJSON *j;
    assert_int_equal(moonlet_mc_list_segments(g_mc, &j), MOONLET_OK);
    assert_int_equal(cJSON_GetArraySize(j), 2);
    cJSON_Delete(j);
    /* paged: one segment per page, then the rest; one client's only */
    assert_int_equal(moonlet_mc_list_segments_page(g_mc, 0, 1, NULL, &j), MOONLET_OK);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "segments")), 1);
    double next = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "next_cursor"));
    assert_true(next > 0);
    cJSON_Delete(j);
    assert_int_equal(moonlet_mc_list_segments_page(g_mc, (uint64_t)next, 10, NULL, &j), MOONLET_OK);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "segments")), 1);
    assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "next_cursor")) == 0);
    cJSON_Delete(j);
    assert_int_equal(moonlet_mc_list_segments_page(g_mc, 0, 0, "node-2", &j), MOONLET_OK);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "segments")), 1);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(
                            cJSON_GetArrayItem(cJSON_GetObjectItem(j, "segments"), 0), "client_id")),
                        "node-2");
    cJSON_Delete(j);
    assert_int_equal(moonlet_mc_list_segments_page(g_mc, 0, 10001, NULL, &j),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_mc_stats(g_mc, &j), MOONLET_OK);
    assert_true(cJSON_GetObjectItem(j, "objects")->valuedouble >= 1);
    assert_non_null(cJSON_GetObjectItem(j, "probe_lock_hold_us_hist"));
    cJSON_Delete(j);
    assert_int_equal(moonlet_mc_list_keys(g_mc, NULL, "li", "", 10, &j), MOONLET_OK);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "keys")), 1);
    cJSON_Delete(j);
}

/* PutStart's trailing args over the wire: preferred segment, hard pin,
 * soft-pin TTL; the five-argument form keeps working. */
static void test_put_start_options(void **state)
{
    (void)state;
    moonlet_replica_list l;
    const char *const pref[] = {"seg-2"};
    moonlet_mc_put_extra x = {.preferred = pref, .npreferred = 1};
    for (int i = 0; i < 4; i++) {
        char key[16];
        snprintf(key, sizeof(key), "pref%d", i);
        assert_int_equal(moonlet_mc_put_start_ex(g_mc, "opt", key, 100, 1, false, &x, &l), MOONLET_OK);
        assert_int_equal(l.count, 1);
        assert_string_equal(l.replicas[0].segment_id, "seg-2");
        moonlet_replica_list_free(&l);
        assert_int_equal(moonlet_mc_put_end(g_mc, "opt", key), MOONLET_OK);
    }
    x = (moonlet_mc_put_extra){.hard_pin = true};
    assert_int_equal(moonlet_mc_put_start_ex(g_mc, "opt", "hard", 100, 1, false, &x, &l), MOONLET_OK);
    moonlet_replica_list_free(&l);
    assert_int_equal(moonlet_mc_put_end(g_mc, "opt", "hard"), MOONLET_OK);
    x = (moonlet_mc_put_extra){.soft_pin_ttl_ms = 7000};
    assert_int_equal(moonlet_mc_put_start_ex(g_mc, "opt", "soft", 100, 1, true, &x, &l), MOONLET_OK);
    moonlet_replica_list_free(&l);
    assert_int_equal(moonlet_mc_put_end(g_mc, "opt", "soft"), MOONLET_OK);
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_inspect_key(g_mc, "opt", "hard", &j), MOONLET_OK);
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(j, "hard_pinned")));
    cJSON_Delete(j);
    assert_int_equal(moonlet_mc_inspect_key(g_mc, "opt", "soft", &j), MOONLET_OK);
    double left = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "soft_pin_remaining_ms"));
    assert_true(left > 5000 && left <= 7000);
    assert_false(cJSON_IsTrue(cJSON_GetObjectItem(j, "hard_pinned")));
    cJSON_Delete(j);
    assert_int_equal(moonlet_mc_stats(g_mc, &j), MOONLET_OK);
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "hard_pinned")), 1);
    assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(j, "hard_pinned_bytes")), 100);
    cJSON_Delete(j);
    /* Remove still takes a hard-pinned object */
    assert_int_equal(moonlet_mc_remove(g_mc, "opt", "hard"), MOONLET_OK);
    /* the old five-argument PutStart */
    assert_int_equal(put("opt", "old", 100, 2), MOONLET_OK);
    uint64_t removed = 0;
    assert_int_equal(moonlet_mc_remove_all(g_mc, "opt", &removed), MOONLET_OK);
    assert_int_equal(removed, 6);
}

static const char *const K3[] = {"kda/128/r0", "kda/128/r1", "kda/256/r0",
                                 "kda/256/r1", "kda/384/r0", "kda/384/r1"};

static void test_probe_through_rpc(void **state)
{
    (void)state;
    const char *t = "probe-rpc";
    assert_int_equal(put(t, K3[0], 64, 1), MOONLET_OK);
    assert_int_equal(put(t, K3[1], 64, 1), MOONLET_OK);
    assert_int_equal(put(t, K3[3], 64, 1), MOONLET_OK);
    assert_int_equal(put(t, K3[4], 64, 1), MOONLET_OK);
    int32_t r[6];
    /* NONE: existence, no lease */
    assert_int_equal(moonlet_mc_batch_probe_key(g_mc, t, MOONLET_GRANT_LEASE_POLICY_DEFAULT, K3, 6, r), MOONLET_OK);
    int want_none[] = {1, 1, 0, 1, 1, 0};
    for (int i = 0; i < 6; i++)
        assert_int_equal(r[i], want_none[i]);
    for (int i = 0; i < 6; i++)
        assert_true(lease_ms(t, K3[i]) <= 0);
    /* the worked example */
    moonlet_grant_lease_policy p = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 2};
    assert_int_equal(moonlet_mc_batch_probe_key(g_mc, t, p, K3, 6, r), MOONLET_OK);
    int want[] = {1, 1, 0, 0, 0, 0};
    for (int i = 0; i < 6; i++)
        assert_int_equal(r[i], want[i]);
    assert_true(lease_ms(t, K3[0]) > 4000);
    assert_true(lease_ms(t, K3[1]) > 4000);
    assert_true(lease_ms(t, K3[3]) == 0);
    assert_true(lease_ms(t, K3[4]) == 0);
    /* invalid policies come back as INVALID_PARAMS */
    p.candidate_size = 4;
    assert_int_equal(moonlet_mc_batch_probe_key(g_mc, t, p, K3, 6, r), MOONLET_ERR_INVALID_PARAMS);
    p.candidate_size = 0;
    assert_int_equal(moonlet_mc_batch_probe_key(g_mc, t, p, K3, 6, r), MOONLET_ERR_INVALID_PARAMS);
    p = (moonlet_grant_lease_policy){9, 2};
    assert_int_equal(moonlet_mc_batch_probe_key(g_mc, t, p, K3, 6, r), MOONLET_ERR_INVALID_PARAMS);
    /* empty request, per-key errors */
    p = (moonlet_grant_lease_policy){MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 2};
    assert_int_equal(moonlet_mc_batch_probe_key(g_mc, t, p, K3, 0, r), MOONLET_OK);
    const char *with_err[] = {K3[0], ""};
    assert_int_equal(moonlet_mc_batch_probe_key(g_mc, t, p, with_err, 2, r), MOONLET_OK);
    assert_int_equal(r[0], 0);
    assert_int_equal(r[1], MOONLET_ERR_INVALID_KEY);
    /* counters */
    cJSON *j;
    assert_int_equal(moonlet_mc_stats(g_mc, &j), MOONLET_OK);
    assert_true(cJSON_GetObjectItem(j, "probe_calls_last_hit_only")->valuedouble >= 2);
    assert_true(cJSON_GetObjectItem(j, "probe_calls_none")->valuedouble >= 1);
    assert_true(cJSON_GetObjectItem(j, "leases_probe")->valuedouble >= 2);
    cJSON_Delete(j);
}

/* Several connections at once, each its own MasterClient. */
static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    moonlet_master_client *mc;
    if (moonlet_mc_create(g_master.addr, NULL, &mc))
        return (void *)1;
    intptr_t bad = 0;
    char key[64];
    const char *keys[50];
    static __thread char names[50][64];
    for (int i = 0; i < 50; i++) {
        snprintf(names[i], sizeof(names[i]), "w%d-k%d", id, i);
        keys[i] = names[i];
        moonlet_replica_list l;
        snprintf(key, sizeof(key), "w%d-k%d", id, i);
        if (moonlet_mc_put_start(mc, "conc", key, 4096, 1, false, &l) || l.count != 1)
            bad++;
        moonlet_replica_list_free(&l);
        if (moonlet_mc_put_end(mc, "conc", key))
            bad++;
    }
    int32_t r[50];
    for (int round = 0; round < 20; round++) {
        if (moonlet_mc_batch_exist_key(mc, "conc", keys, 50, r))
            bad++;
        for (int i = 0; i < 50; i++)
            bad += r[i] != 1;
    }
    moonlet_mc_destroy(mc);
    return (void *)bad;
}

static void test_concurrent_connections(void **state)
{
    (void)state;
    pthread_t th[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < 8; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        assert_int_equal((intptr_t)ret, 0);
    }
}

/* The request begun on c gets reply `code`; an error reply carries its
 * message as the result. */
static void assert_reply(moonlet_rpc_client *c, int code)
{
    moonlet_reply rep;
    assert_int_equal(moonlet_rpc_client_call(c, &rep), MOONLET_OK);
    assert_int_equal(rep.code, code);
    if (code != MOONLET_OK)
        assert_int_equal(rep.result->type, MSGPACK_OBJECT_STR);
    moonlet_reply_destroy(&rep);
}

/* Wrongly-typed arguments from the network: an error reply, and the same
 * connection keeps working. */
static void test_bad_arguments(void **state)
{
    (void)state;
    moonlet_rpc_client *c;
    assert_int_equal(moonlet_rpc_client_connect("127.0.0.1", (uint16_t)g_master.port, NULL, &c), MOONLET_OK);
    /* lease_mode as a string */
    msgpack_packer *pk = moonlet_rpc_client_begin(c, MOONLET_M_BATCH_PROBE_KEY, 4);
    moonlet_pack_cstr(pk, "");
    moonlet_pack_cstr(pk, "last-hit");
    msgpack_pack_uint64(pk, 2);
    msgpack_pack_array(pk, 0);
    assert_reply(c, MOONLET_ERR_INVALID_PARAMS);
    /* a key that is not a string */
    pk = moonlet_rpc_client_begin(c, MOONLET_M_BATCH_EXIST_KEY, 2);
    moonlet_pack_cstr(pk, "");
    msgpack_pack_array(pk, 2);
    moonlet_pack_cstr(pk, "a");
    msgpack_pack_int(pk, 5);
    assert_reply(c, MOONLET_ERR_INVALID_PARAMS);
    /* missing arguments */
    pk = moonlet_rpc_client_begin(c, MOONLET_M_PUT_START, 1);
    moonlet_pack_cstr(pk, "");
    assert_reply(c, MOONLET_ERR_INVALID_PARAMS);
    /* negative size */
    pk = moonlet_rpc_client_begin(c, MOONLET_M_PUT_START, 5);
    moonlet_pack_cstr(pk, "");
    moonlet_pack_cstr(pk, "neg");
    msgpack_pack_int(pk, -5);
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_false(pk);
    assert_reply(c, MOONLET_ERR_INVALID_PARAMS);
    /* more arguments than PutStart declares (the table's count rule) */
    pk = moonlet_rpc_client_begin(c, MOONLET_M_PUT_START, 9);
    moonlet_pack_cstr(pk, "");
    moonlet_pack_cstr(pk, "extra");
    msgpack_pack_uint64(pk, 5);
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_false(pk);
    msgpack_pack_array(pk, 0);
    msgpack_pack_false(pk);
    msgpack_pack_uint64(pk, 0);
    msgpack_pack_nil(pk);
    assert_reply(c, MOONLET_ERR_INVALID_PARAMS);
    /* unknown method */
    moonlet_rpc_client_begin(c, 9999, 0);
    assert_reply(c, MOONLET_ERR_INVALID_PARAMS);
    /* an oversized key */
    static char big[5000];
    memset(big, 'x', sizeof(big) - 1);
    pk = moonlet_rpc_client_begin(c, MOONLET_M_EXIST_KEY, 2);
    moonlet_pack_cstr(pk, "");
    moonlet_pack_cstr(pk, big);
    assert_reply(c, MOONLET_ERR_INVALID_KEY);
    /* still usable */
    moonlet_rpc_client_begin(c, MOONLET_M_ECHO, 0);
    assert_reply(c, MOONLET_OK);
    moonlet_rpc_client_close(c);

    /* an oversized frame over a raw socket: error or close, never a crash */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_master.port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    unsigned char hdr[4] = {0x7f, 0xff, 0xff, 0xff};
    assert_int_equal(write(fd, hdr, 4), 4);
    char buf[256];
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    long long deadline = proc_now_ms() + 3000;
    ssize_t n = 1;
    while (n > 0 && proc_now_ms() < deadline)
        n = poll(&pfd, 1, 100) > 0 ? read(fd, buf, sizeof(buf)) : 1;
    assert_true(n <= 0); /* closed by the server */
    close(fd);
    assert_int_equal(moonlet_mc_echo(g_mc, "", 0), MOONLET_OK); /* the daemon lives on */
}

static void test_auth_token(void **state)
{
    (void)state;
    char path[] = "/tmp/moonlet-token-XXXXXX";
    assert_int_equal(cl_token_file(path, "s3cret"), 0);
    char *argv[] = {"tools/moonlet-master", "--rpc-port", "0", "--shards", "8",
                    "--auth-token-file", path, "--log-level", "warn", NULL};
    test_proc p;
    assert_int_equal(proc_start(&p, argv, 5000), 0);
    moonlet_master_client *mc = NULL;
    assert_int_equal(moonlet_mc_create(p.addr, NULL, &mc), MOONLET_ERR_ILLEGAL_CLIENT);
    moonlet_master_client_opts o = {.auth_token = "wrong"};
    assert_int_equal(moonlet_mc_create(p.addr, &o, &mc), MOONLET_ERR_ILLEGAL_CLIENT);
    o.auth_token = "s3cret";
    assert_int_equal(moonlet_mc_create(p.addr, &o, &mc), MOONLET_OK);
    assert_int_equal(moonlet_mc_echo(mc, "", 0), MOONLET_OK);
    moonlet_mc_destroy(mc);
    assert_int_equal(proc_stop(&p), 0);
    unlink(path);
}

/* ---- reconnecting ------------------------------------------------------------ */

static void test_backoff_schedule(void **state)
{
    (void)state;
    assert_int_equal(moonlet_mc_backoff_ms(50, 1000, 0), 0);
    assert_int_equal(moonlet_mc_backoff_ms(50, 1000, 1), 50);
    assert_int_equal(moonlet_mc_backoff_ms(50, 1000, 2), 100);
    assert_int_equal(moonlet_mc_backoff_ms(50, 1000, 3), 200);
    assert_int_equal(moonlet_mc_backoff_ms(50, 1000, 5), 800);
    assert_int_equal(moonlet_mc_backoff_ms(50, 1000, 6), 1000);
    assert_int_equal(moonlet_mc_backoff_ms(50, 1000, 4000000), 1000);
    assert_int_equal(moonlet_mc_backoff_ms(300, 100, 3), 300); /* cap below base: base */
}

/* After NOT_LEADER: the backoff, capped at MOONLET_MC_NOT_LEADER_CAP_MS
 * (an election: a master is up), or exactly the grace an elected leader
 * said was left (+1 ms).  Before, every NOT_LEADER round counted as a
 * failed connect under the full backoff, so a client had been asleep for
 * up to 1 s when the new leader began serving (moonlet-bench ha). */
static void test_retry_after_not_leader(void **state)
{
    (void)state;
    const int NL = MOONLET_ERR_NOT_LEADER, FAIL = MOONLET_ERR_RPC_FAIL;
    /* unreachable masters: the backoff as it was */
    assert_int_equal(moonlet_mc_retry_ms(50, 1000, 6, FAIL, 0), 1000);
    assert_int_equal(moonlet_mc_retry_ms(50, 1000, 6, FAIL, 700), 1000);
    assert_int_equal(moonlet_mc_retry_ms(50, 1000, 2, FAIL, 0), 100);
    /* NOT_LEADER, no leader in sight: the backoff, at most the cap */
    assert_int_equal(moonlet_mc_retry_ms(50, 1000, 2, NL, 0), 100);
    assert_int_equal(moonlet_mc_retry_ms(50, 1000, 6, NL, 0), MOONLET_MC_NOT_LEADER_CAP_MS);
    assert_int_equal(moonlet_mc_retry_ms(50, 1000, 64, NL, 0), MOONLET_MC_NOT_LEADER_CAP_MS);
    assert_int_equal(moonlet_mc_retry_ms(400, 1000, 3, NL, 0), 400); /* base above the cap */
    /* an elected leader in its grace period: when it serves */
    assert_int_equal(moonlet_mc_retry_ms(50, 1000, 6, NL, 1234), 1235);
    assert_int_equal(moonlet_mc_retry_ms(50, 1000, 1, NL, 3), 4);
    assert_int_equal(moonlet_mc_retry_ms(50, 1000, 1, NL, 10000000), 600000);
}

static int start_own_master(test_proc *p, const char *port)
{
    char *argv[] = {"tools/moonlet-master", "--rpc-port", (char *)port, "--shards", "8",
                    "--log-level", "error", NULL};
    return proc_start(p, argv, 5000);
}

static void test_reconnect_with_backoff(void **state)
{
    (void)state;
    test_proc p;
    assert_int_equal(start_own_master(&p, "0"), 0);
    char port[16];
    snprintf(port, sizeof(port), "%u", p.port);
    moonlet_master_client_opts o = {.timeout_ms = 500, .backoff_base_ms = 50, .backoff_cap_ms = 400};
    moonlet_master_client *mc = NULL;
    assert_int_equal(moonlet_mc_create(p.addr, &o, &mc), MOONLET_OK);

    /* Restarted under an idle connection: the first call already reaches the new master. */
    assert_int_equal(proc_stop_sig(&p, SIGKILL, 3000), 128 + SIGKILL);
    assert_int_equal(start_own_master(&p, port), 0);
    assert_int_equal(moonlet_mc_echo(mc, "", 0), MOONLET_OK);
    assert_int_equal(moonlet_mc_connect_failures(mc), 0);

    /* Down: 1.5 s of back-to-back calls make a handful of connect attempts
     * (at about 0, 50, 150, 350, 750, 1150 ms), not thousands, and no call
     * takes longer than the wait it is due plus its connect. */
    assert_int_equal(proc_stop_sig(&p, SIGKILL, 3000), 128 + SIGKILL);
    long long t0 = proc_now_ms(), longest = 0;
    unsigned calls = 0;
    while (proc_now_ms() - t0 < 1500) {
        long long c0 = proc_now_ms();
        assert_int_not_equal(moonlet_mc_echo(mc, "", 0), MOONLET_OK);
        long long took = proc_now_ms() - c0;
        longest = took > longest ? took : longest;
        calls++;
    }
    unsigned failures = moonlet_mc_connect_failures(mc);
    if (failures < 4 || failures > 9 || longest > 400 + 300)
        fail_msg("%u calls made %u connect attempts; longest call %lld ms", calls, failures, longest);

    /* Back: the next attempt is at most one capped wait away. */
    assert_int_equal(start_own_master(&p, port), 0);
    long long up = proc_now_ms(), deadline = up + 3000;
    int rc;
    while ((rc = moonlet_mc_echo(mc, "", 0)) != MOONLET_OK && proc_now_ms() < deadline)
        ;
    assert_int_equal(rc, MOONLET_OK);
    if (proc_now_ms() - up > 400 + 300)
        fail_msg("reconnected %lld ms after the master came back", proc_now_ms() - up);
    assert_int_equal(moonlet_mc_connect_failures(mc), 0);
    moonlet_mc_destroy(mc);

    /* A wait longer than the call's timeout is not waited: the call fails at once. */
    moonlet_master_client_opts fast = {.timeout_ms = 100, .backoff_base_ms = 1000,
                                       .backoff_cap_ms = 1000};
    assert_int_equal(moonlet_mc_create(p.addr, &fast, &mc), MOONLET_OK);
    assert_int_equal(proc_stop_sig(&p, SIGKILL, 3000), 128 + SIGKILL);
    assert_int_not_equal(moonlet_mc_echo(mc, "", 0), MOONLET_OK);
    assert_int_equal(moonlet_mc_connect_failures(mc), 1);
    long long c0 = proc_now_ms();
    assert_int_equal(moonlet_mc_echo(mc, "", 0), MOONLET_ERR_RPC_FAIL);
    assert_true(proc_now_ms() - c0 < 900); /* not the 1000 ms wait (wide for a loaded host) */
    assert_int_equal(moonlet_mc_connect_failures(mc), 1); /* no attempt was made */
    moonlet_mc_destroy(mc);
}

/* The batch put calls bind PutEnd and PutRevoke to their put: a put reaped
 * at its deadline and started again by another writer is neither sealed
 * nor revoked by the first writer's late BatchPutEnd / BatchPutRevoke
 * (OBJECT_NOT_FOUND), and the second writer's own calls still work.  A
 * batch whose arrays do not match its keys is refused whole. */
static void test_batch_put_names_its_put(void **state)
{
    (void)state;
    char *argv[] = {"tools/moonlet-master", "--rpc-port", "0", "--put_timeout_ms", "100",
                    "--log-level", "error", NULL};
    test_proc m;
    assert_int_equal(proc_start(&m, argv, 5000), 0);
    moonlet_master_client *mc;
    assert_int_equal(moonlet_mc_create(m.addr, NULL, &mc), MOONLET_OK);
    moonlet_segment_desc d = {.client_id = "node-1", .segment_id = "seg-1", .name = "seg-1",
                              .size = 64 << 20, .endpoint = "127.0.0.1:7001", .protocol = "tcp"};
    assert_int_equal(moonlet_mc_mount_segment(mc, &d), MOONLET_OK);
    const char *keys[] = {"late/k"};
    const uint64_t size[] = {4096};
    moonlet_replica_list l;
    uint64_t first = 0, second = 0;
    int32_t r[1];
    assert_int_equal(moonlet_mc_batch_put_start(mc, NULL, keys, size, 1, 1, false, NULL, &l,
                                                &first, r), MOONLET_OK);
    assert_int_equal(r[0], MOONLET_OK);
    assert_true(first != 0);
    moonlet_replica_list_free(&l);
    /* the first put is reaped at its deadline; then another writer's starts */
    long long deadline = proc_now_ms() + 10000;
    do {
        assert_true(proc_now_ms() < deadline);
        assert_int_equal(moonlet_mc_batch_put_start(mc, NULL, keys, size, 1, 1, false, NULL, &l,
                                                    &second, r), MOONLET_OK);
        moonlet_replica_list_free(&l);
        if (r[0] == MOONLET_ERR_OBJECT_ALREADY_EXISTS)
            usleep(20000); /* the master reaps on its own tick, which no call exposes */
    } while (r[0] == MOONLET_ERR_OBJECT_ALREADY_EXISTS);
    assert_int_equal(r[0], MOONLET_OK);
    assert_true(second != 0 && second != first);
    uint64_t ck = 42;
    assert_int_equal(moonlet_mc_batch_put_end(mc, NULL, keys, &ck, &first, 1, r), MOONLET_OK);
    assert_int_equal(r[0], MOONLET_ERR_OBJECT_NOT_FOUND); /* not the second's */
    assert_int_equal(moonlet_mc_batch_put_revoke(mc, NULL, keys, &first, 1, r), MOONLET_OK);
    assert_int_equal(r[0], MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(moonlet_mc_get_replica_list(mc, NULL, "late/k", &l),
                     MOONLET_ERR_REPLICA_IS_NOT_READY); /* still the second's, in progress */
    assert_int_equal(moonlet_mc_batch_put_end(mc, NULL, keys, NULL, &second, 1, r), MOONLET_OK);
    assert_int_equal(r[0], MOONLET_OK);
    assert_int_equal(moonlet_mc_get_replica_list(mc, NULL, "late/k", &l), MOONLET_OK);
    assert_false(l.has_checksum); /* the late writer's checksum never landed */
    moonlet_replica_list_free(&l);

    /* arrays that do not match the keys: the whole batch refused */
    moonlet_rpc_client *rc;
    assert_int_equal(moonlet_rpc_client_connect("127.0.0.1", (uint16_t)m.port, NULL, &rc),
                     MOONLET_OK);
    msgpack_packer *pk = moonlet_rpc_client_begin(rc, MOONLET_M_BATCH_PUT_START, 5);
    moonlet_pack_cstr(pk, "");
    msgpack_pack_array(pk, 2);
    moonlet_pack_cstr(pk, "x/1");
    moonlet_pack_cstr(pk, "x/2");
    msgpack_pack_array(pk, 1); /* one size for two keys */
    msgpack_pack_uint64(pk, 10);
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_false(pk);
    assert_reply(rc, MOONLET_ERR_INVALID_PARAMS);
    pk = moonlet_rpc_client_begin(rc, MOONLET_M_BATCH_PUT_END, 4);
    moonlet_pack_cstr(pk, "");
    msgpack_pack_array(pk, 2);
    moonlet_pack_cstr(pk, "x/1");
    moonlet_pack_cstr(pk, "x/2");
    msgpack_pack_array(pk, 0);
    msgpack_pack_array(pk, 3); /* three put ids for two keys */
    for (int i = 1; i <= 3; i++)
        msgpack_pack_uint64(pk, (uint64_t)i);
    assert_reply(rc, MOONLET_ERR_INVALID_PARAMS);
    moonlet_rpc_client_close(rc);
    moonlet_mc_destroy(mc);
    proc_stop(&m);
}

MOONLET_TEST_MAIN("master_rpc", start_master, stop_master,
                  cmocka_unit_test(test_lifecycle),
                  cmocka_unit_test(test_probe_through_rpc),
                  cmocka_unit_test(test_put_start_options),
                  cmocka_unit_test(test_concurrent_connections),
                  cmocka_unit_test(test_bad_arguments),
                  cmocka_unit_test(test_auth_token),
                  cmocka_unit_test(test_backoff_schedule),
                  cmocka_unit_test(test_retry_after_not_leader),
                  cmocka_unit_test(test_reconnect_with_backoff),
                  cmocka_unit_test(test_batch_put_names_its_put))
