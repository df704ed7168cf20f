/*
 * Unit test of common/monotime.h: the units agree with each other and with
 * CLOCK_MONOTONIC, time never goes back, and a condition-variable deadline
 * lies the asked time ahead on the clock pthread_cond_timedwait uses.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>

#include "monotime.h"
#include "sync.h"
#include "test_main.h"

static void test_units_agree(void **state)
{
    (void)state;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t raw = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint64_t ns = moonlet_mono_ns(), us = moonlet_mono_us(), ms = moonlet_mono_ms();
    double s = moonlet_mono_s();
    assert_true(ns >= raw);
    assert_true(us >= ns / 1000u);
    assert_true(ms >= ns / 1000000u);
    assert_true(s * 1e3 >= (double)ms - 1.0);
    /* the same clock, not another one: within a minute of each other */
    assert_true(ms - raw / 1000000u < 60000u);
    uint64_t prev = moonlet_mono_ns();
    for (int i = 0; i < 10000; i++) {
        uint64_t now = moonlet_mono_ns();
        assert_true(now >= prev);
        prev = now;
    }
}

static void test_deadline_ts(void **state)
{
    (void)state;
    uint64_t before = moonlet_mono_ns();
    struct timespec d = moonlet_mono_deadline_ts(1500);
    uint64_t at = (uint64_t)d.tv_sec * 1000000000ull + (uint64_t)d.tv_nsec;
    assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
    assert_true(at >= before + 1500000000ull);
    assert_true(at <= moonlet_mono_ns() + 1500000000ull);

    /* a wait on a CLOCK_MONOTONIC condition variable (sync.h) ends at it */
    pthread_cond_t cv;
    moonlet_cond_init_mono(&cv);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    uint64_t t0 = moonlet_mono_ms(); /* before the deadline is taken */
    struct timespec soon = moonlet_mono_deadline_ts(20);
    int rc;
    while ((rc = pthread_cond_timedwait(&cv, &mu, &soon)) == 0)
        ;
    assert_int_equal(rc, ETIMEDOUT);
    assert_true(moonlet_mono_ms() - t0 >= 19); /* no upper bound: a loaded host wakes late */
    pthread_mutex_unlock(&mu);
    pthread_cond_destroy(&cv);
}

MOONLET_TEST_MAIN("monotime", NULL, NULL,
                  cmocka_unit_test(test_units_agree),
                  cmocka_unit_test(test_deadline_ts))
