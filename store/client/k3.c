/*
 * k3.c - the K3 lookup helpers of include/moonlet/k3.h: where a hybrid-model
 * request resumes, and which keys it loads.
 *
 * Split in two on purpose.  The decisions (KV boundary, candidates, mask
 * validation, lease-all choice, the distributed intersection) are pure
 * functions over result arrays, so they are tested without a cluster and an
 * engine that issues its own RPCs can reuse them.  moonlet_k3_lookup() only
 * names the keys through the caller's builder, makes the one or two calls,
 * and hands the pure functions their answers.
 *
 * The selective path is one round trip, ProbeResume: the candidates depend
 * on the KV boundary, so the master computes it and restricts them itself,
 * and leases only what the engine loads (the selected checkpoint and the KV
 * blocks below it).  Against a master without it (INVALID_VERSION) it takes
 * two: BatchExistKey on the KV keys, then BatchProbeKey(LAST_HIT_ONLY) on the
 * checkpoints within the boundary.  The lease-all mode exists to measure what
 * leasing every hit costs.
 *
 * The builder's strings are copied once; the KV keys of the result are the
 * same allocations that were probed, moved rather than copied.  No locks.
 */
#include "moonlet/k3.h"

#include <stdlib.h>
#include <string.h>

#include "moonlet/error.h"

/* ---- pure decisions ---------------------------------------------------------- */

size_t moonlet_k3_keys_per_checkpoint(const moonlet_k3_layout *l)
{
    if (!l || !l->groups || !l->ranks || !l->components)
        return 0;
    uint64_t n = (uint64_t)l->groups * l->ranks;
    if (n > SIZE_MAX / l->components)
        return 0;
    return (size_t)(n * l->components);
}

int moonlet_k3_request_check(const moonlet_k3_layout *l, const moonlet_k3_request *r)
{
    if (!l || !r || !l->block_tokens || !moonlet_k3_keys_per_checkpoint(l))
        return MOONLET_ERR_INVALID_PARAMS;
    if (!r->prompt_tokens || !r->kv_blocks || (r->n_checkpoints && !r->checkpoints))
        return MOONLET_ERR_INVALID_PARAMS;
    if (r->mode != MOONLET_K3_SELECTIVE && r->mode != MOONLET_K3_LEASE_ALL &&
        r->mode != MOONLET_K3_SELECTIVE_TWO_CALLS)
        return MOONLET_ERR_INVALID_PARAMS;
    if (r->kv_blocks > SIZE_MAX / sizeof(char *))
        return MOONLET_ERR_INVALID_PARAMS;
    for (size_t i = 0; i < r->n_checkpoints; i++) {
        uint64_t p = r->checkpoints[i];
        if (!p || p % l->block_tokens || (i && p <= r->checkpoints[i - 1]))
            return MOONLET_ERR_INVALID_PARAMS;
    }
    return MOONLET_OK;
}

int moonlet_k3_kv_boundary(const int32_t *exist, uint64_t n, uint64_t block_tokens,
                           uint64_t prompt_tokens, uint64_t *prefix_blocks, uint64_t *boundary)
{
    if ((!exist && n) || !block_tokens || !prefix_blocks || !boundary)
        return MOONLET_ERR_INVALID_PARAMS;
    *prefix_blocks = *boundary = 0;
    uint64_t k = 0;
    while (k < n && exist[k] == 1)
        k++;
    for (uint64_t i = k; i < n; i++)
        if (exist[i] < 0)
            return exist[i];
    *prefix_blocks = k;
    *boundary = k > prompt_tokens / block_tokens ? prompt_tokens : k * block_tokens;
    return MOONLET_OK;
}

size_t moonlet_k3_candidates(const moonlet_k3_request *r, uint64_t kv_boundary)
{
    size_t k = 0;
    while (k < r->n_checkpoints) {
        uint64_t p = r->checkpoints[k];
        if (p > kv_boundary || p > r->prompt_tokens ||
            (r->recompute_last_token && p == r->prompt_tokens))
            break;
        k++;
    }
    return k;
}

