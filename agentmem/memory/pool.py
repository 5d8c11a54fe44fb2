"""MemoryPool: many agents, one model, one llama.cpp context, no re-prefill on switch.

* :class:`MemoryPool` maps agents onto the sequences of one shared context. At
  most ``resident_agents`` agents are *hot* (a live sequence); when another agent
  needs a sequence, the least recently used idle one is *parked* (its KV state
  copied out to RAM, optionally quantized) and restored — milliseconds — when it
  is called again.
* Each call renders the messages to tokens (with region tags), finds the longest
  common prefix with what the agent's KV already holds, drops only the divergent
  tail and decodes only the new tokens.
* :class:`ChatResult` / :class:`Usage` / :class:`Timings` describe one call.

Thread-safety: every context operation runs under one re-entrant lock; an agent
that is generating is *busy* and is never parked under its feet. Async methods
run the blocking work in worker threads so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Iterator, Mapping, Sequence

from agentmem.config import PoolConfig
from agentmem.engine.chat_format import ChatRenderer, Message, RenderedPrompt
from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel, llama_build_info
from agentmem.engine.sampling import Sampler, SamplingParams, TextAssembler
from agentmem.errors import (
    AgentMemError,
    ConfigError,
    ContextOverflowError,
    EngineError,
    StateError,
    UnknownAgentError,
)
from agentmem.memory.ledger import Ledger
from agentmem.memory.parking import ParkedState, make_park_codec
from agentmem.model import model_fingerprint, resolve_model_path

__all__ = ["ChatResult", "ChatStream", "MemoryPool", "Timings", "Usage"]

logger = logging.getLogger(__name__)


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
    """Seconds spent in one call (``ttft_s`` runs from the call to the first token)."""

    ttft_s: float = 0.0
    restore_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    total_s: float = 0.0


@dataclass(slots=True)
class ChatResult:
    """What one ``chat``/``complete`` call produced.

    Attributes:
        text: generated text (stop strings removed).
        finish_reason: ``"stop"`` (end of turn or a stop string) or ``"length"``.
        kv: how the agent's KV was found: ``"reused"`` (live sequence),
            ``"restored"`` (parked state loaded) or ``"prefilled"`` (nothing kept).
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
    parked: ParkedState | None = None
    busy: int = 0
    last_used: float = 0.0
    calls: int = 0
    restores: int = 0
    restore_failures: int = 0
    parks: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0


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

    def close(self) -> None:
        """Stop generating (frees the agent for other calls)."""
        self._gen.close()  # type: ignore[attr-defined]


