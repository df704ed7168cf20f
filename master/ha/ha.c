/*
 * ha.c - the master's HA orchestration (ha.h): the hot standby's follower,
 * the election's callbacks, the promotion and its liveness hold.
 *
 * The hot standby (master/ha/repl_stream.h).  The leader's records go to
 * g_ha.log; a standby's follower thread applies the leader's to its state.
 * In etcd, /moonlet/<cluster>/insync names, as "HOST:PORT@EPOCH", a master
 * that holds every acknowledged record of term EPOCH: the standby in sync,
 * or else the leader of EPOCH itself (written by that leader, fenced on its
 * leader key's create revision).  At election (on_elected, before the
 * window opens) the follower stops; its state is restored into the (empty)
 * master only if that key names this master for the epoch it followed;
 * then the new leader names itself for its own epoch (fenced), so a mark is
 * never older than the newest term.
 *
 * A deposed leader keeps a copy of its metadata (moonlet_ha_keep) before
 * its master is dropped: when it wins again while the mark still names it
 * for the term it led (no other leader has served since: each writes its
 * own mark before it serves), it restores that copy as a standby restores
 * its state.  Without it, a leader deposed by an etcd outage while its
 * standby was out of sync (or absent) came back EMPTY, losing every
 * acknowledged object whose other copy was on a master that had failed.
 *
 * Locks: g_follower_mu only, a leaf guarding g_ha.follower, g_ha.retired
 * (the follower's lifetime) and g_ha.kept; never held across an etcd call or
 * a join (moonlet_repl_follower_destroy runs after it is released).  The
 * served master is an atomic pointer: the main thread replaces it while the
 * election's thread may promote into it (never at once: the election waits
 * for moonlet_election_reset_done after a deposition).
 */
#include "ha.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "election.h"
#include "etcd.h"
#include "log.h"
#include "monotime.h"
#include "moonlet/error.h"
#include "node_timing.h"

static struct {
    moonlet_repl_log *log;
    moonlet_repl_follower *follower;
    /* stopped at a promotion, joined later (follower_reap): its thread may
     * still wait for a call to the old leader */
    moonlet_repl_follower *retired;
    moonlet_repl_follower_opts fo;
    moonlet_etcd *mark_etcd, *promo_etcd;
    moonlet_role *role;
    moonlet_election *el;
    moonlet_ha_opts opts;
    moonlet_master *_Atomic m; /* the master being served */
    char leader_key[320], insync_key[320];
    char advertise[320];
    uint64_t liveness_hold_ms; /* moonlet_ha_liveness_hold_ms */
    uint64_t led;              /* the epoch of this master's last promotion (0: none) */
    moonlet_repl_state *kept;  /* a deposed leader's metadata (moonlet_ha_keep) */
    uint64_t kept_epoch;       /* the term it was kept from */
} g_ha;

static pthread_mutex_t g_follower_mu = PTHREAD_MUTEX_INITIALIZER; /* g_ha.follower's lifetime */

uint64_t moonlet_ha_liveness_hold_ms(uint32_t etcd_ttl_s, uint64_t client_live_ttl_ms)
{
    /* the grace (one lease TTL) + a node's longest backoff + the liveness TTL */
    return (uint64_t)(etcd_ttl_s ? etcd_ttl_s : MOONLET_ELECTION_DEFAULT_TTL_S) * 1000 +
           MOONLET_NODE_BACKOFF_CAP_MS + client_live_ttl_ms;
}

