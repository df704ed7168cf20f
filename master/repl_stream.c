/*
 * repl_stream.c - the leader's record log with semi-synchronous waits, and
 * the standby's follower thread (repl_stream.h).
 *
 * The log is a ring of encoded records (seq, emit time, bytes), trimmed
 * from the oldest end beyond max_bytes.  mu guards it and the standby's
 * progress; cv wakes fetches (a record came) and semi-sync waiters (an ack
 * came, or the in-sync state changed).  `marking` serialises etcd marks,
 * which run without mu.
 */
#include "repl_stream.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "log.h"
#include "methods.h"
#include "monotime.h"
#include "moonlet/error.h"
#include "net.h"
#include "rpc_client.h"
#include "wire.h"
#include "sync.h"
#include "thread.h"

#define MOD "repl"

struct lrec {
    uint64_t seq, t_ms;
    uint32_t len;
    uint8_t *bytes;
};

struct moonlet_repl_log {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    moonlet_repl_log_opts o;
    struct lrec *ring;
    size_t cap, head, n; /* ring[head .. head+n) */
    size_t bytes;
    uint64_t next;       /* seq of the next record */
    char standby[MOONLET_ROLE_ADDR_MAX];
    uint64_t acked;      /* standby applied every seq < acked */
    uint64_t last_fetch_ms;
    bool in_sync, marking;
    uint64_t out_marks, in_marks;
    uint64_t sync_waits, sync_acked_on_entry, sync_wait_ns; /* moonlet_repl_log_status */
    bool dropped_oldest;  /* records were trimmed: `acked` below ring start means lost */
};

static void deadline_ts(struct timespec *ts, uint64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

int moonlet_repl_log_create(const moonlet_repl_log_opts *opts, moonlet_repl_log **out)
{
    moonlet_repl_log *l = calloc(1, sizeof(*l));
    if (!l)
        return MOONLET_ERR_INTERNAL_ERROR;
    if (opts)
        l->o = *opts;
    if (!l->o.max_bytes)
        l->o.max_bytes = 64u << 20;
    if (!l->o.max_lag_ms)
        l->o.max_lag_ms = MOONLET_REPL_DEFAULT_MAX_LAG_MS;
    pthread_mutex_init(&l->mu, NULL);
    moonlet_cond_init_mono(&l->cv);
    l->next = 1;
    *out = l;
    return MOONLET_OK;
}

static void ring_clear(moonlet_repl_log *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->ring[(l->head + i) % l->cap].bytes);
    l->head = l->n = 0;
    l->bytes = 0;
}

