/* Tests of common/log.c's per-call-site rate limit: a burst of one repeated
 * line is cut to the limit, other lines are unaffected, the next interval
 * reports how many were dropped, and burst 0 turns the limit off. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "clock.h"
#include "log.h"
#include "test_main.h"

static FILE *g_cap;
static int g_saved = -1;

static void capture_start(void)
{
    fflush(stderr);
    g_cap = tmpfile();
    assert_non_null(g_cap);
    g_saved = dup(STDERR_FILENO);
    assert_true(dup2(fileno(g_cap), STDERR_FILENO) >= 0);
}

/* Stops capturing; returns the lines containing `needle`. */
static int capture_count(const char *needle)
{
    dup2(g_saved, STDERR_FILENO);
    close(g_saved);
    rewind(g_cap);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof(line), g_cap))
        n += strstr(line, needle) != NULL;
    fclose(g_cap);
    return n;
}

static void warn_repeated(int i) { ML_WARN("test", "store 10.0.0.1:7001 unreachable (attempt %d)", i); }
static void warn_other(void) { ML_WARN("test", "another line"); }

static void test_burst_is_cut(void **state)
{
    (void)state;
    moonlet_clock_set_fake(1000ull * 1000000000ull);
    moonlet_log_set_rate_limit(MOONLET_LOG_BURST, MOONLET_LOG_INTERVAL_MS);
    unsigned long long before = moonlet_log_suppressed_total();
    capture_start();
    for (int i = 0; i < 5000; i++) {
        warn_repeated(i);
        if (i % 1000 == 0)
            warn_other();
    }
    assert_int_equal(capture_count("unreachable"), MOONLET_LOG_BURST);
    assert_int_equal(moonlet_log_suppressed_total() - before, 5000 - MOONLET_LOG_BURST);

    /* the next interval: one report of what was dropped, then lines again */
    capture_start();
    moonlet_clock_advance((uint64_t)MOONLET_LOG_INTERVAL_MS * MOONLET_NS_PER_MS);
    warn_repeated(5000);
    dup2(g_saved, STDERR_FILENO);
    close(g_saved);
    rewind(g_cap);
    char line[2048];
    int reports = 0, lines = 0;
    while (fgets(line, sizeof(line), g_cap)) {
        reports += strstr(line, "suppressed 4980 similar lines") != NULL;
        lines += strstr(line, "(attempt 5000)") != NULL;
    }
    fclose(g_cap);
    assert_int_equal(reports, 1);
    assert_int_equal(lines, 1);
    moonlet_clock_set_fake(0);
}

static void test_other_sites_unaffected(void **state)
{
    (void)state;
    moonlet_clock_set_fake(2000ull * 1000000000ull);
    moonlet_log_set_rate_limit(MOONLET_LOG_BURST, MOONLET_LOG_INTERVAL_MS);
    capture_start();
    for (int i = 0; i < 1000; i++)
        warn_repeated(i);
    for (int i = 0; i < 5; i++)
        warn_other();
    assert_int_equal(capture_count("another line"), 5);
    moonlet_clock_set_fake(0);
}

static void test_limit_off(void **state)
{
    (void)state;
    moonlet_log_set_rate_limit(0, 1000);
    capture_start();
    for (int i = 0; i < 300; i++)
        warn_repeated(i);
    assert_int_equal(capture_count("unreachable"), 300);
    moonlet_log_set_rate_limit(MOONLET_LOG_BURST, MOONLET_LOG_INTERVAL_MS);
}

MOONLET_TEST_MAIN("common_log", NULL, NULL,
                  cmocka_unit_test(test_burst_is_cut),
                  cmocka_unit_test(test_other_sites_unaffected),
                  cmocka_unit_test(test_limit_off))
