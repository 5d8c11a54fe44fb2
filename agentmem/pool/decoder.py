"""Decoding for the pool: chunked prefill of a prompt, and batched steps of concurrent agents.

`Decoder.prefill` decodes a prompt's new tokens in chunks of `n_batch`, trimming
the agent to its budget before a chunk would push it over. `Decoder.step` is
continuous batching: every generating agent submits its next token, one waiting
thread (the *leader*) decodes all pending steps in one `llama_decode` and samples
each. Both make room (park an idle agent) when the shared cache is full.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from agentmem.engine.sampling import Sampler
from agentmem.errors import ContextOverflowError, EngineError
from agentmem.pool.residency import Residency
from agentmem.pool.state import AgentState, PoolCore
from agentmem.pool.trimming import Trimmer

if TYPE_CHECKING:
    from agentmem.pool.lifetime import Cancel
    from agentmem.pool.results import Timings

__all__ = ["Decoder"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Step:
    """One agent's next-token request in the decode batch."""

    agent: AgentState
    token: int
    sampler: Sampler
    result: int | None = None
    error: BaseException | None = None


def _cache_full(exc: EngineError) -> bool:
    """llama_decode's return code 1: no free cells for the batch."""
    return getattr(exc, "code", None) == 1


_T = TypeVar("_T")


