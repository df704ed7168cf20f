/*
 * threads.h - run a test's worker threads to completion.
 *
 * test_threads_run(fn, args, sizeof(args[0]), n) starts fn on each of the n
 * elements of the array args, each in its own thread, and returns once every
 * one has returned; the test then checks what each worker left in its
 * element. The caller's thread takes no lock and waits only in pthread_join.
 */
#ifndef MOONLET_TEST_THREADS_H
#define MOONLET_TEST_THREADS_H

#include <pthread.h>
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

#endif
