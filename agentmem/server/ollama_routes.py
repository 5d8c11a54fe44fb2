"""The Ollama API: `/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`, `/api/version`.

Validated requests are converted once to the engine's chat or completion request (`ollama_schemas`)
and served like chat completions (`serving.respond`: the same agent resolution, pool,
tool formats), then answered in Ollama's shapes: NDJSON chunks when streaming (the
default, as in Ollama), one object otherwise, errors as `{"error": "..."}`.

The counters are Ollama's: `prompt_eval_count` is the prompt tokens this call evaluated
(as in Ollama, a prefix read from kept KV is not counted: the kept history shows as a
small count), `eval_count` the generated tokens, durations in nanoseconds; the `agentmem`
object adds the whole prompt's size and the tokens read from kept KV.

The official client works with only the host changed:

>>> import ollama  # doctest: +SKIP
>>> client = ollama.Client(host="http://127.0.0.1:8000")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request

import agentmem
from agentmem.model import model_fingerprint
from agentmem.server.auth import Principal
from agentmem.server.bodies import body_schema, json_body
from agentmem.server.call_request import ChatCallRequest
from agentmem.server.deps import engine, principal
from agentmem.server.engine import Engine, Event, Outcome
from agentmem.server.http_errors import ApiError, from_exception
from agentmem.server.metrics import note_model
from agentmem.server.ollama_schemas import (
    ChatRequest,
    GenerateRequest,
    ShowRequest,
    to_chat_request,
    to_generate_request,
)
from agentmem.server.queue import Lease
from agentmem.server.serving import admitted, find_agent, off_loop, respond
from agentmem.server.wire_errors import shaped_route

__all__ = ["router"]

NDJSON = "application/x-ndjson"

router = APIRouter(route_class=shaped_route(lambda err: {"error": err.message}))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _line(data: dict[str, Any]) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _stream_error(exc: Exception) -> list[bytes]:
    """An error after the stream started: an `{"error": ...}` line (the client raises it)."""
    return [_line({"error": from_exception(exc).message})]


def _counters(out: Outcome, t0: float) -> dict[str, Any]:
    """`done_reason`, Ollama's counters and durations (ns), and the `agentmem` object."""
    u = out.usage()
    cached = u["prompt_tokens_details"]["cached_tokens"]
    t = out.results[0].timings
    ext = {**out.extension(), "prompt_tokens": u["prompt_tokens"], "cached_tokens": cached}
    return {"done": True, "done_reason": "length" if out.finish_reason == "length" else "stop",
            "total_duration": int((time.perf_counter() - t0) * 1e9), "load_duration": int(t.restore_s * 1e9),
            "prompt_eval_count": u["prompt_tokens"] - cached, "prompt_eval_duration": int(t.prefill_s * 1e9),
            "eval_count": u["completion_tokens"], "eval_duration": int(t.decode_s * 1e9), "agentmem": ext}


