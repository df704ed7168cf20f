/*
 * disk_layout.h - the extent an object takes in a store node's disk tier
 * (store/node/disk_tier.c): a header block, then the bytes in whole blocks.
 * Shared by the tier and the master, which places disk replicas without
 * linking the tier.
 */
#ifndef MOONLET_DISK_LAYOUT_H
#define MOONLET_DISK_LAYOUT_H

#include <stdint.h>

#define MOONLET_DISK_BLOCK 4096u
#define MOONLET_DISK_HDR_STRUCT_BYTES 56u /* disk_tier.c's struct disk_hdr */

/* The header's bytes for a key of key_len bytes: the header and the key,
 * rounded up to whole blocks. */
static inline uint64_t moonlet_disk_header_bytes(uint32_t key_len)
{
    return ((uint64_t)MOONLET_DISK_HDR_STRUCT_BYTES + key_len + MOONLET_DISK_BLOCK - 1) &
           ~(uint64_t)(MOONLET_DISK_BLOCK - 1);
}

/* The key a disk header carries: the tenant's name, a NUL, the key (a
 * node's disk is shared by every tenant). */
static inline uint32_t moonlet_disk_key_bytes(uint32_t tenant_len, uint32_t key_len)
{
    return tenant_len + 1u + key_len;
}

/* The whole extent of an object: its header and its bytes in whole blocks. */
static inline uint64_t moonlet_disk_footprint(uint32_t key_len, uint64_t size)
{
    return moonlet_disk_header_bytes(key_len) +
           ((size + MOONLET_DISK_BLOCK - 1) & ~(uint64_t)(MOONLET_DISK_BLOCK - 1));
}

#endif
