"""CPU time of one agent switch: `benchmarks/switch.py`'s calls, timed by the process's CPU clock, not the wall.

On a shared machine a call's wall time moves with the load by up to 2x from run to run;
the CPU time the process spends on it (`time.process_time`, every thread: llama.cpp's
one thread runs in the calling thread) moves far less, so it shows a change in the work
a call does. Same workload as `benchmarks/switch.py` (`agentmem.bench.switch.build_workload`:
N agents with histories of `--history-tokens`, round-robin, each call adding a short user
turn), on a pool with `--resident` live sequences (default N // 2: every switch parks one
agent and restores another) and then with every agent resident.

Only the library's public `MemoryPool` and `agentmem.bench.switch.build_workload` are used,
so this file (from a newer tree) can measure an older tree's library
(`benchmarks/before_after.py` does).

Usage:
    python benchmarks/switch_cpu.py --threads 1 --out switch_cpu.json

Prints one line per variant; writes the JSON results (`--out`) with the load at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def variant(wl: Any, resident: int) -> dict[str, Any]:
    """Medians of CPU ms, wall TTFT ms and restore ms over the scheduled calls, and how each call found its KV."""
    from agentmem import MemoryPool

    with MemoryPool(wl.path, n_ctx=wl.pool_n_ctx, resident_agents=resident, n_threads=wl.n_threads,
                    prefetch=False) as pool:
        for a, _, msgs in wl.warm:
            pool.chat(a, msgs, max_tokens=wl.max_tokens)
        cpu, ttft, restore, kv = [], [], [], []
        for a, _, msgs in wl.schedule:
            c0 = time.process_time()
            r = pool.chat(a, msgs, max_tokens=wl.max_tokens)
            cpu.append(1e3 * (time.process_time() - c0))
            ttft.append(1e3 * r.timings.ttft_s)
            restore.append(1e3 * r.timings.restore_s)
            kv.append(r.kv)
    return {"resident": resident, "cpu_ms": statistics.median(cpu), "ttft_ms": statistics.median(ttft),
            "restore_ms": statistics.median(restore), "kv": {k: kv.count(k) for k in sorted(set(kv))},
            "cpu_ms_each": [round(x, 1) for x in cpu]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--history-tokens", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--resident", type=int, default=0, help="live sequences (0 = agents // 2)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=None, help="GGUF file (default: AGENTMEM_MODEL or the bundled model)")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    from agentmem.bench.switch import build_workload
    from agentmem.model import resolve_model_path

    load_start = os.getloadavg()
    n_ctx = max(4096, args.history_tokens + args.rounds * 120 + 512)
    wl = build_workload(str(resolve_model_path(args.model)), n_ctx, args.threads, args.agents, args.history_tokens,
                        args.rounds, args.max_tokens)
    res = {"switching": variant(wl, args.resident or max(1, args.agents // 2)),
           "resident": variant(wl, args.agents)}
    for name, r in res.items():
        sys.stdout.write(f"{name:10s} CPU {r['cpu_ms']:7.1f} ms  TTFT {r['ttft_ms']:7.1f} ms  restore "
                         f"{r['restore_ms']:5.1f} ms  kv {r['kv']}\n")
    if args.out:
        args.out.write_text(json.dumps({"results": res, "load_start": load_start, "load_end": os.getloadavg(),
                                        "args": vars(args)}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
