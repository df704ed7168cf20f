/*
 * test_etcd.c - master/ha/etcd.c against a real loopback etcd (one member,
 * started and stopped by this test, tests/common/etcd_fixture.h): leases,
 * the create-if-absent transaction bound to a lease, compare on
 * create/mod revision, reads, deletes, endpoint failover and an etcd that
 * is down.  Skips (77) only when no etcd binary is installed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "election.h"
#include "etcd_fixture.h"
#include "monotime.h"
#include "net.h"
#include "role.h"
#include "moonlet/error.h"

static etcd_fixture g_etcd;

static moonlet_etcd *client(const char *endpoints)
{
    moonlet_etcd *e = NULL;
    assert_int_equal(moonlet_etcd_create(endpoints, 2000, &e), MOONLET_OK);
    return e;
}

static void test_create_if_absent_and_compare(void **state)
{
    moonlet_etcd *e = client(g_etcd.url);
    int64_t lease = 0, ttl = 0;
    assert_int_equal(moonlet_etcd_lease_grant(e, 30, &lease, &ttl), MOONLET_OK);
    assert_true(lease != 0);
    assert_int_equal(ttl, 30);

    bool won = false;
    int64_t rev = 0;
    moonlet_etcd_kv cur;
    assert_int_equal(moonlet_etcd_txn_put(e, "/t/leader", MOONLET_ETCD_CREATE_REVISION, 0, "a:1",
                                          3, lease, &won, &rev, &cur),
                     MOONLET_OK);
    assert_true(won);
    assert_false(cur.found);
    assert_true(rev > 0);

    /* a second campaign loses and reads the winner */
    assert_int_equal(moonlet_etcd_txn_put(e, "/t/leader", MOONLET_ETCD_CREATE_REVISION, 0, "b:2",
                                          3, 0, &won, NULL, &cur),
                     MOONLET_OK);
    assert_false(won);
    assert_true(cur.found);
    assert_string_equal(cur.value, "a:1");
    assert_int_equal(cur.create_revision, rev);
    assert_int_equal(cur.mod_revision, rev);
    assert_int_equal(cur.lease, lease);
    assert_int_equal(cur.version, 1);
    moonlet_etcd_kv_free(&cur);

    moonlet_etcd_kv kv;
    int64_t read_rev = 0;
    assert_int_equal(moonlet_etcd_get(e, "/t/leader", &kv, &read_rev), MOONLET_OK);
    assert_true(kv.found);
    assert_int_equal(kv.create_revision, rev);
    assert_true(read_rev >= rev);
    moonlet_etcd_kv_free(&kv);

    /* compare on mod_revision: a stale one fails, the current one succeeds */
    int64_t rev2 = 0;
    assert_int_equal(moonlet_etcd_txn_put(e, "/t/leader", MOONLET_ETCD_MOD_REVISION, rev - 1, "x",
                                          1, lease, &won, NULL, NULL),
                     MOONLET_OK);
    assert_false(won);
    assert_int_equal(moonlet_etcd_txn_put(e, "/t/leader", MOONLET_ETCD_MOD_REVISION, rev, "a:1'",
                                          4, lease, &won, &rev2, NULL),
                     MOONLET_OK);
    assert_true(won);
    assert_true(rev2 > rev);
    assert_int_equal(moonlet_etcd_get(e, "/t/leader", &kv, NULL), MOONLET_OK);
    assert_int_equal(kv.create_revision, rev); /* the epoch does not move with updates */
    assert_int_equal(kv.mod_revision, rev2);
    assert_int_equal(kv.version, 2);
    moonlet_etcd_kv_free(&kv);

    /* conditional delete: wrong create revision refused, right one deletes */
    assert_int_equal(moonlet_etcd_txn_delete(e, "/t/leader", MOONLET_ETCD_CREATE_REVISION, rev + 100,
                                             &won),
                     MOONLET_OK);
    assert_false(won);
    assert_int_equal(moonlet_etcd_txn_delete(e, "/t/leader", MOONLET_ETCD_CREATE_REVISION, rev, &won),
                     MOONLET_OK);
    assert_true(won);
    assert_int_equal(moonlet_etcd_get(e, "/t/leader", &kv, NULL), MOONLET_OK);
    assert_false(kv.found);
    assert_null(kv.value);
    assert_int_equal(moonlet_etcd_lease_revoke(e, lease), MOONLET_OK);
    moonlet_etcd_destroy(e);
}

