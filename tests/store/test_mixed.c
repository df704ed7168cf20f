/*
 * Mixed clusters on the host (TCP only): a segment mounted with two
 * endpoints of the same memory - a fake RDMA one (an address nobody serves)
 * and a real TCP one served by this process - as `moonlet-store --protocol
 * both` mounts it on an RDMA host.
 *
 * Shows that the second endpoint round-trips through MountSegment,
 * ListSegments, GetReplicaList and InspectKey; that a TCP client writes (with
 * the capability, which names the TCP registration) and reads that replica
 * through its TCP endpoint and never touches the RDMA one; that a replica a
 * client cannot speak to fails a put with UNAVAILABLE_IN_CURRENT_STATUS while
 * a get falls over to another replica; and the per-replica choice itself
 * (moonlet_client_pick_endpoint) for every combination.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>

#include "../common/cluster.h"
#include "client_internal.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "writecap.h"
#include "xfer.h"

#define SEG_BYTES ((uint64_t)16 << 20)
#define FAKE_RDMA_EP "192.0.2.1:4791" /* TEST-NET-1: routed nowhere */

static test_proc g_master;
static moonlet_master_client *g_mc;
static moonlet_xfer *g_srv;            /* serves the dual segment's TCP endpoint */
static void *g_mem;
static moonlet_xfer_segment_info g_info;
static char g_fake_rdma_id[128];

static int setup(void **state)
{
    (void)state;
    static const char *const flags[] = {"--client_live_ttl_sec", "60", NULL};
    if (cl_start_master(&g_master, flags) || moonlet_mc_create(g_master.addr, NULL, &g_mc))
        return -1;
    moonlet_xfer_opts xo = {.protocol = MOONLET_XFER_TCP, .listen_addr = "127.0.0.1:0"};
    if (moonlet_xfer_create(&xo, &g_srv) || posix_memalign(&g_mem, 4096, SEG_BYTES))
        return -1;
    memset(g_mem, 0, SEG_BYTES);
    if (moonlet_xfer_register_segment(g_srv, g_mem, SEG_BYTES, &g_info))
        return -1;
    uint8_t key[MOONLET_WRITECAP_KEY_BYTES];
    if (moonlet_writecap_new_key(key) || moonlet_xfer_set_segment_key(g_srv, g_info.segment_id, key))
        return -1;
    /* An RDMA-style id: id.rkey.base.size, as the verbs backend makes them. */
    snprintf(g_fake_rdma_id, sizeof(g_fake_rdma_id), "0123456789abcdef.00001234.%016llx.%016llx",
             (unsigned long long)(uintptr_t)g_mem, (unsigned long long)SEG_BYTES);
    moonlet_segment_desc d = {.client_id = "dual-node", .segment_id = g_fake_rdma_id,
                              .name = "dual", .base = (uint64_t)(uintptr_t)g_mem,
                              .size = SEG_BYTES, .endpoint = FAKE_RDMA_EP, .protocol = "rdma",
                              .write_key = key, .node_clock_ms = moonlet_xfer_now_ms(),
                              .alt_endpoint = g_info.endpoint,
                              .alt_segment_id = g_info.segment_id, .alt_protocol = "tcp"};
    return moonlet_mc_mount_segment(g_mc, &d) ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    moonlet_mc_destroy(g_mc);
    moonlet_xfer_destroy(g_srv);
    free(g_mem);
    proc_stop(&g_master);
    return 0;
}

static moonlet_client *tcp_client(uint32_t replicas)
{
    moonlet_client_config cfg = cl_client_config(g_master.addr);
    cfg.replica_num = replicas;
    cfg.transfer_timeout_ms = 2000;
    return cl_client_of(&cfg);
}

/* ---- the per-replica choice (pure) ----------------------------------------------- */

/* moonlet_client_pick_endpoint() on r for a client of `proto` (adding TCP
 * when add_tcp) chooses protocol want_proto, endpoint want_ep and segment
 * want_seg (NULL: not checked). */
static void assert_pick(const moonlet_replica_desc *r, const char *proto, bool add_tcp,
                        const char *want_proto, const char *want_ep, const char *want_seg)
{
    const char *ep, *seg, *got_proto;
    assert_int_equal(moonlet_client_pick_endpoint(r, proto, add_tcp, &ep, &seg, &got_proto), 0);
    if (want_proto)
        assert_string_equal(got_proto, want_proto);
    if (want_ep)
        assert_string_equal(ep, want_ep);
    assert_string_equal(seg, want_seg);
}

