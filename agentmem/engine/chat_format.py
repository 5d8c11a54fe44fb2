"""Chat messages → tokens, with a region tag on every token span.

A prompt is rendered as a list of :class:`Segment` (text + region + source
message), then each segment is tokenized on its own (results cached), so the
same message always yields the same tokens — which is what prefix reuse across
turns relies on — and every token knows where it came from.

Formats (strategy objects in :data:`FORMATS`):

* ``gemma``  — Gemma's turn format (``<start_of_turn>user``/``model``); renders the
  same text as Gemma 3's own template for the conversations that template
  accepts, and also handles what it rejects (consecutive same-role turns, tool
  calls, tool results).
* ``chatml`` — ``<|im_start|>role … <|im_end|>`` with a native ``tool`` role.
* ``jinja``  — the GGUF's own ``tokenizer.chat_template`` through jinja2.
* ``auto``   — Gemma-style templates → ``gemma``; another template → ``jinja``;
  none → ``chatml``.

Regions: ``system``, ``user``, ``assistant``, ``tool_call``, ``tool_result``
(``text`` for raw completions). A final ``assistant`` message is *continued*
(not closed), so an application can start the model's reply.
"""

from __future__ import annotations

import abc
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from agentmem.errors import MessageError, PolicyError

__all__ = [
    "FORMATS",
    "REGIONS",
    "ChatFormat",
    "ChatRenderer",
    "Message",
    "RenderedPrompt",
    "Segment",
    "Span",
    "ToolCall",
    "normalize_messages",
]

logger = logging.getLogger(__name__)

REGIONS: tuple[str, ...] = ("system", "user", "assistant", "tool_call", "tool_result", "text")
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
_MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "pin"}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool invocation made by the assistant."""

    id: str
    name: str
    arguments: Any  # a dict (parsed) or a JSON string

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False, separators=(", ", ": "))


@dataclass(frozen=True, slots=True)
class Message:
    """A validated chat message."""

    role: str
    content: str
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    pin: bool = False


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of rendered prompt text with its region and source message."""

    text: str
    region: str
    message: int  # index into the messages, -1 for template glue
    pinned: bool = False


@dataclass(frozen=True, slots=True)
class Span:
    """Tokens ``[start, end)`` of a prompt carry ``region`` (from message ``message``)."""

    start: int
    end: int
    region: str
    message: int = -1
    pinned: bool = False


@dataclass(slots=True)
class RenderedPrompt:
    """Tokens of a prompt and the region spans covering them, in order."""

    tokens: list[int]
    spans: list[Span] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)


# --------------------------------------------------------------------------- validation
def _content_text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI/LangChain content parts
        out = []
        for j, part in enumerate(value):
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                out.append(part["text"])
            else:
                raise MessageError(f"{where}.content[{j}]: only text parts are supported, got {part!r:.80}")
        return "".join(out)
    raise MessageError(f"{where}.content must be a string or a list of text parts, got {type(value).__name__}")


