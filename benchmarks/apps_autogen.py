"""End-to-end AutoGen app: a SelectorGroupChat of 4 agents with tools, fewer live sequences than agents.

Four `AssistantAgent`s (pm, engineer, reviewer, writer — three with a tool that takes
`--tool-ms` of simulated work) and a selector run a few tasks as one
`SelectorGroupChat` on the instruct model `qwen2.5-coder-0.5b-instruct`. Variants,
measured in the same run:

* `hints` — agentmem, `resident_agents` < 5 model users (4 agents + the selector); the
  selector's `speaker_selection` client expects its candidates, then its answer, and a
  tool-call reply holds its agent (no app code: `agentmem_autogen._hints`);
* `no-hints` — the same with `PoolConfig(hints=False)` (the learned predictor only);
* `all-resident` — agentmem with a live sequence for every model user (the bound);
* `peer` — autogen-ext's `LlamaCppChatCompletionClient`, one `Llama` shared by all;
* `serve` / `llama-server` — the same team through autogen-ext's
  `OpenAIChatCompletionClient`, one client per agent, against `agentmem serve
  --resident 2` (each client names its agent with `default_headers={"X-Agent-Id": name}`)
  and against llama-server `-np 2 -kvu --cache-ram --jinja` (no identity: one client per
  agent, nothing else). Every call streams (`model_client_stream`); TTFT is the client's
  (request → first chunk with content or a tool call); prefilled = `usage.prompt_tokens`
  less `prompt_tokens_details.cached_tokens`, which both servers report. The selector
  asks for `response_format` JSON of the schema `{"speaker": one of the roles}` (the
  standard knob standing in for agentmem's `speaker_selection` and the peer's grammar).
  `benchmarks/_apps_servers.py` starts the servers; a llama-server that is missing and
  cannot be built skips its variant with the reason.

Reported per variant: wall time per task, total prefilled tokens, p50/p99 TTFT of the
model calls, the hint hit rate (`stats()["hints"]`), the restore time left inside calls
and how each call found its KV (agentmem), and ratios against `all-resident` and
`no-hints`. On a shared, loaded CPU the wall and TTFT figures move with the load
(recorded); prefilled tokens and in-call restore time are the load-robust ones. Target of issue 16: with hints, p99 TTFT within 1.2x of all-resident
and wall time below no-hints.

Run: `python benchmarks/apps_autogen.py [--tasks 2 --turns 5 --threads 2 --json out.json]`.
`main(argv)` is the entry point (`benchmarks/apps.py` may call it).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import logging
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import add_gpu_layers, load, md_table, table  # noqa: E402

logger = logging.getLogger("apps_autogen")

MODEL = "qwen2.5-coder-0.5b-instruct"
VARIANTS = ("hints", "no-hints", "all-resident", "peer", "serve", "llama-server")
SERVER_VARIANTS = ("serve", "llama-server")
#: what `OpenAIChatCompletionClient` is told about a local model it does not know
MODEL_INFO = {"vision": False, "function_calling": True, "json_output": True, "family": "unknown",
              "structured_output": True}
SPEAKER_FORMAT = {"type": "json_schema", "json_schema": {"name": "speaker", "strict": True, "schema": {
    "type": "object", "properties": {"speaker": {"type": "string", "enum": list(("pm", "engineer", "reviewer", "writer"))}},
    "required": ["speaker"], "additionalProperties": False}}}
TEAM = "Acme Tasks builds Tasker, a to-do app for small teams (1,200 paying teams, churn 3% a month)."
ROLES = {
    "pm": ("Product manager: scope and success metric; looks up metrics.",
           "You are the product manager. Use lookup_metric for numbers, then state scope and one metric."),
    "engineer": ("Engineer: sizes work with estimate_effort and proposes a design.",
                 "You are the engineer. Use estimate_effort to size the work, then propose the simplest design."),
    "reviewer": ("Reviewer: checks risks with check_risk.",
                 "You are the reviewer. Use check_risk on the proposal, then name the biggest risk."),
    "writer": ("Writer: turns decisions into two lines of release notes.",
               "You are the writer. Turn the decisions so far into two lines of release notes."),
}
TASKS = [
    "Plan due-date reminders for the next release.",
    "Plan recurring tasks for the release after.",
    "Plan a CSV export of all tasks.",
    "Plan a calendar view.",
]
SELECTOR_PROMPT = """You pick who speaks next. Roles:
{roles}.

{history}