void moonlet_repl_log_destroy(moonlet_repl_log *l)
{
    if (!l)
        return;
    ring_clear(l);
    free(l->ring);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

void moonlet_repl_log_reset(moonlet_repl_log *l)
{
    pthread_mutex_lock(&l->mu);
    ring_clear(l);
    l->next++; /* a standby's old position is never valid again */
    l->dropped_oldest = true;
    l->standby[0] = 0;
    l->acked = 0;
    l->in_sync = false;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

uint64_t moonlet_repl_log_next(moonlet_repl_log *l)
{
    return moonlet_locked_u64(&l->mu, &l->next);
}

void moonlet_repl_log_emit(void *log, const moonlet_repl_rec *rec)
{
    moonlet_repl_log *l = log;
    uint8_t tmp[MOONLET_REPL_MAX_REC_BYTES];
    size_t len = moonlet_repl_encode(rec, tmp, sizeof(tmp));
    uint8_t *b = len ? malloc(len) : NULL;
    if (b)
        memcpy(b, tmp, len);
    pthread_mutex_lock(&l->mu);
    if (!b) {
        /* A record lost: the standby's state can no longer be trusted. */
        ML_ERR(MOD, "a replication record could not be kept: the standby starts over");
        ring_clear(l);
        l->dropped_oldest = true;
        l->next++;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        return;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        struct lrec *r = malloc(cap * sizeof(*r));
        if (!r) {
            free(b);
            ring_clear(l);
            l->dropped_oldest = true;
            l->next++;
            pthread_mutex_unlock(&l->mu);
            return;
        }
        for (size_t i = 0; i < l->n; i++)
            r[i] = l->ring[(l->head + i) % l->cap];
        free(l->ring);
        l->ring = r;
        l->cap = cap;
        l->head = 0;
    }
    l->ring[(l->head + l->n) % l->cap] =
        (struct lrec){.seq = l->next++, .t_ms = moonlet_mono_ms(), .len = (uint32_t)len, .bytes = b};
    l->n++;
    l->bytes += len;
    while (l->bytes > l->o.max_bytes && l->n > 1) {
        struct lrec *o = &l->ring[l->head];
        l->bytes -= o->len;
        free(o->bytes);
        l->head = (l->head + 1) % l->cap;
        l->n--;
        l->dropped_oldest = true;
    }
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* The first seq still in the ring (next when empty).  mu held. */
static uint64_t ring_first(const moonlet_repl_log *l)
{
    return l->n ? l->ring[l->head].seq : l->next;
}

/* One etcd mark, without mu; at most one at a time.  mu held on entry and exit. */
static int mark_locked(moonlet_repl_log *l, bool in_sync)
{
    char who[MOONLET_ROLE_ADDR_MAX];
    snprintf(who, sizeof(who), "%s", l->standby);
    l->marking = true;
    pthread_mutex_unlock(&l->mu);
    int rc = l->o.mark ? l->o.mark(l->o.mark_arg, in_sync, who) : MOONLET_OK;
    pthread_mutex_lock(&l->mu);
    l->marking = false;
    pthread_cond_broadcast(&l->cv);
    return rc;
}

int moonlet_repl_log_fetch(moonlet_repl_log *l, const char *standby, uint64_t from,
                           size_t max_bytes, int wait_ms, uint8_t **buf, size_t *len,
                           uint64_t *next, bool *lost)
{
    *buf = NULL;
    *len = 0;
    *lost = false;
    pthread_mutex_lock(&l->mu);
    uint64_t now = moonlet_mono_ms();
    /* One hot standby: another one is served records but counts for
     * nothing, unless the current one has not fetched for a second (gone). */
    bool secondary = false;
    if (strcmp(l->standby, standby) != 0) {
        if (l->standby[0] && now - l->last_fetch_ms < 1000) {
            secondary = true;
        } else {
            if (l->standby[0])
                ML_WARN(MOD, "standby %s replaces %s", standby, l->standby);
            if (l->in_sync) { /* the old one is named in etcd: unname it first */
                int rc = l->marking ? MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS
                                    : mark_locked(l, false);
                if (rc) {
                    pthread_mutex_unlock(&l->mu);
                    return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
                }
                l->in_sync = false;
                l->out_marks++;
            }
            snprintf(l->standby, sizeof(l->standby), "%s", standby);
            l->acked = 0;
        }
    }
    if (!secondary)
        l->last_fetch_ms = now;
    if (secondary) {
        /* records only: no ack, no in-sync state */
    } else if (from > l->next || from < ring_first(l)) {
        *lost = true;
        *next = l->next;
        pthread_mutex_unlock(&l->mu);
        return MOONLET_OK;
    }
    if (!secondary && from > l->acked) {
        l->acked = from;
        pthread_cond_broadcast(&l->cv);
    }
    /* Caught up and not in sync: writes wait for it from now on, then etcd names it. */
    if (!secondary && !l->in_sync && !l->marking && from == l->next) {
        l->in_sync = true;
        int rc = mark_locked(l, true);
        if (rc) {
            l->in_sync = false;
            ML_WARN(MOD, "cannot mark standby %s in sync: %s", standby, moonlet_strerror(rc));
        } else {
            l->in_marks++;
            ML_INFO(MOD, "standby %s is in sync", standby);
        }
        pthread_cond_broadcast(&l->cv);
    }
    if (from == l->next && wait_ms > 0) {
        struct timespec ts;
        deadline_ts(&ts, (uint64_t)wait_ms);
        while (from == l->next && from >= ring_first(l))
            if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT)
                break;
    }
    if (from < ring_first(l) || from > l->next) {
        *lost = true;
        *next = l->next;
        pthread_mutex_unlock(&l->mu);
        return MOONLET_OK;
    }
    size_t idx = (size_t)(from - ring_first(l)), total = 0, count = 0;
    for (size_t i = idx; i < l->n; i++) {
        size_t sz = 4 + l->ring[(l->head + i) % l->cap].len;
        if (count && total + sz > max_bytes)
            break;
        total += sz;
        count++;
    }
    int rc = MOONLET_OK;
    if (count && !(*buf = malloc(total)))
        rc = MOONLET_ERR_INTERNAL_ERROR;
    size_t off = 0;
    for (size_t i = idx; rc == MOONLET_OK && i < idx + count; i++) {
        const struct lrec *r = &l->ring[(l->head + i) % l->cap];
        for (int k = 0; k < 4; k++)
            (*buf)[off + (size_t)k] = (uint8_t)(r->len >> (8 * k));
        memcpy(*buf + off + 4, r->bytes, r->len);
        off += 4 + r->len;
    }
    *len = rc ? 0 : total;
    *next = from + (rc ? 0 : count);
    pthread_mutex_unlock(&l->mu);
    return rc;
}

struct snapbuf {
    uint8_t *p;
    size_t n, cap, budget;
    bool bad;
};

static void snap_emit(void *arg, const moonlet_repl_rec *rec)
{
    struct snapbuf *s = arg;
    uint8_t tmp[MOONLET_REPL_MAX_REC_BYTES];
    size_t len = moonlet_repl_encode(rec, tmp, sizeof(tmp));
    if (!len || s->bad) {
        s->bad = true;
        return;
    }
    if (s->n + 4 + len > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 65536;
        while (cap < s->n + 4 + len)
            cap *= 2;
        uint8_t *p = realloc(s->p, cap);
        if (!p) {
            s->bad = true;
            return;
        }
        s->p = p;
        s->cap = cap;
    }
    for (int k = 0; k < 4; k++)
        s->p[s->n + (size_t)k] = (uint8_t)(len >> (8 * k));
    memcpy(s->p + s->n + 4, tmp, len);
    s->n += 4 + len;
}

static bool snap_full(void *arg)
{
    const struct snapbuf *s = arg;
    return s->bad || (s->budget && s->n >= s->budget);
}

int moonlet_repl_log_snapshot(moonlet_repl_log *l, moonlet_master *m, uint64_t cursor,
                              size_t budget, uint8_t **buf, size_t *len, uint64_t *start,
                              uint64_t *consistent_at, uint64_t *next_cursor)
{
    *buf = NULL;
    *len = 0;
    *start = moonlet_repl_log_next(l);
    struct snapbuf s = {.budget = budget};
    int rc = moonlet_master_snapshot_part(m, cursor, snap_full, snap_emit, &s, next_cursor);
    *consistent_at = moonlet_repl_log_next(l);
    if (rc || s.bad) {
        free(s.p);
        return rc ? rc : MOONLET_ERR_INTERNAL_ERROR;
    }
    *buf = s.p;
    *len = s.n;
    return MOONLET_OK;
}

int moonlet_repl_log_wait(moonlet_repl_log *l)
{
    uint64_t t0 = moonlet_mono_ns();
    pthread_mutex_lock(&l->mu);
    uint64_t want = l->next; /* every record emitted so far */
    bool counted = l->in_sync;
    if (counted) {
        l->sync_waits++;
        l->sync_acked_on_entry += l->acked >= want;
    }
    struct timespec ts;
    deadline_ts(&ts, l->o.max_lag_ms);
    int rc = MOONLET_OK;
    for (;;) {
        if (!l->in_sync || l->acked >= want)
            break;
        if (l->marking) { /* another write is marking it; its result decides */
            pthread_cond_wait(&l->cv, &l->mu);
            continue;
        }
        if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) != ETIMEDOUT)
            continue;
        if (!l->in_sync || l->acked >= want || l->marking)
            continue;
        /* The standby lags past the bound: out of sync in etcd first, then alone. */
        rc = mark_locked(l, false);
        if (rc == MOONLET_OK) {
            l->in_sync = false;
            l->out_marks++;
            ML_WARN(MOD, "standby %s lags more than %llu ms: marked out of sync", l->standby,
                    (unsigned long long)l->o.max_lag_ms);
            pthread_cond_broadcast(&l->cv);
        } else {
            ML_ERR(MOD, "cannot mark standby %s out of sync: %s (the write is not acknowledged)",
                   l->standby, moonlet_strerror(rc));
            rc = MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
        }
        break;
    }
    if (counted)
        l->sync_wait_ns += moonlet_mono_ns() - t0;
    pthread_mutex_unlock(&l->mu);
    return rc;
}

