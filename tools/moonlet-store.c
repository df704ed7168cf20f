/*
 * moonlet-store - the store node daemon.
 *
 * Parses flags into a moonlet_store_node_config, creates the node (segment
 * allocated, served, registered and mounted - store/node/store_node.c does all of
 * it), prints "listening on HOST:PORT" (the address it serves on) once
 * mounted, and with --advertise a second line "advertising HOST:PORT" (the
 * endpoint the master hands to peers), with --protocol both a line "tcp
 * listening on HOST:PORT" (the node's second, TCP, endpoint), and heartbeats until SIGTERM or
 * SIGINT, after which the node unmounts and the process exits 0.  Exit code 2: bad flags; 1: the node could not start.
 * Before serving it raises its file-descriptor limit to what
 * --max-connections needs (soft up to the hard limit; the cap is lowered
 * when the hard limit is below that).
 * Signals are taken by one thread with sigwait(); no other thread sees them.
 * Takes no locks of its own (the node's are described in store_node.c, the
 * RealClient's in real_client.c).
 *
 * With --serve-dummy PATH the process is a RealClient
 * (include/moonlet/real_client.h): the node's segment becomes the local
 * segment of a client that also serves DummyClients on the unix socket PATH
 * (mode 0600, or 0660 with --socket-group).  It prints "listening on
 * HOST:PORT" and then "serving dummy clients on PATH"; on SIGTERM it stops
 * serving, removes the socket, unmounts and exits 0.
 *
 * TLS to the master: --tls-ca (the master's certificate must be signed by
 * it) and, for a master that requires client certificates, --tls-cert and
 * --tls-key.  SIGHUP reads them again: the next connection to the master
 * uses the new certificate.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "disk_tier.h"
#include "bytesize.h"
#include "fdlimit.h"
#include "log.h"
#include "moonlet/error.h"
#include "moonlet_config.h"
#include "net.h"
#include "real_client_internal.h"
#include "rpc_server.h"
#include "segment_mem.h"
#include "store_node.h"
#include "cred.h"
#include "tls.h"
#include "token.h"
#include "verbs_check.h"

#define PROG "moonlet-store"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --master HOST:PORT [options]\n"
            "\n"
            "  --master HOST:PORT[,...]  the master's RPC address (required); with HA, every\n"
            "                            master's: the node follows the leader\n"
            "  --segment-size SIZE       memory contributed, e.g. 1GiB, 64MiB, 1048576 (default 1GiB)\n"
            "  --disk PATH[,PATH...]     a disk tier behind the segment: files (created and\n"
            "                            preallocated; not on tmpfs: O_DIRECT) or block devices;\n"
            "                            evicted objects are demoted there, and a restart with\n"
            "                            the same paths brings them back\n"
            "  --disk-size SIZE          with --disk: the tier's bytes, shared by the paths\n"
            "  --disk-queue-depth N      with --disk: I/Os in flight (default 32)\n"
            "  --protocol P              auto|tcp|rdma|both (default auto: rdma when a device is\n"
            "                            active; both: rdma on --listen and tcp on --tcp-listen,\n"
            "                            one segment with two endpoints, for mixed clusters)\n"
            "  --tcp-listen HOST:PORT    with --protocol both: the TCP endpoint (default: the\n"
            "                            --listen host, any port)\n"
            "  --listen HOST:PORT        data endpoint to serve on (default 127.0.0.1:0; 0 = any port;\n"
            "                            for rdma an address on the RDMA device)\n"
            "  --device NAME             RDMA device, e.g. mlx5_0 (default: first active)\n"
            "  --rdma-tos N              IP TOS of RDMA connections (RoCE v2 traffic class, e.g.\n"
            "                            106 for DSCP 26 + ECN; default: the kernel's)\n"
            "  --rdma-keepalive-ms N     rdma: probe every served connection this often; one whose\n"
            "                            client vanished is torn down within about 2 x N\n"
            "                            (default 5000; 100..3600000, it cannot be turned off)\n"
            "  --numa-node N|auto        NUMA node of the segment (default auto: the device's node)\n"
            "  --advertise HOST:PORT     endpoint mounted on the master instead of the listen address\n"
            "                            (tcp only; for a proxy or relay in front of this node)\n"
            "  --client-id ID            this node's id on the master (default store-<host>-<random>)\n"
            "  --client-id-wait-ms N     when a live node holds the id, wait this long for it to\n"
            "                            expire before refusing to start (default 15000)\n"
            "  --auth-token-file PATH    shared token for the master and the data endpoint\n"
            "                            (with roles: this node's own, a node credential)\n"
            "  --credentials PATH        the master's credentials file: its client and node\n"
            "                            credentials may also open the data endpoint\n"
            "                            (challenge-response; needs --auth-token-file)\n"
            "  --ping-interval-ms N      heartbeat period (default 1000)\n"
            "  --rpc-timeout-ms N        deadline of each master call (default 400)\n"
            "  --transfer-timeout-ms N   deadline of each served request, header to reply, plus\n"
            "                            1 ms per 16 KiB of payload (default 10000); with a\n"
            "                            token, also the time a connection has to authenticate\n"
            "  --max-connections N       data connections served (default 4096)\n"
            "  --max-connections-per-peer N  data connections from one address (an IPv6 /64)\n"
            "                            (default 256)\n"
            "  --idle-timeout-ms N       close data connections idle this long (default 300000;\n"
            "                            0 = never)\n"
            "  --serve-dummy PATH        also serve DummyClients of this host on the unix socket\n"
            "                            PATH (a RealClient; the socket gets mode 0600)\n"
            "  --socket-group NAME       with --serve-dummy: give the socket group NAME, mode 0660\n"
            "  --busy-poll-us N          with --serve-dummy: after a request, poll for the next one\n"
            "                            this long before sleeping (default 200; 0 = off)\n"
            "  --client-http-port N      with --serve-dummy: serve the RealClient's /metrics\n"
            "                            (Prometheus: every dummy client's puts, gets, hits, ...)\n"
            "                            and /health on every IPv4 address, port N (0: a free one)\n"
            "  --tls-ca FILE             TLS to the master: its certificate must be signed by\n"
            "                            this CA (PEM); SIGHUP reloads the TLS files\n"
            "  --tls-cert FILE --tls-key FILE  this node's certificate and key, for a master\n"
            "                            that requires client certificates (mutual TLS)\n"
            "  --log-level LEVEL         error|warn|info|debug (default info)\n"
            "  --check                   self-test of the RDMA NIC that --listen's host is on\n"
            "                            (device, port, GIDs, MTU, limits, one RDMA WRITE and READ\n"
            "                            through moonlet); exits 0 (PASS) or 1; needs no --master\n"
            "  --help, --version\n");
}

static int bad_flag(const char *flag, const char *why, const char *value)
{
    fprintf(stderr, PROG ": %s: %s: '%s'\n", flag, why, value);
    return 1;
}

/* HOST:PORT or [V6]:PORT with a non-empty host and a decimal port (>= min_port). */
static int check_hostport(const char *flag, const char *s, unsigned min_port)
{
    char host[MOONLET_MAX_ENDPOINT_BYTES + 1];
    uint16_t port;
    if (moonlet_net_split_hostport(s, host, sizeof(host), &port))
        return bad_flag(flag, "expected HOST:PORT with a port of at most 65535", s);
    if (port < min_port)
        return bad_flag(flag, "port out of range", s);
    return 0;
}

