"""Housekeeping after a call: tier rebalancing and restoring the predicted next agent.

`Prefetcher` runs a background worker fed from a queue: after every call it
rebalances the tiers (so demotion I/O is off the reply's path) and restores the
agent expected next — the first of the workflow's hints (`MemoryPool.expect`)
when there are any (at a branch, the predictor's guess among its alternatives),
else the transition predictor's guess — if a sequence can
be had without making a waiting call wait longer. `prefetch` queues restores
asked for directly (`expect(soon=True)`, `hold` of a parked agent). Without the worker (one resident agent, or
`prefetch=False`), rebalancing runs inline after the call.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Sequence

from agentmem.pool.hints import Hints
from agentmem.pool.state import AgentState, PoolCore

__all__ = ["Prefetcher"]

logger = logging.getLogger(__name__)

_REBALANCE = object()  # work item of the worker: rebalance the tiers (never an agent id)
_STOP = object()


class Prefetcher:
    """The after-call worker.

    Args:
        core: the pool's shared state.
        rebalance: applies the tier budgets (lock held).
        restore: makes an agent resident for a prefetch; returns True when it
            restored a parked state (lock held; never waits).
        enabled: start the worker thread (else rebalancing runs inline).
        hints: the workflow's hints; their expected order replaces the predictor's guess.
    """

    def __init__(
        self,
        core: PoolCore,
        *,
        rebalance: Callable[[], None],
        restore: Callable[[AgentState], bool],
        enabled: bool,
        hints: Hints | None = None,
    ) -> None:
        self.core = core
        self.hints = hints
        self._rebalance = rebalance
        self._restore = restore
        self.queue: queue.Queue[object] | None = None
        self._thread: threading.Thread | None = None
        if enabled:
            self.queue = queue.Queue()
            self._thread = threading.Thread(target=self._work, name="agentmem-prefetch", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        """True when the background worker runs."""
        return self.queue is not None

    def after_call(self, agent_id: str) -> None:
        """Housekeeping off the reply's path: rebalance tiers, prefetch the predicted next agent."""
        core = self.core
        if self.queue is None:
            with core.lock:
                if not core.closed:
                    self._rebalance()
            return
        self.queue.put(_REBALANCE)
        nxt = self.next_agent(agent_id)
        if nxt is not None and nxt != agent_id:
            self.queue.put(nxt)

    def next_agent(self, agent_id: str) -> str | None:
        """The agent to restore after a call of `agent_id`, or None.

        Under hints: the first expected agent when it is certain; when a branch comes
        first, the predictor's guess only if it is one of the branch's alternatives
        (the graph names the candidates, the learned transitions pick one). Without
        hints: the predictor's guess.
        """
        hints = self.hints
        if hints is None or not hints.active:  # reads of the hints' lists: no lock needed
            return self.core.predictor.predict(agent_id)
        upcoming = hints.upcoming(1)
        if upcoming:
            return upcoming[0]
        guess = self.core.predictor.predict(agent_id)
        return guess if guess is not None and hints.step_index(guess) == 0 else None

    def prefetch(self, agent_ids: Sequence[str]) -> None:
        """Queue restores of `agent_ids`, in order (no-op without the worker)."""
        if self.queue is not None:
            for x in agent_ids:
                self.queue.put(x)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the worker (after the work already queued)."""
        if self.queue is not None and self._thread is not None:
            self.queue.put(_STOP)
            self._thread.join(timeout=timeout)

    def _work(self) -> None:
        assert self.queue is not None
        core = self.core
        while True:
            item = self.queue.get()
            try:
                if item is _STOP or core.closed:
                    return
                with core.lock:
                    if item is _REBALANCE:
                        self._rebalance()
                        continue
                    assert isinstance(item, str)
                    a = core.agents.get(item)
                    if a is None or a.held or a.seq is not None or a.tier not in core.tiers:
                        continue
                    if self._restore(a):
                        a.prefetched = True
                        core.totals["prefetches"] += 1
            except Exception:  # never let the worker die; the call itself will restore
                logger.exception("prefetch of %r failed", item)
            finally:
                self.queue.task_done()
