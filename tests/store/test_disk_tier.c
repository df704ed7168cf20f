/*
 * test_disk_tier.c - store/node/disk_tier.c on files in a fresh directory
 * under the working directory (a real file system: O_DIRECT): objects of
 * odd sizes written and read back through several waves of I/O, a rescan
 * after a reopen (removed objects stay removed), a corrupt byte and a
 * truncated file (the read refuses, the rescan drops, never other bytes),
 * a full tier, two paths, bad arguments, and threads at once; objects at
 * the caller's placement (moonlet_disk_write_at: read back, found by a
 * rescan with tenant and key; unaligned, out of range or overlapping ones
 * refused), a read under another tenant refused, a batch with bad requests
 * among good ones, readers beside a writer of batches, block-aligned
 * buffers (no staging copy); a batch large enough to sync early
 * (sync-behind) reads back and is found by a rescan.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "disk_tier.h"
#include "moonlet/error.h"

#define TENANT 7u

static char g_dir[64];
static char g_path[2][128];

/* A fresh directory whose file system takes O_DIRECT: the working
 * directory (the build tree), else /var/tmp (a clone on a tmpfs /tmp). */
static bool direct_io_dir(const char *tmpl)
{
    snprintf(g_dir, sizeof(g_dir), "%s", tmpl);
    if (!mkdtemp(g_dir))
        return false;
    char probe[96];
    snprintf(probe, sizeof(probe), "%s/probe", g_dir);
    int fd = open(probe, O_CREAT | O_RDWR | O_DIRECT, 0600);
    if (fd >= 0) {
        close(fd);
        unlink(probe);
        return true;
    }
    unlink(probe);
    rmdir(g_dir);
    return false;
}

static int setup(void **state)
{
    (void)state;
    if (!direct_io_dir("disk-tier-XXXXXX") && !direct_io_dir("/var/tmp/disk-tier-XXXXXX"))
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

/* The tier a test runs on, its cmocka state: fresh_tier() opens it on
 * fresh files, reopen() closes it and opens it again on the same files (as
 * a restart does), close_tier() closes it; the test's teardown_tier()
 * closes what is still open, also after a failure. */
struct tier {
    moonlet_disk *d;
    size_t npaths;
    uint64_t size;
    unsigned qd;
    size_t io;
};

static moonlet_disk *fresh_tier(void **state, size_t npaths, uint64_t size, unsigned qd,
                                size_t io)
{
    static struct tier t;
    fresh();
    t = (struct tier){.npaths = npaths, .size = size, .qd = qd, .io = io};
    t.d = open_tier(npaths, size, qd, io);
    *state = &t;
    return t.d;
}

static void close_tier(void **state)
{
    struct tier *t = *state;
    moonlet_disk_close(t->d);
    t->d = NULL;
}

static moonlet_disk *reopen(void **state)
{
    struct tier *t = *state;
    close_tier(state);
    t->d = open_tier(t->npaths, t->size, t->qd, t->io);
    return t->d;
}

static int teardown_tier(void **state)
{
    if (*state)
        close_tier(state);
    return 0;
}

/* moonlet_disk_write and moonlet_disk_read with the tests' tenant and a
 * terminated key (NULL: read unchecked). */
static int wr(moonlet_disk *d, const char *key, const struct iovec *iov, int iovcnt,
              uint64_t checksum, moonlet_disk_loc *loc)
{
    return moonlet_disk_write(d, TENANT, key, (uint32_t)strlen(key), iov, iovcnt, checksum, loc);
}

static int rd(moonlet_disk *d, const moonlet_disk_loc *loc, const char *key, void *buf,
              size_t cap, size_t *len)
{
    return moonlet_disk_read(d, loc, TENANT, key, key ? (uint32_t)strlen(key) : 0, buf, cap, len);
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
    return wr(d, key, iov, 2, XXH3_64bits(b, n), loc);
}

static void read_is(moonlet_disk *d, const moonlet_disk_loc *loc, const char *key,
                    const unsigned char *want, size_t n)
{
    unsigned char *got = malloc(n ? n : 1);
    size_t len = 1;
    assert_int_equal(rd(d, loc, key, got, n, &len), MOONLET_OK);
    assert_int_equal(len, n);
    assert_memory_equal(got, want, n);
    free(got);
}

static const size_t sizes[] = {0, 1, 4095, 4096, (1u << 20) + 3, 5u << 20};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

struct seen {
    int n;
    moonlet_disk_loc loc[16];
    uint32_t tenant[16];
    char key[16][32];
};

static void see(void *arg, uint32_t tenant, const char *key, uint32_t key_len,
                const moonlet_disk_loc *loc, uint64_t checksum)
{
    (void)checksum;
    struct seen *s = arg;
    if (s->n < 16) {
        s->loc[s->n] = *loc;
        s->tenant[s->n] = tenant;
        snprintf(s->key[s->n], sizeof(s->key[0]), "%.*s", (int)key_len, key);
    }
    s->n++;
}

/* Objects of odd sizes, several waves each (queue depth 4 of 64 KiB), read
 * back exact; after a reopen the rescan finds each where it was, and one
 * removed before stays removed. */
static void test_round_trip_and_rescan(void **state)
{
    moonlet_disk *d = fresh_tier(state, 1, 32u << 20, 4, 64u << 10);
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

    d = reopen(state);
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
    assert_int_equal(rd(d, &loc[2], NULL, one, sizeof one, &len),
                     MOONLET_ERR_INVALID_PARAMS);
    for (size_t i = 0; i < NSIZES; i++)
        free(b[i]);
}

/* A byte flipped in an object's bytes on disk: the read refuses it
 * (INVALID_READ, counted), the rescan drops it and frees its space; the
 * other object is untouched. */
static void test_corrupt_byte(void **state)
{
    moonlet_disk *d = fresh_tier(state, 1, 8u << 20, 0, 0);
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
    assert_int_equal(rd(d, &la, "a", got, 100000, &len), MOONLET_ERR_INVALID_READ);
    assert_int_equal(len, 0);
    read_is(d, &lb, "b", b, 3000);
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.checksum_errors, 1);
    d = reopen(state);
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.scan_kept, 1);
    assert_int_equal(st.scan_dropped, 1);
    assert_int_equal(st.objects, 1);
    read_is(d, &lb, "b", b, 3000);
    assert_int_equal(rd(d, &la, "a", got, 100000, &len), MOONLET_ERR_INVALID_PARAMS);
    free(got);
    free(a);
    free(b);
}

