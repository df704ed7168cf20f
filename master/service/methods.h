/*
 * methods.h - the master's control RPC, declared once: method ids, and per
 * method the struct its arguments decode into.  master/service/methods.c holds the
 * table (moonlet_master_methods) that gives each argument its name, kind,
 * bounds and field; the master (master/service/service.c) decodes requests from it
 * before a handler runs, and the MasterClient (store/master_client.c) packs
 * requests from it.  docs/protocol.md's method table is checked against it
 * by tests/master/test_methods.c.
 *
 * The ids are part of the wire protocol: never renumber, only append.
 * Arguments are positional; trailing optional ones may be omitted by older
 * peers (see rpc_args.h for the count rule).  `tenant` is a string ("" means
 * "default").  Results are described in docs/protocol.md.
 */
#ifndef MOONLET_METHODS_H
#define MOONLET_METHODS_H

#include <stdbool.h>
#include <stdint.h>

#include "frame.h"
#include "node_disk_fields.h"
#include "rpc_args.h"

enum moonlet_method {
    MOONLET_M_AUTH = MOONLET_RPC_AUTH, /* [token]: served by the RPC server itself */
    MOONLET_M_ECHO = 2,
    MOONLET_M_PING = 3,
    MOONLET_M_MOUNT_SEGMENT = 4,
    MOONLET_M_UNMOUNT_SEGMENT = 5,
    MOONLET_M_PUT_START = 6,
    MOONLET_M_PUT_END = 7,
    MOONLET_M_PUT_REVOKE = 8,
    MOONLET_M_GET_REPLICA_LIST = 9,
    MOONLET_M_EXIST_KEY = 10,
    MOONLET_M_BATCH_EXIST_KEY = 11,
    MOONLET_M_PROBE_KEY = 12,
    MOONLET_M_BATCH_PROBE_KEY = 13,
    MOONLET_M_REMOVE = 14,
    MOONLET_M_REMOVE_ALL = 15,
    MOONLET_M_LIST_SEGMENTS = 16,
    MOONLET_M_LIST_KEYS = 17,
    MOONLET_M_INSPECT_KEY = 18,
    MOONLET_M_STATS = 19,
    MOONLET_M_BIND_CLIENT = 20,
    MOONLET_M_PROBE_RESUME = 21,
    MOONLET_M_PUT_REPLACE_REPLICA = 22,
    MOONLET_M_REPAIR_FETCH = 23,
    MOONLET_M_REPAIR_DONE = 24,
    MOONLET_M_DRAIN = 25,
    MOONLET_M_UNDRAIN = 26,
    MOONLET_M_LIST_TENANTS = 27, /* tenants holding keys, with counts and bytes */
    MOONLET_M_HELLO = 28, /* HA role and epoch; opts the connection into epoch-tagged replies */
    /* 29 was ReplFetch, the long poll the stream replaced */
    MOONLET_M_REPL_SNAPSHOT = 30, /* a standby's starting point */
    MOONLET_M_REPL_PORT = 31,     /* where the leader serves ReplSnapshot / ReplStream */
    MOONLET_M_REPL_STREAM = 32,   /* a standby turns its connection into the record stream */
    MOONLET_M_REPL_ACK = 33,      /* on the stream only: the standby's position */
    /* The per-key calls of a batch in one request each, per-key results. */
    MOONLET_M_BATCH_PUT_START = 34,
    MOONLET_M_BATCH_PUT_END = 35,
    MOONLET_M_BATCH_PUT_REVOKE = 36,
    MOONLET_M_BATCH_GET_REPLICA_LIST = 37,
    MOONLET_M_DISK_ANNOUNCE = 38, /* a restarted node's disk tier: what it holds */
    MOONLET_M_DISK_TRIM = 39,     /* extents a node invalidated; those it must next */
    MOONLET_M__COUNT
};

/* ---- decoded arguments, one struct per argument list ------------------------- */

typedef struct { MOONLET_RPC_ARGS_HEAD; } moonlet_args_none; /* Echo (any), Stats */

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str client_id;
    uint64_t node_clock_ms; /* optional: the node's CLOCK_MONOTONIC ms when it sent this */
    moonlet_u64v disk;      /* optional: its disk tier's figures, MOONLET_NODE_DISK_* order */
} moonlet_args_ping;


typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    const char *client_id, *segment_id, *name;
    uint64_t base, size;
    const char *endpoint, *protocol;
    moonlet_str write_key;  /* optional bin 16, with node_clock_ms */
    uint64_t node_clock_ms;
    const char *alt_endpoint, *alt_segment_id, *alt_protocol; /* optional, all three (or nil) */
    bool disk;              /* optional: a disk segment (the node's disk tier) */
} moonlet_args_mount;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str client_id, segment_id;
} moonlet_args_unmount;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str client_id, secret;
} moonlet_args_bind;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant, key;
} moonlet_args_key;

