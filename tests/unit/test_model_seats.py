"""`agentmem.models.seats`: one call's model for the integrations, on a fake model pool.

The integrations' own tests (`test_*_models.py`) run their calls through these seats;
here are the seats themselves: a `MemoryPool` as it is, a lease on a `ModelPool`'s
model, the typed errors, a lease taken for a coroutine cancelled while its model
loads (released, never leaked), and the memories' seat (`memory_seat`, `recall_on`:
the agent's model, nothing bound, no call counted).
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from agentmem import PoolConfig
from agentmem.errors import ConfigError, ModelMismatchError, UnknownModelError
from agentmem.models import aseat, seat
from agentmem.models.seats import alease, check_model, hold_pools, memory_seat, model_for, model_name
from agentmem.tools import hold_pool
from agentmem.models.seats import recall_on
from tests.fixtures.model_pools import FakeModelPool


class Recorder:
    """A model's pool as far as hints go: it records `hold` and `expect`."""

    closed = False

    def __init__(self, name: str) -> None:
        self.config = PoolConfig(n_ctx=256 if name == "a" else 512, model_path=f"/models/{name}.gguf")
        self.model_path = f"/models/{name}-q4.gguf"
        self.calls: list[tuple[Any, ...]] = []

    def hold(self, agent_id: str, *, ttl_s: float | None = None) -> None:
        self.calls.append(("hold", agent_id, ttl_s))

    def expect(self, order: Any, *, soon: bool = True, scope: str | None = None) -> None:
        self.calls.append(("expect", order, scope))


class Archive(Recorder):
    """A model's pool as far as recall goes: one evicted span over a one-line history, searches recorded."""

    history = "The vault password is marmalade."

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.model = SimpleNamespace(detokenize=lambda tokens: "".join(chr(t) for t in tokens))

    def recall(self, agent_id: str, query: str, k: int = 5) -> list[Any]:
        self.calls.append(("recall", agent_id, query))
        return [SimpleNamespace(start=4, end=18, score=1.0, region=0)]

    def history_tokens(self, agent_id: str) -> list[int]:
        return [ord(c) for c in self.history]


@pytest.fixture
def team() -> FakeModelPool:
    return FakeModelPool({"a": Recorder("a"), "b": Recorder("b")})


@pytest.fixture
def archives() -> FakeModelPool:
    return FakeModelPool({"a": Archive("a"), "b": Archive("b")})


def test_a_pool_of_ones_seat_is_its_models_engine_taken_at_once() -> None:
    pool = FakeModelPool({"a": Recorder("a")})
    engine = pool.tier.slots["a"].pool
    with seat(pool, "x") as lease:
        assert lease.pool is engine and lease.name == "a" and lease.agent_id == "x"
    assert lease.released and pool.fake_tier.held == 0
    lease = asyncio.run(aseat(pool, "x"))
    assert lease.pool is engine
    lease.release()
    assert pool.fake_tier.held == 0


def test_a_model_pool_seat_binds_the_agent_and_holds_its_model_until_released(team: FakeModelPool) -> None:
    with seat(team, "planner", model="b") as lease:
        assert (lease.name, lease.pool) == ("b", team.tier.slots["b"].pool)
        assert team.fake_tier.uses["b"] == 1
    assert team.fake_tier.held == 0 and team.model_of("planner") == "b"
    with seat(team, "planner") as lease:  # bound: no model needed
        assert lease.name == "b"
    with seat(team, "coder") as lease:  # new, no model: the default
        assert lease.name == "a"
    assert team.fake_tier.held == 0


def test_a_bound_agent_on_another_model_is_refused_and_holds_nothing(team: FakeModelPool) -> None:
    team.bind("planner", "b")
    with pytest.raises(ModelMismatchError) as info:
        seat(team, "planner", model="a")
    assert (info.value.bound, info.value.asked) == ("b", "a")
    with pytest.raises(ModelMismatchError):
        asyncio.run(aseat(team, "planner", model="a"))
    assert team.fake_tier.held == 0


def test_check_model_and_hold_pools_accept_a_model_pool_only_with_its_names(team: FakeModelPool) -> None:
    assert check_model(team, None) is None and check_model(team, "b") == "b"
    with pytest.raises(UnknownModelError):
        check_model(team, "c")
    with pytest.raises(UnknownModelError, match="model: no model 'b'"):
        check_model(FakeModelPool({"a": Recorder("a")}), "b")
    with pytest.raises(ConfigError, match="model: 'b' names a model of the pool given as pool="):
        check_model(None, "b")
    with pytest.raises(ConfigError, match="model"):  # checked before a shared pool is opened
        hold_pools(None, {"n_ctx": 256}, lambda cfg: pytest.fail("opened a pool"), model="b")
    assert hold_pools(team, None, lambda cfg: None, model="a") == (team, False)
    with pytest.raises(ValueError, match="either"):
        hold_pools(team, {"n_ctx": 256}, lambda cfg: None)
    with pytest.raises(TypeError, match="must be an agentmem.MemoryPool, got str"):
        hold_pools("pool", None, lambda cfg: None)
    with pytest.raises(TypeError, match="must be an agentmem.MemoryPool, got FakeModelPool"):
        hold_pool(team, None, lambda cfg: None, pool_type=type(None))