/* The file cut short at restart (a lost tail): the tier grows it back, and
 * the object whose bytes were in the lost part is dropped. */
static void test_truncated_file(void **state)
{
    moonlet_disk *d = fresh_tier(state, 1, 8u << 20, 0, 0);
    unsigned char *a = pattern(50000, 3), *b = pattern(2u << 20, 4);
    moonlet_disk_loc la, lb;
    assert_int_equal(put(d, "first", a, 50000, &la), MOONLET_OK);
    assert_int_equal(put(d, "second", b, 2u << 20, &lb), MOONLET_OK);
    close_tier(state);
    assert_int_equal(truncate(g_path[0], (off_t)(lb.offset + 4096 + (1u << 20))), 0);
    d = reopen(state);
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.scan_kept, 1);
    assert_int_equal(st.scan_dropped, 1);
    read_is(d, &la, "first", a, 50000);
    struct stat sb;
    assert_int_equal(stat(g_path[0], &sb), 0);
    assert_int_equal(sb.st_size, 8u << 20);
    free(a);
    free(b);
}

/* A loop device over a 16 MiB file (img names it), when this host lets
 * the test make one (root and /dev/loop-control): its path in dev, else
 * false (the test skips). */
static bool loop_up(char *img, size_t img_cap, char *dev, size_t dev_cap)
{
    char cmd[700];
    snprintf(img, img_cap, "%s/loop.img", g_dir);
    int fd = open(img, O_CREAT | O_RDWR | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 16u << 20), 0);
    close(fd);
    dev[0] = 0;
    snprintf(cmd, sizeof(cmd), "losetup -f --show '%s' 2>/dev/null", img);
    FILE *p = geteuid() == 0 ? popen(cmd, "r") : NULL;
    if (p) {
        if (!fgets(dev, (int)dev_cap, p))
            dev[0] = 0;
        pclose(p);
    }
    dev[strcspn(dev, "\n")] = 0;
    if (!dev[0])
        unlink(img);
    return dev[0] != 0;
}

static void loop_down(const char *img, const char *dev)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "losetup -d '%s'", dev);
    assert_int_equal(system(cmd), 0);
    unlink(img);
}

/* A block device as a path: the tier takes at most the device's size,
 * writes and reads it, and a reopen finds the objects again. */
static void test_block_device(void **state)
{
    (void)state;
    char img[600], dev[64];
    if (!loop_up(img, sizeof(img), dev, sizeof(dev)))
        skip();
    const char *paths[] = {dev};
    moonlet_disk_opts o = {.paths = paths, .npaths = 1, .size = 64u << 20};
    moonlet_disk *d = NULL;
    int rc = moonlet_disk_open(&o, &d);
    unsigned char *a = pattern(300000, 9);
    moonlet_disk_loc la;
    if (rc == MOONLET_OK) {
        assert_int_equal(moonlet_disk_path_capacity(d, 0), 16u << 20); /* the device's size */
        assert_int_equal(put(d, "dev", a, 300000, &la), MOONLET_OK);
        read_is(d, &la, "dev", a, 300000);
        moonlet_disk_close(d);
        rc = moonlet_disk_open(&o, &d);
        if (rc == MOONLET_OK) {
            moonlet_disk_stats st;
            moonlet_disk_get_stats(d, &st);
            assert_int_equal(st.scan_kept, 1);
            read_is(d, &la, "dev", a, 300000);
            moonlet_disk_close(d);
        }
    }
    loop_down(img, dev);
    free(a);
    assert_int_equal(rc, MOONLET_OK);
}

