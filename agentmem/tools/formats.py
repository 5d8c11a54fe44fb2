"""Tool-call syntaxes of model families, as strategy objects registered by name.

A chat template that knows tools writes a past call back into the prompt in its own
syntax; a model trained on that template emits calls in the same syntax. Each
`ToolFormat` knows one syntax:

* `envelope` — agentmem's own `{"tool_calls": [{"name": ..., "arguments": {...}}]}`,
  for templates without tool support (Gemma 3, the built-in `gemma` and `chatml`
  formats); the tools are described in the system prompt (`agentmem.tools.prompt`).
* `hermes` — Qwen2.5 / Hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
* `llama3` — Llama 3.1+: `{"name": ..., "parameters": {...}}` (after `<|python_tag|>`
  or plain).
* `mistral` — `[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`.

Every format renders a call as the exact text its template writes back after the
generation prompt (`render_call`), builds a grammar that makes the model emit exactly
that text (`grammar`; arguments with the separators `", "` and `": "`, keys in schema
order, as the template's `tojson` writes them back), parses replies strictly (`parse`)
and leniently (`find`), and tells a stream whether a reply may be a call (`opens_call`).
So a call the model made, rendered back into the next prompt, is the same text, and the
agent's KV stays a prefix of the next prompt.

`detect_tool_format(template)` picks the format from a chat template's text.

Example:
    >>> fmt = TOOL_FORMATS["hermes"]
    >>> fmt.render_call([("f", {"x": 1})])
    '<tool_call>\\n{"name": "f", "arguments": {"x": 1}}\\n</tool_call>'
    >>> fmt.parse(fmt.render_call([("f", {"x": 1})]))
    [ParsedCall(name='f', arguments={'x': 1}, error=None, raw='')]
"""

from __future__ import annotations

import abc
import copy
import json
import re
from typing import Any, Mapping, Sequence

from agentmem.errors import ConfigError, PolicyError

from .grammar import (
    _call_rules,
    _convert,
    _format,
    _literal,
    _parse,
    call_or_document_grammar,
    closed_parameters,
    split_forced_prefix,
)
from .parse import ParsedCall, find_tool_calls, looks_like_tool_call, opens_tool_call, parse_envelope

__all__ = ["TOOL_FORMATS", "ToolFormat", "arguments_text", "detect_tool_format", "get_tool_format"]

Call = tuple[str, Any]
"""A call to render: `(name, arguments)`; arguments a dict or a JSON string."""


