"""Golden files for the tool-call protocol both integrations show the model.

Each case renders, through the integration's own call preparation, the system prompt
the model sees, the forced start of its reply (if any) and the GBNF grammar its reply
is decoded under, and compares that text with a file in ``tests/unit/golden/``. A change
to a prompt or a grammar therefore shows up as a diff of those files, in its own commit.

Every grammar is also checked to accept the tool-call JSON (or JSON document) the case
lists, with a small GBNF matcher written here, so a rewrite of the grammar builder keeps
admitting the same replies.

Regenerate the files after an intended change with
``AGENTMEM_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_tool_protocol_golden.py``.
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("autogen_core")

from autogen_core.models import SystemMessage as AgSystem  # noqa: E402
from autogen_core.models import UserMessage as AgUser  # noqa: E402
from langchain_core.messages import HumanMessage, SystemMessage  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem_autogen import AgentMemChatCompletionClient  # noqa: E402
from agentmem_langchain import ChatAgentMem  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("AGENTMEM_UPDATE_GOLDEN") == "1"

# --------------------------------------------------------------------------- tools
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {
        "type": "object",
        "title": "get_weather",
        "properties": {"city": {"type": "string", "title": "City"}},
        "required": ["city"],
    },
}
ADD = {
    "name": "add",
    "description": "Add two small integers.",
    "parameters": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 99},
            "b": {"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 10},
        },
        "required": ["a", "b"],
    },
}
LEVEL = {
    "name": "set_level",
    "description": "Set the level, with an optional note.",
    "parameters": {
        "type": "object",
        "properties": {"level": {"enum": ["low", "high"]}, "note": {"type": "string"}},
        "required": ["level"],
    },
}
PING = {"name": "ping", "description": "Check the connection.", "parameters": {"type": "object", "properties": {}}}


class Pet(BaseModel):
    """A pet."""

    kind: str = Field(description="species")
    legs: int = Field(ge=0, le=8)


class Owner(BaseModel):
    """Someone with pets."""

    name: str
    pets: list[Pet]


def call(name: str, **args: Any) -> str:
    """A reply as agentmem renders a tool call."""
    return json.dumps({"tool_calls": [{"name": name, "arguments": args}]}, ensure_ascii=False)


WEATHER_CALL = call("get_weather", city="Paris")
ADD_CALL = call("add", a=42, b=-9)
LEVEL_CALL = call("set_level", level="high", note='a "quoted"\nline')
PING_CALL = call("ping")
TWO_CALLS = json.dumps(
    {"tool_calls": [{"name": "ping", "arguments": {}}, {"name": "add", "arguments": {"a": 0, "b": 9}}]}
)
PET = json.dumps({"kind": "cat", "legs": 4})
OWNER = json.dumps({"name": "Ann", "pets": [{"kind": "dog", "legs": 3}]})
ANY_OBJECT = json.dumps({"k": [1, -2.5e3, None, True, {"x": "y"}]})

# (case name, tools, tool_choice, parallel, response format / json_output, replies the grammar must admit,
#  replies it must reject)
CASES: list[tuple[str, list[dict[str, Any]], Any, bool, Any, list[str], list[str]]] = [
    ("auto-one", [WEATHER], "auto", False, None, [WEATHER_CALL], [call("get_weather")]),
    ("required-all", [WEATHER, ADD, LEVEL, PING], "required", False, None,
     [WEATHER_CALL, ADD_CALL, LEVEL_CALL, PING_CALL],
     [TWO_CALLS, call("set_level", level="mid"), call("add", a=100, b=0), call("add", a=1, b=10)]),
    ("named-add", [WEATHER, ADD], "add", False, None, [ADD_CALL], [WEATHER_CALL]),
    ("required-parallel", [ADD, PING], "required", True, None, [PING_CALL, TWO_CALLS], [call("ping", x=1)]),
    ("json-object", [], None, False, "object", [ANY_OBJECT, "{}"], ["[]"]),
    ("json-schema", [], None, False, Owner, [OWNER], [PET]),
]


# --------------------------------------------------------------------------- a small GBNF matcher
_TOKEN = re.compile(
    r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[A-Za-z][A-Za-z0-9-]*|\{\d+(?:,\d*)?\}|[()|*+?]|\s+'
)
_ESC = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)")
_SIMPLE = {"n": "\n", "r": "\r", "t": "\t"}


def _unescape(lit: str) -> str:
    def sub(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xuU" and len(e) > 1:
            return chr(int(e[1:], 16))
        return _SIMPLE.get(e, e)

    return _ESC.sub(sub, lit[1:-1])


def _parse_body(tokens: list[str]) -> Any:
    """GBNF body tokens → ("alt", [("seq", [(atom, lo, hi)])]); atoms: ("lit", s) ("cls", re) ("ref", n) group."""
    pos = 0

    def alt() -> Any:
        nonlocal pos
        seqs = [seq()]
        while pos < len(tokens) and tokens[pos] == "|":
            pos += 1
            seqs.append(seq())
        return ("alt", seqs)

    def seq() -> Any:
        nonlocal pos
        items = []
        while pos < len(tokens) and tokens[pos] not in ("|", ")"):
            t = tokens[pos]
            pos += 1
            if t == "(":
                atom = alt()
                assert tokens[pos] == ")", tokens[pos:]
                pos += 1
            elif t.startswith('"'):
                atom = ("lit", _unescape(t))
            elif t.startswith("["):
                atom = ("cls", re.compile(t, re.S))
            else:
                atom = ("ref", t)
            lo, hi = 1, 1
            if pos < len(tokens) and (tokens[pos] in "*+?" or tokens[pos].startswith("{")):
                q = tokens[pos]
                pos += 1
                if q == "*":
                    lo, hi = 0, None
                elif q == "+":
                    lo, hi = 1, None
                elif q == "?":
                    lo, hi = 0, 1
                else:
                    a, _, b = q[1:-1].partition(",")
                    lo = int(a)
                    hi = lo if not _ else (int(b) if b else None)
            items.append((atom, lo, hi))
        return ("seq", items)

    node = alt()
    assert pos == len(tokens), f"unparsed GBNF tokens {tokens[pos:]}"
    return node


def gbnf_accepts(grammar: str, text: str) -> bool:
    """Whether ``text`` is a whole sentence of ``grammar`` (rule ``root``)."""
    rules: dict[str, Any] = {}
    for line in grammar.splitlines():
        if not line.strip():
            continue
        name, sep, body = line.partition("::=")
        assert sep, f"not a rule: {line!r}"
        found = list(_TOKEN.finditer(body))
        assert sum(len(m.group()) for m in found) == len(body), f"untokenizable GBNF body: {body!r}"
        tokens = [m.group() for m in found if not m.group().isspace()]
        rules[name.strip()] = _parse_body(tokens)

    @lru_cache(maxsize=None)
    def rule(name: str, i: int) -> frozenset[int]:
        return frozenset(match(rules[name], i))

    def match(node: Any, i: int) -> set[int]:
        kind = node[0]
        if kind == "alt":
            return set().union(*(match(s, i) for s in node[1]))
        if kind == "seq":
            ends = {i}
            for atom, lo, hi in node[1]:
                ends = repeat(atom, lo, hi, ends)
                if not ends:
                    break
            return ends
        if kind == "lit":
            return {i + len(node[1])} if text.startswith(node[1], i) else set()
        if kind == "cls":
            return {i + 1} if i < len(text) and node[1].fullmatch(text[i]) else set()
        return set(rule(node[1], i))

    def repeat(atom: Any, lo: int, hi: int | None, starts: set[int]) -> set[int]:
        out: set[int] = set(starts) if lo == 0 else set()
        frontier, n, seen = set(starts), 0, set()
        while frontier and (hi is None or n < hi):
            frontier = set().union(*(match(atom, i) for i in frontier)) - (seen if hi is None else set())
            n += 1
            seen |= frontier
            if n >= lo:
                out |= frontier
        return out

    return len(text) in rule("root", 0)


def test_the_matcher_itself() -> None:
    g = 'root ::= "a" ( b | "c" ){1,2} [0-9]*\nb ::= "\\"" [^"\\\\\\x00-\\x1F]+ "\\""\n'
    assert gbnf_accepts(g, 'a"x"c12') and gbnf_accepts(g, "ac")
    assert not gbnf_accepts(g, "accc") and not gbnf_accepts(g, 'a""')


# --------------------------------------------------------------------------- rendering the cases
def _lc_render(tools: list[dict[str, Any]], choice: Any, parallel: bool, fmt: Any) -> list[tuple[str, str, str]]:
    """(system prompt, forced prefix, grammar) of each generation the call may run."""
    model = ChatAgentMem(agent_id="golden")
    msgs = [SystemMessage("You are terse."), HumanMessage("Go.")]
    if tools:
        bound = model.bind_tools(
            [{"type": "function", "function": t} for t in tools], tool_choice=choice, parallel_tool_calls=parallel
        )
    else:
        method = "json_mode" if fmt == "object" else "json_schema"
        structured = model.with_structured_output(None if fmt == "object" else fmt, method=method)  # type: ignore[arg-type]
        bound = structured.first  # type: ignore[attr-defined]
    kwargs = {k: v for k, v in bound.kwargs.items() if k != "ls_structured_output_format"}
    prepared = model._prepare(msgs, None, kwargs)
    out = []
    for c in ([prepared] if prepared.forced is None else [prepared, prepared.forced()]):
        out.append((c.messages[0]["content"], c.prefix, c.sampling.get("grammar") or ""))
    return out


def _ag_render(
    pool: MemoryPool, tools: list[dict[str, Any]], choice: Any, parallel: bool, fmt: Any
) -> list[tuple[str, str, str]]:
    """(system prompt, forced prefix, grammar) of each generation the call may run."""
    client = AgentMemChatCompletionClient(pool, agent_id="golden", parallel_tool_calls=parallel)
    msgs = [AgSystem(content="You are terse."), AgUser(content="Go.", source="user")]
    if isinstance(choice, str) and choice not in ("auto", "required", "none"):
        from autogen_core.tools import FunctionTool

        def named() -> None:
            """stand-in: only the name matters"""

        tool_choice: Any = FunctionTool(named, description="", name=choice)
    else:
        tool_choice = choice or "auto"
    json_output = None if fmt is None else (True if fmt == "object" else fmt)
    plan = client._plan(pool, "golden", client._sampling({}), msgs, tools, tool_choice, json_output)
    system = plan.messages[0]["content"]
    out = [(system, plan.prefix or "", plan.grammar or "")]
    if plan.forced is not None:  # auto mode: the redo under the grammar
        redo = plan.forced()
        out.append((system, redo.prefix, redo.grammar or ""))
    return out


def _text(renders: list[tuple[str, str, str]]) -> str:
    parts = []
    for i, (system, prefix, grammar) in enumerate(renders):
        title = "first generation" if i == 0 else "redo under the grammar"
        parts.append(f"=== {title}: system prompt\n{system}\n=== forced prefix\n{prefix}\n=== grammar\n{grammar}")
    return "\n".join(parts).rstrip("\n") + "\n"


@pytest.fixture(scope="module")
def pool(tiny_model_path: Any) -> Any:
    with MemoryPool(str(tiny_model_path), n_ctx=512, resident_agents=1, chat_format="chatml", n_threads=1) as p:
        yield p


@pytest.mark.parametrize("framework", ["langchain", "autogen"])
@pytest.mark.parametrize(("case", "tools", "choice", "parallel", "fmt", "good", "bad"), CASES, ids=[c[0] for c in CASES])
def test_prompt_and_grammar_match_the_golden_file(
    pool: MemoryPool,
    framework: str,
    case: str,
    tools: list[dict[str, Any]],
    choice: Any,
    parallel: bool,
    fmt: Any,
    good: list[str],
    bad: list[str],
) -> None:
    render: Callable[..., list[tuple[str, str, str]]] = (
        _lc_render if framework == "langchain" else lambda *a: _ag_render(pool, *a)
    )
    renders = render(tools, choice, parallel, fmt)
    path = GOLDEN / f"{framework}-{case}.txt"
    text = _text(renders)
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.read_text(encoding="utf-8") == text, f"{path.name} differs (AGENTMEM_UPDATE_GOLDEN=1 if intended)"

    for _system, prefix, grammar in renders:
        if not grammar:
            continue  # auto mode's free first generation
        for reply in good:
            assert reply.startswith(prefix), (reply, prefix)
            assert gbnf_accepts(grammar, reply[len(prefix):]), f"{framework}/{case} grammar rejects {reply!r}"
        for reply in bad:
            rest = reply[len(prefix):] if reply.startswith(prefix) else None
            assert rest is None or not gbnf_accepts(grammar, rest), f"{framework}/{case} grammar admits {reply!r}"