/* --master HOST:PORT[,HOST:PORT...]: masters of one HA pair (or more). */
static int check_master_list(const char *s)
{
    char buf[4096];
    if (!*s || strlen(s) >= sizeof(buf))
        return bad_flag("--master", "expected HOST:PORT[,HOST:PORT...]", s);
    snprintf(buf, sizeof(buf), "%s", s);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (check_hostport("--master", t, 1))
            return 1;
    return 0;
}

static int parse_uint(const char *flag, const char *s, unsigned long min, unsigned long max,
                      unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || s[0] == '+' || s[0] == ' ' || v < min ||
        v > max) {
        fprintf(stderr, PROG ": %s: expected an integer in [%lu, %lu]: '%s'\n", flag, min, max, s);
        return 1;
    }
    *out = v;
    return 0;
}

static int parse_size(const char *s, uint64_t *out)
{
    if (moonlet_bytesize_parse(s, out))
        return bad_flag("--segment-size", "expected a size such as 1GiB, 64MiB or bytes", s);
    if (*out < MOONLET_STORE_NODE_MIN_SEGMENT)
        return bad_flag("--segment-size", "must be at least 1MiB", s);
    return 0;
}

/* --disk PATH[,PATH...]: the paths stay in argv's copy. */
static int parse_disk_paths(const char *s, moonlet_store_node_config *cfg)
{
    static char buf[8192];
    static const char *paths[MOONLET_DISK_MAX_PATHS];
    if (!*s || strlen(s) >= sizeof(buf))
        return bad_flag("--disk", "expected PATH[,PATH...]", s);
    snprintf(buf, sizeof(buf), "%s", s);
    uint32_t n = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == MOONLET_DISK_MAX_PATHS)
            return bad_flag("--disk", "at most 16 paths", s);
        paths[n++] = t;
    }
    if (!n)
        return bad_flag("--disk", "expected PATH[,PATH...]", s);
    cfg->disk_paths = paths;
    cfg->ndisk_paths = n;
    return 0;
}

