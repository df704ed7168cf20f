/*
 * spare_core.h - whether the host has a core to spare right now, for code
 * that would rather spin than sleep while it waits.
 *
 * Spinning for a reply saves the wake-up of a sleeping thread (tens of
 * microseconds on a VM), but only while the spinner takes a core nobody
 * else wants.  The kernel's count of runnable threads (the fourth field of
 * /proc/loadavg, "running/total", the caller included) against the online
 * cores says whether that holds at this moment.  A caller may allow a
 * slack: a spinner yields every round, so one runnable thread more than
 * there are cores can run through its yields (rpc_client.c allows it to a
 * lone caller).
 *
 * Also the calling thread's involuntary context switches: a count that
 * went up while a thread spun or served means another thread wanted its
 * core (the reply spin, rpc_client.c; the loops' yield, rpc_server.c).
 *
 * Owns a descriptor of /proc/loadavg, opened once and kept; a read is one
 * pread() (about 0.4 us).  Takes no lock (pthread_once at the first call).
 */
#ifndef MOONLET_SPARE_CORE_H
#define MOONLET_SPARE_CORE_H

#include <stdbool.h>

/* True when the host's runnable threads, the caller included, are at most
 * its online cores + slack, or when that cannot be read (no /proc): a
 * caller then relies on its other checks. */
bool moonlet_core_to_spare(int slack);

/* This thread's involuntary context switches so far (a sched_yield() that
 * ran another thread counts as one), or -1 when unknown. */
long moonlet_thread_preemptions(void);

/* The runnable count from the text of /proc/loadavg ("0.15 0.18 0.08 2/79
 * 1127"), or -1 when the text has no such field.  For tests. */
long moonlet_loadavg_runnable(const char *text);

#endif
