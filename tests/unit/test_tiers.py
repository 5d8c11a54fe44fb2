"""Tiers, placement, prefetch and durability of the pool (tiny synthetic model)."""

from __future__ import annotations

import logging

import pytest

from agentmem import ArchiveError, ConfigError, MemoryPool, PolicyError
from agentmem.memory.prefetch import TransitionPredictor
from agentmem.policy.placement import POLICIES, AgentInfo, get_policy, priority_weight


def conv(text: str, *more: str) -> list[dict]:
    msgs = [{"role": "system", "content": "you are a helpful bot"}, {"role": "user", "content": text}]
    for i, t in enumerate(more):
        msgs.append({"role": "assistant" if i % 2 == 0 else "user", "content": t})
    return msgs


def small_pool(path, **kw):
    opts = dict(n_ctx=1024, resident_agents=2, n_batch=64, prefetch=False)
    opts.update(kw)
    return MemoryPool(path, **opts)


# ---------------------------------------------------------------- policies
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_placement_contract(name):
    pol = get_policy(name)
    infos = [
        AgentInfo(id=f"a{i}", tier="warm", nbytes=(i + 1) * 10**6, n_tokens=100, priority=i % 3,
                  idle_s=float(10 - i), uses=i, next_in=float(i + 1))
        for i in range(6)
    ]
    order = pol.demotion_order(infos)
    assert sorted(x.id for x in order) == sorted(x.id for x in infos)
    assert pol.demotion_order(list(reversed(infos))) == order  # deterministic, input-order free
    for tier in ("warm", "cold"):
        assert isinstance(pol.codec_for(infos[0], tier), str)


def test_lru_demotes_least_recent_and_cost_prefers_background():
    mk = lambda i, idle, prio: AgentInfo(id=i, tier="warm", nbytes=10**6, n_tokens=10, priority=prio, idle_s=idle, uses=3, next_in=float("inf"))  # noqa: E731
    assert get_policy("lru").demotion_order([mk("new", 1, 1), mk("old", 50, 1)])[0].id == "old"
    cost = get_policy("cost")
    assert cost.demotion_order([mk("fg", 50, 3), mk("bg", 1, 0)])[0].id == "bg"
    assert cost.codec_for(mk("bg", 1, 0), "warm") == "q8_0"
    assert cost.codec_for(mk("fg", 1, 3), "warm") == "f16"


def test_policy_errors_list_valid_names():
    with pytest.raises(PolicyError, match="valid: cost, lfu, lru"):
        get_policy("mru")
    with pytest.raises(PolicyError, match="background"):
        priority_weight("urgent")


def test_predictor_learns_round_robin_and_selector():
    p = TransitionPredictor()
    for a in ["pm", "eng", "rev"] * 3:
        p.observe(a)
    assert p.predict("pm") == "eng" and p.predict("rev") == "pm"
    s = TransitionPredictor()
    for w in ["a", "b", "c", "a", "b"]:
        s.observe("selector")
        s.observe(w)
    assert s.predict("a") == "selector"
    assert s.predict("selector") is None  # no majority


# ---------------------------------------------------------------- durability
def test_restart_resumes_from_archive_without_prefill(tiny_model_path, tmp_path):
    db = str(tmp_path / "agents.db")
    follow = conv("tell me about cats", "ok", "more please")
    with small_pool(tiny_model_path, archive_path=db, cold_codec="f16") as p:
        p.chat("a", conv("tell me about cats"), max_tokens=6)
        p.chat("b", conv("dogs"), max_tokens=6)
        ref_tokens = p.tokens("a")
    with small_pool(tiny_model_path, archive_path=db, cold_codec="f16") as p:
        st = p.stats()
        assert st["agents"]["a"]["tier"] == "cold" and st["totals"]["resumed_agents"] == 2
        assert p.tokens("a") == ref_tokens
        r = p.chat("a", follow, max_tokens=6)
        assert r.kv == "restored" and r.usage.cached_tokens > 0
        assert p.stats()["tiers"]["cold"]["hits"] == 1
    with small_pool(tiny_model_path) as p:  # never restarted
        p.chat("a", conv("tell me about cats"), max_tokens=6)
        assert p.chat("a", follow, max_tokens=6).text == r.text


