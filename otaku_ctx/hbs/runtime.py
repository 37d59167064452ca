"""Rendering: plain data in, role blocks out. Never imports pybars3.

A compiled template is a tree of closures (steps) over a `Frame`; the steps only index
dicts and lists and call the fixed helpers below, so a template reaches nothing but data.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import TemplateError
from ..story.model import Role
from .blocks import Block

ROLE_HELPERS: dict[str, Role] = {"systemBlock": "system", "userBlock": "user", "assistantBlock": "assistant"}
BLOCK_HELPERS = ("if", "unless", "each", "with", *ROLE_HELPERS)
# name -> (fewest, most arguments; None = any number)
INLINE_HELPERS: dict[str, tuple[int, int | None]] = {
    "eq": (2, 2),
    "ne": (2, 2),
    "gt": (2, 2),
    "lt": (2, 2),
    "and": (1, None),
    "or": (1, None),
    "not": (1, 1),
    "json": (1, 1),
    "lookup": (2, 2),
    "trim": (0, 0),
}


_SCALARS = (str, int, float, bool, type(None))  # exact types: immutable, handed over as they are


def to_plain(value: Any, where: str, name: str) -> Any:
    """Copy `value` into plain data (dict/list/str/int/float/bool/None) or refuse it."""
    try:
        return _plain(value, frozenset())
    except _NotPlain as refused:
        path = where + "".join(f"[{step}]" if type(step) is int else f".{step}" for step in reversed(refused.path))
        raise TemplateError(name, None, None, f"{refused.lead} at {path}{refused.rest}") from None


class _NotPlain(Exception):
    """A value templates may not see. Its path (innermost step first) is filled in on the way
    out, so plain data, the common case, never has a path formatted."""

    def __init__(self, lead: str, rest: str = "") -> None:
        self.lead, self.rest = lead, rest
        self.path: list[str | int] = []


def _plain(value: Any, seen: frozenset[int]) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if isinstance(value, str):  # a subclass: its methods must not reach the template
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if not isinstance(value, Mapping | list | tuple):
        raise _NotPlain(
            "context value",
            f" is a {kind.__name__}: templates only see dicts, lists, strings, numbers, booleans and None "
            "(convert it before rendering)",
        )
    if id(value) in seen:
        raise _NotPlain("context value", " contains itself")
    seen = seen | {id(value)}
    if isinstance(value, Mapping):
        plain = {}
        for key, item in value.items():
            if type(key) is not str:
                if not isinstance(key, str | int) or isinstance(key, bool):
                    raise _NotPlain(f"context key {key!r}", " is not a string")
                key = str.__str__(key) if isinstance(key, str) else str(int.__int__(key))
            try:
                plain[key] = _plain(item, seen)
            except _NotPlain as refused:
                refused.path.append(key)
                raise
        return plain
    items = []
    for index, item in enumerate(value):
        try:
            items.append(_plain(item, seen))
        except _NotPlain as refused:
            refused.path.append(index)
            raise
    return items


def pick(value: Any, key: str) -> Any:
    """One path step: a dict by key, a list by index (or `length`), a string's `length`; else None."""
    kind = type(value)
    if kind is dict:
        return value.get(key)
    if kind is list:
        if key == "length":
            return len(value)
        if key.isascii() and key.isdigit():
            index = int(key)
            return value[index] if index < len(value) else None
        return None
    if kind is str and key == "length":
        return len(value)
    return None


