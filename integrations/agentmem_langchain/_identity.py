"""Whose memory a call continues: the agent id of one call, resolved from its arguments and run config.

First match wins:

1. the call argument `agent_id=` (`model.invoke(msgs, agent_id="coder")`);
2. `config["configurable"]["agent_id"]`;
3. the model's own `agent_id`, when it was set explicitly (`ChatAgentMem(agent_id="coder")`);
4. the model's `agent_id_from_config` hook, when given (a value of `None` falls through);
5. LangGraph's run config: `"{thread_id}/{node path}"` — the node path is the node name
   (`langgraph_node`), prefixed by its parent graphs' nodes inside a subgraph
   (`"team/model"`, from `checkpoint_ns`);
6. the node path alone (a graph run without a `thread_id`);
7. `"default"`.

A LangGraph node calling a shared model therefore lands on its own agent without app
code, and each conversation thread keeps its own memory. Every resolved id is checked
by `agentmem.validation.agent_id` (a `ConfigError` naming where it came from).

>>> agent_from_config({"metadata": {"thread_id": "t1", "langgraph_node": "writer",
...                                 "checkpoint_ns": "writer:8f1c"}})
't1/writer'
>>> agent_from_config({"metadata": {"langgraph_node": "model", "checkpoint_ns": "team:1a|model:2b"}})
'team/model'
>>> agent_from_config({}) is None
True
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from langchain_core.runnables import RunnableConfig

from agentmem import validation as check

__all__ = ["DEFAULT_AGENT", "AgentIdFromConfig", "agent_from_config", "node_path", "resolve_agent", "with_node"]

#: The agent of a call that names none, outside a graph.
DEFAULT_AGENT = "default"

#: A hook mapping a call's run config to an agent id (`None`: fall through to the built-in rules).
AgentIdFromConfig = Callable[[RunnableConfig], "str | None"]


def _meta(config: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = config.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _configurable(config: Mapping[str, Any]) -> Mapping[str, Any]:
    conf = config.get("configurable")
    return conf if isinstance(conf, Mapping) else {}


def node_path(config: Mapping[str, Any]) -> str | None:
    """The LangGraph node a call runs in, with its parent graphs' nodes (`"team/model"`); `None` outside a graph.

    `checkpoint_ns` is `"parent:<task id>|child:<task id>"`; the task ids change every
    step, so only the names are kept.
    """
    meta = _meta(config)
    node = meta.get("langgraph_node")
    if not isinstance(node, str) or not node:
        return None
    ns = meta.get("checkpoint_ns") or meta.get("langgraph_checkpoint_ns") or _configurable(config).get("checkpoint_ns")
    if isinstance(ns, str) and ns:
        names = [part.split(":", 1)[0] for part in ns.split("|")]
        if names and names[-1] == node and all(names):
            return "/".join(names)
    return node


def thread_of(config: Mapping[str, Any]) -> str | None:
    """The run's LangGraph `thread_id` (configurable, else metadata) as text, or None."""
    thread = _configurable(config).get("thread_id")
    if thread is None:
        thread = _meta(config).get("thread_id")
    if thread is None or thread == "":
        return None
    return str(thread) if isinstance(thread, (int, str)) else None


def agent_from_config(config: Mapping[str, Any]) -> str | None:
    """Rules 5-6: `"{thread_id}/{node path}"`, the node path alone, or `None` outside a graph (unchecked)."""
    path = node_path(config)
    if path is None:
        return None
    thread = thread_of(config)
    return f"{thread}/{path}" if thread is not None else path


def with_node(config: Mapping[str, Any], node: str) -> dict[str, Any]:
    """`config` as a call from `node` of the same graph and thread would see it (for expected next agents)."""
    meta = dict(_meta(config))
    ns = meta.get("checkpoint_ns")
    if isinstance(ns, str) and ns:
        parts = ns.split("|")
        parts[-1] = f"{node}:"
        meta["checkpoint_ns"] = "|".join(parts)
    meta.pop("langgraph_checkpoint_ns", None)
    meta["langgraph_node"] = node
    return {**config, "metadata": meta}


def resolve_agent(
    config: Mapping[str, Any],
    *,
    explicit: str | None,
    own: str,
    own_is_explicit: bool,
    hook: AgentIdFromConfig | None,
) -> str:
    """The agent id of one call (rules 1-7 above), validated.

    Args:
        config: the call's run config (`ensure_config` applied).
        explicit: the call's `agent_id=` argument, if any.
        own: the model object's `agent_id` field.
        own_is_explicit: whether that field was set by the caller (not the default).
        hook: the model's `agent_id_from_config`, if any.

    Raises:
        ConfigError: the resolved id is not a valid agent id (empty, too long, control
            characters, a reserved prefix); the message names its source.
    """
    if explicit is not None:
        return check.agent_id(explicit, field="agent_id")
    conf = _configurable(config).get("agent_id")
    if conf is not None and conf != "":
        return check.agent_id(conf, field="configurable.agent_id")
    if own_is_explicit:
        return check.agent_id(own, field="agent_id")
    if hook is not None:
        got = hook(config)  # type: ignore[arg-type]
        if got is not None:
            return check.agent_id(got, field="agent_id_from_config(config)")
    auto = agent_from_config(config)
    if auto is not None:
        return check.agent_id(auto, field="agent_id (from thread_id and langgraph_node)")
    return check.agent_id(own, field="agent_id")
