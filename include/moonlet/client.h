/*
 * moonlet/client.h - the public C client of a moonlet cluster.
 *
 * A moonlet_client talks to the master for metadata (where an object's
 * replicas live, leases, existence) and moves object bytes directly to and
 * from store nodes through the data-plane transport (RDMA verbs, or TCP
 * where no RDMA device exists).  Bytes never pass through the master.
 *
 * Conventions, the same for every call:
 *  - Objects follow create / use / destroy: moonlet_client_create() ...
 *    moonlet_client_destroy().
 *  - Every call returns MOONLET_OK (0) or a negative moonlet error code
 *    (moonlet/error.h; Mooncake Store's numbers); moonlet_strerror() names it.
 *    Besides the errors listed per call, any call that talks to the master
 *    may return RPC_FAIL or RPC_TIMEOUT (master unreachable or too slow;
 *    a later call reconnects, attempts spaced 50 ms doubling to 1 s apart
 *    while the master stays away, so a caller that retries in a loop does
 *    not hammer it) and INVALID_PARAMS for a NULL client or key.
 *  - Keys are NUL-terminated strings of 1..MOONLET_MAX_KEY_BYTES bytes
 *    (INVALID_KEY otherwise).  Objects belong to a tenant: the `tenant`
 *    argument (or put option) names it; NULL means the client's default
 *    tenant (moonlet_client_config.default_tenant, itself "default" when
 *    unset).  Tenants are separate name spaces.
 *  - Argument order: the client; the key (or keys, then their count); the
 *    inputs (data, buffers to read into and their capacities, a policy);
 *    the tenant (or put options); then the outputs.  (0.x calls before this
 *    release put the tenant last, after the outputs: docs/api-c.md.)
 *  - Per-key batch results are int32_t: 1 (true) / 0 (false) / a negative
 *    code for existence and probes; 0 / a negative code for puts and gets.
 *  - Blocking: every call except the accessors blocks the calling thread
 *    until the master answered and every byte moved (or failed); each wait
 *    is bounded by the configured rpc / transfer timeouts.
 *  - Thread safety: one client may be used by any number of threads at once.
 *    Master calls are serialised on the client's one master connection;
 *    transfers run in parallel.  destroy() must not race with other calls.
 *
 * Reads and leases.  A get asks the master for the replica list, which also
 * grants a read lease (lease_ttl_ms, 5 s by default): for that long the
 * master will neither evict nor remove the object.  The client measures the
 * lease from just before it asked; if the lease ran out before the last byte
 * arrived, the bytes may come from memory the master already gave to another
 * object, and the call returns MOONLET_ERR_LEASE_EXPIRED instead of them.
 *
 * Writes.  A put asks the master for space on replica_num distinct store
 * nodes (PutStart), writes every replica in one transport batch, and seals
 * the object (PutEnd).  If any write fails the put is revoked (PutRevoke):
 * a half-written object never becomes readable.
 *
 * Two backends.  moonlet_client_create() makes a client that talks to the
 * master and moves bytes itself.  moonlet_client_create_dummy() makes a
 * DummyClient: the same moonlet_client, every call of this header works on
 * it, but it holds no segment and no master connection; it forwards each
 * call to the RealClient of its host (moonlet/real_client.h) over a
 * unix-domain socket, with object bytes in shared memory, and returns the
 * RealClient's codes unchanged.  Differences are stated per call; see also
 * docs/client-layers.md.
 */
#ifndef MOONLET_CLIENT_H
#define MOONLET_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "moonlet/error.h"
#include "moonlet/policy.h"
#include "moonlet/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moonlet_client moonlet_client;

/* How object bytes move. */
typedef enum moonlet_protocol {
    MOONLET_PROTOCOL_AUTO = 0, /* RDMA when a device with an ACTIVE port exists, else TCP */
    MOONLET_PROTOCOL_TCP = 1,
    MOONLET_PROTOCOL_RDMA = 2,
} moonlet_protocol;

#define MOONLET_CLIENT_DEFAULT_TIMEOUT_MS 10000u

