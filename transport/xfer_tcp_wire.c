/*
 * xfer_tcp_wire.c - the TCP data plane's message header codec; the format
 * is in xfer_tcp.h.  Pure: no I/O, no state, no locks.
 */
#include "xfer_tcp.h"

#include <string.h>

#include "moonlet/error.h"
#include "xfer.h" /* MOONLET_XFER_MAX_OP_BYTES, MOONLET_XFER_MAX_TOKEN_BYTES */

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get_be64(const uint8_t *p)
{
    return (uint64_t)get_be32(p) << 32 | get_be32(p + 4);
}

void moonlet_xfer_tcp_hdr_encode(const moonlet_xfer_tcp_hdr *h,
                                 uint8_t out[MOONLET_XFER_TCP_HDR_BYTES])
{
    memset(out, 0, MOONLET_XFER_TCP_HDR_BYTES);
    put_be32(out, MOONLET_XFER_TCP_MAGIC);
    out[4] = MOONLET_XFER_TCP_VERSION;
    out[5] = h->op;
    out[6] = h->flags;
    put_be32(out + 8, (uint32_t)h->status);
    put_be64(out + 16, h->req_id);
    put_be64(out + 24, h->segment);
    put_be64(out + 32, h->offset);
    put_be64(out + 40, h->length);
}

int moonlet_xfer_tcp_hdr_decode(const uint8_t in[MOONLET_XFER_TCP_HDR_BYTES],
                                moonlet_xfer_tcp_hdr *h)
{
    if (get_be32(in) != MOONLET_XFER_TCP_MAGIC || in[4] != MOONLET_XFER_TCP_VERSION ||
        in[7] || get_be32(in + 12))
        return MOONLET_ERR_INVALID_PARAMS;
    uint8_t base = in[5] & (uint8_t)~MOONLET_XFER_TCP_REPLY;
    if (base < MOONLET_XFER_TCP_AUTH || base > MOONLET_XFER_TCP_CHALLENGE)
        return MOONLET_ERR_INVALID_PARAMS;
    if (in[6] && !(in[5] == MOONLET_XFER_TCP_WRITE && in[6] == MOONLET_XFER_TCP_F_CAP) &&
        !(in[5] == MOONLET_XFER_TCP_AUTH && in[6] == MOONLET_XFER_TCP_F_MAC))
        return MOONLET_ERR_INVALID_PARAMS;
    h->op = in[5];
    h->flags = in[6];
    h->status = (int32_t)get_be32(in + 8);
    h->req_id = get_be64(in + 16);
    h->segment = get_be64(in + 24);
    h->offset = get_be64(in + 32);
    h->length = get_be64(in + 40);
    if (h->length > MOONLET_XFER_MAX_OP_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    if (base == MOONLET_XFER_TCP_AUTH && h->length > MOONLET_XFER_MAX_TOKEN_BYTES)
        return MOONLET_ERR_INVALID_PARAMS;
    return MOONLET_OK;
}

void moonlet_xfer_tcp_cap_encode(const moonlet_xfer_tcp_cap *c,
                                 uint8_t out[MOONLET_XFER_TCP_CAP_BYTES])
{
    put_be64(out, c->offset);
    put_be64(out + 8, c->len);
    put_be64(out + 16, c->expiry_ms);
    put_be64(out + 24, c->tag);
}

void moonlet_xfer_tcp_cap_decode(const uint8_t in[MOONLET_XFER_TCP_CAP_BYTES],
                                 moonlet_xfer_tcp_cap *c)
{
    c->offset = get_be64(in);
    c->len = get_be64(in + 8);
    c->expiry_ms = get_be64(in + 16);
    c->tag = get_be64(in + 24);
}
