"""Tiered-memory benchmark: restart-resume, a mixed 16-agent workload under a RAM budget, prefetch.

Three measurements on the default model (Gemma 3 270M Q4_K_M), each against a
baseline measured in the same run:

1. **restart-resume** — an agent with ~1,500 tokens of history is written to the
   archive by one process; a *new process* opens a pool on the same file and
   continues the conversation. TTFT of that call (state restored from SQLite,
   only the new turn decoded) vs re-prefilling the same prompt from scratch in
   the same process. Run for the default archive codec (``q8_0/q4_0``) and for
   ``f16`` (exact). Target: >= 10x.
2. **mixed workload** (after the PolyKV seed) — 16 agents, 8 called often and 8
   rarely on a seeded random schedule (16 warm-up prefills, then 96 calls, 85%
   to the frequent class), 4 live sequences, a RAM (WARM) budget of about a
   third of the agents' end-of-run f16 states (predicted from a real state's
   bytes per token; the unlimited run reports the actual total). Variants, each
   in its own process (so its RSS high-water mark is its own), all driven in
   lockstep — call *i* of every variant before call *i + 1* of any — so that a
   busy spell on a shared machine hits them alike:
   ``unlimited`` (no budget, everything parks f16 in RAM), ``lru-f16``
   (``placement="lru"``, f16 in RAM and on disk), ``cost-codecs``
   (``placement="cost"``, default codecs, frequent agents ``foreground``, rare
   ones ``background``) and ``cost-q8`` (as ``cost-codecs`` but
   ``park_codec="q8_0"`` and frequent agents ``normal``, so they park q8_0 in
   RAM instead of spilling f16 states to disk). Reports p50/p99 TTFT per class,
   where each call found its agent, re-prefills, the memory layer's time inside
   calls (restores, parking, demotions — the pool's mover is timed), peak RSS
   and the largest WARM bytes seen after any call vs the budget. Target:
   frequent agents' p99 within 1.2x of the unlimited run; WARM bytes never above
   the budget. Workers run with ``MALLOC_MMAP_THRESHOLD_=131072`` so freed KV
   blobs go back to the OS and RSS measures live memory
   (``--glibc-default-malloc`` to measure glibc's default behaviour).
3. **prefetch** — a round-robin team of 6 agents on 3 live sequences, with
   simulated tool work (``time.sleep``, 75 ms) after each call, prefetch on vs
   off, with parked states in RAM (f16) and in the archive (default codec), the
   four settings in lockstep. Reports the prefetch hit rate, median TTFT and the
   restore time left inside the calls.

The machine may be shared: every section records ``os.getloadavg()`` and all
variants of a comparison use the same ``--threads`` (default 1, the steadiest on
a loaded 2-core box).

Usage::

    python benchmarks/tiers.py                 # everything, ~11 min on 2 busy cores
    python benchmarks/tiers.py --quick         # smaller histories and schedules, ~6 min
    python benchmarks/tiers.py --only restart  # one section (restart, mixed, prefetch)

Prints tables and writes ``bench-results/tiers.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import add_gpu_layers, load, make_pool, mib, ms, run_meta, table  # noqa: E402
from benchmarks._report import sections as parse_sections  # noqa: E402

logger = logging.getLogger("benchmarks.tiers")

SECTIONS = ("restart", "mixed", "prefetch")
TARGETS = {"restart_speedup": 10.0, "frequent_p99_vs_unlimited": 1.2}

# --------------------------------------------------------------------------- synthetic conversations
_PROJECTS = [
    "the billing service",
    "the mobile app",
    "the data pipeline",
    "the search index",
    "the onboarding flow",
    "the payments API",
    "the support dashboard",
    "the release train",
    "the analytics export",
    "the auth module",
]
_THINGS = [
    "the migration plan",
    "the error budget",
    "the test matrix",
    "the rollout checklist",
    "the API schema",
    "the cache settings",
    "the incident notes",
    "the design review",
    "the load test",
    "the backlog",
    "the deployment script",
    "the retry policy",
    "the audit log",
    "the feature flags",
    "the cost report",
]
_VERBS = ["review", "summarise", "check", "estimate", "reorder", "simplify", "document", "verify", "compare", "plan"]
_FACTS = [
    "it must ship before Friday",
    "two tests are flaky",
    "the owner is on leave",
    "latency doubled last week",
    "the budget is fixed",
    "security signed off",
    "the schema changed twice",
    "users asked for CSV export",
    "the old path is deprecated",
    "the staging cluster is shared",
]
_ROLES = ["planner", "coder", "reviewer", "tester", "writer", "analyst", "critic", "researcher"]


def user_turn(rng: random.Random, i: int) -> str:
    return (
        f"Step {i}: please {rng.choice(_VERBS)} {rng.choice(_THINGS)} for {rng.choice(_PROJECTS)}; "
        f"note that {rng.choice(_FACTS)}."
    )


def assistant_turn(rng: random.Random, role: str, i: int) -> str:
    return (
        f"As the {role}, for step {i} I will {rng.choice(_VERBS)} {rng.choice(_THINGS)} first, because "
        f"{rng.choice(_FACTS)}, then {rng.choice(_VERBS)} {rng.choice(_THINGS)}."
    )


def build_history(pool: Any, agent: str, target_tokens: int, seed: int) -> list[dict[str, str]]:
    """A system prompt and scripted turns until the prompt has about ``target_tokens`` tokens (ends on a user turn)."""
    rng = random.Random(seed)
    role = _ROLES[seed % len(_ROLES)]
    msgs = [{"role": "system", "content": f"You are {agent}, the {role} of a small software team. Answer briefly."}]
    i = 0
    while True:
        msgs.append({"role": "user", "content": user_turn(rng, i)})
        if pool.count_tokens(msgs) >= target_tokens:
            return msgs
        msgs.append({"role": "assistant", "content": assistant_turn(rng, role, i)})
        i += 1


# --------------------------------------------------------------------------- helpers


def vm_status() -> dict[str, int]:
    """VmRSS / VmHWM of this process in bytes (Linux; empty elsewhere)."""
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def peak_rss() -> int:
    """RSS high-water mark of this process in bytes (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)