static void test_lease_keepalive_revoke(void **state)
{
    moonlet_etcd *e = client(g_etcd.url);
    int64_t lease = 0, ttl = 0;
    assert_int_equal(moonlet_etcd_lease_grant(e, 10, &lease, NULL), MOONLET_OK);
    assert_int_equal(moonlet_etcd_lease_keepalive(e, lease, &ttl), MOONLET_OK);
    assert_int_equal(ttl, 10);
    int64_t r = 0;
    assert_int_equal(moonlet_etcd_put(e, "/t/bound", "v", 1, lease, &r), MOONLET_OK);
    assert_true(r > 0);
    moonlet_etcd_kv kv;
    assert_int_equal(moonlet_etcd_get(e, "/t/bound", &kv, NULL), MOONLET_OK);
    assert_true(kv.found);
    assert_int_equal(kv.lease, lease);
    moonlet_etcd_kv_free(&kv);
    /* revoking deletes the keys bound to the lease; it cannot be renewed after */
    assert_int_equal(moonlet_etcd_lease_revoke(e, lease), MOONLET_OK);
    assert_int_equal(moonlet_etcd_get(e, "/t/bound", &kv, NULL), MOONLET_OK);
    assert_false(kv.found);
    ttl = -1;
    assert_int_equal(moonlet_etcd_lease_keepalive(e, lease, &ttl), MOONLET_OK);
    assert_int_equal(ttl, 0);
    /* a key bound to a lease that does not exist is refused by etcd */
    assert_int_not_equal(moonlet_etcd_put(e, "/t/bound", "v", 1, lease, NULL), MOONLET_OK);
    moonlet_etcd_destroy(e);
}

static void test_lease_expires(void **state)
{
    moonlet_etcd *e = client(g_etcd.url);
    int64_t lease = 0, ttl = 0;
    assert_int_equal(moonlet_etcd_lease_grant(e, 1, &lease, &ttl), MOONLET_OK);
    assert_true(ttl >= 1 && ttl <= 3); /* etcd may raise a TTL to its minimum */
    bool won = false;
    assert_int_equal(moonlet_etcd_txn_put(e, "/t/exp", MOONLET_ETCD_CREATE_REVISION, 0, "x", 1,
                                          lease, &won, NULL, NULL),
                     MOONLET_OK);
    assert_true(won);
    /* without keepalives the key goes with the lease (bounded: TTL + 5 s) */
    uint64_t deadline = moonlet_mono_ms() + (uint64_t)ttl * 1000 + 5000;
    bool gone = false;
    while (!gone && moonlet_mono_ms() < deadline) {
        moonlet_etcd_kv kv;
        assert_int_equal(moonlet_etcd_get(e, "/t/exp", &kv, NULL), MOONLET_OK);
        gone = !kv.found;
        moonlet_etcd_kv_free(&kv);
        if (!gone)
            usleep(100 * 1000); /* etcd sends no event we could wait on without a watch */
    }
    assert_true(gone);
    int64_t left = -1;
    assert_int_equal(moonlet_etcd_lease_keepalive(e, lease, &left), MOONLET_OK);
    assert_int_equal(left, 0);
    moonlet_etcd_destroy(e);
}

static void test_binary_values(void **state)
{
    moonlet_etcd *e = client(g_etcd.url);
    const char v[] = {'a', 0, 'b', (char)0xff, '\n'};
    assert_int_equal(moonlet_etcd_put(e, "/t/bin key", v, sizeof(v), 0, NULL), MOONLET_OK);
    moonlet_etcd_kv kv;
    assert_int_equal(moonlet_etcd_get(e, "/t/bin key", &kv, NULL), MOONLET_OK);
    assert_true(kv.found);
    assert_int_equal(kv.value_len, sizeof(v));
    assert_memory_equal(kv.value, v, sizeof(v));
    assert_int_equal(kv.lease, 0); /* omitted by the gateway: the default */
    moonlet_etcd_kv_free(&kv);
    int64_t n = 0;
    assert_int_equal(moonlet_etcd_delete(e, "/t/bin key", &n), MOONLET_OK);
    assert_int_equal(n, 1);
    assert_int_equal(moonlet_etcd_delete(e, "/t/bin key", &n), MOONLET_OK);
    assert_int_equal(n, 0);
    moonlet_etcd_destroy(e);
}

