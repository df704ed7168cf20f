/*
 * service.c - the master's RPC methods: call the master library with a
 * request's arguments, encode the result.  The arguments are declared once,
 * in the method table (methods.c); the RPC server decodes and checks them
 * against it before a handler runs (a missing, wrongly-typed or out-of-bound
 * argument is INVALID_PARAMS with a message naming it, and the connection
 * stays usable), so each handler receives its typed args struct.  Keys
 * longer than the limit are per-key INVALID_KEY (in batches) or a request
 * error (single-key calls), decided by the master library.
 *
 * Memory: decoded arguments and per-key results live in the request's arena
 * (the RPC loop's zone, cleared after each request): a steady stream of
 * probes allocates nothing that outlives a call, and handlers free nothing.
 * A batch may hold at most max_batch_keys keys (INVALID_PARAMS naming the
 * limit otherwise, before any key is decoded).
 *
 * Node identity: Ping, MountSegment, UnmountSegment and BindClient pass the
 * connection's session (a number kept in its conn_data slot, never reused)
 * to the master, which binds client ids to it; on_close unbinds them.
 *
 * Replication: ReplSnapshot and ReplStream are served on a server of their
 * own that authenticates with the masters' peer token when one is given
 * (opts->peer_token), so a holder of the clients' token cannot take the
 * stream nor read the snapshot's secrets.
 *
 * Roles (issue 33): with credentials (opts->creds) the RPC server checks
 * each method's roles (methods.c) before it decodes the arguments; then
 * authorize() below refuses a tenant the credential does not cover and a
 * forced Remove without the operator role, before the handler (and the HA
 * gate) runs.  Refusals are PERMISSION_DENIED, counted on /metrics.
 *
 * HA: with a role (role.h) every method but Echo and Hello goes through
 * one gate (gated() below) that answers NOT_LEADER with the leader's
 * address while this master may not serve; Hello tells the role and epoch
 * and makes the connection's later replies carry the epoch (reply_epoch).
 *
 * Locks: none here; the master library takes its own.
 */
#include "service.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cred.h"
#include "log.h"
#include "methods.h"
#include "monotime.h"
#include "moonlet/error.h"
#include "rpc_server.h"
#include "clock.h"
#include "wire.h"

struct moonlet_master_service {
    moonlet_master *m;
    const moonlet_role *role; /* NULL: no HA */
    moonlet_repl_log *repl;   /* NULL: no replication */
    /* With repl: ReplSnapshot / ReplStream on their own server (own port and
     * loop threads), so a standby's snapshot never queues behind writes
     * that wait for its acks on the main loops.  A stream, once open, is
     * the log's (repl_stream.h). */
    moonlet_rpc_server *repl_rpc;
    moonlet_rpc_method repl_methods[2];
    bool (*follower_status)(moonlet_repl_follower_status *st);
    moonlet_rpc_server *rpc;
    size_t max_batch_keys;
    size_t max_frame; /* the servers' frame limit: replication replies stay under half of it */
    moonlet_rpc_method *methods; /* the server's table (without opts->disabled_method) */
};

/* A loop that has served for this long without a break yields its core
 * once, so the callers it answered run before the end of its time slice
 * (rpc_server.h, yield_after_us).  300 us: with 8 callers of
 * BatchExistKey(640) on 2 cores it took the p99 from about 1.3 ms to about
 * 0.8; 100-200 us also cost small puts a context switch too often
 * (docs/benchmarks.md, "The master under many clients"). */
#define MASTER_LOOP_YIELD_US 300

#define SVC(ctx) ((moonlet_master_service *)(ctx)->server_ctx)
#define M(ctx) (SVC(ctx)->m)

/* The identity of the connection a call came on (for the node-identity
 * calls): a number never reused, kept in the connection's conn_data slot and
 * dropped by on_close.  0 when out of memory (then treated as no session:
 * refused where identity matters, see session_of callers). */
static _Atomic uint64_t g_next_session = 1;

/* A connection's conn_data: its session number (first: read as a uint64_t)
 * and whether it sent Hello (its replies then carry the epoch). */
struct conn_state {
    uint64_t session;
    _Atomic bool hello;
};

static struct conn_state *conn_state_of(moonlet_rpc_ctx *ctx)
{
    if (!*ctx->conn_data) {
        struct conn_state *cs = calloc(1, sizeof(*cs));
        if (!cs)
            return NULL;
        cs->session = atomic_fetch_add(&g_next_session, 1);
        *ctx->conn_data = cs;
    }
    return *ctx->conn_data;
}

static uint64_t session_of(moonlet_rpc_ctx *ctx)
{
    struct conn_state *cs = conn_state_of(ctx);
    return cs ? cs->session : 0;
}

static void session_close(void *server_ctx, void *conn_data)
{
    if (!conn_data)
        return;
    moonlet_master_session_closed(((moonlet_master_service *)server_ctx)->m,
                                  ((struct conn_state *)conn_data)->session);
    free(conn_data);
}

/* The epoch for a reply on this connection: only after Hello, only with HA. */
static uint64_t reply_epoch(void *server_ctx, void *conn_data)
{
    const moonlet_master_service *s = server_ctx;
    if (!s->role || !conn_data || !atomic_load(&((struct conn_state *)conn_data)->hello))
        return 0;
    uint64_t epoch;
    moonlet_role_gate(s->role, moonlet_mono_ms(), &epoch);
    return epoch;
}

#define SESSION_OR_FAIL(ctx, out, var)                                                         \
    uint64_t var = session_of(ctx);                                                            \
    if (!var)                                                                                  \
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory")

/* Handlers get their arguments decoded and checked against the method
 * table (methods.c) before they run, as `a` (rpc_server.h). */
#define HANDLER MOONLET_RPC_HANDLER

/* Per-key results, from the request's arena. */
static int32_t *results_alloc(moonlet_rpc_ctx *ctx, size_t n)
{
    return moonlet_rpc_alloc(ctx, n * sizeof(int32_t));
}

static void pack_results(msgpack_packer *out, const int32_t *r, size_t n)
{
    msgpack_pack_array(out, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        if (r[i] == 1)
            msgpack_pack_true(out);
        else if (r[i] == 0)
            msgpack_pack_false(out);
        else
            msgpack_pack_int32(out, r[i]);
    }
}

static void pack_u64_kv(msgpack_packer *pk, const char *k, uint64_t v)
{
    moonlet_pack_key(pk, k);
    msgpack_pack_uint64(pk, v);
}

static void pack_str_kv(msgpack_packer *pk, const char *k, const char *v)
{
    moonlet_pack_key(pk, k);
    moonlet_pack_cstr(pk, v);
}

static int reply(msgpack_packer *out, int rc)
{
    if (rc)
        return moonlet_rpc_error(out, rc, "%s", moonlet_strerror(rc));
    msgpack_pack_nil(out);
    return MOONLET_OK;
}

static void pack_hist_kv(msgpack_packer *pk, const char *k,
                         const uint64_t hist[MOONLET_LOCK_HIST_BUCKETS])
{
    moonlet_pack_key(pk, k);
    msgpack_pack_array(pk, MOONLET_LOCK_HIST_BUCKETS);
    for (unsigned i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++)
        msgpack_pack_uint64(pk, hist[i]);
}

/* One entry of an inspection map (segments, replicas, Stats): its key, the
 * kind of its value and where the value sits in the view struct.  A table
 * of them, walked by pack_fields, is the map's key list written once. */
typedef enum { F_STR, F_U64, F_BOOL, F_HIST } field_kind;

typedef struct map_field {
    const char *key;
    field_kind kind;
    size_t off;
} map_field;

#define FIELD(T, kind, key, member) {key, kind, offsetof(T, member)}
#define NFIELDS(t) ((uint32_t)(sizeof(t) / sizeof((t)[0])))

/* Packs the n entries of table f, values read from view (map header not included). */
static void pack_fields(msgpack_packer *pk, const void *view, const map_field *f, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        const void *v = (const char *)view + f[i].off;
        switch (f[i].kind) {
        case F_STR:
            pack_str_kv(pk, f[i].key, *(const char *const *)v);
            break;
        case F_U64:
            pack_u64_kv(pk, f[i].key, *(const uint64_t *)v);
            break;
        case F_BOOL:
            moonlet_pack_key(pk, f[i].key);
            *(const bool *)v ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
            break;
        case F_HIST:
            pack_hist_kv(pk, f[i].key, v);
            break;
        }
    }
}

/* An inspection map of a segment or a replica: the segment's second
 * endpoint first when it has one (alt_id not NULL), then table f read from
 * view; the map has room for `extra` entries the caller packs after. */
