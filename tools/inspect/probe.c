/*
 * probe.c - `moonlet-inspect probe`: runs BatchProbeKey with a
 * GrantLeasePolicy and shows the keys grouped into candidates.
 *
 * With --mode none the master only reports existence and grants nothing; the
 * output marks the last complete candidate (the one last-hit-only would
 * select).  With --mode last-hit-only the master leases every key of the
 * selected candidate, which keeps those objects from eviction and removal for
 * the lease TTL: an inspection tool must not do that by accident, so that
 * mode needs --yes, and without it nothing is sent (exit code 2).
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"
#include "moonlet/error.h"

struct probe_view {
    const inspect_opts *o;
    char **keys;
    const int32_t *r;
    uint64_t n, cs, ncand;
    bool last_hit;
    int64_t selected;       /* last-hit-only: the leased candidate, or -1 */
    int64_t last_complete;  /* none: the last candidate with every key present, or -1 */
    uint64_t leased;
};

static bool candidate_all_true(const struct probe_view *v, uint64_t c)
{
    for (uint64_t i = c * v->cs; i < (c + 1) * v->cs; i++)
        if (v->r[i] != 1)
            return false;
    return true;
}

static uint64_t distinct_keys(const struct probe_view *v, uint64_t c)
{
    uint64_t n = 0;
    for (uint64_t i = c * v->cs; i < (c + 1) * v->cs; i++) {
        uint64_t j = c * v->cs;
        while (j < i && strcmp(v->keys[j], v->keys[i]) != 0)
            j++;
        n += j == i;
    }
    return n;
}

static const char *mode_name(bool last_hit)
{
    return last_hit ? "last-hit-only" : "none";
}

static int print_json(const struct probe_view *v)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "master", v->o->master);
    cJSON_AddStringToObject(doc, "tenant", inspect_tenant(v->o));
    cJSON_AddStringToObject(doc, "mode", mode_name(v->last_hit));
    inspect_json_add_u64(doc, "candidate_size", v->cs);
    cJSON *cands = cJSON_AddArrayToObject(doc, "candidates");
    for (uint64_t c = 0; c < v->ncand; c++) {
        cJSON *cj = cJSON_CreateObject();
        inspect_json_add_u64(cj, "index", c);
        cJSON_AddBoolToObject(cj, "selected", v->last_hit && (int64_t)c == v->selected);
        if (!v->last_hit)
            cJSON_AddBoolToObject(cj, "complete", candidate_all_true(v, c));
        cJSON *keys = cJSON_AddArrayToObject(cj, "keys");
        for (uint64_t i = c * v->cs; i < (c + 1) * v->cs; i++) {
            cJSON *k = cJSON_CreateObject();
            cJSON_AddStringToObject(k, "key", v->keys[i]);
            cJSON_AddBoolToObject(k, "result", v->r[i] == 1);
            if (v->r[i] < 0)
                cJSON_AddStringToObject(k, "error", moonlet_strerror(v->r[i]));
            cJSON_AddItemToArray(keys, k);
        }
        cJSON_AddItemToArray(cands, cj);
    }
    if (v->last_hit && v->selected >= 0)
        inspect_json_add_u64(doc, "selected_candidate", (uint64_t)v->selected);
    else
        cJSON_AddNullToObject(doc, "selected_candidate");
    if (!v->last_hit && v->last_complete >= 0)
        inspect_json_add_u64(doc, "last_complete_candidate", (uint64_t)v->last_complete);
    else
        cJSON_AddNullToObject(doc, "last_complete_candidate");
    inspect_json_add_u64(doc, "leased_keys", v->leased);
    return inspect_json_print(stdout, doc);
}

static const inspect_col PROBE_COLS[] = {
    {"", INSPECT_LEFT, 0, false, false},          {"CANDIDATE", INSPECT_RIGHT, 0, false, false},
    {"KEY", INSPECT_LEFT, 12, true, false},       {"RESULT", INSPECT_LEFT, 0, false, false},
};
#define NPROBE_COLS ((int)(sizeof(PROBE_COLS) / sizeof(PROBE_COLS[0])))

