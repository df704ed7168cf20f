/*
 * service.c - the master's RPC methods: decode arguments, call the master
 * library, encode the result.  One table maps method ids (transport/methods.h)
 * to handlers; every handler follows the same shape, so a reader who knows
 * one knows them all.
 *
 * Decoding is strict: a missing or wrongly-typed argument is INVALID_PARAMS
 * with a message naming the argument, and the connection stays usable.  Keys
 * longer than the limit are per-key INVALID_KEY (in batches) or a request
 * error (single-key calls), decided by the master library.
 *
 * Batches decode their key lists into per-thread scratch arrays, so a steady
 * stream of probes allocates nothing.  A batch may hold at most
 * max_batch_keys keys (INVALID_PARAMS naming the limit otherwise, before any
 * key is decoded), and scratch grown past SCRATCH_KEEP keys is given back
 * after the call, so one large batch does not pin memory on its thread.
 *
 * Node identity: Ping, MountSegment, UnmountSegment and BindClient pass the
 * connection's session (a number kept in its conn_data slot, never reused)
 * to the master, which binds client ids to it; on_close unbinds them.
 *
 * Locks: none here; the master library takes its own.
 */
#include "service.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "methods.h"
#include "moonlet/error.h"
#include "rpc_server.h"
#include "wire.h"

struct moonlet_master_service {
    moonlet_master *m;
    moonlet_rpc_server *rpc;
    size_t max_batch_keys;
    moonlet_rpc_method *methods; /* the table without opts->disabled_method, or NULL */
};

#define SVC(ctx) ((moonlet_master_service *)(ctx)->server_ctx)
#define M(ctx) (SVC(ctx)->m)
#define SCRATCH_KEEP 4096 /* keys of scratch kept between calls */

/* The identity of the connection a call came on (for the node-identity
 * calls): a number never reused, kept in the connection's conn_data slot and
 * dropped by on_close.  0 when out of memory (then treated as no session:
 * refused where identity matters, see session_of callers). */
static _Atomic uint64_t g_next_session = 1;

static uint64_t session_of(moonlet_rpc_ctx *ctx)
{
    if (!*ctx->conn_data) {
        uint64_t *s = malloc(sizeof(*s));
        if (!s)
            return 0;
        *s = atomic_fetch_add(&g_next_session, 1);
        *ctx->conn_data = s;
    }
    return *(uint64_t *)*ctx->conn_data;
}

static void session_close(void *server_ctx, void *conn_data)
{
    if (!conn_data)
        return;
    moonlet_master_session_closed(((moonlet_master_service *)server_ctx)->m, *(uint64_t *)conn_data);
    free(conn_data);
}

#define SESSION_OR_FAIL(ctx, out, var)                                                         \
    uint64_t var = session_of(ctx);                                                            \
    if (!var)                                                                                  \
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory")

/* ---- argument helpers ------------------------------------------------------ */

static int arg_str(const msgpack_object *args, uint32_t i, moonlet_str *out)
{
    return moonlet_wire_str(args, i, &out->ptr, &out->len);
}

/* Copies a string argument into a NUL-terminated buffer of `cap` bytes. */
static int arg_cstr(const msgpack_object *args, uint32_t i, char *buf, size_t cap)
{
    moonlet_str s;
    int rc = arg_str(args, i, &s);
    if (rc || s.len >= cap || memchr(s.ptr, 0, s.len))
        return MOONLET_ERR_INVALID_PARAMS;
    memcpy(buf, s.ptr, s.len);
    buf[s.len] = 0;
    return MOONLET_OK;
}

struct scratch {
    moonlet_str *keys;
    int32_t *results;
    size_t cap;
};

/* Per-thread scratch, freed by the key's destructor when an RPC thread exits. */
static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
    struct scratch *s = p;
    free(s->keys);
    free(s->results);
    free(s);
}

static void scratch_key_init(void) { pthread_key_create(&g_scratch_key, scratch_free); }

static struct scratch *scratch_get(void)
{
    pthread_once(&g_scratch_once, scratch_key_init);
    struct scratch *s = pthread_getspecific(g_scratch_key);
    if (!s && (s = calloc(1, sizeof(*s))) && pthread_setspecific(g_scratch_key, s)) {
        free(s);
        s = NULL;
    }
    return s;
}

/* Decodes argument i, an array of key strings, into the thread's scratch. */
static int arg_keys(const msgpack_object *args, uint32_t i, moonlet_str **keys, int32_t **results,
                    size_t *n)
{
    const msgpack_object *arr;
    if (moonlet_wire_array(args, i, &arr))
        return MOONLET_ERR_INVALID_PARAMS;
    size_t cnt = moonlet_wire_len(arr);
    struct scratch *s = scratch_get();
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    if (cnt > s->cap) {
        size_t cap = cnt < 1024 ? 1024 : cnt;
        moonlet_str *k = realloc(s->keys, cap * sizeof(*k));
        if (k)
            s->keys = k;
        int32_t *r = k ? realloc(s->results, cap * sizeof(*r)) : NULL;
        if (!r)
            return MOONLET_ERR_INTERNAL_ERROR;
        s->results = r;
        s->cap = cap;
    }
    for (uint32_t k = 0; k < cnt; k++)
        if (moonlet_wire_str(arr, k, &s->keys[k].ptr, &s->keys[k].len))
            return MOONLET_ERR_INVALID_PARAMS;
    *keys = s->keys;
    *results = s->results;
    *n = cnt;
    return MOONLET_OK;
}

