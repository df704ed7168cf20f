/*
 * test_master_ha.c - the MasterClient against masters in HA mode, without
 * etcd: two in-process masters, each served with a role (master/role.h)
 * that the test moves itself (elected, deposed, the leader it names), so
 * every case is deterministic:
 *   - a standby answers NOT_LEADER with the leader's address; Echo and
 *     Hello are answered by anyone; replies carry the epoch after Hello;
 *   - a client given only the standby follows it to the leader;
 *   - a client given both follows a failover;
 *   - a reply or Hello from an epoch older than one seen is refused;
 *   - a leader past its window end is refused by the clock alone;
 *   - without a role (no HA) replies carry no epoch and Hello says single.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
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

MOONLET_TEST_MAIN("master_ha", NULL, NULL,
                  cmocka_unit_test(test_standby_answers_not_leader),
                  cmocka_unit_test(test_client_follows_failover_and_refuses_old_epochs),
                  cmocka_unit_test(test_window_end_fences_by_the_clock),
                  cmocka_unit_test(test_single_master_unchanged))
