"""When the pool may free its native handles: calls in flight, their cancel flags, and `close`.

The model and the llama.cpp context are freed by `MemoryPool.close`, which any thread
may call at any moment, also while other threads are inside `chat` (rendering and
tokenizing a long prompt runs outside the pool lock), between two pieces of a stream, or
in a prefill. `Lifetime` makes that safe:

* every public call that touches a native handle runs inside `Lifetime.use()` (the
  `in_use` decorator); a stream's every step does too (`Lifetime.stream`). Once closing
  has begun, `use()` raises `PoolClosedError` at once;
* every call carries a `Cancel` flag that its turn checks before each prefill chunk and
  each decode step: `ChatStream.cancel` (a server client gone) sets it for one call,
  `close` for all calls, which then end with `CallCancelledError` / `PoolClosedError`;
* `close` waits (up to a timeout) until no call is inside, closes the streams left
  suspended (that frees their agents), and only then runs the pool's `finish` (save to
  the archive, free the context and the model). When calls are still inside after the
  timeout (a tokenize of a huge prompt cannot be interrupted), the last of them to
  leave runs `finish`: native handles are never freed under a running call.

Example:
    Real behaviour on the tiny test model (tests/unit/test_lifetime_faults.py): a thread
    runs `pool.chat` on `"word " * 400000`; the main thread calls `pool.close()` 50 ms
    later. `close` waits for the tokenize to return, the call fails with
    `PoolClosedError("the pool is closed")` or `ContextOverflowError`, and the process exits 0.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import weakref
from typing import Any, Callable, Iterator, TypeVar

from agentmem.engine import shared_weights
from agentmem.errors import CallCancelledError, PoolClosedError

__all__ = ["Cancel", "Lifetime", "free_handles", "free_pool", "in_use"]

logger = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])


class Cancel:
    """One call's cancel flag: set from any thread, checked by the call between native steps.

    `reason` is `"cancelled"` (the caller gave up) or `"closed"` (the pool is closing).
    """

    __slots__ = ("_event", "reason", "__weakref__")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str = "cancelled") -> None:
        """Ask the call to stop at its next prefill chunk or decode step (idempotent; first reason wins)."""
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        """Raise when set: `PoolClosedError` (closing) or `CallCancelledError` (cancelled)."""
        if self._event.is_set():
            if self.reason == "closed":
                raise PoolClosedError("the pool is closed")
            raise CallCancelledError("the call was cancelled")


class _Stream(Iterator[Any]):
    """A call's generator whose every step runs inside `Lifetime.use()`; closable from any thread."""

    def __init__(self, life: Lifetime, gen: Iterator[Any]) -> None:
        self._life = life
        self._gen = gen
        # one step or close at a time (a generator is not re-entrant); re-entrant because the last
        # step out of a closing pool closes the suspended streams, its own included
        self._lock = threading.RLock()

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> Any:
        with self._lock, self._life.use():
            return next(self._gen)

    def close(self) -> None:
        """Close the generator (runs its cleanup: the agent is released); a no-op once closed."""
        with self._lock:
            self._gen.close()  # type: ignore[attr-defined]


class Lifetime:
    """Counts the calls using the pool's native handles; `close` frees them only when none is.

    Thread-safe. One per pool.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._closing = False
        self._finish: Callable[[], None] | None = None  # set while a close waits for the last user
        self._cancels: weakref.WeakSet[Cancel] = weakref.WeakSet()
        self._streams: weakref.WeakSet[_Stream] = weakref.WeakSet()

    @property
    def closing(self) -> bool:
        """True once `close` has begun."""
        return self._closing

    @property
    def users(self) -> int:
        """Calls inside the pool right now."""
        return self._users

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        """Hold the native handles for a block.

        Raises:
            PoolClosedError: closing has begun.
        """
        with self._cond:
            if self._closing:
                raise PoolClosedError("the pool is closed")
            self._users += 1
        try:
            yield
        finally:
            finish = None
            with self._cond:
                self._users -= 1
                if not self._users:
                    self._cond.notify_all()
                    finish, self._finish = self._finish, None
            if finish is not None:  # close() gave up waiting: the last call out frees the pool
                logger.info("the last call in flight has ended; closing the pool now")
                self._finally(finish)

    def cancel_flag(self) -> Cancel:
        """A new call's `Cancel`, set by `close` along with every other call's."""
        flag = Cancel()
        with self._cond:
            if self._closing:
                raise PoolClosedError("the pool is closed")
            self._cancels.add(flag)
        return flag

    def stream(self, gen: Iterator[Any]) -> _Stream:
        """`gen` with every step inside `use()`; `close` closes it if it is left suspended."""
        s = _Stream(self, gen)
        with self._cond:
            self._streams.add(s)
        return s

    def close(self, finish: Callable[[], None], *, timeout_s: float) -> bool:
        """Refuse new calls, cancel the running ones, then run `finish` once no call is inside.

        Waits up to `timeout_s` seconds for the calls inside to leave (each stops at its
        next prefill chunk or decode step; a tokenize runs to its end). Returns True when
        `finish` ran here; False when calls were still inside at the timeout: the last one
        to leave runs it.
        """
        with self._cond:
            if self._closing:
                return False
            self._closing = True
            cancels = list(self._cancels)
        for c in cancels:
            c.set("closed")
        with self._cond:
            if not self._cond.wait_for(lambda: self._users == 0, timeout=timeout_s):
                logger.warning("close(): %d call(s) still running after %.1f s; the pool is freed when they end",
                               self._users, timeout_s)
                self._finish = finish
                return False
        self._finally(finish)
        return True

    def _finally(self, finish: Callable[[], None]) -> None:
        """Close the suspended streams (freeing their agents), then `finish` (no call is inside)."""
        with self._cond:
            streams = list(self._streams)
        for s in streams:
            try:
                s.close()
            except Exception:  # a stream's cleanup must not stop the pool from closing
                logger.exception("closing a suspended stream failed")
        finish()


def in_use(method: _F) -> _F:
    """Decorate a `MemoryPool` method that touches native handles: it runs inside `self._life.use()`."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._life.use():
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def free_pool(core: Any, prefetcher: Any, mover: Any, executor: Any) -> None:
    """`MemoryPool.close`'s work once no call is inside: store the agents, then free archive, context, model.

    Args:
        core: the pool's `PoolCore`.
        prefetcher: its `Prefetcher` (stopped first: it restores agents in the background).
        mover: its `Mover` (`save_all(final=True)` parks resident agents in the archive).
        executor: the thread pool of the async calls (shut down, queued work cancelled).
    """
    try:
        prefetcher.stop()
        if core.archive is not None:
            failed = mover.save_all(final=True)
            if failed:
                logger.error("could not save %d agent(s) to %s on close: %s", len(failed), core.config.archive_path, failed)
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        with core.lock:  # a prefetch restore that outlived prefetcher.stop's wait holds it
            free_handles(core)


def free_handles(core: Any) -> None:
    """Close the archive, the recall store and the context, and give the weights back (under `core.lock`).

    Also what a pool that fails while it is being built frees (`MemoryPool.__init__`).
    """
    if core.archive is not None:
        core.archive.close()
    if core.recall_store is not core.archive:
        core.recall_store.close()
    core.ctx.close()
    shared_weights.release(core.model)  # frees the weights unless another pool holds them
