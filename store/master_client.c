/*
 * master_client.c - MasterClient: typed calls over the master's control RPC.
 *
 * Every call has the same three steps: begin (lock, reconnect if the last
 * call broke the connection, start the request), pack the arguments, finish
 * (send, wait, check the reply code), then decode and end (free the reply,
 * unlock).  A call never retries on its own: the master may have applied a
 * request whose reply was lost, and only the caller knows whether repeating
 * it is safe.  The next call after a failure reconnects, pacing its
 * attempts with a capped exponential backoff (master_client.h) so that a
 * master that is down is not hammered by every caller of every client; a
 * master that answers NOT_LEADER is tried again sooner (an elected leader
 * in its grace period exactly when it begins to serve, which its Hello
 * says: moonlet_mc_retry_ms).
 *
 * HA (master_client.h): the address may be a list.  With several masters
 * (or once one answered NOT_LEADER) a new connection sends Hello and is
 * kept only when that master serves (a single master, or the
 * leader past its grace period) with an epoch no older than any seen;
 * otherwise the connect moves on, to the leader the standby named first,
 * then the list's next masters.  The exceptions to "never retries": a call
 * whose request was never sent (no master could be connected) and one
 * answered NOT_LEADER or with an older epoch (a master that does not serve
 * did nothing) are repeated, on the leader, until the call's timeout.
 *
 * Locks: mc->mu for the whole call (released between the attempts of a
 * repeated call).
 */
#include "master_client.h"

#include <cjson/cJSON.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "methods.h"
#include "moonlet/error.h"
#include "rpc_client.h"
#include "tls.h"
#include "wire.h"
#include "monotime.h"
#include "net.h"
#include "sync.h"

#define MC_MAX_MASTERS 16
#define MC_HELLO_TIMEOUT_MS 2000 /* connect + Hello on a new connection, at most */

struct mc_addr {
    char host[256];
    uint16_t port;
};

struct moonlet_master_client {
    pthread_mutex_t mu;
    struct mc_addr addr[MC_MAX_MASTERS]; /* the masters given, in order */
    unsigned naddr;
    unsigned cur;             /* the list's master tried first */
    struct mc_addr hint;      /* the leader a standby named (port 0: none) */
    uint64_t max_epoch;       /* the highest epoch any reply carried */
    bool use_hello;           /* HA possible: several masters given, or NOT_LEADER seen */
    char host[256];           /* the master of the current connection */
    uint16_t port;
    int timeout_ms;
    char *token;
    moonlet_tls_ctx *tls;     /* NULL: plaintext */
    moonlet_rpc_client *rpc;
    uint32_t backoff_base_ms, backoff_cap_ms;
    uint32_t failures;         /* failed connects in a row */
    uint64_t next_connect_ms;  /* CLOCK_MONOTONIC; no attempt before it while failures > 0 */
    uint64_t serve_in_ms;      /* this round: an elected leader's Hello said it serves in (0: none) */
    char *ident_id, *ident_secret; /* moonlet_mc_bind_client: re-sent on every new connection */
    bool bound;                /* the current connection holds ident_id */
    uint64_t conns;            /* connections made so far */
    uint64_t no_resume_conn;   /* that connection's master lacks ProbeResume (0: none seen) */
    uint64_t no_batch_conn;    /* that connection's master lacks the batch put/get methods */
};

/* The methods a master older than them may not know (the batch put/get
 * calls): such a master answers "unknown method", which becomes
 * INVALID_VERSION and is remembered for the connection, so later calls on
 * it fail at once without a round trip and the caller makes the single
 * calls instead (a new connection asks again). */
static bool mc_optional_method(uint32_t method)
{
    return method >= MOONLET_M_BATCH_PUT_START && method <= MOONLET_M_BATCH_GET_REPLICA_LIST;
}

uint32_t moonlet_mc_backoff_ms(uint32_t base_ms, uint32_t cap_ms, unsigned failures)
{
    if (failures == 0)
        return 0;
    if (cap_ms < base_ms)
        cap_ms = base_ms;
    uint64_t ms = base_ms;
    for (unsigned i = 1; i < failures && ms < cap_ms; i++)
        ms *= 2;
    return ms < cap_ms ? (uint32_t)ms : cap_ms;
}

uint32_t moonlet_mc_retry_ms(uint32_t base_ms, uint32_t cap_ms, unsigned failures, int rc,
                             uint64_t serve_in_ms)
{
    if (rc == MOONLET_ERR_NOT_LEADER && serve_in_ms > 0) /* at most a put timeout's grace */
        return serve_in_ms < 600000 ? (uint32_t)serve_in_ms + 1 : 600000;
    uint32_t ms = moonlet_mc_backoff_ms(base_ms, cap_ms, failures);
    if (rc == MOONLET_ERR_NOT_LEADER && ms > MOONLET_MC_NOT_LEADER_CAP_MS)
        ms = base_ms > MOONLET_MC_NOT_LEADER_CAP_MS ? base_ms : MOONLET_MC_NOT_LEADER_CAP_MS;
    return ms;
}

void moonlet_replica_list_free(moonlet_replica_list *l)
{
    if (!l)
        return;
    for (uint32_t i = 0; i < l->count; i++) {
        free(l->replicas[i].segment_id);
        free(l->replicas[i].endpoint);
        free(l->replicas[i].protocol);
        free(l->replicas[i].alt_segment_id);
        free(l->replicas[i].alt_endpoint);
        free(l->replicas[i].alt_protocol);
    }
    free(l->replicas);
    memset(l, 0, sizeof(*l));
}

static int parse_addr(const char *addr, char *host, size_t cap, uint16_t *port)
{
    int rc = moonlet_net_split_hostport(addr, host, cap, port);
    return rc == MOONLET_OK && *port == 0 ? MOONLET_ERR_INVALID_PARAMS : rc;
}

/* The leader's "host:port" that Hello or a NOT_LEADER reply named, into
 * mc->hint.  Absent, not a string, empty or too long: mc->hint stays as it
 * is; unparsable: mc->hint.port becomes 0 (no hint). */
static void take_leader_hint(moonlet_master_client *mc, const msgpack_object *ld)
{
    char leader[256];
    if (!ld || ld->type != MSGPACK_OBJECT_STR || !ld->via.str.size ||
        ld->via.str.size >= sizeof(leader))
        return;
    memcpy(leader, ld->via.str.ptr, ld->via.str.size);
    leader[ld->via.str.size] = 0;
    if (parse_addr(leader, mc->hint.host, sizeof(mc->hint.host), &mc->hint.port))
        mc->hint.port = 0;
}

/* Whether an idle connection is dead: the master sends nothing unasked, so
 * anything readable (EOF after a restart, a reset, stray bytes) means the
 * connection cannot carry the next call. */
static bool mc_idle_conn_dead(const moonlet_rpc_client *rpc)
{
    struct pollfd p = {.fd = moonlet_rpc_client_fd(rpc), .events = POLLIN | POLLRDHUP};
    return poll(&p, 1, 0) > 0;
}

/* Hello's verdict on a fresh connection. */
enum { HELLO_SERVES, HELLO_NOT_LEADER, HELLO_FAILED, HELLO_REFUSED };

/* Sends Hello on mc->rpc: whether this master serves; a standby's leader
 * goes to mc->hint.  A master older than Hello serves (no HA). */
