"""#25 on the bundled instruct model: the official `openai` client with no agent id finds its kept KV."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from agentmem import MemoryPool  # noqa: E402
from agentmem.server import ServerSettings, create_app  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

pytestmark = pytest.mark.integration


def test_two_turns_without_an_agent_id_read_the_history_from_kept_kv(instruct_model_path: Path) -> None:
    """#25: no X-Agent-Id, no `user`: the second turn continues the first's line (cached >= its prompt)."""
    pool = MemoryPool(str(instruct_model_path), n_ctx=4096, resident_agents=1, n_threads=1)
    try:
        with ServerThread(create_app(pool, settings=ServerSettings(model_name="qwen"))) as srv, \
                openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0) as client:
            msgs = [{"role": "system", "content": "Answer in one short sentence."},
                    {"role": "user", "content": "Name a fruit."}]
            first = client.chat.completions.create(model="qwen", messages=msgs, max_tokens=16)
            other = client.chat.completions.create(model="qwen", max_tokens=8, messages=[
                msgs[0], {"role": "user", "content": "Name a colour."}])  # another conversation in between
            msgs += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Another one."}]
            second = client.chat.completions.create(model="qwen", messages=msgs, max_tokens=16)
            a1, a2 = first.model_extra["agentmem"], second.model_extra["agentmem"]
            assert a1["agent_id"] == a2["agent_id"] != other.model_extra["agentmem"]["agent_id"]
            assert a2["line"] == "continued" and a2["kv"] == "restored"
            assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    finally:
        pool.close()
