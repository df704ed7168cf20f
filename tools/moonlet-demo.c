/*
 * moonlet-demo - the Quick start walk-through, written against the public
 * client API (include/moonlet/client.h).
 *
 * Needs a master and at least one moonlet-store (scripts/quickstart.sh
 * starts both).  It puts a 1 MiB object through the data-plane transport and
 * reads it back (bytes written, bytes read, whether they match), then puts
 * the K3 example (KDA checkpoints 128, 256, 384 with two rank keys each,
 * where 256 lacks rank 0 and 384 lacks rank 1) and shows BatchProbeKey with
 * NONE and with LAST_HIT_ONLY, and BatchExistKey, with the lease each key
 * holds afterwards.  It ends with the K3 lookup helper (include/moonlet/k3.h)
 * on a small synthetic request: KV blocks plus three checkpoints of which
 * the last is incomplete; it prints the selected checkpoint, the keys to
 * load and which keys the lookup leased (one ProbeResume: the checkpoint and
 * the KV blocks below it).  Leases and replica placement are
 * read back through the master's inspection RPC (MasterClient): inspection is
 * an operator's view, not part of the client API.  Exit code 0 when every
 * step succeeded.
 * Single-threaded; takes no locks.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "master_client.h"
#include "moonlet/client.h"
#include "moonlet/k3.h"

#define TENANT "demo"
#define BLOB_BYTES (1u << 20)

static const char *const K3[] = {"kda/128/r0", "kda/128/r1", "kda/256/r0",
                                 "kda/256/r1", "kda/384/r0", "kda/384/r1"};

static int check(int rc, const char *what)
{
    if (rc)
        fprintf(stderr, "moonlet-demo: %s failed: %s (%d)\n", what, moonlet_strerror(rc), rc);
    return rc;
}

static void show(const char *title, const int32_t *r)
{
    printf("  %-34s [", title);
    for (int i = 0; i < 6; i++)
        printf("%s%s", i ? ", " : "", r[i] == 1 ? "T" : r[i] == 0 ? "F" : moonlet_strerror(r[i]));
    printf("]\n");
}

/* Lease time left on a key, or -1 when it cannot be inspected. */
static double lease_left(moonlet_master_client *mc, const char *key)
{
    return moonlet_mc_inspect_number(mc, TENANT, key, "lease_remaining_ms");
}

static void show_leases(moonlet_master_client *mc)
{
    printf("  leases now:");
    for (int i = 0; i < 6; i++) {
        double ms = lease_left(mc, K3[i]);
        if (ms >= 0)
            printf(" %s=%.0fms", K3[i], ms);
    }
    printf("\n");
}

/* Where the master placed a key: "tcp://127.0.0.1:40123 (segment 9f3c...)". */
static void show_placement(moonlet_master_client *mc, const char *key)
{
    cJSON *j = NULL, *r;
    if (moonlet_mc_inspect_key(mc, TENANT, key, &j) != 0)
        return;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(j, "replicas")) {
        printf("    replica on %s://%s, segment %s, offset %.0f\n",
               cJSON_GetStringValue(cJSON_GetObjectItem(r, "protocol")),
               cJSON_GetStringValue(cJSON_GetObjectItem(r, "endpoint")),
               cJSON_GetStringValue(cJSON_GetObjectItem(r, "segment_id")),
               cJSON_GetObjectItem(r, "offset")->valuedouble);
    }
    cJSON_Delete(j);
}

/* A 1 MiB object through the transport and back. */
static int demo_put_get(moonlet_client *c, moonlet_master_client *mc)
{
    char key[64];
    snprintf(key, sizeof(key), "demo/blob-%ld", (long)getpid());
    unsigned char *out = malloc(BLOB_BYTES), *in = malloc(BLOB_BYTES);
    if (!out || !in) {
        free(out);
        free(in);
        return check(MOONLET_ERR_INTERNAL_ERROR, "malloc");
    }
    for (size_t i = 0; i < BLOB_BYTES; i++)
        out[i] = (unsigned char)(i * 2654435761u >> 24);
    int rc = check(moonlet_client_put(c, key, out, BLOB_BYTES, NULL), "Put");
    size_t len = 0;
    if (!rc) {
        printf("put %s: %u bytes written through the %s transport\n", key, BLOB_BYTES,
               moonlet_client_protocol(c));
        show_placement(mc, key);
        rc = check(moonlet_client_get(c, key, in, BLOB_BYTES, NULL, &len), "Get");
    }
    if (!rc) {
        bool same = len == BLOB_BYTES && memcmp(in, out, BLOB_BYTES) == 0;
        printf("get %s: %zu bytes read, %s\n", key, len,
               same ? "identical to what was written" : "DIFFERENT from what was written");
        rc = same ? 0 : 1;
    }
    free(out);
    free(in);
    return rc;
}

