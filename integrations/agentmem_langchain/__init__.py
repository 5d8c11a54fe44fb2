"""LangChain integration of agentmem: chat models whose agents keep their KV memory.

>>> from agentmem_langchain import ChatAgentMem          # doctest: +SKIP
>>> coder = ChatAgentMem(agent_id="coder")               # loads nothing yet
>>> coder.invoke("Write a haiku.").usage_metadata        # doctest: +SKIP

* `chat_models.py`: `ChatAgentMem`, a `BaseChatModel` (tools, structured output,
  streaming, async) that runs each call on the pool.
* `llms.py`: `AgentMemLLM`, a `BaseLLM` for prompt-string chains.
* `retrievers.py`: `AgentMemRetriever`, a `BaseRetriever` over an agent's evicted memory
  (recall by meaning, `agentmem.recall`).
* `_common.py`: what both models share — pool fields, agent identity, sampling, per-agent
  locks, the usage/timings metadata and `shared_pool` (with `close_shared_pools`: the
  process-wide pools that objects built without `pool=` share, `agentmem.tools.registry`,
  shared with the AutoGen client).
* `_identity.py`: the agent id of a call — the call argument, `configurable.agent_id`,
  the object's own id, a hook, then LangGraph's `"{thread_id}/{node}"` — validated.
* `_hints.py`: workflow hints to the pool — a tool-calling agent held resident, the next
  agents of a followed LangGraph graph expected.
* `_profile.py`: LangChain's `ModelProfile` from the pool's configuration.
* `_rewrites.py`: a history rewritten instead of extended, and the warning when
  `SummarizationMiddleware` did it.
* `_plan.py`: the plan of one chat-model call — messages, sampling, the grammar of a forced
  tool call or a JSON reply.
* `_reply.py`: reading a reply as content or tool calls, and which streamed text may be shown yet.
* `_messages.py`: LangChain messages → agentmem chat messages.
* `_tools.py`: LangChain tools and `tool_choice` normalized; tool calls as LangChain's types.

Tool prompts, grammars and call parsing are agentmem's one protocol, `agentmem.tools`;
this package only adapts it to LangChain's types.

Installed by the `langchain` extra: `pip install 'agentmem-kv[langchain]'`.
"""

from __future__ import annotations

import agentmem  # noqa: F401 - first: llama.cpp's libraries before numpy (agentmem/engine/native_first.py)

try:
    import langchain_core  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a test with langchain_core hidden
    raise ImportError(
        "agentmem_langchain needs LangChain (langchain-core); install it with: pip install 'agentmem-kv[langchain]'"
    ) from exc

from agentmem.tools import close_shared_pools

from ._common import shared_pool
from .chat_models import ChatAgentMem
from .llms import AgentMemLLM
from .retrievers import AgentMemRetriever

__all__ = ["AgentMemLLM", "AgentMemRetriever", "ChatAgentMem", "close_shared_pools", "shared_pool"]
