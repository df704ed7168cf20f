/*
 * Unit tests of the pure K3 decisions in store/client/k3.c (include/moonlet/k3.h):
 * request validation, the KV boundary, candidate restriction (KV boundary and
 * the Eagle-style resume bound), the LAST_HIT_ONLY mask check (including the
 * masks it must reject), the lease-all choice and the distributed
 * intersection.  No cluster: tests/store/test_k3_lookup.c runs the lookup
 * itself against a master and a store node.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "moonlet/error.h"
#include "moonlet/k3.h"
#include "../common/test_main.h"

static const moonlet_k3_layout L2 = {.block_tokens = 128, .groups = 1, .ranks = 2, .components = 1};
static const uint64_t CKPTS[] = {128, 256, 384};

static moonlet_k3_request req(uint64_t prompt, uint64_t blocks, bool eagle)
{
    return (moonlet_k3_request){.prompt_tokens = prompt, .kv_blocks = blocks,
                                .checkpoints = CKPTS, .n_checkpoints = 3,
                                .recompute_last_token = eagle};
}

static void test_layout_and_request_check(void **state)
{
    (void)state;
    moonlet_k3_layout l = {.block_tokens = 16, .groups = 2, .ranks = 4, .components = 3};
    assert_int_equal(moonlet_k3_keys_per_checkpoint(&l), 24);
    l.components = 0;
    assert_int_equal(moonlet_k3_keys_per_checkpoint(&l), 0);
    assert_int_equal(moonlet_k3_keys_per_checkpoint(NULL), 0);

    moonlet_k3_request r = req(512, 4, false);
    assert_int_equal(moonlet_k3_request_check(&L2, &r), MOONLET_OK);
    assert_int_equal(moonlet_k3_request_check(&l, &r), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_k3_request_check(&L2, NULL), MOONLET_ERR_INVALID_PARAMS);
    r.prompt_tokens = 0;
    assert_int_equal(moonlet_k3_request_check(&L2, &r), MOONLET_ERR_INVALID_PARAMS);
    r = req(512, 0, false);
    assert_int_equal(moonlet_k3_request_check(&L2, &r), MOONLET_ERR_INVALID_PARAMS);
    r = req(512, 4, false);
    r.mode = (moonlet_k3_mode)7;
    assert_int_equal(moonlet_k3_request_check(&L2, &r), MOONLET_ERR_INVALID_PARAMS);

    static const uint64_t unaligned[] = {128, 200}, unordered[] = {256, 128}, zero[] = {0, 128},
                          dup[] = {128, 128};
    const uint64_t *bad[] = {unaligned, unordered, zero, dup};
    for (int i = 0; i < 4; i++) {
        r = req(512, 4, false);
        r.checkpoints = bad[i];
        r.n_checkpoints = 2;
        assert_int_equal(moonlet_k3_request_check(&L2, &r), MOONLET_ERR_INVALID_PARAMS);
    }
    r = req(512, 4, false);
    r.checkpoints = NULL;
    assert_int_equal(moonlet_k3_request_check(&L2, &r), MOONLET_ERR_INVALID_PARAMS);
    r.n_checkpoints = 0; /* no checkpoints at all is a valid request */
    assert_int_equal(moonlet_k3_request_check(&L2, &r), MOONLET_OK);
}

static void test_kv_boundary(void **state)
{
    (void)state;
    uint64_t k, b;
    const int32_t all[] = {1, 1, 1, 1};
    assert_int_equal(moonlet_k3_kv_boundary(all, 4, 128, 512, &k, &b), MOONLET_OK);
    assert_int_equal(k, 4);
    assert_int_equal(b, 512);
    /* A partial last block: the boundary stops at the prompt, not past it. */
    assert_int_equal(moonlet_k3_kv_boundary(all, 4, 128, 450, &k, &b), MOONLET_OK);
    assert_int_equal(k, 4);
    assert_int_equal(b, 450);
    /* The longest prefix: a later hit after a miss does not extend it. */
    const int32_t gap[] = {1, 1, 0, 1};
    assert_int_equal(moonlet_k3_kv_boundary(gap, 4, 128, 512, &k, &b), MOONLET_OK);
    assert_int_equal(k, 2);
    assert_int_equal(b, 256);
    const int32_t none[] = {0, 1, 1, 1};
    assert_int_equal(moonlet_k3_kv_boundary(none, 4, 128, 512, &k, &b), MOONLET_OK);
    assert_int_equal(k, 0);
    assert_int_equal(b, 0);
    /* An error is never a miss, wherever it is. */
    const int32_t err[] = {1, 0, MOONLET_ERR_INVALID_KEY, 1};
    assert_int_equal(moonlet_k3_kv_boundary(err, 4, 128, 512, &k, &b), MOONLET_ERR_INVALID_KEY);
    assert_int_equal(k, 0);
    assert_int_equal(b, 0);
    assert_int_equal(moonlet_k3_kv_boundary(all, 4, 0, 512, &k, &b), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_k3_kv_boundary(NULL, 4, 128, 512, &k, &b), MOONLET_ERR_INVALID_PARAMS);
}

