"""An evicted span's KV cells, kept beside its text for recall as KV (issue #34).

`SpanKVMixin` adds to `Archive` the `span_kv` table (schema v7): at most one row per
evicted span — its cells as a one-sequence state blob (`agentmem.engine.splice.SpanKV`),
the position of its first cell in that blob, and its token ids (a state blob keeps no
tokens; a recall that splices the cells must put exactly these ids in the prompt).
`model` is the fingerprint of the model and cache layout that wrote the blob: a read
for another fingerprint finds nothing, so a blob never loads where it does not fit.
The row is deleted with its span (`ON DELETE CASCADE`); `put_span_kv(keep=N)` also drops
the agent's oldest rows beyond N (their text stays recallable, only the cells go).

`span_kv_tokens` — which the pool reads in every prefill of an agent that has rows — is
served from RAM after the first read: a per-(agent, model) list kept up to date by this
process's writes and dropped with the agent (`delete_agent`). Where other processes write
the same archive (PostgreSQL replicas) a cheap `(count, max span id)` token of the agent's
rows is compared first; a stale list costs a missed splice at worst, never a wrong one (the
pool checks a blob's tokens before it splices them).

>>> import numpy as np
>>> from agentmem.archive import Archive
>>> with Archive(":memory:") as arc:
...     (sid,) = arc.add_evicted_spans("a", [(0, 3, "user", "red fox")])
...     _ = arc.put_span_kv("a", sid, blob=np.arange(8, dtype=np.uint8), pos0=5, tokens=[7, 8, 9], model="m1")
...     row = arc.get_span_kv("a", sid, model="m1")
...     (row.pos0, row.tokens, row.blob.size), arc.get_span_kv("a", sid, model="m2")
((5, (7, 8, 9), 8), None)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentmem.archive.core import ArchiveCore
from agentmem.archive.records import Lease
from agentmem.archive.values import _check_agent_id, _check_text
from agentmem.errors import ConfigError

__all__ = ["SPAN_TOKEN_CACHE", "SpanKVMixin", "StoredSpanKV"]

SPAN_TOKEN_CACHE = 1024
"""How many (agent, model) token lists `span_kv_tokens` keeps in RAM (least recently read dropped first)."""

_Tokens = list[tuple[int, tuple[int, ...]]]


@dataclass(frozen=True, slots=True)
class StoredSpanKV:
    """One archived span's cells, as `Archive.get_span_kv` returns them.

    Attributes:
        span_id: the evicted span's row id.
        pos0: position of the span's first cell in `blob`.
        tokens: the span's token ids, one per cell.
        blob: the one-sequence state blob (bytes as llama.cpp wrote them).
    """

    span_id: int
    pos0: int
    tokens: tuple[int, ...]
    blob: np.ndarray


def _token_bytes(tokens: Sequence[int]) -> bytes:
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.ndim != 1 or arr.size == 0 or (arr < 0).any() or (arr > np.iinfo(np.int32).max).any():
        raise ConfigError(f"tokens must be a non-empty list of token ids, got {len(arr.reshape(-1))} values")
    return arr.astype("<i4").tobytes()


def _tokens_of(raw: Any) -> tuple[int, ...]:
    """The token ids of a stored `tokens` column (int32 little-endian)."""
    return tuple(np.frombuffer(bytes(raw), dtype="<i4").tolist())


class SpanKVMixin(ArchiveCore):
    """Evicted spans' KV cells (part of `Archive`)."""

    def put_span_kv(self, agent_id: str, span_id: int, *, blob: Any, pos0: int, tokens: Sequence[int],
                    model: str, keep: int | None = None, fence: Lease | None = None) -> bool:
        """Keep the cells of the evicted span `span_id` of `agent_id` (replacing any kept before).

        Args:
            agent_id: the span's agent.
            span_id: its id (from `add_evicted_spans`).
            blob: the one-sequence state blob (`SpanKV.blob`).
            pos0: position of the span's first cell in the blob (>= 0).
            tokens: the span's token ids, one per cell.
            model: fingerprint of the model and cache layout that wrote the blob.
            keep: then keep only the agent's `keep` newest rows of `model` (None: all).
            fence: the writer's lease, when the archive is shared.

        Returns:
            False when the span is not `agent_id`'s or no longer exists (nothing written).

        Raises:
            ConfigError: an empty blob, bad `pos0`, `tokens` or `keep`.
        """
        _check_agent_id(agent_id)
        _check_text("model", model)
        if isinstance(pos0, bool) or not isinstance(pos0, int) or pos0 < 0:
            raise ConfigError(f"pos0 must be an int >= 0, got {pos0!r}")
        raw = np.ascontiguousarray(blob, dtype=np.uint8).reshape(-1)
        if raw.size == 0:
            raise ConfigError("blob must not be empty")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ConfigError(f"keep must be an int >= 1 or None, got {keep!r}")
        toks = _token_bytes(tokens)
        self._span_tokens_drop(agent_id)  # re-read after the write (a rollback must not leave a row cached)
        with self._writing("put_span_kv", fence=fence, agent_id=agent_id) as db:
            row = db.execute("SELECT 1 FROM evicted_spans WHERE id = ? AND agent_id = ?",
                             [int(span_id), agent_id]).fetchone()
            if row is None:
                return False
            db.execute(
                "INSERT INTO span_kv(span_id, agent_id, model, pos0, n_tokens, tokens, blob) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(span_id) DO UPDATE SET model = excluded.model, "
                "pos0 = excluded.pos0, n_tokens = excluded.n_tokens, tokens = excluded.tokens, blob = excluded.blob",
                [int(span_id), agent_id, model, pos0, len(toks) // 4, toks, raw.tobytes()],
            )
            if keep is not None:  # older than the oldest of the `keep` newest (none dropped while fewer)
                db.execute("DELETE FROM span_kv WHERE agent_id = ? AND model = ? AND span_id < (SELECT span_id "
                           "FROM span_kv WHERE agent_id = ? AND model = ? ORDER BY span_id DESC LIMIT 1 OFFSET ?)",
                           [agent_id, model, agent_id, model, keep - 1])
        return True

    def span_kv_tokens(self, agent_id: str, *, model: str) -> _Tokens:
        """`(span_id, token ids)` of every span of `agent_id` whose cells `model` wrote (no blob is read), oldest first.

        Served from RAM after the first read (see the module docstring); treat the list as read-only.
        """
        _check_agent_id(agent_id)
        key = (agent_id, model)
        cache, lock = self._span_token_cache()
        with self._reading("span_kv_tokens") as db:
            token = None
            if self._SHARED_WRITERS:  # another replica may have written or dropped rows since
                count, last = db.execute("SELECT count(*), coalesce(max(span_id), 0) FROM span_kv "
                                         "WHERE agent_id = ? AND model = ?", [agent_id, model]).fetchone()
                token = (int(count), int(last))
            with lock:
                hit = cache.get(key)
                if hit is not None and hit[0] == token:
                    cache.move_to_end(key)
                    return hit[1]
            rows = db.execute("SELECT span_id, tokens FROM span_kv WHERE agent_id = ? AND model = ? "
                              "ORDER BY span_id", [agent_id, model]).fetchall()
        out = [(int(r[0]), _tokens_of(r[1])) for r in rows]
        if not self._tx_depth:  # rows a rollback may yet undo are not cached
            with lock:
                cache[key] = (token, out)
                cache.move_to_end(key)
                while len(cache) > SPAN_TOKEN_CACHE:
                    cache.popitem(last=False)
        return out

    def _span_token_cache(self) -> tuple[OrderedDict[tuple[str, str], tuple[Any, _Tokens]], threading.Lock]:
        """The RAM copy of `span_kv_tokens` (created on first use) and its lock."""
        got = self.__dict__.get("_span_tokens")
        if got is None:
            got = self.__dict__.setdefault("_span_tokens", (OrderedDict(), threading.Lock()))
        return got

    def _span_tokens_drop(self, agent_id: str) -> None:
        """Forget what RAM holds of `agent_id`'s span tokens (its rows changed or are gone)."""
        cache, lock = self._span_token_cache()
        with lock:
            for key in [k for k in cache if k[0] == agent_id]:
                del cache[key]

    def get_span_kv(self, agent_id: str, span_id: int, *, model: str) -> StoredSpanKV | None:
        """The kept cells of span `span_id` of `agent_id` written by `model`, or None (none kept, another model)."""
        _check_agent_id(agent_id)
        with self._reading("get_span_kv") as db:
            row = db.execute("SELECT pos0, tokens, blob FROM span_kv WHERE span_id = ? AND agent_id = ? AND model = ?",
                             [int(span_id), agent_id, model]).fetchone()
        if row is None:
            return None
        return StoredSpanKV(span_id=int(span_id), pos0=int(row[0]), tokens=_tokens_of(row[1]),
                            blob=np.frombuffer(bytes(row[2]), dtype=np.uint8).copy())
