"""Reading tool calls out of a model's reply: the `{"tool_calls": [...]}` envelope.

Two readings, one format:

* `parse_envelope` is strict: the reply *is* an envelope (as under the tool-call
  grammar, or when a model answers in the prompt's format). Calls that do not parse
  come back as `ParsedCall`s with an `error`, so an integration can report them.
* `find_tool_calls` is lenient: it looks for an envelope, or one bare
  `{"name": ..., "arguments": {...}}`, anywhere in free text (a code fence, a
  sentence before it) and keeps it only if every call names a known tool.

`opens_tool_call` tells a streaming consumer, from the first characters of a reply,
whether to hold them back until it is known whether the reply is a call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

__all__ = [
    "TOOL_CALL_OPEN",
    "CallGate",
    "ParsedCall",
    "find_tool_calls",
    "looks_like_tool_call",
    "new_call_id",
    "opens_tool_call",
    "parse_envelope",
    "text_before_json",
]

TOOL_CALL_OPEN = '{"tool_calls"'
"""How every envelope starts (the grammar's and the prompt's spacing)."""


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One tool call read from a reply.

    Attributes:
        name: the tool's name; `None` when the call names none (or not as a string).
        arguments: the decoded arguments; `None` when the call is invalid.
        error: why the call is invalid; `None` for a valid call.
        raw: for an invalid call, its text as written (the call's JSON, or the argument
            text of a cut-off reply); `""` for a valid one.
    """

    name: str | None
    arguments: dict[str, Any] | None
    error: str | None = None
    raw: str = ""

    @property
    def ok(self) -> bool:
        """Whether the call has a name and object arguments."""
        return self.error is None


def new_call_id() -> str:
    """A fresh id for a parsed call (`call_` and 24 hex digits)."""
    return f"call_{uuid.uuid4().hex[:24]}"


# --------------------------------------------------------------------------- strict: the reply is an envelope
_NAME_RE = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*")')
_ARGS_MARK = '"arguments": '


def _salvage(text: str) -> tuple[str | None, str]:
    """Name and argument text of a broken (usually cut-off) first call.

    Streaming consumers merge these into a call with partially parsed arguments.
    """
    m = _NAME_RE.search(text)
    name = None
    if m:
        try:
            name = json.loads(m.group(1))
        except ValueError:
            name = None
    j = text.find(_ARGS_MARK)
    if j == -1:
        return name, ""
    args = text[j + len(_ARGS_MARK) :]
    for tail in ("}]}", "}]"):
        if args.endswith(tail):
            args = args[: -len(tail)]
            break
    return name, args


def parse_envelope(text: str) -> list[ParsedCall] | None:
    """The calls of a reply that is a tool-call envelope; `None` if it is not one.

    A reply that starts like an envelope but is not valid JSON (cut off by
    `max_tokens`, say) gives one invalid `ParsedCall` with the name and argument
    text salvaged from it.

    >>> parse_envelope('{"tool_calls": [{"name": "f", "arguments": {"x": 1}}]}')
    [ParsedCall(name='f', arguments={'x': 1}, error=None, raw='')]
    >>> parse_envelope("Hello") is None
    True
    """
    s = text.strip()
    if not s.startswith(TOOL_CALL_OPEN):
        return None
    try:
        data = json.loads(s)
        raw_calls = data["tool_calls"]
        if not isinstance(raw_calls, list):
            raise TypeError("'tool_calls' is not a list")
    except (ValueError, KeyError, TypeError) as exc:
        name, args = _salvage(s)
        return [ParsedCall(name, None, f"invalid tool-call JSON: {exc}", args)]
    calls: list[ParsedCall] = []
    for c in raw_calls:
        name = c.get("name") if isinstance(c, dict) else None
        args = c.get("arguments", {}) if isinstance(c, dict) else None
        if isinstance(name, str) and isinstance(args, dict):
            calls.append(ParsedCall(name, args))
        else:
            calls.append(
                ParsedCall(
                    name if isinstance(name, str) else None,
                    None,
                    "a tool call needs a string 'name' and an object 'arguments'",
                    json.dumps(c, ensure_ascii=False),
                )
            )
    return calls