static void test_endpoint_failover(void **state)
{
    unsigned dead = etcd_free_port(); /* nothing listens there */
    char eps[160];
    snprintf(eps, sizeof(eps), "127.0.0.1:%u, %s/", dead, g_etcd.url);
    moonlet_etcd *e = client(eps);
    int64_t r = 0;
    assert_int_equal(moonlet_etcd_put(e, "/t/fo", "1", 1, 0, &r), MOONLET_OK);
    assert_string_equal(moonlet_etcd_endpoint(e), g_etcd.url);
    moonlet_etcd_destroy(e);

    snprintf(eps, sizeof(eps), "http://127.0.0.1:%u", dead);
    e = client(eps);
    moonlet_etcd_kv kv;
    int rc = moonlet_etcd_get(e, "/t/fo", &kv, NULL);
    assert_true(rc == MOONLET_ERR_RPC_FAIL || rc == MOONLET_ERR_RPC_TIMEOUT);
    int64_t id;
    rc = moonlet_etcd_lease_grant(e, 5, &id, NULL);
    assert_true(rc == MOONLET_ERR_RPC_FAIL || rc == MOONLET_ERR_RPC_TIMEOUT);
    moonlet_etcd_destroy(e);
}

static void test_bad_arguments(void **state)
{
    moonlet_etcd *e = NULL;
    assert_int_equal(moonlet_etcd_create("", 100, &e), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_etcd_create(" , ,", 100, &e), MOONLET_ERR_INVALID_PARAMS);
    e = client(g_etcd.url);
    moonlet_etcd_kv kv;
    bool won;
    int64_t id;
    assert_int_equal(moonlet_etcd_get(e, "", &kv, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_etcd_lease_grant(e, 0, &id, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_etcd_txn_put(e, "/k", MOONLET_ETCD_CREATE_REVISION, 0, NULL, 1, 0,
                                          &won, NULL, NULL),
                     MOONLET_ERR_INVALID_PARAMS);
    moonlet_etcd_destroy(e);
}

/* A promotion slower than the lease TTL keeps the lease (keepalives run
 * beside on_elected): the new leader serves afterwards, its key intact. */
struct slow_promo {
    uint64_t epoch;
    unsigned ms;
};

static int slow_on_elected(void *arg, uint64_t epoch)
{
    struct slow_promo *p = arg;
    p->epoch = epoch;
    usleep(p->ms * 1000u); /* the promotion's work, slower than the TTL */
    return 0;
}

/* The role's state once it serves, or at the deadline (moonlet_mono_ms)
 * if it does not by then. */
static moonlet_role_info wait_serving(moonlet_role *role, uint64_t deadline)
{
    moonlet_role_info ri = {0};
    while (moonlet_mono_ms() < deadline) {
        moonlet_role_get(role, moonlet_mono_ms(), &ri);
        if (ri.serving)
            break;
        usleep(20 * 1000); /* the role has no event to wait on */
    }
    return ri;
}

static void test_slow_promotion_keeps_the_lease(void **state)
{
    moonlet_role *role = NULL;
    assert_int_equal(moonlet_role_create("127.0.0.1:1", &role), MOONLET_OK);
    struct slow_promo p = {.ms = 4500};
    moonlet_election_opts o = {.endpoints = g_etcd.url, .cluster_id = "slowpromo",
                               .advertise = "127.0.0.1:1", .ttl_s = 2,
                               .on_elected = slow_on_elected, .arg = &p};
    moonlet_election *el = NULL;
    assert_int_equal(moonlet_election_start(&o, role, &el), MOONLET_OK);
    /* serving within the promotion + one grace + slack (bounded) */
    moonlet_role_info ri = wait_serving(role, moonlet_mono_ms() + p.ms + 2000 + 5000);
    assert_true(ri.serving);
    assert_int_equal(ri.epoch, p.epoch);
    moonlet_etcd *e = client(g_etcd.url);
    moonlet_etcd_kv kv;
    assert_int_equal(moonlet_etcd_get(e, "/moonlet/slowpromo/leader", &kv, NULL), MOONLET_OK);
    assert_true(kv.found);
    assert_int_equal((uint64_t)kv.create_revision, p.epoch);
    moonlet_etcd_kv_free(&kv);
    moonlet_etcd_destroy(e);
    moonlet_election_stop(el);
    moonlet_role_destroy(role);
}

/* The standby's read interval: TTL/20, 50 ms at least, the tick at most. */
static void test_poll_interval(void **state)
{
    assert_int_equal(moonlet_election_poll_ms(2000), 100);
    assert_int_equal(moonlet_election_poll_ms(5000), 250);
    assert_int_equal(moonlet_election_poll_ms(600), 50);
    assert_int_equal(moonlet_election_poll_ms(90), 30); /* never past the tick */
}

/* A listener on an ephemeral loopback port; *addr gets "127.0.0.1:PORT". */
static int listener(char *addr, size_t cap)
{
    uint16_t port = 0;
    int fd = moonlet_net_listen_tcp("127.0.0.1", 0, 4, &port);
    assert_true(fd >= 0);
    snprintf(addr, cap, "127.0.0.1:%u", port);
    return fd;
}

/* Waits (bounded) until fd is readable. */
static void wait_readable(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, ms), 1);
}

