/*
 * probe_resume.c - ProbeResume: the whole K3 lookup in one master call.
 *
 * Input: the request's KV keys in order, the flat list of KDA candidate keys
 * (candidate_size keys each, in order of increasing resume position) and, per
 * candidate, its resume boundary: how many leading KV keys it needs.  Output:
 * the KV prefix (leading readable KV keys), the selected candidate (or none)
 * and the selected-only mask over the KDA keys.  Exactly the selected
 * candidate's KDA keys and the KV keys below its boundary are leased; with no
 * candidate selected nothing is leased.
 *
 *   0. check: every key is checked first (INVALID_KEY fails the request and
 *      leases nothing).
 *   1. fast path: the last candidate's own keys are scanned; when all are
 *      readable it is validated (step 3) without the KV scan; when it is
 *      selected, the KV keys past its boundary are scanned for the prefix (no
 *      lease) and the call is done: one pass over the KV keys when everything
 *      is cached.  A failed validation counts as a fallback; either way:
 *   2. scan: the KV keys are scanned in grouped batch lookups (guard shared,
 *      each group's shard locks ascending) until the first unreadable one:
 *      the KV prefix.  No lease.  Then the walk: the other candidates whose
 *      boundary lies within the prefix, from the last to the first.  For
 *      each: scan its KDA keys (no lease); when all are readable, validate it.
 *   3. validate: take the guard shared, then the distinct shard locks of its
 *      KDA keys and of the KV keys below its boundary, in ascending shard
 *      index (a bitmap of shards gives the order); recheck every one of them;
 *      if all are still readable, lease each before releasing, and the
 *      mask names exactly that candidate; otherwise release and walk on
 *      (a fallback).
 *
 * So a selection is never partially leased, and what the mask says is what
 * gained leases: the recheck and the leases happen under the same locks.
 * A key listed twice is one object.  Granting its lease twice is harmless
 * (the grant is max(deadline, now + TTL)), and the statistics count distinct
 * keys - within a tenant, the same key is the same object - with a small
 * hash set over the keys' hashes, after the locks are released.
 *
 * The test hook (cfg.probe_hook) runs before each validation (the fast
 * path's too), no lock held.
 *
 * Locks: guard (shared) -> shard locks, ascending.  Never the registry lock.
 * A validation holds one shard lock per distinct shard of its keys: up to
 * boundary + candidate_size (about 120 for 128 KV blocks and 1024 shards).
 * ThreadSanitizer's deadlock detector tracks at most 64 locks held by one
 * thread and stops the process beyond that, so a TSan build serving such
 * requests needs TSAN_OPTIONS=detect_deadlocks=0 (the stress test stays at
 * 52 keys per selection; the unit tests hold up to 104 and are not run
 * under TSan).
 */
#include <stdlib.h>
#include <string.h>

#include "lease.h"
#include "master_internal.h"
#include "tenant.h"
#include "moonlet/error.h"

#define KV_SCAN_CHUNK 64 /* KV keys per scan step: the scan stops at the first miss */

/* Runs under the key's shard lock: readability only, no lease. */
static void readable_visit(void *arg, size_t i, struct mobj *o)
{
    ((int32_t *)arg)[i] = o && mobj_readable(o);
}

struct pr_scratch {
    uint64_t *kv_hash;      /* n_kv */
    uint64_t *cand_hash;    /* cs */
    uint32_t *kv_shard;     /* n_kv: shard_of(kv_hash), computed once (a division each) */
    uint32_t *cand_shard;   /* cs */
    int32_t *res;           /* max(KV_SCAN_CHUNK, cs) */
    struct mobj **objs;     /* n_kv + cs */
    uint32_t *locked;       /* n_kv + cs */
    uint64_t *bitmap;       /* nshards bits */
    size_t bitmap_words;
    uint32_t *set;          /* distinct-key set: 1 + index, 0 empty; set_mask + 1 slots */
    size_t set_mask;
};

static void record_hold(moonlet_master *m, uint64_t ns)
{
    lock_hold_record(m->st.resume_lock_hold_hist, &m->st.resume_lock_hold_max_ns, ns);
}

/* The leading readable KV keys, kv[from..] scanned in chunks that stop at a
 * miss (kv[0..from) are known to be readable); returns the prefix length. */
static uint64_t scan_kv_prefix(moonlet_master *m, uint32_t tenant, const moonlet_str *kv,
                               size_t from, size_t n_kv, struct pr_scratch *s)
{
    size_t done = from;
    pthread_rwlock_rdlock(&m->guard);
    while (done < n_kv) {
        size_t step = n_kv - done < KV_SCAN_CHUNK ? n_kv - done : KV_SCAN_CHUNK;
        shard_batch_lookup(m, tenant, kv + done, step, s->res, s->kv_hash + done,
                           readable_visit, s->res);
        size_t k = 0;
        while (k < step && s->res[k] == 1)
            k++;
        done += k;
        if (k < step)
            break;
    }
    pthread_rwlock_unlock(&m->guard);
    return done;
}

