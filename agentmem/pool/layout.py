"""The KV layout of a pool's context: one unified cache, or one KV stream per sequence.

In a unified cache (`kv_unified=True`) every decode attends over every occupied cell
(other sequences' cells are masked, not skipped), so each resident agent slows the
others down; a shared prefix there is one set of cells tagged for several sequences
(`seq_cp`). With per-sequence streams (`kv_unified=False`) a decode attends over its
own agent's cells only, each agent holds at most `n_ctx / resident_agents` tokens, and
a `seq_cp` between sequences would copy whole streams (llama.cpp aborts on a partial
one), so the pool copies prefixes through state blobs instead. Per-sequence streams are
also exact: an agent's cells start at slot 0 of its own stream, so its logits are bit
for bit those it has alone, where in a unified cache they move (by rounding) with the
slots its cells take (`benchmarks/isolation.py`, docs/fidelity.md).

`choose_kv_layout` resolves `PoolConfig.kv_layout`; `"auto"` follows the rule below,
taken from `benchmarks/resident_scaling.py` (tables in docs/architecture.md).

>>> from agentmem.config import PoolConfig
>>> choose_kv_layout(PoolConfig())  # every agent may fill the context: only a unified cache allows that
'unified'
>>> choose_kv_layout(PoolConfig(n_ctx=16384, resident_agents=8, agent_capacity=2048))
'per_sequence'
>>> choose_kv_layout(PoolConfig(n_ctx=4096, resident_agents=2, agent_capacity=2048))
'unified'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentmem.config import PoolConfig

__all__ = ["PER_SEQUENCE_FROM", "choose_kv_layout", "stream_cells"]

#: Resident agents from which `"auto"` picks per-sequence streams (when every agent's
#: capacity fits its stream). From `benchmarks/resident_scaling.py` (docs/kv-layout.md):
#: with ~1,500-token agents on Gemma 3 270M a turn's CPU time in the unified cache grew
#: 3-4 % by 4-8 resident agents while a per-sequence stream's stayed flat (per-sequence
#: 4 % cheaper at 4, 5 % at 8); at 1-2 resident agents the two were equal.
PER_SEQUENCE_FROM = 4


def stream_cells(n_ctx: int, resident_agents: int) -> int:
    """Cells of one per-sequence stream, as llama.cpp sizes it (`n_ctx / n_seq_max`, padded to 256)."""
    n = n_ctx // resident_agents
    return (n + 255) // 256 * 256


def choose_kv_layout(cfg: PoolConfig) -> str:
    """`"unified"` or `"per_sequence"` for `cfg` (its `kv_layout`, with `"auto"` resolved).

    `"auto"` picks `"per_sequence"` when both hold:

    * `resident_agents >= PER_SEQUENCE_FROM`: enough agents resident that attending
      over each other's cells costs more than it saves;
    * `agent_capacity` is set and fits one stream (`agent_capacity <= n_ctx /
      resident_agents`): with `agent_capacity=0` any agent may fill the whole context,
      which only a unified cache allows.

    Otherwise `"unified"`.
    """
    if cfg.kv_layout != "auto":
        return cfg.kv_layout
    if cfg.resident_agents < PER_SEQUENCE_FROM or not cfg.agent_capacity:
        return "unified"
    return "per_sequence" if cfg.agent_capacity <= cfg.n_ctx // cfg.resident_agents else "unified"
