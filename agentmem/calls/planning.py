"""`plan_chat`: a chat call's `CallPlan` from tools, a tool choice, a JSON reply or a raw grammar.

Tools are shown whatever the choice, so the agent's prompt prefix (and the KV kept for
it) does not change between forced and free calls: through the chat template for a
native format (`tools=`), else as agentmem's tools block at the end of the system message
(`show_tools`). A forced choice decodes under the format's grammar, its forced opening in
the prompt (`ToolFormat.forced`, the pool's `opening` for a native format); `auto`
generates freely and keeps the forced plan for a retry; `none` shows the tools, calls none,
and leaves a reply that opens like a call as written. A JSON reply decodes under
`JSON_OBJECT_GRAMMAR` or the schema's grammar, the schema shown in the prompt.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from agentmem.calls.plan import CallPlan
from agentmem.tools import ToolFormat, json_prompt, tools_prompt, with_system_block
from agentmem.tools.forced import forced_call_grammar, forced_json_grammar
from agentmem.tools.lazy import LazyGrammar, lazy_call_grammar

__all__ = ["forced_plan", "json_plan", "plan_chat", "show_tools"]


def show_tools(messages: list[dict[str, Any]], specs: Sequence[Mapping[str, Any]],
               fmt: ToolFormat) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and pool keywords that show `specs` (`{"name", "description", "parameters"}`) to the model.

    A native format gets them through the chat template (`{"tools": ...}`); otherwise
    agentmem's tools block ends the system message. No specs: both unchanged.
    """
    if not specs:
        return messages, {}
    if fmt.native:
        return messages, {"tools": [dict(s) for s in specs]}
    return with_system_block(messages, tools_prompt(list(specs))), {}


def forced_plan(base: CallPlan, prefix: str, grammar: str) -> CallPlan:
    """`base` with a call forced: `grammar` decodes the rest after `prefix`.

    A native call is sent back as `tool_calls`: the pool starts the reply with the prefix
    as the template renders it (`opening`), not as message text.
    """
    opening = {"opening": prefix} if base.fmt.native else {}
    return CallPlan(base.agent_id, base.messages, None, {**base.sampling, "grammar": grammar, **opening}, "tools",
                    prefix, base.tool_names, fmt=base.fmt, lenient=base.lenient, line=base.line)


def json_plan(base: CallPlan, schema: Mapping[str, Any] | None, *, sort_keys: bool = False) -> CallPlan:
    """`base` decoding a JSON reply (`schema`; `None`: any object), the schema shown in the prompt.

    `sort_keys`: key the grammar (and order its properties) by the sorted schema (the server's choice).
    """
    assert base.messages is not None, "a JSON reply needs a chat call"
    msgs = with_system_block(base.messages, json_prompt(schema))
    prefix, g = forced_json_grammar(None if schema is None else json.dumps(schema, sort_keys=sort_keys))
    return CallPlan(base.agent_id, msgs, None, {**base.sampling, "grammar": g}, "json", prefix, fmt=base.fmt,
                    line=base.line)


def _tool_plan(base: CallPlan, specs: Sequence[Mapping[str, Any]], choice: str, parallel: bool) -> CallPlan:
    """The plan of `choice` (`required`, one tool's name, `auto` or `none`) over the shown `specs`."""
    fmt = base.fmt
    names = tuple(str(s["name"]) for s in specs)
    base.tool_names = names
    tools_json = json.dumps([dict(s) for s in specs])
    parallel = parallel and fmt.parallel

    def forced(only: str | None = None) -> CallPlan:
        return forced_plan(base, *forced_call_grammar(fmt, tools_json, only, parallel))

    if choice == "required":
        return forced()
    if choice in names:
        return forced(choice)
    def lazy() -> LazyGrammar:
        return lazy_call_grammar(fmt, specs, parallel=parallel)

    if choice == "auto":
        base.mode, base.forced, base.lazy = "auto", forced, lazy
        return base
    # "none": shown, not called (a reply that opens like a call stays as written)
    return CallPlan(base.agent_id, base.messages, None, {**base.sampling, "canonical_calls": False}, fmt=fmt,
                    line=base.line)


def plan_chat(agent_id: str, messages: list[dict[str, Any]], sampling: Mapping[str, Any], fmt: ToolFormat, *,
              tools: Sequence[Mapping[str, Any]] = (), choice: str = "auto", parallel: bool = False,
              json_reply: bool = False, schema: Mapping[str, Any] | None = None, sort_keys: bool = False,
              grammar: str | None = None) -> CallPlan:
    """The `CallPlan` of one chat call.

    Args:
        agent_id: the agent.
        messages: the conversation as agentmem messages.
        sampling: the pool's sampling keywords (not modified).
        fmt: the model's tool-call format (`MemoryPool.tool_format`).
        tools: the offered tools (`{"name", "description", "parameters"}`, names unique).
        choice: `auto`, `none`, `required` or one tool's name (the front-end normalizes its own).
        parallel: allow several calls in one forced reply (where `fmt` can).
        json_reply: decode a JSON reply (`schema`, else any object); with tools only when `choice` is `none`.
        schema: the JSON reply's schema.
        sort_keys: see `json_plan`.
        grammar: a raw GBNF constraint (neither tools nor a JSON reply).

    The front-end has checked the combination (its own error types and wording).
    """
    base = CallPlan(agent_id, messages, None, dict(sampling), fmt=fmt)
    if grammar is not None:
        return base.with_sampling(grammar=grammar)
    if tools:
        base.messages, shown = show_tools(messages, tools, fmt)
        base.sampling.update(shown)
        base = _tool_plan(base, tools, choice, parallel)
        if choice != "none":
            return base
    return json_plan(base, schema, sort_keys=sort_keys) if json_reply else base
