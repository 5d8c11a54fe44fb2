"""llama.cpp's log through `logging` (`agentmem.engine.llama_log`, logger `agentmem.llama`)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agentmem.engine import llama_log
from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel

LOGGER = llama_log.LOGGER_NAME
DEBUG, INFO, WARN, ERROR, CONT = 1, 2, 3, 4, 5  # enum ggml_log_level


def _records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


def _fill_and_get(model: LlamaModel, ctx: LlamaContext, seq: int, n: int) -> object:
    tokens = model.tokenize("hello world " * 200, add_special=True)[:n]
    assert len(tokens) == n, f"{len(tokens)=}"
    ctx.decode_run(seq, tokens, 0)
    return ctx.state_get(seq)


def test_restore_into_a_full_cache_logs_at_debug_not_error(tiny_model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Regression (issue #13 item 11): a normal restore into a full cache logged
    `failed to find N available cells` at ERROR, which users read as a failure."""
    with LlamaModel(tiny_model_path) as model, LlamaContext(model, ContextParams(n_ctx=256, n_seq_max=2, n_threads=1)) as ctx:
        blob = _fill_and_get(model, ctx, 0, 200)
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            assert ctx.state_set(1, blob) == 0  # 200 cells wanted, 56 free: rejected
    records = _records(caplog)
    assert not [m for lv, m in records if lv >= logging.ERROR], records
    debug = [m for lv, m in records if lv == logging.DEBUG]
    assert any("failed to find 200 available cells in kv cache" in m for m in debug), records
    assert any("error loading state: failed to restore kv cache" in m for m in debug), records


def test_a_rejected_blob_of_another_model_still_logs_its_error(
    tiny_model_path: Path, tiny_gemma3_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the expected full-cache messages are demoted; a layout mismatch stays an ERROR."""
    with LlamaModel(tiny_gemma3_path) as other, LlamaContext(other, ContextParams(n_ctx=256, n_seq_max=1, n_threads=1)) as octx:
        foreign = _fill_and_get(other, octx, 0, 20)
    with LlamaModel(tiny_model_path) as model, LlamaContext(model, ContextParams(n_ctx=256, n_seq_max=1, n_threads=1)) as ctx:
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            assert ctx.state_set(0, foreign) == 0
    errors = [m for lv, m in _records(caplog) if lv >= logging.ERROR]
    assert errors and not any("available cells" in m for m in errors), _records(caplog)


def test_levels_map_to_logging_levels(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        for level, text in [(DEBUG, b"d\n"), (INFO, b"i\n"), (WARN, b"w\n"), (ERROR, b"e\n"), (0, b"plain\n")]:
            llama_log._on_log(level, text, None)
    assert _records(caplog) == [
        (logging.DEBUG, "d"),
        (logging.DEBUG, "i"),  # llama.cpp's INFO is load chatter: DEBUG here
        (logging.WARNING, "w"),
        (logging.ERROR, "e"),
        (logging.DEBUG, "plain"),
    ]


def test_continuation_pieces_join_the_record_they_continue(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        llama_log._on_log(WARN, b"loading", None)
        llama_log._on_log(CONT, b"...", None)
        llama_log._on_log(CONT, b" done\n", None)
        llama_log._on_log(CONT, b"....", None)  # continues after a finished line: a record at its level
        llama_log._on_log(CONT, b"\n", None)
        llama_log._on_log(INFO, b"unfinished", None)
        llama_log._on_log(DEBUG, b"next\n", None)  # a new message ends the unfinished one
    assert _records(caplog) == [
        (logging.WARNING, "loading... done"),
        (logging.WARNING, "...."),
        (logging.DEBUG, "unfinished"),
        (logging.DEBUG, "next"),
    ]


def test_expected_failures_are_demoted_only_inside_a_restore_attempt(caplog: pytest.LogCaptureFixture) -> None:
    msg = b"state_read_meta: failed to find 36 available cells in kv cache\n"
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        llama_log._on_log(ERROR, msg, None)
        with llama_log.restore_attempt():
            llama_log._on_log(ERROR, msg, None)
            llama_log._on_log(ERROR, b"state_read_data: mismatched layer count (3 instead of 2)\n", None)
    assert [lv for lv, _ in _records(caplog)] == [logging.ERROR, logging.DEBUG, logging.ERROR]


def test_notices_are_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        llama_log._on_log(WARN, b"llama_kv_cache_iswa: using full-size SWA cache (ref: https://x)\n", None)
        llama_log._on_log(
            WARN, b"load: control-looking token:    212 '</s>' was not control-type; its type will be overridden\n", None
        )
    assert [lv for lv, _ in _records(caplog)] == [logging.DEBUG, logging.DEBUG]


def test_llama_cpp_python_verbose_true_still_prints_to_stderr(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`Llama(verbose=True)` sets llama-cpp-python's logger to DEBUG; its users expect llama.cpp's log on stderr."""
    lcp = logging.getLogger("llama-cpp-python")
    monkeypatch.setattr(lcp, "level", logging.DEBUG)
    llama_log._on_log(INFO, b"llm_load_tensors: ready\n", None)
    assert capsys.readouterr().err == "llm_load_tensors: ready\n"
    monkeypatch.setattr(lcp, "level", logging.ERROR)  # verbose=False: quiet
    llama_log._on_log(ERROR, b"something broke\n", None)
    assert capsys.readouterr().err == ""


def test_install_is_idempotent_and_keeps_the_callback_alive() -> None:
    llama_log.install()
    llama_log.install()
    assert llama_log._installed
    assert llama_log._CALLBACK is not None  # referenced by the module, never collected
