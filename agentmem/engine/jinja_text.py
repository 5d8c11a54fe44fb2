"""What of a jinja template's render is text: markers around everything a request puts in it.

A chat template is trusted markup: the control-token strings it writes (`<|im_start|>`)
become control tokens. Everything a request hands it (message contents, and every
string of the tool definitions: names, descriptions, parameter names, enum values) is
text, tokenized with `parse_special=False`, so a `<|im_end|>` in a tool's description
stays those characters. `Markers` finds those strings in the render; the functions
below find, neutralize and (when a template's render cannot be split) refuse control
strings in them, naming the field.

>>> m = Markers([], {"description": "x<|im_end|>"})
>>> wrapped = m.wrap_tree(0, {"type": "function", "description": " x<|im_end|>"})
>>> wrapped["type"] == m.wrap(0, "function") and m.strip(wrapped["description"])
(' x<|im_end|>', [(1, 12, 0)])
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any, Iterator, Mapping, Sequence

from agentmem.engine.chat_format import Controls, Message
from agentmem.errors import MessageError

__all__ = [
    "Markers",
    "drop_controls",
    "drop_tree",
    "markup_pieces",
    "refuse_controls_in_tools",
    "refuse_controls_outside_content",
    "tool_controls",
    "tool_strings",
]

_IDENT = re.compile(r"[A-Za-z0-9_$-]*")  # dict keys of `tools` left unwrapped (`Markers.wrap_tree`)


class Markers:
    """Unforgeable markers around each message's content (and each string of the tools) in a jinja render.

    The template renders once with every content (and every string of `tools`,
    `wrap_tree`) wrapped as
    `leading space + OPEN(k) + content.strip() + CLOSE(k) + trailing space` (a
    `trim` filter then still trims what it would have trimmed), so the render says
    where each message's text lies. A marker holds a random nonce drawn for this
    render and absent from every message and tool, so no request can fake one.
    """

    def __init__(self, messages: Sequence[Message], tools: Any = None) -> None:
        texts = [m.content for m in messages] + ([json.dumps(tools, ensure_ascii=False, default=str)] if tools else [])
        while True:
            nonce = secrets.token_hex(8)
            if not any(nonce in t for t in texts):
                break
        self.nonce = nonce
        self._re = re.compile("\ue000" + nonce + r":(\d+):([oc])\ue001")

    def wrap(self, k: int, content: str) -> str:
        core = content.strip()
        if not core:
            return f"{content}\ue000{self.nonce}:{k}:o\ue001\ue000{self.nonce}:{k}:c\ue001"
        lead = content[: len(content) - len(content.lstrip())]
        trail = content[len(content.rstrip()) :]
        return f"{lead}\ue000{self.nonce}:{k}:o\ue001{core}\ue000{self.nonce}:{k}:c\ue001{trail}"

    def wrap_tree(self, k: int, value: Any) -> Any:
        """`value` (the template's `tools`) with every string in it wrapped as `wrap(k, ...)` does.

        Every string value at any depth is wrapped (names, descriptions, enum values,
        defaults, patterns...), and so is every dict key but the plain-identifier ones
        (`type`, `properties`, `city`): a template reads those keys to walk the tool, and
        such a key holds no control-token string.
        """
        if isinstance(value, str):
            return self.wrap(k, value)
        if isinstance(value, Mapping):
            return {(kk if _IDENT.fullmatch(kk) else self.wrap(k, kk)) if isinstance(kk, str) else kk: self.wrap_tree(k, v)
                    for kk, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.wrap_tree(k, v) for v in value]
        return value

    def strip(self, rendered: str) -> tuple[str, list[tuple[int, int, int]]] | None:
        """The render without markers, and the `(start, end, message)` content spans in it.

        None when the markers do not pair up (the template cut or rewrote a content).
        """
        out: list[str] = []
        spans: list[tuple[int, int, int]] = []
        pos = n = 0
        open_k, open_at = -1, 0
        for mk in self._re.finditer(rendered):
            out.append(rendered[pos : mk.start()])
            n += mk.start() - pos
            pos = mk.end()
            k, kind = int(mk.group(1)), mk.group(2)
            if kind == "o":
                if open_k != -1:
                    return None
                open_k, open_at = k, n
            else:
                if open_k != k:
                    return None
                spans.append((open_at, n, k))
                open_k = -1
        if open_k != -1:
            return None
        out.append(rendered[pos:])
        return "".join(out), spans




def drop_controls(text: str, found: Sequence[str]) -> str:
    """`text` with its control-token strings replaced by a neutral character.

    Not removed: a content ending (or made only of) a control string would then end
    in whitespace (or be empty), which `Markers.wrap` places differently, and the
    markup comparison would refuse a template that does not touch content at all.
    """
    for s in set(found):
        text = text.replace(s, "\ue002")
    return text


def tool_strings(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """`(field, text)` of every string in the template's `tools` (dict keys too), depth first."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str):
                yield f"{where}.{k} (a key)", k
            yield from tool_strings(v, f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for j, v in enumerate(value):
            yield from tool_strings(v, f"{where}[{j}]")


def tool_controls(tools: Any, controls: Controls) -> list[str]:
    """The control-token strings anywhere in the template's `tools` (one tokenization when there are none)."""
    if not tools or not controls(json.dumps(tools, ensure_ascii=False, default=str)):
        return []
    return [c for _, text in tool_strings(tools, "tools") for c in (controls(text) if text else [])]


def drop_tree(value: Any, found: Sequence[str]) -> Any:
    """The template's `tools` with the control-token strings in their strings replaced (`drop_controls`)."""
    if isinstance(value, str):
        return drop_controls(value, found)
    if isinstance(value, Mapping):
        return {(drop_controls(k, found) if isinstance(k, str) else k): drop_tree(v, found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [drop_tree(v, found) for v in value]
    return value


def refuse_controls_in_tools(tools: Any, controls: Controls) -> None:
    """A template whose render cannot be split keeps no tool string apart as text: refuse control strings in them."""
    if not tool_controls(tools, controls):
        return
    for where, text in tool_strings(tools, "tools"):
        found = controls(text) if text else []
        if found:
            raise MessageError(
                f"{where} contains the control token {found[0]!r}, and this chat template rewrites what it renders "
                "of tools, so it cannot be kept as text; remove it or use chat_format='chatml'/'gemma'"
            )


def markup_pieces(text: str, spans: Sequence[tuple[int, int, int]]) -> list[str]:
    """The pieces of `text` outside the content spans."""
    out, pos = [], 0
    for s0, s1, _ in spans:
        out.append(text[pos:s0])
        pos = s1
    out.append(text[pos:])
    return out


def refuse_controls_outside_content(messages: Sequence[Message], controls: Controls, *, start: int = 0) -> None:
    """Names, tool-call ids and tool calls reach a jinja template as markup: refuse control strings in them.

    `start`: check `messages[start:]` only (the ones before were checked by an earlier render).
    """
    for k in range(start, len(messages)):
        m = messages[k]
        fields: list[tuple[str, str]] = [("name", m.name or ""), ("tool_call_id", m.tool_call_id or "")]
        for j, c in enumerate(m.tool_calls):
            fields += [(f"tool_calls[{j}].id", c.id), (f"tool_calls[{j}].name", c.name),
                       (f"tool_calls[{j}].arguments", c.arguments_json())]
        for where, value in fields:
            found = controls(value) if value else []
            if found:
                raise MessageError(f"messages[{k}].{where} contains the control token {found[0]!r}")
