/*
 * net.h - TCP socket setup shared by every moonlet listener and dialer:
 * "host:port" parsing, name resolution, listening and connecting with a
 * deadline.  The RPC server and client (transport/rpc_*.c), the TCP data
 * plane (transport/xfer_tcp_*.c), the metrics endpoint, the store node and
 * the tools all go through here, so an address means the same everywhere.
 *
 * Addresses: "host:port", where host is a name, an IPv4 address or an IPv6
 * address in brackets ("[::1]:5000"); an IPv6 address without brackets is
 * refused (its last colon is ambiguous).  Names resolve with getaddrinfo.
 *
 * Sockets returned are non-blocking and close-on-exec.  Owns no state and
 * takes no locks; every call is safe from any thread.  Connecting blocks the
 * calling thread in poll() until the deadline at most.
 */
#ifndef MOONLET_NET_H
#define MOONLET_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* Negative results of the calls below.  With MOONLET_NET_ESYS errno tells
 * why (for strerror). */
#define MOONLET_NET_EADDR (-1)     /* malformed or unresolvable address */
#define MOONLET_NET_ESYS (-2)      /* socket, bind, listen or connect failed */
#define MOONLET_NET_ETIMEDOUT (-3) /* the deadline passed first */

/* Splits "host:port" / "[v6]:port" into host (NUL-terminated, at most
 * host_cap - 1 bytes, brackets removed) and a decimal port 0..65535.
 * Returns 0 or MOONLET_ERR_INVALID_PARAMS (empty host, no port, a port
 * with other characters or above 65535, an unbracketed IPv6 address, a host
 * too long for host_cap). */
int moonlet_net_split_hostport(const char *addr, char *host, size_t host_cap, uint16_t *port);

/* Resolves host and port to the first address getaddrinfo gives (passive:
 * for binding, where a NULL host means the wildcard).  Returns 0 or
 * MOONLET_NET_EADDR (the reason is logged). */
int moonlet_net_resolve(const char *host, uint16_t port, bool passive,
                        struct sockaddr_storage *out, socklen_t *out_len);

/* Listens on host:port (port 0: an ephemeral port), trying each resolved
 * address in turn; SO_REUSEADDR is set.  Returns the listening fd and, when
 * bound_port is not NULL, the port it got; or MOONLET_NET_EADDR or
 * MOONLET_NET_ESYS. */
int moonlet_net_listen_tcp(const char *host, uint16_t port, int backlog, uint16_t *bound_port);

/* Connects to host:port, trying each resolved address until one answers or
 * deadline_ms (moonlet_mono_ms) passes; TCP_NODELAY is set, and so are
 * SO_SNDBUF/SO_RCVBUF (before connecting, so the window scale fits) when
 * sockbuf_bytes > 0.  Returns the connected fd, or MOONLET_NET_EADDR,
 * MOONLET_NET_ESYS (refused, unreachable) or MOONLET_NET_ETIMEDOUT. */
int moonlet_net_connect_tcp(const char *host, uint16_t port, uint64_t deadline_ms,
                            int sockbuf_bytes);

/* Waits until fd has `events` (POLLIN/POLLOUT) or deadline_ms passes.
 * Returns 0, MOONLET_NET_ETIMEDOUT or MOONLET_NET_ESYS. */
int moonlet_net_wait(int fd, short events, uint64_t deadline_ms);

/* Sends (out) or receives exactly n bytes on the non-blocking fd, waiting
 * for it until deadline_ms (moonlet_mono_ms).  Returns 0, or -1 when the
 * peer closed, the socket failed or the deadline passed (the stream's
 * position is then unknown). */
int moonlet_net_io_by(int fd, bool out, void *buf, size_t n, uint64_t deadline_ms);

/* The port of a bound socket, or 0. */
uint16_t moonlet_net_local_port(int fd);

#endif