static int mc_hello_locked(moonlet_master_client *mc)
{
    moonlet_rpc_client_begin(mc->rpc, MOONLET_M_HELLO, 0);
    moonlet_reply rep;
    if (moonlet_rpc_client_call(mc->rpc, &rep) != 0)
        return HELLO_FAILED;
    int verdict = HELLO_SERVES;
    if (rep.code == MOONLET_ERR_ILLEGAL_CLIENT) {
        verdict = HELLO_REFUSED; /* no or a wrong token */
    } else if (rep.code == MOONLET_OK) {
        const msgpack_object *ep = moonlet_wire_map_get(rep.result, "epoch");
        const msgpack_object *sv = moonlet_wire_map_get(rep.result, "serving");
        const msgpack_object *ld = moonlet_wire_map_get(rep.result, "leader");
        uint64_t epoch = ep && ep->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? ep->via.u64 : 0;
        bool serving = !sv || (sv->type == MSGPACK_OBJECT_BOOLEAN && sv->via.boolean);
        if (epoch < mc->max_epoch) {
            verdict = HELLO_NOT_LEADER; /* a deposed master that has not learnt better */
        } else {
            mc->max_epoch = epoch;
            if (!serving) {
                verdict = HELLO_NOT_LEADER;
                take_leader_hint(mc, ld);
                /* an elected leader in its grace period says when it serves */
                const msgpack_object *si = moonlet_wire_map_get(rep.result, "serve_in_ms");
                if (si && si->type == MSGPACK_OBJECT_POSITIVE_INTEGER && si->via.u64 &&
                    (!mc->serve_in_ms || si->via.u64 < mc->serve_in_ms))
                    mc->serve_in_ms = si->via.u64;
            }
        }
    }
    /* else: INVALID_PARAMS "unknown method" from a master older than HA */
    moonlet_reply_destroy(&rep);
    return verdict;
}

/* One connect attempt to a, with Hello. */
static int mc_try_locked(moonlet_master_client *mc, const struct mc_addr *a)
{
    /* a master that accepts but does not answer (stopped) must not eat the
     * whole call's timeout: connect and Hello get a shorter one */
    int quick = mc->timeout_ms < MC_HELLO_TIMEOUT_MS ? mc->timeout_ms : MC_HELLO_TIMEOUT_MS;
    moonlet_rpc_client_opts o = {.timeout_ms = quick, .auth_token = mc->token,
                                 .auth_token_len = mc->token ? strlen(mc->token) : 0,
                                 .tls = mc->tls};
    int rc = moonlet_rpc_client_connect(a->host, a->port, &o, &mc->rpc);
    if (rc) {
        mc->rpc = NULL;
        return rc;
    }
    /* Hello only where HA is possible: a client of one master that never
     * said NOT_LEADER talks to it exactly as before */
    int v = mc->use_hello ? mc_hello_locked(mc) : HELLO_SERVES;
    moonlet_rpc_client_set_timeout(mc->rpc, mc->timeout_ms);
    if (v != HELLO_SERVES) {
        moonlet_rpc_client_close(mc->rpc);
        mc->rpc = NULL;
        return v == HELLO_NOT_LEADER ? MOONLET_ERR_NOT_LEADER
               : v == HELLO_REFUSED  ? MOONLET_ERR_ILLEGAL_CLIENT
                                     : MOONLET_ERR_RPC_FAIL;
    }
    snprintf(mc->host, sizeof(mc->host), "%s", a->host);
    mc->port = a->port;
    return MOONLET_OK;
}

static bool same_addr(const struct mc_addr *a, const struct mc_addr *b)
{
    return a->port == b->port && strcmp(a->host, b->host) == 0;
}

/* Connects to a master that serves: the leader a standby named, then the
 * list from mc->cur; each at most once per round, plus one named leader. */
static int mc_connect_round_locked(moonlet_master_client *mc)
{
    int rc = MOONLET_ERR_RPC_FAIL;
    bool tried[MC_MAX_MASTERS] = {0};
    unsigned follows = 0;
    for (unsigned k = 0; k < mc->naddr + 2; k++) {
        struct mc_addr a;
        int idx = -1;
        if (mc->hint.port && follows < 2) {
            a = mc->hint;
            mc->hint.port = 0;
            follows++;
            for (unsigned i = 0; i < mc->naddr; i++)
                if (same_addr(&a, &mc->addr[i]))
                    idx = (int)i;
            if (idx >= 0 && tried[idx])
                continue;
        } else {
            unsigned i = 0;
            for (; i < mc->naddr && tried[(mc->cur + i) % mc->naddr]; i++)
                ;
            if (i == mc->naddr)
                break;
            idx = (int)((mc->cur + i) % mc->naddr);
            a = mc->addr[idx];
        }
        if (idx >= 0)
            tried[idx] = true;
        int r = mc_try_locked(mc, &a);
        if (r == MOONLET_OK) {
            if (idx >= 0)
                mc->cur = (unsigned)idx;
            return MOONLET_OK;
        }
        /* NOT_LEADER outranks an unreachable master: some master is up */
        if (rc != MOONLET_ERR_NOT_LEADER && rc != MOONLET_ERR_ILLEGAL_CLIENT)
            rc = r;
    }
    return rc;
}

static int mc_connect_locked(moonlet_master_client *mc)
{
    if (mc->rpc && !moonlet_rpc_client_broken(mc->rpc) && !mc_idle_conn_dead(mc->rpc))
        return MOONLET_OK;
    if (mc->rpc && mc->naddr > 1) /* that master failed us: start from the next one */
        mc->cur = (mc->cur + 1) % mc->naddr;
    moonlet_rpc_client_close(mc->rpc);
    mc->rpc = NULL;
    if (mc->failures) {
        uint64_t now = moonlet_mono_ms();
        if (now < mc->next_connect_ms) {
            uint64_t wait = mc->next_connect_ms - now;
            if (wait > (uint64_t)mc->timeout_ms)
                return MOONLET_ERR_RPC_FAIL; /* not this call's turn: fail without waiting */
            poll(NULL, 0, (int)wait);
        }
    }
    mc->serve_in_ms = 0;
    int rc = mc_connect_round_locked(mc);
    mc->bound = false;
    if (rc) {
        mc->rpc = NULL;
        if (mc->failures < 64)
            mc->failures++;
        uint64_t wait = moonlet_mc_retry_ms(mc->backoff_base_ms, mc->backoff_cap_ms,
                                            mc->failures, rc, mc->serve_in_ms);
        /* a grace longer than a call: the next call waits what it can
         * (a backoff longer than a call is not waited: see mc_connect) */
        if (rc == MOONLET_ERR_NOT_LEADER && mc->serve_in_ms && wait > (uint64_t)mc->timeout_ms)
            wait = (uint64_t)mc->timeout_ms;
        mc->next_connect_ms = moonlet_mono_ms() + wait;
    } else {
        mc->failures = 0;
        mc->conns++;
    }
    return rc;
}

unsigned moonlet_mc_connect_failures(moonlet_master_client *mc)
{
    return moonlet_locked_u32(&mc->mu, &mc->failures);
}

int moonlet_mc_create(const char *addr, const moonlet_master_client_opts *opts,
                      moonlet_master_client **out)
{
    moonlet_master_client *mc = calloc(1, sizeof(*mc));
    if (!mc)
        return MOONLET_ERR_INTERNAL_ERROR;
    int rc = addr && *addr ? MOONLET_OK : MOONLET_ERR_INVALID_PARAMS;
    char *list = rc ? NULL : strdup(addr), *save = NULL;
    if (!rc && !list)
        rc = MOONLET_ERR_INTERNAL_ERROR;
    for (char *t = list ? strtok_r(list, ", ", &save) : NULL; t && !rc;
         t = strtok_r(NULL, ", ", &save)) {
        if (mc->naddr == MC_MAX_MASTERS)
            rc = MOONLET_ERR_INVALID_PARAMS;
        else
            rc = parse_addr(t, mc->addr[mc->naddr].host, sizeof(mc->addr[0].host),
                            &mc->addr[mc->naddr].port);
        mc->naddr += rc == MOONLET_OK;
    }
    free(list);
    if (!rc && !mc->naddr)
        rc = MOONLET_ERR_INVALID_PARAMS;
    mc->use_hello = mc->naddr > 1;
    if (rc) {
        free(mc);
        return rc;
    }
    mc->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 10000;
    mc->backoff_base_ms = opts && opts->backoff_base_ms ? opts->backoff_base_ms
                                                        : MOONLET_MC_BACKOFF_BASE_MS;
    mc->backoff_cap_ms = opts && opts->backoff_cap_ms ? opts->backoff_cap_ms
                                                      : MOONLET_MC_BACKOFF_CAP_MS;
    if (opts && opts->auth_token && opts->auth_token[0])
        mc->token = strdup(opts->auth_token);
    if (opts && opts->tls) {
        moonlet_tls_ctx_ref(opts->tls);
        mc->tls = opts->tls;
    }
    pthread_mutex_init(&mc->mu, NULL);
    rc = mc_connect_locked(mc);
    if (!rc) /* a round trip now, so a refused token or a wrong peer shows here */
        rc = moonlet_mc_echo(mc, NULL, 0);
    /* HA: masters answered but none serves yet (an election, a grace period):
     * the client exists; its calls wait for a leader within their timeout */
    if (rc == MOONLET_ERR_NOT_LEADER && mc->use_hello)
        rc = MOONLET_OK;
    if (rc) {
        moonlet_mc_destroy(mc);
        return rc;
    }
    *out = mc;
    return MOONLET_OK;
}

