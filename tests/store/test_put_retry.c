/*
 * Put retry against a real loopback cluster (store/client/client.c,
 * master PutReplaceReplica): a moonlet-master whose liveness TTL is long, so
 * a store node that died is still mounted and placed on, and three
 * moonlet-store processes.  A put placed on the dead (SIGKILL) or stalled
 * (SIGSTOP) node succeeds with all its replicas, on live nodes, with the
 * right bytes; single and batch puts, and through a DummyClient (its
 * RealClient puts with the direct client).  Where no replacement exists (every
 * other segment already holds a replica) or the master predates the method
 * (--disable-method PutReplaceReplica), the put fails as before, cleanly:
 * nothing of it is readable and the key can be put again.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <sys/uio.h>

#include "../common/cluster.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "moonlet/real_client.h"
#include "../common/test_main.h"

#define NSTORES 3
#define OBJ_BYTES (256u << 10)

typedef struct fixture {
    test_proc master;
    test_proc stores[NSTORES];
    moonlet_master_client *mc;
    moonlet_client *client;
} fixture;

static int start(fixture *f, bool old_master)
{
    memset(f, 0, sizeof(*f));
    /* the master keeps a dead node's segment for the test's whole run */
    static const char *const flags[] = {"--client_live_ttl_sec", "60", NULL};
    static const char *const old_flags[] = {"--client_live_ttl_sec", "60", "--disable-method",
                                            "PutReplaceReplica", NULL};
    if (cl_start_master(&f->master, old_master ? old_flags : flags) ||
        moonlet_mc_create(f->master.addr, NULL, &f->mc))
        return -1;
    for (int i = 0; i < NSTORES; i++)
        if (cl_start_store(&f->stores[i], f->master.addr, "16MiB", NULL))
            return -1;
    long long deadline = proc_now_ms() + 5000;
    while (cl_segments(f->mc) < NSTORES && proc_now_ms() < deadline)
        usleep(10000);
    if (cl_segments(f->mc) != NSTORES)
        return -1;
    return cl_client_create(f->master.addr, 500, &f->client);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    *state = f;
    return f ? start(f, false) : -1;
}

static int setup_old_master(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    *state = f;
    return f ? start(f, true) : -1;
}

static int teardown(void **state)
{
    fixture *f = *state;
    if (f->client)
        moonlet_client_destroy(f->client);
    if (f->mc)
        moonlet_mc_destroy(f->mc);
    for (int i = 0; i < NSTORES; i++)
        if (f->stores[i].pid > 0) {
            kill(f->stores[i].pid, SIGCONT);
            proc_stop_sig(&f->stores[i], SIGKILL, 5000);
        }
    proc_stop(&f->master);
    free(f);
    return 0;
}

/* Whether any replica of key lives on the node at endpoint. */
static bool key_on(fixture *f, const char *key, const char *endpoint)
{
    cJSON *j = NULL, *r;
    assert_int_equal(moonlet_mc_inspect_key(f->mc, NULL, key, &j), MOONLET_OK);
    bool on = false;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "replicas")) {
        const char *ep = cJSON_GetStringValue(cJSON_GetObjectItem(r, "endpoint"));
        on |= ep && strcmp(ep, endpoint) == 0;
    }
    cJSON_Delete(j);
    return on;
}

static uint64_t stat_of(fixture *f, const char *name)
{
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_stats(f->mc, &j), MOONLET_OK);
    const cJSON *v = cJSON_GetObjectItem(j, name);
    uint64_t n = cJSON_IsNumber(v) ? (uint64_t)v->valuedouble : UINT64_MAX;
    cJSON_Delete(j);
    return n;
}

/* A put through c placed (preferred segment) on a node that is gone. */
static int put_on(moonlet_client *c, const char *key, const void *buf, uint32_t replicas,
                  const char *endpoint)
{
    const char *pref[] = {endpoint};
    moonlet_put_options o = {.replica_num = replicas, .preferred_segments = pref,
                             .preferred_segments_count = 1};
    return moonlet_client_put(c, key, buf, OBJ_BYTES, &o);
}