static void test_probe(void **state)
{
    char addr[64];
    int fd = listener(addr, sizeof(addr));
    assert_int_equal(moonlet_election_probe(addr, 1000), 1);
    close(fd); /* nothing listens there any more */
    assert_int_equal(moonlet_election_probe(addr, 1000), 0);
    assert_int_equal(moonlet_election_probe("no-port", 1000), -1);
}

/* A leader key held by a "leader" on a 60 s lease that nobody renews or
 * revokes.  *lfd: a listener on the leader's address (-1: a closed port). */
static int64_t fake_leader(moonlet_etcd *e, const char *cluster, bool listening, int *lfd,
                           char *addr, size_t cap)
{
    *lfd = listener(addr, cap);
    if (!listening) {
        close(*lfd);
        *lfd = -1;
    }
    int64_t lease = 0;
    assert_int_equal(moonlet_etcd_lease_grant(e, 60, &lease, NULL), MOONLET_OK);
    char key[128];
    snprintf(key, sizeof(key), "/moonlet/%s/leader", cluster);
    bool won = false;
    assert_int_equal(moonlet_etcd_txn_put(e, key, MOONLET_ETCD_CREATE_REVISION, 0, addr,
                                          strlen(addr), lease, &won, NULL, NULL),
                     MOONLET_OK);
    assert_true(won);
    return lease;
}

/* The fake leader's side of one standby probe: a connection accepted and
 * closed (bounded wait). */
static void answer_probe(int lfd)
{
    wait_readable(lfd, 5000);
    int c = accept(lfd, NULL, NULL);
    assert_true(c >= 0);
    close(c);
}

/* A fake leader of a cluster (fake_leader: its lease and listener) and a
 * standby on etcd for it: the standby's role (advertising o.advertise) and
 * its election, started with o (TTL 2 s); e: the test's etcd client. */
struct takeover {
    moonlet_etcd *e;
    char addr[64]; /* the leader's */
    int lfd;
    int64_t lease;
    moonlet_role *role;
    moonlet_election *el;
};

static void takeover_start(struct takeover *t, bool listening, moonlet_election_opts o)
{
    t->e = client(g_etcd.url);
    t->lease = fake_leader(t->e, o.cluster_id, listening, &t->lfd, t->addr, sizeof(t->addr));
    o.endpoints = g_etcd.url;
    o.ttl_s = 2;
    t->role = NULL;
    assert_int_equal(moonlet_role_create(o.advertise, &t->role), MOONLET_OK);
    t->el = NULL;
    assert_int_equal(moonlet_election_start(&o, t->role, &t->el), MOONLET_OK);
}

/* The standby stopped, then the fake leader's lease revoked (when it was
 * left alone: lease_alive), then the rest freed. */
static void takeover_end(struct takeover *t, bool lease_alive)
{
    moonlet_election_stop(t->el);
    if (lease_alive)
        assert_int_equal(moonlet_etcd_lease_revoke(t->e, t->lease), MOONLET_OK);
    moonlet_role_destroy(t->role);
    moonlet_etcd_destroy(t->e);
}

/* The standby's role: a standby following the leader at addr. */
static void assert_standby_of(moonlet_role *role, const char *addr)
{
    moonlet_role_info ri = {0};
    moonlet_role_get(role, moonlet_mono_ms(), &ri);
    assert_int_equal(ri.state, MOONLET_ROLE_STANDBY);
    assert_string_equal(ri.leader, addr);
}

/* The fake leader's lease: still alive (not revoked). */
static void assert_lease_alive(struct takeover *t)
{
    int64_t left = 0;
    assert_int_equal(moonlet_etcd_lease_keepalive(t->e, t->lease, &left), MOONLET_OK);
    assert_true(left > 0); /* not revoked */
}

/* Fast takeover: the leader's address accepted the standby's probe, then
 * refuses connections (its process is gone): the standby revokes its lease
 * and serves one grace later - not after the 60 s the lease had left.
 * Before, a standby waited for etcd to expire the lease: up to TTL plus
 * etcd's 500 ms expiry tick after the kill (moonlet-bench ha). */
