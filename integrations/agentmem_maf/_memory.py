"""AgentMemContextProvider: MAF's `ContextProvider` over one agent of an agentmem pool — pinned facts and recall of evicted text.

An agent with a token budget (`MemoryPool.set_budget`) keeps only part of its history in
the KV; the rest is evicted, and its text is archived with full-text search
(`MemoryPool.recall`). `AgentMemContextProvider` brings it back the MAF way, as
`Agent(..., context_providers=[AgentMemContextProvider(pool)])`: before every run it
adds the facts given to `add` to the agent's instructions (the agent's
`AgentMemChatClient` pins the message that holds them in the KV, so eviction never takes
them), and searches the agent's evicted text for what the new input asks about, adding
the best spans as a system message ahead of the input.

Both are placed so the agent's KV stays a prefix: the facts at the start of the prompt
(they change only when a fact is added), the recalled text with the new input, which the
session's history keeps from then on. Over a `MemoryPool` of several models each recall runs on the agent's
model, held for it (`agentmem.models.seats.recall_on`), and the client pins the facts on
that model's pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Mapping, Sequence

from agent_framework import ContextProvider, Message

import agentmem.validation as check
from agentmem import MemoryPool, PoolConfig
from agentmem.models.seats import hold_pools
from agentmem.tools import release
from agentmem.models.seats import recall_on
from agentmem.tools.recall import facts_block, is_memory_text, pin_facts_sync, recall_block

from ._identity import resolve_agent_id

__all__ = ["AgentMemContextProvider", "pin_facts"]

logger = logging.getLogger(__name__)

DEFAULT_SOURCE_ID = "agentmem"


async def pin_facts(pool: MemoryPool, agent_id: str, messages: Sequence[Mapping[str, Any]]) -> None:
    """Pin the latest facts message of a finished call in the agent's KV (and unpin older ones)."""
    await asyncio.to_thread(pin_facts_sync, pool, agent_id, messages)


def _fact_text(content: Any) -> str:
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, Mapping):
        return json.dumps(content, ensure_ascii=False)
    raise ValueError(f"a fact must be text or a JSON object, got {type(content).__name__}")


