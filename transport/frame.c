/*
 * frame.c - the control-plane RPC frame codec: length-prefixed msgpack
 * requests and replies (see frame.h for the wire format).
 *
 * Why it is built this way:
 *  - Every body is first walked by body_check(), a small allocation-free
 *    msgpack scanner.  It proves the body is exactly one complete object and
 *    that every declared array/map size fits in the bytes that remain.  Only
 *    then is it decoded into msgpack-c's object tree (by mp_decode below,
 *    which builds what msgpack_unpack() would, faster).  A decoder allocates
 *    room for a container as soon as it reads the container's header, so
 *    without this check a 6-byte body declaring a 4-billion-element array
 *    would ask for ~100 GB.  With it, zone memory is bounded by ~24 bytes
 *    per body byte.
 *  - The server decodes with moonlet_request_decode_ref(): objects live in a
 *    zone the caller recycles and strings point into the caller's buffer, so
 *    the hot path neither copies nor mallocs.  The public decoders copy the
 *    body into the result's own zone so their results are self-contained.
 *  - Replies pack the code as a fixed-width int32 so the server can reserve
 *    the header, let the handler pack its result in place, and patch the code
 *    afterwards (moonlet_reply_patch_code).
 *
 * Pure functions on caller-owned memory; takes no locks.
 */
#include "frame.h"

#include <assert.h>
#include <string.h>

#include "moonlet/error.h"

#define INVALID MOONLET_ERR_INVALID_PARAMS
#define NO_FRAME SIZE_MAX
#define KEEP_BUFFER_BYTES (1u << 20)
#define ZONE_SLACK_BYTES 64u /* alignment padding after the unaligned body copy */

/* ------------------------------------------------------------------ */
/* Header                                                               */
/* ------------------------------------------------------------------ */

static uint32_t load_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint64_t load_be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static void store_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

void moonlet_frame_header_encode(uint8_t hdr[MOONLET_FRAME_HEADER_BYTES], uint32_t body_len)
{
    store_be32(hdr, body_len);
}

