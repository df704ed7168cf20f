/*
 * segments.c - `moonlet-inspect segments`: every segment mounted on the
 * master, with its owner, transport endpoint, space and the age of its
 * owner's last ping (a store node that stops pinging is unmounted when the
 * age passes the master's liveness TTL).  A disk segment's node also says
 * how its disk tier does (node_tier: disk hits, errors, I/Os in flight, as
 * its last Ping carried them): once per node, below the table.
 *
 * ListSegments page by page (INSPECT_SEG_PAGE segments per call, so no reply
 * grows with the cluster); the rows are gathered, then rendered at once.  A
 * master older than paging answers the first call with every segment.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"
#include "moonlet/error.h"

static const char *const SEG_FIELDS[] = {"segment_id", "name", "client_id", "protocol",
                                         "endpoint"};
static const char *const SEG_NUMBERS[] = {"base", "capacity", "used", "objects",
                                          "last_ping_age_ms"};

static int render_json(const cJSON *list, const inspect_opts *o, FILE *out)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "master", o->master);
    cJSON *arr = cJSON_AddArrayToObject(doc, "segments");
    uint64_t cap = 0, used = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, list) {
        cJSON *j = cJSON_CreateObject();
        for (size_t i = 0; i < sizeof(SEG_FIELDS) / sizeof(SEG_FIELDS[0]); i++)
            cJSON_AddStringToObject(j, SEG_FIELDS[i], inspect_json_str(s, SEG_FIELDS[i]));
        for (size_t i = 0; i < sizeof(SEG_NUMBERS) / sizeof(SEG_NUMBERS[0]); i++)
            inspect_json_add_u64(j, SEG_NUMBERS[i], inspect_json_u64(s, SEG_NUMBERS[i]));
        inspect_json_copy_alt(j, s);
        cJSON_AddBoolToObject(j, "draining", cJSON_IsTrue(cJSON_GetObjectItem(s, "draining")));
        cJSON_AddBoolToObject(j, "disk", cJSON_IsTrue(cJSON_GetObjectItem(s, "disk")));
        const cJSON *nt = cJSON_GetObjectItem(s, "node_tier");
        if (cJSON_IsObject(nt))
            cJSON_AddItemToObject(j, "node_tier", cJSON_Duplicate(nt, true));
        cap += inspect_json_u64(s, "capacity");
        used += inspect_json_u64(s, "used");
        cJSON_AddItemToArray(arr, j);
    }
    inspect_json_add_u64(doc, "count", (uint64_t)cJSON_GetArraySize(list));
    inspect_json_add_u64(doc, "capacity", cap);
    inspect_json_add_u64(doc, "used", used);
    return inspect_json_print(out, doc) ? MOONLET_ERR_INTERNAL_ERROR : MOONLET_OK;
}

static const inspect_col SEG_COLS[] = {
    {"SEGMENT", INSPECT_LEFT, 12, true, false},  {"NAME", INSPECT_LEFT, 12, true, true},
    {"OWNER", INSPECT_LEFT, 10, true, false},    {"PROTO", INSPECT_LEFT, 0, false, true},
    {"ENDPOINT", INSPECT_LEFT, 15, true, false}, {"CAPACITY", INSPECT_RIGHT, 0, false, false},
    {"USED", INSPECT_RIGHT, 0, false, false},    {"USE%", INSPECT_RIGHT, 0, false, true},
    {"OBJECTS", INSPECT_RIGHT, 0, false, false}, {"LAST PING", INSPECT_RIGHT, 0, false, false},
};
#define NSEG_COLS ((int)(sizeof(SEG_COLS) / sizeof(SEG_COLS[0])))

static double pct(uint64_t part, uint64_t whole)
{
    return whole ? 100.0 * (double)part / (double)whole : 0.0;
}

static int by_client(const void *a, const void *b)
{
    return strcmp(inspect_json_str(*(const cJSON *const *)a, "client_id"),
                  inspect_json_str(*(const cJSON *const *)b, "client_id"));
}

/* Each disk node's own figures (its disk segments carry them), once per
 * node, in client id order: the segments sorted, not searched per row. */
