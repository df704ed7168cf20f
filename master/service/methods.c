/*
 * methods.c - the master's method table: every method's arguments, declared
 * once (methods.h, transport/rpc_args.h).  Adding an argument is one row
 * here, one field in its struct in methods.h, and its use in the handler
 * (docs/protocol.md, "Adding a method or an argument").  No state; no locks.
 */
#include "methods.h"

#include <stddef.h>

#include "cred.h"
#include "master.h"
#include "moonlet/types.h"

#define OPT MOONLET_ARG_OPTIONAL
#define WITH_PREV MOONLET_ARG_WITH_PREV
#define BATCH MOONLET_ARG_BATCH
#define STR MOONLET_ARG_STR
#define CSTR MOONLET_ARG_CSTR
#define BIN MOONLET_ARG_BIN
#define U64 MOONLET_ARG_U64
#define BOOL MOONLET_ARG_BOOL
#define STRS MOONLET_ARG_STR_ARRAY
#define U64S MOONLET_ARG_U64_ARRAY
#define NULLABLE MOONLET_ARG_NULLABLE

#define ARG MOONLET_RPC_ARG /* rpc_args.h: one row of an argument table */
#define ID_MAX MOONLET_MAX_ID_BYTES
#define PROTO_MAX 15 /* "tcp", "rdma", ... */
/* The object a per-object method names.  Keys are not bounded here: the
 * master answers an oversized key INVALID_KEY. */
#define TENANT_KEY(T) {ARG(T, tenant, STR, 0)}, {ARG(T, key, STR, 0)}

static const moonlet_rpc_arg auth_args[] = {
    {.name = "token", .kind = STR, .offset = offsetof(moonlet_args_key, tenant)}};

static const moonlet_rpc_arg ping_args[] = {
    {ARG(moonlet_args_ping, client_id, STR, 0)},
    {ARG(moonlet_args_ping, node_clock_ms, U64, OPT)},
    {ARG(moonlet_args_ping, disk, U64S, OPT), .max = MOONLET_NODE_DISK_MAX},
};

const char *const moonlet_node_disk_names[MOONLET_NODE_DISK_NFIELDS] = {
    [MOONLET_NODE_DISK_READS] = "reads",
    [MOONLET_NODE_DISK_READ_ERRORS] = "read_errors",
    [MOONLET_NODE_DISK_IO_ERRORS] = "io_errors",
    [MOONLET_NODE_DISK_CHECKSUM_ERRORS] = "checksum_errors",
    [MOONLET_NODE_DISK_INFLIGHT] = "inflight",
    [MOONLET_NODE_DISK_QUEUE_DEPTH] = "queue_depth",
    [MOONLET_NODE_DISK_DEMOTED] = "demoted",
    [MOONLET_NODE_DISK_DEMOTE_FAILED] = "demote_failed",
};

static const moonlet_rpc_arg mount_args[] = {
    {ARG(moonlet_args_mount, client_id, CSTR, 0), .max = ID_MAX},
    {ARG(moonlet_args_mount, segment_id, CSTR, 0), .max = ID_MAX},
    {ARG(moonlet_args_mount, name, CSTR, 0), .max = ID_MAX},
    {ARG(moonlet_args_mount, base, U64, 0)},
    {ARG(moonlet_args_mount, size, U64, 0)},
    {ARG(moonlet_args_mount, endpoint, CSTR, 0), .max = MOONLET_MAX_ENDPOINT_BYTES},
    {ARG(moonlet_args_mount, protocol, CSTR, 0), .max = PROTO_MAX},
    {ARG(moonlet_args_mount, write_key, BIN, OPT), .max = 16},
    {ARG(moonlet_args_mount, node_clock_ms, U64, OPT | WITH_PREV)},
    {ARG(moonlet_args_mount, alt_endpoint, CSTR, OPT | NULLABLE), .max = MOONLET_MAX_ENDPOINT_BYTES},
    {ARG(moonlet_args_mount, alt_segment_id, CSTR, OPT | WITH_PREV | NULLABLE), .max = ID_MAX},
    {ARG(moonlet_args_mount, alt_protocol, CSTR, OPT | WITH_PREV | NULLABLE), .max = PROTO_MAX},
    {ARG(moonlet_args_mount, disk, BOOL, OPT)},
};