typedef struct moonlet_client_config {
    /* sizeof the caller's struct, set by moonlet_client_config_init(): the
     * library reads and writes no byte past it, so a program built against
     * an older (shorter) header stays safe; fields it lacks take their
     * defaults.  Keep it first. */
    size_t opts_size;
    const char *master_addr;      /* "HOST:PORT" of the master (required), or with HA
                                   * every master's: "HOST:PORT,HOST:PORT" (the client
                                   * follows the leader; docs/reliability.md) */
    moonlet_protocol protocol;    /* default AUTO */
    const char *device;           /* RDMA device ("mlx5_0"); NULL: the first ACTIVE one */
    const char *auth_token;       /* the cluster's shared token; NULL or "": none */
    uint32_t rpc_timeout_ms;      /* per master call; 0: 10000 */
    uint32_t transfer_timeout_ms; /* longest wait without progress in a transfer; 0: 10000 */
    const char *default_tenant;   /* tenant of calls that name none; NULL: "default" */
    uint32_t replica_num;         /* replicas per put unless the put says; 0: 1 */
    /* Optional: contribute memory to the cluster from this process, like a
     * store node (reads then prefer the local replica).  0: a pure client. */
    uint64_t local_segment_size;
    const char *local_listen_addr; /* data endpoint for it; NULL: "127.0.0.1:0" */
    /* RDMA: the local IP the client's connections bind (the NIC and port to
     * use on a multi-NIC host, as `rping -I`); NULL: the route's choice. */
    const char *source_addr;
    /* RDMA: the IP TOS byte of the client's connections (the RoCE v2 traffic
     * class of a lossless class, e.g. 106); 0: the kernel's default. */
    int rdma_tos;
    /* End-to-end checksums (XXH3-64) are on by default: puts record one,
     * gets verify it and fall over to the next replica on a mismatch
     * (INVALID_READ when none matches).  true: this client neither computes
     * nor verifies them (its puts' objects then read without a check). */
    bool skip_checksum;
    /* The client's HTTP endpoint (Mooncake's enable_client_http_server /
     * client_http_port): GET /metrics, this client's counters in the
     * Prometheus text format (puts, gets, bytes, hits, misses, latency
     * histograms, errors by code), and GET /health.  With auth_token, a
     * request must carry "Authorization: Bearer <token>".  At most 64
     * connections at once.  false: none. */
    bool http_server;
    uint16_t http_port;        /* 0: a free port (moonlet_client_http_port()) */
    const char *http_address;  /* NULL: "0.0.0.0", every IPv4 address */
    /* Device (GPU) memory that the NIC cannot reach in place is staged
     * through pinned host memory of this client: at most this many bytes
     * (two halves, copy and network overlapped); 0: 128 MiB; at least 2 MiB.
     * Allocated at the first call that needs it.  See "Device memory". */
    uint64_t gpu_staging_size;
    /* TLS to the master (docs/deployment.md, "TLS"): PEM files.  tls_ca set
     * turns TLS on: the master's certificate must be signed by it and name
     * the address connected to; tls_cert and tls_key are this client's
     * certificate for a master that requires one (mutual TLS).  NULL: a
     * plaintext connection, as always.  A file that does not load makes
     * create fail with INVALID_PARAMS. */
    const char *tls_ca;
    const char *tls_cert;
    const char *tls_key;
    /* With local_segment_size: a disk tier behind the local segment
     * (Mooncake's enable_ssd_offload / ssd_offload_path; moonlet-store
     * --disk): objects evicted from the cluster's DRAM may be demoted to it,
     * and a restart with the same path brings them back.  local_disk_path: a
     * file (created and preallocated; not on tmpfs), a block device, or a
     * directory (the file moonlet-disk.tier in it); comma-separated for
     * several.  local_disk_size: the tier's bytes (0: 4 x local_segment_size,
     * at least 64 MiB).  NULL: none.  A path that cannot be used makes
     * create fail (INVALID_PARAMS, INTERNAL_ERROR). */
    const char *local_disk_path;
    uint64_t local_disk_size;
} moonlet_client_config;