bool moonlet_ha_promote(moonlet_master *m, const moonlet_repl_state *st,
                        const moonlet_ha_promotion *p, uint64_t *restored_out)
{
    moonlet_repl_counts c = {0};
    if (st)
        moonlet_repl_state_counts(st, &c);
    if (st && p->named && p->consistent) {
        uint64_t restored = 0, skipped = 0;
        int rc = moonlet_repl_state_restore(st, m, &restored, &skipped);
        /* serving begins one etcd lease TTL from now: the restored nodes
         * get a whole liveness TTL from then to ping */
        moonlet_master_hold_liveness(m, p->liveness_hold_ms);
        ML_WARN("master", "ha: promoted with state of epoch %llu for epoch %llu: %llu segments, "
                "%llu objects restored, %llu skipped%s", (unsigned long long)p->followed,
                (unsigned long long)p->epoch, (unsigned long long)c.segments,
                (unsigned long long)restored, (unsigned long long)skipped,
                rc ? " (segment mount failed)" : "");
        if (restored_out)
            *restored_out = restored;
        return true;
    }
    ML_WARN("master", "ha: promoted EMPTY for epoch %llu (followed epoch %llu, named in sync: "
            "%s, consistent: %s, %llu objects known)", (unsigned long long)p->epoch,
            (unsigned long long)p->followed, p->named ? "yes" : "no",
            p->consistent ? "yes" : "no", (unsigned long long)c.objects);
    if (restored_out)
        *restored_out = 0;
    return false;
}

/* The service's Hello: the standby side's status while it follows. */
static bool follower_status(moonlet_repl_follower_status *st)
{
    pthread_mutex_lock(&g_follower_mu);
    bool on = g_ha.follower != NULL;
    if (on)
        moonlet_repl_follower_get_status(g_ha.follower, st);
    pthread_mutex_unlock(&g_follower_mu);
    return on;
}

/* The log's marking of the standby in or out of sync, fenced on this
 * leader's epoch. */
static int repl_mark(void *arg, bool in_sync, const char *standby)
{
    (void)arg;
    moonlet_role_info ri;
    moonlet_role_get(g_ha.role, moonlet_mono_ms(), &ri);
    if (ri.state != MOONLET_ROLE_LEADER || !ri.epoch)
        return MOONLET_ERR_NOT_LEADER;
    /* out of sync: the leader alone holds the term's records */
    char val[MOONLET_ROLE_ADDR_MAX + 32];
    int n = snprintf(val, sizeof(val), "%s@%llu", in_sync ? standby : g_ha.advertise,
                     (unsigned long long)ri.epoch);
    bool ok = false;
    int rc = moonlet_etcd_txn_fenced(g_ha.mark_etcd, g_ha.leader_key, (int64_t)ri.epoch,
                                     g_ha.insync_key, val, (size_t)n, &ok);
    if (!rc && !ok)
        rc = MOONLET_ERR_NOT_LEADER;
    return rc;
}

/* Joins the follower stopped at the last promotion (it may wait out a call
 * to the old leader): on the main thread, never on the election's. */
static void follower_reap(void)
{
    pthread_mutex_lock(&g_follower_mu);
    moonlet_repl_follower *f = g_ha.retired;
    g_ha.retired = NULL;
    pthread_mutex_unlock(&g_follower_mu);
    moonlet_repl_follower_destroy(f);
}

static void follower_start(void)
{
    follower_reap();
    pthread_mutex_lock(&g_follower_mu);
    if (g_ha.log && !g_ha.follower &&
        moonlet_repl_follower_start(&g_ha.fo, &g_ha.follower) != MOONLET_OK)
        ML_ERR("master", "cannot start the replication follower: this master stays a cold standby");
    pthread_mutex_unlock(&g_follower_mu);
}

/* The election's question before a fast takeover (election.h): only a
 * standby that would promote with its state - following that leader's
 * term, consistent, and named in sync for it in etcd - replaces a leader
 * that refuses its connections, so a leader that merely looks gone to this
 * standby is never replaced by an empty one.  The election's thread, like
 * on_elected (the only other user of promo_etcd). */
static bool may_take_over(void *arg, uint64_t leader_epoch)
{
    (void)arg;
    uint64_t followed = 0;
    pthread_mutex_lock(&g_follower_mu);
    bool whole = g_ha.follower && moonlet_repl_follower_restorable(g_ha.follower, &followed);
    pthread_mutex_unlock(&g_follower_mu);
    if (!whole || followed != leader_epoch)
        return false;
    char want[sizeof(g_ha.advertise) + 32];
    snprintf(want, sizeof(want), "%s@%llu", g_ha.advertise, (unsigned long long)leader_epoch);
    moonlet_etcd_kv kv;
    bool named = false;
    if (moonlet_etcd_get(g_ha.promo_etcd, g_ha.insync_key, &kv, NULL) == MOONLET_OK) {
        named = kv.found && strcmp(kv.value, want) == 0;
        moonlet_etcd_kv_free(&kv);
    }
    return named;
}

