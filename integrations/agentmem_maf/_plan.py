"""One MAF call's options → the `agentmem.calls.CallPlan` the core protocol runs.

MAF's `tool_choice` and `response_format` are read by `_messages`; here they become the
core's choice (`auto`, `none`, `required` or one function's name), a JSON reply, or —
tools *and* a `response_format` — one grammar that admits a call or the document (the
parse decides, as in AutoGen). Everything after the plan — the decode (a free tool turn
under a lazy call grammar), reading calls, holding streamed text back, the write-back — is `agentmem.calls`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from agentmem.calls import CallPlan, plan_chat, show_tools
from agentmem.tools import ToolFormat

__all__ = ["SAMPLING", "plan_options"]

SAMPLING = frozenset({"max_tokens", "temperature", "top_p", "seed", "stop", "top_k", "min_p", "repeat_penalty",
                      "repeat_last_n", "grammar"})
"""Options passed to the pool as they are (`top_k` … `grammar` are agentmem's own)."""


def _either(agent_id: str, conv: list[dict[str, Any]], sampling: dict[str, Any], fmt: ToolFormat,
            schemas: Sequence[Mapping[str, Any]], schema: Mapping[str, Any], parallel: bool) -> CallPlan:
    """A reply that is a call over `schemas` or a document of `schema`: one grammar, the parse decides."""
    msgs, shown = show_tools(conv, schemas, fmt)
    grammar = fmt.call_or_document(schemas, schema or {"type": "object"}, parallel=parallel and fmt.parallel)
    return CallPlan(agent_id, msgs, None, {**sampling, **shown, "grammar": grammar}, "either",
                    tool_names=tuple(s["name"] for s in schemas), fmt=fmt)


def plan_options(
    agent_id: str,
    conv: list[dict[str, Any]],
    sampling: Mapping[str, Any],
    fmt: ToolFormat,
    *,
    schemas: list[dict[str, Any]],
    shown: Sequence[Mapping[str, Any]],
    mode: str,
    forced_name: str | None,
    schema: dict[str, Any] | None,
    parallel: bool,
) -> CallPlan:
    """The `CallPlan` of one call.

    Args:
        agent_id: the pool agent.
        conv: the conversation as agentmem messages.
        sampling: pool sampling options (a `grammar` among them is a raw GBNF constraint).
        fmt: the model's tool-call format (`MemoryPool.tool_format`).
        schemas: the tools this call offers.
        shown: the tools shown to the model: this call's, or those last shown to the agent
            (its prompt, and so its KV prefix, stays the same on a call without tools).
        mode: `"auto"`, `"required"` or `"none"` (`_messages.tool_choice`).
        forced_name: the one function a required call must call, or `None`.
        schema: the reply's JSON schema (`{}`: any object), or `None` (free text).
        parallel: allow several calls in one reply (where `fmt` can).

    Raises:
        ValueError: a `grammar` option with tools to call or a `response_format`.
    """
    sampling = dict(sampling)
    grammar = sampling.pop("grammar", None)
    callable_now = bool(schemas) and mode != "none"
    if grammar is not None and (callable_now or schema is not None):
        raise ValueError("options.grammar cannot be combined with tools to call or a response_format")
    if callable_now and schema is not None and mode == "auto":
        return _either(agent_id, conv, sampling, fmt, schemas, schema, parallel)
    choice = (forced_name or "required") if mode == "required" else (mode if callable_now else "none")
    plan = plan_chat(agent_id, conv, sampling, fmt, tools=list(schemas if callable_now else shown), choice=choice,
                     parallel=parallel, json_reply=schema is not None and not (callable_now and mode == "required"),
                     schema=schema or None)
    return plan.with_sampling(grammar=grammar) if grammar is not None else plan