/* Options of one put.  A NULL options pointer means all defaults. */
typedef struct moonlet_put_options {
    uint32_t replica_num; /* 0: the client's default (config.replica_num) */
    bool soft_pin;        /* keep the object out of eviction for the soft-pin TTL */
    const char *tenant;   /* NULL: the client's default tenant */
    bool skip_checksum;   /* true: record no checksum for this put (saves one pass over the bytes) */
    /* Placement and pinning (Mooncake's ReplicateConfig); zero / NULL: none,
     * and then the put is sent as before this field existed. */
    const char *const *preferred_segments; /* segment names (as moonlet-inspect lists
                                            * them) tried first, in order; one that is
                                            * unknown or full is skipped */
    size_t preferred_segments_count;       /* at most 64 */
    bool hard_pin;        /* never evicted (Remove still removes it); NO_AVAILABLE_HANDLE
                           * beyond the master's hard-pin cap (half the capacity) */
    uint64_t soft_pin_ttl_ms; /* with soft_pin: this object's pin TTL; 0: the master's */
} moonlet_put_options;

/* Fills the first cfg_size bytes of *cfg with the defaults above (all zero /
 * NULL) and sets cfg->opts_size = cfg_size; pass sizeof *cfg (SPDK's
 * opts_size pattern: nothing is written past cfg_size).  master_addr must
 * still be set.  Does nothing for a NULL cfg or a cfg_size too small to hold
 * opts_size.  Never fails.  moonlet_client_create() and
 * moonlet_real_client_create() refuse (INVALID_PARAMS) a config whose
 * opts_size was never set. */
MOONLET_API void moonlet_client_config_init(moonlet_client_config *cfg, size_t cfg_size);

/*
 * Connects to the master (one round trip, so a wrong address or a refused
 * token shows here) and starts the transport; with local_segment_size it
 * also allocates, serves and mounts a local segment.
 * Returns 0 and sets *out, or
 *   INVALID_PARAMS   no master address, a bad address or protocol value,
 *                    a cfg not set up by moonlet_client_config_init()
 *   RPC_FAIL / RPC_TIMEOUT  the master cannot be reached
 *   ILLEGAL_CLIENT   the master refused the auth token
 *   UNAVAILABLE_IN_CURRENT_STATUS  protocol RDMA but no usable RDMA device
 *   INTERNAL_ERROR   out of memory, threads or sockets; the HTTP endpoint
 *                    (http_server) cannot listen on its port
 * Blocks for the connection.  Thread safe (creates an independent client).
 */
MOONLET_API int moonlet_client_create(const moonlet_client_config *cfg, moonlet_client **out);

/* ---- DummyClient ------------------------------------------------------------ */

#define MOONLET_DUMMY_DEFAULT_TIMEOUT_MS 30000u
#define MOONLET_DUMMY_DEFAULT_STAGING (64u << 20)
#define MOONLET_DUMMY_DEFAULT_CONNECTIONS 4u

typedef struct moonlet_dummy_config {
    /* sizeof the caller's struct, set by moonlet_dummy_config_init(), as
     * moonlet_client_config.opts_size.  Keep it first. */
    size_t opts_size;
    /* Longest wait for one RealClient answer; 0: 30000.  Keep it above the
     * RealClient's own rpc + transfer timeouts, or a slow but healthy call is
     * reported as RPC_TIMEOUT. */
    uint32_t rpc_timeout_ms;
    /* Shared-memory staging area per connection, for the copying calls; 0:
     * 64 MiB.  Memory is only used as bytes are written.  A call that needs
     * more uses a one-off shared area of its exact size for that call. */
    uint64_t staging_bytes;
    /* Calls that may run at once (one socket connection + staging area
     * each, opened as needed); 0: 4.  Further calls wait for a free one. */
    uint32_t max_connections;
    /* Tenant of calls that name none; NULL: the RealClient's default. */
    const char *default_tenant;
    /* Who may serve this client.  Every connection checks the process at
     * the other end of the socket (SO_PEERCRED) before it sends anything:
     * it must run as root, or as peer_uid (default: this process's uid),
     * or with peer_gid as its group (only when peer_gid_set).  Anything
     * else is ILLEGAL_CLIENT: another local user who bound the socket path
     * first receives nothing. */
    bool peer_uid_set;
    uint32_t peer_uid;
    bool peer_gid_set;
    uint32_t peer_gid;
    /* As moonlet_client_config.gpu_staging_size: device memory is staged in
     * this process, into shared memory the RealClient reads in place. */
    uint64_t gpu_staging_size;
} moonlet_dummy_config;

/* Fills the first cfg_size bytes of *cfg with the defaults (all zero /
 * NULL) and sets cfg->opts_size = cfg_size; pass sizeof *cfg.  As
 * moonlet_client_config_init().  Never fails. */