/* A device that fails under the tier (the loop device shrunk to half
 * while the tier runs: I/O past its new end fails): a read there is an
 * error, never bytes; a write there fails and gives its space back; the
 * objects below still read exact; the errors are counted. */
static void test_device_errors(void **state)
{
    (void)state;
    char img[600], dev[64], cmd[700];
    if (!loop_up(img, sizeof(img), dev, sizeof(dev)))
        skip();
    const char *paths[] = {dev};
    moonlet_disk_opts o = {.paths = paths, .npaths = 1, .size = 16u << 20};
    moonlet_disk *d = NULL;
    assert_int_equal(moonlet_disk_open(&o, &d), MOONLET_OK);
    unsigned char *a = pattern(100000, 21), *b = pattern(100000, 22);
    moonlet_disk_loc la = {.path = 0, .offset = 0, .size = 100000};
    moonlet_disk_loc lb = {.path = 0, .offset = 12u << 20, .size = 100000};
    moonlet_disk_loc lc = {.path = 0, .offset = 13u << 20, .size = 100000};
    struct iovec ia = {a, 100000}, ib = {b, 100000};
    assert_int_equal(moonlet_disk_write_at(d, &la, TENANT, "a", 1, &ia, 1, XXH3_64bits(a, 100000)),
                     MOONLET_OK);
    assert_int_equal(moonlet_disk_write_at(d, &lb, TENANT, "b", 1, &ib, 1, XXH3_64bits(b, 100000)),
                     MOONLET_OK);
    assert_int_equal(truncate(img, 8u << 20), 0);
    snprintf(cmd, sizeof(cmd), "losetup -c '%s'", dev);
    assert_int_equal(system(cmd), 0);

    unsigned char *got = malloc(100000);
    size_t len = 1;
    int rc = rd(d, &lb, "b", got, 100000, &len);
    assert_true(rc == MOONLET_ERR_INTERNAL_ERROR || rc == MOONLET_ERR_INVALID_READ);
    assert_int_equal(len, 0);
    moonlet_disk_stats st0, st1;
    moonlet_disk_get_stats(d, &st0);
    assert_int_equal(moonlet_disk_write_at(d, &lc, TENANT, "c", 1, &ib, 1,
                                           XXH3_64bits(b, 100000)),
                     MOONLET_ERR_INTERNAL_ERROR);
    moonlet_disk_get_stats(d, &st1);
    assert_int_equal(st1.used, st0.used); /* the failed write's space is back */
    assert_true(st1.io_errors > 0);
    read_is(d, &la, "a", a, 100000);
    moonlet_disk_close(d);
    loop_down(img, dev);
    free(got);
    free(a);
    free(b);
}

/* A full tier refuses (NO_AVAILABLE_HANDLE); a remove makes room. */
static void test_full(void **state)
{
    moonlet_disk *d = fresh_tier(state, 1, 2u << 20, 0, 0);
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
    free(b);
}

