"""A compiled template as plain data, and the linker that turns it into steps. Never imports pybars3.

`compile.compile_program` turns a template into a *program*: nested JSON lists, so it can be
stored (shipped next to the templates, cached under `~/.otaku/cache/templates/`) and loaded
without parsing again. It is data, never code: `link` reads it against a closed set of node
shapes, checks every field's type, and builds closures from `runtime` — the same ones a fresh
compile gives. A stored program can only say what a template can say, so a tampered or
damaged file is at worst a different template, and mostly a `DamagedProgram` (ignored, rebuilt).

Steps (a program is a list of steps):
  ["text", str]                 ["trim"]                 ["print", value]
  ["if", value, then, else]     ["with", value, fn, inverse, named]
  ["each", value, fn, inverse, named]                    ["role", "system"|"user"|"assistant", program]
  ["section", value, fn, inverse]  (a Mustache section over a value)
Values:
  ["const", str|int|float|bool|None]    ["key", str]     ["path", depth, [str, ...]]
  ["data", depth, [str, ...]]           ["param", level, position, [str, ...]]
  ["call", helper, [value, ...], line, column]
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import TemplateError
from .runtime import (
    HELPER_FUNCTIONS,
    INLINE_HELPERS,
    PARENT_DATA,
    ROLE_END,
    ROLE_START,
    Frame,
    Getter,
    Step,
    Template,
    each_step,
    if_step,
    nothing,
    output_step,
    pick,
    section_step,
    text_step,
    trim_step,
    walk,
    with_step,
)

# Bump when the program's shape or what compiling produces changes: stored programs of another
# version are ignored (and the shipped ones fail their up-to-date test until regenerated).
ENGINE_VERSION = 2
FORMAT = "otaku-ctx hbs program"
MOST_UP = 1000  # `../` levels; far beyond any real template (compile refuses more)


class DamagedProgram(ValueError):
    """A stored program that is not one this engine version wrote."""


def link(program: Any, name: str) -> Template:
    """The template a program describes; `DamagedProgram` when it is not a valid program."""
    try:
        return Template(name, _Linker(name).program(program, (), False))
    except RecursionError:
        raise DamagedProgram("nested too deeply") from None


def _need(condition: bool, what: str) -> None:
    if not condition:
        raise DamagedProgram(what)


def _is_int(value: Any, most: int) -> bool:
    return type(value) is int and 0 <= value <= most


def _keys(value: Any) -> tuple[str, ...]:
    _need(type(value) is list and all(type(key) is str for key in value), "a path is not a list of keys")
    return tuple(value)


class _Linker:
    """Checks one node at a time and builds its closure. `scopes` holds the size of each block
    param tuple in force (innermost first), so a `param` can only name a value that exists."""

    def __init__(self, name: str) -> None:
        self.name = name

    def program(self, steps: Any, scopes: tuple[int, ...], in_role: bool) -> Step:
        _need(type(steps) is list, "a program is not a list")
        linked = [self.step(step, scopes, in_role) for step in steps]
        if not linked:
            return nothing
        if len(linked) == 1:
            return linked[0]
        steps_tuple = tuple(linked)

        def run(frame: Frame, out: Any) -> None:
            for step in steps_tuple:
                step(frame, out)

        return run

    def step(self, node: Any, scopes: tuple[int, ...], in_role: bool) -> Step:
        _need(type(node) is list and len(node) >= 1, "a step is not a list")
        kind, size = node[0], len(node)
        if kind == "text" and size == 2 and type(node[1]) is str:
            return text_step(node[1])
        if kind == "trim" and size == 1:
            return trim_step
        if kind == "print" and size == 2:
            return output_step(self.value(node[1], scopes))
        if kind == "if" and size == 4:
            get = self.value(node[1], scopes)
            return if_step(get, self.program(node[2], scopes, in_role), self.program(node[3], scopes, in_role))
        if kind == "section" and size == 4:
            get = self.value(node[1], scopes)
            return section_step(get, self.program(node[2], scopes, in_role), self.program(node[3], scopes, in_role))
        if kind in ("with", "each") and size == 5 and type(node[4]) is bool:
            get, named = self.value(node[1], scopes), node[4]
            inner = ((1 if kind == "with" else 2), *scopes) if named else scopes
            fn, inverse = self.program(node[2], inner, in_role), self.program(node[3], scopes, in_role)
            return with_step(get, fn, inverse, named) if kind == "with" else each_step(get, fn, inverse, int(named))
        if kind == "role" and size == 3 and node[1] in ROLE_START and not in_role:
            return _role_step(ROLE_START[node[1]], self.program(node[2], scopes, True))
        raise DamagedProgram(f"not a step: {str(node)[:80]}")

    def value(self, node: Any, scopes: tuple[int, ...]) -> Getter:
        _need(type(node) is list and len(node) >= 2, "a value is not a list")
        kind, size = node[0], len(node)
        if kind == "const" and size == 2:
            constant = node[1]
            kind_of = type(constant)
            _need(
                constant is None or kind_of in (str, int, bool) or (kind_of is float and math.isfinite(constant)),
                "bad constant",
            )
            return lambda frame: constant
        if kind == "key" and size == 2 and type(node[1]) is str:
            return _key_getter(node[1])
        if kind in ("path", "data") and size == 3 and _is_int(node[1], MOST_UP):
            keys = _keys(node[2])
            if kind == "data":
                _need(len(keys) >= 1 and keys[0] != PARENT_DATA, "a data path names no value")
                return _data_getter(node[1], keys)
            return _path_getter(node[1], keys)
        if kind == "param" and size == 4 and _is_int(node[1], len(scopes) - 1):
            level, position = node[1], node[2]
            _need(_is_int(position, scopes[level] - 1), "a block param that does not exist")
            return _param_getter(level, position, _keys(node[3]))
        if kind == "call" and size == 5 and node[1] in HELPER_FUNCTIONS and type(node[2]) is list:
            helper, args = node[1], node[2]
            fewest, most = INLINE_HELPERS[helper]
            _need(len(args) >= fewest and (most is None or len(args) <= most), "a helper with the wrong arguments")
            _need(all(place is None or _is_int(place, 10**9) for place in node[3:]), "a bad line or column")
            return self.call(helper, [self.value(arg, scopes) for arg in args], node[3], node[4])
        raise DamagedProgram(f"not a value: {str(node)[:80]}")

    def call(self, helper: str, getters: list[Getter], line: int | None, column: int | None) -> Getter:
        function, name, arguments = HELPER_FUNCTIONS[helper], self.name, tuple(getters)

        def get(frame: Frame) -> Any:
            try:
                return function(*[getter(frame) for getter in arguments])
            except TemplateError:
                raise
            except Exception as exc:  # a helper must never leak a traceback
                raise TemplateError(name, line, column, f"`{helper}` failed: {exc}") from exc

        return get


def _role_step(start: Any, fn: Step) -> Step:
    def role(frame: Frame, out: Any) -> None:
        out.append(start)
        fn(frame, out)
        out.append(ROLE_END)

    return role


def _key_getter(key: str) -> Getter:
    def get_key(frame: Frame) -> Any:
        context = frame.context
        return context.get(key) if type(context) is dict else pick(context, key)

    return get_key


def _data_getter(depth: int, parts: tuple[str, ...]) -> Getter:
    first, rest = parts[0], parts[1:]

    def get_data(frame: Frame) -> Any:
        data: dict[str, Any] = frame.data
        for _ in range(depth):
            parent = data.get(PARENT_DATA)
            if parent is None:
                return None
            data = parent
        return walk(data.get(first), rest)

    return get_data


def _param_getter(level: int, position: int, rest: tuple[str, ...]) -> Getter:
    def get_param(frame: Frame) -> Any:
        params: Any = frame.params  # the linker checked that `level` and `position` exist
        for _ in range(level):
            params = params[1]
        return walk(params[0][position], rest)

    return get_param


def _path_getter(depth: int, parts: tuple[str, ...]) -> Getter:
    def get_path(frame: Frame) -> Any:
        reached = frame
        for _ in range(depth):
            parent = reached.parent
            if parent is None:
                return None
            reached = parent
        return walk(reached.context, parts)

    return get_path
