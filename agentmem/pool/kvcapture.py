"""Recall as KV: an evicted span's KV cells copied out before eviction drops them, spliced back when its tokens return.

Where it runs (`PoolConfig.recall_kv`): under `"auto"`, the default, for the agents that
have used recall (`MemoryPool.recall`, which the recall tool and the memory components
call; `note_recall`), from their first recall on, on a model without a sliding window;
`True` for every agent (and on a sliding-window model with `swa_full`, for experiments);
`False` never. Measured by `benchmarks/recall_kv_pool.py` (docs/recall.md): on
Qwen2.5-Coder-0.5B-Instruct a recall call's TTFT drops 1.3x with every answer kept (heal
32); on Gemma 3 270M (sliding window) the splice was no faster (0.99x) and far off the
re-prefill (KL 0.30 nats), hence text there. An agent that never recalls pays nothing.

At eviction `Trimmer.evict` asks `SpanCapture.capture` for the cells of each live range
the eviction policy picked, *before* `AgentSeq.evict` removes them, and
`SpanCapture.store` writes them beside the span's archived text (`Archive.put_span_kv`,
table `span_kv`), coded with `PoolConfig.recall_kv_codec` (q8_0: about half of f16's
bytes), the agent keeping its `recall_kv_keep` newest.

Each range is cut into the rows `Trimmer` archives (consecutive history tokens of one
message), and a row is captured when `agentmem.recall.as_kv.SplicePolicy` would splice a
span of its length (64-256 tokens); the copy goes through a scratch sequence the pool's
context keeps for it (`n_seq_max` one above `resident_agents`: sequence id
`resident_agents`, never an agent's). A context that cannot splice
(`agentmem.engine.splice.splice_supported`: per-sequence streams, a sliding-window model
without `swa_full`) captures nothing. The blobs are tagged with a digest of the pool's
state fingerprint (model, KV types, layout, llama.cpp build), so a blob is only ever read
back by a pool whose cells it fits.

The other half is in the prefill (`Decoder.prefill`): `SpanCapture.plan` finds, in the
tokens a call is about to decode, the longest verbatim run (at least `SplicePolicy.min_tokens`)
of each stored span's token ids (a recall block quoting an evicted line holds them: a line's
tokens do not depend on what came before it, bar its first word;
`agentmem.recall.span_match.SpanIndex`, whose work per call grows with the new tokens
only), and `SpanCapture.insert` puts that part of the span's cells there
(`agentmem.recall.as_kv.KVRecaller`: spliced, the first `recall_kv_heal` tokens
recomputed; prefilled as text when the blob is gone, does not decode, or llama.cpp refuses
it). A match that would end the prompt is left to the text path (the prompt's last logits
must come from a decode).

Counters (in `MemoryPool.recall_stats()` unless `recall_kv=False`): `kv_enabled`;
`kv_captured` ranges and their `kv_capture_bytes` (as llama.cpp wrote them), `kv_stored`
rows written and their `kv_stored_bytes` (coded), `kv_capture_skipped` rows the policy
leaves as text, `kv_capture_failed` copies llama.cpp refused; `kv_matched` spans found in
a prompt, `kv_spliced` / `kv_prefilled` (and their `_tokens`) how they went in,
`kv_splice_failed` blobs llama.cpp rejected (prefilled instead).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from agentmem.engine.splice import SpanKV, capture_span, splice_supported
from agentmem.errors import AgentMemError, EngineError
from agentmem.codec import decode_state, is_encoded
from agentmem.recall.as_kv import KVRecaller, SplicePolicy
from agentmem.recall.span_match import SpanIndex

if TYPE_CHECKING:
    from agentmem.pool.state import AgentState, PoolCore

__all__ = ["INDEXES_KEPT", "SpanCapture", "fingerprint_digest"]

logger = logging.getLogger(__name__)

_SPLICE_COUNTERS = ("spliced", "prefilled", "spliced_tokens", "prefilled_tokens", "splice_failed")
"""`KVRecaller.counters`' names (reported as zeros where the context cannot splice)."""

INDEXES_KEPT = 256
"""Agents whose `SpanIndex` `SpanCapture` keeps in RAM (least recently planned dropped first)."""


def fingerprint_digest(fingerprint: dict[str, Any]) -> str:
    """A short, stable name for a pool's state fingerprint (the `model` of its `span_kv` rows)."""
    raw = json.dumps(fingerprint, sort_keys=True, default=str).encode()
    return "fp:" + hashlib.sha256(raw).hexdigest()[:32]


