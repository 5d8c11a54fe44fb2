"""TextAssembler (stop strings, UTF-8), SamplingParams validation and the Ledger."""

from __future__ import annotations

import pytest

from agentmem.engine.chat_format import Span
from agentmem.engine.sampling import SamplingParams, TextAssembler
from agentmem.errors import ConfigError
from agentmem.memory.ledger import Ledger


def feed(asm, pieces):
    out = [asm.push(p) for p in pieces]
    out.append(asm.flush())
    return "".join(out)


def test_stop_string_split_across_tokens_is_never_emitted():
    asm = TextAssembler(["STOP"])
    emitted = feed(asm, [b"hello S", b"TO", b"P world"])
    assert emitted == "hello " and asm.stopped and asm.text == "hello "


def test_utf8_split_across_tokens():
    data = "héllo ✓".encode()
    asm = TextAssembler([])
    assert feed(asm, [data[i : i + 1] for i in range(len(data))]) == "héllo ✓"


def test_earliest_stop_wins():
    asm = TextAssembler(["b", "a"])
    assert feed(asm, [b"xxabyy"]) == "xx"


def test_sampling_params_validation():
    assert SamplingParams.make(stop="x").stop == ("x",)
    with pytest.raises(ConfigError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ConfigError, match="max_tokens"):
        SamplingParams(max_tokens=-1)
    with pytest.raises(ConfigError, match="stop"):
        SamplingParams.make(stop=[""])


def test_ledger_grow_truncate_and_merge_spans():
    led = Ledger()
    led.extend(list(range(300)), [Span(0, 100, "system"), Span(100, 300, "user")])
    led.extend([7, 8], region="assistant")
    led.extend([9], region="assistant")
    assert len(led) == 303
    assert led.spans[-1] == Span(300, 303, "assistant")
    assert led.common_prefix(list(range(150)) + [0]) == 150
    led.truncate(120)
    assert led.region_counts() == {"system": 100, "user": 20}
    with pytest.raises(ValueError):
        led.tokens[0] = 5  # read-only view


def test_ledger_retag_takes_the_newest_render_and_keeps_pins():
    """A kept prefix is re-tagged by the prompt that kept it: the generation prompt (glue, -1)
    and the reply (assistant) of the last call become the assistant message / tool call the
    next prompt renders; pins set by `MemoryPool.pin` stay."""
    led = Ledger()
    led.extend(range(10), [Span(0, 4, "system", 0), Span(4, 7, "user", 1), Span(7, 10, "assistant", -1)])
    led.extend([10, 11], region="assistant", message=2)  # the generated reply
    led.set_pinned(0)
    led.evict_live([(4, 6)])
    led.retag(11, [Span(0, 4, "system", 0), Span(4, 7, "user", 1), Span(7, 12, "tool_call", 2)])
    assert led.spans == [Span(0, 4, "system", 0, True), Span(4, 7, "user", 1), Span(7, 11, "tool_call", 2),
                         Span(11, 12, "assistant", 2)]
    assert led.live.tolist() == [True] * 4 + [False, False] + [True] * 6


def test_repeat_penalty_and_sampling_paths_run(tiny_model_path):
    """Regression: llama_sampler_init_penalties takes n_vocab first in this llama.cpp (it crashed)."""
    from agentmem import MemoryPool

    with MemoryPool(tiny_model_path, n_ctx=512, resident_agents=1, n_batch=64, prefetch=False) as p:
        msgs = [{"role": "user", "content": "hello there"}]
        r = p.chat("a", msgs, max_tokens=8, repeat_penalty=1.3)
        assert r.usage.completion_tokens > 0
        r1 = p.chat("b", msgs, max_tokens=8, temperature=0.8, seed=7, top_k=20, top_p=0.9, min_p=0.01)
        r2 = p.chat("c", msgs, max_tokens=8, temperature=0.8, seed=7, top_k=20, top_p=0.9, min_p=0.01)
        assert r1.tokens == r2.tokens  # seeded sampling is reproducible
        g = p.chat("d", msgs, max_tokens=6, grammar='root ::= "yes" | "no"')
        assert g.text in ("yes", "no")
