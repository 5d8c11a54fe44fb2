"""The chat formats written here: Gemma's turns and ChatML (`FORMATS`), as `ChatFormat` strategies.

A message's segments depend only on the message, its index (Gemma folds a leading
system message into the first user turn) and whether it ends the conversation (a final
assistant message is continued), so `BuiltinFormat.render_tail` renders from the last
kept message on and the renderer keeps the segments before it
(`agentmem.engine.prompt_memo`).
"""

from __future__ import annotations

import abc
from typing import Any, Mapping, Sequence

from agentmem.engine.chat_format import (
    ChatFormat,
    Controls,
    Message,
    Segment,
    TailRender,
    content_part,
    continues_turn,
    markup_part,
    tool_calls_text,
)

__all__ = ["FORMATS", "BuiltinFormat", "ChatMLFormat", "GemmaFormat"]


class BuiltinFormat(ChatFormat):
    """A format written here: a message's segments depend on it, its index, and whether it is last."""

    def render_tail(
        self,
        messages: Sequence[Message],
        *,
        kept: int,
        state: Any,
        bos: str,
        eos: str,
        controls: Controls | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> TailRender:
        start = kept - 1 if kept >= 2 else 0  # the last kept message was last: render it again
        return TailRender(start, self.render(messages, bos=bos, eos=eos, controls=controls, tools=tools, start=start))

    @abc.abstractmethod
    def render(
        self,
        messages: Sequence[Message],
        *,
        bos: str,
        eos: str,
        controls: Controls | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        start: int = 0,
    ) -> list[Segment]:
        """`ChatFormat.render`; `start` > 0 leaves out the segments of the messages before it."""


class GemmaFormat(BuiltinFormat):
    """Gemma turns; system text joins the first user turn like Gemma 3's template."""

    name = "gemma"

    def render(
        self,
        messages: Sequence[Message],
        *,
        bos: str,
        eos: str,
        controls: Controls | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        start: int = 0,
    ) -> list[Segment]:
        first = "system" if messages[0].role == "system" else "user"
        segs: list[Segment] = [Segment((markup_part(bos),), first, -1)] if bos and not start else []
        cont = continues_turn(messages)
        n = len(messages)
        i = 0
        merged_first_user = False
        if messages[0].role == "system":
            sysm = messages[0]
            if n > 1 and messages[1].role == "user":  # Gemma 3: system text opens the first user turn
                parts = (markup_part("<start_of_turn>user\n"), content_part(sysm.content), markup_part("\n\n"))
                merged_first_user = True
            else:
                parts = (markup_part("<start_of_turn>user\n"), content_part(sysm.content), markup_part("<end_of_turn>\n"))
            if not start:
                segs.append(Segment(parts, "system", 0, sysm.pin))
            i = 1
        for k in range(max(i, start), n):
            m = messages[k]
            last = k == n - 1
            if m.role == "user":
                head = "" if (merged_first_user and k == 1) else "<start_of_turn>user\n"
                who = (content_part(m.name), markup_part(": ")) if m.name else ()
                parts = (markup_part(head), *who, content_part(m.content.strip()), markup_part("<end_of_turn>\n"))
                segs.append(Segment(parts, "user", k, m.pin))
            elif m.role == "system":
                parts = (markup_part("<start_of_turn>user\n"), content_part(m.content), markup_part("<end_of_turn>\n"))
                segs.append(Segment(parts, "system", k, m.pin))
            elif m.role == "tool":
                label = m.name or m.tool_call_id or ""
                parts = (
                    markup_part("<start_of_turn>user\nTool result ("), content_part(label), markup_part("):\n"), content_part(m.content), markup_part("<end_of_turn>\n")
                )
                segs.append(Segment(parts, "tool_result", k, m.pin))
            else:  # assistant
                if last and cont:
                    segs.append(Segment((markup_part("<start_of_turn>model\n"), content_part(m.content.lstrip())), "assistant", k, m.pin))
                    continue
                text = m.content.strip()
                if m.tool_calls:
                    body = (content_part(text), markup_part("\n")) if text else ()
                    segs.append(Segment((markup_part("<start_of_turn>model\n"), *body), "assistant", k, m.pin))
                    parts = (content_part(tool_calls_text(m.tool_calls)), markup_part("<end_of_turn>\n"))
                    segs.append(Segment(parts, "tool_call", k, m.pin))
                else:
                    parts = (markup_part("<start_of_turn>model\n"), content_part(text), markup_part("<end_of_turn>\n"))
                    segs.append(Segment(parts, "assistant", k, m.pin))
        if not cont:
            segs.append(Segment((markup_part("<start_of_turn>model\n"),), "assistant", -1))
        return segs


class ChatMLFormat(BuiltinFormat):
    """`<|im_start|>role\\n…<|im_end|>` turns (Qwen, many fine-tunes)."""

    name = "chatml"

    def render(
        self,
        messages: Sequence[Message],
        *,
        bos: str,
        eos: str,
        controls: Controls | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        start: int = 0,
    ) -> list[Segment]:
        first = messages[0].role if messages[0].role == "system" else "user"
        segs: list[Segment] = [Segment((markup_part(bos),), first, -1)] if bos and not start else []
        cont = continues_turn(messages)
        n = len(messages)
        for k in range(start, n):
            m = messages[k]
            if m.role == "assistant" and k == n - 1 and cont:
                segs.append(Segment((markup_part("<|im_start|>assistant\n"), content_part(m.content)), "assistant", k, m.pin))
                continue
            if m.role == "assistant" and m.tool_calls:
                body = (content_part(m.content), markup_part("\n")) if m.content else ()
                segs.append(Segment((markup_part("<|im_start|>assistant\n"), *body), "assistant", k, m.pin))
                parts = (content_part(tool_calls_text(m.tool_calls)), markup_part("<|im_end|>\n"))
                segs.append(Segment(parts, "tool_call", k, m.pin))
                continue
            region = {"tool": "tool_result"}.get(m.role, m.role)
            who = (content_part(m.name), markup_part(": ")) if (m.name and m.role == "user") else ()
            parts = (markup_part(f"<|im_start|>{m.role}\n"), *who, content_part(m.content), markup_part("<|im_end|>\n"))
            segs.append(Segment(parts, region, k, m.pin))
        if not cont:
            segs.append(Segment((markup_part("<|im_start|>assistant\n"),), "assistant", -1))
        return segs


FORMATS: dict[str, type[ChatFormat]] = {"gemma": GemmaFormat, "chatml": ChatMLFormat}
"""The built-in formats by name; `jinja` is `agentmem.engine.jinja_format.JinjaFormat`, picked by
`agentmem.engine.renderer.select_format`."""
