/*
 * Unit tests of master/service/metrics.c: the Prometheus text rendering of a stats
 * snapshot (families, labels, cumulative histogram buckets) and the HTTP
 * server itself on an ephemeral loopback port (200 on /metrics with the
 * master's live counters, 404 elsewhere, 405 for other methods).
 */
#include "../common/master_fixture.h"

#include "metrics.h"
#include "repl_peer.h"
#include "../common/http_get.h"
#include "../common/test_main.h"

static void test_render(void **state)
{
    (void)state;
    moonlet_master_stats st;
    memset(&st, 0, sizeof(st));
    st.objects = 7;
    st.bytes = 123456789012ull;
    st.segments = 3;
    st.capacity = 1ull << 40;
    st.used = 4096;
    st.leases_get = 11;
    st.leases_exist = 12;
    st.leases_probe = 13;
    st.probe_calls_none = 21;
    st.probe_calls_last_hit = 22;
    st.evictions = 31;
    st.put_starts_reserved = 32;
    st.probe_recheck_fallbacks = 41;
    for (unsigned i = 0; i < MOONLET_LOCK_HIST_BUCKETS; i++)
        st.probe_lock_hold_hist[i] = i + 1; /* 1, 2, ... 12 */
    st.resume_calls = 51;
    st.resume_recheck_fallbacks = 52;
    st.leases_resume_kda = 53;
    st.leases_resume_kv = 54;
    st.resume_lock_hold_hist[2] = 5; /* <4 us */
    st.resume_lock_hold_hist[MOONLET_LOCK_HIST_BUCKETS - 1] = 1;
    st.resume_lock_hold_max_ns = 2500000;
    static const char *const want[] = {
        "# TYPE moonlet_objects gauge",
        "moonlet_objects 7",
        "moonlet_bytes 123456789012",
        "moonlet_segments 3",
        "moonlet_capacity_bytes 1099511627776",
        "moonlet_used_bytes 4096",
        "# TYPE moonlet_leases_granted_total counter",
        "moonlet_leases_granted_total{op=\"get\"} 11",
        "moonlet_leases_granted_total{op=\"exist\"} 12",
        "moonlet_leases_granted_total{op=\"probe\"} 13",
        "moonlet_probe_calls_total{mode=\"none\"} 21",
        "moonlet_probe_calls_total{mode=\"last_hit_only\"} 22",
        "moonlet_evictions_total 31",
        "moonlet_put_starts_reserved_total 32",
        "moonlet_probe_recheck_fallbacks_total 41",
        "# TYPE moonlet_probe_lock_hold_seconds histogram",
        /* cumulative: bucket i (< 2^i us) holds 1 + 2 + ... + (i + 1) */
        "moonlet_probe_lock_hold_seconds_bucket{le=\"1e-06\"} 1",
        "moonlet_probe_lock_hold_seconds_bucket{le=\"2e-06\"} 3",
        "moonlet_probe_lock_hold_seconds_bucket{le=\"1.6e-05\"} 15",
        "moonlet_probe_lock_hold_seconds_bucket{le=\"0.001024\"} 66",
        "moonlet_probe_lock_hold_seconds_bucket{le=\"+Inf\"} 78",
        "moonlet_probe_lock_hold_seconds_count 78",
        "moonlet_resume_calls_total 51",
        "moonlet_resume_recheck_fallbacks_total 52",
        "moonlet_resume_leases_granted_total{kind=\"kda\"} 53",
        "moonlet_resume_leases_granted_total{kind=\"kv\"} 54",
        "moonlet_resume_lock_hold_seconds_bucket{le=\"2e-06\"} 0",
        "moonlet_resume_lock_hold_seconds_bucket{le=\"4e-06\"} 5",
        "moonlet_resume_lock_hold_seconds_bucket{le=\"0.001024\"} 5",
        "moonlet_resume_lock_hold_seconds_bucket{le=\"+Inf\"} 6",
        "moonlet_resume_lock_hold_max_seconds 0.002500000",
    };
    size_t len = 0;
    char *text = moonlet_metrics_render(&st, &len);
    assert_rendered(text, len, want, sizeof(want) / sizeof(want[0]));
    assert_null(strstr(text, "_sum"));
    free(text);
}

