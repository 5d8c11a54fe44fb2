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
    one CPU thread on a shared 2-core machine at load 2-4; 4 spans per length, each asked
    about one of its facts by paraphrase; TTFT from the live prefix to the answer's first
    logits, median of 2; KL (nats) of that next-token distribution against a full
    re-prefill; "answer": the greedy reply names the fact's answer):

    ====== ============ ======== ======= ======== ======== ======
    tokens way          TTFT ms  vs text KL mean  KL max   answer
    ====== ============ ======== ======= ======== ======== ======
    64     text         1592     1.00x   0        0        0.75
    64     splice h=0   641      2.49x   0.015    0.021    0.50
    64     splice h=4   738      2.16x   0.016    0.030    0.75
    64     splice h=16  888      1.79x   0.012    0.024    0.50
    64     no span      486      3.28x   0.127    0.186    0.00
    256    text         3768     1.00x   0        0        0.75
    256    splice h=0   574      6.57x   0.010    0.015    0.50
    256    splice h=4   761      4.95x   0.009    0.012    0.75
    256    splice h=16  972      3.88x   0.007    0.011    0.75
    1024   text         12184    1.00x   0        0        0.50
    1024   splice h=4   617      19.7x   0.006    0.011    0.25
    1024   splice h=16  745      16.4x   0.004    0.005    0.25
    ====== ============ ======== ======= ======== ======== ======

    Hence the rule: splice a span of 64 to 256 tokens (at 64 the shortest measured, it
    already paid 2.2x; a shorter span is an eviction block or two, whose prefill costs
    little more than loading its blob), healing 4 tokens — there its answers equal the
    re-prefill's, where no healing lost one of four at both lengths. At 1024 tokens the
    splice is 20x faster and its KL the smallest, but it lost one of the two answers the
    re-prefill gave (1 of 4 against 2 of 4): too few to trust, so such spans stay text
    (`max_tokens`) until a larger run says otherwise. The pool heals more:
    `PoolConfig.recall_kv_heal` is 32, because through the pool
    (`benchmarks/recall_kv_pool.py`, 48 questions in four runs) heal 4 lost 3 answers the
    re-prefill gave and heal 32 none, at 1.3x instead of 1.5-1.8x. A context that cannot splice
    (`splice_supported`: a sliding-window model without `swa_full`, or per-sequence
    streams) always prefills.

    Attributes:
        min_tokens: spans shorter than this are prefilled as text.
        max_tokens: spans longer than this are prefilled as text.
        heal: tokens at the span's start recomputed after the new prefix (EPIC's seam repair).
    """

    min_tokens: int = 64
    max_tokens: int = 256
    heal: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or self.min_tokens < 1:
            raise ConfigError(f"min_tokens must be an int >= 1, got {self.min_tokens!r}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) \
                or self.max_tokens < self.min_tokens:
            raise ConfigError(f"max_tokens must be an int >= min_tokens ({self.min_tokens}), got {self.max_tokens!r}")
        if isinstance(self.heal, bool) or not isinstance(self.heal, int) or self.heal < 0:
            raise ConfigError(f"heal must be an int >= 0, got {self.heal!r}")

    def decide(self, *, n_tokens: int, supported: bool) -> int | None:
        """The heal width to splice a span of `n_tokens` with, or None: prefill its text.

        Args:
            n_tokens: the span's length.
            supported: whether the context can splice (`agentmem.engine.splice.splice_supported`).
        """
        if not supported or not self.min_tokens <= n_tokens <= self.max_tokens:
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
