"""Typed, keyword-only, serializable configuration of a :class:`~agentmem.MemoryPool`.

>>> cfg = PoolConfig(n_ctx=4096, resident_agents=2)
>>> PoolConfig.from_dict(cfg.to_dict()) == cfg
True
>>> PoolConfig(resident_agents=0)
Traceback (most recent call last):
...
agentmem.errors.ConfigError: resident_agents must be >= 1, got 0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from agentmem.errors import ConfigError

__all__ = ["PoolConfig"]

_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """Settings of a memory pool. Every field is keyword-only and JSON-friendly.

    Attributes:
        model_path: GGUF file; ``None`` = ``AGENTMEM_MODEL`` or the bundled default model.
        n_ctx: KV cells of the shared context (all resident agents together).
        resident_agents: agents that keep a live llama.cpp sequence at once
            (``n_seq_max``); others are parked in RAM and restored on demand.
        agent_capacity: tokens one agent may hold (``0`` = ``n_ctx``); a longer
            prompt raises :class:`~agentmem.errors.ContextOverflowError`.
        n_batch: tokens per ``llama_decode`` call (prefill chunk size).
        n_ubatch: physical micro-batch size.
        n_threads: CPU threads (``0`` = all cores).
        n_gpu_layers: layers offloaded on CUDA/Metal builds (``-1`` = all).
        flash_attn: enable flash attention (required for a quantized V cache).
        type_k: element type of the live K cache (``f16``, ``q8_0``, ``q4_0`` ...).
        type_v: element type of the live V cache.
        swa_full: keep full-size sliding-window layers (needed for partial
            ``seq_rm`` and position shifts on Gemma 3).
        chat_format: ``auto``, ``gemma``, ``chatml`` or ``jinja``.
        park_codec: how parked states are stored in RAM: ``f16`` (as llama.cpp
            returns them), ``q8_0``, ``q4_0`` or ``K/V`` such as ``q8_0/q4_0``.
        park_rotate: Hadamard-rotate rows before 4-bit parking.
        seed: default sampling seed.
    """

    model_path: str | None = None
    n_ctx: int = 8192
    resident_agents: int = 4
    agent_capacity: int = 0
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 0
    n_gpu_layers: int = 0
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = True
    chat_format: str = "auto"
    park_codec: str = "f16"
    park_rotate: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("n_ctx", "resident_agents", "n_batch", "n_ubatch"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be >= 1, got {v!r}")
        for name in ("agent_capacity", "n_threads"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name} must be a non-negative int, got {v!r}")
        if self.resident_agents > 256:
            raise ConfigError(f"resident_agents must be <= 256 (llama.cpp's LLAMA_MAX_SEQ), got {self.resident_agents}")
        if self.n_batch < 32:
            raise ConfigError(f"n_batch must be >= 32, got {self.n_batch}")
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in _KV_TYPES:
                raise ConfigError(f"{name} must be one of {', '.join(_KV_TYPES)}, got {getattr(self, name)!r}")
        if self.type_v not in ("f16", "f32", "bf16") and not self.flash_attn:
            raise ConfigError(f"type_v={self.type_v!r} needs flash_attn=True (llama.cpp cannot quantize V without it)")
        if self.agent_capacity > self.n_ctx:
            raise ConfigError(f"agent_capacity ({self.agent_capacity}) must be <= n_ctx ({self.n_ctx})")

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON-serializable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error naming them."""
        return cls.build(**dict(data))

    @classmethod
    def build(cls, **kwargs: Any) -> PoolConfig:
        """Like the constructor, but an unknown key raises :class:`ConfigError` listing the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ConfigError(f"unknown pool option(s) {unknown}; valid: {', '.join(sorted(names))}")
        return cls(**kwargs)

    def replace(self, **changes: Any) -> PoolConfig:
        """A copy with some fields changed (validated)."""
        base = self.to_dict()
        base.update(changes)
        return PoolConfig.build(**base)