/* Whether every key of a candidate is readable now (no lease); hashes too. */
static bool scan_candidate(moonlet_master *m, uint32_t tenant, const moonlet_str *keys, size_t cs,
                           struct pr_scratch *s)
{
    pthread_rwlock_rdlock(&m->guard);
    shard_batch_lookup(m, tenant, keys, cs, s->res, s->cand_hash, readable_visit, s->res);
    pthread_rwlock_unlock(&m->guard);
    for (size_t k = 0; k < cs; k++)
        if (s->res[k] != 1)
            return false;
    return true;
}

/* Element i of the selection: the candidate's keys, then kv[0..b). */
static const moonlet_str *sel_key(const moonlet_str *ck, size_t cs, const moonlet_str *kv,
                                  size_t i, uint64_t *hash, const struct pr_scratch *s)
{
    *hash = i < cs ? s->cand_hash[i] : s->kv_hash[i - cs];
    return i < cs ? &ck[i] : &kv[i - cs];
}

/* Inserts element i into the distinct-key set; true when it was new. */
static bool set_insert(struct pr_scratch *s, const moonlet_str *ck, size_t cs,
                       const moonlet_str *kv, size_t i)
{
    uint64_t h, oh;
    const moonlet_str *k = sel_key(ck, cs, kv, i, &h, s);
    for (size_t slot = (size_t)h & s->set_mask;; slot = (slot + 1) & s->set_mask) {
        if (!s->set[slot]) {
            s->set[slot] = (uint32_t)i + 1;
            return true;
        }
        const moonlet_str *o = sel_key(ck, cs, kv, s->set[slot] - 1, &oh, s);
        if (oh == h && o->len == k->len && memcmp(o->ptr, k->ptr, k->len) == 0)
            return false;
    }
}

/* Distinct keys among the candidate's (*kda) and among the KV keys below its
 * boundary that are not also candidate keys (*kv_only).  No lock. */
static void count_distinct(struct pr_scratch *s, const moonlet_str *ck, size_t cs,
                           const moonlet_str *kv, size_t b, uint64_t *kda, uint64_t *kv_only)
{
    memset(s->set, 0, (s->set_mask + 1) * sizeof(*s->set));
    *kda = *kv_only = 0;
    for (size_t i = 0; i < cs + b; i++)
        if (set_insert(s, ck, cs, kv, i))
            (*(i < cs ? kda : kv_only))++;
}

/*
 * Recheck and lease one candidate under its locks: the KDA keys `ck`
 * (hashes in s->cand_hash) and the KV keys kv[0..b) (hashes in s->kv_hash).
 * Returns true when it was selected and leased.
 */
