"""Which agent is expected next: the workflow hints, else the order calls came in before.

`expect(order)` sets the expected order (each item an agent id or a list of
alternatives, as `MemoryPool.expect`); every call takes its agent off the front. With
no hint left, the *predictor* answers: the agent that followed the last caller the
last two times it was called (a round-robin team or a fixed pipeline is learned after
two rounds; a model swap is too dear to bet on one observation). The model pool prefetches the model of `next_agent()` and ranks models for
unloading by `next_step` (hinted steps only: a prediction never protects a model).

>>> w = Workflow()
>>> w.expect(["a", ["b", "c"], "d"])
>>> w.next_agent(), w.next_step(lambda agent: agent == "d")
('a', 3)
>>> w.called("a"); w.called("b"); w.next_agent()
'd'
>>> w.called("d"); w.called("a"); w.next_agent() is None   # no hints; "b" followed "a" once
True
>>> w.called("b"); w.called("d"); w.called("a"); w.next_agent()   # twice now
'b'
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

__all__ = ["Workflow"]

_MAX_SUCCESSORS = 65536  # the predictor's table is bounded (oldest dropped)


class Workflow:
    """Expected order plus a successor predictor; thread-safe."""

    def __init__(self) -> None:
        self._order: list[list[str]] = []
        self._next: dict[str, tuple[str, int]] = {}  # agent -> (its last successor, times in a row)
        self._last: str | None = None
        self._lock = threading.Lock()
        self.hinted = self.predicted = 0

    def expect(self, items: Sequence[str | Sequence[str]]) -> None:
        """Replace the expected order."""
        seen: set[str] = set()
        groups = []
        for item in items:
            g = [x for x in dict.fromkeys([item] if isinstance(item, str) else item) if isinstance(x, str) and x not in seen]
            seen.update(g)
            if g:
                groups.append(g)
        with self._lock:
            self._order = groups

    def called(self, agent_id: str) -> None:
        """`agent_id` was called: it leaves the front of the order; the predictor learns the step."""
        with self._lock:
            for i, g in enumerate(self._order):
                if agent_id in g:
                    del self._order[: i + 1]
                    break
            if self._last is not None and self._last != agent_id:
                prev, n = self._next.pop(self._last, (None, 0))
                self._next[self._last] = (agent_id, n + 1 if prev == agent_id else 1)
                if len(self._next) > _MAX_SUCCESSORS:
                    self._next.pop(next(iter(self._next)))
            self._last = agent_id

    def next_agent(self) -> str | None:
        """The agent expected next: the first hinted one, else the predicted successor of the last call."""
        with self._lock:
            if self._order:
                self.hinted += 1
                return self._order[0][0]
            agent, n = self._next.get(self._last, (None, 0)) if self._last is not None else (None, 0)
            if agent is None or n < 2:
                return None
            self.predicted += 1
            return agent

    def next_step(self, wanted: Callable[[str], bool]) -> int | None:
        """How many hinted calls ahead the first agent `wanted` accepts is (1 = next), `None`: not hinted."""
        with self._lock:
            for i, g in enumerate(self._order):
                if any(wanted(a) for a in g):
                    return i + 1
        return None

    def order(self, wanted: Callable[[str], bool]) -> list[list[str]]:
        """The hinted order restricted to the agents `wanted` accepts (for one model's `MemoryPool.expect`)."""
        with self._lock:
            return [k for k in ([a for a in g if wanted(a)] for g in self._order) if k]

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"expected": sum(len(g) for g in self._order), "hinted_next": self.hinted,
                    "predicted_next": self.predicted}
