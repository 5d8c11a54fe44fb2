"""AgentMemLLM: a completion-style LangChain LLM on an agentmem pool."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Iterator

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from agentmem import ChatResult as PoolResult

from agentmem.calls import CallPlan, CallRunner

from ._common import AgentMemFields, timings_dict, usage_dict

__all__ = ["AgentMemLLM"]

_CALL_KEYS = {"agent_id", "max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "grammar"}


class AgentMemLLM(AgentMemFields, BaseLLM):
    """Prompt-string LLM on an agentmem pool: raw completion, no chat template.

    Same agent identity, pool sharing, streaming and async as
    `agentmem_langchain.ChatAgentMem`. Each agent's KV holds its last
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

    def _info(self, agent: str, result: PoolResult) -> dict[str, Any]:
        return {
            "finish_reason": result.finish_reason,
            "usage": usage_dict([result]),
            "kv": result.kv,
            "timings": timings_dict(result),
            "agent_id": agent,
            "model_name": self.resolved_model_name(),
        }

    def _result(self, agent: str, results: list[PoolResult]) -> LLMResult:
        usage = usage_dict(results)
        return LLMResult(
            generations=[[Generation(text=r.text, generation_info=self._info(agent, r))] for r in results],
            llm_output={
                "token_usage": {
                    "prompt_tokens": usage["input_tokens"],
                    "completion_tokens": usage["output_tokens"],
                    "total_tokens": usage["total_tokens"],
                    "cached_tokens": usage["input_token_details"]["cache_read"],
                },
                "model_name": self.resolved_model_name(),
            },
        )

    # ------------------------------------------------------------------ LangChain hooks
    # Each hook runs a completion plan through the one protocol's runner (`agentmem.calls`).
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
        runner = CallRunner(self.get_pool())
        results: list[PoolResult] = []
        for plan in plans:
            for kind, value in runner.run(plan):
                if kind == "done":
                    results.append(value.results[-1])  # type: ignore[union-attr]
                elif run_manager and self.streaming:
                    run_manager.on_llm_new_token(value, chunk=GenerationChunk(text=value))  # type: ignore[arg-type]
        return self._result(plans[0].agent_id if plans else self.agent_id, results)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        plans = self._plans(prompts, stop, kwargs)
        runner = CallRunner(self.get_pool())
        results: list[PoolResult] = []
        for plan in plans:
            async for kind, value in runner.arun(plan):
                if kind == "done":
                    results.append(value.results[-1])  # type: ignore[union-attr]
                elif run_manager and self.streaming:
                    await run_manager.on_llm_new_token(value, chunk=GenerationChunk(text=value))  # type: ignore[arg-type]
        return self._result(plans[0].agent_id if plans else self.agent_id, results)

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        (plan,) = self._plans([prompt], stop, kwargs)
        for kind, value in CallRunner(self.get_pool()).run(plan):
            if kind == "done":
                yield GenerationChunk(text="", generation_info=self._info(plan.agent_id, value.results[-1]))  # type: ignore[union-attr]
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
        async with contextlib.aclosing(CallRunner(self.get_pool()).arun(plan)) as events:
            async for kind, value in events:
                if kind == "done":
                    yield GenerationChunk(text="", generation_info=self._info(plan.agent_id, value.results[-1]))  # type: ignore[union-attr]
                    continue
                chunk = GenerationChunk(text=value)  # type: ignore[arg-type]
                if run_manager:
                    await run_manager.on_llm_new_token(value, chunk=chunk)  # type: ignore[arg-type]
                yield chunk
