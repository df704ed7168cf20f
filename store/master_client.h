/*
 * master_client.h - MasterClient: the C client of the master's control RPC.
 *
 * Wraps one RPC connection behind a mutex, so one MasterClient may be shared
 * by threads (calls are serialised).  A broken connection is re-established
 * on the next call, and so is one the master closed while it sat idle (the
 * master restarted): that is noticed before the request is sent, so the call
 * goes to the new master instead of failing.  Reconnects back off: after n
 * failed connects in a row the next attempt waits until
 * min(cap, base * 2^(n-1)) ms after the last failure (moonlet_mc_backoff_ms).
 * A call waits that out only when the wait fits in its timeout; otherwise it
 * fails at once with RPC_FAIL and sends nothing.  So every call is bounded by
 * about twice the timeout, one connect attempt at most, and nothing loops.
 * Every call returns 0 or a moonlet error code; per-key batch results are
 * written to `results[i]` as 1 (true), 0 (false) or a negative error code.
 * Keys and ids are NUL-terminated strings; tenant NULL or "" means "default".
 *
 * Locks: its own connection mutex only.
 */
#ifndef MOONLET_MASTER_CLIENT_H
#define MOONLET_MASTER_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moonlet/policy.h"
#include "moonlet/types.h"
#include "replica.h"

typedef struct moonlet_master_client moonlet_master_client;

#define MOONLET_MC_BACKOFF_BASE_MS 50u   /* wait after the first failed connect */
#define MOONLET_MC_BACKOFF_CAP_MS 1000u  /* longest wait between connect attempts */

typedef struct moonlet_master_client_opts {
    int timeout_ms;            /* per call; <= 0 means 10000 */
    const char *auth_token;    /* NULL: none */
    uint32_t backoff_base_ms;  /* 0: MOONLET_MC_BACKOFF_BASE_MS */
    uint32_t backoff_cap_ms;   /* 0: MOONLET_MC_BACKOFF_CAP_MS (raised to base when below) */
    /* A client TLS context (transport/tls.h; the client takes a reference):
     * every connection to a master speaks TLS.  NULL: plaintext. */
    struct moonlet_tls_ctx *tls;
} moonlet_master_client_opts;

/* The wait before the next connect attempt after `failures` failed ones in a
 * row: 0 for none, else min(cap, base * 2^(failures-1)).  Pure. */
uint32_t moonlet_mc_backoff_ms(uint32_t base_ms, uint32_t cap_ms, unsigned failures);

/* A master answered (NOT_LEADER) but none serves yet: an election, then a
 * grace period.  The next connect goes no later than this after the last
 * failure, the backoff notwithstanding (a live master is not hammered by
 * connects: one Hello per attempt). */
#define MOONLET_MC_NOT_LEADER_CAP_MS 250u

/* The wait before the next connect attempt after `failures` failed ones in a
 * row, the last of which ended `rc`: moonlet_mc_backoff_ms, capped at
 * MOONLET_MC_NOT_LEADER_CAP_MS when a master answered NOT_LEADER; and when
 * an elected leader said it serves in serve_in_ms (> 0, its grace period),
 * exactly that (+1 ms), so the call reaches it as it begins to serve.  Pure. */
uint32_t moonlet_mc_retry_ms(uint32_t base_ms, uint32_t cap_ms, unsigned failures, int rc,
                             uint64_t serve_in_ms);

/* Failed connects in a row so far (0 once one succeeds).  Thread safe. */
unsigned moonlet_mc_connect_failures(moonlet_master_client *mc);

/* addr is "HOST:PORT", or a list "HOST:PORT,HOST:PORT,..." (at most 16) of
 * masters sharing an etcd election (HA): a new connection sends Hello (with
 * one address: only once that master answered NOT_LEADER, so a client of a
 * lone master talks exactly as before) and stays only with the master that serves (following the leader a standby
 * names, else trying the list in turn), and replies are checked against the
 * highest epoch seen.  A call answered NOT_LEADER or by an older epoch, or
 * one that could not be sent because no master was reachable (HA only), is
 * repeated on the leader until its timeout; NOT_LEADER reaches the caller
 * only if no leader served within it.  A call whose request was sent and
 * whose reply was lost is never repeated.  Connects eagerly; returns
 * MOONLET_ERR_RPC_FAIL when no master is reachable. */
