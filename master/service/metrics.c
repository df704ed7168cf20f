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
 * The endpoint (token, bounds, 404 / 405) is common/http_server.c's:
 * idle connections cannot starve a scrape, up to METRICS_MAX_CONNS
 * connections (256 from one address), each closed after MOONLET_HTTP_IDLE_S
 * seconds without a request.
 *
 * Locks: none of its own; moonlet_master_get_stats() takes what it needs.
 */
#include "metrics.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cred.h"
#include "http_server.h"
#include "monotime.h"
#include "moonlet/error.h"
#include "rpc_server.h"

#define METRICS_MAX_CONNS 1024u /* a quarter of them from one address (http_server.c) */

struct moonlet_metrics {
    moonlet_master *m;
    moonlet_http_server *http; /* common/http_server.c: the endpoint, token and bounds */
    _Atomic(const moonlet_role *) role; /* NULL: no HA gauges */
    _Atomic(moonlet_repl_log *) repl;   /* NULL: no replication gauges */
    _Atomic(const moonlet_rpc_server *) rpc; /* NULL: no RPC server counters */
};

/* ---- rendering -------------------------------------------------------------- */

/* common/http_server.h's moonlet_prom_* write the families and samples. */

/* A lock-hold histogram (bucket i: durations below 2^i us; the last bucket is
 * +Inf; counts only, the master keeps no sum) and its max-hold gauge. */
static void lock_hold(FILE *f, const char *name, const char *help, const uint64_t *hist,
                      const char *max_name, const char *max_help, uint64_t max_ns)
{
    moonlet_prom_family(f, name, "histogram", help);
    uint64_t cum = 0;
    for (unsigned i = 0; i + 1 < MOONLET_LOCK_HIST_BUCKETS; i++) {
        cum += hist[i];
        fprintf(f, "%s_bucket{le=\"%g\"} %" PRIu64 "\n", name, (double)(1u << i) * 1e-6, cum);
    }
    cum += hist[MOONLET_LOCK_HIST_BUCKETS - 1];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
    fprintf(f, "%s_count %" PRIu64 "\n", name, cum);
    moonlet_prom_family(f, max_name, "gauge", max_help);
    fprintf(f, "%s %.9f\n", max_name, (double)max_ns * 1e-9);
}

