"""JSON schemas and tool lists → llama.cpp GBNF grammars that emit canonical JSON.

agentmem renders past tool calls into the prompt as
`{"tool_calls": [{"name": "...", "arguments": {...}}]}` with the `json.dumps`
separators `", "` and `": "` (see `agentmem.engine.chat_format.tool_calls_text`).
The grammars built here make the model emit exactly that form, so a tool call the
model made and the same call rendered back into the next prompt are the same text,
and the agent's kept KV stays a prefix of its next prompt.

The JSON-schema conversion is llama-cpp-python's public `json_schema_to_gbnf` (a port
of llama.cpp's `json_schema_to_grammar`). Its output is rewritten so that whitespace is
fixed (no optional spaces), strings cannot hold raw control characters (which
`json.loads` rejects) and integer `minimum`/`maximum` bounds are kept (the converter
ignores them: bounded integers go through it as placeholder constants whose literal is
then replaced by an exact range, see `integer_range`).

Functions:
    `schema_grammar`: one JSON schema → a grammar for a JSON value.
    `tool_call_grammar`: the tool-call envelope over a list of tools.
    `call_or_document_grammar`: a tool call or a JSON document (tools + structured output).
    `split_forced_prefix` / `tool_call_continuation`: the text a grammar forces at its
        start, to be put in the prompt (prefilled in one batch) instead of generated.
    `choice_grammar`: exactly one of some strings.
    `clean_schema` / `closed_parameters`: schema cleaning for prompts and grammars.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping, Sequence

from llama_cpp.llama_grammar import json_schema_to_gbnf

from agentmem.errors import ConfigError
from agentmem.tools.int_range import BOUND_KEYS, int_bounds, integer_range
from agentmem.tools.limits import check_schema, repeat_rules

__all__ = [
    "JSON_OBJECT_GRAMMAR",
    "call_or_document_grammar",
    "choice_grammar",
    "clean_schema",
    "closed_parameters",
    "integer_range",
    "schema_grammar",
    "split_forced_prefix",
    "tool_call_continuation",
    "tool_call_grammar",
]

# A JSON string character: anything but a quote, a backslash or a control character,
# or an escape (the converter's `[^"\\]` allows raw newlines, which json.loads rejects).
_PLAIN_CHAR = r'[^"\\\x7F\x00-\x1F]'
_CONVERTER_CHAR = r'[^"\\]'

# A GBNF rule body: literals, character classes, repetition counts, rule names, the rest.
_TOKEN_RE = re.compile(
    r'"(?:\\.|[^"\\])*"'
    r"|\[(?:\\.|[^\]\\])*\]"
    r"|\{\d+(?:,\d*)?\}"
    r"|!?<\[\d+\]>|!?<[^\s<>\"]+>"  # token references: <[151657]>, <tool_call>
    r"|[A-Za-z0-9-]+"
    r"|\s+"
    r"|."
)


def _tokens(body: str) -> list[str]:
    """The tokens of a rule body (a quantifier glued to its operand, `char*`, is a token of its own)."""
    return [t for t in _TOKEN_RE.findall(body) if not t.isspace()]


def _join(tokens: Sequence[str]) -> str:
    """Tokens as a rule body: one space apart, a quantifier stuck to what it repeats (`char*`)."""
    out: list[str] = []
    for t in tokens:
        if out and (t in ("*", "+", "?") or t.startswith("{")):
            out[-1] += t
        else:
            out.append(t)
    return " ".join(out)


def _literal(text: str) -> str:
    """A GBNF string literal for `text`."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def _format(rules: Mapping[str, str]) -> str:
    return "\n".join(f"{name} ::= {body}" for name, body in rules.items()) + "\n"


def _parse(grammar: str) -> dict[str, str]:
    rules: dict[str, str] = {}
    for line in grammar.split("\n"):  # not splitlines(): a literal may hold \u2028, \x1c, ... raw
        name, sep, body = line.partition(" ::= ")
        if sep:
            rules[name.strip()] = body.strip()
    return rules


