"""Isolation benchmark: does an agent's next token depend on where its KV cells sit and who else is cached?

For each bundled model (or each `--model`) and each context configuration (KV layout
`unified` / `per_sequence`, flash attention on / off, one thread), every prompt of a
subset of `benchmarks/_fidelity_prompts.py` is run once *alone*: a fresh context, the
prompt minus its last token prefilled into sequence 0, the last token decoded (the
next-token distribution), then `--steps` greedy tokens decoded one at a time. Its
state blob after the prefill is kept. Then the same prompt again under each scenario,
in the same context (cleared between runs), compared with the alone run:

* `restored alone`: the blob restored into the cleared context (same slots as alone);
* `other slots`: another agent's `--filler` tokens decoded first, the prompt after
  them, the other agent removed before the last token (the agent's cells start at
  slot `filler` of a unified cache; in per-sequence streams each stream starts at 0);
* `beside another`: the same with the other agent kept in the cache;
* `restored beside`: the blob restored while the other agent is cached (a park and a
  restore with someone else resident);
* `batched`: beside another, and the other agent decodes in the same batches (two
  rows per step: the pool's `batch_decode`);
* `2 threads`: alone, in a second context with two threads.

Reported per model, configuration and scenario: the share of prompts whose first
next-token logits are bitwise equal to alone's, KL(alone || scenario) of the
next-token distribution (float64 softmax over the whole vocabulary: mean and max),
top-1 agreement, and the share of greedy continuations identical over `--steps`
tokens (a continuation stops at its first differing token). Plus the process CPU
time of each configuration's alone runs (one thread: the work, not the waiting).

Usage:

    python benchmarks/isolation.py                  # both bundled models, 24 prompts, 16 steps
    python benchmarks/isolation.py --quick          # 8 prompts, 8 steps, Gemma only
    python benchmarks/isolation.py --model gemma-3-270m --prompts 40 --steps 32

Prints the tables (and `uptime`'s load at the start and end) and writes
`bench-results/isolation.json`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agentmem  # noqa: E402,F401 - first: llama.cpp's libraries load before numpy (engine/native_first.py)
import numpy as np  # noqa: E402

from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel  # noqa: E402

from benchmarks._fidelity_prompts import build_prompts  # noqa: E402
from benchmarks.fidelity import kl, log_softmax  # noqa: E402
from benchmarks._report import load, md_table  # noqa: E402

SCENARIOS = ["restored alone", "other slots", "beside another", "restored beside", "batched", "2 threads"]
CONFIGS = [("unified", True), ("unified", False), ("per_sequence", True), ("per_sequence", False)]
FILLER_TEXT = (
    "Meeting notes. The billing team moved the retry limit to five, the search team owns the staging "
    "cluster on Mondays, and the export suite has two flaky tests that nobody has fixed yet. Ana reviews "
    "every change to the audit table; releases ship on Thursdays unless the on-call engineer objects. "
) * 4


@dataclass
class Run:
    """One prompt's next-token logits and greedy continuation."""

    logits: np.ndarray
    tokens: list[int] = field(default_factory=list)


def greedy(ctx: LlamaContext, seq: int, first: np.ndarray, pos: int, steps: int, eog: Any,
           stop_at: list[int] | None = None, buddy: tuple[int, int, int] | None = None) -> list[int]:
    """`steps` greedy tokens of `seq` from `first` logits at position `pos` (the first token's position).

    `stop_at`: the reference continuation; stop at the first token that differs (the rest
    is not compared). `buddy` `(seq, token, pos)`: another sequence decoding in the same batches.
    """
    out: list[int] = []
    logits = first
    for _ in range(steps):
        tok = int(np.argmax(logits))
        out.append(tok)
        if eog(tok) or (stop_at is not None and (len(out) > len(stop_at) or stop_at[len(out) - 1] != tok)):
            break
        if len(out) == steps:
            break
        if buddy is None:
            logits = ctx.logits(ctx.decode_run(seq, [tok], pos))
        else:
            bseq, btok, bpos = buddy
            idx = ctx.decode_multi([(seq, [tok], pos), (bseq, [btok], bpos)])
            logits, blog = ctx.logits(idx[0]), ctx.logits(idx[1])
            buddy = (bseq, int(np.argmax(blog)), bpos + 1)
        pos += 1
    return out


