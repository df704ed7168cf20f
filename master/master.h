/*
 * master.h - the master service as a library: metadata, segments, leases,
 * eviction, liveness and probes.  No I/O: master/service/service.c exposes these calls
 * over the control RPC; tests call them directly.
 *
 * Strings come as moonlet_str (pointer + length, not NUL-terminated) because
 * they arrive straight from msgpack frames.  An empty tenant means "default".
 * Batch results use the convention 1 = true, 0 = false, < 0 = error code.
 *
 * Replica and segment details are reported through visitor callbacks that run
 * while the master holds its locks: a visitor must be quick and must not call
 * back into the master.  The views' strings are valid only during the call.
 *
 * Thread safety: every function may be called from any thread concurrently.
 * Lock order (see docs/architecture.md): snapshot guard -> shard locks in
 * ascending index -> segment registry lock.
 */
#ifndef MOONLET_MASTER_H
#define MOONLET_MASTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "moonlet/policy.h"
#include "moonlet/types.h"
#include "moonlet_str.h"
#include "node_disk_fields.h"
#include "replica.h"

typedef struct moonlet_master moonlet_master;

#define MOONLET_STR(s) ((moonlet_str){(s), (uint32_t)strlen(s)})

/*
 * A replication record: one metadata change of the leader, in the order of
 * the allocator's changes (docs/protocol.md "Replication stream").
 *   MOUNT    seg (the segment as mounted, with its write key)
 *   UNMOUNT  client_id, segment_id: its replicas stop counting; objects left
 *            without one go (the leader also sends their DROP)
 *   PLACE    an object's whole replica set at PutStart and after each
 *            PutReplaceReplica (free_ms: the replaced range's quarantine);
 *            with FLAG_SEALED the object is sealed by the same record (a
 *            snapshot's object, a repair copy joining it: one record, so a
 *            standby never holds the object missing or unsealed in between)
 *   SEAL     PutEnd (checksum when FLAG_CHECKSUM)
 *   DROP     an object's end (revoke, timeout, remove, eviction, unmount);
 *            free_ms: how long its ranges stay unusable (0: at once),
 *            named by the record's replicas even when the standby never
 *            saw the object (a snapshot part walked after it went)
 *   QUAR     (snapshots) a quarantined range and the ms it stays so
 *   RESV     a range the leader set aside for PutStarts to come (its
 *            segment's pool, pool.c): rep_seg[0] / rep_off[0], size
 *            bytes.  A PutStart placed there is answered without waiting for
 *            the standby (the standby already holds the range as reserved);
 *            a promoted standby holds every reserved range no PLACE took
 *            back for a put timeout + grace, as a put in progress there
 *            might still write
 *   UNRESV   a reserved range the leader gave back (before it is freed)
 * An object is named by (tenant_id, key): the leader's tenant id is unique
 * while the object lives.  Times travel as ms left, never as clock values
 * (the two masters' clocks are unrelated).  Records that take space are
 * emitted after the allocator took it, records that free space before it
 * is freed, both under the locks of the change: so a record that reuses a
 * range always follows the one that freed it.
 */
enum {
    MOONLET_REPL_MOUNT = 1,
    MOONLET_REPL_UNMOUNT = 2,
    MOONLET_REPL_PLACE = 3,
    MOONLET_REPL_SEAL = 4,
    MOONLET_REPL_DROP = 5,
    MOONLET_REPL_QUAR = 6, /* snapshots only: rep_seg[0] / rep_off[0], size bytes, free_ms */
    MOONLET_REPL_RESV = 7, /* rep_seg[0] / rep_off[0], size bytes */
    MOONLET_REPL_UNRESV = 8,
};
#define MOONLET_REPL_FLAG_SOFT_PIN 1u
#define MOONLET_REPL_FLAG_HARD_PIN 2u
#define MOONLET_REPL_FLAG_CHECKSUM 4u
#define MOONLET_REPL_FLAG_SEALED 8u /* PLACE: sealed at once (checksum, pin TTL as SEAL's) */
#define MOONLET_REPL_MAX_REPS 8u
typedef struct moonlet_repl_rec {
    uint8_t type;
    uint8_t flags;
    uint32_t tenant_id;
    moonlet_str tenant;       /* PLACE: the tenant's name */
    moonlet_str key;
    uint64_t size;
    uint64_t ttl_ms;          /* PLACE: ms left to the put deadline */
    uint64_t pin_ttl_ms;      /* PLACE with FLAG_SOFT_PIN: the pin's TTL */
    uint64_t free_ms;         /* PLACE, DROP: see above */
    uint64_t checksum;        /* SEAL with FLAG_CHECKSUM; PLACE of a put in progress:
                               * its put id << 8 | its replacements */
    uint32_t nrep;
    moonlet_str rep_seg[MOONLET_REPL_MAX_REPS]; /* segment ids */
    uint64_t rep_off[MOONLET_REPL_MAX_REPS];
    moonlet_str client_id, segment_id;          /* UNMOUNT */
    const struct moonlet_segment_desc *seg;     /* MOUNT */
    moonlet_str secret;       /* MOUNT: the owner's BindClient secret (may be empty) */
    int64_t clock_offset_ms;  /* MOUNT: the leader's bound of node clock - its clock */
} moonlet_repl_rec;

