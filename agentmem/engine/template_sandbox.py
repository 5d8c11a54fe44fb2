"""A jinja2 sandbox for a model's chat template, with limits that stop a runaway render.

A GGUF's `tokenizer.chat_template` is code from whoever made the file. jinja2's
`ImmutableSandboxedEnvironment` already refuses attribute tricks (`__class__`,
`__globals__`...) and mutation; `SandboxedTemplate` adds:

* a wall-time deadline, checked at every loop iteration (each `{% for %}` iterable is
  wrapped when the template is compiled), call, attribute or item lookup, filter,
  arithmetic operator and output chunk, so two nested `range(100000)` loops stop at
  the deadline instead of hanging the process;
* an output budget: `*`, `+` and `%` on strings and lists, filters, calls, integer
  arguments and the output itself are checked against `RenderLimits.max_chars`
  before (where the size is known) or right after the work, so a 27-byte template
  cannot build 40 MB;
* one exception type: a syntax error (when the template is compiled), a sandbox
  security error, an exceeded limit and any other failure of the template surface as
  `ChatTemplateError`, the original chained as its cause. The template's own
  `raise_exception(msg)` (a template refusing the messages) raises `MessageError`.

The limits stop the work itself, in the rendering thread; no thread is left running.

Example:
    >>> t = SandboxedTemplate("{% for m in messages %}[{{ m.role }}]{% endfor %}")
    >>> t.render({"messages": [{"role": "user"}]})
    '[user]'
    >>> SandboxedTemplate("{{ 'x' * 10**9 }}").render({})
    Traceback (most recent call last):
    ...
    agentmem.errors.ChatTemplateError: chat template exceeded its output budget: '*' would make 1000000000 items (max_chars=4000000)
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

from agentmem.errors import ChatTemplateError, ConfigError, MessageError

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
except ImportError as exc:  # pragma: no cover - jinja2 is a dependency
    raise ImportError("the 'jinja' chat format needs jinja2: pip install jinja2") from exc

__all__ = ["RenderLimits", "SandboxedTemplate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RenderLimits:
    """Limits of one chat-template render call.

    Attributes:
        max_seconds: wall time of one call (`ChatRenderer.render` renders a history
            once or a few times; they share the deadline).
        max_chars: characters of one render's output, and the largest string or list
            an operator, filter or call may build (the default is far above any
            context window: about a million tokens).
    """

    max_seconds: float = 5.0
    max_chars: int = 4_000_000

    def __post_init__(self) -> None:
        if not (isinstance(self.max_seconds, (int, float)) and self.max_seconds > 0):
            raise ConfigError(f"RenderLimits.max_seconds must be a positive number, got {self.max_seconds!r}")
        if isinstance(self.max_chars, bool) or not isinstance(self.max_chars, int) or self.max_chars < 1:
            raise ConfigError(f"RenderLimits.max_chars must be a positive int, got {self.max_chars!r}")


@dataclass(slots=True)
class _Budget:
    deadline: float
    max_chars: int
    ticks: int = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatTemplateError("chat template exceeded its time limit (RenderLimits.max_seconds)")

    def size(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise ChatTemplateError(
                f"chat template exceeded its output budget: {what} would make {n} items (max_chars={self.max_chars})"
            )


_current: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("agentmem_template_budget", default=None)


def _tick() -> _Budget | None:
    budget = _current.get()
    if budget is not None:
        budget.tick()
    return budget


def _sized(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else None


def _check_args(budget: _Budget | None, args: Iterable[Any], what: str) -> None:
    if budget is None:
        return
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > budget.max_chars:
            budget.size(abs(a), f"an integer argument of {what}")


def _check_result(budget: _Budget | None, value: Any, what: str) -> Any:
    n = _sized(value)
    if budget is not None and n is not None:
        budget.size(n, what)
    return value


class _LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox with a deadline and a size budget in every hook it offers."""

    intercepted_binops = frozenset({"*", "+", "%", "**"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}

    # every {% for %} iterates through guard_iter (inserted at compile time, not nameable by a template)
    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in list(tree.find_all(nodes.For)):
            guard = object.__new__(nodes.InternalName)
            nodes.Node.__init__(guard, "environment.guard_iter", lineno=loop.lineno)
            loop.iter = nodes.Call(guard, [loop.iter], [], None, None, lineno=loop.lineno)
        return tree

    def guard_iter(self, iterable: Any) -> Iterator[Any]:
        budget = _current.get()
        if budget is None:
            yield from iterable
            return
        for item in iterable:
            budget.tick()
            yield item

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja's signature
        budget = _tick()
        _check_args(budget, (*args, *kwargs.values()), "a call")
        return _check_result(budget, super().call(__context, __obj, *args, **kwargs), "a call")

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        budget = _tick()
        if budget is not None:
            if operator_ == "*":
                for seq, times in ((left, right), (right, left)):
                    n = _sized(seq)
                    if n is not None and isinstance(times, int):
                        budget.size(n * max(times, 0), "'*'")
            elif operator_ == "+":
                a, b = _sized(left), _sized(right)
                if a is not None and b is not None:
                    budget.size(a + b, "'+'")
            elif operator_ == "**" and isinstance(right, int) and isinstance(left, int) and abs(left) > 1:
                budget.size(abs(right) * max(abs(left).bit_length(), 1) // 8, "'**' (bytes)")
            elif operator_ == "%":
                _check_args(budget, right if isinstance(right, tuple) else (right,), "'%'")
        return _check_result(budget, super().call_binop(context, operator_, left, right), f"'{operator_}'")


def _guard_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)  # keeps jinja's pass_context / pass_environment marks
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _tick()
        _check_args(budget, (*args[1:], *kwargs.values()), f"filter {name!r}")
        return _check_result(budget, f(*args, **kwargs), f"filter {name!r}")

    return guarded


def _raise_exception(msg: str) -> None:
    raise MessageError(f"chat template rejected the messages: {msg}")


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    """`tojson` as Hugging Face's chat-template renderer (and llama.cpp's) defines it.

    jinja2's own filter sorts keys and HTML-escapes `<>&'`; models were trained on
    renders with keys in their order and no escaping, and a tool call must render
    back exactly as the model wrote it (`agentmem.tools.formats`).
    """
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class SandboxedTemplate:
    """A compiled chat template whose renders obey `RenderLimits`.

    Args:
        source: the jinja2 source (a GGUF's `tokenizer.chat_template`).
        limits: wall time and output budget; `RenderLimits()` by default.

    Raises:
        ChatTemplateError: the template does not compile (the syntax error chained).
    """

    def __init__(self, source: str, limits: RenderLimits | None = None) -> None:
        self.limits = limits or RenderLimits()
        env = _LimitedEnvironment()
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _guard_filter("tojson", _tojson)
        try:
            self._tpl = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"chat template does not compile: line {exc.lineno}: {exc.message}") from exc
        except Exception as exc:  # noqa: BLE001 - whatever the compiler raises is the template's fault
            raise ChatTemplateError(f"chat template does not compile: {type(exc).__name__}: {exc}") from exc

    def deadline(self) -> float:
        """A deadline `max_seconds` from now, to share among the renders of one call."""
        return time.monotonic() + self.limits.max_seconds

    def render(self, variables: Mapping[str, Any], *, deadline: float | None = None) -> str:
        """Render with the limits.

        Args:
            variables: the template's variables (`messages`, `add_generation_prompt`...).
            deadline: a `time.monotonic()` deadline from `deadline()`; a fresh one by default.

        Returns:
            The rendered text.

        Raises:
            ChatTemplateError: the template broke the sandbox, a limit, or failed.
            MessageError: the template called `raise_exception` (it refuses the messages).
        """
        budget = _Budget(deadline if deadline is not None else self.deadline(), self.limits.max_chars)
        token = _current.set(budget)
        try:
            out: list[str] = []
            n = 0
            for chunk in self._tpl.generate(**variables):
                n += len(chunk)
                budget.size(n, "the output")
                budget.tick()
                out.append(chunk)
            return "".join(out)
        except (ChatTemplateError, MessageError):
            raise
        except SecurityError as exc:
            raise ChatTemplateError(f"chat template attempted an unsafe operation: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - any failure of the template's code
            raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc
        finally:
            _current.reset(token)