static bool validate(moonlet_master *m, uint32_t tenant, const moonlet_str *kv, size_t b,
                     const moonlet_str *ck, size_t cs, struct pr_scratch *s)
{
    memset(s->bitmap, 0, s->bitmap_words * sizeof(*s->bitmap));
    for (size_t i = 0; i < b; i++)
        s->bitmap[s->kv_shard[i] / 64] |= UINT64_C(1) << (s->kv_shard[i] % 64);
    for (size_t k = 0; k < cs; k++) {
        s->cand_shard[k] = shard_of(m, s->cand_hash[k]);
        s->bitmap[s->cand_shard[k] / 64] |= UINT64_C(1) << (s->cand_shard[k] % 64);
    }
    size_t nlocked = 0;
    for (size_t w = 0; w < s->bitmap_words; w++)
        for (uint64_t bits = s->bitmap[w]; bits; bits &= bits - 1)
            s->locked[nlocked++] = (uint32_t)(w * 64 + (unsigned)__builtin_ctzll(bits));

    /* The lookups under the locks are the hold: their bucket slots are
     * fetched before it, and under it every chain head (with its header
     * and key) before any compare, so the misses overlap rather than
     * queue up one key at a time (docs/benchmarks.md, "Probe"). */
    for (size_t k = 0; k < cs; k++)
        shard_prefetch_slot(m, s->cand_hash[k]);
    for (size_t i = 0; i < b; i++)
        shard_prefetch_slot(m, s->kv_hash[i]);
    pthread_rwlock_rdlock(&m->guard);
    for (size_t i = 0; i < nlocked; i++) /* ascending: the lock order */
        pthread_mutex_lock(&m->shards[s->locked[i]].mu);
    uint64_t t0 = moonlet_clock_real_ns();

    for (size_t k = 0; k < cs; k++)
        s->objs[k] = shard_head_locked(&m->shards[s->cand_shard[k]], s->cand_hash[k], ck[k].len);
    for (size_t i = 0; i < b; i++)
        s->objs[cs + i] = shard_head_locked(&m->shards[s->kv_shard[i]], s->kv_hash[i], kv[i].len);
    bool all = true;
    for (size_t k = 0; k < cs && all; k++) {
        struct mobj *o = shard_chain_find(s->objs[k], s->cand_hash[k], tenant, ck[k].ptr, ck[k].len);
        s->objs[k] = o;
        all = o && mobj_readable(o);
    }
    for (size_t i = 0; i < b && all; i++) {
        struct mobj *o = shard_chain_find(s->objs[cs + i], s->kv_hash[i], tenant, kv[i].ptr,
                                          kv[i].len);
        s->objs[cs + i] = o;
        all = o && mobj_readable(o);
    }
    if (all) {
        uint64_t now = moonlet_clock_now_ns();
        for (size_t i = 0; i < cs + b; i++) /* an object listed twice: the same grant */
            s->objs[i]->lease_deadline =
                moonlet_lease_grant(s->objs[i]->lease_deadline, now, m->lease_ttl_ns);
    }

    uint64_t held = moonlet_clock_real_ns() - t0;
    for (size_t i = nlocked; i-- > 0;)
        pthread_mutex_unlock(&m->shards[s->locked[i]].mu);
    pthread_rwlock_unlock(&m->guard);
    record_hold(m, held);

    if (all) {
        uint64_t kda, kv_only;
        count_distinct(s, ck, cs, kv, b, &kda, &kv_only);
        atomic_fetch_add_explicit(&m->st.leases_resume_kda, kda, memory_order_relaxed);
        atomic_fetch_add_explicit(&m->st.leases_resume_kv, kv_only, memory_order_relaxed);
    }
    return all;
}

/*
 * The fast path: the last candidate validated without the KV scan, once a
 * scan of its own keys found them all readable.  When the request's KV keys
 * and its last checkpoint are cached (the case the one-call lookup is for),
 * this is the only pass over the KV keys.  Computes the hashes and shards of
 * kv[0..b) and of the candidate's keys.
 */
static bool try_last(moonlet_master *m, uint32_t tenant, const moonlet_str *kv, size_t b,
                     const moonlet_str *ck, size_t cs, struct pr_scratch *s)
{
    for (size_t i = 0; i < b; i++) {
        s->kv_hash[i] = key_hash(tenant, kv[i].ptr, kv[i].len);
        s->kv_shard[i] = shard_of(m, s->kv_hash[i]);
    }
    if (!scan_candidate(m, tenant, ck, cs, s)) /* its own keys first: cheap, no lease */
        return false;
    if (m->cfg.probe_hook)
        m->cfg.probe_hook(m->cfg.probe_hook_arg);
    atomic_fetch_add_explicit(&m->st.resume_candidates_examined, 1, memory_order_relaxed);
    if (validate(m, tenant, kv, b, ck, cs, s))
        return true;
    atomic_fetch_add_explicit(&m->st.resume_recheck_fallbacks, 1, memory_order_relaxed);
    return false;
}

static int check_request(const moonlet_str *kv, size_t n_kv, const moonlet_str *kda, size_t n_kda,
                         uint64_t cs, const uint64_t *boundaries, size_t n_boundaries)
{
    if ((n_kv && !kv) || (n_kda && !kda) || (n_boundaries && !boundaries))
        return MOONLET_ERR_INVALID_PARAMS;
    if (n_kda == 0) {
        if (n_boundaries)
            return MOONLET_ERR_INVALID_PARAMS;
    } else if (cs == 0 || n_kda % cs || n_kda / cs != n_boundaries) {
        return MOONLET_ERR_INVALID_PARAMS;
    }
    for (size_t c = 0; c < n_boundaries; c++)
        if (boundaries[c] > n_kv)
            return MOONLET_ERR_INVALID_PARAMS;
    for (size_t i = 0; i < n_kv; i++) /* key_check(), inline: every key passes here */
        if (kv[i].len == 0 || kv[i].len > MOONLET_MAX_KEY_BYTES)
            return MOONLET_ERR_INVALID_KEY;
    for (size_t i = 0; i < n_kda; i++)
        if (kda[i].len == 0 || kda[i].len > MOONLET_MAX_KEY_BYTES)
            return MOONLET_ERR_INVALID_KEY;
    return MOONLET_OK;
}

