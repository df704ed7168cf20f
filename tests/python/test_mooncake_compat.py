"""moonlet.mooncake: Mooncake Store's MooncakeDistributedStore on moonlet.

Checks Mooncake's return conventions (0 / negative codes instead of
exceptions, b"" for a missing key, is_exist 1 / 0), both forms of setup(),
setup_dummy() (through the RealClient) and the copying batches put_batch /
get_batch / put_parts on either setup.
"""
import array
import ctypes
import re
import shutil
import socket
import subprocess

import pytest

import moonlet
from conftest import K3, MIB
from daemons import child_env, start_store
from moonlet.mooncake import (MooncakeDistributedStore, ReplicateConfig, SoftPinAction,
                              parse_size)


@pytest.fixture
def mc(cluster, tenant):
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                    "global_segment_size": 0, "local_buffer_size": "16MB", "protocol": "tcp",
                    "master_server_address": cluster.addr, "tenant_id": tenant}) == 0
    yield s
    assert s.close() == 0


def test_setup_with_the_seven_positional_arguments(cluster):
    s = MooncakeDistributedStore()
    assert s.get("k") == b"" and s.put("k", b"v") == -1010  # not set up yet
    rc = s.setup("127.0.0.1", "http://127.0.0.1:8080/metadata", 16 * MIB, 16 * MIB, "tcp", "",
                 cluster.addr)
    assert rc == 0
    host, port = s.get_hostname().rsplit(":", 1)
    # no port given: one picked in Mooncake's range, where its memory is served
    assert host == "127.0.0.1" and 12300 <= int(port) <= 14300
    assert s.setup("127.0.0.1", "", 0, 0, "tcp", "", cluster.addr) == -600  # already set up
    key = "mc/pos/" + port
    assert s.put(key, b"positional") == 0
    assert s.get(key) == b"positional"
    assert s.remove(key) == -706  # leased by the get
    assert s.remove(key, force=True) == 0 and s.is_exist(key) == 0  # Mooncake's force
    assert s.close() == 0
    assert s.close() == 0


def test_setup_with_a_config_dict_and_readable_sizes(cluster, tenant):
    s = MooncakeDistributedStore()
    cfg = {"local_hostname": "127.0.0.1:0", "metadata_server": "P2PHANDSHAKE",
           "global_segment_size": "16MB", "local_buffer_size": "1.5 GB", "protocol": "tcp",
           "rdma_devices": "", "master_server_addr": cluster.addr, "tenant_id": tenant,
           "enable_ssd_offload": "false"}
    assert s.setup(cfg) == 0
    assert s.get_hostname().startswith("127.0.0.1:") and not s.get_hostname().endswith(":0")
    assert s.put("d", b"dict") == 0 and s.get("d") == b"dict"
    s.close()
    # Mooncake's keys and vLLM's spellings both work; pure client with 0
    s = MooncakeDistributedStore()
    assert s.setup({"local_hostname": "localhost", "global_segment_size": 0,
                    "master_server_address": cluster.addr, "tenant_id": tenant}) == 0
    host, port = s.get_hostname().rsplit(":", 1)  # always host:port, as Mooncake picks it
    assert host == "localhost" and 12300 <= int(port) <= 14300
    assert s.put("d2", b"pure client") == 0 and s.get("d2") == b"pure client"
    s.close()


def test_setup_errors_are_codes(cluster):
    bad = [({"local_hostname": "h", "global_segment_size": "16XB",
             "master_server_addr": cluster.addr}, -600),
           ({"local_hostname": "h", "local_buffer_size": "-5", "master_server_addr": cluster.addr},
            -600),
           ({"local_hostname": "h", "protocol": "efa", "master_server_addr": cluster.addr}, -600),
           ({"global_segment_size": 0, "master_server_addr": cluster.addr}, -600),  # no hostname
           ({"local_hostname": "h", "global_segment_size": 0,
             "master_server_addr": "127.0.0.1:1"}, -900)]
    for cfg, code in bad:
        assert MooncakeDistributedStore().setup(cfg) == code, cfg
    assert MooncakeDistributedStore().setup("h", "", 0, 0, "tcp", "", "127.0.0.1:1") == -900


def test_parse_size():
    assert parse_size("16MB") == 16 << 20
    assert parse_size("16 mb") == 16 << 20
    assert parse_size("1.5GB") == 3 << 29
    assert parse_size("512") == 512 and parse_size(7) == 7
    assert parse_size("2KiB") == 2048 and parse_size("1t") == 1 << 40
    for bad in ("16XB", "", "-5", "MB"):
        with pytest.raises(ValueError):
            parse_size(bad)
    with pytest.raises(TypeError):
        parse_size(1.5)


def test_return_conventions(mc):
    assert mc.get("missing") == b""
    assert mc.is_exist("missing") == 0
    assert mc.get_size("missing") == -704
    assert mc.remove("missing") == -704
    assert mc.put("k", b"value") == 0
    assert mc.put("k", b"other") == 0  # an existing key: 0, object unchanged (as Mooncake)
    assert mc.get("k") == b"value"
    assert mc.is_exist("k") == 1
    assert mc.get_size("k") == 5
    assert mc.batch_is_exist(["k", "missing", ""]) == [1, 0, -400]
    assert mc.upsert("u", b"1") == 0 and mc.upsert("u", b"22") == 0
    assert mc.get("u") == b"22"
    assert mc.put("", b"x") == -400
    assert mc.put("e", b"") == 0 and mc.get("e") == b"" and mc.get_size("e") == 0
    assert mc.put("r1", b"1") == 0 and mc.put("r2", b"2") == 0
    assert mc.remove("r1") == 0
    assert mc.remove("k") == -706  # leased by the get above
    assert mc.remove_all() == 1   # r2 (k, u, e hold leases)
    assert mc.batch_is_exist([]) == []


