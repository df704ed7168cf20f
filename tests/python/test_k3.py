"""Tests of python/moonlet/k3.py against a fake store.

The fake store keeps the master's contract (BatchExistKey leases every hit;
BatchProbeKey(LAST_HIT_ONLY) leases the last complete candidate and answers
with a selected-only mask) and records every call and every lease, so a
helper that probes or leases one key too many fails.  A second fake answers
with masks that break the contract, which the helper must reject.

The module is imported by path: the `moonlet` package (the binding) is built
elsewhere, and k3.py depends on nothing but the standard library.
"""

import importlib.util
import os
import pathlib
import sys

import pytest

from conftest import k3_short_key

_ROOT = pathlib.Path(os.environ.get("MOONLET_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
_spec = importlib.util.spec_from_file_location("moonlet_k3", _ROOT / "python" / "moonlet" / "k3.py")
k3 = importlib.util.module_from_spec(_spec)
sys.modules["moonlet_k3"] = k3
_spec.loader.exec_module(k3)

L2 = k3.Layout(block_tokens=128, ranks=2)
CKPTS = [128, 256, 384]


def vllm_keys(kid):
    """Worked-example names: kv/0, kda/128/r0 (group/component when > 1)."""
    if isinstance(kid, k3.KVKey):
        return f"kv/{kid.block}"
    return f"kda/{kid.position}/g{kid.group}/r{kid.rank}/c{kid.component}"


short_keys = k3_short_key


def sglang_keys(kid):
    """A different layout: one hash-like name per prefix, rank first."""
    if isinstance(kid, k3.KVKey):
        return f"req42:{kid.block:08x}:kv"
    return f"req42:rank{kid.rank}:mamba:{kid.position:08x}:{kid.group}.{kid.component}"


class FakeStore:
    def __init__(self, present=()):
        self.present = set(present)
        self.leases = {}
        self.calls = []

    def _lease(self, key):
        self.leases[key] = self.leases.get(key, 0) + 1

    def batch_is_exist(self, keys, tenant_id=None):
        self.calls.append(("exist", list(keys), None, tenant_id))
        out = [k in self.present for k in keys]
        for k, hit in zip(keys, out):
            if hit:
                self._lease(k)
        return out

    def batch_probe_key(self, keys, policy=None, tenant_id=None):
        self.calls.append(("probe", list(keys), policy, tenant_id))
        exist = [k in self.present for k in keys]
        if policy.lease_mode == k3.LeaseMode.NONE:
            return exist
        n = policy.candidate_size
        assert policy.lease_mode == k3.LeaseMode.LAST_HIT_ONLY
        assert n >= 1 and len(keys) % n == 0
        mask = [False] * len(keys)
        for i in reversed(range(len(keys) // n)):
            if all(exist[i * n:(i + 1) * n]):
                for j in range(i * n, (i + 1) * n):
                    mask[j] = True
                    self._lease(keys[j])
                break
        return mask

    def probes(self):
        return [c for c in self.calls if c[0] == "probe"]


def worked_store():
    # 128 complete; 256 lacks rank 0; 384 lacks rank 1; KV for 4 blocks.
    return FakeStore(["kv/0", "kv/1", "kv/2", "kv/3",
                      "kda/128/r0", "kda/128/r1", "kda/256/r1", "kda/384/r0"])


def kda_leases(store):
    return {k for k in store.leases if k.startswith("kda/")}


def test_worked_example():
    s = worked_store()
    r = k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS)
    assert r.resume_position == 128 and r.checkpoint == 128
    assert r.kda_keys == ["kda/128/r0", "kda/128/r1"]  # its 2 keys
    assert r.kv_keys == ["kv/0"]
    assert r.keys == ["kv/0", "kda/128/r0", "kda/128/r1"]
    assert (r.kv_boundary, r.candidates, r.calls, r.kv_hits, r.kda_leased) == (512, 3, 2, 4, 2)
    # One probe, every candidate member present in order, candidate_size 2.
    (probe,) = s.probes()
    assert probe[1] == ["kda/128/r0", "kda/128/r1", "kda/256/r0", "kda/256/r1",
                        "kda/384/r0", "kda/384/r1"]
    assert probe[2].lease_mode == k3.LeaseMode.LAST_HIT_ONLY and probe[2].candidate_size == 2
    assert kda_leases(s) == {"kda/128/r0", "kda/128/r1"}


def test_lease_all_leases_every_hit():
    s = worked_store()
    r = k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS,
                  lease_all=True)
    assert r.resume_position == 128 and r.keys == ["kv/0", "kda/128/r0", "kda/128/r1"]
    assert r.calls == 1 and not s.probes()
    assert r.kda_leased == 4
    assert kda_leases(s) == {"kda/128/r0", "kda/128/r1", "kda/256/r1", "kda/384/r0"}


def test_kv_boundary_cuts_candidates():
    kda = [f"kda/{p}/r{r}" for p in CKPTS for r in (0, 1)]
    s = FakeStore(["kv/0", "kv/1", "kv/3"] + kda)  # block 2 missing
    r = k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS)
    assert (r.kv_prefix_blocks, r.kv_boundary, r.candidates) == (2, 256, 2)
    assert r.resume_position == 256
    assert r.keys == ["kv/0", "kv/1", "kda/256/r0", "kda/256/r1"]
    (probe,) = s.probes()
    assert "kda/384/r0" not in probe[1]  # never probed, so never leased
    assert kda_leases(s) == {"kda/256/r0", "kda/256/r1"}


def test_eagle_final_token_recompute():
    kda = [f"kda/{p}/r{r}" for p in CKPTS for r in (0, 1)]
    s = FakeStore(["kv/0", "kv/1", "kv/2"] + kda)
    r = k3.lookup(s, L2, short_keys, prompt_tokens=384, kv_blocks=3, checkpoints=CKPTS,
                  recompute_last_token=True)
    assert r.resume_position == 256 < 384
    assert r.keys == ["kv/0", "kv/1", "kda/256/r0", "kda/256/r1"]
    assert "kda/384/r0" not in kda_leases(s)
    r = k3.lookup(FakeStore(s.present), L2, short_keys, prompt_tokens=384, kv_blocks=3,
                  checkpoints=CKPTS)
    assert r.resume_position == 384 and len(r.kv_keys) == 3


def test_no_kda_candidate():
    s = FakeStore(["kv/1", "kda/128/r0", "kda/128/r1"])  # KV block 0 missing
    r = k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS)
    assert (r.resume_position, r.checkpoint, r.candidates, r.calls) == (0, None, 0, 1)
    assert r.keys == [] and not s.probes() and not kda_leases(s)
    # KV present, no complete checkpoint: probed, nothing selected or leased.
    s = FakeStore(["kv/0", "kv/1", "kda/128/r1"])
    r = k3.lookup(s, L2, short_keys, prompt_tokens=256, kv_blocks=2, checkpoints=CKPTS)
    assert (r.resume_position, r.candidates, r.calls, r.kda_leased) == (0, 2, 2, 0)
    assert r.keys == [] and not kda_leases(s)


