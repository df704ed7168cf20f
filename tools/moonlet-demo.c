/*
 * moonlet-demo - the Quick start walk-through.
 *
 * Connects to a master, mounts a small demonstration segment, puts the K3
 * example (KDA checkpoints 128, 256, 384 with two rank keys each, where 256
 * lacks rank 0 and 384 lacks rank 1), then shows ExistKey, BatchExistKey,
 * BatchProbeKey with NONE and with LAST_HIT_ONLY, and the lease each key
 * holds afterwards, read back through the inspection RPC.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "master_client.h"
#include "moonlet/error.h"

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

static void show_leases(moonlet_master_client *mc, const char *tenant)
{
    printf("  leases now:");
    for (int i = 0; i < 6; i++) {
        cJSON *j = NULL;
        if (moonlet_mc_inspect_key(mc, tenant, K3[i], &j) == MOONLET_OK) {
            printf(" %s=%.0fms", K3[i], cJSON_GetObjectItem(j, "lease_remaining_ms")->valuedouble);
            cJSON_Delete(j);
        }
    }
    printf("\n");
}

int main(int argc, char **argv)
{
    const char *addr = argc > 1 ? argv[1] : "127.0.0.1:50051";
    const char *tenant = "demo";
    moonlet_master_client *mc;
    if (check(moonlet_mc_create(addr, NULL, &mc), "connect"))
        return 1;
    printf("connected to master %s\n", addr);
    moonlet_segment_desc seg = {.client_id = "demo-node", .segment_id = "demo-segment",
                                .name = "demo", .size = 16 << 20, .endpoint = "127.0.0.1:0",
                                .protocol = "tcp"};
    int rc = moonlet_mc_mount_segment(mc, &seg);
    if (rc && rc != MOONLET_ERR_SEGMENT_ALREADY_EXISTS && check(rc, "mount"))
        return 1;
    const int present[] = {0, 1, 3, 4}; /* 256 lacks rank 0, 384 lacks rank 1 */
    for (int i = 0; i < 4; i++) {
        moonlet_replica_list l;
        rc = moonlet_mc_put_start(mc, tenant, K3[present[i]], 4096, 1, false, &l);
        if (rc == MOONLET_ERR_OBJECT_ALREADY_EXISTS)
            continue;
        if (check(rc, "PutStart"))
            return 1;
        printf("put %-12s -> segment %s offset %llu\n", K3[present[i]], l.replicas[0].segment_id,
               (unsigned long long)l.replicas[0].offset);
        moonlet_replica_list_free(&l);
        if (check(moonlet_mc_put_end(mc, tenant, K3[present[i]]), "PutEnd"))
            return 1;
    }
    int32_t r[6];
    printf("\nprobing checkpoints 128, 256, 384 (two rank keys each):\n");
    moonlet_grant_lease_policy none = MOONLET_GRANT_LEASE_POLICY_DEFAULT;
    if (check(moonlet_mc_batch_probe_key(mc, tenant, none, K3, 6, r), "BatchProbeKey(NONE)"))
        return 1;
    show("BatchProbeKey(NONE):", r);
    show_leases(mc, tenant);
    moonlet_grant_lease_policy last = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 2};
    if (check(moonlet_mc_batch_probe_key(mc, tenant, last, K3, 6, r), "BatchProbeKey(LAST_HIT_ONLY)"))
        return 1;
    show("BatchProbeKey(LAST_HIT_ONLY, 2):", r);
    show_leases(mc, tenant);
    printf("  -> checkpoint 128 is the last complete one; only its 2 keys were leased\n");
    if (check(moonlet_mc_batch_exist_key(mc, tenant, K3, 6, r), "BatchExistKey"))
        return 1;
    show("BatchExistKey (leases every hit):", r);
    show_leases(mc, tenant);
    moonlet_mc_unmount_segment(mc, "demo-node", "demo-segment");
    moonlet_mc_destroy(mc);
    return 0;
}
