"""`Engine`: the one object the routes call — the models, the queue, the metrics and the settings.

Routes parse and answer HTTP; the engine runs calls and agent operations (`agent_ops`)
on the engine of the request's model in the server's `MemoryPool` (`registry`),
always off the event loop (worker threads), and counts what happened. A call arrives as
the request its front-end converted (`call_request.ChatCallRequest`, `CompletionCallRequest`:
no API's wire type reaches the engine), finds its `Target` (`seat` for a named agent,
`find_line` otherwise), then is `prepare_*` (the server's checks, tools/JSON protocol,
prompt-size limit), then `run`:
an async iterator of `("text", piece)` events ending with `("done", Outcome)`, the
protocol of `agentmem.calls` driven on the event loop (`CallRunner.arun`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Literal

from agentmem.calls import CallOutcome, CallRunner, get_strategy
from agentmem.calls.runner import until_done
from agentmem.config import PoolConfig
from agentmem.errors import ConfigError, ModelMismatchError
from agentmem.models import MemoryPool, ModelLease
from agentmem.pool import ChatResult, ModelEngine
from agentmem.pool.lines import Line
from agentmem.server.agent_ops import AgentOps
from agentmem.server.auth import LOCAL, Principal, key_space
from agentmem.server.call_request import CallRequest, ChatCallRequest, CompletionCallRequest
from agentmem.server.calls import PoolCall, Reply, chat_call, completion_call
from agentmem.server.http_errors import ApiError
from agentmem.server.lifecycle import Lifecycle
from agentmem.server.metrics import ServerMetrics, note_model
from agentmem.server.queue import AgentQueue, Lease
from agentmem.server.quotas import Quotas
from agentmem.server.registry import Models, Target
from agentmem.server.settings import ServerSettings

__all__ = ["Engine", "Event", "Outcome"]

logger = logging.getLogger(__name__)


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


class Engine(AgentOps):
    """Runs calls and agent operations for the routes.

    Args:
        pool: an open `MemoryPool` (of one model, or of several: a request's `model` picks
            one; `registry.Models`), or a `PoolConfig` to open at `start`.
        settings: the server settings.
        own_pool: close the pool at `stop` (default: only a pool the engine opened).
        replica: cluster mode (`agentmem.cluster.Replica`): every call holds its agent's
            lease and commits fenced by it; `None`: this server alone owns its archive.
        tenants: the scoped keys' prefixes (`KeyRing.tenant_prefixes`), added to the
            pool's `PoolConfig.tenants`: no KV is shared across them.
    """

    def __init__(self, pool: MemoryPool | PoolConfig, settings: ServerSettings, *,
                 own_pool: bool | None = None, replica: Any = None, tenants: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.replica = replica
        self._config = pool if isinstance(pool, PoolConfig) else None
        opened = None if self._config is not None else pool
        many = opened is not None and len(opened.names) > 1
        self.team: MemoryPool | None = opened if many else None  # several models
        self.pool: MemoryPool | None = None if many else opened  # one model (or its config, opened at start)
        if self.team is not None and replica is not None:
            raise ConfigError("cluster mode (--archive-url) serves one model")
        if self._config is not None and tenants:
            self._config = self._config.replace(tenants=tuple(dict.fromkeys(self._config.tenants + tenants)))
        elif opened is not None and tenants:
            opened.add_tenants(tenants)
        self.quotas = Quotas(settings, tenants)
        self.own_pool = self._config is not None if own_pool is None else own_pool
        self.queue = AgentQueue(default_limit=settings.max_concurrent_per_key,
                                default_rate=settings.max_requests_per_minute_per_key)
        self.processing = 0
        self._runners: dict[str, CallRunner] = {}
        self.models = Models(self._pool, self.queue.call, many=many, name=lambda: self.model_name)
        self.metrics = ServerMetrics(self._stats_or_none, processing=lambda: self.processing,
                                     deferred=lambda: self.queue.waiting,
                                     models=self._model_series if self.team is not None else None,
                                     model_names=self.model_names)
        self.lifecycle = Lifecycle(settings, quotas=self.quotas, usage=self.models, pools=self._loaded_pools,
                                   call=self.queue.call, forget=lambda aid: self.forget(LOCAL, aid),
                                   park=lambda aid, tier: self.park(LOCAL, aid, tier),
                                   observe=self.metrics.observe_conversation)

    # ------------------------------------------------------------------ lifetime
    @property
    def model_name(self) -> str:
        """The model id responses carry (several models: the default one's; each response names its own)."""
        if self.team is not None:
            return self.team.bindings.default
        if self.settings.model_name:
            return self.settings.model_name
        return Path(self.pool.model_path).stem if self.pool is not None else "agentmem"

    def model_names(self) -> tuple[str, ...]:
        """The models this server serves (its configuration's names: the only `model` labels of `/metrics`)."""
        return self.team.names if self.team is not None else (self.model_name,)

    @property
    def banner(self) -> str:
        """What the server serves, for its log: `model NAME`, or `models A, B (default A)`."""
        if self.team is not None:
            return f"models {', '.join(self.team.names)} (default {self.model_name})"
        return f"model {self.model_name}"

    @property
    def ready(self) -> bool:
        """Whether calls can be served."""
        if self.team is not None:
            return not self.team.closed and not self.queue.closing
        return self.pool is not None and not self.pool.closed and not self.queue.closing

    @property
    def storage_fault(self) -> str | None:
        """Why an archive refuses writes (`None`: every archive takes them); see `/health`."""
        pool = self.team if self.team is not None else self.pool
        return None if pool is None or pool.closed else pool.storage_fault

    async def start(self) -> None:
        """Open the pool (when given a config); an archive resumes its agents."""
        if self.pool is None and self._config is not None:
            self.pool = await asyncio.to_thread(MemoryPool, config=self._config)
        if self.replica is not None:
            self.replica.start()
        self.lifecycle.start()

    async def stop(self) -> None:
        """Finish or cancel in-flight calls, then close an owned pool (checkpointing its archive)."""
        await self.lifecycle.stop()
        await self.queue.shutdown(self.settings.shutdown_grace_s)
        owned = self.team if self.team is not None else self.pool
        if owned is not None and self.own_pool:
            await asyncio.to_thread(owned.close)
            logger.info("pool closed")
        if self.replica is not None:  # after the pool stored its agents under their leases
            await asyncio.to_thread(self.replica.close)

    def _pool(self) -> MemoryPool:
        """The open pool, of one model or of several (a 503 `ApiError` while none is)."""
        pool = self.team if self.team is not None else self.pool
        if pool is None or pool.closed:
            raise ApiError(503, "the model is not loaded", code="unavailable")
        return pool

    def _loaded_pools(self) -> Iterator[ModelEngine]:
        """Each loaded model's engine, held loaded while the loop body runs (blocking; the lifecycle's sweeps)."""
        if self.team is None and (self.pool is None or self.pool.closed):
            return  # one model, not opened yet (or closed)
        for lease in self.models.each_loaded():
            yield lease.pool

    def _stats_or_none(self) -> dict[str, Any] | None:
        pool = self.pool
        if pool is None or pool.closed:
            return None
        return pool.stats()

    def _model_series(self) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
        """Several models: `(MemoryPool.models(), {model: ModelEngine.stats()} of the loaded ones)` for `/metrics`."""
        assert self.team is not None
        return self.team.models(), self.models.stats()

    def admit(self, principal: Principal) -> Lease:
        """A concurrency slot for a request (429/503 otherwise)."""
        return self.queue.admit(principal)

    async def admit_call(self, lease: Lease, target: Target) -> Lease:
        """Reserve the key's quotas for a call of `target` under the request's admission `lease`
        (`serving.admitted`, taken before any work): 429 over the key's agents or parked bytes.

        The reservation ends with `lease`, as the target's line claim and model lease do. A new
        anonymous conversation first forgets the key's least recently used ones past its caps
        (`Lifecycle.make_room`): a key used normally never meets a 429 for them.
        """
        await self.lifecycle.make_room(lease.principal, target)
        lease.then(await self.quotas.reserve(lease.principal, target.agent_id, self.models))
        return lease

    # ------------------------------------------------------------------ which agent, which model
    async def seat(self, agent_id: str, model: str | None) -> Target:
        """The `Target` of a call of the named `agent_id` (`model`: what the request's field names)."""
        seat = await self.models.seat(agent_id, model)
        note_model(seat.name)
        return Target(agent_id, seat)

    async def find_line(self, principal: Principal, req: CallRequest,
                        model: str | None = None, *, space: str | None = None) -> Target:
        """The agent of a request that names none (`--anonymous lines`): the conversation it continues, or a new one.

        Looked up in the key's scope (its prefix's tenant; `agentmem.pool.lines`) on the prompt
        the call will render (tools and the JSON block included), among the lines of the
        request's model only; the line stays claimed until the call's lease is released. `space`:
        the request's end-user space (`--end-users`), else the key's (`auth.key_space`).
        """
        seat = await self.models.model_seat(model)
        note_model(seat.name)
        try:
            scope = key_space(principal) if space is None else space
            line = await self.queue.call(self._lookup(req, seat.pool, scope))
            if self.team is not None:
                line = await self._bind_line(req, seat, scope, line)
            seat.agent_id = line.agent_id
        except BaseException:
            seat.release()
            raise
        return Target(line.agent_id, seat, line)

    def _lookup(self, req: CallRequest, pool: MemoryPool, scope: str) -> Any:
        """`pool.find_line` on the prompt `req` renders, as a call for a worker thread."""
        if isinstance(req, ChatCallRequest):
            call = chat_call("line", req, self.settings, pool.tool_format)
            return functools.partial(pool.find_line, call.messages, tools=call.tools, scope=scope)
        assert isinstance(req, CompletionCallRequest)
        return functools.partial(pool.find_line, prompt=completion_call("line", req, self.settings).prompt, scope=scope)

    async def _bind_line(self, req: CallRequest, seat: ModelLease, scope: str, line: Line) -> Line:
        """Bind the line's agent to the seat's model; a derived id another model holds is derived again."""
        try:
            self.models.bind(line.agent_id, seat.name)
            return line
        except ModelMismatchError:  # two models with one tokenizer derived the same id: scope it by model
            seat.pool.release_line(line.agent_id)
        line = await self.queue.call(self._lookup(req, seat.pool, f"{scope}{seat.name}/"))
        try:
            self.models.bind(line.agent_id, seat.name)
        except BaseException:
            seat.pool.release_line(line.agent_id)
            raise
        return line

    # ------------------------------------------------------------------ calls
    async def prepare_chat(self, target: Target, req: ChatCallRequest) -> PoolCall:
        """Validate a chat request and apply the tools/JSON protocol; 413 over the prompt limit."""
        call = chat_call(target.agent_id, req, self.settings, target.pool.tool_format)
        call.line = target.kind
        await self._check_prompt(call, target.pool)
        return call

    async def prepare_completion(self, target: Target, req: CompletionCallRequest) -> PoolCall:
        """Validate a completion request; 413 over the prompt limit."""
        call = completion_call(target.agent_id, req, self.settings)
        call.line = target.kind
        await self._check_prompt(call, target.pool)
        return call

    async def count_tokens(self, model: str | None, req: ChatCallRequest) -> int:
        """The prompt size of a chat request on `model` (its tools included), without calling it."""
        seat = await self.models.model_seat(self.models.choose(model))
        note_model(seat.name)
        try:
            call = chat_call("count", req, self.settings, seat.pool.tool_format)
            return int(await self.queue.call(functools.partial(seat.pool.count_tokens, call.pool_messages(),
                                                               tools=call.tools)))
        finally:
            seat.release()

    async def _check_prompt(self, call: PoolCall, pool: MemoryPool) -> None:
        limit = self.settings.max_prompt_tokens
        if not limit:
            return
        if call.messages is not None:
            n = await self.queue.call(functools.partial(pool.count_tokens, call.pool_messages(), tools=call.tools))
            if call.sampling.get("opening"):  # a forced call's opening, sent apart from the messages
                n += len(pool.model.tokenize(call.sampling["opening"], parse_special=False))
        else:
            n = len((await self.queue.call(pool.renderer.render_text, call.prompt or "")).tokens)
        if n > limit:
            raise ApiError(413, f"the prompt has {n} tokens; this server accepts at most {limit}",
                           code="request_too_large", param="messages" if call.messages is not None else "prompt")

    def _runner(self, seat: ModelLease) -> CallRunner:
        """The protocol's runner on the seat's pool, this server's agent turns, worker threads and metrics."""
        name = seat.name
        runner = self._runners.get(name)
        if runner is None or runner.pool is not seat.pool:  # a model loaded again is a new pool
            runner = self._runners[name] = CallRunner(
                seat.pool, turns=self.queue.turns, workers=self.queue.workers,
                on_result=lambda _plan, result: self.metrics.observe_call(result, model=name),
                strategy=get_strategy(self.settings.decode_strategy))
        return runner

    async def run(self, call: PoolCall, target: Target) -> AsyncIterator[Event]:
        """Run `call` on `target`'s pool (`agentmem.calls.CallRunner.arun`): text events as they may be
        shown, then `("done", Outcome)`.

        The agent is held for the whole call (an `auto` retry, a call's rewrite and the
        commit included); closing the iterator early stops generation at the next token and
        frees the agent.
        """
        self._pool()  # 503 once the pool is closed
        runner = self._runner(target.seat)
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
                        await self._commit(call.agent_id, target.pool)
                        yield ("done", Outcome.of(value, call.line))
        finally:
            self.processing -= 1

    async def _commit(self, agent_id: str, pool: MemoryPool) -> None:
        """After a call, still holding its agent: commit fenced by its lease, or per `durability`."""
        if self.replica is not None:
            await self.replica.commit(agent_id)  # fenced by the agent's lease
        elif self.settings.durability == "call":
            # still holding the agent: the state written is the one this call left
            await self.queue.call(pool.commit, agent_id)

    def _owned(self, agent_id: str) -> Any:
        """Cluster mode: hold `agent_id`'s lease (re-reading a stale local copy) for the block."""
        return self.replica.serving(agent_id) if self.replica is not None else contextlib.nullcontext()

    async def collect(self, call: PoolCall, target: Target) -> Outcome:
        """Run `call` to its end (a non-streaming request)."""
        outcome = await until_done(self.run(call, target))
        assert isinstance(outcome, Outcome)
        return outcome
