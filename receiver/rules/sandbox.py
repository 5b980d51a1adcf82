"""The metered Jinja2 sandbox: caps on the work a template does, whatever the event holds.

Event values are data a sender controls, and templates act on them as written: a loop
over a 60 KB field, nested, held the event loop for seconds. So one rule's templates
for one event take at most MAX_LOOP_STEPS for-loop steps (nested ones count step by
step) and MAX_RENDER_SECONDS of CPU, and no single operation builds a value over
MAX_VALUE characters (``*``, ``**``, ``%`` and format widths, padding, ``replace``,
``join``, ``namespace()`` attributes): past a cap, rendering stops with
TemplateLimitError, and the rule sends its fallback. templates.render cuts the output
at MAX_OUTPUT characters.

How: the code generator writes every ``for x in ITER`` as ``for x in ITER|_steps``,
which counts the steps; the sandbox's hooks (calls, attributes, items, the ``*``,
``**`` and ``%`` operators) and the filters that can build big values tick the render's
Budget, which reads the clock every 8th tick.

    budget = Budget()  # one for a rule's title, body and key
    with charged_to(budget):
        text = template.render(ctx)
"""

from __future__ import annotations

import operator
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.compiler import CodeGenerator, Frame
from jinja2.filters import FILTERS
from jinja2.runtime import Context
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum

from receiver.matchers import show

MAX_LOOP_STEPS = 10_000  # for-loop steps of one rule's templates for one event, nested too
MAX_RENDER_SECONDS = 0.05  # CPU time of one rule's templates for one event
MAX_VALUE = 1_000_000  # characters (or items) one operation may build
GIL_SLICE = 0.001  # seconds of CPU a render runs before it lets other threads run


class TemplateLimitError(Exception):
    """A template went past one of the caps above; its notification is the fallback."""


class Budget:
    """What one rule's templates may still spend on one event: loop steps and CPU time.

    Every loop step, call, attribute, item and checked filter is a tick; every 8th reads
    the clock (about 1 µs), the first starting it. The clock is the thread's CPU time:
    rendering in a worker thread, waiting for the GIL while the event loop answers
    requests costs a template nothing.
    """

    __slots__ = ("deadline", "paused_at", "steps", "ticks")

    def __init__(self) -> None:
        self.steps = MAX_LOOP_STEPS
        self.ticks = 0
        self.deadline = 0.0  # set by the first check
        self.paused_at = 0.0

    def check(self) -> None:
        now = time.thread_time()
        if not self.deadline:
            self.deadline, self.paused_at = now + MAX_RENDER_SECONDS, now
        elif now > self.deadline:
            raise TemplateLimitError(
                f"stopped after {MAX_RENDER_SECONDS * 1000:g} ms, the most a rule's"
                " templates may take for one event"
            )
        elif now - self.paused_at >= GIL_SLICE:
            # Let the event loop have the GIL, if it waits for it: a long render in the
            # rules thread then delays it by about GIL_SLICE, not Python's 5 ms switch
            # interval each time it wants the GIL back (measured: p99 of a loopback
            # round trip 4.5 ms instead of 18 to 42 ms).
            time.sleep(0)
            self.paused_at = now


_BUDGET: ContextVar[Budget | None] = ContextVar("template_budget", default=None)


def _tick() -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.ticks += 1
        if not budget.ticks & 7:
            budget.check()


@pass_context  # never folded at compile time (a context filter cannot be)
def _steps(context: Context, iterable: Iterable[Any]) -> Iterator[Any]:
    """Every for loop's iterable, as the compiler writes it: each step is counted."""
    budget = _BUDGET.get()
    if budget is None:
        yield from iterable
        return
    for item in iterable:
        budget.steps -= 1
        if budget.steps < 0:
            raise TemplateLimitError(
                f"stopped after {MAX_LOOP_STEPS:,} loop steps, the most a rule's templates"
                " may take for one event"
            )
        budget.ticks += 1
        if not budget.ticks & 7:
            budget.check()
        yield item


class _CodeGenerator(CodeGenerator):
    """Jinja's code generator, with ``for x in ITER`` written as ``for x in ITER|_steps``."""

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        for loop in list(node.find_all(nodes.For)):
            loop.iter = nodes.Filter(loop.iter, "_steps", [], [], None, None, lineno=loop.lineno)
        super().visit_Template(node, frame)