static void test_takeover_of_a_gone_leader(void **state)
{
    struct takeover t;
    takeover_start(&t, true,
                   (moonlet_election_opts){.cluster_id = "takeover", .advertise = "127.0.0.1:2"});
    answer_probe(t.lfd); /* the standby's probe reaches the leader: it is alive */
    assert_standby_of(t.role, t.addr);
    uint64_t gone = moonlet_mono_ms();
    close(t.lfd); /* the leader's process is gone */
    /* serving within a poll, the grace and slack: far less than 60 s */
    assert_true(wait_serving(t.role, gone + 2000 + 5000).serving);
    assert_true(moonlet_mono_ms() - gone >= 2000); /* the grace was kept */
    int64_t left = -1;
    assert_int_equal(moonlet_etcd_lease_keepalive(t.e, t.lease, &left), MOONLET_OK);
    assert_int_equal(left, 0); /* revoked */
    takeover_end(&t, false);
}

/* No takeover of an address the standby never reached: a leader whose
 * advertised address is wrong (or that no probe reached yet) is left to
 * its lease. */
static void test_no_takeover_without_a_live_probe(void **state)
{
    struct takeover t;
    takeover_start(&t, false,
                   (moonlet_election_opts){.cluster_id = "notakeover", .advertise = "127.0.0.1:3"});
    /* twenty polls' worth (100 ms each): nothing to wait on for an absence */
    usleep(2000 * 1000);
    assert_standby_of(t.role, t.addr);
    assert_lease_alive(&t);
    takeover_end(&t, true);
}

/* The owner's veto (opts.may_take_over: the master's "would I promote with
 * my state"): asked with the leader's epoch once its address refuses
 * connections, and while it says no, the lease is left alone. */
struct veto {
    atomic_int asked;
    atomic_ullong epoch;
};

static bool veto_takeover(void *arg, uint64_t leader_epoch)
{
    struct veto *v = arg;
    atomic_store(&v->epoch, leader_epoch);
    atomic_fetch_add(&v->asked, 1);
    return false;
}

static void test_takeover_vetoed(void **state)
{
    struct takeover t;
    struct veto v = {0};
    takeover_start(&t, true,
                   (moonlet_election_opts){.cluster_id = "veto", .advertise = "127.0.0.1:4",
                                           .may_take_over = veto_takeover, .arg = &v});
    answer_probe(t.lfd); /* its probe: the leader is alive */
    close(t.lfd); /* gone */
    /* three refused probes, each vetoed (bounded: 100 polls) */
    for (int i = 0; i < 100 && atomic_load(&v.asked) < 3; i++)
        usleep(100 * 1000); /* the veto's count is the event; no fd to wait on */
    assert_true(atomic_load(&v.asked) >= 3);
    moonlet_etcd_kv kv;
    char key[64];
    snprintf(key, sizeof(key), "/moonlet/veto/leader");
    assert_int_equal(moonlet_etcd_get(t.e, key, &kv, NULL), MOONLET_OK);
    assert_true(kv.found);
    assert_int_equal(atomic_load(&v.epoch), (uint64_t)kv.create_revision);
    moonlet_etcd_kv_free(&kv);
    assert_lease_alive(&t);
    moonlet_role_info ri = {0};
    moonlet_role_get(t.role, moonlet_mono_ms(), &ri);
    assert_int_equal(ri.state, MOONLET_ROLE_STANDBY);
    takeover_end(&t, true);
}

int main(void)
{
    int rc = etcd_fixture_start(&g_etcd);
    if (rc == 77) {
        fprintf(stderr, "SKIP: no etcd binary (install Debian's etcd-server: scripts/setup.sh)\n");
        return 77;
    }
    if (rc) {
        etcd_fixture_stop(&g_etcd);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_if_absent_and_compare),
        cmocka_unit_test(test_lease_keepalive_revoke),
        cmocka_unit_test(test_lease_expires),
        cmocka_unit_test(test_binary_values),
        cmocka_unit_test(test_endpoint_failover),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_slow_promotion_keeps_the_lease),
        cmocka_unit_test(test_poll_interval),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_takeover_of_a_gone_leader),
        cmocka_unit_test(test_no_takeover_without_a_live_probe),
        cmocka_unit_test(test_takeover_vetoed),
    };
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    etcd_fixture_stop(&g_etcd);
    return rc;
}
