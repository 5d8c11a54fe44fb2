"""The one tool-call protocol every integration speaks to the model.

`prompt.py` writes the instructions a model gets about tools and JSON replies, one text
for every framework.
`grammar.py` turns JSON schemas and tool lists into canonically spaced GBNF grammars on
llama-cpp-python's public converter, and splits off the text a grammar forces;
`int_range.py` writes integer ranges as rules.
`limits.py` bounds schemas and grammars (size, nesting, repetition counts, rule chains)
without recursion, before llama.cpp's recursive grammar parser sees them.
`formats.py` knows the tool-call syntax of each model family (Qwen/Hermes, Llama 3,
Mistral, agentmem's own envelope) as strategy objects: render, grammar, parse, detect.
`canonical.py` tells from a free reply's first characters whether it is a bare call object
that the format's opening (`<tool_call>`) should precede, for the pool's decode loop.
`forced.py` builds a forced call's or JSON reply's grammar once per tool set or schema
(cached), for the integrations and the server alike.
`lazy.py` builds the lazy grammar of a free tool turn (free text until a trigger, the
format's opening or a bare `{"name": "`, then the call's grammar) and the stream gate that
releases text as soon as no trigger can fire.
`parse.py` reads the `{"tool_calls": [...]}` envelope (strictly, or leniently out of free
text) and tells a stream when to hold a reply back.
`registry.py` keeps one shared pool per configuration in the process, closed by its last
holder or at exit.
`recall.py` is what every integration's memory shows the model: the pinned-facts block (and
the pinning of its message), evicted spans recalled and completed to whole lines.

No agent framework is imported here; `agentmem_langchain`, `agentmem_autogen` and
`agentmem_maf` adapt these to their own message and tool types.
"""

from __future__ import annotations

from .grammar import (
    JSON_OBJECT_GRAMMAR,
    call_or_document_grammar,
    choice_grammar,
    clean_schema,
    closed_parameters,
    integer_range,
    schema_grammar,
    split_forced_prefix,
    tool_call_continuation,
    tool_call_grammar,
)
from .formats import TOOL_FORMATS, ToolFormat, arguments_text, detect_tool_format, get_tool_format
from .parse import (
    TOOL_CALL_OPEN,
    ParsedCall,
    find_tool_calls,
    looks_like_tool_call,
    new_call_id,
    opens_tool_call,
    parse_envelope,
    text_before_json,
)
from .prompt import TOOL_CALL_FORMAT, json_prompt, prompt_schema, tools_prompt, with_system_block
from .registry import (PoolFactory, SharedPool, acquire, close_shared_pools, hold_pool, pool_key, register, release,
                       shared_pool)

__all__ = [
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