def run_prompt(ctx: LlamaContext, ctx2: LlamaContext | None, toks: list[int], filler: tuple[np.ndarray, int, int],
               steps: int, eog: Any, timing: dict[str, float]) -> tuple[Run, dict[str, Run]]:
    """The alone run of `toks` and each scenario's run (see the module docstring).

    `filler` is the other agent: `(state blob, its length, its next token)`, restored
    into sequence 1 where a scenario has it (a restore places cells like a prefill does).
    """
    n = len(toks)
    head, last = toks[:-1], toks[-1:]
    fblob, fn, ftok = filler

    ctx.clear()
    t0 = time.process_time()
    ctx.decode_run(0, head, 0)
    blob = ctx.state_get(0)
    first = ctx.logits(ctx.decode_run(0, last, n - 1))
    alone = Run(first, greedy(ctx, 0, first, n, steps, eog))
    timing["alone_cpu_s"] += time.process_time() - t0
    timing["alone_tokens"] += n + len(alone.tokens)

    out: dict[str, Run] = {}

    def finish(name: str, buddy: tuple[int, int, int] | None = None) -> None:
        if buddy is None:
            lg = ctx.logits(ctx.decode_run(0, last, n - 1))
        else:
            bseq, btok, bpos = buddy
            idx = ctx.decode_multi([(0, last, n - 1), (bseq, [btok], bpos)])
            lg = ctx.logits(idx[0])
            buddy = (bseq, int(np.argmax(ctx.logits(idx[1]))), bpos + 1)
        out[name] = Run(lg, greedy(ctx, 0, lg, n, steps, eog, stop_at=alone.tokens, buddy=buddy))

    def restore(seq: int, b: np.ndarray) -> None:
        if ctx.state_set(seq, b) == 0:
            raise RuntimeError(f"state_set rejected the blob of sequence {seq}")

    ctx.clear()
    restore(0, blob)
    finish("restored alone")

    ctx.clear()
    restore(1, fblob)
    restore(0, blob)
    finish("restored beside")

    # one prefill after the other agent's cells serves three scenarios: the agent's
    # tail (its last prompt token and the continuation) is removed between them
    ctx.clear()
    restore(1, fblob)
    ctx.decode_run(0, head, 0)
    finish("beside another")
    ctx.seq_rm(0, n - 1, -1)
    finish("batched", buddy=(1, ftok, fn))
    ctx.seq_rm(0, n - 1, -1)
    ctx.seq_rm(1)
    finish("other slots")

    if ctx2 is not None:
        ctx2.clear()
        ctx2.decode_run(0, head, 0)
        lg = ctx2.logits(ctx2.decode_run(0, last, n - 1))
        out["2 threads"] = Run(lg, greedy(ctx2, 0, lg, n, steps, eog, stop_at=alone.tokens))
    return alone, out


def configs(spec: str) -> list[tuple[str, bool]]:
    """`--configs` parsed: `[(layout, flash_attn), ...]`."""
    if spec == "all":
        return list(CONFIGS)
    out = []
    for item in spec.split(","):
        layout, _, fa = item.strip().partition("/")
        if layout not in ("unified", "per_sequence") or fa not in ("on", "off"):
            raise SystemExit(f"--configs: {item!r} is not layout/fa (unified|per_sequence)/(on|off)")
        out.append((layout, fa == "on"))
    return out


