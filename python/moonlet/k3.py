"""K3 lookup helpers: where a hybrid-model request resumes, and which keys it loads.

The Python twin of include/moonlet/k3.h (store/client/k3.c), for engines that drive
moonlet from Python.  A hybrid model (attention plus recurrent "KDA" layers)
can skip the prefill of a prefix only when attention KV blocks cover it and a
KDA checkpoint exists exactly at its end.  Checkpoints exist only at some
block boundaries and each is several physical keys (cache groups x ranks x
components).  ``lookup`` answers in one call to a store that has
``probe_resume`` (moonlet.Store: ProbeResume, the master does steps 1-3 and
leases only the selected checkpoint and the KV blocks below it), and
otherwise - or when the master predates ProbeResume (StoreError
INVALID_VERSION) - in at most two:

1. ``batch_is_exist`` over the KV keys (leases every hit) gives the KV
   boundary: the longest prefix of present blocks;
2. the candidates are the checkpoints at or below it (and below the resume
   bound), in increasing position, each one's keys contiguous in
   group -> rank -> component order, no member ever left out;
3. ``batch_probe_key`` with LAST_HIT_ONLY and candidate_size = keys per
   checkpoint leases the last complete one; its mask is validated (at most
   one candidate true, and only as a whole);
4. the result: the resume position and exactly the keys to load.

The store is duck-typed: any object with
``batch_is_exist(keys, tenant_id=...) -> list[bool]`` and
``batch_probe_key(keys, policy=..., tenant_id=...) -> list[bool]``, the
policy having ``lease_mode`` and ``candidate_size``; optionally
``probe_resume(kv_keys, kda_keys, candidate_size, boundaries, tenant_id=...)
-> (kv_prefix, selected or None, mask)``.  Key naming is the
caller's: a ``key_builder`` callable turns a :class:`KVKey` or
:class:`KDAKey` into the string the engine stores it under.

Positions are token counts; KV block ``i`` covers tokens
``[i * block_tokens, (i + 1) * block_tokens)``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional, Sequence, Union

__all__ = [
    "LeaseMode",
    "ProbePolicy",
    "Layout",
    "KVKey",
    "KDAKey",
    "LookupResult",
    "K3MaskError",
    "kv_boundary",
    "candidates",
    "check_mask",
    "last_complete",
    "common_resume",
    "lookup",
]


class LeaseMode(enum.IntEnum):
    """GrantLeasePolicy modes, with the C API's numbers (moonlet/policy.h)."""

    NONE = 0
    LAST_HIT_ONLY = 1


@dataclass(frozen=True)
class ProbePolicy:
    """A GrantLeasePolicy: what ``batch_probe_key(policy=...)`` receives
    unless the caller passes its binding's own policy type."""

    lease_mode: LeaseMode = LeaseMode.NONE
    candidate_size: int = 1