/* Gives back scratch that a large batch grew. */
static void scratch_trim(void)
{
    struct scratch *s = pthread_getspecific(g_scratch_key);
    if (s && s->cap > SCRATCH_KEEP) {
        free(s->keys);
        free(s->results);
        s->keys = NULL;
        s->results = NULL;
        s->cap = 0;
    }
}

/* True (and the error packed) when argument i is a key list above the cap. */
static bool batch_too_big(moonlet_rpc_ctx *ctx, const msgpack_object *args, uint32_t i,
                          msgpack_packer *out, int *rc)
{
    const msgpack_object *arr;
    if (moonlet_wire_array(args, i, &arr) || moonlet_wire_len(arr) <= SVC(ctx)->max_batch_keys)
        return false;
    *rc = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS,
                            "batch of %u keys exceeds the limit of %zu keys (--max-batch-keys)",
                            moonlet_wire_len(arr), SVC(ctx)->max_batch_keys);
    return true;
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

/* Replica descriptors are packed into a side buffer first: the count is only
 * known after the visit. */
struct replica_pack {
    msgpack_sbuffer buf;
    msgpack_packer pk;
    uint32_t count;
    bool as_map; /* inspection: a map per replica; data path: a compact array */
    bool with_cap; /* PutStart: 4 more fields per replica (write capability, put TTL) */
};

