"""LangChain's standard unit suite for ChatAgentMem (construction, params, tool binding).

These tests never call the model: they check that building the object is cheap
(loads nothing), that LangSmith params are right and that ``bind_tools`` /
``with_structured_output`` accept every standard form.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain_tests")

from langchain_tests.unit_tests import ChatModelUnitTests  # noqa: E402

from agentmem_langchain import ChatAgentMem  # noqa: E402


class TestChatAgentMemStandardUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatAgentMem]:
        return ChatAgentMem

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # No model path: the shared pool would be created on the first *call*,
        # which these tests never make.
        return {"agent_id": "standard-unit", "pool_options": {"n_ctx": 512}}

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        # The model is the pool's; a per-call ``model=`` cannot switch it.
        return False
