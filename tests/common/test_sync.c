/*
 * Unit test of common/sync.h's locked reads: they return the word they guard
 * and leave the lock free.  moonlet_cond_init_mono is tested with the
 * deadlines it serves, in test_monotime.c.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "sync.h"
#include "test_main.h"

static void test_locked_reads(void **state)
{
    (void)state;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    bool b = true;
    uint32_t u32 = 0xdeadbeefu;
    uint64_t u64 = 0x0123456789abcdefull;
    assert_true(moonlet_locked_bool(&mu, &b));
    assert_int_equal(moonlet_locked_u32(&mu, &u32), 0xdeadbeefu);
    assert_true(moonlet_locked_u64(&mu, &u64) == 0x0123456789abcdefull);
    /* the lock is free again after each read */
    assert_int_equal(pthread_mutex_trylock(&mu), 0);
    pthread_mutex_unlock(&mu);
}

MOONLET_TEST_MAIN("sync", NULL, NULL,
                  cmocka_unit_test(test_locked_reads))