static int parse_numa(const char *s, int *out)
{
    unsigned long v;
    if (strcmp(s, "auto") == 0) {
        *out = MOONLET_SEGMENT_MEM_NODE_AUTO;
        return 0;
    }
    if (parse_uint("--numa-node", s, 0, 1023, &v))
        return 1;
    *out = (int)v;
    return 0;
}

static int parse_log_level(const char *s)
{
    int lvl = moonlet_log_parse_level(s);
    if (lvl < 0)
        return bad_flag("--log-level", "unknown level", s);
    moonlet_log_set_level(lvl);
    return 0;
}

enum {
    O_MASTER = 1000, O_SIZE, O_PROTO, O_LISTEN, O_DEVICE, O_NUMA, O_CLIENT, O_TOKEN, O_PING,
    O_LOG, O_SERVE_DUMMY, O_SOCKET_GROUP, O_BUSY_POLL, O_HELP, O_VERSION, O_ADVERTISE, O_RPC_TIMEOUT,
    O_XFER_TIMEOUT, O_ID_WAIT, O_MAXCONN, O_MAXCONN_PEER, O_IDLE_TO, O_TOS, O_TCP_LISTEN, O_CHECK,
    O_KEEPALIVE, O_CLIENT_HTTP, O_CREDS, O_TLS_CA, O_TLS_CERT, O_TLS_KEY, O_DISK, O_DISK_SIZE,
    O_DISK_QD
};

/* --tls-*: the master connection's TLS context (NULL: plaintext); reloaded on SIGHUP. */
static moonlet_tls_files g_tls_files;
static moonlet_tls_ctx *g_tls;

#define DEFAULT_IDLE_TIMEOUT_MS 300000u
/* --rdma-keepalive-ms: below 100 ms the probes outrun the verbs backend's
 * 50 ms keepalive tick; an hour is the longest a vanished client's QP may stay. */
#define MIN_KEEPALIVE_MS 100
#define MAX_KEEPALIVE_MS 3600000
#define STR_(x) #x
#define STR(x) STR_(x)
#define FD_RESERVE 256u /* descriptors beyond the data connections: master, segments, DummyClients */

