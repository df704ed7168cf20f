/*
 * service.h - the master's control RPC: binds a moonlet_master to an RPC
 * server (transport/rpc_server.h) through one table of methods.
 *
 * Locks: none of its own; each handler calls the master library, which takes
 * the master's locks.
 */
#ifndef MOONLET_SERVICE_H
#define MOONLET_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "master.h"
#include "repl_stream.h"
#include "role.h"

typedef struct moonlet_master_service moonlet_master_service;

typedef struct moonlet_service_opts {
    const char *address;    /* default 127.0.0.1 */
    uint16_t port;          /* 0: ephemeral */
    int threads;            /* RPC threads; <= 0: cores */
    size_t max_frame;       /* 0: default (64 MiB) */
    const char *auth_token; /* NULL: no authentication */
    /* The masters' own credential (--peer-token-file): with it, the
     * replication server (ReplSnapshot, ReplStream: every record, the
     * segments' write keys and the nodes' bind secrets) takes only this
     * token, and a client's token gets ILLEGAL_CLIENT there.  NULL: the
     * replication server takes auth_token (the shared token is then the
     * peer credential too). */
    const char *peer_token;
    /* Credentials with roles (common/cred.h, --credentials): when set,
     * auth_token and peer_token are ignored here (moonlet-master adds the
     * peer token to the set as a peer credential); each method serves the
     * roles its row of the method table (methods.c) names, a credential
     * limited to tenants may name only those, Remove with force needs the
     * operator role, and the replication server takes peer credentials only.
     * Must outlive the service.  NULL: as before roles (one token, or none). */
    const struct moonlet_cred_set *creds;
    /* TLS (transport/tls.h): a server context for the RPC and replication
     * servers (mutual TLS when it has a CA); NULL: plaintext.  The servers
     * take references; moonlet_tls_ctx_reload on it (SIGHUP) reaches both. */
    struct moonlet_tls_ctx *tls;
    size_t max_batch_keys;  /* keys per batch call; 0: MOONLET_DEFAULT_MAX_BATCH_KEYS */
    /* Connection limits, passed to the RPC server (rpc_server.h; 0: its default). */
    uint32_t max_connections;
    uint32_t auth_timeout_ms;
    uint32_t frame_timeout_ms;
    uint32_t idle_timeout_ms;
    /* Method names, comma-separated (as in the method table, e.g.
     * "ProbeResume" or "BatchPutStart,BatchGetReplicaList") answered as
     * unknown methods, as a master that predates them would: for
     * compatibility tests and benchmarks.  NULL: none.  INVALID_PARAMS for
     * a name the table does not hold. */
    const char *disabled_method;
    /* HA (role.h): NULL serves every call as today (no epochs on the wire).
     * Otherwise every method but Echo and Hello is answered NOT_LEADER while
     * the role does not allow serving, and connections that sent Hello get
     * the epoch on every reply.  Must outlive the service. */
    const moonlet_role *role;
    /* Replication (repl_stream.h): serves ReplSnapshot / ReplStream from it,
     * and answers the writes (PutStart, PutEnd, PutRevoke, Remove,
     * RemoveAll, PutReplaceReplica, MountSegment, UnmountSegment) only after
     * moonlet_repl_log_wait.  NULL: none (the methods answer NOT_IMPLEMENTED
     * ... as unknown).  Must outlive the service. */
    moonlet_repl_log *repl;
    uint16_t repl_port;     /* the replication server's port (ReplPort says it); 0: ephemeral */
    /* The standby side's status for Hello (NULL: none): fills *st and
     * returns true while this master follows a leader. */
    bool (*follower_status)(moonlet_repl_follower_status *st);
} moonlet_service_opts;

#define MOONLET_DEFAULT_MAX_BATCH_KEYS 65536u

/* Binds, listens and starts serving `m` (which must outlive the service). */
int moonlet_master_service_start(moonlet_master *m, const moonlet_service_opts *opts,
                                 moonlet_master_service **out);
uint16_t moonlet_master_service_port(const moonlet_master_service *s);
struct moonlet_rpc_server;
/* Its RPC server (for its counters on /metrics); valid until the service stops. */
const struct moonlet_rpc_server *moonlet_master_service_rpc(const moonlet_master_service *s);
/* Stops serving and frees the service (not the master). */
void moonlet_master_service_stop(moonlet_master_service *s);

#endif