/* Two paths share the size and the objects. */
static void test_two_paths(void **state)
{
    moonlet_disk *d = fresh_tier(state, 2, 8u << 20, 0, 0);
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
    d = reopen(state);
    for (int i = 0; i < 4; i++) {
        char key[16];
        snprintf(key, sizeof key, "p%d", i);
        read_is(d, &loc[i], key, b, 10000);
    }
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
    assert_int_equal(wr(d, "", &iov, 1, XXH3_64bits(b, sizeof b), &loc),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(wr(d, "k", &iov, 1, 12345, &loc), MOONLET_ERR_INVALID_PARAMS);
    /* the same over several I/Os: refused, its space given back */
    unsigned char *big = pattern(2u << 20, 6);
    struct iovec biov = {big, 2u << 20};
    assert_int_equal(wr(d, "big", &biov, 1, 12345, &loc),
                     MOONLET_ERR_INVALID_PARAMS);
    free(big);
    moonlet_disk_stats bst;
    moonlet_disk_get_stats(d, &bst);
    assert_int_equal(bst.used, 0);
    assert_int_equal(bst.objects, 0);
    char *huge = malloc(MOONLET_DISK_MAX_KEY + 2);
    memset(huge, 'k', MOONLET_DISK_MAX_KEY + 1);
    huge[MOONLET_DISK_MAX_KEY + 1] = 0;
    assert_int_equal(wr(d, huge, &iov, 1, XXH3_64bits(b, sizeof b), &loc),
                     MOONLET_ERR_INVALID_PARAMS);
    /* the longest key takes a two-block header */
    huge[MOONLET_DISK_MAX_KEY] = 0;
    assert_int_equal(wr(d, huge, &iov, 1, XXH3_64bits(b, sizeof b), &loc),
                     MOONLET_OK);
    read_is(d, &loc, huge, b, sizeof b);
    unsigned char small[10];
    size_t len;
    assert_int_equal(rd(d, &loc, NULL, small, sizeof small, &len),
                     MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(rd(d, &loc, "other", b, sizeof b, &len),
                     MOONLET_ERR_INVALID_PARAMS);
    moonlet_disk_loc wrong = loc;
    wrong.offset += 4096;
    assert_int_equal(rd(d, &wrong, NULL, b, sizeof b, &len),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_disk_remove(d, &wrong), MOONLET_ERR_INVALID_PARAMS);
    wrong = loc;
    wrong.path = 7;
    assert_int_equal(moonlet_disk_remove(d, &wrong), MOONLET_ERR_INVALID_PARAMS);
    moonlet_disk_close(d);
    free(huge);
}

/* The caller places objects (as the master does: one segment per path, of
 * the path's capacity, offsets from 0): each lands exactly there, reads
 * back, and a rescan after a reopen finds it with its tenant and key.  An
 * object the tier places itself goes around them. */
static void test_write_at(void **state)
{
    moonlet_disk *d = fresh_tier(state, 1, 8u << 20, 4, 64u << 10);
    assert_int_equal(moonlet_disk_npaths(d), 1);
    assert_int_equal(moonlet_disk_path_capacity(d, 0), 8u << 20);
    assert_int_equal(moonlet_disk_path_capacity(d, 1), 0);
    size_t n1 = 100000, n2 = 3000;
    unsigned char *b1 = pattern(n1, 21), *b2 = pattern(n2, 22);
    uint64_t f1 = moonlet_disk_footprint(2, n1);
    assert_int_equal(f1, 4096 + 102400);
    moonlet_disk_loc l1 = {.path = 0, .offset = 1u << 20, .size = n1};
    moonlet_disk_loc l2 = {.path = 0, .offset = l1.offset + f1, .size = n2}; /* adjacent */
    struct iovec i1 = {b1, n1}, i2 = {b2, n2};
    assert_int_equal(moonlet_disk_write_at(d, &l1, 42, "k1", 2, &i1, 1, XXH3_64bits(b1, n1)),
                     MOONLET_OK);
    assert_int_equal(moonlet_disk_write_at(d, &l2, 43, "k2", 2, &i2, 1, XXH3_64bits(b2, n2)),
                     MOONLET_OK);
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.used, f1 + moonlet_disk_footprint(2, n2));
    unsigned char *got = malloc(n1);
    size_t len = 0;
    assert_int_equal(moonlet_disk_read(d, &l1, 42, "k1", 2, got, n1, &len), MOONLET_OK);
    assert_int_equal(len, n1);
    assert_memory_equal(got, b1, n1);
    /* the tier's own placement keeps clear of both */
    moonlet_disk_loc l3;
    unsigned char *b3 = pattern(2u << 20, 23);
    struct iovec i3 = {b3, 2u << 20};
    for (int k = 0; k < 2; k++) {
        char key[8];
        snprintf(key, sizeof key, "k%d", 3 + k);
        assert_int_equal(wr(d, key, &i3, 1, XXH3_64bits(b3, 2u << 20), &l3), MOONLET_OK);
        assert_true(l3.offset + moonlet_disk_footprint(2, 2u << 20) <= l1.offset ||
                    l3.offset >= l2.offset + moonlet_disk_footprint(2, n2));
    }

    d = reopen(state);
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.scan_kept, 4);
    struct seen s = {0};
    moonlet_disk_scan(d, see, &s);
    assert_int_equal(s.n, 4);
    int found = 0;
    for (int j = 0; j < s.n; j++) {
        if (!strcmp(s.key[j], "k1")) {
            found++;
            assert_int_equal(s.tenant[j], 42);
            assert_int_equal(s.loc[j].offset, l1.offset);
            assert_int_equal(s.loc[j].size, n1);
        } else if (!strcmp(s.key[j], "k2")) {
            found++;
            assert_int_equal(s.tenant[j], 43);
            assert_int_equal(s.loc[j].offset, l2.offset);
        } else {
            assert_int_equal(s.tenant[j], TENANT);
        }
    }
    assert_int_equal(found, 2);
    assert_int_equal(moonlet_disk_read(d, &l2, 43, "k2", 2, got, n1, &len), MOONLET_OK);
    assert_int_equal(len, n2);
    assert_memory_equal(got, b2, n2);
    free(got);
    free(b1);
    free(b2);
    free(b3);
}

/* A placement that is unaligned, out of range, overlapping an object held
 * (or one just written), or whose size is not the bytes': refused,
 * nothing reserved; the exact range once freed is taken again. */
