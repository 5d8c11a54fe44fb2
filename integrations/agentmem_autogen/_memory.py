"""AgentMemMemory: AutoGen's `Memory` over one agent of an agentmem pool — pinned facts and recall of evicted text.

An agent with a token budget (`MemoryPool.set_budget`) keeps only part of its history
in the KV; the rest is evicted, and its text is archived with full-text search
(`MemoryPool.recall`). `AgentMemMemory` brings it back the AutoGen way: as
`AssistantAgent(memory=[AgentMemMemory(pool, agent_id=...)])`, before every model
call `update_context` searches the agent's evicted text for what the latest message
asks about and adds the best spans to the model context, and keeps the facts given
to `add` in one system message that the agent's client pins in the KV (never
evicted). Over a `MemoryPool` of several models each recall runs on the agent's model, held for it
(`agentmem.models.seats.recall_on`), and the client pins the facts on that model's pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Dict, List, Mapping, Optional

from autogen_core import CancellationToken, Component
from autogen_core.memory import Memory, MemoryContent, MemoryMimeType, MemoryQueryResult, UpdateContextResult
from autogen_core.model_context import ChatCompletionContext
from autogen_core.models import AssistantMessage, FunctionExecutionResultMessage, SystemMessage, UserMessage
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import Self

import agentmem.validation as check
from agentmem import ConfigError, MemoryPool, PoolConfig
from agentmem.models.seats import hold_pools
from agentmem.tools import release
from agentmem.models.seats import recall_on
from agentmem.tools.recall import FACTS_HEADER, RECALL_HEADER, facts_block, pin_facts_sync

logger = logging.getLogger(__name__)

__all__ = ["FACTS_HEADER", "RECALL_HEADER", "AgentMemMemory", "AgentMemMemoryConfig", "pin_facts"]


async def pin_facts(pool: MemoryPool, agent_id: str, messages: List[Dict[str, Any]]) -> None:
    """Pin the latest facts message of a finished call in the agent's KV (and unpin older ones)."""
    await asyncio.to_thread(pin_facts_sync, pool, agent_id, messages)


