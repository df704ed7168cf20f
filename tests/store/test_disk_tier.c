/*
 * test_disk_tier.c - store/node/disk_tier.c on files in a fresh directory
 * under the working directory (a real file system: O_DIRECT): objects of
 * odd sizes written and read back through several waves of I/O, a rescan
 * after a reopen (removed objects stay removed), a corrupt byte and a
 * truncated file (the read refuses, the rescan drops, never other bytes),
 * a full tier, two paths, bad arguments, and threads at once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "disk_tier.h"
#include "moonlet/error.h"

static char g_dir[64];
static char g_path[2][128];

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "disk-tier-XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    for (int i = 0; i < 2; i++)
        snprintf(g_path[i], sizeof(g_path[i]), "%s/tier%d", g_dir, i);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++)
        unlink(g_path[i]);
    rmdir(g_dir);
    return 0;
}

static void fresh(void)
{
    for (int i = 0; i < 2; i++)
        unlink(g_path[i]);
}

static moonlet_disk *open_tier(size_t npaths, uint64_t size, unsigned qd, size_t io)
{
    const char *paths[] = {g_path[0], g_path[1]};
    moonlet_disk_opts o = {.paths = paths, .npaths = npaths, .size = size, .queue_depth = qd,
                           .io_bytes = io};
    moonlet_disk *d = NULL;
    assert_int_equal(moonlet_disk_open(&o, &d), MOONLET_OK);
    return d;
}

static unsigned char *pattern(size_t n, uint32_t seed)
{
    unsigned char *b = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)((seed * 2654435761u + i * 40503u) >> 11);
    return b;
}

static int put(moonlet_disk *d, const char *key, const unsigned char *b, size_t n,
               moonlet_disk_loc *loc)
{
    /* two ranges, as a put's scattered buffers would be */
    struct iovec iov[2] = {{(void *)b, n / 3}, {(void *)(b + n / 3), n - n / 3}};
    return moonlet_disk_write(d, key, iov, 2, XXH3_64bits(b, n), loc);
}

static void read_is(moonlet_disk *d, const moonlet_disk_loc *loc, const char *key,
                    const unsigned char *want, size_t n)
{
    unsigned char *got = malloc(n ? n : 1);
    size_t len = 1;
    assert_int_equal(moonlet_disk_read(d, loc, key, got, n, &len), MOONLET_OK);
    assert_int_equal(len, n);
    assert_memory_equal(got, want, n);
    free(got);
}

static const size_t sizes[] = {0, 1, 4095, 4096, (1u << 20) + 3, 5u << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

struct seen {
    int n;
    moonlet_disk_loc loc[16];
    char key[16][32];
};

static void see(void *arg, const char *key, const moonlet_disk_loc *loc, uint64_t checksum)
{
    (void)checksum;
    struct seen *s = arg;
    if (s->n < 16) {
        s->loc[s->n] = *loc;
        snprintf(s->key[s->n], sizeof(s->key[0]), "%s", key);
    }
    s->n++;
}

/* Objects of odd sizes, several waves each (queue depth 4 of 64 KiB), read
 * back exact; after a reopen the rescan finds each where it was, and one
 * removed before stays removed. */
static void test_round_trip_and_rescan(void **state)
{
    (void)state;
    fresh();
    moonlet_disk *d = open_tier(1, 32u << 20, 4, 64u << 10);
    moonlet_disk_loc loc[NSIZES];
    unsigned char *b[NSIZES];
    char key[NSIZES][32];
    for (size_t i = 0; i < NSIZES; i++) {
        snprintf(key[i], sizeof(key[i]), "obj-%zu", i);
        b[i] = pattern(sizes[i], (uint32_t)i + 1);
        assert_int_equal(put(d, key[i], b[i], sizes[i], &loc[i]), MOONLET_OK);
        assert_int_equal(loc[i].size, sizes[i]);
    }
    for (size_t i = 0; i < NSIZES; i++)
        read_is(d, &loc[i], key[i], b[i], sizes[i]);
    assert_int_equal(moonlet_disk_remove(d, &loc[2]), MOONLET_OK);
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.objects, NSIZES - 1);
    assert_int_equal(st.writes, NSIZES);
    moonlet_disk_close(d);

    d = open_tier(1, 32u << 20, 4, 64u << 10);
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.scan_kept, NSIZES - 1);
    assert_int_equal(st.scan_dropped, 0);
    struct seen s = {0};
    moonlet_disk_scan(d, see, &s);
    assert_int_equal(s.n, NSIZES - 1);
    for (size_t i = 0; i < NSIZES; i++) {
        bool found = false;
        for (int j = 0; j < s.n; j++)
            if (!strcmp(s.key[j], key[i])) {
                found = true;
                assert_int_equal(s.loc[j].offset, loc[i].offset);
                assert_int_equal(s.loc[j].size, sizes[i]);
            }
        assert_true(found == (i != 2));
        if (i != 2)
            read_is(d, &loc[i], key[i], b[i], sizes[i]);
    }
    /* the removed object's location is no object's */
    size_t len;
    unsigned char one[4096];
    assert_int_equal(moonlet_disk_read(d, &loc[2], NULL, one, sizeof one, &len),
                     MOONLET_ERR_INVALID_PARAMS);
    moonlet_disk_close(d);
    for (size_t i = 0; i < NSIZES; i++)
        free(b[i]);
}

