"""Which loaded model to unload when another one needs the memory: small strategy objects.

The rule is the KV placement's rule (`agentmem.policy.placement`), one level up: a
model's *keep value* is what unloading it would cost — the seconds its reload takes —
times how likely it is to be needed next. The lowest keep value goes first.

* `CostUnload` (default): likelihood from the workflow hints (a model whose agent is
  expected `k` steps ahead: `1 / k`) and, without hints, from recency (halving every
  `half_life_s` since its last call).
* `LruUnload`: the least recently used model first (llama-server's router rule).

>>> from agentmem.models.policy import SlotView, unload_policy
>>> views = [SlotView("coder", reload_s=1.2, idle_s=5.0, next_step=None),
...          SlotView("planner", reload_s=0.4, idle_s=1.0, next_step=1)]
>>> unload_policy("cost").order(views)
['coder', 'planner']
>>> unload_policy("lru").order(views)
['coder', 'planner']
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from agentmem.errors import PolicyError

__all__ = ["CostUnload", "LruUnload", "SlotView", "UNLOAD_POLICIES", "UnloadPolicy", "unload_policy"]


@dataclass(frozen=True)
class SlotView:
    """What a policy may read of one loaded, idle model.

    Attributes:
        name: the model's name.
        reload_s: what loading it again is expected to take (its last measured load).
        idle_s: seconds since its last call ended.
        next_step: how many expected calls ahead one of its agents is (1 = the next
            call), `None` when no hint names one.
    """

    name: str
    reload_s: float
    idle_s: float
    next_step: int | None


class UnloadPolicy(Protocol):
    """Orders idle loaded models, first to unload first."""

    name: str

    def order(self, views: Sequence[SlotView]) -> list[str]: ...


@dataclass(frozen=True)
class CostUnload:
    """Reload time × likelihood of next use; lowest first (ties: longest idle first)."""

    half_life_s: float = 30.0
    name: str = "cost"

    def keep_value(self, v: SlotView) -> float:
        if v.next_step is not None:
            likely = 1.0 / max(1, v.next_step)
        else:  # no hint: recency, at most half as likely as the furthest hinted model
            likely = 0.5 * 0.5 ** (max(0.0, v.idle_s) / self.half_life_s) / 64
        return max(v.reload_s, 1e-3) * likely

    def order(self, views: Sequence[SlotView]) -> list[str]:
        return [v.name for v in sorted(views, key=lambda v: (self.keep_value(v), -v.idle_s, v.name))]


@dataclass(frozen=True)
class LruUnload:
    """The least recently used first."""

    name: str = "lru"

    def order(self, views: Sequence[SlotView]) -> list[str]:
        return [v.name for v in sorted(views, key=lambda v: (-v.idle_s, v.name))]


UNLOAD_POLICIES = ("cost", "lru")


def unload_policy(name: str) -> UnloadPolicy:
    """The unload policy called `name` (`cost` or `lru`)."""
    if name == "cost":
        return CostUnload()
    if name == "lru":
        return LruUnload()
    raise PolicyError(f"unknown unload policy {name!r}; valid: {', '.join(UNLOAD_POLICIES)}")
