/*
 * http_server.h - a small HTTP endpoint for scraping (libmicrohttpd) and the
 * Prometheus text format (version 0.0.4) helpers its pages are written with.
 * Used by the master's /metrics (master/service/metrics.c) and the client's /metrics
 * and /health (store/client/client_metrics.c).
 *
 * Owns the libmicrohttpd daemon (one internal polling thread) and a copy of
 * the token.  GET or HEAD of a path is answered by the caller's page
 * function; a path it does not know is 404, any other method 405.  With a
 * token, every request must carry "Authorization: Bearer <token>" (compared
 * in constant time), else 401.  Connections are bounded: at most
 * `max_conns` at once (a quarter of them from one address), each closed after
 * MOONLET_HTTP_IDLE_S seconds without a request, so idle connections cannot
 * starve a scrape.
 *
 * Locks: none of its own; the page function runs on the daemon's thread and
 * takes what it needs.
 */
#ifndef MOONLET_HTTP_SERVER_H
#define MOONLET_HTTP_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MOONLET_HTTP_IDLE_S 3u

typedef struct moonlet_http_server moonlet_http_server;

/* Renders the page at `path` (a GET or HEAD): a malloc'd body and its length,
 * with *status (200 unless set) and its content type (a static string; NULL:
 * the Prometheus text type); NULL with *status 404 for an unknown path, or
 * NULL with *status left 200 when out of memory (the connection is closed). */
typedef char *(*moonlet_http_page_fn)(void *arg, const char *path, unsigned *status,
                                      const char **content_type, size_t *len);

/* Serves pages from `page(arg, ...)` on address:port (port 0: a free port,
 * see moonlet_http_port); `what` names the server in log lines ("metrics").
 * `token` (NULL or "": none) is copied.  Returns 0, INVALID_PARAMS for an
 * address that does not resolve or max_conns 0, or INTERNAL_ERROR when it
 * cannot listen (port in use, for example; logged). */
int moonlet_http_start(const char *what, const char *address, uint16_t port, const char *token,
                       unsigned max_conns, moonlet_http_page_fn page, void *arg,
                       moonlet_http_server **out);
/* As moonlet_http_start, over HTTPS when cert_file is set: its PEM
 * certificate chain and key_file's key are read now (a certificate renewed
 * later is taken by starting the server again: the master does on SIGHUP).
 * Clients authenticate with the token, as over HTTP.  INVALID_PARAMS also
 * for a file that cannot be read or a libmicrohttpd built without TLS. */
int moonlet_http_start_tls(const char *what, const char *address, uint16_t port,
                           const char *token, unsigned max_conns, moonlet_http_page_fn page,
                           void *arg, const char *cert_file, const char *key_file,
                           moonlet_http_server **out);
/* As moonlet_http_start_tls (cert_file NULL: HTTP), but a request must
 * carry the token of a credential of `creds` (cred.h) that holds one of
 * `roles` (the master's /metrics: reader or operator); creds must outlive
 * the server. */
struct moonlet_cred_set;
int moonlet_http_start_creds(const char *what, const char *address, uint16_t port,
                             const struct moonlet_cred_set *creds, uint32_t roles,
                             unsigned max_conns, moonlet_http_page_fn page, void *arg,
                             const char *cert_file, const char *key_file,
                             moonlet_http_server **out);
/* The port the server listens on. */
uint16_t moonlet_http_port(const moonlet_http_server *s);
/* Stops the server (waits for a request in progress) and frees it; NULL is a no-op. */
void moonlet_http_stop(moonlet_http_server *s);

/* ---- Prometheus text ------------------------------------------------------- */

/* "# HELP name help" and "# TYPE name type". */
void moonlet_prom_family(FILE *f, const char *name, const char *type, const char *help);
/* "name{labels} v" (labels "" or "{a=\"b\"}"). */
void moonlet_prom_sample(FILE *f, const char *name, const char *labels, uint64_t v);
/* A family of one sample. */
void moonlet_prom_gauge(FILE *f, const char *name, const char *help, uint64_t v);
void moonlet_prom_counter(FILE *f, const char *name, const char *help, uint64_t v);
/* Runs write(f, arg) on a memory stream: its text (malloc'd, NUL-terminated,
 * length in *len when len is not NULL), or NULL when the stream failed. */
char *moonlet_prom_render(void (*write)(FILE *f, const void *arg), const void *arg, size_t *len);

#endif
