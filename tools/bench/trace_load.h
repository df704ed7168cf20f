/*
 * trace_load.h - Mooncake's conversation trace (one JSON object a line:
 * timestamp in ms, input_length in tokens, hash_ids of its 512-token prefix
 * blocks) loaded into memory for `moonlet-bench trace`.  No I/O beyond
 * reading the file, no locks; a loaded trace is read-only afterwards.
 */
#ifndef MOONLET_BENCH_TRACE_LOAD_H
#define MOONLET_BENCH_TRACE_LOAD_H

#include <stddef.h>
#include <stdint.h>

typedef struct treq {
    uint64_t ts_ms;  /* trace timestamp */
    uint64_t input;  /* prompt tokens */
    uint32_t n;      /* blocks (hash ids) */
    size_t off;      /* first hash id in trace.ids */
} treq;

typedef struct trace {
    treq *r;
    size_t n, cap;
    uint64_t *ids;
    size_t nids, cap_ids;
    uint32_t max_blocks;
} trace;

/* Appends the first `limit` requests (0: all) of the file at path to t
 * (zeroed by the caller).  Blank lines are skipped.  Returns 0, or -1 after
 * printing why to stderr (unreadable file, a malformed line, no request);
 * t is then partly filled: free it with trace_free. */
int trace_load(const char *path, size_t limit, trace *t);
void trace_free(trace *t);

#endif
