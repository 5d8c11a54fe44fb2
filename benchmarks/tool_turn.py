"""One decode per free tool turn (issue 25): a lazy call grammar vs free-then-forced, through the server.

Two `agentmem serve` processes on Qwen2.5-Coder-0.5B-Instruct, both up at once, called in
turn: `--decode-strategy lazy` (the default: a free tool turn decodes once, free text
until the model opens a call, constrained from there) and `--decode-strategy
free_then_forced` (the behaviour before: free, then once more under the forced grammar
when the free reply was a broken call). Each request goes through the official `openai`
client, streamed, with two tools offered; every request is a new agent whose system
message starts with a nonce, so each one prefills its whole prompt (nothing is shared).

Per server and repetition, two requests on each of three questions (the same prompt but for
`tool_choice`):

* `plain` — `tool_choice: "none"`: the tools are shown, nothing may be called (the
  reference: the prompt's size and a plain turn's TTFT);
* `auto` — `tool_choice: "auto"`.

The questions: `text` (answered in words), `call` (the model calls `lookup_metric`) and
`hello` ("Say hello to me in one short sentence.": decoded freely, this small model writes a
call of a tool that is not offered, `{"name": "hello", ...}`, which `free_then_forced` decodes
again under the forced grammar; the lazy grammar makes the call it opened one of an offered
tool in the same decode).

Reported per strategy, question and turn: p50 TTFT and its ratio to the same question's
`plain` turn (target for text: ≤ 1.2×), `prompt_tokens` against `plain`'s (target: equal —
one decode is billed), completion tokens, wall time, and how often the reply was a tool call.
`uptime` before and after. Times compare only within one run.

Usage::

    python benchmarks/tool_turn.py [--reps 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import add_gpu_layers, load, ms, table  # noqa: E402
from benchmarks._serving import ServerProc, free_port  # noqa: E402

MODEL = "qwen2.5-coder-0.5b-instruct"
STRATEGIES = ("lazy", "free_then_forced")
TOOLS = [
    {"type": "function", "function": {
        "name": "lookup_metric", "description": "Look up the current value of a named service metric.",
        "parameters": {"type": "object", "properties": {"metric": {"type": "string"}}, "required": ["metric"]}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email to a person.",
        "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                       "required": ["to", "body"]}}},
]
QUESTIONS = {
    "text": "In one short sentence, what is a service metric? Answer in words, do not use a tool.",
    "call": "What is the current value of the metric p99_latency_ms? Use the tool.",
    "hello": "Say hello to me in one short sentence.",
}
CASES = tuple((f"{q} {turn}", q, choice) for q in QUESTIONS for turn, choice in (("plain", "none"), ("auto", "auto")))


def one_call(client: Any, nonce: str, question: str, choice: str, max_tokens: int) -> dict[str, Any]:
    """One streamed chat completion: TTFT (first content or tool-call delta), usage, whether it called a tool."""
    msgs = [{"role": "system", "content": f"Session {nonce}. You are a helpful operations assistant."},
            {"role": "user", "content": question}]
    t0 = time.perf_counter()
    ttft = None
    usage = None
    called = False
    stream = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice=choice,
                                            max_tokens=max_tokens, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content or ch.delta.tool_calls:
                ttft = ttft if ttft is not None else time.perf_counter() - t0
            called = called or bool(ch.delta.tool_calls)
    wall = time.perf_counter() - t0
    assert usage is not None, "the server sends usage with stream_options.include_usage"
    return {"ttft": ttft if ttft is not None else wall, "wall": wall, "prompt": usage.prompt_tokens,
            "completion": usage.completion_tokens, "called": called}


def start(strategy: str, threads: int, logdir: Path) -> ServerProc:
    port = free_port()
    cmd = [sys.executable, "-m", "agentmem.server", "--model", MODEL, "--host", "127.0.0.1", "--port", str(port),
           "--threads", str(threads), "--resident", "2", "--n-ctx", "4096", "--decode-strategy", strategy]
    proc = ServerProc(cmd, port, logdir / f"tool_turn-{strategy}.log")
    proc.start()
    return proc


def measure(reps: int, threads: int, max_tokens: int, logdir: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """`out[strategy][case]` = the calls, the two servers called in turn."""
    import openai

    servers = {s: start(s, threads, logdir) for s in STRATEGIES}
    try:
        clients = {s: openai.OpenAI(base_url=p.base_url + "/v1", api_key="none", max_retries=0, timeout=600)
                   for s, p in servers.items()}
        out: dict[str, dict[str, list[dict[str, Any]]]] = {s: {c: [] for c, _, _ in CASES} for s in STRATEGIES}
        for r in range(reps):
            order = STRATEGIES if r % 2 == 0 else STRATEGIES[::-1]  # ABBA between the servers
            for s in order:
                for k, (case, question, choice) in enumerate(CASES):
                    nonce = f"{r:02d}-{STRATEGIES.index(s)}{k:02d}"  # digits: the same token count in every prompt
                    out[s][case].append(one_call(clients[s], nonce, QUESTIONS[question], choice, max_tokens))
        return out
    finally:
        for p in servers.values():
            p.stop()


def report(out: dict[str, dict[str, list[dict[str, Any]]]]) -> list[list[Any]]:
    rows = []
    for s, cases in out.items():
        for case, calls in cases.items():
            plain = cases[case.split()[0] + " plain"]
            plain_ttft = statistics.median(c["ttft"] for c in plain)
            ttft = statistics.median(c["ttft"] for c in calls)
            plain_prompt = [c["prompt"] for c in plain]
            extra = [c["prompt"] - p for c, p in zip(calls, plain_prompt)]
            rows.append([s, case, ms(ttft), f"{ttft / plain_ttft:.2f}x", statistics.median(c["prompt"] for c in calls),
                         f"{min(extra)}..{max(extra)}", statistics.median(c["completion"] for c in calls),
                         ms(statistics.median(c["wall"] for c in calls)), sum(c["called"] for c in calls)])
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    add_gpu_layers(ap)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--logdir", type=Path, default=Path("/tmp"))
    ap.add_argument("--json", type=Path, default=None, help="also write the raw calls here")
    args = ap.parse_args(argv)
    before = load()
    out = measure(args.reps, args.threads, args.max_tokens, args.logdir)
    after = load()
    print(f"load before {before}, after {after}; {args.reps} reps, threads {args.threads}")
    print(table(["strategy", "turn", "p50 TTFT", "vs plain", "prompt tokens", "prompt - plain's", "completion",
                 "p50 wall", "tool calls"], report(out)))
    if args.json:
        args.json.write_text(json.dumps({"load": [before, after], "calls": out}, indent=1))


if __name__ == "__main__":
    main()
