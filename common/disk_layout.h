/*
 * disk_layout.h - the disk tier's on-disk extent sizes, for those that
 * place objects on a disk path without linking the tier (the master sizes
 * and places disk replicas with these; store/node/disk_tier.c writes
 * exactly these extents).
 *
 * An object on a disk path is one extent, 4 KiB aligned: its header blocks
 * (the tier's fixed header, MOONLET_DISK_HEADER_FIXED bytes, then the key,
 * zero padded to whole blocks), then its bytes, zero padded to whole
 * blocks.  moonlet_disk_footprint is the extent's length; its offset is
 * where the header goes.
 *
 * Header only (static inline), no dependencies; owns nothing, no locks.
 */
#ifndef MOONLET_DISK_LAYOUT_H
#define MOONLET_DISK_LAYOUT_H

#include <stdint.h>

#define MOONLET_DISK_BLOCK 4096u
/* sizeof the tier's header struct (disk_tier.c asserts it): magic, version,
 * key length, size, checksum, sequence, tenant, reserved, hash */
#define MOONLET_DISK_HEADER_FIXED 56u

static inline uint64_t moonlet_disk_round_block(uint64_t n)
{
    return (n + MOONLET_DISK_BLOCK - 1) / MOONLET_DISK_BLOCK * MOONLET_DISK_BLOCK;
}

/* The header block(s) of an object whose key is key_len bytes. */
static inline uint64_t moonlet_disk_header_bytes(uint32_t key_len)
{
    return moonlet_disk_round_block((uint64_t)MOONLET_DISK_HEADER_FIXED + key_len);
}

/* The key a node's disk header carries for a moonlet object: the tenant's
 * name, a NUL, the key (the master sizes a demotion's extent with it). */
static inline uint32_t moonlet_disk_key_bytes(uint32_t tenant_len, uint32_t key_len)
{
    return tenant_len + 1u + key_len;
}

/* The whole extent an object of `size` bytes under a key of key_len bytes
 * takes: its header blocks and its bytes rounded up to whole blocks. */
static inline uint64_t moonlet_disk_footprint(uint32_t key_len, uint64_t size)
{
    return moonlet_disk_header_bytes(key_len) + moonlet_disk_round_block(size);
}

#endif