int moonlet_mc_create(const char *addr, const moonlet_master_client_opts *opts,
                      moonlet_master_client **out);
void moonlet_mc_destroy(moonlet_master_client *mc);
/* Whether failover is possible: several masters given, or one answered
 * NOT_LEADER.  Thread safe. */
bool moonlet_mc_is_ha(moonlet_master_client *mc);
/* The newest leader epoch a reply carried (0: none, no HA). */
uint64_t moonlet_mc_epoch(moonlet_master_client *mc);

int moonlet_mc_echo(moonlet_master_client *mc, const void *payload, size_t len);
/* Records that client_id is alive (and sends this host's CLOCK_MONOTONIC, for
 * the master's clock offset bound of its segments).  *segments_out (optional, may be NULL) gets
 * the number of segments the master has mounted for it: a store node that
 * reads 0 after it mounted one knows the master forgot it (restart, or
 * declared dead) and must mount again. */
int moonlet_mc_ping(moonlet_master_client *mc, const char *client_id, uint32_t *segments_out);
/* The same, carrying a node's disk tier figures (ndisk values in the order
 * of common/node_disk_fields.h; NULL: none, the Ping above).  Only a node
 * with a disk tier sends them: a master without the disk tier refuses the
 * argument. */
int moonlet_mc_ping_disk(moonlet_master_client *mc, const char *client_id, const uint64_t *disk,
                         uint32_t ndisk, uint32_t *segments_out);
int moonlet_mc_mount_segment(moonlet_master_client *mc, const moonlet_segment_desc *seg);
/* Binds client_id to this MasterClient's connection with a per-node secret
 * (BindClient), now and again on every reconnect before any other call, so
 * only this node may ping, mount and unmount for the id.  ILLEGAL_CLIENT:
 * another live node holds the id. */
int moonlet_mc_bind_client(moonlet_master_client *mc, const char *client_id, const char *secret);
int moonlet_mc_unmount_segment(moonlet_master_client *mc, const char *client_id,
                               const char *segment_id);

int moonlet_mc_put_start(moonlet_master_client *mc, const char *tenant, const char *key,
                         uint64_t size, uint32_t replica_num, bool soft_pin,
                         moonlet_replica_list *out);
/* PutStart's optional trailing args (Mooncake's ReplicateConfig); sent
 * only when one is set, so a master that predates them still serves puts
 * that use none. */
typedef struct moonlet_mc_put_extra {
    const char *const *preferred; /* segment names tried first (NULL / 0: none) */
    size_t npreferred;
    bool hard_pin;                /* never evicted; Remove still removes it */
    uint64_t soft_pin_ttl_ms;     /* with soft_pin: this object's TTL; 0: the master's */
} moonlet_mc_put_extra;
int moonlet_mc_put_start_ex(moonlet_master_client *mc, const char *tenant, const char *key,
                            uint64_t size, uint32_t replica_num, bool soft_pin,
                            const moonlet_mc_put_extra *extra, moonlet_replica_list *out);
int moonlet_mc_put_end(moonlet_master_client *mc, const char *tenant, const char *key);
/* PutEnd recording the writer's XXH3-64 of the bytes (NULL: none, as above). */
int moonlet_mc_put_end_checksum(moonlet_master_client *mc, const char *tenant, const char *key,
                                const uint64_t *checksum);
int moonlet_mc_put_revoke(moonlet_master_client *mc, const char *tenant, const char *key);
int moonlet_mc_get_replica_list(moonlet_master_client *mc, const char *tenant, const char *key,
                                moonlet_replica_list *out);
/*
 * The batches of the put and get calls, one round trip each (BatchPutStart,
 * BatchPutEnd, BatchPutRevoke, BatchGetReplicaList): key i's outcome is
 * results[i] (0 or its error code, as the single call would return it), and
 * lists[i] its single call's list (PutStart's with capabilities, size
 * sizes[i]; GetReplicaList's with a lease) when results[i] is 0, zeroed
 * otherwise: the caller frees each with moonlet_replica_list_free.  One bad
 * key never fails the others.  The call's own return is 0 when the master
 * answered the batch (every results[i] set), else the batch's error and
 * nothing was set: INVALID_VERSION when the master predates the batch
 * methods (remembered for the connection; the caller makes the single calls
 * instead), INVALID_PARAMS when it refused the batch (more keys than its
 * --max-batch-keys).  checksums (BatchPutEnd): one per key, or NULL for none.
 * put_ids: BatchPutStart's id of each put started (put_ids[i] for key i,
 * may be NULL); given back to BatchPutEnd / BatchPutRevoke (one per key, 0
 * for a key without one; NULL: none), they bind each to its own put: a
 * late one whose put was reaped and started again by another writer gets
 * OBJECT_NOT_FOUND instead of sealing or revoking the other's.
 */
