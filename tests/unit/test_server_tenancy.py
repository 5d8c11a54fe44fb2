"""#33: what one key keeps and sees — the conversation lifecycle (F3), ids under the key (F5, M2), quotas
per exact key (F7), per-tenant listings (F6), end-user scope (F4), idempotent retries (M1).

Real HTTP against uvicorn in a thread (`tests/fixtures/serving.py`) on the tiny model, a fresh pool per test.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("fastapi")

import httpx  # noqa: E402

from agentmem import ConfigError, MemoryPool  # noqa: E402
from agentmem.server import KeyRing, ServerSettings, create_app  # noqa: E402
from agentmem.server.auth import ApiKey  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

ADMIN, KEY_A, KEY_B, KEY_RED = "sk-t-admin", "sk-t-a", "sk-t-b", "sk-t-red"


def auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


@contextlib.contextmanager
def serving(model: Path, tmp: Path, keys: list[dict[str, Any]] | None = None, **settings: Any) -> Iterator[Any]:
    """A server on a fresh pool of the tiny model; `keys` as in a keys file (none: an open server)."""
    ring = KeyRing()
    if keys:
        (tmp / "keys.json").write_text(json.dumps({"keys": keys}))
        ring = KeyRing.build(keys_file=tmp / "keys.json")
    pool = MemoryPool(str(model), n_ctx=2048, resident_agents=2, n_threads=1, prefetch=False,
                      archive_path=str(tmp / "agents.db"))
    try:
        app = create_app(pool, settings=ServerSettings(default_max_tokens=1, **settings), keys=ring)
        with ServerThread(app) as srv, httpx.Client(base_url=srv.base_url, timeout=60) as http:
            srv.pool, srv.http = pool, http
            yield srv
    finally:
        pool.close()


def ask(srv: Any, key: str | None, text: str, history: list[dict[str, str]] | None = None,
        **extra: Any) -> httpx.Response:
    """One anonymous chat call: `history` then `text` as the user's turn."""
    messages = [*(history or []), {"role": "user", "content": text}]
    return srv.http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1, **extra.pop("body", {})},
                         headers={**auth(key), **extra})


def agents(srv: Any, key: str | None) -> list[str]:
    r = srv.http.get("/agents", headers=auth(key))
    assert r.status_code == 200, r.text
    return [a["id"] for a in r.json()["data"]]


# --------------------------------------------------------------------------- F3: lifecycle


def test_a_key_used_normally_never_hits_the_agent_wall(tiny_model_path: Path, tmp_path: Path) -> None:
    """#33 F3: every new conversation without an id was an agent never forgotten: past `max_agents` the key got
    429 on every route. Now its least recently used conversation is forgotten; its named agents are kept."""
    keys = [{"key": KEY_A, "prefix": "a/", "max_agents": 4}]
    with serving(tiny_model_path, tmp_path, keys, max_lines_per_key=0) as srv:
        r = srv.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 1, "user": "a/named"}, headers=auth(KEY_A))
        assert r.status_code == 200, r.text
        ids = []
        for i in range(7):
            r = ask(srv, KEY_A, f"question number {i} about rivers")
            assert r.status_code == 200, (i, r.text)
            ids.append(r.json()["agentmem"]["agent_id"])
        kept = agents(srv, KEY_A)
        assert "a/named" in kept and len(kept) <= 4, kept
        assert ids[-1] in kept and ids[0] not in kept, (ids, kept)


def test_conversations_past_the_cap_forget_the_least_recently_used(tiny_model_path: Path, tmp_path: Path) -> None:
    """#33 F3: the per-key cap forgets the least recently used conversation, not the one just continued."""
    with serving(tiny_model_path, tmp_path, [{"key": KEY_A, "prefix": "a/"}], max_lines_per_key=3) as srv:
        first = [{"role": "user", "content": "alpha one"}]
        r = ask(srv, KEY_A, "alpha one")
        one = r.json()["agentmem"]["agent_id"]
        reply = r.json()["choices"][0]["message"]["content"]
        two = ask(srv, KEY_A, "beta two").json()["agentmem"]["agent_id"]
        ask(srv, KEY_A, "gamma three")
        r = ask(srv, KEY_A, "and then?", [*first, {"role": "assistant", "content": reply}])  # one is used again
        assert r.json()["agentmem"]["agent_id"] == one and r.json()["agentmem"]["line"] == "continued", r.json()
        four = ask(srv, KEY_A, "delta four").json()["agentmem"]["agent_id"]
        kept = agents(srv, KEY_A)
        assert len(kept) == 3 and one in kept and four in kept and two not in kept, kept


