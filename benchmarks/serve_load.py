"""Load and fault test of `agentmem serve` (bounded in count and time; 127.0.0.1 only).

Starts `agentmem serve` as a subprocess (the tiny random-weight model of
tests/fixtures/tiny_gguf.py unless `--model` is given), then:

* **load**: `--clients` threads (32) share `--requests` streamed chat calls over
  `--agents` agents (64) on `--resident` live sequences (4). Reported: throughput,
  p50/p99 TTFT and latency, errors by HTTP status, the server's RSS over time
  (VmRSS from /proc/PID/status).
* **fault**: `--kill-streams` clients close their connection after the first chunk,
  then the server is SIGKILLed and restarted on the same `--archive`, and every agent
  is called once. An agent is lost when its call neither reads cached tokens nor
  is listed in `GET /agents` afterwards. Zero lost agents and zero 5xx is the target.
* **`--durability both`**: the cost of `--durability call`. Two servers run at once, one
  `--durability exit` and one `--durability call`, each on its own archive; the load run
  alternates between them in blocks of `--block` requests (order exit, call, call, exit,
  ...: the machine is shared, so both see the same load), then the fault run goes to the
  `call` server.

Run: `python benchmarks/serve_load.py` (tiny model) or
`python benchmarks/serve_load.py --model ~/.cache/agentmem/gemma-3-270m-q4_k_m.gguf --requests 64`;
`--durability both --requests 128 --block 32` for the durability cost.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks._report import add_gpu_layers, load, table  # noqa: E402
from benchmarks._serving import CallResult, ServerProc, free_port, pct, stream_chat  # noqa: E402

logger = logging.getLogger(__name__)

WORDS = ("river stone lantern market orchard signal harbor ledger garden copper thunder meadow "
         "compass violin bakery glacier pencil canyon tunnel beacon").split()


def say(msg: str) -> None:
    """Progress goes to stdout (this module is a command)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def server_cmd(args: argparse.Namespace, model: str, port: int, *, archive: Path, durability: str) -> list[str]:
    cmd = [sys.executable, "-m", "agentmem.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--model", model, "--archive", str(archive), "--resident", str(args.resident),
           "--n-ctx", str(args.n_ctx), "--threads", str(args.threads), "--max-concurrent", str(4 * args.clients),
           "--log-level", "warning", "--durability", durability]
    for opt in args.pool_option:
        cmd += ["--pool-option", opt]
    return cmd


class Workload:
    """Per-agent chat histories; calls of one agent are serialized by the client (one lock each)."""

    def __init__(self, n_agents: int, prefix: str) -> None:
        self.ids = [f"{prefix}{i:03d}" for i in range(n_agents)]
        self.history: dict[str, list[dict[str, str]]] = {
            a: [{"role": "system", "content": f"You are agent {a}. Keep answers short. Notes: "
                 + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(40))}]
            for i, a in enumerate(self.ids)}
        self.locks = {a: threading.Lock() for a in self.ids}
        self.turn = collections.Counter[str]()

    def call(self, client: httpx.Client, base: str, agent: str, max_tokens: int,
             close_after_first: bool = False) -> CallResult:
        with self.locks[agent]:
            self.turn[agent] += 1
            msgs = self.history[agent] + [{"role": "user", "content": f"Turn {self.turn[agent]}: name a {WORDS[self.turn[agent] % len(WORDS)]}."}]
            res = stream_chat(client, f"{base}/v1/chat/completions",
                              {"model": "m", "messages": msgs, "max_tokens": max_tokens, "temperature": 0},
                              {"X-Agent-Id": agent}, close_after_first=close_after_first)
            if res.status == 200 and not close_after_first and not res.error:
                self.history[agent] = msgs + [{"role": "assistant", "content": res.text}]
            return res


def summarize(name: str, results: list[CallResult], wall_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.status == 200 and not r.error]
    by_status = collections.Counter(str(r.status) if not r.error or r.status != 200 else "200+stream-error" for r in results)
    return {
        "run": name, "requests": len(results), "ok": len(ok), "wall_s": round(wall_s, 2),
        "req_per_s": round(len(ok) / wall_s, 3) if wall_s else 0.0,
        "ttft_p50_s": round(pct([r.ttft_s for r in ok], 50), 4), "ttft_p99_s": round(pct([r.ttft_s for r in ok], 99), 4),
        "lat_p50_s": round(pct([r.latency_s for r in ok], 50), 4), "lat_p99_s": round(pct([r.latency_s for r in ok], 99), 4),
        "by_status": dict(by_status), "cached_hits": sum(1 for r in ok if r.cached_tokens > 0),
        "errors": [r.error for r in results if r.error][:5],
    }