def pct(xs: list[float], q: float) -> float:
    """Percentile with linear interpolation (q in [0, 100]); nan when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)










def instrument(pool: Any) -> dict[str, float]:
    """Accumulate seconds spent in the pool's tier moves, by destination (diagnostics only).

    Wraps the private tier moves of the pool's mover when they exist: ``hot`` =
    restores, ``warm`` = parking a live agent, ``cold`` = demotions to the archive.
    These run inside the call that needs a sequence, so they are part of its TTFT.
    """
    acc = {"hot": 0.0, "warm": 0.0, "cold": 0.0}
    mover = getattr(pool, "_mover", None)
    if mover is None:
        return acc

    def wrap(name: str, dst_of: Any) -> None:
        orig = getattr(mover, name)

        def timed(agent: Any, *a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return orig(agent, *a, **kw)
            finally:
                dst = dst_of(a)
                acc[dst] = acc.get(dst, 0.0) + time.perf_counter() - t

        setattr(mover, name, timed)

    wrap("restore", lambda a: "hot")
    wrap("park", lambda a: a[0])
    wrap("demote", lambda a: a[0])
    return acc


def run_worker(name: str, job: dict[str, Any], timeout: float = 1200) -> dict[str, Any]:
    """Run ``WORKERS[name](job)`` in a fresh Python process (a real restart; its own RSS)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
        job_path = f.name
    out_path = job_path + ".out"
    try:
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            name,
            "--job",
            job_path,
            "--worker-out",
            out_path,
        ]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"worker {name} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(Path(out_path).read_text())
    finally:
        for p in (job_path, out_path):
            Path(p).unlink(missing_ok=True)


# --------------------------------------------------------------------------- 1. restart-resume
def w_restart_before(job: dict[str, Any]) -> dict[str, Any]:
    """Process 1: build the history, one call, close (the pool checkpoints to the archive)."""
    with make_pool(
        job, n_ctx=job["n_ctx"], resident_agents=2, archive_path=job["archive"], cold_codec=job["cold_codec"]
    ) as pool:
        msgs = build_history(pool, "resume", job["history_tokens"], seed=7)
        r = pool.chat("resume", msgs, max_tokens=job["max_tokens"])
        st = pool.stats()["agents"]["resume"]
    from agentmem.archive import Archive

    with Archive(job["archive"], readonly=True) as arc:
        info = arc.get_state_info("resume")
    return {
        "messages": msgs + [{"role": "assistant", "content": r.text}],
        "history_tokens": st["tokens"],
        "first_call": {"kv": r.kv, "ttft_s": r.timings.ttft_s, "prompt_tokens": r.usage.prompt_tokens},
        "archived": {"codec": info.codec, "bytes": info.n_bytes, "n_tokens": info.n_tokens} if info else None,
    }


def w_restart_after(job: dict[str, Any]) -> dict[str, Any]:
    """Process 2: a new pool on the same archive; the next call restores, then a re-prefill of the same prompt."""
    t0 = time.perf_counter()
    pool = make_pool(
        job, n_ctx=job["n_ctx"], resident_agents=2, archive_path=job["archive"], cold_codec=job["cold_codec"]
    )
    open_s = time.perf_counter() - t0
    msgs = job["messages"] + [{"role": "user", "content": "Thanks. What is the single most important next step?"}]
    try:
        before = pool.stats()["agents"]["resume"]
        restored = pool.chat("resume", msgs, max_tokens=job["max_tokens"])
    finally:
        pool.close()
    # the baseline: the same prompt in a pool that kept nothing (no archive, no other agent to share a prefix with)
    with make_pool(job, n_ctx=job["n_ctx"], resident_agents=2) as fresh:
        prefill = fresh.chat("resume", msgs, max_tokens=job["max_tokens"])

    def rec(r: Any) -> dict[str, Any]:
        return {
            "kv": r.kv,
            "ttft_s": r.timings.ttft_s,
            "restore_s": r.timings.restore_s,
            "prefill_s": r.timings.prefill_s,
            "prompt_tokens": r.usage.prompt_tokens,
            "cached_tokens": r.usage.cached_tokens,
            "text": r.text,
        }

    return {"open_s": open_s, "tier_at_open": before["tier"], "restored": rec(restored), "prefill": rec(prefill)}


