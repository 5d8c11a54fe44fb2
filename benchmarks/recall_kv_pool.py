"""Recall as KV through the pool: TTFT, answers and next-token KL of calls whose recall block quotes evicted
lines, with and without `PoolConfig.recall_kv`.

One agent states N distinct facts (16 by default, one distinctive answer word each) in long notes
under a token budget, followed by a few notes without a fact, so every fact's note is evicted
(with `recall_kv` its cells are captured on the way out). Then it asks about each fact in turn,
one call per fact: a recall block (`agentmem.tools.recall.recall_spans` / `recall_block`, queried
with the question) in front of the question, as an integration's memory puts it (the block is
shown for the current question only; earlier questions and replies stay in the history, the
flag-off session's replies in both sessions, so both send the same messages). The same
conversation runs on a fresh pool with the flag off (the baseline: the block is prefilled as
text) and on (each stored span found verbatim in the block is spliced as its cells), `--reps`
times each (TTFT median; replies are greedy, so every repetition answers the same).

Per question: TTFT off/on and their ratio, new tokens, tokens spliced in that call (the delta of
`recall_stats()["kv_spliced_tokens"]`), whether each greedy reply names the fact's answer word,
whether the two replies are identical (and how many leading tokens / characters agree), and the
KL divergence KL(off || on) of the next-token distribution at the end of the prompt, with top-1
agreement. The logits come from a benchmark-only hook: `Decoder.prefill` is wrapped in this
process to copy the logits of the prompt's last token (`llama_get_logits_ith(-1)`: the one output
row of the last chunk) after the prompt's prefill. Also the capture's cost: eviction time summed
over the session's calls, bytes captured, blobs stored and the archive file size (db + WAL).
One thread, `nice`; the load average is printed before and after.

Usage::

    python benchmarks/recall_kv_pool.py [--quick] [--reps 2] [--model qwen2.5-coder-0.5b-instruct]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import load, table  # noqa: E402
from recall_kv import kl  # noqa: E402  (KL(p || q) of two logit rows, p the reference)

from agentmem import MemoryPool  # noqa: E402
from agentmem.pool import decoder as _decoder  # noqa: E402
from agentmem.tools.recall import recall_block, recall_spans  # noqa: E402

import numpy as np  # noqa: E402  (after llama.cpp: DESIGN.md, "llama.cpp loads first")

#: (fact, question, answer word): each answer word appears in one note only
FACTS = [
    ("the shipment left Rotterdam harbor aboard the vessel Nordlys on the third of May",
     "Which vessel carried the shipment from Rotterdam harbor?", "nordlys"),
    ("the vault password is marmalade and only the night clerk knows it",
     "What is the vault password that the night clerk knows?", "marmalade"),
    ("the survey team camped at Kestrel Point beside the western marsh",
     "Where did the survey team camp beside the western marsh?", "kestrel"),
    ("the backup generator runs on biodiesel and was serviced by the engineer Ingrid Dahl",
     "Which engineer serviced the backup generator?", "dahl"),
    ("the audit group books the conference room called Saffron every Thursday",
     "Which conference room does the audit group book on Thursdays?", "saffron"),
    ("the prototype drone is code-named Albatross by the design team",
     "What code name did the design team give the prototype drone?", "albatross"),
    ("the library archive is stored in the basement of the Halvorsen building",
     "In which building's basement is the library archive stored?", "halvorsen"),
    ("the annual picnic will be catered by a bakery called Tamarind",
     "Which bakery will cater the annual picnic?", "tamarind"),
    ("the night train to the coast departs from platform Juniper at eleven",
     "From which platform does the night train to the coast depart?", "juniper"),
    ("the museum's new sculpture was carved by the artist Odile Marchetti",
     "Which artist carved the museum's new sculpture?", "marchetti"),
    ("the warehouse cats are fed salmon every morning by the porter Bram",
     "Which porter feeds the warehouse cats every morning?", "bram"),
    ("the research grant was awarded to the glacier project named Frostline",
     "Which glacier project was awarded the research grant?", "frostline"),
    ("the choir rehearses in the chapel of Saint Wenceslas on Mondays",
     "In which chapel does the choir rehearse on Mondays?", "wenceslas"),
    ("the lighthouse keeper's dog is a grey terrier called Pepper",
     "What is the name of the lighthouse keeper's dog?", "pepper"),
    ("the spare keys to the boathouse hang behind the portrait of Admiral Quist",
     "Behind which portrait do the spare keys to the boathouse hang?", "quist"),
    ("the school fundraiser sold four hundred jars of cloudberry jam",
     "What kind of jam did the school fundraiser sell?", "cloudberry"),
]
FILLER = ("The rest of this note repeats routine details: the weather was mild, the trains ran on time, "
          "the office coffee machine was cleaned, the weekly report was filed, and nothing else changed. ")
BUDGET = 768
TAIL_NOTES = 3  # notes without a fact after the facts: they push the last fact's note out of the budget

#: the logits row at the end of each `Decoder.prefill` in this process (the benchmark's hook; see `hook`)
_LOGITS: list[np.ndarray] = []


def hook() -> None:
    """Wrap `Decoder.prefill` so each call's last-token logits are copied into `_LOGITS` (benchmark only).

    The prompt's prefill ends with a text chunk (a splice never covers the prompt's last token), decoded
    with logits for its last token only, so `llama_get_logits_ith(-1)` is that row; the sampler reads
    the context's logits without writing them, so the row is still the prompt's after it sampled.
    """
    orig = _decoder.Decoder.prefill
    if getattr(orig, "_kvbench", False):
        return

    def prefill(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        _LOGITS.append(self.core.ctx.logits(-1))
        return out

    prefill._kvbench = True  # type: ignore[attr-defined]
    _decoder.Decoder.prefill = prefill  # type: ignore[method-assign]


def conversation(n_facts: int, *, inline: bool = False) -> list[dict]:
    """The notes: each fact on a line of its own (the filler lines, the same in every note, follow), or
    with `inline` at the start of the first filler line.

    Either way a recall block quotes the note with its line breaks, so the splice's run starts at the
    fact (after the rewritten `"Note"`) and runs on into the filler to the end of the note's stored
    row; the layouts differ in which other rows' filler matches the rest of the block.
    """
    msgs = [{"role": "system", "content": "You are a concise assistant. Answer from the conversation."}]
    sep = " " if inline else "\n"
    for i in range(n_facts + TAIL_NOTES):
        fact = FACTS[i][0] if i < n_facts else "nothing new happened today"
        msgs.append({"role": "user", "content": f"Note {i + 1}: {fact}.{sep}{FILLER * 3}\n{FILLER * 2}"})
        msgs.append({"role": "assistant", "content": f"Noted {i + 1}."})
    return msgs


def archive_bytes(db: str) -> int:
    """The archive's size on disk: the SQLite file and its write-ahead log."""
    return sum(os.path.getsize(p) for p in (db, db + "-wal") if os.path.exists(p))