/* A byte flipped in an object's bytes on disk: the read refuses it
 * (INVALID_READ, counted), the rescan drops it and frees its space; the
 * other object is untouched. */
static void test_corrupt_byte(void **state)
{
    (void)state;
    fresh();
    moonlet_disk *d = open_tier(1, 8u << 20, 0, 0);
    unsigned char *a = pattern(100000, 7), *b = pattern(3000, 8);
    moonlet_disk_loc la, lb;
    assert_int_equal(put(d, "a", a, 100000, &la), MOONLET_OK);
    assert_int_equal(put(d, "b", b, 3000, &lb), MOONLET_OK);
    int fd = open(g_path[0], O_RDWR);
    unsigned char x;
    off_t at = (off_t)(la.offset + 4096 + 5000);
    assert_int_equal(pread(fd, &x, 1, at), 1);
    x ^= 0x40;
    assert_int_equal(pwrite(fd, &x, 1, at), 1);
    close(fd);
    unsigned char *got = malloc(100000);
    size_t len = 7;
    assert_int_equal(moonlet_disk_read(d, &la, "a", got, 100000, &len), MOONLET_ERR_INVALID_READ);
    assert_int_equal(len, 0);
    read_is(d, &lb, "b", b, 3000);
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.checksum_errors, 1);
    moonlet_disk_close(d);
    d = open_tier(1, 8u << 20, 0, 0);
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.scan_kept, 1);
    assert_int_equal(st.scan_dropped, 1);
    assert_int_equal(st.objects, 1);
    read_is(d, &lb, "b", b, 3000);
    assert_int_equal(moonlet_disk_read(d, &la, "a", got, 100000, &len), MOONLET_ERR_INVALID_PARAMS);
    moonlet_disk_close(d);
    free(got);
    free(a);
    free(b);
}

/* The file cut short at restart (a lost tail): the tier grows it back, and
 * the object whose bytes were in the lost part is dropped. */
static void test_truncated_file(void **state)
{
    (void)state;
    fresh();
    moonlet_disk *d = open_tier(1, 8u << 20, 0, 0);
    unsigned char *a = pattern(50000, 3), *b = pattern(2u << 20, 4);
    moonlet_disk_loc la, lb;
    assert_int_equal(put(d, "first", a, 50000, &la), MOONLET_OK);
    assert_int_equal(put(d, "second", b, 2u << 20, &lb), MOONLET_OK);
    moonlet_disk_close(d);
    assert_int_equal(truncate(g_path[0], (off_t)(lb.offset + 4096 + (1u << 20))), 0);
    d = open_tier(1, 8u << 20, 0, 0);
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.scan_kept, 1);
    assert_int_equal(st.scan_dropped, 1);
    read_is(d, &la, "first", a, 50000);
    struct stat sb;
    assert_int_equal(stat(g_path[0], &sb), 0);
    assert_int_equal(sb.st_size, 8u << 20);
    moonlet_disk_close(d);
    free(a);
    free(b);
}

/* A full tier refuses (NO_AVAILABLE_HANDLE); a remove makes room. */
static void test_full(void **state)
{
    (void)state;
    fresh();
    moonlet_disk *d = open_tier(1, 2u << 20, 0, 0);
    unsigned char *b = pattern(600000, 9);
    moonlet_disk_loc loc[4];
    int n = 0;
    for (; n < 4; n++) {
        char key[16];
        snprintf(key, sizeof key, "f%d", n);
        int rc = put(d, key, b, 600000, &loc[n]);
        if (rc) {
            assert_int_equal(rc, MOONLET_ERR_NO_AVAILABLE_HANDLE);
            break;
        }
    }
    assert_int_equal(n, 3); /* 3 x (4 KiB + 600,000 B rounded) fit 2 MiB, a fourth does not */
    assert_int_equal(moonlet_disk_remove(d, &loc[1]), MOONLET_OK);
    assert_int_equal(put(d, "f3", b, 600000, &loc[3]), MOONLET_OK);
    read_is(d, &loc[3], "f3", b, 600000);
    moonlet_disk_close(d);
    free(b);
}

