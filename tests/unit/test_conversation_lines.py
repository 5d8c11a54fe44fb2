"""Conversation lines (#25): requests without an agent id find their kept KV; branches, not overwrites.

Pool tests call `MemoryPool.find_line` on the tiny models; server tests drive `agentmem serve`
(uvicorn in a thread, `tests/fixtures/serving.py`) with the official `openai` client and no agent id.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np
import pytest

from agentmem import MemoryPool, PoolConfig
from agentmem.engine.chat_format import Span
from agentmem.memory.ledger import Ledger
from agentmem.memory.tiers import WARM
from agentmem.pool.lines import LineIndex, line_marks
from agentmem.pool.residence import Residence
from agentmem.pool.state import AgentState
from agentmem.pool.tenants import TenantScope

SYSTEM = {"role": "system", "content": "you are a helpful assistant. answer briefly and kindly, in one line."}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}


def said(user: str) -> list[dict[str, Any]]:
    return [SYSTEM, {"role": "user", "content": user}]


def turn(pool: MemoryPool, msgs: list[dict[str, Any]], scope: str = "", **kw: Any) -> tuple[Any, Any]:
    """One call without an agent id, as the server makes it: find the line, call it, release it."""
    line = pool.find_line(msgs, tools=kw.get("tools"), scope=scope)
    try:
        return line, pool.chat(line.agent_id, msgs, max_tokens=kw.pop("max_tokens", 4), **kw)
    finally:
        pool.release_line(line.agent_id)


@pytest.fixture()
def pool(tiny_model_path: Any) -> Iterator[MemoryPool]:
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=1, n_batch=64, n_threads=1, prefetch=False) as p:
        yield p


# --------------------------------------------------------------------------- pool: the rules


def test_interleaved_conversations_find_their_own_agents(pool: MemoryPool) -> None:
    """#25: two conversations interleaved without ids: each continues its own agent (parked and restored)."""
    convs = {"cats": said("tell me about cats"), "dogs": said("tell me about dogs")}
    ids: dict[str, set[str]] = {k: set() for k in convs}
    prev: dict[str, int] = {}
    for i in range(3):
        for k, msgs in convs.items():
            line, r = turn(pool, msgs)
            ids[k].add(line.agent_id)
            if i:
                assert line.kind == "continued" and r.kv == "restored", (k, i, line, r.kv)
                assert r.usage.cached_tokens >= prev[k], (k, i, r.usage)
            msgs += [{"role": "assistant", "content": r.text}, {"role": "user", "content": f"and then {i}?"}]
            prev[k] = r.usage.prompt_tokens
    assert all(len(v) == 1 for v in ids.values()) and ids["cats"] != ids["dogs"], ids
    assert sorted(pool.agents()) == sorted(next(iter(v)) for v in ids.values())


def test_a_new_conversation_gets_a_new_derived_id(pool: MemoryPool) -> None:
    """#25: a prompt that continues no line is a new agent `{scope}conv-<random>`; the system prompt alone joins nothing."""
    first, _ = turn(pool, said("what is a prime number?"))
    assert first.kind == "new" and first.agent_id.startswith("conv-"), first
    other, r = turn(pool, said("what is a river?"))  # same system prompt only: not the same line
    assert other.agent_id != first.agent_id and other.kind == "branched", other
    assert r.kv == "shared" and r.usage.cached_tokens > 0  # ...but it starts from the shared system prompt's cells


def test_repeating_a_prompt_branches_and_keeps_the_reply(pool: MemoryPool) -> None:
    """#25 (ties, short matches): a prompt that only repeats a line's last prompt branches; the line keeps its reply."""
    msgs = said("name a colour")
    a, ra = turn(pool, msgs)
    held = pool.history_tokens(a.agent_id)
    b, rb = turn(pool, msgs)
    assert b.agent_id != a.agent_id and b.kind == "branched" and b.agent_id.startswith("conv-"), (a, b)
    assert pool.history_tokens(a.agent_id) == held
    assert rb.usage.cached_tokens == rb.usage.prompt_tokens - 1  # the whole prompt from a's cells
    # the next turn of a conversation whose reply was a's continues a (its history matches longest)
    pool.chat(b.agent_id, msgs + [{"role": "assistant", "content": "x y z"}], max_tokens=0)  # b's reply differs
    nxt, r = turn(pool, msgs + [{"role": "assistant", "content": ra.text}, {"role": "user", "content": "another"}])
    assert nxt.agent_id == a.agent_id and nxt.kind == "continued", (nxt, a, b)


