/* trace_load.c - loads Mooncake's conversation trace; see trace_load.h. */
#include "trace_load.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int trace_push_id(trace *t, uint64_t id)
{
    if (t->nids == t->cap_ids) {
        size_t cap = t->cap_ids ? t->cap_ids * 2 : 1 << 16;
        uint64_t *v = realloc(t->ids, cap * sizeof(*v));
        if (!v)
            return -1;
        t->ids = v;
        t->cap_ids = cap;
    }
    t->ids[t->nids++] = id;
    return 0;
}

static int trace_push_req(trace *t, const treq *q)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        treq *v = realloc(t->r, cap * sizeof(*v));
        if (!v)
            return -1;
        t->r = v;
        t->cap = cap;
    }
    t->r[t->n++] = *q;
    if (q->n > t->max_blocks)
        t->max_blocks = q->n;
    return 0;
}

static bool json_uint(const cJSON *o, const char *name, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItem(o, name);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0)
        return false;
    *out = (uint64_t)v->valuedouble;
    return true;
}

/* One JSON object per line: timestamp (ms), input_length, hash_ids. */
static int trace_parse_line(trace *t, const char *line, size_t lineno)
{
    cJSON *o = cJSON_Parse(line);
    treq q = {.off = t->nids};
    const cJSON *ids = o ? cJSON_GetObjectItem(o, "hash_ids") : NULL;
    int rc = -1;
    if (!o || !json_uint(o, "timestamp", &q.ts_ms) || !json_uint(o, "input_length", &q.input) ||
        !cJSON_IsArray(ids) || cJSON_GetArraySize(ids) == 0 || q.input == 0) {
        fprintf(stderr, "moonlet-bench trace: line %zu: expected timestamp, input_length and "
                        "a non-empty hash_ids\n", lineno);
        goto out;
    }
    const cJSON *id;
    cJSON_ArrayForEach(id, ids) {
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || trace_push_id(t, (uint64_t)id->valuedouble))
            goto out;
        q.n++;
    }
    rc = trace_push_req(t, &q);
out:
    cJSON_Delete(o);
    return rc;
}

int trace_load(const char *path, size_t limit, trace *t)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "moonlet-bench trace: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    int rc = 0;
    while ((!limit || t->n < limit) && getline(&line, &cap, f) > 0) {
        lineno++;
        if (line[0] == '\n')
            continue;
        if ((rc = trace_parse_line(t, line, lineno)))
            break;
    }
    free(line);
    fclose(f);
    if (!rc && t->n == 0) {
        fprintf(stderr, "moonlet-bench trace: %s holds no request\n", path);
        rc = -1;
    }
    return rc;
}

void trace_free(trace *t)
{
    free(t->r);
    free(t->ids);
    memset(t, 0, sizeof(*t));
}
