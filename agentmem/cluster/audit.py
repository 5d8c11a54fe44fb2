"""Checks of a lease log: each token's interval of ownership, and whether two owners ever overlapped.

A lease is owned from its `acquire`/`takeover` until its `release`, or else until
`ttl_s` after its last `renew` (when it expired). Two intervals of one agent with
different owners must not overlap: that is split-brain.

>>> from types import SimpleNamespace as E
>>> log = [E(agent_id="a", owner="r1", token=1, kind="acquire", at=0.0),
...        E(agent_id="a", owner="r1", token=1, kind="renew", at=3.0),
...        E(agent_id="a", owner="r2", token=2, kind="takeover", at=13.5)]
>>> [(i.owner, i.start, i.end) for i in lease_intervals(log, ttl_s=10)]
[('r1', 0.0, 13.0), ('r2', 13.5, 23.5)]
>>> overlaps(lease_intervals(log, ttl_s=10))
[]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["Interval", "lease_intervals", "overlaps"]


@dataclass(frozen=True)
class Interval:
    """When `owner` held `agent_id`'s lease with `token`."""

    agent_id: str
    owner: str
    token: int
    start: float
    end: float


def lease_intervals(events: Iterable[Any], *, ttl_s: float) -> list[Interval]:
    """Intervals of ownership per (agent, token), from `LeaseEvent`s (any order), sorted by agent and start."""
    spans: dict[tuple[str, int], list[Any]] = {}
    for e in sorted(events, key=lambda e: e.at):
        key = (e.agent_id, e.token)
        s = spans.get(key)
        if s is None:
            spans[key] = [e.owner, e.at, e.at + ttl_s, False]
            continue
        if s[3]:  # released: a later acquire of the same token by its owner starts again
            s[1:4] = [min(s[1], e.at), e.at + ttl_s, False]
        elif e.kind == "release":
            s[2], s[3] = e.at, True
        else:
            s[2] = e.at + ttl_s
    out = [Interval(aid, owner, tok, start, end) for (aid, tok), (owner, start, end, _) in spans.items()]
    return sorted(out, key=lambda i: (i.agent_id, i.start))


def overlaps(intervals: list[Interval]) -> list[tuple[Interval, Interval]]:
    """Pairs of intervals of one agent, with different owners, that overlap in time."""
    out = []
    by_agent: dict[str, list[Interval]] = {}
    for i in intervals:
        by_agent.setdefault(i.agent_id, []).append(i)
    for items in by_agent.values():
        items.sort(key=lambda i: i.start)
        for k, a in enumerate(items):
            for b in items[k + 1 :]:
                if b.start >= a.end:
                    break
                if a.owner != b.owner:
                    out.append((a, b))
    return out
