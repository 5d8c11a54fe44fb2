"""AutoGen integration of agentmem (filled in by the AutoGen issue)."""
