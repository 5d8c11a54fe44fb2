"""Resident-count scaling: one agent's new-turn TTFT and decode rate as resident agents grow.

In a unified KV cache (`kv_unified=True`, the pool's `kv_layout="unified"`) every decode
attends over every occupied cell, other sequences' cells masked, so resident agents slow
each other down. With per-sequence KV streams (`kv_layout="per_sequence"`,
`kv_unified=False`) a decode attends over its own agent's cells only.

One run, both layouts: two pools with `--max-resident` (8) live sequences and the same
`n_ctx` (`--max-resident` × `--stream-tokens`), open side by side. Resident agents, each
with a ~`--tokens` (1,500) token history, are added 1 → 2 → 4 → 8 (`--counts`); at each
count the probe agent (always resident, the first one) takes `--repeats` new turns in each
pool, interleaved (unified, per-sequence, unified, ...), each the same ~25-token question
after the same history (only the turn is decoded), generating `--decode-tokens` tokens.
Reported per count and layout: median TTFT, median decode tokens/s, the median process
CPU seconds of a turn (`time.process_time`: with `--threads 1` it counts the work, not
the waiting, so it holds up on a busy machine better than wall time), the ratio to the
same layout with one resident agent, and per-sequence over unified. Greedy replies of
both layouts are compared (they must match token for token). `uptime` load averages are
recorded at the start and the end.

Run: `python benchmarks/resident_scaling.py` (Gemma 3 270M, 2 threads: a few minutes).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agentmem import MemoryPool  # noqa: E402
from agentmem.pool.layout import PER_SEQUENCE_FROM  # noqa: E402
from benchmarks._report import add_gpu_layers, load, md_table, table  # noqa: E402

WORDS = ("river stone lantern market orchard signal harbor ledger garden copper thunder meadow compass violin "
         "bakery glacier pencil canyon tunnel beacon window silver forest engine planet basket mirror rocket "
         "island candle button ladder marble feather pocket saddle timber velvet wagon anchor").split()
LAYOUTS = ("unified", "per_sequence")


def say(msg: str) -> None:
    """Progress goes to stdout (this module is a command)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def history(i: int, tokens: int) -> list[dict[str, str]]:
    """Agent `i`'s system message of ~`tokens` tokens of seeded words (about 1.05 tokens a word)."""
    rng = random.Random(i)
    words = " ".join(rng.choice(WORDS) for _ in range(int(tokens / 1.05)))
    return [{"role": "system", "content": f"You are agent {i}. Your notes: {words}"}]


def probe_turn(pool: MemoryPool, base: list[dict[str, str]], k: int, decode_tokens: int) -> Any:
    """One new turn of the probe agent (the history is cached; the question is decoded)."""
    msgs = base + [{"role": "user", "content": f"Question {k % 10}: which word comes first in your notes, and why?"}]
    return pool.chat("probe", msgs, max_tokens=decode_tokens, temperature=0)


