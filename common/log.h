/*
 * log.h - leveled logging to stderr for the daemons and the library.
 *
 * One process-wide level (moonlet_log_set_level); lines are prefixed with a
 * wall-clock timestamp, the level and the module.  Thread safe: each line is
 * written with a single write(2).  Takes no locks.
 *
 * Repeated lines are rate-limited per call site (its format string): at most
 * `burst` lines per `interval` (default 20 per 10 s) are written; the rest are
 * counted, and the first line of the call site's next interval is preceded by
 * "suppressed N similar lines: <format>".  A store crash that makes every
 * request log the same warning then prints a few lines, not thousands.  The
 * interval runs on the lease clock (tests freeze it).  Counters are atomics,
 * so concurrent callers may let a line or two more through than the burst.
 */
#ifndef MOONLET_LOG_H
#define MOONLET_LOG_H

enum moonlet_log_level {
    MOONLET_LOG_ERROR = 0,
    MOONLET_LOG_WARN = 1,
    MOONLET_LOG_INFO = 2,
    MOONLET_LOG_DEBUG = 3,
};

void moonlet_log_set_level(int level);
int moonlet_log_get_level(void);
/* Parses "error", "warn", "info", "debug"; returns -1 when unknown. */
int moonlet_log_parse_level(const char *name);
/* Per call site, at most `burst` lines per `interval_ms`; burst 0 turns the
 * limit off.  Defaults: MOONLET_LOG_BURST lines per MOONLET_LOG_INTERVAL_MS. */
#define MOONLET_LOG_BURST 20u
#define MOONLET_LOG_INTERVAL_MS 10000u
void moonlet_log_set_rate_limit(unsigned burst, unsigned interval_ms);
/* Lines dropped by the rate limit since the process started. */
unsigned long long moonlet_log_suppressed_total(void);
void moonlet_log(int level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ML_ERR(mod, ...) moonlet_log(MOONLET_LOG_ERROR, mod, __VA_ARGS__)
#define ML_WARN(mod, ...) moonlet_log(MOONLET_LOG_WARN, mod, __VA_ARGS__)
#define ML_INFO(mod, ...) moonlet_log(MOONLET_LOG_INFO, mod, __VA_ARGS__)
#define ML_DEBUG(mod, ...)                                                    \
    do {                                                                      \
        if (moonlet_log_get_level() >= MOONLET_LOG_DEBUG)                     \
            moonlet_log(MOONLET_LOG_DEBUG, mod, __VA_ARGS__);                 \
    } while (0)

#endif
