/*
 * stats.c - `moonlet-inspect stats`: the master's counters from one Stats
 * call: objects and space, puts, removals and evictions, leases granted by
 * each operation, probe counters, and the histogram of how long
 * BatchProbeKey(LAST_HIT_ONLY) held a candidate's shard locks.
 *
 * The histogram's buckets are the master's (master.h,
 * MOONLET_LOCK_HIST_BUCKETS): <1us, <2us, <4us ... <1024us, >=1024us.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>

#include "inspect.h"
#include "master.h"
#include "moonlet/error.h"

/* Counters copied to the JSON document, under the names the Stats RPC uses. */
static const char *const STAT_FIELDS[] = {
    "objects", "bytes", "segments", "capacity", "used", "clients",
    "put_starts", "put_ends", "put_revokes", "put_timeouts", "removes",
    "evictions", "eviction_passes",
    "leases_get", "leases_exist", "leases_probe",
    "probe_calls_none", "probe_calls_last_hit_only", "probe_candidates_examined",
    "probe_recheck_fallbacks", "probe_lock_hold_max_ns", "unmounts_by_liveness",
    "resume_calls", "resume_candidates_examined", "resume_recheck_fallbacks",
    "leases_resume_kda", "leases_resume_kv", "resume_lock_hold_max_ns",
    "hard_pinned", "hard_pinned_bytes", "put_replacements", "put_starts_reserved",
    "under_replicated", "repairs_queued", "repairs_running", "repairs_done", "repairs_failed",
    "repairs_retried", "repairs_dropped", "repair_bytes", "disk_capacity", "disk_used",
    "disk_segments", "disk_objects", "demotions_queued", "demotions_staged", "demotions",
    "demotion_bytes", "demotions_dropped", "demotions_failed", "disk_evictions", "disk_announced",
};

#define HIST_FIELD "probe_lock_hold_us_hist"

static int hist_read(const cJSON *st, uint64_t h[MOONLET_LOCK_HIST_BUCKETS])
{
    const cJSON *arr = cJSON_GetObjectItem(st, HIST_FIELD);
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != MOONLET_LOCK_HIST_BUCKETS)
        return MOONLET_ERR_RPC_FAIL;
    for (int i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++) {
        const cJSON *v = cJSON_GetArrayItem(arr, i);
        h[i] = cJSON_IsNumber(v) && v->valuedouble > 0 ? (uint64_t)v->valuedouble : 0;
    }
    return MOONLET_OK;
}

/* Upper bound of bucket i in microseconds; 0 for the last (unbounded) one. */
static uint64_t hist_bound_us(int i)
{
    return i < MOONLET_LOCK_HIST_BUCKETS - 1 ? (uint64_t)1 << i : 0;
}

static int render_json(const cJSON *st, const inspect_opts *o, FILE *out)
{
    uint64_t h[MOONLET_LOCK_HIST_BUCKETS];
    int rc = hist_read(st, h);
    if (rc)
        return rc;
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "master", o->master);
    for (size_t i = 0; i < sizeof(STAT_FIELDS) / sizeof(STAT_FIELDS[0]); i++)
        inspect_json_add_u64(doc, STAT_FIELDS[i], inspect_json_u64(st, STAT_FIELDS[i]));
    const cJSON *nd = cJSON_GetObjectItem(st, "node_disk"); /* the nodes' disk tiers, summed */
    if (cJSON_IsObject(nd))
        cJSON_AddItemToObject(doc, "node_disk", cJSON_Duplicate(nd, true));
    cJSON *arr = cJSON_AddArrayToObject(doc, HIST_FIELD);
    for (int i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++) {
        cJSON *b = cJSON_CreateObject();
        if (hist_bound_us(i))
            inspect_json_add_u64(b, "lt_us", hist_bound_us(i));
        else
            cJSON_AddNullToObject(b, "lt_us");
        inspect_json_add_u64(b, "count", h[i]);
        cJSON_AddItemToArray(arr, b);
    }
    return inspect_json_print(out, doc) ? MOONLET_ERR_INTERNAL_ERROR : MOONLET_OK;
}