static void write_stats(FILE *f, const void *arg)
{
    const moonlet_master_stats *st = arg;
    moonlet_prom_gauge(f, "moonlet_objects", "Objects in the master's table.", st->objects);
    moonlet_prom_gauge(f, "moonlet_bytes", "Sum of the objects' sizes in bytes.", st->bytes);
    moonlet_prom_gauge(f, "moonlet_segments", "Mounted segments.", st->segments);
    moonlet_prom_gauge(f, "moonlet_capacity_bytes", "Capacity of the mounted segments in bytes.", st->capacity);
    moonlet_prom_gauge(f, "moonlet_used_bytes", "Bytes allocated to replicas in the mounted segments.",
          st->used);
    moonlet_prom_gauge(f, "moonlet_clients", "Store clients known to the master.", st->clients);

    moonlet_prom_family(f, "moonlet_leases_granted_total", "counter",
           "Read leases granted, by the operation that granted them.");
    moonlet_prom_sample(f, "moonlet_leases_granted_total", "{op=\"get\"}", st->leases_get);
    moonlet_prom_sample(f, "moonlet_leases_granted_total", "{op=\"exist\"}", st->leases_exist);
    moonlet_prom_sample(f, "moonlet_leases_granted_total", "{op=\"probe\"}", st->leases_probe);

    moonlet_prom_family(f, "moonlet_probe_calls_total", "counter", "BatchProbeKey calls, by lease mode.");
    moonlet_prom_sample(f, "moonlet_probe_calls_total", "{mode=\"none\"}", st->probe_calls_none);
    moonlet_prom_sample(f, "moonlet_probe_calls_total", "{mode=\"last_hit_only\"}", st->probe_calls_last_hit);

    moonlet_prom_counter(f, "moonlet_evictions_total", "Objects evicted.", st->evictions);
    moonlet_prom_counter(f, "moonlet_put_starts_reserved_total",
            "PutStarts placed in ranges reserved on the hot standby (no standby wait).",
            st->put_starts_reserved);
    moonlet_prom_counter(f, "moonlet_put_replacements_total",
            "Replicas of puts in progress replaced after a failed write (PutReplaceReplica).",
            st->put_replacements);
    moonlet_prom_counter(f, "moonlet_probe_candidates_examined_total",
            "Candidates rechecked under their shard locks by BatchProbeKey(LAST_HIT_ONLY).",
            st->probe_candidates_examined);
    moonlet_prom_counter(f, "moonlet_probe_recheck_fallbacks_total",
            "Candidates that failed the recheck, so an earlier candidate was tried.",
            st->probe_recheck_fallbacks);

    lock_hold(f, "moonlet_probe_lock_hold_seconds",
              "Time BatchProbeKey(LAST_HIT_ONLY) held a candidate's shard locks (bucket "
              "counts only: the master keeps no sum).",
              st->probe_lock_hold_hist, "moonlet_probe_lock_hold_max_seconds",
              "Longest shard-lock hold by BatchProbeKey(LAST_HIT_ONLY) since the master started.",
              st->probe_lock_hold_max_ns);

    /* Re-replication (master/store/repair.c) */
    moonlet_prom_gauge(f, "moonlet_under_replicated_objects",
          "Objects with fewer live replicas than they were put with, queued or being repaired.",
          st->under_replicated);
    moonlet_prom_gauge(f, "moonlet_repairs_queued", "Repairs waiting for a target (backoff included).",
          st->repairs_queued);
    moonlet_prom_gauge(f, "moonlet_repairs_running", "Repairs handed to a target node and not reported.",
          st->repairs_running);
    moonlet_prom_family(f, "moonlet_repairs_total", "counter", "Repair attempts by outcome.");
    moonlet_prom_sample(f, "moonlet_repairs_total", "{outcome=\"done\"}", st->repairs_done);
    moonlet_prom_sample(f, "moonlet_repairs_total", "{outcome=\"retried\"}", st->repairs_retried);
    moonlet_prom_sample(f, "moonlet_repairs_total", "{outcome=\"failed\"}", st->repairs_failed);
    moonlet_prom_sample(f, "moonlet_repairs_total", "{outcome=\"dropped\"}", st->repairs_dropped);
    moonlet_prom_counter(f, "moonlet_repair_bytes_total", "Bytes copied by finished repairs.",
            st->repair_bytes);

    /* The disk tier (master/store/repair.c's demotions, the disk segments) */
    moonlet_prom_gauge(f, "moonlet_disk_capacity_bytes", "Bytes of the store nodes' disk tiers.",
          st->disk_capacity);
    moonlet_prom_gauge(f, "moonlet_disk_used_bytes",
          "Disk tier bytes held by objects, copies ahead and extents not yet trimmed.",
          st->disk_used);
    moonlet_prom_gauge(f, "moonlet_disk_objects", "Objects the disk tiers hold.", st->disk_objects);
    moonlet_prom_gauge(f, "moonlet_demotions_queued",
          "Demotions waiting for their copy or copying (the queue depth).", st->demotions_queued);
    moonlet_prom_gauge(f, "moonlet_demotions_staged",
          "Disk copies made ahead of eviction, waiting for their object's eviction.",
          st->demotions_staged);
    moonlet_prom_family(f, "moonlet_demotions_total", "counter", "Demotions by outcome.");
    moonlet_prom_sample(f, "moonlet_demotions_total", "{outcome=\"done\"}", st->demotions);
    moonlet_prom_sample(f, "moonlet_demotions_total", "{outcome=\"dropped\"}",
                        st->demotions_dropped);
    moonlet_prom_sample(f, "moonlet_demotions_total", "{outcome=\"failed\"}", st->demotions_failed);
    moonlet_prom_counter(f, "moonlet_demotion_bytes_total", "Bytes moved from DRAM to disk.",
            st->demotion_bytes);
    /* the store nodes' own disk tier figures (their Pings), summed over the
     * nodes the master knows: gauges, as a node the master forgets leaves
     * the sums */
    moonlet_prom_gauge(f, "moonlet_node_disk_reads", "Disk reads the nodes served (disk hits).",
          st->node_disk[MOONLET_NODE_DISK_READS]);
    moonlet_prom_gauge(f, "moonlet_node_disk_read_errors", "Disk reads refused or failed.",
          st->node_disk[MOONLET_NODE_DISK_READ_ERRORS]);
    moonlet_prom_gauge(f, "moonlet_node_disk_io_errors", "Failed or short disk I/Os and syncs.",
          st->node_disk[MOONLET_NODE_DISK_IO_ERRORS]);
    moonlet_prom_gauge(f, "moonlet_node_disk_checksum_errors",
          "Disk reads whose bytes or header did not verify.",
          st->node_disk[MOONLET_NODE_DISK_CHECKSUM_ERRORS]);
    moonlet_prom_gauge(f, "moonlet_node_disk_inflight", "Disk I/Os in flight.",
          st->node_disk[MOONLET_NODE_DISK_INFLIGHT]);
    moonlet_prom_gauge(f, "moonlet_node_disk_queue_depth", "The most disk I/Os in flight.",
          st->node_disk[MOONLET_NODE_DISK_QUEUE_DEPTH]);
    moonlet_prom_counter(f, "moonlet_disk_evictions_total",
            "Disk-only objects evicted for a demotion's room.", st->disk_evictions);
    moonlet_prom_counter(f, "moonlet_disk_announced_total",
            "Objects restarted nodes' disks brought back.", st->disk_announced);

    /* ProbeResume (master/store/probe_resume.c) */
    moonlet_prom_counter(f, "moonlet_resume_calls_total", "ProbeResume calls (the K3 lookup in one call).",
            st->resume_calls);
    moonlet_prom_counter(f, "moonlet_resume_candidates_examined_total",
            "Candidates rechecked under their shard locks by ProbeResume.",
            st->resume_candidates_examined);
    moonlet_prom_counter(f, "moonlet_resume_recheck_fallbacks_total",
            "ProbeResume candidates that failed the recheck, so an earlier one was tried.",
            st->resume_recheck_fallbacks);
    moonlet_prom_family(f, "moonlet_resume_leases_granted_total", "counter",
           "Read leases granted by ProbeResume, by kind of key.");
    moonlet_prom_sample(f, "moonlet_resume_leases_granted_total", "{kind=\"kda\"}", st->leases_resume_kda);
    moonlet_prom_sample(f, "moonlet_resume_leases_granted_total", "{kind=\"kv\"}", st->leases_resume_kv);
    lock_hold(f, "moonlet_resume_lock_hold_seconds",
              "Time ProbeResume held a candidate's and its KV keys' shard locks (bucket counts "
              "only: the master keeps no sum).",
              st->resume_lock_hold_hist, "moonlet_resume_lock_hold_max_seconds",
              "Longest shard-lock hold by ProbeResume since the master started.",
              st->resume_lock_hold_max_ns);
}

