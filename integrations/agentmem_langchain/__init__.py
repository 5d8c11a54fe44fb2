"""LangChain integration of agentmem: chat models whose agents keep their KV memory.

>>> from agentmem_langchain import ChatAgentMem          # doctest: +SKIP
>>> coder = ChatAgentMem(agent_id="coder")               # loads nothing yet
>>> coder.invoke("Write a haiku.").usage_metadata        # doctest: +SKIP

* `ChatAgentMem`: `BaseChatModel` (tools, structured output, streaming, async).
* `AgentMemLLM`: `BaseLLM` for prompt-string chains.
* `shared_pool` / `close_shared_pools`: the process-wide pools that objects built
  without `pool=` share (`agentmem.tools.registry`, shared with the AutoGen client).

Tool prompts, grammars and call parsing are agentmem's one protocol, `agentmem.tools`;
this package only adapts it to LangChain's types.

Installed by the `langchain` extra: `pip install 'agentmem[langchain]'`.
"""

from __future__ import annotations

try:
    import langchain_core  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a test with langchain_core hidden
    raise ImportError(
        "agentmem_langchain needs LangChain (langchain-core); install it with: pip install 'agentmem[langchain]'"
    ) from exc

from agentmem.tools import close_shared_pools

from ._common import shared_pool
from .chat_models import ChatAgentMem
from .llms import AgentMemLLM

__all__ = ["AgentMemLLM", "ChatAgentMem", "close_shared_pools", "shared_pool"]