void moonlet_repl_log_get_status(moonlet_repl_log *l, moonlet_repl_log_status *st)
{
    memset(st, 0, sizeof(*st));
    uint64_t now = moonlet_mono_ms();
    pthread_mutex_lock(&l->mu);
    snprintf(st->standby, sizeof(st->standby), "%s", l->standby);
    st->in_sync = l->in_sync;
    st->next = l->next;
    st->acked = l->acked;
    if (l->standby[0] && l->acked < l->next && l->acked >= ring_first(l) && l->n) {
        const struct lrec *r = &l->ring[(l->head + (size_t)(l->acked - ring_first(l))) % l->cap];
        st->lag_ms = now > r->t_ms ? now - r->t_ms : 0;
    }
    st->last_fetch_age_ms = l->last_fetch_ms ? now - l->last_fetch_ms : 0;
    st->out_of_sync_marks = l->out_marks;
    st->in_sync_marks = l->in_marks;
    st->sync_waits = l->sync_waits;
    st->sync_acked_on_entry = l->sync_acked_on_entry;
    st->sync_wait_us = l->sync_wait_ns / 1000;
    pthread_mutex_unlock(&l->mu);
}

/* ---- the standby's follower ------------------------------------------------- */

struct moonlet_repl_follower {
    moonlet_repl_follower_opts o;
    char advertise[MOONLET_ROLE_ADDR_MAX];
    char token[256];
    pthread_t thread;
    pthread_mutex_t mu;
    bool stop;
    /* the thread's own */
    moonlet_rpc_client *c;
    /* Written by the thread under smu (never held across a call), read by
     * it without: the state, where it stands, and the epoch of its
     * snapshot.  `handed`: moonlet_repl_follower_stop took the state; the
     * thread no longer touches it. */
    pthread_mutex_t smu;
    bool handed;
    moonlet_repl_state *st;
    uint64_t from, consistent_at, st_epoch;
    bool diverged;
    /* mu: status */
    moonlet_repl_follower_status status;
};