def walk(value: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        if value is None:
            return None
        value = pick(value, key)
    return value


def truthy(value: Any) -> bool:
    """Handlebars' `if`: None, False, 0, "", [] and NaN are false; an empty object is true."""
    kind = type(value)
    if kind is dict:
        return True
    if kind is float and math.isnan(value):
        return False
    return bool(value)


def _is_empty(value: Any) -> bool:
    """Handlebars' `isEmpty` (used by `with`): None, False, "", [] and NaN, but not 0."""
    if value is None or value is False:
        return True
    kind = type(value)
    if kind is str or kind is list:
        return not value
    return kind is float and math.isnan(value)


def display(value: Any) -> str:
    """What `{{x}}` prints, as Handlebars.js would (but never HTML-escaped)."""
    kind = type(value)
    if kind is str:
        return value
    if value is None:
        return ""
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if kind is list:
        return ",".join(display(item) for item in value)
    return "[object Object]"


def _eq(left: Any, right: Any) -> bool:
    if (type(left) is bool) != (type(right) is bool):  # like ===: true is not 1
        return False
    return left == right


def _comparable(left: Any, right: Any) -> bool:
    numbers = (int, float)
    return (type(left) in numbers and type(right) in numbers) or (type(left) is str and type(right) is str)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


def _lookup(value: Any, key: Any) -> Any:
    if type(key) is int:
        key = str(key)
    return pick(value, key) if type(key) is str else None


HELPER_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "eq": _eq,
    "ne": lambda left, right: not _eq(left, right),
    "gt": lambda left, right: _comparable(left, right) and left > right,
    "lt": lambda left, right: _comparable(left, right) and left < right,
    "and": lambda *values: all(truthy(value) for value in values),
    "or": lambda *values: any(truthy(value) for value in values),
    "not": lambda value: not truthy(value),
    "json": _json,
    "lookup": _lookup,
}

PARENT_DATA = " parent"  # a key no `@name` path can spell (names have no spaces)


class Frame:
    """Where a block body runs: its context, the frame `../` reaches, `@data` and block params."""

    __slots__ = ("context", "parent", "data", "params")

    def __init__(self, context: Any, parent: Frame | None, data: dict, params: tuple | None) -> None:
        self.context = context
        self.parent = parent
        self.data = data
        self.params = params  # (values of the innermost `as |...|`, outer params) or None

    def enter(self, context: Any, data: dict | None = None, params: tuple | None = None) -> Frame:
        """A child frame; as in Handlebars 4, `../` gains a level only when the context changes."""
        parent = self.parent if context is self.context else self
        return Frame(context, parent, self.data if data is None else data, self.params if params is None else params)


# Items of the output stream that are not text. Rendered values are always `str`, so no data
# can ever produce one of these: story text cannot open, close or trim a block.
TRIM = object()
ROLE_END = object()


class Layout(str):
    """Text the template itself wrote (its literal text, never a value): the only text whose
    newlines at a block's edges are layout, dropped when the block is cut. A value prints as a
    plain `str` (`to_plain` makes every string one), so data can never pass for layout."""

    __slots__ = ()


@dataclass(frozen=True)
class _RoleStart:
    role: Role


ROLE_START = {role: _RoleStart(role) for role in ROLE_HELPERS.values()}

_LEADING_NEWLINES = re.compile(r"\A(?:\r?\n)+")
_TRAILING_NEWLINES = re.compile(r"(?:\r?\n)+\Z")


def _join_trimmed(pieces: list) -> str:
    """Join text pieces; around each `{{trim}}` drop every adjacent newline (SillyTavern's trim)."""
    if TRIM not in pieces:
        return "".join(pieces)
    runs: list[str] = [""]
    for piece in pieces:
        if piece is TRIM:
            runs.append("")
        else:
            runs[-1] += piece
    last = len(runs) - 1
    for index, run in enumerate(runs):
        if index > 0:
            run = _LEADING_NEWLINES.sub("", run)
        if index < last:
            run = _TRAILING_NEWLINES.sub("", run)
        runs[index] = run
    return "".join(runs)


def assemble_blocks(stream: list) -> list[Block]:
    """Cut the output stream at role block edges into `Block`s.

    Text inside a role block belongs to it, even if empty (an empty assistant block can be the
    turn the model continues). Loose text becomes a system block unless it is only whitespace.
    Every block loses the template's own newlines at its two edges (`_without_layout_edges`),
    never its spaces, nor a value's own newlines (a message that ends in a blank line keeps it);
    nothing is merged.
    """
    blocks: list[Block] = []
    pieces: list = []
    role: Role = "system"  # loose text, outside any role block, is system text
    for item in stream:
        if isinstance(item, str) or item is TRIM:
            pieces.append(item)
            continue
        text = _join_trimmed(_without_layout_edges(pieces))
        pieces = []
        if item is ROLE_END:
            blocks.append(Block(role, text))
            role = "system"
        else:
            if text.strip():
                blocks.append(Block("system", text))
            role = item.role
    text = _join_trimmed(_without_layout_edges(pieces))
    if text.strip():
        blocks.append(Block("system", text))
    return blocks


