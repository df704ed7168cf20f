/*
 * moonlet-master - the metadata service daemon.
 *
 * Parses flags into a moonlet_master_config and moonlet_service_opts, starts
 * the master and its RPC service, prints "listening on HOST:PORT" (then
 * "metrics on HOST:PORT" with --metrics-port), and waits for SIGTERM or
 * SIGINT, after which it stops serving and exits 0.  Before serving it
 * raises its file-descriptor limit to what --max-connections needs (soft up
 * to the hard limit) and lowers the cap when the hard limit is below that.
 *
 * It also takes the spellings of Mooncake's mooncake_master (--rpc_port,
 * --port, --rpc_address, --rpc_thread_num, --metrics_port, --client_ttl,
 * -v, durations with units) mapped to its own meaning, and accepts the
 * mooncake_master flags that mean nothing here with a warning naming each.
 * Without --rpc-address it listens on 127.0.0.1 unless a token is set
 * (then 0.0.0.0): an unauthenticated master must not be reachable from
 * the network (docs/cli.md).
 *
 * HA: with --etcd-endpoints it campaigns for leadership on etcd and serves
 * only while it is the leader (master/ha/role.h); a standby answers
 * NOT_LEADER.  The election, the hot standby and the promotion are
 * master/ha/ha.h's; this file creates the role and hands it the flags.  A
 * leader that is deposed drops its master before it may campaign again:
 * the election thread raises SIGUSR1 and this main thread hands a copy of
 * the metadata to master/ha/ha.c (moonlet_ha_keep: restored if it wins again
 * and nobody else has led since), restarts the service on a new, empty
 * master (same port), then lets the election resume (moonlet_ha_reset,
 * moonlet_ha_resume).
 *
 * TLS: with --tls-cert and --tls-key the RPC server, the replication server
 * and /metrics speak TLS (transport/tls.h); --tls-ca makes the RPC servers
 * require client certificates signed by it and is the CA a standby checks
 * the leader against.  --etcd-ca/--etcd-cert/--etcd-key: etcd over TLS.
 * SIGHUP reads the certificate files again: new connections use them
 * (/metrics restarts on the same port to take them).
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fdlimit.h"
#include "ha.h"
#include "log.h"
#include "bytesize.h"
#include "master.h"
#include "role.h"
#include "metrics.h"
#include "moonlet/error.h"
#include "moonlet_config.h"
#include "service.h"
#include "cred.h"
#include "etcd.h"
#include "tls.h"
#include "token.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: moonlet-master [options]\n"
            "\n"
            "  --rpc-address ADDR                 address to listen on (default 127.0.0.1)\n"
            "  --rpc-port PORT                    port (default 50051; 0 picks a free one)\n"
            "  --rpc-threads N                    RPC threads (default: number of cores)\n"
            "  --shards N                         metadata shards (default 1024)\n"
            "  --default_kv_lease_ttl MS          read lease TTL in ms (default 5000)\n"
            "  --default_kv_soft_pin_ttl MS       soft pin TTL in ms (default 1800000)\n"
            "  --eviction_high_watermark_ratio R  start evicting at this usage (default 0.90)\n"
            "  --eviction_ratio R                 evict this fraction per pass (default 0.05)\n"
            "  --hard_pin_max_ratio R             hard-pinned bytes at most this share of the\n"
            "                                     capacity (default 0.5; 0: no hard pins)\n"
            "  --client_live_ttl_sec S            liveness TTL of clients (default 10)\n"
            "  --put_timeout_ms MS                revoke puts not ended within (default 60000)\n"
            "  --put_quarantine_grace_ms MS       reuse a range freed from an unfinished put only\n"
            "                                     this long after its put deadline (default 2000)\n"
            "  --repair-bandwidth BYTES           bytes per second re-replication may copy\n"
            "                                     (default 256MiB; units: KiB MiB GiB ...)\n"
            "  --repair-concurrency N             re-replication copies in flight at once\n"
            "                                     (default 16)\n"
            "  --demote-queue N                   demotions to the disk tier queued or copying at\n"
            "                                     most; eviction past it destroys (default 4096)\n"
            "  --demote-ahead-ratio R             coldest fraction of DRAM objects copied to disk\n"
            "                                     ahead of eviction (default 0.5; 0 none)\n"
            "  --max-frame-bytes N                largest RPC frame (default 67108864; before\n"
            "                                     authentication 8192)\n"
            "  --max-batch-keys N                 keys per BatchExistKey/BatchProbeKey/ProbeResume\n"
            "                                     (default 65536)\n"
            "  --disable-method NAME[,NAME...]    answer NAME (e.g. ProbeResume) as an unknown method,\n"
            "                                     as an older master would (compatibility tests)\n"
            "  --max-connections N                open RPC connections (default 8192)\n"
            "  --auth-timeout-ms MS               with a token: AUTH due within (default 5000)\n"
            "  --frame-timeout-ms MS              a frame begun must arrive, and replies be\n"
            "                                     taken, within (default 30000)\n"
            "  --idle-timeout-ms MS               close connections idle this long (default\n"
            "                                     300000; 0 never)\n"
            "  --auth-token-file PATH             require this shared token from every client\n"
            "  --peer-token-file PATH             with HA: the masters' own token; only it opens\n"
            "                                     the replication stream and snapshot (default:\n"
            "                                     the --auth-token-file token); must differ from it\n"
            "  --credentials PATH                 roles instead of one token: a line per credential,\n"
            "                                     TOKEN-or-sha256:HEX ROLES [TENANTS] (roles client,\n"
            "                                     node, peer, operator, reader); with HA the\n"
            "                                     --peer-token-file token is a peer credential\n"
            "                                     (required then); not with --auth-token-file\n"
            "  --metrics-port PORT                serve Prometheus /metrics on --rpc-address:PORT\n"
            "                                     (default: off; 0 picks a free port)\n"
            "  --log-level LEVEL                  error|warn|info|debug (default info)\n"
            "\n"
            "TLS (docs/deployment.md; SIGHUP reloads the files for new connections):\n"
            "  --tls-cert FILE --tls-key FILE     serve RPC, replication and /metrics over TLS\n"
            "                                     with this PEM certificate chain and key\n"
            "  --tls-ca FILE                      require client certificates signed by this CA\n"
            "                                     (mutual TLS); with HA also the CA the leader's\n"
            "                                     certificate is checked against\n"
            "  --etcd-ca FILE                     etcd over https: the CA of etcd's certificate\n"
            "  --etcd-cert FILE --etcd-key FILE   the client certificate etcd's\n"
            "                                     --client-cert-auth asks for\n"
            "\n"
            "High availability (leader election on etcd; docs/deployment.md):\n"
            "  --etcd-endpoints URL[,URL...]      etcd v3 endpoints (e.g. http://10.0.0.1:2379);\n"
            "                                     without: a lone master, as always\n"
            "  --cluster-id ID                    the election's key is /moonlet/ID/leader\n"
            "                                     (default: moonlet)\n"
            "  --advertise HOST:PORT              the address clients reach this master at\n"
            "                                     (required with --etcd-endpoints; port 0: the\n"
            "                                     port it listens on)\n"
            "  --etcd-lease-ttl S                 etcd lease TTL in seconds (default 5): a dead\n"
            "                                     leader is replaced within about 2 x TTL\n"
            "  --repl-max-lag-ms MS               a write waits at most this long for the hot\n"
            "                                     standby's ack before the leader marks it out\n"
            "                                     of sync and goes on alone (default 300)\n"
            "  --no-replication                   no hot standby: a failover starts empty\n"
            "  --help, --version\n"
            "\n"
            "Durations (the TTLs and timeouts in ms or s above) also take a unit: 500ms, 5s,\n"
            "2m, 1h.  Without --rpc-address the master listens on 127.0.0.1, or on 0.0.0.0\n"
            "when --auth-token-file is given.\n"
            "\n"
            "mooncake_master's spellings:\n"
            "  --rpc_port, --port PORT            --rpc-port\n"
            "  --rpc_address ADDR                 --rpc-address\n"
            "  --rpc_thread_num N                 --rpc-threads\n"
            "  --metrics_port PORT                --metrics-port\n"
            "  --etcd_endpoints, --cluster_id     --etcd-endpoints, --cluster-id\n"
            "  --enable_ha                        accepted (HA is on with --etcd-endpoints)\n"
            "  --client_ttl DURATION              --client_live_ttl_sec (seconds without a unit)\n"
            "  -v N, --v N                        --log-level: 0 info, 1 or more debug\n"
            "  accepted and ignored, with a warning: --enable_http_metadata_server,\n"
            "  --http_metadata_server_host, --http_metadata_server_port (moonlet needs no\n"
            "  metadata service), --enable_gc, --enable_metric_reporting, --rpc_enable_tcp_no_delay,\n"
            "  --rpc_conn_timeout_seconds, --rpc_interface, --memory_allocator,\n"
            "  --root_fs_dir, --global_file_segment_size, --enable_offload, --logtostderr\n");
}

static int parse_u64(const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') {
        fprintf(stderr, "moonlet-master: %s: not a non-negative integer: '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_ratio(const char *flag, const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || v < 0 || v > 1) {
        fprintf(stderr, "moonlet-master: %s: not a ratio in [0, 1]: '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* A duration: digits with an optional unit (ms, s, m, h); without one, in
 * units of unit_ms.  Stored in milliseconds. */
