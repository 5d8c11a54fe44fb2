"""The docstring examples of the core library run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import agentmem

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(agentmem.__path__, prefix="agentmem.") if not m.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed in {name}"
