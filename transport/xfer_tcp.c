/*
 * xfer_tcp.c - the TCP backend of the data-plane transport (xfer.h): its
 * entry in xfer.c's backend table.  The work is in three files:
 *   xfer_tcp_wire.c    the message header codec (format in xfer_tcp.h);
 *   xfer_tcp_server.c  the serving side (segments, threads, deadlines);
 *   xfer_tcp_client.c  the client side (connections, running batches).
 * Owns nothing and takes no locks itself.
 */
#include "xfer_tcp_internal.h"

#include "moonlet/error.h"

/* ---- what needs neither side, and the table ---------------------------- */

static int tcp_prepare(moonlet_xfer *x, xfer_item *it)
{
    return moonlet_xfer_tcp_parse_seg_id(it->op->segment_id, &it->seg);
}

static int tcp_buf_add(moonlet_xfer *x, void *base, size_t len, void **handle, uint32_t *lkey)
{
    *handle = NULL; /* TCP needs no registration; xfer.c keeps the bookkeeping */
    *lkey = 0;
    return MOONLET_OK;
}

static void tcp_buf_remove(moonlet_xfer *x, void *handle) {}

const xfer_backend moonlet_xfer_tcp_backend = {
    .name = "tcp",
    .start = moonlet_xfer_tcp_server_start,
    .stop = moonlet_xfer_tcp_server_stop,
    .seg_add = moonlet_xfer_tcp_seg_add,
    .seg_remove = moonlet_xfer_tcp_seg_remove,
    .seg_add_reader = moonlet_xfer_tcp_seg_add_reader,
    .seg_set_key = moonlet_xfer_tcp_seg_set_key,
    .buf_add = tcp_buf_add,
    .buf_remove = tcp_buf_remove,
    .prepare = tcp_prepare,
    .conn_open = moonlet_xfer_tcp_conn_open,
    .conn_close = moonlet_xfer_tcp_conn_close,
    .conn_stale = moonlet_xfer_tcp_conn_stale,
    .run = moonlet_xfer_tcp_run,
};
