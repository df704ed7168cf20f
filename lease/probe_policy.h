/*
 * probe_policy.h - pure selection logic of BatchProbeKey's GrantLeasePolicy.
 *
 * Validation, candidate grouping and the walk order live here, without locks
 * or I/O, so they can be tested alone; master/store/probe.c executes them under the
 * snapshot guard and shard locks.
 *
 * Scan results use the batch convention: 1 readable, 0 not readable,
 * negative = lookup error for that key.
 */
#ifndef MOONLET_LEASE_POLICY_H
#define MOONLET_LEASE_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "moonlet/policy.h"

/*
 * Checks a policy for a request of n keys.  Returns 0, or
 * MOONLET_ERR_INVALID_PARAMS for an unknown mode, or - for a nonempty
 * LAST_HIT_ONLY request - a zero candidate_size or one that does not divide n.
 */
int moonlet_policy_validate(const moonlet_grant_lease_policy *p, size_t n);

/* Number of candidates of a validated LAST_HIT_ONLY request (n / size). */
size_t moonlet_policy_candidates(const moonlet_grant_lease_policy *p, size_t n);

/* The first error (< 0) in a scan, or 0 when there is none. */
int moonlet_policy_scan_error(const int32_t *scan, size_t n);

/*
 * Walk order of phase 2: writes into order[] the indices of the candidates
 * whose every member was readable in the scan, from the last candidate to the
 * first, and returns how many.  order[] must hold n / candidate_size entries.
 */
size_t moonlet_policy_walk_order(const int32_t *scan, size_t n, uint64_t candidate_size,
                                 uint32_t *order);

/* Writes the selected-only mask: 1 at candidate `selected`'s positions, 0
 * elsewhere.  selected < 0 writes all zeros (nothing selected). */
void moonlet_policy_fill_mask(int32_t *results, size_t n, uint64_t candidate_size, long selected);

#endif
