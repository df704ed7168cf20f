/*
 * real_client.c - the RealClient (include/moonlet/real_client.h): a
 * moonlet_client with a local segment, serving DummyClients of the same
 * host over a unix-domain socket (protocol: store/dummy_proto.h).
 *
 * The socket is the RPC server of transport/rpc_server.c with its own method
 * table.  Each handler decodes its request, checks every (region, offset,
 * length) against the connection's mapped regions, and makes the same call
 * on the RealClient's moonlet_client with pointers into those regions; the
 * reply carries that call's return code and outputs unchanged.
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

/* ---- argument decoding --------------------------------------------------------------- */

/* Per-request scratch: NUL-terminated copies of the strings it names, in one
 * block that may move while strings are added (so a pointer into it is
 * taken only once the request's last string is copied). */
typedef struct rc_args {
    char *mem;
    size_t used, cap;
    bool has_tenant;   /* false: the client's default tenant */
    size_t tenant_off; /* in mem */
} rc_args;

/* The request's tenant: NULL for the default. */
static const char *args_tenant_of(const rc_args *a)
{
    return a->has_tenant ? a->mem + a->tenant_off : NULL;
}

/* Copies a wire string (no NUL inside) into a's memory; *out is NUL-terminated. */
static int args_str(rc_args *a, const msgpack_object *arr, uint32_t i, char **out)
{
    const char *p;
    uint32_t len;
    if (moonlet_wire_str(arr, i, &p, &len) || (len && memchr(p, 0, len)))
        return MOONLET_ERR_INVALID_PARAMS;
    if (a->cap - a->used < (size_t)len + 1) {
        size_t cap = a->cap ? a->cap : 256;
        while (cap - a->used < (size_t)len + 1)
            cap *= 2;
        char *m = realloc(a->mem, cap);
        if (!m)
            return MOONLET_ERR_INTERNAL_ERROR;
        a->mem = m;
        a->cap = cap;
    }
    *out = a->mem + a->used;
    if (len)
        memcpy(*out, p, len);
    (*out)[len] = 0;
    a->used += (size_t)len + 1;
    return MOONLET_OK;
}

/* Argument i: nil (the default tenant) or a tenant string. */
static int args_tenant(rc_args *a, const msgpack_object *arr, uint32_t i)
{
    const msgpack_object *o = moonlet_wire_at(arr, i);
    if (!o)
        return MOONLET_ERR_INVALID_PARAMS;
    if (o->type == MSGPACK_OBJECT_NIL)
        return MOONLET_OK;
    char *t;
    int rc = args_str(a, arr, i, &t);
    if (rc == MOONLET_OK) {
        a->has_tenant = true;
        a->tenant_off = (size_t)(t - a->mem);
    }
    return rc;
}

static void args_free(rc_args *a)
{
    free(a->mem);
}

/* Pointers to the strings at offs[0..n) of a->mem, once every string of the
 * request is copied (copying may move a->mem).  NULL when out of memory. */
static const char **args_ptrs(const rc_args *a, const size_t *offs, size_t n)
{
    const char **p = malloc((n ? n : 1) * sizeof(*p));
    for (size_t i = 0; p && i < n; i++)
        p[i] = a->mem + offs[i];
    return p;
}

/* A key list; *keys is malloc'd (NULL on error). */
static int args_keys(rc_args *a, const msgpack_object *list, const char ***keys, size_t *n)
{
    *keys = NULL;
    if (list->type != MSGPACK_OBJECT_ARRAY)
        return MOONLET_ERR_INVALID_PARAMS;
    *n = list->via.array.size;
    size_t *offs = malloc((*n ? *n : 1) * sizeof(*offs));
    int rc = offs ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
    for (size_t i = 0; i < *n && !rc; i++) {
        char *k;
        rc = args_str(a, list, (uint32_t)i, &k);
        if (!rc)
            offs[i] = (size_t)(k - a->mem);
    }
    if (!rc && !(*keys = args_ptrs(a, offs, *n)))
        rc = MOONLET_ERR_INTERNAL_ERROR;
    free(offs);
    return rc;
}