static int mc_bind_locked(moonlet_master_client *mc);

int moonlet_mc_bind_client(moonlet_master_client *mc, const char *client_id, const char *secret)
{
    if (!client_id || !secret || !*secret)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_mutex_lock(&mc->mu);
    free(mc->ident_id);
    free(mc->ident_secret);
    mc->ident_id = strdup(client_id);
    mc->ident_secret = strdup(secret);
    int rc = mc->ident_id && mc->ident_secret ? mc_connect_locked(mc) : MOONLET_ERR_INTERNAL_ERROR;
    if (!rc)
        rc = mc_bind_locked(mc);
    pthread_mutex_unlock(&mc->mu);
    return rc;
}

void moonlet_mc_destroy(moonlet_master_client *mc)
{
    if (!mc)
        return;
    moonlet_rpc_client_close(mc->rpc);
    pthread_mutex_destroy(&mc->mu);
    free(mc->ident_id);
    free(mc->ident_secret);
    free(mc->token);
    moonlet_tls_ctx_unref(mc->tls);
    free(mc);
}

/* ---- call skeleton ------------------------------------------------------- */

/* A C string as a str argument (NULL packs nil, which the master refuses). */
static moonlet_str mstr(const char *s)
{
    return (moonlet_str){s, s ? (uint32_t)strlen(s) : 0};
}

/* The same, NULL meaning "" (the default tenant, an empty prefix or cursor). */
static moonlet_str mstr0(const char *s)
{
    return mstr(s ? s : "");
}

/* Sends the begun request and takes its reply, refusing a reply older than
 * an epoch already seen and following NOT_LEADER: either closes the
 * connection (the next connect goes to the named leader, or the next
 * master) and returns NOT_LEADER.  Returns the transport error or the
 * reply's code; *have_rep: rep must be destroyed. */
static int mc_call_checked(moonlet_master_client *mc, moonlet_reply *rep, bool *have_rep)
{
    int rc = moonlet_rpc_client_call(mc->rpc, rep);
    *have_rep = rc == 0;
    if (rc)
        return rc;
    if (rep->epoch && rep->epoch < mc->max_epoch) {
        rc = MOONLET_ERR_NOT_LEADER; /* a stale master: whatever it says is void */
    } else {
        if (rep->epoch > mc->max_epoch)
            mc->max_epoch = rep->epoch;
        if (rep->code != MOONLET_ERR_NOT_LEADER)
            return rep->code;
        rc = MOONLET_ERR_NOT_LEADER;
        mc->use_hello = true; /* an HA master: from now on, Hello on every connection */
        take_leader_hint(mc, rep->result);
    }
    moonlet_reply_destroy(rep);
    *have_rep = false;
    moonlet_rpc_client_close(mc->rpc);
    mc->rpc = NULL;
    return rc;
}

/* BindClient on the current connection; mc->mu held, connected. */
static int mc_bind_locked(moonlet_master_client *mc)
{
    moonlet_args_bind a = {.client_id = mstr(mc->ident_id), .secret = mstr(mc->ident_secret)};
    const moonlet_rpc_args_spec *spec = moonlet_master_method(MOONLET_M_BIND_CLIENT)->spec;
    uint32_t n = moonlet_rpc_args_count(spec, &a);
    moonlet_rpc_args_pack(spec, &a, n, moonlet_rpc_client_begin(mc->rpc, MOONLET_M_BIND_CLIENT, n));
    moonlet_reply rep;
    bool have;
    int rc = mc_call_checked(mc, &rep, &have);
    if (have)
        moonlet_reply_destroy(&rep);
    mc->bound = rc == 0;
    return rc;
}

/* Locks and starts a request; NULL (and *rc set, lock released) on failure. */
static msgpack_packer *mc_begin(moonlet_master_client *mc, uint32_t method, uint32_t nargs, int *rc)
{
    pthread_mutex_lock(&mc->mu);
    *rc = mc_connect_locked(mc);
    /* A new connection proves the node's identity before any other call. */
    if (!*rc && mc->ident_id && !mc->bound)
        *rc = mc_bind_locked(mc);
    if (*rc) {
        pthread_mutex_unlock(&mc->mu);
        return NULL;
    }
    return moonlet_rpc_client_begin(mc->rpc, method, nargs);
}

/* Sends and waits.  Returns the transport error or the reply's code.  When
 * it returns 0, rep->result is valid until mc_end().  Always call mc_end. */
static int mc_finish(moonlet_master_client *mc, moonlet_reply *rep, bool *have_rep)
{
    return mc_call_checked(mc, rep, have_rep);
}

static void mc_end(moonlet_master_client *mc, moonlet_reply *rep, bool have_rep)
{
    if (have_rep)
        moonlet_reply_destroy(rep);
    pthread_mutex_unlock(&mc->mu);
}


/* Whether failover is possible: several masters given, or one that has
 * shown an epoch (HA). */
static bool mc_ha(moonlet_master_client *mc)
{
    pthread_mutex_lock(&mc->mu);
    bool ha = mc->use_hello;
    pthread_mutex_unlock(&mc->mu);
    return ha;
}

uint64_t moonlet_mc_epoch(moonlet_master_client *mc)
{
    pthread_mutex_lock(&mc->mu);
    uint64_t e = mc->max_epoch;
    pthread_mutex_unlock(&mc->mu);
    return e;
}

bool moonlet_mc_is_ha(moonlet_master_client *mc)
{
    return mc_ha(mc);
}

/* Begins a request of `method` with the arguments of `st` (its args struct
 * in methods.h), packed from the method table: the required arguments and
 * the optional ones up to the last that is set, and at least min_nargs. */
static msgpack_packer *mc_begin_args_(moonlet_master_client *mc, uint32_t method, const void *st,
                                      size_t st_size, uint32_t min_nargs, int *rc)
{
    const moonlet_rpc_args_spec *spec = moonlet_master_method(method)->spec;
    if (st_size != spec->size) { /* the wrong args struct for the method: a bug here */
        *rc = MOONLET_ERR_INTERNAL_ERROR;
        return NULL;
    }
    uint32_t n = moonlet_rpc_args_count(spec, st);
    n = n < min_nargs ? min_nargs : n;
    msgpack_packer *pk = mc_begin(mc, method, n, rc);
    if (pk)
        moonlet_rpc_args_pack(spec, st, n, pk);
    return pk;
}

#define mc_begin_args(mc, method, st, min_nargs, rc)                                           \
    mc_begin_args_(mc, method, st, sizeof(*(st)), min_nargs, rc)

static bool unknown_method(const moonlet_reply *rep);

/* Reads a successful call's result into arg: 0 or RPC_FAIL (or INTERNAL_ERROR). */
typedef int (*mc_decode_fn)(const msgpack_object *result, void *arg);

/* One call: packs `st`, sends, waits, and on success decodes the result
 * with `decode` (NULL: the result carries nothing). */
