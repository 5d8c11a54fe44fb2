"""What only the PostgreSQL archive has: several processes on one database, the URL, its schema checks.

Runs against the real server of `tests/fixtures/postgres.py` (skipped when none is installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from agentmem.archive import SCHEMA_VERSION, Lease, PostgresArchive, open_archive
from agentmem.archive import pg_schema
from agentmem.archive.postgres import redact_url
from agentmem.archive.store import ArchiveBase
from agentmem.errors import ArchiveError, LeaseHeldError, LeaseLostError
from tests.fixtures.archives import raw_connection

REPO = Path(__file__).resolve().parents[2]
FP = {"model": "m"}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


@pytest.fixture
def pg(postgres_url: str):
    with PostgresArchive(postgres_url) as archive:
        yield archive


# ------------------------------------------------------------------ several replicas on one database


_ACQUIRER = textwrap.dedent(
    """
    import sys, time
    from agentmem.archive import open_archive
    from agentmem.errors import LeaseHeldError
    url, owner, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with open_archive(url) as arc:
        time.sleep(max(0.0, start - time.time()))  # all processes ask at once
        try:
            lease = arc.acquire_lease("coder", owner=owner, ttl_s=60)
        except LeaseHeldError as exc:
            print("held", exc.owner, flush=True)
        else:
            print("won", lease.token, flush=True)
    """
)


def test_processes_racing_for_one_agent_get_exactly_one_winner(postgres_url: str) -> None:
    PostgresArchive(postgres_url).close()  # migrate first; the race is about the lease
    start = time.time() + 3.0
    procs = [
        subprocess.Popen([sys.executable, "-c", _ACQUIRER, postgres_url, f"replica-{i}", str(start)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        for i in range(4)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    lines = [out.split() for out, _ in outs]
    winners = [i for i, line in enumerate(lines) if line[0] == "won"]
    assert len(winners) == 1, lines
    assert lines[winners[0]] == ["won", "1"]
    assert {tuple(line) for line in lines if line[0] == "held"} == {("held", f"replica-{winners[0]}")}
    with PostgresArchive(postgres_url) as arc:
        assert [(e.owner, e.kind) for e in arc.lease_log("coder")] == [(f"replica-{winners[0]}", "acquire")]


def test_connections_racing_for_one_agent_get_exactly_one_winner(postgres_url: str) -> None:
    n = 8
    archives = [PostgresArchive(postgres_url) for _ in range(n)]
    barrier = threading.Barrier(n)
    won: list[Lease] = []
    held: list[str] = []

    def race(i: int) -> None:
        barrier.wait()
        try:
            won.append(archives[i].acquire_lease("coder", owner=f"r{i}", ttl_s=60))
        except LeaseHeldError as exc:
            held.append(exc.owner)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a in archives:
        a.close()
    assert len(won) == 1 and held == [won[0].owner] * (n - 1), f"{won=}, {held=}"


def test_a_takeover_waits_for_a_fenced_transaction_in_flight(postgres_url: str) -> None:
    """The fence locks the lease row (FOR SHARE): a takeover cannot slip in between the check and the commit."""
    a, b = PostgresArchive(postgres_url), PostgresArchive(postgres_url)
    try:
        old = a.acquire_lease("coder", owner="a", ttl_s=0.2)
        time.sleep(0.3)
        taken: list[Lease] = []
        with a.transaction(fence=old):
            a.put_ledger("coder", [1, 2], [], fence=old)
            t = threading.Thread(target=lambda: taken.append(b.acquire_lease("coder", owner="b", ttl_s=60)))
            t.start()
            time.sleep(0.5)
            assert taken == [], "the takeover went through while a fenced write was in flight"
        t.join(timeout=30)
        assert taken and taken[0].token == old.token + 1
        with pytest.raises(LeaseLostError):
            a.put_ledger("coder", [1, 2, 3], [], fence=old)
        assert b.get_ledger("coder").n_tokens == 2
    finally:
        a.close()
        b.close()


def test_refcounts_stay_exact_under_concurrent_replicas(postgres_url: str) -> None:
    with PostgresArchive(postgres_url) as setup:
        setup.put_shared_block("sys", b"kv", n_tokens=1, fingerprint=FP)
    archives = [PostgresArchive(postgres_url) for _ in range(4)]
    barrier = threading.Barrier(len(archives))

    def work(arc: ArchiveBase) -> None:
        barrier.wait()
        for _ in range(25):
            arc.incref_shared_block("sys")
        for _ in range(10):
            arc.decref_shared_block("sys")

    threads = [threading.Thread(target=work, args=(a,)) for a in archives]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert archives[0].get_shared_block("sys").refcount == 4 * 15
    for a in archives:
        a.close()


def test_replicas_opening_a_fresh_schema_together_migrate_it_once(postgres_url: str) -> None:
    opened: list[int] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def open_one() -> None:
        barrier.wait()
        try:
            with PostgresArchive(postgres_url) as arc:
                opened.append(arc.schema_version)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and opened == [SCHEMA_VERSION] * 4, errors
    with PostgresArchive(postgres_url) as arc:
        assert raw_connection(arc).execute("SELECT count(*) FROM meta WHERE key = 'application'").fetchone()[0] == 1


# ------------------------------------------------------------------ the URL, the schema


def test_the_password_never_shows() -> None:
    url = "postgresql://app:hunter2@127.0.0.1:1/agents?connect_timeout=1"
    assert redact_url(url) == "postgresql://app:***@127.0.0.1:1/agents?connect_timeout=1"
    assert "hunter2" not in redact_url("postgresql://app@h/db?password=hunter2&sslmode=require")
    with pytest.raises(ArchiveError, match="cannot connect") as info:
        open_archive(url)
    assert "hunter2" not in str(info.value) and "app:***@" in str(info.value)
    assert "hunter2" not in repr(info.value.__cause__ or "")


def test_a_url_is_not_a_sqlite_path_and_meta_needs_a_version(postgres_url: str) -> None:
    from agentmem.archive import Archive

    with pytest.raises(ArchiveError, match="use open_archive") as info:
        Archive("postgresql://app:hunter2@127.0.0.1:1/agents")
    assert "hunter2" not in str(info.value)
    with PostgresArchive(postgres_url) as arc:
        raw = raw_connection(arc)
    raw.execute("DELETE FROM meta")
    with pytest.raises(ArchiveError, match="no valid schema_version"):
        PostgresArchive(postgres_url)


def test_other_applications_tables_are_refused(postgres_url: str) -> None:
    with PostgresArchive(postgres_url) as arc:
        raw = raw_connection(arc)
    raw.execute("DROP TABLE meta CASCADE")
    with pytest.raises(ArchiveError, match=r"not an agentmem archive \(tables: .*agents"):
        PostgresArchive(postgres_url)


def test_newer_schema_is_refused_and_readonly_never_writes(postgres_url: str) -> None:
    with PostgresArchive(postgres_url) as arc:
        arc.put_agent("kept")
        raw = raw_connection(arc)
    with PostgresArchive(postgres_url, readonly=True) as ro:
        assert [a.agent_id for a in ro.list_agents()] == ["kept"]
        with pytest.raises(ArchiveError, match="readonly"):
            ro.put_agent("x")
    raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(ArchiveError, match=f"schema version 99 is newer .* \\(version {SCHEMA_VERSION}\\)"):
        PostgresArchive(postgres_url)


def test_a_failed_migration_leaves_the_old_version(postgres_url: str, monkeypatch) -> None:
    from agentmem.archive import schema

    PostgresArchive(postgres_url).close()
    broken = ("_vnext_broken", "CREATE TABLE half_done (x int); SELECT 1/0;")
    monkeypatch.setattr("agentmem.archive.postgres.PG_MIGRATIONS", [*pg_schema.PG_MIGRATIONS, broken])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(ArchiveError, match=rf"migration _vnext_broken \(version {SCHEMA_VERSION} -> {SCHEMA_VERSION + 1}\) failed"):
        PostgresArchive(postgres_url)
    monkeypatch.undo()
    with PostgresArchive(postgres_url) as arc:
        assert arc.schema_version == SCHEMA_VERSION
        assert raw_connection(arc).execute("SELECT to_regclass('half_done')").fetchone()[0] is None


def test_a_search_path_without_schema_is_an_archive_error(postgres_server) -> None:
    from tests.fixtures.postgres import schema_url

    with pytest.raises(ArchiveError, match="names no existing schema"):
        PostgresArchive(schema_url(postgres_server.url, "no_such_schema"))


def test_a_dropped_connection_fails_one_call_and_the_next_reconnects(pg: PostgresArchive) -> None:
    pg.put_agent("kept")
    pid = pg._conn.info.backend_pid
    raw_connection(pg).execute("SELECT pg_terminate_backend(?)", [pid])
    with pytest.raises(ArchiveError, match="failed"):
        pg.put_agent("lost")
    pg.put_agent("after")  # reconnected
    assert [a.agent_id for a in pg.list_agents()] == ["after", "kept"]
    assert pg._conn.info.backend_pid != pid


def test_priorities_keep_their_type(pg: PostgresArchive) -> None:
    pg.put_agent("a", priority=3)
    pg.put_agent("b", priority="7")  # a name that looks like a number stays a name
    pg.put_agent("c")
    assert [(r.agent_id, r.priority) for r in pg.list_agents()] == [("a", 3), ("b", "7"), ("c", 0)]


def test_evicted_text_with_a_nul_is_stored(pg: PostgresArchive) -> None:
    """Detokenized model output may hold NUL, which PostgreSQL text cannot: eviction must not fail on it."""
    pg.add_evicted_span("a", 0, 3, "assistant", "zebra\x00crossing")
    assert [s.text for s in pg.list_evicted("a")] == ["zebra crossing"]
    assert [s.start for s in pg.search_evicted("a", "crossing")] == [0]
    pg.put_ledger("a", [1], [], [{"role": "user", "content": "nul\x00inside"}])  # JSON escapes it
    assert pg.get_ledger("a").messages[0]["content"] == "nul\x00inside"
