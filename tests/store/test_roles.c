/*
 * Integration test of roles and tenant-bound credentials (issue 33):
 * starts `moonlet-master --credentials FILE` on an ephemeral port and drives
 * it through MasterClient with one credential per role.  Each role boundary
 * is one test: a client credential cannot drain, unmount, force-remove,
 * remove a whole tenant, read another tenant's keys (probe, get, exist,
 * remove, inspect) or reach the replication port; a node credential cannot
 * put or get; a reader cannot change anything; the operator can do what the
 * others may not; refusals are PERMISSION_DENIED on a connection that stays
 * usable, and are counted on /metrics (readable with a reader credential,
 * not with a client's).  A token the file does not hold is ILLEGAL_CLIENT.
 *
 * On a master without roles (one shared token: tests/store/test_master_rpc.c
 * test_auth_token) every one of these calls succeeds.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "../common/cluster.h"
#include "../common/http_get.h"
#include "cred.h"
#include "master_client.h"
#include "methods.h"
#include "moonlet/error.h"
#include "rpc_client.h"
#include "../common/test_main.h"

#define T_CLIENT_A "client-a-secret"
#define T_CLIENT_AB "client-ab-secret"
#define T_NODE "node-secret"
#define T_OPER "operator-secret"
#define T_READER "reader-secret" /* in the file as its sha256: */
#define T_PEER "peer-secret"
#define T_ALL "all-secret"

static test_proc g_master;
static char g_path[] = "/tmp/moonlet-creds-XXXXXX";
static uint16_t g_metrics_port;

static moonlet_master_client *as(const char *token)
{
    moonlet_master_client_opts o = {.auth_token = token, .timeout_ms = 3000};
    moonlet_master_client *mc = NULL;
    assert_int_equal(moonlet_mc_create(g_master.addr, &o, &mc), MOONLET_OK);
    return mc;
}

static int put_as(moonlet_master_client *mc, const char *tenant, const char *key)
{
    moonlet_replica_list l;
    int rc = moonlet_mc_put_start(mc, tenant, key, 4096, 1, false, &l);
    if (rc)
        return rc;
    moonlet_replica_list_free(&l);
    return moonlet_mc_put_end(mc, tenant, key);
}

static int start(void **state)
{
    (void)state;
    uint8_t h[MOONLET_CRED_HASH_BYTES];
    moonlet_cred_key(T_READER, strlen(T_READER), h);
    char hex[2 * MOONLET_CRED_HASH_BYTES + 1];
    for (size_t i = 0; i < sizeof(h); i++)
        snprintf(hex + 2 * i, 3, "%02x", h[i]);
    char text[1024];
    snprintf(text, sizeof(text),
             "# test credentials: TOKEN-OR-HASH ROLES [TENANTS]\n"
             "\n"
             T_CLIENT_A "   client   tenant-a\n"
             T_CLIENT_AB "  client   tenant-a,tenant-b   # two tenants\n"
             T_NODE "       node\n"
             T_OPER "   operator\n"
             "sha256:%s reader\n"
             T_PEER "       peer\n"
             T_ALL "        all\n",
             hex);
    if (cl_token_file(g_path, text))
        return -1;
    char *argv[] = {"tools/moonlet-master", "--rpc-address", "127.0.0.1", "--rpc-port", "0",
                    "--shards", "8", "--credentials", g_path, "--metrics-port", "0",
                    "--client_live_ttl_sec", "60", "--log-level", "error", NULL};
    if (proc_start(&g_master, argv, 5000))
        return -1;
    char line[256];
    long long deadline = proc_now_ms() + 5000;
    unsigned port = 0;
    while (!port && proc_read_line(&g_master, line, sizeof(line), deadline))
        if (sscanf(line, "metrics on %*[^:]:%u", &port) != 1)
            port = 0;
    g_metrics_port = (uint16_t)port;
    /* the node mounts the segments, as a store node would */
    moonlet_master_client_opts o = {.auth_token = T_NODE};
    moonlet_master_client *node = NULL;
    if (moonlet_mc_create(g_master.addr, &o, &node))
        return -1;
    moonlet_segment_desc d1 = {.client_id = "node-1", .segment_id = "seg-1", .name = "seg-1",
                               .size = 64 << 20, .endpoint = "127.0.0.1:7001", .protocol = "tcp"};
    int rc = moonlet_mc_mount_segment(node, &d1);
    moonlet_mc_destroy(node);
    return rc || !g_metrics_port ? -1 : 0;
}