def bench_restart(args: argparse.Namespace, common: dict[str, Any]) -> dict[str, Any]:
    history = 600 if args.quick else 1500
    repeats = 1 if args.quick else 3
    out: dict[str, Any] = {"history_target_tokens": history, "repeats": repeats, "codecs": {}, "load_before": load()}
    with tempfile.TemporaryDirectory(prefix="agentmem-tiers-") as tmp:
        for codec in ("q8_0/q4_0", "f16"):
            src = Path(tmp) / codec.replace("/", "-")
            src.mkdir()
            job = {
                **common,
                "n_ctx": 4096,
                "max_tokens": 16,
                "history_tokens": history,
                "cold_codec": codec,
                "archive": str(src / "agents.db"),
            }
            logger.info("restart-resume [%s]: process 1 builds ~%d tokens of history...", codec, history)
            before = run_worker("restart_before", job)
            reps = []
            for i in range(repeats):
                # every restart starts from the same archive: copy the closed file set
                dst = Path(tmp) / f"{src.name}-run{i}"
                shutil.copytree(src, dst)
                logger.info("restart-resume [%s]: process %d resumes (run %d/%d)...", codec, i + 2, i + 1, repeats)
                reps.append(
                    run_worker(
                        "restart_after", {**job, "archive": str(dst / "agents.db"), "messages": before["messages"]}
                    )
                )
            ttft_r = [r["restored"]["ttft_s"] for r in reps]
            ttft_p = [r["prefill"]["ttft_s"] for r in reps]
            out["codecs"][codec] = {
                "history_tokens": before["history_tokens"],
                "archived": before["archived"],
                "runs": reps,
                "kv": [r["restored"]["kv"] for r in reps],
                "cached_tokens": reps[0]["restored"]["cached_tokens"],
                "prompt_tokens": reps[0]["restored"]["prompt_tokens"],
                "new_tokens_decoded": reps[0]["restored"]["prompt_tokens"] - reps[0]["restored"]["cached_tokens"],
                "ttft_restored_s": statistics.median(ttft_r),
                "restore_s": statistics.median(r["restored"]["restore_s"] for r in reps),
                "ttft_prefill_s": statistics.median(ttft_p),
                "open_s": statistics.median(r["open_s"] for r in reps),
                "speedup": statistics.median(p / r for p, r in zip(ttft_p, ttft_r)),
                "same_reply_as_prefill": all(r["restored"]["text"] == r["prefill"]["text"] for r in reps),
            }
    out["load_after"] = load()
    best = min(v["speedup"] for v in out["codecs"].values())
    out["target"] = {
        "speedup_min": best,
        "target": TARGETS["restart_speedup"],
        "met": best >= TARGETS["restart_speedup"],
    }
    return out


def print_restart(res: dict[str, Any]) -> None:
    rows = []
    for codec, v in res["codecs"].items():
        arc = v["archived"] or {}
        rows.append(
            [
                codec,
                v["history_tokens"],
                v["new_tokens_decoded"],
                mib(arc.get("bytes", 0)),
                ms(v["restore_s"]),
                ms(v["ttft_restored_s"]),
                ms(v["ttft_prefill_s"]),
                f"{v['speedup']:.1f}x",
                ",".join(sorted(set(v["kv"]))),
                "yes" if v["same_reply_as_prefill"] else "no",
            ]
        )
    print(
        f"\n== restart-resume (median of {res['repeats']} restarts; load {res['load_before']} -> {res['load_after']})"
    )
    print(
        table(
            [
                "archive codec",
                "history",
                "decoded",
                "state",
                "restore",
                "TTFT resumed",
                "TTFT re-prefill",
                "speedup",
                "kv",
                "same reply",
            ],
            rows,
        )
    )


# --------------------------------------------------------------------------- 2. mixed workload
MIXED_VARIANTS: dict[str, dict[str, Any]] = {
    "unlimited": {"placement": "cost"},
    "lru-f16": {"placement": "lru", "park_codec": "f16", "cold_codec": "f16"},
    "cost-codecs": {"placement": "cost"},  # defaults: park f16 (foreground), background q8_0, cold q8_0/q4_0
    "cost-q8": {"placement": "cost", "park_codec": "q8_0"},  # frequent agents "normal": q8_0 in RAM too
}


def mixed_schedule(n_calls: int, seed: int, p_frequent: float) -> list[str]:
    rng = random.Random(seed)
    freq = [f"f{i}" for i in range(8)]
    rare = [f"r{i}" for i in range(8)]
    return [rng.choice(freq) if rng.random() < p_frequent else rng.choice(rare) for _ in range(n_calls)]


def mixed_agents() -> list[str]:
    return [f"f{i}" for i in range(8)] + [f"r{i}" for i in range(8)]


