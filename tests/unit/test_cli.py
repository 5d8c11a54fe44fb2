"""`agentmem --version` and `agentmem bench ...` through `agentmem.cli.main`."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata

import pytest

import agentmem
from agentmem.bench import BENCHMARKS
from agentmem.cli import build_parser, main


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(argv)
    return info.value.code


def test_version_names_agentmem_and_llama_cpp_python(capsys) -> None:
    assert _exit_code(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    llama_version = importlib.metadata.version("llama-cpp-python")
    assert out == f"agentmem {agentmem.__version__} (llama-cpp-python {llama_version})"


def test_bench_help_lists_every_benchmark(capsys) -> None:
    assert _exit_code(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: agentmem bench" in out
    for name in BENCHMARKS:
        assert name in out
    assert "Agent-switch benchmark" in out


def test_bench_switch_help_shows_the_switch_options(capsys) -> None:
    """Regression (issue #12): `agentmem bench switch` was documented but `bench` was not a command."""
    assert _exit_code(["bench", "switch", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: agentmem bench switch" in out
    for option in ("--agents", "--history-tokens", "--rounds", "--max-tokens", "--model", "--out", "--variants", "--threads"):
        assert option in out


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_every_benchmark_parses_its_defaults_like_its_own_script(name: str) -> None:
    """The sub-command's options are the benchmark's own: same defaults as `python benchmarks/NAME.py`."""
    module = importlib.import_module(BENCHMARKS[name])
    args = build_parser().parse_args(["bench", name])
    assert args.handler is module.run_args
    own = argparse.ArgumentParser()
    module.add_arguments(own)
    assert {k: v for k, v in vars(args).items() if k not in ("command", "benchmark", "handler")} == vars(own.parse_args([]))


def test_unknown_benchmark_is_one_line_and_status_2(capsys) -> None:
    assert _exit_code(["bench", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("agentmem bench: error: ")
    assert "'nope'" in err and "switch" in err


def test_bench_without_a_name_is_a_usage_error(capsys) -> None:
    assert _exit_code(["bench"]) == 2
    assert "BENCHMARK" in capsys.readouterr().err


def test_top_level_help_lists_bench_and_version(capsys) -> None:
    help_text = build_parser().format_help()
    assert "bench" in help_text and "--version" in help_text
