/*
 * rpc_args.c - decoding, validating and packing RPC arguments from a
 * method's declared argument list (rpc_args.h).  Pure functions; no locks.
 */
#include "rpc_args.h"

#include <stdio.h>
#include <string.h>

#include "moonlet/error.h"
#include "wire.h"

#define FIELD(st, a, T) ((T *)((char *)(st) + (a)->offset))
#define CFIELD(st, a, T) ((const T *)((const char *)(st) + (a)->offset))

typedef const char *cstr; /* a CSTR field */

static uint32_t required_count(const moonlet_rpc_args_spec *s)
{
    uint32_t n = 0;
    while (n < s->nargs && !(s->args[n].flags & MOONLET_ARG_OPTIONAL))
        n++;
    return n;
}

void moonlet_rpc_args_signature(const moonlet_rpc_args_spec *spec, char *buf, size_t cap)
{
    size_t o = 0;
    int w = snprintf(buf, cap, "[");
    o = w > 0 ? (size_t)w : 0;
    for (uint32_t i = 0; i < spec->nargs && o < cap; i++) {
        const moonlet_rpc_arg *a = &spec->args[i];
        bool arr = a->kind >= MOONLET_ARG_STR_ARRAY;
        w = snprintf(buf + o, cap - o, "%s%s%s%s%s", i ? ", " : "", arr ? "[" : "", a->name,
                     arr ? "...]" : "", (a->flags & MOONLET_ARG_OPTIONAL) ? "?" : "");
        o += w > 0 ? (size_t)w : 0;
    }
    if (o < cap)
        snprintf(buf + o, cap - o, "%s]", spec->variadic ? (spec->nargs ? ", ..." : "any...") : "");
}

static const char *kind_text(const moonlet_rpc_arg *a)
{
    switch (a->kind) {
    case MOONLET_ARG_STR:
    case MOONLET_ARG_CSTR: return "a string";
    case MOONLET_ARG_BIN: return "a bin";
    case MOONLET_ARG_U64: return "an unsigned integer";
    case MOONLET_ARG_BOOL: return "a bool";
    case MOONLET_ARG_STR_ARRAY:
    case MOONLET_ARG_CSTR_ARRAY: return "an array of strings";
    case MOONLET_ARG_TUPLE_ARRAY: return "an array of arrays";
    default: return "an array of unsigned integers";
    }
}

/* Formats "<Method>: argument i (name) <why>; expected [...]". */
static int fail(const char *name, const moonlet_rpc_args_spec *s, int i, const char *why,
                char *err, size_t cap)
{
    char sig[512];
    moonlet_rpc_args_signature(s, sig, sizeof(sig));
    if (i < 0)
        snprintf(err, cap, "bad arguments to %s: expected %s", name, sig);
    else
        snprintf(err, cap, "bad arguments to %s: %s (argument %d) %s; expected %s", name,
                 s->args[i].name, i, why, sig);
    return MOONLET_ERR_INVALID_PARAMS;
}

/* A NUL-terminated copy of p[0..len) in zone; NULL when out of memory. */
static char *zone_cstr(msgpack_zone *zone, const char *p, uint32_t len)
{
    char *c = msgpack_zone_malloc(zone, (size_t)len + 1);
    if (c) {
        if (len)
            memcpy(c, p, len);
        c[len] = 0;
    }
    return c;
}

#define WHY(...) (snprintf(why, wcap, __VA_ARGS__), MOONLET_ERR_INVALID_PARAMS)

