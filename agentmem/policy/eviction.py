"""Eviction policies: which live tokens of an over-budget agent to drop.

When an agent's live tokens exceed the high watermark of its budget, the pool
builds a `agentmem.policy.view.LedgerView` and asks a policy for ranges
of live positions to remove so that at most ``target`` (the low watermark)
remain. The pool then removes them (``seq_rm`` + position shift), archives
their text and keeps them in the ledger flagged as evicted.

Every policy is a small strategy object with one job: give each live token a
*keep priority* (`EvictionPolicy.priority`, higher = kept longer). The
shared `EvictionPolicy.select` turns priorities into ranges the same way
for all of them:

1. cut the live positions into blocks of ``block`` tokens aligned to position
   0 (``[0, 32)``, ``[32, 64)``, …) and split a block wherever it changes
   between *pinned*, *protected* and *ordinary* tokens (a pinned token never
   shares a piece with an evictable one) or from one message to the next (a
   piece is judged by one message's score, not by the mean of the end of one
   and the start of another — which evicted fact lines at the head of tool
   results together with the prose before them);
2. drop the pinned pieces; rank the rest by class (ordinary before protected),
   then by mean priority, then by position (older first) — a total order, so
   the result is deterministic;
3. take pieces in that order until enough tokens are gone, and return them
   sorted, with touching pieces merged into one half-open range.

*Protected* tokens (a policy's own must-keep set: the head of a sliding
window, the attention sinks, the newest turn) are evicted only when the target
cannot be met otherwise; *pinned* tokens (``"pin": True`` messages, BOS) are
never evicted. If the pinned tokens alone exceed the target, everything else
goes and the pool reports the overflow.

Policies (`POLICIES`, built by name with `get_policy`):

==================  ==========================================================
``sliding_window``  keep the first ``n_keep`` tokens (default: the leading
                    system span) and the most recent ones.
``streaming_llm``   keep ``n_sink`` attention-sink tokens (default 4) and the
                    most recent ones (StreamingLLM, Xiao et al. 2023).
``region_decay``    MemDecay: per-region base score decaying with age,
                    importance spread to neighbours, refresh by reference,
                    pace-adaptive decay (the default, see `RegionDecay`).
==================  ==========================================================

>>> import numpy as np
>>> from agentmem.policy.view import LedgerView
>>> n = 100
>>> view = LedgerView(tokens=np.arange(n, dtype=np.int32), regions=np.full(n, 2, np.uint8),
...                   pinned=np.zeros(n, bool), turn=np.repeat(np.arange(10, dtype=np.int32), 10),
...                   current_turn=9, recent=np.zeros(0, np.int32))
>>> get_policy("streaming_llm").select(view, target=60, block=16)
[(4, 48)]

(40 tokens had to go; whole blocks ``[4, 16)``, ``[16, 32)``, ``[32, 48)``
went — 44 — and touching blocks are returned as one range.)
"""

from __future__ import annotations

import dataclasses
import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np

# np.unique imports numpy.ma on its first call (16 ms here): import it now so the
# first eviction pass of a process does not pay it on a reply's path
import numpy.ma  # noqa: F401

from agentmem.errors import ConfigError, PolicyError
from agentmem.policy.view import REGION_CODE, LedgerView

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "EvictionPolicy",
    "RegionDecay",
    "RegionDecayParams",
    "SlidingWindow",
    "StreamingLLM",
    "get_policy",
]

logger = logging.getLogger(__name__)

#: Added to the priority of protected tokens: larger than any ordinary
#: priority, so a protected piece always ranks after every ordinary one.
_PROTECT = 1e12

_SYSTEM = REGION_CODE["system"]


