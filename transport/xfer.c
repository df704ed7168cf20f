/*
 * xfer.c - the backend-independent half of the data-plane transport (xfer.h).
 *
 * It picks the backend (auto: verbs when an ACTIVE RDMA device exists, else
 * TCP), keeps the options, the local-buffer registry and a pool of cached
 * connections per peer endpoint, and turns a batch into "lanes": operations
 * are validated, grouped by peer, and spread by bytes over as many leased
 * connections of that peer as help.  The backend then runs all lanes at once,
 * so one batch moves data over several connections and peers in parallel
 * from the calling thread.  The only helper threads are short-lived: when a
 * batch spans several peers, each peer that needs a new connection opens it
 * and runs its lanes on its own thread, so N unreachable peers cost one
 * timeout and never delay the others (xfer_pass).
 *
 * Connections are leased exclusively for one batch; a lane the backend marks
 * broken, or a cached connection the backend reports dead (conn_stale), is
 * closed and its slot reopened on the next use.  The pool holds at most
 * max_pooled_conns connections over all peers: opening one more (or giving
 * one back while more are open) closes the least recently released idle
 * connections - never a leased one - and a peer entry left with no
 * connection and no batch using it is freed, so a client that talked to
 * thousands of nodes keeps no more than the cap.  Victims are chosen under
 * pool_lock and closed after it is dropped.  Peers are leased
 * in endpoint order, so two batches can never wait on each other in a cycle;
 * every wait is bounded by timeout_ms anyway.
 *
 * One timeout per batch, queueing included.  The wait for a pooled
 * connection, opening it and the transfer's silence on it all count from
 * the batch's submit: a connection freed just before the deadline is
 * opened no later than the deadline (conn_open's deadline_ms) and its lane
 * counts silence from the submit (xfer_lane.since_ms).  So a read queued
 * behind others on a node that stopped answering gives up one timeout
 * after its submit, and a get tries its next replica then, not after two.
 *
 * Reissue.  An operation the backend failed only because its connection
 * did (xfer_item.conn_failed: closed or reset by the peer, EOF, a verbs CM
 * disconnect) is reissued once, on one freshly leased (and if need be
 * reopened) connection to that peer, when the batch's deadline (timeout_ms
 * from submit) and, for a write, its writer's deadline have not passed.
 * Errors about the request itself are never reissued.
 *
 * Writer deadlines (moonlet_xfer_cap.deadline_ms) are enforced here for both
 * backends: a write is not started once its deadline passed, neither before
 * leasing its connection nor after (the TCP backend also aborts a lane whose
 * deadline passes mid-transfer; verbs writes already posted are covered by
 * the master's quarantine grace).
 *
 * Locks: pool_lock (mutex + pool_cond) guards the peer list, each peer's
 * refs, slot busy flags and LRU stamps, and the pooled-connection count (a
 * leased slot's conn is written by its leasing thread alone, an idle one
 * only under pool_lock);
 * buf_lock (rwlock) guards the buffer list.  Neither is held across a backend
 * call that can block, and they are never nested.
 */
#include "xfer_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cred.h"
#include "log.h"
#include "moonlet/error.h"
#include "monotime.h"
#include "sync.h"
#include "thread.h"

#define MOD "xfer"

typedef struct xfer_buffer {
    void *base;
    size_t len;
    void *handle; /* backend registration (verbs MR), NULL for TCP */
    uint32_t lkey;
    LIST_ENTRY(xfer_buffer) link; /* in moonlet_xfer.bufs */
} xfer_buffer;

typedef struct xfer_slot {
    void *conn; /* NULL until opened (or after a broken lane or an eviction) */
    bool busy;
    uint64_t last_used; /* x->pool_tick at its last release: the LRU order */
} xfer_slot;

typedef struct xfer_peer {
    char *endpoint;
    xfer_slot *slots; /* conns_per_peer of them */
    unsigned refs;    /* batches leasing or waiting for its slots */
    struct xfer_peer *next;
} xfer_peer;

/* Connections one open or release may evict at most (bounded work; each
 * open adds one connection, so one eviction per open keeps the cap). */
#define XFER_EVICT_MAX 8

/* One peer's share of a batch while it runs. */
typedef struct xfer_group {
    const char *endpoint;
    xfer_item **items;
    size_t nitems;
    uint64_t bytes;
    xfer_peer *peer;
    size_t *slot_idx;  /* leased slots */
    size_t nslots;
    size_t first_lane; /* index of its first lane in the batch's lane array */
    size_t nlanes;
} xfer_group;

/* ---- small helpers shared with the backends ---------------------------- */

uint64_t moonlet_xfer_now_ms(void)
{
    return moonlet_mono_ms();
}

uint64_t moonlet_xfer_random_id(void)
{
    uint64_t v = 0;
    while (v == 0) {
        if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            v = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)&ts;
        }
    }
    return v;
}

int moonlet_xfer_format_endpoint(const void *sockaddr, char *buf, size_t cap)
{
    const struct sockaddr *sa = sockaddr;
    char ip[256], host[256];
    unsigned port;
    bool any;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = sockaddr;
        inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
        port = ntohs(in->sin_port);
        any = in->sin_addr.s_addr == htonl(INADDR_ANY);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = sockaddr;
        ip[0] = '[';
        inet_ntop(AF_INET6, &in6->sin6_addr, ip + 1, sizeof(ip) - 2);
        strcat(ip, "]");
        port = ntohs(in6->sin6_port);
        any = IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr);
    } else {
        return MOONLET_ERR_INVALID_PARAMS;
    }
    /* A wildcard bind is advertised under the host name peers resolve. */
    if (any && gethostname(host, sizeof(host)) == 0) {
        host[sizeof(host) - 1] = '\0';
        memcpy(ip, host, sizeof(ip));
    }
    int n = snprintf(buf, cap, "%s:%u", ip, port);
    return n < 0 || (size_t)n >= cap ? MOONLET_ERR_BUFFER_OVERFLOW : MOONLET_OK;
}