def test_replicate_config(mc, cluster):
    cluster.realclient()  # a second store node for two replicas
    cfg = ReplicateConfig()
    assert cfg.replica_num == 1 and cfg.with_soft_pin is False and cfg.preferred_segment == ""
    cfg.replica_num = 2
    cfg.with_soft_pin = True
    cfg.preferred_segment = "127.0.0.1:12345"  # no such segment: placed round-robin
    assert mc.put("rc", b"x" * 64, cfg) == 0
    info = mc._store.inspect("rc")
    assert len(info["replicas"]) == 2 and info["soft_pinned"] is True
    off = ReplicateConfig(soft_pin_action=SoftPinAction.DISABLE, with_soft_pin=True)
    assert mc.put("rc2", b"y", off) == 0
    assert mc._store.inspect("rc2")["soft_pinned"] is False
    assert [a.value for a in SoftPinAction] == [0, 1, 2]
    with pytest.raises(AttributeError):
        cfg.no_such_option = 1
    assert "replica_num=2" in repr(cfg)


def test_zero_copy(mc):
    n = 64 * 1024
    src = (ctypes.c_ubyte * n)(*[i & 0xFF for i in range(n)])
    dst = (ctypes.c_ubyte * (2 * n))()
    sp, dp = ctypes.addressof(src), ctypes.addressof(dst)
    assert mc.put_from("z", sp, n) == -600  # not registered yet
    assert mc.register_buffer(sp, n) == 0
    assert mc.register_buffer(dp, 2 * n) == 0
    assert mc.register_buffer(sp, n) == -600
    assert mc.put_from("z", sp, n) == 0
    assert mc.get_into("z", dp, 2 * n) == n
    assert bytes(dst[:n]) == bytes(src)
    assert mc.get_into("z", dp, n - 1) == -10
    assert mc.get_into("missing", dp, n) == -704
    assert mc.batch_put_from(["z0", "z1", "z"], [sp, sp + 10, sp], [10, 20, 5]) == [0, 0, 0]
    assert mc.batch_get_into(["z0", "z1", "nope", "z"], [dp, dp + 10, dp + 100, dp + 200],
                             [10, 20, 10, 10]) == [10, 20, -704, -10]
    assert bytes(dst[:30]) == bytes(src[:10]) + bytes(src[10:30])
    assert mc.batch_put_from(["zz"], [sp + n], [10]) == [-600]  # outside the registration
    assert mc.unregister_buffer(sp) == 0
    assert mc.unregister_buffer(sp) == -600
    assert mc.unregister_buffer(dp) == 0


def test_batch_probe_key(mc):
    for i in (0, 1, 3, 4):
        assert mc.put(K3[i], b"ckpt") == 0
    policy = moonlet.GrantLeasePolicy(moonlet.ProbeLeaseMode.LAST_HIT_ONLY, 2)
    assert mc.batch_probe_key(K3, policy) == [1, 1, 0, 0, 0, 0]
    assert mc.batch_probe_key(K3) == [1, 1, 0, 1, 1, 0]
    bad = moonlet.GrantLeasePolicy(moonlet.ProbeLeaseMode.LAST_HIT_ONLY, 4)
    assert mc.batch_probe_key(K3, bad) == [-600] * 6
    assert mc.batch_probe_key(["ok", ""], None)[1] == -400
    assert mc._store.inspect(K3[0])["lease_remaining_ms"] > 0
    assert mc._store.inspect(K3[3])["lease_remaining_ms"] == 0


# ---- setup_dummy ------------------------------------------------------------------------------


def test_setup_dummy(cluster, tenant):
    s = MooncakeDistributedStore()
    assert s.setup_dummy(256 * MIB, 64 * MIB, cluster.realclient(), tenant_id=tenant) == 0
    assert s.get_hostname() == "localhost:0"  # host:port; the RealClient holds the segment
    assert s._store.kind == "dummy" and s._store.target == cluster.realclient()
    assert s.setup_dummy(0, 0, cluster.realclient()) == -600  # already set up
    assert s.setup("127.0.0.1", "", 0, 0, "tcp", "", cluster.addr) == -600
    assert s.put("sd", b"through the RealClient") == 0
    assert s.get("sd") == b"through the RealClient"
    assert s.is_exist("sd") == 1 and s.get_size("sd") == 22
    assert s.close() == 0 and s.get("sd") == b"" and s.put("sd", b"x") == -1010
    # the RealClient stored it in the tenant: a direct client sees it
    d = MooncakeDistributedStore()
    assert d.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                    "master_server_address": cluster.addr, "tenant_id": tenant}) == 0
    assert d.get("sd") == b"through the RealClient"
    d.close()
    # sizes as setup() reads them; set up again after close()
    assert s.setup_dummy("1GB", "1.5 MB", cluster.realclient(), tenant_id=tenant) == 0
    assert s._store.kind == "dummy" and s.get("sd") == b"through the RealClient"
    s.close()


def test_setup_dummy_without_a_tenant_uses_the_realclients(cluster):
    s = MooncakeDistributedStore()
    assert s.setup_dummy(0, 0, cluster.realclient()) == 0
    key = "sd/default/" + cluster.realclient()
    assert s.put(key, b"default tenant") == 0
    with moonlet.Store.connect(cluster.addr, protocol="tcp") as d:  # tenant "default"
        assert d.get(key) == b"default tenant"
    s.close()


def test_setup_dummy_errors_are_codes(cluster, tmp_path):
    sock = cluster.realclient()
    for address in ("", None, 7, b"/tmp/real.sock", tmp_path):
        assert MooncakeDistributedStore().setup_dummy(0, 0, address) == -600, address
    for pool, buf in (("16XB", 0), (0, "-5"), (-1, 0), (0, 1.5), (0, True)):
        assert MooncakeDistributedStore().setup_dummy(pool, buf, sock) == -600, (pool, buf)
    assert MooncakeDistributedStore().setup_dummy(0, 0, "with\0nul") == -600
    assert MooncakeDistributedStore().setup_dummy(0, 0, "/x" * 100) == -600  # too long
    assert MooncakeDistributedStore().setup_dummy(0, 1 << 41, sock) == -600  # staging > 1 TiB
    # nothing listens there: the connect's own code
    s = MooncakeDistributedStore()
    assert s.setup_dummy(0, 0, str(tmp_path / "nobody.sock")) == -900
    assert s.get("k") == b"" and s.put("k", b"v") == -1010  # still not set up
    assert s.setup_dummy(0, 0, sock) == 0  # a failed setup leaves it usable
    s.close()


