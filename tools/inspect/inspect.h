/*
 * inspect.h - moonlet-inspect, the operator's replica inspection CLI.
 *
 * tools/moonlet-inspect.c parses the flags into an inspect_opts and calls one
 * inspect_cmd_*() verb; everything else lives in tools/inspect/:
 *
 *   connect.c   opening the MasterClient from the options, one-line errors
 *   output.c    terminal width, aligned tables, human sizes and durations,
 *               JSON helpers (exact integers)
 *   segments.c  `segments`
 *   keys.c      `keys` (paged listing) and `key` (one key's replicas)
 *   tenants.c   `tenants` (the tenants holding keys) and the hint `keys`
 *               prints for a tenant that holds none
 *   probe.c     `probe` (BatchProbeKey with a GrantLeasePolicy)
 *   stats.c     `stats`
 *   watch.c     `watch` (periodic redraw of `stats` or `segments`)
 *   status.c    `status` (HA: each master's role, epoch and leader)
 *
 * Every verb returns the process exit code: 0, INSPECT_EXIT_RUNTIME (1) for a
 * failure talking to the master or a key that does not exist, or
 * INSPECT_EXIT_USAGE (2) for a command line that cannot be run.  Errors are
 * one line on stderr, prefixed "moonlet-inspect: ".  Human output goes to
 * stdout as tables; with --json each command prints one JSON document.
 *
 * Single-threaded; the only global state is watch.c's SIGINT flag.
 */
#ifndef MOONLET_INSPECT_H
#define MOONLET_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "master_client.h"
#include "moonlet/policy.h"

struct cJSON;

enum {
    INSPECT_EXIT_OK = 0,
    INSPECT_EXIT_RUNTIME = 1,
    INSPECT_EXIT_USAGE = 2,
};

/* Keys asked of the master per ListKeys call (the master allows up to 10000). */
#define INSPECT_PAGE_KEYS 1000u

typedef struct inspect_opts {
    const char *master;       /* "HOST:PORT" */
    const char *tenant;       /* NULL: the default tenant */
    const char *token_file;   /* NULL: no authentication */
    const char *tls_ca, *tls_cert, *tls_key; /* TLS to the master (--tls-*); NULL: plaintext */
    bool json;                /* one JSON document per command */
    /* keys */
    const char *prefix;       /* NULL: every key */
    uint64_t limit;           /* 0: no limit */
    /* probe */
    uint8_t lease_mode;       /* a moonlet_probe_lease_mode */
    uint64_t candidate_size;  /* 0: not given (1 for mode none) */
    bool yes;                 /* consent to LAST_HIT_ONLY granting leases */
    /* watch */
    double interval_s;        /* seconds between refreshes (> 0) */
    uint64_t count;           /* refreshes before exiting; 0: until SIGINT */
} inspect_opts;

/* ---- connect.c ------------------------------------------------------------- */

/* Prints "moonlet-inspect: <message>" as one line on stderr. */
void inspect_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The tenant as the master names it ("default" when none was given). */
const char *inspect_tenant(const inspect_opts *o);
/* Opens a MasterClient (reading the token file when given).  Returns 0, or an
 * exit code after printing one line: RUNTIME when the master cannot be
 * reached or refuses the token, USAGE for a bad address or token file. */
int inspect_connect(const inspect_opts *o, moonlet_master_client **out);
/* The TLS context of --tls-ca/--tls-cert/--tls-key (*out NULL without
 * them).  Returns 0, or USAGE after printing one line. */
struct moonlet_tls_ctx;
int inspect_tls(const inspect_opts *o, struct moonlet_tls_ctx **out);
/* Reports a failed RPC ("<what>: <ERROR_NAME> (code)") and returns RUNTIME. */
int inspect_rpc_failed(const char *what, int rc);

/* ---- output.c ------------------------------------------------------------- */

/* Columns available on `f`: TIOCGWINSZ when it is a terminal, else $COLUMNS,
 * else 80.  Never below 40. */
int inspect_term_width(FILE *f);
/* Rows of the terminal `f` is, or 0 when it is not a terminal. */
int inspect_term_rows(FILE *f);

/* "512 B", "4.0 KiB", "1.5 MiB", "2.0 GiB", "3.0 TiB". */
void inspect_fmt_size(uint64_t bytes, char *buf, size_t cap);
/* "-" for 0, "850 ms", "4.9 s", "12 min", "3.1 h". */
void inspect_fmt_ms(uint64_t ms, char *buf, size_t cap);

/* Prints text from the master (a key, a name) with control characters as '?'. */
void inspect_put_text(FILE *out, const char *s);

typedef enum { INSPECT_LEFT = 0, INSPECT_RIGHT = 1 } inspect_align;

typedef struct inspect_col {
    const char *title;
    inspect_align align;
    int min_width;  /* a flexible column narrows below this only after droppable
                       columns are left out */
    bool flexible;  /* may be narrowed (middle of the cell elided) to fit the width */
    bool droppable; /* left out when the table cannot fit otherwise */
} inspect_col;