def test_key_order_group_rank_component():
    layout = k3.Layout(block_tokens=128, groups=2, ranks=2, components=2)
    want = [f"kda/128/g{g}/r{r}/c{c}" for g in (0, 1) for r in (0, 1) for c in (0, 1)]
    s = FakeStore(["kv/0", "kv/1"] + want)
    res = k3.lookup(s, layout, vllm_keys, prompt_tokens=300, kv_blocks=2, checkpoints=CKPTS)
    assert res.resume_position == 128 and res.kda_keys == want
    (probe,) = s.probes()
    assert probe[1][:8] == want and len(probe[1]) == 16 and probe[2].candidate_size == 8


def test_sglang_style_names_fit():
    layout = k3.Layout(block_tokens=64, groups=1, ranks=4, components=2)
    present = [sglang_keys(k3.KVKey(b)) for b in range(4)]
    present += [sglang_keys(k3.KDAKey(128, 0, r, c)) for r in range(4) for c in range(2)]
    s = FakeStore(present)
    res = k3.lookup(s, layout, sglang_keys, prompt_tokens=250, kv_blocks=4,
                    checkpoints=[64, 128, 192], tenant_id="t1")
    assert res.resume_position == 128 and len(res.kda_keys) == 8 and len(res.kv_keys) == 2
    assert all(c[3] == "t1" for c in s.calls)