# --------------------------------------------------------------------------- lenient: a call somewhere in text
def _as_calls(obj: Any, names: set[str]) -> list[ParsedCall] | None:
    """An envelope or one bare `{"name", "arguments"}` → calls (`None` unless all are valid and known)."""
    if isinstance(obj, Mapping) and isinstance(obj.get("tool_calls"), list):
        items = obj["tool_calls"]
    elif isinstance(obj, Mapping) and set(obj) == {"name", "arguments"}:
        items = [obj]
    else:
        return None
    calls: list[ParsedCall] = []
    for it in items:
        if not isinstance(it, Mapping) or it.get("name") not in names:
            return None
        args = it.get("arguments", {})
        if isinstance(args, str):  # arguments as a JSON string, OpenAI-style
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, Mapping):
            return None
        calls.append(ParsedCall(it["name"], dict(args)))
    return calls or None


def find_tool_calls(text: str, names: Sequence[str]) -> tuple[list[ParsedCall], str] | None:
    """Find a tool call in `text`: `(calls, text_before_it)`, or `None`.

    Accepts the envelope and a bare `{"name": ..., "arguments": {...}}`, possibly
    inside a code fence; only tools in `names` count. Every returned call is valid.
    """
    known = set(names)
    dec = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, _end = dec.raw_decode(text, start)
        except json.JSONDecodeError:
            obj = None
        calls = _as_calls(obj, known) if obj is not None else None
        if calls:
            before = text[:start].strip()
            if before.endswith("```json") or before.endswith("```"):
                before = before.rsplit("```", 1)[0].strip()
            return calls, before
        start = text.find("{", start + 1)
    return None


def looks_like_tool_call(text: str, names: Sequence[str]) -> bool:
    """Whether the model tried to call a tool (maybe with broken JSON)."""
    t = text.lstrip()
    if '"tool_calls"' in t or "'tool_calls'" in t:
        return True
    return (t.startswith("{") or t.startswith("```")) and any(f'"{n}"' in t for n in names)


def text_before_json(text: str) -> str:
    """Text a model wrote before a (malformed) JSON tool call, code-fence marks removed."""
    j = text.find("{")
    before = text[:j] if j != -1 else ""
    return before.replace("```json", "").replace("```", "").strip()


# --------------------------------------------------------------------------- streaming
def opens_tool_call(lead: str, *, lenient: bool = False) -> bool | None:
    """Whether a reply starting with `lead` is (`True`), is not (`False`) or may be (`None`) a call.

    Args:
        lead: the reply so far, leading whitespace included.
        lenient: match `find_tool_calls` (any JSON object or code fence may hold a
            call) instead of `parse_envelope` (only the envelope is a call).

    >>> opens_tool_call('{"tool'), opens_tool_call('{"tool_calls": ['), opens_tool_call("Hi")
    (None, True, False)
    """
    s = lead.lstrip()
    if not s:
        return None
    if lenient:
        return s[0] in "{`"
    if s.startswith(TOOL_CALL_OPEN):
        return True
    return None if TOOL_CALL_OPEN.startswith(s) else False


class _OpensCall(Protocol):
    """What `CallGate` needs of a tool format (`agentmem.tools.formats.ToolFormat`)."""

    def opens_call(self, lead: str) -> bool | None: ...


class CallGate:
    """Which streamed text of a reply may be shown now, for the integrations and the server.

    Text replies stream as they come. A forced call (`mode="tools"`) is held to the end,
    where it goes out as tool calls. In `auto` mode the start of a reply is held while it
    could still be a call in the model's syntax (`ToolFormat.opens_call`); `held` is what
    was held back, `decided` is `"text"`, `"tool"` or `None` (not yet known).

    Args:
        fmt: the model's tool-call syntax.
        mode: `"text"`, `"json"`, `"tools"` (forced) or `"auto"`.
    """

    def __init__(self, fmt: _OpensCall, mode: str) -> None:
        self.fmt = fmt
        self.held = ""
        self.decided: str | None = {"text": "text", "json": "text", "tools": "tool"}.get(mode)

    def push(self, piece: str) -> str:
        """Text to show for the generated `piece` (possibly `""`)."""
        if self.decided == "text":
            return piece
        self.held += piece
        if self.decided is None:
            opens = self.fmt.opens_call(self.held)
            if opens:
                self.decided = "tool"
            elif opens is False:
                self.decided = "text"
                out, self.held = self.held, ""
                return out
        return ""
