/*
 * client_metrics.c - a client's counters and its /metrics and /health
 * endpoint (see client_metrics.h).
 *
 * Latencies are kept per operation as a histogram over CM_BUCKETS fixed
 * upper bounds (100 us .. 10 s, then +Inf) with their sum, exported as a
 * Prometheus histogram in seconds.  Errors are counted per (operation, code)
 * in a table of CM_MAX_ERRS entries; codes past it are counted under
 * code="other" so the table stays bounded.  Keys and bytes are also counted
 * per tenant, in a table of CM_MAX_TENANTS tenants (the first seen; later
 * ones under tenant="other").
 *
 * Locks: mu (the error and tenant tables; a leaf).  The rest is atomic.
 */
#include "client_metrics.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_server.h"
#include "monotime.h"
#include "moonlet/error.h"
#include "moonlet/types.h"

#define CM_BUCKETS 16
#define CM_MAX_ERRS 64
#define CM_MAX_TENANTS 32
#define CM_TENANT_BYTES (MOONLET_MAX_ID_BYTES + 1)

/* Upper bounds of the latency buckets, in microseconds (+Inf after). */
static const uint64_t cm_bound_us[CM_BUCKETS] = {100,    250,    500,     1000,    2500,   5000,
                                                 10000,  25000,  50000,   100000,  250000, 500000,
                                                 1000000, 2500000, 5000000, 10000000};

static const char *const cm_op_name[MOONLET_CM__OPS] = {"put", "get", "exist", "remove"};

struct cm_op_stats {
    _Atomic uint64_t calls;
    _Atomic uint64_t keys;     /* keys attempted */
    _Atomic uint64_t ok;       /* keys done (a get or exist: hits) */
    _Atomic uint64_t misses;   /* get / exist: OBJECT_NOT_FOUND or not there */
    _Atomic uint64_t errors;   /* any other outcome */
    _Atomic uint64_t bytes;    /* put: stored, get: read */
    _Atomic uint64_t lat_ns;   /* sum of call latencies */
    _Atomic uint64_t lat[CM_BUCKETS + 1]; /* per bucket (not cumulative); last: +Inf */
};

struct cm_err {
    int op;
    int code;
    uint64_t count;
};

/* A key's outcome, per tenant. */
enum { CM_OK = 0, CM_MISS, CM_ERROR, CM__OUTCOMES };
static const char *const cm_outcome_name[CM__OUTCOMES] = {"ok", "miss", "error"};

struct cm_tenant {
    char name[CM_TENANT_BYTES];
    uint64_t keys[MOONLET_CM__OPS][CM__OUTCOMES];
    uint64_t bytes[MOONLET_CM__OPS];
};

struct moonlet_client_metrics {
    struct cm_op_stats ops[MOONLET_CM__OPS];
    pthread_mutex_t mu;
    struct cm_err errs[CM_MAX_ERRS];
    size_t nerrs;
    uint64_t errs_other[MOONLET_CM__OPS]; /* codes past the table */
    struct cm_tenant tenants[CM_MAX_TENANTS];
    size_t ntenants;
    struct cm_tenant tenant_other;        /* tenants past the table */
    char default_tenant[CM_TENANT_BYTES]; /* the name of a call's NULL tenant */
    uint64_t started_ms;
    moonlet_http_server *http;
};

uint64_t moonlet_cm_begin(const moonlet_client_metrics *m)
{
    return m ? moonlet_mono_ns() : 0;
}

void moonlet_cm_call(moonlet_client_metrics *m, moonlet_cm_op op, uint64_t t0)
{
    if (!m)
        return;
    struct cm_op_stats *s = &m->ops[op];
    uint64_t ns = moonlet_mono_ns() - t0, us = ns / 1000;
    unsigned b = 0;
    while (b < CM_BUCKETS && us > cm_bound_us[b])
        b++;
    atomic_fetch_add_explicit(&s->calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->lat_ns, ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->lat[b], 1, memory_order_relaxed);
}

