"""AgentMemLLM: a completion-style LangChain LLM on an agentmem pool."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Iterator

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseLLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult

from agentmem import ChatResult as PoolResult

from ._common import AgentMemFields, agent_lock, async_agent_lock, timings_dict, usage_dict

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
    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        agent, sampling = self._options(stop, kwargs)
        pool = self.get_pool()
        results: list[PoolResult] = []
        for prompt in prompts:
            with agent_lock(pool, agent):
                if self.streaming:
                    stream = pool.complete_stream(agent, prompt, **sampling)
                    with contextlib.closing(stream):
                        for piece in stream:
                            if run_manager:
                                run_manager.on_llm_new_token(piece, chunk=GenerationChunk(text=piece))
                    assert stream.result is not None
                    results.append(stream.result)
                else:
                    results.append(pool.complete(agent, prompt, **sampling))
        return self._result(agent, results)

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        agent, sampling = self._options(stop, kwargs)
        pool = self.get_pool()
        results: list[PoolResult] = []
        for prompt in prompts:
            async with async_agent_lock(pool, agent):
                if self.streaming:
                    async with contextlib.aclosing(pool.acomplete_stream(agent, prompt, **sampling)) as items:
                        async for item in items:
                            if isinstance(item, PoolResult):
                                results.append(item)
                            elif run_manager:
                                await run_manager.on_llm_new_token(item, chunk=GenerationChunk(text=item))
                else:
                    results.append(await pool.acomplete(agent, prompt, **sampling))
        return self._result(agent, results)

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        agent, sampling = self._options(stop, kwargs)
        pool = self.get_pool()
        with agent_lock(pool, agent):
            stream = pool.complete_stream(agent, prompt, **sampling)
            with contextlib.closing(stream):
                for piece in stream:
                    chunk = GenerationChunk(text=piece)
                    if run_manager:
                        run_manager.on_llm_new_token(piece, chunk=chunk)
                    yield chunk
            assert stream.result is not None
            result = stream.result
        yield GenerationChunk(text="", generation_info=self._info(agent, result))

    async def _astream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[GenerationChunk]:
        agent, sampling = self._options(stop, kwargs)
        pool = self.get_pool()
        result: PoolResult | None = None
        async with async_agent_lock(pool, agent):
            async with contextlib.aclosing(pool.acomplete_stream(agent, prompt, **sampling)) as items:
                async for item in items:
                    if isinstance(item, PoolResult):
                        result = item
                        continue
                    chunk = GenerationChunk(text=item)
                    if run_manager:
                        await run_manager.on_llm_new_token(item, chunk=chunk)
                    yield chunk
        assert result is not None
        yield GenerationChunk(text="", generation_info=self._info(agent, result))
