/*
 * Test of the public client (include/moonlet/client.h, store/client/client.c).
 *
 * The pure decisions (lease expiry, replica order, fall-over) are tested in
 * isolation; everything else against real daemons on loopback: a master and
 * two moonlet-store processes.  Round trips of every call, tenants, upsert,
 * registered buffers and their errors, batches, BatchProbeKey policy
 * passthrough (the K3 worked example), the RDMA staging path forced on TCP,
 * a client with a local segment reading its own replica first, concurrent
 * use, and a put whose write fails (a store killed just before) being
 * revoked.  A second master with a 1 ms lease shows LEASE_EXPIRED; a third
 * with an auth token shows the token guarding both the master and the data
 * path.  A fourth cluster corrupts replicas in place (the client's own
 * local segment) to show the end-to-end checksum: a mismatch falls over to
 * the next replica, and with none left every get path returns INVALID_READ,
 * never the wrong bytes.
 *
 * The backend-neutral group (round trips, tenants, upsert, registered
 * buffers, batches, probe policy, concurrent use) runs once per backend of
 * the client's backend table: `test_client` on the direct client, and
 * `test_client dummy` (meson test client_dummy) on a DummyClient served by a
 * RealClient of this process over a unix socket, with the same assertions.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <cmocka.h>

#include "../common/cluster.h"
#include "client_internal.h"
#include "moonlet/client.h"
#include "../common/tsan_loopback.h"
#include "moonlet/error.h"
#include "moonlet/real_client.h"
#include "xfer.h"

static test_proc g_master, g_a, g_b;
static moonlet_master_client *g_mc;
static moonlet_client *g_cli;
/* The DummyClient run: the RealClient serving it, and its socket. */
static bool g_dummy;
static moonlet_real_client *g_real;
static char g_sock[108];

/* A TCP client config with a local segment of seg bytes. */
static void local_config(moonlet_client_config *cfg, const char *addr, uint64_t seg)
{
    moonlet_client_config_init(cfg, sizeof(*cfg));
    cfg->master_addr = addr;
    cfg->protocol = MOONLET_PROTOCOL_TCP;
    cfg->local_segment_size = seg;
    cfg->transfer_timeout_ms = 3000;
}

/* A client with a local segment of seg bytes (see local_config); its data
 * endpoint into own. */
static moonlet_client *new_local_client(const char *addr, uint64_t seg, char *own, size_t cap)
{
    moonlet_client_config cfg;
    local_config(&cfg, addr, seg);
    moonlet_client *c;
    assert_int_equal(moonlet_client_create(&cfg, &c), MOONLET_OK);
    assert_int_equal(moonlet_client_local_endpoint(c, own, cap), MOONLET_OK);
    return c;
}

/* Every get path (get, get_alloc, get_into, batch_get_into) of key fails
 * with `want` and hands out no bytes; buf (n bytes) is registered for
 * get_into and batch_get_into.  Returns the length batch_get_into reported. */
static size_t assert_every_get_fails(moonlet_client *c, const char *key, unsigned char *buf,
                                     size_t n, int want)
{
    size_t len = 0;
    assert_int_equal(moonlet_client_get(c, key, buf, n, NULL, &len), want);
    void *p = (void *)1;
    assert_int_equal(moonlet_client_get_alloc(c, key, NULL, &p, &len), want);
    assert_null(p);
    assert_int_equal(moonlet_client_register_buffer(c, buf, n), MOONLET_OK);
    assert_int_equal(moonlet_client_get_into(c, key, buf, n, NULL, &len), want);
    const char *keys[] = {key};
    void *bufs[] = {buf};
    size_t caps[] = {n}, lens[1];
    int32_t res[1];
    assert_int_equal(moonlet_client_batch_get_into(c, keys, 1, bufs, caps, NULL, lens, res), want);
    assert_int_equal(res[0], want);
    assert_int_equal(moonlet_client_unregister_buffer(c, buf), MOONLET_OK);
    return lens[0];
}

static moonlet_client *new_dummy_client(const char *tenant)
{
    moonlet_dummy_config cfg;
    moonlet_dummy_config_init(&cfg, sizeof cfg);
    cfg.default_tenant = tenant;
    moonlet_client *c = NULL;
    int rc = moonlet_client_create_dummy(g_sock, &cfg, &c);
    if (rc)
        fail_msg("client_create_dummy: %s", moonlet_strerror(rc));
    return c;
}

static moonlet_client *new_client(const char *addr, const char *tenant, const char *token)
{
    if (g_dummy && g_real && !token && strcmp(addr, g_master.addr) == 0)
        return new_dummy_client(tenant);
    moonlet_client_config cfg = cl_client_config(addr);
    cfg.default_tenant = tenant;
    cfg.auth_token = token;
    cfg.transfer_timeout_ms = 3000;
    return cl_client_of(&cfg);
}

static int setup_cluster(void **state)
{
    (void)state;
    static const char *const flags[] = {"--client_live_ttl_sec", "2", NULL};
    if (cl_start_master(&g_master, flags) || cl_start_store(&g_a, g_master.addr, "64MiB", NULL) ||
        cl_start_store(&g_b, g_master.addr, "64MiB", NULL))
        return -1;
    if (moonlet_mc_create(g_master.addr, NULL, &g_mc))
        return -1;
    if (g_dummy) {
        moonlet_client_config cfg;
        local_config(&cfg, g_master.addr, 32u << 20);
        snprintf(g_sock, sizeof(g_sock), "/tmp/moonlet-test-client-%ld.sock", (long)getpid());
        if (moonlet_real_client_create(&cfg, g_sock, NULL, &g_real))
            return -1;
    }
    g_cli = new_client(g_master.addr, NULL, NULL);
    return 0;
}

static int teardown_cluster(void **state)
{
    (void)state;
    moonlet_client_destroy(g_cli);
    moonlet_real_client_destroy(g_real);
    g_real = NULL;
    moonlet_mc_destroy(g_mc);
    proc_stop(&g_a);
    proc_stop(&g_b);
    proc_stop(&g_master);
    return 0;
}

/* ---- pure decisions ----------------------------------------------------------- */

static void test_lease_decision(void **state)
{
    (void)state;
    const uint64_t ms = 1000000, t0 = 5000 * ms;
    assert_false(moonlet_client_lease_expired(t0, 5, t0));
    assert_false(moonlet_client_lease_expired(t0, 5, t0 + 5 * ms - 1));
    assert_true(moonlet_client_lease_expired(t0, 5, t0 + 5 * ms)); /* deadline itself: gone */
    assert_true(moonlet_client_lease_expired(t0, 5, t0 + 60 * ms));
    assert_true(moonlet_client_lease_expired(t0, 0, t0));          /* a 0 ms lease protects nothing */
    assert_false(moonlet_client_lease_expired(t0, UINT64_MAX, UINT64_MAX)); /* no overflow */
    assert_false(moonlet_client_lease_expired(t0, 5, t0 - 1));     /* clock never runs back */
}

static void test_replica_order(void **state)
{
    (void)state;
    moonlet_replica_desc r[3] = {{.endpoint = "10.0.0.1:7000"}, {.endpoint = "10.0.0.2:7000"},
                                 {.endpoint = "10.0.0.3:7000"}};
    uint32_t o[3];
    assert_int_equal(moonlet_client_replica_order(r, 3, "10.0.0.2:7000", o), 3);
    assert_int_equal(o[0], 1);
    assert_int_equal(o[1], 0);
    assert_int_equal(o[2], 2);
    assert_int_equal(moonlet_client_replica_order(r, 3, "10.0.0.3:7000", o), 3);
    assert_int_equal(o[0], 2);
    assert_int_equal(o[1], 0);
    assert_int_equal(o[2], 1);
    const char *none[] = {NULL, "", "10.0.0.9:7000"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(moonlet_client_replica_order(r, 3, none[k], o), 3);
        for (uint32_t i = 0; i < 3; i++)
            assert_int_equal(o[i], i);
    }
    assert_int_equal(moonlet_client_replica_order(r, 0, "10.0.0.1:7000", o), 0);

    assert_true(moonlet_client_try_next_replica(MOONLET_ERR_TRANSFER_FAIL));
    assert_true(moonlet_client_try_next_replica(MOONLET_ERR_SEGMENT_NOT_FOUND));
    assert_true(moonlet_client_try_next_replica(MOONLET_ERR_INVALID_READ)); /* checksum */
    assert_false(moonlet_client_try_next_replica(MOONLET_OK));
    assert_false(moonlet_client_try_next_replica(MOONLET_ERR_OBJECT_NOT_FOUND));
    assert_false(moonlet_client_try_next_replica(MOONLET_ERR_ILLEGAL_CLIENT));
    assert_false(moonlet_client_try_next_replica(MOONLET_ERR_INVALID_PARAMS));
}