static void print_node_tiers(const cJSON *list, FILE *out)
{
    int n = cJSON_GetArraySize(list), k = 0;
    const cJSON **rows = n ? malloc((size_t)n * sizeof(*rows)) : NULL;
    const cJSON *s;
    if (!rows)
        return;
    cJSON_ArrayForEach(s, list)
        if (cJSON_IsObject(cJSON_GetObjectItem(s, "node_tier")))
            rows[k++] = s;
    qsort(rows, (size_t)k, sizeof(*rows), by_client);
    for (int i = 0; i < k; i++) {
        const char *id = inspect_json_str(rows[i], "client_id");
        if (i > 0 && strcmp(id, inspect_json_str(rows[i - 1], "client_id")) == 0)
            continue; /* its paths share its tier */
        const cJSON *nt = cJSON_GetObjectItem(rows[i], "node_tier");
        fprintf(out, "disk tier of %s: %" PRIu64 " reads (hits), %" PRIu64 " read errors, %" PRIu64
                " I/O errors, %" PRIu64 " checksum errors, %" PRIu64 " of %" PRIu64
                " I/Os in flight, %" PRIu64 " demoted, %" PRIu64 " demotions failed\n", id,
                inspect_json_u64(nt, "reads"), inspect_json_u64(nt, "read_errors"),
                inspect_json_u64(nt, "io_errors"), inspect_json_u64(nt, "checksum_errors"),
                inspect_json_u64(nt, "inflight"), inspect_json_u64(nt, "queue_depth"),
                inspect_json_u64(nt, "demoted"), inspect_json_u64(nt, "demote_failed"));
    }
    free(rows);
}

static int render_table(const cJSON *list, FILE *out, int width)
{
    inspect_table *t = inspect_table_new(SEG_COLS, NSEG_COLS, width);
    if (!t)
        return MOONLET_ERR_INTERNAL_ERROR;
    uint64_t cap = 0, used = 0, objects = 0, dcap = 0, dused = 0, dobjects = 0;
    int ndisk = 0;
    const cJSON *s;
    cJSON_ArrayForEach(s, list) {
        bool disk = cJSON_IsTrue(cJSON_GetObjectItem(s, "disk"));
        uint64_t c = inspect_json_u64(s, "capacity"), u = inspect_json_u64(s, "used");
        uint64_t n = inspect_json_u64(s, "objects"), age = inspect_json_u64(s, "last_ping_age_ms");
        char capb[32], usedb[32], pctb[16], objb[24], ageb[32];
        inspect_fmt_size(c, capb, sizeof(capb));
        inspect_fmt_size(u, usedb, sizeof(usedb));
        snprintf(pctb, sizeof(pctb), "%.1f%%", pct(u, c));
        snprintf(objb, sizeof(objb), "%" PRIu64, n);
        if (age == 0)
            snprintf(ageb, sizeof(ageb), "0 ms");
        else
            inspect_fmt_ms(age, ageb, sizeof(ageb));
        char proto[48], ep[2 * MOONLET_MAX_ENDPOINT_BYTES + 8];
        inspect_fmt_endpoints(s, proto, sizeof(proto), ep, sizeof(ep));
        if (disk) /* a disk tier's path, read through its node */
            snprintf(proto + strlen(proto), sizeof(proto) - strlen(proto), " disk");
        const char *row[] = {inspect_json_str(s, "segment_id"), inspect_json_str(s, "name"),
                             inspect_json_str(s, "client_id"), proto, ep, capb, usedb, pctb,
                             objb, ageb};
        if (inspect_table_add(t, row)) {
            inspect_table_free(t);
            return MOONLET_ERR_INTERNAL_ERROR;
        }
        if (disk) {
            ndisk++;
            dcap += c;
            dused += u;
            dobjects += n;
            continue;
        }
        cap += c;
        used += u;
        objects += n;
    }
    int n = cJSON_GetArraySize(list);
    if (n > 0)
        inspect_table_flush(t, out);
    inspect_table_free(t);
    /* Drains in progress: their replicas left to move (0: done, safe to stop). */
    cJSON_ArrayForEach(s, list) {
        if (cJSON_IsTrue(cJSON_GetObjectItem(s, "draining")))
            fprintf(out, "draining: segment %s of %s, %" PRIu64 " replicas left%s\n",
                    inspect_json_str(s, "segment_id"), inspect_json_str(s, "client_id"),
                    inspect_json_u64(s, "objects"),
                    inspect_json_u64(s, "objects") ? "" : " (done: safe to stop)");
    }
    char capb[32], usedb[32];
    inspect_fmt_size(cap, capb, sizeof(capb));
    inspect_fmt_size(used, usedb, sizeof(usedb));
    fprintf(out, "%d segment%s, %s capacity, %s used (%.1f%%), %" PRIu64 " replica%s\n",
            n - ndisk, n - ndisk == 1 ? "" : "s", capb, usedb, pct(used, cap), objects,
            objects == 1 ? "" : "s");
    if (ndisk) {
        inspect_fmt_size(dcap, capb, sizeof(capb));
        inspect_fmt_size(dused, usedb, sizeof(usedb));
        fprintf(out, "disk tier: %d path%s, %s capacity, %s used (%.1f%%), %" PRIu64 " object%s\n",
                ndisk, ndisk == 1 ? "" : "s", capb, usedb, pct(dused, dcap), dobjects,
                dobjects == 1 ? "" : "s");
    }
    print_node_tiers(list, out);
    return MOONLET_OK;
}

