"""Tenant walls (#23 findings 2, 3, 9, 10): no cross-tenant KV, no other tenant's ids in errors, UTF-8 agent
headers, per-key quotas.

The pool-level tests run `MemoryPool` on the tiny model; the server tests run real HTTP against
uvicorn in a thread (`tests/fixtures/serving.py`) with two scoped keys, as the issue's reproductions did.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from agentmem import ConfigError, MemoryPool, PoolConfig, UnknownAgentError

SECRET = ("you are the billing agent of team a. the vault code is 7 3 9 1 4 8. never reveal the code. "
          "answer every question about invoices politely and briefly. ") * 2
HI = [{"role": "user", "content": "hi"}]


def secret_chat(user: str = "what is due today?") -> list[dict[str, str]]:
    return [{"role": "system", "content": SECRET}, {"role": "user", "content": user}]


@pytest.fixture()
def plain(tiny_model_path: Any) -> Iterator[MemoryPool]:
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=3, n_batch=64, n_threads=1, prefetch=False) as p:
        yield p


@pytest.fixture()
def walled(tiny_model_path: Any) -> Iterator[MemoryPool]:
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=3, n_batch=64, n_threads=1, prefetch=False,
                    tenants=("team-a/", "team-b/")) as p:
        yield p


# --------------------------------------------------------------------------- finding 2: errors name no other agent


def test_unknown_agent_error_lists_no_agent_ids(plain: MemoryPool) -> None:
    """#23 finding 2: the pool's "unknown agent" error listed every agent id in the pool (`known: [...]`)."""
    plain.chat("team-a/secret-planner", HI, max_tokens=1)
    for op in (lambda: plain.park("team-b/nope"), lambda: plain.forget("team-b/nope"),
               lambda: plain.pin("team-b/nope", 0), lambda: plain.hold("team-b/nope"),
               lambda: plain.handoff("team-b/nope", "team-b/x")):
        with pytest.raises(UnknownAgentError) as info:
            op()
        msg = str(info.value)
        assert "team-a/secret-planner" not in msg and "known:" not in msg, msg
        assert "team-b/nope" in msg and "1 agent(s)" in msg, msg  # a hint without ids: the count
        assert info.value.agent_id == "team-b/nope"


# --------------------------------------------------------------------------- finding 3: no KV across tenants


def test_tenant_scope_rule() -> None:
    """#23 finding 3: the tenant of an id is its longest configured prefix; shares follow their name."""
    from agentmem.pool.tenants import TenantScope

    s = TenantScope(("team-a/", "team-a/red/", "team-b/"))
    ids = ("team-a/x", "team-a/red/x", "team-b/x", "other", "share:team-b/brief", "share:brief")
    assert [s.of(x) for x in ids] == ["team-a/", "team-a/red/", "team-b/", "", "team-b/", ""]
    assert not s.may_take("team-a/red/x", "team-a/x") and s.may_take("team-a/x", "team-a/y")
    assert s.may_take("share:brief", "team-b/x") and not s.may_take("other", "team-b/x")
    assert not s.may_take("team-b/x", "share:brief")  # a public share takes nothing from a tenant
    with pytest.raises(ConfigError, match=r"tenants\[1\]"):
        PoolConfig(tenants=("a/", "a/"))
    with pytest.raises(ConfigError, match="reserved prefix"):
        PoolConfig(tenants=("share:x",))
    cfg = PoolConfig(tenants=["team-a/", "team-b/"])  # a JSON list is kept as a tuple: serializable
    assert cfg.tenants == ("team-a/", "team-b/") and PoolConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_no_prefix_sharing_across_tenants_live_or_parked(tiny_model_path: Any) -> None:
    """#23 finding 3: tenant B sending A's system prompt got A's cells (`kv == "shared"`, `cached_tokens` > 0)."""
    with MemoryPool(tiny_model_path, n_ctx=2048, resident_agents=1, n_batch=64, n_threads=1, prefetch=False,
                    tenants=("team-a/", "team-b/")) as p:
        p.chat("team-a/billing", secret_chat(), max_tokens=2)
        spy = p.chat("team-b/spy", secret_chat("guess"), max_tokens=0)  # A is parked by now: a restore donor
        assert spy.kv == "prefilled" and spy.usage.cached_tokens == 0, (spy.kv, spy.usage)
        p.park("team-b/spy")
        assert p.stats()["agents"]["team-a/billing"]["tier"] == "warm"
        mate = p.chat("team-a/auditor", secret_chat("guess"), max_tokens=0)  # inside the tenant: shared as today
        assert mate.kv == "shared" and mate.usage.cached_tokens >= 32, (mate.kv, mate.usage)
        assert p.stats()["agents"]["team-b/spy"]["block"] is None  # no block joins the two tenants


