/*
 * Unit test of common/spare_core.c: the runnable count of /proc/loadavg,
 * and "no core to spare" while more threads run than the host has cores.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "spare_core.h"
#include "test_main.h"

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

#define MAX_HOGS 64
static atomic_bool g_stop;
static pthread_barrier_t g_started;

static void *hog(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&g_started);
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed))
        ;
    return NULL;
}

/* One more CPU-bound thread than cores, and the caller: while they run, no
 * core is spare, even with a slack of one. */
static void test_busy_host_has_none(void **state)
{
    (void)state;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1 || cores + 1 > MAX_HOGS || access("/proc/loadavg", R_OK) != 0)
        skip();
    int n = (int)cores + 1;
    pthread_t t[MAX_HOGS];
    atomic_store(&g_stop, false);
    assert_int_equal(pthread_barrier_init(&g_started, NULL, (unsigned)n + 1), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_create(&t[i], NULL, hog, NULL), 0);
    pthread_barrier_wait(&g_started); /* every hog runs from here on, and never sleeps */
    int spare = 0;
    for (int i = 0; i < 20; i++)
        spare += moonlet_core_to_spare(0) + moonlet_core_to_spare(1);
    atomic_store(&g_stop, true);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&g_started);
    assert_int_equal(spare, 0);
}

MOONLET_TEST_MAIN("spare_core", NULL, NULL,
                  cmocka_unit_test(test_parse),
                  cmocka_unit_test(test_busy_host_has_none))
