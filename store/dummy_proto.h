/*
 * dummy_proto.h - the protocol between a DummyClient (store/dummy_client.c)
 * and the RealClient that serves it (store/real_client.c), over the
 * RealClient's unix-domain socket.
 *
 * It is the control-plane RPC framing (transport/frame.h) with its own method
 * table: the ids below are not the master's (transport/methods.h), and a
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
 * `tenant` is a string, or nil for the RealClient's default tenant.  Keys
 * are strings without NUL bytes.  Per-key batch results are ints: 1 / 0 / a
 * negative code, as in moonlet/client.h.
 */
#ifndef MOONLET_DUMMY_PROTO_H
#define MOONLET_DUMMY_PROTO_H

#define MOONLET_DUMMY_PROTO_VERSION 1u

/* A region's memfd name prefix: "moonlet-dummy-<pid>-<region id>". */
#define MOONLET_DUMMY_REGION_PREFIX "moonlet-dummy-"

/* Limits the RealClient enforces per connection. */
#define MOONLET_DUMMY_MAX_REGIONS 1024u                 /* regions mapped at once */
#define MOONLET_DUMMY_MAX_REGION_BYTES (UINT64_C(1) << 40) /* 1 TiB */

enum moonlet_dummy_method {
    /* [version u32, region u64, size u64] + a memfd passed with the request
     *   -> [0, protocol str]   maps the memfd (sealed F_SEAL_SHRINK, at least
     *   `size` bytes) as `region`; protocol is the RealClient's ("tcp"/"rdma") */
    MOONLET_DM_ATTACH = 101,
    /* [region] -> [0]   unmaps it */
    MOONLET_DM_DETACH = 102,
    /* [tenant, key, region, offset, len, replica_num, soft_pin, skip_checksum?,
     *  preferred_segments?, hard_pin?, soft_pin_ttl_ms?] -> [rc]
     * (skip_checksum is sent only when true or when the last three are sent;
     * those three go together, only when one of them is set) */
    MOONLET_DM_PUT = 103,
    /* same arguments as PUT -> [rc] */
    MOONLET_DM_UPSERT = 104,
    /* [tenant, key, region, offset, cap] -> [rc, size]  (size also with BUFFER_OVERFLOW) */
    MOONLET_DM_GET = 105,
    /* [tenant, key] -> [rc, size] */
    MOONLET_DM_GET_SIZE = 106,
    /* [tenant, key] -> [rc] */
    MOONLET_DM_REMOVE = 107,
    /* [tenant] -> [rc, removed] */
    MOONLET_DM_REMOVE_ALL = 108,
    /* [tenant, key] -> [rc, bool] */
    MOONLET_DM_EXIST_KEY = 109,
    /* [tenant, key] -> [rc, bool] */
    MOONLET_DM_PROBE_KEY = 110,
    /* [tenant, [key...]] -> [rc, [result...]] */
    MOONLET_DM_BATCH_EXIST_KEY = 111,
    /* [tenant, lease_mode u8, candidate_size u64, [key...]] -> [rc, [result...]]
     *   the policy reaches the master unchanged */
    MOONLET_DM_BATCH_PROBE_KEY = 112,
    /* [tenant, replica_num, soft_pin, [[key, region, offset, len]...], skip_checksum?,
     *  preferred_segments?, hard_pin?, soft_pin_ttl_ms?] (trailing args as in PUT)
     * -> [rc, [result...]] */
    MOONLET_DM_BATCH_PUT = 113,
    /* [tenant, [[key, region, offset, cap]...]] -> [rc, [result...], [len...]] */
    MOONLET_DM_BATCH_GET = 114,
    /* [tenant, key] -> [rc, json str]  (str only when rc is 0, else nil) */
    MOONLET_DM_INSPECT_KEY = 115,
    /* [tenant, [kv_key...], candidate_size u64, [kda_key...], [boundary u64...]]
     *   -> [rc, kv_prefix u64, selected i64 (-1: none), [result...] or nil]
     *   ProbeResume (moonlet_client_probe_resume), passed to the master unchanged;
     *   a RealClient without it answers "unknown method" */
    MOONLET_DM_PROBE_RESUME = 116,
};

#endif
