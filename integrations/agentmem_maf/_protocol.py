"""The tool-call protocol of one call, on the pool: plan → run → read → retry → write back.

This module is the only place `agentmem_maf` decides *how* a call runs; it takes and
returns agentmem's own types (message dicts, schema dicts, `ChatResult`s), never MAF's,
so it can be replaced by the core protocol (`agentmem.calls`) without touching the
client. It follows the same rules as the AutoGen integration (`agentmem_autogen._plan`,
`_execute`):

* **plan** — a forced call (`tool_choice="required"` or a named function) is given its
  format's opening and constrained by a grammar; `"auto"` lets the model answer freely
  and redoes a malformed call attempt under the grammar; a `response_format` constrains
  the reply to its JSON schema (with tools: one grammar admits a call or the document).
* **run** — one pool generation streams its pieces; a reply that opens like a call is
  held back until it is known whether it is one.
* **read** — the reply's calls are found in the model's own syntax.
* **write back** — a call the model wrote in another shape than its template renders
  it back is put in the KV in the template's form (prefill only), so the next call of
  the agent reuses the whole turn.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping, Optional, Sequence

from agentmem import ChatResult, MemoryPool
from agentmem.tools import (
    JSON_OBJECT_GRAMMAR,
    ToolFormat,
    opens_tool_call,
    schema_grammar,
    text_before_json,
    tools_prompt,
    with_system_block,
)

__all__ = ["Plan", "Reply", "plan_call", "run_call"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Plan:
    """What one call will do, decided and validated before anything is generated."""

    agent_id: str
    messages: list[dict[str, Any]]
    sampling: dict[str, Any]
    fmt: ToolFormat
    grammar: Optional[str] = None  # constraint of the first generation
    tool_names: list[str] = field(default_factory=list)  # tools the reply may call
    prefix: Optional[str] = None  # a forced call's opening
    retry: Optional[tuple[str, str]] = None  # (prefix, grammar) redoing a malformed call in auto mode
    stream_text: bool = True  # the pieces are text for the caller (not a call or a document)


@dataclass(slots=True)
class Reply:
    """What one call produced: text, or tool calls (and the text before them)."""

    text: str
    calls: list[tuple[str, Any]]
    finish: str  # "stop", "length" or "tool_calls"
    results: list[ChatResult]  # every pool generation the call ran (retry, write-back)


def _shown(conv: list[dict[str, Any]], schemas: Sequence[Mapping[str, Any]], fmt: ToolFormat,
           sampling: dict[str, Any]) -> list[dict[str, Any]]:
    """Show `schemas` to the model: through the template (`tools=`) or agentmem's tools block."""
    if not schemas:
        return conv
    if fmt.native:
        sampling["tools"] = [dict(s) for s in schemas]
        return conv
    return with_system_block(conv, tools_prompt(schemas))


def plan_call(
    agent_id: str,
    conv: list[dict[str, Any]],
    sampling: Mapping[str, Any],
    schemas: list[dict[str, Any]],
    shown: Sequence[Mapping[str, Any]],
    fmt: ToolFormat,
    *,
    mode: str,
    forced_name: str | None,
    schema: dict[str, Any] | None,
    parallel: bool,
) -> Plan:
    """Decide what one call generates, under which grammar.

    Args:
        agent_id: the pool agent.
        conv: the conversation as agentmem messages.
        sampling: pool sampling options (not modified).
        schemas: the tools this call may call.
        shown: the tools shown to the model (this call's, or those last shown to the
            agent, so its prompt and KV prefix stay the same on calls without tools).
        fmt: the model's tool-call format (`MemoryPool.tool_format`).
        mode: `"auto"`, `"required"` or `"none"`.
        forced_name: the one tool a required call must call, or `None` (any).
        schema: the JSON schema of the reply (`{}`: any object), or `None` (free text).
        parallel: allow several calls in one reply (where `fmt` can).

    Raises:
        ValueError: a `grammar` sampling option combined with a schema or a forced call.
    """
    sampling = dict(sampling)
    user_grammar = sampling.pop("grammar", None)
    conv = _shown(conv, shown, fmt, sampling)
    parallel = parallel and fmt.parallel
    forced = [s for s in schemas if forced_name in (None, s["name"])] if mode == "required" else []
    allowed = [] if mode == "none" else [s["name"] for s in (forced or schemas)]
    if user_grammar is not None and (schema is not None or forced):
        raise ValueError("options.grammar cannot be combined with response_format or a required tool_choice")
    if forced:
        prefix, grammar = fmt.continuation(forced, parallel=parallel)
        return Plan(agent_id, conv, sampling, fmt, grammar, allowed, prefix=prefix, stream_text=False)
    if schema is not None:
        if allowed:  # a call or the document: one grammar admits both, the parse decides
            document = fmt.call_or_document(schemas, schema or {"type": "object"}, parallel=parallel)
            return Plan(agent_id, conv, sampling, fmt, document, allowed, stream_text=False)
        grammar = schema_grammar(schema) if schema else JSON_OBJECT_GRAMMAR
        return Plan(agent_id, conv, sampling, fmt, grammar, [], stream_text=True)
    if allowed:
        retry = fmt.continuation(schemas, parallel=parallel)
        return Plan(agent_id, conv, sampling, fmt, user_grammar, allowed, retry=retry)
    if "tools" in sampling:  # shown, not to be called: a reply that opens like a call stays as written
        sampling["canonical_calls"] = False
    return Plan(agent_id, conv, sampling, fmt, user_grammar, [])


