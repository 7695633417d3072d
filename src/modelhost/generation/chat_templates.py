"""Every chat template rendered under a budget: CPU time, the size of what it writes and builds, and a stop
when its caller leaves (docs/operations.md, "Hostile input").

A chat template is a tenant's code (the deployment's `chat_template`, or the artifact's own
`chat_template.jinja` / `tokenizer_config.json`). transformers renders every one in jinja2's
`ImmutableSandboxedEnvironment`, which keeps a template from the process's files and attributes but not
from its CPU or its memory: a 12,000 × 12,000 loop held a replica 19.6 s, `'x' * 150000000` took 570 MB.
`install` makes transformers compile every chat template in `BudgetedSandbox` instead (one class name in
its module; nothing else of its rendering changes: the same variables, helpers, `{% generation %}` and
loop controls), so that the replicas' renders (`generation.requests.chat_prompt`, `engines.chat_images`,
the visual-question-answering task) and the gateway's compile check (`deployment_settings`) all go
through the one sandbox:

- Time: Jinja compiles to Python, and the sandbox's code generator (`_Generator`) starts every block it
  writes (each loop iteration, each macro call, each branch) with `environment.tick()`. A tick reads the
  thread's CPU clock every 16th time and ends a render past `seconds` (`MODELHOST_CHAT_TEMPLATE_SECONDS`,
  default 1 s: real templates take milliseconds), loops with empty bodies included. A render also asks
  its `stop` callable every 10 ms of CPU whether its caller has gone (the replica's transports say:
  `runtime.worker.sync_worker` looks for a `Cancel` or the connection's end, `in_thread` for a cancelled
  task); then it ends with `ClientClosedRequest`.
- Size: everything that can make a large value out of small ones is checked before it runs: `*` and
  `**` (strings, lists, integers), `+`, `%` and `~`, slicing, the string methods and filters that take
  a width or repeat their input (`center`, `ljust`, `replace`, `join`, `format`, `indent`, `wordwrap`,
  `tojson`, `batch`, ...), and every conversion of a value to text (output, `~`, `%`, `format`, the
  filters that stringify). None may make more than `max_chars` characters (a list item counts as 8), nor
  the whole render write more (its output, counted as it streams); and the render may build at most
  `BUILD_FACTOR` × `max_chars` in all (every string and list it makes, counted as made), which bounds
  the memory it can hold: about `BUILD_FACTOR` × `max_chars` × 4 bytes at worst, inside the replica's
  measured footprint.
- `max_chars` is `MODELHOST_CHAT_TEMPLATE_MAX_CHARS` where set, else derived from the model
  (`output_cap`): a prompt longer than its context × its longest token cannot fit the context anyway, so
  that many characters (at least `MIN_CHARS`) refuse nothing that could be answered.

Past a bound the render ends with a 400 naming `chat_template` and the bound (`chat_template_timeout`,
`chat_template_too_large`), an error of that request only; `modelhost_chat_templates_stopped_total`
counts them by reason. What a single built-in operation does once started is not interrupted: its input
and output are bounded by the checks above (a `sort` or a `tojson` of at most `max_chars` of data), so
that a render overruns its time by at most one such operation.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import jinja2
import jinja2.nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import generate_lorem_ipsum
from markupsafe import Markup

from modelhost.config import get_settings
from modelhost.errors import ClientClosedRequest, InvalidRequest
from modelhost.metrics import Counter

T = TypeVar("T")
MIN_CHARS = 1_000_000  # the least `max_chars` derived from a model: more than any context needs
MIN_CAP = 4096  # the least `max_chars` of all (`MODELHOST_CHAT_TEMPLATE_MAX_CHARS` below it is raised)
BUILD_FACTOR = 16  # a render builds at most this many times `max_chars` in all
ITEM_CHARS = 8  # what one item of a list, tuple or dict counts for (a pointer's bytes)
MAX_INT_BITS = 4096  # integers a template makes by `*` or `**`: far beyond any a template needs
CLOCK_EVERY = 16  # ticks between two reads of the CPU clock
STOP_EVERY_SECONDS = 0.01  # CPU time between two questions to `stop`
TIMEOUT = "chat_template_timeout"
TOO_LARGE = "chat_template_too_large"

STOPPED = Counter(
    "modelhost_chat_templates_stopped_total",
    "Chat template renders stopped, by reason: time, size (its bounds; the request got a 400 naming "
    "chat_template) or client_left.",
    ["reason"],
)


@dataclass(frozen=True)
class Limits:
    """A render's bounds (module docstring): CPU seconds, the most characters it may write or make at
    once, and what says its caller has gone (None: nothing)."""

    seconds: float
    max_chars: int
    stop: Callable[[], bool] | None = None


_LIMITS: ContextVar[Limits | None] = ContextVar("modelhost_chat_template_limits", default=None)


def default_limits() -> Limits:
    """The server's settings (`max_chars` unset: `MIN_CHARS`)."""
    settings = get_settings()
    return Limits(settings.chat_template_seconds, max(settings.chat_template_max_chars or MIN_CHARS, MIN_CAP))