def common_prefix(a: Any, b: Any) -> int:
    """How many leading items (tokens, characters) `a` and `b` share."""
    return len(os.path.commonprefix([list(a), list(b)]))


def session(model: str, *, recall_kv: bool, n_facts: int, max_tokens: int, inline: bool = False,
            replies: list[str] | None = None, heal: int = 4) -> dict[str, Any]:
    """One pool, one agent: the notes (first call), then one call per fact; everything measured.

    `replies`: the assistant turns to keep in the history after each question (the flag-off session's
    replies), so both sessions send the same messages; None keeps this session's own replies.
    """
    hook()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"{tmp}/a.db"
        with MemoryPool(
            model, n_ctx=8192, resident_agents=1, n_threads=1, prefetch=False, agent_budget_tokens=BUDGET,
            eviction="sliding_window", eviction_block=64, recall_embedder="none", archive_path=db,
            recall_kv=recall_kv, recall_kv_heal=heal,
        ) as p:
            hist = conversation(n_facts, inline=inline)
            r1 = p.chat("a", hist, max_tokens=1, temperature=0)
            hist = hist + [{"role": "assistant", "content": r1.text}]
            evict = r1.timings.evict_s
            qs = []
            for i, (_, question, answer) in enumerate(FACTS[:n_facts]):
                got = recall_spans(p, "a", question, 3)
                block = recall_block([t for t, _ in got])
                msgs = hist + ([{"role": "system", "content": block}] if block else []) + [
                    {"role": "user", "content": question}]
                before = p.recall_stats().get("kv_spliced_tokens", 0)
                _LOGITS.clear()
                r = p.chat("a", msgs, max_tokens=max_tokens, temperature=0)
                assert _LOGITS, "the prefill hook saw no call"
                logits = _LOGITS[0]
                assert r.tokens and int(np.argmax(logits)) == r.tokens[0] or not r.tokens, \
                    "the hooked logits are not the ones the greedy reply's first token came from"
                evict += r.timings.evict_s
                qs.append({
                    "ttft": r.timings.ttft_s, "new": r.usage.prompt_tokens - r.usage.cached_tokens,
                    "spliced": p.recall_stats().get("kv_spliced_tokens", 0) - before,
                    "recalled": len(got), "block": block, "in_block": answer in block.lower(),
                    "text": r.text, "tokens": list(r.tokens), "correct": answer in r.text.lower(),
                    "logits": logits,
                })
                said = r.text if replies is None else replies[i]
                hist = hist + [{"role": "user", "content": question}, {"role": "assistant", "content": said}]
            st = p.recall_stats()
            size = archive_bytes(db)
        return {"ttft1": r1.timings.ttft_s, "evict1": r1.timings.evict_s, "evict": evict, "qs": qs, "size": size,
                "capture_bytes": st.get("kv_capture_bytes", 0), "stored": st.get("kv_stored", 0),
                "stored_bytes": st.get("kv_stored_bytes", 0),
                "captured": st.get("kv_captured", 0), "matched": st.get("kv_matched", 0),
                "splice_failed": st.get("kv_splice_failed", 0)}


