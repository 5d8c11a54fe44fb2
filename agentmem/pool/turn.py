"""One call through the pool, as named phases.

admit → place → reconcile → share → prefill → generate → finish:

* **admit** — the agent's record (created on first use); calls of one agent run
  one at a time, since they share one sequence.
* **place** — make it resident (`Mover.make_resident`: reused, restored, fresh).
* **reconcile** — keep the longest common prefix of its KV and the new prompt:
  one `AgentSeq.cut` drops the divergent tail (rolling back to the sliding-window
  checkpoint when the window no longer reaches the cut).
* **share** — a fresh agent takes the longest prefix another agent holds.
* **prefill** — decode only the new tokens (trimming to the budget on the way).
* **generate** — sample, stream text pieces, stop on end of turn / stop strings
  / `max_tokens`; decode steps are batched with other generating agents. With tools
  offered freely, the first tokens go through `CallCanon.lead` (a bare call object is
  rewritten in the KV with its format's opening, `agentmem.pool.canon`); a forced call's
  KV is made the template's tokens of the call at end of turn (`CallCanon.close_forced`).
* **finish** — the `ChatResult`; the agent is released and housekeeping
  (rebalance, prefetch) runs after the reply.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterator

from agentmem.engine.chat_format import RenderedPrompt
from agentmem.engine.sampling import Sampler, SamplingParams, TextAssembler
from agentmem.errors import ContextOverflowError, PoolClosedError
from agentmem.memory.tiers import HOT
from agentmem.pool import residence
from agentmem.pool.canon import CallCanon, Opening
from agentmem.pool.decoder import Decoder
from agentmem.pool.lifetime import Cancel
from agentmem.pool.mover import Mover
from agentmem.pool.results import ChatResult, Timings, Usage
from agentmem.pool.sharing import Sharing
from agentmem.pool.state import MISS, AgentState, PoolCore
from agentmem.tools.canonical import BareCallWatch

__all__ = ["TurnRunner"]

logger = logging.getLogger(__name__)


class TurnRunner:
    """Runs calls through the phases above; one instance per pool.

    Args:
        after_call: housekeeping run once a call has released its agent (gets
            the agent id).
    """

    def __init__(
        self,
        core: PoolCore,
        *,
        mover: Mover,
        sharing: Sharing,
        decoder: Decoder,
        after_call: Callable[[str], None],
    ) -> None:
        self.core = core
        self.mover = mover
        self.sharing = sharing
        self.decoder = decoder
        self.after_call = after_call
        self.canon = CallCanon(core, decoder)

    def run(
        self, agent_id: str, prompt: RenderedPrompt, params: SamplingParams, *, n_messages: int,
        watch: BareCallWatch | None = None, forced: Opening | None = None, cancel: Cancel | None = None,
    ) -> Iterator[str | ChatResult]:
        """The call as a generator of text pieces, ending with its `ChatResult`.

        `watch`: tools are offered freely; a reply that opens as a bare call to one of
        them is rewritten in the KV with the format's opening (`agentmem.pool.canon`).
        `forced`: the prompt ends with a forced call's opening (`CallCanon.opening`).
        `cancel`: checked before every prefill chunk and decode step (`agentmem.pool.lifetime`);
        once set the call raises `CallCancelledError` / `PoolClosedError` there.
        """
        core = self.core
        if core.closed:
            raise PoolClosedError("the pool is closed")
        t0 = time.perf_counter()
        a = self._admit(agent_id, len(prompt))
        sampler: Sampler | None = None
        timings = Timings()
        generating = False
        try:
            with core.lock:
                how = self._place(a, timings)
                a.n_messages = n_messages
                n_keep = self._reconcile(a, prompt)
                shared = self._share(a, prompt, n_keep, timings)
                n_keep = shared or n_keep
                a.ledger.retag(n_keep, prompt.spans, table=prompt.table)  # the kept prefix as this prompt renders it
                kv = "shared" if shared else ("restored" if how == "restored" and n_keep else ("reused" if n_keep else "prefilled"))
            sampler = Sampler(core.model.vocab, core.model.n_vocab, params) if params.max_tokens > 0 else None
            tok = self._prefill(a, prompt, n_keep, sampler, timings, cancel)
            t_first = time.perf_counter()
            with core.lock:
                self.decoder.generating += 1
                generating = True
            asm = TextAssembler(params.stop)
            completion: list[int] = []
            finish = yield from self._generate(a, tok, sampler, params, asm, completion, timings, watch, forced, cancel)
            with core.lock:
                self.decoder.generating -= 1
                generating = False
                core.cond.notify_all()
            tail = asm.flush()
            if tail:
                yield tail
            yield self._result(a, asm.text, finish, prompt, n_keep, completion, kv, timings, t0, t_first)
        finally:
            if sampler is not None:
                sampler.close()
            with core.lock:
                if generating:
                    self.decoder.generating -= 1
                residence.call_ends(a)
                a.last_used = time.monotonic()
                core.lines.touch(agent_id)  # its line key may have moved
                core.cond.notify_all()
            self.after_call(agent_id)

    # ------------------------------------------------------------------ phases
    def _admit(self, agent_id: str, n_prompt: int) -> AgentState:
        """The agent's record, held busy for this call (waits while another call of it runs)."""
        core = self.core
        with core.lock:
            a = core.agents.get(agent_id)
            budget = core.budget(a) if a else core.config.agent_budget_tokens
        if not budget and n_prompt >= core.capacity:
            raise ContextOverflowError(
                f"prompt of agent {agent_id!r} has {n_prompt} tokens; the agent capacity is {core.capacity} "
                f"(need at least one free cell to generate). Shorten the history, raise n_ctx/agent_capacity, "
                f"or set agent_budget_tokens to evict instead.",
                n_tokens=n_prompt,
                capacity=core.capacity,
            )
        with core.lock:
            while True:
                # Look the record up again after every wait: the agent may have been
                # forgotten meanwhile, and a call must never run on an orphaned record
                # (it would take a sequence nothing can free).
                a = core.agents.get(agent_id)
                if a is None:
                    a = core.agents[agent_id] = AgentState(agent_id)
                if not a.held:  # calls of one agent run one at a time (they share one sequence)
                    break
                core.cond.wait()
            residence.call_begins(a)
            a.counters["calls"] += 1
            core.totals["calls"] += 1
            core.predictor.observe(agent_id)
        return a

    def _place(self, a: AgentState, timings: Timings) -> str:
        """Make `a` resident; returns how (`reused` / `restored` / `fresh`)."""
        core = self.core
        tr = time.perf_counter()
        had_state = a.tier in core.tiers
        if a.seq is not None:
            core.tier_hits[HOT] += 1
            if a.prefetched:
                core.totals["prefetch_hits"] += 1
        elif had_state and core.config.prefetch and core.config.resident_agents > 1:
            core.totals["prefetch_misses"] += 1
        a.prefetched = False
        how = self.mover.make_resident(a).how
        if how == "fresh" and not had_state and len(a.ledger) == 0:
            core.tier_hits[MISS] += 1
        timings.restore_s = time.perf_counter() - tr if how == "restored" else 0.0
        assert a.seq is not None, f"{a.id=}"
        return how

    def _reconcile(self, a: AgentState, prompt: RenderedPrompt) -> int:
        """Keep the longest common prefix of `a`'s KV and `prompt`; returns the tokens kept."""
        assert a.kv is not None, f"{a.id=}"
        return a.kv.cut(min(a.ledger.common_prefix(prompt.ids), len(prompt) - 1))

    def _share(self, a: AgentState, prompt: RenderedPrompt, n_keep: int, timings: Timings) -> int:
        """For an agent with nothing kept: tokens taken from another agent's prefix (0: none)."""
        if n_keep or len(a.ledger):
            return 0
        ts = time.perf_counter()
        shared = self.sharing.share_prefix(a, prompt)
        if shared:
            timings.restore_s += time.perf_counter() - ts
        return shared

    def _prefill(self, a: AgentState, prompt: RenderedPrompt, n_keep: int, sampler: Sampler | None, timings: Timings,
                 cancel: Cancel | None = None) -> int | None:
        """Decode the prompt's new tokens; the first sampled token (None without a sampler)."""
        core = self.core
        tp = time.perf_counter()
        new = prompt.ids[n_keep:].tolist()
        tok = self.decoder.prefill(a, new, prompt.spans, sampler, timings, cancel=cancel)
        a.prompt_end = (len(a.ledger), a.ledger.n_live)
        timings.prefill_s = time.perf_counter() - tp
        a.counters["prefill_tokens"] += len(new)
        a.counters["cached_tokens"] += n_keep
        core.totals["prefill_tokens"] += len(new)
        core.totals["cached_tokens"] += n_keep
        return tok

    def _generate(
        self, a: AgentState, tok: int | None, sampler: Sampler | None, params: SamplingParams,
        asm: TextAssembler, completion: list[int], timings: Timings, watch: BareCallWatch | None,
        forced: Opening | None = None, cancel: Cancel | None = None,
    ) -> Iterator[str]:
        """Sample until end of turn, a stop string or `max_tokens`; yields text pieces, returns the finish reason."""
        core = self.core
        model = core.model
        budget = core.budget(a)
        if watch is not None and tok is not None:
            assert sampler is not None
            tok, finish = yield from self.canon.lead(a, tok, sampler, params, asm, completion, watch, timings)
            if finish is not None:
                return finish
        while tok is not None:
            if model.is_eog(tok):
                piece = ""
                if watch is not None:  # once, at the end: a call not closed as the template writes it
                    piece = self.canon.close(a, asm, completion, watch, params, timings)
                elif forced is not None:  # a forced call: its KV made the template's tokens of it
                    piece = self.canon.close_forced(a, asm, completion, forced, params, timings)
                if piece:
                    yield piece
                return "stop"
            completion.append(tok)
            piece = asm.push(model.token_bytes(tok))
            if piece:
                yield piece
            if asm.stopped:
                return "stop"
            if len(completion) >= params.max_tokens or (not budget and a.ledger.n_live + 1 >= core.capacity):
                break
            assert sampler is not None
            if cancel is not None:
                cancel.check()  # a client gone or the pool closing: stop before the next step
            tok = self.decoder.step(a, tok, sampler, timings)
        return "length"

    def _result(
        self, a: AgentState, text: str, finish: str, prompt: RenderedPrompt, n_keep: int, completion: list[int],
        kv: str, timings: Timings, t0: float, t_first: float,
    ) -> ChatResult:
        t_end = time.perf_counter()
        timings.ttft_s = t_first - t0
        timings.decode_s = t_end - t_first
        timings.total_s = t_end - t0
        n_prompt = len(prompt)
        logger.debug(
            "agent %r: %s, prompt=%d cached=%d new=%d ttft=%.1fms",
            a.id, kv, n_prompt, n_keep, n_prompt - n_keep, 1e3 * timings.ttft_s,
        )
        return ChatResult(
            agent_id=a.id,
            text=text,
            finish_reason=finish,
            usage=Usage(prompt_tokens=n_prompt, cached_tokens=n_keep, completion_tokens=len(completion)),
            timings=timings,
            kv=kv,
            tokens=completion,
        )
