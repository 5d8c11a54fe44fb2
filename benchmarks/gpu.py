"""GPU benchmark (issue #31): what a switch, a decode and a parked agent cost with layers offloaded.

One run, four sections, each against its baseline measured in the same run:

* switch  agents take turns on one live sequence (`resident_agents=1`, prefetch off), so every
          call restores the agent it serves from RAM (parked as f16, q8_0 or q4_0) and parks
          the one it displaces. TTFT of those calls vs TTFT of the same final prompts as fresh
          agents (a re-prefill of the whole history, which also parks the displaced agent).
          The park codec's share of the critical path is shown apart: the time spent in
          `ParkCodec.encode` (parking the displaced agent) and `.decode` (the restore) during
          the calls, clocked by wrapping those two methods for this run (f16 is the identity).
* decode  tokens/s of a greedy raw completion through `MemoryPool.complete` vs a plain
          low-level llama-cpp-python loop (`llama_decode` + llama.cpp's greedy sampler) on the
          same model, context settings, threads and offload; the reps interleave. Target:
          agentmem >= 0.95x (its per-token Python work shows most on a GPU).
* kv      the KV cache llama.cpp allocates, per device (its `KV buffer size` log lines: a
          `CUDA0` line is VRAM), per live sequence; the bytes per token of history; what an
          agent of the switch section takes parked in RAM per codec.
* exact   an agent parked (f16, q8_0, q4_0) while other agents take its cells, then restored:
          its greedy continuation vs the never-parked agent's. f16 must match token for token.

Run:
    python benchmarks/gpu.py --n-gpu-layers -1                       # a CUDA/Metal build (docs/gpu.md)
    nice -n 10 python benchmarks/gpu.py --quick --n-gpu-layers 0 --threads 1   # the CPU run, ~3 min

Prints the tables (with `uptime` before and after) and writes `bench-results/gpu.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agentmem  # noqa: E402 - first: llama.cpp's libraries before numpy (agentmem/engine/native_first.py)
import llama_cpp as ll  # noqa: E402
from agentmem import MemoryPool, resolve_model_path  # noqa: E402
from agentmem.engine.native_first import backend_name, gpu_backends  # noqa: E402
from agentmem.memory import parking  # noqa: E402
from benchmarks._report import add_gpu_layers, gpu_layers, md_table, ms  # noqa: E402

CODECS = ("f16", "q8_0", "q4_0")
TOPICS = ("the release checklist", "database migrations", "the caching layer", "error budgets", "feature flags",
          "the billing service", "log retention", "access control", "load testing", "incident reviews")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def history(pool: MemoryPool, agent: int, n_tokens: int) -> list[dict[str, str]]:
    """A system prompt and one user message of about `n_tokens` tokens, distinct per agent."""
    sentences = [f"Note {i} on {TOPICS[(agent + i) % len(TOPICS)]}: item {agent}-{i} needs review by the team "
                 f"before the next milestone, and its owner writes down what changed and why." for i in range(400)]
    msgs = [{"role": "system", "content": f"You are agent {agent} of a software team. Answer briefly."}]
    lo, hi = 1, len(sentences)
    while lo < hi:  # the longest prefix of sentences that fits n_tokens
        mid = (lo + hi + 1) // 2
        if pool.count_tokens(msgs + [{"role": "user", "content": " ".join(sentences[:mid])}]) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return msgs + [{"role": "user", "content": " ".join(sentences[:lo])}]


class CodecClock:
    """Seconds spent in `ParkCodec.encode`/`.decode` (the park codec on a call's critical path)."""

    def __init__(self) -> None:
        self.encode_s = self.decode_s = 0.0

    @contextlib.contextmanager
    def installed(self) -> Iterator[CodecClock]:
        enc, dec = parking.ParkCodec.encode, parking.ParkCodec.decode

        def timed_encode(codec: Any, *a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return enc(codec, *a, **kw)
            finally:
                self.encode_s += time.perf_counter() - t

        def timed_decode(codec: Any, *a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return dec(codec, *a, **kw)
            finally:
                self.decode_s += time.perf_counter() - t

        parking.ParkCodec.encode, parking.ParkCodec.decode = timed_encode, timed_decode  # type: ignore[method-assign]
        try:
            yield self
        finally:
            parking.ParkCodec.encode, parking.ParkCodec.decode = enc, dec  # type: ignore[method-assign]

    def take(self) -> tuple[float, float]:
        out = (self.encode_s, self.decode_s)
        self.encode_s = self.decode_s = 0.0
        return out


class LlamaLog(logging.Handler):
    """llama.cpp's log lines about buffers and offload, captured while a pool opens."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "buffer size" in msg or "offload" in msg:
            self.lines.append(msg.strip())

    @contextlib.contextmanager
    def capturing(self) -> Iterator[LlamaLog]:
        log = logging.getLogger("agentmem.llama")
        old = log.level
        log.setLevel(logging.DEBUG)
        log.addHandler(self)
        try:
            yield self
        finally:
            log.removeHandler(self)
            log.setLevel(old)

    def kv_bytes(self) -> dict[str, int]:
        """Bytes of the KV buffers by device (`CPU`, `CUDA0`, ...)."""
        out: dict[str, int] = {}
        for line in self.lines:
            m = re.search(r"(\S+) KV buffer size = +([\d.]+) MiB", line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0) + int(float(m.group(2)) * 2**20)
        return out


def switch(args: argparse.Namespace, opts: dict[str, Any], codec: str, clock: CodecClock) -> dict[str, Any]:
    """Restore TTFT vs re-prefill TTFT with parked states in `codec` (see the module docstring)."""
    log = LlamaLog()
    n_ctx = args.tokens * 2 + 512
    with log.capturing():
        # min_share_tokens=0: the fresh agents of the baseline must not copy their twins' prefix
        pool = MemoryPool(args.model, n_ctx=n_ctx, resident_agents=1, park_codec=codec, prefetch=False,
                          min_share_tokens=0, **opts)
    with pool:
        hist = {f"agent{i}": history(pool, i, args.tokens) for i in range(args.agents)}
        for a, m in hist.items():  # warm-up: each agent prefilled once
            m.append({"role": "assistant", "content": pool.chat(a, m, max_tokens=args.max_tokens).text or "ok"})
        calls: list[dict[str, Any]] = []
        clock.take()
        for rnd in range(args.rounds):
            for a, m in hist.items():
                m.append({"role": "user", "content": f"Round {rnd}: the next step on your item? One line."})
                r = pool.chat(a, m, max_tokens=args.max_tokens)
                enc, dec = clock.take()
                calls.append({"kv": r.kv, "ttft": r.timings.ttft_s, "restore": r.timings.restore_s, "encode": enc,
                              "decode": dec, "cached": r.usage.cached_tokens, "prompt": r.usage.prompt_tokens})
                m.append({"role": "assistant", "content": r.text or "ok"})
        parked = {a: v["bytes"] for a, v in pool.stats()["agents"].items() if v["tier"] == "warm"}
        fresh: list[dict[str, Any]] = []
        for a, m in hist.items():  # the same last prompts as fresh agents: a re-prefill of the whole history
            r = pool.chat(f"{a}-fresh", m[:-1], max_tokens=args.max_tokens)
            enc, dec = clock.take()
            fresh.append({"kv": r.kv, "ttft": r.timings.ttft_s, "encode": enc, "prompt": r.usage.prompt_tokens})
        eng = pool.engine()
        bpc = eng.model.kv_bytes_per_cell(eng.config.type_k, eng.config.type_v)
    rest = [c for c in calls if c["kv"] == "restored"]
    pre = [c for c in fresh if c["kv"] == "prefilled"]
    out = {
        "codec": codec, "restored_calls": len(rest), "calls": len(calls), "prompt_tokens": med([c["prompt"] for c in rest]),
        "cached_tokens": med([c["cached"] for c in rest]), "restore_ttft_s": med([c["ttft"] for c in rest]),
        "restore_s": med([c["restore"] for c in rest]), "codec_decode_s": med([c["decode"] for c in rest]),
        "codec_encode_s": med([c["encode"] for c in rest]), "reprefill_ttft_s": med([c["ttft"] for c in pre]),
        "reprefill_calls": len(pre), "parked_bytes": med(list(parked.values())), "kv_bytes_per_token": bpc,
        "n_ctx": n_ctx, "kv_buffers": log.kv_bytes(), "offload_log": [ln for ln in log.lines if "offload" in ln][:4],
    }
    out["speedup"] = out["reprefill_ttft_s"] / out["restore_ttft_s"] if rest and pre else float("nan")
    return out


def plain_decoder(path: Path, args: argparse.Namespace, n_ctx: int) -> tuple[Any, Any, Any, Any]:
    """A model, context and greedy sampler straight from llama-cpp-python's low-level API (the baseline)."""
    mp = ll.llama_model_default_params()
    mp.n_gpu_layers = gpu_layers()
    model = ll.llama_model_load_from_file(str(path).encode(), mp)
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, 512, 512, 1
    cp.n_threads = cp.n_threads_batch = args.threads
    cp.flash_attn_type, cp.swa_full, cp.no_perf = 1, True, True  # agentmem's defaults
    ctx = ll.llama_init_from_model(model, cp)
    smpl = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(smpl, ll.llama_sampler_init_greedy())
    if not (model and ctx and smpl):
        raise SystemExit("the plain llama-cpp-python baseline could not be set up")
    return model, ctx, smpl, ll.llama_model_get_vocab(model)


def plain_rate(ctx: Any, smpl: Any, tokens: list[int], n: int) -> float:
    """Tokens/s of `n` greedy tokens after `tokens` (EOS ignored), from the first token to the last."""
    ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
    for i in range(0, len(tokens), 512):
        chunk = (ll.llama_token * len(tokens[i:i + 512]))(*tokens[i:i + 512])
        if ll.llama_decode(ctx, ll.llama_batch_get_one(chunk, len(tokens[i:i + 512]))) != 0:
            raise SystemExit("llama_decode failed in the baseline prefill")
    tok = ll.llama_sampler_sample(smpl, ctx, -1)
    t0 = time.perf_counter()
    for _ in range(n - 1):
        one = (ll.llama_token * 1)(tok)
        if ll.llama_decode(ctx, ll.llama_batch_get_one(one, 1)) != 0:
            raise SystemExit("llama_decode failed in the baseline decode")
        tok = ll.llama_sampler_sample(smpl, ctx, -1)
    return (n - 1) / (time.perf_counter() - t0)


def decode(args: argparse.Namespace, opts: dict[str, Any]) -> dict[str, Any]:
    """Decode tokens/s through agentmem vs the plain loop, reps interleaved."""
    prompt = " ".join(f"Chapter {i}. The team met again to talk about {t}, and the notes grew longer." for i, t in
                      enumerate(TOPICS)) + " The next morning,"
    n_ctx = 2048
    path = resolve_model_path(args.model)
    model, ctx, smpl, vocab = plain_decoder(path, args, n_ctx)
    ours: list[float] = []
    plain: list[float] = []
    try:
        with MemoryPool(args.model, n_ctx=n_ctx, resident_agents=1, prefetch=False, **opts) as pool:
            tokens = pool.engine().model.tokenize(prompt, add_special=True)
            for rep in range(args.reps + 1):  # the first rep of each warms up
                r = pool.complete(f"decode{rep}", prompt, max_tokens=args.decode_tokens)
                p = plain_rate(ctx, smpl, tokens, args.decode_tokens)
                if rep and r.usage.completion_tokens > 1 and r.timings.decode_s > 0:
                    ours.append((r.usage.completion_tokens - 1) / r.timings.decode_s)
                    plain.append(p)
                pool.forget(f"decode{rep}")
    finally:
        ll.llama_sampler_free(smpl)
        ll.llama_free(ctx)
        ll.llama_model_free(model)
    a, b = med(ours), med(plain)
    return {"prompt_tokens": len(tokens), "tokens": args.decode_tokens, "reps": len(ours), "agentmem_tok_s": a,
            "plain_tok_s": b, "ratio": a / b if b else float("nan"), "agentmem_all": ours, "plain_all": plain}


def exact(args: argparse.Namespace, opts: dict[str, Any]) -> dict[str, Any]:
    """Greedy continuation after park -> restore (other agents took the cells) vs never parked."""
    kw = dict(n_ctx=args.tokens * 4 + 1024, resident_agents=2, prefetch=False, **opts)
    follow_q = {"role": "user", "content": "Now write the next step in detail."}

    def run(codec: str | None) -> tuple[list[int], str]:
        with MemoryPool(args.model, park_codec=codec or "f16", **kw) as pool:
            h = {i: history(pool, i, args.tokens // 2) for i in range(3)}
            pool.chat("A", h[0], max_tokens=4)
            if codec is not None:
                pool.chat("B", h[1], max_tokens=2)
                pool.park("A", "warm")
                pool.chat("C", h[2], max_tokens=2)  # takes the cells A left
            r = pool.chat("A", h[0] + [{"role": "assistant", "content": "Noted."}, follow_q],
                          max_tokens=args.exact_tokens)
        return r.tokens, r.kv

    ref, ref_kv = run(None)
    out: dict[str, Any] = {"tokens": len(ref), "reference_kv": ref_kv}
    for codec in CODECS:
        got, kv = run(codec)
        diff = next((i for i, (x, y) in enumerate(zip(got, ref)) if x != y), None if len(got) == len(ref) else
                    min(len(got), len(ref)))
        out[codec] = {"kv": kv, "match": got == ref, "first_diff": diff}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m", help="bundled model name or GGUF path (gemma-3-270m)")
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp threads of every variant (1)")
    add_gpu_layers(ap)
    ap.add_argument("--quick", action="store_true", help="short histories and decodes (the CPU run: a few minutes)")
    ap.add_argument("--agents", type=int, default=None, help="agents taking turns (3; --quick 2)")
    ap.add_argument("--rounds", type=int, default=None, help="switch rounds (3; --quick 2)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="history tokens per agent of the switch (2000; --quick 400); half that in exact")
    ap.add_argument("--max-tokens", type=int, default=4, help="tokens per switch call (4)")
    ap.add_argument("--decode-tokens", type=int, default=None, help="tokens per decode rep (128; --quick 48)")
    ap.add_argument("--reps", type=int, default=None, help="decode reps after a warm-up (5; --quick 3)")
    ap.add_argument("--exact-tokens", type=int, default=None, help="greedy tokens compared (32; --quick 16)")
    ap.add_argument("--json", default="bench-results/gpu.json", help="results file ('' = none)")
    args = ap.parse_args(argv)
    q = args.quick
    defaults = (("agents", 3, 2), ("rounds", 3, 2), ("tokens", 2000, 400), ("decode_tokens", 128, 48), ("reps", 5, 3),
                ("exact_tokens", 32, 16))
    for name, full, quick in defaults:
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    opts = {"n_threads": args.threads}  # n_gpu_layers: --n-gpu-layers exported as AGENTMEM_N_GPU_LAYERS
    before = uptime()
    t0 = time.perf_counter()
    meta = {"model": resolve_model_path(args.model).name, "n_gpu_layers": gpu_layers(), "threads": args.threads,
            "backend": None, "gpu_backends_built": list(gpu_backends()), "llama_cpp": ll.__version__,
            "agentmem": agentmem.__version__, "quick": q, "uptime_before": before,
            "command": " ".join(["python", "benchmarks/gpu.py", *(argv if argv is not None else sys.argv[1:])])}
    clock = CodecClock()
    with clock.installed():
        sw = [switch(args, opts, c, clock) for c in CODECS]
    meta["backend"] = backend_name(gpu_layers())
    dec = decode(args, opts)
    ex = exact(args, opts)
    meta["uptime_after"], meta["seconds"] = uptime(), round(time.perf_counter() - t0, 1)
    report(meta, sw, dec, ex)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"meta": meta, "switch": sw, "decode": dec, "exact": ex}, indent=1))
    return 0 if ex["f16"]["match"] else 1


def report(meta: dict[str, Any], sw: list[dict[str, Any]], dec: dict[str, Any], ex: dict[str, Any]) -> None:
    print(f"\n## {meta['backend']} run: {meta['model']}, n_gpu_layers={meta['n_gpu_layers']}, threads={meta['threads']}"
          f"{' (--quick)' if meta['quick'] else ''}, llama-cpp-python {meta['llama_cpp']}")
    print(f"uptime before: {meta['uptime_before']}\nuptime after:  {meta['uptime_after']}  ({meta['seconds']} s)\n")
    print("switch (one live sequence; each call restores its agent and parks another; medians):\n")
    print(md_table(
        ["parked as", "restored calls", "prompt tok", "cached tok", "restore TTFT", "of it: restore", "codec decode",
         "codec encode (park)", "codec share", "re-prefill TTFT", "speed-up", "parked bytes/agent"],
        [[s["codec"], f"{s['restored_calls']}/{s['calls']}", int(s["prompt_tokens"]), int(s["cached_tokens"]),
          ms(s["restore_ttft_s"]), ms(s["restore_s"]), ms(s["codec_decode_s"]), ms(s["codec_encode_s"]),
          f"{100 * (s['codec_decode_s'] + s['codec_encode_s']) / s['restore_ttft_s']:.0f}%", ms(s["reprefill_ttft_s"]), f"{s['speedup']:.1f}x", f"{s['parked_bytes'] / 2**20:.2f} MiB"] for s in sw]))
    s0 = sw[0]
    kv = ", ".join(f"{d} {b / 2**20:.1f} MiB" for d, b in s0["kv_buffers"].items()) or "not logged"
    print(f"\nKV of the one live sequence ({s0['n_ctx']} cells, f16): {kv} as llama.cpp allocates it; "
          f"{s0['kv_bytes_per_token']} bytes per token, so a {s0['prompt_tokens']:.0f}-token agent holds "
          f"{s0['kv_bytes_per_token'] * s0['prompt_tokens'] / 2**20:.2f} MiB live\n")
    print(md_table(["decode (greedy)", "tokens/s", "ratio"],
                   [["plain llama-cpp-python loop", f"{dec['plain_tok_s']:.1f}", "1.00x"],
                    ["agentmem MemoryPool.complete", f"{dec['agentmem_tok_s']:.1f}", f"{dec['ratio']:.2f}x"]]))
    print(f"({dec['reps']} reps of {dec['tokens']} tokens after a {dec['prompt_tokens']}-token prompt; target >= 0.95x)\n")
    print(md_table(["exact after park -> restore", "kv", f"{ex['tokens']} greedy tokens"],
                   [[c, ex[c]["kv"], "match" if ex[c]["match"] else f"differs from token {ex[c]['first_diff']}"]
                    for c in CODECS]))


if __name__ == "__main__":
    sys.exit(main())
