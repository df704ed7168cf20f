/* Tests of transport/keepalive.c: the RDMA keepalive's miss counting (one
 * late or lost probe does not end a connection; a vanished peer is declared
 * gone within 2 x period; a stalled caller counts one miss). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "keepalive.h"
#include "../common/test_main.h"

#define P 500u /* the rdma suite's vanished_client period */

/* Ticks every `tick` ms from `from` until the keepalive asks for something;
 * posts what it asks (never acknowledged).  Returns the time it said GONE,
 * or 0 after `until`. */
static uint64_t run_unanswered(moonlet_keepalive *k, uint64_t from, uint64_t until, uint64_t tick)
{
    for (uint64_t t = from; t <= until; t += tick) {
        moonlet_keepalive_action a = moonlet_keepalive_tick(k, t, P);
        if (a == MOONLET_KEEPALIVE_GONE)
            return t;
        if (a == MOONLET_KEEPALIVE_PROBE)
            moonlet_keepalive_posted(k, t, P);
        assert_true(k->outstanding <= MOONLET_KEEPALIVE_MISSES);
    }
    return 0;
}

static void test_interval(void **state)
{
    (void)state;
    assert_int_equal(moonlet_keepalive_interval(500), 500 / MOONLET_KEEPALIVE_MISSES);
    assert_int_equal(moonlet_keepalive_interval(100), 100 / MOONLET_KEEPALIVE_MISSES);
    assert_int_equal(moonlet_keepalive_interval(1), 1); /* never 0 */
}

/* A healthy idle connection: one probe per period, acknowledged. */
static void test_healthy_one_probe_per_period(void **state)
{
    (void)state;
    moonlet_keepalive k;
    moonlet_keepalive_init(&k, 0, P);
    assert_int_equal(moonlet_keepalive_tick(&k, P - 1, P), MOONLET_KEEPALIVE_WAIT);
    unsigned probes = 0;
    for (uint64_t t = 0; t <= 10 * P; t += 10) {
        moonlet_keepalive_action a = moonlet_keepalive_tick(&k, t, P);
        assert_int_not_equal(a, MOONLET_KEEPALIVE_GONE);
        if (a == MOONLET_KEEPALIVE_PROBE) {
            moonlet_keepalive_posted(&k, t, P);
            probes++;
            moonlet_keepalive_acked(&k, t + 5, P); /* acknowledged 5 ms later */
            assert_int_equal(k.outstanding, 0);
            assert_int_equal(k.due_ms, t + 5 + P);
        }
    }
    assert_true(probes >= 9 && probes <= 10);
    assert_int_equal(k.misses, 0);
}

/* One lost probe (or its lost ACK): a miss and another probe, then the
 * acknowledgements; the connection lives and its misses are cleared.  So do
 * MISSES - 1 consecutive misses. */
static void test_misses_below_limit_keep_connection(void **state)
{
    (void)state;
    for (unsigned late = 1; late < MOONLET_KEEPALIVE_MISSES; late++) {
        moonlet_keepalive k;
        moonlet_keepalive_init(&k, 0, P);
        uint64_t iv = moonlet_keepalive_interval(P), t = P;
        assert_int_equal(moonlet_keepalive_tick(&k, t, P), MOONLET_KEEPALIVE_PROBE);
        moonlet_keepalive_posted(&k, t, P);
        for (unsigned m = 1; m <= late; m++) {
            t = P + m * iv;
            assert_int_equal(moonlet_keepalive_tick(&k, t - 1, P), MOONLET_KEEPALIVE_WAIT);
            assert_int_equal(moonlet_keepalive_tick(&k, t, P), MOONLET_KEEPALIVE_PROBE);
            moonlet_keepalive_posted(&k, t, P);
            assert_int_equal(k.misses, m);
            assert_int_equal(k.outstanding, m + 1);
        }
        /* the acknowledgements arrive (RC: all of them, in order) */
        for (unsigned i = 0; i <= late; i++)
            moonlet_keepalive_acked(&k, t + 10, P);
        assert_int_equal(k.misses, 0);
        assert_int_equal(k.outstanding, 0);
        assert_int_equal(k.due_ms, t + 10 + P);
        /* and a later vanish still needs the full count again */
        uint64_t gone = run_unanswered(&k, t + 10, t + 10 + 4 * P, 1);
        assert_int_equal(gone, t + 10 + 2 * P);
    }
}