def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = sorted({int(c) for c in args.counts.split(",")})
    n_max = max(counts)
    assert n_max <= args.max_resident, f"{n_max=} > {args.max_resident=}"
    n_ctx = args.max_resident * args.stream_tokens
    opts = dict(model=args.model, n_ctx=n_ctx, resident_agents=args.max_resident, n_threads=args.threads,
                agent_capacity=args.stream_tokens, prefetch=False, batch_decode=False, min_share_tokens=0)
    started = load()
    say(f"load at start: {started}; n_ctx={n_ctx}, {args.max_resident} live sequences, {args.threads} threads")
    pools = {lay: MemoryPool(kv_layout=lay, **opts) for lay in LAYOUTS}
    rows: dict[tuple[int, str], dict[str, Any]] = {}
    replies: dict[str, list[list[int]]] = {lay: [] for lay in LAYOUTS}
    try:
        base = history(0, args.tokens)
        for lay, p in pools.items():
            probe_turn(p, base, 0, 1)  # the probe's history
        resident = 1
        for n in counts:
            t_fill = time.perf_counter()
            for i in range(resident, n):  # other resident agents, each ~tokens long
                for p in pools.values():
                    p.chat(f"agent-{i}", history(i, args.tokens) + [{"role": "user", "content": "Hello."}], max_tokens=1)
            resident = max(resident, n)
            for p in pools.values():
                st = p.stats()["totals"]
                assert st["resident"] == n, (st["resident"], n)
            fill_s = time.perf_counter() - t_fill
            samples: dict[str, list[Any]] = {lay: [] for lay in LAYOUTS}
            cpu: dict[str, list[float]] = {lay: [] for lay in LAYOUTS}
            for k in range(args.repeats):
                for lay in (LAYOUTS if k % 2 == 0 else LAYOUTS[::-1]):
                    c0 = time.process_time()
                    r = probe_turn(pools[lay], base, k + 1, args.decode_tokens)
                    cpu[lay].append(time.process_time() - c0)
                    samples[lay].append(r)
                    replies[lay].append(list(r.tokens))
            for lay in LAYOUTS:
                rs = samples[lay]
                rows[(n, lay)] = {
                    "resident": n, "layout": lay,
                    "ttft_s": statistics.median(r.timings.ttft_s for r in rs),
                    "decode_tok_s": statistics.median((len(r.tokens) - 1) / r.timings.decode_s for r in rs if r.timings.decode_s > 0),
                    "cpu_s": statistics.median(cpu[lay]),
                    "prefilled": statistics.median(r.usage.prompt_tokens - r.usage.cached_tokens for r in rs),
                    "kv": sorted({r.kv for r in rs}),
                }
            say(f"resident {n}: " + ", ".join(f"{lay} TTFT {1e3 * rows[(n, lay)]['ttft_s']:.0f} ms" for lay in LAYOUTS)
                + f" (fill {fill_s:.1f} s, load {load()})")
    finally:
        for p in pools.values():
            p.close()
    ended = load()
    same = replies["unified"] == replies["per_sequence"]
    differ = [i for i, (u, q) in enumerate(zip(replies["unified"], replies["per_sequence"])) if u != q]
    out_rows = []
    for n in counts:
        u, s = rows[(n, "unified")], rows[(n, "per_sequence")]
        for r in (u, s):
            one = rows[(counts[0], r["layout"])]
            r["ttft_vs_first"] = r["ttft_s"] / one["ttft_s"]
            r["decode_vs_first"] = r["decode_tok_s"] / one["decode_tok_s"]
            r["cpu_vs_first"] = r["cpu_s"] / one["cpu_s"]
        s["ttft_vs_unified"] = s["ttft_s"] / u["ttft_s"]
        s["decode_vs_unified"] = s["decode_tok_s"] / u["decode_tok_s"]
        s["cpu_vs_unified"] = s["cpu_s"] / u["cpu_s"]
        out_rows += [u, s]
    return {"model": args.model, "threads": args.threads, "tokens": args.tokens, "repeats": args.repeats,
            "decode_tokens": args.decode_tokens, "n_ctx": n_ctx, "load_start": started, "load_end": ended,
            "replies_identical": same, "replies_differing": differ, "rule_per_sequence_from": PER_SEQUENCE_FROM, "rows": out_rows}


def report(res: dict[str, Any]) -> str:
    hdr = ["resident agents", "layout", "new-turn TTFT", "vs 1 resident", "decode tok/s", "vs 1 resident",
           "CPU s per turn", "vs 1 resident", "per-seq / unified TTFT", "per-seq / unified decode", "per-seq / unified CPU"]
    body = []
    for r in res["rows"]:
        per = r["layout"] == "per_sequence"
        body.append([r["resident"], r["layout"], f"{1e3 * r['ttft_s']:.0f} ms", f"{r['ttft_vs_first']:.2f}x",
                     f"{r['decode_tok_s']:.1f}", f"{r['decode_vs_first']:.2f}x", f"{r['cpu_s']:.2f}", f"{r['cpu_vs_first']:.2f}x",
                     f"{r['ttft_vs_unified']:.2f}x" if per else "", f"{r['decode_vs_unified']:.2f}x" if per else "",
                     f"{r['cpu_vs_unified']:.2f}x" if per else ""])
    lines = [table(hdr, body), "", md_table(hdr, body), "",
             f"greedy replies identical across layouts: {res['replies_identical']} (differing probe turns: {res['replies_differing']})",
             f"load averages: start {res['load_start']}, end {res['load_end']}",
             f"auto rule: per_sequence from {res['rule_per_sequence_from']} resident agents "
             "(when agent_capacity fits a stream)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gemma-3-270m")
    ap.add_argument("--threads", type=int, default=2)
    add_gpu_layers(ap)
    ap.add_argument("--tokens", type=int, default=1500, help="history tokens of each resident agent")
    ap.add_argument("--counts", default="1,2,4,8")
    ap.add_argument("--max-resident", type=int, default=8)
    ap.add_argument("--stream-tokens", type=int, default=2048, help="cells per agent (n_ctx = max-resident x this)")
    ap.add_argument("--repeats", type=int, default=3, help="probe turns per layout and count")
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON")
    args = ap.parse_args(argv)
    res = run(args)
    say(report(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))
    return 0 if res["replies_identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
