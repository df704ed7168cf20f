/*
 * wire.c - typed, bounds-checked access to msgpack argument arrays, and the
 * small packing helpers handlers use to build results.
 *
 * Why it is built this way: arguments arrive from the network, so every
 * getter checks both the index and the type and answers
 * MOONLET_ERR_INVALID_PARAMS instead of trusting the frame; a wrongly-typed
 * request therefore becomes an error reply, never a crash.  Out-parameters
 * are written only on success.  Strings are returned as pointer+length (they
 * are not NUL-terminated on the wire) and are never copied.  msgpack-c leaves
 * the pointer of an empty string NULL; the getters return "" instead, so
 * callers may pass it to memcmp/memcpy without a special case.
 *
 * Pure functions; takes no locks.
 */
#include "wire.h"

#include <string.h>

#include "moonlet/error.h"

#define INVALID MOONLET_ERR_INVALID_PARAMS

uint32_t moonlet_wire_len(const msgpack_object *arr)
{
    if (arr == NULL || arr->type != MSGPACK_OBJECT_ARRAY)
        return 0;
    return arr->via.array.size;
}

const msgpack_object *moonlet_wire_at(const msgpack_object *arr, uint32_t i)
{
    if (i >= moonlet_wire_len(arr))
        return NULL;
    return &arr->via.array.ptr[i];
}

/* Element i when it has type t, else NULL. */
static const msgpack_object *typed_at(const msgpack_object *arr, uint32_t i,
                                      msgpack_object_type t)
{
    const msgpack_object *o = moonlet_wire_at(arr, i);
    return o != NULL && o->type == t ? o : NULL;
}

int moonlet_wire_u64(const msgpack_object *arr, uint32_t i, uint64_t *out)
{
    const msgpack_object *o = typed_at(arr, i, MSGPACK_OBJECT_POSITIVE_INTEGER);
    if (o == NULL)
        return INVALID;
    *out = o->via.u64;
    return 0;
}

int moonlet_wire_i64(const msgpack_object *arr, uint32_t i, int64_t *out)
{
    const msgpack_object *o = moonlet_wire_at(arr, i);
    if (o == NULL)
        return INVALID;
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = o->via.i64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) {
        *out = (int64_t)o->via.u64;
        return 0;
    }
    return INVALID;
}

int moonlet_wire_bool(const msgpack_object *arr, uint32_t i, bool *out)
{
    const msgpack_object *o = typed_at(arr, i, MSGPACK_OBJECT_BOOLEAN);
    if (o == NULL)
        return INVALID;
    *out = o->via.boolean;
    return 0;
}

/* The bytes of a str or bin object: false for any other type. */
static bool str_or_bin(const msgpack_object *o, const char **ptr, uint32_t *len)
{
    if (o->type == MSGPACK_OBJECT_STR) {
        *ptr = o->via.str.ptr;
        *len = o->via.str.size;
    } else if (o->type == MSGPACK_OBJECT_BIN) {
        *ptr = o->via.bin.ptr;
        *len = o->via.bin.size;
    } else {
        return false;
    }
    return true;
}

int moonlet_wire_str(const msgpack_object *arr, uint32_t i, const char **ptr, uint32_t *len)
{
    return moonlet_wire_strn(arr, i, UINT32_MAX, ptr, len);
}

int moonlet_wire_strn(const msgpack_object *arr, uint32_t i, uint32_t max_len, const char **ptr,
                      uint32_t *len)
{
    const msgpack_object *o = moonlet_wire_at(arr, i);
    const char *p;
    uint32_t n;
    if (o == NULL || !str_or_bin(o, &p, &n))
        return INVALID;
    if (n > max_len)
        return INVALID;
    *ptr = n > 0 ? p : "";
    *len = n;
    return 0;
}

int moonlet_wire_array(const msgpack_object *arr, uint32_t i, const msgpack_object **out)
{
    const msgpack_object *o = typed_at(arr, i, MSGPACK_OBJECT_ARRAY);
    if (o == NULL)
        return INVALID;
    *out = o;
    return 0;
}

int moonlet_wire_map(const msgpack_object *arr, uint32_t i, const msgpack_object **out)
{
    const msgpack_object *o = typed_at(arr, i, MSGPACK_OBJECT_MAP);
    if (o == NULL)
        return INVALID;
    *out = o;
    return 0;
}

/* True when o is a str (or bin) equal to key[0..klen). */
static bool key_equals(const msgpack_object *o, const char *key, size_t klen)
{
    const char *p;
    uint32_t n;
    if (!str_or_bin(o, &p, &n))
        return false;
    return n == klen && (n == 0 || memcmp(p, key, n) == 0); /* p is NULL when n is 0 */
}

const msgpack_object *moonlet_wire_map_get(const msgpack_object *map, const char *key)
{
    if (map == NULL || key == NULL || map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    size_t klen = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++)
        if (key_equals(&map->via.map.ptr[i].key, key, klen))
            return &map->via.map.ptr[i].val;
    return NULL;
}

void moonlet_pack_str(msgpack_packer *pk, const char *s, size_t len)
{
    msgpack_pack_str(pk, len);
    if (len > 0)
        msgpack_pack_str_body(pk, s, len);
}

void moonlet_pack_cstr(msgpack_packer *pk, const char *s)
{
    if (s == NULL)
        msgpack_pack_nil(pk);
    else
        moonlet_pack_str(pk, s, strlen(s));
}

/* Writes a msgpack str header for len at p (at most 5 bytes); returns its size. */
static size_t str_header(uint8_t *p, size_t len)
{
    if (len < 32) {
        p[0] = (uint8_t)(0xa0 | len);
        return 1;
    }
    if (len < 256) {
        p[0] = 0xd9;
        p[1] = (uint8_t)len;
        return 2;
    }
    if (len < 65536) {
        p[0] = 0xda;
        p[1] = (uint8_t)(len >> 8);
        p[2] = (uint8_t)len;
        return 3;
    }
    p[0] = 0xdb;
    for (int i = 0; i < 4; i++)
        p[1 + i] = (uint8_t)(len >> (24 - 8 * i));
    return 5;
}

void moonlet_pack_str_array(msgpack_packer *pk, const moonlet_str *v, const char *const *cv,
                            uint32_t n)
{
    enum { CHUNK = 4096 };
    uint8_t buf[CHUNK];
    size_t used = 0;
    msgpack_pack_array(pk, n);
    for (uint32_t k = 0; k < n; k++) {
        /* as moonlet_pack_str and moonlet_pack_cstr: {NULL, 0} is "", a
         * NULL C string is nil */
        const char *ptr = v ? v[k].ptr : cv[k];
        bool nil = !v && !ptr;
        size_t len = v ? v[k].len : ptr ? strlen(ptr) : 0;
        if (used + 5 + len > CHUNK) { /* flush; an element larger than a chunk goes alone */
            if (used)
                pk->callback(pk->data, (const char *)buf, used);
            used = 0;
        }
        if (nil) {
            buf[used++] = 0xc0;
            continue;
        }
        used += str_header(buf + used, len);
        if (len > CHUNK - 5) {
            pk->callback(pk->data, (const char *)buf, used);
            pk->callback(pk->data, ptr, len);
            used = 0;
            continue;
        }
        if (len)
            memcpy(buf + used, ptr, len);
        used += len;
    }
    if (used)
        pk->callback(pk->data, (const char *)buf, used);
}