def load_block(args: argparse.Namespace, srv: ServerProc, wl: Workload, client: httpx.Client, order: list[str],
               deadline: float) -> list[CallResult]:
    """`order`'s calls from `--clients` threads (those past `deadline` are skipped)."""
    def one(agent: str) -> CallResult | None:
        if time.monotonic() > deadline:
            return None
        return wl.call(client, srv.base_url, agent, args.max_tokens)

    with ThreadPoolExecutor(args.clients) as ex:
        return [r for r in ex.map(one, order) if r is not None]


def run_load(args: argparse.Namespace, srv: ServerProc, wl: Workload, client: httpx.Client) -> dict[str, Any]:
    order = [wl.ids[i % len(wl.ids)] for i in range(args.requests)]
    t0 = time.monotonic()
    results = load_block(args, srv, wl, client, order, t0 + args.time_limit)
    out = summarize("load", results, time.monotonic() - t0)
    out["skipped_by_time_limit"] = len(order) - len(results)
    return out


def run_load_pair(args: argparse.Namespace, servers: dict[str, ServerProc], loads: dict[str, Workload],
                  client: httpx.Client) -> dict[str, Any]:
    """The load run on both servers, alternating blocks of `--block` requests (ABBA order), one summary each."""
    order = [loads["exit"].ids[i % args.agents] for i in range(args.requests)]
    blocks = [order[i:i + args.block] for i in range(0, len(order), args.block)]
    deadline = time.monotonic() + args.time_limit
    results: dict[str, list[CallResult]] = {"exit": [], "call": []}
    walls = {"exit": 0.0, "call": 0.0}
    log: list[dict[str, Any]] = []
    for k, block in enumerate(blocks):
        if time.monotonic() > deadline:
            logger.warning("time limit reached after %d of %d blocks", k, len(blocks))
            break
        pair = ("exit", "call") if k % 2 == 0 else ("call", "exit")
        for name in pair:
            t0, load0 = time.monotonic(), load()
            got = load_block(args, servers[name], loads[name], client, block, deadline)
            walls[name] += time.monotonic() - t0
            results[name] += got
            log.append({"block": k, "server": name, "calls": len(got), "wall_s": round(time.monotonic() - t0, 2),
                        "load_start": load0, "load_end": load()})
            logger.info("block %d on --durability %s: %d calls in %.1f s, load %s", k, name, len(got),
                        time.monotonic() - t0, load())
    out = {name: summarize(f"load, --durability {name}", results[name], walls[name]) for name in results}
    for name in out:
        out[name]["skipped_by_time_limit"] = args.requests - len(results[name])
    out["blocks"] = log
    return out


def run_fault(args: argparse.Namespace, srv: ServerProc, wl: Workload, client: httpx.Client) -> dict[str, Any]:
    # 1. clients that go away after the first chunk
    victims = wl.ids[: args.kill_streams]
    t0 = time.monotonic()
    with ThreadPoolExecutor(args.clients) as ex:
        killed = list(ex.map(lambda a: wl.call(client, srv.base_url, a, max(args.max_tokens, 32), close_after_first=True), victims))
    # the server must still answer those agents (their next call waits for nothing stale)
    with ThreadPoolExecutor(args.clients) as ex:
        after_kill = list(ex.map(lambda a: wl.call(client, srv.base_url, a, args.max_tokens), victims))
    if args.checkpoint_before_kill:
        client.post(f"{srv.base_url}/agents", params={"action": "checkpoint"}, timeout=300)
    # 2. SIGKILL and restart on the same archive
    rss_before = list(srv.rss)
    srv.kill()
    restart_s = srv.start(timeout_s=args.time_limit)
    listed = {a["id"] for a in client.get(f"{srv.base_url}/agents", timeout=60).json().get("data", [])}
    # 3. every agent once
    with ThreadPoolExecutor(args.clients) as ex:
        every = list(ex.map(lambda a: (a, wl.call(client, srv.base_url, a, args.max_tokens)), wl.ids))
    lost = [a for a, r in every if not (r.cached_tokens > 0 or a in listed)]
    fivexx = sum(1 for r in killed + after_kill + [r for _, r in every] if r.status >= 500)
    return {
        "killed_streams": len(killed), "killed_first_chunk_ok": sum(1 for r in killed if r.status == 200),
        "after_kill": summarize("after-kill", after_kill, 0.0)["by_status"],
        "restart_s": round(restart_s, 2), "listed_after_restart": len(listed),
        "every_agent": summarize("every-agent", [r for _, r in every], time.monotonic() - t0),
        "with_cached_tokens": sum(1 for _, r in every if r.cached_tokens > 0),
        "lost_agents": len(lost), "lost_sample": lost[:8], "5xx": fivexx,
        "rss_before_kill": rss_before[-1][1] if rss_before else 0,
    }


