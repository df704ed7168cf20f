/*
 * node_timing.h - the timing a store node promises the master.
 *
 * The master's liveness rules depend on how a store node retries: a master
 * promoted with state holds liveness long enough for a node asleep in its
 * longest retry backoff to ping it (master/ha/ha.c), and the node's heartbeat
 * (store/node/store_node.c) never waits longer than this between retries.
 * Both sides include this header, so neither includes the other's: a
 * change of the node's backoff changes the master's hold with it.
 *
 * Constants only: no code, no locks.
 */
#ifndef MOONLET_NODE_TIMING_H
#define MOONLET_NODE_TIMING_H

/* The longest wait of a store node between two retries of a failed master
 * call (its exponential backoff's cap), in ms. */
#define MOONLET_NODE_BACKOFF_CAP_MS 2000u

#endif
