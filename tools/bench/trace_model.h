/*
 * trace_model.h - the cache model `moonlet-bench trace` replays a trace
 * with, as far as it needs no cluster: the hybrid attention + KDA layout
 * (one KV object per 512-token block; a KDA checkpoint every kda_every blocks,
 * of `ranks` objects), the keys objects are named by, the working set a
 * trace can ever put, and the hit ratios of a cache that never evicts (the
 * bound any eviction policy is measured against).  Pure computation: no
 * I/O, no locks.
 */
#ifndef MOONLET_BENCH_TRACE_MODEL_H
#define MOONLET_BENCH_TRACE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moonlet/k3.h"
#include "trace_load.h"

#define BLOCK_TOKENS 512u /* the trace's hash block */

/* The model's parameters (moonlet-bench trace's flags of the same names). */
typedef struct trace_model {
    uint32_t kda_every, ranks;
    uint64_t kv_bytes, kda_bytes;
} trace_model;

typedef struct working_set {
    size_t kv_objects, checkpoints;
    uint64_t bytes;
} working_set;

/* An open-addressing set of hash ids (id + 1 stored, so 0 marks a free slot). */
typedef struct idset {
    uint64_t *slot;
    size_t mask;
} idset;

/* Blocks covered by the checkpoint an engine stores after prefilling q: the
 * last multiple of `every` within the prompt's full blocks (0: none). */
uint32_t end_checkpoint_blocks(const treq *q, uint32_t every);
/* moonlet_k3_key_fn over a request's hash ids (ctx): "kv/<hash>" for a
 * block, "kda/<hash of its last block>/r<rank>" for a checkpoint. */
int trace_key(void *ctx, const moonlet_k3_key_id *id, char *buf, size_t cap);
/* Sorts v and returns how many distinct values it holds. */
size_t count_unique(uint64_t *v, size_t n);
/* Every distinct object the replay can ever put, and their bytes at the
 * master's 64-byte allocation granule.  Returns 0 or -1 (no memory). */
int working_set_of(const trace *t, const trace_model *o, working_set *ws);

int idset_init(idset *s, size_t expected); /* 0 or -1; free s->slot */
bool idset_has(const idset *s, uint64_t id);
void idset_add(idset *s, uint64_t id);

/* The hit ratios (of all blocks) of a cache that never evicts, same model as
 * the replay: KV blocks hit and blocks resumed from a checkpoint (with
 * final-token recompute: resume strictly below the prompt).  0 or -1. */
int reference_hits(const trace *t, const trace_model *o, const working_set *ws,
                   double *kv_ratio, double *kda_ratio);

#endif