/* How many of a candidate's `per` results are 1; a negative result or one
 * that is neither 0 nor 1 goes to *bad (the first one seen). */
static size_t count_true(const int32_t *v, size_t per, int32_t *bad)
{
    size_t t = 0;
    for (size_t j = 0; j < per; j++) {
        if (v[j] == 1)
            t++;
        else if (v[j] != 0 && *bad == 0)
            *bad = v[j];
    }
    return t;
}

/* The argument checks both selectors start with; *selected is NONE until
 * a selection succeeds. */
static int selector_args(const int32_t *v, size_t candidates, size_t per, size_t *selected)
{
    if (!selected)
        return MOONLET_ERR_INVALID_PARAMS;
    *selected = MOONLET_K3_NONE;
    if ((!v && candidates) || !per)
        return MOONLET_ERR_INVALID_PARAMS;
    return MOONLET_OK;
}

/* How a selection ends: a per-key error (bad < 0) outranks a malformed
 * vector (another value than 0/1, or broken); else sel is the result. */
static int selector_result(int32_t bad, bool broken, size_t sel, size_t *selected)
{
    if (bad < 0)
        return bad;
    if (bad || broken)
        return MOONLET_ERR_INTERNAL_ERROR;
    *selected = sel;
    return MOONLET_OK;
}

int moonlet_k3_check_mask(const int32_t *mask, size_t candidates, size_t per, size_t *selected)
{
    int rc = selector_args(mask, candidates, per, selected);
    if (rc)
        return rc;
    size_t sel = MOONLET_K3_NONE;
    int32_t bad = 0;
    bool broken = false;
    for (size_t i = 0; i < candidates; i++) {
        size_t t = count_true(mask + i * per, per, &bad);
        if (t == 0)
            continue;
        if (t != per || sel != MOONLET_K3_NONE)
            broken = true; /* partial, or a second true candidate */
        sel = i;
    }
    return selector_result(bad, broken, sel, selected);
}

int moonlet_k3_last_complete(const int32_t *exist, size_t candidates, size_t per,
                             size_t *selected)
{
    int rc = selector_args(exist, candidates, per, selected);
    if (rc)
        return rc;
    size_t sel = MOONLET_K3_NONE;
    int32_t bad = 0;
    for (size_t i = 0; i < candidates; i++)
        if (count_true(exist + i * per, per, &bad) == per)
            sel = i;
    return selector_result(bad, false, sel, selected);
}

static bool contains(const uint64_t *v, size_t n, uint64_t x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

int moonlet_k3_common_resume(const uint64_t *const *positions, const size_t *counts,
                             size_t participants, uint64_t *out)
{
    if (!positions || !counts || !participants || !out)
        return MOONLET_ERR_INVALID_PARAMS;
    for (size_t p = 0; p < participants; p++)
        if (counts[p] && !positions[p])
            return MOONLET_ERR_INVALID_PARAMS;
    uint64_t best = 0;
    for (size_t i = 0; i < counts[0]; i++) {
        uint64_t x = positions[0][i];
        bool everywhere = x > best;
        for (size_t p = 1; p < participants && everywhere; p++)
            everywhere = contains(positions[p], counts[p], x);
        if (everywhere)
            best = x;
    }
    *out = best;
    return MOONLET_OK;
}

/* ---- the lookup ---------------------------------------------------------------- */

typedef struct k3_keys {
    char **v;
    size_t n;
} k3_keys;

static void keys_free(k3_keys *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->v[i]);
    free(k->v);
    k->v = NULL;
    k->n = 0;
}