int moonlet_master_probe_resume(moonlet_master *m, moonlet_str tenant, const moonlet_str *kv,
                                size_t n_kv, const moonlet_str *kda, size_t n_kda,
                                uint64_t candidate_size, const uint64_t *boundaries,
                                size_t n_boundaries, moonlet_probe_resume_out *out,
                                int32_t *mask)
{
    if (!out || (n_kda && !mask))
        return MOONLET_ERR_INVALID_PARAMS;
    out->kv_prefix = 0;
    out->selected = -1;
    for (size_t i = 0; i < n_kda; i++)
        mask[i] = 0;
    int rc = check_request(kv, n_kv, kda, n_kda, candidate_size, boundaries, n_boundaries);
    if (rc)
        return rc;
    uint32_t tid;
    if ((rc = tenant_lookup(m, tenant, &tid)))
        return rc;
    atomic_fetch_add_explicit(&m->st.resume_calls, 1, memory_order_relaxed);
    if (tid == MOONLET_NO_TENANT || (n_kv == 0 && n_kda == 0))
        return MOONLET_OK; /* nothing exists: no prefix, nothing selected */

    size_t cs = n_kda ? (size_t)candidate_size : 0;
    struct pr_scratch s = {.bitmap_words = (m->nshards + 63) / 64};
    size_t nres = cs > KV_SCAN_CHUNK ? cs : KV_SCAN_CHUNK;
    s.kv_hash = malloc((n_kv ? n_kv : 1) * sizeof(*s.kv_hash));
    s.cand_hash = malloc((cs ? cs : 1) * sizeof(*s.cand_hash));
    s.kv_shard = malloc((n_kv ? n_kv : 1) * sizeof(*s.kv_shard));
    s.cand_shard = malloc((cs ? cs : 1) * sizeof(*s.cand_shard));
    s.res = malloc(nres * sizeof(*s.res));
    s.objs = malloc((n_kv + cs + 1) * sizeof(*s.objs));
    s.locked = malloc((n_kv + cs + 1) * sizeof(*s.locked));
    s.bitmap = malloc(s.bitmap_words * sizeof(*s.bitmap));
    for (s.set_mask = 15; s.set_mask + 1 < 2 * (n_kv + cs); s.set_mask = s.set_mask * 2 + 1)
        ;
    s.set = malloc((s.set_mask + 1) * sizeof(*s.set));
    if (!s.kv_hash || !s.cand_hash || !s.kv_shard || !s.cand_shard || !s.res || !s.objs ||
        !s.locked || !s.bitmap || !s.set) {
        rc = MOONLET_ERR_INTERNAL_ERROR;
        goto out;
    }

    size_t last = n_boundaries; /* n_boundaries: no candidate tried yet */
    if (n_boundaries) {
        last = n_boundaries - 1;
        size_t b = (size_t)boundaries[last];
        if (try_last(m, tid, kv, b, kda + last * cs, cs, &s)) {
            out->selected = (int64_t)last;
            for (size_t k = 0; k < cs; k++)
                mask[last * cs + k] = 1;
            out->kv_prefix = scan_kv_prefix(m, tid, kv, b, n_kv, &s); /* the rest, no lease */
            goto out;
        }
    }
    uint64_t prefix = scan_kv_prefix(m, tid, kv, 0, n_kv, &s);
    out->kv_prefix = prefix;
    for (size_t i = 0; i < prefix; i++) /* only keys below the prefix are ever locked */
        s.kv_shard[i] = shard_of(m, s.kv_hash[i]);
    for (size_t c = n_boundaries; c-- > 0;) {
        if (boundaries[c] > prefix || c == last) /* the last one was just tried */
            continue;
        const moonlet_str *ck = kda + c * cs;
        if (!scan_candidate(m, tid, ck, cs, &s))
            continue;
        if (m->cfg.probe_hook)
            m->cfg.probe_hook(m->cfg.probe_hook_arg);
        atomic_fetch_add_explicit(&m->st.resume_candidates_examined, 1, memory_order_relaxed);
        if (validate(m, tid, kv, (size_t)boundaries[c], ck, cs, &s)) {
            out->selected = (int64_t)c;
            for (size_t k = 0; k < cs; k++)
                mask[c * cs + k] = 1;
            break;
        }
        atomic_fetch_add_explicit(&m->st.resume_recheck_fallbacks, 1, memory_order_relaxed);
    }
out:
    free(s.kv_hash), free(s.cand_hash), free(s.res), free(s.objs), free(s.locked), free(s.bitmap);
    free(s.set), free(s.kv_shard), free(s.cand_shard);
    return rc;
}