int moonlet_frame_header_decode(const uint8_t hdr[MOONLET_FRAME_HEADER_BYTES], size_t max_frame,
                                uint32_t *body_len)
{
    uint32_t len = load_be32(hdr);
    if (len == 0 || len > max_frame)
        return INVALID;
    *body_len = len;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Allocation-free msgpack scanner                                     */
/* ------------------------------------------------------------------ */

/* What one msgpack header announces. */
typedef struct mp_head {
    unsigned size_bytes;  /* bytes of the big-endian size field after the type byte */
    uint64_t fixed;       /* payload bytes that do not depend on the size field */
    uint64_t fixed_count; /* size given by the type byte itself (fix* types) */
    unsigned per_size;    /* payload bytes per unit of size (0 for containers) */
    unsigned kids;        /* child objects per unit of size (1 array, 2 map) */
} mp_head;

static int mp_classify_fix(uint8_t t, mp_head *h)
{
    if (t <= 0x7f || t >= 0xe0) /* positive / negative fixint */
        return 0;
    if (t <= 0x8f) { /* fixmap */
        h->fixed_count = t & 0x0f;
        h->kids = 2;
    } else if (t <= 0x9f) { /* fixarray */
        h->fixed_count = t & 0x0f;
        h->kids = 1;
    } else { /* 0xa0..0xbf fixstr */
        h->fixed_count = t & 0x1f;
        h->per_size = 1;
    }
    return 0;
}

static int mp_classify(uint8_t t, mp_head *h)
{
    memset(h, 0, sizeof(*h));
    if (t <= 0xbf || t >= 0xe0)
        return mp_classify_fix(t, h);
    switch (t) {
    case 0xc0: case 0xc2: case 0xc3: return 0;                     /* nil, false, true */
    case 0xc4: case 0xd9: h->size_bytes = 1; h->per_size = 1; return 0; /* bin8, str8 */
    case 0xc5: case 0xda: h->size_bytes = 2; h->per_size = 1; return 0; /* bin16, str16 */
    case 0xc6: case 0xdb: h->size_bytes = 4; h->per_size = 1; return 0; /* bin32, str32 */
    case 0xc7: h->size_bytes = 1; h->per_size = 1; h->fixed = 1; return 0; /* ext8 */
    case 0xc8: h->size_bytes = 2; h->per_size = 1; h->fixed = 1; return 0; /* ext16 */
    case 0xc9: h->size_bytes = 4; h->per_size = 1; h->fixed = 1; return 0; /* ext32 */
    case 0xca: case 0xce: case 0xd2: h->fixed = 4; return 0;       /* float32, (u)int32 */
    case 0xcb: case 0xcf: case 0xd3: h->fixed = 8; return 0;       /* float64, (u)int64 */
    case 0xcc: case 0xd0: h->fixed = 1; return 0;                  /* (u)int8 */
    case 0xcd: case 0xd1: h->fixed = 2; return 0;                  /* (u)int16 */
    case 0xd4: h->fixed = 2; return 0;                             /* fixext1..16: type + data */
    case 0xd5: h->fixed = 3; return 0;
    case 0xd6: h->fixed = 5; return 0;
    case 0xd7: h->fixed = 9; return 0;
    case 0xd8: h->fixed = 17; return 0;
    case 0xdc: h->size_bytes = 2; h->kids = 1; return 0;           /* array16 */
    case 0xdd: h->size_bytes = 4; h->kids = 1; return 0;           /* array32 */
    case 0xde: h->size_bytes = 2; h->kids = 2; return 0;           /* map16 */
    case 0xdf: h->size_bytes = 4; h->kids = 2; return 0;           /* map32 */
    default: return INVALID;                                       /* 0xc1 is never used */
    }
}

/*
 * Walks one object.  `need` counts objects still expected; a container adds
 * its children.  The body is accepted only when every declared child is
 * present, so the children msgpack-c allocates for can never outnumber the
 * body's bytes.  Checking `need` against the bytes left after each container
 * header merely rejects a lying header early.  *children gets the number of
 * container elements (map entries count twice), i.e. how many
 * msgpack_objects msgpack-c will allocate in the zone.  More than
 * `max_children` of them stops the walk at once with TOO_MANY (the bytes are
 * not looked at further).
 */
#define TOO_MANY 1
static int scan_body_max(const char *body, size_t len, uint64_t max_children, uint64_t *children)
{
    const uint8_t *p = (const uint8_t *)body;
    uint64_t need = 1;
    size_t pos = 0;
    *children = 0;
    if (body == NULL || len == 0)
        return INVALID;
    while (need > 0) {
        mp_head h;
        if (pos >= len)
            return INVALID;
        uint8_t t = p[pos];
        if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) {
            pos++; /* fast path: fixint, nil, bool */
            need--;
            continue;
        }
        if ((t & 0xe0) == 0xa0) { /* fast path: fixstr */
            if ((size_t)(t & 0x1f) >= len - pos)
                return INVALID;
            pos += 1 + (size_t)(t & 0x1f);
            need--;
            continue;
        }
        if (mp_classify(t, &h) != 0)
            return INVALID;
        pos++;
        if (h.size_bytes > len - pos)
            return INVALID;
        uint64_t n = h.size_bytes ? load_be(p + pos, h.size_bytes) : h.fixed_count;
        pos += h.size_bytes;
        uint64_t payload = h.fixed + n * h.per_size;
        if (payload > len - pos)
            return INVALID;
        pos += (size_t)payload;
        need = need - 1 + n * h.kids;
        *children += n * h.kids;
        if (need > len - pos)
            return INVALID;
        if (*children > max_children)
            return TOO_MANY;
    }
    return pos == len ? 0 : INVALID;
}

