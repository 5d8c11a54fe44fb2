"""Chat messages → tokens, with a region tag on every token span.

A prompt is rendered as a list of `Segment` (text + region + source
message), then each segment is tokenized on its own (results cached), so the
same message always yields the same tokens — which is what prefix reuse across
turns relies on — and every token knows where it came from.

Formats (strategy objects in `FORMATS`):

* `gemma`  — Gemma's turn format (`<start_of_turn>user`/`model`); renders the
  same text as Gemma 3's own template for the conversations that template
  accepts, and also handles what it rejects (consecutive same-role turns, tool
  calls, tool results).
* `chatml` — `<|im_start|>role … <|im_end|>` with a native `tool` role.
* `jinja`  — the GGUF's own `tokenizer.chat_template` through jinja2.
* `auto`   — Gemma-style templates → `gemma`; another template → `jinja`;
  none → `chatml`.

Regions: `system`, `user`, `assistant`, `tool_call`, `tool_result`
(`text` for raw completions). A final `assistant` message is *continued*
(not closed), so an application can start the model's reply.
"""

from __future__ import annotations

import abc
import contextvars
import json
import logging
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from agentmem.errors import ChatTemplateError, MessageError, PolicyError

if TYPE_CHECKING:
    from agentmem.engine.template_sandbox import RenderLimits

__all__ = [
    "FORMATS",
    "REGIONS",
    "ChatFormat",
    "ChatRenderer",
    "Message",
    "RenderedPrompt",
    "Segment",
    "Span",
    "ToolCall",
    "normalize_messages",
]

logger = logging.getLogger(__name__)

REGIONS: tuple[str, ...] = ("system", "user", "assistant", "tool_call", "tool_result", "text")
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
_MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "pin"}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool invocation made by the assistant."""

    id: str
    name: str
    arguments: Any  # a dict (parsed) or a JSON string

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False, separators=(", ", ": "))


@dataclass(frozen=True, slots=True)
class Message:
    """A validated chat message."""

    role: str
    content: str
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    pin: bool = False


Part = tuple[str, bool]
"""A piece of segment text and whether it is trusted markup (may produce control tokens)."""


def _m(text: str) -> Part:
    """The format's own markup: control-token strings in it become control tokens."""
    return (text, True)


def _c(text: str) -> Part:
    """Message content, names, tool calls: tokenized as plain text, never as control tokens."""
    return (text, False)


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of rendered prompt with its region and source message.

    Attributes:
        parts: `(text, trusted)` pairs. Trusted parts are the format's own markup;
            the others (message content, names, tool calls and results) are
            tokenized as text, so a message containing `<end_of_turn>` or
            `<|im_end|>` cannot forge a turn.
        region: one of `REGIONS`.
        message: index into the messages, -1 for template glue.
        pinned: the source message asked to be pinned.
    """

    parts: tuple[Part, ...]
    region: str
    message: int
    pinned: bool = False

    @property
    def text(self) -> str:
        """The segment's text (all parts joined)."""
        return "".join(t for t, _ in self.parts)


@dataclass(frozen=True, slots=True)
class Span:
    """Tokens `[start, end)` of a prompt carry `region` (from message `message`)."""

    start: int
    end: int
    region: str
    message: int = -1
    pinned: bool = False


@dataclass(slots=True)
class RenderedPrompt:
    """Tokens of a prompt and the region spans covering them, in order."""

    tokens: list[int]
    spans: list[Span] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)


# --------------------------------------------------------------------------- validation
def _content_text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI/LangChain content parts
        out = []
        for j, part in enumerate(value):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                raise MessageError(f"{where}.content[{j}]: only text parts are supported, got {part!r:.80}")
        return "".join(out)
    raise MessageError(f"{where}.content must be a string or a list of text parts, got {type(value).__name__}")


