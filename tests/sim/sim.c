/*
 * sim.c - a deterministic, seeded, single-threaded simulation of the master
 * pair (issue 31): a leader master (the library, no background thread, on
 * the frozen lease clock the simulation drives), a hot standby's state fed
 * the leader's replication records (master/ha/replicate.c) after a random lag,
 * in order, cut off by crashes, store nodes with one segment each, clients,
 * repair jobs, snapshots in parts and failovers (moonlet_ha_promote, as
 * master/ha/ha.c promotes), checked after every step against a model of the
 * bytes.
 *
 * What it owns: the model (nodes and the bytes of their segments, puts,
 * repair jobs, the record log, the standby's follower) and the masters it
 * creates.  It calls the master only through its public calls, plus
 * master_internal.h to walk the leader's tables for the overlap invariant.
 *
 * The byte model: each 64-byte unit of each segment records the put that
 * last wrote it (0: none).  A put's checksum is a function of its id; a
 * reader's checksum of what it read matches a put's only when every unit
 * read is that put's.
 *
 * Invariants (checked after every step, and at once after a promotion):
 *   I1 every put whose PutEnd was acknowledged, and that the leader has not
 *      removed, evicted or lost with its last replica, is on the leader
 *      (and on a promoted standby) sealed, and every readable replica on a
 *      live node holds its bytes;
 *   I2 no two live objects overlap, and no live object overlaps a
 *      quarantined or pooled range, on the leader or a promoted standby;
 *      no sealed object's replica overlaps a range another put may still
 *      write (its capability unexpired);
 *   I3 a Get of a key returns the bytes of a put of that key that was
 *      sealed, or an error (a checksum mismatch, a dead node);
 *   I4 at most one master serves at a time: at each failover the election
 *      is modelled on the lease (election.c's TTL, margin and grace, the
 *      windows computed by master/ha/role.c): the old leader's last keepalive,
 *      etcd's delay in taking it, the lease's expiry on etcd, the new
 *      leader's campaign and grace, and the old leader's clock running up
 *      to 2% slow (a crashed, or partitioned, leader); both roles' gates
 *      are asked every millisecond from the failover until the new
 *      leader's first renewal, and never both serve.  A frozen leader's
 *      clock stops, so it may serve again (that is what the epoch fence
 *      answers, I2/I3), and it is left out of I4.  The modelled times come
 *      from a random stream of their own (the paths of the other streams,
 *      and of every regression seed, are unchanged); --no-margin drops the
 *      old leader's fencing margin and the new leader's grace, to see I4
 *      fail.
 * A frozen leader (issue 31 section 3): a leader that crashed at a failover
 * may instead be frozen (a paused VM) and wake inside its old window: it
 * then hands out capabilities of its old epoch for ranges of its old state
 * (the worst case: its replies go out), and their writers write.  Store
 * nodes learn the newest epoch at Mount and Ping and refuse a capability of
 * an older one (what transport/xfer_tcp_server.c does; --no-fence turns the
 * refusal off, to see the hole).  Its writes are in the byte model, under
 * put ids from FROZEN_ID on, so I1-I3 see any that land; I2 counts its
 * unfenced capabilities as ranges a writer may still write.  It draws from
 * a random stream of its own: with the fence, the main stream, and so every
 * regression seed's path, is as before.
 * A deposed leader (--deposals): the leader loses etcd, is deposed, and
 * wins again with nobody else having led; it restores the copy of its
 * metadata it kept (master/ha/ha.c, moonlet_ha_keep: moonlet_master_snapshot
 * into a state, restored as a promotion with state), and I1-I3 hold on the
 * restored master as after a failover.  Drawn from a stream of its own in
 * the steps that do nothing else, and off by default, so every regression
 * seed's path is unchanged.
 * The standby's acknowledgements are modelled as the semi-synchronous
 * stream does them: a write's reply (PutStart, PutEnd, RepairFetch) goes
 * out once the standby applied its records, or at once while the standby
 * is out of sync (the leader marks it out); a failover with state happens
 * only while the standby is in sync (etcd names it), as ha.c decides.
 *
 * Usage: sim [--seed N | --seeds N [--first S]] [--steps M] [--polite]
 *           [--max-fail N] [--trace] [--records] [--no-fence] [--no-margin]
 *           [--deposals]
 *   default: the regression seeds, then 2000 seeds of 200 steps, stopping
 *   after --max-fail (5) failed seeds.  A failing seed prints its last
 *   steps and `--seed N` replays it alone; --trace prints every step (and
 *   the master's log), --records every record the standby applies.
 *   --polite: clients never send PutEnd / PutRevoke past their put's
 *   deadline (a search for holes other than finding 5).
 *
 * Locks: none of its own; single-threaded.  The clock is the library's
 * fake clock (lease/clock.h), shared by both masters.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "election.h"
#include "ha.h"
#include "log.h"
#include "master.h"
#include "master_internal.h"
#include "moonlet/error.h"
#include "replicate.h"
#include "role.h"

#define NNODES 4
#define SEG_BYTES (32u * 1024u)
#define UNIT 64u
#define NUNITS (SEG_BYTES / UNIT)
#define NKEYS 24
#define MAXREP 3
#define T0 (1000ull * 1000000000ull)
#define MS MOONLET_NS_PER_MS
#define PUT_TIMEOUT_MS 3000u
#define GRACE_MS 500u
#define LIVE_MS 1500u
#define REPAIR_TIMEOUT_MS 1500u
#define SHARDS 8u
#define TRACE_KEEP 60
#define FROZEN_ID 0x40000000u /* put ids of a frozen leader's puts (S.fputs) */
#define NFROZEN 64u

/* ---- deterministic randomness ------------------------------------------------ */

static bool g_records; /* --records: trace every record the standby applies */

/* One splitmix64 step of the stream *state. */
static uint64_t mix_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Three streams: the main one, the frozen leader's and the election's (see
 * above), so that drawing from one never moves another's path. */
static uint64_t g_rng, g_frng, g_erng, g_drng;
static uint32_t draw(uint64_t *state, uint32_t n) { return n ? (uint32_t)(mix_next(state) % n) : 0; }
static uint32_t below(uint32_t n) { return draw(&g_rng, n); }
static bool chance(uint32_t pct) { return below(100) < pct; }
static uint32_t fbelow(uint32_t n) { return draw(&g_frng, n); }
static uint32_t ebelow(uint32_t n) { return draw(&g_erng, n); }
static uint32_t dbelow(uint32_t n) { return draw(&g_drng, n); }

static bool g_nofence; /* --no-fence: nodes take capabilities of any epoch */
static bool g_nomargin; /* --no-margin: no fencing margin, no grace (I4's hole) */
static bool g_deposals; /* --deposals: the leader is deposed and wins again */

/* ---- the model --------------------------------------------------------------- */

struct node {
    bool alive;      /* the process runs (pings, serves its bytes) */
    bool mounted;    /* it mounted its segment and did not unmount it */
    uint32_t gen;    /* incarnation: a restart is a new client and segment */
    uint32_t seen_epoch; /* the newest leader epoch its Mount / Ping replies carried */
    char client[24], seg[24];
    uint32_t owner[NUNITS];
};

enum put_state { P_WAIT_START, P_OPEN, P_WAIT_END, P_SEALED, P_DONE };

struct put {
    uint32_t id, key, nrep, epoch;
    uint64_t size, deadline_ns, wait_pos;
    uint64_t master_put_id;   /* PutStart's put id: PutEnd / PutRevoke name it */
    enum put_state st;
    bool replied;             /* PutStart's reply reached the client: it may write */
    bool end_sent;            /* PutEnd sent: every write of it was acknowledged before */
    bool ck, end_ok, written[MAXREP];
    uint32_t node[MAXREP], gen[MAXREP];
    uint64_t off[MAXREP];
};

