"""Scale-out benchmark: moving an agent between replicas with its KV, and 1 vs 2 replicas on one machine.

Runs `agentmem serve` replicas behind nginx (`agentmem.cluster.Cluster`) over one
PostgreSQL archive (`--archive-url`, or a throwaway server started from Debian's
binaries as the test fixture does). Sections (`--only`):

* **migrate**: each of `--agents` agents gets a ~`--history`-token history on
  replica A, is parked to the archive there (its lease released), and its next call
  goes to replica B: B takes the lease, reads the agent from the archive and
  restores its KV. Baseline, same run: the same messages on B for an agent B has
  never seen (a full re-prefill). Reported: client-side TTFT (streamed, first
  content chunk) of both, their ratio (target >= 10x), the cached tokens.
* **throughput**: `--clients` clients over `--tp-agents` agents, `--tp-rounds`
  calls each, through nginx, against 1 replica (with all `--threads`) and against
  2 replicas (half the threads each) on this machine: calls per second. Also the lease traffic of that run (renewals per
  second per agent from the lease log) and the archive's time per lease renewal.
* **route**: what nginx adds per request: `GET /health` and a one-token chat call
  of a live agent, `--route-calls` times each, through the proxy vs straight to the
  replica, interleaved (median and p90 of the difference).
* **bytes**: archive bytes of one ~`--history`-token agent by cold codec (state,
  sliding-window checkpoint, ledger), measured in a pool over a SQLite file.

Every figure is printed with the machine's load (`uptime`'s averages); compare only
within one run. Example: `python benchmarks/scale_out.py --threads 2`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks._report import add_gpu_layers, load, md_table, sections  # noqa: E402
from benchmarks._serving import free_port, stream_chat  # noqa: E402

WORDS = ("river stone lantern market orchard signal harbor ledger garden copper thunder meadow "
         "compass violin bakery glacier pencil canyon tunnel beacon").split()
SECTIONS = ("migrate", "throughput", "bytes", "route")


def say(msg: str) -> None:
    """Progress and results go to stdout (this module is a command)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def uptime() -> str:
    """`uptime`'s output (load averages), recorded next to every figure."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        return f"load average: {load()}"


def history(agent: str, n_tokens: int, seed: int) -> list[dict[str, str]]:
    """A conversation of roughly `n_tokens` tokens (about 1.3 tokens per word for Gemma's tokenizer)."""
    msgs = [{"role": "system", "content": f"You are agent {agent}. Answer briefly."}]
    words = 0
    k = seed
    while words * 1.3 < n_tokens:
        text = " ".join(WORDS[(k * 7 + j) % len(WORDS)] for j in range(60))
        msgs += [{"role": "user", "content": f"Note {k}: {text}"}, {"role": "assistant", "content": f"Noted {k}."}]
        words += 64
        k += 1
    return msgs + [{"role": "user", "content": "Summarize the notes in one word."}]


def new_schema(base_url: str, name: str) -> str:
    import psycopg

    from tests.fixtures.postgres import schema_url

    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
        conn.execute(f"CREATE SCHEMA {name}")
    return schema_url(base_url, name)


def cluster(args: argparse.Namespace, url: str, replicas: int, threads: int, workdir: Path) -> Any:
    from agentmem.cluster.launcher import Cluster

    ports: set[int] = set()
    while len(ports) < replicas + 1:
        ports.add(free_port())
    port, *rest = sorted(ports)
    return Cluster(replicas=replicas, archive_url=url, port=port, ports=rest, workdir=workdir,
                   serve_args=["--model", args.model, "--threads", str(threads), "--n-ctx", str(args.n_ctx),
                               "--resident", str(args.resident), "--lease-ttl", str(args.lease_ttl),
                               "--max-concurrent", "256", "--log-level", "warning"])


def body(msgs: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {"model": "m", "messages": msgs, "max_tokens": max_tokens, "temperature": 0}


# ---------------------------------------------------------------------- migrate
def run_migrate(args: argparse.Namespace, url: str, work: Path) -> dict[str, Any]:
    say(f"\n## migrate: {args.agents} agents, ~{args.history}-token histories, replica A -> replica B")
    rows, mig, pre = [], [], []
    with cluster(args, url, 2, max(1, args.threads // 2), work / "migrate") as c, httpx.Client() as http:
        a_url, b_url = c.replica_url(0) + "/v1/chat/completions", c.replica_url(1) + "/v1/chat/completions"
        for i in range(args.agents):
            agent = f"mig-{i}"
            msgs = history(agent, args.history, i)
            first = stream_chat(http, a_url, body(msgs, 8), {"X-Agent-Id": agent})
            assert first.status == 200, first.error
            r = http.post(f"{c.replica_url(0)}/agents/{agent}", params={"action": "park"}, json={"tier": "cold"}, timeout=60)
            assert r.status_code == 200, r.text
            nxt = [*msgs, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And one more?"}]
            moved = stream_chat(http, b_url, body(nxt, 8), {"X-Agent-Id": agent})
            fresh = stream_chat(http, b_url, body(nxt, 8), {"X-Agent-Id": f"fresh-{i}"})
            assert moved.status == 200 and fresh.status == 200, (moved.error, fresh.error)
            mig.append(moved.ttft_s)
            pre.append(fresh.ttft_s)
            rows.append([agent, first.prompt_tokens, f"{1e3 * moved.ttft_s:.0f}", moved.cached_tokens,
                         f"{1e3 * fresh.ttft_s:.0f}", fresh.cached_tokens, f"{fresh.ttft_s / moved.ttft_s:.1f}x"])
        load_now = uptime()
    say(md_table(["agent", "history tokens", "migrated TTFT ms", "cached", "re-prefill TTFT ms", "cached",
                  "speed-up"], rows))
    ratio = statistics.median(pre) / statistics.median(mig)
    say(f"median: migrated {1e3 * statistics.median(mig):.0f} ms vs re-prefill {1e3 * statistics.median(pre):.0f} ms "
        f"-> {ratio:.1f}x (target >= 10x: {'met' if ratio >= 10 else 'MISSED'})")
    say(f"uptime: {load_now}")
    return {"rows": rows, "median_migrated_s": statistics.median(mig), "median_reprefill_s": statistics.median(pre),
            "ratio": ratio, "uptime": load_now}


# ---------------------------------------------------------------------- throughput
def drive(c: Any, args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    agents = [f"{prefix}-{i:02d}" for i in range(args.tp_agents)]
    hist = {a: history(a, 200, i)[:-1] for i, a in enumerate(agents)}
    locks = {a: threading.Lock() for a in agents}
    jobs = [a for _ in range(args.tp_rounds) for a in agents]
    out = {"calls": 0, "errors": 0}
    lock = threading.Lock()

    def one(a: str) -> None:
        with locks[a], httpx.Client() as http:
            msgs = [*hist[a], {"role": "user", "content": f"Name a {WORDS[len(hist[a]) % len(WORDS)]}."}]
            res = stream_chat(http, c.url + "/v1/chat/completions", body(msgs, args.tp_tokens), {"X-Agent-Id": a})
            hist[a] = [*msgs, {"role": "assistant", "content": res.text}]
            with lock:
                out["calls"] += 1
                if res.status != 200 or res.error:
                    out["errors"] += 1

    # one warm-up call per agent (prefill of its history), not timed
    with ThreadPoolExecutor(args.clients) as ex:
        list(ex.map(one, agents))
    out = {"calls": 0, "errors": 0}
    t0, w0 = time.perf_counter(), time.time()
    with ThreadPoolExecutor(args.clients) as ex:
        list(ex.map(one, jobs))
    out["wall_s"] = time.perf_counter() - t0
    out["window"] = (w0, time.time())  # wall clock, as the archive's lease log (same machine)
    return out


def run_throughput(args: argparse.Namespace, url_of: Any, work: Path) -> dict[str, Any]:
    from agentmem.archive import open_archive

    say(f"\n## throughput: {args.clients} clients, {args.tp_agents} agents x {args.tp_rounds} calls, "
        f"{args.tp_tokens} tokens each, through nginx")
    results = {}
    for replicas in (1, 2):
        url = url_of(f"tp{replicas}")
        threads = max(1, args.threads // replicas)
        with cluster(args, url, replicas, threads, work / f"tp{replicas}") as c:
            r = drive(c, args, f"tp{replicas}")
            r["uptime"] = uptime()
        with open_archive(url) as arc:
            log = arc.lease_log()
            t = time.perf_counter()
            lease = arc.acquire_lease("bench-probe", owner="bench", ttl_s=10)
            for _ in range(50):
                lease = arc.renew_lease(lease, ttl_s=10)
            r["renew_ms"] = 1e3 * (time.perf_counter() - t) / 51
            arc.release_lease(lease)
        lo, hi = r.pop("window")
        renews = sum(1 for e in log if e.kind == "renew" and e.owner != "bench" and lo <= e.at <= hi)
        r["renews_per_agent_s"] = renews / max(1e-9, r["wall_s"]) / args.tp_agents
        r["replicas"], r["threads"] = replicas, threads
        results[replicas] = r
        say(f"{replicas} replica(s) x {threads} thread(s): {r['calls']} calls in {r['wall_s']:.1f} s, "
            f"{r['errors']} errors; uptime: {r['uptime']}")
    rows = [[f"{r['replicas']} x {r['threads']} threads", r["calls"], f"{r['wall_s']:.1f}",
             f"{r['calls'] / r['wall_s']:.2f}", r["errors"],
             f"{r['renews_per_agent_s']:.3f}", f"{r['renew_ms']:.2f}"] for r in results.values()]
    say(md_table(["replicas", "calls", "wall s", "calls/s", "errors", "renewals/s/agent",
                  "ms per renewal"], rows))
    speed = (results[2]["calls"] / results[2]["wall_s"]) / (results[1]["calls"] / results[1]["wall_s"])
    say(f"2 replicas / 1 replica, calls per second: {speed:.2f}x (same cores: {os.cpu_count()})")
    return {"by_replicas": results, "speedup": speed}


# ---------------------------------------------------------------------- route
def run_route(args: argparse.Namespace, url: str, work: Path) -> dict[str, Any]:
    say(f"\n## route: nginx vs direct, {args.route_calls} interleaved requests of each kind")
    out: dict[str, Any] = {}
    with cluster(args, url, 1, args.threads, work / "route") as c, httpx.Client() as http:
        msgs = [{"role": "user", "content": "Say yes."}]
        targets = {"nginx": c.url, "direct": c.replica_url(0)}
        for kind in ("health", "chat"):
            times: dict[str, list[float]] = {"nginx": [], "direct": []}
            for i in range(args.route_calls + 2):
                for name, base in targets.items():
                    t = time.perf_counter()
                    if kind == "health":
                        r = http.get(base + "/health", timeout=30)
                    else:
                        r = http.post(base + "/v1/chat/completions", json=body(msgs, 1), timeout=60,
                                      headers={"X-Agent-Id": "route-probe"})
                    assert r.status_code == 200, r.text
                    if i >= 2:  # the first two warm the connections and the agent
                        times[name].append(time.perf_counter() - t)
            med = {k: statistics.median(v) for k, v in times.items()}
            out[kind] = {**{f"{k}_median_ms": 1e3 * v for k, v in med.items()},
                         "overhead_ms": 1e3 * (med["nginx"] - med["direct"])}
        out["uptime"] = uptime()
    rows = [[k, f"{v['direct_median_ms']:.2f}", f"{v['nginx_median_ms']:.2f}", f"{v['overhead_ms']:+.2f}"]
            for k, v in out.items() if k != "uptime"]
    say(md_table(["request", "direct median ms", "via nginx median ms", "nginx adds ms"], rows))
    say(f"uptime: {out['uptime']}")
    return out


# ---------------------------------------------------------------------- bytes
def run_bytes(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from agentmem import MemoryPool

    say(f"\n## bytes: archive bytes of one ~{args.history}-token agent by cold codec")
    rows, out = [], {}
    msgs = history("bytes", args.history, 0)
    for codec in ("f16", "q8_0", "q8_0/q4_0", "q4_0"):
        db = work / f"bytes-{codec.replace('/', '-')}.db"
        with MemoryPool(args.model, n_threads=args.threads, n_ctx=args.n_ctx, resident_agents=1, archive_path=str(db),
                        cold_codec=codec, prefetch=False) as pool:
            r = pool.chat("bytes", msgs, max_tokens=4)
            pool.park("bytes", "cold")
            arc = pool.engine()._core.archive  # the pool's own archive: the rows it wrote
            info = arc.get_state_info("bytes")
            ckpt = arc.get_checkpoint("bytes")
            led = arc.get_ledger("bytes")
            n_tok = led.n_tokens
            ck = len(ckpt[0]) + (len(ckpt[1]) if ckpt[1] else 0) if ckpt else 0
            state = info.n_bytes
        ledger = 4 * n_tok
        total = state + ck + ledger
        out[codec] = {"tokens": n_tok, "state": state, "checkpoint": ck, "ledger": ledger, "total": total,
                      "prompt_tokens": r.usage.prompt_tokens}
        rows.append([codec, n_tok, f"{state / 2**20:.2f}", f"{ck / 2**20:.2f}", f"{ledger / 1024:.1f}",
                     f"{total / 2**20:.2f}", f"{total / n_tok / 1024:.1f}"])
    say(md_table(["cold codec", "tokens", "state MiB", "SWA checkpoint MiB", "ledger KiB", "total MiB", "KiB/token"],
                 rows))
    say(f"uptime: {uptime()}")
    return out


def main(argv: list[str] | None = None) -> int:
    from agentmem.model import resolve_model_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma-3-270m", help="GGUF path or bundled model (gemma-3-270m)")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads of the machine, split among replicas (2)")
    add_gpu_layers(ap)
    ap.add_argument("--archive-url", default=None, help="a PostgreSQL URL (default: a throwaway local server)")
    ap.add_argument("--agents", type=int, default=4, help="migrate: agents (4)")
    ap.add_argument("--history", type=int, default=1500, help="migrate/bytes: history tokens per agent (1500)")
    ap.add_argument("--n-ctx", type=int, default=8192, help="KV cells per replica (8192)")
    ap.add_argument("--resident", type=int, default=2, help="live sequences per replica (2)")
    ap.add_argument("--lease-ttl", type=float, default=10.0, help="lease TTL of the replicas (10)")
    ap.add_argument("--clients", type=int, default=4, help="throughput: concurrent clients (4)")
    ap.add_argument("--tp-agents", type=int, default=8, help="throughput: agents (8)")
    ap.add_argument("--tp-rounds", type=int, default=3, help="throughput: calls per agent (3)")
    ap.add_argument("--tp-tokens", type=int, default=32, help="throughput: max_tokens per call (32)")
    ap.add_argument("--route-calls", type=int, default=30, help="route: requests of each kind (30)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run ({','.join(SECTIONS)})")
    ap.add_argument("--json", default=None, help="write the results to this file")
    args = ap.parse_args(argv)
    chosen = sections(ap, args.only, SECTIONS)
    args.model = str(resolve_model_path(args.model))
    say(f"# scale_out: {Path(args.model).name}, {args.threads} threads, {os.cpu_count()} cores; uptime: {uptime()}")
    results: dict[str, Any] = {"model": Path(args.model).name, "threads": args.threads, "cpu_count": os.cpu_count()}
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="agentmem-scale-") as tmp:
        work = Path(tmp)
        base = args.archive_url
        if base is None and {"migrate", "throughput", "route"} & set(chosen):
            from tests.fixtures.postgres import PostgresServer, find_pg_bin

            bin_dir = find_pg_bin()
            if bin_dir is None:
                ap.error("no PostgreSQL binaries: pass --archive-url or run scripts/install_postgres.sh")
            server = PostgresServer(bin_dir)
            stack.callback(server.stop)
            base = server.start()

        def url_of(name: str) -> str:
            return new_schema(base, name) if args.archive_url is None else base

        if "migrate" in chosen:
            results["migrate"] = run_migrate(args, url_of("migrate"), work)
        if "throughput" in chosen:
            results["throughput"] = run_throughput(args, url_of, work)
        if "bytes" in chosen:
            results["bytes"] = run_bytes(args, work)
        if "route" in chosen:
            results["route"] = run_route(args, url_of("route"), work)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
