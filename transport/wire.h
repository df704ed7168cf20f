/*
 * wire.h - typed access to msgpack argument arrays, and packing helpers.
 *
 * Handlers read their positional arguments through these getters, which check
 * the index and the type and return MOONLET_ERR_INVALID_PARAMS on a mismatch,
 * so a wrongly-typed frame from the network is an error reply, never a crash.
 * Strings are not NUL-terminated on the wire: getters return pointer+length.
 * Pure functions; no locks.
 */
#ifndef MOONLET_WIRE_H
#define MOONLET_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moonlet_str.h"

/* Number of elements of an array object (0 when not an array). */
uint32_t moonlet_wire_len(const msgpack_object *arr);

/* Element i of an array, or NULL when out of range / not an array. */
const msgpack_object *moonlet_wire_at(const msgpack_object *arr, uint32_t i);

/* Getters on element i of `arr`.  Each returns 0 or MOONLET_ERR_INVALID_PARAMS. */
int moonlet_wire_u64(const msgpack_object *arr, uint32_t i, uint64_t *out);
int moonlet_wire_i64(const msgpack_object *arr, uint32_t i, int64_t *out);
int moonlet_wire_bool(const msgpack_object *arr, uint32_t i, bool *out);
/* str or bin; *len may be 0. */
int moonlet_wire_str(const msgpack_object *arr, uint32_t i, const char **ptr, uint32_t *len);
/* Same, and rejects lengths above max_len. */
int moonlet_wire_strn(const msgpack_object *arr, uint32_t i, uint32_t max_len, const char **ptr,
                      uint32_t *len);
/* An array element; *out points at the array object. */
int moonlet_wire_array(const msgpack_object *arr, uint32_t i, const msgpack_object **out);
/* A map element; *out points at the map object. */
int moonlet_wire_map(const msgpack_object *arr, uint32_t i, const msgpack_object **out);

/* Looks a key up in a map object (string keys); NULL when absent. */
const msgpack_object *moonlet_wire_map_get(const msgpack_object *map, const char *key);

/* Packing helpers. */
void moonlet_pack_str(msgpack_packer *pk, const char *s, size_t len);
void moonlet_pack_cstr(msgpack_packer *pk, const char *s); /* NULL packs nil */
/* An array of n strings: v[k] (as moonlet_pack_str: {NULL, 0} packs "") or,
 * with v NULL, the C strings cv[k] (as moonlet_pack_cstr: NULL packs nil).  The same bytes as msgpack_pack_array +
 * moonlet_pack_str per element, handed to the packer a few KiB at a time
 * rather than two writes per element (a BatchExistKey of 640 keys). */
void moonlet_pack_str_array(msgpack_packer *pk, const moonlet_str *v, const char *const *cv,
                            uint32_t n);
/* Packs a map key (string) - for building result maps. */
static inline void moonlet_pack_key(msgpack_packer *pk, const char *k) { moonlet_pack_cstr(pk, k); }

#endif
