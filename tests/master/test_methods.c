/*
 * test_methods.c - the master's method table (master/service/methods.c) and the
 * table-driven argument codec (transport/rpc_args.c): docs/protocol.md
 * documents exactly the table's argument lists; the decoder enforces the
 * count rule, the kinds and the bounds the table declares; what a client
 * packs from an args struct decodes back to the same struct.
 *
 * argv[1]: the path of docs/protocol.md.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dummy_proto.h"
#include "methods.h"
#include "moonlet/error.h"
#include "rpc_args.h"
#include "wire.h"

static const char *g_doc_path;

/* ---- docs/protocol.md ------------------------------------------------------------ */

/* Rows "| id | Name | `[args]` | result |" of the master's method table and
 * of the DummyClient protocol's (ids from 101). */
static void test_docs_match_table(void **state)
{
    (void)state;
    FILE *f = fopen(g_doc_path, "r");
    assert_non_null(f);
    char line[4096];
    bool seen[MOONLET_DM_LAST + 1] = {false};
    size_t rows = 0;
    while (fgets(line, sizeof(line), f)) {
        unsigned id;
        char name[64], args[1024];
        if (sscanf(line, "| %u | %63[A-Za-z] | `%1023[^`]` |", &id, name, args) != 3)
            continue;
        const moonlet_rpc_method_decl *d = id >= MOONLET_DM_ATTACH ? moonlet_dummy_method(id)
                                                                   : moonlet_master_method(id);
        if (!d)
            fail_msg("docs/protocol.md documents method %u (%s), which the table lacks", id, name);
        assert_string_equal(name, d->name);
        char sig[1024];
        moonlet_rpc_args_signature(d->spec, sig, sizeof(sig));
        if (strcmp(sig, args) != 0)
            fail_msg("%s: docs/protocol.md says %s, the table %s", name, args, sig);
        assert_true(id < sizeof(seen) && !seen[id]);
        seen[id] = true;
        rows++;
    }
    fclose(f);
    for (size_t i = 0; i < moonlet_master_nmethods; i++)
        if (!seen[moonlet_master_methods[i].id])
            fail_msg("%s is not in docs/protocol.md's method table", moonlet_master_methods[i].name);
    for (size_t i = 0; i < moonlet_dummy_nmethods; i++)
        if (!seen[moonlet_dummy_methods[i].id])
            fail_msg("%s is not in docs/protocol.md's DummyClient table",
                     moonlet_dummy_methods[i].name);
    assert_int_equal(rows, moonlet_master_nmethods + moonlet_dummy_nmethods);
}

/* Every row of the table sits at its id, fields inside the args struct. */
static void check_table(const moonlet_rpc_method_decl *t, size_t n,
                        const moonlet_rpc_method_decl *(*find)(uint32_t))
{
    for (size_t i = 0; i < n; i++) {
        const moonlet_rpc_method_decl *d = &t[i];
        assert_ptr_equal(find(d->id), d);
        bool optional = false;
        for (uint32_t k = 0; k < d->spec->nargs; k++) {
            const moonlet_rpc_arg *a = &d->spec->args[k];
            assert_true(a->offset >= sizeof(uint32_t) && a->offset < d->spec->size);
            /* optional arguments are trailing; WITH_PREV follows an argument */
            if (optional)
                assert_true(a->flags & MOONLET_ARG_OPTIONAL);
            optional = a->flags & MOONLET_ARG_OPTIONAL;
            assert_true(k > 0 || !(a->flags & MOONLET_ARG_WITH_PREV));
            assert_true(a->kind != MOONLET_ARG_TUPLE_ARRAY || a->item);
        }
    }
}

static void test_table_well_formed(void **state)
{
    (void)state;
    check_table(moonlet_master_methods, moonlet_master_nmethods, moonlet_master_method);
    check_table(moonlet_dummy_methods, moonlet_dummy_nmethods, moonlet_dummy_method);
}

/* ---- the decoder ---------------------------------------------------------------- */

typedef struct {
    msgpack_sbuffer buf;
    msgpack_packer pk;
    msgpack_zone zone;
    msgpack_object obj;
    char err[768];
} req;

static msgpack_packer *req_begin(req *r, uint32_t nargs)
{
    msgpack_sbuffer_init(&r->buf);
    msgpack_packer_init(&r->pk, &r->buf, msgpack_sbuffer_write);
    msgpack_zone_init(&r->zone, 4096);
    msgpack_pack_array(&r->pk, nargs);
    return &r->pk;
}

