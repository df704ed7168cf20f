/*
 * test_frame.c - unit tests of the frame codec (frame.c) and the argument
 * getters / packing helpers (wire.c).  Malformed bodies are written in hex so
 * each case shows exactly which bytes are on the wire.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "frame.h"
#include "moonlet/error.h"
#include "wire.h"
#include "../common/msgpack_same.h"
#include "../common/wire_assert.h"
#include "../common/test_main.h"

#define INVALID MOONLET_ERR_INVALID_PARAMS

/* Parses "93 05 02 90" (spaces optional) into out; returns the byte count. */
static size_t unhex(const char *s, char *out, size_t cap)
{
    size_t n = 0;
    int nib = -1;
    for (; *s; s++) {
        int v;
        if (*s >= '0' && *s <= '9')
            v = *s - '0';
        else if (*s >= 'a' && *s <= 'f')
            v = *s - 'a' + 10;
        else
            continue;
        if (nib < 0) {
            nib = v;
        } else {
            assert_true(n < cap);
            out[n++] = (char)(nib << 4 | v);
            nib = -1;
        }
    }
    assert_int_equal(nib, -1);
    return n;
}

/* Body of the one frame in b (asserts the header is consistent). */
static const char *only_body(const moonlet_frame_builder *b, uint32_t *len)
{
    assert_true(b->buf.size >= MOONLET_FRAME_HEADER_BYTES);
    assert_int_equal(moonlet_frame_header_decode((const uint8_t *)b->buf.data, SIZE_MAX, len), 0);
    assert_int_equal(*len + MOONLET_FRAME_HEADER_BYTES, b->buf.size);
    return b->buf.data + MOONLET_FRAME_HEADER_BYTES;
}

/* Finishes the one reply frame in b and decodes it into rep. */
static void finish_decode_reply(moonlet_frame_builder *b, moonlet_reply *rep)
{
    assert_int_equal(moonlet_frame_finish(b, 4096), 0);
    uint32_t len;
    const char *body = only_body(b, &len);
    assert_int_equal(moonlet_reply_decode(body, len, rep), 0);
}

/* ------------------------------------------------------------------ */
/* Header                                                               */
/* ------------------------------------------------------------------ */

static void test_header_encode_decode(void **state)
{
    uint8_t h[4];
    uint32_t len = 77;
    moonlet_frame_header_encode(h, 0x01020304u);
    assert_memory_equal(h, "\x01\x02\x03\x04", 4);
    assert_int_equal(moonlet_frame_header_decode(h, 0x01020304u, &len), 0);
    assert_int_equal(len, 0x01020304u);

    len = 77;
    assert_int_equal(moonlet_frame_header_decode(h, 0x01020303u, &len), INVALID); /* max + 1 */
    assert_int_equal(len, 77);

    moonlet_frame_header_encode(h, 0);
    assert_int_equal(moonlet_frame_header_decode(h, SIZE_MAX, &len), INVALID);

    moonlet_frame_header_encode(h, UINT32_MAX);
    assert_int_equal(moonlet_frame_header_decode(h, SIZE_MAX, &len), 0);
    assert_int_equal(len, UINT32_MAX);
    assert_int_equal(moonlet_frame_header_decode(h, MOONLET_DEFAULT_MAX_FRAME, &len), INVALID);

    moonlet_frame_header_encode(h, 1);
    assert_int_equal(moonlet_frame_header_decode(h, 1, &len), 0);
    assert_int_equal(len, 1);
}

/* ------------------------------------------------------------------ */
/* Round trips                                                          */
/* ------------------------------------------------------------------ */

static void test_request_roundtrip(void **state)
{
    const uint64_t ids[] = {0, 1, 127, 128, 65536, UINT32_MAX, (uint64_t)UINT32_MAX + 1, UINT64_MAX};
    const uint32_t methods[] = {0, 11, 255, 65536, UINT32_MAX};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        moonlet_frame_builder b;
        moonlet_frame_builder_init(&b);
        uint32_t method = methods[i % 5];
        msgpack_packer *pk = moonlet_request_begin(&b, ids[i], method, 2);
        moonlet_pack_cstr(pk, "tenant");
        msgpack_pack_uint64(pk, 4096);
        assert_int_equal(moonlet_frame_finish(&b, MOONLET_DEFAULT_MAX_FRAME), 0);

        uint32_t len;
        const char *body = only_body(&b, &len);
        moonlet_request req;
        uint64_t id = 99;
        assert_int_equal(moonlet_request_decode(body, len, &req, &id), 0);
        assert_true(id == ids[i] && req.id == ids[i]);
        assert_int_equal(req.method, method);
        assert_int_equal(req.args->type, MSGPACK_OBJECT_ARRAY);
        assert_int_equal(moonlet_wire_len(req.args), 2);

        /* self-contained: clobbering the input does not change the result */
        memset(b.buf.data, 0xff, b.buf.size);
        uint64_t size;
        assert_wire_bytes(req.args, 0, "tenant", 6);
        assert_int_equal(moonlet_wire_u64(req.args, 1, &size), 0);
        assert_int_equal(size, 4096);
        moonlet_request_destroy(&req);
        moonlet_frame_builder_destroy(&b);
    }
}

static void test_request_decode_ref_zero_copy(void **state)
{
    char body[64];
    size_t n = unhex("93 07 0b 92 a1 74 a3 6b 65 79", body, sizeof(body)); /* [7, 11, ["t","key"]] */
    msgpack_zone zone;
    assert_true(msgpack_zone_init(&zone, 1024));
    moonlet_request req;
    uint64_t id;
    assert_int_equal(moonlet_request_decode_ref(body, n, &zone, &req, &id), 0);
    assert_int_equal(id, 7);
    assert_int_equal(req.method, 11);
    const char *key;
    uint32_t klen;
    assert_int_equal(moonlet_wire_str(req.args, 1, &key, &klen), 0);
    assert_true(key > body && key + klen <= body + n); /* points into the caller's buffer */
    assert_null(req.unp.zone);
    moonlet_request_destroy(&req); /* no-op: the zone belongs to the caller */
    msgpack_zone_clear(&zone);

    n = unhex("92 07 0b", body, sizeof(body));
    assert_int_equal(moonlet_request_decode_ref(body, n, &zone, &req, &id), INVALID);
    assert_int_equal(id, 7);
    msgpack_zone_destroy(&zone);
}

