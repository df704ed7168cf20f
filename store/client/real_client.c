/*
 * real_client.c - the RealClient (include/moonlet/real_client.h): a
 * moonlet_client with a local segment, serving DummyClients of the same
 * host over a unix-domain socket (protocol: store/client/dummy_proto.h).
 *
 * The socket is the RPC server of transport/rpc_server.c with the method
 * table of dummy_proto.c: the server decodes and checks each request's
 * arguments from it before the handler runs.  Each handler checks every
 * (region, offset, length) against the connection's mapped regions, and
 * makes the same call on the RealClient's moonlet_client with pointers into
 * those regions; the reply carries that call's return code and outputs
 * unchanged.  Arguments and per-request arrays live in the request's arena.
 *
 * Why memfd + SCM_RIGHTS rather than a named POSIX shm object: a named
 * object must be opened by name, so it needs permissions that let the
 * RealClient open it (0600 fails for a DummyClient of another user in the
 * socket group unless the RealClient is root), it can be named by a peer
 * that wants the RealClient to map SOMEONE ELSE's segment, and it leaks in
 * /dev/shm when its creator dies before unlinking.  A passed descriptor has
 * none of these: the kernel hands over exactly the creator's memory, no
 * name exists, and the memory is freed when the last mapping goes.  Above
 * all, a memfd can be sealed: the RealClient maps only memory sealed with
 * F_SEAL_SHRINK, so a peer cannot truncate it under a mapping and make the
 * RealClient die of SIGBUS.  (POSIX shm cannot be sealed.)
 *
 * Each region is also registered with the client (moonlet_client_register_
 * buffer), so put_from / get_into move bytes between the region and the
 * store nodes with no further copy, on TCP and on RDMA alike.
 *
 * Threads and locks: handlers of one connection and its on_close run on
 * that connection's loop thread only, so a connection's region table (its
 * conn_data) needs no lock.  The client is thread safe.  Two atomic
 * counters; no mutex of its own.
 */
#include "moonlet/real_client.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_internal.h"
#include "dummy_proto.h"
#include "log.h"
#include "real_client_internal.h"
#include "rpc_server.h"
#include "wire.h"

#define MOD "real-client"

struct moonlet_real_client {
    moonlet_client *client;
    moonlet_rpc_server *srv;
    atomic_size_t regions; /* mapped over all connections */
};

/* One shared-memory region of a connection. */
typedef struct rc_region {
    uint64_t id;
    unsigned char *base;
    size_t len;
} rc_region;

/* A DummyClient connection (conn_data). */
typedef struct rc_conn {
    bool attached; /* its first ATTACH succeeded */
    uint32_t n;
    rc_region regions[MOONLET_DUMMY_MAX_REGIONS];
} rc_conn;

#define RC(ctx) ((moonlet_real_client *)(ctx)->server_ctx)
#define BAD(out, what) moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "expected %s", what)

/* ---- regions ----------------------------------------------------------------------- */

static rc_region *region_find(rc_conn *cn, uint64_t id)
{
    for (uint32_t i = 0; cn && i < cn->n; i++)
        if (cn->regions[i].id == id)
            return &cn->regions[i];
    return NULL;
}

static void region_unmap(moonlet_real_client *rc, rc_region *r)
{
    moonlet_client_unregister_buffer(rc->client, r->base);
    munmap(r->base, r->len);
    atomic_fetch_sub(&rc->regions, 1);
}

/* Validates and maps a passed memfd of at least `size` bytes.  Closes fd. */
static int region_map(int fd, uint64_t size, unsigned char **base, msgpack_packer *out)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    int rc = MOONLET_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || seals < 0)
        rc = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "the descriptor is not a memfd");
    else if (!(seals & F_SEAL_SHRINK))
        rc = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "the memfd is not sealed "
                               "against shrinking (F_SEAL_SHRINK)");
    else if ((uint64_t)st.st_size < size)
        rc = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "the memfd holds %lld bytes, "
                               "not %llu", (long long)st.st_size, (unsigned long long)size);
    if (rc == MOONLET_OK) {
        void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            rc = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "cannot map the memfd: %s",
                                   strerror(errno));
        else
            *base = p;
    }
    close(fd);
    return rc;
}

/* The connection's state, created at its first call. */
static rc_conn *conn_get(moonlet_rpc_ctx *ctx)
{
    if (!*ctx->conn_data)
        *ctx->conn_data = calloc(1, sizeof(rc_conn));
    return *ctx->conn_data;
}