static int req_decode(req *r, uint32_t method, void *out, uint64_t batch_cap)
{
    size_t off = 0;
    assert_int_equal(msgpack_unpack(r->buf.data, r->buf.size, &off, &r->zone, &r->obj),
                     MSGPACK_UNPACK_SUCCESS);
    const moonlet_rpc_method_decl *d = moonlet_master_method(method);
    r->err[0] = 0;
    return moonlet_rpc_args_decode(d->name, d->spec, &r->obj, &r->zone, batch_cap, out, r->err,
                                   sizeof(r->err));
}

static void req_end(req *r)
{
    msgpack_zone_destroy(&r->zone);
    msgpack_sbuffer_destroy(&r->buf);
}

static void pack_put_start_head(msgpack_packer *pk, uint64_t nrep)
{
    moonlet_pack_cstr(pk, "t");
    moonlet_pack_cstr(pk, "k");
    msgpack_pack_uint64(pk, 100);
    msgpack_pack_uint64(pk, nrep);
    msgpack_pack_true(pk);
}

static void test_decode_counts_and_defaults(void **state)
{
    (void)state;
    req r;
    moonlet_args_put_start a;
    /* the five required arguments: the optional ones take their defaults */
    pack_put_start_head(req_begin(&r, 5), 2);
    assert_int_equal(req_decode(&r, MOONLET_M_PUT_START, &a, 0), MOONLET_OK);
    assert_int_equal(a.nargs, 5);
    assert_int_equal(a.key.len, 1);
    assert_memory_equal(a.key.ptr, "k", 1);
    assert_int_equal(a.size, 100);
    assert_int_equal(a.replica_num, 2);
    assert_true(a.soft_pin);
    assert_int_equal(a.preferred_segments.n, 0);
    assert_false(a.hard_pin);
    assert_int_equal(a.soft_pin_ttl_ms, 0);
    req_end(&r);
    /* four: a required argument is missing; the message names the method and the list */
    msgpack_packer *pk = req_begin(&r, 4);
    moonlet_pack_cstr(pk, "t");
    moonlet_pack_cstr(pk, "k");
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_uint64(pk, 1);
    assert_int_equal(req_decode(&r, MOONLET_M_PUT_START, &a, 0), MOONLET_ERR_INVALID_PARAMS);
    assert_non_null(strstr(r.err, "PutStart"));
    assert_non_null(strstr(r.err, "[tenant, key, size, replica_num, soft_pin, "
                                  "[preferred_segments...]?, hard_pin?, soft_pin_ttl_ms?]"));
    req_end(&r);
    /* nine: more than declared */
    pk = req_begin(&r, 9);
    pack_put_start_head(pk, 1);
    msgpack_pack_array(pk, 0);
    msgpack_pack_false(pk);
    msgpack_pack_uint64(pk, 0);
    msgpack_pack_nil(pk);
    assert_int_equal(req_decode(&r, MOONLET_M_PUT_START, &a, 0), MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
    /* Echo takes anything */
    moonlet_args_none none;
    pk = req_begin(&r, 3);
    msgpack_pack_nil(pk);
    msgpack_pack_int(pk, -3);
    moonlet_pack_cstr(pk, "x");
    assert_int_equal(req_decode(&r, MOONLET_M_ECHO, &none, 0), MOONLET_OK);
    req_end(&r);
    /* Stats takes nothing */
    pk = req_begin(&r, 1);
    msgpack_pack_nil(pk);
    assert_int_equal(req_decode(&r, MOONLET_M_STATS, &none, 0), MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
}

static void pack_mount_head(msgpack_packer *pk, const char *proto)
{
    moonlet_pack_cstr(pk, "node");
    moonlet_pack_cstr(pk, "seg");
    moonlet_pack_cstr(pk, "name");
    msgpack_pack_uint64(pk, 0);
    msgpack_pack_uint64(pk, 4096);
    moonlet_pack_cstr(pk, "127.0.0.1:1");
    moonlet_pack_cstr(pk, proto);
}

/* A MountSegment of nargs arguments: the seven, then a write key of keylen
 * bytes, then clock 77 (when nargs > 8). */
static msgpack_packer *mount_begin(req *r, uint32_t nargs, const char *proto, uint32_t keylen)
{
    static const char key[16] = "0123456789abcdef";
    msgpack_packer *pk = req_begin(r, nargs);
    pack_mount_head(pk, proto);
    if (nargs > 7) {
        msgpack_pack_bin(pk, keylen);
        msgpack_pack_bin_body(pk, key, keylen);
    }
    if (nargs > 8)
        msgpack_pack_uint64(pk, 77);
    return pk;
}

static void test_decode_groups_and_bounds(void **state)
{
    (void)state;
    req r;
    moonlet_args_mount m;
    /* MountSegment: write_key without its clock is refused */
    msgpack_packer *pk = mount_begin(&r, 8, "tcp", 16);
    assert_int_equal(req_decode(&r, MOONLET_M_MOUNT_SEGMENT, &m, 0), MOONLET_ERR_INVALID_PARAMS);
    assert_non_null(strstr(r.err, "node_clock_ms"));
    req_end(&r);
    /* with it: the key, the clock, and NUL-terminated copies of the strings */
    mount_begin(&r, 9, "tcp", 16);
    assert_int_equal(req_decode(&r, MOONLET_M_MOUNT_SEGMENT, &m, 0), MOONLET_OK);
    assert_string_equal(m.endpoint, "127.0.0.1:1");
    assert_int_equal(m.write_key.len, 16);
    assert_int_equal(m.node_clock_ms, 77);
    assert_null(m.alt_endpoint);
    req_end(&r);
    /* a key of 15 bytes; a protocol of 16 bytes; a string with a NUL byte */
    mount_begin(&r, 9, "tcp", 15);
    assert_int_equal(req_decode(&r, MOONLET_M_MOUNT_SEGMENT, &m, 0), MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
    pack_mount_head(req_begin(&r, 7), "0123456789abcdef");
    assert_int_equal(req_decode(&r, MOONLET_M_MOUNT_SEGMENT, &m, 0), MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
    mount_begin(&r, 7, "tcp", 0);
    r.buf.data[r.buf.size - 2] = 0; /* "t\0p" */
    assert_int_equal(req_decode(&r, MOONLET_M_MOUNT_SEGMENT, &m, 0), MOONLET_ERR_INVALID_PARAMS);
    assert_non_null(strstr(r.err, "NUL"));
    req_end(&r);
    /* the alt endpoint comes as three */
    pk = mount_begin(&r, 11, "rdma", 16);
    moonlet_pack_cstr(pk, "127.0.0.1:2");
    moonlet_pack_cstr(pk, "seg-tcp");
    assert_int_equal(req_decode(&r, MOONLET_M_MOUNT_SEGMENT, &m, 0), MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
    /* replica_num above 2^32 - 1 */
    moonlet_args_put_start p;
    pack_put_start_head(req_begin(&r, 5), UINT64_C(1) << 32);
    assert_int_equal(req_decode(&r, MOONLET_M_PUT_START, &p, 0), MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
    /* 65 preferred segments; a preferred name of 256 bytes */
    pk = req_begin(&r, 6);
    pack_put_start_head(pk, 1);
    msgpack_pack_array(pk, 65);
    for (int i = 0; i < 65; i++)
        moonlet_pack_cstr(pk, "s");
    assert_int_equal(req_decode(&r, MOONLET_M_PUT_START, &p, 0), MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
    static char longname[257];
    memset(longname, 'n', 256);
    pk = req_begin(&r, 6);
    pack_put_start_head(pk, 1);
    msgpack_pack_array(pk, 1);
    moonlet_pack_cstr(pk, longname);
    assert_int_equal(req_decode(&r, MOONLET_M_PUT_START, &p, 0), MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
    /* a Ping's disk figures: at most MOONLET_NODE_DISK_MAX unsigned values */
    moonlet_args_ping g;
    for (uint32_t n = MOONLET_NODE_DISK_MAX; n <= MOONLET_NODE_DISK_MAX + 1; n++) {
        pk = req_begin(&r, 3);
        moonlet_pack_cstr(pk, "node");
        msgpack_pack_uint64(pk, 5);
        msgpack_pack_array(pk, n);
        for (uint32_t i = 0; i < n; i++)
            msgpack_pack_uint64(pk, i);
        assert_int_equal(req_decode(&r, MOONLET_M_PING, &g, 0),
                         n > MOONLET_NODE_DISK_MAX ? MOONLET_ERR_INVALID_PARAMS : MOONLET_OK);
        if (n == MOONLET_NODE_DISK_MAX)
            assert_int_equal(g.disk.n, MOONLET_NODE_DISK_MAX);
        req_end(&r);
    }
    pk = req_begin(&r, 3); /* a value that is not an unsigned integer */
    moonlet_pack_cstr(pk, "node");
    msgpack_pack_uint64(pk, 5);
    msgpack_pack_array(pk, 1);
    msgpack_pack_int64(pk, -1);
    assert_int_equal(req_decode(&r, MOONLET_M_PING, &g, 0), MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
    /* a batch above the server's cap, and at it */
    moonlet_args_batch_exist b;
    for (uint32_t n = 4; n <= 5; n++) {
        pk = req_begin(&r, 2);
        moonlet_pack_cstr(pk, "");
        msgpack_pack_array(pk, n);
        for (uint32_t i = 0; i < n; i++)
            moonlet_pack_cstr(pk, "k");
        assert_int_equal(req_decode(&r, MOONLET_M_BATCH_EXIST_KEY, &b, 4),
                         n == 4 ? MOONLET_OK : MOONLET_ERR_INVALID_PARAMS);
        if (n == 5)
            assert_non_null(strstr(r.err, "batch of 5 keys exceeds the limit of 4 keys"));
        req_end(&r);
    }
    /* a wrongly-typed element; lease_mode above 255 */
    pk = req_begin(&r, 2);
    moonlet_pack_cstr(pk, "");
    msgpack_pack_array(pk, 2);
    moonlet_pack_cstr(pk, "a");
    msgpack_pack_int(pk, 5);
    assert_int_equal(req_decode(&r, MOONLET_M_BATCH_EXIST_KEY, &b, 0), MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
    moonlet_args_batch_probe bp;
    pk = req_begin(&r, 4);
    moonlet_pack_cstr(pk, "");
    msgpack_pack_uint64(pk, 256);
    msgpack_pack_uint64(pk, 2);
    msgpack_pack_array(pk, 0);
    assert_int_equal(req_decode(&r, MOONLET_M_BATCH_PROBE_KEY, &bp, 0),
                     MOONLET_ERR_INVALID_PARAMS);
    req_end(&r);
}

/* ---- packing -------------------------------------------------------------------- */

/* Packs `in` as a client does, decodes it as the master does; what `out`
 * points to lives in the previous call's zone until the next call. */
static void pack_decode(uint32_t method, const void *in, void *out, uint32_t want_nargs)
{
    static req r;
    static bool used;
    if (used)
        req_end(&r);
    used = method != 0;
    if (!used)
        return;
    const moonlet_rpc_args_spec *spec = moonlet_master_method(method)->spec;
    uint32_t n = moonlet_rpc_args_count(spec, in);
    assert_int_equal(n, want_nargs);
    moonlet_rpc_args_pack(spec, in, n, req_begin(&r, n));
    assert_int_equal(req_decode(&r, method, out, 0), MOONLET_OK);
}

static void test_pack_round_trip(void **state)
{
    (void)state;
    const char *pref[] = {"a", "bb"};
    moonlet_args_put_start in = {.tenant = {"t", 1}, .key = {"key", 3}, .size = 9,
                                 .replica_num = 2, .soft_pin = false}, out;
    pack_decode(MOONLET_M_PUT_START, &in, &out, 5); /* nothing optional is set */
    in.hard_pin = true; /* the preferred list before it goes as [] */
    pack_decode(MOONLET_M_PUT_START, &in, &out, 7);
    assert_true(out.hard_pin);
    assert_int_equal(out.preferred_segments.n, 0);
    in.preferred_segments = (moonlet_strv){NULL, pref, 2};
    in.soft_pin_ttl_ms = 5000;
    pack_decode(MOONLET_M_PUT_START, &in, &out, 8);
    assert_int_equal(out.preferred_segments.n, 2);
    assert_int_equal(out.preferred_segments.v[1].len, 2);
    assert_memory_equal(out.preferred_segments.v[1].ptr, "bb", 2);
    assert_int_equal(out.soft_pin_ttl_ms, 5000);
    /* a write key brings its clock; an alt endpoint its two companions */
    static const char key[16] = "0123456789abcdef";
    moonlet_args_mount m = {.client_id = "c", .segment_id = "s", .name = "n", .base = 1,
                            .size = 2, .endpoint = "e:1", .protocol = "tcp",
                            .write_key = {key, 16}}, mo;
    pack_decode(MOONLET_M_MOUNT_SEGMENT, &m, &mo, 9);
    m.alt_endpoint = "e:2";
    m.alt_segment_id = "s2";
    m.alt_protocol = "rdma";
    pack_decode(MOONLET_M_MOUNT_SEGMENT, &m, &mo, 12);
    assert_string_equal(mo.alt_protocol, "rdma");
    const uint64_t bounds[] = {1, 2};
    const char *kv[] = {"k1", "k2", "k3"}, *kda[] = {"d1", "d2"};
    moonlet_args_probe_resume pr = {.tenant = {"", 0}, .kv_keys = {NULL, kv, 3},
                                    .candidate_size = 2, .kda_keys = {NULL, kda, 2},
                                    .boundaries = {bounds, 2}}, pro;
    pack_decode(MOONLET_M_PROBE_RESUME, &pr, &pro, 5);
    assert_int_equal(pro.kv_keys.n, 3);
    assert_int_equal(pro.boundaries.v[1], 2);
    assert_memory_equal(pro.kda_keys.v[0].ptr, "d1", 2);
    pack_decode(0, NULL, NULL, 0); /* frees the last zone */
}

/* The DummyClient protocol: a nil tenant, tuple items, the placement group. */
static void test_dummy_round_trip(void **state)
{
    (void)state;
    const moonlet_rpc_method_decl *d = moonlet_dummy_method(MOONLET_DM_BATCH_PUT);
    const char *pref[] = {"node-a"};
    moonlet_dm_item items[2] = {{.key = "k0", .region = 1, .offset = 0, .len = 10},
                                {.key = "k1", .region = 2, .offset = 64, .len = 5}};
    moonlet_dm_batch_put_args in = {.tenant = NULL, .replica_num = 1, .items = {items, 2}}, out;
    assert_int_equal(moonlet_rpc_args_count(d->spec, &in), 4);
    in.preferred_segments = (moonlet_cstrv){pref, 1}; /* brings hard_pin and the TTL */
    uint32_t n = moonlet_rpc_args_count(d->spec, &in);
    assert_int_equal(n, 8);
    req r;
    moonlet_rpc_args_pack(d->spec, &in, n, req_begin(&r, n));
    size_t off = 0;
    assert_int_equal(msgpack_unpack(r.buf.data, r.buf.size, &off, &r.zone, &r.obj),
                     MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(moonlet_rpc_args_decode(d->name, d->spec, &r.obj, &r.zone, 0, &out, r.err,
                                             sizeof(r.err)), MOONLET_OK);
    assert_null(out.tenant);
    assert_int_equal(out.items.n, 2);
    const moonlet_dm_item *it = out.items.v;
    assert_string_equal(it[1].key, "k1");
    assert_int_equal(it[1].offset, 64);
    assert_string_equal(out.preferred_segments.v[0], "node-a");
    req_end(&r);
    /* an item of three fields is refused, naming the item's list */
    msgpack_packer *pk = req_begin(&r, 2);
    msgpack_pack_nil(pk);
    msgpack_pack_array(pk, 1);
    msgpack_pack_array(pk, 3);
    moonlet_pack_cstr(pk, "k");
    msgpack_pack_uint64(pk, 1);
    msgpack_pack_uint64(pk, 0);
    off = 0;
    assert_int_equal(msgpack_unpack(r.buf.data, r.buf.size, &off, &r.zone, &r.obj),
                     MSGPACK_UNPACK_SUCCESS);
    d = moonlet_dummy_method(MOONLET_DM_BATCH_GET);
    moonlet_dm_batch_get_args g;
    assert_int_equal(moonlet_rpc_args_decode(d->name, d->spec, &r.obj, &r.zone, 0, &g, r.err,
                                             sizeof(r.err)), MOONLET_ERR_INVALID_PARAMS);
    assert_non_null(strstr(r.err, "[key, region, offset, len]"));
    req_end(&r);
}

int main(int argc, char **argv)
{
    g_doc_path = argc > 1 ? argv[1] : "docs/protocol.md";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_match_table),
        cmocka_unit_test(test_table_well_formed),
        cmocka_unit_test(test_decode_counts_and_defaults),
        cmocka_unit_test(test_decode_groups_and_bounds),
        cmocka_unit_test(test_pack_round_trip),
        cmocka_unit_test(test_dummy_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
