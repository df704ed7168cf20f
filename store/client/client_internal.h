/*
 * client_internal.h - the decisions of the public client (store/client/client.c)
 * that are worth testing on their own, as pure functions, and one switch for
 * tests.  Not installed; not part of the public API.
 */
#ifndef MOONLET_CLIENT_INTERNAL_H
#define MOONLET_CLIENT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "moonlet/client.h"
#include "moonlet/types.h"
#include "replica.h"
#include "store_node.h"

/* True when a read lease of lease_ttl_ms, granted no earlier than asked_ns
 * (CLOCK_MONOTONIC, taken just before GetReplicaList was sent), had run out
 * by done_ns (when the read completed).  The master grants the lease while
 * handling the request, so measuring from before the request can only make
 * the client stricter than the master, never laxer.  A lease of 0 ms
 * protects nothing: always expired.  Pure. */
bool moonlet_client_lease_expired(uint64_t asked_ns, uint64_t lease_ttl_ms, uint64_t done_ns);

/* The order in which to try the n replicas: those served at own_endpoint
 * (this client's own segment; NULL or "" when it has none) first, then the
 * others in the master's order.  Writes n indexes to order; returns n.  Pure. */
uint32_t moonlet_client_replica_order(const moonlet_replica_desc *r, uint32_t n,
                                      const char *own_endpoint, uint32_t *order);

/* Whether a failed replica read should move on to the next replica:
 * TRANSFER_FAIL (node gone, connection lost) and SEGMENT_NOT_FOUND (node
 * re-registered its segment) and INVALID_READ (its bytes failed the
 * end-to-end checksum).  Pure. */
bool moonlet_client_try_next_replica(int rc);

/* Whether a put's failed replica write may be replaced (PutReplaceReplica)
 * and written again elsewhere: TRANSFER_FAIL, SEGMENT_NOT_FOUND,
 * UNAVAILABLE_IN_CURRENT_STATUS; never INVALID_WRITE (a refused or expired
 * capability).  Pure. */
bool moonlet_client_put_replaceable(int rc);

/* Which endpoint of replica r a client whose transport speaks `mine` ("tcp"
 * or "rdma") uses: its own protocol when the replica offers it (primary or
 * alternative endpoint), else TCP when the replica offers TCP and can_tcp
 * (an RDMA client may add a TCP instance).  Fills *endpoint, *segment_id and
 * *protocol and returns 0, or UNAVAILABLE_IN_CURRENT_STATUS when the client
 * speaks none of the replica's protocols.  Pure. */
int moonlet_client_pick_endpoint(const moonlet_replica_desc *r, const char *mine, bool can_tcp,
                                 const char **endpoint, const char **segment_id,
                                 const char **protocol);

/* The end-to-end checksum of an object's bytes: XXH3-64. */
uint64_t moonlet_client_checksum(const void *buf, size_t len);

/* Tests: make the copying calls (put, get, get_alloc, upsert) stage through
 * a registered bounce buffer as they do on RDMA, so that path runs on TCP. */
void moonlet_client_force_staging(moonlet_client *c, bool on);

/* Tests: how many bounce-buffer registrations staging has made so far, and
 * how many bytes of registered bounce buffers sit idle in the cache. */
void moonlet_client_stage_stats(moonlet_client *c, uint64_t *registrations, size_t *idle_bytes);
/* Tests: the memory of the client's local segment (NULL without one), to
 * corrupt a replica in place. */
void *moonlet_client_local_segment_base(moonlet_client *c);

/* Copies the caller's config (its first src->opts_size bytes) into *dst, a
 * full-size struct whose fields past them stay zero (their defaults).
 * INVALID_PARAMS for NULL src or an opts_size never set.  Never blocks. */
int moonlet_client_config_copy(moonlet_client_config *dst, const moonlet_client_config *src);

/* As moonlet_client_create(), with the local segment configured as a full
 * store node by `node` (used verbatim: its segment_size wins over
 * cfg->local_segment_size); NULL: moonlet_client_create() itself. */
int moonlet_client_create_with_node(const moonlet_client_config *cfg,
                                    const moonlet_store_node_config *node, moonlet_client **out);

#endif
