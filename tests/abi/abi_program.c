/*
 * abi_program.c - a program that uses only the installed public headers,
 * built by tests/abi/check_abi.py with `pkg-config --cflags --libs moonlet`
 * against an installed copy of libmoonlet.so.  It exercises calls that need
 * no cluster: error names, the opts_size pattern of the config structs (an
 * older, shorter struct is never written past), create's refusal of a
 * config never initialised and of an unreachable master, and the K3 pure
 * helpers.  Exit status 0 when every check holds.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <moonlet/client.h>
#include <moonlet/k3.h>
#include <moonlet/real_client.h>

static int failures;

#define CHECK(cond)                                                   \
    do {                                                              \
        if (!(cond)) {                                                \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                               \
        }                                                             \
    } while (0)

int main(void)
{
    CHECK(strcmp(moonlet_strerror(MOONLET_ERR_OBJECT_NOT_FOUND), "OBJECT_NOT_FOUND") == 0);

    /* A caller built against an older header whose config ended before
     * `protocol`: init writes its bytes only, the canary after them stays. */
    union {
        moonlet_client_config cfg;
        unsigned char bytes[sizeof(moonlet_client_config)];
    } old;
    memset(old.bytes, 0xA5, sizeof old.bytes);
    size_t old_size = offsetof(moonlet_client_config, protocol);
    moonlet_client_config_init(&old.cfg, old_size);
    CHECK(old.cfg.opts_size == old_size);
    for (size_t i = old_size; i < sizeof old.bytes; i++)
        CHECK(old.bytes[i] == 0xA5);

    moonlet_client_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.master_addr = "127.0.0.1:1";
    moonlet_client *c = NULL;
    CHECK(moonlet_client_create(&cfg, &c) == MOONLET_ERR_INVALID_PARAMS); /* opts_size 0 */
    moonlet_real_client *rc = NULL;
    cfg.local_segment_size = 1u << 20;
    CHECK(moonlet_real_client_create(&cfg, "/nonexistent/moonlet.sock", NULL, &rc) ==
          MOONLET_ERR_INVALID_PARAMS);
    CHECK(rc == NULL);
    moonlet_client_config_init(&cfg, sizeof cfg);
    cfg.master_addr = "127.0.0.1:1"; /* nothing listens on port 1 */
    cfg.protocol = MOONLET_PROTOCOL_TCP;
    cfg.rpc_timeout_ms = 2000;
    CHECK(moonlet_client_create(&cfg, &c) == MOONLET_ERR_RPC_FAIL);
    CHECK(c == NULL);

    moonlet_dummy_config dcfg;
    moonlet_dummy_config_init(&dcfg, sizeof dcfg);
    CHECK(dcfg.opts_size == sizeof dcfg);
    CHECK(moonlet_client_create_dummy("/nonexistent/moonlet.sock", &dcfg, &c) ==
          MOONLET_ERR_RPC_FAIL);

    int32_t exist[4] = {1, 1, 1, 0};
    uint64_t prefix = 0, boundary = 0;
    CHECK(moonlet_k3_kv_boundary(exist, 4, 16, 1000, &prefix, &boundary) == MOONLET_OK);
    CHECK(prefix == 3 && boundary == 48);

    moonlet_free(NULL);
    if (failures)
        return 1;
    printf("abi_program: every check holds\n");
    return 0;
}
