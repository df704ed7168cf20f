/*
 * moonlet/k3.h - K3 lookup helpers: where a hybrid-model request resumes,
 * and exactly which keys it loads.
 *
 * A hybrid model (attention plus recurrent "KDA" layers) can skip the prefill
 * of a prefix only when both halves of its state are cached for that prefix:
 * attention KV blocks covering it, and a KDA checkpoint (the recurrent state)
 * taken exactly at its end.  Checkpoints exist only at some block boundaries,
 * and one checkpoint is several physical keys (cache groups x ranks x
 * components).  moonlet_k3_lookup() answers the question in one master
 * round trip (ProbeResume: the master does steps 1-3 itself and leases only
 * the selected checkpoint and the KV blocks below it), or, against a master
 * that predates ProbeResume, in two:
 *
 *   1. BatchExistKey over the request's KV keys (leasing every hit, Mooncake
 *      semantics) gives the KV boundary: the longest prefix of present blocks.
 *   2. The candidates are the checkpoints at or below that boundary (and below
 *      the resume bound, see recompute_last_token), in increasing position;
 *      each candidate's keys are contiguous, ordered group -> rank ->
 *      component, and a member that may be missing is never left out.
 *   3. BatchProbeKey(LAST_HIT_ONLY, candidate_size = keys per checkpoint)
 *      leases the last complete candidate only.  Its mask is validated: at
 *      most one candidate may be true, and only as a whole.
 *   4. The result: the resume position (the selected checkpoint's, or 0) and
 *      the keys to load (the KV blocks below it, then its checkpoint keys).
 *
 * Key naming is the caller's: a moonlet_k3_key_fn callback names every key,
 * so vLLM-style and SGLang-style layouts both fit.  Positions are token
 * counts; KV block i covers tokens [i * block_tokens, (i + 1) * block_tokens).
 *
 * Across ranks and pipeline stages the common resume point is the largest
 * position complete on every participant: moonlet_k3_common_resume().
 *
 * The pure steps (boundary, candidates, mask check, selection, intersection)
 * are exported too, for engines that issue the RPCs themselves.
 *
 * Conventions as in moonlet/client.h: 0 or a negative moonlet error code;
 * the pure functions never block and are thread safe; moonlet_k3_lookup()
 * blocks for its round trips and is as thread safe as the client.
 */
#ifndef MOONLET_K3_H
#define MOONLET_K3_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moonlet/client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* "No checkpoint selected", as an index. */
#define MOONLET_K3_NONE SIZE_MAX

/* How a checkpoint is split into physical keys, and the KV block size. */
typedef struct moonlet_k3_layout {
    uint64_t block_tokens; /* tokens per KV block (> 0) */
    uint32_t groups;       /* KDA cache groups per checkpoint (>= 1) */
    uint32_t ranks;        /* ranks holding a share of every group (>= 1) */
    uint32_t components;   /* physical objects per (group, rank), e.g. conv + ssm state (>= 1) */
} moonlet_k3_layout;

typedef enum moonlet_k3_key_kind {
    MOONLET_K3_KEY_KV = 0,  /* a KV block: `block` is set */
    MOONLET_K3_KEY_KDA = 1, /* a checkpoint member: position, group, rank, component are set */
} moonlet_k3_key_kind;

/* Names one physical key. */
typedef struct moonlet_k3_key_id {
    moonlet_k3_key_kind kind;
    uint64_t block;     /* KV: the block index */
    uint64_t position;  /* KDA: the checkpoint's position in tokens */
    uint32_t group;     /* KDA: 0 .. groups - 1 */
    uint32_t rank;      /* KDA: 0 .. ranks - 1 */
    uint32_t component; /* KDA: 0 .. components - 1 */
} moonlet_k3_key_id;

