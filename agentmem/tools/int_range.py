"""GBNF for integer ranges: the `minimum`/`maximum` bounds the JSON-schema converter ignores.

`integer_range(lo, hi)` writes the decimal strings of `lo..hi` (no leading zeros) digit by
digit, so a grammar-constrained integer is inside its bounds by construction. Used by
`agentmem.tools.grammar`, which puts each bounded integer of a schema through it.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["BOUND_KEYS", "int_bounds", "integer_range"]


def _literal(digits: str) -> str:
    return '"' + digits + '"'


_MAX_DIGITS = 16  # the converter's integers have up to 16 digits; so do ranges without an upper bound
BOUND_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _same_length_range(lo: str, hi: str) -> str:
    """GBNF for the decimal strings of one length from `lo` to `hi` (`lo <= hi`)."""
    n = len(lo)
    if n == 1:
        return f"[{lo}-{hi}]" if lo != hi else _literal(lo)
    if lo[0] == hi[0]:
        return f"{_literal(lo[0])} ( {_same_length_range(lo[1:], hi[1:])} )"
    rest = n - 1
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return f"[{lo[0]}-{hi[0]}]" + " [0-9]" * rest
    parts = [f"{_literal(lo[0])} ( {_same_length_range(lo[1:], '9' * rest)} )"]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]" + " [0-9]" * rest)
    parts.append(f"{_literal(hi[0])} ( {_same_length_range('0' * rest, hi[1:])} )")
    return " | ".join(parts)


def _nonneg_range(lo: int, hi: int) -> str:
    """GBNF for the integers `lo..hi` (`0 <= lo <= hi`), without leading zeros."""
    parts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (n - 1) if n > 1 else 0)
        b = min(hi, 10**n - 1)
        if a <= b:
            parts.append(f"( {_same_length_range(str(a), str(b))} )")
    return " | ".join(parts)


def integer_range(lo: int | None, hi: int | None) -> str:
    """GBNF for the integers `lo..hi` (either bound may be `None`: 16 digits at most).

    Raises:
        ValueError: the range is empty.

    >>> integer_range(-2, 12)
    '"-" ( ( [1-2] ) ) | ( [0-9] ) | ( "1" ( [0-2] ) )'
    """
    big = 10**_MAX_DIGITS - 1
    lo = -big if lo is None else max(lo, -big)
    hi = big if hi is None else min(hi, big)
    if lo > hi:
        raise ValueError(f"empty integer range: minimum {lo} > maximum {hi}")
    parts = []
    if lo < 0:
        parts.append(f'"-" ( {_nonneg_range(max(1, -hi) if hi < 0 else 1, -lo)} )')
    if hi >= 0:
        parts.append(_nonneg_range(max(lo, 0), hi))
    return " | ".join(parts)


def int_bounds(schema: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """Inclusive bounds of an integer schema (draft 4 boolean and draft 6+ numeric exclusives)."""
    lo = hi = None
    if isinstance(schema.get("minimum"), (int, float)):
        lo = math.ceil(schema["minimum"])
        if schema.get("exclusiveMinimum") is True and lo == schema["minimum"]:
            lo += 1
    if isinstance(schema.get("maximum"), (int, float)):
        hi = math.floor(schema["maximum"])
        if schema.get("exclusiveMaximum") is True and hi == schema["maximum"]:
            hi -= 1
    ex_lo, ex_hi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(ex_lo, (int, float)) and not isinstance(ex_lo, bool):
        v = math.floor(ex_lo) + 1
        lo = v if lo is None else max(lo, v)
    if isinstance(ex_hi, (int, float)) and not isinstance(ex_hi, bool):
        v = math.ceil(ex_hi) - 1
        hi = v if hi is None else min(hi, v)
    return lo, hi
