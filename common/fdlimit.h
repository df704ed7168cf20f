/*
 * fdlimit.h - the process's file-descriptor limit (RLIMIT_NOFILE) and a
 * rate limit for log lines that repeat under load.
 *
 * moonlet_fdlimit_raise() is called once by each daemon's main before it
 * starts serving: it raises the soft limit towards what the daemon needs
 * (never above the hard limit) and returns the limit in force, which the
 * daemon then uses to size its connection caps.
 *
 * moonlet_ratelimit lets at most one line per interval through and counts
 * the ones it held back, so a fault that repeats a hundred times a second
 * (accept failing at the descriptor limit) logs once a few seconds with the
 * count.  Lock-free (one atomic), usable from any thread.
 */
#ifndef MOONLET_FDLIMIT_H
#define MOONLET_FDLIMIT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Raises the soft RLIMIT_NOFILE to min(want, hard) when it is lower.  Returns
 * the soft limit in force afterwards (the old one when raising failed). */
uint64_t moonlet_fdlimit_raise(uint64_t want);

typedef struct moonlet_ratelimit {
    atomic_int_fast64_t next_ms; /* monotonic ms before which lines are held back */
    atomic_uint_fast64_t held;   /* lines held back since the last one let through */
} moonlet_ratelimit;

#define MOONLET_RATELIMIT_INIT {0, 0}

/* True when a line may be logged now (then *suppressed is the number held
 * back since the previous one); false otherwise (the line is counted). */
bool moonlet_ratelimit_allow(moonlet_ratelimit *r, uint32_t interval_ms, uint64_t *suppressed);

#endif
