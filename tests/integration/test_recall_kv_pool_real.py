"""Recall as KV through the pool on the real instruct model (Qwen2.5-Coder-0.5B-Instruct), `recall_kv=True`.

Long notes are evicted under a budget (their cells captured on the way out); a later call
quotes the first note in a recall block: part of its tokens go in as the stored cells, and the
greedy answer still names the fact, as the text-only pool's does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmem import MemoryPool
from agentmem.tools.recall import recall_block, recall_spans

pytestmark = pytest.mark.integration

FACTS = ("the shipment left Rotterdam harbor aboard the vessel Nordlys on the third of May",
         "the vault password is marmalade and only the night clerk knows it",
         "the survey team counted forty two herons nesting along the western marsh")
FILLER = ("The rest of this note repeats routine details: the weather was mild, the trains ran on time, "
          "the office coffee machine was cleaned, the weekly report was filed, and nothing else changed. ")


def _answer(model: Path, tmp_path: Path, *, recall_kv: bool) -> tuple[str, dict]:
    with MemoryPool(model, n_ctx=8192, resident_agents=1, n_threads=1, prefetch=False, agent_budget_tokens=512,
                    eviction="sliding_window", eviction_block=64, recall_embedder="none",
                    archive_path=str(tmp_path / f"kv{int(recall_kv)}.db"), recall_kv=recall_kv) as p:
        msgs = [{"role": "system", "content": "You are a concise assistant. Answer from the conversation."}]
        for i in range(6):
            msgs += [{"role": "user", "content": f"Note {i + 1}: {FACTS[i % 3]}.\n{FILLER * 2}\n{FILLER}"},
                     {"role": "assistant", "content": f"Noted {i + 1}."}]
        r1 = p.chat("a", msgs, max_tokens=1, temperature=0)
        block = recall_block([t for t, _ in recall_spans(p, "a", "vessel shipment Rotterdam harbor", 2)])
        assert block, "the first note was evicted and is recalled by keyword"
        msgs += [{"role": "assistant", "content": r1.text}, {"role": "system", "content": block},
                 {"role": "user", "content": "Which vessel carried the shipment?"}]
        r2 = p.chat("a", msgs, max_tokens=12, temperature=0)
        core = p.engine()._core
        a = core.agents["a"]
        assert core.ctx.seq_pos_max(a.seq) == a.ledger.n_live - 1
        return r2.text, p.recall_stats()


def test_a_recalled_note_spliced_as_kv_answers_as_its_text_does(instruct_model_path: Path, tmp_path: Path) -> None:
    text_answer, _ = _answer(instruct_model_path, tmp_path, recall_kv=False)
    kv_answer, st = _answer(instruct_model_path, tmp_path, recall_kv=True)
    assert st["kv_stored"] >= 1 and st["kv_spliced"] >= 1 and st["kv_spliced_tokens"] >= 64, st
    assert "Nordlys" in text_answer and "Nordlys" in kv_answer, (text_answer, kv_answer)
