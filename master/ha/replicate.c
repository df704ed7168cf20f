/*
 * replicate.c - replication records: codec, the standby's state, promotion
 * with state (replicate.h).
 *
 * Wire format of one record (little-endian; str = u16 length + bytes):
 *   u8 type, u8 flags, then
 *   PLACE/SEAL/DROP: u32 tenant_id, str tenant, str key, u64 size, u64 ttl_ms,
 *                    u64 pin_ttl_ms, u64 free_ms, u64 checksum,
 *                    u8 nrep, nrep x (str segment_id, u64 offset)
 *   MOUNT:           str client, str segment, str name, u64 base, u64 size,
 *                    str endpoint, str protocol, u8 flags (1: a write key
 *                    follows, 2: a disk segment) [16 key],
 *                    str alt_segment, str alt_endpoint, str alt_protocol
 *   UNMOUNT:         str client, str segment
 *   QUAR/RESV/UNRESV: as PLACE, with an empty key and one replica
 *
 * The state: segments in an array of slots (an object's replica names its
 * slot; a slot is reused only after UNMOUNT stripped every replica naming
 * it), objects in a chained hash table on (tenant_id, key), quarantined
 * ranges in an array pruned as they expire, reserved ranges (RESV) in an
 * array indexed by (slot, offset).  UNMOUNT scans the objects
 * (O(objects)); the standby has nothing else to do meanwhile.  A PLACE
 * ends the quarantined and reserved ranges it overlaps (O(those ranges)):
 * the leader allocated them, whatever the standby's deadlines say.
 */
#include "replicate.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "clock.h"
#include "grow.h"
#include "hmap.h"
#include "log.h"
#include "moonlet/error.h"

#define MOD "repl"

/* ---- codec ---------------------------------------------------------------- */

/* The body each record type carries (the wire format above): the encoder and
 * the decoder both switch on it.  RANGE is an object body naming a range:
 * an empty key and one replica. */
enum rec_body { BODY_NONE, BODY_OBJECT, BODY_RANGE, BODY_MOUNT, BODY_UNMOUNT };

static const uint8_t rec_bodies[] = {
    [MOONLET_REPL_MOUNT] = BODY_MOUNT,   [MOONLET_REPL_UNMOUNT] = BODY_UNMOUNT,
    [MOONLET_REPL_PLACE] = BODY_OBJECT,  [MOONLET_REPL_SEAL] = BODY_OBJECT,
    [MOONLET_REPL_DROP] = BODY_OBJECT,   [MOONLET_REPL_QUAR] = BODY_RANGE,
    [MOONLET_REPL_RESV] = BODY_RANGE,    [MOONLET_REPL_UNRESV] = BODY_RANGE,
};

/* BODY_NONE: not a record type. */
static enum rec_body rec_body(uint8_t type)
{
    return type < sizeof(rec_bodies) ? (enum rec_body)rec_bodies[type] : BODY_NONE;
}

struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool bad;
};

static void w_bytes(struct wbuf *w, const void *src, size_t len)
{
    if (w->bad || len > w->cap - w->n) {
        w->bad = true;
        return;
    }
    if (len)
        memcpy(w->p + w->n, src, len);
    w->n += len;
}

static void w_u8(struct wbuf *w, uint8_t v) { w_bytes(w, &v, 1); }

static void w_u32(struct wbuf *w, uint32_t v)
{
    uint8_t b[4];
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    w_bytes(w, b, 4);
}

static void w_u64(struct wbuf *w, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    w_bytes(w, b, 8);
}

static void w_str(struct wbuf *w, moonlet_str s)
{
    if (s.len > UINT16_MAX || (s.len && !s.ptr)) {
        w->bad = true;
        return;
    }
    uint8_t b[2] = {(uint8_t)s.len, (uint8_t)(s.len >> 8)};
    w_bytes(w, b, 2);
    w_bytes(w, s.ptr, s.len);
}

static moonlet_str cstr(const char *s) { return s ? MOONLET_STR(s) : (moonlet_str){"", 0}; }

