"""Agent-switch benchmark: TTFT when a team of agents takes turns on one model.

N agents (default 4), each with a ~1,500-token history, are called round-robin
for several rounds, each call adding a short user turn. Measured in one run, on
the same prompts (identical token lists):

* `llama`     — one plain llama-cpp-python `Llama` shared by all agents (what
  LangChain's `ChatLlamaCpp` and AutoGen's `LlamaCppChatCompletionClient` do):
  every switch re-fills the context.
* `llama+ram` — the same with `LlamaRAMCache` (whole-context states keyed by prefix).
* `agentmem`  — a `MemoryPool` with fewer live sequences than agents
  (`resident_agents = N // 2`): every switch parks one agent and restores another.
* `resident`  — a `MemoryPool` with every agent resident: the floor.

Run: `python benchmarks/switch.py` or `agentmem bench switch`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

logger = logging.getLogger(__name__)


def say(msg: str) -> None:
    """Benchmark progress goes to stdout (this module is a command) and to logging."""
    logger.debug(msg)
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()

TOPICS = [
    "the release checklist", "database migrations", "the caching layer", "error budgets",
    "the onboarding guide", "load testing", "the API schema", "incident reviews",
    "feature flags", "the billing service", "log retention", "access control",
]
ROLES = ["planner", "researcher", "coder", "reviewer", "writer", "tester", "designer", "analyst"]


def build_histories(n_agents: int, target_tokens: int, count: Callable[[list[dict]], int]) -> dict[str, list[dict]]:
    """Deterministic conversations of about `target_tokens` tokens per agent."""
    out: dict[str, list[dict]] = {}
    for i in range(n_agents):
        role = ROLES[i % len(ROLES)] + ("" if i < len(ROLES) else str(i))
        msgs = [{"role": "system", "content": f"You are the {role} of a software team. Be concise and concrete."}]
        k = 0
        while count(msgs) < target_tokens:
            t = TOPICS[(i * 5 + k) % len(TOPICS)]
            msgs.append({"role": "user", "content": f"Round {k}: what is your view on {t} for project {i}-{k}? List the risks you see."})
            msgs.append(
                {
                    "role": "assistant",
                    "content": f"For {t} in project {i}-{k}, the {role} would first confirm owners and deadlines, "
                    f"then check the test coverage, the rollback plan and the monitoring. The main risks are "
                    f"unclear ownership, missing alerts and untested edge cases in step {k}.",
                }
            )
            k += 1
        out[role] = msgs
    return out


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _summary(xs: list[float]) -> dict[str, float]:
    return {"median_ms": 1e3 * statistics.median(xs), "p95_ms": 1e3 * _pct(xs, 0.95), "n": len(xs)}


def run(
    *,
    n_agents: int = 4,
    history_tokens: int = 1500,
    rounds: int = 3,
    max_tokens: int = 8,
    model_path: str | None = None,
    out: Path | None = Path("bench-results/switch.json"),
    variants: tuple[str, ...] = ("llama", "llama+ram", "agentmem", "resident"),
    n_threads: int = 0,
) -> dict[str, Any]:
    """Run the benchmark; returns (and writes) the results dict.

    `n_threads=0` is resolved once here (`default_threads`), so every variant,
    agentmem's and llama-cpp-python's, runs with the same count.
    """
    from llama_cpp import Llama, LlamaRAMCache

    from agentmem import MemoryPool
    from agentmem.engine.threads import default_threads
    from agentmem.model import resolve_model_path

    n_threads = n_threads or default_threads()
    path = str(resolve_model_path(model_path))
    load_before = os.getloadavg()
    n_ctx = max(4096, history_tokens + rounds * 120 + 512)
    pool_ctx = n_ctx * n_agents

    log = say

    # One renderer for everyone, so every variant sees identical token lists.
    with MemoryPool(path, n_ctx=n_ctx, resident_agents=1, n_threads=n_threads) as tmp:
        hist = build_histories(n_agents, history_tokens, tmp.count_tokens)
        renderer_tokens = lambda m: tmp.renderer.render(m).tokens  # noqa: E731
        agents = list(hist)
        # the conversation each agent will see per round (replies fixed, so all variants match)
        schedule: list[tuple[str, list[int], list[dict]]] = []
        convo = {a: list(h) for a, h in hist.items()}
        warm = [(a, renderer_tokens(convo[a] + [{"role": "user", "content": "Ready?"}]), convo[a] + [{"role": "user", "content": "Ready?"}]) for a in agents]
        # the conversation goes on from the warm-up turn (append-only, as in a real app); the
        # assistant replies are re-sent as fixed text, so each switch also rolls back the reply
        for a in agents:
            convo[a] = convo[a] + [{"role": "user", "content": "Ready?"}, {"role": "assistant", "content": "Ready."}]
        for r in range(rounds):
            for a in agents:
                convo[a] = convo[a] + [{"role": "user", "content": f"New item {r}: anything to add?"}]
                schedule.append((a, renderer_tokens(convo[a]), list(convo[a])))
                convo[a] = convo[a] + [{"role": "assistant", "content": "Nothing new, continue."}]
        hist_sizes = {a: len(renderer_tokens(h)) for a, h in hist.items()}
    log(f"model {Path(path).name}; {n_agents} agents, history tokens {hist_sizes}; {rounds} rounds, max_tokens={max_tokens}")

    results: dict[str, Any] = {}

    def llama_variant(name: str, use_cache: bool) -> None:
        llm = Llama(path, n_ctx=n_ctx, n_batch=512, verbose=False, seed=0, n_threads=n_threads, n_threads_batch=n_threads)
        if use_cache:
            llm.set_cache(LlamaRAMCache(capacity_bytes=4 << 30))

        def call(tokens: list[int]) -> float:
            t0 = time.perf_counter()
            ttft = None
            for _ in llm.create_completion(tokens, max_tokens=max_tokens, temperature=0.0, stream=True):
                if ttft is None:
                    ttft = time.perf_counter() - t0
            return ttft if ttft is not None else time.perf_counter() - t0

        for a, toks, _ in warm:
            call(toks)
        xs = []
        for a, toks, _ in schedule:
            xs.append(call(toks))
        llm.close()
        results[name] = _summary(xs) | {"ttft_s": xs}
        log(f"  {name:10s} median {results[name]['median_ms']:8.1f} ms   p95 {results[name]['p95_ms']:8.1f} ms")

    def pool_variant(name: str, resident: int) -> None:
        with MemoryPool(path, n_ctx=pool_ctx, resident_agents=resident, n_threads=n_threads, prefetch=False) as pool:
            for a, _, msgs in warm:
                pool.chat(a, msgs, max_tokens=max_tokens)
            xs, kv, restore = [], [], []
            for a, _, msgs in schedule:
                r = pool.chat(a, msgs, max_tokens=max_tokens)
                xs.append(r.timings.ttft_s)
                kv.append(r.kv)
                restore.append(r.timings.restore_s)
            st = pool.stats()["totals"]
        results[name] = _summary(xs) | {
            "ttft_s": xs,
            "kv": {k: kv.count(k) for k in set(kv)},
            "restore_median_ms": 1e3 * statistics.median(restore),
            "restores": st["restores"],
            "parks": st["parks"],
        }
        log(
            f"  {name:10s} median {results[name]['median_ms']:8.1f} ms   p95 {results[name]['p95_ms']:8.1f} ms   "
            f"kv={results[name]['kv']} restore median {results[name]['restore_median_ms']:.2f} ms"
        )

    runners = {
        "llama": lambda: llama_variant("llama", False),
        "llama+ram": lambda: llama_variant("llama+ram", True),
        "agentmem": lambda: pool_variant("agentmem", max(1, n_agents // 2)),
        "resident": lambda: pool_variant("resident", n_agents),
    }
    for v in variants:
        log(f"running {v} ...")
        runners[v]()

    ratios: dict[str, float] = {}
    if "agentmem" in results:
        c = results["agentmem"]["median_ms"]
        if "llama" in results:
            ratios["llama / agentmem"] = results["llama"]["median_ms"] / c
        if "llama+ram" in results:
            ratios["llama+ram / agentmem"] = results["llama+ram"]["median_ms"] / c
        if "resident" in results:
            ratios["agentmem / resident"] = c / results["resident"]["median_ms"]
    report = {
        "benchmark": "switch",
        "machine": {
            "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "n_threads": n_threads,
        },
        "config": {"n_agents": n_agents, "history_tokens": hist_sizes, "rounds": rounds, "max_tokens": max_tokens, "model": Path(path).name},
        "results": results,
        "ratios": ratios,
        "targets": {"llama / agentmem": ">= 20", "llama+ram / agentmem": ">= 10", "agentmem / resident": "<= 1.3"},
    }
    say("")
    say(markdown_table(report))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        say(f"\nwrote {out}")
    return report


def markdown_table(report: dict[str, Any]) -> str:
    """The results as a Markdown table (what the README shows)."""
    names = {
        "llama": "(a) llama-cpp-python `Llama`, shared",
        "llama+ram": "(b) `Llama` + `LlamaRAMCache`",
        "agentmem": "(c) agentmem (park/restore on every switch)",
        "resident": "(d) agentmem, all agents resident (floor)",
    }
    res = report["results"]
    lines = ["| variant | median TTFT (ms) | p95 TTFT (ms) | switches |", "|---|---:|---:|---:|"]
    for k, label in names.items():
        if k in res:
            lines.append(f"| {label} | {res[k]['median_ms']:.1f} | {res[k]['p95_ms']:.1f} | {res[k]['n']} |")
    lines.append("")
    lines.append("| ratio | measured | target |")
    lines.append("|---|---:|---|")
    for k, v in report["ratios"].items():
        lines.append(f"| {k} | {v:.1f}× | {report['targets'][k]} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to `parser` (its own, or `agentmem bench switch`)."""
    parser.add_argument("--agents", type=int, default=4, help="agents taking turns (4)")
    parser.add_argument("--history-tokens", type=int, default=1500, help="history tokens per agent (1500)")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds measured (3)")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens generated per call (8)")
    parser.add_argument("--model", default=None, help="GGUF file (default: AGENTMEM_MODEL or the bundled model)")
    parser.add_argument("--out", default="bench-results/switch.json", help="JSON results file ('' = none)")
    parser.add_argument(
        "--variants", default="llama,llama+ram,agentmem,resident", help="comma-separated variants to run (all)"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="CPU threads for every variant (0 = AGENTMEM_THREADS or cores less the load)"
    )


def run_args(args: argparse.Namespace) -> int:
    """Run the benchmark with parsed options (see `add_arguments`); returns the exit status."""
    run(
        n_agents=args.agents,
        history_tokens=args.history_tokens,
        rounds=args.rounds,
        max_tokens=args.max_tokens,
        model_path=args.model,
        out=Path(args.out) if args.out else None,
        variants=tuple(v.strip() for v in args.variants.split(",") if v.strip()),
        n_threads=args.threads,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python benchmarks/switch.py [options]`: parse `argv` and run."""
    ap = argparse.ArgumentParser(prog="agentmem bench switch", description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    return run_args(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
