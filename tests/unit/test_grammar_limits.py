"""Grammars are bounded before llama.cpp sees them (#23 findings 1 and 7, the recursion half).

A JSON schema with a large `maxLength`/`maxItems` used to become GBNF nested one group
per character, which overflowed the stack of llama.cpp's recursive parser (the server
died with SIGSEGV); a schema or tool parameters nested a few hundred deep were a 500
`RecursionError`. Now every schema is checked iteratively (`agentmem.tools.limits`),
long strings compile to flat `char{256}` chunks, and every GBNF text is checked once
more before `llama_sampler_init_grammar`.

Everything that crashed runs in a child process with a timeout: `agentmem serve` in a
subprocess for the HTTP cases, `tests.fixtures.native_grammar` for llama.cpp's parser.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from agentmem.engine.sampling import SamplingParams
from agentmem.errors import AgentMemError, ConfigError, GrammarLimitError
from agentmem.tools import schema_grammar, tool_call_grammar
from agentmem.tools import limits as L
from agentmem.tools.limits import check_grammar, check_schema, repeat_rules
from tests.fixtures.native_grammar import native_verdict

REPO = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "hi"}]


def nested(levels: int) -> dict[str, Any]:
    """An object schema `levels` objects deep (two JSON levels each)."""
    s: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        s = {"type": "object", "properties": {"a": s}, "required": ["a"]}
    return s


def long_string(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {"q": {"type": "string", "maxLength": n}}, "required": ["q"]}


# --------------------------------------------------------------------------- the server, in a child process
@pytest.fixture(scope="module")
def serve(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """`agentmem serve` on the tiny model in a subprocess; `serve()` gives a live one (restarted if it died)."""
    from tests.fixtures.serving import free_port, wait_healthy

    state: dict[str, Any] = {}

    def live() -> Any:
        proc = state.get("proc")
        if proc is None or proc.poll() is not None:
            port = free_port()
            cmd = [sys.executable, "-m", "agentmem.cli", "serve", "--model", str(tiny_model_path), "--port", str(port),
                   "--threads", "1", "--n-ctx", "2048", "--resident", "2", "--model-name", "tiny",
                   "--log-level", "warning"]
            archive = tmp_path_factory.mktemp("grammar-serve") / "a.db"
            proc = subprocess.Popen([*cmd, "--archive", str(archive)], cwd=REPO, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
            state.update(proc=proc, base=f"http://127.0.0.1:{port}")
            wait_healthy(state["base"], proc=proc)
        return state

    yield live
    proc = state.get("proc")
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def post(serve: Any, **body: Any) -> tuple[int, dict[str, Any], bool]:
    """`(status, body, alive)`: the response (599 when the connection died) and whether the server lives after it."""
    import httpx

    s = serve()
    try:
        r = httpx.post(f"{s['base']}/v1/chat/completions", json={"messages": HI, "max_tokens": 3, "user": "fuzz", **body}, timeout=60)
        status, data = r.status_code, r.json()
    except httpx.HTTPError:
        status, data = 599, {}
    try:
        alive = s["proc"].wait(timeout=0.5) is None
    except subprocess.TimeoutExpired:
        alive = httpx.get(f"{s['base']}/health", timeout=10).status_code == 200
    return status, data, alive


def json_schema(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def required_tool(params: Any) -> dict[str, Any]:
    return {"tools": [{"type": "function", "function": {"name": "get", "parameters": params}}],
            "tool_choice": "required"}


def test_finding1_large_max_length_in_response_format_keeps_the_server_alive(serve: Any) -> None:
    """#23 finding 1: `maxLength: 100000` in `response_format` killed the server (SIGSEGV); now it compiles flat."""
    status, body, alive = post(serve, response_format=json_schema({"type": "string", "maxLength": 100_000}))
    assert alive, "the server died"
    assert status == 200, body
    status, body, alive = post(serve, response_format=json_schema({"type": "string", "maxLength": 10**7}))
    assert alive and status == 400, body
    assert "response_format.json_schema.schema.maxLength" in body["error"]["message"]


def test_finding1_large_max_items_in_response_format_is_a_400(serve: Any) -> None:
    """#23 finding 1: `maxItems: 30000` in `response_format` killed the server; now a 400 naming the field."""
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 30_000}
    status, body, alive = post(serve, response_format=json_schema(schema))
    assert alive, "the server died"
    assert status == 400, body
    assert body["error"]["message"].startswith("response_format.json_schema.schema.maxItems: 30000 is over the limit")
    assert body["error"]["param"] == "response_format.json_schema.schema.maxItems"


def test_finding1_large_bounds_in_a_required_tool_keep_the_server_alive(serve: Any) -> None:
    """#23 finding 1: the same through a tool parameter with `tool_choice: "required"`."""
    status, body, alive = post(serve, **required_tool(long_string(100_000)))
    assert alive, "the server died"
    assert status == 200, body
    params = {"type": "object", "properties": {"q": {"type": "array", "maxItems": 30_000}}}
    status, body, alive = post(serve, **required_tool(params))
    assert alive and status == 400, body
    assert "tools[0].function.parameters.properties.q.maxItems" in body["error"]["message"]


