/*
 * xfer_internal.h - what xfer.c shares with its two backends (xfer_tcp.c,
 * xfer_verbs.c).  Not installed, not part of the public API.
 *
 * xfer.c owns the options, the local-buffer registry and the per-peer
 * connection pool; it validates each operation, groups a batch by peer,
 * leases connections ("lanes") and hands them to the backend's run(), which
 * moves the bytes of all lanes at once and writes each operation's status.
 *
 * Locks (all owned by xfer.c): pool_lock guards the peer list, the busy
 * flags and LRU stamps of its connection slots and the pooled-connection
 * count (a slot's conn pointer is written only by the thread leasing it, or
 * under pool_lock while it is idle, by eviction); buf_lock (a rwlock) guards the buffer list.
 * Neither is held while a backend opens a connection or moves bytes, and
 * they are never held together.
 */
#ifndef MOONLET_XFER_INTERNAL_H
#define MOONLET_XFER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include "net.h"   /* moonlet_net_split_hostport: endpoints */
#include "token.h" /* moonlet_token_equal: AUTH tokens and RDMA digests */
#include "xfer.h"

/* One operation as a backend sees it: the caller's op plus what was parsed
 * out of its segment id and the local registration it falls in. */
typedef struct xfer_item {
    moonlet_xfer_op *op;
    uint64_t seg;          /* segment's 64-bit id */
    uint64_t remote_addr;  /* verbs: remote VA of op->offset */
    uint32_t rkey;         /* verbs: remote key */
    uint32_t lkey;         /* verbs: local key of op->local */
    void *buf;             /* verbs: backend handle of op->local's registration */
    /* Set by run() next to a TRANSFER_FAIL when the op failed only because
     * its connection did (closed or reset by the peer, EOF; verbs: the CM
     * reported a disconnect), never for an error about the request itself:
     * xfer.c may then reissue it once on a fresh connection. */
    bool conn_failed;
} xfer_item;

/* A leased connection and the operations assigned to it, in order. */
typedef struct xfer_lane {
    void *conn;        /* backend connection (never NULL inside run()) */
    xfer_item **items;
    size_t nitems;
    bool broken;       /* set by run(): close this connection afterwards */
    /* When its batch began waiting for this connection (ms, moonlet_xfer_now_ms):
     * run() counts time without progress from here, so waiting for a pooled
     * connection and opening it count against timeout_ms (0: from run's start). */
    uint64_t since_ms;
} xfer_lane;

typedef struct xfer_backend {
    const char *name; /* "tcp" or "rdma" */
    /* Opens the device / binds the listener and starts serving threads. */
    int (*start)(moonlet_xfer *x);
    /* Stops serving and frees every backend resource (segments included). */
    void (*stop)(moonlet_xfer *x);
    int (*seg_add)(moonlet_xfer *x, void *base, uint64_t len, moonlet_xfer_segment_info *info);
    int (*seg_remove)(moonlet_xfer *x, const char *segment_id);
    /* Optional (NULL: not served): a segment of moonlet_xfer_register_reader. */
    int (*seg_add_reader)(moonlet_xfer *x, uint64_t len, moonlet_xfer_reader read, void *arg,
                          moonlet_xfer_segment_info *info);
    /* Optional (NULL: keys are not checked by this backend). */
    int (*seg_set_key)(moonlet_xfer *x, const char *segment_id, const uint8_t *key);
    /* Local buffer registration (verbs: an MR); *handle is passed back. */
    int (*buf_add)(moonlet_xfer *x, void *base, size_t len, void **handle, uint32_t *lkey);
    void (*buf_remove)(moonlet_xfer *x, void *handle);
    /* Optional (NULL: host memory only): registers device memory with the
     * NIC, through the dma-buf fd (>= 0; duplicated) at dmabuf_off, else as
     * peer memory; *how says which, or why neither worked. */
    int (*buf_add_device)(moonlet_xfer *x, void *base, size_t len, int dmabuf_fd,
                          uint64_t dmabuf_off, void **handle, uint32_t *lkey, const char **how);
    /* Parses op->segment_id into *it and checks what can be checked locally;
     * returns the op's status (0 = send it). */
    int (*prepare)(moonlet_xfer *x, xfer_item *it);
    /* Opens (and authenticates) a connection, giving up at deadline_ms. */
    int (*conn_open)(moonlet_xfer *x, const char *endpoint, uint64_t deadline_ms, void **conn);
    void (*conn_close)(moonlet_xfer *x, void *conn);
    /* Optional: MOONLET_OK, or an error once the instance cannot serve any
     * more (verbs: its device was removed or failed). */
    int (*health)(moonlet_xfer *x);
    /* Runs every lane to completion; sets each item's op->status. */
    void (*run)(moonlet_xfer *x, xfer_lane *lanes, size_t nlanes);
    /* Optional: true when an idle pooled connection is known dead (TCP: the
     * server closed it; verbs: its CM channel reported DISCONNECTED); xfer.c
     * then closes it and opens a fresh one instead of failing a transfer. */
    bool (*conn_stale)(moonlet_xfer *x, void *conn);
} xfer_backend;

