/*
 * repl_stream.c - the leader's record log with semi-synchronous waits and
 * the push stream to its standby, and the standby's follower thread
 * (repl_stream.h).
 *
 * The log is a ring of encoded records (seq, emit time, bytes), trimmed
 * from the oldest end beyond max_bytes.  mu guards it, the standby's
 * progress and the stream's state; cv wakes semi-sync waiters (an ack came,
 * a sender or reader role came free, the in-sync state changed); pcv wakes
 * the pusher thread.  `marking` serialises etcd marks, which run without mu.
 *
 * The stream (one socket, a struct rstream) is written and read without mu
 * by whichever thread holds its `sending` or `reading` role; the roles and
 * the socket's lifetime (refs: the log's own plus one per role holder) are
 * under mu.  A writer waiting for its records' ack takes the roles itself
 * when they are free: it sends what is unsent, then reads the standby's
 * acks, so a replicated write costs the standby's round trip and no thread
 * hand-off.  The pusher sends what no writer sent (records of operations
 * that do not wait), reads acks nobody reads, sends heartbeats, marks the
 * standby in sync once it caught up, and out of sync when it lags.
 */
#include "repl_stream.h"

#include <errno.h>
#include <msgpack.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "frame.h"
#include "log.h"
#include "methods.h"
#include "monotime.h"
#include "moonlet/error.h"
#include "net.h"
#include "rpc_client.h"
#include "wire.h"
#include "sync.h"
#include "thread.h"
#include "tls.h"

#define MOD "repl"

/* An idle stream's push, so that each end knows the other one is there. */
#define HEARTBEAT_MS 200
/* The pusher's period while records are unsent or unacknowledged, or were
 * emitted in the last IDLE_AFTER_MS; after that it sleeps until a heartbeat
 * is due or an emit wakes it. */
#define TICK_MS 2
#define IDLE_AFTER_MS 50
/* No ack for this long although records (or heartbeats) were sent: the
 * standby or the link is gone, and the stream is closed. */
#define DEAD_MS 2000
/* Another standby may take the stream over once the current one has not
 * acknowledged for this long. */
#define STANDBY_GONE_MS 1000
/* After an etcd mark of the pusher's failed (etcd unreachable), the next try. */
#define MARK_RETRY_MS 1000
#define PUSH_MAX_BYTES (4u << 20)
/* A standby that acknowledged all it was sent is taken in sync (writes wait
 * for it) when at most this many records remain to send. */
#define SYNC_BACKLOG_RECORDS 256u
#define ACK_BUF 4096u

struct lrec {
    uint64_t seq, t_ms;
    uint32_t len;
    uint8_t *bytes;
};

/* The push stream to the standby: one socket, written by the holder of
 * `sending`, read by the holder of `reading`, both without the log's mu. */
struct rstream {
    int fd;
    moonlet_tls *tls;   /* its TLS session (serialises its own calls), or NULL */
    unsigned refs;      /* the log's while current, plus one per role holder */
    bool sending, reading;
    uint64_t sent;      /* every record below it was written */
    uint64_t last_push_ms, last_ack_ms;
    moonlet_frame_builder out; /* the sending role's */
    char in[ACK_BUF];   /* the reading role's: acks not parsed yet */
    size_t in_len;
};

