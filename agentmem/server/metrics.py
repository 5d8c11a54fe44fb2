"""`/metrics`: Prometheus text through `prometheus-client`, one registry per app.

Series named like llama-server's where the meaning matches, so its dashboards work:

| series | meaning |
|---|---|
| `llamacpp:prompt_tokens_total` | prompt tokens decoded (prefilled) — cached ones are not decoded |
| `llamacpp:prompt_seconds_total` | seconds spent prefilling and restoring prompts |
| `llamacpp:tokens_predicted_total` | generated tokens |
| `llamacpp:tokens_predicted_seconds_total` | seconds spent generating |
| `llamacpp:prompt_tokens_seconds` | average prefill throughput (tokens/s) |
| `llamacpp:predicted_tokens_seconds` | average generation throughput (tokens/s) |
| `llamacpp:requests_processing` | requests being served now |
| `llamacpp:requests_deferred` | requests waiting for their agent (another call of it runs) |

and `agentmem_*` series: kept by the server (`agentmem_requests_total{model,route,status}`,
`agentmem_ttft_seconds{model,kv}` per call, `agentmem_prompt_tokens_cached_total{model}`,
`agentmem_prompt_tokens_prefilled_total{model}`, `agentmem_client_disconnects_total`,
`agentmem_conversations_total{action}`: anonymous conversations parked or forgotten by the
lifecycle) and read from `MemoryPool.stats()` at scrape time (`agentmem_agents`, `agentmem_tier_agents{tier}`,
`agentmem_tier_bytes{tier}`, `agentmem_restores_total{tier}`, `agentmem_kv_reuses_total`,
`agentmem_parks_total`, `agentmem_demotions_total`, `agentmem_drops_total`,
`agentmem_prefetch_hits_total`, `agentmem_prefetch_misses_total`, `agentmem_evictions_total`,
`agentmem_evicted_tokens_total`, `agentmem_shared_prefix_tokens_total`, `agentmem_handoffs_total`, ...).

With several models (`agentmem serve --model A --model B`) every pool series carries a
`model` label (one series per loaded model; an unloaded model has none), and per-model
series say where the weights are: `agentmem_model_loaded{model}` (1/0),
`agentmem_model_bytes{model,kind}` (`weights`, `context`), `agentmem_model_agents{model}`,
`agentmem_model_in_use{model}`, `agentmem_model_loads_total{model}`,
`agentmem_model_unloads_total{model}`, `agentmem_model_prefetch_loads_total{model}`.

The server's call-level series (the `llamacpp:` token and time counters and throughputs,
`agentmem_prompt_tokens_*`, `agentmem_ttft_seconds`, `agentmem_requests_total`) carry a
`model` label too, with one model as with several: the model the call ran on (the
engine's runner of that model), a request's the model it was seated on (`note_model`).
Label values come from the server's configured names only (`model_names`), never from a
request: a name outside them counts under `model=""`, as does a request that picked no
model with several (`/health`, an unknown model's 404; with one model it is that model).
Every configured model has its call series from the start (zeros). `llamacpp:requests_*`
and `agentmem_client_disconnects_total` stay server-wide.

Who may read it: every caller on a server without keys; with keys, admin keys only
(`metrics_public=True` opens it to every valid key): the series aggregate all tenants.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
from collections import Counter
from contextvars import ContextVar
from typing import Any, Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from agentmem.memory.tiers import HOT
from agentmem.pool import ChatResult

__all__ = ["CONTENT_TYPE", "TTFT_BUCKETS", "ServerMetrics", "note_model", "request_model"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of the `agentmem_ttft_seconds` buckets."""

