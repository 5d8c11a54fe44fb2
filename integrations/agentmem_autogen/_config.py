"""`AgentMemChatCompletionClientConfig`: what `AgentMemChatCompletionClient.dump_component` stores.

A pydantic model AutoGen serializes beside the client's provider name; `_from_config`
builds the client back from it (the pool found again by its `PoolConfig`, or opened).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from autogen_core.models import ModelInfo
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AgentMemChatCompletionClientConfig"]


class AgentMemChatCompletionClientConfig(BaseModel):
    """Serializable configuration of `AgentMemChatCompletionClient` (`dump_component`)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    agent_id: Optional[str] = None
    """Whose KV this client uses in the pool. `None`: the AutoGen agent making the call
    (its runtime `AgentId`), so one client can serve a whole team."""
    pool: Dict[str, Any] = Field(default_factory=dict)
    """The pool's `agentmem.PoolConfig` as a dict; an open pool with the same
    configuration in this process is reused instead of loading the model again."""
    max_tokens: int = 256
    """Tokens to generate at most per call (`extra_create_args` may override)."""
    temperature: float = 0.0
    """Sampling temperature; `0` is greedy (deterministic)."""
    create_args: Dict[str, Any] = Field(default_factory=dict)
    """Default sampling options: `top_k`, `top_p`, `min_p`, `repeat_penalty`,
    `repeat_last_n`, `seed`, `stop`, `grammar` (GBNF)."""
    parallel_tool_calls: bool = False
    """Let one reply call several tools (default: one call per reply, which keeps a
    small model from looping)."""
    force_tools: bool = False
    """Treat `tool_choice="auto"` as `"required"` when a call offers tools: every such
    reply is a grammar-valid tool call. For small models that rarely decide to call a
    tool on their own (AgentChat's AssistantAgent has no `tool_choice` argument)."""
    speaker_selection: bool = False
    """For the client of a `SelectorGroupChat`: constrain a reply to one of the candidate
    names its selection prompt lists (`select the next role from ['pm', 'engineer'] ...`,
    the last such list in the prompt), so a small model always names a valid speaker;
    the candidates, then the answer, are told to the pool as hints (`MemoryPool.expect`)."""
    model_info: Optional[ModelInfo] = None
    """Overrides `AgentMemChatCompletionClient.DEFAULT_MODEL_INFO`."""
