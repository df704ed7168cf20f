/*
 * frame.h - the control-plane RPC frame codec (pure: no I/O, no locks).
 *
 * Wire format.  Every message is a frame: a 4-byte big-endian body length L
 * (1 <= L <= max_frame) followed by L bytes of one msgpack object.
 *
 *   request body: array(3) [ uint id, uint method, array args ]
 *   reply body:   array(3) [ uint id, int code, result ]
 *             or array(4) [ uint id, int code, result, uint epoch ]
 *
 * `args` is the method's positional argument list (see methods.h).  In a
 * reply, `code` is a moonlet error code (0 = OK); `result` is the method's
 * result object when code is 0, and a human-readable message string (or nil)
 * otherwise.  Replies carry the request id, so a client may pipeline many
 * requests on one connection.  The 4th reply element is the master's HA
 * epoch, sent only on connections that asked for it (Hello, see
 * docs/protocol.md), so older peers never see it.
 *
 * The decoders check the whole shape: a body that is not exactly one msgpack
 * object, has trailing bytes, is not an array of 3, or has a field of the
 * wrong type is rejected with MOONLET_ERR_INVALID_PARAMS.  They never read
 * past `len`.
 */
#ifndef MOONLET_FRAME_H
#define MOONLET_FRAME_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MOONLET_FRAME_HEADER_BYTES 4u
#define MOONLET_DEFAULT_MAX_FRAME (64u << 20) /* 64 MiB */
/* The one method id the RPC layer itself serves (rpc_server.h): AUTH [token].
 * Every protocol on these frames leaves id 1 to it. */
#define MOONLET_RPC_AUTH 1u

/* Writes the header for a body of `body_len` bytes. */
void moonlet_frame_header_encode(uint8_t hdr[MOONLET_FRAME_HEADER_BYTES], uint32_t body_len);

/* Reads a header.  Returns 0 and sets *body_len, or MOONLET_ERR_INVALID_PARAMS
 * when the length is 0 or larger than max_frame. */
int moonlet_frame_header_decode(const uint8_t hdr[MOONLET_FRAME_HEADER_BYTES], size_t max_frame,
                                uint32_t *body_len);

/* A decoded request.  `args` points into `unp`'s zone; valid until
 * moonlet_request_destroy(). */
typedef struct moonlet_request {
    uint64_t id;
    uint32_t method;
    const msgpack_object *args; /* always of type MSGPACK_OBJECT_ARRAY */
    msgpack_unpacked unp;
} moonlet_request;

/* Decodes a request body.  On success returns 0 and *req must be released with
 * moonlet_request_destroy().  On failure returns MOONLET_ERR_INVALID_PARAMS,
 * sets *id_out to the request id when it could be read (else 0), and *req
 * needs no release (MOONLET_ERR_INTERNAL_ERROR when out of memory).  The
 * decoded objects are self-contained: `body` is copied into req's zone, so
 * the caller may reuse `body` at once. */
int moonlet_request_decode(const char *body, size_t len, moonlet_request *req, uint64_t *id_out);
void moonlet_request_destroy(moonlet_request *req);

/* Zero-copy variant for the server's hot path: objects are allocated in the caller's `zone` and strings point
 * into `body`, so *req stays valid while both do.  req->unp.zone is left NULL
 * (moonlet_request_destroy() is then a no-op); the caller recycles the zone
 * with msgpack_zone_clear().  Same return and *id_out conventions. */
int moonlet_request_decode_ref(const char *body, size_t len, msgpack_zone *zone,
                               moonlet_request *req, uint64_t *id_out);
/* The same with a bound on the work a request may cause: a body whose containers hold more than `max_elements`
 * elements in all (map entries count twice) is refused with
 * MOONLET_ERR_BUFFER_OVERFLOW as soon as the walk counts them, before
 * anything is allocated, with *id_out set when the id can be read. */
int moonlet_request_decode_ref_max(const char *body, size_t len, msgpack_zone *zone,
                                   uint64_t max_elements, moonlet_request *req, uint64_t *id_out);

