/*
 * master_client.c - MasterClient: typed calls over the master's control RPC.
 *
 * Every call has the same three steps: begin (lock, reconnect if the last
 * call broke the connection, start the request), pack the arguments, finish
 * (send, wait, check the reply code), then decode and end (free the reply,
 * unlock).  A call never retries on its own: the master may have applied a
 * request whose reply was lost, and only the caller knows whether repeating
 * it is safe.  The next call after a failure reconnects, pacing its
 * attempts with a capped exponential backoff (master_client.h) so that a
 * master that is down is not hammered by every caller of every client.
 *
 * Locks: mc->mu for the whole call.
 */
#include "master_client.h"

#include <cjson/cJSON.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "methods.h"
#include "moonlet/error.h"
#include "rpc_client.h"
#include "wire.h"

struct moonlet_master_client {
    pthread_mutex_t mu;
    char host[256];
    uint16_t port;
    int timeout_ms;
    char *token;
    moonlet_rpc_client *rpc;
    uint32_t backoff_base_ms, backoff_cap_ms;
    unsigned failures;         /* failed connects in a row */
    uint64_t next_connect_ms;  /* CLOCK_MONOTONIC; no attempt before it while failures > 0 */
    char *ident_id, *ident_secret; /* moonlet_mc_bind_client: re-sent on every new connection */
    bool bound;                /* the current connection holds ident_id */
    uint64_t conns;            /* connections made so far */
    uint64_t no_resume_conn;   /* that connection's master lacks ProbeResume (0: none seen) */
};

static uint64_t mc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint32_t moonlet_mc_backoff_ms(uint32_t base_ms, uint32_t cap_ms, unsigned failures)
{
    if (failures == 0)
        return 0;
    if (cap_ms < base_ms)
        cap_ms = base_ms;
    uint64_t ms = base_ms;
    for (unsigned i = 1; i < failures && ms < cap_ms; i++)
        ms *= 2;
    return ms < cap_ms ? (uint32_t)ms : cap_ms;
}

void moonlet_replica_list_free(moonlet_replica_list *l)
{
    if (!l)
        return;
    for (uint32_t i = 0; i < l->count; i++) {
        free(l->replicas[i].segment_id);
        free(l->replicas[i].endpoint);
        free(l->replicas[i].protocol);
        free(l->replicas[i].alt_segment_id);
        free(l->replicas[i].alt_endpoint);
        free(l->replicas[i].alt_protocol);
    }
    free(l->replicas);
    memset(l, 0, sizeof(*l));
}

static int parse_addr(const char *addr, char *host, size_t cap, uint16_t *port)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || (size_t)(colon - addr) >= cap)
        return MOONLET_ERR_INVALID_PARAMS;
    char *end;
    unsigned long p = strtoul(colon + 1, &end, 10);
    if (*end || p == 0 || p > 65535)
        return MOONLET_ERR_INVALID_PARAMS;
    size_t hl = (size_t)(colon - addr);
    if (addr[0] == '[' && colon[-1] == ']') { /* [v6]:port */
        addr++;
        hl -= 2;
    }
    memcpy(host, addr, hl);
    host[hl] = 0;
    *port = (uint16_t)p;
    return MOONLET_OK;
}

/* Whether an idle connection is dead: the master sends nothing unasked, so
 * anything readable (EOF after a restart, a reset, stray bytes) means the
 * connection cannot carry the next call. */
static bool mc_idle_conn_dead(const moonlet_rpc_client *rpc)
{
    struct pollfd p = {.fd = moonlet_rpc_client_fd(rpc), .events = POLLIN | POLLRDHUP};
    return poll(&p, 1, 0) > 0;
}

