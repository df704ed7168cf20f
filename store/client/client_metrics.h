/*
 * client_metrics.h - a client's own counters and, when its config asks
 * (http_server), its HTTP endpoint: GET /metrics (Prometheus text: puts,
 * gets, bytes, hits, misses, latency histograms, errors by code) and
 * GET /health, served by common/http_server.c (Mooncake's client HTTP
 * server, enable_client_http_server / client_http_port).
 *
 * Owns: the counters (atomics), the error-code and tenant tables and the
 * endpoint.
 * store/client/client_api.c records every call of the public API here; a
 * client without the endpoint has no metrics object and pays nothing.
 *
 * Locks: errs_mu guards the error-code table and the tenant table (a leaf,
 * held for a lookup and an increment, or while a scrape prints them);
 * everything else is atomic.
 */
#ifndef MOONLET_CLIENT_METRICS_H
#define MOONLET_CLIENT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "moonlet/client.h"

/* The calls counted, by what they do (a batch counts each of its keys, and
 * its latency once). */
typedef enum moonlet_cm_op {
    MOONLET_CM_PUT = 0, /* put, put_from, upsert, batch_put_from */
    MOONLET_CM_GET,     /* get, get_into, get_alloc, batch_get_into */
    MOONLET_CM_EXIST,   /* exist_key, batch_exist_key */
    MOONLET_CM_REMOVE,  /* remove, remove_force */
    MOONLET_CM__OPS
} moonlet_cm_op;

typedef struct moonlet_client_metrics moonlet_client_metrics;

/* Connections the endpoint serves at once (a quarter from one address). */
#define MOONLET_CLIENT_HTTP_MAX_CONNS 64u

/* Starts the endpoint cfg asks for (cfg->http_server) on cfg->http_address
 * (NULL: every IPv4 address) and cfg->http_port (0: a free one), with the
 * cluster token cfg->auth_token.  *out NULL when cfg asks for none.  Returns
 * 0, INVALID_PARAMS (bad address), INTERNAL_ERROR (cannot listen, logged). */
int moonlet_client_metrics_start(const moonlet_client_config *cfg, moonlet_client_metrics **out);
/* Stops the endpoint and frees everything; NULL is a no-op. */
void moonlet_client_metrics_stop(moonlet_client_metrics *m);
/* The endpoint's port. */
uint16_t moonlet_client_metrics_port(const moonlet_client_metrics *m);

/* The clock a call's latency starts from (0 for a NULL m: nothing recorded). */
uint64_t moonlet_cm_begin(const moonlet_client_metrics *m);
/* A call ended: its latency since t0 (moonlet_cm_begin), once per call. */
void moonlet_cm_call(moonlet_client_metrics *m, moonlet_cm_op op, uint64_t t0);
/* One key's outcome: rc 0 with `bytes` moved (a get: a hit; an exist:
 * `found` says hit or miss), OBJECT_NOT_FOUND (a get or exist: a miss), any
 * other code an error of op, but a get's BUFFER_OVERFLOW (the size learned,
 * the read retried) is not counted.  Also counted for its tenant (NULL or
 * "": the client's default tenant).  NULL m: nothing. */
void moonlet_cm_key(moonlet_client_metrics *m, moonlet_cm_op op, const char *tenant, int rc,
                    uint64_t bytes, int found);

/* The /metrics text of m (malloc'd, NUL-terminated; length in *len), NULL
 * when out of memory.  For tests and the endpoint. */
char *moonlet_client_metrics_render(moonlet_client_metrics *m, size_t *len);

#endif
