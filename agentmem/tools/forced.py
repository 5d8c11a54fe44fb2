"""Forced grammars, built once per tool set or schema: the opening to put in the prompt, and the rest.

Every caller that forces a tool call or a JSON reply (the integrations, the server)
asks here, so a team of agents with the same tools builds each grammar once.
"""

from __future__ import annotations

import functools
import json

from agentmem.tools.formats import ToolFormat
from agentmem.tools.grammar import JSON_OBJECT_GRAMMAR, schema_grammar, split_forced_prefix

__all__ = ["forced_call_grammar", "forced_json_grammar"]


@functools.lru_cache(maxsize=256)
def forced_call_grammar(fmt: ToolFormat, tools_json: str, only: str | None, parallel: bool) -> tuple[str, str]:
    """`(forced prefix, grammar)` of a call in `fmt` to one of the tools in `tools_json` (or only `only`)."""
    tools = json.loads(tools_json)
    if only is not None:
        tools = [t for t in tools if t["name"] == only]
    return fmt.forced(tools, parallel=parallel)


@functools.lru_cache(maxsize=256)
def forced_json_grammar(schema_json: str | None) -> tuple[str, str]:
    """`(forced prefix, grammar)` of a JSON value matching `schema_json` (any object when None)."""
    grammar = JSON_OBJECT_GRAMMAR if schema_json is None else schema_grammar(json.loads(schema_json))
    return split_forced_prefix(grammar)