static void replica_pack_visit(void *arg, const moonlet_replica_view *r)
{
    struct replica_pack *rp = arg;
    msgpack_packer *pk = &rp->pk;
    rp->count++;
    bool alt = r->alt_segment_id != NULL;
    if (rp->as_map) {
        msgpack_pack_map(pk, alt ? 11 : 8);
        if (alt) {
            pack_str_kv(pk, "alt_segment_id", r->alt_segment_id);
            pack_str_kv(pk, "alt_endpoint", r->alt_endpoint);
            pack_str_kv(pk, "alt_protocol", r->alt_protocol);
        }
        pack_str_kv(pk, "segment_id", r->segment_id);
        pack_str_kv(pk, "segment_name", r->segment_name);
        pack_str_kv(pk, "endpoint", r->endpoint);
        pack_str_kv(pk, "protocol", r->protocol);
        pack_u64_kv(pk, "offset", r->offset);
        pack_u64_kv(pk, "length", r->size);
        pack_u64_kv(pk, "base", r->base);
        pack_str_kv(pk, "status", r->status == MOONLET_REPLICA_COMPLETE ? "COMPLETE" : "INITIALIZED");
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
    msgpack_pack_uint8(pk, r->status);
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

static void replica_pack_init(struct replica_pack *rp, bool as_map)
{
    msgpack_sbuffer_init(&rp->buf);
    msgpack_packer_init(&rp->pk, &rp->buf, msgpack_sbuffer_write);
    rp->count = 0;
    rp->as_map = as_map;
    rp->with_cap = false;
}

/* Packs array(count) followed by the side buffer's bytes into out. */
static void replica_pack_flush(struct replica_pack *rp, msgpack_packer *out)
{
    msgpack_pack_array(out, rp->count);
    if (rp->buf.size)
        out->callback(out->data, rp->buf.data, rp->buf.size);
    msgpack_sbuffer_destroy(&rp->buf);
}

static int reply(msgpack_packer *out, int rc)
{
    if (rc)
        return moonlet_rpc_error(out, rc, "%s", moonlet_strerror(rc));
    msgpack_pack_nil(out);
    return MOONLET_OK;
}

#define BAD_ARGS(out, what) moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "bad arguments: expected %s", what)

/* ---- handlers ----------------------------------------------------------------- */

static int h_echo(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    msgpack_pack_nil(out);
    return MOONLET_OK;
}

static int h_ping(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str client;
    if (arg_str(args, 0, &client))
        return BAD_ARGS(out, "[client_id]");
    SESSION_OR_FAIL(ctx, out, session);
    uint32_t segs = 0;
    uint64_t node_ms; /* optional trailing arg: the node's clock when it sent this */
    int rc = moonlet_master_ping_as(M(ctx), client, session, &segs);
    if (rc == MOONLET_ERR_ILLEGAL_CLIENT)
        return moonlet_rpc_error(out, rc, "client id %.*s is held by another connection",
                                 (int)client.len, client.ptr);
    if (rc == MOONLET_OK && moonlet_wire_len(args) > 1 && moonlet_wire_u64(args, 1, &node_ms) == 0)
        moonlet_master_note_node_clock(M(ctx), client, node_ms);
    if (rc)
        return reply(out, rc);
    msgpack_pack_map(out, 1);
    pack_u64_kv(out, "segments", segs);
    return MOONLET_OK;
}

/* MountSegment's optional trailing args i, i+1: the node's 16-byte write key
 * and its clock when it sent the mount.  Absent: *key stays NULL. */
static int arg_write_key(const msgpack_object *args, uint32_t i, const uint8_t **key,
                         uint64_t *node_ms)
{
    *key = NULL;
    *node_ms = 0;
    if (moonlet_wire_len(args) <= i)
        return MOONLET_OK;
    const msgpack_object *k = moonlet_wire_at(args, i);
    if (!k || k->type != MSGPACK_OBJECT_BIN || k->via.bin.size != 16 ||
        moonlet_wire_u64(args, i + 1, node_ms))
        return MOONLET_ERR_INVALID_PARAMS;
    *key = (const uint8_t *)k->via.bin.ptr;
    return MOONLET_OK;
}

static int h_mount(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    char client[MOONLET_MAX_ID_BYTES + 1], seg[MOONLET_MAX_ID_BYTES + 1];
    char name[MOONLET_MAX_ID_BYTES + 1], endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1], proto[16];
    uint64_t base, size;
    if (arg_cstr(args, 0, client, sizeof(client)) || arg_cstr(args, 1, seg, sizeof(seg)) ||
        arg_cstr(args, 2, name, sizeof(name)) || moonlet_wire_u64(args, 3, &base) ||
        moonlet_wire_u64(args, 4, &size) || arg_cstr(args, 5, endpoint, sizeof(endpoint)) ||
        arg_cstr(args, 6, proto, sizeof(proto)))
        return BAD_ARGS(out, "[client_id, segment_id, name, base, size, endpoint, protocol]");
    if (size > MOONLET_MAX_SEGMENT_BYTES || base > UINT64_MAX - size)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "segment size %llu at base %llu: "
                                 "at most %llu bytes, and base + size must not wrap",
                                 (unsigned long long)size, (unsigned long long)base,
                                 (unsigned long long)MOONLET_MAX_SEGMENT_BYTES);
    moonlet_segment_desc d = {.client_id = client, .segment_id = seg, .name = name, .base = base,
                              .size = size, .endpoint = endpoint, .protocol = proto};
    if (arg_write_key(args, 7, &d.write_key, &d.node_clock_ms))
        return BAD_ARGS(out, "[..., write_key (bin 16), node_clock_ms]");
    /* Optional trailing args 9-11: a second endpoint of the same memory. */
    char alt_ep[MOONLET_MAX_ENDPOINT_BYTES + 1], alt_seg[MOONLET_MAX_ID_BYTES + 1], alt_proto[16];
    if (moonlet_wire_len(args) > 9) {
        if (arg_cstr(args, 9, alt_ep, sizeof(alt_ep)) ||
            arg_cstr(args, 10, alt_seg, sizeof(alt_seg)) ||
            arg_cstr(args, 11, alt_proto, sizeof(alt_proto)))
            return BAD_ARGS(out, "[..., node_clock_ms, alt_endpoint, alt_segment_id, alt_protocol]");
        d.alt_endpoint = alt_ep;
        d.alt_segment_id = alt_seg;
        d.alt_protocol = alt_proto;
    }
    SESSION_OR_FAIL(ctx, out, session);
    int rc = moonlet_master_mount_segment_as(M(ctx), &d, session);
    if (rc == MOONLET_ERR_ILLEGAL_CLIENT)
        return moonlet_rpc_error(out, rc, "client id %s is held by another live node (same "
                                 "--client-id?); it is free once that node stops pinging", client);
    return reply(out, rc);
}

static int h_bind_client(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str client, secret;
    if (arg_str(args, 0, &client) || arg_str(args, 1, &secret))
        return BAD_ARGS(out, "[client_id, secret]");
    SESSION_OR_FAIL(ctx, out, session);
    int rc = moonlet_master_bind_client(M(ctx), client, secret, session);
    if (rc == MOONLET_ERR_ILLEGAL_CLIENT)
        return moonlet_rpc_error(out, rc, "client id %.*s is held by another live node (same "
                                 "--client-id?); it is free once that node stops pinging",
                                 (int)client.len, client.ptr);
    return reply(out, rc);
}

static int h_unmount(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str client, seg;
    if (arg_str(args, 0, &client) || arg_str(args, 1, &seg))
        return BAD_ARGS(out, "[client_id, segment_id]");
    SESSION_OR_FAIL(ctx, out, session);
    return reply(out, moonlet_master_unmount_segment_as(M(ctx), client, seg, session));
}

/* Handlers of the [tenant, key] shape. */
static int tenant_key(const msgpack_object *args, moonlet_str *tenant, moonlet_str *key)
{
    return arg_str(args, 0, tenant) || arg_str(args, 1, key) ? MOONLET_ERR_INVALID_PARAMS : 0;
}

