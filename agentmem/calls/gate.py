"""`StreamGate`: which streamed text of a reply may be shown now, and what is left to show at its end."""

from __future__ import annotations

from agentmem.calls.plan import CallPlan
from agentmem.calls.reply import Reply
from agentmem.tools import ToolFormat, opens_tool_call
from agentmem.tools.parse import CallGate

__all__ = ["StreamGate"]


class _LenientOpening:
    """`opens_call` for a lenient plan: the format's opening, else any JSON object or code fence may be a call."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt

    def opens_call(self, lead: str) -> bool | None:
        if self.fmt.native:
            native = self.fmt.opens_call(lead)
            if native is not False:
                return native
        return opens_tool_call(lead, lenient=True)


class StreamGate(CallGate):
    """Which streamed text may be shown now (`agentmem.tools.parse.CallGate`).

    Text replies stream as they come (a JSON reply starts with its forced prefix). A
    forced call, or a reply that may be a call or a document (`either`), is held to the
    end, where it goes out as calls. In `auto` mode the start of a reply is held while it
    could still be a call (`ToolFormat.opens_call` of the plan's format; for a `lenient`
    plan, which reads calls anywhere, also any JSON object or code fence).
    """

    def __init__(self, plan: CallPlan) -> None:
        opens = _LenientOpening(plan.fmt) if plan.lenient else plan.fmt
        super().__init__(opens, "tools" if plan.mode == "either" else plan.mode)
        self.opening = plan.prefix if plan.mode == "json" else ""

    def push(self, piece: str) -> str:
        """Text to show for the generated `piece` (possibly `""`)."""
        if self.opening:
            piece, self.opening = self.opening + piece, ""
        return super().push(piece)

    def rest(self, reply: Reply) -> str:
        """Held text still to show once the reply is known (`""` for calls and a retried reply)."""
        out = self.opening
        self.opening = ""
        if reply.is_call or reply.retry:
            return out
        if self.decided == "tool" and reply.content is not None:
            return out + reply.content  # a call that did not parse, or a document: its text is the content
        return out + self.held