static void pack_view_map(msgpack_packer *pk, const void *view, const map_field *f, uint32_t n,
                          uint32_t extra, const char *alt_id, const char *alt_endpoint,
                          const char *alt_protocol)
{
    msgpack_pack_map(pk, (alt_id ? 3 : 0) + n + extra);
    if (alt_id) {
        pack_str_kv(pk, "alt_segment_id", alt_id);
        pack_str_kv(pk, "alt_endpoint", alt_endpoint);
        pack_str_kv(pk, "alt_protocol", alt_protocol);
    }
    pack_fields(pk, view, f, n);
}

/* A reply array whose length is known only after a visit (replica
 * descriptors, segments, keys, repair jobs): the visitor packs the elements
 * into a side buffer, then the header and the bytes go out. */
struct side_array {
    msgpack_sbuffer buf;
    msgpack_packer pk;
    uint32_t count;
};

static void side_array_init(struct side_array *sa)
{
    msgpack_sbuffer_init(&sa->buf);
    msgpack_packer_init(&sa->pk, &sa->buf, msgpack_sbuffer_write);
    sa->count = 0;
}

/* Packs array(count) followed by the side buffer's bytes into out, and
 * empties the side array for the next visit (a batch's next key). */
static void side_array_emit(struct side_array *sa, msgpack_packer *out)
{
    msgpack_pack_array(out, sa->count);
    if (sa->buf.size)
        out->callback(out->data, sa->buf.data, sa->buf.size);
    sa->buf.size = 0;
    sa->count = 0;
}

/* side_array_emit, then frees the side buffer. */
static void side_array_flush(struct side_array *sa, msgpack_packer *out)
{
    side_array_emit(sa, out);
    msgpack_sbuffer_destroy(&sa->buf);
}

/* The visit failed: drop what it packed, answer rc. */
static int side_array_fail(struct side_array *sa, msgpack_packer *out, int rc)
{
    msgpack_sbuffer_destroy(&sa->buf);
    return reply(out, rc);
}

/* A listing's reply: rc when the visits failed, else a map of two pairs, the
 * first `name`: the side array; the caller packs the second when 0 returns. */
static int side_array_listing(struct side_array *sa, msgpack_packer *out, int rc,
                              const char *name)
{
    if (rc)
        return side_array_fail(sa, out, rc);
    msgpack_pack_map(out, 2);
    moonlet_pack_key(out, name);
    side_array_flush(sa, out);
    return MOONLET_OK;
}

struct replica_pack {
    struct side_array a;
    bool as_map; /* inspection: a map per replica; data path: a compact array */
    bool with_cap; /* PutStart: 4 more fields per replica (write capability, put TTL) */
};

/* A replica in InspectKey's map (then its "status", by name). */
static const map_field replica_fields[] = {
    FIELD(moonlet_replica_view, F_STR, "segment_id", segment_id),
    FIELD(moonlet_replica_view, F_STR, "segment_name", segment_name),
    FIELD(moonlet_replica_view, F_STR, "endpoint", endpoint),
    FIELD(moonlet_replica_view, F_STR, "protocol", protocol),
    FIELD(moonlet_replica_view, F_U64, "offset", offset),
    FIELD(moonlet_replica_view, F_U64, "length", size),
    FIELD(moonlet_replica_view, F_U64, "base", base),
};

static void replica_pack_visit(void *arg, const moonlet_replica_view *r)
{
    struct replica_pack *rp = arg;
    msgpack_packer *pk = &rp->a.pk;
    rp->a.count++;
    bool alt = r->alt_segment_id != NULL;
    if (rp->as_map) {
        pack_view_map(pk, r, replica_fields, NFIELDS(replica_fields), 2, r->alt_segment_id,
                      r->alt_endpoint, r->alt_protocol);
        pack_str_kv(pk, "status", r->status == MOONLET_REPLICA_COMPLETE ? "COMPLETE" : "INITIALIZED");
        pack_str_kv(pk, "tier", r->disk ? "disk" : "dram");
        return;
    }
    /* A second endpoint goes after the capability fields (zeros outside
     * PutStart: cap_tag 0 is "no capability"), so old decoders skip it. */
    msgpack_pack_array(pk, alt ? 14 : rp->with_cap ? 11 : 7);
    moonlet_pack_cstr(pk, r->segment_id);
    moonlet_pack_cstr(pk, r->endpoint);
    moonlet_pack_cstr(pk, r->protocol);
    msgpack_pack_uint64(pk, r->base);
    msgpack_pack_uint64(pk, r->offset);
    msgpack_pack_uint64(pk, r->size);
    /* A disk replica's status carries MOONLET_REPLICA_ON_DISK: the client
     * reads it whole through its node (common/replica.h). */
    msgpack_pack_uint8(pk, (uint8_t)(r->status | (r->disk ? MOONLET_REPLICA_ON_DISK : 0)));
    if (rp->with_cap || alt) { /* cap_tag 0: the segment checks no capability */
        bool cap = rp->with_cap && r->has_cap;
        msgpack_pack_uint64(pk, cap ? r->cap_len : 0);
        msgpack_pack_uint64(pk, cap ? r->cap_expiry_ms : 0);
        msgpack_pack_uint64(pk, cap ? r->cap_tag : 0);
        msgpack_pack_uint64(pk, rp->with_cap ? r->put_ttl_ms : 0);
    }
    if (alt) {
        moonlet_pack_cstr(pk, r->alt_segment_id);
        moonlet_pack_cstr(pk, r->alt_endpoint);
        moonlet_pack_cstr(pk, r->alt_protocol);
    }
}

static void replica_pack_init(struct replica_pack *rp, bool as_map, bool with_cap)
{
    side_array_init(&rp->a);
    rp->as_map = as_map;
    rp->with_cap = with_cap;
}

/* ---- handlers ----------------------------------------------------------------- */

static int h_echo(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    msgpack_pack_nil(out);
    return MOONLET_OK;
}

HANDLER(h_ping, moonlet_args_ping)
{
    SESSION_OR_FAIL(ctx, out, session);
    uint32_t segs = 0;
    int rc = moonlet_master_ping_as(M(ctx), a->client_id, session, &segs);
    if (rc == MOONLET_ERR_ILLEGAL_CLIENT)
        return moonlet_rpc_error(out, rc, "client id %.*s is held by another connection",
                                 (int)a->client_id.len, a->client_id.ptr);
    if (rc == MOONLET_OK && a->nargs > 1)
        moonlet_master_note_node_clock(M(ctx), a->client_id, a->node_clock_ms);
    if (rc == MOONLET_OK && a->nargs > 2)
        moonlet_master_note_node_disk(M(ctx), a->client_id, a->disk.v, a->disk.n);
    if (rc)
        return reply(out, rc);
    msgpack_pack_map(out, 1);
    pack_u64_kv(out, "segments", segs);
    return MOONLET_OK;
}

HANDLER(h_mount, moonlet_args_mount)
{
    if (a->size > MOONLET_MAX_SEGMENT_BYTES || a->base > UINT64_MAX - a->size)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "segment size %llu at base %llu: "
                                 "at most %llu bytes, and base + size must not wrap",
                                 (unsigned long long)a->size, (unsigned long long)a->base,
                                 (unsigned long long)MOONLET_MAX_SEGMENT_BYTES);
    moonlet_segment_desc d = {.client_id = a->client_id, .segment_id = a->segment_id,
                              .name = a->name, .base = a->base, .size = a->size,
                              .endpoint = a->endpoint, .protocol = a->protocol,
                              .write_key = (const uint8_t *)a->write_key.ptr,
                              .node_clock_ms = a->node_clock_ms, .alt_endpoint = a->alt_endpoint,
                              .alt_segment_id = a->alt_segment_id,
                              .alt_protocol = a->alt_protocol, .disk = a->disk};
    SESSION_OR_FAIL(ctx, out, session);
    int rc = moonlet_master_mount_segment_as(M(ctx), &d, session);
    if (rc == MOONLET_ERR_ILLEGAL_CLIENT)
        return moonlet_rpc_error(out, rc, "client id %s is held by another live node (same "
                                 "--client-id?); it is free once that node stops pinging",
                                 a->client_id);
    return reply(out, rc);
}

HANDLER(h_bind_client, moonlet_args_bind)
{
    SESSION_OR_FAIL(ctx, out, session);
    int rc = moonlet_master_bind_client(M(ctx), a->client_id, a->secret, session);
    if (rc == MOONLET_ERR_ILLEGAL_CLIENT)
        return moonlet_rpc_error(out, rc, "client id %.*s is held by another live node (same "
                                 "--client-id?); it is free once that node stops pinging",
                                 (int)a->client_id.len, a->client_id.ptr);
    return reply(out, rc);
}

