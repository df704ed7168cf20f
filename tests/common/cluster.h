/*
 * cluster.h - a loopback cluster for integration tests: a moonlet-master and
 * moonlet-store processes on ephemeral ports (built on proc.h: every process
 * is stopped by its own PID), plus the questions tests ask the master about
 * it (segments mounted, replicas of a key) and bounded waiting.
 */
#ifndef MOONLET_TEST_CLUSTER_H
#define MOONLET_TEST_CLUSTER_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "master_client.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "proc.h"
#include "store_node.h"

#define CL_MAX_ARGS 40

/* Appends a NULL-terminated list of extra arguments to argv at *n. */
static inline void cl_append(char **argv, int *n, const char *const *extra)
{
    for (; extra && *extra && *n < CL_MAX_ARGS - 1; extra++)
        argv[(*n)++] = (char *)*extra;
    argv[*n] = NULL;
}

/* moonlet-master on 127.0.0.1, port `port` ("0": ephemeral), 64 shards,
 * quiet, plus `extra` flags. */
static inline int cl_start_master_on(test_proc *m, const char *port, const char *const *extra)
{
    char *argv[CL_MAX_ARGS] = {"tools/moonlet-master", "--rpc-port", (char *)port, "--shards",
                               "64", "--log-level", "warn"};
    int n = 7;
    cl_append(argv, &n, extra);
    return proc_start(m, argv, 5000);
}

static inline int cl_start_master(test_proc *m, const char *const *extra)
{
    return cl_start_master_on(m, "0", extra);
}

/* moonlet-store over TCP on 127.0.0.1:0 with a segment of `size`, pinging
 * every 100 ms (well inside a 1 s liveness TTL), plus `extra` flags. */
static inline int cl_start_store(test_proc *s, const char *master, const char *size,
                                 const char *const *extra)
{
    char *argv[CL_MAX_ARGS] = {"tools/moonlet-store", "--master", (char *)master,
                               "--segment-size", (char *)size, "--protocol", "tcp",
                               "--listen", "127.0.0.1:0", "--ping-interval-ms", "100",
                               "--log-level", "warn"};
    int n = 13;
    cl_append(argv, &n, extra);
    return proc_start(s, argv, 10000);
}

/* Mounted segments, or -1 when the master does not answer. */
static inline int cl_segments(moonlet_master_client *mc)
{
    cJSON *j = NULL;
    if (moonlet_mc_list_segments(mc, &j) != 0)
        return -1;
    int n = cJSON_GetArraySize(j);
    cJSON_Delete(j);
    return n;
}

/* The string `field` ("segment_id", "client_id", ...) of the segment mounted
 * with data endpoint `endpoint` into buf ("" when none); for a number field,
 * its value ("-1" when none). */
static inline void cl_segment_field(moonlet_master_client *mc, const char *endpoint,
                                    const char *field, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", "");
    cJSON *j = NULL, *s;
    if (moonlet_mc_list_segments(mc, &j) != 0)
        return;
    cJSON_ArrayForEach(s, j) {
        const char *ep = cJSON_GetStringValue(cJSON_GetObjectItem(s, "endpoint"));
        const cJSON *f = cJSON_GetObjectItem(s, field);
        if (!ep || !f || strcmp(ep, endpoint) != 0)
            continue;
        if (cJSON_IsString(f))
            snprintf(buf, cap, "%s", f->valuestring);
        else if (cJSON_IsNumber(f))
            snprintf(buf, cap, "%.0f", f->valuedouble);
    }
    cJSON_Delete(j);
}

/* The segment id mounted with data endpoint `endpoint` into buf ("" when none). */
static inline void cl_segment_at(moonlet_master_client *mc, const char *endpoint, char *buf,
                                 size_t cap)
{
    cl_segment_field(mc, endpoint, "segment_id", buf, cap);
}

/* How long ago the master last heard a Ping for the segment at `endpoint`
 * (ms), or -1 when no such segment is mounted. */
static inline long long cl_ping_age_ms(moonlet_master_client *mc, const char *endpoint)
{
    char v[32];
    cl_segment_field(mc, endpoint, "last_ping_age_ms", v, sizeof(v));
    return v[0] ? atoll(v) : -1;
}

