"""The load-order guard of `agentmem.engine.native_first`, with the GPU build faked.

Regression tests for issue #31: a process that imported numpy before agentmem, on a CUDA build
of llama-cpp-python, segfaulted at its first model load. The guard probes that order once in a
subprocess and raises `ImportOrderError` naming the fix instead; on a CPU build, or in the
right order, it does nothing.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from agentmem import ImportOrderError
from agentmem.engine import native_first as nf
from agentmem.engine.llama_model import LlamaModel
from agentmem.errors import ConfigError, EngineError

NUMPY_FIRST = nf.ImportOrder(numpy_first=("numpy",), llama_cpp_first=False)
SEGFAULT = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """numpy came first on a faked CUDA build; the probe's result is not cached yet. Yields the probe commands run."""
    ran: list[list[str]] = []
    real = nf._probe_command

    def command(*args: object) -> list[str]:
        cmd = real(*args)  # type: ignore[arg-type]
        ran.append(cmd)
        return cmd

    monkeypatch.setattr(nf, "ORDER", NUMPY_FIRST)
    monkeypatch.setattr(nf, "gpu_backends", lambda: ("CUDA",))
    monkeypatch.setattr(nf, "_probe_result", None)
    monkeypatch.setattr(nf, "_probe_command", command)
    monkeypatch.delenv(nf.PROBE_ENV, raising=False)
    return ran


def test_this_process_loaded_llama_cpp_before_numpy() -> None:
    """The test process imports agentmem first (tests/conftest.py), so nothing is guarded here."""
    assert nf.ORDER.numpy_first == ()


def test_right_order_or_cpu_build_is_not_probed(monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path) -> None:
    monkeypatch.setattr(nf, "_probe_result", None)
    monkeypatch.setattr(nf, "_run_probe", lambda *a: pytest.fail("probed"))
    monkeypatch.setattr(nf, "gpu_backends", lambda: ("CUDA",))
    monkeypatch.setattr(nf, "ORDER", nf.ImportOrder(numpy_first=(), llama_cpp_first=False))
    assert nf.check_load_order(tiny_model_path, n_gpu_layers=-1) == "ok"  # the right order on a GPU build
    monkeypatch.setattr(nf, "ORDER", NUMPY_FIRST)
    monkeypatch.setattr(nf, "gpu_backends", lambda: ())
    assert nf.check_load_order(tiny_model_path, n_gpu_layers=0) == "ok"  # numpy first on a CPU build: harmless


def test_a_crashing_probe_raises_import_order_error_once_per_process(
    guard: list[list[str]], monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path
) -> None:
    monkeypatch.setattr(nf, "_probe_command", lambda *a: guard.append(SEGFAULT) or SEGFAULT)
    with pytest.raises(ImportOrderError, match=r"import agentmem \(or llama_cpp\) before numpy") as info:
        nf.check_load_order(tiny_model_path, n_gpu_layers=-1)
    assert "SIGSEGV" in str(info.value) and "CUDA" in str(info.value) and nf.PROBE_ENV in str(info.value)
    assert isinstance(info.value, EngineError)
    with pytest.raises(ImportOrderError):  # cached: refused again without a second probe
        nf.check_load_order(tiny_model_path, n_gpu_layers=-1)
    assert len(guard) == 1


def test_llama_model_refuses_before_loading(guard: list[list[str]], monkeypatch: pytest.MonkeyPatch,
                                            tiny_model_path: Path) -> None:
    monkeypatch.setattr(nf, "_probe_command", lambda *a: SEGFAULT)
    from agentmem.engine import llama_model

    monkeypatch.setattr(llama_model, "check_load_order", nf.check_load_order)
    monkeypatch.setattr(llama_model._ll, "llama_model_load_from_file", lambda *a: pytest.fail("loaded"))
    with pytest.raises(ImportOrderError):
        LlamaModel(tiny_model_path, n_gpu_layers=-1)


@pytest.mark.parametrize("mode", ["on", "full"])
def test_a_probe_that_loads_lets_the_load_go_on(guard: list[list[str]], monkeypatch: pytest.MonkeyPatch,
                                                tiny_model_path: Path, mode: str) -> None:
    """The real probe (numpy, then llama_cpp, then a load of the same model): on a CPU build it loads.

    On a GPU build this is the open measurement of issue #31: the probe loads, or it crashes and the
    guard refuses with `ImportOrderError`; either way this process does not crash.
    """
    import llama_cpp

    monkeypatch.setenv(nf.PROBE_ENV, mode)
    if llama_cpp.llama_supports_gpu_offload():
        try:
            assert nf.check_load_order(tiny_model_path, n_gpu_layers=-1) in ("ok", "inconclusive")
        except ImportOrderError:
            assert nf._probe_result is not None and nf._probe_result.startswith("crashed")
        return
    assert nf.check_load_order(tiny_model_path, n_gpu_layers=0) == "ok"
    assert nf.check_load_order(tiny_model_path, n_gpu_layers=0) == "ok"
    assert len(guard) == 1 and guard[0][3] == "numpy" and guard[0][-1] == mode
    with LlamaModel(tiny_model_path) as m:  # and the load itself goes on
        assert m.n_layer > 0


def test_probe_off_skips_with_a_warning(guard: list[list[str]], monkeypatch: pytest.MonkeyPatch,
                                        tiny_model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(nf.PROBE_ENV, "off")
    with caplog.at_level(logging.WARNING, logger=nf.__name__):
        assert nf.check_load_order(tiny_model_path, n_gpu_layers=-1) == "skipped"
    assert not guard and "llama-cpp-python #1581" in caplog.text


def test_probe_that_fails_without_a_crash_is_inconclusive(guard: list[list[str]], monkeypatch: pytest.MonkeyPatch,
                                                          tiny_model_path: Path) -> None:
    monkeypatch.setattr(nf, "_probe_command", lambda *a: [sys.executable, "-c", "raise SystemExit(3)"])
    assert nf.check_load_order(tiny_model_path, n_gpu_layers=-1) == "inconclusive"


def test_a_bad_probe_setting_names_the_variable(guard: list[list[str]], monkeypatch: pytest.MonkeyPatch,
                                                tiny_model_path: Path) -> None:
    monkeypatch.setenv(nf.PROBE_ENV, "sometimes")
    with pytest.raises(ConfigError, match=nf.PROBE_ENV):
        nf.check_load_order(tiny_model_path, n_gpu_layers=-1)


def test_gpu_backends_are_read_from_the_shipped_libraries(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    for name in ("libggml-base.so", "libggml-cpu.so", "libllama.so", "libggml-cuda.so.0", "ggml-vulkan.dll"):
        (tmp_path / "lib" / name).write_bytes(b"")
    assert nf.backends_in([tmp_path / "lib", tmp_path]) == ("CUDA", "Vulkan")
    assert nf.backends_in([tmp_path / "missing"]) == ()
    import llama_cpp

    # this build's own libraries agree with what llama.cpp says once loaded (a CPU build: none)
    assert bool(nf.gpu_backends()) == bool(llama_cpp.llama_supports_gpu_offload())
