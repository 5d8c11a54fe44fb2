"""End-to-end apps on the instruct model (issue 16 §4): LangGraph team and a tool-heavy agent, four ways, one run.

Apps (`benchmarks/_apps_langchain.py`):

* `team`  — the LangGraph supervisor team of `examples/langgraph_team.py`: four agents
  (supervisor, researcher with a tool, coder, writer) on `--resident` (2) live sequences.
* `tools` — `langchain.agents.create_agent` with three tools; `--users` (3) users at once,
  one agent each, on `--resident` (2) live sequences; every question calls two tools
  (`--tool-latency-s` each) and answers.
* `summary` — `SummarizationMiddleware` vs `agent_budget_tokens`: prompt tokens read from
  kept KV once the history no longer fits (docs/langchain.md, "Summarization middleware").

Variants: `hints` (agentmem, workflow hints from the graph and from tool calls), `nohints`
(agentmem, no hints: the learned predictor only), `resident` (agentmem with a live
sequence for every agent: the reference for TTFT), `llamacpp` (langchain-community's
`ChatLlamaCpp`, one context for every agent, calls one at a time), and the server
variants `serve` (`agentmem serve --resident 2`) and `llama-server` (llama-server
`-np 2 -kvu --cache-ram --jinja`): the same apps through `langchain_openai.ChatOpenAI`, one
client object per agent (per graph node, per user), agentmem's naming its agent with
`default_headers={"X-Agent-Id": ...}`, llama-server's with no identity
(`benchmarks/_apps_servers.py`). Their cached tokens are the servers' own
`usage.prompt_tokens_details.cached_tokens`; a llama-server that is missing and cannot be
built skips its variant with the reason. llama-server ignores a `tool_choice` naming a
function (it takes only strings, and falls back to `auto`): its log lines about that are
printed, and the `tool calls` column shows how many replies were tool calls.
`autogen` runs `benchmarks/apps_autogen.py`'s `main()` (the AutoGen apps) when that file exists, with
`--autogen-args` (one string) passed on: `--autogen-args "--variants serve llama-server --tasks 1"`.

Reported per app and variant: wall time per task, prefilled prompt tokens (prompt less
what came from kept KV), p50/p99 TTFT over every model call (a non-streamed forced tool call
of ChatLlamaCpp counts its total time), the pool's hint hit rate (`stats()["hints"]`; "n/a"
without hints), restores, and the ratios to the `hints` variant.

Run: `python benchmarks/apps.py --threads 2` (`--only team,tools` / `--variants hints,nohints`;
a variant may repeat, for ABBA order: `--variants serve,llama-server,llama-server,serve`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._report import add_gpu_layers, load, sections, table  # noqa: E402
from benchmarks._serving import pct  # noqa: E402

VARIANT_KEYS = ("hints", "nohints", "resident", "llamacpp", "serve", "llama-server")

APPS = ("team", "tools", "summary", "autogen")


def say(msg: str) -> None:
    """Progress goes to stdout (this module is a command)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def _row(app: str, variant: str, calls: list[Any], wall_s: float, n_tasks: int, stats: dict[str, Any] | None) -> dict[str, Any]:
    ttft = sorted(c.ttft_ms for c in calls)
    prompt = sum(c.prompt_tokens for c in calls)
    cached = sum(c.cache_read for c in calls)
    hints = (stats or {}).get("hints") or {}
    return {
        "app": app,
        "variant": variant,
        "calls": len(calls),
        "wall_s": round(wall_s, 2),
        "wall_s_per_task": round(wall_s / max(1, n_tasks), 2),
        "prompt_tokens": prompt,
        "prefilled_tokens": prompt - cached,
        "ttft_p50_ms": round(pct(ttft, 50), 1) if ttft else None,
        "ttft_p99_ms": round(pct(ttft, 99), 1) if ttft else None,
        "hint_hit_rate": round(hints["hit_rate"], 3) if hints.get("expected") else "n/a",
        "holds": hints.get("holds", "n/a"),
        "restores": (stats or {}).get("totals", {}).get("restores", "n/a"),
        "drops": (stats or {}).get("totals", {}).get("drops", "n/a"),
        "tool_calls": "n/a",
        "load_after": load(),
    }