def test_tenant_only_passed_when_given():
    class NoTenant(FakeStore):
        def batch_is_exist(self, keys):  # a binding without tenants
            return super().batch_is_exist(keys)

        def batch_probe_key(self, keys, policy=None):
            return super().batch_probe_key(keys, policy=policy)

    s = NoTenant(worked_store().present)
    assert k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4,
                     checkpoints=CKPTS).resume_position == 128


def test_custom_policy_type():
    made = []

    def make_policy(lease_mode, candidate_size):
        made.append((int(lease_mode), candidate_size))
        return k3.ProbePolicy(lease_mode, candidate_size)

    s = worked_store()
    k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS,
              make_policy=make_policy)
    assert made == [(1, 2)]


class BadMaskStore(FakeStore):
    def __init__(self, present, mask):
        super().__init__(present)
        self.mask = mask

    def batch_probe_key(self, keys, policy=None, tenant_id=None):
        return list(self.mask)


@pytest.mark.parametrize("mask", [
    [True, True, False, True, True, False],     # existence-style: partial groups
    [False, False, False, True, False, False],  # only a partial group
    [True, True, False, False, True, True],     # two complete groups
    [True, True, False, False],                 # wrong length
    [2, 2, 0, 0, 0, 0],                         # not booleans
])
def test_rejects_broken_mask(mask):
    s = BadMaskStore(worked_store().present, mask)
    with pytest.raises(k3.K3MaskError):
        k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS)


def test_check_mask_pure():
    assert k3.check_mask([True, True, False, False, False, False], 3, 2) == 0
    assert k3.check_mask([False] * 6, 3, 2) is None
    assert k3.check_mask([0, 0, 1, 1], 2, 2) == 1
    with pytest.raises(k3.K3MaskError):
        k3.check_mask([True, False], 1, 2)


def test_distributed_intersection():
    assert k3.common_resume([{128, 384}, {128, 256}]) == 128  # not min(384, 256)
    assert k3.common_resume([[512, 128, 256, 384], [384, 256, 512], [256, 512, 128, 384]]) == 512
    assert k3.common_resume([[128], [256]]) == 0
    assert k3.common_resume([[128, 384], []]) == 0
    assert k3.common_resume([[128, 384]]) == 384
    with pytest.raises(ValueError):
        k3.common_resume([])


def test_pure_boundary_and_candidates():
    assert k3.kv_boundary([True, True, False, True], 128, 512) == (2, 256)
    assert k3.kv_boundary([True] * 4, 128, 450) == (4, 450)
    assert k3.candidates(CKPTS, 512, 512) == 3
    assert k3.candidates(CKPTS, 383, 512) == 2
    assert k3.candidates(CKPTS, 384, 384, recompute_last_token=True) == 2
    assert k3.last_complete([1, 1, 0, 1, 1, 0], 3, 2) == 0


def test_bad_requests():
    s = worked_store()
    with pytest.raises(ValueError):
        k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=[128, 200])
    with pytest.raises(ValueError):
        k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=[256, 128])
    with pytest.raises(ValueError):
        k3.lookup(s, L2, lambda kid: "", prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS)
    with pytest.raises(ValueError):
        k3.Layout(block_tokens=0)
    assert not s.calls


# ---- the one-call path (probe_resume) ------------------------------------------


class ResumeStore(FakeStore):
    """A store with probe_resume, keeping ProbeResume's contract: the KV
    prefix, the last complete candidate within it, leases of exactly its
    keys and the KV keys below its boundary."""

    def probe_resume(self, kv_keys, kda_keys, candidate_size, boundaries, tenant_id=None):
        self.calls.append(("resume", list(kv_keys), list(kda_keys), list(boundaries), tenant_id))
        prefix = 0
        while prefix < len(kv_keys) and kv_keys[prefix] in self.present:
            prefix += 1
        n = candidate_size
        mask = [False] * len(kda_keys)
        for c in reversed(range(len(boundaries))):
            members = kda_keys[c * n:(c + 1) * n]
            if boundaries[c] <= prefix and all(k in self.present for k in members):
                for j in range(c * n, (c + 1) * n):
                    mask[j] = True
                for k in members + list(kv_keys[:boundaries[c]]):
                    self._lease(k)
                return prefix, c, mask
        return prefix, None, mask


