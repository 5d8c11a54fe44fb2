"""Per-agent token ledger: the agent's whole token history, and which of it is live.

The ledger is the source of truth for prefix reuse (what is already decoded),
for restores (a state blob has no token list), for eviction (regions, pins and
turns per token) and for the archive. It keeps *every* token the agent has seen,
each with a region code, a pin flag, the index of the message it came from and a
``live`` flag: evicted tokens stay in the ledger (so a framework that re-sends
the full history still matches it) but have no KV cell. Live tokens occupy KV
positions ``0..n_live-1`` in ledger order — eviction shifts later cells down.

All per-token data lives in parallel numpy arrays; no per-token Python objects.
"""

from __future__ import annotations

import bisect
import itertools

from typing import Sequence

import numpy as np

from agentmem.engine.chat_format import REGIONS, Span, span_table

__all__ = ["Ledger"]

_REGION_CODE = {name: i for i, name in enumerate(REGIONS)}
_FIELDS = ("tok", "reg", "pin", "msg", "live")
_DTYPES = {"tok": np.int32, "reg": np.uint8, "pin": np.bool_, "msg": np.int32, "live": np.bool_}


_VERSIONS = itertools.count(1)


def _span_end(s: Span) -> int:
    return s.end


class Ledger:
    """Tokens of one agent with region, pin, message index and live flag per token.

    >>> led = Ledger()
    >>> led.extend([1, 2, 3], [Span(0, 3, "user")])
    >>> led.common_prefix([1, 2, 9, 9])
    2
    >>> led.truncate(2)  # the live tokens kept (the KV cut point)
    2
    >>> len(led), led.spans
    (2, [Span(start=0, end=2, region='user', message=-1, pinned=False)])
    """

    def __init__(self) -> None:
        self._a = {f: np.zeros(256, dtype=_DTYPES[f]) for f in _FIELDS}
        self._n = 0
        self.n_live = 0
        #: changes (to a value no other ledger had) whenever tokens or live flags change
        self.version = next(_VERSIONS)

    # ---------------------------------------------------------------- views
    def __len__(self) -> int:
        """Tokens in the history (live and evicted)."""
        return self._n

    def _view(self, f: str) -> np.ndarray:
        v = self._a[f][: self._n]
        v.flags.writeable = False
        return v

    @property
    def tokens(self) -> np.ndarray:
        """Every token of the history (read-only view)."""
        return self._view("tok")

    @property
    def live(self) -> np.ndarray:
        """True where the token has a KV cell (read-only view)."""
        return self._view("live")

    @property
    def regions(self) -> np.ndarray:
        return self._view("reg")

    @property
    def pinned(self) -> np.ndarray:
        return self._view("pin")

    @property
    def messages(self) -> np.ndarray:
        return self._view("msg")

    def message_runs(self, hist: np.ndarray) -> list[np.ndarray]:
        """`hist` (ascending history positions) cut into runs of consecutive positions of one message.

        The rows the archive keeps of evicted text, and the spans recall as KV captures.
        """
        msg_of = self._view("msg")[hist]
        cuts = np.flatnonzero((np.diff(hist) != 1) | (np.diff(msg_of) != 0)) + 1
        return [run for run in np.split(hist, cuts) if run.size]

    def live_tokens(self) -> np.ndarray:
        """Tokens that have KV cells, in KV position order."""
        return self._a["tok"][: self._n][self._a["live"][: self._n]]

    def live_before(self, n: int) -> int:
        """KV position of history index ``n`` (live tokens before it)."""
        if self.n_live == self._n:
            return min(n, self._n)
        return int(np.count_nonzero(self._a["live"][: min(n, self._n)]))

    @property
    def spans(self) -> list[Span]:
        """Run-length spans of (region, message, pinned) over the history."""
        n = self._n
        if n == 0:
            return []
        reg, msg, pin = self._a["reg"][:n], self._a["msg"][:n], self._a["pin"][:n]
        change = np.flatnonzero((reg[1:] != reg[:-1]) | (msg[1:] != msg[:-1]) | (pin[1:] != pin[:-1])) + 1
        starts = np.concatenate(([0], change))
        ends = np.concatenate((change, [n]))
        return [Span(int(s), int(e), REGIONS[reg[s]], int(msg[s]), bool(pin[s])) for s, e in zip(starts, ends)]

    # ---------------------------------------------------------------- queries
    def common_prefix(self, tokens: Sequence[int] | np.ndarray) -> int:
        """Length of the longest common prefix of the history and ``tokens``."""
        m = min(self._n, len(tokens))
        if m == 0:
            return 0
        a = self._a["tok"][:m]
        b = np.asarray(tokens[:m], dtype=np.int32)
        diff = np.flatnonzero(a != b)
        return int(diff[0]) if diff.size else m

    def region_counts(self, *, live_only: bool = True) -> dict[str, int]:
        """Tokens per region (live ones by default)."""
        reg = self._a["reg"][: self._n]
        if live_only:
            reg = reg[self._a["live"][: self._n]]
        counts = np.bincount(reg, minlength=len(REGIONS))
        return {REGIONS[i]: int(c) for i, c in enumerate(counts) if c}

    # ---------------------------------------------------------------- updates
    def truncate(self, n: int) -> int:
        """Keep the first ``n`` history tokens; returns the live count kept (the KV cut point)."""
        n = max(0, min(n, self._n))
        keep_live = self.live_before(n)
        self._n = n
        self.n_live = keep_live
        self.version = next(_VERSIONS)
        return keep_live

    def extend(
        self,
        tokens: Sequence[int] | np.ndarray,
        spans: Sequence[Span] | None = None,
        *,
        region: str = "assistant",
        message: int = -1,
    ) -> None:
        """Append live tokens; ``spans`` (absolute positions, in order) tag them, else ``region``/``message``."""
        k = len(tokens)
        if k == 0:
            return
        start, need = self._n, self._n + k
        if need > len(self._a["tok"]):
            cap = max(need, 2 * len(self._a["tok"]))
            for f in _FIELDS:
                grown = np.zeros(cap, dtype=_DTYPES[f])
                grown[:start] = self._a[f][:start]
                self._a[f] = grown
        a = self._a
        a["tok"][start:need] = tokens
        a["live"][start:need] = True
        if spans is None:
            a["reg"][start:need] = _REGION_CODE[region]
            a["pin"][start:need] = False
            a["msg"][start:need] = message
        else:
            a["reg"][start:need] = _REGION_CODE["text"]
            a["pin"][start:need] = False
            a["msg"][start:need] = -1
            for s in spans[bisect.bisect_right(spans, start, key=_span_end) :]:  # in order: skip those before
                lo, hi = max(s.start, start), min(s.end, need)
                if lo >= need:
                    break
                if lo < hi:
                    a["reg"][lo:hi] = _REGION_CODE[s.region]
                    a["pin"][lo:hi] = s.pinned
                    a["msg"][lo:hi] = s.message
        self._n = need
        self.n_live += k
        self.version = next(_VERSIONS)

    def retag(self, n: int, spans: Sequence[Span], *, table: np.ndarray | None = None) -> None:
        """Re-tag the first `n` history tokens with the regions and messages of `spans`.

        A call keeps the prefix its prompt shares with the history, but the tags of
        that prefix come from the call that decoded it: the generation prompt was
        glue (-1) then and is the opening of an assistant message now, and a reply
        was tagged `assistant` while the next render may call it a tool call. The
        newest render knows best. Pins stay as they are: `MemoryPool.pin` sets them
        outside any render. `table`: `spans` as `span_table` rows (a prompt value carries them).
        """
        n = max(0, min(n, self._n))
        if n == 0:
            return
        reg, msg = self._a["reg"], self._a["msg"]
        reg[:n] = _REGION_CODE["text"]
        msg[:n] = -1
        if table is None:
            table = span_table(spans)
        k = int(np.searchsorted(table[:, 0], n))  # the spans that start before `n` (in order)
        if k == 0:
            return
        starts, ends, codes, messages = table[:k, 0], np.minimum(table[:k, 1], n), table[:k, 2], table[:k, 3]
        if starts[0] == 0 and np.array_equal(starts[1:], ends[:-1]):  # contiguous (as renders are): one fill
            lens = ends - starts
            reg[: ends[-1]] = np.repeat(codes, lens)
            msg[: ends[-1]] = np.repeat(messages, lens)
            return
        for lo, hi, c, m in zip(starts.tolist(), ends.tolist(), codes.tolist(), messages.tolist()):
            if lo < hi:
                reg[lo:hi] = c
                msg[lo:hi] = m

    def evict_live(self, ranges: Sequence[tuple[int, int]]) -> np.ndarray:
        """Mark live positions ``[s, e)`` as evicted; returns their history indices."""
        live_idx = np.flatnonzero(self._a["live"][: self._n])
        hist = np.concatenate([live_idx[s:e] for s, e in ranges]) if ranges else np.zeros(0, dtype=np.int64)
        assert not self._a["pin"][hist].any(), "eviction of pinned tokens"
        self._a["live"][hist] = False
        self.n_live -= int(hist.size)
        self.version = next(_VERSIONS)
        return hist

    def set_pinned(self, message: int, pinned: bool = True) -> int:
        """Pin (or unpin) every token of message ``message``; returns how many."""
        sel = self._a["msg"][: self._n] == message
        self._a["pin"][: self._n][sel] = pinned
        return int(np.count_nonzero(sel))

    def clear(self) -> None:
        self.truncate(0)

    # ---------------------------------------------------------------- persistence
    def to_arrays(self) -> dict[str, np.ndarray]:
        """Copies of the per-token arrays (for the archive)."""
        return {f: self._a[f][: self._n].copy() for f in _FIELDS}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Ledger:
        """Inverse of `to_arrays`."""
        led = cls()
        n = len(arrays["tok"])
        for f in _FIELDS:
            buf = np.zeros(max(256, n), dtype=_DTYPES[f])
            buf[:n] = arrays[f]
            led._a[f] = buf
        led._n = n
        led.n_live = int(np.count_nonzero(arrays["live"]))
        return led
