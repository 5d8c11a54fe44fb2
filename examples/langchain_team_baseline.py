"""The same three-agent team as ``langchain_team.py``, on langchain-community's ``ChatLlamaCpp``.

One ``ChatLlamaCpp`` (one llama.cpp context) serves all three agents, as in a
typical LangChain app. llama-cpp-python keeps the KV of the *last* prompt only
and reuses its longest common prefix with the next one, so every switch to
another agent re-reads that agent's whole history (its team brief differs from
the first tokens on).

For a like-for-like run the prompts are made identical to agentmem's: a chat
format registered below renders the messages with agentmem's Gemma renderer
(llama-cpp-python's own ``gemma`` format drops system and tool messages) and
adds the same tool description that ``ChatAgentMem`` adds. Sampling is greedy in
both; batch size, context size, flash attention and threads are the same.

Run::

    pip install 'agentmem-kv[baselines]'     # langchain-community
    python examples/langchain_team_baseline.py --threads 1
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from llama_cpp import llama_chat_format

from agentmem.engine.builtin_formats import GemmaFormat
from agentmem.engine.chat_format import normalize_messages

# The exact tool block ChatAgentMem puts in the system prompt (prompt parity).
from agentmem.tools import tools_prompt, with_system_block
from agentmem_langchain._tools import normalize_tools
from langchain_team import main, search

_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id"}
_last_prompt: list[str] = [""]  # the prompt text of the latest call, for the cache metric


@llama_chat_format.register_chat_format("agentmem-gemma")
def _agentmem_gemma(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **_: Any) -> llama_chat_format.ChatFormatterResponse:
    msgs = [{k: v for k, v in m.items() if k in _KEYS and v is not None} for m in messages]
    for m in msgs:
        m.setdefault("content", "")
        if m["role"] == "user":
            m.pop("name", None)  # ChatLlamaCpp never sends names; keep both runs alike
    if tools:
        msgs = with_system_block(msgs, tools_prompt([t.as_dict() for t in normalize_tools(tools)]))
    text = "".join(s.text for s in GemmaFormat().render(normalize_messages(msgs), bos="", eos=""))
    _last_prompt[0] = text
    return llama_chat_format.ChatFormatterResponse(prompt=text, stop=["<end_of_turn>"])


class ChatLlamaCppBackend:
    """Every agent talks to one shared ``ChatLlamaCpp``."""

    name = "langchain-community ChatLlamaCpp"

    def __init__(self, *, model: str, threads: int) -> None:
        from langchain_community.chat_models import ChatLlamaCpp

        self.llm = ChatLlamaCpp(
            model_path=model,
            n_ctx=8192,
            n_batch=512,  # ChatLlamaCpp's default of 8 would make prefill ~10x slower
            n_threads=threads,
            temperature=0.0,
            repeat_penalty=1.0,
            max_tokens=48,
            verbose=False,
            model_kwargs={"chat_format": "agentmem-gemma", "flash_attn": True, "n_threads_batch": threads},
        )
        self.client = self.llm.client

    def _metrics(self, before: list[int]) -> dict[str, Any]:
        """Prompt size and what llama-cpp-python reused: the common prefix of this prompt with the
        tokens its context held before the call (the previous prompt and reply)."""
        new = self.client.tokenize(_last_prompt[0].encode(), add_bos=True, special=True)
        n = 0
        while n < min(len(before), len(new)) and before[n] == new[n]:
            n += 1
        n = min(n, len(new) - 1)  # it always re-evaluates the last prompt token
        return {"prompt_tokens": len(new), "cache_read": n, "kv": "prefix" if n > 8 else "prefilled"}

    def reply(self, agent: str, messages: list[BaseMessage], *, step: str, max_tokens: int) -> tuple[AIMessage, dict[str, Any]]:
        tools = agent == "researcher"
        model: Any = self.llm.bind_tools([search]) if tools else self.llm  # tools described, not forced
        before = list(self.client.input_ids)
        t0 = time.perf_counter()
        ttft = None
        text = ""
        for chunk in model.stream(messages, max_tokens=max_tokens):
            if ttft is None and chunk.content:
                ttft = 1e3 * (time.perf_counter() - t0)
            text += chunk.text
        metrics = self._metrics(before)
        metrics["ttft_ms"] = ttft if ttft is not None else 1e3 * (time.perf_counter() - t0)
        return AIMessage(text), metrics

    def call_tool(self, agent: str, messages: list[BaseMessage], *, max_tokens: int) -> tuple[AIMessage, dict[str, Any]]:
        before = list(self.client.input_ids)
        t0 = time.perf_counter()
        msg = self.llm.bind_tools([search], tool_choice="search").invoke(messages, max_tokens=max_tokens)
        metrics = self._metrics(before)
        metrics["ttft_ms"] = 1e3 * (time.perf_counter() - t0)  # no streaming for forced calls: total time
        assert isinstance(msg, AIMessage)
        return msg, metrics

    def close(self) -> None:
        self.client.close()


def _factory(args: argparse.Namespace) -> ChatLlamaCppBackend:
    from agentmem import resolve_model_path

    return ChatLlamaCppBackend(model=str(resolve_model_path(args.model)), threads=args.threads)


if __name__ == "__main__":
    main(backend_factory=_factory)