static int mc_call_(moonlet_master_client *mc, uint32_t method, const void *st, size_t st_size,
                    uint32_t min_nargs, mc_decode_fn decode, void *arg)
{
    uint64_t deadline = moonlet_mono_ms() + (uint64_t)mc->timeout_ms;
    for (unsigned attempt = 0;; attempt++) {
        int rc;
        bool sent = false;
        if (mc_begin_args_(mc, method, st, st_size, min_nargs, &rc)) {
            if (mc_optional_method(method) && mc->no_batch_conn == mc->conns) {
                pthread_mutex_unlock(&mc->mu); /* the request begun is discarded by the next begin */
                return MOONLET_ERR_INVALID_VERSION;
            }
            moonlet_reply rep;
            bool have;
            sent = true;
            rc = mc_finish(mc, &rep, &have);
            if (rc == 0 && decode) {
                rc = decode(rep.result, arg);
            } else if (rc == MOONLET_ERR_INVALID_PARAMS && have && mc_optional_method(method) &&
                       unknown_method(&rep)) {
                mc->no_batch_conn = mc->conns;
                rc = MOONLET_ERR_INVALID_VERSION;
            }
            mc_end(mc, &rep, have);
        }
        /* Repeat only what no serving master did: NOT_LEADER (or a stale
         * epoch), or a request never sent because no master was reachable
         * - and only while a failover may still complete in the timeout. */
        bool again = rc == MOONLET_ERR_NOT_LEADER ||
                     (!sent && (rc == MOONLET_ERR_RPC_FAIL || rc == MOONLET_ERR_RPC_TIMEOUT) &&
                      mc_ha(mc));
        uint64_t now = moonlet_mono_ms();
        if (!again || now >= deadline || attempt >= 64)
            return rc;
        pthread_mutex_lock(&mc->mu);
        bool hint = mc->hint.port != 0;
        pthread_mutex_unlock(&mc->mu);
        if (!hint) /* an election in progress: give it a moment */
            poll(NULL, 0, (int)(deadline - now < 100 ? deadline - now : 100));
    }
}
#define mc_call(mc, method, st, min_nargs, decode, arg)                                        \
    mc_call_(mc, method, st, sizeof(*(st)), min_nargs, decode, arg)
#define mc_simple_call(mc, method, st, min_nargs) mc_call(mc, method, st, min_nargs, NULL, NULL)

int moonlet_mc_echo(moonlet_master_client *mc, const void *payload, size_t len)
{
    if (!payload)
        len = 0;
    int rc;
    msgpack_packer *pk = mc_begin(mc, MOONLET_M_ECHO, 1, &rc); /* Echo takes any arguments */
    if (!pk)
        return rc;
    msgpack_pack_bin(pk, (uint32_t)len);
    if (len)
        msgpack_pack_bin_body(pk, payload, len);
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    mc_end(mc, &rep, have);
    return rc;
}

/* Ping's result: {segments: n}. */
static int decode_ping(const msgpack_object *r, void *segments_out)
{
    const msgpack_object *v = moonlet_wire_map_get(r, "segments");
    if (!v || v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > UINT32_MAX)
        return MOONLET_ERR_RPC_FAIL;
    if (segments_out)
        *(uint32_t *)segments_out = (uint32_t)v->via.u64;
    return MOONLET_OK;
}

int moonlet_mc_ping_disk(moonlet_master_client *mc, const char *client_id, const uint64_t *disk,
                         uint32_t ndisk, uint32_t *segments_out)
{
    /* the clock sampled before the send: only makes the master's offset bound smaller */
    moonlet_args_ping a = {.client_id = mstr(client_id), .node_clock_ms = moonlet_mono_ms(),
                           .disk = {.v = disk, .n = disk ? ndisk : 0}};
    return mc_call(mc, MOONLET_M_PING, &a, disk ? 3 : 2, decode_ping, segments_out);
}

int moonlet_mc_ping(moonlet_master_client *mc, const char *client_id, uint32_t *segments_out)
{
    return moonlet_mc_ping_disk(mc, client_id, NULL, 0, segments_out);
}

int moonlet_mc_mount_segment(moonlet_master_client *mc, const moonlet_segment_desc *s)
{
    if ((s->alt_endpoint || s->disk) && !s->write_key)
        return MOONLET_ERR_INVALID_PARAMS; /* the trailing args come after the key */
    moonlet_args_mount a = {
        .client_id = s->client_id, .segment_id = s->segment_id,
        .name = s->name ? s->name : s->segment_id, .base = s->base, .size = s->size,
        .endpoint = s->endpoint, .protocol = s->protocol,
        .alt_endpoint = s->alt_endpoint, .alt_segment_id = s->alt_segment_id,
        .alt_protocol = s->alt_protocol, .disk = s->disk};
    if (s->write_key) {
        a.write_key = (moonlet_str){(const char *)s->write_key, 16};
        a.node_clock_ms = s->node_clock_ms ? s->node_clock_ms : moonlet_mono_ms();
    }
    return mc_simple_call(mc, MOONLET_M_MOUNT_SEGMENT, &a, 0);
}

int moonlet_mc_unmount_segment(moonlet_master_client *mc, const char *client_id,
                               const char *segment_id)
{
    moonlet_args_unmount a = {.client_id = mstr(client_id), .segment_id = mstr(segment_id)};
    return mc_simple_call(mc, MOONLET_M_UNMOUNT_SEGMENT, &a, 0);
}

int moonlet_mc_put_end(moonlet_master_client *mc, const char *tenant, const char *key)
{
    return moonlet_mc_put_end_checksum(mc, tenant, key, NULL);
}

int moonlet_mc_put_end_checksum(moonlet_master_client *mc, const char *tenant, const char *key,
                                const uint64_t *checksum)
{
    moonlet_args_put_end a = {.tenant = mstr0(tenant), .key = mstr(key),
                              .checksum = checksum ? *checksum : 0};
    return mc_simple_call(mc, MOONLET_M_PUT_END, &a, checksum ? 3 : 2); /* a 0 sum is a sum */
}

int moonlet_mc_put_revoke(moonlet_master_client *mc, const char *tenant, const char *key)
{
    moonlet_args_key a = {.tenant = mstr0(tenant), .key = mstr(key)};
    return mc_simple_call(mc, MOONLET_M_PUT_REVOKE, &a, 0);
}

int moonlet_mc_remove(moonlet_master_client *mc, const char *tenant, const char *key)
{
    return moonlet_mc_remove_ex(mc, tenant, key, false);
}

int moonlet_mc_remove_ex(moonlet_master_client *mc, const char *tenant, const char *key,
                         bool force)
{
    moonlet_args_remove a = {.tenant = mstr0(tenant), .key = mstr(key), .force = force};
    return mc_simple_call(mc, MOONLET_M_REMOVE, &a, 0);
}

/* ---- decoders ------------------------------------------------------------------ */

static char *dup_str(const msgpack_object *arr, uint32_t i)
{
    const char *p;
    uint32_t len;
    if (moonlet_wire_str(arr, i, &p, &len))
        return NULL;
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, p, len);
        s[len] = 0;
    }
    return s;
}

static int decode_replicas(const msgpack_object *arr, void *list)
{
    moonlet_replica_list *out = list;
    uint32_t n = moonlet_wire_len(arr);
    if (arr->type != MSGPACK_OBJECT_ARRAY)
        return MOONLET_ERR_RPC_FAIL;
    out->replicas = calloc(n ? n : 1, sizeof(*out->replicas));
    if (!out->replicas)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *r = moonlet_wire_at(arr, i);
        moonlet_replica_desc *d = &out->replicas[i];
        uint64_t status;
        out->count = i + 1;
        d->segment_id = dup_str(r, 0);
        d->endpoint = dup_str(r, 1);
        d->protocol = dup_str(r, 2);
        if (!d->segment_id || !d->endpoint || !d->protocol || moonlet_wire_u64(r, 3, &d->base) ||
            moonlet_wire_u64(r, 4, &d->offset) || moonlet_wire_u64(r, 5, &d->size) ||
            moonlet_wire_u64(r, 6, &status))
            return MOONLET_ERR_RPC_FAIL;
        d->status = (uint8_t)(status & ~(uint64_t)MOONLET_REPLICA_ON_DISK);
        d->disk = status & MOONLET_REPLICA_ON_DISK;
        /* PutStart: the write capability and the put's TTL (optional). */
        if (moonlet_wire_len(r) >= 11 &&
            (moonlet_wire_u64(r, 7, &d->cap_len) || moonlet_wire_u64(r, 8, &d->cap_expiry_ms) ||
             moonlet_wire_u64(r, 9, &d->cap_tag) || moonlet_wire_u64(r, 10, &out->put_ttl_ms)))
            return MOONLET_ERR_RPC_FAIL;
        /* A second endpoint of the same memory (optional). */
        if (moonlet_wire_len(r) >= 14) {
            d->alt_segment_id = dup_str(r, 11);
            d->alt_endpoint = dup_str(r, 12);
            d->alt_protocol = dup_str(r, 13);
            if (!d->alt_segment_id || !d->alt_endpoint || !d->alt_protocol)
                return MOONLET_ERR_RPC_FAIL;
        }
    }
    return MOONLET_OK;
}

