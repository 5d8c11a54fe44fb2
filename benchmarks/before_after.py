"""Before/after in one sitting: the switch, sharing, server and app benchmarks on a git revision and on this tree.

Issue #32's "behaviour unchanged" check. `--ref` (default `bbd84e6`, main before the
#32 work) is checked out as a detached worktree (`_report.ref_tree`, the helper
`call_overhead.py --ref` uses; kept under `--cache` and reused by the next run), then
each benchmark runs in a subprocess against each tree, **interleaved**: for every
repetition and every benchmark, the ref and this tree back to back (ABBA across
repetitions: ref, head, then head, ref), so a change of machine load hits both.

Every subprocess runs *that tree's own* benchmark script with
`PYTHONPATH=<tree>:<tree>/integrations`, `AGENTMEM_THREADS=1` and `--threads 1`
(the scripts of `bbd84e6` differ from this tree's only by `--n-gpu-layers` and by
`sharing.py` reaching the context through `pool.engine()`, which the old pool
lacks, so the old scripts are the ones that can run on the old library). Before
the first run each flag passed is checked against the script's `--help` in both
trees. Sizes are small (`BENCHES`): the point is the ratio, in one run, on the same
machine, not the absolute figures, which the benchmarks' own docs give at full size.

Each benchmark writes its JSON results (`--out`/`--json`); `PARSERS` reads them into
metrics of four kinds: `time` (lower is better; after/before > 1.15 is flagged),
`rate` (higher is better; flagged below 1/1.15), `count` (shown, not judged) and
`check` (what must not change: KV sources, cached and prefilled tokens, identical
replies, lost agents; `same` when every run of both trees agrees).

Usage:
    python benchmarks/before_after.py                      # bbd84e6 vs this tree, 2 repetitions
    python benchmarks/before_after.py --reps 1 --only switch,serve
    python benchmarks/before_after.py --md out.md --json out.json

Prints a markdown table with `uptime` at start and end, both commits and the command.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._report import git_sha, md_table, ref_tree  # noqa: E402

logger = logging.getLogger("benchmarks.before_after")

FLAG = 1.15  # after/before beyond this (time; its inverse for rates) is flagged


@dataclass(frozen=True)
class Bench:
    """One benchmark: its script (relative to a tree), its quick arguments and the flag naming its JSON file.

    `head_script`: the script is this tree's, run against each tree's library (it is newer than the ref);
    otherwise each tree runs its own copy.
    """

    name: str
    script: str
    args: tuple[str, ...]
    out_flag: str
    head_script: bool = False


BENCHES: dict[str, Bench] = {b.name: b for b in (
    Bench("switch", "benchmarks/switch.py",
          ("--variants", "agentmem,resident", "--agents", "4", "--history-tokens", "600", "--rounds", "2",
           "--max-tokens", "4", "--threads", "1"), "--out"),
    Bench("switch-cpu", "benchmarks/switch_cpu.py",
          ("--agents", "4", "--history-tokens", "600", "--rounds", "3", "--max-tokens", "4", "--threads", "1"),
          "--out", head_script=True),
    Bench("sharing", "benchmarks/sharing.py",
          ("--quick", "--doc-tokens", "800", "--gen-tokens", "24", "--threads", "1"), "--out"),
    Bench("serve", "benchmarks/serve_load.py",
          ("--requests", "128", "--clients", "8", "--agents", "32", "--resident", "4", "--max-tokens", "8",
           "--kill-streams", "4", "--threads", "1", "--time-limit", "240"), "--out"),
    Bench("apps", "benchmarks/apps.py",
          ("--only", "tools", "--variants", "hints,serve", "--users", "2", "--resident", "1", "--questions", "1",
           "--max-tokens", "16",
           "--tool-latency-s", "0.1", "--threads", "1"), "--json"),
)}


@dataclass(frozen=True)
class Metric:
    """One figure of one run. `kind`: time | rate | count | check (see the module docstring)."""

    name: str
    value: Any
    kind: str


def _digest(x: Any) -> str:
    return hashlib.sha1(json.dumps(x, sort_keys=True).encode()).hexdigest()[:10]


def parse_switch(d: dict[str, Any]) -> list[Metric]:
    """`benchmarks/switch.py`'s results: TTFT with park/restore on every switch and all resident."""
    a, r = d["results"]["agentmem"], d["results"]["resident"]
    return [
        Metric("TTFT median, park/restore per switch (ms)", a["median_ms"], "time"),
        Metric("TTFT p95, park/restore per switch (ms)", a["p95_ms"], "time"),
        Metric("restore median (ms)", a["restore_median_ms"], "time"),
        Metric("TTFT median, all resident (ms)", r["median_ms"], "time"),
        Metric("KV source per call, park/restore", json.dumps(a["kv"], sort_keys=True), "check"),
        Metric("KV source per call, all resident", json.dumps(r["kv"], sort_keys=True), "check"),
        Metric("restores / parks", f"{a['restores']} / {a['parks']}", "check"),
    ]