/* Returns 0 when body[0..len) is exactly one well-formed msgpack object (no
 * trailing bytes) whose declared container sizes fit in `len`, else
 * MOONLET_ERR_INVALID_PARAMS.  Allocation-free; the decoders run it first, so
 * a tiny frame declaring a 4-billion-element array is refused before msgpack
 * would try to allocate for it. */
int moonlet_frame_body_check(const char *body, size_t len);

/* A decoded reply; `result` points into `unp`'s zone. */
typedef struct moonlet_reply {
    uint64_t id;
    int32_t code;
    const msgpack_object *result;
    uint64_t epoch; /* the optional 4th element; 0 when absent */
    msgpack_unpacked unp;
} moonlet_reply;

/* Decodes a reply body; same conventions as moonlet_request_decode (the
 * result is self-contained).  `code` may use any msgpack int encoding but must
 * fit in int32. */
int moonlet_reply_decode(const char *body, size_t len, moonlet_reply *rep);
void moonlet_reply_destroy(moonlet_reply *rep);

/*
 * Encoding.  A moonlet_frame_builder packs one frame into a growable buffer:
 * begin() reserves the header, the caller packs the body through `pk`, and
 * finish() writes the length.  Several frames may be built back to back into
 * one builder (pipelining); moonlet_frame_builder_reset() empties it.
 */
typedef struct moonlet_frame_builder {
    msgpack_sbuffer buf;
    msgpack_packer pk;
    size_t frame_start; /* offset of the current frame's header; SIZE_MAX when no frame is open */
} moonlet_frame_builder;

/* The builder must not be moved after init (pk writes to &b->buf). */
void moonlet_frame_builder_init(moonlet_frame_builder *b);
void moonlet_frame_builder_destroy(moonlet_frame_builder *b);
/* Empties the builder; keeps its buffer unless it grew past 1 MiB. */
void moonlet_frame_builder_reset(moonlet_frame_builder *b);
/* Starts a frame; returns the packer to write the body with.  A frame begun
 * but not finished is discarded first. */
msgpack_packer *moonlet_frame_begin(moonlet_frame_builder *b);
/* Ends the frame.  Returns 0, or MOONLET_ERR_BUFFER_OVERFLOW when the body
 * exceeds max_frame (the frame is then dropped from the buffer).  An empty
 * body, or no open frame, is refused with MOONLET_ERR_INVALID_PARAMS. */
int moonlet_frame_finish(moonlet_frame_builder *b, size_t max_frame);
/* Drops the open frame, if any. */
void moonlet_frame_abort(moonlet_frame_builder *b);

/* Convenience: starts a request frame [id, method, array(nargs) ...]; the
 * caller packs exactly `nargs` objects, then calls moonlet_frame_finish(). */
msgpack_packer *moonlet_request_begin(moonlet_frame_builder *b, uint64_t id, uint32_t method,
                                      uint32_t nargs);
/* Starts a reply frame [id, code, ...]; the caller packs exactly one result
 * object, then calls moonlet_frame_finish().  `code` is always packed in the
 * fixed-width int32 form (0xd2 + 4 bytes) so that it can be patched later. */
msgpack_packer *moonlet_reply_begin(moonlet_frame_builder *b, uint64_t id, int32_t code);
/* The same for a reply that carries an epoch: with `epoch` the frame is
 * [id, code, result, epoch] and the caller packs the epoch (a uint) after
 * the result; without, as moonlet_reply_begin(). */
msgpack_packer *moonlet_reply_begin_ex(moonlet_frame_builder *b, uint64_t id, int32_t code,
                                       bool epoch);
/* Rewrites the code of the open (begun, not yet finished) reply frame in
 * place, so a server can let a handler pack its result straight into the
 * output buffer and set the code afterwards without copying.  No-op when no
 * reply frame is open. */
void moonlet_reply_patch_code(moonlet_frame_builder *b, int32_t code);

#endif