struct job {
    uint64_t id, wait_pos, deadline_ns, size, ck;
    uint32_t epoch, node, gen, nsrc;
    bool has_ck, open;
    uint64_t off;
    char src_seg[MOONLET_MAX_REPLICAS][24];
    uint64_t src_off[MOONLET_MAX_REPLICAS];
};

struct rec {
    uint8_t *buf;
    size_t len;
    uint64_t at_ns; /* delivered to the standby no earlier */
};

struct sim {
    uint64_t seed;
    uint32_t step, steps;
    uint32_t epoch;
    moonlet_master *m;            /* the leader */
    /* its record log (every record of this epoch) */
    struct rec *log;
    size_t nlog, log_cap;
    /* the standby's follower */
    moonlet_repl_state *st;
    size_t applied;               /* next record of the log to apply */
    bool alive, snapping, diverged;
    bool named;                   /* in sync: writes wait for it, a promotion keeps its state */
    uint64_t snap_cursor;
    size_t snap_start, consistent_at; /* consistent: applied >= consistent_at, not snapping */
    struct node nodes[NNODES];
    struct put *puts;
    uint32_t nputs, puts_cap;
    uint32_t sealed[NKEYS];       /* the key's acknowledged put (0: none) */
    struct job *jobs;
    uint32_t njobs, jobs_cap;
    char trace[TRACE_KEEP][160];  /* the last lines (a ring) */
    uint32_t ntrace;
    bool print_all;
    bool polite;                  /* clients never end or revoke past their deadline */
    bool failed;
    char why[512];
    uint32_t failovers, snapshots, late_ends, reads, deposals;
    /* a leader frozen at a failover (NULL: none), its epoch, and until when
     * it believes its window open; the puts it started since it woke */
    moonlet_master *frozen;
    uint32_t frozen_epoch;
    uint64_t frozen_until_ns;
    struct put fputs[NFROZEN];
    uint32_t nfputs, frozen_writes, fenced_writes;
};

static struct sim S;

static void trace(const char *fmt, ...)
{
    char *t = S.trace[S.ntrace++ % TRACE_KEEP];
    int n = snprintf(t, 160, "%4u t=%-6" PRIu64 " ", S.step,
                     (uint64_t)((moonlet_clock_now_ns() - T0) / MS));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t + n, (size_t)(160 - n), fmt, ap);
    va_end(ap);
    if (S.print_all)
        printf("  %s\n", t);
}

static void fail(const char *fmt, ...)
{
    if (S.failed)
        return;
    S.failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(S.why, sizeof(S.why), fmt, ap);
    va_end(ap);
}

static uint64_t put_ck(uint32_t id) { return 0xC0FFEE0000000000ull ^ ((uint64_t)id * 0x9E3779B97F4A7C15ull); }
static uint64_t units(uint64_t size) { return (size + UNIT - 1) / UNIT; }
/* The leader's view (repl_stream.c): once the standby replayed past its
 * snapshot and acknowledged everything sent, writes wait for it and etcd
 * names it in sync; a resync or a divergence marks it out. */
static bool in_sync(void)
{
    if (!S.named && S.alive && !S.snapping && !S.diverged && S.applied >= S.consistent_at &&
        S.applied == S.nlog)
        S.named = true;
    return S.named;
}
static void key_name(char *b, size_t n, uint32_t k) { snprintf(b, n, "k%u", k); }

/* The node and incarnation of a segment id "s<i>g<gen>"; false if none. */
static bool seg_node(const char *seg, uint32_t *node, uint32_t *gen)
{
    unsigned i, g;
    if (sscanf(seg, "s%ug%u", &i, &g) != 2 || i >= NNODES)
        return false;
    *node = i;
    *gen = g;
    return true;
}

/* The units of [off, +size) on a node's current segment, if it serves them. */
static uint32_t *bytes_at(uint32_t node, uint32_t gen, uint64_t off)
{
    struct node *n = &S.nodes[node];
    if (!n->alive || n->gen != gen || off >= SEG_BYTES)
        return NULL;
    return &n->owner[off / UNIT];
}

/* The one put whose bytes fill [off, +size) (0: none, or several). */
static uint32_t owner_of(const uint32_t *u, uint64_t size)
{
    uint64_t nu = units(size ? size : 1);
    for (uint64_t i = 1; i < nu; i++)
        if (u[i] != u[0])
            return 0;
    return u[0];
}

/* ---- the record log and the standby ------------------------------------------ */

static void emit(void *arg, const moonlet_repl_rec *rec)
{
    (void)arg;
    uint8_t tmp[MOONLET_REPL_MAX_REC_BYTES];
    size_t len = moonlet_repl_encode(rec, tmp, sizeof(tmp));
    if (!len) {
        fail("the leader emitted a record that does not encode (type %u)", rec->type);
        return;
    }
    if (S.nlog == S.log_cap) {
        S.log_cap = S.log_cap ? S.log_cap * 2 : 1024;
        S.log = realloc(S.log, S.log_cap * sizeof(*S.log));
    }
    uint64_t now = moonlet_clock_now_ns();
    uint64_t at = now + (uint64_t)below(300) * MS;
    if (S.nlog && S.log[S.nlog - 1].at_ns > at)
        at = S.log[S.nlog - 1].at_ns; /* in order */
    S.log[S.nlog].buf = malloc(len);
    memcpy(S.log[S.nlog].buf, tmp, len);
    S.log[S.nlog].len = len;
    S.log[S.nlog].at_ns = at;
    S.nlog++;
}

/* A frozen leader's records: its standby was promoted, nobody follows it. */
static void emit_nowhere(void *arg, const moonlet_repl_rec *rec)
{
    (void)arg;
    (void)rec;
}

static void repl_pos(void *arg, uint64_t *next, uint64_t *acked)
{
    (void)arg;
    *next = S.nlog;
    *acked = in_sync() ? S.applied : 0;
}

static void log_free(void)
{
    for (size_t i = 0; i < S.nlog; i++)
        free(S.log[i].buf);
    free(S.log);
    S.log = NULL;
    S.nlog = S.log_cap = 0;
}

/* Applies the log's records due by now (all: `all`), as the follower's
 * stream does: an error before consistent_at is the replay's overlap with
 * the snapshot, after it a divergence (the follower starts over). */
static void deliver(bool all)
{
    if (!S.alive || S.snapping || S.diverged)
        return;
    uint64_t now = moonlet_clock_now_ns();
    while (S.applied < S.nlog && (all || S.log[S.applied].at_ns <= now)) {
        moonlet_repl_decoded d;
        int rc = moonlet_repl_decode(S.log[S.applied].buf, S.log[S.applied].len, &d);
        if (!rc)
            rc = moonlet_repl_state_apply(S.st, &d.rec);
        if (g_records)
            trace("  apply #%zu type %u key %.*s nrep %u seg %.*s: %d", S.applied, d.rec.type,
                  (int)d.rec.key.len, d.rec.key.ptr, d.rec.nrep,
                  (int)(d.rec.nrep ? d.rec.rep_seg[0].len : d.rec.segment_id.len),
                  d.rec.nrep ? d.rec.rep_seg[0].ptr : d.rec.segment_id.ptr, rc);
        if (rc && S.applied < S.consistent_at)
            trace("standby: record %zu (type %u) skipped in the replay (%d)", S.applied,
                  S.log[S.applied].buf[0], rc);
        if (rc && S.applied >= S.consistent_at) {
            trace("standby: record %zu does not apply (%d): diverged, resync", S.applied, rc);
            S.diverged = true;
            S.named = false;
            return;
        }
        S.applied++;
    }
}