MOONLET_API void moonlet_dummy_config_init(moonlet_dummy_config *cfg, size_t cfg_size);

/*
 * Creates a DummyClient served by the RealClient listening on socket_path
 * (cfg may be NULL: defaults; else it must come from
 * moonlet_dummy_config_init(), INVALID_PARAMS when its opts_size is 0).
 * Connects once, so a wrong path or a dead RealClient shows here.  Returns 0 and sets *out, or
 *   INVALID_PARAMS   NULL path or out, a path too long for a unix socket
 *   RPC_FAIL / RPC_TIMEOUT  nothing (alive) listens there; no permission
 *   INVALID_VERSION  the RealClient speaks an older protocol
 *   ILLEGAL_CLIENT   the socket's server runs as neither root nor the
 *                    expected uid/gid (peer_uid / peer_gid above)
 *   INTERNAL_ERROR   out of memory or shared memory (memfd)
 * Blocks for the connection.  Thread safe (creates an independent client).
 *
 * Behaviour of a DummyClient:
 *  - Every call is one request to the RealClient, which makes the same call
 *    on its own client and answers with its return code and outputs; the
 *    DummyClient returns them unchanged.  BatchProbeKey's policy reaches the
 *    master unchanged.  Besides the errors of each call, RPC_FAIL (the
 *    RealClient is gone or closed the connection) or RPC_TIMEOUT (no answer
 *    within rpc_timeout_ms); the next call reconnects.  No call hangs
 *    beyond rpc_timeout_ms per request.
 *  - put/get/get_alloc/upsert copy the caller's bytes through the
 *    connection's shared staging area (one memcpy on this side).
 *  - register_buffer accepts any memory; put_from/get_into (and batches)
 *    copy through the staging area for it, since the RealClient cannot see
 *    this process's memory.  Memory from moonlet_client_alloc_shared() is
 *    shared with the RealClient: calls on it copy nothing on this side.
 *  - moonlet_client_protocol() is the RealClient's transport;
 *    moonlet_client_local_endpoint() is UNAVAILABLE_IN_CURRENT_STATUS.
 */
MOONLET_API int moonlet_client_create_dummy(const char *socket_path, const moonlet_dummy_config *cfg,
                                            moonlet_client **out);

/* Unmounts the local segment (if any), closes every connection and frees the
 * client.  Buffers registered with it are unregistered (the memory stays the
 * caller's).  Calls on other threads must have returned.  NULL is a no-op. */
MOONLET_API void moonlet_client_destroy(moonlet_client *c);

/* ---- objects ------------------------------------------------------------ */

/*
 * Stores `len` bytes from `buf` under `key` (len 0 is a valid, empty object).
 * Returns 0 when every replica was written and the object sealed, or
 *   OBJECT_ALREADY_EXISTS  the key exists, or another put of it is in progress
 *   NO_AVAILABLE_HANDLE    not enough space or fewer than replica_num store nodes
 *   TRANSFER_FAIL / SEGMENT_NOT_FOUND  a replica could not be written, nor
 *                          a replacement on another node (at most 4 per
 *                          put), or not before the put's deadline (the put
 *                          was revoked: nothing readable remains)
 *   INVALID_WRITE          a store node refused the write's capability (late,
 *                          or the segment changed); the put was revoked
 *   OBJECT_NOT_FOUND       every store node holding a replica left the
 *                          cluster while the put ran (nothing was stored)
 *   INVALID_KEY, INVALID_PARAMS (replica_num above the master's limit)
 * When PutEnd itself fails (RPC_FAIL / RPC_TIMEOUT) the put is revoked, but
 * the master may have sealed it before the connection broke: a retry may
 * then find OBJECT_ALREADY_EXISTS with the object complete.
 * On RDMA the bytes are staged through a registered buffer of the client;
 * put_from() avoids that copy.  Unless skip_checksum (options or client
 * config), the XXH3-64 of the bytes is recorded for readers to verify.
 * Blocks; thread safe.
 */
MOONLET_API int moonlet_client_put(moonlet_client *c, const char *key, const void *buf, size_t len,
                                   const moonlet_put_options *opt);

