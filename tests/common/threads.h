/*
 * threads.h - run a test's worker threads to completion.
 *
 * test_threads_run(fn, args, sizeof(args[0]), n) starts fn on each of the n
 * elements of the array args, each in its own thread, and returns once every
 * one has returned; the test then checks what each worker left in its
 * element. The caller's thread takes no lock and waits only in pthread_join.
 *
 * test_hogs_start(&h, n) starts n CPU-bound threads (they inherit the
 * caller's CPU affinity) and returns once every one of them runs;
 * test_hogs_stop(&h) stops and joins them.  For tests of what code does on
 * a host with no core to spare.
 */
#ifndef MOONLET_TEST_THREADS_H
#define MOONLET_TEST_THREADS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#define TEST_MAX_THREADS 64

static inline void test_threads_run(void *(*fn)(void *), void *args, size_t size, int n)
{
    pthread_t th[TEST_MAX_THREADS];
    assert_true(n >= 0 && n <= TEST_MAX_THREADS);
    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_create(&th[i], NULL, fn, (char *)args + (size_t)i * size), 0);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
}

typedef struct test_hogs {
    pthread_t th[TEST_MAX_THREADS];
    int n;
    atomic_bool stop;
    pthread_barrier_t started;
} test_hogs;

static inline void *test_hog_main(void *arg)
{
    test_hogs *h = arg;
    pthread_barrier_wait(&h->started);
    while (!atomic_load_explicit(&h->stop, memory_order_relaxed))
        ;
    return NULL;
}

static inline void test_hogs_start(test_hogs *h, int n)
{
    assert_true(n > 0 && n <= TEST_MAX_THREADS);
    h->n = n;
    atomic_store(&h->stop, false);
    assert_int_equal(pthread_barrier_init(&h->started, NULL, (unsigned)n + 1), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_create(&h->th[i], NULL, test_hog_main, h), 0);
    pthread_barrier_wait(&h->started); /* every hog runs from here on, and never sleeps */
}

static inline void test_hogs_stop(test_hogs *h)
{
    atomic_store(&h->stop, true);
    for (int i = 0; i < h->n; i++)
        pthread_join(h->th[i], NULL);
    pthread_barrier_destroy(&h->started);
}

#endif