struct snapbuf {
    moonlet_repl_rec *recs;
    uint8_t **bufs;
    size_t n, cap;
};

static void snap_emit(void *arg, const moonlet_repl_rec *rec)
{
    struct snapbuf *b = arg;
    uint8_t tmp[MOONLET_REPL_MAX_REC_BYTES];
    size_t len = moonlet_repl_encode(rec, tmp, sizeof(tmp));
    if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 64;
        b->bufs = realloc(b->bufs, b->cap * sizeof(*b->bufs));
        b->recs = realloc(b->recs, b->cap * sizeof(*b->recs));
    }
    b->bufs[b->n] = malloc(len + 8);
    memcpy(b->bufs[b->n], &len, sizeof(len));
    memcpy(b->bufs[b->n] + 8, tmp, len);
    b->n++;
}

static bool snap_full(void *arg)
{
    (void)arg;
    return true; /* one shard per part: parts are walks at different steps */
}

/* One part of the follower's snapshot, applied as repl_stream.c does. */
static void snapshot_part(void)
{
    bool first = S.snap_cursor == 0;
    if (first) {
        moonlet_repl_state_clear(S.st);
        S.snap_start = S.nlog;
        S.consistent_at = (size_t)-1;
    }
    struct snapbuf b = {0};
    uint64_t next = 0;
    int rc = moonlet_master_snapshot_part(S.m, S.snap_cursor, snap_full, snap_emit, &b, &next);
    size_t nrec = b.n;
    for (size_t i = 0; i < b.n; i++) {
        size_t len;
        memcpy(&len, b.bufs[i], sizeof(len));
        moonlet_repl_decoded d;
        if (!rc)
            rc = moonlet_repl_decode(b.bufs[i] + 8, len, &d);
        if (!rc)
            rc = moonlet_repl_state_apply_snapshot(S.st, &d.rec, first);
        if (g_records)
            trace("  snapshot rec type %u key %.*s nrep %u seg %s: %d", d.rec.type,
                  (int)d.rec.key.len, d.rec.key.ptr, d.rec.nrep,
                  d.rec.type == MOONLET_REPL_MOUNT ? d.rec.seg->segment_id : "", rc);
        free(b.bufs[i]);
    }
    free(b.bufs);
    free(b.recs);
    trace("standby: snapshot part %" PRIu64 " (%zu records)%s", S.snap_cursor, nrec,
          rc ? " failed: start over" : "");
    if (rc) {
        S.snap_cursor = 0;
        return;
    }
    if (next == 0) {
        S.snapping = false;
        S.consistent_at = S.nlog;
        S.applied = S.snap_start;
        S.snapshots++;
        return;
    }
    S.snap_cursor = next;
}

static void standby_resync(const char *why)
{
    trace("standby: %s: snapshot from the start", why);
    S.snapping = true;
    S.diverged = false;
    S.named = false;
    S.alive = true;
    S.snap_cursor = 0;
    S.consistent_at = (size_t)-1;
}

/* ---- masters ------------------------------------------------------------------- */

static moonlet_master *master_new(void)
{
    moonlet_master_config cfg;
    moonlet_master_config_default(&cfg);
    cfg.shards = SHARDS;
    cfg.background = false;
    cfg.lease_ttl_ms = 1000;
    cfg.soft_pin_ttl_ms = 4000;
    cfg.client_live_ttl_ms = LIVE_MS;
    cfg.put_timeout_ms = PUT_TIMEOUT_MS;
    cfg.put_quarantine_grace_ms = GRACE_MS;
    cfg.eviction_high_watermark = 0.85;
    cfg.eviction_ratio = 0.1;
    cfg.hard_pin_max_ratio = 0.3;
    cfg.repair_timeout_ms = REPAIR_TIMEOUT_MS;
    cfg.repair_bandwidth = 1ull << 30;
    cfg.unmount_tick_budget = 1; /* unmounts go on across steps */
    cfg.repl_emit = emit;
    cfg.repl_pos = repl_pos;
    moonlet_master *m = NULL;
    if (moonlet_master_create(&cfg, &m) != MOONLET_OK) {
        fprintf(stderr, "sim: cannot create a master\n");
        exit(2);
    }
    moonlet_master_set_epoch(m, S.epoch); /* its capabilities carry it */
    return m;
}

/* A reply of the leader's reached node i: it knows the leader's epoch. */
static void node_learns(uint32_t i)
{
    if (S.nodes[i].seen_epoch < S.epoch)
        S.nodes[i].seen_epoch = S.epoch;
}

static int node_mount(uint32_t i)
{
    struct node *n = &S.nodes[i];
    moonlet_segment_desc d = {.client_id = n->client, .segment_id = n->seg, .name = n->seg,
                              .base = 0, .size = SEG_BYTES, .endpoint = n->seg,
                              .protocol = "tcp"};
    int rc = moonlet_master_mount_segment(S.m, &d);
    node_learns(i);
    return rc;
}

static void node_start(uint32_t i)
{
    struct node *n = &S.nodes[i];
    n->gen++;
    snprintf(n->client, sizeof(n->client), "n%ug%u", i, n->gen);
    snprintf(n->seg, sizeof(n->seg), "s%ug%u", i, n->gen);
    memset(n->owner, 0, sizeof(n->owner));
    n->alive = true;
    int rc = node_mount(i);
    n->mounted = rc == MOONLET_OK;
    trace("node %u: start as %s: mount %d", i, n->seg, rc);
}

/* ---- invariants ---------------------------------------------------------------- */

struct reps {
    uint32_t n;
    char seg[MOONLET_MAX_REPLICAS][24];
    uint64_t off[MOONLET_MAX_REPLICAS];
    uint8_t status[MOONLET_MAX_REPLICAS];
};

static void reps_visit(void *arg, const moonlet_replica_view *v)
{
    struct reps *r = arg;
    if (r->n >= MOONLET_MAX_REPLICAS)
        return;
    snprintf(r->seg[r->n], sizeof(r->seg[0]), "%s", v->segment_id);
    r->off[r->n] = v->offset;
    r->status[r->n] = v->status;
    r->n++;
}

/* I1 for the put the leader sealed last for key k (S.sealed): sealed on m,
 * and every readable replica on a live node holds its bytes.  `promoted`:
 * m is a promoted standby: a missing object is a loss if the put's PutEnd
 * was acknowledged (else its client got an error: it may be gone). */
