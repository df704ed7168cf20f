"""Objects through the Python binding: round trips, zero-copy, errors, the
object's life cycle (close, context manager, repr), threads.

Tests taking `store` run twice: through a direct Store and through a
DummyClient of a RealClient process.
"""
import ctypes
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

import moonlet
from conftest import MIB, connect

SIZES = [0, 1, 4096, MIB + 3, 64 * MIB]


def payload(n, seed):
    if n <= 4096:
        return bytes((i * 131 + seed) & 0xFF for i in range(n))
    block = os.urandom(MIB)
    return (block * (n // MIB + 1))[:n]


@pytest.mark.parametrize("size", SIZES, ids=[str(s) for s in SIZES])
def test_put_get_round_trip(store, size):
    data = payload(size, size)
    key = f"rt/{size}"
    store.put(key, data)
    assert store.get_size(key) == size
    got = store.get(key)
    assert type(got) is bytes and len(got) == size and got == data
    assert store.is_exist(key) is True
    with pytest.raises(moonlet.StoreError) as ei:
        store.put(key, data)
    assert ei.value.code == -705 and ei.value.name == "OBJECT_ALREADY_EXISTS"


def test_values_may_be_any_contiguous_buffer(store):
    store.put("ba", bytearray(b"from a bytearray"))
    store.put("mv", memoryview(b"0123456789")[2:8])
    arr = (ctypes.c_char * 5).from_buffer_copy(b"ctype")
    store.put("ct", arr)
    assert store.get("ba") == b"from a bytearray"
    assert store.get("mv") == b"234567"
    assert store.get("ct") == b"ctype"
    with pytest.raises(TypeError):
        store.put("s", "a str is not bytes")
    with pytest.raises(TypeError):
        store.put(b"bytes-key", b"x")
    with pytest.raises(ValueError):
        store.put("nul\0key", b"x")


def test_object_life_cycle_and_errors(store):
    with pytest.raises(moonlet.StoreError) as ei:
        store.get("missing")
    assert ei.value.code == -704 and ei.value.name == "OBJECT_NOT_FOUND"
    assert "get" in str(ei.value) and "-704" in str(ei.value)
    with pytest.raises(moonlet.StoreError) as ei:
        store.get_size("missing")
    assert ei.value.code == -704
    with pytest.raises(moonlet.StoreError) as ei:
        store.remove("missing")
    assert ei.value.code == -704
    with pytest.raises(moonlet.StoreError) as ei:
        store.put("", b"x")
    assert ei.value.code == -400

    store.put("unleased", b"1")
    store.remove("unleased")
    assert store.probe_key("unleased") is False
    store.put("leased", b"1")
    assert store.get("leased") == b"1"  # leases it
    with pytest.raises(moonlet.StoreError) as ei:
        store.remove("leased")
    assert ei.value.code == -706 and ei.value.name == "OBJECT_HAS_LEASE"
    with pytest.raises(moonlet.StoreError) as ei:
        store.upsert("leased", b"2")
    assert ei.value.code == -706

    store.upsert("up", b"first")
    store.upsert("up", b"second, longer")
    assert store.get("up") == b"second, longer"

    store.put("r1", b"a")
    store.put("r2", b"b")
    assert store.remove_all() == 2  # r1, r2 (up and leased hold leases)
    assert store.batch_is_exist(["r1", "r2", "up"]) == [False, False, True]


def test_replicas_soft_pin_and_inspect(store, cluster):
    store.put("plain", b"p" * 100)
    store.put("pinned", b"q" * 100, soft_pin=True)
    info = store.inspect("plain")
    assert info["size"] == 100 and info["complete"] is True
    assert info["soft_pinned"] is False and info["lease_remaining_ms"] == 0
    assert len(info["replicas"]) == 1
    rep = info["replicas"][0]
    assert rep["status"] == "COMPLETE" and isinstance(rep["segment"], str) and rep["segment"]
    assert isinstance(rep["offset"], int)
    assert store.inspect("pinned")["soft_pinned"] is True
    with pytest.raises(moonlet.StoreError) as ei:
        store.inspect("missing")
    assert ei.value.code == -704
    # two replicas need two store nodes: the store and the RealClient both serve one
    cluster.realclient()
    store.put("two", b"2" * 10, replica_num=2)
    assert len({r["segment"] for r in store.inspect("two")["replicas"]}) == 2
    with pytest.raises(moonlet.StoreError) as ei:
        store.put("nine", b"x", replica_num=9)
    assert ei.value.code in (-600, -200)


def c_buffer(data):
    buf = (ctypes.c_ubyte * max(len(data), 1))()
    ctypes.memmove(buf, data, len(data))
    return buf


def test_zero_copy_through_registered_buffers(store):
    n = 3 * MIB + 17
    src = c_buffer(payload(n, 7))
    dst = (ctypes.c_ubyte * (4 * MIB))()
    src_addr, dst_addr = ctypes.addressof(src), ctypes.addressof(dst)
    store.register_buffer(src_addr, n)
    store.register_buffer(dst_addr, len(dst))
    try:
        store.put_from("zc/a", src_addr, n)
        store.put_from("zc/tail", src_addr + n - 1000, 1000)
        assert store.get_into("zc/a", dst_addr, len(dst)) == n
        assert ctypes.string_at(dst_addr, n) == ctypes.string_at(src_addr, n)
        assert store.get_into("zc/tail", dst_addr + 5, 1000) == 1000
        assert ctypes.string_at(dst_addr + 5, 1000) == ctypes.string_at(src_addr + n - 1000, 1000)
        assert store.get("zc/a") == ctypes.string_at(src_addr, n)

        # a destination smaller than the object: BUFFER_OVERFLOW, nothing read
        with pytest.raises(moonlet.StoreError) as ei:
            store.get_into("zc/a", dst_addr, n - 1)
        assert ei.value.code == -10 and ei.value.name == "BUFFER_OVERFLOW"

        # batches: per-key outcomes; one failure raises with .results
        keys = ["zc/b0", "zc/b1", "zc/b2"]
        store.batch_put_from(keys, [src_addr, src_addr + 100, src_addr + 200], [100, 4096, 0])
        got = store.batch_get_into(keys, [dst_addr, dst_addr + 100, dst_addr + 8192],
                                   [100, 4096, 16])
        assert got == [100, 4096, 0]
        assert ctypes.string_at(dst_addr, 4196) == ctypes.string_at(src_addr, 4196)
        with pytest.raises(moonlet.StoreError) as ei:
            store.batch_get_into(["zc/b0", "zc/b1", "zc/none"], [dst_addr, dst_addr + 100,
                                                                 dst_addr + 9000], [100, 10, 10])
        assert ei.value.code == -10 and ei.value.results == [100, -10, -704]
        with pytest.raises(moonlet.StoreError) as ei:
            store.batch_put_from(["zc/b0", "zc/b3"], [src_addr, src_addr], [10, 10])
        assert ei.value.code == -705 and ei.value.results == [-705, 0]
        assert store.get("zc/b3") == ctypes.string_at(src_addr, 10)
        with pytest.raises(ValueError):
            store.batch_put_from(["a", "b"], [src_addr], [1, 1])  # lengths differ
    finally:
        store.unregister_buffer(src_addr)
        store.unregister_buffer(dst_addr)


def test_shared_buffers_need_no_registration_and_no_copy(store):
    n = 2 * MIB + 5
    data = payload(n, 11)
    with store.alloc_buffer(n) as src, store.alloc_buffer(4 * MIB) as dst:
        assert isinstance(src, moonlet.SharedBuffer) and src.size == n and len(src) == n
        view = memoryview(src)
        assert not view.readonly and bytes(view[:8]) == bytes(8)  # zeroed
        view[:] = data
        view.release()
        store.put_from("sh/a", src.address, n)
        assert store.get("sh/a") == data
        assert store.get_into("sh/a", dst.address, dst.size) == n
        with memoryview(dst) as dv:
            assert dv[:n] == data
        store.batch_put_from(["sh/b", "sh/c"], [src.address, src.address + 100], [100, 1000])
        assert store.batch_get_into(["sh/b", "sh/c"], [dst.address, dst.address + 100],
                                    [100, 1000]) == [100, 1000]
        with memoryview(dst) as dv:
            assert dv[:1100] == data[:100] + data[100:1100]
        held = memoryview(src)
        with pytest.raises(BufferError):
            src.free()
        with pytest.raises(BufferError):
            store.close()  # would free memory a view still reaches
        assert not store.closed
        held.release()
        assert "address=" in repr(src)
    assert src.freed and dst.freed and src.size == 0 and "freed" in repr(src)
    src.free()  # again: nothing
    with pytest.raises(ValueError):
        memoryview(src)
    with pytest.raises(ValueError):
        src.address
    # the store's close() frees what is left
    left = store.alloc_buffer(4096)
    store.close()
    assert left.freed
    with pytest.raises(moonlet.StoreError):
        store.alloc_buffer(10)


def test_zero_copy_errors_for_unregistered_memory(store):
    buf = c_buffer(b"z" * 8192)
    addr = ctypes.addressof(buf)
    with pytest.raises(moonlet.StoreError) as ei:
        store.put_from("zc/unreg", addr, 100)
    assert ei.value.code == -600 and ei.value.name == "INVALID_PARAMS"
    store.put("zc/obj", b"o" * 100)
    with pytest.raises(moonlet.StoreError) as ei:
        store.get_into("zc/obj", addr, 8192)
    assert ei.value.code == -600
    store.register_buffer(addr, 4096)
    try:
        with pytest.raises(moonlet.StoreError) as ei:
            store.put_from("zc/past-end", addr + 4000, 200)  # runs past the registration
        assert ei.value.code == -600
        with pytest.raises(moonlet.StoreError) as ei:
            store.register_buffer(addr, 4096)  # already registered
        assert ei.value.code == -600
        with pytest.raises(moonlet.StoreError) as ei:
            store.batch_put_from(["zc/in", "zc/out"], [addr, addr + 8000], [10, 10])
        assert ei.value.results == [0, -600]
    finally:
        store.unregister_buffer(addr)
    with pytest.raises(moonlet.StoreError) as ei:
        store.unregister_buffer(addr)
    assert ei.value.code == -600
    with pytest.raises(moonlet.StoreError) as ei:
        store.register_buffer(0, 10)
    assert ei.value.code == -600
    with pytest.raises(ValueError):
        store.register_buffer(-1, 10)


def test_tenants_are_separate_name_spaces(store, tenant):
    store.put("same", b"ours")
    store.put("same", b"theirs", tenant_id=tenant + "-b")
    assert store.get("same") == b"ours"
    assert store.get("same", tenant_id=tenant + "-b") == b"theirs"
    assert store.get("same", tenant_id=tenant) == b"ours"
    assert store.default_tenant == tenant
    with pytest.raises(moonlet.StoreError):
        store.get("same", tenant_id=tenant + "-c")


def test_close_context_manager_repr_and_docs(cluster, path, tenant):
    with connect(cluster, path, tenant) as s:
        assert s.closed is False and s.kind == path and s.protocol == "tcp"
        r = repr(s)
        assert r.startswith("<moonlet.Store " + path) and repr(tenant) in r
        s.put("k", b"v")
    assert s.closed is True and "closed" in repr(s)
    with pytest.raises(moonlet.StoreError) as ei:
        s.get("k")
    assert ei.value.code == -1010
    s.close()  # again: nothing
    with pytest.raises(TypeError):
        moonlet.Store()
    for obj in (moonlet, moonlet.Store, moonlet.Store.connect, moonlet.Store.batch_probe_key,
                moonlet.Store.put, moonlet.Store.inspect, moonlet.GrantLeasePolicy,
                moonlet.ProbeLeaseMode, moonlet.StoreError, moonlet.Store.connect_dummy):
        assert obj.__doc__ and len(obj.__doc__) > 20, obj


def test_connect_errors():
    with pytest.raises(moonlet.StoreError) as ei:
        moonlet.Store.connect("127.0.0.1:1", protocol="tcp")
    assert ei.value.code == -900 and ei.value.name == "RPC_FAIL"
    with pytest.raises(moonlet.StoreError) as ei:
        moonlet.Store.connect("no-port", protocol="tcp")
    assert ei.value.code == -600
    with pytest.raises(ValueError):
        moonlet.Store.connect("127.0.0.1:1", protocol="carrier-pigeon")
    with pytest.raises(moonlet.StoreError) as ei:
        moonlet.Store.connect_dummy("/nonexistent/moonlet.sock")
    assert ei.value.code in (-900, -600)


def test_contributing_memory(cluster, tenant):
    with moonlet.Store.connect(cluster.addr, protocol="tcp", segment_size=32 * MIB,
                               default_tenant=tenant) as s:
        ep = s.local_endpoint
        assert ep and ep.startswith("127.0.0.1:")
        assert "segment=" + ep in repr(s)
        s.put("mine", b"m" * 1000)
        assert s.get("mine") == b"m" * 1000


def test_the_gil_is_released_while_a_call_waits():
    # A "master" that accepts the connection and never answers: connect()
    # waits for its reply, up to a 20 s rpc timeout.  This thread must keep
    # running Python meanwhile: it accepts the connection and closes it (and
    # the listener), which ends the call at once with RPC_FAIL.  Were the GIL
    # held through the wait, this thread could not run until the call had
    # timed out: RPC_TIMEOUT, after 20 s.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    lsock.settimeout(30)
    addr = "127.0.0.1:%d" % lsock.getsockname()[1]
    done = threading.Event()
    outcome = []

    def call():
        try:
            moonlet.Store.connect(addr, protocol="tcp", rpc_timeout_ms=20000)
        except moonlet.StoreError as e:
            outcome.append(e.code)
        done.set()

    t = threading.Thread(target=call)
    t.start()
    conn, _ = lsock.accept()
    conn.close()
    lsock.close()  # a reconnect finds nobody listening
    assert done.wait(30)
    t.join(30)
    assert outcome == [-900], f"the call ended with {outcome}, not by the close"


def test_many_threads_share_one_store(store):
    errors = []

    def worker(i):
        try:
            for j in range(20):
                k = f"th/{i}/{j}"
                store.put(k, k.encode() * 10)
                assert store.get(k) == k.encode() * 10
                assert store.batch_probe_key([k, k + "/no"]) == [True, False]
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


def test_close_waits_for_calls_in_flight(cluster, tenant):
    s = connect(cluster, "direct", tenant)
    s.put("big", payload(16 * MIB, 3))
    results = []

    def reader():
        for _ in range(5):
            try:
                results.append(len(s.get("big")))
            except moonlet.StoreError as e:
                results.append(e.code)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.01)
    s.close()
    t.join(30)
    assert results and all(r in (16 * MIB, -1010) for r in results), results


def test_copying_batches_batch_put_batch_get_put_parts(store):
    keys = [f"cb/{size}" for size in SIZES]
    data = [payload(size, size + 1) for size in SIZES]
    assert store.batch_put(keys, data) is None
    got = store.batch_get(keys)
    assert [type(g) for g in got] == [bytes] * len(SIZES) and got == data
    assert [store.get(k) for k in keys] == data
    assert store.batch_put([], []) is None and store.batch_get([]) == []
    # a failed key raises with every key's outcome; the other keys were stored
    with pytest.raises(moonlet.StoreError) as ei:
        store.batch_put(["cb/0", "cb/new", ""], [b"x", bytearray(b"new"), memoryview(b"y")])
    assert ei.value.code == -705 and ei.value.results == [-705, 0, -400]
    with pytest.raises(moonlet.StoreError) as ei:
        store.batch_get(["cb/new", "cb/missing", ""])
    assert ei.value.code == -704 and ei.value.results == [b"new", -704, -400]
    big = payload(MIB + 3, 9)
    store.put_parts("cb/parts", b"a", bytearray(b"b"), memoryview(b"-c-")[1:2],
                    (ctypes.c_char * 1).from_buffer_copy(b"d"), big)
    assert store.get("cb/parts") == b"abcd" + big
    store.put_parts("cb/no-parts")
    assert store.get("cb/no-parts") == b""
    with pytest.raises(moonlet.StoreError) as ei:
        store.put_parts("cb/parts", b"again")
    assert ei.value.code == -705
    # options reach the put; tenants as elsewhere
    store.batch_put(["cb/pinned"], [b"p"], soft_pin=True, tenant_id=store.default_tenant)
    assert store.inspect("cb/pinned")["soft_pinned"] is True
    store.put_parts("cb/other", b"1", b"2", tenant_id=store.default_tenant + "-b")
    assert store.batch_get(["cb/other"], tenant_id=store.default_tenant + "-b") == [b"12"]
    with pytest.raises(moonlet.StoreError):
        store.batch_get(["cb/other"])
    # argument errors, before anything is sent
    with pytest.raises(ValueError):
        store.batch_put(["cb/a", "cb/b"], [b"a"])
    for bad in (lambda: store.batch_put(["cb/a"], ["str"]),
                lambda: store.batch_put(["cb/a"], b"a"),
                lambda: store.batch_put("cb/a", [b"a"]),
                lambda: store.batch_get("cb/a"),
                lambda: store.put_parts(),
                lambda: store.put_parts("cb/a", "str")):
        with pytest.raises(TypeError):
            bad()
    with pytest.raises(moonlet.StoreError) as ei:  # nothing stored by the refusals
        store.get("cb/a")
    assert ei.value.code == -704


def test_copying_batches_from_many_threads(store):
    errors = []

    def work(t):
        try:
            for r in range(10):
                keys = [f"cbt/{t}/{r}/{i}" for i in range(8)]
                values = [bytes([t, r, i]) * (1000 * i + 1) for i in range(8)]
                store.batch_put(keys, values)
                assert store.batch_get(keys) == values
                store.put_parts(f"cbt/{t}/{r}", *values)
                assert store.get(f"cbt/{t}/{r}") == b"".join(values)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors


def test_copying_batches_on_a_closed_store(cluster, path, tenant):
    s = connect(cluster, path, tenant)
    s.close()
    for call in (lambda: s.batch_put(["k"], [b"v"]), lambda: s.batch_get(["k"]),
                 lambda: s.put_parts("k", b"v")):
        with pytest.raises(moonlet.StoreError) as ei:
            call()
        assert ei.value.code == -1010


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a second uid to run the impostor as")
def test_connect_dummy_checks_the_socket_owner():
    """A socket bound by another user (nobody) gets nothing: ILLEGAL_CLIENT;
    trusting that uid or group explicitly gets past the check (then the
    impostor, which never answers, times out)."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="mlt-owner-", dir="/tmp")
    os.chmod(d, 0o777)  # the world-writable /tmp case
    path = os.path.join(d, "real.sock")
    code = ("import socket,sys,time\n"
            "s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8)\n"
            "print('ready', flush=True)\n"
            "conns=[]\n"
            "end=time.monotonic()+60\n"
            "s.settimeout(1)\n"
            "while time.monotonic()<end:\n"
            "    try: conns.append(s.accept()[0])\n"
            "    except socket.timeout: pass\n")

    def as_nobody():
        os.setgid(65534)
        os.setuid(65534)

    p = subprocess.Popen([sys.executable, "-c", code, path], stdout=subprocess.PIPE, text=True,
                         preexec_fn=as_nobody)
    try:
        assert p.stdout.readline().strip() == "ready"
        with pytest.raises(moonlet.StoreError) as ei:
            moonlet.Store.connect_dummy(path, rpc_timeout_ms=300)
        assert ei.value.name == "ILLEGAL_CLIENT"
        for kw in ({"peer_uid": 65534}, {"peer_gid": 65534}):
            with pytest.raises(moonlet.StoreError) as ei:
                moonlet.Store.connect_dummy(path, rpc_timeout_ms=300, **kw)
            assert ei.value.name == "RPC_TIMEOUT", kw
        with pytest.raises(ValueError):
            moonlet.Store.connect_dummy(path, peer_uid=-1)
    finally:
        p.kill()
        p.wait(10)
        shutil.rmtree(d, ignore_errors=True)


def test_checksum_option(cluster, tenant):
    """checksum=True (the default) records and verifies an XXH3-64 per object;
    checksum=False neither computes nor checks one; both read each other's
    objects (an object without a checksum reads as before)."""
    on = connect(cluster, "direct", tenant)
    off = connect(cluster, "direct", tenant, checksum=False)
    try:
        on.put("ck/on", b"with a checksum")
        off.put("ck/off", b"without one")
        on.put_parts("ck/parts", b"a", b"bc", b"")
        for s in (on, off):
            assert bytes(s.get("ck/on")) == b"with a checksum"
            assert bytes(s.get("ck/off")) == b"without one"
            assert bytes(s.get("ck/parts")) == b"abc"
    finally:
        on.close()
        off.close()
