"""Prefixes shared between agents: finding a donor, copying its cells, making them private.

A fresh agent whose prompt starts like another agent's history (of its own
tenant, or a share it may use: `agentmem.pool.tenants`) gets those cells
without recompute: tagged in the live cache (`seq_cp`) from a resident donor, or
restored from a parked one. A copied prefix becomes a shared block, so parked
copies keep it once. The cells move through the agents' sequences
(`AgentSeq.copy_from`, `AgentSeq.load_prefix`); the sliding-window questions go to
`Sequences`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

import numpy as np

from agentmem.engine.chat_format import RenderedPrompt
from agentmem.errors import AgentBusyError, AgentMemError, ConfigError, StateError
from agentmem.memory.ledger import Ledger
from agentmem.memory.shared import SHARE_PREFIX, HandoffCard, token_checksum
from agentmem.pool import residence
from agentmem.pool.blocks import BlockRefs
from agentmem.pool.mover import Mover
from agentmem.pool.residency import Residency
from agentmem.pool.state import AgentState, PoolCore

__all__ = ["Sharing"]

logger = logging.getLogger(__name__)


class Sharing:
    """Prefix donors, copies between sequences, handoffs and privatizing (lock held)."""

    def __init__(self, core: PoolCore, residency: Residency, mover: Mover, blocks: BlockRefs) -> None:
        self.core = core
        self.residency = residency
        self.mover = mover
        self.blocks = blocks
        self.seqs = residency.seqs

    def reset(self, d: AgentState) -> None:
        """Empty `d`'s KV, stored states and ledger (it keeps its sequence if it has one)."""
        core = self.core
        if d.kv is not None:
            d.kv.clear()  # the checkpoint goes too: it belonged to the old ledger
        for t in core.tiers.values():
            t.delete(d.id)
        residence.emptied(d)
        d.ledger = Ledger()
        # the prompt end belonged to the old ledger: a checkpoint taken at it would not match the new one
        d.prompt_end = (0, 0)
        self.blocks.leave(d)

    def copy_prefix(self, s: AgentState, d: AgentState, n: int) -> str:
        """Give `d` (resident) the first `n` history tokens of `s` and their KV (both held).

        Returns `"shared"` (cells tagged from a live `s`), `"copied"` (from a live `s`'s
        state blob, with per-sequence KV streams) or `"restored"` (from its
        parked state). Raises `StateError` when the cells cannot be had (`d` is then left empty).
        """
        core = self.core
        assert d.kv is not None, "the destination needs a sequence"
        self.reset(d)
        n_live = s.ledger.live_before(n)
        arrays = {k: v[:n] for k, v in s.ledger.to_arrays().items()}
        try:
            if s.kv is not None:  # from a live donor's cells (shared, or copied between per-sequence streams)
                mode = d.kv.copy_from(s.kv, n_live)
            else:  # from a parked donor's state
                stored = core.tiers[s.tier].get(s.id) if s.tier in core.tiers else None
                if stored is None:
                    raise StateError(f"agent {s.id!r} has no KV state to hand off")
                d.kv.load_prefix(self.blocks.joined(stored), stored, n_live, s.ledger.n_live, s.id)
                mode = "restored"
        except AgentMemError:
            self.reset(d)  # nothing half-copied stays
            raise
        d.ledger = Ledger.from_arrays(arrays)
        if n_live == n and n >= max(1, core.config.min_share_tokens) and core.ctx.params.kv_unified:
            # one shared block for the prefix: parked copies of both then keep it once. A
            # donor's block that covers part of the prefix is reused (the rest is private).
            # (Per-sequence streams hold no shared cells: each copy is its own.)
            b = self.blocks.of(s)
            if b is None or b.n_tokens > n_live:
                b = self.blocks.new(d)
                if s.block is None and mode == "shared":
                    self.blocks.join(s, b)
            self.blocks.join(d, b)
        return mode

    def share_prefix(self, a: AgentState, prompt: RenderedPrompt) -> int:
        """Give a fresh agent the longest prefix of `prompt` another agent holds; tokens shared.

        Donors are the agents `a` may take from (its tenant, public shares: `core.tenants`).
        """
        core = self.core
        n_min = core.config.min_share_tokens
        if not n_min or len(prompt) <= n_min:
            return 0
        toks = prompt.ids
        cands: dict[str, AgentState] = {}
        for x in core.agents.values():
            if x is a or x.held or not len(x.ledger) or not (x.seq is not None or x.tier in core.tiers):
                continue
            if not core.tenants.may_take(x.id, a.id):
                continue  # another tenant's cells: never shared, never even looked at (#23 finding 3)
            cands[x.id] = x
            led = x.ledger
            live = led.live
            shareable = len(led) if live.all() else int(np.argmin(live))  # up to the first evicted token
            core.prefixes.sync(x.id, led.tokens[:shareable], version=led.version)
        ranked: list[tuple[int, str]] = []
        for xid, n in core.prefixes.matches(toks):
            x = cands.get(xid)
            if x is None:
                continue
            n = min(n, len(toks) - 1)
            if n < n_min:
                break  # longest first: the rest are shorter
            # a donor's state blob keeps only its last window of the sliding-window layers
            if (x.seq is None or not core.ctx.params.kv_unified) and not self.seqs.parked_can_cut(x.ledger.n_live, n):
                continue
            ranked.append((n, x.id))
        ranked.sort(key=lambda t: (-t[0], core.agents[t[1]].seq is None, t[1]))  # longest first, live first
        for n, donor_id in ranked:
            donor = core.agents[donor_id]
            try:
                with residence.pinned(donor):
                    self.copy_prefix(donor, a, n)
            except AgentMemError as exc:  # (`a` was left empty)
                logger.debug("prefix share from %r to %r failed: %s", donor_id, a.id, exc)
                continue
            break
        else:
            return 0
        # the copied ledger carries the donor's regions; re-tag with this prompt's spans
        a.ledger.truncate(0)
        a.ledger.extend(prompt.ids[:n], prompt.spans)
        core.totals["shared_prefix_hits"] += 1
        core.totals["shared_prefix_tokens"] += n
        logger.debug("agent %r starts from %d tokens of %r", a.id, n, donor_id)
        return n

    def handoff(self, src: str, dst: str, upto: int | None) -> HandoffCard:
        """Start `dst`'s context as `src`'s first `upto` history tokens (see `MemoryPool.handoff`)."""
        core = self.core
        s = core.agent(src)
        if not core.tenants.may_take(src, dst):
            raise ConfigError(
                f"agent {dst!r} (tenant {core.tenants.of(dst)!r}) cannot start from agent {src!r} "
                f"(tenant {core.tenants.of(src)!r}): a handoff stays inside one tenant"
            )
        n = len(s.ledger) if upto is None else upto
        if not isinstance(n, int) or not 0 < n <= len(s.ledger):
            raise ConfigError(f"upto must be in [1, {len(s.ledger)}] for agent {src!r}, got {upto!r}")
        d = core.agents.setdefault(dst, AgentState(dst))
        if s.held or d.held:
            x = s if s.held else d
            raise AgentBusyError(f"agent {x.id!r} is {x.residence.hold}; cannot hand off now")
        try:
            with residence.pinned(d):
                self.reset(d)
                self.mover.make_resident(d)  # may park the source: then its parked state is handed over
                with residence.pinned(s):
                    mode = self.copy_prefix(s, d, n)
        finally:
            s.last_used = d.last_used = time.monotonic()
            core.lines.touch(dst)
            core.cond.notify_all()
        core.totals["handoffs"] += 1
        blk = self.blocks.of(d)
        return HandoffCard(
            src=src, dst=dst, seq_no=core.totals["handoffs"], n_tokens=n, n_live=d.ledger.n_live, mode=mode,
            fingerprint=core.fingerprint["model"], checksum=token_checksum(d.ledger.tokens[:n]),
            block=blk.id if blk else None, block_tokens=blk.n_tokens if blk else 0,
        )

    def declare(self, name: str, rendered: RenderedPrompt, n_messages: int,
                decode: Callable[[str, RenderedPrompt, int], Any]) -> int:
        """Decode a declared share once (as agent `share:<name>`) and make it a block; its token count.

        `rendered` is the share's messages followed by a placeholder user turn: what
        precedes that turn is exactly the prefix agents' prompts (shared messages +
        their own turns) start with. `decode(agent_id, prefix, n_messages)` runs the
        prefill (a call with no generation; the lock is not held).
        """
        spans = [sp for sp in rendered.spans if 0 <= sp.message < n_messages or (sp.message == -1 and sp.start == 0)]
        end = spans[-1].end if spans else 0
        if end < 1:
            raise ConfigError(f"share {name!r} renders to no tokens")
        decode(SHARE_PREFIX + name, RenderedPrompt(rendered.tokens[:end], spans), n_messages)
        core = self.core
        with core.lock:
            sh = core.agents.get(SHARE_PREFIX + name)
            if (sh is not None and sh.seq is not None and not sh.held and sh.ledger.n_live == len(sh.ledger) == end
                    and core.ctx.params.kv_unified):
                b = self.blocks.of(sh)
                if b is None or b.n_tokens != end:
                    self.blocks.join(sh, self.blocks.new(sh))
        return end