static const struct option g_opts[] = {
    {"master", required_argument, 0, O_MASTER},
    {"segment-size", required_argument, 0, O_SIZE},
    {"disk", required_argument, 0, O_DISK},
    {"disk-size", required_argument, 0, O_DISK_SIZE},
    {"disk-queue-depth", required_argument, 0, O_DISK_QD},
    {"protocol", required_argument, 0, O_PROTO},
    {"listen", required_argument, 0, O_LISTEN},
    {"tcp-listen", required_argument, 0, O_TCP_LISTEN},
    {"device", required_argument, 0, O_DEVICE},
    {"rdma-tos", required_argument, 0, O_TOS},
    {"rdma-keepalive-ms", required_argument, 0, O_KEEPALIVE},
    {"numa-node", required_argument, 0, O_NUMA},
    {"client-id", required_argument, 0, O_CLIENT},
    {"auth-token-file", required_argument, 0, O_TOKEN},
    {"credentials", required_argument, 0, O_CREDS},
    {"ping-interval-ms", required_argument, 0, O_PING},
    {"advertise", required_argument, 0, O_ADVERTISE},
    {"rpc-timeout-ms", required_argument, 0, O_RPC_TIMEOUT},
    {"transfer-timeout-ms", required_argument, 0, O_XFER_TIMEOUT},
    {"client-id-wait-ms", required_argument, 0, O_ID_WAIT},
    {"max-connections", required_argument, 0, O_MAXCONN},
    {"max-connections-per-peer", required_argument, 0, O_MAXCONN_PEER},
    {"idle-timeout-ms", required_argument, 0, O_IDLE_TO},
    {"log-level", required_argument, 0, O_LOG},
    {"client-http-port", required_argument, 0, O_CLIENT_HTTP},
    {"serve-dummy", required_argument, 0, O_SERVE_DUMMY},
    {"socket-group", required_argument, 0, O_SOCKET_GROUP},
    {"busy-poll-us", required_argument, 0, O_BUSY_POLL},
    {"check", no_argument, 0, O_CHECK},
    {"tls-ca", required_argument, 0, O_TLS_CA},
    {"tls-cert", required_argument, 0, O_TLS_CERT},
    {"tls-key", required_argument, 0, O_TLS_KEY},
    {"help", no_argument, 0, O_HELP},
    {"version", no_argument, 0, O_VERSION},
    {0, 0, 0, 0},
};

/* The node's plain numeric flags: bounds, and the config field (a uint32_t
 * or unsigned, the same type here) the value goes to. */
static const struct uint_flag {
    int opt;
    const char *flag;
    unsigned long min, max;
    size_t off;
} g_uint_flags[] = {
#define CFG_FIELD(f) offsetof(moonlet_store_node_config, f)
    {O_PING, "--ping-interval-ms", 1, 600000, CFG_FIELD(ping_interval_ms)},
    {O_DISK_QD, "--disk-queue-depth", 1, 1024, CFG_FIELD(disk_queue_depth)},
    {O_ID_WAIT, "--client-id-wait-ms", 0, 3600000, CFG_FIELD(client_id_wait_ms)},
    {O_RPC_TIMEOUT, "--rpc-timeout-ms", 1, 600000, CFG_FIELD(rpc_timeout_ms)},
    {O_XFER_TIMEOUT, "--transfer-timeout-ms", 1, 600000, CFG_FIELD(transfer_timeout_ms)},
    {O_MAXCONN, "--max-connections", 1, 1u << 20, CFG_FIELD(max_connections)},
    {O_MAXCONN_PEER, "--max-connections-per-peer", 1, 1u << 20,
     CFG_FIELD(max_connections_per_peer)},
    {O_IDLE_TO, "--idle-timeout-ms", 0, 86400000, CFG_FIELD(idle_timeout_ms)},
#undef CFG_FIELD
};
_Static_assert(sizeof(unsigned) == sizeof(uint32_t), "unsigned config fields set as uint32_t");

