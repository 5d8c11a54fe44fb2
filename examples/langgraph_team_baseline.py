"""The same LangGraph supervisor team as ``langgraph_team.py``, on langchain-community's ``ChatLlamaCpp``.

One ``ChatLlamaCpp`` (one llama.cpp context) is shared by every node, as a LangGraph
app on it is written. llama-cpp-python keeps the KV of the *last* prompt only and
reuses its longest common prefix with the next one, so each switch to another node
re-reads that node's whole prompt from its system message on.

Same graph, same prompts (the GGUF's own chat template renders them in both, tools
included), greedy sampling, and the same context size, batch size and threads.
What was reused is read from llama-cpp-python itself: the tokens its context kept
when a call's prompt was evaluated (``Llama.n_tokens`` on the first ``eval``).

Run::

    pip install 'agentmem-kv[baselines]'     # langchain-community
    python examples/langgraph_team_baseline.py --threads 2
"""

from __future__ import annotations

import argparse
from typing import Any, Sequence

from langchain_core.messages import BaseMessage

from langgraph_team import main


class ChatLlamaCppBackend:
    """Every node talks to one shared ``ChatLlamaCpp``."""

    name = "langchain-community ChatLlamaCpp"
    no_tool = None  # its bind_tools takes no "none": unforced tools are described only

    def __init__(self, *, model: str, threads: int, max_tokens: int = 40) -> None:
        from langchain_community.chat_models import ChatLlamaCpp

        self.model = ChatLlamaCpp(
            model_path=model,
            n_ctx=8192,
            n_batch=512,  # ChatLlamaCpp's default of 8 would make prefill ~10x slower
            n_threads=threads,
            temperature=0.0,
            repeat_penalty=1.0,
            max_tokens=max_tokens,
            verbose=False,
            model_kwargs={"flash_attn": True, "n_threads_batch": threads},
        )
        self.client = self.model.client
        to_dicts = self.model._create_message_dicts

        def message_dicts(messages: list[BaseMessage]) -> list[dict[str, Any]]:
            # ChatLlamaCpp sends a tool-calling AI message with content None; templates that
            # concatenate content (ChatML) fail on it, and Qwen's renders "" and None alike
            return [{**d, "content": d.get("content") or ""} for d in to_dicts(messages)]

        object.__setattr__(self.model, "_create_message_dicts", message_dicts)
        self._first: tuple[int, int] | None = None
        evaluate = self.client.eval

        def counted_eval(tokens: Sequence[int]) -> None:
            if self._first is None:  # the prompt's suffix; n_tokens = the prefix kept from the last call
                self._first = (self.client.n_tokens, len(tokens))
            evaluate(tokens)

        self.client.eval = counted_eval  # type: ignore[method-assign]

    def attach(self, app: Any) -> None:
        pass

    def begin(self) -> None:
        self._first = None

    def metrics(self, message: BaseMessage) -> dict[str, Any]:
        kept, new = self._first or (0, 0)
        return {"agent": "(one context)", "kv": "prefix" if kept > 8 else "prefilled", "cache_read": kept,
                "prompt_tokens": kept + new}

    def close(self) -> None:
        self.client.close()


def factory(args: argparse.Namespace) -> ChatLlamaCppBackend:
    return ChatLlamaCppBackend(model=args.model, threads=args.threads, max_tokens=args.max_tokens)


if __name__ == "__main__":
    main(backend_factory=factory)
