"""The weights tier: which models are loaded, under one memory budget with the parked KV.

A `ModelSlot` is one model: unloaded (its agents' KV in its archive file), loading,
loaded (a `ModelEngine`: weights mmap'd, a llama.cpp context, parked KV in RAM) or
unloading. `ModelTier.acquire(name)` hands out a loaded model's pool for one call
(loading it first when needed) and `release(name)` ends the use; a model in use is
never unloaded.

**The budget.** `ram_budget_bytes` covers, together, the weights and live context of
every loaded model and the KV parked in RAM by their agents (`vram_budget_bytes`, on a
CUDA/Metal build, covers the weights and live KV of models with `n_gpu_layers != 0`
instead; parked KV is always host RAM). A model that does not fit makes room by
unloading idle models in the order of the unload policy (`agentmem.models.policy`).

**Nothing is lost.** Unloading a model first writes every agent of it — live and
parked — to its archive (`ModelEngine.checkpoint`), and only then closes the engine; a
failed write keeps the model loaded. When the model returns, its agents are restored
from there (a state restore, not a re-prefill).

Loading and unloading run outside the tier's lock: calls on other loaded models go on.

**Fair loading.** A call waiting for a model that does not fit until a loaded model's calls
end is not starved by a stream of new calls on that model (#33 F2: one tenant's overlapping
calls on model 2 held off another tenant's model-1 call for as long as they went on): while
such a load waits, a new call of a loaded model waits too (it joins the queue instead of
overtaking), the uses drain, the load goes ahead, and the calls behind it take
their turn. A wait still ends after `wait_s` (`ModelBudgetError`: the server's 503 with
`Retry-After`). Prefetches never make anyone wait.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agentmem.config import PoolConfig
from agentmem.errors import ModelBudgetError, PoolClosedError
from agentmem.memory.tiers import WARM
from agentmem.models.policy import SlotView, UnloadPolicy
from agentmem.models.specs import ModelSpec, footprint
from agentmem.pool import ModelEngine

__all__ = ["ModelSlot", "ModelTier"]

logger = logging.getLogger(__name__)

_LOAD_BYTES_PER_S = 400 << 20  # first guess of a load's speed, before one was measured


@dataclass
class ModelSlot:
    """One model of the tier and what the tier knows of it."""

    spec: ModelSpec
    config: PoolConfig
    model_path: Path
    state: str = "unloaded"  # unloaded | loading | loaded | unloading
    pool: ModelEngine | None = None
    uses: int = 0
    weights_bytes: int = 0
    ctx_bytes: int = 0  # known once loaded
    load_s: float = 0.0  # the last load's seconds
    loads: int = 0
    unloads: int = 0
    prefetch_loads: int = 0
    last_used: float = field(default_factory=time.monotonic)

    @property
    def on_gpu(self) -> bool:
        return self.config.n_gpu_layers != 0

    @property
    def reload_s(self) -> float:
        return self.load_s or self.weights_bytes / _LOAD_BYTES_PER_S

    def view(self, now: float, next_step: int | None) -> SlotView:
        return SlotView(self.spec.name, self.reload_s, now - self.last_used, next_step)


class ModelTier:
    """Loads and unloads the models of a `MemoryPool` within its budgets (see the module docstring).

    Args:
        slots: the models, by name.
        ram_budget_bytes: host RAM for weights, live contexts and parked KV (`0` = unlimited).
        vram_budget_bytes: VRAM for the weights and live KV of offloaded models (`0` = unlimited).
        policy: the unload order.
        next_step: how many expected calls ahead a model is needed (`None`: not hinted).
        on_load: called with the slot after each load (the model pool re-applies hints).
        wait_s: how long an `acquire` waits for models in use to free the memory it needs.
        open_pool: opens a model's engine from its config (`ModelEngine`; tests pass a fake).
    """

    def __init__(self, slots: dict[str, ModelSlot], *, ram_budget_bytes: int, vram_budget_bytes: int,
                 policy: UnloadPolicy, next_step: Callable[[str], int | None],
                 on_load: Callable[[ModelSlot], None], wait_s: float,
                 open_pool: Callable[[PoolConfig], Any] = lambda cfg: ModelEngine(config=cfg)) -> None:
        self.slots, self.policy, self.next_step, self.on_load = slots, policy, next_step, on_load
        self.open_pool = open_pool
        self.ram_budget, self.vram_budget, self.wait_s = ram_budget_bytes, vram_budget_bytes, wait_s
        self.cond = threading.Condition()
        self.closed = False
        self._waiting: dict[str, int] = {}  # unloaded model -> calls waiting for room to load it (fair loading)
        for slot in slots.values():
            slot.weights_bytes = slot.model_path.stat().st_size
            self._check_fits_alone(slot)

    # ------------------------------------------------------------------ use
    def acquire(self, name: str, *, prefetch: bool = False) -> ModelEngine:
        """`name`'s pool, loaded, counted in use until `release(name)` (fair to waiting loads: see above)."""
        slot = self.slots[name]
        deadline = time.monotonic() + self.wait_s
        queued = False
        with self.cond:
            try:
                while True:
                    if self.closed:
                        raise PoolClosedError("the model pool is closed")
                    if slot.state == "loaded" and not self._yields(slot):
                        assert slot.pool is not None
                        slot.uses += 1
                        return slot.pool
                    if slot.state == "unloaded":
                        victims = self._room_for(slot)
                        if victims is not None:
                            for v in victims:
                                v.state = "unloading"
                            slot.state = "loading"
                            break
                        if not prefetch and not queued:
                            self._waiting[name] = self._waiting.get(name, 0) + 1
                            queued = True
                    left = deadline - time.monotonic()
                    if left <= 0 or not self.cond.wait(timeout=min(left, 1.0)) and time.monotonic() >= deadline:
                        raise ModelBudgetError(
                            f"model {name!r} does not fit ram_budget_bytes={self.ram_budget} / vram_budget_bytes="
                            f"{self.vram_budget} and the models that could make room stayed in use for {self.wait_s} s")
            finally:
                if queued:
                    self._waiting[name] -= 1
                    if not self._waiting[name]:
                        del self._waiting[name]
                    self.cond.notify_all()
        return self._load(slot, victims, prefetch)

    def _yields(self, slot: ModelSlot) -> bool:
        """Whether a new call of the loaded `slot` waits: a call waits to load another model (the waiter may
        need `slot`'s room; it takes it as soon as `slot`'s calls in flight end)."""
        return any(n != slot.spec.name for n in self._waiting)

    def try_acquire(self, name: str) -> ModelEngine | None:
        """`name`'s pool if it is loaded now, counted in use until `release(name)`; `None` (nothing held) otherwise.

        Never loads: for reading a model's state without moving the budget (a listing).
        """
        with self.cond:
            slot = self.slots[name]
            if self.closed or slot.state != "loaded" or slot.pool is None:
                return None
            slot.uses += 1
            return slot.pool

    def release(self, name: str) -> None:
        """End one use of `name` (the model may be unloaded once no call uses it)."""
        with self.cond:
            slot = self.slots[name]
            slot.uses = max(0, slot.uses - 1)
            slot.last_used = time.monotonic()
            self.cond.notify_all()

    def loaded(self) -> list[str]:
        with self.cond:
            return [n for n, s in self.slots.items() if s.state == "loaded"]

    # ------------------------------------------------------------------ load / unload
    def _load(self, slot: ModelSlot, victims: list[ModelSlot], prefetch: bool) -> ModelEngine:
        """Unload `victims`, then open `slot`'s pool (both marked by `acquire`); one use of it taken."""
        try:
            for v in victims:
                self._unload(v)
            t0 = time.perf_counter()
            pool = self.open_pool(slot.config)
            load_s = time.perf_counter() - t0
        except BaseException:
            with self.cond:
                slot.state = "unloaded"
                for v in victims:
                    if v.state == "unloading":
                        v.state = "loaded"
                self.cond.notify_all()
            raise
        _, ctx_bytes = footprint(slot.model_path, slot.config,
                                 pool.model.kv_bytes_per_cell(slot.config.type_k, slot.config.type_v))
        with self.cond:
            if self.closed:  # closed while it loaded: nobody will use it
                slot.state = "unloaded"
                self.cond.notify_all()
                pool.close()
                raise PoolClosedError("the model pool is closed")
            slot.pool, slot.state, slot.ctx_bytes, slot.load_s = pool, "loaded", ctx_bytes, load_s
            slot.loads += 1
            slot.prefetch_loads += int(prefetch)
            slot.uses += 1
            slot.last_used = time.monotonic()
            self.cond.notify_all()
        logger.info("model %s loaded in %.2f s (%s%s)", slot.spec.name, load_s,
                    "prefetched, " if prefetch else "", ", ".join(v.spec.name for v in victims) + " unloaded"
                    if victims else "nothing unloaded")
        self.on_load(slot)
        return pool

    def _unload(self, slot: ModelSlot) -> None:
        """Write every agent of `slot` to its archive, then close its pool (marked `unloading`)."""
        pool = slot.pool
        assert pool is not None
        t0 = time.perf_counter()
        pool.checkpoint()  # raises, and the model stays loaded, when its agents cannot be stored
        pool.close()
        with self.cond:
            slot.pool, slot.state = None, "unloaded"
            slot.unloads += 1
            self.cond.notify_all()
        logger.info("model %s unloaded in %.2f s (its agents are in %s)", slot.spec.name,
                    time.perf_counter() - t0, slot.config.archive_path)

    def unload(self, name: str) -> bool:
        """Unload `name` now if it is loaded and idle; False otherwise."""
        with self.cond:
            slot = self.slots[name]
            if slot.state != "loaded" or slot.uses:
                return False
            slot.state = "unloading"
        try:
            self._unload(slot)
        except BaseException:
            with self.cond:
                slot.state = "loaded"
                self.cond.notify_all()
            raise
        return True

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until no load or unload is under way (a prefetch included); False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while any(s.state in ("loading", "unloading") for s in self.slots.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(timeout=left)
        return True

    def close(self, timeout_s: float = 60.0) -> None:
        """Refuse new uses, wait (up to `timeout_s`) for loads and unloads under way, close every engine.

        Each engine's `close` gets what is left of `timeout_s` for its calls in flight
        (`0`: it does not wait; the last call out frees the native handles).
        """
        deadline = time.monotonic() + timeout_s
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            while any(s.state in ("loading", "unloading") for s in self.slots.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    logger.warning("closing the model pool with a load or unload still under way")
                    break
                self.cond.wait(timeout=left)
            pools = [s.pool for s in self.slots.values() if s.pool is not None]
            for s in self.slots.values():
                if s.pool is not None:
                    s.pool, s.state = None, "unloaded"
        for pool in pools:
            pool.close(timeout_s=max(0.0, deadline - time.monotonic()))  # writes its agents to its archive

    # ------------------------------------------------------------------ the budget
    def _cost(self, slot: ModelSlot) -> tuple[int, int]:
        """`(RAM, VRAM)` bytes `slot` takes loaded (its parked KV counted apart)."""
        live = slot.weights_bytes + slot.ctx_bytes
        return (0, live) if slot.on_gpu else (live, 0)

    def _room_for(self, slot: ModelSlot) -> list[ModelSlot] | None:
        """The idle models to unload so `slot` fits (`[]`: it fits), `None`: wait for models in use."""
        need_ram, need_vram = self._cost(slot)
        held = [s for s in self.slots.values() if s is not slot and s.state in ("loaded", "loading", "unloading")]
        ram = sum(self._cost(s)[0] + self._parked(s) for s in held)
        vram = sum(self._cost(s)[1] for s in held)
        now = time.monotonic()
        idle = {s.spec.name: s for s in held if s.state == "loaded" and not s.uses}
        order = self.policy.order([s.view(now, self.next_step(s.spec.name)) for s in idle.values()])
        victims: list[ModelSlot] = []
        for name in [None, *order]:
            if name is not None:
                v = idle[name]
                victims.append(v)
                ram -= self._cost(v)[0] + self._parked(v)
                vram -= self._cost(v)[1]
            if self._fits(ram + need_ram, vram + need_vram):
                return victims
        return None

    def _fits(self, ram: int, vram: int) -> bool:
        return (not self.ram_budget or ram <= self.ram_budget) and (not self.vram_budget or vram <= self.vram_budget)

    @staticmethod
    def _parked(slot: ModelSlot) -> int:
        """Bytes of KV parked in RAM by `slot`'s agents (0 when not loaded)."""
        pool = slot.pool
        if pool is None or pool.closed:
            return 0
        st = pool.stats()
        return int(st["tiers"][WARM]["bytes"]) + int(st["shared"]["ram_bytes"])

    def _check_fits_alone(self, slot: ModelSlot) -> None:
        ram, vram = self._cost(slot)
        if not self._fits(ram, vram):
            raise ModelBudgetError(
                f"model {slot.spec.name!r} alone needs {ram or vram} bytes of weights, more than "
                f"{'ram_budget_bytes' if ram else 'vram_budget_bytes'}={self.ram_budget if ram else self.vram_budget}")