HANDLER(h_unmount, moonlet_args_unmount)
{
    SESSION_OR_FAIL(ctx, out, session);
    return reply(out, moonlet_master_unmount_segment_as(M(ctx), a->client_id, a->segment_id,
                                                        session));
}

/* Set by h_put_start when the put went to ranges the standby already holds
 * reserved (pool.c), read by semi_sync() right after on the same thread:
 * such a PutStart is answered without a standby round trip. */
static __thread bool t_put_covered;

HANDLER(h_put_start, moonlet_args_put_start)
{
    moonlet_master_put_opts po = {.replica_num = (uint32_t)a->replica_num, .soft_pin = a->soft_pin,
                                  .preferred = a->preferred_segments.v,
                                  .npreferred = a->preferred_segments.n, .hard_pin = a->hard_pin,
                                  .soft_pin_ttl_ms = a->soft_pin_ttl_ms, .covered = &t_put_covered};
    struct replica_pack rp;
    replica_pack_init(&rp, false, true);
    int rc = moonlet_master_put_start_opts(M(ctx), a->tenant, a->key, a->size, &po,
                                           replica_pack_visit, &rp);
    if (rc)
        return side_array_fail(&rp.a, out, rc);
    side_array_flush(&rp.a, out);
    return MOONLET_OK;
}

HANDLER(h_put_end, moonlet_args_put_end)
{
    return reply(out, moonlet_master_put_end(M(ctx), a->tenant, a->key,
                                             a->nargs > 2 ? &a->checksum : NULL));
}

HANDLER(h_put_revoke, moonlet_args_key)
{
    return reply(out, moonlet_master_put_revoke(M(ctx), a->tenant, a->key));
}

HANDLER(h_put_replace, moonlet_args_put_replace)
{
    struct replica_pack rp;
    replica_pack_init(&rp, false, true);
    int rc = moonlet_master_put_replace_replica(M(ctx), a->tenant, a->key, a->segment_id,
                                                a->excluded_segments.v, a->excluded_segments.n,
                                                replica_pack_visit, &rp);
    if (rc) {
        msgpack_sbuffer_destroy(&rp.a.buf);
        if (rc == MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS)
            return moonlet_rpc_error(out, rc, "the put already replaced %u replicas; revoke it",
                                     MOONLET_MAX_PUT_REPLACEMENTS);
        if (rc == MOONLET_ERR_INVALID_PARAMS)
            return moonlet_rpc_error(out, rc, "segment %.*s holds no replica of this put",
                                     (int)a->segment_id.len, a->segment_id.ptr);
        if (rc == MOONLET_ERR_INVALID_WRITE)
            return moonlet_rpc_error(out, rc, "the put is not in progress (sealed, or past "
                                     "its deadline)");
        return reply(out, rc);
    }
    side_array_flush(&rp.a, out); /* [replica]: the replacement, with its capability */
    return MOONLET_OK;
}

HANDLER(h_get_replicas, moonlet_args_key)
{
    struct replica_pack rp;
    replica_pack_init(&rp, false, false);
    uint64_t size = 0, ttl = 0, checksum = 0;
    bool has_ck = false;
    int rc = moonlet_master_get_replica_list_ck(M(ctx), a->tenant, a->key, &size, &ttl, &has_ck,
                                                &checksum, replica_pack_visit, &rp);
    if (rc)
        return side_array_fail(&rp.a, out, rc);
    msgpack_pack_array(out, 4);
    msgpack_pack_uint64(out, size);
    msgpack_pack_uint64(out, ttl);
    side_array_flush(&rp.a, out);
    has_ck ? msgpack_pack_uint64(out, checksum) : msgpack_pack_nil(out); /* XXH3-64, nil: none */
    return MOONLET_OK;
}

/* ---- batches of the put and get calls ------------------------------------------- */

/* The per-key calls of a batch, each as its single call does it, one
 * request for all: one bad key gets its own code and never fails the batch.
 * Results are an array of one entry per key, in order: the single call's
 * result, or its error code (a negative integer).  Under HA the batch is one
 * write (semi_sync): one standby wait for all its records. */

/* Per-key codes: 0 or a negative error code. */
static void pack_codes(msgpack_packer *out, const int32_t *r, size_t n)
{
    msgpack_pack_array(out, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_int32(out, r[i]);
}

HANDLER(h_batch_put_start, moonlet_args_batch_put_start)
{
    uint32_t n = a->keys.n;
    if (a->sizes.n != n)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "BatchPutStart: %u sizes for "
                                 "%u keys (one size per key)", a->sizes.n, n);
    bool covered = false, all_covered = n > 0;
    uint64_t put_id = 0;
    moonlet_master_put_opts po = {.replica_num = (uint32_t)a->replica_num, .soft_pin = a->soft_pin,
                                  .preferred = a->preferred_segments.v,
                                  .npreferred = a->preferred_segments.n, .hard_pin = a->hard_pin,
                                  .soft_pin_ttl_ms = a->soft_pin_ttl_ms, .covered = &covered,
                                  .put_id = &put_id};
    struct replica_pack rp;
    replica_pack_init(&rp, false, true);
    msgpack_pack_array(out, n);
    for (uint32_t i = 0; i < n; i++) {
        covered = false;
        int rc = moonlet_master_put_start_opts(M(ctx), a->tenant, a->keys.v[i], a->sizes.v[i], &po,
                                               replica_pack_visit, &rp);
        all_covered &= rc == MOONLET_OK && covered;
        if (rc) {
            rp.a.buf.size = 0; /* what a failed call visited, if anything */
            rp.a.count = 0;
            msgpack_pack_int32(out, rc);
        } else { /* [put_id, [replica...]]: PutStart's replicas, and the put's id */
            msgpack_pack_array(out, 2);
            msgpack_pack_uint64(out, put_id);
            side_array_emit(&rp.a, out);
        }
    }
    msgpack_sbuffer_destroy(&rp.a.buf);
    t_put_covered = all_covered; /* every put in reserved ranges: no standby wait */
    return MOONLET_OK;
}

HANDLER(h_batch_put_end, moonlet_args_batch_put_end)
{
    uint32_t n = a->keys.n;
    bool with_ck = a->nargs > 2 && a->checksums.n, with_ids = a->nargs > 3 && a->put_ids.n;
    if ((with_ck && a->checksums.n != n) || (with_ids && a->put_ids.n != n))
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "BatchPutEnd: %u checksums and "
                                 "%u put ids for %u keys (one per key, or none)", a->checksums.n,
                                 a->put_ids.n, n);
    int32_t *r = results_alloc(ctx, n);
    if (!r)
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    for (uint32_t i = 0; i < n; i++)
        r[i] = moonlet_master_put_end_ex(M(ctx), a->tenant, a->keys.v[i],
                                         with_ck ? &a->checksums.v[i] : NULL,
                                         with_ids && a->put_ids.v[i] ? &a->put_ids.v[i] : NULL);
    pack_codes(out, r, n);
    return MOONLET_OK;
}

HANDLER(h_batch_put_revoke, moonlet_args_batch_put_revoke)
{
    uint32_t n = a->keys.n;
    bool with_ids = a->nargs > 2 && a->put_ids.n;
    if (with_ids && a->put_ids.n != n)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "BatchPutRevoke: %u put ids for "
                                 "%u keys (one per key, or none)", a->put_ids.n, n);
    int32_t *r = results_alloc(ctx, n);
    if (!r)
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    for (uint32_t i = 0; i < n; i++)
        r[i] = moonlet_master_put_revoke_ex(M(ctx), a->tenant, a->keys.v[i],
                                            with_ids && a->put_ids.v[i] ? &a->put_ids.v[i] : NULL);
    pack_codes(out, r, n);
    return MOONLET_OK;
}

/* Per key: GetReplicaList's result (a lease granted, as it grants one) or
 * its error code. */
HANDLER(h_batch_get_replicas, moonlet_args_batch_exist)
{
    struct replica_pack rp;
    replica_pack_init(&rp, false, false);
    msgpack_pack_array(out, a->keys.n);
    for (uint32_t i = 0; i < a->keys.n; i++) {
        uint64_t size = 0, ttl = 0, checksum = 0;
        bool has_ck = false;
        int rc = moonlet_master_get_replica_list_ck(M(ctx), a->tenant, a->keys.v[i], &size, &ttl,
                                                    &has_ck, &checksum, replica_pack_visit, &rp);
        if (rc) {
            rp.a.buf.size = 0;
            rp.a.count = 0;
            msgpack_pack_int32(out, rc);
            continue;
        }
        msgpack_pack_array(out, 4);
        msgpack_pack_uint64(out, size);
        msgpack_pack_uint64(out, ttl);
        side_array_emit(&rp.a, out);
        has_ck ? msgpack_pack_uint64(out, checksum) : msgpack_pack_nil(out);
    }
    msgpack_sbuffer_destroy(&rp.a.buf);
    return MOONLET_OK;
}

