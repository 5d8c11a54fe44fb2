"""`ModelSpec`: one model of a `MemoryPool` — its GGUF, its pool options, where its weights sit.

A spec is typed, keyword-only and serializable (`to_dict` / `from_dict`), like
`PoolConfig`; the options are `PoolConfig` fields and override the model pool's base
config for this model alone (a bigger `n_ctx` for the coder, fewer resident agents for
the planner).

>>> spec = ModelSpec(name="planner", model="gemma-3-270m", options={"n_ctx": 4096})
>>> spec.to_dict()
{'name': 'planner', 'model': 'gemma-3-270m', 'options': {'n_ctx': 4096}}
>>> ModelSpec(name="bad name!", model="x")
Traceback (most recent call last):
...
agentmem.errors.ConfigError: models: a model name is 1-64 characters of letters, digits, '.', '_', '-', ':', got 'bad name!'
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from agentmem.config import PoolConfig
from agentmem.errors import ConfigError

__all__ = ["ModelSpec", "footprint", "specs_of"]

_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")
# per-model options that the model pool owns (one archive file per model, its own path)
_RESERVED = frozenset({"model_path", "archive_path", "archive_url"})
_FIELDS = frozenset(f.name for f in dataclasses.fields(PoolConfig))


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One model of a `MemoryPool`.

    Attributes:
        name: what requests and bindings call it (`model` in a request).
        model: a bundled model's name or a GGUF path.
        options: `PoolConfig` fields for this model (`n_ctx`, `resident_agents`,
            `n_gpu_layers`, `park_codec`, ...); `model_path` and the archive are the
            model pool's.
    """

    name: str
    model: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigError(f"models: a model name is 1-64 characters of letters, digits, '.', '_', '-', ':', "
                              f"got {self.name!r}")
        if not isinstance(self.model, str) or not self.model:
            raise ConfigError(f"models[{self.name!r}]: model must be a bundled model's name or a GGUF path")
        if not isinstance(self.options, Mapping):
            raise ConfigError(f"models[{self.name!r}].options must be a mapping of PoolConfig fields")
        bad = sorted(set(self.options) - _FIELDS)
        if bad:
            raise ConfigError(f"models[{self.name!r}].options: unknown PoolConfig field(s) {bad}")
        owned = sorted(set(self.options) & _RESERVED)
        if owned:
            raise ConfigError(f"models[{self.name!r}].options: {owned} are set by the model pool, not per model")
        object.__setattr__(self, "options", dict(self.options))

    def config(self, base: PoolConfig, archive_path: str | None) -> PoolConfig:
        """This model's `PoolConfig`: `base`, its options, its GGUF and its own archive file."""
        return base.replace(**{**self.options, "model_path": self.model, "archive_path": archive_path,
                               "archive_url": None})

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "options": dict(self.options)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        unknown = set(data) - {"name", "model", "options"}
        if unknown:
            raise ConfigError(f"models: unknown ModelSpec field(s) {sorted(unknown)}")
        return cls(name=data.get("name", ""), model=data.get("model", ""), options=data.get("options") or {})


def specs_of(models: Mapping[str, str | os.PathLike[str] | ModelSpec]) -> dict[str, ModelSpec]:
    """`{name: ModelSpec}` from `{name: bundled name | GGUF path | ModelSpec}`."""
    if not isinstance(models, Mapping) or not models:
        raise ConfigError("models must be a non-empty mapping of name -> model (a bundled name, a path or a ModelSpec)")
    out: dict[str, ModelSpec] = {}
    for name, value in models.items():
        if isinstance(value, ModelSpec):
            if value.name != name:
                raise ConfigError(f"models[{name!r}]: the ModelSpec is named {value.name!r}")
            out[name] = value
        elif isinstance(value, (str, os.PathLike)):
            out[name] = ModelSpec(name=name, model=os.fspath(value))
        else:
            raise ConfigError(f"models[{name!r}] must be a bundled model's name, a GGUF path or a ModelSpec")
    return out


def footprint(model_path: Path, cfg: PoolConfig, kv_bytes_per_cell: int) -> tuple[int, int]:
    """`(weights bytes, live-context bytes)` of a loaded model: the GGUF file and `n_ctx` KV cells.

    Weights are mmap'd: resident once touched, so the file size is what loading costs.
    With `n_gpu_layers != 0` both sit in VRAM (the offloaded share of the weights; all of the
    live KV), which `ModelTier` counts against the VRAM budget instead of RAM.
    """
    return model_path.stat().st_size, int(cfg.n_ctx) * int(kv_bytes_per_cell)