static int scan_body(const char *body, size_t len, uint64_t *children)
{
    return scan_body_max(body, len, UINT64_MAX, children);
}

int moonlet_frame_body_check(const char *body, size_t len)
{
    uint64_t children;
    return scan_body(body, len, &children);
}

/* Size of the msgpack int at p (any encoding), or 0 when p holds no int. */
static size_t mp_int_size(uint8_t t)
{
    if (t <= 0x7f || t >= 0xe0)
        return 1;
    switch (t) {
    case 0xcc: case 0xd0: return 2;
    case 0xcd: case 0xd1: return 3;
    case 0xce: case 0xd2: return 5;
    case 0xcf: case 0xd3: return 9;
    default: return 0;
    }
}

/* Offset of the first element of the array whose header is at p[0], or 0
 * when p does not start with a non-empty array header. */
static size_t mp_array_first(const uint8_t *p, size_t len)
{
    if (len >= 1 && p[0] >= 0x91 && p[0] <= 0x9f)
        return 1;
    if (len >= 3 && p[0] == 0xdc && load_be(p + 1, 2) > 0)
        return 3;
    if (len >= 5 && p[0] == 0xdd && load_be(p + 1, 4) > 0)
        return 5;
    return 0;
}

/* Reads the request id straight from the bytes, so that even a truncated or
 * otherwise malformed request can be answered with its id.  0 if unreadable. */
static uint64_t peek_id(const uint8_t *p, size_t len)
{
    size_t pos = mp_array_first(p, len);
    if (pos == 0 || pos >= len)
        return 0;
    uint8_t t = p[pos];
    size_t n = mp_int_size(t);
    if (n == 0 || n > len - pos || t >= 0xe0)
        return 0;
    if (n == 1)
        return t;
    uint64_t v = load_be(p + pos + 1, (unsigned)(n - 1));
    if (t >= 0xd0) { /* signed forms: only non-negative values are ids */
        unsigned bits = (unsigned)(n - 1) * 8;
        if (v >> (bits - 1))
            return 0;
    }
    return v;
}

/* ------------------------------------------------------------------ */
/* Decoding                                                             */
/* ------------------------------------------------------------------ */

/*
 * Decoding a scanned body into msgpack-c's object tree.
 *
 * It builds what msgpack_unpack() builds (types, values, strings and bins
 * pointing into the body, containers' elements in the zone; a test and the
 * fuzz target compare the two), in one pass without msgpack-c's generic
 * state machine: a reply of 640 booleans cost its caller about 5 us in
 * msgpack_unpack().  One difference: an empty string, bin or ext points into
 * the body here, where msgpack-c's pointer is NULL or left over from an
 * earlier field (the wire getters pass neither on: an empty string reads as
 * "").  The body was scanned first (scan_body_max), so every declared child
 * and payload is present and the zone was sized for every element; the
 * bounds are still checked as the bytes are read.  Like msgpack-c, it
 * refuses a container opened inside MP_MAX_DEPTH open ones (msgpack-c's
 * MSGPACK_EMBED_STACK_SIZE, its unpacker's stack), an empty one too.
 */
#define MP_MAX_DEPTH 32
typedef struct mp_reader {
    const uint8_t *p, *end;
    msgpack_zone *zone;
} mp_reader;

static int mp_take(mp_reader *r, size_t n, const uint8_t **out)
{
    if ((size_t)(r->end - r->p) < n)
        return INVALID;
    *out = r->p;
    r->p += n;
    return 0;
}

static int mp_decode(mp_reader *r, msgpack_object *o, unsigned depth);

