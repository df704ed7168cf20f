/*
 * probe_policy.c - validation, grouping and walk order for GrantLeasePolicy.
 *
 * Pure functions over arrays: no locks, no I/O, no allocation.  The master
 * calls them around its two probe phases (see master/store/probe.c).
 */
#include "probe_policy.h"

#include "moonlet/error.h"

int moonlet_policy_validate(const moonlet_grant_lease_policy *p, size_t n)
{
    switch (p->lease_mode) {
    case MOONLET_PROBE_LEASE_NONE:
        return MOONLET_OK;
    case MOONLET_PROBE_LEASE_LAST_HIT_ONLY:
        if (n == 0)
            return MOONLET_OK;
        if (p->candidate_size == 0 || n % p->candidate_size != 0)
            return MOONLET_ERR_INVALID_PARAMS;
        return MOONLET_OK;
    default:
        return MOONLET_ERR_INVALID_PARAMS;
    }
}

size_t moonlet_policy_candidates(const moonlet_grant_lease_policy *p, size_t n)
{
    return p->candidate_size ? n / p->candidate_size : 0;
}

int moonlet_policy_scan_error(const int32_t *scan, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (scan[i] < 0)
            return scan[i];
    return MOONLET_OK;
}

size_t moonlet_policy_walk_order(const int32_t *scan, size_t n, uint64_t candidate_size,
                                 uint32_t *order)
{
    size_t ncand = n / candidate_size, count = 0;
    for (size_t c = ncand; c-- > 0;) {
        const int32_t *member = scan + c * candidate_size;
        size_t k = 0;
        while (k < candidate_size && member[k] == 1)
            k++;
        if (k == candidate_size)
            order[count++] = (uint32_t)c;
    }
    return count;
}

void moonlet_policy_fill_mask(int32_t *results, size_t n, uint64_t candidate_size, long selected)
{
    for (size_t i = 0; i < n; i++)
        results[i] = 0;
    if (selected < 0)
        return;
    for (uint64_t k = 0; k < candidate_size; k++)
        results[(size_t)selected * candidate_size + k] = 1;
}