def run_server_app(app: str, vkey: str, args: argparse.Namespace) -> dict[str, Any] | str:
    """`app` through `ChatOpenAI` on a server started for it; a string says why it was skipped."""
    import tempfile

    from benchmarks import _apps_langchain as L
    from benchmarks._apps_servers import ServerBackend, probe_tool_choice, start_server, tool_choice_warnings

    served = start_server(vkey, model=args.model, threads=args.threads, resident=args.resident, n_ctx=8192,
                          cache_ram_mib=args.cache_ram, log_dir=Path(tempfile.mkdtemp(prefix=f"apps-{app}-{vkey}-")),
                          binary=args.llama_server)
    if isinstance(served, str):
        return served
    be = ServerBackend(served, max_tokens=args.max_tokens)
    try:
        if app == "team":
            calls, wall = L.run_team(be, tasks=args.tasks, max_tokens=args.max_tokens)
            n_tasks = args.tasks
        else:
            calls, wall = L.run_tools(be, users=args.users, questions=args.questions, latency_s=args.tool_latency_s,
                                      answer_choice="none", max_tokens=args.max_tokens, model_for=be.chat,
                                      distinct=args.distinct_questions)
            n_tasks = args.users * args.questions
        row = _row(app, served.name, calls, wall, n_tasks, None)
        own = served.agents_summary()  # agentmem's own count: its prefill_tokens should match the usage-derived one
        if own is not None:
            row["restores"], row["server_prefill_tokens"] = own["restores"], own["prefill_tokens"]
        row["tool_calls"] = be.tool_calls
        row["server_warnings"] = tool_choice_warnings(served)
        for w in row["server_warnings"]:
            say(f"  {served.name}: {w}")
        if app == "tools":  # after the app: the tools app's first forced call, both forms, straight to the server
            q, plan = L.QUESTIONS[0]
            row["tool_choice_probe"] = probe_tool_choice(
                served, L.TOOLS, [{"role": "system", "content": L.SUPPORT_PROMPT}, {"role": "user", "content": q}],
                forced=plan[0])
            for form, what in row["tool_choice_probe"].items():
                say(f"  {served.name}: forced call as {form} tool_choice -> {what}")
        return row
    finally:
        be.close()


def run_app(app: str, vkey: str, args: argparse.Namespace) -> dict[str, Any] | str:
    from benchmarks import _apps_langchain as L

    if vkey not in VARIANT_KEYS:
        raise SystemExit(f"unknown variant {vkey!r}; valid: {', '.join(VARIANT_KEYS)}")
    if vkey in ("serve", "llama-server"):
        return run_server_app(app, vkey, args)

    v = L.VARIANTS[vkey]
    n_agents = 4 if app == "team" else args.users
    be = L.make_backend(v, model=args.model, threads=args.threads, resident=args.resident, n_agents=n_agents,
                        max_tokens=args.max_tokens, warm_mib=args.warm_mib)
    try:
        if app == "team":
            calls, wall = L.run_team(be, tasks=args.tasks, max_tokens=args.max_tokens)
            n_tasks = args.tasks
        else:
            answer = "none" if v.kind == "agentmem" else None  # ChatLlamaCpp takes no "none": unforced = described only
            calls, wall = L.run_tools(be, users=args.users, questions=args.questions, latency_s=args.tool_latency_s,
                                      answer_choice=answer, max_tokens=args.max_tokens,
                                      distinct=args.distinct_questions)
            n_tasks = args.users * args.questions
        stats = be.pool.stats() if v.kind == "agentmem" else None
        return _row(app, v.name, calls, wall, n_tasks, stats)
    finally:
        be.close()


def _ratios(rows: list[dict[str, Any]], ref_variant: str = "agentmem, hints") -> list[list[Any]]:
    """Each row's wall, prefilled and p99 TTFT over the first `ref_variant` row of its app."""
    out = []
    for app in dict.fromkeys(r["app"] for r in rows):
        ref = next((r for r in rows if r["app"] == app and r["variant"] == ref_variant), None)
        if ref is None:
            continue
        for r in rows:
            if r["app"] != app or r is ref:
                continue
            out.append([app, r["variant"], f"{r['wall_s'] / ref['wall_s']:.2f}x",
                        f"{r['prefilled_tokens'] / max(1, ref['prefilled_tokens']):.2f}x",
                        f"{(r['ttft_p99_ms'] or 0) / max(1e-9, ref['ttft_p99_ms'] or 0):.2f}x"])
    return out


def _means(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per app and variant: the mean of its runs (a variant given twice, ABBA, is read as its mean)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["app"], r["variant"]), []).append(r)
    out = []
    for (app, variant), rs in groups.items():
        m = {k: round(sum(r[k] or 0 for r in rs) / len(rs), 2)
             for k in ("wall_s_per_task", "prefilled_tokens", "ttft_p50_ms", "ttft_p99_ms")}
        out.append({"app": app, "variant": variant, "runs": len(rs), "wall_s": m["wall_s_per_task"], **m})
    return out


