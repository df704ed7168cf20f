/*
 * election.h - leader election of moonlet-master on etcd (etcd.h), driving
 * the role state machine (role.h).  Linked by moonlet-master only.
 *
 * One thread keeps an etcd lease of ttl_s seconds alive (a keepalive every
 * TTL/3) and campaigns with a transaction that creates
 * /moonlet/<cluster>/leader = <advertise> only if absent, bound to the
 * lease; the key's create revision is the epoch.  Elected, this master
 * serves from election + grace (one TTL) until "last successful keepalive
 * sent + TTL - margin" (the role's window: enforced by the clock on every
 * request, not by this thread).  The leader checks every tick that the key
 * is still its own.  When the window closes (keepalives failing), when the
 * lease is gone or the key changed hands, it is deposed: it revokes its
 * lease (best effort; otherwise it lapses since keepalives stop), asks the
 * owner to reset the metadata (on_deposed: a master that served must not
 * serve its old state again) and campaigns again only after
 * moonlet_election_reset_done().  A standby reads the key every
 * moonlet_election_poll_ms (TTL/20, 50 ms to TTL/3: a plain read, not a
 * transaction), tells the role who the leader is, and campaigns as soon
 * as the key is gone.
 *
 * Fast takeover: a standby that finds the leader's HOST:PORT refusing
 * connections (ECONNREFUSED: nothing listens there, the leader process is
 * gone) after that address had accepted its probe in the same term revokes
 * the leader's lease instead of waiting for etcd to expire it (up to TTL +
 * etcd's 500 ms expiry tick), then campaigns.  Safe whatever the probe
 * says: a keepalive etcd applied before the revoke was sent before the
 * campaign, so the old leader's window (that send + TTL - margin) closes
 * before the new leader's grace (campaign + TTL) ends; later keepalives
 * fail (lease gone) and depose it.  A partition (no answer, or unreachable)
 * is not a refusal: the lease runs out as before.  The owner may refuse a
 * takeover (opts.may_take_over): the master takes over only when it would
 * promote with its state (master/ha/ha.c).
 *
 * Threads and locks: its own thread, and while on_elected runs a second
 * one that keeps the lease alive (a slow promotion cannot lose it); el->mu
 * (a leaf) guards the stop and reset flags, the second thread's outcome and
 * their condition variables.  Calls into role.c and etcd.c
 * (which take their own leaf locks) without holding el->mu.
 */
#ifndef MOONLET_ELECTION_H
#define MOONLET_ELECTION_H

#include <stdbool.h>
#include <stdint.h>

#include "role.h"

typedef struct moonlet_election moonlet_election;

typedef struct moonlet_election_opts {
    const char *endpoints;  /* etcd: "http://h:p[,http://h:p...]" */
    const char *cluster_id; /* the key is /moonlet/<cluster_id>/leader */
    const char *advertise;  /* HOST:PORT clients reach this master at (the key's value) */
    uint32_t ttl_s;         /* lease TTL; 0: 5 */
    uint32_t margin_ms;     /* fencing margin; 0: TTL/4 */
    /* Called on the election thread once a leader was deposed; the owner
     * resets the master's state, then calls moonlet_election_reset_done(). */
    void (*on_deposed)(void *arg);
    void *arg;
    /* Called on the election thread when this master won `epoch`, before
     * its serving window is set (so before it may serve): promotion work
     * (repl_stream.h).  The lease is kept alive meanwhile, however long it
     * takes.  Nonzero: this master must not lead (it steps down
     * as a deposed leader does, then campaigns again).  NULL: none. */
    int (*on_elected)(void *arg, uint64_t epoch);
    bool no_takeover;       /* no fast takeover: a dead leader's lease expires by itself */
    /* Asked before a fast takeover of the leader of term leader_epoch (the
     * election's thread): false leaves that leader to its lease.  A
     * takeover is safe whatever the answer; this keeps a standby that would
     * promote empty from replacing a leader that only looks gone to it (a
     * firewall rejecting this standby alone).  NULL: always. */
    bool (*may_take_over)(void *arg, uint64_t leader_epoch);
    /* Asked before each campaign for a vacant key (the election's thread):
     * true defers it to the next poll, so that another master, the one etcd
     * names in sync and that is alive, wins and keeps its state; deferred
     * for at most MOONLET_ELECTION_DEFER_TTLS lease TTLs in a row (the one
     * named may be cut off from etcd: then this one leads, empty, rather
     * than nobody).  NULL: never deferred. */
    bool (*defer_campaign)(void *arg);
} moonlet_election_opts;

#define MOONLET_ELECTION_DEFER_TTLS 2u

#define MOONLET_ELECTION_DEFAULT_TTL_S 5u

/* How often a standby reads the leader key: TTL/20, at least 50 ms, at
 * most the keepalive tick (TTL/3).  Pure. */
uint64_t moonlet_election_poll_ms(uint64_t ttl_ms);

/* One TCP connect to HOST:PORT bounded by timeout_ms: 1 it accepted, 0 it
 * was refused (ECONNREFUSED), -1 neither (a timeout, unreachable, a bad
 * address). */
int moonlet_election_probe(const char *addr, uint32_t timeout_ms);

int moonlet_election_start(const moonlet_election_opts *opts, moonlet_role *role,
                           moonlet_election **out);
/* The owner reset the metadata after on_deposed: campaigning may resume. */
void moonlet_election_reset_done(moonlet_election *el);
/* Stops the thread; a leader steps down and revokes its lease first, so a
 * standby takes over without waiting for the TTL. */
void moonlet_election_stop(moonlet_election *el);

#endif