static int single_exist(moonlet_rpc_ctx *ctx, const moonlet_args_key *a, msgpack_packer *out,
                        bool lease)
{
    bool ex = false;
    int rc = lease ? moonlet_master_exist_key(M(ctx), a->tenant, a->key, &ex)
                   : moonlet_master_probe_key(M(ctx), a->tenant, a->key, &ex);
    if (rc)
        return reply(out, rc);
    ex ? msgpack_pack_true(out) : msgpack_pack_false(out);
    return MOONLET_OK;
}

HANDLER(h_exist, moonlet_args_key) { return single_exist(ctx, a, out, true); }

HANDLER(h_probe, moonlet_args_key) { return single_exist(ctx, a, out, false); }

/* BatchExistKey (policy NULL: leases every hit) and BatchProbeKey. */
static int batch_keys(moonlet_rpc_ctx *ctx, moonlet_str tenant,
                      const moonlet_grant_lease_policy *policy, const moonlet_strv *keys,
                      msgpack_packer *out)
{
    int32_t *results = results_alloc(ctx, keys->n);
    if (!results)
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    int rc = policy ? moonlet_master_batch_probe_key(M(ctx), tenant, policy, keys->v, keys->n,
                                                     results)
                    : moonlet_master_batch_exist_key(M(ctx), tenant, keys->v, keys->n, results);
    if (rc == MOONLET_ERR_INVALID_PARAMS && policy)
        return moonlet_rpc_error(out, rc, "invalid GrantLeasePolicy (mode %u, candidate_size "
                                 "%llu) for %u keys", policy->lease_mode,
                                 (unsigned long long)policy->candidate_size, keys->n);
    if (rc)
        return reply(out, rc);
    pack_results(out, results, keys->n);
    return MOONLET_OK;
}

HANDLER(h_batch_exist, moonlet_args_batch_exist)
{
    return batch_keys(ctx, a->tenant, NULL, &a->keys, out);
}

HANDLER(h_batch_probe, moonlet_args_batch_probe)
{
    moonlet_grant_lease_policy p = {.lease_mode = (uint8_t)a->lease_mode,
                                    .candidate_size = a->candidate_size};
    return batch_keys(ctx, a->tenant, &p, &a->keys, out);
}

/*
 * ProbeResume -> [kv_prefix, selected (-1: none), mask: bin of one byte (0/1)
 * per KDA key].  The KV plus KDA keys together may number at most
 * max_batch_keys.
 */
HANDLER(h_probe_resume, moonlet_args_probe_resume)
{
    size_t n_kv = a->kv_keys.n, n_kda = a->kda_keys.n, n_b = a->boundaries.n;
    if (n_kv + n_kda > SVC(ctx)->max_batch_keys)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS,
                                 "batch of %zu keys exceeds the limit of %zu keys "
                                 "(--max-batch-keys)", n_kv + n_kda, SVC(ctx)->max_batch_keys);
    if (n_b > n_kda)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS,
                                 "%zu boundaries for %zu KDA keys", n_b, n_kda);
    int32_t *mask = results_alloc(ctx, n_kda);
    char *mb = moonlet_rpc_alloc(ctx, n_kda);
    if (!mask || !mb)
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    moonlet_probe_resume_out r;
    int rc = moonlet_master_probe_resume(M(ctx), a->tenant, a->kv_keys.v, n_kv, a->kda_keys.v,
                                         n_kda, a->candidate_size, a->boundaries.v, n_b, &r, mask);
    if (rc == MOONLET_ERR_INVALID_PARAMS)
        return moonlet_rpc_error(out, rc, "invalid ProbeResume: candidate_size %llu, %zu KDA "
                                 "keys, %zu boundaries (each at most %zu KV keys)",
                                 (unsigned long long)a->candidate_size, n_kda, n_b, n_kv);
    if (rc)
        return reply(out, rc);
    /* the mask as one bin of n_kda bytes (0 / 1): one object to decode
     * instead of n_kda booleans */
    for (size_t i = 0; i < n_kda; i++)
        mb[i] = (char)(mask[i] == 1);
    msgpack_pack_array(out, 3);
    msgpack_pack_uint64(out, r.kv_prefix);
    msgpack_pack_int64(out, r.selected);
    msgpack_pack_bin(out, (uint32_t)n_kda);
    msgpack_pack_bin_body(out, mb, n_kda);
    return MOONLET_OK;
}

HANDLER(h_remove, moonlet_args_remove)
{
    return reply(out, moonlet_master_remove_ex(M(ctx), a->tenant, a->key, a->force));
}

HANDLER(h_remove_all, moonlet_args_remove_all)
{
    uint64_t removed = 0;
    int rc = moonlet_master_remove_all_ex(M(ctx), a->tenant, a->force, &removed);
    if (rc)
        return reply(out, rc);
    msgpack_pack_uint64(out, removed);
    return MOONLET_OK;
}

/* ---- inspection ------------------------------------------------------------------- */

/* A segment in ListSegments' map. */
static const map_field segment_fields[] = {
    FIELD(moonlet_segment_view, F_STR, "segment_id", segment_id),
    FIELD(moonlet_segment_view, F_STR, "name", name),
    FIELD(moonlet_segment_view, F_STR, "client_id", client_id),
    FIELD(moonlet_segment_view, F_STR, "endpoint", endpoint),
    FIELD(moonlet_segment_view, F_STR, "protocol", protocol),
    FIELD(moonlet_segment_view, F_U64, "base", base),
    FIELD(moonlet_segment_view, F_U64, "capacity", capacity),
    FIELD(moonlet_segment_view, F_U64, "used", used),
    FIELD(moonlet_segment_view, F_U64, "objects", objects),
    FIELD(moonlet_segment_view, F_U64, "last_ping_age_ms", last_ping_age_ms),
    FIELD(moonlet_segment_view, F_BOOL, "draining", draining),
    FIELD(moonlet_segment_view, F_BOOL, "disk", disk),
};

/* {name: value} of a node's disk tier figures (node_disk_fields.h). */
static void pack_node_disk(msgpack_packer *pk, const uint64_t *v)
{
    msgpack_pack_map(pk, MOONLET_NODE_DISK_NFIELDS);
    for (uint32_t k = 0; k < MOONLET_NODE_DISK_NFIELDS; k++)
        pack_u64_kv(pk, moonlet_node_disk_names[k], v[k]);
}

static void seg_visit(void *arg, const moonlet_segment_view *s)
{
    struct side_array *sa = arg;
    sa->count++;
    pack_view_map(&sa->pk, s, segment_fields, NFIELDS(segment_fields), s->node_disk ? 1 : 0,
                  s->alt_segment_id, s->alt_endpoint, s->alt_protocol);
    if (s->node_disk) { /* a disk segment: its node's disk tier, as its last Ping said */
        moonlet_pack_key(&sa->pk, "node_tier");
        pack_node_disk(&sa->pk, s->node_disk);
    }
}

/* Optional trailing [cursor, limit, client_id] (docs/protocol.md): with any,
 * one page as {segments, next_cursor}; with none, the old reply (a bare
 * array), bounded by the first MOONLET_LIST_SEGMENTS_LEGACY segments. */
#define MOONLET_LIST_SEGMENTS_LEGACY 4096u
HANDLER(h_list_segments, moonlet_args_list_segments)
{
    uint64_t limit = a->nargs > 0 ? a->limit : MOONLET_LIST_SEGMENTS_LEGACY, next = 0;
    const char *client = a->client_id && a->client_id[0] ? a->client_id : NULL;
    if (a->nargs > 0 && limit == 0)
        limit = MOONLET_LIST_SEGMENTS_DEFAULT_LIMIT;
    if (limit > MOONLET_LIST_SEGMENTS_MAX_LIMIT)
        return reply(out, MOONLET_ERR_INVALID_PARAMS);
    struct side_array sa;
    side_array_init(&sa);
    int rc = moonlet_master_list_segments_page(M(ctx), client, a->cursor,
                                               (uint32_t)limit, seg_visit, &sa, &next);
    if (rc)
        return side_array_fail(&sa, out, rc);
    if (a->nargs > 0) {
        msgpack_pack_map(out, 2);
        moonlet_pack_key(out, "segments");
    }
    side_array_flush(&sa, out);
    if (a->nargs > 0)
        pack_u64_kv(out, "next_cursor", next);
    return MOONLET_OK;
}

