"""Sampling: llama.cpp's sampler chain, stop strings and incremental detokenization.

* `SamplingParams` — the knobs of one generation (typed, validated: a wrong type,
  a NaN or an out-of-range value is a `ConfigError` naming the field).
* `Sampler` — a native `llama_sampler` chain built from them (greedy,
  or penalties → top-k → top-p → min-p → temperature → seeded draw; a GBNF
  grammar first when given, or from a trigger on when the grammar is lazy). Frees itself.
* `TextAssembler` — turns sampled tokens into text safely: UTF-8 split
  across tokens, stop strings (text is held back while it could still be the
  start of a stop string, so streaming never emits a partial stop).
"""

from __future__ import annotations

import codecs
import ctypes
import functools
import logging
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import llama_cpp as _ll
import numpy as np

from agentmem.engine.triggers import TriggerWatch, check_trigger_tokens, check_triggers
from agentmem.errors import ConfigError, EngineError
from agentmem.tools.lazy import LazyGrammar
from agentmem.tools.limits import check_grammar
from agentmem.validation import bounded_int, finite_float, text

__all__ = ["Sampler", "SamplingParams", "TextAssembler"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to pick tokens.

    Attributes:
        max_tokens: tokens to generate at most.
        temperature: `0` means greedy (deterministic).
        top_k: keep the k most likely tokens (`0` = off).
        top_p: nucleus sampling mass (`1.0` = off).
        min_p: drop tokens below `min_p` × the top probability (`0` = off).
        repeat_penalty: penalty for tokens among the last `repeat_last_n` (`1.0` = off).
        repeat_last_n: window for `repeat_penalty`.
        seed: seed of the random draw (ignored when greedy).
        stop: strings that end the generation; they are not included in the text.
        grammar: a GBNF grammar (root rule `root`) constraining the output; checked against
            `agentmem.tools.limits` (size, nesting, repetition counts, rule chains) before
            llama.cpp's recursive parser sees it (`GrammarLimitError`, a `ConfigError`, names `grammar`).
        grammar_triggers: regular expressions (Python `re`) that make `grammar` *lazy*: the
            reply is free until one matches the text generated so far, and the grammar
            constrains it from the pattern's first non-empty group on (the whole match when it
            has none). `^…$` matches the whole text, anything else is searched, as llama.cpp's
            lazy grammars do (`agentmem.engine.triggers`). At most 16 patterns of 512
            characters, no nested quantifiers (`GrammarLimitError` names `grammar_triggers[i]`).
        grammar_trigger_tokens: token ids that make `grammar` lazy the same way: the grammar
            starts with the token. Both empty: the grammar constrains from the first token.

    `make(grammar=LazyGrammar)` (`agentmem.tools.lazy`) fills the three grammar fields.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = 0
    stop: tuple[str, ...] = field(default_factory=tuple)
    grammar: str | None = None
    grammar_triggers: tuple[str, ...] = field(default_factory=tuple)
    grammar_trigger_tokens: tuple[int, ...] = field(default_factory=tuple)

    @property
    def lazy(self) -> bool:
        """Whether the grammar waits for a trigger."""
        return bool(self.grammar_triggers or self.grammar_trigger_tokens)

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: store the normalised values
        set_(self, "max_tokens", bounded_int(self.max_tokens, field="max_tokens", lo=0))
        set_(self, "temperature", finite_float(self.temperature, field="temperature", lo=0.0))
        set_(self, "top_k", bounded_int(self.top_k, field="top_k", lo=0, hi=2**31 - 1))
        set_(self, "top_p", finite_float(self.top_p, field="top_p", lo=0.0, lo_open=True, hi=1.0))
        min_p = finite_float(self.min_p, field="min_p", lo=0.0)
        if min_p >= 1.0:
            raise ConfigError(f"min_p must be in [0, 1), got {self.min_p!r}")
        set_(self, "min_p", min_p)
        set_(self, "repeat_penalty", finite_float(self.repeat_penalty, field="repeat_penalty", lo=0.0, lo_open=True))
        set_(self, "repeat_last_n", bounded_int(self.repeat_last_n, field="repeat_last_n", lo=-1, hi=2**31 - 1))
        set_(self, "seed", bounded_int(self.seed, field="seed", lo=0, hi=2**32 - 1))
        if self.grammar is not None and not isinstance(self.grammar, str):
            raise ConfigError(f"grammar must be a GBNF string or None (a LazyGrammar through SamplingParams.make), "
                              f"got {type(self.grammar).__name__}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"stop must be non-empty strings, got {self.stop!r}")
        for j, s in enumerate(self.stop):
            text(s, field=f"stop[{j}]", error=ConfigError)
        if self.grammar is not None:
            text(self.grammar, field="grammar", error=ConfigError)
            if self.grammar:
                _checked_grammar(self.grammar)  # after the text check: the limits read it as text
        set_(self, "grammar_triggers", check_triggers(self.grammar_triggers, field="grammar_triggers"))
        set_(self, "grammar_trigger_tokens",
             check_trigger_tokens(self.grammar_trigger_tokens, field="grammar_trigger_tokens"))
        if self.lazy and not self.grammar:
            raise ConfigError("grammar_triggers / grammar_trigger_tokens need a grammar (grammar is empty)")

    @classmethod
    def make(cls, *, stop: str | Sequence[str] | None = None, **kw: object) -> SamplingParams:
        """Build from loose arguments (`stop` may be a string, a list of strings or None; `grammar`
        may be a `LazyGrammar`, which fills `grammar_triggers` and `grammar_trigger_tokens` too)."""
        lazy = kw.get("grammar")
        if isinstance(lazy, LazyGrammar):
            if kw.get("grammar_triggers") or kw.get("grammar_trigger_tokens"):
                raise ConfigError("grammar is a LazyGrammar: it carries its own triggers (drop grammar_triggers)")
            kw = {**kw, "grammar": lazy.grammar, "grammar_triggers": lazy.patterns,
                  "grammar_trigger_tokens": lazy.trigger_tokens}
        if stop is None:
            stops: tuple[str, ...] = ()
        elif isinstance(stop, str):
            stops = (stop,)
        elif isinstance(stop, (bytes, bytearray)) or not isinstance(stop, Iterable):
            raise ConfigError(f"stop must be a string or a list of strings, got {stop!r}")
        else:
            stops = tuple(stop)
        return cls(stop=stops, **{k: v for k, v in kw.items() if v is not None})  # type: ignore[arg-type]


@functools.lru_cache(maxsize=64)
def _checked_grammar(grammar: str) -> None:
    """`check_grammar`, once per grammar text (forced grammars repeat call after call)."""
    check_grammar(grammar, field="grammar")


class Sampler:
    """A native sampler chain for one generation (frees itself).

    With a grammar, sampling is *lazy* like llama.cpp's own common sampler: the
    chain picks a token without the grammar, the grammar checks only that one
    token, and only when it is rejected does the grammar filter the whole
    vocabulary (262k tokens on Gemma 3) before the chain picks again. The result
    is the same token the eager order would pick for greedy decoding, at a
    fraction of the cost.

    A *lazy* grammar (`SamplingParams.lazy`) is not consulted at all until a trigger
    fires (`agentmem.engine.triggers`): tokens are sampled as without a grammar. When a
    sampled token makes a trigger fire, the grammar is fed the text from the trigger's
    start (tokenized, each token checked before it is accepted) and constrains every
    later token as above. If the grammar rejects that text (a call to a tool that is not
    offered, other spacing), the trigger *misfires*: the reply goes on free, with no
    further triggers (`misfired`), and nothing reaches llama.cpp that it would throw on.

    Attributes:
        triggered: whether the grammar constrains the reply (always, for a grammar that
            is not lazy; from the trigger on, for a lazy one; never without a grammar).
        trigger_offset: for a lazy grammar that fired, where its input starts in the
            reply's text (`trigger_text`); `None` otherwise.
        misfired: a lazy grammar's trigger fired on text the grammar rejects.
        full_grammar_passes: how often the grammar had to filter the whole vocabulary.
    """

    _DT = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)
    _TOP = 512  # candidates tried against the grammar before the whole vocabulary

    def __init__(self, vocab: int, n_vocab: int, params: SamplingParams) -> None:
        self._ptr = None
        self._grammar = None
        self._vocab = vocab
        self._watch: TriggerWatch | None = None
        self.full_grammar_passes = 0
        self.triggered = bool(params.grammar)
        self.trigger_offset: int | None = None
        self.misfired = False
        sp = _ll.llama_sampler_chain_default_params()
        sp.no_perf = True
        chain = _ll.llama_sampler_chain_init(sp)
        if not chain:
            raise EngineError("llama_sampler_chain_init failed")
        self._ptr = chain
        add = lambda s: _ll.llama_sampler_chain_add(chain, s)  # noqa: E731
        if params.grammar:
            g = _ll.llama_sampler_init_grammar(vocab, params.grammar.encode(), b"root")
            if not g:
                self.close()
                raise ConfigError("invalid GBNF grammar (llama_sampler_init_grammar returned NULL)")
            self._grammar = g
            self._n_vocab = n_vocab
            if params.lazy:
                self._lazy_init(params, n_vocab)
            self._ids = np.arange(n_vocab, dtype=np.intc)
            self._buf = np.zeros(n_vocab, dtype=self._DT)
            self._one = np.zeros(1, dtype=self._DT)
            self._arr = _ll.llama_token_data_array(
                data=self._buf.ctypes.data_as(_ll.llama_token_data_p), size=n_vocab, selected=-1, sorted=False
            )
            self._arr1 = _ll.llama_token_data_array(
                data=self._one.ctypes.data_as(_ll.llama_token_data_p), size=1, selected=-1, sorted=False
            )
        if params.repeat_penalty != 1.0:
            add(_ll.llama_sampler_init_penalties(n_vocab, params.repeat_last_n, params.repeat_penalty, 0.0, 0.0))
        if params.temperature == 0.0:
            add(_ll.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(_ll.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                add(_ll.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                add(_ll.llama_sampler_init_min_p(params.min_p, 1))
            add(_ll.llama_sampler_init_temp(params.temperature))
            add(_ll.llama_sampler_init_dist(params.seed & 0xFFFFFFFF))

    def _lazy_init(self, params: SamplingParams, n_vocab: int) -> None:
        bad = [(j, t) for j, t in enumerate(params.grammar_trigger_tokens) if t >= n_vocab]
        if bad:
            self.close()
            j, t = bad[0]
            raise ConfigError(f"grammar_trigger_tokens[{j}] is {t}, not a token of this model (it has {n_vocab})")
        self._watch = TriggerWatch(params.grammar_triggers, params.grammar_trigger_tokens)
        self.triggered = False

    @property
    def trigger_text(self) -> str:
        """The reply's text as the lazy grammar's triggers saw it (`""` without a lazy grammar)."""
        return self._watch.text if self._watch is not None else ""

    def _piece(self, tok: int) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = _ll.llama_token_to_piece(self._vocab, tok, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = _ll.llama_token_to_piece(self._vocab, tok, buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)]

    def _tokens(self, text: str) -> list[int]:
        data = text.encode("utf-8", "replace")
        buf = (_ll.llama_token * (len(data) + 8))()
        n = _ll.llama_tokenize(self._vocab, data, len(data), buf, len(buf), False, True)
        if n < 0:
            raise EngineError(f"llama_tokenize returned {n} for a trigger's text of {len(data)} bytes")
        return list(buf[:n])

    def _allows(self, tok: int) -> bool:
        """Whether the grammar, in its current state, accepts `tok` next (one token checked)."""
        self._one["id"] = tok
        self._one["logit"] = 1.0
        self._arr1.size = 1
        self._arr1.selected = -1
        _ll.llama_sampler_apply(self._grammar, ctypes.byref(self._arr1))
        return bool(np.isfinite(self._one["logit"][0]))

    def _fire(self, start: int) -> None:
        """Feed the grammar the reply's text from `start`; it constrains from now on, or it misfired."""
        assert self._watch is not None
        for tok in self._tokens(self._watch.text[start:]):
            if not self._allows(tok):
                self.misfired = True
                self._watch = None
                logger.debug("lazy grammar misfired at %d: %r", start, self.trigger_text[start:][:80])
                return
            _ll.llama_sampler_accept(self._grammar, tok)
        self.triggered = True
        self.trigger_offset = start

    def _observe(self, tok: int) -> None:
        """A token sampled freely under a lazy grammar: see whether it fires a trigger."""
        assert self._watch is not None
        if _ll.llama_vocab_is_eog(self._vocab, tok):
            return
        start = self._watch.observe(tok, self._piece(tok))
        if start is not None:
            self._fire(start)

    def _fill(self, ctx_ptr: int, idx: int) -> None:
        logits = _ll.llama_get_logits_ith(ctx_ptr, idx)
        if not logits:
            raise EngineError(f"llama_get_logits_ith({idx}) returned NULL")
        self._buf["id"] = self._ids  # samplers reorder / shrink the array in place
        self._buf["logit"] = np.ctypeslib.as_array(logits, shape=(self._n_vocab,))
        self._buf["p"] = 0.0
        self._arr.size = self._n_vocab
        self._arr.selected = -1
        self._arr.sorted = False

    def _pick(self) -> int:
        _ll.llama_sampler_apply(self._ptr, ctypes.byref(self._arr))
        if self._arr.selected < 0:
            raise EngineError("the sampler chain selected no token")
        return int(self._buf["id"][self._arr.selected])

    def _constrained_pick(self, ctx_ptr: int, idx: int) -> int:
        """The chain's pick among grammar-valid tokens.

        First among the `_TOP` most likely tokens (if any is valid, the most
        likely valid token of the whole vocabulary is among them, so a greedy
        pick is exact); only when none is valid, over the whole vocabulary.
        """
        logits = np.ctypeslib.as_array(_ll.llama_get_logits_ith(ctx_ptr, idx), shape=(self._n_vocab,))
        top = np.argpartition(logits, -self._TOP)[-self._TOP :]
        k = top.size
        self._buf["id"][:k] = top
        self._buf["logit"][:k] = logits[top]
        self._buf["p"][:k] = 0.0
        self._arr.size = k
        self._arr.selected = -1
        self._arr.sorted = False
        _ll.llama_sampler_apply(self._grammar, ctypes.byref(self._arr))
        if np.isfinite(self._buf["logit"][: self._arr.size]).any():
            return self._pick()
        self.full_grammar_passes += 1
        self._fill(ctx_ptr, idx)
        _ll.llama_sampler_apply(self._grammar, ctypes.byref(self._arr))
        return self._pick()

    def sample(self, ctx_ptr: int, idx: int) -> int:
        """Sample (and accept) the next token from the logits at batch index `idx`."""
        if self._grammar is None or not self.triggered:
            tok = _ll.llama_sampler_sample(self._ptr, ctx_ptr, idx)
            if self._watch is not None:  # a lazy grammar, not yet triggered
                self._observe(tok)
            return tok
        self._fill(ctx_ptr, idx)
        tok = self._pick()
        if not self._allows(tok):
            tok = self._constrained_pick(ctx_ptr, idx)
        _ll.llama_sampler_accept(self._grammar, tok)
        _ll.llama_sampler_accept(self._ptr, tok)
        return tok

    def close(self) -> None:
        if self._grammar:
            _ll.llama_sampler_free(self._grammar)
            self._grammar = None
        if self._ptr:
            _ll.llama_sampler_free(self._ptr)
            self._ptr = None

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class TextAssembler:
    """Accumulate token bytes into text, honouring stop strings.

    `push(piece)` returns the text that is safe to emit now; `stopped` is set
    when a stop string appeared (the text before it is the final text).
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")("replace")
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""  # everything decoded so far (before any stop)
        self._emitted = 0
        self.stopped = False

    def push(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        self.text += self._dec.decode(piece)
        if self._stop:
            # search only the region a new stop string could start in
            start = max(0, self._emitted - self._hold)
            cut = -1
            for s in self._stop:
                j = self.text.find(s, start)
                if j != -1 and (cut == -1 or j < cut):
                    cut = j
            if cut != -1:
                self.text = self.text[:cut]
                self.stopped = True
                out = self.text[self._emitted :]
                self._emitted = len(self.text)
                return out
            safe = len(self.text) - self._hold
        else:
            safe = len(self.text)
        if safe > self._emitted:
            out = self.text[self._emitted : safe]
            self._emitted = safe
            return out
        return ""

    def flush(self) -> str:
        """Emit what was held back (call at the end of generation)."""
        if not self.stopped:
            self.text += self._dec.decode(b"", final=True)
        out = self.text[self._emitted :]
        self._emitted = len(self.text)
        return out

