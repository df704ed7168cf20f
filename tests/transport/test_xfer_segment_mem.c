/*
 * test_xfer_segment_mem.c - segment memory (transport/segment_mem.h):
 * allocation, alignment, zeroing, the NUMA placement rule with and without
 * NUMA support, the NIC node lookup in sysfs (against a fake sysfs tree),
 * huge-page fallback, mlock, and free.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "moonlet/error.h"
#include "segment_mem.h"

static void test_alloc_align_free(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {1, 4095, 4096, 4097, 3u << 20};
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        moonlet_segment_mem_opts o = {.size = sizes[i], .numa_node = MOONLET_SEGMENT_MEM_NODE_AUTO,
                                      .prefault = true};
        moonlet_segment_mem m;
        assert_int_equal(moonlet_segment_mem_alloc(&o, &m), 0);
        assert_non_null(m.base);
        assert_int_equal((uintptr_t)m.base % page, 0);
        assert_int_equal(m.size, sizes[i]);
        assert_true(m.mapped >= sizes[i]);
        assert_int_equal(m.mapped % page, 0);
        assert_true(m.mapped - sizes[i] < page);
        const uint8_t *p = m.base;
        for (uint64_t k = 0; k < m.mapped; k += 997)
            assert_int_equal(p[k], 0);
        memset(m.base, 0x5a, m.mapped); /* all of it is writable */
        moonlet_segment_mem_free(&m);
        assert_null(m.base);
        moonlet_segment_mem_free(&m); /* twice is harmless */
    }
    moonlet_segment_mem_opts zero = {.size = 0};
    moonlet_segment_mem m;
    assert_int_equal(moonlet_segment_mem_alloc(&zero, &m), MOONLET_ERR_INVALID_PARAMS);
}

static void test_pick_node_rule(void **state)
{
    (void)state;
    int node = 99;
    /* no NUMA support */
    assert_int_equal(moonlet_segment_mem_pick_node(-1, -1, 0, 3, &node), 0);
    assert_int_equal(node, -1);
    assert_int_equal(moonlet_segment_mem_pick_node(0, -1, 0, -1, &node), 0);
    assert_int_equal(node, -1);
    assert_int_equal(moonlet_segment_mem_pick_node(1, -1, 0, -1, &node),
                     MOONLET_ERR_INVALID_PARAMS);
    /* NUMA with nodes 0..1 */
    assert_int_equal(moonlet_segment_mem_pick_node(-1, 0, 1, 1, &node), 0);
    assert_int_equal(node, 1); /* follows the NIC */
    assert_int_equal(moonlet_segment_mem_pick_node(-1, 0, 1, -1, &node), 0);
    assert_int_equal(node, -1); /* NIC node unknown: local */
    assert_int_equal(moonlet_segment_mem_pick_node(-1, 0, 1, 5, &node), 0);
    assert_int_equal(node, -1); /* NIC claims a node that does not exist */
    assert_int_equal(moonlet_segment_mem_pick_node(0, 0, 1, 1, &node), 0);
    assert_int_equal(node, 0); /* explicit beats the NIC */
    assert_int_equal(moonlet_segment_mem_pick_node(2, 0, 1, 1, &node),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_segment_mem_pick_node(-2, 0, 1, 1, &node),
                     MOONLET_ERR_INVALID_PARAMS);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_nic_node_from_sysfs(void **state)
{
    (void)state;
    char root[] = "/tmp/moonlet-sysfs-XXXXXX";
    assert_non_null(mkdtemp(root));
    char path[512];
    snprintf(path, sizeof(path), "%s/class", root);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/class/infiniband", root);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/class/infiniband/mlx5_1", root);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/class/infiniband/mlx5_1/device", root);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/class/infiniband/mlx5_1/device/numa_node", root);
    write_file(path, "1\n");
    assert_int_equal(moonlet_segment_mem_nic_node(root, "mlx5_1"), 1);
    assert_int_equal(moonlet_segment_mem_nic_node(root, "mlx5_0"), -1);
    assert_int_equal(moonlet_segment_mem_nic_node(root, "../mlx5_1"), -1);
    assert_int_equal(moonlet_segment_mem_nic_node(root, NULL), -1);
    write_file(path, "-1\n"); /* what the kernel says on a single-node box */
    assert_int_equal(moonlet_segment_mem_nic_node(root, "mlx5_1"), -1);
    write_file(path, "garbage");
    assert_int_equal(moonlet_segment_mem_nic_node(root, "mlx5_1"), -1);
    unlink(path);
    for (int i = 0; i < 4; i++) {
        char *slash = strrchr(path, '/');
        *slash = '\0';
        assert_int_equal(rmdir(path), 0);
    }
    assert_int_equal(rmdir(root), 0);
}

static void test_node_zero_and_bad_node(void **state)
{
    (void)state;
    moonlet_segment_mem_opts o = {.size = 1u << 20, .numa_node = 0, .prefault = true};
    moonlet_segment_mem m;
    assert_int_equal(moonlet_segment_mem_alloc(&o, &m), 0);
    if (numa_available() >= 0) {
        assert_int_equal(m.node, 0);
        int policy = -1;
        struct bitmask *mask = numa_allocate_nodemask();
        assert_int_equal(get_mempolicy(&policy, mask->maskp, mask->size + 1, m.base,
                                       MPOL_F_ADDR),
                         0);
        assert_int_equal(policy, MPOL_BIND);
        assert_true(numa_bitmask_isbitset(mask, 0));
        numa_free_nodemask(mask);
    } else {
        assert_int_equal(m.node, -1);
    }
    moonlet_segment_mem_free(&m);
    int too_far = numa_available() >= 0 ? numa_max_node() + 1 : 1;
    o.numa_node = too_far;
    assert_int_equal(moonlet_segment_mem_alloc(&o, &m), MOONLET_ERR_INVALID_PARAMS);
    assert_null(m.base);
}

static void test_huge_pages_and_lock(void **state)
{
    (void)state;
    moonlet_segment_mem_opts o = {.size = 3u << 20, .numa_node = MOONLET_SEGMENT_MEM_NODE_AUTO,
                                  .huge_pages = true, .lock = true};
    moonlet_segment_mem m;
    assert_int_equal(moonlet_segment_mem_alloc(&o, &m), 0);
    if (m.huge) { /* huge pages configured: 2 MiB granularity */
        assert_int_equal(m.mapped % MOONLET_SEGMENT_MEM_HUGE_PAGE, 0);
        assert_int_equal((uintptr_t)m.base % MOONLET_SEGMENT_MEM_HUGE_PAGE, 0);
    } else { /* fell back to normal pages */
        assert_int_equal(m.mapped, 3u << 20);
    }
    memset(m.base, 1, m.size);
    /* locked or not, allocation succeeded; a lock failure is only a warning */
    print_message("huge=%d locked=%d node=%d\n", m.huge, m.locked, m.node);
    moonlet_segment_mem_free(&m);
}

int main(void)
{
    moonlet_log_set_level(MOONLET_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_align_free),
        cmocka_unit_test(test_pick_node_rule),
        cmocka_unit_test(test_nic_node_from_sysfs),
        cmocka_unit_test(test_node_zero_and_bad_node),
        cmocka_unit_test(test_huge_pages_and_lock),
    };
    return cmocka_run_group_tests_name("segment_mem", tests, NULL, NULL);
}
