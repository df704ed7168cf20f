/*
 * keys.c - `moonlet-inspect keys` (a tenant's keys, paged) and
 * `moonlet-inspect key` (one or more keys in detail: every replica, the lease
 * and the soft pin).
 *
 * `keys` walks the master's ListKeys cursor a page of at most
 * INSPECT_PAGE_KEYS keys at a time and prints each page before asking for the
 * next, so neither the master nor this process ever holds more than one page:
 * a tenant of millions of keys lists in constant memory on both sides.  The
 * JSON form is streamed the same way as one document (one key object per
 * line), and is closed properly (with "complete": false and the error) when
 * the listing fails half way.
 *
 * When the tenant holds no keys at all, `keys` names the tenants that do
 * (ListTenants; tenants.c): an operator who forgot --tenant sees where the
 * keys are.
 *
 * `key` asks InspectKey for each key in turn.  A key that does not exist is
 * reported on stderr and in the JSON document, the remaining keys are still
 * printed, and the exit code is 1.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"
#include "moonlet/error.h"

/* ---- keys ------------------------------------------------------------------ */

static const inspect_col KEY_COLS[] = {
    {"KEY", INSPECT_LEFT, 12, true, false},       {"SIZE", INSPECT_RIGHT, 0, false, false},
    {"REPLICAS", INSPECT_RIGHT, 0, false, false}, {"READABLE", INSPECT_RIGHT, 0, false, false},
    {"LEASE", INSPECT_RIGHT, 0, false, false},
};
#define NKEY_COLS ((int)(sizeof(KEY_COLS) / sizeof(KEY_COLS[0])))

/* The summary fields of a key, as ListKeys and InspectKey report them. */
static cJSON *key_summary_json(const cJSON *k)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "key", inspect_json_str(k, "key"));
    inspect_json_add_u64(j, "size", inspect_json_u64(k, "size"));
    cJSON_AddBoolToObject(j, "complete", cJSON_IsTrue(cJSON_GetObjectItem(k, "complete")));
    inspect_json_add_u64(j, "replica_count", inspect_json_u64(k, "replica_count"));
    inspect_json_add_u64(j, "readable_replicas", inspect_json_u64(k, "readable_replicas"));
    inspect_json_add_u64(j, "lease_remaining_ms", inspect_json_u64(k, "lease_remaining_ms"));
    inspect_json_add_u64(j, "soft_pin_remaining_ms", inspect_json_u64(k, "soft_pin_remaining_ms"));
    cJSON_AddBoolToObject(j, "hard_pinned", cJSON_IsTrue(cJSON_GetObjectItem(k, "hard_pinned")));
    return j;
}

static int add_key_row(inspect_table *t, const cJSON *k)
{
    char size[32], reps[16], readable[16], lease[32];
    inspect_fmt_size(inspect_json_u64(k, "size"), size, sizeof(size));
    snprintf(reps, sizeof(reps), "%" PRIu64, inspect_json_u64(k, "replica_count"));
    snprintf(readable, sizeof(readable), "%" PRIu64, inspect_json_u64(k, "readable_replicas"));
    inspect_fmt_ms(inspect_json_u64(k, "lease_remaining_ms"), lease, sizeof(lease));
    const char *row[] = {inspect_json_str(k, "key"), size, reps, readable, lease};
    return inspect_table_add(t, row);
}

/* Prints a JSON string value (quoted and escaped). */
static void put_json_string(FILE *out, const char *s)
{
    cJSON *j = cJSON_CreateString(s);
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    fputs(text ? text : "\"\"", out);
    free(text);
    cJSON_Delete(j);
}

struct listing {
    const inspect_opts *o;
    moonlet_master_client *mc;
    inspect_table *table; /* human output */
    uint64_t emitted;
    char cursor[64];
};