static void check_acked(moonlet_master *m, uint32_t k, bool promoted)
{
    uint32_t pid = S.sealed[k];
    struct put *p = &S.puts[pid - 1];
    char key[16];
    key_name(key, sizeof(key), k);
    moonlet_key_view v;
    struct reps r = {0};
    int rc = moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR(key), &v, reps_visit, &r);
    bool must = !promoted || p->st == P_SEALED;
    if ((rc == MOONLET_OK && !v.complete && !must) || rc == MOONLET_ERR_OBJECT_NOT_FOUND) {
        if (must && promoted) {
            fail("I1: %s (put %u, PutEnd acknowledged) is missing on the promoted standby", key,
                 pid);
            return;
        }
        trace("%s: put %u gone from the %s (%s)", key, pid, promoted ? "promoted standby" : "leader",
              promoted ? "its PutEnd was not acknowledged" : "removed, evicted or lost");
        S.sealed[k] = 0;
        return;
    }
    if (rc || !v.complete) {
        fail("I1: %s (put %u, sealed) is %s on the %s", key, pid,
             rc ? "unreadable" : "not sealed", promoted ? "promoted standby" : "leader");
        return;
    }
    uint32_t live = 0;
    for (uint32_t i = 0; i < r.n; i++) {
        uint32_t node, gen;
        if (r.status[i] != MOONLET_REPLICA_COMPLETE || !seg_node(r.seg[i], &node, &gen))
            continue;
        const uint32_t *u = bytes_at(node, gen, r.off[i]);
        if (!u)
            continue; /* a dead node: a read fails, no wrong bytes */
        live++;
        uint32_t o = owner_of(u, p->size);
        if (o != pid) {
            fail("I1: %s (put %u, sealed) on the %s: replica %s@%" PRIu64
                 " holds the bytes of put %u", key, pid, promoted ? "promoted standby" : "leader",
                 r.seg[i], r.off[i], o);
            return;
        }
    }
    if (!live && !promoted) { /* its nodes died with its bytes: lost, as the leader will see */
        trace("%s: put %u has no replica on a live node: lost", key, pid);
        S.sealed[k] = 0;
    }
}

/* I2 on master m's own tables: no overlap of live objects with each other,
 * with quarantined ranges or with pooled ranges. */
static void check_overlaps(moonlet_master *m, const char *who)
{
    static uint32_t mark[64][NUNITS];
    uint32_t nslots = m->reg.nslots < 64 ? m->reg.nslots : 64;
    memset(mark, 0, sizeof(mark[0]) * nslots);
    for (uint32_t sl = 0; sl < nslots; sl++) {
        struct mseg *s = reg_seg(&m->reg, sl);
        if (!s || atomic_load(&s->state) == SEG_FREE || s->size != SEG_BYTES)
            continue;
        for (uint32_t q = 0; q < s->nquar; q++)
            for (uint64_t u = s->quar[q].offset / UNIT;
                 u < (s->quar[q].offset + s->quar[q].len + UNIT - 1) / UNIT && u < NUNITS; u++)
                mark[sl][u] = UINT32_MAX - 1; /* quarantined */
        for (uint32_t q = 0; q < s->npool; q++)
            for (uint64_t u = s->pool_off[q] / UNIT;
                 u < (s->pool_off[q] + s->pool_len) / UNIT && u < NUNITS; u++)
                mark[sl][u] = UINT32_MAX - 2; /* pooled */
    }
    uint32_t seq = 0;
    for (uint32_t i = 0; i < m->nshards && !S.failed; i++) {
        struct shard *sh = &m->shards[i];
        for (uint32_t b = 0; b <= sh->mask && !S.failed; b++)
            for (struct mobj *o = sh->buckets[b]; o && !S.failed; o = o->next) {
                seq++;
                for (uint32_t k = 0; k < o->nrep; k++) {
                    const struct mrep *rp = &mobj_creps(o)[k];
                    if (rp->seg >= nslots)
                        continue;
                    uint64_t len = moonlet_alloc_rounded(o->size ? o->size : 1);
                    for (uint64_t u = rp->offset / UNIT; u < (rp->offset + len) / UNIT && u < NUNITS; u++) {
                        if (mark[rp->seg][u]) {
                            uint32_t w = mark[rp->seg][u];
                            fail("I2: on the %s, object %.*s's replica at %s@%" PRIu64
                                 " overlaps %s", who, (int)o->key_len, o->key,
                                 reg_seg(&m->reg, rp->seg)->id, rp->offset,
                                 w == UINT32_MAX - 1 ? "a quarantined range"
                                 : w == UINT32_MAX - 2 ? "a pooled range" : "another object");
                            return;
                        }
                        mark[rp->seg][u] = seq;
                    }
                }
            }
    }
}

/* I2 against the model: a sealed object's readable replica never lies where
 * another put's writer may still write (capability unexpired). */
static void check_caps(moonlet_master *m)
{
    uint64_t now = moonlet_clock_now_ns();
    for (uint32_t k = 0; k < NKEYS && !S.failed; k++) {
        char key[16];
        key_name(key, sizeof(key), k);
        moonlet_key_view v;
        struct reps r = {0};
        if (moonlet_master_inspect_key(m, MOONLET_STR(""), MOONLET_STR(key), &v, reps_visit, &r) ||
            !v.complete)
            continue;
        for (uint32_t i = 0; i < r.n; i++) {
            uint32_t node, gen;
            if (!seg_node(r.seg[i], &node, &gen))
                continue;
            uint64_t a0 = r.off[i], a1 = a0 + moonlet_alloc_rounded(v.size ? v.size : 1);
            for (uint32_t q = 0; q < S.nputs + S.nfputs; q++) {
                struct put *p = q < S.nputs ? &S.puts[q] : &S.fputs[q - S.nputs];
                if (q >= S.nputs && ((!g_nofence && S.nodes[node].seen_epoch > p->epoch) ||
                                     !bytes_at(node, gen, a0)))
                    continue; /* a frozen leader's capability no node takes: refused by
                               * its epoch, or its node dead (a restart is a new segment) */
                if (p->key == k || now >= p->deadline_ns || !p->replied || p->end_sent)
                    continue;
                for (uint32_t j = 0; j < p->nrep; j++) {
                    uint64_t b0 = p->off[j], b1 = b0 + moonlet_alloc_rounded(p->size ? p->size : 1);
                    if (p->node[j] == node && p->gen[j] == gen && a0 < b1 && b0 < a1) {
                        fail("I2: %s's replica %s@%" PRIu64 " overlaps put %u's range %" PRIu64
                             " (of k%u), whose writer may still write", key, r.seg[i], a0, p->id,
                             b0, p->key);
                        return;
                    }
                }
            }
        }
    }
}

static void check_all(moonlet_master *m, bool promoted)
{
    for (uint32_t k = 0; k < NKEYS && !S.failed; k++)
        if (S.sealed[k])
            check_acked(m, k, promoted);
    if (!S.failed)
        check_overlaps(m, promoted ? "promoted standby" : "leader");
    if (!S.failed)
        check_caps(m);
}

/* ---- replies: what the standby must have applied first ----------------------- */

static bool released(uint64_t wait_pos, uint32_t epoch)
{
    return epoch == S.epoch && (!in_sync() || S.applied >= wait_pos);
}

static void settle(void)
{
    for (uint32_t i = 0; i < S.nputs; i++) {
        struct put *p = &S.puts[i];
        if (p->st == P_WAIT_START && released(p->wait_pos, p->epoch)) {
            p->st = P_OPEN;
            p->replied = true;
        } else if (p->st == P_WAIT_END && released(p->wait_pos, p->epoch)) {
            p->st = P_SEALED;
            trace("k%u: put %u acknowledged", p->key, p->id);
        }
    }
    for (uint32_t i = 0; i < S.njobs; i++)
        if (!S.jobs[i].open && S.jobs[i].epoch == S.epoch && released(S.jobs[i].wait_pos, S.epoch))
            S.jobs[i].open = true;
}

/* ---- steps --------------------------------------------------------------------- */

struct start_ctx {
    struct put *p;
};

static void start_visit(void *arg, const moonlet_replica_view *v)
{
    struct put *p = ((struct start_ctx *)arg)->p;
    uint32_t node, gen;
    if (p->nrep >= MAXREP || !seg_node(v->segment_id, &node, &gen))
        return;
    p->node[p->nrep] = node;
    p->gen[p->nrep] = gen;
    p->off[p->nrep] = v->offset;
    p->deadline_ns = moonlet_clock_now_ns() + v->put_ttl_ms * MS;
    p->nrep++;
}

