/*
 * util.c - helpers shared by moonlet-bench subcommands (see bench.h):
 * starting sibling daemons (moonlet-master, moonlet-store) from the
 * directory this binary lives in, latency samples and percentiles, JSON.
 */
#include "bench.h"
#include "bytesize.h"
#include "monotime.h"
#include "net.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

uint64_t bench_now_ns(void)
{
    return moonlet_mono_ns();
}

int bench_parse_sizes(const char *s, uint64_t min, uint64_t max, uint64_t align, uint64_t *out,
                      int cap, int *n)
{
    char *list = strdup(s), *save = NULL;
    int k = 0, rc = list ? 0 : -1;
    for (char *t = list ? strtok_r(list, ",", &save) : NULL; t && !rc;
         t = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (k == cap || moonlet_bytesize_parse(t, &v) || v < min || v > max || v % align)
            rc = -1;
        else
            out[k++] = v;
    }
    free(list);
    if (rc || !k)
        return -1;
    *n = k;
    return 0;
}

int bench_parse_counts(const char *s, uint32_t max, uint32_t *out, int cap, int *n)
{
    *n = 0;
    while (*s && *n < cap) {
        char *end;
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v == 0 || v > max)
            return -1;
        out[(*n)++] = (uint32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *n ? 0 : -1;
}

int bench_parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int bench_flag_long(const char *name, long min, long max, long *out)
{
    if (bench_parse_long(optarg, min, max, out) == 0)
        return 0;
    fprintf(stderr, "--%s: %ld..%ld\n", name, min, max);
    return -1;
}

void bench_tool_path(const char *name, char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[n > 0 ? n : 0] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(out, cap, "%s/%s", n > 0 ? self : ".", name);
}

pid_t bench_fork(void)
{
    pid_t parent = getpid(), pid = fork();
    /* The signal follows the forking thread's death: every fork of the
     * bench is made by its main thread, which outlives its children. */
    if (pid == 0 && (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent))
        _exit(127);
    return pid;
}

uint16_t bench_free_port(void)
{
    uint16_t port = 0;
    int fd = moonlet_net_listen_tcp("127.0.0.1", 0, 1, &port);
    if (fd < 0)
        return 0;
    close(fd);
    return port;
}

int bench_run_plot(const char *bench, const char *script, const char *data, const char *out)
{
    char path[PATH_MAX + 32];
    bench_tool_path(script, path, sizeof(path));
    pid_t pid = bench_fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(2, 1); /* keep stdout for the result */
        execl("/usr/bin/python3", "python3", path, data, out, (char *)NULL);
        fprintf(stderr, "moonlet-bench %s: cannot run /usr/bin/python3: %s\n", bench,
                strerror(errno));
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "moonlet-bench %s: %s failed\n", bench, path);
        return -1;
    }
    return 0;
}

