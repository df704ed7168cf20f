/*
 * election.c - leader election on etcd (election.h).
 *
 * The thread's loop, one tick every TTL/3 (or sooner when a serving window
 * opens or closes, for the interval log):
 *   no lease       -> grant one
 *   keepalive due  -> keepalive; success moves the window end to
 *                     (time the keepalive was sent) + TTL - margin; a lease
 *                     etcd no longer knows deposes a leader
 *   leader         -> the key must still be ours (create revision == epoch);
 *                     the window must not have closed
 *   standby        -> (every poll_ms) read the key: absent (or ours) ->
 *                     campaign (create-if-absent, bound to the lease),
 *                     unless the owner defers it to the master named in
 *                     sync (bounded: MOONLET_ELECTION_DEFER_TTLS); else
 *                     tell the role who leads, and take over a leader whose
 *                     address refuses connections (election.h)
 * Why the terms cannot overlap: etcd expires our lease no earlier than TTL
 * after it received our last keepalive, which is after we sent it, so our
 * window (send time + TTL - margin) closes at least `margin` before the key
 * can go; a successor is elected only once the key is gone and serves one
 * grace (TTL) later still.
 *
 * Locks: el->mu (leaf) for the flags; none while calling etcd or the role.
 */
#include "election.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "etcd.h"
#include "log.h"
#include "net.h"
#include "monotime.h"
#include "moonlet/error.h"
#include "sync.h"
#include "thread.h"

#define MOD "ha"

struct moonlet_election {
    moonlet_etcd *etcd;
    moonlet_role *role;
    char key[320];
    char advertise[MOONLET_ROLE_ADDR_MAX];
    uint64_t ttl_ms, margin_ms, tick_ms, poll_ms;
    bool takeover;
    bool (*may_take_over)(void *arg, uint64_t leader_epoch);
    bool (*defer_campaign)(void *arg);
    void (*on_deposed)(void *arg);
    int (*on_elected)(void *arg, uint64_t epoch);
    void *arg;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, need_reset;
    /* the thread's own state */
    int64_t lease;
    uint64_t last_ok_ms;   /* send time of the last successful keepalive (or grant) */
    uint64_t next_ka_ms;
    bool leader;
    uint64_t epoch;
    uint64_t alive_rev;  /* the leader term (create revision) whose address accepted a probe */
    uint64_t defer_since_ms; /* campaigns deferred since (0: none deferred) */
};

uint64_t moonlet_election_poll_ms(uint64_t ttl_ms)
{
    uint64_t poll = ttl_ms / 20, tick = ttl_ms / 3;
    if (poll < 50)
        poll = 50;
    return poll < tick ? poll : tick;
}

int moonlet_election_probe(const char *addr, uint32_t timeout_ms)
{
    char host[MOONLET_ROLE_ADDR_MAX];
    uint16_t port = 0;
    if (!addr || moonlet_net_split_hostport(addr, host, sizeof(host), &port) || !port)
        return -1;
    errno = 0;
    int fd = moonlet_net_connect_tcp(host, port, moonlet_mono_ms() + timeout_ms, 0);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    return fd == MOONLET_NET_ESYS && errno == ECONNREFUSED ? 0 : -1;
}

static void depose(moonlet_election *el, const char *why)
{
    uint64_t now = moonlet_mono_ms();
    moonlet_role_deposed(el->role, now);
    ML_WARN(MOD, "stepping down as leader of epoch %llu: %s", (unsigned long long)el->epoch, why);
    el->leader = false;
    if (el->lease) { /* nobody may wait for a lease we no longer use */
        moonlet_etcd_lease_revoke(el->etcd, el->lease);
        el->lease = 0;
    }
    pthread_mutex_lock(&el->mu);
    el->need_reset = el->on_deposed != NULL;
    pthread_mutex_unlock(&el->mu);
    if (el->on_deposed)
        el->on_deposed(el->arg);
}

static void keepalive(moonlet_election *el)
{
    uint64_t sent = moonlet_mono_ms();
    int64_t ttl = 0;
    int rc = moonlet_etcd_lease_keepalive(el->etcd, el->lease, &ttl);
    el->next_ka_ms = sent + el->tick_ms;
    if (rc) {
        ML_DEBUG(MOD, "keepalive failed: %s", moonlet_strerror(rc));
        return; /* the window closes by itself if this goes on */
    }
    if (ttl <= 0) {
        ML_WARN(MOD, "etcd lease %lld expired", (long long)el->lease);
        el->lease = 0;
        if (el->leader)
            depose(el, "lease expired");
        return;
    }
    el->last_ok_ms = sent;
    if (el->leader)
        moonlet_role_renewed(el->role, sent + el->ttl_ms - el->margin_ms);
}