def test_a_claimed_or_busy_line_is_not_joined_the_second_request_branches(pool: MemoryPool) -> None:
    """#25 (concurrency): a second lookup of a line while the first holds it branches at once."""
    msgs = said("count to three")
    a, r = turn(pool, msgs)
    nxt = msgs + [{"role": "assistant", "content": r.text}, {"role": "user", "content": "again"}]
    first = pool.find_line(nxt)
    second = pool.find_line(nxt)
    assert first.agent_id == a.agent_id and first.kind == "continued"
    assert second.agent_id != a.agent_id and second.kind == "branched", second
    third = pool.find_line(said("another conversation"))
    assert third.agent_id not in (first.agent_id, second.agent_id)
    for x in (first, second, third):
        pool.release_line(x.agent_id)
    assert pool.find_line(nxt, claim=False).agent_id == a.agent_id  # released: joined again
    # identical new prompts in flight get two agents
    p, q = pool.find_line(said("same start")), pool.find_line(said("same start"))
    assert p.agent_id != q.agent_id and p.kind == q.kind, (p, q)


def test_side_question_branches_and_the_main_line_keeps_its_kv(pool: MemoryPool) -> None:
    """#25 (branches, not overwrites): a side question off an earlier turn is a branch; the main line reads >= 95 %."""
    main = said("plan a trip to the sea")
    for q in ("what to pack?", "and for food?"):
        line, r = turn(pool, main)
        main += [{"role": "assistant", "content": r.text}, {"role": "user", "content": q}]
    line, r = turn(pool, main)
    main_id, prev_prompt = line.agent_id, r.usage.prompt_tokens
    main += [{"role": "assistant", "content": r.text}]
    side = main[:3] + [{"role": "user", "content": "summarize the conversation in a title"}]
    sl, sr = turn(pool, side)
    assert sl.agent_id != main_id and sl.kind == "branched" and sr.kv == "shared", (sl, sr.kv)
    line, r = turn(pool, main + [{"role": "user", "content": "thanks, what next?"}])
    assert line.agent_id == main_id and line.kind == "continued"
    assert r.usage.cached_tokens >= 0.95 * prev_prompt, (r.usage, prev_prompt)
    back, _ = turn(pool, side + [{"role": "assistant", "content": sr.text}, {"role": "user", "content": "shorter"}])
    assert back.agent_id == sl.agent_id  # the branch is a line of its own


def test_lines_stay_inside_the_tenant_scope(tiny_model_path: Any) -> None:
    """#25: a key never joins (nor starts from) another tenant's line; scope "" sees no tenant's lines."""
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=2, n_batch=64, n_threads=1, prefetch=False,
                    tenants=("team-a/", "team-b/")) as p:
        msgs = said("the vault code question")
        a, ra = turn(p, msgs, scope="team-a/")
        assert a.agent_id.startswith("team-a/conv-")
        nxt = msgs + [{"role": "assistant", "content": ra.text}, {"role": "user", "content": "and?"}]
        b, rb = turn(p, nxt, scope="team-b/")
        assert b.agent_id.startswith("team-b/conv-") and b.kind == "new" and rb.usage.cached_tokens == 0, (b, rb.usage)
        assert p.find_line(nxt, scope="", claim=False).kind == "new"
        a2, _ = turn(p, nxt, scope="team-a/")
        assert a2.agent_id == a.agent_id and a2.kind == "continued"


def test_an_archived_line_is_found_after_a_restart(tiny_model_path: Any, tmp_path: Path) -> None:
    """#25: kept states in the archive (COLD after a restart) are lines too."""
    kw = dict(n_ctx=2048, resident_agents=1, n_batch=64, n_threads=1, prefetch=False, archive_path=tmp_path / "a.db")
    msgs = said("remember the number seven")
    with MemoryPool(tiny_model_path, **kw) as p:
        a, r = turn(p, msgs)
        turn(p, said("an unrelated talk"))
    msgs += [{"role": "assistant", "content": r.text}, {"role": "user", "content": "which number?"}]
    with MemoryPool(tiny_model_path, **kw) as p:
        assert p.stats()["agents"][a.agent_id]["tier"] == "cold"
        line, r2 = turn(p, msgs)
        assert line.agent_id == a.agent_id and line.kind == "continued" and r2.kv == "restored"
        assert r2.usage.cached_tokens >= r.usage.prompt_tokens