static void test_write_at_refused(void **state)
{
    moonlet_disk *d = fresh_tier(state, 2, 8u << 20, 0, 0);
    uint64_t cap = moonlet_disk_path_capacity(d, 1);
    assert_int_equal(cap, 4u << 20);
    unsigned char *b = pattern(100000, 31);
    struct iovec iov = {b, 100000};
    uint64_t sum = XXH3_64bits(b, 100000), f = moonlet_disk_footprint(1, 100000);
    moonlet_disk_loc held = {.path = 1, .offset = 1u << 20, .size = 100000};
    assert_int_equal(moonlet_disk_write_at(d, &held, 1, "h", 1, &iov, 1, sum), MOONLET_OK);
    moonlet_disk_stats before;
    moonlet_disk_get_stats(d, &before);
    const moonlet_disk_loc bad[] = {
        {.path = 1, .offset = (1u << 20) + 100, .size = 100000}, /* unaligned */
        {.path = 1, .offset = (1u << 20) + 4096, .size = 100000}, /* inside the held one */
        {.path = 1, .offset = (1u << 20) - 4096, .size = 100000}, /* runs into it */
        {.path = 1, .offset = (1u << 20) + f - 4096, .size = 100000}, /* its tail */
        {.path = 1, .offset = 1u << 20, .size = 100000},          /* exactly it */
        {.path = 1, .offset = cap - 4096, .size = 100000},        /* past the end */
        {.path = 1, .offset = cap, .size = 100000},
        {.path = 1, .offset = UINT64_MAX - 4095, .size = 100000}, /* wraps */
        {.path = 2, .offset = 0, .size = 100000},                 /* no such path */
        {.path = 0, .offset = 0, .size = 99999},                  /* not the bytes' size */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(moonlet_disk_write_at(d, &bad[i], 1, "x", 1, &iov, 1, sum),
                         MOONLET_ERR_INVALID_PARAMS);
    moonlet_disk_stats after;
    moonlet_disk_get_stats(d, &after);
    assert_int_equal(after.used, before.used);
    assert_int_equal(after.objects, before.objects);
    assert_int_equal(after.writes, before.writes);
    /* right after it, and the same path's other end: fine */
    moonlet_disk_loc ok = {.path = 1, .offset = (1u << 20) + f, .size = 100000};
    assert_int_equal(moonlet_disk_write_at(d, &ok, 1, "y", 1, &iov, 1, sum), MOONLET_OK);
    ok.offset = cap - f;
    assert_int_equal(moonlet_disk_write_at(d, &ok, 1, "z", 1, &iov, 1, sum), MOONLET_OK);
    assert_int_equal(moonlet_disk_remove(d, &held), MOONLET_OK);
    assert_int_equal(moonlet_disk_write_at(d, &held, 2, "h2", 2, &iov, 1, sum), MOONLET_OK);
    unsigned char *got = malloc(100000);
    size_t len;
    assert_int_equal(moonlet_disk_read(d, &held, 2, "h2", 2, got, 100000, &len), MOONLET_OK);
    assert_memory_equal(got, b, 100000);
    free(got);
    free(b);
}

/* A read names the tenant with the key: the same key under another tenant
 * is not this object. */
static void test_wrong_tenant(void **state)
{
    moonlet_disk *d = fresh_tier(state, 1, 4u << 20, 0, 0);
    unsigned char *b = pattern(5000, 41);
    moonlet_disk_loc loc;
    assert_int_equal(put(d, "shared", b, 5000, &loc), MOONLET_OK);
    unsigned char got[5000];
    size_t len = 9;
    assert_int_equal(moonlet_disk_read(d, &loc, TENANT + 1, "shared", 6, got, sizeof got, &len),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(len, 0);
    assert_int_equal(moonlet_disk_read(d, &loc, TENANT, "shared", 6, got, sizeof got, &len),
                     MOONLET_OK);
    assert_int_equal(moonlet_disk_read(d, &loc, TENANT, "share", 5, got, sizeof got, &len),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(rd(d, &loc, NULL, got, sizeof got, &len), MOONLET_OK); /* unchecked */
    assert_memory_equal(got, b, 5000);
    free(b);
}

/* A batch of placed and unplaced objects, small (one I/O) and large (many),
 * two of them with a checksum that does not match their bytes: those two
 * are refused alone and their space given back; the others are durable
 * (found after a reopen) and read back, one batch read for all. */
static void test_batch_one_bad(void **state)
{
    moonlet_disk *d = fresh_tier(state, 2, 32u << 20, 4, 64u << 10);
    enum { N = 6 };
    const size_t sz[N] = {3000, 300000, 1u << 20, 70000, 0, 5u << 20};
    const bool placed[N] = {true, true, false, true, false, false};
    const int badsum[] = {1, 3}; /* a large placed one, a small placed one */
    unsigned char *b[N];
    moonlet_disk_loc loc[N];
    moonlet_disk_wreq r[N];
    struct iovec iov[N];
    char key[N][16];
    uint64_t off = 0;
    for (int i = 0; i < N; i++) {
        b[i] = pattern(sz[i], 50 + (uint32_t)i);
        snprintf(key[i], sizeof key[i], "batch-%d", i);
        iov[i] = (struct iovec){b[i], sz[i]};
        loc[i] = (moonlet_disk_loc){.path = 1, .offset = off, .size = sz[i]};
        if (placed[i])
            off += moonlet_disk_footprint((uint32_t)strlen(key[i]), sz[i]);
        r[i] = (moonlet_disk_wreq){.loc = &loc[i], .placed = placed[i], .tenant = 9,
                                   .key = key[i], .key_len = (uint32_t)strlen(key[i]),
                                   .iov = &iov[i], .iovcnt = 1,
                                   .checksum = XXH3_64bits(b[i], sz[i])};
    }
    for (size_t k = 0; k < 2; k++)
        r[badsum[k]].checksum ^= 1;
    int res[N];
    assert_int_equal(moonlet_disk_write_batch(d, r, N, res), MOONLET_OK);
    uint64_t used = 0;
    for (int i = 0; i < N; i++) {
        bool bad = i == badsum[0] || i == badsum[1];
        assert_int_equal(res[i], bad ? MOONLET_ERR_INVALID_PARAMS : MOONLET_OK);
        if (!bad)
            used += moonlet_disk_footprint((uint32_t)strlen(key[i]), sz[i]);
    }
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.used, used);
    assert_int_equal(st.objects, N - 2);
    assert_int_equal(st.writes, N - 2);

    d = reopen(state);
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.scan_kept, N - 2);
    assert_int_equal(st.used, used);
    moonlet_disk_rreq rr[N];
    unsigned char *got[N];
    for (int i = 0; i < N; i++) {
        got[i] = malloc(sz[i] ? sz[i] : 1);
        rr[i] = (moonlet_disk_rreq){.loc = loc[i], .tenant = 9, .key = key[i],
                                    .key_len = (uint32_t)strlen(key[i]), .buf = got[i],
                                    .cap = sz[i]};
    }
    assert_int_equal(moonlet_disk_read_batch(d, rr, N, res), MOONLET_OK);
    for (int i = 0; i < N; i++) {
        bool bad = i == badsum[0] || i == badsum[1];
        assert_int_equal(res[i], bad ? MOONLET_ERR_INVALID_PARAMS : MOONLET_OK);
        if (!bad)
            assert_memory_equal(got[i], b[i], sz[i]);
    }
    /* the refused ones' exact places are free */
    for (size_t k = 0; k < 2; k++) {
        int i = badsum[k];
        assert_int_equal(moonlet_disk_write_at(d, &loc[i], 9, key[i], (uint32_t)strlen(key[i]),
                                               &iov[i], 1, XXH3_64bits(b[i], sz[i])),
                         MOONLET_OK);
    }
    for (int i = 0; i < N; i++) {
        free(b[i]);
        free(got[i]);
    }
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
            rd(w->d, &loc, key, got, n, &len) == MOONLET_OK && len == n &&
            memcmp(got, b, n) == 0 && moonlet_disk_remove(w->d, &loc) == MOONLET_OK)
            w->ok++;
        free(got);
        free(b);
    }
    return NULL;
}

