"""The plan of one `create` call: which tools the reply may or must call, the output grammar, the forced prefix and the redo of a malformed call, decided and validated before anything is generated."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from autogen_core.tools import Tool
from pydantic import BaseModel

from agentmem.tools import (
    JSON_OBJECT_GRAMMAR,
    ToolFormat,
    choice_grammar,
    get_tool_format,
    opens_tool_call,
    schema_grammar,
    tools_prompt,
    with_system_block,
)

from ._messages import candidate_names

SAMPLING_ARGS: frozenset[str] = frozenset(
    {
        "max_tokens", "temperature", "top_k", "top_p", "min_p",
        "repeat_penalty", "repeat_last_n", "seed", "stop", "grammar",
    }
)
"""Keys accepted in `create_args` and in `extra_create_args` of a call."""


@dataclass(slots=True)
class _Plan:
    """What one `create` call will do (built and validated before any generation)."""

    agent_id: str
    messages: list[dict[str, Any]]
    sampling: dict[str, Any]
    grammar: Optional[str]  # constraint of the first generation
    tool_names: list[str] = field(default_factory=list)  # tools the reply may call
    prefix: Optional[str] = None  # start of the reply, given in the prompt (forced tool call)
    retry: Optional[tuple[str, str]] = None  # (prefix, grammar) redoing a malformed call in auto mode
    stream_text: bool = True  # pieces are text for the caller (not a tool call)
    fmt: ToolFormat = field(default_factory=lambda: get_tool_format("envelope"))  # the model's call syntax

    @property
    def forced(self) -> bool:
        return self.prefix is not None


def check_args(args: Mapping[str, Any], where: str) -> None:
    """Reject keys of `args` that are not `SAMPLING_ARGS`.

    Args:
        args: `create_args` or `extra_create_args`.
        where: the argument's name, for the error.

    Raises:
        ValueError: an unknown key (all valid keys are listed).
    """
    unknown = sorted(set(args) - SAMPLING_ARGS)
    if unknown:
        raise ValueError(f"unknown {where} key(s) {unknown}; valid: {', '.join(sorted(SAMPLING_ARGS))}")


def with_tools(
    conv: list[dict[str, Any]], schemas: Sequence[Mapping[str, Any]], fmt: ToolFormat
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The conversation and pool keywords that show `schemas` to the model.

    A native tool format gets them through the chat template (`tools=`); otherwise
    agentmem's tools block ends the system message.
    """
    if not schemas:
        return conv, {}
    if fmt.native:
        shown = [{"name": s["name"], "description": s.get("description") or "", "parameters": s.get("parameters") or {}} for s in schemas]
        return conv, {"tools": shown}
    return with_system_block(conv, tools_prompt(schemas)), {}


def plan_call(
    agent: str,
    conv: list[dict[str, Any]],
    sampling: dict[str, Any],
    schemas: list[dict[str, Any]],
    shown: Sequence[Mapping[str, Any]],
    fmt: ToolFormat,
    tool_choice: Any,
    json_output: Any,
    *,
    parallel: bool,
    force_tools: bool,
    speaker_selection: bool,
) -> _Plan:
    """Decide what one call generates, under which grammar.

    Args:
        agent: the agent id the call runs for.
        conv: the conversation as agentmem messages.
        sampling: sampling options (defaults merged with the call's; `grammar` is
            a user GBNF constraint); not modified.
        schemas: the tools passed to this call.
        shown: the tools shown to the model (this call's, or those last shown to
            the agent, so the prompt and its KV prefix stay stable).
        fmt: the model's tool-call format (`MemoryPool.tool_format`).
        tool_choice: a `Tool`, `"auto"`, `"required"` or `"none"`.
        json_output: `None`/`False`, `True` or a pydantic `BaseModel` subclass.
        parallel: allow several tool calls in one reply (where `fmt` can).
        force_tools: treat `"auto"` as `"required"` when tools are given.
        speaker_selection: constrain a plain reply to the candidate names of a
            `SelectorGroupChat` selection prompt, when it lists some.

    Returns:
        The `_Plan`.

    Raises:
        ValueError: a bad `tool_choice` or `json_output`, or a user grammar combined
            with a JSON output or a forced call.
    """
    sampling = dict(sampling)
    user_grammar = sampling.pop("grammar", None)
    names = [s["name"] for s in schemas]
    conv, tools_kw = with_tools(conv, shown, fmt)
    sampling.update(tools_kw)
    parallel = parallel and fmt.parallel

    # which tools the reply may / must call
    if isinstance(tool_choice, Tool):
        if tool_choice.name not in names:
            raise ValueError(f"tool_choice names tool {tool_choice.name!r}, which is not among tools {names}")
        forced = [s for s in schemas if s["name"] == tool_choice.name]
    elif tool_choice == "required":
        if not schemas:
            raise ValueError("tool_choice='required' but no tools were given")
        forced = schemas
    elif tool_choice == "auto":
        forced = schemas if force_tools else []
    elif tool_choice == "none":
        forced = []
    else:
        raise ValueError(f"tool_choice must be a Tool, 'auto', 'required' or 'none', got {tool_choice!r}")
    allowed = [] if tool_choice == "none" else ([s["name"] for s in forced] if forced else names)

    # the output constraint
    if json_output is None or json_output is False:
        json_grammar = None
    elif json_output is True:
        json_grammar = JSON_OBJECT_GRAMMAR
    elif isinstance(json_output, type) and issubclass(json_output, BaseModel):
        json_grammar = schema_grammar(json_output.model_json_schema())
    else:
        raise ValueError(f"json_output must be None, a bool or a pydantic BaseModel subclass, got {json_output!r}")
    if user_grammar is not None and (json_grammar is not None or forced):
        raise ValueError("a 'grammar' create arg cannot be combined with json_output or a forced tool_choice")

    if forced:
        prefix, grammar = fmt.continuation(forced, parallel=parallel)
        return _Plan(agent, conv, sampling, grammar, allowed, prefix=prefix, stream_text=False, fmt=fmt)
    if allowed and json_grammar is not None:
        # A JSON reply or a tool call: one grammar admits both; the parse decides.
        if json_output is not True:
            json_grammar = fmt.call_or_document(schemas, json_output.model_json_schema(), parallel=parallel)
        elif fmt.native:  # the envelope is a JSON object; a native call is not
            json_grammar = fmt.call_or_document(schemas, {"type": "object"}, parallel=parallel)
        return _Plan(agent, conv, sampling, json_grammar, allowed, stream_text=False, fmt=fmt)
    if allowed:
        retry = fmt.continuation(schemas, parallel=parallel)
        return _Plan(agent, conv, sampling, user_grammar, allowed, retry=retry, fmt=fmt)
    if "tools" in sampling:  # shown, not to be called: a reply that opens like a call stays as written
        sampling["canonical_calls"] = False
    if json_grammar is None and user_grammar is None and speaker_selection:
        names = candidate_names(conv)
        if names:
            user_grammar = choice_grammar(names)
    return _Plan(agent, conv, sampling, json_grammar or user_grammar, [])


def opens_call(plan: _Plan, lead: str) -> bool | None:
    """Whether a streamed reply opening with `lead` may be a call (None: not known yet)."""
    if not plan.tool_names:
        return False
    if plan.fmt.native:
        native = plan.fmt.opens_call(lead)
        if native is not False:
            return native
    return opens_tool_call(lead, lenient=True)