static void test_reply_roundtrip(void **state)
{
    moonlet_frame_builder b;
    moonlet_frame_builder_init(&b);
    msgpack_packer *pk = moonlet_reply_begin(&b, 42, MOONLET_ERR_OBJECT_NOT_FOUND);
    msgpack_pack_map(pk, 1);
    moonlet_pack_key(pk, "size");
    msgpack_pack_uint64(pk, 1u << 20);
    assert_int_equal(moonlet_frame_finish(&b, 1024), 0);

    uint32_t len;
    const char *body = only_body(&b, &len);
    assert_int_equal((uint8_t)body[2], 0xd2); /* code in fixed int32 form */
    moonlet_reply rep;
    assert_int_equal(moonlet_reply_decode(body, len, &rep), 0);
    memset(b.buf.data, 0, b.buf.size);
    assert_int_equal(rep.id, 42);
    assert_int_equal(rep.code, MOONLET_ERR_OBJECT_NOT_FOUND);
    const msgpack_object *v = moonlet_wire_map_get(rep.result, "size");
    assert_non_null(v);
    assert_int_equal(v->via.u64, 1u << 20);
    moonlet_reply_destroy(&rep);
    moonlet_frame_builder_destroy(&b);
}

static void test_reply_code_any_int_encoding(void **state)
{
    static const struct {
        const char *hex;
        uint64_t id;
        int32_t code;
    } ok[] = {
        {"93 05 00 c0", 5, 0},
        {"93 05 cc 05 c0", 5, 5},
        {"93 05 e0 c0", 5, -32},
        {"93 05 d0 80 c0", 5, -128},
        {"93 05 d1 fd a8 c0", 5, -600},
        {"93 05 d2 ff ff fd a8 c0", 5, -600},
        {"93 05 d3 ff ff ff ff ff ff fd a8 c0", 5, -600},
        {"93 05 d3 ff ff ff ff 80 00 00 00 c0", 5, INT32_MIN},
        {"93 05 ce 7f ff ff ff c0", 5, INT32_MAX},
        {"93 cd 01 00 00 c0", 256, 0},
        {"93 d0 07 00 c0", 7, 0},   /* non-negative id in a signed form */
        {"93 d3 00 00 00 00 00 00 00 09 00 c0", 9, 0},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char body[64];
        size_t n = unhex(ok[i].hex, body, sizeof(body));
        moonlet_reply rep;
        assert_int_equal(moonlet_reply_decode(body, n, &rep), 0);
        assert_int_equal(rep.id, ok[i].id);
        assert_int_equal(rep.code, ok[i].code);
        assert_int_equal(rep.result->type, MSGPACK_OBJECT_NIL);
        moonlet_reply_destroy(&rep);
    }
}

static void test_reply_code_patch(void **state)
{
    const uint64_t ids[] = {0, 1, 127, 128, 255, 256, 65535, 65536, UINT32_MAX,
                            (uint64_t)UINT32_MAX + 1, UINT64_MAX};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        moonlet_frame_builder b;
        moonlet_frame_builder_init(&b);
        msgpack_packer *pk = moonlet_reply_begin(&b, ids[i], 0);
        moonlet_pack_cstr(pk, "result");
        moonlet_reply_patch_code(&b, MOONLET_ERR_OBJECT_HAS_LEASE);
        moonlet_reply rep;
        finish_decode_reply(&b, &rep);
        assert_true(rep.id == ids[i]);
        assert_int_equal(rep.code, MOONLET_ERR_OBJECT_HAS_LEASE);
        assert_int_equal(rep.result->type, MSGPACK_OBJECT_STR);
        moonlet_reply_destroy(&rep);

        /* no frame open any more: patching is a no-op */
        size_t size = b.buf.size;
        char copy[64];
        memcpy(copy, b.buf.data, size);
        moonlet_reply_patch_code(&b, 1234);
        assert_int_equal(b.buf.size, size);
        assert_memory_equal(b.buf.data, copy, size);
        moonlet_frame_builder_destroy(&b);
    }
}

/* The HA epoch as a 4th reply element (frame.h): packed after the result,
 * the code still patched in place; a 3-element reply decodes with epoch 0. */
static void test_reply_epoch(void **state)
{
    const uint64_t epochs[] = {1, 127, 128, 65536, UINT64_MAX};
    for (size_t i = 0; i < sizeof(epochs) / sizeof(epochs[0]); i++) {
        moonlet_frame_builder b;
        moonlet_frame_builder_init(&b);
        msgpack_packer *pk = moonlet_reply_begin_ex(&b, 300 + i, 0, true);
        moonlet_pack_cstr(pk, "10.0.0.2:50051");
        msgpack_pack_uint64(pk, epochs[i]);
        moonlet_reply_patch_code(&b, MOONLET_ERR_NOT_LEADER);
        moonlet_reply rep;
        finish_decode_reply(&b, &rep);
        assert_true(rep.id == 300 + i);
        assert_int_equal(rep.code, MOONLET_ERR_NOT_LEADER);
        assert_true(rep.epoch == epochs[i]);
        assert_int_equal(rep.result->type, MSGPACK_OBJECT_STR);
        moonlet_reply_destroy(&rep);
        moonlet_frame_builder_destroy(&b);
    }
    moonlet_frame_builder b;
    moonlet_frame_builder_init(&b);
    msgpack_pack_nil(moonlet_reply_begin_ex(&b, 7, 0, false));
    moonlet_reply rep;
    finish_decode_reply(&b, &rep);
    assert_true(rep.epoch == 0);
    moonlet_reply_destroy(&rep);
    moonlet_frame_builder_destroy(&b);
}