class EvictionPolicy(ABC):
    """A strategy choosing which live tokens of one agent to evict.

    Subclasses implement `priority` (and may override `protected`);
    `select` — shared by all — turns priorities into block ranges.
    A policy holds only its parameters: one instance may serve many agents and
    threads.

    Attributes:
        name: the registry name (``get_policy(name)`` builds this class).
    """

    name: ClassVar[str]

    @abstractmethod
    def priority(self, view: LedgerView) -> np.ndarray:
        """Keep priority of every live token (float64, length ``view.n``).

        Higher means "keep longer". Only the order matters, and only among
        tokens of the same class (ordinary / protected).
        """

    def protected(self, view: LedgerView) -> np.ndarray:
        """Tokens this policy keeps unless the target cannot be met otherwise (bool mask).

        The default protects nothing.
        """
        return np.zeros(view.n, dtype=bool)

    def select(self, view: LedgerView, *, target: int, block: int = 32) -> list[tuple[int, int]]:
        """Ranges of live positions to evict so that at most ``target`` tokens remain.

        Args:
            view: the agent's live tokens.
            target: tokens that may remain (the low watermark of the budget).
            block: eviction granularity in tokens; blocks are aligned to live
                position 0 and split around pinned/protected tokens and at
                message boundaries.

        Returns:
            Sorted, non-overlapping half-open ``(start, end)`` ranges of live
            positions, never containing a pinned token. Whole pieces are
            evicted, so slightly more than ``view.n - target`` tokens may go
            (less than one block more). Empty when ``view.n <= target``. When
            pinned tokens alone exceed ``target``, every unpinned token is
            returned (the caller reports the overflow).

        Raises:
            ValueError: ``target`` is negative or ``block`` is below 1.
        """
        if not isinstance(target, (int, np.integer)) or target < 0:
            raise ValueError(f"target must be a non-negative int, got {target!r}")
        if not isinstance(block, (int, np.integer)) or block < 1:
            raise ValueError(f"block must be a positive int, got {block!r}")
        n = view.n
        need = n - int(target)
        if need <= 0:
            return []
        _check_view(view)
        pinned = view.pinned.astype(bool, copy=False)
        prot = self.protected(view) & ~pinned
        prio = np.asarray(self.priority(view), dtype=np.float64)
        assert prio.shape == (n,), f"{self.name}: priority shape {prio.shape}, expected ({n},)"
        key = np.where(prot, prio + _PROTECT, prio)

        # Pieces: aligned blocks, split where the class (0 ordinary, 1 protected, 2 pinned)
        # or the message changes.
        cls = prot.astype(np.int8) + 2 * pinned.astype(np.int8)
        cut = np.zeros(n, dtype=bool)
        cut[::block] = True
        cut[1:] |= (cls[1:] != cls[:-1]) | (view.turn[1:] != view.turn[:-1])
        starts = np.flatnonzero(cut)
        ends = np.append(starts[1:], n)
        lengths = ends - starts
        mean = np.add.reduceat(key, starts) / lengths
        keep = cls[starts] != 2
        starts, ends, lengths, mean = starts[keep], ends[keep], lengths[keep], mean[keep]
        if lengths.sum() <= need:  # pinned alone reach the target: evict everything evictable
            chosen = np.arange(starts.shape[0])
            if lengths.sum() < need:
                logger.debug("%s: %d pinned tokens exceed the target %d", self.name, int(pinned.sum()), target)
        else:
            order = np.lexsort((starts, mean))  # lowest mean first, older first on ties
            taken = np.cumsum(lengths[order])
            chosen = order[: int(np.searchsorted(taken, need)) + 1]
        chosen.sort()
        return _merge(starts[chosen], ends[chosen])

    def __repr__(self) -> str:
        if dataclasses.is_dataclass(self):
            args = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self))
            return f"{type(self).__name__}({args})"
        return f"{type(self).__name__}()"


def _check_view(view: LedgerView) -> None:
    n = view.n
    for attr in ("regions", "pinned", "turn"):
        got = getattr(view, attr).shape
        assert got == (n,), f"LedgerView.{attr} has shape {got}, tokens has ({n},)"


