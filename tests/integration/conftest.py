"""Fixtures for integration tests on the real bundled models.

Every test that takes `default_model_path` runs once per bundled model: Gemma 3 270M
(base, Q4_K_M; the default, always installed by `agentmem-kv[model]`) and
Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, `agentmem-kv[instruct]`), which is skipped with a
reason when its extra is absent. pytest orders the tests so each model's module
fixtures (pools) are built once per model. Each installed bundled model's weights are
loaded once for the session (`_held_weights`): every pool a test opens on it runs its own
context on those weights (`agentmem.engine.shared_weights`) instead of loading the file again.

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
from typing import Iterator

import pytest

from agentmem.config import default_gpu_layers
from agentmem.engine import shared_weights
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


@pytest.fixture(scope="session", autouse=True)
def _held_weights() -> Iterator[None]:
    """Hold each installed bundled model's weights for the session: pools reuse them, no test reloads them.

    Only the weights are shared (read-only in llama.cpp): every pool still builds its own context,
    KV cache and state, so a test sees nothing another left behind.
    """
    held = []
    for name in REAL_MODELS:
        try:
            path = resolve_model_path(name)
        except ModelNotFoundError:
            continue  # the test that needs it skips (or fails, for the default model) with the reason
        held.append(shared_weights.acquire(path, n_gpu_layers=default_gpu_layers()))
    yield
    for model in held:
        shared_weights.release(model)
