"""`MemoryPool`'s workflow hints across its models: `expect`, `hold`, `unhold`, and the model prefetch.

`expect` is validated once (`agentmem.pool.hints.check_expected`), kept as the pool's
expected order (`agentmem.models.workflow`), and each loaded model gets its own agents'
part of it (`ModelEngine.expect`, under the `scope` given); a model loaded later gets its
part at load. The model of the agent expected next — hinted, else predicted — is loaded
in the background, off the critical path. `hold` and `unhold` are hints too: they act on
the agent's model when it is loaded and never load one.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence

from agentmem.errors import PoolClosedError
from agentmem.models.workflow import Workflow
from agentmem.pool.hints import check_expected

if TYPE_CHECKING:
    from agentmem.models.lease import ModelLease
    from agentmem.models.tier import ModelSlot, ModelTier

__all__ = ["HintRouting"]

logger = logging.getLogger(__name__)


class HintRouting:
    """The hint methods and model prefetch of `MemoryPool` (see the module docstring)."""

    tier: ModelTier
    workflow: Workflow
    prefetch_models: bool
    _closed: bool
    _prefetching: set[str]
    _check_open: Callable[[], None]
    model_of: Callable[[str], str | None]
    lease_if_loaded: Callable[[str], ModelLease | None]

    def expect(self, agent_ids: Sequence[str | Sequence[str]], *, soon: bool = True, scope: str | None = None) -> None:
        """Tell the pool which agents run next, in order (first = next call); see `ModelEngine.expect`.

        Each loaded model gets its own agents' order (under `scope`), and the model of the
        first expected agent is loaded in the background. The order models are prefetched
        and kept by is one for every scope: the latest hint's.

        Raises:
            ConfigError: a malformed agent id or scope, a non-list, too many ids, or a non-bool `soon`.
        """
        self._check_open()
        self.workflow.expect(check_expected(agent_ids, soon=soon, scope=scope))
        for name in self.tier.loaded():
            self._apply_hints(name, soon=soon, scope=scope, empty=True)  # an empty order clears the scope's
        self._prefetch()

    def hold(self, agent_id: str, *, ttl_s: float | None = None) -> None:
        """Keep `agent_id` resident until `ttl_s` passes or its next call (`ModelEngine.hold`), when its model is loaded."""
        self._check_open()
        name = self.model_of(agent_id)
        lease = None if name is None else self.lease_if_loaded(name)
        if lease is not None:
            with lease:
                lease.pool.hold(agent_id, ttl_s=ttl_s)

    def unhold(self, agent_id: str) -> None:
        """End `agent_id`'s hold (no-op when it has none, the agent is unknown or its model is not loaded)."""
        self._check_open()
        name = self.model_of(agent_id)
        lease = None if name is None else self.lease_if_loaded(name)
        if lease is not None:
            with lease:
                lease.pool.unhold(agent_id)

    def wait_prefetch(self, timeout_s: float = 60.0) -> bool:
        """Wait for model loads started in the background (and any unload) to finish; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self._prefetching and time.monotonic() < deadline:
            time.sleep(0.005)
        return self.tier.wait_idle(max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------ the tier's and the calls' hooks
    def _next_step(self, model: str) -> int | None:
        return self.workflow.next_step(lambda a: self.model_of(a) == model)

    def _apply_hints(self, name: str, *, soon: bool = True, scope: str | None = None, empty: bool = False) -> None:
        """Give model `name`'s engine its agents' part of the expected order (`empty`: even when it has none)."""
        order = self.workflow.order(lambda a: self.model_of(a) == name)
        engine = self.tier.slots[name].pool
        if engine is not None and not engine.closed and (order or empty):
            engine.expect(order, soon=soon, scope=scope)

    def _on_load(self, slot: ModelSlot) -> None:
        self._apply_hints(slot.spec.name)

    def _after_call(self, agent_id: str) -> None:
        self.workflow.called(agent_id)
        self._prefetch()

    def _prefetch(self) -> None:
        """Load, in a background thread, the model of the agent expected (or predicted) next."""
        if not self.prefetch_models or self._closed:
            return
        nxt = self.workflow.next_agent()
        name = self.model_of(nxt) if nxt is not None else None
        if name is None or self.tier.slots[name].state != "unloaded" or name in self._prefetching:
            return
        self._prefetching.add(name)

        def load() -> None:
            try:
                if not self._closed:
                    self.tier.acquire(name, prefetch=True)
                    self.tier.release(name)
            except PoolClosedError:
                pass
            except Exception:  # a prefetch is only an optimization: the call will load it (or fail) itself
                logger.warning("prefetching model %s failed", name, exc_info=True)
            finally:
                self._prefetching.discard(name)

        threading.Thread(target=load, name=f"agentmem-model-prefetch-{name}", daemon=True).start()
