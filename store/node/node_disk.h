/*
 * node_disk.h - a store node's disk tier in the cluster (the tier's storage
 * engine is disk_tier.h; this is what connects it to the master and to
 * readers).
 *
 * What it owns: the node's moonlet_disk (opened on its --disk paths), one
 * reader segment per path on a TCP transport instance (the node's own TCP
 * one, or one of its own on the listen host when the node serves RDMA
 * only), and each path's mount on the master as a disk segment.  It runs,
 * for the store node's threads:
 *   - mount: each path mounted as a disk segment (a fresh reader segment id
 *     each time), then announced: every object the tier holds on it
 *     (DiskAnnounce); an object the master refuses (its key was put again,
 *     its extent taken) is removed from the disk;
 *   - demotions (repair jobs with demote set, from the node's repair
 *     thread): the object's bytes, read from a DRAM replica (this node's
 *     segment in place, else over the transport), are written to the
 *     target path at the target extent, checked against the checksum the
 *     put recorded, in batches of up to 64 MiB of objects (one data sync
 *     each), two batches at once on two threads (the caller's and one it
 *     starts for the call, so that one batch's sync overlaps the other's
 *     writes), and reported (RepairDone).  A copy the master no longer wants is removed;
 *     an extent the master placed over objects the tier still holds (a new
 *     leader that did not know them) has them removed first;
 *   - trims (DiskTrim): extents the master freed are invalidated on disk,
 *     then reported, so the master reuses them;
 *   - reads: a READ of [extent, +size) of a path's reader segment is
 *     answered with that object's bytes, read and verified by the tier
 *     (header, then the checksum): any other range is refused
 *     (INVALID_PARAMS), a failed verification is INVALID_READ.  A reader
 *     never gets bytes that are not the object's.
 *
 * Locks: mu guards the mounted segment ids (readers look up their path
 * through their argument, not under it); it is never held across a master
 * call, a transport call or disk I/O.  The tier has its own locks.
 */
#ifndef MOONLET_NODE_DISK_H
#define MOONLET_NODE_DISK_H

#include <stdbool.h>
#include <stdint.h>

#include "master_client.h"
#include "xfer.h"

typedef struct moonlet_node_disk moonlet_node_disk;

typedef struct moonlet_node_disk_config {
    const char *const *paths; /* --disk PATH[,PATH...] */
    uint32_t npaths;
    uint64_t size;            /* --disk-size: the tier's bytes, shared by the paths */
    unsigned queue_depth;     /* 0: the tier's default */
    /* The transport that serves the reader segments: a TCP instance of the
     * node (not owned), or NULL: the node serves RDMA only, and one is made
     * on listen_host (port 0) with the xfer options below. */
    moonlet_xfer *tcp;
    const char *listen_host;
    const moonlet_xfer_opts *xfer_opts;
} moonlet_node_disk_config;

/* Opens the tier (rescanning what the paths hold) and registers a reader
 * segment per path.  INVALID_PARAMS / INTERNAL_ERROR as moonlet_disk_open;
 * TRANSFER_FAIL when no transport can serve the reads. */
int moonlet_node_disk_open(const moonlet_node_disk_config *cfg, moonlet_node_disk **out);
void moonlet_node_disk_close(moonlet_node_disk *nd);

/* Mounts every path on the master as client_id's disk segment (with the
 * node's write key and clock, as its DRAM segment), then announces what the
 * tier holds.  Called after the DRAM segment's mount, and again after a
 * re-mount (the master forgot the node).  0, or the first mount error. */
int moonlet_node_disk_mount(moonlet_node_disk *nd, moonlet_master_client *mc,
                            const char *client_id, const uint8_t *write_key);
/* Unmounts the disk segments (stop, destroy). */
void moonlet_node_disk_unmount(moonlet_node_disk *nd, moonlet_master_client *mc,
                               const char *client_id);

/* Reads a demotion's bytes from one of its sources into buf (size bytes,
 * checksum-verified when the job has one): the store node's repair_source.
 * Called from both demotion streams at once: it must be thread safe. */
typedef int (*moonlet_node_disk_source)(void *arg, const moonlet_mc_repair_job *j, void *buf);

/* Runs the demotion jobs among jobs[0..n) (the others are left alone):
 * results[i] for each demotion, reported to the master here (RepairDone).
 * Returns how many demotions there were. */
uint32_t moonlet_node_disk_demote(moonlet_node_disk *nd, moonlet_master_client *mc,
                                  const char *client_id, const moonlet_mc_repair_job *jobs,
                                  uint32_t n, moonlet_node_disk_source read, void *arg,
                                  int *results);

/* One round of trims for every mounted path: reports the last round's
 * invalidated extents and invalidates the next ones.  0, or the master's
 * error. */
int moonlet_node_disk_trim(moonlet_node_disk *nd, moonlet_master_client *mc,
                           const char *client_id);

typedef struct moonlet_node_disk_stats {
    uint64_t demoted, demote_failed, reads, read_errors, trimmed, announced, announce_dropped;
    uint64_t capacity, used, objects; /* the tier's */
    uint64_t io_errors, checksum_errors, inflight, queue_depth; /* the tier's */
} moonlet_node_disk_stats;
void moonlet_node_disk_get_stats(moonlet_node_disk *nd, moonlet_node_disk_stats *out);

/* The figures a Ping carries to the master, in the order of
 * common/node_disk_fields.h. */
void moonlet_node_disk_figures(moonlet_node_disk *nd, uint64_t *out /* NFIELDS */);

#endif