static struct put *put_new(void)
{
    if (S.nputs == S.puts_cap) {
        S.puts_cap = S.puts_cap ? S.puts_cap * 2 : 256;
        S.puts = realloc(S.puts, S.puts_cap * sizeof(*S.puts));
    }
    struct put *p = &S.puts[S.nputs];
    memset(p, 0, sizeof(*p));
    p->id = ++S.nputs;
    return p;
}

static void op_put_start(void)
{
    uint32_t k = below(NKEYS);
    char key[16];
    key_name(key, sizeof(key), k);
    struct put *p = put_new();
    p->key = k;
    p->size = 1 + below(chance(70) ? 1024 : 6000);
    p->epoch = S.epoch;
    uint32_t want = 1 + below(MAXREP);
    bool covered = false;
    moonlet_master_put_opts po = {.replica_num = want, .soft_pin = chance(20),
                                  .hard_pin = chance(5), .covered = &covered,
                                  .put_id = &p->master_put_id};
    struct start_ctx c = {p};
    int rc = moonlet_master_put_start_opts(S.m, MOONLET_STR(""), MOONLET_STR(key), p->size, &po,
                                           start_visit, &c);
    if (rc) {
        S.nputs--; /* nothing to write */
        trace("%s: PutStart %" PRIu64 " B x%u: %d", key, p->size, want, rc);
        return;
    }
    p->wait_pos = covered ? 0 : S.nlog;
    p->st = P_WAIT_START;
    trace("%s: PutStart put %u, %" PRIu64 " B x%u%s -> s%ug%u@%" PRIu64 "%s", key, p->id, p->size,
          p->nrep, covered ? " (reserved)" : "", p->node[0], p->gen[0], p->off[0],
          p->nrep > 1 ? " ..." : "");
}

/* Writes replica j of put p if the node accepts it (alive, same segment,
 * capability unexpired). */
static bool write_rep(struct put *p, uint32_t j)
{
    uint32_t *u = bytes_at(p->node[j], p->gen[j], p->off[j]);
    if (!u || moonlet_clock_now_ns() >= p->deadline_ns)
        return false;
    for (uint64_t i = 0; i < units(p->size) && p->off[j] / UNIT + i < NUNITS; i++)
        u[i] = p->id;
    return true;
}

static struct put *pick_put(bool (*ok)(const struct put *))
{
    uint32_t n = 0, cand[64];
    for (uint32_t i = S.nputs; i-- > 0 && n < 64;)
        if (ok(&S.puts[i]))
            cand[n++] = i;
    return n ? &S.puts[cand[below(n)]] : NULL;
}

static bool is_open(const struct put *p)
{
    return p->st == P_OPEN && !(S.polite && moonlet_clock_now_ns() >= p->deadline_ns);
}
static bool may_write(const struct put *p)
{
    return p->replied && !p->end_sent && moonlet_clock_now_ns() < p->deadline_ns;
}

static void op_write(void)
{
    struct put *p = pick_put(is_open);
    if (!p)
        return;
    uint32_t j = below(p->nrep);
    bool ok = write_rep(p, j);
    p->written[j] |= ok;
    trace("k%u: put %u writes replica %u (s%ug%u@%" PRIu64 "): %s", p->key, p->id, j, p->node[j],
          p->gen[j], p->off[j], ok ? "ok" : "refused");
    if (!ok && chance(60)) {
        char key[16];
        key_name(key, sizeof(key), p->key);
        int rc = moonlet_master_put_revoke_ex(S.m, MOONLET_STR(""), MOONLET_STR(key),
                                              &p->master_put_id);
        p->st = P_DONE;
        trace("k%u: put %u revoked after a failed write: %d", p->key, p->id, rc);
    }
}

/* A write that arrives late: any put whose capability is still valid. */
static void op_late_write(void)
{
    struct put *p = pick_put(may_write);
    if (!p)
        return;
    uint32_t j = below(p->nrep);
    const char *outcome = write_rep(p, j) ? "landed" : "refused";
    trace("k%u: put %u (state %d) late write of replica %u (s%ug%u@%" PRIu64 "): %s", p->key,
          p->id, p->st, j, p->node[j], p->gen[j], p->off[j], outcome);
}

static void op_put_end(void)
{
    struct put *p = pick_put(is_open);
    if (!p)
        return;
    for (uint32_t j = 0; j < p->nrep; j++)
        if (!p->written[j])
            return; /* a client ends only what it wrote */
    char key[16];
    key_name(key, sizeof(key), p->key);
    uint64_t ck = put_ck(p->id);
    p->ck = chance(60);
    p->end_sent = true;
    bool late = moonlet_clock_now_ns() >= p->deadline_ns;
    int rc = moonlet_master_put_end_ex(S.m, MOONLET_STR(""), MOONLET_STR(key), p->ck ? &ck : NULL,
                                       &p->master_put_id);
    S.late_ends += late;
    trace("%s: PutEnd put %u%s%s: %d", key, p->id, p->ck ? " (checksum)" : "",
          late ? " LATE (after its deadline)" : "", rc);
    if (rc) {
        p->st = P_DONE;
        return;
    }
    p->end_ok = true;
    p->st = P_WAIT_END;
    p->wait_pos = S.nlog;
    S.sealed[p->key] = p->id; /* the leader's object of the key from now on */
}

static void op_put_revoke(void)
{
    struct put *p = pick_put(is_open);
    if (!p)
        return;
    char key[16];
    key_name(key, sizeof(key), p->key);
    int rc = moonlet_master_put_revoke_ex(S.m, MOONLET_STR(""), MOONLET_STR(key),
                                          &p->master_put_id);
    p->st = P_DONE;
    trace("%s: PutRevoke put %u: %d", key, p->id, rc);
}

static void op_get(void)
{
    uint32_t k = below(NKEYS);
    char key[16];
    key_name(key, sizeof(key), k);
    struct reps r = {0};
    uint64_t size = 0, ck = 0;
    bool has_ck = false;
    int rc = moonlet_master_get_replica_list_ck(S.m, MOONLET_STR(""), MOONLET_STR(key), &size,
                                                NULL, &has_ck, &ck, reps_visit, &r);
    if (rc) {
        trace("%s: Get: %d", key, rc);
        return;
    }
    S.reads++;
    for (uint32_t i = 0; i < r.n; i++) {
        uint32_t node, gen;
        if (!seg_node(r.seg[i], &node, &gen))
            continue;
        const uint32_t *u = bytes_at(node, gen, r.off[i]);
        if (!u)
            continue;
        uint32_t o = owner_of(u, size);
        if (has_ck && (!o || put_ck(o) != ck))
            continue; /* the checksum refuses it: an error, no wrong bytes */
        const struct put *q = o && o < FROZEN_ID ? &S.puts[o - 1] : NULL;
        if (!q || q->key != k || !q->end_ok) {
            fail("I3: Get %s read replica %s@%" PRIu64 " holding %s%u%s%s", key, r.seg[i],
                 r.off[i], o ? "the bytes of put " : "no put's bytes", o,
                 q && q->key != k ? " of another key" : "",
                 q && q->key == k && !q->end_ok ? " (never sealed)" : "");
            return;
        }
    }
    trace("%s: Get: %u replicas, checksum %s", key, r.n, has_ck ? "on" : "off");
}

static void op_remove(void)
{
    uint32_t k = below(NKEYS);
    char key[16];
    key_name(key, sizeof(key), k);
    bool force = chance(30);
    int rc = moonlet_master_remove_ex(S.m, MOONLET_STR(""), MOONLET_STR(key), force);
    if (rc == MOONLET_OK)
        S.sealed[k] = 0;
    trace("%s: Remove%s: %d", key, force ? " (forced)" : "", rc);
}

