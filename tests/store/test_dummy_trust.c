/*
 * Trust between a DummyClient and the process on its socket (issue 13):
 *  - a server run by another uid (here: nobody, when the test runs as root)
 *    bound the path first: the DummyClient refuses it (ILLEGAL_CLIENT) before
 *    it sends anything, unless configured to trust that uid or group;
 *  - a "RealClient" that claims a 1 GiB object in reply to a get into a
 *    small room: every get path returns RPC_FAIL instead of reading (or
 *    letting the caller read) past the room.
 * The fake servers run in forked children stopped by their PID.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dummy_proto.h"
#include "moonlet/client.h"
#include "moonlet/error.h"
#include "rpc_server.h"
#include "wire.h"

#define LIE_SIZE (UINT64_C(1) << 30)

static _Atomic unsigned *g_attaches; /* shared with the children */

static int h_attach(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    (void)args;
    int fd = moonlet_rpc_ctx_take_fd(ctx);
    if (fd >= 0)
        close(fd);
    atomic_fetch_add(g_attaches, 1);
    msgpack_pack_array(out, 2);
    msgpack_pack_int(out, 0);
    moonlet_pack_cstr(out, "tcp");
    return 0;
}

static int h_get(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    (void)ctx;
    (void)args;
    msgpack_pack_array(out, 2);
    msgpack_pack_int(out, 0);
    msgpack_pack_uint64(out, LIE_SIZE);
    return 0;
}

static int h_batch_get(moonlet_rpc_ctx *ctx, const msgpack_object *args, msgpack_packer *out)
{
    (void)ctx;
    const msgpack_object *items;
    uint32_t n = moonlet_wire_array(args, 1, &items) ? 0 : moonlet_wire_len(items);
    msgpack_pack_array(out, 3);
    msgpack_pack_int(out, 0);
    msgpack_pack_array(out, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_int(out, 0);
    msgpack_pack_array(out, n);
    for (uint32_t i = 0; i < n; i++)
        msgpack_pack_uint64(out, LIE_SIZE);
    return 0;
}

static const moonlet_rpc_method g_methods[] = {
    {MOONLET_DM_ATTACH, "Attach", h_attach, NULL, 0},
    {MOONLET_DM_GET, "Get", h_get, NULL, 0},
    {MOONLET_DM_BATCH_GET, "BatchGet", h_batch_get, NULL, 0},
};

/* Forks a fake RealClient on `path`, run as uid/gid `as` (-1: unchanged). */
static pid_t fake_start(const char *path, int as)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(120); /* never outlive the test */
        if (as >= 0 && (setgid((gid_t)as) || setuid((uid_t)as)))
            _exit(3);
        moonlet_rpc_server_opts o = {.unix_path = path, .threads = 1, .methods = g_methods,
                                     .nmethods = 3};
        moonlet_rpc_server *s = NULL;
        if (moonlet_rpc_server_create(&o, &s) || moonlet_rpc_server_start(s))
            _exit(4);
        char ok = 1;
        if (write(p[1], &ok, 1) != 1)
            _exit(5);
        for (;;)
            pause();
    }
    close(p[1]);
    char ok = 0;
    assert_int_equal(read(p[0], &ok, 1), 1);
    close(p[0]);
    return pid;
}

/* A fake real client serving on path, a socket in its own directory dir. */
struct fake {
    char dir[32];
    char path[128];
    pid_t pid;
};

/* Starts f's fake (as uid/gid `as` unless negative) in a new directory
 * under /tmp, world-writable with `world_writable`. */
