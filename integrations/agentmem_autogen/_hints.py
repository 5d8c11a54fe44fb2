"""Workflow hints from AutoGen: who speaks next, who is waiting on a tool — told to the pool.

Without app code:

* **tool calls** — every `AgentMemChatCompletionClient` holds its agent resident
  (`MemoryPool.hold`, TTL from its reload cost) after a reply that is a tool call:
  `AssistantAgent` runs the tool and calls the model again (`reflect_on_tool_use`,
  `max_tool_iterations`); the hold ends at that call.
* **speaker selection** — a client with `speaker_selection=True` (a
  `SelectorGroupChat`'s `model_client`) reads the candidates its selection prompt
  lists and calls `MemoryPool.expect([itself, candidates])` before it answers (the
  candidates as one branch: they share a step and none is prefetched),
  then `expect([chosen, itself])` with its answer: the chosen agent is restored
  while AgentChat hands it the turn.

With one call, `follow(team)` (before the team's first run): the team's group chat
manager tells the pool every speaker it selects — for a `RoundRobinGroupChat` the
whole upcoming order (after agent *i*: *i*, *i+1*, ...), for a `SelectorGroupChat`
the chosen speaker and then the selector.

Candidate names are AgentChat participant names; the pool's agent ids are those of
their clients. A client learns the runtime agent type it runs under (`<name>_<team
id>`) on its first call, so a name maps to the right agent id even when ids are not
the names; before that, the name itself is used (an unknown id is harmless: nothing
can be restored for it anyway).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Sequence

from autogen_core import AgentId, MessageHandlerContext

from agentmem import AgentMemError, MemoryPool

__all__ = ["follow", "hold_after_call", "learn_runtime_id", "runtime_agent_id", "selection_done", "selection_started"]

logger = logging.getLogger(__name__)

# pool -> {runtime agent type: pool agent id}, learned from the clients' calls
_RUNTIME: weakref.WeakKeyDictionary[MemoryPool, dict[str, str]] = weakref.WeakKeyDictionary()


def runtime_agent_id(aid: AgentId) -> str:
    """The pool agent id of a client without `agent_id` running as AutoGen agent `aid`."""
    return aid.type if aid.key == "default" else f"{aid.type}/{aid.key}"


def _current() -> AgentId | None:
    try:
        return MessageHandlerContext.agent_id()
    except RuntimeError:
        return None


def learn_runtime_id(pool: MemoryPool, agent_id: str) -> None:
    """Remember that the AutoGen agent making this call uses `agent_id` in `pool`."""
    aid = _current()
    if aid is not None:
        _RUNTIME.setdefault(pool, {})[aid.type] = agent_id


def _ids_for(pool: MemoryPool, names: Sequence[str]) -> list[str]:
    """Pool agent ids of participant `names` in the team of the current AutoGen agent."""
    aid = _current()
    table = _RUNTIME.get(pool, {})
    out = []
    for n in names:
        out.append(table.get(f"{n}_{aid.key}", n) if aid is not None else n)
    return out


async def _tell(pool: MemoryPool, method: str, *args: Any, **kw: Any) -> None:
    """Run a hint method off the event loop; a hint that fails is logged, never raised."""
    try:
        await asyncio.to_thread(getattr(pool, method), *args, **kw)
    except AgentMemError as exc:
        logger.debug("hint %s%r ignored: %s", method, args, exc)


async def selection_started(pool: MemoryPool, selector_id: str, candidates: Sequence[str]) -> None:
    """Before a selection call: the selector runs, then one of the candidates (a branch: nothing guessed is prefetched)."""
    await _tell(pool, "expect", [selector_id, _ids_for(pool, candidates)], soon=True, scope=selector_id)


async def selection_done(pool: MemoryPool, selector_id: str, reply: str, candidates: Sequence[str]) -> None:
    """After a selection call: the chosen speaker runs next (restored now), then the selector."""
    chosen = reply.strip().strip("'\"` .")
    if chosen in candidates:
        await _tell(pool, "expect", [*_ids_for(pool, [chosen]), selector_id], soon=True, scope=selector_id)


async def hold_after_call(pool: MemoryPool, agent_id: str) -> None:
    """A reply was a tool call: keep the agent resident until its next call (default TTL)."""
    await _tell(pool, "hold", agent_id)


def _is_agentmem_client(client: Any) -> bool:
    """Whether `client` is an `AgentMemChatCompletionClient` (duck-typed: `_client` imports this module)."""
    return getattr(type(client), "is_agentmem_client", False) is True


def _participant_ids(team: Any) -> list[tuple[str, MemoryPool | None, str]]:
    """`(name, pool, agent id)` of every participant (`pool` is None without an agentmem client)."""
    out = []
    for p, topic in zip(team._participants, team._participant_topic_types, strict=True):
        client = getattr(p, "_model_client", None)
        if _is_agentmem_client(client):
            aid = client.agent_id or runtime_agent_id(AgentId(topic, team._team_id))
            out.append((p.name, client.pool, aid))
        else:
            out.append((p.name, None, p.name))
    return out


def follow(team: Any) -> Any:
    """Let a team's speaker selection drive the pool's hints; returns `team`.

    Call it once, before the team's first `run`/`run_stream`. After each selection the
    manager calls `MemoryPool.expect` on the pool of the participants' clients: a
    `RoundRobinGroupChat` gives the whole upcoming order from the selected speaker on
    (every participant, in turn order), a `SelectorGroupChat` (or any other team)
    the selected speaker, then the selector's own agent when its model client is an
    agentmem client. Participants without an agentmem client are left out.

    Args:
        team: an AgentChat team (`RoundRobinGroupChat`, `SelectorGroupChat`, ...).

    Raises:
        TypeError: not an AgentChat group chat team.
        ValueError: the team has already run (its manager exists), or `follow` was
            already called on it.

    Example:
        >>> team = follow(RoundRobinGroupChat([pm, engineer], termination_condition=stop))  # doctest: +SKIP
    """
    from autogen_agentchat.teams import BaseGroupChat, RoundRobinGroupChat

    if not isinstance(team, BaseGroupChat):
        raise TypeError(f"follow() needs an AgentChat group chat team, got {type(team).__name__}")
    if getattr(team, "_initialized", False):
        raise ValueError("follow() must be called before the team's first run")
    if getattr(team, "_agentmem_follows", False):
        raise ValueError("follow() was already called on this team")
    tell = _speaker_teller(team, round_robin=isinstance(team, RoundRobinGroupChat))
    _after_each_selection(team, tell)
    team._agentmem_follows = True
    return team


def _speaker_teller(team: Any, *, round_robin: bool) -> Callable[[list[str] | str], Awaitable[None]]:
    """The coroutine `follow` runs after each selection: `expect` the upcoming agents on their pools."""
    parts = _participant_ids(team)
    names = [n for n, _, _ in parts]
    selector = getattr(team, "_model_client", None)
    selector_id = selector.agent_id if _is_agentmem_client(selector) else None
    # the team's own expected order on the pool (a selector's hints share its scope)
    scope = selector_id if selector_id is not None else f"autogen-team-{id(team):x}"

    async def tell(speakers: list[str] | str) -> None:
        upcoming = _upcoming(names, speakers, round_robin=round_robin)
        if not upcoming:
            return
        by_pool: dict[int, tuple[MemoryPool, list[str]]] = {}
        for n in upcoming:
            _, pool, aid = parts[names.index(n)]
            if pool is not None:
                by_pool.setdefault(id(pool), (pool, []))[1].append(aid)
        if selector_id is not None and _is_agentmem_client(selector):
            by_pool.setdefault(id(selector.pool), (selector.pool, []))[1].append(selector_id)
        for pool, ids in by_pool.values():
            await _tell(pool, "expect", ids, soon=True, scope=scope)

    return tell


def _upcoming(names: list[str], speakers: list[str] | str, *, round_robin: bool) -> list[str]:
    """The participants expected next: the turn order from the selected speaker on (round robin),
    else the selected speakers; `[]` when the selection names no participant first."""
    chosen = [speakers] if isinstance(speakers, str) else list(speakers)
    if not chosen or chosen[0] not in names:
        return []
    i = names.index(chosen[0])
    return names[i:] + names[:i] if round_robin else chosen


def _after_each_selection(team: Any, tell: Callable[[list[str] | str], Awaitable[None]]) -> None:
    """Make the team's group chat manager await `tell(speakers)` after each `select_speaker`."""
    make_factory = team._create_group_chat_manager_factory

    def patched_factory(*args: Any, **kw: Any) -> Any:
        make = make_factory(*args, **kw)

        def factory() -> Any:
            manager = make()
            select = manager.select_speaker

            async def select_speaker(thread: Any) -> Any:
                speakers = await select(thread)
                await tell(speakers)
                return speakers

            manager.select_speaker = select_speaker
            return manager

        return factory

    team._create_group_chat_manager_factory = patched_factory