static void pack_key_view(msgpack_packer *pk, const moonlet_key_view *k, uint32_t extra)
{
    msgpack_pack_map(pk, 8 + extra);
    moonlet_pack_key(pk, "key");
    moonlet_pack_str(pk, k->key, k->key_len);
    pack_u64_kv(pk, "size", k->size);
    moonlet_pack_key(pk, "complete");
    k->complete ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    pack_u64_kv(pk, "replica_count", k->replicas);
    pack_u64_kv(pk, "readable_replicas", k->readable_replicas);
    pack_u64_kv(pk, "lease_remaining_ms", k->lease_remaining_ms);
    pack_u64_kv(pk, "soft_pin_remaining_ms", k->soft_pin_remaining_ms);
    moonlet_pack_key(pk, "hard_pinned");
    k->hard_pinned ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
}

static void key_visit(void *arg, const moonlet_key_view *k)
{
    struct side_array *sa = arg;
    sa->count++;
    pack_key_view(&sa->pk, k, 0);
}

HANDLER(h_list_keys, moonlet_args_list_keys)
{
    struct side_array sa;
    side_array_init(&sa);
    char next[MOONLET_CURSOR_BYTES];
    int rc = moonlet_master_list_keys(M(ctx), a->tenant, a->prefix, a->cursor, (uint32_t)a->limit,
                                      key_visit, &sa, next);
    if (side_array_listing(&sa, out, rc, "keys"))
        return rc;
    pack_str_kv(out, "next_cursor", next);
    return MOONLET_OK;
}

HANDLER(h_inspect_key, moonlet_args_key)
{
    struct replica_pack rp;
    replica_pack_init(&rp, true, false);
    moonlet_key_view v;
    int rc = moonlet_master_inspect_key(M(ctx), a->tenant, a->key, &v, replica_pack_visit, &rp);
    if (rc)
        return side_array_fail(&rp.a, out, rc);
    v.key = a->key.ptr; /* the view's key pointer is only valid under the lock */
    pack_key_view(out, &v, 1);
    moonlet_pack_key(out, "replicas");
    side_array_flush(&rp.a, out);
    return MOONLET_OK;
}

static void tenant_visit(void *arg, const moonlet_tenant_view *t)
{
    struct side_array *sa = arg;
    sa->count++;
    msgpack_pack_map(&sa->pk, 3);
    moonlet_pack_key(&sa->pk, "tenant");
    moonlet_pack_str(&sa->pk, t->name, t->name_len);
    pack_u64_kv(&sa->pk, "keys", t->keys);
    pack_u64_kv(&sa->pk, "bytes", t->bytes);
}

HANDLER(h_list_tenants, moonlet_args_list_tenants)
{
    struct side_array sa;
    side_array_init(&sa);
    uint32_t total = 0;
    int rc = moonlet_master_list_tenants(M(ctx), a->limit ? (uint32_t)a->limit
                                                          : MOONLET_LIST_TENANTS_DEFAULT_LIMIT,
                                         tenant_visit, &sa, &total);
    if (side_array_listing(&sa, out, rc, "tenants"))
        return rc;
    pack_u64_kv(out, "total", total);
    return MOONLET_OK;
}

/* Stats' map, in reply order. */
#define STAT(kind, key, member) FIELD(moonlet_master_stats, kind, key, member)
static const map_field stats_fields[] = {
    STAT(F_U64, "objects", objects),
    STAT(F_U64, "bytes", bytes),
    STAT(F_U64, "segments", segments),
    STAT(F_U64, "capacity", capacity),
    STAT(F_U64, "used", used),
    STAT(F_U64, "clients", clients),
    STAT(F_U64, "put_starts", put_starts),
    STAT(F_U64, "put_starts_reserved", put_starts_reserved),
    STAT(F_U64, "put_ends", put_ends),
    STAT(F_U64, "put_revokes", put_revokes),
    STAT(F_U64, "put_timeouts", put_timeouts),
    STAT(F_U64, "put_replacements", put_replacements),
    STAT(F_U64, "removes", removes),
    STAT(F_U64, "evictions", evictions),
    STAT(F_U64, "eviction_passes", eviction_passes),
    STAT(F_U64, "leases_get", leases_get),
    STAT(F_U64, "leases_exist", leases_exist),
    STAT(F_U64, "leases_probe", leases_probe),
    STAT(F_U64, "probe_calls_none", probe_calls_none),
    STAT(F_U64, "probe_calls_last_hit_only", probe_calls_last_hit),
    STAT(F_U64, "probe_candidates_examined", probe_candidates_examined),
    STAT(F_U64, "probe_recheck_fallbacks", probe_recheck_fallbacks),
    STAT(F_U64, "probe_lock_hold_max_ns", probe_lock_hold_max_ns),
    STAT(F_U64, "unmounts_by_liveness", unmounts_by_liveness),
    STAT(F_U64, "quarantined_bytes", quarantined), /* part of "used" */
    STAT(F_U64, "hard_pinned", hard_pinned),
    STAT(F_U64, "hard_pinned_bytes", hard_pinned_bytes), /* never evictable */
    STAT(F_U64, "under_replicated", under_replicated),
    STAT(F_U64, "repairs_queued", repairs_queued),
    STAT(F_U64, "repairs_running", repairs_running),
    STAT(F_U64, "repairs_done", repairs_done),
    STAT(F_U64, "repairs_failed", repairs_failed),
    STAT(F_U64, "repairs_retried", repairs_retried),
    STAT(F_U64, "repairs_dropped", repairs_dropped),
    STAT(F_U64, "repair_bytes", repair_bytes),
    STAT(F_U64, "disk_capacity", disk_capacity),
    STAT(F_U64, "disk_used", disk_used),
    STAT(F_U64, "disk_segments", disk_segments),
    STAT(F_U64, "disk_objects", disk_objects),
    STAT(F_U64, "demotions_queued", demotions_queued),
    STAT(F_U64, "demotions_staged", demotions_staged),
    STAT(F_U64, "demotions", demotions),
    STAT(F_U64, "demotion_bytes", demotion_bytes),
    STAT(F_U64, "demotions_dropped", demotions_dropped),
    STAT(F_U64, "demotions_failed", demotions_failed),
    STAT(F_U64, "disk_evictions", disk_evictions),
    STAT(F_U64, "disk_announced", disk_announced),
    STAT(F_HIST, "probe_lock_hold_us_hist", probe_lock_hold_hist),
    STAT(F_U64, "resume_calls", resume_calls),
    STAT(F_U64, "resume_candidates_examined", resume_candidates_examined),
    STAT(F_U64, "resume_recheck_fallbacks", resume_recheck_fallbacks),
    STAT(F_U64, "leases_resume_kda", leases_resume_kda),
    STAT(F_U64, "leases_resume_kv", leases_resume_kv),
    STAT(F_U64, "resume_lock_hold_max_ns", resume_lock_hold_max_ns),
    STAT(F_HIST, "resume_lock_hold_us_hist", resume_lock_hold_hist),
};
#undef STAT

static int h_stats(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_master_stats st;
    moonlet_master_get_stats(M(ctx), &st);
    msgpack_pack_map(out, NFIELDS(stats_fields) + 2);
    pack_fields(out, &st, stats_fields, NFIELDS(stats_fields));
    /* "node_disk": the store nodes' disk tier figures, summed */
    moonlet_pack_key(out, "node_disk");
    pack_node_disk(out, st.node_disk);
    /* "calls": {method name: requests served}, the methods called so far */
    uint64_t calls[MOONLET_M__COUNT]; /* one snapshot: the map's size and entries agree */
    uint32_t ncalled = 0;
    for (size_t i = 0; i < moonlet_master_nmethods; i++) {
        calls[i] = moonlet_rpc_server_calls(SVC(ctx)->rpc, moonlet_master_methods[i].id);
        ncalled += calls[i] != 0;
    }
    moonlet_pack_key(out, "calls");
    msgpack_pack_map(out, ncalled);
    for (size_t i = 0; i < moonlet_master_nmethods; i++)
        if (calls[i])
            pack_u64_kv(out, moonlet_master_methods[i].name, calls[i]);
    return MOONLET_OK;
}

/* ---- re-replication (master/store/repair.c) ----------------------------------------- */

/* One job: [job_id, size, checksum or nil, target (with capability),
 * [sources...]], and for a demotion three more: true, tenant, key. */
static void job_pack_visit(void *arg, const moonlet_repair_job_view *j)
{
    struct side_array *jobs = arg;
    msgpack_packer *pk = &jobs->pk;
    jobs->count++;
    msgpack_pack_array(pk, j->demote ? 8 : 5);
    msgpack_pack_uint64(pk, j->job_id);
    msgpack_pack_uint64(pk, j->size);
    if (j->has_checksum)
        msgpack_pack_uint64(pk, j->checksum);
    else
        msgpack_pack_nil(pk);
    struct replica_pack rp;
    replica_pack_init(&rp, false, true);
    replica_pack_visit(&rp, j->target);
    pk->callback(pk->data, rp.a.buf.data, rp.a.buf.size); /* the one descriptor, no array */
    msgpack_sbuffer_destroy(&rp.a.buf);
    replica_pack_init(&rp, false, false);
    for (uint32_t i = 0; i < j->nsources; i++)
        replica_pack_visit(&rp, &j->sources[i]);
    side_array_flush(&rp.a, pk);
    if (j->demote) {
        msgpack_pack_true(pk);
        moonlet_pack_str(pk, j->tenant.ptr, j->tenant.len);
        moonlet_pack_str(pk, j->key.ptr, j->key.len);
    }
}