/* Emits one page; copies its next cursor.  Returns a moonlet error code. */
static int emit_page(struct listing *l, const cJSON *page)
{
    const cJSON *keys = cJSON_GetObjectItem(page, "keys");
    const cJSON *next = cJSON_GetObjectItem(page, "next_cursor");
    if (!cJSON_IsArray(keys) || !cJSON_IsString(next) || strlen(next->valuestring) >= sizeof(l->cursor))
        return MOONLET_ERR_RPC_FAIL;
    const cJSON *k;
    cJSON_ArrayForEach(k, keys) {
        if (l->o->json) {
            cJSON *j = key_summary_json(k);
            char *text = j ? cJSON_PrintUnformatted(j) : NULL;
            cJSON_Delete(j);
            if (!text)
                return MOONLET_ERR_INTERNAL_ERROR;
            fprintf(stdout, "%s\n%s", l->emitted ? "," : "", text);
            free(text);
        } else if (add_key_row(l->table, k)) {
            return MOONLET_ERR_INTERNAL_ERROR;
        }
        l->emitted++;
    }
    if (!l->o->json)
        inspect_table_flush(l->table, stdout);
    strcpy(l->cursor, next->valuestring);
    return MOONLET_OK;
}

/* After --limit stopped the listing at a cursor: does any key remain?  (A
 * cursor at a shard boundary does not say: the shards after it may be empty.) */
static int more_after(struct listing *l, bool *more)
{
    *more = false;
    if (!l->cursor[0])
        return MOONLET_OK;
    cJSON *page = NULL;
    int rc = moonlet_mc_list_keys(l->mc, l->o->tenant, l->o->prefix, l->cursor, 1, &page);
    if (!rc)
        *more = cJSON_GetArraySize(cJSON_GetObjectItem(page, "keys")) > 0;
    cJSON_Delete(page);
    return rc;
}

int inspect_cmd_keys(const inspect_opts *o, int argc, char **argv)
{
    struct listing l = {.o = o};
    int ex = inspect_connect(o, &l.mc);
    if (ex)
        return ex;
    if (!o->json) {
        l.table = inspect_table_new(KEY_COLS, NKEY_COLS, inspect_term_width(stdout));
        if (!l.table) {
            moonlet_mc_destroy(l.mc);
            inspect_error("out of memory");
            return INSPECT_EXIT_RUNTIME;
        }
    } else {
        fputs("{\"master\":", stdout);
        put_json_string(stdout, o->master);
        fputs(",\"tenant\":", stdout);
        put_json_string(stdout, inspect_tenant(o));
        fputs(",\"prefix\":", stdout);
        put_json_string(stdout, o->prefix ? o->prefix : "");
        fputs(",\"keys\":[", stdout);
    }
    int rc = MOONLET_OK;
    bool more = false;
    for (;;) {
        uint32_t want = INSPECT_PAGE_KEYS;
        if (o->limit && o->limit - l.emitted < want)
            want = (uint32_t)(o->limit - l.emitted);
        cJSON *page = NULL;
        rc = moonlet_mc_list_keys(l.mc, o->tenant, o->prefix, l.cursor, want, &page);
        if (!rc)
            rc = emit_page(&l, page);
        cJSON_Delete(page);
        if (rc || !l.cursor[0])
            break;
        if (o->limit && l.emitted >= o->limit) {
            rc = more_after(&l, &more);
            break;
        }
    }
    /* nothing listed: if the tenant holds no keys at all, which tenants do */
    cJSON *others = NULL;
    uint64_t others_total = 0;
    bool holds = true;
    if (!rc && l.emitted == 0) {
        others = inspect_other_tenants(l.mc, inspect_tenant(o), &others_total, &holds);
        if (holds) {
            cJSON_Delete(others);
            others = NULL;
        }
    }
    if (o->json) {
        printf("%s],\"count\":%" PRIu64 ",\"truncated\":%s,\"complete\":%s",
               l.emitted ? "\n" : "", l.emitted, more ? "true" : "false", rc ? "false" : "true");
        if (rc) {
            fputs(",\"error\":", stdout);
            put_json_string(stdout, moonlet_strerror(rc));
        }
        if (others) {
            char *text = cJSON_PrintUnformatted(others);
            printf(",\"other_tenants\":%s,\"other_tenants_total\":%" PRIu64, text ? text : "[]",
                   others_total);
            free(text);
        }
        fputs("}\n", stdout);
    } else if (!rc) {
        printf("%" PRIu64 " key%s in tenant %s%s%s%s\n", l.emitted, l.emitted == 1 ? "" : "s",
               inspect_tenant(o), o->prefix && o->prefix[0] ? " with prefix " : "",
               o->prefix ? o->prefix : "", more ? " (--limit reached; more keys exist)" : "");
        if (others)
            inspect_print_other_tenants(stdout, inspect_tenant(o), others, others_total);
    }
    cJSON_Delete(others);
    inspect_table_free(l.table);
    moonlet_mc_destroy(l.mc);
    return rc ? inspect_rpc_failed("ListKeys", rc) : INSPECT_EXIT_OK;
}