static void test_threads(void **state)
{
    moonlet_disk *d = fresh_tier(state, 2, 16u << 20, 8, 128u << 10);
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
}

/* Block-aligned buffers of several I/Os go without a staging copy (whole
 * blocks from and into the caller's memory, the tail block staged): read
 * back exact into aligned and unaligned buffers, a checksum that does not
 * match refused before anything is written (space given back), a flipped
 * byte of the bytes or of a header refused on the way in. */
static void test_direct_aligned(void **state)
{
    moonlet_disk *d = fresh_tier(state, 1, 32u << 20, 4, 64u << 10);
    const size_t sz[] = {(3u << 20) + 123, 2u << 20};
    unsigned char *b[2], *got[2];
    moonlet_disk_loc loc[2];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(posix_memalign((void **)&b[i], 4096, sz[i]), 0);
        assert_int_equal(posix_memalign((void **)&got[i], 4096, sz[i]), 0);
        unsigned char *p = pattern(sz[i], 70 + (uint32_t)i);
        memcpy(b[i], p, sz[i]);
        free(p);
        struct iovec iov = {b[i], sz[i]};
        assert_int_equal(wr(d, "bad", &iov, 1, XXH3_64bits(b[i], sz[i]) ^ 1, &loc[i]),
                         MOONLET_ERR_INVALID_PARAMS);
        if (i == 0) { /* refused before any I/O: no header at the first extent */
            char magic[8] = {0};
            int fd = open(g_path[0], O_RDONLY);
            assert_int_equal(pread(fd, magic, sizeof magic, 0), (ssize_t)sizeof magic);
            close(fd);
            assert_memory_not_equal(magic, "MLTDISK1", sizeof magic);
        }
        char key[8];
        snprintf(key, sizeof key, "d%d", i);
        assert_int_equal(wr(d, key, &iov, 1, XXH3_64bits(b[i], sz[i]), &loc[i]), MOONLET_OK);
        size_t len = 0;
        assert_int_equal(rd(d, &loc[i], key, got[i], sz[i], &len), MOONLET_OK);
        assert_int_equal(len, sz[i]);
        assert_memory_equal(got[i], b[i], sz[i]);
        read_is(d, &loc[i], key, b[i], sz[i]); /* unaligned */
    }
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.used, moonlet_disk_footprint(2, sz[0]) + moonlet_disk_footprint(2, sz[1]));
    int fd = open(g_path[0], O_RDWR);
    unsigned char x;
    off_t at = (off_t)(loc[0].offset + 4096 + (2u << 20) + 17);
    assert_int_equal(pread(fd, &x, 1, at), 1);
    x ^= 1;
    assert_int_equal(pwrite(fd, &x, 1, at), 1);
    close(fd);
    size_t len = 5;
    assert_int_equal(rd(d, &loc[0], "d0", got[0], sz[0], &len), MOONLET_ERR_INVALID_READ);
    assert_int_equal(len, 0);
    /* a flipped byte of a header, read with the first bytes in one I/O */
    fd = open(g_path[0], O_RDWR);
    at = (off_t)(loc[1].offset + 20);
    assert_int_equal(pread(fd, &x, 1, at), 1);
    x ^= 1;
    assert_int_equal(pwrite(fd, &x, 1, at), 1);
    close(fd);
    len = 5;
    assert_int_equal(rd(d, &loc[1], "d1", got[1], sz[1], &len), MOONLET_ERR_INVALID_READ);
    assert_int_equal(len, 0);
    for (int i = 0; i < 2; i++) {
        free(b[i]);
        free(got[i]);
    }
}

