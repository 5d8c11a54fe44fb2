"""Recall by meaning through the pool (#34) on the tiny model, with a fake embedder: the spans a budget
evicts are archived with vectors, found by a paraphrase, after a restart too; the recall tool and the
LangChain retriever use it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentmem import MemoryPool
from agentmem.errors import ConfigError
from agentmem.recall import FunctionEmbedder
from agentmem.tools.recall import recall_spans

FACT = "The shipment left Rotterdam harbor aboard the vessel Nordlys."
QUESTION = "Which boat carried cargo out?"  # no word of FACT


def concept_vectors(texts: list[str]) -> np.ndarray:
    """A fake embedder: one axis for seafaring words, one for everything else."""
    sea = {"boat", "vessel", "cargo", "shipment", "harbor", "nordlys"}
    out = np.zeros((len(texts), 2), dtype=np.float32)
    for i, t in enumerate(texts):
        ws = [w.strip(".,?!:") for w in t.lower().split()]
        out[i] = [sum(w in sea for w in ws), 0.2 + sum(w not in sea for w in ws) / 50]
    return out


def conversation() -> list[dict]:
    msgs = [{"role": "system", "content": "you are a careful assistant"}, {"role": "user", "content": FACT},
            {"role": "assistant", "content": "noted"}]
    for i in range(14):
        msgs += [{"role": "user", "content": f"turn {i}: the weather today is fine and the river {i} is calm"},
                 {"role": "assistant", "content": f"noted item {i} about the river and the weather"}]
    return msgs + [{"role": "user", "content": QUESTION}]


def open_pool(path: Path, archive: Path) -> MemoryPool:
    pool = MemoryPool(path, n_ctx=2048, resident_agents=1, n_batch=64, prefetch=False, n_threads=1,
                      chat_format="chatml", archive_path=str(archive), agent_budget_tokens=160,
                      eviction="streaming_llm", recall_embedder="none", recall_mode="vector")
    pool.set_recall_embedder(FunctionEmbedder(concept_vectors, name="sea"))
    return pool


def test_a_paraphrase_recalls_the_evicted_span_after_a_restart(tiny_model_path: Path, tmp_path: Path) -> None:
    archive = tmp_path / "agents.db"
    with open_pool(tiny_model_path, archive) as pool:
        pool.chat("a", conversation(), max_tokens=2)
        assert any("vessel" in s.text for s in pool.engine()._core.recall_store.list_evicted("a")), "the fact was evicted"
        assert not any("vessel" in s.text for s in pool.recall("a", QUESTION, 3, mode="keyword"))
        assert "vessel" in pool.recall("a", QUESTION, 1)[0].text
        stats = pool.recall_stats()
        assert stats["embedder"] == "sea" and stats["embedded_spans"] >= 1 and stats["searches"] == 2
        totals = pool.stats()["totals"]
        assert totals["recall_searches"] == 2 and totals["recall_embedded_spans"] == stats["embedded_spans"]
    with open_pool(tiny_model_path, archive) as pool:
        hit = pool.recall("a", QUESTION, 1)[0]
        assert "vessel" in hit.text and hit.score > 0.9
        assert pool.recall_stats()["backfilled_spans"] == 0, "the vectors were archived with the spans"
        assert "vessel" in pool.recall("a", QUESTION, 3, mode="hybrid")[0].text
        texts = [t for t, _ in recall_spans(pool, "a", QUESTION, 2)]
        assert FACT in texts[0], "the span (cut at 'vessel N') is completed to its whole line"


def test_the_langchain_retriever_returns_the_recalled_lines(tiny_model_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("langchain_core")
    from agentmem_langchain import AgentMemRetriever

    with open_pool(tiny_model_path, tmp_path / "agents.db") as pool:
        pool.chat("a", conversation(), max_tokens=2)
        docs = AgentMemRetriever(pool=pool, agent_id="a", k=2).invoke(QUESTION)
        assert docs and FACT in docs[0].page_content
        assert docs[0].metadata["agent_id"] == "a" and docs[0].metadata["score"] > 0.9
        assert AgentMemRetriever(pool=pool, agent_id="b", k=2).invoke(QUESTION) == []


def test_recall_options_are_checked(tiny_model_path: Path) -> None:
    with pytest.raises(ConfigError, match="recall_mode"):
        MemoryPool(tiny_model_path, recall_mode="fuzzy")
    with pytest.raises(ConfigError, match="recall_embedder"):
        MemoryPool(tiny_model_path, recall_embedder="")


def test_a_pinned_agents_vectors_stay_in_ram(tiny_model_path: Path, tmp_path: Path) -> None:
    """`pin_recall` is the pool's door to the hot partitions' pins (before it, only `RecallIndex.pin`)."""
    with open_pool(tiny_model_path, tmp_path / "agents.db") as pool:
        pool.chat("a", conversation(), max_tokens=2)
        pool.pin_recall("a")
        assert pool.recall_stats()["hot_pinned"] == 1
        assert "vessel" in pool.recall("a", QUESTION, 1)[0].text
        hits = pool.recall_stats()["hot_hits"]
        pool.recall("a", QUESTION, 1)
        assert pool.recall_stats()["hot_hits"] == hits + 1  # served from RAM
        pool.pin_recall("a", False)
        assert pool.recall_stats()["hot_pinned"] == 0
        pool.pin_recall("never-seen")  # an agent bound to no model yet: nothing to pin, no error
        with pytest.raises(ConfigError, match="pinned"):
            pool.engine().pin_recall("a", pinned="yes")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="agent_id"):
            pool.pin_recall("")
