"""The model's own jinja2 chat template as a chat format, with message content kept as text.

`JinjaFormat` renders a GGUF's `tokenizer.chat_template` in the limited sandbox of
`agentmem.engine.template_sandbox`, finds each message's content in the render with
unforgeable markers (so content is tokenized as text and only the template's markup
yields control tokens), and splits the render into per-message regions in linear time.

Tools reach the template as its `tools` variable (OpenAI shape) when the template
writes calls in a native syntax (`agentmem.tools.formats`); past calls reach it as
`tool_calls` with object arguments, which its `tojson` writes back exactly as the
model emitted them. A template without tool support gets past calls as agentmem's
envelope in the message content. A template that drops `name` gets the speaker's
name in the content of user messages, as `name: content` (the built-in formats' form).
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import re
import secrets
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from agentmem.engine.chat_format import (
    ChatFormat,
    Controls,
    Message,
    Part,
    Segment,
    ToolCall,
    content_part,
    continues_turn,
    markup_part,
)
from agentmem.errors import ChatTemplateError, MessageError
from agentmem.tools.formats import ToolFormat, detect_tool_format

if TYPE_CHECKING:
    from agentmem.engine.template_sandbox import RenderLimits

__all__ = ["JinjaFormat"]

logger = logging.getLogger(__name__)

_warned: set[int] = set()  # templates whose call re-render was found not to match (logged once)


class _Markers:
    """Unforgeable markers around each message's content in a jinja render.

    The template renders once with every content wrapped as
    `leading space + OPEN(k) + content.strip() + CLOSE(k) + trailing space` (a
    `trim` filter then still trims what it would have trimmed), so the render says
    where each message's text lies. A marker holds a random nonce drawn for this
    render and absent from every message, so no message can fake one.
    """

    def __init__(self, messages: Sequence[Message]) -> None:
        texts = [m.content for m in messages]
        while True:
            nonce = secrets.token_hex(8)
            if not any(nonce in t for t in texts):
                break
        self.nonce = nonce
        self._re = re.compile("\ue000" + nonce + r":(\d+):([oc])\ue001")

    def wrap(self, k: int, content: str) -> str:
        core = content.strip()
        if not core:
            return f"{content}\ue000{self.nonce}:{k}:o\ue001\ue000{self.nonce}:{k}:c\ue001"
        lead = content[: len(content) - len(content.lstrip())]
        trail = content[len(content.rstrip()) :]
        return f"{lead}\ue000{self.nonce}:{k}:o\ue001{core}\ue000{self.nonce}:{k}:c\ue001{trail}"

    def strip(self, rendered: str) -> tuple[str, list[tuple[int, int, int]]] | None:
        """The render without markers, and the `(start, end, message)` content spans in it.

        None when the markers do not pair up (the template cut or rewrote a content).
        """
        out: list[str] = []
        spans: list[tuple[int, int, int]] = []
        pos = n = 0
        open_k, open_at = -1, 0
        for mk in self._re.finditer(rendered):
            out.append(rendered[pos : mk.start()])
            n += mk.start() - pos
            pos = mk.end()
            k, kind = int(mk.group(1)), mk.group(2)
            if kind == "o":
                if open_k != -1:
                    return None
                open_k, open_at = k, n
            else:
                if open_k != k:
                    return None
                spans.append((open_at, n, k))
                open_k = -1
        if open_k != -1:
            return None
        out.append(rendered[pos:])
        return "".join(out), spans


def _split_parts(text: str, a: int, b: int, spans: Sequence[tuple[int, int, int]], i: int) -> tuple[tuple[Part, ...], int]:
    """Parts of `text[a:b]`: content spans (from index `i` on, sorted) untrusted, the rest markup.

    Returns the parts and the index of the first span not yet passed.
    """
    parts: list[Part] = []
    pos = a
    while i < len(spans) and spans[i][0] < b:
        s0, s1, _ = spans[i]
        s0, s1e = max(s0, pos), min(s1, b)
        if s0 > pos:
            parts.append(markup_part(text[pos:s0]))
        if s1e > s0:
            parts.append(content_part(text[s0:s1e]))
        pos = max(pos, s1e)
        if s1 > b:  # the span goes on in the next segment
            break
        i += 1
    if pos < b:
        parts.append(markup_part(text[pos:b]))
    return tuple(parts), i


class JinjaFormat(ChatFormat):
    """The model's own jinja2 chat template; regions from cumulative renders.

    Message content is located in the render with `_Markers`, so it is tokenized
    as text while the template's markup keeps its control tokens. A template that
    rewrites content beyond trimming whitespace (the markers do not survive, or
    its markup changes with the content's control-token strings) cannot be split
    that way; then a message whose text holds a control-token string is refused
    with `MessageError` instead of being rendered into a forged turn.
    """

    name = "jinja"
    _deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("agentmem_jinja_deadline", default=None)
    _tools: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar("agentmem_jinja_tools", default=None)

    def __init__(self, template: str, *, limits: RenderLimits | None = None) -> None:
        """Compile `template` in the limited sandbox (raises `ChatTemplateError`).

        Args:
            template: the jinja2 source.
            limits: time and output budget of one `render` call (all its renders).
        """
        from agentmem.engine.template_sandbox import SandboxedTemplate

        self._tpl = SandboxedTemplate(template, limits)
        self._tool_format: ToolFormat = detect_tool_format(template)
        self.keeps_names = self._probe_names()
        self.call_render_matches = self._probe_call_render(hash(template))

    @property
    def tool_format(self) -> ToolFormat:
        """The tool-call syntax detected in the template (`agentmem.tools.formats.detect_tool_format`)."""
        return self._tool_format

    # ---- what the template does with names and calls (probed once)
    def _probe_names(self) -> bool:
        """Whether the template writes a message's `name` anywhere."""
        nonce = "n" + secrets.token_hex(6)
        try:
            out = self._render([Message("user", "hi", name=nonce)], True, "", "")
        except (MessageError, ChatTemplateError):
            return False
        return nonce in out

    def _probe_call_render(self, key: int) -> bool:
        """Whether a past call renders back as exactly the text the model is made to emit."""
        args = {"b": 1, "a": "x<y & 'z' é"}
        call = Message("assistant", "", tool_calls=(ToolCall("call_1", "probe_tool", args),))
        want = self.tool_format.render_call([("probe_tool", args)])
        try:
            out = self._render(self._prepared([Message("user", "hi"), call]), False, "", "")
        except (MessageError, ChatTemplateError):
            out = ""
        ok = want in out
        if not ok and key not in _warned:
            _warned.add(key)
            logger.warning(
                "this chat template (tool format %r) writes past tool calls back differently from how the model "
                "emits them; the KV of each call is re-prefilled on the next turn (see docs: native tool formats)",
                self.tool_format.name,
            )
        return ok

    def _prepared(self, messages: Sequence[Message]) -> list[Message]:
        """Messages as the template gets them: speaker names and, without native tools, calls in the content."""
        out: list[Message] = []
        for m in messages:
            if m.name and m.role == "user" and not self.keeps_names:
                m = dataclasses.replace(m, content=f"{m.name}: {m.content}", name=None)
            if m.tool_calls and not self.tool_format.native:
                call = self.tool_format.render_call([(c.name, c.arguments) for c in m.tool_calls])
                m = dataclasses.replace(m, content=f"{m.content.strip()}\n{call}" if m.content.strip() else call, tool_calls=())
            out.append(m)
        return out

    @staticmethod
    def _as_dict(m: Message, content: str) -> dict[str, Any]:
        d: dict[str, Any] = {"role": m.role, "content": content}
        if m.name:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                for c in m.tool_calls
            ]
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        return d

    def _render(
        self, msgs: Sequence[Message], gen: bool, bos: str, eos: str, contents: Sequence[str] | None = None
    ) -> str:
        texts = contents if contents is not None else [m.content for m in msgs]
        variables = {
            "messages": [self._as_dict(m, t) for m, t in zip(msgs, texts)],
            "tools": self._tools.get(),
            "add_generation_prompt": gen,
            "bos_token": bos,
            "eos_token": eos,
        }
        return self._tpl.render(variables, deadline=self._deadline.get())

    def _locate(
        self,
        messages: Sequence[Message],
        gen: bool,
        bos: str,
        eos: str,
        full: str,
        controls: Controls | None,
        marks: _Markers,
    ) -> list[tuple[int, int, int]] | None:
        """Content spans of `full`, or None when the template's render cannot be split safely."""
        wrapped = [marks.wrap(k, m.content) for k, m in enumerate(messages)]
        located = marks.strip(self._render(messages, gen, bos, eos, wrapped))
        if (located is None or located[0] != full) and any(not m.content for m in messages):
            # a template testing `if message.content` sees markers as content: leave empty ones bare
            wrapped = [w if m.content else "" for w, m in zip(wrapped, messages)]
            located = marks.strip(self._render(messages, gen, bos, eos, wrapped))
        if located is None or located[0] != full:
            return None
        spans = located[1]
        if controls is not None:
            found = [controls(m.content) for m in messages]
            if any(found):  # the markup must not change when the control strings are taken out
                cleaned = [_drop(m.content, f) for m, f in zip(messages, found)]
                again = marks.strip(self._render(messages, gen, bos, eos, [marks.wrap(k, t) for k, t in enumerate(cleaned)]))
                if again is None or _markup(*again) != _markup(full, spans):
                    return None
        return spans

    def render(
        self,
        messages: Sequence[Message],
        *,
        bos: str,
        eos: str,
        controls: Controls | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Segment]:
        """Segments of the template's render; `tools` reach it only when its tool format is native."""
        token = self._deadline.set(self._tpl.deadline())  # one deadline for all renders of this call
        shown = _openai_tools(tools) if tools and self.tool_format.native else None
        tools_token = self._tools.set(shown)
        try:
            return self._segments(messages, bos, eos, controls)
        finally:
            self._tools.reset(tools_token)
            self._deadline.reset(token)

    def _segments(self, messages: Sequence[Message], bos: str, eos: str, controls: Controls | None) -> list[Segment]:
        if controls is not None:
            _refuse_controls_outside_content(messages, controls)
        calls = [bool(m.tool_calls) for m in messages]
        cont = continues_turn(messages)  # before calls move into content (a call is never continued)
        messages = self._prepared(messages)
        full = self._render(messages, not cont, bos, eos)
        marks = _Markers(messages)
        spans = self._locate(messages, not cont, bos, eos, full, controls, marks)
        if spans is None:
            logger.debug("chat template rewrites message content; content kept apart by refusal only")
            if controls is not None:
                for k, m in enumerate(messages):
                    found = controls(m.content)
                    if found:
                        raise MessageError(
                            f"messages[{k}].content contains the control token {found[0]!r}, and this chat template "
                            "rewrites message content, so it cannot be kept as text; remove it or use chat_format='chatml'/'gemma'"
                        )
            spans = []
        if cont:  # cut everything the template adds after the final assistant content
            last = [s for s in spans if s[2] == len(messages) - 1]
            if last:
                full = full[: last[-1][1]]
            else:
                tail = messages[-1].content
                j = full.rfind(tail) if tail else -1
                full = full[: j + len(tail)] if j != -1 else full
        segs: list[Segment] = []
        prev = 0
        i = 0
        for k, b in enumerate(self._ends(messages, bos, eos, full, spans, marks)):
            b = min(b, len(full))
            if b > prev:
                m = messages[k]
                region = "tool_call" if calls[k] else {"tool": "tool_result"}.get(m.role, m.role)
                parts, i = _split_parts(full, prev, b, spans, i)
                segs.append(Segment(parts, region, k, m.pin))
                prev = b
        if prev < len(full):
            parts, i = _split_parts(full, prev, len(full), spans, i)
            segs.append(Segment(parts, "assistant", -1))
        return segs


    # ---- regions: where each message's part of the render ends
    def _ends(
        self,
        messages: Sequence[Message],
        bos: str,
        eos: str,
        full: str,
        spans: Sequence[tuple[int, int, int]],
        marks: _Markers,
    ) -> list[int]:
        """End of each message's region in `full`, in linear time.

        A message's region ends where the render of the conversation up to it (no
        generation prompt) stops agreeing with `full`. For a message whose content
        was located, that is its content's end plus the part of its *tail* (what the
        template writes after the content when the message is the last one) that
        `full` repeats there; the tail comes from rendering the message alone (or
        after the one before it, for templates that insist on alternation), so each
        message costs one small render instead of a render of the whole prefix. A
        message without located content (a template that drops it, or rewrites
        content) falls back to rendering the prefix.
        """
        close = {k: s1 for _, s1, k in spans}
        ends = []
        for k in range(len(messages)):
            tail = self._tail(messages, k, bos, eos, marks) if k in close else None
            if tail is not None:
                c = close[k]
                ends.append(c + _common_prefix(tail, full[c : c + len(tail)]))
                continue
            try:
                part = self._render(messages[: k + 1], False, bos, eos)
            except MessageError:
                part = ""  # e.g. a template that insists on alternation for prefixes
            ends.append(_common_prefix(part, full))
        return ends

    def _tail(self, messages: Sequence[Message], k: int, bos: str, eos: str, marks: _Markers) -> str | None:
        """What the template writes after message `k`'s content when it ends the conversation."""
        for probe in ((k,), (k - 1, k)) if k else ((k,),):
            msgs = [messages[j] for j in probe]
            try:
                out = self._render(msgs, False, bos, eos, [marks.wrap(j, m.content) for j, m in zip(probe, msgs)])
            except (MessageError, ChatTemplateError):
                if time.monotonic() > (self._deadline.get() or float("inf")):
                    raise
                continue
            located = marks.strip(out)
            ends = [s1 for _, s1, j in located[1] if j == k] if located else []
            if ends:
                return located[0][ends[-1] :]
        return None