char *moonlet_metrics_render(const moonlet_master_stats *st, size_t *len)
{
    return moonlet_prom_render(write_stats, st, len);
}

static void write_role(FILE *f, const void *arg)
{
    const moonlet_role_info *ri = arg;
    moonlet_prom_gauge(f, "moonlet_ha_role", "HA role: 0 single (no etcd), 1 standby, 2 leader.", ri->state);
    moonlet_prom_gauge(f, "moonlet_ha_serving", "1 while this master serves calls (a leader past its grace "
          "period and inside its fencing window, or a single master).", ri->serving);
    moonlet_prom_gauge(f, "moonlet_ha_epoch", "Epoch this master serves under, or the newest leader epoch "
          "it knows (the leader key's etcd create revision).", ri->epoch);
    moonlet_prom_gauge(f, "moonlet_ha_terms", "Times this master was elected leader.", ri->terms);
}

char *moonlet_metrics_render_role(const moonlet_role_info *ri, size_t *len)
{
    return moonlet_prom_render(write_role, ri, len);
}

static void write_repl(FILE *f, const void *arg)
{
    const moonlet_repl_log_status *st = arg;
    moonlet_prom_gauge(f, "moonlet_ha_repl_in_sync", "1 while the hot standby is in sync: writes wait for its "
          "acknowledgement (leader's view).", st->in_sync);
    moonlet_prom_gauge(f, "moonlet_ha_repl_lag_ms", "Age of the oldest replication record the standby has not "
          "acknowledged (ms).", st->lag_ms);
    moonlet_prom_gauge(f, "moonlet_ha_repl_acked", "The standby acknowledged every record below this number.",
          st->acked);
    moonlet_prom_gauge(f, "moonlet_ha_repl_next", "The number the next replication record gets.", st->next);
    moonlet_prom_gauge(f, "moonlet_ha_repl_out_of_sync_total", "Times the standby lagged past "
          "--repl-max-lag-ms and was marked out of sync.", st->out_of_sync_marks);
}

char *moonlet_metrics_render_repl(const moonlet_repl_log_status *st, size_t *len)
{
    return moonlet_prom_render(write_repl, st, len);
}

