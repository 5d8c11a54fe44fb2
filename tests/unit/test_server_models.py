"""`agentmem serve` over several models (issue #26, the server half): routing, errors, leases, listings.

On the tiny random-weight models (a `llama` and a `qwen2` GGUF) served by one `MemoryPool` of two models:
these tests check which model a request runs on, the typed errors, that a call holds its
model loaded, that conversation lines stay per model, and what the listings say. The
two bundled models through the `openai` client are `tests/integration/test_models_serve_real.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

import httpx  # noqa: E402

from agentmem.errors import ConfigError, ModelBudgetError, ModelMismatchError, UnknownModelError  # noqa: E402
from agentmem.models import MemoryPool, ModelLease  # noqa: E402
from agentmem.server import ServerSettings, create_app  # noqa: E402
from agentmem.server.auth import Principal  # noqa: E402
from agentmem.server.cli import add_arguments, build  # noqa: E402
from agentmem.server.http_errors import from_exception  # noqa: E402
from agentmem.server.identity import resolve_agent_id  # noqa: E402
from agentmem.server.model_flags import ServedModels, models_of  # noqa: E402
from agentmem.models.seats import alease  # noqa: E402
from agentmem.server.schemas import ChatCompletionRequest  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

HI = [{"role": "user", "content": "hi"}]


def _team(paths: dict[str, Path], tmp: Path, **kw: Any) -> MemoryPool:
    return MemoryPool(models={k: str(v) for k, v in paths.items()}, archive_dir=tmp, n_ctx=1024, resident_agents=2,
                      n_threads=1, prefetch_models=False, **kw)


@pytest.fixture(scope="module")
def server(tiny_model_path: Path, tiny_qwen2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    team = _team({"llama": tiny_model_path, "qwen": tiny_qwen2_path}, tmp_path_factory.mktemp("team"))
    app = create_app(team, settings=ServerSettings(default_max_tokens=4))
    with ServerThread(app) as srv:
        srv.team = team
        yield srv
    team.close()


def _chat(srv: Any, body: dict[str, Any], path: str = "/v1/chat/completions", **headers: str) -> httpx.Response:
    return httpx.post(f"{srv.base_url}{path}", content=json.dumps({"max_tokens": 2, **body}),
                      headers={"content-type": "application/json", **headers}, timeout=60.0)


# ------------------------------------------------------------------ routing
def test_the_request_model_picks_the_model_and_binds_the_agent(server: Any) -> None:
    a = _chat(server, {"model": "llama", "user": "r-a", "messages": HI}).json()
    b = _chat(server, {"model": "qwen", "user": "r-b", "messages": HI}).json()
    assert (a["model"], b["model"]) == ("llama", "qwen")
    assert server.team.model_of("r-a") == "llama" and server.team.model_of("r-b") == "qwen"
    again = _chat(server, {"user": "r-b", "messages": HI}).json()  # no model: the agent's own
    assert again["model"] == "qwen" and again["agentmem"]["kv"] in ("reused", "restored")
    assert _chat(server, {"user": "r-new", "messages": HI}).json()["model"] == "llama"  # new, unnamed: the default


def test_an_unknown_model_is_a_404_naming_the_field_in_every_api_shape(server: Any) -> None:
    r = _chat(server, {"model": "gpt-4o", "user": "u-x", "messages": HI})
    assert r.status_code == 404
    err = r.json()["error"]
    assert (err["code"], err["param"], err["type"]) == ("model_not_found", "model", "not_found_error")
    assert "'gpt-4o'" in err["message"] and "llama, qwen" in err["message"]
    o = _chat(server, {"model": "gpt-4o", "messages": HI, "stream": False}, path="/api/chat")
    assert o.status_code == 404 and "gpt-4o" in o.json()["error"]
    m = _chat(server, {"model": "gpt-4o", "max_tokens": 2, "messages": HI}, path="/v1/messages")
    assert m.status_code == 404 and m.json()["type"] == "error"
    assert server.team.model_of("u-x") is None  # nothing was bound


def test_an_agent_sent_with_another_model_is_refused_naming_model(server: Any) -> None:
    assert _chat(server, {"model": "llama", "user": "mm", "messages": HI}).status_code == 200
    r = _chat(server, {"model": "qwen", "user": "mm", "messages": HI})
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("model_mismatch", "model")
    assert "bound to model 'llama'" in err["message"]


def test_ollama_names_with_the_latest_tag_and_the_load_answer(server: Any) -> None:
    r = _chat(server, {"model": "qwen:latest", "messages": HI, "stream": False, "agent_id": "oll"}, path="/api/chat")
    assert r.status_code == 200 and r.json()["model"] == "qwen"
    load = _chat(server, {"model": "qwen", "messages": []}, path="/api/chat").json()
    assert load["done_reason"] == "load" and load["model"] == "qwen"


# ------------------------------------------------------------------ lines and per-key agents per model
def test_conversation_lines_stay_per_model(server: Any) -> None:
    """The same history on two models: two agents, each continued only by its own model's calls."""
    first = [{"role": "user", "content": "Plan a picnic for the team."}]
    a = _chat(server, {"model": "llama", "messages": first}).json()
    b = _chat(server, {"model": "qwen", "messages": first}).json()
    ida, idb = a["agentmem"]["agent_id"], b["agentmem"]["agent_id"]
    assert ida != idb
    assert server.team.model_of(ida) == "llama" and server.team.model_of(idb) == "qwen"
    for model, reply, want in (("llama", a, ida), ("qwen", b, idb)):
        nxt = first + [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                       {"role": "user", "content": "And then?"}]
        r = _chat(server, {"model": model, "messages": nxt}).json()
        assert r["agentmem"]["agent_id"] == want and r["agentmem"]["line"] == "continued", r["agentmem"]


