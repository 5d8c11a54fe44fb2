"""`POST /v1/embeddings` (#34): the official `openai` client, both encodings, keys, admission before work, errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import httpx  # noqa: E402

from agentmem import MemoryPool  # noqa: E402
from agentmem.server import ServerSettings, create_app  # noqa: E402
from agentmem.server.auth import KeyRing  # noqa: E402
from tests.fixtures.serving import ServerThread  # noqa: E402

KEY, KEY_ONE = "sk-tenant-a", "sk-one-at-a-time"


class Toy:
    """A fake embedder whose vectors are known: [len, vowels, 1]; `gate` can hold it mid-embedding."""

    name = "toy-embed"

    def __init__(self) -> None:
        self.calls = 0
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        return np.array([[len(t), sum(c in "aeiou" for c in t), 1.0] for t in texts], dtype=np.float32)


def unit(rows: list[list[float]]) -> np.ndarray:
    a = np.asarray(rows, dtype=np.float32)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def server(tiny_model_path: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps({"keys": [{"key": KEY, "prefix": "tenant-a/"},
                                         {"key": KEY_ONE, "prefix": "one/", "max_concurrent": 1}]}))
    pool = MemoryPool(str(tiny_model_path), n_ctx=1024, resident_agents=1, n_threads=1, recall_embedder="none")
    toy = Toy()
    pool.set_recall_embedder(toy)
    app = create_app(pool, settings=ServerSettings(default_max_tokens=4), keys=KeyRing.build(keys_file=keys))
    with ServerThread(app) as srv:
        srv.toy = toy
        yield srv
    pool.close()


@pytest.fixture
def client(server: Any) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0) as c:
        yield c


def test_the_openai_client_gets_unit_vectors_in_input_order(client: Any) -> None:
    texts = ["hello", "a longer sentence", "xyz"]
    r = client.embeddings.create(model="toy-embed", input=texts)  # the client asks for base64 and decodes it
    assert r.model == "toy-embed" and [d.index for d in r.data] == [0, 1, 2]
    want = unit([[len(t), sum(c in "aeiou" for c in t), 1.0] for t in texts])
    assert np.allclose([d.embedding for d in r.data], want, atol=1e-6)
    assert r.usage.prompt_tokens == r.usage.total_tokens == 5  # words, for an embedder that counts no tokens
    one = client.embeddings.create(model="toy-embed", input="hello", encoding_format="float")
    assert np.allclose(one.data[0].embedding, want[0], atol=1e-6)


def test_a_chat_models_name_is_served_by_its_pools_embedder(server: Any, client: Any) -> None:
    name = client.models.list().data[0].id
    assert client.embeddings.create(model=name, input="hi").model == "toy-embed"


def test_bad_requests_are_openai_errors(server: Any) -> None:
    h = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        assert http.post("/v1/embeddings", json={"model": "toy-embed", "input": "x"}).status_code == 401
        cases = [({"model": "text-embedding-3-small", "input": "x"}, 404, "model"),
                 ({"model": "toy-embed", "input": [[1, 2, 3]]}, 400, "input"),
                 ({"model": "toy-embed", "input": []}, 400, "input"),
                 ({"model": "toy-embed", "input": ["ok", ""]}, 400, "input"),
                 ({"model": "toy-embed", "input": "x", "dimensions": 8}, 400, "dimensions")]
        for body, status, param in cases:
            r = http.post("/v1/embeddings", json=body, headers=h)
            assert r.status_code == status and r.json()["error"]["param"] == param, (body, r.text)


def test_a_key_at_its_limit_is_refused_before_any_work(server: Any) -> None:
    toy: Toy = server.toy
    toy.gate, toy.entered = threading.Event(), threading.Event()
    h = {"Authorization": f"Bearer {KEY_ONE}"}
    body = {"model": "toy-embed", "input": "first"}
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        first = threading.Thread(target=lambda: http.post("/v1/embeddings", json=body, headers=h))
        first.start()
        try:
            assert toy.entered.wait(10)
            calls = toy.calls
            r = http.post("/v1/embeddings", json={"model": "toy-embed", "input": "second"}, headers=h)
            assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"
            assert toy.calls == calls, "the refused request embedded nothing"
        finally:
            toy.gate.set()
            first.join(10)
            toy.gate = None
        deadline = time.monotonic() + 10
        while http.post("/v1/embeddings", json=body, headers=h).status_code == 429:  # the slot comes back
            assert time.monotonic() < deadline
            time.sleep(0.05)