# pool totals exported as counters: series name -> key of stats()["totals"]
_POOL_COUNTERS = {
    "agentmem_parks": ("parks", "Agents parked out of a live sequence."),
    "agentmem_demotions": ("demotions", "Parked states demoted from WARM to COLD."),
    "agentmem_drops": ("drops", "Parked states dropped over a budget (they re-prefill)."),
    "agentmem_restore_failures": ("restore_failures", "Restores that fell back to re-prefill."),
    "agentmem_prefetches": ("prefetches", "Agents restored ahead of their call."),
    "agentmem_prefetch_hits": ("prefetch_hits", "Calls whose agent a prefetch had restored."),
    "agentmem_prefetch_misses": ("prefetch_misses", "Calls of parked agents no prefetch had restored."),
    "agentmem_evictions": ("evictions", "Eviction passes over agents' KV."),
    "agentmem_evicted_tokens": ("evicted_tokens", "Tokens evicted (archived for recall)."),
    "agentmem_pool_cached_tokens": ("cached_tokens", "Prompt tokens whose KV the pool reused (all callers)."),
    "agentmem_pool_prefill_tokens": ("prefill_tokens", "Prompt tokens the pool decoded (all callers)."),
    "agentmem_shared_prefix_tokens": ("shared_prefix_tokens", "Prompt tokens taken from another agent's KV."),
    "agentmem_handoffs": ("handoffs", "Handoffs between agents."),
    "agentmem_batched_steps": ("batched_steps", "Decode steps that served several agents at once."),
    "agentmem_recalls": ("recalls", "Recall searches."),
    "agentmem_recall_kv_stored": ("recall_kv_stored", "Evicted spans whose KV cells were kept for recall as KV."),
    "agentmem_recall_kv_spliced_tokens": ("recall_kv_spliced_tokens",
                                          "Prompt tokens put in as a recalled span's kept cells instead of a prefill."),
}

# the server's call series, labelled by model: key -> (kind, name, help)
_CALL_SERIES: dict[str, tuple[type, str, str]] = {
    "prefilled": (CounterMetricFamily, "llamacpp:prompt_tokens", "Number of prompt tokens processed."),
    "prompt_s": (CounterMetricFamily, "llamacpp:prompt_seconds", "Prompt process time (prefill and restore)."),
    "predicted": (CounterMetricFamily, "llamacpp:tokens_predicted", "Number of generation tokens processed."),
    "predicted_s": (CounterMetricFamily, "llamacpp:tokens_predicted_seconds", "Predict process time."),
    "prompt_rate": (GaugeMetricFamily, "llamacpp:prompt_tokens_seconds", "Average prompt throughput in tokens/s."),
    "predicted_rate": (GaugeMetricFamily, "llamacpp:predicted_tokens_seconds",
                       "Average generation throughput in tokens/s."),
    "cached": (CounterMetricFamily, "agentmem_prompt_tokens_cached",
               "Prompt tokens served from kept KV (not decoded)."),
    "decoded": (CounterMetricFamily, "agentmem_prompt_tokens_prefilled", "Prompt tokens decoded."),
}

# the model the HTTP request in this context was seated on: a cell the middleware owns, filled below it
_REQUEST_MODEL: ContextVar[list[str] | None] = ContextVar("agentmem_request_model", default=None)


@contextlib.contextmanager
def request_model() -> Iterator[list[str]]:
    """The block of one HTTP request: yields the cell `note_model` fills with the model it ran on.

    A cell, not the variable's value, so a model noted in a task the request spawned (whose
    context is a copy) still reaches the middleware.
    """
    cell: list[str] = []
    token = _REQUEST_MODEL.set(cell)
    try:
        yield cell
    finally:
        _REQUEST_MODEL.reset(token)


def note_model(name: str) -> None:
    """Say which model the current HTTP request runs on (`agentmem_requests_total{model}`); no-op outside one."""
    cell = _REQUEST_MODEL.get()
    if cell is not None:
        cell[:] = [name]


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, x: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, x)] += 1
        self.sum += x

    def cumulative(self) -> list[tuple[str, float]]:
        out, acc = [], 0
        for bound, n in zip([*map(str, self.bounds), "+Inf"], self.counts):
            acc += n
            out.append((bound, acc))
        return out


