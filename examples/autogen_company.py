"""A "virtual company" of AutoGen agents on one local model, with agentmem keeping every agent's KV.

Four agents — product manager, engineer (with one tool), reviewer, writer — plan a
feature together, first as a ``RoundRobinGroupChat``, then as a ``SelectorGroupChat``
whose speaker-selection calls use their own agent id. Every agent has its own
:class:`~agentmem_autogen.AgentMemChatCompletionClient` over one shared
:class:`~agentmem.MemoryPool`, so a turn switch restores the next agent's kept KV
instead of prefilling its whole history again.

Each model call prints one line: the agent, how its KV was found (``reused`` = live
sequence, ``restored`` = parked in RAM and loaded back, ``prefilled`` = nothing
kept), prompt tokens, how many were served from kept KV, and the time to first token.

Run (default model, installed with ``pip install 'agentmem-kv[autogen,model]'``)::

    python examples/autogen_company.py                 # agentmem only
    python examples/autogen_company.py --compare       # + the same teams on autogen-ext's
                                                       #   LlamaCppChatCompletionClient
    python examples/autogen_company.py --rounds 3 --threads 1 --json out.json  # shorter

See ``examples/autogen_README.md`` for measured figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.base import TaskResult
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat
from autogen_core.models import ChatCompletionClient

from agentmem.engine.threads import default_threads

COMPANY = """\
Company handbook (shared by every employee of Acme Tasks):
Acme Tasks builds "Tasker", a to-do list app for small teams, sold as a monthly
subscription (free tier: 3 users, 100 tasks; team tier: 9 dollars per user per month).
Customers are small agencies and start-ups of 5 to 50 people. Our values: ship small
increments every two weeks, measure everything, write things down, and never lose a
customer's data. Every feature needs a one-paragraph spec from product, an effort
estimate from engineering, a review for risks (privacy, security, data loss, cost) and
release notes that a customer understands without training.
Current state: web app (React), mobile apps (iOS, Android), a REST API, PostgreSQL,
hosted on one cloud region. About 1,200 paying teams, churn 3 percent per month; the
top churn reason in exit surveys is "no reminders, we forget tasks".
Planned this quarter: due-date reminders (push and e-mail), recurring tasks,
a calendar view, and an export to CSV. Engineering capacity: 4 engineers for 6 weeks.
Rules for meetings: speak in at most three sentences, refer to the previous speaker's
point, and end with one concrete next step. Do not repeat the handbook.
"""

ROLES: dict[str, tuple[str, str]] = {
    "pm": (
        "Product manager: defines the feature, scope and success metric.",
        "You are the product manager of Acme Tasks. You decide scope and the success metric.",
    ),
    "engineer": (
        "Engineer: estimates effort with the estimate_effort tool and proposes a design.",
        "You are the lead engineer of Acme Tasks. Use the estimate_effort tool to size work, "
        "then propose the simplest design.",
    ),
    "reviewer": (
        "Reviewer: checks risks (privacy, security, data loss, cost).",
        "You are the reviewer at Acme Tasks. Name the biggest risk of the proposal and how to reduce it.",
    ),
    "writer": (
        "Writer: turns decisions into customer release notes.",
        "You are the technical writer at Acme Tasks. Turn the decisions so far into two lines of release notes.",
    ),
}
NAMES = list(ROLES)
TASK = "Plan the due-date reminders feature for the next two-week release."

# AgentChat's default selector prompt lists the candidates *before* the history; they
# change every turn (the previous speaker is left out), which would cut the selector's
# kept KV right there. Listing them after the history keeps the whole history a prefix.
SELECTOR_PROMPT = """You are in a role play game. The following roles are available:
{roles}.
Read the following conversation.

{history}