/* ------------------------------------------------------------------ */
/* Malformed bodies                                                     */
/* ------------------------------------------------------------------ */

static void test_request_malformed(void **state)
{
    static const struct {
        const char *what, *hex;
        uint64_t id; /* what id_out must report */
        bool wellformed;
    } bad[] = {
        {"not an array: int", "01", 0, true},
        {"not an array: map", "81 a1 61 01", 0, true},
        {"not an array: str", "a3 61 62 63", 0, true},
        {"not an array: nil", "c0", 0, true},
        {"empty array", "90", 0, true},
        {"array of 2", "92 05 02", 5, true},
        {"array of 4", "94 05 02 90 c0", 5, true},
        {"array16 of 2", "dc 00 02 05 02", 5, true},
        {"id is a string", "93 a1 78 02 90", 0, true},
        {"id is negative", "93 ff 02 90", 0, true},
        {"id is negative int8", "93 d0 80 02 90", 0, true},
        {"id is a float", "93 cb 3f f0 00 00 00 00 00 00 02 90", 0, true},
        {"id is nil", "93 c0 02 90", 0, true},
        {"method is negative", "93 05 ff 90", 5, true},
        {"method is negative int32", "93 05 d2 ff ff ff 00 90", 5, true},
        {"method above uint32", "93 05 cf 00 00 00 01 00 00 00 00 90", 5, true},
        {"method is a string", "93 05 a1 78 90", 5, true},
        {"method is a bool", "93 05 c3 90", 5, true},
        {"args is nil", "93 05 02 c0", 5, true},
        {"args is a map", "93 05 02 80", 5, true},
        {"args is an int", "93 05 02 07", 5, true},
        {"args is a string", "93 05 02 a0", 5, true},
        {"id in uint64 form, args nil", "93 cf 00 00 00 00 00 00 00 09 02 c0", 9, true},
        {"truncated inside args", "93 05 02 92 a3 61 62", 5, false},
        {"truncated inside id", "93 cd 01", 0, false},
        {"truncated after header", "93", 0, false},
        {"truncated str32 length", "93 05 02 91 db 00 00", 5, false},
        {"trailing byte", "93 05 02 90 c0", 5, false},
        {"two requests in one body", "93 05 02 90 93 06 02 90", 5, false},
        {"reserved byte 0xc1", "c1", 0, false},
        {"reserved byte inside args", "93 05 02 91 c1", 5, false},
        {"garbage", "ff ee dd cc bb aa 99 88 77", 0, false},
        {"huge array32, short data", "dd ff ff ff ff 01 02", 1, false},
        {"huge array32 as args", "93 05 02 dd ff ff ff ff 01", 5, false},
        {"nested huge arrays", "93 05 02 91 dd ff ff ff ff dd ff ff ff ff dd ff ff ff ff", 5, false},
        {"huge map32", "93 05 02 91 df ff ff ff ff 01 01", 5, false},
        {"huge array16", "93 05 02 dc ff ff 01 02 03", 5, false},
        {"huge str32", "93 05 02 91 db ff ff ff ff 61", 5, false},
        {"huge bin32", "93 05 02 91 c6 7f ff ff ff 00", 5, false},
        {"huge ext32", "93 05 02 91 c9 ff ff ff ff 01", 5, false},
        {"fixext16 truncated", "93 05 02 91 d8 01 02", 5, false},
    };
    msgpack_zone zone;
    assert_true(msgpack_zone_init(&zone, 4096));
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char hex[128];
        size_t n = unhex(bad[i].hex, hex, sizeof(hex));
        char *body = malloc(n); /* exact size, so ASan sees any over-read */
        assert_non_null(body);
        memcpy(body, hex, n);
        moonlet_request req;
        uint64_t id = 12345;
        int rc = moonlet_request_decode(body, n, &req, &id);
        if (rc != INVALID || id != bad[i].id)
            fail_msg("case '%s': rc %d id %llu (want %d id %llu)", bad[i].what, rc,
                     (unsigned long long)id, INVALID, (unsigned long long)bad[i].id);
        /* shape and type errors are well-formed msgpack; the rest are not */
        if ((moonlet_frame_body_check(body, n) == 0) != bad[i].wellformed)
            fail_msg("case '%s': body_check disagrees", bad[i].what);
        id = 12345; /* the zero-copy decoder reads `body` itself: same answer */
        rc = moonlet_request_decode_ref(body, n, &zone, &req, &id);
        msgpack_zone_clear(&zone);
        if (rc != INVALID || id != bad[i].id)
            fail_msg("case '%s' (ref): rc %d id %llu", bad[i].what, rc, (unsigned long long)id);
        free(body);
    }
    msgpack_zone_destroy(&zone);
    moonlet_request req;
    uint64_t id = 1;
    assert_int_equal(moonlet_request_decode("", 0, &req, &id), INVALID);
    assert_int_equal(id, 0);
    assert_int_equal(moonlet_request_decode(NULL, 5, &req, &id), INVALID);
}

