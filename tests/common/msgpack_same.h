/*
 * msgpack_same.h - whether two msgpack-c object trees are the same: types,
 * values, sizes and bytes, recursively.  An empty string's, bin's or ext's
 * pointer is not compared: msgpack-c leaves it NULL or left over from an
 * earlier field, transport/frame.c's decoder points it into the body.  For
 * the tests and the fuzz target that hold frame.c's decoder against
 * msgpack_unpack().
 */
#ifndef MOONLET_TEST_MSGPACK_SAME_H
#define MOONLET_TEST_MSGPACK_SAME_H

#include <msgpack.h>
#include <stdbool.h>
#include <string.h>

static inline bool msgpack_same_object(const msgpack_object *a, const msgpack_object *b)
{
    if (a->type != b->type)
        return false;
    switch (a->type) {
    case MSGPACK_OBJECT_STR:
    case MSGPACK_OBJECT_BIN:
        return a->via.str.size == b->via.str.size &&
               (a->via.str.size == 0 ||
                memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0);
    case MSGPACK_OBJECT_EXT:
        return a->via.ext.type == b->via.ext.type && a->via.ext.size == b->via.ext.size &&
               (a->via.ext.size == 0 ||
                memcmp(a->via.ext.ptr, b->via.ext.ptr, a->via.ext.size) == 0);
    case MSGPACK_OBJECT_ARRAY:
        if (a->via.array.size != b->via.array.size)
            return false;
        for (uint32_t i = 0; i < a->via.array.size; i++)
            if (!msgpack_same_object(&a->via.array.ptr[i], &b->via.array.ptr[i]))
                return false;
        return true;
    case MSGPACK_OBJECT_MAP:
        if (a->via.map.size != b->via.map.size)
            return false;
        for (uint32_t i = 0; i < a->via.map.size; i++)
            if (!msgpack_same_object(&a->via.map.ptr[i].key, &b->via.map.ptr[i].key) ||
                !msgpack_same_object(&a->via.map.ptr[i].val, &b->via.map.ptr[i].val))
                return false;
        return true;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: /* bit for bit: a NaN is the same NaN */
        return memcmp(&a->via.f64, &b->via.f64, sizeof(double)) == 0;
    default:
        return msgpack_object_equal(*a, *b);
    }
}

#endif
