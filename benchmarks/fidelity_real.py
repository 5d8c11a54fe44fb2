"""Fidelity on real work: multi-turn tool conversations, parked and restored between turns with each codec.

For each bundled model (`gemma-3-270m`, `qwen2.5-coder-0.5b-instruct`) and each context
length (`--lengths`, about 1k / 4k / 8k tokens), `--conversations` conversations of the
replay benchmark (`benchmarks/replay.py`: system notes sized to the length, two function
tools, a user ask, a scripted `lookup_note` call and its result) go on for four
measured turns: the reply to the tool result, a user ask that calls for `count_words`,
the reply to its result, a user ask that calls for `lookup_note` again.

Sequence 0 is the *never-parked* reference; each codec gets its own sequence (one KV
stream each, `kv_unified=False`), which starts from the reference's state round-tripped
through the codec and is **parked and restored again before every turn** (`state_get`
-> encode -> decode -> `state_set`, as the pool parks an agent between its calls, so
the error of earlier parks is carried along). Every turn's prompt is rendered by
agentmem's own renderer (the pool's reconcile: keep the common prefix, decode the
rest into every sequence); the reply is the reference's greedy reply, fed to every
sequence in lockstep (one batch per token, teacher forcing), so all see the same
arithmetic and the same history.

Per codec, over the reply tokens of every turn: mean and p95 KL(reference || codec) of
the next-token distribution (float64 softmax over the full vocabulary), top-1
agreement, the share of *identical greedy replies* (a codec's greedy reply equals the
reference's exactly when its top-1 agrees at every reply position, end of turn
included), and *tool-call exact match* on the turns where the reference called a tool:
the codec's own greedy reply (decoded on from its first differing token) parsed with
the model's tool format, same name and arguments. The `f16` row round-trips
byte-identical states: what it shows is the restore's cell layout alone (Gemma's
sliding-window layers are packed at the start of the cache on restore) — the floor the
quantized codecs are read against. The archive's codec is `PoolConfig.cold_codec`
(`q8_0/q4_0`, the same as K8V4 here; `park_rotate` off); `--codecs` adds the 4-bit
codecs with Hadamard rotation (`q8_0/q4_0+rot`, `q4_0+rot`).

No public tool-conversation set from PyPI is used: none small enough was found and
installed in the time this benchmark was written (say so in the results).

Run: `python benchmarks/fidelity_real.py` (1k, 4k, 8k; 3 conversations each) or
`--quick` (1k: 2 conversations, 4k: 1; 24-token replies); `--out FILE` writes JSON. Prints
`uptime` at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import agentmem  # noqa: E402,F401 - first: llama.cpp's libraries load before numpy (engine/native_first.py)
import numpy as np  # noqa: E402

from agentmem.codec import CodecSpec  # noqa: E402
from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel  # noqa: E402
from agentmem.engine.renderer import ChatRenderer  # noqa: E402
from agentmem.model import resolve_model_path  # noqa: E402

from benchmarks._report import md_table, table  # noqa: E402
from benchmarks.fidelity import kl, log_softmax, pct, round_trip  # noqa: E402
from benchmarks.replay import TOOLS, conversations  # noqa: E402

logger = logging.getLogger("fidelity_real")
MODELS = ("gemma-3-270m", "qwen2.5-coder-0.5b-instruct")
#: the codecs of a run (`--codecs`); `q8_0/q4_0` is also the archive's (`PoolConfig.cold_codec`)
CODECS = ["f16", "q8_0", "q8_0/q4_0", "q4_0"]
ALL_CODECS = [*CODECS, "q8_0/q4_0+rot", "q4_0+rot"]
NAMES = [t["function"]["name"] for t in TOOLS]
#: the rule of docs/fidelity.md: a codec is not a default at a context length where its mean KL
#: per reply token exceeds this (nats), or where it matches fewer tool calls than the f16 row
KL_THRESHOLD = 0.01


def say(msg: str) -> None:
    """Result tables go to stdout (this module is a command)."""
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


class Conversation:
    """One conversation's sequences: the reference (0) and one per codec, with the tokens they hold."""

    def __init__(self, ctx: LlamaContext, renderer: ChatRenderer, model: LlamaModel, reply_tokens: int) -> None:
        self.ctx, self.renderer, self.model, self.reply_tokens = ctx, renderer, model, reply_tokens
        self.seqs = list(range(len(CODECS) + 1))
        self.hist: list[int] = []
        self.stats: dict[str, dict[str, list[Any]]] = {c: {"kl": [], "top1": [], "identical": [], "tool": []}
                                                       for c in CODECS}

    def prompt(self, messages: list[dict[str, Any]]) -> int:
        """Reconcile every sequence with the rendered `messages` (keep the common prefix, decode the rest)."""
        full = self.renderer.render(messages, tools=TOOLS).tokens
        n = 0
        for a, b in zip(self.hist, full):
            if a != b:
                break
            n += 1
        n = min(n, len(full) - 1)  # at least one token to decode: its logits start the reply
        if n < len(self.hist):
            for s in self.seqs:
                self.ctx.seq_rm(s, n)
        new = full[n:]
        idx = 0
        for s in self.seqs if self.hist else [0]:
            idx = self.ctx.decode_run(s, new, n)
        self.hist = list(full)
        return idx

    def park_all(self, first: bool) -> None:
        """Park and restore every codec's sequence (the first time: from the reference's state)."""
        ref = self.ctx.state_get(0) if first else None
        for i, codec in enumerate(CODECS, 1):
            blob = ref if ref is not None else self.ctx.state_get(i)
            dec, _ = round_trip(blob, codec)
            n = self.ctx.state_set(i, dec)
            assert n > 0 and self.ctx.seq_pos_max(i) == len(self.hist) - 1, f"restore of {codec} failed"

    def turn(self, messages: list[dict[str, Any]], *, expect_call: bool) -> str:
        """One measured turn: park/restore, render, lockstep reply; returns the reference's reply text."""
        self.prompt(messages)
        pos = len(self.hist) - 1
        last = self.hist[-1]
        # the prompt's last token is decoded again in lockstep so every sequence's first reply logits
        # come from one batch (decode_run above left it in each sequence; remove and redo it)
        for s in self.seqs:
            self.ctx.seq_rm(s, pos)
        reply: list[int] = []
        first_diff: dict[str, int | None] = {c: None for c in CODECS}
        own_first: dict[str, int] = {}
        tok = last
        while True:
            idx = self.ctx.decode_multi([(s, [tok], pos) for s in self.seqs])
            lps = [log_softmax(self.ctx.logits(i)) for i in idx]
            ref_tok = int(np.argmax(lps[0]))
            for c, lp in zip(CODECS, lps[1:]):
                self.stats[c]["kl"].append(kl(lps[0], lp))
                mine = int(np.argmax(lp))
                self.stats[c]["top1"].append(mine == ref_tok)
                if mine != ref_tok and first_diff[c] is None:
                    first_diff[c], own_first[c] = len(reply), mine
            reply.append(ref_tok)
            pos += 1
            tok = ref_tok
            if self.model.is_eog(ref_tok) or len(reply) >= self.reply_tokens:
                break
        self.hist.extend(reply[:-1])  # the last one (end of turn) is not decoded: the next render adds it
        text = self.model.detokenize([t for t in reply if not self.model.is_eog(t)])
        fmt = self.renderer.tool_format
        ref_call = fmt.find(text, NAMES)
        for c in CODECS:
            self.stats[c]["identical"].append(first_diff[c] is None)
        if expect_call and ref_call is not None:
            own = self.own_replies(reply, first_diff, own_first)
            for c in CODECS:
                mine = ref_call if first_diff[c] is None else fmt.find(own[c], NAMES)
                same = mine is not None and [(x.name, x.arguments) for x in mine[0]] == \
                    [(x.name, x.arguments) for x in ref_call[0]]
                self.stats[c]["tool"].append(same)
        return text

    def own_replies(self, reply: list[int], first_diff: dict[str, int | None],
                    own_first: dict[str, int]) -> dict[str, str]:
        """Each differing codec's own greedy reply (decoded on from its first differing token), then realigned."""
        base = len(self.hist) - (len(reply) - 1)  # position of the reply's first token
        live = {c: [*reply[:d], own_first[c]] for c, d in first_diff.items() if d is not None}
        seq_of = {c: i for i, c in enumerate(CODECS, 1)}
        for c, d in first_diff.items():
            if d is not None:
                self.ctx.seq_rm(seq_of[c], base + d)
        running = {c for c in live if not self.model.is_eog(live[c][-1])}
        while running:
            order = sorted(running)
            idx = self.ctx.decode_multi([(seq_of[c], [live[c][-1]], base + len(live[c]) - 1) for c in order])
            for c, i in zip(order, idx):
                t = int(np.argmax(self.ctx.logits(i)))
                live[c].append(t)
                if self.model.is_eog(t) or len(live[c]) >= self.reply_tokens:
                    running.discard(c)
        out = {}
        for c, d in first_diff.items():
            if d is None:
                continue
            out[c] = self.model.detokenize([t for t in live[c] if not self.model.is_eog(t)])
            self.ctx.seq_rm(seq_of[c], base + d)
            tail = reply[d:-1]
            if tail:
                self.ctx.decode_run(seq_of[c], tail, base + d)
        return out