def w_mixed_measure(job: dict[str, Any]) -> dict[str, Any]:
    """Bytes per token of an f16 state, the agents' history sizes and the growth of a prompt per call."""
    with make_pool(job, n_ctx=job["n_ctx"], resident_agents=2) as pool:
        hist = {a: build_history(pool, a, job["history_tokens"], seed=100 + i) for i, a in enumerate(mixed_agents())}
        r = pool.chat("f0", hist["f0"], max_tokens=job["max_tokens"])
        st = pool.stats()["agents"]["f0"]  # a live agent's ``bytes`` is llama.cpp's f16 state size
        # one turn's growth: this reply plus the next user turn and its template
        msgs = hist["f0"] + [
            {"role": "assistant", "content": r.text},
            {"role": "user", "content": user_turn(random.Random(1), 0)},
        ]
        growth = pool.count_tokens(msgs) - pool.count_tokens(hist["f0"])
        return {
            "bytes_per_token": st["bytes"] / st["live_tokens"],
            "history_tokens": {a: pool.count_tokens(m) for a, m in hist.items()},
            "growth_per_call": growth,
        }


def w_mixed(job: dict[str, Any]) -> dict[str, Any]:
    """One variant of the mixed workload, driven call by call over stdin/stdout (JSON lines).

    The coordinator sends ``{"op": "call", "agent": ..., "phase": ...}`` and reads one
    record back; ``{"op": "finish"}`` closes the pool and returns the summary. All
    variants run side by side this way, one call at a time, so a busy spell on the
    machine hits every variant alike.
    """
    wire = sys.stdout
    sys.stdout = sys.stderr  # nothing else may reach the wire
    variant = job["variant"]
    opts = dict(MIXED_VARIANTS[variant])
    if variant != "unlimited":
        opts["warm_budget_bytes"] = job["warm_budget"]
    rss_start = vm_status().get("VmRSS", 0)
    pool = make_pool(job, n_ctx=job["n_ctx"], resident_agents=job["resident"], archive_path=job["archive"], **opts)
    agents = mixed_agents()
    if variant == "cost-codecs":
        for a in agents:
            pool.set_priority(a, "foreground" if a.startswith("f") else job["rare_priority"])
    elif variant == "cost-q8":
        for a in agents:
            pool.set_priority(a, "normal" if a.startswith("f") else job["rare_priority"])
    hist = {a: build_history(pool, a, job["history_tokens"], seed=100 + i) for i, a in enumerate(agents)}
    rss_loaded = vm_status().get("VmRSS", 0)
    samples: list[dict[str, int]] = []
    rng = random.Random(5)
    moves = instrument(pool)

    def send(obj: Any) -> None:
        wire.write(json.dumps(obj) + "\n")
        wire.flush()

    def call(a: str, phase: str) -> dict[str, Any]:
        tier = pool.stats()["agents"].get(a, {}).get("tier", "new")
        m0 = dict(moves)
        r = pool.chat(a, hist[a], max_tokens=job["max_tokens"])
        mv = {f"{k}_s": moves[k] - m0.get(k, 0.0) for k in moves}
        hist[a] += [
            {"role": "assistant", "content": r.text},
            {"role": "user", "content": user_turn(rng, len(hist[a]))},
        ]
        t = pool.stats()["totals"]
        samples.append(
            {
                "warm": t["warm_bytes"],
                "cold": t["cold_bytes"],
                "hot": t["hot_bytes"],
                "rss": vm_status().get("VmRSS", 0),
            }
        )
        return {
            "agent": a,
            "cls": "frequent" if a.startswith("f") else "rare",
            "phase": phase,
            "tier_before": tier,
            "kv": r.kv,
            "ttft_s": r.timings.ttft_s,
            "restore_s": r.timings.restore_s,
            "prompt_tokens": r.usage.prompt_tokens,
            "cached_tokens": r.usage.cached_tokens,
            "moves": mv,
        }

    send({"ready": True})
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "call":
                send(call(cmd["agent"], cmd["phase"]))
            elif cmd["op"] == "finish":
                break
        st = pool.stats()
        f16_bytes = {a: v["bytes"] for a, v in st["agents"].items()} if variant == "unlimited" else {}
        codecs = sorted({f"{v['tier']}:{v['codec']}" for v in st["agents"].values()})
    finally:
        pool.close()
    return {
        "variant": variant,
        "options": opts,
        "samples": samples,
        "totals": st["totals"],
        "tiers": st["tiers"],
        "codecs_at_end": codecs,
        "f16_state_bytes": f16_bytes,
        "rss_start": rss_start,
        "rss_loaded": rss_loaded,
        "peak_rss": peak_rss(),
        "vm_hwm": vm_status().get("VmHWM", 0),
        "load": load(),
    }


class Stepper:
    """A worker process driven one command at a time (see :func:`w_mixed`)."""

    def __init__(self, name: str, job: dict[str, Any]) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="agentmem-worker-"))
        (self.dir / "job.json").write_text(json.dumps(job))
        self.err = open(self.dir / "stderr", "w+")  # noqa: SIM115 - lives as long as the process
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--job", str(self.dir / "job.json"),
               "--worker-out", str(self.dir / "out.json")]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.name = name

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.err.seek(0)
            raise RuntimeError(f"worker {self.name} died (rc={self.proc.returncode}):\n{self.err.read()[-4000:]}")
        return json.loads(line)

    def ready(self) -> None:
        self._read()

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def finish(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "finish"}) + "\n")
        self.proc.stdin.close()
        rc = self.proc.wait()
        self.err.seek(0)
        if rc != 0:
            raise RuntimeError(f"worker {self.name} failed (rc={rc}):\n{self.err.read()[-4000:]}")
        res = json.loads((self.dir / "out.json").read_text())
        self.err.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return res


