/*
 * Tests of store/client/client_metrics.c: the client's counters as
 * /metrics renders them (keys, bytes, hits, misses, errors by code, a
 * cumulative latency histogram), and its HTTP endpoint (/metrics, /health,
 * 404, the cluster token, off unless the config asks).  No cluster needed:
 * the calls' outcomes are recorded as client_api.c records them.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "client_metrics.h"
#include "moonlet/error.h"
#include "../common/http_get.h"
#include "../common/test_main.h"

/* Starts an endpoint on 127.0.0.1:port (0: a free one) with `token`. */
static int start_on(const char *token, uint16_t port, moonlet_client_metrics **m)
{
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg, sizeof cfg);
    cfg.default_tenant = "my-default";
    cfg.http_server = true;
    cfg.http_address = "127.0.0.1";
    cfg.http_port = port;
    cfg.auth_token = token;
    *m = NULL;
    return moonlet_client_metrics_start(&cfg, m);
}

static moonlet_client_metrics *start(const char *token, uint16_t *port)
{
    moonlet_client_metrics *m;
    assert_int_equal(start_on(token, 0, &m), MOONLET_OK);
    assert_non_null(m);
    *port = moonlet_client_metrics_port(m);
    assert_true(*port > 0);
    return m;
}

static void test_off_unless_asked(void **state)
{
    (void)state;
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg, sizeof cfg);
    moonlet_client_metrics *m = (moonlet_client_metrics *)1;
    assert_int_equal(moonlet_client_metrics_start(&cfg, &m), MOONLET_OK);
    assert_null(m);
    assert_int_equal(moonlet_cm_begin(NULL), 0);
    moonlet_cm_key(NULL, MOONLET_CM_PUT, NULL, 0, 1, 1); /* no-ops */
    moonlet_cm_call(NULL, MOONLET_CM_PUT, 0);
    assert_int_equal(moonlet_client_metrics_port(NULL), 0);
    moonlet_client_metrics_stop(NULL);
    cfg.http_server = true;
    cfg.http_address = "not an address";
    assert_int_equal(moonlet_client_metrics_start(&cfg, &m), MOONLET_ERR_INVALID_PARAMS);
}

static void test_counts_render(void **state)
{
    (void)state;
    uint16_t port;
    moonlet_client_metrics *m = start(NULL, &port);
    uint64_t t0 = moonlet_cm_begin(m);
    assert_true(t0 > 0);
    moonlet_cm_key(m, MOONLET_CM_PUT, NULL, MOONLET_OK, 1000, 1);
    moonlet_cm_key(m, MOONLET_CM_PUT, NULL, MOONLET_ERR_NO_AVAILABLE_HANDLE, 0, 1);
    moonlet_cm_call(m, MOONLET_CM_PUT, t0);
    moonlet_cm_key(m, MOONLET_CM_GET, "t1", MOONLET_OK, 24, 1);
    moonlet_cm_key(m, MOONLET_CM_GET, "t1", MOONLET_ERR_OBJECT_NOT_FOUND, 0, 1);
    moonlet_cm_key(m, MOONLET_CM_GET, "t1", MOONLET_ERR_BUFFER_OVERFLOW, 0, 1); /* size learned only */
    moonlet_cm_key(m, MOONLET_CM_GET, "t1", MOONLET_ERR_INVALID_READ, 0, 1);
    moonlet_cm_call(m, MOONLET_CM_GET, t0 - 30 * 1000000ull); /* 30 ms */
    moonlet_cm_key(m, MOONLET_CM_EXIST, "", MOONLET_OK, 0, 1);
    moonlet_cm_key(m, MOONLET_CM_EXIST, "", MOONLET_OK, 0, 0);
    moonlet_cm_key(m, MOONLET_CM_REMOVE, "a\"b\\c", MOONLET_ERR_OBJECT_NOT_FOUND, 0, 1);
    static const char *const want[] = {
        "moonlet_client_puts_total 1",
        "moonlet_client_put_bytes_total 1000",
        "moonlet_client_gets_total 3",
        "moonlet_client_get_bytes_total 24",
        "moonlet_client_hits_total{op=\"get\"} 1",
        "moonlet_client_misses_total{op=\"get\"} 1",
        "moonlet_client_hits_total{op=\"exist\"} 1",
        "moonlet_client_misses_total{op=\"exist\"} 1",
        "moonlet_client_failures_total{op=\"put\"} 1",
        "moonlet_client_failures_total{op=\"remove\"} 1",
        "moonlet_client_errors_total{op=\"put\",code=\"-200\",name=\"NO_AVAILABLE_HANDLE\"} 1",
        "moonlet_client_errors_total{op=\"get\",code=\"-701\",name=\"INVALID_READ\"} 1",
        "moonlet_client_errors_total{op=\"remove\",code=\"-704\",name=\"OBJECT_NOT_FOUND\"} 1",
        /* the 30 ms get: not below 25 ms, below 50 ms; cumulative after */
        "moonlet_client_latency_seconds_bucket{op=\"get\",le=\"0.025\"} 0",
        "moonlet_client_latency_seconds_bucket{op=\"get\",le=\"0.05\"} 1",
        "moonlet_client_latency_seconds_bucket{op=\"get\",le=\"+Inf\"} 1",
        "moonlet_client_latency_seconds_count{op=\"get\"} 1",
        "moonlet_client_latency_seconds_count{op=\"exist\"} 0",
        /* per tenant: NULL and "" are the client's default tenant; names escaped */
        "moonlet_client_tenant_keys_total{tenant=\"my-default\",op=\"put\",outcome=\"ok\"} 1",
        "moonlet_client_tenant_keys_total{tenant=\"my-default\",op=\"put\",outcome=\"error\"} 1",
        "moonlet_client_tenant_keys_total{tenant=\"t1\",op=\"get\",outcome=\"ok\"} 1",
        "moonlet_client_tenant_keys_total{tenant=\"t1\",op=\"get\",outcome=\"miss\"} 1",
        "moonlet_client_tenant_keys_total{tenant=\"my-default\",op=\"exist\",outcome=\"miss\"} 1",
        ("moonlet_client_tenant_keys_total{tenant=\"a\\\"b\\\\c\",op=\"remove\","
         "outcome=\"error\"} 1"), /* one line, cut in two */
        "moonlet_client_tenant_bytes_total{tenant=\"my-default\",op=\"put\"} 1000",
        "moonlet_client_tenant_bytes_total{tenant=\"t1\",op=\"get\"} 24",
    };
    size_t len = 0;
    char *text = moonlet_client_metrics_render(m, &len);
    assert_rendered(text, len, want, sizeof(want) / sizeof(want[0]));
    assert_non_null(strstr(text, "# TYPE moonlet_client_latency_seconds histogram\n"));
    free(text);

    char *r = http_get(port, "GET /metrics HTTP/1.0\r\n\r\n");
    assert_non_null(r);
    assert_non_null(strstr(r, " 200 "));
    assert_non_null(strstr(r, "text/plain; version=0.0.4"));
    assert_true(has_line(r, "moonlet_client_puts_total 1"));
    free(r);
    r = http_get(port, "GET /health HTTP/1.0\r\n\r\n");
    assert_non_null(r);
    assert_non_null(strstr(r, " 200 "));
    assert_true(has_line(r, "OK"));
    free(r);
    assert_true(http_answers(port, "GET /other HTTP/1.0\r\n\r\n", " 404 ", NULL));
    assert_true(http_answers(port, "POST /metrics HTTP/1.0\r\n\r\n", " 405 ", NULL));
    moonlet_client_metrics_stop(m);
    assert_null(http_get(port, "GET /health HTTP/1.0\r\n\r\n")); /* closed with the client */
}

