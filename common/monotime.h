/*
 * monotime.h - wall-independent monotonic time (CLOCK_MONOTONIC).
 *
 * The one place that reads CLOCK_MONOTONIC for deadlines, timeouts, backoffs
 * and durations outside the master.  The master's clock that tests can freeze
 * is lease/clock.h; this one is never faked.  The store node's write
 * capabilities and moonlet_xfer_now_ms() are on this clock (milliseconds).
 *
 * Owns nothing, takes no locks; safe from any thread.
 */
#ifndef MOONLET_MONOTIME_H
#define MOONLET_MONOTIME_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC. */
static inline uint64_t moonlet_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Microseconds on CLOCK_MONOTONIC. */
static inline uint64_t moonlet_mono_us(void)
{
    return moonlet_mono_ns() / 1000u;
}

/* Milliseconds on CLOCK_MONOTONIC. */
static inline uint64_t moonlet_mono_ms(void)
{
    return moonlet_mono_ns() / 1000000u;
}

/* Seconds on CLOCK_MONOTONIC, as a double (benchmarks' durations). */
static inline double moonlet_mono_s(void)
{
    return (double)moonlet_mono_ns() * 1e-9;
}

/* The absolute CLOCK_MONOTONIC instant `ms` from now, for
 * pthread_cond_timedwait on a condition variable set to CLOCK_MONOTONIC. */
static inline struct timespec moonlet_mono_deadline_ts(uint64_t ms)
{
    uint64_t ns = moonlet_mono_ns() + ms * 1000000ull;
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    return ts;
}

#endif
