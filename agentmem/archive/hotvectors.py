"""Hot partitions: the span vectors of recent and pinned agents, held in RAM.

`HotVectors` is a byte-bounded LRU of per-(agent, embedder) matrices. The archive
(`VectorsMixin.search_vectors`) scores a hot agent's query against its matrix
without reading a single vector from the database; a cold agent's vectors are read
once and kept, evicting the least recently searched unpinned agents when the budget
is exceeded. A pinned agent (`pin`) is evicted only after every unpinned one.

Every write of an agent's vectors and every deletion of the agent drops its
partitions (`invalidate`), so a search never sees a stale matrix in this process.
Where other processes write the same archive (PostgreSQL replicas), the archive
also compares a cheap `(count, max span id)` token of the agent's rows before
trusting a cached matrix.

>>> import numpy as np
>>> hot = HotVectors(max_bytes=64)
>>> hot.put("a", "toy", np.array([1, 2]), np.eye(2, dtype=np.float32), token=None)
True
>>> hot.get("a", "toy") is not None, hot.get("b", "toy"), hot.stats()["hits"], hot.stats()["misses"]
(True, None, 1, 1)
>>> hot.invalidate("a"); hot.get("a", "toy") is None
True
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentmem.errors import ConfigError

__all__ = ["HOT_VECTOR_BYTES", "HotPartition", "HotVectors"]

HOT_VECTOR_BYTES = 64 * 1024 * 1024
"""The default RAM budget of hot partitions: 64 MiB, about 43k MiniLM (384-d) vectors."""


@dataclass(frozen=True)
class HotPartition:
    """One agent's vectors of one embedder: span ids, their unit rows, and the rows' token."""

    ids: np.ndarray
    matrix: np.ndarray
    token: Any

    @property
    def nbytes(self) -> int:
        """RAM the partition holds."""
        return int(self.ids.nbytes + self.matrix.nbytes)


class HotVectors:
    """A byte-bounded LRU of `HotPartition`s keyed by `(agent_id, model)`; thread-safe.

    Args:
        max_bytes: the budget; 0 keeps nothing (every search reads the archive).
    """

    def __init__(self, *, max_bytes: int = HOT_VECTOR_BYTES) -> None:
        self._lock = threading.Lock()
        self._parts: OrderedDict[tuple[str, str], HotPartition] = OrderedDict()
        self._pinned: set[str] = set()
        self._bytes = 0
        self.max_bytes = 0
        self.hits = 0
        self.misses = 0
        self.resize(max_bytes=max_bytes)

    def resize(self, *, max_bytes: int) -> None:
        """Change the budget (evicting what no longer fits).

        Raises:
            ConfigError: `max_bytes` is negative or not an int.
        """
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
            raise ConfigError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
        with self._lock:
            self.max_bytes = max_bytes
            self._shrink()

    def pin(self, agent_id: str, pinned: bool = True) -> None:
        """Keep `agent_id`'s partitions in RAM ahead of unpinned ones (`pinned=False` unpins)."""
        with self._lock:
            (self._pinned.add if pinned else self._pinned.discard)(agent_id)

    def get(self, agent_id: str, model: str, *, token: Any = None) -> HotPartition | None:
        """The cached partition (counted as a hit, made most recent), or `None` (a miss).

        A partition cached with another `token` (the archive's rows changed since) is dropped: a miss.
        """
        with self._lock:
            part = self._parts.get((agent_id, model))
            if part is not None and part.token != token:
                self._drop((agent_id, model))
                part = None
            if part is None:
                self.misses += 1
                return None
            self._parts.move_to_end((agent_id, model))
            self.hits += 1
            return part

    def put(self, agent_id: str, model: str, ids: np.ndarray, matrix: np.ndarray, *, token: Any) -> bool:
        """Cache a partition; returns False when it alone exceeds the budget (then nothing is kept)."""
        part = HotPartition(ids=ids, matrix=matrix, token=token)
        with self._lock:
            self._drop((agent_id, model))
            if part.nbytes > self.max_bytes:
                return False
            self._parts[(agent_id, model)] = part
            self._bytes += part.nbytes
            self._shrink()
            return (agent_id, model) in self._parts

    def invalidate(self, agent_id: str) -> None:
        """Forget every partition of `agent_id` (its vectors changed, or it was deleted)."""
        with self._lock:
            for key in [key for key in self._parts if key[0] == agent_id]:
                self._drop(key)

    def clear(self) -> None:
        """Forget every partition."""
        with self._lock:
            self._parts.clear()
            self._bytes = 0

    def agents(self) -> list[str]:
        """The agents with a partition in RAM, least recently searched first."""
        with self._lock:
            return list(dict.fromkeys(agent for agent, _ in self._parts))

    def stats(self) -> dict[str, int]:
        """`hits`, `misses`, `bytes` held, `max_bytes`, `partitions` and `pinned` agents."""
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "partitions": len(self._parts), "pinned": len(self._pinned)}

    def _drop(self, key: tuple[str, str]) -> None:
        part = self._parts.pop(key, None)
        if part is not None:
            self._bytes -= part.nbytes

    def _shrink(self) -> None:
        """Evict least recent unpinned partitions, then least recent pinned ones, until within budget."""
        for pinned_too in (False, True):
            for key in list(self._parts):
                if self._bytes <= self.max_bytes:
                    return
                if pinned_too or key[0] not in self._pinned:
                    self._drop(key)