static void test_pick_endpoint(void **state)
{
    (void)state;
    moonlet_replica_desc dual = {.segment_id = "R", .endpoint = "10.0.0.1:1", .protocol = "rdma",
                                 .alt_segment_id = "T", .alt_endpoint = "10.0.0.1:2",
                                 .alt_protocol = "tcp"};
    moonlet_replica_desc rdma = {.segment_id = "R2", .endpoint = "10.0.0.2:1", .protocol = "rdma"};
    moonlet_replica_desc tcp = {.segment_id = "T3", .endpoint = "10.0.0.3:2", .protocol = "tcp"};
    /* RDMA client: RDMA where offered, TCP (its added instance) otherwise. */
    assert_pick(&dual, "rdma", true, "rdma", "10.0.0.1:1", "R");
    assert_pick(&tcp, "rdma", true, "tcp", NULL, "T3");
    /* TCP client: the dual node's TCP endpoint; an RDMA-only node: no. */
    assert_pick(&dual, "tcp", false, "tcp", "10.0.0.1:2", "T");
    assert_pick(&tcp, "tcp", false, NULL, NULL, "T3");
    const char *ep, *seg, *proto;
    assert_int_equal(moonlet_client_pick_endpoint(&rdma, "tcp", false, &ep, &seg, &proto),
                     MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    /* An RDMA client that may not add TCP cannot use a TCP-only node. */
    assert_int_equal(moonlet_client_pick_endpoint(&tcp, "rdma", false, &ep, &seg, &proto),
                     MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    /* Such a replica is one a get moves past. */
    assert_true(moonlet_client_try_next_replica(MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS));
}

/* ---- descriptors over the wire --------------------------------------------------------- */

static void test_segment_descriptor_round_trip(void **state)
{
    (void)state;
    cJSON *segs = NULL;
    assert_int_equal(moonlet_mc_list_segments(g_mc, &segs), MOONLET_OK);
    const cJSON *s, *found = NULL;
    cJSON_ArrayForEach(s, segs)
        if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(s, "segment_id")), g_fake_rdma_id) == 0)
            found = s;
    assert_non_null(found);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(found, "protocol")), "rdma");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(found, "endpoint")), FAKE_RDMA_EP);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(found, "alt_protocol")), "tcp");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(found, "alt_endpoint")),
                        g_info.endpoint);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(found, "alt_segment_id")),
                        g_info.segment_id);
    cJSON_Delete(segs);

    /* A half-given second endpoint, or one of the same protocol, is refused. */
    uint8_t key[MOONLET_WRITECAP_KEY_BYTES] = {1};
    moonlet_segment_desc d = {.client_id = "bad-node", .segment_id = "bad-seg", .size = SEG_BYTES,
                              .endpoint = "127.0.0.1:9", .protocol = "rdma", .write_key = key,
                              .node_clock_ms = 1, .alt_endpoint = "127.0.0.1:10",
                              .alt_segment_id = "bad-alt", .alt_protocol = "rdma"};
    assert_int_equal(moonlet_mc_mount_segment(g_mc, &d), MOONLET_ERR_INVALID_PARAMS);
    d.write_key = NULL; /* the trailing args come after the key */
    d.alt_protocol = "tcp";
    assert_int_equal(moonlet_mc_mount_segment(g_mc, &d), MOONLET_ERR_INVALID_PARAMS);
}

/* moonlet-store --protocol both: its flag rules, and a host without an RDMA
 * device (this one) refused at start like --protocol rdma, never a silent
 * TCP-only node. */
static void test_store_both_flags(void **state)
{
    (void)state;
    char *m = g_master.addr;
    char *lone_tcp[] = {"tools/moonlet-store", "--master", m, "--tcp-listen", "127.0.0.1:0", NULL};
    char *adv[] = {"tools/moonlet-store", "--master", m, "--protocol", "both", "--advertise",
                   "10.0.0.1:7000", NULL};
    char *dummy[] = {"tools/moonlet-store", "--master", m, "--protocol", "both", "--serve-dummy",
                     "/tmp/moonlet-mixed-never.sock", NULL};
    char *no_dev[] = {"tools/moonlet-store", "--master", m, "--protocol", "both",
                      "--segment-size", "4MiB", "--log-level", "error", NULL};
    assert_int_equal(cl_run_exit_code(lone_tcp, 10000), 2);
    assert_int_equal(cl_run_exit_code(adv, 10000), 2);
    assert_int_equal(cl_run_exit_code(dummy, 10000), 2);
    assert_int_equal(cl_run_exit_code(no_dev, 20000), 1);
}

