/*
 * store_node.h - a store node: one segment of memory contributed to the
 * cluster, served for one-sided reads and writes, kept mounted on the master.
 *
 * create() starts the transport serving on the listen address (xfer; first,
 * so a missing device or a taken port fails fast), allocates the segment
 * (segment_mem: on the NIC's NUMA node unless told otherwise, huge pages when
 * the kernel has them, locked), registers it with the transport and mounts it
 * on the master under the node's client id.  What the master
 * records is exactly what the transport returned: segment id, endpoint,
 * protocol, base and size - except that an advertised address, when one is
 * configured (TCP only), replaces the endpoint: peers then reach the node
 * through whatever listens there (a proxy, a NAT rule, a test's delaying
 * relay) while the node itself serves on its listen address.
 *
 * run() heartbeats until stop(): a Ping every ping_interval_ms.  While the
 * master does not answer, it retries with exponential backoff capped at 2 s
 * (moonlet_store_node_backoff_ms).  When the master answers that it holds no
 * segment for this client (it restarted, or declared the node dead and
 * unmounted it), the segment's old contents are no longer vouched for by
 * anyone: the node unregisters it, registers it again - a fresh segment id,
 * so a client still holding the old id is refused instead of served - and
 * mounts it again.  After stop(), run() unmounts the segment and returns.
 *
 * A node's client id must be unique in the cluster.  On create, segments the
 * master still lists under that id (left by an earlier run that was killed)
 * are unmounted first, so a node restarted with a fixed --client-id takes
 * over cleanly instead of keeping a dead segment alive with its pings.
 *
 * Thread safety: stop() and the getters may be called from any thread between
 * create() and destroy(); run() from one thread; destroy() once run() has
 * returned (or was never called).  Locks: the node's mutex, guarding the
 * mount state, the current segment id and the stop flag; it is never held
 * across an RPC or a transport call.
 */
#ifndef MOONLET_STORE_NODE_H
#define MOONLET_STORE_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node_timing.h"
#include "xfer.h"

typedef struct moonlet_store_node moonlet_store_node;

#define MOONLET_STORE_NODE_MIN_SEGMENT (1u << 20)      /* smallest segment accepted */
#define MOONLET_STORE_NODE_PING_MS 1000u                /* default heartbeat period */
#define MOONLET_STORE_NODE_RPC_TIMEOUT_MS 400u          /* default per master call */
#define MOONLET_STORE_NODE_BACKOFF_FIRST_MS 100u        /* first retry after a failure */
#define MOONLET_STORE_NODE_BACKOFF_CAP_MS MOONLET_NODE_BACKOFF_CAP_MS /* longest wait between retries */

typedef struct moonlet_store_node_config {
    const char *master_addr;        /* "HOST:PORT" of the master (required) */
    uint64_t segment_size;          /* bytes, >= MOONLET_STORE_NODE_MIN_SEGMENT */
    moonlet_xfer_protocol protocol; /* auto, tcp or rdma */
    const char *listen_addr;        /* data endpoint to serve on; NULL: "127.0.0.1:0" */
    /* Set: serve TCP here as well (protocol must be rdma): the same memory is
     * registered with both transports and mounted as ONE segment with two
     * endpoints ("--protocol both"); a port of 0 picks a free one. */
    const char *tcp_listen_addr;
    const char *device;             /* RDMA device; NULL: first ACTIVE one */
    int rdma_tos;                   /* rdma: IP TOS of its connections; 0: default */
    uint32_t rdma_keepalive_ms;     /* rdma: served-QP probe period (a vanished client's QP
                                     * is reaped within ~2x it); 0: transport default */
    int numa_node;                  /* MOONLET_SEGMENT_MEM_NODE_AUTO: follow the NIC */
    const char *client_id;          /* NULL: "store-<hostname>-<random>" */
    const char *auth_token;         /* for the master and the transport; NULL: none */
    /* With auth_token: more keys the data port accepts from clients and
     * other nodes (the SHA-256 of their tokens, common/cred.h; moonlet-store
     * --credentials).  NULL / 0: only auth_token's.  Copied at create. */
    const uint8_t (*data_keys)[32];
    size_t ndata_keys;
    uint32_t ping_interval_ms;      /* 0: MOONLET_STORE_NODE_PING_MS */
    uint32_t rpc_timeout_ms;        /* 0: MOONLET_STORE_NODE_RPC_TIMEOUT_MS; keeps stop prompt */
    uint32_t transfer_timeout_ms;   /* serving: longest wait on a stalled peer; 0: transport default */
    const char *advertise_addr;     /* "HOST:PORT" mounted as the endpoint; NULL: the listen one */
    int server_threads;             /* transport serving pool; <= 0: transport default */
    unsigned max_connections;       /* data connections served; 0: transport default */
    unsigned max_connections_per_peer; /* from one address; 0: transport default */
    uint32_t idle_timeout_ms;       /* close data connections idle this long; 0: never */
    bool huge_pages;                /* try 2 MiB pages first */
    bool lock_memory;               /* mlock the segment (a failure is a warning) */
    /* The node binds its client id on the master with a random per-run
     * secret (BindClient); while another live node holds the id (or this
     * node's previous run, until the master expires it), create waits up to
     * this long, then fails with ILLEGAL_CLIENT.  Default 15000. */
    uint32_t client_id_wait_ms;
    /* Re-replication: how often run() asks the master for repair jobs
     * targeting this node while there are none; 0: the default,
     * UINT32_MAX: never (this node takes no repair job). */
    uint32_t repair_poll_ms;
    /* A client TLS context for the master connection (transport/tls.h; the
     * node takes a reference); NULL: plaintext. */
    struct moonlet_tls_ctx *tls;
    /* A disk tier behind the segment (node_disk.h): files or block devices
     * (moonlet-store --disk), disk_size bytes shared by them (--disk-size),
     * I/Os in flight (0: the tier's default).  ndisk_paths 0: none. */
    const char *const *disk_paths;
    uint32_t ndisk_paths;
    uint64_t disk_size;
    unsigned disk_queue_depth;
} moonlet_store_node_config;

