"""The archive against bad files, old and new schemas, and a second opener."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from sqlite_utils import Database

from agentmem.archive import MIGRATIONS, SCHEMA_VERSION, Archive
from agentmem.archive import schema as archive_mod
from agentmem.errors import AgentMemError, ArchiveError, StateError

REPO = Path(__file__).resolve().parents[2]
FP = {"model": "m", "type_k": "f16"}


def _make_v1(path: Path) -> None:
    """An archive as version 1 of the schema left it (no event indexes)."""
    conn = sqlite3.connect(path, isolation_level=None)
    db = Database(conn, execute_plugins=False)
    MIGRATIONS[0](db)
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.execute("INSERT INTO agents(id, priority, labels, created, updated) VALUES ('old', 2, '{}', 1.0, 1.0)")
    db.execute(
        "INSERT INTO ledgers(agent_id, tokens, regions, messages, n_tokens, n_bytes, updated) "
        "VALUES ('old', ?, '[[0, 3, \"system\", 1]]', NULL, 3, 30, 1.0)",
        [np.array([5, 6, 7], "<i4").tobytes()],
    )
    db.execute("INSERT INTO events(ts, agent_id, kind, data) VALUES (1.0, 'old', 'park', '{}')")
    conn.close()


# ------------------------------------------------------------------ bad files


def test_not_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"this is a text file, not SQLite\n" * 200)
    with pytest.raises(ArchiveError, match="file is not a database") as info:
        Archive(path)
    assert str(path) in str(info.value)
    assert path.read_bytes().startswith(b"this is a text file")  # untouched
    with pytest.raises(ArchiveError, match="file is not a database"):
        Archive(path, readonly=True)
    Archive(path.with_name("other.db")).close()  # the failed open released its lock


def test_other_applications_database(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    conn.close()
    with pytest.raises(ArchiveError, match=r"not an agentmem archive \(tables: users\)"):
        Archive(path)


def test_empty_file_becomes_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with Archive(path) as a:
        assert a.schema_version == SCHEMA_VERSION


def test_paths_that_cannot_be_archives(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="is a directory"):
        Archive(tmp_path)
    with pytest.raises(ArchiveError, match="does not exist"):
        Archive(tmp_path / "missing" / "a.db")
    with pytest.raises(ArchiveError, match="no such archive"):
        Archive(tmp_path / "missing.db", readonly=True)


def test_newer_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    Archive(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.close()
    with pytest.raises(ArchiveError, match=f"schema version 99 is newer .* \\(version {SCHEMA_VERSION}\\)"):
        Archive(path)
    with pytest.raises(ArchiveError, match="schema version 99"):
        Archive(path, readonly=True)


def test_meta_without_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "odd.db"
    Archive(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM meta")
    conn.close()
    with pytest.raises(ArchiveError, match="no valid schema_version"):
        Archive(path)


def test_truncated_database_file_gives_clear_errors(tmp_path: Path) -> None:
    """A file cut short (disk full, bad copy) fails with agentmem errors only."""
    path = tmp_path / "cut.db"
    rng = np.random.default_rng(1)
    with Archive(path) as a:
        for i in range(3):
            a.put_ledger(f"a{i}", np.arange(50), [])
            a.put_state(f"a{i}", rng.bytes(300_000), codec="f16", n_tokens=50, fingerprint=FP)
        a.checkpoint()
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    raised: list[BaseException] = []
    try:
        with Archive(path) as a:
            for rec in a.list_agents():
                try:
                    a.get_state(rec.agent_id)
                except StateError as exc:  # a cache miss for the pool
                    raised.append(exc)
    except ArchiveError as exc:
        raised.append(exc)
    assert raised, "half of the file is gone; something must have been reported"
    assert all(isinstance(e, AgentMemError) for e in raised)


# ------------------------------------------------------------------ migrations


def test_v1_archive_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _make_v1(path)
    with Archive(path) as a:
        assert a.schema_version == SCHEMA_VERSION == 7
        tables = set(a._db.table_names())  # type: ignore[union-attr]
        assert {"state_blocks", "state_checkpoints", "span_vectors", "span_kv"} <= tables
        names = {ix.name for ix in a._db["events"].indexes}  # type: ignore[index,union-attr]
        assert {"events_agent", "events_ts"} <= names
        led = a.get_ledger("old")
        assert led.tokens.tolist() == [5, 6, 7] and led.regions == [(0, 3, "system", 1)]
        assert a.get_agent("old").priority == 2 and a.events("old")[0].kind == "park"
        assert a.fts_enabled
    version = sqlite3.connect(path).execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    assert version == ("7",)


def test_readonly_does_not_migrate(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _make_v1(path)
    with pytest.raises(ArchiveError, match=f"version 1 needs migrating to version {SCHEMA_VERSION}"):
        Archive(path, readonly=True)


def test_failed_migration_leaves_the_old_version(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "a.db"
    Archive(path).close()
    old, new = SCHEMA_VERSION, SCHEMA_VERSION + 1

    def _vnext_broken(db: Database) -> None:
        db.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(archive_mod, "MIGRATIONS", [*MIGRATIONS, _vnext_broken])
    monkeypatch.setattr(archive_mod, "SCHEMA_VERSION", new)
    with pytest.raises(ArchiveError, match=rf"migration _vnext_broken \(version {old} -> {new}\) failed: disk on fire"):
        Archive(path)
    monkeypatch.undo()
    with Archive(path) as a:
        assert a.schema_version == old
        assert "half_done" not in a._db.table_names()  # type: ignore[union-attr]


# ------------------------------------------------------------------ one writer at a time

_HOLDER = textwrap.dedent(
    """
    import sys
    from agentmem.archive import Archive
    arc = Archive(sys.argv[1])
    arc.put_agent("held")
    print("ready", flush=True)
    sys.stdin.read()
    arc.close()
    """
)


def _spawn_holder(path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line.strip() == "ready", proc.stderr.read()  # type: ignore[union-attr]
    return proc


def test_second_writer_in_another_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    proc = _spawn_holder(path)
    try:
        with pytest.raises(ArchiveError, match=f"is in use by pid {proc.pid} .*readonly=True"):
            Archive(path)
        # readers are welcome while the writer works
        with Archive(path, readonly=True) as r:
            assert [a.agent_id for a in r.list_agents()] == ["held"]
            with pytest.raises(ArchiveError, match="readonly"):
                r.put_agent("x")
    finally:
        proc.communicate("", timeout=30)
    assert proc.returncode == 0
    with Archive(path) as a:  # released on close
        a.put_agent("mine")


def test_lock_is_released_when_the_holder_is_killed(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    proc = _spawn_holder(path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with Archive(path) as a:
        assert a.get_agent("held") is not None


def test_second_writer_in_the_same_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    with Archive(path), pytest.raises(ArchiveError, match=f"in use by pid {os.getpid()}"):
        Archive(path)
    Archive(path).close()


def test_second_writer_through_a_symlink_is_refused(tmp_path: Path) -> None:
    """Issue #13 item 8: the lock was `<path>-lock` keyed on the path string, so a second
    writer that opened the same file through a symlink (to the file or to its directory)
    locked another lock file and two writers shared one archive. (`stats()` also looked for
    the WAL next to the link, where SQLite never puts it.)"""
    real = tmp_path / "real" / "a.db"
    real.parent.mkdir()
    (tmp_path / "link.db").symlink_to(real)
    (tmp_path / "dirlink").symlink_to(real.parent, target_is_directory=True)
    with Archive(real) as a:
        for other in (tmp_path / "link.db", tmp_path / "dirlink" / "a.db"):
            with pytest.raises(ArchiveError, match=f"in use by pid {os.getpid()}"):
                Archive(other)
        a.put_agent("first")
    with Archive(tmp_path / "link.db") as b:  # the file behind the link, released on close
        assert b.get_agent("first") is not None
        b.put_agent("second")
        assert b.stats().wal_bytes > 0
        with pytest.raises(ArchiveError, match="in use"):
            Archive(real)