static int h_put_start(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str tenant, key;
    uint64_t size, nrep;
    bool soft_pin;
    if (tenant_key(args, &tenant, &key) || moonlet_wire_u64(args, 2, &size) ||
        moonlet_wire_u64(args, 3, &nrep) || moonlet_wire_bool(args, 4, &soft_pin) ||
        nrep > UINT32_MAX)
        return BAD_ARGS(out, "[tenant, key, size, replica_num, soft_pin, preferred_segments?, "
                             "hard_pin?, soft_pin_ttl_ms?]");
    /* Optional trailing args (older clients send none): preferred segment
     * names, the hard-pin flag, the soft-pin TTL (0: the master's default). */
    moonlet_master_put_opts po = {.replica_num = (uint32_t)nrep, .soft_pin = soft_pin};
    moonlet_str pref[MOONLET_MAX_PREFERRED];
    uint32_t nargs = moonlet_wire_len(args);
    if (nargs > 5) {
        const msgpack_object *arr;
        if (moonlet_wire_array(args, 5, &arr) || moonlet_wire_len(arr) > MOONLET_MAX_PREFERRED)
            return BAD_ARGS(out, "preferred_segments: an array of at most 64 names");
        po.npreferred = moonlet_wire_len(arr);
        for (uint32_t i = 0; i < po.npreferred; i++)
            if (moonlet_wire_strn(arr, i, MOONLET_MAX_ID_BYTES, &pref[i].ptr, &pref[i].len))
                return BAD_ARGS(out, "preferred_segments: an array of segment names");
        po.preferred = pref;
    }
    if ((nargs > 6 && moonlet_wire_bool(args, 6, &po.hard_pin)) ||
        (nargs > 7 && moonlet_wire_u64(args, 7, &po.soft_pin_ttl_ms)))
        return BAD_ARGS(out, "[..., preferred_segments, hard_pin (bool), soft_pin_ttl_ms (uint)]");
    struct replica_pack rp;
    replica_pack_init(&rp, false);
    rp.with_cap = true;
    int rc = moonlet_master_put_start_opts(M(ctx), tenant, key, size, &po, replica_pack_visit, &rp);
    if (rc) {
        msgpack_sbuffer_destroy(&rp.buf);
        return reply(out, rc);
    }
    replica_pack_flush(&rp, out);
    return MOONLET_OK;
}

static int h_put_end(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str tenant, key;
    uint64_t checksum; /* optional trailing arg: XXH3-64 of the bytes */
    bool has_ck = moonlet_wire_len(args) > 2;
    if (tenant_key(args, &tenant, &key) || (has_ck && moonlet_wire_u64(args, 2, &checksum)))
        return BAD_ARGS(out, "[tenant, key, checksum?]");
    return reply(out, moonlet_master_put_end(M(ctx), tenant, key, has_ck ? &checksum : NULL));
}

static int h_put_revoke(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str tenant, key;
    if (tenant_key(args, &tenant, &key))
        return BAD_ARGS(out, "[tenant, key]");
    return reply(out, moonlet_master_put_revoke(M(ctx), tenant, key));
}

static int h_get_replicas(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str tenant, key;
    if (tenant_key(args, &tenant, &key))
        return BAD_ARGS(out, "[tenant, key]");
    struct replica_pack rp;
    replica_pack_init(&rp, false);
    uint64_t size = 0, ttl = 0, checksum = 0;
    bool has_ck = false;
    int rc = moonlet_master_get_replica_list_ck(M(ctx), tenant, key, &size, &ttl, &has_ck,
                                                &checksum, replica_pack_visit, &rp);
    if (rc) {
        msgpack_sbuffer_destroy(&rp.buf);
        return reply(out, rc);
    }
    msgpack_pack_array(out, 4);
    msgpack_pack_uint64(out, size);
    msgpack_pack_uint64(out, ttl);
    replica_pack_flush(&rp, out);
    has_ck ? msgpack_pack_uint64(out, checksum) : msgpack_pack_nil(out); /* XXH3-64, nil: none */
    return MOONLET_OK;
}

static int single_exist(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out,
                        bool lease)
{
    moonlet_str tenant, key;
    if (tenant_key(args, &tenant, &key))
        return BAD_ARGS(out, "[tenant, key]");
    bool ex = false;
    int rc = lease ? moonlet_master_exist_key(M(ctx), tenant, key, &ex)
                   : moonlet_master_probe_key(M(ctx), tenant, key, &ex);
    if (rc)
        return reply(out, rc);
    ex ? msgpack_pack_true(out) : msgpack_pack_false(out);
    return MOONLET_OK;
}

static int h_exist(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    return single_exist(ctx, args, out, true);
}

static int h_probe(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    return single_exist(ctx, args, out, false);
}

static int h_batch_exist(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str tenant, *keys;
    int32_t *results;
    size_t n;
    int rc;
    if (batch_too_big(ctx, args, 1, out, &rc))
        return rc;
    if (arg_str(args, 0, &tenant) || arg_keys(args, 1, &keys, &results, &n))
        return BAD_ARGS(out, "[tenant, [key...]]");
    rc = moonlet_master_batch_exist_key(M(ctx), tenant, keys, n, results);
    if (rc)
        rc = reply(out, rc);
    else
        pack_results(out, results, n);
    scratch_trim();
    return rc;
}

