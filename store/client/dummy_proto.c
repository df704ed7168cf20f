/*
 * dummy_proto.c - the method table of the DummyClient <-> RealClient
 * protocol (dummy_proto.h): every method's arguments, declared once.  The
 * RealClient (real_client.c) decodes requests from it; the DummyClient
 * (dummy_client.c) packs them from it.  Adding an argument is one row here,
 * one field in its struct in dummy_proto.h, and its use in the handler.
 * No state; no locks.
 */
#include "dummy_proto.h"

#include <stddef.h>

#include "moonlet/types.h"

#define OPT MOONLET_ARG_OPTIONAL
#define WITH_PREV MOONLET_ARG_WITH_PREV
#define NULLABLE MOONLET_ARG_NULLABLE
#define CSTR MOONLET_ARG_CSTR
#define U64 MOONLET_ARG_U64
#define BOOL MOONLET_ARG_BOOL
#define CSTRS MOONLET_ARG_CSTR_ARRAY
#define U64S MOONLET_ARG_U64_ARRAY
#define TUPLES MOONLET_ARG_TUPLE_ARRAY

#define ARG MOONLET_RPC_ARG /* rpc_args.h: one row of an argument table */
/* tenant: nil for the RealClient's default */
#define TENANT(T) {ARG(T, tenant, CSTR, NULLABLE)}
#define TENANT_KEY(T) TENANT(T), {ARG(T, key, CSTR, 0)}
/* where the bytes are: an attached region's id and the offset in it */
#define IN_REGION(T) {ARG(T, region, U64, 0)}, {ARG(T, offset, U64, 0)}
#define PREFERRED_MAX 64 /* as moonlet_put_options */
/* the optional moonlet_put_options fields, last in Put and BatchPut alike */
#define PUT_OPTIONS(T)                                             \
    {ARG(T, skip_checksum, BOOL, OPT)},                            \
    {ARG(T, preferred_segments, CSTRS, OPT), .max = PREFERRED_MAX, \
     .elem_max = MOONLET_MAX_ID_BYTES},                            \
    {ARG(T, hard_pin, BOOL, OPT | WITH_PREV)},                     \
    {ARG(T, soft_pin_ttl_ms, U64, OPT | WITH_PREV)}

static const moonlet_rpc_arg attach_args[] = {
    {ARG(moonlet_dm_attach_args, version, U64, 0)},
    {ARG(moonlet_dm_attach_args, region, U64, 0)},
    {ARG(moonlet_dm_attach_args, size, U64, 0)},
};

static const moonlet_rpc_arg detach_args[] = {
    {ARG(moonlet_dm_detach_args, region, U64, 0)},
};

static const moonlet_rpc_arg put_args[] = {
    TENANT_KEY(moonlet_dm_put_args),
    IN_REGION(moonlet_dm_put_args),
    {ARG(moonlet_dm_put_args, len, U64, 0)},
    {ARG(moonlet_dm_put_args, replica_num, U64, 0), .max = UINT32_MAX},
    {ARG(moonlet_dm_put_args, soft_pin, BOOL, 0)},
    PUT_OPTIONS(moonlet_dm_put_args),
};

static const moonlet_rpc_arg get_args[] = {
    TENANT_KEY(moonlet_dm_get_args),
    IN_REGION(moonlet_dm_get_args),
    {ARG(moonlet_dm_get_args, cap, U64, 0)},
};

static const moonlet_rpc_arg key_args[] = {
    TENANT_KEY(moonlet_dm_key_args),
};

static const moonlet_rpc_arg remove_args[] = {
    TENANT_KEY(moonlet_dm_key_args),
    {ARG(moonlet_dm_key_args, force, BOOL, OPT)},
};

static const moonlet_rpc_arg remove_all_args[] = {
    TENANT(moonlet_dm_remove_all_args),
    {ARG(moonlet_dm_remove_all_args, force, BOOL, OPT)},
};

static const moonlet_rpc_arg batch_exist_args[] = {
    TENANT(moonlet_dm_batch_keys_args),
    {ARG(moonlet_dm_batch_keys_args, keys, CSTRS, 0)},
};

static const moonlet_rpc_arg batch_probe_args[] = {
    TENANT(moonlet_dm_batch_keys_args),
    {ARG(moonlet_dm_batch_keys_args, lease_mode, U64, 0), .max = UINT8_MAX},
    {ARG(moonlet_dm_batch_keys_args, candidate_size, U64, 0)},
    {ARG(moonlet_dm_batch_keys_args, keys, CSTRS, 0)},
};

static const moonlet_rpc_arg item_args[] = {
    {ARG(moonlet_dm_item, key, CSTR, 0)},
    IN_REGION(moonlet_dm_item),
    {ARG(moonlet_dm_item, len, U64, 0)},
};
static const moonlet_rpc_args_spec s_item = MOONLET_RPC_SPEC(moonlet_dm_item, item_args, false);

