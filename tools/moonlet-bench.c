/*
 * moonlet-bench - benchmarks that back every speed and memory figure in the
 * docs.  Each subcommand starts what it measures and prints one result
 * (a JSON object with --json).
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "transfer.h"

struct subcommand {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
};

static const struct subcommand g_cmds[] = {
    {"rpc", bench_rpc_main, "control-plane latency (Echo, BatchExistKey) and master memory per object"},
    {"probe", bench_probe_main, "K3 lookup: BatchExistKey on everything vs. KV + BatchProbeKey(LastHitOnly)"},
    {"client", bench_client_main, "batch_probe_key latency from the C client, Python direct and Python via a DummyClient"},
    {"batch", bench_batch_main, "zero-copy batch put/get (4 KiB, 64 KiB, 1 MiB, 8 ranges a key) against a plain socket: batch, per-key and DummyClient paths"},
    {"transfer", moonlet_bench_transfer, "TCP data-plane read/write bandwidth vs. a plain loopback socket stream"},
    {"load", bench_load_main, "many clients: BatchExistKey keys/s and 4 KiB put+get ops/s against one master, and Redis"},
    {"scale", bench_scale_main, "the master at cluster scale: simulated store nodes mounting and pinging, client latency, a tenth going silent"},
    {"ha", bench_ha_main, "high availability: leader SIGKILL -> put+get failover time, put p50 with a hot standby vs none"},
    {"trace", bench_trace_main, "replay of a Mooncake trace: lease-all vs. selective K3 lookup under eviction"},
    {"disk", bench_disk_main, "a store node's disk tier (durable writes, verified reads) against fio on the same file system"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: moonlet-bench COMMAND [options] [--json]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(g_cmds) / sizeof(g_cmds[0]); i++)
        fprintf(f, "  %-10s %s\n", g_cmds[i].name, g_cmds[i].help);
    fprintf(f, "\n'moonlet-bench COMMAND --help' shows a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    /* One subcommand runs per process: it parses its flags with getopt_long
     * from the initial optind. */
    for (size_t i = 0; i < sizeof(g_cmds) / sizeof(g_cmds[0]); i++)
        if (!strcmp(argv[1], g_cmds[i].name))
            return g_cmds[i].main(argc - 1, argv + 1);
    fprintf(stderr, "moonlet-bench: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