static int decode_one(const moonlet_rpc_arg *a, const msgpack_object *args, uint32_t i,
                      msgpack_zone *zone, uint64_t batch_cap, void *st, char *why, size_t wcap)
{
    const msgpack_object *o = moonlet_wire_at(args, i);
    switch (a->kind) {
    case MOONLET_ARG_STR:
    case MOONLET_ARG_CSTR: {
        const char *p;
        uint32_t len;
        if (a->kind == MOONLET_ARG_CSTR && (a->flags & MOONLET_ARG_NULLABLE) && o &&
            o->type == MSGPACK_OBJECT_NIL) {
            *FIELD(st, a, cstr) = NULL;
            return MOONLET_OK;
        }
        if (moonlet_wire_str(args, i, &p, &len))
            return MOONLET_ERR_INVALID_PARAMS;
        if (a->max && len > a->max)
            return WHY("is longer than %llu bytes", (unsigned long long)a->max);
        if (a->kind == MOONLET_ARG_STR) {
            *FIELD(st, a, moonlet_str) = (moonlet_str){p, len};
            return MOONLET_OK;
        }
        if (len && memchr(p, 0, len))
            return WHY("holds a NUL byte");
        char *c = zone_cstr(zone, p, len);
        if (!c)
            return MOONLET_ERR_INTERNAL_ERROR;
        *FIELD(st, a, cstr) = c;
        return MOONLET_OK;
    }
    case MOONLET_ARG_BIN:
        if (!o || o->type != MSGPACK_OBJECT_BIN)
            return MOONLET_ERR_INVALID_PARAMS;
        if (a->max && o->via.bin.size != a->max)
            return WHY("must be a bin of %llu bytes", (unsigned long long)a->max);
        *FIELD(st, a, moonlet_str) = (moonlet_str){o->via.bin.ptr, o->via.bin.size};
        return MOONLET_OK;
    case MOONLET_ARG_U64: {
        uint64_t v;
        if (moonlet_wire_u64(args, i, &v))
            return MOONLET_ERR_INVALID_PARAMS;
        if (a->max && v > a->max)
            return WHY("is above %llu", (unsigned long long)a->max);
        *FIELD(st, a, uint64_t) = v;
        return MOONLET_OK;
    }
    case MOONLET_ARG_BOOL:
        return moonlet_wire_bool(args, i, FIELD(st, a, bool));
    case MOONLET_ARG_STR_ARRAY:
    case MOONLET_ARG_CSTR_ARRAY:
    case MOONLET_ARG_TUPLE_ARRAY:
    case MOONLET_ARG_U64_ARRAY: {
        const msgpack_object *arr;
        if (moonlet_wire_array(args, i, &arr))
            return MOONLET_ERR_INVALID_PARAMS;
        uint32_t n = moonlet_wire_len(arr);
        uint64_t cap = (a->flags & MOONLET_ARG_BATCH) ? batch_cap : a->max;
        if (cap && n > cap && (a->flags & MOONLET_ARG_BATCH))
            return WHY("is too long: batch of %u keys exceeds the limit of %llu keys "
                       "(--max-batch-keys)", n, (unsigned long long)cap);
        if (cap && n > cap)
            return WHY("holds %u elements, more than %llu", n, (unsigned long long)cap);
        if (a->kind == MOONLET_ARG_U64_ARRAY) {
            uint64_t *v = n ? msgpack_zone_malloc(zone, (size_t)n * sizeof(*v)) : NULL;
            if (n && !v)
                return MOONLET_ERR_INTERNAL_ERROR;
            for (uint32_t k = 0; k < n; k++)
                if (moonlet_wire_u64(arr, k, &v[k]))
                    return MOONLET_ERR_INVALID_PARAMS;
            *FIELD(st, a, moonlet_u64v) = (moonlet_u64v){v, n};
            return MOONLET_OK;
        }
        if (a->kind == MOONLET_ARG_TUPLE_ARRAY) {
            size_t isz = a->item->size;
            char *v = n ? msgpack_zone_malloc(zone, (size_t)n * isz) : NULL;
            if (n && !v)
                return MOONLET_ERR_INTERNAL_ERROR;
            for (uint32_t k = 0; k < n; k++) {
                char err[512];
                int rc = moonlet_rpc_args_decode("", a->item, moonlet_wire_at(arr, k), zone, 0,
                                                 v + k * isz, err, sizeof(err));
                if (rc == MOONLET_ERR_INVALID_PARAMS) {
                    char sig[256];
                    moonlet_rpc_args_signature(a->item, sig, sizeof(sig));
                    return WHY("element %u is not %s", k, sig);
                }
                if (rc)
                    return rc;
            }
            *FIELD(st, a, moonlet_tuplev) = (moonlet_tuplev){v, n};
            return MOONLET_OK;
        }
        if (a->kind == MOONLET_ARG_CSTR_ARRAY) {
            char **v = msgpack_zone_malloc(zone, (size_t)(n ? n : 1) * sizeof(*v));
            if (!v)
                return MOONLET_ERR_INTERNAL_ERROR;
            for (uint32_t k = 0; k < n; k++) {
                const char *p;
                uint32_t len;
                if (moonlet_wire_str(arr, k, &p, &len))
                    return MOONLET_ERR_INVALID_PARAMS;
                if (a->elem_max && len > a->elem_max)
                    return WHY("has an element longer than %u bytes", a->elem_max);
                if (len && memchr(p, 0, len))
                    return WHY("has an element with a NUL byte");
                if (!(v[k] = zone_cstr(zone, p, len)))
                    return MOONLET_ERR_INTERNAL_ERROR;
            }
            *FIELD(st, a, moonlet_cstrv) = (moonlet_cstrv){(const char *const *)v, n};
            return MOONLET_OK;
        }
        moonlet_str *v = n ? msgpack_zone_malloc(zone, (size_t)n * sizeof(*v)) : NULL;
        if (n && !v)
            return MOONLET_ERR_INTERNAL_ERROR;
        for (uint32_t k = 0; k < n; k++) {
            if (moonlet_wire_str(arr, k, &v[k].ptr, &v[k].len))
                return MOONLET_ERR_INVALID_PARAMS;
            if (a->elem_max && v[k].len > a->elem_max)
                return WHY("has an element longer than %u bytes", a->elem_max);
        }
        *FIELD(st, a, moonlet_strv) = (moonlet_strv){v, NULL, n};
        return MOONLET_OK;
    }
    }
    return MOONLET_ERR_INVALID_PARAMS;
}

