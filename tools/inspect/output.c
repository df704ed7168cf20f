/*
 * output.c - how moonlet-inspect prints: terminal width, aligned tables,
 * human-readable sizes and durations, and the JSON helpers.
 *
 * Tables are laid out once, at their first flush, and then keep their column
 * widths, so `keys` can stream a million rows a page at a time without
 * holding them.  When a table is wider than the terminal, its flexible
 * columns (keys, names, endpoints) give up width first, the widest first, down
 * to a minimum that keeps them readable; a cell that no longer fits keeps its
 * head and tail around "..".  If that is not enough, droppable columns are
 * left out, the rightmost first, and then the flexible columns narrow
 * further; what still does not fit wraps.  Cells never
 * reach the terminal with control characters in them: keys are arbitrary
 * bytes and an escape sequence in one must not repaint the operator's screen.
 *
 * Sizes are binary units with one decimal in tables; JSON carries exact
 * integers, added as raw numbers so that cJSON's double formatting never
 * turns a byte count into exponent notation.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "inspect.h"

/* ---- terminal -------------------------------------------------------------- */

int inspect_term_width(FILE *f)
{
    int cols = 0;
    struct winsize ws;
    if (isatty(fileno(f)) && ioctl(fileno(f), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        cols = ws.ws_col;
    if (cols == 0) {
        const char *env = getenv("COLUMNS");
        cols = env ? atoi(env) : 0;
    }
    if (cols <= 0)
        cols = 80;
    return cols < 40 ? 40 : cols;
}

int inspect_term_rows(FILE *f)
{
    struct winsize ws;
    if (isatty(fileno(f)) && ioctl(fileno(f), TIOCGWINSZ, &ws) == 0)
        return ws.ws_row;
    return 0;
}

/* ---- units ----------------------------------------------------------------- */

void inspect_fmt_size(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, cap, "%" PRIu64 " B", bytes);
        return;
    }
    double v = (double)bytes / 1024.0;
    unsigned u = 0;
    while (v >= 1023.95 && u + 1 < sizeof(units) / sizeof(units[0])) { /* never "1024.0 KiB" */
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.1f %s", v, units[u]);
}

void inspect_fmt_ms(uint64_t ms, char *buf, size_t cap)
{
    if (ms == 0)
        snprintf(buf, cap, "-");
    else if (ms < 60000)
        snprintf(buf, cap, "%" PRIu64 " ms", ms);
    else if (ms < 3600000)
        snprintf(buf, cap, "%.1f min", (double)ms / 60000.0);
    else
        snprintf(buf, cap, "%.1f h", (double)ms / 3600000.0);
}

/* ---- tables ---------------------------------------------------------------- */

struct inspect_table {
    const inspect_col *cols;
    int ncols;
    int width;      /* terminal columns */
    int indent;     /* spaces before each line */
    int *w;         /* column widths, fixed at the first flush; -1: left out */
    bool laid_out;
    char **cells;   /* nrows * ncols, row-major */
    size_t nrows, cap;
};

#define GAP 2       /* spaces between columns */
#define MAX_COLS 16 /* more than any command prints */

inspect_table *inspect_table_new(const inspect_col *cols, int ncols, int width)
{
    if (ncols <= 0 || ncols > MAX_COLS)
        return NULL;
    inspect_table *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->w = calloc((size_t)ncols, sizeof(*t->w));
    if (!t->w) {
        free(t);
        return NULL;
    }
    t->cols = cols;
    t->ncols = ncols;
    t->width = width;
    return t;
}

void inspect_put_text(FILE *out, const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        fputc(ch < 0x20 || ch == 0x7f ? '?' : ch, out);
    }
}

static char *cell_dup(const char *s)
{
    size_t n = strlen(s);
    char *c = malloc(n + 1);
    if (!c)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        c[i] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    c[n] = 0;
    return c;
}

int inspect_table_add(inspect_table *t, const char *const *cells)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        char **c = realloc(t->cells, cap * (size_t)t->ncols * sizeof(*c));
        if (!c)
            return -1;
        t->cells = c;
        t->cap = cap;
    }
    char **row = &t->cells[t->nrows * (size_t)t->ncols];
    for (int i = 0; i < t->ncols; i++) {
        row[i] = cell_dup(cells[i] ? cells[i] : "");
        if (!row[i]) {
            while (i-- > 0)
                free(row[i]);
            return -1;
        }
    }
    t->nrows++;
    return 0;
}

void inspect_table_set_indent(inspect_table *t, int indent)
{
    t->indent = indent < 0 ? 0 : indent;
}

/* Narrows flexible columns, the widest first, while the table is wider than
 * the terminal and some flexible column is wider than its floor (`use_min`:
 * the column's min_width; otherwise 4).  Returns the new total. */
static int shrink(inspect_table *t, int total, bool use_min)
{
    while (total > t->width) {
        int widest = -1;
        for (int c = 0; c < t->ncols; c++) {
            int floor = use_min && t->cols[c].min_width > 4 ? t->cols[c].min_width : 4;
            if (t->cols[c].flexible && t->w[c] > floor && (widest < 0 || t->w[c] > t->w[widest]))
                widest = c;
        }
        if (widest < 0)
            break;
        t->w[widest]--;
        total--;
    }
    return total;
}

