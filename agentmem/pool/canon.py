"""The first tokens of a free tool-call reply, rewritten in the KV as the template writes the call back.

`CallCanon.lead` runs the start of a reply's generation when the call offered tools
freely (`agentmem.tools.canonical.BareCallWatch`). While the watch cannot tell whether the
reply opens as a bare call object, the generated tokens are decoded as usual but their
text is held back. Then:

* **a bare call** — the held tokens are cut from the agent's sequence and decoded again
  after the tool format's opening (`<tool_call>\\n` for Qwen2.5), so the KV holds the call
  exactly as the next prompt renders it (a call the client sends back reuses the KV of the
  whole call); the reply's text gains the opening, and the parsers read it as the call
  they read before;
* **anything else** (or the end of the reply, `max_tokens`, a stop string in the opening,
  a sliding window that cannot be cut back) — the held tokens go on as the model wrote
  them.

Either way the turn's ordinary loop takes over: no per-token work is added after the
first few tokens. When such a reply ends (end of turn) as calls that do not close the way
the template writes them back (a small model often stops before `\\n</tool_call>`),
`CallCanon.close` cuts the KV back to where the two differ and decodes the template's
rest, and the text gains that rest: the KV then holds the whole call as the next prompt
renders it, and the integrations need no write-back call.

A **forced** call (`MemoryPool.chat`'s `opening`: the forced start of the reply that the
integrations and the server get from `ToolFormat.forced`) gets the same treatment by
construction: `CallCanon.opening` appends the opening to the prompt as the template renders
a call (its markers as markup, the rest as text; an assistant message's content would
be text only), and at end of turn `CallCanon.close_forced` compares the KV of opening +
reply with the template's tokens of the call and decodes again from where they differ
(a token the model split otherwise, a missing closing). The reply's text stays what
was generated (without the opening), plus any closing added.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generator, Iterator, Sequence

import numpy as np

from agentmem.engine.chat_format import RenderedPrompt, Span

from agentmem.engine.sampling import Sampler, SamplingParams, TextAssembler
from agentmem.errors import ConfigError
from agentmem.pool.decoder import Decoder
from agentmem.pool.state import AgentState, PoolCore
from agentmem.tools.canonical import BareCallWatch
from agentmem.tools.formats import ToolFormat

if TYPE_CHECKING:
    from agentmem.pool.results import Timings

__all__ = ["CallCanon", "Opening"]

logger = logging.getLogger(__name__)

Lead = tuple[int | None, str | None]
"""What `CallCanon.lead` hands back: `(next token, None)` to go on, or `(None, finish reason)`."""


@dataclass(frozen=True, slots=True)
class Opening:
    """A forced call's opening in the prompt: its text, its tokens (the prompt's last), the format."""

    text: str
    tokens: tuple[int, ...]
    fmt: ToolFormat


class CallCanon:
    """Rewrites a free call's opening into the KV (see the module docstring); one per pool."""

    def __init__(self, core: PoolCore, decoder: Decoder) -> None:
        self.core = core
        self.decoder = decoder
        self._openings: dict[str, tuple[int, ...]] = {}

    def _opening_tokens(self, watch: BareCallWatch) -> tuple[int, ...]:
        """The tokens of a format's opening, as the template renders it (cached)."""
        toks = self._openings.get(watch.opening)
        if toks is None:
            toks = self._openings[watch.opening] = tuple(self._call_tokens(watch.opening, watch.markers))
        return toks

    def _call_tokens(self, text: str, markers: Sequence[str]) -> list[int]:
        """Tokens of a call's text as a template renders it: the format's markers as markup
        (control tokens where the vocabulary has them), the rest as text (never control tokens)."""
        pieces: list[tuple[str, bool]] = []
        pos = 0
        for m in re.finditer("|".join(re.escape(x) for x in sorted(markers, key=len, reverse=True)) or "(?!)", text):
            pieces += [(text[pos:m.start()], False), (m.group(), True)]
            pos = m.end()
        pieces.append((text[pos:], False))
        return self.core.model.tokenize_pieces([p for p in pieces if p[0]])

    def _room(self, a: AgentState, n: int) -> bool:
        """Whether `a` may decode `n` more tokens without reaching its capacity (no budget to trim to)."""
        return bool(self.core.budget(a)) or a.ledger.n_live + n < self.core.capacity

    def lead(
        self, a: AgentState, tok: int, sampler: Sampler, params: SamplingParams, asm: TextAssembler,
        completion: list[int], watch: BareCallWatch, t: Timings,
    ) -> Generator[str, None, Lead]:
        """Generate until `watch` decides; yields text pieces, returns a `Lead`.

        On `(tok, None)` the caller's loop goes on with `tok` (sampled, not yet decoded or
        counted), exactly as after prefill; on `(None, finish)` the reply is over.
        """
        model = self.core.model
        n0 = len(a.ledger)  # the reply starts here
        held: list[int] = []
        raw = b""
        while True:
            if model.is_eog(tok):
                yield from self._release(held, asm, completion)
                return None, "stop"
            held.append(tok)
            raw += model.token_bytes(tok)
            verdict = watch.decide(raw.decode("utf-8", "ignore"))
            if verdict is None and len(held) < params.max_tokens and self._room(a, 1):
                tok = self.decoder.step(a, tok, sampler, t)
                continue
            if verdict:
                rewritten = self._rewrite(a, n0, held, raw, watch, sampler, params, t)
                if rewritten is not None:
                    toks, nxt = rewritten
                    completion.extend(toks)
                    piece = asm.push(b"".join(model.token_bytes(x) for x in toks))
                    if piece:
                        yield piece
                    if asm.stopped:
                        return None, "stop"
                    return nxt, None
            last = held.pop()  # not decoded yet: the caller's loop takes it
            yield from self._release(held, asm, completion)
            return (None, "stop") if asm.stopped else (last, None)

    def _release(self, held: Sequence[int], asm: TextAssembler, completion: list[int]) -> Iterator[str]:
        """The held tokens as the model wrote them: counted, and their text pushed (stops honoured)."""
        model = self.core.model
        for x in held:
            completion.append(x)
            piece = asm.push(model.token_bytes(x))
            if piece:
                yield piece
            if asm.stopped:
                return

    def _tail(self, held: Sequence[int], raw: bytes) -> list[int]:
        """The held tokens without the whitespace before the call object (re-tokenized if a token mixes both)."""
        model = self.core.model
        i = 0
        while i < len(held) and not model.token_bytes(held[i]).strip():
            i += 1
        rest = list(held[i:])
        if rest and model.token_bytes(rest[0])[:1].isspace():
            return list(model.tokenize(raw.decode("utf-8", "replace").lstrip(), parse_special=False))
        return rest

    def _rewrite(
        self, a: AgentState, n0: int, held: Sequence[int], raw: bytes, watch: BareCallWatch,
        sampler: Sampler, params: SamplingParams, t: Timings,
    ) -> tuple[list[int], int] | None:
        """Cut the held tokens from `a`'s KV, decode the opening + them; `(tokens, next token)`, or None.

        None leaves everything as it was: the opening would not fit `max_tokens` or the
        capacity, a stop string would match in it, or a sliding window cannot be cut back.
        """
        core = self.core
        opening = watch.opening
        toks = [*self._opening_tokens(watch), *self._tail(held, raw)]
        text = opening + raw.decode("utf-8", "replace").lstrip()
        if len(toks) >= params.max_tokens or any(s in text for s in params.stop):
            return None
        with core.lock:
            assert a.kv is not None, f"{a.id=}"
            live0 = a.ledger.live_before(n0)
            if not self._room(a, len(toks) - (a.ledger.n_live - live0) + 1) or not a.kv.can_cut(n0):
                return None
            a.kv.cut(n0)
            nxt = self.decoder.prefill(a, toks, None, sampler, t)
        assert nxt is not None
        core.totals["canonical_calls"] += 1
        core.totals["canonical_tokens"] += len(toks)
        logger.debug("agent %r: free call rewritten with its opening %r (%d tokens)", a.id, opening, len(toks))
        return toks, nxt

    def close(
        self, a: AgentState, asm: TextAssembler, completion: list[int], watch: BareCallWatch,
        params: SamplingParams, t: Timings,
    ) -> str:
        """Complete a finished call reply in the KV to the template's text; returns the text added.

        Runs once, where a reply ends on end of turn (every token of `completion` is in the
        KV). Nothing is done (returns `""`) unless the reply is calls to the offered tools
        whose template text (`BareCallWatch.written_back`) continues the reply's text.
        """
        want_text = watch.written_back(asm.text)
        if want_text is None or want_text == asm.text:
            return ""
        return self._complete(a, asm, completion, (), asm.text, want_text, watch.markers, params, t)

    def opening(
        self, prompt: RenderedPrompt, text: str | None, fmt: ToolFormat
    ) -> tuple[RenderedPrompt, Opening | None]:
        """`prompt` (with its generation prompt) + a forced call's opening tokenized as the template renders it.

        `text=None` (no forced call) returns `(prompt, None)`.

        Raises:
            ConfigError: `text` is not a non-empty string (`opening`).
        """
        if text is None:
            return prompt, None
        if not isinstance(text, str) or not text:
            raise ConfigError(f"opening must be a non-empty string or None, got {text!r:.40}")
        toks = tuple(self._call_tokens(text, fmt.markers))
        n = len(prompt)
        spans = [*prompt.spans, Span(n, n + len(toks), "tool_call")]
        ids = np.concatenate((prompt.ids, np.asarray(toks, dtype=np.int32)))
        return RenderedPrompt(None, spans, ids), Opening(text, toks, fmt)

    def close_forced(
        self, a: AgentState, asm: TextAssembler, completion: list[int], op: Opening, params: SamplingParams,
        t: Timings,
    ) -> str:
        """Make the KV of a forced call (`op` + reply) the template's tokens of it; returns the text added.

        Runs once, where the reply ends on end of turn. Nothing is done (returns `""`)
        unless opening + reply parse as calls whose template text continues them, or when
        the KV already holds those tokens.
        """
        have = op.text + asm.text
        calls = op.fmt.parse(have)
        if not calls or any(not c.ok for c in calls):
            return ""
        want_text = op.fmt.render_call([(c.name, c.arguments) for c in calls])  # type: ignore[misc]
        return self._complete(a, asm, completion, op.tokens, have, want_text, op.fmt.markers, params, t)

    def _complete(
        self, a: AgentState, asm: TextAssembler, completion: list[int], lead: Sequence[int], have: str,
        want_text: str, markers: Sequence[str], params: SamplingParams, t: Timings,
    ) -> str:
        """Cut the KV of `lead` + `completion` (text `have`) where it leaves the tokens of
        `want_text` and decode the rest of those; returns the text added (`""`: nothing done)."""
        if not want_text.startswith(have) or any(s in want_text for s in params.stop):
            return ""
        want = self._call_tokens(want_text, markers)
        kv = [*lead, *completion]
        p = 0
        n = min(len(kv), len(want))
        while p < n and kv[p] == want[p]:
            p += 1
        if p == len(kv) == len(want):
            return ""
        if p < len(lead):  # the opening itself tokenizes otherwise in the whole call: left as it is
            logger.debug("agent %r: call opening tokenizes otherwise in the whole call; KV left as it is", a.id)
            return ""
        q = p - len(lead)  # where the reply's tokens leave the template's
        core = self.core
        with core.lock:
            assert a.kv is not None, f"{a.id=}"
            cut = len(a.ledger) - (len(completion) - q)
            keep_live = a.ledger.live_before(cut)
            if not self._room(a, len(want) - p - (a.ledger.n_live - keep_live)) or not a.kv.can_cut(cut):
                return ""
            a.kv.cut(cut)
            self.decoder.prefill(a, want[p:], None, None, t)
        completion[q:] = want[p:]
        core.totals["closed_calls"] += 1
        core.totals["canonical_tokens"] += len(want) - p
        logger.debug("agent %r: call completed to the template's text (%d tokens redone)", a.id, len(want) - p)
        rest = want_text[len(have):]
        return asm.push(rest.encode("utf-8")) if rest else ""
