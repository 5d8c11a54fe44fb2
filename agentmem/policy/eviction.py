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

| name | keeps |
|---|---|
| `sliding_window` | the first `n_keep` tokens (default: the leading system span) and the most recent ones |
| `streaming_llm` | `n_sink` attention-sink tokens (default 4) and the most recent ones (StreamingLLM, Xiao et al. 2023) |
| `region_decay` | MemDecay: per-region base score decaying with age, importance spread to neighbours, refresh by reference, pace-adaptive decay (the default, see `RegionDecay`, in `agentmem.policy.region_decay`) |

Examples:
    >>> import numpy as np
    >>> from agentmem.policy.view import LedgerView
    >>> n = 100
    >>> view = LedgerView(tokens=np.arange(n, dtype=np.int32), regions=np.full(n, 2, np.uint8),
    ...                   pinned=np.zeros(n, bool), turn=np.repeat(np.arange(10, dtype=np.int32), 10),
    ...                   current_turn=9, recent=np.zeros(0, np.int32))
    >>> get_policy("streaming_llm").select(view, target=60, block=16)
    [(4, 48)]

    (40 tokens had to go; whole blocks `[4, 16)`, `[16, 32)`, `[32, 48)`
    went — 44 — and touching blocks are returned as one range.)
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

# np.unique imports numpy.ma on its first call (16 ms here): import it now so the
# first eviction pass of a process does not pay it on a reply's path
import numpy.ma  # noqa: F401

from agentmem.errors import ConfigError, PolicyError
from agentmem.policy.view import LedgerView
from agentmem.policy.eviction_base import EvictionPolicy, _leading_system
from agentmem.policy.region_decay import RegionDecay, RegionDecayParams

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
