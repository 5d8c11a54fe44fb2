"""llama.cpp's log, routed through Python `logging` on the logger `agentmem.llama`.

llama.cpp (and ggml under it) writes its log to stderr unless a callback is set with
`llama_log_set`; there is one callback per process. `install()` sets ours, once, and
keeps a reference to the ctypes callback so it is never garbage-collected while
llama.cpp still calls it.

* Levels: ggml's WARN and ERROR become WARNING and ERROR; its DEBUG, INFO and NONE
  (plain output) become DEBUG — model loading is INFO chatter in llama.cpp, which an
  app that logs at INFO should not see on every pool it opens.
* Continuation pieces (`GGML_LOG_LEVEL_CONT`, such as the progress dots of a model
  load) are appended to the record they continue, which is emitted at its newline.
* Expected failures are DEBUG, not ERROR: a restore into a full cache makes llama.cpp
  log `failed to find N available cells in kv cache` and `error loading state:
  failed to restore kv cache`, although the caller only sees `state_set(...) == 0`
  and makes room and retries. Inside `restore_attempt()` (which `LlamaContext` uses
  around every state set) those messages are demoted to DEBUG; any other error, such
  as a layout mismatch, stays ERROR. Two warnings are notices (DEBUG): `using
  full-size SWA cache` (agentmem asks for it, `PoolConfig.swa_full`) and a
  `control-looking token` whose type llama.cpp has already overridden.
* llama-cpp-python installs its own callback when `llama_cpp` is imported (its
  `_logger.py`), printing to stderr while its logger `llama-cpp-python` allows it;
  `Llama(verbose=...)` sets that logger's level. Ours replaces it and stays compatible:
  after a `Llama(verbose=True)` (logger at DEBUG) every line is also written to stderr
  as llama-cpp-python would; `verbose=False`, or no `Llama` at all, leaves the log to
  `logging` alone.

Example:
    >>> import logging
    >>> logging.getLogger("agentmem.llama").setLevel(logging.DEBUG)  # see llama.cpp's whole log
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import sys
import threading
from collections.abc import Iterator

import llama_cpp as _ll

__all__ = ["LOGGER_NAME", "install", "restore_attempt"]

LOGGER_NAME = "agentmem.llama"
"""The logger llama.cpp's messages are written to."""

logger = logging.getLogger(LOGGER_NAME)
_llama_cpp_python_logger = logging.getLogger("llama-cpp-python")

# enum ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5 (continues the previous message)
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_CONT = 5

# What llama.cpp logs when a sequence state does not fit; the callers retry after making room.
_EXPECTED_IN_RESTORE = re.compile(
    r"failed to find \d+ available cells|error loading state: failed to restore kv cache$"
    r"|failed to restore sequence state$"
)
# Warnings about what agentmem asked for or llama.cpp already fixed: DEBUG, not WARNING.
_NOTICES = re.compile(
    r"using full-size SWA cache"  # PoolConfig(swa_full=True), on purpose
    r"|control-looking token: .* its type will be overridden"  # the vocabulary fix-up, done
)


class _ThreadLog(threading.local):
    """Per thread: the record being assembled and whether a restore attempt is running."""

    def __init__(self) -> None:
        self.level = logging.INFO  # level of the last record; a continuation inherits it
        self.parts: list[str] | None = None  # an unfinished record (no newline yet)
        self.restoring = 0  # depth of restore_attempt() scopes


_thread = _ThreadLog()
_install_lock = threading.Lock()
_installed = False


def _emit(state: _ThreadLog) -> None:
    """Log the assembled record of this thread (if any) and clear it."""
    parts, state.parts = state.parts, None
    if parts is None:
        return
    level = state.level
    echo = _echo()
    if not echo and level < logging.WARNING and not logger.isEnabledFor(level):
        return  # cheap path for the chatter nobody listens to (warnings and errors may be demoted)
    msg = "".join(parts).rstrip()
    if not msg:
        return
    level = state.level = _demoted(level, msg, restoring=state.restoring > 0)
    logger.log(level, "%s", msg)
    if echo:
        sys.stderr.write(msg + "\n")


def _demoted(level: int, msg: str, *, restoring: bool) -> int:
    """The level a message is logged at: expected failures and notices are lowered."""
    if level >= logging.ERROR and restoring and _EXPECTED_IN_RESTORE.search(msg):
        return logging.DEBUG
    if level == logging.WARNING and _NOTICES.search(msg):
        return logging.DEBUG
    return level


def _echo() -> bool:
    """True after a llama-cpp-python `Llama(verbose=True)`: its stderr output is expected."""
    level = _llama_cpp_python_logger.level
    return level != logging.NOTSET and level <= logging.DEBUG


def _on_log(level: int, text: bytes | None, user_data: ctypes.c_void_p | None) -> None:
    """The callback llama.cpp calls, on the thread that logs, with one message or piece."""
    state = _thread
    if level != _CONT:
        _emit(state)  # a new message ends the previous one even without its newline
        state.level = _LEVELS.get(level, logging.INFO)
    if state.parts is None:
        state.parts = []
    piece = (text or b"").decode("utf-8", "replace")
    state.parts.append(piece)
    if piece.endswith("\n"):
        _emit(state)


_CALLBACK = _ll.llama_log_callback(_on_log)
"""The ctypes callback handed to llama.cpp; referenced here so it lives as long as the process."""


def install() -> None:
    """Route llama.cpp's log to `agentmem.llama` (idempotent; called before the first model loads)."""
    global _installed
    with _install_lock:
        if not _installed:
            _ll.llama_log_set(_CALLBACK, ctypes.c_void_p(0))
            _installed = True


@contextlib.contextmanager
def restore_attempt() -> Iterator[None]:
    """Within this block, this thread's expected restore failures are logged at DEBUG.

    Example:
        >>> with restore_attempt():
        ...     pass  # ctx.state_set(seq, blob) == 0 means: make room and retry
    """
    state = _thread
    state.restoring += 1
    try:
        yield
    finally:
        _emit(state)  # an unfinished message from inside still counts as inside
        state.restoring -= 1
