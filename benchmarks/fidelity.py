"""Fidelity benchmark: how close a restored (quantized) KV state stays to a never-parked one.

Main section, on the default model (Gemma 3 270M Q4_K_M) or each `--model` in turn
(f16 KV, flash attention, `swa_full`, one unified cache), through the low-level
API for exactness:

* for each of 60 prompts of varied text (code, prose, chat dialogue, lists,
  numbers, multilingual, structured data, 27-457 tokens on Gemma; built in
  `benchmarks/_fidelity_prompts.py`),
  prefill the prompt minus its last token into sequence 0 (the *never-parked*
  reference) and take its state blob; push the blob through
  `encode_state` -> `decode_state` with every codec variant and restore each
  into its own sequence (a state blob holds no logits, so every sequence then
  decodes the prompt's last token, all in one batch, so all see the same
  arithmetic);
* next-token distribution at the restore point: KL(reference || variant) over the
  full vocabulary (Gemma 3: 262,144 tokens, Qwen2.5: 151,936; float64 softmax), mean / median / p99 / max
  over prompts, and top-1 agreement;
* 64-token greedy continuations, generated in lockstep (reference and variants in
  one batch per step): the share that are identical to the reference, and the
  mean length of the identical prefix (a variant leaves the batch at its first
  differing token; a reference that ends its turn early ends the comparison);
* perplexity of held-out text continued from a round-tripped cache: prefill a
  1,024-token prefix, round-trip it, then score the next 256 tokens by teacher
  forcing (all variants, plus mean KL and top-1 agreement per scored position).

Variants: `f16` (its round trip is byte-identical: the exactness check),
`q8_0`, `q4_0`, `q8_0/q4_0` (keys/values), the 4-bit ones also with Hadamard
rotation (`+rot`); `--variants` adds `q8_0+rot`. A *control* sequence holds
the same prompt decoded again in 32-token calls, never parked: the same model at
the same precision, only the order of floating-point operations changed. It shows
how far the model moves under perturbations that have nothing to do with
quantization (the noise floor the targets have to be read against).

`--live` adds a section on running the context itself with a quantized KV cache
(`type_k`/`type_v` q8_0, flash attention on) against f16 live + quantized
parking: KV bytes per token (state blob size), prefill and decode speed, restore
time, and fidelity against the f16 live context (same prompts, same held-out text).

Targets (issue 3): q8_0 mean KL <= 0.005 and >= 90 % identical 64-token
continuations; best 4-bit variant mean KL <= 0.05.

Usage:

    python benchmarks/fidelity.py --live          # full run: ~15 min + ~4 min live on 2 loaded cores
    python benchmarks/fidelity.py --quick         # smoke run: 8 prompts, 16 steps, short texts
    python benchmarks/fidelity.py --threads 1 --prompts 24 --model A.gguf --model B.gguf
                                                  # several models in one sitting, a table of both at the end

`--threads 0` (the default) times 1 and 2 threads on a short decode first and
uses the faster (on a loaded machine 1 thread wins: ggml's threads spin at
barriers); a given `--threads` skips the probe. Prints tables and writes `bench-results/fidelity.json` (with several models,
`fidelity-<model stem>.json` each).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama_cpp as _ll  # noqa: E402 - first: its libraries before numpy (agentmem/engine/native_first.py)
import numpy as np  # noqa: E402

from agentmem import codec as C  # noqa: E402
from agentmem.codec import CodecSpec, decode_state, encoded_info  # noqa: E402
from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel, TokenBatch, llama_build_info  # noqa: E402

from benchmarks._report import add_gpu_layers, gpu_layers  # noqa: E402
from benchmarks._fidelity_prompts import Prompt, build_prompts, heldout_texts  # noqa: E402

logger = logging.getLogger("benchmarks.fidelity")

#: codec variants of the default run; `--variants` may add `q8_0+rot` (rotation is meant for
#: 4-bit blocks; on q8_0 it measured no better, see docs/fidelity.md) or drop some
ALL_VARIANTS = ["f16", "q8_0", "q8_0+rot", "q4_0", "q4_0+rot", "q8_0/q4_0", "q8_0/q4_0+rot"]
VARIANTS = ["f16", "q8_0", "q4_0", "q4_0+rot", "q8_0/q4_0", "q8_0/q4_0+rot"]
FOUR_BIT = ["q4_0", "q4_0+rot", "q8_0/q4_0", "q8_0/q4_0+rot"]
#: the noise-floor control: no parking, the prompt re-decoded in chunks of this many tokens
CONTROL_CHUNK = 32
CONTROL = f"control: f16 re-prefill in {CONTROL_CHUNK}-token chunks"
TARGETS = {"q8_0_mean_kl": 0.005, "q8_0_identical": 0.90, "best_4bit_mean_kl": 0.05}


# ----------------------------------------------------------------------------- arithmetic
def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max()
    x -= np.log(np.exp(x).sum())
    return x


def kl(lp_ref: np.ndarray, lp: np.ndarray) -> float:
    """KL(ref || variant) in nats from two log-probability vectors."""
    return float(max(0.0, np.sum(np.exp(lp_ref) * (lp_ref - lp))))


def pct(x: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(x, dtype=np.float64), q)) if len(x) else float("nan")


def teacher_force(
    ctx: LlamaContext, seq: int, tokens: Sequence[int], pos0: int, chunk: int = 64
) -> Iterator[np.ndarray]:
    """Decode `tokens` into `seq` at `pos0...` with logits for every token; yield them in order.

    (`LlamaContext.decode_run` keeps only the last token's logits.) Chunks of
    `chunk` tokens bound llama.cpp's output buffer (chunk x n_vocab floats).
    """
    b = TokenBatch(chunk)
    for start in range(0, len(tokens), chunk):
        part = tokens[start : start + chunk]
        with ctx.lock:
            b.clear()
            b.add_run(part, pos0 + start, seq, logits_last=False)
            b.logits[: len(part)] = 1
            rc = _ll.llama_decode(ctx.ptr, b.finish())
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            rows = [ctx.logits(i) for i in range(len(part))]
        yield from rows


def restore(ctx: LlamaContext, seq: int, blob: np.ndarray, n_cells: int) -> None:
    n = ctx.state_set(seq, blob)
    assert n > 0, f"state_set(seq={seq}) rejected the blob"
    assert ctx.seq_pos_max(seq) == n_cells - 1, f"{ctx.seq_pos_max(seq)=}, {n_cells=}"


def round_trip(blob: np.ndarray, spec: str) -> tuple[np.ndarray, int]:
    """(decoded blob, encoded bytes) of `blob` through codec `spec`."""
    enc = CodecSpec.parse(spec).encode(blob)
    return decode_state(enc), encoded_info(enc).n_bytes


# ----------------------------------------------------------------------------- main section
def prefill_chunked(ctx: LlamaContext, seq: int, tokens: Sequence[int], chunk: int) -> None:
    """Decode `tokens` into `seq` in `chunk`-token calls (as turns of a conversation arrive)."""
    for start in range(0, len(tokens), chunk):
        ctx.decode_run(seq, tokens[start : start + chunk], start)


def run_prompts(ctx: LlamaContext, prompts: list[tuple[Prompt, list[int]]], steps: int) -> list[dict[str, Any]]:
    """KL / top-1 at the restore point and lockstep greedy continuations, per prompt.

    Sequence 0 is the never-parked reference (prompt minus its last token decoded
    in one call); sequences 1..7 hold its state after a round trip through each
    codec variant; the last sequence is the *noise-floor control*: the same tokens
    decoded again without any parking, in `CONTROL_CHUNK`-token calls, i.e. the
    same model at the same precision with only the order of floating-point
    operations changed.
    """
    model = ctx.model
    names = [*VARIANTS, CONTROL]
    results = []
    for k, (p, toks) in enumerate(prompts):
        t0 = time.perf_counter()
        n = len(toks)
        ctx.clear()
        ctx.decode_run(0, toks[:-1], 0)
        blob = ctx.state_get(0)
        sizes = {}
        for i, spec in enumerate(VARIANTS, 1):
            dec, sizes[spec] = round_trip(blob, spec)
            if spec == "f16":
                assert dec.tobytes() == blob.tobytes(), "the f16 round trip must be byte-identical"
            restore(ctx, i, dec, n - 1)
        prefill_chunked(ctx, len(names), toks[:-1], CONTROL_CHUNK)
        seqs = list(range(len(names) + 1))
        idx = ctx.decode_multi([(s, [toks[-1]], n - 1) for s in seqs])
        lps = [log_softmax(ctx.logits(i)) for i in idx]
        ref_tok = int(np.argmax(lps[0]))
        kl0 = {name: kl(lps[0], lps[i]) for i, name in enumerate(names, 1)}
        top1 = {name: int(np.argmax(lps[i])) == ref_tok for i, name in enumerate(names, 1)}
        # lockstep greedy continuation: a sequence stays in the batch while its token equals the reference's
        alive = {i for i, name in enumerate(names, 1) if top1[name]}
        same = {name: int(top1[name]) for name in names}
        cont = [ref_tok]
        pos = n
        while len(cont) < steps and not model.is_eog(cont[-1]):
            run_seqs = [0, *sorted(alive)]
            idx = ctx.decode_multi([(s, [cont[-1]], pos) for s in run_seqs])
            nxt = int(np.argmax(ctx.logits(idx[0])))
            for s, bi in zip(run_seqs[1:], idx[1:]):
                if int(np.argmax(ctx.logits(bi))) == nxt:
                    same[names[s - 1]] += 1
                else:
                    alive.discard(s)
            cont.append(nxt)
            pos += 1
        n_cont = len(cont)
        results.append({
            "name": p.name, "category": p.category, "n_tokens": n, "blob_bytes": int(blob.nbytes),
            "encoded_bytes": sizes, "kl": kl0, "top1": top1, "n_cont": n_cont,
            "identical_prefix": same, "identical": {name: same[name] >= n_cont for name in names},
            "ref_continuation": cont, "seconds": round(time.perf_counter() - t0, 2),
        })
        r = results[-1]
        logger.info("[%d/%d] %-18s %4d tok  KL q8_0 %.5f q4_0 %.4f ctl %.5f | "
                    "same tokens q8_0 %d q4_0 %d ctl %d of %d  %.1fs", k + 1, len(prompts), p.name, n,
                    kl0["q8_0"], kl0["q4_0"], kl0[CONTROL], same["q8_0"], same["q4_0"], same[CONTROL], n_cont,
                    r["seconds"])
    return results


HORIZONS = (1, 8, 16, 32, 64)


def summarize(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    longest = max(r["n_cont"] for r in results)
    horizons = [h for h in HORIZONS if h < longest] + [longest]
    out = {}
    for name in [*VARIANTS, CONTROL]:
        kls = [r["kl"][name] for r in results]
        ratio = [r["encoded_bytes"][name] / r["encoded_bytes"]["f16"] for r in results] if name in VARIANTS else [1.0]
        out[name] = {
            "mean_kl": float(np.mean(kls)), "median_kl": pct(kls, 50), "p99_kl": pct(kls, 99),
            "max_kl": float(np.max(kls)),
            "top1": float(np.mean([r["top1"][name] for r in results])),
            "identical": float(np.mean([r["identical"][name] for r in results])),
            "mean_identical_prefix": float(np.mean([r["identical_prefix"][name] for r in results])),
            "bytes_ratio": float(np.mean(ratio)),
            # share of continuations still identical after h tokens (h capped at the reference's length)
            "identical_at": {h: float(np.mean([r["identical_prefix"][name] >= min(h, r["n_cont"]) for r in results]))
                             for h in horizons},
        }
    return out


def by_category(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Mean KL and identical-continuation share per prompt category."""
    out: dict[str, dict[str, Any]] = {}
    for c in sorted({r["category"] for r in results}):
        rs = [r for r in results if r["category"] == c]
        out[c] = {"n": len(rs), **{name: {"mean_kl": float(np.mean([r["kl"][name] for r in rs])),
                                          "identical": float(np.mean([r["identical"][name] for r in rs]))}
                                   for name in [*VARIANTS, CONTROL]}}
    return out


def run_perplexity(ctx: LlamaContext, texts: dict[str, list[int]], prefix: int, n_score: int) -> dict[str, Any]:
    """Prefill `prefix` tokens, round-trip, then score `n_score` held-out tokens by teacher forcing.

    Each variant is restored into an emptied context, so its cells land where the
    reference's were. With a prefix longer than the sliding window (Gemma 3: 512)
    they still differ: a blob carries only the window's cells of the SWA layers,
    which a restore packs at the start of the cache, and llama.cpp's batched CPU
    attention depends on where cells sit. The `f16` row (a byte-identical state)
    therefore shows that layout effect alone, and every variant is compared both
    with the never-parked context and with the f16-restored one (quantization alone).
    """
    out: dict[str, Any] = {}
    for name, toks in texts.items():
        t0 = time.perf_counter()
        assert len(toks) >= prefix + n_score, f"{name}: {len(toks)} tokens < {prefix + n_score}"
        inputs = toks[prefix - 1 : prefix - 1 + n_score]  # the token at prefix-1 predicts toks[prefix], ...
        targets = toks[prefix : prefix + n_score]
        ctx.clear()
        ctx.decode_run(0, toks[: prefix - 1], 0)
        blob = ctx.state_get(0)
        ref_logits = list(teacher_force(ctx, 0, inputs, prefix - 1))  # float32 rows, 1 MB each
        nll_ref = [-float(log_softmax(x)[t]) for x, t in zip(ref_logits, targets)]
        row: dict[str, Any] = {"prefix_tokens": prefix, "scored_tokens": n_score,
                               "ppl_ref": float(np.exp(np.mean(nll_ref))), "variants": {}}
        f16_logits: list[np.ndarray] = []
        for spec in VARIANTS:  # f16 first
            ctx.clear()
            restore(ctx, 0, round_trip(blob, spec)[0], prefix - 1)
            nll, kls, kls16, agree = [], [], [], []
            for j, logits in enumerate(teacher_force(ctx, 0, inputs, prefix - 1)):
                if spec == "f16":
                    f16_logits.append(logits)
                lp, lp_ref = log_softmax(logits), log_softmax(ref_logits[j])
                nll.append(-float(lp[targets[j]]))
                kls.append(kl(lp_ref, lp))
                kls16.append(kl(log_softmax(f16_logits[j]), lp) if spec != "f16" else 0.0)
                agree.append(int(np.argmax(lp)) == int(np.argmax(lp_ref)))
            ppl = float(np.exp(np.mean(nll)))
            row["variants"][spec] = {"ppl": ppl, "delta_pct": 100 * (ppl / row["ppl_ref"] - 1),
                                     "mean_kl": float(np.mean(kls)), "p99_kl": pct(kls, 99),
                                     "top1": float(np.mean(agree)), "mean_kl_vs_f16_restored": float(np.mean(kls16))}
        row["seconds"] = round(time.perf_counter() - t0, 1)
        out[name] = row
        logger.info("perplexity %s: ref %.3f  q8_0 %+.3f%%  q4_0 %+.3f%%  (%.0fs)", name, row["ppl_ref"],
                    row["variants"]["q8_0"]["delta_pct"], row["variants"]["q4_0"]["delta_pct"], row["seconds"])
    return out


# ----------------------------------------------------------------------------- live quantized cache
LIVE_TYPES = {"f16": ("f16", "f16"), "q8_0": ("q8_0", "q8_0"), "q8_0/q4_0": ("q8_0", "q4_0"), "q4_0": ("q4_0", "q4_0")}


SPEED_ROUNDS = 4


def best_time(fn: Any, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run_live(model: LlamaModel, kinds: list[str], prompts: list[tuple[Prompt, list[int]]],
             ref_conts: dict[str, list[int]] | None, text: list[int], prefix: int, n_score: int,
             threads: int, steps: int) -> dict[str, Any]:
    """Live quantized KV cache against f16 live (+ quantized parking): memory, speed, fidelity."""
    kinds = ["f16", *[k for k in kinds if k != "f16"]]
    n_ctx = max(4096, 2 * (prefix + n_score + 64))
    ctxs = {k: LlamaContext(model, ContextParams(n_ctx=n_ctx, n_seq_max=2, n_threads=threads, flash_attn=True,
                                                 type_k=LIVE_TYPES[k][0], type_v=LIVE_TYPES[k][1]))
            for k in kinds}
    out: dict[str, Any] = {"kinds": {k: {"type_k": LIVE_TYPES[k][0], "type_v": LIVE_TYPES[k][1]} for k in kinds}}
    try:
        # --- speed: rounds alternate between the contexts (same load for each); best round counts.
        # Prefill: the whole prefix from an empty cache; decode: greedy single-token steps after it.
        pre = text[:prefix]
        speed: dict[str, dict[str, list[float]]] = {k: {"prefill": [], "decode": []} for k in kinds}
        for _ in range(SPEED_ROUNDS):
            for k, ctx in ctxs.items():
                ctx.clear()
                t0 = time.perf_counter()
                ctx.decode_run(0, pre, 0)
                speed[k]["prefill"].append(prefix / (time.perf_counter() - t0))
                tok, pos, step_s = pre[-1], prefix, []
                for _ in range(8):
                    t0 = time.perf_counter()
                    tok = int(np.argmax(ctx.logits(ctx.decode_run(0, [tok], pos))))
                    step_s.append(time.perf_counter() - t0)
                    pos += 1
                speed[k]["decode"].append(1 / float(np.median(step_s)))
        # --- memory and restore time of the prefix's state
        for k, ctx in ctxs.items():
            row = out["kinds"][k]
            row["prefill_tok_s"] = max(speed[k]["prefill"])
            row["decode_tok_s"] = max(speed[k]["decode"])
            row["speed_rounds"] = speed[k]
            ctx.clear()
            ctx.decode_run(0, pre, 0)
            blob = ctx.state_get(0)
            row["state_bytes"] = int(blob.nbytes)
            row["bytes_per_token"] = blob.nbytes / prefix
            row["restore_ms"] = 1e3 * best_time(lambda ctx=ctx, blob=blob: restore(ctx, 1, blob, prefix), 20)
            if k == "f16":  # f16 live + quantized parking: restore = decode_state + state_set
                for spec in ("q8_0", "q8_0/q4_0", "q4_0"):
                    enc = CodecSpec.parse(spec).encode(blob)
                    scratch = np.empty(blob.nbytes, np.uint8)

                    def park_restore(
                        enc: np.ndarray = enc, scratch: np.ndarray = scratch, ctx: LlamaContext = ctx
                    ) -> None:
                        restore(ctx, 1, decode_state(enc, out=scratch), prefix)

                    row[f"park_{spec}"] = {"bytes_per_token": encoded_info(enc).n_bytes / prefix,
                                           "restore_ms": 1e3 * best_time(park_restore, 20)}
            ctx.seq_rm(1)
            logger.info("live %s: %.0f B/token, prefill %.0f tok/s, decode %.1f tok/s, restore %.2f ms", k,
                        row["bytes_per_token"], row["prefill_tok_s"], row["decode_tok_s"], row["restore_ms"])

        # --- fidelity on the prompts: next-token KL vs f16 live, teacher-forced continuations
        fid: dict[str, dict[str, list[Any]]] = {k: {"kl": [], "top1": [], "identical": [], "prefix": [], "self": []}
                                                for k in kinds}
        for p, toks in prompts:
            n = len(toks)
            lp0: dict[str, np.ndarray] = {}
            for k, ctx in ctxs.items():
                ctx.clear()
                ctx.decode_run(0, toks[:-1], 0)
                lp0[k] = log_softmax(ctx.logits(ctx.decode_run(0, [toks[-1]], n - 1)))
            cont = (ref_conts or {}).get(p.name)
            if cont is None:  # no main section: greedy continuation in the f16 live context
                ctx, cont, pos = ctxs["f16"], [int(np.argmax(lp0["f16"]))], n
                while len(cont) < steps and not model.is_eog(cont[-1]):
                    cont.append(int(np.argmax(ctx.logits(ctx.decode_run(0, [cont[-1]], pos)))))
                    pos += 1
                ctx.seq_rm(0, n, -1)
            # continuation: teacher-force the f16 greedy continuation in every context (same
            # arithmetic in each) and compare the greedy choice at every step with the f16 context's
            choices: dict[str, list[int]] = {}
            for k, ctx in ctxs.items():
                choices[k] = [int(np.argmax(lp0[k]))] + [int(np.argmax(x)) for x in teacher_force(ctx, 0, cont[:-1], n)]
            for k in kinds:
                fid[k]["kl"].append(kl(lp0["f16"], lp0[k]))
                fid[k]["top1"].append(choices[k][0] == choices["f16"][0])
                same = next((j for j, (a, b) in enumerate(zip(choices[k], choices["f16"])) if a != b), len(cont))
                fid[k]["prefix"].append(same)
                fid[k]["identical"].append(same >= len(cont))
            # how often the f16 context's teacher-forced choices reproduce the lockstep-generated
            # continuation: the arithmetic noise between two batch layouts of the same f16 cache
            fid["f16"]["self"].append(choices["f16"] == cont)
        for k in kinds:
            f = fid[k]
            out["kinds"][k].update({
                "mean_kl": float(np.mean(f["kl"])), "median_kl": pct(f["kl"], 50), "p99_kl": pct(f["kl"], 99),
                "max_kl": float(np.max(f["kl"])), "top1": float(np.mean(f["top1"])),
                "identical": float(np.mean(f["identical"])), "mean_identical_prefix": float(np.mean(f["prefix"])),
            })
        out["f16_teacher_forced_reproduces_lockstep"] = float(np.mean(fid["f16"]["self"]))

        # --- perplexity of the held-out continuation, live cache types side by side
        inputs, targets = text[prefix - 1 : prefix - 1 + n_score], text[prefix : prefix + n_score]
        ref_logits: list[np.ndarray] = []
        for k, ctx in ctxs.items():  # f16 first
            ctx.clear()
            ctx.decode_run(0, text[: prefix - 1], 0)
            nll, kls = [], []
            for j, x in enumerate(teacher_force(ctx, 0, inputs, prefix - 1)):
                if k == "f16":
                    ref_logits.append(x)
                lp = log_softmax(x)
                nll.append(-float(lp[targets[j]]))
                kls.append(kl(log_softmax(ref_logits[j]), lp))
            ppl = float(np.exp(np.mean(nll)))
            out["kinds"][k]["ppl"] = ppl
            out["kinds"][k]["ppl_delta_pct"] = 100 * (ppl / out["kinds"]["f16"]["ppl"] - 1)
            out["kinds"][k]["ppl_mean_kl"] = float(np.mean(kls))
    finally:
        for ctx in ctxs.values():
            ctx.close()
    return out


# ----------------------------------------------------------------------------- threads
def probe_threads(model: LlamaModel, tokens: list[int]) -> dict[int, dict[str, float]]:
    """Prefill and single-token decode speed with 1 and 2 threads (a loaded machine favours 1)."""
    out = {}
    for th in (1, 2):
        with LlamaContext(model, ContextParams(n_ctx=1024, n_seq_max=1, n_threads=th)) as ctx:
            ctx.decode_run(0, tokens[:16], 0)  # warm up
            ctx.clear()
            t0 = time.perf_counter()
            ctx.decode_run(0, tokens[:128], 0)
            pf = time.perf_counter() - t0
            steps = []
            for j in range(8):
                t0 = time.perf_counter()
                ctx.decode_run(0, [tokens[128 + j]], 128 + j)
                steps.append(time.perf_counter() - t0)
        out[th] = {"prefill_tok_s": 128 / pf, "decode_ms": 1e3 * float(np.median(steps)),
                   "probe_s": pf + sum(steps)}
    return out


# ----------------------------------------------------------------------------- report
def fmt_table(summary: dict[str, dict[str, float]], ppl: dict[str, Any]) -> str:
    names = list(ppl)
    head = ("| variant | bytes x f16 | mean KL | median KL | p99 KL | max KL | top-1 | identical 64-tok | "
            "mean identical prefix | " + " | ".join(f"ppl {n} (Δ%)" for n in names) + " |")
    lines = [head, "|" + "---|" * (9 + len(names))]
    lines[1] = "|---|" + "---:|" * (8 + len(names))
    for spec, s in summary.items():
        cells = [f"{spec}", f"{s['bytes_ratio']:.3f}" if spec in VARIANTS else "1 (not parked)",
                 f"{s['mean_kl']:.5f}", f"{s['median_kl']:.5f}",
                 f"{s['p99_kl']:.4f}", f"{s['max_kl']:.4f}", f"{100 * s['top1']:.1f}%", f"{100 * s['identical']:.1f}%",
                 f"{s['mean_identical_prefix']:.1f}"]
        for n in names:
            v = ppl[n]["variants"].get(spec)
            cells.append(f"{v['ppl']:.3f} ({v['delta_pct']:+.2f}%)" if v else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt_horizons(summary: dict[str, dict[str, Any]]) -> str:
    hs = list(next(iter(summary.values()))["identical_at"])
    lines = ["| variant | " + " | ".join(f"{h} tok" for h in hs) + " |", "|---|" + "---:|" * len(hs)]
    for name, s in summary.items():
        lines.append(f"| {name} | " + " | ".join(f"{100 * s['identical_at'][h]:.0f}%" for h in hs) + " |")
    return "\n".join(lines)


def fmt_ppl(ppl: dict[str, Any]) -> str:
    lines = ["| text | variant | ppl | Δ ppl | mean KL per token | p99 KL | top-1 | mean KL vs f16-restored |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, row in ppl.items():
        lines.append(f"| {name} | never parked | {row['ppl_ref']:.3f} | | | | | |")
        for spec, v in row["variants"].items():
            lines.append(f"| {name} | {spec} | {v['ppl']:.3f} | {v['delta_pct']:+.2f}% | {v['mean_kl']:.5f} | "
                         f"{v['p99_kl']:.4f} | {100 * v['top1']:.1f}% | {v['mean_kl_vs_f16_restored']:.5f} |")
    return "\n".join(lines)


def fmt_categories(cats: dict[str, dict[str, Any]]) -> str:
    names = [*VARIANTS, "control"]
    lines = ["| category (prompts) | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for c, row in cats.items():
        cells = [f"{row[s]['mean_kl']:.4f} / {100 * row[s]['identical']:.0f}%" for s in [*VARIANTS, CONTROL]]
        lines.append(f"| {c} ({row['n']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt_live(live: dict[str, Any], steps: int = 64) -> str:
    lines = ["| live KV (type_k/type_v) | bytes/token | x f16 | prefill tok/s | decode tok/s | restore ms | "
             f"mean KL vs f16 | p99 KL | top-1 | same {steps} greedy choices | ppl Δ |",
             "|---|" + "---:|" * 10]
    kinds = live["kinds"]
    f16b = kinds["f16"]["bytes_per_token"]
    for k, r in kinds.items():
        lines.append(
            f"| {r['type_k']}/{r['type_v']} | {r['bytes_per_token']:.0f} | {r['bytes_per_token'] / f16b:.3f} | "
            f"{r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f} | {r['restore_ms']:.2f} | {r['mean_kl']:.5f} | "
            f"{r['p99_kl']:.4f} | {100 * r['top1']:.1f}% | {100 * r['identical']:.1f}% | {r['ppl_delta_pct']:+.2f}% |")
    for spec in ("q8_0", "q8_0/q4_0", "q4_0"):
        p = kinds["f16"].get(f"park_{spec}")
        if p:
            lines.append(f"| f16 live, parked {spec} | {p['bytes_per_token']:.0f} (parked) | "
                         f"{p['bytes_per_token'] / f16b:.3f} | (f16) | (f16) | {p['restore_ms']:.2f} | "
                         "see main table | | | | |")
    return "\n".join(lines)


def check_targets(summary: dict[str, dict[str, float]]) -> dict[str, Any]:
    best4 = min((s for s in FOUR_BIT if s in summary), key=lambda s: summary[s]["mean_kl"])
    rows = {
        "q8_0_mean_kl": (summary["q8_0"]["mean_kl"], TARGETS["q8_0_mean_kl"], "<="),
        "q8_0_identical": (summary["q8_0"]["identical"], TARGETS["q8_0_identical"], ">="),
        "best_4bit_mean_kl": (summary[best4]["mean_kl"], TARGETS["best_4bit_mean_kl"], "<="),
    }
    out: dict[str, Any] = {"best_4bit": best4}
    for k, (v, t, op) in rows.items():
        out[k] = {"measured": v, "target": t, "op": op, "met": v <= t if op == "<=" else v >= t}
    return out


def fmt_models(runs: list[dict[str, Any]]) -> str:
    """One row per model and variant, from runs of the same sitting (ratios compare inside it)."""
    names = list(runs[0]["perplexity"]) if runs and "perplexity" in runs[0] else []
    lines = ["| model | variant | mean KL | median KL | p99 KL | top-1 | identical 64-tok | mean identical prefix | "
             + " | ".join(f"ppl Δ {n}" for n in names) + " |", "|---|---|" + "---:|" * (6 + len(names))]
    for run in runs:
        if "summary" not in run:
            continue
        for spec, s in run["summary"].items():
            cells = [run["meta"]["model"], spec, f"{s['mean_kl']:.5f}", f"{s['median_kl']:.5f}", f"{s['p99_kl']:.4f}",
                     f"{100 * s['top1']:.1f}%", f"{100 * s['identical']:.1f}%", f"{s['mean_identical_prefix']:.1f}"]
            for n in names:
                v = run["perplexity"][n]["variants"].get(spec)
                cells.append(f"{v['delta_pct']:+.2f}%" if v else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_model(path: Path, args: argparse.Namespace, all_prompts: list[Prompt], command: str) -> dict[str, Any]:
    """Every section `args` asks for on one model; prints its tables and returns its results."""
    t_start = time.perf_counter()
    meta: dict[str, Any] = {
        "model": path.name, "llama_cpp": llama_build_info(), "python": platform.python_version(),
        "numpy": np.__version__, "kernels": "native" if "native" in C.KERNELS else "numpy",
        "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(), "command": command,
        "n_prompts": len(all_prompts), "steps": args.steps, "variants": VARIANTS,
        "kv": "f16 K/V, flash attention, swa_full, unified cache",
    }
    result: dict[str, Any] = {"meta": meta}
    with LlamaModel(path, n_gpu_layers=gpu_layers()) as model:
        meta["n_vocab"] = int(model.n_vocab)
        prompts = [(p, model.tokenize(p.text, add_special=True)) for p in all_prompts]
        meta["prompt_tokens"] = {"min": min(len(t) for _, t in prompts), "max": max(len(t) for _, t in prompts),
                                 "mean": float(np.mean([len(t) for _, t in prompts]))}
        texts = {k: model.tokenize(v, add_special=True) for k, v in heldout_texts().items()}
        probe = probe_threads(model, texts["stdlib_docs"]) if not args.threads else {}
        meta["thread_probe"] = probe
        threads = args.threads or min(probe, key=lambda th: probe[th]["probe_s"])
        meta["threads"] = threads
        logger.info("model %s, %d prompts (%d-%d tokens), threads=%d (probe: %s)", path.name, len(prompts),
                    meta["prompt_tokens"]["min"], meta["prompt_tokens"]["max"], threads,
                    {k: {m: round(x, 1) for m, x in v.items()} for k, v in probe.items()} or "skipped")
        ref_conts = None
        if not args.live_only:
            max_len = max(max(len(t) for _, t in prompts) + args.steps + 8, args.ppl_prefix + args.ppl_tokens + 8)
            params = ContextParams(n_ctx=(len(VARIANTS) + 2) * max_len, n_seq_max=len(VARIANTS) + 2,
                                   n_threads=threads, flash_attn=True)
            with LlamaContext(model, params) as ctx:
                per_prompt = run_prompts(ctx, prompts, args.steps)
                meta["prompts_s"] = round(time.perf_counter() - t_start, 1)
                ppl = run_perplexity(ctx, texts, args.ppl_prefix, args.ppl_tokens)
            ref_conts = {r["name"]: r["ref_continuation"] for r in per_prompt}
            summary = summarize(per_prompt)
            result.update(summary=summary, targets=check_targets(summary), perplexity=ppl,
                          categories=by_category(per_prompt), per_prompt=per_prompt)
            print(f"\n{path.name}: fidelity against never-parked ({len(prompts)} prompts, {args.steps}-token greedy "
                  f"continuations, threads={threads}):\n")
            print(fmt_table(summary, ppl))
            print("\nShare of greedy continuations still identical after N tokens:\n")
            print(fmt_horizons(summary))
            print("\nHeld-out perplexity after a round trip:\n")
            print(fmt_ppl(ppl))
            print("\nBy prompt category: mean next-token KL / identical 64-token continuations:\n")
            print(fmt_categories(result["categories"]))
            print("\nTargets:")
            for k, v in result["targets"].items():
                if isinstance(v, dict):
                    print(f"  {k}: {v['measured']:.5f} {v['op']} {v['target']}  {'met' if v['met'] else 'MISSED'}")
            print(f"  best 4-bit variant: {result['targets']['best_4bit']}")
        if args.live or args.live_only:
            kinds = [k.strip() for k in args.live_types.split(",") if k.strip()]
            live = run_live(model, kinds, prompts, ref_conts, texts["stdlib_docs"], args.ppl_prefix, args.ppl_tokens,
                            threads, args.steps)
            result["live"] = live
            print(f"\nLive quantized KV cache vs f16 live (+ quantized parking), {args.ppl_prefix}-token state:\n")
            print(fmt_live(live, args.steps))
    meta["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    meta["loadavg_end"] = os.getloadavg()
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=None,
                    help="GGUF file; repeat for several models in one run, one after another "
                         "(default: AGENTMEM_MODEL or the bundled model)")
    ap.add_argument("--prompts", type=int, default=0, help="use only N prompts spread over the categories (0 = all)")
    ap.add_argument("--steps", type=int, default=64, help="greedy continuation length")
    ap.add_argument("--ppl-prefix", type=int, default=1024, help="tokens prefilled before the scored text")
    ap.add_argument("--ppl-tokens", type=int, default=256, help="held-out tokens scored by teacher forcing")
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0 = probe 1 and 2, use the faster)")
    add_gpu_layers(ap)
    ap.add_argument("--live", action="store_true", help="also measure a live quantized KV cache (type_k/type_v)")
    ap.add_argument("--live-only", action="store_true", help="only the live section")
    ap.add_argument("--live-types", default="q8_0",
                    help="comma-separated live cache kinds besides f16: " + ", ".join(LIVE_TYPES))
    ap.add_argument("--quick", action="store_true", help="smoke run: 8 prompts, 16 steps, 256+64 held-out tokens")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated codec specs (f16 and q8_0 are always run); known: " + ", ".join(ALL_VARIANTS))
    ap.add_argument("--out", default="bench-results/fidelity.json",
                    help="results file; with several models one file each, named <stem>-<model stem>.json")
    args = ap.parse_args(argv)
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in chosen:
        CodecSpec.parse(v)  # a clear error for a bad spec before loading anything
    VARIANTS[:] = ["f16", "q8_0", *[v for v in chosen if v not in ("f16", "q8_0")]]
    unknown = [k.strip() for k in args.live_types.split(",") if k.strip() and k.strip() not in LIVE_TYPES]
    if unknown:
        ap.error(f"unknown --live-types {unknown}; valid: {', '.join(LIVE_TYPES)}")
    if args.quick:
        args.prompts, args.steps, args.ppl_prefix, args.ppl_tokens = args.prompts or 8, 16, 256, 64
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("agentmem").setLevel(logging.WARNING)

    from agentmem.model import resolve_model_path

    paths = [resolve_model_path(m) for m in args.model] if args.model else [resolve_model_path()]
    all_prompts = build_prompts()
    if args.prompts:
        # spread a subset over the categories instead of taking the first category only
        all_prompts = [all_prompts[i] for i in np.linspace(0, len(all_prompts) - 1, args.prompts).round().astype(int)]
    command = "python benchmarks/fidelity.py " + " ".join(sys.argv[1:] if argv is None else argv)
    runs = []
    for path in paths:
        result = run_model(path, args, all_prompts, command)
        runs.append(result)
        out = Path(args.out)
        if len(paths) > 1:
            out = out.with_name(f"{out.stem}-{path.stem}{out.suffix}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
        print(f"\nwrote {out} ({result['meta']['elapsed_s']:.0f} s)")
    if len(runs) > 1 and not args.live_only:
        print(f"\nAll models, one sitting ({len(all_prompts)} prompts, {args.steps}-token continuations):\n")
        print(fmt_models(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