size_t moonlet_repl_encode(const moonlet_repl_rec *rec, uint8_t *buf, size_t cap)
{
    struct wbuf w = {buf, 0, cap, false};
    w_u8(&w, rec->type);
    w_u8(&w, rec->flags);
    switch (rec_body(rec->type)) {
    case BODY_OBJECT:
    case BODY_RANGE:
        if (rec->nrep > MOONLET_REPL_MAX_REPS)
            return 0;
        w_u32(&w, rec->tenant_id);
        w_str(&w, rec->tenant.ptr ? rec->tenant : (moonlet_str){"", 0});
        w_str(&w, rec->key);
        w_u64(&w, rec->size);
        w_u64(&w, rec->ttl_ms);
        w_u64(&w, rec->pin_ttl_ms);
        w_u64(&w, rec->free_ms);
        w_u64(&w, rec->checksum);
        w_u8(&w, (uint8_t)rec->nrep);
        for (uint32_t k = 0; k < rec->nrep; k++) {
            w_str(&w, rec->rep_seg[k]);
            w_u64(&w, rec->rep_off[k]);
        }
        break;
    case BODY_MOUNT: {
        const moonlet_segment_desc *d = rec->seg;
        if (!d)
            return 0;
        w_str(&w, cstr(d->client_id));
        w_str(&w, cstr(d->segment_id));
        w_str(&w, cstr(d->name));
        w_u64(&w, d->base);
        w_u64(&w, d->size);
        w_str(&w, cstr(d->endpoint));
        w_str(&w, cstr(d->protocol));
        w_u8(&w, (uint8_t)((d->write_key != NULL) | (d->disk ? 2u : 0u)));
        if (d->write_key)
            w_bytes(&w, d->write_key, 16);
        w_str(&w, cstr(d->alt_segment_id));
        w_str(&w, cstr(d->alt_endpoint));
        w_str(&w, cstr(d->alt_protocol));
        w_str(&w, rec->secret.ptr ? rec->secret : (moonlet_str){"", 0});
        w_u64(&w, (uint64_t)rec->clock_offset_ms);
        break;
    }
    case BODY_UNMOUNT:
        w_str(&w, rec->client_id);
        w_str(&w, rec->segment_id);
        break;
    default:
        return 0;
    }
    return w.bad ? 0 : w.n;
}

struct rbuf {
    const uint8_t *p;
    size_t n, len;
    bool bad;
};

static const uint8_t *r_take(struct rbuf *r, size_t len)
{
    if (r->bad || len > r->len - r->n) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *p = r->p + r->n;
    r->n += len;
    return p;
}

static uint8_t r_u8(struct rbuf *r)
{
    const uint8_t *p = r_take(r, 1);
    return p ? p[0] : 0;
}