def _merge(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """Sorted pieces → ranges; touching pieces are joined (one ``seq_rm`` each)."""
    if starts.size == 0:
        return []
    gap = np.flatnonzero(starts[1:] != ends[:-1])
    first = np.concatenate(([0], gap + 1))
    last = np.concatenate((gap, [starts.size - 1]))
    return list(zip(starts[first].tolist(), ends[last].tolist()))


def _leading_system(view: LedgerView) -> int:
    """Length of the leading run of ``system`` tokens (0 when the view starts otherwise)."""
    not_sys = np.flatnonzero(view.regions != _SYSTEM)
    return int(not_sys[0]) if not_sys.size else view.n


@dataclass(frozen=True, kw_only=True, repr=False)
class SlidingWindow(EvictionPolicy):
    """Keep the first ``n_keep`` tokens and the most recent ones (llama.cpp's context shift).

    Priority is the position itself, so the oldest tokens after the head go
    first. The head is protected, not pinned: it goes only when the target
    cannot be met otherwise.

    Attributes:
        n_keep: head tokens to keep; ``None`` = the leading system span (the
            system prompt as rendered, BOS included).
    """

    name: ClassVar[str] = "sliding_window"
    n_keep: int | None = None

    def __post_init__(self) -> None:
        if self.n_keep is not None and (not isinstance(self.n_keep, int) or self.n_keep < 0):
            raise ConfigError(f"sliding_window: n_keep must be a non-negative int or None, got {self.n_keep!r}")

    def priority(self, view: LedgerView) -> np.ndarray:
        return np.arange(view.n, dtype=np.float64)

    def protected(self, view: LedgerView) -> np.ndarray:
        head = _leading_system(view) if self.n_keep is None else min(self.n_keep, view.n)
        mask = np.zeros(view.n, dtype=bool)
        mask[:head] = True
        return mask


@dataclass(frozen=True, kw_only=True, repr=False)
class StreamingLLM(EvictionPolicy):
    """Keep ``n_sink`` attention-sink tokens and the most recent ones.

    StreamingLLM (Xiao et al., 2023) observed that the first few tokens absorb
    attention mass whatever they say; keeping them and a recent window keeps a
    model fluent, though not informed about anything in between.

    Attributes:
        n_sink: leading tokens kept as attention sinks.
    """

    name: ClassVar[str] = "streaming_llm"
    n_sink: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.n_sink, int) or self.n_sink < 0:
            raise ConfigError(f"streaming_llm: n_sink must be a non-negative int, got {self.n_sink!r}")

    def priority(self, view: LedgerView) -> np.ndarray:
        return np.arange(view.n, dtype=np.float64)

    def protected(self, view: LedgerView) -> np.ndarray:
        mask = np.zeros(view.n, dtype=bool)
        mask[: self.n_sink] = True
        return mask


# Defaults. Region order dominates over the life of a typical agent context and
# age breaks ties: half-lives (ln 2 / decay, in turns at the reference pace) are
# ~100 turns for tool results and calls, ~23 for user turns, ~10 for assistant
# prose, so a tool result outranks fresh assistant prose until it is ~200 turns
# old. Tool results (information the agent paid a tool call for) sit above tool
# calls (mostly routine requests whose effect is in the result; decisions
# recorded as calls share the region), which sit above user turns.
_DEFAULT_BASE: dict[str, float] = {
    "system": 1000.0,  # effectively pinned: outranks everything at any age
    "tool_result": 1.0,
    "tool_call": 0.8,
    "user": 0.5,
    "text": 0.4,  # raw completions: no role to go by
    "assistant": 0.25,  # mostly prose around the decisions
}
_DEFAULT_DECAY: dict[str, float] = {
    "system": 0.0,
    "tool_result": 0.007,
    "tool_call": 0.007,
    "user": 0.03,
    "text": 0.03,
    "assistant": 0.07,
}