def _without_layout_edges(pieces: list) -> list:
    """A block's pieces less the newlines the template wrote at its edges: the line breaks
    around `{{message}}` in `{{#userBlock}}\n{{message}}\n{{/userBlock}}`. Only `Layout` text is
    cut, up to the first value that prints something; a value's text is data, sent as it came."""
    pieces = list(pieces)
    for order, strip in ((range(len(pieces)), str.lstrip), (range(len(pieces) - 1, -1, -1), str.rstrip)):
        for index in order:
            piece = pieces[index]
            if piece is TRIM:
                continue
            if type(piece) is Layout:
                piece = pieces[index] = Layout(strip(piece, "\r\n"))  # still layout, for the other edge
            if piece:
                break
    return pieces


def raw_text(stream: list[Any]) -> str:
    """The output stream as one text: role blocks as `[system]`...`[/system]` markers around their
    text, untrimmed, and `{{trim}}` applied. (A marker is only shown: story text that spells
    `[user]` is still text, and the blocks are cut from the stream, never from this text.)"""
    pieces: list[Any] = []
    role = "system"
    for item in stream:
        if item is ROLE_END:
            pieces.append(f"[/{role}]")
        elif isinstance(item, _RoleStart):
            role = item.role
            pieces.append(f"[{role}]")
        else:
            pieces.append(item)
    return _join_trimmed(pieces)


# --- steps: what a compiled template is made of -----------------------------------------------


class Output(Protocol):
    """Where steps write: a plain list, or a `_Bounded` stream that counts as it goes."""

    def append(self, item: Any, /) -> None: ...


Getter = Callable[[Frame], Any]
Step = Callable[[Frame, Output], None]


def nothing(frame: Frame, out: Output) -> None:
    return None


def text_step(text: str) -> Step:
    layout = Layout(text)

    def emit(frame: Frame, out: Output) -> None:
        out.append(layout)

    return emit


def output_step(get: Getter) -> Step:
    def expand(frame: Frame, out: Output) -> None:
        out.append(display(get(frame)))

    return expand


def trim_step(frame: Frame, out: Output) -> None:
    out.append(TRIM)


def if_step(get: Getter, fn: Step, inverse: Step) -> Step:
    def run_if(frame: Frame, out: Output) -> None:
        (fn if truthy(get(frame)) else inverse)(frame, out)

    return run_if


def with_step(get: Getter, fn: Step, inverse: Step, named: bool) -> Step:
    def run_with(frame: Frame, out: Output) -> None:
        value = get(frame)
        if _is_empty(value):
            inverse(frame, out)
        else:
            fn(frame.enter(value, None, ((value,), frame.params) if named else None), out)

    return run_with


def each_step(get: Getter, fn: Step, inverse: Step, param_count: int) -> Step:
    def run_each(frame: Frame, out: Output) -> None:
        value = get(frame)
        if type(value) is list:
            pairs = list(enumerate(value))
        elif type(value) is dict:
            pairs = list(value.items())
        else:
            pairs = []
        if not pairs:
            inverse(frame, out)
            return
        outer, last = frame.data, len(pairs) - 1
        bounded = out if type(out) is _Bounded else None
        for index, (key, item) in enumerate(pairs):
            if bounded is not None:
                bounded.loop()
            data = {
                **outer,
                "index": index,
                "key": key,
                "first": index == 0,
                "last": index == last,
                PARENT_DATA: outer,
            }
            params = ((item, key), frame.params) if param_count else None
            fn(frame.enter(item, data, params), out)

    return run_each


def section_step(get: Getter, fn: Step, inverse: Step) -> Step:
    """A Mustache section, `{{#value}}`...`{{/value}}`, as Handlebars.js' `blockHelperMissing`:
    true runs the body in the same context; false and missing values run the inverse; a list
    runs the body for each item like `each` (an empty one runs the inverse); any other value
    (an object, a string, a number, even 0 or "") runs the body with that value as the context."""
    iterate = each_step(get, fn, inverse, 0)

    def run_section(frame: Frame, out: Output) -> None:
        value = get(frame)
        if value is True:
            fn(frame, out)
        elif value is None or value is False:
            inverse(frame, out)
        elif type(value) is list:
            iterate(frame, out)
        else:
            fn(frame.enter(value), out)

    return run_section