/* Takes smu for a change of the state; false (smu not held) once it was
 * handed over. */
static bool state_lock(moonlet_repl_follower *f)
{
    pthread_mutex_lock(&f->smu);
    if (!f->handed)
        return true;
    pthread_mutex_unlock(&f->smu);
    return false;
}

static bool stopping(moonlet_repl_follower *f)
{
    return moonlet_locked_bool(&f->mu, &f->stop);
}

static void drop_conn(moonlet_repl_follower *f)
{
    moonlet_rpc_client_close(f->c);
    f->c = NULL;
    pthread_mutex_lock(&f->mu);
    f->status.connected = false;
    f->status.consistent = false;
    pthread_mutex_unlock(&f->mu);
}

/* Applies a framed blob; errors before consistent_at are the replay's
 * overlap with the snapshot (ignored), after it a divergence. */
/* What a blob is: the stream's records, or a snapshot's first part, or a
 * later part.  A later part may hold objects on a segment mounted after the
 * first part's walk: that segment's MOUNT, and every PLACE on it, come
 * after the first part's `start` in the stream, so the replay brings the
 * object; the part's record is skipped. */
enum blob_kind { BLOB_STREAM, BLOB_SNAP_FIRST, BLOB_SNAP_LATER };

static int apply_blob(moonlet_repl_follower *f, const uint8_t *p, size_t len, uint64_t first_seq,
                      enum blob_kind kind, uint64_t *count)
{
    bool snapshot = kind != BLOB_STREAM;
    size_t off = 0;
    uint64_t seq = first_seq;
    *count = 0;
    while (off < len) {
        if (len - off < 4)
            return MOONLET_ERR_INVALID_PARAMS;
        uint32_t n = (uint32_t)p[off] | (uint32_t)p[off + 1] << 8 | (uint32_t)p[off + 2] << 16 |
                     (uint32_t)p[off + 3] << 24;
        off += 4;
        if (n > len - off)
            return MOONLET_ERR_INVALID_PARAMS;
        moonlet_repl_decoded d;
        int rc = moonlet_repl_decode(p + off, n, &d);
        if (rc)
            return rc;
        rc = moonlet_repl_state_apply(f->st, &d.rec);
        if (rc == MOONLET_ERR_SEGMENT_NOT_FOUND && kind == BLOB_SNAP_LATER)
            rc = MOONLET_OK;
        if (rc && (snapshot || seq >= f->consistent_at)) {
            ML_WARN(MOD, "record %llu does not apply (%d): taking a new snapshot",
                    (unsigned long long)seq, rc);
            return rc;
        }
        off += n;
        seq += !snapshot;
        (*count)++;
    }
    return MOONLET_OK;
}

