/*
 * http_server.c - the scraping endpoint and the Prometheus text helpers.
 * See http_server.h.  No locks of its own.
 */
#include "http_server.h"

#include <inttypes.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "cred.h"
#include "log.h"
#include "moonlet/error.h"
#include "net.h"
#include "token.h"

#define MOD "http"
#define PROM_TYPE "text/plain; version=0.0.4; charset=utf-8"
#define MAX_PEM (256u << 10) /* a certificate chain or key file */

struct moonlet_http_server {
    struct MHD_Daemon *d;
    uint16_t port;
    char *token; /* NULL: requests need no credentials */
    const moonlet_cred_set *creds; /* instead of token: a credential with one of `roles` */
    uint32_t roles;
    char *cert_pem, *key_pem; /* HTTPS: what the daemon serves with; NULL: HTTP */
    moonlet_http_page_fn page;
    void *arg;
};

/* ---- Prometheus text ------------------------------------------------------------ */

void moonlet_prom_family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void moonlet_prom_sample(FILE *f, const char *name, const char *labels, uint64_t v)
{
    fprintf(f, "%s%s %" PRIu64 "\n", name, labels, v);
}

void moonlet_prom_gauge(FILE *f, const char *name, const char *help, uint64_t v)
{
    moonlet_prom_family(f, name, "gauge", help);
    moonlet_prom_sample(f, name, "", v);
}

void moonlet_prom_counter(FILE *f, const char *name, const char *help, uint64_t v)
{
    moonlet_prom_family(f, name, "counter", help);
    moonlet_prom_sample(f, name, "", v);
}

char *moonlet_prom_render(void (*write)(FILE *f, const void *arg), const void *arg, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return NULL;
    write(f, arg);
    if (fclose(f) != 0) { /* buf and n are final only after fclose */
        free(buf);
        return NULL;
    }
    if (len)
        *len = n;
    return buf;
}

/* ---- HTTP ------------------------------------------------------------------------- */

/* Queues a text response; `extra_header` (NULL: none) is a "Name", value pair. */
static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned status, char *body,
                                    size_t len, enum MHD_ResponseMemoryMode mode,
                                    const char *type, const char *const *extra_header)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (extra_header)
        MHD_add_response_header(r, extra_header[0], extra_header[1]);
    enum MHD_Result ret = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* With a token: "Authorization: Bearer <token>", compared in constant time. */
static bool authorized(const moonlet_http_server *s, struct MHD_Connection *conn)
{
    if (!s->token && !s->creds)
        return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_AUTHORIZATION);
    static const char bearer[] = "Bearer ";
    if (!h || strncmp(h, bearer, sizeof(bearer) - 1) != 0)
        return false;
    h += sizeof(bearer) - 1;
    if (s->creds) {
        const moonlet_cred *c = moonlet_cred_find(s->creds, h, strlen(h));
        return c && (c->roles & s->roles);
    }
    return moonlet_token_equal(h, strlen(h), s->token, strlen(s->token));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **req_cls)
{
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)req_cls;
    moonlet_http_server *s = cls;
    static char not_found[] = "not found\n";
    static char not_allowed[] = "method not allowed\n";
    static char unauthorized[] =
        "unauthorized: send the cluster token as \"Authorization: Bearer <token>\"\n";
    static const char *const challenge[] = {MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                            "Bearer realm=\"moonlet\""};
    static const char plain[] = "text/plain; charset=utf-8";
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, not_allowed,
                            sizeof(not_allowed) - 1, MHD_RESPMEM_PERSISTENT, plain, NULL);
    if (!authorized(s, conn))
        return respond_text(conn, MHD_HTTP_UNAUTHORIZED, unauthorized, sizeof(unauthorized) - 1,
                            MHD_RESPMEM_PERSISTENT, plain, challenge);
    unsigned status = MHD_HTTP_OK;
    const char *type = NULL;
    size_t len = 0;
    char *body = s->page(s->arg, url, &status, &type, &len);
    if (!body && status == MHD_HTTP_NOT_FOUND)
        return respond_text(conn, MHD_HTTP_NOT_FOUND, not_found, sizeof(not_found) - 1,
                            MHD_RESPMEM_PERSISTENT, plain, NULL);
    if (!body)
        return MHD_NO;
    return respond_text(conn, status, body, len, MHD_RESPMEM_MUST_FREE,
                        type ? type : status == MHD_HTTP_OK ? PROM_TYPE : plain, NULL);
}