static void op_node(void)
{
    uint32_t i = below(NNODES);
    struct node *n = &S.nodes[i];
    uint32_t what = below(10);
    if (!n->alive) {
        node_start(i);
    } else if (what < 4) {
        n->alive = false;
        trace("node %u (%s): crash", i, n->seg);
    } else if (what < 6) {
        int rc = moonlet_master_unmount_segment(S.m, MOONLET_STR(n->client), MOONLET_STR(n->seg));
        n->alive = false;
        n->mounted = false;
        trace("node %u (%s): unmount and stop: %d", i, n->seg, rc);
    } else {
        bool on = what < 9;
        uint32_t segs = 0;
        int rc = moonlet_master_drain(S.m, MOONLET_STR(n->seg), on, &segs);
        trace("node %u (%s): %s: %d", i, n->seg, on ? "drain" : "undrain", rc);
    }
}

struct fetch_ctx {
    uint32_t node, gen;
};

static void fetch_visit(void *arg, const moonlet_repair_job_view *v)
{
    struct fetch_ctx *c = arg;
    if (S.njobs == S.jobs_cap) {
        S.jobs_cap = S.jobs_cap ? S.jobs_cap * 2 : 64;
        S.jobs = realloc(S.jobs, S.jobs_cap * sizeof(*S.jobs));
    }
    struct job *j = &S.jobs[S.njobs++];
    memset(j, 0, sizeof(*j));
    j->id = v->job_id;
    j->epoch = S.epoch;
    j->node = c->node;
    j->gen = c->gen;
    j->size = v->size;
    j->has_ck = v->has_checksum;
    j->ck = v->checksum;
    j->off = v->target->offset;
    j->deadline_ns = moonlet_clock_now_ns() + v->target->put_ttl_ms * MS;
    for (uint32_t i = 0; i < v->nsources && j->nsrc < MOONLET_MAX_REPLICAS; i++) {
        snprintf(j->src_seg[j->nsrc], sizeof(j->src_seg[0]), "%s", v->sources[i].segment_id);
        j->src_off[j->nsrc++] = v->sources[i].offset;
    }
}

static void op_repair_fetch(void)
{
    uint32_t i = below(NNODES);
    struct node *n = &S.nodes[i];
    if (!n->alive)
        return;
    struct fetch_ctx c = {i, n->gen};
    uint32_t before = S.njobs;
    int rc = moonlet_master_repair_fetch(S.m, MOONLET_STR(n->client), 0, 4, fetch_visit, &c);
    for (uint32_t k = before; k < S.njobs; k++)
        S.jobs[k].wait_pos = S.nlog;
    trace("node %u: RepairFetch: %d, %u jobs", i, rc, S.njobs - before);
}

/* A node runs a fetched job: copies a source's bytes (checked against the
 * checksum), writes its target while the capability holds, reports. */
static void op_repair_done(void)
{
    uint32_t cand[64], nc = 0;
    for (uint32_t i = 0; i < S.njobs && nc < 64; i++)
        if (S.jobs[i].open)
            cand[nc++] = i;
    if (!nc)
        return;
    uint32_t ji = cand[below(nc)];
    struct job j = S.jobs[ji];
    S.jobs[ji] = S.jobs[--S.njobs];
    struct node *n = &S.nodes[j.node];
    uint32_t what = below(10);
    if (what == 0) {
        trace("job %" PRIu64 ": the node never reports", j.id);
        return;
    }
    int code = what == 1 ? MOONLET_ERR_TRANSFER_FAIL : MOONLET_OK;
    const uint32_t *src = NULL;
    for (uint32_t s = 0; s < j.nsrc && !src && !code; s++) {
        uint32_t node, gen;
        if (seg_node(j.src_seg[s], &node, &gen))
            src = bytes_at(node, gen, j.src_off[s]);
    }
    if (!code && !src)
        code = MOONLET_ERR_TRANSFER_FAIL;
    if (!code && j.has_ck) {
        uint32_t o = owner_of(src, j.size);
        if (!o || put_ck(o) != j.ck)
            code = MOONLET_ERR_TRANSFER_FAIL; /* the copy fails its checksum */
    }
    uint32_t *dst = bytes_at(j.node, j.gen, j.off);
    if (!code && (!dst || moonlet_clock_now_ns() >= j.deadline_ns))
        code = MOONLET_ERR_WRITE_FAIL;
    if (!code)
        memmove(dst, src, units(j.size) * sizeof(*dst));
    int rc = n->alive && n->gen == j.gen
                 ? moonlet_master_repair_done(S.m, MOONLET_STR(n->client), 0, j.id, code, j.size)
                 : MOONLET_ERR_RPC_FAIL;
    trace("job %" PRIu64 " (s%ug%u@%" PRIu64 "): copy %d, RepairDone %d", j.id, j.node, j.gen,
          j.off, code, rc);
}

/* I4: the election of the failover, on the lease as election.c runs it and
 * with the windows role.c computes.  Times in ms on the new leader's (and
 * etcd's) clock; the old leader's runs up to 2% slow. */
#define ELECT_TTL_MS 2000u
static void check_election(bool frozen)
{
    if (frozen)
        return; /* its clock stopped: the epoch fence answers it (I2, I3) */
    uint64_t ttl = ELECT_TTL_MS, margin = g_nomargin ? 0 : ttl / 4; /* election.c's default */
    uint64_t grace = g_nomargin ? 0 : ttl, tick = ttl / 3;
    uint64_t poll = moonlet_election_poll_ms(ttl);
    uint64_t now = moonlet_clock_now_ns() / MS;
    uint64_t sent = now - ebelow((uint32_t)tick);  /* its last keepalive etcd took */
    uint64_t received = sent + ebelow(200);       /* when etcd took it */
    uint64_t expiry = received + ttl;             /* the lease on etcd */
    uint64_t t0 = expiry + ebelow((uint32_t)poll) + ebelow(100); /* poll, then the campaign */
    uint32_t slow_ppm = ebelow(20001);             /* the old leader's clock: up to 2% slow */
    moonlet_role *old = NULL, *nw = NULL;
    if (moonlet_role_create("old:1", &old) || moonlet_role_create("new:1", &nw)) {
        fail("I4: no role");
        goto out;
    }
    moonlet_role_elected(old, S.epoch, now > ttl ? now - ttl : 0, sent + ttl - margin);
    moonlet_role_renewed(old, sent + ttl - margin);
    moonlet_role_elected(nw, S.epoch + 1, t0 + grace, t0 + ttl - margin);
    uint64_t e;
    for (uint64_t t = now; t < t0 + grace + ttl; t++) {
        uint64_t old_t = now + (t - now) * (1000000 - slow_ppm) / 1000000;
        if (moonlet_role_gate(old, old_t, &e) && moonlet_role_gate(nw, t, &e)) {
            fail("I4: two masters serve at %" PRIu64 " ms: epoch %u (its last keepalive sent "
                 "at %" PRIu64 ", its clock %u ppm slow) and epoch %u (elected at %" PRIu64
                 ", lease expired at %" PRIu64 ")", t, S.epoch, sent, slow_ppm, S.epoch + 1, t0,
                 expiry);
            break;
        }
    }
    trace("  election: old window ends %" PRIu64 " (its clock), lease expires %" PRIu64
          ", new leader elected %" PRIu64 ", serves from %" PRIu64, sent + ttl - margin, expiry,
          t0, t0 + grace);
out:
    moonlet_role_destroy(old);
    moonlet_role_destroy(nw);
}

