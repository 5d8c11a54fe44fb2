"""The request/agent queue: who may run now, one call per agent, pool work in worker threads.

* `admit` hands a principal a `Lease` or refuses at once: 429 when the key has
  `max_concurrent` requests in flight or has used up its `max_requests_per_minute` (a token
  bucket: that many at once, refilled evenly over a minute; `Retry-After` says when the next
  one is due), 503 while the server is shutting down. Routes admit before any work (#33 F1).
* `turns` (`agentmem.calls.AgentTurns`) holds an agent for one call: the calls of one
  agent run one after the other (they continue one KV sequence); calls of different agents
  run concurrently and the pool batches their decode steps. Waiting costs no thread.
* `stream` and `call` run pool work in worker threads through the one bridge
  (`agentmem.pool.bridge`), registered in `workers`: closing a stream early (a client that
  disconnects) cancels the pool call at its next prefill chunk or decode step.
* `shutdown` refuses new requests, lets running streams and calls finish for a grace
  period, stops the rest and waits for their threads, so the pool can then close safely.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, AsyncContextManager, AsyncIterator, Callable, TypeVar

from agentmem.calls import AgentTurns
from agentmem.pool import ChatResult, ChatStream
from agentmem.pool.bridge import Workers, call_in_thread, drive_async
from agentmem.server.auth import Principal
from agentmem.server.http_errors import ApiError

__all__ = ["AgentQueue", "Lease"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(eq=False)
class Lease:
    """One admitted request of a principal; `release` (idempotent) frees its slot, then runs `then`'s callbacks.

    A route takes its lease first, before it converts, renders or looks anything up
    (#33 F1: work before admission let one key stall the others), and hands it on:
    whatever the request holds later (a quota reservation, a line claim, a model lease)
    is added with `then` and ends with it.
    """

    queue: AgentQueue
    principal: Principal
    released: bool = False
    after: list[Callable[[], None]] = field(default_factory=list)

    def then(self, end: Callable[[], None]) -> None:
        """Run `end` when the lease is released (at once when it already was)."""
        if self.released:
            end()
        else:
            self.after.append(end)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.queue._release(self.principal)
            ends, self.after = self.after, []
            for end in reversed(ends):
                end()


class AgentQueue:
    """Admission, per-agent ordering and the worker threads of pool streams.

    Args:
        default_limit: requests a principal may have in flight unless its key sets
            `max_concurrent`.
        default_rate: requests a principal may start per minute unless its key sets
            `max_requests_per_minute` (`0`: no limit).
    """

    def __init__(self, *, default_limit: int, default_rate: int = 0) -> None:
        self.default_limit, self.default_rate = default_limit, default_rate
        self._in_flight: dict[str, int] = {}
        self._buckets: dict[str, tuple[float, float]] = {}  # key name -> (tokens, when counted)
        self.turns = AgentTurns()
        self.workers = Workers()
        self.closing = False

    # ------------------------------------------------------------------ admission
    def admit(self, principal: Principal) -> Lease:
        """A slot for one request of `principal`.

        Raises:
            ApiError: 503 while shutting down; 429 when the principal is at its limit.
        """
        if self.closing:
            raise ApiError(503, "the server is shutting down", code="unavailable")
        limit = principal.max_concurrent or self.default_limit
        n = self._in_flight.get(principal.name, 0)
        if n >= limit:
            raise ApiError(429, f"too many concurrent requests for this API key (limit {limit})", code="rate_limit_exceeded")
        self._spend(principal)
        self._in_flight[principal.name] = n + 1
        return Lease(self, principal)

    def _spend(self, principal: Principal) -> None:
        """Take one request from the key's per-minute bucket (429 with `Retry-After` when it is empty)."""
        rate = principal.max_requests_per_minute or self.default_rate
        if not rate:
            return
        now = time.monotonic()
        tokens, then = self._buckets.get(principal.name, (float(rate), now))
        tokens = min(float(rate), tokens + (now - then) * rate / 60.0)
        if tokens < 1.0:
            wait = math.ceil((1.0 - tokens) * 60.0 / rate)
            raise ApiError(429, f"this API key may start at most {rate} requests per minute; retry in {wait} s",
                           code="rate_limit_exceeded", param="max_requests_per_minute",
                           headers={"Retry-After": str(wait)})
        self._buckets[principal.name] = (tokens - 1.0, now)

    def _release(self, principal: Principal) -> None:
        n = self._in_flight.get(principal.name, 0) - 1
        if n > 0:
            self._in_flight[principal.name] = n
        else:
            self._in_flight.pop(principal.name, None)

    @property
    def in_flight(self) -> int:
        """Admitted requests not yet finished."""
        return sum(self._in_flight.values())

    # ------------------------------------------------------------------ per agent
    @property
    def waiting(self) -> int:
        """Requests waiting for their agent (another call of it is running)."""
        return self.turns.waiting

    def agent(self, agent_id: str) -> AsyncContextManager[None]:
        """Hold `agent_id` for one call (waits while another call of it runs)."""
        return self.turns.ahold(agent_id)

    # ------------------------------------------------------------------ worker threads
    def stream(self, open_stream: Callable[[], ChatStream]) -> AsyncIterator[str | ChatResult]:
        """Run the stream `open_stream()` builds in a worker thread; yield its pieces, then its result.

        `open_stream` runs in the worker too (rendering a long prompt is blocking work).
        Errors of the stream are raised here.
        """
        return drive_async(open_stream, workers=self.workers, name="agentmem-serve")

    async def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` in a worker thread that `shutdown` waits for (the pool must outlive it)."""
        return await call_in_thread(fn, *args, workers=self.workers)

    # ------------------------------------------------------------------ shutdown
    async def shutdown(self, grace_s: float) -> None:
        """Refuse new requests, give running streams `grace_s` seconds, stop the rest, wait for their threads."""
        self.closing = True
        await self.workers.shutdown(grace_s)
