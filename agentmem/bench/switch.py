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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agentmem.config import GPU_LAYERS_ENV, default_gpu_layers
from agentmem.errors import ConfigError

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


@dataclass(frozen=True)
class Workload:
    """What every variant runs: the model, its settings and the calls, as identical token lists.

    Attributes:
        path: the GGUF file.
        n_ctx: context of one agent (a plain `Llama`).
        pool_n_ctx: context of the pools, `n_ctx` per agent.
        n_threads: CPU threads of every variant.
        max_tokens: tokens generated per call.
        history_tokens: each agent's history length in tokens.
        warm: one warm-up call per agent, `(agent, tokens, messages)`.
        schedule: the measured calls in order, `(agent, tokens, messages)`.
    """

    path: str
    n_ctx: int
    pool_n_ctx: int
    n_threads: int
    max_tokens: int
    history_tokens: dict[str, int]
    warm: list[tuple[str, list[int], list[dict]]]
    schedule: list[tuple[str, list[int], list[dict]]]


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
    from agentmem.engine.threads import default_threads
    from agentmem.model import resolve_model_path

    n_threads = n_threads or default_threads()
    path = str(resolve_model_path(model_path))
    load_before = os.getloadavg()
    n_ctx = max(4096, history_tokens + rounds * 120 + 512)
    wl = build_workload(path, n_ctx, n_threads, n_agents, history_tokens, rounds, max_tokens)
    say(f"model {Path(path).name}; {n_agents} agents, history tokens {wl.history_tokens}; "
        f"{rounds} rounds, max_tokens={max_tokens}")
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "llama": lambda: llama_variant(wl, use_cache=False),
        "llama+ram": lambda: llama_variant(wl, use_cache=True),
        "agentmem": lambda: pool_variant(wl, resident=max(1, n_agents // 2)),
        "resident": lambda: pool_variant(wl, resident=n_agents),
    }
    results: dict[str, Any] = {}
    for v in variants:
        say(f"running {v} ...")
        results[v] = runners[v]()
        say(f"  {v:10s} " + _result_line(results[v]))
    report = {
        "benchmark": "switch",
        "machine": _machine(load_before, n_threads),
        "config": {"n_agents": n_agents, "history_tokens": wl.history_tokens, "rounds": rounds,
                   "max_tokens": max_tokens, "model": Path(path).name},
        "results": results,
        "ratios": _ratios(results),
        "targets": {"llama / agentmem": ">= 20", "llama+ram / agentmem": ">= 10", "agentmem / resident": "<= 1.3"},
    }
    say("")
    say(markdown_table(report))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        say(f"\nwrote {out}")
    return report


def build_workload(
    path: str, n_ctx: int, n_threads: int, n_agents: int, history_tokens: int, rounds: int, max_tokens: int
) -> Workload:
    """The histories, the warm-up calls and the measured schedule, rendered by one renderer for everyone."""
    from agentmem import MemoryPool

    with MemoryPool(path, n_ctx=n_ctx, resident_agents=1, n_threads=n_threads) as tmp:
        hist = build_histories(n_agents, history_tokens, tmp.count_tokens)
        renderer_tokens = lambda m: tmp.renderer.render(m).tokens  # noqa: E731
        agents = list(hist)
        # the conversation each agent will see per round (replies fixed, so all variants match)
        schedule: list[tuple[str, list[int], list[dict]]] = []
        convo = {a: list(h) for a, h in hist.items()}
        ready = [{"role": "user", "content": "Ready?"}]
        warm = [(a, renderer_tokens(convo[a] + ready), convo[a] + ready) for a in agents]
        # the conversation goes on from the warm-up turn (append-only, as in a real app); the
        # assistant replies are re-sent as fixed text, so each switch also rolls back the reply
        for a in agents:
            convo[a] = convo[a] + ready + [{"role": "assistant", "content": "Ready."}]
        for r in range(rounds):
            for a in agents:
                convo[a] = convo[a] + [{"role": "user", "content": f"New item {r}: anything to add?"}]
                schedule.append((a, renderer_tokens(convo[a]), list(convo[a])))
                convo[a] = convo[a] + [{"role": "assistant", "content": "Nothing new, continue."}]
        sizes = {a: len(renderer_tokens(h)) for a, h in hist.items()}
    return Workload(path, n_ctx, n_ctx * n_agents, n_threads, max_tokens, sizes, warm, schedule)


def llama_variant(wl: Workload, *, use_cache: bool) -> dict[str, Any]:
    """TTFT of one plain llama-cpp-python `Llama` shared by all agents (with `LlamaRAMCache` if `use_cache`)."""
    from llama_cpp import Llama, LlamaRAMCache

    llm = Llama(wl.path, n_ctx=wl.n_ctx, n_batch=512, verbose=False, seed=0, n_threads=wl.n_threads,
                n_threads_batch=wl.n_threads, n_gpu_layers=default_gpu_layers())
    if use_cache:
        llm.set_cache(LlamaRAMCache(capacity_bytes=4 << 30))

    def call(tokens: list[int]) -> float:
        t0 = time.perf_counter()
        ttft = None
        for _ in llm.create_completion(tokens, max_tokens=wl.max_tokens, temperature=0.0, stream=True):
            if ttft is None:
                ttft = time.perf_counter() - t0
        return ttft if ttft is not None else time.perf_counter() - t0

    for _a, toks, _ in wl.warm:
        call(toks)
    xs = [call(toks) for _a, toks, _ in wl.schedule]
    llm.close()
    return _summary(xs) | {"ttft_s": xs}


def pool_variant(wl: Workload, *, resident: int) -> dict[str, Any]:
    """TTFT, KV source and restore time of a `MemoryPool` with `resident` live sequences."""
    from agentmem import MemoryPool

    with MemoryPool(wl.path, n_ctx=wl.pool_n_ctx, resident_agents=resident, n_threads=wl.n_threads, prefetch=False) as pool:
        for a, _, msgs in wl.warm:
            pool.chat(a, msgs, max_tokens=wl.max_tokens)
        xs, kv, restore = [], [], []
        for a, _, msgs in wl.schedule:
            r = pool.chat(a, msgs, max_tokens=wl.max_tokens)
            xs.append(r.timings.ttft_s)
            kv.append(r.kv)
            restore.append(r.timings.restore_s)
        st = pool.stats()["totals"]
    return _summary(xs) | {
        "ttft_s": xs,
        "kv": {k: kv.count(k) for k in set(kv)},
        "restore_median_ms": 1e3 * statistics.median(restore),
        "restores": st["restores"],
        "parks": st["parks"],
    }


def _result_line(r: dict[str, Any]) -> str:
    line = f"median {r['median_ms']:8.1f} ms   p95 {r['p95_ms']:8.1f} ms"
    if "restore_median_ms" in r:
        line += f"   kv={r['kv']} restore median {r['restore_median_ms']:.2f} ms"
    return line


def _ratios(results: dict[str, Any]) -> dict[str, float]:
    """The plain `Llama` variants over agentmem, and agentmem over the all-resident floor."""
    ratios: dict[str, float] = {}
    if "agentmem" in results:
        c = results["agentmem"]["median_ms"]
        if "llama" in results:
            ratios["llama / agentmem"] = results["llama"]["median_ms"] / c
        if "llama+ram" in results:
            ratios["llama+ram / agentmem"] = results["llama+ram"]["median_ms"] / c
        if "resident" in results:
            ratios["agentmem / resident"] = c / results["resident"]["median_ms"]
    return ratios


def _machine(load_before: tuple[float, float, float], n_threads: int) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "n_threads": n_threads,
        "n_gpu_layers": default_gpu_layers(),
    }


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
    parser.add_argument(
        "--n-gpu-layers", type=int, default=None, metavar="N",
        help="layers offloaded by every variant (-1 = all, 0 = CPU; default AGENTMEM_N_GPU_LAYERS, else 0)",
    )


def run_args(args: argparse.Namespace) -> int:
    """Run the benchmark with parsed options (see `add_arguments`); returns the exit status."""
    if args.n_gpu_layers is not None:  # every pool of the run reads it (PoolConfig(n_gpu_layers=None))
        if args.n_gpu_layers < -1:
            raise ConfigError(f"--n-gpu-layers must be >= -1 (-1 = every layer), got {args.n_gpu_layers}")
        os.environ[GPU_LAYERS_ENV] = str(args.n_gpu_layers)
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