/* ---- key ------------------------------------------------------------------- */

static const inspect_col REPLICA_COLS[] = {
    {"SEGMENT", INSPECT_LEFT, 8, true, false},   {"NODE", INSPECT_LEFT, 10, true, false},
    {"PROTO", INSPECT_LEFT, 0, false, false},    {"OFFSET", INSPECT_RIGHT, 0, false, false},
    {"LENGTH", INSPECT_RIGHT, 0, false, false},  {"STATUS", INSPECT_LEFT, 0, false, false},
};
#define NREPLICA_COLS ((int)(sizeof(REPLICA_COLS) / sizeof(REPLICA_COLS[0])))

static cJSON *key_detail_json(const cJSON *k)
{
    cJSON *j = key_summary_json(k);
    cJSON_AddBoolToObject(j, "found", true);
    cJSON *arr = cJSON_AddArrayToObject(j, "replicas");
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(k, "replicas")) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "segment_id", inspect_json_str(r, "segment_id"));
        cJSON_AddStringToObject(x, "segment_name", inspect_json_str(r, "segment_name"));
        cJSON_AddStringToObject(x, "endpoint", inspect_json_str(r, "endpoint"));
        cJSON_AddStringToObject(x, "protocol", inspect_json_str(r, "protocol"));
        inspect_json_add_u64(x, "base", inspect_json_u64(r, "base"));
        inspect_json_add_u64(x, "offset", inspect_json_u64(r, "offset"));
        inspect_json_add_u64(x, "length", inspect_json_u64(r, "length"));
        cJSON_AddStringToObject(x, "status", inspect_json_str(r, "status"));
        const char *tier = inspect_json_str(r, "tier");
        cJSON_AddStringToObject(x, "tier", *tier ? tier : "dram");
        inspect_json_copy_alt(x, r);
        cJSON_AddItemToArray(arr, x);
    }
    return j;
}

