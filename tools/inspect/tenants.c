/*
 * tenants.c - `moonlet-inspect tenants` (every tenant that holds keys, with
 * its key count and bytes, from one ListTenants call) and the hint `keys`
 * prints when the asked tenant holds no keys: which tenants do.
 *
 * No state, no locks (single-threaded, like the rest of moonlet-inspect).
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"
#include "master.h"
#include "moonlet/error.h"

/* Tenants named in the hint of `keys` (then "and N more"). */
#define HINT_TENANTS 8

static const inspect_col TENANT_COLS[] = {
    {"TENANT", INSPECT_LEFT, 12, true, false},
    {"KEYS", INSPECT_RIGHT, 0, false, false},
    {"BYTES", INSPECT_RIGHT, 0, false, false},
};
#define NTENANT_COLS ((int)(sizeof(TENANT_COLS) / sizeof(TENANT_COLS[0])))

int inspect_list_tenants(moonlet_master_client *mc, uint64_t limit, cJSON **out)
{
    *out = NULL;
    if (limit == 0 || limit > MOONLET_LIST_TENANTS_MAX_LIMIT)
        limit = MOONLET_LIST_TENANTS_MAX_LIMIT;
    int rc = moonlet_mc_list_tenants(mc, (uint32_t)limit, out);
    if (!rc && !cJSON_IsArray(cJSON_GetObjectItem(*out, "tenants")))
        rc = MOONLET_ERR_RPC_FAIL;
    if (rc) {
        cJSON_Delete(*out);
        *out = NULL;
    }
    return rc;
}

cJSON *inspect_other_tenants(moonlet_master_client *mc, const char *tenant, uint64_t *total,
                             bool *asked_holds)
{
    cJSON *reply = NULL;
    *total = 0;
    *asked_holds = false;
    if (inspect_list_tenants(mc, 0, &reply))
        return NULL; /* e.g. a master older than ListTenants: no hint */
    cJSON *list = cJSON_DetachItemFromObject(reply, "tenants");
    uint64_t n = inspect_json_u64(reply, "total");
    cJSON_Delete(reply);
    for (cJSON *t = list->child, *next; t; t = next) {
        next = t->next;
        if (strcmp(inspect_json_str(t, "tenant"), tenant) == 0) {
            cJSON_Delete(cJSON_DetachItemViaPointer(list, t));
            *asked_holds = true;
            n = n ? n - 1 : 0;
        }
    }
    *total = n;
    return list;
}

void inspect_print_other_tenants(FILE *out, const char *tenant, const cJSON *others,
                                 uint64_t total)
{
    fputs("tenant ", out);
    inspect_put_text(out, tenant);
    if (total == 0) {
        fputs(" holds no keys, and no other tenant does\n", out);
        return;
    }
    fprintf(out, " holds no keys; %" PRIu64 " tenant%s do%s: ", total, total == 1 ? "" : "s",
            total == 1 ? "es" : "");
    const cJSON *t;
    int shown = 0;
    cJSON_ArrayForEach(t, others) {
        if (shown == HINT_TENANTS)
            break;
        uint64_t keys = inspect_json_u64(t, "keys");
        char size[32];
        inspect_fmt_size(inspect_json_u64(t, "bytes"), size, sizeof(size));
        fputs(shown++ ? ", " : "", out);
        inspect_put_text(out, inspect_json_str(t, "tenant"));
        fprintf(out, " (%" PRIu64 " key%s, %s)", keys, keys == 1 ? "" : "s", size);
    }
    if (total > (uint64_t)shown)
        fprintf(out, " and %" PRIu64 " more (moonlet-inspect tenants)", total - (uint64_t)shown);
    fputs("; use --tenant NAME\n", out);
}

int inspect_cmd_tenants(const inspect_opts *o, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    moonlet_master_client *mc;
    int ex = inspect_connect(o, &mc);
    if (ex)
        return ex;
    cJSON *reply = NULL;
    int rc = inspect_list_tenants(mc, o->limit, &reply);
    moonlet_mc_destroy(mc);
    if (rc)
        return inspect_rpc_failed("ListTenants", rc);
    const cJSON *list = cJSON_GetObjectItem(reply, "tenants");
    uint64_t total = inspect_json_u64(reply, "total");
    uint64_t shown = (uint64_t)cJSON_GetArraySize(list);
    if (o->json) {
        cJSON *doc = cJSON_CreateObject();
        cJSON_AddStringToObject(doc, "master", o->master);
        cJSON *arr = cJSON_AddArrayToObject(doc, "tenants");
        const cJSON *t;
        cJSON_ArrayForEach(t, list) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "tenant", inspect_json_str(t, "tenant"));
            inspect_json_add_u64(j, "keys", inspect_json_u64(t, "keys"));
            inspect_json_add_u64(j, "bytes", inspect_json_u64(t, "bytes"));
            cJSON_AddItemToArray(arr, j);
        }
        inspect_json_add_u64(doc, "total", total);
        cJSON_AddBoolToObject(doc, "truncated", shown < total);
        cJSON_Delete(reply);
        return inspect_json_print(stdout, doc) ? INSPECT_EXIT_RUNTIME : INSPECT_EXIT_OK;
    }
    inspect_table *tab = inspect_table_new(TENANT_COLS, NTENANT_COLS, inspect_term_width(stdout));
    if (!tab) {
        cJSON_Delete(reply);
        inspect_error("out of memory");
        return INSPECT_EXIT_RUNTIME;
    }
    const cJSON *t;
    uint64_t keys_sum = 0, bytes_sum = 0;
    cJSON_ArrayForEach(t, list) {
        char keys[24], size[32];
        keys_sum += inspect_json_u64(t, "keys");
        bytes_sum += inspect_json_u64(t, "bytes");
        snprintf(keys, sizeof(keys), "%" PRIu64, inspect_json_u64(t, "keys"));
        inspect_fmt_size(inspect_json_u64(t, "bytes"), size, sizeof(size));
        const char *row[] = {inspect_json_str(t, "tenant"), keys, size};
        if (inspect_table_add(tab, row)) {
            rc = MOONLET_ERR_INTERNAL_ERROR;
            break;
        }
    }
    if (shown)
        inspect_table_flush(tab, stdout);
    inspect_table_free(tab);
    cJSON_Delete(reply);
    if (rc) {
        inspect_error("out of memory");
        return INSPECT_EXIT_RUNTIME;
    }
    char size[32];
    inspect_fmt_size(bytes_sum, size, sizeof(size));
    printf("%" PRIu64 " tenant%s hold%s keys", total, total == 1 ? "" : "s", total == 1 ? "s" : "");
    if (shown < total)
        printf(" (the first %" PRIu64 " shown: --limit)", shown);
    else if (total)
        printf(": %" PRIu64 " key%s, %s", keys_sum, keys_sum == 1 ? "" : "s", size);
    putchar('\n');
    return INSPECT_EXIT_OK;
}