static void on_close(void *server_ctx, void *conn_data)
{
    moonlet_real_client *rc = server_ctx;
    rc_conn *cn = conn_data;
    if (!cn)
        return;
    for (uint32_t i = 0; i < cn->n; i++)
        region_unmap(rc, &cn->regions[i]);
    if (cn->n)
        ML_DEBUG(MOD, "a DummyClient connection closed; unmapped its %u regions", cn->n);
    free(cn);
}

/* ---- arguments ---------------------------------------------------------------------- */

/* Handlers get their arguments decoded and checked against the method
 * table (dummy_proto.c) before they run, as `a` (rpc_server.h). */
#define HANDLER MOONLET_RPC_HANDLER

/* [offset, offset + len) of region `id` of the connection: *ptr, or an error packed. */
static int span(rc_conn *cn, uint64_t id, uint64_t off, uint64_t n, void **ptr,
                msgpack_packer *out)
{
    rc_region *r = region_find(cn, id);
    if (!r)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "no region %llu on this "
                                 "connection", (unsigned long long)id);
    if (off > r->len || n > r->len - off)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "range [%llu, +%llu) is "
                                 "outside region %llu of %zu bytes", (unsigned long long)off,
                                 (unsigned long long)n, (unsigned long long)id, r->len);
    *ptr = r->base + off;
    return MOONLET_OK;
}

/* Request-lifetime memory for n elements of `size` bytes. */
static void *req_alloc(moonlet_rpc_ctx *ctx, size_t n, size_t size)
{
    return moonlet_rpc_alloc(ctx, (n ? n : 1) * size);
}

/* ---- results --------------------------------------------------------------------------- */

static void pack_int(msgpack_packer *pk, int32_t v)
{
    msgpack_pack_int32(pk, v);
}

static void pack_results(msgpack_packer *pk, const int32_t *r, size_t n)
{
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        pack_int(pk, r[i]);
}

/* [rc] */
static int reply_rc(msgpack_packer *out, int rc)
{
    msgpack_pack_array(out, 1);
    pack_int(out, rc);
    return MOONLET_OK;
}

/* The connection of a call past the ATTACH check (h_attached): attached. */
static rc_conn *attached_conn(moonlet_rpc_ctx *ctx)
{
    return *ctx->conn_data;
}

/* ---- handlers ---------------------------------------------------------------------------- */

HANDLER(h_attach, moonlet_dm_attach_args)
{
    moonlet_real_client *rc = RC(ctx);
    int fd = moonlet_rpc_ctx_take_fd(ctx);
    int code = MOONLET_OK;
    rc_conn *cn = conn_get(ctx);
    if (!cn)
        code = moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    else if (a->version != MOONLET_DUMMY_PROTO_VERSION)
        code = moonlet_rpc_error(out, MOONLET_ERR_INVALID_VERSION, "protocol version %llu; "
                                 "this RealClient speaks %u", (unsigned long long)a->version,
                                 MOONLET_DUMMY_PROTO_VERSION);
    else if (fd < 0)
        code = BAD(out, "a memfd passed with ATTACH (SCM_RIGHTS)");
    else if (a->size == 0 || a->size > MOONLET_DUMMY_MAX_REGION_BYTES || a->size > SIZE_MAX)
        code = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "region size %llu outside "
                                 "[1, 1 TiB]", (unsigned long long)a->size);
    else if (region_find(cn, a->region))
        code = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "region %llu is already "
                                 "mapped", (unsigned long long)a->region);
    else if (cn->n == MOONLET_DUMMY_MAX_REGIONS)
        code = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "more than %u regions",
                                 MOONLET_DUMMY_MAX_REGIONS);
    if (code) {
        if (fd >= 0)
            close(fd);
        return code;
    }
    unsigned char *base = NULL;
    code = region_map(fd, a->size, &base, out);
    if (code)
        return code;
    int reg = moonlet_client_register_buffer(rc->client, base, (size_t)a->size);
    if (reg) {
        munmap(base, (size_t)a->size);
        return moonlet_rpc_error(out, reg, "cannot register the region: %s",
                                 moonlet_strerror(reg));
    }
    cn->regions[cn->n++] = (rc_region){.id = a->region, .base = base, .len = (size_t)a->size};
    cn->attached = true;
    atomic_fetch_add(&rc->regions, 1);
    msgpack_pack_array(out, 2);
    pack_int(out, MOONLET_OK);
    moonlet_pack_cstr(out, moonlet_client_protocol(rc->client));
    return MOONLET_OK;
}

