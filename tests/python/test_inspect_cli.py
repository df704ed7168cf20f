"""Integration tests of moonlet-inspect and of the master's /metrics endpoint.

Each test starts its own moonlet-master on 127.0.0.1 and an ephemeral port
(parsing its "listening on HOST:PORT" line), sets up state through the
tests/tools/mlt-put helper (MasterClient from the command line), runs the
moonlet-inspect binary of the build tree and checks its output against what
was put.  Only the PIDs started here are ever signalled; every wait is
bounded.
"""
import fcntl
import json
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import tempfile
import termios
import time
import urllib.error
import urllib.request

import pytest

from daemons import build_root, child_env, start_master, start_store

BUILD = build_root()
INSPECT_BIN = os.path.join(BUILD, "tools", "moonlet-inspect")
PUT_BIN = os.path.join(BUILD, "tests", "tools", "mlt-put")

MIB = 1 << 20
K3 = ["kda/128/r0", "kda/128/r1", "kda/256/r0", "kda/256/r1", "kda/384/r0", "kda/384/r1"]


def Master(*extra, timeout=10.0):
    """A moonlet-master child process on an ephemeral port: .addr, and
    .metrics when started with --metrics-port (else None)."""
    ready = [r"listening on (\S+:\d+)$"]
    if "--metrics-port" in extra:
        ready.append(r"metrics on (\S+:\d+)$")
    m = start_master("--client_live_ttl_sec", "600", *extra, ready=ready, timeout=timeout)
    m.metrics = m.matches[ready[1]].group(1) if len(ready) > 1 else None
    return m


@pytest.fixture
def master():
    m = Master()
    yield m
    m.stop()


def put(master, *ops, timeout=120):
    """Runs mlt-put with a sequence of operations; fails the test on error."""
    r = subprocess.run([PUT_BIN, master.addr, *ops], capture_output=True, text=True,
                       timeout=timeout, env=child_env())
    assert r.returncode == 0, f"mlt-put {' '.join(ops)}: {r.stderr}"
    return r.stdout


def inspect(master_or_addr, *args, timeout=120, env=None):
    addr = master_or_addr if isinstance(master_or_addr, str) else master_or_addr.addr
    return subprocess.run([INSPECT_BIN, "--master", addr, *args], capture_output=True,
                          text=True, timeout=timeout, env=env or child_env())


