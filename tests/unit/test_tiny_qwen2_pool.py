"""The pool on the tiny `qwen2` fixture, under Qwen2.5's own jinja template.

The qwen2 architecture (one KV cache, no sliding window, GQA, q/k/v biases) is the
one of the bundled instruct model; these tests keep it covered without that model.
"""

from __future__ import annotations

from pathlib import Path

from agentmem import MemoryPool
from tests.fixtures.tiny_gguf import IM_END_ID, IM_START_ID

OPTS = {"n_ctx": 1024, "n_batch": 64, "n_threads": 1}


def conv(*turns: str) -> list[dict]:
    msgs = [{"role": "system", "content": "you are a helpful bot"}]
    for i, t in enumerate(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": t})
    return msgs


def test_jinja_template_renders_qwen_turns_and_the_next_call_reuses_the_prefix(tiny_qwen2_path: Path) -> None:
    with MemoryPool(tiny_qwen2_path, resident_agents=1, **OPTS) as pool:
        r1 = pool.chat("a", conv("hello there"), max_tokens=4)
        assert r1.kv == "prefilled" and r1.usage.prompt_tokens == pool.count_tokens(conv("hello there"))
        assert type(pool.renderer.format).__name__ == "JinjaFormat", "auto picks the GGUF's own template"
        prompt = pool.tokens("a")[: r1.usage.prompt_tokens]
        assert prompt[0] == IM_START_ID and prompt.count(IM_START_ID) == 3 and prompt.count(IM_END_ID) == 2, prompt
        assert "system\nyou are a helpful bot" in pool.engine().model.detokenize(prompt)
        r2 = pool.chat("a", conv("hello there", r1.text or "ok", "and more"), max_tokens=4)
        assert r2.kv == "reused" and r2.usage.cached_tokens >= r1.usage.prompt_tokens


def test_park_restore_gives_identical_output(tiny_qwen2_path: Path) -> None:
    first, follow = conv("plan the task"), conv("plan the task", "one step", "next step")
    with MemoryPool(tiny_qwen2_path, resident_agents=1, **OPTS) as p:
        p.chat("a", first, max_tokens=8)
        p.chat("b", conv("other agent"), max_tokens=8)  # parks a
        restored = p.chat("a", follow, max_tokens=8)
    with MemoryPool(tiny_qwen2_path, resident_agents=1, **OPTS) as p:
        p.chat("a", first, max_tokens=8)
        never = p.chat("a", follow, max_tokens=8)
    assert restored.kv == "restored" and restored.usage.cached_tokens > 0
    assert restored.tokens == never.tokens