def summarize_mixed(r: dict[str, Any]) -> dict[str, Any]:
    m = [c for c in r["calls"] if c["phase"] == "measured"]
    out: dict[str, Any] = {"classes": {}}
    for cls in ("frequent", "rare"):
        xs = [c for c in m if c["cls"] == cls]
        t = [c["ttft_s"] for c in xs]
        out["classes"][cls] = {
            "calls": len(xs),
            "p50_ttft_s": pct(t, 50),
            "p99_ttft_s": pct(t, 99),
            "max_ttft_s": max(t, default=float("nan")),
            "p50_restore_s": pct([c["restore_s"] for c in xs if c["kv"] == "restored"], 50),
            # memory-layer time inside the call (restore + parking a victim + demotions), all calls of the class
            "p50_memory_s": pct([c["restore_s"] for c in xs], 50),
            "p99_memory_s": pct([c["restore_s"] for c in xs], 99),
            # the model's own work (prefill of the new tokens): the same in every variant, noise aside
            "p50_model_s": pct([c["ttft_s"] - c["restore_s"] for c in xs], 50),
            "p99_model_s": pct([c["ttft_s"] - c["restore_s"] for c in xs], 99),
            # counterfactual: the same calls without the WARM->COLD demotions they ran inline
            "p99_ttft_without_demotion_s": pct([c["ttft_s"] - c.get("moves", {}).get("cold_s", 0.0) for c in xs], 99),
            "demote_s_in_calls": sum(c.get("moves", {}).get("cold_s", 0.0) for c in xs),
            "calls_with_demotion": sum(c.get("moves", {}).get("cold_s", 0.0) > 0 for c in xs),
            "max_demote_s": max((c.get("moves", {}).get("cold_s", 0.0) for c in xs), default=0.0),
            "from": {k: sum(c["tier_before"] == k for c in xs) for k in ("hot", "warm", "cold", "empty")},
            "reprefills": sum(c["kv"] == "prefilled" for c in xs),
            "mean_prompt_tokens": statistics.mean(c["prompt_tokens"] for c in xs) if xs else 0,
        }
    out["warm_bytes_max"] = max((s["warm"] for s in r["samples"]), default=0)
    out["cold_bytes_max"] = max((s["cold"] for s in r["samples"]), default=0)
    out["peak_rss"] = r["peak_rss"]
    out["rss_growth"] = r["peak_rss"] - r["rss_loaded"]
    out["demotions"] = r["totals"]["demotions"]
    out["drops"] = r["totals"]["drops"]
    out["restores"] = r["totals"]["restores"]
    return out


