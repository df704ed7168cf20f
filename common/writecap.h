/*
 * writecap.h - write capabilities: what lets a store node tell a write the
 * master granted from a stale one (docs/reliability.md, "Stale writers").
 *
 * A store node picks a random 16-byte key per segment registration and hands
 * it to the master at MountSegment.  For each replica of a put, the master
 * issues {offset, len, expiry, tag}: the allocated range [offset, offset+len)
 * and the last instant (the node's CLOCK_MONOTONIC, in ms) at which the node
 * may accept bytes for it, authenticated by
 *     tag = SipHash-2-4(key, segment id || 0 || be64 offset || be64 len || be64 expiry)
 * (libsodium's crypto_shorthash).  The node recomputes the tag before it
 * receives a write and refuses one whose capability is missing, forged, does
 * not cover the write's range or has expired.
 *
 * The leader's epoch (issue 31 section 3).  An HA leader puts its epoch
 * into each capability it issues, in the upper bits of len (bits 40-63:
 * the epoch's bits 22-45) and of expiry (bits 42-63: its bits 0-21), so
 * the tag covers it and the wire and every client stay as they were
 * (clients pass capabilities on untouched); a lone master's epoch is 0,
 * which leaves both fields as before.  A node refuses a genuine
 * capability of an epoch older than the newest it has seen (at Mount, at
 * Ping, or in a genuine capability): a leader frozen past its term cannot
 * have its old capabilities honoured once the node knows the next one.
 *
 * Pure: no locks, no I/O (moonlet_writecap_new_key reads getrandom).
 */
#ifndef MOONLET_WRITECAP_H
#define MOONLET_WRITECAP_H

#include <stdbool.h>
#include <stdint.h>

#define MOONLET_WRITECAP_KEY_BYTES 16u

typedef struct moonlet_writecap {
    uint64_t offset;    /* the allocated range the capability covers */
    uint64_t len;
    uint64_t expiry_ms; /* the store node's CLOCK_MONOTONIC, ms */
    uint64_t tag;
} moonlet_writecap;

#define MOONLET_WRITECAP_LEN_BITS 40u    /* a capability's range is shorter than 2^40 */
#define MOONLET_WRITECAP_EXPIRY_BITS 42u /* a node's clock reads below 2^42 ms */
#define MOONLET_WRITECAP_EPOCH_MAX ((UINT64_C(1) << 46) - 1)

/* Puts epoch (at most MOONLET_WRITECAP_EPOCH_MAX) into cap->len and
 * cap->expiry_ms, which must hold plain values; before the tag is computed. */
void moonlet_writecap_set_epoch(moonlet_writecap *cap, uint64_t epoch);
/* The epoch, range length and expiry a capability carries. */
uint64_t moonlet_writecap_epoch(const moonlet_writecap *cap);
uint64_t moonlet_writecap_len(const moonlet_writecap *cap);
uint64_t moonlet_writecap_expiry(const moonlet_writecap *cap);

/* The tag of (segment_id, offset, len, expiry_ms) under key (len and
 * expiry_ms as sent: with the epoch in them). */
uint64_t moonlet_writecap_tag(const uint8_t key[MOONLET_WRITECAP_KEY_BYTES],
                              const char *segment_id, uint64_t offset, uint64_t len,
                              uint64_t expiry_ms);

/* Whether cap is genuine for segment_id, covers [offset, offset + len) and has
 * not expired at now_ms (whatever its epoch: the caller compares that).
 * Constant-time tag comparison. */
bool moonlet_writecap_valid(const uint8_t key[MOONLET_WRITECAP_KEY_BYTES], const char *segment_id,
                            const moonlet_writecap *cap, uint64_t offset, uint64_t len,
                            uint64_t now_ms);

/* A fresh random key; 0, or MOONLET_ERR_INTERNAL_ERROR. */
int moonlet_writecap_new_key(uint8_t key[MOONLET_WRITECAP_KEY_BYTES]);

#endif
