"""The one thread → asyncio bridge: blocking pool work in worker threads, its results on the event loop.

`drive_async` runs a blocking `ChatStream` (or the function that opens one, so that
rendering a long prompt happens off the loop too) in a worker thread and hands its pieces,
then its `ChatResult`, to the loop. Closing the async iterator early (a client that went
away, a cancelled task) cancels the stream, which stops at its next prefill chunk or decode
step, and waits until the worker has closed it (the agent is free again).
`call_in_thread` runs any other blocking function the same way. Both register their
thread with a `Workers` set when given one, so a shutdown can wait for them or stop them
(the pool must outlive its users).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, TypeVar

__all__ = ["Workers", "call_in_thread", "drive_async"]

logger = logging.getLogger(__name__)

_DONE = object()
_T = TypeVar("_T")


@dataclass(eq=False)
class _Run:
    """One worker thread: `stop` asks it to end, `done` says it has; `stream` is its pool stream."""

    stop: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    stream: Any = None

    def cancel(self) -> None:
        """Stop the worker: at its next piece, and inside the pool at the next prefill chunk or decode step."""
        self.stop.set()
        stream = self.stream
        if stream is not None:
            stream.cancel()


class Workers:
    """The worker threads bridges started, for a shutdown: `idle`, `cancel_all`, `wait`."""

    def __init__(self) -> None:
        self._runs: set[_Run] = set()
        self._lock = threading.Lock()

    def add(self, run: _Run) -> None:
        with self._lock:
            self._runs.add(run)

    def discard(self, run: _Run) -> None:
        with self._lock:
            self._runs.discard(run)

    @property
    def idle(self) -> bool:
        """Whether no worker runs."""
        with self._lock:
            return not self._runs

    async def shutdown(self, grace_s: float) -> None:
        """Give running workers `grace_s` seconds, then stop the rest and wait for their threads."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.idle:
                return
            await asyncio.sleep(0.05)
        with self._lock:
            runs = list(self._runs)
        if runs:
            logger.warning("cancelling %d in-flight call(s) at shutdown", len(runs))
        for r in runs:
            r.cancel()
        for r in runs:
            if not await asyncio.to_thread(r.done.wait, 30.0):
                logger.error("a worker thread did not stop within 30 s")


def _start(run: _Run, workers: Workers | None, target: Callable[[], None], name: str) -> None:
    if workers is not None:
        workers.add(run)
    threading.Thread(target=target, name=name, daemon=True).start()


async def drive_async(source: Any, *, workers: Workers | None = None,
                      name: str = "agentmem-stream") -> AsyncIterator[Any]:
    """Run a blocking stream in a worker thread: yield its pieces on the loop, then its `result`.

    Args:
        source: a `ChatStream`, or a function returning one (called in the worker).
        workers: where to register the thread (`None`: nowhere).
        name: the thread's name.

    Errors of the stream (or of opening it) are raised here.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    run = _Run()

    def put(item: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is gone (interpreter shutdown)
            run.stop.set()

    def worker() -> None:
        stream = None
        try:
            stream = run.stream = source() if callable(source) else source
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
                if workers is not None:
                    workers.discard(run)
                run.done.set()
                put(_DONE)

    _start(run, workers, worker, name)
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        if not run.done.is_set():
            run.cancel()
            await asyncio.shield(asyncio.to_thread(run.done.wait))


async def call_in_thread(fn: Callable[..., _T], *args: Any, workers: Workers | None = None,
                         name: str = "agentmem-call") -> _T:
    """`fn(*args)` in a worker thread (registered with `workers`); its value or error here.

    A cancelled await does not stop the thread; a `Workers.shutdown` still waits for it.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[_T] = loop.create_future()
    run = _Run()

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
            if workers is not None:
                workers.discard(run)
            run.done.set()
        with contextlib.suppress(RuntimeError):  # the loop is gone (interpreter shutdown)
            loop.call_soon_threadsafe(settle, value, error)

    _start(run, workers, worker, name)
    return await fut
