/* Tests of master/store/objslab.c: blocks are distinct and zeroed, freed blocks are
 * reused, and a mass removal returns its chunks to the system (issue 13:
 * master memory after mass removal was reused but never returned). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "objslab.h"
#include "../common/test_main.h"

#define CHUNK (2u << 20)
#define N 200000

static void test_mass_free_returns_memory(void **state)
{
    (void)state;
    moonlet_objslab *s = moonlet_objslab_create(512);
    assert_non_null(s);
    void **p = calloc(N, sizeof(*p));
    for (int i = 0; i < N; i++) {
        p[i] = moonlet_objslab_alloc(s, 128);
        assert_non_null(p[i]);
        assert_int_equal(((unsigned char *)p[i])[127], 0);
        memset(p[i], 0xab, 128);
    }
    size_t full = moonlet_objslab_reserved(s);
    assert_true(full >= (size_t)N * 128);
    /* half of them, interleaved: no chunk empties, nothing to return */
    for (int i = 0; i < N; i += 2)
        moonlet_objslab_free(s, p[i], 128);
    assert_int_equal(moonlet_objslab_reserved(s), full);
    /* reused before any new chunk */
    for (int i = 0; i < N; i += 2) {
        p[i] = moonlet_objslab_alloc(s, 128);
        assert_int_equal(((unsigned char *)p[i])[0], 0);
    }
    assert_int_equal(moonlet_objslab_reserved(s), full);
    /* everything: at most the chunk being carved and one spare stay */
    for (int i = 0; i < N; i++)
        moonlet_objslab_free(s, p[i], 128);
    assert_true(moonlet_objslab_reserved(s) <= 2 * CHUNK);
    /* and the slab still works */
    for (int i = 0; i < N; i++)
        assert_non_null(p[i] = moonlet_objslab_alloc(s, 128));
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 4 && i + k + 1 < N; k++)
            assert_ptr_not_equal(p[i], p[i + k + 1]);
    for (int i = 0; i < N; i++)
        moonlet_objslab_free(s, p[i], 128);
    free(p);
    moonlet_objslab_destroy(s);
}

MOONLET_TEST_MAIN("master_objslab", NULL, NULL,
                  cmocka_unit_test(test_mass_free_returns_memory))