int moonlet_xfer_parse_protocol(const char *name, moonlet_xfer_protocol *out)
{
    if (!name || !out)
        return MOONLET_ERR_INVALID_PARAMS;
    if (strcmp(name, "tcp") == 0)
        *out = MOONLET_XFER_TCP;
    else if (strcmp(name, "rdma") == 0)
        *out = MOONLET_XFER_RDMA;
    else if (strcmp(name, "auto") == 0)
        *out = MOONLET_XFER_AUTO;
    else
        return MOONLET_ERR_INVALID_PARAMS;
    return MOONLET_OK;
}

/* ---- create / destroy --------------------------------------------------- */

static const xfer_backend *xfer_choose_backend(const moonlet_xfer_opts *o)
{
    if (o->protocol == MOONLET_XFER_TCP)
        return &moonlet_xfer_tcp_backend;
    if (o->protocol == MOONLET_XFER_RDMA)
        return &moonlet_xfer_verbs_backend;
    char why[256];
    if (moonlet_xfer_verbs_probe(o->device, o->listen_addr, why, sizeof(why)) == MOONLET_OK) {
        ML_INFO(MOD, "transport: RDMA device available, using verbs");
        return &moonlet_xfer_verbs_backend;
    }
    ML_INFO(MOD, "transport: %s, using TCP", why);
    return &moonlet_xfer_tcp_backend;
}