# --------------------------------------------------------------------------- schema cleaning
def clean_schema(schema: Any, *, field: str = "schema") -> Any:
    """`schema` without its `title` strings (noise for the model, irrelevant to a grammar).

    Only a `title` whose value is a string is a title; a property named `title` stays.

    >>> clean_schema({"title": "Pet", "properties": {"title": {"type": "string", "title": "Title"}}})
    {'properties': {'title': {'type': 'string'}}}

    Raises:
        GrammarLimitError: (a `ConfigError`) the schema is over a limit of `agentmem.tools.limits`
            (checked first, without recursion: a schema nested 10,000 deep is an error, not a `RecursionError`).
    """
    check_schema(schema, field=field)
    return _clean(schema)


def _clean(schema: Any) -> Any:
    if isinstance(schema, Mapping):
        return {k: _clean(v) for k, v in schema.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_clean(v) for v in schema]
    return schema


def closed_parameters(params: Mapping[str, Any] | None, *, field: str = "parameters") -> dict[str, Any]:
    """A tool's parameter schema as a closed object: no properties beyond the declared ones.

    A tool without parameters (or `{"type": "object"}`) takes exactly `{}`.

    Raises:
        ConfigError: `params` is not a JSON object (or is over a limit: `GrammarLimitError`).
    """
    if params is not None and not isinstance(params, Mapping):
        raise ConfigError(f"{field} must be a JSON schema object, got {type(params).__name__}")
    p = dict(clean_schema(params or {}, field=field))
    p.setdefault("type", "object")
    p.setdefault("properties", {})
    p.setdefault("additionalProperties", False)
    return p


# Keywords whose value is a subschema, a list of subschemas, or a name -> subschema map.
_SUB_ONE = ("items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames")
_SUB_LIST = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUB_MAP = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


_LONG_STRING = 64  # bounds above this become `char{256}` chunks (the converter nests one group per char)
_STRING_CHAR = "agentmem-char"
_STRING_PLAIN = ("pattern", "format", "enum", "const")
_STRING_CHAR_BODY = _PLAIN_CHAR + r' | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] )'


def _placeholder(ranges: dict[str, str], body: str) -> dict[str, str]:
    const = f"agentmem-int-range-{len(ranges)}"
    # the converter writes a constant as the literal of its JSON text
    ranges['"' + json.dumps(const).replace('"', '\\"') + '"'] = body
    return {"const": const}


def _long_string(schema: Mapping[str, Any], ranges: dict[str, str]) -> dict[str, str] | None:
    """A placeholder for a string whose length bounds are large (flat chunks, see `repeat_rules`)."""
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    if any(k in schema for k in _STRING_PLAIN) or max(lo, hi or 0) <= _LONG_STRING:
        return None
    body, _helpers = repeat_rules(_STRING_CHAR, lo, hi)
    return _placeholder(ranges, f'"\\"" {body} "\\""')


def _constants(schema: Mapping[str, Any]) -> list[Any] | None:
    """The values of a `const`/`enum` the converter would write (its literals do not escape `\\`)."""
    if any(k in schema for k in ("$ref", "oneOf", "anyOf")) or isinstance(schema.get("type"), list):
        return None
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return list(schema["enum"])
    return None


