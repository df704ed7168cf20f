/*
 * xfer.h - the data-plane transport: moving object bytes between a client and
 * store nodes, never through the master.
 *
 * One interface, two backends chosen at run time:
 *   - "rdma": libibverbs + librdmacm.  One-sided RDMA READ/WRITE on RC queue
 *     pairs connected through rdma_cm; segments and client buffers are memory
 *     regions.
 *   - "tcp":  a thread pool per serving instance answers read/write requests
 *     against registered segments over a compact binary header (xfer_tcp.h);
 *     clients keep several connections per peer and stream payloads straight
 *     into / out of the caller's buffer.
 * MOONLET_XFER_AUTO picks verbs when an InfiniBand-transport RDMA device
 * (InfiniBand or RoCE; not iWARP, not EFA) with an ACTIVE port exists - and,
 * when a listen address is given, when that address is on such a device - and
 * TCP otherwise, and says which in one INFO log line.
 *
 * Addresses and devices (rdma).  RDMA exists only on the addresses of RDMA
 * interfaces (never on 127.0.0.1).  The device is the one the listen address
 * (or else `source_addr`) is on; a named `device` must agree.  Protocol
 * "rdma" with a listen address on no RDMA device fails with
 * UNAVAILABLE_IN_CURRENT_STATUS and one ERROR line naming the address.
 *
 * Roles.  The same instance type serves both sides: a store node creates one
 * with a listen address and registers its segment(s); a client creates one
 * without (or with) a listen address and reads/writes remote segments.
 *
 * Names a peer needs, as returned by moonlet_xfer_register_segment():
 *   endpoint   "host:port" ("[v6addr]:port" for IPv6).  TCP: the serving
 *              socket.  rdma: the rdma_cm listener (an IP on the RDMA device).
 *   segment id TCP:  16 hex digits, a random 64-bit id ("9f3c...").
 *              rdma: "<id 16 hex>.<rkey 8 hex>.<base 16 hex>.<size 16 hex>":
 *              the rkey and remote VA travel inside the id, so a client needs
 *              no extra round trip before its first one-sided operation.
 *   protocol   "tcp" or "rdma".
 * Ids are random per registration, so a stale id held by a client after a
 * store restart names no segment (SEGMENT_NOT_FOUND on TCP; on verbs the NIC
 * rejects the stale rkey and the transfer fails).
 *
 * Errors.  Every call returns 0 or a negative moonlet error code:
 *   MOONLET_ERR_INVALID_PARAMS      bad argument; a range outside the segment
 *                                   (offset + len > size, or overflowing)
 *   MOONLET_ERR_SEGMENT_NOT_FOUND   the peer serves no segment with that id
 *   MOONLET_ERR_ILLEGAL_CLIENT      the peer refused our auth token
 *   MOONLET_ERR_TRANSFER_FAIL       connection refused / lost / timed out, or an
 *                                   error work completion (verbs)
 *   MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS  protocol "rdma" requested but no
 *                                   usable RDMA device ("no RDMA device")
 *   MOONLET_ERR_INVALID_WRITE       a write refused by the node: its capability
 *                                   is missing, forged, out of range or expired
 *   MOONLET_ERR_INTERNAL_ERROR      out of memory, thread or socket creation
 * A peer that disconnects or stalls mid-transfer is reported as
 * TRANSFER_FAIL after at most `timeout_ms` without progress; no call hangs.
 * Operations whose connection was closed or reset by the peer (verbs: a CM
 * disconnect) are first reissued once on a fresh connection, when
 * `timeout_ms` since the call and a write's writer deadline have not passed;
 * errors about the request itself (the codes above but TRANSFER_FAIL, a
 * timeout, a passed deadline, a verbs error completion) never are.
 *
 * Blocking and threads.  Transfers block the calling thread until every
 * operation has completed or failed.  All calls are thread safe; concurrent
 * transfers to the same peer use different connections (up to
 * `conns_per_peer`; more callers wait for a free one, bounded by timeout_ms).
 * At most `max_pooled_conns` connections are cached in all; the least
 * recently used idle ones are closed to make room.
 * Register/unregister may run concurrently with transfers; unregistering a
 * segment waits for the requests being served on it (TCP) to finish.
 */
#ifndef MOONLET_XFER_H
#define MOONLET_XFER_H

#include <stddef.h>
#include <stdint.h>

#include "moonlet/types.h"

typedef struct moonlet_xfer moonlet_xfer;