typedef struct moonlet_master_config {
    uint32_t shards;                  /* metadata shards (1024) */
    uint64_t lease_ttl_ms;            /* default_kv_lease_ttl (5000) */
    uint64_t soft_pin_ttl_ms;         /* default_kv_soft_pin_ttl (30 min) */
    double eviction_high_watermark;   /* 0.90 */
    double eviction_ratio;            /* 0.05 */
    uint64_t client_live_ttl_ms;      /* 10000 */
    uint64_t put_timeout_ms;          /* PutStart without PutEnd is revoked after this (60000) */
    uint64_t put_quarantine_grace_ms; /* a range freed from an unfinished put is reused only
                                       * this long after its put deadline (2000) */
    uint32_t background_interval_ms;  /* eviction / liveness check period (100) */
    bool background;                  /* run the eviction and liveness thread */
    uint32_t max_tenants;             /* live tenants at most (65536, the most ids allow) */
    double hard_pin_max_ratio;        /* hard-pinned bytes (size x replicas) at most this
                                       * share of the capacity (0.5); 0: no hard pins */
    /* Replication (master/ha/replicate.c): called with every metadata change
     * as it happens (moonlet_repl_rec below), under the locks of the change
     * (a shard lock and/or registry.mu): it must only copy the record into a
     * queue guarded by a leaf lock, and must not call back into the master.
     * NULL: no replication. */
    void (*repl_emit)(void *arg, const struct moonlet_repl_rec *rec);
    void *repl_arg;
    /* With repl_emit: the stream's positions (arg: repl_arg).  *next: the
     * number the next record gets; *acked: the standby applied every record
     * below it (0: none, or no standby in sync).  Called under registry.mu;
     * it may take only a leaf lock.  Set, PutStarts of small objects are
     * placed in ranges reserved ahead (RESV) once the standby applied their
     * reservation, and need no wait of their own (put_opts.covered).  NULL:
     * no reservations; every write waits. */
    void (*repl_pos)(void *arg, uint64_t *next, uint64_t *acked);
    /* Re-replication (repair.c): bytes per second handed to repair copies
     * (256 MiB/s), copies in flight at once (16), how long a node has to
     * finish one (30000 ms) and how many attempts an object gets (5). */
    uint64_t repair_bandwidth;
    uint32_t repair_concurrency;
    uint64_t repair_timeout_ms;
    uint32_t repair_max_attempts;
    /* Demotion to the disk tier (repair.c): demotions queued or running at
     * most (4096; eviction beyond it destroys instead of waiting, counted),
     * and copies in flight at once (64).  They take no repair bandwidth. */
    uint32_t demote_queue;
    uint32_t demote_concurrency;
    /* The coldest fraction of the DRAM objects that gets a disk copy ahead
     * of eviction (0.5; 0: none), so that eviction under a flood of puts
     * demotes them at once instead of destroying them. */
    double demote_ahead_ratio;
    /* Index entries a liveness check strips per call (unmount.c), so a mass
     * failure is spread over ticks (0: 65536).  The simulator (tests/sim)
     * sets it low, so that an unmount is in progress across other calls. */
    uint32_t unmount_tick_budget;
    /* Test hook: called by BatchProbeKey(LAST_HIT_ONLY) between the scan and
     * the validation phase, and by ProbeResume before each candidate's
     * validation, with no master lock held. */
    void (*probe_hook)(void *arg);
    void *probe_hook_arg;
} moonlet_master_config;

/* Fills the defaults above. */
void moonlet_master_config_default(moonlet_master_config *cfg);

int moonlet_master_create(const moonlet_master_config *cfg, moonlet_master **out);
void moonlet_master_destroy(moonlet_master *m);

/* ---- clients and segments ---------------------------------------------- */

/* Records that a client is alive.  *segments_out (optional) gets the number
 * of segments the master has mounted for it: a store node that sees 0 after
 * it mounted one knows the master forgot it (restart, or declared dead) and
 * mounts again. */
int moonlet_master_ping(moonlet_master *m, moonlet_str client_id, uint32_t *segments_out);
/* A Ping's optional node clock: node_ms is the node's CLOCK_MONOTONIC (ms) when
 * it sent the Ping.  Refreshes the clock offset bound of the client's segments
 * (node clock - master clock, a lower bound; see docs/reliability.md). */