int moonlet_rpc_args_decode(const char *name, const moonlet_rpc_args_spec *s,
                            const msgpack_object *args, msgpack_zone *zone, uint64_t batch_cap,
                            void *out, char *err, size_t errcap)
{
    memset(out, 0, s->size);
    uint32_t n = moonlet_wire_len(args);
    if (!args || args->type != MSGPACK_OBJECT_ARRAY || n < required_count(s) ||
        (n > s->nargs && !s->variadic))
        return fail(name, s, -1, NULL, err, errcap);
    *(uint32_t *)out = n;
    for (uint32_t i = 0; i < s->nargs; i++) {
        const moonlet_rpc_arg *a = &s->args[i];
        if (i >= n) { /* absent trailing optional: its default */
            if ((a->flags & MOONLET_ARG_WITH_PREV) && i == n)
                return fail(name, s, (int)i, "is missing (it goes with the one before)", err, errcap);
            if (a->kind == MOONLET_ARG_U64)
                *FIELD(out, a, uint64_t) = a->def;
            else if (a->kind == MOONLET_ARG_BOOL)
                *FIELD(out, a, bool) = a->def != 0;
            continue;
        }
        char why[512];
        why[0] = 0;
        int rc = decode_one(a, args, i, zone, batch_cap, out, why, sizeof(why));
        if (rc == MOONLET_ERR_INTERNAL_ERROR) {
            snprintf(err, errcap, "out of memory");
            return rc;
        }
        if (rc) {
            if (!why[0])
                snprintf(why, sizeof(why), "must be %s", kind_text(a));
            return fail(name, s, (int)i, why, err, errcap);
        }
    }
    return MOONLET_OK;
}