def parse_switch_cpu(d: dict[str, Any]) -> list[Metric]:
    """`benchmarks/switch_cpu.py`: CPU ms of one call (the process's clock), switching and all resident."""
    out: list[Metric] = []
    for name, label in (("switching", "park/restore per switch"), ("resident", "all resident")):
        r = d["results"][name]
        out += [Metric(f"CPU per call, {label} (ms)", r["cpu_ms"], "time"),
                Metric(f"TTFT median, {label} (ms)", r["ttft_ms"], "time"),
                Metric(f"KV source per call, {label}", json.dumps(r["kv"], sort_keys=True), "check")]
    return out


def parse_sharing(d: dict[str, Any]) -> list[Metric]:
    """`benchmarks/sharing.py`'s ttft and batch sections (and memory, when it ran)."""
    out: list[Metric] = []
    if "memory" in d:
        m = d["memory"]
        last = m["rows"][-1]
        out += [Metric(f"live KV cells, {last['n']} agents sharing (bytes)", last["live_cells_bytes"], "check"),
                Metric("agents' replies (digest)", _digest([a["reply"] for a in m["agents"]]), "check")]
    if "ttft" in d:
        for row in d["ttft"]["rows"]:
            v = row["variant"]
            out.append(Metric(f"join TTFT: {v} (ms)", 1e3 * row["ttft_s"], "time"))
            out.append(Metric(f"join kv, prompt/cached tokens: {v}",
                              f"{','.join(row['kv'])}, {row['prompt_tokens']}/{row['cached_tokens']}", "check"))
    if "batch" in d:
        for row in d["batch"]["rows"]:
            n = row["agents"]
            out += [Metric(f"{n} agents at once, batched (tok/s)", row["batched_tok_s"], "rate"),
                    Metric(f"{n} agents one by one (tok/s)", row["sequential_tok_s"], "rate"),
                    Metric(f"{n} agents: tokens, identical batched/one-by-one replies",
                           f"{row['tokens']}, {row['identical_replies']}/{n}", "check")]
    return out


def parse_serve(d: dict[str, Any]) -> list[Metric]:
    """`benchmarks/serve_load.py`: the load run and the fault run (SIGKILL, restart, every agent once)."""
    ld = d["load"]
    out = [
        Metric("requests/s", ld["req_per_s"], "rate"),
        Metric("TTFT p50 (ms)", 1e3 * ld["ttft_p50_s"], "time"),
        Metric("latency p50 (ms)", 1e3 * ld["lat_p50_s"], "time"),
        Metric("latency p99 (ms)", 1e3 * ld["lat_p99_s"], "time"),
        Metric("answered / requests", f"{ld['ok']} / {ld['requests']}", "check"),
        Metric("calls reading cached tokens", ld["cached_hits"], "count"),
    ]
    if "fault" in d:
        f = d["fault"]
        out += [Metric("restart after SIGKILL (s)", f["restart_s"], "time"),
                Metric("lost agents, 5xx after SIGKILL", f"{f['lost_agents']}, {f['5xx']}", "check"),
                Metric("agents listed after restart", f["listed_after_restart"], "check")]
    return out