#define MOONLET_STORE_NODE_REPAIR_POLL_MS 200u

/* Fills the defaults: protocol auto, listen 127.0.0.1:0, NUMA auto, huge
 * pages and locking on, default intervals; master_addr and segment_size
 * stay unset. */
void moonlet_store_node_config_default(moonlet_store_node_config *cfg);

#define MOONLET_STORE_NODE_ID_WAIT_MS 15000u

/* True for "127.x.x.x:PORT", "localhost:PORT" and "[::1]:PORT". */
bool moonlet_store_node_addr_is_loopback(const char *hostport);

/*
 * Allocates, serves, registers and mounts.  Blocks for the allocation (a
 * locked segment is populated) and a few master round trips.  Returns 0, or
 * INVALID_PARAMS (bad configuration; an advertised address with rdma), RPC_FAIL / RPC_TIMEOUT (master
 * unreachable), ILLEGAL_CLIENT (token refused, or the client id is held by
 * another live node past client_id_wait_ms), UNAVAILABLE_IN_CURRENT_STATUS
 * (rdma without a device), TRANSFER_FAIL (cannot listen), INTERNAL_ERROR, or
 * the master's refusal of the mount.  The reason is logged.
 */
int moonlet_store_node_create(const moonlet_store_node_config *cfg, moonlet_store_node **out);

/* Heartbeats (and re-mounts when needed) until stop(); then unmounts and
 * returns 0.  When the data endpoint can no longer serve (moonlet_xfer_health:
 * the RDMA device was removed or failed) it unmounts and returns
 * UNAVAILABLE_IN_CURRENT_STATUS at the next heartbeat instead.  Blocks.  An unmount the master does not answer is logged; the
 * master then drops the segment when the node's liveness TTL runs out. */
int moonlet_store_node_run(moonlet_store_node *n);

/* Makes run() return promptly (within one master call).  Thread safe;
 * not async-signal-safe: call it from a thread that waited for the signal. */
void moonlet_store_node_stop(moonlet_store_node *n);

/* Unmounts if still mounted, stops serving, frees the segment.  NULL is a no-op. */
void moonlet_store_node_destroy(moonlet_store_node *n);

/* The data endpoint mounted on the master, the one peers use ("127.0.0.1:40123";
 * the advertised address when one is configured); fixed for the node's lifetime. */
const char *moonlet_store_node_endpoint(const moonlet_store_node *n);
/* The address the node serves on (equal to the endpoint unless advertising). */
const char *moonlet_store_node_listen_endpoint(const moonlet_store_node *n);
const char *moonlet_store_node_client_id(const moonlet_store_node *n);
/* "tcp" or "rdma". */
const char *moonlet_store_node_protocol(const moonlet_store_node *n);

/* The TCP endpoint of a node serving both protocols ("" otherwise). */
const char *moonlet_store_node_tcp_endpoint(const moonlet_store_node *n);

/* Copies the segment id currently registered (it changes on re-mount).
 * Returns 0 or BUFFER_OVERFLOW. */
int moonlet_store_node_segment_id(moonlet_store_node *n, char *buf, size_t cap);

/* The segment's memory (tests: corrupt a replica in place). */
void *moonlet_store_node_segment_base(moonlet_store_node *n);

/* The newest leader epoch the node has seen (its Mount and Ping replies, or
 * a genuine write capability): capabilities of older epochs are refused
 * (common/writecap.h).  0 without HA. */
uint64_t moonlet_store_node_epoch(moonlet_store_node *n);

/* Times the segment was mounted (1 after create; +1 per re-mount). */
uint64_t moonlet_store_node_mounts(moonlet_store_node *n);
/* Repair jobs this node finished (copied and reported), failed, and bytes copied. */
void moonlet_store_node_repairs(moonlet_store_node *n, uint64_t *done, uint64_t *failed,
                                uint64_t *bytes);

/* The disk tier's counters (zeros without one). */
struct moonlet_node_disk_stats;
void moonlet_store_node_disk_stats(moonlet_store_node *n, struct moonlet_node_disk_stats *out);

/* Wait before retry number `failures` (1 = the first retry): 100 ms doubling
 * per failure, capped at 2 s.  Pure. */
uint32_t moonlet_store_node_backoff_ms(unsigned failures);

#endif