/* Parses optarg into the field of numeric flag c; -1 when c is no such flag. */
static int parse_uint_flag(int c, moonlet_store_node_config *cfg)
{
    for (size_t i = 0; i < sizeof(g_uint_flags) / sizeof(g_uint_flags[0]); i++) {
        const struct uint_flag *f = &g_uint_flags[i];
        if (f->opt != c)
            continue;
        unsigned long v;
        if (parse_uint(f->flag, optarg, f->min, f->max, &v))
            return 1;
        *(uint32_t *)((char *)cfg + f->off) = (uint32_t)v;
        return 0;
    }
    return -1;
}

/* The RealClient flags. */
typedef struct serve_flags {
    const char *path;  /* --serve-dummy; NULL: a plain store node */
    const char *creds_file; /* --credentials: more data-plane keys */
    const char *group; /* --socket-group */
    uint32_t busy_poll_us;
    bool busy_poll_set;
    bool check;        /* --check: the RDMA self-test, then exit */
    bool http;         /* --client-http-port given */
    uint16_t http_port;
} serve_flags;

/* Returns 0 to run, 2 on bad flags, -1 after --help / --version (exit 0). */
static int parse_flags(int argc, char **argv, moonlet_store_node_config *cfg,
                       const char **token_file, serve_flags *sv)
{
    unsigned long v;
    int c, bad = 0;
    bool both = false;
    opterr = 0;
    while (!bad && (c = getopt_long(argc, argv, "", g_opts, NULL)) != -1) {
        switch (c) {
        case O_MASTER: cfg->master_addr = optarg; bad = check_master_list(optarg); break;
        case O_SIZE: bad = parse_size(optarg, &cfg->segment_size); break;
        case O_PROTO:
            both = strcmp(optarg, "both") == 0;
            if (both)
                cfg->protocol = MOONLET_XFER_RDMA;
            else
                bad = moonlet_xfer_parse_protocol(optarg, &cfg->protocol) != MOONLET_OK &&
                      bad_flag("--protocol", "expected auto, tcp, rdma or both", optarg);
            break;
        case O_TCP_LISTEN:
            cfg->tcp_listen_addr = optarg;
            bad = check_hostport("--tcp-listen", optarg, 0);
            break;
        case O_LISTEN: cfg->listen_addr = optarg; bad = check_hostport("--listen", optarg, 0); break;
        case O_DEVICE: cfg->device = optarg; break;
        case O_TOS:
            bad = parse_uint("--rdma-tos", optarg, 0, 255, &v);
            cfg->rdma_tos = (int)v;
            break;
        case O_KEEPALIVE:
            /* The transport reads 0 as its default: refuse it rather than
             * let "0" look like "off" (the keepalive cannot be disabled). */
            bad = strcmp(optarg, "0") == 0
                      ? bad_flag("--rdma-keepalive-ms",
                                 "the keepalive cannot be turned off; expected an integer in "
                                 "[" STR(MIN_KEEPALIVE_MS) ", " STR(MAX_KEEPALIVE_MS) "]",
                                 optarg)
                      : parse_uint("--rdma-keepalive-ms", optarg, MIN_KEEPALIVE_MS,
                                   MAX_KEEPALIVE_MS, &v);
            cfg->rdma_keepalive_ms = (uint32_t)v;
            break;
        case O_NUMA: bad = parse_numa(optarg, &cfg->numa_node); break;
        case O_CLIENT:
            cfg->client_id = optarg;
            bad = (!*optarg || strlen(optarg) > MOONLET_MAX_ID_BYTES) &&
                  bad_flag("--client-id", "must be 1..255 bytes", optarg);
            break;
        case O_TOKEN: *token_file = optarg; break;
        case O_CREDS: sv->creds_file = optarg; break;
        case O_ADVERTISE:
            cfg->advertise_addr = optarg;
            bad = check_hostport("--advertise", optarg, 1);
            break;
        case O_LOG: bad = parse_log_level(optarg); break;
        case O_SERVE_DUMMY:
            sv->path = optarg;
            bad = !*optarg && bad_flag("--serve-dummy", "expected a socket path", optarg);
            break;
        case O_BUSY_POLL:
            bad = parse_uint("--busy-poll-us", optarg, 0, MOONLET_RPC_MAX_BUSY_POLL_US, &v);
            sv->busy_poll_us = (uint32_t)v;
            sv->busy_poll_set = true;
            break;
        case O_CLIENT_HTTP:
            bad = parse_uint("--client-http-port", optarg, 0, 65535, &v);
            sv->http_port = (uint16_t)v;
            sv->http = true;
            break;
        case O_SOCKET_GROUP:
            sv->group = optarg;
            bad = !*optarg && bad_flag("--socket-group", "expected a group name", optarg);
            break;
        case O_HELP: usage(stdout); return -1;
        case O_VERSION: printf(PROG " %s\n", MOONLET_VERSION); return -1;
        case O_CHECK: sv->check = true; break;
        case O_DISK: bad = parse_disk_paths(optarg, cfg); break;
        case O_DISK_SIZE:
            bad = moonlet_bytesize_parse(optarg, &cfg->disk_size) || cfg->disk_size < (1u << 20)
                      ? bad_flag("--disk-size", "expected a size of at least 1MiB", optarg)
                      : 0;
            break;
        case O_TLS_CA: g_tls_files.ca = optarg; break;
        case O_TLS_CERT: g_tls_files.cert = optarg; break;
        case O_TLS_KEY: g_tls_files.key = optarg; break;
        default:
            if ((bad = parse_uint_flag(c, cfg)) >= 0)
                break;
            fprintf(stderr, PROG ": unknown or incomplete option '%s'\n", argv[optind - 1]);
            bad = 1;
            break;
        }
    }
    if (!bad && optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s'\n", argv[optind]);
        bad = 1;
    }
    if (!bad && !cfg->master_addr && !sv->check) {
        fprintf(stderr, PROG ": --master HOST:PORT is required\n");
        bad = 1;
    }
    if (!bad && (cfg->ndisk_paths > 0) != (cfg->disk_size > 0)) {
        fprintf(stderr, PROG ": --disk and --disk-size go together\n");
        bad = 1;
    }
    if (!bad && cfg->disk_queue_depth && !cfg->ndisk_paths) {
        fprintf(stderr, PROG ": --disk-queue-depth needs --disk\n");
        bad = 1;
    }
    if (!bad && cfg->tcp_listen_addr && !both) {
        fprintf(stderr, PROG ": --tcp-listen needs --protocol both\n");
        bad = 1;
    }
    if (!bad && both && (sv->path || cfg->advertise_addr)) {
        fprintf(stderr, PROG ": --protocol both does not go with %s\n",
                sv->path ? "--serve-dummy" : "--advertise");
        bad = 1;
    }
    if (!bad && both && !cfg->tcp_listen_addr) { /* the --listen host, any port */
        static char tcp_listen[MOONLET_MAX_ENDPOINT_BYTES + 1];
        const char *l = cfg->listen_addr ? cfg->listen_addr : "127.0.0.1:0";
        const char *colon = strrchr(l, ':');
        snprintf(tcp_listen, sizeof(tcp_listen), "%.*s:0", (int)(colon ? colon - l : 0), l);
        cfg->tcp_listen_addr = tcp_listen;
    }
    if (!bad && (g_tls_files.cert || g_tls_files.key) &&
        (!g_tls_files.ca || !g_tls_files.cert || !g_tls_files.key)) {
        fprintf(stderr, PROG ": --tls-cert and --tls-key go together, and need --tls-ca\n");
        bad = 1;
    }
    if (!bad && (sv->group || sv->busy_poll_set || sv->http) && !sv->path) {
        fprintf(stderr, PROG ": %s needs --serve-dummy\n",
                sv->group ? "--socket-group" : sv->http ? "--client-http-port" : "--busy-poll-us");
        bad = 1;
    }
    if (bad) {
        usage(stderr);
        return 2;
    }
    return 0;
}

