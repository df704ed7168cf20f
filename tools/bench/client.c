/*
 * client.c - `moonlet-bench client`: what a BatchProbeKey costs from each
 * client layer an engine may use.
 *
 * Workload: 128 candidate checkpoints of 4 keys, all present, probed with
 * LAST_HIT_ONLY (candidate_size 4): one call selects and leases the last
 * checkpoint.  Four paths, against one master and one RealClient (a
 * moonlet-store --serve-dummy) this command starts:
 *   c_direct       moonlet_client_batch_probe_key on a moonlet_client_create() client
 *   c_dummy        the same on a DummyClient (moonlet_client_create_dummy)
 *   python_direct  moonlet.Store.batch_probe_key, connected to the master
 *   python_dummy   the same through the RealClient
 * The Python paths run in a child /usr/bin/python3 (tools/bench/client_py.py)
 * that times each call with perf_counter_ns and reports per-call latencies.
 * --gap-us adds a pause after each call (an engine that probes now and then
 * rather than back to back); --busy-poll-us sets the RealClient's busy
 * polling (moonlet-store --busy-poll-us), so its effect can be measured.
 * The paths take turns in rounds (the first path of each round rotates), so
 * machine noise hits all of them alike; every call is timed on its own.
 *
 * Then the Mooncake class's zero-copy batches (moonlet.mooncake, in the same
 * Python child), per key: batch_put_from / batch_get_into with one buffer
 * per key next to batch_put_from_multi_buffers /
 * batch_get_into_multi_buffers with MB_LAYERS buffers per key (vLLM's
 * layout: one range per layer), direct and through the RealClient, in
 * rotating rounds as well.
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "moonlet/client.h"

#ifndef MOONLET_BENCH_PY_SCRIPT
#define MOONLET_BENCH_PY_SCRIPT "client_py.py"
#endif
#ifndef MOONLET_BENCH_PYTHONPATH
#define MOONLET_BENCH_PYTHONPATH ""
#endif

#define NPATHS 4
enum { P_C_DIRECT, P_C_DUMMY, P_PY_DIRECT, P_PY_DUMMY };
static const char *const g_path_names[NPATHS] = {"c_direct", "c_dummy", "python_direct",
                                                 "python_dummy"};

/* The multi-buffer comparison: the same figures as client_py.py. */
#define MB_KEYS 32
#define MB_LAYERS 8
#define MB_LAYER_BYTES 4096
#define MB_KINDS 4
#define MB_SERIES (2 * MB_KINDS)
static const char *const g_mb_kinds[MB_KINDS] = {"put_single", "put_multi", "get_single",
                                                 "get_multi"};
static const char *const g_mb_paths[2] = {"direct", "dummy"};

typedef struct client_bench {
    int candidates, ranks, rounds, per_round;
    int gap_us;          /* pause after each call */
    const char *busy_us; /* the RealClient's --busy-poll-us; NULL: its default */
    const char *python, *script, *pythonpath;
    char **names;
    const char **keys;
    size_t n;
    int32_t *r;
    moonlet_grant_lease_policy policy;
    /* the Python child */
    pid_t py_pid;
    int py_in, py_out;
    char *line;
    size_t line_cap;
} client_bench;

static int make_keys(client_bench *b)
{
    b->n = (size_t)b->candidates * (size_t)b->ranks;
    b->names = calloc(b->n, sizeof(*b->names));
    b->keys = calloc(b->n, sizeof(*b->keys));
    b->r = calloc(b->n, sizeof(*b->r));
    if (!b->names || !b->keys || !b->r)
        return -1;
    for (size_t i = 0; i < b->n; i++) {
        /* the same names as client_py.py */
        if (asprintf(&b->names[i], "kda/ckpt-%04d/rank-%d", ((int)(i / (size_t)b->ranks) + 1) * 4,
                     (int)(i % (size_t)b->ranks)) < 0)
            return -1;
        b->keys[i] = b->names[i];
    }
    b->policy = (moonlet_grant_lease_policy){MOONLET_PROBE_LEASE_LAST_HIT_ONLY,
                                             (uint64_t)b->ranks};
    return 0;
}