typedef enum moonlet_xfer_protocol {
    MOONLET_XFER_AUTO = 0, /* verbs when an ACTIVE RDMA device exists, else TCP */
    MOONLET_XFER_TCP = 1,
    MOONLET_XFER_RDMA = 2,
} moonlet_xfer_protocol;

#define MOONLET_XFER_DEFAULT_CONNS_PER_PEER 4
#define MOONLET_XFER_DEFAULT_SERVER_THREADS 4
#define MOONLET_XFER_DEFAULT_TIMEOUT_MS 10000u
#define MOONLET_XFER_DEFAULT_SERVER_MAX_CONNS 4096u
#define MOONLET_XFER_DEFAULT_SERVER_MAX_CONNS_PER_PEER 256u
#define MOONLET_XFER_DEFAULT_MAX_POOLED_CONNS 1024u
#define MOONLET_XFER_DEFAULT_KEEPALIVE_MS 5000u
#define MOONLET_XFER_MAX_TOKEN_BYTES 1024u
/* Largest single operation (1 TiB); longer requests are refused. */
#define MOONLET_XFER_MAX_OP_BYTES (UINT64_C(1) << 40)

typedef struct moonlet_xfer_opts {
    moonlet_xfer_protocol protocol;
    const char *device;       /* RDMA device name (e.g. "mlx5_0"); NULL = first ACTIVE */
    const char *listen_addr;  /* "host:port" to serve segments on; port 0 = ephemeral;
                               * NULL = client only (registering segments then fails) */
    const char *auth_token;   /* shared cluster token; NULL or "" = none.  Never logged.
                               * It never travels either: TCP proves it by
                               * challenge-response (xfer_tcp.h, AUTH). */
    /* Serving side, with auth_token: more keys a client may prove (the
     * SHA-256 of each token: common/cred.h, moonlet_cred_key), e.g. the
     * client and node credentials of a store node's --credentials file.
     * Copied at create.  NULL / 0: only auth_token's. */
    const uint8_t (*auth_keys)[32];
    size_t nauth_keys;
    int conns_per_peer;       /* <= 0: MOONLET_XFER_DEFAULT_CONNS_PER_PEER */
    int server_threads;       /* TCP serving pool; <= 0: MOONLET_XFER_DEFAULT_SERVER_THREADS */
    uint32_t timeout_ms;      /* max wait without progress; 0: MOONLET_XFER_DEFAULT_TIMEOUT_MS */
    const char *source_addr;  /* rdma: local IP outgoing connections bind (picks the NIC
                               * and port, as rping -I); NULL = the route's choice.
                               * Ignored by TCP. */
    int rdma_tos;             /* rdma: IP TOS byte of every connection (RoCE v2 traffic
                               * class, e.g. 106 = DSCP 26 + ECT for a lossless class);
                               * 0: the kernel's default.  Ignored by TCP. */
    /* Serving limits (TCP; see xfer_tcp.h).  0 picks the default. */
    unsigned server_max_conns;          /* MOONLET_XFER_DEFAULT_SERVER_MAX_CONNS */
    unsigned server_max_conns_per_peer; /* MOONLET_XFER_DEFAULT_SERVER_MAX_CONNS_PER_PEER */
    uint32_t server_idle_timeout_ms;    /* 0: idle connections are kept */
    /* Client side: connections cached across all peers (TCP sockets / verbs
     * QPs); 0: MOONLET_XFER_DEFAULT_MAX_POOLED_CONNS.  Opening one more
     * closes the least recently used idle ones; connections leased by
     * running transfers are never closed, so the count exceeds the cap only
     * while more than that many are in use at once. */
    unsigned max_pooled_conns;
    /* rdma serving side: every served connection is probed (a zero-length
     * RDMA WRITE) every keepalive_ms, and one whose probe fails, or whose
     * probes go unacknowledged for 4 consecutive keepalive_ms / 4 intervals
     * (another probe each; transport/keepalive.c), is torn down - a client
     * that vanished without a disconnect (power loss, cable) is reaped within
     * about 2 x keepalive_ms.  0: MOONLET_XFER_DEFAULT_KEEPALIVE_MS.  Ignored by TCP. */
    uint32_t keepalive_ms;
} moonlet_xfer_opts;

/* Parses "rdma", "tcp" or "auto"; returns 0 or MOONLET_ERR_INVALID_PARAMS. */
int moonlet_xfer_parse_protocol(const char *name, moonlet_xfer_protocol *out);

