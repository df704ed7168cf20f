/*
 * http_get.h - one raw HTTP/1.0 request to 127.0.0.1 for the tests of the
 * scraping endpoints (master/service/metrics.c, store/client/client_metrics.c):
 * http_get(port, "GET /metrics HTTP/1.0\r\n\r\n") returns the whole
 * response (status line, headers, body; malloc'd), or NULL when nothing
 * listens.  Bounded: at most 100 waits of 100 ms for the answer.  And the
 * checks of what such an endpoint renders: has_line(), assert_lines(),
 * assert_rendered().
 */
#ifndef MOONLET_TEST_HTTP_GET_H
#define MOONLET_TEST_HTTP_GET_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

/* One HTTP/1.0 request over a fresh connection; returns the response (malloc'd). */
static inline char *http_get(uint16_t port, const char *request)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return NULL;
    }
    size_t want = strlen(request);
    if (write(fd, request, want) != (ssize_t)want) {
        close(fd);
        return NULL;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (int spins = 0; buf && spins < 100 && len < cap - 1; spins++) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (buf)
        buf[len] = 0;
    return buf;
}

/* Whether the answer to `request` has the status `status` (" 401 ") and,
 * unless `absent` is NULL, does not hold `absent` (what a refused request
 * must not see).  False when nothing answers. */
static inline bool http_answers(uint16_t port, const char *request, const char *status,
                                const char *absent)
{
    char *r = http_get(port, request);
    bool ok = r && strstr(r, status) && (!absent || !strstr(r, absent));
    free(r);
    return ok;
}

/* Whether text holds `line` as a whole line. */
static inline bool has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = strstr(text, line); p; p = strstr(p + 1, line))
        if ((p == text || p[-1] == '\n') && (p[n] == '\n' || p[n] == 0))
            return true;
    return false;
}

/* Fails the test, naming the first one missing, unless text holds each of
 * the n lines as a whole line. */
static inline void assert_lines(const char *text, const char *const *lines, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!has_line(text, lines[i]))
            fail_msg("no line '%s'", lines[i]);
}

/* A text an endpoint rendered: there, its length the one reported (len),
 * and each of the n lines in it (assert_lines). */
static inline void assert_rendered(const char *text, size_t len, const char *const *lines,
                                   size_t n)
{
    assert_non_null(text);
    assert_int_equal(len, strlen(text));
    assert_lines(text, lines, n);
}

#endif
