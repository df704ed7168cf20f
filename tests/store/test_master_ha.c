/*
 * test_master_ha.c - the MasterClient against masters in HA mode, without
 * etcd: two in-process masters, each served with a role (master/ha/role.h)
 * that the test moves itself (elected, deposed, the leader it names), so
 * every case is deterministic:
 *   - a standby answers NOT_LEADER with the leader's address; Echo and
 *     Hello are answered by anyone; replies carry the epoch after Hello;
 *   - a client given only the standby follows it to the leader;
 *   - a client given both follows a failover;
 *   - a reply or Hello from an epoch older than one seen is refused;
 *   - a leader past its window end is refused by the clock alone;
 *   - without a role (no HA) replies carry no epoch and Hello says single;
 *   - an in-process store node learns the leader's epoch at Mount and Ping,
 *     and refuses a capability the leader issued in an older epoch (a
 *     leader frozen past its term) once it knows the newer one (issue 31
 *     section 3).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "master.h"
#include "master_client.h"
#include "methods.h"
#include "monotime.h"
#include "moonlet/error.h"
#include "role.h"
#include "rpc_client.h"
#include "service.h"
#include "store_node.h"
#include "writecap.h"
#include "xfer.h"
#include "../common/cluster.h"
#include "../common/test_main.h"

typedef struct node {
    moonlet_master *m;
    moonlet_role *role;
    moonlet_master_service *svc;
    char addr[64];
} node;

static void node_start(node *n, bool ha)
{
    moonlet_master_config cfg;
    moonlet_master_config_default(&cfg);
    cfg.shards = 16;
    assert_int_equal(moonlet_master_create(&cfg, &n->m), MOONLET_OK);
    n->role = NULL;
    if (ha)
        assert_int_equal(moonlet_role_create("", &n->role), MOONLET_OK);
    moonlet_service_opts so = {.address = "127.0.0.1", .port = 0, .threads = 1, .role = n->role};
    assert_int_equal(moonlet_master_service_start(n->m, &so, &n->svc), MOONLET_OK);
    snprintf(n->addr, sizeof(n->addr), "127.0.0.1:%u", moonlet_master_service_port(n->svc));
    if (ha)
        moonlet_role_set_advertise(n->role, n->addr);
}

static void node_stop(node *n)
{
    moonlet_master_service_stop(n->svc);
    moonlet_master_destroy(n->m);
    moonlet_role_destroy(n->role);
}

/* Elected with a window open now for `ms`. */
static void elect(node *n, uint64_t epoch, uint64_t ms)
{
    uint64_t now = moonlet_mono_ms();
    moonlet_role_elected(n->role, epoch, now, now + ms);
}

/* One raw call on a fresh connection, Hello first when asked:
 * returns the code, *epoch the reply's epoch, msg the message. */
static int raw(const node *n, uint32_t method, bool hello, uint64_t *epoch, char *msg, size_t cap)
{
    moonlet_rpc_client *c;
    const char *port = strrchr(n->addr, ':') + 1;
    assert_int_equal(moonlet_rpc_client_connect("127.0.0.1", (uint16_t)atoi(port), NULL, &c), 0);
    moonlet_reply rep;
    if (hello) {
        moonlet_rpc_client_begin(c, MOONLET_M_HELLO, 0);
        assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
        assert_int_equal(rep.code, 0);
        moonlet_reply_destroy(&rep);
    }
    moonlet_rpc_client_begin(c, method, 0);
    assert_int_equal(moonlet_rpc_client_call(c, &rep), 0);
    int code = rep.code;
    *epoch = rep.epoch;
    if (msg) {
        msg[0] = 0;
        if (rep.result->type == MSGPACK_OBJECT_STR && rep.result->via.str.size < cap) {
            memcpy(msg, rep.result->via.str.ptr, rep.result->via.str.size);
            msg[rep.result->via.str.size] = 0;
        }
    }
    moonlet_reply_destroy(&rep);
    moonlet_rpc_client_close(c);
    return code;
}

static int stats(moonlet_master_client *mc)
{
    cJSON *j = NULL;
    int rc = moonlet_mc_stats(mc, &j);
    cJSON_Delete(j);
    return rc;
}

/* Two masters: a the leader of epoch (its lease good for a minute), b a
 * standby that names it. */
static void leader_and_standby(node *a, node *b, uint64_t epoch)
{
    node_start(a, true);
    node_start(b, true);
    elect(a, epoch, 60000);
    moonlet_role_set_leader(b->role, a->addr, epoch);
}