def test_same_tokenizer_models_derive_line_ids_apart(tiny_model_path: Path, tmp_path: Path) -> None:
    """Two names for one GGUF: one prompt's lines on each are two agents (ids are random since #33 M2; one a
    model already holds would be derived again under `{model}/`)."""
    copy = tmp_path / "copy.gguf"
    shutil.copy(tiny_model_path, copy)
    team = _team({"one": tiny_model_path, "two": copy}, tmp_path / "arc")
    with ServerThread(create_app(team, settings=ServerSettings(default_max_tokens=2))) as srv:
        a = _chat(srv, {"model": "one", "messages": HI}).json()["agentmem"]["agent_id"]
        b = _chat(srv, {"model": "two", "messages": HI}).json()["agentmem"]["agent_id"]
    team.close()
    assert a.startswith("conv-") and b.split("/")[-1].startswith("conv-") and a != b, (a, b)


def test_per_key_anonymous_agents_are_one_per_model() -> None:
    who = Principal(name="k1", prefix="t/", admin=False)
    kw: dict[str, Any] = {"header": None, "user": None, "extension": None, "anonymous": "per-key"}
    assert resolve_agent_id(who, **kw) == "t/anonymous-k1"
    assert resolve_agent_id(who, model="qwen", **kw) == "t/anonymous-k1@qwen"


# ------------------------------------------------------------------ a call holds its model
def _one_model_budget(paths: dict[str, Path], tmp: Path) -> int:
    """A RAM budget that holds either tiny model loaded, not both."""
    probe = _team(paths, tmp)
    for name in paths:
        probe.engine(name)
    sizes = {m["name"]: m["weights_bytes"] + m["ctx_bytes"] for m in probe.models()}
    probe.close()
    return max(sizes.values()) + min(sizes.values()) // 2


