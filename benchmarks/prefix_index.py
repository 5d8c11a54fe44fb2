"""Prefix lookup: the radix tree (``PrefixIndex``) against a scan of the agents' ledgers.

N agents hold a shared document plus private tokens (random token ids, no model
needed); a new prompt starts with the document. Times, median of ``--reps``:
building the tree, one lookup, the same lookup as a scan over every ledger
(``longest_shared_prefix`` per agent, what the pool did before), and a refresh
that finds every ledger unchanged.

Usage::

    python benchmarks/prefix_index.py [--agents 15] [--doc-tokens 2000] [--private-tokens 220]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentmem.memory.ledger import Ledger  # noqa: E402 - first: llama.cpp's libraries before numpy
from agentmem.memory.shared import PrefixIndex, longest_shared_prefix  # noqa: E402

import numpy as np  # noqa: E402


def timed(fn, reps: int) -> float:
    xs = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=15)
    ap.add_argument("--doc-tokens", type=int, default=2000)
    ap.add_argument("--private-tokens", type=int, default=220)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    doc = rng.integers(0, 262_144, args.doc_tokens).astype(np.int32)
    ledgers = {}
    for i in range(args.agents):
        led = Ledger()
        led.extend(np.concatenate([doc, rng.integers(0, 262_144, args.private_tokens).astype(np.int32)]), region="user")
        ledgers[f"agent{i:02d}"] = led
    query = np.concatenate([doc, rng.integers(0, 262_144, 30).astype(np.int32)])

    def build() -> PrefixIndex:
        idx = PrefixIndex()
        for k, led in ledgers.items():
            idx.sync(k, led.tokens, version=led.version)
        return idx

    idx = build()
    rows = [
        ("build the tree (all agents inserted)", timed(build, args.reps)),
        ("lookup in the tree", timed(lambda: idx.matches(query), args.reps)),
        ("scan of every ledger", timed(lambda: [longest_shared_prefix(query, [(k, v)]) for k, v in ledgers.items()],
                                       args.reps)),
        ("refresh, no ledger changed", timed(lambda: [idx.sync(k, v.tokens, version=v.version)
                                                      for k, v in ledgers.items()], args.reps)),
    ]
    best = idx.matches(query)[0]
    assert best[1] == args.doc_tokens, best
    print(f"{args.agents} agents x ({args.doc_tokens} shared + {args.private_tokens} private) tokens; "
          f"{idx.nodes()} tree nodes; median of {args.reps}")
    for name, s in rows:
        print(f"  {name:<38} {1e3 * s:8.3f} ms")
    scan, look = rows[2][1], rows[1][1]
    print(f"  lookup vs scan: {scan / look:.1f}x faster; a fresh agent's join re-inserts only agents that changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
