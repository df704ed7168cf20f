/*
 * metrics.h - the master's statistics over HTTP in the Prometheus text
 * exposition format (version 0.0.4), for scraping.
 *
 * Owns its HTTP endpoint (common/http_server.c: libmicrohttpd, one internal
 * polling thread, bounded connections).  GET or HEAD /metrics answers with
 * the current moonlet_master_stats; any other path is 404 and any other
 * method 405.  With a cluster token, a scrape must carry
 * it as "Authorization: Bearer <token>" (Prometheus: `authorization:
 * credentials_file`); anything else is 401, so the statistics are no more
 * open than the RPC port they describe.  Nothing here is needed by the client
 * library: only the moonlet-master daemon links it.
 *
 * Locks: takes no master lock itself; each scrape calls
 * moonlet_master_get_stats(), which reads atomic counters and briefly takes
 * the segment registry lock.
 */
#ifndef MOONLET_METRICS_H
#define MOONLET_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "master.h"
#include "repl_stream.h"
#include "role.h"

typedef struct moonlet_metrics moonlet_metrics;

/* Serves `m` (which must outlive the server) on address:port; port 0 picks a
 * free port (see moonlet_metrics_port).  `token` (NULL or "": none) is copied.  Returns 0, INVALID_PARAMS for an
 * address that does not resolve, or INTERNAL_ERROR when it cannot listen
 * (port in use, for example; the reason is logged). */
int moonlet_metrics_start(moonlet_master *m, const char *address, uint16_t port,
                          const char *token, moonlet_metrics **out);
/* As moonlet_metrics_start, over HTTPS with cert_file and key_file (PEM;
 * NULL: HTTP) - moonlet-master's --tls-cert and --tls-key. */
int moonlet_metrics_start_tls(moonlet_master *m, const char *address, uint16_t port,
                              const char *token, const char *cert_file, const char *key_file,
                              moonlet_metrics **out);
/* As moonlet_metrics_start_tls, but a scrape must carry the token of a
 * credential of `creds` (common/cred.h) with the reader or operator role. */
struct moonlet_cred_set;
int moonlet_metrics_start_creds(moonlet_master *m, const char *address, uint16_t port,
                                const struct moonlet_cred_set *creds, const char *cert_file,
                                const char *key_file, moonlet_metrics **out);
/* The port the server listens on. */
uint16_t moonlet_metrics_port(const moonlet_metrics *s);
/* With HA: also export the role (moonlet_ha_role 0 single / 1 standby /
 * 2 leader, moonlet_ha_serving, moonlet_ha_epoch, moonlet_ha_terms).  NULL
 * metrics is a no-op; `role` must outlive the server. */
void moonlet_metrics_set_role(moonlet_metrics *s, const moonlet_role *role);
/* Renders the role's gauges (the text appended to /metrics with a role):
 * malloc'd, NULL when out of memory. */
char *moonlet_metrics_render_role(const moonlet_role_info *ri, size_t *len);
/* With a hot standby (repl_stream.h): also export the leader's view of it
 * (moonlet_ha_repl_in_sync, moonlet_ha_repl_lag_ms, moonlet_ha_repl_acked,
 * moonlet_ha_repl_next, moonlet_ha_repl_out_of_sync_total).  `log` must
 * outlive the server; NULL: none. */
void moonlet_metrics_set_repl(moonlet_metrics *s, moonlet_repl_log *log);
char *moonlet_metrics_render_repl(const moonlet_repl_log_status *st, size_t *len);
struct moonlet_rpc_server;
/* The control plane's RPC server (transport/rpc_server.h): also export
 * moonlet_rpc_reply_deadline_closes_total, the connections reset because a
 * reply was not taken within its deadline (a slow or stalled reader).
 * `rpc` must outlive the server; NULL: none. */
void moonlet_metrics_set_rpc(moonlet_metrics *s, const struct moonlet_rpc_server *rpc);
char *moonlet_metrics_render_rpc(uint64_t reply_deadline_closes, size_t *len);
/* moonlet_rpc_permission_denied_total: calls refused for their credential's
 * roles or tenants (rpc_server.h, Roles), shown with the RPC server's section. */
char *moonlet_metrics_render_refused(uint64_t refused, size_t *len);
/* Stops the server (waits for a scrape in progress) and frees it; NULL is a no-op. */
void moonlet_metrics_stop(moonlet_metrics *s);

/* Renders `st` as the /metrics body.  Returns a malloc'd NUL-terminated text
 * (its length in *len when len is not NULL), or NULL when out of memory. */
char *moonlet_metrics_render(const moonlet_master_stats *st, size_t *len);

#endif
