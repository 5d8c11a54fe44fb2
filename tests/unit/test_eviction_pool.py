"""Eviction inside the pool (tiny models): budgets, KV/ledger agreement, reuse, recall, pins.

Every test runs under every chat format (`tests.fixtures.chat_models.CHAT_CASES`:
gemma, chatml, and Qwen2.5's own template through jinja on a model without BOS).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentmem import ContextOverflowError, MemoryPool
from agentmem.policy.eviction import POLICIES, RegionDecay
from agentmem.policy.view import REGION_CODE
from tests.fixtures.chat_models import CHAT_CASES, build_chat_case


@pytest.fixture(scope="module", params=sorted(CHAT_CASES))
def chat_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`(tiny GGUF, chat_format)` of one chat format."""
    return build_chat_case(tmp_path_factory.mktemp("chat-case"), request.param), CHAT_CASES[request.param].chat_format


def long_conv(n_turns: int, *, pin_first: bool = False) -> list[dict]:
    msgs = [{"role": "system", "content": "you are a careful assistant and the vault code is 4821", "pin": pin_first}]
    for i in range(n_turns):
        msgs.append({"role": "user", "content": f"turn {i}: the weather today is fine and the river {i} is calm"})
        msgs.append({"role": "assistant", "content": f"noted item {i} about the river and the weather"})
    msgs.append({"role": "user", "content": "what is the vault code?"})
    return msgs


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_budget_respected_and_kv_matches_ledger(chat_model, policy):
    tiny_model_path, chat_format = chat_model
    with MemoryPool(tiny_model_path, chat_format=chat_format, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False,
                    agent_budget_tokens=256, eviction=policy) as p:
        msgs = long_conv(20)
        r = p.chat("a", msgs, max_tokens=4)
        st = p.stats()["agents"]["a"]
        assert st["evictions"] >= 1 and st["evicted_tokens"] > 0
        assert st["live_tokens"] <= 256
        assert st["tokens"] == r.usage.prompt_tokens + r.usage.completion_tokens - (r.finish_reason == "length")
        seq = p.engine()._core.agents["a"].seq
        # positions stay contiguous: the KV ends exactly at the ledger's live count
        assert p.engine().ctx.seq_pos_max(seq) == st["live_tokens"] - 1
        assert p.engine().ctx.seq_pos_min(seq) == 0
        # the whole history is still matched: the next turn reuses it (no re-decode of evicted spans)
        msgs2 = msgs + [{"role": "assistant", "content": r.text}, {"role": "user", "content": "thanks"}]
        r2 = p.chat("a", msgs2, max_tokens=4)
        assert r2.kv == "reused" and r2.usage.cached_tokens >= r.usage.prompt_tokens


def test_pinned_messages_are_never_evicted(chat_model):
    tiny_model_path, chat_format = chat_model
    with MemoryPool(tiny_model_path, chat_format=chat_format, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False,
                    agent_budget_tokens=200, eviction="sliding_window") as p:
        p.chat("a", long_conv(20, pin_first=True), max_tokens=2)
        led = p.engine()._core.agents["a"].ledger
        assert led.live[led.pinned].all() and led.pinned.any()


def test_recall_returns_evicted_text(chat_model):
    tiny_model_path, chat_format = chat_model
    with MemoryPool(tiny_model_path, chat_format=chat_format, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False,
                    agent_budget_tokens=200, eviction="streaming_llm") as p:
        p.chat("a", long_conv(20), max_tokens=2)
        hits = p.recall("a", "river 3 calm", k=3)
        assert hits and any("3 is calm" in h.text for h in hits)
        assert p.stats()["totals"]["recall_hits"] == 1


def test_without_budget_overflow_raises_with_budget_it_trims(chat_model):
    tiny_model_path, chat_format = chat_model
    msgs = long_conv(60)
    with MemoryPool(tiny_model_path, chat_format=chat_format, n_ctx=512, resident_agents=1, n_batch=64, prefetch=False) as p:
        with pytest.raises(ContextOverflowError):
            p.chat("a", msgs, max_tokens=2)
    with MemoryPool(tiny_model_path, chat_format=chat_format, n_ctx=512, resident_agents=1, n_batch=64, prefetch=False,
                    agent_budget_tokens=300) as p:
        r = p.chat("a", msgs, max_tokens=2)
        assert r.usage.prompt_tokens > 512 and p.stats()["agents"]["a"]["live_tokens"] <= 300


