/*
 * dummy_proto.h - the protocol between a DummyClient (store/client/dummy_client.c)
 * and the RealClient that serves it (store/client/real_client.c), over the
 * RealClient's unix-domain socket.
 *
 * It is the control-plane RPC framing (transport/frame.h) with its own method
 * table: the ids below are not the master's (master/service/methods.h), and a
 * range of their own (101..) so that a DummyClient pointed at a master, or a
 * MasterClient pointed at a RealClient, gets "unknown method" instead of a
 * misread call.  Never renumber, only append.
 *
 * Object bytes never travel on the socket.  They live in REGIONS: memfd
 * memory that the DummyClient creates, seals against shrinking, maps, and
 * passes to the RealClient over the socket (SCM_RIGHTS) with ATTACH; the
 * RealClient maps it too.  Every data call names (region, offset, length);
 * the RealClient checks that range against the region before it touches a
 * byte.  Region ids are chosen by the DummyClient and are per connection.
 * A connection's first call must be ATTACH (its staging area); any other
 * call before it is refused with UNAVAILABLE_IN_CURRENT_STATUS.
 *
 * Two levels of result:
 *  - the reply code (frame.h) is non-zero when the REQUEST was refused:
 *    malformed or wrongly typed arguments, an unknown method or region, a
 *    range outside its region, a bad descriptor (INVALID_PARAMS), a newer
 *    protocol version (INVALID_VERSION), no ATTACH yet
 *    (UNAVAILABLE_IN_CURRENT_STATUS).  The result is then a message string.
 *  - otherwise the call was made, and the result is an array whose first
 *    element is the moonlet_client_* return code, followed by the call's
 *    outputs (which exist even for some errors: the size needed with
 *    BUFFER_OVERFLOW, per-key results of batches).
 * The DummyClient returns either code to its caller unchanged.
 *
 * Arguments are decoded before the handler runs: a request with malformed
 * arguments is refused INVALID_PARAMS even before ATTACH.
 *
 * `tenant` is a string, or nil for the RealClient's default tenant.  Keys
 * are strings without NUL bytes.  Per-key batch results are ints: 1 / 0 / a
 * negative code, as in moonlet/client.h.
 */
#ifndef MOONLET_DUMMY_PROTO_H
#define MOONLET_DUMMY_PROTO_H

#include <stdbool.h>
#include <stdint.h>

#include "rpc_args.h"

#define MOONLET_DUMMY_PROTO_VERSION 1u

/* A region's memfd name prefix: "moonlet-dummy-<pid>-<region id>". */
#define MOONLET_DUMMY_REGION_PREFIX "moonlet-dummy-"

/* Limits the RealClient enforces per connection. */
#define MOONLET_DUMMY_MAX_REGIONS 1024u                 /* regions mapped at once */
#define MOONLET_DUMMY_MAX_REGION_BYTES (UINT64_C(1) << 40) /* 1 TiB */

/* Argument lists: declared once, in store/client/dummy_proto.c (moonlet_dummy_methods),
 * in the structs below; the RealClient decodes requests from the table before
 * its handler runs, the DummyClient packs them from it (transport/rpc_args.h).
 * Results are given beside each id. */
