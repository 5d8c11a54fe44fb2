"""Chat messages → tokens, with a region tag on every token span.

A prompt is rendered as a list of `Segment` (parts + region + source
message), then each segment is tokenized on its own (results cached), so the
same message always yields the same tokens — which is what prefix reuse across
turns relies on — and every token knows where it came from.

Formats (strategy objects; the built-in ones in `agentmem.engine.builtin_formats`):

* `gemma`  — Gemma's turn format (`<start_of_turn>user`/`model`); renders the
  same text as Gemma 3's own template for the conversations that template
  accepts, and also handles what it rejects (consecutive same-role turns, tool
  calls, tool results).
* `chatml` — `<|im_start|>role … <|im_end|>` with a native `tool` role.
* `jinja`  — the GGUF's own `tokenizer.chat_template` through jinja2
  (`agentmem.engine.jinja_format`, in a limited sandbox).
* `auto`   — Gemma-style templates → `gemma`; another template → `jinja`;
  none → `chatml`.

Regions: `system`, `user`, `assistant`, `tool_call`, `tool_result`
(`text` for raw completions). A final `assistant` message is *continued*
(not closed), so an application can start the model's reply.

Message text is never turned into control tokens: a segment's parts say which text
is the format's markup (tokenized with control tokens parsed) and which is content
(tokenized as text), so `<end_of_turn>` or `<|im_end|>` inside a message, a tool
result or a web page cannot forge a turn.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from agentmem.errors import MessageError
from agentmem.tools.formats import ToolFormat, get_tool_format
from agentmem import validation as check

__all__ = [
    "REGIONS",
    "ChatFormat",
    "Message",
    "RenderedPrompt",
    "Segment",
    "Span",
    "TailRender",
    "span_table",
    "ToolCall",
    "normalize_messages",
    "normalize_tools",
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


def markup_part(text: str) -> Part:
    """The format's own markup: control-token strings in it become control tokens."""
    return (text, True)


def content_part(text: str) -> Part:
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


@dataclass(slots=True, init=False, eq=False)
class RenderedPrompt:
    """Tokens of a prompt and the region spans covering them, in order: the prompt as a value.

    Built once per request by `agentmem.engine.renderer.ChatRenderer` and shared, never
    changed, by everything that reads it (the line lookup, admission, the turn); a new
    prompt (a forced call's opening appended) is a new value. Two prompts are equal when
    their tokens and spans are.

    `RenderedPrompt(tokens, spans, ids=None, table=None)`: `tokens` may be None when `ids`
    is given; the list is then made from `ids` the first time `tokens` is read. A render
    that extends a kept one passes only arrays (joined in C), so a call whose history is
    already rendered builds no per-token Python list; `len(prompt)`, `ids` and `spans` are
    what the call path reads.
    """

    spans: list[Span]
    #: the tokens as an int32 array (made from `tokens` unless given): lookups compare it without converting
    ids: np.ndarray = field(repr=False)
    #: the spans as rows `(start, end, region index in REGIONS, message)` (`span_table`; made unless given)
    table: np.ndarray = field(repr=False)
    _tokens: list[int] | None = field(repr=False)

    def __init__(
        self, tokens: list[int] | None, spans: list[Span] | None = None, ids: np.ndarray | None = None,
        table: np.ndarray | None = None,
    ) -> None:
        if tokens is None and ids is None:
            raise ValueError("RenderedPrompt needs tokens or ids")
        spans = [] if spans is None else spans
        ids = np.asarray(tokens, dtype=np.int32) if ids is None else ids
        table = span_table(spans) if table is None else table
        self._assign(spans, ids, table, tokens)

    def _assign(self, spans: list[Span], ids: np.ndarray, table: np.ndarray, tokens: list[int] | None) -> None:
        """Set the fields once, past the frozen `__setattr__` (construction and unpickling)."""
        ids.flags.writeable = table.flags.writeable = False
        for name, value in (("spans", spans), ("ids", ids), ("table", table), ("_tokens", tokens)):
            object.__setattr__(self, name, value)

    @property
    def tokens(self) -> list[int]:
        """The tokens as a list of ints (made from `ids` on first read when not given; do not change it)."""
        toks = self._tokens
        if toks is None:
            toks = self.ids.tolist()
            object.__setattr__(self, "_tokens", toks)
        return toks

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RenderedPrompt):
            return NotImplemented
        return self.spans == other.spans and np.array_equal(self.ids, other.ids)

    __hash__ = None  # type: ignore[assignment]  # a value with lists in it, like before

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __getstate__(self) -> tuple[Any, ...]:  # pickle and copy: the value's fields, set back past __setattr__
        return self.spans, self.ids, self.table, self._tokens

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self._assign(*state)

    def __repr__(self) -> str:
        return f"RenderedPrompt(tokens={self.tokens!r}, spans={self.spans!r})"

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, slots=True)
class TailRender:
    """What `ChatFormat.render_tail` rendered: the segments of messages `start` on.

    Attributes:
        start: the first message rendered again; every segment of the messages before it
            is the one the kept render had (the renderer keeps their tokens).
        segments: the segments of messages `start`, `start + 1`, ... and the template glue
            after the last one, in prompt order.
        state: what the format keeps for the next call's `render_tail` (None: nothing).
    """

    start: int
    segments: list[Segment]
    state: Any = None


_REGION_INDEX = {r: i for i, r in enumerate(REGIONS)}


def span_table(spans: Sequence[Span]) -> np.ndarray:
    """`spans` as an int64 array of rows `(start, end, region index in REGIONS, message)`."""
    out = np.empty((len(spans), 4), dtype=np.int64)
    for i, s in enumerate(spans):
        out[i] = (s.start, s.end, _REGION_INDEX[s.region], s.message)
    return out


