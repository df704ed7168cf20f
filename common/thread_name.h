/*
 * thread_name.h - names the calling thread: what `top -H`, `ps -L`, perf and
 * gdb show for it.  Every long-lived moonlet thread names itself as it starts
 * (the names: docs/deployment.md, "Threads"); the kernel keeps 15 characters.
 *
 * Owns nothing; takes no lock.
 */
#ifndef MOONLET_THREAD_NAME_H
#define MOONLET_THREAD_NAME_H

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

__attribute__((format(printf, 1, 2))) static inline void moonlet_thread_name(const char *fmt, ...)
{
    char name[16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof(name), fmt, ap);
    va_end(ap);
    pthread_setname_np(pthread_self(), name);
}

#endif
