"""A free tool call and the call after it: how much of the call the next prompt reuses.

Qwen2.5-Coder-0.5B-Instruct, two tools, a question that makes the model call one with
`tool_choice` auto (no grammar); then the call and the tool's result are sent back, as a
client does. Each variant runs on a fresh pool in the same process:

* `as written` (`canonical_calls=False`, the behaviour before issue 16's fix): the model's
  bare `{"name": ...}` object stays in the KV, the next prompt renders the call inside
  `<tool_call>` tags, and the call is prefilled again;
* `canonical` (the default): the pool writes the opening into the KV as the call starts and
  completes its closing (`agentmem.pool.canon`).

Printed per variant: the first reply, the follow-up's cached/prompt tokens and prefilled
tokens, the tokens the rewrite decoded again (`canonical_tokens`), the first call's decode
time (its reply, the rewrite included), the follow-up's TTFT, the exchange's wall time and
the load. Tokens are deterministic (greedy decoding); times
are one run each, compare them only within one run.

Usage::

    python benchmarks/free_calls.py [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._report import add_gpu_layers, load, ms, table  # noqa: E402

TOOLS = [
    {"name": "lookup_metric", "description": "Look up the current value of a named service metric.",
     "parameters": {"type": "object", "properties": {"metric": {"type": "string"}}, "required": ["metric"]}},
    {"name": "send_email", "description": "Send an email to a person.",
     "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                    "required": ["to", "body"]}},
]
MSGS = [
    {"role": "system", "content": "You are a helpful assistant. Use the tools when useful."},
    {"role": "user", "content": "What is the current value of the metric p99_latency_ms? Use the tool."},
]


def exchange(threads: int, canonical: bool) -> dict[str, Any]:
    """One call that calls a tool, then the call with its result; what the second one reused."""
    from agentmem import MemoryPool

    with MemoryPool("qwen2.5-coder-0.5b-instruct", n_ctx=1024, resident_agents=1, n_threads=threads) as pool:
        t0 = time.perf_counter()
        r1 = pool.chat("a", MSGS, tools=TOOLS, max_tokens=48, canonical_calls=canonical)
        found = pool.tool_format.find(r1.text, [t["name"] for t in TOOLS])
        if found is None:
            raise SystemExit(f"the model did not call a tool: {r1.text!r}")
        calls = [{"id": f"c{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                 for i, c in enumerate(found[0])]
        follow = [*MSGS, {"role": "assistant", "content": found[1] or None, "tool_calls": calls},
                  {"role": "tool", "tool_call_id": "c0", "content": "412"}]
        r2 = pool.chat("a", follow, tools=TOOLS, max_tokens=1, canonical_calls=canonical)
        wall = time.perf_counter() - t0
        totals = pool.stats()["totals"]
    return {
        "variant": "canonical" if canonical else "as written",
        "reply": r1.text,
        "cached": r2.usage.cached_tokens,
        "prompt": r2.usage.prompt_tokens,
        "prefilled": r2.usage.prompt_tokens - r2.usage.cached_tokens,
        "call_tokens": r1.usage.completion_tokens,
        "canonical_tokens": totals["canonical_tokens"],
        "ttft_s": r2.timings.ttft_s,
        "decode_s": r1.timings.decode_s,
        "wall_s": wall,
        "load": load(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    add_gpu_layers(ap)
    args = ap.parse_args(argv)
    runs = [exchange(args.threads, False), exchange(args.threads, True)]
    print(table(
        ["variant", "follow-up cached/prompt", "prefilled", "re-decoded", "call decode", "follow-up TTFT", "wall", "load"],
        [[r["variant"], f"{r['cached']}/{r['prompt']}", r["prefilled"], r["canonical_tokens"], ms(r["decode_s"]),
          ms(r["ttft_s"]), f"{r['wall_s']:.2f} s", r["load"]] for r in runs],
    ))
    for r in runs:
        print(f"{r['variant']}: first reply {r['reply']!r}")
    old, new = runs
    print(f"follow-up prefilled: {new['prefilled']} vs {old['prefilled']} tokens "
          f"({new['prefilled'] / old['prefilled']:.2f}x); TTFT {new['ttft_s'] / old['ttft_s']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