int moonlet_mc_put_start_ex(moonlet_master_client *mc, const char *tenant, const char *key,
                            uint64_t size, uint32_t replica_num, bool soft_pin,
                            const moonlet_mc_put_extra *x, moonlet_replica_list *out)
{
    memset(out, 0, sizeof(*out));
    if (x && ((x->npreferred && !x->preferred) || x->npreferred > UINT32_MAX))
        return MOONLET_ERR_INVALID_PARAMS;
    /* the optional arguments go only when set, so a master that predates
     * them serves every other put */
    moonlet_args_put_start a = {.tenant = mstr0(tenant), .key = mstr(key), .size = size,
                                .replica_num = replica_num, .soft_pin = soft_pin};
    if (x) {
        a.preferred_segments = (moonlet_strv){NULL, x->preferred, (uint32_t)x->npreferred};
        a.hard_pin = x->hard_pin;
        a.soft_pin_ttl_ms = x->soft_pin_ttl_ms;
    }
    out->size = size;
    int rc = mc_call(mc, MOONLET_M_PUT_START, &a, 0, decode_replicas, out);
    if (rc)
        moonlet_replica_list_free(out);
    return rc;
}

int moonlet_mc_put_start(moonlet_master_client *mc, const char *tenant, const char *key,
                         uint64_t size, uint32_t replica_num, bool soft_pin,
                         moonlet_replica_list *out)
{
    return moonlet_mc_put_start_ex(mc, tenant, key, size, replica_num, soft_pin, NULL, out);
}

/* GetReplicaList's result: [size, lease_ttl_ms, [replica...], checksum or nil]. */
static int decode_replica_list(const msgpack_object *r, void *list)
{
    moonlet_replica_list *out = list;
    const msgpack_object *arr;
    if (moonlet_wire_u64(r, 0, &out->size) || moonlet_wire_u64(r, 1, &out->lease_ttl_ms) ||
        moonlet_wire_array(r, 2, &arr))
        return MOONLET_ERR_RPC_FAIL;
    int rc = decode_replicas(arr, out);
    const msgpack_object *ck = moonlet_wire_len(r) > 3 ? moonlet_wire_at(r, 3) : NULL;
    if (rc == 0 && ck && ck->type != MSGPACK_OBJECT_NIL) {
        if (moonlet_wire_u64(r, 3, &out->checksum))
            return MOONLET_ERR_RPC_FAIL;
        out->has_checksum = true;
    }
    return rc;
}

int moonlet_mc_get_replica_list(moonlet_master_client *mc, const char *tenant, const char *key,
                                moonlet_replica_list *out)
{
    memset(out, 0, sizeof(*out));
    moonlet_args_key a = {.tenant = mstr0(tenant), .key = mstr(key)};
    int rc = mc_call(mc, MOONLET_M_GET_REPLICA_LIST, &a, 0, decode_replica_list, out);
    if (rc)
        moonlet_replica_list_free(out);
    return rc;
}

static int decode_bool(const msgpack_object *o, void *out)
{
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return MOONLET_ERR_RPC_FAIL;
    *(bool *)out = o->via.boolean;
    return MOONLET_OK;
}

static int single_key_bool(moonlet_master_client *mc, uint32_t method, const char *tenant,
                           const char *key, bool *exists)
{
    moonlet_args_key a = {.tenant = mstr0(tenant), .key = mstr(key)};
    return mc_call(mc, method, &a, 0, decode_bool, exists);
}

int moonlet_mc_exist_key(moonlet_master_client *mc, const char *tenant, const char *key,
                         bool *exists)
{
    return single_key_bool(mc, MOONLET_M_EXIST_KEY, tenant, key, exists);
}

int moonlet_mc_probe_key(moonlet_master_client *mc, const char *tenant, const char *key,
                         bool *exists)
{
    return single_key_bool(mc, MOONLET_M_PROBE_KEY, tenant, key, exists);
}

/* A per-key result array: true/false/negative code. */
static int decode_results(const msgpack_object *arr, size_t n, int32_t *results)
{
    if (arr->type != MSGPACK_OBJECT_ARRAY || arr->via.array.size != n)
        return MOONLET_ERR_RPC_FAIL;
    for (size_t i = 0; i < n; i++) {
        const msgpack_object *o = &arr->via.array.ptr[i];
        if (o->type == MSGPACK_OBJECT_BOOLEAN)
            results[i] = o->via.boolean;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= INT32_MIN)
            results[i] = (int32_t)o->via.i64;
        else
            return MOONLET_ERR_RPC_FAIL;
    }
    return MOONLET_OK;
}

static moonlet_strv mstrv(const char *const *keys, size_t n)
{
    return (moonlet_strv){NULL, keys, (uint32_t)n};
}

/* Per-key results of a batch call. */
typedef struct mc_results {
    size_t n;
    int32_t *r;
} mc_results;

static int decode_batch(const msgpack_object *arr, void *arg)
{
    mc_results *res = arg;
    return decode_results(arr, res->n, res->r);
}

