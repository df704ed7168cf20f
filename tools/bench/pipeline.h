/*
 * pipeline.h - filling a master's table fast: PutStart then PutEnd for a
 * range of keys on one raw RPC connection, a window of requests in flight.
 * moonlet-bench rpc fills its masters with it, and so does the test helper
 * tests/tools/mlt-put (`fill`).  Owns no state and takes no locks; the
 * connection is the caller's.
 */
#ifndef MOONLET_BENCH_PIPELINE_H
#define MOONLET_BENCH_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "rpc_client.h"

#define BENCH_PIPELINE_WINDOW 512 /* requests in flight */
#define BENCH_PIPELINE_KEY_MAX 512 /* bytes of a key, its NUL included */

/* Writes key number i (NUL-terminated, at most cap bytes) into buf. */
typedef void (*bench_key_fn)(void *ctx, uint64_t i, char *buf, size_t cap);

/* PutStart [tenant, key, size, 1 replica, not hard-pinned] for the keys
 * key(ctx, i), i in [from, to), then PutEnd [tenant, key] for the same
 * keys.  Returns 0, or the first transport error or non-zero reply code. */
int bench_fill_range(moonlet_rpc_client *c, const char *tenant, uint64_t size, uint64_t from,
                     uint64_t to, bench_key_fn key, void *ctx);

#endif
