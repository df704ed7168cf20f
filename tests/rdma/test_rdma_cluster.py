"""A moonlet cluster over real kernel RDMA (Soft-RoCE), run by the `rdma`
suite inside its qemu guest (tests/rdma/guest.sh):

  master      127.0.0.1 (the control plane is TCP)
  store-1/2   moonlet-store --protocol rdma --listen 10.77.0.1:PORT   (rxe0)
  client      tests/cluster/mlc --protocol rdma --source-addr 10.77.0.2  (rxe1)

The client binds rxe1's address, so every byte crosses the veth wire between
rxe1 and rxe0; the devices' hardware packet counters prove it.  One scenario,
in order: 2-replica puts and verified gets of 1 KiB - 16 MiB; a store
SIGKILLed while 16 MiB reads stream (every get falls over to the surviving
replica within one transfer deadline); the store restarted on the same
endpoint (a long-running client's pooled connections recover within about a
second); the client's link taken down under load (every operation still ends
within its deadlines).  Daemons come from
tests/python/daemons.py; each is stopped by its own PID.  Every wait is
bounded and waits for an observable event (a "listening" line, a counter, the
master's segment table).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from daemons import Daemon, build_root, child_env  # noqa: E402

IP_A = os.environ.get("MOONLET_RDMA_SERVER_ADDR", "10.77.0.1")
IP_B = os.environ.get("MOONLET_RDMA_CLIENT_ADDR", "10.77.0.2")
DEV_A = os.environ.get("MOONLET_RDMA_SERVER_DEV", "rxe0")
DEV_B = os.environ.get("MOONLET_RDMA_CLIENT_DEV", "rxe1")
NET_B = os.environ.get("MOONLET_RDMA_CLIENT_NETDEV", "vethB")
# A 16 MiB write to two replicas takes 1.5 - 3 s under software CPU emulation
# (about 10 - 20 MB/s through rxe) on a quiet machine, more on a busy one.
XFER_TIMEOUT_MS = 5000
TTL_S = 2
RESULTS = os.environ.get("MOONLET_RDMA_RESULTS")  # file for the measured figures (JSON lines)


def result(name, **figures):
    line = json.dumps({"scenario": name, **figures})
    print("RESULT", line)
    if RESULTS:
        with open(RESULTS, "a") as f:
            f.write(line + "\n")


def counter(dev, name):
    with open(f"/sys/class/infiniband/{dev}/ports/1/hw_counters/{name}") as f:
        return int(f.read())


def port_state(dev):
    with open(f"/sys/class/infiniband/{dev}/ports/1/state") as f:
        return f.read().strip()


def wait_for(pred, timeout, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def binpath(rel):
    return os.path.join(build_root(), rel)


class Cluster:
    def __init__(self):
        self.master = Daemon([binpath("tools/moonlet-master"), "--rpc-address", "127.0.0.1",
                              "--rpc-port", "0", "--client_live_ttl_sec", str(TTL_S),
                              "--shards", "16", "--log-level", "warn"],
                             r"listening on (\S+:\d+)$", timeout=30)
        self.maddr = self.master.match.group(1)
        self.stores = {}
        self.ports = {}

    def start_store(self, i, port=0):
        d = Daemon([binpath("tools/moonlet-store"), "--master", self.maddr, "--protocol", "rdma",
                    "--listen", f"{IP_A}:{port}", "--segment-size", "160MiB",
                    "--client-id", f"store-{i}", "--ping-interval-ms", "200",
                    "--rpc-timeout-ms", "1000", "--log-level", "info"],
                   r"listening on (\S+:(\d+))$", timeout=30)
        self.stores[i] = d
        self.ports[i] = int(d.match.group(2))
        assert d.match.group(1).startswith(IP_A + ":"), d.match.group(0)
        return d

    def endpoint(self, i):
        return f"{IP_A}:{self.ports[i]}"

    def mlc_argv(self, *args):
        return [binpath("tests/cluster/mlc"), "--master", self.maddr, "--protocol", "rdma",
                "--source-addr", IP_B, "--rpc-timeout-ms", "3000",
                "--transfer-timeout-ms", str(XFER_TIMEOUT_MS), *map(str, args)]

    def mlc(self, *args, timeout=180):
        p = subprocess.run(self.mlc_argv(*args), capture_output=True, text=True,
                           timeout=timeout, env=child_env())
        assert p.returncode == 0, (args, p.returncode, p.stderr[-2000:])
        return json.loads(p.stdout)

    def mlc_bg(self, *args):
        return subprocess.Popen(self.mlc_argv(*args), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=child_env())

    def inspect(self, *args):
        p = subprocess.run([binpath("tools/moonlet-inspect"), "--master", self.maddr, "--json",
                            *args], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    def first_replica(self, key):
        d = self.inspect("key", key)
        return d["keys"][0]["replicas"][0]["endpoint"]

    def mounted(self, i):
        return any(s["endpoint"] == self.endpoint(i) for s in self.inspect("segments")["segments"])

    def stop(self):
        for d in self.stores.values():
            d.stop()
        self.master.stop()


def bg_report(p, timeout, name=None):
    out, err = p.communicate(timeout=timeout)
    if name and RESULTS:  # keep the client's log beside the results
        with open(os.path.join(os.path.dirname(RESULTS), f"mlc-{name}.log"), "w") as f:
            f.write(err)
    assert p.returncode == 0, (p.returncode, err[-2000:])
    return json.loads(out), err


def log_since(err, second):
    """mlc's stderr from its first failure line ("mlc: at S s: ...") at or
    after `second` of its run on (library lines between included)."""
    lines = err.splitlines()
    for n, ln in enumerate(lines):
        m = re.match(r"mlc: at ([0-9.]+) s: ", ln)
        if m and float(m.group(1)) >= second:
            return "\n".join(lines[n:])
    return ""


def test_rdma_cluster():
    assert port_state(DEV_A).endswith("ACTIVE") and port_state(DEV_B).endswith("ACTIVE")
    cl = Cluster()
    try:
        cl.start_store(1)
        cl.start_store(2)
        assert wait_for(lambda: cl.mounted(1) and cl.mounted(2), 20)
        scenario(cl)
    finally:
        cl.stop()


def test_device_removal():
    """The store's RDMA device is removed (`rdma link delete`): the store
    logs it, unmounts and exits 1 within a few heartbeats, so that systemd
    (Restart=on-failure) starts it again once the device is back.  Runs last:
    rxe0 is gone afterwards."""
    cl = Cluster()
    try:
        d = cl.start_store(1)
        assert wait_for(lambda: cl.mounted(1), 20)
        t0 = time.monotonic()
        rm = subprocess.Popen(["rdma", "link", "delete", DEV_A])
        try:
            rc = d.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError("store still running 30 s after the device's removal: "
                                 + d.err()[-3000:])
        exit_s = time.monotonic() - t0
        assert rm.wait(timeout=30) == 0
        assert rc == 1, rc
        err = d.err()
        # a few heartbeats (200 ms); it took 0.7 - 14 s, once over 30 s, while
        # the node returned without joining its repair thread
        assert exit_s < 5, (exit_s, err[-1500:])
        print("store log (device removal):\n" + err[-1500:])
        assert "removed" in err and "exiting" in err, err[-1500:]
        assert wait_for(lambda: not cl.mounted(1), 10, 0.1)  # it unmounted (or its TTL ran out)
        result("device_removal", store_exit_s=round(exit_s, 2))
    finally:
        cl.stop()


def scenario(cl):
    # ---- 2-replica puts and verified gets, 1 KiB - 16 MiB, over the wire
    sent0, rcvd0 = counter(DEV_B, "sent_pkts"), counter(DEV_B, "rcvd_pkts")
    sets = [("small/", 8, "1KiB", "1KiB"), ("mixed/", 12, "1KiB", "16MiB"),
            ("big/", 4, "16MiB", "16MiB")]
    put_bytes = get_bytes = 0
    t0 = time.monotonic()
    for prefix, n, lo, hi in sets:
        r = cl.mlc("put", "--prefix", prefix, "--count", n, "--replicas", 2, "--threads", 2,
                   "--min-size", lo, "--max-size", hi)
        assert r["ok"] == n, r
        put_bytes += r["bytes"]
        g = cl.mlc("get", "--prefix", prefix, "--count", n, "--verify", "--threads", 2,
                   "--min-size", lo, "--max-size", hi)
        assert g["ok"] == n and g["wrong_bytes"] == 0, g
        get_bytes += g["bytes"]
    secs = time.monotonic() - t0
    sent = counter(DEV_B, "sent_pkts") - sent0
    rcvd = counter(DEV_B, "rcvd_pkts") - rcvd0
    # every byte written to 2 replicas left through rxe1, every byte read came
    # back through it, in packets of at most the 1024-byte RoCE MTU
    assert sent >= 2 * put_bytes // 1024 * 0.95, (sent, put_bytes)
    assert rcvd >= get_bytes // 1024 * 0.95, (rcvd, get_bytes)
    result("put_get", put_bytes=put_bytes, get_bytes=get_bytes, seconds=round(secs, 2),
           rxe1_sent_pkts=sent, rxe1_rcvd_pkts=rcvd)

    # ---- SIGKILL the store serving the 16 MiB reads, mid-read
    big = dict(prefix="big/", n=4)
    first = cl.first_replica("big/000000")
    victim = 1 if first == cl.endpoint(1) else 2
    survivor = 3 - victim
    # a long-running client (mixed load, pooled connections) for the restart below
    load = cl.mlc_bg("mixed", "--prefix", "load/", "--seconds", 24, "--replicas", 2,
                     "--rate", 30, "--threads", 2, "--min-size", "1KiB", "--max-size", "64KiB",
                     "--live-max", 60, "--log-level", "warn")
    t_load = time.monotonic()
    rcvd_before = counter(DEV_B, "rcvd_pkts")
    reader = cl.mlc_bg("get", "--prefix", big["prefix"], "--count", big["n"], "--verify",
                       "--per-key", "--threads", 1, "--min-size", "16MiB", "--max-size", "16MiB",
                       "--log-level", "info")
    # reads are streaming once rxe1 has received 2 MiB of responses
    assert wait_for(lambda: counter(DEV_B, "rcvd_pkts") - rcvd_before > 2048, 30, 0.005)
    t_kill = time.monotonic()
    cl.stores[victim].proc.send_signal(signal.SIGKILL)
    cl.stores[victim].proc.wait(timeout=10)
    g, err = bg_report(reader, 120, "kill")
    assert g["ok"] == big["n"] and g["wrong_bytes"] == 0, (g, err[-2000:])
    worst = max(e["ms"] for e in g["per_key"])
    # the interrupted get went to the other replica within one transfer deadline
    # (plus reading 16 MiB again under software emulation)
    assert worst < XFER_TIMEOUT_MS + 3000, g
    saw = [ln for ln in err.splitlines() if cl.endpoint(victim) in ln]
    assert saw, err[-2000:]  # the client did meet the dead node
    result("kill_mid_read", victim_endpoint=cl.endpoint(victim), worst_get_ms=worst,
           get_ms=[e["ms"] for e in g["per_key"]], client_saw=saw[0][-160:])

    # ---- restart it on the same endpoint: the long-running client recovers
    assert wait_for(lambda: not cl.mounted(victim), TTL_S + 5, 0.1)
    cl.stores[victim].stop()
    cl.start_store(victim, port=cl.ports[victim])
    assert wait_for(lambda: cl.mounted(victim), 20, 0.05)
    t_mounted = time.monotonic()
    # a fresh client reads and writes both nodes at once
    r = cl.mlc("put", "--prefix", "after/", "--count", 6, "--replicas", 2, "--min-size", "4KiB",
               "--max-size", "1MiB")
    assert r["ok"] == 6, r
    lr, lerr = bg_report(load, 90, "restart")
    tl = lr["timeline"]
    assert lr["wrong_bytes"] == 0, lr
    # seconds of the load's timeline that began at least 1 s after the remount
    first_clean = int(t_mounted - t_load) + 2
    tail = tl[first_clean:-1]
    assert tail and all(err_n == 0 and ok > 0 for ok, err_n in tail), \
        (first_clean, tl, {k: v["errors"] for k, v in lr["ops"].items()},
         log_since(lerr, first_clean - 1)[-3000:], cl.stores[victim].err()[-1500:])
    # the first whole second with no error after the remount
    rec = next((s for s in range(int(t_mounted - t_load), len(tl)) if tl[s][1] == 0 and tl[s][0]),
               None)
    result("restart", killed_at_s=round(t_kill - t_load, 1), remounted_at_s=round(t_mounted - t_load, 1),
           first_clean_second=rec, timeline=tl)

    # ---- the client's link down and up, under load
    # While the link is down every operation must end within its deadlines
    # (one connection attempt per replica, not one per pooled slot), never
    # hang, and never return wrong bytes.  Recovery after the link comes back
    # is not asserted: on this kernel (6.1 rdma_rxe over veth) no new RC
    # connection crosses that wire for over a minute after connections were
    # torn down while it was down - rping included (docs/reliability.md).
    load = cl.mlc_bg("mixed", "--prefix", "flap/", "--seconds", 12, "--replicas", 2,
                     "--rate", 30, "--threads", 2, "--min-size", "1KiB", "--max-size", "64KiB",
                     "--live-max", 60, "--log-level", "warn")
    t_load = time.monotonic()
    sent_before = counter(DEV_B, "sent_pkts")
    assert wait_for(lambda: counter(DEV_B, "sent_pkts") - sent_before > 200, 20, 0.01)
    subprocess.run(["ip", "link", "set", NET_B, "down"], check=True)
    t_down = time.monotonic()
    assert wait_for(lambda: not port_state(DEV_B).endswith("ACTIVE"), 10, 0.01)
    lr, lerr = bg_report(load, 90, "flap")
    subprocess.run(["ip", "link", "set", NET_B, "up"], check=True)
    subprocess.run(["ip", "route", "replace", IP_A, "dev", NET_B, "table", "102"], check=True)
    tl = lr["timeline"]
    assert lr["wrong_bytes"] == 0, lr
    down_s = int(t_down - t_load)
    assert any(e for _, e in tl[down_s + 1:]), tl  # the outage was seen ...
    # ... and no operation outlived one transfer deadline per replica (plus
    # the master round trips)
    bound = 2 * XFER_TIMEOUT_MS + 2000
    worst = {k: v["max_ms"] for k, v in lr["ops"].items() if v["ops"]}
    assert all(ms < bound for ms in worst.values()), (worst, lerr[-1500:])
    result("link_down", down_at_s=round(t_down - t_load, 1), worst_op_ms=worst,
           bound_ms=bound, timeline=tl)
