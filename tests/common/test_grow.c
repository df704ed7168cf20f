/*
 * Unit test of common/grow.h: the first growth takes `first` slots, a full
 * array doubles, one with room is handed back as it is, and a capacity whose
 * double would not fit a uint32_t fails without touching the array.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "grow.h"
#include "test_main.h"

static void test_doubles_when_full(void **state)
{
    (void)state;
    uint32_t *a = NULL, n = 0, cap = 0;
    for (uint32_t i = 0; i < 100; i++) {
        uint32_t *na = moonlet_grow(a, n, &cap, 8, sizeof(*na));
        assert_non_null(na);
        if (i == 0)
            assert_int_equal(cap, 8);
        a = na;
        a[n++] = i;
        assert_true(n <= cap);
    }
    assert_int_equal(cap, 128); /* 8, 16, 32, 64, 128 */
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(a[i], i); /* what was there survived every realloc */
    free(a);
}

static void test_room_left_is_the_same_array(void **state)
{
    (void)state;
    uint32_t cap = 0;
    char *a = moonlet_grow(NULL, 0, &cap, 4, 1);
    assert_non_null(a);
    assert_ptr_equal(moonlet_grow(a, 3, &cap, 4, 1), a);
    assert_int_equal(cap, 4);
    free(a);
}

static void test_capacity_overflow_fails(void **state)
{
    (void)state;
    char *a = malloc(1);
    assert_non_null(a);
    uint32_t cap = (UINT32_MAX / 2) + 1; /* doubling would wrap to 0 */
    assert_null(moonlet_grow(a, cap, &cap, 16, 1));
    assert_int_equal(cap, (UINT32_MAX / 2) + 1);
    a[0] = 1; /* still the caller's (a realloc to 0 bytes would have freed it) */
    free(a);
}

MOONLET_TEST_MAIN("grow", NULL, NULL,
                  cmocka_unit_test(test_doubles_when_full),
                  cmocka_unit_test(test_room_left_is_the_same_array),
                  cmocka_unit_test(test_capacity_overflow_fails))
