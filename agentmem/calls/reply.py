"""Reading a reply: generated text → content and/or tool calls, a retry, the text to write back.

One reading for every front-end; each converts `Reply.calls` / `Reply.invalid`
(`agentmem.tools.ParsedCall`) into its own call type (OpenAI dicts, LangChain
`ToolCall`, AutoGen `FunctionCall`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentmem.calls.plan import CallPlan
from agentmem.tools import ParsedCall

__all__ = ["Reply", "read_reply"]


@dataclass
class Reply:
    """What a reply means.

    Attributes:
        text: the whole reply (a forced prefix included).
        content: the text a caller shows: the reply, or for calls the text before them
            (`None`: calls without text). A call that did not parse keeps its raw text here.
        calls: the valid calls (empty for a text reply).
        invalid: calls that opened but did not parse (cut off by `max_tokens`, say).
        retry: an `auto` reply that looked like a call but did not parse; redo it forced.
        written_back: for calls in a native format, the reply as the template writes it back
            into the next prompt; when the agent's KV holds other tokens the protocol prefills
            this text as the reply (`CallPlan.rewrite_call`), so the next call reuses its KV.
    """

    text: str = ""
    content: str | None = None
    calls: list[ParsedCall] = field(default_factory=list)
    invalid: list[ParsedCall] = field(default_factory=list)
    retry: bool = False
    written_back: str | None = None

    @property
    def is_call(self) -> bool:
        """Whether the reply is tool calls that all parsed."""
        return bool(self.calls) and not self.invalid


def _calls(plan: CallPlan, text: str, calls: list[ParsedCall], content: str | None = None) -> Reply:
    """A reply of valid `calls`; for a native format with the text the template writes back for them."""
    reply = Reply(text=text, content=content, calls=calls)
    if plan.fmt.native:
        reply.written_back = plan.fmt.written_back(content or "", [(c.name, c.arguments) for c in calls])
    return reply


def _lenient(plan: CallPlan, full: str) -> Reply:
    """Calls anywhere in the reply (AutoGen's reading); a malformed attempt is retried when it can be."""
    found = plan.fmt.find(full, plan.tool_names)
    if found is not None:
        return _calls(plan, full, found[0], found[1] or None)
    if plan.mode == "auto" and plan.forced is not None and plan.fmt.looks_like_call(full, plan.tool_names):
        return Reply(text=full, retry=True)
    return Reply(text=full, content=full)


def read_reply(plan: CallPlan, text: str) -> Reply:
    """What the generated `text` of `plan` means (in the plan's tool format).

    A forced call that does not parse (cut off by `max_tokens` or a stop string) comes
    back as its raw text in `content`, with its `invalid` calls and no valid ones.
    """
    full = plan.prefix + text
    if plan.mode in ("text", "json"):
        return Reply(text=full, content=full)
    if plan.lenient or plan.mode == "either":
        return _lenient(plan, full)
    parsed = plan.fmt.parse(full)
    if plan.mode == "auto":
        if parsed is None and plan.fmt.native:  # a call after some text, or in another shape
            found = plan.fmt.find(full, plan.tool_names)
            if found is not None:
                return _calls(plan, full, found[0], found[1] or None)
        if parsed is None:
            return Reply(text=full, content=full)
        bad = not parsed or any(not c.ok or c.name not in plan.tool_names for c in parsed)
        if bad and plan.forced is not None:
            return Reply(text=full, retry=True)
    if parsed is None or not parsed or any(not c.ok for c in parsed):
        parsed = parsed or []
        return Reply(text=full, content=full, calls=[c for c in parsed if c.ok], invalid=[c for c in parsed if not c.ok])
    return _calls(plan, full, parsed)
