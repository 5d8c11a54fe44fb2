"""`MemoryPool.recall` and its embedder: the evicted text of an agent, found by meaning and by keyword.

The pool's `RecallIndex` (`agentmem.recall.index`, on `PoolCore.recall`) writes each evicted
span with its embedding into the recall store and searches it; this mixin is its public face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import agentmem.validation as check
from agentmem.archive import EvictedSpan
from agentmem.errors import ConfigError
from agentmem.pool.lifetime import in_use
from agentmem.recall.embedders import Embedder

if TYPE_CHECKING:
    from agentmem.pool.kvcapture import SpanCapture
    from agentmem.pool.state import PoolCore

__all__ = ["RecallMethods"]


class RecallMethods:
    """`MemoryPool.recall`, `set_recall_embedder` and `recall_stats` (mixed into the facade; it provides `_core`)."""

    _core: PoolCore
    _span_kv: SpanCapture
    _check_open: Callable[[], None]  # the facade's method

    @in_use
    def recall(self, agent_id: str, query: str, k: int = 5, *, mode: str | None = None) -> list[EvictedSpan]:
        """The `k` evicted spans of `agent_id` that best match `query`, best first.

        Args:
            agent_id: whose evicted text is searched (never another agent's).
            query: free text, e.g. the latest user message.
            k: spans at most.
            mode: `"vector"` (by meaning: cosine of the query's embedding to the spans';
                `score` is the similarity), `"hybrid"` (vectors and BM25 fused by
                reciprocal rank) or `"keyword"` (full-text search); default
                `PoolConfig.recall_mode`. Without an embedder every mode is keyword search.

        Raises:
            ConfigError: a bad `k`, `query` or `mode`.
        """
        check.agent_id(agent_id, internal=True)
        check.bounded_int(k, field="k", lo=0, hi=10_000)
        if not isinstance(query, str):
            raise ConfigError(f"query must be a string, got {type(query).__name__}")
        core = self._core
        res = core.recall.search(agent_id, query, k, mode=mode)
        with core.lock:
            core.totals["recalls"] += 1
            core.totals["recall_hits"] += bool(res)
            self._span_kv.note_recall(agent_id)  # recall_kv="auto": its spans are kept as cells from now on
        return res

    def pin_recall(self, agent_id: str, pinned: bool = True) -> None:
        """Keep `agent_id`'s span vectors in RAM (its hot partition) ahead of other agents' (`pinned=False` unpins).

        A pinned agent's partition is dropped only after every unpinned one
        (`agentmem.archive.hotvectors.HotVectors`), so its recalls stay RAM-fast under
        many agents; `recall_stats()["hot_pinned"]` counts the pins.
        """
        self._check_open()
        check.agent_id(agent_id, internal=True)
        if not isinstance(pinned, bool):
            raise ConfigError(f"pinned must be a bool, got {pinned!r}")
        self._core.recall.pin(agent_id, pinned)

    def set_recall_embedder(self, embedder: Any, *, mode: str | None = None) -> None:
        """Embed evicted text with `embedder` from now on.

        Args:
            embedder: an `agentmem.recall.Embedder`, a callable `texts -> vectors`, or a
                `PoolConfig.recall_embedder` spec (`"none"` turns recall by meaning off).
                Spans embedded by another embedder are embedded again on their agent's next recall.
            mode: also change the default recall mode.
        """
        self._check_open()
        self._core.recall.set_embedder(embedder, mode=mode)

    @property
    def recall_embedder(self) -> Embedder | None:
        """The embedder of recall by meaning (`None`: keyword recall only); the server's `/v1/embeddings` uses it."""
        return self._core.recall.embedder

    def recall_stats(self) -> dict[str, Any]:
        """The recall index's counters: spans embedded (and seconds spent), embedding errors,
        spans backfilled, searches (and seconds), plus the embedder's name and the mode; unless
        `PoolConfig.recall_kv` is False, recall as KV's (`agentmem.pool.kvcapture`: `kv_enabled`,
        `kv_captured`, `kv_stored_bytes`, `kv_spliced_tokens`, ...)."""
        core = self._core
        out = core.recall.snapshot()
        if core.config.recall_kv is not False:
            with core.lock:
                out.update(self._span_kv.stats(), kv_enabled=self._span_kv.enabled)
        return out
