"""The call patterns of the three engines' Mooncake backends, replayed on moonlet.

Each test makes the calls an engine's public Mooncake code makes, in its
order and with its argument forms (setup, put path, lookup, load path,
reset), through `from mooncake.store import ...`, against a real
moonlet-master and store node; each runs twice: as a client of its own
(setup) and through a RealClient (setup_dummy, Mooncake's "host:port" form).
They assert the bytes read back and the return codes the engine branches
on.  The engines' own code is not imported (none of them is installed
here); what each step stands for is said beside it.

This module starts its own cluster (conftest.Cluster) in its own pytest
process (meson test `engine_patterns`), so the engines' default tenant is
its alone and `remove_all()` touches nothing else.

The engines that hand moonlet addresses (vLLM's KV caches, SGLang's pools)
run once with host memory and once with device memory (`mem`): CUDA device
memory of the driver MOONLET_CUDA_DRIVER names, in CI the fake driver
(tests/gpu/fakecuda.c), which the host cannot touch, so a path that reads
or writes device memory from the host kills the test.  Such memory is
filled and checked by driver copies only.  LMCache's connector hands
moonlet Python bytes and reads into the store's memory: host only.
"""
import ctypes
import json
import os
import uuid

import pytest

from mooncake.store import MooncakeDistributedStore, ReplicateConfig

MIB = 1 << 20


@pytest.fixture(params=["setup", "setup_dummy"])
def engine_store(request, cluster, tmp_path, monkeypatch):
    """A set-up MooncakeDistributedStore and a function that sets up another
    the same way (a second engine instance: the loader)."""

    def make():
        s = MooncakeDistributedStore()
        if request.param == "setup":
            # vLLM / SGLang / LMCache read these fields from MOONCAKE_CONFIG_PATH
            # (or their own config) and pass them positionally
            cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                   "global_segment_size": 32 * MIB, "local_buffer_size": 16 * MIB,
                   "protocol": "tcp", "device_name": "", "master_server_address": cluster.addr}
            path = tmp_path / "mooncake.json"
            path.write_text(json.dumps(cfg))
            monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
            with open(os.environ["MOONCAKE_CONFIG_PATH"]) as f:
                c = json.load(f)
            rc = s.setup(c["local_hostname"], c["metadata_server"], c["global_segment_size"],
                         c["local_buffer_size"], c["protocol"], c["device_name"],
                         c["master_server_address"])
        else:
            # SGLang's standalone storage / a DummyClient: the RealClient's host:port
            monkeypatch.setenv("MOONLET_REALCLIENT_SOCKET", cluster.realclient())
            rc = s.setup_dummy(mem_pool_size=0, local_buffer_size=16 * MIB,
                               server_address="127.0.0.1:50052")
        assert rc == 0
        host, port = s.get_hostname().rsplit(":", 1)
        assert host and port.isdigit()
        return s

    stores = []

    def factory():
        stores.append(make())
        return stores[-1]

    yield factory
    for s in stores:
        assert s.close() == 0


