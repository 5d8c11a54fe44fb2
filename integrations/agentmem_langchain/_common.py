"""What the chat model and the LLM share: pool fields, agent identity, sampling, locking."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncContextManager, AsyncIterator, ContextManager, Iterator, Mapping

from typing_extensions import Self

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from agentmem import AgentMemError, ChatResult, MemoryPool, PoolConfig, resolve_model_path
from agentmem import tools as _tools
from agentmem import validation as check
from agentmem.calls import turns_for
from agentmem.models import ModelLease
from agentmem.models.seats import aseat, check_model, model_for, model_name, seat

from ._hints import GraphFollower, follower_for, hold_after_reply
from ._identity import AgentIdFromConfig, resolve_agent
from ._rewrites import is_summarizer_call

__all__ = ["AgentMemFields", "agent_lock", "async_agent_lock", "shared_pool", "timings_dict", "usage_dict"]

#: Per-call keyword arguments that map straight to `MemoryPool.chat` sampling options.
SAMPLING_KEYS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed")


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


def agent_lock(pool: MemoryPool, agent_id: str) -> ContextManager[None]:
    """One call at a time per agent (`agentmem.calls.turns_for(pool).hold`).

    Two overlapping calls for the same agent (`batch` runs inputs in threads)
    would both extend the same llama.cpp sequence; they are serialized here, with
    every other front-end's calls on the pool. Calls for different agents overlap freely.
    """
    return turns_for(pool).hold(agent_id)


def async_agent_lock(pool: MemoryPool, agent_id: str) -> AsyncContextManager[None]:
    """`agent_lock` for coroutines: waits on the event loop (no thread, no polling); a cancelled waiter never holds it."""
    return turns_for(pool).ahold(agent_id)


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


def _ends_in_tool_call(out: Any) -> bool:
    return bool(getattr(out, "tool_calls", None))


def timings_dict(result: ChatResult) -> dict[str, float]:
    t = result.timings
    return {"ttft_s": t.ttft_s, "restore_s": t.restore_s, "prefill_s": t.prefill_s, "decode_s": t.decode_s, "total_s": t.total_s}


class AgentMemFields(BaseModel):
    """Fields and helpers shared by `ChatAgentMem` and `AgentMemLLM`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    pool: MemoryPool | None = Field(default=None, exclude=True)
    """The `agentmem.MemoryPool` to run on, or a `MemoryPool` of several models (agents on
    several models: each call runs on its agent's model, held loaded until the reply
    ends). Several model objects (one per agent) can share one pool. `None`: a
    process-wide pool for `model_path` and `pool_options`, created on first use
    (constructing this object loads nothing)."""

    model: str | None = None
    """With a `MemoryPool` of several models: the model a new agent is bound to on its first call
    (`None`: the pool's default); a bound agent keeps its model, and naming
    another raises `ModelMismatchError`. Only with `pool=MemoryPool(models=...)`."""

    model_path: str | None = None
    """GGUF file of the shared pool (ignored when `pool` is given); `None` =
    `AGENTMEM_MODEL` or the bundled default model (Gemma 3 270M)."""

    pool_options: dict[str, Any] = Field(default_factory=dict)
    """`agentmem.PoolConfig` fields for the shared pool (`n_ctx`,
    `resident_agents`, ...). Objects with equal `model_path` and
    `pool_options` share one pool."""

    agent_id: str = "default"
    """Whose memory a call continues. When set explicitly, every call of this object
    uses it (unless a call passes `agent_id=...` or `configurable.agent_id`); left
    unset, a call inside a LangGraph graph continues `"{thread_id}/{node}"` (see
    `resolve_agent_id`), and `"default"` outside one."""

    workflow_hints: bool = True
    """Tell the pool what the app's workflow says: hold an agent whose reply is a tool
    call (`MemoryPool.hold`), and, after `follow(graph)`, which agents run next
    (`MemoryPool.expect`). `False` sends nothing."""

    agent_id_from_config: AgentIdFromConfig | None = Field(default=None, exclude=True)
    """Hook mapping a call's `RunnableConfig` to its agent id, tried before the
    built-in thread/node rule (`None` from it falls through to that rule)."""

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
    _follower: GraphFollower | None = PrivateAttr(default=None)

    @field_validator("agent_id")
    @classmethod
    def _check_agent_id(cls, v: str) -> str:
        return check.agent_id(v)

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
        check_model(self.pool, self.model)
        return self

    # ------------------------------------------------------------------ pool and names
    def get_pool(self) -> MemoryPool:
        """The pool this object runs on: `pool` as given (a `MemoryPool` of several models too), else the shared pool (created on first use)."""
        if self.pool is not None:
            return self.pool
        return shared_pool(self.model_path, **self.pool_options)

    def _seat(self, agent_id: str | None) -> ModelLease:
        """The seat of one call of `agent_id` (`agentmem.models.seat`): `with` it; `.pool` is the model's pool."""
        return seat(self.get_pool(), agent_id, model=self.model)

    async def _aseat(self, agent_id: str) -> ModelLease:
        """`_seat` from a coroutine (a model's load runs in a worker thread)."""
        return await aseat(self.get_pool(), agent_id, model=self.model)

    def _model_seat(self) -> ModelLease:
        """A seat on the model of this object's own agent, for what is not a call (counting tokens); binds nothing."""
        pools = self.get_pool()
        return seat(pools, None, model=model_for(pools, self.agent_id, self.model))

    def _seat_name(self, seat: ModelLease) -> str:
        """The model name a reply of `seat` reports: `model_name`, else the seat's model, else `resolved_model_name()`."""
        return self.model_name or seat.name or self.resolved_model_name()

    def resolved_model_name(self) -> str:
        """`model_name`; else, on a pool, the model of this object's agent (its binding, `model`, else the
        default: in a pool of one, the model file's stem); without one, the stem of `model_path`'s file."""
        if self.model_name:
            return self.model_name
        if self.pool is not None:
            return model_name(self.pool, self.agent_id, self.model)
        if self._model_name is None:
            try:
                self._model_name = resolve_model_path(self.model_path).stem
            except AgentMemError:
                self._model_name = Path(self.model_path).stem if self.model_path else "agentmem-default"
        return self._model_name

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids of `text` in the model's own vocabulary (loads the shared pool if needed; no BOS, no chat template)."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        with self._model_seat() as lease:
            return lease.pool.model.tokenize(text)  # type: ignore[no-any-return]

    def get_num_tokens(self, text: str) -> int:
        """Tokens of `text` with the model's tokenizer (no chat template)."""
        return len(self.get_token_ids(text))

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
    # The agent of a call comes from its arguments and run config (`_identity.resolve_agent`,
    # LangGraph's thread and node included); hints go to the pool around the call (`_hints`).
    def invoke(self, input: Any, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any) -> Any:
        kwargs, cfg = self._with_config_agent(config, kwargs)
        out = super().invoke(input, config, stop=stop, **kwargs)  # type: ignore[misc]
        self._after_reply(kwargs["agent_id"], cfg, _ends_in_tool_call(out))
        return out

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any) -> Any:
        kwargs, cfg = self._with_config_agent(config, kwargs)
        out = await super().ainvoke(input, config, stop=stop, **kwargs)  # type: ignore[misc]
        self._after_reply(kwargs["agent_id"], cfg, _ends_in_tool_call(out))
        return out

    def stream(self, input: Any, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any) -> Iterator[Any]:
        kwargs, cfg = self._with_config_agent(config, kwargs)
        tool = False
        for chunk in super().stream(input, config, stop=stop, **kwargs):  # type: ignore[misc]
            tool = tool or bool(getattr(chunk, "tool_call_chunks", None))
            yield chunk
        self._after_reply(kwargs["agent_id"], cfg, tool)

    async def astream(self, input: Any, config: RunnableConfig | None = None, *, stop: list[str] | None = None, **kwargs: Any) -> AsyncIterator[Any]:
        kwargs, cfg = self._with_config_agent(config, kwargs)
        tool = False
        async for chunk in super().astream(input, config, stop=stop, **kwargs):  # type: ignore[misc]
            tool = tool or bool(getattr(chunk, "tool_call_chunks", None))
            yield chunk
        self._after_reply(kwargs["agent_id"], cfg, tool)

    def resolve_agent_id(self, config: RunnableConfig | None = None, *, agent_id: str | None = None) -> str:
        """The agent a call with run config `config` (and call argument `agent_id`) continues.

        Precedence, first match wins: the call argument; `configurable.agent_id`; this
        object's `agent_id` when set explicitly; `agent_id_from_config(config)`;
        `"{thread_id}/{node}"` from LangGraph's run config; the node alone; `"default"`.
        The summarizing call of LangChain's `SummarizationMiddleware` goes to
        `"<agent>/summarizer"`, so that its prompt does not replace the agent's KV.

        >>> ChatAgentMem().resolve_agent_id({"configurable": {"thread_id": "t1"},
        ...                                   "metadata": {"langgraph_node": "coder"}})  # doctest: +SKIP
        't1/coder'

        Raises:
            ConfigError: the resolved id is not a valid agent id; the message names its source.
        """
        cfg = ensure_config(config)
        agent = resolve_agent(
            cfg,
            explicit=agent_id,
            own=self.agent_id,
            own_is_explicit="agent_id" in self.model_fields_set,
            hook=self.agent_id_from_config,
        )
        if is_summarizer_call(cfg):
            agent = check.agent_id(f"{agent}/summarizer", field="agent_id (summarizer call)")
        return agent

    def _with_config_agent(self, config: RunnableConfig | None, kwargs: dict[str, Any]) -> tuple[dict[str, Any], RunnableConfig]:
        """`kwargs` with the call's resolved `agent_id`, and the run config it came from."""
        cfg = ensure_config(config)
        return {**kwargs, "agent_id": self.resolve_agent_id(cfg, agent_id=kwargs.get("agent_id"))}, cfg

    def _auto_agent(self, config: Mapping[str, Any]) -> str:
        """The agent id the automatic rules (hook, thread and node) give for `config`."""
        return resolve_agent(config, explicit=None, own=self.agent_id, own_is_explicit=False, hook=self.agent_id_from_config)

    # ------------------------------------------------------------------ workflow hints
    def follow(self, graph: Any) -> Self:
        """Tell the pool, on each call from a node of `graph`, which agents run next.

        Args:
            graph: the compiled LangGraph graph whose nodes call this model
                (`StateGraph(...).compile()`), or a `{node: [successor, ...]}` dict.

        Returns:
            This model (call it once, before the graph runs).

        After a call from node `n`, `MemoryPool.expect` gets the agents of the nodes
        reachable from `n` along the graph's edges, nearest first; nodes that never
        call a model (tool nodes) are stepped over. Models built by
        `configurable_fields` do not inherit it.
        """
        self._follower = follower_for(graph)
        return self

    def _after_reply(self, agent_id: str, config: RunnableConfig, ends_in_tool_call: bool) -> None:
        """Hints once a reply is complete: hold a tool-calling agent; expect the graph's next agents."""
        if not self.workflow_hints:
            return
        if ends_in_tool_call:
            hold_after_reply(self.get_pool(), agent_id, True)
        if self._follower is not None:
            try:
                auto = agent_id == self._auto_agent(config)  # the id follows the node (and thread) it runs in
            except AgentMemError:
                auto = False
            self._follower.expect(self.get_pool(), agent_id, config, self._auto_agent, auto=auto)

    @staticmethod
    def _reject_unknown(kwargs: Mapping[str, Any], allowed: set[str]) -> None:
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise ValueError(f"unsupported argument(s) {unknown}; valid per-call arguments: {sorted(allowed)}")