/*
 * Writes the key named by `id` into buf (cap bytes, room for the NUL) and
 * returns its length, snprintf-style.  A length of 0 or >= cap makes the
 * lookup fail with INVALID_KEY; a negative return makes it fail with that
 * code.  Called from the thread that called the lookup, never concurrently
 * for one lookup.
 */
typedef int (*moonlet_k3_key_fn)(void *ctx, const moonlet_k3_key_id *id, char *buf, size_t cap);

typedef enum moonlet_k3_mode {
    /* One ProbeResume: leases the selected checkpoint and the KV blocks below
     * it, nothing else (nothing at all when none is selected).  Against a
     * master without ProbeResume: MOONLET_K3_SELECTIVE_TWO_CALLS (the master
     * client remembers per connection that the master refused it, so only
     * the first lookup on a connection pays for the refused call; rpcs does
     * not count it). */
    MOONLET_K3_SELECTIVE = 0,
    /* One BatchExistKey over every KV key and every KDA key of the
     * checkpoints below the resume bound, then the same choice: leases every
     * hit.  What an engine without BatchProbeKey does; kept for comparison
     * (moonlet-bench trace) and for masters that predate the policy. */
    MOONLET_K3_LEASE_ALL = 1,
    /* KV with BatchExistKey, then BatchProbeKey(LAST_HIT_ONLY): leases the
     * KV hits and one checkpoint; two round trips (one when no checkpoint
     * is within the KV boundary).  What SELECTIVE did before ProbeResume;
     * kept for older masters and for comparison (moonlet-bench trace). */
    MOONLET_K3_SELECTIVE_TWO_CALLS = 2,
} moonlet_k3_mode;

typedef struct moonlet_k3_request {
    uint64_t prompt_tokens;      /* tokens of the prompt (> 0) */
    uint64_t kv_blocks;          /* KV blocks to probe, from block 0 (> 0) */
    const uint64_t *checkpoints; /* positions where a checkpoint may exist: strictly
                                    increasing, each > 0 and a multiple of block_tokens */
    size_t n_checkpoints;
    /* The engine recomputes the last prompt token (Eagle-style speculative
     * decoding needs its hidden state): the resume position must then be
     * strictly below prompt_tokens.  Otherwise it may equal prompt_tokens. */
    bool recompute_last_token;
    moonlet_k3_mode mode;        /* default (0): SELECTIVE */
} moonlet_k3_request;

typedef struct moonlet_k3_result {
    uint64_t resume_position;  /* tokens not recomputed: the selected checkpoint's position, or 0 */
    size_t checkpoint;         /* index of the selected checkpoint in request.checkpoints, or
                                  MOONLET_K3_NONE */
    uint64_t kv_prefix_blocks; /* leading KV blocks present */
    uint64_t kv_boundary;      /* tokens they cover (at most prompt_tokens) */
    size_t candidates;         /* checkpoints considered: within kv_boundary and the resume bound */
    size_t kv_keys;            /* keys[0 .. kv_keys): KV blocks below resume_position */
    size_t kda_keys;           /* keys[kv_keys ..]: the selected checkpoint's keys (or 0) */
    char **keys;               /* the kv_keys + kda_keys keys to load, owned by the result */
    uint32_t rpcs;             /* master round trips made (1 or 2) */
    uint64_t kv_hits;          /* KV keys found present (one-call path: the prefix only) */
    uint64_t kda_leased;       /* KDA keys this lookup leased or renewed */
    uint64_t kv_leased;        /* KV keys this lookup leased or renewed (one-call path: the
                                  blocks below the resume position; else every KV hit) */
} moonlet_k3_result;

/* Keys per checkpoint: groups * ranks * components (0 for a bad layout). */
MOONLET_API size_t moonlet_k3_keys_per_checkpoint(const moonlet_k3_layout *layout);

/* INVALID_PARAMS unless layout and request satisfy the rules above. */
MOONLET_API int moonlet_k3_request_check(const moonlet_k3_layout *layout, const moonlet_k3_request *req);