/* A whole (small) file, NUL-terminated, or NULL (logged). */
static char *read_pem(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf = NULL;
    size_t n = 0;
    if (f) {
        buf = malloc(MAX_PEM + 1);
        n = buf ? fread(buf, 1, MAX_PEM + 1, f) : 0;
        fclose(f);
    }
    if (!buf || n == 0 || n > MAX_PEM) {
        ML_ERR(MOD, "cannot read %s (or larger than %u bytes)", path, MAX_PEM);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static void free_server(moonlet_http_server *s)
{
    moonlet_token_free(s->token);
    if (s->key_pem)
        memset(s->key_pem, 0, strlen(s->key_pem));
    free(s->key_pem);
    free(s->cert_pem);
    free(s);
}

/* A token, or credentials with roles (or neither); over HTTPS with
 * cert_file and key_file. */
static int http_start(const char *what, const char *address, uint16_t port, const char *token,
                      const moonlet_cred_set *creds, uint32_t roles, unsigned max_conns,
                      moonlet_http_page_fn page, void *arg, const char *cert_file,
                      const char *key_file, moonlet_http_server **out)
{
    struct sockaddr_storage sa;
    socklen_t sa_len;
    if (!max_conns || !page || moonlet_net_resolve(address, port, true, &sa, &sa_len) ||
        (cert_file && !key_file))
        return MOONLET_ERR_INVALID_PARAMS;
    if (cert_file && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        ML_ERR(MOD, "this libmicrohttpd has no TLS: cannot serve %s over HTTPS", what);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    moonlet_http_server *s = calloc(1, sizeof(*s));
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    if (cert_file && (!(s->cert_pem = read_pem(cert_file)) || !(s->key_pem = read_pem(key_file)))) {
        free_server(s);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    s->page = page;
    s->arg = arg;
    s->creds = creds;
    s->roles = roles;
    if (token && *token && !(s->token = strdup(token))) {
        free_server(s);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    unsigned per_ip = max_conns / 4 ? max_conns / 4 : 1;
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | (sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    if (s->cert_pem)
        flags |= MHD_USE_TLS;
    s->d = MHD_start_daemon(flags, port, NULL, NULL, on_request, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_LIMIT, max_conns,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
                            MHD_OPTION_CONNECTION_TIMEOUT, MOONLET_HTTP_IDLE_S,
                            /* the TLS options only with MHD_USE_TLS, else the list ends */
                            s->cert_pem ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END,
                            s->cert_pem, MHD_OPTION_HTTPS_MEM_KEY, s->key_pem,
                            MHD_OPTION_END);
    if (!s->d) {
        ML_ERR(MOD, "cannot serve %s on %s:%u (port in use%s?)", what, address, port,
               s->cert_pem ? ", or a certificate libmicrohttpd cannot load" : "");
        free_server(s);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = info ? info->port : port;
    *out = s;
    return MOONLET_OK;
}

int moonlet_http_start(const char *what, const char *address, uint16_t port, const char *token,
                       unsigned max_conns, moonlet_http_page_fn page, void *arg,
                       moonlet_http_server **out)
{
    return http_start(what, address, port, token, NULL, 0, max_conns, page, arg, NULL, NULL, out);
}

int moonlet_http_start_tls(const char *what, const char *address, uint16_t port,
                           const char *token, unsigned max_conns, moonlet_http_page_fn page,
                           void *arg, const char *cert_file, const char *key_file,
                           moonlet_http_server **out)
{
    return http_start(what, address, port, token, NULL, 0, max_conns, page, arg, cert_file,
                      key_file, out);
}

int moonlet_http_start_creds(const char *what, const char *address, uint16_t port,
                             const moonlet_cred_set *creds, uint32_t roles, unsigned max_conns,
                             moonlet_http_page_fn page, void *arg, const char *cert_file,
                             const char *key_file, moonlet_http_server **out)
{
    if (!creds || !roles)
        return MOONLET_ERR_INVALID_PARAMS;
    return http_start(what, address, port, NULL, creds, roles, max_conns, page, arg, cert_file,
                      key_file, out);
}

uint16_t moonlet_http_port(const moonlet_http_server *s)
{
    return s->port;
}

void moonlet_http_stop(moonlet_http_server *s)
{
    if (!s)
        return;
    MHD_stop_daemon(s->d);
    free_server(s);
}