static int print_key_detail(const cJSON *k, const char *key, int width)
{
    char sizeb[32], pin[32];
    uint64_t size = inspect_json_u64(k, "size");
    uint64_t lease_ms = inspect_json_u64(k, "lease_remaining_ms");
    uint64_t pin_ms = inspect_json_u64(k, "soft_pin_remaining_ms");
    uint64_t nrep = inspect_json_u64(k, "replica_count");
    inspect_fmt_size(size, sizeb, sizeof(sizeb));
    if (pin_ms)
        inspect_fmt_ms(pin_ms, pin, sizeof(pin));
    fputs("key ", stdout);
    inspect_put_text(stdout, key);
    char exact[40] = "";
    if (size >= 1024)
        snprintf(exact, sizeof(exact), " (%" PRIu64 " B)", size);
    printf("\n  size %s%s, %s, %" PRIu64 " replica%s (%" PRIu64 " readable)\n",
           sizeb, exact, cJSON_IsTrue(cJSON_GetObjectItem(k, "complete")) ? "complete"
                                                                          : "put in progress",
           nrep, nrep == 1 ? "" : "s", inspect_json_u64(k, "readable_replicas"));
    if (lease_ms)
        printf("  lease %" PRIu64 " ms remaining", lease_ms);
    else
        printf("  no lease");
    if (cJSON_IsTrue(cJSON_GetObjectItem(k, "hard_pinned")))
        printf(", hard-pinned (never evicted)\n");
    else if (pin_ms)
        printf(", soft pin %s remaining\n", pin);
    else
        printf(", not soft-pinned\n");

    inspect_table *t = inspect_table_new(REPLICA_COLS, NREPLICA_COLS, width);
    if (!t)
        return MOONLET_ERR_INTERNAL_ERROR;
    inspect_table_set_indent(t, 2);
    const cJSON *r;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(k, "replicas")) {
        char off[24], len[32];
        snprintf(off, sizeof(off), "%" PRIu64, inspect_json_u64(r, "offset"));
        inspect_fmt_size(inspect_json_u64(r, "length"), len, sizeof(len));
        char proto[48], ep[2 * MOONLET_MAX_ENDPOINT_BYTES + 8];
        inspect_fmt_endpoints(r, proto, sizeof(proto), ep, sizeof(ep));
        if (strcmp(inspect_json_str(r, "tier"), "disk") == 0)
            snprintf(proto + strlen(proto), sizeof(proto) - strlen(proto), " disk");
        const char *row[] = {inspect_json_str(r, "segment_id"), ep, proto, off, len,
                             inspect_json_str(r, "status")};
        if (inspect_table_add(t, row)) {
            inspect_table_free(t);
            return MOONLET_ERR_INTERNAL_ERROR;
        }
    }
    if (nrep)
        inspect_table_flush(t, stdout);
    inspect_table_free(t);
    return MOONLET_OK;
}

int inspect_cmd_key(const inspect_opts *o, int argc, char **argv)
{
    moonlet_master_client *mc;
    int ex = inspect_connect(o, &mc);
    if (ex)
        return ex;
    int width = inspect_term_width(stdout);
    cJSON *doc = NULL, *arr = NULL;
    if (o->json) {
        doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "master", o->master);
        cJSON_AddStringToObject(doc, "tenant", inspect_tenant(o));
        arr = cJSON_AddArrayToObject(doc, "keys");
    }
    uint64_t missing = 0, failed = 0, shown = 0;
    for (int i = 0; i < argc; i++) {
        cJSON *k = NULL;
        int rc = moonlet_mc_inspect_key(mc, o->tenant, argv[i], &k);
        if (rc == MOONLET_OK && !cJSON_IsObject(k))
            rc = MOONLET_ERR_RPC_FAIL;
        if (rc == MOONLET_ERR_OBJECT_NOT_FOUND) {
            missing++;
            inspect_error("key '%s' does not exist in tenant '%s'", argv[i], inspect_tenant(o));
        } else if (rc) {
            failed++;
            char what[96];
            snprintf(what, sizeof(what), "InspectKey '%.64s'", argv[i]);
            inspect_rpc_failed(what, rc);
        }
        if (o->json) {
            cJSON *j;
            if (rc) {
                j = cJSON_CreateObject();
                cJSON_AddStringToObject(j, "key", argv[i]);
                cJSON_AddBoolToObject(j, "found", false);
                cJSON_AddStringToObject(j, "error", moonlet_strerror(rc));
            } else {
                j = key_detail_json(k);
            }
            cJSON_AddItemToArray(arr, j);
        } else if (!rc) {
            if (shown++)
                putchar('\n');
            rc = print_key_detail(k, argv[i], width);
            failed += rc != 0;
        }
        cJSON_Delete(k);
    }
    moonlet_mc_destroy(mc);
    if (o->json) {
        inspect_json_add_u64(doc, "missing", missing);
        if (inspect_json_print(stdout, doc))
            return INSPECT_EXIT_RUNTIME;
    }
    return missing || failed ? INSPECT_EXIT_RUNTIME : INSPECT_EXIT_OK;
}