/* The election's question before a campaign for a vacant key: defer it
 * while etcd names another master in sync and that master's address accepts
 * connections (it is alive and will campaign, and promote with its state);
 * a master out of sync, or a third one, winning instead would start empty
 * (issue 31 section 3).  The election bounds how long.  The election's
 * thread (promo_etcd). */
static bool defer_campaign(void *arg)
{
    (void)arg;
    moonlet_etcd_kv kv;
    if (moonlet_etcd_get(g_ha.promo_etcd, g_ha.insync_key, &kv, NULL) != MOONLET_OK)
        return false;
    char named[MOONLET_ROLE_ADDR_MAX] = "";
    if (kv.found && kv.value) {
        const char *at = strrchr(kv.value, '@');
        size_t n = at ? (size_t)(at - kv.value) : strlen(kv.value);
        if (n < sizeof(named)) {
            memcpy(named, kv.value, n);
            named[n] = 0;
        }
    }
    moonlet_etcd_kv_free(&kv);
    if (!named[0] || strcmp(named, g_ha.advertise) == 0)
        return false; /* nobody named, or this master: campaign */
    bool alive = moonlet_election_probe(named, 200) > 0;
    if (alive)
        ML_DEBUG("master", "ha: %s is named in sync and alive: not campaigning", named);
    return alive;
}

static int on_elected(void *arg, uint64_t epoch)
{
    (void)arg;
    bool consistent = false;
    uint64_t followed = 0;
    uint64_t t0 = moonlet_mono_ms();
    /* Not a join: this is the election's thread, and no keepalive goes out
     * until the promotion returns (repl_stream.h). */
    moonlet_repl_state *st =
        g_ha.follower ? moonlet_repl_follower_stop(g_ha.follower, &consistent, &followed) : NULL;
    pthread_mutex_lock(&g_follower_mu);
    moonlet_repl_follower *old = g_ha.retired;
    g_ha.retired = g_ha.follower;
    g_ha.follower = NULL;
    pthread_mutex_unlock(&g_follower_mu);
    if (old) /* not expected: a deposition reaps it before the next campaign */
        moonlet_repl_follower_destroy(old);
    pthread_mutex_lock(&g_follower_mu);
    moonlet_repl_state *kept = g_ha.kept;
    uint64_t kept_epoch = g_ha.kept_epoch;
    g_ha.kept = NULL;
    pthread_mutex_unlock(&g_follower_mu);
    /* the mark, read once: does it name this master for the term it
     * followed, or for the one it led and kept (no other leader since)? */
    char mark[sizeof(g_ha.advertise) + 32] = "";
    moonlet_etcd_kv kv;
    if ((followed || kept) &&
        moonlet_etcd_get(g_ha.promo_etcd, g_ha.insync_key, &kv, NULL) == MOONLET_OK) {
        if (kv.found && kv.value)
            snprintf(mark, sizeof(mark), "%s", kv.value);
        moonlet_etcd_kv_free(&kv);
    }
    char want[sizeof(g_ha.advertise) + 32];
    snprintf(want, sizeof(want), "%s@%llu", g_ha.advertise, (unsigned long long)followed);
    bool named = followed && strcmp(mark, want) == 0;
    if (!(st && named && consistent) && kept) {
        snprintf(want, sizeof(want), "%s@%llu", g_ha.advertise, (unsigned long long)kept_epoch);
        if (strcmp(mark, want) == 0) {
            ML_INFO("master", "ha: the in-sync mark names this master for epoch %llu, which it "
                    "led: restoring what it kept when deposed", (unsigned long long)kept_epoch);
            moonlet_repl_state_destroy(st);
            st = kept;
            kept = NULL;
            followed = kept_epoch;
            named = consistent = true;
        }
    }
    moonlet_repl_state_destroy(kept);
    moonlet_ha_promotion p = {.epoch = epoch, .followed = followed, .named = named,
                              .consistent = consistent,
                              .liveness_hold_ms = g_ha.liveness_hold_ms};
    moonlet_ha_promote(g_ha.m, st, &p, NULL);
    moonlet_repl_state_destroy(st);
    moonlet_repl_log_reset(g_ha.log);
    /* This leader names itself in sync for its term before it serves: a
     * later election never reads a mark older than the newest term, and one
     * after a deposition of this leader finds who holds the term's records
     * (moonlet_ha_keep). */
    char self[sizeof(g_ha.advertise) + 32];
    int n = snprintf(self, sizeof(self), "%s@%llu", g_ha.advertise, (unsigned long long)epoch);
    int rc = MOONLET_ERR_RPC_FAIL;
    for (int i = 0; i < 3 && rc; i++) {
        bool ok = false;
        rc = moonlet_etcd_txn_fenced(g_ha.promo_etcd, g_ha.leader_key, (int64_t)epoch,
                                     g_ha.insync_key, self, (size_t)n, &ok);
        if (!rc && !ok)
            rc = MOONLET_ERR_NOT_LEADER;
    }
    if (rc)
        ML_ERR("master", "ha: cannot write the in-sync mark (%s): not leading",
               moonlet_strerror(rc));
    else
        g_ha.led = epoch;
    ML_INFO("master", "ha: promotion for epoch %llu took %llu ms", (unsigned long long)epoch,
            (unsigned long long)(moonlet_mono_ms() - t0));
    return rc;
}