static void write_rpc(FILE *f, const void *arg)
{
    moonlet_prom_counter(f, "moonlet_rpc_reply_deadline_closes_total", "Connections reset because a "
          "reply was not taken within its deadline (a slow or stalled reader).",
          *(const uint64_t *)arg);
}

char *moonlet_metrics_render_rpc(uint64_t reply_deadline_closes, size_t *len)
{
    return moonlet_prom_render(write_rpc, &reply_deadline_closes, len);
}

static void write_refused(FILE *f, const void *arg)
{
    moonlet_prom_counter(f, "moonlet_rpc_permission_denied_total", "Calls refused with "
          "PERMISSION_DENIED: the credential's roles or tenants do not allow them.",
          *(const uint64_t *)arg);
}

char *moonlet_metrics_render_refused(uint64_t refused, size_t *len)
{
    return moonlet_prom_render(write_refused, &refused, len);
}

void moonlet_metrics_set_rpc(moonlet_metrics *s, const moonlet_rpc_server *rpc)
{
    if (s)
        atomic_store(&s->rpc, rpc);
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

/* The only page: /metrics (the stats, then the role's, the stream's and
 * the RPC server's). */
static char *metrics_page(void *arg, const char *path, unsigned *status, const char **type,
                          size_t *len)
{
    (void)type;
    moonlet_metrics *s = arg;
    if (strcmp(path, "/metrics") != 0) {
        *status = 404;
        return NULL;
    }
    moonlet_master_stats st;
    moonlet_master_get_stats(s->m, &st);
    char *body = moonlet_metrics_render(&st, len);
    if (!body)
        return NULL;
    const moonlet_role *role = atomic_load(&s->role);
    if (role) {
        moonlet_role_info ri;
        moonlet_role_get(role, moonlet_mono_ms(), &ri);
        size_t rlen = 0;
        char *rb = moonlet_metrics_render_role(&ri, &rlen);
        if (!(body = append_section(body, len, rb, rlen)))
            return NULL;
    }
    moonlet_repl_log *repl = atomic_load(&s->repl);
    if (repl) {
        moonlet_repl_log_status rs;
        moonlet_repl_log_get_status(repl, &rs);
        size_t rlen = 0;
        char *rb = moonlet_metrics_render_repl(&rs, &rlen);
        if (!(body = append_section(body, len, rb, rlen)))
            return NULL;
    }
    const moonlet_rpc_server *rpc = atomic_load(&s->rpc);
    if (rpc) {
        size_t rlen = 0;
        char *rb = moonlet_metrics_render_rpc(moonlet_rpc_server_reply_deadline_closes(rpc), &rlen);
        if (!(body = append_section(body, len, rb, rlen)))
            return NULL;
        rb = moonlet_metrics_render_refused(moonlet_rpc_server_refused(rpc), &rlen);
        if (!(body = append_section(body, len, rb, rlen)))
            return NULL;
    }
    return body;
}

int moonlet_metrics_start(moonlet_master *m, const char *address, uint16_t port,
                          const char *token, moonlet_metrics **out)
{
    return moonlet_metrics_start_tls(m, address, port, token, NULL, NULL, out);
}

int moonlet_metrics_start_tls(moonlet_master *m, const char *address, uint16_t port,
                              const char *token, const char *cert_file, const char *key_file,
                              moonlet_metrics **out)
{
    moonlet_metrics *s = calloc(1, sizeof(*s));
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    s->m = m;
    int rc = moonlet_http_start_tls("metrics", address, port, token, METRICS_MAX_CONNS,
                                    metrics_page, s, cert_file, key_file, &s->http);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return MOONLET_OK;
}

int moonlet_metrics_start_creds(moonlet_master *m, const char *address, uint16_t port,
                                const struct moonlet_cred_set *creds, const char *cert_file,
                                const char *key_file, moonlet_metrics **out)
{
    moonlet_metrics *s = calloc(1, sizeof(*s));
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    s->m = m;
    int rc = moonlet_http_start_creds("metrics", address, port, creds,
                                      MOONLET_ROLE_READER | MOONLET_ROLE_OPERATOR,
                                      METRICS_MAX_CONNS, metrics_page, s, cert_file, key_file,
                                      &s->http);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return MOONLET_OK;
}

uint16_t moonlet_metrics_port(const moonlet_metrics *s)
{
    return moonlet_http_port(s->http);
}

void moonlet_metrics_stop(moonlet_metrics *s)
{
    if (!s)
        return;
    moonlet_http_stop(s->http);
    free(s);
}