/*
 * Creates an instance.  With a listen address it binds and starts serving
 * (TCP: acceptor + worker pool; rdma: rdma_cm listener thread) before
 * returning.  Returns 0, INVALID_PARAMS (bad options or address),
 * UNAVAILABLE_IN_CURRENT_STATUS (rdma requested, no device), TRANSFER_FAIL
 * (bind/listen failed) or INTERNAL_ERROR.
 */
int moonlet_xfer_create(const moonlet_xfer_opts *opts, moonlet_xfer **out);

/* Stops serving, closes every connection, deregisters everything, frees.
 * Transfers still running on other threads must have returned.  NULL is a no-op. */
void moonlet_xfer_destroy(moonlet_xfer *x);

/* 0 while the instance can serve and transfer; UNAVAILABLE_IN_CURRENT_STATUS
 * once it cannot any more (rdma: its device was removed - RDMA_CM_EVENT_
 * DEVICE_REMOVAL - or reported a fatal error).  Such an instance must be
 * destroyed; a store node exits so that its service manager restarts it. */
int moonlet_xfer_health(moonlet_xfer *x);

/* "tcp" or "rdma": the backend this instance runs. */
const char *moonlet_xfer_protocol_name(const moonlet_xfer *x);

/* The serving endpoint ("host:port", with the real port when 0 was asked);
 * MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS when the instance does not serve,
 * BUFFER_OVERFLOW when `cap` is too small. */
int moonlet_xfer_local_endpoint(const moonlet_xfer *x, char *buf, size_t cap);

/* What a peer needs to reach a registered segment. */
typedef struct moonlet_xfer_segment_info {
    char segment_id[MOONLET_MAX_ID_BYTES + 1];
    char endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1];
    char protocol[8];  /* "tcp" or "rdma" */
    uint64_t base;     /* the registered base address (remote VA for verbs) */
    uint64_t size;
} moonlet_xfer_segment_info;

/*
 * Registers [base, base + len) as a segment peers may read and write.  The
 * memory must stay mapped until moonlet_xfer_unregister_segment() returns.
 * Needs a serving instance.  Returns 0 and fills *info, or INVALID_PARAMS,
 * UNAVAILABLE_IN_CURRENT_STATUS (not serving), TRANSFER_FAIL (ibv_reg_mr).
 */
int moonlet_xfer_register_segment(moonlet_xfer *x, void *base, uint64_t len,
                                  moonlet_xfer_segment_info *info);

/*
 * A segment whose reads are answered by a function instead of memory (a
 * store node's disk tier): a READ of [offset, +len) (inside [0, len of the
 * segment)) calls read(arg, offset, len, &buf) on a serving thread, which
 * returns 0 and a malloc'd buffer of len bytes (the transport sends it and
 * frees it), or an error code, which the reader gets as the READ's status.
 * Writes to it are refused (INVALID_WRITE).  Unregister as any segment.
 * TCP only: UNAVAILABLE_IN_CURRENT_STATUS from the verbs backend (a node
 * serving RDMA serves its disk through a TCP instance).
 */
typedef int (*moonlet_xfer_reader)(void *arg, uint64_t offset, uint64_t len, void **buf);
int moonlet_xfer_register_reader(moonlet_xfer *x, uint64_t len, moonlet_xfer_reader read,
                                 void *arg, moonlet_xfer_segment_info *info);

/*
 * Gives a registered segment a write key (MOONLET_WRITECAP_KEY_BYTES bytes):
 * from then on every TCP write to it must carry a valid capability
 * (moonlet_xfer_cap).  SEGMENT_NOT_FOUND for an unknown id.  The verbs
 * backend accepts and ignores it: the node's CPU sees no RDMA write, and the
 * master's quarantine of freed ranges fences stale RDMA writers instead.
 */
int moonlet_xfer_set_segment_key(moonlet_xfer *x, const char *segment_id, const uint8_t *key);

/*
 * The newest leader epoch this node has seen (issue 31 section 3; the
 * store node tells it what its Mount and Ping replies carried): raises it,
 * never lowers it.  A TCP write whose genuine capability carries an older
 * epoch (common/writecap.h) is refused with INVALID_WRITE; a genuine one of
 * a newer epoch raises it.  0 (no HA) refuses nothing.
 */
void moonlet_xfer_note_epoch(moonlet_xfer *x, uint64_t epoch);
uint64_t moonlet_xfer_epoch(const moonlet_xfer *x);

/* Milliseconds on CLOCK_MONOTONIC: the clock of capability expiries and deadlines. */
uint64_t moonlet_xfer_now_ms(void);