def test_a_running_call_keeps_its_model_loaded_until_it_ends(tiny_model_path: Path, tiny_qwen2_path: Path,
                                                            tmp_path: Path) -> None:
    """A budget for one model: while a call streams on one (paused after its first token), the other
    cannot load (ModelBudgetError, 503 `model_unavailable` over HTTP); once it ends, it can."""
    paths = {"llama": tiny_model_path, "qwen": tiny_qwen2_path}
    team = _team(paths, tmp_path / "arc", ram_budget_bytes=_one_model_budget(paths, tmp_path / "probe"),
                 load_wait_s=0.3)
    app = create_app(team, settings=ServerSettings(default_max_tokens=8))
    eng, who = app.state.engine, Principal(name="local")

    async def scenario() -> None:
        target = await eng.seat("long", "llama")
        lease = eng.admit(who)  # what `bodies.json_body` and `serving.find_agent` do
        lease.then(target.release)
        await eng.admit_call(lease, target)
        call = await eng.prepare_chat(target, ChatCompletionRequest.model_validate({"messages": HI}).to_call())
        events = eng.run(call, target)
        assert (await anext(events))[0] == "text" and team.tier.slots["llama"].uses == 1
        with pytest.raises(ModelBudgetError):
            await eng.seat("other", "qwen")
        await events.aclose()
        lease.release()  # what `respond` does when the stream ends
        assert team.tier.slots["llama"].uses == 0
        (await eng.seat("other", "qwen")).release()

    asyncio.run(scenario())
    assert [m["state"] for m in team.models()] == ["unloaded", "loaded"]
    with ServerThread(app) as srv:  # the HTTP answer to a model that cannot load, and a stream's lease
        with httpx.stream("POST", f"{srv.base_url}/v1/chat/completions", timeout=60.0,
                          json={"model": "llama", "user": "s", "messages": HI, "stream": True}) as stream:
            assert any(line.startswith("data: [DONE]") for line in stream.iter_lines())
        deadline = time.monotonic() + 5  # the stream's end releases the lease just after its last chunk
        while team.tier.slots["llama"].uses and time.monotonic() < deadline:
            time.sleep(0.01)
        assert team.tier.slots["llama"].uses == 0
        team.tier.acquire("llama")  # a call in flight on llama
        r = _chat(srv, {"model": "qwen", "user": "other", "messages": HI})
        team.tier.release("llama")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_unavailable", r.text
        assert r.headers["retry-after"] == "5"
    team.close()


def test_a_lease_taken_for_a_request_gone_is_released(tiny_model_path: Path, tmp_path: Path) -> None:
    """A request cancelled while its model loads gives the lease back once the load ends."""
    team = _team({"llama": tiny_model_path}, tmp_path)
    gate = threading.Event()
    taken: list[ModelLease] = []

    def slow_take() -> ModelLease:
        gate.wait(5)
        lease = team.lease(model="llama")
        taken.append(lease)
        return lease

    async def scenario() -> None:
        task = asyncio.ensure_future(alease(slow_take, call=lambda fn, *a: asyncio.to_thread(fn, *a)))
        await asyncio.sleep(0.05)
        task.cancel()
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)

    asyncio.run(scenario())
    assert taken and taken[0].released and team.tier.slots["llama"].uses == 0
    team.close()