# ---- put_batch, get_batch, put_parts, after either setup ------------------------------------


@pytest.fixture(params=["setup", "setup_dummy"])
def mcs(request, cluster, tenant):
    """A MooncakeDistributedStore in the test's tenant, set up either way:
    a client of its own (setup) or through the RealClient (setup_dummy)."""
    s = MooncakeDistributedStore()
    if request.param == "setup":
        rc = s.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                      "protocol": "tcp", "master_server_address": cluster.addr,
                      "tenant_id": tenant})
    else:
        rc = s.setup_dummy(0, "16MB", cluster.realclient(), tenant_id=tenant)
    assert rc == 0
    yield s
    assert s.close() == 0


def test_put_batch_and_get_batch(mcs):
    keys = ["pb/bytes", "pb/bytearray", "pb/memoryview", "pb/slice", "pb/array", "pb/ctypes",
            "pb/empty"]
    values = [b"bytes", bytearray(b"bytearray"), memoryview(b"memoryview"),
              memoryview(b"--slice--")[2:7], array.array("B", b"array"),
              (ctypes.c_char * 6).from_buffer_copy(b"ctypes"), b""]
    assert mcs.put_batch(keys, values) == 0
    want = [b"bytes", b"bytearray", b"memoryview", b"slice", b"array", b"ctypes", b""]
    assert mcs.get_batch(keys) == want
    assert [mcs.get(k) for k in keys] == want
    assert mcs.get_batch(["pb/bytes", "pb/missing", "", "pb/empty"]) == [b"bytes", b"", b"", b""]
    # an existing key: 0 and the object stays (Mooncake's BatchPut counts it stored)
    assert mcs.put_batch(["pb/bytes", "pb/new"], [b"other", b"new"]) == 0
    assert mcs.get_batch(["pb/bytes", "pb/new"]) == [b"bytes", b"new"]
    # the first failed key's code, in key order; the other keys were stored
    assert mcs.put_batch(["pb/ok1", "", "pb/ok2"], [b"1", b"2", b"3"]) == -400
    assert mcs.get_batch(["pb/ok1", "pb/ok2"]) == [b"1", b"3"]
    # lists of different lengths: -600, nothing stored
    assert mcs.put_batch(["pb/m1", "pb/m2"], [b"1"]) == -600
    assert mcs.put_batch(["pb/m1"], [b"1", b"2"]) == -600
    assert mcs.is_exist("pb/m1") == 0
    assert mcs.put_batch([], []) == 0 and mcs.get_batch([]) == [b""]  # as Mooncake
    assert mcs.put_batch(iter(["pb/gen"]), (v for v in [b"generated"])) == 0
    assert mcs.get_batch(("pb/gen",)) == [b"generated"]
    with pytest.raises(TypeError):
        mcs.put_batch(["pb/str"], ["not bytes"])  # as put("k", "str") and Mooncake
    with pytest.raises(TypeError):
        mcs.put_batch("pb/one", b"value")
    with pytest.raises(TypeError):
        mcs.get_batch("pb/bytes")


def test_batch_calls_refuse_a_single_str_as_keys(mcs):
    # a str is a sequence of one-letter keys to list(); Mooncake refuses it
    assert mcs.put("k", b"v") == 0
    with pytest.raises(TypeError):
        mcs.batch_is_exist("k")
    with pytest.raises(TypeError):
        mcs.batch_probe_key("k")
    with pytest.raises(TypeError):
        mcs.batch_put_from("k", [0], [1])
    with pytest.raises(TypeError):
        mcs.batch_get_into("k", [0], [1])
    assert mcs.batch_is_exist(["k"]) == [1]


def test_batches_of_large_values(mcs):
    # larger than the 16 MB staging of setup_dummy in total, and one key alone
    keys = [f"big/{i}" for i in range(6)]
    values = [bytes([i]) * (3 * MIB + i) for i in range(5)] + [b"\x07" * (17 * MIB)]
    assert mcs.put_batch(keys, values) == 0
    assert mcs.get_batch(keys) == values
    assert mcs.get_batch(keys[:2] + ["big/missing"]) == values[:2] + [b""]


def test_put_batch_with_a_replicate_config(mcs, cluster):
    cluster.realclient()  # a second store node for two replicas
    cfg = ReplicateConfig(replica_num=2, with_soft_pin=True)
    assert mcs.put_batch(["pc/a", "pc/b"], [b"a" * 100, b"b"], cfg) == 0
    assert mcs.put_parts("pc/p", b"p", b"q", config=cfg) == 0
    for k in ("pc/a", "pc/b", "pc/p"):
        info = mcs._store.inspect(k)
        assert len(info["replicas"]) == 2 and info["soft_pinned"] is True, k
    assert mcs.put_batch(["pc/c"], [b"c"], ReplicateConfig(replica_num=1000)) == -600


