"""Chat-render benchmark: milliseconds per `ChatRenderer.render` call against history length.

Renders a conversation of 50 / 200 / 800 messages (alternating user / assistant turns of
~200 characters, a system prompt first) with the `jinja` format (the tiny test model's
ChatML jinja template) and with the built-in `chatml` format, on the tiny synthetic
model of the test suite, so no model download is needed. The tokenization cache is
cleared before every call: each figure is a cold render + tokenize of the whole history.

Usage:
    python benchmarks/chat_render.py                 # 50, 200, 800 messages
    python benchmarks/chat_render.py --sizes 100 400

Prints one line per (format, size): best of `--repeat` calls, in milliseconds.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentmem.engine.renderer import ChatRenderer  # noqa: E402
from agentmem.engine.context import LlamaModel  # noqa: E402
from tests.fixtures.tiny_gguf import build_tiny_gguf  # noqa: E402

logger = logging.getLogger("benchmarks.chat_render")


def history(n: int) -> list[dict[str, str]]:
    """A system prompt and `n - 1` alternating user / assistant turns."""
    msgs = [{"role": "system", "content": "You are a helpful agent. Answer briefly."}]
    for i in range(1, n):
        role = "user" if i % 2 else "assistant"
        msgs.append({"role": role, "content": f"turn {i}: " + "the plan for the next step is to read the file " * 4})
    return msgs


def best_ms(renderer: ChatRenderer, msgs: list[dict[str, str]], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        renderer._cache.clear()  # cold: no segment tokenization reused
        t0 = time.perf_counter()
        renderer.render(msgs)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 800])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        model = LlamaModel(build_tiny_gguf(Path(tmp) / "tiny.gguf"))
        for fmt in ("jinja", "chatml"):
            renderer = ChatRenderer(model, fmt)
            for n in args.sizes:
                logger.info("%-6s %4d messages: %8.1f ms", fmt, n, best_ms(renderer, history(n), args.repeat))
        model.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
