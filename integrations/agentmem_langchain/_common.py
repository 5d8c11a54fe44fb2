"""What the chat model and the LLM share: pool fields, agent identity, sampling, locking."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Mapping

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from agentmem import AgentMemError, ChatResult, MemoryPool, PoolConfig, resolve_model_path
from agentmem import tools as _tools

__all__ = ["AgentMemFields", "agent_lock", "async_agent_lock", "shared_pool", "timings_dict", "usage_dict"]

#: Per-call keyword arguments that map straight to `MemoryPool.chat` sampling options.
SAMPLING_KEYS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")

_locks: weakref.WeakKeyDictionary[MemoryPool, dict[str, threading.Lock]] = weakref.WeakKeyDictionary()
_locks_guard = threading.Lock()


def shared_pool(model_path: str | None = None, **options: Any) -> MemoryPool:
    """The process-wide `MemoryPool` for `model_path` and `options`.

    Every `ChatAgentMem` or `AgentMemLLM` built without an explicit `pool` asks for
    this. The first call for a combination loads the model (about half a second for
    the default model); later calls, from any object and any agent, get the same pool,
    as do AutoGen clients of the same configuration (`agentmem.tools.registry`). It
    stays open until `close_shared_pools()` or exit; a pool that was closed meanwhile
    is replaced by a new one. Building the LangChain objects themselves loads nothing.

    Args:
        model_path: GGUF file; `None` = `AGENTMEM_MODEL` or the bundled default model.
        **options: `PoolConfig` fields (`n_ctx`, `resident_agents`...).

    Raises:
        ConfigError: an unknown or invalid option.
        ModelNotFoundError: no model at `model_path` (or no default model installed).
    """
    if model_path is not None:
        options = {**options, "model_path": str(model_path)}
    return _tools.shared_pool(PoolConfig.build(**options), _open_pool)


def _open_pool(config: PoolConfig) -> MemoryPool:
    return MemoryPool(config=config)


def _lock_for(pool: MemoryPool, agent_id: str) -> threading.Lock:
    with _locks_guard:
        per_pool = _locks.setdefault(pool, {})
        return per_pool.setdefault(agent_id, threading.Lock())


@contextlib.contextmanager
def agent_lock(pool: MemoryPool, agent_id: str) -> Iterator[None]:
    """One call at a time per agent.

    Two overlapping calls for the same agent (`batch` runs inputs in threads)
    would both extend the same llama.cpp sequence; they are serialized here.
    Calls for different agents still overlap freely.
    """
    lock = _lock_for(pool, agent_id)
    with lock:
        yield


@contextlib.asynccontextmanager
async def async_agent_lock(pool: MemoryPool, agent_id: str) -> AsyncIterator[None]:
    """`agent_lock` for coroutines: waits without blocking the event loop.

    Polls instead of acquiring in a worker thread so that a cancelled waiter can
    never end up holding the lock.
    """
    lock = _lock_for(pool, agent_id)
    delay = 0.001
    while not lock.acquire(blocking=False):
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.02)
    try:
        yield
    finally:
        lock.release()


def usage_dict(results: list[ChatResult]) -> dict[str, Any]:
    """LangChain `UsageMetadata` summed over the pool calls that made one reply."""
    prompt = sum(r.usage.prompt_tokens for r in results)
    cached = sum(r.usage.cached_tokens for r in results)
    completion = sum(r.usage.completion_tokens for r in results)
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": prompt + completion,
        "input_token_details": {"cache_read": cached},
    }


def timings_dict(result: ChatResult) -> dict[str, float]:
    t = result.timings
    return {"ttft_s": t.ttft_s, "restore_s": t.restore_s, "prefill_s": t.prefill_s, "decode_s": t.decode_s, "total_s": t.total_s}


class AgentMemFields(BaseModel):
    """Fields and helpers shared by `ChatAgentMem` and `AgentMemLLM`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pool: MemoryPool | None = Field(default=None, exclude=True)
    """The `agentmem.MemoryPool` to run on. Several model objects (one per
    agent) can share one pool. `None`: a process-wide pool for `model_path` and
    `pool_options`, created on first use (constructing this object loads nothing)."""

    model_path: str | None = None
    """GGUF file of the shared pool (ignored when `pool` is given); `None` =
    `AGENTMEM_MODEL` or the bundled default model (Gemma 3 270M)."""

    pool_options: dict[str, Any] = Field(default_factory=dict)
    """`agentmem.PoolConfig` fields for the shared pool (`n_ctx`,
    `resident_agents`, ...). Objects with equal `model_path` and
    `pool_options` share one pool."""

    agent_id: str = "default"
    """Whose memory a call continues. Override per call with `agent_id=...` or
    `config={"configurable": {"agent_id": ...}}`."""

    model_name: str | None = None
    """Name reported in metadata; default: the model file's stem."""

    temperature: float = 0.0
    """Sampling temperature; `0` = greedy (deterministic)."""

    max_tokens: int = 256
    """Tokens to generate at most per call."""

    top_k: int | None = None
    """Keep the k most likely tokens (pool default when `None`)."""

    top_p: float | None = None
    """Nucleus sampling mass (pool default when `None`)."""

    min_p: float | None = None
    """Drop tokens below `min_p` × the top probability (pool default when `None`)."""

    repeat_penalty: float | None = None
    """Penalty for recently generated tokens (`1.0` = off)."""

    seed: int | None = None
    """Seed of the random draw when `temperature > 0` (pool default when `None`)."""

    stop: list[str] | None = None
    """Stop strings; generation ends before any of them (they are not returned)."""

    streaming: bool = False
    """Generate through the streaming path even on `invoke` (callbacks get tokens)."""

    _model_name: str | None = PrivateAttr(default=None)

    @field_validator("agent_id")
    @classmethod
    def _check_agent_id(cls, v: str) -> str:
        if not v:
            raise ValueError("agent_id must be a non-empty string")
        return v

    @field_validator("max_tokens")
    @classmethod
    def _check_max_tokens(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"max_tokens must be >= 0, got {v}")
        return v

    @model_validator(mode="after")
    def _check_pool_options(self) -> AgentMemFields:
        if self.pool is not None and (self.pool_options or self.model_path):
            raise ValueError("pass either pool=... or model_path/pool_options (for the shared pool), not both")
        if self.pool_options:
            PoolConfig.build(**self.pool_options)  # cheap: validates names and values now, loads nothing
        return self

    # ------------------------------------------------------------------ pool and names
    def get_pool(self) -> MemoryPool:
        """The pool this object runs on (creates the shared pool on first use)."""
        if self.pool is not None:
            return self.pool
        return shared_pool(self.model_path, **self.pool_options)

    def resolved_model_name(self) -> str:
        """`model_name`, else the model file's stem (`gemma-3-270m-q4_k_m`)."""
        if self.model_name:
            return self.model_name
        if self._model_name is None:
            if self.pool is not None:
                self._model_name = Path(self.pool.model_path).stem
            else:
                try:
                    self._model_name = resolve_model_path(self.model_path).stem
                except AgentMemError:
                    self._model_name = Path(self.model_path).stem if self.model_path else "agentmem-default"
        return self._model_name

    # ------------------------------------------------------------------ per-call options
    def _agent_from(self, kwargs: dict[str, Any]) -> str:
        agent = kwargs.pop("agent_id", None) or self.agent_id
        if not isinstance(agent, str):
            raise ValueError(f"agent_id must be a non-empty string, got {agent!r}")
        return agent

    def _sampling_from(self, kwargs: dict[str, Any], stop: list[str] | None) -> dict[str, Any]:
        """Pool sampling options: per-call kwargs (popped) over the instance's fields."""
        out: dict[str, Any] = {}
        for key in SAMPLING_KEYS:
            value = kwargs.pop(key, None)
            if value is None:
                value = getattr(self, key)
            if value is not None:
                out[key] = value
        stops = [*(self.stop or []), *(stop or [])]
        if stops:
            out["stop"] = list(dict.fromkeys(stops))
        return out

    # ------------------------------------------------------------------ identity (both model kinds)
    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.resolved_model_name(),
            "agent_id": self.agent_id,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        params = super()._get_ls_params(stop=stop, **kwargs)  # type: ignore[misc]
        params["ls_provider"] = "agentmem"
        model = kwargs.get("model")
        params["ls_model_name"] = model if isinstance(model, str) else self.resolved_model_name()
        return params

    # ------------------------------------------------------------------ agent from config
    # `config["configurable"]["agent_id"]` picks the agent of one call (LangGraph-style).
    def invoke(self, input: Any, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any) -> Any:
        return super().invoke(input, config, stop=stop, **self._with_config_agent(config, kwargs))  # type: ignore[misc]

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any) -> Any:
        return await super().ainvoke(input, config, stop=stop, **self._with_config_agent(config, kwargs))  # type: ignore[misc]

    def stream(self, input: Any, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any) -> Iterator[Any]:
        return super().stream(input, config, stop=stop, **self._with_config_agent(config, kwargs))  # type: ignore[misc]

    def astream(self, input: Any, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any) -> AsyncIterator[Any]:
        return super().astream(input, config, stop=stop, **self._with_config_agent(config, kwargs))  # type: ignore[misc]

    @staticmethod
    def _with_config_agent(config: RunnableConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Take `agent_id` from `config["configurable"]` unless given as a kwarg."""
        if "agent_id" in kwargs:
            return kwargs
        cfg = ensure_config(config)
        agent = (cfg.get("configurable") or {}).get("agent_id")
        return {**kwargs, "agent_id": agent} if agent else kwargs

    @staticmethod
    def _reject_unknown(kwargs: Mapping[str, Any], allowed: set[str]) -> None:
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise ValueError(f"unsupported argument(s) {unknown}; valid per-call arguments: {sorted(allowed)}")
