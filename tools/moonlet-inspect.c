/*
 * moonlet-inspect - the operator's replica inspection CLI.
 *
 *   moonlet-inspect [--master HOST:PORT] [--tenant T] [--json]
 *                   [--auth-token-file PATH] COMMAND [options] [operands]
 *
 * This file only parses flags into an inspect_opts and dispatches to the
 * command's verb in tools/inspect/ (see inspect.h).  Global flags may come
 * before or after the command.  Exit codes: 0 ok, 1 runtime error (master
 * unreachable, RPC failed, key not found), 2 usage error.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"
#include "log.h"
#include "moonlet_config.h"

enum {
    O_MASTER = 1000, O_TENANT, O_JSON, O_TOKEN, O_HELP, O_VERSION,
    O_TLS_CA, O_TLS_CERT, O_TLS_KEY, /* global options end here */
    O_PREFIX, O_LIMIT, O_MODE, O_CSIZE, O_YES, O_INTERVAL, O_COUNT,
};

/* Command options, as bits of struct command.accepts. */
#define F(o) (1u << ((o) - O_PREFIX))

struct command {
    const char *name;
    const char *synopsis;
    const char *summary;     /* one line of the command list */
    const char *description; /* the command's --help */
    const char *options;     /* help text of the command's own options */
    int min_args, max_args;  /* operands; max -1: any number */
    unsigned accepts;
    int (*run)(const inspect_opts *o, int argc, char **argv);
};

static const struct command g_cmds[] = {
    {"segments", "segments", "mounted segments: owner, endpoint, space, last ping",
     "Lists every segment mounted on the master: id, name, owner client, transport\n"
     "protocol and endpoint, capacity, bytes used, objects (replicas) stored, and\n"
     "how long ago its owner last pinged the master.\n",
     "", 0, 0, 0, inspect_cmd_segments},
    {"keys", "keys [--prefix P] [--limit N]", "a tenant's keys with size, replicas and lease",
     "Lists the keys of a tenant with their size, replica count, readable replica\n"
     "count and remaining lease, in the master's stable listing order.  Pages of\n"
     "at most 1000 keys are fetched and printed one at a time.\n",
     "  --prefix P          only keys that start with P\n"
     "  --limit N           print at most N keys (default: all)\n",
     0, 0, F(O_PREFIX) | F(O_LIMIT), inspect_cmd_keys},
    {"tenants", "tenants [--limit N]", "tenants holding keys, with key counts and bytes",
     "Lists every tenant that holds keys, in name order, with its key count (puts\n"
     "in progress included) and bytes (the objects' sizes, one replica each).\n"
     "`keys` names these tenants when the one asked holds no keys.\n",
     "  --limit N           print at most N tenants (default: all, up to 65536)\n",
     0, 0, F(O_LIMIT), inspect_cmd_tenants},
    {"key", "key KEY...", "each key's replicas, lease and soft pin",
     "Shows each key's size, every replica (segment, node endpoint, offset,\n"
     "length, status), the lease remaining in ms and the soft pin.  A key that\n"
     "does not exist is reported on stderr; the others are still shown, and the\n"
     "exit code is 1.\n",
     "", 1, -1, 0, inspect_cmd_key},
    {"probe", "probe [--mode none|last-hit-only] [--candidate-size N] [--yes] KEY...",
     "BatchProbeKey with a GrantLeasePolicy",
     "Runs BatchProbeKey on the keys, taken as candidates of --candidate-size\n"
     "contiguous keys, and prints the candidates as groups with the selected one\n"
     "marked '*' (mode none: the last complete candidate; nothing is leased).\n"
     "Mode last-hit-only leases every key of the selected candidate, so it runs\n"
     "only with --yes; without it nothing is sent and the exit code is 2.\n",
     "  --mode MODE         none (default) or last-hit-only\n"
     "  --candidate-size N  keys per candidate (default 1); must divide the key count\n"
     "  --yes               allow last-hit-only to grant leases\n",
     1, -1, F(O_MODE) | F(O_CSIZE) | F(O_YES), inspect_cmd_probe},
    {"stats", "stats", "master counters, leases by operation, probe lock-hold histogram",
     "Shows the master's statistics: objects, bytes, segments and space, puts,\n"
     "removals, evictions, leases granted by each operation, probe counters, and\n"
     "the histogram of BatchProbeKey(last-hit-only) shard-lock hold times.\n",
     "", 0, 0, 0, inspect_cmd_stats},
    {"watch", "watch [--interval S] [--count N] stats|segments",
     "refresh stats or segments in place until SIGINT",
     "Redraws `stats` or `segments` every --interval seconds: in place on a\n"
     "terminal, as successive plain blocks when stdout is not one.  SIGINT ends\n"
     "it (exit code 0).\n",
     "  --interval S        seconds between refreshes (default 2)\n"
     "  --count N           stop after N refreshes (default: until SIGINT)\n",
     1, 1, F(O_INTERVAL) | F(O_COUNT), inspect_cmd_watch},
    {"drain", "drain SEGMENT|NODE", "move a segment's (or a node's) objects elsewhere",
     "Drains the segments named (a segment id or name, an endpoint, or a store\n"
     "node's client id): the master places no new replica there and copies each\n"
     "of their objects to another host, replacing the draining replica.  The\n"
     "drain is done when `segments` shows 0 objects on them; stopping the node\n"
     "then loses nothing.\n",
     "", 1, 1, 0, inspect_cmd_drain},
    {"undrain", "undrain SEGMENT|NODE", "end a drain",
     "Ends the drain of the segments named: they take new replicas again.\n",
     "", 1, 1, 0, inspect_cmd_undrain},
    {"status", "status", "HA: each master's role, serving state, epoch and leader",
     "Asks every master of --master (a comma-separated list with HA) for its\n"
     "role (single: no etcd; standby; leader), whether it serves calls now, its\n"
     "epoch (the leader key's etcd create revision) and the leader it names,\n"
     "then prints the leader with the highest epoch.  A standby answers too.\n",
     "", 0, 0, 0, inspect_cmd_status},
};
#define NCMDS (sizeof(g_cmds) / sizeof(g_cmds[0]))

