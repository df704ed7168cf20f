/* Tests of master/store/alloc.c: best fit, fragmentation, coalescing, exhaustion, double free. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "alloc.h"
#include "moonlet/error.h"
#include "../common/test_main.h"

static void test_exhaustion(void **state)
{
    (void)state;
    moonlet_alloc *a = moonlet_alloc_create(64 * 10);
    uint64_t off[10], x;
    for (int i = 0; i < 10; i++) {
        assert_int_equal(moonlet_alloc_reserve(a, 50, &off[i]), MOONLET_OK);
        assert_int_equal(off[i] % MOONLET_ALLOC_ALIGN, 0);
    }
    assert_int_equal(moonlet_alloc_used(a), 640);
    assert_int_equal(moonlet_alloc_reserve(a, 1, &x), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    assert_int_equal(moonlet_alloc_reserve(a, 0, &x), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_alloc_reserve(a, 1ull << 40, &x), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    for (int i = 0; i < 10; i++)
        assert_int_equal(moonlet_alloc_release(a, off[i], 50), MOONLET_OK);
    assert_int_equal(moonlet_alloc_used(a), 0);
    assert_int_equal(moonlet_alloc_free_extents(a), 1);
    moonlet_alloc_destroy(a);
}

static void test_fragmentation_and_coalescing(void **state)
{
    (void)state;
    moonlet_alloc *a = moonlet_alloc_create(64 * 8);
    uint64_t off[8], x;
    for (int i = 0; i < 8; i++)
        assert_int_equal(moonlet_alloc_reserve(a, 64, &off[i]), MOONLET_OK);
    /* free every other block: 4 holes of 64 bytes, none of 128 */
    for (int i = 0; i < 8; i += 2)
        assert_int_equal(moonlet_alloc_release(a, off[i], 64), MOONLET_OK);
    assert_int_equal(moonlet_alloc_free_extents(a), 4);
    assert_int_equal(moonlet_alloc_largest_free(a), 64);
    assert_int_equal(moonlet_alloc_reserve(a, 128, &x), MOONLET_ERR_NO_AVAILABLE_HANDLE);
    /* freeing block 1 merges holes 0,1,2 into one of 192 bytes */
    assert_int_equal(moonlet_alloc_release(a, off[1], 64), MOONLET_OK);
    assert_int_equal(moonlet_alloc_free_extents(a), 3);
    assert_int_equal(moonlet_alloc_largest_free(a), 192);
    /* best fit: a 64-byte request takes a 64-byte hole, not the 192 one */
    assert_int_equal(moonlet_alloc_reserve(a, 64, &x), MOONLET_OK);
    assert_true(x == off[4] || x == off[6]);
    assert_int_equal(moonlet_alloc_largest_free(a), 192);
    assert_int_equal(moonlet_alloc_reserve(a, 150, &x), MOONLET_OK);
    assert_int_equal(x, off[0]);
    moonlet_alloc_destroy(a);
}

static void test_double_free_and_bounds(void **state)
{
    (void)state;
    moonlet_alloc *a = moonlet_alloc_create(4096);
    uint64_t o1, o2;
    assert_int_equal(moonlet_alloc_reserve(a, 100, &o1), MOONLET_OK);
    assert_int_equal(moonlet_alloc_reserve(a, 100, &o2), MOONLET_OK);
    assert_int_equal(moonlet_alloc_release(a, o1, 100), MOONLET_OK);
    assert_int_equal(moonlet_alloc_release(a, o1, 100), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_alloc_release(a, 8192, 64), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_alloc_release(a, 4032, 128), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_alloc_release(a, 3, 64), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_alloc_used(a), 128);
    assert_int_equal(moonlet_alloc_release(a, o2, 100), MOONLET_OK);
    assert_int_equal(moonlet_alloc_free_extents(a), 1);
    moonlet_alloc_destroy(a);
}

static void test_random_churn(void **state)
{
    (void)state;
    enum { N = 2000 };
    moonlet_alloc *a = moonlet_alloc_create(1 << 24);
    uint64_t off[N], len[N];
    int live[N] = {0};
    srand(7);
    for (int round = 0; round < 20000; round++) {
        int i = rand() % N;
        if (live[i]) {
            assert_int_equal(moonlet_alloc_release(a, off[i], len[i]), MOONLET_OK);
            live[i] = 0;
        } else {
            len[i] = 1 + (uint64_t)(rand() % 20000);
            if (moonlet_alloc_reserve(a, len[i], &off[i]) == MOONLET_OK)
                live[i] = 1;
        }
    }
    /* no two live ranges overlap */
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N && live[i]; j++)
            if (live[j])
                assert_true(off[i] + moonlet_alloc_rounded(len[i]) <= off[j] ||
                            off[j] + moonlet_alloc_rounded(len[j]) <= off[i]);
    for (int i = 0; i < N; i++)
        if (live[i])
            assert_int_equal(moonlet_alloc_release(a, off[i], len[i]), MOONLET_OK);
    assert_int_equal(moonlet_alloc_used(a), 0);
    assert_int_equal(moonlet_alloc_free_extents(a), 1);
    assert_int_equal(moonlet_alloc_largest_free(a), 1 << 24);
    moonlet_alloc_destroy(a);
}

MOONLET_TEST_MAIN("master_alloc", NULL, NULL,
                  cmocka_unit_test(test_exhaustion),
                  cmocka_unit_test(test_fragmentation_and_coalescing),
                  cmocka_unit_test(test_double_free_and_bounds),
                  cmocka_unit_test(test_random_churn))