static int mc_connect_locked(moonlet_master_client *mc)
{
    if (mc->rpc && !moonlet_rpc_client_broken(mc->rpc) && !mc_idle_conn_dead(mc->rpc))
        return MOONLET_OK;
    moonlet_rpc_client_close(mc->rpc);
    mc->rpc = NULL;
    if (mc->failures) {
        uint64_t now = mc_now_ms();
        if (now < mc->next_connect_ms) {
            uint64_t wait = mc->next_connect_ms - now;
            if (wait > (uint64_t)mc->timeout_ms)
                return MOONLET_ERR_RPC_FAIL; /* not this call's turn: fail without waiting */
            poll(NULL, 0, (int)wait);
        }
    }
    moonlet_rpc_client_opts o = {.timeout_ms = mc->timeout_ms, .auth_token = mc->token,
                                 .auth_token_len = mc->token ? strlen(mc->token) : 0};
    int rc = moonlet_rpc_client_connect(mc->host, mc->port, &o, &mc->rpc);
    mc->bound = false;
    if (rc) {
        mc->rpc = NULL;
        if (mc->failures < 64)
            mc->failures++;
        mc->next_connect_ms =
            mc_now_ms() + moonlet_mc_backoff_ms(mc->backoff_base_ms, mc->backoff_cap_ms, mc->failures);
    } else {
        mc->failures = 0;
        mc->conns++;
    }
    return rc;
}

unsigned moonlet_mc_connect_failures(moonlet_master_client *mc)
{
    pthread_mutex_lock(&mc->mu);
    unsigned f = mc->failures;
    pthread_mutex_unlock(&mc->mu);
    return f;
}

int moonlet_mc_create(const char *addr, const moonlet_master_client_opts *opts,
                      moonlet_master_client **out)
{
    moonlet_master_client *mc = calloc(1, sizeof(*mc));
    if (!mc)
        return MOONLET_ERR_INTERNAL_ERROR;
    int rc = parse_addr(addr, mc->host, sizeof(mc->host), &mc->port);
    if (rc) {
        free(mc);
        return rc;
    }
    mc->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 10000;
    mc->backoff_base_ms = opts && opts->backoff_base_ms ? opts->backoff_base_ms
                                                        : MOONLET_MC_BACKOFF_BASE_MS;
    mc->backoff_cap_ms = opts && opts->backoff_cap_ms ? opts->backoff_cap_ms
                                                      : MOONLET_MC_BACKOFF_CAP_MS;
    if (opts && opts->auth_token && opts->auth_token[0])
        mc->token = strdup(opts->auth_token);
    pthread_mutex_init(&mc->mu, NULL);
    rc = mc_connect_locked(mc);
    if (!rc) /* a round trip now, so a refused token or a wrong peer shows here */
        rc = moonlet_mc_echo(mc, NULL, 0);
    if (rc) {
        moonlet_mc_destroy(mc);
        return rc;
    }
    *out = mc;
    return MOONLET_OK;
}

static int mc_bind_locked(moonlet_master_client *mc);

int moonlet_mc_bind_client(moonlet_master_client *mc, const char *client_id, const char *secret)
{
    if (!client_id || !secret || !*secret)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_mutex_lock(&mc->mu);
    free(mc->ident_id);
    free(mc->ident_secret);
    mc->ident_id = strdup(client_id);
    mc->ident_secret = strdup(secret);
    int rc = mc->ident_id && mc->ident_secret ? mc_connect_locked(mc) : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc)
        rc = mc_bind_locked(mc);
    pthread_mutex_unlock(&mc->mu);
    return rc;
}

void moonlet_mc_destroy(moonlet_master_client *mc)
{
    if (!mc)
        return;
    moonlet_rpc_client_close(mc->rpc);
    pthread_mutex_destroy(&mc->mu);
    free(mc->ident_id);
    free(mc->ident_secret);
    free(mc->token);
    free(mc);
}

/* ---- call skeleton ------------------------------------------------------- */

/* BindClient on the current connection; mc->mu held, connected. */
static int mc_bind_locked(moonlet_master_client *mc)
{
    msgpack_packer *pk = moonlet_rpc_client_begin(mc->rpc, MOONLET_M_BIND_CLIENT, 2);
    moonlet_pack_cstr(pk, mc->ident_id);
    moonlet_pack_cstr(pk, mc->ident_secret);
    moonlet_reply rep;
    int rc = moonlet_rpc_client_call(mc->rpc, &rep);
    if (rc == 0) {
        rc = rep.code;
        moonlet_reply_destroy(&rep);
    }
    mc->bound = rc == 0;
    return rc;
}