def bench_mixed(args: argparse.Namespace, common: dict[str, Any]) -> dict[str, Any]:
    n_calls = 64 if args.quick else 96
    history = 150 if args.quick else 200
    max_tokens = 8
    schedule = mixed_schedule(n_calls, seed=11, p_frequent=0.85)
    variants = ["unlimited"] + [v for v in args.variants.split(",") if v and v != "unlimited"]
    out: dict[str, Any] = {
        "agents": 16,
        "frequent": 8,
        "rare": 8,
        "resident_agents": args.resident,
        "history_tokens": history,
        "measured_calls": n_calls,
        "warmup_calls": 16,
        "p_frequent": 0.85,
        "rare_priority": args.rare_priority,
        "lockstep": True,
        "load_before": load(),
        "variants": {},
    }
    # The budget: a third of the agents' f16 states at the end of the run, predicted from a real
    # state's bytes per token, each history's size and the prompt growth per call (the unlimited
    # run then reports the actual sizes).
    est = run_worker("mixed_measure", {**common, "n_ctx": 4096, "history_tokens": history, "max_tokens": max_tokens})
    calls_per_agent = {a: 1 + schedule.count(a) for a in mixed_agents()}
    predicted = sum(
        est["bytes_per_token"] * (est["history_tokens"][a] + (n - 1) * est["growth_per_call"] + max_tokens)
        for a, n in calls_per_agent.items()
    )
    budget = int(predicted / 3)
    out.update(
        f16_bytes_per_token=est["bytes_per_token"],
        growth_per_call=est["growth_per_call"],
        f16_states_predicted_bytes=int(predicted),
        warm_budget_bytes=budget,
    )
    logger.info(
        "mixed workload: %s, %d agents, %d calls each, lockstep; f16 %.1f KB/token, warm budget %s",
        ", ".join(variants), 16, n_calls + 16, est["bytes_per_token"] / 1e3, mib(budget),
    )  # fmt: skip
    raw: dict[str, Any] = {v: {"calls": []} for v in variants}
    with tempfile.TemporaryDirectory(prefix="agentmem-tiers-") as tmp:
        workers = {}
        try:
            for variant in variants:
                job = {
                    **common,
                    "variant": variant,
                    "n_ctx": 4096,
                    "resident": args.resident,
                    "history_tokens": history,
                    "max_tokens": max_tokens,
                    "warm_budget": budget,
                    "rare_priority": args.rare_priority,
                    "archive": str(Path(tmp) / f"{variant}.db"),
                }
                workers[variant] = Stepper("mixed", job)
            for w in workers.values():
                w.ready()
            steps = [(a, "warmup") for a in mixed_agents()] + [(a, "measured") for a in schedule]
            for i, (agent, phase) in enumerate(steps):
                k = i % len(variants)  # rotate who goes first, so no variant always follows another
                for variant in variants[k:] + variants[:k]:
                    raw[variant]["calls"].append(workers[variant].ask({"op": "call", "agent": agent, "phase": phase}))
                if (i + 1) % 32 == 0:
                    logger.info("mixed workload: %d/%d steps (load %s)", i + 1, len(steps), load())
            for variant, w in workers.items():
                raw[variant].update(w.finish())
        finally:
            for w in workers.values():
                if w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait()
    r = raw["unlimited"]
    total = sum(r["f16_state_bytes"].values())
    out["f16_states_total_bytes"] = total
    out["f16_bytes_per_state_mean"] = total / max(1, len(r["f16_state_bytes"]))
    out["budget_fraction_of_actual"] = budget / total if total else float("nan")
    for variant in variants:
        r = raw[variant]
        out["variants"][variant] = {
            **summarize_mixed(r),
            "options": r["options"],
            "codecs_at_end": r["codecs_at_end"],
            "load": r["load"],
        }
    out["load_after"] = load()
    base = out["variants"]["unlimited"]["classes"]["frequent"]["p99_ttft_s"]
    for v in out["variants"].values():
        v["frequent_p99_vs_unlimited"] = v["classes"]["frequent"]["p99_ttft_s"] / base
        v["inside_budget"] = v["warm_bytes_max"] <= out["warm_budget_bytes"]
    out["target"] = {
        name: {
            "frequent_p99_vs_unlimited": v["frequent_p99_vs_unlimited"],
            "inside_budget": v["inside_budget"],
            "met": v["frequent_p99_vs_unlimited"] <= TARGETS["frequent_p99_vs_unlimited"] and v["inside_budget"],
        }
        for name, v in out["variants"].items()
        if name != "unlimited"
    }
    out["raw"] = raw
    return out


def print_mixed(res: dict[str, Any]) -> None:
    print(
        f"\n== mixed workload: 16 agents (8 frequent, 8 rare), {res['measured_calls']} measured calls, "
        f"{res['resident_agents']} live sequences; f16 states {mib(res['f16_states_total_bytes'])} total, "
        f"warm budget {mib(res['warm_budget_bytes'])} ({res['budget_fraction_of_actual']:.0%} of them); variants "
        f"run in lockstep (load {res['load_before']} -> {res['load_after']})"
    )
    rows = []
    base = res["variants"]["unlimited"]["classes"]["frequent"]["p99_ttft_s"]
    for name, v in res["variants"].items():
        for cls in ("frequent", "rare"):
            c = v["classes"][cls]
            src = c["from"]
            nodem = c["p99_ttft_without_demotion_s"]
            rows.append(
                [
                    name,
                    cls,
                    c["calls"],
                    ms(c["p50_ttft_s"]),
                    ms(c["p99_ttft_s"]),
                    f"{v['frequent_p99_vs_unlimited']:.2f}x" if cls == "frequent" else "",
                    f"{src['hot']}/{src['warm']}/{src['cold']}",
                    c["reprefills"],
                    ms(c["p50_restore_s"]),
                    ms(c["p99_memory_s"]),
                    ms(c["p99_model_s"]),
                    f"{c['calls_with_demotion']} / {ms(c['max_demote_s'])}",
                    f"{ms(nodem)} ({nodem / base:.2f}x)" if cls == "frequent" else ms(nodem),
                ]
            )
    print(
        table(
            [
                "variant",
                "class",
                "calls",
                "p50 TTFT",
                "p99 TTFT",
                "p99 vs unl.",
                "from hot/warm/cold",
                "re-prefills",
                "p50 restore",
                "p99 memory",
                "p99 model",
                "demoting calls / max",
                "p99 w/o demotions",
            ],
            rows,
        )
    )
    rows = []
    for name, v in res["variants"].items():
        budget = res["warm_budget_bytes"] if name != "unlimited" else 0
        rows.append(
            [
                name,
                mib(v["warm_bytes_max"]),
                mib(budget) if budget else "none",
                ("yes" if v["inside_budget"] else "NO") if budget else "-",
                mib(v["cold_bytes_max"]),
                mib(v["peak_rss"]),
                mib(v["rss_growth"]),
                v["demotions"],
                v["drops"],
            ]
        )
    print(
        table(
            [
                "variant",
                "warm max",
                "warm budget",
                "inside",
                "cold max",
                "peak RSS",
                "RSS growth",
                "demotions",
                "drops",
            ],
            rows,
        )
    )


