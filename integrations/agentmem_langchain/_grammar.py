"""JSON schemas and tool lists → llama.cpp GBNF grammars that emit canonical JSON.

agentmem renders past tool calls into the prompt as
``{"tool_calls": [{"name": "...", "arguments": {...}}]}`` with ``json.dumps``
separators ``", "`` and ``": "`` (see ``agentmem.engine.chat_format.tool_calls_text``).
The grammars built here make the model *emit exactly that form*, so a tool call
the model made and the same call rendered back into the next prompt are the same
text — and the agent's kept KV matches the next prompt further.

* :func:`schema_grammar` — one JSON schema → a grammar for a JSON value.
* :func:`json_object_grammar` — any JSON object (``json_mode``).
* :func:`tool_call_grammar` — the tool-call envelope over a list of tools.
* :func:`split_forced_prefix` — the text a grammar forces at its start, to be
  put in the prompt instead of generated token by token.

The JSON-schema conversion is llama-cpp-python's ``SchemaConverter`` (a port of
llama.cpp's ``json_schema_to_grammar``); its output is post-processed so that
whitespace is fixed (no optional spaces) and strings cannot hold raw control
characters (which ``json.loads`` rejects).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Mapping, Sequence

from llama_cpp.llama_grammar import SchemaConverter

__all__ = ["json_object_grammar", "schema_grammar", "split_forced_prefix", "tool_call_grammar"]

# A JSON string character: anything but a quote, a backslash or a control character,
# or an escape (the stock rule allows raw newlines, which json.loads rejects).
_CHAR_RULE = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'

_TOKEN_RE = re.compile(
    r'"(?:\\.|[^"\\])*"'  # literal
    r"|\[(?:\\.|[^\]\\])*\]"  # character class
    r"|[A-Za-z0-9-]+"  # rule name (or a repetition count)
    r"|\s+"
    r"|."
)


def _literal(text: str) -> str:
    """A GBNF string literal for ``text``."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def _rewrite(body: str, rename: Mapping[str, str]) -> str:
    """Fix the whitespace of one rule body and rename the rules it refers to.

    ``":" space`` becomes ``": "``, ``"," space`` becomes ``", "`` and every other
    reference to the ``space`` rule is dropped: the output then has exactly the
    separators of ``json.dumps(..., separators=(", ", ": "))``.
    """
    toks = [t for t in _TOKEN_RE.findall(body) if not t.isspace()]
    out: list[str] = []
    for i, t in enumerate(toks):
        if t == "space":
            continue
        nxt = toks[i + 1] if i + 1 < len(toks) else ""
        if t == '":"' and nxt == "space":
            out.append('": "')
        elif t == '","' and nxt == "space":
            out.append('", "')
        else:
            out.append(rename.get(t, t))
    return " ".join(out)


# --------------------------------------------------------------------------- integer ranges
_MAX_DIGITS = 16  # the stock integer rule allows up to 16 digits; so do ranges without an upper bound


def _same_length_range(lo: str, hi: str) -> str:
    """GBNF for the decimal strings of one length from ``lo`` to ``hi`` (``lo <= hi``)."""
    n = len(lo)
    if n == 1:
        return f"[{lo}-{hi}]" if lo != hi else _literal(lo)
    if lo[0] == hi[0]:
        return f"{_literal(lo[0])} ( {_same_length_range(lo[1:], hi[1:])} )"
    rest = n - 1
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return f"[{lo[0]}-{hi[0]}]" + " [0-9]" * rest
    parts = [f"{_literal(lo[0])} ( {_same_length_range(lo[1:], '9' * rest)} )"]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]" + " [0-9]" * rest)
    parts.append(f"{_literal(hi[0])} ( {_same_length_range('0' * rest, hi[1:])} )")
    return " | ".join(parts)


def _nonneg_range(lo: int, hi: int) -> str:
    """GBNF for the integers ``lo..hi`` (``0 <= lo <= hi``), without leading zeros."""
    parts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (n - 1) if n > 1 else 0)
        b = min(hi, 10**n - 1)
        if a <= b:
            parts.append(f"( {_same_length_range(str(a), str(b))} )")
    return " | ".join(parts)


