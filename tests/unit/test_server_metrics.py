"""`ServerMetrics`: the server's call-level series labelled by the model each call ran on.

No model is loaded: pool calls are `ChatResult`s made up here, the pool series are absent
(no pool). The same series through a served app, on the tiny models, are in
`test_server_models.py` (two models) and `test_server_openai.py` (one).
"""

from __future__ import annotations

import asyncio
import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from agentmem.pool import ChatResult  # noqa: E402
from agentmem.pool.results import Timings, Usage  # noqa: E402
from agentmem.server.metrics import ServerMetrics, note_model, request_model  # noqa: E402


def _metrics(*names: str) -> ServerMetrics:
    return ServerMetrics(lambda: None, processing=lambda: 0, deferred=lambda: 0, model_names=lambda: names)


def _result(prompt: int, cached: int, completion: int, kv: str = "prefilled", ttft: float = 0.02) -> ChatResult:
    return ChatResult(agent_id="a", text="", finish_reason="stop", kv=kv,
                      usage=Usage(prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion),
                      timings=Timings(ttft_s=ttft, prefill_s=0.5, decode_s=0.25))


def samples(m: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the render: `(name, sorted labels) -> value`."""
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def by_model(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> dict[str, float]:
    """`{model: value}` of a series labelled by `model` only."""
    return {dict(labels)["model"]: v for (n, labels), v in found.items() if n == name and len(labels) == 1}


def test_call_series_are_split_by_the_model_each_call_ran_on() -> None:
    m = _metrics("coder", "planner")
    m.observe_call(_result(10, 4, 3), model="planner")
    m.observe_call(_result(7, 0, 2, kv="restored"), model="planner")
    m.observe_call(_result(5, 5, 1, kv="reused"), model="coder")
    found = samples(m)
    assert by_model(found, "llamacpp:prompt_tokens_total") == {"coder": 0, "planner": 13}
    assert by_model(found, "agentmem_prompt_tokens_prefilled_total") == {"coder": 0, "planner": 13}
    assert by_model(found, "agentmem_prompt_tokens_cached_total") == {"coder": 5, "planner": 4}
    assert by_model(found, "llamacpp:tokens_predicted_total") == {"coder": 1, "planner": 5}
    assert by_model(found, "llamacpp:prompt_seconds_total") == {"coder": 0.5, "planner": 1.0}
    assert by_model(found, "llamacpp:prompt_tokens_seconds") == {"coder": 0.0, "planner": 13.0}
    assert found[("agentmem_ttft_seconds_count", (("kv", "restored"), ("model", "planner")))] == 1
    assert found[("agentmem_ttft_seconds_count", (("kv", "reused"), ("model", "coder")))] == 1
    assert ("agentmem_ttft_seconds_count", (("kv", "reused"), ("model", "planner"))) not in found


def test_every_configured_model_has_its_series_before_its_first_call() -> None:
    found = samples(_metrics("coder", "planner"))
    assert by_model(found, "llamacpp:prompt_tokens_total") == {"coder": 0, "planner": 0}
    assert by_model(found, "agentmem_prompt_tokens_cached_total") == {"coder": 0, "planner": 0}
    assert found[("agentmem_client_disconnects_total", ())] == 0  # server-wide, no label


def test_a_name_outside_the_configuration_counts_under_the_empty_label() -> None:
    """Cardinality is bounded by the configured names: anything else is `model=""`, never a new series."""
    m = _metrics("coder", "planner")
    m.observe_call(_result(3, 0, 1), model="gpt-4o")
    m.observe_request("/v1/chat/completions", 404, model="gpt-4o")
    m.observe_request("/health", 200)  # several models, none picked
    found = samples(m)
    assert by_model(found, "llamacpp:prompt_tokens_total") == {"": 3, "coder": 0, "planner": 0}
    models = {dict(labels)["model"] for (n, labels) in found if n == "agentmem_requests_total"}
    assert models == {""}


def test_with_one_model_every_request_carries_its_name() -> None:
    m = _metrics("tiny")
    m.observe_request("/health", 200)
    m.observe_request("/v1/chat/completions", 200, model="tiny")
    m.observe_call(_result(4, 0, 2))
    found = samples(m)
    route = {dict(labels)["route"]: (dict(labels)["model"], v) for (n, labels), v in found.items()
             if n == "agentmem_requests_total"}
    assert route == {"/health": ("tiny", 1), "/v1/chat/completions": ("tiny", 1)}
    assert by_model(found, "llamacpp:prompt_tokens_total") == {"tiny": 4}


def test_a_model_noted_in_a_spawned_task_reaches_the_request() -> None:
    """The cell survives the context copy of a task the request starts (a streaming response's)."""

    async def seated() -> None:
        note_model("coder")

    async def request() -> list[str]:
        with request_model() as cell:
            await asyncio.create_task(seated())
            return cell

    assert asyncio.run(request()) == ["coder"]
    note_model("ignored")  # outside a request: nothing to fill, no error