# --------------------------------------------------------------------------- 3. prefetch
def w_prefetch(job: dict[str, Any]) -> dict[str, Any]:
    """One prefetch setting, driven call by call like :func:`w_mixed`.

    ``{"op": "call", "agent", "round"}`` runs the call, then the application's
    "tool work" (``time.sleep``) — the window a prefetch has to restore the next
    agent — and only then answers, so the next variant's call never overlaps it.
    ``{"op": "mark"}`` snapshots the counters where the measured rounds begin.
    """
    wire = sys.stdout
    sys.stdout = sys.stderr
    opts: dict[str, Any] = {"prefetch": job["prefetch"]}
    if job["store"] == "cold":
        opts["warm_budget_bytes"] = 1  # every parked state goes straight on to the archive
    pool = make_pool(job, n_ctx=job["n_ctx"], resident_agents=3, archive_path=job["archive"], **opts)
    agents = [f"a{i}" for i in range(6)]
    hist = {a: build_history(pool, a, job["history_tokens"], seed=200 + i) for i, a in enumerate(agents)}
    rng = random.Random(9)
    at_mark: dict[str, Any] = {}

    def send(obj: Any) -> None:
        wire.write(json.dumps(obj) + "\n")
        wire.flush()

    send({"ready": True})
    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "mark":
                at_mark = pool.stats()["totals"]
                send({})
            elif cmd["op"] == "call":
                a = cmd["agent"]
                r = pool.chat(a, hist[a], max_tokens=job["max_tokens"])
                hist[a] += [
                    {"role": "assistant", "content": r.text},
                    {"role": "user", "content": user_turn(rng, cmd["round"])},
                ]
                time.sleep(job["tool_s"])  # the application's own work between model calls
                send(
                    {
                        "agent": a,
                        "round": cmd["round"],
                        "kv": r.kv,
                        "ttft_s": r.timings.ttft_s,
                        "restore_s": r.timings.restore_s,
                        "new_tokens": r.usage.prompt_tokens - r.usage.cached_tokens,
                    }
                )
            elif cmd["op"] == "finish":
                break
        totals = pool.stats()["totals"]
    finally:
        pool.close()
    keys = ("prefetches", "prefetch_hits", "prefetch_misses", "prefetch_wasted", "restores", "parks", "demotions")
    measured = {k: totals[k] - at_mark.get(k, 0) for k in keys}
    n = measured["prefetch_hits"] + measured["prefetch_misses"]
    measured["prefetch_hit_rate"] = measured["prefetch_hits"] / n if n else 0.0
    return {"totals": totals, "measured": measured, "load": load()}


def bench_prefetch(args: argparse.Namespace, common: dict[str, Any]) -> dict[str, Any]:
    rounds = 5 if args.quick else 7
    skip = 2  # round 0 prefills everyone; the predictor needs to see each transition twice
    out: dict[str, Any] = {
        "agents": 6,
        "resident_agents": 3,
        "rounds": rounds,
        "skipped_rounds": skip,
        "tool_s": args.tool_ms / 1000,
        "lockstep": True,
        "load_before": load(),
        "runs": {},
    }
    names = [f"{store}/{on}" for store in ("warm", "cold") for on in ("off", "on")]
    raw: dict[str, Any] = {n: {"calls": []} for n in names}
    logger.info("prefetch: %s, 6 agents round-robin, %d rounds, lockstep", ", ".join(names), rounds)
    with tempfile.TemporaryDirectory(prefix="agentmem-tiers-") as tmp:
        workers: dict[str, Stepper] = {}
        try:
            for name in names:
                store, on = name.split("/")
                job = {
                    **common,
                    "prefetch": on == "on",
                    "store": store,
                    "n_ctx": 4096,
                    "tool_s": args.tool_ms / 1000,
                    "history_tokens": 150 if args.quick else 200,
                    "max_tokens": 8,
                    "archive": str(Path(tmp) / f"{store}-{on}.db"),
                }
                workers[name] = Stepper("prefetch", job)
            for w in workers.values():
                w.ready()
            i = 0
            for rnd in range(rounds):
                if rnd == skip:
                    for w in workers.values():
                        w.ask({"op": "mark"})
                for a in [f"a{j}" for j in range(6)]:
                    k = i % len(names)
                    i += 1
                    for name in names[k:] + names[:k]:
                        raw[name]["calls"].append(workers[name].ask({"op": "call", "agent": a, "round": rnd}))
            for name, w in workers.items():
                raw[name].update(w.finish())
        finally:
            for w in workers.values():
                if w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait()
    for name in names:
        r = raw[name]
        m = [c for c in r["calls"] if c["round"] >= skip]
        t = r["measured"]  # counters over the measured rounds only
        out["runs"][name] = {
            "store": name.split("/")[0],
            "prefetch": name.endswith("/on"),
            "calls": len(m),
            "median_ttft_s": statistics.median(c["ttft_s"] for c in m),
            "p90_ttft_s": pct([c["ttft_s"] for c in m], 90),
            "median_restore_in_call_s": statistics.median(c["restore_s"] for c in m),
            "mean_restore_in_call_s": statistics.mean(c["restore_s"] for c in m),
            "kv": {k: sum(c["kv"] == k for c in m) for k in ("reused", "restored", "prefilled")},
            **{k: t[k] for k in ("prefetches", "prefetch_hits", "prefetch_misses", "prefetch_wasted")},
            "prefetch_hit_rate": t["prefetch_hit_rate"],
            "restores": t["restores"],
            "parks": t["parks"],
            "demotions": t["demotions"],
            "load": r["load"],
        }
    out["load_after"] = load()
    out["raw"] = raw
    return out


