/*
 * Unit test of moonlet-bench trace's library-like parts: loading the trace
 * (tools/bench/trace_load.c: good lines, every kind of bad line, blank lines,
 * the request limit) and the cache model (tools/bench/trace_model.c: the
 * checkpoint at the end of a prefill, key names, the working set, the hit
 * ratios of a cache that never evicts, on a trace small enough to work out
 * by hand).  No cluster.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace_load.h"
#include "trace_model.h"
#include "../common/test_main.h"

/* Writes text to a fresh temporary file; its path goes to path (>= 32 bytes). */
static void write_tmp(char *path, const char *text)
{
    strcpy(path, "/tmp/moonlet-trace-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
}

static int load_text(const char *text, size_t limit, trace *t)
{
    char path[64];
    write_tmp(path, text);
    memset(t, 0, sizeof(*t));
    int rc = trace_load(path, limit, t);
    unlink(path);
    return rc;
}

/* Four requests; worked out by hand in the tests below (kda_every 2). */
static const char *const SMALL =
    "{\"timestamp\": 0, \"input_length\": 2048, \"hash_ids\": [1, 2, 3, 4]}\n"
    "\n"
    "{\"timestamp\": 10, \"input_length\": 1600, \"hash_ids\": [1, 2, 3, 5]}\n"
    "{\"timestamp\": 20, \"input_length\": 2100, \"hash_ids\": [1, 2, 3, 4, 6]}\n"
    "{\"timestamp\": 30, \"input_length\": 2048, \"hash_ids\": [1, 2, 3, 4]}\n";

static void test_load_good(void **state)
{
    (void)state;
    trace t;
    assert_int_equal(load_text(SMALL, 0, &t), 0);
    assert_int_equal(t.n, 4);
    assert_int_equal(t.nids, 17);
    assert_int_equal(t.max_blocks, 5);
    assert_int_equal(t.r[2].ts_ms, 20);
    assert_int_equal(t.r[2].input, 2100);
    assert_int_equal(t.r[2].n, 5);
    assert_int_equal(t.r[2].off, 8);
    assert_int_equal(t.ids[t.r[2].off + 4], 6);
    trace_free(&t);
    assert_null(t.r);

    assert_int_equal(load_text(SMALL, 2, &t), 0); /* the limit */
    assert_int_equal(t.n, 2);
    trace_free(&t);
}

static void test_load_bad(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "",                                                        /* no request */
        "\n\n",                                                    /* still none */
        "not json\n",
        "{\"timestamp\": 0, \"input_length\": 10}\n",              /* no hash_ids */
        "{\"timestamp\": 0, \"input_length\": 10, \"hash_ids\": []}\n",
        "{\"timestamp\": 0, \"input_length\": 0, \"hash_ids\": [1]}\n",
        "{\"timestamp\": -1, \"input_length\": 10, \"hash_ids\": [1]}\n",
        "{\"timestamp\": 0, \"input_length\": 10, \"hash_ids\": [1, \"x\"]}\n",
        "{\"timestamp\": 0, \"input_length\": 10, \"hash_ids\": [-3]}\n",
        "{\"input_length\": 10, \"hash_ids\": [1]}\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        trace t;
        if (load_text(bad[i], 0, &t) != -1)
            fail_msg("accepted bad trace %zu: %s", i, bad[i]);
        trace_free(&t);
    }
    trace t = {0};
    assert_int_equal(trace_load("/nonexistent/trace.jsonl", 0, &t), -1);
    trace_free(&t);
}

static void test_layout_and_keys(void **state)
{
    (void)state;
    treq q = {.input = 2048, .n = 4};
    assert_int_equal(end_checkpoint_blocks(&q, 2), 4);
    q.input = 1600; /* 3 full blocks */
    assert_int_equal(end_checkpoint_blocks(&q, 2), 2);
    assert_int_equal(end_checkpoint_blocks(&q, 4), 0);
    q.input = 100000; /* more tokens than blocks: the blocks bound it */
    assert_int_equal(end_checkpoint_blocks(&q, 3), 3);

    const uint64_t ids[3] = {10, 20, 30};
    char buf[64];
    moonlet_k3_key_id kv = {.kind = MOONLET_K3_KEY_KV, .block = 1};
    trace_key((void *)ids, &kv, buf, sizeof(buf));
    assert_string_equal(buf, "kv/20");
    moonlet_k3_key_id kda = {.kind = MOONLET_K3_KEY_KDA, .position = 1024, .rank = 3};
    trace_key((void *)ids, &kda, buf, sizeof(buf));
    assert_string_equal(buf, "kda/20/r3");

    uint64_t v[6] = {5, 1, 5, 3, 1, 9};
    assert_int_equal(count_unique(v, 6), 4);
    assert_int_equal(count_unique(v, 0), 0);
}

static void test_working_set_and_reference(void **state)
{
    (void)state;
    trace t;
    assert_int_equal(load_text(SMALL, 0, &t), 0);
    trace_model m = {.kda_every = 2, .ranks = 2, .kv_bytes = 100, .kda_bytes = 10};
    working_set ws;
    assert_int_equal(working_set_of(&t, &m, &ws), 0);
    assert_int_equal(ws.kv_objects, 6);  /* ids 1..6 */
    assert_int_equal(ws.checkpoints, 2); /* ending at ids 4 and 2 */
    assert_int_equal(ws.bytes, 6 * 128 + 2 * 2 * 64);
    /* Request by request: 0 KV / 0 KDA blocks; 3 / 0 (the checkpoint at
     * block 2 is not written yet); 4 / 4; 4 / 2 (resuming at 2048 tokens
     * would leave no token of its 2048 to compute). */
    double kv = 0, kda = 0;
    assert_int_equal(reference_hits(&t, &m, &ws, &kv, &kda), 0);
    assert_true(kv == 11.0 / 17.0);
    assert_true(kda == 6.0 / 17.0);
    trace_free(&t);
}

static void test_idset(void **state)
{
    (void)state;
    idset s;
    assert_int_equal(idset_init(&s, 10), 0);
    assert_false(idset_has(&s, 0));
    idset_add(&s, 0); /* id 0 is a real id (stored + 1) */
    assert_true(idset_has(&s, 0));
    for (uint64_t i = 1; i < 600; i++)
        idset_add(&s, i * 1024);
    for (uint64_t i = 1; i < 600; i++)
        assert_true(idset_has(&s, i * 1024));
    assert_false(idset_has(&s, 1023));
    free(s.slot);
}

MOONLET_TEST_MAIN("trace_model", NULL, NULL,
                  cmocka_unit_test(test_load_good),
                  cmocka_unit_test(test_load_bad),
                  cmocka_unit_test(test_layout_and_keys),
                  cmocka_unit_test(test_working_set_and_reference),
                  cmocka_unit_test(test_idset))