def _opens_call(plan: Plan, lead: str) -> bool | None:
    """Whether a streamed reply opening with `lead` may be a call (None: not known yet)."""
    if not plan.tool_names:
        return False
    if plan.fmt.native:
        native = plan.fmt.opens_call(lead)
        if native is not False:
            return native
    return opens_tool_call(lead, lenient=True)


async def _generate(pool: MemoryPool, plan: Plan, grammar: str | None,
                    prefix: str | None) -> AsyncIterator[str | ChatResult]:
    """One pool generation as an async stream (a forced `prefix` starts the reply)."""
    kw = dict(plan.sampling)
    if grammar is not None:
        kw["grammar"] = grammar
    msgs = plan.messages
    if prefix is not None and plan.fmt.native:
        kw["opening"] = prefix
    elif prefix is not None:
        msgs = [*plan.messages, {"role": "assistant", "content": prefix}]
    agen = pool.achat_stream(plan.agent_id, msgs, **kw)
    try:
        async for item in agen:
            yield item
    finally:
        await agen.aclose()


async def _drain(pool: MemoryPool, plan: Plan, grammar: str | None, prefix: str | None) -> ChatResult:
    result: ChatResult | None = None
    async for item in _generate(pool, plan, grammar, prefix):
        if isinstance(item, ChatResult):
            result = item
    assert result is not None, "the pool stream ended without a ChatResult"
    return result


async def _first_run(pool: MemoryPool, plan: Plan, stream: bool) -> AsyncIterator[str | tuple[ChatResult, str, str]]:
    """Run: text pieces as they may be shown, then `(result, reply text, text held back)`."""
    if not (stream and plan.stream_text):
        r = await _drain(pool, plan, plan.grammar, plan.prefix)
        text = (plan.prefix or "") + r.text
        yield r, text, (text if stream else "")
        return
    held: list[str] = []
    holding: bool | None = None  # undecided until the first non-blank piece
    result: ChatResult | None = None
    async for item in _generate(pool, plan, plan.grammar, None):
        if isinstance(item, ChatResult):
            result = item
        elif holding is None:
            held.append(item)
            lead = "".join(held).lstrip()
            opens = _opens_call(plan, lead) if lead else None
            if opens is not None:
                holding = opens
                if not holding:
                    yield "".join(held)
                    held.clear()
        elif holding:
            held.append(item)
        else:
            yield item
    assert result is not None, "the pool stream ended without a ChatResult"
    yield result, result.text, "".join(held)


async def _read_calls(pool: MemoryPool, plan: Plan, text: str,
                      results: list[ChatResult]) -> tuple[list[tuple[str, Any]], str] | None:
    """Read the reply's calls (redoing a malformed one under the grammar) and write them back."""
    written = text
    found = plan.fmt.find(text, plan.tool_names)
    if found is None and plan.retry is not None and plan.fmt.looks_like_call(text, plan.tool_names):
        logger.debug("agent %r: malformed tool call %r; redoing it under the grammar", plan.agent_id, text[:80])
        prefix, grammar = plan.retry
        r2 = await _drain(pool, plan, grammar, prefix)
        results.append(r2)
        written = prefix + r2.text
        found = plan.fmt.find(written, plan.tool_names)
        if found is not None:
            j = text.find(plan.fmt.opener) if plan.fmt.native else -1
            found = (found[0], text[:j].strip() if j != -1 else text_before_json(text))
    if found is None:
        return None
    parsed, before = found
    calls = [(c.name or "", c.arguments) for c in parsed]
    back = plan.fmt.written_back(before, calls) if plan.fmt.native else None
    if back is not None and back != written.strip():
        # put the template's form of the call in the KV now (prefill only): the next call keeps it
        quiet = dataclasses.replace(plan, sampling={**plan.sampling, "max_tokens": 0})
        results.append(await _drain(pool, quiet, None, back))
    return calls, before


async def run_call(pool: MemoryPool, plan: Plan, *, stream: bool) -> AsyncIterator[str | Reply]:
    """Run `plan` on `pool`: text pieces (when `stream`), then one `Reply`.

    A reply that is a tool call yields no text pieces; its calls are in the `Reply`.
    """
    results: list[ChatResult] = []
    first: tuple[ChatResult, str, str] | None = None
    async for item in _first_run(pool, plan, stream):
        if isinstance(item, tuple):
            first = item
        else:
            yield item
    assert first is not None
    r1, text, unsent = first
    results.append(r1)
    finish = "length" if r1.finish_reason == "length" else "stop"
    if plan.tool_names:
        read = await _read_calls(pool, plan, text, results)
        if read is not None:
            calls, before = read
            yield Reply(text=before, calls=calls, finish="tool_calls", results=results)
            return
        if plan.prefix is not None:
            logger.warning("agent %r: forced tool call did not complete (finish=%s): %r",
                           plan.agent_id, r1.finish_reason, text[:120])
    if stream and unsent:
        yield unsent
    yield Reply(text=text, calls=[], finish=finish, results=results)
