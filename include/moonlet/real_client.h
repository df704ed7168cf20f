/*
 * moonlet/real_client.h - the RealClient: the one full client of an
 * inference instance, serving the DummyClients of the same host.
 *
 * A RealClient owns a moonlet_client with a local segment (it contributes
 * memory to the cluster) and the master connection, and listens on a
 * unix-domain socket.  Each process of the instance (a tensor-parallel rank,
 * a Python worker) opens a DummyClient on that socket
 * (moonlet_client_create_dummy() in moonlet/client.h) and uses the ordinary
 * moonlet_client_* calls; the RealClient makes each call on its own client
 * and answers with the return code and outputs unchanged.  Object bytes
 * never cross the socket: they sit in shared memory (memfd) that the
 * DummyClient creates and passes over the socket; the RealClient maps it for
 * that connection only and unmaps it when the connection closes, so a
 * DummyClient that dies leaves nothing behind.  See docs/client-layers.md.
 *
 * The socket file is created with mode 0600 (the RealClient's user only),
 * or 0660 and the named group when a socket group is given, so the
 * instance's processes may run as other users of that group.  A file left
 * at the path by a RealClient that was killed is replaced; a live server's
 * socket or a non-socket file is not (RPC_FAIL).
 *
 * Requests of one DummyClient connection are served in order, on one of the
 * RealClient's serving threads; different connections run in parallel (up
 * to MOONLET_REAL_CLIENT_THREADS at once).
 */
#ifndef MOONLET_REAL_CLIENT_H
#define MOONLET_REAL_CLIENT_H

#include <stddef.h>

#include "moonlet/client.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct moonlet_real_client moonlet_real_client;

/* Serving threads: DummyClient connections served at the same time. */
#define MOONLET_REAL_CLIENT_THREADS 8

/*
 * Busy polling of the serving threads, in microseconds: after serving a
 * request a thread keeps polling its connections, without sleeping and
 * yielding the CPU each round, for this long before it sleeps.  A request
 * that comes within the window skips the wake-up of a sleeping thread, a
 * large share of the DummyClient hop (docs/benchmarks.md, "Client layers").
 * Cost: while DummyClients keep calling, up to one core per busy serving
 * thread; nothing while they are idle.  moonlet-store --busy-poll-us sets
 * it (0: off).
 */
#define MOONLET_REAL_CLIENT_BUSY_POLL_US 200

/*
 * Creates the client (moonlet_client_create(cfg): master connection, local
 * segment) and starts serving DummyClients on socket_path.  cfg must have a
 * local_segment_size > 0: a RealClient always contributes its segment.
 * socket_group NULL or "": socket mode 0600; else the socket gets that
 * group (by name) and mode 0660.
 * Returns 0 and sets *out, or
 *   INVALID_PARAMS  NULL cfg / socket_path / out, local_segment_size 0, a
 *                   path too long for a unix socket, an unknown group
 *   RPC_FAIL        cannot listen on socket_path (in use by a live server,
 *                   not a socket, no permission) or chgrp / chmod failed
 *   and every error of moonlet_client_create().
 * Blocks for the client's creation.  Thread safe (independent objects).
 */
MOONLET_API int moonlet_real_client_create(const moonlet_client_config *cfg, const char *socket_path,
                                           const char *socket_group, moonlet_real_client **out);

/*
 * Stops serving (closing every DummyClient connection and unmapping its
 * memory; a call being served finishes first), removes the socket file,
 * then destroys the client (unmounting its segment).  DummyClients see
 * RPC_FAIL from then on.  NULL is a no-op.  Blocks for at most the longest
 * call in progress plus the unmount.  Must not race with other calls on rc.
 */
MOONLET_API void moonlet_real_client_destroy(moonlet_real_client *rc);

/*
 * The RealClient's own moonlet_client, for the process that runs it: it may
 * be used directly, from any thread, alongside the DummyClients.  Owned by
 * rc: do not destroy it.  Never blocks.
 */
MOONLET_API moonlet_client *moonlet_real_client_client(moonlet_real_client *rc);

/* Open DummyClient connections (a DummyClient may hold several).  Never
 * blocks; thread safe. */
MOONLET_API size_t moonlet_real_client_connections(const moonlet_real_client *rc);

/* Shared-memory regions currently mapped for DummyClients, over all
 * connections.  Never blocks; thread safe. */
MOONLET_API size_t moonlet_real_client_regions(const moonlet_real_client *rc);

#ifdef __cplusplus
}
#endif
#endif