HANDLER(h_detach, moonlet_dm_detach_args)
{
    rc_conn *cn = attached_conn(ctx);
    rc_region *r = region_find(cn, a->region);
    if (!r)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "no region %llu",
                                 (unsigned long long)a->region);
    region_unmap(RC(ctx), r);
    *r = cn->regions[--cn->n];
    return reply_rc(out, MOONLET_OK);
}

/* A put's options from its arguments (Put and BatchPut declare the same ones). */
#define PUT_OPTIONS(a)                                                                          \
    ((moonlet_put_options){.replica_num = (uint32_t)(a)->replica_num,                           \
                           .soft_pin = (a)->soft_pin,                                           \
                           .tenant = (a)->tenant,                                               \
                           .skip_checksum = (a)->skip_checksum,                                 \
                           .preferred_segments = (a)->preferred_segments.v,                     \
                           .preferred_segments_count = (a)->preferred_segments.n,               \
                           .hard_pin = (a)->hard_pin,                                           \
                           .soft_pin_ttl_ms = (a)->soft_pin_ttl_ms})

/* PUT and UPSERT -> [rc] */
HANDLER(h_put, moonlet_dm_put_args)
{
    int code;
    rc_conn *cn = attached_conn(ctx);
    void *p;
    if ((code = span(cn, a->region, a->offset, a->len, &p, out)))
        return code;
    moonlet_put_options o = PUT_OPTIONS(a);
    moonlet_client *c = RC(ctx)->client;
    int rc = ctx->method == MOONLET_DM_UPSERT ? moonlet_client_upsert(c, a->key, p, a->len, &o)
                                              : moonlet_client_put_from(c, a->key, p, a->len, &o);
    return reply_rc(out, rc);
}

/* GET -> [rc, size] */
HANDLER(h_get, moonlet_dm_get_args)
{
    int code;
    rc_conn *cn = attached_conn(ctx);
    void *p;
    size_t len = SIZE_MAX; /* stays SIZE_MAX when the client did not learn the size */
    if ((code = span(cn, a->region, a->offset, a->cap, &p, out)))
        return code;
    int rc = moonlet_client_get_into(RC(ctx)->client, a->key, p, a->cap, a->tenant, &len);
    msgpack_pack_array(out, 2);
    pack_int(out, rc);
    if (len == SIZE_MAX)
        msgpack_pack_nil(out);
    else
        msgpack_pack_uint64(out, len);
    return MOONLET_OK;
}

/* GET_SIZE, REMOVE, EXIST_KEY, PROBE_KEY, INSPECT_KEY */
HANDLER(h_key, moonlet_dm_key_args)
{
    moonlet_client *c = RC(ctx)->client;
    const char *key = a->key, *t = a->tenant;
    int rc;
    bool yes = false;
    uint64_t size = 0;
    char *json = NULL;
    switch (ctx->method) {
    case MOONLET_DM_GET_SIZE:
        rc = moonlet_client_get_size(c, key, t, &size);
        msgpack_pack_array(out, 2);
        pack_int(out, rc);
        msgpack_pack_uint64(out, size);
        break;
    case MOONLET_DM_REMOVE:
        reply_rc(out, a->force ? moonlet_client_remove_force(c, key, t)
                               : moonlet_client_remove(c, key, t));
        break;
    case MOONLET_DM_EXIST_KEY:
    case MOONLET_DM_PROBE_KEY:
        rc = ctx->method == MOONLET_DM_EXIST_KEY ? moonlet_client_exist_key(c, key, t, &yes)
                                                 : moonlet_client_probe_key(c, key, t, &yes);
        msgpack_pack_array(out, 2);
        pack_int(out, rc);
        yes ? msgpack_pack_true(out) : msgpack_pack_false(out);
        break;
    default: /* MOONLET_DM_INSPECT_KEY */
        rc = moonlet_client_inspect_key(c, key, t, &json);
        msgpack_pack_array(out, 2);
        pack_int(out, rc);
        moonlet_pack_cstr(out, json);
        free(json);
        break;
    }
    return MOONLET_OK;
}