def test_other_config_reprefills_with_a_clear_log(tiny_model_path, tmp_path, caplog):
    db = str(tmp_path / "agents.db")
    with small_pool(tiny_model_path, archive_path=db) as p:
        ref = p.chat("a", conv("hello there"), max_tokens=4)
    with small_pool(tiny_model_path, archive_path=db, resident_agents=3) as p:  # n_seq_max differs
        with caplog.at_level(logging.WARNING, logger="agentmem"):
            r = p.chat("a", conv("hello there"), max_tokens=4)
        assert "falling back to re-prefill" in caplog.text and "n_seq_max" in caplog.text
        assert r.kv == "prefilled" and r.text == ref.text
        assert p.stats()["totals"]["restore_failures"] == 1


def test_second_pool_on_same_archive_is_refused(tiny_model_path, tmp_path):
    db = str(tmp_path / "agents.db")
    with small_pool(tiny_model_path, archive_path=db):
        with pytest.raises(ArchiveError, match="in use"):
            small_pool(tiny_model_path, archive_path=db)


def test_not_an_archive_is_a_clear_error(tiny_model_path, tmp_path):
    bad = tmp_path / "notes.db"
    bad.write_text("hello, I am not SQLite " * 100)
    with pytest.raises(ArchiveError, match="notes.db"):
        small_pool(tiny_model_path, archive_path=str(bad))


def test_park_to_cold_and_back(tiny_model_path, tmp_path):
    with small_pool(tiny_model_path, archive_path=str(tmp_path / "a.db"), cold_codec="f16") as p:
        p.chat("a", conv("one two"), max_tokens=3)
        p.park("a", "cold")
        assert p.stats()["agents"]["a"]["tier"] == "cold"
        r = p.chat("a", conv("one two", "x", "three"), max_tokens=3)
        assert r.kv == "restored"
        with pytest.raises(ConfigError, match="tier 'ice'"):
            p.park("a", "ice")


def test_warm_budget_demotes_to_cold_with_hysteresis(tiny_model_path, tmp_path):
    with small_pool(tiny_model_path, resident_agents=1, archive_path=str(tmp_path / "a.db"),
                    warm_budget_bytes=30_000, cold_codec="f16") as p:
        for i in range(5):
            p.chat(f"ag{i}", conv(f"agent number {i} talks about topic {i} at some length here"), max_tokens=4)
        st = p.stats()
        assert st["tiers"]["warm"]["bytes"] <= 30_000
        assert st["tiers"]["cold"]["agents"] >= 1 and st["totals"]["demotions"] >= 1
        r = p.chat("ag0", conv("agent number 0 talks about topic 0 at some length here", "ok", "go"), max_tokens=2)
        assert r.kv == "restored"


def test_warm_budget_without_archive_drops_state(tiny_model_path):
    with small_pool(tiny_model_path, resident_agents=1, warm_budget_bytes=20_000) as p:
        for i in range(4):
            p.chat(f"ag{i}", conv(f"agent {i} says a few words about topic {i}"), max_tokens=4)
        st = p.stats()
        assert st["totals"]["drops"] >= 1 and st["tiers"]["warm"]["bytes"] <= 20_000
        dropped = [k for k, v in st["agents"].items() if v["tier"] == "empty"]
        assert dropped
        r = p.chat(dropped[0], conv("hello"), max_tokens=2)
        assert r.kv == "prefilled"


def test_prefetch_restores_the_next_agent_ahead(tiny_model_path):
    with small_pool(tiny_model_path, resident_agents=2, prefetch=True) as p:
        team = ["pm", "eng", "rev"]
        for rnd in range(5):
            for a in team:
                p.chat(a, conv(f"{a} round {rnd}"), max_tokens=2)
                p.engine()._prefetcher.queue.join()  # let the prefetcher finish before the next call
        t = p.stats()["totals"]
        assert t["prefetches"] > 0 and t["prefetch_hits"] > 0
        assert 0 < t["prefetch_hit_rate"] <= 1


def test_priority_and_budget_setters_validate(tiny_model_path):
    with small_pool(tiny_model_path) as p:
        p.set_priority("a", "foreground")
        with pytest.raises(PolicyError):
            p.set_priority("a", "vip")
        with pytest.raises(ConfigError, match="budget"):
            p.set_budget("a", -5)