class AgentMemMemoryConfig(BaseModel):
    """Serializable configuration of `AgentMemMemory` (`dump_component`)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    agent_id: str
    """The pool agent whose archive this memory reads (its client's `agent_id`)."""
    pool: Dict[str, Any] = Field(default_factory=dict)
    """The pool's `agentmem.PoolConfig` as a dict (an open pool with it is reused)."""
    name: Optional[str] = None
    """Identifier of this memory instance."""
    k: int = 3
    """Evicted spans recalled per model call at most."""
    facts: List[str] = Field(default_factory=list)
    """The facts added so far (kept in the context, pinned in the KV)."""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return json.dumps(content, ensure_ascii=False)
    raise ValueError(f"AgentMemMemory keeps text and JSON contents, got {type(content).__name__}")


def _message_text(m: Any) -> str:
    if isinstance(m, (UserMessage, SystemMessage)) and isinstance(m.content, str):
        return m.content
    if isinstance(m, AssistantMessage):
        return m.content if isinstance(m.content, str) else (m.thought or "")
    if isinstance(m, FunctionExecutionResultMessage):
        return "\n".join(r.content for r in m.content)
    return ""


class AgentMemMemory(Memory, Component[AgentMemMemoryConfig]):
    """AutoGen `Memory` over an agentmem agent: pinned facts plus recall of its evicted text.

    Setup: the agent's client and this memory name the same pool agent; give the
    agent a token budget so old turns are evicted (and archived) instead of filling
    its context.

    ```python
    pool = MemoryPool(model="qwen2.5-coder-0.5b-instruct", n_ctx=8192)
    pool.set_budget("analyst", 512)
    memory = AgentMemMemory(pool, agent_id="analyst")
    await memory.add(MemoryContent(content="The customer is ACME.", mime_type=MemoryMimeType.TEXT))
    agent = AssistantAgent("analyst", model_client=AgentMemChatCompletionClient(pool, agent_id="analyst"),
                           memory=[memory])
    ```

    Before each model call (`update_context`):

    * **facts** — every `add`ed text (or JSON) is listed in one system message
      starting with `FACTS_HEADER`, added to the model context when the set changed;
      the agent's `AgentMemChatCompletionClient` pins its latest such message in the
      KV (`MemoryPool.pin`), so eviction never takes it.
    * **recall** — the latest message's words are searched in the agent's evicted
      text (`MemoryPool.recall`, the archive's FTS5/BM25); up to `k` spans not
      recalled before are added as a system message starting with `RECALL_HEADER`
      (a span cut inside a sentence is completed to its line from the history tokens).

    `query(text)` returns the matching facts and evicted spans as `MemoryContent`
    (`metadata["source"]` is `"fact"` or `"recall"`; a recall carries `score`,
    `region` and its ledger positions). `clear()` forgets the facts; evicted text stays
    in the archive with the agent's history (`MemoryPool.forget` drops it).

    Over a `MemoryPool` of several models (`pool=MemoryPool(models=...)`, `model=` as the client's): each recall runs
    on the pool of the model the agent is bound to, held loaded for the search and
    released after; it binds nothing and counts as no call (an agent not bound yet has
    nothing evicted: nothing is recalled, no model loaded). Such a memory cannot be
    dumped as a component.

    Args:
        pool: the shared pool, or a `MemoryPool` of several models (`None`: the open pool of `pool_config`, loaded once).
        agent_id: the agent (its client's `agent_id`).
        model: with a `MemoryPool` of several models, the agent's model (`None`: whichever it is bound to).
        pool_config: configuration of the pool when `pool` is `None`.
        name: identifier of the memory.
        k: spans recalled per call (0 turns recall off).
        facts: initial facts.

    Raises:
        agentmem.ConfigError: a malformed `agent_id` or `k`; `model` without a `MemoryPool` of several models.
        agentmem.errors.UnknownModelError: the pool holds no model `model`.
        agentmem.errors.ModelMismatchError: (`query`, `update_context`) the agent is bound to another model.
    """

    component_type = "memory"
    component_config_schema = AgentMemMemoryConfig
    component_provider_override = "agentmem_autogen.AgentMemMemory"

    def __init__(
        self,
        pool: MemoryPool | None = None,
        *,
        agent_id: str,
        model: str | None = None,
        pool_config: PoolConfig | Mapping[str, Any] | None = None,
        name: str | None = None,
        k: int = 3,
        facts: List[str] | None = None,
    ) -> None:
        check.agent_id(agent_id)
        check.bounded_int(k, field="k", lo=0, hi=100)
        self._pool, self._owns_pool = hold_pools(pool, pool_config, lambda c: MemoryPool(config=c), model=model)
        self._model = model
        self._agent_id = agent_id
        self._name = name or f"agentmem:{agent_id}"
        self._k = k
        self._facts: list[str] = [_text(f) for f in facts or []]
        self._closed = False

    @property
    def name(self) -> str:
        """Identifier of this memory."""
        return self._name

    @property
    def agent_id(self) -> str:
        """The pool agent this memory reads."""
        return self._agent_id

    @property
    def facts(self) -> list[str]:
        """The facts added so far (a copy)."""
        return list(self._facts)

    # ------------------------------------------------------------------ the protocol
    async def add(self, content: MemoryContent, cancellation_token: CancellationToken | None = None) -> None:
        """Add a fact (text or JSON); it reaches the context at the next `update_context`."""
        text = _text(content.content).strip()
        if text and text not in self._facts:
            self._facts.append(text)

    async def query(
        self, query: str | MemoryContent = "", cancellation_token: CancellationToken | None = None, **kwargs: Any
    ) -> MemoryQueryResult:
        """Facts sharing a word with `query`, then the agent's best-matching evicted spans.

        Keyword `k` overrides the number of spans.
        """
        text = _text(query.content) if isinstance(query, MemoryContent) else str(query)
        k = kwargs.get("k", self._k)
        words = {w.lower() for w in text.split() if len(w) > 2}
        results = [
            MemoryContent(content=f, mime_type=MemoryMimeType.TEXT, metadata={"source": "fact"})
            for f in self._facts if words & {w.lower().strip(".,:;!?") for w in f.split()}
        ]
        for whole, s in await self._recall(text, k):
            results.append(MemoryContent(
                content=whole, mime_type=MemoryMimeType.TEXT,
                metadata={"source": "recall", "score": s.score, "region": s.region, "start": s.start, "end": s.end},
            ))
        return MemoryQueryResult(results=results)

    async def update_context(self, model_context: ChatCompletionContext) -> UpdateContextResult:
        """Add the facts (when changed) and the evicted text the latest message asks about."""
        messages = await model_context.get_messages()
        added: list[MemoryContent] = []
        if self._facts:
            block = facts_block(self._facts)
            last = next((m for m in reversed(messages) if isinstance(m, SystemMessage)
                         and m.content.startswith(FACTS_HEADER)), None)
            if last is None or last.content != block:
                await model_context.add_message(SystemMessage(content=block))
            added += [MemoryContent(content=f, mime_type=MemoryMimeType.TEXT, metadata={"source": "fact"})
                      for f in self._facts]
        latest = next((_message_text(m) for m in reversed(messages) if _message_text(m)
                       and not (isinstance(m, SystemMessage) and m.content.startswith((FACTS_HEADER, RECALL_HEADER)))), "")
        if self._k and latest:
            context_text = "\n".join(_message_text(m) for m in messages if isinstance(m, SystemMessage))
            spans = await self._recall(latest, self._k)
            fresh = [(t, s) for t, s in spans if t not in context_text]
            if fresh:
                body = "\n".join(f"- {t}" for t, _ in fresh)
                await model_context.add_message(SystemMessage(content=f"{RECALL_HEADER}\n{body}"))
                added += [MemoryContent(content=t, mime_type=MemoryMimeType.TEXT,
                                        metadata={"source": "recall", "score": s.score, "region": s.region})
                          for t, s in fresh]
        return UpdateContextResult(memories=MemoryQueryResult(results=added))

    async def _recall(self, query: str, k: int) -> list[tuple[str, Any]]:
        """The `k` best evicted spans as `(text, span)`, on the agent's model (`agentmem.models.seats.recall_on`)."""
        return await asyncio.to_thread(recall_on, self._pool, self._agent_id, query, k, model=self._model)

    async def clear(self) -> None:
        """Forget the facts (evicted text stays in the archive)."""
        self._facts = []

    async def close(self) -> None:
        """Stop using the pool (closes it when this memory loaded it and was its last user)."""
        if not self._closed:
            self._closed = True
            if self._owns_pool:
                release(self._pool)

    # ------------------------------------------------------------------ component
    def _to_config(self) -> AgentMemMemoryConfig:
        if len(self._pool.names) > 1:
            raise ConfigError("pool: a memory over a pool of several models cannot be dumped as a component "
                              "(the pool is the application's; build the memory in code)")
        return AgentMemMemoryConfig(agent_id=self._agent_id, pool=self._pool.config.to_dict(), name=self._name,
                                    k=self._k, facts=list(self._facts))

    @classmethod
    def _from_config(cls, config: AgentMemMemoryConfig) -> Self:
        return cls(agent_id=config.agent_id, pool_config=PoolConfig.from_dict(config.pool) if config.pool else None,
                   name=config.name, k=config.k, facts=config.facts)