def _placeholder_ints(schema: Any, ranges: dict[str, str]) -> Any:
    """`schema` with each bounded integer (and each long string) replaced by a constant; `ranges`
    maps its literal to a GBNF body."""
    if not isinstance(schema, Mapping):
        return schema
    if schema.get("type") == "string" and (long := _long_string(schema, ranges)) is not None:
        return long
    if (values := _constants(schema)) is not None:
        texts = [json.dumps(v, ensure_ascii=False) for v in values]
        if any("\\" in t for t in texts):  # an escape in the JSON text: the converter would garble it
            body = " | ".join(_literal(t) for t in texts)
            return _placeholder(ranges, body if len(texts) == 1 else f"( {body} )")
    if schema.get("type") == "integer" and any(k in schema for k in BOUND_KEYS):
        lo, hi = int_bounds(schema)
        if lo is not None or hi is not None:
            return _placeholder(ranges, f"( {integer_range(lo, hi)} )")
    out = dict(schema)
    for k in _SUB_ONE:
        if isinstance(out.get(k), Mapping):
            out[k] = _placeholder_ints(out[k], ranges)
    for k in _SUB_LIST:
        if isinstance(out.get(k), list):
            out[k] = [_placeholder_ints(v, ranges) for v in out[k]]
    for k in _SUB_MAP:
        if isinstance(out.get(k), Mapping):
            out[k] = {name: _placeholder_ints(v, ranges) for name, v in out[k].items()}
    return out


# --------------------------------------------------------------------------- conversion
def _respace(body: str, rename: Mapping[str, str], ranges: Mapping[str, str]) -> str:
    """One converter rule body in canonical spacing, with its rule references renamed.

    `":" space` becomes `": "`, `"," space` becomes `", "` and every other reference to
    the `space` rule is dropped: the output then has exactly the separators of
    `json.dumps(..., separators=(", ", ": "))`.
    """
    toks = _tokens(body)
    out: list[str] = []
    for i, t in enumerate(toks):
        if t == "space":
            continue
        nxt = toks[i + 1] if i + 1 < len(toks) else ""
        if t == '":"' and nxt == "space":
            out.append('": "')
        elif t == '","' and nxt == "space":
            out.append('", "')
        elif t == _CONVERTER_CHAR:
            out.append(_PLAIN_CHAR)
        else:
            out.append(_join([rename.get(x, x) for x in _tokens(ranges[t])]) if t in ranges else rename.get(t, t))
    return _join(out)


def _convert(
    schema: Mapping[str, Any], prefix: str, what: str, prop_order: Sequence[str] = (), *, field: str = "schema"
) -> dict[str, str]:
    """The rules of `schema`, canonically spaced, each name prefixed with `prefix-` (root: `prefix`).

    Raises:
        GrammarLimitError: the schema is over a limit of `agentmem.tools.limits` (names `field`).
        ConfigError: the converter cannot express `schema` (the message names `what`).
    """
    if not isinstance(schema, Mapping):
        raise ConfigError(f"{what} must be a JSON schema dict, got {type(schema).__name__}")
    check_schema(schema, field=field)
    ranges: dict[str, str] = {}
    try:
        raw = json_schema_to_gbnf(json.dumps(_placeholder_ints(schema, ranges)), list(prop_order))
    except Exception as exc:  # the converter raises bare Exceptions, asserts, KeyErrors
        try:
            shown = json.dumps(schema)[:200]
        except (TypeError, ValueError):
            shown = repr(schema)[:200]
        raise ConfigError(
            f"cannot build a grammar for {what}: cannot turn this JSON schema into GBNF ({exc}): {shown}"
        ) from exc
    rules = _parse(raw)
    rules.pop("space", None)
    if any(_STRING_CHAR in body for body in ranges.values()):
        rules.update({_STRING_CHAR: _STRING_CHAR_BODY, **repeat_rules(_STRING_CHAR, 0, 0)[1]})
    rename = {n: (prefix if n == "root" else f"{prefix}-{n}") if prefix else n for n in rules}
    out = {rename[n]: _respace(body, rename, ranges) for n, body in rules.items()}
    if empty := [n for n, body in out.items() if not body]:
        raise ConfigError(f"{field}: part of the schema matches no value (an empty enum, anyOf or type list: "
                          f"rule {empty[0]!r})")
    return out