/* One probe, checked: exactly the last candidate selected. */
static int probe_checked(client_bench *b, moonlet_client *c)
{
    int rc = moonlet_client_batch_probe_key(c, b->keys, b->n, b->policy, NULL, b->r);
    if (rc)
        return rc;
    for (size_t i = 0; i < b->n; i++)
        if (b->r[i] != (i >= b->n - (size_t)b->ranks))
            return MOONLET_ERR_INTERNAL_ERROR;
    return MOONLET_OK;
}

/* ---- the Python child --------------------------------------------------------------------- */

static int py_start(client_bench *b, const char *master, const char *sock)
{
    int in[2], out[2];
    if (pipe(in) || pipe(out))
        return -1;
    char cand[16], ranks[16];
    snprintf(cand, sizeof(cand), "%d", b->candidates);
    snprintf(ranks, sizeof(ranks), "%d", b->ranks);
    b->py_pid = bench_fork();
    if (b->py_pid < 0)
        return -1;
    if (b->py_pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        if (b->pythonpath && *b->pythonpath)
            setenv("PYTHONPATH", b->pythonpath, 1);
        setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
        execl(b->python, b->python, b->script, master, sock, cand, ranks, (char *)NULL);
        fprintf(stderr, "moonlet-bench client: cannot run %s: %s\n", b->python, strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    b->py_in = in[1];
    b->py_out = out[0];
    return 0;
}

/* Reads one line from the child into b->line (bounded wait). */
static int py_line(client_bench *b, int timeout_ms)
{
    size_t len = 0;
    for (;;) {
        if (len + 1 >= b->line_cap) {
            size_t cap = b->line_cap ? b->line_cap * 2 : 65536;
            char *p = realloc(b->line, cap);
            if (!p)
                return -1;
            b->line = p;
            b->line_cap = cap;
        }
        struct pollfd pfd = {.fd = b->py_out, .events = POLLIN};
        if (poll(&pfd, 1, timeout_ms) <= 0)
            return -1;
        ssize_t n = read(b->py_out, b->line + len, 1);
        if (n != 1)
            return -1;
        if (b->line[len] == '\n') {
            b->line[len] = 0;
            return 0;
        }
        len++;
    }
}

/* Has the child time `calls` calls on `path` ("direct" / "dummy"); adds the samples. */
/* Sends one command line to the Python child and reads its reply: one
 * latency in microseconds per call, added to s (when given).  0 when exactly
 * `calls` came back. */
static int py_command(client_bench *b, const char *cmd, int len, int timeout_ms, int calls,
                      bench_samples *s)
{
    if (write(b->py_in, cmd, (size_t)len) != len || py_line(b, timeout_ms))
        return -1;
    char *p = b->line, *end;
    int got = 0;
    for (;;) {
        double us = strtod(p, &end);
        if (end == p)
            break;
        if (s)
            bench_samples_add(s, us);
        got++;
        p = end;
    }
    return got == calls ? 0 : -1;
}

static int py_round(client_bench *b, const char *path, int calls, bench_samples *s)
{
    char cmd[64];
    int len = snprintf(cmd, sizeof(cmd), "%s %d %d\n", path, calls, b->gap_us);
    return py_command(b, cmd, len, 60000, calls, s);
}

static void py_stop(client_bench *b)
{
    if (b->py_pid <= 0)
        return;
    if (write(b->py_in, "\n", 1) != 1) {
        /* the child is gone already; waitpid below collects it */
    }
    close(b->py_in);
    bool reaped = false;
    for (int i = 0; i < 500 && !reaped; i++) {
        reaped = waitpid(b->py_pid, NULL, WNOHANG) == b->py_pid;
        if (!reaped)
            usleep(10000);
    }
    if (!reaped) {
        kill(b->py_pid, SIGKILL);
        waitpid(b->py_pid, NULL, 0);
    }
    close(b->py_out);
    b->py_pid = 0;
}

/* ---- the run ---------------------------------------------------------------------------------- */

static int c_round(client_bench *b, moonlet_client *c, int calls, bench_samples *s)
{
    for (int i = 0; i < calls; i++) {
        uint64_t t0 = bench_now_ns();
        int rc = moonlet_client_batch_probe_key(c, b->keys, b->n, b->policy, NULL, b->r);
        uint64_t t1 = bench_now_ns();
        if (rc)
            return rc;
        if (s)
            bench_samples_add(s, (double)(t1 - t0) / 1000.0);
        if (b->gap_us)
            usleep((useconds_t)b->gap_us);
    }
    return 0;
}

static int run_path(client_bench *b, int path, moonlet_client *direct, moonlet_client *dummy,
                    int calls, bench_samples *s)
{
    switch (path) {
    case P_C_DIRECT: return c_round(b, direct, calls, s);
    case P_C_DUMMY: return c_round(b, dummy, calls, s);
    case P_PY_DIRECT: return py_round(b, "direct", calls, s);
    default: return py_round(b, "dummy", calls, s);
    }
}

/* Has the child time `calls` calls of a Mooncake batch; adds per-key costs. */
static int mb_round(client_bench *b, int series, int calls, bench_samples *s)
{
    char cmd[64];
    int len = snprintf(cmd, sizeof(cmd), "mb %s %s %d\n", g_mb_paths[series / MB_KINDS],
                       g_mb_kinds[series % MB_KINDS], calls);
    return py_command(b, cmd, len, 120000, calls, s);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moonlet-bench client [options] [--json]\n\n"
            "  --candidates N   checkpoints probed per call (default 128)\n"
            "  --ranks N        keys per checkpoint, the candidate_size (default 4)\n"
            "  --rounds N       rounds; each path makes --per-round calls per round (default 40)\n"
            "  --per-round N    calls per path and round (default 50)\n"
            "  --gap-us N       pause after each call (default 0: back to back)\n"
            "  --busy-poll-us N the RealClient's busy polling (default: moonlet-store's, 200)\n"
            "  --mb-rounds N    rounds of the multi-buffer comparison, 5 calls per series\n"
            "                   and round (default 20; 0 skips it)\n"
            "  --python PATH    interpreter of the Python paths (default /usr/bin/python3)\n"
            "  --script PATH    the Python half (default %s)\n"
            "  --pythonpath P   PYTHONPATH for it (default %s)\n",
            MOONLET_BENCH_PY_SCRIPT, *MOONLET_BENCH_PYTHONPATH ? MOONLET_BENCH_PYTHONPATH
                                                               : "inherited");
}

int bench_client_main(int argc, char **argv)
{
    client_bench b = {.candidates = 128, .ranks = 4, .rounds = 40, .per_round = 50,
                      .python = "/usr/bin/python3", .script = MOONLET_BENCH_PY_SCRIPT,
                      .pythonpath = MOONLET_BENCH_PYTHONPATH};
    int json = 0, mb_rounds = 20;
    static const struct option opts[] = {
        {"mb-rounds", required_argument, 0, 'm'},
        {"candidates", required_argument, 0, 'c'}, {"ranks", required_argument, 0, 'k'},
        {"rounds", required_argument, 0, 'r'}, {"per-round", required_argument, 0, 'p'},
        {"python", required_argument, 0, 'y'}, {"script", required_argument, 0, 's'},
        {"pythonpath", required_argument, 0, 'P'}, {"json", no_argument, 0, 'j'},
        {"gap-us", required_argument, 0, 'g'}, {"busy-poll-us", required_argument, 0, 'b'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'c': b.candidates = atoi(optarg); break;
        case 'k': b.ranks = atoi(optarg); break;
        case 'r': b.rounds = atoi(optarg); break;
        case 'p': b.per_round = atoi(optarg); break;
        case 'y': b.python = optarg; break;
        case 's': b.script = optarg; break;
        case 'P': b.pythonpath = optarg; break;
        case 'j': json = 1; break;
        case 'g': b.gap_us = atoi(optarg); break;
        case 'b': b.busy_us = optarg; break;
        case 'm': mb_rounds = atoi(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (b.candidates < 1 || b.ranks < 1 || b.rounds < 1 || b.per_round < 1 || b.gap_us < 0 ||
        b.gap_us > 1000000 || mb_rounds < 0) {
        fprintf(stderr, "moonlet-bench client: every count must be >= 1, --gap-us 0..1000000\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    const char *step = "keys";
    bench_master bm = {0}, real = {0};
    moonlet_client *direct = NULL, *dummy = NULL;
    bench_samples s[NPATHS] = {{0}}, mb[MB_SERIES] = {{0}};
    char dir[] = "/tmp/moonlet-bench-XXXXXX", sock[sizeof(dir) + 16];
    bool have_dir = mkdtemp(dir) != NULL;
    snprintf(sock, sizeof(sock), "%s/real.sock", dir);
    if (make_keys(&b))
        goto out;
    step = "start moonlet-master";
    if (!have_dir || bench_master_start(&bm, NULL))
        goto out;
    step = "start the RealClient (moonlet-store --serve-dummy)";
    const char *real_args[] = {"--master", bm.addr, "--segment-size", "64MiB", "--protocol", "tcp",
                               "--listen", "127.0.0.1:0", "--serve-dummy", sock, "--log-level",
                               "warn", b.busy_us ? "--busy-poll-us" : NULL, b.busy_us, NULL};
    if (bench_child_start(&real, "moonlet-store", real_args, "serving dummy clients on "))
        goto out;
    step = "connect the C clients";
    moonlet_client_config cfg = bench_client_config(bm.addr);
    if (moonlet_client_create(&cfg, &direct) || moonlet_client_create_dummy(sock, NULL, &dummy))
        goto out;
    step = "put the keys";
    static const char value[64] = "checkpoint";
    for (size_t i = 0; i < b.n; i++)
        if (moonlet_client_put(direct, b.keys[i], value, sizeof(value), NULL))
            goto out;
    step = "check the mask";
    if (probe_checked(&b, direct) || probe_checked(&b, dummy))
        goto out;
    step = "start the Python half";
    if (py_start(&b, bm.addr, sock) || py_line(&b, 60000) || strcmp(b.line, "ready") != 0)
        goto out;
    step = "warm up";
    for (int p = 0; p < NPATHS; p++)
        if (run_path(&b, p, direct, dummy, b.per_round, NULL))
            goto out;
    step = "measure";
    for (int round = 0; round < b.rounds; round++)
        for (int k = 0; k < NPATHS; k++) {
            int p = (round + k) % NPATHS;
            if (run_path(&b, p, direct, dummy, b.per_round, &s[p]))
                goto out;
        }

    step = "measure the multi-buffer batches";
    for (int round = 0; round < mb_rounds; round++)
        for (int k = 0; k < MB_SERIES; k++)
            if (mb_round(&b, (round + k) % MB_SERIES, 5, round ? &mb[(round + k) % MB_SERIES]
                                                               : NULL)) /* round 0 warms up */
                goto out;

    double p50[NPATHS];
    for (int p = 0; p < NPATHS; p++)
        p50[p] = bench_percentile(&s[p], 50);
    cJSON *root = cJSON_CreateObject();
    char workload[160];
    snprintf(workload, sizeof(workload),
             "batch_probe_key: %d candidates x %d keys, LAST_HIT_ONLY, all present", b.candidates,
             b.ranks);
    cJSON_AddStringToObject(root, "workload", workload);
    cJSON_AddNumberToObject(root, "gap_us", b.gap_us);
    cJSON_AddStringToObject(root, "realclient_busy_poll_us", b.busy_us ? b.busy_us : "default");
    for (int p = 0; p < NPATHS; p++)
        bench_json_latency(root, g_path_names[p], &s[p]);
    cJSON_AddNumberToObject(root, "python_direct_over_c_direct", p50[P_PY_DIRECT] / p50[P_C_DIRECT]);
    cJSON_AddNumberToObject(root, "python_direct_over_c_direct_target_max", 1.3);
    cJSON_AddNumberToObject(root, "python_dummy_over_python_direct",
                            p50[P_PY_DUMMY] / p50[P_PY_DIRECT]);
    cJSON_AddNumberToObject(root, "python_dummy_over_python_direct_target_max", 2.0);
    cJSON_AddNumberToObject(root, "c_dummy_over_c_direct", p50[P_C_DUMMY] / p50[P_C_DIRECT]);
    double mb50[MB_SERIES] = {0};
    if (mb_rounds > 1) {
        cJSON *m = cJSON_AddObjectToObject(root, "mooncake_multi_buffer");
        char what[200];
        snprintf(what, sizeof(what),
                 "moonlet.mooncake, per key: %d keys per call, objects of %d x %d bytes; "
                 "single: one buffer per key, multi: %d buffers per key",
                 MB_KEYS, MB_LAYERS, MB_LAYER_BYTES, MB_LAYERS);
        cJSON_AddStringToObject(m, "workload", what);
        for (int p = 0; p < 2; p++) {
            cJSON *po = cJSON_AddObjectToObject(m, g_mb_paths[p]);
            for (int k = 0; k < MB_KINDS; k++) {
                bench_json_latency(po, g_mb_kinds[k], &mb[p * MB_KINDS + k]);
                mb50[p * MB_KINDS + k] = bench_percentile(&mb[p * MB_KINDS + k], 50);
            }
            cJSON_AddNumberToObject(po, "put_multi_over_single", mb50[p * MB_KINDS + 1] /
                                                                    mb50[p * MB_KINDS]);
            cJSON_AddNumberToObject(po, "get_multi_over_single", mb50[p * MB_KINDS + 3] /
                                                                    mb50[p * MB_KINDS + 2]);
        }
    }
    if (json) {
        bench_print_json(root);
    } else {
        printf("batch_probe_key p50: C direct %.1f us, C dummy %.1f us, Python direct %.1f us "
               "(%.2fx C), Python dummy %.1f us (%.2fx Python direct)\n",
               p50[P_C_DIRECT], p50[P_C_DUMMY], p50[P_PY_DIRECT],
               p50[P_PY_DIRECT] / p50[P_C_DIRECT], p50[P_PY_DUMMY],
               p50[P_PY_DUMMY] / p50[P_PY_DIRECT]);
        for (int p = 0; mb_rounds > 1 && p < 2; p++)
            printf("mooncake %s per key p50: put %.1f us single, %.1f us multi; get %.1f us "
                   "single, %.1f us multi\n", g_mb_paths[p], mb50[p * MB_KINDS],
                   mb50[p * MB_KINDS + 1], mb50[p * MB_KINDS + 2], mb50[p * MB_KINDS + 3]);
        cJSON_Delete(root);
    }
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "moonlet-bench client: failed to %s\n", step);
    py_stop(&b);
    moonlet_client_destroy(dummy);
    moonlet_client_destroy(direct);
    bench_master_stop(&real);
    bench_master_stop(&bm);
    if (have_dir) {
        unlink(sock);
        rmdir(dir);
    }
    for (int p = 0; p < NPATHS; p++)
        bench_samples_free(&s[p]);
    for (int p = 0; p < MB_SERIES; p++)
        bench_samples_free(&mb[p]);
    for (size_t i = 0; b.names && i < b.n; i++)
        free(b.names[i]);
    free(b.names);
    free(b.keys);
    free(b.r);
    free(b.line);
    return rc;
}
