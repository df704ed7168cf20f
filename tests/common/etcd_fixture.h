/*
 * etcd_fixture.h - a real single-member etcd on loopback for the C tests:
 * free ports picked by binding port 0, its data directory in a fresh temp
 * directory, started and stopped by PID (SIGTERM, bounded, then SIGKILL),
 * its output in <datadir>/etcd.log.  etcd_fixture_start() returns 77 (skip)
 * when no etcd binary is installed (scripts/setup.sh installs etcd-server).
 */
#ifndef MOONLET_TEST_ETCD_FIXTURE_H
#define MOONLET_TEST_ETCD_FIXTURE_H

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "etcd.h"
#include "monotime.h"

typedef struct etcd_fixture {
    pid_t pid;
    char dir[128];
    char url[64]; /* http://127.0.0.1:PORT */
    unsigned client_port, peer_port;
} etcd_fixture;

static inline unsigned etcd_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    unsigned port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static inline const char *etcd_binary(void)
{
    static const char *const paths[] = {"/usr/bin/etcd", "/usr/local/bin/etcd"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
        if (access(paths[i], X_OK) == 0)
            return paths[i];
    return NULL;
}

/* 0 when etcd answers, 77 when not installed, -1 on failure. */
static inline int etcd_fixture_start(etcd_fixture *f)
{
    memset(f, 0, sizeof(*f));
    const char *bin = etcd_binary();
    if (!bin)
        return 77;
    snprintf(f->dir, sizeof(f->dir), "/tmp/moonlet-etcd-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    f->client_port = etcd_free_port();
    f->peer_port = etcd_free_port();
    snprintf(f->url, sizeof(f->url), "http://127.0.0.1:%u", f->client_port);
    char peer[64], cluster[96], data[160], logp[160];
    snprintf(peer, sizeof(peer), "http://127.0.0.1:%u", f->peer_port);
    snprintf(cluster, sizeof(cluster), "test=%s", peer);
    snprintf(data, sizeof(data), "%s/data", f->dir);
    snprintf(logp, sizeof(logp), "%s/etcd.log", f->dir);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(bin, bin, "--name", "test", "--data-dir", data, "--listen-client-urls", f->url,
              "--advertise-client-urls", f->url, "--listen-peer-urls", peer,
              "--initial-advertise-peer-urls", peer, "--initial-cluster", cluster,
              "--initial-cluster-state", "new", (char *)NULL);
        _exit(127);
    }
    f->pid = pid;
    /* ready when a read answers (bounded: 20 s) */
    moonlet_etcd *e = NULL;
    if (moonlet_etcd_create(f->url, 500, &e) != 0)
        return -1;
    uint64_t deadline = moonlet_mono_ms() + 20000;
    int rc = -1;
    while (moonlet_mono_ms() < deadline) {
        moonlet_etcd_kv kv;
        if (moonlet_etcd_get(e, "/probe", &kv, NULL) == 0) {
            moonlet_etcd_kv_free(&kv);
            rc = 0;
            break;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            f->pid = 0;
            break;
        }
        usleep(50 * 1000); /* etcd gives no readiness event to wait on; bounded poll */
    }
    moonlet_etcd_destroy(e);
    if (rc)
        fprintf(stderr, "etcd did not come up; see %s\n", logp);
    return rc;
}

static inline void etcd_fixture_stop(etcd_fixture *f)
{
    if (f->pid > 0) {
        kill(f->pid, SIGTERM);
        uint64_t deadline = moonlet_mono_ms() + 5000;
        while (waitpid(f->pid, NULL, WNOHANG) == 0) {
            if (moonlet_mono_ms() > deadline) {
                kill(f->pid, SIGKILL);
                waitpid(f->pid, NULL, 0);
                break;
            }
            usleep(10 * 1000);
        }
        f->pid = 0;
    }
    if (f->dir[0]) {
        char cmd[200];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", f->dir);
        f->dir[0] = 0;
    }
}

#endif
