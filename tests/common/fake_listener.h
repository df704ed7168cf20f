/*
 * fake_listener.h - a test's own TCP peer: a listening socket on an
 * ephemeral loopback port and the thread that serves it until the test
 * stops it (the read end of stop_pipe becomes readable: the thread polls it
 * beside its sockets, closes them and returns).  The tests that fake a
 * misbehaving node (stalled, dropping, refusing) embed one.
 */
#ifndef MOONLET_TEST_FAKE_LISTENER_H
#define MOONLET_TEST_FAKE_LISTENER_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct fake_listener {
    int listen_fd;
    int stop_pipe[2];
    uint16_t port;
    pthread_t th;
} fake_listener;

/* Listens on 127.0.0.1, any port (l->port), and runs serve(arg) on l's
 * thread. */
static inline void fake_listener_start(fake_listener *l, void *(*serve)(void *), void *arg)
{
    assert_int_equal(pipe(l->stop_pipe), 0);
    l->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(l->listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(l->listen_fd, 16), 0);
    socklen_t al = sizeof(a);
    getsockname(l->listen_fd, (struct sockaddr *)&a, &al);
    l->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&l->th, NULL, serve, arg), 0);
}

/* Tells the thread to stop, joins it, closes the socket and the pipe. */
static inline void fake_listener_stop(fake_listener *l)
{
    assert_int_equal(write(l->stop_pipe[1], "x", 1), 1);
    pthread_join(l->th, NULL);
    close(l->listen_fd);
    close(l->stop_pipe[0]);
    close(l->stop_pipe[1]);
}

#endif
