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
 * holds afterwards.  Leases and replica placement are read back through the
 * master's inspection RPC (MasterClient): inspection is an operator's view,
 * not part of the client API.  Exit code 0 when every step succeeded.
 * Single-threaded; takes no locks.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "master_client.h"
#include "moonlet/client.h"

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

static void show_leases(moonlet_master_client *mc)
{
    printf("  leases now:");
    for (int i = 0; i < 6; i++) {
        cJSON *j = NULL;
        if (moonlet_mc_inspect_key(mc, TENANT, K3[i], &j) == 0) {
            printf(" %s=%.0fms", K3[i], cJSON_GetObjectItem(j, "lease_remaining_ms")->valuedouble);
            cJSON_Delete(j);
        }
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
        rc = check(moonlet_client_get(c, key, in, BLOB_BYTES, &len, NULL), "Get");
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
    if (check(moonlet_client_batch_probe_key(c, none, K3, 6, r, NULL), "BatchProbeKey(NONE)"))
        return 1;
    show("BatchProbeKey(NONE):", r);
    show_leases(mc);
    moonlet_grant_lease_policy last = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 2};
    if (check(moonlet_client_batch_probe_key(c, last, K3, 6, r, NULL), "BatchProbeKey(LAST_HIT_ONLY)"))
        return 1;
    show("BatchProbeKey(LAST_HIT_ONLY, 2):", r);
    show_leases(mc);
    printf("  -> checkpoint 128 is the last complete one; only its 2 keys were leased\n");
    if (check(moonlet_client_batch_exist_key(c, K3, 6, r, NULL), "BatchExistKey"))
        return 1;
    show("BatchExistKey (leases every hit):", r);
    show_leases(mc);
    return 0;
}

int main(int argc, char **argv)
{
    const char *addr = argc > 1 ? argv[1] : "127.0.0.1:50051";
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg);
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
    moonlet_mc_destroy(mc);
    moonlet_client_destroy(c);
    return rc ? 1 : 0;
}
