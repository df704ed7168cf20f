/*
 * Unit test of common/bytesize.c: the size syntax of command-line flags.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "bytesize.h"
#include "moonlet/error.h"
#include "test_main.h"

static void test_parse_accepts(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        uint64_t want;
    } ok[] = {
        {"0", 0}, {"1", 1}, {"1048576", 1048576}, {"4KiB", 4096}, {"64MiB", 64ull << 20},
        {"1GiB", 1ull << 30}, {"2TiB", 2ull << 40}, {"1gib", 1ull << 30}, {"3kib", 3072},
        {"18446744073709551615", UINT64_MAX}, {"16777215TiB", 16777215ull << 40},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t v = 12345;
        assert_int_equal(moonlet_bytesize_parse(ok[i].in, &v), MOONLET_OK);
        assert_true(v == ok[i].want);
    }
}

static void test_parse_refuses(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "", "-1", "+1", " 1", "1 ", "1.5GiB", "1GB", "1G", "1KB", "GiB", "1GiBx", "0x10",
        "18446744073709551616", "16777216TiB", "99999999999999999999MiB", "1 GiB",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 777;
        assert_int_equal(moonlet_bytesize_parse(bad[i], &v), MOONLET_ERR_INVALID_PARAMS);
        assert_true(v == 777); /* untouched on error */
    }
    assert_int_equal(moonlet_bytesize_parse(NULL, NULL), MOONLET_ERR_INVALID_PARAMS);
}

static void test_format(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(moonlet_bytesize_format(64ull << 20, b, sizeof(b)), "64 MiB");
    assert_string_equal(moonlet_bytesize_format(1536ull << 10, b, sizeof(b)), "1536 KiB");
    assert_string_equal(moonlet_bytesize_format(1ull << 30, b, sizeof(b)), "1 GiB");
    assert_string_equal(moonlet_bytesize_format(7, b, sizeof(b)), "7 B");
    assert_string_equal(moonlet_bytesize_format(0, b, sizeof(b)), "0 B");
}

MOONLET_TEST_MAIN("bytesize", NULL, NULL,
                  cmocka_unit_test(test_parse_accepts),
                  cmocka_unit_test(test_parse_refuses),
                  cmocka_unit_test(test_format))
