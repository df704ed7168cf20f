/*
 * policy.h - GrantLeasePolicy for BatchProbeKey.
 *
 * MOONLET_PROBE_LEASE_NONE: point-in-time existence per key; no lease is
 * granted or extended; candidate_size is ignored.
 *
 * MOONLET_PROBE_LEASE_LAST_HIT_ONLY: the n keys form n/candidate_size
 * candidates of candidate_size contiguous keys.  The last candidate whose
 * every member is readable is selected; exactly its members are leased, and
 * the result is a selected-only mask (true only at the selected candidate's
 * positions).  See docs/probe-policy.md.
 */
#ifndef MOONLET_POLICY_H
#define MOONLET_POLICY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MOONLET_PROBE_LEASE_NONE = 0,
    MOONLET_PROBE_LEASE_LAST_HIT_ONLY = 1,
} moonlet_probe_lease_mode;

typedef struct moonlet_grant_lease_policy {
    uint8_t lease_mode;      /* a moonlet_probe_lease_mode */
    uint64_t candidate_size; /* keys per candidate (LAST_HIT_ONLY) */
} moonlet_grant_lease_policy;

/* The default policy: NONE, candidate_size 1. */
#define MOONLET_GRANT_LEASE_POLICY_DEFAULT ((moonlet_grant_lease_policy){MOONLET_PROBE_LEASE_NONE, 1})

#ifdef __cplusplus
}
#endif
#endif