/* ---- create ---------------------------------------------------------------------- */

static void test_create_errors(void **state)
{
    (void)state;
    moonlet_client_config cfg;
    moonlet_client_config_init(&cfg, sizeof cfg);
    moonlet_client *c = NULL;
    assert_int_equal(moonlet_client_create(NULL, &c), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_create(&cfg, &c), MOONLET_ERR_INVALID_PARAMS);
    cfg.master_addr = g_master.addr;
    cfg.protocol = (moonlet_protocol)7;
    assert_int_equal(moonlet_client_create(&cfg, &c), MOONLET_ERR_INVALID_PARAMS);
    cfg.protocol = MOONLET_PROTOCOL_TCP;
    cfg.master_addr = "127.0.0.1:1";
    assert_int_equal(moonlet_client_create(&cfg, &c), MOONLET_ERR_RPC_FAIL);
    cfg.master_addr = "no-port";
    assert_int_equal(moonlet_client_create(&cfg, &c), MOONLET_ERR_INVALID_PARAMS);
    cfg.master_addr = g_master.addr;
    cfg.protocol = MOONLET_PROTOCOL_RDMA;
    int rc = moonlet_client_create(&cfg, &c);
    if (rc == MOONLET_OK) { /* a machine with an RDMA device */
        assert_string_equal(moonlet_client_protocol(c), "rdma");
        moonlet_client_destroy(c);
    } else {
        assert_int_equal(rc, MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    }
    assert_string_equal(moonlet_client_protocol(g_cli), "tcp");
    char ep[64];
    assert_int_equal(moonlet_client_local_endpoint(g_cli, ep, sizeof(ep)),
                     MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
    assert_string_equal(moonlet_strerror(MOONLET_ERR_LEASE_EXPIRED), "LEASE_EXPIRED");
    moonlet_client_destroy(NULL);
}

/* ---- objects ---------------------------------------------------------------------- */

static void test_round_trip(void **state)
{
    (void)state;
    if (g_dummy) { /* really the DummyClient backend, served by g_real */
        char ep[64];
        assert_int_equal(moonlet_client_local_endpoint(g_cli, ep, sizeof(ep)),
                         MOONLET_ERR_UNAVAILABLE_IN_CURRENT_STATUS);
        assert_true(moonlet_real_client_connections(g_real) >= 1);
    }
    const size_t sizes[] = {0, 1, 4096, (1u << 20) + 3};
    for (size_t i = 0; i < 4; i++) {
        char key[64];
        snprintf(key, sizeof(key), "rt/%zu", sizes[i]);
        unsigned char *data = cl_random_bytes(sizes[i], i + 1);
        assert_int_equal(moonlet_client_put(g_cli, key, data, sizes[i], NULL), MOONLET_OK);
        assert_int_equal(cl_replicas(g_mc, NULL, key), 1); /* replica_num defaults to 1 */
        cl_assert_get_equals(g_cli, key, NULL, data, sizes[i]);
        cl_assert_alloc_and_size(g_cli, key, NULL, data, sizes[i]);
        bool ex = false;
        assert_int_equal(moonlet_client_exist_key(g_cli, key, NULL, &ex), MOONLET_OK);
        assert_true(ex);
        assert_int_equal(moonlet_client_put(g_cli, key, data, sizes[i], NULL),
                         MOONLET_ERR_OBJECT_ALREADY_EXISTS);
        free(data);
    }
    /* too small a buffer: nothing read, the size needed reported */
    unsigned char small[100];
    size_t len = 0;
    assert_int_equal(moonlet_client_get(g_cli, "rt/4096", small, sizeof(small), NULL, &len),
                     MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(len, 4096);
    /* absent keys */
    void *p = (void *)1;
    assert_int_equal(moonlet_client_get(g_cli, "rt/none", small, sizeof(small), NULL, &len),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(moonlet_client_get_alloc(g_cli, "rt/none", NULL, &p, &len),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_null(p);
    bool ex = true;
    assert_int_equal(moonlet_client_probe_key(g_cli, "rt/none", NULL, &ex), MOONLET_OK);
    assert_false(ex);
    /* remove: refused while leased (the gets above), done when not */
    assert_int_equal(moonlet_client_remove(g_cli, "rt/1", NULL), MOONLET_ERR_OBJECT_HAS_LEASE);
    assert_int_equal(moonlet_client_put(g_cli, "rt/unleased", "abc", 3, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_remove(g_cli, "rt/unleased", NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_remove(g_cli, "rt/unleased", NULL), MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(moonlet_client_get(g_cli, "rt/unleased", small, sizeof(small), NULL, &len),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    /* bad arguments */
    assert_int_equal(moonlet_client_put(g_cli, NULL, "x", 1, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_put(g_cli, "k", NULL, 1, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_put(g_cli, "", "x", 1, NULL), MOONLET_ERR_INVALID_KEY);
    assert_int_equal(moonlet_client_get(g_cli, "k", NULL, 0, NULL, NULL), MOONLET_ERR_INVALID_PARAMS);
    moonlet_put_options nine = {.replica_num = 9};
    assert_int_equal(moonlet_client_put(g_cli, "k9", "x", 1, &nine), MOONLET_ERR_INVALID_PARAMS);
}

static void test_tenants(void **state)
{
    (void)state;
    moonlet_client *other = new_client(g_master.addr, "tenant-b", NULL);
    moonlet_put_options in_b = {.tenant = "tenant-b"};
    assert_int_equal(moonlet_client_put(g_cli, "shared-name", "bbb", 3, &in_b), MOONLET_OK);
    assert_int_equal(moonlet_client_put(g_cli, "shared-name", "ddd", 3, NULL), MOONLET_OK);
    cl_assert_get_equals(g_cli, "shared-name", NULL, "ddd", 3);
    cl_assert_get_equals(g_cli, "shared-name", "tenant-b", "bbb", 3);
    cl_assert_get_equals(other, "shared-name", NULL, "bbb", 3); /* its default tenant */
    cl_assert_get_equals(other, "shared-name", "default", "ddd", 3);
    int32_t r[1];
    const char *k[] = {"shared-name"};
    assert_int_equal(moonlet_client_batch_exist_key(other, k, 1, "nobody", r), MOONLET_OK);
    assert_int_equal(r[0], 0);
    assert_int_equal(moonlet_client_put(other, "only-b", "x", 1, NULL), MOONLET_OK);
    uint64_t removed = 0;
    assert_int_equal(moonlet_client_remove_all(other, NULL, &removed), MOONLET_OK);
    assert_int_equal(removed, 1); /* "shared-name" in tenant-b is leased */
    moonlet_client_destroy(other);
}

static void test_upsert(void **state)
{
    (void)state;
    assert_int_equal(moonlet_client_upsert(g_cli, "up", "first", 5, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_upsert(g_cli, "up", "second!", 7, NULL), MOONLET_OK);
    cl_assert_get_equals(g_cli, "up", NULL, "second!", 7); /* leases it */
    assert_int_equal(moonlet_client_upsert(g_cli, "up", "third", 5, NULL),
                     MOONLET_ERR_OBJECT_HAS_LEASE);
    cl_assert_get_equals(g_cli, "up", NULL, "second!", 7);
}

/* ---- registered buffers --------------------------------------------------------------- */

static void test_registered_buffers(void **state)
{
    (void)state;
    const size_t mb = 1u << 20;
    unsigned char *src = cl_random_bytes(2 * mb, 77);
    unsigned char *dst = calloc(1, 2 * mb);
    size_t len = 0;
    /* unregistered memory is refused before anything happens */
    assert_int_equal(moonlet_client_put_from(g_cli, "zc/a", src, mb, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_get_into(g_cli, "rt/4096", dst, mb, NULL, &len),
                     MOONLET_ERR_INVALID_PARAMS);
    bool ex = true;
    assert_int_equal(moonlet_client_probe_key(g_cli, "zc/a", NULL, &ex), MOONLET_OK);
    assert_false(ex);

    assert_int_equal(moonlet_client_register_buffer(g_cli, src, 2 * mb), MOONLET_OK);
    assert_int_equal(moonlet_client_register_buffer(g_cli, src, mb), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_register_buffer(g_cli, NULL, mb), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_register_buffer(g_cli, dst, 2 * mb), MOONLET_OK);

    assert_int_equal(moonlet_client_put_from(g_cli, "zc/a", src, mb, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_put_from(g_cli, "zc/b", src + mb + 512, mb - 512, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_put_from(g_cli, "zc/c", src + mb + 1, mb, NULL),
                     MOONLET_ERR_INVALID_PARAMS); /* runs past the registration */
    assert_int_equal(moonlet_client_get_into(g_cli, "zc/a", dst, 2 * mb, NULL, &len), MOONLET_OK);
    assert_int_equal(len, mb);
    assert_memory_equal(dst, src, mb);
    /* a destination smaller than the object */
    len = 0;
    assert_int_equal(moonlet_client_get_into(g_cli, "zc/a", dst, 1000, NULL, &len),
                     MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(len, mb);
    assert_int_equal(moonlet_client_get_into(g_cli, "zc/a", dst + 2 * mb - 10, 20, NULL, &len),
                     MOONLET_ERR_INVALID_PARAMS);

    /* batches: per-key results, the first error returned */
    unsigned char *loose = malloc(64);
    const char *pk[] = {"zc/p0", "zc/p1", "zc/p2", "zc/a"};
    const void *pb[] = {src, src + 4096, loose, src};
    const size_t pl[] = {4096, 8192, 64, 10};
    int32_t pr[4];
    CL_ASSERT_BATCH(moonlet_client_batch_put_from(g_cli, pk, 4, pb, pl, NULL, pr), pr, MOONLET_OK,
                    MOONLET_OK, MOONLET_ERR_INVALID_PARAMS, MOONLET_ERR_OBJECT_ALREADY_EXISTS);
    const char *gk[] = {"zc/p0", "zc/p1", "zc/none", "zc/b"};
    void *gb[] = {dst, dst + 4096, dst + 3 * 4096, dst + 4 * 4096};
    const size_t gc[] = {4096, 8192, 4096, 100};
    size_t gl[4];
    int32_t gr[4];
    memset(dst, 0, 2 * mb);
    CL_ASSERT_BATCH(moonlet_client_batch_get_into(g_cli, gk, 4, gb, gc, NULL, gl, gr), gr,
                    MOONLET_OK, MOONLET_OK, MOONLET_ERR_OBJECT_NOT_FOUND, MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(gl[0], 4096);
    assert_int_equal(gl[1], 8192);
    assert_int_equal(gl[3], mb - 512);
    assert_memory_equal(dst, src, 4096);
    assert_memory_equal(dst + 4096, src + 4096, 8192);
    const char *ok_keys[] = {"zc/p0", "zc/p1"};
    assert_int_equal(moonlet_client_batch_get_into(g_cli, ok_keys, 2, gb, gc, NULL, gl, gr), MOONLET_OK);
    assert_int_equal(moonlet_client_batch_get_into(g_cli, NULL, 2, gb, gc, NULL, gl, gr),
                     MOONLET_ERR_INVALID_PARAMS);

    assert_int_equal(moonlet_client_unregister_buffer(g_cli, src), MOONLET_OK);
    assert_int_equal(moonlet_client_unregister_buffer(g_cli, src), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_put_from(g_cli, "zc/d", src, 10, NULL), MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_unregister_buffer(g_cli, dst), MOONLET_OK);
    free(loose);
    free(src);
    free(dst);
}

/* ---- ranged batches in place -------------------------------------------------------------- */

/* batch_put / batch_get over ranges of 160 KiB on average that all lie in
 * registered memory (the direct client moves them in place, one transfer
 * per range; a DummyClient stages them): the bytes of each key are its
 * ranges in order, whatever their sizes; a key with no range is an empty
 * value; per-key codes as the staged path gives them.  The same call with
 * one range outside the registrations is staged and gives the same
 * results. */
static void test_ranged_batches_in_place(void **state)
{
    (void)state;
    enum { LAYERS = 3, KEYS = 4, CHUNK = 160 << 10 };
    unsigned char *src = cl_random_bytes(LAYERS * KEYS * CHUNK, 31);
    unsigned char *dst = calloc(LAYERS * KEYS, CHUNK), *loose = malloc(CHUNK);
    assert_int_equal(moonlet_client_register_buffer(g_cli, src, LAYERS * KEYS * CHUNK), MOONLET_OK);
    assert_int_equal(moonlet_client_register_buffer(g_cli, dst, LAYERS * KEYS * CHUNK), MOONLET_OK);
    for (int staged = 0; staged < 2; staged++) {
        char names[KEYS + 1][32];
        const char *keys[KEYS + 1];
        for (int i = 0; i < KEYS; i++) {
            snprintf(names[i], sizeof(names[i]), "rng/%d/%d", staged, i);
            keys[i] = names[i];
        }
        keys[KEYS] = "rng/taken";
        /* key i: its chunk of every layer (layer-major, as per-layer KV
         * tensors), key 1 with a short middle range and an empty one, key 3
         * none at all; in the second pass key 2's last range is unregistered */
        struct iovec iov[LAYERS * KEYS + 1];
        size_t cnt[KEYS + 1], at = 0;
        for (int i = 0; i < KEYS; i++) {
            cnt[i] = i == 3 ? 0 : LAYERS + (i == 1);
            for (int l = 0; l < LAYERS && i != 3; l++)
                iov[at++] = (struct iovec){src + (l * KEYS + i) * CHUNK, i == 1 && l == 1 ? 10 : CHUNK};
            if (i == 1)
                iov[at++] = (struct iovec){src, 0};
        }
        if (staged) {
            memcpy(loose, src + (2 * KEYS + 2) * CHUNK, CHUNK);
            iov[at - 1] = (struct iovec){loose, CHUNK}; /* key 2's last range */
        }
        cnt[KEYS] = 1;
        iov[at++] = (struct iovec){src, 1};
        if (staged == 0)
            assert_int_equal(moonlet_client_put(g_cli, "rng/taken", "t", 1, NULL), MOONLET_OK);
        int32_t r[KEYS + 1];
        CL_ASSERT_BATCH(moonlet_client_batch_put(g_cli, keys, KEYS + 1, iov, cnt, NULL, r), r,
                        MOONLET_OK, MOONLET_OK, MOONLET_OK, MOONLET_OK,
                        MOONLET_ERR_OBJECT_ALREADY_EXISTS);
        unsigned char want[LAYERS * CHUNK];
        for (int i = 0; i < KEYS; i++) { /* each key's value is its ranges, concatenated */
            size_t len = 0;
            for (int l = 0; l < LAYERS && i != 3; l++) {
                size_t n = i == 1 && l == 1 ? 10 : CHUNK;
                memcpy(want + len, src + (l * KEYS + i) * CHUNK, n);
                len += n;
            }
            cl_assert_get_equals(g_cli, keys[i], NULL, want, len);
        }
        /* read back layer-major into dst (registered), key 2 one range short */
        const char *gk[] = {keys[0], keys[1], keys[2], keys[3], "rng/none"};
        struct iovec giov[LAYERS * KEYS];
        size_t gcnt[KEYS + 1], sizes[KEYS + 1];
        at = 0;
        memset(dst, 0, LAYERS * KEYS * CHUNK);
        for (int i = 0; i < KEYS; i++) {
            gcnt[i] = i == 2 ? LAYERS - 1 : LAYERS;
            for (size_t l = 0; l < gcnt[i]; l++)
                giov[at++] = (struct iovec){dst + (l * KEYS + i) * CHUNK, CHUNK};
        }
        gcnt[KEYS] = 0;
        CL_ASSERT_BATCH(moonlet_client_batch_get(g_cli, gk, KEYS + 1, giov, gcnt, NULL, sizes, r),
                        r, MOONLET_OK, MOONLET_OK, MOONLET_ERR_BUFFER_OVERFLOW, MOONLET_OK,
                        MOONLET_ERR_OBJECT_NOT_FOUND);
        assert_int_equal(sizes[0], LAYERS * CHUNK);
        assert_int_equal(sizes[1], 2 * CHUNK + 10);
        assert_int_equal(sizes[2], LAYERS * CHUNK);
        assert_int_equal(sizes[3], 0);
        for (int l = 0; l < LAYERS; l++) /* key 0 lands where it came from */
            assert_memory_equal(dst + l * KEYS * CHUNK, src + l * KEYS * CHUNK, CHUNK);
        /* key 1: 2 x CHUNK + 10 bytes over ranges of CHUNK: its third range holds the last 10 */
        assert_memory_equal(dst + (0 * KEYS + 1) * CHUNK, src + (0 * KEYS + 1) * CHUNK, CHUNK);
        assert_memory_equal(dst + (1 * KEYS + 1) * CHUNK, src + (1 * KEYS + 1) * CHUNK, 10);
        assert_memory_equal(dst + (1 * KEYS + 1) * CHUNK + 10, src + (2 * KEYS + 1) * CHUNK,
                            CHUNK - 10);
        assert_memory_equal(dst + (2 * KEYS + 1) * CHUNK, src + (2 * KEYS + 1) * CHUNK + CHUNK - 10,
                            10);
        for (int l = 0; l < LAYERS; l++) /* key 2 (too small): nothing written */
            assert_true(dst[(l * KEYS + 2) * CHUNK] == 0 &&
                        dst[(l * KEYS + 2) * CHUNK + CHUNK - 1] == 0);
    }
    assert_int_equal(moonlet_client_unregister_buffer(g_cli, src), MOONLET_OK);
    assert_int_equal(moonlet_client_unregister_buffer(g_cli, dst), MOONLET_OK);
    free(loose);
    free(src);
    free(dst);
}

/* ---- a batch is one master round trip ----------------------------------------------- */

/* Requests of `method` the master served so far (Stats' "calls"). */
static double calls_of(const char *method)
{
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_stats(g_mc, &j), MOONLET_OK);
    const cJSON *n = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "calls"), method);
    double v = n ? n->valuedouble : 0;
    cJSON_Delete(j);
    return v;
}

#define RT_KEYS 2048u
#define RT_VAL 256u

/* 2,048 keys put and read in one batch each: one master call for all the
 * puts' PutStarts, one for their PutEnds, one for the reads' lookups, and
 * none per key; a key over the key limit (put) and a missing key and one
 * too big for its buffer (get) get their own codes while the others
 * succeed with their own bytes. */
static void test_batch_one_round_trip(void **state)
{
    (void)state;
    static const char *const per_key[] = {"PutStart", "PutEnd", "PutRevoke", "GetReplicaList"};
    unsigned char *src = cl_random_bytes(RT_KEYS * RT_VAL, 77);
    unsigned char *dst = calloc(RT_KEYS, RT_VAL);
    char **names = calloc(RT_KEYS, sizeof(*names));
    const char **keys = calloc(RT_KEYS, sizeof(*keys));
    const void **pb = calloc(RT_KEYS, sizeof(*pb));
    void **gb = calloc(RT_KEYS, sizeof(*gb));
    size_t *lens = calloc(RT_KEYS, sizeof(*lens)), *got = calloc(RT_KEYS, sizeof(*got));
    int32_t *res = calloc(RT_KEYS, sizeof(*res));
    char *long_key = malloc(MOONLET_MAX_KEY_BYTES + 2);
    assert_true(dst && names && keys && pb && gb && lens && got && res && long_key);
    memset(long_key, 'k', MOONLET_MAX_KEY_BYTES + 1);
    long_key[MOONLET_MAX_KEY_BYTES + 1] = 0;
    for (size_t i = 0; i < RT_KEYS; i++) {
        names[i] = malloc(32);
        snprintf(names[i], 32, "one-rtt/%zu", i);
        keys[i] = names[i];
        pb[i] = src + i * RT_VAL;
        gb[i] = dst + i * RT_VAL;
        lens[i] = RT_VAL;
    }
    keys[7] = long_key;
    assert_int_equal(moonlet_client_register_buffer(g_cli, src, RT_KEYS * RT_VAL), MOONLET_OK);
    assert_int_equal(moonlet_client_register_buffer(g_cli, dst, RT_KEYS * RT_VAL), MOONLET_OK);
    double single[4], bs = calls_of("BatchPutStart"), be = calls_of("BatchPutEnd"),
                      bg = calls_of("BatchGetReplicaList"), br = calls_of("BatchPutRevoke");
    for (int k = 0; k < 4; k++)
        single[k] = calls_of(per_key[k]);

    assert_int_equal(moonlet_client_batch_put_from(g_cli, keys, RT_KEYS, pb, lens, NULL, res),
                     MOONLET_ERR_INVALID_KEY);
    for (size_t i = 0; i < RT_KEYS; i++)
        assert_int_equal(res[i], i == 7 ? MOONLET_ERR_INVALID_KEY : MOONLET_OK);
    assert_int_equal(calls_of("BatchPutStart"), bs + 1);
    assert_int_equal(calls_of("BatchPutEnd"), be + 1);
    assert_int_equal(calls_of("BatchPutRevoke"), br); /* nothing started was left unwritten */

    keys[7] = "one-rtt/none"; /* never put */
    lens[9] = RT_VAL - 1; /* a buffer one byte short */
    assert_int_equal(moonlet_client_batch_get_into(g_cli, keys, RT_KEYS, gb, lens, NULL, got, res),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(calls_of("BatchGetReplicaList"), bg + 1);
    for (int k = 0; k < 4; k++)
        assert_int_equal(calls_of(per_key[k]), single[k]); /* no single call for any key */
    for (size_t i = 0; i < RT_KEYS; i++) {
        int want = i == 7 ? MOONLET_ERR_OBJECT_NOT_FOUND
                   : i == 9 ? MOONLET_ERR_BUFFER_OVERFLOW : MOONLET_OK;
        assert_int_equal(res[i], want);
        if (want == MOONLET_OK) {
            assert_int_equal(got[i], RT_VAL);
            assert_memory_equal(dst + i * RT_VAL, src + i * RT_VAL, RT_VAL);
        }
    }
    assert_int_equal(got[9], RT_VAL); /* the size it needed */

    assert_int_equal(moonlet_client_unregister_buffer(g_cli, src), MOONLET_OK);
    assert_int_equal(moonlet_client_unregister_buffer(g_cli, dst), MOONLET_OK);
    /* a batch none of whose keys can go (no registered memory any more)
     * makes no master call at all */
    bs = calls_of("BatchPutStart");
    be = calls_of("BatchPutEnd");
    bg = calls_of("BatchGetReplicaList");
    assert_int_equal(moonlet_client_batch_put_from(g_cli, keys, 2, pb, lens, NULL, res),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_batch_get_into(g_cli, keys, 2, gb, lens, NULL, got, res),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(calls_of("BatchPutStart"), bs);
    assert_int_equal(calls_of("BatchPutEnd"), be);
    assert_int_equal(calls_of("BatchGetReplicaList"), bg);
    for (size_t i = 0; i < RT_KEYS; i++)
        free(names[i]);
    free(long_key);
    free(names);
    free(keys);
    free(pb);
    free(gb);
    free(lens);
    free(got);
    free(res);
    free(src);
    free(dst);
}

/* moonlet_client_batch_replicas: one BatchGetReplicaList for every key,
 * an entry per key in order, a missing key's entry its code. */
static void test_batch_replicas(void **state)
{
    (void)state;
    assert_int_equal(moonlet_client_put(g_cli, "br/a", "aaaa", 4, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_put(g_cli, "br/b", "bbbbbbbb", 8, NULL), MOONLET_OK);
    const char *keys[] = {"br/a", "br/none", "br/b"};
    double calls = calls_of("BatchGetReplicaList"), single = calls_of("GetReplicaList");
    char *json = (char *)1;
    assert_int_equal(moonlet_client_batch_replicas(g_cli, keys, 3, NULL, NULL),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_batch_replicas(g_cli, keys, 3, NULL, &json), MOONLET_OK);
    assert_int_equal(calls_of("BatchGetReplicaList"), calls + 1);
    assert_int_equal(calls_of("GetReplicaList"), single);
    cJSON *j = cJSON_Parse(json);
    moonlet_free(json);
    assert_non_null(j);
    assert_int_equal(cJSON_GetArraySize(j), 3);
    const cJSON *a = cJSON_GetArrayItem(j, 0), *none = cJSON_GetArrayItem(j, 1),
                *b = cJSON_GetArrayItem(j, 2);
    assert_int_equal(cJSON_GetObjectItem(a, "size")->valueint, 4);
    assert_int_equal(cJSON_GetObjectItem(b, "size")->valueint, 8);
    assert_int_equal(cJSON_GetObjectItem(none, "error")->valueint, MOONLET_ERR_OBJECT_NOT_FOUND);
    const cJSON *r = cJSON_GetArrayItem(cJSON_GetObjectItem(b, "replicas"), 0);
    assert_int_equal(cJSON_GetObjectItem(r, "length")->valueint, 8);
    assert_string_equal(cJSON_GetObjectItem(r, "status")->valuestring, "COMPLETE");
    assert_string_equal(cJSON_GetObjectItem(r, "protocol")->valuestring, "tcp");
    assert_non_null(cJSON_GetObjectItem(r, "segment_id"));
    cJSON_Delete(j);
    assert_int_equal(moonlet_client_batch_replicas(g_cli, NULL, 0, NULL, &json), MOONLET_OK);
    assert_string_equal(json, "[]");
    moonlet_free(json);
}

/* ---- copying batches ------------------------------------------------------------------- */

static void test_copying_batches(void **state)
{
    (void)state;
    unsigned char *a = cl_random_bytes(5000, 91), *b = cl_random_bytes(300, 92);
    /* key 0: a then b (two ranges); key 1: empty (one empty range); key 2: b;
     * key 3: exists */
    assert_int_equal(moonlet_client_put(g_cli, "cp/taken", "x", 1, NULL), MOONLET_OK);
    const char *keys[] = {"cp/ab", "cp/empty", "cp/b", "cp/taken"};
    struct iovec iov[] = {{a, 5000}, {b, 300}, {a, 0}, {b, 300}, {a, 1}};
    const size_t cnt[] = {2, 1, 1, 1};
    int32_t r[4];
    CL_ASSERT_BATCH(moonlet_client_batch_put(g_cli, keys, 4, iov, cnt, NULL, r), r, MOONLET_OK,
                    MOONLET_OK, MOONLET_OK, MOONLET_ERR_OBJECT_ALREADY_EXISTS);
    unsigned char *ab = malloc(5300);
    memcpy(ab, a, 5000);
    memcpy(ab + 5000, b, 300);
    cl_assert_get_equals(g_cli, "cp/ab", NULL, ab, 5300);
    cl_assert_get_equals(g_cli, "cp/empty", NULL, "", 0);
    cl_assert_get_equals(g_cli, "cp/b", NULL, b, 300);

    /* sizes only (no range), then a scattered read over three ranges */
    const char *gk[] = {"cp/ab", "cp/empty", "cp/none"};
    size_t sizes[3];
    int32_t gr[3];
    const size_t zero[] = {0, 0, 0};
    assert_int_equal(moonlet_client_batch_get(g_cli, gk, 3, NULL, zero, NULL, sizes, gr),
                     MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(gr[0], MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(sizes[0], 5300);
    assert_int_equal(gr[1], MOONLET_OK);
    assert_int_equal(sizes[1], 0);
    assert_int_equal(gr[2], MOONLET_ERR_OBJECT_NOT_FOUND);
    unsigned char *d1 = calloc(1, 100), *d2 = calloc(1, 5000), *d3 = calloc(1, 200);
    struct iovec giov[] = {{d1, 100}, {d2, 5000}, {d3, 200}};
    const size_t gcnt[] = {3};
    assert_int_equal(moonlet_client_batch_get(g_cli, gk, 1, giov, gcnt, NULL, sizes, gr),
                     MOONLET_OK);
    assert_int_equal(sizes[0], 5300);
    assert_memory_equal(d1, ab, 100);
    assert_memory_equal(d2, ab + 100, 5000);
    assert_memory_equal(d3, ab + 5100, 200);
    /* ranges too small together: nothing copied, the size reported */
    memset(d1, 0, 100);
    const size_t one[] = {1};
    assert_int_equal(moonlet_client_batch_get(g_cli, gk, 1, giov, one, NULL, sizes, gr),
                     MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(sizes[0], 5300);
    assert_int_equal(d1[0], 0);

    /* malformed calls: refused whole, every key told */
    struct iovec bad[] = {{NULL, 5}};
    const size_t bcnt[] = {1};
    assert_int_equal(moonlet_client_batch_put(g_cli, keys, 1, bad, bcnt, NULL, r),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(r[0], MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_batch_get(g_cli, gk, 1, NULL, bcnt, NULL, sizes, gr),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_batch_put(g_cli, keys, 1, iov, NULL, NULL, r),
                     MOONLET_ERR_INVALID_PARAMS);
    assert_int_equal(moonlet_client_batch_put(NULL, keys, 1, iov, cnt, NULL, r),
                     MOONLET_ERR_INVALID_PARAMS);
    bool ex = true;
    assert_int_equal(moonlet_client_probe_key(g_cli, "cp/ab2", NULL, &ex), MOONLET_OK);
    assert_false(ex);
    free(d1);
    free(d2);
    free(d3);
    free(ab);
    free(a);
    free(b);
}

/* ---- probes ---------------------------------------------------------------------------- */

static const char *const K3[] = {"kda/128/r0", "kda/128/r1", "kda/256/r0",
                                 "kda/256/r1", "kda/384/r0", "kda/384/r1"};

static double lease_ms(const char *tenant, const char *key)
{
    return cl_lease_ms(g_mc, tenant, key);
}

static void test_batch_probe_policy(void **state)
{
    (void)state;
    const char *t = "probe";
    moonlet_put_options o = {.tenant = t};
    unsigned char blob[4096];
    cl_fill(blob, sizeof(blob), 3);
    const int present[] = {0, 1, 3, 4}; /* 256 lacks r0, 384 lacks r1 */
    for (int i = 0; i < 4; i++)
        assert_int_equal(moonlet_client_put(g_cli, K3[present[i]], blob, sizeof(blob), &o), MOONLET_OK);
    int32_t r[6];
    assert_int_equal(moonlet_client_batch_probe_key(g_cli, K3, 6, MOONLET_GRANT_LEASE_POLICY_DEFAULT,
                                                    t, r), MOONLET_OK);
    const int32_t want_none[] = {1, 1, 0, 1, 1, 0};
    assert_memory_equal(r, want_none, sizeof(r));
    for (int i = 0; i < 6; i++)
        assert_true(lease_ms(t, K3[i]) <= 0);
    moonlet_grant_lease_policy last = {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 2};
    assert_int_equal(moonlet_client_batch_probe_key(g_cli, K3, 6, last, t, r), MOONLET_OK);
    const int32_t want_last[] = {1, 1, 0, 0, 0, 0};
    assert_memory_equal(r, want_last, sizeof(r));
    assert_true(lease_ms(t, K3[0]) > 1000);
    assert_true(lease_ms(t, K3[1]) > 1000);
    assert_true(lease_ms(t, K3[3]) == 0);
    assert_true(lease_ms(t, K3[4]) == 0);
    /* invalid policies are the master's to judge, and come back unchanged */
    moonlet_grant_lease_policy bad[] = {{MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 4},
                                        {MOONLET_PROBE_LEASE_LAST_HIT_ONLY, 0}, {9, 2}};
    for (int i = 0; i < 3; i++) {
        memset(r, 0x55, sizeof(r));
        assert_int_equal(moonlet_client_batch_probe_key(g_cli, K3, 6, bad[i], t, r), -600);
    }
    assert_true(lease_ms(t, K3[3]) == 0); /* nothing leased by the refused calls */
    /* BatchExistKey leases every hit */
    assert_int_equal(moonlet_client_batch_exist_key(g_cli, K3, 6, t, r), MOONLET_OK);
    assert_memory_equal(r, want_none, sizeof(r));
    assert_true(lease_ms(t, K3[4]) > 1000);
    bool ex = false;
    assert_int_equal(moonlet_client_probe_key(g_cli, K3[3], t, &ex), MOONLET_OK);
    assert_true(ex);
}

/* ---- the staging path, local segment, concurrency --------------------------------------- */

static void test_staging_path(void **state)
{
    (void)state;
    moonlet_client_force_staging(g_cli, true);
    const size_t sizes[] = {4096, (1u << 20) + 5};
    for (int i = 0; i < 2; i++) {
        char key[64];
        snprintf(key, sizeof(key), "staged/%zu", sizes[i]);
        unsigned char *data = cl_random_bytes(sizes[i], 40 + (uint64_t)i);
        assert_int_equal(moonlet_client_put(g_cli, key, data, sizes[i], NULL), MOONLET_OK);
        cl_assert_get_equals(g_cli, key, NULL, data, sizes[i]);
        void *p;
        size_t len;
        assert_int_equal(moonlet_client_get_alloc(g_cli, key, NULL, &p, &len), MOONLET_OK);
        assert_memory_equal(p, data, sizes[i]);
        moonlet_free(p);
        free(data);
    }
    /* memory already registered is used as is */
    unsigned char *reg = cl_random_bytes(8192, 9);
    assert_int_equal(moonlet_client_register_buffer(g_cli, reg, 8192), MOONLET_OK);
    assert_int_equal(moonlet_client_put(g_cli, "staged/reg", reg, 8192, NULL), MOONLET_OK);
    cl_assert_get_equals(g_cli, "staged/reg", NULL, reg, 8192);
    assert_int_equal(moonlet_client_unregister_buffer(g_cli, reg), MOONLET_OK);
    free(reg);
    /* bounce buffers are registered once and reused, not per call */
    uint64_t regs0, regs1;
    size_t idle;
    moonlet_client_stage_stats(g_cli, &regs0, &idle);
    unsigned char *d = cl_random_bytes(100000, 77);
    for (int i = 0; i < 20; i++) {
        char key[64];
        snprintf(key, sizeof(key), "staged/reuse/%d", i);
        assert_int_equal(moonlet_client_put(g_cli, key, d, 100000, NULL), MOONLET_OK);
        cl_assert_get_equals(g_cli, key, NULL, d, 100000);
    }
    free(d);
    moonlet_client_stage_stats(g_cli, &regs1, &idle);
    print_message("40 staged calls: %llu new registrations, %zu bytes idle\n",
                  (unsigned long long)(regs1 - regs0), idle);
    assert_true(regs1 - regs0 <= 1);
    assert_true(idle >= 100000);
    moonlet_client_force_staging(g_cli, false);
}

static void test_local_segment(void **state)
{
    (void)state;
    char own[128];
    moonlet_client *c = new_local_client(g_master.addr, 8u << 20, own, sizeof(own));
    assert_int_equal(moonlet_client_local_endpoint(c, own, 4), MOONLET_ERR_BUFFER_OVERFLOW);
    assert_int_equal(cl_segments(g_mc), 3);
    unsigned char *data = cl_random_bytes(1u << 20, 55);
    moonlet_put_options three = {.replica_num = 3};
    assert_int_equal(moonlet_client_put(c, "local/k", data, 1u << 20, &three), MOONLET_OK);
    /* With both store processes frozen, only the local replica can answer:
     * a quick, correct read proves it was tried first. */
    assert_int_equal(kill(g_a.pid, SIGSTOP), 0);
    assert_int_equal(kill(g_b.pid, SIGSTOP), 0);
    unsigned char *got = malloc(1u << 20);
    size_t len = 0;
    long long t0 = proc_now_ms();
    int rc = moonlet_client_get(c, "local/k", got, 1u << 20, NULL, &len);
    long long took = proc_now_ms() - t0;
    kill(g_a.pid, SIGCONT);
    kill(g_b.pid, SIGCONT);
    assert_int_equal(rc, MOONLET_OK);
    assert_true(took < 1000);
    assert_memory_equal(got, data, 1u << 20);
    /* the pure client reads it too */
    cl_assert_get_equals(g_cli, "local/k", NULL, data, 1u << 20);
    moonlet_client_destroy(c);
    assert_int_equal(cl_segments(g_mc), 2); /* destroy unmounted it */
    assert_int_equal(cl_replicas(g_mc, NULL, "local/k"), 2);
    cl_assert_get_equals(g_cli, "local/k", NULL, data, 1u << 20);
    free(got);
    free(data);
}

static void *hammer(void *arg)
{
    int id = (int)(intptr_t)arg;
    intptr_t bad = 0;
    unsigned char *data = cl_random_bytes(65536, 100 + (uint64_t)id), *got = malloc(65536);
    for (int i = 0; i < 40; i++) {
        char key[64];
        snprintf(key, sizeof(key), "conc/%d/%d", id, i);
        data[0] = (unsigned char)i;
        size_t len = 0;
        bad += moonlet_client_put(g_cli, key, data, 65536, NULL) != MOONLET_OK;
        bad += moonlet_client_get(g_cli, key, got, 65536, NULL, &len) != MOONLET_OK;
        bad += len != 65536 || memcmp(got, data, 65536) != 0;
    }
    free(data);
    free(got);
    return (void *)bad;
}

static void test_concurrent_use(void **state)
{
    (void)state;
    pthread_t th[4];
    intptr_t bad = 0;
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, hammer, (void *)(intptr_t)i);
    for (int i = 0; i < 4; i++) { /* join all before asserting: the client outlives them */
        void *ret;
        pthread_join(th[i], &ret);
        bad += (intptr_t)ret;
    }
    assert_int_equal(bad, 0);
}

/* ---- a failed write revokes the put ------------------------------------------------------ */

static double stat_of(const char *name)
{
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_stats(g_mc, &j), MOONLET_OK);
    double v = cJSON_GetObjectItem(j, name)->valuedouble;
    cJSON_Delete(j);
    return v;
}

static void assert_not_there(const char *key)
{
    unsigned char buf[16];
    size_t len;
    bool ex = true;
    assert_int_equal(moonlet_client_get(g_cli, key, buf, sizeof(buf), NULL, &len),
                     MOONLET_ERR_OBJECT_NOT_FOUND);
    assert_int_equal(moonlet_client_exist_key(g_cli, key, NULL, &ex), MOONLET_OK);
    assert_false(ex);
    assert_int_equal(cl_replicas(g_mc, NULL, key), -1);
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_list_keys(g_mc, NULL, key, "", 100, &j), MOONLET_OK);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "keys")), 0);
    cJSON_Delete(j);
}

static void test_put_revoked_when_write_fails(void **state)
{
    (void)state;
    double revokes = stat_of("put_revokes");
    /* B dies; for the next two seconds (the liveness TTL) the master still
     * places replicas on it, so PutStart succeeds and B's write fails. */
    assert_int_equal(proc_stop_sig(&g_b, SIGKILL, 3000), 128 + SIGKILL);
    unsigned char data[4096];
    cl_fill(data, sizeof(data), 8);
    moonlet_put_options two = {.replica_num = 2};
    assert_int_equal(moonlet_client_put(g_cli, "revoked", data, sizeof(data), &two),
                     MOONLET_ERR_TRANSFER_FAIL);
    assert_not_there("revoked");
    assert_true(stat_of("put_revokes") >= revokes + 1);

    /* the batch form revokes per key, and says which */
    assert_int_equal(moonlet_client_register_buffer(g_cli, data, sizeof(data)), MOONLET_OK);
    const char *keys[] = {"revoked/b0", "revoked/b1"};
    const void *bufs[] = {data, data + 100};
    const size_t lens[] = {100, 200};
    int32_t res[2];
    CL_ASSERT_BATCH(moonlet_client_batch_put_from(g_cli, keys, 2, bufs, lens, &two, res), res,
                    MOONLET_ERR_TRANSFER_FAIL, MOONLET_ERR_TRANSFER_FAIL);
    assert_not_there("revoked/b0");
    assert_not_there("revoked/b1");
    assert_true(stat_of("put_revokes") >= revokes + 3);
    assert_int_equal(moonlet_client_unregister_buffer(g_cli, data), MOONLET_OK);
}

/* ---- leases that run out ------------------------------------------------------------------ */

static test_proc g_lmaster, g_lstore;

static int setup_short_lease(void **state)
{
    (void)state;
    static const char *const flags[] = {"--default_kv_lease_ttl", "1", NULL};
    if (cl_start_master(&g_lmaster, flags) || cl_start_store(&g_lstore, g_lmaster.addr, "96MiB", NULL))
        return -1;
    return 0;
}

static int teardown_short_lease(void **state)
{
    (void)state;
    proc_stop(&g_lstore);
    proc_stop(&g_lmaster);
    return 0;
}

/* A 1 ms lease cannot outlast a 32 MiB read: the bytes must not be returned. */
static void test_lease_expired(void **state)
{
    (void)state;
    moonlet_client *c = new_client(g_lmaster.addr, NULL, NULL);
    const size_t big = 32u << 20;
    unsigned char *data = cl_random_bytes(big, 11), *got = malloc(big);
    assert_int_equal(moonlet_client_put(c, "big", data, big, NULL), MOONLET_OK);
    assert_int_equal(assert_every_get_fails(c, "big", got, big, MOONLET_ERR_LEASE_EXPIRED), big);
    size_t len = 0;
    /* an empty object has no bytes a reclaimed lease could change */
    assert_int_equal(moonlet_client_put(c, "empty", "", 0, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_get(c, "empty", NULL, 0, NULL, &len), MOONLET_OK);
    assert_int_equal(len, 0);
    moonlet_client_destroy(c);
    free(data);
    free(got);
}

/* ---- the auth token guards both paths ---------------------------------------------------- */

static void test_auth_token(void **state)
{
    (void)state;
    char path[] = "/tmp/moonlet-client-token-XXXXXX";
    assert_int_equal(cl_token_file(path, "t0ken"), 0);
    const char *const flags[] = {"--auth-token-file", path, NULL};
    test_proc m, s;
    assert_int_equal(cl_start_master(&m, flags), 0);
    assert_int_equal(cl_start_store(&s, m.addr, "8MiB", flags), 0);
    moonlet_client_config cfg = cl_client_config(m.addr);
    moonlet_client *c = NULL;
    assert_int_equal(moonlet_client_create(&cfg, &c), MOONLET_ERR_ILLEGAL_CLIENT);
    cfg.auth_token = "wrong";
    assert_int_equal(moonlet_client_create(&cfg, &c), MOONLET_ERR_ILLEGAL_CLIENT);
    c = new_client(m.addr, NULL, "t0ken");
    unsigned char *data = cl_random_bytes(1u << 20, 21);
    assert_int_equal(moonlet_client_put(c, "secret", data, 1u << 20, NULL), MOONLET_OK);
    cl_assert_get_equals(c, "secret", NULL, data, 1u << 20);
    /* the store's data endpoint refuses a peer without the token */
    moonlet_replica_list l;
    moonlet_master_client_opts mo = {.auth_token = "t0ken"};
    moonlet_master_client *mc;
    assert_int_equal(moonlet_mc_create(m.addr, &mo, &mc), MOONLET_OK);
    assert_int_equal(moonlet_mc_get_replica_list(mc, NULL, "secret", &l), MOONLET_OK);
    moonlet_xfer_opts xo = {.protocol = MOONLET_XFER_TCP, .timeout_ms = 2000};
    moonlet_xfer *x;
    assert_int_equal(moonlet_xfer_create(&xo, &x), MOONLET_OK);
    unsigned char buf[64];
    assert_int_equal(moonlet_xfer_read(x, l.replicas[0].endpoint, l.replicas[0].segment_id,
                                       l.replicas[0].offset, buf, sizeof(buf)),
                     MOONLET_ERR_ILLEGAL_CLIENT);
    moonlet_xfer_destroy(x);
    moonlet_replica_list_free(&l);
    moonlet_mc_destroy(mc);
    moonlet_client_destroy(c);
    free(data);
    assert_int_equal(proc_stop(&s), 0);
    assert_int_equal(proc_stop(&m), 0);
    unlink(path);
}

/* ---- end-to-end checksum: corrupted replicas ---------------------------------------------------- */

static test_proc g_cmaster, g_cstore;

static int setup_checksum(void **state)
{
    (void)state;
    return cl_start_master(&g_cmaster, NULL);
}

static int teardown_checksum(void **state)
{
    (void)state;
    proc_stop(&g_cstore);
    proc_stop(&g_cmaster);
    return 0;
}

/* The offset of key's replica on the segment served at endpoint `own`. */
static uint64_t replica_offset_at(const char *key, const char *own)
{
    moonlet_master_client *mc;
    assert_int_equal(moonlet_mc_create(g_cmaster.addr, NULL, &mc), MOONLET_OK);
    moonlet_replica_list l;
    assert_int_equal(moonlet_mc_get_replica_list(mc, NULL, key, &l), MOONLET_OK);
    uint64_t off = UINT64_MAX;
    for (uint32_t i = 0; i < l.count; i++)
        if (strcmp(l.replicas[i].endpoint, own) == 0)
            off = l.replicas[i].offset;
    moonlet_replica_list_free(&l);
    moonlet_mc_destroy(mc);
    assert_true(off != UINT64_MAX);
    return off;
}

static void test_checksum_corrupted_replica(void **state)
{
    (void)state;
    char own[128];
    moonlet_client *c = new_local_client(g_cmaster.addr, 8u << 20, own, sizeof(own));
    uint8_t *seg = moonlet_client_local_segment_base(c);
    assert_non_null(seg);
    const size_t n = 64u << 10;
    unsigned char *data = cl_random_bytes(n, 77), *got = malloc(n);

    /* The only segment is the local one: a corrupted replica is an error on
     * every get path, never success with the wrong bytes. */
    assert_int_equal(moonlet_client_put(c, "ck/a", data, n, NULL), MOONLET_OK);
    cl_assert_get_equals(c, "ck/a", NULL, data, n);
    seg[replica_offset_at("ck/a", own) + 100] ^= 0x01;
    assert_every_get_fails(c, "ck/a", got, n, MOONLET_ERR_INVALID_READ);
    size_t len = 0;
    int32_t res[1];

    /* put_from / batch_put_from record it too */
    unsigned char *reg = malloc(n);
    memcpy(reg, data, n);
    assert_int_equal(moonlet_client_register_buffer(c, reg, n), MOONLET_OK);
    assert_int_equal(moonlet_client_put_from(c, "ck/from", reg, n, NULL), MOONLET_OK);
    const char *bkeys[] = {"ck/batch"};
    const void *bsrc[] = {reg};
    size_t blen[] = {n};
    assert_int_equal(moonlet_client_batch_put_from(c, bkeys, 1, bsrc, blen, NULL, res), MOONLET_OK);
    assert_int_equal(moonlet_client_upsert(c, "ck/upsert", data, n, NULL), MOONLET_OK);
    assert_int_equal(moonlet_client_upsert(c, "ck/upsert", data, n, NULL), MOONLET_OK);
    const char *corrupt[] = {"ck/from", "ck/batch", "ck/upsert"};
    for (int i = 0; i < 3; i++) {
        cl_assert_get_equals(c, corrupt[i], NULL, data, n);
        seg[replica_offset_at(corrupt[i], own) + (size_t)i * 1000] ^= 0x80;
        assert_int_equal(moonlet_client_get(c, corrupt[i], got, n, NULL, &len),
                         MOONLET_ERR_INVALID_READ);
    }
    assert_int_equal(moonlet_client_unregister_buffer(c, reg), MOONLET_OK);
    free(reg);

    /* A put that skips the checksum reads as before (no check possible). */
    moonlet_put_options skip = {.skip_checksum = true};
    assert_int_equal(moonlet_client_put(c, "ck/skip", data, n, &skip), MOONLET_OK);
    seg[replica_offset_at("ck/skip", own)] ^= 0x01;
    assert_int_equal(moonlet_client_get(c, "ck/skip", got, n, NULL, &len), MOONLET_OK);
    assert_int_equal(got[0], data[0] ^ 0x01);

    /* Two replicas, the preferred (local) one corrupted: the get falls over
     * to the good one and succeeds with the right bytes. */
    assert_int_equal(cl_start_store(&g_cstore, g_cmaster.addr, "16MiB", NULL), 0);
    moonlet_put_options two = {.replica_num = 2};
    assert_int_equal(moonlet_client_put(c, "ck/two", data, n, &two), MOONLET_OK);
    seg[replica_offset_at("ck/two", own) + 5] ^= 0x10;
    cl_assert_get_equals(c, "ck/two", NULL, data, n);
    free(got);
    free(data);
    moonlet_client_destroy(c);
}

/* ---- a master without the batch methods -------------------------------------------------- */

/* A master that predates the batch methods (they answer "unknown method"):
 * the client makes the single calls instead, with the same per-key results. */
static void test_batch_older_master(void **state)
{
    (void)state;
    static const char *const flags[] = {
        "--disable-method", "BatchPutStart,BatchPutEnd,BatchPutRevoke,BatchGetReplicaList", NULL};
    test_proc m, st;
    assert_int_equal(cl_start_master(&m, flags), 0);
    assert_int_equal(cl_start_store(&st, m.addr, "32MiB", NULL), 0);
    moonlet_client_config cfg = cl_client_config(m.addr);
    moonlet_client *c = cl_client_of(&cfg);
    moonlet_master_client *mc;
    assert_int_equal(moonlet_mc_create(m.addr, NULL, &mc), MOONLET_OK);
    unsigned char *data = cl_random_bytes(3 * 1000, 5), got[3 * 1000];
    assert_int_equal(moonlet_client_register_buffer(c, data, 3 * 1000), MOONLET_OK);
    assert_int_equal(moonlet_client_register_buffer(c, got, sizeof(got)), MOONLET_OK);
    assert_int_equal(moonlet_client_put(c, "old/taken", "x", 1, NULL), MOONLET_OK);
    const char *keys[] = {"old/0", "old/taken", "old/2"};
    const void *bufs[] = {data, data + 1000, data + 2000};
    const size_t lens[] = {1000, 1000, 1000};
    int32_t res[3];
    CL_ASSERT_BATCH(moonlet_client_batch_put_from(c, keys, 3, bufs, lens, NULL, res), res,
                    MOONLET_OK, MOONLET_ERR_OBJECT_ALREADY_EXISTS, MOONLET_OK);
    const char *gk[] = {"old/0", "old/none", "old/2"};
    void *gb[] = {got, got + 1000, got + 2000};
    size_t sizes[3];
    CL_ASSERT_BATCH(moonlet_client_batch_get_into(c, gk, 3, gb, lens, NULL, sizes, res), res,
                    MOONLET_OK, MOONLET_ERR_OBJECT_NOT_FOUND, MOONLET_OK);
    assert_memory_equal(got, data, 1000);
    assert_memory_equal(got + 2000, data + 2000, 1000);
    cJSON *j = NULL;
    assert_int_equal(moonlet_mc_stats(mc, &j), MOONLET_OK);
    const cJSON *calls = cJSON_GetObjectItem(j, "calls");
    assert_int_equal(cJSON_GetObjectItem(calls, "PutStart")->valueint, 4); /* taken, then 3 */
    assert_int_equal(cJSON_GetObjectItem(calls, "PutEnd")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItem(calls, "GetReplicaList")->valueint, 3);
    assert_null(cJSON_GetObjectItem(calls, "BatchPutStart"));
    cJSON_Delete(j);
    moonlet_client_destroy(c);
    moonlet_mc_destroy(mc);
    free(data);
    proc_stop(&st);
    proc_stop(&m);
}

int main(int argc, char **argv)
{
    /* `test_client dummy`: the backend-neutral group on a DummyClient. */
    g_dummy = argc > 1 && strcmp(argv[1], "dummy") == 0;
    const struct CMUnitTest neutral[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_tenants),
        cmocka_unit_test(test_upsert),
        cmocka_unit_test(test_registered_buffers),
        cmocka_unit_test(test_copying_batches),
        cmocka_unit_test(test_batch_one_round_trip),
        cmocka_unit_test(test_batch_replicas),
        cmocka_unit_test(test_ranged_batches_in_place),
        cmocka_unit_test(test_batch_probe_policy),
        cmocka_unit_test(test_concurrent_use),
    };
    if (g_dummy)
        return cmocka_run_group_tests_name("client_dummy", neutral, setup_cluster,
                                           teardown_cluster);
    const struct CMUnitTest pure[] = {
        cmocka_unit_test(test_lease_decision),
        cmocka_unit_test(test_replica_order),
    };
    /* the direct client: the neutral group, then the tests of its own */
    const struct CMUnitTest direct[] = {
        cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_staging_path),
        cmocka_unit_test(test_local_segment),
        cmocka_unit_test(test_batch_older_master),
        cmocka_unit_test(test_put_revoked_when_write_fails), /* last: kills a store */
    };
    const struct CMUnitTest lease[] = {
        cmocka_unit_test(test_lease_expired),
    };
    const struct CMUnitTest auth[] = {
        cmocka_unit_test(test_auth_token),
    };
    const struct CMUnitTest checksum[] = {
        cmocka_unit_test(test_checksum_corrupted_replica),
    };
    int failed = cmocka_run_group_tests_name("client_pure", pure, NULL, NULL);
    failed += cmocka_run_group_tests_name("client", neutral, setup_cluster, teardown_cluster);
    failed += cmocka_run_group_tests_name("client_direct", direct, setup_cluster, teardown_cluster);
    failed += cmocka_run_group_tests_name("client_lease", lease, setup_short_lease,
                                          teardown_short_lease);
    failed += cmocka_run_group_tests_name("client_auth", auth, NULL, NULL);
    failed += cmocka_run_group_tests_name("client_checksum", checksum, setup_checksum,
                                          teardown_checksum);
    return failed;
}
