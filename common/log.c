/* log.c - see log.h (levels, and the per-call-site rate limit). */
#include "log.h"

#include <stdbool.h>
#include <stdint.h>

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

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

/* ---- rate limit per call site --------------------------------------------- */

#define SITES 512u   /* call sites tracked; others are never limited */
#define PROBES 8u

struct site {
    _Atomic uintptr_t fmt;        /* 0: free */
    _Atomic uint64_t window_ns;   /* start of the current interval */
    _Atomic uint32_t count;       /* lines in the current interval */
    _Atomic uint32_t suppressed;  /* dropped in the current interval */
};

static struct site g_sites[SITES];
static atomic_uint g_burst = MOONLET_LOG_BURST;
static atomic_uint g_interval_ms = MOONLET_LOG_INTERVAL_MS;
static _Atomic unsigned long long g_suppressed_total;

void moonlet_log_set_rate_limit(unsigned burst, unsigned interval_ms)
{
    atomic_store(&g_burst, burst);
    atomic_store(&g_interval_ms, interval_ms ? interval_ms : 1);
    for (unsigned i = 0; i < SITES; i++) { /* a new limit starts from a clean slate */
        atomic_store(&g_sites[i].count, 0);
        atomic_store(&g_sites[i].suppressed, 0);
        atomic_store(&g_sites[i].window_ns, 0);
    }
}

unsigned long long moonlet_log_suppressed_total(void) { return atomic_load(&g_suppressed_total); }

static struct site *site_of(const char *fmt)
{
    uintptr_t key = (uintptr_t)fmt;
    unsigned h = (unsigned)((key >> 3) * 2654435761u) % SITES;
    for (unsigned p = 0; p < PROBES; p++) {
        struct site *s = &g_sites[(h + p) % SITES];
        uintptr_t cur = atomic_load(&s->fmt);
        if (cur == key)
            return s;
        if (cur == 0 && (atomic_compare_exchange_strong(&s->fmt, &cur, key) || cur == key))
            return s;
    }
    return NULL;
}

static void write_line(int level, const char *module, const char *fmt, va_list ap);

static void emit(int level, const char *module, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    write_line(level, module, fmt, ap);
    va_end(ap);
}

/* True when the line may be written; reports what the last interval dropped. */
static bool rate_allow(int level, const char *module, const char *fmt)
{
    unsigned burst = atomic_load_explicit(&g_burst, memory_order_relaxed);
    struct site *s = burst ? site_of(fmt) : NULL;
    if (!s)
        return true;
    uint64_t now = moonlet_clock_now_ns();
    uint64_t interval = (uint64_t)atomic_load(&g_interval_ms) * MOONLET_NS_PER_MS;
    uint64_t start = atomic_load(&s->window_ns);
    if (now - start >= interval || now < start) {
        /* One caller wins the roll-over and reports the dropped lines. */
        if (atomic_compare_exchange_strong(&s->window_ns, &start, now)) {
            atomic_store(&s->count, 0);
            uint32_t dropped = atomic_exchange(&s->suppressed, 0);
            if (dropped)
                emit(level, module, "suppressed %u similar lines in %u ms: %s", dropped,
                     atomic_load(&g_interval_ms), fmt);
        }
    }
    if (atomic_fetch_add(&s->count, 1) < burst)
        return true;
    atomic_fetch_add(&s->suppressed, 1);
    atomic_fetch_add(&g_suppressed_total, 1);
    return false;
}

void moonlet_log(int level, const char *module, const char *fmt, ...)
{
    if (level > moonlet_log_get_level())
        return;
    if (!rate_allow(level, module, fmt))
        return;
    va_list ap;
    va_start(ap, fmt);
    write_line(level, module, fmt, ap);
    va_end(ap);
}

static void write_line(int level, const char *module, const char *fmt, va_list ap)
{
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s: ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, g_names[level < 0 ? 0 : level > 3 ? 3 : level],
                     module);
    if (n > 0 && (size_t)n < sizeof(line))
        n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof(line) - 1)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
