"""`agentmem.tools`, the one tool-call protocol: its surface, its layering, its pool registry."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import agentmem.tools
from agentmem import MemoryPool, PoolConfig
from agentmem.tools import acquire, close_shared_pools, release, shared_pool


def test_public_api_is_pinned() -> None:
    assert agentmem.tools.__all__ == [
        "JSON_OBJECT_GRAMMAR",
        "TOOL_CALL_FORMAT",
        "TOOL_CALL_OPEN",
        "TOOL_FORMATS",
        "ParsedCall",
        "PoolFactory",
        "SharedPool",
        "ToolFormat",
        "acquire",
        "arguments_text",
        "call_or_document_grammar",
        "choice_grammar",
        "clean_schema",
        "close_shared_pools",
        "closed_parameters",
        "detect_tool_format",
        "find_tool_calls",
        "get_tool_format",
        "hold_pool",
        "integer_range",
        "json_prompt",
        "looks_like_tool_call",
        "new_call_id",
        "opens_tool_call",
        "parse_envelope",
        "pool_key",
        "prompt_schema",
        "register",
        "release",
        "schema_grammar",
        "shared_pool",
        "split_forced_prefix",
        "text_before_json",
        "tool_call_continuation",
        "tool_call_grammar",
        "tools_prompt",
        "with_system_block",
    ]


def test_no_agent_framework_is_imported() -> None:
    code = (
        "import sys, agentmem.tools, agentmem.tools.recall; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langchain_core', 'langchain', 'autogen_core', 'autogen_agentchat', "
        "'agentmem_langchain', 'agentmem_autogen', 'agent_framework', 'agentmem_maf')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_shared_and_acquired_pools_of_one_config_are_one_pool(tiny_model_path: Any) -> None:
    """Both integrations' registries were separate: one model loaded twice for the same config."""
    cfg = PoolConfig.build(model_path=str(tiny_model_path), n_ctx=256, resident_agents=1, n_threads=1)
    opened: list[MemoryPool] = []

    def factory(config: PoolConfig) -> MemoryPool:
        opened.append(MemoryPool(config=config))
        return opened[-1]

    try:
        pinned = shared_pool(cfg, factory)
        held, owned = acquire(cfg, factory)
        assert held is pinned and owned and len(opened) == 1
        release(held)
        assert not pinned.closed, "a pool handed out by shared_pool stays open until close_shared_pools"
    finally:
        close_shared_pools()
    assert pinned.closed
    again, owned = acquire(cfg, factory)
    assert again is not pinned and owned and len(opened) == 2
    release(again)
    assert again.closed, "the last release closes a pool only acquire() handed out"