def arguments_text(arguments: Any) -> str:
    """Arguments as a template's `tojson` writes them (HF semantics: keys in order, `", "`/`": "`)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, ensure_ascii=False)


def _prefix_state(lead: str, opener: str) -> bool | None:
    """Whether `lead` (stripped) opens with `opener` (True), may still (None), or does not (False)."""
    s = lead.lstrip()
    if not s:
        return None
    if s.startswith(opener):
        return True
    return None if opener.startswith(s) else False


def _as_call(obj: Any, args_key: str, raw: str) -> ParsedCall:
    """One decoded call object → `ParsedCall` (an invalid one when it lacks a name or object arguments)."""
    name = obj.get("name") if isinstance(obj, Mapping) else None
    args = obj.get(args_key, obj.get("arguments", {})) if isinstance(obj, Mapping) else None
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            args = None
    if isinstance(name, str) and isinstance(args, Mapping):
        return ParsedCall(name, dict(args))
    return ParsedCall(
        name if isinstance(name, str) else None, None,
        f"a tool call needs a string 'name' and an object '{args_key}'", raw,
    )


class ToolFormat(abc.ABC):
    """One tool-call syntax: render, constrain, parse and detect it.

    Attributes:
        name: the registry name.
        native: the chat template takes `tools=` and describes them itself; `False`
            means agentmem's tools block goes into the system prompt.
        opener: the text every call starts with (used by `opens_call`).
        markers: texts of the syntax that a model's vocabulary may hold as single tokens.
        bare_opening: the text the template writes before a call that a model may leave out,
            writing the bare call object instead (`<tool_call>\\n` for Hermes); `""` when the
            bare object is not a call of this syntax or is its canonical form already.
        tokens: the markers that are single tokens of the model this format is bound to
            (`with_tokens`), text → id; the grammar names them as token references,
            since llama.cpp's grammar does not match a special token against literal text.
    """

    name: str = "base"
    native: bool = True
    opener: str = ""
    markers: tuple[str, ...] = ()
    bare_opening: str = ""
    tokens: Mapping[str, int] = {}

    def with_tokens(self, tokens: Mapping[str, int]) -> ToolFormat:
        """This format bound to a vocabulary: `tokens` maps the markers that are single tokens to their ids."""
        bound = copy.copy(self)
        bound.tokens = {m: tokens[m] for m in self.markers if m in tokens}
        return bound

    def _lit(self, text: str) -> str:
        """GBNF for the literal `text`, its single-token markers as token references."""
        if not text:
            return ""
        for m in self.tokens:
            j = text.find(m)
            if j != -1:
                ref = m if re.fullmatch(r"<[^\s<>\"\[\]]+>", m) else f"<[{self.tokens[m]}]>"
                return " ".join(x for x in (self._lit(text[:j]), ref, self._lit(text[j + len(m):])) if x)
        return _literal(text)

    @classmethod
    @abc.abstractmethod
    def detect(cls, template: str) -> bool:
        """Whether a chat template's text writes calls in this syntax."""

    @abc.abstractmethod
    def render_call(self, calls: Sequence[Call]) -> str:
        """The exact text the template writes for `calls` after the generation prompt."""

    @abc.abstractmethod
    def grammar(self, tools: Sequence[Mapping[str, Any]], *, parallel: bool = False) -> str:
        """GBNF (rule `root`) for exactly `render_call` text calling one of `tools`.

        Args:
            tools: `{"name", "parameters"}` of the tools that may be called (pass one
                tool to force it by name).
            parallel: allow several calls in one reply.

        Raises:
            ConfigError: no tools, a tool without a name, or a schema the converter cannot express.
        """

    @abc.abstractmethod
    def parse(self, text: str) -> list[ParsedCall] | None:
        """The calls of a reply that is a call (strict); `None` when it is not one.

        A reply that opens like a call but does not parse (cut off) gives one
        invalid `ParsedCall`.
        """

    def find(self, text: str, names: Sequence[str]) -> tuple[list[ParsedCall], str] | None:
        """A call anywhere in free `text`: `(calls, text_before)`, or `None` (lenient).

        Only valid calls to tools in `names` count. This format's syntax is tried
        first, then agentmem's envelope or a bare `{"name", "arguments"}` object.
        """
        j = text.find(self.opener) if self.opener else -1
        if j != -1:
            parsed = self.parse(text[j:])
            if parsed and all(c.ok and c.name in names for c in parsed):
                return parsed, text[:j].strip()
        return find_tool_calls(text, names)

    def opens_call(self, lead: str) -> bool | None:
        """Whether a reply starting with `lead` is (True), is not (False) or may be (None) a call."""
        return _prefix_state(lead, self.opener)

    def looks_like_call(self, text: str, names: Sequence[str]) -> bool:
        """Whether the model tried to call a tool (maybe malformed): worth redoing under the grammar."""
        return (bool(self.opener) and self.opener in text) or looks_like_tool_call(text, names)

    def written_back(self, content: str, calls: Sequence[Call]) -> str:
        """The text the template writes back after the generation prompt for a reply of `content` and `calls`."""
        call = self.render_call(calls)
        return f"{content.strip()}\n{call}" if content.strip() else call

    def call_or_document(
        self, tools: Sequence[Mapping[str, Any]], schema: Mapping[str, Any], *, parallel: bool = False
    ) -> str:
        """GBNF for either a call over `tools` or a JSON document of `schema` (the parse decides)."""
        rules = _parse(self.grammar(tools, parallel=parallel))
        calls = {("tc-root" if k == "root" else k): v for k, v in rules.items()}
        return _format({"root": "tc-root | doc", **calls, **_convert(schema, "doc", "the JSON schema")})

    @property
    def parallel(self) -> bool:
        """Whether one reply may hold several calls in this syntax."""
        return True

    def bare_heads(self, names: Sequence[str]) -> tuple[str, ...]:
        """How a call to each of `names` starts, as `render_call` writes it, without `bare_opening`.

        Empty when the format has no `bare_opening`. `agentmem.tools.canonical` matches a
        reply's first characters against these.
        """
        return ()

    def forced(self, tools: Sequence[Mapping[str, Any]], *, parallel: bool = False) -> tuple[str, str]:
        """`grammar` split into `(prefix, rest)`: the forced head goes in the prompt (`split_forced_prefix`).

        The prefix ends before a space (`at_space`), so the KV of prefix + reply can be the
        tokens the template renders when the call is sent back (`MemoryPool.chat`'s `opening`).
        """
        return split_forced_prefix(self.grammar(tools, parallel=parallel), at_space=True)

    def continuation(self, tools: Sequence[Mapping[str, Any]], *, parallel: bool = False) -> tuple[str, str]:
        """Like `forced`, but the prefix stops where the arguments (one tool) or the name (several) begin."""
        tools = list(tools)
        return split_forced_prefix(self.grammar(tools, parallel=parallel), keep=[f"t{i}" for i in range(len(tools))])

    def __repr__(self) -> str:
        return f"<ToolFormat {self.name}>"