/* Locks and starts a request; NULL (and *rc set, lock released) on failure. */
static msgpack_packer *mc_begin(moonlet_master_client *mc, uint32_t method, uint32_t nargs, int *rc)
{
    pthread_mutex_lock(&mc->mu);
    *rc = mc_connect_locked(mc);
    /* A new connection proves the node's identity before any other call. */
    if (!*rc && mc->ident_id && !mc->bound)
        *rc = mc_bind_locked(mc);
    if (*rc) {
        pthread_mutex_unlock(&mc->mu);
        return NULL;
    }
    return moonlet_rpc_client_begin(mc->rpc, method, nargs);
}

/* Sends and waits.  Returns the transport error or the reply's code.  When
 * it returns 0, rep->result is valid until mc_end().  Always call mc_end. */
static int mc_finish(moonlet_master_client *mc, moonlet_reply *rep, bool *have_rep)
{
    int rc = moonlet_rpc_client_call(mc->rpc, rep);
    *have_rep = rc == 0;
    return rc ? rc : rep->code;
}

static void mc_end(moonlet_master_client *mc, moonlet_reply *rep, bool have_rep)
{
    if (have_rep)
        moonlet_reply_destroy(rep);
    pthread_mutex_unlock(&mc->mu);
}

static void pack_tenant(msgpack_packer *pk, const char *tenant)
{
    moonlet_pack_cstr(pk, tenant ? tenant : "");
}

/* Calls whose result carries nothing: [tenant, key] shapes and the like. */
#define MC_SIMPLE_CALL(mc, method, nargs, PACK)                                                   \
    do {                                                                                          \
        int rc_;                                                                                  \
        msgpack_packer *pk = mc_begin(mc, method, nargs, &rc_);                                   \
        if (!pk)                                                                                  \
            return rc_;                                                                           \
        PACK;                                                                                     \
        moonlet_reply rep_;                                                                       \
        bool have_;                                                                               \
        rc_ = mc_finish(mc, &rep_, &have_);                                                       \
        mc_end(mc, &rep_, have_);                                                                 \
        return rc_;                                                                               \
    } while (0)

int moonlet_mc_echo(moonlet_master_client *mc, const void *payload, size_t len)
{
    if (!payload)
        len = 0;
    MC_SIMPLE_CALL(mc, MOONLET_M_ECHO, 1, {
        msgpack_pack_bin(pk, (uint32_t)len);
        if (len)
            msgpack_pack_bin_body(pk, payload, len);
    });
}

/* CLOCK_MONOTONIC in ms: the clock store nodes check write capabilities on
 * (the same as moonlet_xfer_now_ms). */
static uint64_t mc_node_clock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int moonlet_mc_ping(moonlet_master_client *mc, const char *client_id, uint32_t *segments_out)
{
    int rc;
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_PING, 2, &rc);
    if (!pk)
        return rc;
    moonlet_pack_cstr(pk, client_id);
    /* Sampled before the send: only makes the master's offset bound smaller. */
    msgpack_pack_uint64(pk, mc_node_clock_ms());
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    if (rc == 0 && segments_out) {
        const msgpack_object *v = moonlet_wire_map_get(rep.result, "segments");
        if (v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= UINT32_MAX)
            *segments_out = (uint32_t)v->via.u64;
        else
            rc = MOONLET_ERR_RPC_FAIL;
    }
    mc_end(mc, &rep, have);
    return rc;
}

