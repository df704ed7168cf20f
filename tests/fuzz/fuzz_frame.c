/*
 * fuzz_frame.c - libFuzzer target for the frame codec and the wire getters.
 *
 * Each input is read as a frame when it starts with a valid header whose
 * body fits in the input, else as a bare body.  The body goes through the
 * request and reply decoders (copying and zero-copy variants), every wire
 * getter runs over the decoded args (nested arrays too), and decoded
 * messages are re-encoded and decoded again.  Besides crashes and sanitizer
 * reports, abort() flags broken invariants: the two request decoders must
 * agree, a decodable body must pass moonlet_frame_body_check, getters must
 * agree with each other, and re-encoding must round-trip to stable bytes.
 * The args of every request also go through the table decoder
 * (transport/rpc_args.c) with every method of the master's table
 * (master/service/methods.c) and of the DummyClient's (store/client/dummy_proto.c): what it accepts must hold within the table's bounds,
 * and packing the decoded struct again must decode to the same arguments.
 * Every body is also decoded by msgpack-c's unpacker, which must agree with
 * frame.c's own decoder (fuzz_against_msgpack).
 *
 * Built twice: with -fsanitize=fuzzer for fuzzing (-Dfuzz=true, clang), and
 * with replay_main.c as a unit test that replays the seed corpus.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dummy_proto.h"
#include "frame.h"
#include "methods.h"
#include "moonlet/error.h"
#include "rpc_args.h"
#include "wire.h"
#include "../common/msgpack_same.h"

#define FUZZ_MAX_FRAME (1u << 20)
#define MAX_GETTER_INDEX 64
#define MAX_NEST 4

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond))                                                          \
            abort();                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void touch(const char *p, uint32_t len)
{
    volatile unsigned char sink = 0;
    for (uint32_t i = 0; i < len; i++)
        sink ^= (unsigned char)p[i];
    (void)sink;
}

static void poke_strings(const msgpack_object *arr, uint32_t i)
{
    const char *p, *q;
    uint32_t len, len2;
    if (moonlet_wire_str(arr, i, &p, &len) != 0) {
        CHECK(moonlet_wire_strn(arr, i, UINT32_MAX, &p, &len) != 0);
        return;
    }
    touch(p, len);
    CHECK(moonlet_wire_strn(arr, i, len, &q, &len2) == 0 && q == p && len2 == len);
    if (len > 0)
        CHECK(moonlet_wire_strn(arr, i, len - 1, &q, &len2) != 0);
}

static void poke_map(const msgpack_object *map)
{
    moonlet_wire_map_get(map, "");
    moonlet_wire_map_get(map, "key");
    for (uint32_t k = 0; k < map->via.map.size && k < MAX_GETTER_INDEX; k++) {
        const msgpack_object *key = &map->via.map.ptr[k].key;
        uint32_t n = key->via.str.size;
        char name[32];
        if (key->type != MSGPACK_OBJECT_STR || n >= sizeof(name))
            continue;
        if (n > 0) { /* an empty string's ptr may be anything (frame.c) */
            if (memchr(key->via.str.ptr, 0, n) != NULL)
                continue;
            memcpy(name, key->via.str.ptr, n);
        }
        name[n] = '\0';
        CHECK(moonlet_wire_map_get(map, name) != NULL); /* a present key is found */
    }
}

/* Runs every getter on every index of arr (one past the end too). */
static void poke_getters(const msgpack_object *arr, int depth)
{
    uint32_t n = moonlet_wire_len(arr);
    for (uint32_t i = 0; i <= n && i < MAX_GETTER_INDEX; i++) {
        uint64_t u;
        int64_t s;
        bool b;
        const msgpack_object *o;
        int ru = moonlet_wire_u64(arr, i, &u);
        int rs = moonlet_wire_i64(arr, i, &s);
        if (ru == 0 && u <= INT64_MAX)
            CHECK(rs == 0 && (uint64_t)s == u);
        if (i == n)
            CHECK(ru != 0 && rs != 0 && moonlet_wire_at(arr, i) == NULL);
        moonlet_wire_bool(arr, i, &b);
        poke_strings(arr, i);
        if (moonlet_wire_map(arr, i, &o) == 0)
            poke_map(o);
        if (moonlet_wire_array(arr, i, &o) == 0 && depth < MAX_NEST)
            poke_getters(o, depth + 1);
    }
}

