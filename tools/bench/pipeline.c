/*
 * pipeline.c - PutStart / PutEnd for a range of keys, pipelined: see
 * pipeline.h.
 */
#include "pipeline.h"

#include <msgpack.h>

#include "methods.h"
#include "moonlet/error.h"
#include "wire.h"

/* Sends `method` (PutStart or PutEnd) for keys [from, to), a window at a
 * time, and checks every reply. */
static int pipelined(moonlet_rpc_client *c, uint32_t method, const char *tenant, uint64_t size,
                     uint64_t from, uint64_t to, bench_key_fn key_of, void *ctx)
{
    char key[BENCH_PIPELINE_KEY_MAX];
    for (uint64_t base = from; base < to; base += BENCH_PIPELINE_WINDOW) {
        uint64_t end = base + BENCH_PIPELINE_WINDOW < to ? base + BENCH_PIPELINE_WINDOW : to;
        for (uint64_t i = base; i < end; i++) {
            key_of(ctx, i, key, sizeof(key));
            msgpack_packer *pk =
                moonlet_rpc_client_begin(c, method, method == MOONLET_M_PUT_START ? 5 : 2);
            moonlet_pack_cstr(pk, tenant);
            moonlet_pack_cstr(pk, key);
            if (method == MOONLET_M_PUT_START) {
                msgpack_pack_uint64(pk, size);
                msgpack_pack_uint64(pk, 1);
                msgpack_pack_false(pk);
            }
            uint64_t id;
            int rc = moonlet_rpc_client_send(c, &id);
            if (rc)
                return rc;
        }
        for (uint64_t i = base; i < end; i++) {
            int rc = moonlet_rpc_client_recv_code(c);
            if (rc)
                return rc;
        }
    }
    return MOONLET_OK;
}

int bench_fill_range(moonlet_rpc_client *c, const char *tenant, uint64_t size, uint64_t from,
                     uint64_t to, bench_key_fn key, void *ctx)
{
    int rc = pipelined(c, MOONLET_M_PUT_START, tenant, size, from, to, key, ctx);
    return rc ? rc : pipelined(c, MOONLET_M_PUT_END, tenant, size, from, to, key, ctx);
}