def test_a_server_without_keys_is_bounded_too(tiny_model_path: Path, tmp_path: Path) -> None:
    """#33 F3: without keys (or with the admin key) nothing bounded the conversations kept."""
    with serving(tiny_model_path, tmp_path, max_lines_per_key=3) as srv:
        for i in range(6):
            assert ask(srv, None, f"open question {i}").status_code == 200
        assert len(agents(srv, None)) == 3, agents(srv, None)
        assert 'agentmem_conversations_total{action="forgotten_cap"} 3.0' in srv.http.get("/metrics").text


def test_idle_conversations_are_parked_then_forgotten_named_agents_kept(tiny_model_path: Path, tmp_path: Path) -> None:
    """#33 F3: parked -> archived -> dropped by idle time; a named agent is kept until it is forgotten."""
    with serving(tiny_model_path, tmp_path, line_park_s=0.4, line_idle_s=2.0) as srv:
        line = ask(srv, None, "a passing question").json()["agentmem"]["agent_id"]
        assert srv.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 1, "user": "named"}).status_code == 200
        deadline = time.monotonic() + 10
        while srv.http.get(f"/agents/{line}").json().get("tier") != "cold":
            assert time.monotonic() < deadline, srv.http.get(f"/agents/{line}").json()
            time.sleep(0.1)
        while srv.http.get(f"/agents/{line}").status_code != 404:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert srv.http.get("/agents/named").status_code == 200
        metrics = srv.http.get("/metrics").text
        assert ('agentmem_conversations_total{action="parked"} 1.0' in metrics
                and 'agentmem_conversations_total{action="forgotten_idle"} 1.0' in metrics), metrics


# --------------------------------------------------------------------------- F5, M2: ids


def test_admin_conversations_live_where_no_tenant_reaches(tiny_model_path: Path, tmp_path: Path) -> None:
    """#33 F5: the admin key's conversations were `conv-<hash>`: a key with prefix `c` listed and continued them."""
    keys = [{"key": ADMIN}, {"key": KEY_A, "prefix": "c"}]
    with serving(tiny_model_path, tmp_path, keys) as srv:
        r = ask(srv, ADMIN, "the admin's private question")
        aid = r.json()["agentmem"]["agent_id"]
        assert aid.startswith("@admin/key-"), aid
        assert aid not in agents(srv, KEY_A)
        history = [{"role": "user", "content": "the admin's private question"},
                   {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]}]
        r = ask(srv, KEY_A, "go on", history)
        assert r.json()["agentmem"]["agent_id"].startswith("cconv-") and r.json()["agentmem"]["line"] != "continued"
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert srv.http.get(f"/agents/{aid}", headers=auth(KEY_A)).status_code == 403
    with pytest.raises(ConfigError, match="@admin/"):
        ApiKey.make("sk-x", prefix="@")


def test_conversation_ids_say_nothing_of_the_prompt(tiny_model_path: Path, tmp_path: Path) -> None:
    """#33 M2: ids hashed the first prompt: the same suffix in two tenants showed who sent identical prompts."""
    keys = [{"key": KEY_A, "prefix": "a/"}, {"key": KEY_B, "prefix": "b/"}]
    with serving(tiny_model_path, tmp_path, keys) as srv:
        a = ask(srv, KEY_A, "the same words").json()["agentmem"]["agent_id"]
        b = ask(srv, KEY_B, "the same words").json()["agentmem"]["agent_id"]
        assert a.startswith("a/conv-") and b.startswith("b/conv-") and a[2:] != b[2:], (a, b)


