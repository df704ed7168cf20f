/*
 * metrics.c - GET /metrics: the master's statistics in the Prometheus text
 * format, served by libmicrohttpd.  See metrics.h.
 *
 * Each scrape takes one moonlet_master_get_stats() snapshot and renders it;
 * nothing is cached.  The probe lock-hold histogram keeps the master's own
 * buckets (master.h: <1us, <2us, ... <1024us, >=1024us), exposed as a
 * Prometheus histogram in seconds with cumulative counts; its _sum is not
 * emitted because the master records only bucket counts and the maximum.
 *
 * Idle connections cannot starve a scrape: up to METRICS_MAX_CONNS
 * connections (METRICS_MAX_CONNS_PER_IP from one address), each closed after
 * METRICS_IDLE_S seconds without a request.
 *
 * Locks: none of its own; moonlet_master_get_stats() takes what it needs.
 */
#include "metrics.h"

#include <inttypes.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "monotime.h"
#include "log.h"
#include "moonlet/error.h"
#include "net.h"
#include "token.h"

#define MOD "metrics"
#define METRICS_MAX_CONNS 1024u
#define METRICS_MAX_CONNS_PER_IP 256u
#define METRICS_IDLE_S 3u

struct moonlet_metrics {
    moonlet_master *m;
    struct MHD_Daemon *d;
    uint16_t port;
    char *token; /* NULL: scrapes need no credentials */
    _Atomic(const moonlet_role *) role; /* NULL: no HA gauges */
    _Atomic(moonlet_repl_log *) repl;   /* NULL: no replication gauges */
};

/* ---- rendering -------------------------------------------------------------- */

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(FILE *f, const char *name, const char *labels, uint64_t v)
{
    fprintf(f, "%s%s %" PRIu64 "\n", name, labels, v);
}

static void gauge(FILE *f, const char *name, const char *help, uint64_t v)
{
    family(f, name, "gauge", help);
    sample(f, name, "", v);
}

static void counter(FILE *f, const char *name, const char *help, uint64_t v)
{
    family(f, name, "counter", help);
    sample(f, name, "", v);
}

/* A lock-hold histogram (bucket i: durations below 2^i us; the last bucket is
 * +Inf; counts only, the master keeps no sum) and its max-hold gauge. */
static void lock_hold(FILE *f, const char *name, const char *help, const uint64_t *hist,
                      const char *max_name, const char *max_help, uint64_t max_ns)
{
    family(f, name, "histogram", help);
    uint64_t cum = 0;
    for (unsigned i = 0; i + 1 < MOONLET_LOCK_HIST_BUCKETS; i++) {
        cum += hist[i];
        fprintf(f, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, (double)(1u << i) * 1e-6, cum);
    }
    cum += hist[MOONLET_LOCK_HIST_BUCKETS - 1];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
    fprintf(f, "%s_count %" PRIu64 "\n", name, cum);
    family(f, max_name, "gauge", max_help);
    fprintf(f, "%s %.9f\n", max_name, (double)max_ns * 1e-9);
}

/* Runs one section's writer on an open_memstream and hands its text out
 * (NULL when the stream failed); buf and n are final only after fclose. */
static char *render(void (*write)(FILE *f, const void *arg), const void *arg, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    write(f, arg);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    if (len)
        *len = n;
    return buf;
}

