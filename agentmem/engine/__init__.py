"""The engine: the only code that touches llama.cpp (model, context, sampling, chat format)."""
