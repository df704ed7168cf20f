/*
 * master.c - the top of the master service: configuration, create and
 * destroy, and the background thread's schedule (eviction, put timeouts,
 * quarantine sweeps, copies ahead of eviction, liveness, repair).  It
 * calls into every file of the object store and nothing calls into it.
 *
 * After a mass removal (objects at most half of their peak, 65,536 fewer)
 * the background thread calls malloc_trim, so freed heap goes back to the
 * system; the object slab returns its empty chunks itself (objslab.c).
 *
 * Locks: bg_mu, which the background thread takes only to sleep; each
 * piece of work it runs takes its own locks (master_internal.h's order).
 */
#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "evict.h"
#include "lease.h"
#include "master_internal.h"
#include "moonlet/error.h"
#include "monotime.h"
#include "repair.h"
#include "sync.h"
#include "thread.h"
#include "unmount.h"

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

/* The eviction a demotion falls back on (repair.h: repair sits below
 * eviction, which queues its demotions). */
static const struct repair_evict evict_hooks = {
    .disk_for_space = evict_disk_for_space,
    .without_copy = evict_without_copy,
};

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
    tenants_init(&m->tenants, cfg->max_tenants);
    registry_init(&m->reg);
    pthread_mutex_init(&m->bg_mu, NULL);
    moonlet_cond_init_mono(&m->bg_cv);

    m->slab = moonlet_objslab_create(sizeof(struct mobj) + mobj_key_span(MOONLET_MAX_KEY_BYTES) +
                                     MOONLET_MAX_REPLICAS * sizeof(struct mrep));
    uint64_t start = 0;
    if (getrandom(&start, sizeof(start), 0) != (ssize_t)sizeof(start))
        start = moonlet_clock_real_ns() ^ ((uint64_t)getpid() << 40); /* no entropy: still unlikely to meet */
    atomic_store(&m->next_put_id, start);
    if (!m->slab || shards_init(m) != MOONLET_OK || repair_init(m, &evict_hooks) != MOONLET_OK) {
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
    tenants_destroy(&m->tenants);
    unmounts_destroy(m);
    repair_destroy(m);
    pthread_mutex_destroy(&m->unmount_mu);
    pthread_rwlock_destroy(&m->guard);
    pthread_mutex_destroy(&m->evict_mu);
    pthread_mutex_destroy(&m->bg_mu);
    pthread_cond_destroy(&m->bg_cv);
    free(m);
}