/* Element i of arr as a bounded range of one region: [region, offset, len]
 * starting at index i. */
static int args_span(rc_conn *cn, const msgpack_object *arr, uint32_t i, void **ptr,
                     size_t *len, msgpack_packer *out)
{
    uint64_t id, off, n;
    if (moonlet_wire_u64(arr, i, &id) || moonlet_wire_u64(arr, i + 1, &off) ||
        moonlet_wire_u64(arr, i + 2, &n))
        return BAD(out, "region, offset and length as unsigned integers");
    rc_region *r = region_find(cn, id);
    if (!r)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "no region %llu on this "
                                 "connection", (unsigned long long)id);
    if (off > r->len || n > r->len - off)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "range [%llu, +%llu) is "
                                 "outside region %llu of %zu bytes", (unsigned long long)off,
                                 (unsigned long long)n, (unsigned long long)id, r->len);
    *ptr = r->base + off;
    *len = (size_t)n;
    return MOONLET_OK;
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

/* Every call but ATTACH needs an attached connection. */
static rc_conn *need_attached(moonlet_rpc_ctx *ctx, msgpack_packer *out, int *code)
{
    rc_conn *cn = *ctx->conn_data;
    if (cn && cn->attached)
        return cn;
    *code = moonlet_rpc_error(out, MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS,
                              "ATTACH the staging region first");
    return NULL;
}

/* ---- handlers ---------------------------------------------------------------------------- */

static int h_attach(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    moonlet_real_client *rc = RC(ctx);
    int fd = moonlet_rpc_ctx_take_fd(ctx);
    uint64_t version, id, size;
    int code = MOONLET_OK;
    rc_conn *cn = conn_get(ctx);
    if (!cn)
        code = moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    else if (moonlet_wire_len(args) != 3 || moonlet_wire_u64(args, 0, &version) ||
             moonlet_wire_u64(args, 1, &id) || moonlet_wire_u64(args, 2, &size))
        code = BAD(out, "[version, region, size] and a memfd");
    else if (version != MOONLET_DUMMY_PROTO_VERSION)
        code = moonlet_rpc_error(out, MOONLET_ERR_INVALID_VERSION, "protocol version %llu; "
                                 "this RealClient speaks %u", (unsigned long long)version,
                                 MOONLET_DUMMY_PROTO_VERSION);
    else if (fd < 0)
        code = BAD(out, "a memfd passed with ATTACH (SCM_RIGHTS)");
    else if (size == 0 || size > MOONLET_DUMMY_MAX_REGION_BYTES || size > SIZE_MAX)
        code = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "region size %llu outside "
                                 "[1, 1 TiB]", (unsigned long long)size);
    else if (region_find(cn, id))
        code = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "region %llu is already "
                                 "mapped", (unsigned long long)id);
    else if (cn->n == MOONLET_DUMMY_MAX_REGIONS)
        code = moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "more than %u regions",
                                 MOONLET_DUMMY_MAX_REGIONS);
    if (code) {
        if (fd >= 0)
            close(fd);
        return code;
    }
    unsigned char *base = NULL;
    code = region_map(fd, size, &base, out);
    if (code)
        return code;
    int reg = moonlet_client_register_buffer(rc->client, base, (size_t)size);
    if (reg) {
        munmap(base, (size_t)size);
        return moonlet_rpc_error(out, reg, "cannot register the region: %s",
                                 moonlet_strerror(reg));
    }
    cn->regions[cn->n++] = (rc_region){.id = id, .base = base, .len = (size_t)size};
    cn->attached = true;
    atomic_fetch_add(&rc->regions, 1);
    msgpack_pack_array(out, 2);
    pack_int(out, MOONLET_OK);
    moonlet_pack_cstr(out, moonlet_client_protocol(rc->client));
    return MOONLET_OK;
}