static char *xfer_strdup_opt(const char *s, bool *oom)
{
    if (!s || !*s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = true;
    return d;
}

static void xfer_free_opts(moonlet_xfer *x)
{
    free(x->device);
    free(x->listen_addr);
    free(x->source_addr);
    if (x->token) {
        explicit_bzero(x->token, x->token_len);
        free(x->token);
    }
    explicit_bzero(x->auth_key, sizeof(x->auth_key));
    if (x->auth_keys) {
        explicit_bzero(x->auth_keys, x->nauth_keys * sizeof(*x->auth_keys));
        free(x->auth_keys);
    }
}

static int xfer_copy_opts(moonlet_xfer *x, const moonlet_xfer_opts *o)
{
    bool oom = false;
    if (o->auth_token && strlen(o->auth_token) > MOONLET_XFER_MAX_TOKEN_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    if (o->protocol != MOONLET_XFER_AUTO && o->protocol != MOONLET_XFER_TCP &&
        o->protocol != MOONLET_XFER_RDMA)
        return MOONLET_ERR_INVALID_PARAMS;
    x->device = xfer_strdup_opt(o->device, &oom);
    x->listen_addr = xfer_strdup_opt(o->listen_addr, &oom);
    x->source_addr = xfer_strdup_opt(o->source_addr, &oom);
    if (o->rdma_tos < 0 || o->rdma_tos > 255)
        return MOONLET_ERR_INVALID_PARAMS;
    x->rdma_tos = o->rdma_tos;
    x->token = xfer_strdup_opt(o->auth_token, &oom);
    x->token_len = x->token ? strlen(x->token) : 0;
    if (x->token)
        moonlet_cred_key(x->token, x->token_len, x->auth_key);
    if (o->nauth_keys && o->auth_keys) {
        if (!x->token)
            return MOONLET_ERR_INVALID_PARAMS; /* keys without a token of its own */
        x->auth_keys = malloc(o->nauth_keys * sizeof(*x->auth_keys));
        if (!x->auth_keys)
            return MOONLET_ERR_INTERNAL_ERROR;
        memcpy(x->auth_keys, o->auth_keys, o->nauth_keys * sizeof(*x->auth_keys));
        x->nauth_keys = o->nauth_keys;
    }
    x->conns_per_peer = o->conns_per_peer > 0 ? o->conns_per_peer
                                              : MOONLET_XFER_DEFAULT_CONNS_PER_PEER;
    x->server_threads = o->server_threads > 0 ? o->server_threads
                                              : MOONLET_XFER_DEFAULT_SERVER_THREADS;
    x->timeout_ms = o->timeout_ms ? o->timeout_ms : MOONLET_XFER_DEFAULT_TIMEOUT_MS;
    x->server_max_conns = o->server_max_conns ? o->server_max_conns
                                              : MOONLET_XFER_DEFAULT_SERVER_MAX_CONNS;
    x->server_max_conns_per_peer = o->server_max_conns_per_peer
                                       ? o->server_max_conns_per_peer
                                       : MOONLET_XFER_DEFAULT_SERVER_MAX_CONNS_PER_PEER;
    x->server_idle_timeout_ms = o->server_idle_timeout_ms;
    x->max_pooled_conns = o->max_pooled_conns ? o->max_pooled_conns
                                              : MOONLET_XFER_DEFAULT_MAX_POOLED_CONNS;
    x->keepalive_ms = o->keepalive_ms ? o->keepalive_ms : MOONLET_XFER_DEFAULT_KEEPALIVE_MS;
    if (oom)
        return MOONLET_ERR_INTERNAL_ERROR;
    if (x->listen_addr) {
        char host[256];
        uint16_t port;
        if (moonlet_net_split_hostport(x->listen_addr, host, sizeof(host), &port))
            return MOONLET_ERR_INVALID_PARAMS;
    }
    return MOONLET_OK;
}

int moonlet_xfer_create(const moonlet_xfer_opts *opts, moonlet_xfer **out)
{
    if (!opts || !out)
        return MOONLET_ERR_INVALID_PARAMS;
    *out = NULL;
    moonlet_xfer *x = calloc(1, sizeof(*x));
    if (!x)
        return MOONLET_ERR_INTERNAL_ERROR;
    int rc = xfer_copy_opts(x, opts);
    if (rc) {
        xfer_free_opts(x);
        free(x);
        return rc;
    }
    pthread_rwlock_init(&x->buf_lock, NULL);
    pthread_mutex_init(&x->pool_lock, NULL);
    moonlet_cond_init_mono(&x->pool_cond); /* waits immune to clock steps */
    x->be = xfer_choose_backend(opts);
    rc = x->be->start(x);
    if (rc) {
        pthread_cond_destroy(&x->pool_cond);
        pthread_mutex_destroy(&x->pool_lock);
        pthread_rwlock_destroy(&x->buf_lock);
        xfer_free_opts(x);
        free(x);
        return rc;
    }
    *out = x;
    return MOONLET_OK;
}

static void xfer_close_peers(moonlet_xfer *x)
{
    xfer_peer *p = x->peers;
    while (p) {
        xfer_peer *next = p->next;
        for (int i = 0; i < x->conns_per_peer; i++)
            if (p->slots[i].conn)
                x->be->conn_close(x, p->slots[i].conn);
        free(p->slots);
        free(p->endpoint);
        free(p);
        p = next;
    }
    x->peers = NULL;
    x->pooled = 0;
}

void moonlet_xfer_destroy(moonlet_xfer *x)
{
    if (!x)
        return;
    xfer_close_peers(x);
    while (!LIST_EMPTY(&x->bufs)) {
        xfer_buffer *b = LIST_FIRST(&x->bufs);
        LIST_REMOVE(b, link);
        if (b->handle)
            x->be->buf_remove(x, b->handle);
        free(b);
    }
    x->be->stop(x);
    pthread_cond_destroy(&x->pool_cond);
    pthread_mutex_destroy(&x->pool_lock);
    pthread_rwlock_destroy(&x->buf_lock);
    xfer_free_opts(x);
    free(x);
}

int moonlet_xfer_health(moonlet_xfer *x)
{
    if (!x)
        return MOONLET_ERR_INVALID_PARAMS;
    return x->be->health ? x->be->health(x) : MOONLET_OK;
}

const char *moonlet_xfer_protocol_name(const moonlet_xfer *x)
{
    return x ? x->be->name : "none";
}

int moonlet_xfer_local_endpoint(const moonlet_xfer *x, char *buf, size_t cap)
{
    if (!x || !buf)
        return MOONLET_ERR_INVALID_PARAMS;
    if (!x->endpoint[0])
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    if (strlen(x->endpoint) >= cap)
        return MOONLET_ERR_BUFFER_OVERFLOW;
    strcpy(buf, x->endpoint);
    return MOONLET_OK;
}

/* ---- segments and buffers ---------------------------------------------- */

int moonlet_xfer_register_segment(moonlet_xfer *x, void *base, uint64_t len,
                                  moonlet_xfer_segment_info *info)
{
    if (!x || !base || !len || !info || (uint64_t)(uintptr_t)base > UINT64_MAX - len)
        return MOONLET_ERR_INVALID_PARAMS;
    if (!x->endpoint[0])
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    memset(info, 0, sizeof(*info));
    return x->be->seg_add(x, base, len, info);
}

int moonlet_xfer_register_reader(moonlet_xfer *x, uint64_t len, moonlet_xfer_reader read,
                                 void *arg, moonlet_xfer_segment_info *info)
{
    if (!x || !len || !read || !info)
        return MOONLET_ERR_INVALID_PARAMS;
    if (!x->endpoint[0] || !x->be->seg_add_reader)
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    memset(info, 0, sizeof(*info));
    return x->be->seg_add_reader(x, len, read, arg, info);
}

int moonlet_xfer_unregister_segment(moonlet_xfer *x, const char *segment_id)
{
    if (!x || !segment_id)
        return MOONLET_ERR_INVALID_PARAMS;
    return x->be->seg_remove(x, segment_id);
}

int moonlet_xfer_set_segment_key(moonlet_xfer *x, const char *segment_id, const uint8_t *key)
{
    if (!x || !segment_id || !key)
        return MOONLET_ERR_INVALID_PARAMS;
    return x->be->seg_set_key ? x->be->seg_set_key(x, segment_id, key) : MOONLET_OK;
}

void moonlet_xfer_note_epoch(moonlet_xfer *x, uint64_t epoch)
{
    if (!x)
        return;
    uint64_t cur = atomic_load(&x->epoch);
    while (cur < epoch && !atomic_compare_exchange_weak(&x->epoch, &cur, epoch))
        ;
}

uint64_t moonlet_xfer_epoch(const moonlet_xfer *x)
{
    return x ? atomic_load(&((moonlet_xfer *)x)->epoch) : 0;
}

/* Registers [base, base + len) with the backend (host memory, or with
 * `device` device memory: dmabuf_fd, dmabuf_off and *how as
 * moonlet_xfer_register_device) and lists it. */
static int xfer_buffer_add(moonlet_xfer *x, void *base, size_t len, bool device, int dmabuf_fd,
                           uint64_t dmabuf_off, const char **how)
{
    xfer_buffer *b = calloc(1, sizeof(*b));
    if (!b)
        return MOONLET_ERR_INTERNAL_ERROR;
    b->base = base;
    b->len = len;
    int rc = device ? x->be->buf_add_device(x, base, len, dmabuf_fd, dmabuf_off, &b->handle,
                                            &b->lkey, how)
                    : x->be->buf_add(x, base, len, &b->handle, &b->lkey);
    if (rc) {
        free(b);
        return rc;
    }
    pthread_rwlock_wrlock(&x->buf_lock);
    LIST_INSERT_HEAD(&x->bufs, b, link);
    pthread_rwlock_unlock(&x->buf_lock);
    return MOONLET_OK;
}

int moonlet_xfer_register_buffer(moonlet_xfer *x, void *base, size_t len)
{
    if (!x || !base || !len || (uintptr_t)base > UINTPTR_MAX - len)
        return MOONLET_ERR_INVALID_PARAMS;
    return xfer_buffer_add(x, base, len, false, -1, 0, NULL);
}

int moonlet_xfer_register_device(moonlet_xfer *x, void *base, size_t len, int dmabuf_fd,
                                 uint64_t dmabuf_off, const char **how)
{
    *how = NULL;
    if (!x || !base || !len || (uintptr_t)base > UINTPTR_MAX - len)
        return MOONLET_ERR_INVALID_PARAMS;
    if (!x->be->buf_add_device) {
        *how = "the transport moves host memory only";
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    }
    return xfer_buffer_add(x, base, len, true, dmabuf_fd, dmabuf_off, how);
}

int moonlet_xfer_unregister_buffer(moonlet_xfer *x, void *base)
{
    if (!x || !base)
        return MOONLET_ERR_INVALID_PARAMS;
    pthread_rwlock_wrlock(&x->buf_lock);
    xfer_buffer *b;
    LIST_FOREACH(b, &x->bufs, link)
        if (b->base == base)
            break;
    if (b)
        LIST_REMOVE(b, link);
    pthread_rwlock_unlock(&x->buf_lock);
    if (!b)
        return MOONLET_ERR_INVALID_PARAMS;
    if (b->handle)
        x->be->buf_remove(x, b->handle);
    free(b);
    return MOONLET_OK;
}

int moonlet_xfer_buffer_lookup(moonlet_xfer *x, const void *addr, uint64_t len, uint32_t *lkey,
                               void **handle)
{
    uintptr_t a = (uintptr_t)addr;
    int rc = MOONLET_ERR_INVALID_PARAMS;
    pthread_rwlock_rdlock(&x->buf_lock);
    xfer_buffer *b;
    LIST_FOREACH(b, &x->bufs, link) {
        uintptr_t s = (uintptr_t)b->base;
        if (a >= s && len <= b->len && a - s <= b->len - len) {
            *lkey = b->lkey;
            *handle = b->handle;
            rc = MOONLET_OK;
            break;
        }
    }
    pthread_rwlock_unlock(&x->buf_lock);
    return rc;
}

/* ---- the connection pool ------------------------------------------------ */

/* Finds or adds the peer; called with pool_lock held. */
static xfer_peer *xfer_peer_get_locked(moonlet_xfer *x, const char *endpoint)
{
    for (xfer_peer *p = x->peers; p; p = p->next)
        if (strcmp(p->endpoint, endpoint) == 0)
            return p;
    xfer_peer *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->endpoint = strdup(endpoint);
    p->slots = calloc((size_t)x->conns_per_peer, sizeof(*p->slots));
    if (!p->endpoint || !p->slots) {
        free(p->endpoint);
        free(p->slots);
        free(p);
        return NULL;
    }
    p->next = x->peers;
    x->peers = p;
    return p;
}

/* Unlinks and frees the peer when no batch uses it and it holds no
 * connection; called with pool_lock held. */
static void xfer_peer_drop_if_empty_locked(moonlet_xfer *x, xfer_peer *p)
{
    if (p->refs)
        return;
    for (int i = 0; i < x->conns_per_peer; i++)
        if (p->slots[i].conn)
            return;
    for (xfer_peer **pp = &x->peers; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    free(p->slots);
    free(p->endpoint);
    free(p);
}

/* While more than max_pooled_conns connections are open, takes the least
 * recently used idle ones out of their slots (at most cap of them) into
 * victims[] for the caller to close once pool_lock is dropped, and frees
 * peers left empty.  Called with pool_lock held; returns how many. */
static size_t xfer_evict_locked(moonlet_xfer *x, void **victims, size_t cap)
{
    size_t n = 0;
    while (n < cap && x->pooled > x->max_pooled_conns) {
        xfer_peer *vp = NULL;
        xfer_slot *vs = NULL;
        for (xfer_peer *p = x->peers; p; p = p->next) {
            for (int i = 0; i < x->conns_per_peer; i++) {
                xfer_slot *s = &p->slots[i];
                if (!s->busy && s->conn && (!vs || s->last_used < vs->last_used)) {
                    vs = s;
                    vp = p;
                }
            }
        }
        if (!vs)
            break; /* every open connection is leased: the cap waits for a release */
        victims[n++] = vs->conn;
        vs->conn = NULL;
        x->pooled--;
        xfer_peer_drop_if_empty_locked(x, vp);
    }
    return n;
}

static void xfer_close_victims(moonlet_xfer *x, void **victims, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x->be->conn_close(x, victims[i]);
}

/* A leased slot's connection went away (closed by this thread). */
static void xfer_pool_forget(moonlet_xfer *x)
{
    pthread_mutex_lock(&x->pool_lock);
    x->pooled--;
    pthread_mutex_unlock(&x->pool_lock);
}

size_t moonlet_xfer_pool_stats(moonlet_xfer *x, const char *endpoint, size_t *npeers)
{
    size_t conns = 0, peers = 0;
    pthread_mutex_lock(&x->pool_lock);
    for (xfer_peer *p = x->peers; p; p = p->next) {
        peers++;
        if (endpoint && strcmp(endpoint, p->endpoint) != 0)
            continue;
        for (int i = 0; i < x->conns_per_peer; i++)
            conns += p->slots[i].conn != NULL;
    }
    pthread_mutex_unlock(&x->pool_lock);
    if (npeers)
        *npeers = peers;
    return conns;
}

/* Leases up to `want` idle slots of the peer, open ones first; called with
 * pool_lock held.  Returns how many were leased. */
static size_t xfer_lease_locked(moonlet_xfer *x, xfer_peer *p, size_t want, size_t *idx)
{
    size_t got = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < x->conns_per_peer && got < want; i++) {
            xfer_slot *s = &p->slots[i];
            if (!s->busy && (pass == 1 || s->conn)) {
                s->busy = true;
                idx[got++] = (size_t)i;
            }
        }
    }
    return got;
}

/* pool_cond runs on CLOCK_MONOTONIC, the clock moonlet_xfer_now_ms() reads. */
static void xfer_deadline_ts(uint64_t deadline_ms, struct timespec *ts)
{
    ts->tv_sec = (time_t)(deadline_ms / 1000u);
    ts->tv_nsec = (long)(deadline_ms % 1000u) * 1000000L;
}

/* Leases at least one slot (waiting until the deadline) and up to `want`. */
static int xfer_pool_lease(moonlet_xfer *x, xfer_group *g, size_t want, uint64_t deadline_ms)
{
    struct timespec ts;
    xfer_deadline_ts(deadline_ms, &ts);
    pthread_mutex_lock(&x->pool_lock);
    xfer_peer *p = xfer_peer_get_locked(x, g->endpoint);
    if (!p) {
        pthread_mutex_unlock(&x->pool_lock);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    g->peer = p;
    p->refs++;
    for (;;) {
        g->nslots = xfer_lease_locked(x, p, want, g->slot_idx);
        if (g->nslots)
            break;
        if (pthread_cond_timedwait(&x->pool_cond, &x->pool_lock, &ts) == ETIMEDOUT) {
            g->nslots = xfer_lease_locked(x, p, want, g->slot_idx);
            break;
        }
    }
    if (!g->nslots) {
        p->refs--;
        xfer_peer_drop_if_empty_locked(x, p);
        g->peer = NULL;
    }
    pthread_mutex_unlock(&x->pool_lock);
    if (!g->nslots) {
        ML_WARN(MOD, "no free connection to %s within %u ms", g->endpoint, x->timeout_ms);
        return MOONLET_ERR_TRANSFER_FAIL;
    }
    return MOONLET_OK;
}

/* Opens the leased slots that have no connection yet (no lock held: only
 * this thread touches a leased slot).  Slots that fail to open are given
 * back; after one failed open the other unopened slots are not tried (the
 * peer is unreachable or refusing: each try would cost up to timeout_ms, and
 * a batch would wait conns_per_peer timeouts per peer).  Returns 0 when at
 * least one is usable, else the first open error. */
static int xfer_pool_open(moonlet_xfer *x, xfer_group *g, uint64_t deadline_ms)
{
    int first_err = MOONLET_OK;
    size_t kept = 0;
    for (size_t i = 0; i < g->nslots; i++) {
        xfer_slot *s = &g->peer->slots[g->slot_idx[i]];
        if (s->conn && x->be->conn_stale && x->be->conn_stale(x, s->conn)) {
            x->be->conn_close(x, s->conn); /* the peer closed or went away: a new one, now */
            s->conn = NULL;
            xfer_pool_forget(x);
        }
        if (!s->conn && first_err) { /* one failed open is enough: don't try the others */
            pthread_mutex_lock(&x->pool_lock);
            s->busy = false;
            pthread_cond_broadcast(&x->pool_cond);
            pthread_mutex_unlock(&x->pool_lock);
            continue;
        }
        if (!s->conn) {
            /* Count it before opening, and make room: LRU idle connections
             * leave the pool and are closed outside pool_lock. */
            void *victims[XFER_EVICT_MAX];
            pthread_mutex_lock(&x->pool_lock);
            x->pooled++;
            size_t nv = xfer_evict_locked(x, victims, XFER_EVICT_MAX);
            pthread_mutex_unlock(&x->pool_lock);
            xfer_close_victims(x, victims, nv);
            int rc = x->be->conn_open(x, g->endpoint, deadline_ms, &s->conn);
            if (rc) {
                s->conn = NULL;
                if (!first_err)
                    first_err = rc;
                pthread_mutex_lock(&x->pool_lock);
                x->pooled--;
                s->busy = false;
                pthread_cond_broadcast(&x->pool_cond);
                pthread_mutex_unlock(&x->pool_lock);
                continue;
            }
        }
        g->slot_idx[kept++] = g->slot_idx[i];
    }
    g->nslots = kept;
    return kept ? MOONLET_OK : first_err;
}

/* Gives the group's slots and its peer reference back (a no-op without a
 * peer), closing the connections whose lane broke, and evicts idle
 * connections while the pool is over its cap. */
static void xfer_pool_release(moonlet_xfer *x, xfer_group *g, const xfer_lane *lanes)
{
    if (!g->peer)
        return;
    size_t closed = 0;
    for (size_t i = 0; i < g->nslots; i++) {
        xfer_slot *s = &g->peer->slots[g->slot_idx[i]];
        if (lanes && lanes[g->first_lane + i].broken) {
            x->be->conn_close(x, s->conn);
            s->conn = NULL;
            closed++;
        }
    }
    void *victims[XFER_EVICT_MAX];
    pthread_mutex_lock(&x->pool_lock);
    x->pooled -= closed;
    for (size_t i = 0; i < g->nslots; i++) {
        xfer_slot *s = &g->peer->slots[g->slot_idx[i]];
        s->busy = false;
        s->last_used = ++x->pool_tick;
    }
    g->peer->refs--;
    xfer_peer_drop_if_empty_locked(x, g->peer);
    size_t nv = xfer_evict_locked(x, victims, XFER_EVICT_MAX);
    pthread_cond_broadcast(&x->pool_cond);
    pthread_mutex_unlock(&x->pool_lock);
    xfer_close_victims(x, victims, nv);
    g->nslots = 0;
    g->peer = NULL;
}

int moonlet_xfer_connect(moonlet_xfer *x, const char *endpoint)
{
    char host[256];
    uint16_t port;
    if (!x || moonlet_net_split_hostport(endpoint, host, sizeof(host), &port))
        return MOONLET_ERR_INVALID_PARAMS;
    xfer_group g = {.endpoint = endpoint};
    g.slot_idx = calloc((size_t)x->conns_per_peer, sizeof(size_t));
    if (!g.slot_idx)
        return MOONLET_ERR_INTERNAL_ERROR;
    uint64_t deadline = moonlet_xfer_now_ms() + x->timeout_ms;
    int rc = xfer_pool_lease(x, &g, (size_t)x->conns_per_peer, deadline);
    if (rc == MOONLET_OK)
        rc = xfer_pool_open(x, &g, deadline);
    xfer_pool_release(x, &g, NULL);
    free(g.slot_idx);
    return rc;
}

/* ---- batches ------------------------------------------------------------ */

/* What can be refused before any byte moves. */
static int xfer_check_op(moonlet_xfer *x, xfer_item *it)
{
    moonlet_xfer_op *op = it->op;
    if (op->opcode != MOONLET_XFER_READ && op->opcode != MOONLET_XFER_WRITE)
        return MOONLET_ERR_INVALID_PARAMS;
    if (op->len == 0)
        return MOONLET_OK;
    if (!op->endpoint || !op->segment_id || !op->local || op->len > MOONLET_XFER_MAX_OP_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    if (op->offset > UINT64_MAX - op->len)
        return MOONLET_ERR_INVALID_PARAMS;
    if ((uintptr_t)op->local > UINTPTR_MAX - op->len)
        return MOONLET_ERR_INVALID_PARAMS;
    return x->be->prepare(x, it);
}

/* Orders items by endpoint, then by position in the batch (stable). */
static int xfer_item_cmp(const void *a, const void *b)
{
    const xfer_item *ia = *(const xfer_item *const *)a, *ib = *(const xfer_item *const *)b;
    int c = strcmp(ia->op->endpoint, ib->op->endpoint);
    if (c)
        return c;
    return ia < ib ? -1 : ia > ib;
}

/* Validates every op; returns the sorted list of items that must move bytes. */
static size_t xfer_collect(moonlet_xfer *x, moonlet_xfer_op *ops, size_t n, xfer_item *items,
                           xfer_item **todo)
{
    size_t ntodo = 0;
    uint64_t now = moonlet_xfer_now_ms();
    for (size_t i = 0; i < n; i++) {
        items[i].op = &ops[i];
        ops[i].status = xfer_check_op(x, &items[i]);
        /* A write past its writer's deadline is never started (both
         * backends): the master may already have given its range away. */
        if (ops[i].status == MOONLET_OK && ops[i].opcode == MOONLET_XFER_WRITE && ops[i].cap &&
            ops[i].cap->deadline_ms && now >= ops[i].cap->deadline_ms)
            ops[i].status = MOONLET_ERR_TRANSFER_FAIL;
        if (ops[i].status == MOONLET_OK && ops[i].len)
            todo[ntodo++] = &items[i];
    }
    qsort(todo, ntodo, sizeof(*todo), xfer_item_cmp);
    return ntodo;
}

/* Splits the sorted items into per-peer groups; returns how many. */
static size_t xfer_group_items(xfer_item **todo, size_t ntodo, xfer_group *groups)
{
    size_t ng = 0;
    for (size_t i = 0; i < ntodo; i++) {
        if (ng == 0 || strcmp(groups[ng - 1].endpoint, todo[i]->op->endpoint) != 0) {
            groups[ng] = (xfer_group){.endpoint = todo[i]->op->endpoint, .items = &todo[i]};
            ng++;
        }
        groups[ng - 1].nitems++;
        groups[ng - 1].bytes += todo[i]->op->len;
    }
    return ng;
}

static void xfer_fail_group(xfer_group *g, int rc)
{
    for (size_t i = 0; i < g->nitems; i++)
        g->items[i]->op->status = rc;
}

/* Spreads a group's items over its lanes, each to the least loaded lane so
 * far; items keep their batch order inside a lane.  `which` and `load` are
 * scratch arrays (g->nitems and g->nslots long); the lanes' item lists are
 * laid out in `out`, which has room for g->nitems pointers. */
static void xfer_assign_lanes(xfer_group *g, xfer_lane *lanes, xfer_item **out, size_t *which,
                              uint64_t *load)
{
    xfer_lane *gl = &lanes[g->first_lane];
    for (size_t l = 0; l < g->nslots; l++) {
        load[l] = 0;
        gl[l].nitems = 0;
        gl[l].broken = false;
        gl[l].conn = g->peer->slots[g->slot_idx[l]].conn;
    }
    for (size_t i = 0; i < g->nitems; i++) {
        size_t best = 0;
        for (size_t l = 1; l < g->nslots; l++)
            if (load[l] < load[best])
                best = l;
        which[i] = best;
        load[best] += g->items[i]->op->len;
        gl[best].nitems++;
    }
    size_t pos = 0;
    for (size_t l = 0; l < g->nslots; l++) {
        gl[l].items = &out[pos];
        pos += gl[l].nitems;
        gl[l].nitems = 0;
    }
    for (size_t i = 0; i < g->nitems; i++) {
        xfer_lane *lane = &gl[which[i]];
        lane->items[lane->nitems++] = g->items[i];
    }
}

/* Scratch memory of one batch: its arrays are carved from one block
 * (xfer_batch_layout), allocated and freed in one call. */
typedef struct xfer_batch {
    unsigned char *block;
    xfer_item *items;
    xfer_item **todo;
    xfer_item **lane_items;
    size_t *which;
    xfer_group *groups;
    size_t *slot_idx; /* conns_per_peer per group */
    uint64_t *load;
    xfer_lane *lanes;
    int *grc;                   /* per group: lease/open status */
    struct xfer_open_job *jobs; /* per group: concurrent opens */
    size_t *item_base;          /* per group: its first index in lane_items/which */
    uint64_t since_ms;          /* the pass began waiting for connections (lanes' since_ms) */
    uint64_t deadline_ms;       /* the batch's deadline: no connection is opened past it */
} xfer_batch;

/* One group whose connections must be opened: opened and run on its own
 * short-lived thread while the batch's other peers proceed (xfer_pass). */
typedef struct xfer_open_job {
    moonlet_xfer *x;
    struct xfer_batch *b;
    size_t gi;
    pthread_t th;
    bool started;
} xfer_open_job;

/* Takes n elements of `size` bytes, aligned for any type, at *end of a block
 * starting at base: their address (NULL while base is NULL: sizing only).
 * *end saturates at SIZE_MAX, a size no allocation meets. */
static void *carve(unsigned char *base, size_t *end, size_t n, size_t size)
{
    size_t al = _Alignof(max_align_t);
    size_t off = *end / al * al + (*end % al ? al : 0);
    if (*end == SIZE_MAX || off < *end || (size && n > (SIZE_MAX - off) / size)) {
        *end = SIZE_MAX;
        return NULL;
    }
    *end = off + n * size;
    return base ? base + off : NULL;
}

/* Lays the batch's arrays out from base (NULL: only sizes the block, *end). */
static void xfer_batch_layout(xfer_batch *b, unsigned char *base, size_t n, size_t cpp,
                              size_t *end)
{
    *end = 0;
    b->items = carve(base, end, n, sizeof(*b->items));
    b->todo = carve(base, end, n, sizeof(*b->todo));
    b->lane_items = carve(base, end, n, sizeof(*b->lane_items));
    b->which = carve(base, end, n, sizeof(*b->which));
    b->groups = carve(base, end, n, sizeof(*b->groups));
    b->slot_idx = carve(base, end, n * cpp, sizeof(*b->slot_idx));
    b->load = carve(base, end, n * cpp, sizeof(*b->load)); /* per group: lanes run concurrently */
    b->lanes = carve(base, end, n, sizeof(*b->lanes)); /* at most one lane per item */
    b->grc = carve(base, end, n, sizeof(*b->grc));
    b->jobs = carve(base, end, n, sizeof(*b->jobs));
    b->item_base = carve(base, end, n, sizeof(*b->item_base));
}

static void xfer_batch_free(xfer_batch *b)
{
    free(b->block);
}

static int xfer_batch_alloc(moonlet_xfer *x, size_t n, xfer_batch *b)
{
    size_t cpp = (size_t)x->conns_per_peer, size;
    memset(b, 0, sizeof(*b));
    if (cpp && n > SIZE_MAX / cpp)
        return MOONLET_ERR_INTERNAL_ERROR;
    xfer_batch_layout(b, NULL, n, cpp, &size);
    b->block = size == SIZE_MAX ? NULL : calloc(1, size ? size : 1);
    if (!b->block)
        return MOONLET_ERR_INTERNAL_ERROR;
    xfer_batch_layout(b, b->block, n, cpp, &size);
    return MOONLET_OK;
}

/* The earliest writer deadline (moonlet_xfer_cap) among a group's items; 0: none. */
static uint64_t xfer_group_deadline(const xfer_group *g)
{
    uint64_t best = 0;
    for (size_t i = 0; i < g->nitems; i++) {
        const moonlet_xfer_op *op = g->items[i]->op;
        uint64_t dl = op->opcode == MOONLET_XFER_WRITE && op->cap ? op->cap->deadline_ms : 0;
        if (dl && (!best || dl < best))
            best = dl;
    }
    return best;
}

/* Does any of the group's leased slots have no connection yet? */
static bool xfer_group_needs_open(const xfer_group *g)
{
    for (size_t i = 0; i < g->nslots; i++)
        if (!g->peer->slots[g->slot_idx[i]].conn)
            return true;
    return false;
}

/* Opens the group's leased slots that need it and lays its lanes out from
 * lane_base.  A group that gets no connection fails all its items.  A group
 * holding a write with a deadline fails (TRANSFER_FAIL) when the deadline
 * passed while its connections were leased and opened: on both backends no
 * write is started after its writer's deadline (the master may have given
 * its range away; docs/reliability.md).  Returns its number of lanes. */
static size_t xfer_group_prepare(moonlet_xfer *x, xfer_batch *b, size_t gi, size_t lane_base)
{
    xfer_group *g = &b->groups[gi];
    size_t cpp = (size_t)x->conns_per_peer;
    uint64_t gdl = xfer_group_deadline(g);
    int rc = b->grc[gi];
    if (rc == MOONLET_OK)
        rc = xfer_pool_open(x, g, b->deadline_ms);
    if (rc == MOONLET_OK && gdl && moonlet_xfer_now_ms() >= gdl) {
        xfer_pool_release(x, g, NULL);
        rc = MOONLET_ERR_TRANSFER_FAIL;
    }
    if (rc) {
        xfer_fail_group(g, rc);
        xfer_pool_release(x, g, NULL); /* its peer reference (no slots left) */
    }
    g->first_lane = lane_base;
    g->nlanes = g->nslots;
    if (g->nslots)
        xfer_assign_lanes(g, b->lanes, &b->lane_items[b->item_base[gi]],
                          &b->which[b->item_base[gi]], &b->load[gi * cpp]);
    for (size_t l = 0; l < g->nslots; l++)
        b->lanes[lane_base + l].since_ms = b->since_ms;
    return g->nslots;
}

/* A peer's opens and then its lanes, on their own thread. */
static void *xfer_open_main(void *arg)
{
    xfer_open_job *j = arg;
    xfer_group *g = &j->b->groups[j->gi];
    size_t n = xfer_group_prepare(j->x, j->b, j->gi, g->first_lane);
    if (n)
        j->x->be->run(j->x, &j->b->lanes[g->first_lane], n);
    return NULL;
}

/*
 * One pass over the sorted items todo[0..ntodo): groups them by peer,
 * leases up to max_conns connections per peer (in endpoint order, waiting no
 * later than deadline), opens the missing ones, runs the lanes and gives the
 * connections back.
 *
 * Concurrent opens: when a batch spans several peers, each peer that needs a
 * new connection gets a short-lived thread that opens it (bounded by
 * timeout_ms from now) and then runs that peer's lanes, while the calling
 * thread runs the lanes of the peers whose connections are cached.  So N
 * slow or unreachable peers cost one timeout, not N, and a good peer's
 * operations complete after its own connect and transfer, never after a
 * dead peer's timeout.  Both backends' conn_open and run are already called
 * concurrently by concurrent batches on disjoint connections.  A peer whose
 * thread cannot be started is handled on the calling thread.
 */
static void xfer_pass(moonlet_xfer *x, xfer_batch *b, size_t ntodo, size_t max_conns,
                      uint64_t since, uint64_t deadline)
{
    b->since_ms = since;
    b->deadline_ms = deadline;
    size_t ng = xfer_group_items(b->todo, ntodo, b->groups);
    size_t cpp = (size_t)x->conns_per_peer, nitems = 0;
    for (size_t gi = 0; gi < ng; gi++) {
        xfer_group *g = &b->groups[gi];
        g->slot_idx = &b->slot_idx[gi * cpp];
        b->item_base[gi] = nitems;
        nitems += g->nitems;
        size_t want = g->nitems < max_conns ? g->nitems : max_conns;
        uint64_t gdl = xfer_group_deadline(g);
        b->grc[gi] = xfer_pool_lease(x, g, want, gdl && gdl < deadline ? gdl : deadline);
        b->jobs[gi] = (xfer_open_job){.x = x, .b = b, .gi = gi};
    }
    /* lanes: the calling thread's groups first (compacted as they are
     * prepared), then one region of leased-slot size per threaded group */
    size_t base = 0;
    for (size_t gi = 0; gi < ng; gi++) {
        xfer_group *g = &b->groups[gi];
        if (ng > 1 && b->grc[gi] == MOONLET_OK && xfer_group_needs_open(g))
            b->jobs[gi].started = true; /* tentatively: region assigned below */
        else
            base += b->grc[gi] == MOONLET_OK ? g->nslots : 0;
    }
    for (size_t gi = 0; gi < ng; gi++) {
        xfer_open_job *j = &b->jobs[gi];
        if (!j->started)
            continue;
        b->groups[gi].first_lane = base;
        base += b->groups[gi].nslots;
        /* if it cannot start, the group is prepared inline below, into its region */
        j->started = moonlet_thread_create(&j->th, xfer_open_main, j, "xfer-open") == 0;
    }
    size_t nlanes = 0;
    for (size_t gi = 0; gi < ng; gi++) {
        xfer_group *g = &b->groups[gi];
        if (b->jobs[gi].started)
            continue;
        bool own_region = ng > 1 && b->grc[gi] == MOONLET_OK && xfer_group_needs_open(g);
        if (own_region) { /* its thread could not start: open and run it here */
            size_t n = xfer_group_prepare(x, b, gi, g->first_lane);
            if (n)
                x->be->run(x, &b->lanes[g->first_lane], n);
            continue;
        }
        nlanes += xfer_group_prepare(x, b, gi, nlanes);
    }
    if (nlanes)
        x->be->run(x, b->lanes, nlanes);
    for (size_t gi = 0; gi < ng; gi++)
        if (b->jobs[gi].started)
            pthread_join(b->jobs[gi].th, NULL);
    for (size_t gi = 0; gi < ng; gi++)
        xfer_pool_release(x, &b->groups[gi], b->lanes);
}

/* Moves to the front of todo (keeping their order) the operations that
 * failed only because their connection did, while time remains: before the
 * batch's deadline and, for a write, before its writer's deadline.  Access
 * and request errors (INVALID_PARAMS, SEGMENT_NOT_FOUND, ILLEGAL_CLIENT,
 * INVALID_WRITE, verbs access errors) are never marked conn_failed by a
 * backend, so they are never reissued.  Returns how many; their status is
 * reset for the second and last pass. */
static size_t xfer_reissuable(xfer_item **todo, size_t ntodo, uint64_t deadline)
{
    uint64_t now = moonlet_xfer_now_ms();
    size_t n = 0;
    for (size_t i = 0; i < ntodo; i++) {
        xfer_item *it = todo[i];
        const moonlet_xfer_op *op = it->op;
        bool retry = it->conn_failed && op->status == MOONLET_ERR_TRANSFER_FAIL && now < deadline;
        if (retry && op->opcode == MOONLET_XFER_WRITE && op->cap && op->cap->deadline_ms &&
            now >= op->cap->deadline_ms)
            retry = false;
        it->conn_failed = false;
        if (retry) {
            it->op->status = MOONLET_OK;
            todo[n++] = it;
        }
    }
    return n;
}

int moonlet_xfer_submit(moonlet_xfer *x, moonlet_xfer_op *ops, size_t n)
{
    if (!x || (!ops && n))
        return MOONLET_ERR_INVALID_PARAMS;
    if (n == 0)
        return MOONLET_OK;
    xfer_batch b;
    if (xfer_batch_alloc(x, n, &b)) {
        for (size_t i = 0; i < n; i++)
            ops[i].status = MOONLET_ERR_INTERNAL_ERROR;
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    uint64_t start = moonlet_xfer_now_ms(), deadline = start + x->timeout_ms;
    size_t ntodo = xfer_collect(x, ops, n, b.items, b.todo);
    xfer_pass(x, &b, ntodo, (size_t)x->conns_per_peer, start, deadline);
    ntodo = xfer_reissuable(b.todo, ntodo, deadline);
    if (ntodo) {
        /* a connection that failed (reset, EOF) made progress until then:
         * the reissue's silence counts from now, its waits end at the
         * batch's deadline */
        ML_INFO(MOD, "reissuing %zu operation(s) whose connection failed", ntodo);
        xfer_pass(x, &b, ntodo, 1, moonlet_xfer_now_ms(), deadline);
    }
    xfer_batch_free(&b);
    for (size_t i = 0; i < n; i++)
        if (ops[i].status)
            return ops[i].status;
    return MOONLET_OK;
}

int moonlet_xfer_read(moonlet_xfer *x, const char *endpoint, const char *segment_id,
                      uint64_t offset, void *dst, uint64_t len)
{
    moonlet_xfer_op op = {.opcode = MOONLET_XFER_READ, .endpoint = endpoint,
                          .segment_id = segment_id, .offset = offset, .local = dst, .len = len};
    return moonlet_xfer_submit(x, &op, 1);
}

int moonlet_xfer_write(moonlet_xfer *x, const char *endpoint, const char *segment_id,
                       uint64_t offset, const void *src, uint64_t len)
{
    moonlet_xfer_op op = {.opcode = MOONLET_XFER_WRITE, .endpoint = endpoint,
                          .segment_id = segment_id, .offset = offset, .local = (void *)src,
                          .len = len};
    return moonlet_xfer_submit(x, &op, 1);
}
