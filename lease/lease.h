/*
 * lease.h - read-lease and soft-pin rules (pure; no locks, no I/O).
 *
 * A read lease protects an object from eviction and removal until its
 * deadline.  Granting never shortens a lease: deadline = max(deadline,
 * now + ttl).  A deadline of 0 means "never leased".  The same rule extends
 * soft pins.
 */
#ifndef MOONLET_LEASE_H
#define MOONLET_LEASE_H

#include <stdbool.h>
#include <stdint.h>

#include "clock.h"

#define MOONLET_DEFAULT_LEASE_TTL_MS 5000u
#define MOONLET_DEFAULT_SOFT_PIN_TTL_MS (30u * 60u * 1000u)

/* The deadline after granting a lease of ttl_ns at time now_ns. */
static inline uint64_t moonlet_lease_grant(uint64_t deadline_ns, uint64_t now_ns, uint64_t ttl_ns)
{
    uint64_t want = now_ns + ttl_ns;
    return want > deadline_ns ? want : deadline_ns;
}

/* True while the lease holds. */
static inline bool moonlet_lease_active(uint64_t deadline_ns, uint64_t now_ns)
{
    return deadline_ns > now_ns;
}

/* Milliseconds left (rounded up), 0 when expired or never granted. */
static inline uint64_t moonlet_lease_remaining_ms(uint64_t deadline_ns, uint64_t now_ns)
{
    if (deadline_ns <= now_ns)
        return 0;
    return (deadline_ns - now_ns + MOONLET_NS_PER_MS - 1) / MOONLET_NS_PER_MS;
}

#endif
