/*
 * Unit test of common/sync.h: a condition variable from
 * moonlet_cond_init_mono times its waits on CLOCK_MONOTONIC (a deadline from
 * moonlet_mono_deadline_ts is not long past, as it would be on the realtime
 * clock), and the locked reads return the word they guard.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>

#include "monotime.h"
#include "sync.h"

static void test_cond_waits_on_monotonic(void **state)
{
    (void)state;
    pthread_cond_t cv;
    moonlet_cond_init_mono(&cv);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    uint64_t t0 = moonlet_mono_ms();
    struct timespec soon = moonlet_mono_deadline_ts(20);
    int rc;
    while ((rc = pthread_cond_timedwait(&cv, &mu, &soon)) == 0)
        ;
    assert_int_equal(rc, ETIMEDOUT);
    assert_true(moonlet_mono_ms() - t0 >= 19); /* no upper bound: a loaded host wakes late */
    pthread_mutex_unlock(&mu);
    pthread_cond_destroy(&cv);
}

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cond_waits_on_monotonic),
        cmocka_unit_test(test_locked_reads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