def _summary_report(res: dict[str, Any]) -> str:
    lines = []
    for name in ("no_limit", "summarization", "budget"):
        rows = res[name]
        lines.append([name, sum(r["prompt"] for r in rows), sum(r["prompt"] - r["cached"] for r in rows),
                      rows[-1]["prompt"], rows[-1]["cached"], min(r["cached"] / max(1, r["prompt"]) for r in rows[1:])])
    return table(["history", "prompt tokens", "prefilled", "last prompt", "last cached", "worst cached share"],
                 [[a, b, c, d, e, f"{g:.0%}"] for a, b, c, d, e, g in lines])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--threads", type=int, default=0)
    add_gpu_layers(ap)
    ap.add_argument("--only", default=",".join(APPS), help=f"apps, comma-separated: {', '.join(APPS)}")
    ap.add_argument("--variants", default=",".join(VARIANT_KEYS), help=f"comma-separated, may repeat: {', '.join(VARIANT_KEYS)}")
    ap.add_argument("--resident", type=int, default=2, help="live sequences (fewer than the agents)")
    ap.add_argument("--tasks", type=int, default=2, help="team: requests through the graph")
    ap.add_argument("--users", type=int, default=3, help="tools: users (agents) at once")
    ap.add_argument("--questions", type=int, default=2, help="tools: questions per user")
    ap.add_argument("--distinct-questions", action="store_true",
                    help="tools: users at the same step ask different questions (default: all ask the same ones)")
    ap.add_argument("--tool-latency-s", type=float, default=0.5)
    ap.add_argument("--warm-mib", type=float, default=0.0,
                    help="agentmem: RAM for parked states, no archive (0 = unlimited; not for `resident`)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--summary-model", default="gemma-3-270m", help="summary: a small model is enough (only the cache is measured)")
    ap.add_argument("--cache-ram", type=int, default=2048, help="llama-server --cache-ram MiB")
    ap.add_argument("--llama-server", default=None, help="a llama-server binary (default: the cached build)")
    ap.add_argument("--autogen-args", default="", help="extra arguments of apps_autogen.py (the `autogen` app), one string")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    apps = sections(ap, args.only, APPS)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    from agentmem import resolve_model_path
    from agentmem.engine.threads import default_threads

    args.threads = args.threads or default_threads()
    args.model = str(resolve_model_path(args.model))
    say(f"# python benchmarks/apps.py {shlex.join(sys.argv[1:] if argv is None else argv)}")
    say(f"# apps on {Path(args.model).name}, threads={args.threads}, load {load()}, resident={args.resident}"
        + (f", WARM {args.warm_mib} MiB (no archive: drops re-prefill)" if args.warm_mib else ""))
    rows: list[dict[str, Any]] = []
    results: dict[str, Any] = {"load_at_start": load(), "threads": args.threads, "model": Path(args.model).name,
                               "warm_mib": args.warm_mib or None}
    for app in (a for a in apps if a in ("team", "tools")):
        for vkey in variants:
            t0 = time.perf_counter()
            row = run_app(app, vkey, args)
            if isinstance(row, str):
                say(f"{app:<6} {vkey}: skipped: {row}")
                results.setdefault("skipped", []).append({"app": app, "variant": vkey, "reason": row})
                continue
            rows.append(row)
            say(f"{app:<6} {row['variant']:<24} wall {row['wall_s']:7.1f} s  prefilled {row['prefilled_tokens']:6d}  "
                f"p50 {row['ttft_p50_ms']} ms  p99 {row['ttft_p99_ms']} ms  hits {row['hint_hit_rate']}  "
                f"({time.perf_counter() - t0:.0f} s, load {load()})")
    if rows:
        keys = ["app", "variant", "calls", "tool_calls", "wall_s_per_task", "prefilled_tokens", "ttft_p50_ms",
                "ttft_p99_ms", "hint_hit_rate", "holds", "restores", "drops"]
        say(table(keys, [[r[k] for k in keys] for r in rows]))
        if _ratios(rows):
            say(table(["app", "variant", "wall vs hints", "prefilled vs hints", "p99 TTFT vs hints"], _ratios(rows)))
        own = [[r["app"], r["variant"], r["prefilled_tokens"], r["server_prefill_tokens"]] for r in rows
               if "server_prefill_tokens" in r]
        if own:  # the usage-derived count next to agentmem's own (GET /agents)
            say(table(["app", "variant", "prefilled (usage)", "prefill_tokens (GET /agents)"], own))
        means = _means(rows)
        results["means"] = means
        if len(means) < len(rows):
            mk = ["app", "variant", "runs", "wall_s_per_task", "prefilled_tokens", "ttft_p50_ms", "ttft_p99_ms"]
            say("means of repeated variants:\n" + table(mk, [[m[k] for k in mk] for m in means]))
        served = _ratios(means, "agentmem serve")
        if served:
            say(table(["app", "variant (mean)", "wall vs serve", "prefilled vs serve", "p99 TTFT vs serve"], served))
    results["rows"] = rows
    if "summary" in apps:
        from benchmarks import _apps_langchain as L

        res = L.run_summary(model=str(resolve_model_path(args.summary_model)), threads=args.threads, turns=12, keep=4)
        say(f"# summary: {Path(args.summary_model).name}, budget {res['budget_tokens']} tokens, load {load()}")
        say(_summary_report(res))
        results["summary"] = res
    autogen = Path(__file__).with_name("apps_autogen.py")
    if "autogen" in apps and autogen.exists():
        spec = importlib.util.spec_from_file_location("benchmarks.apps_autogen", autogen)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
        say("# benchmarks/apps_autogen.py")
        results["autogen"] = mod.main(["--threads", str(args.threads), *args.autogen_args.split()])
    results["load_at_end"] = load()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return results


if __name__ == "__main__":
    main()
