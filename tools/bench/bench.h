/*
 * bench.h - shared pieces of moonlet-bench's subcommands: starting
 * moonlet-master and moonlet-store child processes (tied to the bench), free
 * loopback ports, latency samples and percentiles, RSS of a process, flag
 * values (numbers, counts, sizes), JSON output.
 */
#ifndef MOONLET_BENCH_H
#define MOONLET_BENCH_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "moonlet/client.h"

/* How long a child may take to say it is ready (a store node faults in its
 * whole segment first: a GiB takes seconds on a quiet machine, many more on
 * a loaded one).  A child that exits is noticed at once. */
#define BENCH_READY_S 60

typedef struct bench_master {
    pid_t pid;
    int out_fd;
    char addr[256];
    uint16_t port;
} bench_master;

/* fork() for the bench's main thread, with the child tied to the bench: the
 * kernel sends the child SIGKILL when the bench dies (PR_SET_PDEATHSIG), so a
 * bench that crashes or is killed leaves no daemon holding its ports or its
 * caller's pipe; a child whose bench is already gone exits at once.  Returns
 * what fork() returns. */
pid_t bench_fork(void);

/* A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice of
 * an ephemeral port), for a child that takes its port as a flag; 0 when none
 * could be had. */
uint16_t bench_free_port(void);

/* Starts tools/moonlet-master (found next to this binary) with extra flags,
 * on 127.0.0.1 and an ephemeral port.  Returns 0 when it listens. */
int bench_master_start(bench_master *bm, const char *const *extra_args);
void bench_master_stop(bench_master *bm);
/* Starts tools/<tool> (next to this binary) with args (NULL-terminated, no
 * argv[0]) and waits up to BENCH_READY_S for a stdout line starting with
 * ready_prefix; the rest of that line goes to bm->addr.  Returns 0 when seen.
 * Stop it with bench_master_stop(). */
int bench_child_start(bench_master *bm, const char *tool, const char *const *args,
                      const char *ready_prefix);
/* Starts the program at `path` (any binary, e.g. /usr/bin/redis-server)
 * with args and waits up to BENCH_READY_S for a stdout line containing ready_text.
 * Returns 0 when seen; stop it with bench_master_stop() (by its PID). */
int bench_exec_start(bench_master *bm, const char *path, const char *const *args,
                     const char *ready_text);
/* Starts tools/moonlet-store (next to this binary): a TCP segment of
 * segment_bytes on 127.0.0.1, mounted on master_addr.  Returns 0 once it
 * printed its "listening on" line (it prints it after mounting); bm->addr
 * then holds its data endpoint. */
int bench_store_start(bench_master *bs, const char *master_addr, uint64_t segment_bytes);
/* The same with more flags (a NULL-terminated list; NULL: none). */
int bench_store_start_with(bench_master *bs, const char *master_addr, uint64_t segment_bytes,
                           const char *const *extra);
/* The path of `name` in the directory of this binary. */
void bench_tool_path(const char *name, char *out, size_t cap);
/* Runs /usr/bin/python3 <script next to this binary> data out (stdout
 * sent to stderr, keeping stdout for the bench's result); 0 when it
 * succeeded, else -1 after a line naming `bench` ("load", "trace"). */
int bench_run_plot(const char *bench, const char *script, const char *data, const char *out);
/* Resident set size of a process in bytes (0 when unknown). */
uint64_t bench_rss_bytes(pid_t pid);
/* CPU time (user + system, all threads) a process has used so far, in
 * seconds at the kernel's tick resolution (/proc/PID/stat); -1 when unknown. */
double bench_cpu_seconds(pid_t pid);

typedef struct bench_samples {
    double *v;
    size_t n, cap;
} bench_samples;

void bench_samples_add(bench_samples *s, double x);
/* p in [0, 100]; sorts the samples. */
double bench_percentile(bench_samples *s, double p);
void bench_samples_free(bench_samples *s);

uint64_t bench_now_ns(void);

/* Parses a flag's comma-separated counts ("1,2,4,8") into out[0..cap): each
 * from 1 to max.  Returns 0 with *n set, or -1 (empty list, a count out of
 * range, a character that is neither digit nor comma). */
int bench_parse_counts(const char *s, uint32_t max, uint32_t *out, int cap, int *n);

/* Parses a flag's number (strtol's reading, base 10, nothing after it) into
 * *out when it lies from min to max; -1 otherwise. */
int bench_parse_long(const char *s, long min, long max, long *out);

/* bench_parse_long of optarg for the flag --name; on a refusal says the
 * flag's range on stderr and returns -1. */
int bench_flag_long(const char *name, long min, long max, long *out);

/* Parses a flag's comma-separated byte sizes ("64KiB,1MiB") into
 * out[0..cap): each from min to max and a multiple of align (1: any).
 * Returns 0 with *n set, or -1 (empty, too many, one that does not parse or
 * is out of range). */
int bench_parse_sizes(const char *s, uint64_t min, uint64_t max, uint64_t align, uint64_t *out,
                      int cap, int *n);

/* Adds {"p50_us": .., "p99_us": .., "samples": n} under `name`. */
void bench_json_latency(cJSON *obj, const char *name, bench_samples *s);

/* Prints the JSON document (pretty unless compact) and frees it. */
void bench_print_json(cJSON *root);
/* Two paths' GB/s side by side: "<a>_<op>_gbps", "<b>_<op>_gbps" and
 * "<op>_ratio" (av / bv, 0 when bv is 0) added to obj. */
void bench_json_ratio(cJSON *obj, const char *op, const char *a, double av, const char *b,
                      double bv);

/* A client's defaults, given the master(s) master_addr, over TCP: what a
 * bench's client starts from. */
moonlet_client_config bench_client_config(const char *master_addr);

/* Subcommands. */
int bench_rpc_main(int argc, char **argv);
int bench_probe_main(int argc, char **argv);
int bench_client_main(int argc, char **argv);
int bench_batch_main(int argc, char **argv);
int bench_trace_main(int argc, char **argv);
int bench_load_main(int argc, char **argv);
int bench_scale_main(int argc, char **argv);
int bench_ha_main(int argc, char **argv);
int bench_disk_main(int argc, char **argv);

#endif
