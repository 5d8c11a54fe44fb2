"""Bounds on what becomes a grammar: JSON schemas before conversion, GBNF text before llama.cpp parses it.

llama.cpp's GBNF parser and its grammar set-up are recursive C++: a parenthesised group
nested N deep is N stack frames in `parse_alternates`/`parse_sequence`, and a chain of
rules that each start with the next (past optional items) is N frames in
`llama_grammar_detect_left_recursion` and `llama_grammar_advance_stack`. Past a few
thousand frames the process dies with SIGSEGV. The JSON-schema converter writes
`maxLength: N` as N nested optional groups, so before these checks one request with
`{"type": "string", "maxLength": 100000}` killed `agentmem serve`. agentmem's own
schema walks were recursive Python too (a schema nested 400 deep was a 500
`RecursionError`).

Two checks, both iterative, both raising `GrammarLimitError` (a `ConfigError`, so a
400 from the server) that names the field:

* `check_schema` — a JSON schema or tool parameter schema as a client sent it: nesting
  depth, number of nodes, properties per object, `minLength`/`maxLength`,
  `minItems`/`maxItems`, `pattern` length and its `{m,n}` counts.
* `check_grammar` — GBNF text just before `llama_sampler_init_grammar`: size,
  parenthesis nesting, `{m,n}` counts and the depth of leftmost rule chains. Every
  grammar takes this door (schemas, tool calls, a library user's own `grammar=`).

Large string bounds are not refused: `agentmem.tools.grammar` writes them as
chunks (`char{256}` blocks) that llama.cpp parses flat, so `maxLength` up to
`MAX_STRING_LENGTH` works. The limits were measured on llama.cpp 0.3.36's parser
(see docs/reliability.md, "Grammar limits"): groups nested 15,000 deep parse, 20,000
crash; leftmost chains through optional items cost quadratic memory (4,000 deep:
370 MB, 10,000: 1.9 GB) and crash by 50,000. Each limit keeps a wide margin below.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from agentmem.errors import GrammarLimitError

__all__ = [
    "MAX_ARRAY_ITEMS",
    "MAX_GRAMMAR_BYTES",
    "MAX_GRAMMAR_LEFT_DEPTH",
    "MAX_GRAMMAR_NESTING",
    "MAX_GRAMMAR_REPEAT",
    "MAX_OBJECT_PROPERTIES",
    "MAX_PATTERN_LENGTH",
    "MAX_PATTERN_REPEAT",
    "MAX_SCHEMA_DEPTH",
    "MAX_SCHEMA_NODES",
    "MAX_STRING_LENGTH",
    "REPEAT_CHUNK",
    "check_grammar",
    "check_schema",
    "repeat_rules",
]

MAX_SCHEMA_DEPTH = 64
"""Deepest nesting of JSON containers in one schema (about 32 levels of objects in objects:
`{"properties": {"a": {...}}}` is two). OpenAI's structured outputs allow 10 levels."""

MAX_SCHEMA_NODES = 20_000
"""Most keys and list entries in one schema, all levels together (bounds grammar size and conversion time)."""

MAX_OBJECT_PROPERTIES = 256
"""Most `properties` in one object. The converter chains optional properties into rules that each
start with an optional item, which llama.cpp sets up with memory quadratic in the chain."""

MAX_STRING_LENGTH = 100_000
"""Largest `minLength`/`maxLength`. Bounds above 64 compile to `char{256}` chunks, parsed flat."""

MAX_ARRAY_ITEMS = 256
"""Largest `minItems`/`maxItems`. The converter writes `maxItems: N` as N nested optional groups."""

MAX_PATTERN_LENGTH = 1_000
"""Longest `pattern` regex (its groups become nested GBNF groups)."""

MAX_PATTERN_REPEAT = 256
"""Largest count in a `pattern` quantifier `{m,n}` (written as nested optional groups too)."""

MAX_GRAMMAR_BYTES = 1024 * 1024
"""Largest GBNF text handed to llama.cpp, in UTF-8 bytes."""

MAX_GRAMMAR_NESTING = 512
"""Deepest parenthesis nesting in a GBNF rule (llama.cpp crashes near 20,000 on an 8 MiB stack;
a 512 KiB thread stack, macOS's default, holds about 1,000)."""

MAX_GRAMMAR_REPEAT = 2_000
"""Largest count in a GBNF `{m,n}` (llama.cpp's own `MAX_REPETITION_THRESHOLD`; it refuses more)."""