/* moonlet-inspect shows both endpoints, in JSON and in the table. */
static void test_inspect_shows_both(void **state)
{
    (void)state;
    char cmd[512], out[8192];
    const char *forms[] = {"--json segments", "segments"};
    for (int f = 0; f < 2; f++) {
        snprintf(cmd, sizeof(cmd), "COLUMNS=400 tools/moonlet-inspect --master %s %s", g_master.addr,
                 forms[f]);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        size_t n = fread(out, 1, sizeof(out) - 1, p);
        out[n] = 0;
        assert_int_equal(pclose(p), 0);
        assert_non_null(strstr(out, FAKE_RDMA_EP));
        assert_non_null(strstr(out, g_info.endpoint));
        assert_non_null(strstr(out, f == 0 ? "\"alt_protocol\":\"tcp\"" : "rdma+tcp"));
    }
}

/* A TCP client puts to and gets from the dual segment through its TCP
 * endpoint: the bytes land in the memory this process serves, GetReplicaList
 * and InspectKey carry both endpoints, and the fake RDMA one is never tried
 * (it would fail the transfer). */
static void test_tcp_client_uses_tcp_endpoint(void **state)
{
    (void)state;
    moonlet_client *c = tcp_client(1);
    size_t len = 300000;
    unsigned char *src = malloc(len), *dst = malloc(len);
    cl_fill(src, len, 42);
    int rc = moonlet_client_put(c, "mixed-1", src, len, NULL);
    if (rc)
        fail_msg("put: %s", moonlet_strerror(rc));

    moonlet_replica_list l;
    assert_int_equal(moonlet_mc_get_replica_list(g_mc, NULL, "mixed-1", &l), MOONLET_OK);
    assert_int_equal(l.count, 1);
    const moonlet_replica_desc *r = &l.replicas[0];
    assert_string_equal(r->protocol, "rdma");
    assert_string_equal(r->endpoint, FAKE_RDMA_EP);
    assert_string_equal(r->segment_id, g_fake_rdma_id);
    assert_non_null(r->alt_protocol);
    assert_string_equal(r->alt_protocol, "tcp");
    assert_string_equal(r->alt_endpoint, g_info.endpoint);
    assert_string_equal(r->alt_segment_id, g_info.segment_id);
    /* The bytes are in the served memory at the replica's offset. */
    assert_memory_equal((unsigned char *)g_mem + r->offset, src, len);
    moonlet_replica_list_free(&l);

    size_t got = 0;
    rc = moonlet_client_get(c, "mixed-1", dst, len, NULL, &got);
    if (rc)
        fail_msg("get: %s", moonlet_strerror(rc));
    assert_int_equal(got, len);
    assert_memory_equal(dst, src, len);

    /* The batch paths route the same way. */
    const char *keys[] = {"mixed-b1", "mixed-b2"};
    const void *bufs[] = {src, src + 1000};
    size_t lens[] = {4096, 70000};
    int32_t res[2] = {-1, -1};
    assert_int_equal(moonlet_client_register_buffer(c, src, len), MOONLET_OK);
    assert_int_equal(moonlet_client_register_buffer(c, dst, len), MOONLET_OK);
    assert_int_equal(moonlet_client_batch_put_from(c, keys, 2, bufs, lens, NULL, res), MOONLET_OK);
    void *outs[] = {dst, dst + 100000};
    size_t caps[] = {100000, 100000}, outlens[2];
    assert_int_equal(moonlet_client_batch_get_into(c, keys, 2, outs, caps, NULL, outlens, res),
                     MOONLET_OK);
    assert_memory_equal(dst, src, 4096);
    assert_memory_equal(dst + 100000, src + 1000, 70000);
    assert_int_equal(moonlet_client_unregister_buffer(c, src), MOONLET_OK);
    assert_int_equal(moonlet_client_unregister_buffer(c, dst), MOONLET_OK);

    /* InspectKey shows both endpoints. */
    char *json = NULL;
    assert_int_equal(moonlet_client_inspect_key(c, "mixed-1", NULL, &json), MOONLET_OK);
    assert_non_null(strstr(json, "\"alt_endpoint\""));
    assert_non_null(strstr(json, g_info.endpoint));
    assert_non_null(strstr(json, FAKE_RDMA_EP));
    free(json);
    free(src);
    free(dst);
    moonlet_client_destroy(c);
}

/* With a second, RDMA-only segment mounted: a 2-replica put from a TCP
 * client fails with UNAVAILABLE_IN_CURRENT_STATUS (and is revoked), while a
 * get of an object with a replica there falls over to the dual segment. */