HANDLER(h_repair_fetch, moonlet_args_repair_fetch)
{
    SESSION_OR_FAIL(ctx, out, session);
    struct side_array jobs;
    side_array_init(&jobs);
    int rc = moonlet_master_repair_fetch(M(ctx), a->client_id, session,
                                         a->max_jobs ? (uint32_t)a->max_jobs : 16,
                                         job_pack_visit, &jobs);
    if (rc)
        return side_array_fail(&jobs, out, rc);
    side_array_flush(&jobs, out);
    return MOONLET_OK;
}

HANDLER(h_repair_done, moonlet_args_repair_done)
{
    SESSION_OR_FAIL(ctx, out, session);
    return reply(out, moonlet_master_repair_done(M(ctx), a->client_id, session, a->job_id,
                                                 -(int32_t)a->error, a->bytes));
}

HANDLER(h_disk_announce, moonlet_args_disk_announce)
{
    SESSION_OR_FAIL(ctx, out, session);
    uint32_t n = a->keys.n;
    if (a->tenants.n != n || a->sizes.n != n || a->checksums.n != n || a->offsets.n != n)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS,
                                 "DiskAnnounce: tenants, keys, sizes, checksums and offsets "
                                 "must have one entry per object");
    moonlet_disk_entry *e = n ? calloc(n, sizeof(*e)) : NULL;
    int32_t *codes = n ? calloc(n, sizeof(*codes)) : NULL;
    if (n && (!e || !codes)) {
        free(e);
        free(codes);
        return reply(out, MOONLET_ERR_INTERNAL_ERROR);
    }
    for (uint32_t i = 0; i < n; i++)
        e[i] = (moonlet_disk_entry){.tenant = a->tenants.v[i], .key = a->keys.v[i],
                                    .size = a->sizes.v[i], .checksum = a->checksums.v[i],
                                    .offset = a->offsets.v[i]};
    int rc = moonlet_master_disk_announce(M(ctx), a->client_id, session, a->segment_id, e, n,
                                          codes);
    if (rc == MOONLET_OK) {
        msgpack_pack_array(out, n);
        for (uint32_t i = 0; i < n; i++)
            msgpack_pack_int32(out, codes[i]);
    }
    free(e);
    free(codes);
    return rc ? reply(out, rc) : MOONLET_OK;
}

/* DiskTrim's reply: [[offset, length]...]. */
static void trim_pack_visit(void *arg, uint64_t offset, uint64_t len)
{
    struct side_array *sa = arg;
    sa->count++;
    msgpack_pack_array(&sa->pk, 2);
    msgpack_pack_uint64(&sa->pk, offset);
    msgpack_pack_uint64(&sa->pk, len);
}

HANDLER(h_disk_trim, moonlet_args_disk_trim)
{
    SESSION_OR_FAIL(ctx, out, session);
    uint64_t *done = a->done.n ? malloc(a->done.n * sizeof(*done)) : NULL;
    if (a->done.n && !done)
        return reply(out, MOONLET_ERR_INTERNAL_ERROR);
    if (a->done.n)
        memcpy(done, a->done.v, a->done.n * sizeof(*done));
    struct side_array sa;
    side_array_init(&sa);
    int rc = moonlet_master_disk_trim(M(ctx), a->client_id, session, a->segment_id, done,
                                      a->done.n, a->max ? (uint32_t)a->max : 256,
                                      trim_pack_visit, &sa);
    free(done);
    if (rc)
        return side_array_fail(&sa, out, rc);
    side_array_flush(&sa, out);
    return MOONLET_OK;
}

static int drain_call(moonlet_rpc_ctx *ctx, const moonlet_args_drain *a, msgpack_packer *out,
                      bool on)
{
    uint32_t n = 0;
    int rc = moonlet_master_drain(M(ctx), a->target, on, &n);
    if (rc)
        return reply(out, rc);
    msgpack_pack_map(out, 1);
    pack_u64_kv(out, "segments", n);
    return MOONLET_OK;
}

HANDLER(h_drain, moonlet_args_drain) { return drain_call(ctx, a, out, true); }

HANDLER(h_undrain, moonlet_args_drain) { return drain_call(ctx, a, out, false); }

/* Hello: {role, serving, epoch, leader, advertise}; from now on this
 * connection's replies carry the epoch (with HA). */
static int h_hello(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    struct conn_state *cs = conn_state_of(ctx);
    if (!cs)
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    atomic_store(&cs->hello, true);
    moonlet_role_info ri;
    moonlet_role_get(SVC(ctx)->role, moonlet_mono_ms(), &ri);
    moonlet_master_service *svc = SVC(ctx);
    moonlet_repl_follower_status fs;
    bool following = svc->follower_status && svc->follower_status(&fs);
    msgpack_pack_map(out, 6 + (svc->repl != NULL) + following + (ri.serve_in_ms > 0));
    if (svc->repl) { /* the leader's view of its hot standby */
        moonlet_repl_log_status rs;
        moonlet_repl_log_get_status(svc->repl, &rs);
        moonlet_pack_key(out, "replication");
        moonlet_master_stats ms;
        moonlet_master_get_stats(M(ctx), &ms);
        msgpack_pack_map(out, 13);
        pack_str_kv(out, "standby", rs.standby);
        moonlet_pack_key(out, "in_sync");
        rs.in_sync ? msgpack_pack_true(out) : msgpack_pack_false(out);
        moonlet_pack_key(out, "streaming");
        rs.streaming ? msgpack_pack_true(out) : msgpack_pack_false(out);
        pack_u64_kv(out, "lag_ms", rs.lag_ms);
        pack_u64_kv(out, "acked", rs.acked);
        pack_u64_kv(out, "next", rs.next);
        pack_u64_kv(out, "out_of_sync_marks", rs.out_of_sync_marks);
        pack_u64_kv(out, "sync_waits", rs.sync_waits);
        pack_u64_kv(out, "sync_acked_on_entry", rs.sync_acked_on_entry);
        pack_u64_kv(out, "sync_wait_us", rs.sync_wait_us);
        pack_u64_kv(out, "writer_pushes", rs.writer_pushes);
        pack_u64_kv(out, "pusher_pushes", rs.pusher_pushes);
        pack_u64_kv(out, "put_starts_reserved", ms.put_starts_reserved);
    }
    if (following) { /* this standby's progress */
        moonlet_pack_key(out, "following");
        msgpack_pack_map(out, 6);
        pack_str_kv(out, "leader", fs.leader);
        pack_u64_kv(out, "epoch", fs.epoch);
        pack_u64_kv(out, "applied", fs.applied);
        pack_u64_kv(out, "leader_next", fs.leader_next);
        moonlet_pack_key(out, "consistent");
        fs.consistent ? msgpack_pack_true(out) : msgpack_pack_false(out);
        pack_u64_kv(out, "snapshots", fs.snapshots);
    }
    pack_str_kv(out, "role", moonlet_role_state_name(ri.state));
    moonlet_pack_key(out, "serving");
    ri.serving ? msgpack_pack_true(out) : msgpack_pack_false(out);
    pack_u64_kv(out, "epoch", ri.epoch);
    pack_u64_kv(out, "terms", ri.terms);
    if (ri.serve_in_ms > 0) /* elected, in its grace period: when it will serve */
        pack_u64_kv(out, "serve_in_ms", ri.serve_in_ms);
    pack_str_kv(out, "leader", ri.leader);
    pack_str_kv(out, "advertise", ri.advertise);
    return MOONLET_OK;
}

/* The replication server's own leader gate (it is not the main table's). */
static bool repl_serving(moonlet_rpc_ctx *ctx, msgpack_packer *out, int *rc)
{
    uint64_t epoch;
    if (!SVC(ctx)->repl) {
        *rc = moonlet_rpc_error(out, MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS, "no replication");
        return false;
    }
    if (!moonlet_role_gate(SVC(ctx)->role, moonlet_mono_ms(), &epoch)) {
        *rc = moonlet_rpc_error(out, MOONLET_ERR_NOT_LEADER, "not the leader");
        return false;
    }
    return true;
}

