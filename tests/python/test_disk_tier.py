"""The disk tier end to end (moonlet-store --disk): objects evicted from a
small DRAM segment come back from the node's disk, byte-checked; a node
restarted with its disk brings its objects back; a disk object whose bytes
were damaged is refused, never returned; a disk too small for everything
evicts its own coldest objects and still returns only exact bytes.

Each test runs its own master (eviction from 50% use) and store node: a
4 MiB segment and a disk tier in files under the build tree (O_DIRECT wants
a real file system, not tmpfs).  Waits poll the master's counters, bounded.
"""
import json
import os
import shutil
import subprocess
import time

import pytest

import daemons
import moonlet

KIB = 1 << 10
MIB = 1 << 20
OBJ = 256 * KIB  # 16 fit in the segment


@pytest.fixture
def disk_dir():
    d = daemons.direct_io_dir("test-disk-tier-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start_store(master, disk_dir, disk_size="64MiB", client_id="disk-node", segment="4MiB"):
    return daemons.start_store(master.addr, segment, "--client-id", client_id,
                               "--disk", os.path.join(disk_dir, "a.tier"),
                               "--disk-size", disk_size, "--ping-interval-ms", "200")


def stats(master):
    out = subprocess.run([daemons.tool("moonlet-inspect"), "--master", master.addr, "--json",
                          "stats"], capture_output=True, text=True, timeout=30, check=True,
                         env=daemons.child_env())
    return json.loads(out.stdout)


def wait_for(master, what, timeout=30.0):
    """Polls the master's counters until what(stats) holds (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        st = stats(master)
        if what(st):
            return st
        assert time.monotonic() < deadline, f"timed out waiting; last stats: {st}"
        time.sleep(0.05)


def value(i, size=OBJ):
    return bytes([i & 0xFF]) * 17 + os.urandom(size - 17)


def put_paced(store, keys, data, master, chunk=1):
    """Puts chunk at a time, each chunk after the master has settled the
    last (no demotion queued): eviction finds copies made ahead."""
    for i, k in enumerate(keys):
        store.put(k, data[k])
        if (i + 1) % chunk == 0 or i + 1 == len(keys):
            wait_for(master, lambda st: st["demotions_queued"] == 0, timeout=60)


class DiskCluster:
    """A master, a node with a disk tier and a client, stopped on exit.
    .node may be replaced (a restart) by restart_node()."""

    def __init__(self, disk_dir, *master_flags, disk_size="64MiB", segment="4MiB"):
        self.disk_dir, self.disk_size, self.segment = disk_dir, disk_size, segment
        self.master = daemons.start_master("--shards", "16", "--eviction_high_watermark_ratio",
                                           "0.5", "--client_live_ttl_sec", "600", *master_flags)
        self.node = start_store(self.master, disk_dir, disk_size, segment=segment)
        self.store = moonlet.Store.connect(self.master.addr, protocol="tcp")

    def fill(self, prefix, n, paced=True, size=OBJ, chunk=1):
        """Puts n objects prefix0.. of size bytes (chunk at a time, each
        after the master settled the last, or all at once) and returns
        (keys, their values)."""
        keys = [f"{prefix}{i}" for i in range(n)]
        data = {k: value(i, size) for i, k in enumerate(keys)}
        if paced:
            put_paced(self.store, keys, data, self.master, chunk)
        else:
            for k in keys:
                self.store.put(k, data[k])
        return keys, data

    def restart_node(self):
        self.node.stop()
        self.node = start_store(self.master, self.disk_dir, self.disk_size, segment=self.segment)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.store.close()
        self.node.stop()
        self.master.stop()


def test_evicted_objects_come_back_from_disk(disk_dir):
    with DiskCluster(disk_dir) as c:
        keys, data = c.fill("k", 40)
        st = wait_for(c.master, lambda st: st["demotions"] > 0 and st["demotions_queued"] == 0)
        assert st["disk_objects"] == st["demotions"] > 0
        back = 0
        for k in keys:
            try:
                got = c.store.get(k)
            except moonlet.StoreError as e:
                assert e.name == "OBJECT_NOT_FOUND", (k, e)
                continue
            assert got == data[k], k  # never other bytes
            back += 1
        # DRAM holds at most 16; the disk gave back the others
        assert back >= 16 + st["disk_objects"] // 2, (back, st)
        assert back > 16


def test_restart_brings_the_disk_back(disk_dir):
    with DiskCluster(disk_dir) as c:
        keys, data = c.fill("r", 30)
        wait_for(c.master, lambda st: st["disk_objects"] >= 8 and st["demotions_queued"] == 0)
        on_disk = [k for k in keys if disk_replica(c.master, k)]
        assert len(on_disk) >= 8
        c.node.stop()  # unmounts: the master forgets the node's objects
        for k in on_disk:
            with pytest.raises(moonlet.StoreError) as ei:
                c.store.get(k)
            assert ei.value.name == "OBJECT_NOT_FOUND"
        c.restart_node()
        st = wait_for(c.master, lambda st: st["disk_announced"] >= len(on_disk))
        for k in on_disk:
            assert c.store.get(k) == data[k], k
        assert st["disk_objects"] >= len(on_disk)


def disk_replica(master, key):
    """The key's disk replica (inspect's view), or None."""
    out = subprocess.run([daemons.tool("moonlet-inspect"), "--master", master.addr, "--json",
                          "key", key], capture_output=True, text=True, timeout=30,
                         env=daemons.child_env())
    if out.returncode:
        return None
    doc = json.loads(out.stdout)
    for k in doc["keys"]:
        for r in k.get("replicas", []):
            if r.get("tier") == "disk":
                return r
    return None


def test_damaged_disk_object_is_refused(disk_dir):
    with DiskCluster(disk_dir) as c:
        keys, data = c.fill("d", 30)
        wait_for(c.master, lambda st: st["disk_objects"] >= 2 and st["demotions_queued"] == 0)
        victim = next(k for k in keys if disk_replica(c.master, k))
        extent = disk_replica(c.master, victim)["offset"]
        # the header is one block (a short key): flip a byte of the bytes
        with open(os.path.join(disk_dir, "a.tier"), "r+b") as f:
            f.seek(extent + 4096 + 1000)
            b = f.read(1)
            f.seek(extent + 4096 + 1000)
            f.write(bytes([b[0] ^ 0xFF]))
        with pytest.raises(moonlet.StoreError) as ei:
            c.store.get(victim)
        assert ei.value.name in ("INVALID_READ", "TRANSFER_FAIL"), ei.value
        # the others still read exact
        for k in keys:
            if k != victim and disk_replica(c.master, k):
                assert c.store.get(k) == data[k]
        # a restart's rescan drops it: it is not announced again
        c.restart_node()
        wait_for(c.master, lambda st: st["disk_announced"] > 0)
        with pytest.raises(moonlet.StoreError) as ei:
            c.store.get(victim)
        assert ei.value.name == "OBJECT_NOT_FOUND"


def exact_or_missing(store, keys, data):
    """Every key reads its own bytes or OBJECT_NOT_FOUND; returns how many read."""
    back = 0
    for k in keys:
        try:
            assert store.get(k) == data[k], k
            back += 1
        except moonlet.StoreError as e:
            assert e.name == "OBJECT_NOT_FOUND", (k, e)
    return back


def test_small_disk_evicts_its_own(disk_dir):
    """A 1 MiB disk holds three objects: demotions evict the disk's coldest,
    and every read is exact or OBJECT_NOT_FOUND."""
    with DiskCluster(disk_dir, disk_size="1MiB") as c:
        keys, data = c.fill("s", 40)
        st = wait_for(c.master, lambda st: st["disk_evictions"] > 0 and
                      st["demotions_queued"] == 0)
        assert st["disk_objects"] <= 3
        assert st["disk_used"] <= st["disk_capacity"]
        exact_or_missing(c.store, keys, data)


def test_flood_never_waits_for_the_disk(disk_dir):
    """A flood of puts (no pacing), far past the segment, with a demotion
    queue of 4: eviction never waits for the disk. Every put succeeds (each
    has a deadline: one held back behind the disk would fail), demotions
    beyond the queue are dropped and counted, and every read is exact or
    OBJECT_NOT_FOUND."""
    with DiskCluster(disk_dir, "--demote-queue", "4") as c:
        keys, data = c.fill("f", 200, paced=False)
        st = wait_for(c.master, lambda st: st["demotions_queued"] == 0)
        assert st["evictions"] > 0
        assert st["demotions"] + st["demotions_dropped"] > 0
        assert exact_or_missing(c.store, keys, data) >= 16


def test_disk_flags_refused(disk_dir):
    for extra, why in [(["--disk", os.path.join(disk_dir, "x")], "--disk-size"),
                       (["--disk-size", "64MiB"], "--disk-size"),
                       (["--disk", "a", "--disk-size", "12"], "--disk-size"),
                       (["--disk-queue-depth", "4"], "--disk")]:
        out = subprocess.run([daemons.tool("moonlet-store"), "--master", "127.0.0.1:1", *extra],
                             capture_output=True, text=True, timeout=30, env=daemons.child_env())
        assert out.returncode == 2 and why in out.stderr, (extra, out.stderr)


def segments(master):
    out = subprocess.run([daemons.tool("moonlet-inspect"), "--master", master.addr, "--json",
                          "segments"], capture_output=True, text=True, timeout=30, check=True,
                         env=daemons.child_env())
    return json.loads(out.stdout)["segments"]


def test_node_reports_its_disk_tier(disk_dir):
    """The node's own disk tier figures reach the master with its Pings:
    inspect segments shows them with the disk segment (and once per node in
    the table), Stats sums them; disk hits count the reads served from
    disk, demotions at least those the master joined."""
    with DiskCluster(disk_dir) as c:
        keys, data = c.fill("n", 30)
        st = wait_for(c.master, lambda st: st["disk_objects"] >= 4 and
                      st["demotions_queued"] == 0)
        on_disk = [k for k in keys if disk_replica(c.master, k)]
        assert len(on_disk) >= 4
        for k in on_disk:
            assert c.store.get(k) == data[k], k
        # the node's demoted counts copies made ahead too (staged, not yet joined)
        st = wait_for(c.master, lambda st: st["node_disk"]["reads"] >= len(on_disk) and
                      st["node_disk"]["demoted"] >= st["demotions"] > 0)
        nd = st["node_disk"]
        assert nd["read_errors"] == nd["io_errors"] == nd["checksum_errors"] == 0, nd
        assert nd["queue_depth"] > 0 and nd["inflight"] <= nd["queue_depth"], nd
        [seg] = [s for s in segments(c.master) if s["disk"]]
        assert seg["node_tier"]["reads"] >= len(on_disk), seg
        assert all("node_tier" not in s for s in segments(c.master) if not s["disk"])
        table = subprocess.run([daemons.tool("moonlet-inspect"), "--master", c.master.addr,
                                "segments"], capture_output=True, text=True, timeout=30,
                               check=True, env=daemons.child_env()).stdout
        assert table.count("disk tier of disk-node:") == 1, table


def test_large_demotions_come_back(disk_dir):
    """Demotions of 8 MiB objects, more than a node's demotion batch
    (64 MiB) at a time: the node writes its batches on two streams at once;
    every object reads back exact or OBJECT_NOT_FOUND, and most come back."""
    size = 8 * MIB
    with DiskCluster(disk_dir, disk_size="1GiB", segment="128MiB") as c:
        keys, data = c.fill("L", 40, size=size, chunk=12)
        st = wait_for(c.master, lambda st: st["demotions"] > 0 and
                      st["demotions_queued"] == 0, timeout=60)
        assert st["demotions_failed"] == 0, st
        # DRAM holds at most 16 of them; the disk gives back the others
        back = exact_or_missing(c.store, keys, data)
        assert back > 16, (back, st)