struct xfer_peer;
struct xfer_buffer;

struct moonlet_xfer {
    const xfer_backend *be;
    void *be_state;
    _Atomic uint64_t epoch; /* moonlet_xfer_note_epoch: the newest leader epoch seen */

    /* options, copied at create */
    char *device;
    char *listen_addr;
    char *source_addr;  /* rdma: bind outgoing connections here; NULL = any */
    int rdma_tos;       /* rdma: TOS of every connection; 0 = default */
    char *token;        /* NULL when no token */
    size_t token_len;
    uint8_t auth_key[32];     /* with a token: its SHA-256, the challenge-response key */
    uint8_t (*auth_keys)[32]; /* serving: more keys a client may prove (opts) */
    size_t nauth_keys;
    int conns_per_peer;
    int server_threads;
    uint32_t timeout_ms;
    unsigned server_max_conns, server_max_conns_per_peer; /* 0: no cap */
    uint32_t server_idle_timeout_ms;                      /* 0: never */
    unsigned max_pooled_conns;                            /* client pool cap, > 0 */
    uint32_t keepalive_ms;                                /* rdma served-QP probe period, > 0 */

    char endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1]; /* serving endpoint, "" if none */

    pthread_rwlock_t buf_lock;
    LIST_HEAD(, xfer_buffer) bufs; /* registered buffers (buf_lock) */

    pthread_mutex_t pool_lock;
    pthread_cond_t pool_cond;
    struct xfer_peer *peers;
    size_t pooled;      /* open connections in all slots (pool_lock) */
    uint64_t pool_tick; /* LRU clock: bumped at every release (pool_lock) */
};

extern const xfer_backend moonlet_xfer_tcp_backend;
extern const xfer_backend moonlet_xfer_verbs_backend;

/* Discovery only (auto): 0 when an InfiniBand-transport RDMA device (named,
 * or any) has an ACTIVE port and, when listen_addr ("host:port") is given and
 * not a wildcard, that address is on such a device; else
 * UNAVAILABLE_IN_CURRENT_STATUS with the reason in why. */
int moonlet_xfer_verbs_probe(const char *device, const char *listen_addr, char *why,
                             size_t why_cap);

/* Test and self-check hook (verbs only): the QP attributes of every open
 * connection of an instance - client connections in its pool and connections
 * it serves - as ibv_query_qp reports them.  Fills up to cap entries and
 * returns how many connections exist (0 for TCP). */
typedef struct moonlet_xfer_qp_info {
    bool served;              /* accepted by this instance (passive side) */
    int state;                /* enum ibv_qp_state */
    uint8_t max_rd_atomic;    /* RDMA READs this QP may have outstanding as initiator */
    uint8_t max_dest_rd_atomic; /* RDMA READs it accepts as responder */
    uint8_t traffic_class;    /* GRH traffic class of its path (RoCE: the IP TOS) */
    char device[64];          /* the QP's device */
    /* client connections only (0 for served ones): work requests posted,
     * ibv_post_send calls (chains) and completions polled since it opened,
     * and the send-queue depth and max_inline_data in use */
    uint64_t wrs, post_calls, cqes;
    uint32_t max_send_wr, max_inline_data;
    /* the QP's PD (and the QP) are on the verbs context its cm_id resolved to */
    bool pd_on_id_device;
} moonlet_xfer_qp_info;
size_t moonlet_xfer_verbs_qp_info(moonlet_xfer *x, moonlet_xfer_qp_info *out, size_t cap);

/* Test hook: walks the client pool and returns how many connections it
 * holds open (to `endpoint` only, unless NULL); *npeers (may be NULL) gets
 * how many peer entries exist.  Takes pool_lock; call it while no transfer
 * runs (a leased slot's conn is not under pool_lock). */
size_t moonlet_xfer_pool_stats(moonlet_xfer *x, const char *endpoint, size_t *npeers);

/* Finds the registration holding [addr, addr + len); 0 and *lkey and the
 * backend's handle, or INVALID_PARAMS.  Takes buf_lock shared. */
int moonlet_xfer_buffer_lookup(moonlet_xfer *x, const void *addr, uint64_t len, uint32_t *lkey,
                               void **handle);

/* Formats a socket address as an endpoint ("1.2.3.4:5", "[::1]:5"). */
int moonlet_xfer_format_endpoint(const void *sockaddr, char *buf, size_t cap);
/* A random, non-zero 64-bit id (getrandom). */
uint64_t moonlet_xfer_random_id(void);

#endif
