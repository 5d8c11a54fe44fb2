"""AgentMemMemory on the instruct model with a real SQLite archive: a fact evicted from the KV comes back.

`AssistantAgent(memory=[AgentMemMemory(...)])` with a token budget: the turn that
stated the fact is evicted (and archived with FTS), then a question about it brings
the archived text back into the model context through `update_context`, and the
model answers from it.
"""

from __future__ import annotations

import pytest

pytest.importorskip("autogen_agentchat")

from autogen_agentchat.agents import AssistantAgent  # noqa: E402
from autogen_agentchat.messages import MemoryQueryEvent  # noqa: E402
from autogen_core.models import SystemMessage  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem_autogen import AgentMemChatCompletionClient, AgentMemMemory  # noqa: E402
from agentmem_autogen._memory import RECALL_HEADER  # noqa: E402

pytestmark = pytest.mark.integration

FILLER = [
    "List three colours of the rainbow.",
    "Name a fruit that is yellow.",
    "What is two plus three?",
    "Name a large animal.",
    "Say one word about the sea.",
    "Name a day of the week.",
]


async def test_an_evicted_fact_comes_back_into_the_context(instruct_model_path, tmp_path) -> None:
    with MemoryPool(instruct_model_path, n_ctx=4096, resident_agents=2, n_threads=1,
                    archive_path=str(tmp_path / "agents.db")) as pool:
        pool.set_budget("clerk", 128)
        client = AgentMemChatCompletionClient(pool, agent_id="clerk", max_tokens=12)
        memory = AgentMemMemory(pool, agent_id="clerk", k=2)
        agent = AssistantAgent("clerk", model_client=client, memory=[memory],
                               system_message="You are a terse clerk. Answer in a few words.")
        await agent.run(task="Note this down: the storage room code is 4917.")
        for q in FILLER:
            await agent.run(task=q)
        live = pool.engine().model.detokenize(pool.tokens("clerk"))
        # the sentence stating the fact is out of the KV (a stray token of the reply may stay)
        assert "storage room" not in live, f"the fact is still in the KV: nothing to recall: {live!r}"
        assert pool.stats()["agents"]["clerk"]["evicted_tokens"] > 0
        result = await agent.run(task="What is the storage room code?")
        recalled = [e for e in result.messages if isinstance(e, MemoryQueryEvent)]
        assert recalled and any("storage room code is 4917" in str(c.content) for c in recalled[-1].content), recalled
        ctx = await agent._model_context.get_messages()
        assert any(isinstance(m, SystemMessage) and m.content.startswith(RECALL_HEADER) and "4917" in m.content
                   for m in ctx)
        answer = result.messages[-1].content
        print("answer:", answer)
        assert "4917" in answer, answer