def test_sharing_inside_a_tenant_and_without_tenants_is_unchanged(walled: MemoryPool, plain: MemoryPool) -> None:
    """#23 finding 3: inside one tenant (and with no tenants configured) prefixes are still shared live."""
    walled.chat("team-a/billing", secret_chat(), max_tokens=2)
    assert walled.chat("team-b/spy", secret_chat("guess"), max_tokens=0).usage.cached_tokens == 0
    r = walled.chat("team-a/coder", secret_chat("write it"), max_tokens=2)
    assert r.kv == "shared" and r.usage.cached_tokens >= 32
    plain.chat("team-a/billing", secret_chat(), max_tokens=2)
    assert plain.chat("team-b/spy", secret_chat("guess"), max_tokens=0).kv == "shared"  # one scope for all


def test_declared_shares_and_handoffs_respect_tenants(walled: MemoryPool) -> None:
    """#23 finding 3: a share named under a tenant serves only it; a handoff never crosses tenants."""
    walled.share("team-a/brief", [{"role": "system", "content": SECRET}])
    assert walled.chat("team-b/x", secret_chat(), max_tokens=0).usage.cached_tokens == 0
    assert walled.chat("team-a/x", secret_chat(), max_tokens=0).kv == "shared"
    public = "the style guide: short sentences, plain words, no jargon, one idea per line. " * 4
    walled.share("style", [{"role": "system", "content": public}])  # under no tenant: public
    r = walled.chat("team-b/y", [{"role": "system", "content": public}, *HI], max_tokens=0)
    assert r.kv == "shared" and r.usage.cached_tokens >= 32
    with pytest.raises(ConfigError, match="inside one tenant"):
        walled.handoff("team-a/x", "team-b/stolen")
    with pytest.raises(ConfigError, match="inside one tenant"):
        walled.handoff("share:team-a/brief", "team-b/stolen")
    assert "team-b/stolen" not in walled.agents()
    assert walled.handoff("team-a/x", "team-a/copy").n_tokens > 0
    assert walled.add_tenants(["team-c/", "team-a/"]) == ("team-a/", "team-b/", "team-c/")
    assert walled.config.tenants == ("team-a/", "team-b/", "team-c/") and walled.tenant_of("team-c/z") == "team-c/"
    usage = walled.tenant_usage("team-a/")
    assert usage.agents == {"team-a/x", "team-a/copy"} and usage.parked_bytes >= 0


# --------------------------------------------------------------------------- the server

pytest.importorskip("fastapi")
import httpx  # noqa: E402

from agentmem.server import KeyRing, ServerSettings, create_app  # noqa: E402
from agentmem.server.auth import ApiKey, load_keys_file  # noqa: E402
from agentmem.server.engine import Engine  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

ADMIN, KEY_A, KEY_B, KEY_Q, KEY_P = "sk-admin", "sk-team-a", "sk-team-b", "sk-quota", "sk-parked"


def auth(key: str, **extra: Any) -> dict[str, Any]:
    return {"Authorization": f"Bearer {key}", **extra}


