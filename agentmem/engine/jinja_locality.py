"""Whether a jinja chat template writes each message from its neighbours only (read from its source).

A template is *local* when what it writes for message `k` can depend only on message `k`,
the messages next to it (`messages[loop.index0 ± 1]`, `loop.previtem`, `loop.nextitem`),
the first message (`messages[0]`), whether `k` is first or last, the parity of `k`, and
what is the same for every message (`tools`, `add_generation_prompt`, `bos_token`...).
Qwen2.5's template and plain ChatML are local; Qwen3's (it scans the messages backwards for
the last user query) is not.

Of a local template, the render of a short *window* — the first message, then the messages
from an odd index `j` on — holds the same text for the messages after `j` as the render of
the whole conversation (`agentmem.engine.jinja_tail` checks that text against the kept render
before it trusts the rest). `is_local` decides it from the template's syntax tree, refusing
whatever it cannot vouch for: any other use of `messages` (its length, a slice, `[-1]`, a
second loop over it, passing it to a macro), a loop over the messages with a filter, a
namespace written inside that loop (state carried from one message to the next), and any
use of the loop's index other than `== 0` and `% 2`, or of `loop.length`, `revindex`,
`cycle`, `changed`.
"""

from __future__ import annotations

from typing import Any

from jinja2 import nodes

__all__ = ["is_local"]

_NEIGHBOUR_ATTRS = frozenset({"first", "last", "previtem", "nextitem"})
_INDEX_ATTRS = frozenset({"index0", "index"})


def is_local(env: Any, source: str) -> bool:
    """Whether the template `source` (parsed with jinja2 environment `env`) is local (module docstring)."""
    try:
        tree = env.parse(source)
    except Exception:  # noqa: BLE001 - a template jinja2 cannot parse is simply not local
        return False
    loops = [f for f in tree.find_all(nodes.For) if _is_messages(f.iter)]
    if len(loops) != 1:
        return False
    loop = loops[0]
    if loop.test is not None or loop.recursive:
        return False
    return _ok(tree, loop, in_loop=False, loop_is_ours=False)


def _is_name(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.name == name


def _is_messages(node: nodes.Node) -> bool:
    return _is_name(node, "messages")


def _is_loop_attr(node: nodes.Node, attrs: frozenset[str]) -> bool:
    return isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == "loop" \
        and node.attr in attrs


def _is_const(node: nodes.Node, *values: Any) -> bool:
    return isinstance(node, nodes.Const) and type(node.value) is int and node.value in values


def _allowed_leaf(node: nodes.Node, loop_is_ours: bool) -> bool | None:
    """True/False for the patterns decided here; None: look inside."""
    if isinstance(node, nodes.Getitem) and _is_messages(node.node):
        if _is_const(node.arg, 0):
            return True  # messages[0]
        arg = node.arg
        if loop_is_ours and isinstance(arg, (nodes.Add, nodes.Sub)) and _is_loop_attr(arg.left, frozenset({"index0"})) \
                and _is_const(arg.right, 1):
            return True  # messages[loop.index0 ± 1]
        return loop_is_ours and _is_loop_attr(arg, frozenset({"index0"}))  # messages[loop.index0]
    if isinstance(node, nodes.Compare) and _is_loop_attr(node.expr, _INDEX_ATTRS) and loop_is_ours:
        first = 1 if node.expr.attr == "index" else 0  # type: ignore[attr-defined]
        return all(op.op in ("eq", "ne") and _is_const(op.expr, first) for op in node.ops)
    if isinstance(node, nodes.Mod) and _is_loop_attr(node.left, _INDEX_ATTRS) and loop_is_ours:
        return _is_const(node.right, 2)
    if loop_is_ours and isinstance(node, nodes.Getattr) and _is_name(node.node, "loop"):
        return node.attr in _NEIGHBOUR_ATTRS
    if isinstance(node, nodes.Name):
        if node.name == "messages":
            return False
        return not (node.name == "loop" and loop_is_ours)  # `loop` handed on whole
    return None


def _ok(node: nodes.Node, ours: nodes.For, *, in_loop: bool, loop_is_ours: bool) -> bool:
    """Walk `node`: `in_loop` inside the message loop's body, `loop_is_ours` where `loop` names that loop."""
    if node is ours:
        return all(_ok(c, ours, in_loop=True, loop_is_ours=True) for c in ours.body) and \
            all(_ok(c, ours, in_loop=in_loop, loop_is_ours=loop_is_ours) for c in ours.else_)
    if isinstance(node, nodes.For):  # another loop: `loop` is its own inside it
        return _ok(node.iter, ours, in_loop=in_loop, loop_is_ours=loop_is_ours) and all(
            _ok(c, ours, in_loop=in_loop, loop_is_ours=False)
            for c in (*node.body, *node.else_, *([node.test] if node.test is not None else [])))
    if isinstance(node, (nodes.Macro, nodes.CallBlock)):  # a macro's body sees no loop of its caller
        return all(_ok(c, ours, in_loop=in_loop, loop_is_ours=False) for c in node.iter_child_nodes())
    if in_loop and isinstance(node, (nodes.Assign, nodes.AssignBlock)) and isinstance(node.target, nodes.NSRef):
        return False  # a namespace carries state from one message to the next
    leaf = _allowed_leaf(node, loop_is_ours)
    if leaf is not None:
        return leaf
    return all(_ok(c, ours, in_loop=in_loop, loop_is_ours=loop_is_ours) for c in node.iter_child_nodes())
