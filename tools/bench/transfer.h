/*
 * transfer.h - `moonlet-bench transfer`: data-plane bandwidth of the TCP
 * transport against a plain loopback socket stream (tools/bench/transfer.c).
 */
#ifndef MOONLET_BENCH_TRANSFER_H
#define MOONLET_BENCH_TRANSFER_H

/* Runs the benchmark; argv[0] is the subcommand name.  Flags:
 *   --json             print one JSON object instead of a table
 *   --rounds N         rounds per measurement (median reported; default 5)
 *   --segment-mib N    served segment size (default 1024)
 *   --server-threads N serving pool size (default 4)
 *   --tls              also a TLS socket stream (transport/tls.c, mutual TLS
 *                      with throwaway certificates) beside the plain one: what
 *                      TLS costs a TCP byte stream at each size
 * Returns 0, 1 on a failed transfer, 2 on bad flags. */
int moonlet_bench_transfer(int argc, char **argv);

#include <stdint.h>

/* The plain-socket baseline: one loopback TCP connection, a sender thread
 * streaming `bytes` from src in chunks of `size`, the receiver reading each
 * chunk into dst (room for `size`); GB/s at the receiver, -1 on a socket
 * error.  A round is cut short after two seconds. */
double moonlet_bench_plain_gbps(uint8_t *src, uint8_t *dst, uint64_t size, uint64_t bytes);

/* `moonlet-bench transfer --device-buffers` (tools/bench/device.c): the
 * client's puts and gets from and into CUDA device memory beside host
 * memory, one run.  Exit status: 0, 1 (failed), 2 (bad flags). */
int bench_device_main(int argc, char **argv);

#endif