int moonlet_mc_batch_exist_key(moonlet_master_client *mc, const char *tenant,
                               const char *const *keys, size_t n, int32_t *results)
{
    if (n > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_args_batch_exist a = {.tenant = mstr0(tenant), .keys = mstrv(keys, n)};
    mc_results res = {n, results};
    return mc_call(mc, MOONLET_M_BATCH_EXIST_KEY, &a, 0, decode_batch, &res);
}

int moonlet_mc_batch_probe_key(moonlet_master_client *mc, const char *tenant,
                               moonlet_grant_lease_policy policy, const char *const *keys,
                               size_t n, int32_t *results)
{
    if (n > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_args_batch_probe a = {.tenant = mstr0(tenant), .lease_mode = policy.lease_mode,
                                  .candidate_size = policy.candidate_size,
                                  .keys = mstrv(keys, n)};
    mc_results res = {n, results};
    return mc_call(mc, MOONLET_M_BATCH_PROBE_KEY, &a, 0, decode_batch, &res);
}

/* ---- batches of the put and get calls ------------------------------------------ */

/* Key i's entry of a batch reply: a negative code, or its result decoded by
 * `one` into *item.  RPC_FAIL for anything else. */
static int decode_entry(const msgpack_object *e, int32_t *result,
                        int (*one)(const msgpack_object *, void *), void *item)
{
    if (e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && e->via.i64 >= INT32_MIN) {
        *result = (int32_t)e->via.i64;
        return MOONLET_OK;
    }
    if (e->type != MSGPACK_OBJECT_ARRAY)
        return MOONLET_ERR_RPC_FAIL;
    *result = MOONLET_OK;
    return one(e, item);
}

/* A batch's replica lists and per-key results, as decoded. */
typedef struct mc_batch_lists {
    size_t n;
    const uint64_t *sizes; /* BatchPutStart: each put's size (the reply does not repeat it) */
    bool with_meta;        /* BatchGetReplicaList: [size, lease_ttl_ms, [replica...], checksum] */
    moonlet_replica_list *lists;
    uint64_t *put_ids;     /* BatchPutStart (may be NULL): each put's id */
    int32_t *results;
} mc_batch_lists;

static int decode_replica_list(const msgpack_object *r, void *list);

/* A BatchPutStart entry's [put_id, [replica...]] (into b's lists / put_ids). */
struct mc_put_item {
    moonlet_replica_list *list;
    uint64_t *put_id;
};

static int decode_put_entry(const msgpack_object *e, void *arg)
{
    struct mc_put_item *it = arg;
    const msgpack_object *reps;
    uint64_t id;
    if (moonlet_wire_len(e) != 2 || moonlet_wire_u64(e, 0, &id) || moonlet_wire_array(e, 1, &reps))
        return MOONLET_ERR_RPC_FAIL;
    if (it->put_id)
        *it->put_id = id;
    return decode_replicas(reps, it->list);
}

static int decode_batch_lists(const msgpack_object *arr, void *arg)
{
    mc_batch_lists *b = arg;
    if (arr->type != MSGPACK_OBJECT_ARRAY || arr->via.array.size != b->n)
        return MOONLET_ERR_RPC_FAIL;
    for (size_t i = 0; i < b->n; i++) {
        struct mc_put_item put = {&b->lists[i], b->put_ids ? &b->put_ids[i] : NULL};
        if (b->sizes)
            b->lists[i].size = b->sizes[i];
        if (b->put_ids)
            b->put_ids[i] = 0;
        int rc = b->with_meta
                     ? decode_entry(&arr->via.array.ptr[i], &b->results[i], decode_replica_list,
                                    &b->lists[i])
                     : decode_entry(&arr->via.array.ptr[i], &b->results[i], decode_put_entry, &put);
        if (rc) { /* a malformed reply: nothing of it is kept */
            for (size_t k = 0; k <= i; k++)
                moonlet_replica_list_free(&b->lists[k]);
            return rc;
        }
    }
    return MOONLET_OK;
}

/* Per-key codes: 0 or negative. */
static int decode_codes(const msgpack_object *arr, void *arg)
{
    mc_results *res = arg;
    if (arr->type != MSGPACK_OBJECT_ARRAY || arr->via.array.size != res->n)
        return MOONLET_ERR_RPC_FAIL;
    for (size_t i = 0; i < res->n; i++) {
        const msgpack_object *o = &arr->via.array.ptr[i];
        if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 == 0)
            res->r[i] = MOONLET_OK;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER && o->via.i64 >= INT32_MIN)
            res->r[i] = (int32_t)o->via.i64;
        else
            return MOONLET_ERR_RPC_FAIL;
    }
    return MOONLET_OK;
}

int moonlet_mc_batch_put_start(moonlet_master_client *mc, const char *tenant,
                               const char *const *keys, const uint64_t *sizes, size_t n,
                               uint32_t replica_num, bool soft_pin, const moonlet_mc_put_extra *x,
                               moonlet_replica_list *lists, uint64_t *put_ids, int32_t *results)
{
    if (n && (!keys || !sizes || !lists || !results))
        return MOONLET_ERR_INVALID_PARAMS;
    memset(lists, 0, n * sizeof(*lists));
    if (n > UINT32_MAX || (x && ((x->npreferred && !x->preferred) || x->npreferred > UINT32_MAX)))
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_args_batch_put_start a = {.tenant = mstr0(tenant), .keys = mstrv(keys, n),
                                      .sizes = {sizes, (uint32_t)n}, .replica_num = replica_num,
                                      .soft_pin = soft_pin};
    if (x) {
        a.preferred_segments = (moonlet_strv){NULL, x->preferred, (uint32_t)x->npreferred};
        a.hard_pin = x->hard_pin;
        a.soft_pin_ttl_ms = x->soft_pin_ttl_ms;
    }
    mc_batch_lists b = {.n = n, .sizes = sizes, .lists = lists, .put_ids = put_ids,
                        .results = results};
    return mc_call(mc, MOONLET_M_BATCH_PUT_START, &a, 0, decode_batch_lists, &b);
}