/* Waits for a signal of `set` other than SIGHUP, which reloads the TLS
 * files meanwhile. */
static int wait_stop_signal(const sigset_t *set)
{
    for (;;) {
        int sig = 0;
        sigwait(set, &sig);
        if (sig != SIGHUP)
            return sig;
        if (!g_tls)
            ML_INFO("store", "SIGHUP: no TLS certificates to reload");
        else if (moonlet_tls_ctx_reload(g_tls) == MOONLET_OK)
            ML_INFO("store", "SIGHUP: TLS certificates reloaded: new connections use them");
        else
            ML_ERR("store", "SIGHUP: TLS certificates NOT reloaded (see above): the old ones stay");
    }
}

static void *signal_thread(void *arg)
{
    moonlet_store_node *n = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    int sig = wait_stop_signal(&set);
    ML_INFO("store", "signal %d: unmounting and shutting down", sig);
    moonlet_store_node_stop(n);
    return NULL;
}

/* --serve-dummy: the node as the local segment of a RealClient; serves
 * until SIGTERM / SIGINT (blocked in every thread; taken here). */
static int serve_dummies(const moonlet_store_node_config *node, const serve_flags *sv,
                         const sigset_t *sigs)
{
    moonlet_client_config cc;
    moonlet_client_config_init(&cc, sizeof cc);
    cc.master_addr = node->master_addr;
    cc.protocol = node->protocol == MOONLET_XFER_TCP    ? MOONLET_PROTOCOL_TCP
                  : node->protocol == MOONLET_XFER_RDMA ? MOONLET_PROTOCOL_RDMA
                                                        : MOONLET_PROTOCOL_AUTO;
    cc.device = node->device;
    cc.auth_token = node->auth_token;
    cc.http_server = sv->http;
    cc.http_port = sv->http_port;
    moonlet_real_client *rc;
    int r = moonlet_real_client_create_with_node(&cc, node, sv->path, sv->group, sv->busy_poll_us,
                                                 &rc);
    if (r) {
        fprintf(stderr, PROG ": cannot serve dummy clients on %s: %s\n", sv->path,
                moonlet_strerror(r));
        return 1;
    }
    char ep[MOONLET_MAX_ENDPOINT_BYTES + 1];
    moonlet_client_local_endpoint(moonlet_real_client_client(rc), ep, sizeof(ep));
    printf("listening on %s\nserving dummy clients on %s\n", ep, sv->path);
    if (sv->http)
        printf("client metrics on 0.0.0.0:%d\n", moonlet_client_http_port(moonlet_real_client_client(rc)));
    fflush(stdout);
    int sig = wait_stop_signal(sigs);
    ML_INFO("store", "signal %d: closing the dummy socket, unmounting and shutting down", sig);
    moonlet_real_client_destroy(rc);
    return 0;
}