static void test_standby_answers_not_leader(void **state)
{
    node a, b;
    leader_and_standby(&a, &b, 7);
    uint64_t ep;
    char msg[128];
    assert_int_equal(raw(&b, MOONLET_M_STATS, false, &ep, msg, sizeof(msg)), MOONLET_ERR_NOT_LEADER);
    assert_string_equal(msg, a.addr);
    assert_int_equal(ep, 0); /* no Hello on that connection: 3 elements, as before */
    assert_int_equal(raw(&b, MOONLET_M_STATS, true, &ep, msg, sizeof(msg)), MOONLET_ERR_NOT_LEADER);
    assert_int_equal(ep, 7); /* after Hello: the leader's epoch it knows */
    assert_int_equal(raw(&b, MOONLET_M_ECHO, true, &ep, NULL, 0), MOONLET_OK);
    assert_int_equal(raw(&a, MOONLET_M_STATS, true, &ep, NULL, 0), MOONLET_OK);
    assert_int_equal(ep, 7);

    /* a client given only the standby follows it */
    moonlet_master_client *mc;
    moonlet_master_client_opts o = {.timeout_ms = 2000};
    assert_int_equal(moonlet_mc_create(b.addr, &o, &mc), MOONLET_OK);
    assert_int_equal(stats(mc), MOONLET_OK);
    moonlet_mc_destroy(mc);
    node_stop(&a);
    node_stop(&b);
}

static void test_client_follows_failover_and_refuses_old_epochs(void **state)
{
    node a, b;
    leader_and_standby(&a, &b, 10);
    char list[160];
    snprintf(list, sizeof(list), "%s,%s", b.addr, a.addr);
    moonlet_master_client *mc;
    moonlet_master_client_opts o = {.timeout_ms = 1500};
    assert_int_equal(moonlet_mc_create(list, &o, &mc), MOONLET_OK);
    assert_int_equal(stats(mc), MOONLET_OK);

    /* failover: a deposed, b elected with a newer epoch; the client follows */
    moonlet_role_deposed(a.role, moonlet_mono_ms());
    moonlet_role_set_leader(a.role, b.addr, 12);
    elect(&b, 12, 60000);
    assert_int_equal(stats(mc), MOONLET_OK);

    /* b deposed, a back as leader but under an OLDER epoch than seen: refused
     * (a stale master), bounded by the call's timeout */
    moonlet_role_deposed(b.role, moonlet_mono_ms());
    moonlet_role_set_leader(b.role, a.addr, 12);
    elect(&a, 11, 60000);
    uint64_t t0 = moonlet_mono_ms();
    assert_int_equal(stats(mc), MOONLET_ERR_NOT_LEADER);
    uint64_t took = moonlet_mono_ms() - t0;
    assert_true(took >= 1000 && took < 5000);
    /* the same master under a newer epoch is taken */
    moonlet_role_deposed(a.role, moonlet_mono_ms());
    elect(&a, 13, 60000);
    assert_int_equal(stats(mc), MOONLET_OK);
    moonlet_mc_destroy(mc);
    node_stop(&a);
    node_stop(&b);
}

static void test_window_end_fences_by_the_clock(void **state)
{
    node a;
    node_start(&a, true);
    elect(&a, 3, 300); /* nobody renews it */
    uint64_t ep;
    assert_int_equal(raw(&a, MOONLET_M_STATS, true, &ep, NULL, 0), MOONLET_OK);
    uint64_t deadline = moonlet_mono_ms() + 5000;
    int code = MOONLET_OK;
    while (code == MOONLET_OK && moonlet_mono_ms() < deadline)
        code = raw(&a, MOONLET_M_STATS, true, &ep, NULL, 0);
    assert_int_equal(code, MOONLET_ERR_NOT_LEADER);
    node_stop(&a);
}

static void test_single_master_unchanged(void **state)
{
    node a;
    node_start(&a, false);
    uint64_t ep = 1;
    assert_int_equal(raw(&a, MOONLET_M_STATS, true, &ep, NULL, 0), MOONLET_OK);
    assert_int_equal(ep, 0); /* no HA: never a 4th element */
    cJSON *h = NULL;
    assert_int_equal(moonlet_mc_hello_at(a.addr, NULL, &h), MOONLET_OK);
    assert_string_equal(cJSON_GetObjectItem(h, "role")->valuestring, "single");
    cJSON_Delete(h);
    node_stop(&a);
}

static void *store_run(void *arg)
{
    return (void *)(intptr_t)moonlet_store_node_run(arg);
}