static void cm_error(moonlet_client_metrics *m, moonlet_cm_op op, int code)
{
    pthread_mutex_lock(&m->mu);
    size_t i = 0;
    while (i < m->nerrs && (m->errs[i].op != (int)op || m->errs[i].code != code))
        i++;
    if (i < m->nerrs) {
        m->errs[i].count++;
    } else if (m->nerrs < CM_MAX_ERRS) {
        m->errs[m->nerrs++] = (struct cm_err){.op = (int)op, .code = code, .count = 1};
    } else {
        m->errs_other[op]++;
    }
    pthread_mutex_unlock(&m->mu);
}

/* The tenant's entry (mu held): found, a new one, or "other". */
static struct cm_tenant *cm_tenant_locked(moonlet_client_metrics *m, const char *tenant)
{
    if (!tenant || !*tenant)
        tenant = m->default_tenant;
    for (size_t i = 0; i < m->ntenants; i++)
        if (strcmp(m->tenants[i].name, tenant) == 0)
            return &m->tenants[i];
    if (m->ntenants == CM_MAX_TENANTS || strlen(tenant) >= CM_TENANT_BYTES)
        return &m->tenant_other;
    struct cm_tenant *t = &m->tenants[m->ntenants++];
    strcpy(t->name, tenant);
    return t;
}

static void cm_count_tenant(moonlet_client_metrics *m, moonlet_cm_op op, const char *tenant,
                            int outcome, uint64_t bytes)
{
    pthread_mutex_lock(&m->mu);
    struct cm_tenant *t = cm_tenant_locked(m, tenant);
    t->keys[op][outcome]++;
    t->bytes[op] += bytes;
    pthread_mutex_unlock(&m->mu);
}

void moonlet_cm_key(moonlet_client_metrics *m, moonlet_cm_op op, const char *tenant, int rc,
                    uint64_t bytes, int found)
{
    /* a read that only learned the object's size (the copying batches ask
     * with no room first) is not a get of its own: the retry is counted */
    if (!m || (op == MOONLET_CM_GET && rc == MOONLET_ERR_BUFFER_OVERFLOW))
        return;
    struct cm_op_stats *s = &m->ops[op];
    atomic_fetch_add_explicit(&s->keys, 1, memory_order_relaxed);
    bool lookup = op == MOONLET_CM_GET || op == MOONLET_CM_EXIST;
    if (rc == MOONLET_OK && found) {
        atomic_fetch_add_explicit(&s->ok, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->bytes, bytes, memory_order_relaxed);
        cm_count_tenant(m, op, tenant, CM_OK, bytes);
    } else if (lookup && (rc == MOONLET_OK || rc == MOONLET_ERR_OBJECT_NOT_FOUND)) {
        atomic_fetch_add_explicit(&s->misses, 1, memory_order_relaxed);
        cm_count_tenant(m, op, tenant, CM_MISS, 0);
    } else if (rc != MOONLET_OK) {
        atomic_fetch_add_explicit(&s->errors, 1, memory_order_relaxed);
        cm_error(m, op, rc);
        cm_count_tenant(m, op, tenant, CM_ERROR, 0);
    } else {
        cm_count_tenant(m, op, tenant, CM_OK, 0); /* a put or remove with found 0: done */
    }
}

/* ---- /metrics ----------------------------------------------------------------- */

