"""GBNF grammars for tool calls, JSON mode and fixed choices.

llama.cpp's grammar sampler is what makes a 270M model's tool calls and JSON
valid. The grammars here emit JSON in one *canonical* spacing — the spacing of
``json.dumps(..., separators=(", ", ": "))``, which is also how
:func:`agentmem.engine.chat_format.tool_calls_text` writes past tool calls back
into the prompt — so the tokens a model generates for a tool call are the tokens
the next prompt renders for it, and the agent's kept KV stays a prefix.

* :func:`schema_grammar` — a JSON schema → GBNF (llama-cpp-python's converter,
  re-spaced canonically, control characters barred from strings so
  ``json.loads`` accepts every output).
* :func:`tool_call_grammar` — ``{"tool_calls": [{"name": ..., "arguments": {...}}]}``
  whose names and arguments follow the tools' schemas.
* :func:`tool_call_continuation` — the same call split into a fixed *prefix* (put in
  the prompt as the start of the reply: prefilled in one batch, tokenized exactly as
  the next prompt will render it) and a grammar for the rest, so the grammar sampler —
  slow over a 262k-token vocabulary — runs only for the tokens the model chooses.
* :data:`JSON_OBJECT_GRAMMAR` — any JSON object (``json_output=True``).
* :func:`choice_grammar` — exactly one of some strings (e.g. a selector's speaker names).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "JSON_OBJECT_GRAMMAR",
    "call_or_document_grammar",
    "choice_grammar",
    "schema_grammar",
    "tool_call_continuation",
    "tool_call_grammar",
]

# Strings exclude raw control characters: json.loads (strict) rejects them.
_PLAIN_CHAR = r'[^"\\\x7F\x00-\x1F]'
_CHAR = _PLAIN_CHAR + r' | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'

JSON_OBJECT_GRAMMAR = rf"""root ::= object
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{{" ( string ": " value ( ", " string ": " value )* )? "}}"
array ::= "[" ( value ( ", " value )* )? "]"
string ::= "\"" char* "\""
char ::= {_CHAR}
number ::= "-"? ( [0-9] | [1-9] [0-9]{{1,15}} ) ( "." [0-9]{{1,15}} )? ( [eE] [-+]? [0-9]{{1,15}} )?
"""
"""GBNF for one JSON object of any shape, canonically spaced."""

# A GBNF rule body: string literals, character classes, rule names, everything else.
_TOKEN_RE = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z][A-Za-z0-9-]*|\s+|.', re.S)


def _respace(body: str) -> str:
    """Rewrite one rule body from the converter's optional spaces to canonical spacing.

    The converter puts a ``space`` (``" "?``) after every literal; canonical JSON has
    exactly one space after ``:`` and ``,`` and none elsewhere.
    """
    out: list[str] = []
    for tok in _TOKEN_RE.findall(body):
        if tok == "space":
            prev = next((j for j in range(len(out) - 1, -1, -1) if not out[j].isspace()), None)
            if prev is not None and out[prev] in ('":"', '","'):
                out[prev] = out[prev][:2] + ' "'
            continue
        if tok == r'[^"\\]':  # the converter's string character class
            tok = _PLAIN_CHAR
        out.append(tok)
    return re.sub(r"\s+", " ", "".join(out)).strip()


def schema_grammar(schema: Mapping[str, Any], *, prop_order: Sequence[str] = ()) -> str:
    """GBNF for JSON documents matching ``schema`` (canonically spaced).

    Args:
        schema: a JSON schema (``$ref`` into ``$defs`` is resolved; remote refs are not).
        prop_order: property names to emit first, in this order.

    Raises:
        ValueError: the schema uses something the converter cannot express.
    """
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    try:
        raw = json_schema_to_gbnf(json.dumps(schema), list(prop_order))
    except Exception as exc:  # the converter raises bare Exceptions/asserts
        raise ValueError(f"cannot turn this JSON schema into a grammar: {exc}") from exc
    rules: list[str] = []
    for line in raw.splitlines():
        name, sep, body = line.partition(" ::= ")
        if not sep:
            continue
        if name == "space":
            continue
        rules.append(f"{name} ::= {_respace(body)}")
    return "\n".join(rules) + "\n"


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's ``title`` keys (noise for the prompt; irrelevant to the grammar)."""
    if isinstance(schema, Mapping):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


