"""Microsoft Agent Framework integration of agentmem: a chat client whose agents keep their KV state.

`AgentMemChatClient` is an `agent_framework` chat client (`BaseChatClient` with MAF's
middleware, function-invocation and telemetry layers) over one shared
`agentmem.MemoryPool`. Give every MAF agent its own client — `clients_for(pool,
["researcher", "writer"])` — and a workflow's hand-over restores the next agent's kept KV
instead of prefilling its whole history again.

>>> from agentmem import MemoryPool                                       # doctest: +SKIP
>>> from agentmem_maf import clients_for                                  # doctest: +SKIP
>>> clients = clients_for(MemoryPool(n_ctx=8192), ["researcher", "writer"])  # doctest: +SKIP

* `_client.py`: `AgentMemChatClient`, what MAF sees (options, streaming and not, usage
  with the reused KV as cached tokens, `close`), and `clients_for`.
* `_plan.py`: one call's MAF options → the core protocol's `agentmem.calls.CallPlan`
  (which `agentmem.calls.CallRunner` runs: one decode, a free tool turn under a lazy grammar, reading calls,
  holding streamed text back, writing a call back into the KV).
* `_messages.py`: MAF messages, tools, `tool_choice`, `response_format` and usage ↔
  agentmem's messages, tool schemas and counts.
* `_identity.py`: whose KV a call uses (the client's `agent_id`, its agent's name, the
  caller's session).
* `_memory.py`: `AgentMemContextProvider`, MAF's `ContextProvider` over an agent: pinned
  facts and recall of its evicted text.

Needs the Agent Framework: `pip install 'agentmem-kv[maf]'`.
"""

from __future__ import annotations

import agentmem  # noqa: F401 - first: llama.cpp's libraries before numpy (agentmem/engine/native_first.py)

import logging
from typing import Any, Iterable

try:
    import agent_framework  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "agentmem_maf needs the Microsoft Agent Framework (agent-framework-core); "
        "install it with: pip install 'agentmem-kv[maf]'"
    ) from exc

from agentmem import MemoryPool

from ._client import AgentMemChatClient
from ._identity import FALLBACK_AGENT_ID
from ._memory import AgentMemContextProvider

__all__ = ["FALLBACK_AGENT_ID", "AgentMemChatClient", "AgentMemContextProvider", "clients_for"]


def clients_for(pool: MemoryPool, agent_ids: Iterable[str], **options: Any) -> dict[str, AgentMemChatClient]:
    """One client per agent over one pool: `{agent_id: client}`.

    Args:
        pool: the shared pool (a `MemoryPool` of several models too: pass `model=` to bind them all to one model).
        agent_ids: distinct ids (use the agents' names).
        **options: keyword arguments for every client (`max_tokens`, `temperature`, ...).

    Raises:
        ValueError: a duplicate id.
    """
    ids = list(agent_ids)
    dup = sorted({a for a in ids if ids.count(a) > 1})
    if dup:
        raise ValueError(f"duplicate agent id(s) {dup}")
    return {a: AgentMemChatClient(pool, agent_id=a, **options) for a in ids}


logging.getLogger(__name__).addHandler(logging.NullHandler())