/* -> [rc, removed] */
HANDLER(h_remove_all, moonlet_dm_remove_all_args)
{
    uint64_t removed = 0;
    moonlet_client *c = RC(ctx)->client;
    int rc = a->force ? moonlet_client_remove_all_force(c, a->tenant, &removed)
                      : moonlet_client_remove_all(c, a->tenant, &removed);
    msgpack_pack_array(out, 2);
    pack_int(out, rc);
    msgpack_pack_uint64(out, removed);
    return MOONLET_OK;
}

/* BATCH_REPLICAS -> [rc, json str or nil] */
HANDLER(h_batch_replicas, moonlet_dm_batch_keys_args)
{
    char *json = NULL;
    int rc = moonlet_client_batch_replicas(RC(ctx)->client, a->keys.v, a->keys.n, a->tenant, &json);
    msgpack_pack_array(out, 2);
    pack_int(out, rc);
    moonlet_pack_cstr(out, json); /* NULL: nil */
    moonlet_free(json);
    return MOONLET_OK;
}

/* BATCH_EXIST_KEY and BATCH_PROBE_KEY -> [rc, [result...] or nil] */
HANDLER(h_batch_keys, moonlet_dm_batch_keys_args)
{
    size_t n = a->keys.n;
    int32_t *res = req_alloc(ctx, n, sizeof(*res));
    moonlet_client *c = RC(ctx)->client;
    int rc = MOONLET_ERR_INTERNAL_ERROR;
    if (res && ctx->method == MOONLET_DM_BATCH_PROBE_KEY) {
        moonlet_grant_lease_policy pol = {.lease_mode = (uint8_t)a->lease_mode,
                                          .candidate_size = a->candidate_size};
        rc = moonlet_client_batch_probe_key(c, a->keys.v, n, pol, a->tenant, res);
    } else if (res) {
        rc = moonlet_client_batch_exist_key(c, a->keys.v, n, a->tenant, res);
    }
    msgpack_pack_array(out, 2);
    pack_int(out, rc);
    if (rc == MOONLET_OK)
        pack_results(out, res, n);
    else
        msgpack_pack_nil(out);
    return MOONLET_OK;
}

/* A batch put or get, as the client call takes it (request memory). */
typedef struct rc_batch {
    const char **keys;
    void **ptrs;
    size_t *lens; /* put: the lengths; get: the rooms */
    int32_t *res; /* per-item results, zeroed */
    size_t n;
} rc_batch;

/* Checks the connection and every item's range; 0 or the error packed. */
static int batch_items(moonlet_rpc_ctx *ctx, const moonlet_tuplev *items, rc_batch *b,
                       msgpack_packer *out)
{
    int code;
    rc_conn *cn = attached_conn(ctx);
    size_t n = b->n = items->n;
    const moonlet_dm_item *it = items->v;
    b->keys = req_alloc(ctx, n, sizeof(*b->keys));
    b->ptrs = req_alloc(ctx, n, sizeof(*b->ptrs));
    b->lens = req_alloc(ctx, n, sizeof(*b->lens));
    b->res = req_alloc(ctx, n, sizeof(*b->res));
    if (!b->keys || !b->ptrs || !b->lens || !b->res)
        return moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if ((code = span(cn, it[i].region, it[i].offset, it[i].len, &b->ptrs[i], out)))
            return code;
        b->keys[i] = it[i].key;
        b->lens[i] = (size_t)it[i].len;
        b->res[i] = 0;
    }
    return MOONLET_OK;
}

/* BATCH_PUT -> [rc, [result...]] */
HANDLER(h_batch_put, moonlet_dm_batch_put_args)
{
    rc_batch b;
    int code = batch_items(ctx, &a->items, &b, out);
    if (code)
        return code;
    moonlet_put_options o = PUT_OPTIONS(a);
    int rc = moonlet_client_batch_put_from(RC(ctx)->client, b.keys, b.n,
                                           (const void *const *)b.ptrs, b.lens, &o, b.res);
    msgpack_pack_array(out, 2);
    pack_int(out, rc);
    pack_results(out, b.res, b.n);
    return MOONLET_OK;
}

/* BATCH_GET -> [rc, [result...], [len...]] */
HANDLER(h_batch_get, moonlet_dm_batch_get_args)
{
    rc_batch b;
    int code = batch_items(ctx, &a->items, &b, out);
    size_t *lens = code ? NULL : req_alloc(ctx, b.n, sizeof(*lens));
    if (code || !lens)
        return code ? code : moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    memset(lens, 0, (b.n ? b.n : 1) * sizeof(*lens));
    int rc = moonlet_client_batch_get_into(RC(ctx)->client, b.keys, b.n, b.ptrs, b.lens, a->tenant,
                                           lens, b.res);
    msgpack_pack_array(out, 3);
    pack_int(out, rc);
    pack_results(out, b.res, b.n);
    msgpack_pack_array(out, (uint32_t)b.n);
    for (size_t i = 0; i < b.n; i++)
        msgpack_pack_uint64(out, lens[i]);
    return MOONLET_OK;
}