/* Stops serving a segment.  Waits for requests in progress on it, so the
 * memory may be freed afterwards.  SEGMENT_NOT_FOUND for an unknown id. */
int moonlet_xfer_unregister_segment(moonlet_xfer *x, const char *segment_id);

/*
 * Registers a local client buffer used as the source or destination of
 * transfers.  Verbs requires it (a memory region); TCP keeps bookkeeping only
 * and also accepts unregistered buffers.  Overlapping registrations are
 * allowed.  unregister takes the same base address; INVALID_PARAMS when it
 * names no registration.
 */
int moonlet_xfer_register_buffer(moonlet_xfer *x, void *base, size_t len);
int moonlet_xfer_unregister_buffer(moonlet_xfer *x, void *base);
/* Registers device (GPU) memory so transfers move it in place (GPUDirect
 * RDMA): through the dma-buf dmabuf_fd (>= 0, not kept: duplicated) at
 * offset dmabuf_off, else (dmabuf_fd < 0, or the NIC refused it) as peer
 * memory (ibv_reg_mr on the device address: nvidia-peermem).  0 and *how
 * ("dma-buf", "peer memory"); UNAVAILABLE_IN_CURRENT_STATUS on a transport
 * without it (TCP) or TRANSFER_FAIL, with *how saying why.  Released by
 * moonlet_xfer_unregister_buffer. */
int moonlet_xfer_register_device(moonlet_xfer *x, void *base, size_t len, int dmabuf_fd,
                                 uint64_t dmabuf_off, const char **how);

/* Opens the connections to a peer endpoint now (they are otherwise opened on
 * first use) and caches them.  TRANSFER_FAIL when the peer cannot be reached,
 * ILLEGAL_CLIENT when it refuses our token. */
int moonlet_xfer_connect(moonlet_xfer *x, const char *endpoint);

typedef enum moonlet_xfer_opcode {
    MOONLET_XFER_READ = 0,  /* remote segment -> local buffer */
    MOONLET_XFER_WRITE = 1, /* local buffer -> remote segment */
} moonlet_xfer_opcode;

/*
 * A write capability (common/writecap.h) and the writer's own deadline.
 * TCP: sent with the write; a serving segment with a key
 * (moonlet_xfer_set_segment_key) refuses a write whose capability is
 * missing, forged, does not cover the written range or has expired, with
 * MOONLET_ERR_INVALID_WRITE, and stops receiving a write's bytes into the
 * segment once its capability expires.  Both backends: an operation whose
 * `deadline_ms` (the caller's CLOCK_MONOTONIC, moonlet_xfer_now_ms) has
 * passed is not started and fails with TRANSFER_FAIL; TCP also aborts a
 * connection whose operation passes its deadline with a reset (queued bytes
 * are dropped).  0 = no deadline.
 */
typedef struct moonlet_xfer_cap {
    uint64_t offset, len;  /* the range the capability covers */
    uint64_t expiry_ms;    /* the store node's clock */
    uint64_t tag;          /* 0: no capability (only the deadline applies) */
    uint64_t deadline_ms;  /* the writer's clock; 0: none */
} moonlet_xfer_cap;

/* One operation of a batch.  `status` is written by moonlet_xfer_submit(). */
typedef struct moonlet_xfer_op {
    moonlet_xfer_opcode opcode;
    const char *endpoint;    /* peer endpoint, as in segment info */
    const char *segment_id;  /* remote segment id */
    uint64_t offset;         /* byte offset inside the remote segment */
    void *local;             /* local buffer (destination of reads, source of writes) */
    uint64_t len;            /* bytes; 0 completes at once */
    int status;              /* out: 0 or a moonlet error code for this operation */
    const moonlet_xfer_cap *cap; /* writes: the capability, or NULL (none) */
} moonlet_xfer_op;

/*
 * Runs `n` operations together: operations to the same peer are spread over
 * its connections and pipelined; operations to different peers proceed at the
 * same time.  Returns when every operation has a status: 0 when all succeeded,
 * else the status of the first failed operation (in array order).  Operations
 * whose ranges overlap run in no defined order.
 */
int moonlet_xfer_submit(moonlet_xfer *x, moonlet_xfer_op *ops, size_t n);

/* One read / one write: a batch of one. */
int moonlet_xfer_read(moonlet_xfer *x, const char *endpoint, const char *segment_id,
                      uint64_t offset, void *dst, uint64_t len);
int moonlet_xfer_write(moonlet_xfer *x, const char *endpoint, const char *segment_id,
                       uint64_t offset, const void *src, uint64_t len);

#endif
