/* Tests of lease/: GrantLeasePolicy validation, walk order, masks, lease rules. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "lease.h"
#include "moonlet/error.h"
#include "probe_policy.h"
#include "../common/test_main.h"

static moonlet_grant_lease_policy pol(uint8_t mode, uint64_t cs)
{
    return (moonlet_grant_lease_policy){.lease_mode = mode, .candidate_size = cs};
}

static void test_validate(void **state)
{
    (void)state;
    moonlet_grant_lease_policy p = pol(MOONLET_PROBE_LEASE_NONE, 0);
    assert_int_equal(moonlet_policy_validate(&p, 7), MOONLET_OK); /* size ignored */
    p = pol(MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 2);
    assert_int_equal(moonlet_policy_validate(&p, 6), MOONLET_OK);
    assert_int_equal(moonlet_policy_validate(&p, 5), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_policy_validate(&p, 0), MOONLET_OK);
    p = pol(MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 0);
    assert_int_equal(moonlet_policy_validate(&p, 4), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_policy_validate(&p, 0), MOONLET_OK); /* empty request */
    p = pol(MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 7);
    assert_int_equal(moonlet_policy_validate(&p, 6), MOONLET_ERR_INVALID_PARAMS);
    p = pol(2, 1);
    assert_int_equal(moonlet_policy_validate(&p, 4), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_policy_validate(&p, 0), MOONLET_ERR_INVALID_PARAMS);
    p = pol(255, 1);
    assert_int_equal(moonlet_policy_validate(&p, 1), MOONLET_ERR_INVALID_PARAMS);
}

static void test_walk_order(void **state)
{
    (void)state;
    /* K3 worked example: 128 complete, 256 lacks rank 0, 384 lacks rank 1. */
    int32_t scan[] = {1, 1, 0, 1, 1, 0};
    uint32_t order[3];
    assert_int_equal(moonlet_policy_walk_order(scan, 6, 2, order), 1);
    assert_int_equal(order[0], 0);

    int32_t all[] = {1, 1, 1, 1, 1, 1};
    assert_int_equal(moonlet_policy_walk_order(all, 6, 2, order), 3);
    assert_int_equal(order[0], 2);
    assert_int_equal(order[1], 1);
    assert_int_equal(order[2], 0);

    int32_t sparse[] = {1, 0, 1, 1, 0, 1};
    uint32_t order6[6];
    assert_int_equal(moonlet_policy_walk_order(sparse, 6, 1, order6), 4);
    assert_int_equal(order6[0], 5);
    assert_int_equal(order6[3], 0);

    int32_t none[] = {0, 1, 1, 0};
    assert_int_equal(moonlet_policy_walk_order(none, 4, 2, order), 0);

    int32_t err[] = {1, 1, MOONLET_ERR_INVALID_KEY, 1};
    assert_int_equal(moonlet_policy_walk_order(err, 4, 2, order), 1);
    assert_int_equal(order[0], 0);
    assert_int_equal(moonlet_policy_scan_error(err, 4), MOONLET_ERR_INVALID_KEY);
    assert_int_equal(moonlet_policy_scan_error(all, 6), MOONLET_OK);
}

static void test_mask(void **state)
{
    (void)state;
    int32_t r[6] = {9, 9, 9, 9, 9, 9};
    moonlet_policy_fill_mask(r, 6, 2, 1);
    int32_t want[] = {0, 0, 1, 1, 0, 0};
    assert_memory_equal(r, want, sizeof(want));
    moonlet_policy_fill_mask(r, 6, 2, -1);
    int32_t zero[6] = {0};
    assert_memory_equal(r, zero, sizeof(zero));
    moonlet_grant_lease_policy p = pol(MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 3);
    assert_int_equal(moonlet_policy_candidates(&p, 9), 3);
}

static void test_lease_rules(void **state)
{
    (void)state;
    uint64_t ms = MOONLET_NS_PER_MS;
    assert_int_equal(moonlet_lease_grant(0, 100 * ms, 5000 * ms), 5100 * ms);
    /* extended to the max, never shortened */
    assert_int_equal(moonlet_lease_grant(9000 * ms, 100 * ms, 5000 * ms), 9000 * ms);
    assert_int_equal(moonlet_lease_grant(9000 * ms, 5000 * ms, 5000 * ms), 10000 * ms);
    assert_true(moonlet_lease_active(10, 9));
    assert_false(moonlet_lease_active(10, 10));
    assert_int_equal(moonlet_lease_remaining_ms(5 * ms + 1, 0), 6);
    assert_int_equal(moonlet_lease_remaining_ms(5, 10), 0);
    moonlet_clock_set_fake(42);
    assert_int_equal(moonlet_clock_now_ns(), 42);
    moonlet_clock_advance(8);
    assert_int_equal(moonlet_clock_now_ns(), 50);
    moonlet_clock_set_fake(0);
    assert_true(moonlet_clock_now_ns() > 50);
}

MOONLET_TEST_MAIN("lease_probe_policy", NULL, NULL,
                  cmocka_unit_test(test_validate),
                  cmocka_unit_test(test_walk_order),
                  cmocka_unit_test(test_mask),
                  cmocka_unit_test(test_lease_rules))