/* An acknowledgement of the first probe while the second is in flight:
 * misses cleared, the next miss an interval away (not an idle period). */
static void test_ack_with_probe_in_flight(void **state)
{
    (void)state;
    moonlet_keepalive k;
    moonlet_keepalive_init(&k, 0, P);
    uint64_t iv = moonlet_keepalive_interval(P);
    assert_int_equal(moonlet_keepalive_tick(&k, P, P), MOONLET_KEEPALIVE_PROBE);
    moonlet_keepalive_posted(&k, P, P);
    assert_int_equal(moonlet_keepalive_tick(&k, P + iv, P), MOONLET_KEEPALIVE_PROBE);
    moonlet_keepalive_posted(&k, P + iv, P);
    moonlet_keepalive_acked(&k, P + iv + 3, P);
    assert_int_equal(k.misses, 0);
    assert_int_equal(k.outstanding, 1);
    assert_int_equal(k.due_ms, P + 2 * iv + 3);
}

/* A peer that vanished right after an acknowledgement: declared gone at
 * exactly 2 x period with a fine tick, within 2 x period + 2 ticks with the
 * CM thread's 50 ms tick, never earlier than period after the first probe. */
static void test_vanished_within_bound(void **state)
{
    (void)state;
    moonlet_keepalive k;
    moonlet_keepalive_init(&k, 0, P);
    assert_int_equal(run_unanswered(&k, 0, 10 * P, 1), 2 * P);
    assert_int_equal(k.misses, MOONLET_KEEPALIVE_MISSES);
    for (uint64_t start = 0; start < 50; start += 7) {
        moonlet_keepalive_init(&k, 0, P);
        uint64_t gone = run_unanswered(&k, start, 10 * P, 50);
        assert_true(gone >= 2 * P);
        assert_true(gone <= 2 * P + 2 * 50);
    }
}

/* A caller stalled far past several intervals (a loaded host) counts one
 * miss, not MISSES: the connection is not ended by its own caller's stall. */
static void test_stalled_caller_counts_one_miss(void **state)
{
    (void)state;
    moonlet_keepalive k;
    moonlet_keepalive_init(&k, 0, P);
    assert_int_equal(moonlet_keepalive_tick(&k, P, P), MOONLET_KEEPALIVE_PROBE);
    moonlet_keepalive_posted(&k, P, P);
    uint64_t t = P + 10 * P; /* ten periods without a pass */
    assert_int_equal(moonlet_keepalive_tick(&k, t, P), MOONLET_KEEPALIVE_PROBE);
    assert_int_equal(k.misses, 1);
    moonlet_keepalive_posted(&k, t, P);
    moonlet_keepalive_acked(&k, t + 1, P);
    moonlet_keepalive_acked(&k, t + 1, P);
    assert_int_equal(k.misses, 0);
    assert_int_equal(k.outstanding, 0);
}

/* A probe error is the caller's to act on; with the send queue full (the
 * limit reached without acknowledgements) no further probe is asked for. */
static void test_outstanding_bounded(void **state)
{
    (void)state;
    moonlet_keepalive k;
    moonlet_keepalive_init(&k, 0, 100);
    uint64_t gone = 0, max_out = 0;
    for (uint64_t t = 0; t <= 1000 && !gone; t++) {
        moonlet_keepalive_action a = moonlet_keepalive_tick(&k, t, 100);
        if (a == MOONLET_KEEPALIVE_GONE)
            gone = t;
        else if (a == MOONLET_KEEPALIVE_PROBE)
            moonlet_keepalive_posted(&k, t, 100);
        if (k.outstanding > max_out)
            max_out = k.outstanding;
    }
    assert_int_equal(gone, 200);
    assert_int_equal(max_out, MOONLET_KEEPALIVE_MISSES);
}

MOONLET_TEST_MAIN("transport_keepalive", NULL, NULL,
                  cmocka_unit_test(test_interval),
                  cmocka_unit_test(test_healthy_one_probe_per_period),
                  cmocka_unit_test(test_misses_below_limit_keep_connection),
                  cmocka_unit_test(test_ack_with_probe_in_flight),
                  cmocka_unit_test(test_vanished_within_bound),
                  cmocka_unit_test(test_stalled_caller_counts_one_miss),
                  cmocka_unit_test(test_outstanding_bounded))