static void stream_taker(void *log, uint64_t ticket, int fd, moonlet_tls *tls)
{
    moonlet_repl_log_stream_attach(log, ticket, fd, tls);
}

/* ReplStream: [epoch, next, lost]; unless lost, the connection then carries
 * the stream (repl_stream.h). */
HANDLER(h_repl_stream, moonlet_args_repl_stream)
{
    int erc;
    if (!repl_serving(ctx, out, &erc))
        return erc;
    moonlet_repl_log *l = SVC(ctx)->repl;
    char who[MOONLET_ROLE_ADDR_MAX];
    snprintf(who, sizeof(who), "%.*s", (int)a->standby.len, a->standby.ptr);
    uint64_t epoch = 0, next = 0, ticket = 0;
    moonlet_role_gate(SVC(ctx)->role, moonlet_mono_ms(), &epoch);
    bool lost = false;
    int rc = moonlet_repl_log_stream_open(l, who, a->from, epoch, &lost, &next, &ticket);
    if (rc)
        return moonlet_rpc_error(out, rc, "another standby streams");
    if (ticket && moonlet_rpc_ctx_detach(ctx, stream_taker, l, ticket) != MOONLET_OK)
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "cannot take the connection");
    msgpack_pack_array(out, 3);
    msgpack_pack_uint64(out, epoch);
    msgpack_pack_uint64(out, next);
    lost ? msgpack_pack_true(out) : msgpack_pack_false(out);
    return MOONLET_OK;
}

/* ReplSnapshot: [epoch, start, consistent_at, records (bin), next_cursor]:
 * one part of the snapshot (repl_stream.h); without max_bytes, the whole. */
HANDLER(h_repl_snapshot, moonlet_args_repl_snapshot)
{
    int erc;
    if (!repl_serving(ctx, out, &erc))
        return erc;
    moonlet_repl_log *l = SVC(ctx)->repl;
    size_t budget = a->max_bytes;
    if (budget > SVC(ctx)->max_frame / 2)
        budget = SVC(ctx)->max_frame / 2;
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t start = 0, cons = 0, next_cursor = 0;
    int rc = moonlet_repl_log_snapshot(l, M(ctx), a->cursor, budget, &buf, &len, &start, &cons,
                                       &next_cursor);
    if (rc == MOONLET_ERR_INVALID_PARAMS)
        return moonlet_rpc_error(out, rc, "no snapshot part at cursor %llu",
                                 (unsigned long long)a->cursor);
    if (rc)
        return moonlet_rpc_error(out, rc, "snapshot failed");
    uint64_t epoch = 0;
    moonlet_role_gate(SVC(ctx)->role, moonlet_mono_ms(), &epoch);
    msgpack_pack_array(out, 6);
    msgpack_pack_uint64(out, epoch);
    msgpack_pack_uint64(out, start);
    msgpack_pack_uint64(out, cons);
    msgpack_pack_bin(out, len);
    if (len)
        msgpack_pack_bin_body(out, buf, len);
    msgpack_pack_uint64(out, next_cursor);
    /* the leader's clock, as in a push: a standby promoted before its first
     * push still knows its node clock offsets (restored capabilities) */
    msgpack_pack_uint64(out, moonlet_clock_now_ns() / MOONLET_NS_PER_MS);
    free(buf);
    return MOONLET_OK;
}

/* ReplPort: the port of the replication server (0: none). */
static int h_repl_port(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    (void)args;
    moonlet_rpc_server *r = SVC(ctx)->repl_rpc;
    msgpack_pack_uint64(out, r ? moonlet_rpc_server_port(r) : 0);
    return MOONLET_OK;
}

static const moonlet_rpc_handler g_handlers[MOONLET_M__COUNT];

/* Whether a method changes metadata a standby must have before its reply. */
static bool is_write(uint32_t id)
{
    switch (id) {
    case MOONLET_M_MOUNT_SEGMENT:
    case MOONLET_M_UNMOUNT_SEGMENT:
    case MOONLET_M_PUT_START:
    case MOONLET_M_PUT_END:
    case MOONLET_M_PUT_REVOKE:
    case MOONLET_M_REMOVE:
    case MOONLET_M_REMOVE_ALL:
    case MOONLET_M_PUT_REPLACE_REPLICA:
    case MOONLET_M_REPAIR_FETCH: /* the targets' QUAR records (repair.c) */
    case MOONLET_M_DISK_ANNOUNCE: /* the objects a node's disk brought back */
    case MOONLET_M_BATCH_PUT_START:
    case MOONLET_M_BATCH_PUT_END:
    case MOONLET_M_BATCH_PUT_REVOKE:
        return true;
    default:
        return false;
    }
}

/* Semi-synchronous writes: the handler packs its reply aside; it goes out
 * only once the in-sync standby acknowledged every record so far (or was
 * marked out of sync in etcd); otherwise the caller gets an error.  A
 * PutStart placed in reserved ranges (pool.c) goes out at once. */
static int semi_sync(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    size_t mark = moonlet_rpc_result_mark(ctx);
    t_put_covered = false;
    int rc = g_handlers[ctx->method](ctx, args, out);
    if (rc == MOONLET_OK && t_put_covered &&
        (ctx->method == MOONLET_M_PUT_START || ctx->method == MOONLET_M_BATCH_PUT_START))
        return rc; /* its ranges were reserved on the standby: nothing to wait for */
    int w = moonlet_repl_log_wait(SVC(ctx)->repl);
    if (w) { /* not acknowledged: the handler's result gives way to the error */
        moonlet_rpc_result_rewind(ctx, mark);
        return moonlet_rpc_error(out, w, "the standby did not acknowledge and cannot be marked "
                                         "out of sync");
    }
    return rc;
}

/* The one HA check of every gated method: a master that may not serve now
 * (a standby, a leader in its grace period or past its fencing deadline)
 * answers NOT_LEADER with the leader's address as the message ("" when it
 * knows none) and does nothing else. */
static int gated(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    uint64_t epoch;
    if (!moonlet_role_gate(SVC(ctx)->role, moonlet_mono_ms(), &epoch)) {
        /* A promoted standby in its grace period learns the clock offset of
         * the store nodes it restored (their pings come before it serves),
         * so its first write capabilities are not issued on a guess. */
        if (ctx->method == MOONLET_M_PING) {
            const moonlet_args_ping *p = ctx->argv;
            if (p->node_clock_ms)
                moonlet_master_note_node_clock(M(ctx), p->client_id, p->node_clock_ms);
        }
        moonlet_role_info ri;
        moonlet_role_get(SVC(ctx)->role, moonlet_mono_ms(), &ri);
        return moonlet_rpc_error(out, MOONLET_ERR_NOT_LEADER, "%s",
                                 ri.state == MOONLET_ROLE_LEADER ? "" : ri.leader);
    }
    /* the capabilities it issues carry the epoch it serves in */
    moonlet_master_set_epoch(M(ctx), epoch);
    if (SVC(ctx)->repl && is_write(ctx->method))
        return semi_sync(ctx, args, out);
    return g_handlers[ctx->method](ctx, args, out);
}

/* The handler of each method of the table (methods.c); AUTH is the server's. */
static const moonlet_rpc_handler g_handlers[MOONLET_M__COUNT] = {
    [MOONLET_M_ECHO] = h_echo,
    [MOONLET_M_PING] = h_ping,
    [MOONLET_M_MOUNT_SEGMENT] = h_mount,
    [MOONLET_M_UNMOUNT_SEGMENT] = h_unmount,
    [MOONLET_M_PUT_START] = h_put_start,
    [MOONLET_M_PUT_END] = h_put_end,
    [MOONLET_M_PUT_REVOKE] = h_put_revoke,
    [MOONLET_M_GET_REPLICA_LIST] = h_get_replicas,
    [MOONLET_M_EXIST_KEY] = h_exist,
    [MOONLET_M_BATCH_EXIST_KEY] = h_batch_exist,
    [MOONLET_M_PROBE_KEY] = h_probe,
    [MOONLET_M_BATCH_PROBE_KEY] = h_batch_probe,
    [MOONLET_M_REMOVE] = h_remove,
    [MOONLET_M_REMOVE_ALL] = h_remove_all,
    [MOONLET_M_LIST_SEGMENTS] = h_list_segments,
    [MOONLET_M_LIST_KEYS] = h_list_keys,
    [MOONLET_M_INSPECT_KEY] = h_inspect_key,
    [MOONLET_M_STATS] = h_stats,
    [MOONLET_M_BIND_CLIENT] = h_bind_client,
    [MOONLET_M_PROBE_RESUME] = h_probe_resume,
    [MOONLET_M_PUT_REPLACE_REPLICA] = h_put_replace,
    [MOONLET_M_REPAIR_FETCH] = h_repair_fetch,
    [MOONLET_M_DISK_ANNOUNCE] = h_disk_announce,
    [MOONLET_M_DISK_TRIM] = h_disk_trim,
    [MOONLET_M_REPAIR_DONE] = h_repair_done,
    [MOONLET_M_DRAIN] = h_drain,
    [MOONLET_M_UNDRAIN] = h_undrain,
    [MOONLET_M_LIST_TENANTS] = h_list_tenants,
    [MOONLET_M_HELLO] = h_hello,
    [MOONLET_M_REPL_PORT] = h_repl_port,
    [MOONLET_M_BATCH_PUT_START] = h_batch_put_start,
    [MOONLET_M_BATCH_PUT_END] = h_batch_put_end,
    [MOONLET_M_BATCH_PUT_REVOKE] = h_batch_put_revoke,
    [MOONLET_M_BATCH_GET_REPLICA_LIST] = h_batch_get_replicas,
};