/* The next term: the old term's records go, and a fresh master is promoted
 * with `st` (named in sync, consistent) as ha.c's on_elected does. */
static bool promote_new(const moonlet_repl_state *st, uint64_t *restored)
{
    log_free();
    S.epoch++;
    S.applied = 0;
    S.m = master_new();
    moonlet_ha_promotion pr = {.epoch = S.epoch, .followed = S.epoch - 1, .named = true,
                               .consistent = true, .liveness_hold_ms = LIVE_MS};
    return moonlet_ha_promote(S.m, st, &pr, restored);
}

/* After a promotion: replies the old term had not sent are errors to their
 * clients, the nodes learn the new leader (remounting what it lacks), the
 * invariants hold on it, and a new standby starts from a snapshot. */
static void new_term(void)
{
    for (uint32_t i = 0; i < S.nputs; i++)
        if (S.puts[i].st == P_WAIT_START || S.puts[i].st == P_WAIT_END)
            S.puts[i].st = P_DONE;
    for (uint32_t i = 0; i < NNODES; i++)
        if (S.nodes[i].alive) {
            uint32_t segs = 0;
            moonlet_master_ping(S.m, MOONLET_STR(S.nodes[i].client), &segs);
            node_learns(i);
            if (!segs && S.nodes[i].mounted)
                trace("node %u: remount on the new leader: %d", i, node_mount(i));
        }
    check_all(S.m, true);
    standby_resync("a new leader");
}

static void op_failover(void)
{
    if (!in_sync()) {
        trace("failover refused: the standby is not named in sync");
        return;
    }
    /* The leader crashes: records the standby has not applied are lost. */
    trace("FAILOVER: leader of epoch %u crashes (%zu of %zu records applied)", S.epoch, S.applied,
          S.nlog);
    moonlet_master *old = S.m;
    moonlet_repl_state *st = S.st;
    S.st = NULL;
    uint64_t restored = 0;
    bool with_state = promote_new(st, &restored);
    moonlet_repl_state_destroy(st);
    if (S.frozen)
        moonlet_master_destroy(S.frozen);
    S.frozen = NULL;
    if (fbelow(2)) { /* not crashed: frozen, it wakes inside its window */
        S.frozen = old;
        old->cfg.repl_emit = emit_nowhere; /* its stream went with its term */
        S.frozen_epoch = S.epoch - 1;
        S.frozen_until_ns = moonlet_clock_now_ns() + 2ull * PUT_TIMEOUT_MS * MS;
        trace("  (the old leader is frozen, not dead: it wakes within its window)");
    } else {
        moonlet_master_destroy(old);
    }
    check_election(S.frozen != NULL);
    S.failovers++;
    trace("promoted with state: %d, %" PRIu64 " objects restored", with_state, restored);
    moonlet_repl_state_create(&S.st);
    new_term();
}

/* moonlet_master_snapshot's records into the kept state (as ha.c's keep_rec). */
static void keep_emit(void *arg, const moonlet_repl_rec *rec)
{
    moonlet_repl_state *st = arg;
    if (!S.failed && moonlet_repl_state_apply_snapshot(st, rec, true))
        fail("the deposed leader's snapshot did not apply to its kept state");
}

/* The leader is deposed (it lost etcd) and wins again, nobody else having
 * led: a new master restores the copy of the metadata the old one kept
 * (ha.c: moonlet_ha_keep, then on_elected).  Replies it had not sent are
 * errors to their clients; its stream ends with its term. */
static void op_deposed(void)
{
    trace("DEPOSED: the leader of epoch %u loses etcd and wins again", S.epoch);
    moonlet_repl_state *kept = NULL;
    moonlet_repl_state_create(&kept);
    moonlet_master_snapshot(S.m, keep_emit, kept);
    moonlet_repl_state_note_leader_clock(kept, 0);
    moonlet_master *old = S.m;
    uint64_t restored = 0;
    bool with_state = promote_new(kept, &restored);
    moonlet_repl_state_destroy(kept);
    moonlet_master_destroy(old);
    S.deposals++;
    trace("restored what it kept: %d, %" PRIu64 " objects", with_state, restored);
    moonlet_repl_state_destroy(S.st);
    moonlet_repl_state_create(&S.st);
    new_term();
}

static void op_standby(void)
{
    if (below(2))
        standby_resync("the standby crashes and restarts");
    else
        standby_resync("the stream drops");
}

static void pings(void)
{
    for (uint32_t i = 0; i < NNODES; i++) {
        struct node *n = &S.nodes[i];
        if (!n->alive || !n->mounted)
            continue;
        uint32_t segs = 0;
        moonlet_master_ping(S.m, MOONLET_STR(n->client), &segs);
        node_learns(i);
        if (segs == 0) { /* the master forgot it (declared it dead): mounts again */
            int rc = node_mount(i);
            trace("node %u: the master forgot %s: mount again %d", i, n->seg, rc);
        }
    }
}

/* ---- the frozen leader ------------------------------------------------------------ */

static void frozen_visit(void *arg, const moonlet_replica_view *v)
{
    start_visit(arg, v);
}

/* The frozen leader, awake inside its old window: a PutStart on its old
 * state (its reply reaches the client), or a write with one of its
 * capabilities, which a node takes only if it has seen no newer epoch. */
static void frozen_step(void)
{
    if (!S.frozen || moonlet_clock_now_ns() >= S.frozen_until_ns || fbelow(100) >= 30)
        return;
    if (S.nfputs < NFROZEN && (S.nfputs == 0 || fbelow(2))) {
        struct put *p = &S.fputs[S.nfputs];
        memset(p, 0, sizeof(*p));
        p->id = FROZEN_ID + S.nfputs;
        p->key = fbelow(NKEYS);
        p->size = 1 + fbelow(2048);
        p->epoch = S.frozen_epoch;
        char key[16];
        key_name(key, sizeof(key), p->key);
        moonlet_master_put_opts po = {.replica_num = 1 + fbelow(MAXREP), .put_id = &p->master_put_id};
        struct start_ctx c = {p};
        int rc = moonlet_master_put_start_opts(S.frozen, MOONLET_STR(""), MOONLET_STR(key), p->size,
                                               &po, frozen_visit, &c);
        if (rc || !p->nrep)
            return;
        p->st = P_OPEN;
        p->replied = true;
        S.nfputs++;
        trace("frozen leader (epoch %u): PutStart %s put %u -> s%ug%u@%" PRIu64, p->epoch, key,
              p->id, p->node[0], p->gen[0], p->off[0]);
        return;
    }
    if (!S.nfputs)
        return;
    struct put *p = &S.fputs[fbelow(S.nfputs)];
    uint32_t j = fbelow(p->nrep);
    struct node *n = &S.nodes[p->node[j]];
    bool fenced = !g_nofence && n->seen_epoch > p->epoch;
    uint32_t *u = fenced ? NULL : bytes_at(p->node[j], p->gen[j], p->off[j]);
    if (u && moonlet_clock_now_ns() < p->deadline_ns) {
        for (uint64_t i = 0; i < units(p->size) && p->off[j] / UNIT + i < NUNITS; i++)
            u[i] = p->id;
        S.frozen_writes++;
    }
    S.fenced_writes += fenced;
    trace("frozen leader's put %u (epoch %u) writes s%ug%u@%" PRIu64 ": %s", p->id, p->epoch,
          p->node[j], p->gen[j], p->off[j],
          fenced ? "refused (the node has seen a newer epoch)" : u ? "landed" : "refused");
}

