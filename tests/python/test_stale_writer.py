"""Stale writers (issue 13, section 1): a put whose bytes are still on their way
when the master frees its range must never change another object.

Each test runs its own loopback cluster: a master, one store node whose data
endpoint is reached only through a delaying relay (tests/cluster/relay.py in
per-connection mode: a connection keeps the delay of the moment it was
accepted), and clients.  A "stale" client's connection is slow (its bytes
land seconds later); the "fresh" clients' connections are fast.  While the
stale bytes are in flight, fresh clients put, read and remove objects that
reuse the segment's space.  Every read must return the object's own bytes or
an error, never another put's bytes with success.

  test_late_bytes_after_transfer_deadline: the stale client gives up after its
      transfer deadline (transfer_timeout_ms 1000, link delay 3 s) and revokes.
  test_put_reaped_while_streaming: the put outlives --put_timeout_ms (1000,
      link delay 4 s) and the master's reaper revokes it while it streams.

Both failed on the code before the fence (the next objects read back the
stale put's bytes with success); the master there had no
--put_quarantine_grace_ms, so the reaper case ran without it.  Standard
library plus the moonlet package; every wait is bounded.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from daemons import Daemon, start_master, start_store

SEGMENT = 1 << 20
OBJ = 192 << 10
# The master of the reaper test releases quarantined ranges 300 ms after the
# put deadline, so ranges are reused while the stale bytes are still on the way.
GRACE = ("--put_quarantine_grace_ms", "300")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlowCluster:
    def __init__(self, tmp, master_args=()):
        self.control = os.path.join(tmp, "relay.json")
        self.set_delay(0)
        self.master = start_master("--shards", "8", "--log-level", "error",
                                   "--client_live_ttl_sec", "600", "--default_kv_lease_ttl", "50",
                                   *master_args)
        self.addr = self.master.addr
        store_port = free_port()
        relay = os.path.join(os.environ["MOONLET_SOURCE_ROOT"], "tests", "cluster", "relay.py")
        self.relay = Daemon([sys.executable, relay, "--listen", "127.0.0.1:0",
                             "--target", f"127.0.0.1:{store_port}", "--control", self.control],
                            r"listening on (\S+:\d+)$")
        self.store = start_store(self.addr, SEGMENT, "--advertise", self.relay.match.group(1),
                                 "--ping-interval-ms", "200", "--log-level", "error",
                                 listen=f"127.0.0.1:{store_port}",
                                 ready=[r"listening on (\S+:\d+)$", r"advertising (\S+:\d+)$"])

    def set_delay(self, ms):
        tmp = self.control + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"delay_ms": ms, "per_connection": True, "announce_accepts": True}, f)
        os.replace(tmp, self.control)
        # The relay reloads the file on every accept: no wait needed.

    def client(self, **kw):
        import moonlet
        return moonlet.Store.connect(self.addr, protocol="tcp", **kw)

    def stop(self):
        for d in (self.store, self.relay, self.master):
            d.stop()


@pytest.fixture
def make_cluster(tmp_path):
    made = []

    def make(*master_args):
        c = SlowCluster(str(tmp_path), master_args)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def pattern(tag, i):
    return (bytes([tag]) + i.to_bytes(4, "little")) * (OBJ // 5) + b"\0" * (OBJ % 5)


def churn_until(fresh, end, wrong, stats):
    """Puts, reads and removes objects on the fast path until `end`
    (time.monotonic()), checking every read.  At most 5 objects live."""
    import moonlet
    live = []
    i = 0
    while time.monotonic() < end:
        # Read every live object first: bytes that landed since the last
        # round are seen before their object can be removed.
        for k, d in live:
            try:
                got = fresh.get(k)
            except moonlet.StoreError:
                stats["read_errors"] += 1
                continue
            stats["reads"] += 1
            if bytes(got) != d:
                wrong.append(k)
        # The segment holds 5 objects: keep it full, so a freed range is
        # reused by the next put.
        while len(live) >= 4:
            remove_when_unleased(fresh, live.pop(0)[0])
        key, data = f"fresh/{i}", pattern(0x40 + i % 32, i)
        i += 1
        try:
            fresh.put(key, data)
            live.append((key, data))
            stats["puts"] += 1
        except moonlet.StoreError as e:
            stats["put_errors"][e.name] = stats["put_errors"].get(e.name, 0) + 1
    return live


def remove_when_unleased(store, key):
    """Removes a key once the read lease of our last get ran out (the
    cluster's lease TTL is 50 ms; bounded)."""
    import moonlet
    end = time.monotonic() + 2.0
    while True:
        try:
            store.remove(key)
            return
        except moonlet.StoreError as e:
            if e.name != "OBJECT_HAS_LEASE" or time.monotonic() > end:
                return
        time.sleep(0.01)  # no event announces a lease's end


def run_stale(cl, stale_kw, delay_ms, settle_s, background):
    """One stale put through a slow connection, fresh traffic meanwhile;
    returns (stale put's outcome, wrong keys, stats)."""
    import moonlet
    stale = cl.client(**stale_kw)
    outcome = {}

    def stale_put():
        try:
            stale.put("stale", pattern(0x21, 0))
            outcome["rc"] = "ok"
        except moonlet.StoreError as e:
            outcome["rc"] = e.name

    # The stale client connects on its first transfer, through the slow link.
    cl.set_delay(delay_ms)
    t = threading.Thread(target=stale_put)
    t.start()
    if background:
        # the relay announces the slow connection it accepted
        assert cl.relay.wait_line(rf"accepted delay_ms={delay_ms}$", 10), "no slow connection"
    else:
        t.join(timeout=30)  # it gives up after its transfer deadline
    cl.set_delay(0)
    fresh = cl.client()
    wrong = []
    stats = {"puts": 0, "reads": 0, "read_errors": 0, "put_errors": {}}
    end = time.monotonic() + delay_ms / 1000.0 + settle_s
    live = churn_until(fresh, end, wrong, stats)
    t.join(timeout=30)
    assert not t.is_alive()
    for k, d in live:  # read once more after every stale byte had its chance
        try:
            if bytes(fresh.get(k)) != d:
                wrong.append(k)
        except moonlet.StoreError:
            pass
    fresh.close()
    stale.close()
    return outcome.get("rc"), wrong, stats


def test_late_bytes_after_transfer_deadline(make_cluster):
    cl = make_cluster()
    rc, wrong, stats = run_stale(cl, {"transfer_timeout_ms": 1000}, 3000, 1.5, False)
    print("stale put:", rc, "stats:", stats)
    assert rc != "ok"
    assert stats["puts"] > 3 and stats["reads"] > 3
    assert not wrong, f"{len(wrong)} reads returned another put's bytes with success: {sorted(set(wrong))}"


def test_put_reaped_while_streaming(make_cluster):
    cl = make_cluster("--put_timeout_ms", "1000", *GRACE)
    rc, wrong, stats = run_stale(cl, {"transfer_timeout_ms": 10000}, 4000, 1.5, True)
    print("stale put:", rc, "stats:", stats)
    assert rc != "ok"
    assert stats["puts"] > 3 and stats["reads"] > 3
    assert not wrong, f"{len(wrong)} reads returned another put's bytes with success: {sorted(set(wrong))}"
