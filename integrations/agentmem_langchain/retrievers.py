"""`AgentMemRetriever`: a LangChain retriever over an agent's evicted memory.

An agent with a token budget keeps part of its history in the KV; the rest is evicted
into the archive with its embedding (`agentmem.recall`). The retriever finds the spans
a query is about — by meaning, so a paraphrase finds them — each completed to whole
lines, as `Document`s. Put it in a RAG chain, or give it to an agent as a tool
(`langchain_core.tools.create_retriever_tool`).

>>> from agentmem_langchain import AgentMemRetriever, ChatAgentMem       # doctest: +SKIP
>>> chat = ChatAgentMem(agent_id="analyst", pool_options={"agent_budget_tokens": 2048})  # doctest: +SKIP
>>> memory = AgentMemRetriever(pool=chat.get_pool(), agent_id="analyst")        # doctest: +SKIP
>>> memory.invoke("which boat carried the cargo out of the Dutch port?")                # doctest: +SKIP
[Document(page_content='The shipment left Rotterdam harbor aboard the vessel Nordlys.', metadata={...})]
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

from agentmem.models.seats import recall_on

__all__ = ["AgentMemRetriever"]


class AgentMemRetriever(BaseRetriever):
    """The evicted spans of one agent that best match a query, as `Document`s.

    Each document's `page_content` is the span widened to whole lines; its metadata
    holds `agent_id`, `span_id`, `start`/`end` (history token positions), `region`,
    `score` (cosine similarity by meaning, or the fused / BM25 score) and `ts`.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pool: Any = Field(exclude=True)
    """The `MemoryPool` or `ModelPool` the agent runs on."""
    agent_id: str
    """The agent whose memory is searched (never another agent's)."""
    k: int = 4
    """Documents at most."""
    model: str | None = None
    """With a `ModelPool`: the model the agent must be bound to (`None`: whichever it is)."""

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        spans = recall_on(self.pool, self.agent_id, query, self.k, model=self.model)
        return [
            Document(
                page_content=text,
                metadata={"agent_id": s.agent_id, "span_id": s.id, "start": s.start, "end": s.end,
                          "region": s.region, "score": s.score, "ts": s.ts},
            )
            for text, s in spans
        ]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        return await asyncio.to_thread(self._get_relevant_documents, query, run_manager=run_manager.get_sync())