static void test_deep_nesting(void **state)
{
    enum { DEPTH = 100000 };
    char *body = malloc(DEPTH + 8);
    assert_non_null(body);
    size_t n = unhex("93 05 02", body, 8);
    memset(body + n, 0x91, DEPTH); /* [[[[...nil...]]]] */
    n += DEPTH;
    body[n++] = (char)0xc0;
    assert_int_equal(moonlet_frame_body_check(body, n), 0); /* well formed ... */
    moonlet_request req;
    uint64_t id;
    assert_int_equal(moonlet_request_decode(body, n, &req, &id), INVALID); /* ... but too deep */
    assert_int_equal(id, 5);
    assert_int_equal(moonlet_frame_body_check(body, n - 1), INVALID); /* incomplete */

    n = unhex("93 05 02 91 91 91 91 91 91 91 91 c0", body, 16); /* moderate depth is fine */
    assert_int_equal(moonlet_request_decode(body, n, &req, &id), 0);
    moonlet_request_destroy(&req);
    free(body);
}

static void test_reply_malformed(void **state)
{
    static const struct {
        const char *what, *hex;
    } bad[] = {
        {"not an array", "c0"},
        {"array of 2", "92 05 00"},
        {"array of 4, epoch nil", "94 05 00 c0 c0"},
        {"array of 4, epoch negative", "94 05 00 c0 ff"},
        {"array of 4, epoch string", "94 05 00 c0 a1 31"},
        {"array of 5", "95 05 00 c0 01 01"},
        {"id negative", "93 ff 00 c0"},
        {"id string", "93 a0 00 c0"},
        {"code string", "93 05 a1 30 c0"},
        {"code nil", "93 05 c0 c0"},
        {"code float", "93 05 ca 00 00 00 00 c0"},
        {"code above int32", "93 05 ce 80 00 00 00 c0"},
        {"code below int32", "93 05 d3 ff ff ff ff 7f ff ff ff c0"},
        {"truncated result", "93 05 00 a5 61"},
        {"missing result", "93 05 00"},
        {"trailing byte", "93 05 00 c0 c0"},
        {"garbage", "c1 00"},
        {"huge result array", "93 05 00 dd ff ff ff ff"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char hex[64];
        size_t n = unhex(bad[i].hex, hex, sizeof(hex));
        char *body = malloc(n);
        assert_non_null(body);
        memcpy(body, hex, n);
        moonlet_reply rep;
        int rc = moonlet_reply_decode(body, n, &rep);
        free(body);
        if (rc != INVALID)
            fail_msg("case '%s': rc %d", bad[i].what, rc);
        assert_null(rep.result);
        assert_null(rep.unp.zone);
    }
    moonlet_reply rep;
    assert_int_equal(moonlet_reply_decode("", 0, &rep), INVALID);
}

/* moonlet_frame_body_check() of the bytes written in hex, copied to a
 * buffer of exactly their size (so a read past the end is caught). */
static int body_check_hex(const char *text)
{
    char hex[64];
    size_t n = unhex(text, hex, sizeof(hex));
    char *b = malloc(n);
    assert_non_null(b);
    memcpy(b, hex, n);
    int rc = moonlet_frame_body_check(b, n);
    free(b);
    return rc;
}

static void test_body_check(void **state)
{
    static const char *const valid[] = {
        "c0", "c2", "c3", "00", "7f", "e0", "ff", "cc ff", "cd ff ff", "ce 00 00 00 01",
        "cf 00 00 00 00 00 00 00 01", "d0 80", "d1 80 00", "d2 80 00 00 00",
        "d3 80 00 00 00 00 00 00 00", "ca 00 00 00 00", "cb 00 00 00 00 00 00 00 00",
        "a0", "a3 61 62 63", "d9 01 61", "da 00 01 61", "db 00 00 00 01 61",
        "c4 00", "c5 00 01 00", "c6 00 00 00 01 00", "c7 01 05 aa", "c8 00 01 05 aa",
        "c9 00 00 00 01 05 aa", "d4 01 aa", "d5 01 aa bb", "d6 01 00 00 00 00",
        "d7 01 00 00 00 00 00 00 00 00", "d8 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00",
        "90", "80", "dc 00 00", "dd 00 00 00 00", "de 00 00", "df 00 00 00 00",
        "92 01 02", "dc 00 02 01 02", "82 a1 61 01 a1 62 92 c0 c3", "de 00 01 01 02",
    };
    static const char *const invalid[] = {
        "c1", "cc", "cd 00", "d9", "d9 02 61", "a2 61", "92 01", "81 01", "82 01 02 03",
        "c0 c0", "dd 00 00 00", "c7 02 05 aa", "d8 01 00",
    };
    for (size_t i = 0; i < sizeof(valid) / sizeof(valid[0]); i++)
        if (body_check_hex(valid[i]) != 0)
            fail_msg("valid '%s' rejected", valid[i]);
    for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++)
        if (body_check_hex(invalid[i]) != INVALID)
            fail_msg("invalid '%s' accepted", invalid[i]);
    assert_int_equal(moonlet_frame_body_check(NULL, 1), INVALID);
    assert_int_equal(moonlet_frame_body_check("", 0), INVALID);
}

/* ------------------------------------------------------------------ */
/* Builder                                                              */
/* ------------------------------------------------------------------ */