class EnvelopeFormat(ToolFormat):
    """agentmem's own `{"tool_calls": [...]}` envelope (templates without tool support)."""

    name = "envelope"
    native = False
    opener = '{"tool_calls"'

    @classmethod
    def detect(cls, template: str) -> bool:
        return True  # the fallback

    def render_call(self, calls: Sequence[Call]) -> str:
        body = ", ".join(f'{{"name": {json.dumps(n, ensure_ascii=False)}, "arguments": {arguments_text(a)}}}' for n, a in calls)
        return '{"tool_calls": [' + body + "]}"

    def grammar(self, tools: Sequence[Mapping[str, Any]], *, parallel: bool = False) -> str:
        return _format(_call_rules(list(tools), parallel, "")[1])

    def parse(self, text: str) -> list[ParsedCall] | None:
        return parse_envelope(text)

    def find(self, text: str, names: Sequence[str]) -> tuple[list[ParsedCall], str] | None:
        return find_tool_calls(text, names)

    def opens_call(self, lead: str) -> bool | None:
        return opens_tool_call(lead)

    def looks_like_call(self, text: str, names: Sequence[str]) -> bool:
        return looks_like_tool_call(text, names)

    def call_or_document(
        self, tools: Sequence[Mapping[str, Any]], schema: Mapping[str, Any], *, parallel: bool = False
    ) -> str:
        return call_or_document_grammar(tools, schema, parallel=parallel)


class _JSONCallFormat(ToolFormat):
    """A syntax of JSON call objects `{"name": ..., <args_key>: {...}}` between fixed texts."""

    args_key = "arguments"
    open_text = ""  # before the first call
    sep = ""  # between calls
    close_text = ""  # after the last call
    call_open = ""  # before each call object
    call_close = ""  # after each call object

    def _one(self, name: str, arguments: Any) -> str:
        obj = f'{{"name": {json.dumps(name, ensure_ascii=False)}, "{self.args_key}": {arguments_text(arguments)}}}'
        return self.call_open + obj + self.call_close

    def render_call(self, calls: Sequence[Call]) -> str:
        return self.open_text + self.sep.join(self._one(n, a) for n, a in calls) + self.close_text

    def bare_heads(self, names: Sequence[str]) -> tuple[str, ...]:
        if not self.bare_opening:
            return ()
        lead = self.open_text + self.call_open
        assert lead.startswith(self.bare_opening), f"{lead=}, {self.bare_opening=}"
        rest = lead[len(self.bare_opening) :]
        return tuple(f'{rest}{{"name": {json.dumps(n, ensure_ascii=False)}' for n in names)

    def grammar(self, tools: Sequence[Mapping[str, Any]], *, parallel: bool = False) -> str:
        tools = list(tools)
        rules: dict[str, str] = {}
        alts: list[str] = []
        for i, t in enumerate(tools):
            name = t.get("name")
            if not isinstance(name, str) or not name:
                raise ConfigError(f"tools[{i}] needs a non-empty string 'name', got {name!r}")
            params = closed_parameters(t.get("parameters"), field=f"tools[{i}].parameters")
            rules.update(_convert(params, f"t{i}", f"tools[{i}] ({name!r}) parameters", field=f"tools[{i}].parameters"))
            head = json.dumps(name, ensure_ascii=False)[1:] + f', "{self.args_key}": '
            rules[f"t{i}-call"] = f"{_literal(head)} t{i}"
            alts.append(f"t{i}-call")
        if not alts:
            raise ConfigError("a tool-call grammar needs at least one tool (tools is empty)")
        one = alts[0] if len(alts) == 1 else "( " + " | ".join(alts) + " )"
        call = f'{self._lit(self.call_open + "{" + chr(34) + "name" + chr(34) + ": " + chr(34))} {one} {self._lit("}" + self.call_close)}'
        seq = f"call ( {self._lit(self.sep)} call )*" if parallel and self.sep else "call"
        root = " ".join(x for x in (self._lit(self.open_text), seq, self._lit(self.close_text)) if x)
        return _format({"root": root, "call": call, **rules})

    def _bodies(self, s: str) -> list[str] | None:
        """The JSON texts of the calls in `s` (which opens with `opener`): by default one, all
        that follows the opener; formats with per-call markup split it their way."""
        body = s[len(self.opener) :].strip()
        return [body] if body else None

    def parse(self, text: str) -> list[ParsedCall] | None:
        s = text.strip()
        if not s.startswith(self.opener):
            return None
        bodies = self._bodies(s)
        if not bodies:
            return [ParsedCall(None, None, "invalid tool-call text: no call object", s)]
        calls: list[ParsedCall] = []
        for body in bodies:
            try:
                obj = json.loads(body)
            except ValueError as exc:
                name_m = re.search(r'"name":\s*("(?:[^"\\]|\\.)*")', body)
                name = json.loads(name_m.group(1)) if name_m else None
                k = body.find(f'"{self.args_key}": ')
                raw = body[k + len(self.args_key) + 4 :] if k != -1 else ""
                calls.append(ParsedCall(name, None, f"invalid tool-call JSON: {exc}", raw))
                continue
            calls.append(_as_call(obj, self.args_key, body))
        return calls


