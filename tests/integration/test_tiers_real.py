"""Tiers on the real default model: restart-resume from the archive, WARM budget demotion to COLD.

``cold_codec="f16"`` keeps archived states bit-exact, so a resumed agent must
answer exactly like one that never left memory (greedy decoding).
"""

from __future__ import annotations

import pytest

from agentmem import MemoryPool

pytestmark = pytest.mark.integration

# one thread: the steadiest on a busy 2-core machine
OPTS = {"n_ctx": 2048, "resident_agents": 2, "cold_codec": "f16", "prefetch": False, "n_threads": 1}


def history(agent: str, n_turns: int) -> list[dict]:
    system = f"You are the {agent} of a small software team. Answer in one short sentence."
    msgs = [{"role": "system", "content": system}]
    for i in range(n_turns):
        msgs.append({"role": "user", "content": f"Step {i}: what should the {agent} check about release item {i}?"})
        reply = f"The {agent} checks that item {i} is complete, reviewed and tested."
        msgs.append({"role": "assistant", "content": reply})
    msgs.append({"role": "user", "content": "Summarise your job in one sentence."})
    return msgs


def follow_up(msgs: list[dict], reply: str) -> list[dict]:
    return msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "What do you check first?"}]


def test_restart_resumes_from_archive_without_prefill(default_model_path, tmp_path):
    db = tmp_path / "agents.db"
    hist = history("planner", 6)  # ~230 tokens
    with MemoryPool(default_model_path, archive_path=str(db), **OPTS) as p:
        first = p.chat("planner", hist, max_tokens=16)
        n_hist = p.count_tokens(hist)
    follow = follow_up(hist, first.text)

    with MemoryPool(default_model_path, archive_path=str(db), **OPTS) as p:  # the "restarted" process
        assert p.stats()["agents"]["planner"]["tier"] == "cold"
        resumed = p.chat("planner", follow, max_tokens=24)
        totals = p.stats()["totals"]

    with MemoryPool(default_model_path, **OPTS) as p:  # never restarted, no archive
        ref_first = p.chat("planner", hist, max_tokens=16)
        ref = p.chat("planner", follow, max_tokens=24)

    new = resumed.usage.prompt_tokens - resumed.usage.cached_tokens
    assert resumed.kv == "restored", resumed.kv
    assert resumed.usage.cached_tokens >= n_hist, f"{resumed.usage.cached_tokens=}, {n_hist=}"
    assert new < 40, f"only the new turn is decoded, got {new=}"
    assert totals["restores"] == 1 and totals["prefill_tokens"] == new, totals
    assert ref_first.text == first.text
    assert resumed.text == ref.text, f"{resumed.text=!r} != {ref.text=!r}"


def test_warm_budget_demotes_to_cold_and_the_demoted_agent_restores(gemma_model_path, tmp_path):
    """WARM budget demotion, on Gemma only (the suite's time, issue #36): placement and budgets do
    not depend on the model, and an f16 COLD restore's exactness on Qwen2.5 is
    test_restart_resumes_from_archive_without_prefill's."""
    names = ("alpha", "bravo", "delta")
    hists = {n: history(n, 3) for n in names}
    # reference: the f16 state size of one agent, and its reply when never parked
    with MemoryPool(gemma_model_path, **{**OPTS, "resident_agents": 1}) as p:
        r = p.chat("alpha", hists["alpha"], max_tokens=12)
        size = p.stats()["agents"]["alpha"]["bytes"]
        ref = p.chat("alpha", follow_up(hists["alpha"], r.text), max_tokens=16)
    assert size > 1_000_000, size

    # room for ~1.6 states. After each call WARM keeps room for the state the next switch
    # would park (delta's, ~1 state), so at most ~0.6 states stay in RAM: with delta live,
    # alpha and bravo are both in the archive, and no demotion ran inside a call
    budget = int(1.6 * size)
    with MemoryPool(
        gemma_model_path,
        archive_path=str(tmp_path / "a.db"),
        resident_agents=1,
        placement="lru",
        warm_budget_bytes=budget,
        **{k: v for k, v in OPTS.items() if k != "resident_agents"},
    ) as p:
        replies = {n: p.chat(n, hists[n], max_tokens=12).text for n in names}  # alpha, then bravo get parked
        st = p.stats()
        tiers = {n: st["agents"][n]["tier"] for n in names}
        assert tiers == {"alpha": "cold", "bravo": "cold", "delta": "hot"}, tiers
        assert st["totals"]["demotions"] == 2 and st["totals"]["drops"] == 0, st["totals"]
        assert st["totals"]["warm_bytes"] <= budget, (st["totals"]["warm_bytes"], budget)
        assert st["agents"]["alpha"]["codec"] == "f16" and st["tiers"]["cold"]["bytes"] > 0
        back = p.chat("alpha", follow_up(hists["alpha"], replies["alpha"]), max_tokens=16)
        assert p.stats()["tiers"]["cold"]["hits"] == 1
        n_hist = p.count_tokens(hists["alpha"])
    assert replies["alpha"] == r.text
    assert back.kv == "restored", back.kv
    assert back.usage.cached_tokens >= n_hist, f"{back.usage.cached_tokens=}, {n_hist=}"
    assert back.text == ref.text, f"{back.text=!r} != {ref.text=!r}"
