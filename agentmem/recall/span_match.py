"""Where stored spans' tokens recur in a prompt: the matching half of recall as KV.

`SpanIndex` is built once from an agent's stored spans (`(span_id, token ids)`, as
`Archive.span_kv_tokens` lists them) and answers, per call, which runs of the tokens about
to be prefilled are verbatim parts of which span. Its cost per call grows with those new
tokens, not with the spans kept or the history: every `ANCHOR`-token window of the prompt
is hashed at once in numpy and looked up among the spans' windows at offsets that are
multiples of `ANCHOR` (any run of `2 * ANCHOR - 1` tokens or more contains one); only the
hits are checked and extended, in Python, one extension per run.

>>> idx = SpanIndex([(7, tuple(range(100, 180)))])
>>> prompt = [1, 2, 3] + list(range(110, 180)) + [9, 9]
>>> idx.find(prompt, min_tokens=64)
[(3, 73, 7, 10)]

The match `(3, 73, 7, 10)` says: `prompt[3:73]` is span 7 from its token 10 on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ANCHOR", "SpanIndex"]

ANCHOR = 8
"""Tokens a span and a prompt must share in a row to be looked at; spans are indexed every `ANCHOR` tokens."""

_MIX = np.array([0x9E3779B97F4A7C15 * (i + 1) % 2**64 | 1 for i in range(ANCHOR)], dtype=np.uint64)


def _window_hashes(tokens: np.ndarray) -> np.ndarray:
    """One uint64 per `ANCHOR`-token window of `tokens` (windows starting at 0, 1, ...)."""
    win = np.lib.stride_tricks.sliding_window_view(tokens.astype(np.uint64), ANCHOR)
    with np.errstate(over="ignore"):
        return (win * _MIX).sum(axis=1, dtype=np.uint64)


class SpanIndex:
    """The anchor windows of some stored spans, for `find`.

    Args:
        spans: `(span_id, token ids)` pairs (shorter than `ANCHOR` tokens: never matched).
    """

    def __init__(self, spans: Sequence[tuple[int, Sequence[int]]]) -> None:
        self.spans = [(int(sid), np.asarray(toks, dtype=np.int64)) for sid, toks in spans]
        hashes, where = [], []
        for k, (_, toks) in enumerate(self.spans):
            if toks.size < ANCHOR:
                continue
            h = _window_hashes(toks)[::ANCHOR]
            hashes.append(h)
            where.append(np.stack([np.full(h.size, k), np.arange(h.size) * ANCHOR], axis=1))
        self._hash = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
        order = np.argsort(self._hash, kind="stable")
        self._hash = self._hash[order]
        self._where = np.concatenate(where)[order] if where else np.zeros((0, 2), np.int64)

    def __len__(self) -> int:
        return len(self.spans)

    def find(self, tokens: Sequence[int] | np.ndarray, *, min_tokens: int, end: int | None = None) -> list[tuple[int, int, int, int]]:
        """`(start, stop, span_id, lo)` per span found: `tokens[start:stop]` equals that span's tokens from `lo` on.

        Each span's longest run of at least `min_tokens` (>= `2 * ANCHOR - 1`, so every
        such run holds an indexed window) ending at or before `end` (default: the whole
        prompt); runs are returned in prompt order, never overlapping (the longer wins a
        clash, then the earlier).
        """
        toks = np.asarray(tokens, dtype=np.int64)
        stop_at = toks.size if end is None else min(int(end), toks.size)
        if self._hash.size == 0 or stop_at < min_tokens:
            return []
        h = _window_hashes(toks[:stop_at])
        pos = np.searchsorted(self._hash, h)
        pos[pos == self._hash.size] = 0
        hits = np.flatnonzero(self._hash[pos] == h)
        best: dict[int, tuple[int, int, int, int]] = {}
        seen: set[tuple[int, int]] = set()  # (span, prompt start - span offset): one extension per run
        for i in hits.tolist():
            j = int(pos[i])
            while j < self._hash.size and self._hash[j] == h[i]:
                k, off = (int(x) for x in self._where[j])
                j += 1
                if (k, i - off) in seen:
                    continue
                span = self.spans[k][1]
                if not np.array_equal(span[off : off + ANCHOR], toks[i : i + ANCHOR]):
                    continue  # a hash collision
                seen.add((k, i - off))
                back = 0
                while off - back > 0 and i - back > 0 and span[off - back - 1] == toks[i - back - 1]:
                    back += 1
                fwd = ANCHOR
                while off + fwd < span.size and i + fwd < stop_at and span[off + fwd] == toks[i + fwd]:
                    fwd += 1
                start, stop = i - back, i + fwd
                if stop - start >= min_tokens:
                    sid = self.spans[k][0]
                    got = best.get(k)
                    if got is None or stop - start > got[1] - got[0]:
                        best[k] = (start, stop, sid, off - back)
        out: list[tuple[int, int, int, int]] = []
        for m in sorted(best.values(), key=lambda m: (m[0] - m[1], m[0])):  # longest first
            if all(m[1] <= o[0] or m[0] >= o[1] for o in out):
                out.append(m)
        return sorted(out)