def parse_apps(d: dict[str, Any]) -> list[Metric]:
    """`benchmarks/apps.py`: per app and variant, wall per task, TTFT, and the tokens that had to be prefilled."""
    out: list[Metric] = []
    for r in d["rows"]:
        tag = f"{r['app']} ({r['variant']})"
        out += [Metric(f"{tag} wall per task (s)", r["wall_s_per_task"], "time"),
                Metric(f"{tag} TTFT p50 (ms)", r["ttft_p50_ms"], "time"),
                Metric(f"{tag} TTFT p99 (ms)", r["ttft_p99_ms"], "time"),
                Metric(f"{tag} calls, prompt tokens, prefilled", f"{r['calls']}, {r['prompt_tokens']}, "
                       f"{r['prefilled_tokens']}", "check"),
                Metric(f"{tag} restores", r["restores"], "count")]
    return out


PARSERS: dict[str, Callable[[dict[str, Any]], list[Metric]]] = {
    "switch": parse_switch, "switch-cpu": parse_switch_cpu, "sharing": parse_sharing, "serve": parse_serve,
    "apps": parse_apps,
}


@dataclass
class Runs:
    """Every metric's values per side (`before`, `after`) over the repetitions, in first-seen order."""

    values: dict[tuple[str, str], dict[str, list[Any]]] = field(default_factory=dict)
    kinds: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, bench: str, side: str, metrics: list[Metric]) -> None:
        for m in metrics:
            key = (bench, m.name)
            self.kinds[key] = m.kind
            self.values.setdefault(key, {"before": [], "after": []})[side].append(m.value)


def _num(xs: list[Any]) -> float | None:
    nums = [float(x) for x in xs if isinstance(x, (int, float))]
    return statistics.median(nums) if nums else None