static const moonlet_rpc_arg unmount_args[] = {
    {ARG(moonlet_args_unmount, client_id, STR, 0)},
    {ARG(moonlet_args_unmount, segment_id, STR, 0)},
};

static const moonlet_rpc_arg bind_args[] = {
    {ARG(moonlet_args_bind, client_id, STR, 0)},
    {ARG(moonlet_args_bind, secret, STR, 0)},
};

static const moonlet_rpc_arg key_args[] = {
    TENANT_KEY(moonlet_args_key),
};

static const moonlet_rpc_arg put_start_args[] = {
    TENANT_KEY(moonlet_args_put_start),
    {ARG(moonlet_args_put_start, size, U64, 0)},
    {ARG(moonlet_args_put_start, replica_num, U64, 0), .max = UINT32_MAX},
    {ARG(moonlet_args_put_start, soft_pin, BOOL, 0)},
    {ARG(moonlet_args_put_start, preferred_segments, STRS, OPT), .max = MOONLET_MAX_PREFERRED,
     .elem_max = ID_MAX},
    {ARG(moonlet_args_put_start, hard_pin, BOOL, OPT)},
    {ARG(moonlet_args_put_start, soft_pin_ttl_ms, U64, OPT)},
};

static const moonlet_rpc_arg put_end_args[] = {
    TENANT_KEY(moonlet_args_put_end),
    {ARG(moonlet_args_put_end, checksum, U64, OPT)},
};

static const moonlet_rpc_arg remove_args[] = {
    TENANT_KEY(moonlet_args_remove),
    {ARG(moonlet_args_remove, force, BOOL, OPT)},
};

static const moonlet_rpc_arg remove_all_args[] = {
    {ARG(moonlet_args_remove_all, tenant, STR, 0)},
    {ARG(moonlet_args_remove_all, force, BOOL, OPT)},
};

static const moonlet_rpc_arg batch_exist_args[] = {
    {ARG(moonlet_args_batch_exist, tenant, STR, 0)},
    {ARG(moonlet_args_batch_exist, keys, STRS, BATCH)},
};

static const moonlet_rpc_arg batch_probe_args[] = {
    {ARG(moonlet_args_batch_probe, tenant, STR, 0)},
    {ARG(moonlet_args_batch_probe, lease_mode, U64, 0), .max = UINT8_MAX},
    {ARG(moonlet_args_batch_probe, candidate_size, U64, 0)},
    {ARG(moonlet_args_batch_probe, keys, STRS, BATCH)},
};

static const moonlet_rpc_arg batch_put_start_args[] = {
    {ARG(moonlet_args_batch_put_start, tenant, STR, 0)},
    {ARG(moonlet_args_batch_put_start, keys, STRS, BATCH)},
    {ARG(moonlet_args_batch_put_start, sizes, U64S, BATCH)},
    {ARG(moonlet_args_batch_put_start, replica_num, U64, 0), .max = UINT32_MAX},
    {ARG(moonlet_args_batch_put_start, soft_pin, BOOL, 0)},
    {ARG(moonlet_args_batch_put_start, preferred_segments, STRS, OPT),
     .max = MOONLET_MAX_PREFERRED, .elem_max = ID_MAX},
    {ARG(moonlet_args_batch_put_start, hard_pin, BOOL, OPT)},
    {ARG(moonlet_args_batch_put_start, soft_pin_ttl_ms, U64, OPT)},
};

static const moonlet_rpc_arg batch_put_end_args[] = {
    {ARG(moonlet_args_batch_put_end, tenant, STR, 0)},
    {ARG(moonlet_args_batch_put_end, keys, STRS, BATCH)},
    {ARG(moonlet_args_batch_put_end, checksums, U64S, OPT | BATCH)},
    {ARG(moonlet_args_batch_put_end, put_ids, U64S, OPT | BATCH)},
};

static const moonlet_rpc_arg batch_put_revoke_args[] = {
    {ARG(moonlet_args_batch_put_revoke, tenant, STR, 0)},
    {ARG(moonlet_args_batch_put_revoke, keys, STRS, BATCH)},
    {ARG(moonlet_args_batch_put_revoke, put_ids, U64S, OPT | BATCH)},
};