static const msgpack_object *bin_at(const msgpack_object *arr, uint32_t i)
{
    const msgpack_object *o = moonlet_wire_at(arr, i);
    return o && o->type == MSGPACK_OBJECT_BIN ? o : NULL;
}

/* One part of a snapshot (ReplSnapshot [cursor, max_bytes]), applied to
 * the state: the first part clears it. */
static int snapshot_part(moonlet_repl_follower *f, uint64_t cursor, uint64_t *ep, uint64_t *start,
                         uint64_t *cons, uint64_t *next_cursor)
{
    msgpack_packer *pk = moonlet_rpc_client_begin(f->c, MOONLET_M_REPL_SNAPSHOT, 2);
    msgpack_pack_uint64(pk, cursor);
    msgpack_pack_uint64(pk, MOONLET_REPL_SNAPSHOT_PART_BYTES);
    moonlet_reply rep;
    int rc = moonlet_rpc_client_call(f->c, &rep);
    if (rc)
        return rc;
    rc = rep.code;
    const msgpack_object *b = NULL;
    if (!rc && (!rep.result || moonlet_wire_u64(rep.result, 0, ep) ||
                moonlet_wire_u64(rep.result, 1, start) || moonlet_wire_u64(rep.result, 2, cons) ||
                !(b = bin_at(rep.result, 3)) || moonlet_wire_u64(rep.result, 4, next_cursor)))
        rc = MOONLET_ERR_INVALID_PARAMS;
    if (!rc && !state_lock(f))
        rc = MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS; /* stopped meanwhile */
    else if (!rc) {
        if (cursor == 0)
            moonlet_repl_state_clear(f->st);
        uint64_t n;
        rc = apply_blob(f, (const uint8_t *)b->via.bin.ptr, b->via.bin.size, 0,
                        cursor == 0 ? BLOB_SNAP_FIRST : BLOB_SNAP_LATER, &n);
        f->diverged = rc != 0;
        pthread_mutex_unlock(&f->smu);
    }
    moonlet_reply_destroy(&rep);
    return rc;
}

/* A snapshot, in as many parts as the leader cuts it into.  Until the last
 * part is in, the state is not consistent (consistent_at 0): a promotion
 * meanwhile starts empty.  The stream continues at the first part's start
 * and is consistent from the last part's consistent_at. */
static int take_snapshot(moonlet_repl_follower *f, uint64_t *epoch)
{
    if (!state_lock(f))
        return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
    f->consistent_at = 0;
    pthread_mutex_unlock(&f->smu);
    uint64_t cursor = 0, first_ep = 0, first_start = 0;
    for (uint32_t part = 0;; part++) {
        uint64_t ep = 0, start = 0, cons = 0, next = 0;
        int rc = snapshot_part(f, cursor, &ep, &start, &cons, &next);
        if (rc)
            return rc;
        if (part == 0) {
            first_ep = ep;
            first_start = start;
        } else if (ep != first_ep) {
            return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS; /* a new term: start over */
        }
        if (next == 0) {
            if (!state_lock(f))
                return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
            f->consistent_at = cons;
            f->from = first_start;
            f->st_epoch = first_ep;
            pthread_mutex_unlock(&f->smu);
            *epoch = first_ep;
            return MOONLET_OK;
        }
        if (next <= cursor || part >= MOONLET_REPL_SNAPSHOT_MAX_PARTS)
            return MOONLET_ERR_INVALID_PARAMS; /* a leader that does not move on */
        cursor = next;
    }
}