# ------------------------------------------------------------------ listings
def test_v1_models_lists_every_model_with_its_state(server: Any) -> None:
    data = httpx.get(f"{server.base_url}/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["llama", "qwen"]
    first = data[0]["agentmem"]
    assert first["default"] is True and first["state"] in ("loaded", "unloaded") and first["weights_bytes"] > 0
    assert set(first) >= {"state", "weights_bytes", "ctx_bytes", "agents", "loads", "unloads", "in_use"}


def test_ollama_tags_and_ps_list_the_models(server: Any) -> None:
    _chat(server, {"model": "qwen", "user": "tags", "messages": HI})
    tags = httpx.get(f"{server.base_url}/api/tags").json()["models"]
    assert [t["name"] for t in tags] == ["llama", "qwen"] and all(t["size"] > 0 and t["digest"] for t in tags)
    ps = httpx.get(f"{server.base_url}/api/ps").json()["models"]
    assert "qwen" in [p["name"] for p in ps] and all(p["context_length"] == 1024 for p in ps)
    show = httpx.post(f"{server.base_url}/api/show", json={"model": "qwen"}).json()
    assert show["details"]["family"] == "qwen2"


def test_agents_show_their_model_and_actions_route_to_it(server: Any) -> None:
    _chat(server, {"model": "qwen", "user": "ag-q", "messages": HI})
    listed = {a["id"]: a for a in httpx.get(f"{server.base_url}/agents").json()["data"]}
    assert listed["ag-q"]["model"] == "qwen"
    one = httpx.get(f"{server.base_url}/agents/ag-q").json()
    assert one["model"] == "qwen" and one["tokens"] > 0
    parked = httpx.post(f"{server.base_url}/agents/ag-q?action=park", json={"tier": "warm"}).json()
    assert parked["tier"] == "warm"
    assert httpx.get(f"{server.base_url}/agents/nobody").status_code == 404
    assert httpx.delete(f"{server.base_url}/agents/ag-q").status_code in (200, 204)
    assert server.team.model_of("ag-q") is None  # forgetting ends the binding


def test_an_unloaded_models_agents_are_listed_from_its_archive(tiny_model_path: Path, tiny_qwen2_path: Path,
                                                              tmp_path: Path) -> None:
    team = _team({"llama": tiny_model_path, "qwen": tiny_qwen2_path}, tmp_path)
    with ServerThread(create_app(team, settings=ServerSettings(default_max_tokens=2))) as srv:
        _chat(srv, {"model": "qwen", "user": "arc-q", "messages": HI})
        assert team.unload("qwen")
        listed = {a["id"]: a for a in httpx.get(f"{srv.base_url}/agents").json()["data"]}
        assert listed["arc-q"]["model"] == "qwen" and listed["arc-q"]["tier"] == "cold"
        assert listed["arc-q"]["tokens"] > 0 and listed["arc-q"]["calls"] is None  # not kept by the archive
        assert team.models()[1]["state"] == "unloaded"  # listing did not load it
    team.close()


def test_metrics_carry_a_model_label(server: Any) -> None:
    _chat(server, {"model": "llama", "user": "met", "messages": HI})
    text = httpx.get(f"{server.base_url}/metrics").text
    assert 'agentmem_agents{model="llama"}' in text
    assert 'agentmem_model_loaded{model="llama"} 1.0' in text and 'agentmem_model_loaded{model="qwen"}' in text
    assert 'agentmem_tier_agents{model="llama",tier="hot"}' in text


def _call_counts(srv: Any) -> dict[tuple[str, str], float]:
    """`(series, model) -> value` of the call-level series of `/metrics` (requests: the 200s of chat only)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{srv.base_url}/metrics").text):
        for x in family.samples:
            labels = dict(x.labels)
            if x.name == "agentmem_requests_total":
                if (labels["route"], labels["status"]) == ("/v1/chat/completions", "200"):
                    out[(x.name, labels["model"])] = x.value
                elif labels["status"] == "404":
                    out[("404", labels["model"])] = out.get(("404", labels["model"]), 0) + x.value
            elif x.name in ("agentmem_prompt_tokens_cached_total", "agentmem_prompt_tokens_prefilled_total",
                            "llamacpp:tokens_predicted_total", "agentmem_ttft_seconds_count"):
                out[(x.name, labels["model"])] = out.get((x.name, labels["model"]), 0) + x.value
    return out


def test_metrics_split_requests_and_tokens_by_the_model_each_call_ran_on(server: Any) -> None:
    """The call series (requests, tokens, TTFT) carry the model the call ran on, never a name a request made up."""
    before = _call_counts(server)
    sent: dict[str, list[dict[str, Any]]] = {"llama": [], "qwen": []}
    for model, user in (("llama", "pm-a"), ("llama", "pm-a"), ("qwen", "pm-b")):
        sent[model].append(_chat(server, {"model": model, "user": user, "messages": HI}).json()["usage"])
    assert _chat(server, {"model": "gpt-4o", "user": "pm-x", "messages": HI}).status_code == 404
    after = _call_counts(server)

    def grew(series: str, model: str) -> float:
        return after.get((series, model), 0) - before.get((series, model), 0)

    for model, usages in sent.items():
        assert grew("agentmem_requests_total", model) == len(usages), (model, before, after)
        assert grew("agentmem_ttft_seconds_count", model) == len(usages)
        cached = grew("agentmem_prompt_tokens_cached_total", model)
        prompt = cached + grew("agentmem_prompt_tokens_prefilled_total", model)
        assert prompt == sum(u["prompt_tokens"] for u in usages) > 0, (model, usages)
        assert cached == sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
        assert grew("llamacpp:tokens_predicted_total", model) == sum(u["completion_tokens"] for u in usages)
    assert grew("404", "") == 1  # the unknown model picked none: no `gpt-4o` label
    assert {m for (_, m) in after} <= {"llama", "qwen", ""}, sorted(after)


# ------------------------------------------------------------------ errors and flags
def test_model_errors_map_to_typed_http_errors() -> None:
    assert from_exception(UnknownModelError("model: no model 'x'")).status == 404
    mm = from_exception(ModelMismatchError("model: agent 'a' is bound", agent_id="a", bound="p", asked="c"))
    assert (mm.status, mm.code, mm.param) == (400, "model_mismatch", "model")
    busy = from_exception(ModelBudgetError("does not fit"))
    assert (busy.status, busy.code) == (503, "model_unavailable") and busy.headers == {"Retry-After": "5"}


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_flags_one_model_stays_a_pool_config_several_make_served_models(tmp_path: Path) -> None:
    config, _, _ = build(_args("--model", "/m/a.gguf"))
    assert type(config).__name__ == "PoolConfig" and config.model_path == "/m/a.gguf"
    for name in ("b.gguf", "c.gguf"):
        (tmp_path / name).write_bytes(b"")
    served, _, _ = build(_args("--model", "gemma-3-270m", "--models-dir", str(tmp_path), "--ram-budget", "100",
                               "--archive", str(tmp_path / "arc"), "--n-ctx", "512"))
    assert isinstance(served, ServedModels)
    assert list(served.models) == ["gemma-3-270m", "b", "c"] and served.default == "gemma-3-270m"
    assert served.ram_budget_bytes == 100 and served.config.n_ctx == 512 and served.config.model_path is None
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "solo.gguf").write_bytes(b"")
    alone, settings, _ = build(_args("--models-dir", str(tmp_path / "one")))  # one GGUF: served as one model
    assert type(alone).__name__ == "PoolConfig" and alone.model_path == str(tmp_path / "one" / "solo.gguf")


def test_flags_refuse_what_several_models_cannot_mean(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--model-name serves one model"):
        build(_args("--model", "/a.gguf", "--model", "/b.gguf", "--model-name", "x"))
    with pytest.raises(ConfigError, match="need several models"):
        build(_args("--model", "/a.gguf", "--ram-budget", "5"))
    with pytest.raises(ConfigError, match="two models are named 'a'"):
        models_of(["/x/a.gguf", "/y/a.gguf"], None)
    with pytest.raises(ConfigError, match="no \\*.gguf"):
        models_of(None, str(tmp_path))
    (tmp_path / "f.db").write_bytes(b"")
    with pytest.raises(ConfigError, match="--archive: with several models it is a directory"):
        build(_args("--model", "/a.gguf", "--model", "/b.gguf", "--archive", str(tmp_path / "f.db")))


def test_forgetting_an_agent_bound_by_a_refused_first_call_ends_its_binding(server: Any) -> None:
    """A binding without KV (its first call failed after its model was chosen) is not a trap: DELETE ends it."""
    server.team.bind("ghost", "qwen")
    assert httpx.delete(f"{server.base_url}/agents/ghost").status_code == 404
    assert server.team.model_of("ghost") is None
    assert _chat(server, {"model": "llama", "user": "ghost", "messages": HI}).status_code == 200