class ServerMetrics:
    """Counters the server keeps, and the collector that renders them with the pool's stats.

    Args:
        pool_stats: returns `MemoryPool.stats()`, or `None` while no pool is open.
        processing: returns the number of requests being served.
        deferred: returns the number of requests waiting for their agent.
        models: several models: returns `(MemoryPool.models(), {model: ModelEngine.stats()}
            of the loaded ones)`; the pool series are then labelled by model.
        model_names: returns the configured model names, the only values of the call series'
            `model` label (default: none, every call under `model=""`).
    """

    def __init__(
        self,
        pool_stats: Callable[[], dict[str, Any] | None],
        *,
        processing: Callable[[], int],
        deferred: Callable[[], int],
        models: Callable[[], tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]] | None = None,
        model_names: Callable[[], Sequence[str]] = tuple,
    ) -> None:
        self._pool_stats, self._processing, self._deferred = pool_stats, processing, deferred
        self._models, self._names = models, model_names
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str, str]] = Counter()  # (model, route, status)
        self.tokens: Counter[tuple[str, str]] = Counter()  # (model, prompt_prefilled|prompt_cached|predicted)
        self.seconds: Counter[tuple[str, str]] = Counter()  # (model, prompt|predicted)
        self.disconnects = 0
        self.conversations: Counter[str] = Counter()  # lifecycle actions: parked, forgotten_idle, forgotten_cap
        self.ttft: dict[tuple[str, str], _Histogram] = {}  # (model, kv)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # ------------------------------------------------------------------ recording
    def _label(self, model: str | None) -> str:
        """The `model` label of a call or request: a configured name, else `""` (one model: that one)."""
        names = tuple(self._names())
        if model is None and len(names) == 1:
            return names[0]
        return model if model in names else ""

    def observe_call(self, result: ChatResult, *, model: str | None = None) -> None:
        """Count one pool call's tokens and times under the model it ran on."""
        u, t, m = result.usage, result.timings, self._label(model)
        with self._lock:
            self.tokens[(m, "prompt_prefilled")] += u.prompt_tokens - u.cached_tokens
            self.tokens[(m, "prompt_cached")] += u.cached_tokens
            self.tokens[(m, "predicted")] += u.completion_tokens
            self.seconds[(m, "prompt")] += t.prefill_s + t.restore_s
            self.seconds[(m, "predicted")] += t.decode_s
            self.ttft.setdefault((m, result.kv), _Histogram(TTFT_BUCKETS)).observe(t.ttft_s)

    def observe_request(self, route: str, status: int, *, model: str | None = None) -> None:
        """Count one answered request (`model`: the one it was seated on; `None`: it picked none)."""
        m = self._label(model)
        with self._lock:
            self.requests[(m, route, str(status))] += 1

    def observe_disconnect(self) -> None:
        """Count a client that went away mid-stream."""
        with self._lock:
            self.disconnects += 1

    def observe_conversation(self, action: str) -> None:
        """Count one lifecycle action on an anonymous conversation (`server.lifecycle`)."""
        with self._lock:
            self.conversations[action] += 1

    def render(self) -> bytes:
        """The Prometheus text (blocking: reads the pool's stats under its lock)."""
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ collector protocol
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            tokens, seconds, disconnects = dict(self.tokens), dict(self.seconds), self.disconnects
            requests = dict(self.requests)
            conversations = dict(self.conversations)
            ttft = {k: (h.cumulative(), h.sum) for k, h in self.ttft.items()}
        models = sorted({*self._names(), *(m for m, _ in tokens)})
        yield from _call_series(models, tokens, seconds)
        yield GaugeMetricFamily("llamacpp:requests_processing", "Number of requests processing.",
                                value=self._processing())
        yield GaugeMetricFamily("llamacpp:requests_deferred", "Number of requests deferred (waiting for their agent).",
                                value=self._deferred())
        yield CounterMetricFamily("agentmem_client_disconnects", "Streams whose client went away.", value=disconnects)
        conv = CounterMetricFamily("agentmem_conversations", "Anonymous conversations parked or forgotten by policy.",
                                   labels=["action"])
        for action in ("parked", "forgotten_idle", "forgotten_cap"):
            conv.add_metric([action], conversations.get(action, 0))
        yield conv
        req = CounterMetricFamily("agentmem_requests", "HTTP requests answered.", labels=["model", "route", "status"])
        for key, n in sorted(requests.items()):
            req.add_metric(list(key), n)
        yield req
        hist = HistogramMetricFamily("agentmem_ttft_seconds", "Time to first token of one pool call, by how its KV was found.",
                                     labels=["model", "kv"])
        for (model, kv), (buckets, total) in sorted(ttft.items()):
            hist.add_metric([model, kv], buckets, total)
        yield hist
        yield from self._pool_series()

    def _pool_series(self) -> Iterator[Metric]:
        if self._models is not None:
            listing, by_model = self._models()
            yield from _model_series(listing)
            yield from _stats_series(by_model, labelled=True)
            return
        stats = self._pool_stats()
        if stats is not None:
            yield from _stats_series({"": stats}, labelled=False)


