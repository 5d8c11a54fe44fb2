"""`SpanIndex.find` (agentmem/recall/span_match.py) against a brute-force longest common run."""

from __future__ import annotations

import numpy as np
import pytest

from agentmem.recall.span_match import ANCHOR, SpanIndex


def longest_run(span: np.ndarray, prompt: np.ndarray, end: int) -> tuple[int, int, int]:
    """(length, prompt start, span start) of the longest common run ending by `end` (O(n*m) reference)."""
    best = (0, 0, 0)
    prev = np.zeros(span.size + 1, dtype=np.int64)
    for i in range(end):
        cur = np.zeros(span.size + 1, dtype=np.int64)
        eq = span == prompt[i]
        cur[1:][eq] = prev[:-1][eq] + 1
        j = int(np.argmax(cur))
        if cur[j] > best[0]:
            best = (int(cur[j]), i - int(cur[j]) + 1, j - int(cur[j]))
        prev = cur
    return best


@pytest.mark.parametrize("seed", range(12))
def test_planted_runs_are_found_whole_and_match_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    spans = [(100 + k, rng.integers(0, 50, size=int(rng.integers(40, 260)))) for k in range(6)]
    parts, planted = [], {}
    at = 0
    for sid, toks in spans[:4]:
        noise = rng.integers(1000, 2000, size=int(rng.integers(0, 30)))
        lo = int(rng.integers(0, toks.size // 3))
        hi = int(rng.integers(lo + (toks.size - lo) // 2, toks.size + 1))
        parts += [noise, toks[lo:hi]]
        at += noise.size
        planted[sid] = (at, at + hi - lo, lo)
        at += hi - lo
    parts.append(rng.integers(1000, 2000, size=5))
    prompt = np.concatenate(parts)
    idx = SpanIndex([(sid, tuple(t.tolist())) for sid, t in spans])
    got = idx.find(prompt.tolist(), min_tokens=32, end=prompt.size - 1)
    for start, stop, sid, lo in got:  # every match is verbatim, long enough, in bounds
        toks = dict(spans)[sid]
        assert stop - start >= 32 and stop <= prompt.size - 1
        assert np.array_equal(prompt[start:stop], toks[lo : lo + stop - start])
    assert all(a[1] <= b[0] for a, b in zip(got, got[1:]))  # prompt order, no overlap
    by_span = {m[2]: m for m in got}
    for sid, toks in spans:
        n, _, _ = longest_run(toks, prompt, prompt.size - 1)
        if sid in by_span:
            assert by_span[sid][1] - by_span[sid][0] == n  # the longest run, not just some run
        elif n >= 32:
            # dropped only for overlapping a longer match
            assert sid not in planted or any(m[0] < planted[sid][1] and planted[sid][0] < m[1] for m in got)


def test_nothing_to_find() -> None:
    assert SpanIndex([]).find([1, 2, 3] * 40, min_tokens=16) == []
    assert SpanIndex([(1, (5,) * (ANCHOR - 1))]).find([5] * 100, min_tokens=16) == []
    idx = SpanIndex([(1, tuple(range(200)))])
    assert idx.find(list(range(200)), min_tokens=64, end=40) == []  # the end comes before any long run
    assert idx.find(list(range(200)), min_tokens=64, end=199) == [(0, 199, 1, 0)]
