"""python/moonlet/k3.py against the real binding (moonlet.Store), on the
session's loopback cluster (conftest.py), through a direct Store and through
a DummyClient: the duck-typed calls k3.lookup makes (probe_resume;
batch_is_exist, batch_probe_key with a policy, tenant_id) must be the ones
the binding takes.  Leases are read back with Store.inspect(), which grants
none.  Also Store.probe_resume itself: its answer, its leases, its errors.
"""
import pytest

import moonlet
from conftest import k3_short_key
from moonlet import k3

LAYOUT = k3.Layout(block_tokens=128, ranks=2)
CKPTS = [128, 256, 384]


key = k3_short_key


def put_worked_example(store, tenant):
    # KV for 4 blocks; 128 complete, 256 lacks rank 0, 384 lacks rank 1.
    for k in ["kv/0", "kv/1", "kv/2", "kv/3", "kda/128/r0", "kda/128/r1", "kda/256/r1",
              "kda/384/r0"]:
        store.put(k, b"v", tenant_id=tenant)


def lease_ms(store, k, tenant):
    return store.inspect(k, tenant_id=tenant)["lease_remaining_ms"]


def assert_leases(store, tenant, leased, not_leased):
    """Each key of `leased` has lease time left, each of `not_leased` none."""
    got = {k: lease_ms(store, k, tenant) for k in leased + not_leased}
    assert all(got[k] > 0 for k in leased) and all(got[k] == 0 for k in not_leased), got


def test_worked_example_through_the_binding(store, direct, tenant):
    put_worked_example(direct, tenant)
    r = k3.lookup(store, LAYOUT, key, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS,
                  tenant_id=tenant, two_calls=True)
    assert r.resume_position == 128 and r.calls == 2
    assert r.keys == ["kv/0", "kda/128/r0", "kda/128/r1"]
    assert_leases(direct, tenant, ["kda/128/r0", "kda/128/r1"], ["kda/256/r1", "kda/384/r0"])


def test_binding_policy_type_and_lease_all(store, direct, tenant):
    put_worked_example(direct, tenant)
    r = k3.lookup(store, LAYOUT, key, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS,
                  tenant_id=tenant, make_policy=moonlet.GrantLeasePolicy)
    assert r.resume_position == 128 and r.kda_leased == 2
    r = k3.lookup(store, LAYOUT, key, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS,
                  tenant_id=tenant, lease_all=True)
    assert r.resume_position == 128 and r.kda_leased == 4 and r.calls == 1
    assert lease_ms(direct, "kda/256/r1", tenant) > 0  # every hit leased


def test_one_call_worked_example(store, direct, tenant):
    put_worked_example(direct, tenant)
    r = k3.lookup(store, LAYOUT, key, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS,
                  tenant_id=tenant)
    assert r.resume_position == 128 and r.calls == 1
    assert r.keys == ["kv/0", "kda/128/r0", "kda/128/r1"]
    assert (r.kv_prefix_blocks, r.candidates, r.kda_leased, r.kv_leased) == (4, 3, 2, 1)
    # exactly what is loaded gained a lease: kv/0 and checkpoint 128
    assert_leases(direct, tenant, ["kv/0", "kda/128/r0", "kda/128/r1"],
                  ["kv/1", "kv/2", "kv/3", "kda/256/r1", "kda/384/r0"])


def test_probe_resume(store, direct, tenant):
    put_worked_example(direct, tenant)
    kv = ["kv/0", "kv/1", "kv/2", "kv/3"]
    kda = ["kda/128/r0", "kda/128/r1", "kda/256/r0", "kda/256/r1", "kda/384/r0", "kda/384/r1"]
    assert store.probe_resume(kv, kda, 2, [1, 2, 3], tenant_id=tenant) == (
        4, 0, [True, True, False, False, False, False])
    # the KV prefix bounds the candidates: 2 blocks admit no checkpoint needing 3
    assert store.probe_resume(kv[:2], kda[:4], 2, [1, 2], tenant_id=tenant) == (
        2, 0, [True, True, False, False])
    # nothing complete: None, and nothing leased
    assert store.probe_resume(kv, kda[2:], 2, [2, 3], tenant_id=tenant) == (
        4, None, [False] * 4)
    assert lease_ms(direct, "kv/2", tenant) == 0
    assert store.probe_resume([], [], 0, [], tenant_id=tenant) == (0, None, [])
    with pytest.raises(moonlet.StoreError) as e:
        store.probe_resume(kv, kda, 2, [1, 2, 5], tenant_id=tenant)  # boundary > 4 KV keys
    assert e.value.code == -600
    with pytest.raises(moonlet.StoreError) as e:
        store.probe_resume(["kv/0", ""], kda, 2, [1, 2, 2], tenant_id=tenant)
    assert e.value.code == -400
    with pytest.raises(ValueError):
        store.probe_resume(kv, kda, 2, [1, 2], tenant_id=tenant)  # 2 boundaries, 3 candidates
    with pytest.raises(ValueError):
        store.probe_resume(kv, kda, 0, [], tenant_id=tenant)
    with pytest.raises(TypeError):
        store.probe_resume(kv, kda, 2, [1, "2", 3], tenant_id=tenant)
    with pytest.raises(OverflowError):
        store.probe_resume(kv, kda, 2, [1, -2, 3], tenant_id=tenant)