Select the next role from {participants}. Only return the role."""


def make_tools(tool_s: float) -> dict[str, list[Callable[..., Any]]]:
    """Three agents' tools; each sleeps `tool_s` (the work a real tool does between model calls)."""

    async def lookup_metric(name: str) -> str:
        """Look up a product metric by name (churn, active_teams, tasks_per_team)."""
        await asyncio.sleep(tool_s)
        return {"churn": "3% per month", "active_teams": "1,200"}.get(name, "41 tasks per team per week")

    async def estimate_effort(feature: str, complexity: str) -> str:
        """Estimate engineer-days for a feature; complexity is low, medium or high."""
        await asyncio.sleep(tool_s)
        return f"{feature}: {dict(low=2, medium=5, high=10).get(complexity, 5)} engineer-days"

    async def check_risk(proposal: str) -> str:
        """Check a proposal for privacy, security, data-loss and cost risks."""
        await asyncio.sleep(tool_s)
        return "main risk: notifications leak task titles on lock screens; mitigate with a privacy setting"

    return {"pm": [lookup_metric], "engineer": [estimate_effort], "reviewer": [check_risk], "writer": []}


@dataclass
class Run:
    """What one variant measured."""

    variant: str
    task_wall_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    prefilled: int = 0
    decoded: int = 0  # tokens generated (what most of a call's wall time goes to on a CPU)
    calls: int = 0
    tool_calls: int = 0
    restore_s: float = 0.0  # restore time spent inside calls (agentmem; what prefetch and holds remove)
    kv: dict[str, int] = field(default_factory=dict)  # calls by how their KV was found (agentmem)
    hints: dict[str, Any] = field(default_factory=dict)
    drops: int = 0  # states given up under --warm-mib without an archive (agentmem)

    def record(self, agent_id: str, r: Any) -> None:
        """An agentmem client's `on_result`: count one pool call."""
        self.calls += 1
        self.ttft_s.append(r.timings.ttft_s)
        self.decoded += r.usage.completion_tokens
        self.restore_s += r.timings.restore_s
        self.kv[r.kv] = self.kv.get(r.kv, 0) + 1

    def row(self) -> dict[str, Any]:
        t = sorted(self.ttft_s)
        p = (lambda q: t[min(len(t) - 1, int(q * len(t)))] if t else float("nan"))
        return {
            "variant": self.variant, "calls": self.calls, "tool_calls": self.tool_calls,
            "wall_s": round(sum(self.task_wall_s), 2), "task_wall_s": [round(x, 2) for x in self.task_wall_s],
            "prefilled_tokens": self.prefilled, "decoded_tokens": self.decoded, "ttft_p50_ms": round(1e3 * statistics.median(t), 1) if t else None,
            "ttft_p99_ms": round(1e3 * p(0.99), 1), "hint_hit_rate": self.hints.get("hit_rate"),
            "restore_in_calls_ms": round(1e3 * self.restore_s, 1), "kv": dict(self.kv), "drops": self.drops,
            "hints": {k: self.hints.get(k) for k in ("expected", "hits", "holds", "hold_hits", "hold_expired")},
        }


def build_team(clients: dict[str, Any], selector: Any, tools: dict[str, list[Callable[..., Any]]], turns: int,
               *, stream: bool = False) -> Any:
    """The team; `stream`: every agent and the selector call `create_stream` (the server variants)."""
    from autogen_agentchat.agents import AssistantAgent
    from autogen_agentchat.conditions import MaxMessageTermination
    from autogen_agentchat.teams import SelectorGroupChat

    agents = [
        AssistantAgent(name, model_client=clients[name], description=desc, system_message=f"{TEAM}\n{role}",
                       tools=tools[name], reflect_on_tool_use=bool(tools[name]), model_client_stream=stream)
        for name, (desc, role) in ROLES.items()
    ]
    return SelectorGroupChat(agents, model_client=selector, selector_prompt=SELECTOR_PROMPT,
                             termination_condition=MaxMessageTermination(1 + turns), model_client_streaming=stream)


async def run_tasks(team: Any, run: Run, tasks: Sequence[str]) -> None:
    from autogen_agentchat.messages import ToolCallRequestEvent

    for task in tasks:
        t0 = time.perf_counter()
        result = await team.run(task=task)
        run.task_wall_s.append(time.perf_counter() - t0)
        run.tool_calls += sum(isinstance(m, ToolCallRequestEvent) for m in result.messages)
        logger.info("%s: %r in %.1f s, speakers %s", run.variant, task, run.task_wall_s[-1],
                    [m.source for m in result.messages[1:]])