class AgentMemContextProvider(ContextProvider):
    """MAF `ContextProvider` over an agentmem agent: pinned facts plus recall of its evicted text.

    Setup: attach it to an agent whose client is an `AgentMemChatClient` over the same
    pool; give the agent a token budget so old turns are evicted (and archived) instead of
    filling its context.

    ```python
    pool = MemoryPool(model="qwen2.5-coder-0.5b-instruct", n_ctx=8192)
    pool.set_budget("analyst", 512)
    memory = AgentMemContextProvider(pool, facts=["The customer is ACME."])
    analyst = Agent(client=AgentMemChatClient(pool, agent_id="analyst"), name="analyst",
                    context_providers=[memory])
    ```

    Before each run (`before_run`):

    * **facts** — every fact (`facts=`, `add`) is listed in one block starting with
      `agentmem.tools.recall.FACTS_HEADER`, appended to the agent's instructions; the
      client pins the system message that holds it in the KV (`MemoryPool.pin`).
    * **recall** — the new input's words are searched in the agent's evicted text
      (`MemoryPool.recall`, the archive's FTS5/BM25); up to `k` spans not recalled before
      in this session are added as a system message starting with `RECALL_HEADER`, ahead
      of the input (so the session's history keeps it, and the KV stays a prefix).

    The pool agent is the one the agent's client uses (`agentmem_maf._identity`):
    `agent_id=` if given, else the client's `agent_id` (or its agent's name), else the
    agent's name, else the session's id.

    Over a `MemoryPool` of several models (`pool=MemoryPool(models=...)`, `model=` as the client's): each recall runs
    on the pool of the model the agent is bound to, held loaded for the search and
    released after; it binds nothing and counts as no call (an agent not bound yet has
    nothing evicted: nothing is recalled, no model loaded).

    Args:
        pool: the shared pool, or a `MemoryPool` of several models (`None`: the open pool of `pool_config`, loaded once).
        agent_id: the pool agent whose archive is read; `None` = the agent's (see above).
        model: with a `MemoryPool` of several models, the agent's model (`None`: whichever it is bound to).
        pool_config: configuration of the pool when `pool` is `None`.
        source_id: MAF's id of this provider (its messages' attribution, its session state).
        k: spans recalled per run at most (`0` turns recall off).
        facts: initial facts.

    Raises:
        agentmem.ConfigError: a malformed `agent_id` or `k`; `model` without a `MemoryPool` of several models.
        agentmem.errors.UnknownModelError: the pool holds no model `model`.
        agentmem.errors.ModelMismatchError: (`recall`, `before_run`) the agent is bound to another model.
    """

    def __init__(
        self,
        pool: MemoryPool | None = None,
        *,
        agent_id: str | None = None,
        model: str | None = None,
        pool_config: PoolConfig | Mapping[str, Any] | None = None,
        source_id: str = DEFAULT_SOURCE_ID,
        k: int = 3,
        facts: Sequence[Any] | None = None,
    ) -> None:
        if agent_id is not None:
            check.agent_id(agent_id)
        check.bounded_int(k, field="k", lo=0, hi=100)
        super().__init__(source_id)
        self._pool, self._owns_pool = hold_pools(pool, pool_config, lambda c: MemoryPool(config=c), model=model)
        self._model = model
        self._agent_id = agent_id
        self._k = k
        self._facts: list[str] = []
        for f in facts or []:
            self.add(f)
        self._closed = False

    @property
    def pool(self) -> MemoryPool:
        """The `agentmem.MemoryPool` this object works on (the shared one, or the one given)."""
        return self._pool

    @property
    def facts(self) -> list[str]:
        """The facts added so far (a copy)."""
        return list(self._facts)

    def add(self, fact: Any) -> None:
        """Add a fact (text or a JSON object); it reaches the prompt at the next run."""
        text = _fact_text(fact)
        if text and text not in self._facts:
            self._facts.append(text)

    def clear(self) -> None:
        """Forget the facts (evicted text stays in the archive with the agent's history)."""
        self._facts = []

    def agent_id_for(self, agent: Any, session: Any) -> str:
        """The pool agent of `agent` in `session` (the client's rule, `agentmem_maf._identity`)."""
        if self._agent_id is not None:
            return self._agent_id
        named = getattr(getattr(agent, "client", None), "agent_id", None)
        if not isinstance(named, str) or not named:
            name = getattr(agent, "name", None)
            named = check.agent_id(name, field="agent.name") if isinstance(name, str) and name else None
        return resolve_agent_id(named, session)

    async def recall(self, agent_id: str, query: str, k: int | None = None) -> list[str]:
        """The evicted text of `agent_id` best matching `query` (at most `k`, default this provider's).

        Runs on the agent's model (`agentmem.models.seats.recall_on`), held only for the search.
        """
        spans = await asyncio.to_thread(recall_on, self._pool, agent_id, query, self._k if k is None else k,
                                        model=self._model)
        return [text for text, _ in spans]

    # ------------------------------------------------------------------ MAF's hooks
    async def before_run(self, *, agent: Any, session: Any, context: Any, state: dict[str, Any]) -> None:
        """Add the facts to the instructions and the recalled evicted text ahead of the input."""
        if self._facts:
            context.extend_instructions(self.source_id, facts_block(self._facts))
        latest = _latest_text(context.input_messages)
        if not self._k or not latest:
            return
        agent_id = self.agent_id_for(agent, session)
        recalled: list[str] = state.setdefault("recalled", [])
        fresh = [t for t in await self.recall(agent_id, latest) if t not in recalled]
        if fresh:
            recalled.extend(fresh)
            logger.debug("agent %r: recalled %d evicted span(s) for %r", agent_id, len(fresh), latest[:60])
            note = Message("system", [recall_block(fresh)], additional_properties={"_attribution": {
                "source_id": self.source_id, "source_type": type(self).__name__}})
            context.input_messages = [note, *context.input_messages]

    async def close(self) -> None:
        """Stop using the pool (closes it when this provider loaded it and was its last user)."""
        if not self._closed:
            self._closed = True
            if self._owns_pool:
                release(self._pool)


def _latest_text(messages: Sequence[Message]) -> str:
    """The text of the latest input message that is not a memory block."""
    for m in reversed(messages):
        text = m.text
        if text and not is_memory_text(text):
            return text
    return ""
