"""The default llama.cpp thread count (`agentmem.engine.threads.default_threads`)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agentmem.engine import threads
from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel
from agentmem.engine.threads import ENV_VAR, default_threads, threads_for
from agentmem.errors import ConfigError


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch):
    """Replace the machine readings; returns a setter `machine(logical=, physical=, load1=, quota=)`."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(threads, "_last_logged", None)

    def set_readings(*, logical: int, physical: int, load1: float, quota: int | None = None) -> None:
        monkeypatch.setattr(threads, "_usable_cpus", lambda: set(range(logical)))
        monkeypatch.setattr(threads, "_physical_cores", lambda cpus: physical)
        monkeypatch.setattr(threads, "_cpu_quota", lambda: quota)
        monkeypatch.setattr(threads, "_load1", lambda: load1)

    return set_readings


@pytest.mark.parametrize(
    ("logical", "physical", "load1", "expected"),
    [
        (2, 2, 0.0, 2),  # quiet machine: every physical core
        (8, 4, 0.3, 4),  # SMT siblings are not counted
        (2, 2, 1.8, 1),  # a busy neighbour on 2 cores: 1, not 2
        (2, 2, 0.6, 1),  # 1.4 CPUs free rounds to 1
        (2, 2, 0.4, 2),  # 1.6 CPUs free rounds to 2
        (16, 8, 12.4, 4),  # 3.6 logical CPUs free
        (4, 4, 40.0, 1),  # never below 1
    ],
)
def test_rule_physical_cores_less_the_load(machine, logical: int, physical: int, load1: float, expected: int) -> None:
    """Regression (issue #13 item 10): n_threads=0 meant all cores, 10-30x slower on a busy machine."""
    machine(logical=logical, physical=physical, load1=load1)
    assert default_threads() == expected
    assert threads_for(physical=physical, logical=logical, load1=load1) == expected


def test_cgroup_quota_caps_the_count(machine) -> None:
    machine(logical=64, physical=32, load1=0.0, quota=2)
    assert default_threads() == 2


def test_env_var_overrides_the_rule(machine, monkeypatch: pytest.MonkeyPatch) -> None:
    machine(logical=2, physical=2, load1=1.8)
    monkeypatch.setenv(ENV_VAR, " 3 ")
    assert default_threads() == 3


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_invalid_env_var_is_a_config_error_naming_it(machine, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    machine(logical=2, physical=2, load1=0.0)
    monkeypatch.setenv(ENV_VAR, value)
    with pytest.raises(ConfigError, match=f"{ENV_VAR} must be a positive integer, got '{value}'"):
        default_threads()


def test_empty_env_var_means_unset(machine, monkeypatch: pytest.MonkeyPatch) -> None:
    machine(logical=4, physical=2, load1=0.0)
    monkeypatch.setenv(ENV_VAR, "")
    assert default_threads() == 2


def test_choice_is_logged_once_at_info(machine, caplog: pytest.LogCaptureFixture) -> None:
    machine(logical=2, physical=2, load1=1.8)
    with caplog.at_level(logging.INFO, logger="agentmem.engine.threads"):
        default_threads()
        default_threads()
    records = [r for r in caplog.records if r.name == "agentmem.engine.threads"]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert records[0].getMessage().startswith("llama.cpp threads: 1 (2 physical core(s), 2 logical, load average 1.80")


def test_physical_cores_from_sysfs_topology(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # 4 logical CPUs: two cores with two SMT siblings each
    for cpu, core in enumerate([0, 1, 0, 1]):
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text(f"{core}\n")
    monkeypatch.setattr(threads, "_SYS_CPU", tmp_path)
    assert threads._physical_cores({0, 1, 2, 3}) == 2
    assert threads._physical_cores({0, 2}) == 1  # affinity to one core's siblings
    assert threads._physical_cores({0, 1, 7}) == 1  # no topology for cpu7: half the logical CPUs


def test_cgroup_cpu_max(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    f = tmp_path / "cpu.max"
    monkeypatch.setattr(threads, "_CGROUP_CPU_MAX", f)
    assert threads._cpu_quota() is None  # no file
    f.write_text("max 100000\n")
    assert threads._cpu_quota() is None
    f.write_text("150000 100000\n")
    assert threads._cpu_quota() == 2


def test_context_uses_the_default_and_an_explicit_count_wins(
    machine, monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path
) -> None:
    import llama_cpp

    monkeypatch.setenv(ENV_VAR, "1")
    with LlamaModel(tiny_model_path) as model:
        with LlamaContext(model, ContextParams(n_ctx=256, n_seq_max=1)) as ctx:
            assert llama_cpp.llama_n_threads(ctx.ptr) == 1
            assert llama_cpp.llama_n_threads_batch(ctx.ptr) == 1
        with LlamaContext(model, ContextParams(n_ctx=256, n_seq_max=1, n_threads=2)) as ctx:
            assert llama_cpp.llama_n_threads(ctx.ptr) == 2