def integer_range(lo: int | None, hi: int | None) -> str:
    """GBNF for the integers ``lo..hi`` (either bound may be ``None``: 16 digits at most).

    >>> integer_range(-2, 12)
    '"-" ( ( [1-2] ) ) | ( [0-9] ) | ( "1" ( [0-2] ) )'
    """
    big = 10**_MAX_DIGITS - 1
    lo = -big if lo is None else max(lo, -big)
    hi = big if hi is None else min(hi, big)
    if lo > hi:
        raise ValueError(f"empty integer range: minimum {lo} > maximum {hi}")
    parts = []
    if lo < 0:
        parts.append(f'"-" ( {_nonneg_range(max(1, -hi) if hi < 0 else 1, -lo)} )')
    if hi >= 0:
        parts.append(_nonneg_range(max(lo, 0), hi))
    return " | ".join(parts)


def _int_bounds(schema: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """Inclusive integer bounds of an integer schema (draft 4 boolean and 6+ numeric exclusives)."""
    import math

    lo = hi = None
    if isinstance(schema.get("minimum"), (int, float)):
        lo = math.ceil(schema["minimum"])
        if schema.get("exclusiveMinimum") is True and lo == schema["minimum"]:
            lo += 1
    if isinstance(schema.get("maximum"), (int, float)):
        hi = math.floor(schema["maximum"])
        if schema.get("exclusiveMaximum") is True and hi == schema["maximum"]:
            hi -= 1
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(ex_lo, (int, float)) and not isinstance(ex_lo, bool):
        v = math.floor(ex_lo) + 1
        lo = v if lo is None else max(lo, v)
    if isinstance(ex_hi, (int, float)) and not isinstance(ex_hi, bool):
        v = math.ceil(ex_hi) - 1
        hi = v if hi is None else min(hi, v)
    return lo, hi


class _Converter(SchemaConverter):
    """llama-cpp-python's converter, plus integer ``minimum``/``maximum`` (and exclusive) bounds."""

    def visit(self, schema: Any, name: str) -> str:
        if (
            isinstance(schema, dict)
            and schema.get("type") == "integer"
            and any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))
        ):
            lo, hi = _int_bounds(schema)
            if lo is not None or hi is not None:
                rule_name = name + "-" if name in ("root", "integer", "number") else name or "root"
                return self._add_rule(rule_name, integer_range(lo, hi))
        return super().visit(schema, name)


def _convert(schema: Mapping[str, Any], prefix: str) -> tuple[str, dict[str, str]]:
    """Convert ``schema``; return its root rule name and all its rules, names prefixed."""
    if not isinstance(schema, Mapping):
        raise ValueError(f"a JSON schema must be a dict, got {type(schema).__name__}")
    conv = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        resolved = conv.resolve_refs(copy.deepcopy(dict(schema)), "schema")
        conv.visit(resolved, "")
    except (AssertionError, KeyError, ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"cannot build a grammar from this JSON schema ({exc}): {json.dumps(schema)[:200]}") from exc
    rules: dict[str, str] = dict(conv._rules)  # noqa: SLF001 - the converter has no public accessor
    rules.pop("space", None)
    if "char" in rules:
        rules["char"] = _CHAR_RULE
    rename = {name: f"{prefix}-{name}" if name != "root" else prefix for name in rules}
    return prefix, {rename[n]: _rewrite(b, rename) for n, b in rules.items()}


def _format(rules: Mapping[str, str]) -> str:
    return "\n".join(f"{name} ::= {body}" for name, body in rules.items()) + "\n"