/* Appends the builder's key for id to k (which has room). */
static int keys_add(k3_keys *k, moonlet_k3_key_fn fn, void *ctx, const moonlet_k3_key_id *id)
{
    char buf[MOONLET_MAX_KEY_BYTES + 1];
    int len = fn(ctx, id, buf, sizeof(buf));
    if (len < 0)
        return len;
    if (len == 0 || (size_t)len >= sizeof(buf))
        return MOONLET_ERR_INVALID_KEY;
    char *s = malloc((size_t)len + 1);
    if (!s)
        return MOONLET_ERR_INTERNAL_ERROR;
    memcpy(s, buf, (size_t)len);
    s[len] = '\0';
    k->v[k->n++] = s;
    return MOONLET_OK;
}

static int keys_alloc(k3_keys *k, size_t cap)
{
    k->n = 0;
    k->v = malloc((cap ? cap : 1) * sizeof(*k->v));
    return k->v ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
}

/* The KV keys of blocks 0 .. kv_blocks - 1, then the keys of checkpoints
 * 0 .. ckpts - 1, each checkpoint's keys in group -> rank -> component order. */
static int keys_build(const moonlet_k3_layout *l, const moonlet_k3_request *r, size_t ckpts,
                      moonlet_k3_key_fn fn, void *ctx, k3_keys *k)
{
    size_t per = moonlet_k3_keys_per_checkpoint(l);
    if (ckpts > (SIZE_MAX / sizeof(char *) - r->kv_blocks) / per)
        return MOONLET_ERR_INVALID_PARAMS;
    int rc = keys_alloc(k, (size_t)r->kv_blocks + ckpts * per);
    moonlet_k3_key_id id = {.kind = MOONLET_K3_KEY_KV};
    for (uint64_t b = 0; !rc && b < r->kv_blocks; b++) {
        id.block = b;
        rc = keys_add(k, fn, ctx, &id);
    }
    id = (moonlet_k3_key_id){.kind = MOONLET_K3_KEY_KDA};
    for (size_t i = 0; !rc && i < ckpts; i++) {
        id.position = r->checkpoints[i];
        for (id.group = 0; !rc && id.group < l->groups; id.group++)
            for (id.rank = 0; !rc && id.rank < l->ranks; id.rank++)
                for (id.component = 0; !rc && id.component < l->components; id.component++)
                    rc = keys_add(k, fn, ctx, &id);
    }
    if (rc)
        keys_free(k);
    return rc;
}

/* Moves the KV keys below the resume position and the selected checkpoint's
 * keys out of `all` (kv_blocks KV keys, then the candidates' keys) into the
 * result; what stays in `all` is freed by the caller. */
static int result_take_keys(moonlet_k3_result *out, k3_keys *all, uint64_t kv_blocks,
                            size_t per, uint64_t block_tokens)
{
    if (out->checkpoint == MOONLET_K3_NONE)
        return MOONLET_OK;
    size_t kv = (size_t)(out->resume_position / block_tokens);
    out->keys = malloc((kv + per) * sizeof(*out->keys));
    if (!out->keys)
        return MOONLET_ERR_INTERNAL_ERROR;
    char **ckpt = all->v + kv_blocks + out->checkpoint * per;
    for (size_t i = 0; i < kv; i++) {
        out->keys[i] = all->v[i];
        all->v[i] = NULL;
    }
    for (size_t j = 0; j < per; j++) {
        out->keys[kv + j] = ckpt[j];
        ckpt[j] = NULL;
    }
    out->kv_keys = kv;
    out->kda_keys = per;
    return MOONLET_OK;
}

static uint64_t count_ones(const int32_t *v, size_t n)
{
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += v[i] == 1;
    return k;
}

/* The first negative entry of v[0..n), or 0. */
static int first_error(const int32_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] < 0)
            return v[i];
    return MOONLET_OK;
}

/* One BatchExistKey over keys[0..n) (the KV keys first), then the KV
 * boundary from its first kv_blocks results. */