/* The K3 example and the three ways of asking about it. */
static int demo_probe(moonlet_client *c, moonlet_master_client *mc)
{
    unsigned char block[4096];
    memset(block, 0x5a, sizeof(block));
    const int present[] = {0, 1, 3, 4}; /* 256 lacks rank 0, 384 lacks rank 1 */
    for (int i = 0; i < 4; i++) {
        int rc = moonlet_client_put(c, K3[present[i]], block, sizeof(block), NULL);
        if (rc == MOONLET_ERR_OBJECT_ALREADY_EXISTS)
            continue; /* left by an earlier run against the same master */
        if (check(rc, "Put"))
            return 1;
        printf("put %-12s %zu bytes\n", K3[present[i]], sizeof(block));
    }
    int32_t r[6];
    printf("\nprobing checkpoints 128, 256, 384 (two rank keys each):\n");
    moonlet_grant_lease_policy none = MOONLET_GRANT_LEASE_POLICY_DEFAULT;
    if (check(moonlet_client_batch_probe_key(c, K3, 6, none, NULL, r), "BatchProbeKey(NONE)"))
        return 1;
    show("BatchProbeKey(NONE):", r);
    show_leases(mc);
    moonlet_grant_lease_policy last = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 2};
    if (check(moonlet_client_batch_probe_key(c, K3, 6, last, NULL, r), "BatchProbeKey(LAST_HIT_ONLY)"))
        return 1;
    show("BatchProbeKey(LAST_HIT_ONLY, 2):", r);
    show_leases(mc);
    printf("  -> checkpoint 128 is the last complete one; only its 2 keys were leased\n");
    if (check(moonlet_client_batch_exist_key(c, K3, 6, NULL, r), "BatchExistKey"))
        return 1;
    show("BatchExistKey (leases every hit):", r);
    show_leases(mc);
    return 0;
}

/* The synthetic request of demo_k3_lookup(): a 500-token prompt in 128-token
 * blocks (4 KV blocks), checkpoints at 128, 256 and 384 with two rank keys
 * each; 384 lacks rank 1. */
#define REQ_PROMPT 500
#define REQ_BLOCK 128
#define REQ_BLOCKS 4
static const uint64_t REQ_CKPTS[] = {128, 256, 384};

static int req_key(void *ctx, const moonlet_k3_key_id *id, char *buf, size_t cap)
{
    (void)ctx;
    if (id->kind == MOONLET_K3_KEY_KV)
        return snprintf(buf, cap, "req/kv/%llu", (unsigned long long)id->block);
    return snprintf(buf, cap, "req/kda/%llu/r%u", (unsigned long long)id->position, id->rank);
}