/* PROBE_RESUME -> [rc, kv_prefix, selected, [result...] or nil] */
HANDLER(h_probe_resume, moonlet_dm_probe_resume_args)
{
    size_t n_kda = a->kda_keys.n, n_b = a->boundaries.n;
    uint64_t cs = a->candidate_size;
    int32_t *mask = req_alloc(ctx, n_kda, sizeof(*mask));
    moonlet_probe_resume_result r = {0, -1};
    int rc;
    if (!mask)
        rc = MOONLET_ERR_INTERNAL_ERROR;
    else if (n_kda && (!cs || n_kda % cs || n_kda / cs != n_b))
        rc = MOONLET_ERR_INVALID_PARAMS; /* the client call derives the count from cs */
    else
        rc = moonlet_client_probe_resume(RC(ctx)->client, a->kv_keys.v, a->kv_keys.n,
                                         a->kda_keys.v, n_kda, cs, a->boundaries.v, a->tenant, &r,
                                         mask);
    msgpack_pack_array(out, 4);
    pack_int(out, rc);
    msgpack_pack_uint64(out, r.kv_prefix);
    msgpack_pack_int64(out, r.selected);
    if (rc == MOONLET_OK)
        pack_results(out, mask, n_kda);
    else
        msgpack_pack_nil(out);
    return MOONLET_OK;
}

/* The handler of each method of the table (dummy_proto.c), by id. */
static const moonlet_rpc_handler g_handlers[] = {
    [MOONLET_DM_ATTACH - MOONLET_DM_ATTACH] = h_attach,
    [MOONLET_DM_DETACH - MOONLET_DM_ATTACH] = h_detach,
    [MOONLET_DM_PUT - MOONLET_DM_ATTACH] = h_put,
    [MOONLET_DM_UPSERT - MOONLET_DM_ATTACH] = h_put,
    [MOONLET_DM_GET - MOONLET_DM_ATTACH] = h_get,
    [MOONLET_DM_GET_SIZE - MOONLET_DM_ATTACH] = h_key,
    [MOONLET_DM_REMOVE - MOONLET_DM_ATTACH] = h_key,
    [MOONLET_DM_REMOVE_ALL - MOONLET_DM_ATTACH] = h_remove_all,
    [MOONLET_DM_EXIST_KEY - MOONLET_DM_ATTACH] = h_key,
    [MOONLET_DM_PROBE_KEY - MOONLET_DM_ATTACH] = h_key,
    [MOONLET_DM_BATCH_EXIST_KEY - MOONLET_DM_ATTACH] = h_batch_keys,
    [MOONLET_DM_BATCH_PROBE_KEY - MOONLET_DM_ATTACH] = h_batch_keys,
    [MOONLET_DM_BATCH_PUT - MOONLET_DM_ATTACH] = h_batch_put,
    [MOONLET_DM_BATCH_GET - MOONLET_DM_ATTACH] = h_batch_get,
    [MOONLET_DM_INSPECT_KEY - MOONLET_DM_ATTACH] = h_key,
    [MOONLET_DM_PROBE_RESUME - MOONLET_DM_ATTACH] = h_probe_resume,
    [MOONLET_DM_BATCH_REPLICAS - MOONLET_DM_ATTACH] = h_batch_replicas,
};
_Static_assert(sizeof(g_handlers) / sizeof(g_handlers[0]) ==
                   MOONLET_DM_LAST - MOONLET_DM_ATTACH + 1,
               "a handler per method");

/* Every call but ATTACH needs an attached connection: checked here, once,
 * before the method's handler runs (attached_conn). */
static int h_attached(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    rc_conn *cn = *ctx->conn_data;
    if (!cn || !cn->attached)
        return moonlet_rpc_error(out, MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS,
                                 "ATTACH the staging region first");
    return g_handlers[ctx->method - MOONLET_DM_ATTACH](ctx, args, out);
}

/* The server's table: the declared methods, ATTACH's handler or the gate. */
static moonlet_rpc_method g_methods[sizeof(g_handlers) / sizeof(g_handlers[0])];
static pthread_once_t g_methods_once = PTHREAD_ONCE_INIT;