MAX_GRAMMAR_LEFT_DEPTH = 1_000
"""Longest chain of rules that start with the next one, counting through optional items
(`a ::= b? "x"`, `b ::= c? "y"`, ...): llama.cpp's set-up recurses along it."""

_COUNT_LIMITS = {
    "minLength": MAX_STRING_LENGTH,
    "maxLength": MAX_STRING_LENGTH,
    "minItems": MAX_ARRAY_ITEMS,
    "maxItems": MAX_ARRAY_ITEMS,
}
_DATA_KEYS = frozenset({"enum", "const", "default", "examples"})  # values, not schemas: only counted
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")
_QUANT_RE = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def _child(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    text = str(key)
    if _NAME_RE.match(text) and len(text) <= 64:
        return f"{path}.{text}" if path else text
    return f"{path}[{json.dumps(text[:64])}{'...' if len(text) > 64 else ''}]"


def _fail(field: str, message: str) -> GrammarLimitError:
    return GrammarLimitError(f"{field}: {message}", field=field)


def _check_keyword(parent: Mapping[str, Any], key: str, value: Any, field: str) -> None:
    """The limits on one keyword of a schema object (`field` is the keyword's path)."""
    if key in _COUNT_LIMITS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _fail(field, f"must be a non-negative integer, got {json.dumps(value)[:40]}")
        if value > _COUNT_LIMITS[key]:
            raise _fail(field, f"{value} is over the limit of {_COUNT_LIMITS[key]} (agentmem.tools.limits)")
        lo, hi = ("minLength", "maxLength") if key.endswith("Length") else ("minItems", "maxItems")
        if key == hi and isinstance(parent.get(lo), int) and not isinstance(parent.get(lo), bool):
            if parent[lo] > value:
                raise _fail(field, f"{value} is below {lo} ({parent[lo]})")
    elif key == "properties" and isinstance(value, Mapping) and len(value) > MAX_OBJECT_PROPERTIES:
        raise _fail(field, f"{len(value)} properties, over the limit of {MAX_OBJECT_PROPERTIES} per object")
    elif key == "pattern" and isinstance(value, str):
        if len(value) > MAX_PATTERN_LENGTH:
            raise _fail(field, f"a pattern of {len(value)} characters, over the limit of {MAX_PATTERN_LENGTH}")
        for m in _QUANT_RE.finditer(value):
            counts = [int(d[:12]) for d in m.groups() if d]
            if counts and max(counts) > MAX_PATTERN_REPEAT:
                raise _fail(field, f"the quantifier {m.group(0)[:40]} is over the limit of {MAX_PATTERN_REPEAT}")


def check_schema(schema: Any, *, field: str = "schema") -> None:
    """Refuse a JSON schema over the limits above, before anything walks it recursively.

    The walk is iterative, so a schema nested 100,000 deep costs one pass and a clear
    error instead of a `RecursionError` (or a crash in the C parser behind the converter).

    Args:
        schema: the schema as parsed JSON (any value: only containers are walked).
        field: where it came from, the start of every path in an error
            (`response_format.json_schema.schema`, `tools[0].function.parameters`).

    Raises:
        GrammarLimitError: names the path of the first value over a limit.

    >>> check_schema({"type": "string", "maxLength": 10**6}, field="response_format.json_schema.schema")
    Traceback (most recent call last):
    ...
    agentmem.errors.GrammarLimitError: response_format.json_schema.schema.maxLength: 1000000 is over the limit of 100000 (agentmem.tools.limits)
    """
    nodes = 0
    stack: list[tuple[Any, str, int, bool]] = [(schema, field, 1, False)]
    while stack:
        node, path, depth, data = stack.pop()
        if not isinstance(node, (Mapping, list)):
            continue
        if depth > MAX_SCHEMA_DEPTH:
            raise _fail(path, f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        nodes += len(node)
        if nodes > MAX_SCHEMA_NODES:
            raise _fail(field, f"the schema has more than {MAX_SCHEMA_NODES} keys and list entries")
        items = node.items() if isinstance(node, Mapping) else enumerate(node)
        for key, value in items:
            sub = _child(path, key)
            if not data and isinstance(node, Mapping):
                _check_keyword(node, key, value, sub)
            stack.append((value, sub, depth + 1, data or (isinstance(node, Mapping) and key in _DATA_KEYS)))


# --------------------------------------------------------------------------- GBNF text
_GBNF_TOKEN_RE = re.compile(
    r'(?P<lit>"(?:\\.|[^"\\])*")'
    r"|(?P<cls>\[(?:\\.|[^\]\\])*\])"
    r"|(?P<rep>\{[^}]*\})"
    r"|(?P<tok>!?<[^>]*>)"
    r"|(?P<def>::=)"
    r"|(?P<name>[A-Za-z0-9-]+)"
    r"|(?P<comment>#[^\n]*)"
    r"|(?P<nl>\n)"
    r"|(?P<ws>[ \t\r]+)"
    r"|(?P<op>.)",
    re.S,
)
_Seq = list  # one alternative: a list of elements, each (kind, target, min, max) with kind 'ref' or 'term'


def _repeat_bounds(text: str, field: str) -> tuple[int, int | None]:
    parts = [p.strip() for p in text[1:-1].split(",")]
    if not 1 <= len(parts) <= 2 or not parts[0].isdigit() or (len(parts) == 2 and parts[1] and not parts[1].isdigit()):
        return 0, 0  # llama.cpp refuses it with a parse error; nothing to bound
    if any(len(p) > 6 or (p and int(p) > MAX_GRAMMAR_REPEAT) for p in parts):
        raise _fail(field, f"the repetition {text[:40]} is over the limit of {MAX_GRAMMAR_REPEAT}")
    lo = int(parts[0])
    hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1] else None)
    return lo, hi