def _closed(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """A tool's parameter schema as a closed object (no properties beyond the declared ones)."""
    p = dict(_strip_titles(params or {}))
    p.setdefault("type", "object")
    p.setdefault("properties", {})
    p.setdefault("additionalProperties", False)
    return p


_CALL_ORDER = ("tool_calls", "name", "arguments")


def _envelope_schema(tools: Iterable[Mapping[str, Any]], parallel: bool) -> dict[str, Any]:
    """JSON schema of ``{"tool_calls": [...]}`` whose items call one of ``tools``."""
    alts = [
        {
            "type": "object",
            "properties": {"name": {"const": t["name"]}, "arguments": _closed(t.get("parameters"))},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    if not alts:
        raise ValueError("a tool-call grammar needs at least one tool")
    items: dict[str, Any] = alts[0] if len(alts) == 1 else {"anyOf": alts}
    calls: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        calls["maxItems"] = 1
    return {
        "type": "object",
        "properties": {"tool_calls": calls},
        "required": ["tool_calls"],
        "additionalProperties": False,
    }


def tool_call_grammar(tools: Iterable[Mapping[str, Any]], *, parallel: bool = False) -> str:
    """GBNF for ``{"tool_calls": [{"name": <a tool>, "arguments": {...}}]}``.

    Args:
        tools: tool schemas (``name``, optional ``parameters``) the model may call.
        parallel: allow more than one call in the list (default: exactly one).
    """
    return schema_grammar(_envelope_schema(tools, parallel), prop_order=_CALL_ORDER)


def call_or_document_grammar(
    tools: Iterable[Mapping[str, Any]], schema: Mapping[str, Any], *, parallel: bool = False
) -> str:
    """GBNF for either a tool call or a JSON document of ``schema`` (tools + structured output)."""
    doc = {k: v for k, v in schema.items() if k != "$defs"}
    union: dict[str, Any] = {"anyOf": [_envelope_schema(tools, parallel), doc]}
    if schema.get("$defs"):
        union["$defs"] = dict(schema["$defs"])  # refs point at the root's $defs
    return schema_grammar(union, prop_order=_CALL_ORDER)


def _renamed(grammar: str, prefix: str) -> str:
    """``grammar`` with every rule name prefixed (so several grammars can share one file)."""
    out = []
    for line in grammar.splitlines():
        name, sep, body = line.partition(" ::= ")
        if not sep:
            continue
        toks = _TOKEN_RE.findall(body)
        body = "".join(prefix + t if (t[0].isalpha()) else t for t in toks)
        out.append(f"{prefix}{name} ::= {body}")
    return "\n".join(out)


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def tool_call_continuation(tools: Sequence[Mapping[str, Any]], *, parallel: bool = False) -> tuple[str, str]:
    """Split a tool call into ``(prefix, grammar)``: ``prefix + <grammar output>`` is a call.

    With one tool the prefix runs up to ``"arguments":`` (the model only writes the
    arguments); with several it runs up to ``"name": "`` (the model picks the name).
    The concatenation is exactly what :func:`tool_call_grammar` admits.
    """
    tools = list(tools)
    if not tools:
        raise ValueError("tool_call_continuation needs at least one tool")
    rules: list[str] = []
    calls: list[str] = []
    for i, t in enumerate(tools):
        rules.append(_renamed(schema_grammar(_closed(t.get("parameters"))), f"t{i}-"))
        if parallel:
            call = _literal('{"name": ' + json.dumps(t["name"], ensure_ascii=False) + ', "arguments": ')
            rules.append(f"call-{i} ::= {call} t{i}-root \"}}\"")
            calls.append(f"call-{i}")
    if parallel:
        rules.append("call ::= " + " | ".join(calls))
    rest = '( ", " call )* "]}"' if parallel else '"]}"'
    if len(tools) == 1:
        prefix = '{"tool_calls": [{"name": ' + json.dumps(tools[0]["name"], ensure_ascii=False) + ', "arguments":'
        root = f'root ::= " " t0-root "}}" {rest}'
    else:
        prefix = '{"tool_calls": [{"name": "'
        tails = []
        for i, t in enumerate(tools):
            head = _literal(json.dumps(t["name"], ensure_ascii=False)[1:] + ', "arguments": ')
            tails.append(f'{head} t{i}-root "}}"')
        root = "root ::= ( " + " | ".join(tails) + f" ) {rest}"
    return prefix, "\n".join([root, *rules]) + "\n"


def choice_grammar(choices: Iterable[str]) -> str:
    """GBNF that matches exactly one of ``choices`` (e.g. speaker names for a selector)."""
    opts = [c for c in choices]
    if not opts or any(not isinstance(c, str) or not c for c in opts):
        raise ValueError(f"choice_grammar needs non-empty strings, got {opts!r}")
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in opts) + "\n"
