"""How an agentmem command ends, and `python -m agentmem.server` standing alone.

`run_handler` is the exit-status convention every `agentmem` subcommand keeps (the
top-level `agentmem.cli.main` runs its handlers through it): errors agentmem raises on
purpose, and OS errors, print one line on stderr and give status 2, without a traceback;
Ctrl-C gives 130. `serve_main` is `agentmem serve` without the top-level parser, so the
server package starts itself without importing the command above it.

```bash
python -m agentmem.server --model qwen2.5-0.5b-instruct --port 8000   # = agentmem serve ...
```

Like `agentmem.server.cli`, this module imports no optional dependency at import time.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence

from agentmem.errors import AgentMemError
from agentmem.server.cli import add_arguments, run_args

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "SERVE_DESCRIPTION", "SERVE_HELP", "run_handler", "serve_main"]

EXIT_OK = 0
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

SERVE_HELP = "OpenAI-compatible HTTP server where every agent keeps its KV memory"
SERVE_DESCRIPTION = "OpenAI-compatible HTTP server over one MemoryPool, or several models (see docs/server.md)."

Handler = Callable[[argparse.Namespace], int]


def run_handler(handler: Handler, args: argparse.Namespace) -> int:
    """Run one command's `handler` on its parsed `args`; returns the exit status.

    Returns:
        The handler's status; 2 after an `AgentMemError` or `OSError` (printed as one line
        on stderr, even when the message quotes SQL across lines); 130 after Ctrl-C.
    """
    try:
        return handler(args)
    except (AgentMemError, OSError) as exc:
        sys.stderr.write("agentmem: error: " + re.sub(r"\s*\n\s*", " ", str(exc)).strip() + "\n")  # the CLI's one line
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("agentmem: interrupted\n")
        return EXIT_INTERRUPTED


def serve_main(argv: Sequence[str] | None = None) -> int:
    """`python -m agentmem.server [flags]`: the same flags, output and status as `agentmem serve [flags]`.

    Args:
        argv: the flags without the program name; `None` reads `sys.argv`.
    """
    parser = argparse.ArgumentParser(prog="agentmem serve", description=SERVE_DESCRIPTION)
    add_arguments(parser)
    return run_handler(run_args, parser.parse_args(argv))
