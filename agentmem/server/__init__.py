"""`agentmem serve`: an OpenAI-, Anthropic- and Ollama-compatible HTTP server where every agent keeps its KV memory.

A thin adapter over one `MemoryPool`, of one model or several (llama.cpp
`tools/server` keeps HTTP, the task queue and the model apart; so does this package):

`settings.py` holds the typed, serializable server settings (`ServerSettings`).
`auth.py` reads API keys and their agent-id prefixes into principals (`KeyRing`).
`identity.py` finds the agent of a request (header, `user`, `agent_id`) and checks its scope.
`http_errors.py` maps agentmem's exceptions to OpenAI-shaped 4xx answers.
`schemas.py` holds the typed request bodies in the OpenAI shapes.
`call_request.py` holds what one call asks of the engine (`ChatCallRequest`): every front-end converts to it once.
`bodies.py` admits a request, then decodes and validates its body in a worker thread (`json_body`).
`calls.py` turns a call request into a pool call with agentmem's tool-call protocol and reads the reply.
`queue.py` admits requests (429), orders the calls of one agent and runs pool streams in threads.
`lifecycle.py` parks and forgets anonymous conversations by policy (idle times, a per-key LRU cap).
`idempotency.py` keeps answers for retries that send `Idempotency-Key` / `X-Request-Id`.
`registry.py` chooses a request's model and holds it loaded for the call (`Models`, `Target`).
`engine.py` is the one object the routes call: the models, the queue, the metrics.
`agent_ops.py` holds the agent operations of the engine (list, park, forget, handoff, ...), on the agent's model.
`responses.py` builds OpenAI response bodies and SSE events.
`metrics.py` renders Prometheus series (llama-server's names and `agentmem_*`) per app.
`deps.py` holds the FastAPI dependencies (engine, principal).
`serving.py` is what every front-end shares: agent resolution, admission, disconnect watching, SSE.
`openai_routes.py` serves `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`.
`responses_schemas.py` reads a Responses API request and turns it into the engine's chat request.
`responses_store.py` keeps stored responses per tenant scope, LRU-bounded by count and bytes.
`responses_api.py` serves the OpenAI Responses API (`/v1/responses`: create, streaming events, get, delete).
`wire_errors.py` gives a router's errors another API's shape (Anthropic's, Ollama's).
`anthropic_schemas.py` holds the Anthropic Messages bodies and translates them to the engine's chat request.
`anthropic_responses.py` builds Anthropic `message` bodies, stream events and error bodies.
`anthropic_routes.py` serves `/v1/messages` and `/v1/messages/count_tokens`.
`ollama_schemas.py` holds the Ollama bodies and translates them to the chat or completion request.
`ollama_routes.py` serves `/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`, `/api/version`.
`agents_api.py` serves `/agents` (list, show, park, forget, pin, budget, priority, handoff, recall, checkpoint).
`app.py` assembles the FastAPI app (`create_app`): routers, handlers, body limit, lifespan.
`model_flags.py` reads `--model` (repeatable) and `--models-dir` into the models served (`ServedModels`).
`cli.py` is `agentmem serve`: flags → settings, keys and pool config → uvicorn.

FastAPI, uvicorn and prometheus-client are an extra: `pip install 'agentmem-kv[server]'`.
The names below are imported on first use, so `agentmem --help` works without them.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["INSTALL_HINT", "KeyRing", "ServerSettings", "create_app", "require_server_deps"]

INSTALL_HINT = "pip install 'agentmem-kv[server]'"

_EXPORTS = {"create_app": "agentmem.server.app", "KeyRing": "agentmem.server.auth",
            "ServerSettings": "agentmem.server.settings"}


def require_server_deps() -> None:
    """Import the server's optional dependencies, or raise `ImportError` with the install command."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"agentmem serve needs FastAPI, uvicorn and prometheus-client: {INSTALL_HINT}") from exc


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentmem.server' has no attribute {name!r}")
    require_server_deps()
    return getattr(importlib.import_module(module), name)
