"""`ModelLease`: one use of a loaded model, held loaded (never unloaded) until it is released.

`MemoryPool.chat` holds its model this way for the length of a call; `MemoryPool.lease`
hands the same hold to code that drives the model's `ModelEngine` itself (the HTTP
server's calls, a listing that reads a loaded model's stats).

>>> lease = ModelLease(name="planner", pool=None)
>>> lease.release(); lease.release()   # idempotent
>>> lease.released
True
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["ModelLease"]


@dataclass(eq=False)
class ModelLease:
    """A model held loaded for one use; `release` (idempotent, thread-safe) ends the hold.

    Attributes:
        name: the model's name in its `MemoryPool` (what requests call it).
        pool: the model's open `ModelEngine`; valid until `release`.
        agent_id: the agent whose call the lease serves (`None`: a use without an agent,
            such as a conversation-line lookup before its agent is known); with one, the
            release counts as that agent's call for the model pool's workflow predictor.
    """

    name: str
    pool: Any
    agent_id: str | None = None
    end: Callable[[ModelLease], None] | None = field(default=None, repr=False)
    released: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def release(self) -> None:
        """End the hold (the model may be unloaded once nothing else uses it)."""
        with self._lock:
            if self.released:
                return
            self.released = True
        if self.end is not None:
            self.end(self)

    def __enter__(self) -> ModelLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
