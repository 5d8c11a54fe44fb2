"""`AgentTurns`: one protocol call at a time per agent, for threads and coroutines alike.

A call may run several pool generations (a retry, a write-back); they continue one KV
sequence, so two calls of one agent must not interleave. `hold` (a thread) and `ahold`
(a coroutine, waiting without a thread and without polling) share one first-come queue
per agent; calls of different agents never wait for each other. `turns_for(pool)` is the
process-wide serializer of a pool, shared by every front-end on it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import weakref
from typing import Any, AsyncIterator, Iterator

__all__ = ["AgentTurns", "turns_for"]


class _Waiter:
    """One waiting caller: a thread (an `Event`) or a coroutine (a future on its loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.event = threading.Event() if loop is None else None
        self.future: asyncio.Future[None] | None = loop.create_future() if loop is not None else None

    def wake(self) -> None:
        if self.event is not None:
            self.event.set()
            return
        assert self.loop is not None and self.future is not None
        fut = self.future
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            self.loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))


class AgentTurns:
    """Per-agent turns: `hold(agent)` / `ahold(agent)` wait while another call of it runs.

    Attributes:
        waiting: callers waiting for their agent right now.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._busy: set[str] = set()
        self._queues: dict[str, collections.deque[_Waiter]] = {}
        self.waiting = 0

    def busy(self, agent_id: str) -> bool:
        """Whether a call of `agent_id` holds its turn."""
        return agent_id in self._busy

    def _take(self, agent_id: str, waiter: _Waiter) -> bool:
        """Take the turn now (True) or queue `waiter` (False)."""
        with self._guard:
            if agent_id not in self._busy:
                self._busy.add(agent_id)
                return True
            self._queues.setdefault(agent_id, collections.deque()).append(waiter)
            self.waiting += 1
            return False

    def _give(self, agent_id: str) -> None:
        """End a turn: hand it to the next waiter (first come), else free the agent."""
        with self._guard:
            queue = self._queues.get(agent_id)
            if queue:
                nxt = queue.popleft()
                self.waiting -= 1
                if not queue:
                    del self._queues[agent_id]
                nxt.wake()  # the turn passes on; the agent stays busy
                return
            self._busy.discard(agent_id)

    def _withdraw(self, agent_id: str, waiter: _Waiter) -> bool:
        """Leave the queue (a cancelled coroutine); False when the turn was handed to it meanwhile."""
        with self._guard:
            queue = self._queues.get(agent_id)
            if queue is None or waiter not in queue:
                return False
            queue.remove(waiter)
            self.waiting -= 1
            if not queue:
                del self._queues[agent_id]
            return True

    @contextlib.contextmanager
    def hold(self, agent_id: str) -> Iterator[None]:
        """Hold `agent_id`'s turn in this thread for the block (waits for calls before it)."""
        waiter = _Waiter(None)
        if not self._take(agent_id, waiter):
            assert waiter.event is not None
            waiter.event.wait()
        try:
            yield
        finally:
            self._give(agent_id)

    @contextlib.asynccontextmanager
    async def ahold(self, agent_id: str) -> AsyncIterator[None]:
        """`hold` for a coroutine: waits on the loop; a cancelled waiter never keeps the turn."""
        waiter = _Waiter(asyncio.get_running_loop())
        if not self._take(agent_id, waiter):
            assert waiter.future is not None
            try:
                await waiter.future
            except BaseException:
                if not self._withdraw(agent_id, waiter):
                    self._give(agent_id)  # handed over while it was cancelled: pass it on
                raise
        try:
            yield
        finally:
            self._give(agent_id)


_by_pool: weakref.WeakKeyDictionary[Any, AgentTurns] = weakref.WeakKeyDictionary()
_by_pool_guard = threading.Lock()


def turns_for(pool: Any) -> AgentTurns:
    """The process-wide `AgentTurns` of `pool` (one per pool object, dropped with it)."""
    with _by_pool_guard:
        turns = _by_pool.get(pool)
        if turns is None:
            turns = _by_pool[pool] = AgentTurns()
        return turns