def test_put_parts(mcs):
    assert mcs.put_parts("pp/k", b"head|", bytearray(b"body|"), memoryview(b"tail")) == 0
    assert mcs.get("pp/k") == b"head|body|tail" and mcs.get_size("pp/k") == 14
    assert mcs.put_parts("pp/one", b"only") == 0 and mcs.get("pp/one") == b"only"
    assert mcs.put_parts("pp/k", b"other") == 0  # exists: 0, unchanged
    assert mcs.get("pp/k") == b"head|body|tail"
    assert mcs.put_parts("pp/none") == 0  # no parts: an empty object
    assert mcs.put_parts("pp/empties", b"", b"") == 0
    assert mcs.is_exist("pp/none") == 1 and mcs.get_size("pp/empties") == 0
    assert mcs.put_parts("", b"x") == -400
    parts = [bytes([i]) * MIB for i in range(20)]  # 20 MB, above the dummy's staging
    assert mcs.put_parts("pp/big", *parts) == 0 and mcs.get("pp/big") == b"".join(parts)
    with pytest.raises(TypeError):
        mcs.put_parts("pp/str", b"ok", "not bytes")


def test_batch_calls_before_setup_and_after_close(cluster, tenant):
    s = MooncakeDistributedStore()
    assert s.put_batch(["a", "b"], [b"1", b"2"]) == -1010
    assert s.get_batch(["a", "b"]) == [b"", b""]
    assert s.put_parts("a", b"1") == -1010
    assert s.setup_dummy(0, 0, cluster.realclient(), tenant_id=tenant) == 0
    assert s.put_batch(["a"], [b"1"]) == 0
    s.close()
    assert s.put_batch(["a"], [b"1"]) == -1010 and s.get_batch(["a"]) == [b""]
    assert s.put_parts("a", b"1") == -1010



# ---- the import path mooncake.store ---------------------------------------------------------


def test_mooncake_store_import_path_is_moonlet():
    from mooncake.store import MooncakeDistributedStore as M, ReplicateConfig as R
    import mooncake
    assert mooncake.BACKEND == "moonlet"
    assert M is MooncakeDistributedStore and R is ReplicateConfig