void moonlet_master_note_node_clock(moonlet_master *m, moonlet_str client_id, uint64_t node_ms);
/* The leader epoch this master serves in (HA; the service sets it on every
 * call it lets through): every write capability issued from now on carries
 * it (common/writecap.h), so a node that has seen a newer one refuses it.
 * Raises only. */
void moonlet_master_set_epoch(moonlet_master *m, uint64_t epoch);

/* Largest segment a node may mount: 1 PiB.  With at most 4096 segments the
 * capacity total stays far from 2^64, and base + size never wraps. */
#define MOONLET_MAX_SEGMENT_BYTES (UINT64_C(1) << 50)

/* SEGMENT_ALREADY_EXISTS when the segment id is mounted; INVALID_PARAMS for
 * bad fields, a size above MOONLET_MAX_SEGMENT_BYTES or a base + size that
 * wraps. Mounting counts as a ping of the owner. */
int moonlet_master_mount_segment(moonlet_master *m, const moonlet_segment_desc *seg);
/* Replicas on the segment stop being readable; objects left with no replica
 * are removed.  SEGMENT_NOT_FOUND, or ILLEGAL_CLIENT when owned by another client. */
int moonlet_master_unmount_segment(moonlet_master *m, moonlet_str client_id,
                                   moonlet_str segment_id);

/*
 * Identity of store nodes, for the RPC service: `session` names the
 * connection a call came on (non-zero, never reused).  A client id belongs
 * to the session that first pinged, mounted or bound it; calls for it from
 * another session are ILLEGAL_CLIENT.  bind_client also records a secret
 * (1..64 bytes): a later session that presents the same secret takes the
 * id over (a reconnect), any other secret is ILLEGAL_CLIENT until the
 * client expires (no ping for client_live_ttl).  An id bound without a
 * secret can be claimed by a new session only once its session closed.
 * session_closed unbinds a closed connection's ids, and forgets those with
 * no mounted segment (a node that shut down cleanly).  The calls without
 * a session are the library's own (tests, tools): always allowed.
 */
int moonlet_master_bind_client(moonlet_master *m, moonlet_str client_id, moonlet_str secret,
                               uint64_t session);
int moonlet_master_ping_as(moonlet_master *m, moonlet_str client_id, uint64_t session,
                           uint32_t *segments_out);
/* A node's disk tier figures from its Ping (n values in the order of
 * node_disk_fields.h; extra ones ignored, missing ones 0): kept for the
 * node while it is known, shown with its disk segments and summed over the
 * nodes in moonlet_master_stats.  Nothing for an unknown client. */
void moonlet_master_note_node_disk(moonlet_master *m, moonlet_str client_id, const uint64_t *v,
                                   uint32_t n);
int moonlet_master_mount_segment_as(moonlet_master *m, const moonlet_segment_desc *seg,
                                    uint64_t session);
int moonlet_master_unmount_segment_as(moonlet_master *m, moonlet_str client_id,
                                      moonlet_str segment_id, uint64_t session);
void moonlet_master_session_closed(moonlet_master *m, uint64_t session);

/* ---- objects ----------------------------------------------------------- */

typedef struct moonlet_replica_view {
    const char *segment_id;
    const char *segment_name;
    const char *endpoint;
    const char *protocol;
    const char *alt_segment_id, *alt_endpoint, *alt_protocol; /* NULL: one endpoint only */
    uint64_t base;
    uint64_t offset;
    uint64_t size;
    uint8_t status;
    /* On a disk segment (the node's disk tier): offset is the object's
     * extent there, read whole through the node (never written through the
     * transport). */
    bool disk;
    /* PutStart only (has_cap): the write capability of this replica and the
     * ms left until the put's deadline. */
    bool has_cap;
    uint64_t cap_len, cap_expiry_ms, cap_tag, put_ttl_ms;
} moonlet_replica_view;

typedef void (*moonlet_replica_visitor)(void *arg, const moonlet_replica_view *r);

/* Allocates replica_num replicas on distinct segments (status INITIALIZED)
 * and reports each to `visit`.  OBJECT_ALREADY_EXISTS when the key exists (also
 * while another put of it is in progress), NO_AVAILABLE_HANDLE when nothing
 * fits even after evicting for the request's space (or when the tenant table
 * is full), INVALID_PARAMS when the object is larger than all but fewer than
 * replica_num mounted segments (it can never fit; nothing is evicted),
 * INVALID_KEY / INVALID_PARAMS for bad input. */
int moonlet_master_put_start(moonlet_master *m, moonlet_str tenant, moonlet_str key, uint64_t size,
                             uint32_t replica_num, bool soft_pin, moonlet_replica_visitor visit,
                             void *arg);

