"""Benchmarks shipped with the package; `agentmem bench NAME` runs one.

* `switch` measures time to first token when a team of agents takes turns on one
  model (agentmem's park/restore against a shared llama-cpp-python `Llama`).

Each benchmark is a module that defines `add_arguments(parser)` (its options, on a
parser it is given), `run_args(args) -> int` (run with the parsed options) and
`main(argv) -> int` (its own parser, for `python benchmarks/NAME.py`). A module keeps
heavy imports (numpy, llama_cpp) inside its functions, so building the `agentmem`
parser stays cheap. Registering a new benchmark is one line in `BENCHMARKS`.
"""

from __future__ import annotations

__all__ = ["BENCHMARKS"]

BENCHMARKS: dict[str, str] = {
    "switch": "agentmem.bench.switch",
}
"""Benchmark name (the `agentmem bench` sub-command) -> module that implements it."""