def test_finding7_deep_tool_parameters_and_schemas_are_a_400(serve: Any) -> None:
    """#23 finding 7: tool parameters nested 300 deep / a schema nested 400 deep were a 500 RecursionError."""
    status, body, alive = post(serve, **required_tool(nested(300)))
    assert alive and status == 400, body
    assert body["error"]["message"].startswith("tools[0].function.parameters.properties.a")
    assert "nests deeper than 64 levels" in body["error"]["message"]
    status, body, alive = post(serve, response_format=json_schema(nested(400)))
    assert alive and status == 400, body
    assert "response_format.json_schema.schema.properties.a" in body["error"]["message"]
    status, body, alive = post(serve, **required_tool(nested(300)) | {"tool_choice": "auto"})
    assert alive and status == 400, body  # shown in the prompt only: still checked


# --------------------------------------------------------------------------- the library
def test_finding1_long_string_grammar_is_flat_and_llama_cpp_parses_it(tiny_model_path: Path) -> None:
    """#23 finding 1 (library): `schema_grammar` of `maxLength: 100000` was 100,000 nested groups (SIGSEGV)."""
    g = schema_grammar({"type": "string", "maxLength": 100_000})
    assert len(g) < 1000 and "agentmem-char-256" in g, g[:300]
    assert native_verdict(tiny_model_path, g) == "ok"
    calls = tool_call_grammar([{"name": "get", "parameters": long_string(20_000)}])
    assert native_verdict(tiny_model_path, calls) == "ok"


