"""Fixtures of the Python binding tests: a loopback moonlet cluster.

One cluster per test session (the binding tests share it; every test works
in its own tenant, so they cannot see each other's keys):
  - moonlet-master on 127.0.0.1 and an ephemeral port (--rpc-port 0; its
    "listening on HOST:PORT" line gives the address);
  - a moonlet-store contributing a TCP segment;
  - a RealClient: moonlet-store --serve-dummy SOCKET, which prints
    "serving dummy clients on SOCKET" (started only when a test needs it).
Every process is a daemons.Daemon: stopped by its own PID (SIGTERM, then
SIGKILL after a bounded wait); every wait is bounded.

Only the standard library is imported here at module level: this conftest
also sits beside test_inspect_cli.py, which runs without moonlet on the path.
"""
import os
import tempfile
import uuid

import pytest

import daemons

MIB = 1 << 20
K3 = ["kda/128/r0", "kda/128/r1", "kda/256/r0", "kda/256/r1", "kda/384/r0", "kda/384/r1"]


def k3_short_key(kid):
    """The K3 worked example's key names for a k3.KVKey (kv/<block>) or a
    k3.KDAKey (kda/<position>/r<rank>); duck-typed, so it serves the module
    imported by path (test_k3.py) and the package's (test_k3_store.py)."""
    if hasattr(kid, "block"):
        return f"kv/{kid.block}"
    return f"kda/{kid.position}/r{kid.rank}"


def start_master(*extra):
    return daemons.start_master("--shards", "64", "--client_live_ttl_sec", "600", *extra)


def start_store(master_addr, size, *extra, ready=daemons.LISTENING):
    return daemons.start_store(master_addr, size, "--ping-interval-ms", "200", *extra,
                               ready=ready)


class Cluster:
    def __init__(self):
        self.master = start_master()
        self.addr = self.master.addr
        self.stores = [start_store(self.addr, "320MiB")]
        self._tmp = tempfile.TemporaryDirectory(prefix="moonlet-py-")
        self._real = None

    def realclient(self):
        """The socket path of the RealClient (started on first use)."""
        if self._real is None:
            path = os.path.join(self._tmp.name, "real.sock")
            self._real = start_store(self.addr, "320MiB", "--serve-dummy", path,
                                     ready=r"serving dummy clients on (.+)$")
            self.socket = self._real.match.group(1)
        return self.socket

    def stop(self):
        if self._real is not None:
            self._real.stop()
        for s in self.stores:
            s.stop()
        self.master.stop()
        self._tmp.cleanup()


@pytest.fixture(scope="session")
def cluster():
    c = Cluster()
    yield c
    c.stop()


@pytest.fixture
def tenant():
    """A tenant of this test alone."""
    return "t-" + uuid.uuid4().hex[:12]


def connect(cluster, path, tenant=None, **kw):
    """A moonlet.Store on `path`: "direct" (to the master) or "dummy"
    (through the RealClient)."""
    import moonlet

    if path == "direct":
        return moonlet.Store.connect(cluster.addr, protocol="tcp", default_tenant=tenant, **kw)
    return moonlet.Store.connect_dummy(cluster.realclient(), default_tenant=tenant, **kw)


@pytest.fixture(params=["direct", "dummy"])
def path(request):
    """Both ways of reaching the cluster: a direct Store and a DummyClient."""
    return request.param


@pytest.fixture
def store(cluster, path, tenant):
    """A Store on `path` whose default tenant is the test's own."""
    s = connect(cluster, path, tenant)
    yield s
    s.close()


@pytest.fixture
def direct(cluster, tenant):
    """A direct Store in the test's tenant, to inspect what the other did."""
    s = connect(cluster, "direct", tenant)
    yield s
    s.close()