def test_line_marks_end_at_the_last_user_or_tool_message() -> None:
    """#25: a line key ends after the last user/tool/text message; a history of a system prompt only has none."""
    led = Ledger()
    led.extend(list(range(10)), [Span(0, 4, "system", 0), Span(4, 7, "user", 1), Span(7, 10, "assistant", -1)])
    led.extend([50, 51], None, region="assistant", message=2)
    assert line_marks(led) == (7, 10)
    only_system = Ledger()
    only_system.extend([1, 2, 3], [Span(0, 3, "system", 0)])
    assert line_marks(only_system) is None


def _fake_core(n: int) -> SimpleNamespace:
    """A pool core with `n` parked agents sharing a 300-token system prompt (no model needed)."""
    rng = np.random.default_rng(0)
    system = rng.integers(10, 500, 300).tolist()
    agents = {}
    for i in range(n):
        led = Ledger()
        user = rng.integers(10, 500, 20).tolist()
        led.extend(system + user + [1, 2], [Span(0, 300, "system", 0), Span(300, 320, "user", 1),
                                            Span(320, 322, "assistant", -1)])
        led.extend(rng.integers(10, 500, 10).tolist(), None, region="assistant", message=2)
        agents[f"conv-{i}"] = AgentState(f"conv-{i}", ledger=led, residence=Residence(tier=WARM, codec="f16"))
    return SimpleNamespace(agents=agents, tenants=TenantScope(()), tiers={WARM: None}, config=PoolConfig())


def test_lookup_cost_is_flat_in_the_number_of_kept_states() -> None:
    """#25: a lookup walks the prompt's path in one tree, not the agents: a few nodes for 20 and for 2,000 states.

    (The tree's depth on the path grows by a split where random user messages share a first token.)"""
    visited, took = {}, {}
    for n in (20, 2000):
        core, idx = _fake_core(n), LineIndex()
        idx.refresh(core)  # the one-time build (every agent once)
        target = core.agents["conv-7"].ledger.tokens.tolist()
        prompt = target + [3, 4, 5]
        t0 = time.perf_counter()
        for _ in range(50):
            line = idx.find(core, prompt, "", claim=False)
        took[n] = (time.perf_counter() - t0) / 50
        assert line.agent_id == "conv-7" and line.kind == "continued", line
        visited[n] = idx.visited
    assert max(visited.values()) <= 5, visited
    assert took[2000] < 10 * took[20] + 1e-3, took  # no O(agents) work hidden beside the walk


# --------------------------------------------------------------------------- server: no agent id at all

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx  # noqa: E402

from agentmem.server import KeyRing, ServerSettings, create_app  # noqa: E402
from agentmem.server.http_errors import ApiError  # noqa: E402
from agentmem.server.auth import LOCAL  # noqa: E402
from agentmem.server.identity import resolve_agent_id  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402


