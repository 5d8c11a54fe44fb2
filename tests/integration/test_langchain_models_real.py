"""ChatAgentMem over a ModelPool on the two bundled models (issue #26): agents on each model keep their KV.

A planner on Gemma 3 270M and a coder on Qwen2.5-Coder-0.5B-Instruct, one
`ChatAgentMem` each over one `ModelPool`; their calls alternate between the models and
each agent's later calls (the third one streamed) read its earlier calls' KV. The fakes in
`tests/unit/test_langchain_models.py` pin the leases; this is the real run that
`docs/models.md` ("LangChain, AutoGen and MAF over a pool of several models") quotes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from agentmem.errors import ModelMismatchError
from agentmem.models import ModelPool
from agentmem_langchain import ChatAgentMem

pytestmark = pytest.mark.integration

logger = logging.getLogger(__name__)


def test_chat_models_on_two_models_alternate_and_reuse_their_kv(gemma_model_path: Path, instruct_model_path: Path,
                                                                 tmp_path: Path) -> None:
    team = ModelPool({"planner": str(gemma_model_path), "coder": str(instruct_model_path)}, archive_dir=tmp_path,
                     n_ctx=1024, resident_agents=2, n_threads=1)
    with team:
        chats = {"plan": ChatAgentMem(pool=team, agent_id="plan", model="planner", max_tokens=8),
                 "code": ChatAgentMem(pool=team, agent_id="code", model="coder", max_tokens=8)}
        history = {"plan": [SystemMessage("You are the planner. Answer in a few words."),
                            HumanMessage("Plan step one of a tiny web page.")],
                   "code": [SystemMessage("You are the coder. Answer with code only."),
                            HumanMessage("Write a Python function that adds two numbers.")]}
        seen = []
        for turn in range(3):
            for agent, chat in chats.items():
                msg = chat.invoke(history[agent]) if turn < 2 else _streamed(chat, history[agent])
                meta, usage = msg.response_metadata, msg.usage_metadata or {}
                cached = usage.get("input_token_details", {}).get("cache_read", 0)
                seen.append((turn, agent, meta["model_name"], meta["kv"], usage.get("input_tokens"), cached))
                logger.info("turn %d %s on %s: kv=%s input_tokens=%s cache_read=%s", *seen[-1])
                history[agent] += [AIMessage(str(msg.content)), HumanMessage("And then?")]
        assert [s[2] for s in seen] == ["planner", "coder"] * 3
        assert [s[3] for s in seen[:2]] == ["prefilled", "prefilled"]
        for _, agent, _, kv, _, cached in seen[2:]:
            assert kv in ("reused", "restored") and cached > 0, seen
        with pytest.raises(ModelMismatchError):  # refused before anything runs
            ChatAgentMem(pool=team, agent_id="plan", model="coder").invoke("hi")
        states = {m["name"]: (m["state"], m["in_use"], m["agents"]) for m in team.models()}
        logger.info("models: %s", states)
        assert states == {"planner": ("loaded", 0, 1), "coder": ("loaded", 0, 1)}


def _streamed(chat: ChatAgentMem, messages: list) -> AIMessage:
    """`chat.stream(messages)` joined into one message (usage and metadata ride on the last chunk)."""
    full = None
    for chunk in chat.stream(messages):
        full = chunk if full is None else full + chunk
    assert full is not None
    return AIMessage(content=full.content, response_metadata=full.response_metadata, usage_metadata=full.usage_metadata)
