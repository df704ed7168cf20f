/*
 * rpc_args.h - declarative argument lists of RPC methods: one table per
 * protocol says, for each method, its positional arguments (name, kind,
 * bounds, required or trailing-optional, the offset of the field in the
 * method's decoded-args struct).  Servers decode and validate a request's
 * `args` array from it before the handler runs (rpc_server.c); clients pack
 * a request from the same table and the same struct.  Redis's command table
 * is the model.
 *
 * A method's args struct starts with `uint32_t nargs` (how many arguments
 * the request held; MOONLET_RPC_ARGS_HEAD), then one field per argument, of
 * the type its kind names below.  Absent optional arguments hold their
 * default (`def` for u64/i64/bool, zero/NULL otherwise).
 *
 * Count rule: fewer arguments than the required ones, or more than the
 * table declares (unless the method is `variadic`), is INVALID_PARAMS.  An
 * argument flagged WITH_PREV is present exactly when the one before it is
 * (arguments sent together, such as MountSegment's write_key and its clock).
 *
 * Memory: decoded strings and arrays point into the request's msgpack zone
 * (the server's per-request arena): nothing is freed by handlers, and
 * nothing outlives the request.  Pure functions; no locks.
 */
#ifndef MOONLET_RPC_ARGS_H
#define MOONLET_RPC_ARGS_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moonlet_str.h"

/* An array of strings: decoded into `v`; a client packing may give `cv`
 * (NUL-terminated strings) instead. */
typedef struct moonlet_strv {
    const moonlet_str *v;
    const char *const *cv;
    uint32_t n;
} moonlet_strv;

/* An array type `name`: n elements at v, of element pointer type ptr_type. */
#define MOONLET_ARG_VECTOR(name, ptr_type)                                                     \
    typedef struct name {                                                                      \
        ptr_type v;                                                                            \
        uint32_t n;                                                                            \
    } name

MOONLET_ARG_VECTOR(moonlet_u64v, const uint64_t *);
/* An array of NUL-terminated strings. */
MOONLET_ARG_VECTOR(moonlet_cstrv, const char *const *);
/* An array of tuples, each decoded into an args struct of the argument's
 * `item` spec (v points at n structs of item->size bytes). */
MOONLET_ARG_VECTOR(moonlet_tuplev, const void *);

typedef enum moonlet_arg_kind {
    MOONLET_ARG_STR = 1,  /* moonlet_str: str or bin, at most `max` bytes (0: no bound) */
    MOONLET_ARG_CSTR,     /* const char *: str, no NUL byte, at most `max` bytes; NUL-terminated copy */
    MOONLET_ARG_BIN,      /* moonlet_str: bin of exactly `max` bytes (0: any length) */
    MOONLET_ARG_U64,      /* uint64_t, at most `max` (0: no bound) */
    MOONLET_ARG_BOOL,     /* bool */
    MOONLET_ARG_STR_ARRAY,/* moonlet_strv: at most `max` elements, each at most `elem_max` bytes */
    MOONLET_ARG_U64_ARRAY,/* moonlet_u64v: at most `max` elements */
    MOONLET_ARG_CSTR_ARRAY,  /* moonlet_cstrv: as STR_ARRAY, elements as CSTR */
    MOONLET_ARG_TUPLE_ARRAY, /* moonlet_tuplev: at most `max` arrays, each decoded by `item` */
} moonlet_arg_kind;

/* flags */
#define MOONLET_ARG_OPTIONAL 1u  /* trailing optional: this and every later argument */
#define MOONLET_ARG_WITH_PREV 2u /* present exactly when the previous argument is */
#define MOONLET_ARG_BATCH 4u     /* array bounded by the server's batch cap (decode's batch_cap) */
#define MOONLET_ARG_NULLABLE 8u  /* CSTR: nil is accepted as NULL (packed as nil) */

struct moonlet_rpc_args_spec;

typedef struct moonlet_rpc_arg {
    const char *name;
    uint8_t kind;
    uint8_t flags;
    uint16_t offset;  /* of the field in the method's args struct */
    uint32_t elem_max;/* STR_ARRAY: bytes per element (0: no bound) */
    uint64_t max;     /* see the kinds */
    uint64_t def;     /* u64 / bool default when absent */
    const struct moonlet_rpc_args_spec *item; /* TUPLE_ARRAY: each element's arguments */
} moonlet_rpc_arg;

/* One row of a method's argument table: the field `f` of args struct T, of
 * kind k with flags fl; .max / .elem_max / .def / .item follow as needed:
 *   {MOONLET_RPC_ARG(my_args, key, MOONLET_ARG_STR, 0), .max = 255}, */
#define MOONLET_RPC_ARG(T, f, k, fl)                                                    \
    .name = #f, .kind = (k), .flags = (fl), .offset = offsetof(T, f)

typedef struct moonlet_rpc_args_spec {
    const moonlet_rpc_arg *args;
    uint16_t nargs;
    uint16_t size;    /* sizeof the args struct */
    bool variadic;    /* more arguments than declared are accepted and ignored */
    /* The request carries a file descriptor (rpc_server.h): when the
     * arguments are refused, the server closes it before replying. */
    bool takes_fd;
} moonlet_rpc_args_spec;

/* One method of a protocol's table. */
typedef struct moonlet_rpc_method_decl {
    uint32_t id;
    const char *name;
    const moonlet_rpc_args_spec *spec;
    uint32_t roles; /* MOONLET_ROLE_* bits (common/cred.h) of its callers; 0: any */
    /* Its decoded arguments begin with `moonlet_str tenant` (right after
     * MOONLET_RPC_ARGS_HEAD): a credential limited to some tenants may only
     * name those (master/service/service.c). */
    bool tenant_scoped;
} moonlet_rpc_method_decl;

#define MOONLET_RPC_ARGS_HEAD uint32_t nargs
#define MOONLET_RPC_SPEC(T, arr, var)                                                          \
    {(arr), (uint16_t)(sizeof(arr) / sizeof((arr)[0])), (uint16_t)sizeof(T), (var), false}

/*
 * Decodes `args` (the request's args array) into `out` (spec->size bytes)
 * with strings and arrays allocated from `zone`.  batch_cap bounds BATCH
 * arrays (0: none).  Returns 0, or MOONLET_ERR_INVALID_PARAMS with a
 * message in err (naming the method, the argument and the expected list),
 * or MOONLET_ERR_INTERNAL_ERROR when the zone is out of memory.
 */
int moonlet_rpc_args_decode(const char *name, const moonlet_rpc_args_spec *spec,
                            const msgpack_object *args, msgpack_zone *zone, uint64_t batch_cap,
                            void *out, char *err, size_t errcap);

/* How many arguments a packing of `st` sends: the required ones, then up to
 * the last optional one that differs from its default (with its WITH_PREV
 * followers, and absent ones before it packed as their defaults). */
uint32_t moonlet_rpc_args_count(const moonlet_rpc_args_spec *spec, const void *st);

/* Packs the first n arguments of `st` (the array header is the caller's). */
void moonlet_rpc_args_pack(const moonlet_rpc_args_spec *spec, const void *st, uint32_t n,
                           msgpack_packer *pk);

/* "[tenant, key, size, replica_num, soft_pin, preferred_segments?, ...]" */
void moonlet_rpc_args_signature(const moonlet_rpc_args_spec *spec, char *buf, size_t cap);

#endif