static int h_batch_probe(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str tenant, *keys;
    int32_t *results;
    size_t n;
    uint64_t mode, cs;
    int rc;
    if (batch_too_big(ctx, args, 3, out, &rc))
        return rc;
    if (arg_str(args, 0, &tenant) || moonlet_wire_u64(args, 1, &mode) ||
        moonlet_wire_u64(args, 2, &cs) || arg_keys(args, 3, &keys, &results, &n))
        return BAD_ARGS(out, "[tenant, lease_mode, candidate_size, [key...]]");
    if (mode > UINT8_MAX)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "unknown lease mode %llu",
                                 (unsigned long long)mode);
    moonlet_grant_lease_policy p = {.lease_mode = (uint8_t)mode, .candidate_size = cs};
    rc = moonlet_master_batch_probe_key(M(ctx), tenant, &p, keys, n, results);
    if (rc == MOONLET_ERR_INVALID_PARAMS)
        rc = moonlet_rpc_error(out, rc, "invalid GrantLeasePolicy (mode %llu, candidate_size "
                               "%llu) for %zu keys", (unsigned long long)mode,
                               (unsigned long long)cs, n);
    else if (rc)
        rc = reply(out, rc);
    else
        pack_results(out, results, n);
    scratch_trim();
    return rc;
}

/*
 * ProbeResume [tenant, [kv_key...], candidate_size, [kda_key...], [boundary...]]
 *   -> [kv_prefix, selected (-1: none), mask: bin of one byte (0/1) per KDA key]
 * Both key lists go into the thread's scratch (KV keys first); the KV plus
 * KDA keys together may number at most max_batch_keys.
 */
static int h_probe_resume(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    static const char *const what =
        "[tenant, [kv_key...], candidate_size, [kda_key...], [boundary...]]";
    moonlet_str tenant, *kv, *kda;
    const msgpack_object *kv_arr, *kda_arr, *b_arr;
    int32_t *mask;
    uint64_t cs;
    if (moonlet_wire_len(args) != 5 || arg_str(args, 0, &tenant) ||
        moonlet_wire_array(args, 1, &kv_arr) || moonlet_wire_u64(args, 2, &cs) ||
        moonlet_wire_array(args, 3, &kda_arr) || moonlet_wire_array(args, 4, &b_arr))
        return BAD_ARGS(out, what);
    size_t n_kv = moonlet_wire_len(kv_arr), n_kda = moonlet_wire_len(kda_arr);
    size_t n_b = moonlet_wire_len(b_arr);
    if (n_kv + n_kda > SVC(ctx)->max_batch_keys)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS,
                                 "batch of %zu keys exceeds the limit of %zu keys "
                                 "(--max-batch-keys)", n_kv + n_kda, SVC(ctx)->max_batch_keys);
    if (n_b > n_kda)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS,
                                 "%zu boundaries for %zu KDA keys", n_b, n_kda);
    struct scratch *s = scratch_get();
    uint64_t *bounds = malloc((n_b ? n_b : 1) * sizeof(*bounds));
    int rc = MOONLET_OK;
    if (!s || !bounds) {
        free(bounds);
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    }
    if (n_kv + n_kda > s->cap) {
        size_t cap = n_kv + n_kda < 1024 ? 1024 : n_kv + n_kda;
        moonlet_str *k = realloc(s->keys, cap * sizeof(*k));
        if (k)
            s->keys = k;
        int32_t *r = k ? realloc(s->results, cap * sizeof(*r)) : NULL;
        if (r) {
            s->results = r;
            s->cap = cap;
        } else {
            free(bounds);
            return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
        }
    }
    kv = s->keys;
    kda = s->keys + n_kv;
    mask = s->results;
    for (uint32_t i = 0; i < n_kv && !rc; i++)
        rc = moonlet_wire_str(kv_arr, i, &kv[i].ptr, &kv[i].len);
    for (uint32_t i = 0; i < n_kda && !rc; i++)
        rc = moonlet_wire_str(kda_arr, i, &kda[i].ptr, &kda[i].len);
    for (uint32_t i = 0; i < n_b && !rc; i++)
        rc = moonlet_wire_u64(b_arr, i, &bounds[i]);
    if (rc) {
        free(bounds);
        scratch_trim();
        return BAD_ARGS(out, what);
    }
    moonlet_probe_resume_out r;
    rc = moonlet_master_probe_resume(M(ctx), tenant, kv, n_kv, kda, n_kda, cs, bounds, n_b, &r,
                                     mask);
    if (rc == MOONLET_ERR_INVALID_PARAMS) {
        rc = moonlet_rpc_error(out, rc, "invalid ProbeResume: candidate_size %llu, %zu KDA keys, "
                               "%zu boundaries (each at most %zu KV keys)",
                               (unsigned long long)cs, n_kda, n_b, n_kv);
    } else if (rc) {
        rc = reply(out, rc);
    } else {
        /* the mask as one bin of n_kda bytes (0 / 1): one object to decode
         * instead of n_kda booleans */
        char stackbuf[1024];
        char *mb = n_kda <= sizeof(stackbuf) ? stackbuf : malloc(n_kda);
        if (!mb) {
            rc = moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
        } else {
            for (size_t i = 0; i < n_kda; i++)
                mb[i] = (char)(mask[i] == 1);
            msgpack_pack_array(out, 3);
            msgpack_pack_uint64(out, r.kv_prefix);
            msgpack_pack_int64(out, r.selected);
            msgpack_pack_bin(out, (uint32_t)n_kda);
            msgpack_pack_bin_body(out, mb, n_kda);
            if (mb != stackbuf)
                free(mb);
        }
    }
    free(bounds);
    scratch_trim();
    return rc;
}