static void op_evict_now(void)
{
    uint64_t n = moonlet_master_evict_now(S.m, 0.2);
    trace("evict now: %" PRIu64 " objects", n);
}

/* What a step does, by a draw w from [0, 100): each op in turn takes its
 * weight's share of the draws (op_put_start w < 14, op_write the next 16,
 * ...); false when w is past them all (14 of 100). */
static bool op_weighted(uint32_t w)
{
    static const struct {
        uint32_t weight;
        void (*op)(void);
    } ops[] = {
        {14, op_put_start},
        {16, op_write},
        {11, op_put_end},
        {2, op_put_revoke},
        {4, op_late_write},
        {7, op_get},
        {3, op_remove},
        {2, op_evict_now},
        {8, op_node},
        {7, op_repair_fetch},
        {7, op_repair_done},
        {3, op_standby},
        {2, op_failover},
    };
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        if (w < ops[i].weight) {
            ops[i].op();
            return true;
        }
        w -= ops[i].weight;
    }
    return false;
}

/* ---- a run --------------------------------------------------------------------- */

static void run_reset(void)
{
    free(S.puts);
    free(S.jobs);
    memset(&S, 0, sizeof(S));
}

static bool g_polite;

static bool run(uint64_t seed, uint32_t steps, bool print_all, bool quiet)
{
    run_reset();
    S.polite = g_polite;
    S.seed = seed;
    S.steps = steps;
    S.print_all = print_all;
    g_rng = seed * 0xD1B54A32D192ED03ull + 1;
    g_frng = seed * 0x9FB21C651E98DF25ull + 7;
    g_erng = seed * 0xE7037ED1A0B428DBull + 11;
    g_drng = seed * 0x8CB92BA72F3D8DD7ull + 13;
    moonlet_clock_set_fake(T0);
    S.epoch = 1;
    S.m = master_new();
    moonlet_repl_state_create(&S.st);
    S.alive = true;
    for (uint32_t i = 0; i < NNODES; i++)
        node_start(i);
    standby_resync("the standby starts");
    for (S.step = 1; S.step <= steps && !S.failed; S.step++) {
        moonlet_clock_advance((uint64_t)below(chance(10) ? 1500 : 150) * MS);
        pings();
        if (S.snapping && chance(50))
            snapshot_part();
        deliver(false);
        if (S.diverged)
            standby_resync("diverged");
        if (!op_weighted(below(100))) {
            if (g_deposals && dbelow(4) == 0)
                op_deposed();
            else
                trace("nothing");
        }
        if (S.failed)
            break;
        frozen_step();
        if (chance(60)) /* the background thread's tick */
            moonlet_master_tick(S.m);
        settle();
        check_all(S.m, false);
        if (S.failed)
            break; /* S.step: the step that failed */
    }
    bool ok = !S.failed;
    if (!ok && !quiet) {
        printf("sim: seed %" PRIu64 " FAILED at step %u: %s\n", seed, S.step, S.why);
        if (!print_all)
            for (uint32_t i = S.ntrace > TRACE_KEEP ? S.ntrace - TRACE_KEEP : 0; i < S.ntrace; i++)
                printf("  %s\n", S.trace[i % TRACE_KEEP]);
        printf("sim: replay with: sim --seed %" PRIu64 " --steps %u --trace\n", seed, steps);
    }
    moonlet_master_destroy(S.m);
    moonlet_master_destroy(S.frozen);
    S.frozen = NULL;
    moonlet_repl_state_destroy(S.st);
    log_free();
    S.m = NULL;
    S.st = NULL;
    return ok;
}

/* Runs that failed on the code before the fixes (docs/sim-findings.md):
 * each must pass now.  The simulation's choices are the same as when they
 * were found (commit 0b4bc98), so each replays its hole's path. */
static const struct {
    uint64_t seed;
    uint32_t steps;
    bool polite;
    const char *finding;
} regressions[] = {
    {10, 200, false, "5: a late PutEnd sealed another put of the key"},
    {2042, 200, true, "1: a drained single-replica object vanished from the standby"},
    {519, 200, true, "1: the drained range reused, the standby's object refused at restore"},
    {3223, 400, true, "1: a repaired copy unknown to the standby, the other replica gone"},
    {3511, 200, true, "2: a repair target's quarantine outlived the leader's"},
    {15123, 400, true, "2: a replayed quarantine restored before the object on it"},
    {9699, 400, true, "8: a snapshot part skipped an object on a new segment"},
    {10495, 300, true, "DROP of a put the standby never saw: its ranges left free"},
    {87, 200, false, "section 3: a frozen leader's capabilities (fail with --no-fence)"},
};

int main(int argc, char **argv)
{
    uint64_t seed = 0, first = 1, nseeds = 2000;
    uint32_t steps = 200, max_fail = 5;
    bool one = false, print_all = false, regress = true, polite = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
            one = true;
        } else if (!strcmp(argv[i], "--seeds") && i + 1 < argc) {
            nseeds = strtoull(argv[++i], NULL, 10);
            regress = false;
        } else if (!strcmp(argv[i], "--first") && i + 1 < argc) {
            first = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            steps = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--max-fail") && i + 1 < argc) {
            max_fail = (uint32_t)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--records")) {
            g_records = true;
        } else if (!strcmp(argv[i], "--polite")) {
            polite = g_polite = true;
        } else if (!strcmp(argv[i], "--trace")) {
            print_all = true;
        } else if (!strcmp(argv[i], "--no-fence")) {
            g_nofence = true;
        } else if (!strcmp(argv[i], "--no-margin")) {
            g_nomargin = true;
        } else if (!strcmp(argv[i], "--deposals")) {
            g_deposals = true;
        } else {
            fprintf(stderr, "usage: sim [--seed N | --seeds N [--first S]] [--steps M] [--polite] "
                            "[--max-fail N] [--trace] [--records] [--no-fence] [--no-margin] "
                            "[--deposals]\n");
            return 2;
        }
    }
    moonlet_log_set_level(print_all ? 2 : -1);
    if (print_all) /* the master's log lines (stderr) in order with the trace */
        setvbuf(stdout, NULL, _IONBF, 0);
    if (one)
        return run(seed, steps, print_all, false) ? 0 : 1;
    uint32_t bad = 0;
    uint64_t failovers = 0, snaps = 0, late = 0, reads = 0, fwrites = 0, fenced = 0, deposals = 0;
    if (regress)
        for (size_t i = 0; i < sizeof(regressions) / sizeof(regressions[0]); i++) {
            g_polite = regressions[i].polite;
            if (!run(regressions[i].seed, regressions[i].steps, false, false)) {
                printf("sim: regression seed %" PRIu64 " (finding %s) fails again\n",
                       regressions[i].seed, regressions[i].finding);
                bad++;
            }
        }
    g_polite = polite;
    for (uint64_t s = first; s < first + nseeds && bad < max_fail; s++) {
        if (!run(s, steps, false, false))
            bad++;
        failovers += S.failovers;
        deposals += S.deposals;
        snaps += S.snapshots;
        late += S.late_ends;
        reads += S.reads;
        fwrites += S.frozen_writes;
        fenced += S.fenced_writes;
    }
    printf("sim: %" PRIu64 " seeds x %u steps from %" PRIu64 ": %u failed; %" PRIu64
           " failovers, %" PRIu64 " deposals, %" PRIu64 " snapshots, %" PRIu64 " late PutEnds, %"
           PRIu64 " reads, %" PRIu64 " frozen-leader writes fenced, %" PRIu64 " landed\n",
           nseeds, steps, first, bad, failovers, deposals, snaps, late, reads, fenced, fwrites);
    return bad ? 1 : 0;
}
