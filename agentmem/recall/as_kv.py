"""Recall as KV: a recalled span put back into a sequence as its archived cells where that pays, as text elsewhere.

`SplicePolicy` is the rule, from `benchmarks/recall_kv.py`'s figures (quoted in its
docstring); `KVRecaller` applies it to one context: `insert(seq=, pos0=, tokens=, kv=)`
splices the span's cells (`agentmem.engine.splice.splice_span`, the first `heal` tokens
recomputed) when the policy says so and the context qualifies, and prefills the tokens
otherwise — including when llama.cpp rejects the blob — counting each way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal, Sequence

from agentmem.engine.context import LlamaContext
from agentmem.engine.splice import SpanKV, splice_span, splice_supported
from agentmem.errors import ConfigError, EngineError

__all__ = ["KVRecaller", "SplicePolicy"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SplicePolicy:
    """When a recalled span comes back as KV, and how many of its first tokens are recomputed.

    Measured by `python benchmarks/recall_kv.py` (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, f16 KV,
    one CPU thread on a shared 2-core machine at load 3-8; 4 spans per length; TTFT from the
    live prefix to the answer's first logits, median of 2; KL (nats) of that next-token
    distribution against a full re-prefill):

    ====== ============ ======== ======= ======== ========
    tokens way          TTFT ms  vs text KL mean  KL max
    ====== ============ ======== ======= ======== ========
    64     text         1239     1.00x   0        0
    64     splice h=0   407      3.05x   0.033    0.052
    64     splice h=4   518      2.39x   0.016    0.036
    64     splice h=16  830      1.49x   0.013    0.035
    256    text         8840     1.00x   0        0
    256    splice h=4   1168     7.57x   0.014    0.023
    1024   text         34060    1.00x   0        0
    1024   splice h=0   1768     19.3x   0.022    0.040
    1024   splice h=4   2211     15.4x   0.018    0.032
    1024   splice h=16  2652     12.8x   0.015    0.024
    ====== ============ ======== ======= ======== ========

    Leaving the span out altogether costs KL 0.37-0.53: a splice healed by 4 costs 3-5 % of
    that. Hence the rule: splice every span of at least 64 tokens (the
    shortest measured; it already paid 2.4x, and a shorter span is one eviction block or two,
    whose prefill costs little more than loading its blob) and heal 4 tokens (half the KL of
    no healing for about 0.1 s; 16 buys little more and costs three times as much). The KL
    does not grow with the span's length up to 1024, so no upper bound is set. A context that
    cannot splice (`splice_supported`: a sliding-window model without `swa_full`, or
    per-sequence streams) always prefills.

    Attributes:
        min_tokens: spans shorter than this are prefilled as text.
        heal: tokens at the span's start recomputed after the new prefix (EPIC's seam repair).
    """

    min_tokens: int = 64
    heal: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 1:
            raise ConfigError(f"min_tokens must be an int >= 1, got {self.min_tokens!r}")
        if isinstance(self.heal, bool) or not isinstance(self.heal, int) or self.heal < 0:
            raise ConfigError(f"heal must be an int >= 0, got {self.heal!r}")

    def decide(self, *, n_tokens: int, supported: bool) -> int | None:
        """The heal width to splice a span of `n_tokens` with, or None: prefill its text.

        Args:
            n_tokens: the span's length.
            supported: whether the context can splice (`agentmem.engine.splice.splice_supported`).
        """
        if not supported or n_tokens < self.min_tokens:
            return None
        return min(self.heal, n_tokens)


class KVRecaller:
    """Recalled spans into one context's sequences: spliced where `policy` says it pays, prefilled elsewhere.

    Args:
        ctx: the context.
        policy: the rule (default `SplicePolicy()`).
        scratch: an empty sequence the splice passes the cells through (never an agent's).

    Attributes:
        counters: `spliced` / `prefilled` spans and their tokens, and `splice_failed` (a
            blob llama.cpp rejected: the span was prefilled instead).
    """

    def __init__(self, ctx: LlamaContext, *, policy: SplicePolicy | None = None, scratch: int) -> None:
        self.ctx = ctx
        self.policy = policy or SplicePolicy()
        self.scratch = scratch
        self.supported = splice_supported(ctx)
        self.counters = {"spliced": 0, "prefilled": 0, "spliced_tokens": 0, "prefilled_tokens": 0,
                         "splice_failed": 0}

    def insert(self, *, seq: int, pos0: int, tokens: Sequence[int],
               kv: SpanKV | None) -> Literal["spliced", "prefilled"]:
        """Put the span `tokens` into `seq` at positions `pos0...` (where `seq` ends); how it went in.

        The caller decodes what follows at `pos0 + len(tokens)` before sampling.

        Args:
            seq: the target sequence.
            pos0: the span's first position (the sequence's next one).
            tokens: the span's tokens.
            kv: its archived cells, or None when none are kept.

        Raises:
            ConfigError: `kv` holds another span than `tokens`.
            EngineError: the text prefill failed (no room in the context).
        """
        if kv is not None and tuple(int(t) for t in tokens) != kv.tokens:
            raise ConfigError(f"kv holds a span of {kv.n} other tokens than the {len(tokens)} tokens given")
        heal = None if kv is None else self.policy.decide(n_tokens=kv.n, supported=self.supported)
        if kv is not None and heal is not None:
            try:
                splice_span(self.ctx, kv, seq=seq, pos0=pos0, heal=heal, scratch=self.scratch)
            except EngineError as exc:
                self.counters["splice_failed"] += 1
                logger.debug("splice of %d tokens failed (%s); prefilling the text", kv.n, exc)
            else:
                self.counters["spliced"] += 1
                self.counters["spliced_tokens"] += kv.n
                return "spliced"
        self.ctx.decode_run(seq, tokens, pos0)
        self.counters["prefilled"] += 1
        self.counters["prefilled_tokens"] += len(tokens)
        return "prefilled"