def schema_grammar(schema: Mapping[str, Any], *, prop_order: Sequence[str] = ()) -> str:
    """A grammar (rule `root`) for the JSON values matching `schema`, canonically spaced.

    Args:
        schema: a JSON schema (`$ref` into its own `$defs` is resolved; remote refs are not).
        prop_order: property names to emit first, in this order.

    Raises:
        ConfigError: (a `ValueError`) the schema uses something the converter cannot express.

    Examples:
        >>> print(schema_grammar({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
        ...                       "required": ["a"]}), end="")
        a ::= ( ( [0-9] ) | ( [1-9] [0-9] ) )
        a-kv ::= "\\"a\\"" ": " a
        root ::= "{" a-kv "}"
    """
    return _format(_convert(schema, "", "the JSON schema", prop_order))


JSON_OBJECT_GRAMMAR: str = schema_grammar({"type": "object"})
"""GBNF for one JSON object of any shape, canonically spaced (JSON mode)."""


def _call_rules(tools: Sequence[Mapping[str, Any]], parallel: bool, prefix: str) -> tuple[str, dict[str, str]]:
    """The envelope's rules; returns the name of its root rule and all rules, names prefixed."""
    if not tools:
        raise ConfigError("tool_call_grammar needs at least one tool (tools is empty)")
    rules: dict[str, str] = {}
    calls: list[str] = []
    for i, t in enumerate(tools):
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"tools[{i}] needs a non-empty string 'name', got {name!r}")
        what = f"tools[{i}] ({name!r}) parameters"
        field = f"tools[{i}].parameters"
        rules.update(_convert(closed_parameters(t.get("parameters"), field=field), f"{prefix}t{i}", what, field=field))
        # The common head '{"name": "' sits in `call` so that it is forced text even
        # when several tools may be called (see split_forced_prefix).
        head = json.dumps(name, ensure_ascii=False)[1:] + ', "arguments": '
        rules[f"{prefix}t{i}-call"] = f"{_literal(head)} {prefix}t{i}"
        calls.append(f"{prefix}t{i}-call")
    call = f"{prefix}call"
    seq = f'{call} ( ", " {call} )*' if parallel else call
    alts = calls[0] if len(calls) == 1 else "( " + " | ".join(calls) + " )"
    top = {
        f"{prefix}root": f"{_literal('{' + chr(34) + 'tool_calls' + chr(34) + ': [')} {seq} {_literal(']}')}",
        call: f"{_literal('{' + chr(34) + 'name' + chr(34) + ': ' + chr(34))} {alts} {_literal('}')}",
    }
    return f"{prefix}root", {**top, **rules}


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], *, parallel: bool = False) -> str:
    """A grammar for `{"tool_calls": [{"name": ..., "arguments": {...}}]}` over `tools`.

    Args:
        tools: `{"name": str, "parameters": <JSON schema>}` for each callable tool;
            arguments are closed objects (`closed_parameters`).
        parallel: allow several calls in one reply (otherwise exactly one).

    Raises:
        ConfigError: no tools, a tool without a name, or a schema the converter cannot express.
    """
    _root, rules = _call_rules(list(tools), parallel, "")
    return _format(rules)


def call_or_document_grammar(
    tools: Sequence[Mapping[str, Any]], schema: Mapping[str, Any], *, parallel: bool = False
) -> str:
    """A grammar for either a tool call over `tools` or a JSON document of `schema`."""
    call_root, calls = _call_rules(list(tools), parallel, "tc-")
    doc = _convert(schema, "doc", "the JSON schema")
    return _format({"root": f"{call_root} | doc", **calls, **doc})


# --------------------------------------------------------------------------- forced prefix
_ESCAPE_RE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)")
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\", "[": "[", "]": "]"}