/* [tenant, key] or [tenant, key, force] (force: a trailing optional bool) */
static int h_remove(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str tenant, key;
    bool force = false;
    if (tenant_key(args, &tenant, &key) ||
        (moonlet_wire_len(args) > 2 && moonlet_wire_bool(args, 2, &force)))
        return BAD_ARGS(out, "[tenant, key, force?]");
    return reply(out, moonlet_master_remove_ex(M(ctx), tenant, key, force));
}

static int h_remove_all(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str tenant;
    bool force = false;
    if (arg_str(args, 0, &tenant) ||
        (moonlet_wire_len(args) > 1 && moonlet_wire_bool(args, 1, &force)))
        return BAD_ARGS(out, "[tenant, force?]");
    uint64_t removed = 0;
    int rc = moonlet_master_remove_all_ex(M(ctx), tenant, force, &removed);
    if (rc)
        return reply(out, rc);
    msgpack_pack_uint64(out, removed);
    return MOONLET_OK;
}

/* ---- inspection ------------------------------------------------------------------- */

struct seg_pack {
    msgpack_sbuffer buf;
    msgpack_packer pk;
    uint32_t count;
};

static void seg_visit(void *arg, const moonlet_segment_view *s)
{
    struct seg_pack *sp = arg;
    msgpack_packer *pk = &sp->pk;
    sp->count++;
    bool alt = s->alt_segment_id != NULL;
    msgpack_pack_map(pk, alt ? 13 : 10);
    if (alt) {
        pack_str_kv(pk, "alt_segment_id", s->alt_segment_id);
        pack_str_kv(pk, "alt_endpoint", s->alt_endpoint);
        pack_str_kv(pk, "alt_protocol", s->alt_protocol);
    }
    pack_str_kv(pk, "segment_id", s->segment_id);
    pack_str_kv(pk, "name", s->name);
    pack_str_kv(pk, "client_id", s->client_id);
    pack_str_kv(pk, "endpoint", s->endpoint);
    pack_str_kv(pk, "protocol", s->protocol);
    pack_u64_kv(pk, "base", s->base);
    pack_u64_kv(pk, "capacity", s->capacity);
    pack_u64_kv(pk, "used", s->used);
    pack_u64_kv(pk, "objects", s->objects);
    pack_u64_kv(pk, "last_ping_age_ms", s->last_ping_age_ms);
}

/* Optional trailing [cursor, limit, client_id] (docs/protocol.md): with any,
 * one page as {segments, next_cursor}; with none, the old reply (a bare
 * array), bounded by the first MOONLET_LIST_SEGMENTS_LEGACY segments. */