RENDER_FLOOR = 4_000_000  # characters: the least bound a prompt render gets, whatever the window
# characters: the most a bound grows with the window. A window of ten million tokens is 40M
# characters of prompt; past this a template that repeats the story runs out of memory, not
# of bound (a 10^9-token --window once did, after 90 s).
RENDER_CEILING = 64 * 2**20


def bound_for_window(window_tokens: int, longest: int = 0) -> int:
    """The most characters a prompt render may produce: 64 windows' worth at 4 characters per
    token (a template that repeats the whole story many times over), never under 4 MB nor,
    by the window, over 64 MiB — and always 8 times the `longest` text it renders, so one
    huge message is priced (and refused for its size) rather than blamed on the template."""
    return max(min(64 * 4 * window_tokens, RENDER_CEILING), RENDER_FLOOR, 8 * longest)


class _Bounded:
    """The output stream of a bounded render: counts characters and loop turns, and stops the
    render with a `TemplateError` as soon as either passes the bound, before memory grows."""

    __slots__ = ("items", "name", "bound", "chars", "turns")

    def __init__(self, name: str, bound: int) -> None:
        self.items: list = []
        self.name, self.bound, self.chars, self.turns = name, bound, 0, 0

    def append(self, item: Any) -> None:
        if isinstance(item, str):
            self.chars += len(item)
            if self.chars > self.bound:
                raise self.error(f"renders more than {self.bound:,} characters")
        self.items.append(item)

    def loop(self) -> None:
        self.turns += 1
        if self.turns > self.bound:
            raise self.error(f"runs its loops more than {self.bound:,} times")

    def error(self, what: str) -> TemplateError:
        return TemplateError(
            self.name,
            None,
            None,
            f"{what}; a loop probably repeats the whole story, such as an {{{{#each}}}} over "
            "@root.chatMessages inside another: render each list once",
        )


class Template:
    """A compiled context template: render it as many times as needed."""

    __slots__ = ("name", "_run")

    def __init__(self, name: str, run: Step) -> None:
        self.name = name
        self._run = run

    def __repr__(self) -> str:
        return f"Template({self.name!r})"

    def render(self, context: Mapping[str, Any], bound: int | None = None) -> list[Block]:
        """The role blocks, in order. The context is copied to plain data first. With a `bound`,
        a render that outgrows it (in characters, or in loop turns) stops with a `TemplateError`."""
        return assemble_blocks(self._stream(context, bound))

    def render_raw(self, context: Mapping[str, Any], bound: int | None = None) -> str:
        """What the template printed, before it is cut into blocks: every character kept, each
        role block shown as `[role]...[/role]` (see `raw_text`). What Handlebars.js would print."""
        return raw_text(self._stream(context, bound))

    def _stream(self, context: Mapping[str, Any], bound: int | None) -> list[Any]:
        try:
            if not isinstance(context, Mapping):
                raise TemplateError(self.name, None, None, f"the context must be a dict, not {type(context).__name__}")
            data = to_plain(context, "context", self.name)
            frame = Frame(data, None, {"root": data}, None)
            if bound is None:
                stream: list[Any] = []
                self._run(frame, stream)
                return stream
            bounded = _Bounded(self.name, bound)
            self._run(frame, bounded)
            return bounded.items
        except TemplateError:
            raise
        except RecursionError:
            raise TemplateError(self.name, None, None, "the template or its data nests too deeply") from None
        except Exception as exc:  # nothing from pybars or Python may escape as a traceback
            raise TemplateError(self.name, None, None, f"internal error while rendering: {exc!r}") from exc

    def render_text(self, context: Mapping[str, Any], bound: int | None = None) -> str:
        """The blocks' text joined by newlines (for story strings and tests)."""
        return "\n".join(block.text for block in self.render(context, bound))
