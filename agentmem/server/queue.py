"""The request/agent queue: who may run now, one call per agent, pool streams in worker threads.

* `admit` hands a principal a `Lease` or refuses at once: 429 when the key has
  `max_concurrent` requests in flight, 503 while the server is shutting down.
* `agent` is an asyncio lock per agent: the calls of one agent run one after the other
  (they continue one KV sequence); calls of different agents run concurrently and the
  pool batches their decode steps. Waiting for it costs no thread.
* `stream` runs a blocking `ChatStream` in a thread of its own and hands its pieces to
  the event loop, so the loop never blocks. Closing the async iterator (a client that
  disconnects, a cancelled request) cancels the pool call, which stops at its next
  prefill chunk or decode step (`ChatStream.cancel`), and closes the stream, which frees
  the agent in the pool.
* `call` runs any other blocking pool work (counting a prompt's tokens, a commit, an
  agent operation) in a thread that `shutdown` waits for, like a stream's.
* `shutdown` refuses new requests, lets running streams and calls finish for a grace
  period, stops the rest and waits for their threads, so the pool can then close safely.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, TypeVar

from agentmem.pool import ChatResult, ChatStream
from agentmem.server.auth import Principal
from agentmem.server.http_errors import ApiError

__all__ = ["AgentQueue", "Lease"]

logger = logging.getLogger(__name__)

_DONE = object()
_T = TypeVar("_T")


@dataclass(eq=False)
class Lease:
    """One admitted request of a principal; `release` (idempotent) frees its slot."""

    queue: AgentQueue
    principal: Principal
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.queue._release(self.principal)


@dataclass(eq=False)
class _Run:
    """One worker thread: `stop` asks it to end, `done` says it has; `stream` is its pool stream."""

    stop: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    stream: ChatStream | None = None

    def cancel(self) -> None:
        """Stop the worker: at its next piece, and inside the pool at the next prefill chunk or decode step."""
        self.stop.set()
        stream = self.stream
        if stream is not None:
            stream.cancel()


class AgentQueue:
    """Admission, per-agent ordering and the worker threads of pool streams.

    Args:
        default_limit: requests a principal may have in flight unless its key sets
            `max_concurrent`.
    """

    def __init__(self, *, default_limit: int) -> None:
        self.default_limit = default_limit
        self._in_flight: dict[str, int] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._runs: set[_Run] = set()
        self._runs_lock = threading.Lock()
        self.closing = False
        self.waiting = 0
        """Requests waiting for their agent (another call of it is running)."""

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
        self._in_flight[principal.name] = n + 1
        return Lease(self, principal)

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
    @contextlib.asynccontextmanager
    async def agent(self, agent_id: str) -> AsyncIterator[None]:
        """Hold `agent_id` for one call (waits while another call of it runs)."""
        lock, users = self._locks.get(agent_id) or (asyncio.Lock(), 0)
        self._locks[agent_id] = (lock, users + 1)
        waited = lock.locked()
        self.waiting += waited
        try:
            async with lock:
                if waited:
                    self.waiting -= 1
                    waited = False
                yield
        finally:
            if waited:
                self.waiting -= 1
            lock, users = self._locks[agent_id]
            if users <= 1:
                del self._locks[agent_id]
            else:
                self._locks[agent_id] = (lock, users - 1)

    # ------------------------------------------------------------------ streams
    async def stream(self, open_stream: Callable[[], ChatStream]) -> AsyncIterator[str | ChatResult]:
        """Run the stream `open_stream()` builds in a worker thread; yield its pieces, then its result.

        `open_stream` runs in the worker too (rendering a long prompt is blocking work).
        Errors of the stream are raised here.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        run = _Run()
        with self._runs_lock:
            self._runs.add(run)

        def put(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is gone (interpreter shutdown)
                run.stop.set()

        def worker() -> None:
            stream: ChatStream | None = None
            try:
                stream = run.stream = open_stream()
                if run.stop.is_set():  # cancelled while the prompt was rendered
                    stream.cancel()
                for piece in stream:
                    if run.stop.is_set():
                        break
                    put(piece)
                else:
                    if stream.result is not None:
                        put(stream.result)
            except BaseException as exc:  # every error goes to the consumer
                put(exc)
            finally:
                try:
                    if stream is not None:
                        stream.close()  # frees the agent in the pool
                finally:
                    with self._runs_lock:
                        self._runs.discard(run)
                    run.done.set()
                    put(_DONE)

        threading.Thread(target=worker, name="agentmem-serve", daemon=True).start()
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            run.cancel()

    async def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` in a worker thread that `shutdown` waits for (the pool must outlive it).

        A cancelled await does not stop the thread; `shutdown` still waits for it.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[_T] = loop.create_future()
        run = _Run()
        with self._runs_lock:
            self._runs.add(run)

        def settle(value: Any, exc: BaseException | None) -> None:
            if not fut.done():
                fut.set_exception(exc) if exc is not None else fut.set_result(value)

        def worker() -> None:
            value: Any = None
            error: BaseException | None = None
            try:
                value = fn(*args)
            except BaseException as exc:  # every error goes to the awaiting task
                error = exc
            finally:
                with self._runs_lock:
                    self._runs.discard(run)
                run.done.set()
            with contextlib.suppress(RuntimeError):  # the loop is gone (interpreter shutdown)
                loop.call_soon_threadsafe(settle, value, error)

        threading.Thread(target=worker, name="agentmem-call", daemon=True).start()
        return await fut

    # ------------------------------------------------------------------ shutdown
    async def shutdown(self, grace_s: float) -> None:
        """Refuse new requests, give running streams `grace_s` seconds, stop the rest, wait for their threads."""
        self.closing = True
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            with self._runs_lock:
                if not self._runs:
                    return
            await asyncio.sleep(0.05)
        with self._runs_lock:
            runs = list(self._runs)
        if runs:
            logger.warning("cancelling %d in-flight request(s) at shutdown", len(runs))
        for r in runs:
            r.cancel()
        for r in runs:
            if not await asyncio.to_thread(r.done.wait, 30.0):
                logger.error("a worker thread did not stop within 30 s")
