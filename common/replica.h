/*
 * replica.h - the replica and segment descriptors the master RPC carries
 * (PutStart / GetReplicaList answers, MountSegment requests), shared by the
 * master, the MasterClient, the client and the store node.  Internal: no
 * public call takes or returns them, so they are not installed.
 */
#ifndef MOONLET_REPLICA_H
#define MOONLET_REPLICA_H

#include <stdbool.h>
#include <stdint.h>

#include "moonlet/types.h"

typedef enum {
    MOONLET_REPLICA_INITIALIZED = 1, /* allocated by PutStart, being written */
    MOONLET_REPLICA_COMPLETE = 2,    /* written and sealed by PutEnd */
} moonlet_replica_status;

/* On the wire, a replica's status byte with this bit: the replica is on a
 * store node's disk tier (moonlet_replica_desc.disk). */
#define MOONLET_REPLICA_ON_DISK 0x10u

/* Where one replica of an object lives. Strings are owned by the containing list. */
typedef struct moonlet_replica_desc {
    char *segment_id;  /* the store node's segment id */
    char *endpoint;    /* transport endpoint of the store node, e.g. "127.0.0.1:7000" */
    char *protocol;    /* "tcp" or "rdma" */
    uint64_t base;     /* segment base address as registered (verbs: remote VA) */
    uint64_t offset;   /* offset of the replica inside the segment */
    uint64_t size;     /* object size in bytes */
    uint8_t status;    /* moonlet_replica_status */
    /* On the node's disk tier: [offset, +size) names the object's extent
     * there, read whole (one read of exactly offset and size) from the
     * node, which verifies it before it answers; never written to. */
    bool disk;
    /* PutStart only: the write capability for this replica (cap_tag 0: none;
     * common/writecap.h) covering [offset, offset + cap_len) until cap_expiry_ms
     * on the store node's clock. */
    uint64_t cap_len, cap_expiry_ms, cap_tag;
    /* A node serving both protocols (moonlet-store --protocol both): the same
     * bytes under a second endpoint, e.g. the TCP one of an RDMA node.  NULL
     * when the segment has only one.  The capability above is valid for
     * writes through either endpoint. */
    char *alt_segment_id;
    char *alt_endpoint;
    char *alt_protocol;
} moonlet_replica_desc;

typedef struct moonlet_replica_list {
    uint64_t size;          /* object size */
    uint64_t lease_ttl_ms;  /* lease granted by this call (0 when none) */
    uint64_t put_ttl_ms;    /* PutStart: ms left until the put's deadline (0: not sent) */
    bool has_checksum;      /* GetReplicaList: the writer recorded a checksum */
    uint64_t checksum;      /* XXH3-64 of the object's bytes */
    uint32_t count;
    moonlet_replica_desc *replicas;
} moonlet_replica_list;

void moonlet_replica_list_free(moonlet_replica_list *l);

/* A segment as mounted on the master by a store node. */
typedef struct moonlet_segment_desc {
    const char *client_id;   /* owner (the store node's client id) */
    const char *segment_id;  /* unique id of this segment */
    const char *name;        /* human-readable name */
    uint64_t base;           /* base address (verbs VA; informational for TCP) */
    uint64_t size;           /* capacity in bytes */
    const char *endpoint;    /* how peers reach it, e.g. "127.0.0.1:7000" */
    const char *protocol;    /* "tcp" or "rdma" */
    /* Optional write fencing (docs/reliability.md): the node's 16-byte write
     * key for this segment, and its CLOCK_MONOTONIC in ms when it sent the
     * mount.  NULL / 0: none (the node does not check write capabilities). */
    const uint8_t *write_key;
    uint64_t node_clock_ms;
    /* Optional second endpoint of the same memory (a node serving TCP and
     * RDMA at once): its endpoint, segment id and protocol, all three or
     * none (NULL).  Needs write_key. */
    const char *alt_endpoint;
    const char *alt_segment_id;
    const char *alt_protocol;
    /* A disk segment: one path of the node's disk tier (moonlet-store
     * --disk), `size` whole 4 KiB blocks.  Objects come there only by
     * demotion from DRAM and by the node's announce of what its disk holds;
     * reads are served by the node (whole objects, verified), never
     * written through the transport. */
    bool disk;
} moonlet_segment_desc;

#endif
