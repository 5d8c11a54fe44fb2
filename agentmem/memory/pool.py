"""MemoryPool: many agents, one model, one llama.cpp context, no re-prefill on switch.

* :class:`MemoryPool` maps agents onto the sequences of one shared context. At
  most ``resident_agents`` agents are *hot* (a live sequence). When another agent
  needs a sequence, the placement policy picks an idle one to *park*: its KV state
  is copied out to the WARM tier (RAM, optionally quantized) and restored —
  milliseconds — when it is called again. With ``archive_path`` a COLD tier (SQLite)
  takes states that overflow the RAM budget and makes agents durable across
  restarts. A predictor restores the likely next agent ahead of its call.
* Each call renders the messages to tokens (with region tags), finds the longest
  common prefix with the agent's ledger, drops only the divergent tail and
  decodes only the new tokens. With a token budget, the eviction policy trims the
  agent (``seq_rm`` + position shift) and archives the evicted text for recall.
* :class:`ChatResult` / :class:`Usage` / :class:`Timings` describe one call.

Thread-safety: every context operation runs under one re-entrant lock; an agent
that is generating is *busy* and is never parked under its feet. Async methods
run the blocking work in worker threads so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from concurrent.futures import ThreadPoolExecutor
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Iterator, Mapping, Sequence

import numpy as np

from agentmem.config import PoolConfig
from agentmem.engine.chat_format import ChatRenderer, Message, RenderedPrompt
from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel, llama_build_info
from agentmem.engine.sampling import Sampler, SamplingParams, TextAssembler
from agentmem.errors import (
    AgentMemError,
    ConfigError,
    ContextOverflowError,
    EngineError,
    FingerprintMismatch,
    StateError,
    UnknownAgentError,
)
from agentmem.memory.archive import Archive, EvictedSpan
from agentmem.memory.codec import parse_state
from agentmem.memory.ledger import Ledger
from agentmem.memory.parking import ParkCodec, ParkedState, make_park_codec
from agentmem.memory.prefetch import TransitionPredictor
from agentmem.memory.shared import (
    SHARE_PREFIX,
    BlockStore,
    HandoffCard,
    KVBlock,
    PrefixIndex,
    join_state,
    split_state,
    token_checksum,
)
from agentmem.memory.tiers import Tier, build_tiers
from agentmem.model import model_fingerprint, resolve_model_path
from agentmem.policy.placement import AgentInfo, get_policy, priority_weight
from agentmem.policy.view import LedgerView

__all__ = ["ChatResult", "ChatStream", "HandoffCard", "MemoryPool", "Timings", "Usage"]

logger = logging.getLogger(__name__)

_REBALANCE = "\x00rebalance"  # work item of the background worker (never a valid agent id there)


@dataclass(slots=True)
class Usage:
    """Token counts of one call.

    ``cached_tokens`` counts prompt tokens whose KV was reused (kept live or
    restored) instead of decoded in this call.
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class Timings:
    """Seconds spent in one call (``ttft_s`` runs from the call to the first token).

    ``evict_s`` is the time spent choosing and removing evicted blocks.
    """

    ttft_s: float = 0.0
    restore_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0
    evict_s: float = 0.0


@dataclass(slots=True)
class ChatResult:
    """What one ``chat``/``complete`` call produced.

    Attributes:
        text: generated text (stop strings removed).
        finish_reason: ``"stop"`` (end of turn or a stop string) or ``"length"``.
        kv: how the agent's KV was found: ``"reused"`` (live sequence),
            ``"restored"`` (parked state loaded), ``"shared"`` (a prefix taken
            from another agent or a declared share) or ``"prefilled"`` (nothing kept).
    """

    agent_id: str
    text: str
    finish_reason: str
    usage: Usage
    timings: Timings
    kv: str
    tokens: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Agent:
    id: str
    ledger: Ledger = field(default_factory=Ledger)
    seq: int | None = None
    tier: str = "empty"  # where its state is when not hot: warm / cold / empty
    busy: int = 0
    last_used: float = 0.0
    priority: int = 1
    budget: int = 0
    eviction: str = ""
    n_messages: int = 0
    prefetched: bool = False
    labels: dict[str, Any] = field(default_factory=dict)
    # end of the last prompt (history index, live position), before its reply was generated
    prompt_end: tuple[int, int] = (0, 0)
    # sliding-window layers as of prompt_end, captured when parked (see _move)
    # (a tuple ``(private blob, order)`` when stored cut against the parked state, see _ckpt_blob)
    swa_ckpt: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None
    # shared KV block its first cells belong to (parked states then keep only the rest)
    block: str | None = None
    # cells at positions below this may be tagged for other sequences too (seq_cp):
    # shifting them (eviction) would move them for everyone, so they are made private first
    shared_upto: int = 0
    counters: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("calls", "restores", "restore_failures", "parks", "demotions", "prefill_tokens", "cached_tokens",
             "evictions", "evicted_tokens"), 0
        )
    )
    evicted_regions: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Step:
    """One agent's next-token request in the decode batch."""

    agent: _Agent
    token: int
    sampler: Sampler
    result: int | None = None
    error: BaseException | None = None


