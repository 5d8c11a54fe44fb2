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


def test_langgraph_team_example_runs_with_one_agent_per_node(tiny_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("langgraph")
    team = _load("langgraph_team")
    args = ["--model", str(tiny_model_path), "--tasks", "2", "--max-tokens", "4", "--threads", "1", "--json"]
    summary = team.main(args)
    # ids come from the graph (thread + node); the example never names an agent
    assert summary["agents"] == ["team-1/coder", "team-1/researcher", "team-1/supervisor", "team-1/writer"]
    assert summary["cache_read"] > 0 and summary["prefilled_tokens"] < summary["prompt_tokens"]
    out = capsys.readouterr().out
    assert "hint_hit_rate=" in out and "restored" in out  # 2 live sequences for 4 agents: some are parked


def test_langgraph_team_baseline_runs(tiny_model_path: Path) -> None:
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_community")
    _load("langgraph_team")
    baseline = _load("langgraph_team_baseline")
    team = _load("langgraph_team")
    summary = team.main(
        ["--model", str(tiny_model_path), "--tasks", "1", "--max-tokens", "4", "--threads", "1", "--json"],
        backend_factory=baseline.factory,
    )
    assert summary["backend"] == "langchain-community ChatLlamaCpp" and summary["calls"] >= 4
    assert 0 < summary["cache_read"] < summary["prompt_tokens"]  # the shared system-prompt prefix only