@dataclass(frozen=True)
class Layout:
    """KV block size and how one checkpoint splits into physical keys."""

    block_tokens: int
    groups: int = 1
    ranks: int = 1
    components: int = 1

    def __post_init__(self) -> None:
        for name in ("block_tokens", "groups", "ranks", "components"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Layout.{name} must be a positive int, got {v!r}")

    @property
    def keys_per_checkpoint(self) -> int:
        return self.groups * self.ranks * self.components


@dataclass(frozen=True)
class KVKey:
    """Names the KV block ``block``."""

    block: int


@dataclass(frozen=True)
class KDAKey:
    """Names one member of the checkpoint at ``position`` (tokens)."""

    position: int
    group: int
    rank: int
    component: int


KeyBuilder = Callable[[Union[KVKey, KDAKey]], str]


class K3MaskError(RuntimeError):
    """The store's LAST_HIT_ONLY answer broke its contract (a partially true
    candidate, a second true candidate, a value that is not a boolean, or a
    mask of the wrong length).  Nothing is selected."""


@dataclass
class LookupResult:
    resume_position: int = 0            # tokens not recomputed (0: none)
    checkpoint: Optional[int] = None    # selected checkpoint's position, or None
    kv_prefix_blocks: int = 0           # leading KV blocks present
    kv_boundary: int = 0                # tokens they cover (<= prompt_tokens)
    candidates: int = 0                 # checkpoints considered
    kv_keys: List[str] = field(default_factory=list)   # KV blocks below resume_position
    kda_keys: List[str] = field(default_factory=list)  # the selected checkpoint's keys
    calls: int = 0                      # store round trips (1 or 2)
    kv_hits: int = 0                    # KV keys present (one call: the prefix only)
    kda_leased: int = 0                 # KDA keys leased or renewed
    kv_leased: int = 0                  # KV keys leased or renewed (one call: those below
                                        # resume_position; otherwise every KV hit)

    @property
    def keys(self) -> List[str]:
        """Every key to load: the KV keys, then the checkpoint's keys."""
        return self.kv_keys + self.kda_keys


# ---- pure decisions -----------------------------------------------------------


def _as_bool(v: object, what: str) -> bool:
    # bool is an int subclass: accept True/False/1/0 only.
    if v is True or v is False or (isinstance(v, int) and v in (0, 1)):
        return bool(v)
    raise K3MaskError(f"{what}: expected a boolean, got {v!r}")


def kv_boundary(exist: Sequence[bool], block_tokens: int, prompt_tokens: int) -> tuple:
    """(prefix_blocks, boundary): the number of leading present blocks and the
    tokens they cover, capped at ``prompt_tokens``."""
    k = 0
    for v in exist:
        if not _as_bool(v, "batch_is_exist"):
            break
        k += 1
    return k, (prompt_tokens if k > prompt_tokens // block_tokens else k * block_tokens)


def candidates(checkpoints: Sequence[int], boundary: int, prompt_tokens: int,
               recompute_last_token: bool = False) -> int:
    """How many leading checkpoints are candidates: position <= boundary and
    below the resume bound (< prompt_tokens with final-token recompute, else
    <=).  Checkpoints are increasing, so the candidates are a prefix."""
    k = 0
    for p in checkpoints:
        if p > boundary or p > prompt_tokens or (recompute_last_token and p == prompt_tokens):
            break
        k += 1
    return k


def check_mask(mask: Sequence[object], n_candidates: int, per: int) -> Optional[int]:
    """Validates a LAST_HIT_ONLY mask over ``n_candidates`` candidates of
    ``per`` keys: the index of the one all-true candidate, or None when all
    are false.  Raises K3MaskError when the mask breaks the contract."""
    if len(mask) != n_candidates * per:
        raise K3MaskError(f"mask has {len(mask)} entries, expected {n_candidates * per}")
    selected = None
    for i in range(n_candidates):
        t = sum(_as_bool(v, "batch_probe_key") for v in mask[i * per:(i + 1) * per])
        if t == 0:
            continue
        if t != per:
            raise K3MaskError(f"candidate {i} is partially true ({t} of {per})")
        if selected is not None:
            raise K3MaskError(f"candidates {selected} and {i} are both true")
        selected = i
    return selected


def last_complete(exist: Sequence[object], n_candidates: int, per: int) -> Optional[int]:
    """The lease-all choice: the last candidate whose every key exists."""
    selected = None
    for i in range(n_candidates):
        if all(_as_bool(v, "batch_is_exist") for v in exist[i * per:(i + 1) * per]):
            selected = i
    return selected


def common_resume(participants: Iterable[Iterable[int]]) -> int:
    """The distributed rule: the largest position complete on every participant
    (ranks, pipeline stages), i.e. the maximum of the intersection of their
    sets, not the minimum of their maxima: {128, 384} and {128, 256} give 128.
    0 when they share none (resume from the start)."""
    sets = [set(p) for p in participants]
    if not sets:
        raise ValueError("common_resume needs at least one participant")
    common = set.intersection(*sets)
    return max(common) if common else 0


# ---- the lookup ---------------------------------------------------------------


def _checkpoint_keys(layout: Layout, key_builder: KeyBuilder, position: int) -> List[str]:
    return [
        _key(key_builder, KDAKey(position, g, r, c))
        for g in range(layout.groups)
        for r in range(layout.ranks)
        for c in range(layout.components)
    ]


def _key(key_builder: KeyBuilder, kid: Union[KVKey, KDAKey]) -> str:
    k = key_builder(kid)
    if not isinstance(k, str) or not k or len(k.encode()) > 4096:
        raise ValueError(f"key builder gave an invalid key for {kid!r}: {k!r}")
    return k


def _answer(values: Sequence[object], n: int, what: str) -> List[object]:
    values = list(values)
    if len(values) != n:
        raise K3MaskError(f"{what} returned {len(values)} results for {n} keys")
    return values


INVALID_VERSION = -300  # the master does not know ProbeResume


def _one_call(store, layout: Layout, checkpoints: Sequence[int], kv_keys: List[str],
              ckpt_keys: List[List[str]], prompt_tokens: int, recompute_last_token: bool,
              kw: dict) -> Optional[LookupResult]:
    """The lookup through ``store.probe_resume``; None when the master
    predates it (the caller takes the two-call path)."""
    per, bt = layout.keys_per_checkpoint, layout.block_tokens
    kda = [k for ck in ckpt_keys for k in ck]
    bounds = [p // bt for p in checkpoints[:len(ckpt_keys)]]
    try:
        prefix, sel, mask = store.probe_resume(kv_keys, kda, per, bounds, **kw)
    except Exception as e:  # noqa: BLE001 - only INVALID_VERSION is handled
        if getattr(e, "code", None) == INVALID_VERSION:
            return None
        raise
    mask = _answer(mask, len(kda), "probe_resume")
    if not isinstance(prefix, int) or not 0 <= prefix <= len(kv_keys):
        raise K3MaskError(f"probe_resume returned a KV prefix of {prefix!r}")
    res = LookupResult(calls=1)
    res.kv_prefix_blocks, res.kv_boundary = kv_boundary([True] * prefix + [False] *
                                                        (len(kv_keys) - prefix), bt,
                                                        prompt_tokens)
    res.kv_hits = prefix
    res.candidates = candidates(checkpoints, res.kv_boundary, prompt_tokens,
                                recompute_last_token)
    selected = check_mask(mask, len(ckpt_keys), per)
    if selected != sel or (selected is not None and selected >= res.candidates):
        raise K3MaskError(f"probe_resume selected {sel!r} but its mask says {selected!r} "
                          f"of {res.candidates} candidates")
    if selected is not None:
        res.checkpoint = res.resume_position = checkpoints[selected]
        res.kv_keys = kv_keys[:res.resume_position // bt]
        res.kda_keys = ckpt_keys[selected]
        res.kda_leased, res.kv_leased = per, len(res.kv_keys)
    return res


def lookup(store, layout: Layout, key_builder: KeyBuilder, *, prompt_tokens: int,
           kv_blocks: int, checkpoints: Sequence[int], recompute_last_token: bool = False,
           tenant_id: Optional[str] = None, lease_all: bool = False, two_calls: bool = False,
           make_policy: Callable[..., object] = ProbePolicy) -> LookupResult:
    """Runs the K3 lookup against ``store`` (see the module docstring).

    ``checkpoints`` are the positions where a checkpoint may exist: strictly
    increasing, each > 0 and a multiple of ``layout.block_tokens``.
    ``recompute_last_token`` (Eagle-style final-token recompute) keeps the
    resume position strictly below ``prompt_tokens``.  ``lease_all`` does what
    an engine without BatchProbeKey does - one ``batch_is_exist`` over every
    KV and KDA key, leasing every hit - for comparison.  ``make_policy`` builds
    the policy object (``make_policy(lease_mode=..., candidate_size=...)``),
    so a binding's own policy type can be used.  ``tenant_id`` is passed on
    only when given.  ``two_calls`` skips ``probe_resume`` (the selective
    lookup as it was before ProbeResume, for comparison).

    Raises ValueError for a bad request, K3MaskError for an answer that
    breaks the contract; the store's own exceptions propagate.
    """
    if prompt_tokens < 1 or kv_blocks < 1:
        raise ValueError("prompt_tokens and kv_blocks must be positive")
    checkpoints = list(checkpoints)
    for i, p in enumerate(checkpoints):
        if p <= 0 or p % layout.block_tokens or (i and p <= checkpoints[i - 1]):
            raise ValueError(f"bad checkpoint position {p}: positive, increasing, "
                             f"multiples of {layout.block_tokens} expected")
    kw = {} if tenant_id is None else {"tenant_id": tenant_id}
    per = layout.keys_per_checkpoint
    bt = layout.block_tokens
    reach_tokens = prompt_tokens if kv_blocks > prompt_tokens // bt else kv_blocks * bt
    reach = candidates(checkpoints, reach_tokens, prompt_tokens, recompute_last_token)

    kv_keys = [_key(key_builder, KVKey(b)) for b in range(kv_blocks)]
    ckpt_keys = [_checkpoint_keys(layout, key_builder, p) for p in checkpoints[:reach]]
    if not lease_all and not two_calls and hasattr(store, "probe_resume"):
        one = _one_call(store, layout, checkpoints, kv_keys, ckpt_keys, prompt_tokens,
                        recompute_last_token, kw)
        if one is not None:
            return one
    res = LookupResult()

    if lease_all:
        flat = kv_keys + [k for ck in ckpt_keys for k in ck]
        exist = _answer(store.batch_is_exist(flat, **kw), len(flat), "batch_is_exist")
        res.calls = 1
        kda = exist[kv_blocks:]
        res.kda_leased = sum(_as_bool(v, "batch_is_exist") for v in kda)
    else:
        exist = _answer(store.batch_is_exist(kv_keys, **kw), kv_blocks, "batch_is_exist")
        res.calls = 1
    res.kv_prefix_blocks, res.kv_boundary = kv_boundary(exist[:kv_blocks], bt, prompt_tokens)
    res.kv_hits = res.kv_leased = sum(_as_bool(v, "batch_is_exist") for v in exist[:kv_blocks])
    res.candidates = candidates(checkpoints, res.kv_boundary, prompt_tokens, recompute_last_token)

    if lease_all:
        selected = last_complete(kda, res.candidates, per)
    elif res.candidates:
        probe = [k for ck in ckpt_keys[:res.candidates] for k in ck]
        policy = make_policy(lease_mode=LeaseMode.LAST_HIT_ONLY, candidate_size=per)
        mask = _answer(store.batch_probe_key(probe, policy=policy, **kw), len(probe),
                       "batch_probe_key")
        res.calls = 2
        selected = check_mask(mask, res.candidates, per)
        res.kda_leased = per if selected is not None else 0
    else:
        selected = None

    if selected is not None:
        res.checkpoint = res.resume_position = checkpoints[selected]
        res.kv_keys = kv_keys[:res.resume_position // bt]
        res.kda_keys = ckpt_keys[selected]
    return res
