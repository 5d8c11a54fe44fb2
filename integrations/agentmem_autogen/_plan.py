"""The plan of one `create` call: AutoGen's `tool_choice`, `json_output`, create args and speaker selection read into the protocol's `agentmem.calls.CallPlan` (which tools the reply may or must call, its grammar, the forced prefix and the redo of a malformed call), validated before anything is generated."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from autogen_core.tools import Tool
from pydantic import BaseModel

from agentmem.calls import CallPlan, forced_plan, show_tools
from agentmem.tools import JSON_OBJECT_GRAMMAR, ToolFormat, choice_grammar, schema_grammar

from ._messages import candidate_names

SAMPLING_ARGS: frozenset[str] = frozenset(
    {
        "max_tokens", "temperature", "top_k", "top_p", "min_p",
        "repeat_penalty", "repeat_last_n", "seed", "stop", "grammar",
    }
)
"""Keys accepted in `create_args` and in `extra_create_args` of a call."""


_Plan = CallPlan
"""What one `create` call will do (`agentmem.calls.CallPlan`, read `lenient`ly: calls anywhere in the reply)."""


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
    """The conversation and pool keywords that show `schemas` to the model (`agentmem.calls.show_tools`)."""
    specs = [{"name": s["name"], "description": s.get("description") or "", "parameters": s.get("parameters") or {}}
             for s in schemas]
    return show_tools(conv, specs if fmt.native else list(schemas), fmt)


def _forced_tools(tool_choice: Any, schemas: list[dict[str, Any]], force_tools: bool) -> list[dict[str, Any]]:
    """The tools a reply must call (`[]`: none forced)."""
    names = [s["name"] for s in schemas]
    if isinstance(tool_choice, Tool):
        if tool_choice.name not in names:
            raise ValueError(f"tool_choice names tool {tool_choice.name!r}, which is not among tools {names}")
        return [s for s in schemas if s["name"] == tool_choice.name]
    if tool_choice == "required":
        if not schemas:
            raise ValueError("tool_choice='required' but no tools were given")
        return schemas
    if tool_choice == "auto":
        return schemas if force_tools else []
    if tool_choice == "none":
        return []
    raise ValueError(f"tool_choice must be a Tool, 'auto', 'required' or 'none', got {tool_choice!r}")


def _json_grammar(json_output: Any) -> str | None:
    """The grammar of a JSON reply (`None`: no JSON output asked)."""
    if json_output is None or json_output is False:
        return None
    if json_output is True:
        return JSON_OBJECT_GRAMMAR
    if isinstance(json_output, type) and issubclass(json_output, BaseModel):
        return schema_grammar(json_output.model_json_schema())
    raise ValueError(f"json_output must be None, a bool or a pydantic BaseModel subclass, got {json_output!r}")


def _either_grammar(fmt: ToolFormat, schemas: list[dict[str, Any]], json_output: Any, json_grammar: str,
                    parallel: bool) -> str:
    """One grammar admitting a call or the JSON reply (the parse decides)."""
    if json_output is not True:
        return fmt.call_or_document(schemas, json_output.model_json_schema(), parallel=parallel)
    if fmt.native:  # the envelope is a JSON object; a native call is not
        return fmt.call_or_document(schemas, {"type": "object"}, parallel=parallel)
    return json_grammar


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
        sampling: sampling options (defaults merged with the call's; `grammar` is a user GBNF); not modified.
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
        The plan: a forced call (`tools`), a call or a document (`either`), a free reply
        that may call (`auto`, with a forced retry) or a text reply.

    Raises:
        ValueError: a bad `tool_choice` or `json_output`, or a user grammar combined
            with a JSON output or a forced call.
    """
    sampling = dict(sampling)
    user_grammar = sampling.pop("grammar", None)
    names = [s["name"] for s in schemas]
    conv, tools_kw = with_tools(conv, shown, fmt)
    base = CallPlan(agent, conv, None, {**sampling, **tools_kw}, fmt=fmt, lenient=True)
    parallel = parallel and fmt.parallel
    forced = _forced_tools(tool_choice, schemas, force_tools)
    allowed = () if tool_choice == "none" else tuple(s["name"] for s in forced) if forced else tuple(names)
    json_grammar = _json_grammar(json_output)
    if user_grammar is not None and (json_grammar is not None or forced):
        raise ValueError("a 'grammar' create arg cannot be combined with json_output or a forced tool_choice")
    base.tool_names = allowed
    if forced:
        return forced_plan(base, *fmt.continuation(forced, parallel=parallel))
    if allowed and json_grammar is not None:
        base.mode = "either"
        return base.with_sampling(grammar=_either_grammar(fmt, schemas, json_output, json_grammar, parallel))
    if allowed:
        base.mode, base.forced = "auto", lambda: forced_plan(base, *fmt.continuation(schemas, parallel=parallel))
        return base.with_sampling(grammar=user_grammar) if user_grammar is not None else base
    return _reply_plan(base, json_grammar or user_grammar, speaker_selection)


def _reply_plan(base: CallPlan, grammar: str | None, speaker_selection: bool) -> CallPlan:
    """A reply that calls no tool: under `grammar`, else, for a selection prompt, one of its candidate names."""
    if base.tools:  # shown, not to be called: a reply that opens like a call stays as written
        base.sampling["canonical_calls"] = False
    if grammar is None and speaker_selection:
        candidates = candidate_names(base.messages or [])
        grammar = choice_grammar(candidates) if candidates else None
    return base.with_sampling(grammar=grammar) if grammar is not None else base
