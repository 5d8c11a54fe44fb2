"""Fixtures for integration tests on the real bundled models.

Every test that takes `default_model_path` runs once per bundled model: Gemma 3 270M
(base, Q4_K_M; the default, always installed by `agentmem-kv[model]`) and
Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, `agentmem-kv[instruct]`), which is skipped with a
reason when its extra is absent. pytest orders the tests so each model's module
fixtures (pools) are built once per model.

Tests that only make sense on one model say so:

* `gemma_model_path`: Gemma only (its turn markup, its sliding window, base-model
  behaviour), with a comment at the test saying why.
* `instruct_model_path`: the instruct model only (what needs an instruct model: its
  native tool calls), skipped with a reason when its extra is absent.
* `@pytest.mark.xfail(reason=..., strict=True)` with `@pytest.mark.xfail_only_on(name, ...)`:
  a known limit of those models; the xfail holds on their runs only and is dropped on the
  others'. Strict (also the default, `xfail_strict` in pyproject.toml): greedy decoding
  with pinned threads is deterministic, so a limit that passes has changed and must be
  looked at; an xfail that passes by chance would say nothing. (A real `xfail` mark, not a custom one: LangChain's standard suite accepts an
  overridden test only if it carries `xfail` with a reason.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmem.errors import ModelNotFoundError
from agentmem.model import BUNDLED_MODELS, DEFAULT_MODEL, resolve_model_path

GEMMA = "gemma-3-270m"
INSTRUCT = "qwen2.5-coder-0.5b-instruct"
REAL_MODELS = [GEMMA, INSTRUCT]
assert set(REAL_MODELS) == set(BUNDLED_MODELS) and DEFAULT_MODEL == GEMMA, "one run per bundled model"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop a test's `xfail` marks on the runs of models its `xfail_only_on` does not name."""
    for item in items:
        only = {name for mark in item.iter_markers("xfail_only_on") for name in mark.args}
        callspec = getattr(item, "callspec", None)
        model = callspec.params.get("real_model_name") if callspec is not None else None
        if only and model is not None and model not in only:
            item.own_markers[:] = [m for m in item.own_markers if m.name != "xfail"]


def _bundled(name: str) -> Path:
    try:
        return resolve_model_path(name)
    except ModelNotFoundError as exc:
        if name == DEFAULT_MODEL:
            raise  # the default model is a test dependency: a missing one is an error, not a skip
        pytest.skip(f"{name} not installed ({BUNDLED_MODELS[name].install_command}): {exc}")


@pytest.fixture(scope="session", params=REAL_MODELS)
def real_model_name(request: pytest.FixtureRequest) -> str:
    """The bundled model this run of the test uses (one run per model)."""
    return str(request.param)


@pytest.fixture(scope="session")
def default_model_path(real_model_name: str) -> Path:
    """The real model under test, assembled once into the cache directory: each bundled model in turn."""
    return _bundled(real_model_name)


@pytest.fixture(scope="session")
def gemma_model_path() -> Path:
    """Gemma 3 270M only, for tests about its own markup, window or base-model behaviour."""
    return _bundled(GEMMA)


@pytest.fixture(scope="session")
def instruct_model_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct only, for tests of what needs an instruct model (native tool calls)."""
    return _bundled(INSTRUCT)