def _fmt(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def rows(runs: Runs) -> list[list[str]]:
    """Table rows: benchmark, metric, before, after, after/before (medians; `check` rows compare every run)."""
    out = []
    for (bench, name), vals in runs.values.items():
        kind, b, a = runs.kinds[(bench, name)], vals["before"], vals["after"]
        if kind == "check":
            seen_b, seen_a = sorted({str(x) for x in b}), sorted({str(x) for x in a})
            verdict = "-" if not (seen_b and seen_a) else "DIFFERS" if seen_b != seen_a else \
                "same" if len(seen_b) == 1 else "same values (each varies run to run)"
            out.append([bench, name, " / ".join(seen_b) or "-", " / ".join(seen_a) or "-", verdict])
            continue
        mb, ma = _num(b), _num(a)
        ratio = "-"
        if mb is not None and ma is not None and mb > 0:
            r = ma / mb
            bad = (kind == "time" and r > FLAG) or (kind == "rate" and r < 1 / FLAG)
            ratio = f"{r:.2f}" + (" **!**" if bad else "")
        out.append([bench, name, "-" if mb is None else _fmt(mb), "-" if ma is None else _fmt(ma), ratio])
    return out


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def env_for(tree: Path) -> dict[str, str]:
    """The subprocess environment: `tree`'s agentmem and integrations first, one llama.cpp thread."""
    return {**os.environ, "PYTHONPATH": f"{tree}:{tree / 'integrations'}", "AGENTMEM_THREADS": "1"}


def script(tree: Path, bench: Bench) -> Path:
    """The script that measures `tree`: this tree's when `bench.head_script`, else `tree`'s own copy."""
    return (ROOT if bench.head_script else tree) / bench.script


def unaccepted(tree: Path, bench: Bench) -> list[str]:
    """The flags of `bench` (and its output flag) that the script measuring `tree` does not list in `--help`."""
    res = subprocess.run([sys.executable, str(script(tree, bench)), "--help"], capture_output=True, text=True,
                         env=env_for(tree), cwd=tree, timeout=300)
    flags = [a for a in (*bench.args, bench.out_flag) if a.startswith("--")]
    return [f for f in flags if f not in res.stdout]


def run_one(tree: Path, bench: Bench, out: Path, log: Path, timeout_s: float) -> tuple[dict[str, Any] | None, float]:
    """`bench` on `tree` in a subprocess; its JSON results (None on failure, the log says why) and wall seconds."""
    cmd = [sys.executable, str(script(tree, bench)), *bench.args, bench.out_flag, str(out)]
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with log.open("w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env_for(tree), cwd=tree,
                                timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = -1
    wall = time.perf_counter() - t0
    if rc != 0 or not out.exists():
        logger.warning("%s on %s failed (rc %s): see %s", bench.name, tree, rc, log)
        return None, wall
    return json.loads(out.read_text()), wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="bbd84e6", help="the 'before' revision (default: main before #32)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of every benchmark on each side (medians)")
    ap.add_argument("--only", default=",".join(BENCHES), help=f"comma-separated: {', '.join(BENCHES)}")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "agentmem" / "before-after",
                    help="the ref's worktree (reused) and the runs' logs and JSON files")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one benchmark run may take")
    ap.add_argument("--md", type=Path, help="also write the report (markdown) here")
    ap.add_argument("--json", type=Path, help="also write every run's metrics here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    bad = sorted(set(names) - set(BENCHES))
    if bad:
        ap.error(f"unknown benchmark(s) {bad}; valid: {', '.join(BENCHES)}")
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    command = " ".join(["python benchmarks/before_after.py", *(sys.argv[1:] if argv is None else argv)])
    start = uptime()
    t_start = time.perf_counter()
    runs, walls = Runs(), []
    logs = args.cache / "runs"
    logs.mkdir(parents=True, exist_ok=True)
    with ref_tree(args.ref, at=args.cache / "ref") as ref:
        trees = {"before": ref, "after": ROOT}
        shas = {"before": git_sha("HEAD", ref), "after": git_sha("HEAD", ROOT)}
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "agentmem", "integrations"],
                               capture_output=True, text=True).stdout.strip()  # the code measured
        for n in names:
            for side, tree in trees.items():
                missing = unaccepted(tree, BENCHES[n])
                if missing:
                    raise SystemExit(f"{BENCHES[n].script} of {side} ({tree}) does not accept {missing}")
        logger.info("before %s (%s), after %s; uptime %s", shas["before"][:9], ref, shas["after"][:9], start)
        for rep in range(args.reps):
            order = ("before", "after") if rep % 2 == 0 else ("after", "before")
            for n in names:
                for side in order:
                    out = logs / f"{n}-{side}-{rep}.json"
                    data, wall = run_one(trees[side], BENCHES[n], out, out.with_suffix(".log"), args.timeout)
                    walls.append({"bench": n, "side": side, "rep": rep, "wall_s": round(wall, 1),
                                  "ok": data is not None})
                    logger.info("rep %d %-7s %-6s %5.0f s%s", rep, n, side, wall, "" if data else " FAILED")
                    if data is not None:
                        runs.add(n, side, PARSERS[n](data))
    end = uptime()
    native = {s: any(t.glob("agentmem/_native*.so")) for s, t in trees.items()}
    table = md_table(["benchmark", "metric", "before", "after", "after/before"], rows(runs))
    failed = [w for w in walls if not w["ok"]]
    report = "\n".join([
        f"`{command}` — before `{shas['before'][:9]}` ({args.ref}), after `{shas['after'][:9]}`"
        + (" (with uncommitted changes to agentmem/ or integrations/)" if dirty else "")
        + f"; {args.reps} repetition(s) per side, interleaved (ABBA), medians; one llama.cpp thread; "
        f"C kernels built: before {native['before']}, after {native['after']}; "
        f"{time.perf_counter() - t_start:.0f} s in all.",
        "",
        f"uptime at start: `{start}`  ",
        f"uptime at end: `{end}`",
        "",
        table,
        "",
        f"time: after/before > {FLAG} marked **!** (rates: < {1 / FLAG:.2f}); check rows list every distinct "
        "value seen over the runs of each side.",
        *([f"FAILED runs: {', '.join('/'.join(str(w[k]) for k in ('bench', 'side', 'rep')) for w in failed)} "
           f"(logs in {logs})"] if failed else []),
    ])
    sys.stdout.write(report + "\n")
    if args.md:
        args.md.write_text(report + "\n")
    if args.json:
        args.json.write_text(json.dumps({
            "command": command, "ref": args.ref, "shas": shas, "uptime_start": start, "uptime_end": end,
            "walls": walls, "metrics": [{"bench": b, "metric": m, "kind": runs.kinds[(b, m)], **v}
                                        for (b, m), v in runs.values.items()]}, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
