"""AutoGen integration of agentmem: a model client whose agents keep their KV state.

`AgentMemChatCompletionClient` is an AutoGen `ChatCompletionClient` (and a
serializable `Component`) over one shared `agentmem.MemoryPool`. Give
every AgentChat agent its own client — `clients_for(pool, ["pm", "engineer"])`
— and a team's turn switch restores the next agent's kept KV instead of
prefilling its whole history again.

>>> from agentmem import MemoryPool                                    # doctest: +SKIP
>>> from agentmem_autogen import clients_for                           # doctest: +SKIP
>>> clients = clients_for(MemoryPool(n_ctx=8192), ["pm", "engineer"])  # doctest: +SKIP

Needs AutoGen: `pip install 'agentmem[autogen]'`.
"""

from __future__ import annotations

import logging

try:
    import autogen_core  # noqa: F401
    import autogen_core.models  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "agentmem_autogen needs AutoGen (autogen-core); install it with: pip install 'agentmem[autogen]'"
    ) from exc

from agentmem.tools import choice_grammar

from ._client import (
    SAMPLING_ARGS,
    AgentMemChatCompletionClient,
    AgentMemChatCompletionClientConfig,
    clients_for,
)

__all__ = [
    "SAMPLING_ARGS",
    "AgentMemChatCompletionClient",
    "AgentMemChatCompletionClientConfig",
    "choice_grammar",
    "clients_for",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