def _import_backend(tmp_path, env_extra):
    import os
    import subprocess
    import sys
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.environ["PYTHONPATH"] + ":" + str(tmp_path)
    out = subprocess.run([sys.executable, "-c",
                          "import mooncake; print(mooncake.BACKEND, mooncake.__path__[0])"],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def test_a_real_mooncake_on_the_path_is_not_shadowed(tmp_path):
    real = tmp_path / "mooncake"
    real.mkdir()
    (real / "__init__.py").write_text("")
    (real / "store.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")  # what Mooncake ships
    backend, first = _import_backend(tmp_path, {})
    assert backend == "mooncake" and first == str(real)  # mooncake.store would be the real one
    backend, first = _import_backend(tmp_path, {"MOONLET_MOONCAKE": "1"})
    assert backend == "moonlet" and first.endswith("python/mooncake")
    (real / "store.cpython-311-x86_64-linux-gnu.so").unlink()  # a directory without Mooncake
    assert _import_backend(tmp_path, {})[0] == "moonlet"


# ---- the calls engines make (issue 15) -------------------------------------------------------


def _buf(n, fill=0):
    b = (ctypes.c_ubyte * n)()
    ctypes.memset(b, fill, n)
    return b, ctypes.addressof(b)


def test_multi_buffer_batches(mcs):
    a, ap = _buf(4096, 0x11)
    b, bp = _buf(4096, 0x22)
    out, op = _buf(8192)
    for p, n in ((ap, 4096), (bp, 4096), (op, 8192)):
        assert mcs.register_buffer(p, n) == 0
    assert mcs.batch_put_from_multi_buffers(["mb/1", "mb/2"], [[ap, bp], [bp + 10]],
                                            [[100, 50], [7]]) == [0, 0]
    assert mcs.get("mb/1") == b"\x11" * 100 + b"\x22" * 50 and mcs.get_size("mb/2") == 7
    # scattered over three ranges; an object smaller than its ranges fills them in order
    assert mcs.batch_get_into_multi_buffers(["mb/1", "mb/2", "mb/none"],
                                            [[op, op + 1000, op + 2000], [op + 3000, op + 3004],
                                             [op + 4000]],
                                            [[60, 60, 60], [4, 4], [10]]) == [150, 7, -704]
    assert ctypes.string_at(op, 60) == b"\x11" * 60
    assert ctypes.string_at(op + 1000, 60) == b"\x11" * 40 + b"\x22" * 20
    assert ctypes.string_at(op + 2000, 30) == b"\x22" * 30
    # ranges too small for the object: BUFFER_OVERFLOW for that key
    assert mcs.batch_get_into_multi_buffers(["mb/1"], [[op]], [[149]]) == [-10]
    # mismatched lists: -600 per key; a range outside registered memory: -600 for its key
    assert mcs.batch_put_from_multi_buffers(["mb/3", "mb/4"], [[ap]], [[1]]) == [-600, -600]
    assert mcs.batch_get_into_multi_buffers(["mb/1", "mb/2"], [[op], [op]], [[150]]) == [-600] * 2
    assert mcs.batch_put_from_multi_buffers(["mb/5", "mb/6"], [[ap], [ap + 4090]],
                                            [[4], [10]]) == [0, -600]
    assert mcs.is_exist("mb/6") == 0
    assert mcs.batch_put_from_multi_buffers(["mb/7"], [[ap, 12345]], [[4, 4]]) == [-600]
    assert mcs.batch_put_from_multi_buffers(["mb/7"], [[]], [[]]) == [-600]
    # empty batches
    assert mcs.batch_put_from_multi_buffers([], [], []) == []
    assert mcs.batch_get_into_multi_buffers([], [], []) == []
    assert mcs.batch_put_from([], [], []) == [] and mcs.batch_get_into([], [], []) == []
    assert mcs.batch_is_exist([]) == [] and mcs.get_batch([]) == [b""]
    assert mcs.batch_get_buffer([]) == [] and mcs.batch_get_replica_desc([]) == {}
    for p in (ap, bp, op):
        assert mcs.unregister_buffer(p) == 0
    # unregistered again: -600 per key, nothing read or written
    assert mcs.batch_put_from_multi_buffers(["mb/8"], [[ap]], [[1]]) == [-600]


def test_get_buffer(mcs):
    payload = bytes(range(256)) * 300
    assert mcs.put("gb/1", payload) == 0 and mcs.put("gb/empty", b"") == 0
    h = mcs.get_buffer("gb/1")
    assert h.size() == len(payload) and len(h) == len(payload)
    assert bytes(memoryview(h)) == payload and ctypes.string_at(h.ptr(), 16) == payload[:16]
    assert memoryview(h).cast("B")[5] == payload[5]
    e = mcs.get_buffer("gb/empty")
    assert e is not None and e.size() == 0 and bytes(e) == b""
    assert mcs.get_buffer("gb/missing") is None and mcs.get_buffer("") is None
    hs = mcs.batch_get_buffer(["gb/1", "gb/missing", "gb/empty"])
    assert bytes(hs[0]) == payload and hs[1] is None and bytes(hs[2]) == b""
    # close() with handles alive: calls stop at once, the bytes stay readable
    assert mcs.close() == 0
    assert mcs.get("gb/1") == b"" and mcs.get_buffer("gb/1") is None
    assert bytes(h[:4]) == payload[:4] and bytes(hs[0])[-4:] == payload[-4:]
    del h, hs, e


def test_ranges_and_get_sessions(mc):
    obj = bytes(range(200))
    assert mc.put("rg/1", obj) == 0 and mc.put("rg/2", obj[::-1]) == 0
    dst, dp = _buf(1024)
    assert mc.register_buffer(dp, 1024) == 0
    res = mc.get_into_ranges([dp, dp + 512], [["rg/1", "rg/2"], ["rg/1"]],
                             [[[0, 10], [20]], [[0]]], [[[5, 100], [0]], [[190]]],
                             [[[4, 3], [2]], [[10]]])
    assert res == [[[4, 3], [2]], [[10]]]
    assert ctypes.string_at(dp, 4) == obj[5:9] and ctypes.string_at(dp + 10, 3) == obj[100:103]
    assert ctypes.string_at(dp + 20, 2) == obj[::-1][:2]
    assert ctypes.string_at(dp + 512, 10) == obj[190:]
    # past the object's end, a missing key, past the registered buffer
    assert mc.get_into_ranges([dp, dp], [["rg/1"], ["rg/none"]], [[[0]], [[0]]],
                              [[[195]], [[0]]], [[[10]], [[1]]]) == [[[-600]], [[-704]]]
    assert mc.get_into_ranges([dp], [["rg/1"]], [[[1020]]], [[[0]]], [[[10]]]) == [[[-600]]]
    # sessions: read once, ranges served from this process
    assert mc.batch_get_session_start(["rg/1", "rg/none"]) == [0, -704]
    assert mc.remove("rg/1") == -706  # the session's read leased it
    assert mc.batch_get_into_multi_buffer_ranges(["rg/1", "rg/none"], [[dp, dp + 8], [dp]],
                                                 [[8, 8], [1]], [[0, 192], [0]]) == [16, -704]
    assert ctypes.string_at(dp + 8, 8) == obj[192:]
    assert mc.batch_get_into_multi_buffer_ranges(["rg/1"], [[dp]], [[8]], [[199]]) == [-600]
    assert mc.batch_get_into_multi_buffer_ranges(["rg/1"], [[dp]], [[8]], []) == [-600]
    assert mc.batch_get_session_end(["rg/1"]) == 0
    assert mc.unregister_buffer(dp) == 0


def test_replica_desc(mc):
    assert mc.put("rd/1", b"x" * 300) == 0
    descs = mc.batch_get_replica_desc(["rd/1", "rd/none"])
    assert list(descs) == ["rd/1"] and len(descs["rd/1"]) == 1
    r = descs["rd/1"][0]
    assert r.is_memory_replica() and not r.is_disk_replica()
    from moonlet.mooncake import ReplicaStatus
    assert r.status == ReplicaStatus.COMPLETE
    d = r.get_memory_descriptor().buffer_descriptor
    assert d.size == 300 and d.transport_endpoint.startswith("127.0.0.1:")
    assert mc.get_replica_desc("rd/none") == []
    assert len(mc.get_replica_desc("rd/1")) == 1
    assert mc._store.inspect("rd/1")["lease_remaining_ms"] > 0  # leased, as Mooncake's lookup
    # one master call for the batch, an entry per key in order (Store.batch_replicas)
    entries = mc._store.batch_replicas(["rd/none", "rd/1"])
    assert entries[0] == {"error": -704}
    assert entries[1]["size"] == 300 and entries[1]["replicas"][0]["status"] == "COMPLETE"
    assert mc._store.batch_replicas([]) == []


def test_device_memory_is_refused(mc):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    # an address range without host access, as a GPU driver reserves for device memory
    p = libc.mmap(None, 1 << 20, 0, 0x22, -1, 0)  # PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS
    assert p not in (None, ctypes.c_void_p(-1).value)
    try:
        assert mc.register_buffer(p, 1 << 20) == -600
        assert mc.put_from("dev", p, 64) == -600
        assert mc.batch_put_from_multi_buffers(["dev"], [[p]], [[64]]) == [-600]
    finally:
        libc.munmap(p, 1 << 20)
    host, hp = _buf(4096)
    assert mc.register_buffer(hp, 4096) == 0 and mc.register_buffer(hp, 8192 << 20) == -600
    assert mc.register_buffer(0, 10) == -600 and mc.register_buffer(hp, 0) == -600
    assert mc.unregister_buffer(hp) == 0


def test_setup_forms_engines_use(cluster, tenant, tmp_path, monkeypatch):
    base = ("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MIB, "tcp", "", cluster.addr)
    s = MooncakeDistributedStore()
    assert s.setup(*base, enable_ssd_offload=True, ssd_offload_path="/tmp/x") == -600
    assert s.setup(*base, enable_client_http_server=True, client_http_port=70000) == -600
    assert s.setup(*base[:4], protocol="tcp", device_name="mlx5_0,mlx5_1",
                   master_server_address=cluster.addr, enable_ssd_offload=False,
                   enable_client_http_server=False, client_http_port=9300,
                   some_future_option=1, tenant_id=tenant) == 0
    assert s.get_hostname().startswith("127.0.0.1:1") and s.put("sf/k", b"v") == 0
    s.close()
    assert s.setup({"local_hostname": "127.0.0.1", "master_server_address": cluster.addr,
                    "enable_ssd_offload": "true"}) == -600
    # setup() alone: the JSON file MOONCAKE_CONFIG_PATH names, engines' field names
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH", raising=False)
    assert s.setup() == -600
    cfg = tmp_path / "mooncake.json"
    cfg.write_text('{"local_hostname": "127.0.0.1:0", "metadata_server": "P2PHANDSHAKE", '
                   '"global_segment_size": "16MB", "local_buffer_size": "0", '
                   '"protocol": "tcp", "device_name": "", '
                   f'"master_server_address": "{cluster.addr}", "tenant_id": "{tenant}"}}')
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(cfg))
    assert s.setup() == 0 and s.get_hostname().startswith("127.0.0.1:")
    # local_buffer_size 0: copying puts fail as Mooncake's do; zero-copy ones work
    assert s.put("sf/k2", b"v") == -600 and s.put_batch(["sf/k2"], [b"v"]) == -600
    assert s.put_parts("sf/k2", b"v") == -600 and s.upsert("sf/k2", b"v") == -600
    src, sp = _buf(64, 7)
    assert s.register_buffer(sp, 64) == 0 and s.put_from("sf/k2", sp, 64) == 0
    assert s.get("sf/k2") == b"\x07" * 64 and s.get("sf/k") == b"v"
    s.close()
    cfg.write_text("[1, 2]")
    assert s.setup() == -600
    s2 = MooncakeDistributedStore()
    assert s2.setup_dummy(0, 0, cluster.realclient(), tenant_id=tenant) == 0
    cfg2 = ReplicateConfig(preferred_segments=["a", "b"], group_ids=["g"])
    assert cfg2.preferred_segments == ["a", "b"] and s2.put("sf/soft", b"x", cfg2) == 0
    s2.close()


def test_replicate_config_placement_and_pins(mcs, direct, cluster):
    """preferred_segment(s) place replicas (by segment name or endpoint, an
    unknown one falls back), with_hard_pin, soft_pin_ttl_ms - through setup
    and through a DummyClient."""
    cluster.realclient()  # two segments: the store node and the RealClient
    direct.put("pl/probe", b"p", replica_num=2)
    reps = direct.inspect("pl/probe")["replicas"]
    names = [r["segment_name"] for r in reps]
    endpoints = [r["endpoint"] for r in reps]
    assert len(set(names)) == 2
    for i in (0, 1):
        for j in range(4):  # round-robin alone would alternate
            key = f"pl/{i}/{j}"
            assert mcs.put(key, b"v" * 100, ReplicateConfig(preferred_segment=names[i])) == 0
            assert [r["segment_name"] for r in direct.inspect(key)["replicas"]] == [names[i]]
    # by endpoint ("host:port", Mooncake's segment name), in a batch
    keys = [f"pl/ep/{j}" for j in range(4)]
    cfg = ReplicateConfig(preferred_segments=["nowhere:1", endpoints[1]])
    assert mcs.put_batch(keys, [b"e"] * 4, cfg) == 0
    for key in keys:
        assert [r["segment_name"] for r in direct.inspect(key)["replicas"]] == [names[1]]
    # an unknown segment alone: the put still lands
    assert mcs.put("pl/absent", b"a", ReplicateConfig(preferred_segment="nowhere:1")) == 0
    assert mcs.get("pl/absent") == b"a"
    # a hard pin, shown by inspect; Remove still takes it
    assert mcs.put("pl/hard", b"h" * 64, ReplicateConfig(with_hard_pin=True)) == 0
    info = direct.inspect("pl/hard")
    assert info["hard_pinned"] is True and info["soft_pin_remaining_ms"] == 0
    assert direct.inspect("pl/0/0")["hard_pinned"] is False
    assert mcs.remove("pl/hard") == 0 and mcs.is_exist("pl/hard") == 0
    # a soft pin with its own TTL instead of the master's 30 minutes
    cfg = ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=60000)
    assert mcs.put("pl/soft", b"s", cfg) == 0
    assert 50000 < direct.inspect("pl/soft")["soft_pin_remaining_ms"] <= 60000
    assert mcs.put("pl/soft2", b"s", ReplicateConfig(with_soft_pin=True)) == 0
    assert direct.inspect("pl/soft2")["soft_pin_remaining_ms"] > 60000
    # what cannot be sent is a code, not an exception
    assert mcs.put("pl/bad", b"x", ReplicateConfig(preferred_segments=[1])) == -600
    assert mcs.put("pl/bad", b"x", ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE,
                                                   soft_pin_ttl_ms=-1)) == -600


