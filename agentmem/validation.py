"""Validation of what callers hand the pool: one boundary, typed errors naming field and value.

Every public entry point of `MemoryPool` (and the server and integrations above it)
passes its arguments through these checks before anything is touched, so a bad
value never reaches llama.cpp, SQLite or a background thread, and nothing stored
changes. Each rejection is a `ConfigError` (a parameter) or `MessageError` (a
message), both `AgentMemError`s and `ValueError`s, naming the field and the value.

>>> agent_id("planner")
'planner'
>>> agent_id("share:brief")
Traceback (most recent call last):
...
agentmem.errors.ConfigError: agent_id must not start with the reserved prefix 'share:' (use MemoryPool.share), got 'share:brief'
"""

from __future__ import annotations

import json

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from agentmem.errors import ConfigError, MessageError

__all__ = [
    "MAX_AGENT_ID_CHARS",
    "MAX_PRIORITY",
    "RESERVED_PREFIXES",
    "agent_id",
    "bounded_int",
    "finite_float",
    "json_text",
    "lone_surrogate",
    "message_list",
    "priority",
    "text",
]

#: Longest agent id accepted (characters); ids are keys in SQLite and in HTTP headers.
MAX_AGENT_ID_CHARS = 256
#: Agent ids with these prefixes belong to the pool itself (`share()` agents).
RESERVED_PREFIXES = ("share:",)
#: Largest absolute priority weight (they are stored as SQLite integers).
MAX_PRIORITY = 1_000_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def agent_id(value: Any, *, field: str = "agent_id", internal: bool = False) -> str:
    """An agent id: a non-empty `str` of at most `MAX_AGENT_ID_CHARS` characters that
    encodes as UTF-8, without control characters and (unless `internal`) without a
    reserved prefix."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{field} must be a non-empty string, got {_show(value)}")
    if len(value) > MAX_AGENT_ID_CHARS:
        raise ConfigError(f"{field} must be at most {MAX_AGENT_ID_CHARS} characters, got {len(value)}: {_show(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{field} must be valid Unicode text (it has a lone surrogate), got {_show(value)}") from exc
    if _CONTROL.search(value):
        raise ConfigError(f"{field} must not contain control characters, got {_show(value)}")
    if not internal:
        for prefix in RESERVED_PREFIXES:
            if value.startswith(prefix):
                raise ConfigError(
                    f"{field} must not start with the reserved prefix {prefix!r} (use MemoryPool.share), got {_show(value)}"
                )
    return value


def bounded_int(value: Any, *, field: str, lo: int | None = None, hi: int | None = None) -> int:
    """An `int` (never a `bool`) within `[lo, hi]`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{field} must be an int, got {_show(value)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        lo_s = "-inf" if lo is None else str(lo)
        hi_s = "inf" if hi is None else str(hi)
        raise ConfigError(f"{field} must be in [{lo_s}, {hi_s}], got {_show(value)}")
    return value


def finite_float(value: Any, *, field: str, lo: float | None = None, hi: float | None = None,
                 lo_open: bool = False) -> float:
    """A finite real number (int or float, never a `bool`) within the bounds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{field} must be a number, got {_show(value)}")
    x = float(value)
    if not math.isfinite(x):
        raise ConfigError(f"{field} must be finite, got {_show(value)}")
    if lo is not None and (x <= lo if lo_open else x < lo):
        raise ConfigError(f"{field} must be {'>' if lo_open else '>='} {lo}, got {_show(value)}")
    if hi is not None and x > hi:
        raise ConfigError(f"{field} must be <= {hi}, got {_show(value)}")
    return x


def priority(value: Any) -> int | str:
    """A priority: a named one (checked by the placement policy) or a bounded int weight."""
    if isinstance(value, str):
        return value
    return bounded_int(value, field="priority", lo=-MAX_PRIORITY, hi=MAX_PRIORITY)


def lone_surrogate(value: str) -> int:
    """Index of the first lone surrogate in `value` (text that cannot be UTF-8), or -1.

    >>> lone_surrogate("a\\ud800b"), lone_surrogate("café")
    (1, -1)
    """
    if value.isascii():
        return -1
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return -1


def text(value: str, *, field: str, error: type[ConfigError] | type[MessageError] = MessageError) -> str:
    """`value` when it is text that encodes as UTF-8 (JSON's `"\\ud800"` decodes to a lone
    surrogate, which cannot); else `error` naming the field. The caller checks it is a `str`."""
    at = lone_surrogate(value)
    if at >= 0:
        raise error(f"{field} must be valid Unicode text (a lone surrogate at character {at}), got {_show(value)}")
    return value


def json_text(value: Any, *, field: str, error: type[ConfigError] | type[MessageError] = MessageError) -> Any:
    """`value` (JSON-like: dicts, lists, scalars) when every string in it, dict keys too, is
    valid text (`text`); the error names the path, e.g. `tools[0].parameters.properties.city`.

    >>> json_text({"a": ["x", "y\\udfffz"]}, field="tools[0]")
    Traceback (most recent call last):
    ...
    agentmem.errors.MessageError: tools[0].a[1] must be valid Unicode text (a lone surrogate at character 1), got 'y\\udfffz'
    """
    try:  # the common case at C speed (a request body's 120,000 items walked in Python took 1.7 s: #33 F1)
        json.dumps(value, ensure_ascii=False, check_circular=False).encode("utf-8")
        return value
    except (UnicodeEncodeError, TypeError, ValueError, RecursionError):
        pass  # a lone surrogate (or a value JSON cannot write): walk it to name the field
    stack: list[tuple[str, Any]] = [(field, value)]
    while stack:  # iterative: a deeply nested value must not hit the recursion limit here
        where, v = stack.pop()
        if isinstance(v, str):
            text(v, field=where, error=error)
        elif isinstance(v, Mapping):
            for k, x in reversed(list(v.items())):
                if isinstance(k, str):
                    text(k, field=f"{where} (a key)", error=error)
                stack.append((f"{where}.{k}", x))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{where}[{j}]", x) for j, x in reversed(list(enumerate(v))))
    return value


def message_list(value: Any) -> list[Any]:
    """A chat history: a list (or other iterable) of messages, not `None`, text or one mapping."""
    if value is None or isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise MessageError(f"messages must be a list of messages, got {_show(value)}")
    return list(value)
