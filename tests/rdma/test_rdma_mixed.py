"""A mixed cluster over Soft-RoCE, run by the `rdma` suite inside its qemu
guest (tests/rdma/guest.sh, test "rdma_mixed"):

  master      127.0.0.1
  store-dual  moonlet-store --protocol both --listen 10.77.0.1:PORT  (RDMA on
              rxe0's address and TCP on the same host, one segment, two
              endpoints)
  store-tcp   moonlet-store --protocol tcp --listen 10.77.0.1:PORT
  client      tests/cluster/mlc --protocol rdma --source-addr 10.77.0.2 (rxe1)
  reader      tests/cluster/mlc --protocol tcp

2-replica objects land on both stores.  The RDMA client writes the dual
node's replica over RDMA and the TCP node's over TCP (a TCP transport it
adds on first need, which it logs): rxe1's sent packets cover one replica's
bytes, not two.  The TCP-only reader then gets every object, verified,
through the TCP endpoints only: rxe1 and rxe0 count (almost) no packets
while it reads.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_rdma_cluster import (DEV_A, DEV_B, IP_A, IP_B, XFER_TIMEOUT_MS, Cluster,  # noqa: E402
                               binpath, counter, port_state, result, wait_for)
from daemons import Daemon, child_env  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402

MTU = 1024  # RoCE MTU of the rxe devices (packets carry at most this payload)


def mlc(cl, proto, *args, timeout=300):
    argv = [binpath("tests/cluster/mlc"), "--master", cl.maddr, "--protocol", proto,
            "--rpc-timeout-ms", "3000", "--transfer-timeout-ms", str(XFER_TIMEOUT_MS),
            "--log-level", "info"]
    if proto == "rdma":
        argv += ["--source-addr", IP_B]
    p = subprocess.run(argv + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout, env=child_env())
    assert p.returncode == 0, (args, p.returncode, p.stderr[-2000:])
    return json.loads(p.stdout), p.stderr


def test_rdma_mixed():
    assert port_state(DEV_A).endswith("ACTIVE") and port_state(DEV_B).endswith("ACTIVE")
    cl = Cluster()
    try:
        def store(name, proto, ready):
            """Store node store-NAME speaking `proto` on IP_A; returns its TCP
            endpoint (the group of `ready`)."""
            d = Daemon([binpath("tools/moonlet-store"), "--master", cl.maddr, "--protocol", proto,
                        "--listen", f"{IP_A}:0", "--segment-size", "160MiB",
                        "--client-id", f"store-{name}", "--ping-interval-ms", "200",
                        "--log-level", "info"], ready, timeout=30)
            cl.stores[name] = d
            return d.match.group(1)
        tcp_ep = store("dual", "both", r"tcp listening on (\S+:\d+)$")
        tcp_only_ep = store("tcp", "tcp", r"listening on (\S+:\d+)$")

        def segs():
            return {s["client_id"]: s for s in cl.inspect("segments")["segments"]}
        assert wait_for(lambda: {"store-dual", "store-tcp"} <= set(segs()), 20)
        s = segs()
        d, t = s["store-dual"], s["store-tcp"]
        assert d["protocol"] == "rdma" and d["endpoint"].startswith(IP_A + ":"), d
        assert d["alt_protocol"] == "tcp" and d["alt_endpoint"] == tcp_ep, d
        assert t["protocol"] == "tcp" and t["endpoint"] == tcp_only_ep and "alt_endpoint" not in t

        # ---- the RDMA client puts 2-replica objects: one replica per store
        n, lo, hi = 12, "64KiB", "4MiB"
        sent0 = counter(DEV_B, "sent_pkts")
        r, err = mlc(cl, "rdma", "put", "--prefix", "mx/", "--count", n, "--replicas", 2,
                     "--threads", 2, "--min-size", lo, "--max-size", hi)
        assert r["ok"] == n, r
        sent = counter(DEV_B, "sent_pkts") - sent0
        put_bytes = r["bytes"]
        assert "TCP transport added next to RDMA" in err, err[-2000:]
        # one replica's bytes went over RDMA (the dual node's), not two
        assert sent >= put_bytes / MTU * 0.95, (sent, put_bytes)
        assert sent <= put_bytes / MTU * 1.3, (sent, put_bytes)
        for i in range(n):
            reps = cl.inspect("key", f"mx/{i:06d}")["keys"][0]["replicas"]
            assert sorted(x["protocol"] for x in reps) == ["rdma", "tcp"], reps

        # ---- the RDMA client reads them back, verified
        g, _ = mlc(cl, "rdma", "get", "--prefix", "mx/", "--count", n, "--verify", "--threads", 2,
                   "--min-size", lo, "--max-size", hi)
        assert g["ok"] == n and g["wrong_bytes"] == 0, g

        # ---- a TCP-only client reads every object through TCP endpoints only
        a0, b0 = counter(DEV_A, "rcvd_pkts"), counter(DEV_B, "sent_pkts")
        g2, err2 = mlc(cl, "tcp", "get", "--prefix", "mx/", "--count", n, "--verify",
                       "--threads", 2, "--min-size", lo, "--max-size", hi)
        assert g2["ok"] == n and g2["wrong_bytes"] == 0, (g2, err2[-2000:])
        rx = counter(DEV_A, "rcvd_pkts") - a0 + counter(DEV_B, "sent_pkts") - b0
        assert rx < 64, rx  # no object's bytes crossed RDMA
        result("mixed", objects=n, put_bytes=put_bytes, rxe1_sent_pkts_put=sent,
               rdma_get_ok=g["ok"], tcp_get_ok=g2["ok"], rxe_pkts_during_tcp_get=rx)
    finally:
        cl.stop()