/* A rendered section: its length is the one reported, and it holds every one
 * of the NULL-terminated needles. */
static void assert_section(const char *text, size_t len, const char *const *needles)
{
    assert_non_null(text);
    assert_int_equal(strlen(text), len);
    for (; *needles; needles++)
        if (!strstr(text, *needles))
            fail_msg("no '%s' in:\n%s", *needles, text);
}

/* HA: the role's gauges (appended to /metrics when the master has a role). */
static void test_render_role(void **state)
{
    (void)state;
    moonlet_role *r;
    assert_int_equal(moonlet_role_create("10.0.0.1:50051", &r), MOONLET_OK);
    moonlet_role_elected(r, 42, 100, 1000);
    moonlet_role_info ri;
    moonlet_role_get(r, 500, &ri);
    size_t len = 0;
    char *text = moonlet_metrics_render_role(&ri, &len);
    assert_section(text, len,
                   (const char *[]){"# TYPE moonlet_ha_role gauge\nmoonlet_ha_role 2\n",
                                    "\nmoonlet_ha_serving 1\n", "\nmoonlet_ha_epoch 42\n",
                                    "\nmoonlet_ha_terms 1\n", NULL});
    free(text);
    moonlet_role_get(r, 1000, &ri); /* past the window: not serving */
    text = moonlet_metrics_render_role(&ri, NULL);
    assert_non_null(strstr(text, "\nmoonlet_ha_serving 0\n"));
    free(text);
    moonlet_role_destroy(r);
}

/* The RPC server's counter (appended to /metrics by moonlet-master). */
static void test_render_rpc(void **state)
{
    (void)state;
    size_t len = 0;
    char *text = moonlet_metrics_render_rpc(3, &len);
    assert_section(text, len,
                   (const char *[]){"# TYPE moonlet_rpc_reply_deadline_closes_total counter\n"
                                    "moonlet_rpc_reply_deadline_closes_total 3\n",
                                    NULL});
    free(text);
}

/* The hot standby's gauges, from a leader's log: a standby that acknowledged
 * everything is in sync; records it has not acknowledged age into the lag. */
static void test_render_repl(void **state)
{
    (void)state;
    moonlet_repl_log *l;
    assert_int_equal(moonlet_repl_log_create(NULL, &l), MOONLET_OK);
    moonlet_repl_rec rec = {.type = MOONLET_REPL_UNMOUNT, .client_id = MOONLET_STR("c"),
                            .segment_id = MOONLET_STR("s")};
    moonlet_repl_log_emit(l, &rec);
    bool lost;
    uint64_t first, count;
    int fd = peer_open(l, "sb:1", 1, &lost);
    assert_true(fd >= 0);
    assert_true(peer_records(fd, &first, &count, 5000));
    peer_ack(fd, 2); /* acknowledges record 1: in sync */
    PEER_WAIT_STATUS(l, st.in_sync);
    moonlet_repl_log_emit(l, &rec);
    moonlet_repl_log_status st;
    moonlet_repl_log_get_status(l, &st);
    size_t tl = 0;
    char *text = moonlet_metrics_render_repl(&st, &tl);
    assert_section(text, tl,
                   (const char *[]){"# TYPE moonlet_ha_repl_in_sync gauge\n"
                                    "moonlet_ha_repl_in_sync 1\n",
                                    "\nmoonlet_ha_repl_acked 2\n", "\nmoonlet_ha_repl_next 3\n",
                                    "\nmoonlet_ha_repl_lag_ms ",
                                    "\nmoonlet_ha_repl_out_of_sync_total 0\n", NULL});
    free(text);
    moonlet_repl_log_destroy(l);
    close(fd);
}

