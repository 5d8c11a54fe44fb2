"""The model's own jinja2 chat template as a chat format, with message content kept as text.

`JinjaFormat` renders a GGUF's `tokenizer.chat_template` in the limited sandbox of
`agentmem.engine.template_sandbox`, finds each message's content and every string of
the tools in the render with unforgeable markers (`agentmem.engine.jinja_text`: they are
tokenized as text and only the template's markup yields control tokens), and splits the
render into per-message regions in linear time.

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
import secrets
import time
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import jinja2

from agentmem.engine.chat_format import (
    ChatFormat,
    Controls,
    Message,
    Part,
    Segment,
    TailRender,
    ToolCall,
    content_part,
    continues_turn,
    markup_part,
)
from agentmem.engine.jinja_locality import is_local
from agentmem.engine.jinja_tail import End, JinjaState, PrefixEnd, common_prefix as _common_prefix, render_from
from agentmem.engine.jinja_text import (
    Markers,
    drop_controls,
    drop_tree,
    markup_pieces,
    refuse_controls_in_tools,
    refuse_controls_outside_content,
    tool_controls,
)
from agentmem.errors import ChatTemplateError, MessageError
from agentmem.tools.formats import ToolFormat, detect_tool_format

if TYPE_CHECKING:
    from agentmem.engine.template_sandbox import RenderLimits

__all__ = ["JinjaFormat"]

logger = logging.getLogger(__name__)

_warned: set[int] = set()  # templates whose call re-render was found not to match (logged once)


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

    Message content, and every string of the tools (names, descriptions, parameter
    names, enum values), is located in the render with `Markers`, so it is tokenized
    as text while the template's markup keeps its control tokens. A template that
    rewrites content beyond trimming whitespace (the markers do not survive, or
    its markup changes with the content's control-token strings) cannot be split
    that way; then a message whose text holds a control-token string is refused
    with `MessageError` instead of being rendered into a forged turn (and so is a tool
    string holding one).
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
        self.volatile = "strftime_now" in template  # reads the clock: the same messages may render differently
        # renders from a window (`agentmem.engine.jinja_tail`); never a template reading the clock (its date anywhere)
        self.local = not self.volatile and is_local(jinja2.Environment(), template)

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
        self, msgs: Sequence[Message], gen: bool, bos: str, eos: str, contents: Sequence[str] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The template's render; `contents` and `tools` (when given) stand in for the messages' and the call's."""
        texts = contents if contents is not None else [m.content for m in msgs]
        variables = {
            "messages": [self._as_dict(m, t) for m, t in zip(msgs, texts)],
            "tools": tools if tools is not None else self._tools.get(),
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
        marks: Markers,
    ) -> tuple[list[tuple[int, int, int]], bool] | None:
        """Text spans of `full` (message contents and every string of the tools), and whether empty
        contents were left bare, or None when the template's render cannot be split safely.

        The strings of the tools carry the index `len(messages)`: they belong to no message.
        """
        shown = self._tools.get()

        def located(contents: Sequence[str], tools: Any, bare: bool) -> tuple[str, list[tuple[int, int, int]]] | None:
            wrapped = [marks.wrap(k, t) if (t or not bare) else "" for k, t in enumerate(contents)]
            tree = marks.wrap_tree(len(messages), tools) if tools else None
            return marks.strip(self._render(messages, gen, bos, eos, wrapped, tree))

        contents = [m.content for m in messages]
        # a template testing `if message.content` sees markers as content: then leave empty ones bare
        for bare in (False, True) if any(not t for t in contents) else (False,):
            found = located(contents, shown, bare)
            if found is not None and found[0] == full:
                break
        else:
            return None
        spans = found[1]
        if controls is not None:
            in_msgs = [controls(t) for t in contents]
            in_tools = tool_controls(shown, controls)
            if any(in_msgs) or in_tools:  # the markup must not change when the control strings are taken out
                cleaned = [drop_controls(t, f) for t, f in zip(contents, in_msgs)]
                again = located(cleaned, drop_tree(shown, in_tools) if in_tools else shown, bare)
                if again is None or markup_pieces(*again) != markup_pieces(full, spans):
                    return None
        return spans, bare

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
        return self.render_tail(messages, kept=0, state=None, bos=bos, eos=eos, controls=controls, tools=tools).segments

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
        """`ChatFormat.render_tail`: from the last kept message on when the template's render of the whole
        conversation still starts with the kept text (`agentmem.engine.jinja_tail`), else everything."""
        token = self._deadline.set(self._tpl.deadline())  # one deadline for all renders of this call
        shown = _openai_tools(tools) if tools and self.tool_format.native else None
        tools_token = self._tools.set(shown)
        try:
            tail = render_from(self, messages, kept, state, bos, eos, controls) if state is not None else None
            return tail if tail is not None else self._segments(messages, bos, eos, controls)
        finally:
            self._tools.reset(tools_token)
            self._deadline.reset(token)

    def _segments(self, messages: Sequence[Message], bos: str, eos: str, controls: Controls | None) -> TailRender:
        if controls is not None:
            refuse_controls_outside_content(messages, controls)
        calls = [bool(m.tool_calls) for m in messages]
        cont = continues_turn(messages)  # before calls move into content (a call is never continued)
        messages = self._prepared(messages)
        full = self._render(messages, not cont, bos, eos)
        marks = Markers(messages, self._tools.get())
        located = self._locate(messages, not cont, bos, eos, full, controls, marks)
        spans, bare = located if located is not None else (None, False)
        unsplit = spans is None
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
                refuse_controls_in_tools(self._tools.get(), controls)
            spans = []
        elif controls is not None:  # content holding control strings: the next call renders it all again
            unsplit = any(controls(m.content) for m in messages) or bool(tool_controls(self._tools.get(), controls))
        done = self.finish(messages, calls, cont, full, spans, marks, bos, eos, None, unsplit=unsplit, bare=bare)
        assert done is not None  # without `part` every region end is found
        return done

    def finish(
        self, messages: Sequence[Message], calls: Mapping[int, bool] | Sequence[bool], cont: bool, full: str,
        spans: list[tuple[int, int, int]], marks: Markers, bos: str, eos: str, base: JinjaState | None, *,
        start: int = 0, unsplit: bool = False, bare: bool = False, part: PrefixEnd | None = None,
    ) -> TailRender | None:
        """Segments of `full` from message `start` on (`base`'s state covers the ones before).

        `messages` as the template got them (`_prepared`), `calls[k]`: message `k` holds tool calls (read
        from `start` on), `cont`: the last message is continued, `spans`: the content spans of `full`,
        `bare`: empty contents were left without markers (`_locate`; a render from `base` keeps its
        choice), `part`: where an unlocated message's region ends (`_ends`). None when `part` could not say.
        """
        n = len(messages)
        prev = base.prevs[start - 1] if start else 0
        i = i0 = base.kept_spans(prev) if base is not None else 0  # spans before `prev`: the kept messages'
        if cont:  # cut everything the template adds after the final assistant content
            last = [s for s in spans[i:] if s[2] == n - 1]
            if last:
                full = full[: last[-1][1]]
            else:
                tail = messages[-1].content
                j = full.rfind(tail) if tail else -1
                full = full[: j + len(tail)] if j != -1 else full
        ends = self._ends(messages, bos, eos, full, spans, marks, start, i, part)
        if ends is None:
            return None
        segs: list[Segment] = []
        prevs = list(base.prevs[:start]) if base is not None else []
        for k in range(start, n):
            b = min(ends[k - start][0], len(full))
            if b > prev:
                m = messages[k]
                region = "tool_call" if calls[k] else {"tool": "tool_result"}.get(m.role, m.role)
                parts, i = _split_parts(full, prev, b, spans, i)
                segs.append(Segment(parts, region, k, m.pin))
                prev = b
            prevs.append(prev)
        if prev < len(full):
            parts, i = _split_parts(full, prev, len(full), spans, i)
            segs.append(Segment(parts, "assistant", -1))
        spans = [*spans[:i0], *((a, b, k if k < n else -2) for a, b, k in spans[i0:])]  # kept ones renumbered before
        bare = base.bare if base is not None else bare
        state = JinjaState.extended(base, start, full, spans, ends, prevs, unsplit, bare)
        return TailRender(start, segs, state)

    # ---- regions: where each message's part of the render ends
    def _ends(
        self,
        messages: Sequence[Message],
        bos: str,
        eos: str,
        full: str,
        spans: Sequence[tuple[int, int, int]],
        marks: Markers,
        start: int = 0,
        first_span: int = 0,
        part: PrefixEnd | None = None,
    ) -> list[End] | None:
        """Where each message's region ends in `full` (messages `start` on), in linear time.

        A message's region ends where the render of the conversation up to it (no
        generation prompt) stops agreeing with `full`. For a message whose content
        was located, that is its content's end plus the part of its *tail* (what the
        template writes after the content when the message is the last one) that
        `full` repeats there; the tail comes from rendering the message alone (or
        after the one before it, for templates that insist on alternation), so each
        message costs one small render instead of a render of the whole prefix. A
        message without located content (a template that drops it, or rewrites
        content) falls back to rendering the prefix (or to `part`, which answers from a
        window; None when it cannot). Each `End` also says which characters of `full` the
        answer read (`agentmem.engine.jinja_tail`).
        """
        close = {k: s1 for _, s1, k in spans[first_span:]}
        ends: list[End] = []
        for k in range(start, len(messages)):
            tail = self._tail(messages, k, bos, eos, marks) if k in close else None
            if tail is not None:
                c = close[k]
                e = _common_prefix(tail, full[c : c + len(tail)])
                ends.append((c + e, c, tail, c + min(len(tail), e + 1)))
                continue
            if part is not None:
                found = part(k)
                if found is None:
                    return None
                ends.append((found[0], -1, None, found[1]))
                continue
            try:
                text = self._render(messages[: k + 1], False, bos, eos)
            except MessageError:
                text = ""  # e.g. a template that insists on alternation for prefixes
            e = _common_prefix(text, full)
            ends.append((e, -1, None, min(len(text), e + 1)))
        return ends

    def _tail(self, messages: Sequence[Message], k: int, bos: str, eos: str, marks: Markers) -> str | None:
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