/* PutStart's placement and pinning options (Mooncake's ReplicateConfig). */
typedef struct moonlet_master_put_opts {
    uint32_t replica_num;
    bool soft_pin;
    /* Never evicted (by the watermark pass or for a put's space); Remove,
     * forced or not, still removes it.  Refused with NO_AVAILABLE_HANDLE when
     * hard-pinned bytes would exceed cfg.hard_pin_max_ratio of the capacity. */
    bool hard_pin;
    uint64_t soft_pin_ttl_ms;       /* with soft_pin: this object's pin TTL; 0: cfg.soft_pin_ttl_ms */
    const moonlet_str *preferred;   /* segment names tried first, in order (may be NULL) */
    uint32_t npreferred;            /* at most MOONLET_MAX_PREFERRED */
    /* Out (optional): set true when every replica went to a range the
     * in-sync standby already holds reserved (cfg.repl_pos): the reply need
     * not wait for the standby's ack of this put's PLACE. */
    bool *covered;
    /* Out (optional): this put's id (never 0, below 2^56), for
     * moonlet_master_put_end_ex / put_revoke_ex.  Kept by a promoted
     * standby (the PLACE record carries it). */
    uint64_t *put_id;
} moonlet_master_put_opts;
#define MOONLET_MAX_PREFERRED 64u

/* moonlet_master_put_start with options: replicas go to the preferred
 * segments first (a name that is unknown, unmounted or full is skipped),
 * the rest round-robin over the other segments, all distinct. */
int moonlet_master_put_start_opts(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                  uint64_t size, const moonlet_master_put_opts *opts,
                                  moonlet_replica_visitor visit, void *arg);
/* Seals a put: every replica becomes COMPLETE and the object readable.
 * checksum (optional): the writer's XXH3-64 of the bytes, returned to readers. */
int moonlet_master_put_end(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                           const uint64_t *checksum);
/* Abandons a put in progress: frees its replicas and forgets the key. */
int moonlet_master_put_revoke(moonlet_master *m, moonlet_str tenant, moonlet_str key);
/* The same, for the put PutStart named *put_id (moonlet_master_put_opts.
 * put_id) only; put_id NULL: the put in progress under the key, whichever
 * it is (the calls above).  OBJECT_NOT_FOUND when the key's put in
 * progress is another one (the named put was reaped at its deadline,
 * revoked or lost its replicas, and the key was put again since): a late
 * PutEnd or PutRevoke never seals nor kills another client's put (issue
 * 31, finding 5).  INVALID_WRITE as before when the key's object is
 * sealed. */
int moonlet_master_put_end_ex(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                              const uint64_t *checksum, const uint64_t *put_id);
int moonlet_master_put_revoke_ex(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                 const uint64_t *put_id);

/*
 * PutReplaceReplica: the writer could not write the replica of a put in
 * progress on segment `failed` (a dead or unreachable node, a failed
 * transfer).  Places one replacement on a mounted segment that holds no
 * replica of the object and is none of excluded[] (segment ids the writer
 * already saw fail for this put; unknown ids are ignored) nor `failed`, and
 * reports it to `visit` with a fresh write capability (expiring at the put's
 * unchanged deadline).  The failed replica's range goes to quarantine until
 * the put deadline + the grace, as an unfinished put's ranges do (its writer
 * may still have bytes in flight there).  When the failed segment already
 * lost its replica (an unmount stripped it), the replacement takes the free
 * place.  At most MOONLET_MAX_PUT_REPLACEMENTS per put.
 * Errors: OBJECT_NOT_FOUND (no such key), INVALID_WRITE (the put was sealed,
 * or its deadline passed), INVALID_PARAMS (`failed` holds no replica of the
 * put and none is missing; more than MOONLET_MAX_EXCLUDED excluded ids),
 * UNAVAILABLE_IN_CURRENT_STATUS (the put used its replacements),
 * NO_AVAILABLE_HANDLE (no other segment has room: nothing changed),
 * INVALID_KEY.  On any error the put is unchanged.
 */
#define MOONLET_MAX_PUT_REPLACEMENTS 4u
#define MOONLET_MAX_EXCLUDED 16u
int moonlet_master_put_replace_replica(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                       moonlet_str failed, const moonlet_str *excluded,
                                       uint32_t nexcluded, moonlet_replica_visitor visit,
                                       void *arg);

/* Reports the readable replicas and grants a read lease.  OBJECT_NOT_FOUND, or
 * REPLICA_IS_NOT_READY while the put is in progress. *size and *lease_ttl_ms optional. */
int moonlet_master_get_replica_list(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                    uint64_t *size, uint64_t *lease_ttl_ms,
                                    moonlet_replica_visitor visit, void *arg);
