"""`python -m agentmem.server [flags]`: the same as `agentmem serve [flags]`."""

from __future__ import annotations

import sys

from agentmem.cli import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(["serve", *sys.argv[1:]]))