int bench_master_start(bench_master *bm, const char *const *extra)
{
    /* The benches mount a bookkeeping-only segment and do not ping: a long
     * liveness TTL keeps it mounted however long the fill takes. */
    const char *argv[32] = {"--rpc-port", "0", "--log-level", "warn",
                            "--client_live_ttl_sec", "86400"};
    int argc = 6;
    for (int i = 0; extra && extra[i] && argc < 31; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    if (bench_child_start(bm, "moonlet-master", argv, "listening on "))
        return -1;
    char host[sizeof(bm->addr)];
    if (moonlet_net_split_hostport(bm->addr, host, sizeof(host), &bm->port))
        bm->port = 0;
    return bm->port ? 0 : -1;
}

/* Starts `path` with args; waits for a stdout line that starts with `ready`
 * (prefix) or holds it anywhere (!prefix). */
static int child_start(bench_master *bm, const char *path, const char *const *args,
                       const char *ready, bool prefix)
{
    const char *argv[48] = {path};
    int argc = 1;
    for (int i = 0; args && args[i] && argc < 47; i++)
        argv[argc++] = args[i];
    argv[argc] = NULL;
    int fds[2];
    if (pipe(fds))
        return -1;
    bm->pid = bench_fork();
    if (bm->pid < 0)
        return -1;
    if (bm->pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execv(path, (char *const *)argv);
        fprintf(stderr, "moonlet-bench: cannot run %s: %s\n", path, strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    bm->out_fd = fds[0];
    bm->port = 0;
    char line[512];
    size_t len = 0, plen = strlen(ready);
    uint64_t deadline = bench_now_ns() + BENCH_READY_S * 1000000000ull;
    while (bench_now_ns() < deadline && len < sizeof(line) - 1) {
        struct pollfd pfd = {.fd = bm->out_fd, .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        if (read(bm->out_fd, line + len, 1) != 1)
            break;
        if (line[len] != '\n') {
            len++;
            continue;
        }
        line[len] = 0;
        if (prefix && len >= plen && strncmp(line, ready, plen) == 0) {
            snprintf(bm->addr, sizeof(bm->addr), "%s", line + plen);
            return 0;
        }
        if (!prefix && strstr(line, ready)) {
            bm->addr[0] = 0;
            return 0;
        }
        len = 0;
    }
    bench_master_stop(bm);
    return -1;
}

int bench_child_start(bench_master *bm, const char *tool, const char *const *args,
                      const char *ready_prefix)
{
    char path[PATH_MAX + 32];
    bench_tool_path(tool, path, sizeof(path));
    return child_start(bm, path, args, ready_prefix, true);
}

int bench_exec_start(bench_master *bm, const char *path, const char *const *args,
                     const char *ready_text)
{
    return child_start(bm, path, args, ready_text, false);
}

int bench_store_start(bench_master *bs, const char *master_addr, uint64_t segment_bytes)
{
    return bench_store_start_with(bs, master_addr, segment_bytes, NULL);
}

int bench_store_start_with(bench_master *bs, const char *master_addr, uint64_t segment_bytes,
                           const char *const *extra)
{
    char size[32];
    snprintf(size, sizeof(size), "%llu", (unsigned long long)segment_bytes);
    const char *args[24] = {"--master", master_addr, "--segment-size", size, "--protocol", "tcp",
                            "--listen", "127.0.0.1:0", "--log-level", "error"};
    size_t n = 10;
    for (size_t i = 0; extra && extra[i] && n + 1 < sizeof(args) / sizeof(args[0]); i++)
        args[n++] = extra[i];
    args[n] = NULL;
    return bench_child_start(bs, "moonlet-store", args, "listening on ");
}

void bench_master_stop(bench_master *bm)
{
    if (bm->pid <= 0)
        return;
    kill(bm->pid, SIGTERM);
    for (int i = 0; i < 300; i++) {
        if (waitpid(bm->pid, NULL, WNOHANG) == bm->pid) {
            bm->pid = 0;
            break;
        }
        usleep(10000);
    }
    if (bm->pid > 0) {
        kill(bm->pid, SIGKILL);
        waitpid(bm->pid, NULL, 0);
    }
    close(bm->out_fd);
    bm->pid = 0;
}

uint64_t bench_rss_bytes(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    uint64_t kb = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "VmRSS: %lu kB", &kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
}

double bench_cpu_seconds(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    /* fields 14 and 15 (utime, stime) follow the command, which may hold
     * spaces and parentheses: count from its last ')' */
    char *p = strrchr(buf, ')');
    unsigned long ut, st;
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

void bench_samples_add(bench_samples *s, double x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        double *v = realloc(s->v, cap * sizeof(*v));
        if (!v)
            return;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_percentile(bench_samples *s, double p)
{
    if (!s->n)
        return 0;
    qsort(s->v, s->n, sizeof(*s->v), cmp_double);
    size_t i = (size_t)(p / 100.0 * (double)(s->n - 1) + 0.5);
    return s->v[i < s->n ? i : s->n - 1];
}

void bench_samples_free(bench_samples *s)
{
    free(s->v);
    memset(s, 0, sizeof(*s));
}

void bench_json_ratio(cJSON *obj, const char *op, const char *a, double av, const char *b,
                      double bv)
{
    char name[64];
    snprintf(name, sizeof name, "%s_%s_gbps", a, op);
    cJSON_AddNumberToObject(obj, name, av);
    snprintf(name, sizeof name, "%s_%s_gbps", b, op);
    cJSON_AddNumberToObject(obj, name, bv);
    snprintf(name, sizeof name, "%s_ratio", op);
    cJSON_AddNumberToObject(obj, name, bv > 0 ? av / bv : 0);
}

void bench_json_latency(cJSON *obj, const char *name, bench_samples *s)
{
    cJSON *o = cJSON_AddObjectToObject(obj, name);
    cJSON_AddNumberToObject(o, "p50_us", bench_percentile(s, 50));
    cJSON_AddNumberToObject(o, "p99_us", bench_percentile(s, 99));
    cJSON_AddNumberToObject(o, "samples", (double)s->n);
}

void bench_print_json(cJSON *root)
{
    char *s = cJSON_Print(root);
    if (s) {
        puts(s);
        free(s);
    }
    cJSON_Delete(root);
}

moonlet_client_config bench_client_config(const char *master_addr)
{
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg, sizeof cfg);
    cfg.master_addr = master_addr;
    cfg.protocol = MOONLET_PROTOCOL_TCP;
    return cfg;
}