static int h_detach(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int code;
    rc_conn *cn = need_attached(ctx, out, &code);
    if (!cn)
        return code;
    uint64_t id;
    if (moonlet_wire_len(args) != 1 || moonlet_wire_u64(args, 0, &id))
        return BAD(out, "[region]");
    rc_region *r = region_find(cn, id);
    if (!r)
        return moonlet_rpc_error(out, MOONLET_ERR_INVALID_PARAMS, "no region %llu",
                                 (unsigned long long)id);
    region_unmap(RC(ctx), r);
    *r = cn->regions[--cn->n];
    return reply_rc(out, MOONLET_OK);
}

/* A put's optional trailing skip_checksum at index i: false when absent. */
static int args_skip_checksum(const msgpack_object *args, uint32_t i, bool *skip)
{
    *skip = false;
    return moonlet_wire_len(args) > i ? moonlet_wire_bool(args, i, skip) : MOONLET_OK;
}

/* A put's optional placement args at i, i+1, i+2 (after skip_checksum):
 * preferred segment names, hard pin, soft-pin TTL, into o.  The names are
 * copied into *names (names_free). */
static int args_placement(const msgpack_object *args, uint32_t i, moonlet_put_options *o,
                          char ***names)
{
    *names = NULL;
    if (moonlet_wire_len(args) <= i)
        return MOONLET_OK;
    const msgpack_object *arr;
    if (moonlet_wire_array(args, i, &arr) || moonlet_wire_len(arr) > 64 ||
        moonlet_wire_bool(args, i + 1, &o->hard_pin) ||
        moonlet_wire_u64(args, i + 2, &o->soft_pin_ttl_ms))
        return MOONLET_ERR_INVALID_PARAMS;
    uint32_t n = moonlet_wire_len(arr);
    char **v = calloc(n + 1, sizeof(*v));
    if (!v)
        return MOONLET_ERR_INTERNAL_ERROR;
    *names = v;
    for (uint32_t k = 0; k < n; k++) {
        const char *p;
        uint32_t len;
        if (moonlet_wire_strn(arr, k, MOONLET_MAX_ID_BYTES, &p, &len) || (len && memchr(p, 0, len)))
            return MOONLET_ERR_INVALID_PARAMS;
        if (!(v[k] = strndup(p, len)))
            return MOONLET_ERR_INTERNAL_ERROR;
    }
    o->preferred_segments = (const char *const *)v;
    o->preferred_segments_count = n;
    return MOONLET_OK;
}

static void names_free(char **v)
{
    for (size_t k = 0; v && v[k]; k++)
        free(v[k]);
    free(v);
}

/* PUT and UPSERT: [tenant, key, region, offset, len, replica_num, soft_pin, skip_checksum?,
 * preferred_segments?, hard_pin?, soft_pin_ttl_ms?] (the last three together) */
static int h_put(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int code;
    rc_conn *cn = need_attached(ctx, out, &code);
    if (!cn)
        return code;
    rc_args a = {0};
    char *key;
    uint64_t replicas;
    bool pin, skip;
    void *p;
    size_t len;
    uint32_t nargs = moonlet_wire_len(args);
    moonlet_put_options o = {0};
    char **names = NULL;
    if ((nargs != 7 && nargs != 8 && nargs != 11) || args_tenant(&a, args, 0) ||
        args_str(&a, args, 1, &key) || moonlet_wire_u64(args, 5, &replicas) ||
        replicas > UINT32_MAX || moonlet_wire_bool(args, 6, &pin) ||
        args_skip_checksum(args, 7, &skip) || args_placement(args, 8, &o, &names)) {
        args_free(&a);
        names_free(names);
        return BAD(out, "[tenant, key, region, offset, len, replica_num, soft_pin, skip_checksum?, "
                        "preferred_segments?, hard_pin?, soft_pin_ttl_ms?]");
    }
    if ((code = args_span(cn, args, 2, &p, &len, out))) {
        args_free(&a);
        names_free(names);
        return code;
    }
    o.replica_num = (uint32_t)replicas;
    o.soft_pin = pin;
    o.tenant = args_tenant_of(&a);
    o.skip_checksum = skip;
    moonlet_client *c = RC(ctx)->client;
    int rc = ctx->method == MOONLET_DM_UPSERT ? moonlet_client_upsert(c, key, p, len, &o)
                                              : moonlet_client_put_from(c, key, p, len, &o);
    args_free(&a);
    names_free(names);
    return reply_rc(out, rc);
}