/* Kills store i (SIGKILL, reaped) and returns its address. */
static const char *kill_store(fixture *f, int i)
{
    assert_int_equal(proc_stop_sig(&f->stores[i], SIGKILL, 5000), 128 + SIGKILL);
    return f->stores[i].addr;
}

/* A put of key placed on the node at `gone` succeeded elsewhere: two
 * replicas, none on that node, and c reads back buf. */
static void assert_moved(fixture *f, moonlet_client *c, const char *key, const void *buf,
                         const char *gone)
{
    assert_int_equal(cl_replicas(f->mc, "", key), 2);
    assert_false(key_on(f, key, gone));
    cl_assert_get_equals(c, key, NULL, buf, OBJ_BYTES);
}

/* The key is not readable and can be put again: a clean failure. */
static void assert_clean_failure(fixture *f, const char *key, const void *buf)
{
    bool ex = true;
    assert_int_equal(moonlet_client_exist_key(f->client, key, NULL, &ex), MOONLET_OK);
    assert_false(ex);
    assert_int_equal(cl_replicas(f->mc, "", key), -1); /* revoked: nothing left */
    moonlet_put_options o = {.replica_num = 1};
    assert_int_equal(moonlet_client_put(f->client, key, buf, OBJ_BYTES, &o), MOONLET_OK);
}

/* A put that cannot succeed: placed (with `replicas` replicas) on store
 * `store` once it is killed, it fails with TRANSFER_FAIL as before, the
 * master's counter `stat` reads stat_want, and the failure is clean. */
typedef struct failing_put {
    int store;
    const char *key;
    uint32_t replicas;
    uint64_t seed; /* of the object's bytes */
    const char *stat;
    uint64_t stat_want;
} failing_put;

static void assert_put_fails_cleanly(fixture *f, failing_put p)
{
    unsigned char *buf = cl_random_bytes(OBJ_BYTES, p.seed);
    const char *dead = kill_store(f, p.store);
    assert_int_equal(put_on(f->client, p.key, buf, p.replicas, dead), MOONLET_ERR_TRANSFER_FAIL);
    assert_int_equal(stat_of(f, p.stat), p.stat_want);
    assert_clean_failure(f, p.key, buf);
    free(buf);
}

static void test_put_on_killed_node(void **state)
{
    fixture *f = *state;
    unsigned char *buf = cl_random_bytes(OBJ_BYTES, 1);
    const char *dead = kill_store(f, 0);
    assert_int_equal(put_on(f->client, "k1", buf, 2, dead), MOONLET_OK);
    assert_moved(f, f->client, "k1", buf, dead);
    assert_int_equal(stat_of(f, "put_replacements"), 1);
    assert_int_equal(stat_of(f, "put_revokes"), 0);

    /* a batch: every key placed on the dead node, every key succeeds */
    const char *keys[4] = {"b0", "b1", "b2", "b3"};
    unsigned char *bufs[4];
    struct iovec iov[4];
    size_t cnt[4];
    for (int i = 0; i < 4; i++) {
        bufs[i] = cl_random_bytes(OBJ_BYTES, 10 + (uint64_t)i);
        iov[i] = (struct iovec){bufs[i], OBJ_BYTES};
        cnt[i] = 1;
    }
    const char *pref[] = {dead};
    moonlet_put_options o = {.replica_num = 2, .preferred_segments = pref,
                             .preferred_segments_count = 1};
    int32_t res[4];
    assert_int_equal(moonlet_client_batch_put(f->client, keys, 4, iov, cnt, &o, res), MOONLET_OK);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(res[i], MOONLET_OK);
        assert_moved(f, f->client, keys[i], bufs[i], dead);
        free(bufs[i]);
    }
    assert_int_equal(stat_of(f, "put_replacements"), 5);
    free(buf);
}

/* Whether every thread of pid is stopped (state T in /proc/PID/task/TID/stat):
 * SIGSTOP takes effect asynchronously, a thread running on another core
 * stops a moment after kill() returned. */
