"""`python -m agentmem.server`: the same flags, errors and exit status as `agentmem serve`, on its own.

Since issue #24 the server package starts itself through `agentmem.server.command` instead of
importing the top-level `agentmem.cli` (an import from a lower floor to a higher one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentmem.errors import ArchiveError
from agentmem.server.command import EXIT_ERROR, EXIT_INTERRUPTED, run_handler, serve_main

REPO = Path(__file__).resolve().parents[2]


def _python_m(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_python_m_server_help_is_agentmem_serve_help() -> None:
    main = _python_m("-m", "agentmem.server", "--help")
    serve = _python_m("-m", "agentmem.cli", "serve", "--help")
    assert main.returncode == serve.returncode == 0, main.stderr + serve.stderr
    assert main.stdout.startswith("usage: agentmem serve")
    assert main.stdout == serve.stdout


def test_python_m_server_reports_a_bad_flag_value_in_one_line_with_status_2() -> None:
    """A flag value that `build` refuses is an `AgentMemError`: one line on stderr, no traceback."""
    out = _python_m("-m", "agentmem.server", "--pool-option", "bad")
    assert out.returncode == EXIT_ERROR
    assert out.stderr.strip() == "agentmem: error: --pool-option must be KEY=VALUE, got 'bad'"


def test_python_m_server_does_not_import_the_top_level_command() -> None:
    code = (
        "import runpy, sys; sys.argv = ['x', '--help']\n"
        "try:\n"
        "    runpy.run_module('agentmem.server', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('CLI LOADED:', 'agentmem.cli' in sys.modules)\n"
    )
    out = _python_m("-c", code)
    assert "CLI LOADED: False" in out.stdout, out.stdout + out.stderr


def test_run_handler_turns_errors_into_one_line_and_an_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    def corrupt(_: argparse.Namespace) -> int:
        raise ArchiveError("agents.db: schema is\n   CREATE TABLE x (\n  y)")

    def interrupted(_: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    assert run_handler(corrupt, argparse.Namespace()) == EXIT_ERROR
    assert capsys.readouterr().err == "agentmem: error: agents.db: schema is CREATE TABLE x ( y)\n"
    assert run_handler(interrupted, argparse.Namespace()) == EXIT_INTERRUPTED
    assert run_handler(lambda _: 0, argparse.Namespace()) == 0


def test_serve_main_refuses_two_archives_before_loading_anything(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("fastapi")  # without the extra, serve_main stops earlier, at the install hint
    status = serve_main(["--archive", "a.db", "--archive-url", "postgresql://u@h/db"])
    assert status == EXIT_ERROR
    assert "pass one archive" in capsys.readouterr().err