static int parse_duration_ms(const char *flag, const char *s, uint64_t unit_ms, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mult = unit_ms;
    if (!errno && end != s && s[0] != '-') {
        if (!strcmp(end, "ms"))
            mult = 1;
        else if (!strcmp(end, "s"))
            mult = 1000;
        else if (!strcmp(end, "m"))
            mult = 60000;
        else if (!strcmp(end, "h"))
            mult = 3600000;
        else if (*end)
            mult = 0;
        if (mult && v <= UINT64_MAX / mult) {
            *out = (uint64_t)v * mult;
            return 0;
        }
    }
    fprintf(stderr, "moonlet-master: %s: not a duration (e.g. 5000, 500ms, 5s, 2m): '%s'\n", flag,
            s);
    return -1;
}

enum {
    O_ADDR = 1000, O_PORT, O_THREADS, O_SHARDS, O_LEASE, O_PIN, O_HWM, O_RATIO, O_LIVE, O_PUT,
    O_QGRACE, O_FRAME, O_TOKEN, O_LOG, O_HELP, O_VERSION, O_METRICS, O_BATCH, O_MAXCONN, O_AUTH_TO,
    O_FRAME_TO, O_IDLE_TO, O_CLIENT_TTL, O_VERBOSE, O_IGNORED, O_DISABLE, O_HARDPIN,
    O_REPAIR_BW, O_REPAIR_CONC, O_DEMOTE_Q, O_DEMOTE_AHEAD,
    O_ETCD, O_CLUSTER, O_ADVERTISE, O_ETCD_TTL, O_ENABLE_HA, O_REPL_LAG, O_NO_REPL, O_PEER_TOKEN,
    O_CREDS,
    O_TLS_CERT, O_TLS_KEY, O_TLS_CA, O_ETCD_CA, O_ETCD_CERT, O_ETCD_KEY
};