Read the above conversation. Then select the next role from {participants} to play. Only return the role."""


def estimate_effort(feature: str, complexity: Literal["low", "medium", "high"]) -> str:
    """Estimate the engineering effort of a feature in engineer-days."""
    days = {"low": 2, "medium": 5, "high": 10}[complexity] + len(feature.split()) // 4
    return f"Estimate for '{feature}': {days} engineer-days ({complexity} complexity)."


# ----------------------------------------------------------------------------- metrics
@dataclass
class Call:
    """One model call as measured by the client in use."""

    team: str
    agent: str
    kv: str  # reused / restored / prefilled (agentmem) or "baseline"
    prompt_tokens: int
    prefilled_tokens: int  # prompt tokens decoded in this call
    prefill_s: float  # time to put the prompt into the KV (restore included)
    ttft_s: float
    total_s: float


@dataclass
class TeamRun:
    system: str
    team: str
    calls: list[Call] = field(default_factory=list)
    messages: int = 0
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        c = self.calls
        return {
            "system": self.system,
            "team": self.team,
            "messages": self.messages,
            "model_calls": len(c),
            "prompt_tokens": sum(x.prompt_tokens for x in c),
            "prefilled_tokens": sum(x.prefilled_tokens for x in c),
            "prefill_s": round(sum(x.prefill_s for x in c), 3),
            "median_ttft_s": round(statistics.median(x.ttft_s for x in c), 4) if c else 0.0,
            "wall_s": round(self.wall_s, 2),
        }


def print_call(n: int, call: Call) -> None:
    print(
        f"  {n:3d} {call.agent:<9} {call.kv:<9} prompt={call.prompt_tokens:5d} "
        f"kept={call.prompt_tokens - call.prefilled_tokens:5d} new={call.prefilled_tokens:5d} "
        f"ttft={call.ttft_s * 1e3:7.0f} ms  prefill={call.prefill_s * 1e3:7.0f} ms",
        flush=True,
    )


def print_summaries(rows: list[dict[str, Any]]) -> None:
    head = f"{'system':<10} {'team':<12} {'calls':>5} {'prompt tok':>10} {'prefilled':>9} {'prefill s':>9} "
    print("\n" + head + f"{'med TTFT ms':>11} {'wall s':>7}")
    for r in rows:
        print(
            f"{r['system']:<10} {r['team']:<12} {r['model_calls']:>5} {r['prompt_tokens']:>10} "
            f"{r['prefilled_tokens']:>9} {r['prefill_s']:>9.2f} {r['median_ttft_s'] * 1e3:>11.0f} {r['wall_s']:>7.1f}"
        )


def print_comparison(ours: list[dict[str, Any]], base: list[dict[str, Any]]) -> None:
    print("\nagentmem vs LlamaCppChatCompletionClient (same teams, same model, same threads):")
    for a in ours:
        b = next((x for x in base if x["team"] == a["team"]), None)
        if b is None:
            continue
        print(
            f"  {a['team']:<12} prefill time {b['prefill_s']:.2f} s -> {a['prefill_s']:.2f} s "
            f"({b['prefill_s'] / max(a['prefill_s'], 1e-9):.1f}x less); prefilled tokens "
            f"{b['prefilled_tokens']} -> {a['prefilled_tokens']}; median TTFT "
            f"{b['median_ttft_s'] * 1e3:.0f} ms -> {a['median_ttft_s'] * 1e3:.0f} ms "
            f"({b['median_ttft_s'] / max(a['median_ttft_s'], 1e-9):.1f}x)"
        )
    tb, ta = sum(x["prefill_s"] for x in base), sum(x["prefill_s"] for x in ours)
    print(f"  {'all':<12} prefill time {tb:.2f} s -> {ta:.2f} s ({tb / max(ta, 1e-9):.1f}x less)")


# ----------------------------------------------------------------------------- teams
def build_team(
    kind: str,
    clients: dict[str, ChatCompletionClient],
    *,
    selector: ChatCompletionClient | None,
    rounds: int,
    engineer_tools: bool = True,
) -> RoundRobinGroupChat | SelectorGroupChat:
    """The company as a team of ``kind`` ``"round-robin"`` or ``"selector"``."""
    agents = []
    for name, (description, role) in ROLES.items():
        tools: list[Callable[..., Any]] = [estimate_effort] if (name == "engineer" and engineer_tools) else []
        agents.append(
            AssistantAgent(
                name,
                model_client=clients[name],
                description=description,
                system_message=f"{COMPANY}\n{role}",
                tools=tools,
                reflect_on_tool_use=bool(tools),
            )
        )
    stop = MaxMessageTermination(1 + rounds * len(agents))
    if kind == "round-robin":
        return RoundRobinGroupChat(agents, termination_condition=stop)
    assert selector is not None
    return SelectorGroupChat(
        agents, model_client=selector, termination_condition=stop, selector_prompt=SELECTOR_PROMPT
    )


async def run_team(team: RoundRobinGroupChat | SelectorGroupChat, record: TeamRun, *, show: bool) -> None:
    t0 = time.perf_counter()
    result: TaskResult | None = None
    async for item in team.run_stream(task=TASK):
        if isinstance(item, TaskResult):
            result = item
        elif show and getattr(item, "source", None) in ROLES and type(item).__name__ == "TextMessage":
            text = " ".join(str(item.content).split())
            print(f"      {item.source}: {text[:110]}", flush=True)
    record.wall_s = time.perf_counter() - t0
    record.messages = sum(isinstance(m, BaseChatMessage) for m in result.messages) if result else 0


# ----------------------------------------------------------------------------- agentmem
async def run_agentmem(args: argparse.Namespace) -> list[TeamRun]:
    from agentmem import MemoryPool
    from agentmem_autogen import AgentMemChatCompletionClient, clients_for

    runs: list[TeamRun] = []
    with MemoryPool(args.model, n_ctx=args.n_ctx, resident_agents=args.resident, n_threads=args.threads) as pool:
        print(
            f"agentmem pool: {pool.model_path.name}, n_ctx={args.n_ctx}, resident_agents={args.resident}, "
            f"threads={args.threads}"
        )
        for kind in args.teams:
            record = TeamRun("agentmem", kind)
            runs.append(record)
            print(f"\n== agentmem · {kind} ==")
            tag = "rr" if kind == "round-robin" else "sel"
            clients = clients_for(pool, [f"{tag}/{n}" for n in NAMES], max_tokens=args.max_tokens)
            workers = {n: clients[f"{tag}/{n}"] for n in NAMES}
            # small base model: make the engineer actually call its tool (grammar-constrained)
            workers["engineer"] = AgentMemChatCompletionClient(
                pool, agent_id=f"{tag}/engineer", max_tokens=args.max_tokens, force_tools=True
            )
            # the selector has its own KV; its answer is one of the names the prompt offers
            selector = AgentMemChatCompletionClient(
                pool, agent_id=f"{tag}/selector", max_tokens=8, speaker_selection=True
            )

            def on_result(agent_id: str, r: Any, record: TeamRun = record) -> None:
                call = Call(
                    team=record.team,
                    agent=agent_id.split("/", 1)[1],
                    kv=r.kv,
                    prompt_tokens=r.usage.prompt_tokens,
                    prefilled_tokens=r.usage.prompt_tokens - r.usage.cached_tokens,
                    prefill_s=r.timings.prefill_s + r.timings.restore_s,
                    ttft_s=r.timings.ttft_s,
                    total_s=r.timings.total_s,
                )
                record.calls.append(call)
                print_call(len(record.calls), call)

            for c in [*workers.values(), selector]:
                c.on_result = on_result
            team = build_team(kind, workers, selector=selector, rounds=args.rounds)
            await run_team(team, record, show=args.show)
        totals = pool.stats()["totals"]
        print(
            f"\npool: {totals.get('restores', 0)} restores, {totals.get('parks', 0)} parks, "
            f"{totals.get('prefill_tokens', 0)} tokens prefilled, {totals.get('cached_tokens', 0)} served from kept KV"
        )
    return runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="GGUF path (default: the bundled Gemma 3 270M)")
    p.add_argument("--rounds", type=int, default=6, help="turns per agent (default 6)")
    p.add_argument("--max-tokens", type=int, default=40, help="tokens per reply (default 40)")
    p.add_argument(
        "--threads", type=int, default=0, help="CPU threads for both systems (0 = AGENTMEM_THREADS or cores less the load)"
    )
    p.add_argument("--n-ctx", type=int, default=16384, help="agentmem pool context (all agents)")
    p.add_argument("--resident", type=int, default=4, help="agents with a live sequence (others parked in RAM)")
    p.add_argument("--teams", default="round-robin,selector", help="comma list: round-robin,selector")
    p.add_argument("--compare", action="store_true", help="also run the baseline (LlamaCppChatCompletionClient)")
    p.add_argument("--show", action="store_true", help="print what the agents say")
    p.add_argument("--json", default=None, help="write the measurements here")
    args = p.parse_args(argv)
    args.teams = [t.strip() for t in args.teams.split(",") if t.strip()]
    # one count for agentmem and the baseline, chosen once (before either side loads the CPU)
    args.threads = args.threads or default_threads()
    bad = sorted(set(args.teams) - {"round-robin", "selector"})
    if bad:
        p.error(f"unknown team kind(s) {bad}; valid: round-robin, selector")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ours = [r.summary() for r in asyncio.run(run_agentmem(args))]
    out: dict[str, Any] = {"args": vars(args), "agentmem": ours}
    rows = list(ours)
    if args.compare:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from autogen_company_baseline import run_baseline

        base = [r.summary() for r in asyncio.run(run_baseline(args))]
        out["baseline"] = base
        rows += base
    print_summaries(rows)
    if args.compare:
        print_comparison(ours, out["baseline"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
