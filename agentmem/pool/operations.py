"""`ModelEngine`'s agent operations: forget, park, priorities, budgets, pins, shares, handoffs, recall, durability.

Mixed into the engine (`agentmem.pool.facade`), which provides `_core`, `_mover`, `_budgets`,
`_sharing`, `_turns`, `_hints`, `renderer`, `capacity`, `storage_fault` and `_check_open`.
Every operation validates its input first (a typed error naming the field), then takes the
pool lock; an agent that is generating is never parked, forgotten or committed under its feet.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

import agentmem.validation as check
from agentmem.engine.chat_format import Message
from agentmem.engine.sampling import SamplingParams
from agentmem.errors import AgentBusyError, ArchiveError, ArchiveFullError, ConfigError
from agentmem.memory.shared import SHARE_PREFIX, HandoffCard
from agentmem.memory.tiers import EMPTY, WARM
from agentmem.policy.placement import priority_weight
from agentmem.pool.lifetime import in_use
from agentmem.pool.results import ChatStream
from agentmem.pool.state import AgentState, PoolCore

if TYPE_CHECKING:
    from agentmem.engine.renderer import ChatRenderer
    from agentmem.pool.budgets import Budgets
    from agentmem.pool.hints import Hints
    from agentmem.pool.kvcapture import SpanCapture
    from agentmem.pool.mover import Mover
    from agentmem.pool.sharing import Sharing
    from agentmem.pool.turn import TurnRunner

__all__ = ["AgentMethods"]


class AgentMethods:
    """The agent operations of one model's engine (see the module docstring)."""

    _core: PoolCore
    _mover: Mover
    _budgets: Budgets
    _sharing: Sharing
    _turns: TurnRunner
    _hints: Hints
    _span_kv: SpanCapture
    renderer: ChatRenderer
    capacity: int
    storage_fault: str | None
    _check_open: Callable[[], None]  # the engine's method

    @contextmanager
    def _idle(self, agent_id: str, doing: str) -> Iterator[AgentState]:
        """`agent_id`'s state under the pool lock, when nothing holds it (else `AgentBusyError` naming `doing`)."""
        self._check_open()
        core = self._core
        with core.lock:
            a = core.agent(agent_id)
            if a.held:
                raise AgentBusyError(f"agent {agent_id!r} is {a.residence.hold}; cannot {doing} it now")
            yield a

    @in_use
    def forget(self, agent_id: str) -> None:
        """Drop everything kept for `agent_id` (sequence, parked states, ledger, archive rows)."""
        with self._idle(agent_id, "forget") as a:
            self._mover.forget(a)
            self._hints.forget(agent_id)
            self._span_kv.forget(agent_id)

    @in_use
    def park(self, agent_id: str, tier: str = WARM) -> None:
        """Move `agent_id`'s KV out of its live sequence into `tier` (`warm` or `cold`) now."""
        with self._idle(agent_id, "park") as a:
            core = self._core
            if tier not in core.tiers:
                raise ConfigError(f"tier {tier!r} is not available; have {sorted(core.tiers)} (cold needs archive_path or archive_url)")
            current = core.where(a)[0]
            if current != EMPTY and current != tier:
                self._mover.move(a, tier)
            self._budgets.rebalance()

    def set_priority(self, agent_id: str, priority: int | str) -> None:
        """`"foreground"`, `"normal"`, `"background"` or an int weight (creates the agent if new)."""
        self._check_open()
        check.agent_id(agent_id)
        w = priority_weight(check.priority(priority))
        with self._core.lock:
            self._core.agents.setdefault(agent_id, AgentState(agent_id)).priority = w

    def set_budget(self, agent_id: str, tokens: int, eviction: str | None = None) -> None:
        """Give `agent_id` its own live-token budget (`0` = pool default) and eviction policy."""
        self._check_open()
        check.agent_id(agent_id)
        check.bounded_int(tokens, field="budget", lo=0, hi=self.capacity)
        if eviction is not None:
            PoolCore.eviction_policy(eviction)
        with self._core.lock:
            a = self._core.agents.get(agent_id)
            pinned = int(a.ledger.pinned[a.ledger.live].sum()) if a is not None else 0
            if tokens and pinned >= tokens:
                raise ConfigError(
                    f"budget {tokens} of agent {agent_id!r} does not exceed its {pinned} pinned live tokens: "
                    f"eviction could only take the current turn; unpin messages or raise the budget"
                )
            a = self._core.agents.setdefault(agent_id, AgentState(agent_id))
            a.budget = tokens
            a.eviction = eviction or ""

    def pin(self, agent_id: str, message_index: int, pinned: bool = True) -> int:
        """Pin (never evict) the tokens of message `message_index` of `agent_id`; returns their count."""
        self._check_open()
        check.bounded_int(message_index, field="message_index", lo=0)
        if not isinstance(pinned, bool):
            raise ConfigError(f"pinned must be a bool, got {pinned!r}")
        with self._core.lock:
            led = self._core.agent(agent_id).ledger
            n_messages = int(led.messages.max()) + 1 if len(led) else 0
            if message_index >= n_messages:
                raise ConfigError(
                    f"message_index {message_index} is not a message of agent {agent_id!r} (it has {n_messages})"
                )
            return led.set_pinned(message_index, pinned)

    @in_use
    def share(self, name: str, messages: Iterable[Mapping[str, Any] | Message]) -> int:
        """Declare a shared prefix (team brief, task, document); returns its token count.

        The messages are decoded once (as agent `"share:<name>"`); any agent whose
        prompt starts with the same rendered tokens gets those cells without
        recompute: tagged in the live cache (`seq_cp`) or restored from the
        parked share. Undeclared common prefixes between agents of one tenant are found too.
        """
        self._check_open()
        if not isinstance(name, str) or not name:
            raise ConfigError(f"share name must be a non-empty string, got {name!r}")
        check.agent_id(SHARE_PREFIX + name, field="name", internal=True)
        msgs = check.message_list(messages)
        if not msgs:
            raise ConfigError(f"share {name!r} needs at least one message")
        return self._sharing.declare(
            name, self.renderer.render(msgs + [{"role": "user", "content": "\u2063"}]), len(msgs),
            decode=lambda agent_id, prefix, n: ChatStream(
                self._turns.run(agent_id, prefix, SamplingParams(max_tokens=0), n_messages=n)).drain(),
        )

    @in_use
    def handoff(self, src: str, dst: str, upto: int | None = None) -> HandoffCard:
        """Start `dst`'s context as `src`'s (its first `upto` history tokens), without recompute.

        A live source's cells are shared with the destination (`seq_cp`); a
        parked source's state is restored into the destination's sequence. The
        destination then diverges copy-on-write; the source is unaffected.
        """
        self._check_open()
        check.agent_id(src, field="src", internal=True)  # a declared share may be handed off
        check.agent_id(dst, field="dst")
        if upto is not None:
            check.bounded_int(upto, field="upto", lo=1)
        if src == dst:
            raise ConfigError("handoff needs two different agents")
        with self._core.lock:
            return self._sharing.handoff(src, dst, upto)

    def tokens(self, agent_id: str) -> list[int]:
        """The tokens whose KV `agent_id` holds (live ledger tokens, in KV order)."""
        self._check_open()
        with self._core.lock:
            return self._core.agent(agent_id).ledger.live_tokens().tolist()

    def history_tokens(self, agent_id: str) -> list[int]:
        """Every token of `agent_id`'s history, evicted ones included."""
        self._check_open()
        with self._core.lock:
            return self._core.agent(agent_id).ledger.tokens.tolist()

    @in_use
    def checkpoint(self) -> None:
        """Write every agent's ledger and state to the archive (hot ones stay hot).

        An agent that cannot be stored does not stop the others: every other
        agent is written, then `ArchiveError` names the ones that failed.
        """
        if self._core.archive is None:
            raise ConfigError("checkpoint() needs archive_path or archive_url")
        failed = self._mover.save_all(final=False)
        if failed:
            raise (ArchiveFullError if self.storage_fault else ArchiveError)(f"could not store {len(failed)} agent(s): " + "; ".join(f"{k!r}: {v}" for k, v in failed.items()))

    @in_use
    def commit(self, agent_id: str) -> bool:
        """Write `agent_id`'s ledger and state to the archive now; it stays where it is.

        For durability per call (a server's `--durability call`): after a SIGKILL the
        agent resumes from this state. Returns False, writing nothing, while the agent
        is generating (its next call commits it).

        Raises:
            ConfigError: the pool has no archive.
            UnknownAgentError: no such agent.
            ArchiveError: the write failed (what was stored before is kept).
        """
        self._check_open()
        core = self._core
        if core.archive is None:
            raise ConfigError("commit() needs archive_path or archive_url")
        with core.lock:
            a = core.agent(agent_id)
            if a.held:
                return False
            self._mover.save(a)
            return True