#define DEFAULT_MAX_CONNECTIONS 8192u
#define DEFAULT_IDLE_TIMEOUT_MS 300000u
#define FD_RESERVE 1280u /* beyond the RPC connections: metrics (up to 1024), files, ... */

/* /metrics: a reader's or operator's credential when there are
 * credentials, else the token; over HTTPS with the TLS files. */
static int start_metrics(moonlet_master *m, const char *address, uint16_t port,
                         const moonlet_cred_set *creds, const char *token,
                         const moonlet_tls_files *tf, moonlet_metrics **out)
{
    return creds ? moonlet_metrics_start_creds(m, address, port, creds, tf->cert, tf->key, out)
                 : moonlet_metrics_start_tls(m, address, port, token, tf->cert, tf->key, out);
}

/* The election thread's notice that this master was deposed: the main
 * thread, in sigwait, resets the metadata. */
static void on_deposed(void *arg)
{
    (void)arg;
    kill(getpid(), SIGUSR1);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"rpc-address", required_argument, 0, O_ADDR},
        {"rpc-port", required_argument, 0, O_PORT},
        {"rpc-threads", required_argument, 0, O_THREADS},
        {"shards", required_argument, 0, O_SHARDS},
        {"default_kv_lease_ttl", required_argument, 0, O_LEASE},
        {"default_kv_soft_pin_ttl", required_argument, 0, O_PIN},
        {"eviction_high_watermark_ratio", required_argument, 0, O_HWM},
        {"eviction_ratio", required_argument, 0, O_RATIO},
        {"hard_pin_max_ratio", required_argument, 0, O_HARDPIN},
        {"client_live_ttl_sec", required_argument, 0, O_LIVE},
        {"put_timeout_ms", required_argument, 0, O_PUT},
        {"put_quarantine_grace_ms", required_argument, 0, O_QGRACE},
        {"max-frame-bytes", required_argument, 0, O_FRAME},
        {"repair-bandwidth", required_argument, 0, O_REPAIR_BW},
        {"repair-concurrency", required_argument, 0, O_REPAIR_CONC},
        {"demote-queue", required_argument, 0, O_DEMOTE_Q},
        {"demote-ahead-ratio", required_argument, 0, O_DEMOTE_AHEAD},
        {"auth-token-file", required_argument, 0, O_TOKEN},
        {"peer-token-file", required_argument, 0, O_PEER_TOKEN},
        {"credentials", required_argument, 0, O_CREDS},
        {"metrics-port", required_argument, 0, O_METRICS},
        {"max-batch-keys", required_argument, 0, O_BATCH},
        {"max-connections", required_argument, 0, O_MAXCONN},
        {"auth-timeout-ms", required_argument, 0, O_AUTH_TO},
        {"frame-timeout-ms", required_argument, 0, O_FRAME_TO},
        {"idle-timeout-ms", required_argument, 0, O_IDLE_TO},
        {"disable-method", required_argument, 0, O_DISABLE},
        {"etcd-endpoints", required_argument, 0, O_ETCD},
        {"cluster-id", required_argument, 0, O_CLUSTER},
        {"advertise", required_argument, 0, O_ADVERTISE},
        {"etcd-lease-ttl", required_argument, 0, O_ETCD_TTL},
        {"repl-max-lag-ms", required_argument, 0, O_REPL_LAG},
        {"no-replication", no_argument, 0, O_NO_REPL},
        {"tls-cert", required_argument, 0, O_TLS_CERT},
        {"tls-key", required_argument, 0, O_TLS_KEY},
        {"tls-ca", required_argument, 0, O_TLS_CA},
        {"etcd-ca", required_argument, 0, O_ETCD_CA},
        {"etcd-cert", required_argument, 0, O_ETCD_CERT},
        {"etcd-key", required_argument, 0, O_ETCD_KEY},
        {"etcd_endpoints", required_argument, 0, O_ETCD},
        {"cluster_id", required_argument, 0, O_CLUSTER},
        {"enable_ha", optional_argument, 0, O_ENABLE_HA},
        {"log-level", required_argument, 0, O_LOG},
        {"help", no_argument, 0, O_HELP},
        {"version", no_argument, 0, O_VERSION},
        /* mooncake_master's spellings */
        {"rpc_port", required_argument, 0, O_PORT},
        {"port", required_argument, 0, O_PORT},
        {"rpc_address", required_argument, 0, O_ADDR},
        {"rpc_thread_num", required_argument, 0, O_THREADS},
        {"metrics_port", required_argument, 0, O_METRICS},
        {"client_ttl", required_argument, 0, O_CLIENT_TTL},
        {"v", required_argument, 0, O_VERBOSE},
        /* mooncake_master's flags that mean nothing here: with a value ... */
        {"http_metadata_server_host", required_argument, 0, O_IGNORED},
        {"http_metadata_server_port", required_argument, 0, O_IGNORED},
        {"rpc_conn_timeout_seconds", required_argument, 0, O_IGNORED},
        {"rpc_interface", required_argument, 0, O_IGNORED},
        {"memory_allocator", required_argument, 0, O_IGNORED},
        {"root_fs_dir", required_argument, 0, O_IGNORED},
        {"global_file_segment_size", required_argument, 0, O_IGNORED},
        /* ... and booleans (--flag, --flag=true) */
        {"enable_http_metadata_server", optional_argument, 0, O_IGNORED},
        {"enable_gc", optional_argument, 0, O_IGNORED},
        {"enable_metric_reporting", optional_argument, 0, O_IGNORED},
        {"rpc_enable_tcp_no_delay", optional_argument, 0, O_IGNORED},
        {"enable_offload", optional_argument, 0, O_IGNORED},
        {"logtostderr", optional_argument, 0, O_IGNORED},
        {0, 0, 0, 0},
    };
    moonlet_master_config cfg;
    moonlet_master_config_default(&cfg);
    moonlet_service_opts so = {.address = "127.0.0.1", .port = 50051,
                               .max_connections = DEFAULT_MAX_CONNECTIONS,
                               .idle_timeout_ms = DEFAULT_IDLE_TIMEOUT_MS};
    const char *token_file = NULL, *peer_token_file = NULL, *creds_file = NULL;
    moonlet_tls_files tls_files = {0}, etcd_files = {0};
    const char *etcd = NULL, *cluster = "moonlet", *advertise = NULL;
    uint32_t etcd_ttl_s = 0;
    uint64_t repl_lag_ms = MOONLET_REPL_DEFAULT_MAX_LAG_MS;
    bool no_repl = false;
    bool address_given = false;
    int metrics_port = -1; /* off */
    uint64_t v;
    int c, bad = 0, idx = -1;
    while (!bad && (c = getopt_long(argc, argv, "v:", opts, &idx)) != -1) {
        switch (c) {
        case O_ADDR: so.address = optarg; address_given = true; break;
        case O_PORT:
            bad = parse_u64("--rpc-port", optarg, &v) || v > 65535;
            so.port = (uint16_t)v;
            break;
        case O_THREADS: bad = parse_u64("--rpc-threads", optarg, &v) || v > 256; so.threads = (int)v; break;
        case O_SHARDS: bad = parse_u64("--shards", optarg, &v) || v == 0 || v > (1u << 20); cfg.shards = (uint32_t)v; break;
        case O_LEASE: bad = parse_duration_ms("--default_kv_lease_ttl", optarg, 1, &cfg.lease_ttl_ms); break;
        case O_PIN: bad = parse_duration_ms("--default_kv_soft_pin_ttl", optarg, 1, &cfg.soft_pin_ttl_ms); break;
        case O_HWM: bad = parse_ratio("--eviction_high_watermark_ratio", optarg, &cfg.eviction_high_watermark); break;
        case O_RATIO: bad = parse_ratio("--eviction_ratio", optarg, &cfg.eviction_ratio); break;
        case O_HARDPIN: bad = parse_ratio("--hard_pin_max_ratio", optarg, &cfg.hard_pin_max_ratio); break;
        case O_LIVE:
        case O_CLIENT_TTL:
            bad = parse_duration_ms(c == O_LIVE ? "--client_live_ttl_sec" : "--client_ttl", optarg,
                                    1000, &v) || v == 0;
            cfg.client_live_ttl_ms = v;
            break;
        case 'v':
        case O_VERBOSE: {
            const char *n = optarg[0] == '=' ? optarg + 1 : optarg; /* -v=1, as glog takes it */
            bad = parse_u64("-v", n, &v);
            moonlet_log_set_level(moonlet_log_parse_level(v ? "debug" : "info"));
            break;
        }
        case O_IGNORED:
            fprintf(stderr, "moonlet-master: ignoring mooncake_master's --%s: it has no meaning "
                            "for moonlet (see --help)\n", opts[idx].name);
            break;
        case O_PUT: bad = parse_duration_ms("--put_timeout_ms", optarg, 1, &cfg.put_timeout_ms); break;
        case O_QGRACE:
            bad = parse_duration_ms("--put_quarantine_grace_ms", optarg, 1,
                                    &cfg.put_quarantine_grace_ms);
            break;
        case O_FRAME: bad = parse_u64("--max-frame-bytes", optarg, &v) || v < 1024 || v > (1u << 30); so.max_frame = v; break;
        case O_TOKEN: token_file = optarg; break;
        case O_PEER_TOKEN: peer_token_file = optarg; break;
        case O_CREDS: creds_file = optarg; break;
        case O_REPAIR_BW:
            bad = moonlet_bytesize_parse(optarg, &v) != 0 || v == 0;
            if (bad)
                fprintf(stderr, "moonlet-master: --repair-bandwidth: not a positive size: '%s'\n",
                        optarg);
            cfg.repair_bandwidth = v;
            break;
        case O_REPAIR_CONC:
            bad = parse_u64("--repair-concurrency", optarg, &v) || v == 0 || v > 4096;
            cfg.repair_concurrency = (uint32_t)v;
            break;
        case O_DEMOTE_Q:
            bad = parse_u64("--demote-queue", optarg, &v) || v == 0 || v > (1u << 24);
            cfg.demote_queue = (uint32_t)v;
            break;
        case O_DEMOTE_AHEAD:
            bad = parse_ratio("--demote-ahead-ratio", optarg, &cfg.demote_ahead_ratio);
            break;
        case O_BATCH: bad = parse_u64("--max-batch-keys", optarg, &v) || v == 0 || v > (1u << 24); so.max_batch_keys = v; break;
        case O_MAXCONN: bad = parse_u64("--max-connections", optarg, &v) || v == 0 || v > (1u << 20); so.max_connections = (uint32_t)v; break;
        case O_AUTH_TO: bad = parse_u64("--auth-timeout-ms", optarg, &v) || v == 0 || v > 3600000; so.auth_timeout_ms = (uint32_t)v; break;
        case O_FRAME_TO: bad = parse_u64("--frame-timeout-ms", optarg, &v) || v == 0 || v > 3600000; so.frame_timeout_ms = (uint32_t)v; break;
        case O_IDLE_TO:
            bad = parse_u64("--idle-timeout-ms", optarg, &v) || v > 86400000;
            so.idle_timeout_ms = (uint32_t)v;
            break;
        case O_DISABLE: so.disabled_method = optarg; break;
        case O_ETCD: etcd = optarg; break;
        case O_CLUSTER: cluster = optarg; break;
        case O_ADVERTISE: advertise = optarg; break;
        case O_ETCD_TTL:
            bad = parse_duration_ms("--etcd-lease-ttl", optarg, 1000, &v);
            if (!bad && (v < 1000 || v > 3600000 || v % 1000)) {
                fprintf(stderr, "moonlet-master: --etcd-lease-ttl: whole seconds from 1 to 3600 "
                                "(etcd's leases count seconds): '%s'\n", optarg);
                bad = 1;
            }
            etcd_ttl_s = (uint32_t)(v / 1000);
            break;
        case O_ENABLE_HA: break; /* HA is on exactly when --etcd-endpoints is given */
        case O_REPL_LAG:
            bad = parse_duration_ms("--repl-max-lag-ms", optarg, 1, &v) || v == 0 || v > 60000;
            repl_lag_ms = v;
            break;
        case O_NO_REPL: no_repl = true; break;
        case O_TLS_CERT: tls_files.cert = optarg; break;
        case O_TLS_KEY: tls_files.key = optarg; break;
        case O_TLS_CA: tls_files.ca = optarg; break;
        case O_ETCD_CA: etcd_files.ca = optarg; break;
        case O_ETCD_CERT: etcd_files.cert = optarg; break;
        case O_ETCD_KEY: etcd_files.key = optarg; break;
        case O_METRICS: bad = parse_u64("--metrics-port", optarg, &v) || v > 65535; metrics_port = (int)v; break;
        case O_LOG: {
            int lvl = moonlet_log_parse_level(optarg);
            if (lvl < 0) {
                fprintf(stderr, "moonlet-master: --log-level: unknown level '%s'\n", optarg);
                bad = 1;
            }
            moonlet_log_set_level(lvl);
            break;
        }
        case O_HELP: usage(stdout); return 0;
        case O_VERSION: printf("moonlet-master %s\n", MOONLET_VERSION); return 0;
        default: bad = 1; break;
        }
    }
    if (!bad && etcd && (!advertise || !*advertise || !*cluster)) {
        fprintf(stderr, "moonlet-master: --etcd-endpoints needs --advertise HOST:PORT and a "
                        "non-empty --cluster-id\n");
        bad = 1;
    }
    if (!bad && (tls_files.cert || tls_files.key || tls_files.ca) &&
        (!tls_files.cert || !tls_files.key || (etcd && !no_repl && !tls_files.ca))) {
        fprintf(stderr, "moonlet-master: TLS needs --tls-cert and --tls-key (and, with "
                        "--etcd-endpoints, --tls-ca: a standby checks the leader with it)\n");
        bad = 1;
    }
    if (!bad && (!etcd_files.cert != !etcd_files.key)) {
        fprintf(stderr, "moonlet-master: --etcd-cert and --etcd-key go together\n");
        bad = 1;
    }
    if (bad || optind < argc) {
        if (optind < argc && !bad)
            fprintf(stderr, "moonlet-master: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    uint64_t nofile = moonlet_fdlimit_raise((uint64_t)so.max_connections + FD_RESERVE);
    if (nofile < (uint64_t)so.max_connections + FD_RESERVE) {
        uint64_t fit = nofile > 2 * FD_RESERVE ? nofile - FD_RESERVE : nofile / 2;
        ML_WARN("master", "--max-connections lowered from %u to %llu to fit the descriptor limit",
                so.max_connections, (unsigned long long)fit);
        so.max_connections = (uint32_t)(fit ? fit : 1);
    }

    char *token = NULL;
    if (token_file && moonlet_token_read(token_file, &token) != MOONLET_OK)
        return 2;
    so.auth_token = token;
    char *peer_token = NULL;
    if (peer_token_file && moonlet_token_read(peer_token_file, &peer_token) != MOONLET_OK)
        return 2;
    if (peer_token && token && strcmp(peer_token, token) == 0) {
        fprintf(stderr, "moonlet-master: --peer-token-file holds the clients' token: the masters' "
                        "credential must be a token of its own\n");
        return 2;
    }
    so.peer_token = peer_token;
    moonlet_cred_set *creds = NULL;
    if (creds_file) {
        if (token) {
            fprintf(stderr, "moonlet-master: --credentials and --auth-token-file exclude each "
                            "other: give the shared token a line of the credentials file\n");
            return 2;
        }
        if (etcd && !peer_token) {
            fprintf(stderr, "moonlet-master: with --credentials and --etcd-endpoints, "
                            "--peer-token-file names the masters' own credential\n");
            return 2;
        }
        if (moonlet_cred_load(creds_file, &creds) != MOONLET_OK ||
            (peer_token &&
             moonlet_cred_add_token(creds, peer_token, strlen(peer_token), MOONLET_ROLE_PEER)))
            return 2;
        so.creds = creds;
    }
    moonlet_tls_ctx *tls_srv = NULL, *tls_cli = NULL;
    if (tls_files.cert && moonlet_tls_ctx_create(true, &tls_files, &tls_srv) != MOONLET_OK)
        return 2;
    if (tls_srv && etcd && !no_repl && moonlet_tls_ctx_create(false, &tls_files, &tls_cli))
        return 2;
    so.tls = tls_srv;
    if ((etcd_files.ca || etcd_files.cert) &&
        moonlet_etcd_set_tls(etcd_files.ca, etcd_files.cert, etcd_files.key) != MOONLET_OK)
        return 2;
    /* Only an authenticated master (a token, credentials, or client
     * certificates) listens beyond loopback unless told where. */
    if (!address_given && (token || creds || (tls_srv && tls_files.ca)))
        so.address = "0.0.0.0";

    /* Signals are taken synchronously by this thread; workers never see them. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR1); /* the election: deposed, reset the metadata */
    sigaddset(&set, SIGHUP);  /* reload the TLS certificates */
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    moonlet_role *role = NULL;
    if (etcd && moonlet_role_create(advertise, &role) != MOONLET_OK)
        return 1;
    so.role = role;
    int sig = 0, exit_code = 0;
    if (role) {
        moonlet_ha_opts ho = {.etcd_endpoints = etcd, .cluster_id = cluster, .role = role,
                              .etcd_ttl_s = etcd_ttl_s,
                              .client_live_ttl_ms = cfg.client_live_ttl_ms,
                              .replication = !no_repl, .repl_max_lag_ms = repl_lag_ms,
                              .auth_token = creds ? peer_token : token,
                              .peer_token = peer_token, .tls = tls_cli,
                              .on_deposed = on_deposed, .arg = NULL};
        if (moonlet_ha_init(&ho, &cfg, &so) != MOONLET_OK)
            return 1;
    }

    moonlet_master *m;
    int rc = moonlet_master_create(&cfg, &m);
    if (rc) {
        ML_ERR("master", "cannot create the master: %s", moonlet_strerror(rc));
        moonlet_token_free(token);
        moonlet_token_free(peer_token);
        return 1;
    }
    moonlet_master_service *svc;
    rc = moonlet_master_service_start(m, &so, &svc);
    if (rc) {
        ML_ERR("master", "cannot listen on %s:%u: %s", so.address, so.port, moonlet_strerror(rc));
        moonlet_master_destroy(m);
        moonlet_token_free(token);
        moonlet_token_free(peer_token);
        return 1;
    }
    moonlet_metrics *metrics = NULL;
    if (metrics_port >= 0 &&
        start_metrics(m, so.address, (uint16_t)metrics_port, creds, token, &tls_files,
                      &metrics) != MOONLET_OK) {
        moonlet_master_service_stop(svc);
        moonlet_master_destroy(m);
        moonlet_token_free(token);
        moonlet_token_free(peer_token);
        return 1;
    }
    moonlet_metrics_set_role(metrics, role);
    moonlet_metrics_set_repl(metrics, moonlet_ha_log());
    moonlet_metrics_set_rpc(metrics, moonlet_master_service_rpc(svc));
    moonlet_ha_set_master(m);
    so.port = moonlet_master_service_port(svc); /* a reset listens on the same port */
    printf("listening on %s:%u\n", so.address, so.port);
    uint16_t metrics_port_bound = metrics ? moonlet_metrics_port(metrics) : 0;
    if (metrics)
        printf("metrics on %s:%u\n", so.address, metrics_port_bound);
    fflush(stdout);
    ML_INFO("master", "moonlet-master %s: %u shards, lease TTL %llu ms, liveness TTL %llu ms",
            MOONLET_VERSION, cfg.shards, (unsigned long long)cfg.lease_ttl_ms,
            (unsigned long long)cfg.client_live_ttl_ms);

    char advertise_buf[300];
    size_t alen = advertise ? strlen(advertise) : 0;
    if (role && alen > 2 && strcmp(advertise + alen - 2, ":0") == 0) { /* HOST:0: the bound port */
        snprintf(advertise_buf, sizeof(advertise_buf), "%.*s:%u", (int)(alen - 2), advertise,
                 so.port);
        advertise = advertise_buf;
        moonlet_role_set_advertise(role, advertise);
    }
    if (role && moonlet_ha_start(advertise) != MOONLET_OK) {
        sig = SIGTERM;
        exit_code = 1;
    }
    while (!sig) {
        int got = 0;
        sigwait(&set, &got);
        if (got == SIGHUP) {
            if (!tls_srv) {
                ML_INFO("master", "SIGHUP: no TLS certificates to reload");
                continue;
            }
            int r1 = moonlet_tls_ctx_reload(tls_srv);
            int r2 = tls_cli ? moonlet_tls_ctx_reload(tls_cli) : MOONLET_OK;
            if (metrics && !r1) { /* libmicrohttpd keeps what it started with */
                moonlet_metrics_stop(metrics);
                metrics = NULL;
                if (start_metrics(m, so.address, metrics_port_bound, creds, token, &tls_files,
                                  &metrics) == 0) {
                    moonlet_metrics_set_role(metrics, role);
                    moonlet_metrics_set_repl(metrics, moonlet_ha_log());
                    moonlet_metrics_set_rpc(metrics, moonlet_master_service_rpc(svc));
                } else {
                    ML_ERR("master", "SIGHUP: /metrics did not restart");
                }
            }
            ML_INFO("master", "SIGHUP: TLS certificates %s", !r1 && !r2 ? "reloaded: new "
                    "connections use them" : "NOT reloaded (see above): the old ones stay");
            continue;
        }
        if (got != SIGUSR1) {
            sig = got;
            break;
        }
        /* deposed: no handler may run on the old metadata any more (the
         * role already refuses every call); restart on an empty master */
        ML_WARN("master", "deposed: restarting on an empty master before campaigning again");
        moonlet_metrics_stop(metrics);
        metrics = NULL;
        moonlet_master_service_stop(svc);
        svc = NULL;
        moonlet_ha_keep(m); /* restored if this master wins again, nobody else having led */
        moonlet_master_destroy(m);
        m = NULL;
        moonlet_ha_reset();
        rc = moonlet_master_create(&cfg, &m);
        moonlet_ha_set_master(m);
        if (!rc)
            rc = moonlet_master_service_start(m, &so, &svc);
        if (!rc && metrics_port >= 0)
            rc = start_metrics(m, so.address, metrics_port_bound, creds, token, &tls_files,
                               &metrics);
        if (!rc) {
            moonlet_metrics_set_role(metrics, role);
            moonlet_metrics_set_repl(metrics, moonlet_ha_log());
            moonlet_metrics_set_rpc(metrics, moonlet_master_service_rpc(svc));
        }
        if (rc) {
            ML_ERR("master", "cannot restart after being deposed: %s", moonlet_strerror(rc));
            sig = SIGTERM;
            exit_code = 1;
            break;
        }
        moonlet_ha_resume(); /* a standby again: follow the next leader */
    }
    ML_INFO("master", "signal %d: shutting down", sig);
    moonlet_ha_stop();
    moonlet_metrics_stop(metrics);
    moonlet_master_service_stop(svc);
    moonlet_master_destroy(m);
    moonlet_ha_fini();
    moonlet_role_destroy(role);
    moonlet_tls_ctx_unref(tls_srv);
    moonlet_tls_ctx_unref(tls_cli);
    moonlet_token_free(token);
    moonlet_token_free(peer_token);
    moonlet_cred_set_free(creds);
    return exit_code;
}