#define MOONLET_LIST_SEGMENTS_LEGACY 4096u
static int h_list_segments(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    uint32_t nargs = moonlet_wire_len(args);
    uint64_t cursor = 0, limit = MOONLET_LIST_SEGMENTS_LEGACY, next = 0;
    char client[MOONLET_MAX_ID_BYTES + 1] = "";
    if ((nargs > 0 && moonlet_wire_u64(args, 0, &cursor)) ||
        (nargs > 1 && moonlet_wire_u64(args, 1, &limit)) ||
        (nargs > 2 && arg_cstr(args, 2, client, sizeof(client))))
        return BAD_ARGS(out, "[cursor, limit, client_id] (all optional)");
    if (nargs > 0 && limit == 0)
        limit = MOONLET_LIST_SEGMENTS_DEFAULT_LIMIT;
    if (limit > MOONLET_LIST_SEGMENTS_MAX_LIMIT)
        return reply(out, MOONLET_ERR_INVALID_PARAMS);
    struct seg_pack sp = {.count = 0};
    msgpack_sbuffer_init(&sp.buf);
    msgpack_packer_init(&sp.pk, &sp.buf, msgpack_sbuffer_write);
    int rc = moonlet_master_list_segments_page(M(ctx), client[0] ? client : NULL, cursor,
                                               (uint32_t)limit, seg_visit, &sp, &next);
    if (rc) {
        msgpack_sbuffer_destroy(&sp.buf);
        return reply(out, rc);
    }
    if (nargs > 0) {
        msgpack_pack_map(out, 2);
        moonlet_pack_key(out, "segments");
    }
    msgpack_pack_array(out, sp.count);
    if (sp.buf.size)
        out->callback(out->data, sp.buf.data, sp.buf.size);
    if (nargs > 0)
        pack_u64_kv(out, "next_cursor", next);
    msgpack_sbuffer_destroy(&sp.buf);
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

struct key_pack {
    msgpack_sbuffer buf;
    msgpack_packer pk;
    uint32_t count;
};

static void key_visit(void *arg, const moonlet_key_view *k)
{
    struct key_pack *kp = arg;
    kp->count++;
    pack_key_view(&kp->pk, k, 0);
}

static int h_list_keys(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str tenant, prefix, cursor;
    uint64_t limit;
    if (arg_str(args, 0, &tenant) || arg_str(args, 1, &prefix) || arg_str(args, 2, &cursor) ||
        moonlet_wire_u64(args, 3, &limit) || limit > UINT32_MAX)
        return BAD_ARGS(out, "[tenant, prefix, cursor, limit]");
    struct key_pack kp = {.count = 0};
    msgpack_sbuffer_init(&kp.buf);
    msgpack_packer_init(&kp.pk, &kp.buf, msgpack_sbuffer_write);
    char next[MOONLET_CURSOR_BYTES];
    int rc = moonlet_master_list_keys(M(ctx), tenant, prefix, cursor, (uint32_t)limit, key_visit,
                                      &kp, next);
    if (rc) {
        msgpack_sbuffer_destroy(&kp.buf);
        return reply(out, rc);
    }
    msgpack_pack_map(out, 2);
    moonlet_pack_key(out, "keys");
    msgpack_pack_array(out, kp.count);
    if (kp.buf.size)
        out->callback(out->data, kp.buf.data, kp.buf.size);
    pack_str_kv(out, "next_cursor", next);
    msgpack_sbuffer_destroy(&kp.buf);
    return MOONLET_OK;
}

static int h_inspect_key(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_str tenant, key;
    if (tenant_key(args, &tenant, &key))
        return BAD_ARGS(out, "[tenant, key]");
    struct replica_pack rp;
    replica_pack_init(&rp, true);
    moonlet_key_view v;
    int rc = moonlet_master_inspect_key(M(ctx), tenant, key, &v, replica_pack_visit, &rp);
    if (rc) {
        msgpack_sbuffer_destroy(&rp.buf);
        return reply(out, rc);
    }
    v.key = key.ptr; /* the view's key pointer is only valid under the lock */
    pack_key_view(out, &v, 1);
    moonlet_pack_key(out, "replicas");
    replica_pack_flush(&rp, out);
    return MOONLET_OK;
}

static int h_stats(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_master_stats st;
    moonlet_master_get_stats(M(ctx), &st);
    msgpack_pack_map(out, 33);
    pack_u64_kv(out, "objects", st.objects);
    pack_u64_kv(out, "bytes", st.bytes);
    pack_u64_kv(out, "segments", st.segments);
    pack_u64_kv(out, "capacity", st.capacity);
    pack_u64_kv(out, "used", st.used);
    pack_u64_kv(out, "clients", st.clients);
    pack_u64_kv(out, "put_starts", st.put_starts);
    pack_u64_kv(out, "put_ends", st.put_ends);
    pack_u64_kv(out, "put_revokes", st.put_revokes);
    pack_u64_kv(out, "put_timeouts", st.put_timeouts);
    pack_u64_kv(out, "removes", st.removes);
    pack_u64_kv(out, "evictions", st.evictions);
    pack_u64_kv(out, "eviction_passes", st.eviction_passes);
    pack_u64_kv(out, "leases_get", st.leases_get);
    pack_u64_kv(out, "leases_exist", st.leases_exist);
    pack_u64_kv(out, "leases_probe", st.leases_probe);
    pack_u64_kv(out, "probe_calls_none", st.probe_calls_none);
    pack_u64_kv(out, "probe_calls_last_hit_only", st.probe_calls_last_hit);
    pack_u64_kv(out, "probe_candidates_examined", st.probe_candidates_examined);
    pack_u64_kv(out, "probe_recheck_fallbacks", st.probe_recheck_fallbacks);
    pack_u64_kv(out, "probe_lock_hold_max_ns", st.probe_lock_hold_max_ns);
    pack_u64_kv(out, "unmounts_by_liveness", st.unmounts_by_liveness);
    pack_u64_kv(out, "quarantined_bytes", st.quarantined); /* part of "used" */
    pack_u64_kv(out, "hard_pinned", st.hard_pinned);
    pack_u64_kv(out, "hard_pinned_bytes", st.hard_pinned_bytes); /* never evictable */
    moonlet_pack_key(out, "probe_lock_hold_us_hist");
    msgpack_pack_array(out, MOONLET_LOCK_HIST_BUCKETS);
    for (unsigned i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++)
        msgpack_pack_uint64(out, st.probe_lock_hold_hist[i]);
    pack_u64_kv(out, "resume_calls", st.resume_calls);
    pack_u64_kv(out, "resume_candidates_examined", st.resume_candidates_examined);
    pack_u64_kv(out, "resume_recheck_fallbacks", st.resume_recheck_fallbacks);
    pack_u64_kv(out, "leases_resume_kda", st.leases_resume_kda);
    pack_u64_kv(out, "leases_resume_kv", st.leases_resume_kv);
    pack_u64_kv(out, "resume_lock_hold_max_ns", st.resume_lock_hold_max_ns);
    moonlet_pack_key(out, "resume_lock_hold_us_hist");
    msgpack_pack_array(out, MOONLET_LOCK_HIST_BUCKETS);
    for (unsigned i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++)
        msgpack_pack_uint64(out, st.resume_lock_hold_hist[i]);
    return MOONLET_OK;
}

static const moonlet_rpc_method g_methods[] = {
    {MOONLET_M_ECHO, "Echo", h_echo},
    {MOONLET_M_PING, "Ping", h_ping},
    {MOONLET_M_MOUNT_SEGMENT, "MountSegment", h_mount},
    {MOONLET_M_UNMOUNT_SEGMENT, "UnmountSegment", h_unmount},
    {MOONLET_M_PUT_START, "PutStart", h_put_start},
    {MOONLET_M_PUT_END, "PutEnd", h_put_end},
    {MOONLET_M_PUT_REVOKE, "PutRevoke", h_put_revoke},
    {MOONLET_M_GET_REPLICA_LIST, "GetReplicaList", h_get_replicas},
    {MOONLET_M_EXIST_KEY, "ExistKey", h_exist},
    {MOONLET_M_BATCH_EXIST_KEY, "BatchExistKey", h_batch_exist},
    {MOONLET_M_PROBE_KEY, "ProbeKey", h_probe},
    {MOONLET_M_BATCH_PROBE_KEY, "BatchProbeKey", h_batch_probe},
    {MOONLET_M_REMOVE, "Remove", h_remove},
    {MOONLET_M_REMOVE_ALL, "RemoveAll", h_remove_all},
    {MOONLET_M_LIST_SEGMENTS, "ListSegments", h_list_segments},
    {MOONLET_M_LIST_KEYS, "ListKeys", h_list_keys},
    {MOONLET_M_INSPECT_KEY, "InspectKey", h_inspect_key},
    {MOONLET_M_STATS, "Stats", h_stats},
    {MOONLET_M_BIND_CLIENT, "BindClient", h_bind_client},
    {MOONLET_M_PROBE_RESUME, "ProbeResume", h_probe_resume},
};

int moonlet_master_service_start(moonlet_master *m, const moonlet_service_opts *opts,
                                 moonlet_master_service **out)
{
    moonlet_master_service *s = calloc(1, sizeof(*s));
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    s->m = m;
    s->max_batch_keys = opts->max_batch_keys ? opts->max_batch_keys : MOONLET_DEFAULT_MAX_BATCH_KEYS;
    const moonlet_rpc_method *table = g_methods;
    size_t ntable = sizeof(g_methods) / sizeof(g_methods[0]);
    if (opts->disabled_method) {
        s->methods = malloc(sizeof(g_methods));
        size_t k = 0;
        for (size_t i = 0; s->methods && i < ntable; i++)
            if (strcmp(g_methods[i].name, opts->disabled_method) != 0)
                s->methods[k++] = g_methods[i];
        if (!s->methods || k == ntable) {
            int rc = s->methods ? MOONLET_ERR_INVALID_PARAMS : MOONLET_ERR_INTERNAL_ERROR;
            free(s->methods);
            free(s);
            return rc;
        }
        table = s->methods;
        ntable = k;
    }
    const char *addr = opts->address ? opts->address : "127.0.0.1";
    bool loopback = strncmp(addr, "127.", 4) == 0 || strcmp(addr, "localhost") == 0 ||
                    strcmp(addr, "::1") == 0;
    if (!loopback && !opts->auth_token)
        ML_WARN("master", "listening on %s without --auth-token-file: any host that reaches this "
                "port can read and change the cache's metadata", addr);
    moonlet_rpc_server_opts ro = {
        .address = opts->address ? opts->address : "127.0.0.1",
        .port = opts->port,
        .threads = opts->threads,
        .max_frame = opts->max_frame,
        .auth_token = opts->auth_token,
        .auth_token_len = opts->auth_token ? strlen(opts->auth_token) : 0,
        .methods = table,
        .nmethods = ntable,
        .ctx = s,
        .on_close = session_close,
        .max_connections = opts->max_connections,
        .auth_timeout_ms = opts->auth_timeout_ms,
        .frame_timeout_ms = opts->frame_timeout_ms,
        .idle_timeout_ms = opts->idle_timeout_ms,
        /* twice the key cap: a batch a little over it gets the clear per-call
         * error above; anything far larger is refused before decoding */
        .max_request_elements = 2 * (uint64_t)s->max_batch_keys + 1024,
    };
    int rc = moonlet_rpc_server_create(&ro, &s->rpc);
    if (!rc)
        rc = moonlet_rpc_server_start(s->rpc);
    if (rc) {
        if (s->rpc)
            moonlet_rpc_server_destroy(s->rpc);
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

void moonlet_master_service_stop(moonlet_master_service *s)
{
    if (!s)
        return;
    moonlet_rpc_server_destroy(s->rpc);
    free(s->methods);
    free(s);
}