/* --check: the self-test of the NIC the --listen host is on
 * (transport/verbs_check.c). */
static int run_check(const moonlet_store_node_config *cfg)
{
    if (!cfg->listen_addr) {
        fprintf(stderr, PROG ": --check needs --listen HOST:PORT (the address to serve RDMA on)\n");
        return 2;
    }
    char host[MOONLET_MAX_ENDPOINT_BYTES + 1];
    const char *l = cfg->listen_addr, *colon = strrchr(l, ':');
    int len = (int)(colon - l);
    if (l[0] == '[' && len >= 2 && l[len - 1] == ']') /* [v6]:port */
        snprintf(host, sizeof(host), "%.*s", len - 2, l + 1);
    else
        snprintf(host, sizeof(host), "%.*s", len, l);
    return moonlet_verbs_check(host, cfg->device, stdout);
}

int main(int argc, char **argv)
{
    moonlet_store_node_config cfg;
    moonlet_store_node_config_default(&cfg);
    cfg.segment_size = UINT64_C(1) << 30;
    cfg.idle_timeout_ms = DEFAULT_IDLE_TIMEOUT_MS;
    const char *token_file = NULL;
    serve_flags sv = {.busy_poll_us = MOONLET_REAL_CLIENT_BUSY_POLL_US};
    int rc = parse_flags(argc, argv, &cfg, &token_file, &sv);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (sv.check)
        return run_check(&cfg);
    unsigned conns = cfg.max_connections ? cfg.max_connections
                                         : MOONLET_XFER_DEFAULT_SERVER_MAX_CONNS;
    uint64_t nofile = moonlet_fdlimit_raise((uint64_t)conns + FD_RESERVE);
    if (nofile < (uint64_t)conns + FD_RESERVE) {
        uint64_t fit = nofile > 2 * FD_RESERVE ? nofile - FD_RESERVE : nofile / 2;
        cfg.max_connections = fit ? (unsigned)fit : 1;
        ML_WARN("store", "--max-connections lowered from %u to %u to fit the descriptor limit",
                conns, cfg.max_connections);
    }
    char *token = NULL;
    if (token_file && moonlet_token_read(token_file, &token) != MOONLET_OK)
        return 2;
    cfg.auth_token = token;
    uint8_t (*keys)[32] = NULL;
    if (sv.creds_file) {
        moonlet_cred_set *creds = NULL;
        if (!token) {
            fprintf(stderr, "moonlet-store: --credentials needs --auth-token-file (this node's "
                            "own credential)\n");
            return 2;
        }
        if (moonlet_cred_load(sv.creds_file, &creds) != MOONLET_OK)
            return 2;
        keys = calloc(creds->n ? creds->n : 1, sizeof(*keys));
        if (!keys) {
            moonlet_cred_set_free(creds);
            return 1;
        }
        for (size_t i = 0; i < creds->n; i++) /* who reads and writes segment bytes */
            if (creds->v[i].roles & (MOONLET_ROLE_CLIENT | MOONLET_ROLE_NODE))
                memcpy(keys[cfg.ndata_keys++], creds->v[i].hash, 32);
        moonlet_cred_set_free(creds);
        cfg.data_keys = (const uint8_t(*)[32])keys;
    }
    if (g_tls_files.ca && moonlet_tls_ctx_create(false, &g_tls_files, &g_tls) != MOONLET_OK) {
        moonlet_token_free(token);
        return 2;
    }
    cfg.tls = g_tls;

    /* Blocked before any thread exists, so every thread inherits the mask. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (sv.path) {
        rc = serve_dummies(&cfg, &sv, &set);
        moonlet_token_free(token);
        return rc;
    }

    moonlet_store_node *node;
    rc = moonlet_store_node_create(&cfg, &node);
    if (rc) {
        moonlet_token_free(token);
        return 1;
    }
    printf("listening on %s\n", moonlet_store_node_listen_endpoint(node));
    if (cfg.advertise_addr)
        printf("advertising %s\n", moonlet_store_node_endpoint(node));
    if (cfg.tcp_listen_addr)
        printf("tcp listening on %s\n", moonlet_store_node_tcp_endpoint(node));
    fflush(stdout);
    pthread_t sig_th;
    if (pthread_create(&sig_th, NULL, signal_thread, node) != 0) {
        ML_ERR("store", "cannot start the signal thread");
        moonlet_store_node_destroy(node);
        moonlet_token_free(token);
        return 1;
    }
    rc = moonlet_store_node_run(node);
    if (rc) /* it stopped by itself (its RDMA device is gone): no signal will come */
        pthread_cancel(sig_th);
    pthread_join(sig_th, NULL);
    moonlet_store_node_destroy(node);
    moonlet_tls_ctx_unref(g_tls);
    moonlet_token_free(token);
    free(keys);
    return rc ? 1 : 0;
}
