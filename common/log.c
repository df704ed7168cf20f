/* log.c - see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int g_level = MOONLET_LOG_INFO;
static const char *const g_names[] = {"ERROR", "WARN", "INFO", "DEBUG"};

void moonlet_log_set_level(int level) { atomic_store(&g_level, level); }
int moonlet_log_get_level(void) { return atomic_load_explicit(&g_level, memory_order_relaxed); }

int moonlet_log_parse_level(const char *name)
{
    for (int i = 0; i < 4; i++)
        if (strcasecmp(name, g_names[i]) == 0)
            return i;
    if (strcasecmp(name, "warning") == 0)
        return MOONLET_LOG_WARN;
    return -1;
}

void moonlet_log(int level, const char *module, const char *fmt, ...)
{
    if (level > moonlet_log_get_level())
        return;
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, g_names[level < 0 ? 0 : level > 3 ? 3 : level],
                     module);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line))
        n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(line) - 1)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