static const moonlet_rpc_arg list_keys_args[] = {
    {ARG(moonlet_args_list_keys, tenant, STR, 0)},
    {ARG(moonlet_args_list_keys, prefix, STR, 0)},
    {ARG(moonlet_args_list_keys, cursor, STR, 0)},
    {ARG(moonlet_args_list_keys, limit, U64, 0), .max = UINT32_MAX},
};

static const moonlet_rpc_arg list_segments_args[] = {
    {ARG(moonlet_args_list_segments, cursor, U64, OPT)},
    {ARG(moonlet_args_list_segments, limit, U64, OPT), .max = UINT32_MAX},
    {ARG(moonlet_args_list_segments, client_id, CSTR, OPT), .max = ID_MAX},
};

static const moonlet_rpc_arg list_tenants_args[] = {
    {ARG(moonlet_args_list_tenants, limit, U64, OPT), .max = MOONLET_LIST_TENANTS_MAX_LIMIT},
};

static const moonlet_rpc_arg probe_resume_args[] = {
    {ARG(moonlet_args_probe_resume, tenant, STR, 0)},
    {ARG(moonlet_args_probe_resume, kv_keys, STRS, BATCH)},
    {ARG(moonlet_args_probe_resume, candidate_size, U64, 0)},
    {ARG(moonlet_args_probe_resume, kda_keys, STRS, BATCH)},
    {ARG(moonlet_args_probe_resume, boundaries, U64S, BATCH)},
};

static const moonlet_rpc_arg put_replace_args[] = {
    TENANT_KEY(moonlet_args_put_replace),
    {ARG(moonlet_args_put_replace, segment_id, STR, 0), .max = ID_MAX},
    {ARG(moonlet_args_put_replace, excluded_segments, STRS, OPT), .max = MOONLET_MAX_EXCLUDED,
     .elem_max = ID_MAX},
};

static const moonlet_rpc_arg repl_stream_args[] = {
    {ARG(moonlet_args_repl_stream, standby, STR, 0), .max = 255},
    {ARG(moonlet_args_repl_stream, from, U64, 0)},
};

static const moonlet_rpc_arg repl_ack_args[] = {
    {ARG(moonlet_args_repl_ack, next, U64, 0)},
};

static const moonlet_rpc_arg repl_snapshot_args[] = {
    {ARG(moonlet_args_repl_snapshot, cursor, U64, OPT)},
    {ARG(moonlet_args_repl_snapshot, max_bytes, U64, OPT), .max = 64u << 20},
};

static const moonlet_rpc_arg repair_fetch_args[] = {
    {ARG(moonlet_args_repair_fetch, client_id, STR, 0), .max = ID_MAX},
    {ARG(moonlet_args_repair_fetch, max_jobs, U64, OPT), .max = 64},
};

static const moonlet_rpc_arg repair_done_args[] = {
    {ARG(moonlet_args_repair_done, client_id, STR, 0), .max = ID_MAX},
    {ARG(moonlet_args_repair_done, job_id, U64, 0)},
    {ARG(moonlet_args_repair_done, error, U64, 0), .max = 100000},
    {ARG(moonlet_args_repair_done, bytes, U64, OPT)},
};

static const moonlet_rpc_arg disk_announce_args[] = {
    {ARG(moonlet_args_disk_announce, client_id, STR, 0), .max = ID_MAX},
    {ARG(moonlet_args_disk_announce, segment_id, STR, 0), .max = ID_MAX},
    {ARG(moonlet_args_disk_announce, tenants, STRS, BATCH), .elem_max = ID_MAX},
    {ARG(moonlet_args_disk_announce, keys, STRS, BATCH)},
    {ARG(moonlet_args_disk_announce, sizes, U64S, BATCH)},
    {ARG(moonlet_args_disk_announce, checksums, U64S, BATCH)},
    {ARG(moonlet_args_disk_announce, offsets, U64S, BATCH)},
};

static const moonlet_rpc_arg disk_trim_args[] = {
    {ARG(moonlet_args_disk_trim, client_id, STR, 0), .max = ID_MAX},
    {ARG(moonlet_args_disk_trim, segment_id, STR, 0), .max = ID_MAX},
    {ARG(moonlet_args_disk_trim, done, U64S, BATCH)},
    {ARG(moonlet_args_disk_trim, max, U64, OPT), .max = 4096},
};