static void *follow(void *arg)
{
    moonlet_repl_follower *f = arg;
    char cur[MOONLET_ROLE_ADDR_MAX] = "";
    uint64_t epoch = 0;
    bool need_snap = true;
    while (!stopping(f)) {
        moonlet_role_info ri;
        moonlet_role_get(f->o.role, moonlet_mono_ms(), &ri);
        if (ri.state != MOONLET_ROLE_STANDBY || !ri.leader[0] ||
            strcmp(ri.leader, f->advertise) == 0) {
            if (f->c)
                drop_conn(f);
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        if (f->c && strcmp(cur, ri.leader) != 0)
            drop_conn(f);
        if (!f->c) {
            char host[MOONLET_ROLE_ADDR_MAX];
            uint16_t port;
            moonlet_rpc_client_opts co = {.timeout_ms = 2000 + f->o.fetch_wait_ms,
                                          .auth_token = f->token[0] ? f->token : NULL,
                                          .auth_token_len = strlen(f->token)};
            /* ReplPort on the leader's address, then its replication server */
            moonlet_rpc_client *main_c = NULL;
            uint64_t rport = 0;
            if (!moonlet_net_split_hostport(ri.leader, host, sizeof(host), &port) &&
                !moonlet_rpc_client_connect(host, port, &co, &main_c)) {
                moonlet_rpc_client_begin(main_c, MOONLET_M_REPL_PORT, 0);
                moonlet_reply rep;
                if (!moonlet_rpc_client_call(main_c, &rep)) {
                    if (rep.code || !rep.result || rep.result->type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                        rep.result->via.u64 > 65535)
                        rport = 0;
                    else
                        rport = rep.result->via.u64;
                    moonlet_reply_destroy(&rep);
                }
            }
            moonlet_rpc_client_close(main_c);
            if (!rport || moonlet_rpc_client_connect(host, (uint16_t)rport, &co, &f->c)) {
                f->c = NULL;
                struct timespec ts = {0, 100 * 1000000L};
                nanosleep(&ts, NULL);
                continue;
            }
            snprintf(cur, sizeof(cur), "%s", ri.leader);
            need_snap = true;
        }
        if (need_snap) {
            int rc = take_snapshot(f, &epoch);
            if (rc) {
                if (!stopping(f))
                    ML_WARN(MOD, "snapshot from %s failed: %s", cur, moonlet_strerror(rc));
                drop_conn(f);
                struct timespec ts = {0, 100 * 1000000L};
                nanosleep(&ts, NULL);
                continue;
            }
            need_snap = false;
            pthread_mutex_lock(&f->mu);
            f->status.snapshots++;
            f->status.connected = true;
            f->status.epoch = epoch;
            snprintf(f->status.leader, sizeof(f->status.leader), "%s", cur);
            pthread_mutex_unlock(&f->mu);
            ML_INFO(MOD, "following %s (epoch %llu) from record %llu", cur,
                    (unsigned long long)epoch, (unsigned long long)f->from);
        }
        msgpack_packer *pk = moonlet_rpc_client_begin(f->c, MOONLET_M_REPL_FETCH, 4);
        moonlet_pack_cstr(pk, f->advertise);
        msgpack_pack_uint64(pk, f->from);
        msgpack_pack_uint64(pk, (uint64_t)f->o.fetch_wait_ms);
        msgpack_pack_uint64(pk, 4u << 20);
        moonlet_reply rep;
        int rc = moonlet_rpc_client_call(f->c, &rep);
        if (rc) {
            drop_conn(f);
            continue;
        }
        uint64_t ep = 0, next = 0;
        bool lost = false;
        const msgpack_object *b = NULL;
        rc = rep.code;
        if (!rc && (!rep.result || moonlet_wire_u64(rep.result, 0, &ep) ||
                    moonlet_wire_u64(rep.result, 1, &next) ||
                    moonlet_wire_bool(rep.result, 2, &lost) || !(b = bin_at(rep.result, 3))))
            rc = MOONLET_ERR_INVALID_PARAMS;
        bool locked = !rc;
        if (locked && !state_lock(f)) { /* stopped meanwhile: the state is not ours any more */
            moonlet_reply_destroy(&rep);
            continue;
        }
        uint64_t leader_ms = 0;
        if (!rc && !moonlet_wire_u64(rep.result, 4, &leader_ms) && leader_ms)
            moonlet_repl_state_note_leader_clock(
                f->st, (int64_t)leader_ms - (int64_t)(moonlet_clock_now_ns() / MOONLET_NS_PER_MS) - 1);
        if (!rc && (lost || ep != epoch)) {
            need_snap = true;
        } else if (!rc) {
            uint64_t n = 0;
            rc = apply_blob(f, (const uint8_t *)b->via.bin.ptr, b->via.bin.size, f->from,
                            BLOB_STREAM, &n);
            if (rc) {
                f->diverged = true;
                need_snap = true;
            } else {
                f->from += n;
            }
            pthread_mutex_lock(&f->mu);
            f->status.applied = f->from;
            f->status.leader_next = next;
            f->status.records += n;
            f->status.consistent = !f->diverged && f->from >= f->consistent_at;
            pthread_mutex_unlock(&f->mu);
        }
        if (locked)
            pthread_mutex_unlock(&f->smu);
        moonlet_reply_destroy(&rep);
        if (rc && !need_snap) {
            drop_conn(f);
            struct timespec ts = {0, 100 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (f->c)
        moonlet_rpc_client_close(f->c);
    f->c = NULL;
    pthread_mutex_lock(&f->mu);
    f->status.epoch = epoch;
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

int moonlet_repl_follower_start(const moonlet_repl_follower_opts *opts,
                                moonlet_repl_follower **out)
{
    moonlet_repl_follower *f = calloc(1, sizeof(*f));
    if (!f)
        return MOONLET_ERR_INTERNAL_ERROR;
    f->o = *opts;
    if (f->o.fetch_wait_ms <= 0)
        f->o.fetch_wait_ms = 200;
    snprintf(f->advertise, sizeof(f->advertise), "%s", opts->advertise ? opts->advertise : "");
    snprintf(f->token, sizeof(f->token), "%s", opts->auth_token ? opts->auth_token : "");
    pthread_mutex_init(&f->mu, NULL);
    pthread_mutex_init(&f->smu, NULL);
    int rc = moonlet_repl_state_create(&f->st);
    if (!rc && moonlet_thread_create(&f->thread, follow, f, "repl-follower") != 0)
        rc = MOONLET_ERR_INTERNAL_ERROR;
    if (rc) {
        moonlet_repl_state_destroy(f->st);
        pthread_mutex_destroy(&f->smu);
        pthread_mutex_destroy(&f->mu);
        free(f);
        return rc;
    }
    *out = f;
    return MOONLET_OK;
}

moonlet_repl_state *moonlet_repl_follower_stop(moonlet_repl_follower *f, bool *consistent,
                                               uint64_t *epoch)
{
    /* No join: the thread may be in a call to a leader that is gone (up to
     * its timeout), and the caller (the promotion, on the election's
     * thread) must not wait for that.  The state changes only under smu;
     * once handed, the thread leaves it alone and ends at its next check. */
    pthread_mutex_lock(&f->smu);
    bool was = f->handed;
    f->handed = true;
    *consistent = !was && !f->diverged && f->from >= f->consistent_at && f->consistent_at > 0;
    *epoch = was ? 0 : f->st_epoch;
    moonlet_repl_state *st = f->st;
    f->st = NULL;
    pthread_mutex_unlock(&f->smu);
    pthread_mutex_lock(&f->mu);
    f->stop = true;
    pthread_mutex_unlock(&f->mu);
    return st;
}

void moonlet_repl_follower_destroy(moonlet_repl_follower *f)
{
    if (!f)
        return;
    bool c;
    uint64_t e;
    moonlet_repl_state_destroy(moonlet_repl_follower_stop(f, &c, &e));
    pthread_join(f->thread, NULL);
    pthread_mutex_destroy(&f->smu);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

void moonlet_repl_follower_get_status(moonlet_repl_follower *f, moonlet_repl_follower_status *st)
{
    pthread_mutex_lock(&f->mu);
    *st = f->status;
    pthread_mutex_unlock(&f->mu);
}
