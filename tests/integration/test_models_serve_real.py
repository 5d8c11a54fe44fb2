"""`agentmem serve` over the two bundled models, driven by the official `openai` client (issue #26).

The server half of several models in one pool: a request's `model` picks the model, each
agent keeps its KV on its own model across calls that alternate between the models,
`/v1/models` lists both, and a request that sends an agent with the other model is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import httpx  # noqa: E402

from agentmem.models import ModelPool  # noqa: E402
from agentmem.server import ServerSettings, create_app  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

pytestmark = pytest.mark.integration

GEMMA, QWEN = "gemma-3-270m", "qwen2.5-coder-0.5b-instruct"


def test_two_agents_on_two_models_alternate_and_keep_their_kv(gemma_model_path: Path, instruct_model_path: Path,
                                                              tmp_path: Path) -> None:
    team = ModelPool({GEMMA: str(gemma_model_path), QWEN: str(instruct_model_path)}, archive_dir=tmp_path,
                     n_ctx=2048, resident_agents=2, n_threads=1)
    app = create_app(team, settings=ServerSettings(default_max_tokens=8))
    with ServerThread(app) as srv, openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="-", max_retries=0) as client:
        listed = client.models.list().data
        assert [m.id for m in listed] == [GEMMA, QWEN]
        assert listed[0].model_extra["agentmem"]["default"] is True
        talks: dict[str, list[dict[str, Any]]] = {
            "planner": [{"role": "system", "content": "You plan. Answer in a few words."},
                        {"role": "user", "content": "What comes first in a tiny web page?"}],
            "coder": [{"role": "system", "content": "You write Python. Code only."},
                      {"role": "user", "content": "A function that adds two numbers."}]}
        models = {"planner": GEMMA, "coder": QWEN}
        seen: dict[str, list[Any]] = {"planner": [], "coder": []}
        for _ in range(2):
            for agent in ("planner", "coder"):  # the calls alternate between the two models
                r = client.chat.completions.create(model=models[agent], messages=talks[agent], user=agent, max_tokens=8)
                assert r.model == models[agent] and r.model_extra["agentmem"]["agent_id"] == agent
                seen[agent].append(r)
                talks[agent] += [{"role": "assistant", "content": r.choices[0].message.content},
                                 {"role": "user", "content": "And then?"}]
        for agent, (first, second) in seen.items():
            cached = second.usage.prompt_tokens_details.cached_tokens
            assert cached > 0 and cached >= first.usage.prompt_tokens, (agent, first.usage, second.usage)
            assert second.model_extra["agentmem"]["kv"] == "reused", second.model_extra["agentmem"]
        states = {m.id: m.model_extra["agentmem"]["state"] for m in client.models.list().data}
        assert states == {GEMMA: "loaded", QWEN: "loaded"}
        with pytest.raises(openai.BadRequestError) as wrong:
            client.chat.completions.create(model=QWEN, messages=talks["planner"], user="planner", max_tokens=8)
        assert wrong.value.code == "model_mismatch" and wrong.value.param == "model"
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(model="gpt-4o", messages=talks["planner"], user="planner", max_tokens=8)
        assert unknown.value.code == "model_not_found"
        agents = {a["id"]: a["model"] for a in httpx.get(f"{srv.base_url}/agents").json()["data"]}
        assert agents == {"planner": GEMMA, "coder": QWEN}
    team.close()