def test_per_agent_budget_and_restore_after_eviction(chat_model):
    tiny_model_path, chat_format = chat_model
    with MemoryPool(tiny_model_path, chat_format=chat_format, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False) as p:
        p.set_budget("a", 200, eviction="region_decay")
        msgs = long_conv(15)
        p.chat("a", msgs, max_tokens=2)
        p.chat("b", [{"role": "user", "content": "hi"}], max_tokens=2)  # parks a (evicted state)
        r = p.chat("a", msgs + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}], max_tokens=2)
        assert r.kv == "restored" and p.stats()["agents"]["b"]["evictions"] == 0


def agent_loop(p: MemoryPool, n_rounds: int) -> list[dict]:
    """An agent tool loop: a system prompt with codes, then user turn → tool call → tool result → reply."""
    msgs = [{"role": "system", "content": "you are a careful agent and the vault code is 4821 and the gate code is 7730"}]
    for i in range(n_rounds):
        msgs.append({"role": "user", "content": f"turn {i}: the weather today is fine and the river {i} is calm"})
        r = p.chat("a", msgs, max_tokens=6)
        msgs.append({"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "name": "read", "arguments": {"q": i}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"result {i}: the code of box {i} is {1000 + i}"})
        r = p.chat("a", msgs, max_tokens=6)
        msgs.append({"role": "assistant", "content": r.text})
    return msgs


def test_region_decay_keeps_the_system_prompt_in_an_agent_loop(chat_model):
    """Regression (issue 14, item 6): under Qwen2.5's own template (jinja, no BOS) region_decay
    evicted the whole system span first. Each call's generation prompt stayed in the ledger as
    glue (message -1), the view counted glue as the newest turn, so everything from the first
    generation prompt on was "protected" and the system prompt was the only thing left to evict.
    (With a BOS at position 0 the whole view was protected instead, which hid it.)"""
    tiny_model_path, chat_format = chat_model
    with MemoryPool(tiny_model_path, chat_format=chat_format, n_ctx=4096, resident_agents=1, n_batch=64,
                    prefetch=False, agent_budget_tokens=400, eviction="region_decay") as p:
        agent_loop(p, 12)
        a = p.engine()._core.agents["a"]
        led = a.ledger
        assert a.counters["evictions"] >= 3
        sys_span = led.regions == REGION_CODE["system"]
        assert sys_span.any() and led.live[sys_span].all(), f"system evicted: {led.live[sys_span].sum()} of {sys_span.sum()} live"
        # only the newest call's generation prompt (and a BOS) may still be glue: earlier ones
        # were re-tagged with the assistant message the next prompt rendered them into
        glue = [i for i in np.flatnonzero(led.messages < 0).tolist() if i > 0 or not p.engine().model.add_bos]
        last_reply = int(np.flatnonzero(led.messages == led.messages.max())[0])
        assert glue == list(range(last_reply - len(glue), last_reply)), f"stale glue at {glue}, reply at {last_reply}"

        def live_share(region: str) -> float:
            sel = led.regions == REGION_CODE[region]
            return float(led.live[sel].mean())

        assert live_share("tool_result") > live_share("user"), f"{live_share('tool_result')=}, {live_share('user')=}"


def test_view_turns_follow_the_prompt_render(chat_model):
    """The view the policy sees: every token's turn is its message in the newest render, glue
    belongs to the message after it, and the newest message is what `region_decay` protects."""
    tiny_model_path, chat_format = chat_model
    with MemoryPool(tiny_model_path, chat_format=chat_format, n_ctx=4096, resident_agents=1, n_batch=64,
                    prefetch=False) as p:
        msgs = agent_loop(p, 3)
        msgs.append({"role": "user", "content": "what is the vault code?"})
        rp = p.renderer.render(msgs)
        p.chat("a", msgs, max_tokens=0)
        a = p.engine()._core.agents["a"]
        assert a.ledger.tokens.tolist() == rp.tokens
        want = np.full(len(rp.tokens), -1)
        for s in rp.spans:
            want[s.start : s.end] = s.message
        assert a.ledger.messages.tolist() == want.tolist(), "the kept prefix carries the newest render's tags"
        view = p.engine()._decoder.trimmer.view(a)
        assert view.current_turn == len(msgs) - 1
        assert (np.diff(view.turn) >= 0).all(), "turns never go back"
        newest = view.turn == len(msgs) - 1
        assert newest.any()
        prot = RegionDecay().protected(view)
        assert prot.sum() == view.n - int(np.flatnonzero(newest)[0]), "protected: the newest message and what follows"