def _tool_call(raw: Any, where: str) -> ToolCall:
    if not isinstance(raw, Mapping):
        raise MessageError(f"{where} must be a dict, got {type(raw).__name__}")
    fn = raw.get("function") if isinstance(raw.get("function"), Mapping) else raw
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise MessageError(f"{where}.name must be a non-empty string, got {name!r}")
    args = fn.get("arguments", fn.get("args", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # keep the raw string; it is rendered verbatim
    elif not isinstance(args, Mapping):
        raise MessageError(f"{where}.arguments must be a dict or a JSON string, got {type(args).__name__}")
    call_id = raw.get("id") or ""
    if not isinstance(call_id, str):
        raise MessageError(f"{where}.id must be a string, got {type(call_id).__name__}")
    return ToolCall(id=call_id, name=name, arguments=dict(args) if isinstance(args, Mapping) else args)


def normalize_messages(messages: Iterable[Mapping[str, Any] | Message]) -> list[Message]:
    """Validate chat messages; errors name the offending message and field.

    >>> normalize_messages([{"role": "user", "content": "hi"}])
    [Message(role='user', content='hi', name=None, tool_calls=(), tool_call_id=None, pin=False)]
    >>> normalize_messages([{"role": "robot", "content": "hi"}])
    Traceback (most recent call last):
    ...
    agentmem.errors.MessageError: messages[0].role: 'robot' is not one of system, user, assistant, tool
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise MessageError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out: list[Message] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, Message):
            out.append(m)
            continue
        if not isinstance(m, Mapping):
            raise MessageError(f"{where} must be a dict with 'role' and 'content', got {type(m).__name__}")
        extra = set(m) - _MESSAGE_KEYS
        if extra:
            raise MessageError(f"{where}: unknown field(s) {sorted(extra)}; allowed: {sorted(_MESSAGE_KEYS)}")
        role = m.get("role")
        if role not in ROLES:
            raise MessageError(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
        raw_calls = m.get("tool_calls") or []
        if raw_calls and role != "assistant":
            raise MessageError(f"{where}.tool_calls is only allowed on assistant messages (role is {role!r})")
        if not isinstance(raw_calls, (list, tuple)):
            raise MessageError(f"{where}.tool_calls must be a list, got {type(raw_calls).__name__}")
        if "content" not in m and not raw_calls:
            raise MessageError(f"{where}: missing field 'content'")
        content = _content_text(m.get("content"), where)
        if m.get("content") is None and not raw_calls:
            raise MessageError(f"{where}.content is None (only allowed with tool_calls)")
        calls = tuple(_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(raw_calls))
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise MessageError(f"{where}.name must be a string, got {type(name).__name__}")
        tcid = m.get("tool_call_id")
        if role == "tool" and not isinstance(tcid, str):
            raise MessageError(f"{where}.tool_call_id is required for role 'tool' (a string), got {tcid!r}")
        pin = m.get("pin", False)
        if not isinstance(pin, bool):
            raise MessageError(f"{where}.pin must be a bool, got {type(pin).__name__}")
        out.append(Message(role=role, content=content, name=name, tool_calls=calls, tool_call_id=tcid, pin=pin))
    if not out:
        raise MessageError("messages is empty")
    return out


def tool_calls_text(calls: Sequence[ToolCall]) -> str:
    """How past tool calls are written into the prompt (the same JSON the model emits)."""
    body = ", ".join(f'{{"name": {json.dumps(c.name)}, "arguments": {c.arguments_json()}}}' for c in calls)
    return '{"tool_calls": [' + body + "]}"


# --------------------------------------------------------------------------- formats
Controls = Callable[[str], list[str]]
"""Finds the control-token strings (`<end_of_turn>`, `<|im_end|>`...) that occur in a text."""


class ChatFormat(abc.ABC):
    """Strategy: render validated messages to segments."""

    name = "base"

    @abc.abstractmethod
    def render(
        self, messages: Sequence[Message], *, bos: str, eos: str, controls: Controls | None = None
    ) -> list[Segment]:
        """Messages → segments (parts, region, source message) in prompt order.

        Args:
            messages: validated messages.
            bos: text of the BOS token to render ("" when the tokenizer adds it).
            eos: text of the EOS token.
            controls: the model's control-token finder; a format that cannot keep
                every message's text apart from its markup uses it to refuse
                content that would become control tokens.
        """


def _continue_last(messages: Sequence[Message]) -> bool:
    return messages[-1].role == "assistant" and not messages[-1].tool_calls


class GemmaFormat(ChatFormat):
    """Gemma turns; system text joins the first user turn like Gemma 3's template."""

    name = "gemma"

    def render(
        self, messages: Sequence[Message], *, bos: str, eos: str, controls: Controls | None = None
    ) -> list[Segment]:
        segs: list[Segment] = [Segment((_m(bos),), "system" if messages[0].role == "system" else "user", -1)] if bos else []
        cont = _continue_last(messages)
        n = len(messages)
        i = 0
        merged_first_user = False
        if messages[0].role == "system":
            sysm = messages[0]
            if n > 1 and messages[1].role == "user":  # Gemma 3: system text opens the first user turn
                parts = (_m("<start_of_turn>user\n"), _c(sysm.content), _m("\n\n"))
                segs.append(Segment(parts, "system", 0, sysm.pin))
                merged_first_user = True
            else:
                parts = (_m("<start_of_turn>user\n"), _c(sysm.content), _m("<end_of_turn>\n"))
                segs.append(Segment(parts, "system", 0, sysm.pin))
            i = 1
        for k in range(i, n):
            m = messages[k]
            last = k == n - 1
            if m.role == "user":
                head = "" if (merged_first_user and k == 1) else "<start_of_turn>user\n"
                who = (_c(m.name), _m(": ")) if m.name else ()
                parts = (_m(head), *who, _c(m.content.strip()), _m("<end_of_turn>\n"))
                segs.append(Segment(parts, "user", k, m.pin))
            elif m.role == "system":
                parts = (_m("<start_of_turn>user\n"), _c(m.content), _m("<end_of_turn>\n"))
                segs.append(Segment(parts, "system", k, m.pin))
            elif m.role == "tool":
                label = m.name or m.tool_call_id or ""
                parts = (
                    _m("<start_of_turn>user\nTool result ("), _c(label), _m("):\n"), _c(m.content), _m("<end_of_turn>\n")
                )
                segs.append(Segment(parts, "tool_result", k, m.pin))
            else:  # assistant
                if last and cont:
                    segs.append(Segment((_m("<start_of_turn>model\n"), _c(m.content.lstrip())), "assistant", k, m.pin))
                    continue
                text = m.content.strip()
                if m.tool_calls:
                    body = (_c(text), _m("\n")) if text else ()
                    segs.append(Segment((_m("<start_of_turn>model\n"), *body), "assistant", k, m.pin))
                    parts = (_c(tool_calls_text(m.tool_calls)), _m("<end_of_turn>\n"))
                    segs.append(Segment(parts, "tool_call", k, m.pin))
                else:
                    parts = (_m("<start_of_turn>model\n"), _c(text), _m("<end_of_turn>\n"))
                    segs.append(Segment(parts, "assistant", k, m.pin))
        if not cont:
            segs.append(Segment((_m("<start_of_turn>model\n"),), "assistant", -1))
        return segs


class ChatMLFormat(ChatFormat):
    """`<|im_start|>role\\n…<|im_end|>` turns (Qwen, many fine-tunes)."""

    name = "chatml"

    def render(
        self, messages: Sequence[Message], *, bos: str, eos: str, controls: Controls | None = None
    ) -> list[Segment]:
        first = messages[0].role if messages[0].role == "system" else "user"
        segs: list[Segment] = [Segment((_m(bos),), first, -1)] if bos else []
        cont = _continue_last(messages)
        n = len(messages)
        for k, m in enumerate(messages):
            if m.role == "assistant" and k == n - 1 and cont:
                segs.append(Segment((_m("<|im_start|>assistant\n"), _c(m.content)), "assistant", k, m.pin))
                continue
            if m.role == "assistant" and m.tool_calls:
                body = (_c(m.content), _m("\n")) if m.content else ()
                segs.append(Segment((_m("<|im_start|>assistant\n"), *body), "assistant", k, m.pin))
                parts = (_c(tool_calls_text(m.tool_calls)), _m("<|im_end|>\n"))
                segs.append(Segment(parts, "tool_call", k, m.pin))
                continue
            region = {"tool": "tool_result"}.get(m.role, m.role)
            who = (_c(m.name), _m(": ")) if (m.name and m.role == "user") else ()
            parts = (_m(f"<|im_start|>{m.role}\n"), *who, _c(m.content), _m("<|im_end|>\n"))
            segs.append(Segment(parts, region, k, m.pin))
        if not cont:
            segs.append(Segment((_m("<|im_start|>assistant\n"),), "assistant", -1))
        return segs


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
            parts.append(_m(text[pos:s0]))
        if s1e > s0:
            parts.append(_c(text[s0:s1e]))
        pos = max(pos, s1e)
        if s1 > b:  # the span goes on in the next segment
            break
        i += 1
    if pos < b:
        parts.append(_m(text[pos:b]))
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

    def __init__(self, template: str, *, limits: RenderLimits | None = None) -> None:
        """Compile `template` in the limited sandbox (raises `ChatTemplateError`).

        Args:
            template: the jinja2 source.
            limits: time and output budget of one `render` call (all its renders).
        """
        from agentmem.engine.template_sandbox import SandboxedTemplate

        self._tpl = SandboxedTemplate(template, limits)

    @staticmethod
    def _as_dict(m: Message, content: str) -> dict[str, Any]:
        d: dict[str, Any] = {"role": m.role, "content": content}
        if m.name:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls
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
        self, messages: Sequence[Message], *, bos: str, eos: str, controls: Controls | None = None
    ) -> list[Segment]:
        token = self._deadline.set(self._tpl.deadline())  # one deadline for all renders of this call
        try:
            return self._segments(messages, bos, eos, controls)
        finally:
            self._deadline.reset(token)

    def _segments(self, messages: Sequence[Message], bos: str, eos: str, controls: Controls | None) -> list[Segment]:
        if controls is not None:
            _refuse_controls_outside_content(messages, controls)
        cont = _continue_last(messages)
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
                region = "tool_call" if m.tool_calls else {"tool": "tool_result"}.get(m.role, m.role)
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
    for s in set(found):
        text = text.replace(s, "")
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


FORMATS: dict[str, type[ChatFormat]] = {"gemma": GemmaFormat, "chatml": ChatMLFormat, "jinja": JinjaFormat}


def select_format(
    name: str, template: str | None, *, has_gemma_turns: bool = False, limits: RenderLimits | None = None
) -> ChatFormat:
    """Pick a format by name.

    `auto`: a Gemma-style template, or no template but a vocabulary with a
    `<start_of_turn>` token (the default model's GGUF ships no template) →
    `gemma`; another template → `jinja`; otherwise `chatml`.
    """
    if name == "auto":
        if (template and "<start_of_turn>" in template) or (not template and has_gemma_turns):
            return GemmaFormat()
        if template:
            return JinjaFormat(template, limits=limits)
        return ChatMLFormat()
    if name == "jinja":
        if not template:
            raise PolicyError("chat_format='jinja' but the model has no tokenizer.chat_template")
        return JinjaFormat(template, limits=limits)
    if name not in FORMATS:
        raise PolicyError(f"unknown chat_format {name!r}; valid: auto, {', '.join(sorted(FORMATS))}")
    return FORMATS[name]()


class ChatRenderer:
    """Render + tokenize messages for one model, caching segment tokenizations.

    Args:
        model: a `agentmem.engine.context.LlamaModel` (anything with
            `tokenize_pieces`, `control_strings`, `bos`, `add_bos`, `has_special`
            and `chat_template()`).
        chat_format: `auto`, `gemma`, `chatml` or `jinja`.
        cache_size: segment tokenizations kept (LRU).
        limits: time and output limits of a jinja template's render
            (`agentmem.engine.template_sandbox.RenderLimits`; defaults when None).

    Raises:
        ChatTemplateError: the model's jinja template does not compile.
        PolicyError: an unknown `chat_format`.
    """

    def __init__(
        self, model: Any, chat_format: str = "auto", *, cache_size: int = 8192, limits: RenderLimits | None = None
    ) -> None:
        self.model = model
        self.format = select_format(
            chat_format, model.chat_template(), has_gemma_turns=model.has_special("<start_of_turn>"), limits=limits
        )
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._cache_size = cache_size
        logger.debug("chat format: %s", self.format.name)

    def _cached(self, key: Any, make: Callable[[], Any]) -> Any:
        with self._cache_lock:  # renders run concurrently in callers' threads
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        value = make()
        with self._cache_lock:
            self._cache[key] = value
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return value

    def _tok(self, parts: tuple[Part, ...]) -> tuple[int, ...]:
        """Tokens of a segment: control tokens from its markup only, its content as text."""
        return self._cached(parts, lambda: tuple(self.model.tokenize_pieces(parts)))

    def _controls(self, text: str) -> list[str]:
        """Control-token strings in a message's text (cached: histories repeat)."""
        if not text:
            return []
        return self._cached(("controls", text), lambda: self.model.control_strings(text))

    def render(self, messages: Iterable[Mapping[str, Any] | Message]) -> RenderedPrompt:
        """Messages → tokens with region spans (raises `MessageError`)."""
        msgs = normalize_messages(messages)
        segs = self.format.render(msgs, bos="", eos="", controls=self._controls)
        tokens: list[int] = []
        spans: list[Span] = []
        if self.model.add_bos:
            tokens.append(self.model.bos)
            first = segs[0] if segs else None
            spans.append(Span(0, 1, first.region if first else "system", -1, True))
        for s in segs:
            t = self._tok(s.parts)
            if not t:
                continue
            spans.append(Span(len(tokens), len(tokens) + len(t), s.region, s.message, s.pinned))
            tokens.extend(t)
        return RenderedPrompt(tokens, spans)

    def render_text(self, text: str, *, region: str = "text") -> RenderedPrompt:
        """A raw prompt (no template): BOS (if the model wants it) + the text's tokens.

        The text is tokenized as text, like message content: a `<end_of_turn>` in a
        raw completion prompt stays those characters, never the control token. This
        was already so before chat messages were made safe the same way, and there is
        no opt-in to parse control tokens in a raw prompt.
        """
        if not isinstance(text, str):
            raise MessageError(f"prompt must be a string, got {type(text).__name__}")
        toks = ([self.model.bos] if self.model.add_bos else []) + list(self.model.tokenize(text, add_special=False, parse_special=False))
        if not toks:
            raise MessageError("prompt is empty")
        return RenderedPrompt(toks, [Span(0, len(toks), region)])