static void test_builder_overflow_drops_frame(void **state)
{
    moonlet_frame_builder b;
    moonlet_frame_builder_init(&b);
    msgpack_packer *pk = moonlet_request_begin(&b, 1, 2, 0);
    assert_int_equal(moonlet_frame_finish(&b, 100), 0);
    size_t first = b.buf.size;

    pk = moonlet_reply_begin(&b, 2, 0);
    char big[1000];
    memset(big, 'x', sizeof(big));
    moonlet_pack_str(pk, big, sizeof(big));
    assert_int_equal(moonlet_frame_finish(&b, 100), MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(b.buf.size, first);   /* dropped */
    assert_true(b.frame_start == SIZE_MAX); /* and closed */

    pk = moonlet_reply_begin(&b, 3, 0);
    moonlet_pack_str(pk, big, 90); /* body = 1 + 1 + 5 + 2 + 90 = 99 bytes */
    assert_int_equal(moonlet_frame_finish(&b, 99), 0); /* exactly max */

    uint32_t len;
    assert_int_equal(moonlet_frame_header_decode((uint8_t *)b.buf.data, 100, &len), 0);
    assert_int_equal(MOONLET_FRAME_HEADER_BYTES + len, first);
    assert_int_equal(moonlet_frame_header_decode((uint8_t *)b.buf.data + first, 99, &len), 0);
    assert_int_equal(first + MOONLET_FRAME_HEADER_BYTES + len, b.buf.size);
    moonlet_reply rep;
    assert_int_equal(moonlet_reply_decode(b.buf.data + first + 4, len, &rep), 0);
    assert_int_equal(rep.id, 3);
    moonlet_reply_destroy(&rep);
    moonlet_frame_builder_destroy(&b);
}

static void test_builder_misuse(void **state)
{
    moonlet_frame_builder b;
    moonlet_frame_builder_init(&b);
    assert_int_equal(moonlet_frame_finish(&b, 100), INVALID); /* nothing begun */
    moonlet_frame_begin(&b);
    assert_int_equal(moonlet_frame_finish(&b, 100), INVALID); /* empty body */
    assert_int_equal(b.buf.size, 0);

    msgpack_pack_nil(moonlet_frame_begin(&b));
    msgpack_pack_true(moonlet_frame_begin(&b)); /* discards the unfinished frame */
    assert_int_equal(moonlet_frame_finish(&b, 100), 0);
    assert_int_equal(b.buf.size, 5);
    assert_int_equal((uint8_t)b.buf.data[4], 0xc3);

    moonlet_frame_begin(&b);
    msgpack_pack_nil(&b.pk);
    moonlet_frame_abort(&b);
    assert_int_equal(b.buf.size, 5);

    /* reset keeps small buffers and releases big ones */
    moonlet_frame_builder_reset(&b);
    assert_int_equal(b.buf.size, 0);
    assert_non_null(b.buf.data);
    msgpack_packer *pk = moonlet_frame_begin(&b);
    msgpack_pack_bin(pk, 2u << 20);
    char *chunk = calloc(1, 2u << 20);
    assert_non_null(chunk);
    msgpack_pack_bin_body(pk, chunk, 2u << 20);
    free(chunk);
    assert_int_equal(moonlet_frame_finish(&b, MOONLET_DEFAULT_MAX_FRAME), 0);
    moonlet_frame_builder_reset(&b);
    assert_int_equal(b.buf.size, 0);
    assert_true(b.buf.alloc <= (1u << 20));
    moonlet_request_begin(&b, 1, 1, 0); /* still usable after the release */
    assert_int_equal(moonlet_frame_finish(&b, 100), 0);
    moonlet_frame_builder_destroy(&b);
}

static void test_builder_pipelined(void **state)
{
    enum { N = 50 };
    moonlet_frame_builder b;
    moonlet_frame_builder_init(&b);
    for (int i = 0; i < N; i++) {
        if (i % 2 == 0) {
            msgpack_packer *pk = moonlet_request_begin(&b, (uint64_t)i + 1, 10, 1);
            msgpack_pack_int(pk, i);
        } else {
            msgpack_packer *pk = moonlet_reply_begin(&b, (uint64_t)i + 1, 0);
            msgpack_pack_int(pk, i);
            moonlet_reply_patch_code(&b, -i);
        }
        assert_int_equal(moonlet_frame_finish(&b, 1024), 0);
    }
    size_t off = 0;
    for (int i = 0; i < N; i++) {
        uint32_t len;
        assert_true(off + 4 <= b.buf.size);
        assert_int_equal(moonlet_frame_header_decode((uint8_t *)b.buf.data + off, 1024, &len), 0);
        const char *body = b.buf.data + off + 4;
        if (i % 2 == 0) {
            moonlet_request req;
            uint64_t id;
            assert_int_equal(moonlet_request_decode(body, len, &req, &id), 0);
            assert_int_equal(req.id, (uint64_t)i + 1);
            int64_t v;
            assert_int_equal(moonlet_wire_i64(req.args, 0, &v), 0);
            assert_int_equal(v, i);
            moonlet_request_destroy(&req);
        } else {
            moonlet_reply rep;
            assert_int_equal(moonlet_reply_decode(body, len, &rep), 0);
            assert_int_equal(rep.id, (uint64_t)i + 1);
            assert_int_equal(rep.code, -i);
            moonlet_reply_destroy(&rep);
        }
        off += 4 + len;
    }
    assert_int_equal(off, b.buf.size);
    moonlet_frame_builder_destroy(&b);
}

/* ------------------------------------------------------------------ */
/* wire.h                                                               */
/* ------------------------------------------------------------------ */

/* args = [5, -3, true, "hello", bin "ab\0c", [1, 2], {"k": 7, "z": "v"}, nil, 1.5, UINT64_MAX] */
static moonlet_request decode_wire_args(moonlet_frame_builder *b)
{
    moonlet_frame_builder_init(b);
    msgpack_packer *pk = moonlet_request_begin(b, 1, 2, 10);
    msgpack_pack_uint64(pk, 5);
    msgpack_pack_int64(pk, -3);
    msgpack_pack_true(pk);
    moonlet_pack_cstr(pk, "hello");
    msgpack_pack_bin(pk, 4);
    msgpack_pack_bin_body(pk, "ab\0c", 4);
    msgpack_pack_array(pk, 2);
    msgpack_pack_int(pk, 1);
    msgpack_pack_int(pk, 2);
    msgpack_pack_map(pk, 2);
    moonlet_pack_key(pk, "k");
    msgpack_pack_int(pk, 7);
    moonlet_pack_key(pk, "z");
    moonlet_pack_cstr(pk, "v");
    msgpack_pack_nil(pk);
    msgpack_pack_double(pk, 1.5);
    msgpack_pack_uint64(pk, UINT64_MAX);
    assert_int_equal(moonlet_frame_finish(b, 4096), 0);
    moonlet_request req;
    uint64_t id;
    assert_int_equal(moonlet_request_decode(b->buf.data + 4, b->buf.size - 4, &req, &id), 0);
    return req;
}

static void test_wire_getters(void **state)
{
    moonlet_frame_builder b;
    moonlet_request req = decode_wire_args(&b);
    const msgpack_object *a = req.args;
    uint64_t u = 111;
    int64_t i = 111;
    bool t = false;
    const char *s = NULL;
    uint32_t sl = 111;
    const msgpack_object *o = NULL;

    assert_int_equal(moonlet_wire_len(a), 10);
    assert_int_equal(moonlet_wire_u64(a, 0, &u), 0);
    assert_int_equal(u, 5);
    assert_int_equal(moonlet_wire_u64(a, 9, &u), 0);
    assert_true(u == UINT64_MAX);
    u = 111;
    assert_int_equal(moonlet_wire_u64(a, 1, &u), INVALID); /* negative */
    assert_int_equal(moonlet_wire_u64(a, 3, &u), INVALID); /* string */
    assert_int_equal(moonlet_wire_u64(a, 8, &u), INVALID); /* float */
    assert_int_equal(moonlet_wire_u64(a, 10, &u), INVALID); /* out of range */
    assert_int_equal(moonlet_wire_u64(a, UINT32_MAX, &u), INVALID);
    assert_int_equal(u, 111); /* untouched on failure */

    assert_int_equal(moonlet_wire_i64(a, 0, &i), 0);
    assert_int_equal(i, 5);
    assert_int_equal(moonlet_wire_i64(a, 1, &i), 0);
    assert_int_equal(i, -3);
    assert_int_equal(moonlet_wire_i64(a, 9, &i), INVALID); /* above INT64_MAX */
    assert_int_equal(moonlet_wire_i64(a, 2, &i), INVALID);
    assert_int_equal(moonlet_wire_i64(a, 10, &i), INVALID);
    assert_int_equal(i, -3);

    assert_int_equal(moonlet_wire_bool(a, 2, &t), 0);
    assert_true(t);
    assert_int_equal(moonlet_wire_bool(a, 0, &t), INVALID);
    assert_int_equal(moonlet_wire_bool(a, 7, &t), INVALID); /* nil is not false */

    assert_wire_bytes(a, 3, "hello", 5);
    assert_wire_bytes(a, 4, "ab\0c", 4); /* bin accepted */
    assert_int_equal(moonlet_wire_str(a, 0, &s, &sl), INVALID);
    assert_int_equal(moonlet_wire_str(a, 7, &s, &sl), INVALID);
    assert_int_equal(moonlet_wire_strn(a, 3, 5, &s, &sl), 0);
    sl = 111;
    assert_int_equal(moonlet_wire_strn(a, 3, 4, &s, &sl), INVALID); /* too long */
    assert_int_equal(moonlet_wire_strn(a, 4, 3, &s, &sl), INVALID);
    assert_int_equal(sl, 111);

    assert_int_equal(moonlet_wire_array(a, 5, &o), 0);
    assert_int_equal(moonlet_wire_len(o), 2);
    assert_int_equal(moonlet_wire_u64(o, 1, &u), 0);
    assert_int_equal(u, 2);
    assert_int_equal(moonlet_wire_array(a, 6, &o), INVALID);
    assert_int_equal(moonlet_wire_map(a, 6, &o), 0);
    assert_int_equal(o->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(moonlet_wire_map(a, 5, &o), INVALID);
    assert_int_equal(moonlet_wire_map(a, 42, &o), INVALID);

    const msgpack_object *map = o;
    const msgpack_object *v = moonlet_wire_map_get(map, "k");
    assert_non_null(v);
    assert_int_equal(v->via.u64, 7);
    v = moonlet_wire_map_get(map, "z");
    assert_non_null(v);
    assert_int_equal(v->type, MSGPACK_OBJECT_STR);
    assert_null(moonlet_wire_map_get(map, "missing"));
    assert_null(moonlet_wire_map_get(map, "kk"));
    assert_null(moonlet_wire_map_get(map, ""));
    assert_null(moonlet_wire_map_get(map, NULL));
    assert_null(moonlet_wire_map_get(a, "k")); /* not a map */
    assert_null(moonlet_wire_map_get(NULL, "k"));

    /* not an array / NULL */
    assert_int_equal(moonlet_wire_len(map), 0);
    assert_int_equal(moonlet_wire_len(NULL), 0);
    assert_null(moonlet_wire_at(a, 10));
    assert_non_null(moonlet_wire_at(a, 9));
    assert_null(moonlet_wire_at(map, 0));
    assert_null(moonlet_wire_at(NULL, 0));
    assert_int_equal(moonlet_wire_u64(map, 0, &u), INVALID);
    assert_int_equal(moonlet_wire_u64(NULL, 0, &u), INVALID);
    assert_int_equal(moonlet_wire_str(NULL, 0, &s, &sl), INVALID);

    moonlet_request_destroy(&req);
    moonlet_frame_builder_destroy(&b);
}

/* msgpack-c leaves ptr NULL for empty strings; the getters must not. */
static void test_wire_empty_strings(void **state)
{
    char body[32];
    size_t n = unhex("93 01 02 93 a0 c4 00 81 a0 01", body, sizeof(body)); /* ["", bin(0), {"": 1}] */
    moonlet_request req;
    uint64_t id;
    assert_int_equal(moonlet_request_decode(body, n, &req, &id), 0);
    const char *p = NULL;
    uint32_t len = 9;
    assert_int_equal(moonlet_wire_str(req.args, 0, &p, &len), 0);
    assert_non_null(p);
    assert_int_equal(len, 0);
    p = NULL;
    assert_int_equal(moonlet_wire_strn(req.args, 1, 0, &p, &len), 0);
    assert_non_null(p);
    const msgpack_object *map;
    assert_int_equal(moonlet_wire_map(req.args, 2, &map), 0);
    const msgpack_object *v = moonlet_wire_map_get(map, "");
    assert_non_null(v);
    assert_int_equal(v->via.u64, 1);
    assert_null(moonlet_wire_map_get(map, "x"));
    moonlet_request_destroy(&req);

    msgpack_sbuffer sb; /* packing an empty string from a NULL pointer */
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    moonlet_pack_str(&pk, NULL, 0);
    assert_int_equal(sb.size, 1);
    assert_int_equal((uint8_t)sb.data[0], 0xa0);
    msgpack_sbuffer_destroy(&sb);
}

static void test_pack_helpers(void **state)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    moonlet_pack_cstr(&pk, NULL);
    moonlet_pack_cstr(&pk, "");
    moonlet_pack_str(&pk, "a\0b", 3);
    moonlet_pack_key(&pk, "key");
    assert_int_equal(sb.size, 1 + 1 + 4 + 4);
    assert_memory_equal(sb.data, "\xc0\xa0\xa3" "a\0b" "\xa3" "key", sb.size);
    msgpack_sbuffer_destroy(&sb);
}

/* moonlet_pack_str_array writes the bytes msgpack_pack_array + one
 * moonlet_pack_str (moonlet_str input) or moonlet_pack_cstr (C strings) per
 * element would: every header width (fixstr, str8, str16, str32), a {NULL,
 * 0} moonlet_str ("") and a NULL C string (nil), empty strings, elements
 * that straddle a 4 KiB chunk and elements larger than one. */
static void test_pack_str_array(void **state)
{
    static const size_t lens[] = {0,   1,    31,   32,   255,   256,   4000, 4091,
                                  17,  4096, 5000, 65535, 65536, 70000, 3,   0};
    enum { N = sizeof(lens) / sizeof(lens[0]) + 2 };
    char *bodies[N];
    moonlet_str v[N];
    const char *cv[N];
    for (size_t k = 0; k < N; k++) {
        size_t len = k < N - 2 ? lens[k] : 0;
        bodies[k] = malloc(len + 1);
        assert_non_null(bodies[k]);
        for (size_t i = 0; i < len; i++)
            bodies[k][i] = (char)('a' + (k + i) % 26);
        bodies[k][len] = 0;
        bool nil = k >= N - 2 || k == 5;
        v[k] = (moonlet_str){nil ? NULL : bodies[k], nil ? 0 : (uint32_t)len};
        cv[k] = nil ? NULL : bodies[k];
    }
    for (int form = 0; form < 2; form++) {
        msgpack_sbuffer want, got;
        msgpack_packer pw, pg;
        msgpack_sbuffer_init(&want);
        msgpack_sbuffer_init(&got);
        msgpack_packer_init(&pw, &want, msgpack_sbuffer_write);
        msgpack_packer_init(&pg, &got, msgpack_sbuffer_write);
        msgpack_pack_array(&pw, N);
        for (size_t k = 0; k < N; k++) {
            if (form == 0)
                moonlet_pack_str(&pw, v[k].ptr, v[k].len);
            else
                moonlet_pack_cstr(&pw, cv[k]);
        }
        moonlet_pack_str_array(&pg, form == 0 ? v : NULL, cv, N);
        assert_int_equal(got.size, want.size);
        assert_memory_equal(got.data, want.data, want.size);
        msgpack_sbuffer_destroy(&want);
        msgpack_sbuffer_destroy(&got);
    }
    for (size_t k = 0; k < N; k++)
        free(bodies[k]);
}

/* Decodes body, a reply [id, code, result], with moonlet_reply_decode and
 * with msgpack_unpack (the reference) and asserts they agree: both refuse
 * it, or both accept it with the same result (msgpack_same.h). */
static void assert_decodes_like_msgpack(const char *body, size_t len)
{
    msgpack_zone *z = msgpack_zone_new(1024);
    assert_non_null(z);
    msgpack_object ref;
    size_t off = 0;
    bool ref_ok = msgpack_unpack(body, len, &off, z, &ref) == MSGPACK_UNPACK_SUCCESS &&
                  off == len && ref.type == MSGPACK_OBJECT_ARRAY && ref.via.array.size == 3;
    moonlet_reply rep;
    int rc = moonlet_reply_decode(body, len, &rep);
    assert_int_equal(rc == 0, ref_ok);
    if (rc == 0) {
        assert_true(msgpack_same_object(rep.result, &ref.via.array.ptr[2]));
        moonlet_reply_destroy(&rep);
    }
    msgpack_zone_free(z);
}

/* Packs a random object of at most `depth` levels: every type the packer
 * writes, strings and bins of every header width, maps and arrays. */
static void pack_random(msgpack_packer *pk, unsigned *seed, int depth)
{
    static char blob[70000];
    int kind = rand_r(seed) % (depth > 0 ? 13 : 11);
    uint64_t big = ((uint64_t)rand_r(seed) << 33) ^ ((uint64_t)rand_r(seed) << 7) ^ (uint64_t)rand_r(seed);
    static const size_t widths[] = {0, 5, 31, 32, 200, 255, 256, 1000, 65535, 65536};
    size_t w = widths[rand_r(seed) % 10];
    switch (kind) {
    case 0: msgpack_pack_nil(pk); break;
    case 1: rand_r(seed) & 1 ? msgpack_pack_true(pk) : msgpack_pack_false(pk); break;
    case 2: msgpack_pack_uint64(pk, big >> (rand_r(seed) % 64)); break;
    case 3: msgpack_pack_int64(pk, -(int64_t)(big >> (1 + rand_r(seed) % 63)) - 1); break;
    case 4: msgpack_pack_float(pk, (float)rand_r(seed) / 7.0f); break;
    case 5: msgpack_pack_double(pk, (double)big / 3.0); break;
    case 6: msgpack_pack_str(pk, w); msgpack_pack_str_body(pk, blob, w); break;
    case 7: msgpack_pack_bin(pk, w); msgpack_pack_bin_body(pk, blob, w); break;
    case 8: {
        static const size_t ext[] = {1, 2, 4, 8, 16, 0, 3, 300, 70000};
        size_t e = ext[rand_r(seed) % 9];
        msgpack_pack_ext(pk, e, (int8_t)(rand_r(seed) % 256 - 128));
        msgpack_pack_ext_body(pk, blob, e);
        break;
    }
    case 9: msgpack_pack_int8(pk, (int8_t)(rand_r(seed) % 256 - 128)); break;
    case 10: msgpack_pack_array(pk, 0); break;
    case 11: {
        uint32_t n = (uint32_t)(rand_r(seed) % 20);
        msgpack_pack_array(pk, n);
        for (uint32_t i = 0; i < n; i++)
            pack_random(pk, seed, depth - 1);
        break;
    }
    default: {
        uint32_t n = (uint32_t)(rand_r(seed) % 20);
        msgpack_pack_map(pk, n);
        for (uint32_t i = 0; i < 2 * n; i++)
            pack_random(pk, seed, depth - 1);
        break;
    }
    }
}

/* The decoder builds what msgpack-c's unpacker builds, for random objects
 * and for encodings the packer never chooses (wide headers of small values,
 * signed types holding positive values, fixext, float32); it refuses what
 * msgpack-c refuses (33 nested containers, the innermost empty or not; 32
 * are accepted). */
static void test_decode_matches_msgpack(void **state)
{
    static const char *const odd[] = {
        "93 01 00 d0 05",          "93 01 00 d3 00 00 00 00 00 00 00 07",
        "93 01 00 d1 ff 00",       "93 01 00 d2 80 00 00 00",
        "93 01 00 cc ff",          "93 01 00 cf ff ff ff ff ff ff ff ff",
        "93 01 00 d9 01 61",       "93 01 00 da 00 01 61",
        "93 01 00 db 00 00 00 01 61", "93 01 00 c6 00 00 00 00",
        "93 01 00 dc 00 01 c0",    "93 01 00 dd 00 00 00 01 c3",
        "93 01 00 de 00 01 a1 6b c2", "93 01 00 df 00 00 00 00",
        "93 01 00 d4 05 aa",       "93 01 00 d8 7f 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f",
        "93 01 00 c7 00 09",       "93 01 00 ca 3f c0 00 00",
        "93 01 00 cb 7f f0 00 00 00 00 00 00", "93 01 00 92 90 80",
        "93 01 00 a0",             "93 01 00 d9 00",
        "93 01 00 da 00 00",       "93 01 00 c4 00",
        "93 01 00 c7 00 05",       "93 01 00 93 a0 c4 00 81 a0 a0",
    };
    char body[64];
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++)
        assert_decodes_like_msgpack(body, unhex(odd[i], body, sizeof(body)));
    /* the reply's array is one level; innermost a nil, an empty array or an
     * empty map (a container inside 32 open ones is refused, even empty) */
    static const char inner[] = {(char)0xc0, (char)0x90, (char)0x80};
    for (int k = 0; k < 3; k++)
        for (int depth = 30; depth <= 34; depth++) {
            char deep[64];
            size_t n = unhex("93 01 00", deep, sizeof(deep));
            memset(deep + n, 0x91, (size_t)depth - 1);
            n += (size_t)depth - 1;
            deep[n++] = inner[k];
            assert_decodes_like_msgpack(deep, n);
            int levels = depth + (k > 0); /* containers, the reply's included */
            moonlet_reply rep;
            assert_int_equal(moonlet_reply_decode(deep, n, &rep) == 0, levels <= 32);
            if (levels <= 32)
                moonlet_reply_destroy(&rep);
        }
    unsigned seed = 42;
    for (int i = 0; i < 300; i++) {
        msgpack_sbuffer sb;
        msgpack_packer pk;
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_array(&pk, 3);
        msgpack_pack_uint64(&pk, (uint64_t)i);
        msgpack_pack_int32(&pk, -(i % 3));
        pack_random(&pk, &seed, 3);
        assert_decodes_like_msgpack(sb.data, sb.size);
        msgpack_sbuffer_destroy(&sb);
    }
}

MOONLET_TEST_MAIN("frame", NULL, NULL,
                  cmocka_unit_test(test_header_encode_decode),
                  cmocka_unit_test(test_request_roundtrip),
                  cmocka_unit_test(test_request_decode_ref_zero_copy),
                  cmocka_unit_test(test_reply_roundtrip),
                  cmocka_unit_test(test_reply_code_any_int_encoding),
                  cmocka_unit_test(test_reply_code_patch),
                  cmocka_unit_test(test_reply_epoch),
                  cmocka_unit_test(test_request_malformed),
                  cmocka_unit_test(test_deep_nesting),
                  cmocka_unit_test(test_reply_malformed),
                  cmocka_unit_test(test_body_check),
                  cmocka_unit_test(test_builder_overflow_drops_frame),
                  cmocka_unit_test(test_builder_misuse),
                  cmocka_unit_test(test_builder_pipelined),
                  cmocka_unit_test(test_wire_getters),
                  cmocka_unit_test(test_wire_empty_strings),
                  cmocka_unit_test(test_pack_helpers),
                  cmocka_unit_test(test_pack_str_array),
                  cmocka_unit_test(test_decode_matches_msgpack))