def _too_big(size: int, what: str) -> TemplateLimitError:
    return TemplateLimitError(
        f"{what} would build {size:,} characters or items; one operation may build"
        f" at most {MAX_VALUE:,}"
    )


# A printf-style (%) or str.format spec whose width or precision has 7 digits or more,
# or comes from an argument (* or a nested {}): it could build a huge string.
_WIDE_PERCENT = re.compile(r"%[^a-zA-Z%]*?(?:\*|\d{7})")
_WIDE_FORMAT = re.compile(r"\{[^{}]*:[^{}]*(?:\d{7}|\{)")


def _check_format(spec: str) -> None:
    if _WIDE_PERCENT.search(spec) or _WIDE_FORMAT.search(spec):
        raise TemplateLimitError(
            f"format {show(spec)}: a width or precision of a million or more, or one"
            " taken from an argument, is not allowed"
        )


def _check_replace(text: str, old: Any, new: Any) -> None:
    times = len(text) + 1 if not str(old) else text.count(str(old))
    size = len(text) + times * len(str(new))
    if size > MAX_VALUE:
        raise _too_big(size, "replace")


def _check_width(what: str, text: str, width: Any) -> None:
    if isinstance(width, int) and width > MAX_VALUE:
        raise _too_big(width, what)
    if isinstance(width, str) and len(width) * (text.count("\n") + 1) > MAX_VALUE:  # indent
        raise _too_big(len(width) * (text.count("\n") + 1), what)


def _check_method(text: str, name: str, args: tuple[Any, ...]) -> None:
    """Refuse, before it runs, a str method called from a template that would build more
    than MAX_VALUE characters."""
    if name in ("center", "ljust", "rjust", "zfill", "expandtabs") and args:
        _check_width(name, text, args[0])
    elif name == "replace" and len(args) >= 2:
        _check_replace(text, args[0], args[1])
    elif name in ("format", "format_map"):
        _check_format(text)
    elif name == "join" and args and hasattr(args[0], "__len__"):
        if len(text) * len(args[0]) > MAX_VALUE:
            raise _too_big(len(text) * len(args[0]), "join")


def _check_filter(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """The same for the built-in filters that can build far more than they are given."""
    value = args[0] if args else None
    rest = args[1:]
    if name in ("center", "indent") and isinstance(value, str):
        _check_width(name, value, rest[0] if rest else kwargs.get("width"))
    elif name == "replace" and isinstance(value, str) and len(rest) >= 2:
        _check_replace(value, rest[0], rest[1])
    elif name == "format" and isinstance(value, str):
        _check_format(value)
    elif name == "join" and isinstance(value, Sized):
        sep = rest[0] if rest else kwargs.get("d", "")
        if isinstance(sep, str) and len(sep) * len(value) > MAX_VALUE:
            raise _too_big(len(sep) * len(value), "join")
    elif name in ("batch", "slice"):
        count = rest[0] if rest else kwargs.get("linecount", kwargs.get("slices"))
        if isinstance(count, int) and count > MAX_LOOP_STEPS:
            raise TemplateLimitError(f"{name}({count}): at most {MAX_LOOP_STEPS:,} parts")


class _Namespace(Namespace):
    """namespace(), whose attributes (the one way a value outlives a loop step) are
    refused past MAX_VALUE characters or items: ``ns.s = ns.s ~ ns.s`` doubles."""

    def __setitem__(self, name: str, value: Any) -> None:
        if isinstance(value, str | list | tuple | dict) and len(value) > MAX_VALUE:
            raise _too_big(len(value), f"namespace attribute {name}")
        super().__setitem__(name, value)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    if n > 100 or max > 1000:
        raise TemplateLimitError("lipsum: at most 100 paragraphs of 1000 words")
    return str(generate_lorem_ipsum(n, html, min, max))


def _binop(op: str, left: Any, right: Any) -> Any:
    """``*``, ``**`` and ``%`` with their results' sizes checked before they are built."""
    if op == "*":
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(times, int):
                if len(seq) * times > MAX_VALUE:
                    raise _too_big(len(seq) * times, "*")
        return left * right
    if op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0:
            digits = int(abs(left).bit_length() * right * 0.302) + 1
            if abs(left) > 1 and digits > 4300:  # Python's own cap on printing an int
                raise TemplateLimitError(f"{left} ** {right} has about {digits:,} digits")
        return left**right
    if isinstance(left, str):  # %
        _check_format(left)
    return operator.mod(left, right)


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, metering work: each call, attribute and item costs a tick
    of the render's Budget, and the operators that can build big values are checked."""

    code_generator_class = _CodeGenerator
    intercepted_binops = frozenset({"*", "**", "%"})

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        _tick()
        return _binop(operator, left, right)

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _tick()
        target = getattr(__obj, "__wrapped__", __obj)  # str.format, wrapped by the sandbox
        text = getattr(target, "__self__", None)
        if isinstance(text, str):
            name = getattr(target, "__name__", "")
            if name == "join" and args and not isinstance(args[0], Sized):
                args = (list(args[0]), *args[1:])  # a generator: measured, then joined
            _check_method(text, name, args)
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)


