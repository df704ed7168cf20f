"""python/moonlet/k3.py against the real binding (moonlet.Store), on the
session's loopback cluster (conftest.py), through a direct Store and through
a DummyClient: the duck-typed calls k3.lookup makes (batch_is_exist,
batch_probe_key with a policy, tenant_id) must be the ones the binding
takes.  Leases are read back with Store.inspect(), which grants none.
"""
import moonlet
from moonlet import k3

LAYOUT = k3.Layout(block_tokens=128, ranks=2)
CKPTS = [128, 256, 384]


def key(kid):
    if isinstance(kid, k3.KVKey):
        return f"kv/{kid.block}"
    return f"kda/{kid.position}/r{kid.rank}"


def put_worked_example(store, tenant):
    # KV for 4 blocks; 128 complete, 256 lacks rank 0, 384 lacks rank 1.
    for k in ["kv/0", "kv/1", "kv/2", "kv/3", "kda/128/r0", "kda/128/r1", "kda/256/r1",
              "kda/384/r0"]:
        store.put(k, b"v", tenant_id=tenant)


def lease_ms(store, k, tenant):
    return store.inspect(k, tenant_id=tenant)["lease_remaining_ms"]


def test_worked_example_through_the_binding(store, direct, tenant):
    put_worked_example(direct, tenant)
    r = k3.lookup(store, LAYOUT, key, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS,
                  tenant_id=tenant)
    assert r.resume_position == 128 and r.calls == 2
    assert r.keys == ["kv/0", "kda/128/r0", "kda/128/r1"]
    assert lease_ms(direct, "kda/128/r0", tenant) > 0
    assert lease_ms(direct, "kda/128/r1", tenant) > 0
    assert lease_ms(direct, "kda/256/r1", tenant) == 0
    assert lease_ms(direct, "kda/384/r0", tenant) == 0


def test_binding_policy_type_and_lease_all(store, direct, tenant):
    put_worked_example(direct, tenant)
    r = k3.lookup(store, LAYOUT, key, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS,
                  tenant_id=tenant, make_policy=moonlet.GrantLeasePolicy)
    assert r.resume_position == 128 and r.kda_leased == 2
    r = k3.lookup(store, LAYOUT, key, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS,
                  tenant_id=tenant, lease_all=True)
    assert r.resume_position == 128 and r.kda_leased == 4 and r.calls == 1
    assert lease_ms(direct, "kda/256/r1", tenant) > 0  # every hit leased
