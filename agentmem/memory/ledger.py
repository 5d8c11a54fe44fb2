"""Per-agent token ledger: which tokens an agent's KV holds, and their regions.

The ledger is the source of truth for prefix reuse (what is already decoded),
for restores (a state blob has no token list), and for later policies
(eviction by region, archive of the text). Tokens are kept in a growable
``int32`` numpy buffer so the common-prefix search is one vectorized compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from agentmem.engine.chat_format import Span

__all__ = ["Ledger"]


@dataclass(slots=True)
class _Buf:
    data: np.ndarray
    n: int = 0


class Ledger:
    """Tokens (positions ``0..n-1``) of one agent's KV state with region spans.

    >>> led = Ledger()
    >>> led.extend([1, 2, 3], [Span(0, 3, "user")])
    >>> led.common_prefix([1, 2, 9, 9])
    2
    >>> led.truncate(2); len(led), led.spans
    (2, [Span(start=0, end=2, region='user', message=-1, pinned=False)])
    """

    def __init__(self) -> None:
        self._buf = _Buf(np.zeros(256, dtype=np.int32))
        self.spans: list[Span] = []

    def __len__(self) -> int:
        return self._buf.n

    @property
    def tokens(self) -> np.ndarray:
        """A read-only view of the tokens."""
        v = self._buf.data[: self._buf.n]
        v.flags.writeable = False
        return v

    def common_prefix(self, tokens: Sequence[int] | np.ndarray) -> int:
        """Length of the longest common prefix with ``tokens``."""
        m = min(self._buf.n, len(tokens))
        if m == 0:
            return 0
        a = self._buf.data[:m]
        b = np.asarray(tokens[:m], dtype=np.int32)
        diff = np.flatnonzero(a != b)
        return int(diff[0]) if diff.size else m

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (spans are clipped)."""
        if n >= self._buf.n:
            return
        n = max(0, n)
        self._buf.n = n
        kept = []
        for s in self.spans:
            if s.start >= n:
                break
            kept.append(s if s.end <= n else Span(s.start, n, s.region, s.message, s.pinned))
        self.spans = kept

    def extend(self, tokens: Sequence[int] | np.ndarray, spans: Sequence[Span] | None = None, *, region: str = "assistant") -> None:
        """Append tokens; ``spans`` (absolute positions) tag them, else one ``region`` span."""
        k = len(tokens)
        if k == 0:
            return
        start = self._buf.n
        need = start + k
        if need > len(self._buf.data):
            grown = np.zeros(max(need, 2 * len(self._buf.data)), dtype=np.int32)
            grown[:start] = self._buf.data[:start]
            self._buf.data = grown
        self._buf.data[start:need] = tokens
        self._buf.n = need
        if spans is None:
            self._add_span(Span(start, need, region))
        else:
            for s in spans:
                lo, hi = max(s.start, start), min(s.end, need)
                if lo < hi:
                    self._add_span(Span(lo, hi, s.region, s.message, s.pinned))

    def _add_span(self, s: Span) -> None:
        last = self.spans[-1] if self.spans else None
        if last and last.end == s.start and last.region == s.region and last.message == s.message and last.pinned == s.pinned:
            self.spans[-1] = Span(last.start, s.end, s.region, s.message, s.pinned)
        else:
            self.spans.append(s)

    def region_counts(self) -> dict[str, int]:
        """Tokens per region."""
        out: dict[str, int] = {}
        for s in self.spans:
            out[s.region] = out.get(s.region, 0) + (s.end - s.start)
        return out

    def clear(self) -> None:
        self.truncate(0)