def print_prefetch(res: dict[str, Any]) -> None:
    print(
        f"\n== prefetch: 6 agents round-robin on 3 live sequences, {res['tool_s'] * 1e3:.0f} ms tool work "
        f"between calls, rounds {res['skipped_rounds']}..{res['rounds'] - 1} measured, settings in lockstep "
        f"(load {res['load_before']} -> {res['load_after']})"
    )
    rows = []
    for v in res["runs"].values():
        kv = v["kv"]
        rows.append(
            [
                v["store"],
                "on" if v["prefetch"] else "off",
                v["calls"],
                f"{v['prefetch_hit_rate']:.0%}" if v["prefetch"] else "-",
                f"{v['prefetch_hits']}/{v['prefetch_hits'] + v['prefetch_misses']}" if v["prefetch"] else "-",
                v["prefetch_wasted"],
                f"{kv['reused']}/{kv['restored']}/{kv['prefilled']}",
                f"{ms(v['median_restore_in_call_s'])} / {ms(v['mean_restore_in_call_s'])}",
                ms(v["median_ttft_s"]),
                ms(v["p90_ttft_s"]),
            ]
        )
    print(
        table(
            [
                "parked in",
                "prefetch",
                "calls",
                "hit rate",
                "hits/(hits+misses)",
                "wasted",
                "reused/restored/prefilled",
                "restore in call p50/mean",
                "median TTFT",
                "p90 TTFT",
            ],
            rows,
        )
    )


# --------------------------------------------------------------------------- main
WORKERS = {
    "restart_before": w_restart_before,
    "restart_after": w_restart_after,
    "mixed": w_mixed,
    "mixed_measure": w_mixed_measure,
    "prefetch": w_prefetch,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter histories and schedules (~6 min)")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections: {', '.join(SECTIONS)}")
    ap.add_argument("--threads", type=int, default=1, help="n_threads of every pool (same for all variants)")
    add_gpu_layers(ap)
    ap.add_argument("--model", default=None, help="GGUF path (default: the bundled Gemma 3 270M)")
    ap.add_argument("--resident", type=int, default=4, help="live sequences in the mixed workload")
    ap.add_argument(
        "--variants",
        default=",".join(MIXED_VARIANTS),
        help=f"mixed-workload variants ({', '.join(MIXED_VARIANTS)}); unlimited always runs (the reference)",
    )
    ap.add_argument(
        "--glibc-default-malloc",
        action="store_true",
        help="keep glibc's dynamic mmap threshold in the workers (RSS then also counts freed, retained blocks)",
    )
    ap.add_argument(
        "--rare-priority",
        default="background",
        choices=["background", "normal"],
        help="priority of the rare agents in the cost-* variants",
    )
    ap.add_argument("--tool-ms", type=float, default=75.0, help="simulated tool work between calls (prefetch section)")
    ap.add_argument("--out", type=Path, default=Path("bench-results/tiers.json"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if not args.worker else logging.WARNING, format="%(message)s")

    if args.worker:
        job = json.loads(Path(args.job).read_text())
        res = WORKERS[args.worker](job)
        Path(args.worker_out).write_text(json.dumps(res))
        return 0

    bad = sorted(set(args.variants.split(",")) - set(MIXED_VARIANTS) - {""})
    if bad:
        ap.error(f"unknown variant(s) {bad}; valid: {', '.join(MIXED_VARIANTS)}")
    if not args.glibc_default_malloc:
        # A fixed mmap threshold makes every large buffer (KV blobs) go back to the OS when freed, so the
        # RSS high-water mark measures live state, not glibc's retained heap (its dynamic threshold grows
        # to the largest freed block, ~10 MB here, and keeps later frees of that size in the heap).
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    sections = parse_sections(ap, args.only, SECTIONS)
    from agentmem.model import resolve_model_path

    model = str(resolve_model_path(args.model))
    common = {"model": model, "threads": args.threads}
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "meta": run_meta("tiers.py", model, args, argv, malloc_mmap_threshold=os.environ.get("MALLOC_MMAP_THRESHOLD_")),
        "targets": TARGETS,
    }
    benches = {
        "restart": (bench_restart, print_restart),
        "mixed": (bench_mixed, print_mixed),
        "prefetch": (bench_prefetch, print_prefetch),
    }
    for s in sections:
        fn, show = benches[s]
        results[s] = fn(args, common)
        show(results[s])
    results["meta"]["load_at_end"] = load()
    results["meta"]["wall_s"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    logger.info("wrote %s (%.0f s)", args.out, results["meta"]["wall_s"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
