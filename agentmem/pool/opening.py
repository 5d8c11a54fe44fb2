"""Opening a pool: the model, the context, the chat renderer, the archive and tiers, as a `PoolCore`,
and the collaborators of a call wired over it.

`open_core` validates the policy names first (before anything heavy is loaded),
then builds the native handles and the stores, and frees what it built when a later step fails.
`wire` builds the collaborators; a lower one gets a callable, not a reference upward.
"""

from __future__ import annotations

import os

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agentmem.archive import Archive, ArchiveBase, open_archive
from agentmem.config import PoolConfig
from agentmem.engine.renderer import ChatRenderer
from agentmem.engine.context import ContextParams, LlamaContext, LlamaModel, llama_build_info
from agentmem.engine.native_first import backend_name
from agentmem.engine import shared_weights
from agentmem.memory.parking import make_park_codec
from agentmem.memory.tiers import build_tiers
from agentmem.model import model_fingerprint, resolve_model_path
from agentmem.policy.placement import PlacementPolicy, get_policy
from agentmem.pool.blocks import BlockRefs
from agentmem.pool.budgets import Budgets
from agentmem.pool.decoder import Decoder
from agentmem.pool.hints import Hints
from agentmem.pool.kvcapture import SpanCapture
from agentmem.pool.layout import choose_kv_layout
from agentmem.pool.mover import Mover
from agentmem.pool.persist import Persister
from agentmem.pool.residency import Residency
from agentmem.pool.sharing import Sharing
from agentmem.pool.sequence import Sequences
from agentmem.pool.state import AgentState, PoolCore
from agentmem.pool.trimming import Trimmer
from agentmem.pool.turn import TurnRunner
from agentmem.pool.window import window_rules

__all__ = ["Collaborators", "open_core", "wire"]


def open_core(cfg: PoolConfig) -> PoolCore:
    """Everything a pool shares, built from its configuration, in three phases:
    validate the names (nothing heavy loaded yet), open the native handles, open the
    stores; what was built is freed when a later phase fails.

    Raises:
        ModelNotFoundError: no model at the path (or the bundled one is not installed).
        PolicyError: an unknown placement or eviction policy, or codec.
        EngineError: llama.cpp refused the model or the context parameters.
        ChatTemplateError: the GGUF's chat template cannot be compiled.
        ArchiveError: the archive (file or PostgreSQL URL) cannot be opened.
    """
    model_path = resolve_model_path(cfg.model_path)
    placement = _validate_names(cfg)
    unified = choose_kv_layout(cfg) == "unified"
    # the weights are the process's: a pool on a file another pool holds reuses its loaded model
    model = shared_weights.acquire(model_path, n_gpu_layers=cfg.n_gpu_layers)
    ctx: LlamaContext | None = None
    archive: ArchiveBase | None = None
    try:
        ctx = _open_context(model, cfg, unified=unified)
        renderer = ChatRenderer(model, cfg.chat_format)
        fingerprint = _fingerprint(model_path, cfg, unified=unified)
        if cfg.archive_url or cfg.archive_path:  # a shared PostgreSQL database, or a SQLite file
            archive = open_archive(cfg.archive_url or cfg.archive_path)
        tiers = build_tiers(archive=archive, fingerprint=fingerprint, warm_budget_bytes=cfg.warm_budget_bytes,
                            cold_budget_bytes=cfg.cold_budget_bytes)
        # evicted text goes to the archive (FTS5) or to a throwaway in-memory one
        recall_store = archive or Archive(":memory:")
    except BaseException:
        if archive is not None:
            archive.close()
        if ctx is not None:
            ctx.close()
        shared_weights.release(model)
        raise
    return PoolCore(
        config=cfg, model_path=model_path, model=model, ctx=ctx, renderer=renderer, tiers=tiers, archive=archive,
        recall_store=recall_store, placement=placement, fingerprint=fingerprint,
        capacity=min(cfg.agent_capacity or cfg.n_ctx, ctx.n_ctx_seq),
    )


def _validate_names(cfg: PoolConfig) -> PlacementPolicy:
    """The placement policy, after checking every policy and codec name (before anything heavy is loaded)."""
    placement = get_policy(cfg.placement, warm_codec=cfg.park_codec, cold_codec=cfg.cold_codec,
                           **({"background_codec": cfg.background_codec} if cfg.placement == "cost" else {}))
    if cfg.agent_budget_tokens:
        PoolCore.eviction_policy(cfg.eviction)
    for spec in {cfg.park_codec, cfg.cold_codec, cfg.background_codec}:
        make_park_codec(spec, rotate=cfg.park_rotate)
    return placement


