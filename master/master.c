/*
 * master.c - lifetime of the master service: configuration, the tenant
 * table, the background thread (eviction, put timeouts, liveness) and
 * statistics.
 *
 * Tenants are interned to small integers so an object stores 4 bytes instead
 * of a string, and the tenant id seeds the key hash (tenant isolation is then
 * structural: a lookup in tenant A cannot match an object of tenant B).
 *
 * After a mass removal (objects at most half of their peak, 65,536 fewer)
 * the background thread calls malloc_trim, so freed heap goes back to the
 * system; the object slab returns its empty chunks itself (objslab.c).
 *
 * Locks: tenants.lock is a leaf (never held while taking another lock).  The
 * background thread takes bg_mu only to sleep; each piece of work it runs
 * takes its own locks (see evict.c and segment.c).
 */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "grow.h"
#include "lease.h"
#include "log.h"
#include "master_internal.h"
#include "moonlet/error.h"
#include "monotime.h"
#include "sync.h"
#include "thread.h"

void moonlet_master_config_default(moonlet_master_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->shards = 1024;
    cfg->lease_ttl_ms = MOONLET_DEFAULT_LEASE_TTL_MS;
    cfg->soft_pin_ttl_ms = MOONLET_DEFAULT_SOFT_PIN_TTL_MS;
    cfg->eviction_high_watermark = 0.90;
    cfg->eviction_ratio = 0.05;
    cfg->client_live_ttl_ms = 10000;
    cfg->put_timeout_ms = 60000;
    cfg->put_quarantine_grace_ms = 2000;
    cfg->background_interval_ms = 100;
    cfg->background = true;
    cfg->max_tenants = MOONLET_MAX_TENANTS;
    cfg->hard_pin_max_ratio = 0.5;
    cfg->repair_bandwidth = 256ull << 20;
    cfg->repair_concurrency = 16;
    cfg->repair_timeout_ms = 30000;
    cfg->demote_queue = 4096;
    cfg->demote_concurrency = 64;
    cfg->demote_ahead_ratio = 0.5;
    cfg->repair_max_attempts = 5;
}

/* ---- tenants ---------------------------------------------------------------- */

static inline uint32_t tenant_slot_of(uint32_t id) { return id & 0xffffu; }

static moonlet_str tenant_name(moonlet_str t)
{
    return t.len ? t : MOONLET_STR(MOONLET_DEFAULT_TENANT);
}

moonlet_str tenant_canonical(moonlet_str t)
{
    return tenant_name(t);
}

uint32_t tenant_name_of(moonlet_master *m, uint32_t id, char name[MOONLET_MAX_ID_BYTES + 1])
{
    uint32_t len = 0;
    pthread_rwlock_rdlock(&m->tenants.lock);
    uint32_t slot = tenant_slot_of(id);
    if (slot < m->tenants.n && m->tenants.slots[slot].name && m->tenants.slots[slot].id == id) {
        len = m->tenants.slots[slot].len;
        memcpy(name, m->tenants.slots[slot].name, len);
    }
    pthread_rwlock_unlock(&m->tenants.lock);
    name[len] = 0;
    return len;
}

struct tenant_ctx {
    const struct tenants *t;
    moonlet_str name;
};

static bool tenant_eq(const void *ctx, uint32_t v)
{
    const struct tenant_ctx *c = ctx;
    const struct tenant_slot *ts = &c->t->slots[v];
    return ts->name && ts->len == c->name.len && memcmp(ts->name, c->name.ptr, c->name.len) == 0;
}

/* The slot of a live tenant by name (a hash map), or UINT32_MAX. */
static uint32_t tenant_find_locked(struct tenants *t, moonlet_str name)
{
    struct tenant_ctx c = {t, name};
    struct hent *e = hmap_find(&t->by_name, hmap_str_hash(name.ptr, name.len), tenant_eq, &c);
    return e ? e->v : UINT32_MAX;
}