def run_length(model: LlamaModel, renderer: ChatRenderer, length: int, n_conv: int, reply_tokens: int,
               threads: int, label: str) -> dict[str, Any]:
    """Every conversation at about `length` tokens of context; the per-codec figures."""
    n_seq = len(CODECS) + 1
    per_seq = length + 8 * reply_tokens + 1024
    params = ContextParams(n_ctx=n_seq * per_seq, n_seq_max=n_seq, n_threads=threads, flash_attn=True,
                           swa_full=True, kv_unified=False, n_batch=512)
    totals: dict[str, dict[str, list[Any]]] = {c: {"kl": [], "top1": [], "identical": [], "tool": []} for c in CODECS}
    ctx_tokens = []
    t0 = time.perf_counter()
    with LlamaContext(model, params) as ctx:
        for k, (cid, msgs) in enumerate(conversations(n_conv, max(64, length - 200), seed=11 + length).items()):
            ctx.clear()
            conv = Conversation(ctx, renderer, model, reply_tokens)
            msgs = list(msgs)
            conv.prompt(msgs)  # the reference's prefill
            ctx_tokens.append(len(conv.hist))
            conv.park_all(first=True)
            ask_count = {"role": "user", "content": f"Now count how often the word {msgs[1]['content'].split()[4]} "
                                                    "appears in the notes. Use the count_words tool."}
            ask_lookup = {"role": "user", "content": "Look up the word lantern in the notes with lookup_note."}
            for j, (extra, expect_call) in enumerate([(None, False), (ask_count, True), (None, False),
                                                      (ask_lookup, True)]):
                if j:
                    conv.park_all(first=False)
                if extra is not None:
                    msgs.append(extra)
                text = conv.turn(msgs, expect_call=expect_call)
                call = renderer.tool_format.find(text, NAMES)
                if call is not None:
                    c0 = call[0][0]
                    cid_j = f"call_{k}_{j + 1}"
                    msgs.append({"role": "assistant", "content": "", "tool_calls": [{
                        "id": cid_j, "type": "function",
                        "function": {"name": c0.name, "arguments": json.dumps(c0.arguments)}}]})
                    msgs.append({"role": "tool", "tool_call_id": cid_j, "content": f"{c0.name}: 3 matches in note 7."})
                else:
                    msgs.append({"role": "assistant", "content": text})
            for c in CODECS:
                for key in totals[c]:
                    totals[c][key] += conv.stats[c][key]
            logger.info("%s ~%d: conversation %d/%d: %d tokens, KL q8_0 %.5f q4_0 %.4f, %.0fs", label,
                        length, k + 1, n_conv, len(conv.hist),
                        float(np.mean(conv.stats["q8_0"]["kl"])), float(np.mean(conv.stats["q4_0"]["kl"])),
                        time.perf_counter() - t0)
    out: dict[str, Any] = {"length": length, "context_tokens": ctx_tokens,
                           "seconds": round(time.perf_counter() - t0, 1), "codecs": {}}
    for c in CODECS:
        s = totals[c]
        out["codecs"][c] = {
            "mean_kl": float(np.mean(s["kl"])), "p95_kl": pct(s["kl"], 95), "top1": float(np.mean(s["top1"])),
            "identical": float(np.mean(s["identical"])), "turns": len(s["identical"]), "positions": len(s["kl"]),
            "tool_match": float(np.mean(s["tool"])) if s["tool"] else float("nan"), "tool_turns": len(s["tool"]),
        }
    return out


