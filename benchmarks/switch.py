"""Agent-switch TTFT benchmark — see agentmem/bench/switch.py (also: ``agentmem bench switch``)."""

from agentmem.bench.switch import main

if __name__ == "__main__":
    raise SystemExit(main())