static const char GLOBAL_HELP[] =
    "global options (before or after the command):\n"
    "  --master HOST:PORT[,..] the master's RPC address (default 127.0.0.1:50051); with\n"
    "                          HA every master's (the calls follow the leader)\n"
    "  --tenant T              tenant of keys, key and probe (default: \"default\")\n"
    "  --json                  print one JSON document (exact integers, stable field names)\n"
    "  --auth-token-file PATH  the cluster's shared token, when the master requires one\n"
    "                          (with --credentials on the master: a reader credential\n"
    "                          reads, an operator's drains)\n"
    "  --tls-ca FILE           TLS: the master's certificate must be signed by this CA\n"
    "  --tls-cert FILE --tls-key FILE  a client certificate, for a master that requires one\n"
    "  --help                  this help; 'moonlet-inspect COMMAND --help' for a command\n"
    "  --version\n";

static void usage(FILE *f)
{
    fprintf(f, "usage: moonlet-inspect [global options] COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < NCMDS; i++)
        fprintf(f, "  %-9s %s\n", g_cmds[i].name, g_cmds[i].summary);
    fprintf(f, "\n%s", GLOBAL_HELP);
}

static void command_usage(FILE *f, const struct command *c)
{
    fprintf(f, "usage: moonlet-inspect [global options] %s\n\n%s", c->synopsis, c->description);
    if (c->options[0])
        fprintf(f, "\noptions:\n%s", c->options);
    fprintf(f, "\n%s", GLOBAL_HELP);
}

static const struct option g_opts[] = {
    {"master", required_argument, 0, O_MASTER},
    {"tenant", required_argument, 0, O_TENANT},
    {"json", no_argument, 0, O_JSON},
    {"auth-token-file", required_argument, 0, O_TOKEN},
    {"tls-ca", required_argument, 0, O_TLS_CA},
    {"tls-cert", required_argument, 0, O_TLS_CERT},
    {"tls-key", required_argument, 0, O_TLS_KEY},
    {"help", no_argument, 0, O_HELP},
    {"version", no_argument, 0, O_VERSION},
    {"prefix", required_argument, 0, O_PREFIX},
    {"limit", required_argument, 0, O_LIMIT},
    {"mode", required_argument, 0, O_MODE},
    {"candidate-size", required_argument, 0, O_CSIZE},
    {"yes", no_argument, 0, O_YES},
    {"interval", required_argument, 0, O_INTERVAL},
    {"count", required_argument, 0, O_COUNT},
    {0, 0, 0, 0},
};

static const char *g_where = ""; /* "keys: " once the command is known */

static int parse_u64(const char *flag, const char *s, uint64_t min, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < min) {
        inspect_error("%s%s: expected an integer >= %llu, got '%s'", g_where, flag,
                      (unsigned long long)min, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Applies one option; returns 0, or -1 after printing the error. */
static int apply(int c, const char *arg, inspect_opts *o)
{
    switch (c) {
    case O_MASTER: o->master = arg; return 0;
    case O_TENANT: o->tenant = arg; return 0;
    case O_JSON: o->json = true; return 0;
    case O_TOKEN: o->token_file = arg; return 0;
    case O_TLS_CA: o->tls_ca = arg; return 0;
    case O_TLS_CERT: o->tls_cert = arg; return 0;
    case O_TLS_KEY: o->tls_key = arg; return 0;
    case O_PREFIX: o->prefix = arg; return 0;
    case O_LIMIT: return parse_u64("--limit", arg, 1, &o->limit);
    case O_CSIZE: return parse_u64("--candidate-size", arg, 1, &o->candidate_size);
    case O_COUNT: return parse_u64("--count", arg, 1, &o->count);
    case O_YES: o->yes = true; return 0;
    case O_MODE:
        if (!strcmp(arg, "none")) {
            o->lease_mode = MOONLET_PROBE_LEASE_NONE;
        } else if (!strcmp(arg, "last-hit-only") || !strcmp(arg, "last_hit_only")) {
            o->lease_mode = MOONLET_PROBE_LEASE_LAST_HIT_ONLY;
        } else {
            inspect_error("%s--mode: expected none or last-hit-only, got '%s'", g_where, arg);
            return -1;
        }
        return 0;
    case O_INTERVAL: {
        char *end;
        double v = strtod(arg, &end);
        if (end == arg || *end || !(v >= 0.05 && v <= 86400)) {
            inspect_error("%s--interval: expected seconds in [0.05, 86400], got '%s'", g_where, arg);
            return -1;
        }
        o->interval_s = v;
        return 0;
    }
    default: return -1;
    }
}

/* One getopt_long pass; the caller sets optind.  `stop_at_operand`: stop at
 * the first operand (the command).  *seen gets the command options used. */
static int parse(int argc, char **argv, bool stop_at_operand, inspect_opts *o, unsigned *seen,
                 bool *help, bool *version)
{
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, stop_at_operand ? "+" : "", g_opts, NULL)) != -1) {
        if (c == O_HELP) {
            *help = true;
        } else if (c == O_VERSION) {
            *version = true;
        } else if (c == '?' || c == ':') {
            const char *bad = argv[optind - 1];
            if (c == ':' || (optopt && optopt >= O_MASTER))
                inspect_error("%s%s needs a value (try --help)", g_where, bad);
            else
                inspect_error("%sunknown option '%s' (try --help)", g_where, bad);
            return -1;
        } else {
            if (c >= O_PREFIX)
                *seen |= F(c);
            if (apply(c, optarg, o))
                return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    inspect_opts o = {.master = "127.0.0.1:50051", .interval_s = 2.0};
    unsigned seen = 0;
    bool help = false, version = false;
    moonlet_log_set_level(MOONLET_LOG_ERROR); /* a CLI: library warnings would clutter it */

    optind = 1;
    if (parse(argc, argv, true, &o, &seen, &help, &version))
        return INSPECT_EXIT_USAGE;
    if (version) {
        printf("moonlet-inspect %s\n", MOONLET_VERSION);
        return INSPECT_EXIT_OK;
    }
    if (optind >= argc) {
        usage(help ? stdout : stderr);
        return help ? INSPECT_EXIT_OK : INSPECT_EXIT_USAGE;
    }
    const struct command *cmd = NULL;
    for (size_t i = 0; i < NCMDS; i++)
        if (!strcmp(argv[optind], g_cmds[i].name))
            cmd = &g_cmds[i];
    if (!cmd) {
        inspect_error("unknown command '%s' (try --help)", argv[optind]);
        return INSPECT_EXIT_USAGE;
    }
    if (help) {
        command_usage(stdout, cmd);
        return INSPECT_EXIT_OK;
    }
    if (seen) {
        inspect_error("command options go after the command ('moonlet-inspect %s')",
                      cmd->synopsis);
        return INSPECT_EXIT_USAGE;
    }

    /* The command's own arguments: options and operands, in any order ("--" ends options). */
    static char where[32];
    snprintf(where, sizeof(where), "%s: ", cmd->name);
    g_where = where;
    int cargc = argc - optind;
    char **cargv = argv + optind;
    optind = 0; /* 0: glibc re-initialises getopt for the new argument vector */
    if (parse(cargc, cargv, false, &o, &seen, &help, &version))
        return INSPECT_EXIT_USAGE;
    if (help) {
        command_usage(stdout, cmd);
        return INSPECT_EXIT_OK;
    }
    for (int b = 0; (unsigned)(O_PREFIX + b) <= O_COUNT; b++) {
        if ((seen & (1u << b)) && !(cmd->accepts & (1u << b))) {
            inspect_error("%s: --%s does not apply to this command (try 'moonlet-inspect %s "
                          "--help')", cmd->name, g_opts[O_PREFIX - O_MASTER + b].name, cmd->name);
            return INSPECT_EXIT_USAGE;
        }
    }
    int nargs = cargc - optind;
    if (nargs < cmd->min_args || (cmd->max_args >= 0 && nargs > cmd->max_args)) {
        inspect_error("usage: moonlet-inspect %s", cmd->synopsis);
        return INSPECT_EXIT_USAGE;
    }
    return cmd->run(&o, nargs, cargv + optind);
}
