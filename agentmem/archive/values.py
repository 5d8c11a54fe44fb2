"""Backend-neutral value helpers: checksums, zero-copy blob views, canonical JSON, value checks.

Every backend stores the same values, so the checks that refuse what a database
cannot hold (text without a UTF-8 encoding, integers beyond 64 bits, negative
counts) run here, in Python, before any SQL: both backends raise the same
`ConfigError` naming the field, and write nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentmem.archive.records import BlobLike
from agentmem.errors import ConfigError

__all__ = ["PORTABLE_FINGERPRINT_KEYS", "SPAN_COLUMNS", "checksum"]

_CHECKSUM_ALGO = "sha256"  # SHA-NI makes it ~2x faster than blake2b on x86
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1  # what an SQLite INTEGER / PostgreSQL bigint holds

SPAN_COLUMNS = 's.id, s.agent_id, s.start, s."end", s.region, s.text, s.ts'
"""The `EvictedSpan` columns of `evicted_spans s`, in field order (both backends' searches use them)."""


def checksum(data: BlobLike) -> str:
    """Return the archive's checksum of `data` as `"sha256:<hex>"`.

    Examples:
        >>> checksum(b"abc")[:15]
        'sha256:ba7816bf'
    """
    return f"{_CHECKSUM_ALGO}:{hashlib.new(_CHECKSUM_ALGO, _as_buffer(data)).hexdigest()}"


def _verify_checksum(stored: str, data: bytes) -> str | None:
    """Return the recomputed checksum when it differs from `stored`, else None."""
    algo, _, _ = stored.partition(":")
    try:
        actual = f"{algo}:{hashlib.new(algo, data).hexdigest()}"
    except ValueError:  # unknown algorithm name: treat as unverifiable
        return f"unknown algorithm {algo!r}"
    return None if actual == stored else actual


def _as_buffer(blob: BlobLike) -> bytes | bytearray | memoryview:
    """A zero-copy byte view of `blob` that sqlite3 and hashlib both accept."""
    if isinstance(blob, np.ndarray):
        return np.ascontiguousarray(blob).data.cast("B")
    if isinstance(blob, memoryview):
        return blob.cast("B") if blob.c_contiguous else memoryview(blob.tobytes())
    if isinstance(blob, (bytes, bytearray)):
        return blob
    raise TypeError(f"blob must be bytes, bytearray, memoryview or numpy array, not {type(blob).__name__}")


def _json_dumps(value: Any) -> str:
    """Canonical JSON: sorted keys, no spaces, non-ASCII kept as is."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


PORTABLE_FINGERPRINT_KEYS = frozenset({"backend"})
"""Fingerprint keys that describe a stored state but need not match to restore it: `backend`
(`CPU`, `CUDA`...), since a blob's bytes are the same on every backend
(`agentmem.engine.native_first.backend_name` says why)."""


def _normalise_fingerprint(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """Round-trip through JSON so tuples/lists and key order compare equal."""
    if not isinstance(fingerprint, Mapping):
        raise TypeError(f"fingerprint must be a dict, not {type(fingerprint).__name__}")
    try:
        return json.loads(_json_dumps(dict(fingerprint)))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"fingerprint is not JSON-serialisable: {exc}") from exc


def _check_text(name: str, value: str) -> str:
    """`value` unchanged if SQLite can store it: a str with a UTF-8 encoding (no lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise ConfigError(f"{name} must be valid UTF-8 text ({exc.reason} at index {exc.start}): {shown!r}") from exc
    return value


def _json_text(name: str, value: Any) -> str:
    """`_json_dumps(value)`, checked to be storable text (strings inside may hold lone surrogates)."""
    return _check_text(name, _json_dumps(value))


def _check_key(name: str, value: Any) -> Any:
    """A lookup key unchanged; a str one must be storable text (other types go to SQLite as before)."""
    return _check_text(name, value) if isinstance(value, str) else value


def _check_int64(name: str, value: int) -> int:
    """`value` as an int if it fits SQLite's 64-bit INTEGER."""
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ConfigError(f"{name} must fit in a signed 64-bit integer, not {value!r}")
    return int(value)


def _check_agent_id(agent_id: str) -> str:
    if not isinstance(agent_id, str) or not agent_id:
        raise TypeError(f"agent_id must be a non-empty str, not {agent_id!r}")
    return _check_text("agent_id", agent_id)


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(f"{name} must be a non-negative int, not {value!r}")
    return _check_int64(name, value)