static const moonlet_rpc_arg batch_put_args[] = {
    TENANT(moonlet_dm_batch_put_args),
    {ARG(moonlet_dm_batch_put_args, replica_num, U64, 0), .max = UINT32_MAX},
    {ARG(moonlet_dm_batch_put_args, soft_pin, BOOL, 0)},
    {ARG(moonlet_dm_batch_put_args, items, TUPLES, 0), .item = &s_item},
    PUT_OPTIONS(moonlet_dm_batch_put_args),
};

static const moonlet_rpc_arg batch_get_args[] = {
    TENANT(moonlet_dm_batch_get_args),
    {ARG(moonlet_dm_batch_get_args, items, TUPLES, 0), .item = &s_item},
};

static const moonlet_rpc_arg probe_resume_args[] = {
    TENANT(moonlet_dm_probe_resume_args),
    {ARG(moonlet_dm_probe_resume_args, kv_keys, CSTRS, 0)},
    {ARG(moonlet_dm_probe_resume_args, candidate_size, U64, 0)},
    {ARG(moonlet_dm_probe_resume_args, kda_keys, CSTRS, 0)},
    {ARG(moonlet_dm_probe_resume_args, boundaries, U64S, 0)},
};

#define SPEC(name, T, arr) static const moonlet_rpc_args_spec name = MOONLET_RPC_SPEC(T, arr, false)
static const moonlet_rpc_args_spec s_attach = {attach_args, 3, sizeof(moonlet_dm_attach_args),
                                               false, true /* the memfd */};
SPEC(s_detach, moonlet_dm_detach_args, detach_args);
SPEC(s_put, moonlet_dm_put_args, put_args);
SPEC(s_get, moonlet_dm_get_args, get_args);
SPEC(s_key, moonlet_dm_key_args, key_args);
SPEC(s_remove, moonlet_dm_key_args, remove_args);
SPEC(s_remove_all, moonlet_dm_remove_all_args, remove_all_args);
SPEC(s_batch_exist, moonlet_dm_batch_keys_args, batch_exist_args);
SPEC(s_batch_probe, moonlet_dm_batch_keys_args, batch_probe_args);
SPEC(s_batch_put, moonlet_dm_batch_put_args, batch_put_args);
SPEC(s_batch_get, moonlet_dm_batch_get_args, batch_get_args);
SPEC(s_probe_resume, moonlet_dm_probe_resume_args, probe_resume_args);

const moonlet_rpc_method_decl moonlet_dummy_methods[] = {
    {MOONLET_DM_ATTACH, "Attach", &s_attach, 0, false},
    {MOONLET_DM_DETACH, "Detach", &s_detach, 0, false},
    {MOONLET_DM_PUT, "Put", &s_put, 0, false},
    {MOONLET_DM_UPSERT, "Upsert", &s_put, 0, false},
    {MOONLET_DM_GET, "Get", &s_get, 0, false},
    {MOONLET_DM_GET_SIZE, "GetSize", &s_key, 0, false},
    {MOONLET_DM_REMOVE, "Remove", &s_remove, 0, false},
    {MOONLET_DM_REMOVE_ALL, "RemoveAll", &s_remove_all, 0, false},
    {MOONLET_DM_EXIST_KEY, "ExistKey", &s_key, 0, false},
    {MOONLET_DM_PROBE_KEY, "ProbeKey", &s_key, 0, false},
    {MOONLET_DM_BATCH_EXIST_KEY, "BatchExistKey", &s_batch_exist, 0, false},
    {MOONLET_DM_BATCH_PROBE_KEY, "BatchProbeKey", &s_batch_probe, 0, false},
    {MOONLET_DM_BATCH_PUT, "BatchPut", &s_batch_put, 0, false},
    {MOONLET_DM_BATCH_GET, "BatchGet", &s_batch_get, 0, false},
    {MOONLET_DM_INSPECT_KEY, "InspectKey", &s_key, 0, false},
    {MOONLET_DM_PROBE_RESUME, "ProbeResume", &s_probe_resume, 0, false},
    {MOONLET_DM_BATCH_REPLICAS, "BatchReplicas", &s_batch_exist, 0, false},
};
const size_t moonlet_dummy_nmethods = sizeof(moonlet_dummy_methods) / sizeof(moonlet_dummy_methods[0]);

_Static_assert(sizeof(moonlet_dummy_methods) / sizeof(moonlet_dummy_methods[0]) ==
                   MOONLET_DM_LAST - MOONLET_DM_ATTACH + 1,
               "one row per method id");

const moonlet_rpc_method_decl *moonlet_dummy_method(uint32_t id)
{
    return id >= MOONLET_DM_ATTACH && id <= MOONLET_DM_LAST
               ? &moonlet_dummy_methods[id - MOONLET_DM_ATTACH]
               : NULL;
}