@contextmanager
def limits(
    *, seconds: float | None = None, max_chars: int | None = None, stop: Callable[[], bool] | None = None
) -> Iterator[None]:
    """Renders in this block (this thread or task, and threads started from it with its context) get
    these bounds over the ones around them (the server's by default)."""
    current = _LIMITS.get() or default_limits()
    if seconds is not None:
        current = replace(current, seconds=seconds)
    if max_chars is not None:
        current = replace(current, max_chars=max(max_chars, MIN_CAP))
    if stop is not None:
        current = replace(current, stop=stop)
    token = _LIMITS.set(current)
    try:
        yield
    finally:
        _LIMITS.reset(token)


async def in_thread(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` in a thread, for a render that must not hold an event loop (the vLLM and
    llama.cpp replicas): the loop serves other requests meanwhile, and when this task is cancelled (its
    caller left) the render stops at its next check."""
    stopped = threading.Event()
    with limits(stop=stopped.is_set):  # `to_thread` runs `function` in a copy of this context
        try:
            return await asyncio.to_thread(function, *args)
        finally:
            stopped.set()


@functools.lru_cache(maxsize=8)
def _longest_token(tokenizer: Any) -> int:
    vocabulary: Mapping[str, int] = tokenizer.get_vocab()
    return max(map(len, vocabulary), default=1)


def output_cap(context_length: int, tokenizer: Any) -> int:
    """`max_chars` of a model's renders: `MODELHOST_CHAT_TEMPLATE_MAX_CHARS` where set, else its
    context × the characters of its longest token (no token covers more of a prompt's text, so a longer
    prompt cannot fit), at least `MIN_CHARS`."""
    configured: int = get_settings().chat_template_max_chars
    if configured:
        return max(configured, MIN_CAP)
    return max(MIN_CHARS, context_length * _longest_token(tokenizer))


# ---------------------------------------------------------------- one render's account


@dataclass(eq=False)
class _Render:
    limits: Limits
    started: float = field(default_factory=time.thread_time)
    ticks: int = 0
    built: int = 0
    asked_at: float = 0.0
    cap: int = 0  # `limits.max_chars`
    build_cap: int = 0  # what it may make in all

    def __post_init__(self) -> None:
        self.cap = self.limits.max_chars
        self.build_cap = BUILD_FACTOR * self.cap

    def tick(self) -> None:
        self.ticks += 1
        if not self.ticks % CLOCK_EVERY:
            self.clock()

    def clock(self) -> None:
        now = time.thread_time()
        if now - self.started > self.limits.seconds:
            STOPPED.labels("time").inc()
            raise InvalidRequest(
                f"The chat template ran past its time budget of {self.limits.seconds:g} CPU seconds "
                "(MODELHOST_CHAT_TEMPLATE_SECONDS).",
                param="chat_template",
                code=TIMEOUT,
            )
        stop = self.limits.stop
        if stop is not None and now - self.asked_at >= STOP_EVERY_SECONDS:
            self.asked_at = now
            if stop():
                STOPPED.labels("client_left").inc()
                raise ClientClosedRequest("The client left while its chat template was rendered.")

    def build(self, units: int) -> None:
        """Something of `units` characters was made."""
        self.built += units
        if self.built > self.build_cap:
            _too_large(f"made more than {BUILD_FACTOR} × its cap of {self.cap:,} characters in all")
        self.tick()


_RENDER: ContextVar[_Render | None] = ContextVar("modelhost_chat_template_render", default=None)


def _cap() -> int:
    render = _RENDER.get()
    return (render.limits if render is not None else _LIMITS.get() or default_limits()).max_chars


def _too_large(what: str) -> None:
    STOPPED.labels("size").inc()
    raise InvalidRequest(
        f"The chat template {what} (MODELHOST_CHAT_TEMPLATE_MAX_CHARS; derived from the model's context "
        "when unset).",
        param="chat_template",
        code=TOO_LARGE,
    )


def _check(units: int) -> None:
    """Refuse to make something of `units` characters (before it is made)."""
    cap = _cap()
    if units > cap:
        _too_large(f"would make {units:,} characters at once, over its cap of {cap:,}")


def _units(value: Any) -> int:
    kind = type(value)
    if kind is str:
        return len(value)
    if kind is int or kind is bool or kind is float or value is None:
        return 0
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, list | tuple | dict | set | frozenset):
        return ITEM_CHARS * len(value)
    return 0


def _made(value: T) -> T:
    """Count what an operation made into the render's account; returns it."""
    render = _RENDER.get()
    if render is not None:
        render.build(_units(value))
    return value


def _text_size(value: Any, limit: int) -> int:
    """At least the characters of `value` as text (`str`, its JSON), walking no further than `limit`: a
    list that holds the same large string many times, or lists nested into each other, is judged
    without being written out."""
    if isinstance(value, str | bytes):
        return len(value)
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += len(item) + 2
        elif isinstance(item, list | tuple | set | frozenset):
            total += 2 + 2 * len(item)
            stack.extend(item)
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            total += 8
    return total


def _check_text(value: Any) -> None:
    """Refuse to write `value` out as text where that would be over the cap."""
    if type(value) is str and len(value) <= MIN_CAP:
        return
    cap = _cap()
    if isinstance(value, str):
        if len(value) > cap:
            _check(len(value))
    elif isinstance(value, list | tuple | set | frozenset | dict):
        _check(_text_size(value, cap))


# ---------------------------------------------------------------- sizes of operations, before they run

_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def _printf_size(template: str, values: Any) -> int:
    """At most the characters of `template % values`."""
    args = values if isinstance(values, tuple) else (values,)
    largest = max((abs(v) for v in args if isinstance(v, int)), default=0)
    size = len(template) + _text_size(values, _cap())
    for match in _PRINTF.finditer(template):
        for number in match.groups():
            if number == "*":
                size += largest
            elif number:
                size += int(number)
    return size


def _product_size(left: Any, right: Any) -> int | None:
    """The size of `left * right` where it repeats a sequence or makes an integer, else None."""
    for times, sequence in ((left, right), (right, left)):
        if isinstance(times, int) and isinstance(sequence, str | bytes | list | tuple):
            return _units(sequence) * max(times, 0)
    if isinstance(left, int) and isinstance(right, int) and not isinstance(left, bool):
        bits = left.bit_length() + right.bit_length()
        return bits if bits > MAX_INT_BITS else None
    return None


def _check_integer(bits: int) -> None:
    if bits > MAX_INT_BITS:
        _too_large(f"would make an integer of {bits:,} bits, over {MAX_INT_BITS:,}")


def _binop_check(operator: str, left: Any, right: Any) -> None:
    if operator == "*":
        size = _product_size(left, right)
        if size is not None:
            if isinstance(left, int) and isinstance(right, int):
                _check_integer(size)
            _check(size)
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            _check_integer(left.bit_length() * right)
    elif operator == "+":
        texts = isinstance(left, str | bytes) and isinstance(right, str | bytes)
        if texts or (isinstance(left, list | tuple) and isinstance(right, list | tuple)):
            _check(_units(left) + _units(right))
    elif operator == "%" and isinstance(left, str):
        _check(_printf_size(left, right))


_SIZED_METHODS = frozenset(
    ["center", "ljust", "rjust", "zfill", "expandtabs", "replace", "join", "translate"]
)


def _string_method_size(text: Any, name: str, args: tuple[Any, ...]) -> int | None:
    """At most the characters of `text.<name>(*args)` (`text` a str or bytes) for the methods that can
    make more than `text`."""
    if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        return max(len(text), args[0])
    if name == "expandtabs":
        size = args[0] if args and isinstance(args[0], int) else 8
        tabs = int(text.count("\t" if isinstance(text, str) else b"\t"))
        return len(text) + tabs * max(size, 0)
    if (
        name == "replace"
        and len(args) >= 2
        and isinstance(args[0], str | bytes)
        and isinstance(args[1], str | bytes)
    ):
        count = int(text.count(args[0]))
        if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
            count = min(count, args[2])
        return len(text) + count * max(len(args[1]) - len(args[0]), 0)
    if name == "join" and args and isinstance(args[0], list):
        return len(text) * max(len(args[0]) - 1, 0) + sum(_text_size(item, _cap()) for item in args[0])
    if name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str | bytes)), default=1)
        return len(text) * max(longest, 1)
    return None


def _json_size(value: Any, indent: Any, limit: int) -> int:
    """At least the characters of `value` as JSON with `indent` (a number of spaces or a string)."""
    step = len(indent) if isinstance(indent, str) else max(int(indent or 0), 0)
    if not step:
        return _text_size(value, limit)
    total, stack = 0, [(value, 1)]
    while stack and total <= limit:
        item, depth = stack.pop()
        if isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
            total += 2 + len(item) * (depth * step + 2)
        elif isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
            total += 2 + len(item) * (depth * step + 4) + sum(_text_size(k, limit) for k in item)
        else:
            total += _text_size(item, limit) + 2
    return total


def _joined(values: list[Any], separator: Any) -> int:
    items = sum(_text_size(value, _cap()) for value in values)
    return items + len(str(separator)) * max(len(values) - 1, 0)


# Filters that can make more than their input, by name: the size of their result from their arguments
# (bound to their signature, defaults applied).
_FILTER_SIZES: dict[str, Callable[[dict[str, Any]], int]] = {
    "center": lambda a: max(_text_size(a["value"], _cap()), int(a["width"])),
    "indent": lambda a: (
        len(str(a["s"]))
        + (str(a["s"]).count("\n") + 1)
        * (len(a["width"]) if isinstance(a["width"], str) else int(a["width"]))
    ),
    "wordwrap": lambda a: (
        len(str(a["s"]))
        + (len(str(a["s"])) // max(int(a["width"]), 1) + 1) * len(str(a["wrapstring"] or "\n"))
    ),
    "replace": lambda a: (
        _string_method_size(
            str(a["s"]), "replace", (str(a["old"]), str(a["new"]), -1 if a["count"] is None else a["count"])
        )
        or 0
    ),
    "format": lambda a: _printf_size(str(a["value"]), a["args"] or a["kwargs"]),
    "tojson": lambda a: _json_size(a.get("x", a.get("value")), a.get("indent"), _cap()),
    "batch": lambda a: ITEM_CHARS * max(int(a["linecount"]), 0) if a["fill_with"] is not None else 0,
    "slice": lambda a: ITEM_CHARS * max(int(a["slices"]), 0),
}
# Filters that write their input out as text: it is judged first (`_check_text`)
_STRINGIFYING = frozenset(
    [
        "string",
        "upper",
        "lower",
        "title",
        "capitalize",
        "trim",
        "center",
        "indent",
        "wordwrap",
        "replace",
        "truncate",
        "striptags",
        "urlize",
        "escape",
        "e",
        "forceescape",
        "format",
        "tojson",
        "pprint",
        "wordcount",
        "urlencode",
        "xmlattr",
        "safe",
    ]
)


def _checked_filter(name: str, function: Any, environment: jinja2.Environment) -> Any:
    """`function` as the filter `name`, with its size checked before it runs (`_FILTER_SIZES`,
    `_STRINGIFYING`) and its result counted."""
    if getattr(function, "budgeted", False):
        return function
    size = _FILTER_SIZES.get(name)
    stringifies = name in _STRINGIFYING
    passes = 1 if getattr(function, "jinja_pass_arg", None) is not None else 0  # context/environment
    signature = inspect.signature(function) if size is not None else None

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if name == "join" and len(args) > passes:  # its input is read twice: once to judge, once to join
            values = list(args[passes])
            attribute = kwargs.get("attribute", args[passes + 2] if len(args) > passes + 2 else None)
            judged = values
            if attribute is not None:
                judged = list(map(jinja2.filters.make_attrgetter(environment, attribute), values))
            separator = kwargs.get("d", args[passes + 1] if len(args) > passes + 1 else "")
            _check(_joined(judged, separator))
            args = (*args[:passes], values, *args[passes + 1 :])
        elif name == "sum" and len(args) > passes:  # lists summed from `start`: their items
            values = list(args[passes])
            start = kwargs.get("start", args[passes + 2] if len(args) > passes + 2 else 0)
            if isinstance(start, list | tuple):
                _check(_units(start) + sum(_units(value) for value in values))
            args = (*args[:passes], values, *args[passes + 1 :])
        elif stringifies and len(args) > passes:
            _check_text(args[passes])
        if signature is not None and size is not None and (kwargs or len(args) > passes + 1):
            bound = signature.bind(*args, **kwargs)  # its defaults make nothing large: not bound
            bound.apply_defaults()
            _check(size(dict(bound.arguments)))
        return _made(function(*args, **kwargs))

    checked.budgeted = True  # type: ignore[attr-defined]
    return checked


class _Filters(dict[str, Any]):
    """The environment's filters, each checked (`_checked_filter`), those set later too (transformers
    sets its own `tojson` after making the environment)."""

    def __init__(self, filters: Mapping[str, Any], environment: jinja2.Environment) -> None:
        super().__init__()
        self._environment = environment
        self.update(filters)

    def __setitem__(self, name: str, function: Any) -> None:
        super().__setitem__(name, _checked_filter(name, function, self._environment))

    def update(self, *args: Any, **kwargs: Any) -> None:
        for name, function in dict(*args, **kwargs).items():
            self[name] = function


# ---------------------------------------------------------------- the sandbox


class _Generator(CodeGenerator):
    """Jinja's code generator, with a tick at the start of every block, and slices and `~` checked."""

    def blockvisit(self, nodes: Any, frame: Frame) -> None:
        self.writeline("environment.tick()")
        super().blockvisit(nodes, frame)

    @optimizeconst
    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        else:
            join = "markup_join" if frame.eval_ctx.autoescape else "str_join"
        self.write(f"environment.made({join}(environment.parts((")
        for argument in node.nodes:
            self.visit(argument, frame)
            self.write(", ")
        self.write("))))")

    @optimizeconst
    def visit_Getitem(self, node: jinja2.nodes.Getitem, frame: Frame) -> None:
        if not isinstance(node.arg, jinja2.nodes.Slice):
            super().visit_Getitem(node, frame)
            return
        self.write("environment.made(")  # a slice makes a new string or list
        self.visit(node.node, frame)
        self.write("[slice(")
        for part in (node.arg.start, node.arg.stop, node.arg.step):
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
            self.write(", ")
        self.write(")])")


class _CheckedFormatter(SandboxedFormatter):
    """`str.format` in the sandbox, each field judged before it is written, all of them together too."""

    made = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        width = max((int(n) for n in re.findall(r"\d+", format_spec)), default=0)
        self.made += max(_text_size(value, _cap()), width)
        _check(self.made)
        return super().format_field(value, format_spec)


class _CheckedEscapeFormatter(_CheckedFormatter, SandboxedEscapeFormatter):
    """The same for a `Markup` string's `format` (its fields escaped)."""


def _checked_output(value: Any) -> Any:
    """Every `{{ ... }}` (the environment's `finalize`): judged before it is written out."""
    _check_text(value)
    return value


class BudgetedTemplate(jinja2.Template):
    """A template of `BudgetedSandbox`: each render (whole, or streamed by `generate`: transformers'
    assistant-token masks) under the limits in force (`limits`; the server's by default)."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        with _rendering():
            return super().render(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Iterator[str]:
        with _rendering() as render:
            written = 0
            for piece in super().generate(*args, **kwargs):
                written += len(piece)
                if written > render.limits.max_chars:
                    _too_large(f"wrote more than its cap of {render.limits.max_chars:,} characters")
                yield _made(piece)


class BudgetedSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox (`ImmutableSandboxedEnvironment`), with the budget of the module docstring:
    made by transformers with its own arguments, helpers and extensions (`install`)."""

    code_generator_class = _Generator
    template_class = BudgetedTemplate
    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("finalize", _checked_output)
        super().__init__(*args, **kwargs)
        self.filters = _Filters(self.filters, self)

    def tick(self) -> None:
        render = _RENDER.get()
        if render is not None:
            render.tick()

    def made(self, value: T) -> T:
        return _made(value)

    def parts(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        """The operands of a `~`, judged before they are joined."""
        cap = _cap()
        _check(sum(_text_size(value, cap) for value in values))
        return values

    def concat(self, pieces: Any) -> str:
        """A render's output, or a block's (`{% set %}`, a macro's, a filter block's), capped as it
        streams."""
        cap, total, kept = _cap(), 0, []
        for piece in pieces:
            total += len(piece)
            if total > cap:
                _too_large(f"wrote more than its cap of {cap:,} characters")
            kept.append(piece)
        return _made("".join(kept))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        render = _RENDER.get()
        if operator == "+" and type(left) is str and type(right) is str and render is not None:
            size = len(left) + len(right)  # the most common by far: a template's strings joined
            if size > render.cap:
                _check(size)
            render.build(size)
            return left + right
        _binop_check(operator, left, right)
        return _made(super().call_binop(context, operator, left, right))

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, str | bytes) and getattr(obj, "__name__", None) in _SIZED_METHODS:
            if obj.__name__ == "join" and args:  # its input is read twice: once to judge, once to join
                args = (list(args[0]), *args[1:])
            size = _string_method_size(owner, obj.__name__, args)
            if size is not None:
                _check(size)
        elif obj is generate_lorem_ipsum:
            bound = inspect.signature(generate_lorem_ipsum).bind(*args, **kwargs)
            bound.apply_defaults()
            _check(int(bound.arguments["n"]) * int(bound.arguments["max"]) * 16)
        return _made(super().call(context, obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """jinja2's own (`str.format` and `format_map` through the sandbox's formatter), with fields
        judged before they are written (`_CheckedFormatter`)."""
        if not isinstance(value, types.MethodType | types.BuiltinMethodType) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        text: Any = value.__self__
        if not isinstance(text, str):
            return None
        is_map = value.__name__ == "format_map"
        environment, kind = self, type(text)

        def formatter() -> _CheckedFormatter:
            if isinstance(text, Markup):
                return _CheckedEscapeFormatter(environment, escape=text.escape)
            return _CheckedFormatter(environment)

        def checked(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one positional argument")
                return _made(kind(formatter().vformat(text, (), args[0])))
            return _made(kind(formatter().vformat(text, args, kwargs)))

        return functools.update_wrapper(checked, value)


@contextmanager
def _rendering() -> Iterator[_Render]:
    render = _RENDER.get()
    if render is not None:  # a template rendered inside another's render: one account
        yield render
        return
    render = _Render(_LIMITS.get() or default_limits())
    token = _RENDER.set(render)
    try:
        yield render
    finally:
        _RENDER.reset(token)


def install() -> None:
    """Make transformers compile every chat template in `BudgetedSandbox` (in place of
    `ImmutableSandboxedEnvironment`, which it makes with its own arguments, filters and globals) and
    forget the templates it compiled before. Idempotent; the replicas call it where they load a
    tokenizer or a processor (`engines.loader`)."""
    from transformers.utils import chat_template_utils

    if getattr(chat_template_utils, "ImmutableSandboxedEnvironment", None) is BudgetedSandbox:
        return
    chat_template_utils.ImmutableSandboxedEnvironment = BudgetedSandbox
    chat_template_utils._compile_jinja_template.cache_clear()
    compiled = chat_template_utils._compile_jinja_template("{{ 1 }}")
    if not isinstance(compiled.environment, BudgetedSandbox):  # transformers changed how it compiles
        raise RuntimeError("transformers no longer compiles chat templates where modelhost can budget them")