int moonlet_mc_mount_segment(moonlet_master_client *mc, const moonlet_segment_desc *s)
{
    if (s->alt_endpoint && !s->write_key)
        return MOONLET_ERR_INVALID_PARAMS; /* the trailing args come after the key */
    MC_SIMPLE_CALL(mc, MOONLET_M_MOUNT_SEGMENT, s->alt_endpoint ? 12 : s->write_key ? 9 : 7, {
        moonlet_pack_cstr(pk, s->client_id);
        moonlet_pack_cstr(pk, s->segment_id);
        moonlet_pack_cstr(pk, s->name ? s->name : s->segment_id);
        msgpack_pack_uint64(pk, s->base);
        msgpack_pack_uint64(pk, s->size);
        moonlet_pack_cstr(pk, s->endpoint);
        moonlet_pack_cstr(pk, s->protocol);
        if (s->write_key) {
            msgpack_pack_bin(pk, 16);
            msgpack_pack_bin_body(pk, s->write_key, 16);
            msgpack_pack_uint64(pk, s->node_clock_ms ? s->node_clock_ms : mc_node_clock_ms());
        }
        if (s->alt_endpoint) {
            moonlet_pack_cstr(pk, s->alt_endpoint);
            moonlet_pack_cstr(pk, s->alt_segment_id);
            moonlet_pack_cstr(pk, s->alt_protocol);
        }
    });
}

int moonlet_mc_unmount_segment(moonlet_master_client *mc, const char *client_id,
                               const char *segment_id)
{
    MC_SIMPLE_CALL(mc, MOONLET_M_UNMOUNT_SEGMENT, 2, {
        moonlet_pack_cstr(pk, client_id);
        moonlet_pack_cstr(pk, segment_id);
    });
}

/* The calls of shape [tenant, key] whose result carries nothing. */
static int tenant_key_call(moonlet_master_client *mc, uint32_t method, const char *tenant,
                           const char *key)
{
    MC_SIMPLE_CALL(mc, method, 2, {
        pack_tenant(pk, tenant);
        moonlet_pack_cstr(pk, key);
    });
}

int moonlet_mc_put_end(moonlet_master_client *mc, const char *tenant, const char *key)
{
    return tenant_key_call(mc, MOONLET_M_PUT_END, tenant, key);
}

int moonlet_mc_put_end_checksum(moonlet_master_client *mc, const char *tenant, const char *key,
                                const uint64_t *checksum)
{
    if (!checksum)
        return moonlet_mc_put_end(mc, tenant, key);
    MC_SIMPLE_CALL(mc, MOONLET_M_PUT_END, 3, {
        pack_tenant(pk, tenant);
        moonlet_pack_cstr(pk, key);
        msgpack_pack_uint64(pk, *checksum);
    });
}

int moonlet_mc_put_revoke(moonlet_master_client *mc, const char *tenant, const char *key)
{
    return tenant_key_call(mc, MOONLET_M_PUT_REVOKE, tenant, key);
}

int moonlet_mc_remove(moonlet_master_client *mc, const char *tenant, const char *key)
{
    return tenant_key_call(mc, MOONLET_M_REMOVE, tenant, key);
}

int moonlet_mc_remove_ex(moonlet_master_client *mc, const char *tenant, const char *key,
                         bool force)
{
    if (!force)
        return tenant_key_call(mc, MOONLET_M_REMOVE, tenant, key);
    MC_SIMPLE_CALL(mc, MOONLET_M_REMOVE, 3, {
        pack_tenant(pk, tenant);
        moonlet_pack_cstr(pk, key);
        msgpack_pack_true(pk);
    });
}

/* ---- decoders ------------------------------------------------------------------ */

static char *dup_str(const msgpack_object *arr, uint32_t i)
{
    const char *p;
    uint32_t len;
    if (moonlet_wire_str(arr, i, &p, &len))
        return NULL;
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, p, len);
        s[len] = 0;
    }
    return s;
}

