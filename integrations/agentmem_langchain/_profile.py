"""LangChain's `ModelProfile` of an agentmem chat model: its context size and what it can do.

>>> from agentmem import PoolConfig
>>> p = profile_for(PoolConfig.build(n_ctx=4096, agent_budget_tokens=1024), 4096, "qwen")
>>> p["max_input_tokens"], p["tool_calling"], p["structured_output"]
(1024, True, True)
"""

from __future__ import annotations

from langchain_core.language_models.model_profile import ModelProfile

from agentmem import PoolConfig

__all__ = ["profile_for"]


def profile_for(config: PoolConfig, capacity: int, name: str) -> ModelProfile:
    """The profile of a model on a pool with `config` whose agents hold `capacity` tokens each.

    Args:
        config: the pool's configuration.
        capacity: tokens one agent's prompt may hold (`MemoryPool.capacity`).
        name: the model's name.

    `max_input_tokens` is the agent token budget when one is set (the pool evicts
    beyond it and keeps the rest), else `capacity`. Tool calls, `tool_choice` and
    structured output are grammar-constrained, so they are offered whatever the model.
    """
    budget = config.agent_budget_tokens
    return ModelProfile(
        name=name,
        open_weights=True,
        max_input_tokens=min(budget, capacity) if budget else capacity,
        max_output_tokens=capacity,
        text_inputs=True,
        image_inputs=False,
        image_url_inputs=False,
        pdf_inputs=False,
        audio_inputs=False,
        video_inputs=False,
        image_tool_message=False,
        pdf_tool_message=False,
        text_outputs=True,
        image_outputs=False,
        audio_outputs=False,
        video_outputs=False,
        reasoning_output=False,
        tool_calling=True,
        tool_choice=True,
        tool_call_streaming=True,
        structured_output=True,
        temperature=True,
    )