def _call_series(models: list[str], tokens: dict[tuple[str, str], float],
                 seconds: dict[tuple[str, str], float]) -> Iterator[Metric]:
    """The server's token and time series of pool calls, one sample per model (zeros before its first call)."""
    fams = {key: kind(name, doc, labels=["model"]) for key, (kind, name, doc) in _CALL_SERIES.items()}
    for m in models:
        prefilled, predicted = tokens.get((m, "prompt_prefilled"), 0), tokens.get((m, "predicted"), 0)
        p_s, g_s = seconds.get((m, "prompt"), 0.0), seconds.get((m, "predicted"), 0.0)
        values = {"prefilled": prefilled, "prompt_s": p_s, "predicted": predicted, "predicted_s": g_s,
                  "prompt_rate": prefilled / p_s if p_s else 0.0, "predicted_rate": predicted / g_s if g_s else 0.0,
                  "cached": tokens.get((m, "prompt_cached"), 0), "decoded": prefilled}
        for key, value in values.items():
            fams[key].add_metric([m], value)
    yield from fams.values()


def _stats_series(by_model: dict[str, dict[str, Any]], *, labelled: bool) -> Iterator[Metric]:
    """The pool series of `MemoryPool.stats()`, one pool's (unlabelled) or each model's (`model` label)."""
    m = ["model"] if labelled else []

    def family(kind: type, name: str, doc: str, *labels: str) -> Any:
        return kind(name, doc, labels=[*m, *labels])

    agents_n = family(GaugeMetricFamily, "agentmem_agents", "Agents the pool knows.")
    agents = family(GaugeMetricFamily, "agentmem_tier_agents", "Agents whose KV is in a tier.", "tier")
    nbytes = family(GaugeMetricFamily, "agentmem_tier_bytes", "Bytes of KV state kept in a tier.", "tier")
    restores = family(CounterMetricFamily, "agentmem_restores", "Calls whose agent was restored from a tier.", "tier")
    reuses = family(CounterMetricFamily, "agentmem_kv_reuses", "Calls whose agent was still live.")
    shared = family(GaugeMetricFamily, "agentmem_shared_ram_bytes", "Bytes of shared KV blocks in RAM.")
    counters = {name: family(CounterMetricFamily, name, doc) for name, (_, doc) in _POOL_COUNTERS.items()}
    for model, stats in sorted(by_model.items()):
        lab = [model] if labelled else []
        totals, tiers = stats["totals"], stats["tiers"]
        agents_n.add_metric(lab, totals["agents"])
        for tier, t in tiers.items():  # HOT, then every tier (`MemoryPool.stats`)
            agents.add_metric([*lab, tier], t["agents"])
            nbytes.add_metric([*lab, tier], t["bytes"])
            if tier != HOT:
                restores.add_metric([*lab, tier], t["hits"])
        reuses.add_metric(lab, tiers[HOT]["hits"])
        shared.add_metric(lab, stats["shared"]["ram_bytes"])
        for name, (key, _) in _POOL_COUNTERS.items():
            counters[name].add_metric(lab, totals.get(key, 0))
    yield from (agents_n, agents, nbytes, restores, reuses, shared, *counters.values())


def _model_series(listing: list[dict[str, Any]]) -> Iterator[Metric]:
    """Where each model's weights are (`MemoryPool.models()`): loaded, bytes, agents, loads, unloads."""
    loaded = GaugeMetricFamily("agentmem_model_loaded", "Whether the model is loaded (1) or not (0).", labels=["model"])
    nbytes = GaugeMetricFamily("agentmem_model_bytes", "Bytes of a loaded model: its weights and its live context.",
                               labels=["model", "kind"])
    agents = GaugeMetricFamily("agentmem_model_agents", "Agents bound to the model.", labels=["model"])
    in_use = GaugeMetricFamily("agentmem_model_in_use", "Calls holding the model loaded now.", labels=["model"])
    loads = CounterMetricFamily("agentmem_model_loads", "Times the model was loaded.", labels=["model"])
    unloads = CounterMetricFamily("agentmem_model_unloads", "Times the model was unloaded.", labels=["model"])
    prefetched = CounterMetricFamily("agentmem_model_prefetch_loads", "Loads started ahead of a call.",
                                     labels=["model"])
    for m in listing:
        name, up = m["name"], m["state"] == "loaded"
        loaded.add_metric([name], 1 if up else 0)
        nbytes.add_metric([name, "weights"], m["weights_bytes"] if up else 0)
        nbytes.add_metric([name, "context"], m["ctx_bytes"] if up else 0)
        agents.add_metric([name], m["agents"])
        in_use.add_metric([name], m["in_use"])
        loads.add_metric([name], m["loads"])
        unloads.add_metric([name], m["unloads"])
        prefetched.add_metric([name], m["prefetch_loads"])
    yield from (loaded, nbytes, agents, in_use, loads, unloads, prefetched)