/*
 * Reads `key` into buf (capacity cap); *len gets the object's size.
 * Reads one replica: the one this client serves itself if there is one, else
 * the first; when a replica cannot be read (TRANSFER_FAIL, or
 * SEGMENT_NOT_FOUND because its node re-registered) or its bytes fail the
 * end-to-end checksum the put recorded, the next one is tried.
 * Returns 0, or
 *   OBJECT_NOT_FOUND       no such key
 *   REPLICA_IS_NOT_READY   its put is still in progress
 *   BUFFER_OVERFLOW        cap < size; *len is set to the size needed, no byte moved
 *   LEASE_EXPIRED          the read lease ran out before the read completed;
 *                          buf holds unspecified bytes
 *   TRANSFER_FAIL          no replica could be read
 *   INVALID_READ           every replica read failed the checksum (buf holds
 *                          unspecified bytes; never reported as success)
 * Grants a read lease as a side effect.  Blocks; thread safe.
 */
MOONLET_API int moonlet_client_get(moonlet_client *c, const char *key, void *buf, size_t cap,
                                   const char *tenant, size_t *len);

/* As moonlet_client_get() into a buffer it allocates: *buf gets malloc'd
 * memory of *len bytes (at least 1 byte allocated, so an empty object gives a
 * non-NULL pointer) that the caller releases with moonlet_free().  On error *buf is
 * NULL.  Also INTERNAL_ERROR when the allocation fails. */
MOONLET_API int moonlet_client_get_alloc(moonlet_client *c, const char *key, const char *tenant,
                                         void **buf, size_t *len);

/* The size of a readable object.  Asks the same question as a get
 * (GetReplicaList), so it also grants a read lease.  OBJECT_NOT_FOUND,
 * REPLICA_IS_NOT_READY.  Blocks; thread safe. */
MOONLET_API int moonlet_client_get_size(moonlet_client *c, const char *key, const char *tenant,
                                        uint64_t *size);

/* Removes an object.  OBJECT_NOT_FOUND, OBJECT_HAS_LEASE (a read lease
 * holds), REPLICA_IS_NOT_READY (its put is in progress).  Blocks; thread safe. */
MOONLET_API int moonlet_client_remove(moonlet_client *c, const char *key, const char *tenant);

/* Removes every object of the tenant that holds no lease and has no put in
 * progress; *removed (optional) gets the count.  Blocks; thread safe. */
MOONLET_API int moonlet_client_remove_all(moonlet_client *c, const char *tenant, uint64_t *removed);

/* remove / remove_all with Mooncake's force: objects under an unexpired read
 * lease are removed too (a put in progress still is not).  A reader still
 * transferring from a removed replica may read bytes of whatever the master
 * places there next, so use it for resets with no reads in flight, as with
 * Mooncake.  Through a DummyClient, the RealClient must know the force
 * argument (this version). */
MOONLET_API int moonlet_client_remove_force(moonlet_client *c, const char *key, const char *tenant);
MOONLET_API int moonlet_client_remove_all_force(moonlet_client *c, const char *tenant,
                                                uint64_t *removed);

/*
 * Put, or replace: a put; when the key exists, a remove and a second put.
 * NOT atomic: between the remove and the second put readers see
 * OBJECT_NOT_FOUND, and a concurrent put of the same key may win (this call
 * then returns OBJECT_ALREADY_EXISTS).  An object under a read lease cannot
 * be replaced: OBJECT_HAS_LEASE.  Otherwise the errors of put and remove.
 * Blocks; thread safe.
 */
MOONLET_API int moonlet_client_upsert(moonlet_client *c, const char *key, const void *buf, size_t len,
                                      const moonlet_put_options *opt);

/*
 * The master's view of one object, for inspection: *json_out gets a
 * NUL-terminated JSON object the library allocated (release with
 * moonlet_free()):
 *   {"key", "size", "complete", "replica_count", "readable_replicas",
 *    "lease_remaining_ms", "soft_pin_remaining_ms",
 *    "replicas": [{"segment_id", "segment_name", "endpoint", "protocol",
 *                  "offset", "length", "base", "status"}...]}
 * status is "COMPLETE" or "INITIALIZED".  Unlike get or exist, it grants no
 * lease.  Returns 0, OBJECT_NOT_FOUND, INVALID_PARAMS (NULL json_out), or
 * INTERNAL_ERROR; on error *json_out is NULL.  Blocks; thread safe.
 */