int moonlet_mc_batch_put_start(moonlet_master_client *mc, const char *tenant,
                               const char *const *keys, const uint64_t *sizes, size_t n,
                               uint32_t replica_num, bool soft_pin,
                               const moonlet_mc_put_extra *extra, moonlet_replica_list *lists,
                               uint64_t *put_ids, int32_t *results);
int moonlet_mc_batch_put_end(moonlet_master_client *mc, const char *tenant,
                             const char *const *keys, const uint64_t *checksums,
                             const uint64_t *put_ids, size_t n, int32_t *results);
int moonlet_mc_batch_put_revoke(moonlet_master_client *mc, const char *tenant,
                                const char *const *keys, const uint64_t *put_ids, size_t n,
                                int32_t *results);
int moonlet_mc_batch_get_replica_list(moonlet_master_client *mc, const char *tenant,
                                      const char *const *keys, size_t n,
                                      moonlet_replica_list *lists, int32_t *results);
/* PutReplaceReplica: one replacement for the replica of a put in progress
 * on segment_id whose write failed, avoiding excluded[] (segment ids seen
 * failing for this put), as a list of one descriptor with its capability
 * and put TTL (out->put_ttl_ms).  INVALID_VERSION when the master predates
 * the method (the caller then revokes the put, as before); otherwise the
 * master's code (master.h: moonlet_master_put_replace_replica). */
int moonlet_mc_put_replace_replica(moonlet_master_client *mc, const char *tenant, const char *key,
                                   const char *segment_id, const char *const *excluded,
                                   size_t nexcluded, moonlet_replica_list *out);
int moonlet_mc_exist_key(moonlet_master_client *mc, const char *tenant, const char *key,
                         bool *exists);
int moonlet_mc_batch_exist_key(moonlet_master_client *mc, const char *tenant,
                               const char *const *keys, size_t n, int32_t *results);
int moonlet_mc_probe_key(moonlet_master_client *mc, const char *tenant, const char *key,
                         bool *exists);
int moonlet_mc_batch_probe_key(moonlet_master_client *mc, const char *tenant,
                               moonlet_grant_lease_policy policy, const char *const *keys,
                               size_t n, int32_t *results);
/*
 * ProbeResume: the K3 lookup in one round trip (docs/probe-policy.md).
 * kv: the request's KV keys in order; kda: candidates of candidate_size
 * contiguous keys; boundaries[c]: the leading KV keys candidate c needs.
 * out gets the KV prefix and the selected candidate (-1: none), mask[i]
 * (n_kda entries) 1 exactly at the selected candidate's keys.  Leases the
 * selected candidate's KDA keys and the KV keys below its boundary, nothing
 * else.  INVALID_VERSION: the master does not know the method (an older
 * master); remembered for the connection, so later calls on it fail at once
 * without a round trip (a new connection asks again).
 */
typedef struct moonlet_mc_resume_out {
    uint64_t kv_prefix;
    int64_t selected;
} moonlet_mc_resume_out;
int moonlet_mc_probe_resume(moonlet_master_client *mc, const char *tenant,
                            const char *const *kv, size_t n_kv, const char *const *kda,
                            size_t n_kda, uint64_t candidate_size, const uint64_t *boundaries,
                            size_t n_boundaries, moonlet_mc_resume_out *out, int32_t *mask);
int moonlet_mc_remove(moonlet_master_client *mc, const char *tenant, const char *key);
int moonlet_mc_remove_all(moonlet_master_client *mc, const char *tenant, uint64_t *removed);
/* The same with Mooncake's force (a trailing argument, sent only when true). */
int moonlet_mc_remove_ex(moonlet_master_client *mc, const char *tenant, const char *key,
                         bool force);
int moonlet_mc_remove_all_ex(moonlet_master_client *mc, const char *tenant, bool force,
                             uint64_t *removed);