static void write_stats(FILE *f, const void *arg)
{
    const moonlet_master_stats *st = arg;
    gauge(f, "moonlet_objects", "Objects in the master's table.", st->objects);
    gauge(f, "moonlet_bytes", "Sum of the objects' sizes in bytes.", st->bytes);
    gauge(f, "moonlet_segments", "Mounted segments.", st->segments);
    gauge(f, "moonlet_capacity_bytes", "Capacity of the mounted segments in bytes.", st->capacity);
    gauge(f, "moonlet_used_bytes", "Bytes allocated to replicas in the mounted segments.",
          st->used);
    gauge(f, "moonlet_clients", "Store clients known to the master.", st->clients);

    family(f, "moonlet_leases_granted_total", "counter",
           "Read leases granted, by the operation that granted them.");
    sample(f, "moonlet_leases_granted_total", "{op=\"get\"}", st->leases_get);
    sample(f, "moonlet_leases_granted_total", "{op=\"exist\"}", st->leases_exist);
    sample(f, "moonlet_leases_granted_total", "{op=\"probe\"}", st->leases_probe);

    family(f, "moonlet_probe_calls_total", "counter", "BatchProbeKey calls, by lease mode.");
    sample(f, "moonlet_probe_calls_total", "{mode=\"none\"}", st->probe_calls_none);
    sample(f, "moonlet_probe_calls_total", "{mode=\"last_hit_only\"}", st->probe_calls_last_hit);

    counter(f, "moonlet_evictions_total", "Objects evicted.", st->evictions);
    counter(f, "moonlet_put_starts_reserved_total",
            "PutStarts placed in ranges reserved on the hot standby (no standby wait).",
            st->put_starts_reserved);
    counter(f, "moonlet_put_replacements_total",
            "Replicas of puts in progress replaced after a failed write (PutReplaceReplica).",
            st->put_replacements);
    counter(f, "moonlet_probe_candidates_examined_total",
            "Candidates rechecked under their shard locks by BatchProbeKey(LAST_HIT_ONLY).",
            st->probe_candidates_examined);
    counter(f, "moonlet_probe_recheck_fallbacks_total",
            "Candidates that failed the recheck, so an earlier candidate was tried.",
            st->probe_recheck_fallbacks);

    lock_hold(f, "moonlet_probe_lock_hold_seconds",
              "Time BatchProbeKey(LAST_HIT_ONLY) held a candidate's shard locks (bucket "
              "counts only: the master keeps no sum).",
              st->probe_lock_hold_hist, "moonlet_probe_lock_hold_max_seconds",
              "Longest shard-lock hold by BatchProbeKey(LAST_HIT_ONLY) since the master started.",
              st->probe_lock_hold_max_ns);

    /* Re-replication (master/repair.c) */
    gauge(f, "moonlet_under_replicated_objects",
          "Objects with fewer live replicas than they were put with, queued or being repaired.",
          st->under_replicated);
    gauge(f, "moonlet_repairs_queued", "Repairs waiting for a target (backoff included).",
          st->repairs_queued);
    gauge(f, "moonlet_repairs_running", "Repairs handed to a target node and not reported.",
          st->repairs_running);
    family(f, "moonlet_repairs_total", "counter", "Repair attempts by outcome.");
    sample(f, "moonlet_repairs_total", "{outcome=\"done\"}", st->repairs_done);
    sample(f, "moonlet_repairs_total", "{outcome=\"retried\"}", st->repairs_retried);
    sample(f, "moonlet_repairs_total", "{outcome=\"failed\"}", st->repairs_failed);
    sample(f, "moonlet_repairs_total", "{outcome=\"dropped\"}", st->repairs_dropped);
    counter(f, "moonlet_repair_bytes_total", "Bytes copied by finished repairs.",
            st->repair_bytes);

    /* ProbeResume (master/probe_resume.c) */
    counter(f, "moonlet_resume_calls_total", "ProbeResume calls (the K3 lookup in one call).",
            st->resume_calls);
    counter(f, "moonlet_resume_candidates_examined_total",
            "Candidates rechecked under their shard locks by ProbeResume.",
            st->resume_candidates_examined);
    counter(f, "moonlet_resume_recheck_fallbacks_total",
            "ProbeResume candidates that failed the recheck, so an earlier one was tried.",
            st->resume_recheck_fallbacks);
    family(f, "moonlet_resume_leases_granted_total", "counter",
           "Read leases granted by ProbeResume, by kind of key.");
    sample(f, "moonlet_resume_leases_granted_total", "{kind=\"kda\"}", st->leases_resume_kda);
    sample(f, "moonlet_resume_leases_granted_total", "{kind=\"kv\"}", st->leases_resume_kv);
    lock_hold(f, "moonlet_resume_lock_hold_seconds",
              "Time ProbeResume held a candidate's and its KV keys' shard locks (bucket counts "
              "only: the master keeps no sum).",
              st->resume_lock_hold_hist, "moonlet_resume_lock_hold_max_seconds",
              "Longest shard-lock hold by ProbeResume since the master started.",
              st->resume_lock_hold_max_ns);
}