MOONLET_API int moonlet_client_inspect_key(moonlet_client *c, const char *key, const char *tenant,
                                           char **json_out);

/*
 * The readable replicas of many keys, one master call for the batch
 * (BatchGetReplicaList; like a get's lookup, it leases each object found):
 * *json_out gets a NUL-terminated JSON array the library allocated (release
 * with moonlet_free()), one entry per key in order:
 *   {"size", "replicas": [{"segment_id", "endpoint", "protocol", "offset",
 *                          "length", "status"}...]}
 * or {"error": code} (OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY, INVALID_KEY...).
 * Returns 0 (every entry set), or the batch's error (INVALID_PARAMS for NULL
 * arrays or json_out, RPC_FAIL...); on error *json_out is NULL.  Blocks;
 * thread safe.
 */
MOONLET_API int moonlet_client_batch_replicas(moonlet_client *c, const char *const *keys, size_t n,
                                              const char *tenant, char **json_out);

/* Releases memory the library allocated for a result (moonlet_client_get_alloc's
 * buffer, moonlet_client_inspect_key's JSON), with the allocator that made it,
 * so a program linked with another C runtime or allocator stays correct.
 * NULL is a no-op.  Thread safe. */
MOONLET_API void moonlet_free(void *p);

/* ---- existence and probes -------------------------------------------------- */

/* Whether a readable object exists.  Mooncake semantics: a hit is leased
 * (like a get would).  Blocks; thread safe. */
MOONLET_API int moonlet_client_exist_key(moonlet_client *c, const char *key, const char *tenant,
                                         bool *exists);

/* ExistKey for n keys in one round trip: results[i] is 1, 0 or a per-key
 * error (INVALID_KEY).  Every hit is leased.  Blocks; thread safe. */
MOONLET_API int moonlet_client_batch_exist_key(moonlet_client *c, const char *const *keys, size_t n,
                                               const char *tenant, int32_t *results);

/* Point-in-time existence; never grants or extends a lease.  Blocks; thread safe. */
MOONLET_API int moonlet_client_probe_key(moonlet_client *c, const char *key, const char *tenant,
                                         bool *exists);

/*
 * BatchProbeKey with a GrantLeasePolicy (moonlet/policy.h), passed to the
 * master unchanged.  NONE: results[i] is point-in-time existence, nothing is
 * leased.  LAST_HIT_ONLY with candidate_size k: the n keys are n/k
 * candidates of k contiguous keys; the last candidate whose every key is
 * readable is leased and its positions are the only 1s in results.
 * Returns INVALID_PARAMS (nothing leased) when the master rejects the policy
 * (unknown mode, candidate_size 0 or not dividing n).  Blocks; thread safe.
 */
MOONLET_API int moonlet_client_batch_probe_key(moonlet_client *c, const char *const *keys, size_t n,
                                               moonlet_grant_lease_policy policy, const char *tenant,
                                               int32_t *results);

/*
 * ProbeResume: the whole K3 lookup in one master round trip
 * (docs/probe-policy.md; moonlet_k3_lookup() uses it).  kv_keys are the
 * request's KV keys in order; kda_keys are n_kda / candidate_size candidates
 * of candidate_size contiguous keys, in order of increasing resume position;
 * boundaries[c] (n_kda / candidate_size entries) is how many leading KV keys
 * candidate c needs.  The master computes the KV prefix (leading readable KV
 * keys), selects the last candidate whose boundary lies within it and whose
 * every KDA key and every KV key below its boundary is readable (rechecked
 * under its locks, falling back to an earlier candidate when one vanished),
 * and leases exactly that candidate's KDA keys and kv_keys[0 .. boundary):
 * nothing else, and nothing at all when no candidate is selected.
 * out->kv_prefix and out->selected (-1: none) are set; mask[i] (n_kda
 * entries) is 1 exactly at the selected candidate's keys.
 * Returns 0, INVALID_PARAMS (candidate_size 0 or not dividing a nonempty
 * kda_keys, a boundary above n_kv, NULL arrays, more keys than the master's
 * --max-batch-keys: nothing leased), INVALID_KEY (any key empty or too long:
 * nothing leased), INVALID_VERSION (the master, or the RealClient, predates
 * the method: use BatchExistKey + BatchProbeKey), or the transport errors.
 * Blocks; thread safe.
 */
