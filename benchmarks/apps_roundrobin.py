"""AutoGen round-robin team whose parked states do not all fit in RAM: where a known order beats recency.

The four roles of `benchmarks/apps_autogen.py` (three with a tool) take turns as a
`RoundRobinGroupChat` on the instruct model, on `--resident` (2) live sequences and a
WARM budget (`--warm-mib`) that holds fewer parked states than the team has; without
an archive a state over the budget is dropped and its agent re-prefills its whole
history on its next turn (`--archive` demotes it to a SQLite COLD tier instead).

In a cycle longer than what is kept, recency (LRU, the learned predictor's fallback)
gives up exactly the agent that speaks next: every turn after the first round finds
its agent dropped. `follow(team)` tells the pool the turn order (KVFlow's
steps-to-next-use, arXiv 2507.07400): the state given up is the one used furthest
ahead, and the next speaker is restored while AgentChat hands it the turn.

Variants, in the order given (`--variants`, repeat one for an ABBA order):
`hints` (`follow(team)` + the pool's own tool-call holds), `no-hints`
(`PoolConfig(hints=False)`, no `follow`), `all-resident` (a live sequence for every
agent, no RAM pressure: the bound), `peer` (autogen-ext's `LlamaCppChatCompletionClient`,
one `Llama` for the team).

Reported per variant: wall time per task, prefilled and decoded tokens, p50/p99 TTFT,
how each call found its KV (`reused`, `restored`, `prefilled`, ...), hint hit rate,
drops/demotions; and the ratios the issue asks for (wall hints/no-hints, p99
hints/all-resident). Record the load: compare only inside one run.

Run: `python benchmarks/apps_roundrobin.py --threads 2 --tasks 2 --rounds 3`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
from typing import Any, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import add_gpu_layers, load, md_table, table  # noqa: E402
from apps_autogen import (  # noqa: E402
    MODEL, ROLES, TASKS, TEAM, Run, budget_options, make_tools, peer_client, publish, run_tasks,
)

logger = logging.getLogger("apps_roundrobin")

VARIANTS = ("hints", "no-hints", "all-resident", "peer")


def build_team(clients: dict[str, Any], tools: dict[str, list[Any]], turns: int) -> Any:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.conditions import MaxMessageTermination
    from autogen_agentchat.teams import RoundRobinGroupChat

    agents = [
        AssistantAgent(name, model_client=clients[name], description=desc, system_message=f"{TEAM}\n{role}",
                       tools=tools[name], reflect_on_tool_use=bool(tools[name]))
        for name, (desc, role) in ROLES.items()
    ]
    return RoundRobinGroupChat(agents, termination_condition=MaxMessageTermination(1 + turns))


async def run_agentmem(variant: str, args: argparse.Namespace) -> tuple[Run, dict[str, Any]]:
    from agentmem import MemoryPool
    from agentmem_autogen import AgentMemChatCompletionClient, follow

    all_resident = variant == "all-resident"
    run = Run(variant)
    with tempfile.TemporaryDirectory() as tmp:
        opts = budget_options(args, tmp, all_resident=all_resident)
        with MemoryPool(MODEL, n_ctx=args.n_ctx, resident_agents=len(ROLES) if all_resident else args.resident,
                        n_threads=args.threads, hints=variant != "no-hints", **opts) as pool:
            clients = {n: AgentMemChatCompletionClient(pool, agent_id=n, max_tokens=args.max_tokens) for n in ROLES}
            for c in clients.values():
                c.on_result = run.record
            team = build_team(clients, make_tools(args.tool_ms / 1e3), args.turns)
            if variant == "hints":
                follow(team)
            await run_tasks(team, run, TASKS[: args.tasks])
            s = pool.stats()
            run.prefilled = s["totals"]["prefill_tokens"]
            run.hints = s["hints"]
            extra = {k: s["totals"].get(k, 0) for k in ("drops", "demotions", "restores", "prefetches")}
            extra["state_mib"] = round(max((a.get("bytes") or 0 for a in s["agents"].values()), default=0) / 2**20, 1)
    return run, extra


async def run_peer(args: argparse.Namespace) -> Run:
    run = Run("peer")
    base = peer_client(args, run)  # one `Llama` for the whole team
    try:
        await run_tasks(build_team({n: base for n in ROLES}, make_tools(args.tool_ms / 1e3), args.turns), run,
                        TASKS[: args.tasks])
    finally:
        await base.close()
    return run


def report(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    heads = ["variant", "calls", "wall s", "per task s", "prefilled", "decoded", "TTFT p50 ms", "TTFT p99 ms",
             "KV found", "hint hit rate", "drops", "demotions", "prefetches", "largest state MiB", "load after"]
    body = [[r["variant"], r["calls"], r["wall_s"], " / ".join(map(str, r["task_wall_s"])), r["prefilled_tokens"],
             r["decoded_tokens"], r["ttft_p50_ms"], r["ttft_p99_ms"],
             " ".join(f"{k} {v}" for k, v in sorted(r["kv"].items())) or "-",
             "-" if r["hint_hit_rate"] is None else f"{r['hint_hit_rate']:.2f}", r.get("drops", "-"),
             r.get("demotions", "-"), r.get("prefetches", "-"), r.get("state_mib", "-"), r["load_after"]]
            for r in rows]
    out = [f"load {meta['load_start']} -> {meta['load_end']} · threads {meta['threads']} · {meta['resident']} live "
           f"sequences for {len(ROLES)} agents · WARM {meta['warm_mib']} MiB · archive {meta['archive']}", "",
           table(heads, body), "", md_table(heads, body), ""]

    def mean(variant: str, key: str) -> float | None:
        xs = [r[key] for r in rows if r["variant"] == variant and r[key] is not None]
        return statistics.fmean(xs) if xs else None

    for a, b, key in [("hints", "no-hints", "wall_s"), ("hints", "all-resident", "ttft_p99_ms"),
                      ("hints", "no-hints", "ttft_p99_ms"), ("hints", "no-hints", "prefilled_tokens"),
                      ("hints", "peer", "wall_s")]:
        x, y = mean(a, key), mean(b, key)
        if x is not None and y:
            out.append(f"{key} {a}/{b} = {x / y:.2f} (means over the runs of each)")
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=["hints", "no-hints", "all-resident", "no-hints", "hints"],
                    help="run in this order (a repeated variant is run again: ABBA)")
    ap.add_argument("--tasks", type=int, default=2, help=f"tasks, one after the other (<= {len(TASKS)})")
    ap.add_argument("--rounds", type=int, default=3, help="turns of every agent per task")
    ap.add_argument("--resident", type=int, default=2, help="live sequences (fewer than the 4 agents)")
    ap.add_argument("--warm-mib", type=float, default=8.0, help="RAM for parked states (fewer than the team's)")
    ap.add_argument("--archive", action="store_true", help="demote to a SQLite COLD tier instead of dropping")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--tool-ms", type=float, default=150.0, help="simulated work of each tool call")
    ap.add_argument("--threads", type=int, default=2)
    add_gpu_layers(ap)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--json", help="write the rows and metadata here")
    args = ap.parse_args(argv)
    if not 1 <= args.tasks <= len(TASKS):
        ap.error(f"--tasks must be in 1..{len(TASKS)}")
    args.turns = args.rounds * len(ROLES)
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the variants in order; print the table and the ratios; return the rows."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    args = parse_args(argv)
    meta: dict[str, Any] = {"load_start": load(), "threads": args.threads, "resident": args.resident, "model": MODEL,
                            "warm_mib": args.warm_mib, "archive": "sqlite" if args.archive else "none (drop)",
                            "tasks": args.tasks, "rounds": args.rounds, "tool_ms": args.tool_ms,
                            "max_tokens": args.max_tokens}
    rows = []
    for v in args.variants:
        if v == "peer":
            run, extra = asyncio.run(run_peer(args)), {}
        else:
            run, extra = asyncio.run(run_agentmem(v, args))
        rows.append({**run.row(), **extra, "load_after": load()})
        logger.info("%s", rows[-1])
    meta["load_end"] = load()
    logger.info("\n%s", publish(rows, meta, args.json, report))
    return rows


if __name__ == "__main__":
    main()