def _unescape(literal: str) -> str:
    def sub(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xuU" and len(e) > 1:
            return chr(int(e[1:], 16))
        if e in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[e]
        raise ValueError(f"unknown escape \\{e}")

    return _ESCAPE_RE.sub(sub, literal[1:-1])


def _top_level_alternative(tokens: Sequence[str]) -> bool:
    depth = 0
    for t in tokens:
        if t == "(":
            depth += 1
        elif t == ")":
            depth -= 1
        elif t == "|" and depth == 0:
            return True
    return False


def split_forced_prefix(grammar: str, *, keep: Iterable[str] = (), at_space: bool = False) -> tuple[str, str]:
    """Split off the text every output of `grammar` starts with.

    Returns `(prefix, rest)`: `prefix` is forced text (it can be put in the prompt as the
    start of the reply and decoded in one batch instead of one constrained token at a
    time) and `rest` a grammar for what follows it. Trailing whitespace stays in `rest`
    (a prompt ending in a space tokenizes badly), and `rest` never becomes empty.

    Args:
        grammar: a grammar with a `root` rule.
        keep: rules not to look into (the prefix stops where one of them starts).
        at_space: end the prefix before its last space (the rest goes back into `rest`),
            so no token of the whole text straddles the split: a byte-level BPE
            pre-tokenizer (GPT-2, Qwen2, Llama 3) always starts a new piece at a space
            after a non-space. A forced tool call needs this: its prefix and its
            generated rest must tokenize as the whole call does when it is sent back.

    >>> split_forced_prefix(tool_call_grammar([{"name": "f", "parameters": {
    ...     "type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}]))[0]
    '{"tool_calls": [{"name": "f", "arguments": {"x": "'
    """
    rules = _parse(grammar)
    opaque = set(keep)
    tokens = _tokens(rules["root"])
    prefix = ""
    for _ in range(1000):  # bounded: a rule cannot start with itself in GBNF, but be safe
        if not tokens or _top_level_alternative(tokens):
            break
        head, nxt = tokens[0], (tokens[1] if len(tokens) > 1 else "")
        if nxt in ("*", "+", "?") or nxt.startswith("{"):
            break
        if head.startswith('"') and len(tokens) > 1:
            try:
                prefix += _unescape(head)
            except ValueError:
                break
            tokens = tokens[1:]
        elif head.startswith("<") and not head.startswith("<[") and len(tokens) > 1:
            prefix += head  # a token named by its text: the text tokenizes back to it in the prompt
            tokens = tokens[1:]
        elif head in rules and head not in opaque:
            body = _tokens(rules[head])
            if _top_level_alternative(body):
                break
            tokens = body + tokens[1:]
        else:
            break
    stripped = prefix.rstrip()
    ends_at_space = stripped != prefix
    if ends_at_space:
        tokens = [_literal(prefix[len(stripped):]), *tokens]
        prefix = stripped
    k = prefix.rfind(" ") if at_space and not ends_at_space else -1
    if k > 0 and "<" not in prefix[k:]:  # a token named by its text stays in the prefix
        tokens = [_literal(prefix[k:]), *tokens]
        prefix = prefix[:k]
    if not prefix:
        return "", grammar
    rules["root"] = _join(tokens)
    return prefix, _format(rules)


def tool_call_continuation(tools: Sequence[Mapping[str, Any]], *, parallel: bool = False) -> tuple[str, str]:
    """A tool call split into `(prefix, grammar)` at the arguments: `prefix + <output>` is a call.

    With one tool the prefix runs up to `"arguments":` (the model writes only the
    arguments); with several it runs up to `"name": "` (the model picks the name).
    `split_forced_prefix(tool_call_grammar(tools))` goes further, into the arguments.

    >>> tool_call_continuation([{"name": "f"}])[0]
    '{"tool_calls": [{"name": "f", "arguments":'
    """
    tools = list(tools)
    return split_forced_prefix(tool_call_grammar(tools, parallel=parallel), keep=[f"t{i}" for i in range(len(tools))])


def choice_grammar(choices: Iterable[str]) -> str:
    """GBNF that matches exactly one of `choices` (e.g. speaker names for a selector).

    Raises:
        ConfigError: `choices` is empty or holds something other than non-empty strings.
    """
    opts = list(choices)
    if not opts or any(not isinstance(c, str) or not c for c in opts):
        raise ConfigError(f"choice_grammar needs non-empty strings (choices), got {opts!r}")
    return "root ::= " + " | ".join(_literal(c) for c in opts) + "\n"