static int mp_container(mp_reader *r, msgpack_object *o, uint64_t n, bool map, unsigned depth)
{
    /* msgpack-c's stack: a container, even an empty one, opened inside
     * MP_MAX_DEPTH open ones is refused */
    if (n > UINT32_MAX || depth >= MP_MAX_DEPTH)
        return INVALID;
    size_t each = map ? sizeof(msgpack_object_kv) : sizeof(msgpack_object);
    void *els = msgpack_zone_malloc(r->zone, (size_t)n * each);
    if (els == NULL)
        return INVALID;
    o->type = map ? MSGPACK_OBJECT_MAP : MSGPACK_OBJECT_ARRAY;
    if (map) {
        o->via.map.size = (uint32_t)n;
        o->via.map.ptr = els;
    } else {
        o->via.array.size = (uint32_t)n;
        o->via.array.ptr = els;
    }
    for (uint64_t i = 0; i < n; i++) {
        int rc = map ? mp_decode(r, &((msgpack_object_kv *)els)[i].key, depth + 1) ||
                           mp_decode(r, &((msgpack_object_kv *)els)[i].val, depth + 1)
                     : mp_decode(r, &((msgpack_object *)els)[i], depth + 1);
        if (rc)
            return INVALID;
    }
    return 0;
}

static void mp_int(msgpack_object *o, int64_t v)
{
    if (v >= 0) {
        o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
        o->via.u64 = (uint64_t)v;
    } else {
        o->type = MSGPACK_OBJECT_NEGATIVE_INTEGER;
        o->via.i64 = v;
    }
}

/* str, bin or ext of n payload bytes (ext: its type byte first). */
static int mp_bytes(mp_reader *r, msgpack_object *o, msgpack_object_type type, uint64_t n)
{
    const uint8_t *b;
    if (n > UINT32_MAX || mp_take(r, (size_t)n, &b))
        return INVALID;
    o->type = type;
    if (type == MSGPACK_OBJECT_EXT) {
        if (n == 0)
            return INVALID;
        o->via.ext.type = (int8_t)b[0];
        o->via.ext.ptr = (const char *)b + 1;
        o->via.ext.size = (uint32_t)n - 1;
    } else { /* str and bin share a layout */
        o->via.str.ptr = (const char *)b;
        o->via.str.size = (uint32_t)n;
    }
    return 0;
}

static int mp_decode(mp_reader *r, msgpack_object *o, unsigned depth)
{
    const uint8_t *b;
    if (mp_take(r, 1, &b))
        return INVALID;
    uint8_t t = b[0];
    if (t <= 0x7f) {
        o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
        o->via.u64 = t;
        return 0;
    }
    if (t >= 0xe0) {
        mp_int(o, (int8_t)t);
        return 0;
    }
    if (t >= 0xa0 && t <= 0xbf)
        return mp_bytes(r, o, MSGPACK_OBJECT_STR, t & 0x1f);
    if (t <= 0x8f)
        return mp_container(r, o, t & 0x0f, true, depth);
    if (t <= 0x9f)
        return mp_container(r, o, t & 0x0f, false, depth);
    switch (t) {
    case 0xc0: o->type = MSGPACK_OBJECT_NIL; return 0;
    case 0xc2:
    case 0xc3:
        o->type = MSGPACK_OBJECT_BOOLEAN;
        o->via.boolean = t == 0xc3;
        return 0;
    default: break;
    }
    mp_head h;
    if (mp_classify(t, &h) || mp_take(r, h.size_bytes, &b))
        return INVALID;
    uint64_t n = h.size_bytes ? load_be(b, h.size_bytes) : 0;
    switch (t) {
    case 0xc4: case 0xc5: case 0xc6: return mp_bytes(r, o, MSGPACK_OBJECT_BIN, n);
    case 0xd9: case 0xda: case 0xdb: return mp_bytes(r, o, MSGPACK_OBJECT_STR, n);
    case 0xc7: case 0xc8: case 0xc9: return mp_bytes(r, o, MSGPACK_OBJECT_EXT, n + 1);
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        return mp_bytes(r, o, MSGPACK_OBJECT_EXT, h.fixed);
    case 0xdc: case 0xdd: return mp_container(r, o, n, false, depth);
    case 0xde: case 0xdf: return mp_container(r, o, n, true, depth);
    default: break;
    }
    /* fixed-width numbers */
    if (mp_take(r, (size_t)h.fixed, &b))
        return INVALID;
    uint64_t u = load_be(b, (unsigned)h.fixed);
    switch (t) {
    case 0xca: {
        uint32_t bits = (uint32_t)u;
        float f;
        memcpy(&f, &bits, sizeof(f));
        o->type = MSGPACK_OBJECT_FLOAT32;
        o->via.f64 = f;
        return 0;
    }
    case 0xcb:
        o->type = MSGPACK_OBJECT_FLOAT64;
        memcpy(&o->via.f64, &u, sizeof(u));
        return 0;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
        o->type = MSGPACK_OBJECT_POSITIVE_INTEGER;
        o->via.u64 = u;
        return 0;
    case 0xd0: mp_int(o, (int8_t)u); return 0;
    case 0xd1: mp_int(o, (int16_t)u); return 0;
    case 0xd2: mp_int(o, (int32_t)u); return 0;
    case 0xd3: mp_int(o, (int64_t)u); return 0;
    default: return INVALID;
    }
}

