/*
 * ha.h - the master's high-availability orchestration (issue 14): the
 * election on etcd, the hot standby's follower, and what a promotion does
 * to the master being served.
 *
 * It owns: the replication log the leader's master emits into, the etcd
 * clients for the in-sync mark (one for the log's marking, one for the
 * promotion), the follower's lifetime (started while a standby, stopped at
 * a promotion and joined later), the election (started and stopped here;
 * its callbacks are this module's), and the liveness hold of a promotion
 * with state (moonlet_ha_liveness_hold_ms).  It does not own the master,
 * the RPC service or the role: the daemon (tools/moonlet-master.c) creates
 * and replaces them and tells this module which master it serves.
 *
 * One per process: the service's follower_status hook takes no argument,
 * so the state is this module's own (moonlet_ha_init once, moonlet_ha_fini
 * once at exit).
 *
 * Promotion (the election's on_elected, before the serving window opens):
 * the follower stops and hands over its state; the state is restored into
 * the (empty) master only if etcd's /moonlet/<cluster>/insync names this
 * master for the epoch it followed and the follower was consistent
 * (moonlet_ha_promote: the pure part, no etcd); then the new leader names
 * itself in the mark for its own epoch (fenced), so a mark is never older
 * than the newest term, and says who holds the term's records: the leader,
 * until a standby is in sync.  A leader deposed keeps a copy of its
 * metadata (moonlet_ha_keep) and restores it if it wins again while the
 * mark still names it for the term it led.
 *
 * Threads and locks: follower_mu (a leaf) guards the follower pointers; it
 * is never held across an etcd call or a join.  The election's callbacks
 * run on its thread; the log's mark callback on a writer's (no lock held);
 * the rest on the daemon's main thread.  What blocks: moonlet_ha_start and
 * the promotion call etcd (2 s timeout per call, up to three tries to clear
 * the mark); moonlet_ha_reap, moonlet_ha_resume and moonlet_ha_stop join a
 * retired follower, which may wait out a call to a leader that is gone
 * (repl_stream.h); moonlet_ha_stop joins the election's thread.
 */
#ifndef MOONLET_HA_H
#define MOONLET_HA_H

#include <stdbool.h>
#include <stdint.h>

#include "master.h"
#include "replicate.h"
#include "repl_stream.h"
#include "role.h"
#include "service.h"

typedef struct moonlet_ha_opts {
    const char *etcd_endpoints;   /* "URL[,URL...]" (required) */
    const char *cluster_id;       /* keys under /moonlet/<cluster_id>/ (required) */
    moonlet_role *role;           /* the served role (required; outlives the module) */
    uint32_t etcd_ttl_s;          /* etcd lease TTL; 0: MOONLET_ELECTION_DEFAULT_TTL_S */
    uint64_t client_live_ttl_ms;  /* the master's liveness TTL (cfg.client_live_ttl_ms) */
    bool replication;             /* a hot standby (false: a failover starts empty) */
    uint64_t repl_max_lag_ms;     /* replication: the log's lag bound */
    const char *auth_token;       /* the clients' token (NULL: none); outlives the module */
    const char *peer_token;       /* the masters' own (--peer-token-file; NULL: auth_token
                                   * is the peer credential too); outlives the module */
    struct moonlet_tls_ctx *tls;  /* client TLS to the leader's RPC and replication
                                   * servers (tls.h); NULL: plaintext; outlives the module */
    /* The election's notice that this master was deposed (its thread): the
     * owner drops the master and calls moonlet_ha_reset, then moonlet_ha_resume. */
    void (*on_deposed)(void *arg);
    void *arg;
} moonlet_ha_opts;

/* How long a master promoted with state holds liveness (no restored node is
 * unmounted as dead before it ends): a restored node can ping only once the
 * new leader serves (one etcd lease TTL after the promotion: the grace), it
 * may then be asleep in its longest retry backoff (MOONLET_NODE_BACKOFF_CAP_MS,
 * common/node_timing.h), having failed against the old leader or this one in
 * its grace; it gets both, then one liveness TTL.  etcd_ttl_s 0: the default. */
uint64_t moonlet_ha_liveness_hold_ms(uint32_t etcd_ttl_s, uint64_t client_live_ttl_ms);

/* What a promotion knows when it decides (moonlet_ha_promote). */
typedef struct moonlet_ha_promotion {
    uint64_t epoch;            /* the term won */
    uint64_t followed;         /* the leader epoch of the follower's snapshot; 0: none */
    bool named;                /* etcd's in-sync mark names this master for `followed` */
    bool consistent;           /* the follower replayed past its snapshot without divergence */
    uint64_t liveness_hold_ms; /* moonlet_ha_liveness_hold_ms */
} moonlet_ha_promotion;

/* The promotion's steps on the master, with no etcd: with a state, named
 * and consistent, restores st into m (empty: nothing served yet) and holds
 * its liveness for p->liveness_hold_ms (node pings count as now: the
 * restore's); otherwise leaves m empty.  Logs the outcome.  Returns true when
 * promoted with state (even if a segment mount failed: as before, that is
 * logged).  *restored (optional): objects restored.  st stays the caller's. */
bool moonlet_ha_promote(moonlet_master *m, const moonlet_repl_state *st,
                        const moonlet_ha_promotion *p, uint64_t *restored);

/* Sets the module up (the etcd clients and the log with replication) and
 * wires the master's config (repl_emit) and the service's options (repl,
 * follower_status) to it.  Once, before the master is created. */
int moonlet_ha_init(const moonlet_ha_opts *opts, moonlet_master_config *cfg,
                    moonlet_service_opts *so);
/* The replication log (NULL without replication): for the metrics. */
moonlet_repl_log *moonlet_ha_log(void);
/* The master now served (a promotion restores into it). */
void moonlet_ha_set_master(moonlet_master *m);
/* Starts following (with replication) and campaigning as `advertise`
 * (HOST:PORT, the bound port).  An error when the election cannot start
 * (logged). */
int moonlet_ha_start(const char *advertise);
/* Deposed, before the owner destroys the master it served (no handler runs
 * on it any more): keeps a copy of its metadata for a re-election (ha.c);
 * nothing without replication or before a first promotion. */
void moonlet_ha_keep(moonlet_master *m);
/* Deposed: the owner has destroyed the master it served; the log forgets
 * its records.  Then the owner creates a new master (moonlet_ha_set_master)
 * and calls moonlet_ha_resume. */
void moonlet_ha_reset(void);
/* A standby again: follows the next leader and lets the election campaign. */
void moonlet_ha_resume(void);
/* Stops the election and the follower (joins both).  Before the service
 * and the master stop. */
void moonlet_ha_stop(void);
/* Frees the log and the etcd clients: after the master is destroyed. */
void moonlet_ha_fini(void);

#endif