static int stop(void **state)
{
    (void)state;
    int rc = proc_stop(&g_master);
    unlink(g_path);
    return rc ? -1 : 0;
}

/* A token the file does not hold opens nothing; no token neither. */
static void test_unknown_token(void **state)
{
    (void)state;
    moonlet_master_client_opts o = {.auth_token = "nobody", .timeout_ms = 3000};
    moonlet_master_client *mc = NULL;
    assert_int_equal(moonlet_mc_create(g_master.addr, &o, &mc), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(moonlet_mc_create(g_master.addr, NULL, &mc), MOONLET_ERR_ILLEGAL_CLIENT);
    /* the hash itself is not a token */
    uint8_t h[MOONLET_CRED_HASH_BYTES];
    moonlet_cred_key(T_READER, strlen(T_READER), h);
    char hex[80] = "sha256:";
    for (size_t i = 0; i < sizeof(h); i++)
        snprintf(hex + 7 + 2 * i, 3, "%02x", h[i]);
    o.auth_token = hex;
    assert_int_equal(moonlet_mc_create(g_master.addr, &o, &mc), MOONLET_ERR_ILLEGAL_CLIENT);
}

/* A client credential: its own tenant's keys, nothing else. */
static void test_client_cannot_administer(void **state)
{
    (void)state;
    moonlet_master_client *c = as(T_CLIENT_A);
    assert_int_equal(put_as(c, "tenant-a", "k1"), MOONLET_OK);
    bool exists = false;
    assert_int_equal(moonlet_mc_exist_key(c, "tenant-a", "k1", &exists), MOONLET_OK);
    assert_true(exists);
    uint32_t n = 0;
    assert_int_equal(moonlet_mc_drain(c, "seg-1", true, &n), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_drain(c, "seg-1", false, &n), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_unmount_segment(c, "node-1", "seg-1"),
                     MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_remove_ex(c, "tenant-a", "k1", true),
                     MOONLET_ERR_PERMISSION_DENIED);
    uint64_t removed = 0;
    assert_int_equal(moonlet_mc_remove_all_ex(c, "tenant-a", true, &removed),
                     MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_remove_all(c, "tenant-a", &removed),
                     MOONLET_ERR_PERMISSION_DENIED);
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_list_keys(c, "tenant-a", "", "", 10, &j),
                     MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_list_tenants(c, 10, &j), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_stats(c, &j), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_ping(c, "node-1", NULL), MOONLET_ERR_PERMISSION_DENIED);
    moonlet_segment_desc d = {.client_id = "evil", .segment_id = "seg-evil", .name = "seg-evil",
                              .size = 1 << 20, .endpoint = "127.0.0.1:7666", .protocol = "tcp"};
    assert_int_equal(moonlet_mc_mount_segment(c, &d), MOONLET_ERR_PERMISSION_DENIED);
    /* the segment is still there and still takes puts: nothing was drained */
    assert_int_equal(put_as(c, "tenant-a", "k2"), MOONLET_OK);
    /* its own keys: a plain remove is a client's call */
    assert_int_equal(moonlet_mc_remove(c, "tenant-a", "k2"), MOONLET_OK);
    moonlet_mc_destroy(c);
}

/* The replication port (and so the stream and the snapshot behind it) is
 * the masters' alone: a client credential gets PERMISSION_DENIED for
 * ReplPort, a peer credential its answer. */