class _Rules:
    """A GBNF text as rules of alternatives (groups become anonymous rules), parsed iteratively."""

    def __init__(self, text: str, field: str) -> None:
        self.field = field
        self.alts: dict[str, list[_Seq]] = {}
        self._groups = 0
        self._parse(text)

    def _parse(self, text: str) -> None:
        toks = [(m.lastgroup, m.group()) for m in _GBNF_TOKEN_RE.finditer(text) if m.lastgroup not in ("ws", "comment")]
        # a rule starts where a name is followed by '::=' (newlines between rules carry no meaning otherwise)
        stack: list[tuple[str, list[_Seq]]] = []
        depth = 0
        i = 0
        while i < len(toks):
            kind, t = toks[i]
            if kind == "name" and i + 1 < len(toks) and toks[i + 1][0] == "def" and depth == 0:
                stack = [(t, [[]])]
                self.alts[t] = stack[0][1]
                i += 2
                continue
            if not stack or kind == "nl":
                i += 1
                continue
            seq = stack[-1][1][-1]
            if kind == "op" and t == "(":
                depth += 1
                if depth > MAX_GRAMMAR_NESTING:
                    raise _fail(self.field, f"groups nest deeper than {MAX_GRAMMAR_NESTING} levels")
                self._groups += 1
                name = f"({self._groups}"
                seq.append(("ref", name, 1, 1))
                stack.append((name, [[]]))
                self.alts[name] = stack[-1][1]
            elif kind == "op" and t == ")":
                if depth > 0:
                    depth -= 1
                    stack.pop()
            elif kind == "op" and t == "|":
                stack[-1][1].append([])
            elif (kind == "op" and t in ("*", "+", "?")) or kind == "rep":
                if seq:
                    lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(t) or _repeat_bounds(t, self.field)
                    k, target, _, _ = seq[-1]
                    seq[-1] = (k, target, lo, hi)
            elif kind == "name":
                seq.append(("ref", t, 1, 1))
            elif kind == "lit":
                seq.append(("term", "", 1, 1) if t != '""' else ("term", "", 0, 0))
            else:
                seq.append(("term", "", 1, 1))
            i += 1

    def nullable(self) -> set[str]:
        """The rules that can match the empty string (a fixpoint, iterative)."""
        # worklist: each alternative waits for the rules it references; linear in the grammar's size
        waiting: list[int] = []
        owner: list[str] = []
        users: dict[str, list[int]] = {}
        ready: list[str] = []
        for name, alts in self.alts.items():
            for seq in alts:
                pending = [e[1] for e in seq if not (e[2] == 0 or e[3] == 0)]
                if any(e[0] == "term" for e in seq if not (e[2] == 0 or e[3] == 0)):
                    continue  # a required terminal: never empty
                if not pending:
                    ready.append(name)
                    continue
                for target in pending:
                    users.setdefault(target, []).append(len(waiting))
                waiting.append(len(pending))
                owner.append(name)
        null: set[str] = set()
        while ready:
            name = ready.pop()
            if name in null:
                continue
            null.add(name)
            for alt in users.get(name, ()):
                waiting[alt] -= 1
                if waiting[alt] == 0:
                    ready.append(owner[alt])
        return null

    @staticmethod
    def _elem_null(e: tuple[str, str, int, int | None], null: set[str]) -> bool:
        kind, target, lo, hi = e
        return lo == 0 or hi == 0 or (kind == "ref" and target in null)

    def left_depth(self) -> int:
        """Longest chain of leftmost rule references (through nullable items), cycles cut."""
        null = self.nullable()
        heads: dict[str, list[tuple[str, int]]] = {}
        for name, alts in self.alts.items():
            out = []
            for seq in alts:
                for e in seq:
                    kind, target, lo, hi = e
                    if kind == "ref" and target in self.alts:
                        # S{m,n} of a nullable S is a chain of n rules each starting with S
                        extra = (hi if hi is not None else 1) if target in null else 1
                        out.append((target, extra))
                    if not self._elem_null(e, null):
                        break
            heads[name] = out
        best: dict[str, int] = {}
        for root in heads:
            if root in best:
                continue
            walk = [(root, iter(heads[root]))]
            on_path = {root}
            while walk:
                name, it = walk[-1]
                nxt = next(it, None)
                if nxt is None:
                    walk.pop()
                    on_path.discard(name)
                    best[name] = max((best.get(t, 0) + w for t, w in heads[name] if t not in on_path), default=0)
                elif nxt[0] not in best and nxt[0] not in on_path:
                    walk.append((nxt[0], iter(heads[nxt[0]])))
                    on_path.add(nxt[0])
        return max(best.values(), default=0)


