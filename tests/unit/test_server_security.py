"""`agentmem serve` with API keys: tenant isolation (calls, reads, lists, forget, metrics), 401/403/404/413/429.

Real HTTP (httpx and the openai client) against uvicorn in a thread, on the tiny model.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

import httpx  # noqa: E402

from agentmem import ChatStream, ConfigError, MemoryPool  # noqa: E402
from agentmem.server import KeyRing, ServerSettings, create_app  # noqa: E402
from agentmem.server.auth import load_keys_file  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

ADMIN, KEY_A, KEY_B, KEY_SLOW = "sk-admin", "sk-tenant-a", "sk-tenant-b", "sk-one-at-a-time"
HI = [{"role": "user", "content": "hi"}]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("keys") / "keys.json"
    p.write_text(json.dumps({"keys": [
        {"key": ADMIN},
        {"key": KEY_A, "prefix": "tenant-a/"},
        {"key": KEY_B, "prefix": "tenant-b/"},
        {"key": KEY_SLOW, "prefix": "slow/", "max_concurrent": 1},
    ]}))
    return p


@pytest.fixture(scope="module")
def server(tiny_model_path: Any, keys_file: Path) -> Any:
    pool = MemoryPool(str(tiny_model_path), n_ctx=2048, resident_agents=2, n_threads=1)
    settings = ServerSettings(max_body_bytes=64 * 1024, max_prompt_tokens=400, default_max_tokens=4,
                              anonymous="per-key")
    app = create_app(pool, settings=settings, keys=KeyRing.build(keys_file=keys_file))
    with ServerThread(app) as srv:
        srv.pool = pool
        yield srv
    pool.close()


@pytest.fixture
def http(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as c:
        yield c


def chat(http: httpx.Client, key: str, agent: str | None, **body: Any) -> httpx.Response:
    payload = {"messages": HI, "max_tokens": 2, **body}
    if agent is not None:
        payload["user"] = agent
    return http.post("/v1/chat/completions", json=payload, headers=auth(key))


def test_keys_are_required(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json={"messages": HI, "user": "tenant-a/x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert chat(http, "sk-wrong", "tenant-a/x").status_code == 401
    assert http.get("/agents", headers={"X-Api-Key": "sk-wrong"}).status_code == 401
    assert http.get("/health").status_code == 200  # health needs no key


def test_openai_client_with_a_tenant_key(server: Any) -> None:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY_A, max_retries=0) as c:
        r = c.chat.completions.create(model="m", messages=HI, user="tenant-a/openai", max_tokens=2)
        assert r.usage.completion_tokens == 2
        with pytest.raises(openai.PermissionDeniedError):
            c.chat.completions.create(model="m", messages=HI, user="tenant-b/openai", max_tokens=2)
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-nope", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.models.list()


def test_tenants_cannot_call_read_list_or_forget_each_other(http: httpx.Client) -> None:
    assert chat(http, KEY_A, "tenant-a/planner").status_code == 200
    assert chat(http, KEY_B, "tenant-b/planner").status_code == 200
    assert chat(http, KEY_A, "tenant-b/planner").status_code == 403
    assert chat(http, KEY_A, "planner").status_code == 403

    listed_a = {a["id"] for a in http.get("/agents", headers=auth(KEY_A)).json()["data"]}
    listed_all = {a["id"] for a in http.get("/agents", headers=auth(ADMIN)).json()["data"]}
    assert "tenant-a/planner" in listed_a and all(x.startswith("tenant-a/") for x in listed_a)
    assert {"tenant-a/planner", "tenant-b/planner"} <= listed_all

    own = http.get("/agents/tenant-a/planner", headers=auth(KEY_A))
    assert own.status_code == 200 and own.json()["tokens"] > 0 and "data" not in own.json()
    forbidden_existing = http.get("/agents/tenant-b/planner", headers=auth(KEY_A))
    assert forbidden_existing.status_code == 403
    for action in ("park", "pin", "budget", "priority", "recall", "hold", "unhold"):
        body = {"park": {}, "pin": {"message_index": 0}, "budget": {"tokens": 100}, "priority": {"priority": 2},
                "recall": {"query": "x"}, "hold": {}, "unhold": {}}[action]
        r = http.post("/agents/tenant-b/planner", params={"action": action}, json=body, headers=auth(KEY_A))
        assert r.status_code == 403, (action, r.text)
    r = http.post("/agents/tenant-a/planner", params={"action": "handoff"}, json={"to": "tenant-b/stolen"},
                  headers=auth(KEY_A))
    assert r.status_code == 403
    assert http.delete("/agents/tenant-b/planner", headers=auth(KEY_A)).status_code == 403
    assert "tenant-b/planner" in {a["id"] for a in http.get("/agents", headers=auth(ADMIN)).json()["data"]}

    # no existence leak: once the agent is gone, tenant A gets exactly the same answer
    assert http.delete("/agents/tenant-b/planner", headers=auth(KEY_B)).status_code == 200
    forbidden_unknown = http.get("/agents/tenant-b/planner", headers=auth(KEY_A))
    assert (forbidden_unknown.status_code, forbidden_unknown.json()) == (403, forbidden_existing.json())

    # in its own scope an unknown agent is a 404
    r = http.get("/agents/tenant-a/nobody", headers=auth(KEY_A))
    assert r.status_code == 404 and r.json()["error"]["code"] == "agent_not_found"
    assert http.delete("/agents/tenant-a/nobody", headers=auth(KEY_A)).status_code == 404


def test_metrics_and_checkpoint_are_admin_only(http: httpx.Client) -> None:
    assert http.get("/metrics", headers=auth(KEY_A)).status_code == 403
    r = http.get("/metrics", headers=auth(ADMIN))
    assert r.status_code == 200 and "llamacpp:prompt_tokens_total" in r.text
    assert http.post("/agents", params={"action": "checkpoint"}, headers=auth(KEY_A)).status_code == 403
    r = http.post("/agents", params={"action": "checkpoint"}, headers=auth(ADMIN))
    assert r.status_code == 400 and "--archive" in r.json()["error"]["message"]  # no archive on this server


def test_agents_api_actions_in_scope(http: httpx.Client) -> None:
    h = auth(KEY_A)
    assert chat(http, KEY_A, "tenant-a/ops", max_tokens=3).status_code == 200
    r = http.post("/agents/tenant-a/ops", params={"action": "park"}, json={"tier": "warm"}, headers=h)
    assert r.status_code == 200 and r.json()["tier"] == "warm"
    r = http.post("/agents/tenant-a/ops", params={"action": "park"}, json={"tier": "cold"}, headers=h)
    assert r.status_code == 400 and "cold" in r.json()["error"]["message"]  # no archive: no COLD tier
    r = http.post("/agents/tenant-a/ops", params={"action": "pin"}, json={"message_index": 0}, headers=h)
    assert r.status_code == 200 and r.json()["tokens"] > 0
    r = http.post("/agents/tenant-a/ops", params={"action": "pin"}, json={"message_index": 99}, headers=h)
    assert r.status_code == 400 and "message_index" in r.json()["error"]["message"]
    r = http.post("/agents/tenant-a/ops", params={"action": "budget"}, json={"tokens": 1000}, headers=h)
    assert r.status_code == 200
    r = http.post("/agents/tenant-a/ops", params={"action": "priority"}, json={"priority": "background"}, headers=h)
    assert r.status_code == 200
    r = http.post("/agents/tenant-a/ops", params={"action": "priority"}, json={"priority": "urgent"}, headers=h)
    assert r.status_code == 400
    r = http.post("/agents/tenant-a/ops", params={"action": "handoff"}, json={"to": "tenant-a/ops-2"}, headers=h)
    assert r.status_code == 200 and r.json()["dst"] == "tenant-a/ops-2" and r.json()["n_tokens"] > 0
    r = http.post("/agents/tenant-a/ops", params={"action": "recall"}, json={"query": "hi", "k": 3}, headers=h)
    assert r.status_code == 200 and r.json()["data"] == []
    r = http.post("/agents/tenant-a/ops", params={"action": "explode"}, json={}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["param"] == "action"
    r = http.post("/agents/tenant-a/ops", params={"action": "pin"}, json={"message_index": "x"}, headers=h)
    assert r.status_code == 400
    assert http.delete("/agents/tenant-a/ops", headers=h).status_code == 200


def test_workflow_hints_over_http(http: httpx.Client, server: Any) -> None:
    h = auth(KEY_A)
    assert chat(http, KEY_A, "tenant-a/boss", max_tokens=2).status_code == 200
    r = http.post("/agents/tenant-a/boss", params={"action": "hold"}, json={"ttl_s": 30}, headers=h)
    assert r.status_code == 200 and r.json() == {"id": "tenant-a/boss", "held": True, "ttl_s": 30}
    assert "tenant-a/boss" in server.pool.stats()["hints"]["held"]
    r = http.post("/agents/tenant-a/boss", params={"action": "hold"}, json={"ttl_s": -1}, headers=h)
    assert r.status_code == 400 and "ttl_s" in r.json()["error"]["message"]
    assert http.post("/agents/tenant-a/boss", params={"action": "unhold"}, headers=h).status_code == 200
    assert "tenant-a/boss" not in server.pool.stats()["hints"]["held"]
    assert http.post("/agents/tenant-a/nobody", params={"action": "hold"}, json={}, headers=h).status_code == 404

    order = ["tenant-a/w1", ["tenant-a/w2", "tenant-a/w3"], "tenant-a/boss"]
    r = http.post("/agents", params={"action": "expect"}, json={"order": order, "soon": False}, headers=h)
    assert r.status_code == 200 and server.pool.stats()["hints"]["order"] == order
    # every listed id must be in the key's scope; the order is left as it was
    r = http.post("/agents", params={"action": "expect"}, json={"order": ["tenant-a/w1", ["tenant-b/x"]]}, headers=h)
    assert r.status_code == 403 and r.json()["error"]["param"] == "order[1]"
    assert server.pool.stats()["hints"]["order"] == order
    r = http.post("/agents", params={"action": "expect"}, json={"order": "tenant-a/w1"}, headers=h)
    assert r.status_code == 400
    r = http.post("/agents", params={"action": "expect"}, json={"order": ["tenant-a/bad\u0000id"]}, headers=h)
    assert r.status_code == 400 and "order[0]" in r.json()["error"]["message"], r.text
    # each key keeps its own order: another key's expect leaves this one's standing
    http.post("/agents", params={"action": "expect"}, json={"order": []}, headers=auth(ADMIN))
    assert server.pool.stats()["hints"]["scopes"] == 1
    http.post("/agents", params={"action": "expect"}, json={"order": []}, headers=h)
    assert server.pool.stats()["hints"]["scopes"] == 0


def test_anonymous_agent_per_key(http: httpx.Client) -> None:
    r = chat(http, KEY_A, None)
    assert r.status_code == 200
    agent = r.json()["agentmem"]["agent_id"]
    assert agent.startswith("tenant-a/anonymous-key-")
    assert chat(http, KEY_B, None).json()["agentmem"]["agent_id"].startswith("tenant-b/anonymous-key-")


def test_body_and_prompt_limits_are_413(http: httpx.Client) -> None:
    big = [{"role": "user", "content": "x" * (70 * 1024)}]
    r = http.post("/v1/chat/completions", json={"messages": big, "user": "tenant-a/big"}, headers=auth(KEY_A))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    long = [{"role": "user", "content": "word " * 600}]
    r = http.post("/v1/chat/completions", json={"messages": long, "user": "tenant-a/long"}, headers=auth(KEY_A))
    assert r.status_code == 413 and "at most 400" in r.json()["error"]["message"]
    r = http.post("/v1/completions", json={"prompt": "word " * 600, "user": "tenant-a/long"}, headers=auth(KEY_A))
    assert r.status_code == 413


def slow_streams(pool: MemoryPool, monkeypatch: pytest.MonkeyPatch, delay_s: float = 0.02) -> list[bool]:
    """Make every stream of `pool` yield a piece per `delay_s`; the list records closed streams."""
    real = pool.chat_stream
    closed: list[bool] = []

    def slow(*args: Any, **kwargs: Any) -> ChatStream:
        inner = real(*args, **kwargs)

        def gen() -> Iterator[Any]:
            try:
                for piece in inner:
                    time.sleep(delay_s)
                    yield piece
                yield inner.result
            finally:
                inner.close()
                closed.append(True)

        return ChatStream(gen())

    monkeypatch.setattr(pool, "chat_stream", slow)
    return closed


def test_concurrency_limit_per_key_is_429(server: Any, http: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    slow_streams(server.pool.engine(), monkeypatch)  # the server calls run on its model's engine
    body = {"messages": HI, "user": "slow/a", "max_tokens": 200, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=auth(KEY_SLOW)) as first:
        assert first.status_code == 200
        lines = first.iter_lines()  # keep it: a dropped line iterator closes the response
        next(lines)
        r = chat(http, KEY_SLOW, "slow/b")
        assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
        assert chat(http, KEY_A, "tenant-a/unaffected").status_code == 200  # other keys are not limited
    deadline = time.monotonic() + 10
    while chat(http, KEY_SLOW, "slow/b").status_code == 429:  # the slot comes back when the stream ends
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_disconnect_mid_stream_frees_the_agent(server: Any, http: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    closed = slow_streams(server.pool.engine(), monkeypatch)
    body = {"messages": HI, "user": "tenant-a/leaver", "max_tokens": 500, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=auth(KEY_A)) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
    t0 = time.monotonic()
    while not closed:  # the pool stream is closed at the next token, not after 500 of them
        assert time.monotonic() - t0 < 5, "the stream was not closed after the client left"
        time.sleep(0.01)
    r = http.delete("/agents/tenant-a/leaver", headers=auth(KEY_A))  # 409 while it would still be generating
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 < 5
    metrics = http.get("/metrics", headers=auth(ADMIN)).text
    n = float(re.search(r"^agentmem_client_disconnects_total (\S+)$", metrics, re.M).group(1))
    assert n >= 1


def test_requests_of_one_agent_run_one_at_a_time(server: Any, http: httpx.Client) -> None:
    out: list[int] = []

    def call() -> None:
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            out.append(chat(c, KEY_A, "tenant-a/serial", max_tokens=8).status_code)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [200, 200, 200]
    info = http.get("/agents/tenant-a/serial", headers=auth(KEY_A)).json()
    assert info["calls"] == 3


def test_keys_file_formats(tmp_path: Path) -> None:
    lines = tmp_path / "keys.txt"
    lines.write_text("# admin\nsk-1\nsk-2 team-x/  # a tenant\n\n")
    keys = load_keys_file(lines)
    assert [(k.principal.admin, k.principal.prefix) for k in keys] == [(True, ""), (False, "team-x/")]
    ring = KeyRing(keys)
    assert ring.authenticate("sk-2").allows("team-x/a") and not ring.authenticate("sk-2").allows("team-y/a")
    assert ring.authenticate("sk-3") is None and ring.authenticate(None) is None
    bad = tmp_path / "bad.txt"
    bad.write_text("sk-1 a/ extra\n")
    with pytest.raises(ConfigError, match="line 1"):
        load_keys_file(bad)
    with pytest.raises(ConfigError, match="twice"):
        KeyRing.build(api_keys=["sk-1"], keys_file=lines)