/* The argument-level half of the role check (rpc_server.h, opts.authorize):
 * the tenant a call names, and Remove's force. */
static int authorize(void *server_ctx, const moonlet_cred *cred, uint32_t method,
                     const void *argv, char *msg, size_t cap)
{
    (void)server_ctx;
    const moonlet_rpc_method_decl *d = moonlet_master_method(method);
    if (d && d->tenant_scoped && argv && cred->tenants) {
        const moonlet_args_tenant *a = argv;
        if (!moonlet_cred_tenant_ok(cred, a->tenant.ptr, a->tenant.len)) {
            snprintf(msg, cap, "%s: this credential may not name that tenant", d->name);
            return MOONLET_ERR_PERMISSION_DENIED;
        }
    }
    if (method == MOONLET_M_REMOVE && argv && ((const moonlet_args_remove *)argv)->force &&
        !(cred->roles & MOONLET_ROLE_OPERATOR)) {
        snprintf(msg, cap, "Remove with force needs the role operator");
        return MOONLET_ERR_PERMISSION_DENIED;
    }
    return MOONLET_OK;
}

/* Whether `name` is an item of the comma-separated `list` (NULL: none). */
static bool name_listed(const char *list, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && memcmp(p, name, len) == 0)
            return true;
        p = end ? end + 1 : NULL;
    }
    return false;
}

/* Items of a comma-separated list (NULL: 0). */
static size_t names_in(const char *list)
{
    size_t n = list ? 1 : 0;
    for (const char *p = list; p && *p; p++)
        n += *p == ',';
    return n;
}

int moonlet_master_service_start(moonlet_master *m, const moonlet_service_opts *opts,
                                 moonlet_master_service **out)
{
    moonlet_master_service *s = calloc(1, sizeof(*s));
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    s->m = m;
    s->role = opts->role;
    s->repl = opts->repl;
    s->follower_status = opts->follower_status;
    s->max_batch_keys = opts->max_batch_keys ? opts->max_batch_keys : MOONLET_DEFAULT_MAX_BATCH_KEYS;
    s->max_frame = opts->max_frame ? opts->max_frame : MOONLET_DEFAULT_MAX_FRAME;
    /* the server's table: the declared methods with a handler, but the disabled ones */
    s->methods = calloc(moonlet_master_nmethods, sizeof(*s->methods));
    size_t ntable = 0, ndisabled = 0;
    for (size_t i = 0; s->methods && i < moonlet_master_nmethods; i++) {
        const moonlet_rpc_method_decl *d = &moonlet_master_methods[i];
        if (!g_handlers[d->id])
            continue;
        if (name_listed(opts->disabled_method, d->name)) {
            ndisabled++;
            continue;
        }
        /* with HA, everything but Echo and Hello passes the leader gate */
        bool gate = s->role && d->id != MOONLET_M_ECHO && d->id != MOONLET_M_HELLO;
        s->methods[ntable++] =
            (moonlet_rpc_method){d->id, d->name, gate ? gated : g_handlers[d->id], d->spec,
                                 d->roles};
    }
    if (!s->methods || ndisabled != names_in(opts->disabled_method)) {
        int rc = s->methods ? MOONLET_ERR_INVALID_PARAMS : MOONLET_ERR_INTERNAL_ERROR;
        free(s->methods);
        free(s);
        return rc;
    }
    const char *addr = opts->address ? opts->address : "127.0.0.1";
    bool loopback = strncmp(addr, "127.", 4) == 0 || strcmp(addr, "localhost") == 0 ||
                    strcmp(addr, "::1") == 0;
    if (!loopback && !opts->auth_token && !opts->creds)
        ML_WARN("master", "listening on %s without --auth-token-file: any host that reaches this "
                "port can read and change the cache's metadata", addr);
    moonlet_rpc_server_opts ro = {
        .address = opts->address ? opts->address : "127.0.0.1",
        .port = opts->port,
        .threads = opts->threads,
        .name = "master",
        .max_frame = opts->max_frame,
        .auth_token = opts->auth_token,
        .auth_token_len = opts->auth_token ? strlen(opts->auth_token) : 0,
        .creds = opts->creds,
        .authorize = opts->creds ? authorize : NULL,
        .tls = opts->tls,
        .methods = s->methods,
        .nmethods = ntable,
        .ctx = s,
        .on_close = session_close,
        .reply_epoch = opts->role ? reply_epoch : NULL,
        .max_connections = opts->max_connections,
        .auth_timeout_ms = opts->auth_timeout_ms,
        .frame_timeout_ms = opts->frame_timeout_ms,
        .idle_timeout_ms = opts->idle_timeout_ms,
        /* twice the key cap: a batch a little over it gets the clear per-call
         * error above; anything far larger is refused before decoding */
        .max_request_elements = 2 * (uint64_t)s->max_batch_keys + 1024,
        .max_batch = s->max_batch_keys,
        .yield_after_us = MASTER_LOOP_YIELD_US,
    };
    if (s->repl) {
        static const moonlet_rpc_method repl_methods[2] = {
            {MOONLET_M_REPL_STREAM, "ReplStream", h_repl_stream, NULL, 0},
            {MOONLET_M_REPL_SNAPSHOT, "ReplSnapshot", h_repl_snapshot, NULL, 0},
        };
        moonlet_rpc_server_opts rr = ro;
        rr.port = opts->repl_port;
        rr.threads = 2; /* snapshots; the stream leaves the server once open */
        rr.name = "repl";
        rr.methods = s->repl_methods;
        rr.nmethods = 2;
        rr.reply_epoch = NULL;
        rr.max_connections = 16;
        rr.idle_timeout_ms = 0;
        if (opts->peer_token) { /* issue 31 finding 3: the stream is the masters' alone */
            rr.auth_token = opts->peer_token;
            rr.auth_token_len = strlen(opts->peer_token);
        }
        s->repl_methods[0] = repl_methods[0];
        s->repl_methods[1] = repl_methods[1];
        s->repl_methods[0].spec = moonlet_master_method(MOONLET_M_REPL_STREAM)->spec;
        s->repl_methods[1].spec = moonlet_master_method(MOONLET_M_REPL_SNAPSHOT)->spec;
        /* with credentials: peer credentials only (the table's PEER rows) */
        s->repl_methods[0].roles = moonlet_master_method(MOONLET_M_REPL_STREAM)->roles;
        s->repl_methods[1].roles = moonlet_master_method(MOONLET_M_REPL_SNAPSHOT)->roles;
        int rrc = moonlet_rpc_server_create(&rr, &s->repl_rpc);
        if (!rrc)
            rrc = moonlet_rpc_server_start(s->repl_rpc);
        if (rrc) {
            if (s->repl_rpc)
                moonlet_rpc_server_destroy(s->repl_rpc);
            free(s->methods);
            free(s);
            return rrc;
        }
    }
    int rc = moonlet_rpc_server_create(&ro, &s->rpc);
    if (!rc)
        rc = moonlet_rpc_server_start(s->rpc);
    if (rc) {
        if (s->rpc)
            moonlet_rpc_server_destroy(s->rpc);
        if (s->repl_rpc)
            moonlet_rpc_server_destroy(s->repl_rpc);
        free(s->methods);
        free(s);
        return rc;
    }
    *out = s;
    return MOONLET_OK;
}

uint16_t moonlet_master_service_port(const moonlet_master_service *s)
{
    return moonlet_rpc_server_port(s->rpc);
}

const moonlet_rpc_server *moonlet_master_service_rpc(const moonlet_master_service *s)
{
    return s->rpc;
}

void moonlet_master_service_stop(moonlet_master_service *s)
{
    if (!s)
        return;
    moonlet_rpc_server_destroy(s->rpc);
    if (s->repl_rpc)
        moonlet_rpc_server_destroy(s->repl_rpc);
    free(s->methods);
    free(s);
}
