"""Re-replication and drain on a real cluster in network namespaces
(netcluster.py; the same master and store settings as test_cluster.py: a 2 s
liveness TTL, stores pinging every 200 ms, the master's default repair
limits, --repair-bandwidth 256 MiB/s and --repair-concurrency 16).

  cluster_rereplicate  SIGKILL a store host holding replicas of 500 two-replica
                       objects under load: within TTL + repair time every one
                       has two readable replicas on distinct hosts again; then
                       SIGKILL a second host: none lost, no wrong byte
  cluster_drain        drain a store under load (moonlet-inspect drain), stop it
                       once its segment is empty: none lost, no wrong byte

Each test prints one "RESULT <scenario> {...}" line with what it measured.
Needs root; skips (meson: SKIP) where network namespaces cannot be made.
"""
import collections
import signal
import time

import netcluster as nc
from test_cluster import (FAULT_CODES, TTL_S, assert_clean_load, keys_of,  # noqa: F401
                          make_cluster, privileged, result)

SIZES = ["--min-size", "1KiB", "--max-size", "64KiB"]
REPAIR_BOUND_S = 30  # TTL + repair of a few hundred small objects, with margin


def replica_state(cl, keys):
    """{key: (readable replicas, [store index of each COMPLETE replica])} of the
    keys that exist."""
    out = {}
    for k in range(0, len(keys), 500):
        d = cl.inspect("key", *keys[k:k + 500], timeout=60, check=False)
        for e in (d or {}).get("keys", []):
            if e.get("found"):
                stores = [cl.store_of_endpoint(r["endpoint"]) for r in e["replicas"]
                          if r["status"] == "COMPLETE"]
                out[e["key"]] = (e["readable_replicas"], stores)
    return out


def fully_replicated(cl, keys, dead):
    """Every key has two readable replicas, on two distinct live store hosts."""
    st = replica_state(cl, keys)
    if len(st) != len(keys):
        return False
    return all(n == 2 and len(set(s)) == 2 and not (set(s) & dead) and None not in s
               for n, s in st.values())


def mixed_load(cl, prefix, seconds):
    load = ["mixed", "--seconds", seconds, "--replicas", 2, "--rate", 150, "--threads", 2,
            "--live-max", 200, *SIZES, "--seed", "404"]
    return [cl.mlc_bg(c, *load, "--prefix", f"{prefix}/m{c}/", "--peer-prefix",
                      f"{prefix}/m{1 - c}/") for c in (0, 1)]


def test_rereplicate(make_cluster):
    cl = make_cluster(stores=4)
    r = cl.mlc(0, "put", "--prefix", "rr/", "--count", 500, "--replicas", 2, *SIZES,
               "--seed", "303")
    assert r["ok"] == 500, r
    keys = keys_of("rr/", 500)
    place = cl.replicas(keys)
    per_store = collections.Counter(s for reps in place.values() for s in reps)
    victim = per_store.most_common(1)[0][0]
    held = [k for k in keys if victim in place[k]]
    assert len(held) > 100, per_store

    bg = mixed_load(cl, "rr", 14)
    time.sleep(2)
    t_kill = time.monotonic()
    cl.kill_store(victim, signal.SIGKILL)
    assert nc.wait_for(lambda: cl.segment_of_store(victim) is None, TTL_S + 3, 0.1)
    drop_s = time.monotonic() - t_kill
    assert nc.wait_for(lambda: fully_replicated(cl, keys, {victim}), REPAIR_BOUND_S, 0.25), \
        {k: v for k, v in replica_state(cl, keys).items() if v[0] != 2}
    repaired_s = time.monotonic() - t_kill
    stats = cl.inspect("stats")
    assert stats["repairs_done"] >= len(held), stats
    assert stats["under_replicated"] == 0, stats
    for c, rep in enumerate(p.json(60) for p in bg):
        assert_clean_load(rep, FAULT_CODES, f"client{c}")

    # A second host dies: every object still has a replica; none lost, no wrong byte.
    after = replica_state(cl, keys)
    second = collections.Counter(s for _, reps in after.values() for s in reps).most_common(1)[0][0]
    cl.kill_store(second, signal.SIGKILL)
    assert nc.wait_for(lambda: cl.segment_of_store(second) is None, TTL_S + 3, 0.1)
    g = cl.mlc(1, "get", "--prefix", "rr/", "--count", 500, "--verify", *SIZES, "--seed", "303")
    assert g["ok"] == 500 and g["wrong_bytes"] == 0 and g["errors"] == {}, g
    result("rereplicate", objects=len(held), drop_s=round(drop_s, 2),
           repair_s=round(repaired_s - drop_s, 2), total_s=round(repaired_s, 2),
           objects_per_s=round(stats["repairs_done"] / max(repaired_s - drop_s, 0.01), 1),
           bytes_per_s=round(stats["repair_bytes"] / max(repaired_s - drop_s, 0.01)),
           repair_bytes=stats["repair_bytes"], repairs_done=stats["repairs_done"],
           repairs_retried=stats["repairs_retried"], second_kill_lost=500 - g["ok"])


def test_drain(make_cluster):
    cl = make_cluster()
    r = cl.mlc(0, "put", "--prefix", "dr/", "--count", 300, "--replicas", 2, *SIZES,
               "--seed", "505")
    assert r["ok"] == 300, r
    keys = keys_of("dr/", 300)
    victim = 1
    on_victim = [k for k, reps in cl.replicas(keys).items() if victim in reps]
    assert on_victim

    bg = mixed_load(cl, "dr", 10)
    time.sleep(1)
    t0 = time.monotonic()
    d = cl.inspect("drain", "store-1")
    assert d["changed_segments"] == 1 and d["draining"], d

    def drained():
        s = cl.segment_of_store(victim)
        return s is not None and s["draining"] and s["objects"] == 0
    assert nc.wait_for(drained, 30, 0.25), cl.segment_of_store(victim)
    drain_s = time.monotonic() - t0
    # new puts avoid the draining node
    p = cl.mlc(0, "put", "--prefix", "dr/new/", "--count", 50, "--replicas", 2, *SIZES)
    assert p["ok"] == 50, p
    assert all(victim not in reps for reps in cl.replicas(keys_of("dr/new/", 50)).values())
    for c, rep in enumerate(q.json(60) for q in bg):
        assert_clean_load(rep, FAULT_CODES, f"client{c}")
    assert cl.kill_store(victim, signal.SIGTERM) == 0
    assert nc.wait_for(lambda: cl.segment_of_store(victim) is None, 5, 0.1)
    g = cl.mlc(1, "get", "--prefix", "dr/", "--count", 300, "--verify", *SIZES, "--seed", "505")
    assert g["ok"] == 300 and g["wrong_bytes"] == 0 and g["errors"] == {}, g
    assert fully_replicated(cl, keys, {victim})
    result("drain", objects_moved=len(on_victim), drain_s=round(drain_s, 2), lost=300 - g["ok"])
