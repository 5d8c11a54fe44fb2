"""The recall index of a pool: evicted text archived with its vectors, searched by meaning and by keyword.

`RecallIndex` sits between the pool and its recall store (the archive, or a throwaway
in-memory one). `add` hands the evicted spans to the archive; an eager index
(`PoolConfig.recall_embed="evict"`) embeds them first and writes spans and vectors in one
transaction, a lazy one (the default) leaves the vectors to the agent's next search, so
the call that evicts pays nothing for them. `search` ranks by one of three modes:

* `"keyword"` — the archive's full-text search alone (FTS5 BM25 / `tsvector`), as before #34;
* `"vector"` — cosine similarity of the query's embedding to the spans' (the default:
  on the benchmark it finds paraphrased questions that keyword search misses, and
  keyword questions as well — see `docs/recall.md`); when no span is similar enough
  (`MIN_SIMILARITY`), the spans sharing a significant word with the query, if any;
* `"hybrid"` — both lists fused by weighted reciprocal rank fusion (`fuse`), the
  keyword list counting only spans that share a significant word with the query.

Spans archived without a vector (lazily, by an older agentmem, before an embedder was
set, or while an embedding endpoint was down) are embedded on the next search of their
agent (`backfill`, all of them, in batches), so recall by meaning also works on an
archive written earlier.
Without an embedder every mode is keyword search.

The store keeps the vectors of recently searched and pinned (`pin`) agents in RAM (hot
partitions, `agentmem.archive.hotvectors`); beyond them a PostgreSQL archive searches
through pgvector's HNSW index where the database has the extension (`snapshot()` names
the path and counts the hot partitions' hits and misses).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Sequence

from agentmem.archive.records import EvictedSpan
from agentmem.errors import AgentMemError, ConfigError
from agentmem.recall.embedders import Embedder, make_embedder
from agentmem.tools.recall import words

__all__ = ["RECALL_MODES", "RecallIndex", "fuse"]

logger = logging.getLogger(__name__)

RECALL_MODES = ("vector", "hybrid", "keyword")
"""How `RecallIndex.search` ranks (the first is the default)."""
RRF_K = 10
"""Reciprocal rank fusion's rank offset: a span at rank r adds weight / (RRF_K + r)."""
KEYWORD_WEIGHT = 0.3
"""The keyword list's weight in `"hybrid"` (the vector list's is 1): the best of those measured."""
MIN_SIMILARITY = 0.2
"""Spans less similar to the query (cosine) are no recall by meaning at all."""
BACKFILL_BATCH = 256
"""Spans without a vector embedded per search at most (bounds one search's extra latency)."""


def fuse(lists: Sequence[Sequence[EvictedSpan]], weights: Sequence[float], *, k: int) -> list[EvictedSpan]:
    """Weighted reciprocal rank fusion: the `k` spans with the highest `sum(w / (RRF_K + rank))`.

    A span's `score` becomes its fused score; ties keep the first list's order.

    >>> a, b, c = (EvictedSpan(i, "x", 0, 1, "user", t, 0.0) for i, t in enumerate("abc"))
    >>> [s.text for s in fuse([[a, b], [c, b]], [1.0, 1.0], k=3)]
    ['b', 'a', 'c']
    """
    score: dict[int, float] = {}
    first: dict[int, EvictedSpan] = {}
    for spans, w in zip(lists, weights):
        for rank, s in enumerate(spans, start=1):
            score[s.id] = score.get(s.id, 0.0) + w / (RRF_K + rank)
            first.setdefault(s.id, s)
    best = sorted(first, key=lambda i: -score[i])[:k]
    return [EvictedSpan(*_fields(first[i]), score=score[i]) for i in best]


def _fields(s: EvictedSpan) -> tuple[Any, ...]:
    return (s.id, s.agent_id, s.start, s.end, s.region, s.text, s.ts)