enum moonlet_dummy_method {
    /* + a memfd passed with the request -> [0, protocol str]: maps the memfd
     *   (sealed F_SEAL_SHRINK, at least `size` bytes) as `region`; protocol is
     *   the RealClient's ("tcp"/"rdma") */
    MOONLET_DM_ATTACH = 101,
    MOONLET_DM_DETACH = 102,       /* -> [0]   unmaps the region */
    MOONLET_DM_PUT = 103,          /* -> [rc] */
    MOONLET_DM_UPSERT = 104,       /* -> [rc] */
    MOONLET_DM_GET = 105,          /* -> [rc, size]  (size also with BUFFER_OVERFLOW) */
    MOONLET_DM_GET_SIZE = 106,     /* -> [rc, size] */
    MOONLET_DM_REMOVE = 107,       /* -> [rc] */
    MOONLET_DM_REMOVE_ALL = 108,   /* -> [rc, removed] */
    MOONLET_DM_EXIST_KEY = 109,    /* -> [rc, bool] */
    MOONLET_DM_PROBE_KEY = 110,    /* -> [rc, bool] */
    MOONLET_DM_BATCH_EXIST_KEY = 111, /* -> [rc, [result...]] */
    MOONLET_DM_BATCH_PROBE_KEY = 112, /* -> [rc, [result...]]; the policy reaches the master unchanged */
    MOONLET_DM_BATCH_PUT = 113,    /* -> [rc, [result...]] */
    MOONLET_DM_BATCH_GET = 114,    /* -> [rc, [result...], [len...]] */
    MOONLET_DM_INSPECT_KEY = 115,  /* -> [rc, json str]  (str only when rc is 0, else nil) */
    /* -> [rc, kv_prefix u64, selected i64 (-1: none), [result...] or nil]:
     *   moonlet_client_probe_resume, passed to the master unchanged; a
     *   RealClient without it answers "unknown method" */
    MOONLET_DM_PROBE_RESUME = 116,
    /* [tenant, [keys...]] -> [rc, json str or nil]: moonlet_client_batch_replicas
     * (one BatchGetReplicaList); a RealClient without it answers "unknown method" */
    MOONLET_DM_BATCH_REPLICAS = 117,
    MOONLET_DM_LAST = MOONLET_DM_BATCH_REPLICAS,
};

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    uint64_t version, region, size;
} moonlet_dm_attach_args;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    uint64_t region;
} moonlet_dm_detach_args;

/* Put and Upsert.  skip_checksum goes only when true or when the last
 * three go; those three go together, only when one of them is set. */
typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    const char *tenant, *key;
    uint64_t region, offset, len, replica_num;
    bool soft_pin, skip_checksum;
    moonlet_cstrv preferred_segments;
    bool hard_pin;
    uint64_t soft_pin_ttl_ms;
} moonlet_dm_put_args;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    const char *tenant, *key;
    uint64_t region, offset, cap;
} moonlet_dm_get_args;

/* GetSize, ExistKey, ProbeKey, InspectKey; Remove also declares force. */
typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    const char *tenant, *key;
    bool force;
} moonlet_dm_key_args;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    const char *tenant;
    bool force;
} moonlet_dm_remove_all_args;

/* BatchExistKey [tenant, keys]; BatchProbeKey also lease_mode, candidate_size. */
typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    const char *tenant;
    uint64_t lease_mode, candidate_size;
    moonlet_cstrv keys;
} moonlet_dm_batch_keys_args;

/* An item of BatchPut (len) and BatchGet (cap): [key, region, offset, len]. */
typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    const char *key;
    uint64_t region, offset, len;
} moonlet_dm_item;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    const char *tenant;
    uint64_t replica_num;
    bool soft_pin;
    moonlet_tuplev items; /* moonlet_dm_item */
    bool skip_checksum;   /* the optional ones as in Put */
    moonlet_cstrv preferred_segments;
    bool hard_pin;
    uint64_t soft_pin_ttl_ms;
} moonlet_dm_batch_put_args;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    const char *tenant;
    moonlet_tuplev items; /* moonlet_dm_item */
} moonlet_dm_batch_get_args;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    const char *tenant;
    moonlet_cstrv kv_keys;
    uint64_t candidate_size;
    moonlet_cstrv kda_keys;
    moonlet_u64v boundaries;
} moonlet_dm_probe_resume_args;

/* The table, in id order from MOONLET_DM_ATTACH. */
extern const moonlet_rpc_method_decl moonlet_dummy_methods[];
extern const size_t moonlet_dummy_nmethods;
/* The declaration of method `id`, or NULL. */
const moonlet_rpc_method_decl *moonlet_dummy_method(uint32_t id);

#endif
