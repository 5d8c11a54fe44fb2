"""`MemoryPool.stats()`: one shape for a pool of one model or of many.

Each loaded model's engine reports `ModelEngine.stats()` (`agents`, `tiers`, `totals`, `shared`,
`hints`). The pool reports the same five keys pool-wide, plus `models`, `pools` (each loaded
model's own report), `budget` and `workflow`, whatever the number of models, so a caller never
branches on the pool's kind. The pool-wide keys merge the engines' reports:

* `agents`, `shared["blocks"]`: the union, each entry tagged with its `model` (an agent lives on
  one model; a block id two models share is suffixed `@model`);
* numbers are summed (`n_ctx` is the context cells of all loaded models together), rates are
  recomputed from the summed counts, lists concatenated, a text kept where the models agree and
  `"mixed"` where they do not.

For a pool of one model the pool-wide keys equal the engine's, with `model` added to each agent.

>>> a = {"calls": 2, "prefetch_hits": 1, "prefetch_misses": 1, "prefetch_hit_rate": 0.5, "kv_layout": "unified"}
>>> b = {"calls": 3, "prefetch_hits": 0, "prefetch_misses": 2, "prefetch_hit_rate": 0.0, "kv_layout": "unified"}
>>> s = merged({"a": {"totals": a}, "b": {"totals": b}})
>>> s["totals"]["calls"], s["totals"]["prefetch_hit_rate"], s["totals"]["kv_layout"]
(5, 0.25, 'unified')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["POOL_WIDE", "merged"]

#: The keys every `ModelEngine.stats()` has, reported pool-wide by `MemoryPool.stats()`.
POOL_WIDE = ("agents", "tiers", "totals", "shared", "hints")

# rate = numerator / denominator, recomputed after summing (a sum of rates means nothing)
_RATES = {
    ("totals", "prefetch_hit_rate"): (("prefetch_hits",), ("prefetch_hits", "prefetch_misses")),
    ("hints", "hit_rate"): (("hits",), ("expected",)),
}
# per-model figures that neither add up nor concatenate: the mean over the loaded models
_MEANS = {("hints", "restore_ms_per_1k_tokens")}
_TAGGED = {("agents",), ("shared", "blocks")}


def merged(pools: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The pool-wide `agents`, `tiers`, `totals`, `shared` and `hints` of each engine's `stats()`.

    Args:
        pools: each loaded model's `ModelEngine.stats()`, by model name (may be empty).

    Returns:
        One dictionary with the `POOL_WIDE` keys (empty dictionaries where no model is loaded).
    """
    out: dict[str, Any] = {k: {} for k in POOL_WIDE}
    n = {k: 0 for k in _MEANS}
    for name, st in pools.items():
        for key in POOL_WIDE:
            if key in st:
                out[key] = _merge(out[key], st[key], (key,), name, n)
    for (section, key), (num, den) in _RATES.items():
        sec = out[section]
        if key in sec:
            d = sum(sec.get(k, 0) for k in den)
            sec[key] = sum(sec.get(k, 0) for k in num) / d if d else 0.0
    for section, key in _MEANS:
        if key in out[section] and n[(section, key)]:
            out[section][key] /= n[(section, key)]
    return out


def _merge(into: Any, value: Any, path: tuple[str, ...], model: str, n: dict[tuple[str, ...], int]) -> Any:
    if path in _TAGGED:
        acc = dict(into) if isinstance(into, Mapping) else {}
        for k, entry in value.items():
            acc[k if k not in acc else f"{k}@{model}"] = {**entry, "model": model}
        return acc
    if isinstance(value, Mapping):
        acc = dict(into) if isinstance(into, Mapping) else {}
        for k, v in value.items():
            acc[k] = _merge(acc.get(k, _MISSING), v, (*path, k), model, n)
        return acc
    if path in n:
        n[path] += 1
    if into is _MISSING:
        return list(value) if isinstance(value, list) else value
    if isinstance(value, bool) or isinstance(into, bool):
        return into or value
    if isinstance(value, (int, float)) and isinstance(into, (int, float)):
        return into + value
    if isinstance(value, list) and isinstance(into, list):
        return into + value
    if into is None or value is None:
        return into if value is None else value
    return into if into == value else "mixed"


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
