"""Which models `agentmem serve` serves: `--model` (repeatable) and `--models-dir` → `ServedModels`.

One model (one `--model`, or a `--models-dir` holding one GGUF) is served as always, by
one `MemoryPool`. Several are a `MemoryPool` of several models under one memory budget (`--ram-budget`):

```bash
agentmem serve --model gemma-3-270m --model qwen2.5-coder-0.5b-instruct --ram-budget 800000000 \\
    --archive team-archive/          # with several models --archive is a directory: one <model>.db each
agentmem serve --models-dir /models  # every *.gguf there, named by its file stem, in name order
```

A model's name — what a request's `model` says — is a bundled model's name, or a GGUF
file's stem. The first `--model` (else the first GGUF of `--models-dir`) is the default:
the model of a request that names none.

>>> served = models_of(["gemma-3-270m", "/m/Qwen2.5-Coder.gguf"], None)
>>> served
{'gemma-3-270m': 'gemma-3-270m', 'Qwen2.5-Coder': '/m/Qwen2.5-Coder.gguf'}
>>> models_of(["/a/x.gguf", "/b/x.gguf"], None)
Traceback (most recent call last):
...
agentmem.errors.ConfigError: --model: two models are named 'x' (/a/x.gguf and /b/x.gguf); rename one file
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from agentmem.config import PoolConfig
from agentmem.errors import ConfigError

__all__ = ["ServedModels", "models_of"]


def _name(model: str) -> str:
    from agentmem.model import BUNDLED_MODELS

    return model if model in BUNDLED_MODELS else Path(model).stem


def models_of(models: Sequence[str] | None, models_dir: str | None) -> dict[str, str]:
    """`{name: bundled name or GGUF path}` of `--model` values then `--models-dir`'s GGUFs (the first: the default).

    Raises:
        ConfigError: two models with one name, a `--models-dir` that is not a directory or holds no GGUF.
    """
    values = list(models or [])
    if models_dir is not None:
        root = Path(models_dir).expanduser()
        if not root.is_dir():
            raise ConfigError(f"--models-dir: {models_dir} is not a directory")
        found = sorted(str(p) for p in root.glob("*.gguf") if p.is_file())
        if not found:
            raise ConfigError(f"--models-dir: no *.gguf file in {models_dir}")
        values += found
    out: dict[str, str] = {}
    for value in values:
        name = _name(value)
        if name in out and out[name] != value:
            raise ConfigError(f"--model: two models are named {name!r} ({out[name]} and {value}); rename one file")
        out[name] = value
    return out


@dataclass(frozen=True, kw_only=True)
class ServedModels:
    """Several models for `agentmem serve`: what `cli.build` makes of the flags, `open` gives the `MemoryPool`.

    Attributes:
        models: `{name: bundled name or GGUF path}`, the default first.
        config: the `PoolConfig` every model starts from (`--n-ctx`, `--resident`, `--pool-option`, ...).
        ram_budget_bytes: `--ram-budget` (`0`: no limit, every model stays loaded once used).
        vram_budget_bytes: `--vram-budget` (models with `n_gpu_layers != 0`; `0`: no limit).
        unload_policy: `--unload-policy` (`cost` or `lru`).
        archive_dir: `--archive` as a directory (one `<model>.db` each); `None`: a temporary one.
        load_wait_s: `--load-wait`: how long a call waits for the models in use to make room for its
            model (then a 503 `model_unavailable` with `Retry-After`).
    """

    models: dict[str, str]
    config: PoolConfig
    ram_budget_bytes: int = 0
    vram_budget_bytes: int = 0
    unload_policy: str = "cost"
    archive_dir: str | None = None
    load_wait_s: float = 60.0
    preload: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        from agentmem.models.specs import specs_of

        try:
            specs_of(self.models)
        except ConfigError as exc:
            raise ConfigError(f"--model: {exc}") from exc
        if self.archive_dir is not None and Path(self.archive_dir).is_file():
            raise ConfigError(f"--archive: with several models it is a directory (one <model>.db each), and "
                              f"{self.archive_dir} is a file")

    @property
    def default(self) -> str:
        return next(iter(self.models))

    @property
    def archive_path(self) -> str | None:
        """Where the agents are kept (for `--durability call`'s check): the archive directory."""
        return self.archive_dir

    def open(self, tenants: Sequence[str] = ()) -> Any:
        """The `MemoryPool` of the models (the default one loaded, so a missing or broken model fails at start)."""
        from agentmem import MemoryPool

        config = self.config.replace(tenants=tuple(dict.fromkeys(self.config.tenants + tuple(tenants))))
        return MemoryPool(models=self.models, ram_budget_bytes=self.ram_budget_bytes,
                          vram_budget_bytes=self.vram_budget_bytes,
                          archive_dir=None if self.archive_dir is None else os.fspath(self.archive_dir), config=config,
                          unload_policy=self.unload_policy, preload=self.preload or (self.default,),
                          load_wait_s=self.load_wait_s)