def _pattern(n, seed):
    pattern = bytes((seed * 131 + i * 7) & 0xFF for i in range(251))
    return (pattern * (n // 251 + 1))[:n]


class HostMem:
    """Host memory, as the engines' CPU tensors and pools."""

    def __init__(self):
        self._bufs = {}

    def alloc(self, n, device=0):
        b = (ctypes.c_ubyte * n)()
        self._bufs[ctypes.addressof(b)] = b
        return ctypes.addressof(b)

    def free(self, p):
        del self._bufs[p]

    @staticmethod
    def write(p, data):
        ctypes.memmove(p, bytes(data), len(data))

    @staticmethod
    def read(p, n):
        return ctypes.string_at(p, n)

    @staticmethod
    def memset(p, n):
        ctypes.memset(p, 0, n)


@pytest.fixture(params=["host", "device"])
def mem(request):
    """Where the engine keeps its KV cache: host memory, or device memory
    (two devices; tensors alternate between them)."""
    if request.param == "host":
        return HostMem()
    from fakegpu import FakeGPU
    if not FakeGPU.available():
        pytest.fail("MOONLET_CUDA_DRIVER is not set: run through meson test (engine_patterns)")
    return FakeGPU()


# ---- vLLM: the Mooncake store connector ------------------------------------------------------


def test_vllm_store_connector(engine_store, mem):
    """Every block of every layer: one key per block, its bytes spread over
    the per-layer KV cache tensors (batch_put_from_multi_buffers /
    batch_get_into_multi_buffers), lookup by batch_is_exist."""
    layers, blocks, block_bytes = 4, 8, 4096
    tensor_bytes = blocks * block_bytes
    prefix = "vllm/" + uuid.uuid4().hex[:8]
    saver, loader = engine_store(), engine_store()

    # register_kv_caches: every layer's tensor, on both instances
    src = [mem.alloc(tensor_bytes, device=i % 2) for i in range(layers)]
    dst = [mem.alloc(tensor_bytes, device=i % 2) for i in range(layers)]
    for i, t in enumerate(src):
        mem.write(t, _pattern(tensor_bytes, i))
    for s, tensors in ((saver, src), (loader, dst)):
        for t in tensors:
            assert s.register_buffer(t, tensor_bytes) == 0

    def layout(tensors, block_ids):
        ptrs = [[t + b * block_bytes for t in tensors] for b in block_ids]
        return ptrs, [[block_bytes] * layers for _ in block_ids]

    keys = [f"{prefix}/{b}" for b in range(blocks)]
    # lookup before save: nothing hits
    assert saver.batch_is_exist(keys) == [0] * blocks
    # save the first 6 blocks (skipping what exists, as the connector does)
    exists = saver.batch_is_exist(keys[:6])
    todo = [b for b in range(6) if exists[b] != 1]
    ptrs, sizes = layout(src, todo)
    assert saver.batch_put_from_multi_buffers([keys[b] for b in todo], ptrs, sizes) == [0] * 6
    # a repeated save of existing blocks is 0 per key, not an error
    assert saver.batch_put_from_multi_buffers(keys[:2], ptrs[:2], sizes[:2]) == [0, 0]
    # lookup on the loader: the number of leading hits
    hits = loader.batch_is_exist(keys)
    assert hits == [1] * 6 + [0] * 2
    n_hit = next((i for i, h in enumerate(hits) if h != 1), len(hits))
    # load them into other block slots (block b -> slot b + 1)
    ptrs, sizes = layout(dst, [b + 1 for b in range(n_hit)])
    res = loader.batch_get_into_multi_buffers(keys[:n_hit], ptrs, sizes)
    assert res == [layers * block_bytes] * n_hit
    for t_src, t_dst in zip(src, dst):
        got, want = mem.read(t_dst, tensor_bytes), mem.read(t_src, tensor_bytes)
        for b in range(n_hit):
            assert got[(b + 1) * block_bytes:(b + 2) * block_bytes] == \
                want[b * block_bytes:(b + 1) * block_bytes]
    # a missing block is its own code; the others still load
    res = loader.batch_get_into_multi_buffers([keys[0], keys[7]], ptrs[:2], sizes[:2])
    assert res == [layers * block_bytes, -704]
    if not isinstance(mem, HostMem):  # the device tensors went through the staged path
        for s in (saver, loader):
            st = s._store.gpu_stats()
            assert st["buffers"] == layers and st["in_place"] == 0
            assert st["staged_calls"] > 0 and 0 < st["pinned_bytes"] <= st["pinned_bound"]
    # reset: unregister, close (the fixture closes)
    for s, tensors in ((saver, src), (loader, dst)):
        for t in tensors:
            assert s.unregister_buffer(t) == 0
    for t in src + dst:
        mem.free(t)


# ---- SGLang: HiCache's mooncake_store backend ------------------------------------------------


def test_sglang_hicache(engine_store, mem):
    """Warm-up put/is_exist/get, the host KV pool registered (from
    MooncakeHostMemAllocator, as standalone storage allocates it), pages
    stored k/v-split with batch_put_from and layer-first with
    batch_put_from_multi_buffers, batch_exists by leading hits, loads with
    batch_get_into and the direct loader's sessions and ranges, clear()."""
    store = engine_store()
    prefix = "sgl/" + uuid.uuid4().hex[:8]
    # warm-up, as the backend's __init__ does
    warm_key, warm = f"{prefix}/warmup", bytes(range(256)) * 16
    assert store.put(warm_key, warm) == 0
    assert store.is_exist(warm_key) == 1
    assert store.get(warm_key) == warm

    from mooncake.store import MooncakeHostMemAllocator
    alloc = MooncakeHostMemAllocator()
    pages, page_bytes = 4, 8192
    pool_bytes = 2 * pages * page_bytes
    # the kv pool, and the pages the loader fills: the host pool the
    # standalone storage allocates, or the device pool the direct linker has
    host = alloc.alloc(2 * pool_bytes) if isinstance(mem, HostMem) else mem.alloc(2 * pool_bytes)
    assert host != 0
    assert store.register_buffer(host, 2 * pool_bytes) == 0
    pool = _pattern(pool_bytes, 3)
    mem.write(host, pool)
    load = host + pool_bytes

    # page-first layout: key "<hash>_k" / "<hash>_v" per page
    hashes = [f"{prefix}/p{i}" for i in range(pages)]
    keys = [f"{h}_{kv}" for h in hashes for kv in ("k", "v")]
    ptrs = [host + i * page_bytes for i in range(2 * pages)]
    assert store.batch_is_exist(keys) == [0] * len(keys)
    assert store.batch_put_from(keys, ptrs, [page_bytes] * len(keys)) == [0] * len(keys)
    # batch_exists: leading pages whose every key exists
    exist = store.batch_is_exist(keys[:6] + [f"{prefix}/absent_k"])
    assert exist == [1] * 6 + [0]
    # load: batch_get_into per key, byte counts back
    res = store.batch_get_into(keys, [load + i * page_bytes for i in range(len(keys))],
                               [page_bytes] * len(keys))
    assert res == [page_bytes] * len(keys)
    assert mem.read(load, pool_bytes) == pool
    # mismatched lengths: -600 per key, as Mooncake's binding
    assert store.batch_put_from(keys[:2], ptrs[:1], [page_bytes]) == [-600, -600]
    assert store.batch_get_into(keys[:2], [load], [page_bytes, page_bytes]) == [-600, -600]

    # layer-first layout (two layers, each page's object spans both)
    lf_keys = [f"{prefix}/lf{i}" for i in range(2)]
    half = page_bytes // 2
    lf_ptrs = [[host + i * half, host + pool_bytes // 2 + i * half] for i in range(2)]
    assert store.batch_put_from_multi_buffers(lf_keys, lf_ptrs, [[half, half]] * 2) == [0, 0]

    # the direct loader: a get session, one ranged read per layer, session end
    mem.memset(load, pool_bytes)
    assert store.batch_get_session_start(lf_keys) == [0, 0]
    for layer in range(2):
        got = store.batch_get_into_multi_buffer_ranges(
            lf_keys, [[load + layer * pool_bytes // 2 + i * half] for i in range(2)],
            [[half]] * 2, [[layer * half]] * 2)
        assert got == [half, half]
    assert store.batch_get_session_end(lf_keys) == 0
    for i in range(2):
        for layer in range(2):
            off = layer * pool_bytes // 2 + i * half
            assert mem.read(load + off, half) == pool[off:off + half]
    # a missing key in a session: its code, the others open
    assert store.batch_get_session_start([lf_keys[0], f"{prefix}/none"]) == [0, -704]
    assert store.batch_get_session_end([lf_keys[0]]) == 0

    # clear(): remove_all returns how many went (leased objects stay)
    removed = store.remove_all()
    assert removed >= 0
    assert store.unregister_buffer(host) == 0
    if isinstance(mem, HostMem):
        assert alloc.free(host) == 0 and alloc.free(host) == -600
    else:
        mem.free(host)


# ---- LMCache: the Mooncake remote connector ----------------------------------------------------


def test_lmcache_connector(engine_store):
    """Objects are a metadata header plus the KV bytes (put_parts with a
    ReplicateConfig); exists by is_exist / batch_is_exist; reads by
    get_buffer / batch_get_buffer (memoryview of the handle, .size()),
    None for a miss; remove; close."""
    store = engine_store()
    prefix = "lmc/" + uuid.uuid4().hex[:8]
    meta_len = 28
    chunks = {f"{prefix}@{i}": (i.to_bytes(4, "little") * 7, os.urandom(64 * 1024 + i))
              for i in range(3)}
    config = ReplicateConfig()
    config.replica_num = 1
    for key, (meta, kv) in chunks.items():
        assert store.is_exist(key) == 0
        assert store.put_parts(key, meta, kv, config=config) == 0
        assert store.is_exist(key) == 1
    keys = list(chunks)
    assert store.batch_is_exist(keys + [f"{prefix}@missing"]) == [1, 1, 1, 0]
    # the default read path: get_buffer, parse the header, take the KV bytes
    for key, (meta, kv) in chunks.items():
        buf = store.get_buffer(key)
        assert buf is not None
        view = memoryview(buf)
        assert buf.size() == len(view) == meta_len + len(kv)
        assert bytes(view[:meta_len]) == meta and bytes(view[meta_len:]) == kv
        assert ctypes.string_at(buf.ptr(), meta_len) == meta
        del view, buf
    assert store.get_buffer(f"{prefix}@missing") is None
    bufs = store.batch_get_buffer(keys + [f"{prefix}@missing"])
    assert bufs[3] is None
    assert [bytes(b) for b in bufs[:3]] == [m + kv for m, kv in chunks.values()]
    del bufs
    # plain put / get, which the connector uses for small objects
    assert store.put(f"{prefix}@small", memoryview(b"abc")) == 0
    assert store.get(f"{prefix}@small") == b"abc"
    # remove of a fresh, unread object
    assert store.put(f"{prefix}@gone", b"x") == 0
    assert store.remove(f"{prefix}@gone") == 0
    assert store.is_exist(f"{prefix}@gone") == 0


# ---- a C / C++ engine: docs/examples/engine_client.c -------------------------------------------


@pytest.mark.parametrize("engine", ["mooncake_setup", "vllm_config", "refused"])
def test_ssd_offload_setups(cluster, tmp_path, monkeypatch, engine):
    """The engines' SSD-offload switches: Mooncake's setup(...,
    enable_ssd_offload=True, ssd_offload_path=DIR) and vLLM's config file
    (enable_offload with ssd_offload_path) give the client's own segment a
    disk tier (its file appears, its disk segment is mounted, puts and gets
    work); without a segment of its own the switch is refused (-600)."""
    import shutil
    import subprocess

    import daemons

    d = daemons.direct_io_dir(f"test-engine-ssd-{engine}-")
    tenant = f"ssd-{uuid.uuid4().hex[:8]}"
    s = MooncakeDistributedStore()
    try:
        if engine == "mooncake_setup":
            rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MIB, 16 * MIB, "tcp", "",
                         cluster.addr, tenant_id=tenant, enable_ssd_offload=True,
                         ssd_offload_path=d, ssd_offload_size="64MB")
        elif engine == "vllm_config":
            cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                   "global_segment_size": "16MB", "local_buffer_size": "16MB",
                   "protocol": "tcp", "device_name": "", "master_server_address": cluster.addr,
                   "tenant_id": tenant, "enable_offload": True, "ssd_offload_path": d}
            path = tmp_path / "mooncake.json"
            path.write_text(json.dumps(cfg))
            monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
            rc = s.setup()
        else:
            assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MIB, "tcp", "", cluster.addr,
                           tenant_id=tenant, enable_ssd_offload=True,
                           ssd_offload_path=d) == -600
            assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MIB, 16 * MIB, "tcp", "",
                           cluster.addr, tenant_id=tenant, enable_ssd_offload=True) == -600
            assert not os.listdir(d)
            return
        assert rc == 0
        assert os.path.getsize(os.path.join(d, "moonlet-disk.tier")) >= 64 * MIB
        out = subprocess.run([daemons.tool("moonlet-inspect"), "--master", cluster.addr,
                              "--json", "segments"], capture_output=True, text=True,
                             timeout=30, check=True, env=daemons.child_env())
        disks = [g for g in json.loads(out.stdout)["segments"] if g["disk"]]
        assert len(disks) >= 1
        value = bytes(range(256)) * 1024
        assert s.put("ssd/k", value) == 0 and s.get("ssd/k") == value
    finally:
        s.close()
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("build", ["engine_client_example", "engine_client_example_cpp"])
@pytest.mark.parametrize("how", ["direct", "dummy"])
def test_c_engine_example(cluster, build, how):
    """The C API example of docs/api-c.md, built as C and as C++, run as is."""
    import subprocess
    from daemons import build_root, child_env
    exe = os.path.join(build_root(), "tests", "store", build)
    if not os.path.exists(exe):
        pytest.skip("no C++ compiler at configure time")
    args = [cluster.addr] if how == "direct" else ["--dummy", cluster.realclient()]
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, env=child_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "put 6 pages: 0 0 0 0 0 0",
        "lookup: 6 leading hits",
        "load: 6 pages, 16384 bytes each, bytes equal",
        "load of a missing page: -704 (OBJECT_NOT_FOUND)",
        "remove of a page just read: -706 (OBJECT_HAS_LEASE)",
        "remove_all: ok",
    ]
