/*
 * Unit test of common/spare_core.c: the runnable count of /proc/loadavg,
 * and "no core to spare" while more threads run than the host has cores.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <unistd.h>

#include "spare_core.h"
#include "test_main.h"
#include "threads.h"

static void test_parse(void **state)
{
    (void)state;
    assert_int_equal(moonlet_loadavg_runnable("0.15 0.18 0.08 2/79 1127\n"), 2);
    assert_int_equal(moonlet_loadavg_runnable("12.00 9.50 4.25 17/1024 99"), 17);
    assert_int_equal(moonlet_loadavg_runnable("0.00 0.00 0.00 0/0 1"), 0);
    /* not the format: no answer rather than a wrong one */
    assert_int_equal(moonlet_loadavg_runnable(""), -1);
    assert_int_equal(moonlet_loadavg_runnable("0.15 0.18 0.08"), -1);
    assert_int_equal(moonlet_loadavg_runnable("0.15 0.18 0.08 x/79 1"), -1);
    assert_int_equal(moonlet_loadavg_runnable("0.15 0.18 0.08 2 1"), -1);
}

/* One more CPU-bound thread than cores, and the caller: while they run, no
 * core is spare, even with a slack of one. */
static void test_busy_host_has_none(void **state)
{
    (void)state;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1 || cores + 1 > TEST_MAX_THREADS || access("/proc/loadavg", R_OK) != 0)
        skip();
    test_hogs h;
    test_hogs_start(&h, (int)cores + 1);
    int spare = 0;
    for (int i = 0; i < 20; i++)
        spare += moonlet_core_to_spare(0) + moonlet_core_to_spare(1);
    test_hogs_stop(&h);
    assert_int_equal(spare, 0);
}

MOONLET_TEST_MAIN("spare_core", NULL, NULL,
                  cmocka_unit_test(test_parse),
                  cmocka_unit_test(test_busy_host_has_none))
