"""MemoryPool logic on the tiny synthetic model: reuse, parking, isolation, errors."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

import agentmem
from agentmem import (
    ConfigError,
    ContextOverflowError,
    MemoryPool,
    MessageError,
    ModelNotFoundError,
    PoolConfig,
    UnknownAgentError,
)
from agentmem.memory.parking import ParkedState


def conv(*turns: str) -> list[dict]:
    msgs = [{"role": "system", "content": "you are a helpful bot"}]
    for i, t in enumerate(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": t})
    return msgs


@pytest.fixture()
def pool(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=1024, resident_agents=2, n_batch=64) as p:
        yield p


def test_public_api_is_pinned():
    assert sorted(agentmem.__all__) == sorted(
        [
            "AgentMemError", "ArchiveError", "ChatResult", "ChatStream", "CodecError", "ConfigError",
            "ContextOverflowError", "EngineError", "FingerprintMismatch", "ImportOrderError", "MemoryPool", "MessageError",
            "ModelError", "ModelNotFoundError", "ModelPool", "ModelSpec", "PolicyError", "PoolConfig", "StateError", "Timings",
            "UnknownAgentError", "Usage", "__version__", "resolve_model_path",
        ]
    )
    # one pool (issue 32): `MemoryPool` is the models layer's, of one model or many; `ModelPool` stays as its
    # deprecated subclass; each model is run by the pool layer's `ModelEngine`
    assert agentmem.MemoryPool is agentmem.models.MemoryPool and issubclass(agentmem.ModelPool, agentmem.MemoryPool)
    assert sorted(agentmem.pool.__all__) == ["ChatResult", "ChatStream", "HandoffCard", "ModelEngine", "Timings", "Usage"]
    assert sorted(agentmem.models.__all__) == [
        "CostUnload", "LruUnload", "MemoryPool", "ModelLease", "ModelPool", "ModelSpec", "Pools", "UnloadPolicy",
        "aseat", "seat",
    ]


def test_config_round_trip_and_errors():
    cfg = PoolConfig(n_ctx=2048, resident_agents=3, park_codec="f16")
    assert PoolConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="resident_agents"):
        PoolConfig(resident_agents=0)
    with pytest.raises(ConfigError, match="unknown pool option"):
        PoolConfig.build(n_cxt=5)
    with pytest.raises(ConfigError, match="flash_attn"):
        PoolConfig(type_v="q8_0", flash_attn=False)


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        MemoryPool(tmp_path / "nope.gguf")


def test_prefix_reuse_counts_cached_tokens(pool):
    r1 = pool.chat("a", conv("hello there"), max_tokens=4)
    assert r1.kv == "prefilled" and r1.usage.cached_tokens == 0
    assert r1.usage.prompt_tokens == pool.count_tokens(conv("hello there"))
    msgs = conv("hello there", r1.text or "ok", "and more")
    r2 = pool.chat("a", msgs, max_tokens=4)
    assert r2.kv == "reused"
    # everything up to the previous prompt is reused (plus the matching part of the reply)
    assert r2.usage.cached_tokens >= r1.usage.prompt_tokens
    assert r2.usage.cached_tokens < r2.usage.prompt_tokens
    # the ledger holds the prompt and every decoded reply token (the last sampled one may be undecoded)
    total = r2.usage.prompt_tokens + r2.usage.completion_tokens
    assert len(pool.tokens("a")) in (total, total - 1)


def test_same_prompt_twice_reuses_all_but_one(pool):
    msgs = conv("the cat sat")
    pool.chat("a", msgs, max_tokens=3)
    r = pool.chat("a", msgs, max_tokens=3)
    assert r.usage.cached_tokens == r.usage.prompt_tokens - 1  # last token re-decoded for logits


def test_edited_history_drops_divergent_tail(pool):
    r1 = pool.chat("a", conv("one two three four five"), max_tokens=3)
    r2 = pool.chat("a", conv("one two six"), max_tokens=3)
    assert 0 < r2.usage.cached_tokens < r1.usage.prompt_tokens
    fresh = pool.chat("b", conv("one two six"), max_tokens=3)
    assert r2.text == fresh.text


def test_park_restore_gives_identical_output(tiny_model_path):
    msgs = conv("tell me a story about a dog")
    follow = msgs + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    with MemoryPool(tiny_model_path, n_ctx=1024, resident_agents=1, n_batch=64) as p:
        p.chat("a", msgs, max_tokens=8)
        p.chat("b", conv("something else entirely"), max_tokens=8)  # parks a
        assert p.stats()["agents"]["a"]["tier"] == "warm"
        r_restored = p.chat("a", follow, max_tokens=8)
        assert r_restored.kv == "restored"
        assert r_restored.usage.cached_tokens > 0
        assert p.stats()["totals"]["restores"] == 1
    with MemoryPool(tiny_model_path, n_ctx=1024, resident_agents=1, n_batch=64) as p:
        p.chat("a", msgs, max_tokens=8)
        r_never = p.chat("a", follow, max_tokens=8)
    assert r_restored.text == r_never.text
    assert r_restored.tokens == r_never.tokens


def test_isolation_between_agents(tiny_model_path):
    msgs = conv("alpha beta gamma")
    with MemoryPool(tiny_model_path, n_ctx=1024, resident_agents=2, n_batch=64) as p:
        alone = p.chat("a", msgs, max_tokens=8).tokens
    with MemoryPool(tiny_model_path, n_ctx=1024, resident_agents=2, n_batch=64) as p:
        p.chat("b", conv("delta epsilon"), max_tokens=8)
        with_b = p.chat("a", msgs, max_tokens=8).tokens
        p.chat("b", conv("delta epsilon", "x", "zeta"), max_tokens=8)
        again = p.chat("a", msgs, max_tokens=8).tokens
    assert alone == with_b == again


def test_streaming_equals_non_streaming(pool):
    msgs = conv("stream this please")
    full = pool.chat("a", msgs, max_tokens=10)
    stream = pool.chat_stream("b", msgs, max_tokens=10)
    pieces = list(stream)
    assert "".join(pieces) == full.text == stream.result.text
    assert stream.result.usage.completion_tokens == full.usage.completion_tokens


def test_stop_strings_cut_the_text(pool):
    base = pool.chat("a", conv("count"), max_tokens=12)
    if len(base.text) < 3:
        pytest.skip("tiny model produced too little text to test stop strings")
    stop = base.text[1:3]
    r = pool.chat("b", conv("count"), max_tokens=12, stop=[stop])
    assert r.finish_reason == "stop"
    assert stop not in r.text
    assert base.text.startswith(r.text)


def test_overflow_raises_and_pool_stays_usable(tiny_model_path):
    with MemoryPool(tiny_model_path, n_ctx=256, resident_agents=2, n_batch=64) as p:
        p.chat("keep", conv("short"), max_tokens=2)
        before = p.tokens("keep")
        with pytest.raises(ContextOverflowError) as ei:
            p.chat("big", conv("word " * 400), max_tokens=2)
        assert ei.value.capacity == 256 and ei.value.n_tokens > 256
        assert p.tokens("keep") == before  # nothing stored was lost
        assert p.chat("keep", conv("short"), max_tokens=2).kv == "reused"


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([{"role": "robot", "content": "x"}], "role"),
        ([{"role": "user"}], "content"),
        ([{"role": "user", "content": 5}], "content"),
        ([{"role": "tool", "content": "r"}], "tool_call_id"),
        ([{"role": "user", "content": "x", "colour": 1}], "colour"),
        ("just a string", "list"),
        ([], "empty"),
    ],
)
def test_malformed_messages_name_the_field(pool, messages, field):
    with pytest.raises(MessageError, match=field):
        pool.chat("a", messages)
    assert pool.chat("a", conv("fine"), max_tokens=1).usage.prompt_tokens > 0


def test_bad_sampling_options(pool):
    with pytest.raises(ConfigError, match="unknown sampling option"):
        pool.chat("a", conv("x"), temprature=1.0)
    with pytest.raises(ConfigError, match="temperature"):
        pool.chat("a", conv("x"), temperature=-1)
    with pytest.raises(ConfigError, match="agent_id"):
        pool.chat("", conv("x"))


def test_failed_restore_falls_back_to_prefill(tiny_model_path, caplog):
    msgs = conv("remember the number seven")
    with MemoryPool(tiny_model_path, n_ctx=1024, resident_agents=1, n_batch=64) as p:
        ref = p.chat("a", msgs, max_tokens=6)
        p.chat("b", conv("other"), max_tokens=2)  # parks a
        warm = p.engine()._core.tiers["warm"]
        parked = warm.get("a")
        bad = parked.data.copy()
        bad[40:] = 0xFF  # corrupt the blob
        warm.put("a", ParkedState(bad[: len(bad) // 2], parked.codec, parked.n_tokens))
        with caplog.at_level(logging.WARNING, logger="agentmem"):
            r = p.chat("a", msgs, max_tokens=6)
        assert "falling back to re-prefill" in caplog.text
        assert r.kv == "prefilled" and r.usage.cached_tokens == 0
        assert r.text == ref.text
        assert p.stats()["totals"]["restore_failures"] == 1


def test_stats_and_forget(pool):
    pool.chat("a", conv("x y"), max_tokens=2)
    pool.chat("b", conv("x z"), max_tokens=2)
    pool.chat("c", conv("x w"), max_tokens=2)  # parks a (resident_agents=2)
    st = pool.stats()
    assert st["agents"]["a"]["tier"] == "warm" and st["agents"]["a"]["bytes"] > 0
    assert st["agents"]["c"]["tier"] == "hot"
    assert st["totals"]["resident"] == 2 and st["totals"]["parks"] == 1
    assert st["agents"]["a"]["codec"] == "f16"
    pool.forget("a")
    assert "a" not in pool.stats()["agents"]
    with pytest.raises(UnknownAgentError, match="unknown agent 'a'"):
        pool.forget("a")


def test_complete_raw_prompt(pool):
    r = pool.complete("raw", "the cat sat on", max_tokens=4)
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens <= 4
    with pytest.raises(MessageError, match="string"):
        pool.complete("raw", 42)  # type: ignore[arg-type]


async def test_concurrent_achat_keeps_agents_isolated(tiny_model_path):
    """Concurrent calls finish, each agent's KV holds exactly its own prompt.

    Exact reply equality under concurrency is checked on the real model
    (tests/integration): with random tiny weights, near-tied logits flip on the
    float-order differences that interleaved cell placement causes.
    """
    prompts = {f"agent{i}": conv(f"topic number {i} is here") for i in range(4)}
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=4, n_batch=64) as p:
        res = await asyncio.gather(*(p.achat(k, v, max_tokens=8) for k, v in prompts.items()))
        for r in res:
            prompt = p.renderer.render(prompts[r.agent_id]).tokens
            assert p.tokens(r.agent_id)[: len(prompt)] == prompt
            assert r.usage.prompt_tokens == len(prompt)
        # more agents than sequences: calls wait for a free sequence instead of failing
        more = await asyncio.gather(*(p.achat(f"x{i}", conv("more"), max_tokens=2) for i in range(6)))
        assert len(more) == 6 and p.stats()["totals"]["resident"] == 4


async def test_achat_stream_yields_pieces_then_result(pool):
    items = [x async for x in pool.achat_stream("a", conv("hi"), max_tokens=6)]
    assert isinstance(items[-1], agentmem.ChatResult)
    assert "".join(i for i in items[:-1]) == items[-1].text


def test_ledger_regions_follow_roles(pool):
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f", "arguments": {"x": 1}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    pool.chat("a", msgs, max_tokens=1)
    regions = pool.stats()["agents"]["a"]["regions"]
    for r in ("system", "user", "tool_call", "tool_result", "assistant"):
        assert regions.get(r, 0) > 0, (r, regions)
    toks = np.asarray(pool.tokens("a"))
    assert toks.dtype.kind == "i"


def test_concurrent_tokenization_is_thread_safe(tiny_model_path):
    """Regression: tokenize/token_bytes shared one ctypes buffer across threads, so prompts
    rendered concurrently (outside the pool lock) could swap tokens."""
    from concurrent.futures import ThreadPoolExecutor

    with MemoryPool(tiny_model_path, n_ctx=512, resident_agents=1, n_batch=64, prefetch=False) as p:
        texts = [f"agent {i} says " + "word " * (i % 7 + 1) + str(i) * (i % 5 + 1) for i in range(64)]
        expected = [p.engine().model.tokenize(t) for t in texts]
        with ThreadPoolExecutor(8) as ex:
            for _ in range(20):
                assert list(ex.map(p.engine().model.tokenize, texts)) == expected
        pieces = {t: p.engine().model.token_bytes(t) for t in range(50)}
        p.engine().model._piece_cache.clear()
        with ThreadPoolExecutor(8) as ex:
            assert dict(zip(range(50), ex.map(p.engine().model.token_bytes, range(50)))) == pieces
