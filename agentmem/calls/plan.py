"""`CallPlan`: one call, ready for the pool, and how its reply is to be read.

Every front-end (the server, LangChain, AutoGen, Agent Framework) turns its request
into a `CallPlan`, by `agentmem.calls.planning.plan_chat` or its own planner; the
protocol (`agentmem.calls.protocol`) runs it and reads the reply the same way for all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal

from agentmem.tools import ToolFormat, get_tool_format
from agentmem.tools.lazy import LazyGrammar

__all__ = ["CallPlan", "Mode"]

Mode = Literal["text", "json", "tools", "auto", "either"]
"""How a reply is read: `text`; `json` (grammar-constrained JSON); `tools` (a forced call);
`auto` (the model may call a tool); `either` (one grammar admits a call or a JSON
document, the parse decides)."""


@dataclass
class CallPlan:
    """One call, ready for the pool, and how to read its reply.

    Attributes:
        agent_id: the agent.
        messages: the chat history (with the tools/JSON block), or `None` for a raw completion.
        prompt: the raw completion prompt, or `None`.
        sampling: keyword arguments of `MemoryPool.chat_stream` / `complete_stream`
            (`tools`, `grammar`, `opening` and `canonical_calls` included).
        mode: how the reply is read (`Mode`).
        prefix: text a grammar forces at the start of the reply, put in the prompt (as the
            pool's `opening` for a native format, else as a started assistant turn) and
            prepended to the reply.
        tool_names: the functions the call offers.
        forced: in `auto` mode, builds the same call with a call forced (the retry).
        lazy: in `auto` mode, builds the lazy call grammar of the offered tools
            (`agentmem.tools.lazy.lazy_call_grammar`: free text until a call opens), for the
            one-decode strategy (`agentmem.calls.strategy.LazyCall`).
        fmt: the model's tool-call syntax (`MemoryPool.tool_format`).
        lenient: read calls anywhere in the reply (`ToolFormat.find`) and retry only a
            reply that `looks_like_call`; AutoGen's reading (default: a reply is a call
            when it parses as one, `ToolFormat.parse`).
        line: how a request without an agent id found `agent_id` (`Line.kind`; "" when named).
    """

    agent_id: str
    messages: list[dict[str, Any]] | None
    prompt: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    mode: Mode = "text"
    prefix: str = ""
    tool_names: tuple[str, ...] = ()
    forced: Callable[[], CallPlan] | None = None
    lazy: Callable[[], LazyGrammar] | None = None
    fmt: ToolFormat = field(default_factory=lambda: get_tool_format("envelope"))
    lenient: bool = False
    line: str = ""

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The tools the chat template shows (native formats only), as `MemoryPool.chat` takes them."""
        return self.sampling.get("tools")

    @property
    def grammar(self) -> str | None:
        """The grammar the reply is decoded under (`None`: free)."""
        return self.sampling.get("grammar")

    def rewrite_call(self, text: str) -> CallPlan:
        """A call that prefills `text` as the agent's reply and generates nothing (`Reply.written_back`)."""
        assert self.messages is not None, "a completion call has no messages"
        keep = {"tools": self.tools} if self.tools else {}
        return CallPlan(self.agent_id, [*self.messages, {"role": "assistant", "content": text}], None,
                        {**keep, "max_tokens": 0}, fmt=self.fmt)

    def pool_messages(self) -> list[dict[str, Any]]:
        """The messages to send (a forced prefix as a started assistant turn, unless sent as `opening`)."""
        assert self.messages is not None, "a completion call has no messages"
        if not self.prefix or "opening" in self.sampling:
            return self.messages
        return [*self.messages, {"role": "assistant", "content": self.prefix}]

    def with_sampling(self, **changes: Any) -> CallPlan:
        """The same plan with sampling keywords changed."""
        return replace(self, sampling={**self.sampling, **changes})
