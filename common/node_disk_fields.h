/*
 * node_disk_fields.h - a store node's disk tier figures as its Ping carries them
 * to the master (an array of unsigned integers in this order): shared by
 * the node (store/node/store_node.c), the method table (master/service/methods.c,
 * which names them), the master (kept per node, summed in Stats and
 * /metrics) and moonlet-inspect.  A longer array's extra values are
 * ignored and a shorter one's missing values are 0, so a field can be
 * added at the end.  Counters count since the node started; inflight and
 * queue_depth are gauges.  Pure: no state, no locks.
 */
#ifndef MOONLET_NODE_DISK_FIELDS_H
#define MOONLET_NODE_DISK_FIELDS_H

enum {
    MOONLET_NODE_DISK_READS,           /* disk reads served (disk hits) */
    MOONLET_NODE_DISK_READ_ERRORS,     /* reads refused or failed */
    MOONLET_NODE_DISK_IO_ERRORS,       /* failed or short I/Os and syncs */
    MOONLET_NODE_DISK_CHECKSUM_ERRORS, /* reads whose bytes or header did not verify */
    MOONLET_NODE_DISK_INFLIGHT,        /* I/Os in flight now */
    MOONLET_NODE_DISK_QUEUE_DEPTH,     /* the most I/Os in flight (depth times lanes) */
    MOONLET_NODE_DISK_DEMOTED,         /* demotions written and reported */
    MOONLET_NODE_DISK_DEMOTE_FAILED,   /* demotions that failed */
    MOONLET_NODE_DISK_NFIELDS
};
#define MOONLET_NODE_DISK_MAX 64u /* the most values a Ping may carry */

/* Their names, as ListSegments' node_tier map and Stats (prefixed
 * "node_disk_") say them (master/service/methods.c). */
extern const char *const moonlet_node_disk_names[MOONLET_NODE_DISK_NFIELDS];

#endif
