/*
 * engine_client.c - an inference engine's KV offload on moonlet's C API, in
 * place of Mooncake's C++ client (docs/api-c.md, "From Mooncake's C++
 * client").  Valid C11 and C++ (the build compiles it as both).
 *
 * What an engine's Mooncake store backend does, with moonlet's calls:
 *   setup          -> moonlet_client_create (master address, protocol,
 *                     local segment) or moonlet_client_create_dummy (the
 *                     host's RealClient)
 *   register the host KV pool           -> moonlet_client_register_buffer
 *   exists / lookup by leading hits      -> moonlet_client_batch_exist_key
 *   put of page blocks from the pool     -> moonlet_client_batch_put_from
 *   load into the pool                   -> moonlet_client_batch_get_into
 *   remove / clear                       -> moonlet_client_remove / _remove_all
 *   teardown                             -> unregister, moonlet_client_destroy
 *
 * Usage: engine_client MASTER_ADDR        (a direct client)
 *        engine_client --dummy SOCKET     (through a RealClient)
 * Prints what each step returned; exits 0 when every step returned what the
 * comments say, 1 otherwise.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moonlet/client.h"

#define PAGES 8
#define PAGE_BYTES 16384

static int fail(const char *what, int rc)
{
    fprintf(stderr, "%s: %s (%d)\n", what, moonlet_strerror(rc), rc);
    return 1;
}

int main(int argc, char **argv)
{
    moonlet_client *c = NULL;
    int rc;
    if (argc == 3 && strcmp(argv[1], "--dummy") == 0) {
        rc = moonlet_client_create_dummy(argv[2], NULL, &c);
    } else if (argc == 2) {
        moonlet_client_config cfg;
        moonlet_client_config_init(&cfg, sizeof cfg);
        cfg.master_addr = argv[1];            /* Mooncake: master_server_address */
        cfg.protocol = MOONLET_PROTOCOL_TCP;  /* Mooncake: protocol "tcp" */
        cfg.local_segment_size = 32u << 20;   /* Mooncake: global_segment_size */
        rc = moonlet_client_create(&cfg, &c);
    } else {
        fprintf(stderr, "usage: %s MASTER_ADDR | --dummy SOCKET\n", argv[0]);
        return 2;
    }
    if (rc)
        return fail("setup", rc);

    /* The host KV pool: the engine's pages, registered once. */
    size_t pool_bytes = (size_t)2 * PAGES * PAGE_BYTES;
    unsigned char *pool = (unsigned char *)malloc(pool_bytes);
    if (!pool)
        return 1;
    for (size_t i = 0; i < pool_bytes / 2; i++)
        pool[i] = (unsigned char)(i * 31 + 7);
    memset(pool + pool_bytes / 2, 0, pool_bytes / 2);
    if ((rc = moonlet_client_register_buffer(c, pool, pool_bytes)))
        return fail("register_buffer", rc);

    char names[PAGES][64];
    const char *keys[PAGES];
    const void *src[PAGES];
    void *dst[PAGES];
    size_t sizes[PAGES], lens[PAGES];
    int32_t results[PAGES];
    for (int i = 0; i < PAGES; i++) {
        snprintf(names[i], sizeof(names[i]), "engine-example/%ld/%d", (long)getpid(), i);
        keys[i] = names[i];
        src[i] = pool + (size_t)i * PAGE_BYTES;
        dst[i] = pool + pool_bytes / 2 + (size_t)i * PAGE_BYTES;
        sizes[i] = PAGE_BYTES;
    }

    /* Put the first 6 pages (Mooncake: batch_put_from -> 0 per key). */
    if ((rc = moonlet_client_batch_put_from(c, keys, 6, src, sizes, NULL, results)))
        return fail("batch_put_from", rc);
    printf("put 6 pages: %d %d %d %d %d %d\n", results[0], results[1], results[2], results[3],
           results[4], results[5]);

    /* Lookup: how many leading pages are stored (Mooncake: batch_is_exist). */
    int32_t hit[PAGES];
    if ((rc = moonlet_client_batch_exist_key(c, keys, PAGES, NULL, hit)))
        return fail("batch_exist_key", rc);
    int leading = 0;
    while (leading < PAGES && hit[leading] == 1)
        leading++;
    printf("lookup: %d leading hits\n", leading);
    if (leading != 6)
        return 1;

    /* Load them into the pool's second half (Mooncake: batch_get_into ->
     * bytes read per key). */
    rc = moonlet_client_batch_get_into(c, keys, (size_t)leading, dst, sizes, NULL, lens, results);
    if (rc)
        return fail("batch_get_into", rc);
    if (memcmp(pool, pool + pool_bytes / 2, (size_t)leading * PAGE_BYTES) != 0) {
        fprintf(stderr, "load: bytes differ\n");
        return 1;
    }
    printf("load: %d pages, %zu bytes each, bytes equal\n", leading, lens[0]);

    /* A missing page is its own code; the call as a whole returns it too. */
    rc = moonlet_client_batch_get_into(c, keys + 6, 1, dst, sizes, NULL, lens, results);
    printf("load of a missing page: %d (%s)\n", results[0], moonlet_strerror(results[0]));
    if (results[0] != MOONLET_ERR_OBJECT_NOT_FOUND)
        return 1;

    /* Remove: the pages just read are leased (OBJECT_HAS_LEASE); remove_all
     * takes what no lease holds. */
    rc = moonlet_client_remove(c, keys[0], NULL);
    printf("remove of a page just read: %d (%s)\n", rc, moonlet_strerror(rc));
    uint64_t removed = 0;
    if ((rc = moonlet_client_remove_all(c, NULL, &removed)))
        return fail("remove_all", rc);
    printf("remove_all: ok\n");

    if ((rc = moonlet_client_unregister_buffer(c, pool)))
        return fail("unregister_buffer", rc);
    moonlet_client_destroy(c);
    free(pool);
    return 0;
}