# ---- Mooncake's own rules (store_py.cpp and its tests) ------------------------------------------


def test_fresh_replicate_config_has_no_soft_pin_ttl():
    """Mooncake's ReplicateConfig() leaves soft_pin_ttl_ms unset (None), not 0."""
    cfg = ReplicateConfig()
    assert cfg.soft_pin_ttl_ms is None
    assert "soft_pin_ttl_ms=None" in repr(cfg)
    assert SoftPinAction(cfg.soft_pin_action) == SoftPinAction.PRESERVE
    assert ReplicateConfig(soft_pin_ttl_ms=5).soft_pin_ttl_ms == 5


def test_soft_pin_ttl_needs_soft_pin_action_enable(mcs, direct):
    """A soft_pin_ttl_ms without soft_pin_action ENABLE is INVALID_PARAMS
    (-600) in put and upsert (and every other put), and nothing is stored."""
    for action in (SoftPinAction.PRESERVE, SoftPinAction.DISABLE):
        for pinned in (False, True):
            cfg = ReplicateConfig(with_soft_pin=pinned, soft_pin_action=action,
                                  soft_pin_ttl_ms=60000)
            assert mcs.put("sp/k", b"v", cfg) == -600
            assert mcs.upsert("sp/k", b"v", cfg) == -600
            assert mcs.put_batch(["sp/k"], [b"v"], cfg) == -600
    # 0 is set too (Mooncake's Some(0)): still needs ENABLE
    assert mcs.upsert("sp/k", b"v", ReplicateConfig(soft_pin_ttl_ms=0)) == -600
    assert mcs.is_exist("sp/k") == 0
    # an unknown action is a code as well, not an exception
    assert mcs.put("sp/k", b"v", ReplicateConfig(soft_pin_action=7)) == -600
    # with ENABLE: stored, pinned for that TTL; unset TTL: the master's
    enable = SoftPinAction.ENABLE
    assert mcs.put("sp/k", b"v", ReplicateConfig(soft_pin_action=enable,
                                                 soft_pin_ttl_ms=60000)) == 0
    assert 50000 < direct.inspect("sp/k")["soft_pin_remaining_ms"] <= 60000
    assert mcs.upsert("sp/k", b"w", ReplicateConfig(soft_pin_action=enable,
                                                    soft_pin_ttl_ms=40000)) == 0
    assert 30000 < direct.inspect("sp/k")["soft_pin_remaining_ms"] <= 40000
    assert mcs.upsert("sp/k", b"x", ReplicateConfig(with_soft_pin=True)) == 0
    assert direct.inspect("sp/k")["soft_pin_remaining_ms"] > 60000
    assert mcs.get("sp/k") == b"x"