/*
 * Step 1, pure: the KV boundary from BatchExistKey results of blocks 0..n-1.
 * *prefix_blocks gets the number of leading 1s and *boundary the tokens they
 * cover, capped at prompt_tokens.  A negative entry anywhere is returned
 * (errors stay errors; the outputs are then 0).  INVALID_PARAMS for NULL
 * pointers or block_tokens 0.
 */
MOONLET_API int moonlet_k3_kv_boundary(const int32_t *exist, uint64_t n, uint64_t block_tokens,
                                       uint64_t prompt_tokens, uint64_t *prefix_blocks, uint64_t *boundary);

/*
 * Step 2, pure: how many leading checkpoints of the (checked) request are
 * candidates given a KV boundary: position <= kv_boundary and position below
 * the resume bound (< prompt_tokens with recompute_last_token, else <=).
 * Checkpoints are increasing, so the candidates are always a prefix.
 */
MOONLET_API size_t moonlet_k3_candidates(const moonlet_k3_request *req, uint64_t kv_boundary);

/*
 * Step 3, pure: validates a LAST_HIT_ONLY mask over `candidates` candidates
 * of `per` keys.  Returns 0 with *selected = the index of the one all-true
 * candidate, or MOONLET_K3_NONE when all are false.  A negative entry is
 * returned as is.  MOONLET_ERR_INTERNAL_ERROR when the mask breaks the
 * contract: a partially true candidate, a second true candidate, or a value
 * other than 0/1.  *selected is MOONLET_K3_NONE on every error.
 */
MOONLET_API int moonlet_k3_check_mask(const int32_t *mask, size_t candidates, size_t per, size_t *selected);

/*
 * The lease-all choice, pure: from BatchExistKey results over the candidates
 * (`per` keys each), the last candidate whose every key is 1.  A negative
 * entry is returned as is.  *selected as for check_mask.
 */
MOONLET_API int moonlet_k3_last_complete(const int32_t *exist, size_t candidates, size_t per,
                                         size_t *selected);

/*
 * The distributed rule: the largest position present in every participant's
 * set of complete checkpoint positions (their intersection), not the minimum
 * of each participant's maximum: {128, 384} and {128, 256} give 128.
 * positions[i] holds counts[i] positions in any order (duplicates allowed).
 * Returns 0 and *out = that position, or 0 when the sets share none (resume
 * from the start).  INVALID_PARAMS for NULL arrays or participants == 0.
 * O(counts[0] * sum(counts)); allocates nothing.
 */
MOONLET_API int moonlet_k3_common_resume(const uint64_t *const *positions, const size_t *counts,
                                         size_t participants, uint64_t *out);

/*
 * The whole lookup (steps 1-4) against the master, for `tenant` (NULL: the
 * client's default).  On success *out owns its keys: release them with
 * moonlet_k3_result_free().  On error *out is zeroed (nothing to free) and
 * leases already granted stay (they expire with their TTL).  Returns 0, or
 *   INVALID_PARAMS   a NULL argument, a bad layout or request
 *   INVALID_KEY      the key builder produced an empty or over-long key
 *   INTERNAL_ERROR   the probe mask broke its contract, or out of memory
 *   a per-key error from the master (a KV or KDA result that is negative)
 *   the errors of moonlet_client_probe_resume / batch_exist_key / batch_probe_key
 *   whatever negative code the key builder returned
 * Blocks for one round trip (two or three against an older master); thread
 * safe as the client is.
 */
MOONLET_API int moonlet_k3_lookup(moonlet_client *c, const moonlet_k3_layout *layout,
                                  const moonlet_k3_request *req, moonlet_k3_key_fn key_fn, void *key_ctx,
                                  const char *tenant, moonlet_k3_result *out);

/* Frees the keys of a result and zeroes it.  NULL or a zeroed result: no-op. */
MOONLET_API void moonlet_k3_result_free(moonlet_k3_result *r);

#ifdef __cplusplus
}
#endif
#endif
