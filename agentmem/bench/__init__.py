"""Benchmarks shipped with the package (``agentmem bench NAME``); thin scripts in ``benchmarks/`` call them."""
