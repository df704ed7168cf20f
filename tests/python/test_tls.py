"""TLS on the control plane, through the real daemons (issue 33):

  - a master with --tls-cert/--tls-key/--tls-ca (mutual TLS), a store node
    and a Python client with their certificates: put and get work, the
    inspection CLI and /metrics (https) answer over TLS;
  - a plaintext client of that master is refused with ILLEGAL_CLIENT (the
    master says it requires TLS), a client with no certificate or one of
    another CA with ILLEGAL_CLIENT, a store node without a certificate does
    not start; a TLS client of a plaintext master fails with RPC_FAIL; none
    of them hangs;
  - a RealClient with --tls-* serves DummyClients against that master;
  - SIGHUP: the master reads its certificate files again; a new connection
    sees the new certificate (RPC and /metrics), a client connected before
    keeps working.

Certificates are made at run time (tests/python/tlscerts.py, the openssl
command) in a temp dir.  Daemons on loopback and ephemeral ports, stopped by
their PID; every wait bounded.
"""
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

import daemons
import moonlet
import tlscerts

pytestmark = pytest.mark.skipif(not tlscerts.available(), reason="no openssl command")

MIB = 1 << 20
ILLEGAL_CLIENT = -601
RPC_FAIL = -900
QUICK_S = 8  # a refusal comes well within the 10 s call timeout: never a hang


@pytest.fixture(scope="module")
def certs():
    with tlscerts.temp_certs("moonlet-tls-", {"master": "master-1", "master2": "master-2"},
                             {"store": "store-1", "client": "client-1",
                              "operator": "operator-1"}) as d:
        d.ca("rogue-ca", "another CA")
        d.issue("rogue", "rogue", ca="rogue-ca")
        yield d


def start_tls_master(certs, name="master", *extra, **kw):
    return daemons.start_master("--shards", "64", "--client_live_ttl_sec", "600",
                                "--rpc-address", "127.0.0.1", *certs.flags(name), *extra, **kw)


def inspect(addr, *args, tls=None):
    return subprocess.run([daemons.tool("moonlet-inspect"), "--master", addr, *(tls or []),
                           "--json", *args], capture_output=True, text=True, timeout=30,
                          env=daemons.child_env())


