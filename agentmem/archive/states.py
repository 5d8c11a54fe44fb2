"""KV states and their sliding-window checkpoints.

`StatesMixin` adds to `Archive` the reads and writes of the `states` table (at
most one checksummed, fingerprinted blob per agent, optionally referencing a
shared block through `state_blocks`) and of `state_checkpoints`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from agentmem.archive.core import ArchiveCore
from agentmem.archive.records import BlobLike, Lease, StateInfo, StoredState
from agentmem.archive.values import (
    PORTABLE_FINGERPRINT_KEYS,
    _as_buffer,
    _check_agent_id,
    _check_count,
    _check_key,
    _check_text,
    _json_text,
    _normalise_fingerprint,
    _verify_checksum,
    checksum,
)
from agentmem.errors import ArchiveError, CodecError, FingerprintMismatch

__all__ = ["StatesMixin"]


class StatesMixin(ArchiveCore):
    """Reads and writes of KV states and checkpoints (part of `Archive`)."""

    def put_state(
        self,
        agent_id: str,
        blob: BlobLike,
        *,
        codec: str,
        n_tokens: int,
        fingerprint: Mapping[str, Any],
        tier: str = "cold",
        block_id: str | None = None,
        layout: BlobLike | None = None,
        fence: Lease | None = None,
    ) -> StateInfo:
        """Store (replace) the agent's KV state with its checksum, in one transaction.

        The blob is written without an intermediate copy for `bytes`,
        contiguous `memoryview` and numpy arrays; its SHA-256 costs about
        5 ms per 10 MB.

        Args:
            agent_id: the agent's id (created if needed).
            blob: the encoded state.
            codec: codec name the blob is encoded with.
            n_tokens: tokens the state covers.
            fingerprint: model and cache configuration (JSON-serialisable).
            tier: tier label to record.
            block_id: the shared block (see `put_shared_block`) the blob's
                missing cells are in; the block's refcount counts this state.
            layout: with `block_id`, the order array that joins the two.
            fence: write only while this lease of the agent is current (the
                block reference it takes is part of the same fenced write).

        Returns:
            The stored metadata.

        Raises:
            ArchiveError: `block_id` names no stored block.
            LeaseLostError: `fence` is no longer current (nothing written).
        """
        if (block_id is None) != (layout is None):
            raise TypeError("block_id and layout go together")
        info, fp_json, buf = self._checked_state(agent_id, blob, codec, n_tokens, fingerprint, tier, block_id)
        with self._writing("put_state", fence=fence, agent_id=agent_id) as db:
            self._touch_agent(db, agent_id, info.created)
            self._upsert_state(db, info, fp_json, buf)
            db.execute("DELETE FROM state_checkpoints WHERE agent_id = ?", [agent_id])  # it belonged to the old state
            self._link_block(db, agent_id, block_id, layout)
        return info

    @staticmethod
    def _checked_state(
        agent_id: str, blob: BlobLike, codec: str, n_tokens: int, fingerprint: Mapping[str, Any],
        tier: str, block_id: str | None,
    ) -> tuple[StateInfo, str, Any]:
        """`put_state`'s arguments checked: `(info, fingerprint JSON, the blob as a buffer)`."""
        _check_agent_id(agent_id)
        if not isinstance(codec, str) or not codec:
            raise TypeError(f"codec must be a non-empty str, not {codec!r}")
        _check_text("codec", codec)
        _check_key("tier", tier)
        _check_key("block_id", block_id)
        n_tokens = _check_count("n_tokens", n_tokens)
        fp = _normalise_fingerprint(fingerprint)
        fp_json = _json_text("fingerprint", fp)
        buf = _as_buffer(blob)
        info = StateInfo(
            agent_id=agent_id,
            tier=tier,
            codec=codec,
            n_tokens=n_tokens,
            n_bytes=memoryview(buf).nbytes,
            checksum=checksum(buf),
            fingerprint=fp,
            created=time.time(),
        )
        return info, fp_json, buf

    @staticmethod
    def _upsert_state(db: Any, info: StateInfo, fp_json: str, buf: Any) -> None:
        """Insert or replace the agent's `states` row."""
        db.execute(
            "INSERT INTO states(agent_id, tier, codec, n_tokens, n_bytes, checksum, "
            "fingerprint, blob, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(agent_id) DO UPDATE SET tier = excluded.tier, codec = excluded.codec, "
            "n_tokens = excluded.n_tokens, n_bytes = excluded.n_bytes, "
            "checksum = excluded.checksum, fingerprint = excluded.fingerprint, "
            "blob = excluded.blob, created = excluded.created",
            [info.agent_id, info.tier, info.codec, info.n_tokens, info.n_bytes, info.checksum, fp_json, buf,
             info.created],
        )

    def _link_block(self, db: Any, agent_id: str, block_id: str | None, layout: BlobLike | None) -> None:
        """Point the agent's state at `block_id` with its `layout` (or at no block), in the open transaction."""
        # the row lock keeps another replica's unref from dropping the block before our reference lands
        if block_id is not None and db.execute(
            f"SELECT 1 FROM shared_blocks WHERE id = ?{self._FOR_UPDATE}", [block_id]
        ).fetchone() is None:
            raise ArchiveError(f"{self.path}: no shared block {block_id!r} (put_shared_block first)")
        old = db.execute("SELECT block_id FROM state_blocks WHERE agent_id = ?", [agent_id]).fetchone()
        if block_id is not None and old is not None and old[0] == block_id:
            # same block: update in place; deleting the reference first would let the
            # unref trigger drop a block this state was its only archived reference to
            db.execute("UPDATE state_blocks SET layout = ? WHERE agent_id = ?", [_as_buffer(layout), agent_id])
            return
        db.execute("DELETE FROM state_blocks WHERE agent_id = ?", [agent_id])
        if block_id is not None:
            db.execute(
                "INSERT INTO state_blocks(agent_id, block_id, layout) VALUES (?, ?, ?)",
                [agent_id, block_id, _as_buffer(layout)],
            )

    _STATE_COLUMNS = "agent_id, tier, codec, n_tokens, n_bytes, checksum, fingerprint, created"

    def get_state_info(self, agent_id: str) -> StateInfo | None:
        """Metadata of the agent's state without reading the blob, or `None`."""
        with self._reading("get_state_info") as db:
            row = db.execute(f"SELECT {self._STATE_COLUMNS} FROM states WHERE agent_id = ?", [agent_id]).fetchone()
        return None if row is None else self._state_info(row)

    def _state_info(self, row: Sequence[Any]) -> StateInfo:
        try:
            fp = json.loads(row[6])
        except ValueError:
            fp = {"_unparseable": row[6]}
        return StateInfo(
            agent_id=row[0],
            tier=row[1],
            codec=row[2],
            n_tokens=row[3],
            n_bytes=row[4],
            checksum=row[5],
            fingerprint=fp,
            created=row[7],
        )

    def get_state(self, agent_id: str, *, fingerprint: Mapping[str, Any] | None = None) -> StoredState | None:
        """The agent's state after verifying its length and checksum, or `None`.

        Args:
            agent_id: the agent's id.
            fingerprint: when given, the stored fingerprint must equal it (but for
                `PORTABLE_FINGERPRINT_KEYS`: a state made on CUDA restores on the CPU).

        Raises:
            CodecError: the blob is truncated, fails its checksum, or SQLite
                reports the page holding it as corrupt (a cache miss: re-prefill).
            FingerprintMismatch: `fingerprint` differs; the message names the keys.
        """
        try:
            with self._reading("get_state") as db:
                row = db.execute(
                    f"SELECT {self._STATE_COLUMNS}, blob FROM states WHERE agent_id = ?", [agent_id]
                ).fetchone()
        except ArchiveError as exc:
            cause = exc.__cause__
            if getattr(cause, "sqlite_errorname", "") in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
                raise CodecError(f"{self.path}: state of agent {agent_id!r} is unreadable: {cause}") from cause
            raise
        if row is None:
            return None
        info = self._state_info(row)
        blob = row[8]
        if not isinstance(blob, bytes):
            raise CodecError(
                f"{self.path}: state of agent {agent_id!r} is corrupt: blob column holds "
                f"{type(blob).__name__}, not bytes"
            )
        if len(blob) != info.n_bytes:
            raise CodecError(
                f"{self.path}: state of agent {agent_id!r} is truncated: "
                f"{len(blob)} bytes stored, {info.n_bytes} expected"
            )
        actual = _verify_checksum(info.checksum, blob)
        if actual is not None:
            raise CodecError(
                f"{self.path}: state of agent {agent_id!r} is corrupt: checksum "
                f"{info.checksum[:23]}… stored, {actual[:23]}… computed"
            )
        if fingerprint is not None:
            self._check_fingerprint(agent_id, info.fingerprint, fingerprint)
        with self._reading("get_state") as db:
            ref = db.execute("SELECT block_id, layout FROM state_blocks WHERE agent_id = ?", [agent_id]).fetchone()
        return StoredState(
            **{f.name: getattr(info, f.name) for f in dataclasses.fields(info)},
            blob=blob,
            block_id=ref[0] if ref else None,
            layout=ref[1] if ref else None,
        )

    def _check_fingerprint(self, agent_id: str, stored: dict[str, Any], expected: Mapping[str, Any]) -> None:
        want = _normalise_fingerprint(expected)
        if stored == want:
            return
        # the backend describes where a state was made, not where it may go
        keys = sorted(k for k in set(stored) | set(want)
                      if stored.get(k) != want.get(k) and k not in PORTABLE_FINGERPRINT_KEYS)
        if not keys:
            return
        detail = ", ".join(f"{k}: stored {stored.get(k)!r} != current {want.get(k)!r}" for k in keys[:6])
        raise FingerprintMismatch(f"{self.path}: state of agent {agent_id!r} belongs to another config ({detail})")

    def delete_state(self, agent_id: str, *, fence: Lease | None = None) -> bool:
        """Delete the agent's state (fenced by `fence` when given); returns whether there was one."""
        _check_key("agent_id", agent_id)
        with self._writing("delete_state", fence=fence, agent_id=agent_id) as db:
            return db.execute("DELETE FROM states WHERE agent_id = ?", [agent_id]).rowcount > 0

    def put_checkpoint(
        self,
        agent_id: str,
        blob: BlobLike,
        *,
        prompt_end: tuple[int, int],
        layout: BlobLike | None = None,
        fence: Lease | None = None,
    ) -> None:
        """Store the sliding-window checkpoint of the agent's stored state (after `put_state`).

        `prompt_end` is `(history tokens, live tokens)` at the prompt end the
        checkpoint was taken at; `layout` the order array when the blob was cut
        against the state's own sliding-window cells. A new `put_state` drops it.
        With `fence`, it is written only while that lease of the agent is current.
        """
        _check_key("agent_id", agent_id)
        buf = _as_buffer(blob)
        h, live = (_check_count("prompt_end", int(x)) for x in prompt_end)
        with self._writing("put_checkpoint", fence=fence, agent_id=agent_id) as db:
            if db.execute("SELECT 1 FROM states WHERE agent_id = ?", [agent_id]).fetchone() is None:
                raise ArchiveError(f"{self.path}: agent {agent_id!r} has no stored state to checkpoint")
            db.execute(
                "INSERT INTO state_checkpoints(agent_id, prompt_end_hist, prompt_end_live, checksum, layout, blob) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(agent_id) DO UPDATE SET prompt_end_hist = excluded.prompt_end_hist, "
                "prompt_end_live = excluded.prompt_end_live, checksum = excluded.checksum, layout = excluded.layout, "
                "blob = excluded.blob",
                [agent_id, h, live, checksum(buf), None if layout is None else _as_buffer(layout), buf],
            )

    def get_checkpoint(self, agent_id: str) -> tuple[bytes, bytes | None, tuple[int, int]] | None:
        """`(blob, layout, prompt_end)` of the agent's checkpoint, or `None`.

        Raises:
            CodecError: the blob fails its checksum.
        """
        row = self._row(
            "get_checkpoint",
            "SELECT prompt_end_hist, prompt_end_live, checksum, layout, blob FROM state_checkpoints WHERE agent_id = ?",
            [agent_id],
        )
        if row is None:
            return None
        bad = _verify_checksum(row[2], row[4]) if isinstance(row[4], bytes) else "not a blob"
        if bad is not None:
            raise CodecError(f"{self.path}: checkpoint of agent {agent_id!r} is corrupt")
        return row[4], row[3], (int(row[0]), int(row[1]))

    def checkpoint_prompt_ends(self) -> dict[str, tuple[int, int]]:
        """`{agent_id: (history tokens, live tokens)}` of every stored checkpoint (no blobs read)."""
        with self._reading("checkpoint_prompt_ends") as db:
            rows = db.execute("SELECT agent_id, prompt_end_hist, prompt_end_live FROM state_checkpoints").fetchall()
        return {r[0]: (int(r[1]), int(r[2])) for r in rows}
