"""Placement policies on traces: agentmem's `cost` against plain LRU, LFU and llama-server's oldest-first.

Three traces are replayed under RAM budgets for parked states of 25 / 50 / 100 % of
the working set (the f16 bytes of every agent's final state):

* `replay` — the replay benchmark's conversations (`benchmarks/replay.py`: 24
  conversations, ~600 tokens of notes and a tool round trip each, then 3 rounds of one
  more user turn, round-robin, back to back), token counts from the bundled model's
  tokenizer; 2 live sequences, as that benchmark runs.
* `agents` — a many-agent synthetic trace (`--seeds` seeds, 3 by default): 4 foreground agents called steadily, 16
  normal agents in bursts (3-8 calls a few seconds apart, then minutes of silence), 20
  background agents that wake rarely; arrivals at fixed times (open loop); 4 sequences.
* `workflow` — hint-driven teams (`--seeds` seeds): 6 teams of a supervisor and 3 workers; the
  supervisor routes to a worker, the worker calls a tool (its reply is a call: the pool
  holds it) and runs again when the tool returns, then the supervisor; the framework
  tells the pool the expected order (`expect`) per team; 4 sequences.

Policies: `cost` (agentmem's default), `lru`, `lfu` — each with the workflow's hints
and without — and `oldest` (llama-server: slots by least recent use, its RAM prompt
cache drops the oldest saved state first; no hints).

**What is simulated** (`benchmarks/_policy_sim.py`): the pool's tiers, byte budgets
and watermarks, and time; the placement objects, the transition predictor and the
hints are agentmem's own. Time comes from a cost model calibrated at the start of the
run on the bundled model (prefill and decode tokens/s, park and restore seconds per
MiB of state per codec, bytes per token; printed), so the TTFTs are modelled, not
measured; the hit rates and prefilled tokens follow from the policies' decisions
alone. One call is served at a time; prefetch is off; there is no archive (a state
pushed out of RAM re-prefills).

Run: `python benchmarks/policy_replay.py` (`--quick`: fewer agents and calls;
`--out FILE` writes the JSON). Prints the tables, the winner and `uptime`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agentmem  # noqa: E402,F401 - first: llama.cpp's libraries load before numpy (engine/native_first.py)
import numpy as np  # noqa: E402

from agentmem.codec import CodecSpec, decode_state, encoded_info  # noqa: E402
from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel  # noqa: E402
from agentmem.model import resolve_model_path  # noqa: E402
from agentmem.policy.placement import get_policy  # noqa: E402

from benchmarks._policy_sim import Call, Costs, OldestFirst, Outcome, Variant, simulate, working_set_bytes  # noqa: E402
from benchmarks._report import md_table, table  # noqa: E402
from benchmarks._vs_workloads import WORDS  # noqa: E402

logger = logging.getLogger("policy_replay")
CODECS = ("f16", "q8_0", "q8_0/q4_0")
BUDGETS = (0.25, 0.5, 1.0)


def say(msg: str) -> None:
    """Result tables go to stdout (this module is a command)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------------ calibration
def calibrate(model_path: Path, threads: int, n_tokens: int = 1024) -> Costs:
    """Measure the cost model's rates on `model_path` (one short run, best of 2)."""
    rng = random.Random(1)
    text = " ".join(rng.choice(WORDS) for _ in range(2 * n_tokens))
    with LlamaModel(model_path) as model:
        toks = model.tokenize(text, add_special=True)[:n_tokens]
        params = ContextParams(n_ctx=4 * n_tokens, n_seq_max=2, n_threads=threads, flash_attn=True)
        with LlamaContext(model, params) as ctx:
            prefill = []
            for _ in range(2):
                ctx.clear()
                t0 = time.perf_counter()
                ctx.decode_run(0, toks, 0)
                prefill.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            tok, pos, n_dec = toks[-1], len(toks), 32
            for i in range(n_dec):
                tok = int(np.argmax(ctx.logits(ctx.decode_run(0, [tok], pos + i))))
            decode_s = time.perf_counter() - t0
            park: dict[str, float] = {}
            restore: dict[str, float] = {}
            ratio: dict[str, float] = {}
            blob = ctx.state_get(0)
            mb = blob.nbytes / 2**20
            for codec in CODECS:
                best_p = best_r = float("inf")
                for _ in range(2):
                    t0 = time.perf_counter()
                    b = ctx.state_get(0)
                    enc = CodecSpec.parse(codec).encode(b)
                    best_p = min(best_p, time.perf_counter() - t0)
                    ctx.seq_rm(1)
                    t0 = time.perf_counter()
                    ctx.state_set(1, decode_state(enc))
                    best_r = min(best_r, time.perf_counter() - t0)
                park[codec], restore[codec] = best_p / mb, best_r / mb
                ratio[codec] = encoded_info(enc).n_bytes / blob.nbytes
    return Costs(prefill_tok_s=len(toks) / min(prefill), decode_tok_s=n_dec / decode_s,
                 bytes_per_token=blob.nbytes / len(toks), park_s_per_mb=park, restore_s_per_mb=restore, ratio=ratio)