static uint64_t ld(_Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* One counter family with a sample per operation that counts it. */
static void per_op(FILE *f, moonlet_client_metrics *m, const char *name, const char *help,
                   size_t field, unsigned ops_mask)
{
    moonlet_prom_family(f, name, "counter", help);
    for (unsigned op = 0; op < MOONLET_CM__OPS; op++) {
        if (!(ops_mask & (1u << op)))
            continue;
        char labels[32];
        snprintf(labels, sizeof(labels), "{op=\"%s\"}", cm_op_name[op]);
        moonlet_prom_sample(f, name, labels, ld((_Atomic uint64_t *)((char *)&m->ops[op] + field)));
    }
}

/* A label value, escaped as the text format wants (\\, \", \n). */
static void cm_label(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            fputc('\\', f);
        if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
}

static void write_metrics(FILE *f, const void *arg)
{
    moonlet_client_metrics *m = (moonlet_client_metrics *)arg;
    const unsigned all = (1u << MOONLET_CM__OPS) - 1;
    const unsigned lookups = (1u << MOONLET_CM_GET) | (1u << MOONLET_CM_EXIST);
    moonlet_prom_counter(f, "moonlet_client_puts_total", "Keys this client stored (puts done).",
                         ld(&m->ops[MOONLET_CM_PUT].ok));
    moonlet_prom_counter(f, "moonlet_client_put_bytes_total", "Bytes this client stored.",
                         ld(&m->ops[MOONLET_CM_PUT].bytes));
    moonlet_prom_counter(f, "moonlet_client_gets_total", "Keys this client asked to read.",
                         ld(&m->ops[MOONLET_CM_GET].keys));
    moonlet_prom_counter(f, "moonlet_client_get_bytes_total", "Bytes this client read.",
                         ld(&m->ops[MOONLET_CM_GET].bytes));
    per_op(f, m, "moonlet_client_hits_total", "Reads and existence checks that found the key.",
           offsetof(struct cm_op_stats, ok), lookups);
    per_op(f, m, "moonlet_client_misses_total",
           "Reads and existence checks that did not find the key.",
           offsetof(struct cm_op_stats, misses), lookups);
    per_op(f, m, "moonlet_client_requests_total",
           "Keys asked per operation (a batch counts each key).",
           offsetof(struct cm_op_stats, keys), all);
    per_op(f, m, "moonlet_client_failures_total",
           "Keys that failed per operation (misses not included).",
           offsetof(struct cm_op_stats, errors), all);

    moonlet_prom_family(f, "moonlet_client_latency_seconds", "histogram",
                        "Latency of the client's calls (a batch is one call).");
    for (unsigned op = 0; op < MOONLET_CM__OPS; op++) {
        struct cm_op_stats *s = &m->ops[op];
        uint64_t cum = 0;
        for (unsigned b = 0; b < CM_BUCKETS; b++) {
            cum += ld(&s->lat[b]);
            fprintf(f, "moonlet_client_latency_seconds_bucket{op=\"%s\",le=\"%g\"} %" PRIu64 "\n",
                    cm_op_name[op], (double)cm_bound_us[b] * 1e-6, cum);
        }
        cum += ld(&s->lat[CM_BUCKETS]);
        fprintf(f, "moonlet_client_latency_seconds_bucket{op=\"%s\",le=\"+Inf\"} %" PRIu64 "\n",
                cm_op_name[op], cum);
        fprintf(f, "moonlet_client_latency_seconds_sum{op=\"%s\"} %.9f\n", cm_op_name[op],
                (double)ld(&s->lat_ns) * 1e-9);
        fprintf(f, "moonlet_client_latency_seconds_count{op=\"%s\"} %" PRIu64 "\n",
                cm_op_name[op], cum);
    }

    moonlet_prom_family(f, "moonlet_client_errors_total", "counter",
                        "Failed keys by operation and Mooncake error code.");
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->nerrs; i++)
        fprintf(f, "moonlet_client_errors_total{op=\"%s\",code=\"%d\",name=\"%s\"} %" PRIu64 "\n",
                cm_op_name[m->errs[i].op], m->errs[i].code, moonlet_strerror(m->errs[i].code),
                m->errs[i].count);
    for (unsigned op = 0; op < MOONLET_CM__OPS; op++)
        if (m->errs_other[op])
            fprintf(f, "moonlet_client_errors_total{op=\"%s\",code=\"other\",name=\"other\"} "
                       "%" PRIu64 "\n", cm_op_name[op], m->errs_other[op]);
    pthread_mutex_unlock(&m->mu);
    moonlet_prom_family(f, "moonlet_client_tenant_keys_total", "counter",
                        "Keys per tenant, operation and outcome (ok, miss, error).");
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i <= m->ntenants; i++) {
        const struct cm_tenant *t = i < m->ntenants ? &m->tenants[i] : &m->tenant_other;
        for (unsigned op = 0; op < MOONLET_CM__OPS; op++)
            for (unsigned o = 0; o < CM__OUTCOMES; o++)
                if (t->keys[op][o]) {
                    fputs("moonlet_client_tenant_keys_total{tenant=\"", f);
                    cm_label(f, i < m->ntenants ? t->name : "other");
                    fprintf(f, "\",op=\"%s\",outcome=\"%s\"} %" PRIu64 "\n", cm_op_name[op],
                            cm_outcome_name[o], t->keys[op][o]);
                }
    }
    moonlet_prom_family(f, "moonlet_client_tenant_bytes_total", "counter",
                        "Bytes stored (put) and read (get) per tenant.");
    for (size_t i = 0; i <= m->ntenants; i++) {
        const struct cm_tenant *t = i < m->ntenants ? &m->tenants[i] : &m->tenant_other;
        for (unsigned op = MOONLET_CM_PUT; op <= MOONLET_CM_GET; op++)
            if (t->bytes[op]) {
                fputs("moonlet_client_tenant_bytes_total{tenant=\"", f);
                cm_label(f, i < m->ntenants ? t->name : "other");
                fprintf(f, "\",op=\"%s\"} %" PRIu64 "\n", cm_op_name[op], t->bytes[op]);
            }
    }
    pthread_mutex_unlock(&m->mu);
    moonlet_prom_gauge(f, "moonlet_client_uptime_seconds", "Seconds since the client started.",
                       (moonlet_mono_ms() - m->started_ms) / 1000);
}