class ChatStream(Iterator[str]):
    """Iterator over text pieces of a streaming call; ``result`` is set at the end."""

    def __init__(self, gen: Iterator[str | ChatResult]) -> None:
        self._gen = gen
        self.result: ChatResult | None = None

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> str:
        while True:
            item = next(self._gen)
            if isinstance(item, ChatResult):
                self.result = item
                continue
            return item

    def drain(self) -> ChatResult:
        """Consume the rest of the stream and return its :class:`ChatResult`."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        """Stop generating (frees the agent for other calls)."""
        self._gen.close()  # type: ignore[attr-defined]


class MemoryPool:
    """Keeps every agent's KV state across one shared llama.cpp context.

    Args:
        model_path: a GGUF file; ``None`` uses ``AGENTMEM_MODEL`` or the bundled
            default model (Gemma 3 270M Q4_K_M).
        config: a :class:`PoolConfig`; keyword arguments override its fields
            (``n_ctx``, ``resident_agents``, ``park_codec``, ``archive_path``,
            ``agent_budget_tokens``, ... — see :class:`PoolConfig`).

    Example (real output on the default model, 2 CPU cores)::

        >>> from agentmem import MemoryPool
        >>> with MemoryPool(n_ctx=4096, resident_agents=2) as pool:   # doctest: +SKIP
        ...     msgs = [{"role": "user", "content": "Name a colour."}]
        ...     r = pool.chat("planner", msgs, max_tokens=8)
        ...     print(r.kv, r.usage.prompt_tokens, r.usage.cached_tokens)
        ...     msgs += [{"role": "assistant", "content": r.text}, {"role": "user", "content": "Another."}]
        ...     r = pool.chat("planner", msgs, max_tokens=8)
        ...     print(r.kv, r.usage.prompt_tokens, r.usage.cached_tokens)
        prefilled 11 0
        reused 27 18
    """

    def __init__(self, model_path: str | None = None, *, config: PoolConfig | None = None, **options: Any) -> None:
        base = config or PoolConfig()
        if model_path is not None:
            options["model_path"] = str(model_path)
        self.config = base.replace(**options) if options else base
        cfg = self.config
        self._closed = True  # until fully built, close() is a no-op
        self.model_path = resolve_model_path(cfg.model_path)
        # validate names before loading anything heavy
        self._placement = get_policy(cfg.placement, warm_codec=cfg.park_codec, cold_codec=cfg.cold_codec,
                                     **({"background_codec": cfg.background_codec} if cfg.placement == "cost" else {}))
        self._codecs: dict[str, ParkCodec] = {}
        for spec in {cfg.park_codec, cfg.cold_codec, cfg.background_codec}:
            self._codec(spec)
        if cfg.agent_budget_tokens:
            self._eviction_policy(cfg.eviction)
        self.model = LlamaModel(self.model_path, n_gpu_layers=cfg.n_gpu_layers)
        self._archive: Archive | None = None
        try:
            self.ctx = LlamaContext(
                self.model,
                ContextParams(
                    n_ctx=cfg.n_ctx,
                    n_seq_max=cfg.resident_agents,
                    n_batch=cfg.n_batch,
                    n_ubatch=min(cfg.n_ubatch, cfg.n_batch),
                    n_threads=cfg.n_threads,
                    flash_attn=cfg.flash_attn,
                    type_k=cfg.type_k,
                    type_v=cfg.type_v,
                    swa_full=cfg.swa_full,
                    kv_unified=True,
                ),
            )
            self.renderer = ChatRenderer(self.model, cfg.chat_format)
            self.fingerprint = {
                "model": model_fingerprint(self.model_path),
                "type_k": cfg.type_k,
                "type_v": cfg.type_v,
                "flash_attn": cfg.flash_attn,
                "swa_full": cfg.swa_full,
                "n_seq_max": cfg.resident_agents,
                "kv_unified": True,
                "llama": llama_build_info(),
            }
            if cfg.archive_path:
                self._archive = Archive(cfg.archive_path)
            self._tiers: dict[str, Tier] = build_tiers(archive=self._archive, fingerprint=self.fingerprint)
            # evicted text goes to the archive (FTS5) or to a throwaway in-memory one
            self._recall_store = self._archive or Archive(":memory:")
        except BaseException:
            if self._archive is not None:
                self._archive.close()
            if hasattr(self, "ctx"):
                self.ctx.close()
            self.model.close()
            raise
        self.capacity = min(cfg.agent_capacity or cfg.n_ctx, self.ctx.n_ctx_seq)
        self._lock = self.ctx.lock
        self._cond = threading.Condition(self._lock)
        self._agents: dict[str, _Agent] = {}
        self._blocks = BlockStore()
        self._prefixes = PrefixIndex()  # radix tree over agents' shareable tokens (refreshed lazily)
        self._seq_waiters: dict[str, tuple[int, int]] = {}  # agent -> (priority, -arrival)
        self._seq_ticket = 0
        self._free_seqs: list[int] = list(range(cfg.resident_agents - 1, -1, -1))
        self._predictor = TransitionPredictor()
        self._totals: dict[str, int] = dict.fromkeys(
            ("calls", "restores", "restore_failures", "parks", "demotions", "drops", "prefill_tokens", "cached_tokens",
             "evictions", "evicted_tokens", "recalls", "recall_hits", "prefetches", "prefetch_hits", "prefetch_misses",
             "prefetch_wasted", "resumed_agents", "batched_steps", "batched_tokens", "max_batch",
             "shared_prefix_tokens", "shared_prefix_hits", "handoffs", "blocks_created", "blocks_freed",
             "block_splits", "block_split_misses", "privatized", "seq_waits", "linked_restores"), 0
        )
        self._tier_hits: dict[str, int] = {"hot": 0, "warm": 0, "cold": 0, "miss": 0}
        # continuous batching of decode steps across generating agents
        self._generating = 0
        self._pending: list[_Step] = []
        self._leader = False
        self.batch_wait_s = 0.002
        self._closed = False
        if self._archive is not None:
            self._resume_from_archive()
        # async calls wait on the pool most of the time: give them enough threads that
        # every resident agent can be in a decode batch (asyncio's default pool has cpu+4)
        self._executor = ThreadPoolExecutor(max_workers=max(32, 4 * cfg.resident_agents), thread_name_prefix="agentmem")
        self._prefetch_q: queue.Queue[str | None] | None = None
        self._prefetch_thread: threading.Thread | None = None
        if cfg.prefetch and cfg.resident_agents > 1:
            self._prefetch_q = queue.Queue()
            self._prefetch_thread = threading.Thread(target=self._prefetch_worker, name="agentmem-prefetch", daemon=True)
            self._prefetch_thread.start()
        logger.info(
            "pool ready: %s, n_ctx=%d, resident_agents=%d, park_codec=%s, archive=%s",
            self.model_path.name, self.ctx.n_ctx, cfg.resident_agents, cfg.park_codec, cfg.archive_path,
        )

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Persist agents to the archive (if any), then free everything (idempotent)."""
        if self._closed:
            return
        try:
            if self._prefetch_q is not None:
                self._prefetch_q.put(None)
                assert self._prefetch_thread is not None
                self._prefetch_thread.join(timeout=10)
            if self._archive is not None:
                try:
                    self._save_all(final=True)
                except AgentMemError as exc:
                    logger.error("could not save agents to %s on close: %s", self.config.archive_path, exc)
        finally:
            self._closed = True
            self._executor.shutdown(wait=False, cancel_futures=True)
            if self._archive is not None:
                self._archive.close()
            if self._recall_store is not self._archive:
                self._recall_store.close()
            self.ctx.close()
            self.model.close()

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def __enter__(self) -> MemoryPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise AgentMemError("the pool is closed")

    # ------------------------------------------------------------------ public API
    def chat(
        self,
        agent_id: str,
        messages: Iterable[Mapping[str, Any] | Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        stop: str | Sequence[str] | None = None,
        **sampling: Any,
    ) -> ChatResult:
        """Continue ``agent_id``'s conversation and return the reply.

        ``messages`` is the agent's *whole* history (as frameworks send it); only
        the part after what its KV already holds is decoded. Extra sampling
        options: ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``, ``seed``,
        ``grammar`` (GBNF).

        Raises:
            MessageError: a malformed message (the error names the field).
            ContextOverflowError: the prompt does not fit ``capacity`` (and the
                agent has no token budget to evict down to).
        """
        return self.chat_stream(
            agent_id, messages, max_tokens=max_tokens, temperature=temperature, stop=stop, **sampling
        ).drain()

    def chat_stream(
        self,
        agent_id: str,
        messages: Iterable[Mapping[str, Any] | Message],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        stop: str | Sequence[str] | None = None,
        **sampling: Any,
    ) -> ChatStream:
        """Like :meth:`chat` but yields text pieces; ``.result`` holds the ChatResult at the end.

        Validation happens here (before the first ``next``), so bad input fails fast.
        """
        params = self._params(max_tokens, temperature, stop, sampling)
        self._check_agent_id(agent_id)
        msgs = list(messages) if not isinstance(messages, (str, bytes)) else messages
        prompt = self.renderer.render(msgs)
        return ChatStream(self._run(agent_id, prompt, params, n_messages=len(msgs)))

    def complete(
        self,
        agent_id: str,
        prompt: str,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        stop: str | Sequence[str] | None = None,
        **sampling: Any,
    ) -> ChatResult:
        """Raw completion of ``prompt`` (no chat template) in ``agent_id``'s context."""
        return self.complete_stream(
            agent_id, prompt, max_tokens=max_tokens, temperature=temperature, stop=stop, **sampling
        ).drain()

    def complete_stream(
        self,
        agent_id: str,
        prompt: str,
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        stop: str | Sequence[str] | None = None,
        **sampling: Any,
    ) -> ChatStream:
        """Streaming :meth:`complete`."""
        params = self._params(max_tokens, temperature, stop, sampling)
        self._check_agent_id(agent_id)
        return ChatStream(self._run(agent_id, self.renderer.render_text(prompt), params, n_messages=1))

    async def achat(self, agent_id: str, messages: Iterable[Mapping[str, Any] | Message], **kw: Any) -> ChatResult:
        """Async :meth:`chat` (runs in a worker thread; never blocks the event loop)."""
        msgs = list(messages)
        return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: self.chat(agent_id, msgs, **kw))

    async def acomplete(self, agent_id: str, prompt: str, **kw: Any) -> ChatResult:
        """Async :meth:`complete`."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: self.complete(agent_id, prompt, **kw))

    async def achat_stream(
        self, agent_id: str, messages: Iterable[Mapping[str, Any] | Message], **kw: Any
    ) -> AsyncIterator[str | ChatResult]:
        """Async streaming: yields text pieces, then the final :class:`ChatResult`."""
        stream = self.chat_stream(agent_id, list(messages), **kw)
        async for item in self._drive_async(stream):
            yield item

    async def acomplete_stream(self, agent_id: str, prompt: str, **kw: Any) -> AsyncIterator[str | ChatResult]:
        """Async streaming completion: text pieces, then the :class:`ChatResult`."""
        stream = self.complete_stream(agent_id, prompt, **kw)
        async for item in self._drive_async(stream):
            yield item

    def stats(self) -> dict[str, Any]:
        """Where every agent's KV lives and what the pool did.

        ``{"agents": {id: {"tokens", "live_tokens", "tier", "bytes", "codec",
        "seq", "priority", "regions", "evicted_regions", counters...}},
        "tiers": {"hot"|"warm"|"cold": {"agents", "bytes", "hits"}},
        "totals": {...}, "shared": {"blocks", "ram_bytes", "archive_bytes",
        "parked_bytes_saved"}}``. ``tier`` is ``"hot"`` (live sequence), ``"warm"``
        (RAM), ``"cold"`` (archive) or ``"empty"``; ``bytes`` is what the state
        occupies there (for an agent with a shared ``block``: its private cells;
        the block's bytes are under ``"shared"``, counted once).
        """
        self._check_open()
        with self._lock:
            agents: dict[str, Any] = {}
            tiers = {t: {"agents": 0, "bytes": 0, "hits": self._tier_hits[t]} for t in ("hot", "warm", "cold")}
            live = self.config.type_k if self.config.type_k == self.config.type_v else f"{self.config.type_k}/{self.config.type_v}"
            for a in self._agents.values():
                tier, nbytes, codec = self._where(a)
                if a.seq is not None:
                    codec = live
                if tier in tiers:
                    tiers[tier]["agents"] += 1
                    tiers[tier]["bytes"] += nbytes
                agents[a.id] = {
                    "tokens": len(a.ledger),
                    "live_tokens": a.ledger.n_live,
                    "tier": tier,
                    "bytes": nbytes,
                    "codec": codec,
                    "seq": a.seq,
                    "priority": a.priority,
                    "budget": a.budget or self.config.agent_budget_tokens,
                    "share": a.id.startswith(SHARE_PREFIX),
                    "block": a.block,
                    "regions": a.ledger.region_counts(),
                    "evicted_regions": dict(a.evicted_regions),
                    **a.counters,
                }
            hot_cells = self.ctx.cells_size() if tiers["hot"]["agents"] else 0
            bpc = self.model.kv_bytes_per_cell(self.config.type_k, self.config.type_v)
            live_cells = sum(a.ledger.n_live for a in self._agents.values() if a.seq is not None)
            totals = dict(self._totals)
            totals.update(
                hot_cells_bytes=hot_cells,
                # what the live agents would occupy without shared cells, minus what they do occupy
                shared_bytes_saved=max(0, live_cells * bpc - hot_cells) if (hot_cells and bpc) else 0,
                agents=len(self._agents),
                resident=tiers["hot"]["agents"],
                hot_bytes=tiers["hot"]["bytes"],
                warm_bytes=tiers["warm"]["bytes"],
                cold_bytes=tiers["cold"]["bytes"],
                n_ctx=self.ctx.n_ctx,
                resident_agents=self.config.resident_agents,
            )
            p = totals["prefetch_hits"] + totals["prefetch_misses"]
            totals["prefetch_hit_rate"] = totals["prefetch_hits"] / p if p else 0.0
            return {"agents": agents, "tiers": tiers, "totals": totals, "shared": self._shared_stats()}

    def _shared_stats(self) -> dict[str, Any]:
        """Shared blocks, their references and what they save in the parked tiers (lock held)."""
        archived = {i.block_id: i.refcount for i in self._archive.list_shared_blocks()} if self._archive else {}
        blocks: dict[str, Any] = {}
        saved = 0
        for b in self._blocks:
            parked = 0
            for x in b.refs:
                m = self._agents.get(x)
                if m is None or m.seq is not None or m.tier not in self._tiers:
                    continue
                if m.tier == "warm":
                    st = self._tiers["warm"].get(x)
                    parked += bool(st is not None and st.block == b.id)
                else:
                    parked += 1
            copies = (b.data is not None) + (b.id in archived)
            saved += max(0, parked - copies) * b.nbytes
            blocks[b.id] = {
                "tokens": b.n_tokens, "refs": len(b.refs), "members": sorted(b.refs), "parked_refs": parked,
                "bytes": b.nbytes, "in_ram": b.data is not None, "in_archive": b.id in archived,
                "archive_refs": archived.get(b.id, 0),
            }
        return {
            "blocks": blocks,
            "ram_bytes": self._blocks.ram_bytes(),
            "archive_bytes": sum(b["bytes"] for b in blocks.values() if b["in_archive"]),
            # parked members' shared cells are stored once per tier instead of once per member (f16 basis)
            "parked_bytes_saved": saved,
        }

    def agents(self) -> list[str]:
        """Ids of the agents the pool knows."""
        with self._lock:
            return list(self._agents)

    def forget(self, agent_id: str) -> None:
        """Drop everything kept for ``agent_id`` (sequence, parked states, ledger, archive rows)."""
        with self._lock:
            a = self._agent(agent_id)
            if a.busy:
                raise AgentMemError(f"agent {agent_id!r} is generating; cannot forget it now")
            if a.seq is not None:
                self.ctx.seq_rm(a.seq)
                self._release_seq(a)
            for t in self._tiers.values():
                t.delete(agent_id)
            if self._archive is not None:
                self._archive.delete_agent(agent_id)
            self._block_leave(a)
            self._prefixes.remove(agent_id)
            self._predictor.forget(agent_id)
            del self._agents[agent_id]

    def park(self, agent_id: str, tier: str = "warm") -> None:
        """Move ``agent_id``'s KV out of its live sequence into ``tier`` (``warm`` or ``cold``) now."""
        with self._lock:
            a = self._agent(agent_id)
            if a.busy:
                raise AgentMemError(f"agent {agent_id!r} is generating; cannot park it now")
            if tier not in self._tiers:
                raise ConfigError(f"tier {tier!r} is not available; have {sorted(self._tiers)} (cold needs archive_path)")
            current = self._where(a)[0]
            if current != "empty" and current != tier:
                self._move(a, tier)
            self._rebalance()

    def set_priority(self, agent_id: str, priority: int | str) -> None:
        """``"foreground"``, ``"normal"``, ``"background"`` or an int weight (creates the agent if new)."""
        w = priority_weight(priority)
        self._check_agent_id(agent_id)
        with self._lock:
            self._agents.setdefault(agent_id, _Agent(agent_id)).priority = w

    def set_budget(self, agent_id: str, tokens: int, eviction: str | None = None) -> None:
        """Give ``agent_id`` its own live-token budget (``0`` = pool default) and eviction policy."""
        if not isinstance(tokens, int) or tokens < 0 or tokens > self.capacity:
            raise ConfigError(f"budget must be an int in [0, {self.capacity}], got {tokens!r}")
        if eviction is not None:
            self._eviction_policy(eviction)
        self._check_agent_id(agent_id)
        with self._lock:
            a = self._agents.setdefault(agent_id, _Agent(agent_id))
            a.budget = tokens
            a.eviction = eviction or ""

    def pin(self, agent_id: str, message_index: int, pinned: bool = True) -> int:
        """Pin (never evict) the tokens of message ``message_index`` of ``agent_id``; returns their count."""
        with self._lock:
            return self._agent(agent_id).ledger.set_pinned(message_index, pinned)

    def share(self, name: str, messages: Iterable[Mapping[str, Any] | Message]) -> int:
        """Declare a shared prefix (team brief, task, document); returns its token count.

        The messages are decoded once (as agent ``"share:<name>"``); any agent whose
        prompt starts with the same rendered tokens gets those cells without
        recompute: tagged in the live cache (``seq_cp``) or restored from the
        parked share. Undeclared common prefixes between agents are found too.
        """
        if not isinstance(name, str) or not name:
            raise ConfigError(f"share name must be a non-empty string, got {name!r}")
        msgs = list(messages)
        # Render with a following user turn and keep what precedes it: that is exactly
        # the prefix agents' prompts (shared messages + their own turns) start with.
        rendered = self.renderer.render(msgs + [{"role": "user", "content": "\u2063"}])
        spans = [sp for sp in rendered.spans if 0 <= sp.message < len(msgs) or (sp.message == -1 and sp.start == 0)]
        end = spans[-1].end if spans else 0
        if end < 1:
            raise ConfigError(f"share {name!r} renders to no tokens")
        prefix = RenderedPrompt(rendered.tokens[:end], spans)
        ChatStream(self._run(SHARE_PREFIX + name, prefix, SamplingParams(max_tokens=0), n_messages=len(msgs))).drain()
        with self._lock:
            sh = self._agents.get(SHARE_PREFIX + name)
            if sh is not None and sh.seq is not None and not sh.busy and sh.ledger.n_live == len(sh.ledger) == end:
                b = self._blocks.get(sh.block) if sh.block else None
                if b is None or b.n_tokens != end:
                    self._block_join(sh, self._block_new(sh))
        return end

    def handoff(self, src: str, dst: str, upto: int | None = None) -> HandoffCard:
        """Start ``dst``'s context as ``src``'s (its first ``upto`` history tokens), without recompute.

        A live source's cells are shared with the destination (``seq_cp``); a
        parked source's state is restored into the destination's sequence. The
        destination then diverges copy-on-write; the source is unaffected.
        """
        self._check_agent_id(dst)
        if src == dst:
            raise ConfigError("handoff needs two different agents")
        with self._lock:
            s = self._agent(src)
            n = len(s.ledger) if upto is None else upto
            if not isinstance(n, int) or not 0 < n <= len(s.ledger):
                raise ConfigError(f"upto must be in [1, {len(s.ledger)}] for agent {src!r}, got {upto!r}")
            d = self._agents.setdefault(dst, _Agent(dst))
            if s.busy or d.busy:
                raise AgentMemError(f"agent {(src if s.busy else dst)!r} is generating; cannot hand off now")
            d.busy += 1
            try:
                self._reset(d)
                self._acquire_seq(d)  # may park the source: then its parked state is handed over
                s.busy += 1
                try:
                    mode = self._copy_prefix(s, d, n)
                finally:
                    s.busy -= 1
            finally:
                d.busy -= 1
                s.last_used = d.last_used = time.monotonic()
                self._cond.notify_all()
            self._totals["handoffs"] += 1
            blk = self._blocks.get(d.block) if d.block else None
            return HandoffCard(
                src=src, dst=dst, seq_no=self._totals["handoffs"], n_tokens=n, n_live=d.ledger.n_live, mode=mode,
                fingerprint=self.fingerprint["model"], checksum=token_checksum(d.ledger.tokens[:n]),
                block=blk.id if blk else None, block_tokens=blk.n_tokens if blk else 0,
            )

    def recall(self, agent_id: str, query: str, k: int = 5) -> list[EvictedSpan]:
        """The ``k`` evicted spans of ``agent_id`` that best match ``query`` (full-text search)."""
        if not isinstance(query, str):
            raise ConfigError(f"query must be a string, got {type(query).__name__}")
        res = self._recall_store.search_evicted(agent_id, query, k)
        with self._lock:
            self._totals["recalls"] += 1
            self._totals["recall_hits"] += bool(res)
        return res

    def tokens(self, agent_id: str) -> list[int]:
        """The tokens whose KV ``agent_id`` holds (live ledger tokens, in KV order)."""
        with self._lock:
            return self._agent(agent_id).ledger.live_tokens().tolist()

    def history_tokens(self, agent_id: str) -> list[int]:
        """Every token of ``agent_id``'s history, evicted ones included."""
        with self._lock:
            return self._agent(agent_id).ledger.tokens.tolist()

    def count_tokens(self, messages: Iterable[Mapping[str, Any] | Message]) -> int:
        """Prompt tokens the messages render to (chat template included)."""
        return len(self.renderer.render(messages))

    def checkpoint(self) -> None:
        """Write every agent's ledger and state to the archive (hot ones stay hot)."""
        if self._archive is None:
            raise ConfigError("checkpoint() needs archive_path")
        self._save_all(final=False)

    def _save_all(self, *, final: bool) -> None:
        """Ledgers and states to the archive; with ``final`` (closing) resident agents are parked there.

        Parking (unlike a live snapshot) also keeps a Gemma 3 agent's sliding-window
        checkpoint, so after a restart it can still roll back its last reply.
        """
        assert self._archive is not None
        with self._lock:
            for a in list(self._agents.values()):
                if a.busy:
                    continue
                if final and a.seq is not None and a.ledger.n_live:
                    try:
                        self._move(a, "cold")
                        continue
                    except AgentMemError as exc:
                        logger.warning("could not park %r in the archive (%s); saving a snapshot", a.id, exc)
                state = None
                if a.seq is not None and a.ledger.n_live:
                    state = self._capture(a, self._placement.codec_for(self._info(a), "cold"))
                elif a.tier == "warm":
                    state = self._tiers["warm"].get(a.id)
                self._persist(a, state)

    # ------------------------------------------------------------------ internals: helpers
    def _params(self, max_tokens: int, temperature: float, stop: Any, extra: Mapping[str, Any]) -> SamplingParams:
        allowed = {"top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed", "grammar"}
        unknown = set(extra) - allowed
        if unknown:
            raise ConfigError(f"unknown sampling option(s) {sorted(unknown)}; valid: {sorted(allowed)}")
        kw = dict(extra)
        kw.setdefault("seed", self.config.seed)
        return SamplingParams.make(max_tokens=max_tokens, temperature=temperature, stop=stop, **kw)

    @staticmethod
    def _check_agent_id(agent_id: Any) -> None:
        if not isinstance(agent_id, str) or not agent_id:
            raise ConfigError(f"agent_id must be a non-empty string, got {agent_id!r}")

    def _agent(self, agent_id: str) -> _Agent:
        a = self._agents.get(agent_id)
        if a is None:
            raise UnknownAgentError(f"unknown agent {agent_id!r}; known: {sorted(self._agents)}")
        return a

    def _codec(self, spec: str) -> ParkCodec:
        c = self._codecs.get(spec)
        if c is None:
            c = self._codecs[spec] = make_park_codec(spec, rotate=self.config.park_rotate)
        return c

    @staticmethod
    def _eviction_policy(name: str, **params: Any) -> Any:
        from agentmem.policy.eviction import get_policy as get_eviction_policy

        return get_eviction_policy(name, **params)

    def _where(self, a: _Agent) -> tuple[str, int, str | None]:
        """(tier, bytes there, codec) of ``a``'s state."""
        if a.seq is not None:
            return "hot", (self.ctx.state_size(a.seq) if a.ledger.n_live else 0), None
        if a.tier in self._tiers:
            t = self._tiers[a.tier]
            if a.tier == "warm":
                st = t.get(a.id)
                return "warm", t.nbytes(a.id), st.codec if st else None
            info = self._archive.get_state_info(a.id) if self._archive else None
            return "cold", t.nbytes(a.id), info.codec if info else None
        return "empty", 0, None

    def _info(self, a: _Agent) -> AgentInfo:
        tier, nbytes, _ = self._where(a) if a.seq is None else ("hot", a.ledger.n_live * 20_000, None)
        return AgentInfo(
            id=a.id, tier=tier, nbytes=nbytes, n_tokens=a.ledger.n_live, priority=a.priority,
            idle_s=max(0.0, time.monotonic() - a.last_used), uses=a.counters["calls"],
            next_in=self._predictor.distance(a.id),
        )

    def _release_seq(self, a: _Agent) -> None:
        assert a.seq is not None
        self._free_seqs.append(a.seq)
        a.seq = None
        self._cond.notify_all()

    def _persist(self, a: _Agent, state: ParkedState | None) -> None:
        """Ledger (+ state) of ``a`` to the archive in one transaction."""
        assert self._archive is not None
        arr = a.ledger.to_arrays()
        n = len(arr["tok"])
        regions: list[tuple[int, int, str, int]] = []
        if n:
            key = np.stack([arr["reg"].astype(np.int64), arr["pin"], arr["live"], arr["msg"]], axis=1)
            change = np.flatnonzero(np.any(key[1:] != key[:-1], axis=1)) + 1
            starts = np.concatenate(([0], change))
            ends = np.concatenate((change, [n]))
            from agentmem.engine.chat_format import REGIONS

            for s, e in zip(starts, ends):
                flags = int(arr["pin"][s]) | (int(not arr["live"][s]) << 1) | ((int(arr["msg"][s]) + 1) << 2)
                regions.append((int(s), int(e), REGIONS[arr["reg"][s]], flags))
        with self._archive.transaction():
            self._archive.put_agent(a.id, priority=a.priority, labels={"budget": a.budget, "eviction": a.eviction, **a.labels})
            self._archive.put_ledger(a.id, arr["tok"], regions)
            if state is not None:
                if state.block is not None:
                    b = self._blocks.get(state.block)
                    if b is None:
                        raise StateError(f"shared block {state.block!r} of agent {a.id!r} is gone")
                    self._block_archive(b)
                self._tiers["cold"].put(a.id, state)
                if state.swa_ckpt is not None and a.prompt_end[1] > 0:
                    order = None if state.swa_order is None else np.ascontiguousarray(state.swa_order, "<i4")
                    self._archive.put_checkpoint(a.id, state.swa_ckpt, prompt_end=a.prompt_end, layout=order)

    def _resume_from_archive(self) -> None:
        """Register every archived agent as COLD (states load lazily, on first call)."""
        assert self._archive is not None
        from agentmem.engine.chat_format import REGIONS

        code = {r: i for i, r in enumerate(REGIONS)}
        for rec in self._archive.list_agents():
            led = self._archive.get_ledger(rec.agent_id)
            if led is None:
                continue
            n = len(led.tokens)
            arrays = {
                "tok": led.tokens, "reg": np.zeros(n, np.uint8), "pin": np.zeros(n, bool),
                "msg": np.zeros(n, np.int32), "live": np.ones(n, bool),
            }
            for s, e, region, flags in led.regions:
                arrays["reg"][s:e] = code.get(region, code["text"])
                arrays["pin"][s:e] = bool(flags & 1)
                arrays["live"][s:e] = not (flags & 2)
                arrays["msg"][s:e] = (flags >> 2) - 1
            a = _Agent(rec.agent_id, ledger=Ledger.from_arrays(arrays))
            try:
                a.priority = priority_weight(rec.priority)
            except AgentMemError:
                a.priority = 1
            labels = dict(rec.labels)
            a.budget = int(labels.pop("budget", 0) or 0)
            a.eviction = str(labels.pop("eviction", "") or "")
            a.labels = labels
            a.tier = "cold" if rec.state_bytes else "empty"
            if a.tier == "empty":
                a.ledger.clear()  # nothing decoded is kept: the next call prefills
            self._agents[a.id] = a
            self._totals["resumed_agents"] += 1
        for aid, pe in self._archive.checkpoint_prompt_ends().items():
            if aid in self._agents and self._agents[aid].tier == "cold":
                self._agents[aid].prompt_end = pe
        for info in self._archive.list_shared_blocks():
            self._blocks.register(KVBlock(info.block_id, info.n_tokens, "", None, info.n_bytes))
        for aid, bid in self._archive.state_blocks().items():
            a = self._agents.get(aid)
            if a is not None and a.tier == "cold" and bid in self._blocks:
                self._block_join(a, self._blocks.get(bid))  # type: ignore[arg-type]
        for b in self._blocks:
            if not b.refs:
                self._blocks.release(b.id, "")
        if self._agents:
            logger.info("resumed %d agent(s) from %s", len(self._agents), self.config.archive_path)

    # ------------------------------------------------------------------ internals: moving states
    def _move(self, a: _Agent, dst: str) -> None:
        """Move ``a``'s state to tier ``dst`` (``hot`` needs ``a.seq`` assigned): the one transition path.

        Raises :class:`StateError` when a stored state is unusable (the caller
        falls back to re-prefill).
        """
        src = "hot" if (a.seq is not None and dst != "hot") else a.tier
        info = self._info(a)
        if dst == "hot":
            assert a.seq is not None
            stored = self._tiers[src].get(a.id) if src in self._tiers else None
            if stored is None:
                raise StateError(f"no stored state for agent {a.id!r} in tier {src!r}")
            a.shared_upto = 0
            if not (stored.block is not None and self._restore_linked(a, stored)):
                blob = self._unpark_blob(stored)
                # 0 = rejected: a wrong layout, or not enough free cells in the shared cache;
                # for the latter, park idle agents and try again before giving up
                while self.ctx.state_set(a.seq, blob) == 0:
                    if not self._make_room(a):
                        raise StateError("llama_state_seq_set_data rejected the blob")
            pos_max = self.ctx.seq_pos_max(a.seq)
            if pos_max != a.ledger.n_live - 1:
                raise StateError(f"restored state ends at position {pos_max}, the ledger has {a.ledger.n_live} live tokens")
            a.swa_ckpt = stored.swa_ckpt
            if stored.swa_ckpt is not None and stored.swa_order is not None:
                a.swa_ckpt = (stored.swa_ckpt, stored.swa_order)  # joined only if used (see _ckpt_blob)
            if src == "warm":
                self._tiers["warm"].delete(a.id)
            a.tier = "empty"
            return
        codec = self._placement.codec_for(info, dst)
        if src == "hot":
            assert a.seq is not None
            if a.ledger.n_live:
                state = self._capture(a, codec)
                a.swa_ckpt = None
                pe_hist, pe_live = a.prompt_end
                if 0 < self.model.n_swa < a.ledger.n_live and 0 < pe_live < a.ledger.n_live - 1:
                    # The blob keeps the sliding-window layers only for the window before
                    # its end. The app usually re-sends the reply slightly differently
                    # (trimmed, edited), so keep those layers as of the prompt's end too:
                    # a restore can then roll back to it instead of re-prefilling. (Not
                    # needed when the whole history fits the window.) Counted in the state's bytes.
                    now = self.ctx.swa_state_get(a.seq)
                    self.ctx.seq_rm(a.seq, pe_live, -1)
                    ck = self.ctx.swa_state_get(a.seq)
                    try:  # keep only the cells the parked state itself lacks (about the reply's)
                        cut = split_state(ck, now, pe_live, partial=True)
                    except AgentMemError:
                        cut = None
                    state = dataclasses.replace(state, swa_ckpt=cut[0] if cut else ck, swa_order=cut[1] if cut else None)
                self._store(a, dst, state)
            else:
                self._block_leave(a)
            self.ctx.seq_rm(a.seq)
            a.shared_upto = 0
            self._release_seq(a)
            a.counters["parks"] += 1
            self._totals["parks"] += 1
            return
        stored = self._tiers[src].get(a.id)
        if stored is None:
            raise StateError(f"no stored state for agent {a.id!r} in tier {src!r}")
        if stored.codec != codec:  # transcode through f16 (a cut state stays cut)
            blob = self._codec(stored.codec).decode(stored) if stored.codec != "f16" else stored.data
            stored = dataclasses.replace(
                self._codec(codec).encode(blob, n_tokens=stored.n_tokens),
                block=stored.block, order=stored.order, swa_ckpt=stored.swa_ckpt, swa_order=stored.swa_order,
            )
        self._store(a, dst, stored)
        if src == "warm":
            self._tiers["warm"].delete(a.id)
        a.counters["demotions"] += 1
        self._totals["demotions"] += 1

    def _store(self, a: _Agent, tier: str, state: ParkedState) -> None:
        if tier == "cold":
            self._persist(a, state)
        else:
            self._tiers[tier].put(a.id, state)
        a.tier = tier
        if tier == "cold" and a.block is not None:
            b = self._blocks.get(a.block)
            if b is not None:
                self._block_trim(b, archived=a)  # its sequence, if any, is released next

    def _drop_state(self, a: _Agent) -> None:
        """Forget ``a``'s stored state (its ledger is cleared: the next call prefills)."""
        for t in self._tiers.values():
            t.delete(a.id)
        a.tier = "empty"
        a.ledger.clear()
        self._block_leave(a)
        self._totals["drops"] += 1

    def _rebalance(self, *, urgent_only: bool = False) -> None:
        """Apply the byte budgets of WARM and COLD with hysteresis.

        With ``urgent_only`` (on a call's critical path) only a tier above its
        budget itself is rebalanced; crossing the high watermark is handled after
        the call (:meth:`_after_call`), so demotion I/O does not delay a reply.
        Off the call path, WARM also keeps room for the largest state a switch
        could park next, so that park does not push it over the budget mid-call.
        Shared blocks count where they are held (RAM for WARM, the archive for COLD).
        """
        cfg = self.config
        for tier, budget in (("warm", cfg.warm_budget_bytes), ("cold", cfg.cold_budget_bytes)):
            if not budget or tier not in self._tiers:
                continue
            t = self._tiers[tier]

            high, low = cfg.watermark_high * budget, cfg.watermark_low * budget
            if tier == "warm" and not urgent_only:
                room = self._next_park_bytes()
                high, low = min(high, budget - room), min(low, budget - room)
            if self._tier_bytes(tier) <= (budget if urgent_only else high):
                continue
            members = [self._agents[x] for x in t.agents() if x in self._agents and self._agents[x].tier == tier]
            order = self._placement.demotion_order([self._info(x) for x in members if not x.busy])
            for info in order:
                if self._tier_bytes(tier) <= (cfg.watermark_low * budget if urgent_only else low):
                    break
                x = self._agents[info.id]
                if tier == "warm" and "cold" in self._tiers:
                    try:
                        self._move(x, "cold")
                        continue
                    except AgentMemError as exc:
                        logger.warning("demotion of %r to cold failed (%s); dropping its state", x.id, exc)
                logger.info("%s budget exceeded: dropping the state of %r (it will re-prefill)", tier, x.id)
                self._drop_state(x)

    def _tier_bytes(self, tier: str) -> int:
        """Bytes a tier holds, shared blocks included where they are kept (RAM / the archive)."""
        n = self._tiers[tier].total_bytes()
        if tier == "warm":
            return n + self._blocks.ram_bytes()
        assert self._archive is not None
        return n + sum(b.n_bytes for b in self._archive.list_shared_blocks())

    def _next_park_bytes(self) -> int:
        """f16 bytes of the largest idle resident state: what the next switch may park (lock held)."""
        sizes = [self.ctx.state_size(x.seq) for x in self._agents.values() if x.seq is not None and not x.busy and x.ledger.n_live]
        return max(sizes, default=0)

    def _acquire_seq(self, a: _Agent, *, prefetch: bool = False) -> str:
        """Make ``a`` resident (under the lock). Returns ``reused``/``restored``/``fresh``."""
        if a.seq is not None:
            return "reused"
        if prefetch and self._seq_waiters:
            return "busy"  # calls waiting for a sequence come first
        # Agents waiting for a sequence are served by priority (then arrival): only the
        # first in that order may take a free sequence or park an idle agent.
        self._seq_ticket += 1
        self._seq_waiters[a.id] = (a.priority, -self._seq_ticket)
        try:
            while True:
                if self._seq_waiters[a.id] == max(self._seq_waiters.values()):
                    if self._free_seqs:
                        break
                    idle = [x for x in self._agents.values() if x.seq is not None and not x.busy and x is not a]
                    if idle:
                        victim = self._agents[self._placement.demotion_order([self._info(x) for x in idle])[0].id]
                        if victim.prefetched:
                            self._totals["prefetch_wasted"] += 1
                            victim.prefetched = False
                        self._move(victim, "warm")
                        self._rebalance(urgent_only=True)
                        break
                if prefetch:
                    return "busy"
                logger.debug("agent %r waits for a free sequence", a.id)
                self._totals["seq_waits"] += 1
                self._cond.wait()
        finally:
            del self._seq_waiters[a.id]
            self._cond.notify_all()
        a.seq = self._free_seqs.pop()
        if a.tier in self._tiers:
            src = a.tier
            try:
                self._move(a, "hot")
            except AgentMemError as exc:
                level = logging.WARNING if not isinstance(exc, FingerprintMismatch) else logging.WARNING
                logger.log(level, "restore of agent %r from %s failed (%s); falling back to re-prefill", a.id, src, exc)
                self.ctx.seq_rm(a.seq)
                lost = a.ledger.n_live
                self._drop_state(a)
                a.counters["restore_failures"] += 1
                self._totals["restore_failures"] += 1
                if isinstance(exc, FingerprintMismatch) and lost:
                    logger.warning("agent %r: re-prefilling %d tokens from the stored ledger", a.id, lost)
                return "fresh"
            self._tier_hits[src] += 1
            a.counters["restores"] += 1
            self._totals["restores"] += 1
            return "restored"
        return "fresh"

    def _make_room(self, keep: _Agent) -> bool:
        """Park one idle resident agent (not ``keep``) to free KV cells."""
        idle = [x for x in self._agents.values() if x.seq is not None and not x.busy and x is not keep and x.ledger.n_live]
        if not idle:
            return False
        self._move(self._agents[self._placement.demotion_order([self._info(x) for x in idle])[0].id], "warm")
        self._rebalance(urgent_only=True)
        return True

    # ------------------------------------------------------------------ internals: shared blocks
    def _block_join(self, a: _Agent, b: KVBlock) -> None:
        if a.block == b.id:
            return
        self._block_leave(a)
        self._blocks.acquire(b.id, a.id)
        a.block = b.id

    def _block_leave(self, a: _Agent) -> None:
        """``a`` stops referencing its block (its stored states must no longer need it)."""
        if a.block is None:
            return
        bid, a.block = a.block, None
        if self._blocks.release(bid, a.id):
            self._totals["blocks_freed"] += 1
            logger.debug("shared block %s freed (no agent references it)", bid)
        else:
            b = self._blocks.get(bid)
            if b is not None:
                self._block_trim(b)

    def _block_trim(self, b: KVBlock, *, archived: _Agent | None = None) -> None:
        """Drop the RAM copy of a block when only archived agents (and ``archived``) need it."""
        if b.data is None or self._archive is None:
            return
        for x in b.refs:
            m = self._agents.get(x)
            if m is not None and m is not archived and (m.seq is not None or m.tier != "cold"):
                return
        if self._archive.has_shared_block(b.id):
            b.data = None

    def _block_data(self, b: KVBlock) -> np.ndarray:
        if b.data is None:
            got = self._archive.get_shared_block(b.id) if self._archive is not None else None  # CodecError if corrupt
            if got is None:
                raise StateError(f"shared block {b.id!r} is neither in RAM nor in the archive")
            b.data = np.frombuffer(got.blob, dtype=np.uint8)
        return b.data

    def _block_archive(self, b: KVBlock) -> None:
        assert self._archive is not None
        if not self._archive.has_shared_block(b.id):
            self._archive.put_shared_block(b.id, self._block_data(b), n_tokens=b.n_tokens, fingerprint=self.fingerprint)

    def _block_new(self, a: _Agent) -> KVBlock:
        """A block of all of ``a``'s cells (``a`` resident, its ledger all live)."""
        assert a.seq is not None
        b = self._blocks.create(a.ledger.tokens[: a.ledger.n_live], self.ctx.state_get(a.seq))
        self._totals["blocks_created"] += 1
        logger.debug("shared block %s: %d tokens, %.1f MiB", b.id, b.n_tokens, b.nbytes / 2**20)
        return b

    def _split(self, a: _Agent, blob: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``a``'s blob without its block's cells (+ order), or the blob whole when it cannot be cut."""
        b = self._blocks.get(a.block) if a.block else None
        if b is None:
            return blob, None
        try:
            cut = split_state(blob, self._block_data(b), b.n_tokens)
        except AgentMemError as exc:
            logger.debug("agent %r: cannot cut its state at block %s (%s)", a.id, b.id, exc)
            cut = None
        if cut is None:
            self._totals["block_split_misses"] += 1
            return blob, None
        self._totals["block_splits"] += 1
        return cut

    def _capture(self, a: _Agent, codec: str) -> ParkedState:
        """``a``'s live state, encoded with ``codec``; only its private cells when it has a block."""
        assert a.seq is not None
        blob, order = self._split(a, self.ctx.state_get(a.seq))
        state = self._codec(codec).encode(blob, n_tokens=a.ledger.n_live)
        if order is None:
            self._block_leave(a)
            return state
        return dataclasses.replace(state, block=a.block, order=order)

    def _unpark_blob(self, stored: ParkedState) -> np.ndarray:
        """The f16 blob of a stored state, joined with its shared block."""
        blob = self._codec(stored.codec).decode(stored) if stored.codec != "f16" else stored.data
        if stored.block is None:
            return blob
        b = self._blocks.get(stored.block)
        if b is None or stored.order is None:
            raise StateError(f"shared block {stored.block!r} of a parked state is gone")
        return join_state(self._block_data(b), blob, stored.order)

    def _restore_linked(self, a: _Agent, stored: ParkedState) -> bool:
        """Restore a cut state with its block's cells *shared* from a live member (lock held).

        The private cells are loaded, then ``seq_cp`` tags the live member's prefix
        cells for ``a`` too: no join, no copy of the prefix, and the live cache keeps
        the prefix once. Sliding-window cells a live member no longer holds (llama.cpp
        reuses them once they fall out of that member's window) would be missing, so
        they are checked; on any shortfall ``a``'s sequence is emptied and ``False``
        returned (the caller restores the joined blob instead).
        """
        assert a.seq is not None and stored.block is not None and stored.order is not None
        b = self._blocks.get(stored.block)
        if b is None or b.data is None:
            return False
        live = [x for x in (self._agents.get(r) for r in b.refs if r != a.id)
                if x is not None and x.seq is not None and x.block == b.id]
        if not live:
            return False
        # the member whose sliding-window cells reach back furthest covers the most
        m = min(live, key=lambda x: self.ctx.seq_pos_min(x.seq)) if self.model.n_swa > 0 else live[0]
        private = self._codec(stored.codec).decode(stored) if stored.codec != "f16" else stored.data
        order = stored.order
        n_sec = int(order[0])
        n_private = int(np.count_nonzero(order[1 + n_sec :] < 0))
        m.busy += 1  # _make_room must not park the member whose cells are linked
        try:
            if n_private:
                while self.ctx.state_set(a.seq, private) == 0:
                    if not self._make_room(a):
                        self.ctx.seq_rm(a.seq)
                        return False
            else:
                self.ctx.seq_rm(a.seq)
            self.ctx.seq_cp(m.seq, a.seq, 0, b.n_tokens)
            if self.model.n_swa > 0 and n_sec >= 2:
                # every sliding-window position the parked state had must be there
                lens = order[1 : 1 + n_sec]
                src = order[1 + n_sec :][int(lens[:-1].sum()) :]
                need = np.concatenate([src[src >= 0], parse_state(private).sections[-1].positions])
                have = parse_state(self.ctx.swa_state_get(a.seq)).positions
                if not np.isin(need, have).all():
                    logger.debug("agent %r: member %r no longer holds the window's cells; joining instead", a.id, m.id)
                    self.ctx.seq_rm(a.seq)
                    return False
        finally:
            m.busy -= 1
        a.shared_upto = b.n_tokens
        m.shared_upto = max(m.shared_upto, b.n_tokens)
        self._totals["linked_restores"] += 1
        return True

    def _ckpt_blob(self, a: _Agent, ckpt: Any) -> np.ndarray:
        """The sliding-window checkpoint as a blob.

        A checkpoint shares all but the reply's cells with the state it was parked
        with, so it is stored cut against that state's sliding-window layers and
        joined here with the live ones (``a`` must still hold the restored state).
        """
        if isinstance(ckpt, tuple):
            private, order = ckpt
            assert a.seq is not None
            return join_state(self.ctx.swa_state_get(a.seq), private, order)
        return ckpt

    def _privatize(self, a: _Agent) -> None:
        """Give ``a`` its own copies of cells it may share with other sequences (before shifting them)."""
        assert a.seq is not None
        blob = self.ctx.state_get(a.seq)
        while self.ctx.state_set(a.seq, blob) == 0:
            if not self._make_room(a):
                raise StateError(f"no room to make agent {a.id!r}'s shared cells private")
        a.shared_upto = 0
        self._totals["privatized"] += 1

    # ------------------------------------------------------------------ internals: eviction
    def _budget(self, a: _Agent) -> int:
        return a.budget or self.config.agent_budget_tokens

    def _evict(self, a: _Agent, target: int) -> float:
        """Evict ``a`` down to ``target`` live tokens with its policy; returns seconds spent."""
        t0 = time.perf_counter()
        led = a.ledger
        live = led.live
        msg = led.messages[live]
        turn = np.where(msg < 0, a.n_messages, msg).astype(np.int32)
        last_msg = a.n_messages - 1
        recent = led.tokens[(led.messages == last_msg) & live] if last_msg >= 0 else np.zeros(0, np.int32)
        view = LedgerView(
            tokens=led.live_tokens(), regions=led.regions[live], pinned=led.pinned[live], turn=turn,
            current_turn=a.n_messages, recent=recent,
        )
        policy = self._eviction_policy(a.eviction or self.config.eviction)
        ranges = policy.select(view, target=target, block=self.config.eviction_block)
        if not ranges:
            return time.perf_counter() - t0
        assert a.seq is not None
        first = ranges[0][0]
        if a.block is not None:
            b = self._blocks.get(a.block)
            if b is None or first < b.n_tokens:
                self._block_leave(a)
        if first < a.shared_upto:
            # shifting cells other sequences share would move them for those too
            self._privatize(a)
        # Remove every range, then shift each kept segment once by what was removed before
        # it: every cell moves once (one seq_add per range, each shifting everything after
        # it, cost O(ranges x cells) in llama.cpp's position maps: 0.6 ms per call at 2k).
        for s, e in ranges:
            self.ctx.seq_rm(a.seq, s, e)
        removed = 0
        for k, (s, e) in enumerate(ranges):
            removed += e - s
            nxt = ranges[k + 1][0] if k + 1 < len(ranges) else -1
            if nxt == -1 or nxt > e:
                self.ctx.seq_add(a.seq, e, nxt, -removed)
        hist = led.evict_live(ranges)
        # archive the evicted text, one row per contiguous history run
        msg_of = led.messages[hist]
        cuts = np.flatnonzero((np.diff(hist) != 1) | (np.diff(msg_of) != 0)) + 1  # one row per message run
        rows = []
        from agentmem.engine.chat_format import REGIONS

        regs = led.regions
        for run in np.split(hist, cuts):
            if run.size:
                text = self.model.detokenize(led.tokens[run].tolist())
                rows.append((int(run[0]), int(run[-1]) + 1, REGIONS[regs[run[0]]], text))
        if rows:
            self._recall_store.add_evicted_spans(a.id, rows)
        counts = np.bincount(regs[hist], minlength=len(REGIONS))
        for i, c in enumerate(counts):
            if c:
                a.evicted_regions[REGIONS[i]] = a.evicted_regions.get(REGIONS[i], 0) + int(c)
        a.counters["evictions"] += 1
        a.counters["evicted_tokens"] += int(hist.size)
        self._totals["evictions"] += 1
        self._totals["evicted_tokens"] += int(hist.size)
        dt = time.perf_counter() - t0
        logger.debug("agent %r: evicted %d tokens in %d ranges (%.2f ms)", a.id, hist.size, len(ranges), 1e3 * dt)
        return dt

    # ------------------------------------------------------------------ internals: decode
    def _decode(self, a: _Agent, tokens: Sequence[int], spans: Any, sampler: Sampler | None, t: Timings) -> int | None:
        """Decode ``tokens`` after ``a``'s ledger; sample one token if ``sampler``.

        Decoding and sampling happen under one lock hold so no other sequence's
        decode can overwrite the logits in between. With a token budget, the
        agent is trimmed before a chunk would push it over.
        """
        n = len(tokens)
        step = self.ctx.n_batch
        budget = self._budget(a)
        with self._lock:
            start = 0
            while start < n:
                chunk = tokens[start : start + step]
                if budget and a.ledger.n_live + len(chunk) + 1 > budget:
                    target = max(0, min(int(budget * self.config.eviction_low), budget - len(chunk) - 1))
                    t.evict_s += self._evict(a, target)
                pos0 = a.ledger.n_live
                assert a.seq is not None
                if pos0 + len(chunk) >= self.capacity:
                    raise ContextOverflowError(
                        f"agent {a.id!r} would hold {pos0 + len(chunk)} tokens; capacity is {self.capacity}"
                        + (" even after eviction (pinned tokens?)" if budget else ""),
                        n_tokens=pos0 + n - start,
                        capacity=self.capacity,
                    )
                try:
                    idx = self.ctx.decode_run(a.seq, chunk, pos0)
                except EngineError as exc:
                    if getattr(exc, "code", None) == 1 and self._make_room(a):
                        continue  # cells were freed; retry this chunk
                    if getattr(exc, "code", None) == 1:
                        raise ContextOverflowError(
                            f"the shared context ({self.ctx.n_ctx} cells) is full and no idle agent can be parked; "
                            f"raise n_ctx or lower resident_agents",
                            n_tokens=pos0 + n - start,
                            capacity=self.ctx.n_ctx,
                        ) from exc
                    raise
                if spans is None:
                    a.ledger.extend(chunk, None, region="assistant", message=a.n_messages)
                else:
                    a.ledger.extend(chunk, spans)
                start += len(chunk)
            if sampler is None:
                return None
            return sampler.sample(self.ctx.ptr, idx)

    def _reset(self, d: _Agent) -> None:
        """Empty ``d``'s KV, stored states and ledger (it keeps its sequence if it has one)."""
        if d.seq is not None:
            self.ctx.seq_rm(d.seq)
        for t in self._tiers.values():
            t.delete(d.id)
        d.tier = "empty"
        d.ledger = Ledger()
        d.shared_upto = 0
        self._block_leave(d)

    def _copy_prefix(self, s: _Agent, d: _Agent, n: int) -> str:
        """Give ``d`` (resident) the first ``n`` history tokens of ``s`` and their KV (lock held, both busy)."""
        assert d.seq is not None, "the destination needs a sequence"
        self._reset(d)
        n_live = s.ledger.live_before(n)
        arrays = {k: v[:n] for k, v in s.ledger.to_arrays().items()}
        if s.seq is not None:
            if self.model.n_swa > 0 and n_live > 0:
                # the donor's sliding-window cells below its own window may have been reused
                pmin = self.ctx.seq_pos_min(s.seq)
                if pmin > max(0, n_live - self.model.n_swa + 1):
                    raise StateError(f"agent {s.id!r} no longer holds the sliding-window cells before position {n_live}")
            self.ctx.seq_cp(s.seq, d.seq, 0, n_live)
            d.shared_upto = n_live
            s.shared_upto = max(s.shared_upto, n_live)
            mode = "shared"
        else:
            stored = self._tiers[s.tier].get(s.id) if s.tier in self._tiers else None
            if stored is None:
                raise StateError(f"agent {s.id!r} has no KV state to hand off")
            blob = self._unpark_blob(stored)
            if self.ctx.state_set(d.seq, blob) == 0:
                raise StateError(f"the state of agent {s.id!r} could not be loaded for the handoff")
            if n_live < s.ledger.n_live:
                pmin = self.ctx.seq_pos_min(d.seq)
                if self.model.n_swa > 0 and pmin > max(0, n_live - self.model.n_swa + 1):
                    self.ctx.seq_rm(d.seq)
                    raise StateError(
                        f"agent {s.id!r} is parked past its sliding window; hand off from it while it is live"
                    )
                self.ctx.seq_rm(d.seq, n_live, -1)
            mode = "restored"
        d.ledger = Ledger.from_arrays(arrays)
        if n_live == n and n >= max(1, self.config.min_share_tokens):
            # one shared block for the prefix: parked copies of both then keep it once. A
            # donor's block that covers part of the prefix is reused (the rest is private).
            b = self._blocks.get(s.block) if s.block else None
            if b is None or b.n_tokens > n_live:
                b = self._block_new(d)
                if s.block is None and mode == "shared":
                    self._block_join(s, b)
            self._block_join(d, b)
        return mode

    def _share_prefix(self, a: _Agent, prompt: RenderedPrompt) -> int:
        """Give a fresh agent the longest prefix of ``prompt`` another agent holds (lock held)."""
        n_min = self.config.min_share_tokens
        if not n_min or len(prompt.tokens) <= n_min:
            return 0
        toks = np.asarray(prompt.tokens, dtype=np.int32)
        cands: dict[str, _Agent] = {}
        for x in self._agents.values():
            if x is a or x.busy or not len(x.ledger) or not (x.seq is not None or x.tier in self._tiers):
                continue
            cands[x.id] = x
            led = x.ledger
            live = led.live
            shareable = len(led) if live.all() else int(np.argmin(live))  # up to the first evicted token
            self._prefixes.sync(x.id, led.tokens[:shareable], version=led.version)
        ranked: list[tuple[int, str]] = []
        for xid, n in self._prefixes.matches(toks):
            x = cands.get(xid)
            if x is None:
                continue
            n = min(n, len(toks) - 1)
            if n < n_min:
                break  # longest first: the rest are shorter
            if x.seq is None and self.model.n_swa > 0:
                # a parked state keeps only the last window of the sliding-window layers
                # (positions from n_live - n_swa): it can be cut back only within that
                if max(0, x.ledger.n_live - self.model.n_swa) > max(0, n - self.model.n_swa + 1):
                    continue
            ranked.append((n, x.id))
        ranked.sort(key=lambda t: (-t[0], self._agents[t[1]].seq is None, t[1]))  # longest first, live first
        for n, donor_id in ranked:
            donor = self._agents[donor_id]
            donor.busy += 1
            try:
                self._copy_prefix(donor, a, n)
            except AgentMemError as exc:
                logger.debug("prefix share from %r to %r failed: %s", donor_id, a.id, exc)
                self._reset(a)
                continue
            finally:
                donor.busy -= 1
            break
        else:
            return 0
        # the copied ledger carries the donor's regions; re-tag with this prompt's spans
        a.ledger.truncate(0)
        a.ledger.extend(prompt.tokens[:n], prompt.spans)
        self._totals["shared_prefix_hits"] += 1
        self._totals["shared_prefix_tokens"] += n
        logger.debug("agent %r starts from %d tokens of %r", a.id, n, donor_id)
        return n

    def _step(self, a: _Agent, tok: int, sampler: Sampler, t: Timings) -> int:
        """Decode ``tok`` for ``a`` and sample its next token, batched with other agents.

        Continuous batching: every generating agent submits its step; one of the
        waiting threads (the *leader*) decodes all pending steps in a single
        ``llama_decode`` — one token per sequence — samples each, and hands the
        results back. A new request simply joins the next batch.
        """
        budget = self._budget(a)
        with self._lock:
            if budget and a.ledger.n_live + 2 > budget:
                t.evict_s += self._evict(a, max(0, int(budget * self.config.eviction_low)))
            if a.ledger.n_live + 1 >= self.capacity:
                raise ContextOverflowError(
                    f"agent {a.id!r} reached its capacity of {self.capacity} tokens",
                    n_tokens=a.ledger.n_live + 1, capacity=self.capacity,
                )
            step = _Step(a, tok, sampler)
            if not self.config.batch_decode:
                self._run_batch([step])
                if step.error is not None:
                    raise step.error
                assert step.result is not None
                return step.result
            self._pending.append(step)
            while step.result is None and step.error is None:
                if self._leader:
                    self._cond.wait()
                    continue
                self._leader = True
                try:
                    deadline = time.perf_counter() + self.batch_wait_s
                    # give the other generating agents a moment to join this batch
                    while len(self._pending) < self._generating:
                        left = deadline - time.perf_counter()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    batch, self._pending = self._pending[: self.ctx.n_batch], self._pending[self.ctx.n_batch :]
                    self._run_batch(batch)
                finally:
                    self._leader = False
                    self._cond.notify_all()
            if step.error is not None:
                raise step.error
            assert step.result is not None
            return step.result

    def _run_batch(self, batch: list[_Step]) -> None:
        """Decode one token for each step's sequence in one batch, then sample each (lock held)."""
        try:
            runs = [(st.agent.seq, (st.token,), st.agent.ledger.n_live) for st in batch]
            while True:
                try:
                    idxs = self.ctx.decode_multi(runs)  # type: ignore[arg-type]
                    break
                except EngineError as exc:
                    if getattr(exc, "code", None) == 1 and self._make_room(batch[0].agent):
                        continue
                    raise
            for st, idx in zip(batch, idxs):
                st.agent.ledger.extend((st.token,), None, region="assistant", message=st.agent.n_messages)
                st.result = st.sampler.sample(self.ctx.ptr, idx)
            self._totals["batched_steps"] += 1
            self._totals["batched_tokens"] += len(batch)
            self._totals["max_batch"] = max(self._totals["max_batch"], len(batch))
        except BaseException as exc:
            for st in batch:
                if st.result is None:
                    st.error = exc

    def _run(self, agent_id: str, prompt: RenderedPrompt, params: SamplingParams, *, n_messages: int) -> Iterator[str | ChatResult]:
        self._check_open()
        t0 = time.perf_counter()
        n_prompt = len(prompt.tokens)
        with self._lock:
            a = self._agents.get(agent_id)
            budget = self._budget(a) if a else self.config.agent_budget_tokens
        if not budget and n_prompt >= self.capacity:
            raise ContextOverflowError(
                f"prompt of agent {agent_id!r} has {n_prompt} tokens; the agent capacity is {self.capacity} "
                f"(need at least one free cell to generate). Shorten the history, raise n_ctx/agent_capacity, "
                f"or set agent_budget_tokens to evict instead.",
                n_tokens=n_prompt,
                capacity=self.capacity,
            )
        with self._lock:
            a = self._agents.get(agent_id)
            if a is None:
                a = self._agents[agent_id] = _Agent(agent_id)
            while a.busy:  # calls of one agent run one at a time (they share one sequence)
                self._cond.wait()
            a.busy += 1
            a.counters["calls"] += 1
            self._totals["calls"] += 1
            self._predictor.observe(agent_id)
        sampler: Sampler | None = None
        timings = Timings()
        generating = False
        try:
            with self._lock:
                tr = time.perf_counter()
                had_state = a.tier in self._tiers
                if a.seq is not None:
                    self._tier_hits["hot"] += 1
                    if a.prefetched:
                        self._totals["prefetch_hits"] += 1
                elif had_state and self._prefetch_q is not None:
                    self._totals["prefetch_misses"] += 1
                a.prefetched = False
                how = self._acquire_seq(a)
                if how == "fresh" and not had_state and len(a.ledger) == 0:
                    self._tier_hits["miss"] += 1
                timings.restore_s = time.perf_counter() - tr if how == "restored" else 0.0
                assert a.seq is not None
                a.n_messages = n_messages
                n_keep = min(a.ledger.common_prefix(prompt.tokens), n_prompt - 1)
                ckpt, a.swa_ckpt = a.swa_ckpt, None
                if n_keep < len(a.ledger):
                    keep_live = a.ledger.live_before(n_keep)
                    use_ckpt = False
                    if 0 < keep_live < a.ledger.n_live and self.model.n_swa > 0:
                        # A restored state carries only the last window of the sliding-window
                        # layers; cutting back below it would leave them without history.
                        pmin = self.ctx.seq_pos_min(a.seq)
                        if pmin > max(0, keep_live - self.model.n_swa + 1):
                            ck_blob = None
                            if ckpt is not None and keep_live >= a.prompt_end[1]:
                                try:  # (a cut checkpoint is joined with the live cells, before they change)
                                    ck_blob = self._ckpt_blob(a, ckpt)
                                except AgentMemError as exc:
                                    logger.debug("agent %r: SWA checkpoint unusable (%s)", a.id, exc)
                            if ck_blob is not None:
                                n_keep, use_ckpt = a.prompt_end[0], True  # roll back to the checkpoint
                            else:
                                logger.debug("agent %r: SWA cells start at %d, cannot cut to %d; re-prefilling", a.id, pmin, keep_live)
                                n_keep = 0
                    keep_live = a.ledger.truncate(n_keep)
                    self.ctx.seq_rm(a.seq, keep_live, -1)
                    if a.block is not None:
                        b = self._blocks.get(a.block)
                        if b is None or keep_live < b.n_tokens:
                            self._block_leave(a)
                    if use_ckpt:
                        assert ckpt is not None
                        assert ck_blob is not None
                        if self.ctx.swa_state_set(a.seq, ck_blob) == 0 or self.ctx.seq_pos_min(a.seq) > max(
                            0, keep_live - self.model.n_swa + 1
                        ):
                            logger.debug("agent %r: SWA checkpoint rejected; re-prefilling", a.id)
                            self.ctx.seq_rm(a.seq)
                            a.ledger.truncate(0)
                            self._block_leave(a)
                            n_keep = 0
                shared = 0
                if n_keep == 0 and len(a.ledger) == 0:
                    ts = time.perf_counter()
                    shared = n_keep = self._share_prefix(a, prompt)
                    if shared:
                        timings.restore_s += time.perf_counter() - ts
                kv = "shared" if shared else ("restored" if how == "restored" and n_keep else ("reused" if n_keep else "prefilled"))
            sampler = Sampler(self.model.vocab, self.model.n_vocab, params) if params.max_tokens > 0 else None
            tp = time.perf_counter()
            new = prompt.tokens[n_keep:]
            tok = self._decode(a, new, prompt.spans, sampler, timings)
            a.prompt_end = (len(a.ledger), a.ledger.n_live)
            t_first = time.perf_counter()
            timings.prefill_s = t_first - tp
            a.counters["prefill_tokens"] += len(new)
            a.counters["cached_tokens"] += n_keep
            self._totals["prefill_tokens"] += len(new)
            self._totals["cached_tokens"] += n_keep
            asm = TextAssembler(params.stop)
            completion: list[int] = []
            finish = "length"
            budget = self._budget(a)
            with self._lock:
                self._generating += 1
                generating = True
            while tok is not None:
                if self.model.is_eog(tok):
                    finish = "stop"
                    break
                completion.append(tok)
                piece = asm.push(self.model.token_bytes(tok))
                if piece:
                    yield piece
                if asm.stopped:
                    finish = "stop"
                    break
                if len(completion) >= params.max_tokens or (not budget and a.ledger.n_live + 1 >= self.capacity):
                    break
                tok = self._step(a, tok, sampler, timings)
            with self._lock:
                self._generating -= 1
                generating = False
                self._cond.notify_all()
            tail = asm.flush()
            if tail:
                yield tail
            t_end = time.perf_counter()
            timings.ttft_s = t_first - t0
            timings.decode_s = t_end - t_first
            timings.total_s = t_end - t0
            result = ChatResult(
                agent_id=agent_id,
                text=asm.text,
                finish_reason=finish,
                usage=Usage(prompt_tokens=n_prompt, cached_tokens=n_keep, completion_tokens=len(completion)),
                timings=timings,
                kv=kv,
                tokens=completion,
            )
            logger.debug(
                "agent %r: %s, prompt=%d cached=%d new=%d ttft=%.1fms",
                agent_id, kv, n_prompt, n_keep, len(new), 1e3 * timings.ttft_s,
            )
            yield result
        finally:
            if sampler is not None:
                sampler.close()
            with self._lock:
                if generating:
                    self._generating -= 1
                a.busy -= 1
                a.last_used = time.monotonic()
                self._cond.notify_all()
            self._after_call(agent_id)

    def _after_call(self, agent_id: str) -> None:
        """Housekeeping off the reply's path: rebalance tiers, prefetch the predicted next agent."""
        if self._prefetch_q is None:
            with self._lock:
                if not self._closed:
                    self._rebalance()
            return
        self._prefetch_q.put(_REBALANCE)
        nxt = self._predictor.predict(agent_id)
        if nxt is not None and nxt != agent_id:
            self._prefetch_q.put(nxt)

    # ------------------------------------------------------------------ internals: prefetch
    def _prefetch_worker(self) -> None:
        assert self._prefetch_q is not None
        while True:
            aid = self._prefetch_q.get()
            try:
                if aid is None or self._closed:
                    return
                with self._lock:
                    if aid == _REBALANCE:
                        self._rebalance()
                        continue
                    a = self._agents.get(aid)
                    if a is None or a.busy or a.seq is not None or a.tier not in self._tiers:
                        continue
                    if self._acquire_seq(a, prefetch=True) == "restored":
                        a.prefetched = True
                        self._totals["prefetches"] += 1
            except Exception:  # never let the worker die; the call itself will restore
                logger.exception("prefetch of %r failed", aid)
            finally:
                self._prefetch_q.task_done()

    async def _drive_async(self, stream: ChatStream) -> AsyncIterator[str | ChatResult]:
        """Run a blocking stream in a worker thread, handing pieces to the loop."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stop = threading.Event()
        done = object()

        def worker() -> None:
            try:
                for piece in stream:
                    if stop.is_set():
                        break
                    loop.call_soon_threadsafe(queue.put_nowait, piece)
                if stream.result is not None and not stop.is_set():
                    loop.call_soon_threadsafe(queue.put_nowait, stream.result)
            except BaseException as exc:  # hand every error to the consumer
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                stream.close()
                loop.call_soon_threadsafe(queue.put_nowait, done)

        thread = threading.Thread(target=worker, name="agentmem-stream", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is done:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            await asyncio.to_thread(thread.join)