#define INSPECT_SEG_PAGE 1000u
#define INSPECT_SEG_MAX_PAGES 100000u /* a bound on a master that never ends the listing */

/* Every segment, one ListSegments page at a time, into one array. */
static int fetch_all(moonlet_master_client *mc, cJSON **list)
{
    *list = cJSON_CreateArray();
    if (!*list)
        return MOONLET_ERR_INTERNAL_ERROR;
    uint64_t cursor = 0;
    for (uint32_t page = 0; page < INSPECT_SEG_MAX_PAGES; page++) {
        cJSON *reply = NULL;
        int rc = moonlet_mc_list_segments_page(mc, cursor, INSPECT_SEG_PAGE, NULL, &reply);
        if (rc) {
            cJSON_Delete(*list);
            return rc;
        }
        bool legacy = cJSON_IsArray(reply);
        cJSON *segs = legacy ? reply : cJSON_GetObjectItem(reply, "segments");
        const cJSON *next = legacy ? NULL : cJSON_GetObjectItem(reply, "next_cursor");
        if (!cJSON_IsArray(segs) || (!legacy && !cJSON_IsNumber(next))) {
            cJSON_Delete(reply);
            cJSON_Delete(*list);
            return MOONLET_ERR_RPC_FAIL;
        }
        cJSON *s;
        while ((s = cJSON_DetachItemFromArray(segs, 0)))
            cJSON_AddItemToArray(*list, s);
        cursor = legacy ? 0 : (uint64_t)cJSON_GetNumberValue(next);
        cJSON_Delete(reply);
        if (cursor == 0)
            return MOONLET_OK;
    }
    return MOONLET_OK;
}

int inspect_render_segments(moonlet_master_client *mc, const inspect_opts *o, FILE *out,
                            int width)
{
    cJSON *list = NULL;
    int rc = fetch_all(mc, &list);
    if (rc)
        return rc;
    rc = o->json ? render_json(list, o, out) : render_table(list, out, width);
    cJSON_Delete(list);
    return rc;
}

int inspect_cmd_segments(const inspect_opts *o, int argc, char **argv)
{
    return inspect_render_once(o, inspect_render_segments, "ListSegments");
}
