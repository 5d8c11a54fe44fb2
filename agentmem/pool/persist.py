"""Archive sync: an agent's ledger and state written in one transaction, and resume on open.

`Persister.write` stores the ledger (as region runs) with the parked state, its
shared block and its sliding-window checkpoint; `Persister.resume` registers
every archived agent as COLD (the chain's durable tier) so its state loads lazily
on its first call.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from agentmem.archive.records import AgentRecord
from agentmem.engine.chat_format import REGIONS
from agentmem.errors import AgentMemError, StateError
from agentmem.memory.ledger import Ledger
from agentmem.memory.parking import ParkedState
from agentmem.memory.shared import KVBlock
from agentmem.memory.tiers import ColdTier
from agentmem.policy.placement import priority_weight
from agentmem.pool import residence
from agentmem.pool.blocks import BlockRefs
from agentmem.pool.state import AgentState, PoolCore

__all__ = ["Persister"]

logger = logging.getLogger(__name__)

_REGION_CODE = {r: i for i, r in enumerate(REGIONS)}


def _region_runs(arr: dict[str, np.ndarray]) -> list[tuple[int, int, str, int]]:
    """The ledger as runs of equal (region, pinned, live, message): `(start, end, region, flags)`."""
    n = len(arr["tok"])
    if not n:
        return []
    key = np.stack([arr["reg"].astype(np.int64), arr["pin"], arr["live"], arr["msg"]], axis=1)
    change = np.flatnonzero(np.any(key[1:] != key[:-1], axis=1)) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [n]))
    runs = []
    for s, e in zip(starts, ends):
        flags = int(arr["pin"][s]) | (int(not arr["live"][s]) << 1) | ((int(arr["msg"][s]) + 1) << 2)
        runs.append((int(s), int(e), REGIONS[arr["reg"][s]], flags))
    return runs


def _ledger_from_runs(tokens: np.ndarray, runs: list[tuple[int, int, str, int]]) -> Ledger:
    n = len(tokens)
    arrays = {
        "tok": tokens, "reg": np.zeros(n, np.uint8), "pin": np.zeros(n, bool),
        "msg": np.zeros(n, np.int32), "live": np.ones(n, bool),
    }
    for s, e, region, flags in runs:
        arrays["reg"][s:e] = _REGION_CODE.get(region, _REGION_CODE["text"])
        arrays["pin"][s:e] = bool(flags & 1)
        arrays["live"][s:e] = not (flags & 2)
        arrays["msg"][s:e] = (flags >> 2) - 1
    return Ledger.from_arrays(arrays)


class Persister:
    """Writes agents to the archive and reads them back on open (lock held)."""

    def __init__(self, core: PoolCore, blocks: BlockRefs) -> None:
        self.core = core
        self.blocks = blocks

    def fenced(self, agent_id: str) -> dict[str, object]:
        """`{"fence": lease}` for an agent's archive writes in cluster mode (`{}` otherwise).

        Raises:
            LeaseLostError: this replica does not hold the agent's lease.
        """
        fence = self.core.fence
        return {} if fence is None else {"fence": fence(agent_id)}

    def write(self, a: AgentState, state: ParkedState | None, *, drop_state: bool = False) -> None:
        """Ledger (+ state) of `a` to the archive in one transaction.

        In cluster mode the transaction carries `a`'s lease: a replica that lost it
        writes nothing (`LeaseLostError`). With `drop_state` (and no `state`) a stored
        state is deleted in the same transaction: it no longer matches the ledger.
        """
        core = self.core
        archive, durable = core.archive, core.tiers.durable
        assert archive is not None and durable is not None
        arr = a.ledger.to_arrays()
        fenced = self.fenced(a.id)
        with archive.transaction():
            archive.put_agent(a.id, priority=a.priority, labels={"budget": a.budget, "eviction": a.eviction, **a.labels},
                              **fenced)
            archive.put_ledger(a.id, arr["tok"], _region_runs(arr), **fenced)
            if state is None and drop_state:
                durable.delete(a.id)
            if state is not None:
                if state.block is not None:
                    b = core.blocks.get(state.block)
                    if b is None:
                        raise StateError(f"shared block {state.block!r} of agent {a.id!r} is gone")
                    self.blocks.archive(b)
                durable.put(a.id, state)
                if state.window_ckpt is not None and a.prompt_end[1] > 0:
                    order = None if state.window_order is None else np.ascontiguousarray(state.window_order, "<i4")
                    archive.put_checkpoint(a.id, state.window_ckpt, prompt_end=a.prompt_end, layout=order, **fenced)

    def _register(self, rec: AgentRecord) -> AgentState | None:
        """`rec`'s agent as COLD (EMPTY without a state) in the pool's registry; None without a ledger."""
        core = self.core
        archive = core.archive
        assert archive is not None
        try:
            led = archive.get_ledger(rec.agent_id)
            ledger = _ledger_from_runs(led.tokens, led.regions) if led is not None else None
        except (AgentMemError, ValueError, IndexError, KeyError) as exc:
            # one unreadable ledger must not keep the pool from opening: that agent
            # starts empty (its next call prefills), the others resume
            logger.warning("agent %r: archived ledger unreadable (%s); it will re-prefill", rec.agent_id, exc)
            ledger = Ledger()
            rec = dataclasses.replace(rec, state_bytes=0)
        if ledger is None:
            return None
        a = AgentState(rec.agent_id, ledger=ledger)
        try:
            a.priority = priority_weight(rec.priority)
        except AgentMemError:
            a.priority = 1
        labels = dict(rec.labels)
        a.budget = int(labels.pop("budget", 0) or 0)
        a.eviction = str(labels.pop("eviction", "") or "")
        a.labels = labels
        durable = core.tiers.durable
        assert durable is not None
        if rec.state_bytes:
            residence.parked_in(a, durable.name, rec.codec)
        else:
            a.ledger.clear()  # nothing decoded is kept: the next call prefills
        core.agents[a.id] = a
        core.lines.touch(a.id)
        return a

    def resume(self) -> None:
        """Register every archived agent as COLD (states load lazily, on first call)."""
        core = self.core
        archive = core.archive
        assert archive is not None
        for rec in archive.list_agents():
            if self._register(rec) is not None:
                core.totals["resumed_agents"] += 1
        durable = core.tiers.durable
        assert durable is not None
        for aid, pe in archive.checkpoint_prompt_ends().items():
            if aid in core.agents and core.agents[aid].tier == durable.name:
                core.agents[aid].prompt_end = pe
        for info in archive.list_shared_blocks():
            core.blocks.register(KVBlock(info.block_id, info.n_tokens, "", None, info.n_bytes))
        for aid, bid in archive.state_blocks().items():
            a = core.agents.get(aid)
            b = core.blocks.get(bid)
            if a is not None and a.tier == durable.name and b is not None:
                self.blocks.join(a, b)
        for b in list(core.blocks):
            if not b.refs:
                core.blocks.release(b.id, "")
        if core.agents:
            logger.info("resumed %d agent(s) from %s", len(core.agents), core.config.archive_path)

    def load(self, agent_id: str) -> AgentState | None:
        """Register one agent as the archive holds it now (another replica may have changed it).

        The pool must hold no record of it (`Mover.discard` first). Returns None,
        registering nothing, when the archive has no such agent.
        """
        core = self.core
        archive = core.archive
        assert archive is not None and agent_id not in core.agents, f"{agent_id=}"
        rec = archive.get_agent(agent_id)
        a = self._register(rec) if rec is not None else None
        if a is None:
            return None
        durable = core.tiers.durable
        assert isinstance(durable, ColdTier)
        durable.track(a.id, rec.state_bytes if a.tier == durable.name else 0)
        if a.tier != durable.name:
            return a
        pe = archive.checkpoint_prompt_ends().get(a.id)
        if pe is not None:
            a.prompt_end = pe
        bid = archive.state_blocks().get(a.id)
        if bid is not None:
            if core.blocks.get(bid) is None:
                for info in archive.list_shared_blocks():
                    if info.block_id == bid:
                        core.blocks.register(KVBlock(info.block_id, info.n_tokens, "", None, info.n_bytes))
            b = core.blocks.get(bid)
            if b is not None:
                self.blocks.join(a, b)
        return a