char *moonlet_metrics_render(const moonlet_master_stats *st, size_t *len)
{
    return render(write_stats, st, len);
}

static void write_role(FILE *f, const void *arg)
{
    const moonlet_role_info *ri = arg;
    gauge(f, "moonlet_ha_role", "HA role: 0 single (no etcd), 1 standby, 2 leader.", ri->state);
    gauge(f, "moonlet_ha_serving", "1 while this master serves calls (a leader past its grace "
          "period and inside its fencing window, or a single master).", ri->serving);
    gauge(f, "moonlet_ha_epoch", "Epoch this master serves under, or the newest leader epoch "
          "it knows (the leader key's etcd create revision).", ri->epoch);
    gauge(f, "moonlet_ha_terms", "Times this master was elected leader.", ri->terms);
}

char *moonlet_metrics_render_role(const moonlet_role_info *ri, size_t *len)
{
    return render(write_role, ri, len);
}

static void write_repl(FILE *f, const void *arg)
{
    const moonlet_repl_log_status *st = arg;
    gauge(f, "moonlet_ha_repl_in_sync", "1 while the hot standby is in sync: writes wait for its "
          "acknowledgement (leader's view).", st->in_sync);
    gauge(f, "moonlet_ha_repl_lag_ms", "Age of the oldest replication record the standby has not "
          "acknowledged (ms).", st->lag_ms);
    gauge(f, "moonlet_ha_repl_acked", "The standby acknowledged every record below this number.",
          st->acked);
    gauge(f, "moonlet_ha_repl_next", "The number the next replication record gets.", st->next);
    gauge(f, "moonlet_ha_repl_out_of_sync_total", "Times the standby lagged past "
          "--repl-max-lag-ms and was marked out of sync.", st->out_of_sync_marks);
}

char *moonlet_metrics_render_repl(const moonlet_repl_log_status *st, size_t *len)
{
    return render(write_repl, st, len);
}

void moonlet_metrics_set_repl(moonlet_metrics *s, moonlet_repl_log *log)
{
    if (s)
        atomic_store(&s->repl, log);
}

void moonlet_metrics_set_role(moonlet_metrics *s, const moonlet_role *role)
{
    if (s)
        atomic_store(&s->role, role);
}

/* ---- HTTP ------------------------------------------------------------------- */

/* Queues a text response; `extra_header` (NULL: none) is "Name", value pair. */
static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned status, char *body,
                                    size_t len, enum MHD_ResponseMemoryMode mode,
                                    const char *const *extra_header)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            status == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8"
                                                  : "text/plain; charset=utf-8");
    if (extra_header)
        MHD_add_response_header(r, extra_header[0], extra_header[1]);
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Appends a rendered section (rb, NULL: it failed) to the body, taking both;
 * NULL (both freed) when either is missing. */
static char *append_section(char *body, size_t *len, char *rb, size_t rlen)
{
    char *all = rb ? realloc(body, *len + rlen + 1) : NULL;
    if (!all) {
        free(rb);
        free(body);
        return NULL;
    }
    memcpy(all + *len, rb, rlen + 1);
    free(rb);
    *len += rlen;
    return all;
}

