/*
 * role.c - the master's HA role state machine (role.h).
 *
 * Locks: the gate takes none (atomics); role->mu, a leaf, guards the leader
 * address and the interval log state.
 */
#include "role.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "moonlet/error.h"

struct moonlet_role {
    _Atomic int state;
    _Atomic uint64_t epoch;       /* own epoch when LEADER, else the known leader's */
    _Atomic uint64_t serve_from;  /* LEADER: CLOCK_MONOTONIC ms */
    _Atomic uint64_t serve_until; /* LEADER: 0 when not serving at all */
    _Atomic uint64_t terms;
    pthread_mutex_t mu;           /* leaf: what follows */
    char leader[MOONLET_ROLE_ADDR_MAX];
    char advertise[MOONLET_ROLE_ADDR_MAX];
    bool logged_begin;            /* the current term's begin line was written */
    uint64_t logged_epoch;
    /* the window (epoch, serve_from) whose end line was written, and the end
     * written: a later tick logs its begin again only if a renewal moved
     * the end past it (a keepalive sent before the end whose reply came
     * after it), and then from that end */
    uint64_t ended_epoch, ended_from, ended_until;
};

int moonlet_role_create(const char *advertise, moonlet_role **out)
{
    moonlet_role *r = calloc(1, sizeof(*r));
    if (!r)
        return MOONLET_ERR_INTERNAL_ERROR;
    atomic_store(&r->state, MOONLET_ROLE_STANDBY);
    snprintf(r->advertise, sizeof(r->advertise), "%s", advertise ? advertise : "");
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return MOONLET_OK;
}

void moonlet_role_destroy(moonlet_role *r)
{
    if (!r)
        return;
    pthread_mutex_destroy(&r->mu);
    free(r);
}

void moonlet_role_set_advertise(moonlet_role *r, const char *advertise)
{
    pthread_mutex_lock(&r->mu);
    snprintf(r->advertise, sizeof(r->advertise), "%s", advertise ? advertise : "");
    pthread_mutex_unlock(&r->mu);
}

bool moonlet_role_gate(const moonlet_role *r, uint64_t now_ms, uint64_t *epoch)
{
    if (!r) {
        *epoch = 0;
        return true;
    }
    /* the end first: a reader that sees a window sees the epoch set before it */
    uint64_t until = atomic_load(&r->serve_until);
    uint64_t from = atomic_load(&r->serve_from);
    *epoch = atomic_load(&r->epoch);
    return until && from <= now_ms && now_ms < until;
}

/* Writes the begin/end lines the clock crossed; r->mu held. */
static void tick_locked(moonlet_role *r, uint64_t now_ms)
{
    uint64_t until = atomic_load(&r->serve_until);
    uint64_t from = atomic_load(&r->serve_from);
    uint64_t epoch = atomic_load(&r->epoch);
    bool ended = epoch == r->ended_epoch && from == r->ended_from;
    if (!r->logged_begin && until && from <= now_ms && from < until &&
        !(ended && until <= r->ended_until)) {
        r->logged_begin = true;
        r->logged_epoch = epoch;
        ML_INFO("ha", "serving begin epoch=%llu mono_ms=%llu", (unsigned long long)epoch,
                (unsigned long long)(ended ? r->ended_until : from));
    }
    if (r->logged_begin && (!until || until <= now_ms)) {
        /* the window's end: no reply was served at or after it */
        uint64_t end = until ? until : now_ms;
        r->logged_begin = false;
        r->ended_epoch = r->logged_epoch;
        r->ended_from = from;
        r->ended_until = end;
        ML_INFO("ha", "serving end epoch=%llu mono_ms=%llu", (unsigned long long)r->logged_epoch,
                (unsigned long long)end);
    }
}

void moonlet_role_tick(moonlet_role *r, uint64_t now_ms)
{
    pthread_mutex_lock(&r->mu);
    tick_locked(r, now_ms);
    pthread_mutex_unlock(&r->mu);
}