def agree(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_model(path: Path, args: argparse.Namespace, prompts: list[Any], partial: Path | None = None) -> dict[str, Any]:
    """Every configuration and scenario of one model: `{config: {scenario: stats}, ...}`."""
    results: dict[str, Any] = {"model": path.name, "configs": {}}
    with LlamaModel(path) as model:
        toks = [model.tokenize(p.text, add_special=True) for p in prompts]
        filler = model.tokenize(FILLER_TEXT, add_special=True)[: args.filler]
        for layout, fa in configs(args.configs):
            name = f"{layout}, flash_attn={'on' if fa else 'off'}"
            params = dict(n_ctx=args.n_ctx, n_seq_max=2, n_threads=1, flash_attn=fa, kv_unified=layout == "unified")
            timing = {"alone_cpu_s": 0.0, "alone_tokens": 0}
            per: dict[str, list[dict[str, Any]]] = {s: [] for s in SCENARIOS}
            t_wall = time.perf_counter()
            probe_threads = args.threads_probe > 0 and fa
            with LlamaContext(model, ContextParams(**params)) as ctx, \
                    LlamaContext(model, ContextParams(**{**params, "n_threads": 2 if probe_threads else 1})) as ctx2:
                # the other agent: its cells, and the token it decodes next (in `batched`)
                ctx.decode_run(1, filler[:-1], 0)
                fstate = (ctx.state_get(1), len(filler) - 1, filler[-1])
                for i, t in enumerate(toks):
                    probe = ctx2 if probe_threads and i < args.threads_probe else None
                    alone, runs = run_prompt(ctx, probe, t, fstate, args.steps, model.is_eog, timing)
                    la = log_softmax(alone.logits)
                    for s, r in runs.items():
                        per[s].append({
                            "bitwise": bool(np.array_equal(alone.logits, r.logits)),
                            "kl": kl(la, log_softmax(r.logits)),
                            "max_abs_diff": float(np.abs(alone.logits - r.logits).max()),
                            "top1": int(np.argmax(alone.logits)) == int(np.argmax(r.logits)),
                            "agree": agree(alone.tokens, r.tokens),
                            "identical": r.tokens == alone.tokens,
                        })
            summary = {}
            for s, rows in per.items():
                if not rows:
                    continue
                kls = [r["kl"] for r in rows]
                summary[s] = {
                    "n": len(rows),
                    "bitwise": sum(r["bitwise"] for r in rows) / len(rows),
                    "mean_kl": float(np.mean(kls)), "max_kl": float(np.max(kls)),
                    "top1": sum(r["top1"] for r in rows) / len(rows),
                    "identical": sum(r["identical"] for r in rows) / len(rows),
                    "min_agree": min(r["agree"] for r in rows),
                    "rows": rows,
                }
            results["configs"][name] = {
                "layout": layout, "flash_attn": fa, "scenarios": summary,
                "alone_cpu_ms_per_token": 1e3 * timing["alone_cpu_s"] / max(1, timing["alone_tokens"]),
                "wall_s": time.perf_counter() - t_wall,
            }
            logging.info("%s %s: %.0f s", path.name, name, results["configs"][name]["wall_s"])
            if partial is not None:  # a long run's finished configurations survive an interruption
                partial.write_text(json.dumps(results, indent=1))
    return results


def fmt(res: dict[str, Any], steps: int) -> str:
    rows = []
    for cname, c in res["configs"].items():
        for s, st in c["scenarios"].items():
            rows.append([cname, s, f"{100 * st['bitwise']:.0f}%", f"{st['mean_kl']:.2e}", f"{st['max_kl']:.2e}",
                         f"{100 * st['top1']:.0f}%", f"{100 * st['identical']:.0f}%", st["min_agree"]])
    head = ["config", "scenario", "logits bitwise", "mean KL", "max KL", "top-1", f"identical {steps} tok",
            "min equal prefix"]
    cpu = [[cname, f"{c['alone_cpu_ms_per_token']:.1f} ms", f"{c['wall_s']:.0f} s"]
           for cname, c in res["configs"].items()]
    return (md_table(head, rows) + "\n\n" + md_table(["config", "CPU per token (alone, prefill+decode)", "wall"], cpu))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append",
                    help="bundled model name or GGUF path (repeatable; default: both bundled)")
    ap.add_argument("--prompts", type=int, default=24, help="prompts, spread over the categories (max 60)")
    ap.add_argument("--steps", type=int, default=16, help="greedy tokens compared per prompt")
    ap.add_argument("--filler", type=int, default=98,
                    help="the other agent's tokens (97 cells + one it decodes next: off any tile boundary)")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads-probe", type=int, default=4,
                    help="prompts of the `2 threads` scenario (flash attention on only; 0 = skip it: "
                         "2 threads on a loaded machine is slow)")
    ap.add_argument("--configs", default="all",
                    help="`all`, or comma-separated `layout/fa` e.g. `unified/on,per_sequence/on`")
    ap.add_argument("--quick", action="store_true", help="8 prompts, 8 steps, Gemma only")
    ap.add_argument("--out", default="bench-results/isolation.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.steps = 8, 8
        args.model = args.model or ["gemma-3-270m"]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("agentmem").setLevel(logging.WARNING)

    from agentmem.model import BUNDLED_MODELS, resolve_model_path

    names = args.model or list(BUNDLED_MODELS)
    prompts = build_prompts()
    spread = np.linspace(0, len(prompts) - 1, min(args.prompts, len(prompts))).round().astype(int)
    prompts = [prompts[i] for i in spread]  # spread over the categories
    start = {"load": load(), "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    print(f"start {start['time']}  load {start['load']}")
    out = {"start": start, "args": vars(args), "models": []}
    p = Path(args.out)
    p.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        res = run_model(Path(resolve_model_path(name)), args, prompts, partial=p.with_suffix(".partial.json"))
        out["models"].append(res)
        print(f"\n## {res['model']} ({len(prompts)} prompts, {args.steps} greedy tokens, "
              f"filler {args.filler} tokens)\n")
        print(fmt(res, args.steps))
    out["end"] = {"load": load(), "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    print(f"\nend {out['end']['time']}  load {out['end']['load']}")
    p.write_text(json.dumps(out, indent=1))
    print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