class Decoder:
    """Prefill and batched decode steps (each under the context lock)."""

    def __init__(self, core: PoolCore, residency: Residency, trimmer: Trimmer) -> None:
        self.core = core
        self.residency = residency
        self.trimmer = trimmer
        self.generating = 0  # agents between their first and last decode step
        self._pending: list[_Step] = []
        self._leader = False
        #: how long a batch leader waits for the other generating agents to join (seconds)
        self.batch_wait_s = 0.002

    def prefill(self, a: AgentState, tokens: Sequence[int], spans: Any, sampler: Sampler | None, t: Timings, *,
                cancel: Cancel | None = None) -> int | None:
        """Decode `tokens` after `a`'s ledger; sample one token if `sampler`.

        Decoding and sampling happen under one lock hold so no other sequence's
        decode can overwrite the logits in between. With a token budget, the
        agent is trimmed before a chunk would push it over. `cancel` is checked
        before every chunk: a cancelled call stops there, its ledger holding the
        chunks already decoded (consistent with its KV).
        """
        core = self.core
        ctx = core.ctx
        n = len(tokens)
        step = ctx.n_batch
        budget = core.budget(a)
        with core.lock:
            start = 0
            idx = -1
            # recall_kv: stored spans found verbatim in the prompt go in as their cells (pool/kvcapture.py)
            kv_plan = self.trimmer.span_kv.plan(a, tokens)
            while start < n:
                if cancel is not None:
                    cancel.check()
                if kv_plan and kv_plan[0][0] == start:
                    start = self._insert_span(a, tokens, kv_plan.pop(0), spans, budget, t)
                    continue
                chunk = tokens[start : min(start + step, kv_plan[0][0] if kv_plan else n)]
                pos0, seq = self._room(a, len(chunk), n - start, budget, t)
                got = self._fitting(a, lambda: ctx.decode_run(seq, chunk, pos0))
                if got is None:
                    raise self._full(pos0 + n - start)
                idx = got
                self._extend(a, chunk, spans)
                start += len(chunk)
            if sampler is None:
                return None
            return sampler.sample(ctx.ptr, idx)

    def _insert_span(self, a: AgentState, tokens: Sequence[int], match: tuple[int, int, int, int], spans: Any,
                     budget: int, t: Timings) -> int:
        """Put the stored span `match` (`SpanCapture.plan`'s) into `a`'s sequence; the next start in `tokens`."""
        s, e, span_id, lo = match
        span = list(tokens[s:e])
        pos0, seq = self._room(a, len(span), len(tokens) - s, budget, t)
        if self._fitting(a, lambda: self.trimmer.span_kv.insert(a, seq=seq, pos0=pos0, tokens=span, span_id=span_id,
                                                                lo=lo)) is None:
            raise self._full(pos0 + len(tokens) - s)
        self._extend(a, span, spans)
        return e

    def _room(self, a: AgentState, k: int, left: int, budget: int, t: Timings) -> tuple[int, int]:
        """Trim `a` to its budget before `k` more tokens (`left` still to come); their first position and the sequence.

        Raises:
            ContextOverflowError: the agent would exceed the pool's capacity even so.
        """
        core = self.core
        if budget and a.ledger.n_live + k + 1 > budget:
            target = max(0, min(int(budget * core.config.eviction_low), budget - k - 1))
            t.evict_s += self.trimmer.evict(a, target)
        pos0 = a.ledger.n_live
        assert a.seq is not None, f"{a.id=}"
        if pos0 + k >= core.capacity:
            raise ContextOverflowError(
                f"agent {a.id!r} would hold {pos0 + k} tokens; capacity is {core.capacity}"
                + (" even after eviction (pinned tokens?)" if budget else ""),
                n_tokens=pos0 + left,
                capacity=core.capacity,
            )
        return pos0, a.seq

    def _full(self, n_tokens: int) -> ContextOverflowError:
        """The error of a shared context that stays full after every idle agent was parked."""
        n_ctx = self.core.ctx.n_ctx
        return ContextOverflowError(f"the shared context ({n_ctx} cells) is full and no idle agent can be parked; "
                                    f"raise n_ctx or lower resident_agents", n_tokens=n_tokens, capacity=n_ctx)

    @staticmethod
    def _extend(a: AgentState, toks: Sequence[int], spans: Any) -> None:
        """Append prompt tokens just put into `a`'s sequence to its ledger (tagged by `spans`, else as the reply's)."""
        if spans is None:
            a.ledger.extend(toks, None, region="assistant", message=a.n_messages)
        else:
            a.ledger.extend(toks, spans)

    def _fitting(self, keep: AgentState, decode: Callable[[], _T]) -> _T | None:
        """`decode()`, parking idle agents while the cache is full; None when nothing is left to park."""
        out: list[_T] = []

        def attempt() -> bool:
            try:
                out.append(decode())
                return True
            except EngineError as exc:
                if _cache_full(exc):
                    return False
                raise

        return out[0] if self.residency.fit(keep, attempt) else None

    def step(self, a: AgentState, tok: int, sampler: Sampler, t: Timings) -> int:
        """Decode `tok` for `a` and sample its next token, batched with other agents.

        Continuous batching: every generating agent submits its step; one of the
        waiting threads (the *leader*) decodes all pending steps in a single
        `llama_decode` — one token per sequence — samples each, and hands the
        results back. A new request simply joins the next batch.
        """
        core = self.core
        budget = core.budget(a)
        with core.lock:
            if budget and a.ledger.n_live + 2 > budget:
                t.evict_s += self.trimmer.evict(a, max(0, int(budget * core.config.eviction_low)))
            if a.ledger.n_live + 1 >= core.capacity:
                raise ContextOverflowError(
                    f"agent {a.id!r} reached its capacity of {core.capacity} tokens",
                    n_tokens=a.ledger.n_live + 1, capacity=core.capacity,
                )
            st = _Step(a, tok, sampler)
            if not core.config.batch_decode:
                self._run_batch([st])
            else:
                self._pending.append(st)
                core.cond.notify_all()  # a leader waiting for this step re-counts now, not at its timeout
                while st.result is None and st.error is None:
                    if self._leader:
                        core.cond.wait()
                        continue
                    self._lead()
            if st.error is not None:
                raise st.error
            assert st.result is not None
            return st.result

    def _lead(self) -> None:
        """Decode the pending steps as this thread's batch (lock held)."""
        core = self.core
        self._leader = True
        try:
            deadline = time.perf_counter() + self.batch_wait_s
            # give the other generating agents a moment to join this batch
            while len(self._pending) < self.generating:
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                core.cond.wait(left)
            n_batch = core.ctx.n_batch
            batch, self._pending = self._pending[:n_batch], self._pending[n_batch:]
            self._run_batch(batch)
        finally:
            self._leader = False
            core.cond.notify_all()

    def _run_batch(self, batch: list[_Step]) -> None:
        """Decode one token for each step's sequence in one batch, then sample each (lock held)."""
        core = self.core
        totals = core.totals
        try:
            runs = [(st.agent.seq, (st.token,), st.agent.ledger.n_live) for st in batch]
            idxs = self._fitting(batch[0].agent, lambda: core.ctx.decode_multi(runs))  # type: ignore[arg-type]
            if idxs is None:
                raise ContextOverflowError(
                    f"the shared context ({core.ctx.n_ctx} cells) is full and no idle agent can be parked",
                    n_tokens=len(batch), capacity=core.ctx.n_ctx,
                )
            for st, idx in zip(batch, idxs):
                st.agent.ledger.extend((st.token,), None, region="assistant", message=st.agent.n_messages)
                st.result = st.sampler.sample(core.ctx.ptr, idx)
            totals["batched_steps"] += 1
            totals["batched_tokens"] += len(batch)
            totals["max_batch"] = max(totals["max_batch"], len(batch))
        except BaseException as exc:
            for st in batch:
                if st.result is None:
                    st.error = exc