static int print_table(const struct probe_view *v)
{
    inspect_table *t = inspect_table_new(PROBE_COLS, NPROBE_COLS, inspect_term_width(stdout));
    if (!t) {
        inspect_error("out of memory");
        return INSPECT_EXIT_RUNTIME;
    }
    int64_t mark = v->last_hit ? v->selected : v->last_complete;
    for (uint64_t c = 0; c < v->ncand; c++) {
        for (uint64_t i = c * v->cs; i < (c + 1) * v->cs; i++) {
            char idx[24] = "";
            if (i == c * v->cs)
                snprintf(idx, sizeof(idx), "%" PRIu64, c);
            const char *res = v->r[i] < 0    ? moonlet_strerror(v->r[i])
                              : v->last_hit  ? (v->r[i] ? "leased" : "-")
                              : v->r[i]      ? "present"
                                             : "absent";
            const char *row[] = {(int64_t)c == mark ? "*" : "", idx, v->keys[i], res};
            if (inspect_table_add(t, row)) {
                inspect_table_free(t);
                inspect_error("out of memory");
                return INSPECT_EXIT_RUNTIME;
            }
        }
    }
    if (v->n)
        inspect_table_flush(t, stdout);
    inspect_table_free(t);
    printf("mode %s, %" PRIu64 " candidate%s of %" PRIu64 " key%s, tenant %s: ",
           mode_name(v->last_hit), v->ncand, v->ncand == 1 ? "" : "s", v->cs,
           v->cs == 1 ? "" : "s", inspect_tenant(v->o));
    if (v->last_hit && v->selected >= 0)
        printf("* candidate %" PRId64 " selected, %" PRIu64 " key%s leased\n", v->selected,
               v->leased, v->leased == 1 ? "" : "s");
    else if (v->last_hit)
        printf("no candidate complete, nothing leased\n");
    else if (v->last_complete >= 0)
        printf("* candidate %" PRId64 " is the last complete one; nothing leased\n",
               v->last_complete);
    else
        printf("no candidate complete; nothing leased\n");
    return INSPECT_EXIT_OK;
}

int inspect_cmd_probe(const inspect_opts *o, int argc, char **argv)
{
    struct probe_view v = {.o = o, .keys = argv, .n = (uint64_t)argc, .selected = -1,
                           .last_complete = -1};
    v.last_hit = o->lease_mode == MOONLET_PROBE_LEASE_LAST_HIT_ONLY;
    v.cs = o->candidate_size ? o->candidate_size : 1;
    if (v.last_hit && !o->yes) {
        inspect_error("probe --mode last-hit-only grants read leases on the selected "
                      "candidate's keys (they cannot be evicted or removed until the leases "
                      "expire); add --yes to run it");
        return INSPECT_EXIT_USAGE;
    }
    if (v.n % v.cs) {
        inspect_error("probe: %" PRIu64 " keys do not form candidates of %" PRIu64 " keys",
                      v.n, v.cs);
        return INSPECT_EXIT_USAGE;
    }
    v.ncand = v.n / v.cs;
    int32_t *r = calloc(v.n ? v.n : 1, sizeof(*r));
    if (!r) {
        inspect_error("out of memory");
        return INSPECT_EXIT_RUNTIME;
    }
    moonlet_master_client *mc;
    int ex = inspect_connect(o, &mc);
    if (ex) {
        free(r);
        return ex;
    }
    moonlet_grant_lease_policy policy = {.lease_mode = o->lease_mode, .candidate_size = v.cs};
    int rc = moonlet_mc_batch_probe_key(mc, o->tenant, policy, (const char *const *)argv, v.n, r);
    moonlet_mc_destroy(mc);
    if (rc) {
        free(r);
        return inspect_rpc_failed("BatchProbeKey", rc);
    }
    v.r = r;
    for (uint64_t c = 0; c < v.ncand; c++) {
        if (!candidate_all_true(&v, c))
            continue;
        if (v.last_hit) {
            v.selected = (int64_t)c;
            v.leased = distinct_keys(&v, c); /* the master leases each object once */
        } else {
            v.last_complete = (int64_t)c;
        }
    }
    ex = o->json ? print_json(&v) : print_table(&v);
    free(r);
    return ex;
}