_CHECKED_FILTERS = ("center", "indent", "replace", "format", "join", "batch", "slice")


def _metered(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A built-in filter costing a tick, refused before it runs if it would build too much."""
    wants = getattr(fn, "jinja_pass_arg", None)
    skip = 0 if wants is None else 1  # the context or environment it is passed first

    def filter_(*args: Any, **kwargs: Any) -> Any:
        _tick()
        if name == "join" and len(args) > skip and not isinstance(args[skip], Sized):
            args = (*args[:skip], list(args[skip]), *args[skip + 1 :])  # measured, then joined
        _check_filter(name, args[skip:], kwargs)
        return fn(*args, **kwargs)

    filter_.__name__ = getattr(fn, "__name__", name)
    if wants is not None:
        filter_.jinja_pass_arg = wants  # type: ignore[attr-defined]
    return filter_


@contextmanager
def charged_to(budget: Budget) -> Iterator[None]:
    """Charge the templates rendered inside (in this thread) to budget."""
    token = _BUDGET.set(budget)
    try:
        yield
    finally:
        _BUDGET.reset(token)


def environment(**options: Any) -> ImmutableSandboxedEnvironment:
    """The immutable sandbox with Jinja's options, metered as above."""
    env = _Sandbox(**options)
    env.filters.update({name: _metered(name, FILTERS[name]) for name in _CHECKED_FILTERS})
    env.filters["_steps"] = _steps
    env.globals.update(namespace=_Namespace, lipsum=_lipsum)
    return env


def check_ranges(ast: nodes.Template) -> None:
    """Refuse range() calls with constant bounds that always fail: longer than MAX_RANGE
    (the sandbox refuses them), or looped over for more than MAX_LOOP_STEPS."""
    looped = {id(loop.iter) for loop in ast.find_all(nodes.For)}
    for call in ast.find_all(nodes.Call):
        if not (isinstance(call.node, nodes.Name) and call.node.name == "range"):
            continue
        if call.kwargs or call.dyn_args or call.dyn_kwargs:
            continue
        bounds = [_constant_int(arg) for arg in call.args]
        if not bounds or len(bounds) > 3 or None in bounds:
            continue
        try:
            steps = len(range(*bounds))  # type: ignore[arg-type]
        except (ValueError, OverflowError):
            steps = MAX_RANGE + 1
        if steps > MAX_RANGE:
            raise ValueError(
                f"line {call.lineno}: range() of {steps:,} items; the sandbox allows {MAX_RANGE:,}"
            )
        if id(call) in looped and steps > MAX_LOOP_STEPS:
            raise ValueError(
                f"line {call.lineno}: a loop over range() of {steps:,} steps; a rule's"
                f" templates may take {MAX_LOOP_STEPS:,} loop steps for one event"
            )


def _constant_int(node: nodes.Node) -> int | None:
    """An integer written in the template (``1000``, ``10**9``, ``-1``), else None."""
    if isinstance(node, nodes.Const):
        value = node.value
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if isinstance(node, nodes.Neg):
        inner = _constant_int(node.node)
        return None if inner is None else -inner
    if isinstance(node, nodes.Pow | nodes.Mul | nodes.Add | nodes.Sub):
        left, right = _constant_int(node.left), _constant_int(node.right)
        if left is None or right is None:
            return None
        if isinstance(node, nodes.Add | nodes.Sub):
            return left + right if isinstance(node, nodes.Add) else left - right
        if isinstance(node, nodes.Mul):
            return left * right
        if right < 0:
            return None
        # Past every cap already: no need to work out 10**10**10.
        return 2**64 if right > 64 and abs(left) > 1 else int(left ** min(right, 64))
    return None
