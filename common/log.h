/*
 * log.h - leveled logging to stderr for the daemons and the library.
 *
 * One process-wide level (moonlet_log_set_level); lines are prefixed with a
 * wall-clock timestamp, the level and the module.  Thread safe: each line is
 * written with a single write(2).  Takes no locks.
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
