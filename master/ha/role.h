/*
 * role.h - the master's role state machine for high availability: whether
 * this master may serve now, under which epoch, and whom to name as the
 * leader when it may not.
 *
 * States: SINGLE (no etcd: always serving, epoch 0, today's behaviour),
 * STANDBY (not the leader: every call but AUTH, Echo and Hello gets
 * NOT_LEADER with the leader's address), LEADER (elected; serving only
 * inside its window [serve_from, serve_until) on CLOCK_MONOTONIC ms).
 * The election (election.c) drives the transitions: elected (with the
 * epoch, the window start = election time + grace), renewed (the window end
 * moves to last keepalive sent + TTL - margin), deposed.  The window is read
 * by every request (moonlet_role_gate), so a leader whose keepalives stopped
 * stops serving at serve_until by the clock alone, whatever its threads do.
 * A replication stream (issue 14's second half) adds its states here.
 *
 * Serving intervals are logged ("ha: serving begin|end epoch=E mono_ms=T")
 * with the window's own bounds, so the intervals of two masters on one host
 * can be compared (tests/ha).
 *
 * Threads and locks: the gate is lock-free (seq_cst atomics; the window end
 * is cleared before the epoch changes and set last, so a reader that sees a
 * window sees its epoch).  The leader address and the logging of interval
 * ends take role->mu, a leaf lock.  Pure: no I/O but logging; tests pass
 * their own clock values.
 */
#ifndef MOONLET_ROLE_H
#define MOONLET_ROLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    MOONLET_ROLE_SINGLE = 0,
    MOONLET_ROLE_STANDBY = 1,
    MOONLET_ROLE_LEADER = 2,
} moonlet_role_state;

typedef struct moonlet_role moonlet_role;

#define MOONLET_ROLE_ADDR_MAX 256

/* A role in state STANDBY (leader unknown), advertising `advertise` (HOST:PORT). */
int moonlet_role_create(const char *advertise, moonlet_role **out);
void moonlet_role_destroy(moonlet_role *r);
/* Changes the advertised address (moonlet-master, once its port is bound). */
void moonlet_role_set_advertise(moonlet_role *r, const char *advertise);

/* The per-request check: true when this master may serve at now_ms.  *epoch
 * gets the epoch to stamp on the reply: its own while serving, else the
 * newest leader epoch it knows (0: none).  NULL role: SINGLE (true, 0). */
bool moonlet_role_gate(const moonlet_role *r, uint64_t now_ms, uint64_t *epoch);

/* Transitions (the election's thread).  elected: this master won epoch
 * `epoch` at now_ms; it serves from now_ms + grace_ms until serve_until_ms.
 * renewed: a keepalive succeeded; the window end moves to serve_until_ms
 * (never backwards).  deposed: stops serving now (logs the interval's end). */
void moonlet_role_elected(moonlet_role *r, uint64_t epoch, uint64_t serve_from_ms,
                          uint64_t serve_until_ms);
void moonlet_role_renewed(moonlet_role *r, uint64_t serve_until_ms);
void moonlet_role_deposed(moonlet_role *r, uint64_t now_ms);
/* What the standby learnt of the leader (addr NULL or "": unknown). */
void moonlet_role_set_leader(moonlet_role *r, const char *addr, uint64_t epoch);
/* Logs the begin / end of serving intervals that the clock crossed since the
 * last call (the election calls it on every tick and on every transition). */
void moonlet_role_tick(moonlet_role *r, uint64_t now_ms);

/* A consistent snapshot, for Hello, inspect and metrics. */
typedef struct moonlet_role_info {
    moonlet_role_state state;
    bool serving;              /* at the snapshot's time */
    uint64_t epoch;            /* own epoch while leader, else the known leader's */
    uint64_t terms;            /* times elected */
    uint64_t serve_in_ms;      /* LEADER in its grace period: ms until it serves (else 0) */
    char leader[MOONLET_ROLE_ADDR_MAX];    /* "" when unknown */
    char advertise[MOONLET_ROLE_ADDR_MAX];
} moonlet_role_info;
void moonlet_role_get(const moonlet_role *r, uint64_t now_ms, moonlet_role_info *out);
const char *moonlet_role_state_name(moonlet_role_state s);

#endif
