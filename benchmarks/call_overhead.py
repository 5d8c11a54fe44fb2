"""Per-call host overhead against history length: renders, tokenizations and milliseconds of one call.

A call that adds 2 messages (the model's last reply and a new user message) to a
conversation of 50 / 100 / 200 / 400 messages, on the tiny synthetic model of the test
suite with `max_tokens=1`, so the decode is one token and what is left is host work:
validating, rendering the chat template, tokenizing, finding the line, reconciling
the KV. Two ways of calling:

* **named** — `pool.chat(agent_id, messages)` (the agent's KV is reused);
* **anonymous** — `pool.find_line(messages)` then `chat` as that line's agent (what the
  server does for a request without an agent id).

For each call it counts the chat template's renders (`SandboxedTemplate.render`), the
tokenizer calls (`tokenize` + `tokenize_pieces`) and measures the wall time, and the
host time: the CPU time of the calling thread less the CPU time spent in `llama_decode`
(`LlamaContext._decode`, wrapped), so that other processes on a shared machine do not
inflate it (medians over `--repeat` calls). The sizes are measured in turn, round after
round (after a warm-up round), so a change in the machine's load reaches every size alike;
in each round a size gets two calls and the second is measured (an anonymous call pays
for re-indexing its own line, as in a conversation, not another size's). `msgs` is the
history's length at the start; each round adds 4 messages to it. Two templates: the tiny model's ChatML jinja template (`chatml`) and Qwen2.5's
real template on the tiny `qwen2` model (`qwen2`);
`--templates instruct` runs the bundled Qwen2.5-Coder-0.5B-Instruct instead (its real
tokenizer; its prefill of 400 messages takes minutes on a CPU).

`--ref REF` measures git revision `REF` of this repository in the same run (a
temporary worktree, this same script run against it in a subprocess) and prints both
in one table with ratios (`ref / this tree`).

Usage:
    python benchmarks/call_overhead.py                       # this tree
    python benchmarks/call_overhead.py --ref main            # main and this tree, ratios
    python benchmarks/call_overhead.py --quick --ref main    # 50 and 400 messages only
    python benchmarks/call_overhead.py --json out.json       # figures as JSON

Prints a table; records `uptime` (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks._report import ref_tree  # noqa: E402

logger = logging.getLogger("benchmarks.call_overhead")


def history(n: int, tag: str) -> list[dict[str, str]]:
    """A system prompt and `n - 1` alternating user / assistant messages, ending with a user message."""
    msgs = [{"role": "system", "content": f"You are a helpful agent ({tag}). Answer briefly."}]
    for i in range(1, n):
        role = "user" if i % 2 else "assistant"
        text = f"{tag} turn {i}: the plan for the next step is to read the file and test it"
        msgs.append({"role": role, "content": text})
    if msgs[-1]["role"] != "user":
        msgs.append({"role": "user", "content": f"{tag} turn {n}: what is next"})
    return msgs


class Counters:
    """Counts calls into the template's render and the tokenizer of one pool (wrapped in place)."""

    def __init__(self, pool: Any) -> None:
        self.n: dict[str, int] = {"renders": 0, "tokenize": 0}
        self.decode_cpu = 0.0
        engine = getattr(pool, "engine", None)  # the one pool: its engine holds the context (before #32: the pool)
        pool = engine() if callable(engine) else pool
        decode = pool.ctx._decode

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return decode(*args, **kwargs)
            finally:
                self.decode_cpu += time.thread_time() - t0

        pool.ctx._decode = timed
        fmt = pool.renderer.format
        tpl = getattr(fmt, "_tpl", None)
        if tpl is not None:
            tpl.render = self._counted(tpl.render, "renders")
        model = pool.renderer.model
        for name in ("tokenize", "tokenize_pieces"):
            setattr(model, name, self._counted(getattr(model, name), "tokenize"))

    def _counted(self, f: Callable[..., Any], key: str) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.n[key] += 1
            return f(*args, **kwargs)

        return counted

    def take(self) -> dict[str, float]:
        out: dict[str, float] = {**self.n, "decode_cpu": self.decode_cpu}
        for k in self.n:
            self.n[k] = 0
        self.decode_cpu = 0.0
        return out


def one_call(pool: Any, mode: str, agent: str, msgs: list[dict[str, str]]) -> Any:
    """One call with `max_tokens=1`: as `agent` (named), or as the line `find_line` picks (anonymous)."""
    if mode == "named":
        return pool.chat(agent, msgs, max_tokens=1)
    line = pool.find_line(msgs)
    try:
        return pool.chat(line.agent_id, msgs, max_tokens=1)
    finally:
        pool.release_line(line.agent_id)