char *moonlet_client_metrics_render(moonlet_client_metrics *m, size_t *len)
{
    return moonlet_prom_render(write_metrics, m, len);
}

static char *cm_page(void *arg, const char *path, unsigned *status, const char **type,
                     size_t *len)
{
    if (strcmp(path, "/metrics") == 0)
        return moonlet_client_metrics_render(arg, len);
    if (strcmp(path, "/health") == 0) {
        *type = "text/plain; charset=utf-8";
        *len = 3;
        return strdup("OK\n");
    }
    *status = 404;
    return NULL;
}

int moonlet_client_metrics_start(const moonlet_client_config *cfg, moonlet_client_metrics **out)
{
    *out = NULL;
    if (!cfg->http_server)
        return MOONLET_OK;
    moonlet_client_metrics *m = calloc(1, sizeof(*m));
    if (!m)
        return MOONLET_ERR_INTERNAL_ERROR;
    pthread_mutex_init(&m->mu, NULL);
    m->started_ms = moonlet_mono_ms();
    const char *dt = cfg->default_tenant && *cfg->default_tenant ? cfg->default_tenant : "default";
    snprintf(m->default_tenant, sizeof(m->default_tenant), "%s", dt);
    const char *addr = cfg->http_address && *cfg->http_address ? cfg->http_address : "0.0.0.0";
    int rc = moonlet_http_start("the client's metrics", addr, cfg->http_port, cfg->auth_token,
                                MOONLET_CLIENT_HTTP_MAX_CONNS, cm_page, m, &m->http);
    if (rc) {
        pthread_mutex_destroy(&m->mu);
        free(m);
        return rc;
    }
    *out = m;
    return MOONLET_OK;
}

uint16_t moonlet_client_metrics_port(const moonlet_client_metrics *m)
{
    return m ? moonlet_http_port(m->http) : 0;
}

void moonlet_client_metrics_stop(moonlet_client_metrics *m)
{
    if (!m)
        return;
    moonlet_http_stop(m->http); /* no scrape runs after this */
    pthread_mutex_destroy(&m->mu);
    free(m);
}
