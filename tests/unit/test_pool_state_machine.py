"""Stateful property test of `MemoryPool` (issue #13): random interleavings on the tiny models.

A hypothesis `RuleBasedStateMachine` drives one pool (2 live sequences for 4 agents,
so agents are parked and restored all the time) through chat / streams consumed or
abandoned after one piece / achat / forget / park / set_budget / pin / share /
handoff / checkpoint / close-and-reopen on the same SQLite archive, plus invalid
inputs that must raise an `AgentMemError` and change nothing. After every step it
checks, against the test's own model of what each agent was given:

* the ledger: `history_tokens(agent)` is the rendered prompt it was last given
  followed by the reply tokens it generated (all of them after an end of turn, all
  but the last — which is sampled, never decoded — after `max_tokens`); evicted
  tokens stay in the history while `tokens(agent)` holds the live ones;
* the live KV: a resident agent's sequence holds positions `0 .. n_live - 1`;
* `AgentState.check()` of every record, no agent left busy;
* `stats()`: tier counts add up, `calls` totals match the calls made since the
  pool was opened, per-agent calls match;
* sequences: every sequence is either held by a known agent or free, once;
* no hang: every pool operation runs in a worker thread under a deadline (a hung
  step fails with every thread's stack), async calls under `asyncio.wait_for`; the
  prefetch worker is drained under a deadline and must be gone after `close()`.

Profiles (registered here): `ci` (default; both models in well under a minute on a
2-core machine) and `long` (hundreds of examples, longer runs). Select with
`AGENTMEM_HYPOTHESIS_PROFILE=long`, e.g.

    AGENTMEM_HYPOTHESIS_PROFILE=long python -m pytest -q tests/unit/test_pool_state_machine.py

A failing run prints the step sequence; `--hypothesis-seed=N` replays a seed.
"""

from __future__ import annotations

import asyncio
import atexit
import faulthandler
import math
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agentmem import AgentMemError, MemoryPool
from agentmem.errors import ConfigError, StateError, UnknownAgentError
from agentmem.memory.shared import SHARE_PREFIX
from tests.fixtures.tiny_gguf import build_tiny_gguf

settings.register_profile(
    "ci", max_examples=30, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long", max_examples=400, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile(os.environ.get("AGENTMEM_HYPOTHESIS_PROFILE", "ci"))

# A state machine cannot take pytest fixtures: the tiny models are built (milliseconds)
# into a module-level temporary directory, removed when the interpreter exits.
_TMP = Path(tempfile.mkdtemp(prefix="agentmem-sm-"))
atexit.register(shutil.rmtree, _TMP, True)
_MODELS: dict[str, Path] = {}


def _model(arch: str) -> Path:
    if arch not in _MODELS:
        _MODELS[arch] = build_tiny_gguf(_TMP / f"tiny-{arch}.gguf", arch=arch)
    return _MODELS[arch]


POOL_OPTIONS = dict(n_ctx=1024, resident_agents=2, n_batch=32, n_threads=1, min_share_tokens=16)
AGENTS = ("a0", "a1", "a2", "a3")
SHARES = ("brief", "task")
WORDS = ("plan", "the", "route", "tool", "result", "é", "数据", "<|im_end|>", "<end_of_turn>", "ok", "42", "  ")
EVICTIONS = ("region_decay", "sliding_window", "streaming_llm")
MAX_PROMPT = 300  # rendered prompt tokens before a conversation starts over (stays far below capacity)
STEP_DEADLINE_S = 120.0
T = TypeVar("T")

words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=24).map(" ".join)


class StepHung(AssertionError):
    """A pool operation did not return within `STEP_DEADLINE_S`."""


