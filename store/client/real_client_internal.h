/*
 * real_client_internal.h - a RealClient whose segment is configured as a
 * full store node (store_node.h), for moonlet-store --serve-dummy, where the
 * node's own flags (client id, NUMA node, heartbeat period, huge pages)
 * apply.  Not installed; not part of the public API.
 */
#ifndef MOONLET_REAL_CLIENT_INTERNAL_H
#define MOONLET_REAL_CLIENT_INTERNAL_H

#include "moonlet/real_client.h"
#include "store_node.h"

/* As moonlet_real_client_create(), with the local segment configured by
 * `node` (its segment_size, not cfg->local_segment_size; NULL: from cfg)
 * and the serving threads' busy polling (see MOONLET_REAL_CLIENT_BUSY_POLL_US;
 * 0: none; at most MOONLET_RPC_MAX_BUSY_POLL_US, else INVALID_PARAMS). */
int moonlet_real_client_create_with_node(const moonlet_client_config *cfg,
                                         const moonlet_store_node_config *node,
                                         const char *socket_path, const char *socket_group,
                                         uint32_t busy_poll_us, moonlet_real_client **out);

#endif