# --------------------------------------------------------------------------- validation
def _content_text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return check.text(value, field=f"{where}.content")
    if isinstance(value, list):  # OpenAI/LangChain content parts
        out = []
        for j, part in enumerate(value):
            if isinstance(part, str):
                out.append(check.text(part, field=f"{where}.content[{j}]"))
            elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                out.append(check.text(part["text"], field=f"{where}.content[{j}].text"))
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
    check.text(name, field=f"{where}.name")
    args = check.json_text(fn.get("arguments", fn.get("args", {})), field=f"{where}.arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # keep the raw string; it is rendered verbatim
    elif not isinstance(args, Mapping):
        raise MessageError(f"{where}.arguments must be a dict or a JSON string, got {type(args).__name__}")
    else:
        try:  # rendered with json.dumps later: refuse what cannot be, here, naming the field
            json.dumps(args, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise MessageError(f"{where}.arguments must be JSON-serializable ({exc})") from exc
    call_id = raw.get("id") or ""
    if not isinstance(call_id, str):
        raise MessageError(f"{where}.id must be a string, got {type(call_id).__name__}")
    check.text(call_id, field=f"{where}.id")
    return ToolCall(id=call_id, name=name, arguments=dict(args) if isinstance(args, Mapping) else args)


def normalize_messages(messages: Iterable[Mapping[str, Any] | Message], *, offset: int = 0) -> list[Message]:
    """Validate chat messages; errors name the offending message and field.

    `offset`: the index of the first of `messages` in the conversation (when earlier ones were
    validated before: errors name the whole conversation's index, and an empty list is fine).

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
    for i, m in enumerate(messages, offset):
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
        if name is not None:
            check.text(name, field=f"{where}.name")
        tcid = m.get("tool_call_id")
        if role == "tool" and not isinstance(tcid, str):
            raise MessageError(f"{where}.tool_call_id is required for role 'tool' (a string), got {tcid!r}")
        if isinstance(tcid, str):
            check.text(tcid, field=f"{where}.tool_call_id")
        pin = m.get("pin", False)
        if not isinstance(pin, bool):
            raise MessageError(f"{where}.pin must be a bool, got {type(pin).__name__}")
        out.append(Message(role=role, content=content, name=name, tool_calls=calls, tool_call_id=tcid, pin=pin))
    if not out and not offset:
        raise MessageError("messages is empty")
    return out


def normalize_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Tools as `{"name", "description", "parameters"}` dicts; errors name the field.

    >>> normalize_tools([{"type": "function", "function": {"name": "f"}}])
    [{'name': 'f', 'description': '', 'parameters': {'type': 'object', 'properties': {}}}]
    """
    if not tools:
        return []
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise MessageError(f"tools must be a list of dicts, got {type(tools).__name__}")
    out: list[dict[str, Any]] = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) and t.get("type") == "function" else t
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise MessageError(f"tools[{i}].name must be a non-empty string")
        check.json_text(fn, field=f"tools[{i}].function" if fn is not t else f"tools[{i}]")  # all a template may render
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        if not isinstance(params, Mapping):
            raise MessageError(f"tools[{i}].parameters must be a JSON schema dict, got {type(params).__name__}")
        out.append({"name": fn["name"], "description": fn.get("description") or "", "parameters": dict(params)})
    return out


def _with_system_text(messages: list[Message], block: str) -> list[Message]:
    """`messages` with `block` at the end of the leading system message (or in a new one)."""
    if messages and messages[0].role == "system":
        head = messages[0]
        text = f"{head.content}\n\n{block}" if head.content else block
        return [dataclasses.replace(head, content=text), *messages[1:]]
    return [Message("system", block), *messages]


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
    #: whether the same messages may render differently on another call (a template reading the clock)
    volatile = False

    @abc.abstractmethod
    def render(
        self,
        messages: Sequence[Message],
        *,
        bos: str,
        eos: str,
        controls: Controls | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Segment]:
        """Messages → segments (parts, region, source message) in prompt order.

        Args:
            messages: validated messages.
            bos: text of the BOS token to render ("" when the tokenizer adds it).
            eos: text of the EOS token.
            controls: the model's control-token finder; a format that cannot keep
                every message's text apart from its markup uses it to refuse
                content that would become control tokens.
            tools: the callable tools (`{"name", "description", "parameters"}`); a
                format whose `tool_format` is native shows them the model's way,
                the others ignore them (`ChatRenderer` has put agentmem's tools
                block in the system message).
        """

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
        """Segments of the messages after those a kept render holds, or of all of them.

        `messages[:kept]` are the messages of an earlier render of this format (same tools,
        bos and eos) whose segments the caller kept, with that render's `state`. A format
        returns the segments from the first message whose segments may differ now (a
        message's segments can depend on whether it is the last one), or from message 0
        when it cannot vouch that the earlier segments are unchanged. This base renders
        everything; the built-in formats render from the last kept message on (a message's
        segments depend only on itself, its index and whether it ends the conversation).
        """
        return TailRender(0, self.render(messages, bos=bos, eos=eos, controls=controls, tools=tools))

    @property
    def tool_format(self) -> ToolFormat:
        """The syntax the model writes tool calls in under this format (agentmem's envelope here)."""
        return get_tool_format("envelope")


def continues_turn(messages: Sequence[Message]) -> bool:
    """Whether the conversation ends with an assistant message the model continues (no tool calls)."""
    return messages[-1].role == "assistant" and not messages[-1].tool_calls
