"""The LangChain team example runs end to end (on the tiny model, so it stays fast).

Guards the example against API drift; the real comparison on the default model is a
script (``examples/langchain_team.py``), measured in ``examples/langchain_README.md``.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> Any:
    sys.path.insert(0, str(EXAMPLES))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(EXAMPLES))


def test_team_example_runs(tiny_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    team = _load("langchain_team")
    summary = team.main(["--model", str(tiny_model_path), "--rounds", "2", "--max-tokens", "4", "--threads", "1", "--json"])
    assert summary["turns"] == 8
    assert summary["cache_read"] > 0  # round 2 reuses every agent's round-1 KV
    out = capsys.readouterr().out
    assert "restored" in out and "researcher" in out
