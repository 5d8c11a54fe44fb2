"""`python -m agentmem.server [flags]`: the same as `agentmem serve [flags]`."""

from __future__ import annotations

import sys

from agentmem.server.command import serve_main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(serve_main(sys.argv[1:]))