def _serve(tiny_model_path: Any, keys: Path, settings: ServerSettings) -> Iterator[Any]:
    pool = MemoryPool(str(tiny_model_path), n_ctx=2048, resident_agents=3, n_batch=64, n_threads=1, prefetch=False)
    app = create_app(pool, settings=settings, keys=KeyRing.build(keys_file=keys))
    with ServerThread(app) as srv:
        srv.pool = pool
        yield srv
    pool.close()


@pytest.fixture(scope="module")
def server(tiny_model_path: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two tenant keys and an admin key, as in the issue's reproductions."""
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps({"keys": [{"key": ADMIN}, {"key": KEY_A, "prefix": "team-a/"},
                                         {"key": KEY_B, "prefix": "team-b/"}]}))
    yield from _serve(tiny_model_path, keys, ServerSettings(default_max_tokens=2))


@pytest.fixture(scope="module")
def quota_server(tiny_model_path: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Keys with their own quotas in the keys file."""
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"key": ADMIN}, {"key": KEY_A, "prefix": "team-a/"},
        {"key": KEY_Q, "prefix": "quota/", "max_agents": 2}, {"key": KEY_P, "prefix": "parked/", "max_parked_bytes": 1},
    ]}))
    yield from _serve(tiny_model_path, keys, ServerSettings(default_max_tokens=2, max_agents_per_key=64))


@pytest.fixture
def http(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as c:
        yield c


@pytest.fixture
def qhttp(quota_server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=quota_server.base_url, timeout=60) as c:
        yield c


def chat(http: httpx.Client, key: str, agent: str | None, messages: Any = HI, headers: Any = None, **body: Any) -> Any:
    payload = {"messages": messages, "max_tokens": 1, **body}
    if agent is not None:
        payload["user"] = agent
    return http.post("/v1/chat/completions", json=payload, headers=auth(key, **(headers or {})))


def test_server_unknown_agent_bodies_depend_only_on_the_id(http: httpx.Client) -> None:
    """#23 finding 2: `DELETE /agents/{id}` and `?action=park|pin|handoff|hold` listed every agent of every tenant."""
    def answers() -> list[Any]:
        out = [http.delete("/agents/team-b/nope", headers=auth(KEY_B))]
        for action, body in (("park", {}), ("pin", {"message_index": 0}), ("handoff", {"to": "team-b/x"}),
                             ("hold", {}), ("priority", {"priority": 2}), ("budget", {"tokens": 64})):
            out.append(http.post("/agents/team-b/nope", params={"action": action}, json=body, headers=auth(KEY_B)))
        return out

    before = answers()
    assert chat(http, KEY_A, "team-a/secret-agent-1").status_code == 200
    after = answers()
    for r0, r1 in zip(before, after):
        assert r1.status_code == 404, r1.text
        assert r1.json() == r0.json() == {"error": {"message": "unknown agent 'team-b/nope'", "type": "not_found_error",
                                                    "param": None, "code": "agent_not_found"}}
    assert "team-b/nope" not in {a["id"] for a in http.get("/agents", headers=auth(ADMIN)).json()["data"]}
    metrics = http.get("/metrics", headers=auth(ADMIN)).text
    assert "secret-agent" not in metrics and "team-a/" not in metrics  # no agent id in any label


def test_server_tenant_b_gets_none_of_tenant_a_prompt(http: httpx.Client, server: Any) -> None:
    """#23 finding 3: B recovered A's secret digits through `cached_tokens` / `kv: "shared"`.

    The server's scoped keys are the pool's tenants.
    """
    assert chat(http, KEY_A, "team-a/billing", secret_chat()).status_code == 200
    spy = chat(http, KEY_B, "team-b/spy", secret_chat("guess"), max_tokens=0).json()
    assert spy["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and spy["agentmem"]["kv"] != "shared", spy
    again = chat(http, KEY_B, "team-b/spy-2", secret_chat("guess 2"), max_tokens=0).json()  # B's own reuse is fine
    assert again["agentmem"]["kv"] == "shared"
    mate = chat(http, KEY_A, "team-a/auditor", secret_chat("guess"), max_tokens=0).json()
    assert mate["agentmem"]["kv"] == "shared" and mate["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32
    assert server.pool.config.tenants == ("team-a/", "team-b/")


def test_engine_adds_key_prefixes_to_a_config() -> None:
    """#23 finding 3: a server opening its pool from a `PoolConfig` walls its keys' prefixes too (admins: none)."""
    keys = KeyRing([ApiKey.make("sk-x"), ApiKey.make("sk-a", prefix="a/"), ApiKey.make("sk-a2", prefix="a/")])
    assert keys.tenant_prefixes() == ("a/",)
    eng = Engine(PoolConfig(tenants=("z/",)), ServerSettings(), tenants=keys.tenant_prefixes())
    assert eng._config is not None and eng._config.tenants == ("z/", "a/")


# --------------------------------------------------------------------------- finding 9: UTF-8 agent header


def test_agent_header_is_utf8_like_the_body(http: httpx.Client) -> None:
    """#23 finding 9: `X-Agent-Id: team-b/café` was decoded as latin-1, another agent than `"user": "team-b/café"`."""
    first = chat(http, KEY_B, None, headers={"X-Agent-Id": "team-b/café".encode()})
    assert first.status_code == 200 and first.json()["agentmem"]["agent_id"] == "team-b/café", first.text
    second = chat(http, KEY_B, "team-b/café")
    assert second.json()["agentmem"]["agent_id"] == "team-b/café" and second.json()["agentmem"]["kv"] == "reused"
    ids = {a["id"] for a in http.get("/agents", headers=auth(KEY_B)).json()["data"]}
    assert "team-b/café" in ids and not any("Ã" in x for x in ids), ids
    bad = chat(http, KEY_B, None, headers={"X-Agent-Id": b"team-b/\xff\xfe"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Agent-Id", bad.text


# --------------------------------------------------------------------------- finding 10: quotas per key


def test_max_agents_per_key_is_429_naming_the_limit(qhttp: httpx.Client) -> None:
    """#23 finding 10: a key could start agents without limit (2,097 on the tiny model)."""
    assert chat(qhttp, KEY_Q, "quota/one").status_code == 200
    assert chat(qhttp, KEY_Q, "quota/two").status_code == 200
    r = chat(qhttp, KEY_Q, "quota/three")
    assert r.status_code == 429, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"], err["type"]) == ("quota_exceeded", "max_agents", "rate_limit_error")
    assert "at most 2 agents" in err["message"]
    assert chat(qhttp, KEY_Q, "quota/one").status_code == 200  # its agents keep working
    r = qhttp.post("/agents/quota/one", params={"action": "handoff"}, json={"to": "quota/copy"}, headers=auth(KEY_Q))
    assert r.status_code == 429 and r.json()["error"]["param"] == "max_agents"  # a handoff's new agent counts
    assert qhttp.delete("/agents/quota/two", headers=auth(KEY_Q)).status_code == 200
    assert chat(qhttp, KEY_Q, "quota/three").status_code == 200


def test_max_parked_bytes_per_key_is_429(qhttp: httpx.Client) -> None:
    """#23 finding 10: no per-key limit on the bytes an API key's agents keep (265 agents added 105 MiB)."""
    assert chat(qhttp, KEY_P, "parked/a").status_code == 200
    r = qhttp.post("/agents/parked/a", params={"action": "park"}, json={"tier": "warm"}, headers=auth(KEY_P))
    assert r.status_code == 200 and r.json()["bytes"] > 1
    r = chat(qhttp, KEY_P, "parked/b")
    assert r.status_code == 429 and r.json()["error"]["param"] == "max_parked_bytes", r.text
    assert chat(qhttp, KEY_A, "team-a/unaffected").status_code == 200  # another key is not limited by it
    assert qhttp.delete("/agents/parked/a", headers=auth(KEY_P)).status_code == 200
    assert chat(qhttp, KEY_P, "parked/b").status_code == 200


def test_actions_other_than_a_call_create_no_agent(http: httpx.Client) -> None:
    """#23 finding 10: `?action=priority` (and `budget`) created an agent without a call."""
    for action, body in (("priority", {"priority": "foreground"}), ("budget", {"tokens": 100})):
        r = http.post("/agents/team-b/ghost", params={"action": action}, json=body, headers=auth(KEY_B))
        assert r.status_code == 404 and r.json()["error"]["message"] == "unknown agent 'team-b/ghost'", r.text
    assert "team-b/ghost" not in {a["id"] for a in http.get("/agents", headers=auth(ADMIN)).json()["data"]}


def test_quota_defaults_overrides_and_concurrent_first_calls() -> None:
    """#23 finding 10: server defaults apply to scoped keys, a key's own field wins, admin keys are exempt,
    and concurrent first calls of new agents cannot overshoot `max_agents`."""
    import asyncio

    from agentmem.pool.tenants import TenantUsage
    from agentmem.server.http_errors import ApiError
    from agentmem.server.quotas import Quotas

    q = Quotas(ServerSettings(max_agents_per_key=3, max_parked_bytes_per_key=0))
    scoped = ApiKey.make("k1", prefix="t/").principal
    own = ApiKey.make("k2", prefix="u/", max_agents=1, max_parked_bytes=10).principal
    admin = ApiKey.make("k3").principal
    assert q.limits(scoped) == (3, 0) and q.limits(own) == (1, 10) and q.limits(admin) == (0, 0)

    class Pool:
        def tenant_usage(self, prefix: str) -> TenantUsage:
            return TenantUsage(frozenset({"t/a"}), 0)

    async def go() -> None:
        s1 = await q.reserve(scoped, "t/b", Pool())  # type: ignore[arg-type]
        await q.reserve(scoped, "t/c", Pool())  # type: ignore[arg-type]  # 3 with the pending two
        await q.reserve(scoped, "t/a", Pool())  # type: ignore[arg-type]  # a known agent is always admitted
        with pytest.raises(ApiError) as info:
            await q.reserve(scoped, "t/d", Pool())  # type: ignore[arg-type]
        assert info.value.status == 429 and info.value.param == "max_agents"
        s1()  # t/b's first call ended without creating it
        await q.reserve(scoped, "t/d", Pool())  # type: ignore[arg-type]

    asyncio.run(go())


def test_quota_fields_in_keys_file_and_flags(tmp_path: Path) -> None:
    """#23 finding 10: the quotas are configurable per key (keys file) and server-wide (settings, CLI flags)."""
    p = tmp_path / "keys.json"
    p.write_text(json.dumps([{"key": "sk-1", "prefix": "a/", "max_agents": 5, "max_parked_bytes": 1024}]))
    got = load_keys_file(p)[0].principal
    assert (got.max_agents, got.max_parked_bytes) == (5, 1024)
    p.write_text(json.dumps([{"key": "sk-1", "prefix": "a/", "max_agents": -1}]))
    with pytest.raises(ConfigError, match="max_agents must be an int >= 0"):
        load_keys_file(p)
    p.write_text(json.dumps([{"key": "sk-1", "prefix": "a/", "max_agent": 1}]))
    with pytest.raises(ConfigError, match="max_parked_bytes"):  # the error lists the allowed fields
        load_keys_file(p)
    with pytest.raises(ConfigError, match="max_agents_per_key"):
        ServerSettings(max_agents_per_key=-1)
    from agentmem.server.cli import add_arguments, build

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    _, settings, _ = build(parser.parse_args(["--max-agents", "7", "--max-parked-bytes", "4096"]))
    assert (settings.max_agents_per_key, settings.max_parked_bytes_per_key) == (7, 4096)
    defaults = ServerSettings()
    assert (defaults.max_agents_per_key, defaults.max_parked_bytes_per_key) == (256, 1 << 30)
