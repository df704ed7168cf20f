/*
 * segment_mem.c - NUMA-aware, page-aligned segment memory (segment_mem.h).
 *
 * Built on anonymous mmap rather than malloc so the memory is page aligned,
 * can use MAP_HUGETLB, can be bound with mbind() before any page is touched
 * (so first touch cannot place it on the wrong node) and goes back to the
 * kernel at once on free.  libnuma answers whether NUMA exists and how many
 * nodes there are; numa_available() < 0 is handled as "one node, no binding".
 * Takes no locks.
 */
#include "segment_mem.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "moonlet/error.h"

#define MOD "segment-mem"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int moonlet_segment_mem_pick_node(int requested, int numa_avail, int max_node, int nic_node,
                                  int *node)
{
    if (requested < MOONLET_SEGMENT_MEM_NODE_AUTO)
        return MOONLET_ERR_INVALID_PARAMS;
    if (numa_avail < 0) {
        if (requested > 0)
            return MOONLET_ERR_INVALID_PARAMS;
        *node = -1;
        return MOONLET_OK;
    }
    if (requested >= 0) {
        if (requested > max_node)
            return MOONLET_ERR_INVALID_PARAMS;
        *node = requested;
        return MOONLET_OK;
    }
    *node = nic_node >= 0 && nic_node <= max_node ? nic_node : -1;
    return MOONLET_OK;
}

int moonlet_segment_mem_nic_node(const char *sysfs_root, const char *device)
{
    if (!device || !*device || strchr(device, '/'))
        return -1;
    char path[512];
    snprintf(path, sizeof(path), "%s/class/infiniband/%s/device/numa_node",
             sysfs_root ? sysfs_root : "/sys", device);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int node = -1;
    if (fscanf(f, "%d", &node) != 1)
        node = -1;
    fclose(f);
    return node;
}

static size_t segment_mem_round(uint64_t size, size_t unit)
{
    return (size_t)((size + unit - 1) / unit * unit);
}

/* Maps the memory, huge pages first when asked. */
static int segment_mem_map(const moonlet_segment_mem_opts *o, moonlet_segment_mem *m)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (o->huge_pages) {
        m->mapped = segment_mem_round(o->size, MOONLET_SEGMENT_MEM_HUGE_PAGE);
        void *p = mmap(NULL, m->mapped, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        if (p != MAP_FAILED) {
            m->base = p;
            m->huge = true;
            return MOONLET_OK;
        }
        ML_WARN(MOD, "huge pages unavailable for %zu bytes (%s), using normal pages", m->mapped,
                strerror(errno));
    }
    m->mapped = segment_mem_round(o->size, page);
    void *p = mmap(NULL, m->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        ML_ERR(MOD, "mmap of %zu bytes: %s", m->mapped, strerror(errno));
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    m->base = p;
    madvise(p, m->mapped, MADV_HUGEPAGE); /* transparent huge pages where enabled */
    return MOONLET_OK;
}

/* Binds the range to one node before it is touched. */
static int segment_mem_bind(moonlet_segment_mem *m, int node)
{
    struct bitmask *mask = numa_allocate_nodemask();
    if (!mask)
        return -1;
    numa_bitmask_setbit(mask, (unsigned)node);
    long rc = mbind(m->base, m->mapped, MPOL_BIND, mask->maskp, mask->size + 1, 0);
    numa_free_nodemask(mask);
    return rc ? -1 : 0;
}

static void segment_mem_populate(moonlet_segment_mem *m)
{
    if (madvise(m->base, m->mapped, MADV_POPULATE_WRITE) == 0)
        return;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    volatile unsigned char *p = m->base;
    for (size_t off = 0; off < m->mapped; off += page)
        p[off] = 0;
}

static int segment_mem_place(const moonlet_segment_mem_opts *o, moonlet_segment_mem *m, int node)
{
    m->node = -1;
    if (node < 0)
        return MOONLET_OK;
    if (segment_mem_bind(m, node) == 0) {
        m->node = node;
        return MOONLET_OK;
    }
    if (o->numa_node >= 0) {
        ML_ERR(MOD, "cannot bind %zu bytes to NUMA node %d: %s", m->mapped, node, strerror(errno));
        return MOONLET_ERR_INTERNAL_ERROR;
    }
    ML_WARN(MOD, "cannot bind to the NIC's NUMA node %d (%s), using the local node", node,
            strerror(errno));
    return MOONLET_OK;
}

int moonlet_segment_mem_alloc(const moonlet_segment_mem_opts *o, moonlet_segment_mem *m)
{
    if (!o || !m || o->size == 0 || o->size > SIZE_MAX - MOONLET_SEGMENT_MEM_HUGE_PAGE)
        return MOONLET_ERR_INVALID_PARAMS;
    memset(m, 0, sizeof(*m));
    int avail = numa_available();
    int nic = o->numa_node == MOONLET_SEGMENT_MEM_NODE_AUTO
                  ? moonlet_segment_mem_nic_node(NULL, o->device) : -1;
    int node;
    int rc = moonlet_segment_mem_pick_node(o->numa_node, avail, avail < 0 ? 0 : numa_max_node(),
                                           nic, &node);
    if (rc) {
        ML_ERR(MOD, "NUMA node %d does not exist%s", o->numa_node,
               avail < 0 ? " (no NUMA support)" : "");
        return rc;
    }
    rc = segment_mem_map(o, m);
    if (rc == MOONLET_OK)
        rc = segment_mem_place(o, m, node);
    if (rc) {
        moonlet_segment_mem_free(m);
        return rc;
    }
    m->size = o->size;
    if (o->lock) {
        m->locked = mlock(m->base, m->mapped) == 0;
        if (!m->locked)
            ML_WARN(MOD, "mlock of %zu bytes failed (%s); segment memory may be swapped",
                    m->mapped, strerror(errno));
    }
    if (o->prefault && !m->locked)
        segment_mem_populate(m);
    return MOONLET_OK;
}

void moonlet_segment_mem_free(moonlet_segment_mem *m)
{
    if (!m || !m->base)
        return;
    munmap(m->base, m->mapped); /* also drops the lock */
    memset(m, 0, sizeof(*m));
}