static void fake_up(struct fake *f, int as, bool world_writable)
{
    snprintf(f->dir, sizeof(f->dir), "/tmp/mlt-trust-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    if (world_writable)
        assert_int_equal(chmod(f->dir, 0777), 0);
    snprintf(f->path, sizeof(f->path), "%s/real.sock", f->dir);
    f->pid = fake_start(f->path, as);
}

/* Stops f's fake and removes its socket and directory. */
static void fake_down(struct fake *f)
{
    kill(f->pid, SIGKILL);
    waitpid(f->pid, NULL, 0);
    unlink(f->path);
    rmdir(f->dir);
}

static void test_other_owner_refused(void **state)
{
    (void)state;
    if (getuid() != 0)
        skip(); /* needs a second uid to run the impostor as */
    struct fake f;
    fake_up(&f, 65534, true); /* the world-writable /tmp case */
    atomic_store(g_attaches, 0);

    moonlet_client *c = NULL;
    assert_int_equal(moonlet_client_create_dummy(f.path, NULL, &c), MOONLET_ERR_ILLEGAL_CLIENT);
    assert_null(c);
    assert_int_equal(atomic_load(g_attaches), 0); /* not even the staging memfd went out */

    /* trusted explicitly by uid, or by group */
    moonlet_dummy_config cfg;
    moonlet_dummy_config_init(&cfg, sizeof cfg);
    cfg.peer_uid_set = true;
    cfg.peer_uid = 65534;
    assert_int_equal(moonlet_client_create_dummy(f.path, &cfg, &c), MOONLET_OK);
    moonlet_client_destroy(c);
    moonlet_dummy_config_init(&cfg, sizeof cfg);
    cfg.peer_gid_set = true;
    cfg.peer_gid = 65534;
    assert_int_equal(moonlet_client_create_dummy(f.path, &cfg, &c), MOONLET_OK);
    moonlet_client_destroy(c);
    assert_true(atomic_load(g_attaches) >= 2);
    fake_down(&f);
}

static void test_lying_sizes(void **state)
{
    (void)state;
    struct fake f;
    fake_up(&f, -1, false);
    moonlet_dummy_config cfg;
    moonlet_dummy_config_init(&cfg, sizeof cfg);
    cfg.staging_bytes = 1 << 20;
    cfg.rpc_timeout_ms = 5000;
    moonlet_client *c = NULL;
    assert_int_equal(moonlet_client_create_dummy(f.path, &cfg, &c), MOONLET_OK);

    /* copying get: the staging area is 1 MiB, the claim 1 GiB */
    char buf[4096];
    size_t len = 7;
    assert_int_equal(moonlet_client_get(c, "k", buf, sizeof(buf), NULL, &len), MOONLET_ERR_RPC_FAIL);
    assert_true(len <= sizeof(buf));
    void *p = NULL;
    len = 0;
    assert_int_equal(moonlet_client_get_alloc(c, "k", NULL, &p, &len), MOONLET_ERR_RPC_FAIL);
    assert_null(p);
    /* zero-copy get into shared memory: the caller must not be told 1 GiB */
    void *sh = NULL;
    assert_int_equal(moonlet_client_alloc_shared(c, 4096, &sh), MOONLET_OK);
    len = 0;
    assert_int_equal(moonlet_client_get_into(c, "k", sh, 4096, NULL, &len), MOONLET_ERR_RPC_FAIL);
    assert_true(len <= 4096);
    /* batch get, copied and zero-copy items */
    const char *keys[2] = {"a", "b"};
    void *bufs[2] = {buf, sh};
    size_t caps[2] = {sizeof(buf), 4096}, lens[2] = {0, 0};
    int32_t res[2] = {0, 0};
    assert_int_equal(moonlet_client_register_buffer(c, buf, sizeof(buf)), MOONLET_OK);
    assert_int_equal(moonlet_client_batch_get_into(c, keys, 2, bufs, caps, NULL, lens, res),
                     MOONLET_ERR_RPC_FAIL);
    assert_int_equal(res[0], MOONLET_ERR_RPC_FAIL);
    assert_int_equal(res[1], MOONLET_ERR_RPC_FAIL);
    assert_true(lens[0] <= caps[0] && lens[1] <= caps[1]);
    moonlet_client_unregister_buffer(c, buf);
    moonlet_client_free_shared(c, sh);
    moonlet_client_destroy(c);
    fake_down(&f);
}

int main(void)
{
    g_attaches = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_attaches == MAP_FAILED)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_other_owner_refused),
        cmocka_unit_test(test_lying_sizes),
    };
    return cmocka_run_group_tests_name("dummy_trust", tests, NULL, NULL);
}