@dataclass(frozen=True, kw_only=True)
class RegionDecayParams:
    """Parameters of `RegionDecay`. Region maps are merged over the defaults.

    ``RegionDecayParams(base={"user": 0.8})`` changes only the user base score.

    Attributes:
        base: base score per region (``system``, ``user``, ``assistant``,
            ``tool_call``, ``tool_result``, ``text``).
        decay: decay rate per region, per turn of age (before pace scaling).
        neighbours: importance spreads to this many tokens each side (max-filter
            within one message).
        token_age_weight: age blends turns and tokens:
            ``age = (1-w)·age_turns + w·age_tokens/tokens_per_turn``. The token
            part orders tokens inside a turn and evens out very long turns.
        pace_reference: tokens per turn at which decay rates apply unchanged.
        pace_exponent: decay is scaled by ``(tokens_per_turn / pace_reference) ** pace_exponent``
            (clipped to [0.25, 4]): long turns carry more per turn, so a turn
            of age counts for more; many short turns age slower. 0 disables.
        refresh: reset the age of a message that shares a rare token with the
            newest user/tool turn (the agent referred back to it).
        rare_max_count: a token id is *rare* when it occurs at most this many
            times in the live view (counting the newest turn's own uses).
        protect_recent_turn: never evict the newest message unless the target
            cannot be met otherwise.
    """

    base: Mapping[str, float] = field(default_factory=dict)
    decay: Mapping[str, float] = field(default_factory=dict)
    neighbours: int = 3
    token_age_weight: float = 0.5
    pace_reference: float = 64.0
    pace_exponent: float = 0.5
    refresh: bool = True
    rare_max_count: int = 3
    protect_recent_turn: bool = True

    def __post_init__(self) -> None:
        for attr, defaults in (("base", _DEFAULT_BASE), ("decay", _DEFAULT_DECAY)):
            given = dict(getattr(self, attr))
            unknown = sorted(set(given) - set(REGION_CODE))
            if unknown:
                raise ConfigError(f"region_decay: unknown region(s) {unknown} in {attr}; valid: {', '.join(REGION_CODE)}")
            bad = {k: v for k, v in given.items() if not _finite_nonneg(v)}
            if bad:
                raise ConfigError(f"region_decay: {attr} values must be finite and >= 0, got {bad}")
            object.__setattr__(self, attr, {**defaults, **{k: float(v) for k, v in given.items()}})
        if not isinstance(self.neighbours, int) or self.neighbours < 0:
            raise ConfigError(f"region_decay: neighbours must be a non-negative int, got {self.neighbours!r}")
        if not (0.0 <= self.token_age_weight <= 1.0):
            raise ConfigError(f"region_decay: token_age_weight must be in [0, 1], got {self.token_age_weight!r}")
        if not (_finite_nonneg(self.pace_reference) and self.pace_reference > 0):
            raise ConfigError(f"region_decay: pace_reference must be > 0, got {self.pace_reference!r}")
        if not _finite_nonneg(self.pace_exponent):
            raise ConfigError(f"region_decay: pace_exponent must be >= 0, got {self.pace_exponent!r}")
        if not isinstance(self.rare_max_count, int) or self.rare_max_count < 1:
            raise ConfigError(f"region_decay: rare_max_count must be an int >= 1, got {self.rare_max_count!r}")

    def to_dict(self) -> dict[str, Any]:
        """A plain, JSON-serializable dict (inverse of `from_dict`)."""
        d = dataclasses.asdict(self)
        d["base"], d["decay"] = dict(self.base), dict(self.decay)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RegionDecayParams:
        """Build from a dict; an unknown key raises `ConfigError` listing the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"region_decay: unknown parameter(s) {unknown}; valid: {', '.join(sorted(names))}")
        return cls(**dict(data))


def _finite_nonneg(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


class RegionDecay(EvictionPolicy):
    """MemDecay: evict the spans whose region-weighted, age-decayed score is lowest.

    For each live token ``i``:

    1. ``age_i = (1-w)·(current_turn - turn_i) + w·(n-1-i)/tokens_per_turn``
       where ``tokens_per_turn = n / distinct turns`` in the view (the pace).
    2. Refresh: if ``i``'s message contains a *rare* token id (at most
       ``rare_max_count`` uses in the view) that also occurs in
       ``view.recent``, the agent just referred back to it: ``age_i = 0``.
    3. ``score_i = base[region_i] · exp(-decay[region_i] · pace · age_i)``
       with ``pace = clip((tokens_per_turn/pace_reference)**pace_exponent, 1/4, 4)``.
    4. Spread: ``score_i = max(score_{i-k} … score_{i+k})`` (k = ``neighbours``)
       over neighbours of the same message, so the words around an important
       token (the number after "code is") survive with it.

    The newest message (and whatever follows it: the generation prompt, the
    reply being generated) is protected. With the defaults the system prompt
    (base 1000, no decay) outranks everything else at any age, so it is
    effectively pinned; tool results and tool calls (decisions) outlive user
    turns, which outlive assistant prose.

    Args:
        params: a `RegionDecayParams`; ``None`` = defaults.
        **overrides: fields of `RegionDecayParams` to change
            (``RegionDecay(neighbours=1, base={"user": 0.8})``).

    Raises:
        ConfigError: an unknown parameter or region, or an out-of-range value.
    """

    name: ClassVar[str] = "region_decay"

    def __init__(self, params: RegionDecayParams | None = None, **overrides: Any) -> None:
        base = params or RegionDecayParams()
        if overrides:
            merged = base.to_dict()
            for k, v in overrides.items():
                merged[k] = {**merged[k], **v} if k in ("base", "decay") and isinstance(v, Mapping) else v
            base = RegionDecayParams.from_dict(merged)
        self.params = base
        n_codes = max(REGION_CODE.values()) + 1
        self._base = np.zeros(n_codes, dtype=np.float64)
        self._decay = np.zeros(n_codes, dtype=np.float64)
        for region, code in REGION_CODE.items():
            self._base[code] = base.base[region]
            self._decay[code] = base.decay[region]

    def __repr__(self) -> str:
        return f"RegionDecay({self.params!r})"

    def age(self, view: LedgerView) -> np.ndarray:
        """Age of every token in (pace-normalized) turns, after refresh."""
        p = self.params
        n = view.n
        turn = view.turn.astype(np.int64, copy=False)
        age_turns = np.maximum(int(view.current_turn) - turn, 0).astype(np.float64)
        tpt = self.tokens_per_turn(view)
        age_tokens = np.arange(n - 1, -1, -1, dtype=np.float64) / tpt
        age = (1.0 - p.token_age_weight) * age_turns + p.token_age_weight * age_tokens
        if p.refresh:
            age[self.referenced(view)] = 0.0
        return age

    @staticmethod
    def tokens_per_turn(view: LedgerView) -> float:
        """The conversation pace: live tokens per distinct message in the view."""
        if view.n == 0:
            return 1.0
        return max(1.0, view.n / np.unique(view.turn).shape[0])

    def referenced(self, view: LedgerView) -> np.ndarray:
        """Tokens of older messages sharing a rare token id with ``view.recent`` (bool mask)."""
        n = view.n
        mask = np.zeros(n, dtype=bool)
        recent = np.asarray(view.recent)
        if n == 0 or recent.size == 0:
            return mask
        ids, counts = np.unique(view.tokens, return_counts=True)
        rare = ids[counts <= self.params.rare_max_count]
        hooks = np.intersect1d(rare, recent, assume_unique=False)
        if hooks.size == 0:
            return mask
        old = view.turn < view.current_turn
        hit = np.isin(view.tokens, hooks) & old
        if not hit.any():
            return mask
        return np.isin(view.turn, np.unique(view.turn[hit])) & old

    def priority(self, view: LedgerView) -> np.ndarray:
        if view.n == 0:
            return np.zeros(0, dtype=np.float64)
        p = self.params
        codes = view.regions.astype(np.intp, copy=False)
        pace = float(np.clip((self.tokens_per_turn(view) / p.pace_reference) ** p.pace_exponent, 0.25, 4.0))
        score = self._base[codes] * np.exp(-self._decay[codes] * pace * self.age(view))
        return _spread_within_message(score, view.turn, p.neighbours)

    def protected(self, view: LedgerView) -> np.ndarray:
        mask = np.zeros(view.n, dtype=bool)
        if self.params.protect_recent_turn:
            newest = np.flatnonzero(view.turn >= view.current_turn)
            if newest.size:  # the newest message and everything after it (generation glue, reply)
                mask[newest[0]:] = True
        return mask


def _spread_within_message(score: np.ndarray, turn: np.ndarray, k: int) -> np.ndarray:
    """Max-filter of half-width ``k`` that does not cross message boundaries.

    Spreading across a boundary would let the system prompt (base 1000) lift the
    first tokens of the next message, and with them the mean of that whole block.
    """
    out = score.copy()
    for d in range(1, min(k, score.shape[0] - 1) + 1):
        same = turn[d:] == turn[:-d]
        np.maximum(out[d:], np.where(same, score[:-d], -np.inf), out=out[d:])  # from the left
        np.maximum(out[:-d], np.where(same, score[d:], -np.inf), out=out[:-d])  # from the right
    return out


#: Registered policies by name.
POLICIES: dict[str, type[EvictionPolicy]] = {p.name: p for p in (RegionDecay, SlidingWindow, StreamingLLM)}

#: The policy a pool uses when none is named.
DEFAULT_POLICY = "region_decay"


def get_policy(name: str | EvictionPolicy = DEFAULT_POLICY, **params: Any) -> EvictionPolicy:
    """Build a registered policy by name (an instance is returned unchanged).

    >>> get_policy("streaming_llm", n_sink=8)
    StreamingLLM(n_sink=8)

    Raises:
        PolicyError: ``name`` is not registered (the message lists the valid names).
        ConfigError: a parameter is unknown or out of range (the message names it).
    """
    if isinstance(name, EvictionPolicy):
        if params:
            raise ConfigError(f"parameters {sorted(params)} given with a policy instance {name!r}")
        return name
    cls = POLICIES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise PolicyError(f"unknown eviction policy {name!r}; valid: {', '.join(sorted(POLICIES))}")
    try:
        return cls(**params)
    except TypeError as exc:
        if cls is RegionDecay:
            valid = sorted(f.name for f in dataclasses.fields(RegionDecayParams)) + ["params"]
        else:
            valid = sorted(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        raise ConfigError(f"{name}: bad parameters {sorted(params)}; valid: {', '.join(valid)}") from exc