class HermesFormat(_JSONCallFormat):
    """Qwen2.5 / Hermes 2 Pro: each call in `<tool_call>` tags, one per line."""

    name = "hermes"
    opener = "<tool_call>"
    markers = ("<tool_call>", "</tool_call>")
    call_open = "<tool_call>\n"
    call_close = "\n</tool_call>"
    sep = "\n"
    bare_opening = "<tool_call>\n"

    @classmethod
    def detect(cls, template: str) -> bool:
        return "<tool_call>" in template

    _BODY_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)

    def _bodies(self, s: str) -> list[str] | None:
        return [b for b in self._BODY_RE.findall(s) if b]


class Llama3Format(_JSONCallFormat):
    """Llama 3.1+ custom tools: one `{"name": ..., "parameters": {...}}` object."""

    name = "llama3"
    opener = '{"name"'
    markers = ("<|python_tag|>",)
    args_key = "parameters"

    @classmethod
    def detect(cls, template: str) -> bool:
        return "<|python_tag|>" in template or ('"parameters": ' in template and "<|start_header_id|>" in template)

    def parse(self, text: str) -> list[ParsedCall] | None:
        s = text.strip()
        if s.startswith("<|python_tag|>"):
            s = s[len("<|python_tag|>") :].lstrip()
        return super().parse(s)

    def opens_call(self, lead: str) -> bool | None:
        tag = _prefix_state(lead, "<|python_tag|>")
        return tag if tag is not False else _prefix_state(lead, self.opener)

    @property
    def parallel(self) -> bool:
        return False  # the template writes one call per message

    def _bodies(self, s: str) -> list[str] | None:
        return [s]


class MistralFormat(_JSONCallFormat):
    """Mistral v3+: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`."""

    name = "mistral"
    opener = "[TOOL_CALLS]"
    markers = ("[TOOL_CALLS]",)
    open_text = "[TOOL_CALLS] ["
    sep = ", "
    close_text = "]"
    bare_opening = "[TOOL_CALLS] "

    @classmethod
    def detect(cls, template: str) -> bool:
        return "[TOOL_CALLS]" in template

    def parse(self, text: str) -> list[ParsedCall] | None:
        s = text.strip()
        if not s.startswith(self.opener):
            return None
        body = s[len(self.opener) :].strip()
        try:
            items = json.loads(body)
        except ValueError as exc:
            return [ParsedCall(None, None, f"invalid tool-call JSON: {exc}", body)]
        if isinstance(items, Mapping):
            items = [items]
        if not isinstance(items, list):
            return [ParsedCall(None, None, "[TOOL_CALLS] is not followed by a list", body)]
        return [_as_call(it, self.args_key, json.dumps(it, ensure_ascii=False)) for it in items]


TOOL_FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HermesFormat(), Llama3Format(), MistralFormat(), EnvelopeFormat())}
"""The formats by name, in detection order (`envelope`, the fallback, last)."""


def get_tool_format(name: str) -> ToolFormat:
    """The format registered as `name`.

    Raises:
        PolicyError: an unknown name (the message lists the valid ones).
    """
    try:
        return TOOL_FORMATS[name]
    except KeyError:
        raise PolicyError(f"unknown tool format {name!r}; valid: {', '.join(TOOL_FORMATS)}") from None


def detect_tool_format(template: str | None) -> ToolFormat:
    """The tool-call syntax a chat template writes calls in (`envelope` when it has none).

    >>> detect_tool_format("{% for m in messages %}{{ m.content }}{% endfor %}").name
    'envelope'
    """
    if not template:
        return TOOL_FORMATS["envelope"]
    for fmt in TOOL_FORMATS.values():
        if fmt.detect(template):
            return fmt
    return TOOL_FORMATS["envelope"]