static bool wait_node_epoch(moonlet_store_node *n, uint64_t want)
{
    for (int i = 0; i < 500 && moonlet_store_node_epoch(n) != want; i++)
        poll(NULL, 0, 10);
    return moonlet_store_node_epoch(n) == want;
}

/* A write of len bytes of pattern through the capability of replica r. */
static int write_with(moonlet_xfer *x, const moonlet_replica_desc *r, const void *src, uint64_t len)
{
    moonlet_xfer_cap cap = {.offset = r->offset, .len = r->cap_len, .expiry_ms = r->cap_expiry_ms,
                            .tag = r->cap_tag};
    moonlet_xfer_op op = {.opcode = MOONLET_XFER_WRITE, .endpoint = r->endpoint,
                          .segment_id = r->segment_id, .offset = r->offset, .local = (void *)src,
                          .len = len, .cap = &cap};
    return moonlet_xfer_submit(x, &op, 1);
}

/* Issue 31 section 3, fencing at the resource: the leader's epoch is in its
 * write capabilities and in what the node learns at Mount and Ping.  A
 * capability the leader issued in epoch 20 is refused once the node has
 * seen epoch 25 (the master re-elected with its state, as a promoted
 * standby is), although it is genuine and unexpired; one of epoch 25
 * writes. */
static void test_node_refuses_older_epoch_capability(void **state)
{
    node a, b;
    leader_and_standby(&a, &b, 20);
    char list[160];
    snprintf(list, sizeof(list), "%s,%s", a.addr, b.addr);
    moonlet_store_node_config cfg;
    cl_node_config(&cfg, list, 4u << 20);
    cfg.client_id = "epoch-node";
    cfg.ping_interval_ms = 50;
    moonlet_store_node *n;
    assert_int_equal(moonlet_store_node_create(&cfg, &n), MOONLET_OK);
    assert_int_equal(moonlet_store_node_epoch(n), 20); /* learned at Mount */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, store_run, n), 0);

    moonlet_master_client *mc;
    moonlet_master_client_opts o = {.timeout_ms = 2000};
    assert_int_equal(moonlet_mc_create(list, &o, &mc), MOONLET_OK);
    moonlet_replica_list old;
    assert_int_equal(moonlet_mc_put_start(mc, NULL, "k-old", 4096, 1, false, &old), MOONLET_OK);
    assert_int_equal(old.count, 1);
    moonlet_writecap w = {.len = old.replicas[0].cap_len, .expiry_ms = old.replicas[0].cap_expiry_ms};
    assert_int_equal(moonlet_writecap_epoch(&w), 20);

    /* a new term for the same state; the node learns it at its next Ping */
    moonlet_role_deposed(a.role, moonlet_mono_ms());
    elect(&a, 25, 60000);
    assert_true(wait_node_epoch(n, 25));
    assert_int_equal(moonlet_store_node_mounts(n), 1); /* same segment, same key */

    moonlet_xfer *x;
    moonlet_xfer_opts xo = {.protocol = MOONLET_XFER_TCP, .timeout_ms = 3000};
    assert_int_equal(moonlet_xfer_create(&xo, &x), MOONLET_OK);
    unsigned char buf[4096];
    memset(buf, 0xAB, sizeof(buf));
    /* the old term's capability: genuine, unexpired, refused */
    assert_int_equal(write_with(x, &old.replicas[0], buf, sizeof(buf)), MOONLET_ERR_INVALID_WRITE);
    moonlet_replica_list cur;
    assert_int_equal(moonlet_mc_put_start(mc, NULL, "k-new", 4096, 1, false, &cur), MOONLET_OK);
    assert_int_equal(write_with(x, &cur.replicas[0], buf, sizeof(buf)), MOONLET_OK);
    moonlet_replica_list_free(&old);
    moonlet_replica_list_free(&cur);
    moonlet_xfer_destroy(x);
    moonlet_mc_destroy(mc);
    moonlet_store_node_stop(n);
    void *ret;
    pthread_join(th, &ret);
    moonlet_store_node_destroy(n);
    node_stop(&a);
    node_stop(&b);
}

MOONLET_TEST_MAIN("master_ha", NULL, NULL,
                  cmocka_unit_test(test_standby_answers_not_leader),
                  cmocka_unit_test(test_client_follows_failover_and_refuses_old_epochs),
                  cmocka_unit_test(test_window_end_fences_by_the_clock),
                  cmocka_unit_test(test_single_master_unchanged),
                  cmocka_unit_test(test_node_refuses_older_epoch_capability))
