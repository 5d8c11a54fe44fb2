"""LangChain's standard integration suite for ChatAgentMem, on the instruct model.

The suite checks the adapter's contract (invoke, stream, tools, structured output, usage),
which needs a model that follows instructions: Qwen2.5-Coder-0.5B-Instruct. It ran on Gemma
3 270M too until issue #36 (the suite's time): that run added no adapter coverage, only the
base model's own limits (it does not choose to call a tool, copies digits of a schema's
bounds into arguments, ignores JSON keys named only in the prompt: six strict xfails).
ChatAgentMem on Gemma's template and its grammar-forced tool calls stays covered by
``test_langchain_real.py`` (both models) and Gemma's rendering by ``test_chat_format_real.py``.

Every model object here shares one pool (the shared pool of ``POOL_OPTIONS``),
created on the first call and closed at the end of the module.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("langchain_tests")

from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langchain_tests.integration_tests import ChatModelIntegrationTests  # noqa: E402

from agentmem_langchain import ChatAgentMem, close_shared_pools  # noqa: E402

pytestmark = pytest.mark.integration

# One thread: on a small shared CI box llama.cpp's thread barrier costs more than
# a second thread gains (measured: 48 vs 11 tokens/s on 2 busy cores).
POOL_OPTIONS: dict[str, Any] = {"n_ctx": 4096, "resident_agents": 2, "n_threads": 1}


@pytest.fixture(scope="module", autouse=True)
def _model(instruct_model_path: Any) -> Any:
    """Run the whole suite on the instruct model (skipped with a reason when its extra is absent), one shared pool."""
    TestChatAgentMemStandardIntegration.model_path = str(instruct_model_path)
    yield
    close_shared_pools()


class TestChatAgentMemStandardIntegration(ChatModelIntegrationTests):
    model_path: str = ""  # set by the `_model` fixture

    @property
    def chat_model_class(self) -> type[ChatAgentMem]:
        return ChatAgentMem

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # max_tokens: short replies keep the suite quick; 40 tokens still fit the standard jokes' JSON.
        return {"model_path": self.model_path, "pool_options": POOL_OPTIONS, "max_tokens": 40, "agent_id": "standard"}

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        return False  # the model is the pool's

    @property
    def supported_usage_metadata_details(self) -> dict[str, list[str]]:  # type: ignore[override]
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        """A second turn of one agent: its first turn's tokens are read from kept KV."""
        model = ChatAgentMem(**{**self.chat_model_params, "agent_id": "cache-read", "max_tokens": 8})
        history: list[Any] = [HumanMessage("Name three rivers of Europe.")]
        history.append(model.invoke(history))
        history.append(HumanMessage("And three in Asia?"))
        if not stream:
            return model.invoke(history)
        full = None
        for chunk in model.stream(history):
            full = chunk if full is None else full + chunk
        assert full is not None
        return AIMessage(content=full.content, usage_metadata=full.usage_metadata, response_metadata=full.response_metadata)

    @pytest.mark.xfail(
        reason="json_mode constrains syntax, not keys: Qwen2.5-Coder-0.5B-Instruct repeats the joke's setup "
        "sentence until max_tokens (40) and never writes the punchline key",
        strict=True,
    )
    def test_json_mode(self, model: Any) -> None:  # type: ignore[override]
        super().test_json_mode(model)
