"""The weights tier's logic (`agentmem.models.tier`, `policy`, `workflow`, `bindings`, `specs`) with fake pools.

The real models are in `tests/integration/test_models_real.py`; here each model is a
sparse file of a chosen size and its "pool" a fake that records checkpoints and closes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agentmem.config import PoolConfig
from agentmem.errors import (
    ArchiveError,
    ConfigError,
    ModelBudgetError,
    ModelMismatchError,
    PolicyError,
    PoolClosedError,
    UnknownModelError,
)
from agentmem.models.bindings import Bindings
from agentmem.models.policy import CostUnload, LruUnload, SlotView, unload_policy
from agentmem.models.specs import ModelSpec, specs_of
from agentmem.models.tier import ModelSlot, ModelTier
from agentmem.models.workflow import Workflow

MiB = 1 << 20


class FakeModel:
    def kv_bytes_per_cell(self, type_k: str, type_v: str) -> int:
        return 1024


class FakePool:
    def __init__(self, cfg: PoolConfig, log: list[str], *, fail_checkpoint: bool = False, parked: int = 0) -> None:
        self.cfg, self.log, self.fail_checkpoint, self.parked = cfg, log, fail_checkpoint, parked
        self.model, self.closed = FakeModel(), False
        log.append(f"open {Path(cfg.model_path or '').stem}")

    def checkpoint(self) -> None:
        if self.fail_checkpoint:
            raise ArchiveError("disk gone")
        self.log.append(f"checkpoint {Path(self.cfg.model_path or '').stem}")

    def close(self, timeout_s: float | None = None) -> None:
        self.closed = True
        self.log.append(f"close {Path(self.cfg.model_path or '').stem}")

    def stats(self) -> dict[str, Any]:
        return {"tiers": {"warm": {"bytes": self.parked}}, "shared": {"ram_bytes": 0}}


def _tier(tmp_path: Path, sizes: dict[str, int], budget: int, *, log: list[str] | None = None,
          policy: str = "cost", hints: dict[str, int] | None = None, wait_s: float = 0.3,
          make: Any = None, n_ctx: int = 1024) -> ModelTier:
    log = [] if log is None else log
    slots = {}
    for name, size in sizes.items():
        path = tmp_path / f"{name}.gguf"
        with open(path, "wb") as fh:
            fh.truncate(size)
        cfg = PoolConfig(model_path=str(path), n_ctx=n_ctx, archive_path=str(tmp_path / f"{name}.db"))
        slots[name] = ModelSlot(spec=ModelSpec(name=name, model=str(path)), config=cfg, model_path=path)
    return ModelTier(slots, ram_budget_bytes=budget, vram_budget_bytes=0, policy=unload_policy(policy),
                     next_step=lambda m: (hints or {}).get(m), on_load=lambda s: None, wait_s=wait_s,
                     open_pool=make or (lambda cfg: FakePool(cfg, log)))


def test_a_budget_for_one_model_unloads_the_other_after_writing_its_agents(tmp_path: Path) -> None:
    log: list[str] = []
    tier = _tier(tmp_path, {"a": 100 * MiB, "b": 100 * MiB}, 150 * MiB, log=log)
    tier.acquire("a")
    tier.release("a")
    tier.acquire("b")
    tier.release("b")
    assert log == ["open a", "checkpoint a", "close a", "open b"]
    assert tier.loaded() == ["b"] and tier.slots["a"].unloads == 1 and tier.slots["b"].loads == 1


def test_unlimited_budget_keeps_every_model(tmp_path: Path) -> None:
    log: list[str] = []
    tier = _tier(tmp_path, {"a": 100 * MiB, "b": 100 * MiB}, 0, log=log)
    for name in "abab":
        tier.acquire(name)
        tier.release(name)
    assert log == ["open a", "open b"] and sorted(tier.loaded()) == ["a", "b"]


def test_parked_kv_counts_against_the_budget(tmp_path: Path) -> None:
    """Two 40 MiB models fit 100 MiB, but not with 30 MiB of KV parked by the first."""
    log: list[str] = []
    tier = _tier(tmp_path, {"a": 40 * MiB, "b": 40 * MiB}, 100 * MiB, log=log,
                 make=lambda cfg: FakePool(cfg, log, parked=30 * MiB))
    tier.acquire("a")
    tier.release("a")
    tier.acquire("b")
    assert "close a" in log


def test_a_model_in_use_is_never_unloaded_and_the_call_waits_then_fails_typed(tmp_path: Path) -> None:
    tier = _tier(tmp_path, {"a": 100 * MiB, "b": 100 * MiB}, 150 * MiB, wait_s=0.3)
    tier.acquire("a")  # a call in flight on a
    t0 = time.monotonic()
    with pytest.raises(ModelBudgetError, match="stayed in use"):
        tier.acquire("b")
    assert time.monotonic() - t0 >= 0.25 and tier.loaded() == ["a"]


def test_a_waiting_call_proceeds_once_the_other_model_is_released(tmp_path: Path) -> None:
    log: list[str] = []
    tier = _tier(tmp_path, {"a": 100 * MiB, "b": 100 * MiB}, 150 * MiB, log=log, wait_s=10)
    tier.acquire("a")
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(tier.acquire("b")))
    t.start()
    time.sleep(0.2)
    assert not got  # waiting: a is in use
    tier.release("a")
    t.join(5)
    assert got and log[-1] == "open b" and tier.loaded() == ["b"]


def test_a_failed_checkpoint_keeps_the_victim_loaded_and_nothing_is_closed(tmp_path: Path) -> None:
    log: list[str] = []
    tier = _tier(tmp_path, {"a": 100 * MiB, "b": 100 * MiB}, 150 * MiB, log=log,
                 make=lambda cfg: FakePool(cfg, log, fail_checkpoint="/a." in cfg.model_path))
    tier.acquire("a")
    tier.release("a")
    with pytest.raises(ArchiveError):
        tier.acquire("b")
    assert "close a" not in log and tier.loaded() == ["a"] and tier.slots["b"].state == "unloaded"


def test_a_model_bigger_than_the_budget_is_refused_at_open(tmp_path: Path) -> None:
    with pytest.raises(ModelBudgetError, match="ram_budget_bytes"):
        _tier(tmp_path, {"a": 200 * MiB}, 100 * MiB)


def test_cost_policy_unloads_the_model_needed_furthest_ahead(tmp_path: Path) -> None:
    """Three models, room for two: loading c unloads the one whose agent is expected later."""
    log: list[str] = []
    tier = _tier(tmp_path, {"a": 60 * MiB, "b": 60 * MiB, "c": 60 * MiB}, 130 * MiB, log=log,
                 hints={"a": 1, "b": 5})
    for name in "ab":
        tier.acquire(name)
        tier.release(name)
    tier.acquire("c")
    assert "close b" in log and "close a" not in log


def test_lru_policy_unloads_the_least_recently_used(tmp_path: Path) -> None:
    log: list[str] = []
    tier = _tier(tmp_path, {"a": 60 * MiB, "b": 60 * MiB, "c": 60 * MiB}, 130 * MiB, log=log, policy="lru",
                 hints={"a": 1, "b": 5})
    for name in "ab":
        tier.acquire(name)
        tier.release(name)
    tier.acquire("c")
    assert "close a" in log and "close b" not in log


def test_close_refuses_new_uses_and_closes_loaded_pools(tmp_path: Path) -> None:
    log: list[str] = []
    tier = _tier(tmp_path, {"a": 10 * MiB}, 0, log=log)
    tier.acquire("a")
    tier.release("a")
    tier.close()
    assert log[-1] == "close a"
    with pytest.raises(PoolClosedError):
        tier.acquire("a")


def test_policies_order() -> None:
    views = [SlotView("x", reload_s=2.0, idle_s=1.0, next_step=None),
             SlotView("y", reload_s=0.1, idle_s=9.0, next_step=2),
             SlotView("z", reload_s=2.0, idle_s=5.0, next_step=1)]
    assert CostUnload().order(views) == ["x", "y", "z"]  # unhinted first, then by reload x 1/step
    assert LruUnload().order(views) == ["y", "z", "x"]
    with pytest.raises(PolicyError, match="cost, lru"):
        unload_policy("mru")


def test_workflow_hints_then_predictor() -> None:
    w = Workflow()
    for a in ["p", "c", "p", "c", "p"]:
        w.called(a)
    assert w.next_agent() == "c"  # p was followed by c twice in a row
    w.expect(["x", "y"])
    assert w.next_agent() == "x" and w.next_step(lambda a: a == "y") == 2
    assert w.order(lambda a: a != "x") == [["y"]]


def test_bindings_route_refuse_and_resume(tmp_path: Path) -> None:
    b = Bindings(["small", "big"], "small")
    assert b.route("a1", None) == "small" and b.route("a1", "small") == "small"
    with pytest.raises(ModelMismatchError) as e:
        b.route("a1", "big")
    assert (e.value.bound, e.value.asked) == ("small", "big") and "model" in str(e.value)
    with pytest.raises(UnknownModelError, match="holds small, big"):
        b.route("a2", "huge")
    with pytest.raises(UnknownModelError, match="not a model name"):
        b.route("a2", "x" * 10_000)  # a hostile name is not echoed
    b.drop("a1")
    assert b.route("a1", "big") == "big"


def test_specs_validate() -> None:
    assert specs_of({"m": "gemma-3-270m"})["m"].model == "gemma-3-270m"
    with pytest.raises(ConfigError, match="unknown PoolConfig"):
        ModelSpec(name="m", model="x", options={"n_ctxx": 1})
    with pytest.raises(ConfigError, match="set by the model pool"):
        ModelSpec(name="m", model="x", options={"archive_path": "/tmp/x"})
    with pytest.raises(ConfigError, match="non-empty"):
        specs_of({})
    spec = ModelSpec(name="m", model="x", options={"n_ctx": 512})
    assert ModelSpec.from_dict(spec.to_dict()) == spec