/* Unpacks a body that scan_body() accepted. */
static int unpack_scanned(const char *body, size_t len, msgpack_zone *zone, msgpack_object *out)
{
    mp_reader r = {(const uint8_t *)body, (const uint8_t *)body + len, zone};
    if (mp_decode(&r, out, 0) != 0 || r.p != r.end)
        return INVALID; /* e.g. nesting deeper than msgpack-c's stack */
    return 0;
}

static int request_from_object(const msgpack_object *o, moonlet_request *req)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 3)
        return INVALID;
    const msgpack_object *f = o->via.array.ptr;
    if (f[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
        f[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || f[1].via.u64 > UINT32_MAX ||
        f[2].type != MSGPACK_OBJECT_ARRAY)
        return INVALID;
    req->id = f[0].via.u64;
    req->method = (uint32_t)f[1].via.u64;
    req->args = &f[2];
    return 0;
}

static int reply_from_object(const msgpack_object *o, moonlet_reply *rep)
{
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size < 3 || o->via.array.size > 4)
        return INVALID;
    const msgpack_object *f = o->via.array.ptr;
    rep->epoch = 0;
    if (o->via.array.size == 4) { /* the HA epoch (frame.h) */
        if (f[3].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return INVALID;
        rep->epoch = f[3].via.u64;
    }
    if (f[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return INVALID;
    if (f[1].type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (f[1].via.u64 > INT32_MAX)
            return INVALID;
        rep->code = (int32_t)f[1].via.u64;
    } else if (f[1].type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        if (f[1].via.i64 < INT32_MIN)
            return INVALID;
        rep->code = (int32_t)f[1].via.i64;
    } else {
        return INVALID;
    }
    rep->id = f[0].via.u64;
    rep->result = &f[2];
    return 0;
}

/* A fresh zone holding a private copy of body, sized for the copy plus the
 * `children` objects msgpack-c will allocate, so it never grows. */
static msgpack_zone *zone_with_copy(const char *body, size_t len, uint64_t children,
                                    const char **copy)
{
    size_t size = len + (size_t)children * sizeof(msgpack_object) + ZONE_SLACK_BYTES;
    msgpack_zone *z = msgpack_zone_new(size);
    if (z == NULL)
        return NULL;
    char *dst = msgpack_zone_malloc_no_align(z, len);
    if (dst == NULL) {
        msgpack_zone_free(z);
        return NULL;
    }
    memcpy(dst, body, len);
    *copy = dst;
    return z;
}

static int invalid_request(const char *body, size_t len, uint64_t *id_out)
{
    if (id_out && body != NULL)
        *id_out = peek_id((const uint8_t *)body, len);
    return INVALID;
}

/* Decodes a request body that scan_body() accepted. */
static int request_finish(const char *body, size_t len, msgpack_zone *zone, moonlet_request *req,
                          uint64_t *id_out)
{
    if (unpack_scanned(body, len, zone, &req->unp.data) != 0 ||
        request_from_object(&req->unp.data, req) != 0)
        return invalid_request(body, len, id_out);
    if (id_out)
        *id_out = req->id;
    return 0;
}

int moonlet_request_decode_ref(const char *body, size_t len, msgpack_zone *zone,
                               moonlet_request *req, uint64_t *id_out)
{
    return moonlet_request_decode_ref_max(body, len, zone, UINT64_MAX, req, id_out);
}

int moonlet_request_decode_ref_max(const char *body, size_t len, msgpack_zone *zone,
                                   uint64_t max_elements, moonlet_request *req, uint64_t *id_out)
{
    uint64_t children;
    msgpack_unpacked_init(&req->unp);
    req->args = NULL;
    if (id_out)
        *id_out = 0;
    int rc = scan_body_max(body, len, max_elements, &children);
    if (rc == TOO_MANY) {
        invalid_request(body, len, id_out);
        return MOONLET_ERR_BUFFER_OVERFLOW;
    }
    if (rc != 0)
        return invalid_request(body, len, id_out);
    return request_finish(body, len, zone, req, id_out);
}

/* Unpacks a private copy of body into *unp, whose zone then owns the copy
 * and every object.  Returns 0, INVALID (the body does not scan or unpack)
 * or MOONLET_ERR_INTERNAL_ERROR; on failure *unp holds nothing. */
static int unpack_copy(const char *body, size_t len, msgpack_unpacked *unp)
{
    uint64_t children;
    const char *copy = NULL;
    msgpack_unpacked_init(unp);
    if (scan_body(body, len, &children) != 0)
        return INVALID;
    msgpack_zone *z = zone_with_copy(body, len, children, &copy);
    if (z == NULL)
        return MOONLET_ERR_INTERNAL_ERROR;
    if (unpack_scanned(copy, len, z, &unp->data) != 0) {
        msgpack_zone_free(z);
        msgpack_unpacked_init(unp);
        return INVALID;
    }
    unp->zone = z;
    return 0;
}

int moonlet_request_decode(const char *body, size_t len, moonlet_request *req, uint64_t *id_out)
{
    req->args = NULL;
    if (id_out)
        *id_out = 0;
    int rc = unpack_copy(body, len, &req->unp);
    if (rc == MOONLET_ERR_INTERNAL_ERROR)
        return rc;
    if (rc != 0 || request_from_object(&req->unp.data, req) != 0) {
        moonlet_request_destroy(req);
        return invalid_request(body, len, id_out);
    }
    if (id_out)
        *id_out = req->id;
    return 0;
}

void moonlet_request_destroy(moonlet_request *req)
{
    msgpack_unpacked_destroy(&req->unp);
    req->args = NULL;
}

int moonlet_reply_decode(const char *body, size_t len, moonlet_reply *rep)
{
    rep->result = NULL;
    int rc = unpack_copy(body, len, &rep->unp);
    if (rc == MOONLET_ERR_INTERNAL_ERROR)
        return rc;
    if (rc != 0 || reply_from_object(&rep->unp.data, rep) != 0) {
        moonlet_reply_destroy(rep);
        return INVALID;
    }
    return 0;
}

void moonlet_reply_destroy(moonlet_reply *rep)
{
    msgpack_unpacked_destroy(&rep->unp);
    rep->result = NULL;
}

/* ------------------------------------------------------------------ */
/* Encoding                                                             */
/* ------------------------------------------------------------------ */

void moonlet_frame_builder_init(moonlet_frame_builder *b)
{
    msgpack_sbuffer_init(&b->buf);
    msgpack_packer_init(&b->pk, &b->buf, msgpack_sbuffer_write);
    b->frame_start = NO_FRAME;
}

void moonlet_frame_builder_destroy(moonlet_frame_builder *b)
{
    msgpack_sbuffer_destroy(&b->buf);
    msgpack_sbuffer_init(&b->buf);
    b->frame_start = NO_FRAME;
}

void moonlet_frame_builder_reset(moonlet_frame_builder *b)
{
    if (b->buf.alloc > KEEP_BUFFER_BYTES) {
        msgpack_sbuffer_destroy(&b->buf);
        msgpack_sbuffer_init(&b->buf);
    }
    b->buf.size = 0;
    b->frame_start = NO_FRAME;
}

void moonlet_frame_abort(moonlet_frame_builder *b)
{
    if (b->frame_start != NO_FRAME)
        b->buf.size = b->frame_start;
    b->frame_start = NO_FRAME;
}

msgpack_packer *moonlet_frame_begin(moonlet_frame_builder *b)
{
    static const char zero[MOONLET_FRAME_HEADER_BYTES];
    moonlet_frame_abort(b);
    b->frame_start = b->buf.size;
    msgpack_sbuffer_write(&b->buf, zero, sizeof(zero));
    return &b->pk;
}

int moonlet_frame_finish(moonlet_frame_builder *b, size_t max_frame)
{
    if (b->frame_start == NO_FRAME || b->buf.size < b->frame_start + MOONLET_FRAME_HEADER_BYTES)
        return INVALID;
    size_t body = b->buf.size - b->frame_start - MOONLET_FRAME_HEADER_BYTES;
    if (max_frame > UINT32_MAX)
        max_frame = UINT32_MAX;
    if (body == 0 || body > max_frame) {
        moonlet_frame_abort(b);
        return body == 0 ? INVALID : MOONLET_ERR_BUFFER_OVERFLOW;
    }
    moonlet_frame_header_encode((uint8_t *)b->buf.data + b->frame_start, (uint32_t)body);
    b->frame_start = NO_FRAME;
    return 0;
}

msgpack_packer *moonlet_request_begin(moonlet_frame_builder *b, uint64_t id, uint32_t method,
                                      uint32_t nargs)
{
    msgpack_packer *pk = moonlet_frame_begin(b);
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint64(pk, id);
    msgpack_pack_uint32(pk, method);
    msgpack_pack_array(pk, nargs);
    return pk;
}

msgpack_packer *moonlet_reply_begin(moonlet_frame_builder *b, uint64_t id, int32_t code)
{
    return moonlet_reply_begin_ex(b, id, code, false);
}

msgpack_packer *moonlet_reply_begin_ex(moonlet_frame_builder *b, uint64_t id, int32_t code,
                                       bool epoch)
{
    msgpack_packer *pk = moonlet_frame_begin(b);
    msgpack_pack_array(pk, epoch ? 4 : 3);
    msgpack_pack_uint64(pk, id);
    msgpack_pack_fix_int32(pk, code); /* fixed width: see moonlet_reply_patch_code */
    return pk;
}

void moonlet_reply_patch_code(moonlet_frame_builder *b, int32_t code)
{
    if (b->frame_start == NO_FRAME)
        return;
    uint8_t *p = (uint8_t *)b->buf.data + b->frame_start + MOONLET_FRAME_HEADER_BYTES;
    size_t len = b->buf.size - b->frame_start - MOONLET_FRAME_HEADER_BYTES;
    /* [0x93 or 0x94, id (any uint width), 0xd2, code x4, ...] as packed by reply_begin */
    size_t id_len = len >= 2 ? mp_int_size(p[1]) : 0;
    if (len < 2 || (p[0] != 0x93 && p[0] != 0x94) || id_len == 0 || 1 + id_len + 5 > len ||
        p[1 + id_len] != 0xd2) {
        assert(!"moonlet_reply_patch_code: open frame is not a reply");
        return;
    }
    store_be32(p + 1 + id_len + 1, (uint32_t)code);
}
