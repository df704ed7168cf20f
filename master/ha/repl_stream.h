/*
 * repl_stream.h - the replication stream between a leader and its hot
 * standby (issue 14), on both ends.
 *
 * Leader: moonlet_repl_log keeps the records the master core emits
 * (cfg.repl_emit = moonlet_repl_log_emit), numbered from 1, and pushes them
 * to the standby: after a snapshot (ReplSnapshot, 30) the standby asks for
 * the records from its position (ReplStream, 32), and the connection becomes
 * the stream: the leader writes pushes, the standby answers each with an
 * ack of its new position (docs/protocol.md, "Replication stream").
 * Semi-synchronous writes: while the standby is in sync, a write's reply
 * waits (moonlet_repl_log_wait) until the standby acknowledged every record
 * emitted so far.  The waiting writer sends its records and reads the acks
 * itself when no other thread is doing so, so the wait is one round trip
 * to the standby with no hand-off between threads; a pusher thread sends
 * the records of operations that do not wait, and heartbeats.  When the
 * wait takes longer than max_lag_ms, or the stream is gone, the leader
 * first marks the standby out of sync (opts.mark: in etcd, fenced on its
 * epoch) and only then answers.  A standby that has acknowledged everything
 * is marked in sync again: writes wait from then on, then etcd names it.
 * One standby streams at a time: two masters.
 *
 * Standby: moonlet_repl_follower is a thread that follows the leader the
 * role knows (role.h), takes a snapshot (in parts of about
 * MOONLET_REPL_SNAPSHOT_PART_BYTES, so any size fits a reply), then applies the records to a
 * moonlet_repl_state (replicate.h), re-taking a snapshot whenever the
 * leader, its epoch or the stream's continuity changes.  At promotion the
 * owner stops it and restores its state only if etcd names this standby in
 * sync for the epoch it followed and the state is consistent.
 *
 * Locks: the log's mu is a leaf for emit (called under master locks: it only
 * copies); the stream's socket is written and read without it, by one
 * sender and one reader at a time; opts.mark runs with no lock held (one
 * marking at a time).  The
 * follower's state is its thread's, changed under the follower's smu (never
 * held across a call) so that a stop can take it without waiting for the
 * thread; its status takes the follower's mu (inside smu, never the
 * reverse).
 */
#ifndef MOONLET_REPL_STREAM_H
#define MOONLET_REPL_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "master.h"
#include "replicate.h"
#include "role.h"

typedef struct moonlet_repl_log moonlet_repl_log;

typedef struct moonlet_repl_log_opts {
    size_t max_bytes;    /* encoded records kept for a lagging standby; 0: 64 MiB */
    uint64_t max_lag_ms; /* semi-sync: longest wait for the standby's ack; 0: 300 */
    /* The pusher sends a record once it is this old (0: 2 ms); younger ones
     * are left to the writes that wait for them. */
    uint64_t push_after_ms;
    /* Names the standby in sync (true) or nobody (false) in etcd, fenced on
     * this leader's epoch; 0 on success.  NULL: succeeds (tests, no etcd). */
    int (*mark)(void *arg, bool in_sync, const char *standby);
    void *mark_arg;
} moonlet_repl_log_opts;

#define MOONLET_REPL_DEFAULT_MAX_LAG_MS 300u

int moonlet_repl_log_create(const moonlet_repl_log_opts *opts, moonlet_repl_log **out);
void moonlet_repl_log_destroy(moonlet_repl_log *l);
/* cfg.repl_emit of the leader's master (arg: the log). */
void moonlet_repl_log_emit(void *log, const moonlet_repl_rec *rec);
/* cfg.repl_pos of the leader's master (arg: the log): the next record's
 * number, and the position below which the standby applied every record. */
void moonlet_repl_log_pos(void *log, uint64_t *next, uint64_t *acked);
/* A new term or a new master: records and the standby are forgotten (the
 * standby is out of sync; etcd's mark is the election's business). */
void moonlet_repl_log_reset(moonlet_repl_log *l);
/* The number the next record gets. */
uint64_t moonlet_repl_log_next(moonlet_repl_log *l);

/* ReplStream, on the leader's replication server: `standby` asks for the
 * records from `from` on.  *lost: `from` is no longer (or not yet) in the
 * log: take a snapshot.  Otherwise *ticket names the stream to attach once
 * the reply is out (moonlet_repl_log_stream_attach).  UNAVAILABLE: another
 * standby streams (or it could not be unnamed in etcd). */
int moonlet_repl_log_stream_open(moonlet_repl_log *l, const char *standby, uint64_t from,
                                 uint64_t epoch, bool *lost, uint64_t *next, uint64_t *ticket);
/* The connection of ReplStream's reply becomes the stream (the log owns
 * fd, and tls, its TLS session on a TLS replication server, else NULL); a
 * ticket that is not the last one opened (a reset, a newer open) closes fd
 * (and frees tls) instead. */
