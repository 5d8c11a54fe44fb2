"""`MemoryPool.stats()`: where every agent's KV lives, per-tier totals, counters, shared blocks.

Pure reads of the pool's state (lock held by the caller).
"""

from __future__ import annotations

from typing import Any

from agentmem.memory.shared import SHARE_PREFIX
from agentmem.memory.tiers import HOT, TIER_NAMES
from agentmem.pool.state import PoolCore

__all__ = ["pool_stats", "shared_stats"]


def pool_stats(core: PoolCore) -> dict[str, Any]:
    """The dictionary `MemoryPool.stats` returns (see its docstring)."""
    cfg = core.config
    agents: dict[str, Any] = {}
    # HOT, then every tier (one the pool lacks, COLD without an archive, reports zeros)
    names = dict.fromkeys((HOT, *TIER_NAMES, *core.tiers))
    tiers = {t: {"agents": 0, "bytes": 0, "hits": core.tier_hits.get(t, 0)} for t in names}
    live = cfg.type_k if cfg.type_k == cfg.type_v else f"{cfg.type_k}/{cfg.type_v}"
    for a in core.agents.values():
        tier, nbytes, codec = core.where(a)
        if a.seq is not None:
            codec = live
        if tier in tiers:
            tiers[tier]["agents"] += 1
            tiers[tier]["bytes"] += nbytes
        agents[a.id] = {
            "tokens": len(a.ledger),
            "live_tokens": a.ledger.n_live,
            "tier": tier,
            "bytes": nbytes,
            "codec": codec,
            "seq": a.seq,
            "priority": a.priority,
            "budget": core.budget(a),
            "share": a.id.startswith(SHARE_PREFIX),
            "block": a.block,
            "regions": a.ledger.region_counts(),
            "evicted_regions": dict(a.evicted_regions),
            **a.counters,
        }
    hot_cells = core.ctx.cells_size() if tiers[HOT]["agents"] else 0
    bpc = core.model.kv_bytes_per_cell(cfg.type_k, cfg.type_v)
    live_cells = sum(a.ledger.n_live for a in core.agents.values() if a.seq is not None)
    totals = dict(core.totals)
    totals.update(
        hot_cells_bytes=hot_cells,
        # what the live agents would occupy without shared cells, minus what they do occupy
        shared_bytes_saved=max(0, live_cells * bpc - hot_cells) if (hot_cells and bpc) else 0,
        agents=len(core.agents),
        resident=tiers[HOT]["agents"],
        **{f"{t}_bytes": v["bytes"] for t, v in tiers.items()},
        n_ctx=core.ctx.n_ctx,
        kv_layout="unified" if core.ctx.params.kv_unified else "per_sequence",
        resident_agents=cfg.resident_agents,
    )
    totals.update((f"recall_{k}", v) for k, v in core.recall.snapshot().items() if isinstance(v, (int, float)))
    p = totals["prefetch_hits"] + totals["prefetch_misses"]
    totals["prefetch_hit_rate"] = totals["prefetch_hits"] / p if p else 0.0
    return {"agents": agents, "tiers": tiers, "totals": totals, "shared": shared_stats(core)}


def shared_stats(core: PoolCore) -> dict[str, Any]:
    """Shared blocks, their references and what they save in the parked tiers."""
    archived = {i.block_id: i.refcount for i in core.archive.list_shared_blocks()} if core.archive else {}
    blocks: dict[str, Any] = {}
    saved = 0
    for b in core.blocks:
        parked = 0
        for x in b.refs:
            m = core.agents.get(x)
            if m is None or m.seq is not None or m.tier not in core.tiers:
                continue
            t = core.tiers[m.tier]
            if t.durable:  # the archive keeps the block's reference with the state
                parked += 1
            else:
                st = t.get(x)
                parked += bool(st is not None and st.block == b.id)
        copies = (b.data is not None) + (b.id in archived)
        saved += max(0, parked - copies) * b.nbytes
        blocks[b.id] = {
            "tokens": b.n_tokens, "refs": len(b.refs), "members": sorted(b.refs), "parked_refs": parked,
            "bytes": b.nbytes, "in_ram": b.data is not None, "in_archive": b.id in archived,
            "archive_refs": archived.get(b.id, 0),
        }
    return {
        "blocks": blocks,
        "ram_bytes": core.blocks.ram_bytes(),
        "archive_bytes": sum(b["bytes"] for b in blocks.values() if b["in_archive"]),
        # parked members' shared cells are stored once per tier instead of once per member (f16 basis)
        "parked_bytes_saved": saved,
    }
