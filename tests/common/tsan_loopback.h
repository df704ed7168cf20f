/*
 * tsan_loopback.h - ThreadSanitizer suppressions for tests that run store
 * nodes and clients in one process.
 *
 * TSan sees a server worker's copy between a segment and a socket, and a
 * later access to the same memory by another thread (the test checking or
 * corrupting segment bytes, another worker's copy), but not the round trip
 * through the loopback socket that orders them.  Only the two copy functions
 * of transport/xfer_tcp.c are exempt; every other access (pool, segment
 * table, connections, client buffers) is still checked.  Include this header
 * from exactly one source file of a test binary.
 */
#ifndef MOONLET_TEST_TSAN_LOOPBACK_H
#define MOONLET_TEST_TSAN_LOOPBACK_H

const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "race:tcp_segment_send\nrace:tcp_segment_recv\n";
}

#endif