static void methods_init(void)
{
    for (size_t i = 0; i < moonlet_dummy_nmethods; i++) {
        const moonlet_rpc_method_decl *d = &moonlet_dummy_methods[i];
        moonlet_rpc_handler fn = d->id == MOONLET_DM_ATTACH ? h_attach : h_attached;
        g_methods[i] = (moonlet_rpc_method){d->id, d->name, fn, d->spec, d->roles};
    }
}


/* ---- create / destroy ------------------------------------------------------------------------ */

/* Gives the socket file the group `name` and mode 0660. */
static int socket_to_group(const char *path, const char *name)
{
    struct group gr, *res = NULL;
    char buf[4096];
    if (getgrnam_r(name, &gr, buf, sizeof(buf), &res) != 0 || !res) {
        ML_ERR(MOD, "unknown group '%s'", name);
        return MOONLET_ERR_INVALID_PARAMS;
    }
    if (chown(path, (uid_t)-1, gr.gr_gid) != 0 || chmod(path, 0660) != 0) {
        ML_ERR(MOD, "cannot give %s group %s and mode 0660: %s", path, name, strerror(errno));
        return MOONLET_ERR_RPC_FAIL;
    }
    return MOONLET_OK;
}

static int real_client_serve(moonlet_real_client *rc, const char *path, const char *group,
                             uint32_t busy_poll_us)
{
    pthread_once(&g_methods_once, methods_init);
    moonlet_rpc_server_opts o = {.unix_path = path, .threads = MOONLET_REAL_CLIENT_THREADS,
                                 .name = "rclient", .busy_poll_us = busy_poll_us,
                                 .methods = g_methods,
                                 .nmethods = sizeof(g_methods) / sizeof(g_methods[0]),
                                 .ctx = rc, .on_close = on_close};
    int r = moonlet_rpc_server_create(&o, &rc->srv);
    if (r)
        return r;
    if (group && *group && (r = socket_to_group(path, group)))
        return r;
    r = moonlet_rpc_server_start(rc->srv);
    if (r == MOONLET_OK)
        ML_INFO(MOD, "serving DummyClients on %s (mode %s)", path,
                group && *group ? "0660" : "0600");
    return r;
}

int moonlet_real_client_create_with_node(const moonlet_client_config *cfg,
                                         const moonlet_store_node_config *node,
                                         const char *socket_path, const char *socket_group,
                                         uint32_t busy_poll_us, moonlet_real_client **out)
{
    if (!cfg || !socket_path || !*socket_path || !out ||
        (!node && cfg->local_segment_size == 0))
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_real_client *rc = calloc(1, sizeof(*rc));
    if (!rc)
        return MOONLET_ERR_INTERNAL_ERROR;
    int r = moonlet_client_create_with_node(cfg, node, &rc->client);
    if (r == MOONLET_OK)
        r = real_client_serve(rc, socket_path, socket_group, busy_poll_us);
    if (r) {
        moonlet_real_client_destroy(rc);
        return r;
    }
    *out = rc;
    return MOONLET_OK;
}

int moonlet_real_client_create(const moonlet_client_config *user_cfg, const char *socket_path,
                               const char *socket_group, moonlet_real_client **out)
{
    moonlet_client_config cfg; /* the caller's opts_size bytes, defaults past them */
    if (moonlet_client_config_copy(&cfg, user_cfg))
        return MOONLET_ERR_INVALID_PARAMS;
    return moonlet_real_client_create_with_node(&cfg, NULL, socket_path, socket_group,
                                                MOONLET_REAL_CLIENT_BUSY_POLL_US, out);
}

void moonlet_real_client_destroy(moonlet_real_client *rc)
{
    if (!rc)
        return;
    moonlet_rpc_server_destroy(rc->srv); /* every on_close has run: regions unmapped */
    moonlet_client_destroy(rc->client);
    free(rc);
}

moonlet_client *moonlet_real_client_client(moonlet_real_client *rc)
{
    return rc ? rc->client : NULL;
}

size_t moonlet_real_client_connections(const moonlet_real_client *rc)
{
    return rc && rc->srv ? moonlet_rpc_server_connections(rc->srv) : 0;
}

size_t moonlet_real_client_regions(const moonlet_real_client *rc)
{
    return rc ? atomic_load(&rc->regions) : 0;
}
