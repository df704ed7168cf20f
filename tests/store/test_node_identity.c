/*
 * Node identity on the master (issue 13): a client id belongs to the
 * connection that holds it.  Another connection cannot unmount the node's
 * segment or keep it alive by pinging its published id; a second store node
 * started with the same --client-id is refused while the first lives (and
 * accepted at once after the first shut down cleanly); a store node serving
 * on a non-loopback address without a token says so.  A real moonlet-master
 * process, in-process store nodes.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "../common/cluster.h"
#include "log.h"
#include "moonlet/error.h"
#include "store_node.h"
#include "../common/test_main.h"

static test_proc g_master;

static int setup(void **state)
{
    (void)state;
    const char *extra[] = {"--client_live_ttl_sec", "2", NULL};
    return cl_start_master(&g_master, extra);
}

static int teardown(void **state)
{
    (void)state;
    return proc_stop(&g_master);
}

static bool segment_listed(moonlet_master_client *mc, const char *seg)
{
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_list_segments(mc, &j), MOONLET_OK);
    bool found = false;
    cJSON *s;
    cJSON_ArrayForEach(s, j) {
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(s, "segment_id"));
        found |= id && strcmp(id, seg) == 0;
    }
    cJSON_Delete(j);
    return found;
}

/* Any client could unmount another node's segment by naming its owner id. */
static void test_impostor_refused(void **state)
{
    (void)state;
    moonlet_master_client *node = NULL, *other = NULL;
    assert_int_equal(moonlet_mc_create(g_master.addr, NULL, &node), MOONLET_OK);
    assert_int_equal(moonlet_mc_create(g_master.addr, NULL, &other), MOONLET_OK);
    moonlet_segment_desc d = {.client_id = "node-a", .segment_id = "seg-a", .name = "seg-a",
                              .size = 1 << 20, .endpoint = "127.0.0.1:7001", .protocol = "tcp"};
    assert_int_equal(moonlet_mc_mount_segment(node, &d), MOONLET_OK);
    uint32_t segs = 0;
    assert_int_equal(moonlet_mc_ping(other, "node-a", &segs), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_int_equal(moonlet_mc_unmount_segment(other, "node-a", "seg-a"),
                     MOONLET_ERR_ILLEGAL_CLIENT);
    d.segment_id = d.name = "seg-a2";
    assert_int_equal(moonlet_mc_mount_segment(other, &d), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_true(segment_listed(node, "seg-a"));
    /* the owner still can */
    assert_int_equal(moonlet_mc_ping(node, "node-a", &segs), MOONLET_OK);
    assert_int_equal(segs, 1);
    assert_int_equal(moonlet_mc_unmount_segment(node, "node-a", "seg-a"), MOONLET_OK);
    moonlet_mc_destroy(other);
    moonlet_mc_destroy(node);
}

static moonlet_store_node *node_new(const char *id, const char *listen, int *rc)
{
    moonlet_store_node_config cfg;
    cl_node_config(&cfg, g_master.addr, 1u << 20);
    cfg.client_id = id;
    cfg.ping_interval_ms = 100;
    cfg.huge_pages = false;
    if (listen)
        cfg.listen_addr = listen;
#ifdef MOONLET_STORE_NODE_ID_WAIT_MS
    cfg.client_id_wait_ms = 300;
#endif
    moonlet_store_node *n = NULL;
    *rc = moonlet_store_node_create(&cfg, &n);
    return n;
}

/* A second node with the same --client-id used to take the id over. */
static void test_duplicate_client_id(void **state)
{
    (void)state;
    moonlet_master_client *mc = NULL;
    assert_int_equal(moonlet_mc_create(g_master.addr, NULL, &mc), MOONLET_OK);
    int rc;
    moonlet_store_node *a = node_new("dup-node", NULL, &rc);
    assert_int_equal(rc, MOONLET_OK);
    char seg_a[MOONLET_MAX_ID_BYTES + 1];
    assert_int_equal(moonlet_store_node_segment_id(a, seg_a, sizeof(seg_a)), MOONLET_OK);
    moonlet_store_node *b = node_new("dup-node", NULL, &rc);
    assert_int_equal(rc, MOONLET_ERR_ILLEGAL_CLIENT);
    assert_null(b);
    assert_true(segment_listed(mc, seg_a));
    assert_int_equal(cl_segments(mc), 1);
    /* a clean shutdown frees the id at once */
    moonlet_store_node_destroy(a);
    b = node_new("dup-node", NULL, &rc);
    assert_int_equal(rc, MOONLET_OK);
    assert_int_equal(cl_segments(mc), 1);
    moonlet_store_node_destroy(b);
    moonlet_mc_destroy(mc);
}

/* Serving beyond loopback without a token is worth a warning (as the master's). */
static void test_warns_without_token(void **state)
{
    (void)state;
    fflush(stderr);
    FILE *cap = tmpfile();
    assert_non_null(cap);
    int saved = dup(STDERR_FILENO);
    dup2(fileno(cap), STDERR_FILENO);
    int rc;
    moonlet_store_node *n = node_new("warn-node", "0.0.0.0:0", &rc);
    moonlet_store_node_destroy(n);
    moonlet_store_node *l = node_new("quiet-node", "127.0.0.1:0", &rc);
    moonlet_store_node_destroy(l);
    dup2(saved, STDERR_FILENO);
    close(saved);
    assert_int_equal(rc, MOONLET_OK);
    rewind(cap);
    char line[2048];
    int warned = 0;
    while (fgets(line, sizeof(line), cap))
        warned += strstr(line, "without --auth-token-file") != NULL;
    fclose(cap);
    assert_int_equal(warned, 1);
}

MOONLET_TEST_MAIN("node_identity", setup, teardown,
                  cmocka_unit_test(test_impostor_refused),
                  cmocka_unit_test(test_duplicate_client_id),
                  cmocka_unit_test(test_warns_without_token))