# --------------------------------------------------------------------------- F7: quotas per exact key


def test_a_nested_key_does_not_spend_its_outer_keys_quota(tiny_model_path: Path, tmp_path: Path) -> None:
    """#33 F7: a nested key (`team-a/red/`) spent its outer key's (`team-a/`) agent quota."""
    keys = [{"key": KEY_A, "prefix": "t/", "max_agents": 2}, {"key": KEY_RED, "prefix": "t/red/", "max_agents": 2}]
    hi = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    with serving(tiny_model_path, tmp_path, keys) as srv:
        for agent in ("t/red/x", "t/red/y"):
            assert srv.http.post("/v1/chat/completions", json={**hi, "user": agent},
                                 headers=auth(KEY_RED)).status_code == 200
        for agent in ("t/x", "t/y"):
            r = srv.http.post("/v1/chat/completions", json={**hi, "user": agent}, headers=auth(KEY_A))
            assert r.status_code == 200, r.text
        r = srv.http.post("/v1/chat/completions", json={**hi, "user": "t/z"}, headers=auth(KEY_A))
        assert r.status_code == 429 and "has 2" in r.text, r.text


# --------------------------------------------------------------------------- F4: end users under one key

SECRET = [{"role": "system", "content": "you answer for alice only. her pin is 4 8 1 5. never say it. " * 3}]


def test_end_users_of_one_key_share_nothing(tiny_model_path: Path, tmp_path: Path) -> None:
    """#33 F4: prefix sharing plus `cached_tokens` let one end user read another's prompt through one key
    (a 4-digit PIN in 40 one-token calls). With `end_users`, lines, sharing and `cached_tokens` stay inside
    one end user (the `X-End-User` header, the `user` field, Anthropic's `metadata.user_id`)."""
    with serving(tiny_model_path, tmp_path, [{"key": KEY_A, "prefix": "a/"}], end_users=True) as srv:
        r = ask(srv, KEY_A, "what is my pin?", SECRET, body={"user": "alice"})
        alice = r.json()["agentmem"]["agent_id"]
        assert alice.startswith("a/@u/") and alice.split("/")[-1].startswith("conv-"), alice
        reply = r.json()["choices"][0]["message"]["content"]
        history = [*SECRET, {"role": "user", "content": "what is my pin?"}, {"role": "assistant", "content": reply}]
        r = ask(srv, KEY_A, "what is my pin?", SECRET, body={"user": "mallory"})  # the same prefix as alice's
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, r.json()
        r = ask(srv, KEY_A, "and again?", history, **{"X-End-User": "eve"})  # alice's whole conversation
        assert r.json()["agentmem"]["agent_id"] != alice and r.json()["agentmem"]["line"] != "continued"
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, r.json()
        msg = {"model": "m", "max_tokens": 1, "system": SECRET[0]["content"], "metadata": {"user_id": "trudy"},
               "messages": [{"role": "user", "content": "what is my pin?"}]}
        r = srv.http.post("/v1/messages", json=msg, headers=auth(KEY_A))
        assert r.status_code == 200 and r.json()["usage"]["cache_read_input_tokens"] == 0, r.json()
        r = ask(srv, KEY_A, "and again?", history, **{"X-End-User": "alice"})  # alice herself continues
        assert r.json()["agentmem"]["agent_id"] == alice and r.json()["agentmem"]["line"] == "continued", r.json()


def test_without_end_users_one_key_shares_its_prefixes(tiny_model_path: Path, tmp_path: Path) -> None:
    """The default (documented in docs/server.md "Tenant model"): inside one key, prefixes are shared and
    `user` names the agent; `end_users` is the opt-in that turns sharing across end users off."""
    with serving(tiny_model_path, tmp_path, [{"key": KEY_A, "prefix": "a/"}]) as srv:
        ask(srv, KEY_A, "what is my pin?", SECRET)
        r = ask(srv, KEY_A, "what is the time?", SECRET)
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, r.json()
        r = ask(srv, KEY_A, "hi", body={"user": "a/alice"})
        assert r.json()["agentmem"]["agent_id"] == "a/alice"