def peer_cn(port, certs, client="client"):
    """The common name of the certificate a new TLS connection to port gets."""
    ctx = ssl.create_default_context(cafile=certs.path("ca.pem"))
    ctx.load_cert_chain(certs.path(f"{client}.pem"), certs.path(f"{client}.key"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            subject = dict(x[0] for x in s.getpeercert()["subject"])
            return subject["commonName"]


def port_of(addr):
    return int(addr.rsplit(":", 1)[1])


def metrics_get(port, certs):
    ctx = ssl.create_default_context(cafile=certs.path("ca.pem"))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=ctx,
                                timeout=10) as r:
        return r.status, r.read().decode()


def test_cluster_over_mutual_tls(certs):
    """Master, store node, Python client, inspection CLI and /metrics, all
    over TLS; the data round-trips."""
    m = start_tls_master(certs, "master", "--metrics-port", "0",
                         ready=[daemons.LISTENING, r"metrics on (\S+):(\d+)$"])
    s = None
    try:
        s = daemons.start_store(m.addr, "64MiB", "--ping-interval-ms", "200",
                                *certs.flags("store"))
        st = moonlet.Store.connect(m.addr, protocol="tcp", **certs.kwargs("client"))
        try:
            data = os.urandom(MIB + 17)
            st.put("tls/one", data)
            assert st.get("tls/one") == data
            assert st.is_exist("tls/one") is True
        finally:
            st.close()
        r = inspect(m.addr, "segments", tls=certs.flags("operator"))
        assert r.returncode == 0, r.stderr
        assert '"segments"' in r.stdout and s.addr in r.stdout
        mport = int(m.matches[r"metrics on (\S+):(\d+)$"].group(2))
        status, body = metrics_get(mport, certs)
        assert status == 200 and "moonlet_" in body
        with pytest.raises((OSError, http.client.HTTPException)):  # no plain HTTP there
            urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read()
    finally:
        if s:
            s.stop()
        m.stop()


def test_realclient_reaches_a_tls_master(certs):
    """A RealClient (moonlet-store --serve-dummy) with --tls-* serves
    DummyClients (and so the Mooncake-compatible class, whose signatures
    have no TLS arguments) against a master that requires client
    certificates."""
    m = start_tls_master(certs)
    real = None
    sock_dir = tempfile.mkdtemp(prefix="moonlet-tls-dummy-")
    try:
        path = os.path.join(sock_dir, "real.sock")
        real = daemons.start_store(m.addr, "64MiB", "--serve-dummy", path, *certs.flags("store"),
                                   ready=r"serving dummy clients on (.+)$")
        st = moonlet.Store.connect_dummy(path)
        try:
            st.put("dummy/one", b"z" * 5000)
            assert st.get("dummy/one") == b"z" * 5000
        finally:
            st.close()
    finally:
        if real:
            real.stop()
        m.stop()
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_refusals_are_clear_and_quick(certs):
    """Plaintext to TLS, no or a foreign client certificate, TLS to
    plaintext: each a clear error code, within seconds."""
    m = start_tls_master(certs)
    plain = daemons.start_master("--shards", "64")
    try:
        cases = [
            (m.addr, {}, ILLEGAL_CLIENT),                                    # plaintext client
            (m.addr, {"tls_ca": certs.path("ca.pem")}, ILLEGAL_CLIENT),      # no certificate
            (m.addr, certs.kwargs("rogue"), ILLEGAL_CLIENT),                 # another CA's
            (plain.addr, certs.kwargs("client"), RPC_FAIL),                  # TLS to plaintext
        ]
        for addr, kw, code in cases:
            t0 = time.monotonic()
            with pytest.raises(moonlet.StoreError) as ei:
                moonlet.Store.connect(addr, protocol="tcp", **kw)
            assert ei.value.code == code, (kw, ei.value)
            assert time.monotonic() - t0 < QUICK_S
        r = inspect(m.addr, "segments")
        assert r.returncode == 1 and "requires TLS" in r.stderr, r.stderr
        r = inspect(m.addr, "segments", tls=["--tls-ca", certs.path("ca.pem")])
        assert r.returncode == 1 and "ILLEGAL_CLIENT" in r.stderr, r.stderr
        # a store node without a certificate does not start
        p = subprocess.run([daemons.tool("moonlet-store"), "--master", m.addr, "--segment-size",
                            "16MiB", "--tls-ca", certs.path("ca.pem"), "--rpc-timeout-ms",
                            "2000", "--log-level", "error"],
                           capture_output=True, text=True, timeout=30, env=daemons.child_env())
        assert p.returncode == 1, p.stderr
        # the master is unharmed: a good client still works
        st = moonlet.Store.connect(m.addr, protocol="tcp", **certs.kwargs("client"))
        st.close()
    finally:
        plain.stop()
        m.stop()


PERMISSION_DENIED = -2001


def test_certificate_carries_a_role(certs):
    """With --credentials and mutual TLS, a "cn:NAME" line gives the client
    certificate of that common name its roles and tenants: no token needed.
    The engine's certificate (client, tenant-a) puts and gets in tenant-a
    and is refused another tenant and an operator's call; the operator's
    certificate inspects; the store node's is a node's."""
    d = tempfile.mkdtemp(prefix="moonlet-tls-creds-")
    try:
        path = os.path.join(d, "credentials")
        with open(path, "w") as f:
            f.write("cn:client-1 client tenant-a\n"
                    "cn:operator-1 operator,reader\n"
                    "cn:store-1 node\n")
        os.chmod(path, 0o600)
        m = start_tls_master(certs, "master", "--credentials", path)
        s = None
        try:
            s = daemons.start_store(m.addr, "64MiB", "--ping-interval-ms", "200",
                                    *certs.flags("store"))
            st = moonlet.Store.connect(m.addr, protocol="tcp", default_tenant="tenant-a",
                                       **certs.kwargs("client"))
            try:
                st.put("mine", b"m" * 5000)
                assert st.get("mine") == b"m" * 5000
                with pytest.raises(moonlet.StoreError) as ei:
                    st.get("mine", tenant_id="tenant-b")
                assert ei.value.code == PERMISSION_DENIED, ei.value
                with pytest.raises(moonlet.StoreError) as ei:
                    st._remove_force("mine")
                assert ei.value.code == PERMISSION_DENIED, ei.value
            finally:
                st.close()
            r = inspect(m.addr, "segments", tls=certs.flags("operator"))
            assert r.returncode == 0 and s.addr in r.stdout, r.stderr
            r = inspect(m.addr, "segments", tls=certs.flags("client"))
            assert r.returncode != 0 and "PERMISSION_DENIED" in r.stderr, r.stderr
        finally:
            if s:
                s.stop()
            m.stop()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_sighup_reloads_certificate(certs):
    """After SIGHUP a new connection gets the new certificate (RPC and
    /metrics); a client connected before keeps working."""
    live = tempfile.mkdtemp(prefix="moonlet-tls-live-")
    try:
        for ext in ("pem", "key"):
            shutil.copy(certs.path(f"master.{ext}"), os.path.join(live, f"live.{ext}"))
        m = daemons.start_master("--shards", "64", "--client_live_ttl_sec", "600",
                                 "--rpc-address", "127.0.0.1", "--metrics-port", "0",
                                 "--tls-cert", os.path.join(live, "live.pem"),
                                 "--tls-key", os.path.join(live, "live.key"),
                                 "--tls-ca", certs.path("ca.pem"),
                                 ready=[daemons.LISTENING, r"metrics on (\S+):(\d+)$"])
        try:
            port = port_of(m.addr)
            mport = int(m.matches[r"metrics on (\S+):(\d+)$"].group(2))
            s = daemons.start_store(m.addr, "64MiB", "--ping-interval-ms", "200",
                                    *certs.flags("store"))
            st = moonlet.Store.connect(m.addr, protocol="tcp", **certs.kwargs("client"))
            try:
                st.put("before", b"x" * 1000)
                assert peer_cn(port, certs) == "master-1"
                for ext in ("pem", "key"):
                    shutil.copy(certs.path(f"master2.{ext}"), os.path.join(live, f"live.{ext}"))
                os.kill(m.pid, signal.SIGHUP)
                deadline = time.monotonic() + 10
                while peer_cn(port, certs) != "master-2":  # the reload is the daemon's, async
                    assert time.monotonic() < deadline, "the new certificate was not served"
                    time.sleep(0.05)
                # /metrics restarted with it on the same port
                deadline = time.monotonic() + 10
                while True:
                    try:
                        if peer_cn(mport, certs) == "master-2":
                            break
                    except OSError:
                        pass  # between its stop and its start
                    assert time.monotonic() < deadline, "/metrics did not take the new certificate"
                    time.sleep(0.05)
                assert metrics_get(mport, certs)[0] == 200
                # the client connected before the reload is unaffected
                st.put("after", b"y" * 1000)
                assert st.get("before") == b"x" * 1000 and st.get("after") == b"y" * 1000
                # and a new client connects with the new certificate
                st2 = moonlet.Store.connect(m.addr, protocol="tcp", **certs.kwargs("client"))
                assert st2.get("after") == b"y" * 1000
                st2.close()
                assert m.proc.poll() is None
            finally:
                st.close()
                s.stop()
        finally:
            m.stop()
    finally:
        shutil.rmtree(live, ignore_errors=True)
