/*
 * xfer_tcp.h - the TCP data-plane wire header (internal to transport/ and its
 * tests; pure: no I/O, no locks).
 *
 * Every message starts with a fixed 48-byte header, all integers big-endian:
 *
 *   0  u32 magic    'MLXF' (0x4d4c5846)
 *   4  u8  version  1
 *   5  u8  op       AUTH 1, READ 2, WRITE 3, CHALLENGE 4; a reply sets bit 0x80
 *   6  u8  flags    WRITE requests: 0, or F_CAP (0x01); AUTH requests: F_MAC
 *                   (0x02); otherwise 0
 *   7  u8  reserved must be 0
 *   8  i32 status   replies: 0 or a moonlet error code; requests: 0
 *  12  u32 reserved must be 0
 *  16  u64 request id (echoed in the reply)
 *  24  u64 segment id
 *  32  u64 offset
 *  40  u64 length   payload bytes that follow THIS message
 *
 * CHALLENGE request: no payload.  reply: status 0 and 32 payload bytes, a
 *       nonce the server drew for this connection (common/cred.h).
 * AUTH  request (F_MAC): payload = a 32-byte client nonce, then
 *       HMAC-SHA-256 under SHA-256(token) of the label, "tcp", the server's
 *       nonce and the client nonce (moonlet_cred_mac), 64 bytes in all.
 *       reply: status 0, or ILLEGAL_CLIENT and the server closes.  The
 *       server's nonce is good for one AUTH: a refused or accepted AUTH uses
 *       it up, so a captured CHALLENGE / AUTH exchange replayed on another
 *       connection meets another nonce and is refused (issue 33).  The token
 *       itself never travels.  A server with a token refuses an AUTH without
 *       F_MAC (the token in clear, as moonlet sent it before: replayable).
 *       A server without a token answers any AUTH with status 0.
 * READ  request: no payload, `length` = bytes wanted.  reply: status 0 and
 *       exactly `length` payload bytes, or an error status and no payload.
 * WRITE request: with F_CAP, a 32-byte write capability follows the header
 *       (u64 offset, u64 len, u64 expiry_ms, u64 tag: common/writecap.h; an
 *       HA leader's epoch rides in the upper bits of len and expiry_ms,
 *       under the tag, and a node refuses an epoch older than it has seen);
 *       then `length` payload bytes.  reply: status, no payload.  A refused
 *       write's payload is read and discarded, so the stream stays in step
 *       and the connection stays usable.  A segment with a write key refuses
 *       (INVALID_WRITE) a write whose capability is missing, forged, does not
 *       cover [offset, offset + length) or has expired on the node's clock,
 *       and one whose capability expires while its payload arrives: the
 *       node checks the expiry before it receives each chunk into segment
 *       memory and discards the rest.
 * A server with a token answers any request before a successful AUTH with
 * ILLEGAL_CLIENT and closes.  Replies on a connection come in request order.
 * A header that does not decode (magic, version, reserved bits, op, a length
 * above MOONLET_XFER_MAX_OP_BYTES) closes the connection without a reply.
 * The server closes, without a reply, a connection whose request (header,
 * payload, reply taken) is not done within its deadline (the transfer
 * timeout from the first header byte, plus 1 ms per 16 KiB of payload), or
 * that stays idle between requests past the idle timeout; it closes at once
 * a connection beyond its total or per-address cap.
 */
#ifndef MOONLET_XFER_TCP_H
#define MOONLET_XFER_TCP_H

#include <stdint.h>

#define MOONLET_XFER_TCP_MAGIC 0x4d4c5846u
#define MOONLET_XFER_TCP_VERSION 1u
#define MOONLET_XFER_TCP_HDR_BYTES 48u
#define MOONLET_XFER_TCP_CAP_BYTES 32u
#define MOONLET_XFER_TCP_F_CAP 0x01u
#define MOONLET_XFER_TCP_F_MAC 0x02u
#define MOONLET_XFER_TCP_NONCE_BYTES 32u
#define MOONLET_XFER_TCP_MAC_AUTH_BYTES 64u /* client nonce + HMAC-SHA-256 */

enum moonlet_xfer_tcp_op {
    MOONLET_XFER_TCP_AUTH = 1,
    MOONLET_XFER_TCP_READ = 2,
    MOONLET_XFER_TCP_WRITE = 3,
    MOONLET_XFER_TCP_CHALLENGE = 4,
    MOONLET_XFER_TCP_REPLY = 0x80,
};

typedef struct moonlet_xfer_tcp_hdr {
    uint8_t op;
    uint8_t flags;  /* MOONLET_XFER_TCP_F_CAP */
    int32_t status;
    uint64_t req_id;
    uint64_t segment;
    uint64_t offset;
    uint64_t length;
} moonlet_xfer_tcp_hdr;

void moonlet_xfer_tcp_hdr_encode(const moonlet_xfer_tcp_hdr *h,
                                 uint8_t out[MOONLET_XFER_TCP_HDR_BYTES]);
/* Returns 0, or MOONLET_ERR_INVALID_PARAMS when the bytes are not a header. */
int moonlet_xfer_tcp_hdr_decode(const uint8_t in[MOONLET_XFER_TCP_HDR_BYTES],
                                moonlet_xfer_tcp_hdr *h);

/* The write capability that follows a WRITE header with F_CAP. */
typedef struct moonlet_xfer_tcp_cap {
    uint64_t offset, len, expiry_ms, tag;
} moonlet_xfer_tcp_cap;

void moonlet_xfer_tcp_cap_encode(const moonlet_xfer_tcp_cap *c,
                                 uint8_t out[MOONLET_XFER_TCP_CAP_BYTES]);
void moonlet_xfer_tcp_cap_decode(const uint8_t in[MOONLET_XFER_TCP_CAP_BYTES],
                                 moonlet_xfer_tcp_cap *c);

#endif