def test_one_call_worked_example():
    s = ResumeStore(worked_store().present)
    r = k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS)
    assert r.resume_position == 128 and r.keys == ["kv/0", "kda/128/r0", "kda/128/r1"]
    assert (r.kv_boundary, r.candidates, r.calls, r.kv_hits, r.kda_leased, r.kv_leased) == (
        512, 3, 1, 4, 2, 1)
    (call,) = s.calls
    assert call[0] == "resume" and call[1] == ["kv/0", "kv/1", "kv/2", "kv/3"]
    assert call[2] == ["kda/128/r0", "kda/128/r1", "kda/256/r0", "kda/256/r1",
                       "kda/384/r0", "kda/384/r1"]
    assert call[3] == [1, 2, 3]  # each checkpoint's KV blocks
    assert set(s.leases) == {"kv/0", "kda/128/r0", "kda/128/r1"}


def test_one_call_boundary_and_eagle():
    kda = [f"kda/{p}/r{r}" for p in CKPTS for r in (0, 1)]
    s = ResumeStore(["kv/0", "kv/1", "kv/3"] + kda)
    r = k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS)
    assert (r.kv_prefix_blocks, r.kv_boundary, r.candidates, r.resume_position) == (2, 256, 2, 256)
    assert set(s.leases) == {"kv/0", "kv/1", "kda/256/r0", "kda/256/r1"}  # not kv/3
    s = ResumeStore(["kv/0", "kv/1", "kv/2"] + kda)
    r = k3.lookup(s, L2, short_keys, prompt_tokens=384, kv_blocks=3, checkpoints=CKPTS,
                  recompute_last_token=True)
    assert r.resume_position == 256 and r.calls == 1
    assert s.calls[0][3] == [1, 2]  # 384 = the prompt's end: not a candidate


def test_one_call_nothing_selected_leases_nothing():
    s = ResumeStore(["kv/0", "kv/1", "kda/128/r1"])
    r = k3.lookup(s, L2, short_keys, prompt_tokens=256, kv_blocks=2, checkpoints=CKPTS)
    assert r.resume_position == 0 and r.keys == [] and r.calls == 1
    assert (r.kv_leased, r.kda_leased) == (0, 0) and s.leases == {}


class OldMasterError(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.code = code


class OldMasterStore(FakeStore):
    """probe_resume exists in the binding, but the master predates it."""

    def probe_resume(self, *a, **kw):
        self.calls.append(("resume",))
        raise OldMasterError(-300)


def test_older_master_falls_back_to_two_calls():
    s = OldMasterStore(worked_store().present)
    r = k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS)
    assert r.resume_position == 128 and r.calls == 2 and r.kv_leased == 4
    assert [c[0] for c in s.calls] == ["resume", "exist", "probe"]
    # any other error is the caller's
    class Broken(FakeStore):
        def probe_resume(self, *a, **kw):
            raise OldMasterError(-600)
    with pytest.raises(OldMasterError):
        k3.lookup(Broken(), L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS)


def test_two_calls_flag_skips_probe_resume():
    s = ResumeStore(worked_store().present)
    r = k3.lookup(s, L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS,
                  two_calls=True)
    assert r.calls == 2 and [c[0] for c in s.calls] == ["exist", "probe"]


@pytest.mark.parametrize("answer", [
    (4, 1, [True, True, False, False, False, False]),   # selection and mask disagree
    (4, 0, [True, False, False, False, False, False]),  # partial candidate
    (4, None, [True, True, False, False, False, False]),
    (5, 0, [True, True, False, False, False, False]),   # prefix above the KV keys
    (0, 0, [True, True, False, False, False, False]),   # selected past the prefix
    (4, 0, [True, True, False, False]),                 # wrong mask length
])
def test_one_call_contract_breaks_are_rejected(answer):
    class Liar(FakeStore):
        def probe_resume(self, *a, **kw):
            return answer
    with pytest.raises(k3.K3MaskError):
        k3.lookup(Liar(), L2, short_keys, prompt_tokens=512, kv_blocks=4, checkpoints=CKPTS)