def budget_options(args: argparse.Namespace, tmp: str, *, all_resident: bool) -> dict[str, Any]:
    """`MemoryPool` settings of `--warm-mib` / `--archive` (none for the all-resident variant)."""
    opts: dict[str, Any] = {}
    if not all_resident and args.warm_mib:
        opts["warm_budget_bytes"] = int(args.warm_mib * 2**20)
        if args.archive:
            opts["archive_path"] = os.path.join(tmp, "cold.db")
    return opts


async def run_agentmem(variant: str, args: argparse.Namespace) -> Run:
    from agentmem import MemoryPool
    from agentmem_autogen import AgentMemChatCompletionClient

    resident = 5 if variant == "all-resident" else args.resident
    run = Run(variant)
    with tempfile.TemporaryDirectory() as tmp, \
            MemoryPool(MODEL, n_ctx=args.n_ctx, resident_agents=resident, n_threads=args.threads,
                       hints=variant != "no-hints", kv_layout=args.kv_layout,
                       **budget_options(args, tmp, all_resident=variant == "all-resident")) as pool:
        clients = {n: AgentMemChatCompletionClient(pool, agent_id=n, max_tokens=args.max_tokens) for n in ROLES}
        selector = AgentMemChatCompletionClient(pool, agent_id="selector", max_tokens=8, speaker_selection=True)
        for c in [*clients.values(), selector]:
            c.on_result = run.record
        await run_tasks(build_team(clients, selector, make_tools(args.tool_ms / 1e3), args.turns), run,
                        TASKS[: args.tasks])
        s = pool.stats()
        run.prefilled = s["totals"]["prefill_tokens"]
        run.hints = s["hints"]
        run.drops = s["totals"].get("drops", 0)
    return run


def peer_client(args: argparse.Namespace, run: Run) -> Any:
    """autogen-ext's `LlamaCppChatCompletionClient` on the model, counting into `run` from llama.cpp's own counters.

    `defaults` are extra create args (max_tokens, temperature); `selection=True` adds the
    selector's candidate grammar (the help agentmem's `speaker_selection` gives).
    """
    import llama_cpp
    from autogen_ext.models.llama_cpp import LlamaCppChatCompletionClient
    from llama_cpp.llama_grammar import LlamaGrammar

    from agentmem import resolve_model_path

    class Timed(LlamaCppChatCompletionClient):
        """The peer client plus default args, the selector's candidate grammar, and llama.cpp's own counters."""

        defaults: dict[str, Any] = {}
        selection = False

        async def create(self, messages: Any, **kw: Any) -> Any:  # type: ignore[override]
            extra = {**self.defaults, **dict(kw.get("extra_create_args") or {})}
            if self.selection:  # the same help agentmem's speaker_selection gives
                found = re.findall(r"\['[^'\n]+'(?:, '[^'\n]+')*\]", str(messages[-1].content))
                if found:
                    gbnf = "root ::= " + " | ".join(json.dumps(n) for n in ast.literal_eval(found[-1]))
                    extra["grammar"] = LlamaGrammar.from_string(gbnf, verbose=False)
            kw["extra_create_args"] = extra
            ctx = self.llm._ctx.ctx
            before = llama_cpp.llama_perf_context(ctx)
            t0 = time.perf_counter()
            result = await super().create(messages, **kw)
            wall = time.perf_counter() - t0
            after = llama_cpp.llama_perf_context(ctx)
            run.calls += 1
            run.prefilled += after.n_p_eval - before.n_p_eval
            run.decoded += after.n_eval - before.n_eval
            run.ttft_s.append(max(0.0, wall - (after.t_eval_ms - before.t_eval_ms) / 1e3))
            return result

    base = Timed(model_path=str(resolve_model_path(MODEL)), n_ctx=args.n_ctx, n_batch=512, n_threads=args.threads,
                 n_threads_batch=args.threads, flash_attn=True, verbose=False)
    base.defaults = {"max_tokens": args.max_tokens, "temperature": 0.0}
    return base


async def run_peer(args: argparse.Namespace) -> Run:
    run = Run("peer")
    base = peer_client(args, run)

    def view(**defaults: Any) -> Any:
        import copy

        v = copy.copy(base)
        v.defaults = {**base.defaults, **defaults}
        return v

    selector = view(max_tokens=8)
    selector.selection = True
    try:
        await run_tasks(build_team({n: view() for n in ROLES}, selector, make_tools(args.tool_ms / 1e3), args.turns),
                        run, TASKS[: args.tasks])
    finally:
        await base.close()
    return run