def check_grammar(grammar: str, *, field: str = "grammar") -> None:
    """Refuse GBNF text llama.cpp's recursive parser or set-up could not take safely.

    Checks, without recursion: the UTF-8 size, the nesting of parentheses, the counts
    of `{m,n}` and the longest leftmost rule chain (see the `MAX_GRAMMAR_*` limits).
    Syntax errors are left to llama.cpp, which reports them without crashing.

    Raises:
        GrammarLimitError: the first limit exceeded, naming `field`.

    >>> check_grammar('root ::= "a" ( "b" )?')
    >>> check_grammar("root ::= " + "( " * 600 + '"a"' + " )" * 600)
    Traceback (most recent call last):
    ...
    agentmem.errors.GrammarLimitError: grammar: groups nest deeper than 512 levels
    """
    size = len(grammar.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAMMAR_BYTES:
        raise _fail(field, f"a grammar of {size} bytes, over the limit of {MAX_GRAMMAR_BYTES}")
    depth = _Rules(grammar, field).left_depth()
    if depth > MAX_GRAMMAR_LEFT_DEPTH:
        raise _fail(field, f"a chain of {depth} rules that each start with the next, over the limit of "
                           f"{MAX_GRAMMAR_LEFT_DEPTH}")


# --------------------------------------------------------------------------- flat repetition
REPEAT_CHUNK = 256
"""Block size of a large repetition: `x{0,N}` is written with `x{256}` blocks, never nesting."""


def repeat_rules(item: str, lo: int, hi: int | None) -> tuple[str, dict[str, str]]:
    """GBNF for `lo..hi` repetitions of the rule `item` that llama.cpp parses flat.

    The converter writes `x{0,N}` as `( x ( x ( ... )? )? )?`, N groups deep, and
    llama.cpp's `{m,n}` refuses counts over 2,000. Here `N = q*K + r` (`K = REPEAT_CHUNK`)
    becomes `x-K{0,q-1} x{0,K-1} | x-K{q} x{0,r}` with `x-K ::= x{K}`: every length
    from 0 to N, each count at most `max(K, q)`, nothing nested.

    Returns:
        `(body, rules)`: the rule body, and the helper rules it references (names start with `item`).

    >>> repeat_rules("c", 3, 700)[0]
    'c{3} ( c-256{0,1} c{0,255} | c-256{2} c{0,185} )'
    """
    k = REPEAT_CHUNK
    rules = {f"{item}-{k}": f"{item}{{{k}}}"}
    head = " ".join(p for p in (f"{item}-{k}{{{lo // k}}}" if lo >= k else "", f"{item}{{{lo % k}}}" if lo % k else "") if p)
    if hi is None:
        return f"{head} {item}*".strip(), rules
    q, r = divmod(hi - lo, k)
    tail_r = f" {item}{{0,{r}}}" if r else ""
    if q == 0:
        tail = tail_r.strip()
    else:
        first = f"{item}-{k}{{0,{q - 1}}} " if q > 1 else ""
        tail = f"( {first}{item}{{0,{k - 1}}} | {item}-{k}{{{q}}}{tail_r} )"
    return f"{head} {tail}".strip(), rules
