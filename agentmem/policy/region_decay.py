"""`region_decay`: MemDecay's region-aware scoring as an eviction policy.

Each token's keep priority is its region's base score decaying with age (in
turns), spread to its neighbours within a message, refreshed when later text
references it, with the decay adapted to the conversation's pace.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

import numpy as np

# np.unique imports numpy.ma on its first call (16 ms here): import it now so the
# first eviction pass of a process does not pay it on a reply's path
import numpy.ma  # noqa: F401

from agentmem.errors import ConfigError
from agentmem.policy.view import REGION_CODE, LedgerView
from agentmem.policy.eviction_base import EvictionPolicy

__all__ = ["RegionDecay", "RegionDecayParams"]

logger = logging.getLogger(__name__)

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