static void test_candidates_cut_by_kv_boundary(void **state)
{
    (void)state;
    moonlet_k3_request r = req(512, 4, false);
    assert_int_equal(moonlet_k3_candidates(&r, 512), 3);
    assert_int_equal(moonlet_k3_candidates(&r, 384), 3);
    assert_int_equal(moonlet_k3_candidates(&r, 383), 2);
    assert_int_equal(moonlet_k3_candidates(&r, 256), 2);
    assert_int_equal(moonlet_k3_candidates(&r, 128), 1);
    assert_int_equal(moonlet_k3_candidates(&r, 127), 0);
    assert_int_equal(moonlet_k3_candidates(&r, 0), 0);
}

static void test_candidates_eagle_bound(void **state)
{
    (void)state;
    /* A 384-token prompt fully cached: without final-token recompute the
     * checkpoint at 384 is usable; with it the resume must stay below 384. */
    moonlet_k3_request r = req(384, 3, false);
    assert_int_equal(moonlet_k3_candidates(&r, 384), 3);
    r.recompute_last_token = true;
    assert_int_equal(moonlet_k3_candidates(&r, 384), 2);
    /* A 385-token prompt: 384 < 385, usable either way. */
    r = req(385, 4, true);
    assert_int_equal(moonlet_k3_candidates(&r, 385), 3);
    /* Never past the prompt, whatever the boundary claims. */
    r = req(300, 4, false);
    assert_int_equal(moonlet_k3_candidates(&r, 512), 2);
}

/* One call of a mask reader (moonlet_k3_check_mask or moonlet_k3_last_complete)
 * on mask[0, n_candidates * cs): its code, and the candidate it selects
 * (MOONLET_K3_NONE on every error). */
typedef struct mask_case {
    const char *what;
    int32_t mask[6];
    size_t n_candidates, cs;
    int rc;
    size_t sel;
} mask_case;

static void run_mask_cases(int (*fn)(const int32_t *, size_t, size_t, size_t *),
                           const mask_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t sel = 7;
        int rc = fn(cases[i].mask, cases[i].n_candidates, cases[i].cs, &sel);
        if (rc != cases[i].rc || sel != cases[i].sel)
            fail_msg("%s: rc %d selected %zu, want rc %d selected %zu", cases[i].what, rc, sel,
                     cases[i].rc, cases[i].sel);
    }
}

#define NONE MOONLET_K3_NONE
#define BAD MOONLET_ERR_INTERNAL_ERROR

static void test_check_mask_accepts(void **state)
{
    (void)state;
    static const mask_case cases[] = {
        {"the worked example's answer: 128", {1, 1, 0, 0, 0, 0}, 3, 2, MOONLET_OK, 0},
        {"the last checkpoint", {0, 0, 0, 0, 1, 1}, 3, 2, MOONLET_OK, 2},
        {"nothing selected", {0, 0, 0, 0, 0, 0}, 3, 2, MOONLET_OK, NONE},
        {"no candidates", {0}, 0, 2, MOONLET_OK, NONE},
    };
    run_mask_cases(moonlet_k3_check_mask, cases, sizeof(cases) / sizeof(cases[0]));
    size_t sel = 0;
    assert_int_equal(moonlet_k3_check_mask(NULL, 0, 2, &sel), MOONLET_OK);
    assert_int_equal(sel, MOONLET_K3_NONE);
}