/* Packs [id, method, args] from a decoded request into b. */
static void encode_request(moonlet_frame_builder *b, const moonlet_request *req)
{
    uint32_t n = moonlet_wire_len(req->args);
    msgpack_packer *pk = moonlet_request_begin(b, req->id, req->method, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_object(pk, req->args->via.array.ptr[i]);
    CHECK(moonlet_frame_finish(b, UINT32_MAX) == 0);
}

/* Re-encodes, decodes again, re-encodes again: the two encodings match. */
static void roundtrip_request(const moonlet_request *req)
{
    moonlet_frame_builder b1, b2;
    moonlet_frame_builder_init(&b1);
    moonlet_frame_builder_init(&b2);
    encode_request(&b1, req);
    uint32_t len;
    CHECK(moonlet_frame_header_decode((const uint8_t *)b1.buf.data, UINT32_MAX, &len) == 0);
    CHECK(len + MOONLET_FRAME_HEADER_BYTES == b1.buf.size);
    moonlet_request again;
    uint64_t id;
    CHECK(moonlet_request_decode(b1.buf.data + MOONLET_FRAME_HEADER_BYTES, len, &again, &id) == 0);
    CHECK(again.id == req->id && id == req->id && again.method == req->method);
    CHECK(moonlet_wire_len(again.args) == moonlet_wire_len(req->args));
    encode_request(&b2, &again);
    CHECK(b1.buf.size == b2.buf.size && memcmp(b1.buf.data, b2.buf.data, b1.buf.size) == 0);
    moonlet_request_destroy(&again);
    moonlet_frame_builder_destroy(&b1);
    moonlet_frame_builder_destroy(&b2);
}

#define FUZZ_BATCH_CAP 64

/* What the table decoder accepted lies within the table's bounds. */
static void check_decoded(const moonlet_rpc_args_spec *spec, const void *st);
static void check_decoded(const moonlet_rpc_args_spec *spec, const void *st)
{
    uint32_t nargs = *(const uint32_t *)st;
    for (uint32_t i = 0; i < spec->nargs && i < nargs; i++) {
        const moonlet_rpc_arg *a = &spec->args[i];
        const void *f = (const char *)st + a->offset;
        switch (a->kind) {
        case MOONLET_ARG_STR: {
            const moonlet_str *v = f;
            CHECK(!a->max || v->len <= a->max);
            touch(v->ptr, v->len);
            break;
        }
        case MOONLET_ARG_CSTR: {
            const char *c = *(const char *const *)f;
            CHECK(c ? !a->max || strlen(c) <= a->max : (a->flags & MOONLET_ARG_NULLABLE) != 0);
            break;
        }
        case MOONLET_ARG_CSTR_ARRAY: {
            const moonlet_cstrv *v = f;
            CHECK(!a->max || v->n <= a->max);
            for (uint32_t k = 0; k < v->n; k++)
                CHECK(v->v[k] && (!a->elem_max || strlen(v->v[k]) <= a->elem_max));
            break;
        }
        case MOONLET_ARG_TUPLE_ARRAY: {
            const moonlet_tuplev *v = f;
            CHECK(!a->max || v->n <= a->max);
            for (uint32_t k = 0; k < v->n; k++)
                check_decoded(a->item, (const char *)v->v + (size_t)k * a->item->size);
            break;
        }
        case MOONLET_ARG_BIN:
            CHECK(!a->max || ((const moonlet_str *)f)->len == a->max);
            break;
        case MOONLET_ARG_U64:
            CHECK(!a->max || *(const uint64_t *)f <= a->max);
            break;
        case MOONLET_ARG_STR_ARRAY: {
            const moonlet_strv *v = f;
            uint64_t cap = (a->flags & MOONLET_ARG_BATCH) ? FUZZ_BATCH_CAP : a->max;
            CHECK(!cap || v->n <= cap);
            for (uint32_t k = 0; k < v->n; k++) {
                CHECK(!a->elem_max || v->v[k].len <= a->elem_max);
                touch(v->v[k].ptr, v->v[k].len);
            }
            break;
        }
        case MOONLET_ARG_U64_ARRAY: {
            const moonlet_u64v *v = f;
            CHECK(!(a->flags & MOONLET_ARG_BATCH) || v->n <= FUZZ_BATCH_CAP);
            break;
        }
        default:
            break;
        }
    }
}

/* Runs args through every method's declared list of one table. */
static void fuzz_table_decode(const msgpack_object *args, const moonlet_rpc_method_decl *table,
                              size_t nmethods)
{
    _Alignas(16) unsigned char st[512], again[512];
    char err[768];
    for (size_t m = 0; m < nmethods; m++) {
        const moonlet_rpc_method_decl *d = &table[m];
        CHECK(d->spec->size <= sizeof(st));
        msgpack_zone zone;
        CHECK(msgpack_zone_init(&zone, 1024));
        int rc = moonlet_rpc_args_decode(d->name, d->spec, args, &zone, FUZZ_BATCH_CAP, st, err,
                                         sizeof(err));
        CHECK(rc == 0 || rc == MOONLET_ERR_INVALID_PARAMS);
        if (rc == MOONLET_ERR_INVALID_PARAMS)
            CHECK(strncmp(err, "bad arguments to ", 17) == 0);
        if (rc == 0 && !d->spec->variadic) {
            check_decoded(d->spec, st);
            /* pack what was decoded (all of its arguments) and decode again */
            uint32_t n = *(uint32_t *)st;
            msgpack_sbuffer sb;
            msgpack_sbuffer_init(&sb);
            msgpack_packer pk;
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
            msgpack_pack_array(&pk, n);
            moonlet_rpc_args_pack(d->spec, st, n, &pk);
            msgpack_object o;
            size_t off = 0;
            CHECK(msgpack_unpack(sb.data, sb.size, &off, &zone, &o) == MSGPACK_UNPACK_SUCCESS);
            CHECK(moonlet_rpc_args_decode(d->name, d->spec, &o, &zone, FUZZ_BATCH_CAP, again, err,
                                          sizeof(err)) == 0);
            CHECK(*(uint32_t *)again == n);
            msgpack_sbuffer_destroy(&sb);
        }
        msgpack_zone_destroy(&zone);
    }
}

static void fuzz_request(const char *body, size_t len)
{
    moonlet_request req, ref;
    uint64_t id = 0, ref_id = 0;
    int rc = moonlet_request_decode(body, len, &req, &id);
    msgpack_zone zone;
    CHECK(msgpack_zone_init(&zone, 4096));
    int ref_rc = moonlet_request_decode_ref(body, len, &zone, &ref, &ref_id);
    CHECK(rc == ref_rc && id == ref_id);
    if (rc == 0) {
        CHECK(moonlet_frame_body_check(body, len) == 0);
        CHECK(req.args->type == MSGPACK_OBJECT_ARRAY && req.id == id);
        CHECK(ref.id == req.id && ref.method == req.method);
        poke_getters(req.args, 0);
        fuzz_table_decode(req.args, moonlet_master_methods, moonlet_master_nmethods);
        fuzz_table_decode(req.args, moonlet_dummy_methods, moonlet_dummy_nmethods);
        roundtrip_request(&req);
        moonlet_request_destroy(&req);
        moonlet_request_destroy(&ref);
    }
    msgpack_zone_destroy(&zone);
}

static void fuzz_reply(const char *body, size_t len)
{
    moonlet_reply rep;
    if (moonlet_reply_decode(body, len, &rep) != 0) {
        CHECK(rep.result == NULL);
        return;
    }
    CHECK(moonlet_frame_body_check(body, len) == 0);
    if (rep.result->type == MSGPACK_OBJECT_ARRAY)
        poke_getters(rep.result, 0);
    moonlet_frame_builder b;
    moonlet_frame_builder_init(&b);
    msgpack_pack_object(moonlet_reply_begin(&b, rep.id, 0), *rep.result);
    moonlet_reply_patch_code(&b, rep.code);
    CHECK(moonlet_frame_finish(&b, UINT32_MAX) == 0);
    moonlet_reply again;
    CHECK(moonlet_reply_decode(b.buf.data + MOONLET_FRAME_HEADER_BYTES,
                               b.buf.size - MOONLET_FRAME_HEADER_BYTES, &again) == 0);
    CHECK(again.id == rep.id && again.code == rep.code && again.result->type == rep.result->type);
    moonlet_reply_destroy(&again);
    moonlet_frame_builder_destroy(&b);
    moonlet_reply_destroy(&rep);
}

/* The decoder (transport/frame.c) against msgpack-c's unpacker: the body,
 * wrapped as the result of a reply [1, 0, body], decodes the same with both
 * or with neither (msgpack_same.h). */
static void fuzz_against_msgpack(const char *body, size_t len)
{
    if (len > FUZZ_MAX_FRAME)
        return;
    char *w = malloc(len + 3);
    CHECK(w != NULL);
    memcpy(w, "\x93\x01\x00", 3);
    memcpy(w + 3, body, len);
    moonlet_reply rep;
    bool ours = moonlet_reply_decode(w, len + 3, &rep) == 0;
    bool scanned = moonlet_frame_body_check(w, len + 3) == 0;
    if (scanned) { /* msgpack-c may allocate for what the scan allowed only */
        msgpack_zone *z = msgpack_zone_new(4096);
        CHECK(z != NULL);
        msgpack_object ref;
        size_t off = 0;
        bool theirs = msgpack_unpack(w, len + 3, &off, z, &ref) == MSGPACK_UNPACK_SUCCESS &&
                      off == len + 3;
        CHECK(ours == theirs);
        if (ours)
            CHECK(msgpack_same_object(rep.result, &ref.via.array.ptr[2]));
        msgpack_zone_free(z);
    } else {
        CHECK(!ours);
    }
    if (ours)
        moonlet_reply_destroy(&rep);
    free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    size_t len = size;
    uint32_t blen;
    if (size >= MOONLET_FRAME_HEADER_BYTES &&
        moonlet_frame_header_decode(data, FUZZ_MAX_FRAME, &blen) == 0) {
        CHECK(blen >= 1 && blen <= FUZZ_MAX_FRAME);
        if (blen <= size - MOONLET_FRAME_HEADER_BYTES) {
            body += MOONLET_FRAME_HEADER_BYTES;
            len = blen;
        }
    }
    fuzz_request(body, len);
    fuzz_reply(body, len);
    fuzz_against_msgpack(body, len);
    return 0;
}