static void test_client_cannot_reach_replication(void **state)
{
    (void)state;
    const char *toks[] = {T_CLIENT_A, T_NODE, T_READER, T_OPER, T_PEER};
    const int want[] = {MOONLET_ERR_PERMISSION_DENIED, MOONLET_ERR_PERMISSION_DENIED,
                        MOONLET_ERR_PERMISSION_DENIED, MOONLET_ERR_PERMISSION_DENIED, MOONLET_OK};
    char host[64];
    uint16_t port = 0;
    assert_int_equal(sscanf(g_master.addr, "%63[^:]:%hu", host, &port), 2);
    for (size_t i = 0; i < sizeof(toks) / sizeof(toks[0]); i++) {
        moonlet_rpc_client_opts o = {.timeout_ms = 3000, .auth_token = toks[i],
                                     .auth_token_len = strlen(toks[i])};
        moonlet_rpc_client *rc = NULL;
        assert_int_equal(moonlet_rpc_client_connect(host, port, &o, &rc), MOONLET_OK);
        moonlet_rpc_client_begin(rc, MOONLET_M_REPL_PORT, 0);
        assert_int_equal(moonlet_rpc_client_call_code(rc), want[i]);
        /* the connection stays usable after a refusal */
        moonlet_rpc_client_begin(rc, MOONLET_M_ECHO, 0);
        assert_int_equal(moonlet_rpc_client_call_code(rc), MOONLET_OK);
        moonlet_rpc_client_close(rc);
    }
}

/* A credential limited to tenant-a: every call naming tenant-b (or the
 * default tenant) is refused, reads included; one holding both reads both. */