/* A master on the real clock and its /metrics server on an ephemeral
 * loopback port (token NULL: none). */
static moonlet_master *serve_metrics(const char *token, moonlet_metrics **s, uint16_t *port)
{
    moonlet_master_config cfg = fix_config(8);
    moonlet_master *m = fix_master_of(&cfg, 0);
    assert_int_equal(moonlet_metrics_start(m, "127.0.0.1", 0, token, s), MOONLET_OK);
    *port = moonlet_metrics_port(*s);
    assert_true(*port != 0);
    return m;
}

static void test_http_server(void **state)
{
    (void)state;
    moonlet_metrics *s;
    uint16_t port;
    moonlet_master *m = serve_metrics(NULL, &s, &port);
    fix_mount(m, "c", "s", 1 << 20);
    assert_int_equal(fix_put(m, "k", 100), MOONLET_OK);

    char *r = http_get(port, "GET /metrics HTTP/1.0\r\n\r\n");
    assert_non_null(r);
    assert_non_null(strstr(r, "HTTP/1.0 200") ? r : strstr(r, "HTTP/1.1 200"));
    assert_non_null(strstr(r, "text/plain; version=0.0.4"));
    /* the master's live counters */
    static const char *const live[] = {"moonlet_objects 1", "moonlet_bytes 100",
                                       "moonlet_segments 1", "moonlet_capacity_bytes 1048576"};
    assert_lines(r, live, sizeof(live) / sizeof(live[0]));
    free(r);

    r = http_get(port, "GET /other HTTP/1.0\r\n\r\n");
    assert_non_null(r);
    assert_non_null(strstr(r, " 404 "));
    free(r);
    r = http_get(port, "POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n");
    assert_non_null(r);
    assert_non_null(strstr(r, " 405 "));
    free(r);

    /* the port is taken: a second server on it fails cleanly */
    moonlet_metrics *s2 = NULL;
    assert_int_equal(moonlet_metrics_start(m, "127.0.0.1", port, NULL, &s2), MOONLET_ERR_INTERNAL_ERROR);
    assert_null(s2);
    moonlet_metrics_stop(s);
    moonlet_metrics_stop(NULL);
    moonlet_master_destroy(m);
}

/* With a cluster token, a scrape without it (or with another) gets 401 and
 * no statistics; the right bearer token gets them. */
static void test_http_token(void **state)
{
    (void)state;
    moonlet_metrics *s;
    uint16_t port;
    moonlet_master *m = serve_metrics("s3cret", &s, &port);
    const char *refused[] = {
        "GET /metrics HTTP/1.0\r\n\r\n",
        "GET /metrics HTTP/1.0\r\nAuthorization: Bearer s3cre\r\n\r\n",
        "GET /metrics HTTP/1.0\r\nAuthorization: Bearer s3cret2\r\n\r\n",
        "GET /metrics HTTP/1.0\r\nAuthorization: Basic s3cret\r\n\r\n",
        "GET /other HTTP/1.0\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        assert_true(http_answers(port, refused[i], " 401 ", "moonlet_objects"));
    char *r = http_get(port, "GET /metrics HTTP/1.0\r\nAuthorization: Bearer s3cret\r\n\r\n");
    assert_non_null(r);
    assert_non_null(strstr(r, " 200 "));
    assert_true(has_line(r, "moonlet_objects 0"));
    free(r);
    moonlet_metrics_stop(s);
    moonlet_master_destroy(m);
}

MOONLET_TEST_MAIN("metrics", NULL, NULL,
                  cmocka_unit_test(test_render),
                  cmocka_unit_test(test_render_role),
                  cmocka_unit_test(test_render_rpc),
                  cmocka_unit_test(test_render_repl),
                  cmocka_unit_test(test_http_server),
                  cmocka_unit_test(test_http_token))