def within_deadline(fn: Callable[[], T]) -> T:
    """`fn()` run in a worker thread; `StepHung` (with every thread's stack) if it blocks too long.

    The hung thread is a daemon and is left behind: the machine then skips closing
    the pool (which would wait for the same lock).
    """
    out: list[Any] = []

    def work() -> None:
        try:
            out.append((True, fn()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            out.append((False, exc))

    t = threading.Thread(target=work, name="state-machine-step", daemon=True)
    t.start()
    t.join(STEP_DEADLINE_S)
    if t.is_alive():
        with tempfile.TemporaryFile("w+") as f:
            faulthandler.dump_traceback(f, all_threads=True)
            f.seek(0)
            raise StepHung(f"step blocked for more than {STEP_DEADLINE_S:.0f} s; threads:\n{f.read()}")
    ok, value = out[0]
    if not ok:
        raise value
    return value


@dataclass
class Known:
    """What the test knows of one agent."""

    expected: list[int]  # history_tokens() the pool must report
    msgs: list[dict] | None = None  # messages last sent (None: its context came from a handoff)
    reply: str | None = None  # text of the last finished reply
    calls: int = 0  # calls since the pool was (re)opened or the agent created
    may_evict: bool = False  # a budget (or a handed-off history) may have evicted tokens
    budget: int = 0


class PoolMachine(RuleBasedStateMachine):
    """Random interleavings of every pool operation, checked against a model."""

    ARCH = "llama"

    def __init__(self) -> None:
        super().__init__()
        self.hung = False
        self.db = _TMP / f"archive-{os.getpid()}-{time.monotonic_ns()}.db"
        self.pool = self._open()
        self.known: dict[str, Known] = {}
        self.calls_since_open = 0
        self.briefs: dict[str, list[dict]] = {}

    def _open(self) -> MemoryPool:
        return MemoryPool(_model(self.ARCH), archive_path=str(self.db), **POOL_OPTIONS)

    def teardown(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None and not self.hung:
            engine = None if pool.closed else pool.engine()
            self._step(pool.close)
            t = None if engine is None else engine._prefetcher._thread
            assert t is None or not t.is_alive(), "the prefetch worker outlived close()"
        for p in _TMP.glob(self.db.name + "*"):
            p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ helpers
    def _step(self, fn: Callable[[], T]) -> T:
        try:
            return within_deadline(fn)
        except StepHung:
            self.hung = True
            raise

    def _settle(self) -> None:
        """Wait (bounded) until the prefetch worker has done what the last call queued."""
        q = self.pool.engine()._prefetcher.queue
        end = time.monotonic() + 30
        while q is not None and q.unfinished_tasks:
            assert time.monotonic() < end, "the prefetch worker hung"
            time.sleep(0.001)

    def _render(self, msgs: list[dict]) -> list[int]:
        return list(self.pool.renderer.render(msgs).tokens)

    def _next_messages(self, aid: str, mode: str, text: str, cut: int, use_brief: bool) -> list[dict]:
        k = self.known.get(aid)
        user = {"role": "user", "content": text}
        if k is None or not k.msgs or mode == "new":
            start = list(self.briefs[sorted(self.briefs)[cut % len(self.briefs)]]) if use_brief and self.briefs else []
            return start + [user]
        msgs = list(k.msgs)
        if mode == "rewind":
            users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
            msgs = msgs[: users[cut % len(users)]]
        elif k.reply is not None:
            reply = {"reply": k.reply, "edited": k.reply + " " + (text.split() or ["edit"])[0], "trimmed": k.reply[: len(k.reply) // 2]}[mode]
            msgs.append({"role": "assistant", "content": reply})
        msgs.append(user)
        if len(self._render(msgs)) > MAX_PROMPT:
            return [msgs[0], user] if msgs[0]["role"] == "system" else [user]
        return msgs

    def _known(self, aid: str) -> Known:
        if aid not in self.known:
            self.known[aid] = Known(expected=[])
        return self.known[aid]

    def _finished(self, aid: str, msgs: list[dict], result: Any) -> None:
        """Check and record the ledger after a finished call of `aid` with `msgs`."""
        prompt = self._render(msgs)
        hist = self.pool.history_tokens(aid)
        n = len(prompt)
        assert result.usage.prompt_tokens == n, f"{result.usage.prompt_tokens=}, {n=}"
        assert hist[:n] == prompt, f"{aid}: ledger is not the rendered prompt"
        done = result.tokens
        # the last token of a reply cut by max_tokens is sampled but never decoded
        want = len(done) - 1 if result.finish_reason == "length" and done else len(done)
        assert len(hist) - n == want, f"{aid}: {len(hist)=}, {n=}, {len(done)=}, {result.finish_reason=}"
        assert hist[n:] == done[:want], f"{aid}: ledger tail is not the reply tokens"
        k = self._known(aid)
        k.expected, k.msgs, k.reply = hist, msgs, result.text
        event(f"kv: {result.kv}")

    def _count_call(self, aid: str) -> None:
        self._known(aid).calls += 1
        self.calls_since_open += 1

    def _snapshot(self) -> Any:
        with self.pool.engine()._core.lock:
            s = self.pool.stats()
            return (
                sorted(self.pool.agents()),
                {a: self.pool.history_tokens(a) for a in self.pool.agents()},
                s["agents"], s["totals"],
            )

    # ------------------------------------------------------------------ calls
    @rule(aid=st.sampled_from(AGENTS), mode=st.sampled_from(["reply", "reply", "edited", "trimmed", "rewind", "new"]),
          text=words, cut=st.integers(0, 30), use_brief=st.booleans(), max_tokens=st.integers(1, 6),
          how=st.sampled_from(["chat", "stream", "achat"]))
    def chat(self, aid: str, mode: str, text: str, cut: int, use_brief: bool, max_tokens: int, how: str) -> None:
        msgs = self._next_messages(aid, mode, text, cut, use_brief)
        def call() -> Any:
            if how == "chat":
                return self.pool.chat(aid, msgs, max_tokens=max_tokens)
            if how == "stream":
                s = self.pool.chat_stream(aid, msgs, max_tokens=max_tokens)
                pieces = list(s)
                assert s.result is not None and "".join(pieces) == s.result.text, f"{pieces=}, {s.result=}"
                return s.result
            return asyncio.run(asyncio.wait_for(self.pool.achat(aid, msgs, max_tokens=max_tokens), STEP_DEADLINE_S))

        r = self._step(call)
        self._count_call(aid)
        self._finished(aid, msgs, r)

    @rule(aid=st.sampled_from(AGENTS), mode=st.sampled_from(["reply", "edited", "rewind", "new"]), text=words,
          cut=st.integers(0, 30), use_brief=st.booleans(), max_tokens=st.integers(2, 6))
    def abandoned_stream(self, aid: str, mode: str, text: str, cut: int, use_brief: bool, max_tokens: int) -> None:
        """A stream closed after its first piece: the agent keeps the prompt and what was decoded."""
        msgs = self._next_messages(aid, mode, text, cut, use_brief)
        def call() -> Any:
            s = self.pool.chat_stream(aid, msgs, max_tokens=max_tokens)
            try:
                next(s)
            except StopIteration:
                pass
            s.close()
            return s.result

        finished = self._step(call)
        self._count_call(aid)
        if finished is not None:
            self._finished(aid, msgs, finished)
            return
        prompt = self._render(msgs)
        hist = self.pool.history_tokens(aid)
        assert hist[: len(prompt)] == prompt, f"{aid}: ledger is not the rendered prompt"
        assert 0 <= len(hist) - len(prompt) < max_tokens, f"{len(hist)=}, {len(prompt)=}, {max_tokens=}"
        k = self._known(aid)
        k.expected, k.msgs, k.reply = hist, msgs, None

    # ------------------------------------------------------------------ agent operations
    @precondition(lambda self: self.known)
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        aid = data.draw(st.sampled_from(sorted(self.known)))
        self._step(lambda: self.pool.forget(aid))
        del self.known[aid]
        with pytest.raises(UnknownAgentError):
            self.pool.history_tokens(aid)

    @precondition(lambda self: self.known)
    @rule(data=st.data(), tier=st.sampled_from(["warm", "cold"]))
    def park(self, data: st.DataObject, tier: str) -> None:
        aid = data.draw(st.sampled_from(sorted(self.known)))
        self._step(lambda: self.pool.park(aid, tier))
        st_ = self.pool.stats()["agents"][aid]
        assert st_["tier"] in (tier, "empty"), f"{aid}: {st_['tier']=} after park({tier!r})"

    @rule(aid=st.sampled_from(AGENTS), tokens=st.sampled_from([0, 0, 48, 64, 96]), eviction=st.sampled_from(EVICTIONS))
    def set_budget(self, aid: str, tokens: int, eviction: str) -> None:
        before = self._snapshot()
        try:
            self._step(lambda: self.pool.set_budget(aid, tokens, eviction))
        except ConfigError:
            # documented: a budget that does not exceed the pinned live tokens
            assert tokens and aid in self.known, f"{aid=}, {tokens=}"
            assert self._snapshot() == before, "a rejected set_budget changed the pool"
            return
        k = self._known(aid)
        k.budget = tokens
        k.may_evict |= bool(tokens)

    @precondition(lambda self: any(k.msgs for k in self.known.values()))
    @rule(data=st.data(), pinned=st.booleans())
    def pin(self, data: st.DataObject, pinned: bool) -> None:
        aid = data.draw(st.sampled_from(sorted(a for a, k in self.known.items() if k.msgs)))
        k = self.known[aid]
        index = data.draw(st.integers(0, len(k.msgs) - 1))
        n = self._step(lambda: self.pool.pin(aid, index, pinned))
        assert isinstance(n, int) and n >= 0, f"{n=}"

    @rule(name=st.sampled_from(SHARES), text=words, repeat=st.integers(1, 4))
    def share(self, name: str, text: str, repeat: int) -> None:
        brief = [{"role": "system", "content": f"Team {name}: " + " ".join([text] * repeat)}]
        n = self._step(lambda: self.pool.share(name, brief))
        aid = SHARE_PREFIX + name
        self._count_call(aid)
        prefix = self._render(brief + [{"role": "user", "content": "\u2063"}])[:n]
        # what agents' prompts that start with the brief begin with
        assert self._render(brief + [{"role": "user", "content": "x"}])[:n] == prefix
        hist = self.pool.history_tokens(aid)
        assert hist == prefix, f"{len(hist)=}, {n=}"
        k = self._known(aid)
        k.expected, k.msgs, k.reply = hist, None, None
        self.briefs[name] = brief

    def _handoff_sources(self) -> list[str]:
        # share agents' ids are reserved: handoff() refuses them (ConfigError), by design
        return sorted(a for a, k in self.known.items() if k.expected and not a.startswith(SHARE_PREFIX))

    @precondition(lambda self: self._handoff_sources())
    @rule(data=st.data(), whole=st.booleans())
    def handoff(self, data: st.DataObject, whole: bool) -> None:
        src = data.draw(st.sampled_from(self._handoff_sources()))
        dst = data.draw(st.sampled_from([a for a in AGENTS if a != src]))
        s = self.known[src]
        upto = None if whole else data.draw(st.integers(1, len(s.expected)))
        try:
            card = self._step(lambda: self.pool.handoff(src, dst, upto))
        except StateError:
            # documented for a sliding-window source parked past its window: dst was reset
            assert self.ARCH == "gemma3", "StateError from a handoff on a model without a sliding window"
            k = self._known(dst)
            k.expected, k.msgs, k.reply = [], None, None
            return
        n = len(s.expected) if upto is None else upto
        assert card.n_tokens == n, f"{card.n_tokens=}, {n=}"
        k = self._known(dst)
        k.expected, k.msgs, k.reply = s.expected[:n], None, None
        k.may_evict |= s.may_evict

    # ------------------------------------------------------------------ durability
    @rule()
    def checkpoint(self) -> None:
        self._step(self.pool.checkpoint)

    @rule()
    def close_and_reopen(self) -> None:
        self._step(self.pool.close)
        self.pool = self._step(self._open)
        self.calls_since_open = 0
        for k in self.known.values():
            k.calls = 0

    # ------------------------------------------------------------------ invalid input
    @rule(which=st.integers(0, 11), aid=st.sampled_from(AGENTS))
    def invalid_input(self, which: int, aid: str) -> None:
        """A bad value raises an `AgentMemError` and changes nothing."""
        pool = self.pool
        msgs = [{"role": "user", "content": "hi"}]
        known = aid in self.known
        bad = [
            lambda: pool.chat("", msgs, max_tokens=2),
            lambda: pool.chat("\ud800", msgs, max_tokens=2),
            lambda: pool.chat(SHARE_PREFIX + "brief", msgs, max_tokens=2),
            lambda: pool.chat(aid, msgs, max_tokens=2, temperature=math.nan),
            lambda: pool.chat_stream(aid, msgs, max_tokens=True),
            lambda: asyncio.run(asyncio.wait_for(pool.achat(42, msgs, max_tokens=2), STEP_DEADLINE_S)),
            lambda: pool.pin(aid, 10_000),
            lambda: pool.pin(aid, -1),
            lambda: pool.forget("nobody"),
            lambda: pool.park(aid, "lukewarm") if known else pool.park("nobody"),
            lambda: pool.set_budget(aid, True),
            lambda: pool.handoff(aid, aid),
        ]
        before = self._snapshot()
        with pytest.raises(AgentMemError):
            self._step(bad[which])
        self._settle()
        assert self._snapshot() == before, f"invalid input #{which} changed the pool"

    # ------------------------------------------------------------------ invariants
    @invariant()
    def pool_matches_model(self) -> None:
        self._settle()
        pool = self.pool
        core = pool.engine()._core
        with core.lock:
            assert sorted(pool.agents()) == sorted(self.known), f"{sorted(pool.agents())=}, {sorted(self.known)=}"
            stats = pool.stats()
            n_seq = core.config.resident_agents
            held = []
            for aid, k in self.known.items():
                a = core.agents[aid]
                a.check()
                assert not a.held, f"{aid}: {a.residence=} between calls"
                hist = pool.history_tokens(aid)
                assert hist == k.expected, f"{aid}: {len(hist)=}, {len(k.expected)=}"
                live = pool.tokens(aid)
                assert len(live) == a.ledger.n_live == stats["agents"][aid]["live_tokens"]
                if not k.may_evict:
                    assert live == hist, f"{aid}: evicted tokens without a budget"
                else:
                    it = iter(hist)
                    assert all(t in it for t in live), f"{aid}: live tokens are not a subsequence of the history"
                if a.seq is not None:
                    held.append(a.seq)
                    pmax, pmin = pool.engine().ctx.seq_pos_max(a.seq), pool.engine().ctx.seq_pos_min(a.seq)
                    assert pmax == a.ledger.n_live - 1, f"{aid}: {pmax=}, {a.ledger.n_live=}"
                    assert (pmin == -1) if not a.ledger.n_live else (0 <= pmin <= pmax), f"{aid}: {pmin=}, {pmax=}"
                    if self.ARCH == "llama" and a.ledger.n_live:
                        assert pmin == 0, f"{aid}: {pmin=}"
                elif a.tier == "warm":
                    parked = core.tiers["warm"].get(aid)
                    assert parked is not None and parked.n_tokens == a.ledger.n_live, f"{aid}: {parked=}"
                s = stats["agents"][aid]
                assert s["calls"] == k.calls, f"{aid}: {s['calls']=}, {k.calls=}"
                assert s["budget"] == k.budget, f"{aid}: {s['budget']=}, {k.budget=}"
            assert sorted(held + pool.engine()._residency.free) == list(range(n_seq)), f"{held=}, {pool.engine()._residency.free=}"
            tiers = stats["tiers"]
            with_state = sum(1 for s in stats["agents"].values() if s["tier"] != "empty")
            assert sum(t["agents"] for t in tiers.values()) == with_state, f"{tiers=}"
            totals = stats["totals"]
            assert totals["agents"] == len(self.known) and totals["resident"] == len(held) <= n_seq, f"{totals=}"
            # forgotten agents' calls stay in the pool total; a forgotten id used again starts at 0
            for name in ("evictions", "restores", "parks", "linked_restores", "shared_prefix_hits", "handoffs", "demotions"):
                if totals[name]:
                    event(f"pool did {name}")
            assert totals["calls"] == self.calls_since_open >= sum(s["calls"] for s in stats["agents"].values())


class Gemma3Machine(PoolMachine):
    """The same machine on the sliding-window model (iSWA cache, SWA checkpoints)."""

    ARCH = "gemma3"


TestPoolStateMachineLlama = PoolMachine.TestCase
TestPoolStateMachineLlama.settings = PROFILE
TestPoolStateMachineGemma3 = Gemma3Machine.TestCase
TestPoolStateMachineGemma3.settings = PROFILE
