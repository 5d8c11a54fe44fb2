"""The engine: the only code that touches llama.cpp (model, context, sampling, chat format).

* `native_first` loads llama.cpp's native libraries before numpy (the first thing
  `import agentmem` does: a CUDA build crashes otherwise), guards a model load in a
  process that imported numpy first (`check_load_order`, `ImportOrderError`), and names
  the backend a model runs on (`backend_name`, part of a state's fingerprint).
* `llama_model` owns the loaded model: `LlamaModel` (weights, vocabulary, chat template,
  tokenization that keeps message text apart from control tokens).
* `shared_weights` hands every pool of the process one loaded `LlamaModel` per GGUF file
  (`acquire`, `release`: freed with its last user); each pool keeps its own context and KV.
* `context` owns one context: `LlamaContext` (sequences, batched decode, state get/set)
  and its `TokenBatch`.
* `splice` takes a span's cells out of one sequence (`capture_span`) and puts them into another
  at a new position, shifted, the first tokens recomputed (`splice_span`): recall as KV.
* `threads` picks the llama.cpp thread count when `n_threads` is 0.
* `llama_log` routes llama.cpp's log through `logging` (`agentmem.llama`), expected
  restore failures at DEBUG.
* `sampling` turns logits into tokens (greedy, temperature, top-k/p, grammar, stop strings).
* `triggers` checks a lazy grammar's trigger patterns and matches them as a reply grows.
* `chat_format` validates chat messages (`Message`, `ToolCall`) and holds the prompt value
  (`RenderedPrompt`) and the `ChatFormat` strategy; `builtin_formats` has the built-in `gemma`
  and `chatml` formats that render messages into segments with a region each.
* `renderer` picks a model's format (`select_format`) and tokenizes what it renders, every
  span tagged (`ChatRenderer`): it owns the prompt value, rendered once per request.
* `prompt_memo` keeps the renders of recent conversations, so a call validates, renders and
  tokenizes only the messages it adds (`RenderMemo`).
* `jinja_format` renders a GGUF's own jinja chat template as a chat format, with each
  message's content located so it is tokenized as text, in linear time; `jinja_tail` renders
  it from the last kept message on, checked against the template's render of the whole new
  conversation (or of a window of it, for a template `jinja_locality` finds local).
* `jinja_text` marks every string of a tool definition so a template renders it as text.
* `template_sandbox` compiles and renders such a template in jinja2's sandbox with a time
  limit and an output budget (`RenderLimits`), failing as `ChatTemplateError`.
"""