static int exist_and_boundary(moonlet_client *c, const moonlet_k3_layout *l,
                              const moonlet_k3_request *r, const char *const *keys, size_t n,
                              const char *tenant, int32_t *res, moonlet_k3_result *out)
{
    int rc = moonlet_client_batch_exist_key(c, keys, n, tenant, res);
    out->rpcs = 1;
    if (rc)
        return rc;
    return moonlet_k3_kv_boundary(res, r->kv_blocks, l->block_tokens, r->prompt_tokens,
                                  &out->kv_prefix_blocks, &out->kv_boundary);
}

/* One BatchExistKey over the KV keys and every reachable checkpoint's keys. */
static int lookup_lease_all(moonlet_client *c, const moonlet_k3_layout *l,
                            const moonlet_k3_request *r, const k3_keys *all, size_t reach,
                            const char *tenant, int32_t *res, moonlet_k3_result *out)
{
    size_t per = moonlet_k3_keys_per_checkpoint(l), kv = (size_t)r->kv_blocks;
    int rc = exist_and_boundary(c, l, r, (const char *const *)all->v, all->n, tenant, res, out);
    if (rc)
        return rc;
    if ((rc = first_error(res + kv, reach * per)))
        return rc;
    out->kv_hits = out->kv_leased = count_ones(res, kv);
    out->kda_leased = count_ones(res + kv, reach * per);
    out->candidates = moonlet_k3_candidates(r, out->kv_boundary);
    return moonlet_k3_last_complete(res + kv, out->candidates, per, &out->checkpoint);
}

/* BatchExistKey over the KV keys; BatchProbeKey(LAST_HIT_ONLY) over the
 * candidates within the KV boundary. */
static int lookup_selective(moonlet_client *c, const moonlet_k3_layout *l,
                            const moonlet_k3_request *r, const k3_keys *all, const char *tenant,
                            int32_t *res, moonlet_k3_result *out)
{
    size_t per = moonlet_k3_keys_per_checkpoint(l), kv = (size_t)r->kv_blocks;
    const char *const *keys = (const char *const *)all->v;
    int rc = exist_and_boundary(c, l, r, keys, kv, tenant, res, out);
    if (rc)
        return rc;
    out->kv_hits = out->kv_leased = count_ones(res, kv);
    out->candidates = moonlet_k3_candidates(r, out->kv_boundary);
    if (!out->candidates)
        return MOONLET_OK;
    moonlet_grant_lease_policy pol = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, per};
    rc = moonlet_client_batch_probe_key(c, keys + kv, out->candidates * per, pol, tenant, res + kv);
    out->rpcs = 2;
    if (rc)
        return rc;
    if ((rc = moonlet_k3_check_mask(res + kv, out->candidates, per, &out->checkpoint)))
        return rc;
    out->kda_leased = out->checkpoint == MOONLET_K3_NONE ? 0 : per;
    return MOONLET_OK;
}

static uint64_t bounds_kv(const moonlet_k3_request *r, const moonlet_k3_layout *l, size_t ckpt)
{
    return r->checkpoints[ckpt] / l->block_tokens;
}

/* ProbeResume: the whole lookup in one round trip.  Every reachable
 * checkpoint is a candidate, with boundary position / block_tokens KV keys;
 * the master keeps those within the KV prefix and leases the selected one's
 * keys and the KV keys below it.  INVALID_VERSION from an older master (the
 * caller then takes the two-call path). */