/* The same, and the checksum PutEnd recorded (*has_checksum false: none). */
int moonlet_master_get_replica_list_ck(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                                       uint64_t *size, uint64_t *lease_ttl_ms,
                                       bool *has_checksum, uint64_t *checksum,
                                       moonlet_replica_visitor visit, void *arg);

/* Existence with Mooncake semantics: a readable hit is leased. */
int moonlet_master_exist_key(moonlet_master *m, moonlet_str tenant, moonlet_str key, bool *exists);
int moonlet_master_batch_exist_key(moonlet_master *m, moonlet_str tenant, const moonlet_str *keys,
                                   size_t n, int32_t *results);

/* Existence without any lease. */
int moonlet_master_probe_key(moonlet_master *m, moonlet_str tenant, moonlet_str key, bool *exists);
/* BatchProbeKey with a GrantLeasePolicy; see docs/probe-policy.md.  Returns
 * INVALID_PARAMS (and leases nothing) for an invalid policy; otherwise 0 with
 * one result per key (for LAST_HIT_ONLY: the selected-only mask, or the scan's
 * per-key errors with every other position false). */
int moonlet_master_batch_probe_key(moonlet_master *m, moonlet_str tenant,
                                   const moonlet_grant_lease_policy *policy,
                                   const moonlet_str *keys, size_t n, int32_t *results);

/*
 * ProbeResume: the K3 lookup in one call (master/store/probe_resume.c,
 * docs/probe-policy.md).  kv: the request's KV keys in order; kda: n_kda
 * keys, candidates of candidate_size contiguous keys in order of increasing
 * resume position; boundaries[c]: the leading KV keys candidate c needs
 * (n_boundaries = n_kda / candidate_size, each <= n_kv).  out->kv_prefix gets
 * the leading readable KV keys; out->selected the last candidate whose
 * boundary is within the prefix and whose every KDA key (and every KV key
 * below its boundary) is readable under its locks, or -1; mask[i] (n_kda) is
 * 1 exactly at the selected candidate's keys.  Leases exactly the selected
 * candidate's KDA keys and kv[0..boundary); nothing when none is selected.
 * INVALID_PARAMS (nothing leased): candidate_size 0 or not dividing a
 * nonempty kda, a boundary count other than n_kda / candidate_size, a
 * boundary above n_kv.  INVALID_KEY: any key empty or over-long.
 */
typedef struct moonlet_probe_resume_out {
    uint64_t kv_prefix;
    int64_t selected; /* -1: none */
} moonlet_probe_resume_out;
int moonlet_master_probe_resume(moonlet_master *m, moonlet_str tenant, const moonlet_str *kv,
                                size_t n_kv, const moonlet_str *kda, size_t n_kda,
                                uint64_t candidate_size, const uint64_t *boundaries,
                                size_t n_boundaries, moonlet_probe_resume_out *out,
                                int32_t *mask);

/* OBJECT_HAS_LEASE while a lease holds; REPLICA_IS_NOT_READY while a put is in progress. */
int moonlet_master_remove(moonlet_master *m, moonlet_str tenant, moonlet_str key);
/* Removes every object of the tenant that has no unexpired lease and no put
 * in progress; *removed gets the count. */
int moonlet_master_remove_all(moonlet_master *m, moonlet_str tenant, uint64_t *removed);
/* The same with Mooncake's force: with force, an object under an unexpired
 * read lease is removed too (a reader still transferring may then read
 * bytes of whatever is placed there next); a put in progress never is. */
int moonlet_master_remove_ex(moonlet_master *m, moonlet_str tenant, moonlet_str key, bool force);
int moonlet_master_remove_all_ex(moonlet_master *m, moonlet_str tenant, bool force,
                                 uint64_t *removed);

/* Runs one eviction pass now, whatever the watermark (tests, admin). Returns objects evicted. */
uint64_t moonlet_master_evict_now(moonlet_master *m, double ratio);
/* One pass of the background work: watermark eviction, put timeouts, liveness. */
void moonlet_master_tick(moonlet_master *m);

/* ---- promotion with state (master/ha/replicate.c) --------------------------- */

/* Recreates an object of the replication stream on a master that has its
 * segments mounted: the exact ranges (each must be free: NO_AVAILABLE_HANDLE
 * otherwise, SEGMENT_NOT_FOUND for an unknown segment id), sealed (readable,
 * with a fresh read lease so nothing is evicted before engines resume) or
 * pending (kept until ttl_ms, the put deadline left).  OBJECT_ALREADY_EXISTS
 * when the key exists.  `rec` is a PLACE record; sealed/has_checksum/checksum
 * what SEAL said. */
int moonlet_master_restore_object(moonlet_master *m, const moonlet_repl_rec *rec, bool sealed,
                                  bool has_checksum, uint64_t checksum);
