"""One `agentmem serve` on the bundled instruct model, shared by the client tests.

Every test here drives a client library people use, in its *default* set-up: only
`base_url` and `api_key` change; no agent id, no extra header. The server runs with its
defaults too (`--anonymous lines`: a request without an agent id continues the kept
conversation its prompt extends). Tests keep to their own conversations (distinct
system prompts), so they can share the one server; `Served.agents()` reads `GET /agents`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

pytest.importorskip("fastapi")

import httpx  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.server import ServerSettings, create_app  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

MODEL = "qwen2.5-coder-0.5b-instruct"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass
class Served:
    """The shared server: `base_url` (no `/v1`), the model name it answers to, its pool."""

    base_url: str
    model: str
    pool: MemoryPool

    @property
    def v1(self) -> str:
        """`base_url + "/v1"`: what OpenAI-style clients take as `base_url`."""
        return f"{self.base_url}/v1"

    def agents(self) -> list[dict[str, Any]]:
        """`GET /agents`: every kept agent (conversation line) with its token counts."""
        r = httpx.get(f"{self.base_url}/agents", timeout=30.0)
        r.raise_for_status()
        body = r.json()
        return list(body["data"] if isinstance(body, dict) else body)


@pytest.fixture(scope="session")
def served(instruct_model_path: Path) -> Iterator[Served]:
    """`agentmem serve` defaults on the instruct model, for the whole client session."""
    pool = MemoryPool(str(instruct_model_path), n_ctx=8192, resident_agents=4, n_threads=1)
    try:
        app = create_app(pool, settings=ServerSettings(model_name=MODEL))
        with ServerThread(app) as srv:
            yield Served(base_url=srv.base_url, model=MODEL, pool=pool)
    finally:
        pool.close()