/* Two threads reading a fixed set of objects (single reads and batch
 * reads) while a third writes batches of new objects, reads them back and
 * removes them: every read verifies, no I/O error, nothing left over. */
struct rw_shared {
    moonlet_disk *d;
    moonlet_disk_loc loc[4];
    unsigned char *b[4];
    size_t sz[4];
    atomic_int writing;
    int bad[3];
};

static void *rw_reader(void *arg)
{
    struct rw_shared *s = ((void **)arg)[0];
    int id = (int)(intptr_t)((void **)arg)[1];
    unsigned char *got[4];
    for (int i = 0; i < 4; i++)
        got[i] = malloc(s->sz[i]);
    for (int it = 0; it < 400 && (it < 10 || atomic_load(&s->writing)); it++) {
        if (it % 2) {
            moonlet_disk_rreq r[4];
            int res[4];
            for (int i = 0; i < 4; i++) {
                r[i] = (moonlet_disk_rreq){.loc = s->loc[i], .tenant = TENANT, .key = NULL,
                                           .buf = got[i], .cap = s->sz[i]};
            }
            if (moonlet_disk_read_batch(s->d, r, 4, res))
                s->bad[id]++;
            for (int i = 0; i < 4; i++)
                if (res[i] || memcmp(got[i], s->b[i], s->sz[i]))
                    s->bad[id]++;
        } else {
            int i = it / 2 % 4;
            char key[16];
            snprintf(key, sizeof key, "fixed-%d", i);
            size_t len = 0;
            if (rd(s->d, &s->loc[i], key, got[i], s->sz[i], &len) || len != s->sz[i] ||
                memcmp(got[i], s->b[i], s->sz[i]))
                s->bad[id]++;
        }
    }
    for (int i = 0; i < 4; i++)
        free(got[i]);
    return NULL;
}

static void *rw_writer(void *arg)
{
    struct rw_shared *s = arg;
    enum { B = 6 };
    for (int round = 0; round < 12; round++) {
        unsigned char *b[B], *got = NULL;
        moonlet_disk_loc loc[B];
        moonlet_disk_wreq r[B];
        struct iovec iov[B];
        char key[B][24];
        int res[B];
        size_t sz[B];
        for (int i = 0; i < B; i++) {
            sz[i] = 1 + (size_t)(round * 7919 + i * 104729) % (700u << 10);
            b[i] = pattern(sz[i], (uint32_t)(1000 + round * B + i));
            snprintf(key[i], sizeof key[i], "w%d-%d", round, i);
            iov[i] = (struct iovec){b[i], sz[i]};
            r[i] = (moonlet_disk_wreq){.loc = &loc[i], .tenant = TENANT, .key = key[i],
                                       .key_len = (uint32_t)strlen(key[i]), .iov = &iov[i],
                                       .iovcnt = 1, .checksum = XXH3_64bits(b[i], sz[i])};
        }
        if (moonlet_disk_write_batch(s->d, r, B, res))
            s->bad[2]++;
        for (int i = 0; i < B; i++) {
            size_t len = 0;
            got = realloc(got, sz[i]);
            if (res[i] || rd(s->d, &loc[i], key[i], got, sz[i], &len) || len != sz[i] ||
                memcmp(got, b[i], sz[i]) || moonlet_disk_remove(s->d, &loc[i]))
                s->bad[2]++;
            free(b[i]);
        }
        free(got);
    }
    atomic_store(&s->writing, 0);
    return NULL;
}