static void test_client_cannot_read_another_tenant(void **state)
{
    (void)state;
    moonlet_master_client *ab = as(T_CLIENT_AB);
    assert_int_equal(put_as(ab, "tenant-b", "secret-b"), MOONLET_OK);
    moonlet_master_client *a = as(T_CLIENT_A);
    bool exists = true;
    assert_int_equal(moonlet_mc_exist_key(a, "tenant-b", "secret-b", &exists),
                     MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_probe_key(a, "tenant-b", "secret-b", &exists),
                     MOONLET_ERR_PERMISSION_DENIED);
    moonlet_replica_list l;
    assert_int_equal(moonlet_mc_get_replica_list(a, "tenant-b", "secret-b", &l),
                     MOONLET_ERR_PERMISSION_DENIED);
    const char *keys[] = {"secret-b"};
    int32_t res[1] = {0};
    assert_int_equal(moonlet_mc_batch_exist_key(a, "tenant-b", keys, 1, res),
                     MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_batch_probe_key(a, "tenant-b",
                                                MOONLET_GRANT_LEASE_POLICY_DEFAULT, keys, 1, res),
                     MOONLET_ERR_PERMISSION_DENIED);
    moonlet_replica_list lists[1];
    assert_int_equal(moonlet_mc_batch_get_replica_list(a, "tenant-b", keys, 1, lists, res),
                     MOONLET_ERR_PERMISSION_DENIED);
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_inspect_key(a, "tenant-b", "secret-b", &j),
                     MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_remove(a, "tenant-b", "secret-b"), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(put_as(a, "tenant-b", "planted"), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(put_as(a, "", "in-default"), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(put_as(a, "default", "in-default"), MOONLET_ERR_PERMISSION_DENIED);
    /* the key is still there, unharmed, for the credential that may read it */
    assert_int_equal(moonlet_mc_get_replica_list(ab, "tenant-b", "secret-b", &l), MOONLET_OK);
    moonlet_replica_list_free(&l);
    assert_int_equal(moonlet_mc_inspect_key(ab, "tenant-b", "secret-b", &j), MOONLET_OK);
    cJSON_Delete(j);
    moonlet_mc_destroy(a);
    moonlet_mc_destroy(ab);
}

/* A node credential mounts and pings; it does not put or get. */
static void test_node_cannot_put_or_get(void **state)
{
    (void)state;
    moonlet_master_client *c = as(T_CLIENT_A);
    assert_int_equal(put_as(c, "tenant-a", "node-target"), MOONLET_OK);
    moonlet_mc_destroy(c);
    moonlet_master_client *n = as(T_NODE);
    assert_int_equal(put_as(n, "tenant-a", "from-node"), MOONLET_ERR_PERMISSION_DENIED);
    moonlet_replica_list l;
    assert_int_equal(moonlet_mc_get_replica_list(n, "tenant-a", "node-target", &l),
                     MOONLET_ERR_PERMISSION_DENIED);
    bool exists;
    assert_int_equal(moonlet_mc_exist_key(n, "tenant-a", "node-target", &exists),
                     MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_remove(n, "tenant-a", "node-target"),
                     MOONLET_ERR_PERMISSION_DENIED);
    uint32_t n_drained = 0;
    assert_int_equal(moonlet_mc_drain(n, "seg-1", true, &n_drained),
                     MOONLET_ERR_PERMISSION_DENIED);
    /* what a node does */
    moonlet_segment_desc d = {.client_id = "node-2", .segment_id = "seg-2", .name = "seg-2",
                              .size = 1 << 20, .endpoint = "127.0.0.1:7002", .protocol = "tcp"};
    assert_int_equal(moonlet_mc_mount_segment(n, &d), MOONLET_OK);
    assert_int_equal(moonlet_mc_ping(n, "node-2", NULL), MOONLET_OK);
    assert_int_equal(moonlet_mc_unmount_segment(n, "node-2", "seg-2"), MOONLET_OK);
    moonlet_mc_destroy(n);
}

/* A reader inspects; every call that changes something is refused. */
static void test_reader_cannot_change_anything(void **state)
{
    (void)state;
    moonlet_master_client *r = as(T_READER);
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_list_segments(r, &j), MOONLET_OK);
    cJSON_Delete(j);
    assert_int_equal(moonlet_mc_stats(r, &j), MOONLET_OK);
    cJSON_Delete(j);
    assert_int_equal(moonlet_mc_list_tenants(r, 10, &j), MOONLET_OK);
    cJSON_Delete(j);
    assert_int_equal(moonlet_mc_list_keys(r, "tenant-a", "", "", 10, &j), MOONLET_OK);
    cJSON_Delete(j);
    assert_int_equal(put_as(r, "tenant-a", "by-reader"), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_remove(r, "tenant-a", "k1"), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_remove_ex(r, "tenant-a", "k1", true),
                     MOONLET_ERR_PERMISSION_DENIED);
    uint64_t removed = 0;
    assert_int_equal(moonlet_mc_remove_all_ex(r, "tenant-a", true, &removed),
                     MOONLET_ERR_PERMISSION_DENIED);
    uint32_t n = 0;
    assert_int_equal(moonlet_mc_drain(r, "seg-1", true, &n), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_drain(r, "seg-1", false, &n), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_unmount_segment(r, "node-1", "seg-1"),
                     MOONLET_ERR_PERMISSION_DENIED);
    moonlet_segment_desc d = {.client_id = "rd", .segment_id = "seg-rd", .name = "seg-rd",
                              .size = 1 << 20, .endpoint = "127.0.0.1:7667", .protocol = "tcp"};
    assert_int_equal(moonlet_mc_mount_segment(r, &d), MOONLET_ERR_PERMISSION_DENIED);
    assert_int_equal(moonlet_mc_ping(r, "node-1", NULL), MOONLET_ERR_PERMISSION_DENIED);
    moonlet_mc_destroy(r);
}

/* The operator drains, undrains, force-removes and empties a tenant; it is
 * not a client (no puts).  An "all" credential does both. */
static void test_operator(void **state)
{
    (void)state;
    moonlet_master_client *c = as(T_ALL);
    assert_int_equal(put_as(c, "tenant-op", "x"), MOONLET_OK);
    assert_int_equal(put_as(c, "tenant-op", "y"), MOONLET_OK);
    moonlet_mc_destroy(c);
    moonlet_master_client *o = as(T_OPER);
    assert_int_equal(put_as(o, "tenant-op", "z"), MOONLET_ERR_PERMISSION_DENIED);
    uint32_t n = 0;
    assert_int_equal(moonlet_mc_drain(o, "seg-1", true, &n), MOONLET_OK);
    assert_int_equal(n, 1);
    assert_int_equal(moonlet_mc_drain(o, "seg-1", false, &n), MOONLET_OK);
    assert_int_equal(moonlet_mc_remove_ex(o, "tenant-op", "x", true), MOONLET_OK);
    uint64_t removed = 0;
    assert_int_equal(moonlet_mc_remove_all_ex(o, "tenant-op", true, &removed), MOONLET_OK);
    assert_int_equal(removed, 1);
    moonlet_mc_destroy(o);
}

/* Refusals are counted on /metrics, which a reader credential may scrape
 * and a client credential may not. */
static void test_refusals_on_metrics(void **state)
{
    (void)state;
    moonlet_master_client *c = as(T_CLIENT_A);
    uint32_t n = 0;
    assert_int_equal(moonlet_mc_drain(c, "seg-1", true, &n), MOONLET_ERR_PERMISSION_DENIED);
    moonlet_mc_destroy(c);
    char *page = http_get(g_metrics_port, "GET /metrics HTTP/1.0\r\n"
                                          "Authorization: Bearer " T_CLIENT_A "\r\n\r\n");
    assert_non_null(page);
    assert_non_null(strstr(page, " 401 "));
    free(page);
    page = http_get(g_metrics_port, "GET /metrics HTTP/1.0\r\n"
                                    "Authorization: Bearer " T_READER "\r\n\r\n");
    assert_non_null(page);
    assert_non_null(strstr(page, " 200 "));
    const char *line = strstr(page, "\nmoonlet_rpc_permission_denied_total ");
    assert_non_null(line);
    unsigned long long v = 0;
    assert_int_equal(sscanf(line, "\nmoonlet_rpc_permission_denied_total %llu", &v), 1);
    assert_true(v >= 1);
    free(page);
}

/* The whole chain with roles: a store node presents its node token to the
 * master and serves its data port to the file's credentials (hashes only);
 * a client with a client credential puts and gets bytes in its tenant
 * through it (challenge-response on the data port), and is refused
 * another tenant's key. */
static void test_end_to_end_with_a_store_node(void **state)
{
    (void)state;
    char node_tok[] = "/tmp/moonlet-node-token-XXXXXX";
    assert_int_equal(cl_token_file(node_tok, T_NODE), 0);
    const char *extra[] = {"--auth-token-file", node_tok, "--credentials", g_path,
                           "--client-id", "store-e2e", NULL};
    test_proc st;
    assert_int_equal(cl_start_store(&st, g_master.addr, "16777216", extra), 0);
    moonlet_master_client *o = as(T_OPER); /* the fake segment takes no puts meanwhile */
    uint32_t n = 0;
    assert_int_equal(moonlet_mc_drain(o, "seg-1", true, &n), MOONLET_OK);
    moonlet_client_config cfg = cl_client_config(g_master.addr);
    cfg.auth_token = T_CLIENT_AB;
    cfg.default_tenant = "tenant-a";
    moonlet_client *c = cl_client_of(&cfg);
    unsigned char *data = cl_random_bytes(100000, 7);
    assert_int_equal(moonlet_client_put(c, "e2e", data, 100000, NULL), MOONLET_OK);
    cl_assert_get_equals(c, "e2e", NULL, data, 100000);
    moonlet_client_destroy(c);
    /* a client limited to tenant-a does not read tenant-b's copy */
    moonlet_put_options po = {.tenant = "tenant-b"};
    cfg.auth_token = T_CLIENT_AB;
    c = cl_client_of(&cfg);
    assert_int_equal(moonlet_client_put(c, "e2e-b", data, 1000, &po), MOONLET_OK);
    moonlet_client_destroy(c);
    cfg.auth_token = T_CLIENT_A;
    c = cl_client_of(&cfg);
    cl_assert_get_equals(c, "e2e", NULL, data, 100000);
    unsigned char buf[1000];
    size_t len = 0;
    assert_int_equal(moonlet_client_get(c, "e2e-b", buf, sizeof(buf), "tenant-b", &len),
                     MOONLET_ERR_PERMISSION_DENIED);
    moonlet_client_destroy(c);
    assert_int_equal(moonlet_mc_drain(o, "seg-1", false, &n), MOONLET_OK);
    moonlet_mc_destroy(o);
    free(data);
    assert_int_equal(proc_stop(&st), 0);
    unlink(node_tok);
}

MOONLET_TEST_MAIN("roles", start, stop,
                  cmocka_unit_test(test_unknown_token),
                  cmocka_unit_test(test_client_cannot_administer),
                  cmocka_unit_test(test_client_cannot_reach_replication),
                  cmocka_unit_test(test_client_cannot_read_another_tenant),
                  cmocka_unit_test(test_node_cannot_put_or_get),
                  cmocka_unit_test(test_reader_cannot_change_anything),
                  cmocka_unit_test(test_operator),
                  cmocka_unit_test(test_refusals_on_metrics),
                  cmocka_unit_test(test_end_to_end_with_a_store_node))
