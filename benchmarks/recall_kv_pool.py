"""Recall as KV through the pool: the TTFT of a call whose recall block quotes evicted lines, with and without
`PoolConfig.recall_kv`.

One agent states facts in long notes under a token budget (the early notes are evicted; with
`recall_kv` their cells are captured on the way out), then asks about the first notes with a
recall block (`agentmem.tools.recall.recall_spans` / `recall_block`) in front of its question.
The second call's TTFT is measured with the flag off (the baseline: the block is prefilled as
text) and on (each stored span found verbatim in the block is spliced as its cells), each on a
fresh pool, `--reps` times, median; with the greedy reply of each, and the first call's TTFT
and eviction time (where the capture's cost lands). One thread, `nice`.

Usage::

    python benchmarks/recall_kv_pool.py [--quick] [--model qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import load, table  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.tools.recall import recall_block, recall_spans  # noqa: E402

FACTS = [
    "the shipment left Rotterdam harbor aboard the vessel Nordlys on the third of May",
    "the vault password is marmalade and only the night clerk knows it",
    "the survey team counted forty two herons nesting along the western marsh",
    "the backup generator runs on biodiesel and was serviced by Ingrid Dahl",
    "the conference room on floor nine is booked every Thursday by the audit group",
    "the prototype drone weighs one point seven kilograms without its battery pack",
]
FILLER = ("The rest of this note repeats routine details: the weather was mild, the trains ran on time, "
          "the office coffee machine was cleaned, the weekly report was filed, and nothing else changed. ")


def conversation(n_notes: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You are a concise assistant. Answer from the conversation."}]
    for i in range(n_notes):
        fact = FACTS[i % len(FACTS)]
        msgs.append({"role": "user", "content": f"Note {i + 1}: {fact}.\n{FILLER * 3}\n{FILLER * 2}"})
        msgs.append({"role": "assistant", "content": f"Noted {i + 1}."})
    return msgs


def run(model: str, *, recall_kv: bool, n_notes: int, budget: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, MemoryPool(
        model, n_ctx=8192, resident_agents=1, n_threads=1, prefetch=False, agent_budget_tokens=budget,
        eviction="sliding_window", eviction_block=64, recall_embedder="none", archive_path=f"{tmp}/a.db",
        recall_kv=recall_kv,
    ) as p:
        msgs = conversation(n_notes)
        r1 = p.chat("a", msgs, max_tokens=1, temperature=0)
        got = recall_spans(p, "a", "vessel shipment Rotterdam harbor password", 3)
        block = recall_block([t for t, _ in got])
        msgs2 = msgs + [{"role": "assistant", "content": r1.text}, {"role": "system", "content": block},
                        {"role": "user", "content": "Which vessel carried the shipment?"}]
        r2 = p.chat("a", msgs2, max_tokens=12, temperature=0)
        st = p.recall_stats()
        return {"ttft": r2.timings.ttft_s, "ttft1": r1.timings.ttft_s, "evict1": r1.timings.evict_s, "prefill": r2.usage.prompt_tokens - r2.usage.cached_tokens,
                "reply": r2.text.strip().replace("\n", " ")[:48], "recalled": len(got),
                "spliced": st.get("kv_spliced_tokens", 0), "stored": st.get("kv_stored", 0)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--quick", action="store_true", help="one repetition, fewer notes")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args(argv)
    reps, n_notes = (1, 6) if args.quick else (args.reps, 8)
    print(f"load before: {load()}")
    rows, base = [], None
    for flag in (False, True):
        res = [run(args.model, recall_kv=flag, n_notes=n_notes, budget=768) for _ in range(reps)]
        ttft = statistics.median(r["ttft"] for r in res)
        ttft1 = statistics.median(r["ttft1"] for r in res)
        evict1 = statistics.median(r["evict1"] for r in res)
        base = base or ttft
        last = res[-1]
        rows.append(["on" if flag else "off", f"{1e3 * ttft1:.0f}", f"{1e3 * evict1:.0f}", f"{1e3 * ttft:.0f}", f"{base / ttft:.2f}x", last["prefill"],
                     last["recalled"], last["stored"], last["spliced"], last["reply"]])
    print(table(["recall_kv", "call 1 TTFT ms", "its eviction ms", "call 2 TTFT ms", "vs off", "new tokens", "spans recalled", "cells stored", "tokens spliced",
                 "greedy reply"], rows))
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
