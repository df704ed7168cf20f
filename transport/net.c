/* net.c - TCP listen/connect and address parsing; see net.h. */
#include "net.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "moonlet/error.h"
#include "monotime.h"

#define MOD "net"

int moonlet_net_split_hostport(const char *addr, char *host, size_t host_cap, uint16_t *port)
{
    if (!addr || !*addr || !host || !port)
        return MOONLET_ERR_INVALID_PARAMS;
    const char *h = addr, *colon;
    size_t hlen;
    if (*h == '[') {
        const char *close = strchr(h, ']');
        if (!close || close[1] != ':')
            return MOONLET_ERR_INVALID_PARAMS;
        h++;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(h, ':');
        if (!colon || strchr(h, ':') != colon)
            return MOONLET_ERR_INVALID_PARAMS;
        hlen = (size_t)(colon - h);
    }
    if (hlen == 0 || hlen >= host_cap)
        return MOONLET_ERR_INVALID_PARAMS;
    const char *d = colon + 1;
    unsigned long p = 0;
    size_t nd = 0;
    for (; *d; d++, nd++) {
        if (*d < '0' || *d > '9' || nd >= 5)
            return MOONLET_ERR_INVALID_PARAMS;
        p = p * 10 + (unsigned long)(*d - '0');
    }
    if (nd == 0 || p > 65535)
        return MOONLET_ERR_INVALID_PARAMS;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)p;
    return MOONLET_OK;
}

static int resolve_all(const char *host, uint16_t port, bool passive, struct addrinfo **res)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0)};
    char service[8];
    snprintf(service, sizeof(service), "%u", (unsigned)port);
    int gai = getaddrinfo(host, service, &hints, res);
    if (gai != 0 || !*res) {
        ML_WARN(MOD, "cannot resolve %s: %s", host ? host : "(any)",
                gai ? gai_strerror(gai) : "no address");
        return MOONLET_NET_EADDR;
    }
    return 0;
}

int moonlet_net_resolve(const char *host, uint16_t port, bool passive,
                        struct sockaddr_storage *out, socklen_t *out_len)
{
    struct addrinfo *res = NULL;
    if (resolve_all(host, port, passive, &res))
        return MOONLET_NET_EADDR;
    memset(out, 0, sizeof(*out));
    memcpy(out, res->ai_addr, res->ai_addrlen);
    *out_len = (socklen_t)res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

uint16_t moonlet_net_local_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
        return 0;
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return 0;
}

int moonlet_net_listen_tcp(const char *host, uint16_t port, int backlog, uint16_t *bound_port)
{
    struct addrinfo *res = NULL;
    if (resolve_all(host, port, true, &res))
        return MOONLET_NET_EADDR;
    int fd = -1, err = 0;
    for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        errno = err;
        return MOONLET_NET_ESYS;
    }
    if (bound_port)
        *bound_port = moonlet_net_local_port(fd);
    return fd;
}

int moonlet_net_wait(int fd, short events, uint64_t deadline_ms)
{
    for (;;) {
        uint64_t now = moonlet_mono_ms();
        if (now >= deadline_ms)
            return MOONLET_NET_ETIMEDOUT;
        uint64_t left = deadline_ms - now;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > INT32_MAX ? INT32_MAX : (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return MOONLET_NET_ESYS;
    }
}

int moonlet_net_io_by(int fd, bool out, void *buf, size_t n, uint64_t deadline_ms)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return -1;
        if (errno != EINTR && moonlet_net_wait(fd, out ? POLLOUT : POLLIN, deadline_ms))
            return -1;
    }
    return 0;
}

/* One non-blocking connect bounded by the deadline: the fd or a code. */
static int connect_one(const struct addrinfo *ai, uint64_t deadline_ms, int sockbuf_bytes)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return MOONLET_NET_ESYS;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (sockbuf_bytes > 0) {
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf_bytes, sizeof(sockbuf_bytes));
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf_bytes, sizeof(sockbuf_bytes));
    }
    int rc = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS)
            rc = MOONLET_NET_ESYS;
        else if ((rc = moonlet_net_wait(fd, POLLOUT, deadline_ms)) == 0) {
            int err = 0;
            socklen_t el = sizeof(err);
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
                errno = err ? err : errno;
                rc = MOONLET_NET_ESYS;
            }
        }
    }
    if (rc != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return rc;
    }
    return fd;
}

int moonlet_net_connect_tcp(const char *host, uint16_t port, uint64_t deadline_ms,
                            int sockbuf_bytes)
{
    if (!host || !*host)
        return MOONLET_NET_EADDR;
    struct addrinfo *res = NULL;
    if (resolve_all(host, port, false, &res))
        return MOONLET_NET_EADDR;
    int fd = MOONLET_NET_ESYS;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        fd = connect_one(ai, deadline_ms, sockbuf_bytes);
        if (fd >= 0 || fd == MOONLET_NET_ETIMEDOUT)
            break;
    }
    int e = errno;
    freeaddrinfo(res);
    errno = e;
    return fd;
}