/* Gives a restored client (no session yet) the secret its node bound with,
 * so only that node (not a restarted one) takes the id over.  ILLEGAL_CLIENT
 * when the client already has another secret; CLIENT_NOT_FOUND... as
 * INVALID_PARAMS when unknown. */
int moonlet_master_restore_client_secret(moonlet_master *m, moonlet_str client_id,
                                         moonlet_str secret);
/* Holds [offset, +len) of a mounted segment back for ttl_ms (a range the
 * leader had quarantined).  Errors as above. */
int moonlet_master_restore_quarantine(moonlet_master *m, moonlet_str segment_id, uint64_t offset,
                                      uint64_t len, uint64_t ttl_ms);
/* Holds [offset, +len) back for a put timeout + the quarantine grace: a
 * range the leader had reserved for PutStarts (RESV), where a put this
 * master never heard of may be writing until its deadline.  Errors as above. */
int moonlet_master_restore_reserved(moonlet_master *m, moonlet_str segment_id, uint64_t offset,
                                    uint64_t len);

/* No client misses its liveness deadline for the next `ms` (unmounts
 * already begun go on).  A master promoted with state calls it: the nodes
 * it restored cannot ping it before it serves (they get NOT_LEADER in its
 * grace period), so their liveness must count from when it serves, not from
 * the promotion. */
void moonlet_master_hold_liveness(moonlet_master *m, uint64_t ms);

/* The whole metadata as records (master/store/snapshot.c): MOUNT, QUAR and RESV per
 * segment, then PLACE (+ SEAL when sealed) per object.  Fuzzy: the master
 * keeps serving; emit runs under the master's locks (it must only copy). */
void moonlet_master_snapshot(moonlet_master *m,
                             void (*emit)(void *arg, const moonlet_repl_rec *rec), void *arg);
/* The same in parts, for a snapshot larger than one reply should be.
 * cursor 0 starts: the segments (MOUNT, QUAR), then the objects of whole
 * shards until full(arg) says the part is big enough (checked after each
 * shard; NULL: never).  *next: the cursor of the next part, 0 when this
 * part ended the snapshot.  INVALID_PARAMS for a cursor no part returned. */
int moonlet_master_snapshot_part(moonlet_master *m, uint64_t cursor,
                                 bool (*full)(void *arg),
                                 void (*emit)(void *arg, const moonlet_repl_rec *rec), void *arg,
                                 uint64_t *next);

/* ---- re-replication (repair.c) ------------------------------------------ */

/*
 * When a segment leaves (liveness, unmount, drain), each sealed object left
 * with fewer readable replicas than it was put with is queued.  The master
 * reserves a range for the missing replica on another host (a job); the
 * target node fetches its jobs (RepairFetch), reads the bytes from a
 * surviving replica over the data plane, checks the checksum PutEnd
 * recorded, writes them into its segment and reports (RepairDone).  Only
 * then does the new replica join the object and become readable.
 */
typedef struct moonlet_repair_job_view {
    uint64_t job_id;
    uint64_t size;
    bool has_checksum;
    uint64_t checksum;
    /* The range to fill, with its write capability (has_cap) and the ms
     * left until the job's deadline (put_ttl_ms). */
    const moonlet_replica_view *target;
    const moonlet_replica_view *sources; /* readable replicas to copy from */
    uint32_t nsources;
    /* A demotion (the target is on one of the node's disk segments): the
     * node writes the bytes to its disk tier at the target's extent, under
     * this tenant and key (the disk header's; common/disk_layout.h). */
    bool demote;
    moonlet_str tenant, key;
} moonlet_repair_job_view;

/* Hands the jobs whose target is one of client_id's segments (at most max)
 * to visit, which runs under the master's locks.  ILLEGAL_CLIENT as Ping. */
int moonlet_master_repair_fetch(moonlet_master *m, moonlet_str client_id, uint64_t session,
                                uint32_t max,
                                void (*visit)(void *arg, const moonlet_repair_job_view *j),
                                void *arg);
/* The outcome of a job (code 0: the target range holds the verified bytes).
 * OBJECT_NOT_FOUND when the job is unknown (timed out, or the object went). */
int moonlet_master_repair_done(moonlet_master *m, moonlet_str client_id, uint64_t session,
                               uint64_t job_id, int32_t code, uint64_t bytes);
/* A store node restarted with its disk tier tells what the disk holds
 * (DiskAnnounce): for each entry, an object of that tenant and key, size
 * and checksum on disk segment `segment_id` (the caller's) at extent
 * `offset`.  codes[i]: 0 (it is an object again, sealed, its one replica
 * there), OBJECT_ALREADY_EXISTS (the key was put again meanwhile: the
 * node drops its copy), NO_AVAILABLE_HANDLE or INVALID_PARAMS (the extent
 * is taken or outside the segment: dropped too).  The call fails whole
 * with ILLEGAL_CLIENT (as Ping), SEGMENT_NOT_FOUND (not the caller's disk
 * segment) or INVALID_PARAMS. */