struct moonlet_tls;
void moonlet_repl_log_stream_attach(moonlet_repl_log *l, uint64_t ticket, int fd,
                                    struct moonlet_tls *tls);
/* How long the standby waits for the next push (heartbeats come every
 * 200 ms) before it drops the connection. */
#define MOONLET_REPL_STREAM_TIMEOUT_MS 2200
/* ReplSnapshot: one part of the master's snapshot in the same framing
 * (moonlet_master_snapshot_part: `cursor` 0 first, then each *next_cursor
 * until it is 0), about `budget` bytes (0: the whole snapshot in one part);
 * *start: the log's next number before this part's walk (the stream
 * continues at the FIRST part's); *consistent_at: the log's next number
 * after it (the replay is consistent from the LAST part's on). */
/* What a standby asks per snapshot part, and the most parts it takes (a
 * leader has at most 2^20 shards, and a part walks one at least). */
#define MOONLET_REPL_SNAPSHOT_PART_BYTES (4u << 20)
#define MOONLET_REPL_SNAPSHOT_MAX_PARTS ((1u << 20) + 1)
int moonlet_repl_log_snapshot(moonlet_repl_log *l, moonlet_master *m, uint64_t cursor,
                              size_t budget, uint8_t **buf, size_t *len, uint64_t *start,
                              uint64_t *consistent_at, uint64_t *next_cursor);
/* Semi-sync: call after a write, before answering it.  0, or
 * UNAVAILABLE_IN_CURRENT_STATUS when the standby lagged and could not be
 * marked out of sync (the write must not be acknowledged). */
int moonlet_repl_log_wait(moonlet_repl_log *l);

typedef struct moonlet_repl_log_status {
    char standby[MOONLET_ROLE_ADDR_MAX]; /* "" : none streamed yet */
    bool in_sync, streaming;
    uint64_t next, acked;   /* the standby applied every record below `acked` */
    uint64_t lag_ms;        /* age of the oldest record it has not acknowledged */
    uint64_t last_ack_age_ms;
    uint64_t out_of_sync_marks, in_sync_marks;
    /* Semi-sync waits made while the standby was in sync; of them, those
     * whose records the standby had already acknowledged when the writer
     * began to wait (the ack raced the rest of the handler); and the time
     * they took in all (us).  Where a write's replication cost goes:
     * docs/benchmarks.md, "High availability". */
    uint64_t sync_waits, sync_acked_on_entry, sync_wait_us;
    /* Pushes carrying records, by waiting writers and by the pusher. */
    uint64_t writer_pushes, pusher_pushes;
} moonlet_repl_log_status;
void moonlet_repl_log_get_status(moonlet_repl_log *l, moonlet_repl_log_status *st);

/* ---- standby ---------------------------------------------------------------- */

typedef struct moonlet_repl_follower moonlet_repl_follower;

typedef struct moonlet_repl_follower_opts {
    const moonlet_role *role; /* whom to follow (the leader it names) */
    const char *advertise;    /* this standby's name for the leader */
    const char *auth_token;   /* the leader's client token (ReplPort); NULL: none */
    const char *peer_token;   /* the replication server's (service.h); NULL: auth_token */
    struct moonlet_tls_ctx *tls; /* client TLS to the leader (tls.h); NULL: plaintext */
} moonlet_repl_follower_opts;

int moonlet_repl_follower_start(const moonlet_repl_follower_opts *opts,
                                moonlet_repl_follower **out);
/* Hands over the state and tells the thread to end, without waiting for it:
 * the thread may be in a call to a leader that is gone, up to the call's
 * timeout (MOONLET_REPL_STREAM_TIMEOUT_MS), and a promotion (on the election's thread,
 * which sends no keepalive meanwhile) must not wait that out - with a 2 s
 * etcd lease the new leader's own lease expired during the wait.  From
 * here on the thread leaves the state alone.  *consistent when it replayed
 * past its snapshot's end and applied without divergence since; *epoch:
 * the leader epoch of its snapshot (0: none).  The caller destroys the
 * state (moonlet_repl_state_destroy) and, later, the follower (destroy
 * joins the thread, so it may wait for that call). */
moonlet_repl_state *moonlet_repl_follower_stop(moonlet_repl_follower *f, bool *consistent,
                                               uint64_t *epoch);
void moonlet_repl_follower_destroy(moonlet_repl_follower *f);
/* What a stop now would report as consistent, without stopping: true (and
 * *epoch, the leader epoch of its snapshot) when the state could be
 * restored.  A fast takeover asks it (master/ha/ha.c). */
bool moonlet_repl_follower_restorable(moonlet_repl_follower *f, uint64_t *epoch);

typedef struct moonlet_repl_follower_status {
    char leader[MOONLET_ROLE_ADDR_MAX];
    uint64_t epoch, applied, leader_next, snapshots, records;
    bool consistent, connected;
} moonlet_repl_follower_status;
void moonlet_repl_follower_get_status(moonlet_repl_follower *f, moonlet_repl_follower_status *st);

#endif