/* With a token: "Authorization: Bearer <token>", compared in constant time. */
static bool scrape_authorized(const moonlet_metrics *s, struct MHD_Connection *conn)
{
    if (!s->token)
        return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION);
    static const char bearer[] = "Bearer ";
    if (!h || strncmp(h, bearer, sizeof(bearer) - 1) != 0)
        return false;
    h += sizeof(bearer) - 1;
    return moonlet_token_equal(h, strlen(h), s->token, strlen(s->token));
}

static enum MHD_Result respond_unauthorized(struct MHD_Connection *conn)
{
    static char body[] = "unauthorized: send the cluster token as \"Authorization: Bearer <token>\"\n";
    static const char *const challenge[] = {MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                            "Bearer realm=\"moonlet\""};
    return respond_text(conn, MHD_HTTP_UNAUTHORIZED, body, sizeof(body) - 1,
                        MHD_RESPMEM_PERSISTENT, challenge);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    moonlet_metrics *s = cls;
    static char not_found[] = "not found: the only path is /metrics\n";
    static char not_allowed[] = "method not allowed\n";
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, not_allowed,
                            sizeof(not_allowed) - 1, MHD_RESPMEM_PERSISTENT, NULL);
    if (!scrape_authorized(s, conn))
        return respond_unauthorized(conn);
    if (strcmp(url, "/metrics") != 0)
        return respond_text(conn, MHD_HTTP_NOT_FOUND, not_found, sizeof(not_found) - 1,
                            MHD_RESPMEM_PERSISTENT, NULL);
    moonlet_master_stats st;
    moonlet_master_get_stats(s->m, &st);
    size_t len = 0;
    char *body = moonlet_metrics_render(&st, &len);
    if (!body)
        return MHD_NO;
    const moonlet_role *role = atomic_load(&s->role);
    if (role) {
        moonlet_role_info ri;
        moonlet_role_get(role, moonlet_mono_ms(), &ri);
        size_t rlen = 0;
        char *rb = moonlet_metrics_render_role(&ri, &rlen);
        if (!(body = append_section(body, &len, rb, rlen)))
            return MHD_NO;
    }
    moonlet_repl_log *repl = atomic_load(&s->repl);
    if (repl) {
        moonlet_repl_log_status rs;
        moonlet_repl_log_get_status(repl, &rs);
        size_t rlen = 0;
        char *rb = moonlet_metrics_render_repl(&rs, &rlen);
        if (!(body = append_section(body, &len, rb, rlen)))
            return MHD_NO;
    }
    return respond_text(conn, MHD_HTTP_OK, body, len, MHD_RESPMEM_MUST_FREE, NULL);
}

int moonlet_metrics_start(moonlet_master *m, const char *address, uint16_t port,
                          const char *token, moonlet_metrics **out)
{
    struct sockaddr_storage sa;
    socklen_t sa_len;
    if (moonlet_net_resolve(address, port, true, &sa, &sa_len))
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_metrics *s = calloc(1, sizeof(*s));
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    s->m = m;
    if (token && *token && !(s->token = strdup(token))) {
        free(s);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | (sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    s->d = MHD_start_daemon(flags, port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, METRICS_MAX_CONNS,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, METRICS_MAX_CONNS_PER_IP,
                            MHD_OPTION_CONNECTION_TIMEOUT, METRICS_IDLE_S,
                            MHD_OPTION_END);
    if (!s->d) {
        ML_ERR(MOD, "cannot serve metrics on %s:%u (port in use?)", address, port);
        moonlet_token_free(s->token);
        free(s);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : port;
    *out = s;
    return MOONLET_OK;
}

uint16_t moonlet_metrics_port(const moonlet_metrics *s)
{
    return s->port;
}

void moonlet_metrics_stop(moonlet_metrics *s)
{
    if (!s)
        return;
    MHD_stop_daemon(s->d);
    moonlet_token_free(s->token);
    free(s);
}