@pytest.fixture(scope="module")
def qwen_server(tiny_qwen2_path: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The default server (`--anonymous lines`) on the tiny qwen2 model (native tools), two scoped keys."""
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps({"keys": [{"key": "sk-a", "prefix": "team-a/"}, {"key": "sk-b", "prefix": "team-b/"}]}))
    pool = MemoryPool(str(tiny_qwen2_path), n_ctx=4096, resident_agents=1, n_batch=64, n_threads=1, prefetch=False)
    app = create_app(pool, settings=ServerSettings(model_name="tiny", default_max_tokens=6),
                     keys=KeyRing.build(keys_file=keys))
    with ServerThread(app) as srv:
        srv.pool = pool
        yield srv
    pool.close()


def client(srv: Any, key: str = "sk-a") -> Any:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=key, max_retries=0)


def ask(c: Any, msgs: list[dict[str, Any]], **kw: Any) -> tuple[Any, str]:
    raw = c.chat.completions.with_raw_response.create(model="tiny", messages=msgs, max_tokens=6, **kw)
    r = raw.parse()
    assert raw.headers["x-agent-id"] == r.model_extra["agentmem"]["agent_id"]
    return r, r.model_extra["agentmem"]["agent_id"]


def test_server_two_conversations_without_ids_each_read_their_history(qwen_server: Any) -> None:
    """#25: the openai client with no agent id: two interleaved conversations, each from its own kept KV."""
    with client(qwen_server) as c:
        convs = [said("first conversation about the sea"), said("second conversation about mountains")]
        seen: list[list[str]] = [[], []]
        prev = [0, 0]
        for i in range(2):
            for k, msgs in enumerate(convs):
                r, aid = ask(c, msgs)
                seen[k].append(aid)
                assert aid.startswith("team-a/conv-")
                if i:
                    assert r.model_extra["agentmem"]["line"] == "continued"
                    assert r.usage.prompt_tokens_details.cached_tokens >= prev[k], (k, r.usage)
                prev[k] = r.usage.prompt_tokens
                msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "go on"}]
        assert len(set(seen[0])) == 1 and len(set(seen[1])) == 1 and seen[0][0] != seen[1][0], seen
        listed = httpx.get(f"{qwen_server.base_url}/agents", headers={"Authorization": "Bearer sk-a"}).json()
        ids = {a["id"] for a in (listed["data"] if isinstance(listed, dict) else listed)}
        assert {seen[0][0], seen[1][0]} <= ids, ids
    with client(qwen_server, "sk-b") as cb:  # another tenant, the same history: its own new line, nothing shared
        r, aid = ask(cb, convs[0])
        assert aid.startswith("team-b/conv-") and r.usage.prompt_tokens_details.cached_tokens == 0
        assert r.model_extra["agentmem"]["line"] == "new"


def test_server_side_request_without_tools_leaves_the_main_line(qwen_server: Any) -> None:
    """#25: a call that drops `tools` (CrewAI's last call) no longer replaces the line; the next reads >= 95 %."""
    with client(qwen_server) as c:
        main = said("what is the weather in paris and rome?")
        for q in ("and tomorrow?", "and in a week?"):
            r, main_id = ask(c, main, tools=[TOOL])
            main += [{"role": "assistant", "content": r.choices[0].message.content or "ok"}, {"role": "user", "content": q}]
        r, aid = ask(c, main, tools=[TOOL])
        assert aid == main_id
        prev = r.usage.prompt_tokens
        main += [{"role": "assistant", "content": r.choices[0].message.content or "ok"}]
        side, side_id = ask(c, main + [{"role": "user", "content": "give this chat a title"}])  # no tools
        assert side_id != main_id
        r, aid = ask(c, main + [{"role": "user", "content": "thanks"}], tools=[TOOL])
        assert aid == main_id, (aid, main_id)
        cached = r.usage.prompt_tokens_details.cached_tokens
        assert cached >= 0.95 * prev, (cached, prev)


def test_server_explicit_ids_still_win(qwen_server: Any) -> None:
    """#25: an explicit agent id is used as given (and a line lookup is not made)."""
    with client(qwen_server) as c:
        r, aid = ask(c, said("hello"), user="team-a/named")
        assert aid == "team-a/named" and "line" not in r.model_extra["agentmem"]


def test_concurrent_requests_on_one_line_branch(qwen_server: Any) -> None:
    """#25 (concurrency): two requests continuing one line at once: one continues it, the other branches."""
    with client(qwen_server) as c:
        msgs = said("a line for two at once")
        r, first = ask(c, msgs)
        nxt = msgs + [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "more"}]
        out: list[str] = []
        ts = [threading.Thread(target=lambda: out.append(ask(c, nxt)[1])) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert len(out) == 2 and len(set(out)) == 2 and first in out, (out, first)


def test_reject_policy_still_gives_a_400() -> None:
    """`--anonymous reject` keeps the old 400 `missing_agent_id`; `lines` (the default) resolves later."""
    with pytest.raises(ApiError) as info:
        resolve_agent_id(LOCAL, header=None, user=None, extension=None, anonymous="reject")
    assert info.value.code == "missing_agent_id"
    assert resolve_agent_id(LOCAL, header=None, user=None, extension=None, anonymous="lines") is None
    assert ServerSettings().anonymous == "lines"