int moonlet_mc_batch_put_end(moonlet_master_client *mc, const char *tenant,
                             const char *const *keys, const uint64_t *checksums,
                             const uint64_t *put_ids, size_t n, int32_t *results)
{
    if ((n && (!keys || !results)) || n > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_args_batch_put_end a = {.tenant = mstr0(tenant), .keys = mstrv(keys, n),
                                    .checksums = {checksums, checksums ? (uint32_t)n : 0},
                                    .put_ids = {put_ids, put_ids ? (uint32_t)n : 0}};
    mc_results res = {n, results};
    /* with checksums or put ids: those arguments, even for an empty batch */
    return mc_call(mc, MOONLET_M_BATCH_PUT_END, &a, put_ids ? 4 : checksums ? 3 : 0, decode_codes,
                   &res);
}

int moonlet_mc_batch_put_revoke(moonlet_master_client *mc, const char *tenant,
                                const char *const *keys, const uint64_t *put_ids, size_t n,
                                int32_t *results)
{
    if ((n && (!keys || !results)) || n > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_args_batch_put_revoke a = {.tenant = mstr0(tenant), .keys = mstrv(keys, n),
                                       .put_ids = {put_ids, put_ids ? (uint32_t)n : 0}};
    mc_results res = {n, results};
    return mc_call(mc, MOONLET_M_BATCH_PUT_REVOKE, &a, put_ids ? 3 : 0, decode_codes, &res);
}

int moonlet_mc_batch_get_replica_list(moonlet_master_client *mc, const char *tenant,
                                      const char *const *keys, size_t n,
                                      moonlet_replica_list *lists, int32_t *results)
{
    if (n && (!keys || !lists || !results))
        return MOONLET_ERR_INVALID_PARAMS;
    memset(lists, 0, n * sizeof(*lists));
    if (n > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_args_batch_exist a = {.tenant = mstr0(tenant), .keys = mstrv(keys, n)};
    mc_batch_lists b = {.n = n, .with_meta = true, .lists = lists, .results = results};
    return mc_call(mc, MOONLET_M_BATCH_GET_REPLICA_LIST, &a, 0, decode_batch_lists, &b);
}

/* True when a refused call's message says the master does not know the method. */
static bool unknown_method(const moonlet_reply *rep)
{
    static const char prefix[] = "unknown method";
    const msgpack_object *o = rep->result;
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size >= sizeof(prefix) - 1 &&
           memcmp(o->via.str.ptr, prefix, sizeof(prefix) - 1) == 0;
}

int moonlet_mc_put_replace_replica(moonlet_master_client *mc, const char *tenant, const char *key,
                                   const char *segment_id, const char *const *excluded,
                                   size_t nexcluded, moonlet_replica_list *out)
{
    memset(out, 0, sizeof(*out));
    if (!segment_id || (nexcluded && !excluded) || nexcluded > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_args_put_replace a = {.tenant = mstr0(tenant), .key = mstr(key),
                                  .segment_id = mstr(segment_id),
                                  .excluded_segments = mstrv(excluded, nexcluded)};
    int rc;
    if (!mc_begin_args(mc, MOONLET_M_PUT_REPLACE_REPLICA, &a, 0, &rc))
        return rc;
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    if (rc == 0)
        rc = decode_replicas(rep.result, out);
    else if (rc == MOONLET_ERR_INVALID_PARAMS && have && unknown_method(&rep))
        rc = MOONLET_ERR_INVALID_VERSION;
    mc_end(mc, &rep, have);
    if (rc == 0 && out->count != 1)
        rc = MOONLET_ERR_RPC_FAIL;
    if (rc)
        moonlet_replica_list_free(out);
    return rc;
}

static int decode_resume(const msgpack_object *r, size_t n_kda, moonlet_mc_resume_out *out,
                         int32_t *mask)
{
    if (r->type != MSGPACK_OBJECT_ARRAY || r->via.array.size != 3)
        return MOONLET_ERR_RPC_FAIL;
    const msgpack_object *v = r->via.array.ptr;
    if (v[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return MOONLET_ERR_RPC_FAIL;
    out->kv_prefix = v[0].via.u64;
    if (v[1].type == MSGPACK_OBJECT_NEGATIVE_INTEGER && v[1].via.i64 == -1)
        out->selected = -1;
    else if (v[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER && v[1].via.u64 <= INT64_MAX)
        out->selected = (int64_t)v[1].via.u64;
    else
        return MOONLET_ERR_RPC_FAIL;
    /* the mask: a bin of one byte (0 / 1) per KDA key */
    if (v[2].type != MSGPACK_OBJECT_BIN || v[2].via.bin.size != n_kda)
        return MOONLET_ERR_RPC_FAIL;
    for (size_t i = 0; i < n_kda; i++) {
        unsigned char b = (unsigned char)v[2].via.bin.ptr[i];
        if (b > 1)
            return MOONLET_ERR_RPC_FAIL;
        mask[i] = b;
    }
    return MOONLET_OK;
}

int moonlet_mc_probe_resume(moonlet_master_client *mc, const char *tenant,
                            const char *const *kv, size_t n_kv, const char *const *kda,
                            size_t n_kda, uint64_t candidate_size, const uint64_t *boundaries,
                            size_t n_boundaries, moonlet_mc_resume_out *out, int32_t *mask)
{
    if (!out || (n_kv && !kv) || (n_kda && (!kda || !mask)) || (n_boundaries && !boundaries) ||
        n_kv > UINT32_MAX || n_kda > UINT32_MAX || n_boundaries > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    int rc;
    moonlet_args_probe_resume a = {.tenant = mstr0(tenant), .kv_keys = mstrv(kv, n_kv),
                                   .candidate_size = candidate_size,
                                   .kda_keys = mstrv(kda, n_kda),
                                   .boundaries = {boundaries, (uint32_t)n_boundaries}};
    if (!mc_begin_args(mc, MOONLET_M_PROBE_RESUME, &a, 0, &rc))
        return rc;
    if (mc->no_resume_conn == mc->conns) { /* this master said it lacks the method; the
                                            * request begun is discarded by the next begin */
        pthread_mutex_unlock(&mc->mu);
        return MOONLET_ERR_INVALID_VERSION;
    }
    moonlet_reply rep;
    bool have;
    rc = mc_finish(mc, &rep, &have);
    if (rc == 0) {
        rc = decode_resume(rep.result, n_kda, out, mask);
    } else if (rc == MOONLET_ERR_INVALID_PARAMS && have && unknown_method(&rep)) {
        mc->no_resume_conn = mc->conns;
        rc = MOONLET_ERR_INVALID_VERSION;
    }
    mc_end(mc, &rep, have);
    return rc;
}

static int decode_u64(const msgpack_object *o, void *out)
{
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return MOONLET_ERR_RPC_FAIL;
    *(uint64_t *)out = o->via.u64;
    return MOONLET_OK;
}

int moonlet_mc_remove_all(moonlet_master_client *mc, const char *tenant, uint64_t *removed)
{
    return moonlet_mc_remove_all_ex(mc, tenant, false, removed);
}

int moonlet_mc_remove_all_ex(moonlet_master_client *mc, const char *tenant, bool force,
                             uint64_t *removed)
{
    moonlet_args_remove_all a = {.tenant = mstr0(tenant), .force = force};
    return mc_call(mc, MOONLET_M_REMOVE_ALL, &a, 0, decode_u64, removed);
}

/* ---- admin calls: results as cJSON ---------------------------------------------- */

static cJSON *to_json(const msgpack_object *o, int depth)
{
    if (depth > 32)
        return cJSON_CreateNull();
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return cJSON_CreateNull();
    case MSGPACK_OBJECT_BOOLEAN:
        return cJSON_CreateBool(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return cJSON_CreateNumber((double)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return cJSON_CreateNumber((double)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return cJSON_CreateNumber(o->via.f64);
    case MSGPACK_OBJECT_STR:
    case MSGPACK_OBJECT_BIN: {
        uint32_t len = o->type == MSGPACK_OBJECT_STR ? o->via.str.size : o->via.bin.size;
        const char *p = o->type == MSGPACK_OBJECT_STR ? o->via.str.ptr : o->via.bin.ptr;
        char *s = malloc(len + 1);
        if (!s)
            return NULL;
        memcpy(s, p, len);
        s[len] = 0;
        cJSON *j = cJSON_CreateString(s);
        free(s);
        return j;
    }
    case MSGPACK_OBJECT_ARRAY: {
        cJSON *a = cJSON_CreateArray();
        for (uint32_t i = 0; a && i < o->via.array.size; i++)
            cJSON_AddItemToArray(a, to_json(&o->via.array.ptr[i], depth + 1));
        return a;
    }
    case MSGPACK_OBJECT_MAP: {
        cJSON *m = cJSON_CreateObject();
        for (uint32_t i = 0; m && i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR)
                continue;
            char key[128];
            uint32_t kl = kv->key.via.str.size < sizeof(key) - 1 ? kv->key.via.str.size : sizeof(key) - 1;
            memcpy(key, kv->key.via.str.ptr, kl);
            key[kl] = 0;
            cJSON_AddItemToObject(m, key, to_json(&kv->val, depth + 1));
        }
        return m;
    }
    default:
        return cJSON_CreateNull();
    }
}

/* An admin call's result as cJSON. */
static int decode_json(const msgpack_object *r, void *out)
{
    return (*(cJSON **)out = to_json(r, 0)) ? MOONLET_OK : MOONLET_ERR_INTERNAL_ERROR;
}

int moonlet_mc_list_segments(moonlet_master_client *mc, struct cJSON **out)
{
    moonlet_args_list_segments a = {0};
    return mc_call(mc, MOONLET_M_LIST_SEGMENTS, &a, 0, decode_json, out);
}

int moonlet_mc_list_segments_page(moonlet_master_client *mc, uint64_t cursor, uint32_t limit,
                                  const char *client_id, struct cJSON **out)
{
    moonlet_args_list_segments a = {.cursor = cursor, .limit = limit,
                                    .client_id = client_id ? client_id : ""};
    return mc_call(mc, MOONLET_M_LIST_SEGMENTS, &a, 3, decode_json, out);
}

int moonlet_mc_list_keys(moonlet_master_client *mc, const char *tenant, const char *prefix,
                         const char *cursor, uint32_t limit, struct cJSON **out)
{
    moonlet_args_list_keys a = {.tenant = mstr0(tenant), .prefix = mstr0(prefix),
                                .cursor = mstr0(cursor), .limit = limit};
    return mc_call(mc, MOONLET_M_LIST_KEYS, &a, 0, decode_json, out);
}

int moonlet_mc_list_tenants(moonlet_master_client *mc, uint32_t limit, struct cJSON **out)
{
    moonlet_args_list_tenants a = {.limit = limit};
    return mc_call(mc, MOONLET_M_LIST_TENANTS, &a, 1, decode_json, out);
}

int moonlet_mc_inspect_key(moonlet_master_client *mc, const char *tenant, const char *key,
                           struct cJSON **out)
{
    moonlet_args_key a = {.tenant = mstr0(tenant), .key = mstr(key)};
    return mc_call(mc, MOONLET_M_INSPECT_KEY, &a, 0, decode_json, out);
}

double moonlet_mc_inspect_number(moonlet_master_client *mc, const char *tenant, const char *key,
                                 const char *field)
{
    cJSON *j = NULL;
    if (moonlet_mc_inspect_key(mc, tenant, key, &j) != 0)
        return -1;
    const cJSON *f = cJSON_GetObjectItem(j, field);
    double v = cJSON_IsNumber(f) ? f->valuedouble : -1;
    cJSON_Delete(j);
    return v;
}

int moonlet_mc_stats(moonlet_master_client *mc, struct cJSON **out)
{
    moonlet_args_none a = {0};
    return mc_call(mc, MOONLET_M_STATS, &a, 0, decode_json, out);
}

/* ---- re-replication ------------------------------------------------------------ */

void moonlet_mc_repair_jobs_free(moonlet_mc_repair_job *jobs, uint32_t n)
{
    for (uint32_t i = 0; jobs && i < n; i++) {
        moonlet_replica_list_free(&jobs[i].target);
        moonlet_replica_list_free(&jobs[i].sources);
        free(jobs[i].tenant);
        free(jobs[i].key);
    }
    free(jobs);
}

struct repair_jobs_out {
    moonlet_mc_repair_job *jobs;
    uint32_t n;
};

/* [[job_id, size, checksum or nil, target, [source...]]...] */
static int decode_repair_jobs(const msgpack_object *r, void *arg)
{
    struct repair_jobs_out *o = arg;
    if (r->type != MSGPACK_OBJECT_ARRAY)
        return MOONLET_ERR_RPC_FAIL;
    uint32_t n = moonlet_wire_len(r);
    if (n == 0)
        return MOONLET_OK;
    o->jobs = calloc(n, sizeof(*o->jobs));
    if (!o->jobs)
        return MOONLET_ERR_INTERNAL_ERROR;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *j = moonlet_wire_at(r, i);
        moonlet_mc_repair_job *d = &o->jobs[i];
        o->n = i + 1;
        const msgpack_object *target, *sources, *ck;
        if (!j || j->type != MSGPACK_OBJECT_ARRAY || moonlet_wire_len(j) < 5 ||
            moonlet_wire_u64(j, 0, &d->job_id) || moonlet_wire_u64(j, 1, &d->size) ||
            moonlet_wire_array(j, 3, &target) || moonlet_wire_array(j, 4, &sources))
            return MOONLET_ERR_RPC_FAIL;
        ck = moonlet_wire_at(j, 2);
        if (ck->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
            d->has_checksum = true;
            d->checksum = ck->via.u64;
        } else if (ck->type != MSGPACK_OBJECT_NIL) {
            return MOONLET_ERR_RPC_FAIL;
        }
        /* the target is one descriptor: decode it as a list of one */
        msgpack_object one = {.type = MSGPACK_OBJECT_ARRAY,
                              .via.array = {.size = 1, .ptr = (msgpack_object *)target}};
        int rc = decode_replicas(&one, &d->target);
        if (rc == MOONLET_OK)
            rc = decode_replicas(sources, &d->sources);
        if (rc)
            return rc;
        d->target.size = d->sources.size = d->size;
        /* A demotion: [..., true, tenant, key] (the disk header's). */
        if (moonlet_wire_len(j) >= 8) {
            const msgpack_object *dm = moonlet_wire_at(j, 5);
            d->demote = dm->type == MSGPACK_OBJECT_BOOLEAN && dm->via.boolean;
            d->tenant = dup_str(j, 6);
            d->key = dup_str(j, 7);
            if (!d->demote || !d->tenant || !d->key)
                return MOONLET_ERR_RPC_FAIL;
        }
    }
    return MOONLET_OK;
}

int moonlet_mc_repair_fetch(moonlet_master_client *mc, const char *client_id, uint32_t max,
                            moonlet_mc_repair_job **jobs, uint32_t *n)
{
    *jobs = NULL;
    *n = 0;
    moonlet_args_repair_fetch a = {.client_id = mstr(client_id), .max_jobs = max};
    struct repair_jobs_out o = {NULL, 0};
    int rc = mc_call(mc, MOONLET_M_REPAIR_FETCH, &a, 0, decode_repair_jobs, &o);
    if (rc) {
        moonlet_mc_repair_jobs_free(o.jobs, o.n);
        return rc;
    }
    *jobs = o.jobs;
    *n = o.n;
    return MOONLET_OK;
}

int moonlet_mc_repair_done(moonlet_master_client *mc, const char *client_id, uint64_t job_id,
                           int code, uint64_t bytes)
{
    moonlet_args_repair_done a = {.client_id = mstr(client_id), .job_id = job_id,
                                  .error = code < 0 ? (uint64_t)-(int64_t)code : (uint64_t)code,
                                  .bytes = bytes};
    return mc_simple_call(mc, MOONLET_M_REPAIR_DONE, &a, 0);
}

int moonlet_mc_disk_announce(moonlet_master_client *mc, const char *client_id,
                             const char *segment_id, const char *const *tenants,
                             const char *const *keys, const uint64_t *sizes,
                             const uint64_t *checksums, const uint64_t *offsets, size_t n,
                             int32_t *results)
{
    if ((n && (!tenants || !keys || !sizes || !checksums || !offsets || !results)) ||
        n > UINT32_MAX)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_args_disk_announce a = {.client_id = mstr(client_id), .segment_id = mstr(segment_id),
                                    .tenants = mstrv(tenants, n), .keys = mstrv(keys, n),
                                    .sizes = {sizes, (uint32_t)n},
                                    .checksums = {checksums, (uint32_t)n},
                                    .offsets = {offsets, (uint32_t)n}};
    mc_results res = {n, results};
    return mc_call(mc, MOONLET_M_DISK_ANNOUNCE, &a, 7, decode_codes, &res);
}

struct trims_out {
    uint64_t *off, *len;
    uint32_t n, cap;
};

/* [[offset, length]...], at most cap */
static int decode_trims(const msgpack_object *r, void *arg)
{
    struct trims_out *o = arg;
    if (r->type != MSGPACK_OBJECT_ARRAY || moonlet_wire_len(r) > o->cap)
        return MOONLET_ERR_RPC_FAIL;
    for (uint32_t i = 0; i < moonlet_wire_len(r); i++) {
        const msgpack_object *t = moonlet_wire_at(r, i);
        if (!t || t->type != MSGPACK_OBJECT_ARRAY || moonlet_wire_u64(t, 0, &o->off[i]) ||
            moonlet_wire_u64(t, 1, &o->len[i]))
            return MOONLET_ERR_RPC_FAIL;
        o->n = i + 1;
    }
    return MOONLET_OK;
}

int moonlet_mc_disk_trim(moonlet_master_client *mc, const char *client_id,
                         const char *segment_id, const uint64_t *done, size_t ndone,
                         uint64_t *offsets, uint64_t *lens, uint32_t max, uint32_t *n)
{
    *n = 0;
    if ((ndone && !done) || ndone > UINT32_MAX || max == 0 || max > 4096 || !offsets || !lens)
        return MOONLET_ERR_INVALID_PARAMS;
    moonlet_args_disk_trim a = {.client_id = mstr(client_id), .segment_id = mstr(segment_id),
                                .done = {done, (uint32_t)ndone}, .max = max};
    struct trims_out o = {offsets, lens, 0, max};
    int rc = mc_call(mc, MOONLET_M_DISK_TRIM, &a, 4, decode_trims, &o);
    *n = o.n;
    return rc;
}

int moonlet_mc_drain(moonlet_master_client *mc, const char *target, bool on, uint32_t *segments)
{
    moonlet_args_drain a = {.target = mstr(target)};
    uint32_t segs = 0;
    int rc = mc_call(mc, on ? MOONLET_M_DRAIN : MOONLET_M_UNDRAIN, &a, 0, decode_ping, &segs);
    if (segments)
        *segments = segs;
    return rc;
}

int moonlet_mc_hello_at(const char *addr, const moonlet_master_client_opts *opts,
                        struct cJSON **out)
{
    char host[256];
    uint16_t port;
    int rc = parse_addr(addr, host, sizeof(host), &port);
    if (rc)
        return rc;
    const char *tok = opts && opts->auth_token && opts->auth_token[0] ? opts->auth_token : NULL;
    moonlet_rpc_client_opts o = {.timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms
                                                                              : 10000,
                                 .auth_token = tok, .auth_token_len = tok ? strlen(tok) : 0,
                                 .tls = opts ? opts->tls : NULL};
    moonlet_rpc_client *c;
    rc = moonlet_rpc_client_connect(host, port, &o, &c);
    if (rc)
        return rc;
    moonlet_rpc_client_begin(c, MOONLET_M_HELLO, 0);
    moonlet_reply rep;
    rc = moonlet_rpc_client_call(c, &rep);
    if (!rc) {
        rc = rep.code ? rep.code : decode_json(rep.result, out);
        moonlet_reply_destroy(&rep);
    }
    moonlet_rpc_client_close(c);
    return rc;
}