/* The K3 lookup helper on a synthetic request. */
static int demo_k3_lookup(moonlet_client *c, moonlet_master_client *mc)
{
    const moonlet_k3_layout layout = {.block_tokens = REQ_BLOCK, .groups = 1, .ranks = 2,
                                      .components = 1};
    unsigned char block[4096];
    memset(block, 0x6b, sizeof(block));
    char key[64];
    moonlet_k3_key_id id = {.kind = MOONLET_K3_KEY_KV};
    for (id.block = 0; id.block < REQ_BLOCKS; id.block++) {
        req_key(NULL, &id, key, sizeof(key));
        int rc = moonlet_client_put(c, key, block, sizeof(block), NULL);
        if (rc && rc != MOONLET_ERR_OBJECT_ALREADY_EXISTS)
            return check(rc, "Put");
    }
    id = (moonlet_k3_key_id){.kind = MOONLET_K3_KEY_KDA};
    for (int i = 0; i < 3; i++)
        for (id.rank = 0; id.rank < 2; id.rank++) {
            id.position = REQ_CKPTS[i];
            if (id.position == 384 && id.rank == 1)
                continue; /* the incomplete checkpoint */
            req_key(NULL, &id, key, sizeof(key));
            int rc = moonlet_client_put(c, key, block, sizeof(block), NULL);
            if (rc && rc != MOONLET_ERR_OBJECT_ALREADY_EXISTS)
                return check(rc, "Put");
        }
    printf("K3 lookup of a %d-token prompt: %d KV blocks of %d tokens, checkpoints at 128, 256 "
           "and 384 (two rank keys each; 384 lacks rank 1)\n",
           REQ_PROMPT, REQ_BLOCKS, REQ_BLOCK);
    moonlet_k3_request req = {.prompt_tokens = REQ_PROMPT, .kv_blocks = REQ_BLOCKS,
                              .checkpoints = REQ_CKPTS, .n_checkpoints = 3,
                              .recompute_last_token = true};
    moonlet_k3_result res;
    if (check(moonlet_k3_lookup(c, &layout, &req, req_key, NULL, NULL, &res), "K3 lookup"))
        return 1;
    printf("  KV boundary %llu tokens; %zu candidate checkpoints; %u round trip%s\n",
           (unsigned long long)res.kv_boundary, res.candidates, res.rpcs, res.rpcs == 1 ? "" : "s");
    if (res.checkpoint == MOONLET_K3_NONE)
        printf("  no complete checkpoint: prefill from token 0\n");
    else
        printf("  selected checkpoint %llu: resume at token %llu, prefill %llu tokens\n",
               (unsigned long long)res.resume_position, (unsigned long long)res.resume_position,
               (unsigned long long)(REQ_PROMPT - res.resume_position));
    printf("  keys to load:");
    for (size_t i = 0; i < res.kv_keys + res.kda_keys; i++)
        printf(" %s", res.keys[i]);
    printf("\n  leased by the lookup (lease ms left):\n   ");
    id = (moonlet_k3_key_id){.kind = MOONLET_K3_KEY_KV};
    size_t kv_leased = 0;
    for (id.block = 0; id.block < REQ_BLOCKS; id.block++) {
        req_key(NULL, &id, key, sizeof(key));
        double ms = lease_left(mc, key);
        printf(" %s=%.0f", key, ms);
        kv_leased += ms > 0;
    }
    printf("\n   ");
    size_t leased = 0;
    id = (moonlet_k3_key_id){.kind = MOONLET_K3_KEY_KDA};
    for (int i = 0; i < 3; i++)
        for (id.rank = 0; id.rank < 2; id.rank++) {
            id.position = REQ_CKPTS[i];
            req_key(NULL, &id, key, sizeof(key));
            double ms = lease_left(mc, key);
            if (ms < 0)
                printf(" %s=absent", key);
            else
                printf(" %s=%.0f", key, ms);
            leased += ms > 0;
        }
    int rc = leased == res.kda_keys && kv_leased == res.kv_leased ? 0 : 1;
    printf("\n  -> %zu KDA keys and %zu KV keys hold a lease: %s\n", leased, kv_leased,
           rc ? "NOT only what the lookup reported" : "only the selected checkpoint's and the "
                                                     "KV blocks the lookup reported");
    moonlet_k3_result_free(&res);
    return rc;
}

int main(int argc, char **argv)
{
    const char *addr = argc > 1 ? argv[1] : "127.0.0.1:50051";
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg, sizeof cfg);
    cfg.master_addr = addr;
    cfg.protocol = MOONLET_PROTOCOL_TCP; /* what scripts/quickstart.sh's store serves */
    cfg.default_tenant = TENANT;
    moonlet_client *c;
    if (check(moonlet_client_create(&cfg, &c), "connect"))
        return 1;
    moonlet_master_client *mc;
    if (check(moonlet_mc_create(addr, NULL, &mc), "connect (inspection)")) {
        moonlet_client_destroy(c);
        return 1;
    }
    printf("connected to master %s\n", addr);
    moonlet_client_remove_all(c, NULL, NULL); /* what an earlier run left unleased */
    int rc = demo_put_get(c, mc);
    if (!rc) {
        printf("\n");
        rc = demo_probe(c, mc);
    }
    if (!rc) {
        printf("\n");
        rc = demo_k3_lookup(c, mc);
    }
    moonlet_mc_destroy(mc);
    moonlet_client_destroy(c);
    return rc ? 1 : 0;
}