static bool all_threads_stopped(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool stopped = true, any = false;
    struct dirent *e;
    while (stopped && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[384], buf[512];
        snprintf(path, sizeof(path), "%s/%s/stat", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = 0;
        const char *rp = strrchr(buf, ')'); /* "pid (comm) S ..." */
        any = true;
        stopped = rp && rp[1] == ' ' && (rp[2] == 'T' || rp[2] == 't');
    }
    closedir(d);
    return any && stopped;
}

/* A stalled node accepts connections but never answers: the write times out
 * (the client's 500 ms transfer timeout) and the replica moves. */
static void test_put_on_stalled_node(void **state)
{
    fixture *f = *state;
    unsigned char *buf = cl_random_bytes(OBJ_BYTES, 2);
    const char *stuck = f->stores[1].addr;
    assert_int_equal(kill(f->stores[1].pid, SIGSTOP), 0);
    long long end = proc_now_ms() + 5000;
    while (!all_threads_stopped(f->stores[1].pid) && proc_now_ms() < end)
        usleep(1000); /* bounded: every thread of the node has stopped */
    assert_true(all_threads_stopped(f->stores[1].pid));
    long long t0 = proc_now_ms();
    int rc = put_on(f->client, "k2", buf, 2, stuck);
    long long took = proc_now_ms() - t0;
    kill(f->stores[1].pid, SIGCONT);
    assert_int_equal(rc, MOONLET_OK);
    assert_true(took < 5000); /* one transfer timeout, then the replacement's write */
    assert_moved(f, f->client, "k2", buf, stuck);
    free(buf);
}

/* Every other segment holds a replica already: no replacement, the put fails
 * as before and leaves nothing. */
static void test_no_replacement_fails_cleanly(void **state)
{
    assert_put_fails_cleanly(*state, (failing_put){.store = 2, .key = "k3", .replicas = 3,
                                                   .seed = 3, .stat = "put_replacements",
                                                   .stat_want = 0});
}

/* The same through a DummyClient: its RealClient's put replaces the replica. */
static void test_dummy_put_on_killed_node(void **state)
{
    fixture *f = *state;
    moonlet_client_config cfg = cl_client_config(f->master.addr);
    cfg.transfer_timeout_ms = 500;
    cfg.local_segment_size = 16u << 20; /* a RealClient serves a segment of its own */
    char sock[96];
    snprintf(sock, sizeof(sock), "/tmp/moonlet-test-put-retry-%ld.sock", (long)getpid());
    moonlet_real_client *real = NULL;
    assert_int_equal(moonlet_real_client_create(&cfg, sock, NULL, &real), MOONLET_OK);
    moonlet_dummy_config dc;
    moonlet_dummy_config_init(&dc, sizeof dc);
    moonlet_client *dummy = NULL;
    assert_int_equal(moonlet_client_create_dummy(sock, &dc, &dummy), MOONLET_OK);

    unsigned char *buf = cl_random_bytes(OBJ_BYTES, 5);
    const char *dead = kill_store(f, 0);
    assert_int_equal(put_on(dummy, "d1", buf, 2, dead), MOONLET_OK);
    assert_moved(f, dummy, "d1", buf, dead);
    assert_int_equal(stat_of(f, "put_replacements"), 1);
    moonlet_client_destroy(dummy);
    moonlet_real_client_destroy(real);
    free(buf);
}

/* A master without PutReplaceReplica: the put is revoked, as before. */
static void test_old_master_revokes(void **state)
{
    assert_put_fails_cleanly(*state, (failing_put){.store = 0, .key = "k4", .replicas = 2,
                                                   .seed = 4, .stat = "put_revokes",
                                                   .stat_want = 1});
}

MOONLET_TEST_MAIN("put_retry", NULL, NULL,
                  cmocka_unit_test_setup_teardown(test_put_on_killed_node, setup, teardown),
                  cmocka_unit_test_setup_teardown(test_put_on_stalled_node, setup, teardown),
                  cmocka_unit_test_setup_teardown(test_no_replacement_fails_cleanly, setup, teardown),
                  cmocka_unit_test_setup_teardown(test_dummy_put_on_killed_node, setup, teardown),
                  cmocka_unit_test_setup_teardown(test_old_master_revokes, setup_old_master, teardown))