class SpanCapture:
    """Copies evicted spans' cells out and stores them (one per pool; lock held by the caller).

    Args:
        core: the pool's state; its config's `recall_kv` turns capture on.
        policy: which span lengths are worth keeping (default `SplicePolicy()`).

    Attributes:
        enabled: whether anything is captured (`recall_kv` on and the context can splice).
        scratch: the sequence the cells pass through.
        counters: see the module docstring.
    """

    def __init__(self, core: PoolCore, *, policy: SplicePolicy | None = None) -> None:
        cfg = core.config
        self.core = core
        self.policy = policy or SplicePolicy(heal=cfg.recall_kv_heal)
        self.scratch = cfg.resident_agents
        self.enabled = bool(cfg.recall_kv and core.ctx.params.n_seq_max > self.scratch and splice_supported(core.ctx)
                            and (cfg.recall_kv is True or core.ctx.model.n_swa == 0))
        self.every_agent = cfg.recall_kv is True
        self.recalling: set[str] = set()  # `auto`: the agents that have recalled (`note_recall`)
        self._indexes: OrderedDict[str, tuple[Any, SpanIndex]] = OrderedDict()  # agent -> (listed, its index)
        self.model = fingerprint_digest(core.fingerprint)
        self.counters = {"kv_captured": 0, "kv_capture_bytes": 0, "kv_stored": 0, "kv_stored_bytes": 0,
                         "kv_capture_skipped": 0, "kv_capture_failed": 0, "kv_matched": 0}
        self.recaller = KVRecaller(core.ctx, policy=self.policy, scratch=self.scratch) if self.enabled else None
        if cfg.recall_kv is True and not self.enabled:
            logger.info("recall_kv: this context cannot splice KV (per-sequence streams or a sliding window "
                        "without swa_full); evicted spans are kept as text only")

    def active(self, agent_id: str) -> bool:
        """Whether `agent_id`'s evictions are captured and its prompts matched (see `PoolConfig.recall_kv`)."""
        return self.enabled and (self.every_agent or agent_id in self.recalling)

    def note_recall(self, agent_id: str) -> None:
        """`agent_id` used recall: under `recall_kv="auto"` its spans are kept as cells from now on."""
        if self.enabled and not self.every_agent:
            self.recalling.add(agent_id)

    def forget(self, agent_id: str) -> None:
        """`agent_id` is gone: stop tracking it."""
        self.recalling.discard(agent_id)
        self._indexes.pop(agent_id, None)

    def capture(self, a: AgentState, ranges: Sequence[tuple[int, int]]) -> dict[tuple[int, int], SpanKV]:
        """The cells of each range of `a`'s live positions worth keeping, keyed by its history `(start, end)`.

        Call it before `AgentSeq.evict(ranges)`; nothing of the agent's sequence changes.
        """
        if a.kv is None or not self.active(a.id):
            return {}
        led = a.ledger
        live_idx = np.flatnonzero(led.live)
        out: dict[tuple[int, int], SpanKV] = {}
        for s, e in ranges:
            p0 = s  # live position of each run's first token (the ranges are live positions)
            for run in led.message_runs(live_idx[s:e]):
                kv = self._capture_run(a, p0, p0 + run.size, led.tokens[run].tolist())
                if kv is not None:
                    out[(int(run[0]), int(run[-1]) + 1)] = kv
                p0 += run.size
        return out

    def _capture_run(self, a: AgentState, p0: int, p1: int, tokens: list[int]) -> SpanKV | None:
        """The cells at live positions `[p0, p1)` (one archived row), or None: not worth keeping, or refused."""
        assert a.kv is not None, f"{a.id=}"
        if self.policy.decide(n_tokens=p1 - p0, supported=True) is None:
            self.counters["kv_capture_skipped"] += 1
            return None
        try:
            kv = capture_span(self.core.ctx, seq=a.kv.id, p0=p0, p1=p1, tokens=tokens, scratch=self.scratch)
        except EngineError as exc:
            self.counters["kv_capture_failed"] += 1
            logger.debug("agent %r: cells [%d, %d) not captured: %s", a.id, p0, p1, exc)
            return None
        self.counters["kv_captured"] += 1
        self.counters["kv_capture_bytes"] += int(kv.blob.nbytes)
        return kv

    def store(self, a: AgentState, ids: Sequence[int], rows: Sequence[tuple[int, int, str, str]],
              captured: dict[tuple[int, int], SpanKV]) -> None:
        """Write the captured cells beside the archived rows they are (`ids[i]` is `rows[i]`'s span id).

        Each blob is encoded with `PoolConfig.recall_kv_codec` (`q8_0`: about half of f16's
        bytes); the agent keeps its `recall_kv_keep` newest spans' cells.
        """
        cfg = self.core.config
        codec = self.core.codec(cfg.recall_kv_codec)
        for span_id, row in zip(ids, rows):
            kv = captured.get((row[0], row[1]))
            if kv is None:
                continue
            try:
                blob = codec.encode(kv.blob, n_tokens=kv.n).data
                ok = self.core.recall_store.put_span_kv(a.id, int(span_id), blob=blob, pos0=kv.pos0,
                                                        tokens=kv.tokens, model=self.model, keep=cfg.recall_kv_keep)
            except AgentMemError as exc:  # a full disk, a lost lease: the text is archived; the cells are a bonus
                logger.warning("agent %r: span cells not stored: %s", a.id, exc)
                continue
            self.counters["kv_stored"] += int(ok)
            self.counters["kv_stored_bytes"] += int(blob.nbytes) if ok else 0
            self.core.totals["recall_kv_stored"] += int(ok)

    def plan(self, a: AgentState, tokens: Sequence[int]) -> list[tuple[int, int, int, int]]:
        """`(start, end, span_id, lo)`: `tokens[start:end]` is the stored span `span_id` from its token `lo` on.

        A part of a span counts when it is at least `SplicePolicy.min_tokens` long: a recall
        block rewrites a quoted line's first word (`"- "` before it) and drops role lines, so
        a span's ends rarely come back verbatim while its middle does. Matches are anchored
        on `ANCHOR`-token runs (`agentmem.recall.span_match.SpanIndex`, built once per
        change of the agent's stored spans: the work per call grows with `tokens` only), in
        prompt order, never overlapping, and end before the prompt's last token (its logits
        must come from a decode).
        """
        n = len(tokens)
        if n <= self.policy.min_tokens or not self.active(a.id):
            return []
        try:
            listed = self.core.recall_store.span_kv_tokens(a.id, model=self.model)
        except AgentMemError as exc:
            logger.warning("agent %r: stored span cells not listed: %s", a.id, exc)
            return []
        if not listed:
            return []
        got = self._indexes.get(a.id)
        if got is None or got[0] is not listed:  # the archive's list changed: index it again
            got = (listed, SpanIndex(listed))
        self._indexes[a.id] = got
        self._indexes.move_to_end(a.id)
        while len(self._indexes) > INDEXES_KEPT:
            self._indexes.popitem(last=False)
        out = got[1].find(tokens, min_tokens=self.policy.min_tokens, end=n - 1)
        self.counters["kv_matched"] += len(out)
        return out

    def insert(self, a: AgentState, *, seq: int, pos0: int, tokens: Sequence[int], span_id: int, lo: int = 0) -> str:
        """Put the stored span `span_id`'s tokens `lo...` (`tokens`) into `seq` at `pos0...`; how they went in.

        Returns `"spliced"` or `"prefilled"` (no cells kept, or llama.cpp refused them).

        Raises:
            EngineError: the text prefill failed (no room in the context).
        """
        assert self.recaller is not None, "insert needs recall_kv on a context that can splice"
        try:
            got = self.core.recall_store.get_span_kv(a.id, span_id, model=self.model)
        except AgentMemError as exc:
            logger.warning("agent %r: span cells not read: %s", a.id, exc)
            got = None
        kv = None
        want = tuple(int(t) for t in tokens)
        if got is not None and got.tokens[lo : lo + len(want)] == want:
            blob = self._decoded(a, got.blob)
            if blob is not None:
                kv = SpanKV(blob=blob, pos0=got.pos0, tokens=got.tokens).narrow(lo, lo + len(want))
        how = self.recaller.insert(seq=seq, pos0=pos0, tokens=want, kv=kv)
        if how == "spliced":
            self.core.totals["recall_kv_spliced_tokens"] += len(want)
        return how

    def _decoded(self, a: AgentState, blob: np.ndarray) -> np.ndarray | None:
        """The llama.cpp bytes of a stored blob (decoded when a codec wrote it), or None: it does not decode."""
        if not is_encoded(blob):
            return blob
        try:
            return decode_state(blob)
        except AgentMemError as exc:  # a damaged or hostile row: the text goes in instead
            logger.warning("agent %r: stored span cells do not decode: %s", a.id, exc)
            return None

    def stats(self) -> dict[str, int]:
        """A copy of the counters (the splice's with a `kv_` prefix)."""
        out = dict(self.counters)
        splice = self.recaller.counters if self.recaller is not None else dict.fromkeys(_SPLICE_COUNTERS, 0)
        out.update({f"kv_{k}": v for k, v in splice.items()})
        return out