static const moonlet_rpc_arg drain_args[] = {
    {ARG(moonlet_args_drain, target, STR, 0), .max = MOONLET_MAX_ENDPOINT_BYTES},
};

#define SPEC(name, T, arr) static const moonlet_rpc_args_spec name = MOONLET_RPC_SPEC(T, arr, false)
SPEC(s_auth, moonlet_args_key, auth_args);
SPEC(s_ping, moonlet_args_ping, ping_args);
SPEC(s_mount, moonlet_args_mount, mount_args);
SPEC(s_unmount, moonlet_args_unmount, unmount_args);
SPEC(s_bind, moonlet_args_bind, bind_args);
SPEC(s_key, moonlet_args_key, key_args);
SPEC(s_put_start, moonlet_args_put_start, put_start_args);
SPEC(s_put_end, moonlet_args_put_end, put_end_args);
SPEC(s_remove, moonlet_args_remove, remove_args);
SPEC(s_remove_all, moonlet_args_remove_all, remove_all_args);
SPEC(s_batch_exist, moonlet_args_batch_exist, batch_exist_args);
SPEC(s_batch_probe, moonlet_args_batch_probe, batch_probe_args);
SPEC(s_batch_put_start, moonlet_args_batch_put_start, batch_put_start_args);
SPEC(s_batch_put_end, moonlet_args_batch_put_end, batch_put_end_args);
SPEC(s_batch_put_revoke, moonlet_args_batch_put_revoke, batch_put_revoke_args);
SPEC(s_list_keys, moonlet_args_list_keys, list_keys_args);
SPEC(s_list_segments, moonlet_args_list_segments, list_segments_args);
SPEC(s_list_tenants, moonlet_args_list_tenants, list_tenants_args);
SPEC(s_probe_resume, moonlet_args_probe_resume, probe_resume_args);
SPEC(s_put_replace, moonlet_args_put_replace, put_replace_args);
SPEC(s_repl_stream, moonlet_args_repl_stream, repl_stream_args);
SPEC(s_repl_ack, moonlet_args_repl_ack, repl_ack_args);
SPEC(s_repl_snapshot, moonlet_args_repl_snapshot, repl_snapshot_args);
SPEC(s_repair_fetch, moonlet_args_repair_fetch, repair_fetch_args);
SPEC(s_repair_done, moonlet_args_repair_done, repair_done_args);
SPEC(s_drain, moonlet_args_drain, drain_args);
SPEC(s_disk_announce, moonlet_args_disk_announce, disk_announce_args);
SPEC(s_disk_trim, moonlet_args_disk_trim, disk_trim_args);
static const moonlet_rpc_args_spec s_none = {NULL, 0, sizeof(moonlet_args_none), false, false};
static const moonlet_rpc_args_spec s_any = {NULL, 0, sizeof(moonlet_args_none), true, false};

/* Who may call each method (common/cred.h; 0: anyone who authenticated) and
 * whether its arguments name a tenant (then a credential limited to some
 * tenants may name only those).  Remove with force=true needs OPER on top
 * (service.c).  docs/deployment.md's role table is this column. */
#define CLI MOONLET_ROLE_CLIENT
#define NODE MOONLET_ROLE_NODE
#define PEER MOONLET_ROLE_PEER
#define OPER MOONLET_ROLE_OPERATOR
#define READ MOONLET_ROLE_READER