def verdicts(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Per model and length: the codecs that pass the rule (mean KL <= threshold, tool calls as f16)."""
    out: dict[str, dict[str, list[str]]] = {}
    for model, by_len in runs.items():
        for length, r in by_len.items():
            f16_tool = r["codecs"]["f16"]["tool_match"]
            ok = []
            for c, m in r["codecs"].items():
                tool_ok = np.isnan(m["tool_match"]) or np.isnan(f16_tool) or m["tool_match"] >= f16_tool
                if m["mean_kl"] <= KL_THRESHOLD and tool_ok:
                    ok.append(c)
            out.setdefault(model, {})[length] = ok
    return out


def fmt(runs: dict[str, dict[str, Any]], md: bool) -> str:
    headers = ["model", "context", "codec", "mean KL", "p95 KL", "top-1", "identical replies", "tool calls"]
    rows = []
    for model, by_len in runs.items():
        for length, r in by_len.items():
            ctx = f"{int(np.mean(r['context_tokens']))} tok"
            for c, m in r["codecs"].items():
                tool = "-" if np.isnan(m["tool_match"]) else f"{m['tool_match']:.0%} of {m['tool_turns']}"
                rows.append([model, ctx, c, f"{m['mean_kl']:.5f}", f"{m['p95_kl']:.5f}", f"{m['top1']:.1%}",
                             f"{m['identical']:.0%} of {m['turns']}", tool])
    return (md_table if md else table)(headers, rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=None, help="bundled model name or GGUF (repeatable)")
    ap.add_argument("--lengths", default="1000,4000,8000", help="context lengths (tokens), comma-separated")
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--reply-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--codecs", default=",".join(CODECS), help="comma-separated codecs; known: " + ", ".join(ALL_CODECS))
    ap.add_argument("--quick", action="store_true",
                    help="1k (2 conversations) and 4k (1 conversation), 24-token replies")
    ap.add_argument("--md", action="store_true", help="a markdown table (for docs/fidelity.md)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    CODECS[:] = ["f16", *[c.strip() for c in args.codecs.split(",") if c.strip() and c.strip() != "f16"]]
    for c in CODECS:
        CodecSpec.parse(c)  # a clear error for a bad spec before loading anything
    per_length = {}
    if args.quick:
        args.lengths, args.reply_tokens = "1000,4000", 24
        per_length = {1000: 2, 4000: 1}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    start = uptime()
    say(f"uptime at the start: {start}")
    runs: dict[str, dict[str, Any]] = {}
    for name in args.model or list(MODELS):
        path = resolve_model_path(name)
        with LlamaModel(path) as model:
            renderer = ChatRenderer(model)
            for length in lengths:
                r = run_length(model, renderer, length, per_length.get(length, args.conversations), args.reply_tokens,
                               args.threads, path.stem)
                runs.setdefault(path.stem, {})[str(length)] = r
                say(f"{path.stem} ~{length} tokens done in {r['seconds']:.0f}s\n"
                    + fmt({path.stem: {str(length): r}}, args.md))
                if args.out:  # what is done so far survives an interrupted run
                    args.out.write_text(json.dumps({"runs": runs, "partial": True}, indent=1, default=str))
    say("\nParked and restored before every turn vs never parked (KL in nats per reply token):\n")
    say(fmt(runs, args.md))
    say(f"\nRule: mean KL <= {KL_THRESHOLD} and tool calls matched at least as often as f16. Passing:")
    v = verdicts(runs)
    for model, by_len in v.items():
        for length, ok in by_len.items():
            say(f"  {model} ~{length}: {', '.join(ok) or 'none'}")
    end = uptime()
    say(f"uptime at the end: {end}")
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "verdicts": v, "threshold": KL_THRESHOLD,
                                        "uptime": [start, end], "args": vars(args)}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