def _open_context(model: LlamaModel, cfg: PoolConfig, *, unified: bool) -> LlamaContext:
    """The shared llama.cpp context: one sequence per resident agent, in the chosen KV layout.

    Plus one where recall as KV runs (`PoolConfig.recall_kv`, `agentmem.pool.kvcapture`):
    the scratch sequence a span's cells pass through, never an agent's. Only a unified cache
    gets it, and llama.cpp allows 256 sequences; under `auto` only a model without a sliding
    window (there, spliced cells measured no faster and far off the re-prefill: see
    `SpanCapture`), under `True` one keeping every cell (`swa_full`).
    """
    whole = model.n_swa == 0 or (cfg.recall_kv is True and cfg.swa_full)
    scratch = bool(cfg.recall_kv and unified and cfg.resident_agents < 256 and whole)
    return LlamaContext(
        model,
        ContextParams(
            n_ctx=cfg.n_ctx,
            n_seq_max=cfg.resident_agents + scratch,
            n_batch=cfg.n_batch,
            n_ubatch=min(cfg.n_ubatch, cfg.n_batch),
            n_threads=cfg.n_threads,
            flash_attn=cfg.flash_attn,
            type_k=cfg.type_k,
            type_v=cfg.type_v,
            swa_full=cfg.swa_full,
            kv_unified=unified,
        ),
    )


def _fingerprint(model_path: Path, cfg: PoolConfig, *, unified: bool) -> dict[str, Any]:
    """What a stored state must match to be loaded into this context (model, KV types, layout, llama.cpp build),
    and the backend it was computed on (`CPU`, `CUDA`...), which need not match: the blob's bytes are the same on
    every backend (`agentmem.engine.native_first.backend_name`)."""
    return {
        "backend": backend_name(cfg.n_gpu_layers),
        "model": model_fingerprint(model_path),
        "type_k": cfg.type_k,
        "type_v": cfg.type_v,
        "flash_attn": cfg.flash_attn,
        "swa_full": cfg.swa_full,
        "n_seq_max": cfg.resident_agents,
        "kv_unified": unified,
        "llama": llama_build_info(),
        **_kv_rotation(cfg),
    }


_UNROTATED_KV = frozenset({"f16", "f32", "bf16"})


def _kv_rotation(cfg: PoolConfig) -> dict[str, str]:
    """llama.cpp's own KV rotation, where it changes the stored bytes (issue #35).

    llama.cpp 0.3.36 Hadamard-rotates a *quantized* K/V cache (head dim >= 64) unless
    `LLAMA_ATTN_ROT_DISABLE` is set when the context is created; a state written one way and
    read the other restores silently wrong. Recorded only for quantized caches, so f16
    archives keep their fingerprint; the raw value is kept (any difference is refused).
    """
    if cfg.type_k in _UNROTATED_KV and cfg.type_v in _UNROTATED_KV:
        return {}
    value = os.environ.get("LLAMA_ATTN_ROT_DISABLE")
    return {"kv_rot": "default" if value is None else f"LLAMA_ATTN_ROT_DISABLE={value}"}


@dataclass(frozen=True, slots=True)
class Collaborators:
    """The objects that run a call, built once per pool by `wire`."""

    blocks: BlockRefs
    persist: Persister
    residency: Residency
    mover: Mover
    budgets: Budgets
    sharing: Sharing
    decoder: Decoder
    turns: TurnRunner
    hints: Hints
    span_kv: SpanCapture


def wire(core: PoolCore, *, after_call: Callable[[str], None]) -> Collaborators:
    """Build the collaborators of a call over `core`; `after_call` runs the housekeeping of a finished call."""
    blocks = BlockRefs(core)
    persist = Persister(core, blocks)

    def park_victim(victim: AgentState) -> None:
        # park an idle resident agent into the first tier (WARM) to free its sequence or cells
        mover.park(victim)
        budgets.rebalance(urgent_only=True)

    hints = Hints()
    # the door to each agent's KV, its sliding-window rules chosen once for the model
    seqs = Sequences(core.ctx, blocks, core.totals, window=window_rules(core.ctx, core.model.n_swa))
    residency = Residency(core, seqs, park=park_victim, hints=hints)
    mover = Mover(core, residency, blocks, persist)
    budgets = Budgets(core, mover, hints)
    sharing = Sharing(core, residency, mover, blocks)
    span_kv = SpanCapture(core)  # recall as KV: evicted spans' cells kept beside their text
    decoder = Decoder(core, residency, Trimmer(core, span_kv))
    turns = TurnRunner(core, mover=mover, sharing=sharing, decoder=decoder, after_call=after_call)
    return Collaborators(blocks, persist, residency, mover, budgets, sharing, decoder, turns, hints, span_kv)
