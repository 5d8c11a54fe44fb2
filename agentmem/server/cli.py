"""`agentmem serve`: command-line flags → `ServerSettings`, a `KeyRing` and a `PoolConfig` → uvicorn.

```bash
agentmem serve --model /models/qwen2.5-0.5b-instruct-q4.gguf --archive agents.db \\
    --resident 4 --n-ctx 16384 --keys-file keys.txt
agentmem serve --model gemma-3-270m --model qwen2.5-coder-0.5b-instruct --ram-budget 800000000 \\
    --archive team/          # several models (`model_flags`): a request's `model` picks one
```

SIGTERM (or Ctrl-C) stops accepting connections, lets in-flight requests finish for
`--shutdown-grace` seconds, cancels the rest, then closes the pool, which writes every
agent into `--archive`; the next start on the same archive resumes them.

This module imports no optional dependency at import time, so `agentmem --help` works
without the `server` extra; `run_args` says what to install.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from agentmem.errors import ConfigError

__all__ = ["add_arguments", "build", "run_args"]

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of `agentmem serve`."""
    net = p.add_argument_group("network")
    net.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1: this machine only)")
    net.add_argument("--port", type=int, default=8000, help="TCP port (8000)")
    model = p.add_argument_group("model and pool")
    model.add_argument("--model", action="append", default=None, metavar="NAME_OR_PATH",
                       help="GGUF path or bundled model name (default: AGENTMEM_MODEL or the bundled default); "
                            "repeat it to serve several models, the first the default (see docs/models.md)")
    model.add_argument("--models-dir", default=None, metavar="DIR",
                       help="serve every *.gguf in DIR too, each named by its file stem")
    model.add_argument("--model-name", default=None,
                       help="model id in /v1/models and responses (default: the file's stem; one model only)")
    model.add_argument("--archive", default=None, metavar="PATH",
                       help="SQLite archive: COLD tier, checkpoint on exit, resume on start "
                            "(several models: a directory)")
    model.add_argument("--ram-budget", type=int, default=0, metavar="BYTES",
                       help="several models: RAM for their weights, contexts and parked KV together (0 = no limit)")
    model.add_argument("--vram-budget", type=int, default=0, metavar="BYTES",
                       help="several models: VRAM for offloaded weights and live KV (0 = no limit)")
    model.add_argument("--unload-policy", choices=("cost", "lru"), default="cost",
                       help="several models: which idle model to unload first (cost: reload time x likelihood of use)")
    model.add_argument("--load-wait", type=float, default=60.0, metavar="S",
                       help="several models: how long a call waits for the models in use to make room for its model, "
                            "then a 503 with Retry-After (60)")
    model.add_argument("--resident", type=int, default=4, metavar="N", help="agents with a live sequence at once (4)")
    model.add_argument("--n-ctx", type=int, default=8192, help="KV cells of the shared context (8192)")
    model.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0 = automatic)")
    model.add_argument("--n-gpu-layers", type=int, default=None, metavar="N",
                       help="layers offloaded on a CUDA/Metal build (-1 = all, 0 = CPU; "
                            "default AGENTMEM_N_GPU_LAYERS, else 0; see docs/gpu.md)")
    model.add_argument("--park-codec", default=None, help="codec of parked states in RAM (f16, q8_0, q4_0, q8_0/q4_0)")
    model.add_argument("--pool-option", action="append", default=[], metavar="KEY=VALUE",
                       help="any PoolConfig field, the value as JSON (repeatable): --pool-option warm_budget_bytes=536870912")
    sec = p.add_argument_group("keys and identity")
    sec.add_argument("--api-key", action="append", default=[], metavar="KEY", help="an admin API key (repeatable)")
    sec.add_argument("--keys-file", default=None, metavar="PATH", help="keys with agent-id prefixes (JSON, or lines 'KEY [PREFIX]')")
    sec.add_argument("--anonymous", choices=("lines", "reject", "per-key"), default="lines",
                     help="a request naming no agent: the conversation its history continues, or a new one "
                          "(lines, the default), 400 (reject) or the key's one anonymous agent (per-key)")
    sec.add_argument("--metrics-public", action="store_true", help="serve /metrics to every key, not only admin keys")
    sec.add_argument("--end-users", action="store_true",
                     help="keep each end user of a key apart (X-End-User, else the user field): no shared lines, "
                          "prefixes or cached_tokens across end users; user then names the end user, not the agent")
    sec.add_argument("--api-docs", action="store_true", help="serve /docs and /openapi.json (off by default)")
    model.add_argument("--decode-strategy", choices=("lazy", "free_then_forced"), default="lazy",
                       help="a free tool turn: one decode under a lazy call grammar (lazy, the default), or free "
                            "then once more forced when it was a broken call (free_then_forced)")
    model.add_argument("--durability", choices=("exit", "call", "lazy"), default=None,
                       help="exit (default alone): archive on demotion/checkpoint/shutdown; call (default in a cluster): "
                            "commit each call's agent; lazy (cluster): ledger each call, KV when parked or idle")
    clu = p.add_argument_group("cluster (replicas sharing a PostgreSQL archive; see docs/scale-out.md)")
    clu.add_argument("--archive-url", default=None, metavar="URL",
                     help="shared archive (postgresql://...): cluster mode, every agent served under its lease")
    clu.add_argument("--replica-id", default="", help="this replica's lease owner name (default host:pid)")
    clu.add_argument("--lease-ttl", type=float, default=10.0, metavar="S",
                     help="agent lease length; a killed replica's agents move after at most this long (10)")
    lim = p.add_argument_group("limits")
    lim.add_argument("--max-body-bytes", type=int, default=4 << 20, help="largest request body; more is a 413 (4 MiB)")
    lim.add_argument("--max-prompt-tokens", type=int, default=0, help="largest prompt; more is a 413 (0 = agent capacity)")
    lim.add_argument("--max-tokens-limit", type=int, default=4096, help="largest max_tokens a request may ask for (4096)")
    lim.add_argument("--default-max-tokens", type=int, default=256, help="max_tokens of a request without one (256)")
    lim.add_argument("--max-concurrent", type=int, default=8, help="requests in flight per key; more is a 429 (8)")
    lim.add_argument("--max-rpm", type=int, default=0,
                     help="requests one key may start per minute; more is a 429 with Retry-After (0 = no limit)")
    lim.add_argument("--max-agents", type=int, default=256,
                     help="agents one scoped key may keep; more is a 429 (256; 0 = no limit)")
    lim.add_argument("--max-parked-bytes", type=int, default=1 << 30,
                     help="parked KV bytes one scoped key's agents may keep; over it calls get 429 (1 GiB; 0 = none)")
    lim.add_argument("--max-input-items", type=int, default=4096,
                     help="messages or Responses input items one request may carry; more is a 413 (4096)")
    lim.add_argument("--max-lines", type=int, default=64,
                     help="anonymous conversations one key keeps; a new one past it forgets the least recently "
                          "used (64; 0 = no cap)")
    lim.add_argument("--line-park", type=float, default=300.0, metavar="S",
                     help="park an anonymous conversation idle this long (300; 0 = never)")
    lim.add_argument("--line-idle", type=float, default=3600.0, metavar="S",
                     help="forget an anonymous conversation idle this long (3600; 0 = never)")
    lim.add_argument("--shutdown-grace", type=float, default=10.0, metavar="S", help="seconds in-flight requests get at SIGTERM (10)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"), help="log level (info)")