/* Admin calls return the decoded result as a cJSON tree (caller frees with cJSON_Delete). */
struct cJSON;
int moonlet_mc_list_segments(moonlet_master_client *mc, struct cJSON **out);
/* One page of ListSegments [cursor, limit, client_id] (docs/protocol.md):
 * *out = {segments: [...], next_cursor} (next_cursor 0 after the last page;
 * limit 0: the master's default; client_id NULL or "": every client's).
 * A master older than paging answers with the bare array of all segments. */
int moonlet_mc_list_segments_page(moonlet_master_client *mc, uint64_t cursor, uint32_t limit,
                                  const char *client_id, struct cJSON **out);
int moonlet_mc_list_keys(moonlet_master_client *mc, const char *tenant, const char *prefix,
                         const char *cursor, uint32_t limit, struct cJSON **out);
/* ListTenants [limit]: *out = {tenants: [{tenant, keys, bytes}...] in name
 * order, the first `limit` (0: the master's default), total}. */
int moonlet_mc_list_tenants(moonlet_master_client *mc, uint32_t limit, struct cJSON **out);
int moonlet_mc_inspect_key(moonlet_master_client *mc, const char *tenant, const char *key,
                           struct cJSON **out);
/* One numeric field of a key's inspection ("lease_remaining_ms",
 * "replica_count", ...; InspectKey grants no lease); -1 when the key cannot
 * be inspected or the field is not a number. */
double moonlet_mc_inspect_number(moonlet_master_client *mc, const char *tenant, const char *key,
                                 const char *field);
int moonlet_mc_stats(moonlet_master_client *mc, struct cJSON **out);
/* Hello to exactly the master at addr (one HOST:PORT; no following, a
 * standby answers too): *out = {role, serving, epoch, terms, leader,
 * advertise}.  INVALID_PARAMS from a master older than Hello. */
int moonlet_mc_hello_at(const char *addr, const moonlet_master_client_opts *opts,
                        struct cJSON **out);

/* ---- re-replication (master/store/repair.c, docs/protocol.md) ------------------ */
typedef struct moonlet_mc_repair_job {
    uint64_t job_id, size;
    bool has_checksum;
    uint64_t checksum;            /* the XXH3-64 PutEnd recorded */
    moonlet_replica_list target;  /* one replica: the range to fill, with its capability;
                                   * put_ttl_ms: ms left until the job's deadline */
    moonlet_replica_list sources; /* readable replicas to copy from */
    /* A demotion: the target is on one of the node's disk segments; the
     * bytes go to its disk tier under this tenant and key.  NULL: a repair. */
    bool demote;
    char *tenant, *key;
} moonlet_mc_repair_job;
/* RepairFetch: up to max (1..64) jobs targeting client_id's segments, into
 * *jobs (free with moonlet_mc_repair_jobs_free; NULL when none). */
int moonlet_mc_repair_fetch(moonlet_master_client *mc, const char *client_id, uint32_t max,
                            moonlet_mc_repair_job **jobs, uint32_t *n);
void moonlet_mc_repair_jobs_free(moonlet_mc_repair_job *jobs, uint32_t n);
/* RepairDone: code 0, or the moonlet error code the job failed with. */
int moonlet_mc_repair_done(moonlet_master_client *mc, const char *client_id, uint64_t job_id,
                           int code, uint64_t bytes);
/* DiskAnnounce (master.h, moonlet_master_disk_announce): n objects found on
 * disk segment segment_id after a restart; results[i] per object. */
int moonlet_mc_disk_announce(moonlet_master_client *mc, const char *client_id,
                             const char *segment_id, const char *const *tenants,
                             const char *const *keys, const uint64_t *sizes,
                             const uint64_t *checksums, const uint64_t *offsets, size_t n,
                             int32_t *results);
/* DiskTrim (master.h, moonlet_master_disk_trim): reports done[0..ndone)
 * invalidated, and gets up to max (1..4096) extents to invalidate next into
 * offsets[] / lens[], *n of them. */
int moonlet_mc_disk_trim(moonlet_master_client *mc, const char *client_id,
                         const char *segment_id, const uint64_t *done, size_t ndone,
                         uint64_t *offsets, uint64_t *lens, uint32_t max, uint32_t *n);
/* Drain (on) / Undrain: *segments (optional) gets how many segments changed. */
int moonlet_mc_drain(moonlet_master_client *mc, const char *target, bool on, uint32_t *segments);

#endif
