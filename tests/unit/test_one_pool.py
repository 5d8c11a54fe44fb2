"""One pool for one model or many (issue 32): the same API, every operation on the agent's model.

On the tiny random-weight `llama` GGUF, as a pool of one and as a pool of two models
(`a`, `b`: the same file, two contexts). Nothing here checks the generated text: only
where each operation ran and that the pool of many offers what the pool of one does.
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest

import agentmem
from agentmem import MemoryPool, ModelPool
from agentmem.errors import ModelMismatchError, UnknownAgentError, UnknownModelError
from agentmem.pool import ModelEngine

#: the engine's native handles and its wiring: what the pool reaches through `engine(model)`
_ENGINE_ONLY = {"ctx", "model", "fingerprint"}

MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say a colour."}]


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


@pytest.fixture(scope="module")
def team(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemoryPool]:
    with MemoryPool(models={"a": str(tiny_model_path), "b": str(tiny_model_path)}, n_ctx=512, resident_agents=2,
                    n_batch=64, n_threads=1, agent_budget_tokens=0,
                    archive_dir=tmp_path_factory.mktemp("one-pool")) as pool:
        yield pool


def test_the_pool_offers_every_public_name_of_a_models_engine() -> None:
    """Regression: the pool of many had no `complete`, `share`, `handoff`, `pin`, `recall`, `find_line`... (issue 32)."""
    missing = _public(ModelEngine) - _public(MemoryPool) - _ENGINE_ONLY
    assert not missing, f"MemoryPool lacks {sorted(missing)}"
    for name in ("chat", "chat_stream", "complete", "complete_stream", "achat", "acomplete", "achat_stream",
                 "acomplete_stream", "share", "find_line", "count_tokens", "set_budget", "set_priority", "handoff"):
        assert "model" in inspect.signature(getattr(MemoryPool, name)).parameters, name


def test_a_single_model_is_a_pool_of_one(tiny_model_path: Path) -> None:
    with MemoryPool(tiny_model_path, n_ctx=512, resident_agents=2, n_batch=64, n_threads=1) as pool:
        assert pool.names == (tiny_model_path.stem,) and pool.model_of("anyone") == tiny_model_path.stem
        r = pool.chat("x", MSGS, max_tokens=2)
        assert r.kv == "prefilled" and pool.agents() == ["x"]
        assert pool.stats()["agents"]["x"]["tier"] == "hot" and pool.stats()["models"][0]["state"] == "loaded"
        with pytest.raises(UnknownModelError):
            pool.chat("y", MSGS, model="other", max_tokens=1)


def test_agent_operations_run_on_the_agents_model(team: MemoryPool) -> None:
    team.chat("op-a", MSGS, model="a", max_tokens=2)
    team.complete("op-b", "Once upon a time", model="b", max_tokens=2)
    assert (team.model_of("op-a"), team.model_of("op-b")) == ("a", "b")
    on_a, on_b = team.engine("a").agents(), team.engine("b").agents()
    assert "op-a" in on_a and "op-a" not in on_b and "op-b" in on_b and "op-b" not in on_a
    assert team.pin("op-a", 0) > 0
    assert team.tokens("op-a") == team.engine("a").tokens("op-a")
    assert team.history_tokens("op-b") == team.engine("b").history_tokens("op-b")
    team.set_budget("op-new", 256, model="b")  # creates and binds, like a first call
    assert team.model_of("op-new") == "b"
    team.park("op-a")
    assert team.engine("a").stats()["agents"]["op-a"]["tier"] == "warm"
    assert team.recall("op-a", "colour") == [] and team.recall("nobody", "colour") == []
    assert team.share("brief", MSGS[:1], model="b") > 0 and "share:brief" in team.engine("b").agents()
    card = team.handoff("op-b", "op-b2")
    assert card is not None and team.model_of("op-b2") == "b"
    with pytest.raises(ModelMismatchError):
        team.handoff("op-b", "op-a")  # op-a lives on a
    line = team.find_line(MSGS, model="a", claim=True)
    team.release_line(line.agent_id)
    assert team.count_tokens(MSGS, model="a") == team.engine("a").count_tokens(MSGS)
    assert {"op-a", "op-b", "op-b2", "op-new"} <= set(team.agents())
    team.forget("op-b2")
    assert team.model_of("op-b2") is None and "op-b2" not in team.engine("b").agents()
    with pytest.raises(UnknownAgentError):
        team.forget("op-b2")


def test_async_calls_and_streams_route_like_chat(team: MemoryPool) -> None:
    async def main() -> list[Any]:
        r = await team.achat("as-a", MSGS, model="a", max_tokens=2)
        items = [x async for x in team.achat_stream("as-a", MSGS, max_tokens=2)]
        done = await team.acomplete("as-b", "Hello", model="b", max_tokens=1)
        return [r, items[-1], done]

    first, streamed, done = asyncio.run(main())
    assert first.agent_id == streamed.agent_id == "as-a" and streamed.kv == "reused"
    assert team.model_of("as-b") == "b" and done.agent_id == "as-b"


def test_the_old_names_still_work_and_warn(tiny_model_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match="MemoryPool\\(models=...\\)"):
        old = ModelPool({"only": str(tiny_model_path)}, n_ctx=256, resident_agents=1, n_threads=1)
    with old:
        assert isinstance(old, MemoryPool) and old.names == ("only",)
        with pytest.warns(DeprecationWarning, match="engine"):
            assert old.pool("only") is old.engine("only")
    with pytest.warns(DeprecationWarning, match="ModelEngine"):
        from agentmem.pool import MemoryPool as OldEngine
    assert OldEngine is ModelEngine
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert agentmem.MemoryPool is MemoryPool  # the public name itself does not warn


def test_stats_has_one_shape_for_one_model_or_many(tiny_model_path: Path, team: MemoryPool) -> None:
    """Regression: `stats()` of a pool of one had the engine's keys, of many `{"pools", "agents": n}` (issue 32)."""
    team.chat("st-a", MSGS, model="a", max_tokens=2)
    team.chat("st-b", MSGS, model="b", max_tokens=2)
    with MemoryPool(tiny_model_path, n_ctx=512, resident_agents=2, n_batch=64, n_threads=1) as one:
        one.chat("x", MSGS, max_tokens=2)
        single, many = one.stats(), team.stats()
        assert set(single) == set(many)
        engine = one.engine().stats()
        assert single["agents"]["x"] == {**engine["agents"]["x"], "model": tiny_model_path.stem}
        assert single["totals"] == engine["totals"] and single["tiers"] == engine["tiers"]
    # pool-wide: each agent tagged with its model, counters summed over the models
    assert many["agents"]["st-a"]["model"] == "a" and many["agents"]["st-b"]["model"] == "b"
    per = [many["pools"][m]["totals"] for m in ("a", "b")]
    assert many["totals"]["agents"] == per[0]["agents"] + per[1]["agents"]
    assert many["totals"]["n_ctx"] == per[0]["n_ctx"] + per[1]["n_ctx"]
    assert many["totals"]["kv_layout"] == per[0]["kv_layout"]
    hints = [many["pools"][m]["hints"] for m in ("a", "b")]
    expected = hints[0]["expected"] + hints[1]["expected"]
    assert many["hints"]["hit_rate"] == ((hints[0]["hits"] + hints[1]["hits"]) / expected if expected else 0.0)
