"""`agentmem archive ls|show|rm|vacuum|search` through `agentmem.cli.main`."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from agentmem.archive import Archive
from agentmem.cli import build_parser, human_bytes, main

FP = {"model": "gemma-3-270m", "type_k": "q8_0"}


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = tmp_path / "agents.db"
    rng = np.random.default_rng(0)
    with Archive(path) as a:
        a.put_agent("planner", priority="foreground", labels={"team": "blue"})
        with a.transaction():
            a.put_ledger(
                "planner",
                np.arange(1500),
                [(0, 100, "system", 1), (100, 900, "user", 0), (900, 1200, "assistant", 0), (1200, 1500, "user", 0)],
                [{"role": "system", "content": "plan"}, {"role": "user", "content": "go"}],
            )
            a.put_state("planner", rng.bytes(3_000_000), codec="q8_0", n_tokens=1500, fingerprint=FP)
        a.put_ledger("coder", np.arange(20), [(0, 20, "user", 0)])
        a.log_event("planner", "demote", to="cold", codec="q8_0")
        a.log_event("planner", "restore", source="cold")
        a.add_evicted_span("planner", 100, 200, "user", "Ship the invoice parser by Friday")
    return str(path)


def test_ls_prints_a_table(db: str, capsys) -> None:
    assert main(["archive", "ls", db]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["AGENT", "PRIORITY", "TOKENS", "TIER", "CODEC", "BYTES", "UPDATED"]
    coder, planner = out[1].split(), out[2].split()
    assert coder[:5] == ["coder", "0", "20", "-", "-"]
    assert planner[:6] == ["planner", "foreground", "1500", "cold", "q8_0", "2.9"] and planner[6] == "MiB"
    assert out[3].startswith("2 agent(s), 2.9 MiB")


def test_ls_json(db: str, capsys) -> None:
    assert main(["archive", "ls", db, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["agent_id"] for r in rows] == ["coder", "planner"]
    assert rows[1]["state_bytes"] == 3_000_000 and rows[1]["codec"] == "q8_0"


def test_ls_empty_archive(tmp_path: Path, capsys) -> None:
    path = tmp_path / "e.db"
    Archive(path).close()
    assert main(["archive", "ls", str(path)]) == 0
    assert "no agents" in capsys.readouterr().out


def test_show(db: str, capsys) -> None:
    assert main(["archive", "show", db, "planner"]) == 0
    out = capsys.readouterr().out
    assert "priority  foreground" in out
    assert "ledger    1500 tokens, 4 spans, 2 messages" in out
    region_rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")}
    assert region_rows["user"] == ["2", "1100"] and region_rows["system"] == ["1", "100"]
    assert "state     cold, q8_0, 1500 tokens, 2.9 MiB" in out
    assert "checksum  sha256:" in out and '"type_k": "q8_0"' in out
    assert "evicted   1 span(s)" in out
    assert out.index("restore") < out.index("demote")  # newest first


def test_show_json_and_agent_without_state(db: str, capsys) -> None:
    assert main(["archive", "show", db, "coder", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["state"] is None and out["ledger"]["n_tokens"] == 20 and out["events"] == []


def test_show_unknown_agent(db: str, capsys) -> None:
    assert main(["archive", "show", db, "ghost"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"agentmem: error: {db}: no agent 'ghost'"


def test_rm(db: str, capsys) -> None:
    assert main(["archive", "rm", db, "coder"]) == 0
    assert capsys.readouterr().out.strip() == "removed coder"
    with Archive(db, readonly=True) as a:
        assert [r.agent_id for r in a.list_agents()] == ["planner"]


def test_rm_unknown_agent_removes_nothing(db: str, capsys) -> None:
    assert main(["archive", "rm", db, "coder", "ghost"]) == 2
    assert "no agent 'ghost'; nothing removed" in capsys.readouterr().err
    with Archive(db, readonly=True) as a:
        assert len(a.list_agents()) == 2


def test_vacuum_prints_bytes_before_and_after(db: str, capsys) -> None:
    assert main(["archive", "rm", db, "planner"]) == 0
    capsys.readouterr()
    assert main(["archive", "vacuum", db]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"{db}: ") and " -> " in out and "freed" in out
    after = out.split("->")[1].split("(")[0].strip()
    assert after.endswith("KiB")  # the state's pages went back to the OS
    assert os.path.getsize(db) < 1_000_000


def test_search(db: str, capsys) -> None:
    assert main(["archive", "search", db, 'invoice "Friday', "--agent", "planner"]) == 0
    assert "[100:200] user  Ship the invoice parser by Friday" in capsys.readouterr().out
    assert main(["archive", "search", db, "zebra"]) == 0
    assert capsys.readouterr().out.strip() == "no matches"


@pytest.mark.parametrize("k", ["-1", "0"])
def test_search_bad_k_is_one_line_and_status_2(db: str, capsys, k: str) -> None:
    """Issue #13 item 6: `agentmem archive search -k -1` printed a traceback instead of
    the promised one line on stderr and exit status 2."""
    assert main(["archive", "search", db, "invoice", "-k", k]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentmem: error: ") and "-k" in err and err.count("\n") == 1
    assert "Traceback" not in err


def test_ls_and_show_survive_corrupt_labels(db: str, capsys) -> None:
    """Issue #13 item 6: a corrupt agent row's `labels` made `agentmem archive ls` print a traceback."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("UPDATE agents SET labels = '{oops' WHERE id = 'planner'")
    conn.close()
    assert main(["archive", "ls", db]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:3]] == ["coder", "planner"]
    assert main(["archive", "show", db, "planner", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["agent"]["labels"] == {}


@pytest.mark.parametrize("cmd", [["ls"], ["show", "_", "a"], ["rm", "_", "a"], ["vacuum"]])
def test_errors_go_to_stderr_with_status_2(tmp_path: Path, capsys, cmd: list[str]) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not sqlite at all" * 100)
    argv = ["archive", cmd[0], str(bad), *cmd[2:]]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("agentmem: error: ") and "file is not a database" in captured.err
    assert "Traceback" not in captured.err


def test_writers_are_refused_while_a_pool_holds_the_archive(db: str, capsys) -> None:
    with Archive(db):
        assert main(["archive", "rm", db, "coder"]) == 2
        assert "is in use by pid" in capsys.readouterr().err
        assert main(["archive", "ls", db]) == 0  # readers still work


def test_missing_file(tmp_path: Path, capsys) -> None:
    assert main(["archive", "ls", str(tmp_path / "nope.db")]) == 2
    assert "no such archive file" in capsys.readouterr().err
    assert not (tmp_path / "nope.db").exists()  # ls never creates files


def test_usage_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["archive"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        main([])


def test_parser_lists_archive_commands() -> None:
    help_text = build_parser().format_help()
    assert "archive" in help_text


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1024, 5 * 2**20, 3 * 2**40)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "5.0 MiB",
        "3.0 TiB",
    ]


def test_ls_and_search_read_a_postgresql_archive_and_hide_its_password(postgres_url: str, capsys) -> None:
    from agentmem.archive import open_archive

    with open_archive(postgres_url) as a:
        a.put_ledger("planner", np.arange(20), [(0, 20, "user", 0)])
        a.add_evicted_span("planner", 0, 20, "user", "Ship the invoice parser by Friday")
    assert main(["archive", "ls", postgres_url]) == 0
    out = capsys.readouterr().out
    assert "planner" in out
    assert main(["archive", "search", postgres_url, "invoice", "--agent", "planner"]) == 0
    assert "invoice parser" in capsys.readouterr().out
    assert main(["archive", "show", postgres_url, "nobody"]) != 0
    err = capsys.readouterr()
    password = postgres_url.split("://", 1)[1].split("@", 1)[0].partition(":")[2]
    if password:
        assert password not in err.out + err.err