/* The leading part every tenant_scoped method's struct shares (methods.c). */
typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant;
} moonlet_args_tenant; /* PutRevoke, GetReplicaList, ExistKey, ProbeKey, InspectKey */

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant, key;
    uint64_t size, replica_num;
    bool soft_pin;
    moonlet_strv preferred_segments; /* optional */
    bool hard_pin;                   /* optional */
    uint64_t soft_pin_ttl_ms;        /* optional; 0: the master's default */
} moonlet_args_put_start;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant, key;
    uint64_t checksum; /* optional: XXH3-64 of the bytes (nargs > 2: present) */
} moonlet_args_put_end;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant, key;
    bool force; /* optional */
} moonlet_args_remove;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant;
    bool force; /* optional */
} moonlet_args_remove_all;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant;
    moonlet_strv keys;
} moonlet_args_batch_exist;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant;
    uint64_t lease_mode, candidate_size;
    moonlet_strv keys;
} moonlet_args_batch_probe;

/* BatchPutStart: PutStart of every key, with one set of options. */
typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant;
    moonlet_strv keys;
    moonlet_u64v sizes; /* one per key */
    uint64_t replica_num;
    bool soft_pin;
    moonlet_strv preferred_segments; /* optional */
    bool hard_pin;                   /* optional */
    uint64_t soft_pin_ttl_ms;        /* optional; 0: the master's default */
} moonlet_args_batch_put_start;

/* BatchPutEnd: PutEnd of every key; checksums (optional): one per key;
 * put_ids (optional): one per key, the put BatchPutStart named (0: the
 * key's put in progress, whichever it is). */
typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant;
    moonlet_strv keys;
    moonlet_u64v checksums;
    moonlet_u64v put_ids;
} moonlet_args_batch_put_end;

/* BatchPutRevoke: PutRevoke of every key; put_ids as BatchPutEnd's. */
typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant;
    moonlet_strv keys;
    moonlet_u64v put_ids;
} moonlet_args_batch_put_revoke;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant, prefix, cursor;
    uint64_t limit;
} moonlet_args_list_keys;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    uint64_t cursor;       /* optional: with any argument the reply is one page */
    uint64_t limit;        /* optional; 0: the default page */
    const char *client_id; /* optional; NULL or "": every client's segments */
} moonlet_args_list_segments;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    uint64_t limit; /* optional; 0: MOONLET_LIST_TENANTS_DEFAULT_LIMIT */
} moonlet_args_list_tenants;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant;
    moonlet_strv kv_keys;
    uint64_t candidate_size;
    moonlet_strv kda_keys;
    moonlet_u64v boundaries;
} moonlet_args_probe_resume;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str tenant, key;
    moonlet_str segment_id;      /* the replica whose write failed */
    moonlet_strv excluded_segments; /* optional: segments already seen failing for this put */
} moonlet_args_put_replace;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str standby;  /* the standby's advertised HOST:PORT */
    uint64_t from;        /* it applied every record below; wants the records from here */
} moonlet_args_repl_stream;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    uint64_t next;        /* the standby applied every record below */
} moonlet_args_repl_ack;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    uint64_t cursor;      /* optional; 0: the first part */
    uint64_t max_bytes;   /* optional; 0: the whole snapshot in one part */
} moonlet_args_repl_snapshot;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str client_id;
    uint64_t max_jobs; /* optional; 0: 16 */
} moonlet_args_repair_fetch;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str client_id;
    uint64_t job_id;
    uint64_t error; /* 0: done; else the failure's moonlet error code, negated (positive) */
    uint64_t bytes; /* optional: bytes written */
} moonlet_args_repair_done;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str client_id, segment_id;
    moonlet_strv tenants, keys;         /* one entry per object, in parallel */
    moonlet_u64v sizes, checksums, offsets;
} moonlet_args_disk_announce;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str client_id, segment_id;
    moonlet_u64v done;  /* offsets invalidated since the last call */
    uint64_t max;       /* optional: extents to hand out (0: 256) */
} moonlet_args_disk_trim;

typedef struct {
    MOONLET_RPC_ARGS_HEAD;
    moonlet_str target; /* segment id, segment name (client id) or endpoint */
} moonlet_args_drain;

/* The table, in id order (AUTH included, with its one argument). */
extern const moonlet_rpc_method_decl moonlet_master_methods[];
extern const size_t moonlet_master_nmethods;

/* The declaration of method `id`, or NULL. */
const moonlet_rpc_method_decl *moonlet_master_method(uint32_t id);

#endif
