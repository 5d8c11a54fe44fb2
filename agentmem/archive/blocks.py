"""Shared KV blocks with reference counts.

`BlocksMixin` adds to `Archive` the `shared_blocks` table (one checksummed blob
per block, a refcount that never goes negative) and the queries over which
stored states reference which block.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentmem.archive.core import ArchiveCore
from agentmem.archive.records import BlobLike, Lease, SharedBlock, SharedBlockInfo
from agentmem.archive.values import (
    _as_buffer,
    _INT64_MAX,
    _check_count,
    _check_key,
    _check_text,
    _json_text,
    _normalise_fingerprint,
    _verify_checksum,
    checksum,
)
from agentmem.errors import ArchiveError, CodecError, ConfigError

__all__ = ["BlocksMixin"]


class BlocksMixin(ArchiveCore):
    """Reads and writes of shared KV blocks (part of `Archive`)."""

    def put_shared_block(
        self,
        block_id: str,
        blob: BlobLike,
        *,
        n_tokens: int,
        fingerprint: Mapping[str, Any],
    ) -> SharedBlockInfo:
        """Store a shared KV block; an existing block keeps its refcount.

        Examples:
            >>> from agentmem.archive import Archive
            >>> with Archive(":memory:") as arc:
            ...     _ = arc.put_shared_block("sys-prompt", b"kv", n_tokens=12, fingerprint={})
            ...     arc.incref_shared_block("sys-prompt"), arc.decref_shared_block("sys-prompt")
            (1, 0)
        """
        if not isinstance(block_id, str) or not block_id:
            raise TypeError(f"block_id must be a non-empty str, not {block_id!r}")
        _check_text("block_id", block_id)
        n_tokens = _check_count("n_tokens", n_tokens)
        fp_json = _json_text("fingerprint", _normalise_fingerprint(fingerprint))
        buf = _as_buffer(blob)
        digest, n_bytes, now = checksum(buf), memoryview(buf).nbytes, time.time()
        with self._writing("put_shared_block") as db:
            db.execute(
                "INSERT INTO shared_blocks(id, refcount, n_tokens, n_bytes, checksum, fingerprint, "
                "blob, created, updated) VALUES (?, 0, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET n_tokens = excluded.n_tokens, "
                "n_bytes = excluded.n_bytes, checksum = excluded.checksum, "
                "fingerprint = excluded.fingerprint, blob = excluded.blob, updated = excluded.updated",
                [block_id, n_tokens, n_bytes, digest, fp_json, buf, now, now],
            )
            row = db.execute(f"SELECT {self._BLOCK_COLUMNS} FROM shared_blocks WHERE id = ?", [block_id]).fetchone()
        return self._block_info(row)

    _BLOCK_COLUMNS = "id, refcount, n_tokens, n_bytes, checksum, fingerprint, created, updated"

    @staticmethod
    def _block_info(row: Sequence[Any]) -> SharedBlockInfo:
        return SharedBlockInfo(
            block_id=row[0],
            refcount=row[1],
            n_tokens=row[2],
            n_bytes=row[3],
            checksum=row[4],
            fingerprint=json.loads(row[5]),
            created=row[6],
            updated=row[7],
        )

    def _change_refcount(self, block_id: str, delta: int, what: str, fence: Lease | None) -> int:
        _check_key("block_id", block_id)
        with self._writing(what, fence=fence) as db:
            # FOR UPDATE on PostgreSQL: replicas changing one block's count queue on its row
            row = db.execute(f"SELECT refcount FROM shared_blocks WHERE id = ?{self._FOR_UPDATE}", [block_id]).fetchone()
            if row is None:
                raise ArchiveError(f"{self.path}: no shared block {block_id!r}")
            new = row[0] + delta
            if new < 0:
                raise ArchiveError(
                    f"{self.path}: shared block {block_id!r} has refcount {row[0]}; cannot drop {-delta} reference(s)"
                )
            if new > _INT64_MAX:
                raise ConfigError(f"n = {delta} would take the refcount of shared block {block_id!r} past 64 bits")
            db.execute("UPDATE shared_blocks SET refcount = ?, updated = ? WHERE id = ?", [new, time.time(), block_id])
            return int(new)

    def incref_shared_block(self, block_id: str, n: int = 1, *, fence: Lease | None = None) -> int:
        """Add `n` references; returns the new count. Unknown id: `ArchiveError`.

        With `fence` (the lease of the agent taking the references) the change
        commits only while that lease is current.
        """
        return self._change_refcount(block_id, _check_count("n", n), "incref_shared_block", fence)

    def decref_shared_block(self, block_id: str, n: int = 1, *, fence: Lease | None = None) -> int:
        """Drop `n` references; returns the new count, never below zero.

        With `fence` (the lease of the agent dropping them) the change commits only
        while that lease is current.

        Raises:
            ArchiveError: unknown id, or fewer than `n` references (nothing changes).
            LeaseLostError: `fence` is no longer current (nothing changes).
        """
        return self._change_refcount(block_id, -_check_count("n", n), "decref_shared_block", fence)

    def get_shared_block(self, block_id: str) -> SharedBlock | None:
        """The verified block, or `None`; `CodecError` if its checksum fails."""
        with self._reading("get_shared_block") as db:
            row = db.execute(
                f"SELECT {self._BLOCK_COLUMNS}, blob FROM shared_blocks WHERE id = ?", [block_id]
            ).fetchone()
        if row is None:
            return None
        info = self._block_info(row)
        blob = row[8]
        if not isinstance(blob, bytes):
            bad: str | None = f"blob column holds {type(blob).__name__}"
        elif len(blob) != info.n_bytes:
            bad = f"{len(blob)} bytes stored, {info.n_bytes} expected"
        else:
            computed = _verify_checksum(info.checksum, blob)
            bad = None if computed is None else f"checksum {computed[:23]}… computed"
        if bad is not None:
            raise CodecError(f"{self.path}: shared block {block_id!r} is corrupt: {bad}")
        return SharedBlock(**{f.name: getattr(info, f.name) for f in dataclasses.fields(info)}, blob=blob)

    def list_shared_blocks(self) -> list[SharedBlockInfo]:
        """Metadata of every shared block, by id."""
        with self._reading("list_shared_blocks") as db:
            rows = db.execute(f"SELECT {self._BLOCK_COLUMNS} FROM shared_blocks ORDER BY id").fetchall()
        return [self._block_info(r) for r in rows]

    def has_shared_block(self, block_id: str) -> bool:
        """Whether the block is stored (without reading its blob)."""
        return self._row("has_shared_block", "SELECT 1 FROM shared_blocks WHERE id = ?", [block_id]) is not None

    def state_blocks(self) -> dict[str, str]:
        """`{agent_id: block_id}` of every stored state that references a shared block."""
        with self._reading("state_blocks") as db:
            return dict(db.execute("SELECT agent_id, block_id FROM state_blocks").fetchall())

    def gc_shared_blocks(self) -> int:
        """Delete blocks with no references; returns how many were deleted."""
        with self._writing("gc_shared_blocks") as db:
            return db.execute("DELETE FROM shared_blocks WHERE refcount = 0").rowcount