def _arguments(arguments: Any) -> Any:
    """Call arguments for a template: a JSON string decoded (key order kept) so `tojson` writes an object."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def _openai_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`{"name", "description", "parameters"}` tools (or OpenAI-shaped ones) as templates expect them."""
    from agentmem.tools.prompt import prompt_schema

    out = []
    for t in tools:
        fn = t["function"] if t.get("type") == "function" and isinstance(t.get("function"), Mapping) else t
        out.append({"type": "function", "function": {
            "name": fn["name"], "description": (fn.get("description") or "").strip(), "parameters": prompt_schema(fn.get("parameters")),
        }})
    return out


def _common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of `a` and `b` (string compares in C, no per-character loop)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _drop(text: str, found: Sequence[str]) -> str:
    """`text` with its control-token strings replaced by a neutral character.

    Not removed: a content ending (or made only of) a control string would then end
    in whitespace (or be empty), which `_Markers.wrap` places differently, and the
    markup comparison would refuse a template that does not touch content at all.
    """
    for s in set(found):
        text = text.replace(s, "\ue002")
    return text


def _markup(text: str, spans: Sequence[tuple[int, int, int]]) -> list[str]:
    """The pieces of `text` outside the content spans."""
    out, pos = [], 0
    for s0, s1, _ in spans:
        out.append(text[pos:s0])
        pos = s1
    out.append(text[pos:])
    return out


def _refuse_controls_outside_content(messages: Sequence[Message], controls: Controls) -> None:
    """Names, tool-call ids and tool calls reach a jinja template as markup: refuse control strings in them."""
    for k, m in enumerate(messages):
        fields: list[tuple[str, str]] = [("name", m.name or ""), ("tool_call_id", m.tool_call_id or "")]
        for j, c in enumerate(m.tool_calls):
            fields += [(f"tool_calls[{j}].id", c.id), (f"tool_calls[{j}].name", c.name),
                       (f"tool_calls[{j}].arguments", c.arguments_json())]
        for where, value in fields:
            found = controls(value) if value else []
            if found:
                raise MessageError(f"messages[{k}].{where} contains the control token {found[0]!r}")
