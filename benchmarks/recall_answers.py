"""The instruct model's answer accuracy with and without recall of evicted text (#34).

The conversation of ``benchmarks/recall.py``'s pool section (the 52 facts of
``benchmarks/_recall_set.py`` stated by the user among small talk) goes through a real
`MemoryPool` on Qwen2.5-Coder-0.5B-Instruct with a 256-token budget, so the facts are
evicted and archived. Then each of the first ``--facts`` facts is asked (by paraphrase, or
by keyword with ``--kind keyword``), greedy, 32 tokens at most, two ways:

* ``no recall`` — the question as the next user message; the facts are no longer in the KV;
* ``recall`` — the same message preceded by a system message holding the block the
  integrations' memories add (as MAF's `AgentMemContextProvider` does:
  `agentmem.tools.recall.recall_spans` + `recall_block`, the 3 best spans of
  `pool.recall`, completed to whole lines).

An answer is correct when it contains one of the fact's expected strings (``ANSWERS``,
case-insensitive exact substring: a name, a number, a place of the fact). Also reported:
how often the recalled block held the fact at all (an upper bound for the ``recall`` row).

Usage::

    python benchmarks/recall_answers.py [--quick] [--kind paraphrase|keyword] [--facts 32]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _recall_set import FACTS, FILLER  # noqa: E402
from _report import load, table  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.tools.recall import recall_block, recall_spans  # noqa: E402

ANSWERS: tuple[tuple[str, ...], ...] = (
    ("nordlys",), ("peanut",), ("secret/stage/db",), ("4.2",), ("thursday",),
    ("row k", "level four", "level 4"), ("nutmeg",), ("certificate", "tls"), ("signal",), ("march",),
    ("twice", "two times"), ("okafor",), ("join",), ("closed", "rockslide"), ("june",), ("neon",),
    ("bowling",), ("kestrel",), ("3.1",), ("priya",), ("third floor", "3rd floor"), ("offline",),
    ("128",), ("blue bin", "shed"), ("doubled",), ("october",), ("b22",),
    ("eighteen thousand", "18,000", "18000", "18 000"), ("600",), ("alvarez",),
    ("five through nine", "5 through 9", "5-9", "5 to 9", "organic"), ("45",),
)
"""Per fact (in `FACTS` order), the strings one of which a correct answer contains."""


def correct(reply: str, i: int) -> bool:
    """Whether `reply` states fact `i`'s answer (one of its `ANSWERS`, case-insensitive substring)."""
    low = reply.lower()
    return any(a in low for a in ANSWERS[i])


def run(model: str, threads: int, n_facts: int, kind: str) -> tuple[list[list[Any]], list[list[Any]]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."}]
    fill = iter(FILLER * 3)
    for f in FACTS:
        msgs += [{"role": "user", "content": f.text}, {"role": "assistant", "content": next(fill)}]
    hits = {"no recall": 0, "recall": 0}
    held = 0
    secs = {"no recall": 0.0, "recall": 0.0}
    samples: list[list[Any]] = []
    with tempfile.TemporaryDirectory() as d, MemoryPool(
        model, n_threads=threads, n_ctx=8192, resident_agents=1, prefetch=False, archive_path=str(Path(d) / "a.db"),
        agent_budget_tokens=256,
    ) as pool:
        t0 = time.perf_counter()
        pool.chat("a", msgs + [{"role": "user", "content": "Thanks for listening."}], max_tokens=1)
        t_conv = time.perf_counter() - t0
        for i, f in enumerate(FACTS[:n_facts]):
            q = getattr(f, kind)
            spans = recall_spans(pool, "a", q, 3)
            block = recall_block([text for text, _ in spans])
            held += correct(block, i) or f.text in block
            ask = [{"role": "user", "content": q}]
            note = [{"role": "system", "content": block}] if block else []
            for way, extra in (("no recall", ask), ("recall", note + ask)):
                t0 = time.perf_counter()
                r = pool.chat("a", msgs + extra, max_tokens=32, temperature=0.0)
                secs[way] += time.perf_counter() - t0
                ok = correct(r.text, i)
                hits[way] += ok
                if i < 4:
                    samples.append([i, way, "yes" if ok else "no", r.text.strip().replace("\n", " ")[:70]])
    rows = [[way, f"{hits[way]}/{n_facts}", f"{hits[way] / n_facts:.2f}", f"{secs[way] / n_facts:.1f}"]
            for way in ("no recall", "recall")]
    rows.append(["(recall block held the fact)", f"{held}/{n_facts}", f"{held / n_facts:.2f}", "-"])
    rows.append(["(conversation prefill)", "-", "-", f"{t_conv:.1f}"])
    return rows, samples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--kind", choices=("paraphrase", "keyword"), default="paraphrase")
    ap.add_argument("--facts", type=int, default=len(ANSWERS))
    ap.add_argument("--threads", type=int, default=int(os.environ.get("AGENTMEM_THREADS", "1")))
    ap.add_argument("--quick", action="store_true", help="12 facts")
    args = ap.parse_args(argv)
    n = min(12 if args.quick else args.facts, len(ANSWERS))
    print(f"load before: {load()}  model: {args.model}  questions: {n} by {args.kind}")
    rows, samples = run(args.model, args.threads, n, args.kind)
    print(f"\n== answer accuracy (exact substring of the expected answer), {n} questions by {args.kind}\n")
    print(table(["way", "correct", "accuracy", "s per question"], rows))
    print("\n== first answers\n")
    print(table(["fact", "way", "correct", "reply"], samples))
    print(f"\nload after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