static int lookup_one_rtt(moonlet_client *c, const moonlet_k3_layout *l,
                          const moonlet_k3_request *r, const k3_keys *all, size_t reach,
                          const char *tenant, int32_t *res, moonlet_k3_result *out)
{
    size_t per = moonlet_k3_keys_per_checkpoint(l), kv = (size_t)r->kv_blocks;
    uint64_t *bounds = malloc((reach ? reach : 1) * sizeof(*bounds));
    if (!bounds)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (size_t i = 0; i < reach; i++)
        bounds[i] = r->checkpoints[i] / l->block_tokens;
    const char *const *keys = (const char *const *)all->v;
    moonlet_probe_resume_result pr;
    int rc = moonlet_client_probe_resume(c, keys, kv, keys + kv, reach * per, per, bounds, tenant,
                                         &pr, res + kv);
    free(bounds);
    out->rpcs = 1;
    if (rc)
        return rc;
    if (pr.kv_prefix > kv)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (size_t i = 0; i < kv; i++) /* the prefix as BatchExistKey results */
        res[i] = i < pr.kv_prefix;
    if ((rc = moonlet_k3_kv_boundary(res, kv, l->block_tokens, r->prompt_tokens,
                                     &out->kv_prefix_blocks, &out->kv_boundary)))
        return rc;
    out->kv_hits = out->kv_prefix_blocks;
    out->candidates = moonlet_k3_candidates(r, out->kv_boundary);
    if ((rc = moonlet_k3_check_mask(res + kv, reach, per, &out->checkpoint)))
        return rc;
    /* the mask and the selection must agree, and lie within the candidates */
    bool none = out->checkpoint == MOONLET_K3_NONE;
    if (none ? pr.selected != -1
             : (pr.selected < 0 || (size_t)pr.selected != out->checkpoint ||
                out->checkpoint >= out->candidates)) {
        out->checkpoint = MOONLET_K3_NONE;
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    out->kda_leased = none ? 0 : per;
    out->kv_leased = none ? 0 : bounds_kv(r, l, out->checkpoint);
    return MOONLET_OK;
}

int moonlet_k3_lookup(moonlet_client *c, const moonlet_k3_layout *l,
                      const moonlet_k3_request *r, moonlet_k3_key_fn fn, void *ctx,
                      const char *tenant, moonlet_k3_result *out)
{
    if (!out)
        return MOONLET_ERR_INVALID_PARAMS;
    memset(out, 0, sizeof(*out));
    out->checkpoint = MOONLET_K3_NONE;
    if (!c || !fn)
        return MOONLET_ERR_INVALID_PARAMS;
    int rc = moonlet_k3_request_check(l, r);
    if (rc)
        return rc;
    /* Checkpoints that any KV boundary could admit: the probed blocks' reach. */
    uint64_t reach_tokens = r->kv_blocks > r->prompt_tokens / l->block_tokens
                                ? r->prompt_tokens
                                : r->kv_blocks * l->block_tokens;
    size_t reach = moonlet_k3_candidates(r, reach_tokens);
    size_t per = moonlet_k3_keys_per_checkpoint(l);
    k3_keys all;
    if ((rc = keys_build(l, r, reach, fn, ctx, &all)))
        return rc;
    int32_t *res = malloc(all.n * sizeof(*res));
    if (!res) {
        keys_free(&all);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    if (r->mode == MOONLET_K3_LEASE_ALL) {
        rc = lookup_lease_all(c, l, r, &all, reach, tenant, res, out);
    } else {
        rc = MOONLET_ERR_INVALID_VERSION;
        if (r->mode == MOONLET_K3_SELECTIVE)
            rc = lookup_one_rtt(c, l, r, &all, reach, tenant, res, out);
        if (rc == MOONLET_ERR_INVALID_VERSION) { /* an older master: two calls */
            memset(out, 0, sizeof(*out));
            out->checkpoint = MOONLET_K3_NONE;
            rc = lookup_selective(c, l, r, &all, tenant, res, out);
        }
    }
    if (!rc && out->checkpoint != MOONLET_K3_NONE)
        out->resume_position = r->checkpoints[out->checkpoint];
    if (!rc)
        rc = result_take_keys(out, &all, r->kv_blocks, per, l->block_tokens);
    free(res);
    keys_free(&all);
    if (rc) {
        moonlet_k3_result_free(out);
    }
    return rc;
}

void moonlet_k3_result_free(moonlet_k3_result *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->kv_keys + r->kda_keys && r->keys; i++)
        free(r->keys[i]);
    free(r->keys);
    memset(r, 0, sizeof(*r));
    r->checkpoint = MOONLET_K3_NONE;
}
