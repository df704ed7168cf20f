/*
 * sync.h - the two pthread idioms moonlet repeats: a condition variable whose
 * timed waits run on CLOCK_MONOTONIC, and one word read under the lock that
 * guards it (a status a thread other than its writer polls).
 *
 * Owns nothing; takes only the lock the caller names, for one load.
 */
#ifndef MOONLET_SYNC_H
#define MOONLET_SYNC_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Initialises cv for pthread_cond_timedwait with deadlines on CLOCK_MONOTONIC
 * (moonlet_mono_deadline_ts), so wall-clock steps do not move them. */
static inline void moonlet_cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* *v read under mu. */
static inline bool moonlet_locked_bool(pthread_mutex_t *mu, const bool *v)
{
    pthread_mutex_lock(mu);
    bool r = *v;
    pthread_mutex_unlock(mu);
    return r;
}

/* *v read under mu. */
static inline uint32_t moonlet_locked_u32(pthread_mutex_t *mu, const uint32_t *v)
{
    pthread_mutex_lock(mu);
    uint32_t r = *v;
    pthread_mutex_unlock(mu);
    return r;
}

/* *v read under mu. */
static inline uint64_t moonlet_locked_u64(pthread_mutex_t *mu, const uint64_t *v)
{
    pthread_mutex_lock(mu);
    uint64_t r = *v;
    pthread_mutex_unlock(mu);
    return r;
}

#endif