const moonlet_rpc_method_decl moonlet_master_methods[] = {
    {MOONLET_M_AUTH, "AUTH", &s_auth, 0, false},
    {MOONLET_M_ECHO, "Echo", &s_any, 0, false},
    {MOONLET_M_PING, "Ping", &s_ping, NODE, false},
    {MOONLET_M_MOUNT_SEGMENT, "MountSegment", &s_mount, NODE, false},
    {MOONLET_M_UNMOUNT_SEGMENT, "UnmountSegment", &s_unmount, NODE | OPER, false},
    {MOONLET_M_PUT_START, "PutStart", &s_put_start, CLI, true},
    {MOONLET_M_PUT_END, "PutEnd", &s_put_end, CLI, true},
    {MOONLET_M_PUT_REVOKE, "PutRevoke", &s_key, CLI, true},
    {MOONLET_M_GET_REPLICA_LIST, "GetReplicaList", &s_key, CLI, true},
    {MOONLET_M_EXIST_KEY, "ExistKey", &s_key, CLI, true},
    {MOONLET_M_BATCH_EXIST_KEY, "BatchExistKey", &s_batch_exist, CLI, true},
    {MOONLET_M_PROBE_KEY, "ProbeKey", &s_key, CLI, true},
    {MOONLET_M_BATCH_PROBE_KEY, "BatchProbeKey", &s_batch_probe, CLI, true},
    {MOONLET_M_REMOVE, "Remove", &s_remove, CLI | OPER, true},
    {MOONLET_M_REMOVE_ALL, "RemoveAll", &s_remove_all, OPER, true},
    {MOONLET_M_LIST_SEGMENTS, "ListSegments", &s_list_segments, NODE | OPER | READ, false},
    {MOONLET_M_LIST_KEYS, "ListKeys", &s_list_keys, OPER | READ, true},
    {MOONLET_M_INSPECT_KEY, "InspectKey", &s_key, CLI | OPER | READ, true},
    {MOONLET_M_STATS, "Stats", &s_none, OPER | READ, false},
    {MOONLET_M_BIND_CLIENT, "BindClient", &s_bind, NODE, false},
    {MOONLET_M_PROBE_RESUME, "ProbeResume", &s_probe_resume, CLI, true},
    {MOONLET_M_PUT_REPLACE_REPLICA, "PutReplaceReplica", &s_put_replace, CLI, true},
    {MOONLET_M_REPAIR_FETCH, "RepairFetch", &s_repair_fetch, NODE, false},
    {MOONLET_M_REPAIR_DONE, "RepairDone", &s_repair_done, NODE, false},
    {MOONLET_M_DRAIN, "Drain", &s_drain, OPER, false},
    {MOONLET_M_UNDRAIN, "Undrain", &s_drain, OPER, false},
    {MOONLET_M_LIST_TENANTS, "ListTenants", &s_list_tenants, OPER | READ, false},
    {MOONLET_M_HELLO, "Hello", &s_any, 0, false},
    {MOONLET_M_REPL_SNAPSHOT, "ReplSnapshot", &s_repl_snapshot, PEER, false},
    {MOONLET_M_REPL_PORT, "ReplPort", &s_none, PEER, false},
    {MOONLET_M_REPL_STREAM, "ReplStream", &s_repl_stream, PEER, false},
    {MOONLET_M_REPL_ACK, "ReplAck", &s_repl_ack, PEER, false},
    {MOONLET_M_BATCH_PUT_START, "BatchPutStart", &s_batch_put_start, CLI, true},
    {MOONLET_M_BATCH_PUT_END, "BatchPutEnd", &s_batch_put_end, CLI, true},
    {MOONLET_M_BATCH_PUT_REVOKE, "BatchPutRevoke", &s_batch_put_revoke, CLI, true},
    {MOONLET_M_BATCH_GET_REPLICA_LIST, "BatchGetReplicaList", &s_batch_exist, CLI, true},
    {MOONLET_M_DISK_ANNOUNCE, "DiskAnnounce", &s_disk_announce, NODE, false},
    {MOONLET_M_DISK_TRIM, "DiskTrim", &s_disk_trim, NODE, false},
};
const size_t moonlet_master_nmethods = sizeof(moonlet_master_methods) / sizeof(moonlet_master_methods[0]);

_Static_assert(sizeof(moonlet_master_methods) / sizeof(moonlet_master_methods[0]) <
                   MOONLET_M__COUNT,
               "at most one row per method id");

const moonlet_rpc_method_decl *moonlet_master_method(uint32_t id)
{
    /* rows are in id order from 1; ids may have gaps (reserved ids) */
    if (id >= 1 && id <= moonlet_master_nmethods && moonlet_master_methods[id - 1].id == id)
        return &moonlet_master_methods[id - 1];
    for (size_t i = 0; i < moonlet_master_nmethods; i++)
        if (moonlet_master_methods[i].id == id)
            return &moonlet_master_methods[i];
    return NULL;
}