typedef struct moonlet_disk_entry {
    moonlet_str tenant, key;
    uint64_t size, checksum, offset;
} moonlet_disk_entry;
int moonlet_master_disk_announce(moonlet_master *m, moonlet_str client_id, uint64_t session,
                                 moonlet_str segment_id, const moonlet_disk_entry *e, uint32_t n,
                                 int32_t *codes);
/* DiskTrim: the node of disk segment `segment_id` (the caller's) has
 * invalidated the extents at done[0..ndone) (offsets it was handed; the
 * array is sorted in place): they are free now.  Then visit gets up to max
 * extents freed by the master (a removal, an eviction) that the node must
 * invalidate next; until it does, the master does not reuse them.  Errors
 * as DiskAnnounce. */
int moonlet_master_disk_trim(moonlet_master *m, moonlet_str client_id, uint64_t session,
                             moonlet_str segment_id, uint64_t *done, uint32_t ndone, uint32_t max,
                             void (*visit)(void *arg, uint64_t offset, uint64_t len), void *arg);
/* Drains (drain true) or undrains the segments named `target`: a segment
 * id, a segment name, an endpoint or the client id of the node holding them.  A draining
 * segment takes no new replica and its objects are re-replicated elsewhere.
 * *segments (optional): how many segments changed.  SEGMENT_NOT_FOUND. */
int moonlet_master_drain(moonlet_master *m, moonlet_str target, bool drain, uint32_t *segments);

/* ---- inspection -------------------------------------------------------- */

typedef struct moonlet_segment_view {
    const char *segment_id;
    const char *name;
    const char *client_id;
    const char *endpoint;
    const char *protocol;
    const char *alt_segment_id, *alt_endpoint, *alt_protocol; /* NULL: one endpoint only */
    uint64_t base;
    uint64_t capacity;
    uint64_t used;
    uint64_t objects;
    uint64_t last_ping_age_ms;
    bool draining;               /* moonlet_master_drain: objects leave, no new put lands */
    bool disk;                   /* a disk segment (a node's disk tier) */
    const uint64_t *node_disk;   /* a disk segment whose node sent its disk tier's figures:
                                  * MOONLET_NODE_DISK_NFIELDS of them; else NULL */
} moonlet_segment_view;

/* Every mounted segment (in pages internally: the registry lock is never
 * held across the whole list, nor while visit runs). */
int moonlet_master_list_segments(moonlet_master *m,
                                 void (*visit)(void *arg, const moonlet_segment_view *s),
                                 void *arg);

#define MOONLET_LIST_SEGMENTS_MAX_LIMIT 10000u
#define MOONLET_LIST_SEGMENTS_DEFAULT_LIMIT 1000u
/*
 * One page of mounted segments in slot order: up to `limit` (1..10000) from
 * `cursor` (0: the first page); *next_cursor is where the next page starts,
 * 0 after the last.  No segment comes twice in one listing; one mounted or
 * unmounted meanwhile may or may not appear.  client_id (NULL: all): only
 * that client's segments, in one page.  The registry lock is held while a
 * chunk of segments is copied, never while visit runs.
 */
int moonlet_master_list_segments_page(moonlet_master *m, const char *client_id, uint64_t cursor,
                                      uint32_t limit,
                                      void (*visit)(void *arg, const moonlet_segment_view *s),
                                      void *arg, uint64_t *next_cursor);

typedef struct moonlet_key_view {
    const char *key;
    uint32_t key_len;
    uint64_t size;
    bool complete;               /* PutEnd done */
    uint32_t replicas;
    uint32_t readable_replicas;
    uint64_t lease_remaining_ms; /* 0: no lease */
    uint64_t soft_pin_remaining_ms;
    bool hard_pinned;
} moonlet_key_view;

/* Pages through a tenant's keys in a stable order (by key hash).  `cursor` is
 * "" for the first page and the returned *next_cursor for the following ones;
 * *next_cursor is "" after the last page.  At most `limit` keys per page
 * (1..10000). */
#define MOONLET_CURSOR_BYTES 40
int moonlet_master_list_keys(moonlet_master *m, moonlet_str tenant, moonlet_str prefix,
                             moonlet_str cursor, uint32_t limit,
                             void (*visit)(void *arg, const moonlet_key_view *k), void *arg,
                             char next_cursor[MOONLET_CURSOR_BYTES]);

/* A tenant holding objects: its name, its objects (complete or being put)
 * and their bytes (object sizes, one replica each). */
typedef struct moonlet_tenant_view {
    const char *name;
    uint32_t name_len;
    uint64_t keys;
    uint64_t bytes;
} moonlet_tenant_view;