class RecallIndex:
    """Evicted text and its vectors in `store`, searched by meaning and by keyword.

    Args:
        store: the archive (`ArchiveBase`) the spans go to.
        embedder: an `Embedder`, or a `make_embedder` spec (`"auto"`, `"none"`, a URL, a callable).
        mode: the default of `search` (one of `RECALL_MODES`).
        min_similarity: vector hits below this cosine are dropped.
        eager: embed spans as they are archived (`add`), in their transaction; else
            (the default) on their agent's next `search`.

    Raises:
        ConfigError: an unknown mode or embedder spec.
    """

    def __init__(self, store: Any, *, embedder: Any = "auto", mode: str = "vector",
                 min_similarity: float = MIN_SIMILARITY, eager: bool = False) -> None:
        self.store = store
        self.eager = bool(eager)
        self.embedder: Embedder | None = make_embedder(embedder)
        self.mode = _check_mode(mode)
        self.min_similarity = float(min_similarity)
        self._lock = threading.Lock()
        self.counters: dict[str, float] = dict.fromkeys(
            ("embedded_spans", "embed_seconds", "embed_errors", "backfilled_spans", "searches", "search_seconds"), 0
        )

    def set_embedder(self, embedder: Any, *, mode: str | None = None) -> None:
        """Use another embedder from now on (spans of the old one are re-embedded on their next search)."""
        self.embedder = make_embedder(embedder)
        if mode is not None:
            self.mode = _check_mode(mode)

    def snapshot(self) -> dict[str, Any]:
        """The counters (a copy), the embedder's name, the mode, and the store's vector path and hot
        partitions (`vector_search`: `"pgvector-hnsw"` or `"exact-numpy"`; `hot_hits`, `hot_misses`,
        `hot_bytes`, ...: `Archive.vector_stats`)."""
        with self._lock:
            out: dict[str, Any] = dict(self.counters)
        stats = getattr(self.store, "vector_stats", None)
        extra = stats() if callable(stats) else {}
        return {**out, **extra, "embedder": self.embedder.name if self.embedder else None, "mode": self.mode}

    def pin(self, agent_id: str, pinned: bool = True) -> None:
        """Keep `agent_id`'s vectors in RAM ahead of other agents' (`pinned=False` unpins); see `HotVectors`."""
        pin = getattr(self.store, "pin_vectors", None)
        if callable(pin):
            pin(agent_id, pinned)

    def _count(self, **inc: float) -> None:
        with self._lock:
            for key, v in inc.items():
                self.counters[key] += v

    def _embed(self, texts: Sequence[str]) -> Any:
        """The embedder's vectors for `texts`, or `None` when there is none or it failed (logged)."""
        if self.embedder is None or not texts:
            return None
        t0 = time.perf_counter()
        try:
            vecs = self.embedder.embed(texts)
        except AgentMemError as exc:
            logger.warning("embedding %d text(s) failed, archived without vectors: %s", len(texts), exc)
            self._count(embed_errors=1)
            return None
        self._count(embedded_spans=len(texts), embed_seconds=time.perf_counter() - t0)
        return vecs

    def add(self, agent_id: str, rows: Sequence[tuple[int, int, str, str]], *, fence: Any = None) -> list[int]:
        """Archive evicted spans `(start, end, region, text)` of `agent_id` (eager: with their vectors, in one transaction)."""
        vecs = self._embed([r[3] for r in rows]) if self.eager else None
        extra: dict[str, Any] = {} if fence is None else {"fence": fence}
        if vecs is None:
            return self.store.add_evicted_spans(agent_id, rows, **extra)
        return self.store.add_evicted_spans(agent_id, rows, vectors=vecs, model=self.embedder.name, **extra)

    def backfill(self, agent_id: str, *, limit: int = BACKFILL_BATCH) -> int:
        """Embed up to `limit` spans of `agent_id` stored without a vector of this embedder; returns how many."""
        if self.embedder is None or getattr(self.store, "readonly", False):
            return 0
        todo = self.store.spans_without_vectors(agent_id, model=self.embedder.name, limit=limit)
        if not todo:
            return 0
        vecs = self._embed([t for _, t in todo])
        if vecs is None:
            return 0
        try:
            n = self.store.add_span_vectors(agent_id, [i for i, _ in todo], vecs, model=self.embedder.name)
        except AgentMemError as exc:  # a lost lease, a full disk: search what is there
            logger.warning("agent %r: backfilling span vectors failed: %s", agent_id, exc)
            return 0
        self._count(backfilled_spans=n)
        return n

    def search(self, agent_id: str, query: str, k: int, *, mode: str | None = None,
               tenant: str | None = None) -> list[EvictedSpan]:
        """The `k` spans of `agent_id` best matching `query`, best first.

        Args:
            agent_id: whose evicted text is searched.
            query: free text.
            k: results at most.
            mode: `"vector"`, `"hybrid"` or `"keyword"` (default: the index's); without
                an embedder it is `"keyword"`.
            tenant: also require the span's agent id to start with this prefix (SQL filter).
        """
        mode = self.mode if mode is None else _check_mode(mode)
        t0 = time.perf_counter()
        try:
            if self.embedder is None or mode == "keyword":
                return self.store.search_evicted(agent_id, query, k)
            while self.backfill(agent_id) == BACKFILL_BATCH:
                pass  # every span of the agent gets its vector before it is searched
            qv = self._embed([query])
            if qv is None:
                return self.store.search_evicted(agent_id, query, k)
            hits = self.store.search_vectors(agent_id, qv[0], k=max(k, 4 * k if mode == "hybrid" else k),
                                             model=self.embedder.name, tenant=tenant,
                                             min_similarity=self.min_similarity)
            significant = " ".join(sorted(words(query)))
            if mode == "vector":  # nothing similar enough: what shares a significant word, if anything
                return hits or (self.store.search_evicted(agent_id, significant, k) if significant else [])
            keyed = self.store.search_evicted(agent_id, significant, 4 * k) if significant else []
            return fuse([hits, keyed], [1.0, KEYWORD_WEIGHT], k=k)
        finally:
            self._count(searches=1, search_seconds=time.perf_counter() - t0)


def _check_mode(mode: str) -> str:
    if mode not in RECALL_MODES:
        raise ConfigError(f"recall mode must be one of {', '.join(RECALL_MODES)}, got {mode!r}")
    return mode