typedef struct moonlet_probe_resume_result {
    uint64_t kv_prefix; /* leading readable KV keys */
    int64_t selected;   /* the selected candidate, or -1 */
} moonlet_probe_resume_result;

MOONLET_API int moonlet_client_probe_resume(moonlet_client *c, const char *const *kv_keys, size_t n_kv,
                                            const char *const *kda_keys, size_t n_kda,
                                            uint64_t candidate_size, const uint64_t *boundaries,
                                            const char *tenant, moonlet_probe_resume_result *out,
                                            int32_t *mask);

/* ---- zero-copy buffers ----------------------------------------------------- */

/*
 * Registers [base, base + len) as a source or destination of put_from /
 * get_into (on RDMA: a memory region, so the NIC moves bytes without a copy).
 * The memory stays the caller's and must stay valid until unregistered.
 * INVALID_PARAMS for NULL / 0 length or a base already registered;
 * TRANSFER_FAIL when the NIC refuses the registration.  Thread safe.
 * On a DummyClient it only records the range: put_from / get_into copy it
 * through shared memory (moonlet_client_alloc_shared() avoids the copy).
 *
 * Device memory.  A range in CUDA device memory (cuMemAlloc / cudaMalloc
 * memory) is recognised by the driver's pointer attributes: the CUDA driver
 * is loaded at run time (libcuda.so.1, or $MOONLET_CUDA_DRIVER; "none":
 * never) the first time a buffer is registered; without one every range is
 * host memory, as before.  Device memory is registered in place with the
 * NIC when the client speaks RDMA and the NIC takes it (GPUDirect RDMA:
 * dma-buf, else the peer-memory module), and is otherwise staged: every
 * call on it (put, get, put_from, get_into, their batches, the copying
 * batches, upsert) copies through the client's pinned host memory
 * (config gpu_staging_size), copy and network overlapped, and a get's bytes
 * reach the device only after their checksum was verified on the host.  The
 * copies run on a stream of the device that holds the memory, in its
 * primary context; buffers on several devices may be mixed in one call.
 * A range that starts in a device allocation and runs past its end:
 * INVALID_PARAMS.  Docs: api-c.md, "Device (GPU) memory".
 */
MOONLET_API int moonlet_client_register_buffer(moonlet_client *c, void *base, size_t len);

/* Unregisters the buffer registered at `base`; transfers using it must have
 * returned.  INVALID_PARAMS when nothing is registered there.  Thread safe. */
MOONLET_API int moonlet_client_unregister_buffer(moonlet_client *c, void *base);

/*
 * Allocates len bytes that put_from / get_into (and their batches) use with
 * no copy on every backend, already registered (do not register them
 * again).  On a DummyClient it is shared memory (memfd) that the RealClient
 * maps on first use, so object bytes go straight between it and the store;
 * on a client of moonlet_client_create() it is page-aligned memory
 * registered with the transport.  *out gets the memory (zeroed); release
 * it with moonlet_client_free_shared().  INVALID_PARAMS for len 0 or NULL
 * out; INTERNAL_ERROR when out of memory; TRANSFER_FAIL when the NIC
 * refuses the registration.  Thread safe.
 */
MOONLET_API int moonlet_client_alloc_shared(moonlet_client *c, size_t len, void **out);

/* Releases memory of moonlet_client_alloc_shared(); transfers using it must
 * have returned.  INVALID_PARAMS when p is not such memory.  Thread safe. */
MOONLET_API int moonlet_client_free_shared(moonlet_client *c, void *p);

/* Put from registered memory: [buf, buf + len) must lie inside one
 * registered buffer, else INVALID_PARAMS.  Otherwise as moonlet_client_put(). */
MOONLET_API int moonlet_client_put_from(moonlet_client *c, const char *key, const void *buf, size_t len,
                                        const moonlet_put_options *opt);

/* Get into registered memory: [buf, buf + cap) must lie inside one registered
 * buffer, else INVALID_PARAMS.  cap smaller than the object: BUFFER_OVERFLOW
 * with *len set to the size needed.  Otherwise as moonlet_client_get(). */
