"""LangChain integration of agentmem (filled in by the LangChain issue)."""
