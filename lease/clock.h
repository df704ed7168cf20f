/*
 * clock.h - the lease clock.
 *
 * Leases, soft pins, put timeouts and client liveness are all measured on one
 * monotonic clock in nanoseconds, so a wall-clock step (NTP, an operator's
 * `date -s`) never expires or extends a lease.  Tests may freeze the clock and
 * move it by hand (moonlet_clock_set_fake) to check deadlines exactly.
 * No locks: the fake clock is an atomic.
 */
#ifndef MOONLET_CLOCK_H
#define MOONLET_CLOCK_H

#include <stdint.h>

#define MOONLET_NS_PER_MS UINT64_C(1000000)
#define MOONLET_NS_PER_US UINT64_C(1000)

/* CLOCK_MONOTONIC in ns, or the fake time when one is set. */
uint64_t moonlet_clock_now_ns(void);
/* The real monotonic clock, whatever the fake says (for latency measurement). */
uint64_t moonlet_clock_real_ns(void);

/* Freezes the lease clock at `ns` (tests only); 0 returns to the real clock. */
void moonlet_clock_set_fake(uint64_t ns);
/* Advances a frozen clock by `delta_ns`. */
void moonlet_clock_advance(uint64_t delta_ns);

#endif
