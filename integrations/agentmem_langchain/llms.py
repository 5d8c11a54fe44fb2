"""AgentMemLLM: a completion-style LangChain LLM on an agentmem pool."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Iterator

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from agentmem import ChatResult as PoolResult

from agentmem.calls import CallPlan, CallRunner
from agentmem.models import ModelLease

from ._common import AgentMemFields, timings_dict, usage_dict

__all__ = ["AgentMemLLM"]

_CALL_KEYS = {"agent_id", "max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "grammar"}


class AgentMemLLM(AgentMemFields, BaseLLM):
    """Prompt-string LLM on an agentmem pool: raw completion, no chat template.

    Same agent identity, pool sharing (a `MemoryPool` of several models with `model=` too), streaming and
    async as `agentmem_langchain.ChatAgentMem`. Each agent's KV holds its last
    prompt + completion, so a prompt that *extends* the previous one (a growing
    transcript) decodes only the new text.

    .. code-block:: python

        from agentmem_langchain import AgentMemLLM

        llm = AgentMemLLM(agent_id="notes", max_tokens=32)
        text = llm.invoke("The three primary colours are")
        info = llm.generate(["The three primary colours are red,"]).generations[0][0].generation_info
        info["usage"]["input_token_details"]["cache_read"]   # tokens reused from the first call

    ``generation_info`` of each generation holds ``finish_reason``, ``usage``
    (LangChain usage-metadata shape, ``cache_read`` included), ``kv``,
    ``timings`` and ``agent_id``; ``llm_output["token_usage"]`` sums the batch.
    """

    @property
    def _llm_type(self) -> str:
        return "agentmem"

    # identity and the per-call agent from the run config come from AgentMemFields

    # ------------------------------------------------------------------ helpers
    def _options(self, stop: list[str] | None, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        kwargs = dict(kwargs)
        self._reject_unknown(kwargs, _CALL_KEYS)
        agent = self._agent_from(kwargs)
        sampling = self._sampling_from(kwargs, stop)
        if kwargs.get("grammar") is not None:
            sampling["grammar"] = kwargs["grammar"]
        return agent, sampling

    def _info(self, agent: str, result: PoolResult, seat: ModelLease) -> dict[str, Any]:
        return {
            "finish_reason": result.finish_reason,
            "usage": usage_dict([result]),
            "kv": result.kv,
            "timings": timings_dict(result),
            "agent_id": agent,
            "model_name": self._seat_name(seat),
        }

    def _result(self, agent: str, results: list[PoolResult], seat: ModelLease) -> LLMResult:
        usage = usage_dict(results)
        return LLMResult(
            generations=[[Generation(text=r.text, generation_info=self._info(agent, r, seat))] for r in results],
            llm_output={
                "token_usage": {
                    "prompt_tokens": usage["input_tokens"],
                    "completion_tokens": usage["output_tokens"],
                    "total_tokens": usage["total_tokens"],
                    "cached_tokens": usage["input_token_details"]["cache_read"],
                },
                "model_name": self._seat_name(seat),
            },
        )

    # ------------------------------------------------------------------ LangChain hooks
    # Each hook takes the seat of its agent's model (`agentmem.models.seat`), then runs a
    # completion plan through the one protocol's runner (`agentmem.calls`) on its pool.
    def _plans(self, prompts: list[str], stop: list[str] | None, kwargs: dict[str, Any]) -> list[CallPlan]:
        agent, sampling = self._options(stop, kwargs)
        return [CallPlan(agent, None, prompt, sampling) for prompt in prompts]

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        plans = self._plans(prompts, stop, kwargs)
        agent = plans[0].agent_id if plans else self.agent_id
        results: list[PoolResult] = []
        with self._seat(agent) as seat:
            runner = CallRunner(seat.pool)
            for plan in plans:
                for kind, value in runner.run(plan):
                    if kind == "done":
                        results.append(value.results[-1])  # type: ignore[union-attr]
                    elif run_manager and self.streaming:
                        run_manager.on_llm_new_token(value, chunk=GenerationChunk(text=value))  # type: ignore[arg-type]
            return self._result(agent, results, seat)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        plans = self._plans(prompts, stop, kwargs)
        agent = plans[0].agent_id if plans else self.agent_id
        results: list[PoolResult] = []
        with await self._aseat(agent) as seat:
            runner = CallRunner(seat.pool)
            for plan in plans:
                async for kind, value in runner.arun(plan):
                    if kind == "done":
                        results.append(value.results[-1])  # type: ignore[union-attr]
                    elif run_manager and self.streaming:
                        await run_manager.on_llm_new_token(value, chunk=GenerationChunk(text=value))  # type: ignore[arg-type]
            return self._result(agent, results, seat)

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        (plan,) = self._plans([prompt], stop, kwargs)
        with self._seat(plan.agent_id) as seat, contextlib.closing(CallRunner(seat.pool).run(plan)) as events:
            for kind, value in events:
                if kind == "done":
                    yield GenerationChunk(text="", generation_info=self._info(plan.agent_id, value.results[-1], seat))  # type: ignore[union-attr]
                    continue
                chunk = GenerationChunk(text=value)  # type: ignore[arg-type]
                if run_manager:
                    run_manager.on_llm_new_token(value, chunk=chunk)  # type: ignore[arg-type]
                yield chunk

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        (plan,) = self._plans([prompt], stop, kwargs)
        with await self._aseat(plan.agent_id) as seat:
            async with contextlib.aclosing(CallRunner(seat.pool).arun(plan)) as events:
                async for kind, value in events:
                    if kind == "done":
                        yield GenerationChunk(text="", generation_info=self._info(plan.agent_id, value.results[-1], seat))  # type: ignore[union-attr]
                        continue
                    chunk = GenerationChunk(text=value)  # type: ignore[arg-type]
                    if run_manager:
                        await run_manager.on_llm_new_token(value, chunk=chunk)  # type: ignore[arg-type]
                    yield chunk