/* ListTenants: every tenant that holds objects, in name order, the first
 * `limit` (1..MOONLET_LIST_TENANTS_MAX_LIMIT) visited; *total: how many hold
 * objects.  Walks every shard (guard shared, one shard lock at a time), then
 * names the tenants under tenants.lock; visit runs under no lock. */
#define MOONLET_LIST_TENANTS_DEFAULT_LIMIT 1000u
#define MOONLET_LIST_TENANTS_MAX_LIMIT 65536u
int moonlet_master_list_tenants(moonlet_master *m, uint32_t limit,
                                void (*visit)(void *arg, const moonlet_tenant_view *t), void *arg,
                                uint32_t *total);

/* One key: its summary, then each replica (all statuses). OBJECT_NOT_FOUND. */
int moonlet_master_inspect_key(moonlet_master *m, moonlet_str tenant, moonlet_str key,
                               moonlet_key_view *summary, moonlet_replica_visitor visit,
                               void *arg);

#define MOONLET_LOCK_HIST_BUCKETS 12 /* <1us, <2us, <4us ... <1024us, >=1024us */

typedef struct moonlet_master_stats {
    uint64_t objects;
    uint64_t bytes;             /* sum of object sizes */
    uint64_t segments;
    uint64_t capacity;
    uint64_t used;
    uint64_t clients;
    uint64_t tenants;           /* live tenants (each holds objects or a PutStart in flight) */
    uint64_t put_starts, put_ends, put_revokes, put_timeouts;
    uint64_t put_starts_reserved; /* placed in reserved ranges (no standby wait) */
    uint64_t removes;
    uint64_t evictions;
    uint64_t eviction_passes;
    uint64_t leases_get;        /* leases granted by GetReplicaList */
    uint64_t leases_exist;      /* by ExistKey / BatchExistKey */
    uint64_t leases_probe;      /* by BatchProbeKey (keys leased by probes) */
    uint64_t probe_calls_none;
    uint64_t probe_calls_last_hit;
    uint64_t probe_candidates_examined;
    uint64_t probe_recheck_fallbacks;
    uint64_t probe_lock_hold_hist[MOONLET_LOCK_HIST_BUCKETS];
    uint64_t probe_lock_hold_max_ns;
    uint64_t unmounts_by_liveness;
    uint64_t resume_calls;                /* ProbeResume calls */
    uint64_t resume_candidates_examined;  /* candidates validated under locks */
    uint64_t resume_recheck_fallbacks;    /* of which failed the recheck */
    uint64_t leases_resume_kda;           /* KDA keys leased by ProbeResume */
    uint64_t leases_resume_kv;            /* KV keys leased by ProbeResume */
    uint64_t resume_lock_hold_hist[MOONLET_LOCK_HIST_BUCKETS];
    uint64_t resume_lock_hold_max_ns;
    uint64_t quarantined;       /* bytes freed from unfinished puts, not yet reusable */
    uint64_t hard_pinned;       /* hard-pinned objects (puts in progress included) */
    uint64_t hard_pinned_bytes; /* their size x replicas: never evictable */
    uint64_t put_replacements;  /* replicas replaced by PutReplaceReplica */
    /* Re-replication (repair.c) */
    uint64_t under_replicated;  /* objects queued or being repaired */
    uint64_t repairs_queued;    /* waiting for a target (backoff included) */
    uint64_t repairs_running;   /* handed to a target node, not done */
    uint64_t repairs_done, repairs_failed, repairs_retried, repairs_dropped;
    uint64_t repair_bytes;      /* bytes copied by finished repairs */
    /* The disk tier */
    uint64_t disk_capacity, disk_used; /* bytes of the disk segments */
    uint64_t disk_segments;            /* mounted */
    uint64_t disk_objects;             /* objects the disk tier holds */
    uint64_t demotions_queued;         /* waiting for their copy, or copying */
    uint64_t demotions_staged;         /* copies made ahead of eviction, not yet joined */
    uint64_t demotions;                /* objects moved from DRAM to disk */
    uint64_t demotion_bytes;
    uint64_t demotions_dropped;        /* evicted without a copy: the queue was full, or the
                                        * disk had no room even after its own eviction */
    uint64_t demotions_failed;         /* copies a node reported failed or let time out */
    uint64_t disk_evictions;           /* disk-only objects evicted for room */
    uint64_t disk_announced;           /* objects a restarted node's disk brought back */
    uint64_t node_disk[MOONLET_NODE_DISK_NFIELDS]; /* the nodes' own figures, summed over
                                                    * the nodes the master knows */
} moonlet_master_stats;

void moonlet_master_get_stats(moonlet_master *m, moonlet_master_stats *st);

#endif
