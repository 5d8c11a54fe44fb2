"""LangChain's standard integration suite for ChatAgentMem on each bundled model.

The default model, Gemma 3 270M, is a *base* (pretrained, not instruction-tuned)
model: it continues text rather than following instructions. Grammar-constrained
decoding makes its forced tool calls and structured output valid; tests that need
it to *choose* to call a tool, or to pick JSON keys named only in the prompt, are
marked xfail with that reason, on Gemma only. The instruct model
(Qwen2.5-Coder-0.5B-Instruct) runs the same suite; its xfails name its own limits.

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

BASE_MODEL = "Gemma 3 270M is a base model, not instruction-tuned"
# The tool-calling xfails name limits of the base model (xfail_only_on: Gemma's runs); the instruct model passes them.


@pytest.fixture(scope="module", autouse=True)
def _model(default_model_path: Any) -> Any:
    """Run the whole suite on each bundled model in turn, one shared pool per model."""
    TestChatAgentMemStandardIntegration.model_path = str(default_model_path)
    yield
    close_shared_pools()


class TestChatAgentMemStandardIntegration(ChatModelIntegrationTests):
    model_path: str = ""  # set per bundled model by the `_model` fixture

    @property
    def chat_model_class(self) -> type[ChatAgentMem]:
        return ChatAgentMem

    @property
    def chat_model_params(self) -> dict[str, Any]:
        # max_tokens: the base model rarely ends a turn by itself, so every text
        # reply runs to the limit; 40 tokens still fit the standard jokes' JSON.
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

    _COPIES_BOUNDS = (
        f"{BASE_MODEL}: it copies digits of the schema's bounds (gt=-1000, lt=1000) into the argument and "
        "answers magic_function(300) for magic_function(3); the call itself is grammar-valid and in range"
    )

    @pytest.mark.xfail(reason=_COPIES_BOUNDS, strict=True)
    @pytest.mark.xfail_only_on("gemma-3-270m")
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_tool_calling(self, model: Any) -> None:  # type: ignore[override]
        super().test_tool_calling(model)

    @pytest.mark.xfail(reason=_COPIES_BOUNDS, strict=True)
    @pytest.mark.xfail_only_on("gemma-3-270m")
    async def test_tool_calling_async(self, model: Any) -> None:  # type: ignore[override]
        await super().test_tool_calling_async(model)

    @pytest.mark.xfail(reason=f"{BASE_MODEL}: with tool_choice='auto' it does not decide to call the tool", strict=True)
    @pytest.mark.xfail_only_on("gemma-3-270m")
    @pytest.mark.parametrize("model", [{}, {"output_version": "v1"}], indirect=True)
    def test_agent_loop(self, model: Any) -> None:  # type: ignore[override]
        super().test_agent_loop(model)

    @pytest.mark.xfail(
        reason=f"{BASE_MODEL}: it does not use JSON keys named only in the prompt (json_mode constrains syntax, not keys); "
        "Qwen2.5-Coder-0.5B-Instruct repeats the joke's setup sentence until max_tokens (40) and never writes "
        "the punchline key",
        strict=True,
    )
    def test_json_mode(self, model: Any) -> None:  # type: ignore[override]
        super().test_json_mode(model)