def measure(template: str, sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    """Rows `{template, mode, messages, renders, tokenize, wall_ms, host_ms}` (medians over `repeat` calls)."""
    from agentmem import MemoryPool
    from tests.fixtures.tiny_gguf import QWEN2_TEMPLATE, build_tiny_gguf

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if template == "instruct":  # the bundled Qwen2.5-Coder-0.5B-Instruct (slow to prefill on a CPU)
            path = Path("qwen2.5-coder-0.5b-instruct")
        elif template == "qwen2":
            path = build_tiny_gguf(Path(tmp) / "tiny-qwen2.gguf", arch="qwen2", chat_template=QWEN2_TEMPLATE)
        else:
            path = build_tiny_gguf(Path(tmp) / "tiny.gguf")
        # every size's agent stays resident: the sizes are measured in turn, call by call
        pool = MemoryPool(model=str(path), n_ctx=1 << 16, resident_agents=len(sizes) + 1, n_threads=1, n_batch=512)
        try:
            counters = Counters(pool)
            for mode in ("named", "anonymous"):
                runs = {}
                for n in sizes:
                    tag = f"{mode[0]}{n}"
                    full = history(n + 4 * (repeat + 1), tag)
                    first = n - 2 if full[n - 3]["role"] == "user" else n - 1
                    res = one_call(pool, mode, f"bench-{tag}", full[:first])  # the agent's KV and history
                    runs[n] = (res.agent_id, full, first, [])
                for r in range(repeat + 1):  # round 0 warms up
                    for n in sizes:  # each size in turn: a call, then the measured call (it pays for its own
                        agent, full, first, samples = runs[n]  # line index update, not another size's)
                        for step in (1, 2):
                            msgs = full[: first + 2 * (2 * r + step)]
                            counters.take()
                            t0, c0 = time.perf_counter(), time.thread_time()
                            res = one_call(pool, mode, agent, msgs)
                            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
                            c = counters.take()
                            agent = res.agent_id
                        if r:
                            samples.append((c["renders"], c["tokenize"], wall * 1e3, (cpu - c["decode_cpu"]) * 1e3))
                        runs[n] = (agent, full, first, samples)
                for n in sizes:
                    agent, _, _, samples = runs[n]
                    rows.append({
                        "template": template, "mode": mode, "messages": n,
                        "renders": statistics.median(s[0] for s in samples),
                        "tokenize": statistics.median(s[1] for s in samples),
                        "wall_ms": statistics.median(s[2] for s in samples),
                        "host_ms": statistics.median(s[3] for s in samples),
                    })
                    logger.debug("%s", rows[-1])
                    pool.forget(agent)
        finally:
            pool.close()
    return rows


def run_ref(ref: str, argv: list[str]) -> list[dict[str, Any]]:
    """This script's rows on git revision `ref` (a temporary worktree; this script's copy runs there)."""
    with ref_tree(ref) as tree, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ref.json"
        env = {**os.environ, "PYTHONPATH": f"{tree}:{tree / 'integrations'}"}
        cmd = [sys.executable, __file__, "--tree", str(tree), "--json", str(out), *argv]
        subprocess.run(cmd, check=True, env=env)
        return json.loads(out.read_text())["rows"]


def table(rows: list[dict[str, Any]], ref: list[dict[str, Any]] | None, ref_name: str) -> str:
    """The rows as a text table; with `ref`, each figure as `ref → now` and the host-time ratio `ref / now`."""
    before = {(r["template"], r["mode"], r["messages"]): r for r in ref or []}
    cols = ("renders", "tokenize", "host_ms", "wall_ms")
    head = f"{'template':8} {'mode':9} {'msgs':>5} | " + " | ".join(f"{c:>16}" for c in cols)
    head += f" | {'host ' + ref_name + '/now':>14}" if ref else ""
    lines = [head, "-" * len(head)]
    for r in rows:
        b = before.get((r["template"], r["mode"], r["messages"]))
        digits = {"host_ms": 2}
        cells = [f"{b[c]:>7.{digits.get(c, 1)}f} → {r[c]:<6.{digits.get(c, 1)}f}" if b
                 else f"{r[c]:>16.{digits.get(c, 1)}f}" for c in cols]
        ratio = f" | {b['host_ms'] / max(r['host_ms'], 1e-9):>13.2f}x" if b else ""
        lines.append(f"{r['template']:8} {r['mode']:9} {r['messages']:>5} | " + " | ".join(cells) + ratio)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200, 400])
    ap.add_argument("--templates", nargs="+", default=["chatml", "qwen2"], choices=["chatml", "qwen2", "instruct"],
                    help="instruct: the bundled Qwen instruct model (its real tokenizer; minutes of prefill on a CPU)")
    ap.add_argument("--repeat", type=int, default=5, help="calls measured per size (medians)")
    ap.add_argument("--quick", action="store_true", help="50 and 400 messages only")
    ap.add_argument("--ref", help="also measure this git revision (e.g. main) and print ratios")
    ap.add_argument("--json", type=Path, help="write the rows here")
    ap.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)  # the tree whose agentmem is measured
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("agentmem").setLevel(logging.WARNING)
    sys.path.insert(0, str(args.tree))
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))  # tests.fixtures (the tiny model) from this tree when the ref lacks it
    os.environ.setdefault("AGENTMEM_THREADS", "1")
    sizes = [50, 400] if args.quick else args.sizes
    passed = [a for a in (argv if argv is not None else sys.argv[1:])]
    ref_rows = None
    if args.ref:
        rest, skip = [], False
        for a in passed:  # the same options, less --ref/--json
            if skip:
                skip = False
                continue
            if a in ("--ref", "--json"):
                skip = True
                continue
            if a.startswith(("--ref=", "--json=")):
                continue
            rest.append(a)
        ref_rows = run_ref(args.ref, rest)
    rows = [r for t in args.templates for r in measure(t, sizes, args.repeat)]
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "uptime": uptime}, indent=1))
    if args.tree == ROOT or not args.json:
        logger.info("%s", table(rows, ref_rows, args.ref or ""))
        logger.info("uptime: %s", uptime)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