struct moonlet_repl_log {
    pthread_mutex_t mu;
    pthread_cond_t cv, pcv;
    moonlet_repl_log_opts o;
    struct lrec *ring;
    size_t cap, head, n; /* ring[head .. head+n) */
    size_t bytes;
    uint64_t next;       /* seq of the next record */
    uint64_t last_emit_ms;
    char standby[MOONLET_ROLE_ADDR_MAX];
    uint64_t acked;      /* standby applied every seq < acked */
    uint64_t last_ack_ms;
    /* in_sync: writes wait for the standby's acks; named: etcd names it in
     * sync (only once it acknowledged every record from sync_from on, which
     * is where in_sync began) */
    bool in_sync, named, marking;
    uint64_t sync_from;
    uint64_t mark_in_after_ms; /* no in-mark before (after a failed one) */
    uint64_t out_marks, in_marks;
    uint64_t sync_waits, sync_acked_on_entry, sync_wait_ns; /* moonlet_repl_log_status */
    uint64_t writer_pushes, pusher_pushes;
    /* the stream (NULL: none), and the one a ReplStream reply is opening */
    struct rstream *st;
    uint64_t epoch;
    uint64_t tickets, pending, pending_from;
    msgpack_zone zone;   /* parsing acks, under mu */
    pthread_t pusher;
    bool pstop, pidle;
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

static void *pusher_main(void *arg);

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
    if (!l->o.push_after_ms)
        l->o.push_after_ms = TICK_MS;
    if (!msgpack_zone_init(&l->zone, 1024)) {
        free(l);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    pthread_mutex_init(&l->mu, NULL);
    moonlet_cond_init_mono(&l->cv);
    moonlet_cond_init_mono(&l->pcv);
    l->next = 1;
    if (moonlet_thread_create(&l->pusher, pusher_main, l, "repl-push") != 0) {
        pthread_cond_destroy(&l->pcv);
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        msgpack_zone_destroy(&l->zone);
        free(l);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
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

/* Drops a reference; the last one closes the socket. */
static void stream_put(struct rstream *s)
{
    if (--s->refs)
        return;
    moonlet_tls_free(s->tls);
    close(s->fd);
    moonlet_frame_builder_destroy(&s->out);
    free(s);
}

/* The current stream is over: shut down, so that a role holder's I/O ends
 * at once, and dropped (its holders find it is not current any more).  A
 * standby that is still there connects again.  mu held. */
static void stream_end_locked(moonlet_repl_log *l, const char *why)
{
    struct rstream *s = l->st;
    if (!s)
        return;
    if (why)
        ML_WARN(MOD, "stream to standby %s closed: %s", l->standby, why);
    shutdown(s->fd, SHUT_RDWR);
    l->st = NULL;
    stream_put(s);
    pthread_cond_broadcast(&l->cv);
}

void moonlet_repl_log_destroy(moonlet_repl_log *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->pstop = true;
    pthread_cond_signal(&l->pcv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->pusher, NULL);
    pthread_mutex_lock(&l->mu);
    stream_end_locked(l, NULL);
    pthread_mutex_unlock(&l->mu);
    ring_clear(l);
    free(l->ring);
    msgpack_zone_destroy(&l->zone);
    pthread_cond_destroy(&l->pcv);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

void moonlet_repl_log_reset(moonlet_repl_log *l)
{
    pthread_mutex_lock(&l->mu);
    ring_clear(l);
    l->next++; /* a standby's old position is never valid again */
    stream_end_locked(l, NULL);
    l->pending = 0;
    l->standby[0] = 0;
    l->acked = 0;
    l->in_sync = l->named = false;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

uint64_t moonlet_repl_log_next(moonlet_repl_log *l)
{
    return moonlet_locked_u64(&l->mu, &l->next);
}

void moonlet_repl_log_pos(void *log, uint64_t *next, uint64_t *acked)
{
    moonlet_repl_log *l = log;
    pthread_mutex_lock(&l->mu);
    *next = l->next;
    *acked = l->acked;
    pthread_mutex_unlock(&l->mu);
}

/* A record lost: the standby's state can no longer be trusted.  mu held. */
static void lose_records_locked(moonlet_repl_log *l)
{
    ring_clear(l);
    l->next++;
    stream_end_locked(l, "a record could not be kept");
}

void moonlet_repl_log_emit(void *log, const moonlet_repl_rec *rec)
{
    moonlet_repl_log *l = log;
    uint8_t tmp[MOONLET_REPL_MAX_REC_BYTES];
    size_t len = moonlet_repl_encode(rec, tmp, sizeof(tmp));
    uint8_t *b = len ? malloc(len) : NULL;
    if (b)
        memcpy(b, tmp, len);
    uint64_t now = moonlet_mono_ms();
    pthread_mutex_lock(&l->mu);
    if (!b) {
        ML_ERR(MOD, "a replication record could not be kept: the standby starts over");
        lose_records_locked(l);
        pthread_mutex_unlock(&l->mu);
        return;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        struct lrec *r = malloc(cap * sizeof(*r));
        if (!r) {
            free(b);
            lose_records_locked(l);
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
        (struct lrec){.seq = l->next++, .t_ms = now, .len = (uint32_t)len, .bytes = b};
    l->n++;
    l->bytes += len;
    l->last_emit_ms = now;
    while (l->bytes > l->o.max_bytes && l->n > 1) {
        struct lrec *o = &l->ring[l->head];
        l->bytes -= o->len;
        free(o->bytes);
        l->head = (l->head + 1) % l->cap;
        l->n--;
    }
    if (l->pidle && l->st) { /* the pusher sleeps long: this record may have no writer */
        l->pidle = false;
        pthread_cond_signal(&l->pcv);
    }
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

/* Out of sync in etcd first, then alone.  0, or UNAVAILABLE when the mark
 * failed (the caller's write must not be acknowledged).  mu held. */
static int mark_out_locked(moonlet_repl_log *l, const char *why)
{
    int rc = mark_locked(l, false);
    if (rc == MOONLET_OK) {
        if (l->in_sync || l->named) {
            l->in_sync = l->named = false;
            l->out_marks++;
            ML_WARN(MOD, "standby %s %s: marked out of sync", l->standby, why);
        }
        pthread_cond_broadcast(&l->cv);
        return MOONLET_OK;
    }
    ML_ERR(MOD, "cannot mark standby %s out of sync: %s", l->standby, moonlet_strerror(rc));
    return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
}

int moonlet_repl_log_stream_open(moonlet_repl_log *l, const char *standby, uint64_t from,
                                 uint64_t epoch, bool *lost, uint64_t *next, uint64_t *ticket)
{
    *lost = false;
    *ticket = 0;
    pthread_mutex_lock(&l->mu);
    uint64_t now = moonlet_mono_ms();
    if (strcmp(l->standby, standby) != 0) {
        /* One hot standby: another one waits until the current one is gone. */
        if (l->standby[0] && l->st && now - l->st->last_ack_ms < STANDBY_GONE_MS) {
            pthread_mutex_unlock(&l->mu);
            return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
        }
        if (l->standby[0])
            ML_WARN(MOD, "standby %s replaces %s", standby, l->standby);
        if (l->in_sync || l->named) { /* the old one may be named in etcd: unname it first */
            if (l->marking || mark_out_locked(l, "is replaced") != MOONLET_OK || l->in_sync) {
                pthread_mutex_unlock(&l->mu);
                return MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS;
            }
        }
        stream_end_locked(l, NULL);
        snprintf(l->standby, sizeof(l->standby), "%s", standby);
        l->acked = 0;
    }
    *next = l->next;
    if (from > l->next || from < ring_first(l)) {
        *lost = true;
    } else {
        *ticket = l->pending = ++l->tickets;
        l->pending_from = from;
        l->epoch = epoch;
    }
    pthread_mutex_unlock(&l->mu);
    return MOONLET_OK;
}

void moonlet_repl_log_stream_attach(moonlet_repl_log *l, uint64_t ticket, int fd,
                                    moonlet_tls *tls)
{
    struct rstream *s = calloc(1, sizeof(*s));
    pthread_mutex_lock(&l->mu);
    uint64_t from = l->pending_from;
    if (!s || !ticket || ticket != l->pending || from < ring_first(l) || from > l->next) {
        pthread_mutex_unlock(&l->mu);
        free(s);
        moonlet_tls_free(tls);
        close(fd); /* the standby connects again */
        return;
    }
    l->pending = 0;
    stream_end_locked(l, l->st ? "the standby opened a new one" : NULL);
    s->fd = fd;
    s->tls = tls;
    s->refs = 1;
    s->sent = from;
    s->last_push_ms = s->last_ack_ms = l->last_ack_ms = moonlet_mono_ms();
    moonlet_frame_builder_init(&s->out);
    /* Its position now (lower than before if it started over): writes wait
     * for its replay, and it is consistent only after it (its own check). */
    l->acked = from;
    l->st = s;
    l->pidle = false;
    pthread_cond_signal(&l->pcv);
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

/* Sends the records the standby does not have yet, up to PUSH_MAX_BYTES
 * and, with born_before (the pusher's), only those emitted before that
 * time (none: a heartbeat), as one frame: a reply frame [id = first seq, 0,
 * [epoch, first seq, records (bin), leader_ms, next]] (docs/protocol.md).  Takes
 * the sending role for the send; mu held on entry and exit, not during it. */
static void push_locked(moonlet_repl_log *l, struct rstream *s, uint64_t born_before,
                        int64_t deadline_ms)
{
    uint64_t first = ring_first(l);
    if (s->sent < first) {
        stream_end_locked(l, "records it needs were trimmed from the log");
        return;
    }
    size_t idx = (size_t)(s->sent - first), total = 0, count = 0;
    for (size_t i = idx; i < l->n; i++) {
        const struct lrec *r = &l->ring[(l->head + i) % l->cap];
        size_t sz = 4 + r->len;
        if ((count && total + sz > PUSH_MAX_BYTES) || (born_before && r->t_ms >= born_before))
            break;
        total += sz;
        count++;
    }
    moonlet_frame_builder_reset(&s->out);
    msgpack_packer *pk = moonlet_reply_begin(&s->out, s->sent, 0);
    msgpack_pack_array(pk, 5);
    msgpack_pack_uint64(pk, l->epoch);
    msgpack_pack_uint64(pk, s->sent);
    msgpack_pack_bin(pk, total);
    for (size_t i = idx; i < idx + count; i++) {
        const struct lrec *r = &l->ring[(l->head + i) % l->cap];
        uint8_t hdr[4] = {(uint8_t)r->len, (uint8_t)(r->len >> 8), (uint8_t)(r->len >> 16),
                          (uint8_t)(r->len >> 24)};
        msgpack_pack_bin_body(pk, hdr, 4);
        msgpack_pack_bin_body(pk, r->bytes, r->len);
    }
    msgpack_pack_uint64(pk, moonlet_clock_now_ns() / MOONLET_NS_PER_MS); /* the leader's clock */
    msgpack_pack_uint64(pk, l->next);
    if (moonlet_frame_finish(&s->out, MOONLET_DEFAULT_MAX_FRAME) != 0) {
        stream_end_locked(l, "out of memory for a push");
        return;
    }
    s->sent += count;
    s->last_push_ms = moonlet_mono_ms();
    s->sending = true;
    s->refs++;
    pthread_mutex_unlock(&l->mu);
    uint64_t by = deadline_ms > 0 ? (uint64_t)deadline_ms : 0;
    int rc = s->tls ? moonlet_tls_io_by(s->tls, true, s->out.buf.data, s->out.buf.size, by)
                    : moonlet_net_io_by(s->fd, true, s->out.buf.data, s->out.buf.size, by);
    pthread_mutex_lock(&l->mu);
    s->sending = false;
    if (rc && s == l->st)
        stream_end_locked(l, "cannot send to it");
    stream_put(s);
    pthread_cond_broadcast(&l->cv); /* the role is free */
}

/* Parses the acks in s->in: request frames [id, ReplAck, [next]], `next`
 * being the standby's position (it applied every record below), its
 * arguments checked against the method table's ReplAck.  false: the stream
 * is bad.  mu held. */
static bool take_acks_locked(moonlet_repl_log *l, struct rstream *s)
{
    const moonlet_rpc_method_decl *ack = moonlet_master_method(MOONLET_M_REPL_ACK);
    size_t off = 0;
    bool ok = true;
    while (ok && s->in_len - off >= MOONLET_FRAME_HEADER_BYTES) {
        uint32_t len;
        if (moonlet_frame_header_decode((const uint8_t *)s->in + off,
                                        ACK_BUF - MOONLET_FRAME_HEADER_BYTES, &len) != 0) {
            ok = false;
            break;
        }
        if (s->in_len - off - MOONLET_FRAME_HEADER_BYTES < len)
            break;
        moonlet_request req;
        moonlet_args_repl_ack a = {0};
        uint64_t id;
        char why[1]; /* the stream ends either way; the reason is not kept */
        ok = moonlet_request_decode_ref(s->in + off + MOONLET_FRAME_HEADER_BYTES, len, &l->zone,
                                        &req, &id) == 0 &&
             req.method == MOONLET_M_REPL_ACK &&
             moonlet_rpc_args_decode(ack->name, ack->spec, req.args, &l->zone, 0, &a, why,
                                     sizeof(why)) == 0 &&
             a.next >= l->acked && a.next <= s->sent;
        msgpack_zone_clear(&l->zone);
        if (ok) {
            l->acked = a.next;
            s->last_ack_ms = l->last_ack_ms = moonlet_mono_ms();
        }
        off += MOONLET_FRAME_HEADER_BYTES + len;
    }
    memmove(s->in, s->in + off, s->in_len - off);
    s->in_len -= off;
    return ok;
}

/* Reads the acks that arrived, waiting for them until the deadline (now:
 * not at all).  Takes the reading role for the read; mu held on entry and
 * exit, not during it. */
static void read_acks_locked(moonlet_repl_log *l, struct rstream *s, int64_t deadline_ms)
{
    s->reading = true;
    s->refs++;
    pthread_mutex_unlock(&l->mu);
    int64_t left = deadline_ms - (int64_t)moonlet_mono_ms();
    struct pollfd pf = {.fd = s->fd, .events = POLLIN};
    ssize_t n = -1;
    int err = 0;
    bool decrypted = s->tls && moonlet_tls_pending(s->tls) > 0; /* poll would not see it */
    if (decrypted || poll(&pf, 1, left > 0 ? (int)left : 0) > 0) {
        n = s->tls ? moonlet_tls_read(s->tls, s->in + s->in_len, sizeof(s->in) - s->in_len)
                   : recv(s->fd, s->in + s->in_len, sizeof(s->in) - s->in_len, 0);
        err = n == 0 ? -1 : n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    }
    pthread_mutex_lock(&l->mu);
    s->reading = false;
    if (s == l->st) {
        if (err)
            stream_end_locked(l, n == 0 ? "the standby closed it" : "cannot read from it");
        else if (n > 0 && (s->in_len += (size_t)n, !take_acks_locked(l, s)))
            stream_end_locked(l, "it sent something that is not an ack");
    }
    stream_put(s);
    pthread_cond_broadcast(&l->cv); /* acks came, or the role is free */
}

/* The age of the oldest record the standby has not acknowledged.  mu held. */
static uint64_t lag_ms_locked(const moonlet_repl_log *l, uint64_t now)
{
    if (!l->standby[0] || l->acked >= l->next || l->acked < ring_first(l) || !l->n)
        return 0;
    const struct lrec *r = &l->ring[(l->head + (size_t)(l->acked - ring_first(l))) % l->cap];
    return now > r->t_ms ? now - r->t_ms : 0;
}

/* One round of the pusher: acks nobody reads, the standby's in-sync state,
 * records no writer sent, heartbeats, a dead standby.  Returns how long to
 * sleep.  mu held. */
static int pusher_round(moonlet_repl_log *l)
{
    uint64_t now = moonlet_mono_ms();
    struct rstream *s = l->st;
    if (!s)
        return HEARTBEAT_MS;
    if (!s->reading) { /* acks (of heartbeats too) nobody waits for */
        read_acks_locked(l, s, 0);
        if (!(s = l->st))
            return 0;
    }
    if (!l->marking && !l->in_sync && s->sent == l->acked &&
        l->next - l->acked <= SYNC_BACKLOG_RECORDS &&
        lag_ms_locked(l, now) <= l->o.max_lag_ms / 2) {
        /* It acknowledged all it was sent and the rest is small and young:
         * writes wait for it from now on (and send the rest themselves).
         * (Old records left unsent would have it out again at once.) */
        l->in_sync = true;
        l->sync_from = l->next;
    }
    if (!l->marking && l->in_sync && !l->named && l->acked >= l->sync_from &&
        now >= l->mark_in_after_ms) {
        /* ... and once it has everything the writes that did not wait
         * had, etcd names it: a promotion may then keep its state. */
        int rc = mark_locked(l, true);
        if (!l->in_sync) {
            /* marked out meanwhile: that mark's result stands */
        } else if (rc == MOONLET_ERR_NOT_LEADER) {
            /* refused (the fence failed, or not leading): not named */
            l->in_sync = false;
            l->mark_in_after_ms = moonlet_mono_ms() + MARK_RETRY_MS;
            ML_WARN(MOD, "cannot mark standby %s in sync: %s (again in %d ms)", l->standby,
                    moonlet_strerror(rc), MARK_RETRY_MS);
        } else if (rc) {
            /* Outcome unknown (a timeout: etcd may have applied it): maybe
             * named (issue 31 finding 4).  It stays in sync for the writes,
             * which keep waiting for its acks; only a successful
             * out-of-sync mark lets them go on alone.  Named once a later
             * mark succeeds. */
            l->mark_in_after_ms = moonlet_mono_ms() + MARK_RETRY_MS;
            ML_WARN(MOD, "cannot mark standby %s in sync: %s; it may be named: writes keep "
                    "waiting for it (again in %d ms)", l->standby, moonlet_strerror(rc),
                    MARK_RETRY_MS);
        } else {
            l->named = true;
            l->in_marks++;
            ML_INFO(MOD, "standby %s is in sync", l->standby);
        }
        pthread_cond_broadcast(&l->cv);
        return rc ? MARK_RETRY_MS : 0;
    }
    if (!l->marking && l->in_sync && lag_ms_locked(l, now) > l->o.max_lag_ms) {
        char why[64];
        snprintf(why, sizeof(why), "lags more than %llu ms", (unsigned long long)l->o.max_lag_ms);
        return mark_out_locked(l, why) ? MARK_RETRY_MS : 0;
    }
    /* Records younger than push_after_ms are left to the writes that will
     * wait for them (a push of the pusher's would be one more wake-up of
     * the standby and of that writer); older ones have no writer coming. */
    uint64_t born_before = now - (now < l->o.push_after_ms ? now : l->o.push_after_ms) + 1;
    bool due = s->sent < l->next &&
               (s->sent < ring_first(l) || /* trimmed: the push ends the stream */
                l->ring[(l->head + (size_t)(s->sent - ring_first(l))) % l->cap].t_ms < born_before);
    if (!s->sending && (due || now - s->last_push_ms >= HEARTBEAT_MS)) {
        l->pusher_pushes += due;
        push_locked(l, s, born_before, (int64_t)now + DEAD_MS);
        if (!(s = l->st))
            return 0;
    }
    if (s->last_push_ms > s->last_ack_ms && now - s->last_ack_ms > DEAD_MS) {
        stream_end_locked(l, "no ack for 2 s");
        return 0;
    }
    if (s->sent < l->next || s->sent > l->acked || now - l->last_emit_ms < IDLE_AFTER_MS)
        return TICK_MS;
    l->pidle = true;
    uint64_t since = now - s->last_push_ms;
    return since >= HEARTBEAT_MS ? 1 : (int)(HEARTBEAT_MS - since);
}

static void *pusher_main(void *arg)
{
    moonlet_repl_log *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->pstop) {
        int ms = pusher_round(l);
        if (ms > 0 && !l->pstop) {
            struct timespec ts;
            deadline_ts(&ts, (uint64_t)ms);
            pthread_cond_timedwait(&l->pcv, &l->mu, &ts);
        }
        l->pidle = false;
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
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
    int64_t deadline = (int64_t)moonlet_mono_ms() + (int64_t)l->o.max_lag_ms;
    int rc = MOONLET_OK;
    for (;;) {
        if (!l->in_sync || l->acked >= want)
            break;
        if (l->marking) { /* another thread is marking it; its result decides */
            pthread_cond_wait(&l->cv, &l->mu);
            continue;
        }
        struct rstream *s = l->st;
        bool in_time = (int64_t)moonlet_mono_ms() < deadline;
        if (s && in_time) {
            /* The roles, when free: send what is unsent, then read the acks. */
            if (s->sent < want && !s->sending) {
                l->writer_pushes++;
                push_locked(l, s, 0, deadline);
                continue;
            }
            if (s->sent >= want && !s->reading) {
                read_acks_locked(l, s, deadline);
                continue;
            }
            /* another thread holds the role: its broadcast wakes us */
            if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) != ETIMEDOUT)
                continue;
        }
        if (!l->in_sync || l->acked >= want || l->marking)
            continue;
        /* Past the bound, or no stream to the standby: out of sync in etcd
         * first, then alone. */
        char why[64];
        if (!s)
            snprintf(why, sizeof(why), "has no stream");
        else
            snprintf(why, sizeof(why), "lags more than %llu ms",
                     (unsigned long long)l->o.max_lag_ms);
        rc = mark_out_locked(l, why);
        if (rc)
            ML_ERR(MOD, "the write is not acknowledged");
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
    st->in_sync = l->named;
    st->streaming = l->st != NULL;
    st->next = l->next;
    st->acked = l->acked;
    st->lag_ms = lag_ms_locked(l, now);
    st->last_ack_age_ms = l->last_ack_ms ? now - l->last_ack_ms : 0;
    st->out_of_sync_marks = l->out_marks;
    st->in_sync_marks = l->in_marks;
    st->sync_waits = l->sync_waits;
    st->sync_acked_on_entry = l->sync_acked_on_entry;
    st->sync_wait_us = l->sync_wait_ns / 1000;
    st->writer_pushes = l->writer_pushes;
    st->pusher_pushes = l->pusher_pushes;
    pthread_mutex_unlock(&l->mu);
}

/* ---- the standby's follower ------------------------------------------------- */

struct moonlet_repl_follower {
    moonlet_repl_follower_opts o;
    char advertise[MOONLET_ROLE_ADDR_MAX];
    char token[1024 + 1];
    char peer_token[1024 + 1]; /* "": the replication server takes `token` */
    pthread_t thread;
    pthread_mutex_t mu;
    bool stop;
    /* the thread's own: the connection, and whether it carries the stream
     * (then nothing but pushes and acks: any trouble drops it) */
    moonlet_rpc_client *c;
    bool streaming;
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
    f->streaming = false;
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
        rc = snapshot ? moonlet_repl_state_apply_snapshot(f->st, &d.rec, kind == BLOB_SNAP_FIRST)
                      : moonlet_repl_state_apply(f->st, &d.rec);
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
        /* the leader's clock (a 6th element; a leader without it sends 5):
         * noted like a push's, so a promotion before the first push
         * restores the nodes' clock offsets instead of the lowest bound */
        uint64_t leader_ms = 0;
        if (!moonlet_wire_u64(rep.result, 5, &leader_ms) && leader_ms)
            moonlet_repl_state_note_leader_clock(
                f->st, (int64_t)leader_ms - (int64_t)(moonlet_clock_now_ns() / MOONLET_NS_PER_MS) - 1);
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

/* ReplStream [advertise, from] -> [epoch, next, lost]: from then on the
 * leader pushes on this connection.  UNAVAILABLE: another standby streams
 * (the connection stays usable). */
static int open_stream(moonlet_repl_follower *f, uint64_t epoch, bool *need_snap)
{
    msgpack_packer *pk = moonlet_rpc_client_begin(f->c, MOONLET_M_REPL_STREAM, 2);
    moonlet_pack_cstr(pk, f->advertise);
    msgpack_pack_uint64(pk, f->from);
    moonlet_reply rep;
    int rc = moonlet_rpc_client_call(f->c, &rep);
    if (rc)
        return rc;
    uint64_t ep = 0, next = 0;
    bool lost = false;
    rc = rep.code;
    if (!rc && (!rep.result || moonlet_wire_u64(rep.result, 0, &ep) ||
                moonlet_wire_u64(rep.result, 1, &next) || moonlet_wire_bool(rep.result, 2, &lost)))
        rc = MOONLET_ERR_INVALID_PARAMS;
    moonlet_reply_destroy(&rep);
    if (!rc && lost) {
        *need_snap = true; /* the leader has no stream from where we stand */
        return MOONLET_OK;
    }
    if (!rc && ep != epoch)
        rc = MOONLET_ERR_INVALID_PARAMS; /* a new term: start over, snapshot first */
    if (!rc) {
        f->streaming = true;
        pthread_mutex_lock(&f->mu);
        f->status.leader_next = next;
        pthread_mutex_unlock(&f->mu);
    }
    return rc;
}

/* One push of the stream (a reply frame [first, 0, [epoch, first, records
 * (bin), leader_ms, next]]) applied, then acknowledged with a ReplAck
 * [position] request frame.  Anything but the next push in order is an
 * error: the caller drops the connection and starts over with a snapshot. */
static int follow_push(moonlet_repl_follower *f, uint64_t epoch)
{
    moonlet_reply rep;
    int rc = moonlet_rpc_client_recv(f->c, &rep); /* the leader pushes at least every 200 ms */
    if (rc)
        return rc;
    uint64_t ep = 0, first = 0, leader_ms = 0, next = 0;
    const msgpack_object *b = NULL;
    rc = rep.code;
    if (!rc && (!rep.result || moonlet_wire_u64(rep.result, 0, &ep) ||
                moonlet_wire_u64(rep.result, 1, &first) || !(b = bin_at(rep.result, 2)) ||
                moonlet_wire_u64(rep.result, 3, &leader_ms) ||
                moonlet_wire_u64(rep.result, 4, &next)))
        rc = MOONLET_ERR_INVALID_PARAMS;
    if (!rc && (ep != epoch || first != f->from))
        rc = MOONLET_ERR_INVALID_PARAMS; /* a new term, or not where we stand */
    if (!rc && !state_lock(f))
        rc = MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS; /* stopped: the state is not ours */
    else if (!rc) {
        if (leader_ms)
            moonlet_repl_state_note_leader_clock(
                f->st, (int64_t)leader_ms - (int64_t)(moonlet_clock_now_ns() / MOONLET_NS_PER_MS) - 1);
        uint64_t n = 0;
        rc = apply_blob(f, (const uint8_t *)b->via.bin.ptr, b->via.bin.size, f->from, BLOB_STREAM,
                        &n);
        if (rc)
            f->diverged = true;
        else
            f->from += n;
        pthread_mutex_lock(&f->mu);
        f->status.applied = f->from;
        f->status.leader_next = next;
        f->status.records += n;
        f->status.consistent = !f->diverged && f->from >= f->consistent_at;
        pthread_mutex_unlock(&f->mu);
        pthread_mutex_unlock(&f->smu);
    }
    moonlet_reply_destroy(&rep);
    if (rc)
        return rc;
    msgpack_pack_uint64(moonlet_rpc_client_begin(f->c, MOONLET_M_REPL_ACK, 1), f->from);
    uint64_t id;
    return moonlet_rpc_client_send(f->c, &id);
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
            moonlet_rpc_client_opts co = {.timeout_ms = MOONLET_REPL_STREAM_TIMEOUT_MS,
                                          .auth_token = f->token[0] ? f->token : NULL,
                                          .auth_token_len = strlen(f->token),
                                          .tls = f->o.tls};
            moonlet_rpc_client_opts cp = co; /* the replication server: the peer token */
            if (f->peer_token[0]) {
                cp.auth_token = f->peer_token;
                cp.auth_token_len = strlen(f->peer_token);
            }
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
            if (!rport || moonlet_rpc_client_connect(host, (uint16_t)rport, &cp, &f->c)) {
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
        if (!f->streaming) {
            int rc = open_stream(f, epoch, &need_snap);
            if (rc == MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS) {
                /* another standby streams: wait until it is gone */
                struct timespec ts = {0, 500 * 1000000L};
                nanosleep(&ts, NULL);
            } else if (rc) {
                drop_conn(f);
            }
            continue;
        }
        if (follow_push(f, epoch) != MOONLET_OK) {
            need_snap = true; /* a new connection starts with a snapshot */
            drop_conn(f);
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
    snprintf(f->advertise, sizeof(f->advertise), "%s", opts->advertise ? opts->advertise : "");
    snprintf(f->token, sizeof(f->token), "%s", opts->auth_token ? opts->auth_token : "");
    snprintf(f->peer_token, sizeof(f->peer_token), "%s", opts->peer_token ? opts->peer_token : "");
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

/* The state is whole and in step: it replayed past its snapshot's end and
 * applied without divergence since (a connection dropped since does not
 * change that).  smu held. */
static bool restorable_locked(const moonlet_repl_follower *f)
{
    return !f->handed && !f->diverged && f->from >= f->consistent_at && f->consistent_at > 0;
}

bool moonlet_repl_follower_restorable(moonlet_repl_follower *f, uint64_t *epoch)
{
    pthread_mutex_lock(&f->smu);
    bool ok = restorable_locked(f);
    *epoch = ok ? f->st_epoch : 0;
    pthread_mutex_unlock(&f->smu);
    return ok;
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
    *consistent = restorable_locked(f);
    f->handed = true;
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