# ------------------------------------------------------------------------------------ traces
def replay_trace(model_path: Path, n_conv: int, notes: int, rounds: int, reply: int) -> list[Call]:
    """The replay benchmark's conversations as calls (token counts from the model's tokenizer)."""
    from benchmarks.replay import conversations

    hist = conversations(n_conv, notes, seed=7)
    with LlamaModel(model_path) as model:
        def n(text: str) -> int:
            return len(model.tokenize(text)) + 8  # + the template's markers of one message

        first = {c: sum(n(m["content"] or json.dumps(m.get("tool_calls"))) for m in msgs) + 120  # + two tools
                 for c, msgs in hist.items()}
        ask = n("Thanks, agent. In one short sentence, what is that note about?")
        more = n("Next question (1): name one word from your notes.")
    calls = [Call(c, first[c] + ask, reply) for c in hist]
    for _ in range(rounds):
        calls += [Call(c, more, reply) for c in hist]
    return calls


def agents_trace(n_fg: int, n_bursty: int, n_bg: int, horizon_s: float, seed: int) -> list[Call]:
    """Foreground agents called steadily, bursty normal ones, background ones that wake rarely."""
    rng = random.Random(seed)
    events: list[tuple[float, Call]] = []

    def agent(aid: str, prio: str, times: list[float]) -> None:
        for i, t in enumerate(times):
            new = rng.randint(300, 1500) if i == 0 else rng.randint(20, 200)
            events.append((t, Call(aid, new, rng.randint(20, 120), at=t, priority=prio)))

    for i in range(n_fg):
        t, ts = rng.uniform(0, 5), []
        while t < horizon_s:
            ts.append(t)
            t += rng.expovariate(1 / 8.0)
        agent(f"fg{i}", "foreground", ts)
    for i in range(n_bursty):
        t, ts = rng.uniform(0, 60), []
        while t < horizon_s:
            for _ in range(rng.randint(3, 8)):
                ts.append(t)
                t += rng.uniform(1.0, 4.0)
            t += rng.expovariate(1 / 120.0)
        agent(f"burst{i}", "normal", [x for x in ts if x < horizon_s])
    for i in range(n_bg):
        t, ts = rng.uniform(0, 120), []
        while t < horizon_s:
            ts.append(t)
            t += rng.expovariate(1 / 240.0)
        agent(f"bg{i}", "background", ts)
    return [c for _, c in sorted(events, key=lambda e: (e[0], e[1].agent))]


def workflow_trace(n_teams: int, rounds: int, seed: int) -> list[Call]:
    """Supervisor/worker teams with expected orders and tool-call holds, interleaved by time."""
    rng = random.Random(seed)
    events: list[tuple[float, Call]] = []
    for k in range(n_teams):
        boss, workers = f"t{k}-boss", [f"t{k}-w{j}" for j in range(3)]
        t = rng.uniform(0, 10)
        first = True
        for _ in range(rounds):
            w = rng.choice(workers)
            events.append((t, Call(boss, rng.randint(600, 1200) if first else rng.randint(40, 160),
                                   rng.randint(20, 60), at=t, expect=[w, boss], scope=f"t{k}")))
            first = False
            t += rng.uniform(2.0, 6.0)
            events.append((t, Call(w, rng.randint(60, 400), rng.randint(20, 50), at=t, hold=True,
                                   expect=[w, boss], scope=f"t{k}")))
            t += rng.uniform(1.0, 5.0)  # the tool runs
            events.append((t, Call(w, rng.randint(40, 300), rng.randint(30, 120), at=t,
                                   expect=[boss, workers], scope=f"t{k}")))
            t += rng.uniform(2.0, 8.0)
    return [c for _, c in sorted(events, key=lambda e: (e[0], e[1].agent))]


