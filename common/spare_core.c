/*
 * spare_core.c - the host's runnable threads against its cores (see the
 * header).
 */
#include "spare_core.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_fd = -1;
static long g_cores;

static void open_loadavg(void)
{
    g_fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    g_cores = sysconf(_SC_NPROCESSORS_ONLN);
}

long moonlet_loadavg_runnable(const char *text)
{
    const char *p = text;
    for (int field = 0; field < 3; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -1;
        p++;
    }
    char *end;
    long n = strtol(p, &end, 10);
    return end != p && *end == '/' && n >= 0 ? n : -1;
}

bool moonlet_core_to_spare(int slack)
{
    pthread_once(&g_once, open_loadavg);
    if (g_fd < 0 || g_cores < 1)
        return true;
    char buf[128];
    ssize_t n = pread(g_fd, buf, sizeof(buf) - 1, 0);
    if (n <= 0)
        return true;
    buf[n] = '\0';
    long running = moonlet_loadavg_runnable(buf);
    return running < 0 || running <= g_cores + slack;
}

long moonlet_thread_preemptions(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_nivcsw : -1;
}
