/*
 * xfer_tcp_internal.h - what the TCP backend's files share (xfer_tcp.c, the
 * backend table; xfer_tcp_server.c; xfer_tcp_client.c).  Internal to
 * transport/ and its tests.  The locks each side takes are stated in its
 * file; nothing here takes one.
 */
#ifndef MOONLET_XFER_TCP_INTERNAL_H
#define MOONLET_XFER_TCP_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "xfer_internal.h"
#include "xfer_tcp.h"

#define TCP_SOCKBUF_BYTES (4 << 20) /* SO_SNDBUF / SO_RCVBUF, both sides */

/* ---- serving side (xfer_tcp_server.c) ---- */

/* Starts serving x->listen_addr (nothing to do for a client-only instance). */
int moonlet_xfer_tcp_server_start(moonlet_xfer *x);
/* Stops the threads, closes every connection, frees the server. */
void moonlet_xfer_tcp_server_stop(moonlet_xfer *x);
int moonlet_xfer_tcp_seg_add_reader(moonlet_xfer *x, uint64_t len, moonlet_xfer_reader read,
                                    void *arg, moonlet_xfer_segment_info *info);
int moonlet_xfer_tcp_seg_add(moonlet_xfer *x, void *base, uint64_t len,
                             moonlet_xfer_segment_info *info);
int moonlet_xfer_tcp_seg_remove(moonlet_xfer *x, const char *segment_id);
int moonlet_xfer_tcp_seg_set_key(moonlet_xfer *x, const char *segment_id, const uint8_t *key);
/* A segment id string (16 lower-case hex digits) to its number: 0 or
 * MOONLET_ERR_SEGMENT_NOT_FOUND. */
int moonlet_xfer_tcp_parse_seg_id(const char *s, uint64_t *id);
/* Connections the server has closed for idling past server_idle_timeout_ms
 * since it started (0 for a client-only instance): tests wait on it. */
uint64_t moonlet_xfer_tcp_idle_closed(moonlet_xfer *x);
/* Connections the server has closed for not authenticating within
 * timeout_ms of their accept (a server with a token; 0 otherwise). */
uint64_t moonlet_xfer_tcp_auth_closed(moonlet_xfer *x);
struct sockaddr_storage;
/* The address bytes the per-peer connection cap counts a peer by, into out:
 * an IPv4 address (IPv4-mapped IPv6 as IPv4), the /64 prefix of an IPv6
 * one.  Returns their length (0 for another family). */
uint8_t moonlet_xfer_tcp_peer_key(const struct sockaddr_storage *ss, uint8_t out[16]);

/* ---- client side (xfer_tcp_client.c) ---- */

int moonlet_xfer_tcp_conn_open(moonlet_xfer *x, const char *endpoint, uint64_t deadline_ms,
                               void **out);
bool moonlet_xfer_tcp_conn_stale(moonlet_xfer *x, void *conn);
void moonlet_xfer_tcp_conn_close(moonlet_xfer *x, void *conn);
void moonlet_xfer_tcp_run(moonlet_xfer *x, xfer_lane *lanes, size_t nlanes);

#endif
