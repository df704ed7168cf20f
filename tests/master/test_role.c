/*
 * test_role.c - master/ha/role.c, the HA role state machine, on clock values
 * the test chooses: the serving window (grace before it, fencing at its
 * end), renewals that never move it backwards nor revive a closed one,
 * deposition, and the epoch a reply carries in each state.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "moonlet/error.h"
#include "role.h"
#include "../common/test_main.h"

static void test_single_serves(void **state)
{
    uint64_t ep = 99;
    assert_true(moonlet_role_gate(NULL, 123, &ep));
    assert_int_equal(ep, 0);
    moonlet_role_info ri;
    moonlet_role_get(NULL, 0, &ri);
    assert_int_equal(ri.state, MOONLET_ROLE_SINGLE);
    assert_true(ri.serving);
}

static void test_window(void **state)
{
    moonlet_role *r;
    assert_int_equal(moonlet_role_create("10.0.0.1:50051", &r), MOONLET_OK);
    uint64_t ep = 1;
    assert_false(moonlet_role_gate(r, 1000, &ep)); /* a new role is a standby */
    assert_int_equal(ep, 0);
    moonlet_role_set_leader(r, "10.0.0.2:50051", 7);
    assert_false(moonlet_role_gate(r, 1000, &ep));
    assert_int_equal(ep, 7);
    moonlet_role_info ri;
    moonlet_role_get(r, 1000, &ri);
    assert_int_equal(ri.state, MOONLET_ROLE_STANDBY);
    assert_string_equal(ri.leader, "10.0.0.2:50051");

    /* elected at 1000 for epoch 9: grace until 6000, window end 4750 first */
    moonlet_role_elected(r, 9, 6000, 4750);
    assert_false(moonlet_role_gate(r, 1000, &ep));
    assert_false(moonlet_role_gate(r, 5999, &ep));
    assert_int_equal(ep, 9);
    moonlet_role_get(r, 1000, &ri); /* Hello tells clients when it serves */
    assert_false(ri.serving);
    assert_int_equal(ri.serve_in_ms, 5000);
    moonlet_role_renewed(r, 8000);
    assert_false(moonlet_role_gate(r, 5999, &ep)); /* still in the grace period */
    moonlet_role_get(r, 5999, &ri);
    assert_int_equal(ri.serve_in_ms, 1);
    moonlet_role_get(r, 6000, &ri);
    assert_true(ri.serving);
    assert_int_equal(ri.serve_in_ms, 0);
    assert_true(moonlet_role_gate(r, 6000, &ep));
    assert_true(moonlet_role_gate(r, 7999, &ep));
    assert_false(moonlet_role_gate(r, 8000, &ep)); /* fenced by the clock alone */
    moonlet_role_renewed(r, 7000);                 /* never backwards */
    assert_true(moonlet_role_gate(r, 7999, &ep));
    moonlet_role_get(r, 7000, &ri);
    assert_int_equal(ri.state, MOONLET_ROLE_LEADER);
    assert_string_equal(ri.leader, "10.0.0.1:50051");
    assert_int_equal(ri.terms, 1);

    moonlet_role_tick(r, 7000);
    moonlet_role_deposed(r, 7500);
    assert_false(moonlet_role_gate(r, 7500, &ep));
    assert_false(moonlet_role_gate(r, 6500, &ep));
    moonlet_role_renewed(r, 20000); /* a late keepalive never revives a closed window */
    assert_false(moonlet_role_gate(r, 9000, &ep));
    moonlet_role_get(r, 9000, &ri);
    assert_int_equal(ri.state, MOONLET_ROLE_STANDBY);
    assert_string_equal(ri.leader, "");
    assert_int_equal(ri.serve_in_ms, 0);
    moonlet_role_set_leader(r, "10.0.0.2:50051", 5); /* an older epoch never lowers it */
    assert_false(moonlet_role_gate(r, 9000, &ep));
    assert_int_equal(ep, 9);
    moonlet_role_destroy(r);
}

/* The serving log lines (what the HA tests' overlap check reads): while
 * `fn` runs, stderr goes to a file; returns what was written. */
static char *captured_log(void (*fn)(moonlet_role *), moonlet_role *r)
{
    FILE *f = tmpfile();
    assert_non_null(f);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(f), 2) >= 0);
    fn(r);
    fflush(stderr);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    off_t n = lseek(fileno(f), 0, SEEK_END);
    assert_true(n >= 0);
    char *text = calloc(1, (size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(pread(fileno(f), text, (size_t)n, 0), n);
    fclose(f);
    return text;
}

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

/* Epoch 9 serving from 6000 to 8000: ticks past the end (the old leader's
 * election thread ticking before it deposes) log nothing more; a renewal
 * that moves the end past the logged one (a keepalive sent in the window
 * whose reply came after it) serves again, logged from the old end. */
static void ticks_of_one_window(moonlet_role *r)
{
    moonlet_role_elected(r, 9, 6000, 8000);
    moonlet_role_tick(r, 7000);
    moonlet_role_tick(r, 8000);
    moonlet_role_tick(r, 8100);
    moonlet_role_tick(r, 8200);
    moonlet_role_renewed(r, 9000);
    moonlet_role_tick(r, 8500);
    moonlet_role_tick(r, 9000);
    moonlet_role_tick(r, 9100);
}

static void test_window_logged_once(void **state)
{
    moonlet_role *r;
    assert_int_equal(moonlet_role_create("10.0.0.1:50051", &r), MOONLET_OK);
    moonlet_log_set_level(MOONLET_LOG_INFO);
    char *text = captured_log(ticks_of_one_window, r);
    assert_int_equal(count(text, "serving begin epoch=9 mono_ms=6000"), 1);
    assert_int_equal(count(text, "serving end epoch=9 mono_ms=8000"), 1);
    assert_int_equal(count(text, "serving begin epoch=9 mono_ms=8000"), 1);
    assert_int_equal(count(text, "serving end epoch=9 mono_ms=9000"), 1);
    assert_int_equal(count(text, "serving begin"), 2);
    assert_int_equal(count(text, "serving end"), 2);
    free(text);
    moonlet_role_destroy(r);
}

MOONLET_TEST_MAIN("role", NULL, NULL,
                  cmocka_unit_test(test_single_serves),
                  cmocka_unit_test(test_window),
                  cmocka_unit_test(test_window_logged_once))