/* Two paths share the size and the objects. */
static void test_two_paths(void **state)
{
    (void)state;
    fresh();
    moonlet_disk *d = open_tier(2, 8u << 20, 0, 0);
    unsigned char *b = pattern(10000, 5);
    moonlet_disk_loc loc[4];
    int on[2] = {0, 0};
    for (int i = 0; i < 4; i++) {
        char key[16];
        snprintf(key, sizeof key, "p%d", i);
        assert_int_equal(put(d, key, b, 10000, &loc[i]), MOONLET_OK);
        on[loc[i].path]++;
    }
    assert_int_equal(on[0], 2);
    assert_int_equal(on[1], 2);
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.capacity, 8u << 20);
    moonlet_disk_close(d);
    d = open_tier(2, 8u << 20, 0, 0);
    for (int i = 0; i < 4; i++) {
        char key[16];
        snprintf(key, sizeof key, "p%d", i);
        read_is(d, &loc[i], key, b, 10000);
    }
    moonlet_disk_close(d);
    free(b);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    fresh();
    const char *paths[] = {g_path[0]};
    moonlet_disk *d = NULL;
    moonlet_disk_opts o = {.paths = paths, .npaths = 1, .size = 512u << 10};
    assert_int_equal(moonlet_disk_open(&o, &d), MOONLET_ERR_INVALID_PARAMS); /* under a MiB */
    const char *dir[] = {g_dir};
    o = (moonlet_disk_opts){.paths = dir, .npaths = 1, .size = 4u << 20};
    assert_int_not_equal(moonlet_disk_open(&o, &d), MOONLET_OK); /* a directory */
    assert_null(d);
    o = (moonlet_disk_opts){.paths = paths, .npaths = 0, .size = 4u << 20};
    assert_int_equal(moonlet_disk_open(&o, &d), MOONLET_ERR_INVALID_PARAMS);
    d = open_tier(1, 4u << 20, 0, 0);
    unsigned char b[100] = {1, 2, 3};
    struct iovec iov = {b, sizeof b};
    moonlet_disk_loc loc;
    assert_int_equal(moonlet_disk_write(d, "", &iov, 1, XXH3_64bits(b, sizeof b), &loc),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_disk_write(d, "k", &iov, 1, 12345, &loc), MOONLET_ERR_INVALID_PARAMS);
    /* the same over several I/Os: refused, its space given back */
    unsigned char *big = pattern(2u << 20, 6);
    struct iovec biov = {big, 2u << 20};
    assert_int_equal(moonlet_disk_write(d, "big", &biov, 1, 12345, &loc),
                     MOONLET_ERR_INVALID_PARAMS);
    free(big);
    moonlet_disk_stats bst;
    moonlet_disk_get_stats(d, &bst);
    assert_int_equal(bst.used, 0);
    assert_int_equal(bst.objects, 0);
    char *huge = malloc(MOONLET_DISK_MAX_KEY + 2);
    memset(huge, 'k', MOONLET_DISK_MAX_KEY + 1);
    huge[MOONLET_DISK_MAX_KEY + 1] = 0;
    assert_int_equal(moonlet_disk_write(d, huge, &iov, 1, XXH3_64bits(b, sizeof b), &loc),
                     MOONLET_ERR_INVALID_PARAMS);
    /* the longest key takes a two-block header */
    huge[MOONLET_DISK_MAX_KEY] = 0;
    assert_int_equal(moonlet_disk_write(d, huge, &iov, 1, XXH3_64bits(b, sizeof b), &loc),
                     MOONLET_OK);
    read_is(d, &loc, huge, b, sizeof b);
    unsigned char small[10];
    size_t len;
    assert_int_equal(moonlet_disk_read(d, &loc, NULL, small, sizeof small, &len),
                     MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(moonlet_disk_read(d, &loc, "other", b, sizeof b, &len),
                     MOONLET_ERR_INVALID_PARAMS);
    moonlet_disk_loc wrong = loc;
    wrong.offset += 4096;
    assert_int_equal(moonlet_disk_read(d, &wrong, NULL, b, sizeof b, &len),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_disk_remove(d, &wrong), MOONLET_ERR_INVALID_PARAMS);
    wrong = loc;
    wrong.path = 7;
    assert_int_equal(moonlet_disk_remove(d, &wrong), MOONLET_ERR_INVALID_PARAMS);
    moonlet_disk_close(d);
    free(huge);
}

/* Threads writing, reading back and removing their own keys at once. */
struct worker {
    moonlet_disk *d;
    int id, ok;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    for (int i = 0; i < 20; i++) {
        char key[32];
        snprintf(key, sizeof key, "t%d-%d", w->id, i);
        size_t n = 1000 + (size_t)(w->id * 7919 + i * 104729) % 300000;
        unsigned char *b = pattern(n, (uint32_t)(w->id * 100 + i));
        moonlet_disk_loc loc;
        unsigned char *got = malloc(n);
        size_t len = 0;
        if (put(w->d, key, b, n, &loc) == MOONLET_OK &&
            moonlet_disk_read(w->d, &loc, key, got, n, &len) == MOONLET_OK && len == n &&
            memcmp(got, b, n) == 0 && moonlet_disk_remove(w->d, &loc) == MOONLET_OK)
            w->ok++;
        free(got);
        free(b);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    fresh();
    moonlet_disk *d = open_tier(2, 16u << 20, 8, 128u << 10);
    struct worker w[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){.d = d, .id = i};
        assert_int_equal(pthread_create(&t[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].ok, 20);
    }
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.objects, 0);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.io_errors, 0);
    moonlet_disk_close(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_rescan),
        cmocka_unit_test(test_corrupt_byte),
        cmocka_unit_test(test_truncated_file),
        cmocka_unit_test(test_full),
        cmocka_unit_test(test_two_paths),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests_name("disk_tier", tests, setup, teardown);
}