/* Waits (bounded) until the master has seen at least `n` Pings for the
 * segment at `endpoint`: each time its ping age goes down, one or more Pings
 * arrived since the last look.  Returns how many drops were seen. */
static inline int cl_wait_pings(moonlet_master_client *mc, const char *endpoint, int n,
                                int timeout_ms)
{
    long long deadline = proc_now_ms() + timeout_ms, last = cl_ping_age_ms(mc, endpoint);
    int seen = 0;
    while (seen < n && proc_now_ms() < deadline) {
        usleep(5000);
        long long age = cl_ping_age_ms(mc, endpoint);
        if (age >= 0 && last >= 0 && age < last)
            seen++;
        last = age;
    }
    return seen;
}

/* replica_count of a key as the inspection RPC reports it; -1 when absent. */
static inline int cl_replicas(moonlet_master_client *mc, const char *tenant, const char *key)
{
    return (int)moonlet_mc_inspect_number(mc, tenant, key, "replica_count");
}

/* lease_remaining_ms of a key as the inspection RPC reports it (it grants
 * no lease itself); -1 when absent. */
static inline double cl_lease_ms(moonlet_master_client *mc, const char *tenant, const char *key)
{
    return moonlet_mc_inspect_number(mc, tenant, key, "lease_remaining_ms");
}

/* Writes `token` and a newline to a new file made from the mkstemp()
 * template `path` (the name is left in it); unlink it when done.
 * Returns 0 or -1. */
static inline int cl_token_file(char *path, const char *token)
{
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    size_t n = strlen(token);
    int rc = write(fd, token, n) == (ssize_t)n && write(fd, "\n", 1) == 1 ? 0 : -1;
    close(fd);
    return rc;
}

/* Polls `pred` every 20 ms until it holds or timeout_ms passed. */
static inline bool cl_wait(bool (*pred)(void *), void *arg, int timeout_ms)
{
    long long deadline = proc_now_ms() + timeout_ms;
    for (;;) {
        if (pred(arg))
            return true;
        if (proc_now_ms() >= deadline)
            return false;
        usleep(20000);
    }
}

/* Deterministic pseudo-random bytes (xorshift64*), different per seed. */
static inline void cl_fill(void *buf, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    unsigned char *p = buf;
    for (size_t i = 0; i < len; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        p[i] = (unsigned char)((x * 0x2545F4914F6CDD1Dull) >> 56);
    }
}

/* A client configuration: the defaults, the master at master_addr, TCP. */
static inline moonlet_client_config cl_client_config(const char *master_addr)
{
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg, sizeof cfg);
    cfg.master_addr = master_addr;
    cfg.protocol = MOONLET_PROTOCOL_TCP;
    return cfg;
}

/* The client of cfg; the test fails when it cannot be created. */
static inline moonlet_client *cl_client_of(const moonlet_client_config *cfg)
{
    moonlet_client *c = NULL;
    int rc = moonlet_client_create(cfg, &c);
    if (rc)
        fail_msg("client_create: %s", moonlet_strerror(rc));
    return c;
}

/* A moonlet_client of the master at master_addr over TCP (transfer timeout
 * transfer_timeout_ms, 0: the default).  Returns 0 or -1. */
static inline int cl_client_create(const char *master_addr, uint32_t transfer_timeout_ms,
                                   moonlet_client **out)
{
    moonlet_client_config cfg = cl_client_config(master_addr);
    if (transfer_timeout_ms)
        cfg.transfer_timeout_ms = transfer_timeout_ms;
    return moonlet_client_create(&cfg, out) ? -1 : 0;
}

/* The fixture of a test file that runs against one small cluster: a master
 * (with extra flags), a store node unless store_size is NULL (the test then
 * brings its own), a MasterClient and a TCP client of the master (transfer
 * timeout transfer_timeout_ms, 0: the default). */
typedef struct cl_cluster {
    test_proc master, store;
    moonlet_master_client *mc;
    moonlet_client *cli;
} cl_cluster;

/* Starts the zeroed c; -1 when a part does not start (cl_cluster_stop stops
 * the parts that did). */