static const inspect_col KV_COLS[] = {{"", INSPECT_LEFT, 0, false, false}, {"", INSPECT_LEFT, 10, true, false}};

static int kv(inspect_table *t, const char *label, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int kv(inspect_table *t, const char *label, const char *fmt, ...)
{
    char value[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(value, sizeof(value), fmt, ap);
    va_end(ap);
    const char *row[] = {label, value};
    return inspect_table_add(t, row);
}

static int render_table(const cJSON *st, FILE *out, int width)
{
    uint64_t h[MOONLET_LOCK_HIST_BUCKETS];
    int rc = hist_read(st, h);
    if (rc)
        return rc;
#define U(name) inspect_json_u64(st, name)
    char bytes[32], cap[32], used[32], maxb[32];
    inspect_fmt_size(U("bytes"), bytes, sizeof(bytes));
    inspect_fmt_size(U("capacity"), cap, sizeof(cap));
    inspect_fmt_size(U("used"), used, sizeof(used));
    double pct = U("capacity") ? 100.0 * (double)U("used") / (double)U("capacity") : 0.0;
    inspect_table *t = inspect_table_new(KV_COLS, 2, width);
    if (!t)
        return MOONLET_ERR_INTERNAL_ERROR;
    int bad = 0;
    bad |= kv(t, "objects", "%" PRIu64 " (%s in objects)", U("objects"), bytes);
    bad |= kv(t, "segments", "%" PRIu64 " from %" PRIu64 " client%s: %s capacity, %s used (%.1f%%)",
              U("segments"), U("clients"), U("clients") == 1 ? "" : "s", cap, used, pct);
    bad |= kv(t, "puts", "%" PRIu64 " started, %" PRIu64 " ended, %" PRIu64 " revoked, %" PRIu64
              " timed out, %" PRIu64 " replicas replaced", U("put_starts"), U("put_ends"),
              U("put_revokes"), U("put_timeouts"), U("put_replacements"));
    bad |= kv(t, "removes", "%" PRIu64, U("removes"));
    bad |= kv(t, "evictions", "%" PRIu64 " objects in %" PRIu64 " passes", U("evictions"),
              U("eviction_passes"));
    char pinned[32];
    inspect_fmt_size(U("hard_pinned_bytes"), pinned, sizeof(pinned));
    bad |= kv(t, "hard pins", "%" PRIu64 " objects, %s with replicas (never evicted)",
              U("hard_pinned"), pinned);
    bad |= kv(t, "leases granted", "GetReplicaList %" PRIu64 ", ExistKey %" PRIu64
              ", BatchProbeKey %" PRIu64, U("leases_get"), U("leases_exist"), U("leases_probe"));
    bad |= kv(t, "probe calls", "none %" PRIu64 ", last-hit-only %" PRIu64, U("probe_calls_none"),
              U("probe_calls_last_hit_only"));
    bad |= kv(t, "probe candidates", "%" PRIu64 " examined, %" PRIu64 " recheck fallbacks",
              U("probe_candidates_examined"), U("probe_recheck_fallbacks"));
    bad |= kv(t, "ProbeResume", "%" PRIu64 " calls, %" PRIu64 " validated, %" PRIu64
              " fallbacks", U("resume_calls"), U("resume_candidates_examined"),
              U("resume_recheck_fallbacks"));
    bad |= kv(t, "ProbeResume leases", "%" PRIu64 " KDA + %" PRIu64 " KV keys",
              U("leases_resume_kda"), U("leases_resume_kv"));
    bad |= kv(t, "liveness unmounts", "%" PRIu64, U("unmounts_by_liveness"));
    char rbytes[32];
    inspect_fmt_size(U("repair_bytes"), rbytes, sizeof(rbytes));
    bad |= kv(t, "re-replication", "%" PRIu64 " under-replicated (%" PRIu64 " queued, %" PRIu64
              " copying); %" PRIu64 " done (%s), %" PRIu64 " retried, %" PRIu64 " failed, %" PRIu64
              " dropped", U("under_replicated"), U("repairs_queued"), U("repairs_running"),
              U("repairs_done"), rbytes, U("repairs_retried"), U("repairs_failed"),
              U("repairs_dropped"));
    if (U("disk_segments")) {
        char dcap[32], dused[32], dbytes[32];
        inspect_fmt_size(U("disk_capacity"), dcap, sizeof(dcap));
        inspect_fmt_size(U("disk_used"), dused, sizeof(dused));
        inspect_fmt_size(U("demotion_bytes"), dbytes, sizeof(dbytes));
        bad |= kv(t, "disk tier", "%" PRIu64 " segments: %s capacity, %s used, %" PRIu64
                  " objects", U("disk_segments"), dcap, dused, U("disk_objects"));
        bad |= kv(t, "demotions", "%" PRIu64 " done (%s), %" PRIu64 " queued, %" PRIu64
                  " copied ahead, %" PRIu64 " dropped, %" PRIu64 " failed; %" PRIu64
                  " disk evictions, %" PRIu64 " announced", U("demotions"), dbytes,
                  U("demotions_queued"), U("demotions_staged"), U("demotions_dropped"),
                  U("demotions_failed"), U("disk_evictions"), U("disk_announced"));
        const cJSON *nd = cJSON_GetObjectItem(st, "node_disk");
        if (cJSON_IsObject(nd))
            bad |= kv(t, "disk nodes", "%" PRIu64 " reads (hits), %" PRIu64 " read errors, %"
                      PRIu64 " I/O errors, %" PRIu64 " checksum errors, %" PRIu64 " of %" PRIu64
                      " I/Os in flight", inspect_json_u64(nd, "reads"),
                      inspect_json_u64(nd, "read_errors"), inspect_json_u64(nd, "io_errors"),
                      inspect_json_u64(nd, "checksum_errors"), inspect_json_u64(nd, "inflight"),
                      inspect_json_u64(nd, "queue_depth"));
    }
    if (bad) {
        inspect_table_free(t);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    inspect_table_flush(t, out);
    inspect_table_free(t);

    uint64_t total = 0, top = 0;
    for (int i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++) {
        total += h[i];
        top = h[i] > top ? h[i] : top;
    }
    snprintf(maxb, sizeof(maxb), "%.1f us", (double)U("probe_lock_hold_max_ns") / 1000.0);
    fprintf(out, "\nprobe lock hold (%" PRIu64 " candidate%s validated, longest %s)\n", total,
            total == 1 ? "" : "s", maxb);
    int bar_room = width - 26;
    bar_room = bar_room > 50 ? 50 : bar_room < 10 ? 10 : bar_room;
    for (int i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++) {
        char label[16];
        if (hist_bound_us(i))
            snprintf(label, sizeof(label), "<%" PRIu64 " us", hist_bound_us(i));
        else
            snprintf(label, sizeof(label), ">=%" PRIu64 " us", hist_bound_us(i - 1));
        int bar = top ? (int)((h[i] * (uint64_t)bar_room + top - 1) / top) : 0;
        fprintf(out, "  %9s %12" PRIu64 "%s", label, h[i], bar ? "  " : "");
        for (int b = 0; b < bar; b++)
            fputc('#', out);
        fputc('\n', out);
    }
#undef U
    return MOONLET_OK;
}

int inspect_render_stats(moonlet_master_client *mc, const inspect_opts *o, FILE *out, int width)
{
    cJSON *st = NULL;
    int rc = moonlet_mc_stats(mc, &st);
    if (rc)
        return rc;
    if (!cJSON_IsObject(st))
        rc = MOONLET_ERR_RPC_FAIL;
    else
        rc = o->json ? render_json(st, o, out) : render_table(st, out, width);
    cJSON_Delete(st);
    return rc;
}

int inspect_cmd_stats(const inspect_opts *o, int argc, char **argv)
{
    return inspect_render_once(o, inspect_render_stats, "Stats");
}
