"""BatchProbeKey and GrantLeasePolicy through the Python binding.

Every test runs twice (the `path` fixture): through a Store connected to the
master directly, and through a DummyClient of a RealClient process.  Leases
are read back with Store.inspect(), which never grants one; a lease still
running reads lease_remaining_ms > 0, none reads 0.
"""
import time

import pytest

import moonlet
from conftest import K3

LAST = moonlet.ProbeLeaseMode.LAST_HIT_ONLY
NONE = moonlet.ProbeLeaseMode.NONE


def lease_ms(store, key, tenant_id=None):
    return store.inspect(key, tenant_id=tenant_id)["lease_remaining_ms"]


def put_all(store, keys, tenant_id=None):
    for k in keys:
        store.put(k, b"v:" + k.encode(), tenant_id=tenant_id)


def test_worked_example(store):
    put_all(store, [K3[0], K3[1], K3[3], K3[4]])  # 256 lacks r0, 384 lacks r1
    assert store.batch_probe_key(K3) == [True, True, False, True, True, False]
    assert [lease_ms(store, k) for k in (K3[0], K3[1], K3[3], K3[4])] == [0, 0, 0, 0]

    policy = moonlet.GrantLeasePolicy(lease_mode=LAST, candidate_size=2)
    assert store.batch_probe_key(K3, policy=policy) == [True, True, False, False, False, False]
    leased = {k: lease_ms(store, k) for k in (K3[0], K3[1], K3[3], K3[4])}
    assert leased[K3[0]] > 1000 and leased[K3[1]] > 1000
    assert leased[K3[3]] == 0 and leased[K3[4]] == 0  # exist, not selected: not leased


def test_none_leaves_lease_deadlines_unchanged(store):
    put_all(store, ["a", "b", "c"])
    assert store.is_exist("a") is True  # leases a (Mooncake semantics)
    before = lease_ms(store, "a")
    assert before > 1000
    time.sleep(0.3)
    assert store.batch_probe_key(["a", "b", "c", "zz"]) == [True, True, True, False]
    assert store.batch_probe_key(["a", "b"], moonlet.GrantLeasePolicy(NONE, 7)) == [True, True]
    assert store.probe_key("a") is True and store.probe_key("b") is True
    after = lease_ms(store, "a")
    # the deadline did not move: the time slept has come off it
    assert after <= before - 250, (before, after)
    assert lease_ms(store, "b") == 0 and lease_ms(store, "c") == 0


def test_selected_only_mask_when_several_candidates_complete(store):
    cands = [[f"c{i}/r{r}" for r in range(3)] for i in range(4)]
    keys = [k for c in cands for k in c]
    put_all(store, cands[0] + cands[1] + cands[2][:2] + cands[3])  # 2 lacks its last rank
    policy = moonlet.GrantLeasePolicy(LAST, 3)
    assert store.batch_probe_key(keys, policy) == [False] * 9 + [True] * 3
    assert all(lease_ms(store, k) > 1000 for k in cands[3])
    assert all(lease_ms(store, k) == 0 for k in cands[0] + cands[1] + cands[2][:2])

    # the last candidate incomplete: the complete one before it is selected
    store.put(cands[2][2], b"x")  # candidate 2 complete now
    more = [f"c4/r{r}" for r in range(3)]
    put_all(store, more[:1])
    assert store.batch_probe_key(keys[:9] + more, policy) == [False] * 6 + [True] * 3 + [False] * 3
    assert all(lease_ms(store, k) > 1000 for k in cands[2])
    assert all(lease_ms(store, k) == 0 for k in cands[0] + cands[1] + more[:1])