# ------------------------------------------------------------------------------------ the comparison
def variants() -> list[Variant]:
    """The policies compared (fresh objects: `oldest` keeps state)."""
    out = []
    for name in ("cost", "lru", "lfu"):
        out.append(Variant(f"{name}+hints", get_policy(name), hints=True))
        out.append(Variant(name, get_policy(name), hints=False))
    out.append(Variant("oldest (llama-server)", OldestFirst(), hints=False))
    return out


def paced(trace: list[Call], costs: Costs, utilization: float) -> tuple[list[Call], float]:
    """`trace` with its arrival times stretched so the server is busy `utilization` of the time at best.

    The busy time counted is the least any policy needs (new prompt tokens and replies,
    no re-prefill, no restore), so an open-loop trace never builds an endless queue on a
    slow machine; a closed-loop trace (no arrival times) is returned as it is.
    """
    if not trace or trace[-1].at is None:
        return trace, 1.0
    busy = sum(c.new_tokens / costs.prefill_tok_s + c.reply_tokens / costs.decode_tok_s for c in trace)
    span = max(c.at or 0.0 for c in trace)
    k = max(1.0, busy / (utilization * span)) if span > 0 else 1.0
    return [dataclasses.replace(c, at=(c.at or 0.0) * k) for c in trace], k


def run_trace(name: str, trace: list[Call], costs: Costs, resident: int, utilization: float,
              max_tokens: int) -> dict[str, Any]:
    trace, stretch = paced(trace, costs, utilization)
    ws = working_set_bytes(trace, costs, max_tokens)
    rows: dict[str, Any] = {"calls": len(trace), "agents": len({c.agent for c in trace}), "working_set_bytes": ws,
                            "resident": resident, "time_stretch": stretch, "budgets": {}}
    for frac in BUDGETS:
        res: dict[str, Outcome] = {v.name: simulate(trace, v, costs, resident=resident, warm_budget=int(frac * ws),
                                                       max_tokens=max_tokens)
                                   for v in variants()}
        rows["budgets"][str(frac)] = {k: {"hit_rate": o.hit_rate, "prefilled_tokens": o.prefilled_tokens,
                                          "prompt_tokens": o.prompt_tokens, "restores": o.restores, "drops": o.drops,
                                          "ttft_p50_s": o.pct(50), "ttft_p95_s": o.pct(95)}
                                      for k, o in res.items()}
    logger.info("trace %s: %d calls, %d agents, working set %.1f MiB", name, len(trace), rows["agents"], ws / 2**20)
    return rows


def fmt(name: str, r: dict[str, Any], md: bool) -> str:
    headers = ["budget", "policy", "hit rate", "prefilled tok", "vs cost+hints", "p50 TTFT", "p95 TTFT", "drops"]
    body = []
    for frac, res in r["budgets"].items():
        base = res["cost+hints"]["prefilled_tokens"] or 1
        for pol, o in res.items():
            body.append([f"{float(frac):.0%}", pol, f"{o['hit_rate']:.1%}", o["prefilled_tokens"],
                         f"{o['prefilled_tokens'] / base:.2f}x", f"{1e3 * o['ttft_p50_s']:.0f} ms",
                         f"{1e3 * o['ttft_p95_s']:.0f} ms", o["drops"]])
    head = f"{name}: {r['calls']} calls, {r['agents']} agents, {r['resident']} sequences, " \
           f"working set {r['working_set_bytes'] / 2**20:.1f} MiB, arrival times x{r['time_stretch']:.1f}"
    return head + "\n\n" + (md_table if md else table)(headers, body)


def compact(results: dict[str, Any]) -> str:
    """A markdown row per trace and budget: each policy's hit rate, prefilled tokens (x cost+hints), p50/p95 TTFT."""
    pols = ["cost+hints", "lru+hints", "lfu+hints", "lru", "oldest (llama-server)"]
    headers = ["trace", "budget", *pols]
    rows = []
    for name, r in results.items():
        for frac, res in r["budgets"].items():
            base = res["cost+hints"]["prefilled_tokens"] or 1
            rows.append([name, f"{float(frac):.0%}", *(
                f"{o['hit_rate']:.0%} · {o['prefilled_tokens'] / base:.2f}x · "
                f"{o['ttft_p50_s']:.1f}/{o['ttft_p95_s']:.0f} s" for o in (res[p] for p in pols))])
    return md_table(headers, rows)


