/*
 * keepalive.h - the miss counting of the RDMA keepalive of served
 * connections (transport/xfer_verbs.c), pure: no verbs, no I/O, no clock.
 *
 * Owns: nothing but the caller's moonlet_keepalive values.  Takes no locks:
 * the caller serialises the calls for one connection (xfer_verbs.c makes them
 * on its CM thread under the instance's `lock`).
 *
 * The rule, as TCP keepalive counts probes: a healthy idle connection is
 * probed every `period` ms (one zero-length RDMA WRITE).  While a probe is
 * unacknowledged, each interval of period / MOONLET_KEEPALIVE_MISSES without
 * any acknowledgement is one miss, and another probe follows (on RC its
 * packet also makes the peer NAK a lost earlier one, so a lost packet is
 * resent at once instead of after the QP's ack timeout).  An acknowledgement
 * of any probe clears the misses; the MOONLET_KEEPALIVE_MISSES-th consecutive
 * miss - `period` after the first unacknowledged probe - declares the peer
 * gone.  So one late or lost probe never ends a healthy connection, and a
 * peer that vanished is declared gone within 2 x period (plus two of the
 * caller's ticks, which must not exceed an interval) of its last
 * acknowledgement.  At most one miss is counted per call: a caller that was
 * itself stalled (a loaded host) counts its stall as one miss, not as many.
 */
#ifndef MOONLET_KEEPALIVE_H
#define MOONLET_KEEPALIVE_H

#include <stdint.h>

/* Consecutive misses that declare the peer gone; also the most probes a
 * connection has outstanding (its send queue's depth). */
#define MOONLET_KEEPALIVE_MISSES 4u

typedef struct moonlet_keepalive {
    uint64_t due_ms;      /* idle: when the next probe is due; probing: the next miss deadline */
    uint32_t outstanding; /* probes posted and not yet completed */
    uint32_t misses;      /* consecutive intervals without an acknowledgement */
} moonlet_keepalive;

typedef enum moonlet_keepalive_action {
    MOONLET_KEEPALIVE_WAIT = 0, /* nothing to do now */
    MOONLET_KEEPALIVE_PROBE,    /* post a probe, then call moonlet_keepalive_posted */
    MOONLET_KEEPALIVE_GONE,     /* too many misses: tear the connection down */
} moonlet_keepalive_action;

/* The interval that counts one miss: period / MOONLET_KEEPALIVE_MISSES, >= 1. */
uint64_t moonlet_keepalive_interval(uint32_t period_ms);

/* A new connection: its first probe is due one period from now. */
void moonlet_keepalive_init(moonlet_keepalive *k, uint64_t now_ms, uint32_t period_ms);

/* What to do at now_ms.  Counts at most one miss per call. */
moonlet_keepalive_action moonlet_keepalive_tick(moonlet_keepalive *k, uint64_t now_ms,
                                                uint32_t period_ms);

/* A probe was posted (after MOONLET_KEEPALIVE_PROBE). */
void moonlet_keepalive_posted(moonlet_keepalive *k, uint64_t now_ms, uint32_t period_ms);

/* A probe completed successfully: the peer is alive; the misses are cleared. */
void moonlet_keepalive_acked(moonlet_keepalive *k, uint64_t now_ms, uint32_t period_ms);

#endif
