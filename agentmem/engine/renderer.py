"""Rendering a conversation for one model: pick its chat format, tokenize, tag every span.

`select_format` chooses the format (`gemma`, `chatml`, or the GGUF's own template
through `jinja_format`); `ChatRenderer` renders messages with it into the prompt value
(`RenderedPrompt`) and tokenizes each segment (markup with control tokens parsed, content
as text), caching segment tokenizations so the same message always yields the same tokens.
It keeps its recent renders (`agentmem.engine.prompt_memo`): a conversation that extends
a kept one is validated, rendered and tokenized from its new messages on, and the same
request rendered again (line lookup, prompt limit, call) is rendered once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from agentmem.engine.builtin_formats import FORMATS, ChatMLFormat, GemmaFormat
from agentmem.engine.chat_format import (
    ChatFormat,
    Message,
    Part,
    RenderedPrompt,
    Span,
    TailRender,
    _with_system_text,
    normalize_messages,
    normalize_tools,
    span_table,
)
from agentmem.engine.jinja_format import JinjaFormat
from agentmem.engine.prompt_memo import Kept, RenderMemo, Sent
from agentmem import validation as check
from agentmem.errors import MessageError, PolicyError
from agentmem.tools.formats import ToolFormat
from agentmem.tools.prompt import tools_prompt

if TYPE_CHECKING:
    from agentmem.engine.template_sandbox import RenderLimits

__all__ = ["ChatRenderer", "select_format"]

logger = logging.getLogger(__name__)


def select_format(
    name: str, template: str | None, *, has_gemma_turns: bool = False, limits: RenderLimits | None = None
) -> ChatFormat:
    """Pick a format by name.

    `auto`: a Gemma-style template, or no template but a vocabulary with a
    `<start_of_turn>` token (the default model's GGUF ships no template) →
    `gemma`; another template → `jinja`; otherwise `chatml`.

    Raises:
        PolicyError: an unknown name, or `jinja` for a model without a template.
        ChatTemplateError: the template does not compile.
    """

    def jinja(template: str) -> ChatFormat:
        return JinjaFormat(template, limits=limits)

    if name == "auto":
        if (template and "<start_of_turn>" in template) or (not template and has_gemma_turns):
            return GemmaFormat()
        if template:
            return jinja(template)
        return ChatMLFormat()
    if name == "jinja":
        if not template:
            raise PolicyError("chat_format='jinja' but the model has no tokenizer.chat_template")
        return jinja(template)
    if name not in FORMATS:
        raise PolicyError(f"unknown chat_format {name!r}; valid: auto, {', '.join(sorted([*FORMATS, 'jinja']))}")
    return FORMATS[name]()


class ChatRenderer:
    """Render + tokenize messages for one model, caching segment tokenizations.

    Args:
        model: a `agentmem.engine.context.LlamaModel` (anything with
            `tokenize_pieces`, `control_strings`, `bos`, `add_bos`, `has_special`
            and `chat_template()`).
        chat_format: `auto`, `gemma`, `chatml` or `jinja`.
        cache_size: segment tokenizations kept (LRU).
        memo_tokens: prompt tokens of recent renders kept to render the next call
            incrementally (`agentmem.engine.prompt_memo.RenderMemo`; 0 = render every
            call whole).
        limits: time and output limits of a jinja template's render
            (`agentmem.engine.template_sandbox.RenderLimits`; defaults when None).

    Raises:
        ChatTemplateError: the model's jinja template does not compile.
        PolicyError: an unknown `chat_format`.
    """

    def __init__(
        self, model: Any, chat_format: str = "auto", *, cache_size: int = 8192, memo_tokens: int = 1 << 20,
        limits: RenderLimits | None = None,
    ) -> None:
        self.model = model
        self.format = select_format(
            chat_format, model.chat_template(), has_gemma_turns=model.has_special("<start_of_turn>"), limits=limits
        )
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._cache_size = cache_size
        self._tool_format: ToolFormat | None = None
        self.memo = RenderMemo(max_tokens=memo_tokens)
        logger.debug("chat format: %s", self.format.name)

    def _cached(self, key: Any, make: Callable[[], Any]) -> Any:
        with self._cache_lock:  # renders run concurrently in callers' threads
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        value = make()
        with self._cache_lock:
            self._cache[key] = value
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return value

    def _tok(self, parts: tuple[Part, ...]) -> tuple[int, ...]:
        """Tokens of a segment: control tokens from its markup only, its content as text."""
        return self._cached(parts, lambda: tuple(self.model.tokenize_pieces(parts)))

    def _controls(self, text: str) -> list[str]:
        """Control-token strings in a message's text (cached: histories repeat)."""
        if not text:
            return []
        return self._cached(("controls", text), lambda: self.model.control_strings(text))

    @property
    def tool_format(self) -> ToolFormat:
        """The syntax the model writes tool calls in under this renderer's format, bound to its vocabulary."""
        if self._tool_format is None:
            fmt = self.format.tool_format
            ids = {}
            for m in fmt.markers:
                toks = self.model.tokenize(m, add_special=False, parse_special=True)
                if len(toks) == 1:
                    ids[m] = toks[0]
            self._tool_format = fmt.with_tokens(ids)
        return self._tool_format

    def render(
        self, messages: Iterable[Mapping[str, Any] | Message], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> RenderedPrompt:
        """Messages → the prompt value: tokens with region spans (raises `MessageError`).

        A conversation that extends one this renderer kept (`memo`) is validated, rendered and
        tokenized from its new messages on (`ChatFormat.render_tail` decides how far back it
        must go, and a jinja template's render is checked against the kept text); the same
        messages and tools rendered again return the same value.

        Args:
            messages: the conversation.
            tools: the callable tools, `{"name", "description", "parameters"}` each (or
                OpenAI's `{"type": "function", "function": {...}}`). A native tool
                format gets them through the template; otherwise agentmem's tools
                block (`agentmem.tools.tools_prompt`) ends the system message.
        """
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
            normalize_messages(messages)  # raises, naming what was passed
        raw = list(messages)
        specs = normalize_tools(tools)
        seed = self._seed(tools)
        sent = Sent(raw) if seed is not None and self.memo.max_tokens else None
        hit = self.memo.longest(seed, sent) if sent is not None and sent.n else None
        n_hit = len(hit.messages) if hit is not None else 0
        if hit is not None and n_hit == len(raw) and not self.format.volatile:
            return hit.prompt
        norm = [*hit.messages, *normalize_messages(raw[n_hit:], offset=n_hit)] if hit else normalize_messages(raw)
        msgs = norm
        if specs and not self.format.tool_format.native:
            msgs = _with_system_text(norm, tools_prompt(specs))
        tail = self.format.render_tail(
            msgs, kept=n_hit + len(msgs) - len(norm) if hit else 0, state=hit.state if hit else None,
            bos="", eos="", controls=self._controls, tools=specs or None,
        )
        prompt, firsts = self._assemble(tail, hit, len(msgs))
        if sent is not None and sent.n == len(raw):
            self.memo.keep(Kept(seed, sent.body, sent.last, tuple(norm), prompt, firsts, tail.state))
            if hit is not None:
                self.memo.discard(hit)  # the conversation went on: its shorter render is done with
        return prompt

    def _seed(self, tools: Any) -> tuple[int, str] | None:
        """What a conversation's keys start from: this format and the tools as sent (None: not keyable)."""
        try:
            return id(self.format), json.dumps(tools, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            return None

    def _assemble(
        self, tail: TailRender, hit: Kept | None, n: int
    ) -> tuple[RenderedPrompt, tuple[tuple[int, int], ...]]:
        """The prompt: the kept tokens and spans before message `tail.start`, then the new segments' tokens.

        The new tokens, spans and message starts are built on their own and joined to the kept
        ones in one copy each (C-level list, tuple and array concatenation: no pass over the history
        in Python).
        """
        off, si, n_kept = 0, 0, 0
        tokens: list[int] = []
        spans: list[Span] = []
        firsts: list[tuple[int, int]] = []
        if tail.start > 0 and hit is not None:
            off, si = hit.firsts[tail.start]
            n_kept = tail.start
        elif self.model.add_bos:
            tokens.append(self.model.bos)
            first = tail.segments[0] if tail.segments else None
            spans.append(Span(0, 1, first.region if first else "system", -1, True))
        for s in tail.segments:
            t = self._tok(s.parts)
            if not t:
                continue
            while n_kept + len(firsts) <= s.message:
                firsts.append((off + len(tokens), si + len(spans)))
            spans.append(Span(off + len(tokens), off + len(tokens) + len(t), s.region, s.message, s.pinned))
            tokens.extend(t)
        while n_kept + len(firsts) < n:
            firsts.append((off + len(tokens), si + len(spans)))
        if not n_kept or hit is None:
            return RenderedPrompt(tokens, spans), tuple(firsts)
        kept = hit.prompt  # its arrays and the new rows: no pass over the history
        ids = np.concatenate((kept.ids[:off], np.asarray(tokens, dtype=np.int32)))
        table = np.concatenate((kept.table[:si], span_table(spans)))
        prompt = RenderedPrompt(None, kept.spans[:si] + spans, ids, table)
        return prompt, hit.firsts[:n_kept] + tuple(firsts)

    def render_text(self, text: str, *, region: str = "text") -> RenderedPrompt:
        """A raw prompt (no template): BOS (if the model wants it) + the text's tokens.

        The text is tokenized as text, like message content: a `<end_of_turn>` in a
        raw completion prompt stays those characters, never the control token. This
        was already so before chat messages were made safe the same way, and there is
        no opt-in to parse control tokens in a raw prompt.
        """
        if not isinstance(text, str):
            raise MessageError(f"prompt must be a string, got {type(text).__name__}")
        check.text(text, field="prompt")
        toks = ([self.model.bos] if self.model.add_bos else []) + list(self.model.tokenize(text, add_special=False, parse_special=False))
        if not toks:
            raise MessageError("prompt is empty")
        return RenderedPrompt(toks, [Span(0, len(toks), region)])