def test_get_hostname_is_host_and_port(cluster, tenant):
    """get_hostname() is "host:port": the port local_hostname gives, else
    one Mooncake would pick, free, in 12300-14300; a client contributing
    memory serves it there (the segment's endpoint is that name)."""
    s = MooncakeDistributedStore()
    assert s.get_hostname() == ""  # before setup
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MIB, 16 * MIB, "tcp", "", cluster.addr,
                   tenant_id=tenant) == 0
    name = s.get_hostname()
    host, port = name.rsplit(":", 1)
    assert host == "127.0.0.1" and 12300 <= int(port) <= 14300
    assert s.put("hn/k", b"here", ReplicateConfig(preferred_segment=name)) == 0
    assert s._store.inspect("hn/k")["replicas"][0]["endpoint"] == name
    s2 = MooncakeDistributedStore()  # another client picks another free port
    assert s2.setup("127.0.0.1", "", 16 * MIB, 16 * MIB, "tcp", "", cluster.addr,
                    tenant_id=tenant) == 0
    assert s2.get_hostname() != name
    assert 12300 <= int(s2.get_hostname().rsplit(":", 1)[1]) <= 14300
    s2.close()
    s.close()
    # a port given is kept, for a pure client as well
    s = MooncakeDistributedStore()
    assert s.setup("localhost:15555", "", 0, 16 * MIB, "tcp", "", cluster.addr,
                   tenant_id=tenant) == 0
    assert s.get_hostname() == "localhost:15555"
    s.close()
    s = MooncakeDistributedStore()
    assert s.setup("[::1]", "", 0, 16 * MIB, "tcp", "", cluster.addr, tenant_id=tenant) == 0
    assert s.get_hostname().startswith("[::1]:1")
    s.close()


def test_get_into_ranges_mismatched_shapes(mc):
    """Whatever the nesting, one result list per key of each buffer: -600
    alone for a key whose offsets and sizes are missing or differ in
    length, [] for a key asked no range; the other keys are served."""
    obj = bytes(range(100))
    assert mc.put("rm/1", obj) == 0 and mc.put("rm/2", obj[::-1]) == 0
    dst, dp = _buf(256)
    assert mc.register_buffer(dp, 256) == 0
    # buffer 0: rm/1 fine; rm/2's dst has 2 offsets, its sizes 1
    # buffer 1: three keys, sizes for two only (the third gets -600); a key with no ranges
    res = mc.get_into_ranges(
        [dp, dp + 128],
        [["rm/1", "rm/2"], ["rm/2", "rm/1", "rm/1"]],
        [[[0], [10, 20]], [[0], [], [50]]],
        [[[1], [0, 1]], [[0], [], [0]]],
        [[[3], [4]], [[5], []]])
    assert res == [[[3], [-600]], [[5], [], [-600]]]
    assert ctypes.string_at(dp, 3) == obj[1:4]
    assert ctypes.string_at(dp + 128, 5) == obj[::-1][:5]
    # a buffer with no keys: no results; keys but no range lists at all: -600 each
    assert mc.get_into_ranges([dp, dp], [[], ["rm/1", "rm/2"]], [[], []], [[], []],
                              [[], []]) == [[], [[-600], [-600]]]
    # the outer lists disagree: [] per buffer (nothing to match them by)
    assert mc.get_into_ranges([dp, dp], [["rm/1"]], [[[0]]], [[[0]]], [[[1]]]) == [[], []]
    assert mc.unregister_buffer(dp) == 0


def test_force_remove(mcs):
    assert mcs.put("fr/a", b"a") == 0 and mcs.put("fr/b", b"b") == 0 and mcs.put("fr/c", b"c") == 0
    assert mcs.get("fr/a") == b"a" and mcs.get("fr/b") == b"b"  # leased
    assert mcs.remove("fr/a") == -706 and mcs.remove("fr/a", force=True) == 0
    assert mcs.remove("fr/a", True) == -704
    assert mcs.remove_all() == 1                     # fr/c
    assert mcs.remove_all(force=True) == 1           # fr/b, under its lease
    assert mcs.batch_is_exist(["fr/a", "fr/b", "fr/c"]) == [0, 0, 0]
    assert mcs.remove_all(True) == 0