/*
 * Keepalives during a promotion.  on_elected runs on this thread and may
 * take longer than a tick (a large state to restore, its own etcd calls
 * with their timeouts); without keepalives meanwhile the lease could lapse
 * under it, the key go, and the new leader step down right after promoting.
 * So a second thread renews the lease every tick while on_elected runs.  It
 * only calls etcd (el->etcd serialises its calls) and notes the outcome
 * under el->mu; the election thread applies it once on_elected returned.
 */
struct promo_ka {
    moonlet_election *el;
    pthread_cond_t cv;
    bool stop, expired;
    uint64_t last_ok_ms, next_ms;
};

static void *promo_ka_main(void *arg)
{
    struct promo_ka *p = arg;
    moonlet_election *el = p->el;
    pthread_mutex_lock(&el->mu);
    while (!p->stop && !el->stop && !p->expired) {
        uint64_t now = moonlet_mono_ms();
        if (now < p->next_ms) {
            struct timespec ts = moonlet_mono_deadline_ts(p->next_ms - now);
            pthread_cond_timedwait(&p->cv, &el->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&el->mu);
        int64_t ttl = 0;
        int rc = moonlet_etcd_lease_keepalive(el->etcd, el->lease, &ttl);
        pthread_mutex_lock(&el->mu);
        p->next_ms = now + el->tick_ms;
        if (rc == MOONLET_OK && ttl <= 0)
            p->expired = true;
        else if (rc == MOONLET_OK)
            p->last_ok_ms = now;
    }
    pthread_mutex_unlock(&el->mu);
    return NULL;
}

/* Runs on_elected with keepalives beside it: NULL, or why this master must
 * not lead after all. */
static const char *promote(moonlet_election *el)
{
    struct promo_ka p = {.el = el, .last_ok_ms = el->last_ok_ms, .next_ms = el->next_ka_ms};
    moonlet_cond_init_mono(&p.cv);
    pthread_t t;
    bool started = moonlet_thread_create(&t, promo_ka_main, &p, "ha-keepalive") == 0;
    if (!started)
        ML_WARN(MOD, "no keepalive thread: the promotion must end within the lease TTL");
    int rc = el->on_elected(el->arg, el->epoch);
    if (started) {
        pthread_mutex_lock(&el->mu);
        p.stop = true;
        pthread_cond_signal(&p.cv);
        pthread_mutex_unlock(&el->mu);
        pthread_join(t, NULL);
    }
    pthread_cond_destroy(&p.cv);
    if (p.last_ok_ms > el->last_ok_ms) {
        el->last_ok_ms = p.last_ok_ms;
        el->next_ka_ms = p.next_ms;
    }
    if (p.expired) {
        ML_WARN(MOD, "etcd lease %lld expired during the promotion", (long long)el->lease);
        el->lease = 0;
        return "lease expired";
    }
    return rc ? "the promotion failed" : NULL;
}

/* A campaign binds the leader key to our lease, and the term it wins ends
 * TTL - margin after the lease's last renewal (the window above): campaign
 * only on a lease whose window has a tick left at least, renewing it first
 * when its last renewal is a tick old.
 * A standby cut off from etcd keeps a lease no keepalive renews, which etcd
 * may still hold for a moment after the cut heals (it revokes expired leases
 * in its own time); a term won on it ended before its grace did, and the
 * deposition dropped the state the standby had just promoted with, so an
 * acknowledged object was lost (CI on 4fe6c06, test_ha.py). */
static bool lease_fresh(moonlet_election *el)
{
    if (el->lease && moonlet_mono_ms() - el->last_ok_ms >= el->tick_ms)
        keepalive(el);
    /* at least a tick of the window left (margin <= TTL/2: see create) */
    return el->lease && el->last_ok_ms + el->ttl_ms - el->margin_ms > moonlet_mono_ms() + el->tick_ms;
}

static void campaign(moonlet_election *el)
{
    if (!lease_fresh(el))
        return; /* the next tick grants a lease, or renews this one */
    uint64_t t0 = moonlet_mono_ms();
    bool won = false;
    int64_t rev = 0;
    moonlet_etcd_kv cur;
    int rc = moonlet_etcd_txn_put(el->etcd, el->key, MOONLET_ETCD_CREATE_REVISION, 0,
                                  el->advertise, strlen(el->advertise), el->lease, &won, &rev,
                                  &cur);
    if (rc) {
        ML_DEBUG(MOD, "campaign failed: %s", moonlet_strerror(rc));
        return;
    }
    if (!won && cur.found && cur.lease == el->lease) { /* ours already (a lost reply) */
        won = true;
        rev = cur.create_revision;
    }
    if (won) {
        el->leader = true;
        el->epoch = (uint64_t)rev;
        const char *why = el->on_elected ? promote(el) : NULL;
        if (why) {
            moonlet_etcd_kv_free(&cur);
            depose(el, why);
            return;
        }
        moonlet_role_elected(el->role, el->epoch, t0 + el->ttl_ms /* grace: one TTL */,
                             el->last_ok_ms + el->ttl_ms - el->margin_ms);
    } else if (cur.found) {
        moonlet_role_set_leader(el->role, cur.value, (uint64_t)cur.create_revision);
    } else {
        moonlet_role_set_leader(el->role, NULL, 0);
    }
    moonlet_etcd_kv_free(&cur);
}

/* A standby's poll: campaign when the key is gone (or ours: a campaign
 * whose reply was lost); else tell the role who leads and take over a
 * leader that is gone (election.h, "Fast takeover"). */
static void standby_poll(moonlet_election *el)
{
    moonlet_etcd_kv kv;
    if (moonlet_etcd_get(el->etcd, el->key, &kv, NULL) != MOONLET_OK)
        return;
    if (!kv.found || kv.lease == el->lease) {
        moonlet_etcd_kv_free(&kv);
        /* A vacant key: the master etcd names in sync, if alive, goes first
         * (issue 31 section 3); for a bounded time. */
        uint64_t now = moonlet_mono_ms();
        if (!kv.found && el->defer_campaign &&
            (!el->defer_since_ms ||
             now - el->defer_since_ms < MOONLET_ELECTION_DEFER_TTLS * el->ttl_ms) &&
            el->defer_campaign(el->arg)) {
            if (!el->defer_since_ms) {
                el->defer_since_ms = now ? now : 1;
                ML_INFO(MOD, "the leader key is vacant: campaign deferred to the master named in "
                        "sync (at most %llu ms)",
                        (unsigned long long)(MOONLET_ELECTION_DEFER_TTLS * el->ttl_ms));
            }
            return;
        }
        campaign(el);
        return;
    }
    el->defer_since_ms = 0;
    moonlet_role_set_leader(el->role, kv.value, (uint64_t)kv.create_revision);
    if (el->takeover && kv.lease && kv.value) {
        int pr = moonlet_election_probe(kv.value, (uint32_t)(el->poll_ms < 200 ? el->poll_ms : 200));
        if (pr > 0) {
            el->alive_rev = (uint64_t)kv.create_revision;
        } else if (pr == 0 && el->alive_rev == (uint64_t)kv.create_revision &&
                   (!el->may_take_over ||
                    el->may_take_over(el->arg, (uint64_t)kv.create_revision))) {
            /* it accepted our probe in this term and now nothing listens there */
            if (!lease_fresh(el)) {
                moonlet_etcd_kv_free(&kv);
                return; /* not while we could not win it (campaign) */
            }
            ML_WARN(MOD, "leader %s (epoch %lld) refuses connections: revoking its lease %lld",
                    kv.value, (long long)kv.create_revision, (long long)kv.lease);
            int rc = moonlet_etcd_lease_revoke(el->etcd, kv.lease);
            moonlet_etcd_kv_free(&kv);
            if (rc == MOONLET_OK) { /* else the next poll tries again */
                el->alive_rev = 0;
                campaign(el);
            }
            return;
        }
    }
    moonlet_etcd_kv_free(&kv);
}

/* The leader's check that the key still names it. */
static void check_key(moonlet_election *el)
{
    moonlet_etcd_kv kv;
    if (moonlet_etcd_get(el->etcd, el->key, &kv, NULL) != MOONLET_OK)
        return;
    bool ours = kv.found && (uint64_t)kv.create_revision == el->epoch && kv.lease == el->lease;
    moonlet_etcd_kv_free(&kv);
    if (!ours)
        depose(el, "the leader key is no longer ours");
}

static void *election_main(void *arg)
{
    moonlet_election *el = arg;
    for (;;) {
        pthread_mutex_lock(&el->mu);
        bool stop = el->stop, need_reset = el->need_reset;
        pthread_mutex_unlock(&el->mu);
        if (stop)
            break;
        uint64_t now = moonlet_mono_ms();
        if (!el->lease) {
            int64_t id = 0, granted = 0;
            if (moonlet_etcd_lease_grant(el->etcd, (int64_t)(el->ttl_ms / 1000), &id, &granted) ==
                MOONLET_OK) {
                el->lease = id;
                el->last_ok_ms = now;
                el->next_ka_ms = now + el->tick_ms;
            }
        } else if (now >= el->next_ka_ms) {
            keepalive(el);
        }
        now = moonlet_mono_ms();
        if (el->leader && now >= el->last_ok_ms + el->ttl_ms - el->margin_ms)
            depose(el, "no keepalive succeeded within the lease TTL");
        else if (el->leader && el->lease)
            check_key(el);
        else if (!el->leader && el->lease && !need_reset)
            standby_poll(el);
        moonlet_role_tick(el->role, moonlet_mono_ms());

        /* sleep until the next keepalive, or the window's edge for the log */
        uint64_t wait = el->tick_ms;
        now = moonlet_mono_ms();
        if (el->lease && el->next_ka_ms > now && el->next_ka_ms - now < wait)
            wait = el->next_ka_ms - now;
        if (el->leader) {
            uint64_t end = el->last_ok_ms + el->ttl_ms - el->margin_ms;
            if (end > now && end - now < wait)
                wait = end - now;
        }
        moonlet_role_info info;
        moonlet_role_get(el->role, now, &info);
        if (el->leader && !info.serving && wait > 50)
            wait = 50; /* in the grace period: log the begin close to its time */
        if (!el->leader && el->lease && !need_reset && wait > el->poll_ms)
            wait = el->poll_ms; /* a standby: the next read of the key */
        pthread_mutex_lock(&el->mu);
        struct timespec ts = moonlet_mono_deadline_ts(wait ? wait : 1);
        if (!el->stop)
            pthread_cond_timedwait(&el->cv, &el->mu, &ts);
        pthread_mutex_unlock(&el->mu);
    }
    return NULL;
}

int moonlet_election_start(const moonlet_election_opts *o, moonlet_role *role,
                           moonlet_election **out)
{
    if (!o || !o->endpoints || !o->cluster_id || !*o->cluster_id || !o->advertise ||
        !*o->advertise || !role || strchr(o->cluster_id, '/') ||
        strlen(o->cluster_id) > 200 || strlen(o->advertise) >= MOONLET_ROLE_ADDR_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_election *el = calloc(1, sizeof(*el));
    if (!el)
        return MOONLET_ERR_INTERNAL_ERROR;
    uint32_t ttl_s = o->ttl_s ? o->ttl_s : MOONLET_ELECTION_DEFAULT_TTL_S;
    el->ttl_ms = (uint64_t)ttl_s * 1000;
    el->margin_ms = o->margin_ms ? o->margin_ms : el->ttl_ms / 4;
    if (el->margin_ms >= el->ttl_ms / 2)
        el->margin_ms = el->ttl_ms / 4;
    el->tick_ms = el->ttl_ms / 3;
    el->poll_ms = moonlet_election_poll_ms(el->ttl_ms);
    el->takeover = !o->no_takeover;
    el->may_take_over = o->may_take_over;
    el->defer_campaign = o->defer_campaign;
    el->role = role;
    el->on_deposed = o->on_deposed;
    el->on_elected = o->on_elected;
    el->arg = o->arg;
    snprintf(el->key, sizeof(el->key), "/moonlet/%s/leader", o->cluster_id);
    snprintf(el->advertise, sizeof(el->advertise), "%s", o->advertise);
    /* each etcd request well within a tick, so a dead endpoint cannot hold
     * the loop past the window */
    int rc = moonlet_etcd_create(o->endpoints, (int)(el->tick_ms / 2), &el->etcd);
    if (rc) {
        free(el);
        return rc;
    }
    pthread_mutex_init(&el->mu, NULL);
    moonlet_cond_init_mono(&el->cv);
    if (moonlet_thread_create(&el->thread, election_main, el, "ha-election") != 0) {
        moonlet_etcd_destroy(el->etcd);
        pthread_cond_destroy(&el->cv);
        pthread_mutex_destroy(&el->mu);
        free(el);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    ML_INFO(MOD, "campaigning for %s as %s (lease TTL %u s, fencing margin %llu ms)", el->key,
            el->advertise, ttl_s, (unsigned long long)el->margin_ms);
    *out = el;
    return MOONLET_OK;
}

void moonlet_election_reset_done(moonlet_election *el)
{
    pthread_mutex_lock(&el->mu);
    el->need_reset = false;
    pthread_cond_signal(&el->cv);
    pthread_mutex_unlock(&el->mu);
}

void moonlet_election_stop(moonlet_election *el)
{
    if (!el)
        return;
    pthread_mutex_lock(&el->mu);
    el->stop = true;
    pthread_cond_signal(&el->cv);
    pthread_mutex_unlock(&el->mu);
    pthread_join(el->thread, NULL);
    if (el->leader) {
        moonlet_role_deposed(el->role, moonlet_mono_ms());
        ML_INFO(MOD, "stepping down (shutdown)");
    }
    if (el->lease)
        moonlet_etcd_lease_revoke(el->etcd, el->lease);
    moonlet_etcd_destroy(el->etcd);
    pthread_cond_destroy(&el->cv);
    pthread_mutex_destroy(&el->mu);
    free(el);
}
