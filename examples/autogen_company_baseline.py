"""Baseline for ``autogen_company.py``: the same teams on autogen-ext's ``LlamaCppChatCompletionClient``.

This is how an AgentChat app runs on a local GGUF without agentmem: one
``LlamaCppChatCompletionClient`` (one ``llama_cpp.Llama``, one context) shared by
every agent. ``Llama`` reuses the longest common prefix with the *previous* prompt,
so consecutive calls of one agent share work, but every switch to another agent
re-prefills that agent's whole history.

Kept equal to the agentmem run: model file, threads, batch size, flash attention,
full-size sliding-window cache (``swa_full``, which lets ``Llama`` reuse prefixes on
Gemma 3), greedy sampling, reply length, team, prompts, and the selector's
one-of-the-names grammar. A Gemma-3 chat template (system text folded into the first
user turn, as Gemma 3's own template does) is supplied because the model file ships
none; it skips the role-alternation check that AgentChat's histories would fail.

Differences that are the baseline client's own (not chosen here):

* it ignores tools with this template, so the engineer answers without calling
  ``estimate_effort`` (agentmem's run makes that call and a reflection call — more
  model calls on the agentmem side);
* it drops ``UserMessage.source`` (agentmem renders "pm: ..."), a few tokens less per message.

The selector gets the same help as agentmem's ``speaker_selection=True``: a grammar
admitting only the candidate names its prompt lists.

Prefill time and tokens come from llama.cpp's own counters (``llama_perf_context``):
per call, the change of ``t_p_eval_ms``/``n_p_eval``; TTFT is the call's wall time
minus its token-by-token decode time (``t_eval_ms``).

Run: ``python examples/autogen_company_baseline.py [--rounds 4 --threads 1]``
"""

from __future__ import annotations

import ast
import asyncio
import copy
import json
import os
import re
import sys
import time
from typing import Any, Mapping

import llama_cpp
from autogen_ext.models.llama_cpp import LlamaCppChatCompletionClient
from llama_cpp import llama_chat_format
from llama_cpp.llama_grammar import LlamaGrammar

from agentmem.engine.threads import default_threads

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from autogen_company import (  # noqa: E402
    NAMES,
    Call,
    TeamRun,
    build_team,
    parse_args,
    print_call,
    print_summaries,
    run_team,
)

GEMMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set sys = messages[0]['content'] + '\n\n' -%}{%- set rest = messages[1:] -%}"
    "{%- else -%}{%- set sys = '' -%}{%- set rest = messages -%}{%- endif -%}"
    "{%- for m in rest -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else 'user' -%}"
    "{{ '<start_of_turn>' + role + '\n' + (sys if loop.first else '') + (m['content'] | trim) + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{{ '<start_of_turn>model\n' }}"
)


class TimedLlamaCppClient(LlamaCppChatCompletionClient):
    """``LlamaCppChatCompletionClient`` plus default create args and per-call measurements."""

    def __init__(self, *, defaults: Mapping[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.defaults = dict(defaults)
        self.on_call: Any = None
        self.agent = "?"

    def with_defaults(self, *, speaker_selection: bool = False, **defaults: Any) -> TimedLlamaCppClient:
        """A view sharing this client's ``Llama`` (same context) with other default args."""
        other = copy.copy(self)
        other.defaults = {**self.defaults, **defaults}
        other.speaker_selection = speaker_selection
        return other

    speaker_selection = False

    async def create(self, messages: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs["extra_create_args"] = {**self.defaults, **dict(kwargs.get("extra_create_args") or {})}
        if self.speaker_selection:  # answer with one of the candidates the prompt lists
            found = re.findall(r"\['[^'\n]+'(?:, '[^'\n]+')*\]", str(messages[-1].content))
            if found:
                names = ast.literal_eval(found[-1])
                gbnf = "root ::= " + " | ".join(json.dumps(n) for n in names)
                kwargs["extra_create_args"]["grammar"] = LlamaGrammar.from_string(gbnf, verbose=False)
        ctx = self.llm._ctx.ctx
        before = llama_cpp.llama_perf_context(ctx)
        t0 = time.perf_counter()
        result = await super().create(messages, **kwargs)
        wall = time.perf_counter() - t0
        after = llama_cpp.llama_perf_context(ctx)
        if self.on_call is not None:
            decode_s = (after.t_eval_ms - before.t_eval_ms) / 1e3
            self.on_call(
                prompt_tokens=result.usage.prompt_tokens,
                prefilled_tokens=after.n_p_eval - before.n_p_eval,
                prefill_s=(after.t_p_eval_ms - before.t_p_eval_ms) / 1e3,
                ttft_s=max(0.0, wall - decode_s),
                total_s=wall,
            )
        return result


def make_client(args: Any) -> TimedLlamaCppClient:
    from agentmem import resolve_model_path

    handler = llama_chat_format.Jinja2ChatFormatter(
        template=GEMMA3_TEMPLATE, eos_token="<end_of_turn>", bos_token="<bos>"
    ).to_chat_handler()
    threads = args.threads or default_threads()
    return TimedLlamaCppClient(
        defaults={"max_tokens": args.max_tokens, "temperature": 0.0},
        model_path=str(resolve_model_path(args.model)),
        n_ctx=8192,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,
        swa_full=True,
        chat_handler=handler,
        verbose=False,
    )


async def run_baseline(args: Any) -> list[TeamRun]:
    base = make_client(args)
    threads = args.threads or default_threads()
    print(f"\nbaseline: LlamaCppChatCompletionClient, one shared Llama, n_ctx=8192, threads={threads}")
    runs: list[TeamRun] = []
    try:
        for kind in args.teams:
            record = TeamRun("baseline", kind)
            runs.append(record)
            print(f"\n== baseline · {kind} ==")
            clients = {}
            for name in NAMES:
                clients[name] = base.with_defaults()
                clients[name].agent = name
            selector = base.with_defaults(speaker_selection=True, max_tokens=8)
            selector.agent = "selector"

            for c in [*clients.values(), selector]:
                def on_call(c: TimedLlamaCppClient = c, record: TeamRun = record, **m: Any) -> None:
                    call = Call(team=record.team, agent=c.agent, kv="baseline", **m)
                    record.calls.append(call)
                    print_call(len(record.calls), call)

                c.on_call = on_call
            team = build_team(kind, clients, selector=selector, rounds=args.rounds)
            await run_team(team, record, show=args.show)
    finally:
        await base.close()
    return runs


def main() -> None:
    args = parse_args()
    print_summaries([r.summary() for r in asyncio.run(run_baseline(args))])


if __name__ == "__main__":
    main()