int tenant_lookup(moonlet_master *m, moonlet_str name, uint32_t *id)
{
    name = tenant_name(name);
    if (name.len > MOONLET_MAX_ID_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_rwlock_rdlock(&m->tenants.lock);
    uint32_t i = tenant_find_locked(&m->tenants, name);
    *id = i == UINT32_MAX ? MOONLET_NO_TENANT : m->tenants.slots[i].id;
    pthread_rwlock_unlock(&m->tenants.lock);
    return MOONLET_OK;
}

/* Creates a tenant in a free slot; tenants.lock held for writing. */
static int tenant_create_locked(moonlet_master *m, moonlet_str name, uint32_t *slot)
{
    struct tenants *t = &m->tenants;
    if (t->live >= t->max) {
        uint64_t now = moonlet_clock_real_ns();
        if (now - t->full_warned_ns >= 10000 * MOONLET_NS_PER_MS || !t->full_warned_ns) {
            t->full_warned_ns = now;
            ML_WARN("master", "tenant table full (%u tenants with live objects): PutStart under "
                    "a new tenant name fails with NO_AVAILABLE_HANDLE", t->live);
        }
        return MOONLET_ERR_NO_AVAILABLE_HANDLE;
    }
    uint32_t i = t->nfree ? t->free[t->nfree - 1] : t->n;
    if (i == t->n) {
        uint32_t old_cap = t->cap;
        struct tenant_slot *ns = moonlet_grow(t->slots, t->n, &t->cap, 8, sizeof(*ns));
        if (!ns)
            return MOONLET_ERR_INTERNAL_ERROR;
        memset(ns + old_cap, 0, (t->cap - old_cap) * sizeof(*ns));
        for (uint32_t k = old_cap; k < t->cap; k++)
            ns[k].id = k; /* generation 0 */
        t->slots = ns;
        t->n++;
    }
    struct tenant_slot *ts = &t->slots[i];
    if (!(ts->name = malloc(name.len ? name.len : 1)))
        return MOONLET_ERR_INTERNAL_ERROR;
    if (!hmap_insert(&t->by_name, hmap_str_hash(name.ptr, name.len), i)) {
        free(ts->name);
        ts->name = NULL;
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    if (t->nfree && t->free[t->nfree - 1] == i)
        t->nfree--;
    memcpy(ts->name, name.ptr, name.len);
    ts->len = name.len;
    atomic_store(&ts->refs, 0);
    t->live++;
    *slot = i;
    return MOONLET_OK;
}

int tenant_acquire(moonlet_master *m, moonlet_str name, uint32_t *id)
{
    name = tenant_name(name);
    if (name.len > MOONLET_MAX_ID_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    struct tenants *t = &m->tenants;
    /* A reference taken under the read lock keeps the slot: freeing needs the write lock. */
    pthread_rwlock_rdlock(&t->lock);
    uint32_t i = tenant_find_locked(t, name);
    if (i != UINT32_MAX) {
        atomic_fetch_add(&t->slots[i].refs, 1);
        *id = t->slots[i].id;
    }
    pthread_rwlock_unlock(&t->lock);
    if (i != UINT32_MAX)
        return MOONLET_OK;
    int rc = MOONLET_OK;
    pthread_rwlock_wrlock(&t->lock);
    i = tenant_find_locked(t, name);
    if (i == UINT32_MAX)
        rc = tenant_create_locked(m, name, &i);
    if (rc == MOONLET_OK) {
        atomic_fetch_add(&t->slots[i].refs, 1);
        *id = t->slots[i].id;
    }
    pthread_rwlock_unlock(&t->lock);
    return rc;
}

void tenant_ref(moonlet_master *m, uint32_t id)
{
    /* The caller holds a reference, so the slot cannot be freed or moved
     * (realloc happens only under the write lock, which creation takes). */
    pthread_rwlock_rdlock(&m->tenants.lock);
    atomic_fetch_add(&m->tenants.slots[tenant_slot_of(id)].refs, 1);
    pthread_rwlock_unlock(&m->tenants.lock);
}

void tenant_release(moonlet_master *m, uint32_t id)
{
    struct tenants *t = &m->tenants;
    uint32_t i = tenant_slot_of(id);
    pthread_rwlock_rdlock(&t->lock);
    bool last = i < t->n && t->slots[i].id == id && atomic_fetch_sub(&t->slots[i].refs, 1) == 1;
    pthread_rwlock_unlock(&t->lock);
    if (!last)
        return;
    /* Free the slot unless a PutStart took a new reference in between. */
    pthread_rwlock_wrlock(&t->lock);
    struct tenant_slot *ts = &t->slots[i];
    if (ts->name && ts->id == id && atomic_load(&ts->refs) == 0) {
        hmap_remove_hv(&t->by_name, hmap_str_hash(ts->name, ts->len), i);
        uint32_t *nf = moonlet_grow(t->free, t->nfree, &t->free_cap, 16, sizeof(*nf));
        if (nf)
            t->free = nf;
        if (t->nfree < t->free_cap) /* else the slot is not reused (out of memory) */
            t->free[t->nfree++] = i;
        free(ts->name);
        ts->name = NULL;
        ts->len = 0;
        uint32_t gen = (id >> 16) + 1;
        ts->id = ((gen & 0xffffu) << 16) | i;
        if (ts->id == MOONLET_NO_TENANT)
            ts->id = i; /* skip the reserved value: generation 0 again */
        t->live--;
    }
    pthread_rwlock_unlock(&t->lock);
}

uint32_t tenant_count(moonlet_master *m)
{
    pthread_rwlock_rdlock(&m->tenants.lock);
    uint32_t n = m->tenants.live;
    pthread_rwlock_unlock(&m->tenants.lock);
    return n;
}

/* ---- background work --------------------------------------------------------- */

void moonlet_master_tick(moonlet_master *m)
{
    if (m->cfg.eviction_high_watermark > 0 && registry_usage(m) >= m->cfg.eviction_high_watermark)
        evict_pass(m, m->cfg.eviction_ratio);
    uint64_t now = moonlet_clock_now_ns();
    /* Stale puts are rare: look for them at most 4 times per timeout. */
    if (atomic_load(&m->st.pending) > 0 && now - m->last_reap_ns >= m->put_timeout_ns / 4) {
        m->last_reap_ns = now;
        reap_stale_puts(m);
    }
    if (atomic_load(&m->reg.quarantined) > 0)
        registry_quarantine_sweep(m);
    /* Copies ahead of eviction: a scan of the objects, at most once a second. */
    if (m->cfg.demote_ahead_ratio > 0 && atomic_load(&m->reg.ndisk) > 0 &&
        now - m->last_ahead_ns >= 1000 * MOONLET_NS_PER_MS) {
        m->last_ahead_ns = now;
        demote_ahead_pass(m);
    }
    liveness_check(m);
    repair_tick(m);
    /* After a mass removal, give the allocator's free memory back (the
     * object slab returns its empty chunks by itself). */
    uint64_t objs = atomic_load(&m->st.objects);
    if (objs > m->trim_peak) {
        m->trim_peak = objs;
    } else if (m->trim_peak - objs >= 65536 && objs <= m->trim_peak / 2) {
        malloc_trim(0);
        m->trim_peak = objs;
    }
}

static void *bg_main(void *arg)
{
    moonlet_master *m = arg;
    pthread_mutex_lock(&m->bg_mu);
    while (!m->bg_stop) {
        pthread_mutex_unlock(&m->bg_mu);
        moonlet_master_tick(m);
        pthread_mutex_lock(&m->bg_mu);
        struct timespec ts = moonlet_mono_deadline_ts(m->cfg.background_interval_ms);
        while (!m->bg_stop && pthread_cond_timedwait(&m->bg_cv, &m->bg_mu, &ts) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&m->bg_mu);
    return NULL;
}

/* ---- lifetime ------------------------------------------------------------------ */

int moonlet_master_create(const moonlet_master_config *cfg, moonlet_master **out)
{
    moonlet_master_config def;
    if (!cfg) {
        moonlet_master_config_default(&def);
        cfg = &def;
    }
    if (cfg->shards == 0 || cfg->shards > (1u << 20) || cfg->eviction_ratio < 0 ||
        cfg->eviction_ratio > 1 || cfg->eviction_high_watermark < 0 ||
        cfg->eviction_high_watermark > 1 || cfg->background_interval_ms == 0 ||
        cfg->max_tenants == 0 || cfg->max_tenants > MOONLET_MAX_TENANTS ||
        !(cfg->hard_pin_max_ratio >= 0 && cfg->hard_pin_max_ratio <= 1) ||
        cfg->repair_bandwidth == 0 || cfg->repair_concurrency == 0 ||
        cfg->repair_concurrency > 4096 || cfg->repair_timeout_ms == 0 ||
        cfg->repair_timeout_ms > 3600000 || cfg->repair_max_attempts == 0 ||
        cfg->demote_queue == 0 || cfg->demote_queue > (1u << 24) ||
        cfg->demote_concurrency == 0 || cfg->demote_concurrency > 4096 ||
        !(cfg->demote_ahead_ratio >= 0 && cfg->demote_ahead_ratio <= 1))
        return MOONLET_ERR_INVALID_PARAMS;

    moonlet_master *m = calloc(1, sizeof(*m));
    if (!m)
        return MOONLET_ERR_INTERNAL_ERROR;
    m->cfg = *cfg;
    m->lease_ttl_ns = cfg->lease_ttl_ms * MOONLET_NS_PER_MS;
    m->soft_pin_ttl_ns = cfg->soft_pin_ttl_ms * MOONLET_NS_PER_MS;
    m->client_ttl_ns = cfg->client_live_ttl_ms * MOONLET_NS_PER_MS;
    m->put_timeout_ns = cfg->put_timeout_ms * MOONLET_NS_PER_MS;
    m->quarantine_grace_ns = cfg->put_quarantine_grace_ms * MOONLET_NS_PER_MS;
    m->nshards = cfg->shards;

    pthread_mutex_init(&m->evict_mu, NULL);
    pthread_mutex_init(&m->unmount_mu, NULL);
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* Unmount must not starve behind a steady stream of readers. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&m->guard, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_rwlock_init(&m->tenants.lock, NULL);
    m->tenants.max = cfg->max_tenants;
    registry_init(&m->reg);
    pthread_mutex_init(&m->bg_mu, NULL);
    moonlet_cond_init_mono(&m->bg_cv);

    m->slab = moonlet_objslab_create(sizeof(struct mobj) + mobj_key_span(MOONLET_MAX_KEY_BYTES) +
                                     MOONLET_MAX_REPLICAS * sizeof(struct mrep));
    uint64_t start = 0;
    if (getrandom(&start, sizeof(start), 0) != (ssize_t)sizeof(start))
        start = moonlet_clock_real_ns() ^ ((uint64_t)getpid() << 40); /* no entropy: still unlikely to meet */
    atomic_store(&m->next_put_id, start);
    if (!m->slab || shards_init(m) != MOONLET_OK || repair_init(m) != MOONLET_OK) {
        moonlet_master_destroy(m);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    if (cfg->background) {
        if (moonlet_thread_create(&m->bg, bg_main, m, "master-bg") != 0) {
            moonlet_master_destroy(m);
            return MOONLET_ERR_INTERNAL_ERROR;
        }
        m->bg_started = true;
    }
    *out = m;
    return MOONLET_OK;
}

void moonlet_master_destroy(moonlet_master *m)
{
    if (!m)
        return;
    if (m->bg_started) {
        pthread_mutex_lock(&m->bg_mu);
        m->bg_stop = true;
        pthread_cond_signal(&m->bg_cv);
        pthread_mutex_unlock(&m->bg_mu);
        pthread_join(m->bg, NULL);
    }
    if (m->slab)
        shards_destroy(m);
    moonlet_objslab_destroy(m->slab);
    registry_destroy(&m->reg);
    for (uint32_t i = 0; i < m->tenants.n; i++)
        free(m->tenants.slots[i].name);
    free(m->tenants.slots);
    free(m->tenants.free);
    hmap_free(&m->tenants.by_name);
    pthread_rwlock_destroy(&m->tenants.lock);
    unmounts_destroy(m);
    repair_destroy(m);
    pthread_mutex_destroy(&m->unmount_mu);
    pthread_rwlock_destroy(&m->guard);
    pthread_mutex_destroy(&m->evict_mu);
    pthread_mutex_destroy(&m->bg_mu);
    pthread_cond_destroy(&m->bg_cv);
    free(m);
}

/* ---- statistics ------------------------------------------------------------------ */

unsigned lock_hist_bucket(uint64_t ns)
{
    uint64_t us = ns / 1000;
    unsigned b = 0;
    while (us && b < MOONLET_LOCK_HIST_BUCKETS - 1) {
        us >>= 1;
        b++;
    }
    return b; /* 0: <1us, 1: <2us, 2: <4us, ... last: >= 1024us */
}

/* A snapshot of what lock_hold_record counted: the histogram and the maximum. */
static void lock_hold_load(uint64_t *hist, uint64_t *max_ns, const _Atomic uint64_t *src_hist,
                           const _Atomic uint64_t *src_max_ns)
{
    for (unsigned i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++)
        hist[i] = atomic_load(&src_hist[i]);
    *max_ns = atomic_load(src_max_ns);
}

void moonlet_master_get_stats(moonlet_master *m, moonlet_master_stats *st)
{
    memset(st, 0, sizeof(*st));
    struct mstats *s = &m->st;
    st->objects = atomic_load(&s->objects);
    st->bytes = atomic_load(&s->bytes);
    st->put_starts = atomic_load(&s->put_starts);
    st->put_starts_reserved = atomic_load(&s->put_starts_reserved);
    st->put_ends = atomic_load(&s->put_ends);
    st->put_revokes = atomic_load(&s->put_revokes);
    st->put_timeouts = atomic_load(&s->put_timeouts);
    st->put_replacements = atomic_load(&s->put_replacements);
    st->removes = atomic_load(&s->removes);
    st->evictions = atomic_load(&s->evictions);
    st->eviction_passes = atomic_load(&s->eviction_passes);
    st->leases_get = atomic_load(&s->leases_get);
    st->leases_exist = atomic_load(&s->leases_exist);
    st->leases_probe = atomic_load(&s->leases_probe);
    st->probe_calls_none = atomic_load(&s->probe_calls_none);
    st->probe_calls_last_hit = atomic_load(&s->probe_calls_last_hit);
    st->probe_candidates_examined = atomic_load(&s->probe_candidates_examined);
    st->probe_recheck_fallbacks = atomic_load(&s->probe_recheck_fallbacks);
    lock_hold_load(st->probe_lock_hold_hist, &st->probe_lock_hold_max_ns, s->probe_lock_hold_hist,
                   &s->probe_lock_hold_max_ns);
    st->unmounts_by_liveness = atomic_load(&s->unmounts_by_liveness);
    st->resume_calls = atomic_load(&s->resume_calls);
    st->resume_candidates_examined = atomic_load(&s->resume_candidates_examined);
    st->resume_recheck_fallbacks = atomic_load(&s->resume_recheck_fallbacks);
    st->leases_resume_kda = atomic_load(&s->leases_resume_kda);
    st->leases_resume_kv = atomic_load(&s->leases_resume_kv);
    lock_hold_load(st->resume_lock_hold_hist, &st->resume_lock_hold_max_ns,
                   s->resume_lock_hold_hist, &s->resume_lock_hold_max_ns);
    st->tenants = tenant_count(m);
    st->quarantined = atomic_load(&m->reg.quarantined);
    st->hard_pinned = atomic_load(&s->hard_pinned);
    st->hard_pinned_bytes = atomic_load(&s->hard_pinned_bytes);
    repair_stats(m, st);
    st->capacity = atomic_load(&m->reg.capacity);
    st->disk_capacity = atomic_load(&m->reg.disk_capacity);
    st->disk_used = atomic_load(&m->reg.disk_used);
    st->disk_segments = atomic_load(&m->reg.ndisk);
    st->disk_objects = registry_disk_objects(m);
    st->disk_evictions = atomic_load(&m->st.disk_evictions);
    st->disk_announced = atomic_load(&m->st.disk_announced);
    for (uint32_t k = 0; k < MOONLET_NODE_DISK_NFIELDS; k++)
        st->node_disk[k] = atomic_load(&m->reg.node_disk[k]);
    st->used = atomic_load(&m->reg.used);
    pthread_mutex_lock(&m->reg.mu);
    st->segments = m->reg.nmounted;
    st->clients = m->reg.nused;
    pthread_mutex_unlock(&m->reg.mu);
}
