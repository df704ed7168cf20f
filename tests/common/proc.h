/*
 * proc.h - start and stop the project's daemons from tests.
 *
 * proc_start() runs a binary of the build tree with its stdout on a pipe and
 * waits (bounded) for its "listening on HOST:PORT" line; proc_stop() sends
 * SIGTERM to that PID only and waits (bounded), falling back to SIGKILL.
 * A started process gets SIGKILL when the test process dies, so a test that
 * crashes never leaves daemons behind holding the test runner's pipes.
 */
#ifndef MOONLET_TEST_PROC_H
#define MOONLET_TEST_PROC_H

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <dirent.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "monotime.h"

typedef struct test_proc {
    pid_t pid;
    int out_fd;
    unsigned port;
    char addr[96]; /* "127.0.0.1:PORT" */
} test_proc;

static inline const char *proc_build_root(void)
{
    const char *r = getenv("MOONLET_BUILD_ROOT");
    return r ? r : ".";
}

static inline long long proc_now_ms(void)
{
    return (long long)moonlet_mono_ms();
}

/* Reads one line of p's stdout into line (NUL-terminated, no newline) by the
 * deadline: 1, or 0 on timeout, EOF or a line longer than cap - 1. */
static inline int proc_read_line(test_proc *p, char *line, size_t cap, long long deadline)
{
    size_t len = 0;
    while (proc_now_ms() < deadline && len < cap - 1) {
        struct pollfd pfd = {.fd = p->out_fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        if (read(p->out_fd, line + len, 1) != 1)
            return 0;
        if (line[len] == '\n') {
            line[len] = 0;
            return 1;
        }
        len++;
    }
    return 0;
}

/* Reads lines from p's stdout until one starts with `prefix` (bounded). */
static inline int proc_wait_line(test_proc *p, const char *prefix, int timeout_ms)
{
    char line[512];
    long long deadline = proc_now_ms() + timeout_ms;
    while (proc_read_line(p, line, sizeof(line), deadline))
        if (strncmp(line, prefix, strlen(prefix)) == 0)
            return 1;
    return 0;
}

/* argv[0] is a path relative to the build root. Returns 0 when it listens. */
static inline int proc_start(test_proc *p, char *const argv[], int timeout_ms)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", proc_build_root(), argv[0]);
    int fds[2];
    if (pipe(fds))
        return -1;
    pid_t parent = getpid();
    p->pid = fork();
    if (p->pid < 0)
        return -1;
    if (p->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) /* the test died before prctl took effect */
            _exit(127);
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execv(path, argv);
        _exit(127);
    }
    close(fds[1]);
    p->out_fd = fds[0];
    char line[256];
    long long deadline = proc_now_ms() + timeout_ms;
    while (proc_read_line(p, line, sizeof(line), deadline)) {
        char host[64];
        if (sscanf(line, "listening on %63[^:]:%u", host, &p->port) == 2) {
            snprintf(p->addr, sizeof(p->addr), "%s:%u", host, p->port);
            return 0;
        }
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    close(p->out_fd);
    return -1;
}

/* Sends `sig`, waits up to timeout_ms; returns the exit status, or -1 when it
 * had to be killed. */
static inline int proc_stop_sig(test_proc *p, int sig, int timeout_ms)
{
    if (p->pid <= 0)
        return -1;
    kill(p->pid, sig);
    long long deadline = proc_now_ms() + timeout_ms;
    int status = 0;
    while (proc_now_ms() < deadline) {
        pid_t r = waitpid(p->pid, &status, WNOHANG);
        if (r == p->pid) {
            close(p->out_fd);
            p->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        usleep(10000);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    close(p->out_fd);
    p->pid = 0;
    return -1;
}

static inline int proc_stop(test_proc *p) { return proc_stop_sig(p, SIGTERM, 5000); }

/* Bytes this process has written into its unix stream sockets that the peers
 * have not read yet (SIOCOUTQ summed over /proc/self/fd): an observable for
 * "the request has reached a peer that is stopped". */
static inline long long proc_unix_unread_bytes(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    long long sum = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        int dom = 0, type = 0, n = 0;
        socklen_t l = sizeof(dom);
        if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d) ||
            getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l) != 0 || dom != AF_UNIX)
            continue;
        l = sizeof(type);
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) == 0 && type == SOCK_STREAM &&
            ioctl(fd, SIOCOUTQ, &n) == 0)
            sum += n;
    }
    closedir(d);
    return sum;
}

#endif
