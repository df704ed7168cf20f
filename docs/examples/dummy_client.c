/*
 * dummy_client.c - the DummyClient example of docs/client-layers.md.
 *
 * Connects to the RealClient serving on argv[1], stores and reads an object
 * through the shared staging area, does the same zero-copy from memory of
 * moonlet_client_alloc_shared(), probes the K3 checkpoints with
 * LAST_HIT_ONLY and prints what the master says about a key.  Exits 0 when
 * every call did what the comments say.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moonlet/client.h"

#define CHECK(call)                                                                        \
    do {                                                                                   \
        int rc_ = (call);                                                                  \
        if (rc_) {                                                                         \
            fprintf(stderr, "%s: %s\n", #call, moonlet_strerror(rc_));                     \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s SOCKET_PATH\n", argv[0]);
        return 2;
    }
    moonlet_client *c;
    CHECK(moonlet_client_create_dummy(argv[1], NULL, &c)); /* NULL: default config */
    printf("connected; the RealClient moves bytes over %s\n", moonlet_client_protocol(c));

    /* copying calls: bytes go through the connection's shared staging area */
    const char msg[] = "hello from a DummyClient";
    CHECK(moonlet_client_put(c, "example/hello", msg, sizeof(msg), NULL));
    char back[64];
    size_t len;
    CHECK(moonlet_client_get(c, "example/hello", back, sizeof(back), NULL, &len));
    printf("get: %zu bytes: %s\n", len, back);

    /* zero-copy: memory shared with the RealClient */
    char *sh;
    CHECK(moonlet_client_alloc_shared(c, 1 << 20, (void **)&sh));
    memset(sh, 'x', 1 << 20);
    CHECK(moonlet_client_put_from(c, "example/big", sh, 1 << 20, NULL));
    CHECK(moonlet_client_get_into(c, "example/big", sh, 1 << 20, NULL, &len));
    printf("put_from / get_into: %zu bytes, no copy on this side\n", len);
    CHECK(moonlet_client_free_shared(c, sh));

    /* K3: checkpoint 256 lacks rank 0, 384 lacks rank 1 */
    const char *keys[6] = {"kda/128/r0", "kda/128/r1", "kda/256/r0",
                           "kda/256/r1", "kda/384/r0", "kda/384/r1"};
    for (int i = 0; i < 6; i++)
        if (i != 2 && i != 5)
            CHECK(moonlet_client_put(c, keys[i], "state", 5, NULL));
    int32_t hit[6];
    moonlet_grant_lease_policy last = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 2};
    CHECK(moonlet_client_batch_probe_key(c, keys, 6, last, NULL, hit));
    printf("LAST_HIT_ONLY: [%d, %d, %d, %d, %d, %d]\n", hit[0], hit[1], hit[2], hit[3], hit[4],
           hit[5]);

    char *json;
    CHECK(moonlet_client_inspect_key(c, "kda/128/r0", NULL, &json));
    printf("inspect kda/128/r0: %s\n", json);
    moonlet_free(json);
    moonlet_client_destroy(c);
    return 0;
}