def test_all_false_when_no_candidate_is_complete(store):
    keys = [f"p{i}/r{r}" for i in range(4) for r in range(2)]
    present = [k for i, k in enumerate(keys) if i % 2 == (i // 2) % 2]  # one rank of each
    put_all(store, present)
    assert store.batch_probe_key(keys, moonlet.GrantLeasePolicy(LAST, 2)) == [False] * 8
    assert all(lease_ms(store, k) == 0 for k in present)
    assert store.batch_probe_key(["none/1", "none/2"], moonlet.GrantLeasePolicy(LAST, 1)) == \
        [False, False]


@pytest.mark.parametrize("mode,size,n", [
    (LAST, 0, 6),     # zero candidate size
    (LAST, 4, 6),     # does not divide the number of keys
    (7, 2, 6),        # unknown mode
    (255, 1, 2),      # unknown mode, the largest the wire type carries
])
def test_invalid_policy_is_the_masters_error(store, mode, size, n):
    put_all(store, K3)
    policy = moonlet.GrantLeasePolicy(lease_mode=mode, candidate_size=size)
    with pytest.raises(moonlet.StoreError) as ei:
        store.batch_probe_key(K3[:n], policy=policy)
    assert ei.value.code == -600 and ei.value.name == "INVALID_PARAMS"
    assert ei.value.results is None
    assert all(lease_ms(store, k) == 0 for k in K3)  # nothing leased


def test_policy_types_are_checked_before_the_call(store):
    with pytest.raises(TypeError):
        moonlet.GrantLeasePolicy(lease_mode="1", candidate_size=2)
    with pytest.raises(TypeError):
        moonlet.GrantLeasePolicy(lease_mode=LAST, candidate_size=2.0)
    with pytest.raises(TypeError):
        moonlet.GrantLeasePolicy(lease_mode=True)
    with pytest.raises(ValueError):
        moonlet.GrantLeasePolicy(lease_mode=256)  # the wire type is 8 bits
    with pytest.raises(ValueError):
        moonlet.GrantLeasePolicy(LAST, -1)
    with pytest.raises(TypeError):
        store.batch_probe_key(K3, policy=(1, 2))
    p = moonlet.GrantLeasePolicy(9, 2)
    assert p.lease_mode == 9 and not isinstance(p.lease_mode, moonlet.ProbeLeaseMode)
    assert moonlet.GrantLeasePolicy(1, 2).lease_mode is LAST
    assert repr(moonlet.GrantLeasePolicy(LAST, 4)) == \
        "GrantLeasePolicy(lease_mode=ProbeLeaseMode.LAST_HIT_ONLY, candidate_size=4)"
    assert moonlet.GrantLeasePolicy() == moonlet.GrantLeasePolicy(NONE, 1)
    assert int(LAST) == 1 and int(NONE) == 0 and issubclass(moonlet.ProbeLeaseMode, int)


def test_duplicate_keys(store):
    put_all(store, ["a", "b"])
    policy = moonlet.GrantLeasePolicy(LAST, 2)
    # inside one candidate, and the same candidate twice
    assert store.batch_probe_key(["a", "a", "a", "b"], policy) == [False, False, True, True]
    assert lease_ms(store, "a") > 1000 and lease_ms(store, "b") > 1000
    # across candidates: the later one lacks "c", so the earlier is selected
    store.put("d", b"d")
    assert store.batch_probe_key(["d", "d", "d", "c"], policy) == [True, True, False, False]
    assert lease_ms(store, "d") > 1000
    assert store.batch_probe_key(["a", "a"]) == [True, True]


def test_empty_lists(store):
    assert store.batch_probe_key([]) == []
    assert store.batch_probe_key([], moonlet.GrantLeasePolicy(LAST, 2)) == []
    assert store.batch_probe_key((), moonlet.GrantLeasePolicy(LAST, 0)) == []
    assert store.batch_is_exist([]) == []
    with pytest.raises(moonlet.StoreError) as ei:
        store.batch_probe_key([], moonlet.GrantLeasePolicy(9, 1))  # unknown mode: always invalid
    assert ei.value.code == -600


def test_tenant_isolation(store, tenant):
    other = tenant + "-b"
    put_all(store, K3)                              # every checkpoint complete in ours
    put_all(store, K3[:2], tenant_id=other)         # only 128 complete in the other
    policy = moonlet.GrantLeasePolicy(LAST, 2)
    assert store.batch_probe_key(K3, policy, tenant_id=other) == \
        [True, True, False, False, False, False]
    assert lease_ms(store, K3[0]) == 0              # ours untouched by the other's probe
    assert lease_ms(store, K3[0], tenant_id=other) > 1000
    assert store.batch_probe_key(K3, policy) == [False] * 4 + [True, True]
    assert store.batch_probe_key(K3, tenant_id=tenant + "-empty") == [False] * 6
    assert store.batch_is_exist(K3[:3], tenant_id=other) == [True, True, False]


def test_a_per_key_error_raises_and_never_reads_false(store):
    put_all(store, ["ok"])
    long_key = "k" * 4097

    def check(call):
        with pytest.raises(moonlet.StoreError) as ei:
            call()
        assert ei.value.code == -400 and ei.value.name == "INVALID_KEY"
        assert ei.value.results[1] == -400 and ei.value.results[0] in (0, 1)
        assert "key 1" in str(ei.value)

    check(lambda: store.batch_probe_key(["ok", ""]))
    check(lambda: store.batch_probe_key(["ok", long_key], moonlet.GrantLeasePolicy(LAST, 1)))
    assert lease_ms(store, "ok") == 0  # the failed LAST_HIT_ONLY request leased nothing
    check(lambda: store.batch_is_exist(["ok", ""]))
    with pytest.raises(moonlet.StoreError) as ei:
        store.probe_key("")
    assert ei.value.code == -400


def test_probe_never_leases_exist_leases_every_hit(store):
    put_all(store, ["x", "y"])
    assert store.probe_key("x") is True and store.probe_key("nope") is False
    assert lease_ms(store, "x") == 0
    assert store.batch_is_exist(["x", "y", "nope"]) == [True, True, False]
    assert lease_ms(store, "x") > 1000 and lease_ms(store, "y") > 1000