static inline int cl_cluster_start(cl_cluster *c, const char *const *master_flags,
                                   const char *store_size, uint32_t transfer_timeout_ms)
{
    if (cl_start_master(&c->master, master_flags))
        return -1;
    if (store_size && cl_start_store(&c->store, c->master.addr, store_size, NULL))
        return -1;
    if (moonlet_mc_create(c->master.addr, NULL, &c->mc))
        return -1;
    return cl_client_create(c->master.addr, transfer_timeout_ms, &c->cli);
}

static inline void cl_cluster_stop(cl_cluster *c)
{
    moonlet_client_destroy(c->cli);
    moonlet_mc_destroy(c->mc);
    proc_stop(&c->store); /* -1, nothing to stop, without a store */
    proc_stop(&c->master);
}

/* An in-process store node's configuration: the defaults, the master at
 * master_addr, a TCP segment of segment_size, memory not locked (tests run
 * without CAP_IPC_LOCK). */
static inline void cl_node_config(moonlet_store_node_config *cfg, const char *master_addr,
                                  uint64_t segment_size)
{
    moonlet_store_node_config_default(cfg);
    cfg->master_addr = master_addr;
    cfg->segment_size = segment_size;
    cfg->protocol = MOONLET_XFER_TCP;
    cfg->lock_memory = false;
}

/* len bytes of cl_fill(seed) in a new buffer (at least 1 byte); free() it. */
static inline unsigned char *cl_random_bytes(size_t len, uint64_t seed)
{
    unsigned char *p = malloc(len ? len : 1);
    if (p)
        cl_fill(p, len, seed);
    return p;
}

#ifdef cmocka_unit_test /* helpers that assert: for files that include cmocka.h first */
/* Gets key (in tenant) through c and asserts it holds exactly want[0, size). */
static inline void cl_assert_get_equals(moonlet_client *c, const char *key, const char *tenant,
                                        const void *want, size_t size)
{
    unsigned char *got = malloc(size ? size : 1);
    assert_non_null(got);
    size_t len = 999;
    int rc = moonlet_client_get(c, key, got, size, tenant, &len);
    if (rc)
        fail_msg("get %s: %s", key, moonlet_strerror(rc));
    assert_int_equal(len, size);
    assert_memory_equal(got, want, size);
    free(got);
}

/* A batch's per-key result codes: got[i] == want[i] for i < n. */
static inline void cl_assert_codes(const int32_t *got, const int32_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i])
            fail_msg("key %zu: result %d, want %d", i, got[i], want[i]);
}

/* A batch call's outcome: its per-key codes are want[0, n), and the call
 * returned the first error among them (0 when there is none). */
static inline void cl_assert_batch(int rc, const int32_t *got, const int32_t *want, size_t n)
{
    int first = 0;
    for (size_t i = 0; i < n && !first; i++)
        first = want[i];
    assert_int_equal(rc, first);
    cl_assert_codes(got, want, n);
}

/* cl_assert_batch with the wanted codes listed after got: their count is the
 * list's, so it cannot disagree with it. */
#define CL_ASSERT_BATCH(rc, got, ...)                                                              \
    cl_assert_batch(rc, got, (const int32_t[]){__VA_ARGS__},                                       \
                    sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

/* get_alloc and get_size of key (in tenant) agree with want[0, size). */
static inline void cl_assert_alloc_and_size(moonlet_client *c, const char *key, const char *tenant,
                                            const void *want, size_t size)
{
    void *p = NULL;
    size_t len = 7;
    assert_int_equal(moonlet_client_get_alloc(c, key, tenant, &p, &len), MOONLET_OK);
    assert_non_null(p);
    assert_int_equal(len, size);
    assert_memory_equal(p, want, size);
    moonlet_free(p);
    uint64_t got = 1;
    assert_int_equal(moonlet_client_get_size(c, key, tenant, &got), MOONLET_OK);
    assert_int_equal(got, size);
}
#endif

/* Runs argv (path relative to the build root) with stdout and stderr sent to
 * /dev/null; returns its exit code, or -1 when it had to be killed after
 * timeout_ms. */
static inline int cl_run_exit_code(char *const argv[], int timeout_ms)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", proc_build_root(), argv[0]);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(path, argv);
        _exit(127);
    }
    long long deadline = proc_now_ms() + timeout_ms;
    int status = 0;
    while (proc_now_ms() < deadline) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(5000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

#endif