# --------------------------------------------------------------------------- F6: per-tenant listings


def test_model_listings_show_a_tenant_only_its_own(tiny_model_path: Path, tiny_qwen2_path: Path,
                                                   tmp_path: Path) -> None:
    """#33 F6: with several models `/v1/models` showed every key each model's agents across tenants, its calls
    in flight and its load counts (key B watched key A create a conversation and run a call); `/api/ps` too."""
    team = MemoryPool(models={"llama": str(tiny_model_path), "qwen": str(tiny_qwen2_path)}, archive_dir=tmp_path,
                      n_ctx=1024, resident_agents=2, n_threads=1, prefetch_models=False)
    (tmp_path / "keys.json").write_text(json.dumps({"keys": [{"key": ADMIN}, {"key": KEY_A, "prefix": "a/"},
                                                             {"key": KEY_B, "prefix": "b/"}]}))
    keys = KeyRing.build(keys_file=tmp_path / "keys.json")
    app = create_app(team, settings=ServerSettings(default_max_tokens=1), keys=keys)
    try:
        with ServerThread(app) as srv, httpx.Client(base_url=srv.base_url, timeout=60) as http:
            before = http.get("/v1/models", headers=auth(KEY_B)).json()
            r = http.post("/v1/chat/completions", headers=auth(KEY_A),
                          json={"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
            assert r.status_code == 200, r.text
            seen = http.get("/v1/models", headers=auth(KEY_B)).json()
            assert seen == before, (before, seen)  # nothing of A's call shows to B
            assert all(set(m["agentmem"]) == {"default", "device", "agents"}
                       and m["agentmem"]["agents"] == 0 for m in seen["data"]), seen
            listed = http.get("/v1/models", headers=auth(KEY_A)).json()["data"]
            mine = {m["id"]: m["agentmem"]["agents"] for m in listed}
            assert mine == {"llama": 0, "qwen": 1}, mine
            admin = http.get("/v1/models", headers=auth(ADMIN)).json()["data"]
            assert {m["id"]: m["agentmem"]["loads"] for m in admin}["qwen"] >= 1
            assert http.get("/api/ps", headers=auth(KEY_B)).json()["models"] == []
            assert [m["name"] for m in http.get("/api/ps", headers=auth(KEY_A)).json()["models"]] == ["qwen"]
    finally:
        team.close()


# --------------------------------------------------------------------------- M1: idempotent retries


def test_a_retry_with_a_request_id_gets_the_saved_answer(tiny_model_path: Path, tmp_path: Path) -> None:
    """#33 M1: a retry of a call whose answer never reached the client opened a new conversation (an extra
    agent). With `Idempotency-Key` (or `X-Request-Id`) it gets the saved answer, and no agent is added."""
    keys = [{"key": KEY_A, "prefix": "a/"}, {"key": KEY_B, "prefix": "b/"}]
    with serving(tiny_model_path, tmp_path, keys) as srv:
        first = ask(srv, KEY_A, "a question worth retrying", **{"Idempotency-Key": "req-1"})
        assert first.status_code == 200 and "idempotent-replayed" not in first.headers
        n = len(agents(srv, KEY_A))
        again = ask(srv, KEY_A, "a question worth retrying", **{"Idempotency-Key": "req-1"})
        assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true", again.headers
        assert again.json() == first.json() and again.headers["x-agent-id"] == first.json()["agentmem"]["agent_id"]
        assert len(agents(srv, KEY_A)) == n
        other = ask(srv, KEY_A, "another question", **{"Idempotency-Key": "req-1"})
        assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused", other.text
        b = ask(srv, KEY_B, "a question worth retrying", **{"Idempotency-Key": "req-1"})  # another key's id
        assert b.status_code == 200 and "idempotent-replayed" not in b.headers
        r = ask(srv, KEY_A, "by request id", **{"X-Request-Id": "r-9"})
        assert ask(srv, KEY_A, "by request id", **{"X-Request-Id": "r-9"}).json() == r.json()
