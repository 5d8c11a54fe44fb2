"""The engine: the only code that touches llama.cpp.

* `context.py` owns the native handles: the loaded model, one context with several
  sequences, token batches, per-sequence state get/set.
* `threads.py` picks the llama.cpp thread count when `n_threads` is 0.
* `llama_log.py` routes llama.cpp's log through `logging` (`agentmem.llama`), expected
  restore failures at DEBUG.
* `sampling.py` turns logits into tokens and tokens into text.
* `chat_format.py` renders messages into tokens with regions for the ledger.
"""
