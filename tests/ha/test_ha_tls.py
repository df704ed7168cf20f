"""HA with TLS everywhere (issue 33): etcd over https requiring client
certificates (--client-cert-auth; the masters' --etcd-ca/--etcd-cert/
--etcd-key), two masters with mutual TLS on their RPC and replication
servers, a store node and a client with certificates.  The leader is
elected through TLS etcd, the standby follows it over the TLS replication
stream, and after the leader is killed the standby serves what was put
before.  Certificates are made at run time (tests/python/tlscerts.py).
Skips without etcd or openssl.  Daemons on loopback, stopped by PID;
every wait bounded.
"""
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

sys.path.insert(0, os.path.join(os.environ.get("MOONLET_SOURCE_ROOT", "."), "tests", "python"))
import daemons  # noqa: E402
import tlscerts  # noqa: E402

TTL_S = 2
ETCD = shutil.which("etcd") or "/usr/bin/etcd"

pytestmark = pytest.mark.skipif(not os.access(ETCD, os.X_OK) or not tlscerts.available(),
                                reason="no etcd or openssl binary (scripts/setup.sh installs both)")


class TlsEtcd(daemons.Etcd):
    """One etcd serving clients over https with --client-cert-auth."""

    def refuses_without_client_cert(self):
        ctx = ssl.create_default_context(cafile=self.certs.path("ca.pem"))
        req = urllib.request.Request(self.url + "/v3/kv/range", data=b'{"key":"eA=="}')
        try:
            urllib.request.urlopen(req, timeout=5, context=ctx).read()
            return False
        except (OSError, ssl.SSLError):
            return True


def status(addrs, certs):
    r = subprocess.run([daemons.tool("moonlet-inspect"), "--master", ",".join(addrs),
                        *certs.flags("operator"), "status", "--json"],
                       capture_output=True, text=True, timeout=30, env=daemons.child_env())
    return json.loads(r.stdout) if r.stdout.strip() else {"masters": [], "leader": ""}


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.1)


def leader_of(addrs, certs):
    for m in status(addrs, certs)["masters"]:
        if m.get("role") == "leader" and m.get("serving"):
            return m["master"]
    return None


@pytest.fixture
def certs():
    with tlscerts.temp_certs("moonlet-ha-tls-", {"etcd": "etcd", "master": "master"},
                             {n: n for n in ("store", "client", "operator")}) as d:
        yield d


def test_ha_over_tls(certs):
    import moonlet
    etcd = TlsEtcd(certs)
    started = []
    try:
        assert etcd.refuses_without_client_cert()
        cluster = "tls" + uuid.uuid4().hex[:8]
        etcd_flags = ["--etcd-ca", certs.path("ca.pem"), "--etcd-cert", certs.path("master.pem"),
                      "--etcd-key", certs.path("master.key")]
        for _ in range(2):
            started.append(daemons.start_master(
                "--etcd-endpoints", etcd.url, "--cluster-id", cluster,
                "--advertise", "127.0.0.1:0", "--etcd-lease-ttl", str(TTL_S),
                "--client_live_ttl_sec", "600", "--shards", "64", "--log-level", "info",
                "--rpc-address", "127.0.0.1", *certs.flags("master"), *etcd_flags))
        addrs = [m.addr for m in started]
        leader = wait_for(lambda: leader_of(addrs, certs), 4 * TTL_S + 5, "a leader")
        standby = [a for a in addrs if a != leader][0]
        store = daemons.start_store(",".join(addrs), "64MiB", "--ping-interval-ms", "200",
                                    "--rpc-timeout-ms", "1000", *certs.flags("store"))
        started.append(store)
        s = moonlet.Store.connect(addrs, protocol="tcp", **certs.kwargs("client"))
        try:
            deadline = time.monotonic() + 15
            while True:  # the store node mounts its segment first
                try:
                    s.put("before", b"b" * 4096)
                    break
                except moonlet.StoreError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)

            def in_sync():
                st = {m["master"]: m for m in status(addrs, certs)["masters"]}
                rep = st.get(leader, {}).get("replication") or {}
                fol = st.get(standby, {}).get("following") or {}
                return rep.get("in_sync") and rep.get("standby") == standby and \
                    fol.get("consistent") and fol.get("applied", 0) > 0
            wait_for(in_sync, 20, "the standby in sync over the TLS replication stream")
            by_addr = {m.addr: m for m in started[:2]}
            by_addr[leader].proc.send_signal(signal.SIGKILL)
            new = wait_for(lambda: leader_of([standby], certs), 2 * TTL_S + 8, "the standby serving")
            assert new == standby
            deadline = time.monotonic() + 15
            while True:  # the client follows the new leader
                try:
                    got = s.get("before")
                    break
                except moonlet.StoreError:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            assert got == b"b" * 4096  # replicated over TLS before the failover
        finally:
            s.close()
    finally:
        for d in reversed(started):
            d.stop()
        etcd.stop()