# ---- the client HTTP server (SGLang's storage metrics) -----------------------------------------


def _free_port():
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


def _curl(port, path="/metrics"):
    """(HTTP status, body) of curl on the client's endpoint."""
    assert shutil.which("curl"), "curl is needed (scripts/setup.sh installs it)"
    r = subprocess.run(["curl", "-s", "-m", "10", "-o", "-", "-w", "\n%{http_code}",
                        f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True,
                       timeout=30, env=child_env())  # not under the test's LD_PRELOAD
    assert r.returncode == 0, r.stderr
    body, _, code = r.stdout.rpartition("\n")
    return int(code), body


def _samples(text):
    """{"name{labels}": value} of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_client_http_server_metrics_move_with_puts_and_gets(cluster, tenant):
    """SGLang's setup(..., enable_client_http_server=True, client_http_port=P)
    returns 0, and curl http://127.0.0.1:P/metrics shows this client's
    counters move with its puts, gets and errors; /health answers."""
    port = _free_port()
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MIB, 16 * MIB, "tcp", "", cluster.addr,
                   tenant_id=tenant, enable_client_http_server=True, client_http_port=port) == 0
    assert s._store.http_port == port
    code, text = _curl(port)
    assert code == 200
    m0 = _samples(text)
    assert m0["moonlet_client_puts_total"] == 0 and m0["moonlet_client_gets_total"] == 0
    assert "# TYPE moonlet_client_latency_seconds histogram" in text

    assert s.put("hm/1", b"x" * 1000) == 0 and s.put("hm/2", b"y" * 24) == 0
    assert s.get("hm/1") == b"x" * 1000
    assert s.get("hm/missing") == b""
    assert s.get_batch(["hm/2", "hm/nope"]) == [b"y" * 24, b""]
    assert s.is_exist("hm/1") == 1 and s.is_exist("hm/none") == 0
    assert s.remove("hm/none") == -704
    code, text = _curl(port)
    m1 = _samples(text)
    assert code == 200
    assert m1["moonlet_client_puts_total"] == 2
    assert m1["moonlet_client_put_bytes_total"] == 1024
    assert m1["moonlet_client_gets_total"] == 4
    assert m1["moonlet_client_get_bytes_total"] == 1024
    assert m1['moonlet_client_hits_total{op="get"}'] == 2
    assert m1['moonlet_client_misses_total{op="get"}'] == 2
    assert m1['moonlet_client_hits_total{op="exist"}'] == 1
    assert m1['moonlet_client_misses_total{op="exist"}'] == 1
    assert m1['moonlet_client_errors_total{op="remove",code="-704",name="OBJECT_NOT_FOUND"}'] == 1
    assert m1['moonlet_client_latency_seconds_count{op="put"}'] >= 2
    assert m1['moonlet_client_latency_seconds_bucket{op="get",le="+Inf"}'] == \
        m1['moonlet_client_latency_seconds_count{op="get"}'] >= 2
    assert m1['moonlet_client_latency_seconds_sum{op="put"}'] > 0
    assert m1[f'moonlet_client_tenant_keys_total{{tenant="{tenant}",op="put",outcome="ok"}}'] == 2
    assert m1[f'moonlet_client_tenant_bytes_total{{tenant="{tenant}",op="get"}}'] == 1024
    buckets = [v for k, v in m1.items()
               if re.match(r'moonlet_client_latency_seconds_bucket\{op="put"', k)]
    assert buckets == sorted(buckets)  # cumulative

    assert _curl(port, "/health") == (200, "OK\n")
    assert _curl(port, "/nope")[0] == 404
    # the port is this client's: a second one cannot take it, and it is
    # released with close()
    s2 = MooncakeDistributedStore()
    assert s2.setup("127.0.0.1", "", 0, 16 * MIB, "tcp", "", cluster.addr, tenant_id=tenant,
                    enable_client_http_server=True, client_http_port=port) == -1
    assert s.close() == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    # off by default, and in a config dict with no port: a free one
    assert s2.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                     "master_server_address": cluster.addr, "tenant_id": tenant}) == 0
    assert s2._store.http_port is None
    s2.close()
    assert s2.setup({"local_hostname": "127.0.0.1", "global_segment_size": 0,
                     "master_server_address": cluster.addr, "tenant_id": tenant,
                     "enable_client_http_server": "true", "enable_offload": True}) == 0
    assert s2._store.http_port and _curl(s2._store.http_port, "/health")[0] == 200
    s2.close()


def test_realclient_serves_the_dummy_clients_metrics(cluster, tmp_path, tenant):
    """moonlet-store --serve-dummy --client-http-port N: the RealClient's
    /metrics counts what its DummyClients (setup_dummy) do."""
    rc = start_store(cluster.addr, "64MiB", "--serve-dummy", str(tmp_path / "rc.sock"),
                     "--client-http-port", "0",
                     ready=[r"serving dummy clients on (.+)$",
                            r"client metrics on 0\.0\.0\.0:(\d+)$"])
    try:
        port = int(rc.matches[r"client metrics on 0\.0\.0\.0:(\d+)$"].group(1))
        s = MooncakeDistributedStore()
        assert s.setup_dummy(0, 0, str(tmp_path / "rc.sock"), tenant_id=tenant) == 0
        before = _samples(_curl(port)[1])
        assert s.put("rcm/1", b"z" * 300) == 0 and s.get("rcm/1") == b"z" * 300
        after = _samples(_curl(port)[1])
        assert after["moonlet_client_puts_total"] == before["moonlet_client_puts_total"] + 1
        assert after["moonlet_client_put_bytes_total"] >= before["moonlet_client_put_bytes_total"] + 300
        assert after['moonlet_client_hits_total{op="get"}'] == \
            before['moonlet_client_hits_total{op="get"}'] + 1
        assert _curl(port, "/health") == (200, "OK\n")
        s.close()
    finally:
        rc.stop()