def inspect_json(master, *args):
    r = inspect(master, "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def mount_two(master):
    put(master, "mount", "node-1", "seg-1", str(64 * MIB), "127.0.0.1:7001",
        "mount", "node-2", "seg-2", str(32 * MIB), "127.0.0.1:7002")


def round64(n):
    return (n + 63) // 64 * 64


def Store(master_addr, size="64MiB", timeout=10.0):
    """A moonlet-store child process serving a TCP segment on loopback:
    .endpoint."""
    s = start_store(master_addr, size, timeout=timeout)
    s.endpoint = s.addr
    return s


def test_inspect_a_store_node_holding_real_data(master):
    """A master and a real store node: bytes written through the transport are
    what moonlet-inspect reports (segment, sizes, replicas, leases)."""
    store = Store(master.addr)
    try:
        put(master, "cput", "t", "obj/a", "100000", "1", "cput", "t", "obj/b", "5000", "1")
        segs = inspect_json(master, "segments")["segments"]
        assert len(segs) == 1
        seg = segs[0]
        assert seg["endpoint"] == store.endpoint
        assert seg["protocol"] == "tcp"
        assert seg["capacity"] == 64 * MIB
        assert seg["objects"] == 2
        assert seg["used"] == round64(100000) + round64(5000)

        keys = {k["key"]: k for k in inspect_json(master, "--tenant", "t", "keys")["keys"]}
        assert set(keys) == {"obj/a", "obj/b"}
        assert keys["obj/a"]["size"] == 100000 and keys["obj/b"]["size"] == 5000
        assert keys["obj/a"]["replica_count"] == 1 and keys["obj/a"]["readable_replicas"] == 1

        key = inspect_json(master, "--tenant", "t", "key", "obj/a")["keys"][0]
        assert key["replicas"][0]["endpoint"] == store.endpoint
        assert key["replicas"][0]["status"] == "COMPLETE"
        assert key["lease_remaining_ms"] == 0  # a put grants no lease

        put(master, "cget", "t", "obj/a")  # a real read through the transport
        after_get = inspect_json(master, "--tenant", "t", "key", "obj/a")["keys"][0]
        assert 0 < after_get["lease_remaining_ms"] <= 5000

        r = inspect(master, "--tenant", "t", "probe", "--mode", "none", "obj/a", "obj/b")
        assert r.returncode == 0, r.stderr
        after_probe = inspect_json(master, "--tenant", "t", "key", "obj/a", "obj/b")["keys"]
        assert after_probe[0]["lease_remaining_ms"] <= after_get["lease_remaining_ms"]
        assert after_probe[1]["lease_remaining_ms"] == 0  # probe NONE leased nothing

        st = inspect_json(master, "stats")
        assert st["objects"] == 2 and st["bytes"] == 105000 and st["segments"] == 1
    finally:
        store.stop()


# ---- segments ----------------------------------------------------------------


def test_segments_json_matches_what_was_mounted_and_put(master):
    mount_two(master)
    put(master, "put", "t", "a", "4096", "2", "put", "t", "b", "1000", "1")
    doc = inspect_json(master, "segments")
    segs = {s["segment_id"]: s for s in doc["segments"]}
    assert doc["count"] == 2 and set(segs) == {"seg-1", "seg-2"}
    assert segs["seg-1"]["client_id"] == "node-1"
    assert segs["seg-2"]["client_id"] == "node-2"
    assert segs["seg-1"]["endpoint"] == "127.0.0.1:7001"
    assert segs["seg-2"]["protocol"] == "tcp"
    assert segs["seg-1"]["capacity"] == 64 * MIB and segs["seg-2"]["capacity"] == 32 * MIB
    # "a" has a replica on each segment, "b" one replica somewhere
    assert sum(s["objects"] for s in segs.values()) == 3
    assert sum(s["used"] for s in segs.values()) == 2 * 4096 + round64(1000)
    assert doc["capacity"] == 96 * MIB and doc["used"] == 2 * 4096 + round64(1000)
    for s in segs.values():
        assert 0 <= s["last_ping_age_ms"] < 60000


def test_segments_table_fits_the_width_and_uses_units(master):
    mount_two(master)
    r = inspect(master, "segments", env=child_env(COLUMNS="120"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["SEGMENT", "NAME", "OWNER"]
    assert any(l.startswith("seg-1") and "64.0 MiB" in l and "127.0.0.1:7001" in l for l in lines)
    assert any(l.startswith("seg-2") and "32.0 MiB" in l for l in lines)
    assert lines[-1].startswith("2 segments, 96.0 MiB capacity")
    assert all(len(l) <= 120 for l in lines)
    # narrower terminals: USE%, PROTO and NAME are left out, then endpoints elided
    r = inspect(master, "segments", env=child_env(COLUMNS="80"))
    lines = r.stdout.splitlines()
    assert all(len(l) <= 80 for l in lines[:-1])
    r = inspect(master, "segments", env=child_env(COLUMNS="70"))
    lines = r.stdout.splitlines()
    assert all(len(l) <= 70 for l in lines[:-1])
    assert lines[0].split() == ["SEGMENT", "OWNER", "ENDPOINT", "CAPACITY", "USED", "OBJECTS",
                                "LAST", "PING"]  # USE%, PROTO and NAME left out
    assert any(l.startswith("seg-1 ") and "64.0 MiB" in l for l in lines)


# ---- keys --------------------------------------------------------------------


def test_keys_json_lists_sizes_replicas_and_readability(master):
    mount_two(master)
    put(master, "put", "t1", "a/1", "4096", "2", "put", "t1", "a/2", str(MIB), "1",
        "put", "t1", "b/1", "100", "1", "pending", "t1", "p/1", "64",
        "put", "other", "a/9", "10", "1")
    doc = inspect_json(master, "--tenant", "t1", "keys")
    keys = {k["key"]: k for k in doc["keys"]}
    assert doc["tenant"] == "t1" and doc["count"] == 4 and len(doc["keys"]) == 4
    assert doc["complete"] is True and doc["truncated"] is False
    assert set(keys) == {"a/1", "a/2", "b/1", "p/1"}
    assert keys["a/1"]["size"] == 4096 and keys["a/1"]["replica_count"] == 2
    assert keys["a/1"]["readable_replicas"] == 2
    assert keys["a/2"]["size"] == MIB and keys["a/2"]["replica_count"] == 1
    assert keys["p/1"]["complete"] is False and keys["p/1"]["readable_replicas"] == 0
    assert all(k["lease_remaining_ms"] == 0 for k in keys.values())

    doc = inspect_json(master, "--tenant", "t1", "keys", "--prefix", "a/")
    assert sorted(k["key"] for k in doc["keys"]) == ["a/1", "a/2"]

    doc = inspect_json(master, "--tenant", "t1", "keys", "--limit", "3")
    assert doc["count"] == 3 and len(doc["keys"]) == 3 and doc["truncated"] is True
    doc = inspect_json(master, "--tenant", "t1", "keys", "--limit", "4")
    assert doc["count"] == 4 and doc["truncated"] is False

    doc = inspect_json(master, "keys")  # the default tenant has none of them
    assert doc["tenant"] == "default" and doc["count"] == 0 and doc["keys"] == []


def test_keys_table_is_human_readable(master):
    mount_two(master)
    put(master, "put", "t1", "a/1", "4096", "2", "put", "t1", "a/2", str(3 * MIB // 2), "1",
        "get", "t1", "a/1")
    r = inspect(master, "--tenant", "t1", "keys")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["KEY", "SIZE", "REPLICAS", "READABLE", "LEASE"]
    row = {l.split()[0]: l for l in lines[1:-1]}
    assert re.search(r"4\.0 KiB\s+2\s+2\s+\d+ ms$", row["a/1"])
    assert re.search(r"1\.5 MiB\s+1\s+1\s+-$", row["a/2"])
    assert lines[-1] == "2 keys in tenant t1"


def test_keys_pages_a_million_keys_with_flat_master_memory():
    n = 1_000_000
    m = Master()
    try:
        put(m, "mount", "big-node", "big-seg", str(1 << 30), "127.0.0.1:9",
            "fill", "big", "k", str(n), "64", timeout=240)
        rss_before = m.rss_kib()
        with tempfile.TemporaryFile() as out:
            p = subprocess.Popen([INSPECT_BIN, "--master", m.addr, "--tenant", "big", "--json",
                                  "keys"], stdout=out, stderr=subprocess.PIPE, env=child_env())
            deadline = time.monotonic() + 240
            while True:  # bounded wait that keeps this child's own rusage
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
                if pid == p.pid:
                    break
                assert time.monotonic() < deadline, "moonlet-inspect keys did not finish"
                time.sleep(0.05)
            p.returncode = os.waitstatus_to_exitcode(status)
            err = p.stderr.read().decode()
            p.stderr.close()
            assert p.returncode == 0, err
            rss_after = m.rss_kib()
            out.seek(0)
            doc = json.load(out)
        names = [k["key"] for k in doc["keys"]]
        assert doc["count"] == n and len(names) == n and doc["complete"] is True
        assert len(set(names)) == n, "a key was listed twice"
        assert set(names) == {f"k{i:07d}" for i in range(n)}, "a key is missing"
        assert all(k["size"] == 64 and k["replica_count"] == 1 for k in doc["keys"][:1000])
        # the master answered a page at a time: its memory did not grow with the listing
        assert rss_after - rss_before < 4 * 1024, (rss_before, rss_after)
        # and the client streamed: it never held the 135 MB document
        assert usage.ru_maxrss < 64 * 1024, usage.ru_maxrss

        # a prefix inside the table: exactly its 10,000 keys, paged too
        doc = inspect_json(m, "--tenant", "big", "keys", "--prefix", "k000")
        assert doc["count"] == 10000
        assert {k["key"] for k in doc["keys"]} == {f"k{i:07d}" for i in range(10000)}
        doc = inspect_json(m, "--tenant", "big", "keys", "--limit", "2500")
        assert doc["count"] == 2500 and len({k["key"] for k in doc["keys"]}) == 2500
        assert doc["truncated"] is True
    finally:
        m.stop()


# ---- key ---------------------------------------------------------------------


def test_key_shows_replicas_and_the_lease_granted_by_get(master):
    mount_two(master)
    put(master, "put", "t", "a", "4096", "2", "put", "t", "b", "100", "1")
    doc = inspect_json(master, "--tenant", "t", "key", "a", "b")
    a, b = doc["keys"]
    assert doc["missing"] == 0 and a["found"] and b["found"]
    assert a["lease_remaining_ms"] == 0 and b["lease_remaining_ms"] == 0
    put(master, "get", "t", "a")
    doc = inspect_json(master, "--tenant", "t", "key", "a", "b")
    a, b = doc["keys"]
    assert 0 < a["lease_remaining_ms"] <= 5000
    assert b["lease_remaining_ms"] == 0
    assert a["size"] == 4096 and a["replica_count"] == 2 and a["complete"] is True
    reps = a["replicas"]
    assert sorted(r["segment_id"] for r in reps) == ["seg-1", "seg-2"]
    for r in reps:
        assert r["length"] == 4096 and r["status"] == "COMPLETE" and r["protocol"] == "tcp"
        assert r["endpoint"] == {"seg-1": "127.0.0.1:7001", "seg-2": "127.0.0.1:7002"}[r["segment_id"]]
        assert r["offset"] % 64 == 0
    assert a["soft_pin_remaining_ms"] == 0

    r = inspect(master, "--tenant", "t", "key", "a")
    assert r.returncode == 0, r.stderr
    assert re.search(r"lease \d+ ms remaining", r.stdout)
    assert re.search(r"seg-1\s+127\.0\.0\.1:7001\s+tcp\s+\d+\s+4\.0 KiB\s+COMPLETE", r.stdout)


def test_key_missing_exits_1_and_still_prints_the_others(master):
    mount_two(master)
    put(master, "put", "t", "a", "4096", "1")
    r = inspect(master, "--tenant", "t", "key", "missing", "a")
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0
    assert "missing" in r.stderr and "does not exist" in r.stderr
    assert r.stdout.startswith("key a\n")
    r = inspect(master, "--tenant", "t", "--json", "key", "a", "missing")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["missing"] == 1
    assert doc["keys"][0]["found"] is True
    assert doc["keys"][1] == {"key": "missing", "found": False, "error": "OBJECT_NOT_FOUND"}


# ---- probe -------------------------------------------------------------------


def test_tenants_lists_counts_and_bytes_in_name_order(master):
    mount_two(master)
    put(master, "put", "t1", "a/1", "4096", "2", "put", "t1", "a/2", str(MIB), "1",
        "pending", "t1", "p/1", "64", "put", "other", "a/9", "10", "1",
        "put", "demo", "x", "100", "1")
    doc = inspect_json(master, "tenants")
    assert [t["tenant"] for t in doc["tenants"]] == ["demo", "other", "t1"]
    by = {t["tenant"]: t for t in doc["tenants"]}
    # a put in progress counts; bytes are object sizes (one replica each)
    assert by["t1"]["keys"] == 3 and by["t1"]["bytes"] == 4096 + MIB + 64
    assert by["other"]["keys"] == 1 and by["other"]["bytes"] == 10
    assert doc["total"] == 3 and doc["truncated"] is False
    doc = inspect_json(master, "tenants", "--limit", "1")
    assert [t["tenant"] for t in doc["tenants"]] == ["demo"]
    assert doc["total"] == 3 and doc["truncated"] is True

    r = inspect(master, "tenants")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["TENANT", "KEYS", "BYTES"]
    assert re.match(r"t1\s+3\s+1\.0 MiB$", lines[3]), lines
    assert lines[-1] == "3 tenants hold keys: 5 keys, 1.0 MiB"


def test_tenants_on_an_empty_master(master):
    doc = inspect_json(master, "tenants")
    assert doc["tenants"] == [] and doc["total"] == 0
    r = inspect(master, "tenants")
    assert r.returncode == 0 and r.stdout.splitlines() == ["0 tenants hold keys"]
    r = inspect(master, "keys")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == ["0 keys in tenant default",
                                          "tenant default holds no keys, and no other tenant does"]


def test_keys_of_an_empty_tenant_names_the_tenants_that_hold_keys(master):
    """The quick start's objects sit in tenant demo: `keys` without --tenant
    says where they are instead of only "0 keys in tenant default"."""
    mount_two(master)
    put(master, "put", "demo", "kv/1", "4096", "1", "put", "demo", "kv/2", "4096", "1",
        "put", "other", "a", "10", "1")
    r = inspect(master, "keys")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == [
        "0 keys in tenant default",
        "tenant default holds no keys; 2 tenants do: demo (2 keys, 8.0 KiB), "
        "other (1 key, 10 B); use --tenant NAME"]
    doc = inspect_json(master, "keys")
    assert doc["count"] == 0 and doc["other_tenants_total"] == 2
    assert doc["other_tenants"] == [{"tenant": "demo", "keys": 2, "bytes": 8192},
                                    {"tenant": "other", "keys": 1, "bytes": 10}]
    # an unknown tenant gets the same hint, the tenants that hold keys
    r = inspect(master, "--tenant", "nosuch", "keys")
    assert "tenant nosuch holds no keys; 2 tenants do: demo" in r.stdout
    # a tenant that holds keys, none with the prefix: no hint (it is not empty)
    r = inspect(master, "--tenant", "demo", "keys", "--prefix", "zz/")
    assert r.stdout.splitlines()[-1] == "0 keys in tenant demo with prefix zz/"
    assert "holds no keys" not in r.stdout
    doc = inspect_json(master, "--tenant", "demo", "keys", "--prefix", "zz/")
    assert "other_tenants" not in doc
    # and a tenant with keys lists them, no hint
    r = inspect(master, "--tenant", "demo", "keys")
    assert r.stdout.splitlines()[-1] == "2 keys in tenant demo"


def put_k3(master, tenant):
    # checkpoint 256 lacks rank 0, 384 lacks rank 1
    put(master, *[x for k in (K3[0], K3[1], K3[3], K3[4]) for x in ("put", tenant, k, "64", "1")])


def leases(master, tenant, keys):
    doc = inspect_json(master, "--tenant", tenant, "key", *keys)
    return {k["key"]: k["lease_remaining_ms"] for k in doc["keys"]}


def stats(master):
    return inspect_json(master, "stats")


def test_probe_none_reports_existence_and_leases_nothing(master):
    mount_two(master)
    put_k3(master, "k3")
    doc = inspect_json(master, "--tenant", "k3", "probe", "--candidate-size", "2", *K3)
    assert doc["mode"] == "none" and doc["candidate_size"] == 2
    results = [k["result"] for c in doc["candidates"] for k in c["keys"]]
    assert results == [True, True, False, True, True, False]
    assert [c["complete"] for c in doc["candidates"]] == [True, False, False]
    assert doc["last_complete_candidate"] == 0 and doc["selected_candidate"] is None
    assert doc["leased_keys"] == 0
    assert set(leases(master, "k3", [K3[0], K3[1], K3[3], K3[4]]).values()) == {0}
    st = stats(master)
    assert st["leases_probe"] == 0 and st["probe_calls_none"] == 1

    r = inspect(master, "--tenant", "k3", "probe", "--candidate-size", "2", *K3)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()[1:-1]
    assert [row.startswith("*") for row in rows] == [True, True, False, False, False, False]
    assert "nothing leased" in r.stdout.splitlines()[-1]


def test_probe_last_hit_only_without_yes_sends_nothing(master):
    mount_two(master)
    put_k3(master, "k3")
    r = inspect(master, "--tenant", "k3", "probe", "--mode", "last-hit-only",
                "--candidate-size", "2", *K3)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "--yes" in r.stderr
    st = stats(master)
    assert st["probe_calls_last_hit_only"] == 0 and st["leases_probe"] == 0
    assert set(leases(master, "k3", [K3[0], K3[1], K3[3], K3[4]]).values()) == {0}


def test_probe_last_hit_only_with_yes_leases_exactly_the_selected_candidate(master):
    mount_two(master)
    # candidates of 3: c0 complete, c1 incomplete, c2 complete, c3 incomplete -> c2 selected
    keys = [f"ck/{c}/r{r}" for c in range(4) for r in range(3)]
    present = [k for k in keys if k not in ("ck/1/r1", "ck/3/r0")]
    put(master, *[x for k in present for x in ("put", "lh", k, "128", "1")])
    doc = inspect_json(master, "--tenant", "lh", "probe", "--mode", "last-hit-only", "--yes",
                       "--candidate-size", "3", *keys)
    assert doc["mode"] == "last-hit-only" and doc["selected_candidate"] == 2
    assert [c["selected"] for c in doc["candidates"]] == [False, False, True, False]
    assert [k["result"] for k in doc["candidates"][2]["keys"]] == [True] * 3
    assert doc["leased_keys"] == 3
    got = leases(master, "lh", present)
    leased = {k for k, ms in got.items() if ms > 0}
    assert leased == {"ck/2/r0", "ck/2/r1", "ck/2/r2"}
    assert all(0 < got[k] <= 5000 for k in leased)
    st = stats(master)
    assert st["leases_probe"] == 3 and st["probe_calls_last_hit_only"] == 1
    assert st["leases_get"] == 0 and st["leases_exist"] == 0

    r = inspect(master, "--tenant", "lh", "probe", "--mode", "last-hit-only", "--yes",
                "--candidate-size", "3", *keys)
    assert r.returncode == 0, r.stderr
    marked = [l.split()[-2] for l in r.stdout.splitlines()[1:-1] if l.startswith("*")]
    assert marked == ["ck/2/r0", "ck/2/r1", "ck/2/r2"]
    assert "candidate 2 selected, 3 keys leased" in r.stdout


def test_probe_rejects_keys_that_do_not_form_candidates(master):
    r = inspect(master, "probe", "--candidate-size", "4", "a", "b", "c")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


# ---- stats -------------------------------------------------------------------


def test_stats_counts_objects_bytes_and_leases_by_operation(master):
    mount_two(master)
    put(master, "put", "s", "x", "1000", "2", "put", "s", "y", "3000", "1",
        "pending", "s", "z", "10", "get", "s", "x", "exist", "s", "y", "exist", "s", "nope")
    st = stats(master)
    assert st["objects"] == 3 and st["bytes"] == 4010
    assert st["segments"] == 2 and st["clients"] == 2 and st["capacity"] == 96 * MIB
    assert st["used"] == 2 * round64(1000) + round64(3000) + round64(10)
    assert st["put_starts"] == 3 and st["put_ends"] == 2
    assert st["leases_get"] == 1 and st["leases_exist"] == 1 and st["leases_probe"] == 0
    assert st["evictions"] == 0
    assert st["resume_calls"] == 0 and st["leases_resume_kda"] == 0 and st["leases_resume_kv"] == 0
    hist = st["probe_lock_hold_us_hist"]
    assert [b["lt_us"] for b in hist] == [1 << i for i in range(11)] + [None]
    assert sum(b["count"] for b in hist) == 0

    r = inspect(master, "stats")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^objects\s+3 \(3\.9 KiB in objects\)$", r.stdout, re.M)
    assert re.search(r"^ProbeResume\s+0 calls, 0 validated, 0 fallbacks$", r.stdout, re.M)
    assert re.search(r"^ProbeResume leases\s+0 KDA \+ 0 KV keys$", r.stdout, re.M)
    assert re.search(r"^leases granted\s+GetReplicaList 1, ExistKey 1, BatchProbeKey 0$",
                     r.stdout, re.M)
    assert "  >=1024 us" in r.stdout and "     <1 us" in r.stdout
    assert st["hard_pinned"] == 0 and st["hard_pinned_bytes"] == 0


def test_stats_and_key_show_hard_pins(master):
    mount_two(master)
    put(master, "hput", "h", "pinned", "1024", "2", "put", "h", "plain", "10", "1")
    st = stats(master)
    assert st["hard_pinned"] == 1 and st["hard_pinned_bytes"] == 2048
    r = inspect(master, "stats")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^hard pins\s+1 objects, 2\.0 KiB with replicas \(never evicted\)$",
                     r.stdout, re.M), r.stdout
    doc = inspect_json(master, "--tenant", "h", "key", "pinned", "plain")
    a, b = doc["keys"]
    assert a["hard_pinned"] is True and b["hard_pinned"] is False
    r = inspect(master, "--tenant", "h", "key", "pinned")
    assert r.returncode == 0 and "hard-pinned (never evicted)" in r.stdout, r.stdout


def test_hard_pin_max_ratio_flag():
    m = Master("--hard_pin_max_ratio", "0")
    try:
        mount_two(m)
        r = subprocess.run([PUT_BIN, m.addr, "hput", "h", "k", "10", "1"], capture_output=True,
                           text=True, timeout=60, env=child_env())
        assert r.returncode == 1 and "-200" in r.stderr + r.stdout, r.stderr
        put(m, "put", "h", "k", "10", "1")  # an ordinary put still fits
    finally:
        m.stop()


# ---- errors and help -----------------------------------------------------------


def test_unknown_command_is_a_usage_error(master):
    r = inspect(master, "frobnicate")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "moonlet-inspect: unknown command 'frobnicate' (try --help)\n"
    r = inspect(master, "keys", "--mode", "none")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    r = inspect(master, "keys", "--limit", "zero")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_connection_refused_is_one_line_and_exit_1():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for cmd in (["stats"], ["segments"], ["keys"], ["key", "a"], ["watch", "--count", "1", "stats"]):
        r = inspect(f"127.0.0.1:{port}", *cmd, timeout=30)
        assert r.returncode == 1, cmd
        assert r.stdout == ""
        assert r.stderr.count("\n") == 1 and "cannot connect" in r.stderr, r.stderr


def test_help_on_every_command():
    for cmd in ("segments", "keys", "tenants", "key", "probe", "stats", "watch"):
        r = subprocess.run([INSPECT_BIN, cmd, "--help"], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0 and r.stdout.startswith("usage: moonlet-inspect"), cmd
        assert cmd in r.stdout.splitlines()[0]
    r = subprocess.run([INSPECT_BIN, "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "commands:" in r.stdout


def test_auth_token(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    m = Master("--auth-token-file", str(token), "--rpc-address", "127.0.0.1")
    try:
        r = inspect(m, "stats")
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "refused" in r.stderr
        r = inspect(m, "--auth-token-file", str(tmp_path / "absent"), "stats")
        assert r.returncode == 2 and r.stderr.count("\n") == 1
        assert r.stderr.startswith("moonlet-inspect: --auth-token-file ")
        empty = tmp_path / "empty"
        empty.write_text("\n")
        r = inspect(m, "--auth-token-file", str(empty), "stats")
        assert r.returncode == 2 and r.stderr.count("\n") == 1
        assert r.stderr.startswith("moonlet-inspect: --auth-token-file ")
        r = inspect(m, "--auth-token-file", str(token), "--json", "stats")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["segments"] == 0
    finally:
        m.stop()


# ---- watch -------------------------------------------------------------------


def read_until_exit(proc, fd, timeout):
    """Reads a pty master until the child exits and the pty drains."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed the slave side
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out


def test_watch_redraws_in_place_on_a_terminal(master):
    mount_two(master)
    mfd, sfd = pty.openpty()
    fcntl.ioctl(sfd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    p = subprocess.Popen([INSPECT_BIN, "--master", master.addr, "watch", "--interval", "0.2",
                          "--count", "2", "segments"], stdin=subprocess.DEVNULL, stdout=sfd,
                         stderr=subprocess.PIPE, env=child_env())
    os.close(sfd)
    try:
        out = read_until_exit(p, mfd, 30).decode(errors="replace")
        assert p.wait(timeout=10) == 0, p.stderr.read()
    finally:
        os.close(mfd)
        p.stderr.close()
    assert out.count("\x1b[H\x1b[2J") == 2
    assert "refresh 1 " in out and "refresh 2 " in out
    frames = out.split("\x1b[H\x1b[2J")[1:]
    for f in frames:
        lines = f.replace("\r\n", "\n").splitlines()
        assert any(l.startswith("seg-1") for l in lines)
        assert all(len(l) <= 100 for l in lines)  # laid out for the pty's 100 columns


def test_watch_prints_plain_blocks_when_piped(master):
    mount_two(master)
    r = inspect(master, "watch", "--interval", "0.2", "--count", "2", "stats")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    headers = [l for l in r.stdout.splitlines() if l.startswith("--- stats every 0.2s")]
    assert len(headers) == 2
    assert r.stdout.count("\nleases granted ") + r.stdout.startswith("leases granted") == 2


def test_watch_ends_cleanly_on_sigint(master):
    p = subprocess.Popen([INSPECT_BIN, "--master", master.addr, "watch", "--interval", "0.2",
                          "segments"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=child_env())
    try:
        fd = p.stdout.fileno()
        r, _, _ = select.select([fd], [], [], 10)
        assert r and os.read(fd, 4096).startswith(b"--- segments")
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
        p.stdout.close()
        p.stderr.close()


# ---- /metrics ----------------------------------------------------------------


def scrape(addr, path="/metrics"):
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as resp:
        return resp.status, resp.headers.get("Content-Type"), resp.read().decode()


def parse_prometheus(text):
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples, types


def test_metrics_endpoint_matches_stats():
    m = Master("--metrics-port", "0")
    try:
        assert m.metrics.split(":")[0] == m.addr.split(":")[0]
        mount_two(m)
        put_k3(m, "k3")
        put(m, "get", "k3", K3[0], "exist", "k3", K3[3])
        assert inspect(m, "--tenant", "k3", "probe", "--mode", "last-hit-only", "--yes",
                       "--candidate-size", "2", *K3).returncode == 0
        assert inspect(m, "--tenant", "k3", "probe", *K3).returncode == 0
        st = stats(m)
        status, ctype, text = scrape(m.metrics)
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        s, types = parse_prometheus(text)
        for metric, field in [("moonlet_objects", "objects"), ("moonlet_bytes", "bytes"),
                              ("moonlet_segments", "segments"),
                              ("moonlet_capacity_bytes", "capacity"),
                              ("moonlet_used_bytes", "used"),
                              ('moonlet_leases_granted_total{op="get"}', "leases_get"),
                              ('moonlet_leases_granted_total{op="exist"}', "leases_exist"),
                              ('moonlet_leases_granted_total{op="probe"}', "leases_probe"),
                              ('moonlet_probe_calls_total{mode="none"}', "probe_calls_none"),
                              ('moonlet_probe_calls_total{mode="last_hit_only"}',
                               "probe_calls_last_hit_only"),
                              ("moonlet_evictions_total", "evictions"),
                              ("moonlet_probe_recheck_fallbacks_total",
                               "probe_recheck_fallbacks")]:
            assert s[metric] == st[field], metric
        assert st["objects"] == 4 and st["leases_get"] == 1 and st["leases_exist"] == 1
        assert st["leases_probe"] == 2 and st["probe_calls_last_hit_only"] == 1
        assert types["moonlet_objects"] == "gauge"
        assert types["moonlet_leases_granted_total"] == "counter"
        assert types["moonlet_probe_lock_hold_seconds"] == "histogram"
        # histogram: cumulative buckets at 1us, 2us, ... 1024us, +Inf
        counts = [b["count"] for b in st["probe_lock_hold_us_hist"]]
        cum = 0
        for i in range(11):
            cum += counts[i]
            le = next(k for k in s if k.startswith("moonlet_probe_lock_hold_seconds_bucket")
                      and abs(float(re.search(r'le="([^"]+)"', k).group(1).replace("+Inf", "inf"))
                              - (1 << i) * 1e-6) < 1e-12)
            assert s[le] == cum, le
        total = sum(counts)
        assert total >= 1  # the last-hit-only probe validated a candidate
        assert s['moonlet_probe_lock_hold_seconds_bucket{le="+Inf"}'] == total
        assert s["moonlet_probe_lock_hold_seconds_count"] == total

        with pytest.raises(urllib.error.HTTPError) as e:
            scrape(m.metrics, "/other")
        assert e.value.code == 404
    finally:
        m.stop()


def listening_ports(pid):
    """TCP ports on which process `pid` has a listening socket."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for row in f:
                cols = row.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def test_metrics_off_by_default_and_on_with_the_flag(master):
    assert master.metrics is None
    assert listening_ports(master.proc.pid) == {int(master.addr.rsplit(":", 1)[1])}
    m = Master("--metrics-port", "0")
    try:
        assert listening_ports(m.proc.pid) == {int(m.addr.rsplit(":", 1)[1]),
                                               int(m.metrics.rsplit(":", 1)[1])}
    finally:
        m.stop()
