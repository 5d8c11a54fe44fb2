"""`ModelEngine`: many agents, one model, one llama.cpp context, no re-prefill on switch.

`ModelEngine` is one model's engine inside the public `agentmem.MemoryPool` (a pool of
one model or of many: `agentmem.models.pool`). It validates input, wires the
collaborators that run a call (see `agentmem.pool`), and offers the sync,
streaming and async calls, the agent operations (park, forget, pin, budgets,
share, handoff, recall, checkpoints: `agentmem.pool.operations`), the workflow hints
(`expect`, `hold`, `unhold`: `agentmem.pool.hints`), conversation lines
(`find_line`: `agentmem.pool.lines`) and `close`.

Thread-safety: every context operation runs under one re-entrant lock; an agent
held by a call or a pin (`agentmem.pool.residence`) is never parked under its feet. Async methods
run the blocking work in worker threads; `close` is safe at any moment (`lifetime`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

import agentmem.validation as check
from agentmem.config import PoolConfig
from agentmem.engine.chat_format import Message, normalize_tools
from agentmem.engine.sampling import SamplingParams
from agentmem.errors import ConfigError, PoolClosedError
from agentmem.pool.hints import HintMethods
from agentmem.pool.lifetime import Lifetime, free_handles, free_pool, in_use
from agentmem.pool.lines import LineMethods
from agentmem.pool.opening import open_core, wire
from agentmem.pool.operations import AgentMethods
from agentmem.pool.prefetch import Prefetcher
from agentmem.pool.recalling import RecallMethods
from agentmem.pool.results import ChatResult, ChatStream, drive_async
from agentmem.pool.stats import pool_stats
from agentmem.pool.tenants import TenantMethods
from agentmem.tools.canonical import watch_for
from agentmem.tools.formats import ToolFormat

__all__ = ["ModelEngine"]

logger = logging.getLogger(__name__)

_SAMPLING_OPTIONS = frozenset({"top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed", "grammar"})


class ModelEngine(HintMethods, TenantMethods, LineMethods, AgentMethods, RecallMethods):
    """Keeps every agent's KV state across one shared llama.cpp context (one model's engine).

    At most `resident_agents` agents are *hot* (a live sequence). When another
    agent needs a sequence, the placement policy picks an idle one to *park*: its
    KV state is copied out to the WARM tier (RAM, optionally quantized) and
    restored — milliseconds — when it is called again. With `archive_path` a COLD
    tier (SQLite) takes states that overflow the RAM budget and makes agents
    durable across restarts. A predictor restores the likely next agent ahead of
    its call. Each call decodes only what the agent's KV does not already hold;
    with a token budget the eviction policy trims the agent and archives the
    evicted text for recall.

    Args:
        model: a bundled model's name (`gemma-3-270m`, `qwen2.5-coder-0.5b-instruct`)
            or a GGUF path; `None` uses `AGENTMEM_MODEL` or the default bundled model
            (Gemma 3 270M Q4_K_M). Stored as `PoolConfig.model_path`.
        config: a `PoolConfig`; keyword arguments override its fields
            (`n_ctx`, `resident_agents`, `park_codec`, `archive_path`,
            `agent_budget_tokens`, ... — see `PoolConfig`).

    Example:
        Real output on the default model, 2 CPU cores:

        >>> from agentmem.pool import ModelEngine
        >>> with ModelEngine(n_ctx=4096, resident_agents=2) as pool:   # doctest: +SKIP
        ...     msgs = [{"role": "user", "content": "Name a colour."}]
        ...     r = pool.chat("planner", msgs, max_tokens=8)
        ...     print(r.kv, r.usage.prompt_tokens, r.usage.cached_tokens)
        ...     msgs += [{"role": "assistant", "content": r.text}, {"role": "user", "content": "Another."}]
        ...     r = pool.chat("planner", msgs, max_tokens=8)
        ...     print(r.kv, r.usage.prompt_tokens, r.usage.cached_tokens)
        prefilled 11 0
        reused 27 18
    """

    _resume_on_open = True  # register every archived agent at open (a cluster replica loads them one by one)

    def __init__(self, model: str | os.PathLike[str] | None = None, *, config: PoolConfig | None = None,
                 **options: Any) -> None:
        base = config or PoolConfig()
        if model is not None:
            if options.get("model_path") is not None:
                raise ConfigError("pass the model once: either model=... or model_path=..., not both")
            options["model_path"] = str(model)
        self.config = base.replace(**options) if options else base
        cfg = self.config
        self._closed = True  # until fully built, close() is a no-op
        self._life = Lifetime()  # who uses the native handles (close frees them when nobody does)
        self._core = core = open_core(cfg)
        self.model_path, self.model, self.ctx = core.model_path, core.model, core.ctx
        self.renderer, self.fingerprint, self.capacity = core.renderer, core.fingerprint, core.capacity
        archive = core.archive
        try:
            for spec in {cfg.park_codec, cfg.cold_codec, cfg.background_codec, cfg.recall_kv_codec}:
                core.codec(spec)
            c = wire(core, after_call=lambda agent_id: self._prefetcher.after_call(agent_id))
            self._blocks, self._persist, self._residency, self._mover = c.blocks, c.persist, c.residency, c.mover
            self._budgets, self._sharing, self._decoder, self._turns = c.budgets, c.sharing, c.decoder, c.turns
            self._hints = c.hints
            self._span_kv = c.span_kv
            self._closed = False
            if archive is not None and self._resume_on_open:
                with core.lock:
                    self._persist.resume()
        except BaseException:  # a pool that is not built frees what it holds (the shared weights included)
            self._closed = True
            with core.lock:
                free_handles(core)
            raise
        # async calls wait on the pool most of the time: give them enough threads that
        # every resident agent can be in a decode batch (asyncio's default pool has cpu+4)
        self._executor = ThreadPoolExecutor(max_workers=max(32, 4 * cfg.resident_agents), thread_name_prefix="agentmem")
        self._prefetcher = Prefetcher(
            core,
            rebalance=self._budgets.rebalance,
            restore=lambda a: self._mover.make_resident(a, prefetch=True).how == "restored",
            enabled=cfg.prefetch and cfg.resident_agents > 1,
            hints=c.hints,
        )
        logger.info(
            "pool ready: %s, n_ctx=%d, resident_agents=%d, park_codec=%s, archive=%s",
            self.model_path.name, self.ctx.n_ctx, cfg.resident_agents, cfg.park_codec, cfg.archive_path,
        )

    # ------------------------------------------------------------------ lifetime
    def close(self, timeout_s: float = 30.0) -> None:
        """Persist agents to the archive (if any), then free everything (idempotent; any thread, any moment).

        Calls in flight stop with `PoolClosedError` at their next prefill chunk or decode step; close waits up to
        `timeout_s` for them and frees native handles only when no call uses them (`agentmem.pool.lifetime`).
        """
        if self._closed:
            return
        self._closed = self._core.closed = True
        self._life.close(lambda: free_pool(self._core, self._prefetcher, self._mover, self._executor), timeout_s=timeout_s)

    closed = property(lambda self: self._closed, doc="True after `close`.")

    def __enter__(self) -> ModelEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def storage_fault(self) -> str | None:
        """Why the archive refused the last write for lack of space (`ArchiveFullError`); None once one commits."""
        return None if self._core.archive is None else self._core.archive.storage_fault

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("the pool is closed")

    @property
    def batch_wait_s(self) -> float:
        """How long a decode-batch leader waits for other generating agents to join (seconds)."""
        return self._decoder.batch_wait_s

    @batch_wait_s.setter
    def batch_wait_s(self, seconds: float) -> None:
        self._decoder.batch_wait_s = seconds

    # ------------------------------------------------------------------ calls
    def chat(
        self,
        agent_id: str,
        messages: Iterable[Mapping[str, Any] | Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        stop: str | Sequence[str] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        canonical_calls: bool = True,
        opening: str | None = None,
        **sampling: Any,
    ) -> ChatResult:
        """Continue `agent_id`'s conversation and return the reply.

        `messages` is the agent's *whole* history (as frameworks send it); only
        the part after what its KV already holds is decoded. Extra sampling
        options: `top_k`, `top_p`, `min_p`, `repeat_penalty`, `seed`,
        `grammar` (GBNF).

        `tools` (`{"name", "description", "parameters"}` each) are shown to the model
        the way `tool_format` says: through the chat template when it has native tool
        support, else as agentmem's tools block at the end of the system message. Pass
        the same tools on every call of an agent: they are part of its prompt prefix.
        A reply that calls one of them holds the agent resident until its next call
        (`hold` with the default TTL): it runs again when the tool returns.

        A free reply that opens as a bare call object gets its format's opening in KV and text
        (`agentmem.pool.canon`: the next call then reuses the whole call's KV), unless `canonical_calls=False`.
        `opening` (trusted: a forced call's prefix from `ToolFormat.forced`, with its `grammar`) starts
        the reply as the template renders a call, not as message text; the reply's text leaves it out.

        Raises:
            MessageError: a malformed message (the error names the field).
            ContextOverflowError: the prompt does not fit `capacity` (and the
                agent has no token budget to evict down to).
        """
        return self.chat_stream(agent_id, messages, max_tokens=max_tokens, temperature=temperature, stop=stop,
                                tools=tools, canonical_calls=canonical_calls, opening=opening, **sampling).drain()

    @in_use
    def chat_stream(
        self,
        agent_id: str,
        messages: Iterable[Mapping[str, Any] | Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        stop: str | Sequence[str] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        canonical_calls: bool = True,
        opening: str | None = None,
        **sampling: Any,
    ) -> ChatStream:
        """Like `chat` but yields text pieces; `.result` holds the `ChatResult` at the end.

        Validation happens here (before the first `next`), so bad input fails fast.
        """
        self._check_open()
        check.agent_id(agent_id)
        params = self._params(max_tokens, temperature, stop, sampling)
        msgs = check.message_list(messages)
        prompt = self.renderer.render(msgs, tools=tools)
        names = [t["name"] for t in normalize_tools(tools)] if params.grammar is None or params.lazy else []
        prompt, forced = self._turns.canon.opening(prompt, opening, self.renderer.tool_format)  # a forced call's
        watch = None if forced else watch_for(self.renderer.tool_format, names, canonical_calls)
        cancel = self._life.cancel_flag()
        run = self._turns.run(agent_id, prompt, params, n_messages=len(msgs), watch=watch, forced=forced, cancel=cancel)
        return ChatStream(self._life.stream(self._tracked(agent_id, run, tools, self.renderer.tool_format)), cancel=cancel)

    def complete(
        self, agent_id: str, prompt: str, *, max_tokens: int = 256, temperature: float = 0.0,
        stop: str | Sequence[str] | None = None, **sampling: Any,
    ) -> ChatResult:
        """Raw completion of `prompt` (no chat template) in `agent_id`'s context."""
        return self.complete_stream(agent_id, prompt, max_tokens=max_tokens, temperature=temperature, stop=stop,
                                    **sampling).drain()

    @in_use
    def complete_stream(
        self, agent_id: str, prompt: str, *, max_tokens: int = 256, temperature: float = 0.0,
        stop: str | Sequence[str] | None = None, **sampling: Any,
    ) -> ChatStream:
        """Streaming `complete`."""
        self._check_open()
        check.agent_id(agent_id)
        params = self._params(max_tokens, temperature, stop, sampling)
        cancel = self._life.cancel_flag()
        run = self._turns.run(agent_id, self.renderer.render_text(prompt), params, n_messages=1, cancel=cancel)
        return ChatStream(self._life.stream(self._tracked(agent_id, run, None, None)), cancel=cancel)

    async def achat(self, agent_id: str, messages: Iterable[Mapping[str, Any] | Message], **kw: Any) -> ChatResult:
        """Async `chat` (runs in a worker thread; never blocks the event loop)."""
        self._check_open()
        msgs = check.message_list(messages)
        return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: self.chat(agent_id, msgs, **kw))

    async def acomplete(self, agent_id: str, prompt: str, **kw: Any) -> ChatResult:
        """Async `complete`."""
        self._check_open()
        return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: self.complete(agent_id, prompt, **kw))

    async def achat_stream(
        self, agent_id: str, messages: Iterable[Mapping[str, Any] | Message], **kw: Any
    ) -> AsyncIterator[str | ChatResult]:
        """Async streaming: yields text pieces, then the final `ChatResult`."""
        stream = self.chat_stream(agent_id, check.message_list(messages), **kw)
        async for item in drive_async(stream):
            yield item

    async def acomplete_stream(self, agent_id: str, prompt: str, **kw: Any) -> AsyncIterator[str | ChatResult]:
        """Async streaming completion: text pieces, then the `ChatResult`."""
        stream = self.complete_stream(agent_id, prompt, **kw)
        async for item in drive_async(stream):
            yield item

    # ------------------------------------------------------------------ agents
    @in_use
    def stats(self) -> dict[str, Any]:
        """Where every agent's KV lives and what the pool did.

        `{"agents": {id: {"tokens", "live_tokens", "tier", "bytes", "codec",
        "seq", "priority", "regions", "evicted_regions", counters...}},
        "tiers": {"hot"|"warm"|"cold": {"agents", "bytes", "hits"}},
        "totals": {...}, "shared": {"blocks", "ram_bytes", "archive_bytes",
        "parked_bytes_saved"}, "hints": {"expected", "hits", "hit_rate", ...}}`
        (see `agentmem.pool.hints.Hints.stats`). `tier` is `"hot"` (live sequence), `"warm"`
        (RAM), `"cold"` (archive) or `"empty"`; `bytes` is what the state
        occupies there (for an agent with a shared `block`: its private cells;
        the block's bytes are under `"shared"`, counted once).
        """
        with self._core.lock:
            return {**pool_stats(self._core), "hints": self._hints.stats()}

    def agents(self) -> list[str]:
        """Ids of the agents the pool knows."""
        self._check_open()
        with self._core.lock:
            return list(self._core.agents)

    @in_use
    def count_tokens(
        self, messages: Iterable[Mapping[str, Any] | Message], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> int:
        """Prompt tokens the messages (and `tools`, as `chat` shows them) render to, chat template included."""
        return len(self.renderer.render(check.message_list(messages), tools=tools))

    @property
    def tool_format(self) -> ToolFormat:
        """The model's tool-call syntax (`agentmem.tools.formats`); integrations parse, force, stream with it."""
        return self.renderer.tool_format

    def _params(self, max_tokens: int, temperature: float, stop: Any, extra: Mapping[str, Any]) -> SamplingParams:
        unknown = set(extra) - _SAMPLING_OPTIONS
        if unknown:
            raise ConfigError(f"unknown sampling option(s) {sorted(unknown)}; valid: {sorted(_SAMPLING_OPTIONS)}")
        kw = dict(extra)
        kw.setdefault("seed", self.config.seed)
        return SamplingParams.make(max_tokens=max_tokens, temperature=temperature, stop=stop, **kw)