static void test_unspeakable_replica(void **state)
{
    (void)state;
    moonlet_client *c = tcp_client(2), *c1 = tcp_client(1);
    size_t len = 8192;
    unsigned char *src = malloc(len), *dst = malloc(len);
    cl_fill(src, len, 7);
    /* 1-replica object first, before the RDMA-only segment exists. */
    assert_int_equal(moonlet_client_put(c1, "mixed-ro", src, len, NULL), MOONLET_OK);
    moonlet_client_destroy(c1);

    moonlet_segment_desc d = {.client_id = "rdma-node", .segment_id = "rdma-only-seg",
                              .size = SEG_BYTES, .endpoint = "192.0.2.2:4791",
                              .protocol = "rdma"};
    assert_int_equal(moonlet_mc_mount_segment(g_mc, &d), MOONLET_OK);
    assert_int_equal(moonlet_client_put(c, "mixed-2r", src, len, NULL),
                     MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    assert_int_equal(cl_replicas(g_mc, NULL, "mixed-2r"), -1); /* revoked: no such key */

    size_t got = 0;
    assert_int_equal(moonlet_client_get(c, "mixed-ro", dst, len, NULL, &got), MOONLET_OK);
    assert_memory_equal(dst, src, len);

    /* An object with replicas on both segments, the RDMA-only one listed
     * first, written by hand through the dual segment's TCP endpoint: the
     * TCP client's get (and batch get) moves past the replica it cannot
     * speak to and reads the other. */
    moonlet_xfer *w = NULL;
    moonlet_xfer_opts xo = {.protocol = MOONLET_XFER_TCP};
    assert_int_equal(moonlet_xfer_create(&xo, &w), MOONLET_OK);
    char key[32];
    bool tried = false;
    for (int i = 0; i < 32 && !tried; i++) {
        snprintf(key, sizeof(key), "mixed-fo-%d", i);
        moonlet_replica_list l;
        assert_int_equal(moonlet_mc_put_start(g_mc, NULL, key, len, 2, false, &l), MOONLET_OK);
        assert_int_equal(l.count, 2);
        const moonlet_replica_desc *dual = &l.replicas[l.replicas[0].alt_endpoint ? 0 : 1];
        moonlet_xfer_cap cap = {.offset = dual->offset, .len = dual->cap_len,
                                .expiry_ms = dual->cap_expiry_ms, .tag = dual->cap_tag};
        moonlet_xfer_op op = {.opcode = MOONLET_XFER_WRITE, .endpoint = dual->alt_endpoint,
                              .segment_id = dual->alt_segment_id, .offset = dual->offset,
                              .local = src, .len = len, .cap = &cap};
        assert_int_equal(moonlet_xfer_submit(w, &op, 1), MOONLET_OK);
        assert_int_equal(moonlet_mc_put_end(g_mc, NULL, key), MOONLET_OK);
        moonlet_replica_list_free(&l);
        assert_int_equal(moonlet_mc_get_replica_list(g_mc, NULL, key, &l), MOONLET_OK);
        tried = l.replicas[0].alt_endpoint == NULL; /* the RDMA-only replica comes first */
        moonlet_replica_list_free(&l);
    }
    assert_true(tried);
    memset(dst, 0, len);
    assert_int_equal(moonlet_client_get(c, key, dst, len, NULL, &got), MOONLET_OK);
    assert_memory_equal(dst, src, len);
    const char *keys[] = {key};
    void *outs[] = {dst};
    size_t caps[] = {len}, lens[1];
    int32_t res[1] = {-1};
    memset(dst, 0, len);
    assert_int_equal(moonlet_client_register_buffer(c, dst, len), MOONLET_OK);
    assert_int_equal(moonlet_client_batch_get_into(c, keys, 1, outs, caps, NULL, lens, res),
                     MOONLET_OK);
    assert_memory_equal(dst, src, len);
    assert_int_equal(moonlet_client_unregister_buffer(c, dst), MOONLET_OK);
    moonlet_xfer_destroy(w);
    assert_int_equal(moonlet_mc_unmount_segment(g_mc, "rdma-node", "rdma-only-seg"), MOONLET_OK);
    free(src);
    free(dst);
    moonlet_client_destroy(c);
}

int main(void)
{
    const struct CMUnitTest pure[] = {cmocka_unit_test(test_pick_endpoint)};
    const struct CMUnitTest cluster[] = {
        cmocka_unit_test(test_segment_descriptor_round_trip),
        cmocka_unit_test(test_inspect_shows_both),
        cmocka_unit_test(test_store_both_flags),
        cmocka_unit_test(test_tcp_client_uses_tcp_endpoint),
        cmocka_unit_test(test_unspeakable_replica),
    };
    int rc = cmocka_run_group_tests(pure, NULL, NULL);
    return rc | cmocka_run_group_tests(cluster, setup, teardown);
}
