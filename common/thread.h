/*
 * thread.h - starts a named thread: pthread_create, then the name that
 * `top -H`, `ps -L`, perf and gdb show for it.  Every long-lived moonlet
 * thread is started so (the names: docs/deployment.md, "Threads"); the
 * kernel keeps 15 characters.  The creator names the thread, so the name is
 * there as soon as the call returns.
 *
 * Owns nothing; takes no lock.
 */
#ifndef MOONLET_THREAD_H
#define MOONLET_THREAD_H

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

/* pthread_create(t, NULL, fn, arg), named; its result (0 or an error number). */
__attribute__((format(printf, 4, 5))) static inline int
moonlet_thread_create(pthread_t *t, void *(*fn)(void *), void *arg, const char *fmt, ...)
{
    int rc = pthread_create(t, NULL, fn, arg);
    if (rc == 0) {
        char name[16];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(name, sizeof(name), fmt, ap);
        va_end(ap);
        pthread_setname_np(*t, name);
    }
    return rc;
}

#endif