/* An n-byte little-endian unsigned integer; 0 once r is bad. */
static uint64_t r_le(struct rbuf *r, unsigned n)
{
    const uint8_t *p = r_take(r, n);
    uint64_t v = 0;
    for (unsigned i = 0; p && i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static uint32_t r_u32(struct rbuf *r)
{
    return (uint32_t)r_le(r, 4);
}

static uint64_t r_u64(struct rbuf *r)
{
    return r_le(r, 8);
}

static moonlet_str r_str(struct rbuf *r, uint32_t max)
{
    const uint8_t *b = r_take(r, 2);
    uint32_t len = b ? (uint32_t)b[0] | (uint32_t)b[1] << 8 : 0;
    if (len > max) {
        r->bad = true;
        return (moonlet_str){"", 0};
    }
    const uint8_t *p = r_take(r, len);
    return p ? (moonlet_str){(const char *)p, len} : (moonlet_str){"", 0};
}

/* A string copied NUL-terminated into dst (cap bytes, > max); NULL when empty
 * and `opt`. */
static const char *r_cstr(struct rbuf *r, char *dst, size_t cap, bool opt)
{
    moonlet_str s = r_str(r, (uint32_t)cap - 1);
    memcpy(dst, s.ptr, s.len);
    dst[s.len] = 0;
    return opt && s.len == 0 ? NULL : dst;
}

int moonlet_repl_decode(const uint8_t *buf, size_t len, moonlet_repl_decoded *out)
{
    struct rbuf r = {buf, 0, len, false};
    out->rec = (moonlet_repl_rec){0};
    out->seg = (moonlet_segment_desc){0};
    moonlet_repl_rec *rec = &out->rec;
    rec->type = r_u8(&r);
    rec->flags = r_u8(&r);
    enum rec_body body = rec_body(rec->type);
    switch (body) {
    case BODY_OBJECT:
    case BODY_RANGE: {
        bool range = body == BODY_RANGE;
        rec->tenant_id = r_u32(&r);
        rec->tenant = r_str(&r, MOONLET_MAX_ID_BYTES);
        rec->key = r_str(&r, MOONLET_MAX_KEY_BYTES);
        rec->size = r_u64(&r);
        rec->ttl_ms = r_u64(&r);
        rec->pin_ttl_ms = r_u64(&r);
        rec->free_ms = r_u64(&r);
        rec->checksum = r_u64(&r);
        rec->nrep = r_u8(&r);
        if (rec->nrep > MOONLET_REPL_MAX_REPS || (rec->key.len == 0) != range ||
            (range && rec->nrep != 1))
            return MOONLET_ERR_INVALID_PARAMS;
        for (uint32_t k = 0; k < rec->nrep; k++) {
            rec->rep_seg[k] = r_str(&r, MOONLET_MAX_ID_BYTES);
            rec->rep_off[k] = r_u64(&r);
            if (!r.bad && rec->rep_seg[k].len == 0)
                return MOONLET_ERR_INVALID_PARAMS;
        }
        break;
    }
    case BODY_MOUNT: {
        moonlet_segment_desc *d = &out->seg;
        d->client_id = r_cstr(&r, out->client_id, sizeof(out->client_id), false);
        d->segment_id = r_cstr(&r, out->segment_id, sizeof(out->segment_id), false);
        d->name = r_cstr(&r, out->name, sizeof(out->name), true);
        d->base = r_u64(&r);
        d->size = r_u64(&r);
        d->endpoint = r_cstr(&r, out->endpoint, sizeof(out->endpoint), false);
        d->protocol = r_cstr(&r, out->protocol, sizeof(out->protocol), false);
        uint8_t has_key = r_u8(&r); /* bit 0: a write key follows; bit 1: a disk segment */
        if (has_key > 3)
            return MOONLET_ERR_INVALID_PARAMS;
        d->disk = has_key & 2u;
        if (has_key & 1u) {
            const uint8_t *k = r_take(&r, 16);
            if (k) {
                memcpy(out->write_key, k, 16);
                d->write_key = out->write_key;
                d->node_clock_ms = 1; /* set by the applier */
            }
        }
        d->alt_segment_id = r_cstr(&r, out->alt_segment_id, sizeof(out->alt_segment_id), true);
        d->alt_endpoint = r_cstr(&r, out->alt_endpoint, sizeof(out->alt_endpoint), true);
        d->alt_protocol = r_cstr(&r, out->alt_protocol, sizeof(out->alt_protocol), true);
        rec->secret = r_str(&r, 64);
        rec->clock_offset_ms = (int64_t)r_u64(&r);
        if (!r.bad && (!out->client_id[0] || !out->segment_id[0]))
            return MOONLET_ERR_INVALID_PARAMS;
        rec->seg = d;
        break;
    }
    case BODY_UNMOUNT:
        rec->client_id = r_str(&r, MOONLET_MAX_ID_BYTES);
        rec->segment_id = r_str(&r, MOONLET_MAX_ID_BYTES);
        if (!r.bad && rec->segment_id.len == 0)
            return MOONLET_ERR_INVALID_PARAMS;
        break;
    default:
        return MOONLET_ERR_INVALID_PARAMS;
    }
    if (r.bad || r.n != len)
        return MOONLET_ERR_INVALID_PARAMS;
    return MOONLET_OK;
}

/* ---- the standby's state ---------------------------------------------------- */

struct rseg {
    bool used;
    char client[MOONLET_MAX_ID_BYTES + 1], id[MOONLET_MAX_ID_BYTES + 1];
    char name[MOONLET_MAX_ID_BYTES + 1];
    char endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1], protocol[16];
    char alt_id[MOONLET_MAX_ID_BYTES + 1], alt_endpoint[MOONLET_MAX_ENDPOINT_BYTES + 1];
    char alt_protocol[16];
    uint64_t base, size;
    bool has_key, disk;
    uint8_t key[16];
    uint8_t secret_len;
    uint8_t secret[64];
    int64_t clock_offset_ms; /* the leader's bound of node - leader clock */
};

struct robj {
    struct robj *next;
    uint64_t hash;
    uint32_t tenant_id;
    uint16_t tlen, klen;
    char *tenant, *key;     /* one allocation: tenant bytes then key bytes */
    uint64_t size;
    uint8_t flags;
    bool sealed, has_checksum;
    uint64_t checksum;
    uint64_t deadline_ns;   /* pending: the put deadline */
    uint64_t pin_ns;        /* pending: the pin TTL; sealed: the pin deadline */
    uint32_t nrep;
    uint32_t seg[MOONLET_REPL_MAX_REPS];
    uint64_t off[MOONLET_REPL_MAX_REPS];
};

struct rquar {
    uint32_t seg;
    uint64_t off, len, until_ns;
};

/* A range the leader reserved for PutStarts (RESV) that no PLACE took. */
struct rresv {
    uint32_t seg;
    uint64_t off, len;
};

struct moonlet_repl_state {
    struct rresv *resv;
    uint32_t nresv, resv_cap;
    struct hmap resv_ix; /* (slot, offset) -> index in resv */
    struct rseg *segs;
    uint32_t nsegs, segs_cap;
    struct robj **buckets;
    uint32_t mask;
    uint64_t nobjs;
    struct rquar *quar;
    uint32_t nquar, quar_cap;
    bool has_leader_clock;
    int64_t leader_clock_lb; /* a lower bound of leader clock - this clock (ms) */
};

void moonlet_repl_state_note_leader_clock(moonlet_repl_state *st, int64_t lb)
{
    if (!st->has_leader_clock || lb > st->leader_clock_lb)
        st->leader_clock_lb = lb;
    st->has_leader_clock = true;
}

bool moonlet_repl_state_leader_clock(const moonlet_repl_state *st, int64_t *lb)
{
    *lb = st->has_leader_clock ? st->leader_clock_lb : 0;
    return st->has_leader_clock;
}

int moonlet_repl_state_create(moonlet_repl_state **out)
{
    moonlet_repl_state *st = calloc(1, sizeof(*st));
    if (!st)
        return MOONLET_ERR_INTERNAL_ERROR;
    st->mask = 1023;
    if (!(st->buckets = calloc(st->mask + 1, sizeof(*st->buckets)))) {
        free(st);
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    *out = st;
    return MOONLET_OK;
}

static void robj_free(struct robj *o)
{
    free(o->tenant);
    free(o);
}

void moonlet_repl_state_clear(moonlet_repl_state *st)
{
    for (uint32_t b = 0; b <= st->mask; b++) {
        for (struct robj *o = st->buckets[b], *n; o; o = n) {
            n = o->next;
            robj_free(o);
        }
        st->buckets[b] = NULL;
    }
    st->nobjs = 0;
    st->nsegs = 0;
    st->nquar = 0;
    st->nresv = 0;
    hmap_free(&st->resv_ix);
    st->has_leader_clock = false;
}

void moonlet_repl_state_destroy(moonlet_repl_state *st)
{
    if (!st)
        return;
    moonlet_repl_state_clear(st);
    free(st->buckets);
    free(st->segs);
    free(st->quar);
    free(st->resv);
    free(st);
}

static uint64_t obj_hash(uint32_t tenant_id, moonlet_str key)
{
    return hmap_str_hash(key.ptr, key.len) ^ ((uint64_t)tenant_id * 0x9E3779B97F4A7C15ull);
}

static struct robj **obj_find(moonlet_repl_state *st, uint32_t tenant_id, moonlet_str key,
                              uint64_t h)
{
    struct robj **pp = &st->buckets[h & st->mask];
    for (; *pp; pp = &(*pp)->next) {
        struct robj *o = *pp;
        if (o->hash == h && o->tenant_id == tenant_id && o->klen == key.len &&
            memcmp(o->key, key.ptr, key.len) == 0)
            return pp;
    }
    return pp;
}

static void grow(moonlet_repl_state *st)
{
    uint32_t nmask = st->mask * 2 + 1;
    struct robj **nb = calloc((size_t)nmask + 1, sizeof(*nb));
    if (!nb)
        return; /* longer chains, still correct */
    for (uint32_t b = 0; b <= st->mask; b++) {
        for (struct robj *o = st->buckets[b], *n; o; o = n) {
            n = o->next;
            o->next = nb[o->hash & nmask];
            nb[o->hash & nmask] = o;
        }
    }
    free(st->buckets);
    st->buckets = nb;
    st->mask = nmask;
}

static int seg_find(const moonlet_repl_state *st, moonlet_str id, uint32_t *slot)
{
    for (uint32_t i = 0; i < st->nsegs; i++) {
        const struct rseg *s = &st->segs[i];
        if (s->used && strlen(s->id) == id.len && memcmp(s->id, id.ptr, id.len) == 0) {
            *slot = i;
            return MOONLET_OK;
        }
    }
    return MOONLET_ERR_SEGMENT_NOT_FOUND;
}

static void quar_prune(moonlet_repl_state *st, uint64_t now)
{
    uint32_t keep = 0;
    for (uint32_t i = 0; i < st->nquar; i++)
        if (st->quar[i].until_ns > now)
            st->quar[keep++] = st->quar[i];
    st->nquar = keep;
}

static void quar_add(moonlet_repl_state *st, uint32_t seg, uint64_t off, uint64_t len,
                     uint64_t until_ns)
{
    if (st->nquar == st->quar_cap) {
        quar_prune(st, moonlet_clock_now_ns());
        if (st->nquar == st->quar_cap) {
            uint32_t cap = st->quar_cap ? st->quar_cap * 2 : 64;
            struct rquar *q = realloc(st->quar, cap * sizeof(*q));
            if (!q) {
                ML_ERR(MOD, "out of memory for a quarantined range: it is forgotten");
                return;
            }
            st->quar = q;
            st->quar_cap = cap;
        }
    }
    st->quar[st->nquar++] = (struct rquar){seg, off, len, until_ns};
}

static void obj_quarantine(moonlet_repl_state *st, const struct robj *o, uint32_t k,
                           uint64_t until_ns)
{
    quar_add(st, o->seg[k], o->off[k], o->size ? o->size : 1, until_ns);
}

static uint64_t resv_hash(uint32_t seg, uint64_t off)
{
    return off ^ ((uint64_t)(seg + 1) * 0x9E3779B97F4A7C15ull);
}

struct resv_key {
    const moonlet_repl_state *st;
    uint32_t seg;
    uint64_t off;
};

static bool resv_eq(const void *ctx, uint32_t v)
{
    const struct resv_key *k = ctx;
    return k->st->resv[v].seg == k->seg && k->st->resv[v].off == k->off;
}

static struct hent *resv_find(moonlet_repl_state *st, uint32_t seg, uint64_t off)
{
    struct resv_key k = {st, seg, off};
    return hmap_find(&st->resv_ix, resv_hash(seg, off), resv_eq, &k);
}

/* Holds [off, +len) of slot seg as reserved (again: a replayed RESV). */
static int resv_add(moonlet_repl_state *st, uint32_t seg, uint64_t off, uint64_t len)
{
    struct hent *e = resv_find(st, seg, off);
    if (e) {
        st->resv[e->v].len = len;
        return MOONLET_OK;
    }
    struct rresv *n = moonlet_grow(st->resv, st->nresv, &st->resv_cap, 64, sizeof(*n));
    if (!n)
        return MOONLET_ERR_INTERNAL_ERROR;
    st->resv = n;
    if (!hmap_insert(&st->resv_ix, resv_hash(seg, off), st->nresv))
        return MOONLET_ERR_INTERNAL_ERROR;
    st->resv[st->nresv++] = (struct rresv){seg, off, len};
    return MOONLET_OK;
}

/* The reservation at (seg, off) ends (taken by a PLACE, or UNRESV); none: no-op. */
static void resv_del(moonlet_repl_state *st, uint32_t seg, uint64_t off)
{
    struct hent *e = resv_find(st, seg, off);
    if (!e)
        return;
    uint32_t i = e->v, last = st->nresv - 1;
    hmap_remove(&st->resv_ix, e);
    if (i != last) { /* the last entry fills the hole; its index entry follows */
        st->resv[i] = st->resv[last];
        struct hent *moved = resv_find(st, st->resv[i].seg, st->resv[i].off);
        moved->v = i;
    }
    st->nresv = last;
}

static int apply_mount(moonlet_repl_state *st, const moonlet_segment_desc *d, moonlet_str secret,
                       int64_t clock_offset_ms)
{
    uint32_t slot;
    if (!d || !d->client_id || !d->segment_id || !d->endpoint || !d->protocol)
        return MOONLET_ERR_INVALID_PARAMS;
    if (seg_find(st, MOONLET_STR(d->segment_id), &slot) == MOONLET_OK)
        return MOONLET_ERR_SEGMENT_ALREADY_EXISTS;
    for (slot = 0; slot < st->nsegs && st->segs[slot].used; slot++)
        ;
    if (slot == st->nsegs) {
        struct rseg *n = moonlet_grow(st->segs, st->nsegs, &st->segs_cap, 16, sizeof(*n));
        if (!n)
            return MOONLET_ERR_INTERNAL_ERROR;
        st->segs = n;
        st->nsegs++;
    }
    struct rseg *s = &st->segs[slot];
    memset(s, 0, sizeof(*s));
    s->used = true;
    snprintf(s->client, sizeof(s->client), "%s", d->client_id);
    snprintf(s->id, sizeof(s->id), "%s", d->segment_id);
    snprintf(s->name, sizeof(s->name), "%s", d->name ? d->name : "");
    snprintf(s->endpoint, sizeof(s->endpoint), "%s", d->endpoint);
    snprintf(s->protocol, sizeof(s->protocol), "%s", d->protocol);
    snprintf(s->alt_id, sizeof(s->alt_id), "%s", d->alt_segment_id ? d->alt_segment_id : "");
    snprintf(s->alt_endpoint, sizeof(s->alt_endpoint), "%s",
             d->alt_endpoint ? d->alt_endpoint : "");
    snprintf(s->alt_protocol, sizeof(s->alt_protocol), "%s",
             d->alt_protocol ? d->alt_protocol : "");
    s->base = d->base;
    s->size = d->size;
    s->disk = d->disk;
    s->has_key = d->write_key != NULL;
    if (s->has_key)
        memcpy(s->key, d->write_key, 16);
    if (secret.len > sizeof(s->secret))
        return MOONLET_ERR_INVALID_PARAMS;
    s->secret_len = (uint8_t)secret.len;
    if (secret.len)
        memcpy(s->secret, secret.ptr, secret.len);
    s->clock_offset_ms = clock_offset_ms;
    return MOONLET_OK;
}

static void obj_unlink(moonlet_repl_state *st, struct robj **pp)
{
    struct robj *o = *pp;
    *pp = o->next;
    robj_free(o);
    st->nobjs--;
}

static int apply_unmount(moonlet_repl_state *st, moonlet_str id)
{
    uint32_t slot;
    if (seg_find(st, id, &slot))
        return MOONLET_ERR_SEGMENT_NOT_FOUND;
    for (uint32_t b = 0; b <= st->mask; b++) {
        for (struct robj **pp = &st->buckets[b]; *pp;) {
            struct robj *o = *pp;
            uint32_t keep = 0;
            for (uint32_t k = 0; k < o->nrep; k++) {
                if (o->seg[k] == slot)
                    continue;
                o->seg[keep] = o->seg[k];
                o->off[keep++] = o->off[k];
            }
            o->nrep = keep;
            if (keep == 0)
                obj_unlink(st, pp); /* the leader's DROP of it is then a no-op */
            else
                pp = &o->next;
        }
    }
    uint32_t keep = 0;
    for (uint32_t i = 0; i < st->nquar; i++)
        if (st->quar[i].seg != slot)
            st->quar[keep++] = st->quar[i];
    st->nquar = keep;
    for (uint32_t i = st->nresv; i-- > 0;)
        if (st->resv[i].seg == slot)
            resv_del(st, slot, st->resv[i].off);
    st->segs[slot].used = false;
    return MOONLET_OK;
}

/* A PLACE names [off, +size) of slot seg as an object's: the leader took
 * it from its allocator, so no quarantine or reservation of the leader
 * covers it any more.  The standby's may (issue 31, finding 2): its
 * deadlines count from when it applied a record, later than the leader's
 * by the stream's lag or by a whole snapshot's replay, and a repair target
 * the leader attached to an object (RepairDone sends no record) stays
 * quarantined here until the job's deadline.  Restored first at a
 * promotion, such a range refused the object the leader had put there.
 * So a PLACE ends every quarantined or reserved range it overlaps. */
static void ranges_taken(moonlet_repl_state *st, uint32_t seg, uint64_t off, uint64_t size)
{
    uint64_t end = off + moonlet_alloc_rounded(size ? size : 1);
    uint32_t keep = 0;
    for (uint32_t i = 0; i < st->nquar; i++) {
        const struct rquar *q = &st->quar[i];
        if (!(q->seg == seg && q->off < end && off < q->off + q->len))
            st->quar[keep++] = *q;
    }
    st->nquar = keep;
    for (uint32_t i = st->nresv; i-- > 0;) {
        const struct rresv *v = &st->resv[i];
        if (v->seg == seg && v->off < end && off < v->off + v->len)
            resv_del(st, seg, v->off);
    }
}

static int apply_place(moonlet_repl_state *st, const moonlet_repl_rec *rec, uint64_t now)
{
    if (rec->nrep == 0 || rec->nrep > MOONLET_REPL_MAX_REPS || rec->key.len == 0 ||
        rec->key.len > MOONLET_MAX_KEY_BYTES || rec->tenant.len > MOONLET_MAX_ID_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    uint32_t seg[MOONLET_REPL_MAX_REPS];
    for (uint32_t k = 0; k < rec->nrep; k++) {
        int rc = seg_find(st, rec->rep_seg[k], &seg[k]);
        if (rc)
            return rc;
    }
    for (uint32_t k = 0; k < rec->nrep; k++) /* a put placed in a reserved range, ... */
        ranges_taken(st, seg[k], rec->rep_off[k], rec->size);
    uint64_t h = obj_hash(rec->tenant_id, rec->key);
    struct robj **pp = obj_find(st, rec->tenant_id, rec->key, h);
    struct robj *o = *pp;
    if (o) { /* a replacement: ranges no longer used wait as the leader's do */
        for (uint32_t k = 0; k < o->nrep; k++) {
            bool kept = false;
            for (uint32_t j = 0; j < rec->nrep; j++)
                kept |= seg[j] == o->seg[k] && rec->rep_off[j] == o->off[k];
            if (!kept && rec->free_ms)
                obj_quarantine(st, o, k, now + rec->free_ms * MOONLET_NS_PER_MS);
        }
    } else {
        if (!(o = calloc(1, sizeof(*o))))
            return MOONLET_ERR_INTERNAL_ERROR;
        if (!(o->tenant = malloc((size_t)rec->tenant.len + rec->key.len + 1))) {
            free(o);
            return MOONLET_ERR_INTERNAL_ERROR;
        }
        if (rec->tenant.len)
            memcpy(o->tenant, rec->tenant.ptr, rec->tenant.len);
        o->key = o->tenant + rec->tenant.len;
        memcpy(o->key, rec->key.ptr, rec->key.len);
        o->tlen = (uint16_t)rec->tenant.len;
        o->klen = (uint16_t)rec->key.len;
        o->tenant_id = rec->tenant_id;
        o->hash = h;
        o->next = st->buckets[h & st->mask];
        st->buckets[h & st->mask] = o;
        if (++st->nobjs > (uint64_t)st->mask + 1)
            grow(st);
    }
    o->size = rec->size;
    o->flags = rec->flags & (MOONLET_REPL_FLAG_SOFT_PIN | MOONLET_REPL_FLAG_HARD_PIN);
    o->sealed = rec->flags & MOONLET_REPL_FLAG_SEALED;
    if (o->sealed) { /* as a SEAL record would */
        o->has_checksum = rec->flags & MOONLET_REPL_FLAG_CHECKSUM;
        o->checksum = rec->checksum;
        o->pin_ns = now + rec->pin_ttl_ms * MOONLET_NS_PER_MS;
    } else {
        o->deadline_ns = now + rec->ttl_ms * MOONLET_NS_PER_MS;
        o->pin_ns = rec->pin_ttl_ms * MOONLET_NS_PER_MS;
        o->has_checksum = false;
        o->checksum = rec->checksum; /* the put's id (restored with it: PutEnd names it) */
    }
    o->nrep = rec->nrep;
    memcpy(o->seg, seg, sizeof(seg[0]) * rec->nrep);
    memcpy(o->off, rec->rep_off, sizeof(rec->rep_off[0]) * rec->nrep);
    return MOONLET_OK;
}

/* The slot of a range record's (QUAR, RESV, UNRESV) one replica. */
static int range_slot(const moonlet_repl_state *st, const moonlet_repl_rec *rec, uint32_t *slot)
{
    if (rec->nrep != 1 || rec->size == 0)
        return MOONLET_ERR_INVALID_PARAMS;
    return seg_find(st, rec->rep_seg[0], slot);
}

int moonlet_repl_state_apply(moonlet_repl_state *st, const moonlet_repl_rec *rec)
{
    uint64_t now = moonlet_clock_now_ns();
    switch (rec->type) {
    case MOONLET_REPL_MOUNT:
        return apply_mount(st, rec->seg, rec->secret, rec->clock_offset_ms);
    case MOONLET_REPL_UNMOUNT:
        return apply_unmount(st, rec->segment_id);
    case MOONLET_REPL_PLACE:
        return apply_place(st, rec, now);
    case MOONLET_REPL_QUAR: {
        uint32_t slot;
        int rc = range_slot(st, rec, &slot);
        if (rc)
            return rc;
        quar_add(st, slot, rec->rep_off[0], rec->size, now + rec->free_ms * MOONLET_NS_PER_MS);
        return MOONLET_OK;
    }
    case MOONLET_REPL_RESV:
    case MOONLET_REPL_UNRESV: {
        uint32_t slot;
        int rc = range_slot(st, rec, &slot);
        if (rc)
            return rc;
        if (rec->type == MOONLET_REPL_UNRESV) {
            resv_del(st, slot, rec->rep_off[0]);
            return MOONLET_OK;
        }
        if (rec->rep_off[0] >= st->segs[slot].size ||
            rec->size > st->segs[slot].size - rec->rep_off[0])
            return MOONLET_ERR_INVALID_PARAMS;
        return resv_add(st, slot, rec->rep_off[0], rec->size);
    }
    case MOONLET_REPL_SEAL:
    case MOONLET_REPL_DROP: {
        if (rec->key.len == 0)
            return MOONLET_ERR_INVALID_PARAMS;
        struct robj **pp = obj_find(st, rec->tenant_id, rec->key, obj_hash(rec->tenant_id, rec->key));
        struct robj *o = *pp;
        if (!o && rec->type == MOONLET_REPL_DROP && rec->free_ms) {
            /* An object this state never saw: a snapshot part walked its
             * shard after it went, and the first part walked the
             * quarantines before it went.  Its ranges are quarantined on
             * the leader all the same (a writer may still send there), so
             * they are here, as the record names them (issue 31). */
            for (uint32_t k = 0; k < rec->nrep && k < MOONLET_REPL_MAX_REPS; k++) {
                uint32_t slot;
                if (seg_find(st, rec->rep_seg[k], &slot) == MOONLET_OK)
                    quar_add(st, slot, rec->rep_off[k], rec->size ? rec->size : 1,
                             now + rec->free_ms * MOONLET_NS_PER_MS);
            }
            return MOONLET_OK;
        }
        if (!o)
            return MOONLET_OK;
        if (rec->type == MOONLET_REPL_SEAL) {
            o->sealed = true;
            o->has_checksum = rec->flags & MOONLET_REPL_FLAG_CHECKSUM;
            o->checksum = rec->checksum;
            o->pin_ns = now + rec->pin_ttl_ms * MOONLET_NS_PER_MS;
            return MOONLET_OK;
        }
        for (uint32_t k = 0; rec->free_ms && k < o->nrep; k++)
            obj_quarantine(st, o, k, now + rec->free_ms * MOONLET_NS_PER_MS);
        obj_unlink(st, pp);
        return MOONLET_OK;
    }
    default:
        return MOONLET_ERR_INVALID_PARAMS;
    }
}

int moonlet_repl_state_apply_snapshot(moonlet_repl_state *st, const moonlet_repl_rec *rec,
                                      bool first_part)
{
    if (first_part || rec->type != MOONLET_REPL_PLACE || rec->nrep > MOONLET_REPL_MAX_REPS) {
        int rc = moonlet_repl_state_apply(st, rec);
        return rc == MOONLET_ERR_SEGMENT_NOT_FOUND && !first_part ? MOONLET_OK : rc;
    }
    /* A later part: the object on the replicas whose segments the state
     * knows.  One on a segment mounted since the first part came there by
     * a PLACE the replay brings, or by a repair that sends no record
     * (repair.c): the object is kept with fewer replicas, never dropped
     * (issue 31, finding 8: a record skipped whole lost the object). */
    moonlet_repl_rec r = *rec;
    uint32_t n = 0, slot;
    for (uint32_t k = 0; k < rec->nrep; k++) {
        if (seg_find(st, rec->rep_seg[k], &slot) != MOONLET_OK)
            continue;
        r.rep_seg[n] = rec->rep_seg[k];
        r.rep_off[n++] = rec->rep_off[k];
    }
    r.nrep = n;
    if (n < rec->nrep)
        ML_INFO(MOD, "snapshot: %u of the %u replicas of %.*s are on segments mounted since the "
                "first part: %s", rec->nrep - n, rec->nrep, (int)rec->key.len, rec->key.ptr,
                n ? "kept without them" : "skipped (the replay brings it)");
    return n ? moonlet_repl_state_apply(st, &r) : MOONLET_OK;
}

void moonlet_repl_state_counts(const moonlet_repl_state *st, moonlet_repl_counts *out)
{
    memset(out, 0, sizeof(*out));
    for (uint32_t i = 0; i < st->nsegs; i++)
        out->segments += st->segs[i].used;
    for (uint32_t b = 0; b <= st->mask; b++)
        for (const struct robj *o = st->buckets[b]; o; o = o->next) {
            out->objects++;
            out->sealed += o->sealed;
            out->pending += !o->sealed;
        }
    uint64_t now = moonlet_clock_now_ns();
    for (uint32_t i = 0; i < st->nquar; i++)
        out->quarantined += st->quar[i].until_ns > now;
    out->reserved = st->nresv;
}

/* ---- promotion with state --------------------------------------------------- */

int moonlet_repl_state_restore(const moonlet_repl_state *st, moonlet_master *m,
                               uint64_t *restored, uint64_t *skipped)
{
    uint64_t ok = 0, bad = 0;
    uint64_t now = moonlet_clock_now_ns();
    for (uint32_t i = 0; i < st->nsegs; i++) {
        const struct rseg *s = &st->segs[i];
        if (!s->used)
            continue;
        /* The node's clock offset: the leader's bound (node - leader) plus a
         * lower bound of (leader - this master), so still a lower bound of
         * node - this master.  Unknown (no leader clock seen): node_clock_ms
         * 1, the lowest bound, so capabilities issued before the node's next
         * Ping (which refreshes it) expire early, never late. */
        uint64_t node_ms = 1;
        if (st->has_leader_clock) {
            int64_t v = (int64_t)(now / MOONLET_NS_PER_MS) + s->clock_offset_ms + st->leader_clock_lb;
            node_ms = v > 1 ? (uint64_t)v : 1;
        }
        moonlet_segment_desc d = {
            .client_id = s->client, .segment_id = s->id, .name = s->name[0] ? s->name : NULL,
            .base = s->base, .size = s->size, .endpoint = s->endpoint, .protocol = s->protocol,
            .write_key = s->has_key ? s->key : NULL, .node_clock_ms = s->has_key ? node_ms : 0,
            .alt_endpoint = s->alt_id[0] ? s->alt_endpoint : NULL,
            .alt_segment_id = s->alt_id[0] ? s->alt_id : NULL,
            .alt_protocol = s->alt_id[0] ? s->alt_protocol : NULL, .disk = s->disk};
        int rc = moonlet_master_mount_segment(m, &d);
        if (!rc) /* only the node that bound the id may take it over, not a restarted one */
            rc = moonlet_master_restore_client_secret(
                m, MOONLET_STR(s->client), (moonlet_str){(const char *)s->secret, s->secret_len});
        if (rc) {
            ML_ERR(MOD, "promotion: mounting segment %s failed (%d)", s->id, rc);
            return rc;
        }
    }
    for (uint32_t b = 0; b <= st->mask; b++)
        for (const struct robj *o = st->buckets[b]; o; o = o->next) {
            moonlet_repl_rec rec = {.type = MOONLET_REPL_PLACE, .flags = o->flags,
                                    .tenant = {o->tenant, o->tlen}, .key = {o->key, o->klen},
                                    .size = o->size, .nrep = o->nrep};
            if (o->sealed)
                rec.pin_ttl_ms = o->pin_ns > now ? (o->pin_ns - now) / MOONLET_NS_PER_MS : 0;
            else {
                rec.ttl_ms = o->deadline_ns > now ? (o->deadline_ns - now) / MOONLET_NS_PER_MS : 0;
                rec.pin_ttl_ms = o->pin_ns / MOONLET_NS_PER_MS;
            }
            for (uint32_t k = 0; k < o->nrep; k++) {
                rec.rep_seg[k] = MOONLET_STR(st->segs[o->seg[k]].id);
                rec.rep_off[k] = o->off[k];
            }
            int rc = moonlet_master_restore_object(m, &rec, o->sealed, o->has_checksum,
                                                   o->checksum);
            if (rc == MOONLET_OK) {
                ok++;
            } else {
                bad++;
                ML_ERR(MOD, "promotion: object %.*s not restored (%d)", (int)o->klen, o->key, rc);
            }
        }
    /* Quarantined ranges after the objects: one an object holds is the
     * leader's object's (the leader allocated it, so its own quarantine
     * there had ended); the standby's outlived it (a record replayed
     * after the snapshot that superseded it, a deadline counted from a
     * late record).  Restored first, it refused that object (issue 31,
     * finding 2); now it is the range that is not held back. */
    for (uint32_t i = 0; i < st->nquar; i++) {
        const struct rquar *q = &st->quar[i];
        if (q->until_ns <= now)
            continue;
        uint64_t ms = (q->until_ns - now + MOONLET_NS_PER_MS - 1) / MOONLET_NS_PER_MS;
        if (moonlet_master_restore_quarantine(m, MOONLET_STR(st->segs[q->seg].id), q->off, q->len,
                                              ms) != MOONLET_OK)
            ML_INFO(MOD, "promotion: quarantined range [%" PRIu64 ", +%" PRIu64 ") of segment %s "
                    "holds an object: not held back", q->off, q->len, st->segs[q->seg].id);
    }
    /* After the objects, which a reservation never overlaps (a PLACE ended
     * the one it took): a put this standby never heard of may be writing in
     * any of these until its deadline. */
    for (uint32_t i = 0; i < st->nresv; i++) {
        const struct rresv *v = &st->resv[i];
        if (moonlet_master_restore_reserved(m, MOONLET_STR(st->segs[v->seg].id), v->off,
                                            v->len) != MOONLET_OK)
            ML_ERR(MOD, "promotion: reserved range [%" PRIu64 ", +%" PRIu64
                   ") of segment %s not held back", v->off, v->len, st->segs[v->seg].id);
    }
    if (restored)
        *restored = ok;
    if (skipped)
        *skipped = bad;
    return MOONLET_OK;
}