static int decode_replicas(const msgpack_object *arr, moonlet_replica_list *out)
{
    uint32_t n = moonlet_wire_len(arr);
    if (arr->type != MSGPACK_OBJECT_ARRAY)
        return MOONLET_ERR_RPC_FAIL;
    out->replicas = calloc(n ? n : 1, sizeof(*out->replicas));
    if (!out->replicas)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *r = moonlet_wire_at(arr, i);
        moonlet_replica_desc *d = &out->replicas[i];
        uint64_t status;
        out->count = i + 1;
        d->segment_id = dup_str(r, 0);
        d->endpoint = dup_str(r, 1);
        d->protocol = dup_str(r, 2);
        if (!d->segment_id || !d->endpoint || !d->protocol || moonlet_wire_u64(r, 3, &d->base) ||
            moonlet_wire_u64(r, 4, &d->offset) || moonlet_wire_u64(r, 5, &d->size) ||
            moonlet_wire_u64(r, 6, &status))
            return MOONLET_ERR_RPC_FAIL;
        d->status = (uint8_t)status;
        /* PutStart: the write capability and the put's TTL (optional). */
        if (moonlet_wire_len(r) >= 11 &&
            (moonlet_wire_u64(r, 7, &d->cap_len) || moonlet_wire_u64(r, 8, &d->cap_expiry_ms) ||
             moonlet_wire_u64(r, 9, &d->cap_tag) || moonlet_wire_u64(r, 10, &out->put_ttl_ms)))
            return MOONLET_ERR_RPC_FAIL;
        /* A second endpoint of the same memory (optional). */
        if (moonlet_wire_len(r) >= 14) {
            d->alt_segment_id = dup_str(r, 11);
            d->alt_endpoint = dup_str(r, 12);
            d->alt_protocol = dup_str(r, 13);
            if (!d->alt_segment_id || !d->alt_endpoint || !d->alt_protocol)
                return MOONLET_ERR_RPC_FAIL;
        }
    }
    return MOONLET_OK;
}

int moonlet_mc_put_start_ex(moonlet_master_client *mc, const char *tenant, const char *key,
                            uint64_t size, uint32_t replica_num, bool soft_pin,
                            const moonlet_mc_put_extra *x, moonlet_replica_list *out)
{
    int rc;
    memset(out, 0, sizeof(*out));
    bool extra = x && (x->npreferred || x->hard_pin || x->soft_pin_ttl_ms);
    if (x && x->npreferred && !x->preferred)
        return MOONLET_ERR_INVALID_PARAMS;
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_PUT_START, extra ? 8 : 5, &rc);
    if (!pk)
        return rc;
    pack_tenant(pk, tenant);
    moonlet_pack_cstr(pk, key);
    msgpack_pack_uint64(pk, size);
    msgpack_pack_uint32(pk, replica_num);
    soft_pin ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    if (extra) {
        msgpack_pack_array(pk, (uint32_t)x->npreferred);
        for (size_t i = 0; i < x->npreferred; i++)
            moonlet_pack_cstr(pk, x->preferred[i] ? x->preferred[i] : "");
        x->hard_pin ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
        msgpack_pack_uint64(pk, x->soft_pin_ttl_ms);
    }
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    if (rc == 0) {
        out->size = size;
        rc = decode_replicas(rep.result, out);
    }
    mc_end(mc, &rep, have);
    if (rc)
        moonlet_replica_list_free(out);
    return rc;
}

int moonlet_mc_put_start(moonlet_master_client *mc, const char *tenant, const char *key,
                         uint64_t size, uint32_t replica_num, bool soft_pin,
                         moonlet_replica_list *out)
{
    return moonlet_mc_put_start_ex(mc, tenant, key, size, replica_num, soft_pin, NULL, out);
}

int moonlet_mc_get_replica_list(moonlet_master_client *mc, const char *tenant, const char *key,
                                moonlet_replica_list *out)
{
    int rc;
    memset(out, 0, sizeof(*out));
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_GET_REPLICA_LIST, 2, &rc);
    if (!pk)
        return rc;
    pack_tenant(pk, tenant);
    moonlet_pack_cstr(pk, key);
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    if (rc == 0) {
        const msgpack_object *arr;
        if (moonlet_wire_u64(rep.result, 0, &out->size) ||
            moonlet_wire_u64(rep.result, 1, &out->lease_ttl_ms) ||
            moonlet_wire_array(rep.result, 2, &arr))
            rc = MOONLET_ERR_RPC_FAIL;
        else
            rc = decode_replicas(arr, out);
        const msgpack_object *ck = moonlet_wire_len(rep.result) > 3 ? moonlet_wire_at(rep.result, 3)
                                                                    : NULL;
        if (rc == 0 && ck && ck->type != MSGPACK_OBJECT_NIL) {
            if (moonlet_wire_u64(rep.result, 3, &out->checksum))
                rc = MOONLET_ERR_RPC_FAIL;
            else
                out->has_checksum = true;
        }
    }
    mc_end(mc, &rep, have);
    if (rc)
        moonlet_replica_list_free(out);
    return rc;
}