def _calls(out: Outcome) -> list[dict[str, Any]]:
    calls = out.reply.tool_calls
    return [{"function": {"index": i, "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
            for i, c in enumerate(calls)]


def _message(content: str, out: Outcome | None = None) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if out is not None and out.reply.tool_calls:
        msg["tool_calls"] = _calls(out)
    return msg


async def _loaded(eng: Engine, model: str | None) -> str:
    """Ollama's "load the model" answer to an empty call: the model's name, loaded (404: unknown)."""
    seat = await eng.models.model_seat(eng.models.choose(model))
    seat.release()
    note_model(seat.name)
    return seat.name


@router.post("/api/chat", openapi_extra=body_schema(ChatRequest))
async def chat(
        request: Request, req: ChatRequest = Depends(json_body(ChatRequest, "messages")),
        eng: Engine = Depends(engine)) -> Any:
    """Ollama chat: NDJSON chunks (default) or one object; tools, `format`, `options`."""
    t0 = time.perf_counter()
    async with admitted(request) as lease:
        if not req.messages:  # Ollama answers an empty chat by loading the model
            try:
                return {"model": await _loaded(eng, req.model), "created_at": _now(), "message": _message(""),
                        "done": True, "done_reason": "load"}
            finally:
                lease.release()
        return await _chat(eng, lease, request, req, t0)


async def _chat(eng: Engine, lease: Lease, request: Request, req: ChatRequest, t0: float) -> Any:
    body = await off_loop(to_chat_request, req)
    target = await find_agent(eng, lease, request, body)
    model = target.model

    def render(event: Event) -> list[bytes]:
        kind_, value = event
        if kind_ == "text":
            assert isinstance(value, str)
            if not value:
                return []
            return [_line({"model": model, "created_at": _now(), "message": _message(value), "done": False})]
        assert isinstance(value, Outcome)
        out = []
        if value.reply.tool_calls:
            out.append(_line({"model": model, "created_at": _now(), "message": _message("", value), "done": False}))
        out.append(_line({"model": model, "created_at": _now(), "message": _message(""), **_counters(value, t0)}))
        return out

    return await respond(
        eng, lease, target, request, lambda: eng.prepare_chat(target, body), req.stream,
        reply=lambda o: {"model": model, "created_at": _now(), "message": _message(o.reply.content or "", o),
                         **_counters(o, t0)},
        render=render, head=[], done=[], error_chunk=_stream_error, media_type=NDJSON,
    )


@router.post("/api/generate", openapi_extra=body_schema(GenerateRequest))
async def generate(
        request: Request, req: GenerateRequest = Depends(json_body(GenerateRequest, "prompt")),
        eng: Engine = Depends(engine)) -> Any:
    """Ollama generate: `prompt` (+ `system`) through the chat template, or `raw`."""
    t0 = time.perf_counter()
    async with admitted(request) as lease:
        if not req.prompt:  # Ollama answers an empty prompt by loading the model
            try:
                return {"model": await _loaded(eng, req.model), "created_at": _now(), "response": "", "done": True,
                        "done_reason": "load"}
            finally:
                lease.release()
        return await _generate(eng, lease, request, req, t0)


async def _generate(eng: Engine, lease: Lease, request: Request, req: GenerateRequest, t0: float) -> Any:
    body = await off_loop(to_generate_request, req)
    target = await find_agent(eng, lease, request, body)
    model = target.model

    def prepare() -> Any:
        if isinstance(body, ChatCallRequest):
            return eng.prepare_chat(target, body)
        return eng.prepare_completion(target, body)

    def render(event: Event) -> list[bytes]:
        kind_, value = event
        if kind_ == "text":
            return [_line({"model": model, "created_at": _now(), "response": value, "done": False})] if value else []
        assert isinstance(value, Outcome)
        return [_line({"model": model, "created_at": _now(), "response": "", **_counters(value, t0)})]

    return await respond(
        eng, lease, target, request, prepare, req.stream,
        reply=lambda o: {"model": model, "created_at": _now(), "response": o.reply.content or "", **_counters(o, t0)},
        render=render, head=[], done=[], error_chunk=_stream_error, media_type=NDJSON,
    )


def _check_ready(eng: Engine) -> None:
    """503 while the server's pool is not open (or is closing)."""
    if not eng.ready:
        raise ApiError(503, "the model is not loaded", code="unavailable")


def _details(model: Any) -> dict[str, Any]:
    """Ollama's `details` from a loaded model's GGUF metadata (`None`: not loaded, only the format)."""
    if model is None:
        return {"parent_model": "", "format": "gguf", "family": "", "families": None, "parameter_size": "",
                "quantization_level": ""}
    arch = model.meta("general.architecture") or ""
    words = model.description().split(" ", 2)  # e.g. "qwen2 1B Q4_K - Medium"
    quant = words[2] if len(words) == 3 else ""
    if " - " in quant:  # llama.cpp's "Q4_K - Medium" is Ollama's "Q4_K_M"
        head, _, size = quant.partition(" - ")
        quant = f"{head}_{size[:1].upper()}"
    return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
            "parameter_size": model.meta("general.size_label") or (words[1] if len(words) > 1 else ""),
            "quantization_level": quant}


def _file_entry(name: str, path: Path, digest: str, details: dict[str, Any]) -> dict[str, Any]:
    """A model as `/api/tags` lists it (`digest`: agentmem's model fingerprint, not a blob hash)."""
    st = path.stat()
    modified = datetime.fromtimestamp(st.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")
    return {"name": name, "model": name, "modified_at": modified, "size": st.st_size, "digest": digest,
            "details": details}


def _entry(name: str, pool: Any) -> dict[str, Any]:
    """A loaded model's `/api/tags` entry."""
    return _file_entry(name, Path(pool.model_path), str(pool.fingerprint.get("model", "")), _details(pool.model))


def _entries(eng: Engine) -> list[dict[str, Any]]:
    """Every model's entry, an unloaded one's from its file (blocking: may hash it once)."""
    pool, out = eng.models.pool(), []
    for m in pool.models():
        lease, name = pool.lease_if_loaded(m["name"]), eng.models.shown(m["name"])
        if lease is not None:
            with lease:
                out.append(_entry(name, lease.pool))
        else:
            out.append(_file_entry(name, Path(m["path"]), model_fingerprint(m["path"]), _details(None)))
    return out


def _running(name: str, pool: Any) -> dict[str, Any]:
    """A loaded model as `/api/ps` lists it."""
    entry = _entry(name, pool)
    return {**{k: entry[k] for k in ("name", "model", "size", "digest", "details")},
            "expires_at": "0001-01-01T00:00:00Z", "size_vram": 0, "context_length": pool.ctx.n_ctx}


@router.get("/api/tags")
async def tags(who: Principal = Depends(principal), eng: Engine = Depends(engine)) -> dict[str, Any]:
    """The models this server runs (with several: loaded or not)."""
    del who
    _check_ready(eng)
    return {"models": await eng.queue.call(_entries, eng)}


@router.get("/api/ps")
async def ps(who: Principal = Depends(principal), eng: Engine = Depends(engine)) -> dict[str, Any]:
    """The loaded models (one model stays loaded while the server runs; several load and unload).

    With several, a scoped key sees only the loaded models its own agents are bound to: which
    models another tenant keeps loaded is that tenant's activity (#33 F6).
    """
    _check_ready(eng)
    models = eng.models

    def mine(name: str) -> bool:
        return not models.many or who.admin or any(who.allows(a) for a in models.pool().bindings.agents(name))

    def running() -> list[dict[str, Any]]:
        return [_running(lease.name, lease.pool) for lease in models.each_loaded() if mine(lease.name)]

    return {"models": await eng.queue.call(running)}


def _show(pool: Any, name: str) -> dict[str, Any]:
    """`/api/show` of a loaded model: details, chat template, GGUF metadata, capabilities."""
    model = pool.model
    arch = model.meta("general.architecture") or ""
    info: dict[str, Any] = {"general.architecture": arch}
    for key in ("general.name", "general.basename", "general.size_label", f"{arch}.context_length",
                f"{arch}.embedding_length", f"{arch}.block_count"):
        value = model.meta(key)
        if value is not None:
            info[key] = int(value) if value.isdigit() else value
    caps = ["completion", "tools"]
    entry = _entry(name, pool)
    return {"modelfile": "", "parameters": "", "template": model.chat_template() or "", "details": entry["details"],
            "model_info": info, "capabilities": caps, "modified_at": entry["modified_at"]}


@router.post("/api/show")
async def show(req: ShowRequest, who: Principal = Depends(principal), eng: Engine = Depends(engine)) -> dict[str, Any]:
    """The model's details, chat template, GGUF metadata and capabilities (one model: any name gets it).

    With several, a loaded model is read under a lease taken only if it is loaded; an unloaded one
    is described from its file alone (no template or metadata): showing never loads a model, so
    `show` cannot be used to make the server load and unload models (#33 F2).
    """
    del who
    _check_ready(eng)
    models = eng.models
    name = models.choose(req.model or req.name) or models.default
    shown = models.shown(name)
    note_model(shown)
    pool = models.pool()
    lease = pool.lease_if_loaded(name)
    if lease is not None:
        with lease:
            return _show(lease.pool, shown)
    path = Path(next(m["path"] for m in pool.models() if m["name"] == name))
    entry = await eng.queue.call(lambda: _file_entry(shown, path, "", _details(None)))
    return {"modelfile": "", "parameters": "", "template": "", "details": entry["details"], "model_info": {},
            "capabilities": ["completion", "tools"], "modified_at": entry["modified_at"]}


@router.get("/api/version")
async def version() -> dict[str, str]:
    """agentmem's version (no key needed, as in Ollama)."""
    return {"version": agentmem.__version__}