def test_model_for_reads_the_binding_then_the_model_then_the_default(team: FakeModelPool) -> None:
    assert model_for(team, "new", None) == "a" and model_for(team, "new", "b") == "b"
    team.bind("x", "b")
    assert model_for(team, "x", "a") == "b" and model_name(team, "x", None) == "b"
    assert model_for(team, None, None) == "a" and team.model_of("new") is None  # nothing bound by reading
    one = FakeModelPool({"a-q4": Recorder("a")})  # a pool of one: every agent is its model's
    assert model_for(one, "x", None) == "a-q4" and model_name(one, "x", None) == "a-q4"
    assert team.config_of("b").n_ctx == 512


def test_hold_and_scoped_expect_reach_the_agents_model(team: FakeModelPool) -> None:
    team.bind("x", "b")
    team.hold("x", ttl_s=3.0)
    team.hold("unknown")  # no agent, no model: nothing to hold
    team.expect(["x", "y"], scope="thread-1")
    a, b = team.tier.slots["a"].pool, team.tier.slots["b"].pool
    assert ("hold", "x", 3.0) in b.calls and not [c for c in a.calls if c[0] == "hold"]
    assert ("expect", [["x"]], "thread-1") in b.calls
    assert team.fake_tier.held == 0


def test_a_lease_taken_after_its_caller_was_cancelled_is_released() -> None:
    """The server's `_leased` logic, now `alease`: the load finishes in its thread, the lease ends there."""
    team = FakeModelPool({"a": Recorder("a")})
    loading = threading.Event()

    def slow_lease() -> Any:
        loading.set()
        time.sleep(0.2)  # the model loads
        return team.lease("x")

    async def main() -> None:
        task = asyncio.create_task(alease(slow_lease))
        while not loading.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())  # asyncio.run waits for the default executor's thread
    assert team.fake_tier.log == [("acquire", "a"), ("release", "a")]



def test_a_memory_seat_holds_the_bound_agents_model_and_binds_nothing(archives: FakeModelPool) -> None:
    plain = FakeModelPool({"a": Archive("a")})
    with memory_seat(plain, "x") as lease:  # type: ignore[union-attr]
        assert lease.pool is plain.tier.slots["a"].pool and lease.name == "a"
    assert memory_seat(archives, "new", model="b") is None  # bound to no model: no memory anywhere
    assert archives.model_of("new") is None and archives.fake_tier.log == []
    archives.bind("x", "b")
    seat_b = memory_seat(archives, "x")
    assert seat_b is not None and seat_b.pool is archives.tier.slots["b"].pool
    assert (seat_b.name, seat_b.agent_id) == ("b", None)
    assert archives.fake_tier.uses["b"] == 1
    seat_b.release()
    assert archives.fake_tier.log == [("acquire", "b"), ("release", "b")]
    assert archives.workflow._last is None, "a memory's seat is no call of the agent"


def test_recall_on_searches_the_agents_model_and_releases_it(archives: FakeModelPool) -> None:
    archives.bind("x", "b")
    spans = recall_on(archives, "x", "the vault password?", 2, model="b")
    assert [text for text, _ in spans] == ["The vault password is marmalade."]
    a, b = archives.tier.slots["a"].pool, archives.tier.slots["b"].pool
    assert ("recall", "x", "the vault password?") in b.calls and not a.calls
    assert archives.fake_tier.held == 0 and archives.fake_tier.log == [("acquire", "b"), ("release", "b")]
    assert recall_on(archives, "x", "what is it", 2) == []  # no word to search: no seat taken
    assert recall_on(archives, "unbound", "the vault password", 2) == [] and archives.model_of("unbound") is None
    assert len(archives.fake_tier.log) == 2
    plain = FakeModelPool({"a": Archive("a")})
    assert recall_on(plain, "x", "vault", 1)[0][0] == "The vault password is marmalade."


def test_recall_on_another_model_for_a_bound_agent_is_refused_and_holds_nothing(archives: FakeModelPool) -> None:
    archives.bind("x", "b")
    with pytest.raises(ModelMismatchError) as info:
        recall_on(archives, "x", "the vault password", 2, model="a")
    assert (info.value.agent_id, info.value.bound, info.value.asked) == ("x", "b", "a")
    assert archives.fake_tier.log == [] and not archives.tier.slots["a"].pool.calls