def _tool_call(raw: Any, where: str) -> ToolCall:
    if not isinstance(raw, Mapping):
        raise MessageError(f"{where} must be a dict, got {type(raw).__name__}")
    fn = raw.get("function") if isinstance(raw.get("function"), Mapping) else raw
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise MessageError(f"{where}.name must be a non-empty string, got {name!r}")
    args = fn.get("arguments", fn.get("args", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # keep the raw string; it is rendered verbatim
    elif not isinstance(args, Mapping):
        raise MessageError(f"{where}.arguments must be a dict or a JSON string, got {type(args).__name__}")
    call_id = raw.get("id") or ""
    if not isinstance(call_id, str):
        raise MessageError(f"{where}.id must be a string, got {type(call_id).__name__}")
    return ToolCall(id=call_id, name=name, arguments=dict(args) if isinstance(args, Mapping) else args)


def normalize_messages(messages: Iterable[Mapping[str, Any] | Message]) -> list[Message]:
    """Validate chat messages; errors name the offending message and field.

    >>> normalize_messages([{"role": "user", "content": "hi"}])
    [Message(role='user', content='hi', name=None, tool_calls=(), tool_call_id=None, pin=False)]
    >>> normalize_messages([{"role": "robot", "content": "hi"}])
    Traceback (most recent call last):
    ...
    agentmem.errors.MessageError: messages[0].role: 'robot' is not one of system, user, assistant, tool
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise MessageError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out: list[Message] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, Message):
            out.append(m)
            continue
        if not isinstance(m, Mapping):
            raise MessageError(f"{where} must be a dict with 'role' and 'content', got {type(m).__name__}")
        extra = set(m) - _MESSAGE_KEYS
        if extra:
            raise MessageError(f"{where}: unknown field(s) {sorted(extra)}; allowed: {sorted(_MESSAGE_KEYS)}")
        role = m.get("role")
        if role not in ROLES:
            raise MessageError(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
        raw_calls = m.get("tool_calls") or []
        if raw_calls and role != "assistant":
            raise MessageError(f"{where}.tool_calls is only allowed on assistant messages (role is {role!r})")
        if not isinstance(raw_calls, (list, tuple)):
            raise MessageError(f"{where}.tool_calls must be a list, got {type(raw_calls).__name__}")
        if "content" not in m and not raw_calls:
            raise MessageError(f"{where}: missing field 'content'")
        content = _content_text(m.get("content"), where)
        if m.get("content") is None and not raw_calls:
            raise MessageError(f"{where}.content is None (only allowed with tool_calls)")
        calls = tuple(_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(raw_calls))
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise MessageError(f"{where}.name must be a string, got {type(name).__name__}")
        tcid = m.get("tool_call_id")
        if role == "tool" and not isinstance(tcid, str):
            raise MessageError(f"{where}.tool_call_id is required for role 'tool' (a string), got {tcid!r}")
        pin = m.get("pin", False)
        if not isinstance(pin, bool):
            raise MessageError(f"{where}.pin must be a bool, got {type(pin).__name__}")
        out.append(Message(role=role, content=content, name=name, tool_calls=calls, tool_call_id=tcid, pin=pin))
    if not out:
        raise MessageError("messages is empty")
    return out


def tool_calls_text(calls: Sequence[ToolCall]) -> str:
    """How past tool calls are written into the prompt (the same JSON the model emits)."""
    body = ", ".join(f'{{"name": {json.dumps(c.name)}, "arguments": {c.arguments_json()}}}' for c in calls)
    return '{"tool_calls": [' + body + "]}"


# --------------------------------------------------------------------------- formats
class ChatFormat(abc.ABC):
    """Strategy: render validated messages to segments."""

    name = "base"

    @abc.abstractmethod
    def render(self, messages: Sequence[Message], *, bos: str, eos: str) -> list[Segment]:
        """Messages → segments (text, region, source message) in prompt order."""


def _continue_last(messages: Sequence[Message]) -> bool:
    return messages[-1].role == "assistant" and not messages[-1].tool_calls


class GemmaFormat(ChatFormat):
    """Gemma turns; system text joins the first user turn like Gemma 3's template."""

    name = "gemma"

    def render(self, messages: Sequence[Message], *, bos: str, eos: str) -> list[Segment]:
        segs: list[Segment] = [Segment(bos, "system" if messages[0].role == "system" else "user", -1)] if bos else []
        cont = _continue_last(messages)
        n = len(messages)
        i = 0
        merged_first_user = False
        if messages[0].role == "system":
            sysm = messages[0]
            if n > 1 and messages[1].role == "user":  # Gemma 3: system text opens the first user turn
                segs.append(Segment(f"<start_of_turn>user\n{sysm.content}\n\n", "system", 0, sysm.pin))
                merged_first_user = True
            else:
                segs.append(Segment(f"<start_of_turn>user\n{sysm.content}<end_of_turn>\n", "system", 0, sysm.pin))
            i = 1
        for k in range(i, n):
            m = messages[k]
            last = k == n - 1
            if m.role == "user":
                who = f"{m.name}: " if m.name else ""
                head = "" if (merged_first_user and k == 1) else "<start_of_turn>user\n"
                segs.append(Segment(f"{head}{who}{m.content.strip()}<end_of_turn>\n", "user", k, m.pin))
            elif m.role == "system":
                segs.append(Segment(f"<start_of_turn>user\n{m.content}<end_of_turn>\n", "system", k, m.pin))
            elif m.role == "tool":
                label = m.name or m.tool_call_id
                segs.append(
                    Segment(f"<start_of_turn>user\nTool result ({label}):\n{m.content}<end_of_turn>\n", "tool_result", k, m.pin)
                )
            else:  # assistant
                if last and cont:
                    segs.append(Segment(f"<start_of_turn>model\n{m.content.lstrip()}", "assistant", k, m.pin))
                    continue
                text = m.content.strip()
                if m.tool_calls:
                    segs.append(Segment(f"<start_of_turn>model\n{text + chr(10) if text else ''}", "assistant", k, m.pin))
                    segs.append(Segment(tool_calls_text(m.tool_calls) + "<end_of_turn>\n", "tool_call", k, m.pin))
                else:
                    segs.append(Segment(f"<start_of_turn>model\n{text}<end_of_turn>\n", "assistant", k, m.pin))
        if not cont:
            segs.append(Segment("<start_of_turn>model\n", "assistant", -1))
        return segs


class ChatMLFormat(ChatFormat):
    """``<|im_start|>role\\n…<|im_end|>`` turns (Qwen, many fine-tunes)."""

    name = "chatml"

    def render(self, messages: Sequence[Message], *, bos: str, eos: str) -> list[Segment]:
        segs: list[Segment] = [Segment(bos, messages[0].role if messages[0].role == "system" else "user", -1)] if bos else []
        cont = _continue_last(messages)
        n = len(messages)
        for k, m in enumerate(messages):
            if m.role == "assistant" and k == n - 1 and cont:
                segs.append(Segment(f"<|im_start|>assistant\n{m.content}", "assistant", k, m.pin))
                continue
            if m.role == "assistant" and m.tool_calls:
                text = m.content + "\n" if m.content else ""
                segs.append(Segment(f"<|im_start|>assistant\n{text}", "assistant", k, m.pin))
                segs.append(Segment(tool_calls_text(m.tool_calls) + "<|im_end|>\n", "tool_call", k, m.pin))
                continue
            region = {"tool": "tool_result"}.get(m.role, m.role)
            who = f"{m.name}: " if (m.name and m.role == "user") else ""
            segs.append(Segment(f"<|im_start|>{m.role}\n{who}{m.content}<|im_end|>\n", region, k, m.pin))
        if not cont:
            segs.append(Segment("<|im_start|>assistant\n", "assistant", -1))
        return segs


class JinjaFormat(ChatFormat):
    """The model's own jinja2 chat template; regions from cumulative renders."""

    name = "jinja"

    def __init__(self, template: str) -> None:
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:  # pragma: no cover
            raise ImportError("the 'jinja' chat format needs jinja2: pip install jinja2") from exc

        def raise_exception(msg: str) -> None:
            raise MessageError(f"chat template rejected the messages: {msg}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: __import__("datetime").datetime.now().strftime(fmt)
        self._tpl = env.from_string(template)

    @staticmethod
    def _as_dict(m: Message) -> dict[str, Any]:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.name:
            d["name"] = m.name
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls
            ]
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        return d

    def _render(self, msgs: Sequence[Message], gen: bool, bos: str, eos: str) -> str:
        return self._tpl.render(
            messages=[self._as_dict(m) for m in msgs], add_generation_prompt=gen, bos_token=bos, eos_token=eos
        )

    def render(self, messages: Sequence[Message], *, bos: str, eos: str) -> list[Segment]:
        cont = _continue_last(messages)
        full = self._render(messages, not cont, bos, eos)
        if cont:  # cut everything the template adds after the final assistant content
            tail = messages[-1].content
            j = full.rfind(tail) if tail else -1
            full = full[: j + len(tail)] if j != -1 else full
        segs: list[Segment] = []
        prev = 0
        for k in range(len(messages)):
            try:
                part = self._render(messages[: k + 1], False, bos, eos)
            except MessageError:
                part = ""  # e.g. a template that insists on alternation for prefixes
            # boundary = common prefix of the partial and the full render
            lim = min(len(part), len(full))
            b = 0
            while b < lim and part[b] == full[b]:
                b += 1
            if b > prev:
                m = messages[k]
                region = "tool_call" if m.tool_calls else {"tool": "tool_result"}.get(m.role, m.role)
                segs.append(Segment(full[prev:b], region, k, m.pin))
                prev = b
        if prev < len(full):
            segs.append(Segment(full[prev:], "assistant", -1))
        return segs


FORMATS: dict[str, type[ChatFormat]] = {"gemma": GemmaFormat, "chatml": ChatMLFormat, "jinja": JinjaFormat}


def select_format(name: str, template: str | None, *, has_gemma_turns: bool = False) -> ChatFormat:
    """Pick a format by name.

    ``auto``: a Gemma-style template, or no template but a vocabulary with a
    ``<start_of_turn>`` token (the default model's GGUF ships no template) →
    ``gemma``; another template → ``jinja``; otherwise ``chatml``.
    """
    if name == "auto":
        if (template and "<start_of_turn>" in template) or (not template and has_gemma_turns):
            return GemmaFormat()
        if template:
            return JinjaFormat(template)
        return ChatMLFormat()
    if name == "jinja":
        if not template:
            raise PolicyError("chat_format='jinja' but the model has no tokenizer.chat_template")
        return JinjaFormat(template)
    if name not in FORMATS:
        raise PolicyError(f"unknown chat_format {name!r}; valid: auto, {', '.join(sorted(FORMATS))}")
    return FORMATS[name]()


class ChatRenderer:
    """Render + tokenize messages for one model, caching segment tokenizations.

    Args:
        model: a :class:`~agentmem.engine.context.LlamaModel` (anything with
            ``tokenize``, ``bos``, ``add_bos``, ``chat_template()``).
        chat_format: ``auto``, ``gemma``, ``chatml`` or ``jinja``.
    """

    def __init__(self, model: Any, chat_format: str = "auto", *, cache_size: int = 8192) -> None:
        self.model = model
        self.format = select_format(
            chat_format, model.chat_template(), has_gemma_turns=model.has_special("<start_of_turn>")
        )
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._cache_size = cache_size
        logger.debug("chat format: %s", self.format.name)

    def _tok(self, text: str) -> tuple[int, ...]:
        with self._cache_lock:  # renders run concurrently in callers' threads
            hit = self._cache.get(text)
            if hit is not None:
                self._cache.move_to_end(text)
                return hit
        toks = tuple(self.model.tokenize(text, add_special=False, parse_special=True))
        with self._cache_lock:
            self._cache[text] = toks
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return toks

    def render(self, messages: Iterable[Mapping[str, Any] | Message]) -> RenderedPrompt:
        """Messages → tokens with region spans (raises :class:`MessageError`)."""
        msgs = normalize_messages(messages)
        segs = self.format.render(msgs, bos="", eos="")
        tokens: list[int] = []
        spans: list[Span] = []
        if self.model.add_bos:
            tokens.append(self.model.bos)
            first = segs[0] if segs else None
            spans.append(Span(0, 1, first.region if first else "system", -1, True))
        for s in segs:
            t = self._tok(s.text)
            if not t:
                continue
            spans.append(Span(len(tokens), len(tokens) + len(t), s.region, s.message, s.pinned))
            tokens.extend(t)
        return RenderedPrompt(tokens, spans)

    def render_text(self, text: str, *, region: str = "text") -> RenderedPrompt:
        """A raw prompt (no template): BOS (if the model wants it) + the text's tokens."""
        if not isinstance(text, str):
            raise MessageError(f"prompt must be a string, got {type(text).__name__}")
        toks = ([self.model.bos] if self.model.add_bos else []) + list(self.model.tokenize(text, add_special=False, parse_special=False))
        if not toks:
            raise MessageError("prompt is empty")
        return RenderedPrompt(toks, [Span(0, len(toks), region)])
