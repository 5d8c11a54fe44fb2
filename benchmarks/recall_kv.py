"""Recall as KV (#34): a recalled span's archived cells spliced at a new position vs its text re-prefilled.

A span (facts of ``benchmarks/_recall_set.py``, cut to 64 / 256 / 1024 tokens) is first
computed in an *original* conversation (its own system prompt and opening) and its cells
captured (`agentmem.engine.splice.capture_span`), as eviction would archive them. A *new*
conversation (another prefix — four turns of small talk, of other length) is live; the span
is recalled into it (a user turn "Recalled from earlier: …"), then a question about a fact
of the span ("From the recalled notes: <its paraphrase question>", which shares no word with it) and the assistant header follow. Two ways, timed from the live prefix to the first token's logits:

* ``text`` — the span's tokens and the question prefilled (what recall does without KV);
  its next-token distribution is the reference (a full re-prefill of the conversation);
* ``splice h=H`` — the span's cells loaded, shifted to their new position, the first
  ``H`` tokens recomputed to heal the seam (EPIC), then the question prefilled.

Quality of a splice: KL(reference ‖ splice) of the next-token distribution at the answer's
start, top-1 agreement, whether the first 24 greedy tokens equal the reference's, and whether they
state the fact's answer (``answer``: `benchmarks/recall_answers.py`'s ``ANSWERS``). The row
``no span`` (the question without the span at all) sets the scale of the KL. Timings are the
median of ``--reps``; one thread (``--threads``).

Usage::

    python benchmarks/recall_kv.py [--quick] [--model qwen2.5-coder-0.5b-instruct] [--lengths 64,256,1024]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _recall_set import FACTS, FILLER  # noqa: E402
from _report import load, table  # noqa: E402
from recall_answers import ANSWERS, correct  # noqa: E402

from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel  # noqa: E402
from agentmem.engine.splice import capture_span, splice_span, splice_supported  # noqa: E402
from agentmem.model import resolve_model_path  # noqa: E402

import numpy as np  # noqa: E402  (after llama.cpp: DESIGN.md, "llama.cpp loads first")

ORIG, LIVE, SCRATCH = 0, 1, 2
HEALS = (0, 4, 16)
GREEDY = 24


def chatml(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p ‖ q) in nats of two logit rows."""
    lp = p_logits.astype(np.float64) - np.logaddexp.reduce(p_logits.astype(np.float64))
    lq = q_logits.astype(np.float64) - np.logaddexp.reduce(q_logits.astype(np.float64))
    return float(np.sum(np.exp(lp) * (lp - lq)))


def greedy(ctx: LlamaContext, model: LlamaModel, idx: int, pos: int) -> list[int]:
    """The first `GREEDY` greedy tokens from the logits at batch index `idx` (decoded into LIVE at `pos`...)."""
    out = []
    for _ in range(GREEDY):
        t = int(np.argmax(ctx.logits(idx)))
        out.append(t)
        if model.is_eog(t):
            break
        idx = ctx.decode_run(LIVE, [t], pos)
        pos += 1
    return out


def sample(model: LlamaModel, n: int, i: int) -> tuple[list[int], str]:
    """`n` tokens of facts (from fact `i` on) and the question paraphrasing the first of them."""
    facts = FACTS[i:] + FACTS[:i]
    toks: list[int] = []
    k = 0
    while len(toks) < n:
        toks += model.tokenize(facts[k % len(facts)].text + " ")
        k += 1
    return toks[:n], facts[0].paraphrase