typedef struct inspect_table inspect_table;

/* A table of `ncols` columns (the array must outlive the table) laid out for
 * `width` terminal columns.  It has a header line unless every title is "". */
inspect_table *inspect_table_new(const inspect_col *cols, int ncols, int width);
/* Indents every line of the table by `indent` spaces (before the first flush). */
void inspect_table_set_indent(inspect_table *t, int indent);
/* Appends a row of ncols cells (copied; control characters shown as '?').
 * Returns 0, or -1 when out of memory. */
int inspect_table_add(inspect_table *t, const char *const *cells);
/* Prints the rows added since the last flush and forgets them.  The first
 * flush fixes the column widths (from its rows and the titles, narrowing the
 * flexible columns to fit the width) and prints the header; later flushes
 * reuse those widths, so a table may be streamed a page at a time. */
void inspect_table_flush(inspect_table *t, FILE *out);
void inspect_table_free(inspect_table *t);

/* Reads a number member as an unsigned integer (0 when absent or negative). */
uint64_t inspect_json_u64(const struct cJSON *obj, const char *name);
/* Reads a string member ("" when absent). */
const char *inspect_json_str(const struct cJSON *obj, const char *name);
/* A segment or replica served over two protocols (moonlet-store --protocol
 * both) carries alt_segment_id, alt_endpoint and alt_protocol: copies them
 * from `src` to `dst` when present; formats the protocol ("rdma+tcp") and
 * endpoint ("A + B") columns of either kind. */
void inspect_json_copy_alt(struct cJSON *dst, const struct cJSON *src);
void inspect_fmt_endpoints(const struct cJSON *obj, char *proto, size_t proto_cap, char *ep,
                           size_t ep_cap);
/* Adds an exact unsigned integer member (never in exponent notation). */
void inspect_json_add_u64(struct cJSON *obj, const char *name, uint64_t v);
/* Prints `doc` (compact, on one line) and a newline to `out`, then frees it.  Returns 0,
 * or RUNTIME when it could not be rendered. */
int inspect_json_print(FILE *out, struct cJSON *doc);

/* ---- commands ------------------------------------------------------------- */

/* Renderers shared by the one-shot commands and `watch`: one snapshot of the
 * master to `out`, laid out for `width` columns (ignored with --json).
 * Return 0 or a moonlet error code (nothing printed for it). */
typedef int (*inspect_render_fn)(moonlet_master_client *mc, const inspect_opts *o, FILE *out,
                                 int width);
int inspect_render_segments(moonlet_master_client *mc, const inspect_opts *o, FILE *out,
                            int width);
int inspect_render_stats(moonlet_master_client *mc, const inspect_opts *o, FILE *out, int width);
/* A one-shot command of one renderer (connect.c): connects, renders to
 * stdout for its width, closes.  Returns the exit code; a failed render is
 * reported as RPC `what` failing. */
int inspect_render_once(const inspect_opts *o, inspect_render_fn render, const char *what);

/* The commands; argv holds the command's operands (keys, watch target). */
int inspect_cmd_segments(const inspect_opts *o, int argc, char **argv);
int inspect_cmd_keys(const inspect_opts *o, int argc, char **argv);
int inspect_cmd_key(const inspect_opts *o, int argc, char **argv);
int inspect_cmd_probe(const inspect_opts *o, int argc, char **argv);
int inspect_cmd_stats(const inspect_opts *o, int argc, char **argv);
int inspect_cmd_watch(const inspect_opts *o, int argc, char **argv);
int inspect_cmd_drain(const inspect_opts *o, int argc, char **argv);
int inspect_cmd_undrain(const inspect_opts *o, int argc, char **argv);
int inspect_cmd_status(const inspect_opts *o, int argc, char **argv);
int inspect_cmd_tenants(const inspect_opts *o, int argc, char **argv);

/* ---- tenants.c ------------------------------------------------------------ */
/* ListTenants: *out = {tenants: [{tenant, keys, bytes}...] in name order,
 * total}; limit 0 (or above the master's most): the most the master gives. */
int inspect_list_tenants(moonlet_master_client *mc, uint64_t limit, struct cJSON **out);
/* The tenants other than `tenant` that hold keys (a cJSON array the caller
 * frees), *total how many there are, *asked_holds whether `tenant` holds
 * keys; NULL when the master cannot say (no ListTenants). */
struct cJSON *inspect_other_tenants(moonlet_master_client *mc, const char *tenant,
                                    uint64_t *total, bool *asked_holds);
/* "tenant T holds no keys; 2 tenants do: a (7 keys, 28.0 MiB), b (...); use
 * --tenant NAME" (at most 8 named), or that no tenant holds keys. */
void inspect_print_other_tenants(FILE *out, const char *tenant, const struct cJSON *others,
                                 uint64_t total);

#endif
