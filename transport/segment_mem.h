/*
 * segment_mem.h - allocation of the memory a store node contributes as a
 * segment: page aligned, on the right NUMA node, optionally on huge pages,
 * locked when permitted.
 *
 * The node follows the NIC by default: the memory a NIC reads and writes
 * should sit on the socket the NIC hangs off (its node is read from
 * /sys/class/infiniband/<device>/device/numa_node).  Without a known NIC node
 * the memory is left to the kernel's local (first-touch) policy.  Huge pages
 * (MAP_HUGETLB, 2 MiB) fall back to normal pages with a log line; mlock
 * failure is a warning, never fatal.  Takes no locks; not thread safe on one
 * moonlet_segment_mem (different ones are independent).
 */
#ifndef MOONLET_SEGMENT_MEM_H
#define MOONLET_SEGMENT_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOONLET_SEGMENT_MEM_NODE_AUTO (-1)
#define MOONLET_SEGMENT_MEM_HUGE_PAGE (2u << 20)

typedef struct moonlet_segment_mem_opts {
    uint64_t size;      /* bytes wanted (> 0); rounded up to the page size */
    int numa_node;      /* MOONLET_SEGMENT_MEM_NODE_AUTO, or a node >= 0 */
    const char *device; /* RDMA device whose node AUTO follows; NULL = none */
    bool huge_pages;    /* try MAP_HUGETLB first */
    bool lock;          /* mlock the memory (populates it) */
    bool prefault;      /* populate every page now (when not locked) */
} moonlet_segment_mem_opts;

typedef struct moonlet_segment_mem {
    void *base;     /* page aligned (huge-page aligned when huge) */
    uint64_t size;  /* as asked */
    size_t mapped;  /* bytes mapped (size rounded up) */
    int node;       /* node the memory is bound to; -1 = kernel's local policy */
    bool huge;      /* backed by MAP_HUGETLB pages */
    bool locked;    /* mlock succeeded */
} moonlet_segment_mem;

/*
 * Allocates zeroed memory.  Returns 0 and fills *m, or INVALID_PARAMS (size 0,
 * a node that does not exist, node > 0 without NUMA support) or
 * INTERNAL_ERROR (mmap, or binding to an explicitly requested node, failed).
 */
int moonlet_segment_mem_alloc(const moonlet_segment_mem_opts *opts, moonlet_segment_mem *m);

/* Unmaps; *m is zeroed.  A zeroed or already freed *m is a no-op. */
void moonlet_segment_mem_free(moonlet_segment_mem *m);

/* The NUMA node of an RDMA device from <sysfs_root>/class/infiniband/<device>/
 * device/numa_node (sysfs_root NULL = "/sys"); -1 when unknown. */
int moonlet_segment_mem_nic_node(const char *sysfs_root, const char *device);

/*
 * The placement rule, pure: with NUMA support (numa_avail >= 0) an explicit
 * node must be <= max_node; AUTO gives nic_node when it is a valid node, else
 * -1 (local).  Without NUMA support, AUTO and node 0 give -1 and any other
 * node is INVALID_PARAMS.  Returns 0 and sets *node.
 */
int moonlet_segment_mem_pick_node(int requested, int numa_avail, int max_node, int nic_node,
                                  int *node);

#endif