def _pool_options(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--pool-option must be KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw  # a bare string such as q8_0
    return out


def _served(args: argparse.Namespace, models: dict[str, str]) -> Any:
    """The `ServedModels` of several models (`--model` twice, `--models-dir`)."""
    from agentmem.server.model_flags import ServedModels

    for flag, value in (("--model-name", args.model_name), ("--archive-url", args.archive_url)):
        if value:
            raise ConfigError(f"{flag} serves one model; with several each is named by its --model")
    if args.ram_budget < 0 or args.vram_budget < 0:
        raise ConfigError("--ram-budget and --vram-budget must be >= 0")
    return ServedModels(models=models, config=_pool_config(args, None, archive_path=None),
                        ram_budget_bytes=args.ram_budget, vram_budget_bytes=args.vram_budget,
                        unload_policy=args.unload_policy, archive_dir=args.archive, load_wait_s=args.load_wait)


def _pool_config(args: argparse.Namespace, model: str | None, **over: Any) -> Any:
    """The `PoolConfig` of the pool flags on `model` (`over` replaces some of them)."""
    from agentmem.config import PoolConfig

    options: dict[str, Any] = {"model_path": model, "archive_path": args.archive, "resident_agents": args.resident,
                               "n_ctx": args.n_ctx, "n_threads": args.threads}
    if args.archive_url:
        options["archive_url"] = args.archive_url
    if args.park_codec:
        options["park_codec"] = args.park_codec
    if args.n_gpu_layers is not None:
        options["n_gpu_layers"] = args.n_gpu_layers
    options.update(_pool_options(args.pool_option))
    options.update(over)
    return PoolConfig.build(**options)


def build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """`(PoolConfig or ServedModels, ServerSettings, KeyRing)` from parsed flags (validated; errors name the flag).

    Several models (`--model` twice, `--models-dir`) give a `ServedModels` (`model_flags`); one, a `PoolConfig`.
    """
    from agentmem.server.auth import KeyRing
    from agentmem.server.settings import ServerSettings

    if args.archive_url and args.archive:
        raise ConfigError("pass one archive: --archive PATH (one server) or --archive-url URL (a cluster)")
    from agentmem.server.model_flags import models_of

    models = models_of(args.model, args.models_dir)
    if len(models) > 1:
        config = _served(args, models)
    elif args.ram_budget or args.vram_budget:
        raise ConfigError("--ram-budget and --vram-budget need several models (--model A --model B, --models-dir)")
    else:  # one model, served as always (none named: AGENTMEM_MODEL or the bundled default)
        config = _pool_config(args, next(iter(models.values()), None))
    settings = ServerSettings(
        host=args.host, port=args.port, model_name=args.model_name, anonymous=args.anonymous,
        max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
        max_tokens_limit=args.max_tokens_limit, default_max_tokens=args.default_max_tokens,
        max_concurrent_per_key=args.max_concurrent, shutdown_grace_s=args.shutdown_grace,
        max_requests_per_minute_per_key=args.max_rpm,
        max_agents_per_key=args.max_agents, max_parked_bytes_per_key=args.max_parked_bytes,
        metrics_public=args.metrics_public,
        durability=args.durability or ("call" if args.archive_url else "exit"),
        cluster=bool(args.archive_url), replica_id=args.replica_id, lease_ttl_s=args.lease_ttl,
        decode_strategy=args.decode_strategy, max_input_items=args.max_input_items,
        max_lines_per_key=args.max_lines, line_park_s=args.line_park, line_idle_s=args.line_idle,
        end_users=args.end_users, api_docs=args.api_docs,
    )
    if settings.durability == "call" and not (config.archive_path or args.archive_url):
        raise ConfigError("--durability call needs --archive")
    keys = KeyRing.build(api_keys=args.api_key, keys_file=args.keys_file)
    return config, settings, keys


def run_args(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; returns 0 after a clean shutdown, 2 when the server could not start."""
    from agentmem.server import require_server_deps

    try:
        require_server_deps()
    except ImportError as exc:
        raise ConfigError(str(exc)) from exc
    import uvicorn

    from agentmem.server.app import create_app

    config, settings, keys = build(args)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.host not in ("127.0.0.1", "localhost", "::1") and not keys.enabled:
        logger.warning("serving on %s without API keys: anyone who can reach it can use every agent", settings.host)
    from agentmem.models import MemoryPool
    from agentmem.server.model_flags import ServedModels

    # opened before uvicorn starts: a missing model or a locked archive is one line on stderr, status 2
    replica = None
    if isinstance(config, ServedModels):
        pool = config.open(keys.tenant_prefixes())
    elif settings.cluster:
        from agentmem.cluster import open_replica

        pool, replica = open_replica(config, settings)
    else:
        pool = MemoryPool(config=config)
    app = create_app(pool, settings=settings, keys=keys, own_pool=True, replica=replica)
    server = uvicorn.Server(uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=args.log_level,
        timeout_graceful_shutdown=max(1, int(settings.shutdown_grace_s + 0.999)), lifespan="on",
    ))
    try:
        server.run()
    finally:
        if not pool.closed:  # uvicorn never started the lifespan (the port was taken, say)
            pool.close()
    return 0 if server.started else 2