static void test_check_mask_rejects(void **state)
{
    (void)state;
    static const mask_case cases[] = {
        /* an existence-style answer, not a selected-only mask */
        {"a partial group", {1, 1, 0, 1, 1, 0}, 3, 2, BAD, NONE},
        {"only a partial group", {0, 0, 0, 1, 0, 0}, 3, 2, BAD, NONE},
        {"two complete groups: not last hit only", {1, 1, 0, 0, 1, 1}, 3, 2, BAD, NONE},
        {"neither a boolean nor an error code", {2, 2, 0, 0, 0, 0}, 3, 2, BAD, NONE},
        /* a per-key error is returned as itself, never read as a miss */
        {"a per-key error", {1, 1, MOONLET_ERR_INVALID_KEY, 0, 0, 0}, 3, 2,
         MOONLET_ERR_INVALID_KEY, NONE},
        {"candidates of 0 keys", {1, 1, 0, 0, 0, 0}, 3, 0, MOONLET_ERR_INVALID_PARAMS, NONE},
    };
    run_mask_cases(moonlet_k3_check_mask, cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_last_complete(void **state)
{
    (void)state;
    static const mask_case cases[] = {
        /* the worked example's readability: 256 lacks rank 0, 384 lacks rank 1 */
        {"the worked example", {1, 1, 0, 1, 1, 0}, 3, 2, MOONLET_OK, 0},
        {"all complete", {1, 1, 1, 1, 1, 1}, 3, 2, MOONLET_OK, 2},
        {"cut by the boundary", {1, 1, 1, 1, 1, 1}, 2, 2, MOONLET_OK, 1},
        {"none complete", {0, 1, 1, 0}, 2, 2, MOONLET_OK, NONE},
        {"a per-key error", {1, 1, 1, MOONLET_ERR_INVALID_KEY}, 2, 2, MOONLET_ERR_INVALID_KEY,
         NONE},
    };
    run_mask_cases(moonlet_k3_last_complete, cases, sizeof(cases) / sizeof(cases[0]));
}

#undef NONE
#undef BAD

static void test_common_resume_is_intersection(void **state)
{
    (void)state;
    uint64_t out = 1;
    /* {128, 384} and {128, 256}: 128, not min(384, 256) = 256. */
    const uint64_t a[] = {128, 384}, b[] = {128, 256};
    const uint64_t *two[] = {a, b};
    const size_t n2[] = {2, 2};
    assert_int_equal(moonlet_k3_common_resume(two, n2, 2, &out), MOONLET_OK);
    assert_int_equal(out, 128);

    /* Unordered sets and more participants (ranks x pipeline stages). */
    const uint64_t c[] = {512, 128, 256, 384}, d[] = {384, 256, 512}, e[] = {256, 512, 128, 384};
    const uint64_t *three[] = {c, d, e};
    const size_t n3[] = {4, 3, 4};
    assert_int_equal(moonlet_k3_common_resume(three, n3, 3, &out), MOONLET_OK);
    assert_int_equal(out, 512);

    /* Nothing in common: resume from the start. */
    const uint64_t f[] = {128}, g[] = {256};
    const uint64_t *disjoint[] = {f, g};
    const size_t n1[] = {1, 1};
    assert_int_equal(moonlet_k3_common_resume(disjoint, n1, 2, &out), MOONLET_OK);
    assert_int_equal(out, 0);

    /* A participant with no complete checkpoint holds everyone at 0. */
    const uint64_t *with_empty[] = {a, NULL};
    const size_t ne[] = {2, 0};
    assert_int_equal(moonlet_k3_common_resume(with_empty, ne, 2, &out), MOONLET_OK);
    assert_int_equal(out, 0);

    /* One participant: its largest. */
    assert_int_equal(moonlet_k3_common_resume(three, n3, 1, &out), MOONLET_OK);
    assert_int_equal(out, 512);

    assert_int_equal(moonlet_k3_common_resume(two, n2, 0, &out), MOONLET_ERR_INVALID_PARAMS);
    const size_t bad[] = {2, 2};
    const uint64_t *holes[] = {a, NULL};
    assert_int_equal(moonlet_k3_common_resume(holes, bad, 2, &out), MOONLET_ERR_INVALID_PARAMS);
}

MOONLET_TEST_MAIN("k3", NULL, NULL,
                  cmocka_unit_test(test_layout_and_request_check),
                  cmocka_unit_test(test_kv_boundary),
                  cmocka_unit_test(test_candidates_cut_by_kv_boundary),
                  cmocka_unit_test(test_candidates_eagle_bound),
                  cmocka_unit_test(test_check_mask_accepts),
                  cmocka_unit_test(test_check_mask_rejects),
                  cmocka_unit_test(test_last_complete),
                  cmocka_unit_test(test_common_resume_is_intersection))