static void test_readers_and_batches(void **state)
{
    struct rw_shared s = {.d = fresh_tier(state, 2, 32u << 20, 8, 128u << 10)};
    atomic_init(&s.writing, 1);
    for (int i = 0; i < 4; i++) {
        char key[16];
        snprintf(key, sizeof key, "fixed-%d", i);
        s.sz[i] = (size_t)(i + 1) * 150001;
        s.b[i] = pattern(s.sz[i], 900 + (uint32_t)i);
        assert_int_equal(put(s.d, key, s.b[i], s.sz[i], &s.loc[i]), MOONLET_OK);
    }
    pthread_t t[3];
    void *args[2][2] = {{&s, (void *)(intptr_t)0}, {&s, (void *)(intptr_t)1}};
    assert_int_equal(pthread_create(&t[0], NULL, rw_reader, args[0]), 0);
    assert_int_equal(pthread_create(&t[1], NULL, rw_reader, args[1]), 0);
    assert_int_equal(pthread_create(&t[2], NULL, rw_writer, &s), 0);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++)
        assert_int_equal(s.bad[i], 0);
    moonlet_disk_stats st;
    moonlet_disk_get_stats(s.d, &st);
    assert_int_equal(st.objects, 4);
    assert_int_equal(st.io_errors, 0);
    assert_int_equal(st.checksum_errors, 0);
    assert_int_equal(st.writes, 4 + 12 * 6);
    for (int i = 0; i < 4; i++)
        free(s.b[i]);
}

/* A batch of more than DISK_SYNC_BEHIND (8 MiB) to a path syncs it early
 * (stats.syncs_behind) as well as at the end: its objects read back, and a
 * rescan after a reopen finds them; a small batch makes no early sync. */
static void test_sync_behind(void **state)
{
    moonlet_disk *d = fresh_tier(state, 1, 64u << 20, 4, 0);
    enum { N = 6 };
    const size_t size = (3u << 20) + 1000; /* several I/Os each, a part block */
    unsigned char *b[N];
    char key[N][16];
    moonlet_disk_loc loc[N];
    struct iovec iov[N];
    moonlet_disk_wreq w[N];
    int res[N];
    for (int i = 0; i < N; i++) {
        b[i] = pattern(size, 900 + (uint32_t)i);
        snprintf(key[i], sizeof key[i], "behind-%d", i);
        iov[i] = (struct iovec){b[i], size};
        w[i] = (moonlet_disk_wreq){.loc = &loc[i], .tenant = TENANT, .key = key[i],
                                   .key_len = (uint32_t)strlen(key[i]), .iov = &iov[i],
                                   .iovcnt = 1, .checksum = XXH3_64bits(b[i], size)};
    }
    assert_int_equal(moonlet_disk_write_batch(d, w, 1, res), MOONLET_OK); /* 3 MiB: none */
    assert_int_equal(res[0], MOONLET_OK);
    moonlet_disk_stats st;
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.syncs_behind, 0);
    assert_int_equal(moonlet_disk_write_batch(d, w + 1, N - 1, res + 1), MOONLET_OK);
    for (int i = 1; i < N; i++)
        assert_int_equal(res[i], MOONLET_OK);
    moonlet_disk_get_stats(d, &st);
    assert_true(st.syncs_behind >= 1);
    assert_int_equal(st.io_errors, 0);
    for (int i = 0; i < N; i++)
        read_is(d, &loc[i], key[i], b[i], size);
    d = reopen(state);
    moonlet_disk_get_stats(d, &st);
    assert_int_equal(st.scan_kept, N);
    assert_int_equal(st.scan_dropped, 0);
    for (int i = 0; i < N; i++) {
        read_is(d, &loc[i], key[i], b[i], size);
        free(b[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_round_trip_and_rescan, teardown_tier),
        cmocka_unit_test_teardown(test_corrupt_byte, teardown_tier),
        cmocka_unit_test_teardown(test_truncated_file, teardown_tier),
        cmocka_unit_test_teardown(test_full, teardown_tier),
        cmocka_unit_test(test_block_device),
        cmocka_unit_test(test_device_errors),
        cmocka_unit_test_teardown(test_two_paths, teardown_tier),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test_teardown(test_threads, teardown_tier),
        cmocka_unit_test_teardown(test_write_at, teardown_tier),
        cmocka_unit_test_teardown(test_write_at_refused, teardown_tier),
        cmocka_unit_test_teardown(test_wrong_tenant, teardown_tier),
        cmocka_unit_test_teardown(test_batch_one_bad, teardown_tier),
        cmocka_unit_test_teardown(test_readers_and_batches, teardown_tier),
        cmocka_unit_test_teardown(test_direct_aligned, teardown_tier),
        cmocka_unit_test_teardown(test_sync_behind, teardown_tier),
    };
    return cmocka_run_group_tests_name("disk_tier", tests, setup, teardown);
}