static int decode_bool(const msgpack_object *o, bool *out)
{
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return MOONLET_ERR_RPC_FAIL;
    *out = o->via.boolean;
    return MOONLET_OK;
}

static int single_key_bool(moonlet_master_client *mc, uint32_t method, const char *tenant,
                           const char *key, bool *exists)
{
    int rc;
    msgpack_packer *pk = mc_begin(mc, method, 2, &rc);
    if (!pk)
        return rc;
    pack_tenant(pk, tenant);
    moonlet_pack_cstr(pk, key);
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    if (rc == 0)
        rc = decode_bool(rep.result, exists);
    mc_end(mc, &rep, have);
    return rc;
}

int moonlet_mc_exist_key(moonlet_master_client *mc, const char *tenant, const char *key,
                         bool *exists)
{
    return single_key_bool(mc, MOONLET_M_EXIST_KEY, tenant, key, exists);
}

int moonlet_mc_probe_key(moonlet_master_client *mc, const char *tenant, const char *key,
                         bool *exists)
{
    return single_key_bool(mc, MOONLET_M_PROBE_KEY, tenant, key, exists);
}

/* A per-key result array: true/false/negative code. */
static int decode_results(const msgpack_object *arr, size_t n, int32_t *results)
{
    if (arr->type != MSGPACK_OBJECT_ARRAY || arr->via.array.size != n)
        return MOONLET_ERR_RPC_FAIL;
    for (size_t i = 0; i < n; i++) {
        const msgpack_object *o = &arr->via.array.ptr[i];
        if (o->type == MSGPACK_OBJECT_BOOLEAN)
            results[i] = o->via.boolean;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= INT32_MIN)
            results[i] = (int32_t)o->via.i64;
        else
            return MOONLET_ERR_RPC_FAIL;
    }
    return MOONLET_OK;
}

static void pack_keys(msgpack_packer *pk, const char *const *keys, size_t n)
{
    msgpack_pack_array(pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        moonlet_pack_cstr(pk, keys[i]);
}

int moonlet_mc_batch_exist_key(moonlet_master_client *mc, const char *tenant,
                               const char *const *keys, size_t n, int32_t *results)
{
    int rc;
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_BATCH_EXIST_KEY, 2, &rc);
    if (!pk)
        return rc;
    pack_tenant(pk, tenant);
    pack_keys(pk, keys, n);
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    if (rc == 0)
        rc = decode_results(rep.result, n, results);
    mc_end(mc, &rep, have);
    return rc;
}

int moonlet_mc_batch_probe_key(moonlet_master_client *mc, const char *tenant,
                               moonlet_grant_lease_policy policy, const char *const *keys,
                               size_t n, int32_t *results)
{
    int rc;
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_BATCH_PROBE_KEY, 4, &rc);
    if (!pk)
        return rc;
    pack_tenant(pk, tenant);
    msgpack_pack_uint8(pk, policy.lease_mode);
    msgpack_pack_uint64(pk, policy.candidate_size);
    pack_keys(pk, keys, n);
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    if (rc == 0)
        rc = decode_results(rep.result, n, results);
    mc_end(mc, &rep, have);
    return rc;
}

/* True when a refused call's message says the master does not know the method. */
static bool unknown_method(const moonlet_reply *rep)
{
    static const char prefix[] = "unknown method";
    const msgpack_object *o = rep->result;
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size >= sizeof(prefix) - 1 &&
           memcmp(o->via.str.ptr, prefix, sizeof(prefix) - 1) == 0;
}

