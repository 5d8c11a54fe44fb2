"""Predicting which agent runs next, from the order of past calls.

`TransitionPredictor` learns a first-order transition table online
(``counts[previous][next]``). That captures round-robin teams, a selector that
alternates with workers, and fixed pipelines. ``predict(after)`` returns the most
likely next agent once a transition has been seen at least ``min_count`` times
and is the majority; ``distance(agent, after)`` estimates how many calls away an
agent's next use is (used by the cost placement policy).

>>> p = TransitionPredictor()
>>> for a in "abcabcab":
...     p.observe(a)
>>> p.predict("b"), p.predict("c")
('c', 'a')
>>> p.distance("a", after="b")
2.0
"""

from __future__ import annotations

import math
from collections import defaultdict

__all__ = ["TransitionPredictor"]


class TransitionPredictor:
    """Online first-order model of the agent call order."""

    def __init__(self, *, min_count: int = 2) -> None:
        self.min_count = min_count
        self._counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._last: str | None = None

    def observe(self, agent_id: str) -> None:
        """Record that ``agent_id`` was called."""
        if self._last is not None:
            self._counts[self._last][agent_id] += 1
        self._last = agent_id

    def forget(self, agent_id: str) -> None:
        self._counts.pop(agent_id, None)
        for row in self._counts.values():
            row.pop(agent_id, None)
        if self._last == agent_id:
            self._last = None

    def predict(self, after: str | None = None) -> str | None:
        """The most likely agent after ``after`` (default: the last one called)."""
        row = self._counts.get(after if after is not None else self._last or "")
        if not row:
            return None
        best, n = max(row.items(), key=lambda kv: (kv[1], kv[0]))
        total = sum(row.values())
        return best if n >= self.min_count and 2 * n > total else None

    def distance(self, agent_id: str, after: str | None = None, *, horizon: int = 16) -> float:
        """Predicted calls until ``agent_id`` runs (1 = next), following the likeliest chain."""
        cur = after if after is not None else self._last
        seen = set()
        for step in range(1, horizon + 1):
            nxt = self.predict(cur) if cur is not None else None
            if nxt is None or nxt in seen:
                return math.inf
            if nxt == agent_id:
                return float(step)
            seen.add(nxt)
            cur = nxt
        return math.inf