def winner(results: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """The placement policy (each with hints, as the pool runs by default) that re-prefills least.

    Score: the mean, over every trace at the 25 % and 50 % budgets (at 100 % the
    policies hardly differ), of a policy's prefilled tokens over the fewest any policy
    needed in that cell (1.0 = best everywhere); ties go to the lower mean p95 TTFT.
    """
    score: dict[str, list[float]] = {}
    cells = 0
    for r in results.values():
        for frac in ("0.25", "0.5"):
            res = {p.removesuffix("+hints"): o for p, o in r["budgets"][frac].items() if p.endswith("+hints")}
            least = max(1, min(o["prefilled_tokens"] for o in res.values()))
            cells += 1
            for pol, o in res.items():
                s = score.setdefault(pol, [0.0, 0.0])
                s[0] += o["prefilled_tokens"] / least
                s[1] += o["ttft_p95_s"]
    best = min(score, key=lambda k: (round(score[k][0], 6), score[k][1]))
    return best, {k: v[0] / cells for k, v in score.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m", help="bundled model name or GGUF for the calibration")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="fewer agents and calls")
    ap.add_argument("--utilization", type=float, default=0.3,
                    help="open-loop traces are stretched to keep the server at most this busy")
    ap.add_argument("--max-tokens", type=int, default=4096,
                    help="live tokens an agent keeps at most (the pool's eviction trims it)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of each synthetic trace (--quick: 1)")
    ap.add_argument("--md", action="store_true", help="also a compact markdown table (for docs/tiers.md)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    path = resolve_model_path(args.model)
    uptime0 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    costs = calibrate(path, args.threads)
    say(f"cost model measured on {path.name}, {args.threads} thread(s) (uptime: {uptime0}):")
    say(f"  prefill {costs.prefill_tok_s:.0f} tok/s, decode {costs.decode_tok_s:.1f} tok/s, "
        f"{costs.bytes_per_token:.0f} state bytes/token (f16)")
    for c in CODECS:
        say(f"  {c:10s} park {1e3 * costs.park_s_per_mb[c]:.2f} ms/MiB, restore {1e3 * costs.restore_s_per_mb[c]:.2f}"
            f" ms/MiB, size {costs.ratio[c]:.3f} of f16")
    q = args.quick
    if q:
        args.seeds = 1
    traces = {"replay": (replay_trace(path, 8 if q else 24, 300 if q else 600, 1 if q else 3, 12), 2)}
    for seed in range(args.seeds):
        traces[f"agents/{seed}"] = (agents_trace(2 if q else 4, 8 if q else 16, 10 if q else 20,
                                                 300.0 if q else 600.0, 3 + seed), 4)
        traces[f"workflow/{seed}"] = (workflow_trace(3 if q else 6, 4 if q else 8, 5 + seed), 4)
    results = {k: run_trace(k, t, costs, n, args.utilization, args.max_tokens) for k, (t, n) in traces.items()}
    say("\nSIMULATED: tiers, budgets and time (cost model above); REAL: agentmem's placement objects, predictor, hints."
        "\nhit rate = cached / prompt tokens; TTFT modelled (queue + park + restore + prefill), one call at a time.\n")
    for k, r in results.items():
        say(fmt(k, r, False) + "\n")
    if args.md:
        say("Each cell: hit rate · prefilled tokens (x cost+hints) · p50/p95 TTFT (modelled)\n")
        say(compact(results) + "\n")
    best, score = winner(results)
    say("prefilled tokens over the fewest in the cell, mean over traces at the 25 % and 50 % budgets, with hints: "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(score.items(), key=lambda kv: kv[1])))
    say(f"winner: {best}")
    uptime1 = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    say(f"uptime at the end: {uptime1}")
    if args.out:
        args.out.write_text(json.dumps({"costs": costs.__dict__, "results": results, "winner": best,
                                        "score": score, "uptime": [uptime0, uptime1], "cpus": os.cpu_count()},
                                       indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