/* Fits the table to the width in three steps: narrow the flexible columns
 * down to their min_width, then leave out droppable columns (the rightmost
 * first), then narrow the flexible columns down to 4.  What still does not
 * fit wraps. */
static void layout(inspect_table *t)
{
    int total = t->indent + GAP * (t->ncols - 1);
    for (int c = 0; c < t->ncols; c++) {
        int w = (int)strlen(t->cols[c].title);
        for (size_t r = 0; r < t->nrows; r++) {
            int l = (int)strlen(t->cells[r * (size_t)t->ncols + (size_t)c]);
            w = l > w ? l : w;
        }
        t->w[c] = w;
        total += w;
    }
    total = shrink(t, total, true);
    for (int c = t->ncols - 1; c >= 0 && total > t->width; c--) {
        if (t->cols[c].droppable) {
            total -= t->w[c] + GAP;
            t->w[c] = -1;
        }
    }
    shrink(t, total, false);
    t->laid_out = true;
}

static void put_cell(FILE *out, const inspect_table *t, int c, const char *s, bool last)
{
    int w = t->w[c];
    int len = (int)strlen(s);
    if (len > w && t->cols[c].flexible) {
        int head = (w - 2 + 1) / 2, tail = (w - 2) / 2;
        fprintf(out, "%.*s..%s", head, s, s + len - tail);
        len = w;
    } else if (t->cols[c].align == INSPECT_RIGHT) {
        fprintf(out, "%*s", w, s);
        len = w > len ? w : len;
    } else {
        fputs(s, out);
    }
    if (!last)
        fprintf(out, "%*s", (w > len ? w - len : 0) + GAP, "");
}

static void put_row(FILE *out, const inspect_table *t, const char *const *cells)
{
    int last = t->ncols - 1;
    while (last > 0 && t->w[last] < 0)
        last--;
    fprintf(out, "%*s", t->indent, "");
    for (int c = 0; c <= last; c++)
        if (t->w[c] >= 0)
            put_cell(out, t, c, cells[c], c == last);
    fputc('\n', out);
}

void inspect_table_flush(inspect_table *t, FILE *out)
{
    if (!t->laid_out) {
        layout(t);
        const char *titles[MAX_COLS];
        bool any = false;
        for (int c = 0; c < t->ncols; c++) {
            titles[c] = t->cols[c].title;
            any |= titles[c][0] != 0;
        }
        if (any) /* a table whose titles are all empty has no header line */
            put_row(out, t, titles);
    }
    for (size_t r = 0; r < t->nrows; r++) {
        char **row = &t->cells[r * (size_t)t->ncols];
        put_row(out, t, (const char *const *)row);
        for (int c = 0; c < t->ncols; c++)
            free(row[c]);
    }
    t->nrows = 0;
}

void inspect_table_free(inspect_table *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t->w);
    free(t);
}

/* ---- JSON ------------------------------------------------------------------ */

uint64_t inspect_json_u64(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!cJSON_IsNumber(v) || v->valuedouble <= 0)
        return 0;
    return (uint64_t)v->valuedouble;
}

const char *inspect_json_str(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsString(v) && v->valuestring ? v->valuestring : "";
}

void inspect_json_copy_alt(cJSON *dst, const cJSON *src)
{
    static const char *const f[] = {"alt_segment_id", "alt_endpoint", "alt_protocol"};
    if (!*inspect_json_str(src, "alt_endpoint"))
        return;
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        cJSON_AddStringToObject(dst, f[i], inspect_json_str(src, f[i]));
}

void inspect_fmt_endpoints(const cJSON *obj, char *proto, size_t proto_cap, char *ep,
                           size_t ep_cap)
{
    const char *alt = inspect_json_str(obj, "alt_endpoint");
    if (!*alt) {
        snprintf(proto, proto_cap, "%s", inspect_json_str(obj, "protocol"));
        snprintf(ep, ep_cap, "%s", inspect_json_str(obj, "endpoint"));
        return;
    }
    snprintf(proto, proto_cap, "%s+%s", inspect_json_str(obj, "protocol"),
             inspect_json_str(obj, "alt_protocol"));
    snprintf(ep, ep_cap, "%s + %s", inspect_json_str(obj, "endpoint"), alt);
}

void inspect_json_add_u64(cJSON *obj, const char *name, uint64_t v)
{
    char num[24];
    snprintf(num, sizeof(num), "%" PRIu64, v);
    cJSON_AddRawToObject(obj, name, num);
}

int inspect_json_print(FILE *out, cJSON *doc)
{
    char *text = doc ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    if (!text) {
        inspect_error("out of memory rendering JSON");
        return INSPECT_EXIT_RUNTIME;
    }
    fputs(text, out);
    fputc('\n', out);
    free(text);
    return INSPECT_EXIT_OK;
}