int moonlet_ha_init(const moonlet_ha_opts *opts, moonlet_master_config *cfg,
                    moonlet_service_opts *so)
{
    if (!opts || !opts->etcd_endpoints || !opts->cluster_id || !opts->role || !cfg || !so)
        return MOONLET_ERR_INVALID_PARAMS;
    g_ha.opts = *opts;
    g_ha.role = opts->role;
    g_ha.liveness_hold_ms = moonlet_ha_liveness_hold_ms(opts->etcd_ttl_s, opts->client_live_ttl_ms);
    if (!opts->replication)
        return MOONLET_OK;
    moonlet_repl_log_opts lo = {.max_lag_ms = opts->repl_max_lag_ms, .mark = repl_mark};
    if (moonlet_etcd_create(opts->etcd_endpoints, 2000, &g_ha.mark_etcd) != MOONLET_OK ||
        moonlet_etcd_create(opts->etcd_endpoints, 2000, &g_ha.promo_etcd) != MOONLET_OK ||
        moonlet_repl_log_create(&lo, &g_ha.log) != MOONLET_OK) {
        ML_ERR("master", "cannot set up replication");
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    snprintf(g_ha.leader_key, sizeof(g_ha.leader_key), "/moonlet/%s/leader", opts->cluster_id);
    snprintf(g_ha.insync_key, sizeof(g_ha.insync_key), "/moonlet/%s/insync", opts->cluster_id);
    cfg->repl_emit = moonlet_repl_log_emit;
    cfg->repl_pos = moonlet_repl_log_pos;
    cfg->repl_arg = g_ha.log;
    so->repl = g_ha.log;
    so->follower_status = follower_status;
    return MOONLET_OK;
}

moonlet_repl_log *moonlet_ha_log(void)
{
    return g_ha.log;
}

void moonlet_ha_set_master(moonlet_master *m)
{
    g_ha.m = m;
}

int moonlet_ha_start(const char *advertise)
{
    if (g_ha.log) {
        snprintf(g_ha.advertise, sizeof(g_ha.advertise), "%s", advertise);
        g_ha.fo = (moonlet_repl_follower_opts){.role = g_ha.role, .advertise = g_ha.advertise,
                                               .auth_token = g_ha.opts.auth_token,
                                               .peer_token = g_ha.opts.peer_token,
                                               .tls = g_ha.opts.tls};
        follower_start();
    }
    moonlet_election_opts eo = {.endpoints = g_ha.opts.etcd_endpoints,
                                .cluster_id = g_ha.opts.cluster_id, .advertise = advertise,
                                .ttl_s = g_ha.opts.etcd_ttl_s,
                                .on_deposed = g_ha.opts.on_deposed, .arg = g_ha.opts.arg,
                                .on_elected = g_ha.log ? on_elected : NULL,
                                .defer_campaign = g_ha.log ? defer_campaign : NULL,
                                /* without replication a standby promotes
                                 * empty: it waits for the lease */
                                .may_take_over = may_take_over};
    int rc = moonlet_election_start(&eo, g_ha.role, &g_ha.el);
    if (rc)
        ML_ERR("master", "cannot start the election on %s: %s", g_ha.opts.etcd_endpoints,
               moonlet_strerror(rc));
    return rc;
}

/* moonlet_master_snapshot's records into the kept state. */
struct keep_arg {
    moonlet_repl_state *st;
    int rc;
};

static void keep_rec(void *arg, const moonlet_repl_rec *rec)
{
    struct keep_arg *k = arg;
    if (!k->rc)
        k->rc = moonlet_repl_state_apply_snapshot(k->st, rec, true);
}

void moonlet_ha_keep(moonlet_master *m)
{
    if (!g_ha.log || !g_ha.led || !m)
        return;
    moonlet_repl_state *st = NULL;
    if (moonlet_repl_state_create(&st) != MOONLET_OK) {
        ML_ERR("master", "ha: out of memory: the deposed term's metadata is not kept");
        return;
    }
    struct keep_arg k = {st, MOONLET_OK};
    moonlet_master_snapshot(m, keep_rec, &k);
    int rc = k.rc;
    if (rc) {
        ML_ERR("master", "ha: the deposed term's metadata could not be kept (%s)",
               moonlet_strerror(rc));
        moonlet_repl_state_destroy(st);
        return;
    }
    moonlet_repl_state_note_leader_clock(st, 0); /* the same clock */
    moonlet_repl_counts c;
    moonlet_repl_state_counts(st, &c);
    ML_WARN("master", "ha: deposed from epoch %llu: keeping its %llu segments and %llu objects "
            "for a re-election", (unsigned long long)g_ha.led, (unsigned long long)c.segments,
            (unsigned long long)c.objects);
    pthread_mutex_lock(&g_follower_mu);
    moonlet_repl_state *old = g_ha.kept;
    g_ha.kept = st;
    g_ha.kept_epoch = g_ha.led;
    pthread_mutex_unlock(&g_follower_mu);
    g_ha.led = 0;
    moonlet_repl_state_destroy(old);
}

void moonlet_ha_reset(void)
{
    g_ha.m = NULL;
    if (g_ha.log)
        moonlet_repl_log_reset(g_ha.log);
}

void moonlet_ha_resume(void)
{
    follower_start(); /* a standby again: follow the next leader */
    moonlet_election_reset_done(g_ha.el);
}

void moonlet_ha_stop(void)
{
    moonlet_election_stop(g_ha.el);
    g_ha.el = NULL;
    follower_reap();
    pthread_mutex_lock(&g_follower_mu);
    moonlet_repl_follower_destroy(g_ha.follower);
    g_ha.follower = NULL;
    moonlet_repl_state *kept = g_ha.kept;
    g_ha.kept = NULL;
    pthread_mutex_unlock(&g_follower_mu);
    moonlet_repl_state_destroy(kept);
}

void moonlet_ha_fini(void)
{
    moonlet_repl_log_destroy(g_ha.log);
    g_ha.log = NULL;
    moonlet_etcd_destroy(g_ha.mark_etcd);
    moonlet_etcd_destroy(g_ha.promo_etcd);
    g_ha.mark_etcd = g_ha.promo_etcd = NULL;
}