class MemoryPool:
    """Keeps every agent's KV state across one shared llama.cpp context.

    Args:
        model_path: a GGUF file; ``None`` uses ``AGENTMEM_MODEL`` or the bundled
            default model (Gemma 3 270M Q4_K_M).
        config: a :class:`PoolConfig`; keyword arguments override its fields
            (``n_ctx``, ``resident_agents``, ``park_codec``, ... — see PoolConfig).

    Example (real output on the default model, 2 CPU cores)::

        >>> from agentmem import MemoryPool
        >>> with MemoryPool(n_ctx=4096, resident_agents=2) as pool:   # doctest: +SKIP
        ...     r = pool.chat("planner", [{"role": "user", "content": "Name a colour."}], max_tokens=8)
        ...     r.text, r.kv, r.usage.cached_tokens
        ...     r = pool.chat("planner", [{"role": "user", "content": "Name a colour."},
        ...                               {"role": "assistant", "content": r.text},
        ...                               {"role": "user", "content": "Another one."}], max_tokens=8)
        ...     r.kv, r.usage.cached_tokens, r.usage.prompt_tokens
        ('Blue\\n', 'prefilled', 0)
        ('reused', 17, 27)
    """

    def __init__(self, model_path: str | None = None, *, config: PoolConfig | None = None, **options: Any) -> None:
        base = config or PoolConfig()
        if model_path is not None:
            options["model_path"] = str(model_path)
        self.config = base.replace(**options) if options else base
        cfg = self.config
        self.model_path = resolve_model_path(cfg.model_path)
        self.model = LlamaModel(self.model_path, n_gpu_layers=cfg.n_gpu_layers)
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
        except BaseException:
            self.model.close()
            raise
        self.capacity = min(cfg.agent_capacity or cfg.n_ctx, self.ctx.n_ctx_seq)
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
        self._park_codec = make_park_codec(cfg.park_codec, rotate=cfg.park_rotate)
        self._lock = self.ctx.lock
        self._cond = threading.Condition(self._lock)
        self._agents: dict[str, _Agent] = {}
        self._free_seqs: list[int] = list(range(cfg.resident_agents - 1, -1, -1))
        self._closed = False
        self._totals = {"calls": 0, "restores": 0, "restore_failures": 0, "parks": 0, "prefill_tokens": 0, "cached_tokens": 0}
        logger.info(
            "pool ready: %s, n_ctx=%d, resident_agents=%d, park_codec=%s",
            self.model_path.name, self.ctx.n_ctx, cfg.resident_agents, cfg.park_codec,
        )

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Free the context and the model (idempotent). Parked states are dropped."""
        if self._closed:
            return
        self._closed = True
        self.ctx.close()
        self.model.close()

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
            ContextOverflowError: the prompt does not fit ``capacity``.
        """
        stream = self.chat_stream(agent_id, messages, max_tokens=max_tokens, temperature=temperature, stop=stop, **sampling)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

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
        prompt = self.renderer.render(messages)
        return ChatStream(self._run(agent_id, prompt, params))

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
        stream = self.complete_stream(agent_id, prompt, max_tokens=max_tokens, temperature=temperature, stop=stop, **sampling)
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

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
        return ChatStream(self._run(agent_id, self.renderer.render_text(prompt), params))

    async def achat(self, agent_id: str, messages: Iterable[Mapping[str, Any] | Message], **kw: Any) -> ChatResult:
        """Async :meth:`chat` (runs in a worker thread; never blocks the event loop)."""
        msgs = list(messages)
        return await asyncio.to_thread(self.chat, agent_id, msgs, **kw)

    async def acomplete(self, agent_id: str, prompt: str, **kw: Any) -> ChatResult:
        """Async :meth:`complete`."""
        return await asyncio.to_thread(self.complete, agent_id, prompt, **kw)

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

        ``{"agents": {id: {"tokens", "tier", "bytes", "codec", "seq", "regions",
        "calls", "restores", "restore_failures", "parks", "prefill_tokens",
        "cached_tokens"}}, "totals": {...}}``. ``tier`` is ``"hot"`` (live
        sequence), ``"warm"`` (parked in RAM) or ``"empty"``; ``bytes`` is what
        the state occupies there.
        """
        with self._lock:
            agents = {}
            hot_bytes = warm_bytes = 0
            live = f"{self.config.type_k}/{self.config.type_v}" if self.config.type_k != self.config.type_v else self.config.type_k
            for a in self._agents.values():
                if a.seq is not None:
                    tier, nbytes, codec = "hot", (self.ctx.state_size(a.seq) if len(a.ledger) else 0), live
                    hot_bytes += nbytes
                elif a.parked is not None:
                    tier, nbytes, codec = "warm", a.parked.nbytes, a.parked.codec
                    warm_bytes += nbytes
                else:
                    tier, nbytes, codec = "empty", 0, None
                agents[a.id] = {
                    "tokens": len(a.ledger),
                    "tier": tier,
                    "bytes": nbytes,
                    "codec": codec,
                    "seq": a.seq,
                    "regions": a.ledger.region_counts(),
                    "calls": a.calls,
                    "restores": a.restores,
                    "restore_failures": a.restore_failures,
                    "parks": a.parks,
                    "prefill_tokens": a.prefill_tokens,
                    "cached_tokens": a.cached_tokens,
                }
            totals = dict(self._totals)
            totals.update(
                agents=len(self._agents),
                resident=sum(1 for a in self._agents.values() if a.seq is not None),
                hot_bytes=hot_bytes,
                warm_bytes=warm_bytes,
                n_ctx=self.ctx.n_ctx,
                resident_agents=self.config.resident_agents,
            )
            return {"agents": agents, "totals": totals}

    def agents(self) -> list[str]:
        """Ids of the agents the pool knows."""
        with self._lock:
            return list(self._agents)

    def forget(self, agent_id: str) -> None:
        """Drop everything kept for ``agent_id`` (its sequence, parked state, ledger)."""
        with self._lock:
            a = self._agents.get(agent_id)
            if a is None:
                raise UnknownAgentError(f"unknown agent {agent_id!r}; known: {sorted(self._agents)}")
            if a.busy:
                raise AgentMemError(f"agent {agent_id!r} is generating; cannot forget it now")
            if a.seq is not None:
                self.ctx.seq_rm(a.seq)
                self._release_seq(a)
            del self._agents[agent_id]

    def park(self, agent_id: str) -> None:
        """Move ``agent_id``'s KV out of its live sequence into RAM now."""
        with self._lock:
            a = self._agent(agent_id)
            if a.busy:
                raise AgentMemError(f"agent {agent_id!r} is generating; cannot park it now")
            if a.seq is not None:
                self._park(a)

    def tokens(self, agent_id: str) -> list[int]:
        """The tokens whose KV ``agent_id`` holds (its ledger)."""
        with self._lock:
            return self._agent(agent_id).ledger.tokens.tolist()

    def count_tokens(self, messages: Iterable[Mapping[str, Any] | Message]) -> int:
        """Prompt tokens the messages render to (chat template included)."""
        return len(self.renderer.render(messages))

    # ------------------------------------------------------------------ internals
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

    def _release_seq(self, a: _Agent) -> None:
        assert a.seq is not None
        self._free_seqs.append(a.seq)
        a.seq = None
        self._cond.notify_all()

    def _park(self, a: _Agent) -> None:
        """Copy ``a``'s state out of its sequence into RAM and free the sequence."""
        assert a.seq is not None and not a.busy, f"{a.id=} {a.seq=} {a.busy=}"
        if len(a.ledger):
            try:
                blob = self.ctx.state_get(a.seq)
                a.parked = self._park_codec.encode(blob, n_tokens=len(a.ledger))
            except AgentMemError as exc:
                logger.warning("could not park agent %r (%s); it will re-prefill when called", a.id, exc)
                a.parked = None
                a.ledger.clear()
        a.parks += 1
        self._totals["parks"] += 1
        self.ctx.seq_rm(a.seq)
        self._release_seq(a)

    def _restore(self, a: _Agent, seq: int) -> bool:
        """Load ``a``'s parked state into ``seq``; on any failure re-prefill later."""
        parked, a.parked = a.parked, None
        assert parked is not None
        try:
            blob = self._park_codec.decode(parked)
            n = self.ctx.state_set(seq, blob)
            if n == 0:
                raise StateError("llama_state_seq_set_data rejected the blob")
            pos_max = self.ctx.seq_pos_max(seq)
            if pos_max != len(a.ledger) - 1:
                raise StateError(f"restored state ends at position {pos_max}, ledger has {len(a.ledger)} tokens")
        except AgentMemError as exc:
            logger.warning("restore of agent %r failed (%s); falling back to re-prefill", a.id, exc)
            self.ctx.seq_rm(seq)
            a.ledger.clear()
            a.restore_failures += 1
            self._totals["restore_failures"] += 1
            return False
        a.restores += 1
        self._totals["restores"] += 1
        return True

    def _acquire_seq(self, a: _Agent) -> str:
        """Make ``a`` resident (under the lock). Returns ``reused``/``restored``/``fresh``."""
        if a.seq is not None:
            return "reused"
        while not self._free_seqs:
            idle = [x for x in self._agents.values() if x.seq is not None and not x.busy]
            if idle:
                self._park(min(idle, key=lambda x: x.last_used))
                break
            logger.debug("agent %r waits for a free sequence", a.id)
            self._cond.wait()
        a.seq = self._free_seqs.pop()
        if a.parked is not None:
            return "restored" if self._restore(a, a.seq) else "fresh"
        return "fresh"

    def _free_cells(self, keep: _Agent) -> bool:
        """Park one idle resident agent (not ``keep``) to make room in the context."""
        idle = [x for x in self._agents.values() if x.seq is not None and not x.busy and x is not keep and len(x.ledger)]
        if not idle:
            return False
        self._park(min(idle, key=lambda x: x.last_used))
        return True

    def _decode(self, a: _Agent, tokens: Sequence[int], spans: Any, sampler: Sampler | None) -> int | None:
        """Decode ``tokens`` after ``a``'s ledger; sample one token if ``sampler``.

        Decoding and sampling happen under one lock hold so no other sequence's
        decode can overwrite the logits in between.
        """
        n = len(tokens)
        step = self.ctx.n_batch
        with self._lock:
            start = 0
            while start < n:
                chunk = tokens[start : start + step]
                pos0 = len(a.ledger)
                assert a.seq is not None
                try:
                    idx = self.ctx.decode_run(a.seq, chunk, pos0)
                except EngineError as exc:
                    if getattr(exc, "code", None) == 1 and self._free_cells(a):
                        continue  # room was made; retry this chunk
                    if getattr(exc, "code", None) == 1:
                        raise ContextOverflowError(
                            f"the shared context ({self.ctx.n_ctx} cells) is full and no idle agent can be parked; "
                            f"raise n_ctx or lower resident_agents",
                            n_tokens=pos0 + n - start,
                            capacity=self.ctx.n_ctx,
                        ) from exc
                    raise
                a.ledger.extend(chunk, spans)
                start += len(chunk)
            if sampler is None:
                return None
            return sampler.sample(self.ctx.ptr, idx)

    def _run(self, agent_id: str, prompt: RenderedPrompt, params: SamplingParams) -> Iterator[str | ChatResult]:
        self._check_open()
        t0 = time.perf_counter()
        n_prompt = len(prompt.tokens)
        if n_prompt >= self.capacity:
            raise ContextOverflowError(
                f"prompt of agent {agent_id!r} has {n_prompt} tokens; the agent capacity is {self.capacity} "
                f"(need at least one free cell to generate). Shorten the history or raise n_ctx/agent_capacity.",
                n_tokens=n_prompt,
                capacity=self.capacity,
            )
        with self._lock:
            a = self._agents.get(agent_id)
            if a is None:
                a = self._agents[agent_id] = _Agent(agent_id)
            a.busy += 1
            a.calls += 1
            self._totals["calls"] += 1
        sampler: Sampler | None = None
        try:
            with self._lock:
                tr = time.perf_counter()
                how = self._acquire_seq(a)
                restore_s = time.perf_counter() - tr if how != "reused" else 0.0
                assert a.seq is not None
                n_keep = min(a.ledger.common_prefix(prompt.tokens), n_prompt - 1)
                if 0 < n_keep < len(a.ledger) and self.model.n_swa > 0:
                    # A restored state carries only the last window of the sliding-window
                    # layers; cutting back below it would leave them without history.
                    pmin = self.ctx.seq_pos_min(a.seq)
                    if pmin > max(0, n_keep - self.model.n_swa + 1):
                        logger.debug("agent %r: SWA cells start at %d, cannot cut to %d; re-prefilling", a.id, pmin, n_keep)
                        n_keep = 0
                if n_keep < len(a.ledger):
                    self.ctx.seq_rm(a.seq, n_keep, -1)
                    a.ledger.truncate(n_keep)
                kv = "restored" if how == "restored" and n_keep else ("reused" if n_keep else "prefilled")
            sampler = Sampler(self.model.vocab, self.model.n_vocab, params) if params.max_tokens > 0 else None
            tp = time.perf_counter()
            new = prompt.tokens[n_keep:]
            tok = self._decode(a, new, prompt.spans, sampler)
            t_first = time.perf_counter()
            prefill_s = t_first - tp
            a.prefill_tokens += len(new)
            a.cached_tokens += n_keep
            self._totals["prefill_tokens"] += len(new)
            self._totals["cached_tokens"] += n_keep
            asm = TextAssembler(params.stop)
            completion: list[int] = []
            finish = "length"
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
                if len(completion) >= params.max_tokens or len(a.ledger) + 1 >= self.capacity:
                    break
                tok = self._decode(a, (tok,), None, sampler)
            tail = asm.flush()
            if tail:
                yield tail
            t_end = time.perf_counter()
            result = ChatResult(
                agent_id=agent_id,
                text=asm.text,
                finish_reason=finish,
                usage=Usage(prompt_tokens=n_prompt, cached_tokens=n_keep, completion_tokens=len(completion)),
                timings=Timings(
                    ttft_s=t_first - t0,
                    restore_s=restore_s,
                    prefill_s=prefill_s,
                    decode_s=t_end - t_first,
                    total_s=t_end - t0,
                ),
                kv=kv,
                tokens=completion,
            )
            logger.debug(
                "agent %r: %s, prompt=%d cached=%d new=%d ttft=%.1fms",
                agent_id, kv, n_prompt, n_keep, len(new), 1e3 * result.timings.ttft_s,
            )
            yield result
        finally:
            if sampler is not None:
                sampler.close()
            with self._lock:
                a.busy -= 1
                a.last_used = time.monotonic()
                self._cond.notify_all()

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

