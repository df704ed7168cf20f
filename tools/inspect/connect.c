/*
 * connect.c - how moonlet-inspect reaches the master: opens the MasterClient
 * from --master and --auth-token-file, and turns failures into the one-line
 * errors and exit codes described in inspect.h; runs the one-shot renderers
 * (connect, render, close).
 *
 * MasterClient's create makes a round trip, so a master that is down, a
 * wrong port or a refused token all show here, before any command runs.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "inspect.h"
#include "log.h"
#include "moonlet/error.h"
#include "moonlet/types.h"
#include "tls.h"
#include "token.h"

void inspect_error(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fflush(stdout); /* keep the order of stdout and stderr on a terminal */
    fprintf(stderr, "moonlet-inspect: %s\n", msg);
}

const char *inspect_tenant(const inspect_opts *o)
{
    return o->tenant && o->tenant[0] ? o->tenant : MOONLET_DEFAULT_TENANT;
}

int inspect_rpc_failed(const char *what, int rc)
{
    inspect_error("%s: %s (%d)", what, moonlet_strerror(rc), rc);
    return INSPECT_EXIT_RUNTIME;
}

int inspect_tls(const inspect_opts *o, moonlet_tls_ctx **out)
{
    *out = NULL;
    if (!o->tls_ca && !o->tls_cert && !o->tls_key)
        return INSPECT_EXIT_OK;
    if (!o->tls_ca || !o->tls_cert != !o->tls_key) {
        inspect_error("--tls-ca is required with TLS, and --tls-cert and --tls-key go together");
        return INSPECT_EXIT_USAGE;
    }
    moonlet_tls_files f = {.cert = o->tls_cert, .key = o->tls_key, .ca = o->tls_ca};
    if (moonlet_tls_ctx_create(false, &f, out) != MOONLET_OK) {
        inspect_error("--tls-ca/--tls-cert/--tls-key: the files do not load (see above)");
        return INSPECT_EXIT_USAGE;
    }
    return INSPECT_EXIT_OK;
}

int inspect_connect(const inspect_opts *o, moonlet_master_client **out)
{
    char *token = NULL;
    moonlet_tls_ctx *tls = NULL;
    int tex = inspect_tls(o, &tls);
    if (tex)
        return tex;
    if (o->token_file) {
        FILE *f = fopen(o->token_file, "r");
        if (!f) {
            inspect_error("--auth-token-file %s: %s", o->token_file, strerror(errno));
            moonlet_tls_ctx_unref(tls);
            return INSPECT_EXIT_USAGE;
        }
        fclose(f);
        /* the reader's own log lines would make a second line: keep them quiet */
        int level = moonlet_log_get_level();
        moonlet_log_set_level(-1);
        int rc = moonlet_token_read(o->token_file, &token);
        moonlet_log_set_level(level);
        if (rc != MOONLET_OK) {
            inspect_error("--auth-token-file %s: no token in its first line", o->token_file);
            moonlet_tls_ctx_unref(tls);
            return INSPECT_EXIT_USAGE;
        }
    }
    moonlet_master_client_opts mo = {.timeout_ms = 10000, .auth_token = token, .tls = tls};
    int rc = moonlet_mc_create(o->master, &mo, out);
    moonlet_token_free(token);
    bool used_tls = tls != NULL;
    moonlet_tls_ctx_unref(tls); /* the client holds its own reference */
    switch (rc) {
    case MOONLET_OK:
        return INSPECT_EXIT_OK;
    case MOONLET_ERR_INVALID_PARAMS:
        inspect_error("--master: not HOST:PORT: '%s'", o->master);
        return INSPECT_EXIT_USAGE;
    case MOONLET_ERR_ILLEGAL_CLIENT:
        inspect_error("the master at %s refused the connection: %s (wrong or missing "
                      "--auth-token-file%s?)", o->master, moonlet_strerror(rc),
                      used_tls ? ", or a client certificate it does not accept"
                          : ", or a master that requires TLS (--tls-ca)");
        return INSPECT_EXIT_RUNTIME;
    default:
        inspect_error("cannot connect to the master at %s: %s (%d)", o->master,
                      moonlet_strerror(rc), rc);
        return INSPECT_EXIT_RUNTIME;
    }
}

int inspect_render_once(const inspect_opts *o, inspect_render_fn render, const char *what)
{
    moonlet_master_client *mc;
    int ex = inspect_connect(o, &mc);
    if (ex)
        return ex;
    int rc = render(mc, o, stdout, inspect_term_width(stdout));
    moonlet_mc_destroy(mc);
    return rc ? inspect_rpc_failed(what, rc) : INSPECT_EXIT_OK;
}
