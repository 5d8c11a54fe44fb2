"""The recall index and the embedder strategy (#34), with a fake embedder: modes, fusion, backfill, failures."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from agentmem.archive import Archive, EvictedSpan
from agentmem.errors import ConfigError
from agentmem.recall import EmbedderError, FunctionEmbedder, HTTPEmbedder, RecallIndex, fuse, make_embedder
from agentmem.recall.minilm import minilm_zip

#: A fake embedder's "meaning": words of one concept map to one axis.
CONCEPTS = {
    "boat": 0, "vessel": 0, "ship": 0, "shipment": 0, "cargo": 0,
    "dentist": 1, "tooth": 1, "appointment": 1,
    "garden": 2, "hose": 2, "watering": 2,
    "invoice": 3, "bill": 3, "supplier": 3,
}


def concept_vectors(texts: list[str]) -> np.ndarray:
    out = np.full((len(texts), 5), 0.05, dtype=np.float32)
    for i, t in enumerate(texts):
        for w in t.lower().replace("?", " ").replace(".", " ").split():
            if w in CONCEPTS:
                out[i, CONCEPTS[w]] += 1.0
    return out


SPANS = [
    (0, 10, "user", "The shipment left Rotterdam aboard the vessel Nordlys."),
    (10, 20, "user", "The dentist appointment moved to Thursday."),
    (20, 30, "user", "The garden hose splitter is in the blue bin."),
    (30, 40, "user", "The Kestrel invoice is overdue."),
]


@pytest.fixture
def index() -> Iterator[RecallIndex]:
    with Archive(":memory:") as arc:
        idx = RecallIndex(arc, embedder=FunctionEmbedder(concept_vectors, name="concepts"))
        idx.add("a", SPANS)
        yield idx


def test_vector_mode_finds_a_paraphrase_keyword_search_misses(index: RecallIndex) -> None:
    q = "Which boat carried cargo?"
    assert index.search("a", q, 1, mode="keyword") == []
    hit = index.search("a", q, 1)[0]
    assert "Nordlys" in hit.text and hit.score > 0.9


def test_keyword_mode_is_the_full_text_search(index: RecallIndex) -> None:
    assert [s.text for s in index.search("a", "Kestrel", 3, mode="keyword")] == [SPANS[3][3]]


def test_hybrid_ranks_a_keyword_match_with_the_meaning(index: RecallIndex) -> None:
    """'Kestrel' has no concept: vectors alone rank every span alike; the keyword list decides."""
    assert index.search("a", "Kestrel", 1, mode="hybrid")[0].text == SPANS[3][3]
    both = index.search("a", "vessel Nordlys", 2, mode="hybrid")
    assert both[0].text == SPANS[0][3]


def test_fuse_adds_weighted_reciprocal_ranks() -> None:
    a, b, c = (EvictedSpan(i, "x", 0, 1, "user", t, 0.0) for i, t in enumerate("abc"))
    assert [s.text for s in fuse([[a, b], [c]], [1.0, 0.3], k=3)] == ["a", "b", "c"]
    assert [s.text for s in fuse([[a, b], [b]], [1.0, 1.0], k=1)] == ["b"]
    fused = fuse([[a], [a]], [1.0, 0.5], k=1)[0]
    assert fused.score == pytest.approx(1.5 / 11)


def test_without_embedder_every_mode_is_keyword_search() -> None:
    with Archive(":memory:") as arc:
        idx = RecallIndex(arc, embedder="none")
        idx.add("a", SPANS)
        assert idx.search("a", "Which boat carried cargo?", 2, mode="vector") == []
        assert idx.search("a", "Nordlys", 2, mode="hybrid")[0].text == SPANS[0][3]
        assert idx.snapshot()["embedder"] is None


def test_a_lazy_index_embeds_nothing_on_add_and_everything_before_a_search() -> None:
    """Eviction's cost (the default `recall_embed="recall"`): embedding with MiniLM on the
    eviction path made a call that evicts 100x slower on the tiny model (58 s vs 0.25 s for
    `test_eviction_pool`'s overflow test); the spans wait for their agent's next search."""
    seen: list[int] = []

    def counted(texts: list[str]) -> np.ndarray:
        seen.append(len(texts))
        return concept_vectors(texts)

    with Archive(":memory:") as arc:
        idx = RecallIndex(arc, embedder=FunctionEmbedder(counted, name="concepts"))
        idx.add("a", SPANS)
        assert seen == [] and len(arc.spans_without_vectors("a", model="concepts")) == len(SPANS)
        assert "Nordlys" in idx.search("a", "Which boat carried the cargo?", 1)[0].text
        assert arc.spans_without_vectors("a", model="concepts") == [] and seen == [len(SPANS), 1]


def test_a_failing_embedder_archives_the_text_and_the_next_search_backfills() -> None:
    """An embedding endpoint that is down must not lose evicted text: spans go in without vectors."""
    calls = {"fail": True}

    def flaky(texts: list[str]) -> np.ndarray:
        if calls["fail"]:
            raise OSError("connection refused")
        return concept_vectors(texts)

    with Archive(":memory:") as arc:
        idx = RecallIndex(arc, embedder=FunctionEmbedder(flaky, name="concepts"), eager=True)
        idx.add("a", SPANS)
        assert len(arc.list_evicted("a")) == 4 and idx.counters["embed_errors"] == 1
        calls["fail"] = False
        assert "Nordlys" in idx.search("a", "Which boat carried the cargo?", 1)[0].text
        assert idx.counters["backfilled_spans"] == 4
        assert arc.spans_without_vectors("a", model="concepts") == []


def test_a_new_embedder_reembeds_on_the_next_search(index: RecallIndex) -> None:
    index.set_embedder(FunctionEmbedder(lambda t: concept_vectors(t)[:, ::-1], name="reversed"))
    assert "dentist" in index.search("a", "tooth", 1)[0].text
    assert index.snapshot()["backfilled_spans"] == 4 and index.snapshot()["embedder"] == "reversed"


def test_unknown_modes_and_specs_are_config_errors() -> None:
    with Archive(":memory:") as arc:
        with pytest.raises(ConfigError, match="recall mode"):
            RecallIndex(arc, embedder="none", mode="fuzzy")
        idx = RecallIndex(arc, embedder="none")
        with pytest.raises(ConfigError, match="recall mode"):
            idx.search("a", "x", 1, mode="fuzzy")
    with pytest.raises(ConfigError, match="must be one of"):
        make_embedder("word2vec")
    with pytest.raises(ConfigError, match="after '#'"):
        make_embedder("http://localhost:1/v1")
    with pytest.raises(ConfigError, match="name, a URL"):
        make_embedder(42)


def test_a_function_embedder_checks_the_shape() -> None:
    e = FunctionEmbedder(lambda texts: [[1.0, 2.0]], name="short")
    with pytest.raises(EmbedderError, match=r"shape \(1, 2\) for 2 texts"):
        e.embed(["a", "b"])


def test_auto_is_minilm_when_installed_else_keyword_only() -> None:
    e = make_embedder("auto")
    assert (e is None) == (minilm_zip() is None)
    if e is not None:
        assert e.name == "all-minilm-l6-v2"


class _Embeddings(http.server.BaseHTTPRequestHandler):
    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"body": body, "auth": self.headers.get("Authorization")})
        data = [{"object": "embedding", "index": i, "embedding": concept_vectors([t])[0].tolist()}
                for i, t in reversed(list(enumerate(body["input"])))]
        out = json.dumps({"object": "list", "data": data, "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


def test_an_openai_compatible_endpoint_embeds_in_batches_in_order() -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Embeddings)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/v1"
        e = HTTPEmbedder(url, model="toy-embed", api_key="sk-test", batch=2)
        texts = [s[3] for s in SPANS]
        assert np.allclose(e.embed(texts), concept_vectors(texts))
        assert [len(s["body"]["input"]) for s in _Embeddings.seen] == [2, 2]
        assert _Embeddings.seen[0]["auth"] == "Bearer sk-test" and e.name == "http:toy-embed"
        assert make_embedder(url + "#toy-embed").name == "http:toy-embed"
    finally:
        srv.shutdown()
    with pytest.raises(EmbedderError, match="embeddings request failed"):
        HTTPEmbedder(url, model="toy-embed", timeout_s=2).embed(["x"])


def test_vector_mode_falls_back_to_shared_words_when_nothing_is_similar() -> None:
    """Text the embedder cannot place (an identifier) is still found when it is named."""
    flat = FunctionEmbedder(lambda texts: [[1.0, 0.0] if "Kestrel" in t else [0.0, 1.0] for t in texts], name="flat")
    with Archive(":memory:") as arc:
        idx = RecallIndex(arc, embedder=flat, min_similarity=0.5)
        idx.add("a", SPANS)
        assert [s.text for s in idx.search("a", "dentist Kestrel", 1)] == [SPANS[3][3]]  # by its vector
        idx.set_embedder(FunctionEmbedder(lambda texts: [[0.0, 1.0] if "?" in t else [1.0, 0.0] for t in texts],
                                          name="orthogonal"))
        assert [s.text for s in idx.search("a", "garden hose?", 1)] == [SPANS[2][3]]  # no vector close: by word
        assert idx.search("a", "what is it?", 1) == []  # no significant word either
