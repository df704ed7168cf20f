/*
 * replicate.h - the metadata replication stream of a hot standby (issue 14).
 *
 * What it owns:
 *  - the record codec: moonlet_repl_rec (master.h; emitted by the master core
 *    through cfg.repl_emit) <-> bytes on the wire (docs/protocol.md,
 *    "Replication stream").  Decoding checks every length: bad input is
 *    INVALID_PARAMS, never a crash;
 *  - the standby's state (moonlet_repl_state): the segments and objects the
 *    leader has, as the records describe them, plus the ranges the leader
 *    holds in quarantine.  Applying records needs no master: the standby's
 *    own master stays empty (it serves nothing) until promotion;
 *  - promotion with state: moonlet_repl_state_restore rebuilds a (fresh)
 *    master from the state: segments mounted with their write keys, every
 *    object on its exact ranges, sealed ones with a fresh read lease,
 *    pending ones until their put deadline, quarantined ranges held back,
 *    and ranges reserved for PutStarts (RESV) held back for a put timeout
 *    + grace (a put of the old leader may be writing there).
 *
 * Times: records carry ms left; the state converts them to deadlines on the
 * lease clock (lease/clock.h) when applied, so tests freeze the clock.
 *
 * Not thread safe: the state belongs to one thread (the standby's receiver),
 * or the caller serialises.  Takes no master lock but through the master's
 * public calls in restore.
 */
#ifndef MOONLET_REPLICATE_H
#define MOONLET_REPLICATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "master.h"

/* Largest encoded record: 8 replicas of 255-byte ids, a 4096-byte key, a
 * mount's strings. */
#define MOONLET_REPL_MAX_REC_BYTES 16384u

/* Encodes rec into buf (cap bytes).  Returns the bytes written, or 0 when the
 * record is invalid or does not fit. */
size_t moonlet_repl_encode(const moonlet_repl_rec *rec, uint8_t *buf, size_t cap);

/* A decoded record: rec's strings point into `buf` (the decoded bytes) or
 * into this struct's own storage; valid while both live. */
typedef struct moonlet_repl_decoded {
    moonlet_repl_rec rec;
    moonlet_segment_desc seg;
    char client_id[MOONLET_MAX_ID_BYTES + 1], segment_id[MOONLET_MAX_ID_BYTES + 1];
    char name[MOONLET_MAX_ID_BYTES + 1], endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1];
    char protocol[16], alt_segment_id[MOONLET_MAX_ID_BYTES + 1];
    char alt_endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1], alt_protocol[16];
    uint8_t write_key[16];
} moonlet_repl_decoded;

/* Decodes exactly `len` bytes.  INVALID_PARAMS for anything malformed. */
int moonlet_repl_decode(const uint8_t *buf, size_t len, moonlet_repl_decoded *out);

typedef struct moonlet_repl_state moonlet_repl_state;

int moonlet_repl_state_create(moonlet_repl_state **out);
void moonlet_repl_state_destroy(moonlet_repl_state *st);
/* Forgets everything (before a fresh snapshot). */
void moonlet_repl_state_clear(moonlet_repl_state *st);

/* Applies one record.  Errors mean the state no longer matches the leader's
 * (a MOUNT of an id already mounted: SEGMENT_ALREADY_EXISTS; a PLACE on an
 * unknown segment: SEGMENT_NOT_FOUND; INVALID_PARAMS): the standby must then
 * start over from a snapshot.  SEAL and DROP of an unknown object are no-ops
 * (an unmount already took it). */
int moonlet_repl_state_apply(moonlet_repl_state *st, const moonlet_repl_rec *rec);

/* Applies one record of a snapshot part, as the follower does
 * (repl_stream.c): a part other than the first (first_part false) may name
 * a segment mounted after the first part's walk (its MOUNT comes in the
 * replay from the first part's position): an object's replicas there are
 * left out, and an object with none left is skipped (MOONLET_OK); a range
 * record there is skipped.  Other errors as moonlet_repl_state_apply. */
int moonlet_repl_state_apply_snapshot(moonlet_repl_state *st, const moonlet_repl_rec *rec,
                                      bool first_part);

/* A lower bound of (leader clock - this master's clock) in ms, measured by
 * the follower (the leader's clock in a reply minus this clock on receipt);
 * restore turns the leader's node clock offsets into this master's with it. */
void moonlet_repl_state_note_leader_clock(moonlet_repl_state *st, int64_t lb);
/* Whether a bound was noted since the state was last cleared; *lb gets it. */
bool moonlet_repl_state_leader_clock(const moonlet_repl_state *st, int64_t *lb);

typedef struct moonlet_repl_counts {
    uint64_t segments, objects, sealed, pending, quarantined;
    uint64_t reserved; /* ranges reserved for PutStarts (RESV) no PLACE took */
} moonlet_repl_counts;
void moonlet_repl_state_counts(const moonlet_repl_state *st, moonlet_repl_counts *out);

/* Rebuilds master m (which must hold no segment and no object) from the
 * state.  *restored / *skipped (optional): objects recreated / refused (a
 * range that was not free, which the record order rules out; logged).
 * Returns the first error of a segment mount (then m is half built: the
 * caller throws it away and starts empty). */
int moonlet_repl_state_restore(const moonlet_repl_state *st, moonlet_master *m,
                               uint64_t *restored, uint64_t *skipped);

#endif