class _TimedStream:
    """An openai `AsyncStream` that notes its first content/tool-call chunk and its usage chunk."""

    def __init__(self, inner: Any, t0: float, done: Callable[[float, Any], None]) -> None:
        self._inner, self._t0, self._done = inner, t0, done
        self._first: float | None = None
        self._usage: Any = None

    def __aiter__(self) -> "_TimedStream":
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self._inner.__anext__()
        except StopAsyncIteration:
            self._done((self._first or time.perf_counter()) - self._t0, self._usage)
            raise
        if self._first is None and any(c.delta.content or c.delta.tool_calls for c in chunk.choices):
            self._first = time.perf_counter()
        if chunk.usage is not None:
            self._usage = chunk.usage
        return chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def server_client(run: Run, served: Any, agent: str, **create_args: Any) -> Any:
    """An `OpenAIChatCompletionClient` for `agent` on `served`, its calls timed and their usage counted into `run`.

    The timing wraps the client's own openai `chat.completions.create` (the request
    autogen-ext sends is unchanged, except that a stream asks for its usage chunk).
    """
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    client = OpenAIChatCompletionClient(model=served.model_name, base_url=served.base_url, api_key="none",
                                        model_info=MODEL_INFO, temperature=0.0, default_headers=served.headers(agent),
                                        **create_args)
    completions = client._client.chat.completions
    real = completions.create

    def done(ttft_s: float, usage: Any) -> None:
        run.calls += 1
        run.ttft_s.append(ttft_s)
        if usage is not None:
            details = getattr(usage, "prompt_tokens_details", None)
            run.prefilled += usage.prompt_tokens - int(getattr(details, "cached_tokens", 0) or 0)
            run.decoded += usage.completion_tokens
        else:
            run.kv["no_usage"] = run.kv.get("no_usage", 0) + 1

    async def create(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        if kw.get("stream"):
            kw["stream_options"] = {"include_usage": True}
            return _TimedStream(await real(*a, **kw), t0, done)
        out = await real(*a, **kw)
        done(time.perf_counter() - t0, out.usage)  # not streamed: TTFT is the whole call
        return out

    completions.create = create
    return client


async def run_server(variant: str, args: argparse.Namespace) -> Run | None:
    """The team through `OpenAIChatCompletionClient` on a started server; None (logged) when skipped."""
    import tempfile
    from pathlib import Path

    from _apps_servers import start_server, tool_choice_warnings

    from agentmem import resolve_model_path

    served = start_server("serve" if variant == "serve" else "llama-server", model=str(resolve_model_path(MODEL)),
                          threads=args.threads, resident=args.server_resident, n_ctx=args.n_ctx,
                          cache_ram_mib=args.cache_ram, log_dir=Path(tempfile.mkdtemp(prefix=f"apps-{variant}-")),
                          binary=args.llama_server)
    if isinstance(served, str):
        logger.warning("skipped %s: %s", variant, served)
        return None
    run = Run(variant)
    clients: dict[str, Any] = {}
    try:
        clients = {n: server_client(run, served, n, max_tokens=args.max_tokens) for n in ROLES}
        clients["selector"] = server_client(run, served, "selector", max_tokens=16, response_format=SPEAKER_FORMAT)
        selector = clients.pop("selector")
        team = build_team(clients, selector, make_tools(args.tool_ms / 1e3), args.turns, stream=True)
        clients["selector"] = selector
        await run_tasks(team, run, TASKS[: args.tasks])
        own = served.agents_summary()  # agentmem's own count, next to the one from usage
        if own is not None:
            run.kv.update({f"server_{k}": v for k, v in own.items()})
        for w in tool_choice_warnings(served):
            logger.warning("%s: %s", variant, w)
    finally:
        for c in clients.values():
            await c.close()
        served.stop()
    return run


def publish(rows: list[dict[str, Any]], meta: dict[str, Any], path: str | None,
            render: Callable[[list[dict[str, Any]], dict[str, Any]], str]) -> str:
    """`render(rows, meta)`, for the caller's log; with `path`, the rows and metadata also go there as JSON."""
    if path:
        with open(path, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return render(rows, meta)


def report(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    by: dict[str, dict[str, Any]] = {}  # a variant run twice (ABBA) is read as its mean
    for v in dict.fromkeys(r["variant"] for r in rows):
        rs = [r for r in rows if r["variant"] == v]
        by[v] = {k: sum(r[k] or 0 for r in rs) / len(rs) for k in ("wall_s", "ttft_p99_ms", "prefilled_tokens")}
    heads = ["variant", "calls", "tool calls", "wall s", "per task s", "prefilled", "decoded", "TTFT p50 ms", "TTFT p99 ms",
             "hint hit rate", "restore in calls ms", "drops"]
    body = [[r["variant"], r["calls"], r["tool_calls"], r["wall_s"], " / ".join(map(str, r["task_wall_s"])),
             r["prefilled_tokens"], r.get("decoded_tokens"), r["ttft_p50_ms"], r["ttft_p99_ms"],
             "-" if r["hint_hit_rate"] is None else f"{r['hint_hit_rate']:.2f}",
             r["restore_in_calls_ms"] if r["variant"] not in ("peer", *SERVER_VARIANTS) else "-", r.get("drops", 0)]
            for r in rows]
    servers = f" (servers: {meta['server_resident']})" if any(r["variant"] in SERVER_VARIANTS for r in rows) else ""
    budget = f" · WARM {meta['warm_mib']} MiB, archive {meta['archive']}" if meta.get("warm_mib") else ""
    out = [f"load {meta['load']} · threads {meta['threads']} · resident {meta['resident']}{servers} of 5 model users{budget}", "",
           table(heads, body), "", md_table(heads, body)]
    ratios = []
    for a, b, what in [("hints", "all-resident", "ttft_p99_ms"), ("hints", "no-hints", "wall_s"),
                       ("hints", "no-hints", "ttft_p99_ms"), ("hints", "peer", "wall_s"),
                       ("hints", "peer", "prefilled_tokens"), ("serve", "llama-server", "wall_s"),
                       ("serve", "llama-server", "prefilled_tokens"), ("serve", "llama-server", "ttft_p99_ms"),
                       ("hints", "serve", "wall_s")]:
        if a in by and b in by and by[b][what]:
            ratios.append(f"{what} {a}/{b} = {by[a][what] / by[b][what]:.2f}")
    return "\n".join(out + ["", "ratios (a variant run more than once: its mean):", *ratios])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--tasks", type=int, default=2, help=f"tasks run one after the other (<= {len(TASKS)})")
    ap.add_argument("--turns", type=int, default=5, help="agent messages per task")
    ap.add_argument("--resident", type=int, default=3, help="live sequences for the hints/no-hints variants")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--tool-ms", type=float, default=150.0, help="simulated work of each tool call")
    ap.add_argument("--warm-mib", type=float, default=0.0,
                    help="RAM for parked states (0 = unlimited; the all-resident variant has none)")
    ap.add_argument("--archive", action="store_true", help="with --warm-mib: demote to a SQLite COLD tier instead of dropping")
    ap.add_argument("--threads", type=int, default=2)
    add_gpu_layers(ap)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--kv-layout", default="auto", choices=("auto", "unified", "per_sequence"),
                    help="PoolConfig.kv_layout of the agentmem variants (per_sequence: a restored agent's cells do not mix with the others')")
    ap.add_argument("--server-resident", type=int, default=2,
                    help="serve / llama-server: agentmem --resident, llama-server -np (fewer than the 5 model users)")
    ap.add_argument("--cache-ram", type=int, default=2048, help="llama-server --cache-ram MiB")
    ap.add_argument("--llama-server", default=None, help="a llama-server binary (default: the cached build)")
    ap.add_argument("--json", help="write the rows and metadata here")
    args = ap.parse_args(argv)
    if not 1 <= args.tasks <= len(TASKS):
        ap.error(f"--tasks must be in 1..{len(TASKS)}")
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the variants once each; print the table and ratios; return the rows."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)  # AutoGen's own loggers (events, runtime) stay at WARNING
    args = parse_args(argv)
    logger.info("command: python benchmarks/apps_autogen.py %s; load %s",
                shlex.join(sys.argv[1:] if argv is None else argv), load())
    rows = []
    for v in args.variants:
        logger.info("%s: load %s", v, load())
        if v in SERVER_VARIANTS:
            run = asyncio.run(run_server(v, args))
        else:
            run = asyncio.run(run_peer(args) if v == "peer" else run_agentmem(v, args))
        if run is None:
            continue
        rows.append(run.row())
        logger.info("%s", rows[-1])
    meta = {"load": load(), "threads": args.threads, "resident": args.resident, "server_resident": args.server_resident,
            "model": MODEL, "kv_layout": args.kv_layout, "warm_mib": args.warm_mib or None,
            "archive": ("sqlite" if args.archive else "none (drop)") if args.warm_mib else None,
            "tasks": args.tasks, "turns": args.turns, "tool_ms": args.tool_ms, "max_tokens": args.max_tokens}
    logger.info("\n%s", publish(rows, meta, args.json, report))
    return rows


if __name__ == "__main__":
    main()