/* [tenant, key, region, offset, cap] -> [rc, size] */
static int h_get(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int code;
    rc_conn *cn = need_attached(ctx, out, &code);
    if (!cn)
        return code;
    rc_args a = {0};
    char *key;
    void *p;
    size_t cap, len = SIZE_MAX; /* stays SIZE_MAX when the client did not learn the size */
    if (moonlet_wire_len(args) != 5 || args_tenant(&a, args, 0) || args_str(&a, args, 1, &key)) {
        args_free(&a);
        return BAD(out, "[tenant, key, region, offset, cap]");
    }
    if ((code = args_span(cn, args, 2, &p, &cap, out))) {
        args_free(&a);
        return code;
    }
    int rc = moonlet_client_get_into(RC(ctx)->client, key, p, cap, &len, args_tenant_of(&a));
    args_free(&a);
    msgpack_pack_array(out, 2);
    pack_int(out, rc);
    if (len == SIZE_MAX)
        msgpack_pack_nil(out);
    else
        msgpack_pack_uint64(out, len);
    return MOONLET_OK;
}

/* [tenant, key]: GET_SIZE, REMOVE, EXIST_KEY, PROBE_KEY, INSPECT_KEY;
 * REMOVE also [tenant, key, force] */
static int h_key(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int code;
    if (!need_attached(ctx, out, &code))
        return code;
    rc_args a = {0};
    char *key;
    bool force = false;
    uint32_t nargs = moonlet_wire_len(args);
    if (!(nargs == 2 || (nargs == 3 && ctx->method == MOONLET_DM_REMOVE &&
                         moonlet_wire_bool(args, 2, &force) == 0)) ||
        args_tenant(&a, args, 0) || args_str(&a, args, 1, &key)) {
        args_free(&a);
        return BAD(out, "[tenant, key]");
    }
    moonlet_client *c = RC(ctx)->client;
    const char *t = args_tenant_of(&a);
    int rc;
    bool yes = false;
    uint64_t size = 0;
    char *json = NULL;
    switch (ctx->method) {
    case MOONLET_DM_GET_SIZE:
        rc = moonlet_client_get_size(c, key, &size, t);
        msgpack_pack_array(out, 2);
        pack_int(out, rc);
        msgpack_pack_uint64(out, size);
        break;
    case MOONLET_DM_REMOVE:
        reply_rc(out, force ? moonlet_client_remove_force(c, key, t)
                            : moonlet_client_remove(c, key, t));
        break;
    case MOONLET_DM_EXIST_KEY:
    case MOONLET_DM_PROBE_KEY:
        rc = ctx->method == MOONLET_DM_EXIST_KEY ? moonlet_client_exist_key(c, key, &yes, t)
                                                 : moonlet_client_probe_key(c, key, &yes, t);
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
    args_free(&a);
    return MOONLET_OK;
}

/* [tenant] -> [rc, removed] */
static int h_remove_all(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int code;
    if (!need_attached(ctx, out, &code))
        return code;
    rc_args a = {0};
    bool force = false;
    uint32_t nargs = moonlet_wire_len(args);
    if (!(nargs == 1 || (nargs == 2 && moonlet_wire_bool(args, 1, &force) == 0)) ||
        args_tenant(&a, args, 0)) {
        args_free(&a);
        return BAD(out, "[tenant, force?]");
    }
    uint64_t removed = 0;
    int rc = force ? moonlet_client_remove_all_force(RC(ctx)->client, &removed,
                                                     args_tenant_of(&a))
                   : moonlet_client_remove_all(RC(ctx)->client, &removed, args_tenant_of(&a));
    args_free(&a);
    msgpack_pack_array(out, 2);
    pack_int(out, rc);
    msgpack_pack_uint64(out, removed);
    return MOONLET_OK;
}

/* BATCH_EXIST_KEY [tenant, [key...]] and BATCH_PROBE_KEY [tenant, mode, k, [key...]] */
static int h_batch_keys(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int code;
    if (!need_attached(ctx, out, &code))
        return code;
    bool probe = ctx->method == MOONLET_DM_BATCH_PROBE_KEY;
    uint32_t nargs = probe ? 4 : 2;
    rc_args a = {0};
    uint64_t mode = 0, k = 0;
    const msgpack_object *list;
    const char **keys = NULL;
    size_t n = 0;
    if (moonlet_wire_len(args) != nargs || args_tenant(&a, args, 0) ||
        (probe && (moonlet_wire_u64(args, 1, &mode) || mode > UINT8_MAX ||
                   moonlet_wire_u64(args, 2, &k))) ||
        moonlet_wire_array(args, nargs - 1, &list) || args_keys(&a, list, &keys, &n)) {
        args_free(&a);
        return BAD(out, probe ? "[tenant, lease_mode u8, candidate_size, [key...]]"
                              : "[tenant, [key...]]");
    }
    int32_t *res = calloc(n ? n : 1, sizeof(*res));
    moonlet_client *c = RC(ctx)->client;
    const char *t = args_tenant_of(&a);
    int rc = MOONLET_ERR_INTERNAL_ERROR;
    if (res && probe) {
        moonlet_grant_lease_policy pol = {.lease_mode = (uint8_t)mode, .candidate_size = k};
        rc = moonlet_client_batch_probe_key(c, pol, keys, n, res, t);
    } else if (res) {
        rc = moonlet_client_batch_exist_key(c, keys, n, res, t);
    }
    msgpack_pack_array(out, 2);
    pack_int(out, rc);
    if (rc == MOONLET_OK)
        pack_results(out, res, n);
    else
        msgpack_pack_nil(out);
    free(res);
    free(keys);
    args_free(&a);
    return MOONLET_OK;
}

/* The items of a batch put or get, each [key, region, offset, len]: *keys,
 * *ptrs and *lens are malloc'd (the caller frees them, also on error). */
static int batch_items(rc_conn *cn, rc_args *a, const msgpack_object *list, const char ***keys,
                       void ***ptrs, size_t **lens, size_t *n, msgpack_packer *out)
{
    *keys = NULL;
    *n = list->via.array.size;
    size_t m = *n ? *n : 1;
    size_t *offs = malloc(m * sizeof(*offs));
    *ptrs = malloc(m * sizeof(**ptrs));
    *lens = malloc(m * sizeof(**lens));
    int code = MOONLET_OK;
    if (!offs || !*ptrs || !*lens)
        code = moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    for (size_t i = 0; i < *n && !code; i++) {
        const msgpack_object *it = &list->via.array.ptr[i];
        char *k;
        if (moonlet_wire_len(it) != 4 || args_str(a, it, 0, &k))
            code = BAD(out, "batch items [key, region, offset, len]");
        else if (!(code = args_span(cn, it, 1, &(*ptrs)[i], &(*lens)[i], out)))
            offs[i] = (size_t)(k - a->mem);
    }
    if (!code && !(*keys = args_ptrs(a, offs, *n)))
        code = moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    free(offs);
    return code;
}

/* BATCH_PUT [tenant, replica_num, soft_pin, [item...], skip_checksum?, preferred_segments?,
 * hard_pin?, soft_pin_ttl_ms?] -> [rc, [result...]] */
static int h_batch_put(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int code;
    rc_conn *cn = need_attached(ctx, out, &code);
    if (!cn)
        return code;
    rc_args a = {0};
    uint64_t replicas;
    bool pin, skip;
    const msgpack_object *list;
    uint32_t nargs = moonlet_wire_len(args);
    moonlet_put_options o = {0};
    char **names = NULL;
    if ((nargs != 4 && nargs != 5 && nargs != 8) || args_tenant(&a, args, 0) ||
        moonlet_wire_u64(args, 1, &replicas) || replicas > UINT32_MAX ||
        moonlet_wire_bool(args, 2, &pin) || moonlet_wire_array(args, 3, &list) ||
        args_skip_checksum(args, 4, &skip) || args_placement(args, 5, &o, &names)) {
        args_free(&a);
        names_free(names);
        return BAD(out, "[tenant, replica_num, soft_pin, [[key, region, offset, len]...], "
                        "skip_checksum?, preferred_segments?, hard_pin?, soft_pin_ttl_ms?]");
    }
    const char **keys;
    void **ptrs;
    size_t *lens, n;
    code = batch_items(cn, &a, list, &keys, &ptrs, &lens, &n, out);
    int32_t *res = code ? NULL : calloc(n ? n : 1, sizeof(*res));
    if (!code && !res)
        code = moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    if (!code) {
        o.replica_num = (uint32_t)replicas;
        o.soft_pin = pin;
        o.tenant = args_tenant_of(&a);
        o.skip_checksum = skip;
        int rc = moonlet_client_batch_put_from(RC(ctx)->client, keys, (const void *const *)ptrs,
                                               lens, n, &o, res);
        msgpack_pack_array(out, 2);
        pack_int(out, rc);
        pack_results(out, res, n);
    }
    free(res);
    free(keys);
    free(ptrs);
    free(lens);
    args_free(&a);
    names_free(names);
    return code;
}

/* BATCH_GET [tenant, [item...]] -> [rc, [result...], [len...]] */
static int h_batch_get(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int code;
    rc_conn *cn = need_attached(ctx, out, &code);
    if (!cn)
        return code;
    rc_args a = {0};
    const msgpack_object *list;
    if (moonlet_wire_len(args) != 2 || args_tenant(&a, args, 0) ||
        moonlet_wire_array(args, 1, &list)) {
        args_free(&a);
        return BAD(out, "[tenant, [[key, region, offset, cap]...]]");
    }
    const char **keys;
    void **ptrs;
    size_t *caps, n;
    code = batch_items(cn, &a, list, &keys, &ptrs, &caps, &n, out);
    int32_t *res = code ? NULL : calloc(n ? n : 1, sizeof(*res));
    size_t *lens = code ? NULL : calloc(n ? n : 1, sizeof(*lens));
    if (!code && (!res || !lens))
        code = moonlet_rpc_error(out, MOONLET_ERR_INTERNAL_ERROR, "out of memory");
    if (!code) {
        int rc = moonlet_client_batch_get_into(RC(ctx)->client, keys, ptrs, caps, n, lens, res,
                                               args_tenant_of(&a));
        msgpack_pack_array(out, 3);
        pack_int(out, rc);
        pack_results(out, res, n);
        msgpack_pack_array(out, (uint32_t)n);
        for (size_t i = 0; i < n; i++)
            msgpack_pack_uint64(out, lens[i]);
    }
    free(res);
    free(lens);
    free(keys);
    free(ptrs);
    free(caps);
    args_free(&a);
    return code;
}
/* PROBE_RESUME [tenant, [kv_key...], candidate_size, [kda_key...], [boundary...]]
 *   -> [rc, kv_prefix, selected, [result...] or nil] */
static int h_probe_resume(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    int code;
    if (!need_attached(ctx, out, &code))
        return code;
    rc_args a = {0};
    uint64_t cs = 0;
    const msgpack_object *kv_l, *kda_l, *b_l;
    size_t n_kv = 0, n_kda = 0, n_b = 0, *offs = NULL;
    uint64_t *bounds = NULL;
    int rc = MOONLET_OK;
    if (moonlet_wire_len(args) != 5 || args_tenant(&a, args, 0) ||
        moonlet_wire_array(args, 1, &kv_l) || moonlet_wire_u64(args, 2, &cs) ||
        moonlet_wire_array(args, 3, &kda_l) || moonlet_wire_array(args, 4, &b_l)) {
        rc = MOONLET_ERR_INVALID_PARAMS;
    } else {
        n_kv = kv_l->via.array.size;
        n_kda = kda_l->via.array.size;
        n_b = b_l->via.array.size;
        offs = malloc((n_kv + n_kda + 1) * sizeof(*offs));
        bounds = malloc((n_b + 1) * sizeof(*bounds));
        if (!offs || !bounds)
            rc = MOONLET_ERR_INVALID_PARAMS;
    }
    /* copy every key first: copying may move a->mem, so pointers come after */
    for (size_t i = 0; i < n_kv + n_kda && !rc; i++) {
        char *k;
        rc = i < n_kv ? args_str(&a, kv_l, (uint32_t)i, &k)
                      : args_str(&a, kda_l, (uint32_t)(i - n_kv), &k);
        if (!rc)
            offs[i] = (size_t)(k - a.mem);
    }
    for (size_t i = 0; i < n_b && !rc; i++)
        rc = moonlet_wire_u64(b_l, (uint32_t)i, &bounds[i]);
    const char **keys = rc ? NULL : args_ptrs(&a, offs, n_kv + n_kda);
    free(offs);
    if (!keys) {
        free(bounds);
        args_free(&a);
        return BAD(out, "[tenant, [kv_key...], candidate_size, [kda_key...], [boundary...]]");
    }
    int32_t *mask = calloc(n_kda ? n_kda : 1, sizeof(*mask));
    moonlet_probe_resume_result r = {0, -1};
    if (!mask)
        rc = MOONLET_ERR_INTERNAL_ERROR;
    else if (n_kda && (!cs || n_kda % cs || n_kda / cs != n_b))
        rc = MOONLET_ERR_INVALID_PARAMS; /* the client call derives the count from cs */
    else
        rc = moonlet_client_probe_resume(RC(ctx)->client, keys, n_kv, keys + n_kv, n_kda, cs,
                                         bounds, &r, mask, args_tenant_of(&a));
    msgpack_pack_array(out, 4);
    pack_int(out, rc);
    msgpack_pack_uint64(out, r.kv_prefix);
    msgpack_pack_int64(out, r.selected);
    if (rc == MOONLET_OK)
        pack_results(out, mask, n_kda);
    else
        msgpack_pack_nil(out);
    free(mask);
    free(bounds);
    free(keys);
    args_free(&a);
    return MOONLET_OK;
}

static const moonlet_rpc_method g_methods[] = {
    {MOONLET_DM_ATTACH, "Attach", h_attach},
    {MOONLET_DM_DETACH, "Detach", h_detach},
    {MOONLET_DM_PUT, "Put", h_put},
    {MOONLET_DM_UPSERT, "Upsert", h_put},
    {MOONLET_DM_GET, "Get", h_get},
    {MOONLET_DM_GET_SIZE, "GetSize", h_key},
    {MOONLET_DM_REMOVE, "Remove", h_key},
    {MOONLET_DM_REMOVE_ALL, "RemoveAll", h_remove_all},
    {MOONLET_DM_EXIST_KEY, "ExistKey", h_key},
    {MOONLET_DM_PROBE_KEY, "ProbeKey", h_key},
    {MOONLET_DM_BATCH_EXIST_KEY, "BatchExistKey", h_batch_keys},
    {MOONLET_DM_BATCH_PROBE_KEY, "BatchProbeKey", h_batch_keys},
    {MOONLET_DM_BATCH_PUT, "BatchPut", h_batch_put},
    {MOONLET_DM_BATCH_GET, "BatchGet", h_batch_get},
    {MOONLET_DM_INSPECT_KEY, "InspectKey", h_key},
    {MOONLET_DM_PROBE_RESUME, "ProbeResume", h_probe_resume},
};

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
    moonlet_rpc_server_opts o = {.unix_path = path, .threads = MOONLET_REAL_CLIENT_THREADS,
                                 .busy_poll_us = busy_poll_us, .methods = g_methods,
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