static bool is_set(const moonlet_rpc_arg *a, const void *st)
{
    switch (a->kind) {
    case MOONLET_ARG_STR:
    case MOONLET_ARG_BIN: return CFIELD(st, a, moonlet_str)->ptr != NULL;
    case MOONLET_ARG_CSTR: return *CFIELD(st, a, cstr) != NULL;
    case MOONLET_ARG_U64: return *CFIELD(st, a, uint64_t) != a->def;
    case MOONLET_ARG_BOOL: return *CFIELD(st, a, bool) != (a->def != 0);
    case MOONLET_ARG_STR_ARRAY: return CFIELD(st, a, moonlet_strv)->n != 0;
    case MOONLET_ARG_CSTR_ARRAY: return CFIELD(st, a, moonlet_cstrv)->n != 0;
    case MOONLET_ARG_TUPLE_ARRAY: return CFIELD(st, a, moonlet_tuplev)->n != 0;
    default: return CFIELD(st, a, moonlet_u64v)->n != 0;
    }
}

uint32_t moonlet_rpc_args_count(const moonlet_rpc_args_spec *spec, const void *st)
{
    uint32_t n = required_count(spec);
    for (uint32_t i = n; i < spec->nargs; i++)
        if (is_set(&spec->args[i], st))
            n = i + 1;
    while (n < spec->nargs && (spec->args[n].flags & MOONLET_ARG_WITH_PREV))
        n++;
    return n;
}

void moonlet_rpc_args_pack(const moonlet_rpc_args_spec *spec, const void *st, uint32_t n,
                           msgpack_packer *pk)
{
    for (uint32_t i = 0; i < n && i < spec->nargs; i++) {
        const moonlet_rpc_arg *a = &spec->args[i];
        switch (a->kind) {
        case MOONLET_ARG_STR: {
            const moonlet_str *s = CFIELD(st, a, moonlet_str);
            if (s->ptr)
                moonlet_pack_str(pk, s->ptr, s->len);
            else
                msgpack_pack_nil(pk); /* refused by the decoder, as a missing argument */
            break;
        }
        case MOONLET_ARG_CSTR: {
            moonlet_pack_cstr(pk, *CFIELD(st, a, cstr)); /* NULL: nil */
            break;
        }
        case MOONLET_ARG_BIN: {
            const moonlet_str *s = CFIELD(st, a, moonlet_str);
            msgpack_pack_bin(pk, s->ptr ? s->len : 0);
            if (s->ptr && s->len)
                msgpack_pack_bin_body(pk, s->ptr, s->len);
            break;
        }
        case MOONLET_ARG_U64: msgpack_pack_uint64(pk, *CFIELD(st, a, uint64_t)); break;
        case MOONLET_ARG_BOOL:
            *CFIELD(st, a, bool) ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
            break;
        case MOONLET_ARG_STR_ARRAY: {
            const moonlet_strv *v = CFIELD(st, a, moonlet_strv);
            moonlet_pack_str_array(pk, v->v, v->cv, v->n); /* a NULL C string: nil */
            break;
        }
        case MOONLET_ARG_U64_ARRAY: {
            const moonlet_u64v *v = CFIELD(st, a, moonlet_u64v);
            msgpack_pack_array(pk, v->n);
            for (uint32_t k = 0; k < v->n; k++)
                msgpack_pack_uint64(pk, v->v[k]);
            break;
        }
        case MOONLET_ARG_CSTR_ARRAY: {
            const moonlet_cstrv *v = CFIELD(st, a, moonlet_cstrv);
            moonlet_pack_str_array(pk, NULL, v->v, v->n); /* NULL: nil */
            break;
        }
        case MOONLET_ARG_TUPLE_ARRAY: {
            const moonlet_tuplev *v = CFIELD(st, a, moonlet_tuplev);
            msgpack_pack_array(pk, v->n);
            for (uint32_t k = 0; k < v->n; k++) {
                const void *it = (const char *)v->v + (size_t)k * a->item->size;
                uint32_t m = moonlet_rpc_args_count(a->item, it);
                msgpack_pack_array(pk, m);
                moonlet_rpc_args_pack(a->item, it, m, pk);
            }
            break;
        }
        }
    }
}
