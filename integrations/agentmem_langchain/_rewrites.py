"""Noticing a history that was rewritten instead of extended, and LangChain's summarization doing it.

The pool keeps the longest common prefix of an agent's KV and the new prompt (its
*reconcile* phase, `agentmem/pool/turn.py`); everything after the first changed message
is dropped and decoded again. Frameworks that send the whole history normally only
append, so a rewrite is rare, and costly when it happens. LangChain's
`SummarizationMiddleware` does it by design: it replaces the older messages with one
summary message (`additional_kwargs={"lc_source": "summarization"}`), which throws away
the KV agentmem kept for them. `agent_budget_tokens` bounds an agent's KV by evicting
inside it and keeps the rest (see docs/langchain.md, "Summarization middleware").

`RewriteWatch.check` logs that once per process, at WARNING, when the rewrite carries
the middleware's signature; other rewrites are logged at DEBUG.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Mapping, Sequence

from langchain_core.messages import BaseMessage, HumanMessage

from agentmem import MemoryPool

__all__ = ["SUMMARY_PREFIX", "RewriteWatch", "is_summary", "is_summarizer_call"]

logger = logging.getLogger(__name__)

#: How `SummarizationMiddleware` (langchain 1.x) opens the message that replaces the history.
SUMMARY_PREFIX = "Here is a summary of the conversation to date:"
_warned = threading.Event()


def is_summary(message: BaseMessage) -> bool:
    """Whether `message` is the summary `SummarizationMiddleware` put in place of older messages."""
    if not isinstance(message, HumanMessage):
        return False
    if message.additional_kwargs.get("lc_source") == "summarization":
        return True
    return isinstance(message.content, str) and message.content.startswith(SUMMARY_PREFIX)


def is_summarizer_call(config: Mapping[str, Any]) -> bool:
    """Whether a call is the middleware's own summarizing call (its run config's metadata says so)."""
    meta = config.get("metadata")
    return isinstance(meta, Mapping) and meta.get("lc_source") == "summarization"


class RewriteWatch:
    """Per pool and agent, the messages of the last call, to tell an extension from a rewrite."""

    def __init__(self) -> None:
        self._last: weakref.WeakKeyDictionary[MemoryPool, dict[str, list[dict[str, Any]]]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def check(self, pool: MemoryPool, agent_id: str, messages: Sequence[BaseMessage], converted: list[dict[str, Any]]) -> bool:
        """Record this call's messages; `True` when they rewrite (not extend) the previous call's.

        Args:
            pool: the pool the call runs on.
            agent_id: the call's agent.
            messages: the call's LangChain messages (for the middleware's signature).
            converted: the same messages as agentmem message dicts (what is compared).
        """
        with self._lock:
            per_pool = self._last.setdefault(pool, {})
            prev = per_pool.get(agent_id)
            per_pool[agent_id] = converted
        if not prev:
            return False
        n = _common_messages(prev, converted)
        if n == len(prev) or (n == len(converted) and n >= len(prev) - 1):
            return False  # an extension (or the same prompt again, as a retry sends it)
        summarized = any(is_summary(m) for m in messages)
        if summarized and not _warned.is_set():
            _warned.set()
            logger.warning(
                "agent %r: its history was rewritten by LangChain's SummarizationMiddleware (%d of %d earlier messages "
                "replaced by a summary): the KV agentmem kept for them is discarded and the rest is prefilled again. "
                "agentmem can bound the agent instead and keep its KV: PoolConfig(agent_budget_tokens=...) or "
                "MemoryPool.set_budget (docs/langchain.md, 'Summarization middleware'). Logged once.",
                agent_id, len(prev) - n, len(prev),
            )
        else:
            logger.debug("agent %r: history rewritten after message %d of %d (KV after it is dropped)", agent_id, n, len(prev))
        return True


def _common_messages(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