MOONLET_API int moonlet_client_get_into(moonlet_client *c, const char *key, void *buf, size_t cap,
                                        const char *tenant, size_t *len);

/*
 * put_from for n keys: one PutStart per key, every replica of every key
 * written in one transport batch, then PutEnd (or PutRevoke) per key.
 * results[i] is 0 or that key's error (INVALID_PARAMS for a buffer outside
 * registered memory; otherwise put's errors).  Returns 0 when every key was
 * stored, else the first non-zero results[i] (in array order); INVALID_PARAMS
 * without doing anything when an array is NULL.  Blocks; thread safe.
 */
MOONLET_API int moonlet_client_batch_put_from(moonlet_client *c, const char *const *keys,
                                              size_t n, const void *const *bufs, const size_t *lens,
                                              const moonlet_put_options *opt, int32_t *results);

/*
 * get_into for n keys: one GetReplicaList per key, then every read in one
 * transport batch (failed replicas are retried on the next one, again in one
 * batch).  lens[i] gets each object's size (also on BUFFER_OVERFLOW);
 * results[i] is 0 or that key's error as in get_into().  Returns 0 when every
 * key was read, else the first non-zero results[i]; INVALID_PARAMS without
 * doing anything when an array is NULL.  Blocks; thread safe.
 */
MOONLET_API int moonlet_client_batch_get_into(moonlet_client *c, const char *const *keys,
                                              size_t n, void *const *bufs, const size_t *caps,
                                              const char *tenant, size_t *lens, int32_t *results);

/* ---- copying batches ----------------------------------------------------------------- */

/*
 * Copying batch put: key i's object is the concatenation of the next
 * iovcnt[i] ranges of iov (key 0's ranges first, then key 1's, ...), any
 * memory, registered or not.  The bytes are copied once into one staging
 * region for the whole call (on a DummyClient: shared memory the RealClient
 * reads in place; otherwise memory registered for the call), then every key
 * goes as in moonlet_client_batch_put_from(): one transport batch.
 * results[i] is 0 or that key's error; when the call fails as a whole (no
 * staging memory: INTERNAL_ERROR, TRANSFER_FAIL) every key gets its code.
 * Returns 0 when every key was stored, else the first non-zero results[i];
 * INVALID_PARAMS without doing anything (every results[i] set to it when
 * results is not NULL) for NULL arrays (iov may be NULL when every iovcnt
 * is 0), a NULL key, a NULL range base of nonzero length, or sizes that
 * overflow together.  Blocks; thread safe.
 */
MOONLET_API int moonlet_client_batch_put(moonlet_client *c, const char *const *keys, size_t n,
                                         const struct iovec *iov, const size_t *iovcnt,
                                         const moonlet_put_options *opt, int32_t *results);

/*
 * Copying batch get: key i is read into the next iovcnt[i] ranges of iov
 * (filled in order), through one staging region for the call as
 * moonlet_client_batch_put().  sizes[i] gets each object's size (also on
 * BUFFER_OVERFLOW: the ranges together hold less than the object; nothing
 * is copied for that key, so iovcnt[i] 0 asks just the size).
 * results[i] is 0 or that key's error as in moonlet_client_get_into().
 * Returns 0 when every key was read, else the first non-zero results[i];
 * INVALID_PARAMS as moonlet_client_batch_put().  Blocks; thread safe.
 */
MOONLET_API int moonlet_client_batch_get(moonlet_client *c, const char *const *keys, size_t n,
                                         const struct iovec *iov, const size_t *iovcnt,
                                         const char *tenant, size_t *sizes, int32_t *results);

/* ---- accessors (never block) -------------------------------------------------------- */

/* "tcp" or "rdma": the transport this client runs (a DummyClient: its
 * RealClient's). */
MOONLET_API const char *moonlet_client_protocol(const moonlet_client *c);

/* The port of the client's HTTP endpoint (config http_server), or 0 when it
 * has none (a NULL client, a DummyClient). */
MOONLET_API int moonlet_client_http_port(const moonlet_client *c);

/* Copies the data endpoint of the client's local segment ("127.0.0.1:41234").
 * UNAVAILABLE_IN_CURRENT_STATUS for a pure client and a DummyClient;
 * BUFFER_OVERFLOW when cap is too small. */
MOONLET_API int moonlet_client_local_endpoint(const moonlet_client *c, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
