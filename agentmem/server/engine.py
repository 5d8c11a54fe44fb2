"""`Engine`: the one object the routes call — the pool, the queue, the metrics and the settings.

Routes parse and answer HTTP; the engine runs calls and agent operations on the
`MemoryPool`, always off the event loop (worker threads), and counts what happened.
A call is `prepare_*` (validation, tools/JSON protocol, prompt-size limit), then `run`:
an async iterator of `("text", piece)` events ending with `("done", Outcome)`, the
protocol of `agentmem.calls` driven on the event loop (`CallRunner.arun`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Literal

from agentmem import validation as check
from agentmem.config import PoolConfig
from agentmem.errors import ConfigError, UnknownAgentError
from agentmem.calls import CallOutcome, CallRunner, get_strategy
from agentmem.calls.runner import until_done
from agentmem.pool import ChatResult, MemoryPool
from agentmem.pool.lines import Line
from agentmem.server.auth import Principal
from agentmem.server.calls import PoolCall, Reply, chat_call, completion_call
from agentmem.server.http_errors import ApiError
from agentmem.server.identity import authorize
from agentmem.server.metrics import ServerMetrics
from agentmem.server.queue import AgentQueue, Lease
from agentmem.server.quotas import CallLease, Quotas
from agentmem.server.schemas import ChatCompletionRequest, CompletionRequest
from agentmem.server.settings import ServerSettings

__all__ = ["Engine", "Event", "Outcome"]

logger = logging.getLogger(__name__)

_INFO_FIELDS = ("tier", "tokens", "live_tokens", "bytes", "codec", "priority", "budget", "calls", "restores", "parks",
                "cached_tokens", "prefill_tokens", "evictions")


@dataclass
class Outcome:
    """A finished call: the pool results (two when an `auto` tool call was retried forced, under `free_then_forced`) and the reply.

    `rewrite` is the prefill that put a native tool call into the agent's KV as the
    template writes it back (`Reply.written_back`): agentmem's own upkeep of the KV,
    reported in the `agentmem` extension, not in `usage` (which counts what the request
    asked for, so the next request's `cached_tokens` compares with it).
    """

    call: PoolCall
    results: list[ChatResult]
    reply: Reply
    retried: bool = False
    rewrite: ChatResult | None = None
    line: str = ""  # how a request without an agent id found its agent (`Line.kind`; "" when it named one)

    @classmethod
    def of(cls, done: CallOutcome, line: str = "") -> Outcome:
        """The server's view of the protocol's outcome (the reply in OpenAI's shape)."""
        return cls(done.plan, done.results, Reply.of(done.reply), done.retried, done.rewrite, line)

    @property
    def finish_reason(self) -> str:
        """`tool_calls`, `length` or `stop`."""
        if self.reply.tool_calls:
            return "tool_calls"
        return self.results[-1].finish_reason

    def usage(self) -> dict[str, Any]:
        """OpenAI `usage`; `prompt_tokens_details.cached_tokens` counts the KV agentmem reused."""
        prompt = sum(r.usage.prompt_tokens for r in self.results)
        completion = sum(r.usage.completion_tokens for r in self.results)
        cached = sum(r.usage.cached_tokens for r in self.results)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def extension(self) -> dict[str, Any]:
        """The `agentmem` field of a response: agent, how its KV was found, timings (seconds)."""
        first = self.results[0]
        t = first.timings
        return {"agent_id": self.call.agent_id, "kv": first.kv,
                "timings": {"ttft_s": round(t.ttft_s, 6), "restore_s": round(t.restore_s, 6),
                            "prefill_s": round(t.prefill_s, 6), "decode_s": round(t.decode_s, 6),
                            "total_s": round(sum(r.timings.total_s for r in self.results), 6)},
                "retried_forced": self.retried,
                "rewritten_tokens": self.rewritten_tokens, **({"line": self.line} if self.line else {})}

    @property
    def rewritten_tokens(self) -> int:
        """Tokens prefilled to put a native call into the KV as the template writes it back (0: none)."""
        if self.rewrite is None:
            return 0
        return self.rewrite.usage.prompt_tokens - self.rewrite.usage.cached_tokens


Event = tuple[Literal["text"], str] | tuple[Literal["done"], Outcome]


class Engine:
    """Runs calls and agent operations for the routes.

    Args:
        pool: an open `MemoryPool`, or a `PoolConfig` to open at `start`.
        settings: the server settings.
        own_pool: close the pool at `stop` (default: only a pool the engine opened).
        replica: cluster mode (`agentmem.cluster.Replica`): every call holds its agent's
            lease and commits fenced by it; `None`: this server alone owns its archive.
        tenants: the scoped keys' prefixes (`KeyRing.tenant_prefixes`), added to the
            pool's `PoolConfig.tenants`: no KV is shared across them.
    """

    def __init__(self, pool: MemoryPool | PoolConfig, settings: ServerSettings, *, own_pool: bool | None = None,
                 replica: Any = None, tenants: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.replica = replica
        self._config = pool if isinstance(pool, PoolConfig) else None
        self.pool: MemoryPool | None = pool if isinstance(pool, MemoryPool) else None
        if self._config is not None and tenants:
            self._config = self._config.replace(tenants=tuple(dict.fromkeys(self._config.tenants + tenants)))
        elif self.pool is not None and tenants:
            self.pool.add_tenants(tenants)
        self.quotas = Quotas(settings)
        self.own_pool = self._config is not None if own_pool is None else own_pool
        self.queue = AgentQueue(default_limit=settings.max_concurrent_per_key)
        self.processing = 0
        self._calls: CallRunner | None = None
        self.metrics = ServerMetrics(self._stats_or_none, processing=lambda: self.processing,
                                     deferred=lambda: self.queue.waiting)

    # ------------------------------------------------------------------ lifetime
    @property
    def model_name(self) -> str:
        """The model id responses carry."""
        if self.settings.model_name:
            return self.settings.model_name
        return Path(self.pool.model_path).stem if self.pool is not None else "agentmem"

    @property
    def ready(self) -> bool:
        """Whether calls can be served."""
        return self.pool is not None and not self.pool.closed and not self.queue.closing

    async def start(self) -> None:
        """Open the pool (when given a config); an archive resumes its agents."""
        if self.pool is None and self._config is not None:
            self.pool = await asyncio.to_thread(MemoryPool, config=self._config)
        if self.replica is not None:
            self.replica.start()

    async def stop(self) -> None:
        """Finish or cancel in-flight calls, then close an owned pool (checkpointing its archive)."""
        await self.queue.shutdown(self.settings.shutdown_grace_s)
        if self.pool is not None and self.own_pool:
            await asyncio.to_thread(self.pool.close)
            logger.info("pool closed")
        if self.replica is not None:  # after the pool stored its agents under their leases
            await asyncio.to_thread(self.replica.close)

    def _pool(self) -> MemoryPool:
        if self.pool is None or self.pool.closed:
            raise ApiError(503, "the model is not loaded", code="unavailable")
        return self.pool

    def _stats_or_none(self) -> dict[str, Any] | None:
        pool = self.pool
        if pool is None or pool.closed:
            return None
        return pool.stats()

    def admit(self, principal: Principal) -> Lease:
        """A concurrency slot for a request (429/503 otherwise)."""
        return self.queue.admit(principal)

    async def admit_call(self, principal: Principal, agent_id: str, *, line: Line | None = None) -> Lease:
        """A slot for a call of `agent_id`: 429 over the key's calls in flight, agents or parked bytes; 503.

        `line`: the claim `find_line` took; it ends with the lease (or now, when admission fails).
        """
        try:
            lease = self.queue.admit(principal)
            try:
                settle = await self.quotas.reserve(principal, agent_id, self._pool())
            except BaseException:
                lease.release()
                raise
        except BaseException:
            self.release_line(line)
            raise

        def end() -> None:
            settle()
            self.release_line(line)

        return CallLease(lease.queue, lease.principal, settle=end)  # takes over the queue's slot

    async def find_line(self, principal: Principal, req: ChatCompletionRequest | CompletionRequest) -> Line:
        """The agent of a request that names none (`--anonymous lines`): the conversation it continues, or a new one.

        Looked up in the key's scope (its prefix's tenant; `agentmem.pool.lines`) on the prompt
        the call will render (tools and the JSON block included); the line stays claimed until
        the call's lease is released.
        """
        pool = self._pool()
        scope = "" if principal.name == "local" else principal.prefix
        if isinstance(req, ChatCompletionRequest):
            call = chat_call("line", req, self.settings, pool.tool_format)
            fn = functools.partial(pool.find_line, call.messages, tools=call.tools, scope=scope)
        else:
            fn = functools.partial(pool.find_line, prompt=completion_call("line", req, self.settings).prompt,
                                   scope=scope)
        return await self.queue.call(fn)

    def release_line(self, line: Line | None) -> None:
        """End `line`'s claim (None: nothing to end)."""
        if line is not None and self.pool is not None and not self.pool.closed:
            self.pool.release_line(line.agent_id)

    async def _known(self, agent_id: str) -> None:
        """404 unless the pool knows `agent_id`: actions other than a call never create agents."""
        if not await self._do(self._pool().has_agent, agent_id):
            raise UnknownAgentError(f"unknown agent {agent_id!r}", agent_id=agent_id)

    # ------------------------------------------------------------------ calls
    async def prepare_chat(self, agent_id: str, req: ChatCompletionRequest, line: str = "") -> PoolCall:
        """Validate a chat request and apply the tools/JSON protocol; 413 over the prompt limit."""
        call = chat_call(agent_id, req, self.settings, self._pool().tool_format)
        call.line = line
        await self._check_prompt(call)
        return call

    async def prepare_completion(self, agent_id: str, req: CompletionRequest, line: str = "") -> PoolCall:
        """Validate a completion request; 413 over the prompt limit."""
        call = completion_call(agent_id, req, self.settings)
        call.line = line
        await self._check_prompt(call)
        return call

    async def _check_prompt(self, call: PoolCall) -> None:
        limit = self.settings.max_prompt_tokens
        if not limit:
            return
        pool = self._pool()
        if call.messages is not None:
            n = await self.queue.call(functools.partial(pool.count_tokens, call.pool_messages(), tools=call.tools))
            if call.sampling.get("opening"):  # a forced call's opening, sent apart from the messages
                n += len(pool.model.tokenize(call.sampling["opening"], parse_special=False))
        else:
            n = len((await self.queue.call(pool.renderer.render_text, call.prompt or "")).tokens)
        if n > limit:
            raise ApiError(413, f"the prompt has {n} tokens; this server accepts at most {limit}",
                           code="request_too_large", param="messages" if call.messages is not None else "prompt")

    def _runner(self) -> CallRunner:
        """The protocol's runner on this server's pool, its agent turns, worker threads and metrics."""
        pool = self._pool()
        if self._calls is None or self._calls.pool is not pool:
            self._calls = CallRunner(pool, turns=self.queue.turns, workers=self.queue.workers,
                                     on_result=lambda _plan, result: self.metrics.observe_call(result),
                                     strategy=get_strategy(self.settings.decode_strategy))
        return self._calls

    async def run(self, call: PoolCall) -> AsyncIterator[Event]:
        """Run `call` (`agentmem.calls.CallRunner.arun`): text events as they may be shown, then `("done", Outcome)`.

        The agent is held for the whole call (an `auto` retry, a call's rewrite and the
        commit included); closing the iterator early stops generation at the next token and
        frees the agent.
        """
        runner = self._runner()
        self.processing += 1
        try:
            async with self.queue.agent(call.agent_id), self._owned(call.agent_id):
                async with contextlib.aclosing(runner.arun(call, hold=False)) as events:
                    async for kind, value in events:
                        if kind == "text":
                            yield ("text", value)
                            continue
                        assert isinstance(value, CallOutcome)
                        if value.rest:
                            yield ("text", value.rest)
                        await self._commit(call.agent_id)
                        yield ("done", Outcome.of(value, call.line))
        finally:
            self.processing -= 1

    async def _commit(self, agent_id: str) -> None:
        """After a call, still holding its agent: commit fenced by its lease, or per `durability`."""
        if self.replica is not None:
            await self.replica.commit(agent_id)  # fenced by the agent's lease
        elif self.settings.durability == "call":
            # still holding the agent: the state written is the one this call left
            await self.queue.call(self._pool().commit, agent_id)

    def _owned(self, agent_id: str) -> Any:
        """Cluster mode: hold `agent_id`'s lease (re-reading a stale local copy) for the block."""
        return self.replica.serving(agent_id) if self.replica is not None else contextlib.nullcontext()

    async def collect(self, call: PoolCall) -> Outcome:
        """Run `call` to its end (a non-streaming request)."""
        outcome = await until_done(self.run(call))
        assert isinstance(outcome, Outcome)
        return outcome

    # ------------------------------------------------------------------ agents
    async def _do(self, fn: Any, *args: Any) -> Any:
        self._pool()
        return await self.queue.call(fn, *args)

    @staticmethod
    def _info(agent_id: str, raw: dict[str, Any]) -> dict[str, Any]:
        return {"id": agent_id, **{k: raw.get(k, 0) for k in _INFO_FIELDS}}

    async def list_agents(self, principal: Principal) -> list[dict[str, Any]]:
        """The agents `principal` may see (declared shares only for admin keys)."""
        stats = await self._do(self._pool().stats)
        return [self._info(k, v) for k, v in sorted(stats["agents"].items())
                if principal.allows(k) and (principal.admin or not v.get("share"))]

    async def show_agent(self, principal: Principal, agent_id: str) -> dict[str, Any]:
        """One agent's entry (403 out of scope, 404 unknown)."""
        authorize(principal, agent_id)
        stats = await self._do(self._pool().stats)
        raw = stats["agents"].get(agent_id)
        if raw is None:
            raise UnknownAgentError(f"unknown agent {agent_id!r}", agent_id=agent_id)
        info = self._info(agent_id, raw)
        info.update(regions=raw.get("regions", {}), evicted_regions=raw.get("evicted_regions", {}),
                    seq=raw.get("seq"), block=raw.get("block"))
        return info

    async def park(self, principal: Principal, agent_id: str, tier: str) -> dict[str, Any]:
        authorize(principal, agent_id)
        async with self._owned(agent_id):
            await self._do(self._pool().park, agent_id, tier)
        if self.replica is not None and tier == "cold":
            await self.replica.released(agent_id)
        return await self.show_agent(principal, agent_id)

    async def forget(self, principal: Principal, agent_id: str) -> None:
        authorize(principal, agent_id)
        async with self._owned(agent_id):
            await self._do(self._pool().forget, agent_id)
        if self.replica is not None:
            await self.replica.released(agent_id)

    async def pin(self, principal: Principal, agent_id: str, message_index: int, pinned: bool) -> int:
        authorize(principal, agent_id)
        return int(await self._do(self._pool().pin, agent_id, message_index, pinned))

    async def set_budget(self, principal: Principal, agent_id: str, tokens: int, eviction: str | None) -> None:
        authorize(principal, agent_id)
        await self._known(agent_id)
        await self._do(self._pool().set_budget, agent_id, tokens, eviction)

    async def set_priority(self, principal: Principal, agent_id: str, priority: int | str) -> None:
        authorize(principal, agent_id)
        await self._known(agent_id)
        await self._do(self._pool().set_priority, agent_id, priority)

    async def hold(self, principal: Principal, agent_id: str, ttl_s: float | None) -> None:
        authorize(principal, agent_id)
        await self._do(functools.partial(self._pool().hold, agent_id, ttl_s=ttl_s))

    async def unhold(self, principal: Principal, agent_id: str) -> None:
        authorize(principal, agent_id)
        await self._do(self._pool().unhold, agent_id)

    async def expect(self, principal: Principal, order: list[str | list[str]], soon: bool) -> None:
        """The workflow's expected order (every id must be in the key's scope); one order per key."""
        for i, item in enumerate(order):
            for x in [item] if isinstance(item, str) else item:
                authorize(principal, check.agent_id(x, field=f"order[{i}]"), field=f"order[{i}]")
        await self._do(functools.partial(self._pool().expect, order, soon=soon, scope=f"key:{principal.name}"))

    async def handoff(self, principal: Principal, src: str, dst: str, upto: int | None) -> dict[str, Any]:
        authorize(principal, src)
        authorize(principal, dst, field="to")
        await self._known(src)
        settle = await self.quotas.reserve(principal, dst, self._pool())  # a new destination is a new agent
        try:
            return _plain(await self._do(self._pool().handoff, src, dst, upto))
        finally:
            settle()

    async def recall(self, principal: Principal, agent_id: str, query: str, k: int) -> list[dict[str, Any]]:
        authorize(principal, agent_id)
        spans = await self._do(self._pool().recall, agent_id, query, k)
        return [_plain(s) for s in spans]

    async def checkpoint(self, principal: Principal) -> None:
        if not principal.admin:
            raise ApiError(403, "checkpointing the pool needs an admin key", code="forbidden")
        pool = self._pool()
        if pool.config.archive_path is None and not getattr(pool.config, "archive_url", None):
            raise ConfigError("checkpoint needs a server started with --archive or --archive-url")
        await self._do(pool.checkpoint)


def _plain(obj: Any) -> Any:
    """A dataclass (or a plain value) as JSON-friendly data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)