def test_finding1_pool_refuses_a_grammar_that_would_crash_the_parser(tiny_model_path: Path) -> None:
    """#23 finding 1 (pool path): a raw `grammar=` nested 20,000 deep crashed `MemoryPool.chat`; now refused first."""
    code = (
        "import sys\n"
        "from agentmem import MemoryPool\n"
        "from agentmem.errors import AgentMemError\n"
        "g = 'root ::= ' + '( ' * 20000 + '\"a\"' + ' )' * 20000\n"
        f"pool = MemoryPool({str(tiny_model_path)!r}, n_ctx=512, n_threads=1)\n"
        "try:\n"
        "    pool.chat('a', [{'role': 'user', 'content': 'hi'}], max_tokens=2, grammar=g).text\n"
        "except AgentMemError as exc:\n"
        "    print('refused', type(exc).__name__, getattr(exc, 'field', None), exc)\n"
        "pool.close()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, f"rc={p.returncode} {p.stderr[-2000:]}"
    assert p.stdout.startswith("refused GrammarLimitError grammar grammar: groups nest deeper than 512"), p.stdout


def test_finding1_large_counts_are_refused_naming_the_field() -> None:
    """#23 finding 1 (library): counts over the limits are a `GrammarLimitError` naming the keyword's path."""
    with pytest.raises(GrammarLimitError, match=r"^schema\.maxItems: 30000 is over the limit of 256") as e:
        schema_grammar({"type": "array", "maxItems": 30_000})
    assert e.value.field == "schema.maxItems" and isinstance(e.value, ConfigError)
    with pytest.raises(GrammarLimitError, match=r"^tools\[0\]\.parameters\.properties\.q\.maxLength"):
        tool_call_grammar([{"name": "get", "parameters": long_string(L.MAX_STRING_LENGTH + 1)}])
    with pytest.raises(GrammarLimitError, match=r"pattern: the quantifier \{0,5000\}"):
        schema_grammar({"type": "string", "pattern": "^a{0,5000}$"})
    with pytest.raises(GrammarLimitError, match="must be a non-negative integer"):
        schema_grammar({"type": "string", "maxLength": -1})
    with pytest.raises(GrammarLimitError, match="is below minLength"):
        schema_grammar({"type": "string", "minLength": 10, "maxLength": 3})


def test_finding7_deep_schemas_are_refused_without_recursion() -> None:
    """#23 finding 7 (library): deep tool parameters were a RecursionError out of `clean_schema`."""
    with pytest.raises(GrammarLimitError, match=r"^tools\[0\]\.parameters(\.properties\.a)+: the schema nests deeper"):
        tool_call_grammar([{"name": "get", "parameters": nested(300)}])
    deep: Any = "x"
    for _ in range(100_000):  # far past Python's recursion limit: one iterative pass
        deep = [deep]
    with pytest.raises(GrammarLimitError, match="nests deeper than 64"):
        check_schema({"enum": deep})
    schema_grammar(nested(30))  # 60 JSON levels: inside the limit


def test_pool_chat_with_deep_tools_is_a_typed_error(tiny_model_path: Path) -> None:
    """#23 finding 7 (pool path): `MemoryPool.chat(tools=...)` with deep parameters is a typed error."""
    from agentmem import MemoryPool

    with MemoryPool(str(tiny_model_path), n_ctx=512, n_threads=1) as pool:
        with pytest.raises(GrammarLimitError):
            pool.chat("a", HI, max_tokens=1, tools=[{"name": "get", "parameters": nested(300)}]).text


def _as_regex(body: str) -> str:
    """A `repeat_rules("c", ...)` body as a Python regex (`c-256` is `c{256}`)."""
    return body.replace("c-256", "(?:c{256})").replace("( ", "(?: ").replace(" ", "")


@pytest.mark.parametrize("lo,hi", [(0, 1), (0, 255), (0, 256), (0, 257), (3, 700), (256, 512), (0, 1023),
                                   (100, None), (513, None), (1000, 1000), (0, 5000)])
def test_repeat_rules_match_exactly_lo_to_hi(lo: int, hi: int | None) -> None:
    """The flat form of `x{lo,hi}` accepts every count from `lo` to `hi` and nothing else, no count over 2,000."""
    body, rules = repeat_rules("c", lo, hi)
    assert rules == {"c-256": "c{256}"}
    pattern = re.compile(_as_regex(body))
    top = (hi if hi is not None else lo + 600) + 300
    got = [n for n in range(top) if pattern.fullmatch("c" * n)]
    assert got == list(range(lo, (hi if hi is not None else top - 1) + 1))
    assert max(int(m) for m in re.findall(r"\{(\d+)", body)) < L.MAX_GRAMMAR_REPEAT


def test_long_strings_constrain_generation_as_the_nested_form_did(tiny_model_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunked form is the same language as the converter's nested one: the same sampled reply, token for token."""
    from agentmem import MemoryPool
    from agentmem.tools import grammar as G

    schema = {"type": "string", "minLength": 257, "maxLength": 600}
    flat = schema_grammar(schema)
    monkeypatch.setattr(G, "_LONG_STRING", 10**9)  # the converter's own form: 343 nested groups (it parses)
    nested_form = schema_grammar(schema)
    assert "agentmem-char-256" in flat and "agentmem-char" not in nested_form
    with MemoryPool(str(tiny_model_path), n_ctx=2048, n_threads=1) as pool:
        texts = [pool.chat(name, HI, max_tokens=1200, temperature=1.0, seed=3, grammar=g).text
                 for name, g in (("flat", flat), ("nested", nested_form))]
    assert texts[0] == texts[1]
    value = json.loads(texts[0])
    assert isinstance(value, str) and len(value) >= 257


def test_check_grammar_limits() -> None:
    """Each GBNF limit, with the text llama.cpp would have crashed (or stalled) on."""
    check_grammar(schema_grammar(long_string(100_000)))
    with pytest.raises(GrammarLimitError, match="groups nest deeper than 512"):
        check_grammar("root ::= " + "( " * 20_000 + '"a"' + " )?" * 20_000)
    with pytest.raises(GrammarLimitError, match=r"the repetition \{0,5000\}"):
        check_grammar('root ::= "a"{0,5000}')
    chain = ["root ::= r0", *(f'r{i} ::= r{i + 1}? "b"' for i in range(3000)), 'r3000 ::= "a"']
    with pytest.raises(GrammarLimitError, match="a chain of 3001 rules"):
        check_grammar("\n".join(chain))
    with pytest.raises(GrammarLimitError, match="over the limit of 1048576"):
        check_grammar('root ::= "' + "a" * L.MAX_GRAMMAR_BYTES + '"')
    with pytest.raises(GrammarLimitError):
        SamplingParams(grammar='root ::= ("a"?){0,1500}')  # a 1,500-long nullable chain
    check_grammar('root ::= x x\nx ::= "a" | "b"  # comment\n')


def test_errors_are_agentmem_errors() -> None:
    assert issubclass(GrammarLimitError, ConfigError) and issubclass(GrammarLimitError, AgentMemError)


def test_fuzz_findings_escaped_constants_separators_and_empty_enums(tiny_model_path: Path) -> None:
    """Found by tests/unit/test_grammar_fuzz.py: constants with `\\` or `"` became GBNF llama.cpp refused (or read
    wrongly), a tool name with U+2028 split a rule in two, an empty enum gave an empty rule, junk parameters a TypeError."""
    from agentmem import MemoryPool

    g = schema_grammar({"enum": ["a\\b", 'x"y', {"k\\": None}]})
    assert native_verdict(tiny_model_path, g) == "ok"
    with MemoryPool(str(tiny_model_path), n_ctx=512, n_threads=1) as pool:
        assert json.loads(pool.chat("a", HI, max_tokens=20, grammar=g).text) in ["a\\b", 'x"y', {"k\\": None}]
    from agentmem.tools import TOOL_FORMATS

    for fmt in TOOL_FORMATS.values():
        assert native_verdict(tiny_model_path, fmt.forced([{"name": "a\u2028b"}])[1]) == "ok"
    with pytest.raises(ConfigError, match="matches no value"):
        schema_grammar({"type": "object", "properties": {"a": {"enum": []}}})
    with pytest.raises(ConfigError, match=r"tools\[0\]\.parameters must be a JSON schema object"):
        tool_call_grammar([{"name": "f", "parameters": [1]}])
