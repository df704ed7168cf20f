/*
 * Unit test of common/cred.c: the credentials file's lines (tokens and
 * sha256: hashes, roles, tenants, what is refused), looking a token up, the
 * tenant rule, and the data plane's challenge-response MAC.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "cred.h"
#include "moonlet/error.h"
#include "test_main.h"

static void test_lines(void **state)
{
    (void)state;
    moonlet_cred_set *s = moonlet_cred_set_new();
    assert_non_null(s);
    assert_int_equal(moonlet_cred_parse_line(s, "", 1), 0);
    assert_int_equal(moonlet_cred_parse_line(s, "   # a comment", 2), 0);
    assert_int_equal(s->n, 0);
    assert_int_equal(moonlet_cred_parse_line(s, "tok-a client tenant-a,tenant-b # eng", 3), 0);
    assert_int_equal(moonlet_cred_parse_line(s, "\ttok-o\toperator,reader", 4), 0);
    assert_int_equal(moonlet_cred_parse_line(s, "tok-s all *", 5), 0);
    /* sha256 of "abc" */
    assert_int_equal(moonlet_cred_parse_line(s, "sha256:BA7816BF8F01CFEA414140DE5DAE2223B00361A3"
                                                "96177A9CB410FF61F20015AD node", 6), 0);
    assert_int_equal(s->n, 4);
    const moonlet_cred *c = moonlet_cred_find(s, "tok-a", 5);
    assert_non_null(c);
    assert_int_equal(c->roles, MOONLET_ROLE_CLIENT);
    assert_int_equal(c->line, 3);
    assert_int_equal(c->ntenants, 2);
    assert_true(moonlet_cred_tenant_ok(c, "tenant-b", 8));
    assert_false(moonlet_cred_tenant_ok(c, "tenant-c", 8));
    assert_false(moonlet_cred_tenant_ok(c, "tenant", 6));
    assert_false(moonlet_cred_tenant_ok(c, "", 0)); /* the default tenant */
    c = moonlet_cred_find(s, "tok-o", 5);
    assert_int_equal(c->roles, MOONLET_ROLE_OPERATOR | MOONLET_ROLE_READER);
    assert_true(moonlet_cred_tenant_ok(c, "", 0));
    c = moonlet_cred_find(s, "tok-s", 5);
    assert_int_equal(c->roles, MOONLET_ROLE_ALL);
    assert_null(c->tenants);
    c = moonlet_cred_find(s, "abc", 3);
    assert_non_null(c);
    assert_int_equal(c->roles, MOONLET_ROLE_NODE);
    assert_null(moonlet_cred_find(s, "ab", 2));
    assert_null(moonlet_cred_find(s, "tok-a ", 6));
    char buf[64];
    assert_string_equal(moonlet_cred_roles_str(MOONLET_ROLE_CLIENT | MOONLET_ROLE_PEER, buf,
                                               sizeof(buf)), "client,peer");
    moonlet_cred_set_free(s);
}

/* "cn:NAME" lines: a verified TLS client certificate's common name; never
 * found by a token (not even by "cn:NAME" sent as one). */
static void test_certificate_names(void **state)
{
    (void)state;
    moonlet_cred_set *s = moonlet_cred_set_new();
    assert_int_equal(moonlet_cred_parse_line(s, "cn:engine-1 client tenant-a", 1), 0);
    assert_int_equal(moonlet_cred_parse_line(s, "cn:ops operator,reader", 2), 0);
    assert_int_equal(moonlet_cred_parse_line(s, "tok client", 3), 0);
    const moonlet_cred *c = moonlet_cred_find_cn(s, "engine-1");
    assert_non_null(c);
    assert_int_equal(c->roles, MOONLET_ROLE_CLIENT);
    assert_true(moonlet_cred_tenant_ok(c, "tenant-a", 8));
    assert_false(moonlet_cred_tenant_ok(c, "tenant-b", 8));
    assert_int_equal(moonlet_cred_find_cn(s, "ops")->roles,
                     MOONLET_ROLE_OPERATOR | MOONLET_ROLE_READER);
    assert_null(moonlet_cred_find_cn(s, "engine"));
    assert_null(moonlet_cred_find_cn(s, ""));
    assert_null(moonlet_cred_find_cn(s, NULL));
    assert_null(moonlet_cred_find_cn(s, "tok")); /* a token's line has no name */
    assert_null(moonlet_cred_find(s, "cn:engine-1", 11));
    assert_null(moonlet_cred_find(s, "", 0));
    assert_non_null(moonlet_cred_find(s, "tok", 3));
    moonlet_cred_set_free(s);
}

static void test_bad_lines(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "tok",                              /* no roles */
        "tok admin",                        /* unknown role */
        "tok client,",                      /* an empty role */
        "tok client a,,b",                  /* an empty tenant */
        "tok client a, b",                  /* a fourth field */
        "sha256:abcd client",               /* a short hash */
        "sha256:zz7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad client",
    };
    moonlet_cred_set *s = moonlet_cred_set_new();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(moonlet_cred_parse_line(s, bad[i], (unsigned)i + 1),
                         MOONLET_ERR_INVALID_PARAMS);
        assert_int_equal(s->n, 0);
    }
    moonlet_cred_set_free(s);
    moonlet_cred_set *out = NULL;
    assert_int_equal(moonlet_cred_load("/nonexistent/credentials", &out),
                     MOONLET_ERR_INVALID_PARAMS);
}

static void test_mac(void **state)
{
    (void)state;
    uint8_t k1[32], k2[32], sn[32], cn[32], mac[32];
    moonlet_cred_key("one", 3, k1);
    moonlet_cred_key("two", 3, k2);
    moonlet_cred_nonce(sn);
    moonlet_cred_nonce(cn);
    moonlet_cred_mac(k1, "tcp", sn, cn, mac);
    uint8_t keys[2][32];
    memcpy(keys[0], k2, 32);
    memcpy(keys[1], k1, 32);
    assert_true(moonlet_cred_mac_check((const uint8_t(*)[32])keys, 2, NULL, "tcp", sn, cn, mac));
    assert_true(moonlet_cred_mac_check(NULL, 0, k1, "tcp", sn, cn, mac));
    assert_false(moonlet_cred_mac_check(NULL, 0, k2, "tcp", sn, cn, mac));
    assert_false(moonlet_cred_mac_check(NULL, 0, k1, "rdma", sn, cn, mac)); /* bound to the transport */
    uint8_t sn2[32];
    moonlet_cred_nonce(sn2);
    assert_memory_not_equal(sn, sn2, 32);
    assert_false(moonlet_cred_mac_check(NULL, 0, k1, "tcp", sn2, cn, mac)); /* another nonce */
}

MOONLET_TEST_MAIN("common_cred", NULL, NULL, cmocka_unit_test(test_lines),
                  cmocka_unit_test(test_certificate_names), cmocka_unit_test(test_bad_lines),
                  cmocka_unit_test(test_mac))
