/*
 * wire_assert.h - cmocka checks of decoded msgpack (transport/wire.h) that
 * the frame and RPC tests share.  Include after cmocka.h.
 */
#ifndef MOONLET_TEST_WIRE_ASSERT_H
#define MOONLET_TEST_WIRE_ASSERT_H

#include <stdint.h>

#include "wire.h"

/* Element i of the msgpack array arr is a string (or bin) holding exactly
 * the len bytes at want. */
static inline void assert_wire_bytes(const msgpack_object *arr, uint32_t i, const void *want,
                                     uint32_t len)
{
    const char *p = NULL;
    uint32_t n = 0;
    assert_int_equal(moonlet_wire_str(arr, i, &p, &n), 0);
    assert_int_equal(n, len);
    assert_memory_equal(p, want, len);
}

#endif