void moonlet_role_elected(moonlet_role *r, uint64_t epoch, uint64_t serve_from_ms,
                          uint64_t serve_until_ms)
{
    pthread_mutex_lock(&r->mu);
    atomic_store(&r->serve_until, 0);
    tick_locked(r, serve_from_ms); /* closes a previous term, if its end was not logged */
    r->logged_begin = false;
    atomic_store(&r->epoch, epoch);
    atomic_store(&r->serve_from, serve_from_ms);
    atomic_store(&r->state, MOONLET_ROLE_LEADER);
    atomic_fetch_add(&r->terms, 1);
    snprintf(r->leader, sizeof(r->leader), "%s", r->advertise);
    atomic_store(&r->serve_until, serve_until_ms);
    pthread_mutex_unlock(&r->mu);
    ML_INFO("ha", "elected leader: epoch=%llu, serving after the grace period, from mono_ms=%llu",
            (unsigned long long)epoch, (unsigned long long)serve_from_ms);
}

void moonlet_role_renewed(moonlet_role *r, uint64_t serve_until_ms)
{
    uint64_t cur = atomic_load(&r->serve_until);
    /* never backwards; never revives a window that is closed (cur 0) */
    while (cur && cur < serve_until_ms &&
           !atomic_compare_exchange_weak(&r->serve_until, &cur, serve_until_ms))
        ;
}

void moonlet_role_deposed(moonlet_role *r, uint64_t now_ms)
{
    pthread_mutex_lock(&r->mu);
    uint64_t until = atomic_load(&r->serve_until);
    if (until > now_ms) /* ends now, not at the window's end */
        atomic_store(&r->serve_until, now_ms > atomic_load(&r->serve_from) ? now_ms : 0);
    tick_locked(r, now_ms);
    atomic_store(&r->serve_until, 0);
    r->logged_begin = false;
    bool was = atomic_exchange(&r->state, MOONLET_ROLE_STANDBY) == MOONLET_ROLE_LEADER;
    if (was)
        r->leader[0] = 0;
    pthread_mutex_unlock(&r->mu);
    if (was)
        ML_INFO("ha", "no longer the leader (epoch %llu)",
                (unsigned long long)atomic_load(&r->epoch));
}

void moonlet_role_set_leader(moonlet_role *r, const char *addr, uint64_t epoch)
{
    pthread_mutex_lock(&r->mu);
    if (atomic_load(&r->state) != MOONLET_ROLE_LEADER) {
        snprintf(r->leader, sizeof(r->leader), "%s", addr ? addr : "");
        if (epoch > atomic_load(&r->epoch))
            atomic_store(&r->epoch, epoch);
    }
    pthread_mutex_unlock(&r->mu);
}

void moonlet_role_get(const moonlet_role *r, uint64_t now_ms, moonlet_role_info *out)
{
    memset(out, 0, sizeof(*out));
    if (!r) {
        out->state = MOONLET_ROLE_SINGLE;
        out->serving = true;
        return;
    }
    moonlet_role *w = (moonlet_role *)r;
    pthread_mutex_lock(&w->mu);
    out->state = (moonlet_role_state)atomic_load(&r->state);
    out->serving = moonlet_role_gate(r, now_ms, &out->epoch);
    uint64_t from = atomic_load(&r->serve_from);
    if (out->state == MOONLET_ROLE_LEADER && atomic_load(&r->serve_until) && from > now_ms)
        out->serve_in_ms = from - now_ms;
    out->terms = atomic_load(&r->terms);
    snprintf(out->leader, sizeof(out->leader), "%s", r->leader);
    snprintf(out->advertise, sizeof(out->advertise), "%s", r->advertise);
    pthread_mutex_unlock(&w->mu);
}

const char *moonlet_role_state_name(moonlet_role_state s)
{
    switch (s) {
    case MOONLET_ROLE_SINGLE: return "single";
    case MOONLET_ROLE_STANDBY: return "standby";
    case MOONLET_ROLE_LEADER: return "leader";
    }
    return "?";
}