def run_one(ctx: LlamaContext, model: LlamaModel, n: int, i: int, reps: int) -> list[dict[str, float | str]]:
    tok = lambda s: model.tokenize(s, parse_special=True)  # noqa: E731
    span, question = sample(model, n, i)
    said = lambda toks: float(correct(model.detokenize(toks), i))  # noqa: E731
    orig = tok(chatml("system", "You are a note keeper.") + "<|im_start|>user\nMy notes from last week:\n")
    ctx.clear()
    ctx.decode_run(ORIG, orig + span, 0)
    kv = capture_span(ctx, seq=ORIG, p0=len(orig), p1=len(orig) + n, tokens=span, scratch=SCRATCH)
    ctx.seq_rm(ORIG)
    talk = "".join(chatml("user", FILLER[(i + 2 * j) % len(FILLER)])
                   + chatml("assistant", FILLER[(i + 2 * j + 1) % len(FILLER)]) for j in range(4))
    prefix = tok(chatml("system", "You are a helpful assistant. Answer briefly.") + talk
                 + "<|im_start|>user\nRecalled from earlier in our conversation:\n")
    tail = tok(f"<|im_end|>\n{chatml('user', 'From the recalled notes: ' + question)}<|im_start|>assistant\n")
    ctx.decode_run(LIVE, prefix, 0)
    p = len(prefix)

    def text() -> int:
        return ctx.decode_run(LIVE, span + tail, p)

    def spliced(h: int) -> int:
        splice_span(ctx, kv, seq=LIVE, pos0=p, heal=h, scratch=SCRATCH)
        return ctx.decode_run(LIVE, tail, p + n)

    def measure(fn, end: int) -> tuple[float, np.ndarray, list[int]]:  # type: ignore[no-untyped-def]
        times = []
        for r in range(reps):
            t0 = time.perf_counter()
            idx = fn()
            times.append(time.perf_counter() - t0)
            logits = ctx.logits(idx)
            toks = greedy(ctx, model, idx, end) if r == 0 else []
            ctx.seq_rm(LIVE, p, -1)
            if r == 0:
                first, first_toks = logits, toks
        return statistics.median(times), first, first_toks

    t_text, ref, ref_toks = measure(text, p + n + len(tail))
    rows: list[dict[str, float | str]] = [{"way": "text", "ttft": t_text, "kl": 0.0, "top1": 1.0, "greedy": 1.0,
                                           "answer": said(ref_toks)}]
    for h in HEALS:
        t, lg, gt = measure(lambda h=h: spliced(h), p + n + len(tail))
        rows.append({"way": f"splice h={h}", "ttft": t, "kl": kl(ref, lg), "top1": float(lg.argmax() == ref.argmax()),
                     "greedy": float(gt == ref_toks), "answer": said(gt)})
    ctx.seq_rm(LIVE, p, -1)
    t0 = time.perf_counter()
    idx = ctx.decode_run(LIVE, tail, p)  # the recalled turn left empty
    t_none = time.perf_counter() - t0
    lg = ctx.logits(idx)
    gt = greedy(ctx, model, idx, p + len(tail))
    rows.append({"way": "no span", "ttft": t_none, "kl": kl(ref, lg),
                 "top1": float(lg.argmax() == ref.argmax()), "greedy": float(gt == ref_toks),
                 "answer": said(gt)})
    for r in rows:
        r["bytes"] = float(kv.blob.nbytes)
    ctx.clear()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--lengths", default="64,256,1024")
    ap.add_argument("--samples", type=int, default=4, help="spans (questions) per length")
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions of each way (median)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("AGENTMEM_THREADS", "1")))
    ap.add_argument("--quick", action="store_true", help="2 samples, 1 rep")
    args = ap.parse_args(argv)
    samples, reps = (2, 1) if args.quick else (args.samples, args.reps)
    lengths = [int(x) for x in args.lengths.split(",")]
    path = resolve_model_path(args.model)
    print(f"load before: {load()}  model: {path.name}  threads: {args.threads}")
    with LlamaModel(path) as model, LlamaContext(model, ContextParams(
            n_ctx=4 * max(lengths) + 1024, n_seq_max=3, n_threads=args.threads)) as ctx:
        print(f"splice supported: {splice_supported(ctx)} (can_shift={ctx.can_shift})")
        out = []
        for n in lengths:
            per: dict[str, list[dict[str, float | str]]] = {}
            for i in range(samples):
                for r in run_one(ctx, model, n, (i * 7) % len(ANSWERS), reps):
                    per.setdefault(str(r["way"]), []).append(r)
            base = statistics.median(float(r["ttft"]) for r in per["text"])
            for way, rs in per.items():
                ttft = statistics.median(float(r["ttft"]) for r in rs)
                kls = [float(r["kl"]) for r in rs]
                g = [float(r["greedy"]) for r in rs]
                out.append([n, way, f"{1e3 * ttft:.1f}", f"{base / ttft:.2f}x", f"{statistics.mean(kls):.4f}",
                            f"{max(kls):.4f}", f"{statistics.mean(float(r['top1']) for r in rs):.2f}",
                            f"{statistics.mean(g):.2f}",
                            f"{statistics.mean(float(r['answer']) for r in rs):.2f}",
                            f"{float(rs[0]['bytes']) / 2**20:.1f}"])
        print(f"\n== {samples} spans per length, median of {reps} timings\n")
        print(table(["tokens", "way", "TTFT ms", "vs text", "KL mean", "KL max", "top-1", f"greedy {GREEDY}",
                     "answer", "KV MiB"], out))
    print(f"\nload after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