def schema_grammar(schema: Mapping[str, Any]) -> str:
    """A grammar (root rule ``root``) for JSON values matching ``schema``, canonically spaced.

    >>> print(schema_grammar({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
    ...                       "required": ["a"]}))
    root ::= s
    s-a ::= ( [0-9] ) | ( [1-9] [0-9] )
    s-a-kv ::= "\\"a\\"" ": " s-a
    s ::= "{" s-a-kv "}"
    <BLANKLINE>
    """
    root, rules = _convert(schema, "s")
    return _format({"root": root, **rules})


def json_object_grammar() -> str:
    """A grammar for any JSON object (``json_mode``), canonically spaced."""
    return schema_grammar({"type": "object"})


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], *, parallel: bool = False) -> str:
    """A grammar for ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` over ``tools``.

    Args:
        tools: ``{"name": str, "parameters": <JSON schema>}`` for each callable tool.
        parallel: allow several calls in one reply (otherwise exactly one).
    """
    if not tools:
        raise ValueError("tool_call_grammar needs at least one tool")
    rules: dict[str, str] = {}
    calls: list[str] = []
    for i, t in enumerate(tools):
        params = t.get("parameters") or {"type": "object", "properties": {}}
        args_root, sub = _convert(params, f"t{i}")
        rules.update(sub)
        # The common head '{"name": "' sits in ``call`` so that it is forced text
        # even when several tools may be called (see split_forced_prefix).
        name = json.dumps(t["name"], ensure_ascii=False)[1:]
        rules[f"t{i}-call"] = f"{_literal(name + ', ' + chr(34) + 'arguments' + chr(34) + ': ')} {args_root}"
        calls.append(f"t{i}-call")
    seq = 'call ( ", " call )*' if parallel else "call"
    alts = calls[0] if len(calls) == 1 else "( " + " | ".join(calls) + " )"
    top = {
        "root": f"{_literal('{' + chr(34) + 'tool_calls' + chr(34) + ': [')} {seq} {_literal(']}')}",
        "call": f"{_literal('{' + chr(34) + 'name' + chr(34) + ': ' + chr(34))} {alts} {_literal('}')}",
    }
    return _format({**top, **rules})


# --------------------------------------------------------------------------- forced prefix
_ESCAPE_RE = re.compile(r'\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)')
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


def split_forced_prefix(grammar: str) -> tuple[str, str]:
    """Split off the text every output of ``grammar`` starts with.

    Returns ``(prefix, rest)``: ``prefix`` is forced text (it can be put in the
    prompt as the start of the reply and decoded in one batch instead of one
    constrained token at a time) and ``rest`` a grammar for what follows it.
    Trailing whitespace stays in ``rest`` (a prompt ending in a space tokenizes
    badly), and ``rest`` never becomes empty.

    >>> split_forced_prefix(tool_call_grammar([{"name": "f", "parameters": {
    ...     "type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}]))[0]
    '{"tool_calls": [{"name": "f", "arguments": {"x": "'
    """
    rules: dict[str, str] = {}
    for line in grammar.splitlines():
        if line.strip():
            name, body = line.split(" ::= ", 1)
            rules[name.strip()] = body
    tokens = [t for t in _TOKEN_RE.findall(rules["root"]) if not t.isspace()]
    prefix = ""
    for _ in range(1000):  # bounded: a rule cannot start with itself in GBNF, but be safe
        if not tokens or _top_level_alternative(tokens):
            break
        head, nxt = tokens[0], (tokens[1] if len(tokens) > 1 else "")
        if nxt in ("*", "+", "?", "{"):
            break
        if head.startswith('"') and len(tokens) > 1:
            try:
                prefix += _unescape(head)
            except ValueError:
                break
            tokens = tokens[1:]
        elif head in rules:
            body = [t for t in _TOKEN_RE.findall(rules[head]) if not t.isspace()]
            if _top_level_alternative(body):
                break
            tokens = body + tokens[1:]
        else:
            break
    stripped = prefix.rstrip()
    if stripped != prefix:
        tokens = [_literal(prefix[len(stripped):]), *tokens]
        prefix = stripped
    if not prefix:
        return "", grammar
    rules["root"] = " ".join(tokens)
    return prefix, _format(rules)