/* The tenant table is bounded: past its 32 tenants, keys count under "other". */
static void test_tenants_bounded(void **state)
{
    (void)state;
    uint16_t port;
    moonlet_client_metrics *m = start(NULL, &port);
    char name[16];
    for (int i = 0; i < 40; i++) {
        snprintf(name, sizeof(name), "tenant-%02d", i);
        moonlet_cm_key(m, MOONLET_CM_PUT, name, MOONLET_OK, 10, 1);
    }
    moonlet_cm_key(m, MOONLET_CM_PUT, "tenant-00", MOONLET_OK, 10, 1); /* known: its own */
    char *text = moonlet_client_metrics_render(m, NULL);
    assert_non_null(text);
    assert_true(has_line(text, "moonlet_client_tenant_keys_total{tenant=\"tenant-00\",op=\"put\","
                               "outcome=\"ok\"} 2"));
    assert_true(has_line(text, "moonlet_client_tenant_keys_total{tenant=\"tenant-31\",op=\"put\","
                               "outcome=\"ok\"} 1"));
    assert_null(strstr(text, "tenant=\"tenant-32\""));
    assert_true(has_line(text, "moonlet_client_tenant_keys_total{tenant=\"other\",op=\"put\","
                               "outcome=\"ok\"} 8"));
    assert_true(has_line(text, "moonlet_client_tenant_bytes_total{tenant=\"other\",op=\"put\"} 80"));
    assert_true(has_line(text, "moonlet_client_puts_total 41"));
    free(text);
    moonlet_client_metrics_stop(m);
}

/* With the cluster token set, /metrics and /health need it as a Bearer token. */
static void test_token(void **state)
{
    (void)state;
    uint16_t port;
    moonlet_client_metrics *m = start("s3cret", &port);
    const char *refused[] = {"GET /metrics HTTP/1.0\r\n\r\n",
                             "GET /health HTTP/1.0\r\nAuthorization: Bearer s3cre\r\n\r\n"};
    for (size_t i = 0; i < 2; i++)
        assert_true(http_answers(port, refused[i], " 401 ", "moonlet_client_puts_total"));
    char *r = http_get(port, "GET /metrics HTTP/1.0\r\nAuthorization: Bearer s3cret\r\n\r\n");
    assert_non_null(strstr(r, " 200 "));
    assert_true(has_line(r, "moonlet_client_puts_total 0"));
    free(r);
    /* a port in use: the second endpoint cannot start */
    moonlet_client_metrics *m2;
    assert_int_equal(start_on(NULL, port, &m2), MOONLET_ERR_INTERNAL_ERROR);
    assert_null(m2);
    moonlet_client_metrics_stop(m);
}

MOONLET_TEST_MAIN("client_metrics", NULL, NULL,
                  cmocka_unit_test(test_off_unless_asked),
                  cmocka_unit_test(test_counts_render),
                  cmocka_unit_test(test_tenants_bounded),
                  cmocka_unit_test(test_token))
