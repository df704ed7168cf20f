/*
 * repl_peer.h - the standby's end of a leader's replication stream, played
 * by a test over a socketpair (repl_stream.h, docs/protocol.md
 * "Replication stream"): open a stream on a log, read its pushes, ack.
 * Every wait is bounded; a test fails rather than hangs.
 */
#ifndef MOONLET_TEST_REPL_PEER_H
#define MOONLET_TEST_REPL_PEER_H

#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "methods.h"
#include "repl_stream.h"
#include "wire.h"

/* Opens a stream for `who` from `from` on the log (epoch 1) and attaches
 * the leader's end of a socketpair; returns the standby's end, or -1 with
 * *lost when the log has no stream from there. */
static inline int peer_open(moonlet_repl_log *l, const char *who, uint64_t from, bool *lost)
{
    uint64_t next, ticket;
    assert_int_equal(moonlet_repl_log_stream_open(l, who, from, 1, lost, &next, &ticket),
                     MOONLET_OK);
    if (*lost)
        return -1;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK); /* as the server hands it over */
    moonlet_repl_log_stream_attach(l, ticket, sv[0], NULL);
    return sv[1];
}

/* Reads exactly len bytes within timeout_ms: false on EOF or timeout. */
static inline bool peer_read(int fd, void *buf, size_t len, int timeout_ms)
{
    size_t got = 0;
    while (got < len) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, timeout_ms) != 1)
            return false;
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n <= 0)
            return false;
        got += (size_t)n;
    }
    return true;
}

/* The next push: its first record number and how many records it holds
 * (0: a heartbeat).  false: the leader closed the stream, or nothing came
 * within timeout_ms. */
static inline bool peer_push(int fd, uint64_t *first, uint64_t *count, int timeout_ms)
{
    uint8_t hdr[MOONLET_FRAME_HEADER_BYTES];
    uint32_t len;
    if (!peer_read(fd, hdr, sizeof(hdr), timeout_ms))
        return false;
    assert_int_equal(moonlet_frame_header_decode(hdr, MOONLET_DEFAULT_MAX_FRAME, &len), 0);
    char *body = malloc(len);
    assert_non_null(body);
    assert_true(peer_read(fd, body, len, timeout_ms));
    moonlet_reply rep;
    assert_int_equal(moonlet_reply_decode(body, len, &rep), 0);
    free(body);
    assert_int_equal(rep.code, 0);
    assert_int_equal(moonlet_wire_len(rep.result), 5);
    assert_int_equal(moonlet_wire_u64(rep.result, 1, first), 0);
    const msgpack_object *b = moonlet_wire_at(rep.result, 2);
    assert_true(b && b->type == MSGPACK_OBJECT_BIN);
    *count = 0;
    for (uint32_t off = 0; off < b->via.bin.size; (*count)++) {
        const uint8_t *p = (const uint8_t *)b->via.bin.ptr + off;
        assert_true(b->via.bin.size - off >= 4);
        off += 4 + ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                    (uint32_t)p[3] << 24);
        assert_true(off <= b->via.bin.size);
    }
    moonlet_reply_destroy(&rep);
    return true;
}

/* Reads pushes until one holds records (heartbeats skipped). */
static inline bool peer_records(int fd, uint64_t *first, uint64_t *count, int timeout_ms)
{
    for (int i = 0; i < 100; i++)
        if (!peer_push(fd, first, count, timeout_ms) || *count)
            return *count != 0;
    return false;
}

/* Acknowledges: the standby applied every record below `next`. */
static inline void peer_ack(int fd, uint64_t next)
{
    moonlet_frame_builder b;
    moonlet_frame_builder_init(&b);
    msgpack_pack_uint64(moonlet_request_begin(&b, 2, MOONLET_M_REPL_ACK, 1), next);
    assert_int_equal(moonlet_frame_finish(&b, MOONLET_DEFAULT_MAX_FRAME), 0);
    assert_int_equal(write(fd, b.buf.data, b.buf.size), (ssize_t)b.buf.size);
    moonlet_frame_builder_destroy(&b);
}

/* Waits (bounded, 5 s) until the log's status satisfies `cond` (an
 * expression over `st`). */
#define PEER_WAIT_STATUS(l, cond)                                                               \
    do {                                                                                        \
        moonlet_repl_log_status st;                                                             \
        bool ok_ = false;                                                                       \
        for (int i_ = 0; i_ < 5000 && !ok_; i_++) {                                             \
            moonlet_repl_log_get_status((l), &st);                                              \
            ok_ = (cond);                                                                       \
            if (!ok_) {                                                                         \
                struct timespec ts_ = {0, 1000000L};                                            \
                nanosleep(&ts_, NULL);                                                          \
            }                                                                                   \
        }                                                                                       \
        assert_true(ok_);                                                                       \
    } while (0)

#endif
