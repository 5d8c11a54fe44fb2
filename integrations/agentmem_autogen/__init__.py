"""AutoGen integration of agentmem: a model client whose agents keep their KV state.

`AgentMemChatCompletionClient` is an AutoGen `ChatCompletionClient` (and a
serializable `Component`) over one shared `agentmem.MemoryPool`. Give
every AgentChat agent its own client — `clients_for(pool, ["pm", "engineer"])`
— and a team's turn switch restores the next agent's kept KV instead of
prefilling its whole history again.

>>> from agentmem import MemoryPool                                    # doctest: +SKIP
>>> from agentmem_autogen import clients_for                           # doctest: +SKIP
>>> clients = clients_for(MemoryPool(n_ctx=8192), ["pm", "engineer"])  # doctest: +SKIP

* `_client.py`: `AgentMemChatCompletionClient`, its serializable config and `clients_for`:
  what AutoGen sees (options, `create`/`create_stream`, token counts, usage, `close`).
* `_plan.py`: the plan of one call — which tools the reply may or must call, its grammar,
  a forced prefix, the redo of a malformed call — decided before anything is generated.
* `_execute.py`: runs a plan on the pool, streams its text, redoes a malformed call and
  builds the `CreateResult`.
* `_messages.py`: AutoGen messages and tools ↔ agentmem chat messages and tool schemas.
* `_memory.py`: `AgentMemMemory`, AutoGen's `Memory` over an agent: pinned facts and
  recall of its evicted text (`AssistantAgent(memory=[...])`).
* `_hints.py`: workflow hints for the pool — tool-call holds and selector candidates
  (no app code), `follow(team)` for a team's speaker order.

Needs AutoGen: `pip install 'agentmem-kv[autogen]'`.
"""

from __future__ import annotations

import agentmem  # noqa: F401 - first: llama.cpp's libraries before numpy (agentmem/engine/native_first.py)

import logging

try:
    import autogen_core  # noqa: F401
    import autogen_core.models  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "agentmem_autogen needs AutoGen (autogen-core); install it with: pip install 'agentmem-kv[autogen]'"
    ) from exc

from agentmem.tools import choice_grammar

from ._client import AgentMemChatCompletionClient, AgentMemChatCompletionClientConfig, clients_for
from ._hints import follow
from ._memory import AgentMemMemory, AgentMemMemoryConfig
from ._plan import SAMPLING_ARGS

__all__ = [
    "SAMPLING_ARGS",
    "AgentMemChatCompletionClient",
    "AgentMemChatCompletionClientConfig",
    "AgentMemMemory",
    "AgentMemMemoryConfig",
    "choice_grammar",
    "clients_for",
    "follow",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