def short(text: str, n: int = 40) -> str:
    return text.strip().replace("\n", " ")[:n]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--quick", action="store_true", help="one repetition, shorter replies")
    ap.add_argument("--reps", type=int, default=2, help="sessions per flag (TTFT median); --quick: 1")
    ap.add_argument("--facts", type=int, default=len(FACTS), help=f"facts stated and asked (1..{len(FACTS)})")
    ap.add_argument("--inline", action="store_true",
                    help="each fact opens its note's first filler line (default: a line of its own)")
    ap.add_argument("--heal", default="32,4",
                    help="comma-separated recall_kv_heal values; the tables use the first, a sweep table lists all")
    ap.add_argument("--blocks", action="store_true", help="print each question's recall block (flag-off session)")
    args = ap.parse_args(argv)
    if not 1 <= args.facts <= len(FACTS):
        ap.error(f"--facts must be in 1..{len(FACTS)}")
    reps, max_tokens = (1, 32) if args.quick else (max(1, args.reps), 48)
    n = args.facts
    print(f"load before: {load()}")
    layout = "inline" if args.inline else "own line"
    print(f"model {args.model}, {n} facts ({layout}) + {TAIL_NOTES} plain notes, budget {BUDGET} tokens, "
          f"sliding_window/64, {reps} session(s) per flag, greedy replies of <= {max_tokens} tokens")
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(reps):
        runs[False].append(session(args.model, recall_kv=False, n_facts=n, max_tokens=max_tokens, inline=args.inline))
    said = [q["text"] for q in runs[False][0]["qs"]]  # both flags' histories hold the flag-off replies
    heals = [int(h) for h in args.heal.split(",")]
    sweep: dict[int, list[dict[str, Any]]] = {}
    for h in heals:
        for _ in range(reps):
            sweep.setdefault(h, []).append(session(args.model, recall_kv=True, n_facts=n, max_tokens=max_tokens,
                                                   inline=args.inline, replies=said, heal=h))
    runs[True] = sweep[heals[0]]
    off, on = runs[False][-1], runs[True][-1]

    print("first question (fact 1: the vessel), the scenario this script first measured alone:")

    def med(flag: bool, key: str, i: int | None = None) -> float:
        if i is None:
            return statistics.median(r[key] for r in runs[flag])
        return statistics.median(r["qs"][i][key] for r in runs[flag])

    # the first question (fact 1, the vessel) is the single-question scenario this script measured first
    rows, base = [], med(False, "ttft", 0)
    for flag in (False, True):
        last = runs[flag][-1]
        q0 = last["qs"][0]
        ttft = med(flag, "ttft", 0)
        rows.append(["on" if flag else "off", f"{1e3 * med(flag, 'ttft1'):.0f}", f"{1e3 * med(flag, 'evict1'):.0f}",
                     f"{1e3 * ttft:.0f}", f"{base / ttft:.2f}x", q0["new"], q0["recalled"], last["stored"],
                     q0["spliced"], short(q0["text"], 48)])
    print(table(["recall_kv", "call 1 TTFT ms", "its eviction ms", "call 2 TTFT ms", "vs off", "new tokens",
                 "spans recalled", "cells stored", "tokens spliced", "greedy reply"], rows))

    rows, ratios, kls, same_n = [], [], [], 0
    for i in range(n):
        a, b = off["qs"][i], on["qs"][i]
        t_off, t_on = med(False, "ttft", i), med(True, "ttft", i)
        ratios.append(t_off / t_on)
        d = kl(a["logits"], b["logits"])
        kls.append(d)
        same = a["tokens"] == b["tokens"]
        same_n += same
        rows.append([i + 1, FACTS[i][2], f"{1e3 * t_off:.0f}", f"{1e3 * t_on:.0f}", f"{t_off / t_on:.2f}x",
                     f"{a['new']}/{b['new']}", b["spliced"], f"{a['recalled']}/{b['recalled']}",
                     "y" if a["block"] == b["block"] else "n", "y" if a["in_block"] else "n",
                     "y" if a["correct"] else "n", "y" if b["correct"] else "n", f"{d:.2e}",
                     "y" if int(np.argmax(a["logits"])) == int(np.argmax(b["logits"])) else "n",
                     "y" if same else f"n ({common_prefix(a['tokens'], b['tokens'])} tok, "
                                      f"{common_prefix(a['text'], b['text'])} ch)"])
    print()
    print(table(["q", "answer", "TTFT off ms", "TTFT on ms", "off/on", "new tok off/on", "spliced",
                 "spans off/on", "same block", "answer in block", "off right", "on right", "KL(off||on)",
                 "top-1 same", "same reply (leading same)"], rows))
    print()
    print(table(["q", "reply off", "reply on"],
                [[i + 1, short(off["qs"][i]["text"], 64), short(on["qs"][i]["text"], 64)] for i in range(n)]))
    print()
    rows = []
    for flag in (False, True):
        last = runs[flag][-1]
        rows.append(["on" if flag else "off", f"{1e3 * med(flag, 'evict'):.0f}", last["captured"],
                     f"{last['capture_bytes'] / 2**20:.1f}", last["stored"], f"{last['stored_bytes'] / 2**20:.1f}",
                     last["matched"], last["splice_failed"],
                     f"{last['size'] / 2**20:.2f}"])
    print(table(["recall_kv", "eviction ms (all calls)", "captured", "capture MiB", "stored", "stored MiB", "matched",
                 "splice failed", "archive MiB (db+wal)"], rows))
    if args.blocks:
        for i, q in enumerate(off["qs"]):
            print(f"\n-- recall block of question {i + 1} ({FACTS[i][2]}):\n{q['block']}")
    right_off = sum(q["correct"] for q in off["qs"])
    right_on = sum(q["correct"] for q in on["qs"])
    if len(heals) > 1:
        rows = []
        for h in heals:
            last = sweep[h][-1]
            rat = [statistics.median(r["qs"][i]["ttft"] for r in runs[False])
                   / statistics.median(r["qs"][i]["ttft"] for r in sweep[h]) for i in range(n)]
            ks = [kl(off["qs"][i]["logits"], last["qs"][i]["logits"]) for i in range(n)]
            rows.append([h, f"{statistics.median(rat):.2f}x", f"{sum(q['correct'] for q in last['qs'])}/{n}",
                         f"{statistics.mean(ks):.2e}", f"{max(ks):.2e}",
                         f"{sum(off['qs'][i]['tokens'] == last['qs'][i]['tokens'] for i in range(n))}/{n}",
                         sum(q["spliced"] for q in last["qs"])])
        print()
        print(table(["heal", "median TTFT off/on", "on right", "KL mean", "KL max", "identical replies",
                     "tokens spliced"], rows))
    print(f"\nsummary (heal {heals[0]}): median TTFT off/on {statistics.median(ratios):.2f}x, accuracy off {right_off}/{n} "
          f"on {right_on}/{n}, KL(off||on) mean {statistics.mean(kls):.2e} max {max(kls):.2e} nats, "
          f"identical replies {same_n}/{n}, questions with a splice {sum(q['spliced'] > 0 for q in on['qs'])}/{n}")
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