def report(result: dict[str, Any]) -> None:
    """The tables of `result` on stdout."""
    loads = [result[k] for k in ("load", "load_exit", "load_call") if k in result]
    say(table(["run", "requests", "ok", "req/s", "TTFT p50", "TTFT p99", "latency p50", "latency p99", "status"],
              [[ld["run"], ld["requests"], ld["ok"], ld["req_per_s"], ld["ttft_p50_s"], ld["ttft_p99_s"],
                ld["lat_p50_s"], ld["lat_p99_s"], json.dumps(ld["by_status"])] for ld in loads]))
    if "load_exit" in result:
        e, c = result["load_exit"], result["load_call"]
        say(f"--durability call / exit: latency p50 {c['lat_p50_s'] / e['lat_p50_s']:.2f}x, "
            f"TTFT p50 {c['ttft_p50_s'] / e['ttft_p50_s']:.2f}x, calls/s {c['req_per_s'] / e['req_per_s']:.2f}x")
    say("RSS MiB over time (s): " + ", ".join(f"{t:.0f}:{b / 2**20:.0f}" for t, b in result["rss_load"]))
    if "fault" in result:
        f = result["fault"]
        say(f"fault: {f['killed_streams']} streams closed after the first chunk; then {f['after_kill']}; "
            f"SIGKILL, restart in {f['restart_s']} s, {f['listed_after_restart']} agents listed; every agent once: "
            f"{json.dumps(f['every_agent']['by_status'])}, {f['with_cached_tokens']} with cached tokens, "
            f"lost {f['lost_agents']}, 5xx {f['5xx']}")
    say(f"load average at start {result['load_at_start']}, at end {result['load_at_end']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: a tiny random-weight model built here)")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--agents", type=int, default=64)
    ap.add_argument("--resident", type=int, default=4)
    ap.add_argument("--requests", type=int, default=256, help="calls in the load run (per server with `both`)")
    ap.add_argument("--block", type=int, default=32, help="requests per block with --durability both")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--kill-streams", type=int, default=16, help="clients that close after the first chunk")
    ap.add_argument("--threads", type=int, default=2)
    add_gpu_layers(ap)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--archive", type=Path, default=None, help="SQLite archive (default: a temporary file)")
    ap.add_argument("--pool-option", action="append", default=[])
    ap.add_argument("--checkpoint-before-kill", action="store_true", help="POST /agents?action=checkpoint before the SIGKILL")
    ap.add_argument("--durability", choices=("exit", "call", "both"), default="call",
                    help="the server's --durability (call: every answered agent is in the archive; "
                         "both: one server of each, load alternated between them)")
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds the load run may take (then it stops)")
    ap.add_argument("--skip-fault", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise

    tmp = Path(tempfile.mkdtemp(prefix="serve-load-"))
    model = args.model
    if model is None:
        from tests.fixtures.tiny_gguf import build_tiny_gguf

        model = str(build_tiny_gguf(tmp / "tiny-llama.gguf"))
    archive = args.archive or tmp / "agents.db"
    modes = ("exit", "call") if args.durability == "both" else (args.durability,)
    servers: dict[str, ServerProc] = {}
    for mode in modes:
        port = free_port()
        db = archive if len(modes) == 1 else archive.with_name(f"{archive.stem}-{mode}{archive.suffix}")
        servers[mode] = ServerProc(server_cmd(args, model, port, archive=db, durability=mode), port,
                                   tmp / f"server-{mode}.log", rss_every_s=1.0)
    load_start = load()
    logger.info("model %s, %d clients, %d agents, resident %d, %d requests, durability %s; load %s; logs in %s",
                Path(model).name, args.clients, args.agents, args.resident, args.requests, args.durability, load_start, tmp)
    result: dict[str, Any] = {"model": Path(model).name, "args": {k: str(v) for k, v in vars(args).items()},
                              "load_at_start": load_start}
    srv = servers["call" if "call" in servers else modes[0]]  # the one the fault run goes to
    try:
        result["startup_s"] = {m: round(s.start(), 2) for m, s in servers.items()}
        limits = httpx.Limits(max_connections=4 * args.clients, max_keepalive_connections=args.clients)
        with httpx.Client(limits=limits) as client:
            if len(modes) == 1:
                wl = Workload(args.agents, "load/")
                result["load"] = run_load(args, srv, wl, client)
            else:
                loads = {m: Workload(args.agents, "load/") for m in modes}
                pair = run_load_pair(args, servers, loads, client)
                result["load_exit"], result["load_call"], result["blocks"] = pair["exit"], pair["call"], pair["blocks"]
                wl = loads["call"]
                result["rss_peak_exit"] = servers["exit"].peak_rss()
                servers["exit"].stop()  # the fault run measures the `call` server alone
            logger.info("load run done, load %s", load())
            result["rss_load"] = srv.rss[:: max(1, len(srv.rss) // 20)]
            result["rss_peak"] = srv.peak_rss()
            if not args.skip_fault:
                result["fault"] = run_fault(args, srv, wl, client)
                result["rss_peak_after_restart"] = srv.peak_rss()
                logger.info("fault run done, load %s", load())
    finally:
        for s in servers.values():
            s.stop()
    result["load_at_end"] = load()
    report(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