static int decode_resume(const msgpack_object *r, size_t n_kda, moonlet_mc_resume_out *out,
                         int32_t *mask)
{
    if (r->type != MSGPACK_OBJECT_ARRAY || r->via.array.size != 3)
        return MOONLET_ERR_RPC_FAIL;
    const msgpack_object *v = r->via.array.ptr;
    if (v[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return MOONLET_ERR_RPC_FAIL;
    out->kv_prefix = v[0].via.u64;
    if (v[1].type == MSGPACK_OBJECT_NEGATIVE_INTEGER && v[1].via.i64 == -1)
        out->selected = -1;
    else if (v[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER && v[1].via.u64 <= INT64_MAX)
        out->selected = (int64_t)v[1].via.u64;
    else
        return MOONLET_ERR_RPC_FAIL;
    /* the mask: a bin of one byte (0 / 1) per KDA key */
    if (v[2].type != MSGPACK_OBJECT_BIN || v[2].via.bin.size != n_kda)
        return MOONLET_ERR_RPC_FAIL;
    for (size_t i = 0; i < n_kda; i++) {
        unsigned char b = (unsigned char)v[2].via.bin.ptr[i];
        if (b > 1)
            return MOONLET_ERR_RPC_FAIL;
        mask[i] = b;
    }
    return MOONLET_OK;
}

int moonlet_mc_probe_resume(moonlet_master_client *mc, const char *tenant,
                            const char *const *kv, size_t n_kv, const char *const *kda,
                            size_t n_kda, uint64_t candidate_size, const uint64_t *boundaries,
                            size_t n_boundaries, moonlet_mc_resume_out *out, int32_t *mask)
{
    if (!out || (n_kv && !kv) || (n_kda && (!kda || !mask)) || (n_boundaries && !boundaries) ||
        n_kv > UINT32_MAX || n_kda > UINT32_MAX || n_boundaries > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    int rc;
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_PROBE_RESUME, 5, &rc);
    if (!pk)
        return rc;
    if (mc->no_resume_conn == mc->conns) { /* this master said it lacks the method; the
                                            * request begun is discarded by the next begin */
        pthread_mutex_unlock(&mc->mu);
        return MOONLET_ERR_INVALID_VERSION;
    }
    pack_tenant(pk, tenant);
    pack_keys(pk, kv, n_kv);
    msgpack_pack_uint64(pk, candidate_size);
    pack_keys(pk, kda, n_kda);
    msgpack_pack_array(pk, (uint32_t)n_boundaries);
    for (size_t i = 0; i < n_boundaries; i++)
        msgpack_pack_uint64(pk, boundaries[i]);
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    if (rc == 0) {
        rc = decode_resume(rep.result, n_kda, out, mask);
    } else if (rc == MOONLET_ERR_INVALID_PARAMS && have && unknown_method(&rep)) {
        mc->no_resume_conn = mc->conns;
        rc = MOONLET_ERR_INVALID_VERSION;
    }
    mc_end(mc, &rep, have);
    return rc;
}

int moonlet_mc_remove_all(moonlet_master_client *mc, const char *tenant, uint64_t *removed)
{
    return moonlet_mc_remove_all_ex(mc, tenant, false, removed);
}

int moonlet_mc_remove_all_ex(moonlet_master_client *mc, const char *tenant, bool force,
                             uint64_t *removed)
{
    int rc;
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_REMOVE_ALL, force ? 2 : 1, &rc);
    if (!pk)
        return rc;
    pack_tenant(pk, tenant);
    if (force)
        msgpack_pack_true(pk);
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    if (rc == 0) {
        if (rep.result->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            *removed = rep.result->via.u64;
        else
            rc = MOONLET_ERR_RPC_FAIL;
    }
    mc_end(mc, &rep, have);
    return rc;
}

/* ---- admin calls: results as cJSON ---------------------------------------------- */

static cJSON *to_json(const msgpack_object *o, int depth)
{
    if (depth > 32)
        return cJSON_CreateNull();
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return cJSON_CreateNull();
    case MSGPACK_OBJECT_BOOLEAN:
        return cJSON_CreateBool(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return cJSON_CreateNumber((double)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return cJSON_CreateNumber((double)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return cJSON_CreateNumber(o->via.f64);
    case MSGPACK_OBJECT_STR:
    case MSGPACK_OBJECT_BIN: {
        uint32_t len = o->type == MSGPACK_OBJECT_STR ? o->via.str.size : o->via.bin.size;
        const char *p = o->type == MSGPACK_OBJECT_STR ? o->via.str.ptr : o->via.bin.ptr;
        char *s = malloc(len + 1);
        if (!s)
            return NULL;
        memcpy(s, p, len);
        s[len] = 0;
        cJSON *j = cJSON_CreateString(s);
        free(s);
        return j;
    }
    case MSGPACK_OBJECT_ARRAY: {
        cJSON *a = cJSON_CreateArray();
        for (uint32_t i = 0; a && i < o->via.array.size; i++)
            cJSON_AddItemToArray(a, to_json(&o->via.array.ptr[i], depth + 1));
        return a;
    }
    case MSGPACK_OBJECT_MAP: {
        cJSON *m = cJSON_CreateObject();
        for (uint32_t i = 0; m && i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR)
                continue;
            char key[128];
            uint32_t kl = kv->key.via.str.size < sizeof(key) - 1 ? kv->key.via.str.size : sizeof(key) - 1;
            memcpy(key, kv->key.via.str.ptr, kl);
            key[kl] = 0;
            cJSON_AddItemToObject(m, key, to_json(&kv->val, depth + 1));
        }
        return m;
    }
    default:
        return cJSON_CreateNull();
    }
}

static int admin_finish(moonlet_master_client *mc, struct cJSON **out)
{
    moonlet_reply rep;
    bool have;
    int rc = mc_finish(mc, &rep, &have);
    if (rc == 0) {
        *out = to_json(rep.result, 0);
        if (!*out)
            rc = MOONLET_ERR_INTERNAL_ERROR;
    }
    mc_end(mc, &rep, have);
    return rc;
}

int moonlet_mc_list_segments(moonlet_master_client *mc, struct cJSON **out)
{
    int rc;
    if (!mc_begin(mc, MOONLET_M_LIST_SEGMENTS, 0, &rc))
        return rc;
    return admin_finish(mc, out);
}

int moonlet_mc_list_segments_page(moonlet_master_client *mc, uint64_t cursor, uint32_t limit,
                                  const char *client_id, struct cJSON **out)
{
    int rc;
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_LIST_SEGMENTS, 3, &rc);
    if (!pk)
        return rc;
    msgpack_pack_uint64(pk, cursor);
    msgpack_pack_uint32(pk, limit);
    moonlet_pack_cstr(pk, client_id ? client_id : "");
    return admin_finish(mc, out);
}

int moonlet_mc_list_keys(moonlet_master_client *mc, const char *tenant, const char *prefix,
                         const char *cursor, uint32_t limit, struct cJSON **out)
{
    int rc;
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_LIST_KEYS, 4, &rc);
    if (!pk)
        return rc;
    pack_tenant(pk, tenant);
    moonlet_pack_cstr(pk, prefix ? prefix : "");
    moonlet_pack_cstr(pk, cursor ? cursor : "");
    msgpack_pack_uint32(pk, limit);
    return admin_finish(mc, out);
}

int moonlet_mc_inspect_key(moonlet_master_client *mc, const char *tenant, const char *key,
                           struct cJSON **out)
{
    int rc;
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_INSPECT_KEY, 2, &rc);
    if (!pk)
        return rc;
    pack_tenant(pk, tenant);
    moonlet_pack_cstr(pk, key);
    return admin_finish(mc, out);
}

int moonlet_mc_stats(moonlet_master_client *mc, struct cJSON **out)
{
    int rc;
    if (!mc_begin(mc, MOONLET_M_STATS, 0, &rc))
        return rc;
    return admin_finish(mc, out);
}
